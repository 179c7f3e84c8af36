// CoordinatorCore: verification. A committed step is read back from storage
// and every chunk checked, on the caller's thread and without mu_; the step
// is pinned against retention meanwhile, and quarantined when damaged.
#include <optional>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/coordinator_core_internal.h"
#include "coordinator/job.h"
#include "storage/layout.h"

namespace ckptd::coordinator {

namespace {

ckptd::v1::VerifyProgress ToProto(const storage::StepVerifyReport& r) {
  ckptd::v1::VerifyProgress p;
  p.set_step(r.step);
  p.set_shards_total(static_cast<uint32_t>(r.shards_total));
  p.set_shards_done(static_cast<uint32_t>(r.shards));
  p.set_bytes_total(r.bytes_total);
  p.set_bytes_done(r.bytes_done);
  return p;
}

}  // namespace

absl::StatusOr<ckptd::v1::VerifyProgress> CoordinatorCore::VerifyStep(
    const ckptd::v1::VerifyStepRequest& request,
    const std::function<void(const ckptd::v1::VerifyProgress&)>& progress) {
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  uint64_t step = request.step();
  {
    absl::MutexLock l(&mu_);
    Job* job = FindJob(request.job());
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", request.job()));
    if (request.has_step()) {
      if (!job->committed().contains(step)) {
        return absl::FailedPreconditionError(
            absl::StrCat("step ", step, " of job ", request.job(), " is not committed"));
      }
    } else {
      std::optional<uint64_t> newest = job->NewestUsable();
      if (!newest) return absl::FailedPreconditionError(absl::StrCat("job ", request.job(), " has no committed step"));
      step = *newest;
    }
    job->Pin(step);
  }
  // Unpinned however the verification ends.
  absl::Cleanup unpin = [this, &request, step] {
    absl::MutexLock l(&mu_);
    if (Job* job = FindJob(request.job())) job->Unpin(step);
  };
  storage::ShardReadOptions ro;
  ro.threads = 2;  // beside the coordinator's own work
  absl::StatusOr<storage::StepVerifyReport> report =
      store_->VerifyStep(request.job(), step, ro, [&](const storage::StepVerifyReport& r) {
        if (progress) progress(ToProto(r));
      });
  CKPTD_RETURN_IF_ERROR(report.status());
  ckptd::v1::VerifyProgress done = ToProto(*report);
  done.set_done(true);
  done.set_ok(report->ok());
  for (const storage::VerifyProblem& p : report->problems) done.add_problems(p.message);
  if (!report->ok()) {
    Effects fx;
    {
      absl::MutexLock l(&mu_);
      Job* job = FindJob(request.job());
      if (job != nullptr && job->committed().contains(step) && !job->quarantined().contains(step)) {
        Quarantine(job, step, std::nullopt, absl::StrCat("verification: ", report->problems[0].message), &fx);
        job->MarkChanged();
        SaveJob(job, &fx);
      }
    }
    Apply(fx);
  }
  return done;
}

}  // namespace ckptd::coordinator
