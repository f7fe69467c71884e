// The task sources: seeded generators and JSONL datasets, positioned for resume (see tasks.hpp).
#include "areal/tasks/tasks.hpp"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace areal::tasks {

namespace {

class running_sum_source : public task_source {
 public:
  explicit running_sum_source(running_sum_options o) : options_(o) { restore(0); }

  std::optional<task_item> next() override {
    std::lognormal_distribution<double> terms_dist(std::log(options_.median_terms), options_.spread);
    std::uniform_int_distribution<int> value(1, options_.max_value);
    auto terms = std::clamp(static_cast<int>(std::lround(terms_dist(rng_))), 2, options_.max_terms);
    task_item item;
    item.id = position_;
    long long sum = 0;
    for (int i = 0; i < terms; ++i) {
      auto v = value(rng_);
      item.prompt += (i ? "+" : "") + std::to_string(v);
      sum += v;
      if (i > 0)
        item.worked_solution += (i > 1 ? ";" : "") + std::to_string(sum);
    }
    item.prompt += "=";
    if (options_.truncated_fraction > 0 &&
        std::uniform_real_distribution<double>(0, 1)(rng_) < options_.truncated_fraction) {
      auto last = item.worked_solution.rfind(';');
      item.worked_solution.resize(last == std::string::npos ? 0 : last);
    }
    item.task.kind = task_kind::math;
    item.task.references = {std::to_string(sum)};
    item.task.last_number_answer = true;  // the worked solution ends with the answer, unmarked
    ++position_;
    return item;
  }

  uint64_t position() const override { return position_; }

  void restore(uint64_t position) override {
    rng_.seed(options_.seed);
    position_ = 0;
    while (position_ < position)
      next();
  }

 private:
  running_sum_options options_;
  std::mt19937_64 rng_;
  uint64_t position_ = 0;
};

class jsonl_file_source : public task_source {
 public:
  explicit jsonl_file_source(std::vector<task_item> items) : items_(std::move(items)) {}
  std::optional<task_item> next() override {
    if (position_ >= items_.size())
      return std::nullopt;
    return items_[position_++];
  }
  uint64_t position() const override { return position_; }
  void restore(uint64_t position) override { position_ = std::min<uint64_t>(position, items_.size()); }

 private:
  std::vector<task_item> items_;
  uint64_t position_ = 0;
};

// A JSON integer that fits int64_t; nlohmann would convert 1e40 or 2.5 with undefined or silent results.
int64_t integer(const nlohmann::json& j, const char* key) {
  if (j.is_number_unsigned()) {
    if (j.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX))
      return static_cast<int64_t>(j.get<uint64_t>());
  } else if (j.is_number_integer()) {
    return j.get<int64_t>();
  }
  throw std::invalid_argument(std::string{"\""} + key + "\" must hold integers that fit 64 bits, not " + j.dump());
}

task_kind parse_kind(const std::string& s, const std::string& where) {
  if (s == "math")
    return task_kind::math;
  if (s == "countdown")
    return task_kind::countdown;
  if (s == "code")
    return task_kind::code;
  throw std::invalid_argument(where + ": task kind \"" + s + "\" is unknown; use math, countdown or code");
}

}  // namespace

std::unique_ptr<task_source> running_sum_generator(running_sum_options options) {
  if (options.median_terms < 2 || options.max_terms < 2 || options.max_value < 1)
    throw std::invalid_argument("running sums need at least 2 terms and positive values");
  if (!(options.truncated_fraction >= 0 && options.truncated_fraction <= 1))
    throw std::invalid_argument("running sums: truncated_fraction must lie in [0, 1]");
  return std::make_unique<running_sum_source>(options);
}

std::string running_sum_alphabet() {
  return "0123456789+=;";
}

std::vector<task_item> read_jsonl(const std::string& path, jsonl_counts* counts) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw std::invalid_argument(path + ": is a directory; a dataset is a JSONL file (one task per line)");
  std::ifstream in(path);
  if (!in)
    throw std::invalid_argument(path + ": cannot open the dataset");
  return parse_jsonl(in, path, counts);
}

std::vector<task_item> parse_jsonl(std::istream& in, const std::string& path, jsonl_counts* counts) {
  std::vector<task_item> items;
  std::string line;
  size_t number = 1;
  for (; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      if (counts)
        counts->blank_lines++;
      continue;
    }
    auto where = path + ":" + std::to_string(number);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
      task_item item;
      item.id = items.size();
      item.prompt = j.at("prompt").get<std::string>();
      item.worked_solution = j.value("solution", "");
      auto& t = j.at("task");
      item.task.kind = parse_kind(t.value("kind", "math"), where);
      item.task.references = t.value("references", std::vector<std::string>{});
      item.task.last_number_answer = t.value("last_number_answer", false);
      if (t.contains("numbers")) {
        if (!t["numbers"].is_array())
          throw std::invalid_argument("\"numbers\" must be a list of integers");
        for (auto& n : t["numbers"])
          item.task.numbers.push_back(integer(n, "numbers"));
      }
      if (t.contains("target"))
        item.task.target = integer(t["target"], "target");
      for (auto& c : t.value("io_cases", nlohmann::json::array()))
        item.task.io_cases.push_back({c.at("input").get<std::string>(), c.at("output").get<std::string>()});
      item.task.assertions = t.value("assertions", std::vector<std::string>{});
      item.task.test_setup = t.value("test_setup", std::string{});
      item.task.entry_points = t.value("entry_points", std::vector<std::string>{});
      item.task.case_time_s = t.value("case_time_s", item.task.case_time_s);
      item.task.total_time_s = t.value("total_time_s", item.task.total_time_s);
      item.task.partial_credit = t.value("partial_credit", item.task.partial_credit);
      if (!(item.task.case_time_s > 0 && item.task.case_time_s <= 3600 && item.task.total_time_s > 0 &&
            item.task.total_time_s <= 3600))
        throw std::invalid_argument("case_time_s and total_time_s must lie in (0, 3600] seconds");
      if (item.task.kind == task_kind::math && item.task.references.empty())
        throw std::invalid_argument("a math task needs \"references\"");
      items.push_back(std::move(item));
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument(where + ": " + e.what());
    } catch (const std::invalid_argument& e) {
      std::string text = e.what();
      throw std::invalid_argument(text.rfind(path, 0) == 0 ? text : where + ": " + text);
    }
  }
  if (in.bad())
    throw std::invalid_argument(path + ":" + std::to_string(number) + ": read failed");
  if (counts)
    counts->lines = number - 1;
  return items;
}

std::unique_ptr<task_source> item_source(std::vector<task_item> items) {
  return std::make_unique<jsonl_file_source>(std::move(items));
}

std::unique_ptr<task_source> jsonl_source(const std::string& path) {
  return item_source(read_jsonl(path));
}

void write_jsonl(const std::string& path, const std::vector<task_item>& items) {
  std::ofstream out(path);
  if (!out)
    throw std::invalid_argument(path + ": cannot write");
  for (auto& item : items) {
    nlohmann::json t = {{"kind", to_string(item.task.kind)}};
    if (!item.task.references.empty())
      t["references"] = item.task.references;
    if (item.task.last_number_answer)
      t["last_number_answer"] = true;
    if (!item.task.numbers.empty()) {
      t["numbers"] = item.task.numbers;
      t["target"] = item.task.target;
    }
    if (!item.task.io_cases.empty()) {
      t["io_cases"] = nlohmann::json::array();
      for (auto& c : item.task.io_cases)
        t["io_cases"].push_back({{"input", c.input}, {"output", c.expected_output}});
    }
    if (!item.task.assertions.empty())
      t["assertions"] = item.task.assertions;
    if (!item.task.test_setup.empty())
      t["test_setup"] = item.task.test_setup;
    if (!item.task.entry_points.empty())
      t["entry_points"] = item.task.entry_points;
    if (item.task.kind == task_kind::code) {
      t["case_time_s"] = item.task.case_time_s;
      t["total_time_s"] = item.task.total_time_s;
      t["partial_credit"] = item.task.partial_credit;
    }
    nlohmann::json j = {{"prompt", item.prompt}, {"task", t}};
    if (!item.worked_solution.empty())
      j["solution"] = item.worked_solution;
    out << j.dump() << "\n";
  }
}

}  // namespace areal::tasks
