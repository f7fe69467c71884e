// Wire format: every record round-trips; records that break their rules and
// bytes that are not a valid message are refused with an error, never a crash.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include <caf/sec.hpp>

#include "areal/messages/codec.hpp"
#include "areal/messages/packed.hpp"
#include "sample_records.hpp"

using namespace areal;

namespace {

template <class T>
void check_round_trip(const T& original) {
  auto bytes = encode(original);
  REQUIRE_MESSAGE(bytes, describe(bytes.error()));
  CHECK(bytes->size() % 8 == 0);
  auto back = decode<T>(*bytes);
  REQUIRE_MESSAGE(back, describe(back.error()));
  CHECK(*back == original);
  // Through the CAF carrier too.
  auto carried = pack(original);
  REQUIRE(carried);
  auto unpacked = unpack(*carried);
  REQUIRE(unpacked);
  CHECK(*unpacked == original);
}

// Byte offset of the first data word of the root struct in a single-segment
// message: 8 bytes of segment table, then the 8-byte root pointer.
constexpr size_t root_data_offset = 16;

}  // namespace

TEST_CASE("every record type round-trips through its Cap'n Proto bytes") {
  check_round_trip(test::sample_request());
  check_round_trip(test::sample_trajectory());
  check_round_trip(test::sample_manifest());
  check_round_trip(test::sample_task());
  check_round_trip(test::sample_hello());
  check_round_trip(test::sample_stats());
  check_round_trip(test::sample_run_state());
  check_round_trip(generation_request{});  // defaults survive too
  check_round_trip(trajectory{});
}

TEST_CASE("a trajectory whose per-token lists disagree is refused when encoding") {
  auto t = test::sample_trajectory();
  t.token_versions.pop_back();
  auto bytes = encode(t);
  REQUIRE_FALSE(bytes);
  CHECK(bytes.error().category() == caf::atom("wire"));
  CHECK(describe(bytes.error()).find("4 output tokens but 4 log-probabilities and 3 versions") != std::string::npos);
}

TEST_CASE("a record written under another schema version is refused naming both versions") {
  auto bytes = *encode(test::sample_trajectory());
  REQUIRE(static_cast<uint8_t>(bytes[root_data_offset]) == schema_version);
  bytes[root_data_offset] = 7;
  auto back = decode<trajectory>(bytes);
  REQUIRE_FALSE(back);
  auto text = describe(back.error());
  CHECK(text.find("schema_mismatch") != std::string::npos);
  CHECK(text.find("schema version 7") != std::string::npos);
  CHECK(text.find("reads version 1") != std::string::npos);
}

TEST_CASE("weight manifests are checked for consistency") {
  auto m = test::sample_manifest();
  CHECK_FALSE(validate(m));
  SUBCASE("tensor beyond the buffer") {
    m.total_bytes = 500;
    CHECK(describe(validate(m)).find("lm_head.weight") != std::string::npos);
  }
  SUBCASE("overlapping tensors") {
    m.tensors[1].offset = 200;
    CHECK(describe(validate(m)).find("overlap") != std::string::npos);
  }
  SUBCASE("duplicate names") {
    m.tensors[2].name = m.tensors[0].name;
    CHECK(describe(validate(m)).find("appears twice") != std::string::npos);
  }
  SUBCASE("negative dimension") {
    m.tensors[0].shape = {-1, 8};
    CHECK(describe(validate(m)).find("negative") != std::string::npos);
  }
  SUBCASE("refused by the encoder as well") {
    m.tensors[0].shape = {1 << 20, 1 << 20};
    CHECK_FALSE(encode(m));
  }
  CHECK(m.tensors[0].byte_size() == element_size(m.tensors[0].type) * m.tensors[0].shape[0] * m.tensors[0].shape[1]);
}

TEST_CASE("a manifest whose offsets were altered on the wire is refused when decoding") {
  auto bytes = *encode(test::sample_manifest());
  // Overwrite totalBytes, data word 2 of WeightManifest (word 0: schemaVersion, word 1: version),
  // so that the tensors lie outside the buffer.
  uint64_t small = 100;
  std::memcpy(bytes.data() + root_data_offset + 16, &small, sizeof(small));
  auto back = decode<weight_manifest>(bytes);
  REQUIRE_FALSE(back);
  CHECK(describe(back.error()).find("outside") != std::string::npos);
}

TEST_CASE("decoding refuses partial words and empty input and trailing bytes") {
  auto bytes = *encode(test::sample_hello());
  CHECK_FALSE(decode<node_hello>(bytes.data(), bytes.size() - 1));
  CHECK_FALSE(decode<node_hello>(bytes.data(), 0));
  auto longer = bytes;
  longer.resize(bytes.size() + 8, 0);
  auto back = decode<node_hello>(longer);
  REQUIRE_FALSE(back);
  CHECK(describe(back.error()).find("trailing") != std::string::npos);
}

TEST_CASE("a reward task with impossible time limits is refused") {
  auto t = test::sample_task();
  t.case_time_s = -1;
  auto back = decode<reward_task>(*encode(t));
  REQUIRE_FALSE(back);
  CHECK(describe(back.error()).find("time limits") != std::string::npos);
}

TEST_CASE("checksum is XXH64 and sensitive to every byte") {
  std::string a = "areal";
  CHECK(checksum(a.data(), a.size()) == checksum(a.data(), a.size()));
  std::string b = "areaL";
  CHECK(checksum(a.data(), a.size()) != checksum(b.data(), b.size()));
}

TEST_CASE("a run checkpoint with impossible counters is refused") {
  auto x = test::sample_run_state();
  x.admitted = x.trained + x.dropped + 1;  // a sample neither trained nor dropped
  auto back = decode<run_state>(*encode(x));
  REQUIRE(!back);
  CHECK(describe(back.error()).find("impossible counters") != std::string::npos);
  x = test::sample_run_state();
  x.version = -1;
  CHECK(!decode<run_state>(*encode(x)));
}

// Found by fuzzing (tests/fuzz/corpus/record_*/regression_*).
TEST_CASE("text holding NUL bytes round-trips whole") {
  auto t = test::sample_trajectory();
  t.producer = std::string("\0\0rollout-a", 12);
  t.verdict_detail = std::string("answer \0 42", 11);
  check_round_trip(t);
  auto task = test::sample_task();
  task.io_cases.push_back({std::string("in\0put", 6), std::string("\0", 1)});
  check_round_trip(task);
}

TEST_CASE("a trajectory with a log-probability or reward that is not a number is refused") {
  auto t = test::sample_trajectory();
  t.behaviour_logprobs[2] = std::nanf("");
  auto back = decode<trajectory>(*encode(t));
  REQUIRE_FALSE(back);
  CHECK(describe(back.error()).find("log-probability of output token 2") != std::string::npos);
  t = test::sample_trajectory();
  t.reward = INFINITY;
  CHECK_FALSE(decode<trajectory>(*encode(t)));
}

TEST_CASE("a run checkpoint whose counters overflow or whose reward means are not numbers is refused") {
  auto x = test::sample_run_state();
  x.trained = INT64_MAX;
  x.dropped = 2;
  x.admitted = INT64_MIN + 1;  // what trained + dropped wraps to
  auto back = decode<run_state>(*encode(x));
  REQUIRE_FALSE(back);
  CHECK(describe(back.error()).find("impossible counters") != std::string::npos);
  x = test::sample_run_state();
  x.reward_mean_first = std::nan("");
  back = decode<run_state>(*encode(x));
  REQUIRE_FALSE(back);
  CHECK(describe(back.error()).find("reward means") != std::string::npos);
}

TEST_CASE("a checkpoint's saved work is refused when it cannot be continued") {
  auto x = test::sample_run_state();
  x.saved[1].segments[0].group_id = 99;  // of no re-queued group
  auto back = decode<run_state>(*encode(x));
  REQUIRE_FALSE(back);
  CHECK(describe(back.error()).find("of no re-queued group") != std::string::npos);
  x = test::sample_run_state();
  x.saved[0].segments[1].sample_index = 0;  // one sample's trajectories name two samples
  back = decode<run_state>(*encode(x));
  REQUIRE_FALSE(back);
  CHECK(describe(back.error()).find("name different samples") != std::string::npos);
  x = test::sample_run_state();
  x.requeue_groups.pop_back();  // ids that do not match the re-queued groups
  CHECK_FALSE(encode(x));

  auto r = test::sample_request();
  r.so_far.versions.pop_back();
  back = decode<run_state>(*encode(test::sample_run_state()));
  CHECK(back);
  auto request = decode<generation_request>(*encode(r));
  REQUIRE_FALSE(request);
  CHECK(describe(request.error()).find("3 tokens so far but 3 log-probabilities and 2 versions") != std::string::npos);
  r = test::sample_request();
  r.sampling.max_new_tokens = 3;  // as many tokens as it may have, unfinished
  CHECK_FALSE(decode<generation_request>(*encode(r)));
  r.so_far.finish = finish_reason::length;  // finished: only its scoring is left
  CHECK(decode<generation_request>(*encode(r)));
  r.so_far.finish = finish_reason::aborted;
  CHECK_FALSE(decode<generation_request>(*encode(r)));
}

TEST_CASE("an error is described by its text, with the kind of error only where the text needs it") {
  // A failure of ours, carried as one of CAF's system errors with its text, reads as written.
  CHECK(describe(caf::make_error(caf::sec::runtime_error, "trainer: a sequence of 34 tokens exceeds 33")) ==
        "trainer: a sequence of 34 tokens exceeds 33");
  CHECK(describe(caf::make_error(caf::sec::invalid_argument, "no chunk 7")) == "no chunk 7");
  // CAF's own errors keep their name; the wire's say what was wrong with the bytes.
  CHECK(describe(caf::make_error(caf::sec::request_timeout)) == "system: request_timeout");
  CHECK(describe(caf::make_error(wire_errc::malformed, "3 bytes")) == "wire malformed: 3 bytes");
  CHECK(describe(caf::error{}) == "no error");
}
