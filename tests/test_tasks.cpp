// Task sources: the running-sum generator is seeded, positioned and its worked
// solutions are correct; JSONL files round-trip and bad lines name file and line.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "areal/reward/score.hpp"
#include "areal/reward/verifiers.hpp"
#include "areal/tasks/tasks.hpp"

using namespace areal;
using namespace areal::tasks;

TEST_CASE("running sums: worked solutions are correct and lengths have a long tail") {
  auto source = running_sum_generator({});
  size_t shortest = 1000, longest = 0;
  for (int i = 0; i < 500; ++i) {
    auto item = *source->next();
    CHECK(item.id == static_cast<uint64_t>(i));
    CHECK(item.prompt.back() == '=');
    CHECK(item.task.last_number_answer);  // "19;52;57": the last number is the answer, unmarked
    CHECK(reward::score_response(item.worked_solution, item.task).judged == verdict::correct);
    for (char c : item.prompt + item.worked_solution)
      CHECK(running_sum_alphabet().find(c) != std::string::npos);
    shortest = std::min(shortest, item.worked_solution.size());
    longest = std::max(longest, item.worked_solution.size());
  }
  CHECK(longest >= 5 * shortest);
}

TEST_CASE("a generator restored to a position continues exactly") {
  auto a = running_sum_generator({});
  for (int i = 0; i < 37; ++i)
    a->next();
  auto b = running_sum_generator({});
  b->restore(a->position());
  for (int i = 0; i < 10; ++i) {
    auto x = *a->next(), y = *b->next();
    CHECK(x.prompt == y.prompt);
    CHECK(x.id == y.id);
  }
  running_sum_options other;
  other.seed = 2;
  CHECK(running_sum_generator(other)->next()->prompt != running_sum_generator({})->next()->prompt);
}

TEST_CASE("JSONL datasets round-trip and bad lines are reported with file and line") {
  auto path = std::filesystem::temp_directory_path() / ("areal-tasks-" + std::to_string(::getpid()) + ".jsonl");
  auto gen = running_sum_generator({});
  std::vector<task_item> items;
  for (int i = 0; i < 5; ++i)
    items.push_back(*gen->next());
  task_item code;
  code.prompt = "square n";
  code.task.kind = task_kind::code;
  code.task.io_cases = {{"3\n", "9\n"}};
  items.push_back(code);
  write_jsonl(path.string(), items);
  auto source = jsonl_source(path.string());
  for (auto& expected : items) {
    auto item = source->next();
    REQUIRE(item);
    CHECK(item->prompt == expected.prompt);
    CHECK(item->worked_solution == expected.worked_solution);
    CHECK(item->task.kind == expected.task.kind);
    CHECK(item->task.references == expected.task.references);
  }
  CHECK_FALSE(source->next());
  source->restore(2);
  CHECK(source->next()->prompt == items[2].prompt);

  std::ofstream(path) << "{\"prompt\": \"1+1=\", \"task\": {\"references\": [\"2\"]}}\n\n{\"prompt\": 3}\n";
  auto line3 = path.string() + ":3: ";
  CHECK_THROWS_WITH_AS(jsonl_source(path.string()), doctest::Contains(line3.c_str()), std::invalid_argument);
  std::ofstream(path) << "{\"prompt\": \"x\", \"task\": {\"kind\": \"poetry\"}}\n";
  CHECK_THROWS_WITH_AS(jsonl_source(path.string()), doctest::Contains(":1: task kind \"poetry\" is unknown"),
                       std::invalid_argument);
  // Found by fuzzing (tests/fuzz/corpus/tasks_jsonl/regression_float_target): numbers that
  // are not 64-bit integers were converted with undefined results.
  std::ofstream(path) << "{\"prompt\": \"x\", \"task\": {\"kind\": \"countdown\", \"numbers\": [3, 8e46], "
                         "\"target\": 24}}\n";
  CHECK_THROWS_WITH_AS(jsonl_source(path.string()), doctest::Contains(":1: \"numbers\" must hold integers"),
                       std::invalid_argument);
  std::ofstream(path) << "{\"prompt\": \"x\", \"task\": {\"kind\": \"countdown\", \"numbers\": [3], "
                         "\"target\": 2.5}}\n";
  CHECK_THROWS_WITH_AS(jsonl_source(path.string()), doctest::Contains(":1: \"target\" must hold integers"),
                       std::invalid_argument);
  std::filesystem::remove(path);
  CHECK_THROWS_AS(jsonl_source(path.string()), std::invalid_argument);
}
