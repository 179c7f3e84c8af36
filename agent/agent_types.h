// What AgentCore's callers exchange with it: the agent's options, a
// trainer's registration and handle, restore options and results, a
// trainer's persist status. The core itself is agent_core.h.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "agent/coordinator_client.h"
#include "base/clock.h"
#include "base/logger.h"
#include "base/thread_priority.h"
#include "ckptd/v1/agent.pb.h"
#include "ckptd/v1/coordinator.pb.h"
#include "ckptd/v1/shard.pb.h"
#include "replication/peer_network.h"
#include "replication/replica_store.h"
#include "replication/replicator.h"
#include "storage/file_system.h"
#include "storage/shard_writer.h"

namespace ckptd::agent {

struct TrainerRegistration;
class AgentObserver;

struct AgentOptions {
  std::string storage_root;
  // Staging memory one trainer may use; 0: exactly `slots` slots.
  uint64_t staging_budget_bytes = 0;
  uint32_t slots = 2;
  // Committed steps kept per job when the agent commits by itself.
  int keep_last = 2;
  // Threads shared by every persist and restore.
  int io_threads = 0;
  // The CPU priority of persists' CPU work: the pool's workers (which
  // compress and checksum) and the encoder of each memory checkpoint's
  // index. Each trainer's persister thread, which waits for the disk and
  // submits the writes, runs at nice 19 (never SCHED_IDLE: it could not be
  // raised again) with the lowest best-effort I/O priority, unless this is
  // kNormal. Restores then run on a pool of their own, at
  // normal priority: a trainer waits for them.
  base::ThreadPriority background_priority = base::ThreadPriority::kNormal;
  // Bounded starvation of those workers (base::StarvationGuard): once they
  // have got less than a tenth of the CPU they were runnable for over this
  // long, reserve workers at normal priority take their work until the pool
  // has been idle as long. Zero: never (a persist may then wait without
  // bound on a saturated CPU).
  absl::Duration starvation_limit = absl::Seconds(2);
  storage::ShardWriteOptions write;
  // Prefix of staging segment names (unique per agent process).
  std::string segment_prefix;
  // With a coordinator, every shard is reported to it and it commits; the
  // agent commits nothing itself, and restores follow its plans. Must
  // outlive the agent.
  CoordinatorClient* coordinator = nullptr;
  // Told of persists, restores, skipped snapshots and trainer deaths as they
  // happen (the agent's metrics, agent/agent_metrics.h); null: nobody. Must
  // outlive the agent.
  AgentObserver* observer = nullptr;
  // Bound on a restore of a job of several ranks, with or without a
  // coordinator (other ranks may be slower to load).
  absl::Duration restore_timeout = absl::Minutes(5);
  absl::Duration plan_poll = absl::Milliseconds(50);
  std::string node_id;
  // The trainers' group: staging segments are made read-write for it (0660)
  // instead of owner-only.
  std::optional<uint32_t> trainer_group;
  // The node-local tier (e.g. an NVMe mount; see agent/local_tier.h): when
  // set, each shard is written here first, its staging slot is handed back
  // to the trainer, and the file is then copied to the storage root (where
  // the step commits, as without the tier). Restores read the local copy
  // when it is the shard the step committed (same length and index digest)
  // and the storage root otherwise. A local write that fails falls back to
  // writing the storage root directly. Holds the newest `local_cache_keep`
  // steps per job.
  std::string local_cache;
  int local_cache_keep = 2;
  // The file system of the local tier (default: the agent's); must outlive
  // the agent.
  storage::FileSystem* local_fs = nullptr;
  // Where the component reports what an operator should read (default:
  // base::DefaultLogger()); must outlive it.
  base::Logger* logger = nullptr;
  // Measures and waits on time: the persisters' poll, WaitPersisted, the
  // coordinated restore's bound and plan polls, persist durations, and the
  // waits for a staging slot (default: base::RealClock::Get()); must outlive
  // the agent.
  base::Clock* clock = nullptr;
  // Failed persists are logged (WARNING) at most once per trainer per this
  // interval: the first failure at once, then one line saying how many more
  // failed since the last one. Zero logs every failure.
  absl::Duration persist_failure_log_interval = absl::Seconds(30);
  // The memory tier. All staging segments of the agent together, those of
  // trainers that exited included, stay within this many bytes (0: no
  // limit). A trainer that exits leaves its segment behind ("parked", with
  // the step it kept in memory) for its successor: a registration of the
  // same job, rank and buffers gets it back at once. Parked segments go,
  // least recently parked first, when a registration needs their memory,
  // when their rank registers other buffers, and after `park_for`.
  uint64_t memory_budget_bytes = 0;
  absl::Duration park_for = absl::Hours(1);
  // Registrations listed at once (kResourceExhausted beyond): each holds a
  // persister and an encoder thread, and one more while it exits. A process registering
  // its rank again replaces its registration and is not counted twice.
  // 0: no limit.
  uint32_t max_registrations = 1024;
  // Segments up to this size are allocated and faulted in within Register;
  // larger ones slot by slot in the background (the trainer's snapshots are
  // skipped until a slot is ready), so that no registration waits for
  // gigabytes of memory to be cleared.
  uint64_t prepare_inline_bytes = uint64_t{64} << 20;
  // Called before each slot is allocated in the background (tests hold the
  // allocation there to see what waits for it).
  std::function<void(uint32_t slot)> before_preparing_slot;
  // Called in Register once the staging is claimed and attached, before the
  // trainer is listed (tests register another trainer there).
  std::function<void(const TrainerRegistration& reg)> before_enlisting;
  // The first trainer id; 0 (the default): a random one, so that a trainer
  // of the agent before a restart, asking with its old id, is told it is
  // unknown rather than given another trainer's answers. Tests fix it.
  uint64_t first_trainer_id = 0;
  // Keep each persisted (or restored) step of a trainer in its staging slot
  // (KEPT) for a restore from memory, until the trainer takes the slot back
  // for a snapshot (the oldest kept step first, when it has no free slot).
  bool keep_in_memory = true;
  // Peer replication (replication/replicator.h, replication/peer_network.h;
  // null: off).
  // Each persisted step kept in memory is sent to the partners through
  // `replicator`; a restore whose plan names peers holding the step pulls it
  // through `peer_network` when this agent's memory has no copy; and the
  // copies `replicas` holds for partners make room for a registration that
  // needs the memory. Each must outlive the agent.
  replication::Replicator* replicator = nullptr;
  replication::PeerNetwork* peer_network = nullptr;
  replication::ReplicaStore* replicas = nullptr;
};

struct TrainerRegistration {
  std::string job;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // Ranks of the job on this node, as the trainer's launcher says
  // (LOCAL_WORLD_SIZE); 0: unknown.
  uint32_t local_world_size = 0;
  int32_t pid = 0;
  // Every buffer the trainer saves: name, component, dtype, shape, sharding,
  // device. The shape and dtype fix each buffer's size.
  std::vector<ckptd::v1::Tensor> buffers;
};

struct TrainerHandle {
  uint64_t trainer_id = 0;
  std::string segment;  // staging segment to open
  uint32_t slots = 0;
  uint64_t slot_bytes = 0;
  std::vector<uint64_t> offsets;  // per buffer, in registration order
  bool coordinated = false;       // the schedule comes from a coordinator
};

// Where a restore read its step (ckptd.v1.RestoreSource).
enum class RestoreSource { kNone, kMemory, kPeer, kLocal, kRoot };
ckptd::v1::RestoreSource RestoreSourceProto(RestoreSource source);

// What AgentCore tells its observer (AgentOptions::observer) as it happens,
// on the core's own threads, some while a trainer's lock is held: an
// observer only counts, and never calls back into the core.
class AgentObserver {
 public:
  virtual ~AgentObserver() = default;
  // A rank's snapshot of `job` is durable in storage: `bytes` written (the
  // shard file's length), `seconds` from the trainer's publish to durable.
  virtual void OnPersisted(const std::string& job, uint64_t bytes, double seconds) {}
  // A rank's snapshot of `job` was kept in memory as a memory checkpoint
  // (Schedule.durable_every) and reported, nothing written.
  virtual void OnMemoryCheckpoint(const std::string& job) {}
  // A persist of a rank's snapshot of `job` failed (a memory checkpoint's
  // too); one stopped by the agent's shutdown is not counted.
  virtual void OnPersistFailed(const std::string& job) {}
  // A restore handed a step over, read from `source`: `bytes` of the rank's
  // buffers, `seconds` from the trainer's call to the step in its slot.
  virtual void OnRestored(const std::string& job, RestoreSource source, uint64_t bytes, double seconds) {}
  // A restore failed (the trainer got an error, not a step or a fresh start).
  virtual void OnRestoreFailed(const std::string& job) {}
  // The trainer reported a snapshot it skipped (AgentCore::SnapshotSkipped).
  virtual void OnSnapshotSkipped(const std::string& job) {}
  // A trainer of `job` exited without saying goodbye (it died).
  virtual void OnTrainerDied(const std::string& job) {}
};

// A block of a restored buffer and its checksum.
struct BlockDigest {
  uint32_t buffer = 0;  // index in the registration
  uint64_t offset = 0;  // in the buffer
  uint64_t length = 0;
  uint64_t xxh3 = 0;
};

struct RestoreOptions {
  // Wait this long for a free staging slot to load into.
  absl::Duration wait_for_slot = absl::Seconds(5);
  // The trainer checks each block of a step handed over from memory while
  // it copies it out (RestoreResult::verify): the agent does not read the
  // bytes once more first.
  bool client_verifies = false;
  // The copy of this step handed over by the previous restore failed the
  // trainer's check: read the same step again, from disk.
  std::optional<uint64_t> reread_step;
  std::string reread_problem;
  // How long the caller waits (what its RPC deadline leaves): the restore
  // ends a moment before, within restore_timeout, with its own explanation
  // rather than the caller's bare "Deadline Exceeded".
  absl::Duration caller_timeout = absl::InfiniteDuration();
};

struct RestoreResult {
  std::optional<uint64_t> step;  // nullopt: nothing committed for this job
  uint32_t slot = 0;             // RESTORED slot holding every buffer
  uint64_t incarnation = 0;      // the coordinator's restore round (0 without one)
  RestoreSource source = RestoreSource::kNone;
  // With client_verifies, for a step from memory: every block the trainer
  // must check as it copies the slot out. Empty: the agent verified it.
  std::vector<BlockDigest> verify;
  // What the coordinator said the trainer should hear about this restore
  // (RestorePlanResponse.warning). Empty: nothing.
  std::string warning;
};

struct PersistStatus {
  // Durable persists only (written to storage); memory checkpoints are
  // counted below.
  std::optional<uint64_t> last_persisted_step;
  std::optional<uint64_t> last_committed_step;
  uint64_t persisted = 0;
  // Memory checkpoints (Schedule.durable_every) kept in memory and reported
  // to the coordinator, and the newest one's step.
  uint64_t memory_checkpoints = 0;
  std::optional<uint64_t> last_memory_step;
  // Persists that failed; the newest one's step and error.
  uint64_t failed = 0;
  std::optional<uint64_t> last_failed_step;
  absl::Status last_error;
  // Snapshots the trainer skipped (no free staging slot in time), as it
  // reported them; the newest one's step and reason.
  uint64_t skipped = 0;
  std::optional<uint64_t> last_skipped_step;
  std::string last_skip_reason;
  // With a node-local tier: shards written there first, shards that fell
  // back to the storage root because the local write failed (and why, the
  // newest), and restores served from the local copy.
  uint64_t local_writes = 0;
  uint64_t local_fallbacks = 0;
  absl::Status last_local_error;
  uint64_t local_restores = 0;
  // The memory tier: restores from the agent's memory, and kept copies
  // found damaged (and read from disk instead).
  uint64_t memory_restores = 0;
  uint64_t memory_rejected = 0;
  // Restores from a peer agent's copy, and copies pulled from a peer that
  // did not match (read elsewhere instead).
  uint64_t peer_restores = 0;
  uint64_t peer_rejected = 0;
  // Restores of a step saved by another number of ranks (or other slices),
  // read resharded from the storage root.
  uint64_t resharded_restores = 0;
  // Saved shards those restores opened (their indexes read): to plan by
  // itself (every saved shard) and to read (only those the plan names).
  uint64_t resharded_shards_opened = 0;
  // Staging slots ready (the rest are still being allocated), of `slots`.
  uint32_t slots_ready = 0;
  uint32_t slots = 0;
};

// How a memory checkpoint's shard is described (the file_length and index
// a write of it with these options would produce; nothing is written): the
// agent's `write` options with compression off (raw blocks of its block
// size) and one encoder thread, so that blocks are laid out in order (pass
// no pool, or one of a single thread). A memory checkpoint written to
// storage later must be written with the very same options to be the shard
// the coordinator was told of (and its index made with the same
// created_unix_nanos, which the digest covers).
storage::ShardWriteOptions MemoryShardOptions(const storage::ShardWriteOptions& write);

// A registered trainer as drills see it.
struct TrainerInfo {
  int32_t pid = 0;
  uint64_t step = 0;  // as its last SyncSchedule said
  std::string job;
  uint32_t rank = 0;
};

}  // namespace ckptd::agent
