#include "cli/operator_commands.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "cli/json.h"
#include "cli/offline_commands.h"
#include "coordinator/operator_token.h"
#include "storage/posix_file_system.h"

namespace ckptd::cli {

using ckptd::v1::StepEntry;

const char kStatusHelp[] =
    "usage: ckptctl status --coordinator HOST:PORT [--job J] [--json]\n"
    "\n"
    "The cluster as the coordinator sees it: every agent (alive or lost, the time\n"
    "since its last heartbeat, the ranks it hosts), every job (state, world size,\n"
    "ranks alive, fastest and slowest rank's step, newest committed step, the\n"
    "schedule's every_steps, the interval policy's choice and its expected waste,\n"
    "step time, checkpoints committed and aborted, pending and quarantined\n"
    "steps), and the 10 newest failures with their age.\n"
    "\n"
    "  --coordinator HOST:PORT  the coordinator to ask\n"
    "  --tls-ca F --tls-cert F --tls-key F\n"
    "                           mutual TLS (PEM files), as the coordinator was started with\n"
    "  --job J                  only job J (and its failures)\n"
    "  --json                   one JSON object instead of the tables\n"
    "\n"
    "exit status: 0 success, 1 no such job (or the coordinator refused), 2 usage\n"
    "error, 3 the coordinator cannot be reached\n";

const char kCheckpointHelp[] =
    "usage: ckptctl checkpoint --job J --coordinator HOST:PORT --token-file F\n"
    "                          [--no-wait] [--timeout 10m] [--json]\n"
    "\n"
    "Asks for a manual checkpoint of job J. The coordinator picks a target step far\n"
    "enough ahead of the fastest rank that every rank hears of it in time. Then,\n"
    "unless --no-wait, follows the step every 250 ms, printing a line each time its\n"
    "progress changes (\"step 1240: 3/8 ranks durable\"), until:\n"
    "  - the step commits: exit 0;\n"
    "  - a newer step commits first (the requested one is passed over): exit 0, and\n"
    "    the output says which step holds the job's state (outcome \"superseded\");\n"
    "  - the step is aborted (a rank could not persist it, the job restarted):\n"
    "    exit 1 with the coordinator's reason;\n"
    "  - the step commits but is quarantined: exit 1;\n"
    "  - the timeout passes: exit 1 (the checkpoint stays scheduled).\n"
    "When a rank passed the target before it heard of it, the coordinator moves the\n"
    "checkpoint to a new step; the command says so and follows the new step.\n"
    "\n"
    "  --job J                  the job\n"
    "  --coordinator HOST:PORT  the coordinator to ask\n"
    "  --token-file F           the operator token: the file the coordinator wrote\n"
    "                           (<state-dir>/operator-token) or was started with\n"
    "                           (--operator-token-file)\n"
    "  --tls-ca F --tls-cert F --tls-key F\n"
    "                           mutual TLS (PEM files), as the coordinator was started with\n"
    "  --no-wait                print the target step and return at once\n"
    "  --timeout D              how long to wait: 90s, 10m, 1h30m or seconds (default 10m)\n"
    "  --json                   print nothing but one JSON object at the end: job,\n"
    "                           requested_step, target_step, outcome (requested,\n"
    "                           committed, superseded, aborted, quarantined, timeout),\n"
    "                           committed_step, ranks_reported, world_size, reason,\n"
    "                           waited_seconds\n"
    "\n"
    "exit status: 0 requested (--no-wait) or committed, 1 aborted, quarantined, timed\n"
    "out, no such job, the job cannot take one now (restarting, no live rank) or the\n"
    "token refused, 2 usage error, 3 the coordinator cannot be reached\n";

const char kListHelp[] =
    "usage: ckptctl list --job J --coordinator HOST:PORT [--json]\n"
    "\n"
    "Every step of job J the coordinator and its storage know, oldest first: its\n"
    "state (committed, quarantined, pending, aborted, incomplete), ranks reported of\n"
    "the world, stored size and compression ratio (raw/stored), when it committed\n"
    "(UTC), the slowest rank's persist time, and why it was aborted or quarantined\n"
    "(for a pending step: how long ago its first shard was reported).\n"
    "\n"
    "  --job J                  the job\n"
    "  --coordinator HOST:PORT  the coordinator to ask\n"
    "  --tls-ca F --tls-cert F --tls-key F\n"
    "                           mutual TLS (PEM files), as the coordinator was started with\n"
    "  --json                   one JSON object instead of the table (bytes, seconds,\n"
    "                           times in ISO 8601 UTC, unknown values null)\n"
    "\n"
    "exit status: 0 success, 1 no such job (or the coordinator is too old), 2 usage\n"
    "error, 3 the coordinator cannot be reached\n";

const char kRestorePlanHelp[] =
    "usage: ckptctl restore-plan --job J --coordinator HOST:PORT [--json]\n"
    "\n"
    "What a restart of job J would restore now, without starting a restore: the\n"
    "step (or a fresh start) and why, every newer step that would be passed over\n"
    "and why (pending, aborted, quarantined), the job's state and incarnation.\n"
    "\n"
    "  --job J                  the job\n"
    "  --coordinator HOST:PORT  the coordinator to ask\n"
    "  --tls-ca F --tls-cert F --tls-key F\n"
    "                           mutual TLS (PEM files), as the coordinator was started with\n"
    "  --json                   one JSON object instead of the text\n"
    "\n"
    "exit status: 0 success (a fresh start included), 1 no such job (or the\n"
    "coordinator is too old), 2 usage error, 3 the coordinator cannot be reached\n";

const char kDrillHelp[] =
    "usage: ckptctl drill run --job J --scenario S [--target RANK|NODE] [--at-step N]\n"
    "                         [--duration 10s] [--slow 200ms] [--watch 2m] [--json]\n"
    "                         --coordinator HOST:PORT --token-file F [--tls-ca F --tls-cert F --tls-key F]\n"
    "\n"
    "Rehearses a failure: the coordinator has the agent of the node concerned\n"
    "inject it (only agents started with --allow-drills do), then this command\n"
    "watches what follows and reports a timeline (injected, detected and the\n"
    "detection latency, failed, resumed), the step restored, the work lost in steps\n"
    "and seconds, the restart duration, and a verdict against what ckptd promises.\n"
    "Restarting the job's processes is the launcher's part (torchrun, Slurm, ...):\n"
    "the drill waits for the job to come back.\n"
    "\n"
    "scenarios (--target is a rank of the job unless said otherwise):\n"
    "  kill-trainer     SIGKILL the rank's trainer; expects detection, a restart from a\n"
    "                   committed step no newer than the failure\n"
    "  hang-trainer     SIGSTOP it for --duration; expects the hang to be detected when\n"
    "                   --duration outlasts the coordinator's hang threshold\n"
    "  kill-agent       SIGKILL the agent of the rank's node (or of node --target)\n"
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
    "  --json           one JSON object: the timeline, the figures and the verdict\n"
    "\n"
    "exit status: 0 every expectation held, 1 one did not (or the drill could not be\n"
    "carried out), 2 usage error, 3 the coordinator cannot be reached\n";

const char kOnlineVerifyHelp[] =
    "usage: ckptctl verify --job J [--step S] --coordinator HOST:PORT --token-file F\n"
    "                      [--timeout D] [--json]\n"
    "\n"
    "Online: the coordinator reads a committed step of job J back from its storage\n"
    "root and checks every shard against the MANIFEST and every chunk against its\n"
    "checksum; progress (shards and bytes done) is shown as it goes. Without\n"
    "--step, the newest committed step that is not quarantined. Problems name the\n"
    "file, tensor, block and chunk. A step found damaged is quarantined by the\n"
    "coordinator: no restore picks it any more (`ckptctl restore-plan` shows what\n"
    "one would pick instead).\n"
    "\n"
    "  --job J                  the job\n"
    "  --step S                 the step (default the newest committed one)\n"
    "  --coordinator HOST:PORT  the coordinator to ask\n"
    "  --token-file F           the operator token (see `ckptctl checkpoint --help`)\n"
    "  --tls-ca F --tls-cert F --tls-key F\n"
    "                           mutual TLS (PEM files), as the coordinator was started with\n"
    "  --timeout D              give up after D: 90s, 10m, 1h or seconds (default: no limit)\n"
    "  --json                   nothing but one JSON object at the end: job, step, ok,\n"
    "                           shards_total, shards_done, bytes_total, bytes_done,\n"
    "                           problems\n"
    "\n"
    "exit status: 0 the step verified, 1 a problem was found (or no such job or\n"
    "step, the token refused, the timeout passed), 2 usage error, 3 the coordinator\n"
    "cannot be reached\n";

namespace {

constexpr uint32_t kStatusEvents = 10;
constexpr absl::Duration kDefaultCheckpointTimeout = absl::Minutes(10);

// ------------------------------------------------------------- formatting

// "2024-05-01T12:00:00Z"; "-" for 0 (unknown).
std::string IsoTime(int64_t unix_nanos) {
  if (unix_nanos == 0) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixNanos(unix_nanos), absl::UTCTimeZone());
}

// "0.4 s", "12 s", "5.2 min", "3.1 h", "2.0 d".
std::string ShortDuration(double s) {
  if (!std::isfinite(s)) return "-";
  if (s < 0) s = 0;  // clock skew between the coordinator and here
  if (s < 10) return absl::StrFormat("%.1f s", s);
  if (s < 120) return absl::StrFormat("%.0f s", s);
  if (s < 7200) return absl::StrFormat("%.1f min", s / 60);
  if (s < 172800) return absl::StrFormat("%.1f h", s / 3600);
  return absl::StrFormat("%.1f d", s / 86400);
}

std::string Percent(double fraction) { return absl::StrFormat("%.3g %%", 100 * fraction); }

// "0.04 s", "1.5 s", "35.2 s", "412 s"; "-" for 0 (unknown).
std::string Seconds(double s) {
  if (!(s > 0) || !std::isfinite(s)) return "-";
  if (s < 1) return absl::StrFormat("%.2f s", s);
  if (s < 100) return absl::StrFormat("%.1f s", s);
  return absl::StrFormat("%.0f s", s);
}

// "3/4"; "-" when neither is known (an entry that carries no world size).
std::string Ranks(uint32_t reported, uint32_t world) {
  if (world == 0) return reported == 0 ? "-" : absl::StrCat(reported, "/?");
  return absl::StrCat(reported, "/", world);
}

double SecondsSince(absl::Time now, int64_t unix_nanos) {
  return absl::ToDoubleSeconds(now - absl::FromUnixNanos(unix_nanos));
}

// "0-3,8,10-11" for sorted, distinct ranks.
std::string RankRanges(std::vector<uint32_t> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

std::string JobStateName(ckptd::v1::JobState s) {
  switch (s) {
    case ckptd::v1::JOB_RUNNING: return "running";
    case ckptd::v1::JOB_RESTARTING: return "restarting";
    default: return "unknown";
  }
}

std::string StepStateName(ckptd::v1::StepState s) {
  switch (s) {
    case ckptd::v1::STEP_COMMITTED: return "committed";
    case ckptd::v1::STEP_QUARANTINED: return "quarantined";
    case ckptd::v1::STEP_PENDING: return "pending";
    case ckptd::v1::STEP_ABORTED: return "aborted";
    case ckptd::v1::STEP_INCOMPLETE: return "incomplete";
    default: return "unknown";
  }
}

std::string FailureKindName(ckptd::v1::FailureKind k) {
  switch (k) {
    case ckptd::v1::NODE_LOST: return "node_lost";
    case ckptd::v1::TRAINER_DIED: return "trainer_died";
    case ckptd::v1::TRAINER_HUNG: return "trainer_hung";
    case ckptd::v1::PERSIST_FAILED: return "persist_failed";
    case ckptd::v1::SHARD_DAMAGED: return "shard_damaged";
    default: return "unknown";
  }
}

// Columns padded to their widest cell, two spaces apart, indented by two;
// the last column is not padded.
class Table {
 public:
  // `right`: the columns aligned right (numbers).
  explicit Table(std::vector<std::string> header, std::set<size_t> right = {}) : right_(std::move(right)) {
    rows_.push_back(std::move(header));
  }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print(std::ostream& out) const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size() && c < width.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    for (const auto& row : rows_) {
      std::string line = " ";
      for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
        const bool last = c + 1 == row.size();
        const std::string pad(width[c] - row[c].size(), ' ');
        line += " ";
        line += right_.count(c) ? pad + row[c] : last ? row[c] : row[c] + pad;
        if (!last) line += " ";
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out << line << "\n";
    }
  }

 private:
  std::set<size_t> right_;
  std::vector<std::vector<std::string>> rows_;
};

// ------------------------------------------------------------- the commands' frame

// A parsed command line and the coordinator it talks to.
class Command {
 public:
  Command(absl::string_view name, const char* help, std::ostream& out, std::ostream& err)
      : name_(name), help_(help), out_(out), err_(err) {}

  // Parses `argv` (the coordinator's flags, `value_flags`, `bool_flags`,
  // --help and --json), reads the token file when given, and connects.
  // Returns the exit status when the command is over already (--help, a
  // usage error, a failed connect), nullopt when it goes on.
  std::optional<int> Start(const std::vector<std::string>& argv, std::set<std::string> value_flags,
                           std::set<std::string> bool_flags, bool needs_job, const CoordinatorApiFactory& factory) {
    value_flags.insert(CoordinatorValueFlags().begin(), CoordinatorValueFlags().end());
    bool_flags.insert({"help", "json"});
    absl::StatusOr<Args> args = Args::Parse(argv, value_flags, bool_flags);
    if (!args.ok()) return Usage(args.status().message());
    args_ = *std::move(args);
    if (args_.Has("help")) {
      out_ << help_;
      return kExitOk;
    }
    if (!args_.positional().empty()) {
      return Usage(absl::StrCat("unexpected argument \"", args_.positional()[0], "\""));
    }
    if (!args_.Get("coordinator") || args_.Get("coordinator")->empty()) {
      return Usage("--coordinator HOST:PORT is required");
    }
    if (needs_job && (!args_.Get("job") || args_.Get("job")->empty())) return Usage("--job is required");
    if (std::optional<std::string> token_file = args_.Get("token-file")) {
      if (absl::Status s = ReadTokenFile(*token_file).status(); !s.ok()) return Usage(s.message());
    }
    if (absl::Status s = TimeoutFlag(args_).status(); !s.ok()) return Usage(s.message());
    if (!factory) return Usage("talking to a coordinator is not available in this build");
    absl::StatusOr<std::unique_ptr<CoordinatorApi>> api = factory(args_);
    if (!api.ok()) return Fail("", api.status());
    api_ = *std::move(api);
    return std::nullopt;
  }

  int Usage(absl::string_view why) const {
    err_ << "ckptctl " << name_ << ": " << why << "\n(`ckptctl " << name_ << " --help` describes the flags)\n";
    return kExitUsage;
  }

  // Says why `rpc` failed and returns the exit status for it.
  int Fail(absl::string_view rpc, const absl::Status& s) const {
    const std::string address = args_.Get("coordinator").value_or("");
    const std::string prefix = absl::StrCat("ckptctl ", name_, ": ");
    switch (s.code()) {
      case absl::StatusCode::kUnavailable:
      case absl::StatusCode::kDeadlineExceeded:
        // The real API's messages start "coordinator HOST:PORT: ".
        err_ << prefix << "cannot reach "
             << (absl::StartsWith(s.message(), "coordinator ")  ? std::string("the ")
                 : absl::StrContains(s.message(), address)      ? std::string("the coordinator: ")
                                                                : absl::StrCat("the coordinator at ", address, ": "))
             << s.message() << "\n";
        return kExitUnavailable;
      case absl::StatusCode::kUnauthenticated:
      case absl::StatusCode::kPermissionDenied:
        err_ << prefix << s.message() << "\n";
        if (std::optional<std::string> file = args_.Get("token-file")) {
          err_ << "  the coordinator refused the operator token in " << *file
               << ": pass --token-file with the token it was started with (<state-dir>/operator-token, or the file "
                  "given to ckptd-coordinator --operator-token-file)\n";
        } else {
          err_ << "  this command needs the operator token: pass --token-file F, where F is "
                  "<state-dir>/operator-token of the coordinator (or the file given to ckptd-coordinator "
                  "--operator-token-file)\n";
        }
        return kExitFailed;
      case absl::StatusCode::kUnimplemented:
        err_ << prefix << "the coordinator at " << address << " is too old for `ckptctl " << name_ << "`"
             << (rpc.empty() ? "" : absl::StrCat(" (it does not implement ", rpc, ")"))
             << "; upgrade ckptd-coordinator\n";
        return kExitFailed;
      case absl::StatusCode::kInvalidArgument:
        err_ << prefix << s.message() << "\n";
        return kExitUsage;
      default:
        err_ << prefix << s.message() << "\n";
        return kExitFailed;
    }
  }

  const Args& args() const { return args_; }
  CoordinatorApi& api() const { return *api_; }
  bool json() const { return args_.Has("json"); }
  std::string job() const { return args_.Get("job").value_or(""); }
  std::ostream& out() const { return out_; }
  std::ostream& err() const { return err_; }
  const std::string& name() const { return name_; }

 private:
  const std::string name_;
  const char* const help_;
  std::ostream& out_;
  std::ostream& err_;
  Args args_;
  std::unique_ptr<CoordinatorApi> api_;
};

void NullableUint(JsonWriter& w, absl::string_view key, bool present, uint64_t value) {
  w.Key(key);
  if (present) {
    w.Uint(value);
  } else {
    w.Null();
  }
}

void NullablePositive(JsonWriter& w, absl::string_view key, double value) {
  w.Key(key);
  if (value > 0 && std::isfinite(value)) {
    w.Double(value);
  } else {
    w.Null();
  }
}

void NullableTime(JsonWriter& w, absl::string_view key, int64_t unix_nanos) {
  w.Key(key);
  if (unix_nanos != 0) {
    w.String(IsoTime(unix_nanos));
  } else {
    w.Null();
  }
}

void UintArray(JsonWriter& w, absl::string_view key, const google::protobuf::RepeatedField<uint64_t>& values) {
  w.Key(key);
  w.BeginArray();
  for (uint64_t v : values) w.Uint(v);
  w.EndArray();
}

double Ratio(uint64_t raw, uint64_t stored) { return stored == 0 ? 0 : static_cast<double>(raw) / stored; }

// ------------------------------------------------------------------ status

void PrintStatusJson(const Command& c, absl::Time now, const ckptd::v1::GetClusterStatusResponse& cs,
                     const std::vector<const ckptd::v1::JobStatus*>& jobs,
                     const std::map<std::string, ckptd::v1::IntervalStatus>& intervals,
                     const ckptd::v1::ListEventsResponse& events) {
  JsonWriter w;
  w.BeginObject();
  w.Field("coordinator", *c.args().Get("coordinator"));
  w.Key("agents");
  w.BeginObject();
  int alive = 0;
  for (const auto& a : cs.agents()) alive += a.alive();
  w.Field("count", cs.agents_size());
  w.Field("alive", alive);
  w.Key("nodes");
  w.BeginArray();
  for (const auto& a : cs.agents()) {
    w.BeginObject();
    w.Field("node_id", a.node_id());
    w.Field("address", a.address());
    w.Field("alive", a.alive());
    NullableTime(w, "last_heartbeat", a.last_heartbeat_unix_nanos());
    w.Key("seconds_since_heartbeat");
    if (a.last_heartbeat_unix_nanos() != 0) {
      w.Double(SecondsSince(now, a.last_heartbeat_unix_nanos()));
    } else {
      w.Null();
    }
    w.Key("gpus");
    w.BeginArray();
    for (const std::string& g : a.gpus()) w.String(g);
    w.EndArray();
    w.Key("ranks");
    w.BeginArray();
    for (const auto& r : a.ranks()) {
      w.BeginObject();
      w.Field("job", r.job());
      w.Field("rank", r.rank());
      w.Field("world_size", r.world_size());
      w.Field("pid", r.pid());
      w.Field("gpu", r.gpu());
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();

  w.Key("jobs");
  w.BeginArray();
  for (const ckptd::v1::JobStatus* j : jobs) {
    w.BeginObject();
    w.Field("job", j->job());
    w.Field("state", JobStateName(j->state()));
    w.Field("world_size", j->world_size());
    w.Field("ranks_alive", j->ranks_alive());
    w.Field("fastest_step", j->fastest_step());
    w.Field("slowest_step", j->slowest_step());
    NullableUint(w, "newest_committed_step", j->has_committed(), j->newest_committed_step());
    w.Field("every_steps", j->schedule().every_steps());
    w.Field("start_step", j->schedule().start_step());
    UintArray(w, "extra_steps", j->schedule().extra_steps());
    w.Field("incarnation", j->schedule().incarnation());
    NullablePositive(w, "step_seconds", j->step_seconds());
    w.Field("checkpoints_committed", j->checkpoints_committed());
    w.Field("checkpoints_aborted", j->checkpoints_aborted());
    UintArray(w, "pending_steps", j->pending_steps());
    UintArray(w, "quarantined_steps", j->quarantined_steps());
    auto it = intervals.find(j->job());
    const ckptd::v1::IntervalStatus* iv = it == intervals.end() ? nullptr : &it->second;
    w.Key("interval");
    if (iv == nullptr) {
      w.Null();
    } else {
      w.BeginObject();
      w.Field("automatic", iv->automatic());
      w.Field("decided", iv->decided());
      if (iv->decided()) {
        w.Field("interval_seconds", iv->interval_seconds());
        w.Field("interval_steps", iv->interval_steps());
        w.Field("expected_waste", iv->expected_waste());
        w.Field("reason", iv->reason());
      } else {
        w.Key("interval_seconds");
        w.Null();
        w.Key("interval_steps");
        w.Null();
        w.Key("expected_waste");
        w.Null();
        w.Field("waiting_for", iv->waiting_for());
      }
      w.EndObject();
    }
    w.EndObject();
  }
  w.EndArray();

  w.Key("failures");
  w.BeginArray();
  for (const auto& e : events.events()) {
    w.BeginObject();
    w.Field("time", IsoTime(e.unix_nanos()));
    w.Field("unix_nanos", static_cast<int64_t>(e.unix_nanos()));
    w.Field("age_seconds", SecondsSince(now, e.unix_nanos()));
    w.Field("node_id", e.node_id());
    w.Field("job", e.job());
    NullableUint(w, "rank", e.has_rank(), e.rank());
    w.Field("kind", FailureKindName(e.kind()));
    w.Field("detail", e.detail());
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  c.out() << w.str() << "\n";
}

void PrintStatusTable(const Command& c, absl::Time now, const ckptd::v1::GetClusterStatusResponse& cs,
                      const std::vector<const ckptd::v1::JobStatus*>& jobs,
                      const std::map<std::string, ckptd::v1::IntervalStatus>& intervals,
                      const ckptd::v1::ListEventsResponse& events) {
  std::ostream& out = c.out();
  out << "coordinator " << *c.args().Get("coordinator") << "\n\n";
  int alive = 0;
  for (const auto& a : cs.agents()) alive += a.alive();
  out << "agents: " << cs.agents_size() << " (" << alive << " alive)\n";
  if (cs.agents_size() > 0) {
    Table t({"NODE", "STATE", "LAST HEARTBEAT", "GPUS", "RANKS"}, {3});
    for (const auto& a : cs.agents()) {
      std::map<std::string, std::vector<uint32_t>> by_job;
      for (const auto& r : a.ranks()) by_job[r.job()].push_back(r.rank());
      std::vector<std::string> ranks;
      for (const auto& [job, rs] : by_job) ranks.push_back(absl::StrCat(job, " ", RankRanges(rs)));
      t.Add({a.node_id(), a.alive() ? "alive" : "LOST",
             a.last_heartbeat_unix_nanos() == 0
                 ? "-"
                 : absl::StrCat(ShortDuration(SecondsSince(now, a.last_heartbeat_unix_nanos())), " ago"),
             absl::StrCat(a.gpus_size()), ranks.empty() ? "-" : absl::StrJoin(ranks, "; ")});
    }
    t.Print(out);
  }

  out << "\njobs: " << jobs.size() << "\n";
  if (!jobs.empty()) {
    Table t({"JOB", "STATE", "WORLD", "ALIVE", "FASTEST", "SLOWEST", "COMMITTED", "EVERY", "INTERVAL", "WASTE"},
            {2, 3, 4, 5, 6, 7});
    std::vector<std::string> details;
    for (const ckptd::v1::JobStatus* j : jobs) {
      std::string interval = "-";
      std::string waste = "-";
      auto it = intervals.find(j->job());
      if (it != intervals.end()) {
        const ckptd::v1::IntervalStatus& iv = it->second;
        if (iv.decided()) {
          interval = absl::StrCat(ShortDuration(iv.interval_seconds()), iv.automatic() ? "" : " (advice)");
          waste = Percent(iv.expected_waste());
        } else {
          interval = iv.automatic() ? "waiting" : "fixed";
        }
      }
      t.Add({j->job(), JobStateName(j->state()), absl::StrCat(j->world_size()),
             absl::StrCat(j->ranks_alive(), "/", j->world_size()), absl::StrCat(j->fastest_step()),
             absl::StrCat(j->slowest_step()), j->has_committed() ? absl::StrCat(j->newest_committed_step()) : "-",
             j->schedule().every_steps() > 0 ? absl::StrCat(j->schedule().every_steps()) : "-", interval, waste});
    }
    t.Print(out);
    for (const ckptd::v1::JobStatus* j : jobs) {
      std::vector<std::string> parts;
      if (j->step_seconds() > 0) parts.push_back(absl::StrFormat("step %.3g s", j->step_seconds()));
      parts.push_back(absl::StrCat("checkpoints ", j->checkpoints_committed(), " committed, ",
                                   j->checkpoints_aborted(), " aborted"));
      if (j->pending_steps_size() > 0) parts.push_back(absl::StrCat("pending ", absl::StrJoin(j->pending_steps(), ",")));
      if (j->quarantined_steps_size() > 0) {
        parts.push_back(absl::StrCat("quarantined ", absl::StrJoin(j->quarantined_steps(), ",")));
      }
      if (j->schedule().extra_steps_size() > 0) {
        parts.push_back(absl::StrCat("manual targets ", absl::StrJoin(j->schedule().extra_steps(), ",")));
      }
      auto it = intervals.find(j->job());
      if (it != intervals.end() && !it->second.decided() && !it->second.waiting_for().empty()) {
        parts.push_back(absl::StrCat("policy waiting for ", it->second.waiting_for()));
      }
      out << "  " << j->job() << ": " << absl::StrJoin(parts, "; ") << "\n";
    }
  }

  out << "\nrecent failures: " << (events.events_size() == 0 ? "none" : absl::StrCat(events.events_size())) << "\n";
  if (events.events_size() > 0) {
    Table t({"AGE", "TIME (UTC)", "NODE", "JOB", "RANK", "KIND", "DETAIL"}, {0, 4});
    for (const auto& e : events.events()) {
      t.Add({ShortDuration(SecondsSince(now, e.unix_nanos())), IsoTime(e.unix_nanos()), e.node_id(),
             e.job().empty() ? "-" : e.job(), e.has_rank() ? absl::StrCat(e.rank()) : "-", FailureKindName(e.kind()),
             e.detail()});
    }
    t.Print(out);
  }
}

// ------------------------------------------------------------------ checkpoint

struct CheckpointOutcome {
  std::string outcome;  // requested, committed, superseded, aborted, quarantined, timeout
  uint64_t requested_step = 0;
  uint64_t target_step = 0;
  std::optional<uint64_t> committed_step;
  uint32_t ranks_reported = 0;
  uint32_t world_size = 0;
  uint64_t stored_bytes = 0;
  std::string reason;
  double waited_s = 0;
};

void PrintCheckpointJson(const Command& c, const CheckpointOutcome& o) {
  JsonWriter w;
  w.BeginObject();
  w.Field("job", c.job());
  w.Field("requested_step", o.requested_step);
  w.Field("target_step", o.target_step);
  w.Field("outcome", o.outcome);
  NullableUint(w, "committed_step", o.committed_step.has_value(), o.committed_step.value_or(0));
  w.Field("ranks_reported", o.ranks_reported);
  w.Field("world_size", o.world_size);
  NullableUint(w, "stored_bytes", o.stored_bytes > 0, o.stored_bytes);
  w.Field("reason", o.reason);
  w.Field("waited_seconds", o.waited_s);
  w.EndObject();
  c.out() << w.str() << "\n";
}

// Follows the checkpoint at `target` until it commits, is passed over,
// fails or the timeout passes.
int WaitForCheckpoint(const Command& c, const OperatorEnv& env, uint64_t target, absl::Duration timeout) {
  CheckpointOutcome o;
  o.requested_step = target;
  o.target_step = target;
  const absl::Time start = env.now();
  std::string last_key;
  std::optional<absl::Status> unreachable;  // the last poll's, while the coordinator cannot be reached
  // Prints `key` + `more` when `key` differs from the last one printed.
  auto progress = [&](const std::string& key, absl::string_view more = "") {
    if (key == last_key) return;
    last_key = key;
    if (!c.json()) c.out() << key << more << "\n" << std::flush;
  };
  uint32_t job_world = 0;  // from the cluster status, for entries that do not carry it
  auto finish = [&](absl::string_view outcome, int code) {
    o.outcome = std::string(outcome);
    o.waited_s = absl::ToDoubleSeconds(env.now() - start);
    if (c.json()) {
      PrintCheckpointJson(c, o);
    } else if (code == kExitOk) {
      if (o.outcome == "committed") {
        c.out() << absl::StrFormat("step %d committed: %d/%d ranks, %s stored, after %s\n", o.target_step,
                                   o.ranks_reported, o.world_size, HumanBytes(o.stored_bytes),
                                   ShortDuration(o.waited_s));
      } else {
        c.out() << absl::StrFormat(
            "step %d was passed over: step %d committed first, so the job's state is saved at step %d (newer than "
            "requested), after %s\n",
            o.target_step, *o.committed_step, *o.committed_step, ShortDuration(o.waited_s));
      }
    }
    if (code != kExitOk) c.err() << "ckptctl checkpoint: " << o.reason << "\n";
    return code;
  };
  // A transient error is retried until the timeout: the request was accepted.
  auto transient = [](const absl::Status& s) { return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s); };

  while (true) {
    ckptd::v1::ListStepsRequest lreq;
    lreq.set_job(c.job());
    absl::StatusOr<ckptd::v1::ListStepsResponse> steps = c.api().ListSteps(lreq);
    if (!steps.ok() && absl::IsUnimplemented(steps.status())) {
      c.err() << "ckptctl checkpoint: step " << target
              << " was requested, but the coordinator is too old to follow it (it does not implement ListSteps); "
                 "use --no-wait, or upgrade ckptd-coordinator\n";
      return kExitFailed;
    }
    if (!steps.ok() && !transient(steps.status())) return c.Fail("ListSteps", steps.status());
    if (!steps.ok()) {
      if (!unreachable) c.err() << "ckptctl checkpoint: " << steps.status().message() << "; retrying\n";
      unreachable = steps.status();
    } else {
      unreachable.reset();
      const StepEntry* entry = nullptr;
      const StepEntry* newer = nullptr;  // the newest committed step past the target
      for (const StepEntry& e : steps->steps()) {
        if (e.step() == o.target_step) entry = &e;
        if (e.step() > o.target_step && e.state() == ckptd::v1::STEP_COMMITTED &&
            (newer == nullptr || e.step() > newer->step())) {
          newer = &e;
        }
      }
      if (entry != nullptr) {
        o.ranks_reported = entry->ranks_reported();
        o.world_size = entry->world_size() != 0 ? entry->world_size() : job_world;
        o.stored_bytes = entry->stored_bytes();
        o.reason = entry->reason();
      }
      if (entry != nullptr && entry->state() == ckptd::v1::STEP_COMMITTED) {
        o.committed_step = entry->step();
        return finish("committed", kExitOk);
      }
      if (entry != nullptr && entry->state() == ckptd::v1::STEP_QUARANTINED) {
        o.committed_step = entry->step();
        o.reason = absl::StrCat("step ", entry->step(), " committed but is quarantined (it will not be restored): ",
                                entry->reason());
        return finish("quarantined", kExitFailed);
      }
      if (newer != nullptr) {
        o.committed_step = newer->step();
        o.ranks_reported = newer->ranks_reported();
        o.world_size = newer->world_size() != 0 ? newer->world_size() : job_world;
        o.stored_bytes = newer->stored_bytes();
        o.reason = absl::StrCat("step ", o.target_step, " was passed over: step ", newer->step(), " committed first");
        return finish("superseded", kExitOk);
      }
      const bool aborted = entry != nullptr && entry->state() == ckptd::v1::STEP_ABORTED;
      if (entry == nullptr || entry->ranks_reported() == 0 || aborted) {
        // Not reported yet (perhaps files in storage: incomplete), or given
        // up: the job's schedule says whether the coordinator moved the
        // target (a rank passed it before it knew).
        absl::StatusOr<ckptd::v1::GetClusterStatusResponse> cs = c.api().ClusterStatus();
        if (!cs.ok() && !transient(cs.status())) return c.Fail("GetClusterStatus", cs.status());
        const ckptd::v1::JobStatus* job = nullptr;
        if (cs.ok()) {
          for (const auto& j : cs->jobs()) {
            if (j.job() == c.job()) job = &j;
          }
          if (job == nullptr) return c.Fail("GetClusterStatus", absl::NotFoundError(absl::StrCat("no job ", c.job())));
        }
        if (job != nullptr) {
          job_world = job->world_size();
          const auto& extras = job->schedule().extra_steps();
          std::optional<uint64_t> moved;
          if (std::find(extras.begin(), extras.end(), o.target_step) == extras.end()) {
            for (uint64_t e : extras) {
              if (e > o.target_step && (!moved || e < *moved)) moved = e;
            }
          }
          if (moved) {
            progress(absl::StrCat("step ", o.target_step, ": the coordinator moved the checkpoint to step ", *moved,
                                  aborted && !entry->reason().empty()
                                      ? absl::StrCat(" (", entry->reason(), ")")
                                      : std::string(" (a rank passed the target before it heard of it)")));
            o.target_step = *moved;
            o.ranks_reported = 0;
            o.stored_bytes = 0;
            o.reason.clear();
            continue;
          }
          if (o.world_size == 0) o.world_size = job_world;
        }
        if (aborted) {
          o.reason = absl::StrCat("step ", o.target_step, " was aborted: ",
                                  entry->reason().empty() ? "no reason given" : entry->reason());
          return finish("aborted", kExitFailed);
        }
        if (job != nullptr) {
          progress(absl::StrCat("step ", o.target_step, ": 0/", job_world, " ranks durable"),
                   absl::StrCat(" (fastest rank at step ", job->fastest_step(), ")"));
        }
      } else {
        progress(absl::StrCat("step ", o.target_step, ": ", o.ranks_reported, "/", o.world_size, " ranks durable"));
      }
    }
    if (env.now() - start >= timeout) {
      if (unreachable) return c.Fail("ListSteps", *unreachable);
      o.reason = absl::StrCat("step ", o.target_step, " did not commit within ", absl::FormatDuration(timeout), " (",
                              o.ranks_reported, "/", o.world_size,
                              " ranks durable); it stays scheduled: `ckptctl list --job ", c.job(),
                              "` shows what became of it");
      return finish("timeout", kExitFailed);
    }
    env.sleep(env.poll_interval);
  }
}

// ------------------------------------------------------------------ list

void PrintStepsJson(const Command& c, const ckptd::v1::ListStepsResponse& steps) {
  JsonWriter w;
  w.BeginObject();
  w.Field("job", c.job());
  w.Key("steps");
  w.BeginArray();
  for (const StepEntry& e : steps.steps()) {
    w.BeginObject();
    w.Field("step", e.step());
    w.Field("state", StepStateName(e.state()));
    w.Field("world_size", e.world_size());
    w.Field("ranks_reported", e.ranks_reported());
    w.Field("raw_bytes", e.raw_bytes());
    w.Field("stored_bytes", e.stored_bytes());
    w.Key("ratio");
    if (e.stored_bytes() > 0) {
      w.Double(Ratio(e.raw_bytes(), e.stored_bytes()));
    } else {
      w.Null();
    }
    NullableTime(w, "committed", e.committed_unix_nanos());
    NullablePositive(w, "persist_seconds", e.persist_seconds());
    NullableTime(w, "first_report", e.first_report_unix_nanos());
    w.Field("reason", e.reason());
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  c.out() << w.str() << "\n";
}

void PrintStepsTable(const Command& c, absl::Time now, const ckptd::v1::ListStepsResponse& steps) {
  std::ostream& out = c.out();
  if (steps.steps_size() == 0) {
    out << "job " << c.job() << ": no steps\n";
    return;
  }
  out << "job " << c.job() << ": " << steps.steps_size() << " step" << (steps.steps_size() == 1 ? "" : "s") << "\n";
  Table t({"STEP", "STATE", "RANKS", "STORED", "RATIO", "COMMITTED (UTC)", "PERSIST", "REASON"}, {0, 2, 3, 4, 6});
  for (const StepEntry& e : steps.steps()) {
    std::string reason = e.reason();
    if (reason.empty() && e.state() == ckptd::v1::STEP_PENDING && e.first_report_unix_nanos() != 0) {
      reason = absl::StrCat("first shard reported ", ShortDuration(SecondsSince(now, e.first_report_unix_nanos())),
                            " ago");
    }
    t.Add({absl::StrCat(e.step()), StepStateName(e.state()), Ranks(e.ranks_reported(), e.world_size()),
           e.stored_bytes() > 0 ? HumanBytes(e.stored_bytes()) : "-",
           e.stored_bytes() > 0 ? absl::StrFormat("%.2f", Ratio(e.raw_bytes(), e.stored_bytes())) : "-",
           IsoTime(e.committed_unix_nanos()), Seconds(e.persist_seconds()), reason});
  }
  t.Print(out);
}

// ------------------------------------------------------------------ restore-plan

void PrintPreviewJson(const Command& c, const ckptd::v1::RestorePreview& p) {
  JsonWriter w;
  w.BeginObject();
  w.Field("job", p.job().empty() ? c.job() : p.job());
  w.Field("state", JobStateName(p.state()));
  w.Field("incarnation", p.incarnation());
  w.Field("fresh_start", p.fresh_start());
  NullableUint(w, "step", !p.fresh_start(), p.step());
  w.Field("reason", p.reason());
  w.Key("passed_over");
  w.BeginArray();
  for (const StepEntry& e : p.passed_over()) {
    w.BeginObject();
    w.Field("step", e.step());
    w.Field("state", StepStateName(e.state()));
    w.Field("ranks_reported", e.ranks_reported());
    w.Field("world_size", e.world_size());
    w.Field("reason", e.reason());
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  c.out() << w.str() << "\n";
}

void PrintPreviewText(const Command& c, const ckptd::v1::RestorePreview& p) {
  std::ostream& out = c.out();
  out << "job " << (p.job().empty() ? c.job() : p.job()) << ": " << JobStateName(p.state()) << ", incarnation "
      << p.incarnation() << "\n";
  if (p.fresh_start()) {
    out << "a restart now starts fresh (no step restored)\n";
  } else {
    out << "a restart now restores step " << p.step() << "\n";
  }
  if (!p.reason().empty()) out << "  why: " << p.reason() << "\n";
  if (p.passed_over_size() == 0) {
    out << "no newer step is passed over\n";
    return;
  }
  out << "newer steps passed over: " << p.passed_over_size() << "\n";
  Table t({"STEP", "STATE", "RANKS", "WHY"}, {0, 2});
  for (const StepEntry& e : p.passed_over()) {
    t.Add({absl::StrCat(e.step()), StepStateName(e.state()), Ranks(e.ranks_reported(), e.world_size()),
           e.reason().empty() ? "-" : e.reason()});
  }
  t.Print(out);
}

// ------------------------------------------------------------------ online verify

void PrintVerifyJson(const Command& c, const ckptd::v1::VerifyProgress& p, const std::vector<std::string>& problems) {
  JsonWriter w;
  w.BeginObject();
  w.Field("job", c.job());
  w.Field("step", p.step());
  w.Field("ok", p.ok() && problems.empty());
  w.Field("shards_total", p.shards_total());
  w.Field("shards_done", p.shards_done());
  w.Field("bytes_total", p.bytes_total());
  w.Field("bytes_done", p.bytes_done());
  w.Key("problems");
  w.BeginArray();
  for (const std::string& s : problems) w.String(s);
  w.EndArray();
  w.EndObject();
  c.out() << w.str() << "\n";
}

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  // The coordinator's own rules for the file; any failure is a usage error here.
  absl::StatusOr<std::string> token = coordinator::ReadOperatorTokenFile(path);
  if (!token.ok()) return absl::InvalidArgumentError(absl::StrCat("--token-file ", path, ": ", token.status().message()));
  return token;
}

absl::StatusOr<std::optional<absl::Duration>> TimeoutFlag(const Args& args) {
  std::optional<std::string> text = args.Get("timeout");
  if (!text) return std::optional<absl::Duration>();
  absl::Duration d;
  double seconds = 0;
  if (absl::SimpleAtod(*text, &seconds) && std::isfinite(seconds)) {
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(*text, &d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout: \"", *text, "\" is not a duration (like 90s, 10m, 1h30m, or seconds)"));
  }
  if (d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--timeout must be positive and finite, got ", *text));
  }
  return std::optional<absl::Duration>(d);
}

int RunStatus(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
              std::ostream& err, const OperatorEnv& env) {
  Command c("status", kStatusHelp, out, err);
  if (std::optional<int> done = c.Start(argv, {"job"}, {}, /*needs_job=*/false, api)) return *done;
  absl::StatusOr<ckptd::v1::GetClusterStatusResponse> cs = c.api().ClusterStatus();
  if (!cs.ok()) return c.Fail("GetClusterStatus", cs.status());
  std::vector<const ckptd::v1::JobStatus*> jobs;
  for (const auto& j : cs->jobs()) {
    if (!c.args().Has("job") || j.job() == c.job()) jobs.push_back(&j);
  }
  if (c.args().Has("job") && jobs.empty()) {
    return c.Fail("GetClusterStatus", absl::NotFoundError(absl::StrCat("no job ", c.job())));
  }
  std::sort(jobs.begin(), jobs.end(), [](auto* a, auto* b) { return a->job() < b->job(); });
  std::map<std::string, ckptd::v1::IntervalStatus> intervals;
  for (const ckptd::v1::JobStatus* j : jobs) {
    ckptd::v1::GetIntervalRequest req;
    req.set_job(j->job());
    absl::StatusOr<ckptd::v1::IntervalStatus> iv = c.api().GetInterval(req);
    if (iv.ok()) {
      intervals[j->job()] = *std::move(iv);
    } else if (absl::IsUnavailable(iv.status()) || absl::IsDeadlineExceeded(iv.status())) {
      return c.Fail("GetInterval", iv.status());
    }
    // Otherwise (a coordinator without the policy, a job gone since) the
    // interval is shown as unknown: the rest of the status still holds.
  }
  ckptd::v1::ListEventsRequest ereq;
  ereq.set_job(c.job());
  ereq.set_limit(kStatusEvents);
  absl::StatusOr<ckptd::v1::ListEventsResponse> events = c.api().ListEvents(ereq);
  if (!events.ok()) return c.Fail("ListEvents", events.status());
  // Newest first, at most kStatusEvents, whatever order the coordinator used.
  std::sort(events->mutable_events()->begin(), events->mutable_events()->end(),
            [](const auto& a, const auto& b) { return a.unix_nanos() > b.unix_nanos(); });
  while (events->events_size() > static_cast<int>(kStatusEvents)) events->mutable_events()->RemoveLast();

  const absl::Time now = env.now();
  if (c.json()) {
    PrintStatusJson(c, now, *cs, jobs, intervals, *events);
  } else {
    PrintStatusTable(c, now, *cs, jobs, intervals, *events);
  }
  return kExitOk;
}

int RunCheckpoint(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
                  std::ostream& err, const OperatorEnv& env) {
  Command c("checkpoint", kCheckpointHelp, out, err);
  if (std::optional<int> done = c.Start(argv, {"job", "timeout"}, {"no-wait"}, /*needs_job=*/true, api)) return *done;
  if (c.args().Has("no-wait") && c.args().Has("timeout")) return c.Usage("--timeout has no use with --no-wait");
  const absl::Duration timeout = TimeoutFlag(c.args())->value_or(kDefaultCheckpointTimeout);
  ckptd::v1::RequestCheckpointRequest req;
  req.set_job(c.job());
  absl::StatusOr<ckptd::v1::RequestCheckpointResponse> resp = c.api().RequestCheckpoint(req);
  if (!resp.ok()) return c.Fail("RequestCheckpoint", resp.status());
  const uint64_t target = resp->target_step();
  if (c.args().Has("no-wait")) {
    if (c.json()) {
      CheckpointOutcome o;
      o.outcome = "requested";
      o.requested_step = o.target_step = target;
      PrintCheckpointJson(c, o);
    } else {
      out << "requested a checkpoint of job " << c.job() << " at step " << target << " (not waiting: `ckptctl list --job "
          << c.job() << "` shows its progress)\n";
    }
    return kExitOk;
  }
  if (!c.json()) {
    out << "requested a checkpoint of job " << c.job() << " at step " << target << "; waiting for it to commit (timeout "
        << absl::FormatDuration(timeout) << ")\n"
        << std::flush;
  }
  return WaitForCheckpoint(c, env, target, timeout);
}

int RunList(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
            std::ostream& err, const OperatorEnv& env) {
  Command c("list", kListHelp, out, err);
  if (std::optional<int> done = c.Start(argv, {"job"}, {}, /*needs_job=*/true, api)) return *done;
  ckptd::v1::ListStepsRequest req;
  req.set_job(c.job());
  absl::StatusOr<ckptd::v1::ListStepsResponse> steps = c.api().ListSteps(req);
  if (!steps.ok()) return c.Fail("ListSteps", steps.status());
  std::stable_sort(steps->mutable_steps()->begin(), steps->mutable_steps()->end(),
                   [](const StepEntry& a, const StepEntry& b) { return a.step() < b.step(); });
  if (c.json()) {
    PrintStepsJson(c, *steps);
  } else {
    PrintStepsTable(c, env.now(), *steps);
  }
  return kExitOk;
}

int RunRestorePlan(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
                   std::ostream& err, const OperatorEnv& env) {
  Command c("restore-plan", kRestorePlanHelp, out, err);
  if (std::optional<int> done = c.Start(argv, {"job"}, {}, /*needs_job=*/true, api)) return *done;
  ckptd::v1::RestorePreviewRequest req;
  req.set_job(c.job());
  absl::StatusOr<ckptd::v1::RestorePreview> preview = c.api().GetRestorePreview(req);
  if (!preview.ok()) return c.Fail("GetRestorePreview", preview.status());
  if (c.json()) {
    PrintPreviewJson(c, *preview);
  } else {
    PrintPreviewText(c, *preview);
  }
  return kExitOk;
}

int RunOnlineVerify(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
                    std::ostream& err, const OperatorEnv& env) {
  Command c("verify", kOnlineVerifyHelp, out, err);
  if (std::optional<int> done = c.Start(argv, {"job", "step", "timeout"}, {}, /*needs_job=*/true, api)) return *done;
  absl::StatusOr<std::optional<uint64_t>> step = c.args().GetUint("step");
  if (!step.ok()) return c.Usage(step.status().message());
  ckptd::v1::VerifyStepRequest req;
  req.set_job(c.job());
  if (*step) {
    req.set_step(**step);
    req.set_has_step(true);
  }
  std::vector<std::string> problems;
  std::set<std::string> seen;
  bool any = false;
  std::string last_line;
  auto on_progress = [&](const ckptd::v1::VerifyProgress& p) {
    any = true;
    for (const std::string& s : p.problems()) {
      if (seen.insert(s).second) problems.push_back(s);
    }
    if (c.json() || p.done()) return;
    const std::string line =
        absl::StrFormat("step %d: %d/%d shards, %s of %s", p.step(), p.shards_done(), p.shards_total(),
                        HumanBytes(p.bytes_done()), HumanBytes(p.bytes_total()));
    // Only when the shard count moves, so that a byte-by-byte stream stays readable.
    if (line.substr(0, line.find(',')) == last_line.substr(0, last_line.find(','))) return;
    last_line = line;
    out << line << "\n" << std::flush;
  };
  absl::StatusOr<ckptd::v1::VerifyProgress> result = c.api().VerifyStep(req, on_progress);
  if (!result.ok()) {
    if (any && c.args().Has("timeout") && absl::IsDeadlineExceeded(result.status())) {
      err << "ckptctl verify: the verification did not finish within --timeout " << *c.args().Get("timeout")
          << "\n";
      return kExitFailed;
    }
    return c.Fail("VerifyStep", result.status());
  }
  for (const std::string& s : result->problems()) {
    if (seen.insert(s).second) problems.push_back(s);
  }
  const bool ok = result->ok() && problems.empty();
  if (c.json()) {
    PrintVerifyJson(c, *result, problems);
  } else {
    out << absl::StrFormat("job %s step %d: %s  %d/%d shards, %s of %s stored bytes read\n", c.job(), result->step(),
                           ok ? "OK" : "FAILED", result->shards_done(), result->shards_total(),
                           HumanBytes(result->bytes_done()), HumanBytes(result->bytes_total()));
    for (const std::string& s : problems) out << "    " << s << "\n";
    if (!ok && problems.empty()) out << "    (the coordinator reported a failure without a problem)\n";
  }
  return ok ? kExitOk : kExitFailed;
}

bool IsOnlineVerify(const std::vector<std::string>& argv) {
  for (const std::string& a : argv) {
    if (a == "--") break;
    if (a == "--coordinator" || absl::StartsWith(a, "--coordinator=")) return true;
  }
  return false;
}

int RunVerifyCommand(storage::FileSystem* fs, const std::vector<std::string>& argv, const CoordinatorApiFactory& api,
                     std::ostream& out, std::ostream& err) {
  auto has = [&](absl::string_view flag) {
    for (const std::string& a : argv) {
      if (a == "--") break;
      if (a == absl::StrCat("--", flag) || absl::StartsWith(a, absl::StrCat("--", flag, "="))) return true;
    }
    return false;
  };
  if (IsOnlineVerify(argv)) {
    if (has("root")) {
      err << "ckptctl verify: --root (offline: read the storage root here) and --coordinator (online: the "
             "coordinator reads its own) do not go together\n(`ckptctl verify --help` describes both)\n";
      return kExitUsage;
    }
    return RunOnlineVerify(argv, api, out, err);
  }
  if (has("help") && !has("root")) {
    out << kVerifyHelp << "\n" << kOnlineVerifyHelp;
    return kExitOk;
  }
  return RunVerify(fs, argv, out, err);
}

// ------------------------------------------------------------- drills

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
    {"cut-off-agent", ckptd::v1::CUT_OFF_AGENT, true, true},
    {"corrupt-shard", ckptd::v1::CORRUPT_SHARD, false, false},
    {"storage-eio", ckptd::v1::STORAGE_EIO, true, true},
    {"storage-enospc", ckptd::v1::STORAGE_ENOSPC, true, true},
    {"storage-slow", ckptd::v1::STORAGE_SLOW, true, true},
};

bool IsStorageScenario(ckptd::v1::DrillScenario s) {
  return s == ckptd::v1::STORAGE_EIO || s == ckptd::v1::STORAGE_ENOSPC || s == ckptd::v1::STORAGE_SLOW;
}

struct Verdict {
  std::string expectation;
  bool held = false;
  std::string detail;
};

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

}  // namespace

int RunDrillCommand(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
                    std::ostream& err, const OperatorEnv& env) {
  if (!argv.empty() && (argv[0] == "--help" || argv[0] == "-h")) {
    out << kDrillHelp;
    return kExitOk;
  }
  if (argv.empty() || argv[0] != "run") {
    err << "ckptctl drill: expected `drill run`\n(`ckptctl drill --help` describes it)\n";
    return kExitUsage;
  }
  Command c("drill run", kDrillHelp, out, err);
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (std::optional<int> done =
          c.Start(rest, {"job", "scenario", "target", "at-step", "duration", "slow", "watch"}, {}, true, api)) {
    return *done;
  }
  const Args& args = c.args();
  const std::string scenario_name = args.Get("scenario").value_or("");
  const ScenarioInfo* info = nullptr;
  std::vector<std::string> names;
  for (const ScenarioInfo& s : kScenarios) {
    names.push_back(s.name);
    if (scenario_name == s.name) info = &s;
  }
  if (info == nullptr) {
    return c.Usage(absl::StrCat("--scenario must be one of ", absl::StrJoin(names, ", "),
                                scenario_name.empty() ? "" : absl::StrCat("; got \"", scenario_name, "\"")));
  }
  absl::StatusOr<absl::Duration> duration = PositiveDuration(args, "duration", absl::Seconds(10));
  absl::StatusOr<absl::Duration> slow = PositiveDuration(args, "slow", absl::Milliseconds(200));
  absl::StatusOr<absl::Duration> watch = PositiveDuration(args, "watch", absl::Minutes(2));
  for (const absl::Status& s : {duration.status(), slow.status(), watch.status()}) {
    if (!s.ok()) return c.Usage(s.message());
  }
  absl::StatusOr<std::optional<uint64_t>> at_step = args.GetUint("at-step");
  if (!at_step.ok()) return c.Usage(at_step.status().message());

  ckptd::v1::RunDrillRequest req;
  req.set_job(c.job());
  req.set_scenario(info->scenario);
  if (std::optional<std::string> target = args.Get("target")) {
    uint32_t rank = 0;
    if (absl::SimpleAtoi(*target, &rank)) {
      req.set_rank(rank);
    } else if (info->node_level) {
      req.set_target_node(*target);
    } else {
      return c.Usage(absl::StrCat("--target of ", info->name, " is a rank number; got \"", *target, "\""));
    }
  }
  req.set_at_step(at_step->value_or(0));
  if (info->timed) req.set_duration_seconds(absl::ToDoubleSeconds(*duration));
  if (info->scenario == ckptd::v1::STORAGE_SLOW) req.set_slow_seconds(absl::ToDoubleSeconds(*slow));
  absl::StatusOr<ckptd::v1::RunDrillResponse> ordered = c.api().RunDrill(req);
  if (!ordered.ok()) return c.Fail("RunDrill", ordered.status());
  if (!c.json()) {
    out << "drill " << ordered->drill_id() << ": " << info->name << " on node " << ordered->node_id()
        << (req.target_node().empty() ? absl::StrCat(" (rank ", req.rank(), " of job ", c.job(), ")") : "")
        << (req.at_step() > 0 ? absl::StrCat(" at step ", req.at_step()) : "") << "\n"
        << std::flush;
  }

  ckptd::v1::GetDrillRequest get;
  get.set_drill_id(ordered->drill_id());
  ckptd::v1::DrillStatus st;
  auto refresh = [&]() -> absl::Status {
    absl::StatusOr<ckptd::v1::DrillStatus> got = c.api().GetDrill(get);
    if (!got.ok()) return got.status();
    st = *std::move(got);
    return absl::OkStatus();
  };
  // 1. The agent's report.
  const absl::Time give_up = env.now() + *watch;
  while (true) {
    if (absl::Status s = refresh(); !s.ok()) return c.Fail("GetDrill", s);
    if (st.has_report() && (st.report().injected() || !st.report().error().empty())) break;
    if (env.now() >= give_up) break;
    env.sleep(env.poll_interval);
  }
  if (st.has_report() && !st.report().error().empty()) {
    err << "ckptctl drill run: node " << st.node_id() << " did not carry the drill out: " << st.report().error()
        << "\n";
    return kExitFailed;
  }
  std::vector<Verdict> verdicts;
  const bool injected = st.has_report() && st.report().injected();
  verdicts.push_back({"the agent injected the fault", injected,
                      injected ? st.report().detail() : absl::StrCat("no report within ", absl::FormatDuration(*watch))});

  // 2. What follows.
  std::optional<ckptd::v1::VerifyProgress> verified;
  int64_t verified_at = 0;
  if (injected && info->scenario == ckptd::v1::CORRUPT_SHARD) {
    // Nothing reads a committed step until a restore or a verification: the
    // drill verifies it, as an operator would.
    ckptd::v1::VerifyStepRequest vr;
    vr.set_job(c.job());
    vr.set_has_step(true);
    // The step the agent damaged: newer ones may have committed since the order.
    vr.set_step(st.report().step() != 0 ? st.report().step() : st.newest_committed_at_order());
    absl::StatusOr<ckptd::v1::VerifyProgress> v = c.api().VerifyStep(vr, [](const ckptd::v1::VerifyProgress&) {});
    if (!v.ok()) return c.Fail("VerifyStep", v.status());
    verified = *v;
    verified_at = absl::ToUnixNanos(env.now());
  }
  auto latest_commit_after = [&](int64_t nanos) -> std::optional<uint64_t> {
    ckptd::v1::ListStepsRequest lr;
    lr.set_job(c.job());
    absl::StatusOr<ckptd::v1::ListStepsResponse> steps = c.api().ListSteps(lr);
    if (!steps.ok()) return std::nullopt;
    std::optional<uint64_t> newest;
    for (const StepEntry& e : steps->steps()) {
      if (e.state() == ckptd::v1::STEP_COMMITTED && e.committed_unix_nanos() > nanos) newest = e.step();
    }
    return newest;
  };
  auto settled = [&]() {
    if (!injected) return true;
    switch (info->scenario) {
      case ckptd::v1::CORRUPT_SHARD:
        return true;
      case ckptd::v1::HANG_TRAINER:
        // A hang shorter than the coordinator's threshold is not a failure.
        return st.resumed() || (st.report().ended() && st.events().empty() &&
                                env.now() > absl::FromUnixNanos(st.report().ended_unix_nanos()) + absl::Seconds(5));
      case ckptd::v1::STORAGE_EIO:
      case ckptd::v1::STORAGE_ENOSPC:
      case ckptd::v1::STORAGE_SLOW:
        return st.report().ended() && latest_commit_after(st.report().ended_unix_nanos()).has_value();
      default:
        return st.resumed();
    }
  };
  std::string last_line;
  while (true) {
    if (absl::Status s = refresh(); !s.ok()) return c.Fail("GetDrill", s);
    if (!c.json()) {
      std::string line = absl::StrCat("  ", st.events_size(), " failure(s) recorded",
                                      st.resumed() ? absl::StrCat("; resumed from step ", st.restored_step()) : "",
                                      st.report().ended() ? "; fault lifted" : "");
      if (line != last_line) out << line << "\n" << std::flush;
      last_line = line;
    }
    if (settled() || env.now() >= give_up) break;
    env.sleep(env.poll_interval);
  }

  // 3. The verdict.
  ckptd::v1::ListStepsRequest lr;
  lr.set_job(c.job());
  absl::StatusOr<ckptd::v1::ListStepsResponse> steps = c.api().ListSteps(lr);
  if (!steps.ok()) return c.Fail("ListSteps", steps.status());
  ckptd::v1::RestorePreviewRequest pr;
  pr.set_job(c.job());
  absl::StatusOr<ckptd::v1::RestorePreview> preview = c.api().GetRestorePreview(pr);
  if (!preview.ok()) return c.Fail("GetRestorePreview", preview.status());
  std::map<uint64_t, const StepEntry*> by_step;
  bool partial = false;
  for (const StepEntry& e : steps->steps()) {
    by_step[e.step()] = &e;
    partial |= e.state() == ckptd::v1::STEP_COMMITTED && e.ranks_reported() != e.world_size();
  }
  verdicts.push_back({"nothing partial committed", !partial, partial ? "a committed step lacks a rank" : ""});
  const int64_t injected_at = st.report().injected_unix_nanos();
  const bool detected = st.first_detection_unix_nanos() > 0;
  const bool restart_scenario = info->scenario == ckptd::v1::KILL_TRAINER || info->scenario == ckptd::v1::KILL_AGENT ||
                                info->scenario == ckptd::v1::CUT_OFF_AGENT ||
                                (info->scenario == ckptd::v1::HANG_TRAINER && detected);
  if (restart_scenario) {
    verdicts.push_back({"the failure was detected", detected,
                        detected ? absl::StrFormat("%.3f s after the injection",
                                                   SecondsBetween(injected_at, st.first_detection_unix_nanos()))
                                 : "no failure recorded"});
    verdicts.push_back({"the job restarted and resumed training", st.resumed(),
                        st.resumed() ? absl::StrCat("from step ", st.restored_step()) : "not within --watch"});
    if (st.resumed()) {
      const StepEntry* restored = st.fresh_start() ? nullptr : by_step[st.restored_step()];
      const bool good = st.fresh_start() ? !st.had_committed_at_order()
                                         : restored != nullptr && restored->state() == ckptd::v1::STEP_COMMITTED &&
                                               st.restored_step() <= st.step_at_failure();
      verdicts.push_back({"it restored the newest intact committed step, no newer than the failure", good,
                          st.fresh_start() ? "a fresh start" : absl::StrCat("step ", st.restored_step())});
    }
  }
  if (info->scenario == ckptd::v1::HANG_TRAINER) {
    verdicts.push_back({"the trainer was let go again", st.report().ended(), ""});
  }
  if (info->scenario == ckptd::v1::CORRUPT_SHARD && verified) {
    const uint64_t bad = verified->step();
    const StepEntry* e = by_step.count(bad) ? by_step[bad] : nullptr;
    verdicts.push_back({"verification found the damage", !verified->ok(),
                        verified->problems().empty() ? "no problem found" : verified->problems(0)});
    verdicts.push_back({"the damaged step is quarantined", e != nullptr && e->state() == ckptd::v1::STEP_QUARANTINED,
                        absl::StrCat("step ", bad)});
    const bool never = preview->fresh_start() || preview->step() != bad;
    verdicts.push_back({"corrupt data is never restored", never,
                        preview->fresh_start() ? "a restart would start fresh"
                                               : absl::StrCat("a restart would restore step ", preview->step())});
    // The newest step that is committed and intact: the one before the
    // damaged step, or one committed after it.
    std::optional<uint64_t> newest_good;
    for (const StepEntry& s : steps->steps()) {
      if (s.state() == ckptd::v1::STEP_COMMITTED) newest_good = s.step();
    }
    const bool picks_good = newest_good ? !preview->fresh_start() && preview->step() == *newest_good
                                        : preview->fresh_start();
    verdicts.push_back({"a restart picks the newest intact committed step", picks_good,
                        newest_good ? absl::StrCat("step ", *newest_good,
                                                   *newest_good < bad ? " (the one before the damaged step)"
                                                                      : " (committed after the damaged step)")
                                    : "none: a fresh start"});
  }
  if (IsStorageScenario(info->scenario)) {
    bool restarted = st.resumed();
    for (const auto& e : st.events()) {
      restarted |= e.kind() == ckptd::v1::TRAINER_DIED || e.kind() == ckptd::v1::NODE_LOST ||
                   e.kind() == ckptd::v1::TRAINER_HUNG;
    }
    verdicts.push_back({"training went on without a restart", !restarted, ""});
    verdicts.push_back({"the fault was lifted", st.report().ended(), ""});
    std::optional<uint64_t> after =
        st.report().ended() ? latest_commit_after(st.report().ended_unix_nanos()) : std::nullopt;
    verdicts.push_back({"checkpoints commit again after the fault", after.has_value(),
                        after ? absl::StrCat("step ", *after) : "none within --watch"});
  }
  bool all = true;
  for (const Verdict& v : verdicts) all &= v.held;
  // Work lost: the steps past the restored one, redone.
  const uint64_t lost_steps = st.resumed() && st.step_at_failure() > st.restored_step()
                                  ? st.step_at_failure() - st.restored_step()
                                  : 0;
  const double lost_seconds = static_cast<double>(lost_steps) * st.step_seconds();
  const double restart_seconds = st.resumed() ? SecondsBetween(st.failed_unix_nanos(), st.resumed_unix_nanos()) : 0;

  if (c.json()) {
    JsonWriter w;
    w.BeginObject();
    w.Field("drill_id", st.drill_id());
    w.Field("scenario", info->name);
    w.Field("job", c.job());
    w.Field("node", st.node_id());
    w.Field("ordered_unix_nanos", st.ordered_unix_nanos());
    w.Field("injected", injected);
    w.Field("injected_unix_nanos", injected_at);
    w.Field("detail", st.report().detail());
    w.Key("detection_seconds");
    if (detected && injected) {
      w.Double(SecondsBetween(injected_at, st.first_detection_unix_nanos()));
    } else {
      w.Null();
    }
    w.Key("failures");
    w.BeginArray();
    for (const auto& e : st.events()) {
      w.BeginObject();
      w.Field("kind", FailureKindName(e.kind()));
      w.Field("node", e.node_id());
      w.Field("unix_nanos", e.unix_nanos());
      w.Field("detail", e.detail());
      w.EndObject();
    }
    w.EndArray();
    w.Field("resumed", st.resumed());
    w.Field("fresh_start", st.fresh_start());
    w.Field("restored_step", st.restored_step());
    w.Field("step_at_failure", st.step_at_failure());
    w.Field("lost_steps", lost_steps);
    w.Field("lost_seconds", lost_seconds);
    w.Field("restart_seconds", restart_seconds);
    w.Field("fault_lifted", st.report().ended());
    if (verified) w.Field("verified_step", verified->step());
    w.Key("verdict");
    w.BeginArray();
    for (const Verdict& v : verdicts) {
      w.BeginObject();
      w.Field("expectation", v.expectation);
      w.Field("held", v.held);
      w.Field("detail", v.detail);
      w.EndObject();
    }
    w.EndArray();
    w.Field("passed", all);
    w.EndObject();
    out << w.str() << "\n";
    return all ? kExitOk : kExitFailed;
  }
  auto at = [&](int64_t nanos) {
    return injected_at > 0 ? absl::StrFormat("%+8.3f s", SecondsBetween(injected_at, nanos)) : IsoTime(nanos);
  };
  out << "\ntimeline (from the injection)\n";
  out << "  " << at(st.ordered_unix_nanos()) << "  ordered\n";
  if (injected) out << "  " << at(injected_at) << "  injected: " << st.report().detail() << "\n";
  for (const auto& e : st.events()) {
    out << "  " << at(e.unix_nanos()) << "  detected " << FailureKindName(e.kind())
        << (e.node_id().empty() ? "" : " on ") << e.node_id()
        << (e.has_rank() ? absl::StrCat(" rank ", e.rank()) : "") << ": " << e.detail() << "\n";
  }
  if (verified) {
    out << "  " << at(verified_at) << "  verified step " << verified->step() << ": "
        << (verified->ok() ? "intact" : absl::StrCat(verified->problems_size(), " problem(s)")) << "\n";
  }
  if (st.report().ended()) out << "  " << at(st.report().ended_unix_nanos()) << "  fault lifted\n";
  if (st.resumed()) {
    out << "  " << at(st.resumed_unix_nanos()) << "  training resumed from "
        << (st.fresh_start() ? std::string("a fresh start") : absl::StrCat("step ", st.restored_step())) << "\n";
  }
  if (st.resumed()) {
    out << absl::StrFormat("\nwork lost    %d steps (%.1f s at %.3f s per step)\nrestart      %.3f s from the "
                           "failure to the first step after the restore\n",
                           lost_steps, lost_seconds, st.step_seconds(), restart_seconds);
  }
  out << "\nverdict\n";
  for (const Verdict& v : verdicts) {
    out << "  " << (v.held ? "PASS" : "FAIL") << "  " << v.expectation << (v.detail.empty() ? "" : ": ") << v.detail
        << "\n";
  }
  out << (all ? "drill: PASS\n" : "drill: FAIL\n");
  return all ? kExitOk : kExitFailed;
}

}  // namespace ckptd::cli
