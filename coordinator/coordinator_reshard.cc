// CoordinatorCore: plans for restores that read a step resharded. Every
// rank of a job restored onto another world size needs slices of several
// saved shards; the coordinator reads the step's N shard indexes once
// (internal::ReshardLayouts) and tells each rank which slices of which
// shards to read, so that no rank reads the N indexes itself.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/coordinator_core_internal.h"
#include "coordinator/job.h"
#include "coordinator/reshard_layouts.h"
#include "storage/layout.h"
#include "storage/reshard_plan.h"
#include "storage/shard_index.h"

namespace ckptd::coordinator {

absl::StatusOr<ckptd::v1::ReshardPlanResponse> CoordinatorCore::GetReshardPlan(
    const ckptd::v1::ReshardPlanRequest& request) {
  CKPTD_RETURN_IF_ERROR(
      ValidateRankRequest(request.node_id(), request.job(), request.rank(), request.world_size()));
  if (request.buffers_size() == 0 || static_cast<size_t>(request.buffers_size()) > kMaxReshardBuffers) {
    return absl::InvalidArgumentError(absl::StrCat("a reshard plan is asked for ", request.buffers_size(),
                                                   " buffers; 1..", kMaxReshardBuffers, " are planned"));
  }
  std::set<std::string> names;
  for (int i = 0; i < request.buffers_size(); ++i) {
    const ckptd::v1::Tensor& b = request.buffers(i);
    const std::string what = absl::StrCat("buffer ", i);
    CKPTD_RETURN_IF_ERROR(storage::ValidateTensorMeta(b, what));
    if (b.blocks_size() > 0 || (b.has_replica() && b.replica().block_bytes() != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": a registered buffer carries no blocks or checksums"));
    }
    if (!names.insert(b.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": its name is another buffer's too"));
    }
  }
  {
    absl::MutexLock l(&mu_);
    CKPTD_ASSIGN_OR_RETURN(Agent * agent, AgentInSession(request.node_id(), request.session()));
    Job* job = FindJob(request.job());
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("job ", request.job(), " is not known"));
    if (job->world_size() != request.world_size()) {
      return absl::FailedPreconditionError(absl::StrCat("job ", request.job(), " runs ", job->world_size(),
                                                        " ranks, not ", request.world_size()));
    }
    CKPTD_RETURN_IF_ERROR(CheckSpeaksFor(*job, request.rank(), agent->node_id, /*moving=*/true));
    if (!job->committed().contains(request.step())) {
      return absl::FailedPreconditionError(
          absl::StrCat("step ", request.step(), " of job ", request.job(), " is not committed"));
    }
  }
  // Storage is read without the lock, once per step for every rank.
  CKPTD_ASSIGN_OR_RETURN(std::shared_ptr<const storage::SavedLayout> layout,
                         reshard_layouts_->Get(request.job(), request.step()));
  CKPTD_ASSIGN_OR_RETURN(
      const std::vector<storage::PlannedRead> reads,
      storage::PlanReshard(request.step(), request.rank(),
                           std::vector<ckptd::v1::Tensor>(request.buffers().begin(), request.buffers().end()),
                           *layout));
  ckptd::v1::ReshardPlanResponse response;
  response.set_saved_world_size(layout->world_size());
  std::set<uint32_t> shards;
  for (const storage::PlannedRead& r : reads) {
    ckptd::v1::ReshardRead* out = response.add_reads();
    out->set_saved_rank(r.rank);
    out->set_buffer(static_cast<uint32_t>(r.buffer));
    for (uint64_t o : r.source.offsets) out->add_offsets(o);
    for (uint64_t d : r.source.shape) out->add_shape(d);
    shards.insert(r.rank);
  }
  response.set_shards(static_cast<uint32_t>(shards.size()));
  return response;
}

uint64_t CoordinatorCore::reshard_layouts_read() const { return reshard_layouts_->loads(); }

}  // namespace ckptd::coordinator
