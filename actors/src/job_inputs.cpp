// The job's inputs, read once and checked against each other before any work
// starts: the datasets (usable lines, what was skipped and why, a held-out
// split disjoint from training), prompts and solutions against the model's
// context, the tokenizer against the model's vocabulary; and the task
// sources the job draws from them (see job_parts.hpp).
#include <algorithm>
#include <filesystem>
#include <set>

#include "job_parts.hpp"

namespace fs = std::filesystem;

namespace areal::job {

namespace {

tasks::running_sum_options sum_options(const task_spec& t, uint64_t seed) {
  tasks::running_sum_options o;
  o.seed = seed;
  o.max_value = static_cast<int>(t.max_value);
  o.median_terms = t.median_terms;
  o.max_terms = static_cast<int>(t.max_terms);
  return o;
}

int64_t digits(int64_t v) {
  return static_cast<int64_t>(std::to_string(v).size());
}

std::string plural(size_t n, const std::string& what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::equivalent(a, b, ec) && !ec;
}

}  // namespace

// -- reading --------------------------------------------------------------------

job_datasets read_datasets(const run_config& c) {
  job_datasets d;
  if (c.task.kind != "jsonl")
    return d;
  auto read = [&](const std::string& path, const char* key) {
    tasks::jsonl_counts counts;
    std::vector<tasks::task_item> items;
    try {
      items = tasks::read_jsonl(path, &counts);
    } catch (const std::invalid_argument& e) {
      throw job_error(std::string{"task."} + key + ": " + e.what());
    }
    if (counts.blank_lines > 0)
      d.notes.push_back(std::string{"task."} + key + " " + path + ": " + plural(counts.blank_lines, "blank line") +
                        " skipped");
    return items;
  };
  d.train = read(c.task.train_path, "train_path");
  if (!c.task.eval_path.empty()) {
    if (same_file(c.task.eval_path, c.task.train_path))
      throw job_error("task.eval_path is task.train_path (" + c.task.train_path +
                      "): the held-out prompts would be training prompts; leave task.eval_path empty to hold out "
                      "the first eval.prompts lines of task.train_path, or give a separate file");
    d.eval = read(c.task.eval_path, "eval_path");
  }
  return d;
}

std::string data_alphabet(const run_config& c, const job_datasets& d) {
  if (c.task.kind == "agent") {
    // Agents write anything: printable ASCII, newline and tab (other characters are <unk>).
    std::string ascii = "\n\t";
    for (char ch = ' '; ch <= '~'; ++ch)
      ascii += ch;
    return ascii;
  }
  if (c.task.kind != "jsonl")
    return tasks::running_sum_alphabet();
  // Characters, not bytes: a multi-byte UTF-8 character is one token (the
  // JSON reader has checked that the text is valid UTF-8).
  std::set<std::string> chars;
  for (auto* items : {&d.train, &d.eval})
    for (auto& item : *items)
      for (auto* text : {&item.prompt, &item.worked_solution})
        for (size_t i = 0; i < text->size();) {
          auto lead = static_cast<unsigned char>((*text)[i]);
          size_t length = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
          chars.insert(text->substr(i, length));
          i += length;
        }
  std::string alphabet;
  for (auto& ch : chars)
    alphabet += ch;
  return alphabet;
}

// -- checking -------------------------------------------------------------------

namespace {

// The trainer packs whole sequences into micro-batches of rl.max_tokens_per_mb
// tokens: a longer one fails the step that meets it, mid-run.
void check_micro_batch_budget(const run_config& c, int64_t longest, const std::string& what) {
  if (longest > c.rl.max_tokens_per_mb)
    throw job_error("rl.max_tokens_per_mb = " + std::to_string(c.rl.max_tokens_per_mb) +
                    ": a micro-batch holds whole sequences, and " + what + " take up to " + std::to_string(longest) +
                    " tokens; raise it to at least " + std::to_string(longest));
}

// Generated running sums: the longest prompt and solution their settings can make.
void check_generated(const run_config& c, int64_t context) {
  auto& t = c.task;
  auto prompt = t.max_terms * (digits(t.max_value) + 1);                        // "v+v+...+v="
  auto solution = (t.max_terms - 1) * (digits(t.max_terms * t.max_value) + 1);  // "s;s;...;s" and <eos>
  auto need = prompt + c.rl.max_new_tokens;
  if (need > context)
    throw job_error("task.max_terms = " + std::to_string(t.max_terms) + " and task.max_value = " +
                    std::to_string(t.max_value) + " make prompts of up to " + std::to_string(prompt) +
                    " tokens; with rl.max_new_tokens = " + std::to_string(c.rl.max_new_tokens) + " they need " +
                    std::to_string(need) + " tokens of context and the model has " + std::to_string(context) +
                    ": lower rl.max_new_tokens to " + std::to_string(std::max<int64_t>(1, context - prompt)) +
                    " or task.max_terms");
  if (c.sft.steps > 0 && prompt + solution > context)
    throw job_error("the warm start's demonstrations (task.max_terms = " + std::to_string(t.max_terms) +
                    ") take up to " + std::to_string(prompt + solution) + " tokens and the model's context is " +
                    std::to_string(context) + ": lower task.max_terms or set sft.steps = 0");
  check_micro_batch_budget(c, need,
                           "prompts of up to " + std::to_string(prompt) +
                               " tokens with rl.max_new_tokens = " + std::to_string(c.rl.max_new_tokens));
  if (c.sft.steps > 0)
    check_micro_batch_budget(c, prompt + solution, "the warm start's demonstrations");
}

}  // namespace

void check_inputs(const run_config& c, const model_parts& m, job_datasets& d) {
  auto context = max_sequence(m.config);
  auto new_tokens = c.rl.max_new_tokens;
  auto where = c.model.path.empty() ? "model.preset \"" + c.model.preset + "\"" : "model.path " + c.model.path;
  if (m.tokenizer->vocab_size() > m.config.vocab_size)
    throw job_error(where + ": the tokenizer has " + std::to_string(m.tokenizer->vocab_size()) +
                    " ids but the model's vocabulary only " + std::to_string(m.config.vocab_size) + ": ids from " +
                    std::to_string(m.config.vocab_size) +
                    " up have no embedding; use the tokenizer the model was trained with");
  if (m.tokenizer->vocab_size() < m.config.vocab_size)
    d.warnings.push_back(where + ": the model's vocabulary has " + std::to_string(m.config.vocab_size) +
                         " ids, its tokenizer " + std::to_string(m.tokenizer->vocab_size()) +
                         " (padding); generated ids without a token decode as U+FFFD");
  if (new_tokens >= context)
    throw job_error("rl.max_new_tokens = " + std::to_string(new_tokens) +
                    " leaves no room for a prompt in the model's context of " + std::to_string(context) + " tokens (" +
                    where + "): lower rl.max_new_tokens below " + std::to_string(context));
  if (c.task.kind == "agent") {
    check_micro_batch_budget(c, context, "an agent's episode may fill the model's context: they");
    return;  // the agents' episodes are checked call by call, against the context
  }
  if (c.task.kind != "jsonl") {
    check_generated(c, context);
    return;
  }

  // Prompts that cannot be answered within the context are not used; they are counted.
  // Returns the prompt lengths of the tasks kept.
  auto fits = [&](std::vector<tasks::task_item>& items, const std::string& key) {
    std::vector<size_t> too_long;
    std::vector<tasks::task_item> kept;
    std::vector<int64_t> lengths;
    for (size_t i = 0; i < items.size(); ++i) {
      auto tokens = static_cast<int64_t>(m.tokenizer->encode(items[i].prompt).size());
      if (tokens + new_tokens > context) {
        too_long.push_back(i + 1);
      } else {
        kept.push_back(std::move(items[i]));
        lengths.push_back(tokens);
      }
    }
    if (!too_long.empty()) {
      std::string which;
      for (size_t k = 0; k < std::min<size_t>(too_long.size(), 5); ++k)
        which += (k ? ", " : "") + std::to_string(too_long[k]);
      d.warnings.push_back(key + ": " + plural(too_long.size(), "task") + " skipped (task " + which +
                           (too_long.size() > 5 ? ", ..." : "") +
                           "): the prompt and rl.max_new_tokens = " + std::to_string(new_tokens) +
                           " exceed the model's context of " + std::to_string(context) + " tokens");
    }
    items = std::move(kept);
    return lengths;
  };
  auto prompt_lengths = fits(d.train, "task.train_path " + c.task.train_path);
  if (!c.task.eval_path.empty())
    fits(d.eval, "task.eval_path " + c.task.eval_path);
  if (d.train.empty())
    throw job_error("task.train_path " + c.task.train_path +
                    ": no usable task (an empty file, or every prompt too long; see above); add tasks to it");
  if (c.task.eval_path.empty() && c.eval.prompts > 0) {
    if (static_cast<int64_t>(d.train.size()) <= c.eval.prompts)
      throw job_error("task.train_path " + c.task.train_path + " has " + plural(d.train.size(), "usable task") +
                      " and eval.prompts = " + std::to_string(c.eval.prompts) +
                      " holds out the first of them: none is left for training; lower eval.prompts (0: no "
                      "held-out set), add tasks, or give the held-out tasks in task.eval_path");
    d.held_out = static_cast<size_t>(c.eval.prompts);
  }
  if (!c.task.eval_path.empty() && static_cast<int64_t>(d.eval.size()) < c.eval.prompts)
    d.warnings.push_back("eval.prompts = " + std::to_string(c.eval.prompts) + " but task.eval_path has " +
                         plural(d.eval.size(), "usable task") + ": all of them are held out");
  // Held out means never trained on: the same prompt on both sides is reported.
  auto& held_source = c.task.eval_path.empty() ? d.train : d.eval;
  auto held_count = c.task.eval_path.empty() ? d.held_out : std::min<size_t>(d.eval.size(), c.eval.prompts);
  {
    std::set<std::string> held;
    for (size_t i = 0; i < held_count; ++i)
      held.insert(held_source[i].prompt);
    size_t shared = 0;
    for (size_t i = d.held_out; i < d.train.size(); ++i)
      shared += held.count(d.train[i].prompt);
    if (shared > 0)
      d.warnings.push_back(plural(shared, "training task") +
                           " repeat a held-out prompt: the held-out accuracy is not all on unseen prompts");
  }
  // The warm start's demonstrations: training tasks with a solution that fits.
  int64_t longest_prompt = 0, longest_demonstration = 0;
  for (size_t i = d.held_out; i < d.train.size(); ++i) {
    auto& item = d.train[i];
    longest_prompt = std::max(longest_prompt, prompt_lengths[i]);
    if (item.worked_solution.empty())
      continue;
    auto tokens = prompt_lengths[i] + static_cast<int64_t>(m.tokenizer->encode(item.worked_solution).size()) + 1;
    if (tokens <= context) {
      d.demonstrations.push_back(item);
      longest_demonstration = std::max(longest_demonstration, tokens);
    }
  }
  check_micro_batch_budget(c, longest_prompt + new_tokens,
                           "the training prompts (up to " + std::to_string(longest_prompt) +
                               " tokens) with rl.max_new_tokens = " + std::to_string(new_tokens));
  if (c.sft.steps > 0)
    check_micro_batch_budget(c, longest_demonstration, "the warm start's demonstrations");
  if (c.sft.steps > 0 && d.demonstrations.empty())
    throw job_error("the warm start (sft.steps = " + std::to_string(c.sft.steps) +
                    ") needs demonstrations: none of the training tasks of " + c.task.train_path +
                    " has a \"solution\" that fits the context; add solutions or set sft.steps = 0");
  auto training = d.train.size() - d.held_out;
  d.notes.insert(d.notes.begin(), "data: " + plural(training, "training task") + ", " + std::to_string(held_count) +
                                      " held out" +
                                      (c.task.eval_path.empty() ? " (the first of task.train_path)" : "") + ", " +
                                      plural(d.demonstrations.size(), "demonstration") + " for the warm start");
}

// -- the sources ------------------------------------------------------------------

std::unique_ptr<tasks::task_source> training_source(const run_config& c, const model_parts& m) {
  if (c.task.kind == "agent")
    return tasks::item_source({});  // the samples are the agents' episodes
  if (c.task.kind == "jsonl") {
    auto source = tasks::item_source(m.data->train);
    source->restore(m.data->held_out);  // the first items are held out
    return source;
  }
  return tasks::running_sum_generator(sum_options(c.task, stream_seed(c.run.seed, 1)));
}

std::unique_ptr<tasks::task_source> demonstration_source(const run_config& c, const model_parts& m) {
  if (c.task.kind == "jsonl")
    return tasks::item_source(m.data->demonstrations);
  auto o = sum_options(c.task, stream_seed(c.run.seed, 2));
  o.truncated_fraction = c.task.truncated_fraction;
  return tasks::running_sum_generator(o);
}

std::vector<tasks::task_item> held_out_items(const run_config& c, const model_parts& m) {
  std::unique_ptr<tasks::task_source> source;
  if (c.task.kind == "jsonl")
    source = tasks::item_source(c.task.eval_path.empty() ? m.data->train : m.data->eval);
  else
    source = tasks::running_sum_generator(sum_options(c.task, stream_seed(c.run.seed, 3)));
  std::vector<tasks::task_item> items;
  while (static_cast<int64_t>(items.size()) < c.eval.prompts) {
    auto item = source->next();
    if (!item)
      break;
    items.push_back(std::move(*item));
  }
  return items;
}

}  // namespace areal::job
