#include "cli/drill_runner.h"

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "cli/command.h"
#include "protocol/restore_source.h"

namespace ckptd::cli {

using ckptd::v1::StepEntry;

namespace {

bool IsStorageScenario(ckptd::v1::DrillScenario s) {
  return s == ckptd::v1::STORAGE_EIO || s == ckptd::v1::STORAGE_ENOSPC || s == ckptd::v1::STORAGE_SLOW;
}

// Errors that say the coordinator cannot be asked (or refuses the asker)
// rather than something about the step.
bool IsCoordinatorError(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnimplemented:
      return true;
    default:
      return false;
  }
}

// The newest of `steps` (ascending) committed after `nanos`, if any.
template <typename Steps>
std::optional<uint64_t> NewestCommittedAfter(const Steps& steps, int64_t nanos) {
  std::optional<uint64_t> newest;
  for (const StepEntry& e : steps) {
    if (e.state() == ckptd::v1::STEP_COMMITTED && e.committed_unix_nanos() > nanos) newest = e.step();
  }
  return newest;
}

// corrupt-memory, once the job resumed: the step whose copy in memory was
// damaged is the one restored, and the rank read it from disk.
void JudgeMemoryCopy(const ckptd::v1::DrillStatus& st, std::vector<DrillVerdict>* verdicts) {
  const uint64_t damaged = st.report().step();
  const uint32_t rank = st.request().rank();
  const bool same = !st.fresh_start() && st.restored_step() == damaged;
  verdicts->push_back(
      {"it restored the step whose copy in memory was damaged", same,
       absl::StrCat(st.fresh_start() ? std::string("a fresh start") : absl::StrCat("step ", st.restored_step()),
                    "; the damaged copy was of step ", damaged)});
  std::optional<ckptd::v1::RestoreSource> source;
  for (const ckptd::v1::RestoreSummary::Rank& r : st.restore_sources().ranks()) {
    if (r.rank() == rank) source = r.source();
  }
  const bool from_disk = source == ckptd::v1::NODE_LOCAL || source == ckptd::v1::STORAGE_ROOT;
  std::string detail;
  if (!source) {
    detail = absl::StrCat("the coordinator does not say where rank ", rank, " read it");
  } else if (source == ckptd::v1::AGENT_MEMORY) {
    detail = absl::StrCat("rank ", rank, " read it from memory: the damaged copy was used");
  } else {
    const absl::string_view name = protocol::RestoreSourceName(*source);
    detail = absl::StrCat("rank ", rank, " read it from ", name.empty() ? "an unknown source" : name);
  }
  verdicts->push_back(
      {"the damaged copy was detected and the rank read the step from disk", same && from_disk, detail});
}

}  // namespace

const DrillScenarioInfo* FindDrillScenario(ckptd::v1::DrillScenario s) {
  for (const DrillScenarioInfo& i : kDrillScenarios) {
    if (i.scenario == s) return &i;
  }
  return nullptr;
}

bool DrillOutcome::passed() const {
  if (verdicts.empty()) return false;
  for (const DrillVerdict& v : verdicts) {
    if (!v.held) return false;
  }
  return true;
}

std::optional<double> DrillOutcome::detection_seconds() const {
  if (!injected || status.first_detection_unix_nanos() <= 0) return std::nullopt;
  return SecondsBetween(status.report().injected_unix_nanos(), status.first_detection_unix_nanos());
}

size_t PassedCount(const std::vector<DrillOutcome>& drills) {
  size_t passed = 0;
  for (const DrillOutcome& d : drills) passed += d.passed() ? 1 : 0;
  return passed;
}

absl::Status DrillRunner::Refresh(uint64_t drill_id, ckptd::v1::DrillStatus* st, RpcError* error) {
  ckptd::v1::GetDrillRequest get;
  get.set_drill_id(drill_id);
  absl::StatusOr<ckptd::v1::DrillStatus> got = api_.GetDrill(get);
  if (!got.ok()) {
    *error = {"GetDrill", got.status()};
    return got.status();
  }
  *st = *std::move(got);
  return absl::OkStatus();
}

std::optional<uint64_t> DrillRunner::CommittedAfter(int64_t nanos) {
  ckptd::v1::ListStepsRequest lr;
  lr.set_job(job_);
  absl::StatusOr<ckptd::v1::ListStepsResponse> steps = api_.ListSteps(lr);
  if (!steps.ok()) return std::nullopt;
  return NewestCommittedAfter(steps->steps(), nanos);
}

absl::Status DrillRunner::Settle(int64_t committed_after, absl::Duration settle, RpcError* error) {
  const absl::Time give_up = env_.now() + settle;
  std::string missing;
  while (true) {
    absl::StatusOr<ckptd::v1::GetClusterStatusResponse> status = api_.ClusterStatus();
    if (!status.ok()) {
      *error = {"GetClusterStatus", status.status()};
      return status.status();
    }
    const ckptd::v1::JobStatus* job = nullptr;
    for (const ckptd::v1::JobStatus& j : status->jobs()) {
      if (j.job() == job_) job = &j;
    }
    if (job == nullptr) {
      missing = absl::StrCat("the coordinator knows no job ", job_);
    } else if (job->state() != ckptd::v1::JOB_RUNNING) {
      missing = "the job is restarting";
    } else if (job->world_size() == 0 || job->ranks_alive() < job->world_size()) {
      missing = absl::StrCat(job->ranks_alive(), " of ", job->world_size(), " ranks are alive");
    } else if (committed_after != 0 && !CommittedAfter(committed_after)) {
      missing = "no step committed since the previous drill";
    } else {
      return absl::OkStatus();
    }
    if (env_.now() >= give_up) break;
    env_.sleep(env_.poll_interval);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("job ", job_, " was not healthy within ", absl::FormatDuration(settle), ": ", missing));
}

namespace {

// The job `job` in `cs`, or null.
const ckptd::v1::JobStatus* FindJobStatus(const ckptd::v1::GetClusterStatusResponse& cs, const std::string& job) {
  for (const ckptd::v1::JobStatus& j : cs.jobs()) {
    if (j.job() == job) return &j;
  }
  return nullptr;
}

// How long a standby may take to serve after the leader's death, and the
// job to commit after it (the targets with default settings).
constexpr double kFailoverTarget = 10;

}  // namespace

absl::StatusOr<DrillOutcome> DrillRunner::RunKillCoordinator(const DrillSpec& spec, RpcError* error) {
  DrillOutcome d;
  d.scenario = spec.info->name;
  d.job = job_;
  absl::StatusOr<ckptd::v1::GetClusterStatusResponse> before = api_.ClusterStatus();
  if (!before.ok()) {
    *error = {"GetClusterStatus", before.status()};
    return before.status();
  }
  const ckptd::v1::JobStatus* job_before = FindJobStatus(*before, job_);
  const uint64_t fastest_before = job_before != nullptr ? job_before->fastest_step() : 0;
  const uint64_t epoch_before = before->replication().epoch();
  ckptd::v1::RunDrillRequest req = spec.request;
  req.set_job(job_);
  const int64_t ordered_at = absl::ToUnixNanos(env_.now());
  absl::StatusOr<ckptd::v1::RunDrillResponse> ordered = api_.RunDrill(req);
  if (!ordered.ok()) {
    *error = {"RunDrill", ordered.status()};
    return ordered.status();
  }
  const absl::Time killed = env_.now();
  ckptd::v1::DrillStatus& st = d.status;
  st.set_drill_id(ordered->drill_id());
  *st.mutable_request() = req;
  st.set_node_id(ordered->node_id());
  st.set_ordered_unix_nanos(ordered_at);
  st.mutable_report()->set_drill_id(ordered->drill_id());
  st.mutable_report()->set_injected(true);
  st.mutable_report()->set_injected_unix_nanos(absl::ToUnixNanos(killed));
  st.mutable_report()->set_detail(
      absl::StrCat("SIGKILL to the leading coordinator ", ordered->node_id(), " (epoch ", epoch_before, ")"));
  d.injected = true;
  if (progress_ != nullptr) {
    *progress_ << "drill " << ordered->drill_id() << ": kill-coordinator: the leader "
               << TerminalSafe(ordered->node_id()) << " (epoch " << epoch_before << ") kills itself\n"
               << std::flush;
  }
  // A new leader, then a step committed after the kill. Calls fail while no
  // replica leads: they are asked again.
  const absl::Time give_up = killed + spec.watch;
  ckptd::v1::GetClusterStatusResponse after;
  std::optional<uint64_t> committed;
  while (true) {
    absl::StatusOr<ckptd::v1::GetClusterStatusResponse> cs = api_.ClusterStatus();
    if (cs.ok() && cs->has_replication() && cs->replication().epoch() != epoch_before) {
      after = *cs;
      if (!d.failover_seconds) {
        d.failover_seconds = absl::ToDoubleSeconds(env_.now() - killed);
        d.new_leader = cs->replication().leader();
        if (progress_ != nullptr) {
          *progress_ << absl::StrFormat("  %s leads as epoch %d, %.2f s after the kill\n",
                                        TerminalSafe(d.new_leader), cs->replication().epoch(), *d.failover_seconds)
                     << std::flush;
        }
      }
      ckptd::v1::ListStepsRequest lr;
      lr.set_job(job_);
      absl::StatusOr<ckptd::v1::ListStepsResponse> steps = api_.ListSteps(lr);
      if (steps.ok()) {
        committed = NewestCommittedAfter(steps->steps(), absl::ToUnixNanos(killed));
        if (committed) {
          d.next_commit_seconds = absl::ToDoubleSeconds(env_.now() - killed);
          d.steps.assign(steps->steps().begin(), steps->steps().end());
          break;
        }
      }
    }
    if (env_.now() >= give_up) break;
    env_.sleep(env_.poll_interval);
  }
  d.ended_unix_nanos = absl::ToUnixNanos(env_.now());
  std::vector<DrillVerdict>& verdicts = d.verdicts;
  verdicts.push_back({"a standby took over", d.failover_seconds.has_value(),
                      d.failover_seconds ? absl::StrFormat("%s leads as epoch %d", d.new_leader,
                                                           after.replication().epoch())
                                         : absl::StrCat("no new leader within --watch ",
                                                        absl::FormatDuration(spec.watch))});
  if (d.failover_seconds) {
    verdicts.push_back({absl::StrFormat("it served within %.0f s", kFailoverTarget),
                        *d.failover_seconds <= kFailoverTarget,
                        absl::StrFormat("%.2f s after the kill", *d.failover_seconds)});
  }
  verdicts.push_back({"the job committed a step after the kill", committed.has_value(),
                      committed ? absl::StrFormat("step %d, %.2f s after the kill", *committed, *d.next_commit_seconds)
                                : "none within --watch"});
  bool partial = false;
  for (const StepEntry& e : d.steps) {
    partial |= e.state() == ckptd::v1::STEP_COMMITTED && e.ranks_reported() != e.world_size();
  }
  verdicts.push_back({"nothing partial committed", !partial, partial ? "a committed step lacks a rank" : ""});
  const ckptd::v1::JobStatus* job_after = FindJobStatus(after, job_);
  const bool trained = job_after != nullptr && job_after->fastest_step() > fastest_before;
  verdicts.push_back({"training went on", trained,
                      job_after == nullptr ? "the new leader does not know the job"
                                           : absl::StrCat("the fastest rank at step ", job_after->fastest_step(),
                                                          ", ", fastest_before, " before the kill")});
  return d;
}

absl::StatusOr<DrillOutcome> DrillRunner::Run(const DrillSpec& spec, RpcError* error) {
  if (spec.info->scenario == ckptd::v1::KILL_COORDINATOR) return RunKillCoordinator(spec, error);
  DrillOutcome d;
  d.scenario = spec.info->name;
  d.job = job_;
  d.target = spec.target;
  ckptd::v1::RunDrillRequest req = spec.request;
  req.set_job(job_);
  absl::StatusOr<ckptd::v1::RunDrillResponse> ordered = api_.RunDrill(req);
  if (!ordered.ok()) {
    *error = {"RunDrill", ordered.status()};
    return ordered.status();
  }
  if (progress_ != nullptr) {
    *progress_ << "drill " << ordered->drill_id() << ": " << spec.info->name << " on node "
               << TerminalSafe(ordered->node_id())
               << (req.target_node().empty() ? absl::StrCat(" (rank ", req.rank(), " of job ", job_, ")") : "")
               << (req.at_step() > 0 ? absl::StrCat(" at step ", req.at_step()) : "")
               << (ordered->partner_nodes_size() > 0
                       ? absl::StrCat(", and on its replication partners ",
                                      TerminalSafe(absl::StrJoin(ordered->partner_nodes(), ", ")))
                       : "")
               << "\n"
               << std::flush;
  }
  ckptd::v1::DrillStatus& st = d.status;
  // 1. The agent's report.
  const absl::Time give_up = env_.now() + spec.watch;
  while (true) {
    CKPTD_RETURN_IF_ERROR(Refresh(ordered->drill_id(), &st, error));
    if (st.has_report() && (st.report().injected() || !st.report().error().empty())) break;
    if (env_.now() >= give_up) break;
    env_.sleep(env_.poll_interval);
  }
  d.injected = st.has_report() && st.report().injected();
  const ckptd::v1::DrillScenario scenario = spec.info->scenario;

  // 2. What follows.
  if (d.injected && scenario == ckptd::v1::CORRUPT_SHARD) {
    // Nothing reads a committed step until a restore or a verification: the
    // drill verifies it, as an operator would.
    ckptd::v1::VerifyStepRequest vr;
    vr.set_job(job_);
    vr.set_has_step(true);
    // The step the agent damaged: newer ones may have committed since the order.
    vr.set_step(st.report().step() != 0 ? st.report().step() : st.newest_committed_at_order());
    absl::StatusOr<ckptd::v1::VerifyProgress> v = api_.VerifyStep(vr, [](const ckptd::v1::VerifyProgress&) {});
    if (!v.ok()) {
      *error = {"VerifyStep", v.status()};
      return v.status();
    }
    d.damaged_verified = *v;
    d.damaged_verified_unix_nanos = absl::ToUnixNanos(env_.now());
  }
  auto settled = [&]() {
    if (!d.injected) return true;
    switch (scenario) {
      case ckptd::v1::CORRUPT_SHARD:
        return true;
      case ckptd::v1::HANG_TRAINER:
        // The agent lets the trainer go (SIGCONT) when the hang's --duration
        // has run out, also when the coordinator detected the hang and the
        // job resumed before that: as for a storage fault, the drill waits
        // for the fault to be lifted. A hang shorter than the coordinator's
        // threshold is not a failure: nothing recorded 5 s after it ended
        // settles it.
        if (!st.report().ended()) return false;
        return st.resumed() || (st.events().empty() &&
                                env_.now() > absl::FromUnixNanos(st.report().ended_unix_nanos()) + absl::Seconds(5));
      case ckptd::v1::STORAGE_EIO:
      case ckptd::v1::STORAGE_ENOSPC:
      case ckptd::v1::STORAGE_SLOW:
        return st.report().ended() && CommittedAfter(st.report().ended_unix_nanos()).has_value();
      default:
        return st.resumed();
    }
  };
  // The step restored, read back as soon as the job resumed from it (the
  // drill may watch on, for the fault to be lifted): the coordinator keeps it
  // from retention while it is being verified, but not before. Again should
  // the job resume once more.
  std::optional<int64_t> checked_resume;  // resumed_unix_nanos of the resumption checked
  auto check_restored = [&]() -> absl::Status {
    if (!st.resumed() || st.fresh_start() || checked_resume == st.resumed_unix_nanos()) return absl::OkStatus();
    checked_resume = st.resumed_unix_nanos();
    d.restored_verified.reset();
    d.restored_verified_unix_nanos = 0;
    d.restored_unverified_reason.clear();
    d.restored_verify_error.clear();
    if (!verify_restored_) {
      d.restored_unverified_reason = "not asked for (--no-verify-restored)";
      return absl::OkStatus();
    }
    ckptd::v1::VerifyStepRequest vr;
    vr.set_job(job_);
    vr.set_has_step(true);
    vr.set_step(st.restored_step());
    absl::StatusOr<ckptd::v1::VerifyProgress> v = api_.VerifyStep(vr, [](const ckptd::v1::VerifyProgress&) {});
    if (v.ok()) {
      d.restored_verified = *v;
      d.restored_verified_unix_nanos = absl::ToUnixNanos(env_.now());
    } else if (v.status().code() == absl::StatusCode::kFailedPrecondition) {
      // Retention removed it: newer steps committed since the restart.
      d.restored_unverified_reason = std::string(v.status().message());
    } else if (IsCoordinatorError(v.status())) {
      *error = {"VerifyStep", v.status()};
      return v.status();
    } else {
      d.restored_verify_error = std::string(v.status().message());
    }
    return absl::OkStatus();
  };
  std::string last_line;
  while (true) {
    CKPTD_RETURN_IF_ERROR(Refresh(ordered->drill_id(), &st, error));
    if (progress_ != nullptr) {
      std::string line = absl::StrCat("  ", st.events_size(), " failure(s) recorded",
                                      st.resumed() ? absl::StrCat("; resumed from step ", st.restored_step()) : "",
                                      st.report().ended() ? "; fault lifted" : "");
      if (line != last_line) *progress_ << line << "\n" << std::flush;
      last_line = line;
    }
    CKPTD_RETURN_IF_ERROR(check_restored());
    if (settled() || env_.now() >= give_up) break;
    env_.sleep(env_.poll_interval);
  }
  // 3. The verdict.
  ckptd::v1::ListStepsRequest lr;
  lr.set_job(job_);
  absl::StatusOr<ckptd::v1::ListStepsResponse> steps = api_.ListSteps(lr);
  if (!steps.ok()) {
    *error = {"ListSteps", steps.status()};
    return steps.status();
  }
  d.steps.assign(steps->steps().begin(), steps->steps().end());
  ckptd::v1::RestorePreviewRequest pr;
  pr.set_job(job_);
  absl::StatusOr<ckptd::v1::RestorePreview> preview = api_.GetRestorePreview(pr);
  if (!preview.ok()) {
    *error = {"GetRestorePreview", preview.status()};
    return preview.status();
  }
  d.ended_unix_nanos = absl::ToUnixNanos(env_.now());
  Judge(spec, *preview, &d);
  return d;
}

void DrillRunner::Judge(const DrillSpec& spec, const ckptd::v1::RestorePreview& preview, DrillOutcome* d) const {
  const ckptd::v1::DrillStatus& st = d->status;
  const ckptd::v1::DrillScenario scenario = spec.info->scenario;
  std::vector<DrillVerdict>& verdicts = d->verdicts;
  if (st.has_report() && !st.report().error().empty()) {
    verdicts.push_back({"the agent injected the fault", false,
                        absl::StrCat("node ", st.node_id(), " did not carry the drill out: ", st.report().error())});
    return;
  }
  verdicts.push_back(
      {"the agent injected the fault", d->injected,
       d->injected ? st.report().detail() : absl::StrCat("no report within ", absl::FormatDuration(spec.watch))});
  std::map<uint64_t, const StepEntry*> by_step;
  bool partial = false;
  for (const StepEntry& e : d->steps) {
    by_step[e.step()] = &e;
    partial |= e.state() == ckptd::v1::STEP_COMMITTED && e.ranks_reported() != e.world_size();
  }
  verdicts.push_back({"nothing partial committed", !partial, partial ? "a committed step lacks a rank" : ""});
  const std::optional<double> detection = d->detection_seconds();
  const bool restart_scenario = scenario == ckptd::v1::KILL_TRAINER || scenario == ckptd::v1::KILL_AGENT ||
                                scenario == ckptd::v1::KILL_NODE || scenario == ckptd::v1::CUT_OFF_AGENT ||
                                scenario == ckptd::v1::CORRUPT_MEMORY ||
                                (scenario == ckptd::v1::HANG_TRAINER && st.first_detection_unix_nanos() > 0);
  if (restart_scenario) {
    verdicts.push_back({"the failure was detected", detection.has_value(),
                        detection ? absl::StrFormat("%.3f s after the injection", *detection) : "no failure recorded"});
    verdicts.push_back({"the job restarted and resumed training", st.resumed(),
                        st.resumed() ? absl::StrCat("from step ", st.restored_step()) : "not within --watch"});
    if (st.resumed()) {
      auto it = by_step.find(st.restored_step());
      const StepEntry* restored = st.fresh_start() || it == by_step.end() ? nullptr : it->second;
      // The restored step may since have been removed by retention: only a
      // quarantine of it counts against it.
      const bool good = st.fresh_start() ? !st.had_committed_at_order()
                                         : (restored == nullptr || restored->state() != ckptd::v1::STEP_QUARANTINED) &&
                                               st.restored_step() <= st.step_at_failure();
      verdicts.push_back({"it restored a committed step no newer than the failure", good,
                          st.fresh_start() ? "a fresh start"
                                           : absl::StrCat("step ", st.restored_step(), ", the failure at step ",
                                                          st.step_at_failure())});
      if (scenario == ckptd::v1::CORRUPT_MEMORY) JudgeMemoryCopy(st, &verdicts);
      if (!d->restored_verify_error.empty()) {
        verdicts.push_back({"the restored step verifies intact", false,
                            absl::StrCat("the verification failed: ", d->restored_verify_error)});
      } else if (d->restored_verified) {
        const ckptd::v1::VerifyProgress& v = *d->restored_verified;
        verdicts.push_back({"the restored step verifies intact", v.ok(),
                            v.ok() ? absl::StrCat(v.shards_done(), " shards, ", HumanBytes(v.bytes_done()))
                                   : (v.problems().empty() ? "a problem" : v.problems(0))});
      }
    }
  }
  if (scenario == ckptd::v1::HANG_TRAINER) {
    const bool let_go = st.report().ended();
    verdicts.push_back(
        {"the trainer was let go again", let_go,
         let_go ? absl::StrFormat("%.3f s after the injection",
                                  SecondsBetween(st.report().injected_unix_nanos(), st.report().ended_unix_nanos()))
                : absl::StrCat("not within --watch ", absl::FormatDuration(spec.watch), " (the hang lasts ",
                               absl::FormatDuration(absl::Seconds(spec.request.duration_seconds())), ")")});
  }
  if (scenario == ckptd::v1::CORRUPT_SHARD && d->damaged_verified) {
    const ckptd::v1::VerifyProgress& v = *d->damaged_verified;
    const uint64_t bad = v.step();
    auto it = by_step.find(bad);
    const StepEntry* e = it == by_step.end() ? nullptr : it->second;
    verdicts.push_back(
        {"verification found the damage", !v.ok(), v.problems().empty() ? "no problem found" : v.problems(0)});
    verdicts.push_back({"the damaged step is quarantined", e != nullptr && e->state() == ckptd::v1::STEP_QUARANTINED,
                        absl::StrCat("step ", bad)});
    const bool never = preview.fresh_start() || preview.step() != bad;
    verdicts.push_back({"corrupt data is never restored", never,
                        preview.fresh_start() ? "a restart would start fresh"
                                              : absl::StrCat("a restart would restore step ", preview.step())});
    // The newest step that is committed and intact: the one before the
    // damaged step, or one committed after it.
    std::optional<uint64_t> newest_good;
    for (const StepEntry& s : d->steps) {
      if (s.state() == ckptd::v1::STEP_COMMITTED) newest_good = s.step();
    }
    const bool picks_good =
        newest_good ? !preview.fresh_start() && preview.step() == *newest_good : preview.fresh_start();
    verdicts.push_back({"a restart picks the newest intact committed step", picks_good,
                        newest_good ? absl::StrCat("step ", *newest_good,
                                                   *newest_good < bad ? " (the one before the damaged step)"
                                                                      : " (committed after the damaged step)")
                                    : "none: a fresh start"});
  }
  if (IsStorageScenario(scenario)) {
    bool restarted = st.resumed();
    for (const auto& e : st.events()) {
      restarted |= e.kind() == ckptd::v1::TRAINER_DIED || e.kind() == ckptd::v1::NODE_LOST ||
                   e.kind() == ckptd::v1::TRAINER_HUNG;
    }
    verdicts.push_back({"training went on without a restart", !restarted, ""});
    verdicts.push_back({"the fault was lifted", st.report().ended(), ""});
    const std::optional<uint64_t> after =
        st.report().ended() ? NewestCommittedAfter(d->steps, st.report().ended_unix_nanos()) : std::nullopt;
    verdicts.push_back({"checkpoints commit again after the fault", after.has_value(),
                        after ? absl::StrCat("step ", *after) : "none within --watch"});
  }
  // Work lost: the steps past the restored one, redone.
  d->lost_steps =
      st.resumed() && st.step_at_failure() > st.restored_step() ? st.step_at_failure() - st.restored_step() : 0;
  d->lost_seconds = static_cast<double>(d->lost_steps) * st.step_seconds();
  d->restart_seconds = st.resumed() ? SecondsBetween(st.failed_unix_nanos(), st.resumed_unix_nanos()) : 0;
}

}  // namespace ckptd::cli
