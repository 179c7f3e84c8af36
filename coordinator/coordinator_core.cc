#include "coordinator/coordinator_core.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <iostream>
#include <random>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "storage/layout.h"
#include "storage/status_macros.h"

namespace ckptd::coordinator {

using ckptd::v1::FailureEvent;
using ckptd::v1::FailureKind;
using ckptd::v1::JobRecord;
using ckptd::v1::RestorePlanResponse;
using ckptd::v1::ShardRef;
using ckptd::v1::ShardReport;

namespace {

// Steps are counted by trainers; anything near 2^64 is a corrupt request.
constexpr uint64_t kMaxStep = uint64_t{1} << 62;
constexpr uint64_t kMaxShardBytes = uint64_t{1} << 50;
constexpr size_t kMaxRanksPerAgent = 4096;
constexpr size_t kMaxAbortedRemembered = 1024;
// Timings and GPU time change with every heartbeat; they are saved this often.
constexpr absl::Duration kTimingsSaveInterval = absl::Seconds(10);

double Ewma(double old_value, double sample) {
  if (!(sample >= 0) || !std::isfinite(sample)) return old_value;
  return old_value == 0 ? sample : 0.8 * old_value + 0.2 * sample;
}

absl::Status ValidateRankInfo(const ckptd::v1::RankInfo& r, uint32_t max_world) {
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(r.job()));
  if (r.world_size() == 0 || r.world_size() > max_world) {
    return absl::InvalidArgumentError(absl::StrCat("job ", r.job(), ": world size ", r.world_size(),
                                                   " is outside 1..", max_world));
  }
  if (r.rank() >= r.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", r.job(), ": rank ", r.rank(), " is not inside world size ", r.world_size()));
  }
  return absl::OkStatus();
}

absl::Status ValidateShardReport(const ShardReport& r, uint32_t max_world) {
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(r.job()));
  const std::string what = absl::StrCat("shard report of job ", r.job(), " step ", r.step());
  if (r.world_size() == 0 || r.world_size() > max_world) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": world size ", r.world_size(), " is outside 1..", max_world));
  }
  if (r.shard().rank() >= r.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", r.shard().rank(), " is not inside world size ", r.world_size()));
  }
  if (r.step() > kMaxStep) return absl::InvalidArgumentError(absl::StrCat(what, ": step is out of range"));
  if (r.shard().file_length() == 0 || r.shard().file_length() > kMaxShardBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shard length ", r.shard().file_length(), " is out of range"));
  }
  for (double v : {r.stall_seconds(), r.shard().persist_seconds()}) {
    if (!std::isfinite(v) || v < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": a timing is not a duration"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateNodeId(absl::string_view node_id) {
  absl::Status s = storage::ValidateJobName(node_id);
  if (s.ok()) return s;
  std::string message(s.message());
  if (absl::StartsWith(message, "job name")) message.replace(0, 8, "node id");
  return absl::InvalidArgumentError(message);
}

struct CoordinatorCore::Agent {
  std::string node_id;
  std::string address;
  uint64_t session = 0;
  std::vector<std::string> gpus;
  std::vector<ckptd::v1::RankInfo> ranks;
  absl::Time last_heartbeat;
  bool alive = true;
  bool drills_allowed = false;
  uint64_t instance = 0;  // the agent process's (0: an agent that does not say)
};

struct CoordinatorCore::Drill {
  ckptd::v1::RunDrillRequest request;
  std::string node;
  absl::Time ordered;
  std::optional<uint64_t> newest_at_order;
  std::optional<ckptd::v1::DrillReport> report;
};

struct CoordinatorCore::Rank {
  std::string node_id;
  int32_t pid = 0;
  bool alive = false;
  bool has_progress = false;
  bool hung = false;
  uint64_t step = 0;
  absl::Time last_progress;
  double step_seconds = 0;
  double step_seconds_idle = 0;        // with no persist of the rank in flight
  double step_seconds_persisting = 0;  // with one
  uint64_t skipped = 0;
};

struct CoordinatorCore::PendingStep {
  absl::Time first_report;
  absl::Time last_report;
  uint64_t incarnation = 0;
  std::map<uint32_t, ShardRef> shards;
  bool committing = false;
  // The slowest rank's: what the step cost the job.
  double max_stall = 0;
  double max_persist = 0;
};

struct CoordinatorCore::RestoreRound {
  std::optional<uint64_t> step;  // nullopt: fresh start
  std::set<uint32_t> ok;
  bool go = false;
};

struct CoordinatorCore::Job {
  JobRecord record;  // world size, schedule (with the incarnation), timings, counters
  std::map<uint32_t, Rank> ranks;
  std::map<uint64_t, PendingStep> pending;
  std::set<uint64_t> committed;
  std::map<uint64_t, std::string> quarantined;  // step -> why
  // Committed steps being verified (a count per step): retention leaves them
  // alone until the verification ends; the next commit drops them if due.
  std::map<uint64_t, int> verifying;
  struct Aborted {
    uint64_t incarnation = 0;  // the step's reports up to this incarnation are void
    std::string reason;
  };
  std::map<uint64_t, Aborted> aborted;
  std::optional<RestoreRound> round;
  // Changed schedule, counters or world size: saved at once. Changed
  // timings only: saved every kTimingsSaveInterval. The counters of a commit:
  // saved by the next Tick, so that the answer to the report that completed
  // the step does not wait for a database sync (the step itself is durable in
  // its MANIFEST, which Recover reads back).
  bool dirty = false;
  bool timings_dirty = false;
  bool save_at_tick = false;
  absl::Time last_saved;
  // The interval policy's measurements: per committed checkpoint the slowest
  // rank's stall and persist time; per restart the time from the failure to
  // the first step after it. `failed_at`: a restart is under way.
  policy::RecentWindow stalls, persists, restarts;
  std::optional<absl::Time> failed_at;
  uint64_t step_at_failure = 0;  // the fastest rank's, when failed_at was set
  absl::Time last_decided;
  // The restarts that completed, newest last (a few), for drill reports.
  struct Resume {
    absl::Time failed;
    absl::Time resumed;
    std::optional<uint64_t> restored;  // nullopt: fresh start
    uint64_t step_at_failure = 0;
  };
  std::deque<Resume> resumes;

  const std::string& name() const { return record.job(); }
  uint32_t world_size() const { return record.world_size(); }
  uint64_t incarnation() const { return record.schedule().incarnation(); }
  std::optional<uint64_t> NewestUsable() const {
    for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
      if (!quarantined.contains(*it)) return *it;
    }
    return std::nullopt;
  }
};

struct CoordinatorCore::Effects {
  struct CommitTask {
    std::string job;
    uint64_t step = 0;
    uint32_t world_size = 0;
    std::vector<ShardRef> shards;
    absl::Time last_report;
    double stall = 0;    // the slowest rank's
    double persist = 0;
  };
  std::vector<FailureEvent> events;
  std::vector<JobRecord> records;
  std::vector<ckptd::v1::QuarantinedStep> quarantines;
  std::vector<CommitTask> commits;
  std::vector<std::pair<std::string, uint64_t>> aborts;    // remove an uncommitted step's files
  std::vector<std::pair<std::string, uint64_t>> removals;  // retention of committed steps
  std::vector<std::tuple<std::string, uint64_t, std::string>> aborted_notes;
  bool empty() const {
    return events.empty() && records.empty() && quarantines.empty() && commits.empty() && aborts.empty() &&
           removals.empty() && aborted_notes.empty();
  }
};

CoordinatorCore::CoordinatorCore(storage::CheckpointStore* store, StateStore* state, Clock* clock,
                                 CoordinatorOptions options, CoordinatorObserver* observer)
    : store_(store), state_(state), clock_(clock), options_(std::move(options)), observer_(observer) {
  // Sessions of an earlier coordinator must not be mistaken for ours.
  std::random_device rd;
  next_session_ = ((uint64_t{rd()} << 32) ^ rd()) & 0x7fffffffffffULL;
  last_tick_ = clock_->Now();
}

CoordinatorCore::~CoordinatorCore() = default;

absl::Status CoordinatorCore::Recover() {
  CKPTD_ASSIGN_OR_RETURN(std::vector<JobRecord> records, state_->ListJobs());
  absl::StatusOr<std::vector<std::string>> listed = store_->ListJobs();
  if (!listed.ok() && !absl::IsNotFound(listed.status())) return listed.status();
  const std::vector<std::string> stored_jobs = listed.ok() ? *listed : std::vector<std::string>();
  absl::MutexLock l(&mu_);
  for (const JobRecord& r : records) {
    if (!storage::ValidateJobName(r.job()).ok() || r.world_size() == 0) continue;
    auto job = std::make_unique<Job>();
    job->record = r;
    // The measurements themselves are not kept; their recent means seed the
    // windows so that the policy need not wait for new ones.
    if (r.stall_seconds() > 0) job->stalls.Push(r.stall_seconds());
    if (r.persist_seconds() > 0) job->persists.Push(r.persist_seconds());
    if (r.restart_seconds() > 0) job->restarts.Push(r.restart_seconds());
    if (job->record.schedule().state() == ckptd::v1::JOB_STATE_UNSPECIFIED) {
      job->record.mutable_schedule()->set_state(ckptd::v1::JOB_RUNNING);
    }
    jobs_[r.job()] = std::move(job);
  }
  for (const std::string& name : stored_jobs) {
    CKPTD_ASSIGN_OR_RETURN(std::vector<storage::StepInfo> steps, store_->ListSteps(name));
    Job* job = FindJob(name);
    for (const storage::StepInfo& s : steps) {
      if (s.state != storage::StepState::kCommitted) continue;
      if (job == nullptr) {
        auto fresh = std::make_unique<Job>();
        fresh->record.set_job(name);
        fresh->record.set_world_size(s.manifest->world_size());
        fresh->record.mutable_schedule()->set_job(name);
        fresh->record.mutable_schedule()->set_every_steps(options_.every_steps);
        fresh->record.mutable_schedule()->set_state(ckptd::v1::JOB_RUNNING);
        job = fresh.get();
        jobs_[name] = std::move(fresh);
      }
      job->committed.insert(s.step);
      if (s.quarantined) job->quarantined[s.step] = *s.quarantined;
    }
  }
  for (auto& [name, job] : jobs_) {
    CKPTD_ASSIGN_OR_RETURN(std::vector<ckptd::v1::QuarantinedStep> q, state_->ListQuarantined(name));
    for (const auto& step : q) job->quarantined[step.step()] = step.reason();
  }
  return absl::OkStatus();
}

CoordinatorCore::Job* CoordinatorCore::FindJob(const std::string& name) {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : it->second.get();
}

absl::StatusOr<CoordinatorCore::Job*> CoordinatorCore::JobFor(const std::string& name, uint32_t world_size) {
  Job* job = FindJob(name);
  if (job == nullptr) {
    auto fresh = std::make_unique<Job>();
    fresh->record.set_job(name);
    fresh->record.set_world_size(world_size);
    ckptd::v1::Schedule* s = fresh->record.mutable_schedule();
    s->set_job(name);
    s->set_generation(1);
    s->set_every_steps(options_.every_steps);
    s->set_state(ckptd::v1::JOB_RUNNING);
    fresh->dirty = true;
    job = fresh.get();
    jobs_[name] = std::move(fresh);
    return job;
  }
  if (job->world_size() != world_size) {
    bool anyone_alive = false;
    for (const auto& [r, rank] : job->ranks) anyone_alive |= rank.alive;
    if (anyone_alive || !job->pending.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("job ", name, " runs with world size ", job->world_size(),
                                                        ", not ", world_size));
    }
    // The whole job came back with another size; its ranks start over.
    job->record.set_world_size(world_size);
    job->ranks.clear();
    job->round.reset();
    job->dirty = true;
  }
  return job;
}

absl::StatusOr<ckptd::v1::RegisterAgentResponse> CoordinatorCore::RegisterAgent(
    const ckptd::v1::RegisterAgentRequest& request) {
  CKPTD_RETURN_IF_ERROR(ValidateNodeId(request.node_id()));
  if (request.ranks_size() > static_cast<int>(kMaxRanksPerAgent)) {
    return absl::InvalidArgumentError(absl::StrCat("node ", request.node_id(), " registers ", request.ranks_size(),
                                                   " ranks; at most ", kMaxRanksPerAgent));
  }
  for (const auto& r : request.ranks()) CKPTD_RETURN_IF_ERROR(ValidateRankInfo(r, options_.max_world_size));
  for (const auto& s : request.durable_shards()) {
    CKPTD_RETURN_IF_ERROR(ValidateShardReport(s, options_.max_world_size));
  }
  const std::vector<absl::Status> checks = CheckShardFiles(request.durable_shards());
  ckptd::v1::RegisterAgentResponse response;
  Effects fx;
  {
    absl::MutexLock l(&mu_);
    // Every rank's job must accept its world size before anything changes.
    for (const auto& r : request.ranks()) {
      Job* job = FindJob(r.job());
      if (job != nullptr && job->world_size() != r.world_size()) {
        CKPTD_RETURN_IF_ERROR(JobFor(r.job(), r.world_size()).status());
      }
    }
    auto& agent = agents_[request.node_id()];
    if (agent == nullptr) agent = std::make_unique<Agent>();
    // A new agent process while the old one still counts as alive: it
    // crashed and was started again before it was missed. The snapshots it
    // held and the ranks' registrations went with it: the node is lost, as
    // if it had stayed away, and its jobs restart.
    if (agent->alive && agent->instance != 0 && request.instance() != 0 && agent->instance != request.instance()) {
      LoseAgent(agent.get(), "its agent restarted (a new process registered): the snapshots it held are lost", &fx);
    }
    agent->instance = request.instance();
    // An agent told to kill itself may die before its report gets out; when
    // it comes back, the order must not kill it again.
    for (auto& [id, drill] : drills_) {
      const bool kills_agent = drill.request.scenario() == ckptd::v1::KILL_AGENT ||
                               drill.request.scenario() == ckptd::v1::KILL_NODE;
      if (drill.node != request.node_id() || drill.report || !kills_agent) {
        continue;
      }
      ckptd::v1::DrillReport r;
      r.set_drill_id(id);
      r.set_injected(true);
      r.set_injected_unix_nanos(absl::ToUnixNanos(std::max(drill.ordered, agent->last_heartbeat)));
      r.set_detail("the agent registered again without reporting: it was killed");
      drill.report = r;
    }
    agent->node_id = request.node_id();
    agent->address = request.address();
    agent->gpus.assign(request.gpus().begin(), request.gpus().end());
    agent->session = next_session_++;
    agent->last_heartbeat = clock_->Now();
    agent->alive = true;
    agent->ranks.assign(request.ranks().begin(), request.ranks().end());
    agent->drills_allowed = request.drills_allowed();
    for (const auto& r : request.ranks()) {
      CKPTD_ASSIGN_OR_RETURN(Job * job, JobFor(r.job(), r.world_size()));
      Rank& rank = job->ranks[r.rank()];
      rank.node_id = request.node_id();
      rank.pid = r.pid();
      rank.alive = true;
    }
    response.set_session(agent->session);
    response.set_heartbeat_interval_ms(
        static_cast<uint32_t>(std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.heartbeat_interval))));
    for (int i = 0; i < request.durable_shards_size(); ++i) {
      // A shard that is no longer wanted is dropped; it does not fail the registration.
      (void)AcceptShard(request.durable_shards(i), checks[i], &fx);
    }
    SaveChangedJobs(&fx);
  }
  Apply(fx);
  return response;
}

absl::StatusOr<ckptd::v1::HeartbeatAck> CoordinatorCore::OnHeartbeat(const ckptd::v1::Heartbeat& hb) {
  CKPTD_RETURN_IF_ERROR(ValidateNodeId(hb.node_id()));
  if (hb.ranks_size() > static_cast<int>(kMaxRanksPerAgent) ||
      hb.progress_size() > static_cast<int>(kMaxRanksPerAgent)) {
    return absl::InvalidArgumentError(absl::StrCat("heartbeat of node ", hb.node_id(), " lists too many ranks"));
  }
  for (const auto& r : hb.ranks()) CKPTD_RETURN_IF_ERROR(ValidateRankInfo(r, options_.max_world_size));
  ckptd::v1::HeartbeatAck ack;
  Effects fx;
  {
    absl::MutexLock l(&mu_);
    auto it = agents_.find(hb.node_id());
    if (it == agents_.end() || it->second->session != hb.session() || !it->second->alive) {
      ack.set_known(false);
      return ack;
    }
    Agent* agent = it->second.get();
    const absl::Time now = clock_->Now();
    agent->last_heartbeat = now;
    // Ranks that left the node are no longer alive there.
    for (const auto& old : agent->ranks) {
      bool still = false;
      for (const auto& r : hb.ranks()) still |= r.job() == old.job() && r.rank() == old.rank();
      Job* job = FindJob(old.job());
      if (!still && job != nullptr) {
        auto rit = job->ranks.find(old.rank());
        if (rit != job->ranks.end() && rit->second.node_id == agent->node_id) rit->second.alive = false;
      }
    }
    std::vector<ckptd::v1::RankInfo> accepted;
    for (const auto& r : hb.ranks()) {
      absl::StatusOr<Job*> job = JobFor(r.job(), r.world_size());
      if (!job.ok()) continue;  // a rank of another world size is refused; the others go on
      Rank& rank = (*job)->ranks[r.rank()];
      if (!rank.alive || rank.node_id != agent->node_id || rank.pid != r.pid()) {
        rank = Rank();
        rank.node_id = agent->node_id;
        rank.pid = r.pid();
        rank.alive = true;
      }
      accepted.push_back(r);
    }
    agent->ranks = std::move(accepted);
    for (const auto& p : hb.progress()) {
      Job* job = FindJob(p.job());
      if (job == nullptr) continue;
      auto rit = job->ranks.find(p.rank());
      if (rit == job->ranks.end() || rit->second.node_id != agent->node_id) continue;
      Rank& rank = rit->second;
      if (p.step() > kMaxStep) continue;
      if (!rank.has_progress || p.step() != rank.step) {
        rank.has_progress = true;
        rank.hung = false;
        rank.step = p.step();
        rank.last_progress = now;
      }
      auto keep = [](double v, double& into) {
        if (v > 0 && std::isfinite(v)) into = v;
      };
      if (job->failed_at && !job->round && job->record.schedule().state() == ckptd::v1::JOB_RESTARTING) {
        job->step_at_failure = std::max(job->step_at_failure, p.step());
      }
      keep(p.step_seconds(), rank.step_seconds);
      keep(p.step_seconds_idle(), rank.step_seconds_idle);
      keep(p.step_seconds_persisting(), rank.step_seconds_persisting);
      if (job->failed_at && job->record.schedule().state() == ckptd::v1::JOB_RUNNING && job->round &&
          (job->round->go || !job->round->step) && p.step() > job->round->step.value_or(0)) {
        // The first step past the restored one: the restart is over.
        const double r = absl::ToDoubleSeconds(now - *job->failed_at);
        job->restarts.Push(r);
        job->resumes.push_back(Job::Resume{*job->failed_at, now, job->round->step, job->step_at_failure});
        while (job->resumes.size() > 16) job->resumes.pop_front();
        job->record.set_restart_seconds(Ewma(job->record.restart_seconds(), r));
        job->failed_at.reset();
        job->timings_dirty = true;
      }
      rank.skipped = p.snapshots_skipped();
      JobRecord& rec = job->record;
      if (p.step_seconds() > 0) rec.set_step_seconds(Ewma(rec.step_seconds(), p.step_seconds()));
      for (uint64_t missed : p.missed_targets()) {
        auto& extras = *rec.mutable_schedule()->mutable_extra_steps();
        auto e = std::find(extras.begin(), extras.end(), missed);
        if (e == extras.end()) continue;
        // The rank learned of the target too late: pick one ahead of everyone.
        extras.erase(e);
        uint64_t fastest = 0;
        for (const auto& [n, other] : job->ranks) fastest = std::max(fastest, other.step);
        rec.mutable_schedule()->add_extra_steps(fastest + ManualLead(*job));
        ChangeSchedule(job);
        if (job->pending.contains(missed)) AbortPending(job, missed, "a rank passed the target before it knew", &fx);
      }
    }
    std::set<std::string> seen;
    for (const auto& r : agent->ranks) {
      if (!seen.insert(r.job()).second) continue;
      if (Job* job = FindJob(r.job())) *ack.add_schedules() = job->record.schedule();
    }
    for (const ckptd::v1::DrillReport& report : hb.drill_reports()) {
      auto d = drills_.find(report.drill_id());
      if (d != drills_.end() && d->second.node == agent->node_id) d->second.report = report;
    }
    for (const auto& [id, drill] : drills_) {
      if (drill.node != agent->node_id || drill.report) continue;
      ckptd::v1::DrillOrder* o = ack.add_drills();
      o->set_drill_id(id);
      o->set_scenario(drill.request.scenario());
      o->set_job(drill.request.job());
      o->set_rank(drill.request.rank());
      o->set_at_step(drill.request.at_step());
      o->set_duration_seconds(drill.request.duration_seconds());
      o->set_slow_seconds(drill.request.slow_seconds());
    }
    ack.set_known(true);
    SaveChangedJobs(&fx);
  }
  Apply(fx);
  return ack;
}

void CoordinatorCore::ChangeSchedule(Job* job) {
  ckptd::v1::Schedule* s = job->record.mutable_schedule();
  s->set_generation(s->generation() + 1);
  job->dirty = true;
}

uint64_t CoordinatorCore::ManualLead(const Job& job) const {
  // Far enough ahead that every rank hears of it first: two heartbeats and
  // the client's poll, in steps of the job's pace (at least two steps).
  const double seconds = 2 * absl::ToDoubleSeconds(options_.heartbeat_interval) + 0.5;
  const double step_s = job.record.step_seconds();
  if (step_s <= 0) return 10;
  return std::max<uint64_t>(2, static_cast<uint64_t>(std::ceil(seconds / step_s)) + 1);
}

absl::StatusOr<bool> CoordinatorCore::AcceptShard(const ShardReport& report, const absl::Status& file_check,
                                                   Effects* fx) {
  const uint64_t step = report.step();
  const uint32_t rank = report.shard().rank();
  const std::string what = absl::StrCat("job ", report.job(), " step ", step, " rank ", rank);
  Job* job = FindJob(report.job());
  if (job == nullptr) {
    CKPTD_ASSIGN_OR_RETURN(job, JobFor(report.job(), report.world_size()));
  }
  if (job->world_size() != report.world_size()) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": reported for a world of ", report.world_size(),
                                                      "; the job runs ", job->world_size()));
  }
  if (job->committed.contains(step)) return true;  // a repeated report of a committed step
  if (report.incarnation() > job->incarnation()) {
    // A coordinator that lost its database: trust the rank's count.
    job->record.mutable_schedule()->set_incarnation(report.incarnation());
    job->dirty = true;
  }
  if (report.incarnation() < job->incarnation()) {
    fx->aborts.emplace_back(job->name(), step);
    return absl::AbortedError(absl::StrCat(what, ": written before the job's latest restore; not committed"));
  }
  if (auto a = job->aborted.find(step); a != job->aborted.end() && report.incarnation() <= a->second.incarnation) {
    return absl::AbortedError(absl::StrCat(what, ": the step was aborted"));
  }
  if (std::optional<uint64_t> newest = job->NewestUsable(); newest && step < *newest) {
    fx->aborts.emplace_back(job->name(), step);
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": older than committed step ", *newest, "; not needed"));
  }
  if (!file_check.ok()) {
    // The rank's shard of this step is not what it said: the step cannot
    // complete, and waiting for the deadline would only hold its files.
    AbortPending(job, step, std::string(file_check.message()), fx);
    return absl::Status(file_check.code(), absl::StrCat(what, ": ", file_check.message(), "; the step is aborted"));
  }
  PendingStep& p = job->pending[step];
  const absl::Time now = clock_->Now();
  if (p.shards.empty()) {
    p.first_report = now;
    p.incarnation = report.incarnation();
  }
  p.last_report = now;
  ShardRef ref = report.shard();
  ref.set_file(storage::ShardFileName(rank));  // never a client-supplied path
  p.shards[rank] = ref;
  p.max_stall = std::max(p.max_stall, report.stall_seconds());
  p.max_persist = std::max(p.max_persist, ref.persist_seconds());
  JobRecord& rec = job->record;
  rec.set_stall_seconds(Ewma(rec.stall_seconds(), report.stall_seconds()));
  rec.set_persist_seconds(Ewma(rec.persist_seconds(), ref.persist_seconds()));
  job->timings_dirty = true;
  if (observer_ != nullptr) observer_->OnShardReported(report);
  if (p.committing || p.shards.size() < job->world_size()) return false;
  p.committing = true;
  Effects::CommitTask task;
  task.job = job->name();
  task.step = step;
  task.world_size = job->world_size();
  for (const auto& [r, s] : p.shards) task.shards.push_back(s);
  task.last_report = now;
  task.stall = p.max_stall;
  task.persist = p.max_persist;
  fx->commits.push_back(std::move(task));
  return true;
}

absl::StatusOr<ckptd::v1::ReportShardResponse> CoordinatorCore::ReportShard(
    const ckptd::v1::ReportShardRequest& request) {
  CKPTD_RETURN_IF_ERROR(ValidateNodeId(request.node_id()));
  const bool single = request.has_report();
  if (!single && request.batch().empty()) return absl::InvalidArgumentError("the request reports no shard");
  if (request.batch_size() > static_cast<int>(kMaxRanksPerAgent)) {
    return absl::InvalidArgumentError(absl::StrCat("a batch of ", request.batch_size(), " shards; at most ",
                                                   kMaxRanksPerAgent));
  }
  if (single) CKPTD_RETURN_IF_ERROR(ValidateShardReport(request.report(), options_.max_world_size));
  std::vector<absl::Status> results;
  for (const ShardReport& r : request.batch()) results.push_back(ValidateShardReport(r, options_.max_world_size));
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
    auto it = agents_.find(request.node_id());
    if (it == agents_.end() || it->second->session != request.session()) {
      return absl::NotFoundError(
          absl::StrCat("node ", request.node_id(), " is not registered with this session; register again"));
    }
    if (single) accepted = AcceptShard(request.report(), single_check, &fx).status();
    for (int i = 0; i < request.batch_size(); ++i) {
      if (results[i].ok()) results[i] = AcceptShard(request.batch(i), checks[i], &fx).status();
    }
    SaveChangedJobs(&fx);
  }
  Apply(fx);  // commits the steps these reports completed
  CKPTD_RETURN_IF_ERROR(accepted);
  ckptd::v1::ReportShardResponse response;
  absl::MutexLock l(&mu_);
  auto committed = [this](const ShardReport& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Job* job = FindJob(r.job());
    return job != nullptr && job->committed.contains(r.step());
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
  auto it = job->pending.find(step);
  if (it != job->pending.end()) {
    if (it->second.committing) return;  // the commit decides
    job->pending.erase(it);
  }
  job->aborted[step] = Job::Aborted{job->incarnation(), why};
  while (job->aborted.size() > kMaxAbortedRemembered) job->aborted.erase(job->aborted.begin());
  job->record.set_checkpoints_aborted(job->record.checkpoints_aborted() + 1);
  ++counters_.aborted;
  job->dirty = true;
  fx->aborts.emplace_back(job->name(), step);
  fx->aborted_notes.emplace_back(job->name(), step, why);
}

void CoordinatorCore::RecordFailure(Job* job, const std::string& node, std::optional<uint32_t> rank,
                                    FailureKind kind, const std::string& detail, Effects* fx) {
  FailureEvent e;
  e.set_unix_nanos(absl::ToUnixNanos(clock_->Now()));
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
  if (job != nullptr && kind != ckptd::v1::PERSIST_FAILED && kind != ckptd::v1::SHARD_DAMAGED) Restart(job);
}

void CoordinatorCore::Restart(Job* job) {
  ckptd::v1::Schedule* s = job->record.mutable_schedule();
  if (s->state() == ckptd::v1::JOB_RESTARTING) return;
  s->set_state(ckptd::v1::JOB_RESTARTING);
  // One failure per restart, however many ranks it took down.
  job->record.set_failures(job->record.failures() + 1);
  job->failed_at = clock_->Now();
  // The ranks' progress reaches here a heartbeat or two late, and ranks go on
  // training until they hear of the failure: until the restore round starts,
  // later progress and commits raise it (OnHeartbeat, the commit).
  job->step_at_failure = job->NewestUsable().value_or(0);
  for (const auto& [r, rank] : job->ranks) job->step_at_failure = std::max(job->step_at_failure, rank.step);
  // Targets of manual checkpoints belong to the run that failed.
  s->clear_extra_steps();
  ChangeSchedule(job);
  job->round.reset();
  for (auto& [r, rank] : job->ranks) {
    rank.has_progress = false;
    rank.hung = false;
  }
}

absl::Status CoordinatorCore::ReportFailure(const ckptd::v1::ReportFailureRequest& request) {
  CKPTD_RETURN_IF_ERROR(ValidateNodeId(request.node_id()));
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  if (request.kind() != ckptd::v1::TRAINER_DIED && request.kind() != ckptd::v1::TRAINER_HUNG &&
      request.kind() != ckptd::v1::PERSIST_FAILED) {
    return absl::InvalidArgumentError(absl::StrCat("an agent cannot report failures of kind ",
                                                   ckptd::v1::FailureKind_Name(request.kind())));
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
      if (job->pending.contains(request.step()) || !job->committed.contains(request.step())) {
        AbortPending(job, request.step(), absl::StrCat("rank ", request.rank(), " could not persist it"), &fx);
      }
    }
    if (request.kind() == ckptd::v1::TRAINER_DIED) {
      auto r = job->ranks.find(request.rank());
      if (r != job->ranks.end() && r->second.node_id == request.node_id()) r->second.alive = false;
    }
    RecordFailure(job, request.node_id(), request.rank(), request.kind(), detail, &fx);
    SaveChangedJobs(&fx);
  }
  Apply(fx);
  return absl::OkStatus();
}

void CoordinatorCore::Quarantine(Job* job, uint64_t step, std::optional<uint32_t> rank, const std::string& reason,
                                 Effects* fx) {
  job->quarantined[step] = reason;
  ckptd::v1::QuarantinedStep q;
  q.set_job(job->name());
  q.set_step(step);
  q.set_reason(reason);
  q.set_unix_nanos(absl::ToUnixNanos(clock_->Now()));
  fx->quarantines.push_back(q);
  RecordFailure(job, "", rank, ckptd::v1::SHARD_DAMAGED, absl::StrCat("step ", step, ": ", reason), fx);
}

void CoordinatorCore::StartRestoreRound(Job* job, Effects* fx) {
  RestoreRound round;
  round.step = job->NewestUsable();
  // Work after the restored step is redone; what was pending of it is void
  // (aborted in the incarnation that wrote it).
  std::vector<uint64_t> stale;
  for (const auto& [step, p] : job->pending) {
    if (!round.step || step > *round.step) stale.push_back(step);
  }
  for (uint64_t step : stale) AbortPending(job, step, "the job restarted from an earlier step", fx);
  job->round = round;
  ckptd::v1::Schedule* s = job->record.mutable_schedule();
  // Every rank starts over from the plan's step with the schedule it fetches
  // then: the rule may count from the start again (same phase), so that a
  // restore to an older step is not left without checkpoints until the start
  // of an interval that the policy set ahead of the old run.
  if (s->every_steps() > 0) s->set_start_step(s->start_step() % s->every_steps());
  s->set_incarnation(s->incarnation() + 1);
  s->set_state(ckptd::v1::JOB_RUNNING);
  ChangeSchedule(job);
  for (auto& [r, rank] : job->ranks) {
    rank.has_progress = false;
    rank.hung = false;
  }
}

RestorePlanResponse CoordinatorCore::PlanFor(const Job& job) {
  RestorePlanResponse r;
  r.set_incarnation(job.incarnation());
  if (!job.round->step) {
    r.set_verdict(RestorePlanResponse::FRESH_START);
  } else {
    r.set_verdict(job.round->go ? RestorePlanResponse::GO : RestorePlanResponse::LOAD);
    r.set_step(*job.round->step);
  }
  return r;
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
    const bool fresh_round_needed =
        !job->round || (job->round->go && !request.has_attempt()) ||
        (!job->round->step && !request.has_attempt() && job->round->ok.contains(request.rank()));
    if (fresh_round_needed) StartRestoreRound(job, &fx);
    RestoreRound& round = *job->round;
    if (!round.step) {
      round.ok.insert(request.rank());  // remembers who started fresh in this round
      response = PlanFor(*job);
    } else if (!request.has_attempt() || request.attempt_step() != *round.step) {
      round.ok.erase(request.rank());
      response = PlanFor(*job);
    } else if (request.attempt_ok()) {
      round.ok.insert(request.rank());
      if (round.ok.size() == job->world_size()) round.go = true;
      response = PlanFor(*job);
      if (!round.go) response.set_verdict(RestorePlanResponse::WAIT);
    } else {
      // One damaged shard spoils the step for every rank: quarantine it and
      // send everyone to the step before.
      const uint64_t bad = *round.step;
      Quarantine(job, bad, request.rank(), absl::StrCat("rank ", request.rank(), ": ", request.problem()), &fx);
      // Same incarnation: nothing was written since the round began.
      job->round = RestoreRound();
      job->round->step = job->NewestUsable();
      response = PlanFor(*job);
    }
    SaveJob(job, &fx);
  }
  Apply(fx);
  return response;
}

absl::StatusOr<ckptd::v1::RequestCheckpointResponse> CoordinatorCore::RequestCheckpoint(
    const ckptd::v1::RequestCheckpointRequest& request) {
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  Effects fx;
  ckptd::v1::RequestCheckpointResponse response;
  {
    absl::MutexLock l(&mu_);
    Job* job = FindJob(request.job());
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", request.job()));
    if (job->record.schedule().state() != ckptd::v1::JOB_RUNNING) {
      return absl::FailedPreconditionError(absl::StrCat("job ", request.job(), " is restarting"));
    }
    uint64_t fastest = 0;
    bool any = false;
    for (const auto& [r, rank] : job->ranks) {
      if (!rank.alive) continue;
      any = true;
      fastest = std::max(fastest, rank.step);
    }
    if (!any) return absl::FailedPreconditionError(absl::StrCat("job ", request.job(), " has no live rank"));
    const uint64_t target = fastest + ManualLead(*job);
    auto* extras = job->record.mutable_schedule()->mutable_extra_steps();
    if (std::find(extras->begin(), extras->end(), target) == extras->end()) {
      extras->Add(target);
      // Only targets still ahead are worth keeping.
      std::vector<uint64_t> keep;
      for (uint64_t s : *extras) {
        if (s + 1000 > fastest && keep.size() < 64) keep.push_back(s);
      }
      extras->Assign(keep.begin(), keep.end());
      ChangeSchedule(job);
    }
    response.set_target_step(target);
    SaveJob(job, &fx);
  }
  Apply(fx);
  return response;
}

struct CoordinatorCore::IntervalView {
  ckptd::v1::IntervalStatus status;
  std::optional<policy::IntervalInputs> inputs;
  std::optional<policy::IntervalDecision> decision;
};

namespace {

// The median of the positive values (0 when there is none).
double MedianOfPositive(std::vector<double> v) {
  std::erase_if(v, [](double x) { return !(x > 0) || !std::isfinite(x); });
  return v.empty() ? 0 : policy::Median(std::move(v));
}

}  // namespace

CoordinatorCore::IntervalView CoordinatorCore::IntervalFor(const Job& job) const {
  IntervalView view;
  ckptd::v1::IntervalStatus& st = view.status;
  st.set_job(job.name());
  st.set_automatic(options_.interval_automatic);
  st.set_every_steps(job.record.schedule().every_steps());
  st.set_gpus(job.world_size());
  // The failure rate is the cluster's: every job's failures over every job's
  // GPU-hours.
  uint64_t failures = 0;
  double gpu_seconds = 0;
  for (const auto& [name, j] : jobs_) {
    failures += j->record.failures();
    gpu_seconds += j->record.gpu_seconds();
  }
  st.set_failures(failures);
  st.set_exposure_gpu_hours(gpu_seconds / 3600);
  st.set_prior_per_gpu_hour(options_.failure_prior.mean_per_gpu_hour);
  st.set_prior_shape(options_.failure_prior.shape);
  const policy::FailureRateEstimate rate = policy::EstimateFailureRate(
      options_.failure_prior, static_cast<int64_t>(failures), st.exposure_gpu_hours(), 0.9);
  st.set_rate_per_gpu_hour(rate.mean);
  st.set_rate_lower(rate.lower);
  st.set_rate_upper(rate.upper);
  st.set_credible(rate.credible);
  st.set_mtbf_seconds(policy::JobMtbfSeconds(rate.mean, static_cast<int>(job.world_size())));
  std::vector<double> idle, persisting;
  for (const auto& [r, rank] : job.ranks) {
    if (!rank.alive) continue;
    idle.push_back(rank.step_seconds_idle);
    persisting.push_back(rank.step_seconds_persisting);
  }
  const double step_idle = MedianOfPositive(idle);
  const double step_persisting = MedianOfPositive(persisting);
  st.set_step_seconds(step_idle > 0 ? step_idle : job.record.step_seconds());
  st.set_step_seconds_persisting(step_persisting);
  st.set_checkpoints_measured(static_cast<uint32_t>(job.stalls.size()));
  st.set_restarts_measured(static_cast<uint32_t>(job.restarts.size()));
  const double stall = job.stalls.empty() ? 0 : job.stalls.Median();
  const double persist = job.persists.empty() ? 0 : job.persists.Median();
  // Steps during a persist run slower by (1 - idle/persisting) of their time,
  // for as long as the persist lasts.
  const double slowdown =
      step_idle > 0 && step_persisting > step_idle ? persist * (1 - step_idle / step_persisting) : 0;
  st.set_stall_seconds(stall);
  st.set_persist_seconds(persist);
  st.set_slowdown_seconds(slowdown);
  // A cost measured as zero (a clock too coarse) is still a cost.
  st.set_cost_seconds(std::max(stall + slowdown, 1e-6));
  st.set_restart_assumed(job.restarts.empty());
  st.set_restart_seconds(job.restarts.empty() ? absl::ToDoubleSeconds(options_.restart_guess)
                                              : job.restarts.Median());
  st.set_min_interval_seconds(absl::ToDoubleSeconds(options_.min_interval));
  st.set_max_interval_seconds(absl::ToDoubleSeconds(options_.max_interval));
  st.set_alternative_seconds(absl::ToDoubleSeconds(options_.alternative_interval));
  if (!options_.interval_automatic) {
    st.set_reason(absl::StrCat("fixed interval of ", st.every_steps(), " steps (--every)"));
  }
  if (job.stalls.empty()) {
    st.set_waiting_for("a committed checkpoint, to measure its stall and persist time");
    return view;
  }
  if (st.step_seconds() <= 0) {
    st.set_waiting_for("step times from the ranks");
    return view;
  }
  policy::IntervalInputs in;
  in.mtbf_s = st.mtbf_seconds();
  in.delta_s = st.cost_seconds();
  in.persist_s = persist;
  in.restart_s = st.restart_seconds();
  in.step_s = st.step_seconds();
  in.min_interval_s = st.min_interval_seconds();
  in.max_interval_s = st.max_interval_seconds();
  in.alternative_s = st.alternative_seconds();
  absl::StatusOr<policy::IntervalDecision> d = policy::DecideInterval(in);
  if (!d.ok()) {
    st.set_waiting_for(std::string(d.status().message()));
    return view;
  }
  st.set_daly_seconds(d->daly_s);
  st.set_interval_seconds(d->interval_s);
  st.set_interval_steps(d->interval_steps);
  st.set_expected_waste(d->expected_waste);
  st.set_alternative_waste(d->alternative_waste);
  if (options_.interval_automatic) st.set_reason(d->reason);
  st.set_decided(true);
  view.inputs = in;
  view.decision = *std::move(d);
  return view;
}

void CoordinatorCore::DecideInterval(Job* job) {
  IntervalView v = IntervalFor(*job);
  if (!v.decision) return;
  const uint64_t current = job->record.schedule().every_steps();
  if (policy::ShouldChangeInterval(current, *v.decision, *v.inputs, options_.hysteresis)) {
    Reschedule(job, v.decision->interval_steps);
  }
}

void CoordinatorCore::Reschedule(Job* job, uint64_t every_steps) {
  ckptd::v1::Schedule* s = job->record.mutable_schedule();
  uint64_t fastest = 0;
  for (const auto& [r, rank] : job->ranks) fastest = std::max(fastest, rank.step);
  // The new rule starts where every rank has heard of it. Until then a rank
  // may still follow the old one, so the old rule's targets before that step
  // stay as one-off targets: every rank snapshots the same steps either way.
  const uint64_t start = fastest + ManualLead(*job);
  std::vector<uint64_t> extras;
  for (uint64_t e : s->extra_steps()) {
    if (e > fastest) extras.push_back(e);
  }
  if (s->every_steps() > 0) {
    const uint64_t every = s->every_steps();
    uint64_t next = fastest + 1;
    if (next < s->start_step()) {
      next = s->start_step();
    } else {
      next += (every - (next - s->start_step()) % every) % every;
    }
    for (; next < start && extras.size() < 64; next += every) {
      if (std::find(extras.begin(), extras.end(), next) == extras.end()) extras.push_back(next);
    }
  }
  s->mutable_extra_steps()->Assign(extras.begin(), extras.end());
  s->set_start_step(start);
  s->set_every_steps(every_steps);
  ChangeSchedule(job);
}

absl::StatusOr<ckptd::v1::IntervalStatus> CoordinatorCore::GetInterval(const ckptd::v1::GetIntervalRequest& request) {
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  absl::MutexLock l(&mu_);
  const Job* job = FindJob(request.job());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", request.job()));
  IntervalView v = IntervalFor(*job);
  if (job->last_decided != absl::Time()) {
    v.status.set_decided_unix_nanos(absl::ToUnixNanos(job->last_decided));
  }
  return v.status;
}

absl::StatusOr<ckptd::v1::ListStepsResponse> CoordinatorCore::ListSteps(const ckptd::v1::ListStepsRequest& request) {
  using ckptd::v1::StepEntry;
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  std::map<uint64_t, StepEntry> entries;
  bool known = false;
  {
    absl::MutexLock l(&mu_);
    if (const Job* job = FindJob(request.job())) {
      known = true;
      for (const auto& [step, p] : job->pending) {
        StepEntry& e = entries[step];
        e.set_step(step);
        e.set_state(ckptd::v1::STEP_PENDING);
        e.set_world_size(job->world_size());
        e.set_ranks_reported(static_cast<uint32_t>(p.shards.size()));
        e.set_first_report_unix_nanos(absl::ToUnixNanos(p.first_report));
      }
      for (const auto& [step, a] : job->aborted) {
        StepEntry& e = entries[step];
        e.set_step(step);
        e.set_state(ckptd::v1::STEP_ABORTED);
        e.set_world_size(job->world_size());
        e.set_reason(a.reason);
      }
    }
  }
  // Storage is read without the lock: manifests of many steps.
  absl::StatusOr<std::vector<storage::StepInfo>> stored = store_->ListSteps(request.job());
  if (absl::IsNotFound(stored.status())) {
    if (!known) return absl::NotFoundError(absl::StrCat("no job ", request.job()));
    stored = std::vector<storage::StepInfo>();
  }
  CKPTD_RETURN_IF_ERROR(stored.status());
  for (const storage::StepInfo& s : *stored) {
    StepEntry& e = entries[s.step];
    e.set_step(s.step);
    if (s.state == storage::StepState::kCommitted) {
      const ckptd::v1::StepManifest& m = *s.manifest;
      e.set_state(s.quarantined ? ckptd::v1::STEP_QUARANTINED : ckptd::v1::STEP_COMMITTED);
      e.set_reason(s.quarantined.value_or(""));
      e.set_world_size(m.world_size());
      e.set_ranks_reported(static_cast<uint32_t>(m.shards_size()));
      e.set_committed_unix_nanos(m.committed_unix_nanos());
      uint64_t raw = 0, stored_bytes = 0;
      double persist = 0;
      for (const ckptd::v1::ShardRef& r : m.shards()) {
        raw += r.raw_bytes();
        stored_bytes += r.stored_bytes();
        persist = std::max(persist, r.persist_seconds());
      }
      e.set_raw_bytes(raw);
      e.set_stored_bytes(stored_bytes);
      e.set_persist_seconds(persist);
    } else if (e.state() == ckptd::v1::STEP_STATE_UNSPECIFIED) {
      // Files without a MANIFEST that nobody here is waiting for.
      e.set_state(ckptd::v1::STEP_INCOMPLETE);
      if (s.state == storage::StepState::kCorrupt) e.set_reason(s.detail);
    }
  }
  ckptd::v1::ListStepsResponse response;
  for (auto& [step, e] : entries) *response.add_steps() = std::move(e);
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
  p.set_state(job->record.schedule().state());
  p.set_incarnation(job->incarnation());
  const std::optional<uint64_t> newest = job->NewestUsable();
  for (const auto& [step, why] : job->quarantined) {
    if (newest && step < *newest) continue;
    ckptd::v1::StepEntry* e = p.add_passed_over();
    e->set_step(step);
    e->set_state(ckptd::v1::STEP_QUARANTINED);
    e->set_reason(absl::StrCat("quarantined: ", why));
  }
  for (const auto& [step, pending] : job->pending) {
    if (newest && step < *newest) continue;
    ckptd::v1::StepEntry* e = p.add_passed_over();
    e->set_step(step);
    e->set_state(ckptd::v1::STEP_PENDING);
    e->set_world_size(job->world_size());
    e->set_ranks_reported(static_cast<uint32_t>(pending.shards.size()));
    e->set_reason(absl::StrCat("not committed: ", pending.shards.size(), " of ", job->world_size(),
                               " ranks durable"));
  }
  std::sort(p.mutable_passed_over()->begin(), p.mutable_passed_over()->end(),
            [](const ckptd::v1::StepEntry& a, const ckptd::v1::StepEntry& b) { return a.step() > b.step(); });
  if (!newest) {
    p.set_fresh_start(true);
    p.set_reason(job->committed.empty() ? "no step of the job is committed: every rank starts fresh"
                                        : "every committed step is quarantined: every rank starts fresh");
    return p;
  }
  p.set_step(*newest);
  p.set_reason(absl::StrCat(
      "step ", *newest, " is the newest committed step that is not quarantined; every rank loads it and checks ",
      "its shard, and a damaged shard quarantines it and sends every rank to the committed step before"));
  return p;
}

absl::StatusOr<ckptd::v1::VerifyProgress> CoordinatorCore::VerifyStep(
    const ckptd::v1::VerifyStepRequest& request, const std::function<void(const ckptd::v1::VerifyProgress&)>& progress) {
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  uint64_t step = request.step();
  {
    absl::MutexLock l(&mu_);
    const Job* job = FindJob(request.job());
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", request.job()));
    if (request.has_step()) {
      if (!job->committed.contains(step)) {
        return absl::FailedPreconditionError(
            absl::StrCat("step ", step, " of job ", request.job(), " is not committed"));
      }
    } else {
      std::optional<uint64_t> newest = job->NewestUsable();
      if (!newest) return absl::FailedPreconditionError(absl::StrCat("job ", request.job(), " has no committed step"));
      step = *newest;
    }
    ++FindJob(request.job())->verifying[step];
  }
  // Unpinned however the verification ends.
  struct Unpin {
    CoordinatorCore* core;
    const std::string& job;
    uint64_t step;
    ~Unpin() {
      absl::MutexLock l(&core->mu_);
      if (Job* j = core->FindJob(job); j != nullptr && --j->verifying[step] <= 0) j->verifying.erase(step);
    }
  } unpin{this, request.job(), step};
  auto to_proto = [](const storage::StepVerifyReport& r) {
    ckptd::v1::VerifyProgress p;
    p.set_step(r.step);
    p.set_shards_total(static_cast<uint32_t>(r.shards_total));
    p.set_shards_done(static_cast<uint32_t>(r.shards));
    p.set_bytes_total(r.bytes_total);
    p.set_bytes_done(r.bytes_done);
    return p;
  };
  storage::ShardReadOptions ro;
  ro.threads = 2;  // beside the coordinator's own work
  absl::StatusOr<storage::StepVerifyReport> report = store_->VerifyStep(
      request.job(), step, ro, [&](const storage::StepVerifyReport& r) {
        if (progress) progress(to_proto(r));
      });
  CKPTD_RETURN_IF_ERROR(report.status());
  ckptd::v1::VerifyProgress done = to_proto(*report);
  done.set_done(true);
  done.set_ok(report->ok());
  for (const storage::VerifyProblem& p : report->problems) done.add_problems(p.message);
  if (!report->ok()) {
    Effects fx;
    {
      absl::MutexLock l(&mu_);
      Job* job = FindJob(request.job());
      if (job != nullptr && job->committed.contains(step) && !job->quarantined.contains(step)) {
        Quarantine(job, step, std::nullopt, absl::StrCat("verification: ", report->problems[0].message), &fx);
        job->dirty = true;
        SaveJob(job, &fx);
      }
    }
    Apply(fx);
  }
  return done;
}

absl::StatusOr<ckptd::v1::RunDrillResponse> CoordinatorCore::RunDrill(const ckptd::v1::RunDrillRequest& request) {
  using ckptd::v1::DrillScenario;
  const DrillScenario scenario = request.scenario();
  if (scenario == ckptd::v1::DRILL_SCENARIO_UNSPECIFIED || !ckptd::v1::DrillScenario_IsValid(scenario)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown drill scenario ", static_cast<int>(scenario)));
  }
  const std::string name = ckptd::v1::DrillScenario_Name(scenario);
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  const bool timed = scenario == ckptd::v1::HANG_TRAINER || scenario == ckptd::v1::CUT_OFF_AGENT ||
                     scenario == ckptd::v1::STORAGE_EIO || scenario == ckptd::v1::STORAGE_ENOSPC ||
                     scenario == ckptd::v1::STORAGE_SLOW;
  const double duration = request.duration_seconds();
  if (timed && !(duration > 0 && duration <= 3600)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " needs a duration in (0 s, 1 h]; got ", duration, " s"));
  }
  if (scenario == ckptd::v1::STORAGE_SLOW && !(request.slow_seconds() > 0 && request.slow_seconds() <= 60)) {
    return absl::InvalidArgumentError(
        absl::StrCat("STORAGE_SLOW needs a delay per operation in (0 s, 60 s]; got ", request.slow_seconds(), " s"));
  }
  if (request.at_step() > kMaxStep) return absl::InvalidArgumentError("the drill's step is out of range");
  const bool node_scenario = scenario == ckptd::v1::KILL_AGENT || scenario == ckptd::v1::KILL_NODE ||
                             scenario == ckptd::v1::CUT_OFF_AGENT ||
                             scenario == ckptd::v1::STORAGE_EIO || scenario == ckptd::v1::STORAGE_ENOSPC ||
                             scenario == ckptd::v1::STORAGE_SLOW;
  if (!request.target_node().empty()) {
    CKPTD_RETURN_IF_ERROR(ValidateNodeId(request.target_node()));
    if (!node_scenario) {
      return absl::InvalidArgumentError(absl::StrCat(name, " targets a rank, not a node"));
    }
  }
  absl::MutexLock l(&mu_);
  Job* job = FindJob(request.job());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", request.job()));
  std::string node = request.target_node();
  if (node.empty()) {
    if (request.rank() >= job->world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", request.rank(), " is not inside world size ", job->world_size()));
    }
    auto r = job->ranks.find(request.rank());
    if (r == job->ranks.end() || !r->second.alive) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", request.rank(), " of job ", request.job(), " is not running on any node"));
    }
    node = r->second.node_id;
  }
  auto a = agents_.find(node);
  if (a == agents_.end() || !a->second->alive) {
    return absl::FailedPreconditionError(absl::StrCat("node ", node, " has no live agent"));
  }
  ckptd::v1::RunDrillRequest order = request;
  if (!request.target_node().empty()) {
    // The agent watches a rank of the job on its node for at_step: the
    // lowest one it hosts.
    std::optional<uint32_t> hosted;
    for (const auto& [r, rank] : job->ranks) {
      if (rank.alive && rank.node_id == node) {
        hosted = r;
        break;
      }
    }
    if (hosted) {
      order.set_rank(*hosted);
    } else if (request.at_step() > 0) {
      return absl::FailedPreconditionError(absl::StrCat("node ", node, " hosts no rank of job ", request.job(),
                                                        ": a drill at a step needs one there to watch"));
    }
  }
  if (!a->second->drills_allowed) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", node, "'s agent was not started with --allow-drills"));
  }
  const uint64_t id = next_drill_id_++;
  Drill& d = drills_[id];
  d.request = order;
  d.node = node;
  d.ordered = clock_->Now();
  d.newest_at_order = job->NewestUsable();
  while (drills_.size() > 256) drills_.erase(drills_.begin());
  ckptd::v1::RunDrillResponse response;
  response.set_drill_id(id);
  response.set_node_id(node);
  return response;
}

absl::StatusOr<ckptd::v1::DrillStatus> CoordinatorCore::GetDrill(const ckptd::v1::GetDrillRequest& request) {
  ckptd::v1::DrillStatus st;
  {
    absl::MutexLock l(&mu_);
    auto d = drills_.find(request.drill_id());
    if (d == drills_.end()) return absl::NotFoundError(absl::StrCat("no drill ", request.drill_id()));
    const Drill& drill = d->second;
    *st.mutable_request() = drill.request;
    st.set_drill_id(d->first);
    st.set_node_id(drill.node);
    st.set_ordered_unix_nanos(absl::ToUnixNanos(drill.ordered));
    if (drill.report) *st.mutable_report() = *drill.report;
    st.set_had_committed_at_order(drill.newest_at_order.has_value());
    st.set_newest_committed_at_order(drill.newest_at_order.value_or(0));
    if (const Job* job = FindJob(drill.request.job())) {
      st.set_step_seconds(job->record.step_seconds());
      for (const Job::Resume& r : job->resumes) {
        if (r.failed < drill.ordered) continue;
        st.set_resumed(true);
        st.set_fresh_start(!r.restored.has_value());
        st.set_restored_step(r.restored.value_or(0));
        st.set_step_at_failure(r.step_at_failure);
        st.set_failed_unix_nanos(absl::ToUnixNanos(r.failed));
        st.set_resumed_unix_nanos(absl::ToUnixNanos(r.resumed));
        break;
      }
    }
  }
  // The history is in the state store, read without the lock.
  CKPTD_ASSIGN_OR_RETURN(std::vector<FailureEvent> events, state_->ListEvents("", options_.max_events_listed));
  std::vector<FailureEvent> since;
  for (FailureEvent& e : events) {
    if (e.unix_nanos() < st.ordered_unix_nanos()) continue;
    if (e.job() != st.request().job() && e.node_id() != st.node_id()) continue;
    since.push_back(std::move(e));
  }
  std::sort(since.begin(), since.end(),
            [](const FailureEvent& a, const FailureEvent& b) { return a.unix_nanos() < b.unix_nanos(); });
  if (!since.empty()) st.set_first_detection_unix_nanos(since.front().unix_nanos());
  for (FailureEvent& e : since) *st.add_events() = std::move(e);
  return st;
}

void CoordinatorCore::SaveJob(Job* job, Effects* fx) {
  const absl::Time now = clock_->Now();
  if (!job->dirty && !(job->timings_dirty && now - job->last_saved >= kTimingsSaveInterval)) return;
  job->dirty = false;
  job->timings_dirty = false;
  job->last_saved = now;
  job->record.set_updated_unix_nanos(absl::ToUnixNanos(now));
  fx->records.push_back(job->record);
}

void CoordinatorCore::SaveChangedJobs(Effects* fx) {
  for (auto& [name, job] : jobs_) {
    if (job->dirty) SaveJob(job.get(), fx);
  }
}

void CoordinatorCore::LoseAgent(Agent* agent, const std::string& detail, Effects* fx) {
  const std::string& node = agent->node_id;
  agent->alive = false;
  std::set<std::string> affected;
  for (const auto& r : agent->ranks) affected.insert(r.job());
  for (const auto& r : agent->ranks) {
    if (Job* job = FindJob(r.job())) {
      auto rit = job->ranks.find(r.rank());
      if (rit != job->ranks.end() && rit->second.node_id == node) rit->second.alive = false;
    }
  }
  if (affected.empty()) RecordFailure(nullptr, node, std::nullopt, ckptd::v1::NODE_LOST, detail, fx);
  for (const std::string& name : affected) {
    RecordFailure(FindJob(name), node, std::nullopt, ckptd::v1::NODE_LOST, detail, fx);
  }
}

void CoordinatorCore::Tick() {
  Effects fx;
  {
    absl::MutexLock l(&mu_);
    const absl::Time now = clock_->Now();
    const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - last_tick_));
    last_tick_ = now;
    for (auto& [node, agent] : agents_) {
      if (!agent->alive || now - agent->last_heartbeat <= options_.node_lost_after) continue;
      LoseAgent(agent.get(), absl::StrCat("no heartbeat for ", absl::FormatDuration(now - agent->last_heartbeat)),
                &fx);
    }
    for (auto& [name, job] : jobs_) {
      uint32_t alive = 0;
      for (auto& [r, rank] : job->ranks) {
        if (!rank.alive) continue;
        ++alive;
        if (!rank.has_progress || rank.hung || job->record.schedule().state() != ckptd::v1::JOB_RUNNING) continue;
        // A rank whose agent has gone quiet is no news of a hang: the node
        // may be lost, which the heartbeat check above decides.
        auto agent = agents_.find(rank.node_id);
        if (agent == agents_.end() || now - agent->second->last_heartbeat > 2 * options_.heartbeat_interval) continue;
        const double typical = std::max(rank.step_seconds, job->record.step_seconds());
        const absl::Duration limit =
            std::max(options_.hang_floor, absl::Seconds(options_.hang_multiple * typical));
        if (now - rank.last_progress > limit) {
          rank.hung = true;
          RecordFailure(job.get(), rank.node_id, r, ckptd::v1::TRAINER_HUNG,
                        absl::StrCat("no step past ", rank.step, " for ", absl::FormatDuration(now - rank.last_progress)),
                        &fx);
        }
      }
      if (job->record.schedule().state() == ckptd::v1::JOB_RUNNING && alive > 0) {
        job->record.set_gpu_seconds(job->record.gpu_seconds() + alive * elapsed);
      }
      std::vector<uint64_t> late;
      for (const auto& [step, p] : job->pending) {
        if (!p.committing && now - p.first_report > options_.step_deadline) late.push_back(step);
      }
      for (uint64_t step : late) {
        AbortPending(job.get(), step,
                     absl::StrCat("only ", job->pending[step].shards.size(), " of ", job->world_size(),
                                  " shards within ", absl::FormatDuration(options_.step_deadline)),
                     &fx);
      }
      job->timings_dirty |= elapsed > 0 && alive > 0;
      job->dirty |= std::exchange(job->save_at_tick, false);
      if (options_.interval_automatic && job->record.schedule().state() == ckptd::v1::JOB_RUNNING && alive > 0 &&
          now - job->last_decided >= options_.decide_every) {
        job->last_decided = now;
        DecideInterval(job.get());
      }
      SaveJob(job.get(), &fx);
    }
  }
  Apply(fx);
  if (options_.retention_in_tick) RunRetention();
}

void CoordinatorCore::RunRetention() {
  std::vector<std::pair<std::string, uint64_t>> queue;
  {
    absl::MutexLock l(&mu_);
    queue.swap(retention_queue_);
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
  for (const auto& [job, step] : queue) {
    if (absl::Status s = store_->RemoveStep(job, step, &pacing); !s.ok() && !absl::IsNotFound(s)) {
      std::cerr << "ckptd-coordinator: retention of " << job << " step " << step << ": " << s << "\n";
    }
  }
}

absl::Status CoordinatorCore::CheckShardFile(const ShardReport& report) {
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
  // Each file was checked as it was reported (CheckShardFile).
  absl::StatusOr<ckptd::v1::StepManifest> m =
      store_->CommitStep(job, step, world_size, &shards, storage::CheckpointStore::CommitCheck::kCheckedByCaller);
  if (absl::IsAlreadyExists(m.status())) return absl::OkStatus();
  return m.status();
}

void CoordinatorCore::Apply(Effects& fx) {
  while (!fx.empty()) {
    Effects next;
    for (const auto& q : fx.quarantines) {
      {
        // Marked in storage too, so that every reader (ckptctl, an agent
        // committing alone) sees it. Best effort: the database has it.
        absl::MutexLock l(&commit_mu_);
        if (absl::Status s = store_->QuarantineStep(q.job(), q.step(), q.reason()); !s.ok()) {
          std::cerr << "ckptd-coordinator: marking " << q.job() << " step " << q.step() << " quarantined: " << s
                    << "\n";
        }
      }
      if (absl::Status s = state_->PutQuarantine(q); !s.ok()) {
        std::cerr << "ckptd-coordinator: recording quarantine of " << q.job() << " step " << q.step() << ": " << s
                  << "\n";
      }
    }
    for (const FailureEvent& e : fx.events) {
      if (observer_ != nullptr) observer_->OnFailure(e);
      if (absl::Status s = state_->AppendEvent(e); !s.ok()) {
        std::cerr << "ckptd-coordinator: recording failure event: " << s << "\n";
      }
    }
    for (const auto& [job, step, why] : fx.aborted_notes) {
      if (observer_ != nullptr) observer_->OnAborted(job, step, why);
    }
    for (const auto& [job, step] : fx.aborts) {
      absl::MutexLock l(&commit_mu_);
      absl::Status s = store_->AbortStep(job, step);
      // Already gone, or committed after all: nothing to clean.
      if (!s.ok() && !absl::IsNotFound(s) && !absl::IsFailedPrecondition(s)) {
        std::cerr << "ckptd-coordinator: removing aborted step " << step << " of " << job << ": " << s << "\n";
      }
    }
    for (Effects::CommitTask& task : fx.commits) {
      const absl::Status s = Commit(task.job, task.step, task.world_size, task.shards);
      const absl::Duration latency = clock_->Now() - task.last_report;
      absl::MutexLock l(&mu_);
      Job* job = FindJob(task.job);
      if (job == nullptr) continue;
      auto pit = job->pending.find(task.step);
      if (pit != job->pending.end()) pit->second.committing = false;
      if (!s.ok()) {
        std::cerr << "ckptd-coordinator: commit of " << task.job << " step " << task.step << " failed: " << s << "\n";
        AbortPending(job, task.step, std::string(s.message()), &next);
        continue;
      }
      job->pending.erase(task.step);
      job->committed.insert(task.step);
      if (job->failed_at && !job->round) job->step_at_failure = std::max(job->step_at_failure, task.step);
      job->stalls.Push(task.stall);
      job->persists.Push(task.persist);
      job->record.set_checkpoints_committed(job->record.checkpoints_committed() + 1);
      ++counters_.committed;
      job->dirty = true;
      if (observer_ != nullptr) observer_->OnCommitted(task.job, task.step, latency);
      // Older steps still pending will never be needed.
      std::vector<uint64_t> older;
      for (const auto& [step, p] : job->pending) {
        if (step < task.step) older.push_back(step);
      }
      for (uint64_t step : older) AbortPending(job, step, absl::StrCat("step ", task.step, " committed first"), &next);
      // Retention: keep the newest keep_last usable steps; quarantined ones stay.
      int kept = 0;
      std::vector<uint64_t> drop;
      for (auto it = job->committed.rbegin(); it != job->committed.rend(); ++it) {
        if (job->quarantined.contains(*it)) continue;
        if (kept < std::max(1, options_.keep_last)) {
          ++kept;
        } else if (!job->verifying.contains(*it)) {
          drop.push_back(*it);
        }
      }
      for (uint64_t step : drop) {
        job->committed.erase(step);
        next.removals.emplace_back(task.job, step);
      }
      job->save_at_tick = true;
    }
    if (!fx.removals.empty()) {
      // Removing thousands of files must not delay the answer to the report
      // that completed a step: Tick() does it.
      absl::MutexLock l(&mu_);
      retention_queue_.insert(retention_queue_.end(), fx.removals.begin(), fx.removals.end());
    }
    for (const JobRecord& r : fx.records) {
      if (absl::Status s = state_->PutJob(r); !s.ok()) {
        std::cerr << "ckptd-coordinator: saving job " << r.job() << ": " << s << "\n";
      }
    }
    fx = std::move(next);
  }
}

ckptd::v1::JobStatus CoordinatorCore::StatusOf(const Job& job) const {
  ckptd::v1::JobStatus s;
  s.set_job(job.name());
  s.set_world_size(job.world_size());
  s.set_state(job.record.schedule().state());
  *s.mutable_schedule() = job.record.schedule();
  if (std::optional<uint64_t> newest = job.NewestUsable()) {
    s.set_has_committed(true);
    s.set_newest_committed_step(*newest);
  }
  uint64_t fastest = 0, slowest = UINT64_MAX;
  uint32_t alive = 0;
  for (const auto& [r, rank] : job.ranks) {
    if (!rank.alive) continue;
    ++alive;
    fastest = std::max(fastest, rank.step);
    slowest = std::min(slowest, rank.step);
  }
  s.set_fastest_step(fastest);
  s.set_slowest_step(alive == 0 ? 0 : slowest);
  s.set_ranks_alive(alive);
  s.set_checkpoints_committed(job.record.checkpoints_committed());
  s.set_checkpoints_aborted(job.record.checkpoints_aborted());
  for (const auto& [step, p] : job.pending) s.add_pending_steps(step);
  for (const auto& [q, why] : job.quarantined) s.add_quarantined_steps(q);
  s.set_step_seconds(job.record.step_seconds());
  return s;
}

ckptd::v1::GetClusterStatusResponse CoordinatorCore::ClusterStatus() {
  ckptd::v1::GetClusterStatusResponse r;
  absl::MutexLock l(&mu_);
  for (const auto& [node, agent] : agents_) {
    ckptd::v1::AgentStatus* a = r.add_agents();
    a->set_node_id(node);
    a->set_address(agent->address);
    a->set_alive(agent->alive);
    a->set_last_heartbeat_unix_nanos(absl::ToUnixNanos(agent->last_heartbeat));
    for (const auto& rank : agent->ranks) *a->add_ranks() = rank;
    for (const auto& g : agent->gpus) a->add_gpus(g);
  }
  for (const auto& [name, job] : jobs_) *r.add_jobs() = StatusOf(*job);
  return r;
}

absl::StatusOr<ckptd::v1::ListEventsResponse> CoordinatorCore::ListEvents(const ckptd::v1::ListEventsRequest& request) {
  if (!request.job().empty()) CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  const size_t limit = request.limit() == 0 ? 100 : std::min<size_t>(request.limit(), options_.max_events_listed);
  CKPTD_ASSIGN_OR_RETURN(std::vector<FailureEvent> events, state_->ListEvents(request.job(), limit));
  ckptd::v1::ListEventsResponse r;
  for (FailureEvent& e : events) *r.add_events() = std::move(e);
  return r;
}

CoordinatorCounters CoordinatorCore::Counters() {
  absl::MutexLock l(&mu_);
  return counters_;
}

}  // namespace ckptd::coordinator
