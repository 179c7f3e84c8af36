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
  if (job != nullptr && kind != ckptd::v1::PERSIST_FAILED && kind != ckptd::v1::SHARD_DAMAGED) {
    job->Restart(now);
    job->ClassifyFailure(kind, node);
    OrderEmergencyPersist(job);
  }
}

void CoordinatorCore::OrderEmergencyPersist(Job* job) {
  const std::optional<uint64_t> step = NewestMemoryRestorable(*job);
  if (!step) {
    // No memory checkpoint newer than the durable steps survived whole:
    // there is nothing to write (an order under way cannot complete).
    job->SetEmergency(std::nullopt);
    return;
  }
  const std::optional<Job::Emergency>& before = job->emergency();
  Job::Emergency e;
  e.step = *step;
  e.incarnation = job->memory_steps().at(*step).incarnation;
  const auto pending = job->pending().find(*step);
  for (uint32_t r = 0; r < job->world_size(); ++r) {
    if (pending != job->pending().end() && pending->second.shards.contains(r)) continue;  // written
    const Agent* host = nullptr;
    if (auto rank = job->ranks().find(r); rank != job->ranks().end()) host = AliveAgent(rank->second.node_id);
    // A node already told to write the rank's copy keeps the order while it
    // still holds the copy: two writers of one file would race.
    if (before && before->step == *step) {
      if (auto h = before->holders.find(r); h != before->holders.end()) {
        if (const Agent* holder = AliveAgent(h->second); holder != nullptr && CopyHeldBy(*holder, *job, r, *step)) {
          e.holders[r] = h->second;
          continue;
        }
      }
    }
    if (host != nullptr && HoldsOwnCopy(*host, *job, r, *step)) {
      e.holders[r] = host->node_id;
      continue;
    }
    const std::vector<const Agent*> peers = PeerHolders(*job, r, *step, host != nullptr ? host->node_id : "", "");
    if (peers.empty()) {
      job->SetEmergency(std::nullopt);  // (NewestMemoryRestorable found one: not reached)
      return;
    }
    e.holders[r] = peers.front()->node_id;
  }
  if (!before || before->step != e.step) {
    logger_->Info(absl::StrCat("job ", job->name(), ": emergency persist of memory checkpoint ", e.step,
                               " ordered (", e.holders.size(), " of ", job->world_size(),
                               " ranks' copies to write, from the agents holding them)"));
  }
  job->SetEmergency(std::move(e));
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
    CKPTD_RETURN_IF_ERROR(AgentInSession(request.node_id(), request.session()).status());
    Job* job = FindJob(request.job());
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", request.job()));
    if (request.rank() >= job->world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", request.rank(), " is not inside world size ", job->world_size()));
    }
    CKPTD_RETURN_IF_ERROR(CheckSpeaksFor(*job, request.rank(), request.node_id(), /*moving=*/false));
    std::string detail = request.detail();
    if (request.kind() == ckptd::v1::PERSIST_FAILED) {
      absl::StrAppend(&detail, detail.empty() ? "" : "; ", "step ", request.step());
      job->NotePersistFailure(absl::StrCat("rank ", request.rank(), ": ", detail), clock_->Now());
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
    // (Not the memory checkpoint being written from the copies that survived.)
    if (job->emergency() && job->emergency()->step == step) continue;
    AbortPending(job, step, "the job restarted from an earlier step", fx);
  }
  job->StartRestoreRound(NewestMemoryRestorable(*job));
}

std::optional<uint64_t> CoordinatorCore::NewestMemoryRestorable(const Job& job) const {
  const std::optional<uint64_t> durable = job.NewestUsable();
  for (auto it = job.memory_steps().rbegin(); it != job.memory_steps().rend(); ++it) {
    const uint64_t step = it->first;
    if (durable && step <= *durable) break;
    if (!it->second.complete) continue;
    // Every rank's copy must be in memory somewhere alive: its own node's
    // agent, or a peer holding it (as their heartbeats said).
    bool whole = true;
    for (uint32_t r = 0; r < job.world_size() && whole; ++r) {
      const Agent* host = nullptr;
      if (auto rank = job.ranks().find(r); rank != job.ranks().end()) host = AliveAgent(rank->second.node_id);
      whole = (host != nullptr && HoldsOwnCopy(*host, job, r, step)) ||
              !PeerHolders(job, r, step, host != nullptr ? host->node_id : "", "").empty();
    }
    if (whole) return step;
  }
  return std::nullopt;
}

void CoordinatorCore::AddMemoryExpectation(const Job& job, uint32_t rank, RestorePlanResponse* plan) const {
  if (!plan->memory_step()) return;
  const std::optional<internal::Job::ShardDigest> digest = job.CommittedShard(plan->step(), rank);
  if (!digest) return;  // the agent then finds no reference and reports the load failed
  ckptd::v1::ShardRef* ref = plan->mutable_expected();
  ref->set_rank(rank);
  ref->set_file(storage::ShardFileName(rank));
  ref->set_file_length(digest->file_length);
  ref->set_index_xxh3(digest->index_xxh3);
}

namespace {

// What a rank is told when its job's committed steps are all quarantined.
std::string FreshStartRefusal(const internal::Job& job, const storage::CheckpointStore& store) {
  std::vector<std::pair<uint64_t, std::string>> damaged;
  for (auto it = job.quarantined().rbegin(); it != job.quarantined().rend(); ++it) damaged.emplace_back(*it);
  return store.FreshStartRefusal(job.name(), job.committed().size(), damaged);
}

}  // namespace

void CoordinatorCore::HostRank(Agent* agent, Job* job, const ckptd::v1::RestorePlanRequest& request,
                               Effects* fx) {
  ckptd::v1::RankInfo info;
  info.set_job(request.job());
  info.set_rank(request.rank());
  info.set_world_size(request.world_size());
  info.set_pid(request.pid());
  info.set_gpu(request.gpu());
  auto same = [&](const ckptd::v1::RankInfo& r) { return r.job() == info.job() && r.rank() == info.rank(); };
  auto it = std::find_if(agent->ranks.begin(), agent->ranks.end(), same);
  if (it == agent->ranks.end()) {
    if (agent->ranks.size() >= internal::kMaxRanksPerAgent) return;  // the heartbeat's limit
    agent->ranks.push_back(info);
  } else {
    *it = info;
  }
  RefreshRank(job, request.rank(), agent->node_id, request.pid(), fx);
}

void CoordinatorCore::RefreshRank(Job* job, uint32_t rank, const std::string& node, int32_t pid, Effects* fx) {
  if (!job->RefreshRank(rank, node, pid)) return;
  const std::optional<uint64_t> newest = job->NewestUsable();
  const std::string why = absl::StrCat(
      "job ", job->name(), " was used by a run that finished (every rank said goodbye); ",
      newest ? absl::StrCat("this run restores that run's newest committed step ", *newest,
                            " and trains only past it (a loop that ends at that step trains nothing)")
             : "that run committed nothing, so this run starts from scratch",
      ": give a new run a job name of its own");
  logger_->Warning(absl::StrCat("rank ", rank, " on node ", node, " registered again: ", why));
  job->set_reuse_warning(why);
  StartRestoreRound(job, fx);
  SaveJob(job, fx);
}

absl::Status CoordinatorCore::ValidateRankRequest(const std::string& node_id, const std::string& job, uint32_t rank,
                                                  uint32_t world_size) const {
  CKPTD_RETURN_IF_ERROR(ValidateNodeId(node_id));
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(job));
  if (world_size == 0 || world_size > options_.max_world_size || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not inside world size ", world_size,
                                                   " (at most ", options_.max_world_size, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RestorePlanResponse> CoordinatorCore::GetRestorePlan(const ckptd::v1::RestorePlanRequest& request) {
  CKPTD_RETURN_IF_ERROR(
      ValidateRankRequest(request.node_id(), request.job(), request.rank(), request.world_size()));
  if (request.problem().size() > 4096) return absl::InvalidArgumentError("problem is longer than 4096 bytes");
  // A restart held back for the operator's consent to start fresh: has it
  // come? (Storage is read without the lock.)
  bool blocked = false;
  {
    absl::MutexLock l(&mu_);
    const Job* job = FindJob(request.job());
    blocked = job != nullptr && !job->restore_blocked().empty();
  }
  std::optional<uint64_t> allowed;
  if (blocked) {
    absl::StatusOr<std::optional<uint64_t>> over = store_->FreshStartAllowedOver(request.job());
    if (over.ok()) allowed = *over;
    if (!over.ok()) logger_->Warning(absl::StrCat("reading the fresh-start choice: ", over.status().ToString()));
  }
  Effects fx;
  RestorePlanResponse response;
  absl::Status refused;
  {
    absl::MutexLock l(&mu_);
    CKPTD_ASSIGN_OR_RETURN(Agent * agent, AgentInSession(request.node_id(), request.session()));
    const uint32_t rank = request.rank();
    // Checked against the job as it is before a new world resizes it.
    CKPTD_ASSIGN_OR_RETURN(Job * job, JobForRank(request.job(), request.world_size(), rank, agent->node_id));
    const std::string asker =
        request.trainer_id() == 0 ? "" : absl::StrCat(agent->node_id, "#", agent->instance, "#", request.trainer_id());
    if (const uint32_t saved = request.attempt_saved_world_size(); saved != 0) {
      // A step read resharded was read from the storage root, and a memory
      // checkpoint never is: it has no copy there.
      if (saved > options_.max_world_size) {
        return absl::InvalidArgumentError(absl::StrCat("attempt_saved_world_size ", saved,
                                                       " is above the largest world (", options_.max_world_size, ")"));
      }
      if (!request.attempt_ok() || request.attempt_source() != ckptd::v1::STORAGE_ROOT ||
          (job->round() && job->round()->memory && job->round()->step == request.attempt_step())) {
        return absl::InvalidArgumentError(
            "attempt_saved_world_size is set only for a step loaded intact, resharded, from the storage root");
      }
    }
    if (request.reread()) {
      // Where the rank read the round's step, corrected: nothing else changes.
      if (!request.has_attempt() || !request.attempt_ok()) {
        return absl::InvalidArgumentError("a reread reports a step loaded intact (has_attempt and attempt_ok)");
      }
      CKPTD_RETURN_IF_ERROR(job->Reread(rank, asker, request.attempt_step(), request.attempt_source(),
                                        request.attempt_saved_world_size()));
      RestorePlanResponse plan = job->Plan();
      AddPlanPeers(*agent, *job, rank, &plan);
      AddMemoryExpectation(*job, rank, &plan);
      plan.set_warning(job->reuse_warning());
      return plan;
    }
    // The first rank of a new run under the name of a job whose run
    // finished, before its agent's heartbeat listed it: a new round for the
    // new run, and no failure (RefreshRank).
    if (job->finished()) RefreshRank(job, rank, agent->node_id, request.pid(), &fx);
    // The trainer that already took part in the round asks again (an answer
    // was lost, or it starts its restore over): the round's plan stands.
    const bool again = job->NeedsNewRound(rank, request.has_attempt()) && job->AskedBefore(rank, asker);
    if (!again && job->NeedsNewRound(rank, request.has_attempt())) {
      // A round opens only after a failure the coordinator recorded, or for
      // a job that is starting (nothing runs): never because someone asks
      // while the job runs.
      if (job->IsNewTrainer(rank, asker, agent->node_id, request.pid())) {
        // The node says its rank runs as a new trainer: it was restarted
        // (the agent's report of the exit may still be on its way).
        if (auto it = job->ranks().find(rank); it != job->ranks().end()) job->RankGone(rank, it->second.node_id);
        RecordFailure(job, agent->node_id, rank, ckptd::v1::TRAINER_DIED,
                      absl::StrCat("rank ", rank, " asked for a restore plan as a new trainer (pid ", request.pid(),
                                   "): it was restarted"),
                      &fx);
      } else if (job->state() != ckptd::v1::JOB_RESTARTING &&
                 ((job->round() && !job->round()->recovered) || job->AnyRankProgressing())) {
        // (A round taken over from another coordinator does not know who
        // took part in it: a trainer asking afresh may be a new one.)
        return absl::FailedPreconditionError(absl::StrCat(
            "job ", job->name(), " is running (incarnation ", job->incarnation(), ") and rank ", rank,
            " already took part in its restore; no failure is recorded, and a restore round opens only after one "
            "(the agent reports a trainer's exit; a restarted trainer asks as a new one)"));
      }
      StartRestoreRound(job, &fx);
    } else if (request.has_attempt() && !request.attempt_ok() && job->round()->go) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job->name(), ": every rank already loaded step ", job->round()->step.value_or(0),
                       " intact and resumed; a failed load of it is no longer news"));
    }
    HostRank(agent, job, request, &fx);
    job->TakePart(rank, asker);
    if (allowed) job->AllowFreshStartOver(*allowed);
    // Starting from scratch over committed (but damaged) steps throws away
    // training: never done without the operator's word.
    auto held_back = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (job->round()->step || !job->FreshStartNeedsConsent()) return false;
      const std::string why = FreshStartRefusal(*job, *store_);
      if (job->SetRestoreBlocked(why)) fx.blocked.emplace_back(job->name(), why);
      refused = absl::FailedPreconditionError(why);
      return true;
    };
    const std::optional<uint64_t> step = job->round()->step;
    if (again) {
      response = job->Plan();
    } else if (held_back()) {
      // refused
    } else if (!step) {
      if (!job->committed().empty() && job->round()->ok.empty()) {
        fx.fresh_over_damaged.emplace_back(job->name(), *job->committed().rbegin());
      }
      job->SetRestoreBlocked("");
      response = job->StartsFresh(rank);
    } else if (!request.has_attempt() || request.attempt_step() != *step) {
      response = job->NotLoaded(rank);
    } else if (request.attempt_ok()) {
      response = job->Loaded(rank, request.attempt_source(), request.attempt_saved_world_size());
    } else if (job->round()->memory) {
      // A memory checkpoint a rank could not load intact from any copy: no
      // disk holds it either. Every rank goes to the newest durable step.
      logger_->Warning(absl::StrCat("job ", job->name(), ": rank ", rank, " could not load memory checkpoint ",
                                    *step, " (", request.problem(), "); every rank restores the newest durable step"));
      job->DropMemoryStep(*step);
      response = job->FallBack();
      held_back();
    } else {
      // One damaged shard spoils the step for every rank: quarantine it and
      // send everyone to the step before.
      Quarantine(job, *step, rank, absl::StrCat("rank ", rank, ": ", request.problem()), &fx);
      response = job->FallBack();
      held_back();
    }
    // Other nodes' agents that hold the step in memory, for a rank whose own
    // copy is gone (its node was replaced).
    AddPlanPeers(*agent, *job, rank, &response);
    AddMemoryExpectation(*job, rank, &response);
    response.set_warning(job->reuse_warning());
    SaveJob(job, &fx);
  }
  Apply(fx);
  CKPTD_RETURN_IF_ERROR(refused);
  return response;
}

absl::StatusOr<ckptd::v1::RestorePreview> CoordinatorCore::GetRestorePreview(
    const ckptd::v1::RestorePreviewRequest& request) {
  CKPTD_ASSIGN_OR_RETURN(ckptd::v1::RestorePreview p, PreviewLocked(request));
  if (p.fresh_start() || p.memory_step()) return p;
  // Read without the lock: which world saved the step.
  absl::StatusOr<ckptd::v1::StepManifest> m = store_->ReadManifest(p.job(), p.step());
  if (!m.ok()) return p;
  p.set_saved_world_size(m->world_size());
  if (m->world_size() != p.world_size()) {
    for (ckptd::v1::RankRestoreSources& r : *p.mutable_ranks()) r.set_planned(ckptd::v1::STORAGE_ROOT);
    p.set_reason(absl::StrCat(p.reason(), "; step ", p.step(), " was saved by ", m->world_size(),
                              m->world_size() == 1 ? " rank" : " ranks", " and the job runs ", p.world_size(),
                              ": every rank reads its part of it resharded from disk"));
  }
  return p;
}

absl::StatusOr<ckptd::v1::RestorePreview> CoordinatorCore::PreviewLocked(
    const ckptd::v1::RestorePreviewRequest& request) {
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  absl::MutexLock l(&mu_);
  const Job* job = FindJob(request.job());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", request.job()));
  ckptd::v1::RestorePreview p;
  p.set_job(job->name());
  p.set_state(job->state());
  p.set_incarnation(job->incarnation());
  p.set_world_size(job->world_size());
  const std::optional<uint64_t> durable = job->NewestUsable();
  const std::optional<uint64_t> memory = NewestMemoryRestorable(*job);
  const std::optional<uint64_t> newest = memory ? memory : durable;
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
  AddRankSources(*job, *newest, &p);
  if (memory) {
    p.set_memory_step(true);
    p.set_has_durable_step(durable.has_value());
    p.set_durable_step(durable.value_or(0));
    p.set_reason(absl::StrCat("step ", *memory, " is a memory checkpoint newer than every durable step, and every ",
                              "rank's copy of it is in a live agent's memory; a rank that cannot load it intact ",
                              "sends every rank to ",
                              durable ? absl::StrCat("durable step ", *durable) : std::string("a fresh start")));
    return p;
  }
  p.set_reason(absl::StrCat(
      "step ", *newest, " is the newest committed step that is not quarantined; every rank loads it and checks ",
      "its shard, and a damaged shard quarantines it and sends every rank to the committed step before"));
  return p;
}

}  // namespace ckptd::coordinator
