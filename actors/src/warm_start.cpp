// The job's supervised warm start and its progress line (see job_parts.hpp).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "areal/kernels/trainer.hpp"
#include "areal/runtime/log.hpp"
#include "job_parts.hpp"

namespace areal::job {

// -- the progress line --------------------------------------------------------

std::string duration_text(double seconds) {
  auto s = static_cast<int64_t>(seconds + 0.5);
  std::ostringstream os;
  if (s >= 3600)
    os << s / 3600 << "h" << (s % 3600) / 60 << "m";
  else if (s >= 60)
    os << s / 60 << "m" << s % 60 << "s";
  else
    os << s << "s";
  return os.str();
}

progress_line::progress_line(bool enabled) : enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0) {}

void progress_line::show(const std::string& text) {
  if (!enabled_)
    return;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    std::fflush(stderr);
    open_ = true;
  } else if (seconds_since(last_) >= 10) {  // a log, not a terminal: one line now and then
    std::fprintf(stderr, "%s\n", text.c_str());
    last_ = clock_type::now();
  }
}

void progress_line::close() {
  if (open_)
    std::fprintf(stderr, "\n");
  open_ = false;
}

// The progress line: the step, samples/s since the start, the last reward, the staleness and the ETA.
std::string progress_text(const controller_stats& s, int64_t total_steps, const progress_origin& origin) {
  auto elapsed = seconds_since(origin.at);
  auto done_steps = s.steps - origin.steps;
  auto rate = done_steps > 0 ? elapsed / static_cast<double>(done_steps) : 0.0;
  std::ostringstream os;
  os.precision(3);
  os << "RL step " << s.steps << "/" << total_steps << " | "
     << static_cast<double>(s.trained - origin.trained) / std::max(elapsed, 1e-9) << " samples/s | reward "
     << s.reward_mean_last << " | staleness <= " << s.max_staleness << " | ETA "
     << (done_steps > 0 ? duration_text(rate * static_cast<double>(total_steps - s.steps)) : "?");
  return os.str();
}

// -- supervised warm start ----------------------------------------------------

bool warm_start(const run_config& c, model_parts& m, int threads, const node_spec& self, const std::atomic<bool>& stop,
                progress_line& progress, const std::vector<kernels::sft_sample>& transcripts) {
  kernels::trainer_config tc;
  tc.optimizer.lr = c.sft.lr;
  tc.optimizer.warmup_steps = c.sft.warmup_steps;
  tc.optimizer.schedule = "cosine";
  tc.optimizer.total_steps = c.sft.steps;
  tc.optimizer.min_lr_ratio = 0.1;
  tc.seed = stream_seed(c.run.seed, 5);
  // A replica per core, as the RL trainer runs: on these small products one thread per core
  // beats intra-op threads, and OpenBLAS's threaded products wait for each other in sched_yield.
  tc.data_parallel = threads;
  tc.replica_devices = replica_devices(node_devices(c, self));
  kernels::trainer sft(*m.policy, tc);
  // Chat transcripts (an agent run's) in their order, again and again; else the task's demonstrations.
  auto source = transcripts.empty() ? demonstration_source(c, m) : nullptr;
  size_t next_transcript = 0;
  auto start = clock_type::now();
  double loss = 0;
  for (int64_t step = 0; step < c.sft.steps; ++step) {
    if (stop.load())
      return false;
    std::vector<kernels::sft_sample> batch;
    while (static_cast<int64_t>(batch.size()) < c.sft.batch_size) {
      if (!source) {
        batch.push_back(transcripts[next_transcript++ % transcripts.size()]);
        continue;
      }
      auto item = source->next();
      if (!item) {
        // A finite dataset: another epoch (check_inputs made sure it holds a demonstration).
        if (source->position() == 0)
          throw job_error("the warm start has no demonstration to train on");
        source->restore(0);
        continue;
      }
      kernels::sft_sample s;
      s.prompt = m.tokenizer->encode(item->prompt);
      s.response = m.tokenizer->encode(item->worked_solution);
      s.response.push_back(m.eos);
      batch.push_back(std::move(s));
    }
    loss = sft.sft_update(batch).loss;
    auto elapsed = seconds_since(start);
    progress.show("warm start (SFT) step " + std::to_string(step + 1) + "/" + std::to_string(c.sft.steps) + " | loss " +
                  std::to_string(loss).substr(0, 6) + " | ETA " +
                  duration_text(elapsed / static_cast<double>(step + 1) * static_cast<double>(c.sft.steps - step - 1)));
  }
  progress.close();
  spdlog::info("warm start: {} SFT steps in {:.1f} s, final loss {:.4f}", c.sft.steps, seconds_since(start), loss);
  m.policy->set_trainable(false);
  return true;
}

}  // namespace areal::job
