// Record <-> Cap'n Proto conversion. Every decode runs inside one try block:
// Cap'n Proto reports malformed input by throwing kj::Exception, which becomes
// wire_errc::malformed; semantic checks afterwards give wire_errc::invalid_record.
#include "areal/messages/codec.hpp"
#include "codec_detail.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <xxhash.h>
#include <caf/sec.hpp>

#include "common.capnp.h"
#include "control.capnp.h"
#include "generation.capnp.h"
#include "reward.capnp.h"
#include "trajectory.capnp.h"
#include "weights.capnp.h"

static_assert(areal::schema_version == areal::wire::SCHEMA_VERSION,
              "records.hpp and common.capnp disagree on the schema version");

namespace areal {

const char* to_string(wire_errc x) {
  switch (x) {
    case wire_errc::malformed:
      return "malformed";
    case wire_errc::schema_mismatch:
      return "schema_mismatch";
    case wire_errc::invalid_record:
      return "invalid_record";
    case wire_errc::too_large:
      return "too_large";
  }
  return "unknown";
}

std::string describe(const caf::error& err) {
  if (!err)
    return "no error";
  auto& ctx = err.context();
  auto category = caf::to_string(err.category());
  if (ctx.size() == 1 && ctx.match_element<std::string>(0)) {
    auto& detail = ctx.get_as<std::string>(0);
    if (err.category() == caf::atom("wire"))
      return "wire " + std::string{to_string(static_cast<wire_errc>(err.code()))} + ": " + detail;
    // Our own failures travel as CAF's system errors with their text, which says it all.
    if (err.category() == caf::atom("system"))
      return detail;
    return category + ": " + detail;
  }
  if (err.category() == caf::atom("system"))
    return "system: " + caf::to_string(static_cast<caf::sec>(err.code())) +
           (ctx.empty() ? std::string{} : " " + caf::to_string(ctx));
  return caf::to_string(err);
}

uint64_t checksum(const void* data, size_t size) {
  return XXH64(data, size, 0);
}

using namespace codec_detail;


// -- generation_request -------------------------------------------------------

caf::expected<std::vector<char>> encode(const generation_request& x) {
  capnp::MallocMessageBuilder builder;
  auto root = builder.initRoot<wire::GenerationRequest>();
  root.setSchemaVersion(schema_version);
  root.setPromptId(x.prompt_id);
  root.setGroupId(x.group_id);
  root.setSampleIndex(x.sample_index);
  fill(root.initPromptTokens(x.prompt_tokens.size()), x.prompt_tokens);
  auto s = root.initSampling();
  s.setTemperature(x.sampling.temperature);
  s.setTopK(x.sampling.top_k);
  s.setTopP(x.sampling.top_p);
  s.setGreedy(x.sampling.greedy);
  s.setMaxNewTokens(x.sampling.max_new_tokens);
  fill(s.initStopTokens(x.sampling.stop_tokens.size()), x.sampling.stop_tokens);
  root.setSeed(x.seed);
  root.setAdmittedVersion(x.admitted_version);
  auto so_far = root.initSoFar();
  fill(so_far.initTokens(x.so_far.tokens.size()), x.so_far.tokens);
  fill(so_far.initLogprobs(x.so_far.logprobs.size()), x.so_far.logprobs);
  fill(so_far.initVersions(x.so_far.versions.size()), x.so_far.versions);
  so_far.setFinish(static_cast<wire::FinishReason>(x.so_far.finish));
  return finish(builder);
}

template <>
caf::expected<generation_request> decode<generation_request>(const char* data, size_t size) {
  return read_root<wire::GenerationRequest, generation_request>(
      "generation_request", data, size, [](wire::GenerationRequest::Reader r) -> caf::expected<generation_request> {
        generation_request x;
        x.prompt_id = r.getPromptId();
        x.group_id = r.getGroupId();
        x.sample_index = r.getSampleIndex();
        x.prompt_tokens = to_vector<int32_t>(r.getPromptTokens());
        auto s = r.getSampling();
        x.sampling.temperature = s.getTemperature();
        x.sampling.top_k = s.getTopK();
        x.sampling.top_p = s.getTopP();
        x.sampling.greedy = s.getGreedy();
        x.sampling.max_new_tokens = s.getMaxNewTokens();
        x.sampling.stop_tokens = to_vector<int32_t>(s.getStopTokens());
        x.seed = r.getSeed();
        x.admitted_version = r.getAdmittedVersion();
        if (!(x.sampling.temperature >= 0.0f))
          return invalid("generation_request: temperature must be >= 0");
        if (!(x.sampling.top_p > 0.0f && x.sampling.top_p <= 1.0f))
          return invalid("generation_request: top_p must be in (0, 1]");
        auto so_far = r.getSoFar();
        x.so_far.tokens = to_vector<int32_t>(so_far.getTokens());
        x.so_far.logprobs = to_vector<float>(so_far.getLogprobs());
        x.so_far.versions = to_vector<int64_t>(so_far.getVersions());
        auto n = x.so_far.tokens.size();
        if (x.so_far.logprobs.size() != n || x.so_far.versions.size() != n)
          return invalid("generation_request: " + std::to_string(n) + " tokens so far but " +
                         std::to_string(x.so_far.logprobs.size()) + " log-probabilities and " +
                         std::to_string(x.so_far.versions.size()) + " versions");
        for (auto lp : x.so_far.logprobs)
          if (!std::isfinite(lp))
            return invalid("generation_request: a log-probability of the tokens so far is not a number");
        auto finish = so_far.getFinish();
        if (finish != wire::FinishReason::UNFINISHED && finish != wire::FinishReason::STOP &&
            finish != wire::FinishReason::LENGTH)
          return invalid("generation_request: the output so far ended " +
                         std::to_string(static_cast<int>(finish)) + "; only unfinished, stop or length continue");
        x.so_far.finish = static_cast<finish_reason>(finish);
        if (n > x.sampling.max_new_tokens ||
            (n == x.sampling.max_new_tokens && x.so_far.finish == finish_reason::unfinished))
          return invalid("generation_request: " + std::to_string(n) + " tokens so far, unfinished, for at most " +
                         std::to_string(x.sampling.max_new_tokens) + " new tokens");
        return x;
      });
}

// -- trajectory ---------------------------------------------------------------

namespace codec_detail {

caf::error check_lengths(const trajectory& x) {
  if (x.behaviour_logprobs.size() != x.output_tokens.size() || x.token_versions.size() != x.output_tokens.size())
    return invalid("trajectory: " + std::to_string(x.output_tokens.size()) + " output tokens but " +
                   std::to_string(x.behaviour_logprobs.size()) + " log-probabilities and " +
                   std::to_string(x.token_versions.size()) + " versions; they must be equal");
  if (!x.loss_mask.empty() && x.loss_mask.size() != x.output_tokens.size())
    return invalid("trajectory: " + std::to_string(x.output_tokens.size()) + " output tokens but a loss mask of " +
                   std::to_string(x.loss_mask.size()) + "; it must be empty or as long");
  return {};
}

// Writes a checked trajectory (check_lengths) into a Trajectory: a record of its own or one inside another.
void write_trajectory(wire::Trajectory::Builder root, const trajectory& x) {
  root.setSchemaVersion(schema_version);
  root.setPromptId(x.prompt_id);
  root.setGroupId(x.group_id);
  root.setSampleIndex(x.sample_index);
  fill(root.initPromptTokens(x.prompt_tokens.size()), x.prompt_tokens);
  fill(root.initOutputTokens(x.output_tokens.size()), x.output_tokens);
  fill(root.initBehaviourLogprobs(x.behaviour_logprobs.size()), x.behaviour_logprobs);
  fill(root.initTokenVersions(x.token_versions.size()), x.token_versions);
  root.setFinishReason(static_cast<wire::FinishReason>(x.finish));
  root.setReward(x.reward);
  root.setVerdict(static_cast<wire::Verdict>(x.judged));
  root.setVerdictDetail(text(x.verdict_detail));
  auto t = root.initTimestamps();
  t.setAdmittedNs(x.timestamps.admitted_ns);
  t.setGenerationStartNs(x.timestamps.generation_start_ns);
  t.setGenerationEndNs(x.timestamps.generation_end_ns);
  t.setScoredNs(x.timestamps.scored_ns);
  t.setScoringStartNs(x.timestamps.scoring_start_ns);
  root.setProducer(text(x.producer));
  root.setPromptVersion(x.prompt_version);
  fill(root.initLossMask(x.loss_mask.size()), x.loss_mask);
}

caf::expected<trajectory> read_trajectory(wire::Trajectory::Reader r) {
  trajectory x;
  x.prompt_id = r.getPromptId();
  x.group_id = r.getGroupId();
  x.sample_index = r.getSampleIndex();
  x.prompt_tokens = to_vector<int32_t>(r.getPromptTokens());
  x.output_tokens = to_vector<int32_t>(r.getOutputTokens());
  x.behaviour_logprobs = to_vector<float>(r.getBehaviourLogprobs());
  x.token_versions = to_vector<int64_t>(r.getTokenVersions());
  if (x.behaviour_logprobs.size() != x.output_tokens.size() || x.token_versions.size() != x.output_tokens.size())
    return invalid("trajectory: " + std::to_string(x.output_tokens.size()) + " output tokens but " +
                   std::to_string(x.behaviour_logprobs.size()) + " log-probabilities and " +
                   std::to_string(x.token_versions.size()) + " versions");
  if (!enum_in_range(r.getFinishReason(), wire::FinishReason::ABORTED))
    return invalid("trajectory: unknown finish reason " + std::to_string(static_cast<int>(r.getFinishReason())));
  if (!enum_in_range(r.getVerdict(), wire::Verdict::SANDBOX_VIOLATION))
    return invalid("trajectory: unknown verdict " + std::to_string(static_cast<int>(r.getVerdict())));
  for (size_t i = 0; i < x.behaviour_logprobs.size(); ++i)
    if (!std::isfinite(x.behaviour_logprobs[i]))
      return invalid("trajectory: the log-probability of output token " + std::to_string(i) + " is " +
                     std::to_string(x.behaviour_logprobs[i]) + "; the rollout node computed it wrong");
  x.finish = static_cast<finish_reason>(r.getFinishReason());
  x.reward = r.getReward();
  if (!std::isfinite(x.reward))
    return invalid("trajectory: the reward is " + std::to_string(x.reward));
  x.judged = static_cast<verdict>(r.getVerdict());
  x.verdict_detail = to_std(r.getVerdictDetail());
  auto t = r.getTimestamps();
  x.timestamps.admitted_ns = t.getAdmittedNs();
  x.timestamps.generation_start_ns = t.getGenerationStartNs();
  x.timestamps.generation_end_ns = t.getGenerationEndNs();
  x.timestamps.scored_ns = t.getScoredNs();
  x.timestamps.scoring_start_ns = t.getScoringStartNs();
  x.producer = to_std(r.getProducer());
  x.prompt_version = r.getPromptVersion();
  x.loss_mask = to_vector<uint8_t>(r.getLossMask());
  if (!x.loss_mask.empty() && x.loss_mask.size() != x.output_tokens.size())
    return invalid("trajectory: " + std::to_string(x.output_tokens.size()) + " output tokens but a loss mask of " +
                   std::to_string(x.loss_mask.size()));
  for (auto m : x.loss_mask)
    if (m > 1)
      return invalid("trajectory: a loss mask entry is " + std::to_string(m) + "; entries are 0 or 1");
  return x;
}

}  // namespace codec_detail

caf::expected<std::vector<char>> encode(const trajectory& x) {
  if (auto err = check_lengths(x))
    return err;
  capnp::MallocMessageBuilder builder;
  write_trajectory(builder.initRoot<wire::Trajectory>(), x);
  return finish(builder);
}

template <>
caf::expected<trajectory> decode<trajectory>(const char* data, size_t size) {
  return read_root<wire::Trajectory, trajectory>("trajectory", data, size, read_trajectory);
}

// -- weight_manifest ----------------------------------------------------------

caf::error validate(const weight_manifest& x) {
  std::set<std::string> names;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& t : x.tensors) {
    if (t.name.empty())
      return invalid("weight_manifest: a tensor has an empty name");
    if (!names.insert(t.name).second)
      return invalid("weight_manifest: tensor '" + t.name + "' appears twice");
    uint64_t elements = 1;
    for (auto d : t.shape) {
      if (d < 0)
        return invalid("weight_manifest: tensor '" + t.name + "' has a negative dimension");
      if (d != 0 && elements > (uint64_t{1} << 62) / static_cast<uint64_t>(d))
        return invalid("weight_manifest: tensor '" + t.name + "' has an impossibly large shape");
      elements *= static_cast<uint64_t>(d);
    }
    auto bytes = elements * element_size(t.type);
    if (t.offset > x.total_bytes || bytes > x.total_bytes - t.offset)
      return invalid("weight_manifest: tensor '" + t.name + "' (" + std::to_string(bytes) + " bytes at offset " +
                     std::to_string(t.offset) + ") lies outside the " + std::to_string(x.total_bytes) + "-byte buffer");
    if (bytes > 0)
      ranges.emplace_back(t.offset, t.offset + bytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      return invalid("weight_manifest: two tensors overlap at byte " + std::to_string(ranges[i].first));
  if (x.chunk_bytes != 0 && x.total_bytes / x.chunk_bytes >= (uint64_t{1} << 24))
    return invalid("weight_manifest: chunks of " + std::to_string(x.chunk_bytes) + " bytes are too small for " +
                   std::to_string(x.total_bytes) + " bytes");
  return {};
}

caf::expected<std::vector<char>> encode(const weight_manifest& x) {
  if (auto err = validate(x))
    return err;
  capnp::MallocMessageBuilder builder;
  auto root = builder.initRoot<wire::WeightManifest>();
  root.setSchemaVersion(schema_version);
  root.setVersion(x.version);
  auto list = root.initTensors(x.tensors.size());
  for (unsigned i = 0; i < x.tensors.size(); ++i) {
    auto& t = x.tensors[i];
    auto e = list[i];
    e.setName(text(t.name));
    e.setDtype(static_cast<wire::DType>(t.type));
    fill(e.initShape(t.shape.size()), t.shape);
    e.setOffset(t.offset);
  }
  root.setTotalBytes(x.total_bytes);
  root.setChecksum(x.checksum);
  root.setChunkBytes(x.chunk_bytes);
  return finish(builder);
}

template <>
caf::expected<weight_manifest> decode<weight_manifest>(const char* data, size_t size) {
  return read_root<wire::WeightManifest, weight_manifest>(
      "weight_manifest", data, size, [](wire::WeightManifest::Reader r) -> caf::expected<weight_manifest> {
        weight_manifest x;
        x.version = r.getVersion();
        x.total_bytes = r.getTotalBytes();
        x.checksum = r.getChecksum();
        x.chunk_bytes = r.getChunkBytes();
        for (auto e : r.getTensors()) {
          if (!enum_in_range(e.getDtype(), wire::DType::U8))
            return invalid("weight_manifest: tensor '" + to_std(e.getName()) + "' has unknown dtype " +
                           std::to_string(static_cast<int>(e.getDtype())));
          tensor_entry t;
          t.name = to_std(e.getName());
          t.type = static_cast<dtype>(e.getDtype());
          t.shape = to_vector<int64_t>(e.getShape());
          t.offset = e.getOffset();
          x.tensors.push_back(std::move(t));
        }
        if (auto err = validate(x))
          return err;
        return x;
      });
}

// -- reward_task --------------------------------------------------------------

caf::expected<std::vector<char>> encode(const reward_task& x) {
  capnp::MallocMessageBuilder builder;
  auto root = builder.initRoot<wire::RewardTask>();
  root.setSchemaVersion(schema_version);
  root.setKind(static_cast<wire::TaskKind>(x.kind));
  auto refs = root.initReferences(x.references.size());
  for (unsigned i = 0; i < x.references.size(); ++i)
    refs.set(i, text(x.references[i]));
  root.setLastNumberAnswer(x.last_number_answer);
  fill(root.initNumbers(x.numbers.size()), x.numbers);
  root.setTarget(x.target);
  auto cases = root.initIoCases(x.io_cases.size());
  for (unsigned i = 0; i < x.io_cases.size(); ++i) {
    cases[i].setInput(text(x.io_cases[i].input));
    cases[i].setExpectedOutput(text(x.io_cases[i].expected_output));
  }
  auto asserts = root.initAssertions(x.assertions.size());
  for (unsigned i = 0; i < x.assertions.size(); ++i)
    asserts.set(i, text(x.assertions[i]));
  root.setTestSetup(text(x.test_setup));
  auto entries = root.initEntryPoints(x.entry_points.size());
  for (unsigned i = 0; i < x.entry_points.size(); ++i)
    entries.set(i, text(x.entry_points[i]));
  root.setCaseTimeS(x.case_time_s);
  root.setTotalTimeS(x.total_time_s);
  root.setPartialCredit(x.partial_credit);
  return finish(builder);
}

template <>
caf::expected<reward_task> decode<reward_task>(const char* data, size_t size) {
  return read_root<wire::RewardTask, reward_task>(
      "reward_task", data, size, [](wire::RewardTask::Reader r) -> caf::expected<reward_task> {
        if (!enum_in_range(r.getKind(), wire::TaskKind::CODE))
          return invalid("reward_task: unknown task kind " + std::to_string(static_cast<int>(r.getKind())));
        reward_task x;
        x.kind = static_cast<task_kind>(r.getKind());
        x.references = to_strings(r.getReferences());
        x.last_number_answer = r.getLastNumberAnswer();
        x.numbers = to_vector<int64_t>(r.getNumbers());
        x.target = r.getTarget();
        for (auto c : r.getIoCases())
          x.io_cases.push_back({to_std(c.getInput()), to_std(c.getExpectedOutput())});
        x.assertions = to_strings(r.getAssertions());
        x.test_setup = to_std(r.getTestSetup());
        x.entry_points = to_strings(r.getEntryPoints());
        x.case_time_s = r.getCaseTimeS();
        x.total_time_s = r.getTotalTimeS();
        x.partial_credit = r.getPartialCredit();
        if (!(x.case_time_s > 0 && x.case_time_s <= 3600 && x.total_time_s > 0 && x.total_time_s <= 3600))
          return invalid("reward_task: time limits must lie in (0, 3600] seconds");
        return x;
      });
}

// -- node_hello ---------------------------------------------------------------

caf::expected<std::vector<char>> encode(const node_hello& x) {
  capnp::MallocMessageBuilder builder;
  auto root = builder.initRoot<wire::NodeHello>();
  root.setSchemaVersion(schema_version);
  root.setProtocolVersion(x.protocol_version);
  root.setAppId(text(x.app_id));
  root.setNodeName(text(x.node_name));
  auto roles = root.initRoles(x.roles.size());
  for (unsigned i = 0; i < x.roles.size(); ++i)
    roles.set(i, text(x.roles[i]));
  root.setHost(text(x.host));
  root.setPort(x.port);
  root.setPid(x.pid);
  root.setHostname(text(x.hostname));
  root.setBuild(text(x.build));
  root.setWallClockNs(x.wall_clock_ns);
  return finish(builder);
}

template <>
caf::expected<node_hello> decode<node_hello>(const char* data, size_t size) {
  return read_root<wire::NodeHello, node_hello>("node_hello", data, size,
                                                [](wire::NodeHello::Reader r) -> caf::expected<node_hello> {
                                                  node_hello x;
                                                  x.protocol_version = r.getProtocolVersion();
                                                  x.app_id = to_std(r.getAppId());
                                                  x.node_name = to_std(r.getNodeName());
                                                  x.roles = to_strings(r.getRoles());
                                                  x.host = to_std(r.getHost());
                                                  x.port = r.getPort();
                                                  x.pid = r.getPid();
                                                  x.hostname = to_std(r.getHostname());
                                                  x.build = to_std(r.getBuild());
                                                  x.wall_clock_ns = r.getWallClockNs();
                                                  if (x.node_name.empty())
                                                    return invalid("node_hello: empty node name");
                                                  return x;
                                                });
}

// -- node_stats ---------------------------------------------------------------

caf::expected<std::vector<char>> encode(const node_stats& x) {
  capnp::MallocMessageBuilder builder;
  auto root = builder.initRoot<wire::NodeStats>();
  root.setSchemaVersion(schema_version);
  root.setNodeName(text(x.node_name));
  root.setUptimeNs(x.uptime_ns);
  root.setPeersConnected(x.peers_connected);
  root.setPeersLost(x.peers_lost);
  root.setTrajectoriesReceived(x.trajectories_received);
  root.setTrajectoriesSent(x.trajectories_sent);
  root.setBytesReceived(x.bytes_received);
  root.setBytesSent(x.bytes_sent);
  return finish(builder);
}

template <>
caf::expected<node_stats> decode<node_stats>(const char* data, size_t size) {
  return read_root<wire::NodeStats, node_stats>("node_stats", data, size,
                                                [](wire::NodeStats::Reader r) -> caf::expected<node_stats> {
                                                  node_stats x;
                                                  x.node_name = to_std(r.getNodeName());
                                                  x.uptime_ns = r.getUptimeNs();
                                                  x.peers_connected = r.getPeersConnected();
                                                  x.peers_lost = r.getPeersLost();
                                                  x.trajectories_received = r.getTrajectoriesReceived();
                                                  x.trajectories_sent = r.getTrajectoriesSent();
                                                  x.bytes_received = r.getBytesReceived();
                                                  x.bytes_sent = r.getBytesSent();
                                                  return x;
                                                });
}

}  // namespace areal
