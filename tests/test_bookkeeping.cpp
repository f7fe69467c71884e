// The controller's CAF-free parts: the sample ledger, the prompt stream and
// the member table.
#include <doctest/doctest.h>

#include <set>
#include <stdexcept>

#include "areal/actors/member_table.hpp"
#include "areal/actors/prompt_stream.hpp"
#include "areal/actors/sample_ledger.hpp"

using namespace areal;

namespace {

std::unique_ptr<prompt_stream> make_stream(int64_t group_size, uint64_t seed = 5) {
  tasks::running_sum_options o;
  o.seed = 11;
  auto encode = [](const std::string& text) { return std::vector<int32_t>(text.begin(), text.end()); };
  return std::make_unique<prompt_stream>(tasks::running_sum_generator(o), encode, group_size, sampling_params{}, seed);
}

}  // namespace

TEST_CASE("the ledger follows a sample from admission to training and answers where it is") {
  sample_ledger ledger;
  sample_id a{3, 1};
  ledger.admit(a, 17, 2);
  CHECK(ledger.where(a)->stage == sample_stage::queued);
  CHECK(ledger.where(a)->admitted_version == 2);
  ledger.dispatched(a, "rollout-0");
  CHECK(ledger.where(a)->holder == "rollout-0");
  ledger.retry(a, "deadline");
  CHECK(ledger.where(a)->stage == sample_stage::queued);
  CHECK(ledger.where(a)->holder.empty());
  ledger.dispatched(a, "rollout-1");
  ledger.generated(a);
  ledger.scoring_at(a, "pool");
  CHECK(ledger.where(a)->stage == sample_stage::scoring);
  ledger.scored(a);
  ledger.batched(a, 4);
  CHECK(ledger.unaccounted().size() == 1);
  ledger.trained(a);
  auto e = *ledger.where(a);
  CHECK(e.stage == sample_stage::trained);
  CHECK(e.attempts == 2);
  CHECK(e.retries == 1);
  CHECK(e.step == 4);
  CHECK(e.prompt_position == 17);
  CHECK(ledger.unaccounted().empty());
  CHECK(ledger.trained_count() == 1);
  CHECK(!ledger.where({3, 2}));
}

TEST_CASE("the ledger refuses what cannot happen to a sample") {
  sample_ledger ledger;
  sample_id a{0, 0};
  CHECK_THROWS_AS(ledger.dispatched(a, "w"), std::logic_error);  // never admitted
  ledger.admit(a, 0, 0);
  CHECK_THROWS_AS(ledger.admit(a, 0, 0), std::logic_error);
  CHECK_THROWS_AS(ledger.scored(a), std::logic_error);  // not generated yet
  ledger.dispatched(a, "w");
  CHECK_THROWS_AS(ledger.dispatched(a, "w"), std::logic_error);  // two workers at once
  ledger.generated(a);
  ledger.scored(a);
  ledger.batched(a, 1);
  ledger.trained(a);
  CHECK_THROWS_AS(ledger.trained(a), std::logic_error);  // trained twice
  CHECK_THROWS_AS(ledger.dropped(a, "late"), std::logic_error);
  sample_id b{0, 1};
  ledger.admit(b, 0, 0);
  ledger.dropped(b, "why");
  CHECK_THROWS_AS(ledger.dispatched(b, "w"), std::logic_error);  // nothing after a drop
}

TEST_CASE("a dropped group drops every sample of it that is not final, with the group's reason") {
  sample_ledger ledger;
  for (uint32_t i = 0; i < 4; ++i)
    ledger.admit({9, i}, 1, 0);
  ledger.admit({10, 0}, 2, 0);
  ledger.dropped({9, 2}, "rollout worker: failed (3 attempts)");
  ledger.drop_group(9, "rollout worker: failed (3 attempts)");
  CHECK(ledger.dropped_count() == 4);
  CHECK(ledger.drop_reasons().at("rollout worker: failed (3 attempts)") == 4);
  CHECK(ledger.where({10, 0})->stage == sample_stage::queued);  // another group: untouched
  auto open = ledger.unaccounted();
  REQUIRE(open.size() == 1);
  CHECK(open.front().id == sample_id{10, 0});
  CHECK(ledger.in_flight() == 1);
}

TEST_CASE("sample seeds are distinct for every sample, whatever the group size") {
  std::set<uint64_t> seeds;
  const uint32_t group_size = 4096;  // the largest rl.group_size the configuration allows
  for (uint64_t g = 0; g < 64; ++g)
    for (uint32_t i = 0; i < group_size; ++i)
      seeds.insert(sample_seed(7, g, i));
  CHECK(seeds.size() == 64u * group_size);
  CHECK(sample_seed(7, 0, 0) != sample_seed(8, 0, 0));  // the run's seed matters
}

TEST_CASE("the prompt stream expands groups, puts failed samples first and re-queues open groups") {
  auto stream = make_stream(3);
  std::vector<stream_sample> first;
  for (int i = 0; i < 6; ++i)
    first.push_back(*stream->next());
  CHECK(first[0].request.group_id == 0);
  CHECK(first[2].request.sample_index == 2);
  CHECK(first[3].request.group_id == 1);
  CHECK(first[3].prompt_position == 1);
  CHECK(first[0].request.prompt_tokens == first[1].request.prompt_tokens);
  CHECK(first[0].request.seed != first[1].request.seed);
  CHECK(stream->open_groups() == 2);

  stream->generate_again(first[4]);
  CHECK(stream->next_is_retry());
  auto again = *stream->next();
  CHECK(again.request.group_id == 1);
  CHECK(again.admitted);
  CHECK(!stream->next_is_retry());

  CHECK(stream->close_trained(0) == 0u);
  CHECK(!stream->close_trained(0));  // once
  auto saved = stream->position();
  CHECK(saved.source_position == 2);
  CHECK(saved.requeue == std::vector<uint64_t>{1});  // group 1 is open: generated again by a resumed run

  auto resumed = make_stream(3);
  resumed->restore(saved);
  auto s = *resumed->next();
  CHECK(s.prompt_position == 1);  // the re-queued group first
  CHECK(s.request.prompt_tokens == first[3].request.prompt_tokens);
  CHECK(s.request.group_id == 1);  // under its id: its samples keep their seeds
  CHECK(s.request.seed == first[3].request.seed);
  for (int i = 0; i < 2; ++i)
    resumed->next();
  auto next = *resumed->next();
  CHECK(next.prompt_position == 2);  // then the stream where it stopped
  CHECK(next.request.group_id == saved.next_group);
  resumed->close_dropped(1);
  auto after = resumed->position();
  CHECK(after.dropped_positions == std::vector<uint64_t>{1});
  CHECK(after.requeue == std::vector<uint64_t>{2});
  CHECK(after.requeue_groups == std::vector<uint64_t>{saved.next_group});
}

TEST_CASE("a resumed stream hands out the saved work of its re-queued groups and keeps it for the next checkpoint") {
  auto stream = make_stream(3);
  std::vector<stream_sample> started;
  for (int i = 0; i < 6; ++i)
    started.push_back(*stream->next());
  stream->close_trained(0);
  auto saved = stream->position();
  REQUIRE(saved.requeue_groups == std::vector<uint64_t>{1});
  // Sample 1/0 was scored (two trajectories), 1/2 had 4 tokens; 1/1 had none.
  auto segment = [&](uint32_t index, finish_reason finish, size_t tokens) {
    trajectory t;
    t.group_id = 1;
    t.sample_index = index;
    t.prompt_tokens = started[3].request.prompt_tokens;
    t.output_tokens.assign(tokens, 7);
    t.behaviour_logprobs.assign(tokens, -0.5f);
    t.token_versions.assign(tokens, 2);
    t.finish = finish;
    t.prompt_version = 1;
    return t;
  };
  saved.saved = {{{segment(0, finish_reason::stop, 3), segment(0, finish_reason::stop, 2)}, true},
                 {{segment(2, finish_reason::unfinished, 4)}, false}};

  auto resumed = make_stream(3);
  resumed->restore(saved);
  CHECK(resumed->saved_work().size() == 2);  // held until the group starts
  auto a = *resumed->next();
  REQUIRE(a.request.group_id == 1);
  CHECK(a.scored.size() == 2);
  CHECK(a.request.admitted_version == 1);  // as old as its tokens
  auto b = *resumed->next();
  CHECK(b.scored.empty());
  CHECK(b.request.so_far.tokens.empty());
  // Still waiting to go out, 1/2 is what the next checkpoint saves of the stream.
  auto waiting = resumed->saved_work();
  REQUIRE(waiting.size() == 1);
  CHECK(waiting[0].segments[0].sample_index == 2);
  CHECK(waiting[0].segments[0].output_tokens.size() == 4);
  auto c = *resumed->next();
  CHECK(c.request.so_far.tokens == std::vector<int32_t>(4, 7));
  CHECK(c.request.so_far.versions == std::vector<int64_t>(4, 2));
  CHECK(c.request.so_far.finish == finish_reason::unfinished);
  CHECK(resumed->saved_work().empty());
  CHECK(resumed->saved_unused() == 0);

  // Saved work for another prompt (the task file changed) is not used.
  saved.saved[1].segments[0].prompt_tokens = {1, 2, 3};
  auto changed = make_stream(3);
  changed->restore(saved);
  for (int i = 0; i < 3; ++i)
    CHECK(changed->next()->request.so_far.tokens.empty());
  CHECK(changed->saved_unused() == 1);

  // Saved by a run of larger groups: the samples past this run's group size are let go, not carried from
  // checkpoint to checkpoint; the others continue.
  saved.saved[1].segments[0].prompt_tokens = started[3].request.prompt_tokens;
  saved.saved.push_back({{segment(5, finish_reason::stop, 3)}, true});
  auto smaller = make_stream(3);
  smaller->restore(saved);
  CHECK(smaller->saved_past_group() == 1);
  CHECK(smaller->saved_unused() == 0);
  CHECK(smaller->saved_work().size() == 2);
  CHECK(smaller->next()->scored.size() == 2);
  smaller->next();
  CHECK(smaller->next()->request.so_far.tokens.size() == 4);
  CHECK(smaller->saved_work().empty());
}

TEST_CASE("the member table dispatches to the least loaded and hands each request's work back once") {
  member_table<int, std::string> table;
  auto a = *table.add(10, "", "a");
  auto b = *table.add(20, "node-b", "b");
  CHECK(!table.add(10, "", "again"));  // a member joins once
  auto r1 = table.send(*table.least_loaded(), "s1");
  table.send(*table.least_loaded(), "s2");
  CHECK(table.at(a).load == 1);
  CHECK(table.at(b).load == 1);
  CHECK(!table.least_loaded(1));  // every member at its limit
  CHECK(table.take(r1) == std::string{"s1"});
  CHECK(!table.take(r1));
  CHECK(*table.least_loaded(1) == a);
  auto r3 = table.send(b, "s3");
  auto lost = table.lose([](int h) { return h == 20; });
  REQUIRE(lost);
  CHECK(lost->first.node == "node-b");
  CHECK(lost->second == std::vector<std::string>{"s2", "s3"});  // its requests, oldest first
  CHECK(!table.take(r3));                                       // the late reply of a lost member finds nothing
  CHECK(table.size() == 1);
  CHECK(!table.lose([](int h) { return h == 20; }));
}
