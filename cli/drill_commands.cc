#include "cli/drill_commands.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/json.h"
#include "base/limits.h"
#include "cli/command.h"
#include "cli/drill_report.h"
#include "cli/drill_runner.h"

namespace ckptd::cli {

const char kDrillHelp[] =
    "usage: ckptctl drill run --job J --scenario S [--target RANK|NODE] [--at-step N]\n"
    "                         [--duration 10s] [--slow 200ms] [--watch 2m] [--with-partners]\n"
    "                         [--no-verify-restored]\n"
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
    "  hang-trainer     SIGSTOP it for --duration; expects the trainer let go (SIGCONT)\n"
    "                   once --duration has run out, and the hang detected and the job\n"
    "                   restarted when --duration outlasts the coordinator's hang threshold\n"
    "  kill-agent       SIGKILL the agent of the rank's node (or of node --target)\n"
    "  kill-node        a node crash: the agent SIGKILLs every trainer on its node, then\n"
    "                   itself (the rank's node, or node --target); with --with-partners,\n"
    "                   the nodes it replicates its snapshots to crash too, so that no\n"
    "                   copy of its ranks is left in any memory\n"
    "  cut-off-agent    the agent talks to nobody for --duration; expects the node lost\n"
    "  corrupt-shard    flip a byte of the rank's shard of the newest committed step; the\n"
    "                   drill then verifies that step through the coordinator and expects\n"
    "                   it quarantined and never chosen for a restore\n"
    "  corrupt-memory   flip a byte of the rank's copy of the newest committed step in its\n"
    "                   agent's memory, then SIGKILL its trainer; expects detection, a restart\n"
    "                   from that step, and the rank reading it from disk (node-local or the\n"
    "                   storage root): the damaged copy is caught by its checksums, never used\n"
    "  storage-eio      the agent's checkpoint storage fails with EIO for --duration\n"
    "  storage-enospc   ... fails with ENOSPC (a full disk) for --duration\n"
    "  storage-slow     ... waits --slow per operation for --duration; for the three\n"
    "                   storage scenarios training must go on without a restart and\n"
    "                   checkpoints commit again once the fault is lifted\n"
    "  kill-coordinator replicated coordinators only (no --target): the leading\n"
    "                   coordinator SIGKILLs itself just after it answers; expects a\n"
    "                   standby to lead within 10 s, a step committed after the kill,\n"
    "                   nothing partial committed, and training going on; the report\n"
    "                   gives the time to the new leader and to the next commit\n"
    "\n"
    "  --target T       a rank number of the job (0..1048575), or a node id (agent and storage\n"
    "                   scenarios)\n"
    "  --at-step N      inject once the target rank reaches step N, 0..2^62 (default: at once)\n"
    "  --duration D     how long a hang, cut-off or storage fault lasts, at most 1h (default 10s)\n"
    "  --slow D         the delay per storage operation of storage-slow, at most 60s (default\n"
    "                   200ms)\n"
    "  --watch D        how long to watch after the injection, at most 24h (default 2m); a fault\n"
    "                   that lasts --duration must be lifted within it\n"
    "  --with-partners  kill-node only: also crash the node's replication partners (the\n"
    "                   agents it sends its snapshots to, as the coordinator assigned them\n"
    "                   when it takes the order); the report names them. Refused unless\n"
    "                   every partner's agent runs with --allow-drills\n"
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
    "--watch, --with-partners); a # starts a comment that runs to the end of the line.\n"
    "For example:\n"
    "\n"
    "  # rehearse the failures of the week\n"
    "  kill-trainer   --target 3\n"
    "  corrupt-shard  --target 0\n"
    "  corrupt-memory --target 1\n"
    "  storage-enospc --target node-7 --duration 30s\n"
    "\n"
    "Before each drill the suite waits until the job is healthy again: running,\n"
    "every rank alive, and (after the first drill) a step committed since the\n"
    "previous drill ended, so that every drill starts from a fresh checkpoint. A job\n"
    "that does not get there within --settle ends the suite; the drills left are\n"
    "reported as not run.\n"
    "\n"
    "  FILE             the drills; the whole file is checked before the first one runs\n"
    "  --settle D       how long to wait for the job to be healthy before a drill, at most 24h\n"
    "                   (default 2m)\n"
    "  --stop-on-failure\n"
    "                   stop after the first drill whose verdict fails\n"
    "  --no-verify-restored, --json, --html FILE\n"
    "                   as for `drill run`; the JSON object and the page hold every drill\n"
    "\n"
    "exit status: 0 every drill passed, 1 one failed, could not be carried out or\n"
    "was not run, 2 usage error (a bad line of FILE is named with its number), 3 the\n"
    "coordinator cannot be reached\n";

namespace {

// The drill's flags, besides the coordinator's.
const std::set<std::string>& DrillValueFlags() {
  static const std::set<std::string> flags = {"target", "at-step", "duration", "slow", "watch"};
  return flags;
}

// A positive duration flag of at most `max`, or `fallback` when absent.
absl::StatusOr<absl::Duration> PositiveDuration(const base::Args& args, const std::string& flag,
                                                absl::Duration fallback, absl::Duration max) {
  std::optional<std::string> v = args.Get(flag);
  if (!v) return fallback;
  absl::Duration d;
  if (!absl::ParseDuration(*v, &d) || d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", *v, "\" is not a positive duration (e.g. 10s)"));
  }
  if (d > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be at most ", absl::FormatDuration(max), ", got \"", *v, "\""));
  }
  return d;
}

// The coordinator's limits on a drill (coordinator_drills.cc), said here
// before anything is sent, and how long the runner may wait.
constexpr absl::Duration kMaxDrillDuration = absl::Hours(1);
constexpr absl::Duration kMaxSlowPerOperation = absl::Seconds(60);
constexpr absl::Duration kMaxWait = absl::Hours(24);
constexpr uint64_t kMaxStep = uint64_t{1} << 62;

// The drill that `scenario` and the drill flags in `args` describe; errors
// call the scenario `label`.
absl::StatusOr<DrillSpec> ParseDrillSpec(const std::string& scenario, const base::Args& args, absl::string_view label) {
  DrillSpec spec;
  std::vector<std::string> names;
  for (const DrillScenarioInfo& s : kDrillScenarios) {
    names.push_back(s.name);
    if (scenario == s.name) spec.info = &s;
  }
  if (spec.info == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(label, " must be one of ", absl::StrJoin(names, ", "),
                                                   scenario.empty() ? "" : absl::StrCat("; got \"", scenario, "\"")));
  }
  absl::StatusOr<absl::Duration> duration = PositiveDuration(args, "duration", absl::Seconds(10), kMaxDrillDuration);
  absl::StatusOr<absl::Duration> slow = PositiveDuration(args, "slow", absl::Milliseconds(200), kMaxSlowPerOperation);
  absl::StatusOr<absl::Duration> watch = PositiveDuration(args, "watch", absl::Minutes(2), kMaxWait);
  for (const absl::Status& s : {duration.status(), slow.status(), watch.status()}) {
    if (!s.ok()) return s;
  }
  absl::StatusOr<std::optional<uint64_t>> at_step = args.GetUintInRange("at-step", 0, kMaxStep);
  if (!at_step.ok()) return at_step.status();
  spec.watch = *watch;
  ckptd::v1::RunDrillRequest& req = spec.request;
  req.set_scenario(spec.info->scenario);
  if (std::optional<std::string> target = args.Get("target")) {
    spec.target = *target;
    // Digits are a rank, parsed wide and checked before it is narrowed: a
    // rank past 32 bits is an error, never another rank or a node name.
    const bool digits =
        !target->empty() && std::all_of(target->begin(), target->end(), [](char c) { return absl::ascii_isdigit(c); });
    uint64_t rank = 0;
    if (digits) {
      if (!absl::SimpleAtoi(*target, &rank) || rank >= base::kMaxWorldSize) {
        return absl::InvalidArgumentError(
            absl::StrCat("--target: rank ", *target, " is outside 0..", base::kMaxWorldSize - 1));
      }
      req.set_rank(static_cast<uint32_t>(rank));
    } else if (spec.info->node_level) {
      req.set_target_node(*target);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--target of ", spec.info->name, " is a rank number; got \"", *target, "\""));
    }
  }
  if (spec.info->scenario == ckptd::v1::KILL_COORDINATOR && (args.Has("target") || args.Has("at-step"))) {
    return absl::InvalidArgumentError("kill-coordinator strikes the leading coordinator at once: no --target or --at-step");
  }
  if (args.Has("with-partners")) {
    if (spec.info->scenario != ckptd::v1::KILL_NODE) {
      return absl::InvalidArgumentError(
          absl::StrCat("--with-partners applies to kill-node only, not to ", spec.info->name));
    }
    req.set_with_partners(true);
  }
  req.set_at_step(at_step->value_or(0));
  if (spec.info->timed) req.set_duration_seconds(absl::ToDoubleSeconds(*duration));
  if (spec.info->scenario == ckptd::v1::STORAGE_SLOW) req.set_slow_seconds(absl::ToDoubleSeconds(*slow));
  return spec;
}

// --html FILE, when given: writes the page. False (and says why) when it
// cannot.
bool MaybeWriteHtml(const base::Args& args, const std::vector<DrillOutcome>& drills, absl::string_view title,
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
    absl::StatusOr<base::Args> args = base::Args::Parse(words, DrillValueFlags(), {"with-partners"});
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

int RunOne(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out, std::ostream& err,
           const OperatorEnv& env) {
  Command c("drill run", kDrillHelp, out, err);
  std::set<std::string> value_flags = DrillValueFlags();
  value_flags.insert({"job", "scenario", "html"});
  if (std::optional<int> done = c.Start(argv, value_flags, {"no-verify-restored", "with-partners"}, true, api)) {
    return *done;
  }
  absl::StatusOr<DrillSpec> spec = ParseDrillSpec(c.args().Get("scenario").value_or(""), c.args(), "--scenario");
  if (!spec.ok()) return c.Usage(spec.status().message());
  DrillRunner runner(c.api(), c.job(), env, !c.args().Has("no-verify-restored"), c.json() ? nullptr : &out);
  RpcError error;
  absl::StatusOr<DrillOutcome> d = runner.Run(*spec, &error);
  if (!d.ok()) return c.Fail(error.rpc, error.status);
  if (d->status.has_report() && !d->status.report().error().empty()) {
    err << "ckptctl drill run: node " << TerminalSafe(d->status.node_id())
        << " did not carry the drill out: " << TerminalSafe(d->status.report().error()) << "\n";
  }
  if (c.json()) {
    JsonWriter w;
    WriteDrillJson(*d, w);
    out << w.str() << "\n";
  } else {
    PrintDrillReport(*d, out);
  }
  const bool written =
      MaybeWriteHtml(c.args(), {*d}, absl::StrCat("ckptd drill: ", DrillTitle(*d)), "drill run", out, err);
  return d->passed() && written ? base::kExitOk : base::kExitFailed;
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
  absl::StatusOr<absl::Duration> settle = PositiveDuration(c.args(), "settle", absl::Minutes(2), kMaxWait);
  if (!settle.ok()) return c.Usage(settle.status().message());
  absl::StatusOr<std::vector<SuiteLine>> lines = ReadSuite(file);
  if (!lines.ok()) return c.Usage(lines.status().message());

  SuiteReport suite;
  suite.job = c.job();
  suite.file = file;
  for (const SuiteLine& line : *lines) {
    suite.lines.push_back({line.number, line.text, line.spec.info->name, line.spec.target});
  }
  DrillRunner runner(c.api(), c.job(), env, !c.args().Has("no-verify-restored"), c.json() ? nullptr : &out);
  int64_t previous_end = 0;
  for (const SuiteLine& line : *lines) {
    if (!c.json()) {
      out << (suite.drills.empty() ? "" : "\n") << "=== drill " << suite.drills.size() + 1 << "/" << lines->size()
          << " (line " << line.number << "): " << TerminalSafe(line.text) << "\n"
          << std::flush;
    }
    RpcError error;
    absl::Status healthy = runner.Settle(previous_end, *settle, &error);
    if (!healthy.ok()) {
      if (!error.rpc.empty()) return c.Fail(error.rpc, error.status);
      suite.stopped = std::string(healthy.message());
      break;
    }
    absl::StatusOr<DrillOutcome> d = runner.Run(line.spec, &error);
    if (!d.ok()) return c.Fail(error.rpc, error.status);
    if (!c.json()) PrintDrillReport(*d, out);
    previous_end = d->ended_unix_nanos;
    suite.drills.push_back(*std::move(d));
    if (!suite.drills.back().passed() && c.args().Has("stop-on-failure")) {
      suite.stopped = absl::StrCat("line ", line.number, " failed (--stop-on-failure)");
      break;
    }
  }
  if (c.json()) {
    JsonWriter w;
    WriteSuiteJson(suite, w);
    out << w.str() << "\n";
  } else {
    PrintSuiteSummary(suite, out);
    if (!suite.stopped.empty()) err << "ckptctl drill suite: " << TerminalSafe(suite.stopped) << "\n";
  }
  const bool written = MaybeWriteHtml(
      c.args(), suite.drills, absl::StrCat("ckptd drill suite: ", file, " on job ", c.job()), "drill suite", out, err);
  return suite.passed() && written ? base::kExitOk : base::kExitFailed;
}

}  // namespace

int RunDrillCommand(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
                    std::ostream& err, const OperatorEnv& env) {
  if (!argv.empty() && (argv[0] == "--help" || argv[0] == "-h")) {
    out << kDrillHelp;
    return base::kExitOk;
  }
  const std::vector<std::string> rest(argv.empty() ? argv.end() : argv.begin() + 1, argv.end());
  if (!argv.empty() && argv[0] == "run") return RunOne(rest, api, out, err, env);
  if (!argv.empty() && argv[0] == "suite") return RunSuite(rest, api, out, err, env);
  err << "ckptctl drill: expected `drill run` or `drill suite`\n(`ckptctl drill --help` describes them)\n";
  return base::kExitUsage;
}

}  // namespace ckptd::cli
