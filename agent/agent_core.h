// The agent's decisions, without any RPC: trainer registration and staging,
// background persist of published snapshots (in step order, per rank), the
// commit of jobs whose ranks all run on this node when no coordinator is used,
// and restores into staging.
// The gRPC service that serves trainers over a Unix socket translates to this.
// One AgentCore, its definitions split by concern over agent/agent_*.cc
// (docs/agent.md), its private parts shared through agent_core_internal.h;
// what callers exchange with it (options, registrations, results) is
// agent_types.h.
#pragma once

#include <atomic>
#include <deque>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "agent/agent_types.h"
#include "agent/coordinator_client.h"
#include "agent/local_tier.h"
#include "base/clock.h"
#include "base/logger.h"
#include "base/thread_pool.h"
#include "base/thread_priority.h"
#include "ckptd/v1/agent.pb.h"
#include "ckptd/v1/manifest.pb.h"
#include "ckptd/v1/shard.pb.h"
#include "replication/peer_network.h"
#include "replication/replica_store.h"
#include "replication/replicator.h"
#include "staging/staging.h"
#include "storage/file_system.h"
#include "storage/reshard_plan.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"
#include "storage/store.h"

namespace ckptd::agent {

namespace internal {
enum class TrainerState;  // agent_core_internal.h
}  // namespace internal

class AgentCore {
 public:
  // `fs` must outlive the agent.
  AgentCore(storage::FileSystem* fs, AgentOptions options);
  // Stops the persisters after they finish the snapshots already published
  // (after BeginShutdown: as it says).
  ~AgentCore();
  AgentCore(const AgentCore&) = delete;
  AgentCore& operator=(const AgentCore&) = delete;

  // The agent is about to exit (SIGTERM), and must be gone by `deadline`:
  // from now on each persister persists the snapshots published and not
  // yet durable newest first, then older ones while time remains (none
  // older than a step this agent knows is committed; what is skipped is
  // said so), and a shard write still going at `deadline` stops there, leaving
  // nothing of the shard on disk (kCancelled) and nothing reported. Each
  // persist under way or started from now on ends with a line that says
  // which: durable and reported to the coordinator (or handed to this
  // agent's commit), or stopped. Returns at once; the destructor waits for
  // the persisters. Memory checkpoints are not written (they die with the
  // agent, as on any exit).
  void BeginShutdown(absl::Time deadline);

  // Where the agent's components report (AgentOptions::logger).
  base::Logger* logger() const { return logger_; }
  // How often persists' CPU work was handed to normal-priority threads
  // because it starved (AgentOptions::starvation_limit).
  int64_t starved_persists() const { return starved_persists_.load(std::memory_order_relaxed); }
  // The clock the agent's components measure time with (AgentOptions::clock).
  base::Clock* clock() const { return clock_; }

  // Checks the buffers (names, dtypes, shapes), creates the trainer's staging
  // segment and starts its persister. kInvalidArgument names the buffer at
  // fault; kResourceExhausted when the budget holds no slot, or when the
  // agent's memory budget cannot hold the segment (parked segments of
  // exited trainers are evicted first). A trainer that exited and left a
  // segment of the same job, rank, world size and buffers gets it back, and
  // with it the steps kept there, without any allocation.
  //
  // Without a coordinator the agent commits a job by itself, which it can do
  // only when every rank of the job registers with it: a registration whose
  // local_world_size is known and below its world size (ranks on other
  // nodes) is kFailedPrecondition, saying to run a coordinator; so is one
  // whose world size differs from that of a trainer of the job registered
  // now. A step of a job of N ranks commits once the shards of that step of
  // ranks 0..N-1 are durable, each written for the newest registration of
  // its rank (or the same process): a rank registered again from another
  // process (a restart) voids the shards of its predecessor that are not
  // committed yet.
  absl::StatusOr<TrainerHandle> Register(const TrainerRegistration& registration);

  // The trainer published `slot` holding `step`: wake its persister.
  absl::Status SnapshotPublished(uint64_t trainer_id, uint32_t slot, uint64_t step, double stall_seconds = 0);

  // The trainer's progress (from its client's background thread); returns
  // the job's schedule from the coordinator, if one is known.
  absl::StatusOr<std::optional<ckptd::v1::Schedule>> SyncSchedule(const ckptd::v1::SyncScheduleRequest& request);

  // The ranks this node hosts and their progress, for the coordinator.
  void FillHeartbeat(ckptd::v1::Heartbeat* heartbeat);

  // The trainer registered (most recently) for `rank` of `job`, if any.
  std::optional<TrainerInfo> FindTrainer(const std::string& job, uint32_t rank);
  // Every trainer registered with this agent (the newest per job and rank).
  std::vector<TrainerInfo> Trainers();
  // For drills (CORRUPT_MEMORY): flips one byte of the copy of `step` that
  // the trainer of `rank` of `job` keeps in memory (its KEPT slot), as a
  // stray write would, and says where. kNotFound when no trainer of the rank
  // is registered; kFailedPrecondition when it keeps no copy of `step`
  // (naming the steps it keeps); kUnavailable while it holds a newer
  // snapshot, being persisted or kept, that may still commit (a restart
  // would restore that one instead).
  absl::StatusOr<std::string> CorruptKeptStep(const std::string& job, uint32_t rank, uint64_t step);

  // The trainer skipped the snapshot of `step` for `reason` (kept up to
  // kMaxSkipReasonBytes): counted in its PersistStatus, which Status()
  // reports. kNotFound for an unknown trainer.
  static constexpr size_t kMaxSkipReasonBytes = 1024;
  absl::Status SnapshotSkipped(uint64_t trainer_id, uint64_t step, absl::string_view reason);

  // Reads the trainer's shard of the newest committed step of its job into a
  // staging slot (verifying every chunk). The shard must hold exactly the
  // registered buffers with the same dtypes and sizes; a difference is
  // kFailedPrecondition naming the buffer.
  //
  // Every rank of a job restores the same step. Without a coordinator the
  // agent runs the round itself: each rank loads the newest committed step
  // that is not quarantined and waits (up to restore_timeout) until all N
  // ranks have loaded it; a rank whose shard of it is damaged or missing
  // quarantines the step and sends every rank to the committed step before.
  // A rank that cannot load for another reason (its registration does not
  // fit, no slot) fails the round for all.
  //
  // With options.reread_step (the step the trainer's previous restore
  // handed over from memory failed its check), the same step is read again
  // from the disk tiers, outside any round; the memory copy is dropped and
  // counted as rejected. A memory checkpoint, which has no copy on disk, is
  // read again from the peers its restore plan named (kNotFound when none
  // holds it intact).
  absl::StatusOr<RestoreResult> Restore(uint64_t trainer_id, const RestoreOptions& options);
  absl::StatusOr<RestoreResult> Restore(uint64_t trainer_id, absl::Duration wait_for_slot) {
    RestoreOptions o;
    o.wait_for_slot = wait_for_slot;
    return Restore(trainer_id, o);
  }

  // The trainer process is gone: its half-filled slots are freed, published
  // snapshots are still persisted; then the trainer is forgotten and its
  // segment parked for its successor (see Register). `died`: it exited
  // without saying goodbye, a failure the coordinator hears of.
  // A successor that registers (same job, rank and layout) while those
  // snapshots are still written takes the segment over at once. A
  // registration from the same process (pid) as a registered trainer of the
  // same job and rank retires that one this way first.
  absl::Status TrainerExited(uint64_t trainer_id, bool died = false);
  // TrainerExited(id, died=true) for the process watcher: the trainer is
  // forgotten now, and the rest runs on a thread of its own (joined by the
  // destructor). Nothing happens for an id that is not registered.
  void TrainerDied(uint64_t trainer_id);

  // Waits until `step` of the trainer is persisted, kept as a memory
  // checkpoint, or failed, up to `timeout`.
  absl::StatusOr<PersistStatus> WaitPersisted(uint64_t trainer_id, uint64_t step, absl::Duration timeout);
  absl::StatusOr<PersistStatus> Status(uint64_t trainer_id);

  // The memory tier, for operators: staging bytes held (live and parked
  // segments), the budget, and the parked segments.
  struct MemoryUsage {
    uint64_t bytes = 0;
    uint64_t budget = 0;  // 0: no limit
    size_t parked = 0;
    uint64_t parked_bytes = 0;
    // The slots that keep a step in memory (live and parked segments):
    // their bytes.
    uint64_t kept_bytes = 0;
  };
  MemoryUsage Memory();
  // MemoryUsage::bytes alone, without a lock or a walk over the trainers
  // (the replica store asks at every partner's copy).
  uint64_t StagingBytes() const { return staging_bytes_->load(); }
  // Parked segments older than park_for go (also done at each registration
  // and trainer exit).
  void EvictIdle();

  // Emergency persists (HeartbeatAck.persist): after a failure the
  // coordinator orders the copies of the newest memory checkpoint that is not
  // durable written to storage by the nodes holding them. Returns at once;
  // the orders are carried out one at a time, in the order given, on a
  // thread of the agent's own, each once (by job, step, rank and
  // incarnation; one that failed is tried again when ordered again after
  // `kEmergencyRetry`). Without a coordinator, does nothing.
  void OnPersistOrders(const google::protobuf::RepeatedPtrField<ckptd::v1::PersistOrder>& orders);
  // The steps a restart of each job would restore (HeartbeatAck.committed:
  // the newest complete memory checkpoint newer than the newest usable
  // durable step, else that step): each trainer's staging of those jobs
  // keeps that step's copy last (StagingSegment::PinKept), so that a restart
  // finds it in memory even while newer steps have not committed; a live
  // trainer whose job is not listed has nothing pinned. Without a
  // coordinator the agent pins the steps it commits itself. Either way, a
  // restore pins the step it restored (and a fresh start, nothing).
  // Only the jobs the answer has a schedule for (those the heartbeat
  // listed) are touched; an answer of a coordinator that does not know
  // this agent (HeartbeatAck.known false) touches nothing.
  void OnCommittedSteps(const ckptd::v1::HeartbeatAck& ack);
  static constexpr absl::Duration kEmergencyRetry = absl::Seconds(10);
  static constexpr size_t kMaxOrdersRemembered = 4096;
  // A saved world of at most this many ranks keeps the shards it planned
  // from open for the reads (one descriptor each).
  static constexpr uint32_t kReshardReadersKeptOpen = 64;
  // Carries out one order now: the copy this node holds (a step its
  // trainers keep in memory, live or parked, or a copy held for a partner)
  // is written raw to the storage root as the shard that was reported
  // (MemoryShardOptions, the kept index's creation time), checked to be
  // that shard (the file goes again when it is not: the copy changed or is
  // damaged), and reported to the coordinator (ShardReport.emergency). The
  // report, or why there is none: kNotFound when no copy of it is held here.
  absl::StatusOr<ckptd::v1::ShardReport> EmergencyPersist(const ckptd::v1::PersistOrder& order);

 private:
  friend class AgentCoreLifecycleProbe;  // tests: a trainer's lifecycle state
  struct Trainer;
  // A step a trainer's segment keeps in memory (one per KEPT slot): the
  // slot, the step and the index its shard was written (or read) with, whose
  // blocks' checksums a restore from memory verifies.
  struct KeptStep {
    uint32_t slot = 0;
    uint64_t step = 0;
    uint64_t file_length = 0;
    uint64_t index_xxh3 = 0;
    std::shared_ptr<const ckptd::v1::ShardIndex> index;
  };
  // The segment of a trainer that exited, kept for its successor.
  struct Parked {
    std::string key;  // LayoutKey of the registration
    std::string job;
    uint32_t rank = 0;
    staging::StagingLayout layout;
    std::shared_ptr<staging::StagingSegment> segment;
    std::vector<KeptStep> kept;
    absl::Time since;
    // The trainer before, if it still writes its last snapshots into the
    // segment (the next one to take it over waits for that).
    std::shared_ptr<Trainer> draining;
  };
  // Without a coordinator, for each job: who registered each rank last, the
  // durable shards of steps not committed yet, and the restore round. Read
  // and written under lone_mu_ only.
  struct LoneRegistration {
    uint64_t trainer_id = 0;
    int32_t pid = 0;  // as the agent sees it; 0: unknown
  };
  struct LoneShard {
    ckptd::v1::ShardRef ref;
    LoneRegistration writer;
  };
  // Every rank loads the same step before any of them trains (see Restore).
  struct LoneRound {
    uint32_t world_size = 0;
    std::vector<uint64_t> steps;  // committed steps not quarantined, newest first
    size_t at = 0;                // the step being loaded: steps[at]; none left at steps.size()
    uint64_t attempt = 0;         // raised at each fall back to an older step
    std::set<uint32_t> loaded;    // ranks holding steps[at] intact
    bool go = false;              // every rank holds it: the round is over
    absl::Status failed;          // a rank could not load for another reason than damage
    absl::Status last_damage;
    // With no step in `steps` at the start: why a fresh start is held back
    // (committed steps exist, all quarantined, and the operator has not
    // allowed it; storage::CheckpointStore::AllowFreshStart), else empty.
    std::string held_back;
  };
  struct LoneJob {
    uint32_t world_size = 0;
    std::map<uint32_t, LoneRegistration> newest;                // by rank
    std::map<uint64_t, std::map<uint32_t, LoneShard>> pending;  // by step, then rank
    std::optional<uint64_t> committed;                          // newest step this agent committed
    bool warned_unseen_ranks = false;
    std::shared_ptr<LoneRound> round;
  };
  void PersistLoop(Trainer* t);
  // One published snapshot (its slot PERSISTING): kept in memory when it is
  // a memory checkpoint, else written; after BeginShutdown, memory
  // checkpoints are dropped and nothing is started once the grace period
  // ended.
  void PersistSlot(Trainer* t, uint32_t slot, base::ThreadPool* memory_encoder);
  // A restore found no step to restore (the job starts fresh): nothing
  // committed is pinned in `t`'s staging.
  void NoStepToRestore(Trainer* t);
  // Whether the snapshot of `step` is a memory checkpoint: the coordinator's
  // schedule for the trainer's job asks for it at `step` and not durable, and
  // the memory tier is on. Anything else (no coordinator, no schedule heard,
  // a step off the schedule such as a manual checkpoint) is persisted.
  bool IsMemoryCheckpoint(Trainer* t, uint64_t step);
  // The memory checkpoint of the snapshot in `slot` (PERSISTING): its shard
  // index is computed as a raw write would make it (MemoryShardOptions,
  // nothing written), the slot is KEPT and sent to the partners, and the
  // coordinator is told (ShardReport.memory_only). Nothing of it reaches
  // storage. A slot that cannot be kept is reported nowhere. `encoder`: the
  // trainer's (one worker, at the persists' priority, guarded).
  void KeepInMemory(Trainer* t, uint32_t slot, base::ThreadPool* encoder);
  // To the coordinator: a rank's step could not be made a checkpoint; and
  // the report of one that was (persist_seconds: `seconds`).
  void ReportPersistFailed(Trainer* t, uint64_t step, const absl::Status& s);
  ckptd::v1::ShardReport ShardReportOf(Trainer* t, uint64_t step, double stall, uint64_t incarnation,
                                       const storage::ShardWriteResult& written, double seconds);
  // The trainer's stall for the snapshot in `slot` (forgotten now: the slot
  // may hold the next snapshot once released) and its restore round, for
  // the shard report.
  void TakeReportStamps(Trainer* t, uint32_t slot, double* stall, uint64_t* incarnation);
  // When the trainer published the snapshot of `step` in `slot`
  // (SnapshotPublished), forgotten now; `otherwise` when it did not say.
  absl::Time TakePublishedAt(Trainer* t, uint32_t slot, uint64_t step, absl::Time otherwise);
  // What to write of the snapshot in `slot`: every buffer, a replicated one
  // as this rank's share of it (storage::ShareSources, hashed on `pool`).
  absl::StatusOr<std::vector<storage::TensorSource>> SlotSources(Trainer* t, uint32_t slot, base::ThreadPool* pool);
  // Counts the outcome `s` of the persist of `step` in the trainer's
  // PersistStatus and reports it to the logger, rate-limited (see
  // AgentOptions::persist_failure_log_interval).
  // NotePersisted's counterpart after BeginShutdown: says what became of
  // the persist, whatever it was.
  void NoteShutdownPersist(Trainer* t, uint64_t step, const absl::Status& s);
  void NotePersisted(Trainer* t, uint64_t step, const absl::Status& s);
  // A persist of `step` that failed in its write: what it left of the step
  // goes, in the local tier and in the storage root: the rank's partial
  // file, and the step's directory when nothing else is in it (no MANIFEST,
  // no other rank's shard) and no other persist of this agent writes it.
  void CleanUpFailedStep(Trainer* t, uint64_t step);
  // A persist of this agent writes `job`'s `step` from Begin to End (its
  // directory is not removed meanwhile; see CleanUpFailedStep).
  void BeginWriting(const std::string& job, uint64_t step);
  void EndWriting(const std::string& job, uint64_t step);
  // Persists `slot`; calls `release` as soon as the slot's bytes are no
  // longer needed (after the local write when there is a local tier).
  // What was written goes to `written` (when the write succeeded).
  absl::Status PersistOne(Trainer* t, uint32_t slot, const std::function<void()>& release,
                          storage::ShardWriteResult* written);
  // Writes the shard of `step` through the local tier (which calls `release`
  // before its copy to the storage root), or straight to the storage root.
  absl::StatusOr<storage::ShardWriteResult> WriteShard(Trainer* t, uint64_t step,
                                                       absl::Span<const storage::TensorSource> sources,
                                                       const std::function<void()>& release);
  // The local tier's steps of `job` above `step` go (see LocalTier).
  void DropLocalStepsAbove(const std::string& job, uint64_t step);
  // Without a coordinator: records the durable shard `written` of `step` of
  // the trainer and commits the step once every rank's shard of it is
  // durable (see Register).
  absl::Status CommitAlone(Trainer* t, uint64_t step, const storage::ShardWriteResult& written);
  // Every trainer of `job`, and `committer`, learns that `step` committed
  // (PersistStatus).
  void MarkCommitted(const std::string& job, uint64_t step, Trainer* committer);
  // The restore round without a coordinator (see Restore).
  // How one restore call loads, and what its load found.
  struct LoadCall {
    absl::Duration wait_for_slot;
    bool client_verifies = false;
    bool from_memory = true;  // may use the memory tier
    // Other nodes' agents holding the step in memory (the coordinator's plan).
    std::vector<ckptd::v1::PeerCopy> peers;
    // Copies in other agents' memory (LoadFromPeers' source ids: a node id,
    // or "/held" for the copy this agent holds for a partner) not to read
    // again: a reread skips those that failed the trainer's check.
    std::set<std::string> skip_sources;
    // The source id of the copy handed over ("": not from a peer's memory).
    std::string handed_from;
    // A memory checkpoint (RestorePlanResponse.memory_step): the rank's shard
    // as its agent reported it, which a copy in memory (own or a peer's) must
    // be instead of the MANIFEST's entry. There is no copy on disk.
    std::optional<ckptd::v1::ShardRef> expected;
    // The step's MANIFEST, read once by LoadStep (none for a memory
    // checkpoint, or when it could not be read).
    std::optional<ckptd::v1::StepManifest> manifest;
    RestoreSource source = RestoreSource::kNone;
    // The step was read resharded (another world, or other slices): the
    // number of ranks that saved it. 0: read as saved.
    uint32_t resharded_from = 0;
    std::vector<BlockDigest> verify;
    // How long the restore may take: restore_timeout, or less to end before
    // its caller gives up (RestoreOptions::deadline).
    absl::Duration timeout;
  };
  absl::StatusOr<RestoreResult> RestoreLocal(Trainer* t, LoadCall* call);
  // The round `t` takes part in: the one under way for its job, or a new one
  // over the job's committed steps as storage lists them now.
  absl::StatusOr<std::shared_ptr<LoneRound>> JoinRound(Trainer* t);
  absl::StatusOr<RestoreResult> RestoreCoordinated(Trainer* t, LoadCall* call);
  // A rank of a lone round that found `step` damaged or missing (`damage`):
  // the step is quarantined and, unless another rank did so first (another
  // `attempt`), the round goes on to the step before.
  void QuarantineInRound(Trainer* t, LoneRound* r, uint64_t step, uint64_t attempt, const absl::Status& damage);
  // How a rank's wait in a lone round ended, once it loaded `step`.
  struct RoundOutcome {
    enum Kind { kGo, kAgain, kFailed, kTimedOut } kind = kAgain;
    size_t loaded = 0;    // kTimedOut: the ranks that loaded the step
    absl::Status failed;  // kFailed
  };
  // Counts t's rank as loaded and waits (up to `deadline`) until every rank
  // has, a rank found the step damaged, the round failed, or the agent
  // shuts down.
  RoundOutcome AwaitLoneRound(Trainer* t, LoneRound* r, uint64_t step, uint64_t attempt, absl::Time deadline,
                              absl::Duration timeout);
  // Restore's two ways: the round (with or without a coordinator), and a
  // reread of the step handed over from memory (RestoreOptions::reread_step).
  absl::StatusOr<RestoreResult> RestoreRound(Trainer* t, LoadCall* call);
  absl::StatusOr<RestoreResult> Reread(Trainer* t, const RestoreOptions& options, LoadCall* call);
  // The coordinator's FRESH_START: nothing to restore, from round `incarnation`.
  RestoreResult StartFresh(Trainer* t, uint64_t incarnation);
  // The coordinator's LOAD: loads the plan's step and records the attempt in
  // `req`; the slot it is in, nullopt when damaged or missing (`req` says
  // why), or the error the trainer must hear (no slot, a registration that
  // does not fit).
  absl::StatusOr<std::optional<uint32_t>> LoadPlanned(Trainer* t, const ckptd::v1::RestorePlanResponse& plan,
                                                      LoadCall* call, ckptd::v1::RestorePlanRequest* req);
  // A restore's result for `step` loaded into `slot` by `call`.
  RestoreResult Restored(Trainer* t, uint64_t step, uint32_t slot, LoadCall* call, uint64_t incarnation);
  // Reads the trainer's shard of `step` into a staging slot (RESTORED), or
  // an error: kDataLoss/kNotFound for a damaged or missing shard,
  // kFailedPrecondition for one that does not match the registration.
  // `source` says which copy served it. A memory checkpoint
  // (call->expected) is read from memory only, this agent's or a peer's:
  // kNotFound naming it when no intact copy is left.
  absl::StatusOr<uint32_t> LoadStep(Trainer* t, uint64_t step, LoadCall* call);
  // A step kept in the trainer's memory, when it is the shard `step` must be
  // (ExpectedRef: the MANIFEST's, or the plan's for a memory checkpoint) and
  // every block's checksum matches: its slot, now RESTORED. nullopt
  // otherwise (a damaged copy is counted, reported and dropped).
  // With call->client_verifies the bytes are not checked here: the blocks
  // and their checksums go to call->verify, for the trainer to check.
  std::optional<uint32_t> LoadFromMemory(Trainer* t, uint64_t step, LoadCall* call);
  // The step from the first copy held for partners here or by one of
  // `call->peers` that is the shard `step` must be (ExpectedRef) of this
  // trainer's layout, copied into a staging slot (RESTORED) and checked
  // like a copy from memory; nullopt when none has it (each failure is
  // logged and counted).
  absl::StatusOr<std::optional<uint32_t>> LoadFromPeers(Trainer* t, uint64_t step, LoadCall* call);
  // A staging slot of `t` to restore into, waiting `wait` for one, and
  // while the slots are still being allocated for them (up to
  // restore_timeout).
  absl::StatusOr<uint32_t> AcquireRestoreSlot(Trainer* t, absl::Duration wait);
  // Copies a peer's copy of `step` into `slot` through `fetch` (which hands
  // the copy's header to the sink it is given, then fills what the sink
  // returned); kept there (the KeptStep it is now) once the header matches
  // `ref` and the trainer's layout.
  using CopyFetch = std::function<absl::Status(const replication::ReplicaSink& sink)>;
  absl::StatusOr<KeptStep> PullCopy(Trainer* t, uint64_t step, uint32_t slot, const ckptd::v1::ShardRef& ref,
                                    const CopyFetch& fetch);
  // The kept step in RESTORING `kept.slot` is verified (by the agent, or,
  // with call->client_verifies, its blocks go to call->verify for the
  // trainer) and published RESTORED; false (slot freed, `rejected` counted)
  // when it is damaged.
  bool HandOverKept(Trainer* t, const KeptStep& kept, LoadCall* call, absl::string_view from, uint64_t* rejected);
  // The shard a copy of `step` must be: call.expected for a memory
  // checkpoint (it has no MANIFEST), else the committed MANIFEST's entry for
  // the trainer's rank.
  absl::StatusOr<ckptd::v1::ShardRef> ExpectedRef(Trainer* t, uint64_t step, const LoadCall& call);
  // The committed MANIFEST's entry for the trainer's rank at `step` (from
  // call.manifest when LoadStep read it).
  absl::StatusOr<ckptd::v1::ShardRef> CommittedRef(Trainer* t, uint64_t step, const LoadCall& call);
  // Queues the step just kept in `kept.slot` for the partners.
  void Replicate(Trainer* t, const KeptStep& kept);
  // Checks every block of the kept step against its checksum in the kept
  // index, on the agent's threads: kDataLoss naming the buffer and bytes.
  absl::Status VerifyKept(Trainer* t, const KeptStep& kept);
  // The blocks of the kept step, per registered buffer, with their
  // checksums; kFailedPrecondition when its index does not match the
  // registration, kDataLoss when the index does not cover each buffer.
  absl::StatusOr<std::vector<BlockDigest>> KeptBlocks(Trainer* t, const KeptStep& kept);
  // `kept.slot` of the trainer now keeps `kept` (the other kept slots stay).
  void SetKept(Trainer* t, KeptStep kept);
  // Memory copies of `job` above `step` are dropped (a restore went back).
  void DropKeptAbove(const std::string& job, uint64_t step);
  // The trainer exited: its segment is parked for its successor (see
  // Register), or released.
  // Allocates the trainer's PREPARING slots (the persister, before anything else).
  void PrepareSlots(Trainer* t);
  // Before `t`'s persister takes READY slots: the trainer whose segment it
  // took over is done with its own.
  void WaitForPredecessor(Trainer* t);
  // The trainers before `t` that may still write into its segment, nearest
  // first.
  std::vector<std::shared_ptr<Trainer>> Predecessors(Trainer* t);
  // The next READY slot `t`'s persister takes: any, or after its exit only
  // those it left (Trainer::exit_drain).
  std::optional<uint32_t> NextReady(Trainer* t);
  // TrainerExited's two halves: forgotten (and in exiting_), then drained,
  // reported and parked (or its kept steps handed to the successor).
  absl::StatusOr<std::shared_ptr<Trainer>> BeginExit(uint64_t trainer_id);
  absl::StatusOr<std::shared_ptr<Trainer>> BeginExitLocked(uint64_t trainer_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FinishExit of `t` (begun) on a thread of its own (exit_threads_); where
  // no thread can be started, queued for the next one (or the destructor).
  void FinishExitInBackground(std::shared_ptr<Trainer> t, bool died);
  // kResourceExhausted naming AgentOptions::max_registrations when that many
  // trainers are registered (a same-process registration of `reg`'s rank
  // not counted: it is retired).
  absl::Status CheckRegistrationCapLocked(const TrainerRegistration& reg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FinishExit of each exit queued (pending_exits_) until none is left.
  void FinishPendingExits() ABSL_LOCKS_EXCLUDED(exit_mu_);
  // The registered trainers of `reg`'s process (pid) and rank, but `except`:
  // begun to exit (under mu_), their FinishExit for the caller to start.
  std::vector<std::shared_ptr<Trainer>> RetireSameProcessLocked(const TrainerRegistration& reg, uint64_t except)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BeginExit now, FinishExit on a thread of its own (exit_threads_).
  void ExitInBackground(uint64_t trainer_id, bool died);
  void FinishExit(std::shared_ptr<Trainer> t, bool died);
  // FinishExit's end for a trainer whose segment another took over: its
  // kept steps go to whoever holds the segment now.
  void HandKeptOnLocked(const Trainer& t, std::vector<KeptStep> kept) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FinishExit's end otherwise: the segment parked for a successor (with
  // `kept`, and `before` if still writing into it), unless a call of the
  // trainer still uses it; parked segments pushed out go to `evicted`.
  void ParkLocked(const std::shared_ptr<Trainer>& t, std::vector<KeptStep> kept, std::shared_ptr<Trainer> before,
                  std::vector<Parked>* evicted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Register's steps. What a registration takes over or frees, decided
  // under mu_ (ClaimStagingLocked) and carried out after it.
  struct Claim {
    std::optional<Parked> reuse;                     // the segment its predecessor parked
    bool reused = false;                             // `reuse` was attached (AttachSegment)
    std::shared_ptr<Trainer> adopt;                  // a predecessor still draining: its segment
    std::vector<Parked> evicted;                     // released outside the lock
    std::vector<std::shared_ptr<Trainer>> retired;   // the same process's earlier registrations
    absl::Status refused;                            // the memory budget holds no new segment
  };
  // t's staging layout from the buffers' lengths, and the slots it gets.
  absl::StatusOr<uint32_t> PlanStaging(Trainer* t, const std::vector<uint64_t>& lengths);
  // The segment `t` takes over (parked, or of a predecessor still draining),
  // else the memory reserved for a new one within the budget.
  void ClaimStagingLocked(const std::shared_ptr<Trainer>& t, uint32_t slots, uint64_t need, Claim* claim)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReserveBudgetLocked(const Trainer& t, uint32_t slots, uint64_t need, Claim* claim)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Outside mu_: the parked segments the claim evicted go, the retired
  // registrations finish their exit.
  void ReleaseClaimed(const TrainerRegistration& reg, Claim* claim);
  // Copies held for partners make room for `reg`'s staging under the budget.
  void ShedPartnersCopiesFor(const TrainerRegistration& reg);
  // t's segment: the claimed one, or a new one of `slots` slots (`need` bytes,
  // reserved; given back when it cannot be made).
  absl::Status AttachSegment(Trainer* t, Claim* claim, uint32_t slots, uint64_t need);
  // `t` joins the registered trainers (its lone job, its persister), unless
  // the lone world check fails again: then the claim is undone.
  absl::Status EnlistLocked(const std::shared_ptr<Trainer>& t, Claim* claim) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UndoClaimLocked(const std::shared_ptr<Trainer>& t, Claim* claim) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The one place a trainer's lifecycle state changes (TrainerMoveAllowed),
  // with the lists that follow from it: registered -> trainers_, exiting or
  // taken over -> exiting_, retired -> neither. `successor`: the trainer that
  // takes the segment over (to kTakenOver only). A move the lifecycle does not
  // allow changes nothing and is kInternal (logged).
  absl::Status MoveLocked(const std::shared_ptr<Trainer>& t, internal::TrainerState to,
                          std::shared_ptr<Trainer> successor = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Without a coordinator: kFailedPrecondition when another trainer of the
  // job is registered with another world size.
  absl::Status CheckLoneWorldLocked(const TrainerRegistration& reg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Parked segments that are too old go into `out`, to be destroyed
  // outside the lock.
  void EvictIdleLocked(std::vector<Parked>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // LoadStep from one open shard.
  absl::StatusOr<uint32_t> LoadFrom(Trainer* t, uint64_t step, storage::ShardReader& reader,
                                    absl::Duration wait_for_slot);
  // LoadStep of a step saved by another number of ranks than the trainer's
  // job runs now, or with other slices of its sharded buffers (elastic
  // restore; docs/elastic.md): from the storage root, each sharded buffer
  // put together from the parts of the saved shards that hold its slice
  // (block-granular reads, each block verified), each buffer without a
  // global layout read whole from the shard of the same rank, or of rank
  // `rank mod saved world` for a rank the saved world did not have.
  // kFailedPrecondition naming the buffer when the saved tensors cannot
  // make it (another dtype or global shape, slices that leave part of it
  // uncovered), kDataLoss/kNotFound for a damaged or missing shard.
  // Which slices of which saved shards fill t's buffers: the coordinator's
  // plan (checked), unless not `ask_coordinator`, or, without one, planned
  // from every saved shard's index (some kept open in `readers` for the
  // reads). `planned`: the coordinator's.
  using ReshardReaders = std::map<uint32_t, std::unique_ptr<storage::ShardReader>>;
  absl::StatusOr<std::vector<storage::PlannedRead>> PlanResharded(Trainer* t, uint64_t step,
                                                                  const ckptd::v1::StepManifest& manifest,
                                                                  ReshardReaders* readers, bool* planned,
                                                                  bool ask_coordinator);
  // LoadResharded's reads of one step, and what they found.
  struct ReshardRead {
    uint64_t step = 0;
    const ckptd::v1::StepManifest* manifest = nullptr;
    // The saved rank whose buffers without a global layout this rank gets.
    uint32_t own = 0;
    ReshardReaders readers;  // opened already
    // Per buffer without a global layout: the identity of the whole its
    // replica group's shares make ("": saved whole, not shared).
    std::map<size_t, std::string> whole_of;
    std::set<uint32_t> ranks;  // the saved shards read
    // This rank's own saved index (the same world only), once read.
    std::shared_ptr<const ckptd::v1::ShardIndex> own_index;
    bool plan_wrong = false;  // the shards hold other slices than the plan says
  };
  // With a coordinator's plan: rr->whole_of from rank rr->own's saved index.
  absl::Status NoteGroupWholes(Trainer* t, const std::vector<storage::PlannedRead>& reads, ReshardRead* rr);
  // Every planned read into `data` (a staging slot), each checked first.
  absl::Status ReadPlanned(Trainer* t, const std::vector<storage::PlannedRead>& reads, uint8_t* data,
                           ReshardRead* rr);
  // Whether `reader` holds what read `r` takes, where the plan says.
  absl::Status CheckPlannedRead(Trainer* t, storage::ShardReader& reader, const storage::PlannedRead& r,
                                ReshardRead* rr);
  // The step in `slot` as this rank's own saved shard (to keep in memory),
  // when its index describes it; a slot whose bytes it does not check out
  // sets `*read` (kDataLoss).
  std::optional<KeptStep> OwnShardIn(Trainer* t, uint32_t slot, ReshardRead* rr, absl::Status* read);
  // Opens `rank`'s shard of committed `step` for a resharded restore (counted).
  absl::StatusOr<std::unique_ptr<storage::ShardReader>> OpenSavedShard(Trainer* t, uint64_t step,
                                                                       const ckptd::v1::StepManifest& manifest,
                                                                       uint32_t rank);
  // Reads committed `step` resharded: the slices of the saved shards that
  // hold t's buffers. A coordinator's plan that does not fit the files is
  // dropped for one made from them.
  // `*resharded` says whether it was (false: the rank's own buffers put
  // together from its replica group's shares, as saved).
  absl::StatusOr<uint32_t> LoadResharded(Trainer* t, uint64_t step, const ckptd::v1::StepManifest& manifest,
                                         absl::Duration wait_for_slot, bool* resharded, bool ask_coordinator = true);
  std::shared_ptr<Trainer> Find(uint64_t trainer_id);
  // A copy of a memory checkpoint held here, as an emergency persist writes
  // it: one source per buffer, the memory they point into kept alive, and
  // whether that memory still holds the step (a trainer may take its kept
  // slot back meanwhile).
  struct HeldCopy {
    std::string from;  // for the log
    std::vector<storage::TensorSource> sources;
    int64_t created_unix_nanos = 0;
    std::shared_ptr<const void> keep_alive;
    std::function<bool()> still_held;
  };
  // The copy of the order's step and rank that is the shard it names
  // (length and index digest), from this node's trainers (live, then
  // parked) or the copies held for partners; kNotFound otherwise.
  absl::StatusOr<HeldCopy> FindHeldCopy(const ckptd::v1::PersistOrder& order);
  // FindHeldCopy's last resort: the copy held here for a partner (nullopt: none).
  absl::StatusOr<std::optional<HeldCopy>> PartnersCopy(const ckptd::v1::PersistOrder& order);

  storage::FileSystem* const fs_;
  const AgentOptions options_;
  // BeginShutdown: whether it was called, and when shard writes stop (unix
  // nanoseconds of clock_; never before).
  std::atomic<bool> shutting_down_{false};
  std::atomic<int64_t> stop_writes_at_{std::numeric_limits<int64_t>::max()};
  // options_.write, stopped at stop_writes_at_ (set in the constructor).
  storage::ShardWriteOptions write_;
  base::Logger* const logger_ = options_.logger != nullptr ? options_.logger : &base::DefaultLogger();
  base::Clock* const clock_ = options_.clock != nullptr ? options_.clock : base::RealClock::Get();
  storage::CheckpointStore store_;
  // The guard of the pools that run persists' CPU work at
  // background_priority.
  base::StarvationGuard PersistGuard();
  std::atomic<int64_t> starved_persists_{0};
  base::ThreadPool pool_;
  // Restores' reads and checks: pool_, or with a background_priority a pool
  // at normal priority (a restore must not wait behind persists, nor run idle).
  std::unique_ptr<base::ThreadPool> own_restore_pool_;
  base::ThreadPool* restore_pool_ = &pool_;
  // Null without a local tier.
  std::unique_ptr<LocalTier> local_;
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;  // from AgentOptions::first_trainer_id
  std::map<uint64_t, std::shared_ptr<Trainer>> trainers_ ABSL_GUARDED_BY(mu_);  // kRegistered
  // The memory tier: segments of exited trainers (least recently parked
  // first), and the bytes of every segment, live or parked.
  std::vector<Parked> parked_ ABSL_GUARDED_BY(mu_);
  // Trainers that exited, while their persister writes what they left READY
  // (kExiting, kTakenOver).
  std::vector<std::shared_ptr<Trainer>> exiting_ ABSL_GUARDED_BY(mu_);
  // TrainerDied's threads (each done once its trainer is parked).
  struct ExitThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  absl::Mutex exit_mu_;
  std::vector<ExitThread> exit_threads_ ABSL_GUARDED_BY(exit_mu_);
  // Exits begun and not finished yet, oldest first: each exit thread
  // finishes them until none is left (FinishPendingExits).
  struct PendingExit {
    std::shared_ptr<Trainer> trainer;
    bool died = false;
  };
  std::deque<PendingExit> pending_exits_ ABSL_GUARDED_BY(exit_mu_);
  // The bytes of every segment this agent maps (live, exiting, parked, or
  // still held by a copy under way), reserved under mu_ before a segment is
  // made and given back by the segment's deleter when its last user lets
  // go: shared, since a partner's transfer may hold a segment past the core.
  std::shared_ptr<std::atomic<uint64_t>> staging_bytes_ = std::make_shared<std::atomic<uint64_t>>(0);
  // Persists of this agent under way, by job and step: the directory of a
  // step that one of them writes is not removed (CleanUpFailedStep).
  absl::Mutex writing_mu_;
  std::map<std::pair<std::string, uint64_t>, int> writing_ ABSL_GUARDED_BY(writing_mu_);
  // Commits and retention of one job are serialised (one committer per job).
  absl::Mutex commit_mu_;
  // Without a coordinator: the jobs this agent commits, and their restore
  // rounds. Never held while persisting, loading or committing.
  absl::Mutex lone_mu_;
  std::map<std::string, LoneJob> lone_ ABSL_GUARDED_BY(lone_mu_);
  // Emergency persists ordered, by job, step, rank and incarnation: when
  // one that failed may be tried again (nullopt: done or under way).
  using OrderKey = std::tuple<std::string, uint64_t, uint32_t, uint64_t>;
  absl::Mutex orders_mu_;
  std::map<OrderKey, std::optional<absl::Time>> orders_ ABSL_GUARDED_BY(orders_mu_);
  // Last: its queued orders run before anything they use goes.
  base::ThreadPool emergency_pool_{1};
};

}  // namespace ckptd::agent
