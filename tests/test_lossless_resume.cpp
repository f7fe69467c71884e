// A run killed with SIGKILL between two checkpoints resumes the work its last
// checkpoint saved: every sample in flight continues from its saved tokens (or
// is trained as it was scored), none is trained twice, and the ledger closes.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "areal/actors/run_checkpoint.hpp"
#include "node_process.hpp"

using namespace areal;
using namespace areal::test;
using namespace std::chrono_literals;

namespace {

using sample_key = std::pair<uint64_t, uint32_t>;

// The trained trajectories of rl.record_trajectories, from byte `from` of the file on.
std::vector<nlohmann::json> recorded(const std::filesystem::path& file, std::streamoff from = 0) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  in.seekg(from);
  for (std::string line; std::getline(in, line);)
    if (!line.empty())
      out.push_back(nlohmann::json::parse(line));
  return out;
}

std::streamoff size_of(const std::filesystem::path& file) {
  return std::filesystem::exists(file) ? static_cast<std::streamoff>(std::filesystem::file_size(file)) : 0;
}

struct saved_counts {
  int generating = 0, generating_tokens = 0, generated = 0, scored = 0;
};

saved_counts count(const controller_checkpoint& c) {
  saved_counts n;
  for (auto& s : c.saved) {
    auto& t = s.segments.front();
    if (s.scored)
      n.scored++;
    else if (t.finish == finish_reason::unfinished)
      n.generating++, n.generating_tokens += static_cast<int>(t.output_tokens.size());
    else
      n.generated++;
  }
  return n;
}

}  // namespace

TEST_CASE("a run killed between two checkpoints resumes its work in flight: no saved token lost, none trained twice") {
  scratch_dir dir{"lossless"};
  // Staleness 16: the admission gate stays open while each checkpoint is
  // written, so the engine is mid-generation at every one (at 4 it had
  // caught up with the gate in 2-4 of 10 runs, all four tries included).
  constexpr size_t batch = 16;
  auto args = [&](std::vector<std::string> more) {
    more.insert(more.begin(), {"--set", "rl.batch_size=" + std::to_string(batch), "--set", "rl.checkpoint_every=1", "--set", "rl.record_trajectories=true", "--set",
                               "rl.max_new_tokens=64", "--set", "rl.eta=16", "--set", "rl.rollout_slots=4", "--set",
                               "eval.prompts=0"});
    return ci_sized_default(more);
  };
  auto run_dir = dir.path / "runs" / "single-node";
  auto record = run_dir / "trajectories.jsonl";

  // The first run is killed (SIGKILL) a moment after a checkpoint, while its
  // next step runs; its last checkpoint must hold samples part-way through
  // generation (tries again from scratch when a kill found none).
  std::optional<controller_checkpoint> saved;
  std::streamoff first_run_bytes = 0;
  for (int attempt = 0; attempt < 4 && !saved; ++attempt) {
    std::filesystem::remove_all(dir.path / "runs");
    node_process run(args({"--set", "rl.steps=100000"}), dir.path / ("first-" + std::to_string(attempt) + ".log"),
                     dir.path);
    REQUIRE_MESSAGE(run.wait_for("checkpoint of version " + std::to_string(3 + attempt) + " written", 120s), run.log());
    std::this_thread::sleep_for(std::chrono::milliseconds(20 * attempt));
    run.kill(SIGKILL);
    run.wait_exit(10s);
    auto c = controller_checkpoint::load((run_dir / "checkpoint").string());
    auto n = count(c);
    MESSAGE("attempt " << attempt << ": checkpoint of version " << c.version << " saved " << c.saved.size()
                       << " samples: " << n.generating << " generating (" << n.generating_tokens << " tokens), "
                       << n.generated << " generated, " << n.scored << " scored; " << c.requeue.size()
                       << " groups re-queued");
    if (n.generating > 0 && n.generating_tokens > n.generating) {
      saved = c;
      first_run_bytes = size_of(record);
    }
  }
  REQUIRE_MESSAGE(saved, "no kill found a sample part-way through generation in the last checkpoint");

  // What the first run trained up to its checkpoint (steps 1..version; the
  // store numbers batches from 0). Its steps after the checkpoint are undone by the resume.
  std::set<sample_key> trained_before;
  for (auto& t : recorded(record))
    if (t["batch"].get<int64_t>() < saved->version)
      CHECK(trained_before.emplace(t["group"].get<uint64_t>(), t["index"].get<uint32_t>()).second);
  REQUIRE(static_cast<int64_t>(trained_before.size()) == saved->trained);

  // Enough steps to train every saved sample and two batches more: at
  // staleness 16 a checkpoint can hold over 8 batches scored, queued ahead of
  // the generations it saved (with a fixed 8 more steps those were never reached).
  auto steps = saved->version + static_cast<int64_t>((saved->saved.size() + batch - 1) / batch) + 2;
  node_process resumed(args({"--set", "rl.steps=" + std::to_string(steps), "--resume"}),
                       dir.path / "resumed.log", dir.path);
  REQUIRE_MESSAGE(resumed.wait_exit(180s) == 0, resumed.log());
  CHECK(resumed.log().find("the checkpoint saved the work of " + std::to_string(saved->saved.size()) + " sample(s)") !=
        std::string::npos);

  // The resumed run trains no sample twice, and none the first run trained before its checkpoint.
  std::map<sample_key, nlohmann::json> trained_after;
  for (auto& t : recorded(record, first_run_bytes)) {
    sample_key key{t["group"].get<uint64_t>(), t["index"].get<uint32_t>()};
    CHECK_MESSAGE(trained_before.count(key) == 0, "sample " << key.first << "/" << key.second << " trained twice");
    CHECK_MESSAGE(trained_after.emplace(key, t).second,
                  "sample " << key.first << "/" << key.second << " trained twice");
  }
  // Every saved sample the resumed run trained went on from its saved tokens:
  // the same tokens, log-probabilities and versions first, then the rest.
  int continued = 0, dropped_saved = 0;
  for (auto& s : saved->saved) {
    auto& t = s.segments.front();
    auto it = trained_after.find({t.group_id, t.sample_index});
    if (it == trained_after.end()) {
      dropped_saved++;
      continue;
    }
    auto& got = it->second;
    auto tokens = got["output_tokens"].get<std::vector<int32_t>>();
    auto logprobs = got["behaviour_logprobs"].get<std::vector<float>>();
    auto versions = got["token_versions"].get<std::vector<int64_t>>();
    INFO("sample " << t.group_id << "/" << t.sample_index << (s.scored ? " (scored)" : ""));
    REQUIRE(tokens.size() >= t.output_tokens.size());
    CHECK(std::equal(t.output_tokens.begin(), t.output_tokens.end(), tokens.begin()));
    CHECK(std::equal(t.behaviour_logprobs.begin(), t.behaviour_logprobs.end(), logprobs.begin()));
    CHECK(std::equal(t.token_versions.begin(), t.token_versions.end(), versions.begin()));
    if (t.finish != finish_reason::unfinished)
      CHECK(tokens.size() == t.output_tokens.size());  // generated already: nothing added
    if (s.scored)
      CHECK(got["reward"].get<float>() == t.reward);
    if (!s.scored && t.finish == finish_reason::unfinished && !t.output_tokens.empty())
      continued++;
  }
  CHECK(continued > 0);
  // A saved sample not trained was dropped with a reason (its group went staler than the bound).
  std::ifstream metrics(run_dir / "metrics.jsonl");
  nlohmann::json end;
  for (std::string line; std::getline(metrics, line);)
    if (line.find("\"event\":\"end\"") != std::string::npos)
      end = nlohmann::json::parse(line);
  REQUIRE(!end.is_null());
  CHECK(end["admitted"].get<int64_t>() == end["trained"].get<int64_t>() + end["dropped"].get<int64_t>());
  CHECK(dropped_saved <= end["dropped"].get<int64_t>() - saved->dropped);
  MESSAGE("resumed: " << continued << " generations continued from their saved tokens, " << dropped_saved
                      << " saved samples dropped; end counters admitted " << end["admitted"] << ", trained "
                      << end["trained"] << ", dropped " << end["dropped"]);
}
