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
#include "cli/command.h"
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

}  // namespace ckptd::cli
