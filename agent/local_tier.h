// The agent's node-local tier (e.g. an NVMe mount under the checkpoint
// directory layout): each shard is written there first, so that the
// trainer's staging slot is handed back before the slower durable copy to the
// storage root (where the step commits, as without the tier); a restore reads
// the local copy when it is exactly the shard the step committed. A local
// write that fails costs the tier, not the checkpoint: the shard is written
// to the storage root directly. The tier holds the newest `keep` steps of
// each job, and its newest committed step.
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
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "base/logger.h"
#include "base/thread_pool.h"
#include "storage/file_system.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"
#include "storage/store.h"

namespace ckptd::agent {

// What the tier did for one trainer (the local_* fields of PersistStatus).
struct LocalTierStats {
  uint64_t writes = 0;     // shards written to the tier first
  uint64_t fallbacks = 0;  // shards written to the storage root directly
  absl::Status last_error;  // why the newest fallback happened
  uint64_t restores = 0;   // restores served from the tier's copy
};

// LocalTierStats kept up to date by the tier; one per trainer. Thread-safe.
class LocalTierCounters {
 public:
  LocalTierStats Get() {
    absl::MutexLock l(&mu_);
    return stats_;
  }

 private:
  friend class LocalTier;
  absl::Mutex mu_;
  LocalTierStats stats_ ABSL_GUARDED_BY(mu_);
};

// One shard of a step: the trainer's rank of `job`.
struct ShardId {
  std::string job;
  uint64_t step = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
};

struct LocalTierOptions {
  // The tier's directory (AgentOptions::local_cache) and its file system.
  std::string dir;
  storage::FileSystem* fs = nullptr;
  // Steps kept per job (at least 1).
  int keep = 2;
  storage::ShardWriteOptions write;
  // Threads for writes and reads; required.
  base::ThreadPool* pool = nullptr;
  // Threads for reads (restores) instead of `pool`; null: `pool`.
  base::ThreadPool* read_pool = nullptr;
  // Required.
  base::Logger* logger = nullptr;
};

class LocalTier {
 public:
  // `root` is the storage root the shards are copied to and whose MANIFESTs
  // say which local copy may be read. Every pointer in `options` and `root`
  // must outlive the tier. Cleans up what a killed predecessor left: its
  // half-written files go, finished shards stay (a restore may use them),
  // down to the newest `keep` steps of each job.
  LocalTier(LocalTierOptions options, storage::CheckpointStore* root);
  LocalTier(const LocalTier&) = delete;
  LocalTier& operator=(const LocalTier&) = delete;

  const std::string& dir() const { return options_.dir; }

  // Persists `shard` from `sources`: writes it to the tier, calls `release`
  // (the sources are no longer read), copies the file durably into the
  // storage root (its step directory prepared there) and prunes the tier.
  // When the local write fails, the shard is written to the storage root
  // directly instead: a fallback, reported to the logger and counted in
  // `counters` with its reason ("node-local tier <dir>: ..."), and `release`
  // is not called. Returns the shard as written, or what failed in the
  // storage root; kCancelled when `write.stop` stopped the local write or
  // the copy (no fallback then, and nothing of the shard in the root).
  absl::StatusOr<storage::ShardWriteResult> Persist(const ShardId& shard,
                                                    absl::Span<const storage::TensorSource> sources,
                                                    const std::function<void()>& release,
                                                    LocalTierCounters* counters);

  // Restore side. When the tier holds exactly the shard that the committed
  // step's MANIFEST in the storage root names for `shard.rank` (same length
  // and index digest), runs `read` on it and returns what `read` returned:
  // OK (counted in `counters` as a local restore), or an error that reading
  // the storage root would not cure (kFailedPrecondition: the shard does not
  // fit what reads it; kDeadlineExceeded, kResourceExhausted: nothing to read
  // into). Returns nullopt when the storage root's copy should be read
  // instead: no such local copy, or one that `read` found unreadable (with a
  // warning; a damaged one, kDataLoss, is removed, as is one that cannot be
  // opened for damage).
  std::optional<absl::Status> Read(const ShardId& shard,
                                   const std::function<absl::Status(storage::ShardReader&)>& read,
                                   LocalTierCounters* counters);

  // A restore went back to `step` of `job`: the tier's newer steps are from a
  // run that is gone and are removed, except those being written or copied.
  void DropStepsAbove(const std::string& job, uint64_t step);

  // The persist of `shard` failed: its step never commits, so its copy in
  // the tier is never read. The copy (and a temp file) goes, and the step's
  // directory too when nothing else is in it and no write of that step to
  // the tier is under way; a directory holding another rank's shard stays.
  void Discard(const ShardId& shard);

  // The step directories of `job` in the tier, in ascending order. A link (or
  // anything but a directory) in place of the job's or a step's directory is
  // reported to the logger and left out.
  std::vector<uint64_t> Steps(const std::string& job);

 private:
  // Keeps the newest `keep` steps of `job`, and the newest committed one
  // (what a restart restores) when newer ones are not committed yet; never
  // one being written or copied, nor any newer than that.
  void Prune(const std::string& job);
  // Removes the tier's directory of `step` when it is empty and no write of
  // the step is under way (an empty one would count as a step kept).
  void RemoveStepIfUnused(const std::string& job, uint64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The local copy of `shard`, opened, when it is the one the MANIFEST
  // names; else nullptr.
  std::unique_ptr<storage::ShardReader> OpenCommitted(const ShardId& shard);

  const LocalTierOptions options_;
  storage::CheckpointStore* const root_;
  storage::CheckpointStore store_;
  absl::Mutex mu_;
  // Steps of each job being written to the tier or copied from it.
  std::map<std::string, std::multiset<uint64_t>> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd::agent
