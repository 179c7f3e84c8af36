#include "cli/operator_commands.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/json.h"
#include "cli/command.h"
#include "cli/offline_commands.h"
#include "rpc/operator_token.h"
#include "storage/posix_file_system.h"

namespace ckptd::cli {

using ckptd::v1::StepEntry;

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
    "step (or a fresh start) and why; where each rank would read it, cheapest\n"
    "first: \"memory\" (its own agent keeps the step), \"peer memory\" (another\n"
    "node's agent holds a copy: peer replication), or \"disk\" (the node-local tier\n"
    "or the storage root, which the agent picks), with the nodes holding a copy in\n"
    "memory; every newer step that would be passed over and why (pending, aborted,\n"
    "quarantined); the job's state and incarnation. Consecutive ranks with the same\n"
    "node, source and peers share a row (\"0-7\").\n"
    "\n"
    "  --job J                  the job\n"
    "  --coordinator HOST:PORT  the coordinator to ask\n"
    "  --tls-ca F --tls-cert F --tls-key F\n"
    "                           mutual TLS (PEM files), as the coordinator was started with\n"
    "  --json                   one JSON object instead of the text: job, state,\n"
    "                           incarnation, fresh_start, step, memory_checkpoint,\n"
    "                           durable_step (its fallback), reason, sources (ranks\n"
    "                           per source), ranks (rank, node, own_memory, peer_nodes,\n"
    "                           planned), passed_over\n"
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

constexpr absl::Duration kDefaultCheckpointTimeout = absl::Minutes(10);

double Ratio(uint64_t raw, uint64_t stored) { return stored == 0 ? 0 : static_cast<double>(raw) / stored; }

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
    if (!c.json()) c.out() << TerminalSafe(key) << TerminalSafe(more) << "\n" << std::flush;
  };
  uint32_t job_world = 0;  // from the cluster status, for entries that do not carry it
  auto finish = [&](absl::string_view outcome, int code) {
    o.outcome = std::string(outcome);
    o.waited_s = absl::ToDoubleSeconds(env.now() - start);
    if (c.json()) {
      PrintCheckpointJson(c, o);
    } else if (code == base::kExitOk) {
      if (o.outcome == "committed") {
        c.out() << absl::StrFormat("step %d committed: %d/%d ranks, %s stored, after %s\n", o.target_step,
                                   o.ranks_reported, o.world_size, base::HumanBytes(o.stored_bytes),
                                   ShortDuration(o.waited_s));
      } else {
        c.out() << absl::StrFormat(
            "step %d was passed over: step %d committed first, so the job's state is saved at step %d (newer than "
            "requested), after %s\n",
            o.target_step, *o.committed_step, *o.committed_step, ShortDuration(o.waited_s));
      }
    }
    if (code != base::kExitOk) c.err() << "ckptctl checkpoint: " << TerminalSafe(o.reason) << "\n";
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
      return base::kExitFailed;
    }
    if (!steps.ok() && !transient(steps.status())) return c.Fail("ListSteps", steps.status());
    if (!steps.ok()) {
      if (!unreachable) c.err() << "ckptctl checkpoint: " << TerminalSafe(steps.status().message()) << "; retrying\n";
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
        return finish("committed", base::kExitOk);
      }
      if (entry != nullptr && entry->state() == ckptd::v1::STEP_QUARANTINED) {
        o.committed_step = entry->step();
        o.reason = absl::StrCat("step ", entry->step(), " committed but is quarantined (it will not be restored): ",
                                entry->reason());
        return finish("quarantined", base::kExitFailed);
      }
      if (newer != nullptr) {
        o.committed_step = newer->step();
        o.ranks_reported = newer->ranks_reported();
        o.world_size = newer->world_size() != 0 ? newer->world_size() : job_world;
        o.stored_bytes = newer->stored_bytes();
        o.reason = absl::StrCat("step ", o.target_step, " was passed over: step ", newer->step(), " committed first");
        return finish("superseded", base::kExitOk);
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
          return finish("aborted", base::kExitFailed);
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
      return finish("timeout", base::kExitFailed);
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
           e.stored_bytes() > 0 ? base::HumanBytes(e.stored_bytes()) : "-",
           e.stored_bytes() > 0 ? absl::StrFormat("%.2f", Ratio(e.raw_bytes(), e.stored_bytes())) : "-",
           IsoTime(e.committed_unix_nanos()), Seconds(e.persist_seconds()), reason});
  }
  t.Print(out);
}

// ------------------------------------------------------------------ restore-plan

// Where a rank would read its step, as an operator says it.
std::string PlannedSourceName(ckptd::v1::RestoreSource s) {
  switch (s) {
    case ckptd::v1::AGENT_MEMORY: return "memory";
    case ckptd::v1::PEER_MEMORY: return "peer memory";
    case ckptd::v1::NODE_LOCAL:
    case ckptd::v1::STORAGE_ROOT: return "disk";
    default: return "unknown";
  }
}

// Ranks per planned source, cheapest first.
std::vector<std::pair<std::string, int>> PlannedCounts(const ckptd::v1::RestorePreview& p) {
  std::map<int, int> by_source;
  for (const auto& r : p.ranks()) {
    // The node-local tier and the storage root are one choice here: disk.
    const int source = r.planned() == ckptd::v1::NODE_LOCAL ? ckptd::v1::STORAGE_ROOT : r.planned();
    ++by_source[source];
  }
  std::vector<std::pair<std::string, int>> out;
  for (const auto& [source, n] : by_source) {
    out.emplace_back(PlannedSourceName(static_cast<ckptd::v1::RestoreSource>(source)), n);
  }
  return out;
}

// "where each rank would read step S: ..." and the table, consecutive ranks
// with the same node, source and peers in one row.
void PrintRankSources(std::ostream& out, const ckptd::v1::RestorePreview& p) {
  std::vector<std::string> parts;
  for (const auto& [name, n] : PlannedCounts(p)) {
    parts.push_back(absl::StrCat(n, parts.empty() ? (n == 1 ? " rank" : " ranks") : "", " from ", name));
  }
  out << "where each rank would read step " << p.step() << ": " << absl::StrJoin(parts, ", ") << "\n";
  Table t({"RANKS", "NODE", "SOURCE", "PEERS IN MEMORY"}, {0});
  auto peers = [](const ckptd::v1::RankRestoreSources& r) {
    return r.peer_nodes_size() == 0 ? std::string("-") : absl::StrJoin(r.peer_nodes(), ",");
  };
  auto same = [&](const ckptd::v1::RankRestoreSources& a, const ckptd::v1::RankRestoreSources& b) {
    return a.node_id() == b.node_id() && a.planned() == b.planned() && peers(a) == peers(b);
  };
  for (int i = 0; i < p.ranks_size();) {
    int j = i;
    while (j + 1 < p.ranks_size() && p.ranks(j + 1).rank() == p.ranks(j).rank() + 1 && same(p.ranks(i), p.ranks(j + 1))) {
      ++j;
    }
    const ckptd::v1::RankRestoreSources& r = p.ranks(i);
    t.Add({i == j ? absl::StrCat(r.rank()) : absl::StrCat(r.rank(), "-", p.ranks(j).rank()),
           r.node_id().empty() ? "-" : r.node_id(), PlannedSourceName(r.planned()), peers(r)});
    i = j + 1;
  }
  t.Print(out);
}

void PrintPreviewJson(const Command& c, const ckptd::v1::RestorePreview& p) {
  JsonWriter w;
  w.BeginObject();
  w.Field("job", p.job().empty() ? c.job() : p.job());
  w.Field("state", JobStateName(p.state()));
  w.Field("incarnation", p.incarnation());
  w.Field("fresh_start", p.fresh_start());
  NullableUint(w, "step", !p.fresh_start(), p.step());
  w.Field("memory_checkpoint", p.memory_step());
  NullableUint(w, "durable_step", p.memory_step() && p.has_durable_step(), p.durable_step());
  w.Field("reason", p.reason());
  NullableUint(w, "world_size", p.world_size() != 0, p.world_size());
  NullableUint(w, "saved_world_size", p.saved_world_size() != 0, p.saved_world_size());
  w.Key("sources");
  w.BeginObject();
  for (const auto& [source, n] : PlannedCounts(p)) w.Field(source, n);
  w.EndObject();
  w.Key("ranks");
  w.BeginArray();
  for (const ckptd::v1::RankRestoreSources& r : p.ranks()) {
    w.BeginObject();
    w.Field("rank", r.rank());
    w.Key("node");
    if (r.node_id().empty()) {
      w.Null();
    } else {
      w.String(r.node_id());
    }
    w.Field("own_memory", r.own_memory());
    w.Key("peer_nodes");
    w.BeginArray();
    for (const std::string& n : r.peer_nodes()) w.String(n);
    w.EndArray();
    w.Field("planned", PlannedSourceName(r.planned()));
    w.EndObject();
  }
  w.EndArray();
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
  out << "job " << TerminalSafe(p.job().empty() ? c.job() : p.job()) << ": " << JobStateName(p.state())
      << ", incarnation " << p.incarnation() << "\n";
  if (p.fresh_start()) {
    out << "a restart now starts fresh (no step restored)\n";
  } else if (p.memory_step()) {
    out << "a restart now restores step " << p.step() << ", a memory checkpoint (from memory only; the fallback is "
        << (p.has_durable_step() ? absl::StrCat("durable step ", p.durable_step()) : std::string("a fresh start"))
        << ")\n";
  } else {
    out << "a restart now restores step " << p.step() << "\n";
  }
  if (!p.fresh_start() && p.saved_world_size() != 0 && p.saved_world_size() != p.world_size()) {
    out << "  saved by " << p.saved_world_size() << (p.saved_world_size() == 1 ? " rank" : " ranks")
        << ", the job runs " << p.world_size() << ": each rank reads its part resharded from disk\n";
  }
  if (!p.reason().empty()) out << "  why: " << TerminalSafe(p.reason()) << "\n";
  if (!p.fresh_start() && p.ranks_size() > 0) PrintRankSources(out, p);
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
  absl::StatusOr<std::string> token = rpc::ReadOperatorTokenFile(path);
  if (!token.ok()) return absl::InvalidArgumentError(absl::StrCat("--token-file ", path, ": ", token.status().message()));
  return token;
}

absl::StatusOr<std::optional<absl::Duration>> TimeoutFlag(const base::Args& args) {
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
    return base::kExitOk;
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
  return base::kExitOk;
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
  return base::kExitOk;
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
                        base::HumanBytes(p.bytes_done()), base::HumanBytes(p.bytes_total()));
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
      return base::kExitFailed;
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
                           base::HumanBytes(result->bytes_done()), base::HumanBytes(result->bytes_total()));
    for (const std::string& s : problems) out << "    " << TerminalSafe(s) << "\n";
    if (!ok && problems.empty()) out << "    (the coordinator reported a failure without a problem)\n";
  }
  return ok ? base::kExitOk : base::kExitFailed;
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
      return base::kExitUsage;
    }
    return RunOnlineVerify(argv, api, out, err);
  }
  if (has("help") && !has("root")) {
    out << kVerifyHelp << "\n" << kOnlineVerifyHelp;
    return base::kExitOk;
  }
  return RunVerify(fs, argv, out, err);
}

}  // namespace ckptd::cli
