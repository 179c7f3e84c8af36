// CoordinatorCore: failures and what follows them. A failure stops the job
// for a restart; every rank then asks for a restore plan, and a round brings
// them all back to the same intact step (or a fresh start). A damaged shard
// quarantines its step and sends every rank to the step before.
#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/coordinator_core_internal.h"
#include "coordinator/job.h"
#include "storage/layout.h"

namespace ckptd::coordinator {

using ckptd::v1::FailureKind;
using ckptd::v1::RestorePlanResponse;

void CoordinatorCore::RecordFailure(Job* job, const std::string& node, std::optional<uint32_t> rank, FailureKind kind,
                                    const std::string& detail, Effects* fx) {
  const absl::Time now = clock_->Now();
  ckptd::v1::FailureEvent e;
  e.set_unix_nanos(absl::ToUnixNanos(now));
  e.set_node_id(node);
  if (job != nullptr) e.set_job(job->name());
  if (rank) {
    e.set_has_rank(true);
    e.set_rank(*rank);
  }
  e.set_kind(kind);
  e.set_detail(detail);
  ++counters_.failures[kind];
  fx->events.push_back(e);
  if (job != nullptr && kind != ckptd::v1::PERSIST_FAILED && kind != ckptd::v1::SHARD_DAMAGED) job->Restart(now);
}

absl::Status CoordinatorCore::ReportFailure(const ckptd::v1::ReportFailureRequest& request) {
  CKPTD_RETURN_IF_ERROR(ValidateNodeId(request.node_id()));
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  if (request.kind() != ckptd::v1::TRAINER_DIED && request.kind() != ckptd::v1::TRAINER_HUNG &&
      request.kind() != ckptd::v1::PERSIST_FAILED) {
    return absl::InvalidArgumentError(
        absl::StrCat("an agent cannot report failures of kind ", ckptd::v1::FailureKind_Name(request.kind())));
  }
  if (request.detail().size() > 4096) return absl::InvalidArgumentError("failure detail is longer than 4096 bytes");
  Effects fx;
  {
    absl::MutexLock l(&mu_);
    auto it = agents_.find(request.node_id());
    if (it == agents_.end() || it->second->session != request.session()) {
      return absl::NotFoundError(
          absl::StrCat("node ", request.node_id(), " is not registered with this session; register again"));
    }
    Job* job = FindJob(request.job());
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", request.job()));
    if (request.rank() >= job->world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", request.rank(), " is not inside world size ", job->world_size()));
    }
    std::string detail = request.detail();
    if (request.kind() == ckptd::v1::PERSIST_FAILED) {
      absl::StrAppend(&detail, detail.empty() ? "" : "; ", "step ", request.step());
      if (job->pending().contains(request.step()) || !job->committed().contains(request.step())) {
        AbortPending(job, request.step(), absl::StrCat("rank ", request.rank(), " could not persist it"), &fx);
      }
    }
    if (request.kind() == ckptd::v1::TRAINER_DIED) job->RankGone(request.rank(), request.node_id());
    RecordFailure(job, request.node_id(), request.rank(), request.kind(), detail, &fx);
    SaveChangedJobs(&fx);
  }
  Apply(fx);
  return absl::OkStatus();
}

void CoordinatorCore::Quarantine(Job* job, uint64_t step, std::optional<uint32_t> rank, const std::string& reason,
                                 Effects* fx) {
  job->Quarantine(step, reason);
  ckptd::v1::QuarantinedStep q;
  q.set_job(job->name());
  q.set_step(step);
  q.set_reason(reason);
  q.set_unix_nanos(absl::ToUnixNanos(clock_->Now()));
  fx->quarantines.push_back(q);
  RecordFailure(job, "", rank, ckptd::v1::SHARD_DAMAGED, absl::StrCat("step ", step, ": ", reason), fx);
}

void CoordinatorCore::StartRestoreRound(Job* job, Effects* fx) {
  // Work after the restored step is redone; what was pending of it is void
  // (aborted in the incarnation that wrote it).
  for (uint64_t step : job->PendingAfter(job->NewestUsable())) {
    AbortPending(job, step, "the job restarted from an earlier step", fx);
  }
  job->StartRestoreRound();
}

absl::StatusOr<RestorePlanResponse> CoordinatorCore::GetRestorePlan(const ckptd::v1::RestorePlanRequest& request) {
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  if (request.world_size() == 0 || request.world_size() > options_.max_world_size ||
      request.rank() >= request.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", request.rank(), " is not inside world size ",
                                                   request.world_size(), " (at most ", options_.max_world_size, ")"));
  }
  if (request.problem().size() > 4096) return absl::InvalidArgumentError("problem is longer than 4096 bytes");
  Effects fx;
  RestorePlanResponse response;
  {
    absl::MutexLock l(&mu_);
    CKPTD_ASSIGN_OR_RETURN(Job * job, JobFor(request.job(), request.world_size()));
    if (job->NeedsNewRound(request.rank(), request.has_attempt())) StartRestoreRound(job, &fx);
    const std::optional<uint64_t> step = job->round()->step;
    if (!step) {
      response = job->StartsFresh(request.rank());
    } else if (!request.has_attempt() || request.attempt_step() != *step) {
      response = job->NotLoaded(request.rank());
    } else if (request.attempt_ok()) {
      response = job->Loaded(request.rank());
    } else {
      // One damaged shard spoils the step for every rank: quarantine it and
      // send everyone to the step before.
      Quarantine(job, *step, request.rank(), absl::StrCat("rank ", request.rank(), ": ", request.problem()), &fx);
      response = job->FallBack();
    }
    SaveJob(job, &fx);
  }
  Apply(fx);
  return response;
}

absl::StatusOr<ckptd::v1::RestorePreview> CoordinatorCore::GetRestorePreview(
    const ckptd::v1::RestorePreviewRequest& request) {
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  absl::MutexLock l(&mu_);
  const Job* job = FindJob(request.job());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", request.job()));
  ckptd::v1::RestorePreview p;
  p.set_job(job->name());
  p.set_state(job->state());
  p.set_incarnation(job->incarnation());
  const std::optional<uint64_t> newest = job->NewestUsable();
  for (const auto& [step, why] : job->quarantined()) {
    if (newest && step < *newest) continue;
    ckptd::v1::StepEntry* e = p.add_passed_over();
    e->set_step(step);
    e->set_state(ckptd::v1::STEP_QUARANTINED);
    e->set_reason(absl::StrCat("quarantined: ", why));
  }
  for (const auto& [step, pending] : job->pending()) {
    if (newest && step < *newest) continue;
    ckptd::v1::StepEntry* e = p.add_passed_over();
    e->set_step(step);
    e->set_state(ckptd::v1::STEP_PENDING);
    e->set_world_size(job->world_size());
    e->set_ranks_reported(static_cast<uint32_t>(pending.shards.size()));
    e->set_reason(absl::StrCat("not committed: ", pending.shards.size(), " of ", job->world_size(), " ranks durable"));
  }
  std::sort(p.mutable_passed_over()->begin(), p.mutable_passed_over()->end(),
            [](const ckptd::v1::StepEntry& a, const ckptd::v1::StepEntry& b) { return a.step() > b.step(); });
  if (!newest) {
    p.set_fresh_start(true);
    p.set_reason(job->committed().empty() ? "no step of the job is committed: every rank starts fresh"
                                          : "every committed step is quarantined: every rank starts fresh");
    return p;
  }
  p.set_step(*newest);
  p.set_reason(absl::StrCat(
      "step ", *newest, " is the newest committed step that is not quarantined; every rank loads it and checks ",
      "its shard, and a damaged shard quarantines it and sends every rank to the committed step before"));
  return p;
}

}  // namespace ckptd::coordinator
