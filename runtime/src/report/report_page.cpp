// The report's data document, its HTML page and `areal report` (see report.hpp).
#include <chrono>
#include <ctime>

#include <nlohmann/json.hpp>

#include "areal/runtime/files.hpp"
#include "areal/runtime/report.hpp"
#include "report_assets.hpp"
#include "report_files.hpp"

namespace areal::report {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* const bench_kinds =
    "bench_async_vs_sync, bench_simulate, bench_staleness, bench_generation or bench_weight_sync";

// Which benchmark wrote this JSON: its "bench" field, or the shape of files written before it had one.
std::string bench_kind(const json& b) {
  if (b.is_object() && b.contains("bench") && b["bench"].is_string())
    return b["bench"].get<std::string>();
  if (!b.is_object())
    return {};
  if (b.contains("workloads"))
    return "bench_async_vs_sync";
  if (b.contains("table1") || b.contains("eta"))
    return "bench_simulate";
  if (b.contains("rows"))
    return "bench_weight_sync";
  for (auto& [key, value] : b.items())
    if (value.is_object() && value.contains("decode"))
      return "bench_generation";
  return {};
}

// The fields the page draws, checked so that a wrong file is refused here and not half drawn.
void check_bench(const std::string& kind, const json& b, const fs::path& file) {
  auto fail = [&](const std::string& what) {
    throw input_error(file.string() + ": " + kind + " JSON without " + what +
                      "; write it again with build/bench/" + kind + " --json FILE");
  };
  auto numbers = [&](const json& list, std::initializer_list<const char*> keys, const std::string& where) {
    if (!list.is_array() || list.empty())
      fail(where + " rows");
    for (auto& row : list)
      for (auto k : keys)
        if (!row.is_object() || !row.contains(k) || !(row[k].is_number() || row[k].is_string()))
          fail(where + "[]." + k);
  };
  if (kind == "bench_async_vs_sync") {
    numbers(b.value("workloads", json()), {"name", "bound"}, "workloads");
    for (auto& w : b["workloads"])
      numbers(w.value("runs", json()), {"name", "trained_tokens_per_s", "ratio_to_sync"}, "workloads[].runs");
  } else if (kind == "bench_simulate") {
    if (!b.contains("eta") && !b.contains("table1") && !b.contains("scaling"))
      fail("eta, table1 or scaling");
    if (b.contains("eta")) {
      numbers(b["eta"], {"eta", "paper_k_tokens_per_s"}, "eta");
      for (auto& e : b["eta"])
        if (!e.contains("run") || !e["run"].is_object() || !e["run"].contains("steady_tokens_per_s"))
          fail("eta[].run.steady_tokens_per_s");
    }
    if (b.contains("table1"))
      numbers(b["table1"], {"model", "speedup", "paper_speedup"}, "table1");
    if (b.contains("scaling"))
      numbers(b["scaling"], {"devices", "efficiency"}, "scaling");
  } else if (kind == "bench_staleness") {
    numbers(b.value("rows", json()), {"objective", "eta", "accuracy_mean", "accuracy_sd", "token_staleness_mean"},
            "rows");
  } else if (kind == "bench_generation") {
    bool any = false;
    for (auto& [name, v] : b.items())
      if (v.is_object() && v.contains("decode")) {
        any = true;
        for (auto& [batch, row] : v["decode"].items())
          if (!row.is_object() || !row.contains("efficiency") || !row["efficiency"].is_number())
            fail(name + ".decode." + batch + ".efficiency");
      }
    if (!any)
      fail("a model's decode rows");
  } else if (kind == "bench_weight_sync") {
    numbers(b.value("rows", json()), {"path", "size_mib", "receivers", "gb_per_s"}, "rows");
  } else {
    throw input_error(file.string() + ": a benchmark's JSON the report does not draw (\"" + kind +
                      "\"); it draws " + bench_kinds);
  }
}

json read_bench(const fs::path& file) {
  auto b = parse_json_file(file);
  auto kind = bench_kind(b);
  if (kind.empty())
    throw input_error(file.string() + ": not the JSON of a benchmark the report draws (" + bench_kinds +
                      "); write one with e.g. build/bench/bench_async_vs_sync --quick --json FILE");
  check_bench(kind, b, file);
  return {{"file", file.filename().string()}, {"kind", kind}, {"data", b}};
}

std::string now_utc() {
  auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

}  // namespace

json report_document(const std::vector<fs::path>& runs, const std::vector<fs::path>& benches, bool live,
                     const tracer* live_trace) {
  json data = {{"version", AREAL_VERSION}, {"made", now_utc()}, {"live", live}, {"runs", json::array()},
               {"benches", json::array()}};
  std::map<std::string, int> labels;
  for (auto& dir : runs) {
    auto run = read_run(dir, live_trace);
    auto label = run["label"].get<std::string>();
    if (int n = ++labels[label]; n > 1)  // two runs of one name: told apart by their directory
      run["label"] = label + " [" + dir.string() + "]";
    data["runs"].push_back(std::move(run));
  }
  for (auto& file : benches)
    data["benches"].push_back(read_bench(file));
  return data;
}

std::string report_data(const std::vector<fs::path>& runs, const std::vector<fs::path>& benches, bool live,
                        const tracer* live_trace) {
  return report_document(runs, benches, live, live_trace).dump();
}

std::string page_html(const std::string& data_json, bool live) {
  // The data must not end its script element ("</script>") nor open a comment: every "<", which JSON
  // has only inside strings, is written as the escape \u003c (the same string).
  std::string data;
  data.reserve(data_json.size());
  for (char c : data_json)
    data += c == '<' ? std::string{"\\u003c"} : std::string(1, c);
  std::string page;
  page += "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>areal report</title>\n<style>";
  page += assets::uplot_css;
  page += "</style>\n<style>";
  page += assets::report_css;
  page += "</style></head>\n<body><div id=\"areal-report\"></div>\n<script id=\"areal-data\" type=\"application/json\">";
  page += data;
  page += "</script>\n<script>window.AREAL_LIVE = ";
  page += live ? "true" : "false";
  page += ";</script>\n<script>";
  page += assets::uplot_js;
  page += "</script>\n<script>";
  page += assets::report_js;
  page += "</script>\n</body></html>\n";
  return page;
}

int report_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  static const char* usage =
      "usage: areal report RUN_DIR... [--bench FILE.json]... [--out FILE]\n"
      "  draws runs (overlaid) and benchmark JSON files into one self-contained HTML file\n"
      "  (default report.html in the current directory)\n";
  std::vector<fs::path> runs, benches;
  fs::path out_file = "report.html";
  for (size_t i = 0; i < args.size(); ++i) {
    auto& a = args[i];
    if (a == "--help" || a == "-h") {
      out << usage;
      return 0;
    }
    if ((a == "--bench" || a == "--out") && i + 1 >= args.size()) {
      err << "areal report: " << a << " needs a file\n" << usage;
      return 2;
    }
    if (a == "--bench")
      benches.emplace_back(args[++i]);
    else if (a == "--out")
      out_file = args[++i];
    else if (a.rfind("--", 0) == 0) {
      err << "areal report: unknown option \"" << a << "\"\n" << usage;
      return 2;
    } else
      runs.emplace_back(a);
  }
  if (runs.empty() && benches.empty()) {
    err << "areal report: nothing to draw: give run directories and/or --bench files\n" << usage;
    return 2;
  }
  json data;
  try {
    data = report_document(runs, benches, false, nullptr);
  } catch (const input_error& e) {
    err << "areal report: " << e.what() << "; nothing was written\n";
    return 2;
  }
  for (auto& run : data["runs"]) {
    out << run["label"].get<std::string>() << ": " << run["step_count"] << " steps, " << run["state"].get<std::string>()
        << "\n";
    for (auto& w : run["warnings"])
      err << "areal report: warning: " << run["dir"].get<std::string>() << ": " << w.get<std::string>() << "\n";
  }
  try {
    write_file_atomically(out_file, page_html(data.dump(), false));
  } catch (const file_error& e) {
    err << "areal report: " << e.what() << "\n";
    return 2;
  }
  out << "wrote " << out_file.string() << " (" << runs.size() << " run(s), " << benches.size()
      << " benchmark file(s)); it opens in any browser without network\n";
  return 0;
}

}  // namespace areal::report
