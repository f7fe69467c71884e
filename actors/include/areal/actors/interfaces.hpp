// Every actor interface of areal, and the one type-ID block that announces every
// type they exchange. A reader learns the whole message protocol from this file.
// Types missing from the block arrive at a remote node as empty messages (CAF
// 0.17), so everything that crosses a node boundary is listed here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_actor.hpp>

#include "areal/actors/sample_summary.hpp"
#include "areal/messages/packed.hpp"

namespace at {
class Tensor;
}  // namespace at

namespace areal {

/// Version of the actor message protocol below. Nodes of different protocol
/// versions refuse each other at the handshake.
inline constexpr uint32_t protocol_version = 4;

using stats_atom = caf::atom_constant<caf::atom("stats")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using publisher_atom = caf::atom_constant<caf::atom("publisher")>;
using trace_atom = caf::atom_constant<caf::atom("trace")>;
using run_end_atom = caf::atom_constant<caf::atom("run_end")>;
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using ledger_atom = caf::atom_constant<caf::atom("ledger")>;
using trainer_atom = caf::atom_constant<caf::atom("trainer")>;

/// The NODE actor interface: one per process, published on the node's port;
/// the endpoint through which nodes meet.
using node_actor = caf::typed_actor<
    // Handshake: a peer introduces itself; the reply is this node's own hello. A
    // peer of another protocol or schema version, another cluster, or a name not
    // in the topology is refused with a node_errc error that says why.
    caf::replies_to<packed<node_hello>>::with<packed<node_hello>>,
    // A trajectory for this node. The reply is the checksum of the bytes that
    // arrived, so that the sender can verify the transfer.
    caf::replies_to<packed<trajectory>>::with<uint64_t>,
    // This node's counters.
    caf::replies_to<stats_atom>::with<packed<node_stats>>,
    // The controller ends the run (the text says why); the node acknowledges and stops.
    caf::replies_to<run_end_atom, std::string>::with<bool>,
    // Stop this node (SIGINT/SIGTERM, or an embedding application); the text says why.
    caf::reacts_to<shutdown_atom, std::string>,
    // RL runs, controller node only. A peer's member joins the run: role "rollout"
    // (a rollout worker) or "reward" (a reward pool), handed to the controller.
    // Refused with node_errc::not_ready while the job has not started (the warm
    // start runs first): the peer asks again. Role "trainer": the node members
    // of the trainer's node, kept for the job's trainer_atom request (below).
    caf::replies_to<join_atom, std::string, caf::actor>::with<bool>,
    // RL runs, controller node only: the weight publisher (same not_ready rule).
    caf::replies_to<publisher_atom>::with<caf::actor>,
    // RL runs with the trainer on a node of its own, controller node only: the
    // job asks for the trainer side (model directory to start from, checkpoint
    // to resume or empty, initial version, run directory), answered by the
    // trainer node's members once that node joined (role "trainer" above,
    // accepted before the job runs): (trainer, sample store, weight
    // publisher, evaluator or null).
    caf::replies_to<trainer_atom, std::string, std::string, int64_t, std::string>::with<caf::actor, caf::actor,
                                                                                        caf::actor, caf::actor>,
    // Set by the RL job of this process once it runs: its controller and weight
    // publisher, for the two requests above. Set again (a trainer that joined
    // again has a publisher of its own), it is announced to every peer.
    caf::reacts_to<publisher_atom, caf::actor, caf::actor>,
    // Other nodes: the controller node announces the run's weight publisher;
    // this node's rollout workers subscribe to it (unless they are already).
    caf::reacts_to<publisher_atom, caf::actor>,
    // The trace spans of this node's members as JSON [[track, what, start, end], ...]
    // in nanoseconds of the controller node's wall clock (the offset estimated at
    // the handshake). On the controller node: every peer's, merged.
    caf::replies_to<trace_atom>::with<std::string>,
    // Timer of the connection phase, sent by a node to itself: a node retrying to
    // reach the controller tries again; on the controller it is the deadline by
    // which every node of the topology must have joined.
    caf::reacts_to<caf::connect_atom>>;

using step_atom = caf::atom_constant<caf::atom("step")>;

/// New policy weights inside one process: the trainer's flat parameter buffer
/// (the model's layout) shared by pointer, not copied through the message
/// system. Local only: across nodes, weights travel as a weight_manifest plus
/// a bulk transfer.
struct local_weights {
  int64_t version = 0;
  std::shared_ptr<const at::Tensor> flat;
};

using stream_atom = caf::atom_constant<caf::atom("stream")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using weights_atom = caf::atom_constant<caf::atom("weights")>;

/// The ROLLOUT WORKER interface: a generation engine on its own thread that
/// never waits for the trainer.
using rollout_actor = caf::typed_actor<
    // Generate one sample and send it on: the trajectory (prompt and output
    // tokens, behaviour log-probabilities, the policy version of each token,
    // finish reason) and its text go to the reward pool (a reward_pool_actor)
    // with the task, and the pool hands the scored trajectory to the sample
    // store (a sample_store_actor). The reply, from the store, is the summary.
    // A pool whose queue is full is asked again (back-pressure, bounded by the
    // worker's scoring deadline); an aborted sequence is answered with an error.
    caf::replies_to<packed<generation_request>, packed<reward_task>, caf::actor, caf::actor>::with<sample_summary>,
    // Generate one sample only: the reply is the trajectory and its text.
    caf::replies_to<packed<generation_request>>::with<packed<trajectory>, std::string>,
    // The same for a client of the endpoint, streamed: after every engine step
    // the tokens sampled in it go to the listener as (stream_atom, std::vector<int32_t>).
    caf::replies_to<stream_atom, packed<generation_request>, caf::actor>::with<packed<trajectory>, std::string>,
    // The listener's client went away: its request ends now, answered with an error.
    caf::reacts_to<cancel_atom, caf::actor>,
    // Every request bound for a reward pool ends now, answered with an error
    // (the controller let them go: the trainer they were for was lost).
    caf::reacts_to<cancel_atom>,
    // New weights: applied at the next step boundary, interrupting in-flight
    // sequences (their caches are recomputed with the new weights).
    caf::reacts_to<local_weights>,
    // One engine step; the worker sends this to itself while it has work, so that
    // requests and weight updates are taken in between steps.
    caf::reacts_to<step_atom>,
    // Offer the trajectories waiting for a full reward pool again (sent to itself).
    caf::reacts_to<caf::tick_atom>,
    // For a run checkpoint: the work on the samples bound for a reward pool, as
    // trajectories: the tokens so far of those generating (finish unfinished),
    // and the generated ones no pool has answered for yet.
    caf::replies_to<snapshot_atom>::with<std::vector<packed<trajectory>>>,
    // The policy version the next token it samples will carry (new weights
    // that arrived count, though applied at the next step).
    caf::replies_to<weights_atom>::with<int64_t>>;

using train_atom = caf::atom_constant<caf::atom("train")>;
using checkpoint_atom = caf::atom_constant<caf::atom("checkpoint")>;
using durable_atom = caf::atom_constant<caf::atom("durable")>;

/// What one training step did.
struct train_report {
  int64_t version = 0;  // policy version the step produced
  double loss = 0;
  double grad_norm = 0;
  double reward_mean = 0;
  int64_t samples = 0;
  int64_t tokens = 0;
  int64_t behaviour_masked = 0;  // tokens whose importance weight exceeded the cap
  int64_t max_staleness = 0;     // newest version minus the oldest token version in the batch
  double seconds = 0;            // the whole step: proximal pass, gradients, optimizer
  double kl = 0;                 // mean KL(pi_theta || pi_ref) estimate, when a reference is used
  double lr = 0;
  double publish_seconds = 0;  // snapshot of the new weights for the rollout workers
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, train_report& x) {
  return f(caf::meta::type_name("areal.train_report"), x.version, x.loss, x.grad_norm, x.reward_mean, x.samples,
           x.tokens, x.behaviour_masked, x.max_staleness, x.seconds, x.kl, x.lr, x.publish_seconds);
}

/// A batch inside one process: the sample store hands the trainer beside it
/// the decoded trajectories by pointer.
struct local_batch {
  std::shared_ptr<const std::vector<trajectory>> trajectories;
};

using eval_atom = caf::atom_constant<caf::atom("eval")>;

/// The TRAINER interface: decoupled PPO on its own thread.
using trainer_actor = caf::typed_actor<
    // Train on scored trajectories (whole groups; rewards set by the reward
    // service): group advantages, proximal log-probabilities, one PPO update.
    // The new weights go to the weight publisher (or the local rollout workers);
    // the requester then receives the publisher's reports as a
    // std::vector<weight_delivery>.
    caf::replies_to<train_atom, local_batch>::with<train_report>,
    // The current weights and version (for a worker that joins).
    caf::replies_to<weights_atom>::with<local_weights>,
    // Evaluate the current weights with the evaluator beside the trainer; the
    // reply is (version, accuracy in [0, 1], mean response tokens).
    caf::replies_to<eval_atom>::with<int64_t, double, double>,
    // Save a checkpoint of the current version into the directory (atomically),
    // with the controller's state of the same step as a file in it. The reply is
    // the version saved, as soon as it is copied in memory: the trainer trains on
    // while a thread of its own writes it. One write at a time (an error while
    // one is being written).
    caf::replies_to<checkpoint_atom, std::string, std::string>::with<int64_t>,
    // The reply comes once the last checkpoint asked for is on disk (its version),
    // or with the error that stopped its write.
    caf::replies_to<durable_atom>::with<int64_t>,
    // The trainer's own writer thread: that write ended (version; the error, "" when none).
    caf::reacts_to<durable_atom, int64_t, std::string>>;

/// The EVALUATOR interface: greedy decoding on the held-out prompts.
using evaluator_actor = caf::typed_actor<
    // Evaluate these weights; the reply is (version, accuracy in [0, 1], mean response tokens).
    caf::replies_to<eval_atom, local_weights>::with<int64_t, double, double>>;

using forget_atom = caf::atom_constant<caf::atom("forget")>;

/// The SAMPLE STORE (the trainer's node): holds the scored trajectories until
/// the controller names them for a batch. The bytes travel rollout worker ->
/// reward pool -> store -> trainer; the controller sees summaries only.
using sample_store_actor = caf::typed_actor<
    // A scored trajectory (from a reward pool): kept under a new slot; the reply is its summary.
    caf::replies_to<packed<trajectory>>::with<sample_summary>,
    // The trajectories of one sample (an agent's episode, split where its
    // client rewrote the history; an endpoint sets the reward): one slot, one summary.
    caf::replies_to<std::vector<packed<trajectory>>>::with<sample_summary>,
    // Train on the trajectories of these slots (they leave the store): handed to
    // the trainer, whose reply (train_report) goes to the requester.
    caf::replies_to<train_atom, std::vector<uint64_t>>::with<train_report>,
    // These slots will never be trained (their group was dropped, or a late
    // reply was ignored): forgotten.
    caf::reacts_to<forget_atom, std::vector<uint64_t>>,
    // Slots held now.
    caf::replies_to<stats_atom>::with<uint64_t>,
    // For a run checkpoint: the trajectories of every slot held (a sample's
    // trajectories one after another).
    caf::replies_to<snapshot_atom>::with<std::vector<packed<trajectory>>>>;

using publish_atom = caf::atom_constant<caf::atom("publish")>;
using subscribe_atom = caf::atom_constant<caf::atom("subscribe")>;
using fetch_atom = caf::atom_constant<caf::atom("fetch")>;
using push_atom = caf::atom_constant<caf::atom("push")>;

/// How one version of the weights reached one subscriber.
struct weight_delivery {
  std::string subscriber;  // its node name (or actor name, in-process)
  int64_t version = 0;
  std::string backend;  // "in-process", "caf" or "gloo"
  uint64_t bytes = 0;
  double seconds = 0;          // from the announcement to the verified copy
  uint32_t resent_chunks = 0;  // chunks whose checksum failed and were fetched again
  std::string error;           // empty: delivered intact
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, weight_delivery& x) {
  return f(caf::meta::type_name("areal.weight_delivery"), x.subscriber, x.version, x.backend, x.bytes, x.seconds,
           x.resent_chunks, x.error);
}

/// The WEIGHT PUBLISHER (the trainer's node): bulk weight transport, sending
/// side. Holds the newest versions; each is announced to every subscriber as a
/// manifest (version, size, chunking); every chunk travels with the XXH3-64 of
/// its bytes, computed by the sender as it sends. Subscribers in this
/// process (rollout workers) get the buffer by pointer; remote ones (weight
/// subscriber actors) fetch it over their bulk link (Gloo) or as CAF messages,
/// verify every chunk and fetch a damaged one again.
using weight_publisher_actor = caf::typed_actor<
    // New weights: announced to every subscriber. The reply comes once every
    // subscriber of the moment has reported this version (or a newer one), or
    // at the transfer deadline: one report per subscriber.
    caf::replies_to<publish_atom, local_weights>::with<std::vector<weight_delivery>>,
    // The same, and every intact report of a subscriber (this version or a
    // later one) is sent to the actor given as it comes, before the version
    // settles: the controller admits work for a node that holds a version
    // while a slower one still fetches it.
    caf::replies_to<publish_atom, local_weights, caf::actor>::with<std::vector<weight_delivery>>,
    // The deadline of a version's reports (the publisher sends it to itself).
    caf::reacts_to<publish_atom, int64_t>,
    // A subscriber joins (node name, actor, the bulk link kinds it can take:
    // "gloo nccl", "gloo", "" for CAF messages only). The reply is the newest
    // manifest (version -1 when nothing was published yet) and the bulk link
    // offered to it ("in-process", "caf", "gloo HOST:PORT PREFIX SECRET" or
    // "nccl ID"; one it can take); every later version is announced.
    caf::replies_to<subscribe_atom, std::string, caf::actor, std::string>::with<packed<weight_manifest>, std::string>,
    // One chunk of a version still held (the newest two) and the XXH3-64 of its
    // bytes at the sender: the CAF path, and the repair path of every backend.
    // A version no longer held: weight_errc::gone.
    caf::replies_to<fetch_atom, int64_t, uint64_t>::with<uint64_t, std::string>,
    // Send a version over the subscriber's Gloo link (the subscriber is receiving).
    caf::replies_to<push_atom, std::string, int64_t>::with<bool>,
    // A subscriber's report of one version.
    caf::reacts_to<weight_delivery>>;

/// The WEIGHT SUBSCRIBER (each remote rollout node): receives every announced
/// version, skipping to the newest, and hands it to the node's rollout workers.
using weight_subscriber_actor = caf::typed_actor<
    // A new version was published.
    caf::reacts_to<packed<weight_manifest>>,
    // Fetch the newest announced version (sent to itself, so that announcements
    // queued meanwhile are seen first: a subscriber that fell behind catches up
    // to the newest version, not through every one).
    caf::reacts_to<fetch_atom>>;

/// The SUBSCRIBER'S LISTENER: told after each version whether it reached this
/// node's rollout workers (the text is empty) or why not.
using weights_listener_actor = caf::typed_actor<caf::reacts_to<weights_atom, int64_t, std::string>>;

/// A BULK SENDER (the publisher's, one per subscriber with a bulk link, on a
/// thread of its own since sending blocks until the receiver takes part): sends
/// one version over the link; the reply says whether weights went (false: a
/// "nothing" version that releases the receiver).
using bulk_sender_actor =
    caf::typed_actor<caf::replies_to<push_atom, local_weights, packed<weight_manifest>>::with<bool>>;

/// The NODE MEMBERS actor of a node other than the controller's (rl_job.hpp,
/// spawn_node_members): the agent of that node's rollout workers and reward pool.
using node_members_actor = caf::typed_actor<
    // Hand a member (role "rollout" or "reward") to the run; asked again while
    // the controller node answers not_ready.
    caf::reacts_to<join_atom, std::string, caf::actor>,
    // Ask the controller node for the weight publisher again and subscribe.
    caf::reacts_to<publisher_atom>,
    // Subscribe to this weight publisher (announced by the controller node), in
    // place of a subscription to another one.
    caf::reacts_to<publisher_atom, caf::actor>,
    // The weight subscriber's report of a version (a weights_listener_actor).
    caf::reacts_to<weights_atom, int64_t, std::string>,
    // The trainer's node only: start the trainer side (see node_actor's trainer_atom).
    caf::replies_to<trainer_atom, std::string, std::string, int64_t, std::string>::with<caf::actor, caf::actor,
                                                                                        caf::actor, caf::actor>>;

/// A DONE LISTENER: told once, when a run (the controller's) or a node ends,
/// with the exit code and why.
using done_listener_actor = caf::typed_actor<caf::reacts_to<done_atom, int32_t, std::string>>;

/// Counters of the controller: every admitted sample ends trained or dropped.
struct controller_stats {
  int64_t version = 0;
  int64_t admitted = 0;
  int64_t running = 0;   // admitted, not yet scored
  int64_t buffered = 0;  // scored, waiting for a batch
  int64_t trained = 0;
  int64_t dropped = 0;  // with a reason, see the log and metrics
  int64_t steps = 0;
  int64_t max_staleness = 0;     // over every trained batch, in versions
  double reward_mean_first = 0;  // mean reward of the first trained batch
  double reward_mean_last = 0;   // and of the last
  int64_t generated_tokens = 0;  // response tokens that reached the buffer
  int64_t trained_tokens = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, controller_stats& x) {
  return f(caf::meta::type_name("areal.controller_stats"), x.version, x.admitted, x.running, x.buffered, x.trained,
           x.dropped, x.steps, x.max_staleness, x.reward_mean_first, x.reward_mean_last, x.generated_tokens,
           x.trained_tokens);
}

using episode_atom = caf::atom_constant<caf::atom("episode")>;
using deadline_atom = caf::atom_constant<caf::atom("deadline")>;
using reply_atom = caf::atom_constant<caf::atom("reply")>;

/// The CONTROLLER interface: owns the prompt stream and the data flow.
using controller_actor = caf::typed_actor<
    // Its counters.
    caf::replies_to<stats_atom>::with<controller_stats>,
    // The sample ledger, as JSON: [[group, index, stage, holder, attempts, step, reason], ...]
    // in id order (sample_ledger.hpp); after the run ends every sample is trained or dropped.
    caf::replies_to<ledger_atom>::with<std::string>,
    // Stop admitting work and end the run (the text says why).
    caf::reacts_to<shutdown_atom, std::string>,
    // The same with the run's exit code (an actor of the job stopped: 1).
    caf::reacts_to<shutdown_atom, int32_t, std::string>,
    // A member joins the run (node name, role "rollout" or "reward", its actor):
    // it gets work from now on; the controller monitors it, and when it is lost
    // its unfinished samples are queued again for the other members.
    caf::reacts_to<join_atom, std::string, std::string, caf::actor>,
    // How the weights of a version reached each subscriber (from the trainer, after a step).
    caf::reacts_to<std::vector<weight_delivery>>,
    // One rollout node holds a version (from the weight publisher, as the node
    // reports it): work sent there counts from it (staleness_gate::delivered_to).
    caf::reacts_to<weight_delivery>,
    // Membership deadline (sent to itself): no rollout worker for member_timeout ends the run.
    caf::reacts_to<caf::tick_atom>,
    // Request deadlines (sent to itself): samples whose request ran past
    // request_timeout are generated again. One timer for all requests: CAF
    // 0.17's per-request timeouts cost a pass over every request in flight
    // when a reply cancels one (measured by bench_simulate).
    caf::reacts_to<deadline_atom>,
    // The reply to the rollout request `id` (a sample's summary, or why it
    // failed), from the controller's link to that worker. One link per worker
    // holds the requests: CAF 0.17 finds a reply's handler by a pass over the
    // requester's pending requests, so that one actor holding every request
    // in flight (a hundred thousand at 512 devices) would scan them all per reply.
    caf::reacts_to<reply_atom, uint64_t, sample_summary>, caf::reacts_to<reply_atom, uint64_t, caf::error>,
    // Agent runs (task.kind = "agent"): an endpoint (the holder named) opens an
    // episode of a task (the agent's key; the episodes of one task form groups
    // of group_size). The reply is its sample (group, index) and the policy
    // version at admission; refused with an episode_errc while the staleness
    // gate is closed, in a run that trains on its own prompts, or after the run ended.
    caf::replies_to<episode_atom, std::string, std::string>::with<uint64_t, uint32_t, int64_t>,
    // An episode ended: its trajectories are in the sample store (the summary).
    caf::reacts_to<episode_atom, sample_summary>,
    // An episode will not be trained (group, index, why): its endpoint dropped it.
    caf::reacts_to<episode_atom, uint64_t, uint32_t, std::string>,
    // A group's deadline (sent to itself): a group whose episodes did not all open by then is dropped.
    caf::reacts_to<episode_atom, uint64_t>,
    // The trainer's node was lost (a trainer on a node of its own): no more
    // admissions or steps; what is in flight is let go (the run goes back to
    // its last checkpoint when a trainer joins again).
    caf::reacts_to<trainer_atom>,
    // A trainer joined again (its actor and its sample store), started from the
    // last checkpoint (the controller's record, as bytes; empty: the start of
    // the run): the controller goes back to that checkpoint and, once every
    // rollout worker has its weights, the run goes on.
    caf::reacts_to<trainer_atom, caf::actor, caf::actor, std::string>,
    // Sent to itself: ask the rollout workers again whether they have those weights.
    caf::reacts_to<trainer_atom, uint64_t>>;

/// Counters of the reward pool.
struct reward_pool_stats {
  uint64_t scored = 0;    // replies sent with a verdict (any verdict)
  uint64_t refused = 0;   // requests refused because the queue was full
  uint64_t timeouts = 0;  // verifications stopped at the pool's deadline
  uint64_t errors = 0;    // verifiers that threw, or unreadable requests
  uint64_t queued = 0;    // waiting for a worker now
  uint64_t busy = 0;      // workers verifying now
  uint64_t workers = 0;
  uint64_t replaced = 0;  // workers retired after a deadline and replaced
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, reward_pool_stats& x) {
  return f(caf::meta::type_name("areal.reward_pool_stats"), x.scored, x.refused, x.timeouts, x.errors, x.queued, x.busy,
           x.workers, x.replaced);
}

/// The REWARD POOL interface: scores finished trajectories on CPU workers, in
/// parallel with generation; every accepted request gets exactly one reply.
using reward_pool_actor = caf::typed_actor<
    // (trajectory, its response text, the task) -> the trajectory with reward,
    // verdict, detail and scoring timestamps set. A verifier that throws or runs
    // past the pool's deadline gives reward 0 with verdict error or timeout. When
    // the queue is full the request is refused with reward_errc::queue_full and
    // the caller keeps the trajectory: that is the back-pressure.
    caf::replies_to<packed<trajectory>, std::string, packed<reward_task>>::with<packed<trajectory>>,
    // The same, with the scored trajectory handed to the sample store (a
    // sample_store_actor), whose summary is the reply. Refused alike when full.
    caf::replies_to<packed<trajectory>, std::string, packed<reward_task>, caf::actor>::with<sample_summary>,
    // The pool's counters.
    caf::replies_to<stats_atom>::with<reward_pool_stats>>;

/// Errors of the reward pool.
enum class reward_errc : uint8_t {
  /// queue_capacity requests are pending: send again after a reply arrives.
  queue_full = 1,
};
const char* to_string(reward_errc x);

/// Why the controller refuses to open an episode.
enum class episode_errc : uint8_t {
  /// The staleness gate is closed: the trainer must catch up first; ask again.
  gate_closed = 1,
  /// The run trains on its own prompts (task.kind is not "agent").
  not_agent_run,
  /// The run admits no more work (it is ending or ended).
  run_ended,
};
const char* to_string(episode_errc x);

/// Errors of the node protocol.
enum class node_errc : uint8_t {
  /// The peer runs another protocol or schema version: run one areal build everywhere.
  incompatible_peer = 1,
  /// The peer belongs to another cluster (cluster.app_id differs).
  foreign_cluster,
  /// The peer's name is not a node of this topology, or that name is already connected.
  unknown_peer,
  /// No node actor answered at the address (nothing published there, or another program).
  not_a_node,
  /// The controller node's RL job is not running yet (warm start): ask again shortly.
  not_ready,
};
const char* to_string(node_errc x);

/// Errors of the weight transport.
enum class weight_errc : uint8_t {
  /// The version asked for is no longer held (a newer one replaced it): fetch the newest.
  gone = 1,
  /// A chunk failed its checksum again after being fetched again.
  corrupted,
  /// The subscriber's model has another size than the published weights.
  size_mismatch,
};
const char* to_string(weight_errc x);

}  // namespace areal

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(areal::local_weights)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(areal::local_batch)
CAF_ERROR_CODE_ENUM(areal::node_errc, "node")
CAF_ERROR_CODE_ENUM(areal::reward_errc, "reward")
CAF_ERROR_CODE_ENUM(areal::episode_errc, "episode")
CAF_ERROR_CODE_ENUM(areal::weight_errc, "weights")

CAF_BEGIN_TYPE_ID_BLOCK(areal, caf::first_custom_type_id)
CAF_ADD_TYPE_ID(areal, (areal::packed<areal::generation_request>))
CAF_ADD_TYPE_ID(areal, (areal::packed<areal::trajectory>))
CAF_ADD_TYPE_ID(areal, (areal::packed<areal::weight_manifest>))
CAF_ADD_TYPE_ID(areal, (areal::packed<areal::node_hello>))
CAF_ADD_TYPE_ID(areal, (areal::packed<areal::node_stats>))
CAF_ADD_TYPE_ID(areal, (areal::packed<areal::reward_task>))
CAF_ADD_TYPE_ID(areal, (areal::reward_pool_stats))
CAF_ADD_TYPE_ID(areal, (areal::weight_delivery))
CAF_ADD_TYPE_ID(areal, (areal::sample_summary))
CAF_ADD_TYPE_ID(areal, (areal::train_report))
CAF_ADD_TYPE_ID(areal, (areal::controller_stats))
CAF_ADD_TYPE_ID(areal, (std::vector<areal::weight_delivery>))
CAF_ADD_TYPE_ID(areal, (std::vector<uint64_t>))
CAF_ADD_TYPE_ID(areal, (std::vector<int32_t>))
CAF_ADD_TYPE_ID(areal, (std::vector<areal::packed<areal::trajectory>>))
CAF_END_TYPE_ID_BLOCK(areal)
