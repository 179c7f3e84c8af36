#include "storage/store.h"

#include <algorithm>
#include <iterator>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "format/checksum.h"
#include "storage/layout.h"
#include "storage/manifest.h"

namespace ckptd::storage {

using ckptd::v1::ShardRef;
using ckptd::v1::StepManifest;

absl::string_view StepStateName(StepState state) {
  switch (state) {
    case StepState::kCommitted: return "committed";
    case StepState::kIncomplete: return "incomplete";
    case StepState::kCorrupt: return "corrupt";
  }
  return "unknown";
}

CheckpointStore::CheckpointStore(FileSystem* fs, std::string root, base::Clock* clock)
    : fs_(fs), root_(std::move(root)), clock_(clock != nullptr ? clock : base::RealClock::Get()) {}

absl::Status CheckpointStore::PrepareStep(absl::string_view job, uint64_t step) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(job));
  const std::string job_dir = JobDir(root_, job);
  CKPTD_RETURN_IF_ERROR(CreateDirs(fs_, root_));
  // Every level is synced each time, not only when this call created it: an
  // earlier attempt may have created a directory and failed before its sync.
  CKPTD_RETURN_IF_ERROR(fs_->CreateDir(job_dir));
  CKPTD_RETURN_IF_ERROR(fs_->SyncDir(root_));
  CKPTD_RETURN_IF_ERROR(fs_->CreateDir(StepDir(root_, job, step)));
  return fs_->SyncDir(job_dir);
}

absl::StatusOr<ShardWriteResult> CheckpointStore::WriteShard(absl::string_view job, uint64_t step, uint32_t rank,
                                                             uint32_t world_size,
                                                             absl::Span<const TensorSource> tensors,
                                                             const ShardWriteOptions& options, base::ThreadPool* pool) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(job));
  if (world_size == 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not inside world size ", world_size));
  }
  ShardIdentity id{std::string(job), step, rank, world_size};
  return storage::WriteShard(fs_, ShardPath(root_, job, step, rank), id, tensors, options, pool);
}

absl::StatusOr<StepManifest> CheckpointStore::CommitStep(absl::string_view job, uint64_t step,
                                                         uint32_t world_size,
                                                         const std::vector<ShardRef>* reported,
                                                         CommitCheck check) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(job));
  const std::string what = absl::StrCat("commit ", job, " step ", step);
  if (world_size == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": world size is 0"));
  const std::string manifest_path = ManifestPath(root_, job, step);
  if (fs_->Stat(manifest_path).ok()) {
    return absl::AlreadyExistsError(absl::StrCat(what, ": already committed"));
  }
  if (reported != nullptr && reported->size() != world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": ", reported->size(), " shards reported for a world of ", world_size));
  }
  StepManifest m;
  m.set_format_version(kManifestFormatVersion);
  m.set_job(std::string(job));
  m.set_step(step);
  m.set_world_size(world_size);
  if (check != CommitCheck::kReadIndex && reported == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a commit that trusts the writers needs the reported shards"));
  }
  // Each rank's report, found once: a world of thousands must not cost a
  // search per rank.
  std::vector<const ShardRef*> by_rank(world_size, nullptr);
  if (reported != nullptr) {
    for (const ShardRef& r : *reported) {
      if (r.rank() >= world_size) {
        return absl::FailedPreconditionError(
            absl::StrCat(what, ": a shard reported for rank ", r.rank(), " outside the world of ", world_size));
      }
      if (by_rank[r.rank()] != nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(what, ": rank ", r.rank(), " reported twice"));
      }
      by_rank[r.rank()] = &r;
    }
  }
  ShardReadOptions ro;
  ro.threads = 1;
  for (uint32_t rank = 0; rank < world_size; ++rank) {
    const std::string path = ShardPath(root_, job, step, rank);
    if (check != CommitCheck::kReadIndex) {
      const ShardRef* it = by_rank[rank];
      if (it == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(what, ": rank ", rank, " reported no shard"));
      }
      if (check == CommitCheck::kStatOnly) {
        if (absl::Status s = CheckReportedShard(job, step, *it); !s.ok()) {
          return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
        }
      }
      ShardRef* ref = m.add_shards();
      *ref = *it;
      ref->set_file(ShardFileName(rank));
      continue;
    }
    absl::StatusOr<std::unique_ptr<ShardReader>> reader = ShardReader::Open(fs_, path, ro);
    if (!reader.ok()) {
      // A missing or damaged shard will not appear by retrying; anything else
      // (no memory, too many files, a busy disk) keeps its code.
      const absl::StatusCode code =
          absl::IsNotFound(reader.status()) || absl::IsDataLoss(reader.status())
              ? absl::StatusCode::kFailedPrecondition
              : reader.status().code();
      return absl::Status(code, absl::StrCat(what, ": rank ", rank, " has no durable shard: ",
                                             reader.status().message()));
    }
    const ckptd::v1::ShardIndex& idx = (*reader)->index();
    if (idx.job() != job || idx.step() != step || idx.rank() != rank || idx.world_size() != world_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": ", path, " belongs to job ", idx.job(), " step ", idx.step(), " rank ", idx.rank(), " of ",
          idx.world_size()));
    }
    ShardRef* ref = m.add_shards();
    ref->set_rank(rank);
    ref->set_file(ShardFileName(rank));
    ref->set_file_length((*reader)->file_length());
    ref->set_index_xxh3((*reader)->index_xxh3());
    ref->set_raw_bytes(idx.raw_bytes());
    ref->set_stored_bytes(idx.stored_bytes());
    if (reported != nullptr) {
      const ShardRef* it = by_rank[rank];
      if (it == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(what, ": rank ", rank, " reported no shard"));
      }
      if (it->index_xxh3() != ref->index_xxh3() || it->file_length() != ref->file_length()) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, ": rank ", rank, " reported digest ", format::ChecksumHex(it->index_xxh3()), " and ",
            it->file_length(), " bytes but the file has ", format::ChecksumHex(ref->index_xxh3()), " and ",
            ref->file_length()));
      }
      ref->set_persist_seconds(it->persist_seconds());
    }
  }
  m.set_committed_unix_nanos(absl::ToUnixNanos(clock_->Now()));
  const std::string encoded = EncodeManifest(m);
  if (encoded.size() - kManifestHeaderBytes > kMaxManifestBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": manifest of ", encoded.size(),
                                                   " bytes exceeds the limit ", kMaxManifestBytes));
  }
  if (absl::Status st = WriteFileAtomically(fs_, manifest_path, encoded); !st.ok()) {
    // The MANIFEST may already stand under its name (a failed directory sync):
    // take it back so that the step matches the error reported. Best effort.
    (void)fs_->RemoveFile(manifest_path);
    return st;
  }
  return m;
}

absl::Status CheckpointStore::CheckReportedShard(absl::string_view job, uint64_t step, const ShardRef& reported) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(job));
  const uint32_t rank = reported.rank();
  const std::string path = ShardPath(root_, job, step, rank);
  absl::StatusOr<FileInfo> info = fs_->Stat(path);
  if (!info.ok()) {
    const absl::StatusCode code =
        absl::IsNotFound(info.status()) ? absl::StatusCode::kFailedPrecondition : info.status().code();
    return absl::Status(code, absl::StrCat("rank ", rank, " has no durable shard: ", info.status().message()));
  }
  if (info->type != FileType::kRegular) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " has no durable shard: ", path, " is a ", FileTypeName(info->type)));
  }
  if (info->size != reported.file_length()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " reported ", reported.file_length(), " bytes but ", path, " has ", info->size));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShardReader>> CheckpointStore::OpenCommittedShard(
    absl::string_view job, uint64_t step, const ckptd::v1::StepManifest& manifest, uint32_t rank,
    const ShardReadOptions& options, base::ThreadPool* pool) {
  const ckptd::v1::ShardRef* ref = nullptr;
  for (const ckptd::v1::ShardRef& r : manifest.shards()) {
    if (r.rank() == rank) ref = &r;
  }
  if (ref == nullptr) {
    return absl::DataLossError(absl::StrCat("step ", step, " of job ", job, ": no shard of rank ", rank,
                                            " in its MANIFEST"));
  }
  if (ref->file() != ShardFileName(rank)) {
    return absl::DataLossError(absl::StrCat("step ", step, " of job ", job, ": the MANIFEST names '",
                                            absl::CHexEscape(ref->file()), "' as the shard of rank ", rank));
  }
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> reader,
                         ShardReader::Open(fs_, ShardPath(root_, job, step, rank), options, pool));
  const ckptd::v1::ShardIndex& index = reader->index();
  if (reader->index_xxh3() != ref->index_xxh3() || index.job() != job || index.step() != step ||
      index.rank() != rank || index.world_size() != manifest.world_size()) {
    return absl::DataLossError(absl::StrCat("shard ", reader->path(), " does not match the MANIFEST of step ", step,
                                            " (its index is for job '", absl::CHexEscape(index.job()), "', step ",
                                            index.step(), ", rank ", index.rank(), " of ", index.world_size(), ")"));
  }
  return reader;
}

absl::StatusOr<std::vector<StepInfo>> CheckpointStore::ListSteps(absl::string_view job) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(job));
  // A job directory that is a link is not listed through: its steps would be
  // wherever it points, and retention would remove them there.
  CKPTD_RETURN_IF_ERROR(CheckIsDirectory(fs_, JobDir(root_, job)));
  CKPTD_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs_->ListDir(JobDir(root_, job)));
  std::vector<StepInfo> steps;
  for (const FileInfo& e : entries) {
    std::optional<uint64_t> step = ParseStepDirName(e.name);
    if (!step) continue;
    StepInfo info;
    info.step = *step;
    if (!e.is_directory) {
      // A link or a file where the layout puts a step directory: reported,
      // and neither read nor removed through (corrupt steps are kept).
      info.state = StepState::kCorrupt;
      info.detail =
          absl::StrCat(StepDir(root_, job, *step), " is a ", FileTypeName(e.type), ", not a directory: left alone");
      steps.push_back(std::move(info));
      continue;
    }
    const std::string path = ManifestPath(root_, job, *step);
    absl::StatusOr<std::string> bytes = ReadFileToString(fs_, path);
    if (absl::IsNotFound(bytes.status())) {
      info.state = StepState::kIncomplete;
    } else if (!bytes.ok() && !absl::IsDataLoss(bytes.status())) {
      // Not knowing whether a step committed (no memory, permissions, a busy
      // disk) must not read as "older step is newest".
      return bytes.status();
    } else if (!bytes.ok()) {
      info.state = StepState::kCorrupt;
      info.detail = std::string(bytes.status().message());
    } else {
      absl::StatusOr<StepManifest> m = DecodeManifest(*bytes, path);
      if (m.ok() && (m->job() != job || m->step() != *step)) {
        m = absl::DataLossError(absl::StrCat(path, ": manifest is for job ", m->job(), " step ", m->step()));
      }
      if (m.ok()) {
        info.state = StepState::kCommitted;
        info.manifest = *std::move(m);
        absl::StatusOr<std::string> mark = ReadFileToString(fs_, QuarantinePath(root_, job, *step));
        if (mark.ok()) {
          info.quarantined = mark->substr(0, 4096);
        } else if (!absl::IsNotFound(mark.status())) {
          // A mark that cannot be read still marks the step.
          info.quarantined = absl::StrCat("quarantine mark unreadable: ", mark.status().message());
        }
      } else {
        info.state = StepState::kCorrupt;
        info.detail = std::string(m.status().message());
      }
    }
    steps.push_back(std::move(info));
  }
  std::sort(steps.begin(), steps.end(), [](const StepInfo& a, const StepInfo& b) { return a.step < b.step; });
  return steps;
}

absl::StatusOr<std::optional<uint64_t>> CheckpointStore::LatestCommittedStep(absl::string_view job) {
  absl::StatusOr<std::vector<StepInfo>> steps = ListSteps(job);
  if (absl::IsNotFound(steps.status())) return std::optional<uint64_t>();
  CKPTD_RETURN_IF_ERROR(steps.status());
  for (auto it = steps->rbegin(); it != steps->rend(); ++it) {
    if (it->state == StepState::kCommitted && !it->quarantined) return std::optional<uint64_t>(it->step);
  }
  return std::optional<uint64_t>();
}

absl::StatusOr<StepManifest> CheckpointStore::ReadManifest(absl::string_view job, uint64_t step) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(job));
  const std::string path = ManifestPath(root_, job, step);
  CKPTD_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(fs_, path));
  CKPTD_ASSIGN_OR_RETURN(StepManifest m, DecodeManifest(bytes, path));
  if (m.job() != job || m.step() != step) {
    return absl::DataLossError(absl::StrCat(path, ": manifest is for job ", m.job(), " step ", m.step()));
  }
  return m;
}

absl::StatusOr<std::vector<std::string>> CheckpointStore::ListJobs() {
  CKPTD_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs_->ListDir(root_));
  std::vector<std::string> jobs;
  for (const FileInfo& e : entries) {
    if (e.is_directory && ValidateJobName(e.name).ok()) jobs.push_back(e.name);
  }
  return jobs;
}

absl::Status CheckpointStore::RemoveStep(absl::string_view job, uint64_t step, const RemovePacing* pacing) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(job));
  const std::string dir = StepDir(root_, job, step);
  // The layout makes these directories. Anything else in their place (a link
  // to elsewhere) is left alone: removing through it would delete what it
  // points to.
  auto left_alone = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("remove ", job, " step ", step, ": ", s.message(), "; left alone"));
  };
  if (absl::Status s = CheckIsDirectory(fs_, JobDir(root_, job)); !s.ok()) {
    return absl::IsNotFound(s) ? s : left_alone(s);
  }
  // A step directory already gone is no error.
  if (absl::Status s = CheckIsDirectory(fs_, dir); !s.ok() && !absl::IsNotFound(s)) return left_alone(s);
  // The MANIFEST goes first and durably, so a crash part-way leaves an
  // incomplete step (cleaned up later), never a committed one with holes.
  // The walk from the root down never goes through a link, also one swapped
  // in since the checks above.
  RemoveTreeOptions options;
  options.links_allowed_up_to = root_;
  options.remove_first = {std::string(kManifestName)};
  if (pacing != nullptr) {
    options.batch = pacing->batch;
    options.before_batch = [&](size_t removed) -> absl::Status {
      if (removed > 0) CKPTD_RETURN_IF_ERROR(fs_->SyncDir(dir));
      if (pacing->before_batch) pacing->before_batch();
      return absl::OkStatus();
    };
  }
  CKPTD_RETURN_IF_ERROR(RemoveTree(fs_, dir, options));
  return fs_->SyncDir(JobDir(root_, job));
}

absl::Status CheckpointStore::QuarantineStep(absl::string_view job, uint64_t step, absl::string_view reason) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(job));
  if (!fs_->Stat(ManifestPath(root_, job, step)).ok()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot quarantine ", job, " step ", step, ": not committed"));
  }
  return WriteFileAtomically(fs_, QuarantinePath(root_, job, step), reason.substr(0, 4096));
}

absl::StatusOr<uint64_t> CheckpointStore::AllowFreshStart(absl::string_view job, absl::string_view note) {
  CKPTD_ASSIGN_OR_RETURN(std::vector<StepInfo> steps, ListSteps(job));
  std::optional<uint64_t> newest;
  for (const StepInfo& s : steps) {
    if (s.state != StepState::kCommitted) continue;
    if (!s.quarantined) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job, " step ", s.step,
                                                        " is committed and not quarantined: a restore loads it, "
                                                        "there is no fresh start to allow"));
    }
    newest = s.step;
  }
  if (!newest) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job, " has no committed step: it starts fresh without being told"));
  }
  std::string text = absl::StrCat(*newest, "\n", note.substr(0, 4096), "\n");
  CKPTD_RETURN_IF_ERROR(WriteFileAtomically(fs_, FreshStartPath(root_, job), text));
  return *newest;
}

absl::StatusOr<std::optional<uint64_t>> CheckpointStore::FreshStartAllowedOver(absl::string_view job) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(job));
  const std::string path = FreshStartPath(root_, job);
  absl::StatusOr<std::string> text = ReadFileToString(fs_, path);
  if (absl::IsNotFound(text.status())) return std::optional<uint64_t>();
  CKPTD_RETURN_IF_ERROR(text.status());
  uint64_t step = 0;
  if (!absl::SimpleAtoi(absl::string_view(*text).substr(0, text->find('\n')), &step)) {
    return absl::DataLossError(absl::StrCat(path, ": does not start with a step number"));
  }
  return std::optional<uint64_t>(step);
}

std::string CheckpointStore::FreshStartRefusal(absl::string_view job, size_t committed,
                                               const std::vector<std::pair<uint64_t, std::string>>& damaged) const {
  std::string listed;
  for (size_t i = 0; i < damaged.size() && i < 3; ++i) {
    absl::StrAppend(&listed, i == 0 ? "" : "; ", "step ", damaged[i].first, ": ", damaged[i].second.substr(0, 200));
  }
  return absl::StrCat("job ", job, " has ", committed, " committed steps but none intact (", listed,
                      "): a restart would start from scratch, and ckptd does not do that on its own. Look with "
                      "'ckptctl list --job ",
                      job, "' or 'ckptctl verify --root ", root_, " --job ", job,
                      "'; to start fresh anyway, run 'ckptctl start-fresh --root ", root_, " --job ", job,
                      "' and restart the job");
}

absl::Status CheckpointStore::AbortStep(absl::string_view job, uint64_t step) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(job));
  if (fs_->Stat(ManifestPath(root_, job, step)).ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot abort ", job, " step ", step, ": it is committed"));
  }
  return RemoveStep(job, step);
}

absl::Status CheckpointStore::RemoveEmptyStep(absl::string_view job, uint64_t step) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(job));
  const std::string job_dir = JobDir(root_, job);
  const std::string dir = StepDir(root_, job, step);
  auto kept = [&](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat("remove empty ", job, " step ", step, ": ", why, "; kept"));
  };
  // Never through a link in place of the job's or the step's directory.
  for (const std::string& d : {job_dir, dir}) {
    if (absl::Status s = CheckIsDirectory(fs_, d); !s.ok()) return absl::IsNotFound(s) ? absl::OkStatus() : kept(s.message());
  }
  CKPTD_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs_->ListDir(dir));
  if (!entries.empty()) {
    return kept(absl::StrCat(dir, " holds ", entries.front().name,
                             entries.size() > 1 ? absl::StrCat(" and ", entries.size() - 1, " more") : ""));
  }
  // Removes only an empty directory: a file written there meanwhile keeps it.
  absl::Status s = fs_->RemoveDir(dir);
  if (absl::IsNotFound(s)) return absl::OkStatus();
  CKPTD_RETURN_IF_ERROR(s);
  return fs_->SyncDir(job_dir);
}

absl::StatusOr<std::vector<uint64_t>> CheckpointStore::RemoveIncompleteSteps(absl::string_view job,
                                                                           uint64_t below_step) {
  absl::StatusOr<std::vector<StepInfo>> steps = ListSteps(job);
  if (absl::IsNotFound(steps.status())) return std::vector<uint64_t>();
  CKPTD_RETURN_IF_ERROR(steps.status());
  std::vector<uint64_t> removed;
  for (const StepInfo& s : *steps) {
    if (s.state == StepState::kCommitted) {
      // Committed steps keep only their shards and MANIFEST: drop stray temp files.
      const std::string dir = StepDir(root_, job, s.step);
      CKPTD_ASSIGN_OR_RETURN(std::vector<FileInfo> files, fs_->ListDir(dir));
      for (const FileInfo& f : files) {
        if (absl::EndsWith(f.name, kTempSuffix)) CKPTD_RETURN_IF_ERROR(fs_->RemoveFile(JoinPath(dir, f.name)));
      }
      continue;
    }
    // A MANIFEST that does not decode (damaged, newer version, unreadable) is
    // kept for an operator to look at: it may hold committed data.
    if (s.state != StepState::kIncomplete || s.step >= below_step) continue;
    CKPTD_RETURN_IF_ERROR(RemoveStep(job, s.step));
    removed.push_back(s.step);
  }
  return removed;
}

std::vector<uint64_t> RetentionDrops(const std::set<uint64_t>& committed, int keep_last,
                                     const std::function<bool(uint64_t)>& pinned) {
  const size_t keep = static_cast<size_t>(std::max(1, keep_last));
  std::vector<uint64_t> drop;
  if (committed.size() <= keep) return drop;
  auto end = committed.begin();
  std::advance(end, committed.size() - keep);
  for (auto it = committed.begin(); it != end; ++it) {
    if (!pinned || !pinned(*it)) drop.push_back(*it);
  }
  return drop;
}

absl::StatusOr<std::vector<uint64_t>> CheckpointStore::ApplyRetention(absl::string_view job, int keep_last) {
  CKPTD_ASSIGN_OR_RETURN(std::vector<StepInfo> steps, ListSteps(job));
  std::set<uint64_t> committed;
  for (const StepInfo& s : steps) {
    if (s.state == StepState::kCommitted && !s.quarantined) committed.insert(s.step);
  }
  std::vector<uint64_t> removed;
  for (uint64_t step : RetentionDrops(committed, keep_last)) {
    CKPTD_RETURN_IF_ERROR(RemoveStep(job, step));
    removed.push_back(step);
  }
  return removed;
}

absl::StatusOr<StepVerifyReport> CheckpointStore::VerifyStep(
    absl::string_view job, uint64_t step, const ShardReadOptions& options,
    const std::function<void(const StepVerifyReport&)>& progress) {
  CKPTD_ASSIGN_OR_RETURN(StepManifest m, ReadManifest(job, step));
  StepVerifyReport report;
  report.job = std::string(job);
  report.step = step;
  report.shards_total = m.shards_size();
  for (const ShardRef& ref : m.shards()) report.bytes_total += ref.file_length();
  for (const ShardRef& ref : m.shards()) {
    const std::string path = ShardPath(root_, job, step, ref.rank());
    ++report.shards;
    absl::Cleanup tell = [&] {
      report.bytes_done += ref.file_length();
      if (progress) progress(report);
    };
    auto problem = [&](std::string message) {
      report.problems.push_back({path, "", -1, -1, std::move(message)});
    };
    absl::StatusOr<std::unique_ptr<ShardReader>> reader = ShardReader::Open(fs_, path, options);
    if (!reader.ok()) {
      problem(std::string(reader.status().message()));
      continue;
    }
    const ckptd::v1::ShardIndex& idx = (*reader)->index();
    if ((*reader)->index_xxh3() != ref.index_xxh3() || (*reader)->file_length() != ref.file_length()) {
      problem(absl::StrCat(path, ": index digest ", format::ChecksumHex((*reader)->index_xxh3()), " and length ",
                           (*reader)->file_length(), " differ from the manifest's ",
                           format::ChecksumHex(ref.index_xxh3()), " and ", ref.file_length()));
      continue;
    }
    if (idx.job() != job || idx.step() != step || idx.rank() != ref.rank() || idx.world_size() != m.world_size()) {
      problem(absl::StrCat(path, ": shard belongs to job ", idx.job(), " step ", idx.step(), " rank ", idx.rank()));
      continue;
    }
    report.raw_bytes += idx.raw_bytes();
    report.stored_bytes += idx.stored_bytes();
    absl::StatusOr<std::vector<VerifyProblem>> problems = (*reader)->Verify();
    if (!problems.ok()) {
      problem(std::string(problems.status().message()));
      continue;
    }
    for (VerifyProblem& p : *problems) report.problems.push_back(std::move(p));
  }
  return report;
}

}  // namespace ckptd::storage
