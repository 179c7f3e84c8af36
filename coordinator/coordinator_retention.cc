// CoordinatorCore: retention. A commit's locked step (coordinator_commit.cc)
// decides what retention drops and queues it; RunRetention removes the
// queued steps from storage, paced so that commits go first.
#include <algorithm>
#include <cstddef>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/coordinator_core_internal.h"
#include "coordinator/job.h"
#include "storage/store.h"

namespace ckptd::coordinator {

namespace internal {

std::vector<uint64_t> RetentionDrops(const Job& job, int keep_last) {
  std::set<uint64_t> usable;
  for (uint64_t step : job.committed()) {
    if (!job.quarantined().contains(step)) usable.insert(step);
  }
  return storage::RetentionDrops(usable, keep_last, [&job](uint64_t step) { return job.verifying(step); });
}

}  // namespace internal

void CoordinatorCore::RunRetention(const std::function<bool()>& stop) {
  std::vector<std::pair<std::string, uint64_t>> queue;
  {
    absl::MutexLock l(&mu_);
    queue.swap(retention_queue_);
  }
  if (options_.may_write && !queue.empty()) {
    if (absl::Status s = options_.may_write(); !s.ok()) {
      logger_->Warning(absl::StrCat("not removing what retention dropped: ", s.message()));
      return;
    }
  }
  // Without commit_mu_: a committed step that retention dropped is never
  // written or committed again, and removing its thousands of files must not
  // hold up the commit of a newer step.
  storage::CheckpointStore::RemovePacing pacing;
  pacing.before_batch = [this] {
    // Bounded: a stream of commits must not hold retention off for ever.
    absl::MutexLock l(&inflight_mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(inflight_mu_) { return commits_in_flight_ == 0; };
    inflight_mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(1));
  };
  for (size_t i = 0; i < queue.size(); ++i) {
    if (stop && stop()) {
      // Left for the next run (the queue may have grown meanwhile).
      absl::MutexLock l(&mu_);
      retention_queue_.insert(retention_queue_.begin(), queue.begin() + static_cast<std::ptrdiff_t>(i), queue.end());
      return;
    }
    const auto& [job, step] = queue[i];
    if (absl::Status s = store_->RemoveStep(job, step, &pacing); !s.ok() && !absl::IsNotFound(s)) {
      logger_->Warning(absl::StrCat("retention of ", job, " step ", step, ": ", s.ToString()));
    }
  }
}

}  // namespace ckptd::coordinator
