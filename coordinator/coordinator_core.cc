// CoordinatorCore: construction and recovery, agent registration and
// membership, failure detection (Tick), saving job records, and the status
// an operator reads. The other concerns are in coordinator_*.cc beside it.
#include "coordinator/coordinator_core.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/random.h"
#include "base/status_macros.h"
#include "coordinator/coordinator_core_internal.h"
#include "coordinator/reshard_layouts.h"
#include "coordinator/drill_book.h"
#include "coordinator/job.h"
#include "storage/layout.h"

namespace ckptd::coordinator {

using ckptd::v1::FailureEvent;
using ckptd::v1::JobRecord;
using ckptd::v1::ShardReport;
using internal::kMaxIncarnation;
using internal::kMaxRanksPerAgent;
using internal::kMaxReportedSeconds;
using internal::kMaxShardBytes;
using internal::kMaxStep;

namespace internal {

absl::Status ValidateRankInfo(const ckptd::v1::RankInfo& r, uint32_t max_world) {
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(r.job()));
  if (r.world_size() == 0 || r.world_size() > max_world) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", r.job(), ": world size ", r.world_size(), " is outside 1..", max_world));
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
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": world size ", r.world_size(), " is outside 1..", max_world));
  }
  if (r.shard().rank() >= r.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", r.shard().rank(), " is not inside world size ", r.world_size()));
  }
  if (r.step() > kMaxStep) return absl::InvalidArgumentError(absl::StrCat(what, ": step is out of range"));
  if (r.shard().file_length() == 0 || r.shard().file_length() > kMaxShardBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shard length ", r.shard().file_length(), " is out of range"));
  }
  if (r.incarnation() > kMaxIncarnation) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": incarnation ", r.incarnation(), " is out of range (at most ", kMaxIncarnation, ")"));
  }
  const std::pair<const char*, double> timings[] = {{"stall_seconds", r.stall_seconds()},
                                                    {"persist_seconds", r.shard().persist_seconds()}};
  for (const auto& [name, v] : timings) {
    if (!std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", name, " ", v, " is not a duration"));
    }
    if (v > kMaxReportedSeconds) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", name, " ", v, " is above ", kMaxReportedSeconds, " (a day): no measurement"));
    }
  }
  return absl::OkStatus();
}

}  // namespace internal

absl::Status ValidateNodeId(absl::string_view node_id) {
  absl::Status s = storage::ValidateJobName(node_id);
  if (s.ok()) return s;
  std::string message(s.message());
  if (absl::StartsWith(message, "job name")) message.replace(0, 8, "node id");
  return absl::InvalidArgumentError(message);
}

CoordinatorCore::CoordinatorCore(storage::CheckpointStore* store, StateStore* state, base::Clock* clock,
                                 CoordinatorOptions options, CoordinatorObserver* observer)
    : store_(store),
      state_(state),
      clock_(clock),
      options_(std::move(options)),
      observer_(observer),
      // Drill ids new to every agent: after a restart or a change of leader
      // too (DrillBook).
      drills_(std::make_unique<internal::DrillBook>(
          (static_cast<uint64_t>(std::max<int64_t>(0, absl::ToUnixSeconds(clock->Now()))) << 20) + 1)),
      reshard_layouts_(std::make_unique<internal::ReshardLayouts>(store, /*keep=*/4, /*readers=*/8)) {
  last_tick_ = clock_->Now();
}

CoordinatorCore::~CoordinatorCore() = default;

absl::Status CoordinatorCore::Recover() {
  CKPTD_ASSIGN_OR_RETURN(std::vector<JobRecord> records, state_->ListJobs());
  absl::StatusOr<std::vector<std::string>> listed = store_->ListJobs();
  if (!listed.ok() && !absl::IsNotFound(listed.status())) return listed.status();
  const std::vector<std::string> stored_jobs = listed.ok() ? *listed : std::vector<std::string>();
  CKPTD_ASSIGN_OR_RETURN(std::vector<ckptd::v1::CommitIntent> intents, state_->ListCommitIntents());
  {
    // Another leader's commits that may still land (a committed step's files
    // are never removed by an abort anyway).
    absl::MutexLock l(&commit_mu_);
    for (const ckptd::v1::CommitIntent& c : intents) foreign_intents_[c.job()] = ForeignIntent{c.step()};
  }
  absl::MutexLock l(&mu_);
  for (const JobRecord& r : records) {
    if (!storage::ValidateJobName(r.job()).ok() || r.world_size() == 0) continue;
    if (r.schedule().incarnation() > kMaxIncarnation) {
      // Saved before reports' incarnations were bounded: the job is found
      // again from storage, and takes its ranks' count from their reports.
      logger_->Warning(absl::StrCat("job ", r.job(), ": the saved record's incarnation ", r.schedule().incarnation(),
                                    " is above ", kMaxIncarnation, "; not used"));
      continue;
    }
    jobs_[r.job()] = Job::Recovered(r);
  }
  for (const std::string& name : stored_jobs) {
    CKPTD_ASSIGN_OR_RETURN(std::vector<storage::StepInfo> steps, store_->ListSteps(name));
    Job* job = FindJob(name);
    for (const storage::StepInfo& s : steps) {
      if (s.state != storage::StepState::kCommitted) continue;
      if (job == nullptr) {
        std::unique_ptr<Job> found =
            Job::Discovered(name, s.manifest->world_size(), options_.every_steps, options_.durable_every);
        job = found.get();
        jobs_[name] = std::move(found);
      }
      job->RecoverCommitted(s.step, s.manifest->shards());
      job->NoteCommitTime(absl::FromUnixNanos(s.manifest->committed_unix_nanos()));
      if (s.quarantined) job->Quarantine(s.step, *s.quarantined);
    }
    if (job == nullptr) continue;
    // The operator's choice to start fresh over damaged steps (a choice that
    // cannot be read allows nothing).
    absl::StatusOr<std::optional<uint64_t>> allowed = store_->FreshStartAllowedOver(name);
    if (allowed.ok() && *allowed) job->AllowFreshStartOver(**allowed);
  }
  // Drills a previous coordinator ordered: their agents' reports still
  // count, and orders not carried out yet are sent again.
  CKPTD_ASSIGN_OR_RETURN(std::vector<ckptd::v1::DrillRecord> drills, state_->ListDrills());
  drills_->Restore(drills);
  for (auto& [name, job] : jobs_) {
    job->EndRoundTakenOverIfPast();
    job->set_last_alive(clock_->Now());  // its ranks get forget_after to come back
    CKPTD_ASSIGN_OR_RETURN(std::vector<ckptd::v1::QuarantinedStep> q, state_->ListQuarantined(name));
    for (const auto& step : q) job->Quarantine(step.step(), step.reason());
  }
  return absl::OkStatus();
}

absl::StatusOr<CoordinatorCore::Agent*> CoordinatorCore::AgentInSession(const std::string& node,
                                                                        const std::string& session) {
  auto it = agents_.find(node);
  if (it == agents_.end() || !it->second->alive || session.empty() ||
      !base::ConstantTimeEquals(session, it->second->session)) {
    return absl::NotFoundError(absl::StrCat("node ", node, " is not registered with this session; register again"));
  }
  return it->second.get();
}

absl::Status CoordinatorCore::CheckSpeaksFor(const Job& job, uint32_t rank, const std::string& node,
                                             bool moving) const {
  auto it = job.ranks().find(rank);
  if (it == job.ranks().end() || it->second.node_id == node) return absl::OkStatus();
  const std::string& host = it->second.node_id;
  if (moving) {
    // A dead rank may restart on any node: launchers (torchrun among them)
    // do not keep a rank on its node across restarts.
    auto agent = agents_.find(host);
    if (!it->second.alive || agent == agents_.end() || !agent->second->alive) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat("rank ", rank, " of job ", job.name(), " runs on node ", host,
                                                  ", not on node ", node, ": a node speaks only for its own ranks"));
}

CoordinatorCore::Job* CoordinatorCore::FindJob(const std::string& name) {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : it->second.get();
}

absl::StatusOr<CoordinatorCore::Job*> CoordinatorCore::JobFor(const std::string& name, uint32_t world_size) {
  if (Job* job = FindJob(name)) {
    CKPTD_RETURN_IF_ERROR(job->Resize(world_size));
    return job;
  }
  if (jobs_.size() >= options_.max_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat("job ", name, " is one too many: this coordinator tracks ",
                                                     jobs_.size(), " jobs, its limit (--max-jobs)"));
  }
  std::unique_ptr<Job> fresh = Job::Create(name, world_size, options_.every_steps, options_.durable_every);
  fresh->set_last_alive(clock_->Now());
  Job* job = fresh.get();
  jobs_[name] = std::move(fresh);
  return job;
}

absl::StatusOr<CoordinatorCore::Job*> CoordinatorCore::JobForRank(const std::string& name, uint32_t world_size,
                                                                  uint32_t rank, const std::string& node) {
  if (const Job* job = FindJob(name)) CKPTD_RETURN_IF_ERROR(CheckSpeaksFor(*job, rank, node, /*moving=*/true));
  return JobFor(name, world_size);
}

absl::StatusOr<ckptd::v1::RegisterAgentResponse> CoordinatorCore::RegisterAgent(
    const ckptd::v1::RegisterAgentRequest& request, absl::string_view from, PreviousRegistration* previous) {
  const std::string& node = request.node_id();
  CKPTD_RETURN_IF_ERROR(ValidateNodeId(node));
  if (request.address().size() > internal::kMaxAgentAddress) {
    return absl::InvalidArgumentError(absl::StrCat("node ", node, ": address is ", request.address().size(),
                                                   " bytes; at most ", internal::kMaxAgentAddress));
  }
  if (request.gpus_size() > static_cast<int>(internal::kMaxGpus)) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", node, " registers ", request.gpus_size(), " gpus; at most ", internal::kMaxGpus));
  }
  for (int i = 0; i < request.gpus_size(); ++i) {
    if (request.gpus(i).size() > internal::kMaxGpuName) {
      return absl::InvalidArgumentError(absl::StrCat("node ", node, ": gpus[", i, "] is ", request.gpus(i).size(),
                                                     " bytes; at most ", internal::kMaxGpuName));
    }
  }
  if (request.ranks_size() > static_cast<int>(kMaxRanksPerAgent)) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", node, " registers ", request.ranks_size(), " ranks; at most ", kMaxRanksPerAgent));
  }
  // The world size of each job the ranks name: one per job, or registering
  // one rank would resize the job under another.
  std::map<std::string, uint32_t> worlds;
  for (const auto& r : request.ranks()) {
    CKPTD_RETURN_IF_ERROR(internal::ValidateRankInfo(r, options_.max_world_size));
    auto [it, fresh] = worlds.emplace(r.job(), r.world_size());
    if (!fresh && it->second != r.world_size()) {
      return absl::InvalidArgumentError(absl::StrCat("node ", node, " registers ranks of job ", r.job(),
                                                     " in world sizes ", it->second, " and ", r.world_size()));
    }
  }
  for (const auto& s : request.durable_shards()) {
    CKPTD_RETURN_IF_ERROR(internal::ValidateShardReport(s, options_.max_world_size));
  }
  CKPTD_RETURN_IF_ERROR(internal::ValidateReplication(request));
  const std::vector<absl::Status> checks = CheckShardFiles(request.durable_shards());
  // 128 random bits: a session names the registration in every later call,
  // and nobody may guess another node's (nor an earlier coordinator's).
  CKPTD_ASSIGN_OR_RETURN(std::string session, base::RandomHex(16));
  CKPTD_ASSIGN_OR_RETURN(std::string fetch_key, base::RandomHex(16));
  ckptd::v1::RegisterAgentResponse response;
  Effects fx;
  std::vector<std::string> refused;  // ranks another node hosts, logged below
  {
    absl::MutexLock l(&mu_);
    // Every rank's job must accept its world size, and the new jobs fit,
    // before anything changes: a refused registration leaves the node's
    // session, ranks and jobs as they were.
    std::set<std::string> new_jobs;
    for (const auto& [name, world] : worlds) {
      const Job* job = FindJob(name);
      if (job == nullptr) new_jobs.insert(name);
      if (job != nullptr) CKPTD_RETURN_IF_ERROR(job->CheckResize(world));
    }
    if (jobs_.size() + new_jobs.size() > options_.max_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat("node ", node, " registers ranks of ", new_jobs.size(),
                                                       " new jobs; this coordinator tracks ", jobs_.size(),
                                                       " of at most ", options_.max_jobs, " (--max-jobs)"));
    }
    if (!agents_.contains(node) && agents_.size() >= options_.max_nodes) {
      return absl::ResourceExhaustedError(absl::StrCat("node ", node, " is one too many: this coordinator tracks ",
                                                       agents_.size(), " nodes, its limit (--max-nodes)"));
    }
    {
      // What the registration would hold, at most (ranks of other nodes are
      // left out below), against what all nodes may hold together.
      const size_t bytes = RegistrationBytes(request.address(), request.gpus(), request.ranks());
      auto old = agents_.find(node);
      const size_t others = registration_bytes_ - (old != agents_.end() ? old->second->registration_bytes : 0);
      if (others + bytes > options_.max_registration_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "node ", node, "'s registration (", request.ranks_size(), " ranks, ", request.gpus_size(),
            " GPU names: ", bytes, " bytes) would take what this coordinator holds for its ", agents_.size(),
            " nodes to ", others + bytes, " bytes, past its limit of ", options_.max_registration_bytes,
            " (--max-registration-memory)"));
      }
    }
    auto& agent = agents_[node];
    PreviousRegistration replaced;
    if (agent == nullptr) {
      agent = std::make_unique<Agent>();
    } else {
      replaced.known = true;
      replaced.alive = agent->alive;
      replaced.from = agent->registered_from;
      replaced.at = agent->registered_at;
    }
    // A new agent process while the old one still counts as alive: it
    // crashed and was started again before it was missed. The snapshots it
    // held and the ranks' registrations went with it: the node is lost, as
    // if it had stayed away, and its jobs restart.
    if (agent->alive && agent->instance != 0 && request.instance() != 0 && agent->instance != request.instance()) {
      LoseAgent(agent.get(), "its agent restarted (a new process registered): the snapshots it held are lost", &fx);
      replaced.agent_restarted = true;
    }
    agent->instance = request.instance();
    drills_->AgentRegistered(request.node_id(), agent->last_heartbeat);
    NoteDrillChanges(&fx);
    agent->node_id = request.node_id();
    agent->address = request.address();
    agent->gpus.assign(request.gpus().begin(), request.gpus().end());
    agent->session = std::move(session);
    agent->fetch_key = std::move(fetch_key);
    const absl::Time now = clock_->Now();
    agent->last_heartbeat = now;
    agent->alive = true;
    agent->registered_from = std::string(from);
    agent->registered_at = now;
    if (previous != nullptr) *previous = std::move(replaced);
    agent->drills_allowed = request.drills_allowed();
    // Peer replication: a change of who takes part, or how, moves partners.
    if (!agent->peer_address.empty() || !request.peer_address().empty()) partners_dirty_ = true;
    agent->peer_address = request.peer_address();
    agent->failure_domain = request.failure_domain();
    agent->memory_tier = request.memory_tier();
    agent->replicas = request.replicas();
    // Another node's rank is refused, as in heartbeats: the others go on.
    // (JobFor cannot fail here: the world sizes and new jobs were checked.)
    std::vector<ckptd::v1::RankInfo> accepted;
    for (const auto& r : request.ranks()) {
      absl::StatusOr<Job*> job = JobForRank(r.job(), r.world_size(), r.rank(), node);
      if (!job.ok()) {
        refused.emplace_back(job.status().message());
        continue;
      }
      (*job)->RegisterRank(r.rank(), node, r.pid());
      accepted.push_back(r);
    }
    agent->ranks = std::move(accepted);
    SetRegistrationBytes(agent.get());
    response.set_session(agent->session);
    response.set_fetch_key(agent->fetch_key);
    response.set_coordinator_epoch(options_.epoch);
    response.set_heartbeat_interval_ms(
        static_cast<uint32_t>(std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.heartbeat_interval))));
    for (int i = 0; i < request.durable_shards_size(); ++i) {
      // A shard that is no longer wanted is dropped; it does not fail the registration.
      (void)AcceptShard(node, request.durable_shards(i), checks[i], &fx);
    }
    MaybeRecomputePartners(now);
    SaveChangedJobs(&fx);
  }
  for (const std::string& why : refused) logger_->Warning(absl::StrCat("registration of node ", node, ": ", why));
  Apply(fx);
  return response;
}

void CoordinatorCore::LoseAgent(Agent* agent, const std::string& detail, Effects* fx) {
  const std::string& node = agent->node_id;
  agent->alive = false;
  EndReplication(agent);
  std::set<std::string> affected;
  for (const auto& r : agent->ranks) affected.insert(r.job());
  for (const auto& r : agent->ranks) {
    if (Job* job = FindJob(r.job())) job->RankGone(r.rank(), node);
  }
  if (affected.empty()) RecordFailure(nullptr, node, std::nullopt, ckptd::v1::NODE_LOST, detail, fx);
  for (const std::string& name : affected) {
    RecordFailure(FindJob(name), node, std::nullopt, ckptd::v1::NODE_LOST, detail, fx);
  }
  // Emergency persists of other jobs this node was to carry out go to
  // another node holding the copies (or end).
  for (auto& [name, job] : jobs_) {
    if (affected.contains(name) || !job->emergency()) continue;
    bool held = false;
    for (const auto& [rank, holder] : job->emergency()->holders) held |= holder == node;
    if (held) OrderEmergencyPersist(job.get());
  }
}

uint32_t CoordinatorCore::FindHungRanks(Job* job, absl::Time now, Effects* fx) {
  uint32_t alive = 0;
  for (const auto& [r, rank] : job->ranks()) {
    if (!rank.alive) continue;
    ++alive;
    if (!rank.has_progress || rank.hung || job->state() != ckptd::v1::JOB_RUNNING) continue;
    // A rank whose agent has gone quiet is no news of a hang: the node may
    // be lost, which Tick's heartbeat check decides.
    auto agent = agents_.find(rank.node_id);
    if (agent == agents_.end() || now - agent->second->last_heartbeat > 2 * options_.heartbeat_interval) continue;
    const double typical = std::max(rank.step_seconds, job->record().step_seconds());
    const absl::Duration limit = std::max(options_.hang_floor, absl::Seconds(options_.hang_multiple * typical));
    if (now - rank.last_progress > limit) {
      job->MarkHung(r);
      RecordFailure(job, rank.node_id, r, ckptd::v1::TRAINER_HUNG,
                    absl::StrCat("no step past ", rank.step, " for ", absl::FormatDuration(now - rank.last_progress)),
                    fx);
    }
  }
  return alive;
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
      LoseAgent(agent.get(), absl::StrCat("no heartbeat for ", absl::FormatDuration(now - agent->last_heartbeat)), &fx);
    }
    MaybeRecomputePartners(now);
    for (auto& [name, job] : jobs_) {
      const uint32_t alive = FindHungRanks(job.get(), now, &fx);
      if (alive > 0) job->set_last_alive(now);
      job->Tick(alive, elapsed);
      for (uint64_t step : job->PendingPastDeadline(now, options_.step_deadline)) {
        AbortPending(job.get(), step,
                     absl::StrCat("only ", job->pending().at(step).shards.size(), " of ", job->world_size(),
                                  " shards within ", absl::FormatDuration(options_.step_deadline)),
                     &fx);
      }
      if (options_.interval_automatic && job->state() == ckptd::v1::JOB_RUNNING && alive > 0 &&
          now - job->last_decided() >= options_.decide_every) {
        job->set_last_decided(now);
        DecideInterval(job.get());
      }
      SaveJob(job.get(), &fx);
    }
    Forget(now, &fx);
  }
  Apply(fx);
  if (options_.retention_in_tick) RunRetention();
}

void CoordinatorCore::Forget(absl::Time now, Effects* fx) {
  for (auto it = agents_.begin(); it != agents_.end();) {
    const Agent& a = *it->second;
    if (!a.alive && now - a.last_heartbeat > options_.forget_after) {
      registration_bytes_ -= a.registration_bytes;
      it = agents_.erase(it);
    } else {
      it = std::next(it);
    }
  }
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    const Job& job = *it->second;
    if (job.AnyRankAlive() || !job.pending().empty() || job.verifying_any() ||
        now - job.last_alive() <= options_.forget_after) {
      ++it;
      continue;
    }
    fx->forgotten_jobs.push_back(it->first);
    it = jobs_.erase(it);
  }
}

void CoordinatorCore::SaveJob(Job* job, Effects* fx) {
  if (std::optional<JobRecord> r = job->RecordToSave(clock_->Now())) fx->records.push_back(*std::move(r));
}

void CoordinatorCore::SaveChangedJobs(Effects* fx) {
  for (auto& [name, job] : jobs_) {
    if (job->dirty()) SaveJob(job.get(), fx);
  }
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
      for (const auto& [step, p] : job->pending()) {
        StepEntry& e = entries[step];
        e.set_step(step);
        e.set_state(ckptd::v1::STEP_PENDING);
        e.set_world_size(job->world_size());
        e.set_ranks_reported(static_cast<uint32_t>(p.shards.size()));
        e.set_first_report_unix_nanos(absl::ToUnixNanos(p.first_report));
      }
      for (const auto& [step, a] : job->aborted()) {
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

std::map<std::string, absl::Time> CoordinatorCore::LastCommitTimes() {
  absl::MutexLock l(&mu_);
  std::map<std::string, absl::Time> times;
  for (const auto& [name, job] : jobs_) {
    if (job->last_commit() != absl::InfinitePast()) times[name] = job->last_commit();
  }
  return times;
}

ckptd::v1::JobStatus CoordinatorCore::StatusOf(const Job& job) const {
  ckptd::v1::JobStatus s;
  s.set_job(job.name());
  s.set_world_size(job.world_size());
  s.set_state(job.state());
  *s.mutable_schedule() = job.schedule();
  if (std::optional<uint64_t> newest = job.NewestUsable()) {
    s.set_has_committed(true);
    s.set_newest_committed_step(*newest);
    s.set_peer_copies(PeerCopies(job, *newest));
  }
  for (auto it = job.memory_steps().rbegin(); it != job.memory_steps().rend(); ++it) {
    if (!it->second.complete) continue;
    s.set_has_memory_checkpoint(true);
    s.set_newest_memory_checkpoint(it->first);
    s.set_memory_checkpoint_restorable(NewestMemoryRestorable(job) == it->first);
    s.set_memory_checkpoint_peer_copies(PeerCopies(job, it->first));
    break;
  }
  uint64_t fastest = 0, slowest = UINT64_MAX, skipped = 0;
  uint32_t alive = 0;
  for (const auto& [r, rank] : job.ranks()) {
    if (!rank.alive) continue;
    ++alive;
    fastest = std::max(fastest, rank.step);
    slowest = std::min(slowest, rank.step);
    skipped += rank.skipped;
  }
  s.set_snapshots_skipped(skipped);
  s.set_fastest_step(fastest);
  s.set_slowest_step(alive == 0 ? 0 : slowest);
  s.set_ranks_alive(alive);
  s.set_finished(job.finished());
  s.set_checkpoints_committed(job.record().checkpoints_committed());
  s.set_checkpoints_aborted(job.record().checkpoints_aborted());
  for (const auto& [step, p] : job.pending()) s.add_pending_steps(step);
  for (const auto& [q, why] : job.quarantined()) s.add_quarantined_steps(q);
  s.set_step_seconds(job.record().step_seconds());
  s.set_restore_blocked(job.restore_blocked());
  if (std::optional<ckptd::v1::RestoreSummary> r = job.RoundSummary()) *s.mutable_last_restore() = *std::move(r);
  s.set_persist_failures(job.persist_failures().count);
  if (job.persist_failures().count > 0) {
    s.set_last_persist_failure(job.persist_failures().last_detail);
    s.set_last_persist_failure_unix_nanos(absl::ToUnixNanos(job.persist_failures().last));
  }
  return s;
}

size_t CoordinatorCore::RankBytes(const ckptd::v1::RankInfo& rank) {
  // The rank's entry here and in its job (maps of ranks, timings, the
  // shards it reports), beside the message itself.
  return rank.ByteSizeLong() + 512;
}

void CoordinatorCore::SetRegistrationBytes(Agent* agent) {
  registration_bytes_ -= agent->registration_bytes;
  agent->registration_bytes = RegistrationBytes(agent->address, agent->gpus, agent->ranks);
  registration_bytes_ += agent->registration_bytes;
}

ckptd::v1::GetClusterStatusResponse CoordinatorCore::ClusterStatus() {
  ckptd::v1::GetClusterStatusRequest all;
  all.set_max_agents(UINT32_MAX);
  return Status(all, /*page_bytes=*/SIZE_MAX);
}

ckptd::v1::GetClusterStatusResponse CoordinatorCore::ClusterStatusPage(
    const ckptd::v1::GetClusterStatusRequest& request) {
  return Status(request, kStatusPageBytes);
}

ckptd::v1::GetClusterStatusResponse CoordinatorCore::Status(const ckptd::v1::GetClusterStatusRequest& request,
                                                            size_t page_bytes) {
  ckptd::v1::GetClusterStatusResponse r;
  absl::MutexLock l(&mu_);
  MaybeRecomputePartners(clock_->Now());
  r.set_agents_total(static_cast<uint32_t>(agents_.size()));
  uint32_t alive = 0;
  for (const auto& [node, agent] : agents_) alive += agent->alive ? 1 : 0;
  r.set_agents_alive(alive);
  const size_t max_agents = request.max_agents() == 0 ? SIZE_MAX : request.max_agents();
  size_t bytes = 0;
  auto it = request.agents_after().empty() ? agents_.begin() : agents_.upper_bound(request.agents_after());
  for (; it != agents_.end(); ++it) {
    const auto& [node, agent] = *it;
    if (static_cast<size_t>(r.agents_size()) >= max_agents) {
      // More follow: the next page starts after the last one here.
      r.set_next_agents_after(r.agents(r.agents_size() - 1).node_id());
      break;
    }
    ckptd::v1::AgentStatus* a = r.add_agents();
    a->set_node_id(node);
    a->set_address(agent->address);
    a->set_alive(agent->alive);
    a->set_last_heartbeat_unix_nanos(absl::ToUnixNanos(agent->last_heartbeat));
    for (const auto& rank : agent->ranks) *a->add_ranks() = rank;
    for (const auto& g : agent->gpus) a->add_gpus(g);
    // The partners by node id only: their tickets are no operator's business.
    a->set_peer_address(agent->peer_address);
    a->set_failure_domain(agent->failure_domain);
    a->set_replicas(agent->replicas);
    for (const std::string& to : agent->send_to) a->add_send_to(to);
    a->set_replication_sent(agent->replication_sent);
    a->set_replication_failed(agent->replication_failed);
    a->set_replication_error(agent->replication_error);
    const size_t size = a->ByteSizeLong();
    if (r.agents_size() > 1 && bytes + size > page_bytes) {
      r.mutable_agents()->RemoveLast();
      r.set_next_agents_after(r.agents(r.agents_size() - 1).node_id());
      break;
    }
    bytes += size;
  }
  if (request.agents_after().empty()) {
    for (const auto& [name, job] : jobs_) *r.add_jobs() = StatusOf(*job);
  }
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
