// The coordinator's decisions, without any RPC: agent membership and
// heartbeats, the checkpoint schedule every rank evaluates, failure detection
// (lost nodes, dead and hung trainers), the two-phase global commit, retention,
// and restore plans that bring every rank back to the same intact step.
// The gRPC service translates protos to calls on this class; tests drive it
// directly with a fake clock and an in-memory file system.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/logger.h"
#include "ckptd/v1/coordinator.pb.h"
#include "coordinator/state_store.h"
#include "policy/interval_policy.h"
#include "policy/two_level.h"
#include "protocol/schedule.h"
#include "storage/store.h"

namespace ckptd::coordinator {

namespace internal {
class Job;
class DrillBook;
class ReshardLayouts;
struct IntervalView;
struct MemoryTiers;
}  // namespace internal

struct CoordinatorOptions {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // A node whose heartbeats stop for this long is lost.
  absl::Duration node_lost_after = absl::Seconds(5);
  // A rank without step progress for max(hang_floor, hang_multiple x the
  // job's step time) is hung.
  double hang_multiple = 20;
  absl::Duration hang_floor = absl::Seconds(60);
  // The checkpoint interval in steps: always (interval_automatic false), or
  // until the interval policy has measured what it needs (docs/interval.md).
  uint64_t every_steps = 100;
  // The interval policy: Daly's optimum for the job's MTBF (from the failure
  // rate observed over GPU-hours, with `failure_prior`) and its measured
  // checkpoint cost, within [min_interval, max_interval] (zero: no bound),
  // never shorter than the persist time, changed only past `hysteresis`
  // (relative). Decided every `decide_every`.
  bool interval_automatic = true;
  policy::FailurePrior failure_prior;
  // How the prior splits over failure classes (process, node, wide), for the
  // two cadences (policy/two_level.h).
  policy::FailureMix failure_mix;
  // Every durable_every-th checkpoint is durable, the others memory
  // checkpoints; 0: the policy chooses (policy/two_level.h). With a fixed
  // interval (interval_automatic false) 0 means 1: every checkpoint durable.
  uint64_t durable_every = 0;
  absl::Duration min_interval = absl::Seconds(10);
  absl::Duration max_interval = absl::Hours(6);
  absl::Duration alternative_interval = absl::Minutes(30);  // reported beside the decision
  absl::Duration restart_guess = absl::Minutes(5);          // R until a restart is measured
  double hysteresis = 0.2;
  absl::Duration decide_every = absl::Seconds(10);
  // Whether Tick() also removes what retention dropped; false when the caller
  // runs RunRetention() on a thread of its own (the service does).
  bool retention_in_tick = true;
  // A step still incomplete this long after its first shard is aborted.
  absl::Duration step_deadline = absl::Minutes(30);
  // Committed steps kept per job (at least 1; quarantined steps are extra).
  int keep_last = 2;
  // Limits on what a request may carry.
  uint32_t max_world_size = 1u << 20;
  // Limits on what the coordinator tracks: a registration of one node more,
  // or a request naming one job more, is kResourceExhausted.
  size_t max_nodes = 10'000;
  size_t max_jobs = 1'000;
  // What the nodes' registrations and heartbeats may hold in this
  // coordinator's memory together (their addresses, GPU names and ranks, as
  // CoordinatorCore::RegistrationBytes counts them): a registration that
  // would pass it is kResourceExhausted, and a heartbeat's new ranks past it
  // are left out. Sized for 10,000 nodes of 64 ranks each, a few times over.
  size_t max_registration_bytes = size_t{512} << 20;
  // A node lost this long ago, and a job none of whose ranks ran for this
  // long (with no step pending), are forgotten: gone from the status and
  // the state database. A forgotten job's committed steps stay in storage,
  // and a coordinator started later finds them again.
  absl::Duration forget_after = absl::Hours(24 * 7);
  size_t max_events_listed = 10'000;
  // Peer replication: the partners are recomputed after a change of the
  // agents that take part (registration, loss, another peer address or
  // failure domain), at most this often, so that thousands of agents
  // registering at once do not recompute thousands of times.
  absl::Duration partners_recompute_every = absl::Milliseconds(250);
  // Replicated coordinators: asked before anything is written to storage or
  // the state store (a commit, a removal, a record). Not OK (this replica
  // no longer leads): nothing is written, the effects are dropped, and the
  // replica's core is about to be discarded. Unset: always allowed.
  std::function<absl::Status()> may_write;
  // Replicated coordinators: the leadership's epoch, sent with every
  // registration and heartbeat answer (agents refuse older ones); 0 alone.
  uint64_t epoch = 0;
  // Replicated coordinators: carries a KILL_COORDINATOR drill out (this
  // process dies soon after the answer goes out) and returns this replica's
  // address. Null: the scenario is refused.
  std::function<std::string()> kill_self = nullptr;
  // Where the component reports what an operator should read (default:
  // base::DefaultLogger()); must outlive it.
  base::Logger* logger = nullptr;
};

// What a registration replaced: the node's previous registration, as the
// service's audit trail reports it (CoordinatorCore::RegisterAgent).
struct PreviousRegistration {
  bool known = false;  // the node had registered before (and is not forgotten)
  bool alive = false;  // ... and counted as alive: a re-registration of a live node
  // A live node registered by another agent process (instance): declared
  // lost, its jobs restart.
  bool agent_restarted = false;
  std::string from;  // what the service said the previous registration came from
  absl::Time at;     // when it was made
};

// What the service layer (and metrics) need to know about every decision.
struct CoordinatorCounters {
  uint64_t committed = 0;
  uint64_t aborted = 0;
  std::map<ckptd::v1::FailureKind, uint64_t> failures;
};

// Observations the coordinator hands to whoever exports metrics.
class CoordinatorObserver {
 public:
  virtual ~CoordinatorObserver() = default;
  virtual void OnShardReported(const ckptd::v1::ShardReport& report) {}
  // `bytes`: the length of the step's shard files together.
  virtual void OnCommitted(const std::string& job, uint64_t step, absl::Duration last_report_to_manifest,
                           uint64_t bytes) {}
  virtual void OnAborted(const std::string& job, uint64_t step, const std::string& why) {}
  virtual void OnFailure(const ckptd::v1::FailureEvent& event) {}
  // A restart found committed steps of `job` but none intact, and holds back
  // until the operator allows a fresh start; the fresh start it then makes.
  virtual void OnRestoreBlocked(const std::string& job, const std::string& why) {}
  virtual void OnFreshStartOverDamaged(const std::string& job, uint64_t newest_damaged) {}
};

class CoordinatorCore {
 public:
  // Everything passed in must outlive the core. `observer` may be null.
  CoordinatorCore(storage::CheckpointStore* store, StateStore* state, base::Clock* clock, CoordinatorOptions options,
                  CoordinatorObserver* observer = nullptr);
  ~CoordinatorCore();
  CoordinatorCore(const CoordinatorCore&) = delete;
  CoordinatorCore& operator=(const CoordinatorCore&) = delete;

  // Reads what a previous coordinator left: committed steps from the
  // manifests in storage; schedules, timings, counters and quarantined steps
  // from the state store. Call once before serving.
  absl::Status Recover();

  // Agent-facing. Every request is validated; a bad one changes nothing. A
  // session the coordinator does not know (it restarted, or declared the node
  // lost) is kNotFound: the agent registers again.
  // `from` says where the registration came from (the service: the caller's
  // address); kept with it, and handed back in `*previous` (when given) by
  // the node's next registration, with what that one replaced.
  absl::StatusOr<ckptd::v1::RegisterAgentResponse> RegisterAgent(const ckptd::v1::RegisterAgentRequest& request,
                                                                 absl::string_view from = {},
                                                                 PreviousRegistration* previous = nullptr);
  absl::StatusOr<ckptd::v1::HeartbeatAck> OnHeartbeat(const ckptd::v1::Heartbeat& heartbeat);
  absl::StatusOr<ckptd::v1::ReportShardResponse> ReportShard(const ckptd::v1::ReportShardRequest& request);
  absl::Status ReportFailure(const ckptd::v1::ReportFailureRequest& request);
  absl::StatusOr<ckptd::v1::RestorePlanResponse> GetRestorePlan(const ckptd::v1::RestorePlanRequest& request);
  // Which slices of which saved shards fill the asking rank's buffers, for
  // a committed step it reads resharded (coordinator_reshard.cc). The
  // step's layout is read from storage once and kept for the other ranks.
  absl::StatusOr<ckptd::v1::ReshardPlanResponse> GetReshardPlan(const ckptd::v1::ReshardPlanRequest& request);
  // Steps whose layout GetReshardPlan read from storage (once each while kept).
  uint64_t reshard_layouts_read() const;

  // Operator-facing.
  absl::StatusOr<ckptd::v1::RequestCheckpointResponse> RequestCheckpoint(
      const ckptd::v1::RequestCheckpointRequest& request);
  // Orders a drill from the agent of the node concerned (sent with its
  // heartbeat answers until it reports). kFailedPrecondition when that agent
  // is down or was not started with --allow-drills.
  absl::StatusOr<ckptd::v1::RunDrillResponse> RunDrill(const ckptd::v1::RunDrillRequest& request);
  // A drill's order, the agent's report, and the failures recorded since.
  absl::StatusOr<ckptd::v1::DrillStatus> GetDrill(const ckptd::v1::GetDrillRequest& request);
  // Everything at once: for this process (metrics, tests).
  ckptd::v1::GetClusterStatusResponse ClusterStatus();
  // When each job's newest commit was made (its MANIFEST written, by this
  // coordinator or, found at recovery, before it); jobs without one are left out.
  std::map<std::string, absl::Time> LastCommitTimes() ABSL_LOCKS_EXCLUDED(mu_);
  // One page of it, for operators (GetClusterStatusRequest): the agents
  // after request.agents_after whose status fits kStatusPageBytes (at least
  // one), the jobs on the first page.
  ckptd::v1::GetClusterStatusResponse ClusterStatusPage(const ckptd::v1::GetClusterStatusRequest& request);
  static constexpr size_t kStatusPageBytes = size_t{2} << 20;
  // What one node's registration holds in memory, as counted against
  // max_registration_bytes: its address, GPU names and ranks, and what
  // the coordinator keeps beside each. `gpus` and `ranks`: any ranges of
  // them (a request's repeated fields, or what the core keeps).
  template <typename Gpus, typename Ranks>
  static size_t RegistrationBytes(const std::string& address, const Gpus& gpus, const Ranks& ranks) {
    size_t bytes = 1024 + address.size();  // the node's own record
    for (const std::string& g : gpus) bytes += g.size() + sizeof(std::string);
    for (const ckptd::v1::RankInfo& r : ranks) bytes += RankBytes(r);
    return bytes;
  }
  static size_t RankBytes(const ckptd::v1::RankInfo& rank);
  absl::StatusOr<ckptd::v1::ListEventsResponse> ListEvents(const ckptd::v1::ListEventsRequest& request);
  absl::StatusOr<ckptd::v1::IntervalStatus> GetInterval(const ckptd::v1::GetIntervalRequest& request);
  // Every step of the job: committed and quarantined ones from storage,
  // pending and recently aborted ones from memory. kNotFound for a job
  // neither knows.
  absl::StatusOr<ckptd::v1::ListStepsResponse> ListSteps(const ckptd::v1::ListStepsRequest& request);
  // The step a restart would restore now and why, without starting a round.
  absl::StatusOr<ckptd::v1::RestorePreview> GetRestorePreview(const ckptd::v1::RestorePreviewRequest& request);
  // Reads a committed step (the newest usable one unless named) back from
  // storage and checks every chunk, calling `progress` after each shard. A
  // step found damaged is quarantined, so that no restore picks it. Runs on
  // the caller's thread, without the coordinator's lock.
  absl::StatusOr<ckptd::v1::VerifyProgress> VerifyStep(
      const ckptd::v1::VerifyStepRequest& request,
      const std::function<void(const ckptd::v1::VerifyProgress&)>& progress = {});
  CoordinatorCounters Counters();

  // Periodic work (the service calls it a few times per heartbeat interval):
  // declares lost nodes and hung ranks, aborts steps past their deadline,
  // saves changed job records, and (with retention_in_tick) removes the steps
  // retention dropped.
  void Tick();

  // Removes the steps retention dropped, in paced batches that wait while a
  // commit is in flight (storage::CheckpointStore::RemovePacing). Tick calls
  // it with retention_in_tick; otherwise the caller runs it on a thread of
  // its own, so that a removal of thousands of files never delays failure
  // detection.
  // `stop` (when set) is asked before each step: once it says so, the steps
  // not removed yet stay queued, so that a coordinator stopping waits for
  // one step's removal at most, not for a backlog of them (a leader taking
  // over a job whose previous leader fell behind).
  void RunRetention(const std::function<bool()>& stop = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  const CoordinatorOptions& options() const { return options_; }

 private:
  // The core's private types are in coordinator_core_internal.h, job.h and
  // drill_book.h; its definitions are spread over coordinator_*.cc by
  // concern. Each decision runs under mu_ and leaves its side effects in an
  // Effects, which Apply carries out after mu_ is released, so that disk and
  // database latency never blocks heartbeats.
  using Job = internal::Job;
  struct Agent;
  struct Effects;
  struct CommitResult;

  // Membership, failure detection and saving (coordinator_core.cc).
  // The live agent registered as `node` in `session`; kNotFound otherwise
  // (it registers again).
  absl::StatusOr<Agent*> AgentInSession(const std::string& node, const std::string& session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // kPermissionDenied unless `node` may speak for `rank` of `job`: the rank
  // runs there, or is not known to run anywhere. With `moving` (the rank
  // would move to `node`), also when its trainer is dead or the node it ran
  // on is gone (a rank restarted on another node).
  absl::Status CheckSpeaksFor(const Job& job, uint32_t rank, const std::string& node, bool moving) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Checks what a rank's request names: the node id, the job's name, and
  // the rank inside a world of 1..max_world_size. kInvalidArgument.
  absl::Status ValidateRankRequest(const std::string& node_id, const std::string& job, uint32_t rank,
                                   uint32_t world_size) const;
  Job* FindJob(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Job*> JobFor(const std::string& name, uint32_t world_size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // JobFor for `rank`, which `node` lists or asks for, once
  // CheckSpeaksFor(moving) allows it against the job as it is: a node
  // cannot resize a job through a rank it may not speak for.
  absl::StatusOr<Job*> JobForRank(const std::string& name, uint32_t world_size, uint32_t rank,
                                  const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts `agent`'s address, GPU names and ranks as they are now in
  // registration_bytes_.
  void SetRegistrationBytes(Agent* agent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Job::RefreshRank. A rank that comes back to a job whose run had
  // finished starts a new run under the old name, which restores the old
  // run's newest step and trains only past it: warned of (the log, and
  // Job::reuse_warning for the new run's restore plans), and a new restore
  // round opens for it (no failure is recorded: nothing failed).
  void RefreshRank(Job* job, uint32_t rank, const std::string& node, int32_t pid, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ckptd::v1::GetClusterStatusResponse Status(const ckptd::v1::GetClusterStatusRequest& request, size_t page_bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Marks `agent` lost: its ranks dead, a NODE_LOST failure for each of its
  // jobs (they restart).
  void LoseAgent(Agent* agent, const std::string& detail, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Declares the hung ranks of `job`; returns how many of its ranks are alive.
  uint32_t FindHungRanks(Job* job, absl::Time now, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SaveJob(Job* job, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the nodes and jobs past options_.forget_after.
  void Forget(absl::Time now, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SaveChangedJobs(Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ckptd::v1::JobStatus StatusOf(const Job& job) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Peer replication (coordinator_replication.cc): partners and their
  // tickets, and the copies of steps agents hold in memory.
  // Recomputes every agent's partners when the agents that take part
  // changed and the last recomputation is partners_recompute_every old
  // (`force`: whatever its age).
  void MaybeRecomputePartners(absl::Time now, bool force = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `agent` is lost (or restarted): its partnerships end at once (their
  // tickets with them) and the copies it held are forgotten.
  void EndReplication(Agent* agent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replaces what `agent` holds in memory by what `hb` lists (bounded,
  // validated; the holder is always `agent`, whatever owner_node says).
  void RecordMemory(Agent* agent, const ckptd::v1::Heartbeat& hb) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The agent's send_to and receive_from, with their tickets.
  void AddPartners(const Agent& agent, ckptd::v1::HeartbeatAck* ack) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether `agent` holds its own copy of `rank`'s committed `step`.
  bool HoldsOwnCopy(const Agent& agent, const Job& job, uint32_t rank, uint64_t step) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The other alive agents with a Peer service that hold `rank`'s committed
  // `step` in memory (a copy of the MANIFEST's shard), not `exclude`: those
  // outside `domain` first, then by node id; at most kMaxPlanPeers.
  std::vector<const Agent*> PeerHolders(const Job& job, uint32_t rank, uint64_t step, const std::string& exclude,
                                        const std::string& domain) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The newest complete memory checkpoint newer than the newest durable
  // step whose every rank has a copy in a live agent's memory.
  std::optional<uint64_t> NewestMemoryRestorable(const Job& job) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A plan of a memory checkpoint: the rank's shard as reported, which its
  // copy in memory is checked against (there is no MANIFEST).
  void AddMemoryExpectation(const Job& job, uint32_t rank, ckptd::v1::RestorePlanResponse* plan) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Fills a LOAD plan's peers for the asking agent.
  void AddPlanPeers(const Agent& asker, const Job& job, uint32_t rank, ckptd::v1::RestorePlanResponse* plan) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // GetRestorePreview's part under the lock: all but what it reads from storage.
  absl::StatusOr<ckptd::v1::RestorePreview> PreviewLocked(const ckptd::v1::RestorePreviewRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Where each rank of `job` would read `step` from (RestorePreview.ranks).
  void AddRankSources(const Job& job, uint64_t step, ckptd::v1::RestorePreview* preview) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Ranks of `job`'s `step` that an agent other than the rank's host holds
  // in memory.
  uint32_t PeerCopies(const Job& job, uint64_t step) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The alive agent of `node`, or null.
  const Agent* AliveAgent(const std::string& node) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Heartbeats (coordinator_heartbeat.cc): the ranks an agent reports, their
  // progress, and the answer (schedules and drill orders).
  // A rank listed with another trainer process than the one whose progress
  // was recorded was restarted: a failure (its agent's report may follow).
  void RefreshMembership(Agent* agent, const ckptd::v1::Heartbeat& hb, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordProgress(const Agent& agent, const ckptd::v1::RankProgress& progress, absl::Time now, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ckptd::v1::HeartbeatAck HeartbeatReply(const Agent& agent, const ckptd::v1::Heartbeat& hb)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Shards and the global commit (coordinator_commit.cc).
  // `report` from `node`, whose shard file was found as reported or not
  // (`file_check`): true when it completed its step.
  absl::StatusOr<bool> AcceptShard(const std::string& node, const ckptd::v1::ShardReport& report,
                                   const absl::Status& file_check, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The shard of a report AcceptShard let through becomes pending (the step
  // commits when it is the last).
  absl::StatusOr<bool> AddShardOf(Job* job, const ckptd::v1::ShardReport& report, const absl::Status& file_check,
                                  bool emergency, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortPending(Job* job, uint64_t step, const std::string& why, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a reported shard's file exists with the reported length; called
  // without mu_ (a stat per report).
  absl::Status CheckShardFile(const ckptd::v1::ShardReport& report) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<absl::Status> CheckShardFiles(const google::protobuf::RepeatedPtrField<ckptd::v1::ShardReport>& reports)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Commit(const std::string& job, uint64_t step, uint32_t world_size,
                      const std::vector<ckptd::v1::ShardRef>& shards) ABSL_LOCKS_EXCLUDED(mu_);
  // The locked step after commits: what each result means for its job (the
  // step committed or aborted, older pending steps aborted, the steps
  // retention drops queued). Leaves what follows in `next`.
  void AfterCommits(std::vector<CommitResult>& results, Effects* next) ABSL_LOCKS_EXCLUDED(mu_);
  void AfterCommit(CommitResult& result, Effects* next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Carries out `fx` (commits, removal of aborted steps, database writes,
  // observer calls, logging); it decides nothing, and takes mu_ only for
  // AfterCommits once the commits' results are known.
  void Apply(Effects& fx) ABSL_LOCKS_EXCLUDED(mu_);
  // Drills: RunDrill's work under mu_; the drills changed since the last
  // call into `fx`; their records saved (the newest state of each, read
  // under drill_save_mu_ so that a save never overwrites a newer one).
  absl::StatusOr<ckptd::v1::RunDrillResponse> OrderDrill(const ckptd::v1::RunDrillRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  void NoteDrillChanges(Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SaveDrills(const std::vector<uint64_t>& ids) ABSL_LOCKS_EXCLUDED(mu_, drill_save_mu_);

  // Failures and restore rounds (coordinator_restore.cc).
  void RecordFailure(Job* job, const std::string& node, std::optional<uint32_t> rank, ckptd::v1::FailureKind kind,
                     const std::string& detail, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartRestoreRound(Job* job, Effects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a failure: orders the newest memory checkpoint that every rank can
  // still be restored from written to storage (Job::Emergency), each rank's
  // copy by its own node's agent when it holds it, else by a partner holding
  // one; withdraws the order when no such checkpoint is left.
  void OrderEmergencyPersist(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `agent` holds a copy of `rank`'s `step` (its own or a partner's).
  bool CopyHeldBy(const Agent& agent, const Job& job, uint32_t rank, uint64_t step) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The emergency persists `agent` is to carry out (HeartbeatAck.persist).
  void AddPersistOrders(const Agent& agent, ckptd::v1::HeartbeatAck* ack) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // An emergency persist's report from `node` is one that was ordered, of
  // the copy the memory checkpoint's report described.
  absl::Status CheckEmergencyReport(const Job& job, const std::string& node, const ckptd::v1::ShardReport& report) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The rank a plan request asks for runs on the asking agent's node now
  // (its next heartbeat says so too).
  void HostRank(Agent* agent, Job* job, const ckptd::v1::RestorePlanRequest& request, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks a committed step damaged: never restored again, kept by retention.
  void Quarantine(Job* job, uint64_t step, std::optional<uint32_t> rank, const std::string& reason, Effects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The schedule: manual targets and the interval policy (coordinator_interval.cc).
  // Steps ahead of the fastest rank that every rank hears of a target first.
  uint64_t ManualLead(const Job& job) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The interval policy for `job` with what has been measured so far.
  internal::IntervalView IntervalFor(const Job& job) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether every node with a live rank of `job` keeps its snapshots in
  // memory, and sends them to a partner.
  internal::MemoryTiers TiersOf(const Job& job) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Moves the job to the policy's interval when it differs enough.
  void DecideInterval(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new every_steps and durable_every from a step ahead of every rank (see .cc).
  void Reschedule(Job* job, uint64_t every_steps, uint64_t durable_every) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  storage::CheckpointStore* const store_;
  StateStore* const state_;
  base::Clock* const clock_;
  const CoordinatorOptions options_;
  base::Logger* const logger_ = options_.logger != nullptr ? options_.logger : &base::DefaultLogger();
  CoordinatorObserver* const observer_;

  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Agent>> agents_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  CoordinatorCounters counters_ ABSL_GUARDED_BY(mu_);
  // The sum of the agents' `registration_bytes` (max_registration_bytes).
  size_t registration_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_tick_ ABSL_GUARDED_BY(mu_);
  const std::unique_ptr<internal::DrillBook> drills_ ABSL_PT_GUARDED_BY(mu_);
  absl::Mutex drill_save_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // The layouts of steps read resharded (its own lock; read outside mu_).
  const std::unique_ptr<internal::ReshardLayouts> reshard_layouts_;
  // Committed steps retention dropped (queued by AfterCommit), removed by
  // the next RunRetention().
  std::vector<std::pair<std::string, uint64_t>> retention_queue_ ABSL_GUARDED_BY(mu_);
  // Peer replication. The ticket of each partnership (sender, receiver):
  // 128 random bits as 32 hex digits, kept while the pair exists, never
  // saved, logged or shown to operators. Who holds which rank's steps in
  // memory: (job, rank) -> the nodes whose heartbeats list a step of it.
  std::map<std::pair<std::string, std::string>, std::string> tickets_ ABSL_GUARDED_BY(mu_);
  bool partners_dirty_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time partners_computed_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::map<std::pair<std::string, uint32_t>, std::set<std::string>> holders_ ABSL_GUARDED_BY(mu_);
  // One committer per job (storage::CheckpointStore's rule).
  absl::Mutex commit_mu_ ABSL_ACQUIRED_AFTER(mu_);
  // Replicated coordinators: the step each job's previous leader had written
  // its commit intent for when this one took over. That leader may still
  // write the step's MANIFEST (paused between its intent and the rename), so
  // the step's files are never removed here: only committed.
  struct ForeignIntent {
    uint64_t step = 0;
    bool kept_once = false;  // an abort was refused (and said so) once
  };
  std::map<std::string, ForeignIntent> foreign_intents_ ABSL_GUARDED_BY(commit_mu_);
  // Commits under way, which retention waits out between its batches.
  absl::Mutex inflight_mu_;
  int commits_in_flight_ ABSL_GUARDED_BY(inflight_mu_) = 0;
};

// Buffers a reshard plan is made for, at most (a rank's registration).
inline constexpr size_t kMaxReshardBuffers = size_t{1} << 20;

// Checks a node id the way job names are checked: [A-Za-z0-9._-]{1,128}.
absl::Status ValidateNodeId(absl::string_view node_id);

}  // namespace ckptd::coordinator
