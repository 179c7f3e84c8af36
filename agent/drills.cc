#include "agent/drills.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/posix_error.h"
#include "base/status_macros.h"
#include "base/thread.h"
#include "storage/layout.h"
#include "storage/shard_reader.h"
#include "storage/store.h"
#include "base/thread_priority.h"

namespace ckptd::agent {

namespace {

std::string RankName(const ckptd::v1::DrillOrder& o) { return absl::StrCat("rank ", o.rank(), " of job ", o.job()); }

// A duration field of an order: positive, finite, at most `max`.
absl::StatusOr<absl::Duration> Seconds(double seconds, absl::string_view field, absl::Duration max) {
  if (!std::isfinite(seconds) || seconds <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be positive (got ", seconds, ")"));
  }
  const absl::Duration d = absl::Seconds(seconds);
  if (d > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", seconds, " is longer than the limit of ", absl::FormatDuration(max)));
  }
  return d;
}

}  // namespace

DrillExecutor::DrillExecutor(DrillOptions options, DrillHooks hooks)
    : options_(std::move(options)), hooks_(std::move(hooks)) {
  if (!hooks_.signal) {
    hooks_.signal = [](int32_t pid, int sig) -> absl::Status {
      if (::kill(pid, sig) != 0) return base::PosixError(absl::StrCat("kill(", pid, ", ", sig, ")"), errno);
      return absl::OkStatus();
    };
  }
  if (!hooks_.kill_self) hooks_.kill_self = [] { std::raise(SIGKILL); };
}

DrillExecutor::~DrillExecutor() {
  // Each drill lifts its own fault as it wakes up. The map does not change
  // once stopping_ is set, so the threads are joined outside mu_.
  std::vector<Drill*> drills;
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    for (auto& [id, d] : drills_) drills.push_back(d.get());
  }
  for (Drill* d : drills) {
    if (d->thread.joinable()) d->thread.join();
  }
}

bool DrillExecutor::stopping() {
  absl::MutexLock l(&mu_);
  return stopping_;
}

bool DrillExecutor::Sleep(absl::Duration d) {
  absl::MutexLock l(&mu_);
  clock_->AwaitWithTimeout(&mu_, absl::Condition(&stopping_), d);
  return !stopping_;
}

void DrillExecutor::Submit(const ckptd::v1::DrillOrder& order) {
  absl::MutexLock l(&mu_);
  if (stopping_ || drills_.count(order.drill_id()) > 0) return;
  // Threads of finished drills are joined here (each exits right after done).
  for (auto& [id, d] : drills_) {
    if (d->done && d->thread.joinable()) d->thread.join();
  }
  auto d = std::make_unique<Drill>();
  d->order = order;
  d->report.set_drill_id(order.drill_id());
  Drill* const raw = d.get();
  drills_[order.drill_id()] = std::move(d);
  if (!options_.allowed) {
    raw->report.set_error(kDrillsNotAllowed);
    raw->version = 1;
    raw->done = true;
    return;
  }
  absl::StatusOr<std::thread> thread =
      base::StartThread(absl::StrCat("drill ", order.drill_id()), [this, raw] { Run(raw); });
  if (!thread.ok()) {
    // Reported as the drill's failure: it did not run.
    raw->report.set_error(std::string(thread.status().message()));
    raw->version = 1;
    raw->done = true;
    return;
  }
  raw->thread = *std::move(thread);
}

void DrillExecutor::OnAck(const ckptd::v1::HeartbeatAck& ack) {
  // A coordinator that does not know the session dropped the heartbeat.
  if (ack.known()) Delivered();
  for (const ckptd::v1::DrillOrder& order : ack.drills()) Submit(order);
}

void DrillExecutor::FillReports(ckptd::v1::Heartbeat* heartbeat) {
  absl::MutexLock l(&mu_);
  in_flight_.clear();
  for (const auto& [id, d] : drills_) {
    if (d->version <= d->delivered) continue;
    *heartbeat->add_drill_reports() = d->report;
    in_flight_[id] = d->version;
  }
}

void DrillExecutor::Delivered() {
  absl::MutexLock l(&mu_);
  for (const auto& [id, version] : in_flight_) {
    auto it = drills_.find(id);
    if (it != drills_.end()) it->second->delivered = std::max(it->second->delivered, version);
  }
  in_flight_.clear();
}

std::optional<ckptd::v1::DrillReport> DrillExecutor::Report(uint64_t drill_id) {
  absl::MutexLock l(&mu_);
  auto it = drills_.find(drill_id);
  if (it == drills_.end() || it->second->version == 0) return std::nullopt;
  return it->second->report;
}

void DrillExecutor::Injected(Drill* d, const std::string& detail, std::optional<absl::Time> at) {
  absl::MutexLock l(&mu_);
  d->report.set_injected(true);
  d->report.set_injected_unix_nanos(absl::ToUnixNanos(at.value_or(clock_->Now())));
  d->report.set_detail(detail);
  ++d->version;
}

void DrillExecutor::Ended(Drill* d, const std::string& detail_suffix) {
  absl::MutexLock l(&mu_);
  d->report.set_ended(true);
  d->report.set_ended_unix_nanos(absl::ToUnixNanos(clock_->Now()));
  if (!detail_suffix.empty()) d->report.set_detail(absl::StrCat(d->report.detail(), "; ", detail_suffix));
  ++d->version;
}

void DrillExecutor::Run(Drill* d) {
  base::SetCallingThreadName("ckptd-drill");
  const absl::Status s = Execute(d);
  absl::MutexLock l(&mu_);
  if (!s.ok()) {
    d->report.set_error(std::string(s.message()));
    ++d->version;
  }
  d->done = true;
}

absl::Status DrillExecutor::Execute(Drill* d) {
  const ckptd::v1::DrillOrder& o = d->order;
  if (o.at_step() > 0) CKPTD_RETURN_IF_ERROR(WaitForStep(o));
  switch (o.scenario()) {
    case ckptd::v1::KILL_TRAINER:
      return KillTrainer(d);
    case ckptd::v1::HANG_TRAINER: {
      CKPTD_ASSIGN_OR_RETURN(absl::Duration duration,
                             Seconds(o.duration_seconds(), "duration_seconds", options_.max_duration));
      return HangTrainer(d, duration);
    }
    case ckptd::v1::KILL_AGENT:
      return KillAgent(d);
    case ckptd::v1::KILL_NODE:
      return KillNode(d);
    case ckptd::v1::CUT_OFF_AGENT: {
      CKPTD_ASSIGN_OR_RETURN(absl::Duration duration,
                             Seconds(o.duration_seconds(), "duration_seconds", options_.max_duration));
      return CutOffAgent(d, duration);
    }
    case ckptd::v1::CORRUPT_SHARD:
      return CorruptShard(d);
    case ckptd::v1::CORRUPT_MEMORY:
      return CorruptMemory(d);
    case ckptd::v1::STORAGE_EIO:
    case ckptd::v1::STORAGE_ENOSPC:
    case ckptd::v1::STORAGE_SLOW: {
      CKPTD_ASSIGN_OR_RETURN(absl::Duration duration,
                             Seconds(o.duration_seconds(), "duration_seconds", options_.max_duration));
      return StorageFault(d, duration);
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown drill scenario ", static_cast<int>(o.scenario())));
  }
}

absl::StatusOr<TrainerInfo> DrillExecutor::Trainer(const ckptd::v1::DrillOrder& o) {
  std::optional<TrainerInfo> t = hooks_.find_trainer ? hooks_.find_trainer(o.job(), o.rank()) : std::nullopt;
  if (!t) return absl::NotFoundError(absl::StrCat("no trainer of ", RankName(o), " is registered with this agent"));
  // kill(0) and kill(-1) would signal whole process groups; never this agent.
  if (t->pid <= 1 || t->pid == ::getpid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the trainer of ", RankName(o), " registered without a usable pid (", t->pid, ")"));
  }
  return *t;
}

absl::Status DrillExecutor::WaitForStep(const ckptd::v1::DrillOrder& o) {
  const absl::Time deadline = clock_->Now() + options_.max_wait_for_step;
  std::optional<uint64_t> last;
  while (true) {
    // The trainer may be away (restarting) for a while: keep looking.
    std::optional<TrainerInfo> t = hooks_.find_trainer ? hooks_.find_trainer(o.job(), o.rank()) : std::nullopt;
    if (t) {
      if (t->step >= o.at_step()) return absl::OkStatus();
      last = t->step;
    }
    if (clock_->Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(RankName(o), " did not reach step ", o.at_step(), " within ",
                       absl::FormatDuration(options_.max_wait_for_step),
                       last ? absl::StrCat(" (last seen at step ", *last, ")") : std::string(" (never seen)")));
    }
    if (!Sleep(options_.step_poll)) {
      return absl::CancelledError(absl::StrCat("the agent stopped before ", RankName(o), " reached step ",
                                               o.at_step()));
    }
  }
}

absl::Status DrillExecutor::KillTrainer(Drill* d) {
  const ckptd::v1::DrillOrder& o = d->order;
  CKPTD_ASSIGN_OR_RETURN(TrainerInfo t, Trainer(o));
  const absl::Time at = clock_->Now();
  CKPTD_RETURN_IF_ERROR(hooks_.signal(t.pid, SIGKILL));
  Injected(d, absl::StrCat("SIGKILL sent to pid ", t.pid, " (", RankName(o), ", at step ", t.step, ")"), at);
  Ended(d);
  return absl::OkStatus();
}

absl::Status DrillExecutor::HangTrainer(Drill* d, absl::Duration duration) {
  const ckptd::v1::DrillOrder& o = d->order;
  CKPTD_ASSIGN_OR_RETURN(TrainerInfo t, Trainer(o));
  CKPTD_RETURN_IF_ERROR(hooks_.signal(t.pid, SIGSTOP));
  Injected(d, absl::StrCat("SIGSTOP sent to pid ", t.pid, " (", RankName(o), ", at step ", t.step, ") for ",
                           absl::FormatDuration(duration)));
  const bool full = Sleep(duration);
  // Resumed in every case, also when the agent is stopping.
  const absl::Status resumed = hooks_.signal(t.pid, SIGCONT);
  if (!resumed.ok()) {
    Ended(d, absl::StrCat("SIGCONT failed: ", resumed.message()));
    return absl::OkStatus();
  }
  Ended(d, full ? "SIGCONT sent" : "SIGCONT sent early: the agent is stopping");
  return absl::OkStatus();
}

absl::Status DrillExecutor::KillAgent(Drill* d) {
  Injected(d, absl::StrCat("agent pid ", ::getpid(), " kills itself with SIGKILL"));
  Ended(d);
  ReportThenDie(d);
  return absl::OkStatus();
}

absl::Status DrillExecutor::KillNode(Drill* d) {
  if (!hooks_.list_trainers) return absl::FailedPreconditionError("this agent cannot list its trainers");
  std::vector<std::string> killed;
  const absl::Time at = clock_->Now();
  for (const TrainerInfo& t : hooks_.list_trainers()) {
    // kill(0) and kill(-1) would signal whole process groups; never this agent.
    if (t.pid <= 1 || t.pid == ::getpid()) continue;
    if (hooks_.signal(t.pid, SIGKILL).ok()) {
      killed.push_back(absl::StrCat("rank ", t.rank, " of job ", t.job, " (pid ", t.pid, ", at step ", t.step, ")"));
    }
  }
  Injected(d,
           absl::StrCat("node crash: SIGKILL sent to ", killed.size(), " trainer(s)",
                        killed.empty() ? "" : absl::StrCat(": ", absl::StrJoin(killed, ", ")), ", then to agent pid ",
                        ::getpid()),
           at);
  Ended(d);
  ReportThenDie(d);
  return absl::OkStatus();
}

void DrillExecutor::ReportThenDie(Drill* d) {
  uint64_t version = 0;
  {
    absl::MutexLock l(&mu_);
    version = d->version;
  }
  // Give the report a chance to reach the coordinator first.
  bool stop = false;
  {
    absl::MutexLock l(&mu_);
    auto sent = [this, d, version]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || d->delivered >= version;
    };
    clock_->AwaitWithTimeout(&mu_, absl::Condition(&sent), options_.kill_agent_grace);
    stop = stopping_;
  }
  if (stop) return;  // the agent is going anyway
  hooks_.kill_self();
}

absl::Status DrillExecutor::CutOffAgent(Drill* d, absl::Duration duration) {
  if (!hooks_.cut_off) return absl::FailedPreconditionError("this agent has no coordinator link to cut");
  hooks_.cut_off(duration);
  Injected(d, absl::StrCat("cut off from the coordinator for ", absl::FormatDuration(duration)));
  if (!Sleep(duration)) {
    hooks_.cut_off(absl::ZeroDuration());
    Ended(d, "lifted early: the agent is stopping");
    return absl::OkStatus();
  }
  Ended(d, "reconnecting");
  return absl::OkStatus();
}

namespace {

// Rewrites `path` with the byte at `offset` inverted, as a whole new file
// renamed over it (shards are written once and never changed in place), a
// few MiB at a time: a shard may be many GiB. The new file is the shard's own
// temp name, as the store writes it: on an object store that is what becomes
// the object it names at the rename (the shard's step is committed, so no
// writer of the store uses that name now).
absl::Status CopyWithFlippedByte(storage::FileSystem* fs, const std::string& path, uint64_t offset) {
  constexpr size_t kPiece = size_t{4} << 20;
  storage::OpenOptions options;
  options.direct_io = false;
  const std::string tmp = absl::StrCat(path, storage::kTempSuffix);
  absl::Status status = [&]() -> absl::Status {
    CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<storage::ReadableFile> in, fs->NewReadableFile(path, options));
    const uint64_t size = in->size();
    if (offset >= size) {
      return absl::DataLossError(absl::StrCat(path, ": chunk offset ", offset, " is past the end (", size, " bytes)"));
    }
    CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<storage::WritableFile> out, fs->NewWritableFile(tmp, options));
    std::string piece;
    for (uint64_t at = 0; at < size; at += piece.size()) {
      piece.resize(static_cast<size_t>(std::min<uint64_t>(kPiece, size - at)));
      CKPTD_RETURN_IF_ERROR(in->ReadAt(at, piece.data(), piece.size()));
      if (offset >= at && offset < at + piece.size()) {
        piece[offset - at] = static_cast<char>(piece[offset - at] ^ 0xff);
      }
      CKPTD_ASSIGN_OR_RETURN(uint64_t ticket, out->Write(at, piece.data(), piece.size()));
      CKPTD_RETURN_IF_ERROR(out->WaitFor(ticket));
    }
    CKPTD_RETURN_IF_ERROR(in->Close());
    CKPTD_RETURN_IF_ERROR(out->Sync());
    CKPTD_RETURN_IF_ERROR(out->Close());
    CKPTD_RETURN_IF_ERROR(fs->Rename(tmp, path));
    return fs->SyncDir(storage::DirName(path));
  }();
  if (!status.ok()) (void)fs->RemoveFile(tmp);  // best effort: it may not exist
  return status;
}

}  // namespace

absl::Status DrillExecutor::CorruptShard(Drill* d) {
  const ckptd::v1::DrillOrder& o = d->order;
  if (hooks_.real_fs == nullptr) return absl::FailedPreconditionError("this agent has no file system for drills");
  storage::CheckpointStore store(hooks_.real_fs, options_.storage_root);
  CKPTD_ASSIGN_OR_RETURN(std::optional<uint64_t> step, store.LatestCommittedStep(o.job()));
  if (!step) return absl::NotFoundError(absl::StrCat("job ", o.job(), " has no committed step to corrupt"));
  const std::string path = storage::ShardPath(options_.storage_root, o.job(), *step, o.rank());
  storage::ShardReadOptions ro;
  ro.threads = 1;
  ro.direct_io = false;
  std::string tensor;
  int block = -1;
  int chunk = -1;
  uint64_t offset = 0;
  {
    CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardReader> reader,
                           storage::ShardReader::Open(hooks_.real_fs, path, ro));
    const ckptd::v1::ShardIndex& index = reader->index();
    for (const ckptd::v1::Tensor& t : index.tensors()) {
      for (int b = 0; b < t.blocks_size() && chunk < 0; ++b) {
        for (int c = 0; c < t.blocks(b).chunks_size(); ++c) {
          const ckptd::v1::Chunk& ch = t.blocks(b).chunks(c);
          if (ch.stored_length() == 0) continue;
          tensor = t.name();
          block = b;
          chunk = c;
          offset = ch.file_offset() + ch.stored_length() / 2;
          break;
        }
      }
      if (chunk >= 0) break;
    }
  }
  if (chunk < 0) return absl::FailedPreconditionError(absl::StrCat(path, " holds no chunk data to corrupt"));
  CKPTD_RETURN_IF_ERROR(CopyWithFlippedByte(hooks_.real_fs, path, offset));
  {
    absl::MutexLock l(&mu_);
    d->report.set_step(*step);
  }
  Injected(d, absl::StrCat("flipped the byte at offset ", offset, " of ", path, " (step ", *step, ", tensor '",
                           tensor, "', block ", block, ", chunk ", chunk, ")"));
  Ended(d);
  return absl::OkStatus();
}

absl::Status DrillExecutor::CorruptMemory(Drill* d) {
  const ckptd::v1::DrillOrder& o = d->order;
  if (!hooks_.corrupt_kept) return absl::FailedPreconditionError("this agent keeps no steps in memory for drills");
  const absl::Time deadline = clock_->Now() + options_.max_wait_for_commit;
  while (true) {
    CKPTD_ASSIGN_OR_RETURN(const TrainerInfo t, Trainer(o));
    // The step a restart would restore: the order's (the newest committed
    // when it was given), or one committed since (while the drill waited for
    // at_step, say).
    uint64_t step = o.step();
    if (hooks_.real_fs != nullptr) {
      storage::CheckpointStore store(hooks_.real_fs, options_.storage_root);
      CKPTD_ASSIGN_OR_RETURN(std::optional<uint64_t> newest, store.LatestCommittedStep(o.job()));
      if (!newest && step == 0) {
        return absl::NotFoundError(
            absl::StrCat("job ", o.job(), " has no committed step whose copy in memory to corrupt"));
      }
      step = std::max(step, newest.value_or(0));
    }
    absl::StatusOr<std::string> damaged = hooks_.corrupt_kept(o.job(), o.rank(), step);
    if (absl::IsUnavailable(damaged.status())) {
      // A newer step may be about to commit: look again shortly.
      if (clock_->Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(damaged.status().message(), ", and it did not commit within ",
                                                        absl::FormatDuration(options_.max_wait_for_commit)));
      }
      if (!Sleep(options_.step_poll)) {
        return absl::CancelledError(
            absl::StrCat("the agent stopped before the drill on ", RankName(o), " could start"));
      }
      continue;
    }
    CKPTD_RETURN_IF_ERROR(damaged.status());
    const absl::Time at = clock_->Now();
    {
      absl::MutexLock l(&mu_);
      d->report.set_step(step);
    }
    // The restart makes the rank's successor restore from the damaged copy.
    if (absl::Status killed = hooks_.signal(t.pid, SIGKILL); !killed.ok()) {
      return absl::Status(killed.code(),
                          absl::StrCat(*damaged, ", but the trainer could not be killed: ", killed.message()));
    }
    Injected(d, absl::StrCat(*damaged, "; SIGKILL sent to pid ", t.pid, " (", RankName(o), ", at step ", t.step, ")"),
             at);
    Ended(d);
    return absl::OkStatus();
  }
}

absl::Status DrillExecutor::StorageFault(Drill* d, absl::Duration duration) {
  const ckptd::v1::DrillOrder& o = d->order;
  storage::FaultInjectionFileSystem* const fs = hooks_.fault_fs;
  if (fs == nullptr) return absl::FailedPreconditionError("this agent has no fault-injecting file system");
  if (options_.storage_root.empty()) return absl::FailedPreconditionError("this agent has no storage root");
  std::optional<absl::Duration> slow;
  if (o.scenario() == ckptd::v1::STORAGE_SLOW) {
    CKPTD_ASSIGN_OR_RETURN(slow, Seconds(o.slow_seconds(), "slow_seconds", options_.max_duration));
  }
  {
    absl::MutexLock l(&mu_);
    if (storage_drill_) {
      return absl::FailedPreconditionError(absl::StrCat("storage drill ", *storage_drill_, " is still running"));
    }
    storage_drill_ = o.drill_id();
  }
  const std::string& root = options_.storage_root;
  std::string what;
  switch (o.scenario()) {
    case ckptd::v1::STORAGE_EIO:
      fs->FailPath(root, storage::Fault::kEio, storage::FaultScope::kAll);
      what = "every read and write fails with EIO";
      break;
    case ckptd::v1::STORAGE_ENOSPC:
      fs->FailPath(root, storage::Fault::kEnospc, storage::FaultScope::kWrites);
      what = "every write fails with ENOSPC";
      break;
    default:
      fs->SlowPath(root, *slow);
      what = absl::StrCat("every read and write waits ", absl::FormatDuration(*slow));
      break;
  }
  Injected(d, absl::StrCat("under ", root, " ", what, " for ", absl::FormatDuration(duration)));
  const bool full = Sleep(duration);
  if (slow) {
    fs->SlowPath(root, absl::ZeroDuration());
  } else {
    fs->ClearPath(root);
  }
  {
    absl::MutexLock l(&mu_);
    storage_drill_.reset();
  }
  Ended(d, full ? "lifted" : "lifted early: the agent is stopping");
  return absl::OkStatus();
}

}  // namespace ckptd::agent
