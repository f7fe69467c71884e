#include "areal/messages/records.hpp"

#include <tuple>

namespace areal {

bool sampling_params::operator==(const sampling_params& o) const {
  return std::tie(temperature, top_k, top_p, greedy, max_new_tokens, stop_tokens) ==
         std::tie(o.temperature, o.top_k, o.top_p, o.greedy, o.max_new_tokens, o.stop_tokens);
}

bool output_so_far::operator==(const output_so_far& o) const {
  return std::tie(tokens, logprobs, versions, finish) == std::tie(o.tokens, o.logprobs, o.versions, o.finish);
}

bool generation_request::operator==(const generation_request& o) const {
  return std::tie(prompt_id, group_id, sample_index, prompt_tokens, sampling, seed, admitted_version, so_far) ==
         std::tie(o.prompt_id, o.group_id, o.sample_index, o.prompt_tokens, o.sampling, o.seed, o.admitted_version,
                  o.so_far);
}

bool trajectory_timestamps::operator==(const trajectory_timestamps& o) const {
  return std::tie(admitted_ns, generation_start_ns, generation_end_ns, scored_ns, scoring_start_ns) ==
         std::tie(o.admitted_ns, o.generation_start_ns, o.generation_end_ns, o.scored_ns, o.scoring_start_ns);
}

bool trajectory::operator==(const trajectory& o) const {
  return std::tie(prompt_id, group_id, sample_index, prompt_tokens, output_tokens, behaviour_logprobs, token_versions,
                  finish, reward, judged, verdict_detail, timestamps, producer,
                  prompt_version, loss_mask) == std::tie(o.prompt_id, o.group_id, o.sample_index, o.prompt_tokens,
                                                         o.output_tokens, o.behaviour_logprobs, o.token_versions,
                                                         o.finish, o.reward, o.judged, o.verdict_detail, o.timestamps,
                                                         o.producer, o.prompt_version, o.loss_mask);
}

int64_t trajectory::generated_tokens() const {
  if (loss_mask.empty())
    return static_cast<int64_t>(output_tokens.size());
  int64_t n = 0;
  for (auto m : loss_mask)
    n += m != 0;
  return n;
}

bool run_state::operator==(const run_state& o) const {
  return std::tie(version, steps, admitted, trained, dropped, drop_reasons, max_staleness, reward_mean_first,
                  reward_mean_last, source_position, requeue, dropped_positions, next_group, generated_tokens,
                  trained_tokens, elapsed_s, metrics_bytes, requeue_groups, saved) ==
         std::tie(o.version, o.steps, o.admitted, o.trained, o.dropped, o.drop_reasons, o.max_staleness,
                  o.reward_mean_first, o.reward_mean_last, o.source_position, o.requeue, o.dropped_positions,
                  o.next_group, o.generated_tokens, o.trained_tokens, o.elapsed_s, o.metrics_bytes, o.requeue_groups,
                  o.saved);
}

bool saved_sample::operator==(const saved_sample& o) const {
  return std::tie(segments, scored) == std::tie(o.segments, o.scored);
}

bool tensor_entry::operator==(const tensor_entry& o) const {
  return std::tie(name, type, shape, offset) == std::tie(o.name, o.type, o.shape, o.offset);
}

uint64_t tensor_entry::byte_size() const {
  uint64_t n = element_size(type);
  for (auto d : shape)
    n *= static_cast<uint64_t>(d);
  return n;
}

bool weight_manifest::operator==(const weight_manifest& o) const {
  return std::tie(version, tensors, total_bytes, checksum, chunk_bytes) ==
         std::tie(o.version, o.tensors, o.total_bytes, o.checksum, o.chunk_bytes);
}

uint64_t weight_manifest::chunk_count() const {
  if (total_bytes == 0)
    return 0;
  return chunk_bytes == 0 ? 1 : (total_bytes + chunk_bytes - 1) / chunk_bytes;
}

bool io_case_record::operator==(const io_case_record& o) const {
  return input == o.input && expected_output == o.expected_output;
}

bool reward_task::operator==(const reward_task& o) const {
  return std::tie(kind, references, last_number_answer, numbers, target, io_cases, assertions, test_setup, entry_points,
                  case_time_s, total_time_s, partial_credit) ==
         std::tie(o.kind, o.references, o.last_number_answer, o.numbers, o.target, o.io_cases, o.assertions,
                  o.test_setup, o.entry_points, o.case_time_s, o.total_time_s, o.partial_credit);
}

const char* to_string(task_kind x) {
  switch (x) {
    case task_kind::math:
      return "math";
    case task_kind::countdown:
      return "countdown";
    case task_kind::code:
      return "code";
  }
  return "unknown";
}

bool node_hello::operator==(const node_hello& o) const {
  return std::tie(protocol_version, app_id, node_name, roles, host, port, pid, hostname, build, wall_clock_ns) ==
         std::tie(o.protocol_version, o.app_id, o.node_name, o.roles, o.host, o.port, o.pid, o.hostname, o.build,
                  o.wall_clock_ns);
}

bool node_stats::operator==(const node_stats& o) const {
  return std::tie(node_name, uptime_ns, peers_connected, peers_lost, trajectories_received, trajectories_sent,
                  bytes_received, bytes_sent) == std::tie(o.node_name, o.uptime_ns, o.peers_connected, o.peers_lost,
                                                          o.trajectories_received, o.trajectories_sent,
                                                          o.bytes_received, o.bytes_sent);
}

const char* to_string(finish_reason x) {
  switch (x) {
    case finish_reason::unfinished:
      return "unfinished";
    case finish_reason::stop:
      return "stop";
    case finish_reason::length:
      return "length";
    case finish_reason::aborted:
      return "aborted";
  }
  return "unknown";
}

const char* to_string(verdict x) {
  switch (x) {
    case verdict::unscored:
      return "unscored";
    case verdict::correct:
      return "correct";
    case verdict::wrong:
      return "wrong";
    case verdict::no_answer:
      return "no_answer";
    case verdict::timeout:
      return "timeout";
    case verdict::error:
      return "error";
    case verdict::sandbox_violation:
      return "sandbox_violation";
  }
  return "unknown";
}

const char* to_string(dtype x) {
  switch (x) {
    case dtype::f32:
      return "F32";
    case dtype::bf16:
      return "BF16";
    case dtype::f16:
      return "F16";
    case dtype::i64:
      return "I64";
    case dtype::i32:
      return "I32";
    case dtype::u8:
      return "U8";
  }
  return "unknown";
}

size_t element_size(dtype x) {
  switch (x) {
    case dtype::f32:
      return 4;
    case dtype::bf16:
      return 2;
    case dtype::f16:
      return 2;
    case dtype::i64:
      return 8;
    case dtype::i32:
      return 4;
    case dtype::u8:
      return 1;
  }
  return 0;
}

}  // namespace areal
