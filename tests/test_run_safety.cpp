// The `areal` binary against what users get wrong and what machines do: a
// second process on a running run's directory, a SIGKILL and --resume (every
// step once in metrics.jsonl), a full disk (a 2 MiB tmpfs run directory), and
// inputs that used to crash or hang the job after minutes of work, each now
// refused with exit 2 before any work starts. Every wait is bounded.
#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "areal/actors/run_checkpoint.hpp"
#include "areal/kernels/model.hpp"
#include "areal/kernels/trainer.hpp"
#include "areal/runtime/files.hpp"
#include "node_process.hpp"
#include "torch_doctest.hpp"  // after the LibTorch-using headers

namespace fs = std::filesystem;
using namespace areal;
using namespace areal::test;
using namespace std::chrono_literals;

namespace {

// Every line of metrics.jsonl is whole JSON; returns the step numbers of its step lines, in order.
std::vector<int64_t> metric_steps(const fs::path& file) {
  std::vector<int64_t> steps;
  std::istringstream lines(read_text(file));
  std::string line;
  size_t number = 0;
  while (std::getline(lines, line)) {
    ++number;
    nlohmann::json j;
    REQUIRE_NOTHROW_MESSAGE(j = nlohmann::json::parse(line), "line " << number << " is torn: " << line);
    if (j.value("event", "") == "step")
      steps.push_back(j.at("step").get<int64_t>());
  }
  return steps;
}

std::vector<std::string> temporaries_in(const fs::path& dir) {
  std::vector<std::string> found;
  for (auto& e : fs::recursive_directory_iterator(dir)) {
    auto name = e.path().filename().string();
    if (is_temporary_file(e.path()) || name == "checkpoint.new")
      found.push_back(e.path().string());
  }
  return found;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

}  // namespace

TEST_CASE(
    "a second process on a running run is refused before it writes, and a SIGKILLed run resumes with every "
    "step once") {
  scratch_dir dir{"kill-resume"};
  auto run_dir = dir.path / "runs" / "single-node";
  node_process first(ci_sized_default({"--set", "rl.steps=100000", "--set", "rl.checkpoint_every=2"}),
                     dir.path / "a.log", dir.path);
  REQUIRE_MESSAGE(first.wait_for("checkpoint of version 2 written", 60s), first.log());
  auto config_before = read_text(run_dir / "config.toml");

  // The same run started again by mistake, with another setting: refused, the directory untouched.
  node_process second(ci_sized_default({"--set", "rl.steps=100000", "--set", "rl.lr=0.0002"}), dir.path / "b.log",
                      dir.path);
  CHECK_MESSAGE(second.wait_exit(20s) == 2, second.log());
  CHECK_MESSAGE(second.log().find("is in use by pid ") != std::string::npos, second.log());
  CHECK(second.log().find("stop that process first") != std::string::npos);
  CHECK(read_text(run_dir / "config.toml") == config_before);

  // Killed with steps after its last checkpoint in the metrics.
  // Polled while the run writes: only the complete lines are counted (the strict reading comes after the kill).
  auto steps_so_far = [&] {
    auto text = read_text(run_dir / "metrics.jsonl");
    return count_of(text.substr(0, text.rfind('\n') + 1), "\"event\":\"step\"");
  };
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline && steps_so_far() < 3)
    std::this_thread::sleep_for(20ms);
  first.kill(SIGKILL);
  CHECK(first.wait_exit(10s) == 128 + SIGKILL);
  auto before = metric_steps(run_dir / "metrics.jsonl");
  REQUIRE(before.size() >= 3);
  auto saved = controller_checkpoint::load(kernels::trainer::complete_checkpoint((run_dir / "checkpoint").string()));
  MESSAGE("killed after step " << before.back() << ", last checkpoint at step " << saved.steps);

  // Started again without --resume: the killed run is not overwritten.
  node_process again(ci_sized_default({"--set", "rl.steps=100000"}), dir.path / "c.log", dir.path);
  CHECK_MESSAGE(again.wait_exit(20s) == 2, again.log());
  CHECK(again.log().find("holds a run already") != std::string::npos);

  // The accuracy before RL that the run recorded at its start, marked (same length: the metrics are cut back by
  // bytes on resume): the resumed run counts RL's gain from it, not from its own evaluation at the resume.
  auto metrics = read_text(run_dir / "metrics.jsonl");
  auto at = metrics.find("{\"accuracy\":");
  REQUIRE(at != std::string::npos);
  REQUIRE(metrics.find("\"before\":true", at) < metrics.find('\n', at));
  auto digits = at + std::string{"{\"accuracy\":0."}.size();
  while (std::isdigit(static_cast<unsigned char>(metrics[digits])))
    metrics[digits++] = '3';  // 0.3, 0.33, 0.333...: no accuracy over 8 held-out prompts
  std::ofstream(run_dir / "metrics.jsonl", std::ios::binary | std::ios::trunc) << metrics;
  double marked = nlohmann::json::parse(metrics.substr(at, metrics.find('\n', at) - at))["accuracy"];

  auto total = std::max<int64_t>(before.back() + 2, 6);
  node_process resumed(ci_sized_default({"--set", "rl.steps=" + std::to_string(total), "--resume"}), dir.path / "d.log",
                       dir.path);
  CHECK_MESSAGE(resumed.wait_exit(90s) == 0, resumed.log());
  auto steps = metric_steps(run_dir / "metrics.jsonl");
  std::vector<int64_t> expected;
  for (int64_t s = 1; s <= total; ++s)
    expected.push_back(s);
  CHECK_MESSAGE(steps == expected, "steps in metrics.jsonl: " << nlohmann::json(steps).dump());
  CHECK(count_of(read_text(run_dir / "metrics.jsonl"), "\"event\":\"resume\"") == 1);
  CHECK(temporaries_in(run_dir).empty());
  auto summary = nlohmann::json::parse(read_text(run_dir / "summary.json"));
  CHECK(summary["accuracy_before"].get<double>() == doctest::Approx(marked));
  // Resumed once more over another held-out set (4 prompts): the recorded start is no baseline for it.
  node_process other(
      ci_sized_default({"--set", "rl.steps=" + std::to_string(total + 1), "--set", "eval.prompts=4", "--resume"}),
      dir.path / "e.log", dir.path);
  CHECK_MESSAGE(other.wait_exit(90s) == 0, other.log());
  summary = nlohmann::json::parse(read_text(run_dir / "summary.json"));
  CHECK(summary["accuracy_before"].get<double>() != doctest::Approx(marked));
}

TEST_CASE(
    "--resume of a run that did all its steps trains nothing and leaves its files, and a larger rl.steps trains on") {
  scratch_dir dir{"resume-complete"};
  auto run_dir = dir.path / "run";
  auto args = [&](const std::string& steps, bool resume = true) {
    auto a = ci_sized_default({"--set", "rl.steps=" + steps, "--run-dir", run_dir.string()});
    if (resume)
      a.push_back("--resume");
    return a;
  };
  node_process first(args("2", false), dir.path / "a.log", dir.path);
  REQUIRE_MESSAGE(first.wait_exit(60s) == 0, first.log());
  auto checkpoint = fs::path{kernels::trainer::complete_checkpoint((run_dir / "checkpoint").string())};
  REQUIRE(!checkpoint.empty());
  auto metrics = read_text(run_dir / "metrics.jsonl");
  auto summary = read_text(run_dir / "summary.json");
  auto written = fs::last_write_time(checkpoint / "trainer_state.json");

  node_process again(args("2"), dir.path / "b.log", dir.path);
  CHECK_MESSAGE(again.wait_exit(60s) == 0, again.log());
  CHECK_MESSAGE(
      again.log().find("nothing to train; to train it further, resume with a larger rl.steps") != std::string::npos,
      again.log());
  CHECK(again.log().find("held-out greedy accuracy") == std::string::npos);  // no evaluation either
  CHECK(read_text(run_dir / "metrics.jsonl") == metrics);
  CHECK(read_text(run_dir / "summary.json") == summary);
  CHECK(kernels::trainer::complete_checkpoint((run_dir / "checkpoint").string()) == checkpoint.string());
  CHECK(fs::last_write_time(checkpoint / "trainer_state.json") == written);

  node_process further(args("3"), dir.path / "c.log", dir.path);
  CHECK_MESSAGE(further.wait_exit(60s) == 0, further.log());
  CHECK(metric_steps(run_dir / "metrics.jsonl") == std::vector<int64_t>{1, 2, 3});
}

TEST_CASE("a run's checkpoint holds a model directory that a later run starts from (model.path)") {
  scratch_dir dir{"checkpoint-model"};
  auto first_dir = dir.path / "first";
  node_process first(ci_sized_default({"--set", "rl.steps=2", "--run-dir", first_dir.string()}), dir.path / "a.log",
                     dir.path);
  REQUIRE_MESSAGE(first.wait_exit(60s) == 0, first.log());
  auto model = first_dir / "checkpoint" / "model";
  // Weights, config.json and the run's tokenizer (before, the tokenizer was only in sft_model/, and with
  // sft.steps = 0 nowhere: the trained model could not be loaded without it).
  REQUIRE(fs::exists(model / "tokenizer.json"));
  CHECK(read_text(model / "tokenizer.json") == read_text(first_dir / "sft_model" / "tokenizer.json"));
  node_process later(ci_sized_default({"--set", "model.path=" + model.string(), "--set", "sft.steps=0", "--set",
                                       "rl.steps=1", "--run-dir", (dir.path / "later").string()}),
                     dir.path / "b.log", dir.path);
  CHECK_MESSAGE(later.wait_exit(60s) == 0, later.log());
  CHECK_MESSAGE(later.log().find("held-out accuracy:") != std::string::npos, later.log());
}

TEST_CASE(
    "a full disk stops the run with a clear error, keeps the last checkpoint and leaves no torn or temporary "
    "file") {
  scratch_dir dir{"disk-full"};
  auto run_dir = dir.path / "run";
  auto copy = dir.path / "copy";
  fs::create_directories(run_dir);
  fs::create_directories(copy);
  // The micro model's checkpoint takes about 1.2 MB and its warm-started copy 0.4 MB: on 2 MiB the first
  // checkpoint fits and the second, written beside it before the swap, does not.
  std::string command = "mount -t tmpfs -o size=2m areal-test " + run_dir.string() + " || exit 90; " AREAL_BINARY;
  for (auto& a :
       ci_sized_default({"--set", "rl.steps=50", "--set", "rl.checkpoint_every=1", "--run-dir", run_dir.string()}))
    command += " '" + a + "'";
  command += "; code=$?; cp -a " + run_dir.string() + "/. " + copy.string() + "/; exit $code";
  node_process run({"-m", "sh", "-c", command}, dir.path / "run.log", dir.path, "/usr/bin/unshare");
  auto code = run.wait_exit(90s);
  if (code == 90 || (code == 1 && run.log().find("unshare failed") != std::string::npos)) {
    MESSAGE("no private mount namespace here (needs root): the full-disk case is not run; " << run.log());
    return;
  }
  CHECK_MESSAGE(code == 1, run.log());
  auto log = run.log();
  CHECK_MESSAGE(log.find("No space left on device") != std::string::npos, log);
  CHECK(log.find("the previous checkpoint is kept") != std::string::npos);
  CHECK(log.find("node exited with code 1") != std::string::npos);
  // The last checkpoint is complete and loads: the trainer's state, the controller's record and the model.
  auto checkpoint = kernels::trainer::complete_checkpoint((copy / "checkpoint").string());
  REQUIRE_MESSAGE(!checkpoint.empty(), log);
  auto saved = controller_checkpoint::load(checkpoint);
  CHECK(saved.steps >= 1);
  CHECK_NOTHROW(kernels::policy_model::load((fs::path{checkpoint} / "model").string()));
  auto state = nlohmann::json::parse(read_text(fs::path{checkpoint} / "trainer_state.json"));
  CHECK(state.at("policy_version").get<int64_t>() == saved.version);
  // Nothing torn, nothing temporary; the outputs line names only what was written.
  auto steps = metric_steps(copy / "metrics.jsonl");
  CHECK(static_cast<int64_t>(steps.size()) >= saved.steps);
  CHECK_MESSAGE(temporaries_in(copy).empty(), nlohmann::json(temporaries_in(copy)).dump());
  if (fs::exists(copy / "summary.json"))
    CHECK_NOTHROW(nlohmann::json::parse(read_text(copy / "summary.json")));
  CHECK(log.find("run complete") == std::string::npos);
}

TEST_CASE("inputs that used to crash or hang the job are refused with exit 2 before any work") {
  scratch_dir dir{"bad-inputs"};
  auto refused = [&](const std::string& name, std::vector<std::string> args, const std::string& expected) {
    args.insert(args.end(), {"--run-dir", (dir.path / name).string()});
    node_process p(ci_sized_default(args), dir.path / (name + ".log"), dir.path);
    auto code = p.wait_exit(30s);
    CHECK_MESSAGE(code == 2, name << ": " << p.log());
    CHECK_MESSAGE(p.log().find(expected) != std::string::npos, name << ": " << p.log());
    // Before the warm start: nothing of a run was written.
    CHECK_MESSAGE(!fs::exists(dir.path / name / "sft_model"), name);
    CHECK_MESSAGE(!fs::exists(dir.path / name / "metrics.jsonl"), name);
  };
  SUBCASE("more new tokens than the model's context") {
    refused("long-answers", {"--set", "rl.max_new_tokens=5000"},
            "rl.max_new_tokens = 5000 leaves no room for a prompt in the model's context of 1024 tokens");
  }
  SUBCASE("generated prompts longer than the context") {
    refused("long-prompts",
            {"--set", "task.max_terms=64", "--set", "task.max_value=99", "--set", "rl.max_new_tokens=1000"},
            "make prompts of up to 192 tokens; with rl.max_new_tokens = 1000 they need 1192 tokens of context");
  }
  SUBCASE("a micro-batch budget below the longest sequence (the trainer failed at the first step that met one)") {
    refused("budget-rl", {"--set", "rl.max_tokens_per_mb=20"},
            "rl.max_tokens_per_mb = 20: a micro-batch holds whole sequences, and prompts of up to 16 tokens with "
            "rl.max_new_tokens = 8 take up to 24 tokens; raise it to at least 24");
    refused("budget-sft", {"--set", "rl.max_tokens_per_mb=30"},
            "rl.max_tokens_per_mb = 30: a micro-batch holds whole sequences, and the warm start's demonstrations "
            "take up to 37 tokens");
  }
  SUBCASE("a model.path that is no model directory, or a run checkpoint around one") {
    refused("no-model", {"--set", "model.path=" + (dir.path / "missing").string()},
            "missing: no such directory; give a model directory");
    fs::create_directories(dir.path / "checkpoint" / "model");
    std::ofstream(dir.path / "checkpoint" / "model" / "config.json") << "{}";
    refused("checkpoint-root", {"--set", "model.path=" + (dir.path / "checkpoint").string()},
            "a run checkpoint; its model is in " + (dir.path / "checkpoint" / "model").string());
  }
  SUBCASE("code tasks with no interpreter to run their programs (every answer scored 0 before)") {
    refused("no-python",
            {"--set", "task.kind=jsonl", "--set", "task.train_path=" AREAL_SOURCE_DIR "/tests/data/humaneval.jsonl",
             "--set", "reward.python=" + (dir.path / "no-python3").string()},
            "no-python3: no such file, and the tasks include code tasks, whose programs it runs");
  }
  SUBCASE("a topology without a rollout role") {
    refused("no-rollout", {"--set", "nodes.local.roles=[\"controller\", \"trainer\", \"reward\"]"},
            "no node has the role \"rollout\", and an RL run needs one");
  }
  SUBCASE("an empty JSONL dataset (the warm start used to spin forever)") {
    auto empty = dir.write("empty.jsonl", "\n\n");
    refused("empty", {"--set", "task.kind=jsonl", "--set", "task.train_path=" + empty},
            "no usable task (an empty file");
  }
  SUBCASE("a dataset smaller than the held-out set") {
    auto one =
        dir.write("one.jsonl", "{\"prompt\": \"1+2=\", \"solution\": \"3\", \"task\": {\"references\": [\"3\"]}}\n");
    refused("tiny-data", {"--set", "task.kind=jsonl", "--set", "task.train_path=" + one},
            "has 1 usable task and eval.prompts = 8 holds out the first of them: none is left for training");
  }
  SUBCASE("the held-out file is the training file") {
    auto data =
        dir.write("data.jsonl", "{\"prompt\": \"1+2=\", \"solution\": \"3\", \"task\": {\"references\": [\"3\"]}}\n");
    refused("same-file",
            {"--set", "task.kind=jsonl", "--set", "task.train_path=" + data, "--set", "task.eval_path=" + data},
            "task.eval_path is task.train_path");
  }
  SUBCASE("a warm start without demonstrations") {
    std::string lines;
    for (int i = 0; i < 20; ++i)
      lines += "{\"prompt\": \"" + std::to_string(i) + "+1=\", \"task\": {\"references\": [\"" + std::to_string(i + 1) +
               "\"]}}\n";
    auto data = dir.write("nosolutions.jsonl", lines);
    refused("no-demos", {"--set", "task.kind=jsonl", "--set", "task.train_path=" + data},
            "the warm start (sft.steps = 5) needs demonstrations");
  }
  SUBCASE("a tokenizer with more ids than the model's vocabulary") {
    // A model directory from a short run, its tokenizer then given ids past the model's vocabulary.
    node_process made(ci_sized_default({"--set", "rl.steps=1", "--run-dir", (dir.path / "made").string()}),
                      dir.path / "made.log", dir.path);
    REQUIRE_MESSAGE(made.wait_exit(60s) == 0, made.log());
    auto model = dir.path / "made" / "sft_model";
    auto tokenizer = nlohmann::json::parse(read_text(model / "tokenizer.json"));
    auto& vocab = tokenizer["model"]["vocab"];
    auto next = static_cast<int64_t>(vocab.size()) + 2;  // after the two special tokens
    for (auto extra : {"a", "b", "c", "d"})
      vocab[extra] = next++;
    std::ofstream(model / "tokenizer.json") << tokenizer.dump();
    refused("vocab", {"--set", "model.path=" + model.string()}, "ids but the model's vocabulary only");
  }
}

TEST_CASE(
    "a dataset with characters beyond ASCII and a few prompts longer than the context trains, the long ones "
    "skipped and counted") {
  scratch_dir dir{"odd-data"};
  std::string lines;
  for (int i = 0; i < 40; ++i) {
    auto prompt = std::to_string(i) + " + ½ é 😀 =" + (i % 20 == 7 ? std::string(1100, '9') : std::string{});
    lines += nlohmann::json{{"prompt", prompt},
                            {"solution", std::to_string(i + 1) + " ü"},
                            {"task", {{"kind", "math"}, {"references", {std::to_string(i + 1)}}}}}
                 .dump() +
             "\n";
  }
  auto data = dir.write("odd.jsonl", lines);
  node_process run(ci_sized_default({"--set", "task.kind=jsonl", "--set", "task.train_path=" + data, "--set",
                                     "rl.steps=2", "--run-dir", (dir.path / "run").string()}),
                   dir.path / "run.log", dir.path);
  CHECK_MESSAGE(run.wait_exit(60s) == 0, run.log());
  CHECK_MESSAGE(run.log().find("2 tasks skipped (task 8, 28): the prompt and rl.max_new_tokens = 8 exceed the model's "
                               "context of 1024 tokens") != std::string::npos,
                run.log());
  CHECK(run.log().find("data: 30 training tasks, 8 held out") != std::string::npos);
  // The character-level tokenizer holds characters, not bytes: it is valid JSON with "é" as one token.
  auto tokenizer = nlohmann::json::parse(read_text(dir.path / "run" / "sft_model" / "tokenizer.json"));
  CHECK(tokenizer["model"]["vocab"].contains("é"));
  CHECK(tokenizer["model"]["vocab"].contains("😀"));
}

TEST_CASE("a checkpoint whose controller record disagrees with the trainer's state is refused on resume") {
  scratch_dir dir{"bad-checkpoint"};
  auto run_dir = dir.path / "runs" / "single-node";
  node_process made(ci_sized_default({"--set", "rl.steps=2", "--set", "rl.checkpoint_every=1"}), dir.path / "a.log",
                    dir.path);
  REQUIRE_MESSAGE(made.wait_exit(60s) == 0, made.log());
  auto checkpoint = run_dir / "checkpoint";
  auto record = controller_checkpoint::load(checkpoint.string());
  {
    auto forged = record;
    forged.version += 3;
    write_file_atomically(checkpoint / controller_checkpoint::file_name, forged.to_bytes());
    node_process resumed(ci_sized_default({"--set", "rl.steps=4", "--resume"}), dir.path / "b.log", dir.path);
    CHECK_MESSAGE(resumed.wait_exit(30s) == 2, resumed.log());
    CHECK(resumed.log().find("the controller's record says policy version 5 and the trainer's state 2") !=
          std::string::npos);
  }
  {
    write_file_atomically(checkpoint / controller_checkpoint::file_name, record.to_bytes());
    node_process past(ci_sized_default({"--set", "rl.steps=1", "--resume"}), dir.path / "c.log", dir.path);
    CHECK_MESSAGE(past.wait_exit(30s) == 2, past.log());
    CHECK(past.log().find("the checkpoint has 2 steps done, past rl.steps = 1") != std::string::npos);
  }
}
