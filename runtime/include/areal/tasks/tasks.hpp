// Where prompts come from: seeded synthetic task generators and JSONL files.
// Each item carries the prompt, a worked solution (for the SFT warm start) and
// the reward task its responses are checked against. Sources are positioned:
// position() counts the items handed out and restore(p) continues exactly there,
// so that a resumed run neither replays nor skips data.
#pragma once

#include <cstdint>
#include <istream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "areal/messages/records.hpp"

namespace areal::tasks {

struct task_item {
  uint64_t id = 0;
  std::string prompt;
  std::string worked_solution;  // a correct response; may be empty for JSONL items without one
  reward_task task;
};

class task_source {
 public:
  virtual ~task_source() = default;
  /// The next item, or nothing when the source is exhausted (generators never are).
  virtual std::optional<task_item> next() = 0;
  virtual uint64_t position() const = 0;
  virtual void restore(uint64_t position) = 0;
};

/// "Running sums": the prompt is a list of numbers to add ("12+7+33+5="); the worked
/// solution writes every partial sum ("19;52;57") so its length grows with the
/// list; the answer is the last number, checked exactly by the math verifier. List
/// lengths are log-normal (median `median_terms`, capped at `max_terms`): a long
/// tail of solution lengths, as in reasoning models.
struct running_sum_options {
  uint64_t seed = 1;
  double median_terms = 3.0;
  double spread = 0.6;  // sigma of the log-normal
  int max_terms = 16;
  int max_value = 99;
  /// Share of items whose worked solution stops one partial sum short of the
  /// answer (for two terms: says nothing). Demonstrations of mixed quality: a
  /// model that imitates them often stops before it is done, and RL with the
  /// exactly checked reward teaches it to finish.
  double truncated_fraction = 0.0;
};
std::unique_ptr<task_source> running_sum_generator(running_sum_options options);

/// The characters running-sum prompts and solutions use (for a character-level tokenizer).
std::string running_sum_alphabet();

/// One item per line: {"prompt": "...", "solution": "...", "task": {"kind": "math"|"countdown"|"code",
/// "references": [...], "numbers": [...], "target": N, "io_cases": [{"input": .., "output": ..}],
/// "assertions": [...], "test_setup": "...", "entry_points": [...], "case_time_s": s, "total_time_s": s,
/// "partial_credit": bool}}. Errors name the file and line.
std::unique_ptr<task_source> jsonl_source(const std::string& path);

/// What reading a JSONL file met besides its items.
struct jsonl_counts {
  size_t lines = 0;        // lines in the file
  size_t blank_lines = 0;  // skipped
};
/// The items of a JSONL file in file order (the format of jsonl_source); a
/// malformed line is an error naming the file and line.
std::vector<task_item> read_jsonl(const std::string& path, jsonl_counts* counts = nullptr);
/// The same, from a stream (`path` names it in errors).
std::vector<task_item> parse_jsonl(std::istream& in, const std::string& path, jsonl_counts* counts = nullptr);
/// A finite source over items (positions are indices into them).
std::unique_ptr<task_source> item_source(std::vector<task_item> items);
/// Writes items in that format.
void write_jsonl(const std::string& path, const std::vector<task_item>& items);

}  // namespace areal::tasks
