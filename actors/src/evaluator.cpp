// The evaluator actor: greedy decoding of the held-out prompts with the weights it is given (see evaluator.hpp).
#include "areal/actors/evaluator.hpp"
#include "areal/actors/exception_guard.hpp"
#include "areal/kernels/compute_threads.hpp"

#include <ATen/Parallel.h>

#include <caf/all.hpp>

#include "areal/kernels/engine.hpp"

namespace areal {

eval_result evaluate_policy(kernels::policy_model& model, const kernels::tokenizer& tokenizer, const eval_set& set,
                            const eval_options& options) {
  kernels::generation_engine engine(model, {options.slots, options.max_seq_len, 1024});
  for (size_t i = 0; i < set.prompts.size(); ++i) {
    kernels::generation_job job;
    job.id = i;
    job.prompt = set.prompts[i];
    job.sampling.greedy = true;
    job.sampling.max_new_tokens = static_cast<uint32_t>(options.max_new_tokens);
    job.sampling.stop_tokens = options.stop_tokens;
    engine.submit(std::move(job));
  }
  eval_result result;
  int64_t correct = 0, tokens = 0;
  std::vector<kernels::generation_output> outputs;
  while (!engine.idle()) {
    if (options.stop && options.stop->load()) {
      result.stopped = true;
      return result;
    }
    for (auto& out : engine.step())
      outputs.push_back(std::move(out));
  }
  for (auto& out : outputs) {
    auto verdict_of = reward::score_response(tokenizer.decode(out.tokens, true), set.tasks[out.id], options.scoring);
    bool ok = verdict_of.judged == verdict::correct;
    correct += ok;
    tokens += static_cast<int64_t>(out.tokens.size());
    if (out.id < set.difficulty.size()) {
      auto& bucket = result.by_difficulty[set.difficulty[out.id]];
      bucket.first += ok;
      bucket.second += 1;
    }
  }
  auto n = static_cast<double>(std::max<size_t>(1, set.prompts.size()));
  result.accuracy = static_cast<double>(correct) / n;
  result.mean_tokens = static_cast<double>(tokens) / n;
  return result;
}

namespace {

struct evaluator_state {
  static inline const char* name = "areal.evaluator";
  evaluator_setup setup;
  std::unique_ptr<kernels::policy_model> model;
  bool busy = false;
};

}  // namespace

evaluator_actor spawn_evaluator(caf::actor_system& sys, evaluator_setup setup) {
  return sys.spawn<caf::detached>(
      [setup = std::move(setup)](
          evaluator_actor::stateful_pointer<evaluator_state> self) mutable -> evaluator_actor::behavior_type {
        guard_exceptions(self, "evaluator");
        self->state.setup = std::move(setup);
        self->state.model =
            std::make_unique<kernels::policy_model>(self->state.setup.model, self->state.setup.model_options);
        return {
            [self](eval_atom, local_weights& w) -> caf::result<int64_t, double, double> {
              auto& st = self->state;
              if (!w.flat)
                return caf::make_error(caf::sec::invalid_argument, "evaluator: no weights");
              auto& share = st.setup.share;
              if (share)
                share->set_busy(st.busy, true);
              // Beside the pipeline, on one thread: an evaluation is long, and a
              // team of spinning workers must not share the others' cores
              // (compute_share.hpp; the demo's two evaluations on a team of
              // two spun 4.8 s of CPU away).
              kernels::set_compute_threads(share ? 1 : st.setup.compute_threads);
              eval_result r;
              {
                tracer::scope span{st.setup.trace.get(), "evaluator", "evaluate"};
                st.model->flat().copy_(*w.flat);
                r = evaluate_policy(*st.model, *st.setup.tokenizer, *st.setup.set, st.setup.options);
              }
              if (share)
                share->set_busy(st.busy, false);
              return caf::result<int64_t, double, double>(w.version, r.accuracy, r.mean_tokens);
            },
        };
      });
}

}  // namespace areal
