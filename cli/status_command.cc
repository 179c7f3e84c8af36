// ckptctl status (cli/operator_commands.h): the cluster as the coordinator
// sees it, as tables or as one JSON object.

#include "cli/operator_commands.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/format.h"
#include "base/json.h"
#include "cli/command.h"

namespace ckptd::cli {

const char kStatusHelp[] =
    "usage: ckptctl status --coordinator HOST:PORT[,HOST:PORT...] [--job J] [--json]\n"
    "\n"
    "The cluster as the coordinator sees it: every agent (alive or lost, the time\n"
    "since its last heartbeat, the ranks it hosts), every job (state, world size,\n"
    "ranks alive, fastest and slowest rank's step, newest committed step, the\n"
    "schedule's every_steps (and 1 in K durable, with two cadences), the newest\n"
    "memory checkpoint, the interval policy's choice and its expected waste,\n"
    "step time, checkpoints committed and aborted, pending and quarantined\n"
    "steps, shards that could not be persisted with the newest one's error), and\n"
    "the 10 newest failures with their age. With peer replication, each agent's\n"
    "failure domain, peer address and the partners it sends its snapshots to, and\n"
    "per job the ranks of the newest committed step another node holds in memory.\n"
    "With replicated coordinators (--etcd-endpoints), first the leader, its epoch,\n"
    "the standbys present, and each etcd member's health (raft leader, version,\n"
    "database size, or why it does not answer).\n"
    "\n"
    "  --coordinator HOST:PORT[,...]  the coordinator to ask, or its replicas (the leader answers)\n"
    "  --tls-ca F --tls-cert F --tls-key F\n"
    "                           mutual TLS (PEM files), as the coordinator was started with\n"
    "  --job J                  only job J (and its failures)\n"
    "  --json                   one JSON object instead of the tables\n"
    "\n"
    "exit status: 0 success, 1 no such job (or the coordinator refused), 2 usage\n"
    "error, 3 the coordinator cannot be reached\n";

namespace {

// The schedule's rule in the EVERY column: "100" (every checkpoint
// durable), "100 (1 in 4 durable)" with two cadences, "-" without a rule.
std::string EveryCell(const ckptd::v1::Schedule& s) {
  if (s.every_steps() == 0) return "-";
  if (s.durable_every() <= 1) return absl::StrCat(s.every_steps());
  return absl::StrCat(s.every_steps(), " (1 in ", s.durable_every(), " durable)");
}

constexpr uint32_t kStatusEvents = 10;

// "replication": the replicas and etcd's members, or null for a single
// coordinator.
void WriteReplicationJson(JsonWriter& w, const ckptd::v1::GetClusterStatusResponse& cs) {
  w.Key("replication");
  if (!cs.has_replication()) {
    w.Null();
    return;
  }
  const ckptd::v1::CoordinatorReplication& r = cs.replication();
  w.BeginObject();
  w.Field("leader", r.leader());
  w.Field("epoch", r.epoch());
  w.Key("standbys");
  w.BeginArray();
  for (const std::string& s : r.standbys()) w.String(s);
  w.EndArray();
  w.Field("etcd_prefix", r.etcd_prefix());
  w.Field("lease_ttl_seconds", r.lease_ttl_seconds());
  NullableTime(w, "etcd_checked", r.checked_unix_nanos());
  w.Key("etcd_members");
  w.BeginArray();
  for (const auto& m : r.etcd_members()) {
    w.BeginObject();
    w.Field("endpoint", m.endpoint());
    w.Field("healthy", m.healthy());
    w.Field("error", m.error());
    w.Field("version", m.version());
    w.Field("raft_leader", m.raft_leader());
    w.Field("db_size_bytes", m.db_size_bytes());
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
}

// The replicas and etcd's members, after the coordinator line.
void PrintReplication(std::ostream& out, absl::Time now, const ckptd::v1::CoordinatorReplication& r) {
  out << "coordinators: leader " << TerminalSafe(r.leader()) << " (epoch " << r.epoch() << "), "
      << (r.standbys_size() == 0 ? std::string("no standby (nothing takes over if it dies)")
                                 : TerminalSafe(absl::StrCat(r.standbys_size() == 1 ? "standby " : "standbys ",
                                                             absl::StrJoin(r.standbys(), ", "))))
      << "; etcd prefix " << TerminalSafe(r.etcd_prefix()) << ", lease " << r.lease_ttl_seconds() << "s\n";
  int healthy = 0;
  for (const auto& m : r.etcd_members()) healthy += m.healthy();
  out << "etcd: " << healthy << " of " << r.etcd_members_size() << " members healthy"
      << (2 * healthy <= r.etcd_members_size() && r.etcd_members_size() > 0 ? " (no quorum seen from here)" : "")
      << (r.checked_unix_nanos() != 0
              ? absl::StrCat(", checked ", ShortDuration(SecondsSince(now, r.checked_unix_nanos())), " ago")
              : std::string(", not checked yet"))
      << "\n";
  if (r.etcd_members_size() > 0) {
    Table t({"MEMBER", "STATE", "RAFT", "VERSION", "DB SIZE"});
    for (const auto& m : r.etcd_members()) {
      t.Add({m.endpoint(), m.healthy() ? "healthy" : TerminalSafe(absl::StrCat("DOWN: ", m.error())),
             m.healthy() ? (m.raft_leader() ? "leader" : "follower") : "-", m.version().empty() ? "-" : m.version(),
             m.healthy() ? base::HumanBytes(static_cast<uint64_t>(std::max<int64_t>(0, m.db_size_bytes()))) : "-"});
    }
    t.Print(out);
  }
  out << "\n";
}

void PrintStatusJson(const Command& c, absl::Time now, const ckptd::v1::GetClusterStatusResponse& cs,
                     const std::vector<const ckptd::v1::JobStatus*>& jobs,
                     const std::map<std::string, ckptd::v1::IntervalStatus>& intervals,
                     const ckptd::v1::ListEventsResponse& events) {
  JsonWriter w;
  w.BeginObject();
  w.Field("coordinator", *c.args().Get("coordinator"));
  WriteReplicationJson(w, cs);
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
    w.Field("failure_domain", a.failure_domain());
    w.Field("peer_address", a.peer_address());
    w.Field("replicas", a.replicas());
    w.Key("send_to");
    w.BeginArray();
    for (const std::string& n : a.send_to()) w.String(n);
    w.EndArray();
    w.Field("replication_sent", a.replication_sent());
    w.Field("replication_failed", a.replication_failed());
    w.Field("replication_error", a.replication_error());
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
    w.Field("state", JobStateName(*j));
    w.Field("world_size", j->world_size());
    w.Field("ranks_alive", j->ranks_alive());
    w.Field("fastest_step", j->fastest_step());
    w.Field("slowest_step", j->slowest_step());
    NullableUint(w, "newest_committed_step", j->has_committed(), j->newest_committed_step());
    NullableUint(w, "peer_copies", j->has_committed(), j->peer_copies());
    w.Field("every_steps", j->schedule().every_steps());
    w.Field("durable_every", std::max<uint64_t>(1, j->schedule().durable_every()));
    NullableUint(w, "newest_memory_checkpoint", j->has_memory_checkpoint(), j->newest_memory_checkpoint());
    w.Field("memory_checkpoint_restorable", j->memory_checkpoint_restorable());
    NullableUint(w, "memory_checkpoint_peer_copies", j->has_memory_checkpoint(), j->memory_checkpoint_peer_copies());
    w.Field("start_step", j->schedule().start_step());
    UintArray(w, "extra_steps", j->schedule().extra_steps());
    w.Field("incarnation", j->schedule().incarnation());
    NullablePositive(w, "step_seconds", j->step_seconds());
    w.Field("checkpoints_committed", j->checkpoints_committed());
    w.Field("checkpoints_aborted", j->checkpoints_aborted());
    UintArray(w, "pending_steps", j->pending_steps());
    UintArray(w, "quarantined_steps", j->quarantined_steps());
    w.Key("restore_blocked");
    if (j->restore_blocked().empty()) {
      w.Null();
    } else {
      w.String(j->restore_blocked());
    }
    w.Key("last_restore");
    if (!j->has_last_restore()) {
      w.Null();
    } else {
      WriteRestoreSummary(w, j->last_restore());
    }
    w.Field("persist_failures", j->persist_failures());
    w.Key("last_persist_failure");
    if (j->persist_failures() == 0) {
      w.Null();
    } else {
      w.BeginObject();
      w.Field("detail", j->last_persist_failure());
      NullableTime(w, "time", j->last_persist_failure_unix_nanos());
      w.EndObject();
    }
    w.Field("snapshots_skipped", j->snapshots_skipped());
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
  if (cs.has_replication()) PrintReplication(out, now, cs.replication());
  int alive = 0;
  for (const auto& a : cs.agents()) alive += a.alive();
  out << "agents: " << cs.agents_size() << " (" << alive << " alive)\n";
  // Peer replication is in use when an agent registered a peer address.
  const bool replicating =
      std::any_of(cs.agents().begin(), cs.agents().end(), [](const auto& a) { return !a.peer_address().empty(); });
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
  if (replicating) {
    out << "\nreplication (peer memory):\n";
    Table t({"NODE", "DOMAIN", "PEER ADDRESS", "PARTNERS", "COPIES"});
    std::vector<std::string> failing;
    for (const auto& a : cs.agents()) {
      if (a.peer_address().empty()) continue;
      std::string partners = a.send_to_size() == 0 ? "none" : absl::StrJoin(a.send_to(), ",");
      if (!a.alive()) {
        partners = "- (lost)";
      } else if (static_cast<uint32_t>(a.send_to_size()) < a.replicas()) {
        absl::StrAppend(&partners, " (", a.send_to_size(), " of ", a.replicas(), " asked for)");
      }
      std::string copies = absl::StrCat(a.replication_sent(), " sent");
      if (a.replication_failed() > 0) {
        absl::StrAppend(&copies, ", ", a.replication_failed(), " FAILED");
        failing.push_back(TerminalSafe(absl::StrCat(a.node_id(), ": ", a.replication_failed(),
                                                    " peer copies failed; its checkpoints are on disk only. Last: ",
                                                    a.replication_error())));
      }
      t.Add({a.node_id(), a.failure_domain().empty() ? "-" : a.failure_domain(), a.peer_address(), partners, copies});
    }
    t.Print(out);
    for (const std::string& f : failing) out << "  " << f << "\n";
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
      t.Add({j->job(), JobStateName(*j), absl::StrCat(j->world_size()),
             absl::StrCat(j->ranks_alive(), "/", j->world_size()), absl::StrCat(j->fastest_step()),
             absl::StrCat(j->slowest_step()), j->has_committed() ? absl::StrCat(j->newest_committed_step()) : "-",
             EveryCell(j->schedule()), interval, waste});
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
      if (j->has_memory_checkpoint()) {
        std::string copies = j->memory_checkpoint_restorable() ? " (every rank's copy in memory"
                                                               : " (not every rank's copy is in memory";
        if (j->memory_checkpoint_peer_copies() > 0) {
          absl::StrAppend(&copies, ", ", j->memory_checkpoint_peer_copies(), "/", j->world_size(), " on a partner");
        }
        parts.push_back(absl::StrCat("memory checkpoint ", j->newest_memory_checkpoint(), copies, ")"));
      }
      if (j->schedule().extra_steps_size() > 0) {
        parts.push_back(absl::StrCat("manual targets ", absl::StrJoin(j->schedule().extra_steps(), ",")));
      }
      if (j->persist_failures() > 0) {
        std::string last = j->last_persist_failure();
        if (j->last_persist_failure_unix_nanos() != 0) {
          absl::StrAppend(&last, ", ", ShortDuration(SecondsSince(now, j->last_persist_failure_unix_nanos())), " ago");
        }
        parts.push_back(absl::StrCat("persist failures: ", j->persist_failures(), " (last: ", last, ")"));
      }
      if (j->snapshots_skipped() > 0) {
        parts.push_back(absl::StrCat("snapshots skipped: ", j->snapshots_skipped(),
                                     " (no free staging slot: slot_wait, every, ckptd-agent --slots)"));
      }
      if (j->has_committed() && (replicating || j->peer_copies() > 0)) {
        parts.push_back(absl::StrCat("peer copies ", j->peer_copies(), "/", j->world_size(), " ranks of step ",
                                     j->newest_committed_step()));
      }
      if (!j->restore_blocked().empty()) parts.push_back(absl::StrCat("RESTORE HELD BACK: ", j->restore_blocked()));
      if (j->has_last_restore()) {
        const ckptd::v1::RestoreSummary& r = j->last_restore();
        parts.push_back(absl::StrCat("last restore: step ", r.step(), " (incarnation ", r.incarnation(), ")",
                                     r.ranks_size() > 0 ? ", " : "", RestoreSourcesText(r)));
      }
      auto it = intervals.find(j->job());
      if (it != intervals.end() && !it->second.decided() && !it->second.waiting_for().empty()) {
        parts.push_back(absl::StrCat("policy waiting for ", it->second.waiting_for()));
      }
      out << "  " << TerminalSafe(absl::StrCat(j->job(), ": ", absl::StrJoin(parts, "; "))) << "\n";
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

}  // namespace

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
  return base::kExitOk;
}

}  // namespace ckptd::cli
