// AgentCore: the persister of each trainer: published snapshots written
// (or kept in memory as memory checkpoints), reported and counted.
#include "agent/agent_core.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/agent_core_internal.h"
#include "base/format.h"
#include "base/status_macros.h"
#include "protocol/schedule.h"
#include "storage/discarding_file_system.h"
#include "storage/layout.h"
#include "storage/replica.h"

namespace ckptd::agent {

using base::ByteUnits;
using base::FormatBytes;
using internal::ShardRefOf;

void AgentCore::PrepareSlots(Trainer* t) {
  staging::StagingSegment& seg = *t->segment;
  if (seg.slots_prepared() == seg.slots()) return;
  const TrainerRegistration& reg = t->reg;
  const absl::Time start = clock_->Now();
  for (uint32_t i = 0; i < seg.slots(); ++i) {
    {
      absl::MutexLock l(&t->mu);
      if (t->stopping) return;
    }
    if (options_.before_preparing_slot) options_.before_preparing_slot(i);
    absl::Status s = seg.PrepareSlot(i);
    // The trainer before prepared it meanwhile (it died while it did).
    if (!s.ok() && seg.state(i) != staging::SlotState::kPreparing) continue;
    if (!s.ok()) {
      logger_->Warning(absl::StrCat("job ", reg.job, " rank ", reg.rank, ": staging slot ", i, " of ", seg.slots(),
                                    " could not be allocated (", s.message(), "); snapshots use the ",
                                    seg.slots_prepared(), " slots ready"));
      return;
    }
  }
  const absl::Duration took = clock_->Now() - start;
  // Said because it matters: huge pages allocate, page-lock and restore
  // faster, and whether staging gets them is the machine's setting.
  const staging::MappedPages pages = seg.Mapped();
  std::string paging;
  if (pages.huge_bytes > 0) {
    paging = absl::StrCat(", ", pages.huge_bytes * 100 / pages.bytes, "% of it on huge pages");
  } else if (pages.bytes > 0) {
    paging = ", on 4 KiB pages (/dev/shm mounted with huge=advise gives huge pages: see docs/operations.md)";
  }
  logger_->Info(absl::StrCat("job ", reg.job, " rank ", reg.rank, ": staging ready, ", seg.slots(), " slots of ",
                             FormatBytes(seg.slot_bytes(), ByteUnits::kGiB), " allocated in the background in ",
                             absl::FormatDuration(absl::Trunc(took, absl::Milliseconds(1))), paging));
}

void AgentCore::PersistLoop(Trainer* t) {
  base::SetCallingThreadName("ckptd-persist");
  // Slots first (a restore may wait for one), then the trainers before, if
  // they still write into the segment (preparing touches no READY slot).
  PrepareSlots(t);
  t->preparing.store(false);
  WaitForPredecessor(t);
  // The encoder of this trainer's memory checkpoints (their shard indexes),
  // made by Register (its starvation reserve runs at the priority of the
  // thread that makes it, and must be normal); joined when this returns.
  const std::unique_ptr<base::ThreadPool> memory_encoder = std::move(t->memory_encoder);
  // Only now: a restore may wait for a slot that PrepareSlots allocates.
  // The persister waits for the disk and submits writes; the CPU work of a
  // persist is the pool's, at background_priority and guarded against
  // starvation. The persister itself cannot be raised again once lowered
  // (that needs CAP_SYS_NICE), so it runs at nice 19 at most: a
  // SCHED_IDLE persister would wait without bound to submit the next write
  // on a CPU kept busy, nice 19 gets about 1.5% of a busy core, plenty to
  // wait and submit.
  if (options_.background_priority != base::ThreadPriority::kNormal) {
    (void)base::SetCallingThreadPriority(base::ThreadPriority::kLow);
    (void)base::SetCallingThreadLowestIoPriority();
  }
  t->persister_tid.store(base::CurrentThreadId());
  while (true) {
    bool stop;
    {
      absl::MutexLock l(&t->mu);
      // Also polls: a trainer may publish and die before it could notify.
      clock_->AwaitWithTimeout(&t->mu,
                               absl::Condition(
                                   +[](Trainer* tr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tr->mu) {
                                     return tr->wake || tr->stopping;
                                   },
                                   t),
                               absl::Milliseconds(100));
      t->wake = false;
      stop = t->stopping;
    }
    while (std::optional<uint32_t> first = NextReady(t)) {
      std::vector<uint32_t> slots{*first};
      if (shutting_down_.load()) {
        // Everything published, newest first: the newest snapshot is worth
        // the time left most; older ones follow while it lasts, so that when
        // another rank cannot finish the newest step, the job still has an
        // older one every rank wrote. (The slots are taken in step order.)
        while (std::optional<uint32_t> more = NextReady(t)) slots.push_back(*more);
        std::reverse(slots.begin(), slots.end());
      }
      for (const uint32_t slot : slots) PersistSlot(t, slot, memory_encoder.get());
    }
    if (stop) {
      // Failures not reported yet are, before the trainer is forgotten.
      std::string line;
      {
        absl::MutexLock l(&t->mu);
        if (t->failures_unlogged > 0) {
          line = absl::StrCat("job ", t->reg.job, " rank ", t->reg.rank, ": ", t->failures_unlogged,
                              " more persists failed since the last report, the newest of step ",
                              t->status.last_failed_step.value_or(0), ": ", t->status.last_error.message());
          t->failures_unlogged = 0;
        }
      }
      if (!line.empty()) logger_->Warning(line);
      absl::MutexLock l(&t->mu);
      t->drained = true;
      return;
    }
  }
}

std::optional<uint32_t> AgentCore::NextReady(Trainer* t) {
  absl::MutexLock l(&t->mu);
  if (!t->exit_drain) return t->segment->TakeReady();
  while (!t->exit_drain->empty()) {
    const auto [slot, step] = t->exit_drain->front();
    t->exit_drain->erase(t->exit_drain->begin());
    if (t->segment->TakeReadySlot(slot, step)) return slot;
  }
  return std::nullopt;
}

void AgentCore::PersistSlot(Trainer* t, uint32_t slot, base::ThreadPool* memory_encoder) {
  const bool shutting_down = shutting_down_.load();
  const uint64_t step = t->segment->step(slot);
  const absl::Time published = TakePublishedAt(t, slot, step, clock_->Now());
  const std::string who = absl::StrCat("shutting down: job ", t->reg.job, " rank ", t->reg.rank, ": step ", step);
  if (IsMemoryCheckpoint(t, step)) {
    if (shutting_down) {
      logger_->Info(absl::StrCat(who, " is a memory checkpoint and is not written"));
      (void)t->segment->Release(slot);
      return;
    }
    KeepInMemory(t, slot, memory_encoder);
    return;
  }
  if (shutting_down) {
    // Written newest first: once a newer step committed, an older one is of
    // no use to any restart.
    std::optional<uint64_t> committed;
    {
      absl::MutexLock l(&t->mu);
      committed = t->status.last_committed_step;
    }
    if (committed && *committed > step) {
      logger_->Info(absl::StrCat(who, " is not persisted: step ", *committed, ", newer, is committed"));
      (void)t->segment->Release(slot);
      return;
    }
  }
  if (shutting_down && write_.stop()) {
    logger_->Warning(absl::StrCat(who, " is not persisted: the shutdown's grace period ended before its turn"));
    (void)t->segment->Release(slot);
    absl::MutexLock l(&t->mu);
    ++t->status.failed;
    t->status.last_error = absl::CancelledError("the agent's shutdown grace period ended before it was written");
    t->status.last_failed_step = step;
    return;
  }
  bool released = false;
  bool kept = false;
  // The slot goes back to the trainer: KEPT (the snapshot stays in
  // memory, and the trainer takes it when it has no free slot) or FREE.
  auto release = [&] {
    if (released) return;
    released = true;
    kept = options_.keep_in_memory && t->segment->Keep(slot).ok();
    if (!kept) (void)t->segment->Release(slot);
  };
  storage::ShardWriteResult written;
  absl::Status s = PersistOne(t, slot, release, &written);
  // The slot is the trainer's again whatever happened: training goes on.
  release();
  if (kept && s.ok() && written.index != nullptr) {
    const KeptStep k{slot, step, written.file_length, written.index_xxh3, written.index};
    SetKept(t, k);
    Replicate(t, k);
  } else if (kept) {
    t->segment->Unkeep(slot, step);
  }
  // Counted before the status says so (WaitPersisted returns on it).
  if (options_.observer != nullptr && s.ok()) {
    options_.observer->OnPersisted(t->reg.job, written.file_length, absl::ToDoubleSeconds(clock_->Now() - published));
  } else if (options_.observer != nullptr && !absl::IsCancelled(s)) {  // cancelled: stopped by the shutdown
    options_.observer->OnPersistFailed(t->reg.job);
  }
  if (shutting_down_.load()) {
    NoteShutdownPersist(t, step, s);
  } else {
    NotePersisted(t, step, s);
  }
}

absl::Time AgentCore::TakePublishedAt(Trainer* t, uint32_t slot, uint64_t step, absl::Time otherwise) {
  absl::MutexLock l(&t->mu);
  auto it = t->published_by_slot.find(slot);
  if (it == t->published_by_slot.end()) return otherwise;
  const auto [published_step, at] = it->second;
  t->published_by_slot.erase(it);
  return published_step == step ? std::min(at, otherwise) : otherwise;
}

bool AgentCore::IsMemoryCheckpoint(Trainer* t, uint64_t step) {
  if (options_.coordinator == nullptr || !options_.keep_in_memory) return false;
  const std::optional<ckptd::v1::Schedule> schedule = options_.coordinator->ScheduleFor(t->reg.job);
  return schedule && protocol::ScheduledAt(*schedule, step) && !protocol::DurableAt(*schedule, step);
}

void AgentCore::TakeReportStamps(Trainer* t, uint32_t slot, double* stall, uint64_t* incarnation) {
  *stall = 0;
  absl::MutexLock l(&t->mu);
  if (auto it = t->stall_by_slot.find(slot); it != t->stall_by_slot.end()) {
    *stall = it->second;
    t->stall_by_slot.erase(it);
  }
  *incarnation = t->incarnation;
  t->last_stall = *stall;
}

absl::StatusOr<std::vector<storage::TensorSource>> AgentCore::SlotSources(Trainer* t, uint32_t slot,
                                                                         base::ThreadPool* pool) {
  const TrainerRegistration& reg = t->reg;
  std::vector<storage::TensorSource> sources(reg.buffers.size());
  bool replicated = false;
  for (size_t i = 0; i < reg.buffers.size(); ++i) {
    sources[i].meta = reg.buffers[i];
    sources[i].data = t->segment->slot_data(slot) + t->layout.offsets[i];
    sources[i].length = t->layout.lengths[i];
    replicated |= reg.buffers[i].has_replica();
  }
  if (!replicated) return sources;
  return storage::ShareSources(sources, options_.write.block_bytes, pool);
}

void AgentCore::ReportPersistFailed(Trainer* t, uint64_t step, const absl::Status& s) {
  ckptd::v1::ReportFailureRequest f;
  f.set_job(t->reg.job);
  f.set_rank(t->reg.rank);
  f.set_kind(ckptd::v1::PERSIST_FAILED);
  f.set_step(step);
  f.set_detail(std::string(s.message()).substr(0, 4000));
  options_.coordinator->Failure(f);
}

ckptd::v1::ShardReport AgentCore::ShardReportOf(Trainer* t, uint64_t step, double stall, uint64_t incarnation,
                                                const storage::ShardWriteResult& written, double seconds) {
  ckptd::v1::ShardReport report;
  report.set_job(t->reg.job);
  report.set_step(step);
  report.set_world_size(t->reg.world_size);
  report.set_stall_seconds(stall);
  report.set_incarnation(incarnation);
  *report.mutable_shard() = ShardRefOf(t->reg.rank, written);
  report.mutable_shard()->set_persist_seconds(seconds);
  return report;
}

void AgentCore::KeepInMemory(Trainer* t, uint32_t slot, base::ThreadPool* encoder) {
  const TrainerRegistration& reg = t->reg;
  const uint64_t step = t->segment->step(slot);
  const std::string what = absl::StrCat("job ", reg.job, " rank ", reg.rank, ": memory checkpoint of step ", step);
  double stall = 0;
  uint64_t incarnation = 0;
  TakeReportStamps(t, slot, &stall, &incarnation);
  // The shard a raw write of the snapshot would be, written nowhere. One
  // encoder, as MemoryShardOptions asks, at the persists' priority.
  const absl::Time start = clock_->Now();
  absl::StatusOr<std::vector<storage::TensorSource>> sources = SlotSources(t, slot, encoder);
  absl::StatusOr<storage::ShardWriteResult> result = absl::UnknownError("not written");
  if (!sources.ok()) {
    result = sources.status();
  } else {
    storage::DiscardingFileSystem nowhere;
    result = storage::WriteShard(&nowhere, storage::ShardFileName(reg.rank), {reg.job, step, reg.rank, reg.world_size},
                                 *sources, MemoryShardOptions(options_.write), encoder);
  }
  const double index_seconds = absl::ToDoubleSeconds(clock_->Now() - start);
  if (!result.ok()) {
    (void)t->segment->Release(slot);  // PERSISTING -> FREE: the trainer's again
    const absl::Status failed(result.status().code(),
                              absl::StrCat(what, ": its shard index could not be made: ", result.status().message()));
    // Counted and reported as a failed checkpoint: the coordinator hears of
    // no shard of the step from this rank.
    ReportPersistFailed(t, step, failed);
    if (options_.observer != nullptr) options_.observer->OnPersistFailed(reg.job);
    NotePersisted(t, step, failed);
    return;
  }
  const staging::StagingSegment& seg = *t->segment;
  if (!t->segment->Keep(slot).ok()) {
    // Not PERSISTING any more: the slot is not the persister's to free, and
    // a Release that fails changes nothing.
    (void)t->segment->Release(slot);
    logger_->Info(absl::StrCat(what, " is not kept: its staging slot ", slot, " is ",
                               staging::SlotStateName(seg.state(slot)), ", not being persisted"));
    return;
  }
  const KeptStep kept{slot, step, result->file_length, result->index_xxh3, result->index};
  SetKept(t, kept);
  Replicate(t, kept);
  // The coordinator counts the step as held in memory: not when the trainer
  // took the slot back for a snapshot already.
  if (seg.state(slot) != staging::SlotState::kKept || seg.step(slot) != step) {
    {
      absl::MutexLock l(&t->mu);
      std::erase_if(t->kept, [&](const KeptStep& k) { return k.slot == slot && k.step == step; });
    }
    logger_->Info(
        absl::StrCat(what, " is not reported: the trainer took its staging slot ", slot, " back for a snapshot first"));
    return;
  }
  ckptd::v1::ShardReport report = ShardReportOf(t, step, stall, incarnation, *result, index_seconds);
  report.set_memory_only(true);
  options_.coordinator->ShardDurable(report);
  if (options_.observer != nullptr) options_.observer->OnMemoryCheckpoint(reg.job);
  absl::MutexLock l(&t->mu);
  ++t->status.memory_checkpoints;
  t->status.last_memory_step = step;
}

void AgentCore::NoteShutdownPersist(Trainer* t, uint64_t step, const absl::Status& s) {
  const std::string who = absl::StrCat("shutting down: job ", t->reg.job, " rank ", t->reg.rank, ": step ", step);
  if (s.ok()) {
    logger_->Info(absl::StrCat(who, " is durable and ",
                               options_.coordinator != nullptr
                                   ? "reported to the coordinator, which commits it once every rank has reported it"
                                   : "handed to this agent's commit (done once every rank of the job has it)"));
  } else if (absl::IsCancelled(s)) {
    logger_->Warning(absl::StrCat(who, " was stopped at the end of the shutdown's grace period (", s.message(),
                                  "): nothing of it is left on disk, and the newest committed step stays the one "
                                  "to restore"));
  } else {
    logger_->Warning(absl::StrCat(who, " failed: ", s.message()));
  }
  absl::MutexLock l(&t->mu);
  if (s.ok()) {
    // Older steps are written after the newest at shutdown.
    t->status.last_persisted_step = std::max(t->status.last_persisted_step.value_or(0), step);
    ++t->status.persisted;
  } else {
    ++t->status.failed;
    t->status.last_error = s;
    t->status.last_failed_step = step;
  }
}

void AgentCore::NotePersisted(Trainer* t, uint64_t step, const absl::Status& s) {
  const TrainerRegistration& reg = t->reg;
  std::string line;
  bool warning = false;
  // Logged before the lock goes: whoever waits for the step (WaitPersisted)
  // finds it reported.
  absl::MutexLock l(&t->mu);
  if (s.ok()) {
    t->status.last_persisted_step = step;
    ++t->status.persisted;
    if (t->failed_in_a_row > 0) {
      line = absl::StrCat("persists of job ", reg.job, " rank ", reg.rank, " succeed again after ", t->failed_in_a_row,
                          t->failed_in_a_row == 1 ? " failure" : " failures", " (step ", step, " persisted)");
    }
    t->failed_in_a_row = 0;
    t->failures_unlogged = 0;
    t->failure_logged_at.reset();
  } else {
    ++t->status.failed;
    t->status.last_error = s;
    t->status.last_failed_step = step;
    ++t->failed_in_a_row;
    const absl::Time now = clock_->Now();
    const absl::Duration every = options_.persist_failure_log_interval;
    if (!t->failure_logged_at || now - *t->failure_logged_at >= every) {
      warning = true;
      line = absl::StrCat("persist of job ", reg.job, " rank ", reg.rank, " step ", step, " failed: ", s.message());
      if (t->failures_unlogged > 0) {
        absl::StrAppend(&line, "; ", t->failures_unlogged, " more failed since the last report (", t->failed_in_a_row,
                        " in a row)");
      } else if (t->failed_in_a_row == 1 && every > absl::ZeroDuration()) {
        absl::StrAppend(&line, "; further failures of this rank are reported at most every ",
                        absl::FormatDuration(every));
      }
      t->failure_logged_at = now;
      t->failures_unlogged = 0;
    } else {
      ++t->failures_unlogged;
    }
  }
  if (line.empty()) return;
  if (warning) {
    logger_->Warning(line);
  } else {
    logger_->Info(line);
  }
}

void AgentCore::BeginWriting(const std::string& job, uint64_t step) {
  absl::MutexLock l(&writing_mu_);
  ++writing_[{job, step}];
}

void AgentCore::EndWriting(const std::string& job, uint64_t step) {
  absl::MutexLock l(&writing_mu_);
  if (auto it = writing_.find({job, step}); it != writing_.end() && --it->second == 0) writing_.erase(it);
}

void AgentCore::CleanUpFailedStep(Trainer* t, uint64_t step) {
  const TrainerRegistration& reg = t->reg;
  // Held throughout: no persist of this agent starts writing the step meanwhile.
  absl::MutexLock l(&writing_mu_);
  if (writing_.contains({reg.job, step})) return;  // another rank's persist writes it
  if (local_) local_->Discard({reg.job, step, reg.rank, reg.world_size});
  // Best effort: the shard writer removes its temp file itself, unless the
  // file system refused that too.
  (void)fs_->RemoveFile(
      absl::StrCat(storage::ShardPath(options_.storage_root, reg.job, step, reg.rank), storage::kTempSuffix));
  // Kept (kFailedPrecondition) when it holds a MANIFEST or another rank's
  // shard, or is a link; anything else is only wasted space, cleaned up after
  // the next commit.
  (void)store_.RemoveEmptyStep(reg.job, step);
}

absl::StatusOr<storage::ShardWriteResult> AgentCore::WriteShard(Trainer* t, uint64_t step,
                                                            absl::Span<const storage::TensorSource> sources,
                                                            const std::function<void()>& release) {
  const TrainerRegistration& reg = t->reg;
  if (local_) return local_->Persist({reg.job, step, reg.rank, reg.world_size}, sources, release, &t->local);
  CKPTD_RETURN_IF_ERROR(store_.PrepareStep(reg.job, step));
  return store_.WriteShard(reg.job, step, reg.rank, reg.world_size, sources, write_, &pool_);
}

void AgentCore::DropLocalStepsAbove(const std::string& job, uint64_t step) {
  if (local_) local_->DropStepsAbove(job, step);
  DropKeptAbove(job, step);
}

absl::Status AgentCore::PersistOne(Trainer* t, uint32_t slot, const std::function<void()>& release,
                                   storage::ShardWriteResult* written) {
  const TrainerRegistration& reg = t->reg;
  const uint64_t step = t->segment->step(slot);
  double stall = 0;
  uint64_t incarnation = 0;
  // Taken now: once the slot is released it may hold the next snapshot.
  TakeReportStamps(t, slot, &stall, &incarnation);
  BeginWriting(reg.job, step);
  const absl::Time start = clock_->Now();
  absl::StatusOr<std::vector<storage::TensorSource>> sources = SlotSources(t, slot, &pool_);
  absl::StatusOr<storage::ShardWriteResult> result =
      sources.ok() ? WriteShard(t, step, *sources, release) : absl::StatusOr<storage::ShardWriteResult>(sources.status());
  const double persist_seconds = absl::ToDoubleSeconds(clock_->Now() - start);
  EndWriting(reg.job, step);
  if (!result.ok()) CleanUpFailedStep(t, step);
  if (result.ok()) {
    *written = *result;
    absl::MutexLock l(&t->mu);
    t->last_persist = persist_seconds;
  }
  if (options_.coordinator != nullptr) {
    if (!result.ok()) {
      // A write stopped because the agent exits is no failure of the storage.
      if (!absl::IsCancelled(result.status())) ReportPersistFailed(t, step, result.status());
      return result.status();
    }
    // The coordinator commits: it hears of every shard, this one included.
    options_.coordinator->ShardDurable(ShardReportOf(t, step, stall, incarnation, *result, persist_seconds));
    return absl::OkStatus();
  }
  CKPTD_RETURN_IF_ERROR(result.status());
  return CommitAlone(t, step, *result);
}

}  // namespace ckptd::agent
