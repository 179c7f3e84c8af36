// A storage root holding the checkpoints of many jobs: writing shards into a
// step, committing a step with its MANIFEST (last, atomically), listing,
// retention, cleanup of steps that never committed, and verification.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/clock.h"
#include "ckptd/v1/manifest.pb.h"
#include "storage/file_system.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"

namespace ckptd::storage {

enum class StepState {
  kCommitted,   // a valid MANIFEST: the step exists for readers
  kIncomplete,  // no MANIFEST: being written, or abandoned
  kCorrupt,     // a MANIFEST that does not decode, or a step entry that is not a
                // directory (a link, a file): kept, and never read or removed through
};
absl::string_view StepStateName(StepState state);

struct StepInfo {
  uint64_t step = 0;
  StepState state = StepState::kIncomplete;
  std::string detail;                                // why a step is corrupt
  std::optional<ckptd::v1::StepManifest> manifest;  // set when committed
  // Set when a committed step was quarantined (its data failed verification):
  // why. Such a step is never restored, and retention keeps it.
  std::optional<std::string> quarantined;
};

struct StepVerifyReport {
  std::string job;
  uint64_t step = 0;
  int shards = 0;  // checked so far (all of them once VerifyStep returns)
  int shards_total = 0;     // in the manifest
  uint64_t bytes_total = 0;  // file bytes of every shard in the manifest
  uint64_t bytes_done = 0;   // of the shards checked so far
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;
  std::vector<VerifyProblem> problems;  // empty when the step verifies
  bool ok() const { return problems.empty(); }
};

// The retention rule, for every committer: of the usable committed steps
// `committed` (quarantined ones left out), the newest `keep_last` (at least 1)
// stay and the older ones go, oldest first, except those `pinned` (e.g. being
// verified), which stay without counting as kept.
std::vector<uint64_t> RetentionDrops(const std::set<uint64_t>& committed, int keep_last,
                                     const std::function<bool(uint64_t)>& pinned = nullptr);

class CheckpointStore {
 public:
  // `fs` (and `clock`) must outlive the store. `clock` stamps the MANIFEST's
  // commit time; nullptr: the real clock.
  CheckpointStore(FileSystem* fs, std::string root, base::Clock* clock = nullptr);

  const std::string& root() const { return root_; }
  FileSystem* fs() const { return fs_; }

  // Creates the step directory (and the job directory) durably.
  absl::Status PrepareStep(absl::string_view job, uint64_t step);

  // Writes rank `rank`'s shard of `step`. The step directory must exist.
  absl::StatusOr<ShardWriteResult> WriteShard(absl::string_view job, uint64_t step, uint32_t rank,
                                              uint32_t world_size, absl::Span<const TensorSource> tensors,
                                              const ShardWriteOptions& options = {},
                                              base::ThreadPool* pool = nullptr);

  // Commits `step` once every rank 0..world_size-1 has a durable shard: checks
  // each shard's header, footer and index (job, step, rank, world size) and,
  // when `reported` is given, that each matches the digest and length its
  // writer reported; then writes the MANIFEST atomically. kFailedPrecondition
  // when a shard is missing or disagrees; kAlreadyExists when already committed.
  // With kStatOnly (needs `reported`), each shard is only checked to exist with
  // its reported length (CheckReportedShard): the writer already verified what
  // it wrote, and a coordinator committing thousands of ranks cannot afford to
  // read them all. With kCheckedByCaller (needs `reported`) nothing is read:
  // the caller ran CheckReportedShard on each shard as it was reported, so
  // that a commit costs only the MANIFEST write.
  // REQUIRES: one committer per job at a time (the agent or the coordinator).
  enum class CommitCheck { kReadIndex, kStatOnly, kCheckedByCaller };
  absl::StatusOr<ckptd::v1::StepManifest> CommitStep(
      absl::string_view job, uint64_t step, uint32_t world_size,
      const std::vector<ckptd::v1::ShardRef>* reported = nullptr, CommitCheck check = CommitCheck::kReadIndex);

  // Checks that the shard `reported` for (job, step) exists with the length
  // its writer reported: kFailedPrecondition naming the rank when it is
  // missing or its length differs, the file system's error otherwise.
  absl::Status CheckReportedShard(absl::string_view job, uint64_t step, const ckptd::v1::ShardRef& reported);

  // Opens rank `rank`'s shard of committed `step` (whose MANIFEST is
  // `manifest`) and checks it is the one the MANIFEST names: file name,
  // index checksum, job, step, rank and world size. kDataLoss naming what
  // differs (a rank the MANIFEST lacks included); ShardReader::Open's errors.
  absl::StatusOr<std::unique_ptr<ShardReader>> OpenCommittedShard(absl::string_view job, uint64_t step,
                                                                  const ckptd::v1::StepManifest& manifest,
                                                                  uint32_t rank,
                                                                  const ShardReadOptions& options = {},
                                                                  base::ThreadPool* pool = nullptr);

  // Steps of `job` in ascending order (kNotFound when the job has no directory;
  // kFailedPrecondition when its directory is a link or not a directory).
  absl::StatusOr<std::vector<StepInfo>> ListSteps(absl::string_view job);
  // The newest committed step that is not quarantined, or nullopt.
  absl::StatusOr<std::optional<uint64_t>> LatestCommittedStep(absl::string_view job);
  absl::StatusOr<ckptd::v1::StepManifest> ReadManifest(absl::string_view job, uint64_t step);
  // The job directories under the root: a link is not one.
  absl::StatusOr<std::vector<std::string>> ListJobs();

  // Marks committed `step` as quarantined (durably), with `reason`.
  // kFailedPrecondition when the step is not committed.
  absl::Status QuarantineStep(absl::string_view job, uint64_t step, absl::string_view reason);

  // A restore that finds committed steps of a job but none intact does not
  // start from scratch on its own: the operator says so. AllowFreshStart
  // records that choice (durably, in the job's directory) for the committed
  // steps up to the newest now, with `note` (who and why); a step committed
  // later is not covered. kFailedPrecondition when the job has an intact
  // committed step (nothing to allow: it restores from that) or none at all.
  // Returns the newest committed step the choice covers.
  absl::StatusOr<uint64_t> AllowFreshStart(absl::string_view job, absl::string_view note);
  // The newest committed step the operator's choice covers; nullopt when
  // there is none. A choice that cannot be read is kDataLoss naming it.
  absl::StatusOr<std::optional<uint64_t>> FreshStartAllowedOver(absl::string_view job);
  // What a restart of `job` is told while it is held back: `committed`
  // committed steps, none intact; `damaged` the newest quarantined ones
  // (step, reason), newest first.
  std::string FreshStartRefusal(absl::string_view job, size_t committed,
                                const std::vector<std::pair<uint64_t, std::string>>& damaged) const;

  // How a large removal shares the disk with commits. The files of a step go
  // in batches of `batch`, each batch made durable (a directory sync) before
  // the next, and `before_batch` runs before each (e.g. to wait while a
  // commit is in flight). On ext4 and the like a commit's fsync otherwise
  // carries every unlink still in the journal: thousands of them.
  struct RemovePacing {
    size_t batch = 256;
    std::function<void()> before_batch;
  };

  // Removes a step, committed or not: the MANIFEST first (durably), then the
  // rest (paced when `pacing` is given). Used by retention and to delete a
  // step on purpose. A job or step directory that is not a directory (a link
  // to elsewhere) is left alone: kFailedPrecondition naming it. A link inside
  // the step is removed itself, never what it points to.
  absl::Status RemoveStep(absl::string_view job, uint64_t step, const RemovePacing* pacing = nullptr);
  // Removes a step that has not committed (kFailedPrecondition if it has).
  absl::Status AbortStep(absl::string_view job, uint64_t step);
  // Removes the directory of `step` when it holds nothing at all (what a
  // failed write leaves once its own files are gone): ok when it went or was
  // not there. kFailedPrecondition, and it stays, when it holds anything (a
  // MANIFEST, a shard, a temp file) or is not a directory (a link).
  absl::Status RemoveEmptyStep(absl::string_view job, uint64_t step);
  // Removes every step without a MANIFEST older than `below_step` (all of
  // them by default) and stray temp files. Steps whose MANIFEST does not
  // decode are kept (they may be another version's). Returns the steps removed.
  // Call it only when no writer is working on those steps.
  absl::StatusOr<std::vector<uint64_t>> RemoveIncompleteSteps(absl::string_view job,
                                                             uint64_t below_step = UINT64_MAX);
  // Keeps the newest `keep_last` committed steps (at least 1) that are not
  // quarantined and removes older ones (RetentionDrops), MANIFEST first;
  // quarantined steps stay. Returns the steps removed.
  absl::StatusOr<std::vector<uint64_t>> ApplyRetention(absl::string_view job, int keep_last);

  // Reads every shard of a committed step back and checks it against the
  // manifest and every chunk checksum. I/O errors are problems, not statuses,
  // except when the manifest itself cannot be read.
  // `progress`, when given, is called after each shard with the report so far.
  absl::StatusOr<StepVerifyReport> VerifyStep(absl::string_view job, uint64_t step,
                                              const ShardReadOptions& options = {},
                                              const std::function<void(const StepVerifyReport&)>& progress = {});

 private:
  FileSystem* const fs_;
  const std::string root_;
  base::Clock* const clock_;
};

}  // namespace ckptd::storage
