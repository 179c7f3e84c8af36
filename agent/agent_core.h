// The agent's decisions, without any RPC: trainer registration and staging,
// background persist of published snapshots (in step order, per rank), the
// single-rank commit when no coordinator is used, and restores into staging.
// The gRPC service that serves trainers over a Unix socket translates to this.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/coordinator_link.h"
#include "agent/staging.h"
#include "ckptd/v1/agent.pb.h"
#include "ckptd/v1/shard.pb.h"
#include "storage/file_system.h"
#include "storage/shard_writer.h"
#include "storage/store.h"
#include "storage/thread_pool.h"

namespace ckptd::agent {

struct AgentOptions {
  std::string storage_root;
  // Staging memory one trainer may use; 0: exactly `slots` slots.
  uint64_t staging_budget_bytes = 0;
  uint32_t slots = 2;
  // Committed steps kept per job when the agent commits by itself.
  int keep_last = 2;
  // Threads shared by every persist and restore.
  int io_threads = 0;
  storage::ShardWriteOptions write;
  // Prefix of staging segment names (unique per agent process).
  std::string segment_prefix;
  // With a coordinator, every shard is reported to it and it commits; the
  // agent commits nothing itself, and restores follow its plans. Must
  // outlive the agent.
  CoordinatorClient* coordinator = nullptr;
  // Bound on a coordinated restore (other ranks may be slower to load).
  absl::Duration restore_timeout = absl::Minutes(5);
  absl::Duration plan_poll = absl::Milliseconds(50);
  std::string node_id;
};

struct TrainerRegistration {
  std::string job;
  uint32_t rank = 0;
  uint32_t world_size = 1;
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

struct RestoreResult {
  std::optional<uint64_t> step;  // nullopt: nothing committed for this job
  uint32_t slot = 0;             // RESTORED slot holding every buffer
  uint64_t incarnation = 0;      // the coordinator's restore round (0 without one)
};

struct PersistStatus {
  std::optional<uint64_t> last_persisted_step;
  std::optional<uint64_t> last_committed_step;
  uint64_t persisted = 0;
  uint64_t failed = 0;
  absl::Status last_error;
  // Snapshots the trainer skipped (no free staging slot in time), as it
  // reported them; the newest one's step and reason.
  uint64_t skipped = 0;
  std::optional<uint64_t> last_skipped_step;
  std::string last_skip_reason;
};

// A registered trainer as drills see it.
struct TrainerInfo {
  int32_t pid = 0;
  uint64_t step = 0;  // as its last SyncSchedule said
  std::string job;
  uint32_t rank = 0;
};

class AgentCore {
 public:
  // `fs` must outlive the agent.
  AgentCore(storage::FileSystem* fs, AgentOptions options);
  // Stops the persisters after they finish the snapshots already published.
  ~AgentCore();
  AgentCore(const AgentCore&) = delete;
  AgentCore& operator=(const AgentCore&) = delete;

  // Checks the buffers (names, dtypes, shapes), creates the trainer's staging
  // segment and starts its persister. kInvalidArgument names the buffer at
  // fault; kResourceExhausted when the budget holds no slot.
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

  // The trainer skipped the snapshot of `step` for `reason` (kept up to
  // kMaxSkipReasonBytes): counted in its PersistStatus, which Status()
  // reports. kNotFound for an unknown trainer.
  static constexpr size_t kMaxSkipReasonBytes = 1024;
  absl::Status SnapshotSkipped(uint64_t trainer_id, uint64_t step, absl::string_view reason);

  // Reads the trainer's shard of the newest committed step of its job into a
  // staging slot (verifying every chunk). The shard must hold exactly the
  // registered buffers with the same dtypes and sizes; a difference is
  // kFailedPrecondition naming the buffer.
  absl::StatusOr<RestoreResult> Restore(uint64_t trainer_id, absl::Duration wait_for_slot);

  // The trainer process is gone: its half-filled slots are freed, published
  // snapshots are still persisted; then the trainer is forgotten. `died`:
  // it exited without saying goodbye, a failure the coordinator hears of.
  absl::Status TrainerExited(uint64_t trainer_id, bool died = false);

  // Waits until `step` of the trainer is persisted (or failed), up to `timeout`.
  absl::StatusOr<PersistStatus> WaitPersisted(uint64_t trainer_id, uint64_t step, absl::Duration timeout);
  absl::StatusOr<PersistStatus> Status(uint64_t trainer_id);

 private:
  struct Trainer;
  void PersistLoop(Trainer* t);
  absl::Status PersistOne(Trainer* t, uint32_t slot);
  absl::StatusOr<RestoreResult> RestoreLocal(Trainer* t, absl::Duration wait_for_slot);
  absl::StatusOr<RestoreResult> RestoreCoordinated(Trainer* t, absl::Duration wait_for_slot);
  // Reads the trainer's shard of `step` into a staging slot (RESTORED), or
  // an error: kDataLoss/kNotFound for a damaged or missing shard,
  // kFailedPrecondition for one that does not match the registration.
  absl::StatusOr<uint32_t> LoadStep(Trainer* t, uint64_t step, absl::Duration wait_for_slot);
  std::shared_ptr<Trainer> Find(uint64_t trainer_id);

  storage::FileSystem* const fs_;
  const AgentOptions options_;
  storage::CheckpointStore store_;
  storage::ThreadPool pool_;
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::shared_ptr<Trainer>> trainers_ ABSL_GUARDED_BY(mu_);
  // Commits and retention of one job are serialised (one committer per job).
  absl::Mutex commit_mu_;
};

}  // namespace ckptd::agent
