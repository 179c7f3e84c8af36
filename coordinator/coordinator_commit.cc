// CoordinatorCore: the two-phase global commit. Agents report durable
// shards; the report that completes a step commits it (Apply, without mu_);
// the locked step after the commit records what it came to, aborts older
// pending steps and queues what retention drops.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/coordinator_core_internal.h"
#include "coordinator/job.h"
#include "storage/layout.h"

namespace ckptd::coordinator {

using ckptd::v1::ShardRef;
using ckptd::v1::ShardReport;
using internal::kMaxRanksPerAgent;

absl::StatusOr<bool> CoordinatorCore::AcceptShard(const std::string& node, const ShardReport& report,
                                                  const absl::Status& file_check, Effects* fx) {
  const uint64_t step = report.step();
  const uint32_t rank = report.shard().rank();
  const std::string what = absl::StrCat("job ", report.job(), " step ", step, " rank ", rank);
  Job* job = FindJob(report.job());
  if (job == nullptr) {
    CKPTD_ASSIGN_OR_RETURN(job, JobFor(report.job(), report.world_size()));
  }
  if (job->world_size() != report.world_size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": reported for a world of ", report.world_size(), "; the job runs ", job->world_size()));
  }
  if (report.emergency()) {
    if (job->committed().contains(step)) return true;  // a repeated report of a committed step
    CKPTD_RETURN_IF_ERROR(CheckEmergencyReport(*job, node, report));
    return AddShardOf(job, report, file_check, /*emergency=*/true, fx);
  }
  CKPTD_RETURN_IF_ERROR(CheckSpeaksFor(*job, rank, node, /*moving=*/false));
  if (job->committed().contains(step)) return true;  // a repeated report of a committed step
  if (absl::Status s = job->CheckIncarnation(report.incarnation()); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }
  if (report.incarnation() < job->incarnation()) {
    fx->aborts.emplace_back(job->name(), step);
    return absl::AbortedError(absl::StrCat(what, ": written before the job's latest restore; not committed"));
  }
  if (auto a = job->aborted().find(step); a != job->aborted().end() && report.incarnation() <= a->second.incarnation) {
    return absl::AbortedError(absl::StrCat(what, ": the step was aborted"));
  }
  if (report.memory_only()) {
    // Kept in memory, not written: complete once every rank has it. A step
    // no newer than the newest durable one is not needed and is ignored.
    job->RaiseIncarnation(report.incarnation());
    (void)job->AddMemoryShard(step, rank, {report.shard().file_length(), report.shard().index_xxh3()},
                              report.stall_seconds(), report.incarnation());
    return false;
  }
  if (std::optional<uint64_t> newest = job->NewestUsable(); newest && step < *newest) {
    fx->aborts.emplace_back(job->name(), step);
    return absl::FailedPreconditionError(absl::StrCat(what, ": older than committed step ", *newest, "; not needed"));
  }
  return AddShardOf(job, report, file_check, /*emergency=*/false, fx);
}

absl::Status CoordinatorCore::CheckEmergencyReport(const Job& job, const std::string& node,
                                                   const ShardReport& report) const {
  const uint64_t step = report.step();
  const uint32_t rank = report.shard().rank();
  const std::string what = absl::StrCat("emergency persist of job ", job.name(), " step ", step, " rank ", rank,
                                        " from node ", node);
  const std::optional<Job::Emergency>& e = job.emergency();
  if (!e) return absl::PermissionDeniedError(absl::StrCat(what, ": not ordered (no emergency persist is under way)"));
  if (e->step != step) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, ": not ordered (the emergency persist under way is of step ", e->step, ")"));
  }
  auto holder = e->holders.find(rank);
  if (holder == e->holders.end() || holder->second != node) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, ": not ordered (",
        holder == e->holders.end() ? std::string("no copy of the rank is to be written")
                                   : absl::StrCat("node ", holder->second, " writes the rank's copy"),
        ")"));
  }
  if (report.memory_only()) return absl::InvalidArgumentError(absl::StrCat(what, ": reported as kept in memory only"));
  if (report.incarnation() != e->incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": of incarnation ", report.incarnation(),
                                                      "; the memory checkpoint is of incarnation ", e->incarnation));
  }
  const std::optional<Job::ShardDigest> digest = job.CommittedShard(step, rank);
  if (!digest || digest->file_length != report.shard().file_length() ||
      digest->index_xxh3 != report.shard().index_xxh3()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the shard written (", report.shard().file_length(), " bytes, index xxh3 ",
        absl::Hex(report.shard().index_xxh3(), absl::kZeroPad16), ") is not the one the memory checkpoint reported",
        digest ? absl::StrCat(" (", digest->file_length, " bytes, index xxh3 ",
                              absl::Hex(digest->index_xxh3, absl::kZeroPad16), ")")
               : std::string()));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> CoordinatorCore::AddShardOf(Job* job, const ShardReport& report, const absl::Status& file_check,
                                                 bool emergency, Effects* fx) {
  const uint64_t step = report.step();
  const uint32_t rank = report.shard().rank();
  const std::string what = absl::StrCat("job ", report.job(), " step ", step, " rank ", rank);
  if (!file_check.ok()) {
    // The rank's shard of this step is not what it said: the step cannot
    // complete, and waiting for the deadline would only hold its files.
    AbortPending(job, step, std::string(file_check.message()), fx);
    return absl::Status(file_check.code(), absl::StrCat(what, ": ", file_check.message(), "; the step is aborted"));
  }
  // A coordinator that lost its database takes the rank's count (within
  // CheckIncarnation's rule), once the report is otherwise good.
  if (!emergency) job->RaiseIncarnation(report.incarnation());
  ShardRef ref = report.shard();
  ref.set_file(storage::ShardFileName(rank));  // never a client-supplied path
  const absl::Time now = clock_->Now();
  const bool complete = emergency ? job->AddEmergencyShard(step, ref, now)
                                  : job->AddShard(step, ref, report.stall_seconds(), report.incarnation(), now);
  if (observer_ != nullptr) observer_->OnShardReported(report);
  if (!complete) return false;
  const internal::PendingStep& p = job->pending().at(step);
  Effects::CommitTask task;
  task.job = job->name();
  task.step = step;
  task.world_size = job->world_size();
  for (const auto& [r, s] : p.shards) task.shards.push_back(s);
  task.last_report = now;
  task.stall = p.max_stall;
  task.persist = p.max_persist;
  task.measured = !p.emergency;
  fx->commits.push_back(std::move(task));
  return true;
}

absl::StatusOr<ckptd::v1::ReportShardResponse> CoordinatorCore::ReportShard(
    const ckptd::v1::ReportShardRequest& request) {
  CKPTD_RETURN_IF_ERROR(ValidateNodeId(request.node_id()));
  const bool single = request.has_report();
  if (!single && request.batch().empty()) return absl::InvalidArgumentError("the request reports no shard");
  if (request.batch_size() > static_cast<int>(kMaxRanksPerAgent)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a batch of ", request.batch_size(), " shards; at most ", kMaxRanksPerAgent));
  }
  if (single) CKPTD_RETURN_IF_ERROR(internal::ValidateShardReport(request.report(), options_.max_world_size));
  std::vector<absl::Status> results;
  for (const ShardReport& r : request.batch()) {
    results.push_back(internal::ValidateShardReport(r, options_.max_world_size));
  }
  // The files are looked at here, outside the lock and as each report comes,
  // not all at once when the last one completes the step: for thousands of
  // ranks that would put thousands of stat calls between the last report and
  // the commit.
  const absl::Status single_check = single ? CheckShardFile(request.report()) : absl::OkStatus();
  std::vector<absl::Status> checks(request.batch_size());
  for (int i = 0; i < request.batch_size(); ++i) {
    if (results[i].ok()) checks[i] = CheckShardFile(request.batch(i));
  }
  Effects fx;
  absl::Status accepted;
  {
    absl::MutexLock l(&mu_);
    CKPTD_RETURN_IF_ERROR(AgentInSession(request.node_id(), request.session()).status());
    const std::string& node = request.node_id();
    if (single) accepted = AcceptShard(node, request.report(), single_check, &fx).status();
    for (int i = 0; i < request.batch_size(); ++i) {
      if (results[i].ok()) results[i] = AcceptShard(node, request.batch(i), checks[i], &fx).status();
    }
    SaveChangedJobs(&fx);
  }
  Apply(fx);  // commits the steps these reports completed
  CKPTD_RETURN_IF_ERROR(accepted);
  ckptd::v1::ReportShardResponse response;
  absl::MutexLock l(&mu_);
  auto committed = [this](const ShardReport& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Job* job = FindJob(r.job());
    return job != nullptr && job->committed().contains(r.step());
  };
  if (single) response.set_committed(committed(request.report()));
  for (int i = 0; i < request.batch_size(); ++i) {
    ckptd::v1::ShardResult* out = response.add_batch_results();
    out->set_code(static_cast<int32_t>(results[i].code()));
    out->set_message(std::string(results[i].message()));
    out->set_committed(results[i].ok() && committed(request.batch(i)));
  }
  return response;
}

void CoordinatorCore::AbortPending(Job* job, uint64_t step, const std::string& why, Effects* fx) {
  if (!job->AbortStep(step, why)) return;  // committing: the commit decides
  ++counters_.aborted;
  fx->aborts.emplace_back(job->name(), step);
  fx->aborted_notes.emplace_back(job->name(), step, why);
}

absl::Status CoordinatorCore::CheckShardFile(const ShardReport& report) {
  if (report.memory_only()) return absl::OkStatus();  // no file: it is in memory
  return store_->CheckReportedShard(report.job(), report.step(), report.shard());
}

std::vector<absl::Status> CoordinatorCore::CheckShardFiles(
    const google::protobuf::RepeatedPtrField<ShardReport>& reports) {
  std::vector<absl::Status> checks;
  checks.reserve(reports.size());
  for (const ShardReport& r : reports) checks.push_back(CheckShardFile(r));
  return checks;
}

absl::Status CoordinatorCore::Commit(const std::string& job, uint64_t step, uint32_t world_size,
                                     const std::vector<ShardRef>& shards) {
  {
    absl::MutexLock l(&inflight_mu_);
    ++commits_in_flight_;
  }
  absl::Cleanup done = [this] {
    absl::MutexLock l(&inflight_mu_);
    --commits_in_flight_;
  };
  absl::MutexLock l(&commit_mu_);
  if (options_.may_write) {
    CKPTD_RETURN_IF_ERROR(options_.may_write());
    // Replicated: the intent first, in a write guarded by this leadership,
    // so that a leader deposed before it never writes the MANIFEST, and one
    // taking over keeps the step's files for a MANIFEST written after it.
    ckptd::v1::CommitIntent intent;
    intent.set_job(job);
    intent.set_step(step);
    intent.set_world_size(world_size);
    intent.set_unix_nanos(absl::ToUnixNanos(clock_->Now()));
    if (absl::Status s = state_->PutCommitIntent(intent); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("the commit intent could not be recorded, so the step is not "
                                                 "committed: ",
                                                 s.message()));
    }
    // Paused after etcd answered, past the lease: the intent is all it wrote.
    CKPTD_RETURN_IF_ERROR(options_.may_write());
  }
  // Each file was checked as it was reported (CheckShardFile).
  absl::StatusOr<ckptd::v1::StepManifest> m =
      store_->CommitStep(job, step, world_size, &shards, storage::CheckpointStore::CommitCheck::kCheckedByCaller);
  if (m.ok() || absl::IsAlreadyExists(m.status())) {
    if (auto it = foreign_intents_.find(job); it != foreign_intents_.end() && it->second.step == step) {
      foreign_intents_.erase(it);
    }
    return absl::OkStatus();
  }
  return m.status();
}

void CoordinatorCore::AfterCommits(std::vector<CommitResult>& results, Effects* next) {
  absl::MutexLock l(&mu_);
  for (CommitResult& r : results) AfterCommit(r, next);
}

void CoordinatorCore::AfterCommit(CommitResult& result, Effects* next) {
  const Effects::CommitTask& task = result.task;
  Job* job = FindJob(task.job);
  if (job == nullptr) return;
  job->EndCommit(task.step);
  if (!result.status.ok()) {
    AbortPending(job, task.step, std::string(result.status.message()), next);
    return;
  }
  job->MarkCommitted(task.step, task.stall, task.persist, task.measured);
  job->SetCommittedShards(task.step, task.shards);
  job->NoteCommitTime(clock_->Now());
  ++counters_.committed;
  if (!task.measured) {
    logger_->Info(absl::StrCat("job ", task.job, ": memory checkpoint ", task.step,
                               " is durable, written by the emergency persist after the failure"));
  }
  result.counted = true;
  // Older steps still pending will never be needed.
  for (uint64_t step : job->PendingBefore(task.step)) {
    AbortPending(job, step, absl::StrCat("step ", task.step, " committed first"), next);
  }
  // Removing thousands of files must not delay the answer to the report that
  // completed a step: RunRetention does it.
  for (uint64_t step : internal::RetentionDrops(*job, options_.keep_last)) {
    job->DropCommitted(step);
    retention_queue_.emplace_back(task.job, step);
  }
}

void CoordinatorCore::Apply(Effects& fx) {
  if (options_.may_write) {
    if (absl::Status s = options_.may_write(); !s.ok()) {
      if (!fx.empty()) logger_->Warning(absl::StrCat("not writing what was decided: ", s.message()));
      return;
    }
  }
  while (!fx.empty()) {
    Effects next;
    for (const auto& q : fx.quarantines) {
      {
        // Marked in storage too, so that every reader (ckptctl, an agent
        // committing alone) sees it. Best effort: the database has it.
        absl::MutexLock l(&commit_mu_);
        if (absl::Status s = store_->QuarantineStep(q.job(), q.step(), q.reason()); !s.ok()) {
          logger_->Warning(absl::StrCat("marking ", q.job(), " step ", q.step(), " quarantined: ", s.ToString()));
        }
      }
      if (absl::Status s = state_->PutQuarantine(q); !s.ok()) {
        logger_->Warning(absl::StrCat("recording quarantine of ", q.job(), " step ", q.step(), ": ", s.ToString()));
      }
    }
    for (const ckptd::v1::FailureEvent& e : fx.events) {
      if (observer_ != nullptr) observer_->OnFailure(e);
      if (absl::Status s = state_->AppendEvent(e); !s.ok()) {
        logger_->Warning(absl::StrCat("recording failure event: ", s.ToString()));
      }
    }
    for (const auto& [job, step, why] : fx.aborted_notes) {
      if (observer_ != nullptr) observer_->OnAborted(job, step, why);
    }
    // A leader deposed meanwhile removes nothing: the next one may be
    // committing these steps.
    const bool may_remove = !options_.may_write || options_.may_write().ok();
    for (const auto& [job, step] : fx.aborts) {
      if (!may_remove) break;
      absl::MutexLock l(&commit_mu_);
      if (auto it = foreign_intents_.find(job); it != foreign_intents_.end() && it->second.step == step) {
        if (!std::exchange(it->second.kept_once, true)) {
          logger_->Warning(absl::StrCat("job ", job, " step ", step, ": not committed here, but its files stay: the "
                                        "previous leader recorded its intent to commit it and may still write its "
                                        "MANIFEST"));
        }
        continue;
      }
      absl::Status s = store_->AbortStep(job, step);
      // Already gone, or committed after all: nothing to clean.
      if (!s.ok() && !absl::IsNotFound(s) && !absl::IsFailedPrecondition(s)) {
        logger_->Warning(absl::StrCat("removing aborted step ", step, " of ", job, ": ", s.ToString()));
      }
    }
    std::vector<CommitResult> results;
    for (Effects::CommitTask& task : fx.commits) {
      CommitResult& r = results.emplace_back();
      r.status = Commit(task.job, task.step, task.world_size, task.shards);
      r.latency = clock_->Now() - task.last_report;
      if (!r.status.ok()) {
        logger_->Warning(absl::StrCat("commit of ", task.job, " step ", task.step, " failed: ", r.status.ToString()));
      }
      r.task = std::move(task);
    }
    if (!results.empty()) {
      AfterCommits(results, &next);
      for (const CommitResult& r : results) {
        if (!r.counted || observer_ == nullptr) continue;
        uint64_t bytes = 0;
        for (const ShardRef& shard : r.task.shards) bytes += shard.file_length();
        observer_->OnCommitted(r.task.job, r.task.step, r.latency, bytes);
      }
    }
    if (!fx.drills.empty()) SaveDrills(fx.drills);
    for (const ckptd::v1::JobRecord& r : fx.records) {
      if (absl::Status s = state_->PutJob(r); !s.ok()) {
        logger_->Warning(absl::StrCat("saving job ", r.job(), ": ", s.ToString()));
      }
    }
    for (const auto& [job, why] : fx.blocked) {
      logger_->Warning(absl::StrCat("restart held back: ", why));
      if (observer_ != nullptr) observer_->OnRestoreBlocked(job, why);
    }
    for (const auto& [job, newest] : fx.fresh_over_damaged) {
      logger_->Warning(absl::StrCat("job ", job, " starts from scratch over its damaged committed steps (newest ",
                                    newest, "), as the operator allowed"));
      if (observer_ != nullptr) observer_->OnFreshStartOverDamaged(job, newest);
    }
    for (const std::string& job : fx.forgotten_jobs) {
      logger_->Info(absl::StrCat("forgot job ", job, ": none of its ranks ran for ",
                                 absl::FormatDuration(options_.forget_after)));
      if (absl::Status s = state_->DeleteJob(job); !s.ok()) {
        logger_->Warning(absl::StrCat("forgetting job ", job, ": ", s.ToString()));
      }
    }
    fx = std::move(next);
  }
}

}  // namespace ckptd::coordinator
