// CoordinatorCore: drills. An operator orders a fault from the agent of the
// node concerned (the DrillBook keeps the orders, sent with its heartbeat
// answers until it reports) and reads back what followed: the agent's
// report, the failures recorded since, and the restart that came of it.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/coordinator_core_internal.h"
#include "coordinator/drill_book.h"
#include "coordinator/job.h"
#include "storage/layout.h"

namespace ckptd::coordinator {

using ckptd::v1::DrillScenario;
using ckptd::v1::FailureEvent;
using internal::Job;

namespace {

bool IsTimed(DrillScenario s) {
  return s == ckptd::v1::HANG_TRAINER || s == ckptd::v1::CUT_OFF_AGENT || s == ckptd::v1::STORAGE_EIO ||
         s == ckptd::v1::STORAGE_ENOSPC || s == ckptd::v1::STORAGE_SLOW;
}

// Scenarios that act on a node (its agent or its storage), not on a rank.
bool TargetsNode(DrillScenario s) {
  return s == ckptd::v1::KILL_AGENT || s == ckptd::v1::KILL_NODE || s == ckptd::v1::CUT_OFF_AGENT ||
         s == ckptd::v1::STORAGE_EIO || s == ckptd::v1::STORAGE_ENOSPC || s == ckptd::v1::STORAGE_SLOW;
}

// What can be checked of a drill request without the coordinator's state.
absl::Status ValidateDrill(const ckptd::v1::RunDrillRequest& request) {
  const DrillScenario scenario = request.scenario();
  if (scenario == ckptd::v1::DRILL_SCENARIO_UNSPECIFIED || !ckptd::v1::DrillScenario_IsValid(scenario)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown drill scenario ", static_cast<int>(scenario)));
  }
  const std::string name = ckptd::v1::DrillScenario_Name(scenario);
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  const double duration = request.duration_seconds();
  if (IsTimed(scenario) && !(duration > 0 && duration <= 3600)) {
    return absl::InvalidArgumentError(absl::StrCat(name, " needs a duration in (0 s, 1 h]; got ", duration, " s"));
  }
  if (scenario == ckptd::v1::STORAGE_SLOW && !(request.slow_seconds() > 0 && request.slow_seconds() <= 60)) {
    return absl::InvalidArgumentError(
        absl::StrCat("STORAGE_SLOW needs a delay per operation in (0 s, 60 s]; got ", request.slow_seconds(), " s"));
  }
  if (request.at_step() > internal::kMaxStep) return absl::InvalidArgumentError("the drill's step is out of range");
  if (request.with_partners() && scenario != ckptd::v1::KILL_NODE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "with_partners (ckptctl drill run --with-partners) applies to KILL_NODE only, not to ", name));
  }
  if (scenario == ckptd::v1::KILL_COORDINATOR && (!request.target_node().empty() || request.at_step() > 0)) {
    return absl::InvalidArgumentError("KILL_COORDINATOR strikes the leading coordinator at once: no target or step");
  }
  if (!request.target_node().empty()) {
    CKPTD_RETURN_IF_ERROR(ValidateNodeId(request.target_node()));
    if (!TargetsNode(scenario)) {
      return absl::InvalidArgumentError(absl::StrCat(name, " targets a rank, not a node"));
    }
  }
  return absl::OkStatus();
}

// The node a drill on a rank goes to: the rank's.
absl::StatusOr<std::string> NodeOfRank(const Job& job, const ckptd::v1::RunDrillRequest& request) {
  if (request.rank() >= job.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", request.rank(), " is not inside world size ", job.world_size()));
  }
  auto r = job.ranks().find(request.rank());
  if (r == job.ranks().end() || !r->second.alive) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", request.rank(), " of job ", request.job(), " is not running on any node"));
  }
  return r->second.node_id;
}

// The lowest rank of `job` alive on `node`.
std::optional<uint32_t> LowestRankOn(const Job& job, const std::string& node) {
  for (const auto& [r, rank] : job.ranks()) {
    if (rank.alive && rank.node_id == node) return r;
  }
  return std::nullopt;
}

// The drill as the coordinator saw it, but for the failure events.
ckptd::v1::DrillStatus StatusOfDrill(uint64_t id, const internal::Drill& drill, const Job* job) {
  ckptd::v1::DrillStatus st;
  *st.mutable_request() = drill.request;
  st.set_drill_id(id);
  st.set_node_id(drill.node);
  st.set_ordered_unix_nanos(absl::ToUnixNanos(drill.ordered));
  if (drill.report) *st.mutable_report() = *drill.report;
  st.set_had_committed_at_order(drill.newest_at_order.has_value());
  st.set_newest_committed_at_order(drill.newest_at_order.value_or(0));
  for (const std::string& p : drill.partners) st.add_partner_nodes(p);
  if (job == nullptr) return st;
  st.set_step_seconds(job->record().step_seconds());
  for (const internal::Resume& r : job->resumes()) {
    if (r.failed < drill.ordered) continue;
    st.set_resumed(true);
    st.set_fresh_start(!r.restored.has_value());
    st.set_restored_step(r.restored.value_or(0));
    st.set_step_at_failure(r.step_at_failure);
    st.set_failed_unix_nanos(absl::ToUnixNanos(r.failed));
    st.set_resumed_unix_nanos(absl::ToUnixNanos(r.resumed));
    *st.mutable_restore_sources() = r.sources;
    break;
  }
  return st;
}

}  // namespace

absl::StatusOr<ckptd::v1::RunDrillResponse> CoordinatorCore::RunDrill(const ckptd::v1::RunDrillRequest& request) {
  absl::StatusOr<ckptd::v1::RunDrillResponse> response = OrderDrill(request);
  Effects fx;
  {
    absl::MutexLock l(&mu_);
    NoteDrillChanges(&fx);
  }
  Apply(fx);  // the order is saved before the caller hears of it
  return response;
}

void CoordinatorCore::NoteDrillChanges(Effects* fx) {
  for (uint64_t id : drills_->TakeChanged()) fx->drills.push_back(id);
}

void CoordinatorCore::SaveDrills(const std::vector<uint64_t>& ids) {
  absl::MutexLock saving(&drill_save_mu_);
  std::vector<ckptd::v1::DrillRecord> records;
  {
    absl::MutexLock l(&mu_);
    for (uint64_t id : ids) {
      if (std::optional<ckptd::v1::DrillRecord> r = drills_->RecordOf(id)) records.push_back(*std::move(r));
    }
  }
  for (const ckptd::v1::DrillRecord& r : records) {
    if (absl::Status s = state_->PutDrill(r); !s.ok()) {
      logger_->Warning(absl::StrCat("saving drill ", r.id(), ": ", s.ToString()));
    }
  }
}

absl::StatusOr<ckptd::v1::RunDrillResponse> CoordinatorCore::OrderDrill(const ckptd::v1::RunDrillRequest& request) {
  CKPTD_RETURN_IF_ERROR(ValidateDrill(request));
  absl::MutexLock l(&mu_);
  Job* job = FindJob(request.job());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", request.job()));
  if (request.scenario() == ckptd::v1::KILL_COORDINATOR) {
    if (!options_.kill_self) {
      return absl::FailedPreconditionError(
          "KILL_COORDINATOR needs replicated coordinators (--etcd-endpoints): a single coordinator has no standby "
          "to take over, and would not come back on its own");
    }
    ckptd::v1::RunDrillResponse response;
    response.set_drill_id(drills_->TakeId());
    logger_->Warning(absl::StrCat("drill ", response.drill_id(), " (KILL_COORDINATOR, job ", request.job(),
                                  "): this leader kills itself (SIGKILL)"));
    response.set_node_id(options_.kill_self());
    return response;
  }
  std::string node = request.target_node();
  if (node.empty()) {
    CKPTD_ASSIGN_OR_RETURN(node, NodeOfRank(*job, request));
  }
  auto a = agents_.find(node);
  if (a == agents_.end() || !a->second->alive) {
    return absl::FailedPreconditionError(absl::StrCat("node ", node, " has no live agent"));
  }
  ckptd::v1::RunDrillRequest order = request;
  if (!request.target_node().empty()) {
    // The agent watches a rank of the job on its node for at_step: the
    // lowest one it hosts.
    if (std::optional<uint32_t> hosted = LowestRankOn(*job, node)) {
      order.set_rank(*hosted);
    } else if (request.at_step() > 0) {
      return absl::FailedPreconditionError(absl::StrCat("node ", node, " hosts no rank of job ", request.job(),
                                                        ": a drill at a step needs one there to watch"));
    }
  }
  if (!a->second->drills_allowed) {
    return absl::FailedPreconditionError(absl::StrCat("node ", node, "'s agent was not started with --allow-drills"));
  }
  // KILL_NODE with_partners: the partners the node sends its snapshots to
  // now are killed too, each by an order of its own, so that no copy of its
  // ranks is left in any memory. All or nothing: refused unless every
  // partner's agent is alive and carries drills out.
  std::vector<std::pair<std::string, ckptd::v1::RunDrillRequest>> partner_orders;
  if (request.with_partners()) {
    MaybeRecomputePartners(clock_->Now(), /*force=*/true);
    const Agent& target = *a->second;
    if (target.send_to.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", node, " has no replication partners (",
          target.peer_address.empty() ? "its agent registered no peer address"
                                      : "no agent in another failure domain has a peer address",
          "): with_partners would kill it alone"));
    }
    for (const std::string& p : target.send_to) {
      const Agent* partner = AliveAgent(p);
      if (partner == nullptr) return absl::FailedPreconditionError(absl::StrCat("partner node ", p, " has no live agent"));
      if (!partner->drills_allowed) {
        return absl::FailedPreconditionError(
            absl::StrCat("partner node ", p, " of node ", node, ": its agent was not started with --allow-drills"));
      }
      ckptd::v1::RunDrillRequest po;
      po.set_job(request.job());
      po.set_scenario(ckptd::v1::KILL_NODE);
      po.set_target_node(p);
      po.set_at_step(request.at_step());
      if (std::optional<uint32_t> hosted = LowestRankOn(*job, p)) {
        po.set_rank(*hosted);
      } else if (request.at_step() > 0) {
        return absl::FailedPreconditionError(absl::StrCat("partner node ", p, " hosts no rank of job ", request.job(),
                                                          ": a drill at a step needs one there to watch"));
      }
      partner_orders.emplace_back(p, std::move(po));
    }
  }
  order.clear_step();
  if (request.scenario() == ckptd::v1::CORRUPT_MEMORY) {
    // The step a restart would restore: its copy in memory is the one to damage.
    const std::optional<uint64_t> newest = job->NewestUsable();
    if (!newest) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", request.job(),
                       " has no committed step: CORRUPT_MEMORY damages the copy of the newest "
                       "one in the agent's memory; order it once a checkpoint has committed"));
    }
    order.set_step(*newest);
  }
  ckptd::v1::RunDrillResponse response;
  std::vector<std::string> partners;
  for (const auto& [p, po] : partner_orders) partners.push_back(p);
  const absl::Time now = clock_->Now();
  response.set_drill_id(drills_->Order(order, node, now, job->NewestUsable(), partners));
  response.set_node_id(node);
  for (const auto& [p, po] : partner_orders) {
    drills_->Order(po, p, now, job->NewestUsable());
    response.add_partner_nodes(p);
  }
  return response;
}

absl::StatusOr<ckptd::v1::DrillStatus> CoordinatorCore::GetDrill(const ckptd::v1::GetDrillRequest& request) {
  ckptd::v1::DrillStatus st;
  {
    absl::MutexLock l(&mu_);
    const internal::Drill* drill = drills_->Find(request.drill_id());
    if (drill == nullptr) return absl::NotFoundError(absl::StrCat("no drill ", request.drill_id()));
    st = StatusOfDrill(request.drill_id(), *drill, FindJob(drill->request.job()));
    // A drill with partners: the time of the first kill, whichever node it
    // struck (detection is measured from it).
    if (std::optional<int64_t> first = drills_->FirstInjection(*drill); first && st.has_report()) {
      st.mutable_report()->set_injected_unix_nanos(*first);
    }
  }
  // The history is in the state store, read without the lock.
  CKPTD_ASSIGN_OR_RETURN(std::vector<FailureEvent> events, state_->ListEvents("", options_.max_events_listed));
  std::vector<FailureEvent> since;
  for (FailureEvent& e : events) {
    if (e.unix_nanos() < st.ordered_unix_nanos()) continue;
    const bool partner = std::find(st.partner_nodes().begin(), st.partner_nodes().end(), e.node_id()) !=
                         st.partner_nodes().end();
    if (e.job() != st.request().job() && e.node_id() != st.node_id() && !partner) continue;
    since.push_back(std::move(e));
  }
  std::sort(since.begin(), since.end(),
            [](const FailureEvent& a, const FailureEvent& b) { return a.unix_nanos() < b.unix_nanos(); });
  if (!since.empty()) st.set_first_detection_unix_nanos(since.front().unix_nanos());
  for (FailureEvent& e : since) *st.add_events() = std::move(e);
  return st;
}

}  // namespace ckptd::coordinator
