// The report's reading of what runs leave, whatever state they were left in:
// a run in progress (its lock held), a crashed run (the last line cut off,
// no end line), a resumed run (two segments), a multi-node run (the other
// nodes' tracks in trace.json), damaged files (refused naming file and line),
// benchmark files of each kind; the page's data kept inside its script
// element; and the live dashboard over HTTP. The browser test
// (tests/report/report_page_test.mjs) draws real runs.
#include <doctest/doctest.h>

#include <httplib.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "areal/runtime/files.hpp"
#include "areal/runtime/report.hpp"
#include "areal/runtime/trace.hpp"
#include "node_process.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace areal;
using areal::test::scratch_dir;

namespace {

std::string step_line(int step, double time_s, double reward) {
  return json{{"event", "step"},
              {"step", step},
              {"version", step},
              {"time_s", time_s},
              {"reward_mean", reward},
              {"staleness_token_mean", 0.5},
              {"staleness_token_max", 1},
              {"staleness_token_histogram", {10, 5}},
              {"idle_fraction", {{"trainer", 0.25}, {"rollout-0", 0.5}}},
              {"admitted", 8 * step + 8},
              {"trained", 8 * step},
              {"dropped", 0}}
      .dump();
}

// A finished run of `steps` steps with an evaluation before and after, config and trace.
void write_run(const scratch_dir& d, const std::string& dir, int steps, const std::string& mode = "async") {
  fs::create_directories(d.path / dir);
  std::string metrics = json{{"event", "eval"}, {"time_s", 0}, {"version", 0}, {"accuracy", 0.1}}.dump() + "\n";
  for (int s = 1; s <= steps; ++s)
    metrics += step_line(s, s * 0.5, 0.1 * s) + "\n";
  metrics += json{{"event", "end"}, {"time_s", steps * 0.5}, {"why", "run complete"}, {"admitted", 8 * steps + 8},
                  {"trained", 8 * steps}, {"dropped", 8}, {"drop_reasons", {{"staler than the bound", 8}}}}
                 .dump() +
             "\n";
  metrics += json{{"event", "eval"}, {"time_s", steps * 0.5}, {"version", steps}, {"accuracy", 0.4}}.dump() + "\n";
  d.write(dir + "/metrics.jsonl", metrics);
  d.write(dir + "/config.toml", "[run]\nname = \"" + dir + "\"\n[rl]\nmode = \"" + mode + "\"\neta = 4\n");
}

json read(const scratch_dir& d, const std::string& dir) {
  return json::parse(report::read_run_json(d.path / dir));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const report::input_error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("report: a finished run becomes columns per step, evaluations, accounting and its label") {
  scratch_dir d("report-finished");
  write_run(d, "a", 4);
  auto run = read(d, "a");
  CHECK(run["label"] == "a (async, η=4)");
  CHECK(run["step_count"] == 4);
  CHECK(run["steps"]["reward_mean"].size() == 4);
  CHECK(run["steps"]["time_s"][3] == 2.0);
  CHECK(run["evals"]["accuracy"] == json({0.1, 0.4}));
  CHECK(run["evals"]["time_s"] == json({0, 2.0}));
  CHECK(run["staleness_histogram"] == json({40, 20}));  // summed over the steps
  CHECK(run["idle"]["trainer"].size() == 4);
  CHECK(run["accounting"]["dropped"] == 8);
  CHECK(run["accounting"]["drop_reasons"]["staler than the bound"] == 8);
  CHECK(run["state"] == "finished (run complete)");
  CHECK(run["warnings"].empty());
  write_run(d, "b", 2, "sync");
  CHECK(read(d, "b")["label"] == "b (sync)");
}

TEST_CASE("report: a crashed run: the cut-off last line is left out with a warning, the run is not finished") {
  scratch_dir d("report-crashed");
  fs::create_directories(d.path / "r");
  d.write("r/metrics.jsonl", step_line(1, 0.5, 0.2) + "\n" + step_line(2, 1.0, 0.3) + "\n" +
                                 step_line(3, 1.5, 0.4).substr(0, 40));
  auto run = read(d, "r");
  CHECK(run["step_count"] == 2);
  REQUIRE(run["warnings"].size() == 2);  // the cut line; no config.toml
  CHECK(run["warnings"][0].get<std::string>().find("line 3 is cut off") != std::string::npos);
  CHECK(run["state"].get<std::string>().find("stopped without its end line") == 0);
  CHECK(run["accounting"]["from"] == "step 2");
  CHECK(run["timeline_missing"].get<std::string>().find("no trace.json") == 0);
}

TEST_CASE("report: a damaged line in the middle is an error naming the file and the line") {
  scratch_dir d("report-damaged");
  fs::create_directories(d.path / "r");
  d.write("r/metrics.jsonl", step_line(1, 0.5, 0.2) + "\n{\"step\": 2\n" + step_line(3, 1.5, 0.4) + "\n");
  auto text = error_of([&] { read(d, "r"); });
  CHECK(text.find((d.path / "r" / "metrics.jsonl").string() + " line 2: not JSON") == 0);
  d.write("r/metrics.jsonl", step_line(1, 0.5, 0.2) + "\n[1, 2]\n");
  CHECK(error_of([&] { read(d, "r"); }).find("line 2: not a metrics record") != std::string::npos);
  CHECK(error_of([&] { report::read_run_json(d.path / "missing"); }).find("no such directory") != std::string::npos);
  fs::create_directories(d.path / "empty");
  CHECK(error_of([&] { read(d, "empty"); }).find("not a run directory (no metrics.jsonl)") != std::string::npos);
  d.write("r/metrics.jsonl", step_line(1, 0.5, 0.2) + "\n");
  d.write("r/trace.json", "{\"traceEvents\": [\n{\"ph\": \"X\",}\n]}");
  CHECK(error_of([&] { read(d, "r"); }).find("trace.json line 2 column") != std::string::npos);
}

TEST_CASE("report: a resumed run is one line of steps in two segments, and a run going on is in progress") {
  scratch_dir d("report-resumed");
  fs::create_directories(d.path / "r");
  d.write("r/metrics.jsonl", step_line(1, 0.5, 0.2) + "\n" + step_line(2, 1.0, 0.3) + "\n" +
                                 json{{"event", "resume"}, {"time_s", 1.0}, {"steps", 2}}.dump() + "\n" +
                                 step_line(3, 1.6, 0.4) + "\n");
  auto lock = run_lock::acquire(d.path / "r", "run.lock");  // as the job's process holds it
  auto run = read(d, "r");
  CHECK(run["step_count"] == 3);
  CHECK(run["steps"]["step"] == json({1, 2, 3}));
  CHECK(run["resumes"].size() == 1);
  CHECK(run["state"] == "in progress; resumed 1 time(s)");
  CHECK(run["timeline_missing"].get<std::string>().find("written when the run ends") != std::string::npos);
}

TEST_CASE("report: the timeline summary holds every track, the other nodes' too, from trace.json or the live tracer") {
  scratch_dir d("report-trace");
  write_run(d, "r", 2);
  json events = json::array();
  events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"tid", 1}, {"args", {{"name", "trainer"}}}});
  events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"tid", 2}, {"args", {{"name", "worker-b/rollout-0"}}}});
  events.push_back({{"ph", "X"}, {"name", "train"}, {"tid", 1}, {"ts", 0}, {"dur", 3e6}});
  events.push_back({{"ph", "X"}, {"name", "generate"}, {"tid", 2}, {"ts", 1e6}, {"dur", 3e6}});
  events.push_back({{"ph", "X"}, {"name", "weight sync"}, {"tid", 2}, {"ts", 0}, {"dur", 1e6}});
  d.write("r/trace.json", json{{"traceEvents", events}}.dump());
  auto run = read(d, "r");
  CHECK(run["timeline"]["span_s"] == doctest::Approx(4.0));
  CHECK(run["timeline"]["tracks"]["trainer"]["train"] == doctest::Approx(3.0));
  CHECK(run["timeline"]["tracks"]["worker-b/rollout-0"]["generate"] == doctest::Approx(3.0));
  CHECK(run["timeline"]["activities"] == json({"generate", "weight sync", "train"}));

  tracer live("test");
  live.span("rollout-0", "generate", 1'000'000'000, 3'000'000'000);
  live.span("trainer", "train", 2'000'000'000, 5'000'000'000);
  auto from_tracer = json::parse(report::read_run_json(d.path / "r", &live));
  CHECK(from_tracer["timeline"]["span_s"] == doctest::Approx(4.0));
  CHECK(from_tracer["timeline"]["tracks"]["rollout-0"]["generate"] == doctest::Approx(2.0));

  // A span's numbers (what an engine step computed) reach spans() and the Chrome trace's "args".
  live.span("rollout-0", "generate", 5'000'000'000, 6'000'000'000, {{"batch", 7}, {"context", 300}});
  auto kept = live.spans().back();
  CHECK(kept.args == tracer::span_args{{"batch", 7}, {"context", 300}});
  live.write_chrome_trace((d.path / "live.json").string());
  auto written = json::parse(areal::test::read_text(d.path / "live.json"));
  CHECK(written["traceEvents"].back()["args"] == json({{"batch", 7}, {"context", 300}}));
}

TEST_CASE("report: benchmark files are recognised by kind and checked, and others are refused with the reason") {
  scratch_dir d("report-bench");
  auto async_file = d.write("a.json", R"({"bench": "bench_async_vs_sync", "workloads": [{"name": "w", "bound": 5,
      "runs": [{"name": "sync", "trained_tokens_per_s": 1, "ratio_to_sync": 1}]}]})");
  auto old_sim = d.write("s.json", R"({"eta": [{"eta": "0", "paper_k_tokens_per_s": 128.7,
      "run": {"steady_tokens_per_s": 9}}]})");  // written before the "bench" field: known by its shape
  auto data = json::parse(report::report_data({}, {async_file, old_sim}, false));
  CHECK(data["benches"][0]["kind"] == "bench_async_vs_sync");
  CHECK(data["benches"][1]["kind"] == "bench_simulate");
  auto missing = d.write("m.json", R"({"bench": "bench_async_vs_sync", "workloads": [{"name": "w", "bound": 5,
      "runs": [{"name": "sync"}]}]})");
  CHECK(error_of([&] { report::report_data({}, {missing}, false); })
            .find("without workloads[].runs[].trained_tokens_per_s") != std::string::npos);
  auto other = d.write("o.json", R"({"levels": []})");
  CHECK(error_of([&] { report::report_data({}, {other}, false); }).find("not the JSON of a benchmark") !=
        std::string::npos);
  auto unknown = d.write("u.json", R"({"bench": "bench_wire"})");
  CHECK(error_of([&] { report::report_data({}, {unknown}, false); }).find("does not draw (\"bench_wire\")") !=
        std::string::npos);
}

TEST_CASE("report: the page keeps its data inside the data element and draws without network") {
  scratch_dir d("report-page");
  write_run(d, "r", 2);
  d.write("r/config.toml", "[run]\nname = \"</script><script>alert(1)</script>\"\n");
  auto data = report::report_data({d.path / "r"}, {}, false);
  auto page = report::page_html(data, false);
  auto start = page.find("<script id=\"areal-data\"");
  auto end = page.find("</script>", start);
  REQUIRE(end != std::string::npos);
  auto inside = page.substr(start, end - start);
  CHECK(inside.find("alert(1)") != std::string::npos);  // the name is there, escaped
  CHECK(inside.find("<script>alert") == std::string::npos);
  auto after = json::parse(inside.substr(inside.find('>') + 1));
  CHECK(after["runs"][0]["name"] == "</script><script>alert(1)</script>");
  CHECK(page.find("src=") == std::string::npos);
  CHECK(page.find("uPlot") != std::string::npos);
  CHECK(page.find("window.AREAL_LIVE = false") != std::string::npos);
}

TEST_CASE("report: areal report's command line: usage, bad input with nothing written, the file written") {
  scratch_dir d("report-command");
  std::ostringstream out, err;
  CHECK(report::report_command({}, out, err) == 2);
  CHECK(err.str().find("nothing to draw") != std::string::npos);
  CHECK(report::report_command({"--out"}, out, err) == 2);
  CHECK(report::report_command({"--frobnicate"}, out, err) == 2);
  auto target = (d.path / "page.html").string();
  err.str("");
  CHECK(report::report_command({(d.path / "nothing").string(), "--out", target}, out, err) == 2);
  CHECK(err.str().find("no such directory") != std::string::npos);
  CHECK(!fs::exists(target));
  write_run(d, "r", 3);
  out.str("");
  CHECK(report::report_command({(d.path / "r").string(), "--out", target}, out, err) == 0);
  CHECK(fs::exists(target));
  CHECK(out.str().find("r (async, η=4): 3 steps, finished (run complete)") != std::string::npos);
}

TEST_CASE("report: the live dashboard serves the page and the data of the run as it grows") {
  scratch_dir d("report-live");
  write_run(d, "r", 2);
  auto trace = std::make_shared<tracer>("test");
  auto port = areal::test::free_port();
  report::dashboard board(d.path / "r", port, trace);
  CHECK(board.address() == "http://127.0.0.1:" + std::to_string(port) + "/");
  httplib::Client client("127.0.0.1", port);
  auto page = client.Get("/");
  REQUIRE(page);
  CHECK(page->status == 200);
  CHECK(page->body.find("window.AREAL_LIVE = true") != std::string::npos);
  auto first = client.Get("/data.json");
  REQUIRE(first);
  CHECK(json::parse(first->body)["runs"][0]["step_count"] == 2);
  CHECK(json::parse(first->body)["live"] == true);
  write_run(d, "r", 5);  // more steps written
  trace->span("trainer", "train", 0, 1'000'000'000);
  auto later = json::parse(client.Get("/data.json")->body);
  CHECK(later["runs"][0]["step_count"] == 5);
  CHECK(later["runs"][0]["timeline"]["tracks"]["trainer"]["train"] == doctest::Approx(1.0));
  d.write("r/metrics.jsonl", "not json\n" + step_line(1, 0.5, 0.1) + "\n");  // damaged under it
  auto damaged = client.Get("/data.json");
  REQUIRE(damaged);
  CHECK(damaged->status == 500);
  CHECK(damaged->body.find("line 1: not JSON") != std::string::npos);
  std::string refused;
  try {
    report::dashboard second(d.path / "r", port, trace);
  } catch (const std::runtime_error& e) {
    refused = e.what();
  }
  CHECK(refused.find("cannot listen on 127.0.0.1:" + std::to_string(port)) != std::string::npos);
}
