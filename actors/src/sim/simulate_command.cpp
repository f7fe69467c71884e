// `areal simulate` (simulate_command.hpp).
#include "areal/sim/simulate_command.hpp"

#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "areal/runtime/files.hpp"

namespace areal::sim {

void check_outputs(const simulate_spec& c) {
  for (auto [key, path] : {std::pair{"simulate.json", &c.json_path}, std::pair{"simulate.log", &c.log_path}}) {
    if (path->empty())
      continue;
    auto folder = std::filesystem::path(*path).parent_path();
    std::error_code ec;
    if (!folder.empty() && !std::filesystem::is_directory(folder, ec))
      throw std::invalid_argument(std::string{key} + " = \"" + *path + "\": there is no folder " + folder.string() +
                                  " to write it in; create it, or name a file in an existing folder");
    if (std::filesystem::is_directory(*path, ec))
      throw std::invalid_argument(std::string{key} + " = \"" + *path + "\" is a folder; name a file");
  }
}

bool write_output(const std::string& path, const std::string& contents, const std::string& what, std::ostream& out,
                  std::ostream& err) {
  try {
    write_file_atomically(path, contents);
  } catch (const std::exception& e) {
    err << "areal simulate: the " << what << " was not written: " << e.what() << "\n";
    return false;
  }
  out << what << ": " << path << "\n";
  return true;
}

sim_setup setup_from(const run_config& config) {
  auto& c = config.simulate;
  auto& rl = config.rl;
  auto device = gpu_device(c.device);
  device.step_overhead = {c.step_overhead_s, "simulate.step_overhead_s"};
  sim_setup s;
  s.costs = std::make_shared<roofline_costs>(qwen2_shape(c.model), device);
  s.devices = c.devices;
  s.generation_share = c.generation_share;
  s.colocated = c.colocated;
  s.eta = rl.effective_eta();
  if (rl.batch_size % rl.group_size != 0)
    throw std::invalid_argument("rl.batch_size must be a multiple of rl.group_size");
  s.batch_prompts = rl.batch_size / rl.group_size;
  s.group_size = rl.group_size;
  s.steps = rl.steps;
  if (rl.steps < 1)
    throw std::invalid_argument("rl.steps must be at least 1 to simulate a run");
  if (rl.interruption == "reprefill")
    s.on_weights = interruption::reprefill;
  else if (rl.interruption == "wait")
    s.on_weights = interruption::wait;
  else
    throw std::invalid_argument("rl.interruption = \"" + rl.interruption +
                                "\" is not simulated (a GPU engine cannot keep caches of other weights here); use "
                                "\"reprefill\" or \"wait\"");
  if (c.colocated && !rl.synchronous)
    throw std::invalid_argument("simulate.colocated needs rl.mode = \"sync\" (the devices that generate also train)");
  s.engine_slots = c.engine_slots;
  s.keep_log = !c.log_path.empty();
  check_outputs(c);
  s.work.prompt_tokens = c.prompt_tokens;
  s.work.max_new_tokens = rl.max_new_tokens;
  s.work.length_median = c.length_median;
  s.work.length_sigma = c.length_sigma;
  if (!c.length_table.empty()) {
    s.work.length_table = read_length_table(c.length_table);
    s.work.length_source = c.length_table;
  }
  s.work.reward_median_s = c.reward_median_s;
  s.work.reward_sigma = c.reward_sigma;
  s.work.reward_workers = c.reward_workers;
  s.work.seed = config.run.seed;
  s.check();
  return s;
}

nlohmann::json result_json(const sim_result& r) {
  nlohmann::json steps = nlohmann::json::array();
  for (auto& p : r.trained)
    steps.push_back({{"version", p.version}, {"seconds", p.seconds}, {"samples", p.samples}, {"tokens", p.tokens},
                     {"max_staleness", p.max_staleness}});
  return {{"virtual_s", r.virtual_seconds},
          {"steps", r.steps},
          {"trained_samples", r.trained_samples},
          {"trained_tokens", r.trained_tokens},
          {"tokens_per_s", r.trained_tokens_per_second()},
          {"steady_tokens_per_s", r.steady_tokens_per_second()},
          {"engine_busy", r.engine_busy_share},
          {"reprefill", r.reprefill_share},
          {"trainer_busy", r.trainer_busy_share},
          {"max_staleness", r.max_staleness},
          {"interruptions", r.interruptions},
          {"generated_tokens", r.generated_tokens},
          {"trained_response_tokens", r.trained_response_tokens},
          {"dropped_samples", r.dropped_samples},
          {"wall_s", r.wall_seconds},
          {"events", r.events},
          {"schedule_hash", fmt::format("{:016x}", r.schedule_hash)},
          {"trained", steps}};
}

int simulate_command(const run_config& config, std::ostream& out, std::ostream& err) {
  sim_setup setup;
  try {
    setup = setup_from(config);
  } catch (const std::exception& e) {
    err << "areal simulate: " << config.source << ": " << e.what() << "; nothing was simulated\n";
    return 2;
  }
  auto& c = config.simulate;
  out << "areal simulate: the real controller in virtual time with simulated members\n"
      << setup.costs->describe()
      << fmt::format(
             "run: {} devices ({} engines of {} device(s), {} training), {} x {} answers per step, {} steps, "
             "eta {}, {}; {} sequences per engine; answers {} (mean {:.0f} tokens, cap {})\n",
             setup.devices, setup.engines(), setup.costs->devices_per_engine(), setup.trainer_devices(),
             setup.batch_prompts, setup.group_size, setup.steps, setup.eta, setup.colocated ? "colocated" : "decoupled",
             setup.slots_per_engine(), setup.work.length_table.empty() ? "log-normal" : setup.work.length_source,
             setup.work.mean_response_tokens(), setup.work.max_new_tokens);
  sim_result r;
  try {
    r = simulate_quietly(setup);
  } catch (const std::exception& e) {
    err << "areal simulate: " << e.what() << "\n";
    return 1;
  }
  out << fmt::format(
      "result: {} steps in {:.1f} s of virtual time ({}{}); {:.0f} trained tokens/s over the run, {:.0f} once "
      "the pipeline is full; {:.1f} samples/s; engines busy {:.1f}% (re-prefill {:.1f}%), trainer busy {:.1f}%; "
      "staleness <= {}; {} interrupted sequences; {} response tokens generated, {:.1f}% of them trained; {} "
      "scored samples dropped\n"
      "simulated in {:.1f} s ({} messages); schedule hash {:016x}\n",
      r.steps, r.virtual_seconds, r.exit_code == 0 ? "" : "FAILED: ", r.end_reason, r.trained_tokens_per_second(),
      r.steady_tokens_per_second(), r.samples_per_second(), 100 * r.engine_busy_share, 100 * r.reprefill_share,
      100 * r.trainer_busy_share, r.max_staleness, r.interruptions, r.generated_tokens,
      r.generated_tokens > 0 ? 100.0 * double(r.trained_response_tokens) / double(r.generated_tokens) : 0.0,
      r.dropped_samples, r.wall_seconds, r.events, r.schedule_hash);
  bool written = true;
  if (!c.log_path.empty())
    written = write_output(c.log_path, r.schedule_log, "schedule log", out, err) && written;
  if (!c.json_path.empty()) {
    auto j = result_json(r);
    j["cost_model"] = setup.costs->describe();
    written = write_output(c.json_path, j.dump(2) + "\n", "result JSON", out, err) && written;
  }
  return r.exit_code == 0 && written ? 0 : 1;
}

}  // namespace areal::sim
