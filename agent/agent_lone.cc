// AgentCore without a coordinator: the commit of jobs whose ranks all run
// on this node, and their restore rounds.
#include "agent/agent_core.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "agent/agent_core_internal.h"
#include "base/status_macros.h"

namespace ckptd::agent {

using internal::ShardRefOf;

using storage::StepState;

namespace {
// Without a coordinator: steps of a job kept waiting for the rest of their
// ranks' shards.
constexpr size_t kMaxPendingSteps = 64;
}  // namespace

absl::Status AgentCore::CommitAlone(Trainer* t, uint64_t step, const storage::ShardWriteResult& written) {
  const TrainerRegistration& reg = t->reg;
  const ckptd::v1::ShardRef ref = ShardRefOf(reg.rank, written);
  std::vector<ckptd::v1::ShardRef> shards;
  {
    absl::MutexLock l(&lone_mu_);
    LoneJob& job = lone_[reg.job];
    const LoneRegistration writer{t->id, reg.pid};
    // Counts when its writer is still the newest registration of its rank, or
    // the same process registered again (after losing its agent connection).
    auto current = [&job](uint32_t rank, const LoneRegistration& w) {
      auto it = job.newest.find(rank);
      return it != job.newest.end() &&
             (it->second.trainer_id == w.trainer_id || (w.pid != 0 && it->second.pid == w.pid));
    };
    if (job.world_size != reg.world_size || !current(reg.rank, writer)) {
      logger_->Warning(absl::StrCat("job ", reg.job, " rank ", reg.rank, " step ", step,
                                    ": the rank registered again since this shard was taken; not committed"));
      return absl::OkStatus();
    }
    if (job.committed && step <= *job.committed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", reg.job, " step ", step, ": not newer than committed step ", *job.committed, "; not committed"));
    }
    std::map<uint32_t, LoneShard>& pending = job.pending[step];
    pending[reg.rank] = {ref, writer};
    for (const auto& [rank, s] : pending) {
      if (current(rank, s.writer)) shards.push_back(s.ref);
    }
    if (shards.size() < reg.world_size) {
      // Steps some rank never wrote (it skipped them, or it runs on another
      // node) are not kept forever.
      while (job.pending.size() > kMaxPendingSteps) job.pending.erase(job.pending.begin());
      if (job.newest.size() < reg.world_size && !job.warned_unseen_ranks) {
        job.warned_unseen_ranks = true;
        logger_->Warning(absl::StrCat(
            "job ", reg.job, ": ", job.newest.size(), " of its ", reg.world_size,
            " ranks registered with this agent, which runs without a coordinator: a step commits only once every "
            "rank's shard of it is written through this agent; a job with ranks on other nodes needs "
            "ckptd-coordinator (start every agent with --coordinator HOST:PORT)"));
      }
      return absl::OkStatus();
    }
    job.pending.erase(step);
  }
  // Every rank's shard of the step is durable and this agent saw them all:
  // it commits the step, as the coordinator would.
  absl::MutexLock l(&commit_mu_);
  {
    absl::MutexLock ll(&lone_mu_);
    LoneJob& job = lone_[reg.job];
    if (job.committed && step <= *job.committed) return absl::OkStatus();
  }
  CKPTD_RETURN_IF_ERROR(store_.CommitStep(reg.job, step, reg.world_size, &shards).status());
  {
    absl::MutexLock ll(&lone_mu_);
    LoneJob& job = lone_[reg.job];
    job.committed = step;
    // Older steps still pending never will be: their files go below.
    job.pending.erase(job.pending.begin(), job.pending.lower_bound(step));
  }
  MarkCommitted(reg.job, step, t);
  CKPTD_RETURN_IF_ERROR(store_.ApplyRetention(reg.job, options_.keep_last).status());
  // At shutdown the ranks write their snapshots newest first: another rank
  // may be writing an older step now. What is left below `step` goes at
  // the job's next commit.
  if (shutting_down_.load()) return absl::OkStatus();
  return store_.RemoveIncompleteSteps(reg.job, step).status();
}

void AgentCore::MarkCommitted(const std::string& job, uint64_t step, Trainer* committer) {
  std::vector<std::shared_ptr<Trainer>> trainers;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, t] : trainers_) {
      if (t->reg.job == job && t.get() != committer) trainers.push_back(t);
    }
  }
  auto mark = [step](Trainer* t) {
    absl::MutexLock l(&t->mu);
    if (!t->status.last_committed_step || *t->status.last_committed_step < step) t->status.last_committed_step = step;
    t->segment->PinKept(*t->status.last_committed_step);  // what a restart restores: kept in memory last
  };
  // The committer may have left trainers_ already (it exited; its persister drains).
  mark(committer);
  for (const std::shared_ptr<Trainer>& t : trainers) mark(t.get());
}

absl::StatusOr<std::shared_ptr<AgentCore::LoneRound>> AgentCore::JoinRound(Trainer* t) {
  const TrainerRegistration& reg = t->reg;
  // A round under way is joined; one that is over (every rank went, or it
  // failed, or it found nothing to restore) is not.
  auto joinable = [&reg](const std::shared_ptr<LoneRound>& r) {
    return r != nullptr && !r->go && r->failed.ok() && r->at < r->steps.size() && r->world_size == reg.world_size;
  };
  {
    absl::MutexLock l(&lone_mu_);
    if (std::shared_ptr<LoneRound>& round = lone_[reg.job].round; joinable(round)) return round;
  }
  auto fresh = std::make_shared<LoneRound>();
  fresh->world_size = reg.world_size;
  absl::StatusOr<std::vector<storage::StepInfo>> steps = store_.ListSteps(reg.job);
  if (!steps.ok() && !absl::IsNotFound(steps.status())) return steps.status();
  if (steps.ok()) {
    std::vector<std::pair<uint64_t, std::string>> damaged;
    size_t committed = 0;
    for (auto it = steps->rbegin(); it != steps->rend(); ++it) {
      if (it->state != StepState::kCommitted) continue;
      ++committed;
      if (it->quarantined) damaged.emplace_back(it->step, *it->quarantined);
      if (!it->quarantined) fresh->steps.push_back(it->step);
    }
    if (fresh->steps.empty() && !damaged.empty()) {
      // Starting from scratch over committed (but damaged) steps throws away
      // training: only with the operator's word (a word that cannot be read
      // allows nothing).
      absl::StatusOr<std::optional<uint64_t>> allowed = store_.FreshStartAllowedOver(reg.job);
      if (!allowed.ok() || !*allowed || **allowed < damaged.front().first) {
        fresh->held_back = store_.FreshStartRefusal(reg.job, committed, damaged);
        logger_->Warning(absl::StrCat("restore of rank ", reg.rank, " held back: ", fresh->held_back));
      }
    }
  }
  absl::MutexLock l(&lone_mu_);
  std::shared_ptr<LoneRound>& round = lone_[reg.job].round;
  if (!joinable(round)) round = std::move(fresh);  // else another rank started one meanwhile
  return round;
}

absl::StatusOr<RestoreResult> AgentCore::RestoreLocal(Trainer* t, LoadCall* call) {
  const TrainerRegistration& reg = t->reg;
  const absl::Time deadline = clock_->Now() + call->timeout;
  CKPTD_ASSIGN_OR_RETURN(std::shared_ptr<LoneRound> round, JoinRound(t));
  LoneRound* const r = round.get();
  // Newest committed step first; a damaged one sends every rank to the one before.
  while (true) {
    uint64_t step = 0;
    uint64_t attempt = 0;
    {
      absl::MutexLock l(&lone_mu_);
      if (!r->failed.ok()) return r->failed;
      if (r->at == r->steps.size()) {
        if (!r->last_damage.ok()) {
          return absl::DataLossError(absl::StrCat("no committed step of job ", reg.job,
                                                  " reads back intact; last problem: ", r->last_damage.message()));
        }
        if (!r->held_back.empty()) return absl::FailedPreconditionError(r->held_back);
        NoStepToRestore(t);
        return RestoreResult();  // nothing committed: every rank starts fresh
      }
      step = r->steps[r->at];
      attempt = r->attempt;
    }
    absl::StatusOr<uint32_t> slot = LoadStep(t, step, call);
    if (absl::IsDataLoss(slot.status()) || absl::IsNotFound(slot.status())) {
      QuarantineInRound(t, r, step, attempt, slot.status());
      continue;
    }
    if (!slot.ok()) {
      // The registration does not fit, or no slot: the trainer must know, and
      // the other ranks cannot go on without this one.
      absl::MutexLock l(&lone_mu_);
      if (!r->go && r->failed.ok()) {
        r->failed = absl::Status(slot.status().code(),
                                 absl::StrCat("restore of job ", reg.job, ": rank ", reg.rank, " could not load step ",
                                              step, ": ", slot.status().message()));
      }
      return slot.status();
    }
    const RoundOutcome outcome = AwaitLoneRound(t, r, step, attempt, deadline, call->timeout);
    if (outcome.kind == RoundOutcome::kGo) {
      DropLocalStepsAbove(reg.job, step);
      return Restored(t, step, *slot, call, 0);
    }
    (void)t->segment->Release(*slot);  // RESTORED -> KEPT (the step stays in memory) or FREE
    if (outcome.kind == RoundOutcome::kFailed) return outcome.failed;
    if (outcome.kind == RoundOutcome::kTimedOut) {
      return absl::DeadlineExceededError(absl::StrCat(
          "restore of job ", reg.job, " rank ", reg.rank, ": ", outcome.loaded, " of ", reg.world_size,
          " ranks loaded step ", step, " within ", absl::FormatDuration(call->timeout),
          "; without a coordinator every rank of the job restores through this agent, and the others did not"));
    }
    // kAgain: a rank found the step damaged; load the one before.
  }
}


void AgentCore::QuarantineInRound(Trainer* t, LoneRound* r, uint64_t step, uint64_t attempt,
                                  const absl::Status& damage) {
  const TrainerRegistration& reg = t->reg;
  // This agent is the job's committer (no coordinator): it marks the step
  // so that nobody restores it again. Best effort; the restore goes on.
  {
    absl::MutexLock l(&commit_mu_);
    (void)store_.QuarantineStep(reg.job, step, absl::StrCat("rank ", reg.rank, ": ", damage.message()));
  }
  absl::MutexLock l(&lone_mu_);
  if (r->attempt == attempt) {
    ++r->at;
    ++r->attempt;
    r->loaded.clear();
    r->last_damage = damage;
  }
}

AgentCore::RoundOutcome AgentCore::AwaitLoneRound(Trainer* t, LoneRound* r, uint64_t step, uint64_t attempt,
                                                  absl::Time deadline, absl::Duration timeout) {
  const TrainerRegistration& reg = t->reg;
  RoundOutcome outcome;
  absl::MutexLock l(&lone_mu_);
  if (r->attempt == attempt && r->failed.ok() && !r->go) {
    r->loaded.insert(reg.rank);
    if (r->loaded.size() == r->world_size) {
      r->go = true;
      // The job goes on from `step`: its shards of later steps that are
      // not committed belong to a timeline that is gone.
      LoneJob& job = lone_[reg.job];
      job.pending.erase(job.pending.upper_bound(step), job.pending.end());
      job.committed = step;
    }
  }
  // BeginShutdown wakes this (it takes lone_mu_): the agent stops
  // serving, and no rank is kept waiting for ranks that cannot come.
  auto settled = [this, r, attempt] {
    return r->go || r->attempt != attempt || !r->failed.ok() || shutting_down_.load();
  };
  clock_->AwaitWithDeadline(&lone_mu_, absl::Condition(&settled), deadline);
  if (r->attempt != attempt) {
    outcome.kind = RoundOutcome::kAgain;
  } else if (r->go) {
    outcome.kind = RoundOutcome::kGo;
  } else if (!r->failed.ok()) {
    outcome.kind = RoundOutcome::kFailed;
    outcome.failed = r->failed;
  } else if (shutting_down_.load()) {
    outcome.kind = RoundOutcome::kFailed;
    outcome.failed = absl::UnavailableError(absl::StrCat("restore of job ", reg.job, " rank ", reg.rank,
                                                         ": the agent is shutting down"));
    // The round ends for every rank: none goes on alone.
    r->failed = absl::UnavailableError(absl::StrCat("restore of job ", reg.job, ": the agent is shutting down"));
  } else {
    outcome.kind = RoundOutcome::kTimedOut;
    outcome.loaded = r->loaded.size();
    // The round is over for every rank: a later restore starts another.
    r->failed = absl::DeadlineExceededError(absl::StrCat("restore of job ", reg.job, ": not every rank loaded step ",
                                                         step, " within ", absl::FormatDuration(timeout)));
  }
  return outcome;
}

}  // namespace ckptd::agent
