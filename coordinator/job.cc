#include "coordinator/job.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "policy/two_level.h"

namespace ckptd::coordinator::internal {

using ckptd::v1::JobRecord;
using ckptd::v1::RestorePlanResponse;

namespace {

constexpr size_t kMaxAbortedRemembered = 1024;
constexpr size_t kMaxResumesRemembered = 16;
constexpr size_t kMaxManualTargets = 64;
// Timings and GPU time change with every heartbeat; they are saved this often.
constexpr absl::Duration kTimingsSaveInterval = absl::Seconds(10);

double Ewma(double old_value, double sample) {
  if (!(sample >= 0) || !std::isfinite(sample)) return old_value;
  return old_value == 0 ? sample : 0.8 * old_value + 0.2 * sample;
}

}  // namespace

std::unique_ptr<Job> Job::Create(const std::string& name, uint32_t world_size, uint64_t every_steps,
                                 uint64_t durable_every) {
  std::unique_ptr<Job> job(new Job());
  job->record_.set_job(name);
  job->record_.set_world_size(world_size);
  ckptd::v1::Schedule* s = job->record_.mutable_schedule();
  s->set_job(name);
  s->set_generation(1);
  s->set_every_steps(every_steps);
  s->set_durable_every(durable_every);
  s->set_state(ckptd::v1::JOB_RUNNING);
  job->dirty_ = true;
  return job;
}

std::unique_ptr<Job> Job::Recovered(const JobRecord& record) {
  std::unique_ptr<Job> job(new Job());
  job->record_ = record;
  // A timing beyond what is a measurement (saved before reports were
  // bounded) is forgotten rather than kept for the hang limits and policy.
  ckptd::v1::JobRecord& r = job->record_;
  if (!(r.step_seconds() <= kMaxReportedSeconds)) r.set_step_seconds(0);
  if (!(r.stall_seconds() <= kMaxReportedSeconds)) r.set_stall_seconds(0);
  if (!(r.persist_seconds() <= kMaxReportedSeconds)) r.set_persist_seconds(0);
  // The measurements themselves are not kept; their recent means seed the
  // windows so that the policy need not wait for new ones.
  if (r.stall_seconds() > 0) job->stalls_.Push(r.stall_seconds());
  if (r.persist_seconds() > 0) job->persists_.Push(r.persist_seconds());
  if (record.restart_seconds() > 0) job->restarts_.Push(record.restart_seconds());
  if (job->state() == ckptd::v1::JOB_STATE_UNSPECIFIED) {
    job->record_.mutable_schedule()->set_state(ckptd::v1::JOB_RUNNING);
  }
  // The round another coordinator opened in the incarnation the job is in:
  // the ranks still in it get the same step (and GO once all had loaded it).
  const ckptd::v1::RestoreRoundRecord& round = record.round();
  if (round.open() && round.incarnation() == job->incarnation() && job->state() == ckptd::v1::JOB_RUNNING &&
      !(round.fresh_start() && (round.step() != 0 || round.memory()))) {
    RestoreRound taken;
    if (!round.fresh_start()) taken.step = round.step();
    taken.memory = round.memory();
    taken.go = round.go();
    taken.recovered = true;
    job->round_ = std::move(taken);
  } else {
    r.clear_round();
  }
  return job;
}

std::unique_ptr<Job> Job::Discovered(const std::string& name, uint32_t world_size, uint64_t every_steps,
                                     uint64_t durable_every) {
  std::unique_ptr<Job> job(new Job());
  job->record_.set_job(name);
  job->record_.set_world_size(world_size);
  job->record_.mutable_schedule()->set_job(name);
  job->record_.mutable_schedule()->set_every_steps(every_steps);
  job->record_.mutable_schedule()->set_durable_every(durable_every);
  job->record_.mutable_schedule()->set_state(ckptd::v1::JOB_RUNNING);
  return job;
}

std::optional<uint64_t> Job::NewestUsable() const {
  for (auto it = committed_.rbegin(); it != committed_.rend(); ++it) {
    if (!quarantined_.contains(*it)) return *it;
  }
  return std::nullopt;
}

uint64_t Job::FastestStep() const {
  uint64_t fastest = 0;
  for (const auto& [r, rank] : ranks_) fastest = std::max(fastest, rank.step);
  return fastest;
}

bool Job::AnyRankAlive() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const auto& r) { return r.second.alive; });
}

absl::Status Job::CheckResize(uint32_t world_size) const {
  if (world_size == this->world_size()) return absl::OkStatus();
  // A step being committed decides first; one still being written by the
  // old world can never complete once none of its ranks runs.
  const bool committing =
      std::any_of(pending_.begin(), pending_.end(), [](const auto& p) { return p.second.committing; });
  if (AnyRankAlive() || committing) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", name(), " runs with world size ", this->world_size(), ", not ", world_size));
  }
  return absl::OkStatus();
}

absl::Status Job::Resize(uint32_t world_size) {
  if (world_size == this->world_size()) return absl::OkStatus();
  if (absl::Status s = CheckResize(world_size); !s.ok()) return s;
  while (!pending_.empty()) {
    AbortStep(pending_.begin()->first,
              absl::StrCat("the job restarted with ", world_size, " ranks instead of ", this->world_size()));
  }
  record_.set_world_size(world_size);
  ranks_.clear();
  round_.reset();
  // Memory checkpoints of the old world are its ranks' slices: the new
  // ranks restore a durable step, resharded from disk.
  memory_steps_.clear();
  emergency_.reset();
  dirty_ = true;
  return absl::OkStatus();
}

void Job::RegisterRank(uint32_t rank, const std::string& node, int32_t pid) {
  Rank& r = ranks_[rank];
  r.node_id = node;
  r.pid = pid;
  r.alive = true;
}

bool Job::finished() const {
  if (state() != ckptd::v1::JOB_RUNNING || failed_at_ || ranks_.size() < world_size()) return false;
  for (const auto& [r, rank] : ranks_) {
    if (rank.alive) return false;
  }
  return true;
}

bool Job::RefreshRank(uint32_t rank, const std::string& node, int32_t pid) {
  const bool was_finished = finished();
  Rank& r = ranks_[rank];
  if (!r.alive || r.node_id != node || r.pid != pid) {
    r = Rank();
    r.node_id = node;
    r.pid = pid;
    r.alive = true;
  }
  return was_finished;
}

void Job::RankGone(uint32_t rank, const std::string& node) {
  auto it = ranks_.find(rank);
  if (it != ranks_.end() && it->second.node_id == node) it->second.alive = false;
}

void Job::MarkHung(uint32_t rank) {
  if (auto it = ranks_.find(rank); it != ranks_.end()) it->second.hung = true;
}

bool Job::RecordProgress(const std::string& node, const ckptd::v1::RankProgress& p, absl::Time now) {
  auto it = ranks_.find(p.rank());
  if (it == ranks_.end() || it->second.node_id != node) return false;
  Rank& rank = it->second;
  if (!rank.has_progress || p.step() != rank.step) {
    rank.has_progress = true;
    rank.hung = false;
    rank.step = p.step();
    rank.last_progress = now;
  }
  // (A step time beyond kMaxReportedSeconds is ignored: it would lift
  // every rank's hang limit, since the job's mean feeds them all.)
  auto measured = [](double v) { return v > 0 && v <= kMaxReportedSeconds; };
  auto keep = [&](double v, double& into) {
    if (measured(v)) into = v;
  };
  // The ranks' progress reaches here a heartbeat or two late, and ranks go
  // on training until they hear of the failure: until the restore round
  // starts, later progress raises the step at the failure.
  if (failed_at_ && !round_ && state() == ckptd::v1::JOB_RESTARTING) {
    step_at_failure_ = std::max(step_at_failure_, p.step());
  }
  keep(p.step_seconds(), rank.step_seconds);
  keep(p.step_seconds_idle(), rank.step_seconds_idle);
  keep(p.step_seconds_persisting(), rank.step_seconds_persisting);
  if (failed_at_ && state() == ckptd::v1::JOB_RUNNING && round_ && (round_->go || !round_->step) &&
      p.step() > round_->step.value_or(0)) {
    // The first step past the restored one: the restart is over.
    const double r = absl::ToDoubleSeconds(now - *failed_at_);
    restarts_.Push(r);
    resumes_.push_back(Resume{*failed_at_, now, round_->step, step_at_failure_,
                              RoundSummary().value_or(ckptd::v1::RestoreSummary())});
    while (resumes_.size() > kMaxResumesRemembered) resumes_.pop_front();
    record_.set_restart_seconds(Ewma(record_.restart_seconds(), r));
    failed_at_.reset();
    timings_dirty_ = true;
  }
  rank.skipped = p.snapshots_skipped();
  if (measured(p.step_seconds())) record_.set_step_seconds(Ewma(record_.step_seconds(), p.step_seconds()));
  return true;
}

void Job::Tick(uint32_t ranks_alive, double elapsed) {
  if (state() == ckptd::v1::JOB_RUNNING && ranks_alive > 0) {
    record_.set_gpu_seconds(record_.gpu_seconds() + ranks_alive * elapsed);
  }
  timings_dirty_ |= elapsed > 0 && ranks_alive > 0;
  dirty_ |= std::exchange(save_at_tick_, false);
}

void Job::ScheduleChanged() {
  ckptd::v1::Schedule* s = record_.mutable_schedule();
  s->set_generation(s->generation() + 1);
  dirty_ = true;
}

bool Job::RetargetMissed(uint64_t missed, uint64_t lead) {
  auto& extras = *record_.mutable_schedule()->mutable_extra_steps();
  auto e = std::find(extras.begin(), extras.end(), missed);
  if (e == extras.end()) return false;
  extras.erase(e);
  extras.Add(FastestStep() + lead);
  ScheduleChanged();
  return true;
}

bool Job::AddManualTarget(uint64_t target, uint64_t fastest) {
  auto* extras = record_.mutable_schedule()->mutable_extra_steps();
  if (std::find(extras->begin(), extras->end(), target) != extras->end()) return false;
  extras->Add(target);
  // Only targets still ahead are worth keeping.
  std::vector<uint64_t> keep;
  for (uint64_t s : *extras) {
    if (s + 1000 > fastest && keep.size() < kMaxManualTargets) keep.push_back(s);
  }
  extras->Assign(keep.begin(), keep.end());
  ScheduleChanged();
  return true;
}

void Job::SetRule(uint64_t every_steps, uint64_t durable_every, uint64_t start_step,
                  const std::vector<uint64_t>& extra_steps, const std::vector<uint64_t>& memory_steps,
                  uint64_t durable_phase) {
  ckptd::v1::Schedule* s = record_.mutable_schedule();
  s->mutable_extra_steps()->Assign(extra_steps.begin(), extra_steps.end());
  s->mutable_memory_steps()->Assign(memory_steps.begin(), memory_steps.end());
  s->set_start_step(start_step);
  s->set_every_steps(every_steps);
  s->set_durable_every(durable_every);
  s->set_durable_phase(durable_phase);
  ScheduleChanged();
}

absl::Status Job::CheckIncarnation(uint64_t incarnation) const {
  if (!incarnation_issued_ || incarnation <= this->incarnation()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("reported for incarnation ", incarnation, ", but job ", name(), " is at incarnation ",
                   this->incarnation(), ": no rank was told of a later restore round"));
}

void Job::RaiseIncarnation(uint64_t incarnation) {
  if (incarnation_issued_ || incarnation <= this->incarnation()) return;
  record_.mutable_schedule()->set_incarnation(incarnation);
  dirty_ = true;
}

bool Job::AddEmergencyShard(uint64_t step, const ckptd::v1::ShardRef& shard, absl::Time now) {
  PendingStep& p = pending_[step];
  if (p.shards.empty()) {
    p.first_report = now;
    p.incarnation = emergency_ && emergency_->step == step ? emergency_->incarnation : incarnation();
  }
  p.emergency = true;
  p.last_report = now;
  p.shards[shard.rank()] = shard;
  if (emergency_ && emergency_->step == step) emergency_->holders.erase(shard.rank());
  if (p.committing || p.shards.size() < world_size()) return false;
  p.committing = true;
  return true;
}

bool Job::AddShard(uint64_t step, const ckptd::v1::ShardRef& shard, double stall_seconds, uint64_t incarnation,
                   absl::Time now) {
  PendingStep& p = pending_[step];
  if (p.shards.empty()) {
    p.first_report = now;
    p.incarnation = incarnation;
  }
  p.last_report = now;
  p.shards[shard.rank()] = shard;
  p.max_stall = std::max(p.max_stall, stall_seconds);
  p.max_persist = std::max(p.max_persist, shard.persist_seconds());
  record_.set_stall_seconds(Ewma(record_.stall_seconds(), stall_seconds));
  record_.set_persist_seconds(Ewma(record_.persist_seconds(), shard.persist_seconds()));
  timings_dirty_ = true;
  if (p.committing || p.shards.size() < world_size()) return false;
  p.committing = true;
  return true;
}

bool Job::AbortStep(uint64_t step, const std::string& why) {
  auto it = pending_.find(step);
  if (it != pending_.end()) {
    if (it->second.committing) return false;  // the commit decides
    pending_.erase(it);
  }
  aborted_[step] = AbortedStep{incarnation(), why};
  if (emergency_ && emergency_->step == step) emergency_.reset();
  while (aborted_.size() > kMaxAbortedRemembered) aborted_.erase(aborted_.begin());
  record_.set_checkpoints_aborted(record_.checkpoints_aborted() + 1);
  dirty_ = true;
  return true;
}

void Job::EndCommit(uint64_t step) {
  if (auto it = pending_.find(step); it != pending_.end()) it->second.committing = false;
}

void Job::RecoverCommitted(uint64_t step, const google::protobuf::RepeatedPtrField<ckptd::v1::ShardRef>& shards) {
  committed_.insert(step);
  SetCommittedShards(step, std::vector<ckptd::v1::ShardRef>(shards.begin(), shards.end()));
}

void Job::SetCommittedShards(uint64_t step, const std::vector<ckptd::v1::ShardRef>& shards) {
  // The step's world, which a MANIFEST written before a resize may not share
  // with the job now.
  size_t world = 0;
  for (const ckptd::v1::ShardRef& s : shards) world = std::max<size_t>(world, size_t{s.rank()} + 1);
  std::vector<ShardDigest>& digests = committed_shards_[step];
  digests.assign(std::min<size_t>(world, shards.size()), ShardDigest());
  for (const ckptd::v1::ShardRef& s : shards) {
    if (s.rank() < digests.size()) digests[s.rank()] = {s.file_length(), s.index_xxh3()};
  }
}

std::optional<Job::ShardDigest> Job::CommittedShard(uint64_t step, uint32_t rank) const {
  if (auto m = memory_steps_.find(step); m != memory_steps_.end()) {
    auto shard = m->second.shards.find(rank);
    if (!m->second.complete || shard == m->second.shards.end()) return std::nullopt;
    return shard->second;
  }
  if (!committed_.contains(step)) return std::nullopt;
  auto it = committed_shards_.find(step);
  if (it == committed_shards_.end() || rank >= it->second.size() || it->second[rank].file_length == 0) {
    return std::nullopt;
  }
  return it->second[rank];
}

void Job::MarkCommitted(uint64_t step, double stall, double persist, bool measured) {
  pending_.erase(step);
  committed_.insert(step);
  reuse_warning_.clear();  // this run committed a step of its own
  // A step past the round's committed: every rank resumed and trained past
  // it, so the round is over for a coordinator taking the job over (an
  // emergency persist during the round commits its step or an older one).
  if (record_.round().open() && step > record_.round().step()) record_.clear_round();
  memory_steps_.erase(memory_steps_.begin(), memory_steps_.upper_bound(step));
  if (emergency_ && emergency_->step <= step) emergency_.reset();
  if (failed_at_ && !round_) step_at_failure_ = std::max(step_at_failure_, step);
  if (measured) {
    stalls_.Push(stall);
    persists_.Push(persist);
  }
  record_.set_checkpoints_committed(record_.checkpoints_committed() + 1);
  dirty_ = true;
  save_at_tick_ = true;
}

void Job::DropMemoryStep(uint64_t step) {
  memory_steps_.erase(step);
  // A copy of it is damaged or gone: its shard cannot be written as reported.
  if (emergency_ && emergency_->step == step) emergency_.reset();
}

bool Job::AddMemoryShard(uint64_t step, uint32_t rank, ShardDigest digest, double stall_seconds,
                         uint64_t incarnation) {
  if (std::optional<uint64_t> durable = NewestUsable(); durable && step <= *durable) return false;
  auto [it, fresh] = memory_steps_.try_emplace(step);
  MemoryStep& m = it->second;
  if (fresh) m.incarnation = incarnation;
  if (m.complete) return false;  // a repeated report
  m.shards[rank] = digest;
  m.max_stall = std::max(m.max_stall, stall_seconds);
  record_.set_stall_seconds(Ewma(record_.stall_seconds(), stall_seconds));
  timings_dirty_ = true;
  // The oldest go first; a complete one is never dropped for an incomplete
  // one older than it.
  while (memory_steps_.size() > kMaxMemorySteps) memory_steps_.erase(memory_steps_.begin());
  if (!memory_steps_.contains(step) || m.shards.size() < world_size()) return false;
  m.complete = true;
  // Incomplete ones before it will not be restored: a newer one is whole.
  for (auto older = memory_steps_.begin(); older->first < step;) {
    older = older->second.complete ? std::next(older) : memory_steps_.erase(older);
  }
  if (failed_at_ && !round_) step_at_failure_ = std::max(step_at_failure_, step);
  stalls_.Push(m.max_stall);
  return true;
}

std::vector<uint64_t> Job::PendingBefore(uint64_t step) const {
  std::vector<uint64_t> steps;
  for (const auto& [s, p] : pending_) {
    if (s < step) steps.push_back(s);
  }
  return steps;
}

std::vector<uint64_t> Job::PendingAfter(std::optional<uint64_t> step) const {
  std::vector<uint64_t> steps;
  for (const auto& [s, p] : pending_) {
    if (!step || s > *step) steps.push_back(s);
  }
  return steps;
}

std::vector<uint64_t> Job::PendingPastDeadline(absl::Time now, absl::Duration deadline) const {
  std::vector<uint64_t> steps;
  for (const auto& [s, p] : pending_) {
    if (!p.committing && now - p.first_report > deadline) steps.push_back(s);
  }
  return steps;
}

void Job::ForgetProgress() {
  for (auto& [r, rank] : ranks_) {
    rank.has_progress = false;
    rank.hung = false;
  }
}

bool Job::Restart(absl::Time now) {
  ckptd::v1::Schedule* s = record_.mutable_schedule();
  if (s->state() == ckptd::v1::JOB_RESTARTING) return false;
  s->set_state(ckptd::v1::JOB_RESTARTING);
  // One failure per restart, however many ranks it took down.
  record_.set_failures(record_.failures() + 1);
  failed_at_ = now;
  restart_class_ = -1;
  restart_lost_nodes_.clear();
  // Raised by later progress and commits until the restore round starts
  // (RecordProgress, MarkCommitted).
  step_at_failure_ = std::max(NewestUsable().value_or(0), FastestStep());
  // Targets of manual checkpoints belong to the run that failed.
  s->clear_extra_steps();
  s->clear_memory_steps();
  ScheduleChanged();
  round_.reset();
  RecordRound();
  ForgetProgress();
  return true;
}

void Job::ClassifyFailure(ckptd::v1::FailureKind kind, const std::string& node) {
  if (state() != ckptd::v1::JOB_RESTARTING) return;
  int cls = static_cast<int>(policy::FailureClass::kProcess);
  if (kind == ckptd::v1::NODE_LOST) {
    restart_lost_nodes_.insert(node);
    cls = static_cast<int>(restart_lost_nodes_.size() > 1 ? policy::FailureClass::kWide : policy::FailureClass::kNode);
  } else if (kind != ckptd::v1::TRAINER_DIED && kind != ckptd::v1::TRAINER_HUNG) {
    return;
  }
  if (cls <= restart_class_) return;
  const auto add = [this](int c, int64_t delta) {
    switch (static_cast<policy::FailureClass>(c)) {
      case policy::FailureClass::kProcess:
        record_.set_failures_process(record_.failures_process() + delta);
        break;
      case policy::FailureClass::kNode:
        record_.set_failures_node(record_.failures_node() + delta);
        break;
      case policy::FailureClass::kWide:
        record_.set_failures_wide(record_.failures_wide() + delta);
        break;
    }
  };
  if (restart_class_ >= 0) add(restart_class_, -1);
  add(cls, 1);
  restart_class_ = cls;
  MarkChanged();
}

std::array<uint64_t, 3> Job::FailuresByClass() const {
  std::array<uint64_t, 3> n = {record_.failures_process(), record_.failures_node(), record_.failures_wide()};
  const uint64_t classified = n[0] + n[1] + n[2];
  if (record_.failures() > classified) n[0] += record_.failures() - classified;
  return n;
}

void Job::StartRestoreRound(std::optional<uint64_t> memory_step) {
  RestoreRound round;
  round.step = NewestUsable();
  if (memory_step && memory_steps_.contains(*memory_step) && (!round.step || *memory_step > *round.step)) {
    round.step = memory_step;
    round.memory = true;
  }
  // What comes after the restored step is redone.
  memory_steps_.erase(round.step ? memory_steps_.upper_bound(*round.step) : memory_steps_.begin(),
                      memory_steps_.end());
  if (emergency_ && !memory_steps_.contains(emergency_->step)) emergency_.reset();
  round_ = round;
  ckptd::v1::Schedule* s = record_.mutable_schedule();
  // Every rank starts over from the plan's step with the schedule it fetches
  // then: the rule may count from the start again (same phase), so that a
  // restore to an older step is not left without checkpoints until the start
  // of an interval that the policy set ahead of the old run.
  // (A whole durable period, with two cadences: the durable steps stay.)
  const uint64_t period = s->every_steps() * std::max<uint64_t>(1, s->durable_every());
  if (period > 0) s->set_start_step(s->start_step() % period);
  // Cannot wrap: the count starts at most at kMaxIncarnation (reports and
  // recovered records above it are refused) and rises by one a round.
  s->set_incarnation(s->incarnation() + 1);
  incarnation_issued_ = true;
  s->set_state(ckptd::v1::JOB_RUNNING);
  ScheduleChanged();
  RecordRound();
  ForgetProgress();
}

void Job::EndRoundTakenOverIfPast() {
  if (!round_ || !round_->recovered || committed_.empty()) return;
  if (*committed_.rbegin() <= round_->step.value_or(0)) return;
  // The job resumed and committed past the round (its record was saved
  // before that commit's): the round is over.
  round_.reset();
  record_.clear_round();
  MarkChanged();
}

void Job::RecordRound() {
  ckptd::v1::RestoreRoundRecord* r = record_.mutable_round();
  r->Clear();
  if (round_) {
    r->set_open(true);
    r->set_fresh_start(!round_->step);
    r->set_step(round_->step.value_or(0));
    r->set_memory(round_->memory);
    r->set_go(round_->go);
    r->set_incarnation(incarnation());
  }
  MarkChanged();
}

bool Job::NeedsNewRound(uint32_t rank, bool has_attempt) const {
  return !round_ || (round_->go && !has_attempt) || (!round_->step && !has_attempt && round_->ok.contains(rank));
}

bool Job::FreshStartNeedsConsent() const {
  if (committed_.empty() || NewestUsable()) return false;
  return !fresh_allowed_over_ || *fresh_allowed_over_ < *committed_.rbegin();
}

bool Job::SetRestoreBlocked(const std::string& why) {
  if (restore_blocked_ == why) return false;
  restore_blocked_ = why;
  return true;
}

bool Job::IsNewTrainer(uint32_t rank, const std::string& asker, const std::string& node, int32_t pid) const {
  if (round_ && !asker.empty()) {
    if (auto it = round_->askers.find(rank); it != round_->askers.end()) return it->second != asker;
  }
  auto it = ranks_.find(rank);
  if (it == ranks_.end() || !it->second.alive || !it->second.has_progress) return false;
  const Rank& known = it->second;
  return known.node_id != node || (pid != 0 && known.pid != 0 && known.pid != pid);
}

bool Job::AskedBefore(uint32_t rank, const std::string& asker) const {
  if (!round_ || asker.empty()) return false;
  auto it = round_->askers.find(rank);
  return it != round_->askers.end() && it->second == asker;
}

bool Job::AnyRankProgressing() const {
  // A trainer waiting for its restore reports step 0.
  return std::any_of(ranks_.begin(), ranks_.end(),
                     [](const auto& r) { return r.second.alive && r.second.has_progress && r.second.step > 0; });
}

void Job::TakePart(uint32_t rank, const std::string& asker) {
  if (round_ && !asker.empty()) round_->askers[rank] = asker;
}

RestorePlanResponse Job::StartsFresh(uint32_t rank) {
  round_->ok.insert(rank);  // remembers who started fresh in this round
  return Plan();
}

RestorePlanResponse Job::NotLoaded(uint32_t rank) {
  round_->ok.erase(rank);
  return Plan();
}

RestorePlanResponse Job::Loaded(uint32_t rank, ckptd::v1::RestoreSource source, uint32_t saved_world_size) {
  round_->ok.insert(rank);
  round_->sources[rank] = source;
  NoteResharded(rank, saved_world_size);
  if (!round_->go && round_->ok.size() == world_size()) {
    round_->go = true;
    RecordRound();
  }
  RestorePlanResponse r = Plan();
  if (!round_->go) r.set_verdict(RestorePlanResponse::WAIT);
  return r;
}

void Job::NoteResharded(uint32_t rank, uint32_t saved_world_size) {
  if (saved_world_size > 0) {
    round_->resharded_from[rank] = saved_world_size;
  } else {
    round_->resharded_from.erase(rank);
  }
}

absl::Status Job::Reread(uint32_t rank, const std::string& asker, uint64_t step, ckptd::v1::RestoreSource source,
                         uint32_t saved_world_size) {
  if (!round_ || round_->step != step || !round_->ok.contains(rank) || !AskedBefore(rank, asker)) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " of job ", name(), " did not load step ", step,
                                                      " in the restore round under way: nothing to read again"));
  }
  round_->sources[rank] = source;
  NoteResharded(rank, saved_world_size);
  // The resume of this round, recorded when a rank took its first step.
  if (!resumes_.empty() && resumes_.back().restored == step && resumes_.back().sources.incarnation() == incarnation()) {
    for (ckptd::v1::RestoreSummary::Rank& r : *resumes_.back().sources.mutable_ranks()) {
      if (r.rank() == rank) {
        r.set_source(source);
        r.set_resharded(saved_world_size > 0);
      }
    }
    if (saved_world_size > 0) resumes_.back().sources.set_saved_world_size(saved_world_size);
  }
  return absl::OkStatus();
}

std::optional<ckptd::v1::RestoreSummary> Job::RoundSummary() const {
  if (!round_ || !round_->go || !round_->step) return std::nullopt;
  ckptd::v1::RestoreSummary r;
  r.set_step(*round_->step);
  r.set_incarnation(incarnation());
  for (const auto& [rank, source] : round_->sources) {
    ckptd::v1::RestoreSummary::Rank* e = r.add_ranks();
    e->set_rank(rank);
    e->set_source(source);
    if (auto it = ranks_.find(rank); it != ranks_.end()) e->set_node_id(it->second.node_id);
    if (auto it = round_->resharded_from.find(rank); it != round_->resharded_from.end()) {
      e->set_resharded(true);
      r.set_saved_world_size(it->second);
    }
  }
  return r;
}

RestorePlanResponse Job::FallBack() {
  std::map<uint32_t, std::string> askers = std::move(round_->askers);
  round_ = RestoreRound();
  round_->step = NewestUsable();
  round_->askers = std::move(askers);
  RecordRound();
  return Plan();
}

RestorePlanResponse Job::Plan() const {
  RestorePlanResponse r;
  r.set_incarnation(incarnation());
  if (!round_->step) {
    r.set_verdict(RestorePlanResponse::FRESH_START);
  } else {
    r.set_verdict(round_->go ? RestorePlanResponse::GO : RestorePlanResponse::LOAD);
    r.set_step(*round_->step);
    r.set_memory_step(round_->memory);
  }
  return r;
}

void Job::Unpin(uint64_t step) {
  if (--verifying_[step] <= 0) verifying_.erase(step);
}

std::optional<JobRecord> Job::RecordToSave(absl::Time now) {
  if (!dirty_ && !(timings_dirty_ && now - last_saved_ >= kTimingsSaveInterval)) return std::nullopt;
  dirty_ = false;
  timings_dirty_ = false;
  last_saved_ = now;
  record_.set_updated_unix_nanos(absl::ToUnixNanos(now));
  return record_;
}

}  // namespace ckptd::coordinator::internal
