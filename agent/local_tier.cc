#include "agent/local_tier.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/layout.h"

namespace ckptd::agent {

LocalTier::LocalTier(LocalTierOptions options, storage::CheckpointStore* root)
    : options_(std::move(options)), root_(root), store_(options_.fs, options_.dir) {
  absl::StatusOr<std::vector<std::string>> jobs = store_.ListJobs();
  if (!jobs.ok()) return;  // nothing there yet, or unreadable: the writes will say
  for (const std::string& job : *jobs) {
    for (uint64_t step : Steps(job)) {
      const std::string dir = storage::StepDir(options_.dir, job, step);
      absl::StatusOr<std::vector<storage::FileInfo>> files = options_.fs->ListDir(dir);
      if (!files.ok()) continue;
      for (const storage::FileInfo& f : *files) {
        // Best effort: a leftover is only wasted space.
        if (absl::EndsWith(f.name, storage::kTempSuffix)) (void)options_.fs->RemoveFile(storage::JoinPath(dir, f.name));
      }
    }
    Prune(job);
  }
}

absl::StatusOr<storage::ShardWriteResult> LocalTier::Persist(const ShardId& shard,
                                                             absl::Span<const storage::TensorSource> sources,
                                                             const std::function<void()>& release,
                                                             LocalTierCounters* counters) {
  absl::Status why;
  {
    {
      absl::MutexLock l(&mu_);
      in_flight_[shard.job].insert(shard.step);
    }
    absl::Cleanup done = [&] {
      absl::MutexLock l(&mu_);
      std::multiset<uint64_t>& steps = in_flight_[shard.job];
      steps.erase(steps.find(shard.step));
    };
    absl::Status prepared = store_.PrepareStep(shard.job, shard.step);
    absl::StatusOr<storage::ShardWriteResult> local =
        prepared.ok() ? store_.WriteShard(shard.job, shard.step, shard.rank, shard.world_size, sources,
                                          options_.write, options_.pool)
                      : absl::StatusOr<storage::ShardWriteResult>(prepared);
    if (local.ok()) {
      release();  // the trainer may snapshot into the slot again while the copy runs
      {
        absl::MutexLock l(&counters->mu_);
        ++counters->stats_.writes;
      }
      CKPTD_RETURN_IF_ERROR(root_->PrepareStep(shard.job, shard.step));
      // Stopped as the writes are (the end of a shutdown's grace period):
      // kCancelled with nothing of the copy in the storage root, which the
      // caller reports as stopped, not failed, and cleans up as any failed
      // persist (Discard).
      storage::CopyOptions copy;
      copy.stop = options_.write.stop;
      CKPTD_RETURN_IF_ERROR(
          storage::CopyFileDurably(options_.fs, storage::ShardPath(options_.dir, shard.job, shard.step, shard.rank),
                                   root_->fs(), storage::ShardPath(root_->root(), shard.job, shard.step, shard.rank),
                                   copy)
              .status());
      Prune(shard.job);
      return local;
    }
    // A full or failing local disk costs the tier, not the checkpoint; a
    // write stopped (the agent shuts down) is no reason to write the root.
    why = absl::Status(local.status().code(),
                       absl::StrCat("node-local tier ", options_.dir, ": ", local.status().message()));
  }
  {
    absl::MutexLock l(&mu_);
    RemoveStepIfUnused(shard.job, shard.step);
  }
  if (absl::IsCancelled(why)) return why;
  options_.logger->Warning(absl::StrCat("job ", shard.job, " rank ", shard.rank, " step ", shard.step, ": ",
                                        why.message(), "; writing the storage root directly"));
  {
    absl::MutexLock l(&counters->mu_);
    ++counters->stats_.fallbacks;
    counters->stats_.last_error = why;
  }
  CKPTD_RETURN_IF_ERROR(root_->PrepareStep(shard.job, shard.step));
  return root_->WriteShard(shard.job, shard.step, shard.rank, shard.world_size, sources, options_.write,
                           options_.pool);
}

std::unique_ptr<storage::ShardReader> LocalTier::OpenCommitted(const ShardId& shard) {
  absl::StatusOr<ckptd::v1::StepManifest> manifest = root_->ReadManifest(shard.job, shard.step);
  if (!manifest.ok()) return nullptr;
  const ckptd::v1::ShardRef* ref = nullptr;
  for (const ckptd::v1::ShardRef& s : manifest->shards()) {
    if (s.rank() == shard.rank) ref = &s;
  }
  if (ref == nullptr) return nullptr;
  const std::string path = storage::ShardPath(options_.dir, shard.job, shard.step, shard.rank);
  absl::StatusOr<std::unique_ptr<storage::ShardReader>> reader =
      storage::ShardReader::Open(options_.fs, path, storage::ShardReadOptions(),
                                 options_.read_pool != nullptr ? options_.read_pool : options_.pool);
  if (!reader.ok()) {
    if (absl::IsDataLoss(reader.status())) (void)options_.fs->RemoveFile(path);  // damaged: never again
    return nullptr;
  }
  // Another attempt at the step may have written different bytes.
  if ((*reader)->file_length() != ref->file_length() || (*reader)->index_xxh3() != ref->index_xxh3()) return nullptr;
  return std::move(*reader);
}

std::optional<absl::Status> LocalTier::Read(const ShardId& shard,
                                            const std::function<absl::Status(storage::ShardReader&)>& read,
                                            LocalTierCounters* counters) {
  std::unique_ptr<storage::ShardReader> local = OpenCommitted(shard);
  if (local == nullptr) return std::nullopt;
  absl::Status s = read(*local);
  // A local copy that cannot be read for any other reason than what reads it
  // (or where it goes): the storage root's may still be.
  if (s.ok() || absl::IsFailedPrecondition(s) || absl::IsDeadlineExceeded(s) || absl::IsResourceExhausted(s)) {
    if (s.ok()) {
      options_.logger->Info(absl::StrCat("job ", shard.job, " rank ", shard.rank, ": step ", shard.step,
                                         " read from the node-local tier"));
      absl::MutexLock l(&counters->mu_);
      ++counters->stats_.restores;
    }
    return s;
  }
  // A damaged local copy: drop it and read the storage root's.
  options_.logger->Warning(absl::StrCat("job ", shard.job, " rank ", shard.rank, ": the node-local copy of step ",
                                        shard.step, " cannot be read (", s.message(), "); reading the storage root"));
  if (absl::IsDataLoss(s)) {
    (void)options_.fs->RemoveFile(storage::ShardPath(options_.dir, shard.job, shard.step, shard.rank));
  }
  return std::nullopt;
}

std::vector<uint64_t> LocalTier::Steps(const std::string& job) {
  std::vector<uint64_t> steps;
  // The tier makes its job and step directories itself, never as links: one
  // in their place (to a folder elsewhere) is reported and left alone, never
  // pruned or removed through.
  const std::string job_dir = storage::JobDir(options_.dir, job);
  if (absl::Status s = storage::CheckIsDirectory(options_.fs, job_dir); !s.ok()) {
    if (!absl::IsNotFound(s)) options_.logger->Warning(absl::StrCat("node-local tier: ", s.message(), "; left alone"));
    return steps;
  }
  absl::StatusOr<std::vector<storage::FileInfo>> entries = options_.fs->ListDir(job_dir);
  if (!entries.ok()) return steps;
  for (const storage::FileInfo& e : *entries) {
    std::optional<uint64_t> s = storage::ParseStepDirName(e.name);
    if (!s) continue;
    if (!e.is_directory) {
      options_.logger->Warning(absl::StrCat("node-local tier: ", storage::JoinPath(job_dir, e.name), " is a ",
                                            storage::FileTypeName(e.type), ", not a directory; left alone"));
      continue;
    }
    steps.push_back(*s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

void LocalTier::Prune(const std::string& job) {
  absl::MutexLock l(&mu_);
  const std::vector<uint64_t> steps = Steps(job);
  const std::multiset<uint64_t>& in_flight = in_flight_[job];
  const uint64_t oldest_in_flight = in_flight.empty() ? UINT64_MAX : *in_flight.begin();
  const size_t keep = static_cast<size_t>(std::max(options_.keep, 1));
  if (steps.size() <= keep) return;
  // The newest committed step stays, whatever newer ones the tier holds
  // (steps written here run ahead of their commits when the storage root is
  // slow): it is what a restart restores.
  std::optional<uint64_t> committed;
  for (auto it = steps.rbegin(); it != steps.rend() && !committed; ++it) {
    if (root_->fs()->Stat(storage::ManifestPath(root_->root(), job, *it)).ok()) committed = *it;
  }
  for (size_t i = 0; i + keep < steps.size() && steps[i] < oldest_in_flight; ++i) {
    if (steps[i] == committed) continue;
    // Best effort: a reader that has the file open keeps reading it.
    (void)storage::RemoveTree(options_.fs, storage::StepDir(options_.dir, job, steps[i]));
  }
}

void LocalTier::Discard(const ShardId& shard) {
  absl::MutexLock l(&mu_);
  const std::string path = storage::ShardPath(options_.dir, shard.job, shard.step, shard.rank);
  // Best effort: what stays is only wasted space, pruned later.
  (void)options_.fs->RemoveFile(path);
  (void)options_.fs->RemoveFile(absl::StrCat(path, storage::kTempSuffix));
  RemoveStepIfUnused(shard.job, shard.step);
}

void LocalTier::RemoveStepIfUnused(const std::string& job, uint64_t step) {
  if (auto it = in_flight_.find(job); it != in_flight_.end() && it->second.contains(step)) return;
  // Kept when it holds anything or is a link.
  (void)store_.RemoveEmptyStep(job, step);
}

void LocalTier::DropStepsAbove(const std::string& job, uint64_t step) {
  absl::MutexLock l(&mu_);
  const std::multiset<uint64_t>& in_flight = in_flight_[job];
  for (uint64_t s : Steps(job)) {
    if (s <= step || in_flight.contains(s)) continue;
    (void)storage::RemoveTree(options_.fs, storage::StepDir(options_.dir, job, s));
  }
}

}  // namespace ckptd::agent
