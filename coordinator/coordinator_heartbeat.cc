// CoordinatorCore: heartbeats. Each refreshes the agent's membership (the
// ranks it hosts), records its ranks' progress and the copies of steps it
// holds in memory, and is answered with the schedules of their jobs, the
// drills ordered from the agent, and its replication partners.
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/coordinator_core_internal.h"
#include "coordinator/drill_book.h"
#include "coordinator/job.h"

namespace ckptd::coordinator {

using internal::kMaxRanksPerAgent;

absl::StatusOr<ckptd::v1::HeartbeatAck> CoordinatorCore::OnHeartbeat(const ckptd::v1::Heartbeat& hb) {
  CKPTD_RETURN_IF_ERROR(ValidateNodeId(hb.node_id()));
  if (hb.ranks_size() > static_cast<int>(kMaxRanksPerAgent) ||
      hb.progress_size() > static_cast<int>(kMaxRanksPerAgent)) {
    return absl::InvalidArgumentError(absl::StrCat("heartbeat of node ", hb.node_id(), " lists too many ranks"));
  }
  for (const auto& r : hb.ranks()) CKPTD_RETURN_IF_ERROR(internal::ValidateRankInfo(r, options_.max_world_size));
  ckptd::v1::HeartbeatAck ack;
  Effects fx;
  {
    absl::MutexLock l(&mu_);
    absl::StatusOr<Agent*> known = AgentInSession(hb.node_id(), hb.session());
    if (!known.ok()) {
      ack.set_known(false);
      ack.set_coordinator_epoch(options_.epoch);
      return ack;
    }
    Agent* agent = *known;
    const absl::Time now = clock_->Now();
    agent->last_heartbeat = now;
    RefreshMembership(agent, hb, &fx);
    for (const auto& p : hb.progress()) RecordProgress(*agent, p, now, &fx);
    RecordMemory(agent, hb);
    // A time no checkpoint could take (negative, not finite, beyond a day)
    // is not a measurement.
    const double q = hb.replicate_seconds();
    agent->replicate_seconds = std::isfinite(q) && q >= 0 && q <= internal::kMaxReplicateSeconds ? q : 0;
    agent->replication_sent = hb.replication_sent();
    agent->replication_failed = hb.replication_failed();
    agent->replication_error = hb.replication_error().substr(0, 1024);
    MaybeRecomputePartners(now);
    ack = HeartbeatReply(*agent, hb);
    NoteDrillChanges(&fx);
    SaveChangedJobs(&fx);
  }
  Apply(fx);
  return ack;
}

void CoordinatorCore::RefreshMembership(Agent* agent, const ckptd::v1::Heartbeat& hb, Effects* fx) {
  // Ranks that left the node are no longer alive there.
  for (const auto& old : agent->ranks) {
    bool still = false;
    // A rank of the same number in another world size (the job restarted
    // on fewer or more ranks) is a new trainer: the old one is gone, or the
    // new world could never be taken.
    for (const auto& r : hb.ranks()) {
      still |= r.job() == old.job() && r.rank() == old.rank() && r.world_size() == old.world_size();
    }
    Job* job = FindJob(old.job());
    if (!still && job != nullptr) job->RankGone(old.rank(), agent->node_id);
  }
  // A rank listed more than once (an agent that lists an older process of it
  // whose exit it has not noticed yet) counts by its last entry, the newest.
  std::map<std::pair<std::string, uint32_t>, int> last;
  for (int i = 0; i < hb.ranks_size(); ++i) last[{hb.ranks(i).job(), hb.ranks(i).rank()}] = i;
  std::vector<ckptd::v1::RankInfo> accepted;
  // What the node may hold beside what the others hold
  // (max_registration_bytes): ranks past it are left out, as another
  // node's are.
  const size_t others = registration_bytes_ - agent->registration_bytes;
  size_t bytes = RegistrationBytes(agent->address, agent->gpus, std::vector<ckptd::v1::RankInfo>());
  size_t over = 0;
  for (int i = 0; i < hb.ranks_size(); ++i) {
    const ckptd::v1::RankInfo& r = hb.ranks(i);
    if (last.at({r.job(), r.rank()}) != i) continue;
    if (others + bytes + RankBytes(r) > options_.max_registration_bytes) {
      ++over;
      continue;
    }
    // Another node's rank, or one of a world size its job cannot take now:
    // refused; the others go on.
    absl::StatusOr<Job*> job = JobForRank(r.job(), r.world_size(), r.rank(), agent->node_id);
    if (!job.ok()) continue;
    if ((*job)->state() == ckptd::v1::JOB_RUNNING && (*job)->IsNewTrainer(r.rank(), "", agent->node_id, r.pid())) {
      (*job)->RankGone(r.rank(), agent->node_id);
      RecordFailure(*job, agent->node_id, r.rank(), ckptd::v1::TRAINER_DIED,
                    absl::StrCat("rank ", r.rank(), " runs as a new process (pid ", r.pid(),
                                 ") before its trainer's exit was reported"),
                    fx);
    }
    RefreshRank(*job, r.rank(), agent->node_id, r.pid(), fx);
    bytes += RankBytes(r);
    accepted.push_back(r);
  }
  agent->ranks = std::move(accepted);
  SetRegistrationBytes(agent);
  // Once while it lasts, not at every heartbeat.
  if (over > 0 && !agent->ranks_over_logged) {
    logger_->Warning(absl::StrCat("heartbeat of node ", agent->node_id, ": ", over,
                                  " ranks left out: they would take what this coordinator holds for its nodes past ",
                                  options_.max_registration_bytes, " bytes (--max-registration-memory)"));
  }
  agent->ranks_over_logged = over > 0;
}

void CoordinatorCore::RecordProgress(const Agent& agent, const ckptd::v1::RankProgress& p, absl::Time now,
                                     Effects* fx) {
  Job* job = FindJob(p.job());
  if (job == nullptr || p.step() > internal::kMaxStep) return;
  if (!job->RecordProgress(agent.node_id, p, now)) return;
  for (uint64_t missed : p.missed_targets()) {
    // The rank learned of the target too late: pick one ahead of everyone.
    if (!job->RetargetMissed(missed, ManualLead(*job))) continue;
    if (job->pending().contains(missed)) AbortPending(job, missed, "a rank passed the target before it knew", fx);
  }
}

ckptd::v1::HeartbeatAck CoordinatorCore::HeartbeatReply(const Agent& agent, const ckptd::v1::Heartbeat& hb) {
  ckptd::v1::HeartbeatAck ack;
  ack.set_coordinator_epoch(options_.epoch);
  std::set<std::string> seen;
  for (const auto& r : agent.ranks) {
    if (!seen.insert(r.job()).second) continue;
    Job* job = FindJob(r.job());
    if (job == nullptr) continue;
    *ack.add_schedules() = job->schedule();
    // What a restart restores: the newest complete memory checkpoint newer
    // than the newest usable durable step, else that step. (Whether every
    // copy of the memory checkpoint is alive is decided at the restart.)
    std::optional<uint64_t> restores = job->NewestUsable();
    for (auto it = job->memory_steps().rbegin(); it != job->memory_steps().rend(); ++it) {
      if (restores && it->first <= *restores) break;
      if (!it->second.complete) continue;
      restores = it->first;
      break;
    }
    if (restores) {
      ckptd::v1::CommittedStep* c = ack.add_committed();
      c->set_job(job->name());
      c->set_step(*restores);
    }
  }
  for (const ckptd::v1::DrillReport& report : hb.drill_reports()) drills_->Report(agent.node_id, report);
  drills_->AddOrders(agent.node_id, &ack);
  AddPartners(agent, &ack);
  AddPersistOrders(agent, &ack);
  ack.set_known(true);
  return ack;
}

void CoordinatorCore::AddPersistOrders(const Agent& agent, ckptd::v1::HeartbeatAck* ack) const {
  for (const auto& [name, job] : jobs_) {
    const std::optional<Job::Emergency>& e = job->emergency();
    if (!e) continue;
    auto memory = job->memory_steps().find(e->step);
    if (memory == job->memory_steps().end()) continue;
    for (const auto& [rank, node] : e->holders) {
      auto digest = memory->second.shards.find(rank);
      if (node != agent.node_id || digest == memory->second.shards.end()) continue;
      ckptd::v1::PersistOrder* o = ack->add_persist();
      o->set_job(name);
      o->set_step(e->step);
      o->set_rank(rank);
      o->set_world_size(job->world_size());
      if (auto r = job->ranks().find(rank); r != job->ranks().end()) o->set_owner_node(r->second.node_id);
      o->set_file_length(digest->second.file_length);
      o->set_index_xxh3(digest->second.index_xxh3);
      o->set_incarnation(e->incarnation);
    }
  }
}

}  // namespace ckptd::coordinator
