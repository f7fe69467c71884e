// Records with every field set to a non-default value, shared by the tests.
#pragma once

#include "areal/messages/records.hpp"

namespace areal::test {

inline generation_request sample_request() {
  generation_request x;
  x.prompt_id = 42;
  x.group_id = 7;
  x.sample_index = 3;
  x.prompt_tokens = {1, 2, 3, -4, 151935};
  x.sampling.temperature = 0.7f;
  x.sampling.top_k = 50;
  x.sampling.top_p = 0.95f;
  x.sampling.greedy = true;
  x.sampling.max_new_tokens = 1024;
  x.sampling.stop_tokens = {151643, 151645};
  x.seed = 0xdeadbeefcafeULL;
  x.admitted_version = 12;
  x.so_far = {{5, 6, 7}, {-0.25f, -1.5f, -3.0f}, {12, 12, 13}, finish_reason::unfinished};
  return x;
}

inline trajectory sample_trajectory() {
  trajectory x;
  x.prompt_id = 42;
  x.group_id = 7;
  x.sample_index = 3;
  x.prompt_tokens = {1, 2, 3};
  x.output_tokens = {10, 11, 12, 13};
  x.behaviour_logprobs = {-0.5f, -1.25f, -0.0f, -7.5f};
  x.token_versions = {4, 4, 5, 5};
  x.finish = finish_reason::length;
  x.reward = -0.5f;
  x.judged = verdict::sandbox_violation;
  x.verdict_detail = "wrote outside the work directory: Ünïcode ✓";
  x.timestamps = {1, 2, 3, 4, 5};
  x.producer = "rollout-0";
  x.prompt_version = 3;
  return x;
}

inline weight_manifest sample_manifest() {
  weight_manifest x;
  x.version = 9;
  x.tensors = {{"model.embed_tokens.weight", dtype::bf16, {16, 8}, 0},
               {"model.norm.weight", dtype::f32, {8}, 256},
               {"lm_head.weight", dtype::f16, {16, 8}, 288}};
  x.total_bytes = 544;
  x.checksum = 0x0123456789abcdefULL;
  return x;
}

inline reward_task sample_task() {
  reward_task x;
  x.kind = task_kind::code;
  x.references = {"42", "\\frac{1}{2}"};
  x.numbers = {25, 4, -3};
  x.target = 97;
  x.io_cases = {{"1 2\n", "3\n"}, {"", ""}};
  x.assertions = {"assert f(1) == 2"};
  x.test_setup = "import math";
  x.last_number_answer = true;
  x.entry_points = {"f"};
  x.case_time_s = 2.5f;
  x.total_time_s = 9.0f;
  x.partial_credit = true;
  return x;
}

inline node_hello sample_hello() {
  node_hello x;
  x.protocol_version = 1;
  x.app_id = "areal";
  x.node_name = "worker";
  x.roles = {"rollout", "reward"};
  x.host = "127.0.0.1";
  x.port = 7101;
  x.pid = 1234;
  x.hostname = "host-a";
  x.build = "areal test";
  x.wall_clock_ns = 1700000000000000000;
  return x;
}

inline run_state sample_run_state() {
  run_state x;
  x.version = 12;
  x.steps = 12;
  x.trained = 384;
  x.dropped = 40;
  x.admitted = 424;
  x.drop_reasons = {{"staler than the bound", 32}, {"rollout worker: deadline (3 attempts)", 8}};
  x.max_staleness = 2;
  x.reward_mean_first = 0.125;
  x.reward_mean_last = 0.5;
  x.source_position = 61;
  x.requeue = {55, 58, 60};
  x.dropped_positions = {7, 19};
  x.next_group = 70;
  x.generated_tokens = 9000;
  x.trained_tokens = 8100;
  x.elapsed_s = 42.5;
  x.requeue_groups = {63, 7, 69};
  auto generating = sample_trajectory();
  generating.finish = finish_reason::unfinished;
  generating.sample_index = 1;
  x.saved = {{{sample_trajectory(), sample_trajectory()}, true}, {{generating}, false}};
  return x;
}

inline node_stats sample_stats() {
  node_stats x;
  x.node_name = "head";
  x.uptime_ns = 99;
  x.peers_connected = 2;
  x.peers_lost = 1;
  x.trajectories_received = 1000;
  x.trajectories_sent = 999;
  x.bytes_received = 1 << 20;
  x.bytes_sent = 1 << 19;
  return x;
}

}  // namespace areal::test
