// The end of an RL job on the controller's node: the endpoint's counts, the
// other nodes' trace spans, and the run's output files (job_parts.hpp).
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "areal/runtime/files.hpp"
#include "areal/runtime/log.hpp"
#include "job_parts.hpp"

namespace fs = std::filesystem;

namespace areal::job {

nlohmann::json endpoint_summary(const http_endpoint& endpoint) {
  auto e = endpoint.counts();
  spdlog::info("endpoint: {} requests, {} model calls answered, {} tokens; episodes: {} ended, {} dropped, {} split",
               e.requests, e.completed, e.tokens, e.episodes.ended, e.episodes.dropped, e.episodes.splits);
  return {{"requests", e.requests},
          {"model_calls", e.completed},
          {"generated_tokens", e.tokens},
          {"client_errors", e.client_errors},
          {"server_errors", e.server_errors},
          {"busy", e.busy},
          {"cancelled", e.cancelled},
          {"episodes_ended", e.episodes.ended},
          {"episodes_dropped", e.episodes.dropped},
          {"episode_splits", e.episodes.splits},
          {"held_out_episodes", e.episodes.eval_ended + e.episodes.eval_dropped}};
}

void merge_node_traces(caf::scoped_actor& self, const node_actor& node, tracer& trace) {
  self->request(node, std::chrono::seconds(15), trace_atom::value)
      .receive(
          [&](std::string& text) {
            auto to_trace_clock = trace_clock_to_wall_ns();
            size_t merged = 0;
            try {
              for (auto& s : nlohmann::json::parse(text)) {
                tracer::span_args args;
                if (s.size() > 4)
                  for (auto& [name, value] : s.at(4).items())
                    args.emplace_back(name, value.get<int64_t>());
                trace.span(s.at(0).get<std::string>(), s.at(1).get<std::string>(),
                           s.at(2).get<int64_t>() - to_trace_clock, s.at(3).get<int64_t>() - to_trace_clock, args);
                merged++;
              }
            } catch (const std::exception& e) {
              spdlog::warn("the other nodes' trace spans are unreadable: {}", e.what());
            }
            spdlog::info("trace: {} span(s) of the other nodes merged", merged);
          },
          [](caf::error& err) { spdlog::warn("cannot collect the other nodes' trace spans: {}", describe(err)); });
}

void write_outputs(const fs::path& run_dir, const rl_spec& rl, const nlohmann::json& endpoint_record,
                   const tracer& trace, rl_job_result& result) {
  // Each written whole or not at all, and the last line names only those written.
  std::vector<std::string> written, failed;
  auto output = [&](const std::string& name, const auto& write) {
    try {
      write();
      written.push_back(name);
    } catch (const file_error& e) {
      failed.push_back(e.what());
      spdlog::error("{}", e.what());
    }
  };
  output("trace.json (open in https://ui.perfetto.dev)",
         [&] { trace.write_chrome_trace((run_dir / "trace.json").string()); });
  auto& s = result.stats;
  nlohmann::json summary = {{"why", result.why},
                            {"exit_code", result.exit_code},
                            {"mode", rl.synchronous ? "sync" : "async"},
                            {"eta", rl.effective_eta()},
                            {"accuracy_before", result.accuracy_before},
                            {"accuracy_after", result.accuracy_after},
                            {"steps", s.steps},
                            {"version", s.version},
                            {"admitted", s.admitted},
                            {"trained", s.trained},
                            {"dropped", s.dropped},
                            {"max_staleness", s.max_staleness},
                            {"generated_tokens", s.generated_tokens},
                            {"trained_tokens", s.trained_tokens},
                            {"reward_scored", result.reward.scored},
                            {"reward_refused_while_full", result.reward.refused},
                            {"sft_seconds", result.sft_seconds},
                            {"rl_seconds", result.rl_seconds},
                            {"rl_cpu_seconds", result.rl_cpu_seconds}};
  if (!endpoint_record.is_null())
    summary["endpoint"] = endpoint_record;
  output("summary.json", [&] { write_file_atomically(run_dir / "summary.json", summary.dump(2) + "\n"); });
  if (result.accuracy_before >= 0 && result.accuracy_after >= 0)
    spdlog::info("held-out accuracy: {:.1f}% before RL -> {:.1f}% after RL ({:+.1f} points); {} steps in {:.1f} s",
                 100 * result.accuracy_before, 100 * result.accuracy_after,
                 100 * (result.accuracy_after - result.accuracy_before), s.steps, result.rl_seconds);
  std::vector<std::string> present;
  for (auto name : {"metrics.jsonl", "checkpoint/", "sft_model/"})
    if (fs::exists(run_dir / name))
      present.push_back(name);
  written.insert(written.begin(), present.begin(), present.end());
  std::string names;
  for (auto& n : written)
    names += (names.empty() ? "" : ", ") + n;
  spdlog::info("outputs in {}: {}", run_dir.string(), names);
  if (!failed.empty()) {
    spdlog::error("{} output(s) could not be written; the run ends with exit code 1", failed.size());
    if (result.exit_code == 0) {
      result.exit_code = 1;
      result.why = failed.front();
    }
  }
}

}  // namespace areal::job
