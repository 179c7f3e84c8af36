#include "cli/drill_commands.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/command.h"
#include "storage/status_macros.h"

namespace ckptd::cli {

using ckptd::v1::StepEntry;

const char kDrillHelp[] =
    "usage: ckptctl drill run --job J --scenario S [--target RANK|NODE] [--at-step N]\n"
    "                         [--duration 10s] [--slow 200ms] [--watch 2m] [--no-verify-restored]\n"
    "                         [--json] [--html FILE]\n"
    "                         --coordinator HOST:PORT --token-file F [--tls-ca F --tls-cert F --tls-key F]\n"
    "       ckptctl drill suite FILE ...   (see `ckptctl drill suite --help`)\n"
    "\n"
    "Rehearses a failure: the coordinator has the agent of the node concerned\n"
    "inject it (only agents started with --allow-drills do), then this command\n"
    "watches what follows and reports a timeline (injected, detected and the\n"
    "detection latency, failed, resumed), the step restored and whether it\n"
    "verifies intact, the work lost in steps and seconds, the restart duration,\n"
    "and a verdict against what ckptd promises. Restarting the job's processes is\n"
    "the launcher's part (torchrun, Slurm, ...): the drill waits for the job to\n"
    "come back.\n"
    "\n"
    "scenarios (--target is a rank of the job unless said otherwise):\n"
    "  kill-trainer     SIGKILL the rank's trainer; expects detection, a restart from a\n"
    "                   committed step no newer than the failure\n"
    "  hang-trainer     SIGSTOP it for --duration; expects the hang to be detected when\n"
    "                   --duration outlasts the coordinator's hang threshold\n"
    "  kill-agent       SIGKILL the agent of the rank's node (or of node --target)\n"
    "  kill-node        a node crash: the agent SIGKILLs every trainer on its node, then\n"
    "                   itself (the rank's node, or node --target)\n"
    "  cut-off-agent    the agent talks to nobody for --duration; expects the node lost\n"
    "  corrupt-shard    flip a byte of the rank's shard of the newest committed step; the\n"
    "                   drill then verifies that step through the coordinator and expects\n"
    "                   it quarantined and never chosen for a restore\n"
    "  storage-eio      the agent's checkpoint storage fails with EIO for --duration\n"
    "  storage-enospc   ... fails with ENOSPC (a full disk) for --duration\n"
    "  storage-slow     ... waits --slow per operation for --duration; for the three\n"
    "                   storage scenarios training must go on without a restart and\n"
    "                   checkpoints commit again once the fault is lifted\n"
    "\n"
    "  --target T       a rank number of the job, or a node id (agent and storage scenarios)\n"
    "  --at-step N      inject once the target rank reaches step N (default: at once)\n"
    "  --duration D     how long a hang, cut-off or storage fault lasts (default 10s)\n"
    "  --slow D         the delay per storage operation of storage-slow (default 200ms)\n"
    "  --watch D        how long to watch after the injection (default 2m)\n"
    "  --no-verify-restored\n"
    "                   after a restart, do not read the restored step back through the\n"
    "                   coordinator to verify it (it reads the whole step)\n"
    "  --json           one JSON object: the timeline, the figures and the verdict\n"
    "  --html FILE      also write the report as a self-contained HTML page with an SVG\n"
    "                   timeline\n"
    "\n"
    "exit status: 0 every expectation held, 1 one did not (or the drill could not be\n"
    "carried out), 2 usage error, 3 the coordinator cannot be reached\n";

const char kDrillSuiteHelp[] =
    "usage: ckptctl drill suite FILE --job J --coordinator HOST:PORT --token-file F\n"
    "                           [--settle 2m] [--stop-on-failure] [--no-verify-restored]\n"
    "                           [--json] [--html FILE] [--tls-ca F --tls-cert F --tls-key F]\n"
    "\n"
    "Runs the drills listed in FILE against job J, one after the other, and sums\n"
    "them up. FILE holds one drill per line: a scenario name and the flags of\n"
    "`ckptctl drill run` that shape it (--target, --at-step, --duration, --slow,\n"
    "--watch); a # starts a comment that runs to the end of the line. For example:\n"
    "\n"
    "  # rehearse the failures of the week\n"
    "  kill-trainer   --target 3\n"
    "  corrupt-shard  --target 0\n"
    "  storage-enospc --target node-7 --duration 30s\n"
    "\n"
    "Before each drill the suite waits until the job is healthy again: running,\n"
    "every rank alive, and (after the first drill) a step committed since the\n"
    "previous drill ended, so that every drill starts from a fresh checkpoint. A job\n"
    "that does not get there within --settle ends the suite; the drills left are\n"
    "reported as not run.\n"
    "\n"
    "  FILE             the drills; the whole file is checked before the first one runs\n"
    "  --settle D       how long to wait for the job to be healthy before a drill (default 2m)\n"
    "  --stop-on-failure\n"
    "                   stop after the first drill whose verdict fails\n"
    "  --no-verify-restored, --json, --html FILE\n"
    "                   as for `drill run`; the JSON object and the page hold every drill\n"
    "\n"
    "exit status: 0 every drill passed, 1 one failed, could not be carried out or\n"
    "was not run, 2 usage error (a bad line of FILE is named with its number), 3 the\n"
    "coordinator cannot be reached\n";

namespace {

struct ScenarioInfo {
  const char* name;
  ckptd::v1::DrillScenario scenario;
  bool timed;       // lasts --duration
  bool node_level;  // may target a node
};
constexpr ScenarioInfo kScenarios[] = {
    {"kill-trainer", ckptd::v1::KILL_TRAINER, false, false},
    {"hang-trainer", ckptd::v1::HANG_TRAINER, true, false},
    {"kill-agent", ckptd::v1::KILL_AGENT, false, true},
    {"kill-node", ckptd::v1::KILL_NODE, false, true},
    {"cut-off-agent", ckptd::v1::CUT_OFF_AGENT, true, true},
    {"corrupt-shard", ckptd::v1::CORRUPT_SHARD, false, false},
    {"storage-eio", ckptd::v1::STORAGE_EIO, true, true},
    {"storage-enospc", ckptd::v1::STORAGE_ENOSPC, true, true},
    {"storage-slow", ckptd::v1::STORAGE_SLOW, true, true},
};

const ScenarioInfo* FindScenario(ckptd::v1::DrillScenario s) {
  for (const ScenarioInfo& i : kScenarios) {
    if (i.scenario == s) return &i;
  }
  return nullptr;
}

bool IsStorageScenario(ckptd::v1::DrillScenario s) {
  return s == ckptd::v1::STORAGE_EIO || s == ckptd::v1::STORAGE_ENOSPC || s == ckptd::v1::STORAGE_SLOW;
}

// The drill's flags, besides the coordinator's.
const std::set<std::string>& DrillValueFlags() {
  static const std::set<std::string> flags = {"target", "at-step", "duration", "slow", "watch"};
  return flags;
}

// A positive duration flag, or `fallback` when absent.
absl::StatusOr<absl::Duration> PositiveDuration(const Args& args, const std::string& flag, absl::Duration fallback) {
  std::optional<std::string> v = args.Get(flag);
  if (!v) return fallback;
  absl::Duration d;
  if (!absl::ParseDuration(*v, &d) || d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", *v, "\" is not a positive duration (e.g. 10s)"));
  }
  return d;
}

double SecondsBetween(int64_t from_nanos, int64_t to_nanos) {
  return static_cast<double>(to_nanos - from_nanos) / 1e9;
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

// One drill to run: the request (without the job) and how long to watch.
struct DrillSpec {
  const ScenarioInfo* info = nullptr;
  ckptd::v1::RunDrillRequest request;
  std::string target;
  absl::Duration watch;
};

// The drill that `scenario` and the drill flags in `args` describe; errors
// call the scenario `label`.
absl::StatusOr<DrillSpec> ParseDrillSpec(const std::string& scenario, const Args& args, absl::string_view label) {
  DrillSpec spec;
  std::vector<std::string> names;
  for (const ScenarioInfo& s : kScenarios) {
    names.push_back(s.name);
    if (scenario == s.name) spec.info = &s;
  }
  if (spec.info == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(label, " must be one of ", absl::StrJoin(names, ", "),
                                                   scenario.empty() ? "" : absl::StrCat("; got \"", scenario, "\"")));
  }
  absl::StatusOr<absl::Duration> duration = PositiveDuration(args, "duration", absl::Seconds(10));
  absl::StatusOr<absl::Duration> slow = PositiveDuration(args, "slow", absl::Milliseconds(200));
  absl::StatusOr<absl::Duration> watch = PositiveDuration(args, "watch", absl::Minutes(2));
  for (const absl::Status& s : {duration.status(), slow.status(), watch.status()}) {
    if (!s.ok()) return s;
  }
  absl::StatusOr<std::optional<uint64_t>> at_step = args.GetUint("at-step");
  if (!at_step.ok()) return at_step.status();
  spec.watch = *watch;
  ckptd::v1::RunDrillRequest& req = spec.request;
  req.set_scenario(spec.info->scenario);
  if (std::optional<std::string> target = args.Get("target")) {
    spec.target = *target;
    uint32_t rank = 0;
    if (absl::SimpleAtoi(*target, &rank)) {
      req.set_rank(rank);
    } else if (spec.info->node_level) {
      req.set_target_node(*target);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--target of ", spec.info->name, " is a rank number; got \"", *target, "\""));
    }
  }
  req.set_at_step(at_step->value_or(0));
  if (spec.info->timed) req.set_duration_seconds(absl::ToDoubleSeconds(*duration));
  if (spec.info->scenario == ckptd::v1::STORAGE_SLOW) req.set_slow_seconds(absl::ToDoubleSeconds(*slow));
  return spec;
}

// A call to the coordinator failed: which one, and how.
struct RpcError {
  std::string rpc;
  absl::Status status;
};

// Runs drills against one job and judges them.
class DrillRunner {
 public:
  DrillRunner(CoordinatorApi& api, std::string job, const OperatorEnv& env, bool verify_restored,
              std::ostream* progress)
      : api_(api), job_(std::move(job)), env_(env), verify_restored_(verify_restored), progress_(progress) {}

  // Orders the drill, watches what follows and judges it. An RpcError when
  // the coordinator could not be asked (a drill the agent refused is an
  // outcome whose first expectation failed).
  absl::StatusOr<DrillOutcome> Run(const DrillSpec& spec, RpcError* error);

  // Waits until the job runs with every rank alive and, when
  // `committed_after` is not 0, a step committed after it. An error saying
  // what was missing when `settle` passes first.
  absl::Status Settle(int64_t committed_after, absl::Duration settle, RpcError* error);

 private:
  absl::Status Refresh(uint64_t drill_id, ckptd::v1::DrillStatus* st, RpcError* error);
  // The newest step committed after `nanos`, if any.
  std::optional<uint64_t> CommittedAfter(int64_t nanos);
  void Judge(const DrillSpec& spec, const ckptd::v1::RestorePreview& preview, DrillOutcome* d) const;

  CoordinatorApi& api_;
  const std::string job_;
  const OperatorEnv& env_;
  const bool verify_restored_;
  std::ostream* const progress_;  // null: quiet (--json)
};

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

absl::StatusOr<DrillOutcome> DrillRunner::Run(const DrillSpec& spec, RpcError* error) {
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
    *progress_ << "drill " << ordered->drill_id() << ": " << spec.info->name << " on node " << ordered->node_id()
               << (req.target_node().empty() ? absl::StrCat(" (rank ", req.rank(), " of job ", job_, ")") : "")
               << (req.at_step() > 0 ? absl::StrCat(" at step ", req.at_step()) : "") << "\n"
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
        // A hang shorter than the coordinator's threshold is not a failure.
        return st.resumed() || (st.report().ended() && st.events().empty() &&
                                env_.now() > absl::FromUnixNanos(st.report().ended_unix_nanos()) + absl::Seconds(5));
      case ckptd::v1::STORAGE_EIO:
      case ckptd::v1::STORAGE_ENOSPC:
      case ckptd::v1::STORAGE_SLOW:
        return st.report().ended() && CommittedAfter(st.report().ended_unix_nanos()).has_value();
      default:
        return st.resumed();
    }
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
    if (settled() || env_.now() >= give_up) break;
    env_.sleep(env_.poll_interval);
  }
  // The step restored, read back at once: the coordinator keeps it from
  // retention while it is being verified, but not before.
  if (st.resumed() && !st.fresh_start()) {
    if (!verify_restored_) {
      d.restored_unverified_reason = "not asked for (--no-verify-restored)";
    } else {
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
    }
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
  verdicts.push_back({"the agent injected the fault", d->injected,
                      d->injected ? st.report().detail()
                                  : absl::StrCat("no report within ", absl::FormatDuration(spec.watch))});
  std::map<uint64_t, const StepEntry*> by_step;
  bool partial = false;
  for (const StepEntry& e : d->steps) {
    by_step[e.step()] = &e;
    partial |= e.state() == ckptd::v1::STEP_COMMITTED && e.ranks_reported() != e.world_size();
  }
  verdicts.push_back({"nothing partial committed", !partial, partial ? "a committed step lacks a rank" : ""});
  const std::optional<double> detection = d->detection_seconds();
  const bool restart_scenario = scenario == ckptd::v1::KILL_TRAINER || scenario == ckptd::v1::KILL_AGENT ||
                                scenario == ckptd::v1::KILL_NODE ||
                                scenario == ckptd::v1::CUT_OFF_AGENT ||
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
    verdicts.push_back({"the trainer was let go again", st.report().ended(), ""});
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

// ------------------------------------------------------------- HTML

// Seconds from the injection (or the order, before one) for the page's axis.
struct Axis {
  int64_t origin = 0;  // 0 s
  int64_t from = 0, to = 0;
  double left = 0, width = 0;
  double X(int64_t nanos) const {
    const double span = std::max(1.0, static_cast<double>(to - from));
    return left + width * static_cast<double>(std::clamp(nanos, from, to) - from) / span;
  }
};

// A round tick spacing (1, 2 or 5 × 10^k seconds) giving at most ten ticks
// over `seconds`.
double TickStep(double seconds) {
  const double rough = std::max(seconds, 1e-3) / 10;
  const double decade = std::pow(10.0, std::floor(std::log10(rough)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * decade >= rough) return m * decade;
  }
  return 10 * decade;
}

std::string TickLabel(double s) {
  if (std::fabs(s) < 1e-9) return "0";
  if (std::fabs(s) >= 120) return absl::StrFormat("%+.0f min", s / 60);
  return absl::StrFormat(std::fabs(s) < 1 ? "%+.2f s" : "%+.1f s", s);
}

struct Mark {
  int64_t nanos;
  std::string label;
  std::string cls;
  std::string title;
};

std::string TimelineSvg(const DrillOutcome& d) {
  const ckptd::v1::DrillStatus& st = d.status;
  std::vector<Mark> marks;
  marks.push_back({st.ordered_unix_nanos(), "ordered", "ordered", "the coordinator took the order"});
  const int64_t injected_at = d.injected ? st.report().injected_unix_nanos() : 0;
  if (d.injected) marks.push_back({injected_at, "injected", "fault", st.report().detail()});
  for (const auto& e : st.events()) {
    marks.push_back({e.unix_nanos(), absl::StrCat("detected ", FailureKindName(e.kind())), "detect",
                     absl::StrCat(e.node_id(), e.has_rank() ? absl::StrCat(" rank ", e.rank()) : "", ": ", e.detail())});
  }
  if (d.damaged_verified) {
    marks.push_back({d.damaged_verified_unix_nanos, absl::StrCat("verified step ", d.damaged_verified->step()),
                     "verify", d.damaged_verified->ok() ? "intact" : "damaged: quarantined"});
  }
  const ScenarioInfo* info = FindScenario(st.request().scenario());
  const bool lasting = info != nullptr && info->timed;
  if (lasting && st.report().ended() && st.report().ended_unix_nanos() > 0) {
    marks.push_back({st.report().ended_unix_nanos(), "fault lifted", "lifted", ""});
  }
  if (st.resumed()) {
    marks.push_back({st.resumed_unix_nanos(),
                     st.fresh_start() ? std::string("resumed fresh") : absl::StrCat("resumed from ", st.restored_step()),
                     "resume", "the first step after the restore"});
  }
  if (d.restored_verified) {
    marks.push_back({d.restored_verified_unix_nanos, absl::StrCat("verified step ", d.restored_verified->step()),
                     "verify", d.restored_verified->ok() ? "intact" : "damaged"});
  }
  // The axis spans the coordinator's times. The verifications and the end
  // are this machine's: its clock may be off, so they widen the axis only
  // when they fall near it (and are drawn at its edge otherwise).
  Axis axis;
  axis.origin = injected_at > 0 ? injected_at : st.ordered_unix_nanos();
  axis.from = st.ordered_unix_nanos();
  axis.to = axis.from + 1;
  for (const Mark& m : marks) {
    if (m.nanos > 0 && m.cls != "verify") {
      axis.from = std::min(axis.from, m.nanos);
      axis.to = std::max(axis.to, m.nanos);
    }
  }
  constexpr int64_t kNear = int64_t{600} * 1'000'000'000;
  for (int64_t local : {d.ended_unix_nanos, d.damaged_verified_unix_nanos, d.restored_verified_unix_nanos}) {
    if (local > axis.to && local - axis.to < kNear) axis.to = local;
  }
  const int64_t pad = std::max<int64_t>((axis.to - axis.from) / 30, 1);
  axis.from -= pad;
  axis.to += pad;
  axis.left = 130;
  axis.width = 820;
  std::sort(marks.begin(), marks.end(), [](const Mark& a, const Mark& b) { return a.nanos < b.nanos; });

  // Labels in rows, each placed in the first row where it does not overlap.
  constexpr double kCharWidth = 6.6, kRowHeight = 16;
  // A label that would run off the right edge ends at its mark instead.
  std::vector<double> row_end;
  std::vector<int> row_of(marks.size(), 0);
  std::vector<bool> flipped(marks.size(), false);
  for (size_t i = 0; i < marks.size(); ++i) {
    const double x = axis.X(marks[i].nanos);
    const double w = kCharWidth * static_cast<double>(marks[i].label.size()) + 8;
    flipped[i] = x + w > axis.left + axis.width + 20;
    const double begin = flipped[i] ? x - w : x, end = flipped[i] ? x : x + w;
    size_t r = 0;
    while (r < row_end.size() && row_end[r] > begin) ++r;
    if (r == row_end.size()) row_end.push_back(0);
    row_end[r] = end;
    row_of[i] = static_cast<int>(r);
  }
  const double label_top = 18;
  const double lanes_top = label_top + kRowHeight * static_cast<double>(std::max<size_t>(row_end.size(), 1)) + 8;
  const double fault_y = lanes_top, down_y = lanes_top + 24, ckpt_y = lanes_top + 48, axis_y = lanes_top + 76;
  const double height = axis_y + 30;

  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"timeline\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" role=\"img\">\n",
      axis.left + axis.width + 20, height, axis.left + axis.width + 20, height);
  absl::StrAppend(&s, "<title>", XmlEscape(absl::StrCat("Timeline of the ", d.scenario, " drill on job ", d.job)),
                  "</title>\n");
  // Lanes.
  for (const auto& [y, name] : std::vector<std::pair<double, const char*>>{
           {fault_y, "fault active"}, {down_y, "training down"}, {ckpt_y, "checkpoints"}}) {
    absl::StrAppendFormat(&s, "<text class=\"lane\" x=\"%.0f\" y=\"%.0f\">%s</text>\n", axis.left - 10, y + 13, name);
    absl::StrAppendFormat(&s, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", axis.left,
                          y + 18, axis.left + axis.width, y + 18);
  }
  auto band = [&](int64_t from, int64_t to, double y, const char* cls, const std::string& title) {
    const double x0 = axis.X(from), x1 = std::max(axis.X(to), x0 + 2);
    absl::StrAppendFormat(&s, "<rect class=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"16\"><title>%s</title></rect>\n",
                          cls, x0, y + 1, x1 - x0, XmlEscape(title));
  };
  if (d.injected) {
    const int64_t until = st.report().ended() && st.report().ended_unix_nanos() > 0 ? st.report().ended_unix_nanos()
                          : lasting                                                   ? axis.to
                                                                                      : injected_at;
    band(injected_at, until, fault_y, "band-fault",
         absl::StrFormat("fault active %.3f s", SecondsBetween(injected_at, until)));
  }
  if (st.resumed() && st.failed_unix_nanos() > 0) {
    band(st.failed_unix_nanos(), st.resumed_unix_nanos(), down_y, "band-down",
         absl::StrFormat("from the failure to the first step after the restore: %.3f s",
                         SecondsBetween(st.failed_unix_nanos(), st.resumed_unix_nanos())));
  }
  for (const StepEntry& e : d.steps) {
    const int64_t t = e.committed_unix_nanos();
    if (t <= 0 || t < axis.from || t > axis.to) continue;
    const double x = axis.X(t);
    absl::StrAppendFormat(&s,
                          "<line class=\"%s\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"><title>%s</title></line>\n",
                          e.state() == ckptd::v1::STEP_QUARANTINED ? "ckpt-bad" : "ckpt", x, ckpt_y + 2, x, ckpt_y + 17,
                          XmlEscape(absl::StrCat("step ", e.step(), " committed",
                                                 e.state() == ckptd::v1::STEP_QUARANTINED
                                                     ? absl::StrCat(", then quarantined: ", e.reason())
                                                     : "")));
  }
  // Marks: a line down to the axis and the label in its row.
  for (size_t i = 0; i < marks.size(); ++i) {
    const Mark& m = marks[i];
    if (m.nanos <= 0) continue;
    const double x = axis.X(m.nanos);
    const double y = label_top + kRowHeight * row_of[i];
    absl::StrAppendFormat(&s, "<g class=\"mark %s\"><title>%s</title>", m.cls,
                          XmlEscape(absl::StrCat(m.label, " at ", TickLabel(SecondsBetween(axis.origin, m.nanos)),
                                                 m.title.empty() ? "" : ": ", m.title)));
    absl::StrAppendFormat(&s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", x, y + 3, x, axis_y);
    absl::StrAppendFormat(&s, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\"/>", x, axis_y);
    absl::StrAppendFormat(&s, "<text x=\"%.1f\" y=\"%.1f\"%s>%s</text></g>\n", flipped[i] ? x - 3 : x + 3, y,
                          flipped[i] ? " text-anchor=\"end\"" : "", XmlEscape(m.label));
  }
  // The axis, in seconds from the injection.
  absl::StrAppendFormat(&s, "<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", axis.left,
                        axis_y, axis.left + axis.width, axis_y);
  const double lo = SecondsBetween(axis.origin, axis.from), hi = SecondsBetween(axis.origin, axis.to);
  const double step = TickStep(hi - lo);
  for (double t = std::ceil(lo / step) * step; t <= hi; t += step) {
    const double x = axis.X(axis.origin + static_cast<int64_t>(t * 1e9));
    absl::StrAppendFormat(&s,
                          "<line class=\"tick\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                          "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                          x, axis_y, x, axis_y + 5, x, axis_y + 18, TickLabel(t));
  }
  s += "</svg>\n";
  return s;
}

std::string Figure(bool known, const std::string& text) { return known ? text : "-"; }

std::string DetectionText(const DrillOutcome& d) {
  const std::optional<double> s = d.detection_seconds();
  return s ? absl::StrFormat("%.3f s", *s) : "-";
}

std::string RestoredText(const DrillOutcome& d) {
  if (!d.status.resumed()) return "-";
  return d.status.fresh_start() ? "fresh start" : absl::StrCat("step ", d.status.restored_step());
}

std::string DrillTitle(const DrillOutcome& d) {
  return absl::StrCat(d.scenario, " on node ", d.status.node_id(),
                      d.status.request().target_node().empty() ? absl::StrCat(" (rank ", d.status.request().rank(), ")")
                                                               : "");
}

constexpr char kPageStyle[] = R"(
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .6em 0; }
td, th { border-bottom: 1px solid #ddd; padding: .25em .8em .25em 0; text-align: left; vertical-align: top; }
th { font-weight: 600; }
.pass { color: #17803d; font-weight: 600; } .fail { color: #c0262d; font-weight: 600; }
.muted { color: #777; }
svg.timeline { display: block; margin: .8em 0; font: 11px system-ui, sans-serif; }
svg .lane { text-anchor: end; fill: #555; }
svg .grid { stroke: #eee; }
svg .axis { stroke: #444; } svg .tick { stroke: #444; fill: #444; text-anchor: middle; }
svg .band-fault { fill: #f0a04b; opacity: .7; } svg .band-down { fill: #d9534f; opacity: .6; }
svg .ckpt { stroke: #2e8b57; stroke-width: 2; } svg .ckpt-bad { stroke: #c0262d; stroke-width: 3; }
svg .mark line { stroke-dasharray: 3 3; stroke: #888; }
svg .mark.ordered circle { fill: #888; } svg .mark.fault circle { fill: #e67e22; }
svg .mark.detect circle { fill: #c0262d; } svg .mark.verify circle { fill: #2a6fdb; }
svg .mark.lifted circle { fill: #b08900; } svg .mark.resume circle { fill: #17803d; }
)";

void AppendDrillSection(const DrillOutcome& d, size_t index, std::string* s) {
  const bool pass = d.passed();
  absl::StrAppend(s, "<section id=\"drill-", index, "\">\n<h2>", index, ". ", XmlEscape(DrillTitle(d)),
                  ": <span class=\"", pass ? "pass\">PASS" : "fail\">FAIL", "</span></h2>\n");
  absl::StrAppend(s, "<p class=\"muted\">drill ", d.status.drill_id(), " of job ", XmlEscape(d.job), ", ordered ",
                  XmlEscape(IsoTime(d.status.ordered_unix_nanos())),
                  d.injected ? absl::StrCat("; ", XmlEscape(d.status.report().detail())) : "", "</p>\n");
  *s += TimelineSvg(d);
  *s += "<table>\n";
  auto row = [&](const std::string& k, const std::string& v) {
    absl::StrAppend(s, "<tr><th>", XmlEscape(k), "</th><td>", XmlEscape(v), "</td></tr>\n");
  };
  row("detection", DetectionText(d));
  row("step restored", RestoredText(d));
  row("step at the failure", Figure(d.status.resumed(), absl::StrCat(d.status.step_at_failure())));
  row("work lost", Figure(d.status.resumed(), absl::StrFormat("%d steps (%.1f s at %.3f s per step)", d.lost_steps,
                                                              d.lost_seconds, d.status.step_seconds())));
  row("restart", Figure(d.status.resumed(), absl::StrFormat("%.3f s from the failure to the first step after the "
                                                            "restore",
                                                            d.restart_seconds)));
  if (d.restored_verified) {
    row("restored step verified",
        d.restored_verified->ok() ? absl::StrCat("intact: ", d.restored_verified->shards_done(), " shards, ",
                                                 HumanBytes(d.restored_verified->bytes_done()))
                                  : absl::StrCat(d.restored_verified->problems_size(), " problem(s)"));
  } else if (!d.restored_unverified_reason.empty()) {
    row("restored step verified", absl::StrCat("no: ", d.restored_unverified_reason));
  }
  *s += "</table>\n<table>\n<tr><th>verdict</th><th>expectation</th><th>detail</th></tr>\n";
  for (const DrillVerdict& v : d.verdicts) {
    absl::StrAppend(s, "<tr><td class=\"", v.held ? "pass\">PASS" : "fail\">FAIL", "</td><td>",
                    XmlEscape(v.expectation), "</td><td>", XmlEscape(v.detail), "</td></tr>\n");
  }
  *s += "</table>\n";
  if (!d.status.events().empty()) {
    *s += "<table>\n<tr><th>failure recorded</th><th>at</th><th>where</th><th>detail</th></tr>\n";
    const int64_t origin = d.injected ? d.status.report().injected_unix_nanos() : d.status.ordered_unix_nanos();
    for (const auto& e : d.status.events()) {
      absl::StrAppend(s, "<tr><td>", FailureKindName(e.kind()), "</td><td>",
                      XmlEscape(TickLabel(SecondsBetween(origin, e.unix_nanos()))), "</td><td>",
                      XmlEscape(absl::StrCat(e.node_id(), e.has_rank() ? absl::StrCat(" rank ", e.rank()) : "")),
                      "</td><td>", XmlEscape(e.detail()), "</td></tr>\n");
    }
    *s += "</table>\n";
  }
  *s += "</section>\n";
}

// --html FILE, when given: writes the page. False (and says why) when it
// cannot.
bool MaybeWriteHtml(const Args& args, const std::vector<DrillOutcome>& drills, absl::string_view title,
                    const std::string& command, std::ostream& out, std::ostream& err) {
  std::optional<std::string> path = args.Get("html");
  if (!path) return true;
  if (absl::Status s = WriteTextFile(*path, DrillHtmlPage(drills, title)); !s.ok()) {
    err << "ckptctl " << command << ": --html: " << s.message() << "\n";
    return false;
  }
  if (!args.Has("json")) out << "report written to " << *path << "\n";
  return true;
}

// One line of a suite file, parsed.
struct SuiteLine {
  int number = 0;
  std::string text;
  DrillSpec spec;
};

constexpr size_t kMaxSuiteBytes = 1 << 20;
constexpr size_t kMaxSuiteDrills = 1000;

// The drills in `path`; an error naming the file and the line when one is bad.
absl::StatusOr<std::vector<SuiteLine>> ReadSuite(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read the suite file ", path));
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("cannot read the suite file ", path));
  if (content.size() > kMaxSuiteBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the suite file ", path, " is larger than 1 MiB"));
  }
  std::vector<SuiteLine> lines;
  int number = 0;
  for (absl::string_view raw : absl::StrSplit(content, '\n')) {
    ++number;
    absl::string_view line = raw;
    // A comment runs from a word starting with # to the end of the line.
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
        line = line.substr(0, i);
        break;
      }
    }
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(path, " line ", number, ": ", why));
    };
    for (char c : line) {
      if (static_cast<unsigned char>(c) < 0x20 && c != '\t') return bad("holds a control character");
    }
    std::vector<std::string> words = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string scenario = words[0];
    words.erase(words.begin());
    absl::StatusOr<Args> args = Args::Parse(words, DrillValueFlags(), {});
    if (!args.ok()) return bad(args.status().message());
    if (!args->positional().empty()) return bad(absl::StrCat("unexpected \"", args->positional()[0], "\""));
    absl::StatusOr<DrillSpec> spec = ParseDrillSpec(scenario, *args, "the scenario");
    if (!spec.ok()) return bad(spec.status().message());
    if (lines.size() == kMaxSuiteDrills) return bad("more than 1000 drills");
    lines.push_back({number, std::string(line), *std::move(spec)});
  }
  if (lines.empty()) return absl::InvalidArgumentError(absl::StrCat("the suite file ", path, " lists no drill"));
  return lines;
}

int RunOne(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
           std::ostream& err, const OperatorEnv& env) {
  Command c("drill run", kDrillHelp, out, err);
  std::set<std::string> value_flags = DrillValueFlags();
  value_flags.insert({"job", "scenario", "html"});
  if (std::optional<int> done = c.Start(argv, value_flags, {"no-verify-restored"}, true, api)) return *done;
  absl::StatusOr<DrillSpec> spec = ParseDrillSpec(c.args().Get("scenario").value_or(""), c.args(), "--scenario");
  if (!spec.ok()) return c.Usage(spec.status().message());
  DrillRunner runner(c.api(), c.job(), env, !c.args().Has("no-verify-restored"), c.json() ? nullptr : &out);
  RpcError error;
  absl::StatusOr<DrillOutcome> d = runner.Run(*spec, &error);
  if (!d.ok()) return c.Fail(error.rpc, error.status);
  if (d->status.has_report() && !d->status.report().error().empty()) {
    err << "ckptctl drill run: node " << d->status.node_id()
        << " did not carry the drill out: " << d->status.report().error() << "\n";
  }
  if (c.json()) {
    JsonWriter w;
    WriteDrillJson(*d, w);
    out << w.str() << "\n";
  } else {
    PrintDrillReport(*d, out);
  }
  const bool written = MaybeWriteHtml(c.args(), {*d}, absl::StrCat("ckptd drill: ", DrillTitle(*d)), "drill run", out,
                                      err);
  return d->passed() && written ? kExitOk : kExitFailed;
}

int RunSuite(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
             std::ostream& err, const OperatorEnv& env) {
  Command c("drill suite", kDrillSuiteHelp, out, err);
  if (std::optional<int> done =
          c.Start(argv, {"job", "settle", "html"}, {"stop-on-failure", "no-verify-restored"}, true, api, 1)) {
    return *done;
  }
  if (c.args().positional().empty()) return c.Usage("the suite FILE is required");
  const std::string file = c.args().positional()[0];
  absl::StatusOr<absl::Duration> settle = PositiveDuration(c.args(), "settle", absl::Minutes(2));
  if (!settle.ok()) return c.Usage(settle.status().message());
  absl::StatusOr<std::vector<SuiteLine>> lines = ReadSuite(file);
  if (!lines.ok()) return c.Usage(lines.status().message());

  DrillRunner runner(c.api(), c.job(), env, !c.args().Has("no-verify-restored"), c.json() ? nullptr : &out);
  std::vector<DrillOutcome> drills;
  std::vector<const SuiteLine*> ran;
  std::string stopped;  // why the suite ended early
  int64_t previous_end = 0;
  for (const SuiteLine& line : *lines) {
    if (!c.json()) {
      out << (drills.empty() ? "" : "\n") << "=== drill " << drills.size() + 1 << "/" << lines->size() << " (line "
          << line.number << "): " << line.text << "\n"
          << std::flush;
    }
    RpcError error;
    absl::Status healthy = runner.Settle(previous_end, *settle, &error);
    if (!healthy.ok()) {
      if (!error.rpc.empty()) return c.Fail(error.rpc, error.status);
      stopped = std::string(healthy.message());
      break;
    }
    absl::StatusOr<DrillOutcome> d = runner.Run(line.spec, &error);
    if (!d.ok()) return c.Fail(error.rpc, error.status);
    if (!c.json()) PrintDrillReport(*d, out);
    previous_end = d->ended_unix_nanos;
    drills.push_back(*std::move(d));
    ran.push_back(&line);
    if (!drills.back().passed() && c.args().Has("stop-on-failure")) {
      stopped = absl::StrCat("line ", line.number, " failed (--stop-on-failure)");
      break;
    }
  }
  size_t passed = 0;
  for (const DrillOutcome& d : drills) passed += d.passed() ? 1 : 0;
  const size_t not_run = lines->size() - drills.size();
  const bool all = passed == lines->size();
  if (c.json()) {
    JsonWriter w;
    w.BeginObject();
    w.Field("job", c.job());
    w.Field("file", file);
    w.Key("drills");
    w.BeginArray();
    for (size_t i = 0; i < drills.size(); ++i) {
      w.BeginObject();
      w.Field("line", ran[i]->number);
      w.Field("spec", ran[i]->text);
      w.Key("report");
      WriteDrillJson(drills[i], w);
      w.EndObject();
    }
    w.EndArray();
    w.Key("not_run");
    w.BeginArray();
    for (size_t i = drills.size(); i < lines->size(); ++i) {
      w.BeginObject();
      w.Field("line", (*lines)[i].number);
      w.Field("spec", (*lines)[i].text);
      w.EndObject();
    }
    w.EndArray();
    w.Field("stopped", stopped);
    w.Field("drills_passed", static_cast<uint64_t>(passed));
    w.Field("drills_failed", static_cast<uint64_t>(drills.size() - passed));
    w.Field("drills_not_run", static_cast<uint64_t>(not_run));
    w.Field("passed", all);
    w.EndObject();
    out << w.str() << "\n";
  } else {
    out << "\nsuite summary: job " << c.job() << ", " << file << "\n";
    Table t({"#", "line", "scenario", "target", "node", "detected", "restored", "lost", "verdict"}, {0, 1});
    for (size_t i = 0; i < drills.size(); ++i) {
      const DrillOutcome& d = drills[i];
      t.Add({absl::StrCat(i + 1), absl::StrCat(ran[i]->number), d.scenario, d.target.empty() ? "-" : d.target,
             d.status.node_id(), DetectionText(d), RestoredText(d),
             d.status.resumed() ? absl::StrCat(d.lost_steps, " steps") : "-", d.passed() ? "PASS" : "FAIL"});
    }
    for (size_t i = drills.size(); i < lines->size(); ++i) {
      t.Add({absl::StrCat(i + 1), absl::StrCat((*lines)[i].number), (*lines)[i].spec.info->name,
             (*lines)[i].spec.target.empty() ? "-" : (*lines)[i].spec.target, "-", "-", "-", "-", "not run"});
    }
    t.Print(out);
    if (!stopped.empty()) out << "stopped early: " << stopped << "\n";
    out << "suite: " << (all ? "PASS" : "FAIL") << " (" << passed << " of " << lines->size() << " drills passed"
        << (not_run > 0 ? absl::StrCat(", ", not_run, " not run") : "") << ")\n";
  }
  if (!stopped.empty() && !c.json()) err << "ckptctl drill suite: " << stopped << "\n";
  const bool written =
      MaybeWriteHtml(c.args(), drills, absl::StrCat("ckptd drill suite: ", file, " on job ", c.job()), "drill suite",
                     out, err);
  return all && written ? kExitOk : kExitFailed;
}

}  // namespace

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

void WriteDrillJson(const DrillOutcome& d, JsonWriter& w) {
  const ckptd::v1::DrillStatus& st = d.status;
  w.BeginObject();
  w.Field("drill_id", st.drill_id());
  w.Field("scenario", d.scenario);
  w.Field("job", d.job);
  w.Field("target", d.target);
  w.Field("node", st.node_id());
  w.Field("ordered_unix_nanos", st.ordered_unix_nanos());
  w.Field("injected", d.injected);
  w.Field("injected_unix_nanos", st.report().injected_unix_nanos());
  w.Field("detail", st.report().detail());
  w.Field("error", st.report().error());
  w.Key("detection_seconds");
  if (std::optional<double> s = d.detection_seconds()) {
    w.Double(*s);
  } else {
    w.Null();
  }
  w.Key("failures");
  w.BeginArray();
  for (const auto& e : st.events()) {
    w.BeginObject();
    w.Field("kind", FailureKindName(e.kind()));
    w.Field("node", e.node_id());
    if (e.has_rank()) w.Field("rank", e.rank());
    w.Field("unix_nanos", e.unix_nanos());
    w.Field("detail", e.detail());
    w.EndObject();
  }
  w.EndArray();
  w.Field("resumed", st.resumed());
  w.Field("fresh_start", st.fresh_start());
  w.Field("restored_step", st.restored_step());
  w.Field("step_at_failure", st.step_at_failure());
  w.Field("failed_unix_nanos", st.failed_unix_nanos());
  w.Field("resumed_unix_nanos", st.resumed_unix_nanos());
  w.Field("lost_steps", d.lost_steps);
  w.Field("lost_seconds", d.lost_seconds);
  w.Field("restart_seconds", d.restart_seconds);
  w.Field("fault_lifted", st.report().ended());
  w.Field("fault_lifted_unix_nanos", st.report().ended_unix_nanos());
  if (d.damaged_verified) w.Field("verified_step", d.damaged_verified->step());
  w.Key("restored_verified");
  if (d.restored_verified) {
    w.BeginObject();
    w.Field("step", d.restored_verified->step());
    w.Field("ok", d.restored_verified->ok());
    w.Field("shards", d.restored_verified->shards_done());
    w.Field("bytes", d.restored_verified->bytes_done());
    w.Key("problems");
    w.BeginArray();
    for (const std::string& p : d.restored_verified->problems()) w.String(p);
    w.EndArray();
    w.EndObject();
  } else {
    w.Null();
  }
  if (!d.restored_unverified_reason.empty()) w.Field("restored_unverified_reason", d.restored_unverified_reason);
  if (!d.restored_verify_error.empty()) w.Field("restored_verify_error", d.restored_verify_error);
  w.Key("commits");
  w.BeginArray();
  for (const StepEntry& e : d.steps) {
    if (e.committed_unix_nanos() < st.ordered_unix_nanos()) continue;
    w.BeginObject();
    w.Field("step", e.step());
    w.Field("state", StepStateName(e.state()));
    w.Field("committed_unix_nanos", e.committed_unix_nanos());
    w.EndObject();
  }
  w.EndArray();
  w.Key("verdict");
  w.BeginArray();
  for (const DrillVerdict& v : d.verdicts) {
    w.BeginObject();
    w.Field("expectation", v.expectation);
    w.Field("held", v.held);
    w.Field("detail", v.detail);
    w.EndObject();
  }
  w.EndArray();
  w.Field("passed", d.passed());
  w.EndObject();
}

void PrintDrillReport(const DrillOutcome& d, std::ostream& out) {
  const ckptd::v1::DrillStatus& st = d.status;
  const int64_t injected_at = st.report().injected_unix_nanos();
  auto at = [&](int64_t nanos) {
    return injected_at > 0 ? absl::StrFormat("%+8.3f s", SecondsBetween(injected_at, nanos)) : IsoTime(nanos);
  };
  out << "\ntimeline (from the injection)\n";
  out << "  " << at(st.ordered_unix_nanos()) << "  ordered\n";
  if (d.injected) out << "  " << at(injected_at) << "  injected: " << st.report().detail() << "\n";
  for (const auto& e : st.events()) {
    out << "  " << at(e.unix_nanos()) << "  detected " << FailureKindName(e.kind())
        << (e.node_id().empty() ? "" : " on ") << e.node_id()
        << (e.has_rank() ? absl::StrCat(" rank ", e.rank()) : "") << ": " << e.detail() << "\n";
  }
  if (d.damaged_verified) {
    out << "  " << at(d.damaged_verified_unix_nanos) << "  verified step " << d.damaged_verified->step() << ": "
        << (d.damaged_verified->ok() ? "intact" : absl::StrCat(d.damaged_verified->problems_size(), " problem(s)"))
        << "\n";
  }
  if (st.report().ended()) out << "  " << at(st.report().ended_unix_nanos()) << "  fault lifted\n";
  if (st.resumed()) {
    out << "  " << at(st.resumed_unix_nanos()) << "  training resumed from "
        << (st.fresh_start() ? std::string("a fresh start") : absl::StrCat("step ", st.restored_step())) << "\n";
  }
  if (d.restored_verified) {
    out << "  " << at(d.restored_verified_unix_nanos) << "  verified the restored step "
        << d.restored_verified->step() << ": "
        << (d.restored_verified->ok() ? "intact" : absl::StrCat(d.restored_verified->problems_size(), " problem(s)"))
        << "\n";
  } else if (!d.restored_unverified_reason.empty()) {
    out << "  restored step not verified: " << d.restored_unverified_reason << "\n";
  }
  if (st.resumed()) {
    out << absl::StrFormat("\nwork lost    %d steps (%.1f s at %.3f s per step)\nrestart      %.3f s from the "
                           "failure to the first step after the restore\n",
                           d.lost_steps, d.lost_seconds, st.step_seconds(), d.restart_seconds);
  }
  out << "\nverdict\n";
  for (const DrillVerdict& v : d.verdicts) {
    out << "  " << (v.held ? "PASS" : "FAIL") << "  " << v.expectation << (v.detail.empty() ? "" : ": ") << v.detail
        << "\n";
  }
  out << (d.passed() ? "drill: PASS\n" : "drill: FAIL\n");
}

std::string DrillHtmlPage(const std::vector<DrillOutcome>& drills, absl::string_view title) {
  size_t passed = 0;
  for (const DrillOutcome& d : drills) passed += d.passed() ? 1 : 0;
  std::string s = absl::StrCat("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>",
                               XmlEscape(title), "</title>\n<style>", kPageStyle, "</style>\n</head>\n<body>\n<h1>",
                               XmlEscape(title), "</h1>\n");
  absl::StrAppend(&s, "<p>", passed, " of ", drills.size(), " drill", drills.size() == 1 ? "" : "s",
                  " passed: <span class=\"", passed == drills.size() && !drills.empty() ? "pass\">PASS" : "fail\">FAIL",
                  "</span></p>\n");
  s += "<table>\n<tr><th>#</th><th>drill</th><th>detected</th><th>restored</th><th>work lost</th>"
       "<th>restart</th><th>verdict</th></tr>\n";
  for (size_t i = 0; i < drills.size(); ++i) {
    const DrillOutcome& d = drills[i];
    absl::StrAppend(&s, "<tr><td>", i + 1, "</td><td><a href=\"#drill-", i + 1, "\">", XmlEscape(DrillTitle(d)),
                    "</a></td><td>", DetectionText(d), "</td><td>", RestoredText(d), "</td><td>",
                    d.status.resumed() ? absl::StrFormat("%d steps, %.1f s", d.lost_steps, d.lost_seconds) : "-",
                    "</td><td>", d.status.resumed() ? absl::StrFormat("%.3f s", d.restart_seconds) : "-",
                    "</td><td class=\"", d.passed() ? "pass\">PASS" : "fail\">FAIL", "</td></tr>\n");
  }
  s += "</table>\n";
  for (size_t i = 0; i < drills.size(); ++i) AppendDrillSection(drills[i], i + 1, &s);
  s += "<p class=\"muted\">Times on the timelines are seconds from the injection. Hover over a mark for its "
       "detail.</p>\n</body>\n</html>\n";
  return s;
}

int RunDrillCommand(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
                    std::ostream& err, const OperatorEnv& env) {
  if (!argv.empty() && (argv[0] == "--help" || argv[0] == "-h")) {
    out << kDrillHelp;
    return kExitOk;
  }
  const std::vector<std::string> rest(argv.empty() ? argv.end() : argv.begin() + 1, argv.end());
  if (!argv.empty() && argv[0] == "run") return RunOne(rest, api, out, err, env);
  if (!argv.empty() && argv[0] == "suite") return RunSuite(rest, api, out, err, env);
  err << "ckptctl drill: expected `drill run` or `drill suite`\n(`ckptctl drill --help` describes them)\n";
  return kExitUsage;
}

}  // namespace ckptd::cli
