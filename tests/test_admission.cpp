// The controller's bookkeeping: the staleness bound and group-complete batches.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <stdexcept>

#include "areal/actors/admission.hpp"
#include "areal/actors/run_metrics.hpp"
#include "areal/actors/sample_store.hpp"

using namespace areal;

TEST_CASE("the staleness gate keeps every admitted trajectory within eta versions") {
  for (int64_t eta : {0, 1, 3}) {
    const int64_t batch = 4;
    staleness_gate gate(batch, eta, 1000);
    int64_t admitted = 0;
    std::vector<int64_t> running;  // version at admission of each running request
    for (int step = 0; step < 12; ++step) {
      // Admit everything the gate allows; each admission obeys floor((i-1)/B) <= v + eta.
      while (gate.capacity() > 0) {
        gate.admit();
        ++admitted;
        CHECK((admitted - 1) / batch <= gate.version() + eta);
        running.push_back(gate.version());
      }
      CHECK(gate.accepted() + gate.running() == (eta + gate.version() + 1) * batch);
      // One batch comes back and is trained: the version advances.
      for (int k = 0; k < batch; ++k) {
        CHECK(gate.version() - running.front() <= eta);  // staleness when trained
        running.erase(running.begin());
        gate.finish(true);
      }
      gate.set_version(gate.version() + 1);
    }
    CHECK(gate.admitted_total() == admitted);
  }
}

TEST_CASE("eta 0 admits exactly one batch per version") {
  staleness_gate gate(8, 0, 1000);
  CHECK(gate.capacity() == 8);
  gate.admit(8);
  CHECK(gate.capacity() == 0);
  for (int i = 0; i < 8; ++i)
    gate.finish(true);
  CHECK(gate.capacity() == 0);  // waits for the training step
  gate.set_version(1);
  CHECK(gate.capacity() == 8);
}

TEST_CASE("concurrency bound and dropped requests") {
  staleness_gate gate(4, 8, 3);
  CHECK(gate.capacity() == 3);
  gate.admit(3);
  CHECK(gate.capacity() == 0);
  CHECK_THROWS_AS(gate.admit(), std::logic_error);
  gate.finish(false);  // dropped: frees a slot without counting as accepted
  CHECK(gate.accepted() == 0);
  CHECK(gate.capacity() == 1);
  CHECK_THROWS_AS((gate.finish(true), gate.finish(true), gate.finish(true)), std::logic_error);
}

TEST_CASE("a limit on the total admits no more than it, and what is discarded or fails is replaced") {
  staleness_gate gate(4, 8, 1000);  // eta alone would admit (8 + 0 + 1) 4 = 36
  gate.limit_total(10);
  CHECK(gate.capacity() == 10);
  gate.admit(10);
  CHECK(gate.capacity() == 0);
  CHECK(gate.at_total_limit());
  for (int i = 0; i < 10; ++i)
    gate.finish(true);
  CHECK(gate.capacity() == 0);
  gate.discard(4);  // a dropped group: its samples are generated anew
  CHECK(gate.capacity() == 4);
  CHECK_FALSE(gate.at_total_limit());
  gate.admit(4);
  gate.finish(false);  // a failed request is replaced too
  CHECK(gate.capacity() == 1);
}

TEST_CASE("with weights on other nodes, admission counts from the version delivered to the rollout workers") {
  staleness_gate gate(4, 1, 100);
  gate.follow_deliveries();
  gate.admit(8);  // (eta + 0 + 1) 4
  for (int i = 0; i < 4; ++i)
    gate.finish(true);
  gate.set_version(1);  // the trainer made version 1; its weights are on their way
  CHECK(gate.version() == 1);
  CHECK(gate.admission_version() == 0);
  CHECK(gate.capacity() == 0);  // a request now would generate with version 0 and be trained after version 2
  gate.delivered(1);
  CHECK(gate.admission_version() == 1);
  CHECK(gate.capacity() == 4);
  gate.delivered(0);  // a late report of an older version takes nothing back
  CHECK(gate.capacity() == 4);
  gate.delivered(3);  // a subscriber that caught up past the trainer's version counts only up to it
  CHECK(gate.admission_version() == 1);
  CHECK(gate.capacity() == 4);

  staleness_gate local(4, 1, 100);  // weights in the same process reach the workers with the step
  local.admit(8);
  for (int i = 0; i < 4; ++i)
    local.finish(true);
  local.set_version(1);
  CHECK(local.capacity() == 4);
}

TEST_CASE("work sent to a rollout node counts from the version that node reported, the settled one at least") {
  staleness_gate gate(4, 1, 100);
  gate.follow_deliveries();
  gate.admit(8, "gen-a");  // (eta + 0 + 1) 4
  for (int i = 0; i < 8; ++i)
    gate.finish(true);
  gate.set_version(2);
  CHECK(gate.capacity() == 0);
  CHECK(gate.capacity("gen-a") == 0);
  gate.delivered_to("gen-a", 2);  // gen-a holds version 2; the publication has not settled (gen-b fetches)
  CHECK(gate.admission_version("gen-a") == 2);
  CHECK(gate.capacity("gen-a") == 8);  // (1 + 2 + 1) 4 - 8
  CHECK(gate.capacity("gen-b") == 0);
  CHECK(gate.capacity("") == 0);  // a member of this process: the settled version
  CHECK(gate.capacity() == 0);
  gate.delivered_to("gen-a", 1);  // an older report takes nothing back
  CHECK(gate.capacity("gen-a") == 8);
  gate.delivered(1);  // version 1 settled: the floor for every node
  CHECK(gate.capacity("gen-b") == 4);
  CHECK(gate.capacity("gen-a") == 8);
  gate.delivered_to("gen-b", 5);  // ahead of the trainer: counts only up to its version
  CHECK(gate.admission_version("gen-b") == 2);
  gate.admit(8, "gen-a");
  CHECK(gate.capacity("gen-b") == 0);
  CHECK_THROWS_AS(gate.admit(1, "gen-b"), std::logic_error);
  gate.restore(3);  // a resume: every node reports again
  CHECK(gate.admission_version("gen-a") == 3);
  CHECK(gate.capacity("gen-a") == gate.capacity());

  staleness_gate local(4, 1, 100);  // without following deliveries a node's report changes nothing
  local.set_version(1);
  local.delivered_to("gen-a", 0);
  CHECK(local.capacity("gen-a") == local.capacity());
  CHECK(local.admission_version("gen-a") == 1);
}

TEST_CASE("restoring after a resume resets the counters to the version") {
  staleness_gate gate(4, 1, 100);
  gate.restore(5);
  CHECK(gate.accepted() == 20);
  CHECK(gate.running() == 0);
  CHECK(gate.capacity() == 8);  // (eta + v + 1) B - accepted = (1 + 5 + 1) 4 - 20
}

namespace {
// The summary the sample store gives of a trajectory (its slot: group * 10 + index).
sample_summary sample(uint64_t group, uint32_t index) {
  trajectory t;
  t.group_id = group;
  t.sample_index = index;
  return summarize(t, group * 10 + index);
}
}  // namespace

TEST_CASE("a summary keeps ids, verdict, lengths and every token's version, run-length encoded") {
  trajectory t;
  t.group_id = 4;
  t.sample_index = 2;
  t.output_tokens = {5, 6, 7, 8, 9};
  t.token_versions = {3, 3, 4, 4, 4};
  t.reward = 0.5f;
  t.judged = verdict::correct;
  t.finish = finish_reason::length;
  t.producer = "rollout-1";
  auto s = summarize(t, 17);
  CHECK(s.slot == 17);
  CHECK(s.group_id == 4);
  CHECK(s.sample_index == 2);
  CHECK(s.output_tokens == 5);
  CHECK(s.version_runs == std::vector<int64_t>{3, 2, 4, 3});
  CHECK(oldest_version(s, 99) == 3);
  CHECK(s.reward == 0.5f);
  CHECK(static_cast<verdict>(s.judged) == verdict::correct);
  CHECK(static_cast<finish_reason>(s.finish) == finish_reason::length);
  CHECK(s.producer == "rollout-1");
  auto facts = describe_batch({s}, 5);
  CHECK(facts.staleness_token_histogram == std::vector<int64_t>{0, 3, 2});  // 3 tokens 1 behind, 2 tokens 2 behind
  CHECK(facts.staleness_trajectory_max == 2);
}

TEST_CASE("a group enters a batch only when complete, oldest groups first") {
  group_buffer buffer(3);
  buffer.add(sample(1, 0));
  buffer.add(sample(2, 0));
  buffer.add(sample(1, 1));
  CHECK(buffer.ready_trajectories() == 0);
  CHECK_FALSE(buffer.take_batch(3));
  buffer.add(sample(1, 2));
  CHECK(buffer.ready_trajectories() == 3);
  buffer.add(sample(2, 1));
  buffer.add(sample(2, 2));
  auto batch = buffer.take_batch(3);
  REQUIRE(batch);
  REQUIRE(batch->size() == 3);
  for (auto& t : *batch)
    CHECK(t.group_id == 1);
  CHECK(buffer.ready_trajectories() == 3);
  CHECK(buffer.take_batch(6) == std::nullopt);  // only whole groups, only when enough
}

TEST_CASE("a dropped sample drops its whole group with the reason counted") {
  group_buffer buffer(2);
  buffer.add(sample(7, 0));
  buffer.drop_sample(7, "rollout worker lost");
  buffer.drop_sample(8, "rollout worker lost");
  buffer.drop_sample(8, "rollout worker lost");
  CHECK(buffer.ready_trajectories() == 0);
  CHECK(buffer.pending_groups() == 0);
  CHECK(buffer.dropped().at("rollout worker lost") == 4);
  // The delivered member's trajectory is named, so that the store forgets it.
  auto closed = buffer.take_dropped_groups();
  REQUIRE(closed.size() == 2);
  CHECK(closed[0].slots == std::vector<uint64_t>{70});
  CHECK(closed[1].slots.empty());
}

namespace {
sample_summary with_versions(uint64_t group, uint32_t index, std::vector<int64_t> versions) {
  trajectory t;
  t.group_id = group;
  t.sample_index = index;
  t.output_tokens.assign(versions.size(), 1);
  t.behaviour_logprobs.assign(versions.size(), 0.0f);
  t.token_versions = std::move(versions);
  return summarize(t, group * 10 + index);
}
}  // namespace

TEST_CASE("groups older than the bound are dropped when a batch is formed") {
  group_buffer buffer(2);
  buffer.add(with_versions(1, 0, {3, 4}));
  buffer.add(with_versions(1, 1, {5}));  // one token of version 3: stale at min_version 4
  buffer.add(with_versions(2, 0, {4, 5}));
  buffer.add(with_versions(2, 1, {4}));
  int64_t stale = 0;
  auto batch = buffer.take_batch(2, 4, &stale);
  REQUIRE(batch);
  CHECK((*batch)[0].group_id == 2);
  CHECK(stale == 2);
  CHECK(buffer.dropped().at("staler than the bound") == 2);
  // The gate forgets discarded trajectories, so admission can replace them.
  staleness_gate gate(2, 1, 100);
  gate.admit(4);
  for (int i = 0; i < 4; ++i)
    gate.finish(true);
  CHECK(gate.capacity() == 0);
  gate.discard(stale);
  CHECK(gate.capacity() == 2);
}

TEST_CASE("a batch takes the groups with the oldest tokens first, so that a group completed late is trained before "
          "the bound passes it") {
  // Group 1 (tokens of version 4) completes after groups 2 and 3 (version 5). Taken in completion order,
  // the first batch would be group 2 and group 1 would be dropped once the bound reached 5.
  group_buffer buffer(2);
  buffer.add(with_versions(2, 0, {5}));
  buffer.add(with_versions(2, 1, {5, 6}));
  buffer.add(with_versions(3, 0, {5}));
  buffer.add(with_versions(3, 1, {6}));
  buffer.add(with_versions(1, 0, {4, 5}));
  buffer.add(with_versions(1, 1, {5}));
  auto first = buffer.take_batch(2, 4);
  REQUIRE(first);
  CHECK((*first)[0].group_id == 1);
  // Equally old groups in the order they completed.
  auto second = buffer.take_batch(2, 5);
  REQUIRE(second);
  CHECK((*second)[0].group_id == 2);
  auto third = buffer.take_batch(2, 5);
  REQUIRE(third);
  CHECK((*third)[0].group_id == 3);
  CHECK(buffer.dropped().empty());
}

TEST_CASE("a step's metrics line is written at once and made durable when the controller syncs") {
  auto path = std::filesystem::temp_directory_path() / ("areal-metrics-" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(path);
  {
    run_metrics metrics(path.string(), nullptr, 0.0, false);
    auto before = metrics.bytes();
    metrics.step(batch_facts{}, train_report{}, step_counters{});
    CHECK(metrics.bytes() > before);  // the line is in the file
    CHECK_FALSE(metrics.durable());   // not yet synced: the next step is dispatched first
    metrics.sync();
    CHECK(metrics.durable());
    CHECK(metrics.failure().empty());
    metrics.step(batch_facts{}, train_report{}, step_counters{});
    metrics.end("done", step_counters{}, {}, {});  // the run's last line syncs every line
    CHECK(metrics.durable());
  }
  std::filesystem::remove(path);
}
