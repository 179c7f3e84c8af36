// ckptd-coordinator: the cluster's coordinator: tracks agents and jobs,
// detects failures, sets the checkpoint schedule, commits global checkpoints
// and plans restores.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <iostream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/strings/string_view.h"
#include "base/clock.h"
#include "base/flags.h"
#include "base/host_port.h"
#include "base/logger.h"
#include "base/open_files.h"
#include "base/posix_error.h"
#include "base/stop_signals.h"
#include "coordinator/audit_log.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/flags.h"
#include "coordinator/standby_service.h"
#include "coordinator/state_store.h"
#ifdef CKPTD_HAVE_ETCD
#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include <optional>

#include "base/status_macros.h"
#include "base/version.h"
#include "coordinator/etcd_state_store.h"
#include "coordinator/state_copy.h"
#include "etcd/etcd_client.h"
#include "etcd/leader_election.h"
#include "etcd/replica_roster.h"
#endif
#include "metrics/http_server.h"
#include "metrics/registry.h"
#include "rpc/operator_token.h"
#include "rpc/tls.h"
#include "storage/file_system.h"
#include "objstore/storage_root.h"
#include "storage/posix_file_system.h"
#include "storage/store.h"

namespace {

namespace co = ckptd::coordinator;
using ckptd::base::kExitFailed;
using ckptd::base::kExitUnavailable;
using ckptd::base::kExitUsage;

// "host:port" with the port replaced by `port`.
std::string WithPort(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  return absl::StrCat(colon == std::string::npos ? listen : listen.substr(0, colon), ":", port);
}

// Mutual TLS with --tls-cert, --tls-key and --tls-ca; none without them.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const co::CoordinatorFlags& flags) {
  if (!flags.tls) return grpc::InsecureServerCredentials();
  return ckptd::rpc::ServerCredentialsFromFiles(*flags.tls);
}

// The coordinator's log: stderr, each line with its time and severity.
ckptd::base::Logger& Log() { return ckptd::base::DefaultLogger(); }

// Logs "<what>: <why>" as an error; returns `code`.
int Fail(absl::string_view what, const absl::Status& why, int code) {
  Log().Error(absl::StrCat(what, ": ", why.message()));
  return code;
}

// The lock file in the state directory that one coordinator at a time holds.
constexpr char kLockFileName[] = "coordinator.lock";

// Holds <state-dir>/coordinator.lock (flock, exclusive) for the process's
// lifetime: two coordinators on one state directory would each commit and
// abort steps, and the second would replace the first's token files. The
// lock file holds the holder's pid. kUnavailable naming the directory (and
// the holder's pid when it wrote one) when another process holds it; other
// errors when the file cannot be opened or locked.
absl::StatusOr<int> LockStateDir(const std::string& state_dir) {
  const std::string path = absl::StrCat(state_dir, "/", kLockFileName);
  // O_NOFOLLOW: a link planted in the directory is not followed to a file
  // elsewhere; the lock file is the owner's alone (0600).
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return ckptd::base::PosixError(absl::StrCat("open ", path), errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      ::close(fd);
      return ckptd::base::PosixError(absl::StrCat("lock ", path), err);
    }
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    ::close(fd);
    int64_t pid = 0;
    const bool known =
        n > 0 && absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(buf, n)), &pid) && pid > 0;
    return absl::UnavailableError(
        absl::StrCat("the state directory ", state_dir, " is in use by another ckptd-coordinator",
                     known ? absl::StrCat(" (pid ", pid, ")") : std::string(), ", which holds ", path,
                     "; stop it first, or give this one a --state-dir of its own"));
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int err = errno;
    ::close(fd);
    return ckptd::base::PosixError(absl::StrCat("write ", path), err);
  }
  return fd;  // never closed: the lock lasts as long as the process
}

// The token operator RPCs must carry, into `token`: --operator-token-file's,
// or a new one that `*generated` says must still be written (by
// WriteGeneratedToken, once both ports are bound: a coordinator that fails
// to start leaves the token file of the one that runs alone). kExitOk, or the
// exit code after saying what failed.
int OperatorToken(const co::CoordinatorFlags& flags, std::string& token, bool* generated) {
  *generated = false;
  if (flags.operator_token_file) {
    absl::StatusOr<std::string> read = ckptd::rpc::ReadOperatorTokenFile(*flags.operator_token_file);
    if (!read.ok()) return Fail("--operator-token-file", read.status(), kExitUsage);
    token = *read;
    return ckptd::base::kExitOk;
  }
  absl::StatusOr<std::string> fresh = ckptd::rpc::GenerateOperatorToken();
  if (!fresh.ok()) return Fail("operator token", fresh.status(), kExitFailed);
  token = *fresh;
  *generated = true;
  return ckptd::base::kExitOk;
}

// The token agent RPCs take, into `token`: --agent-token-file's; the one a
// previous start generated into <state-dir>/agent-token (agents keep theirs
// across a restart of the coordinator); or a new one that `*generated` says
// must still be written (like the operator token). Empty with
// --insecure-agents. kExitOk, or the exit code after saying what failed.
int AgentToken(const co::CoordinatorFlags& flags, std::string& token, bool* generated) {
  *generated = false;
  token.clear();
  if (flags.insecure_agents) return ckptd::base::kExitOk;
  if (flags.agent_token_file) {
    absl::StatusOr<std::string> read = ckptd::rpc::ReadAgentTokenFile(*flags.agent_token_file);
    if (!read.ok()) return Fail("--agent-token-file", read.status(), kExitUsage);
    token = *read;
    return ckptd::base::kExitOk;
  }
  const std::string path = absl::StrCat(flags.state_dir, "/", ckptd::rpc::kAgentTokenFileName);
  absl::StatusOr<std::string> kept = ckptd::rpc::ReadTokenFile(path, "agent token", /*follow_links=*/false);
  if (kept.ok()) {
    token = *kept;
    return ckptd::base::kExitOk;
  }
  if (!absl::IsNotFound(kept.status())) {
    return Fail("agent token", absl::Status(kept.status().code(),
                                            absl::StrCat(kept.status().message(), " (remove it to have a new one made)")),
                kExitFailed);
  }
  absl::StatusOr<std::string> fresh = ckptd::rpc::GenerateToken();
  if (!fresh.ok()) return Fail("agent token", fresh.status(), kExitFailed);
  token = *fresh;
  *generated = true;
  return ckptd::base::kExitOk;
}

// Writes the generated `token` (`what`: "operator token", "agent token") to
// <state-dir>/<file_name>. kExitOk, or the exit code after saying what failed.
int WriteGeneratedToken(const co::CoordinatorFlags& flags, absl::string_view file_name, absl::string_view what,
                        const std::string& token) {
  const std::string path = absl::StrCat(flags.state_dir, "/", file_name);
  if (absl::Status written = ckptd::rpc::WriteTokenFile(path, token); !written.ok()) {
    return Fail(what, written, kExitFailed);
  }
  Log().Info(absl::StrCat(what, " written to ", path));
  return ckptd::base::kExitOk;
}

// The service's credentials: the operator and agent tokens (generated ones
// still to be written, as `*operator_generated` and `*agent_generated` say).
// kExitOk, or the exit code after saying what failed.
int ServiceCredentials(const co::CoordinatorFlags& flags, co::CoordinatorServiceOptions* o, bool* operator_generated,
                       bool* agent_generated) {
  if (int code = OperatorToken(flags, o->operator_token, operator_generated); code != ckptd::base::kExitOk) {
    return code;
  }
  if (int code = AgentToken(flags, o->agent_token, agent_generated); code != ckptd::base::kExitOk) return code;
  // One token for both would let every agent act as an operator.
  if (o->agent_token == o->operator_token) {
    Log().Error(
        "the agent token and the operator token are the same; give each a token of its own (--agent-token-file, "
        "--operator-token-file)");
    return kExitUsage;
  }
  o->insecure_agents = flags.insecure_agents;
  return ckptd::base::kExitOk;
}

// The metrics endpoint of --metrics-listen (null without it); kExitOk, or the
// exit code after saying what failed.
int StartMetrics(const co::CoordinatorFlags& flags, ckptd::metrics::Registry& registry,
                 std::unique_ptr<ckptd::metrics::HttpServer>* http) {
  if (!flags.metrics_listen) return ckptd::base::kExitOk;
  absl::StatusOr<std::unique_ptr<ckptd::metrics::HttpServer>> started =
      ckptd::metrics::HttpServer::Start(*flags.metrics_listen, ckptd::metrics::MetricsHandler(registry));
  if (!started.ok()) {
    return Fail(absl::StrCat("--metrics-listen ", *flags.metrics_listen), started.status(), kExitUnavailable);
  }
  *http = *std::move(started);
  return ckptd::base::kExitOk;
}

// The audit trail: --audit-log's file (opened here, so that a bad one stops
// the start before anything is served) or log lines only; its counts go to
// `metrics`. kExitOk, or the exit code after saying what failed.
int OpenAuditLog(const co::CoordinatorFlags& flags, co::CoordinatorMetrics* metrics,
                 std::unique_ptr<co::AuditLog>* audit) {
  co::AuditLogOptions options;
  options.path = flags.audit_log.value_or("");
  options.observer = metrics;
  absl::StatusOr<std::unique_ptr<co::AuditLog>> opened = co::AuditLog::Open(options);
  if (!opened.ok()) {
    return Fail("--audit-log", opened.status(),
                absl::IsFailedPrecondition(opened.status()) ? kExitUsage : kExitFailed);
  }
  *audit = *std::move(opened);
  if (flags.audit_log) Log().Info(absl::StrCat("audit log ", *flags.audit_log));
  return ckptd::base::kExitOk;
}

#ifdef CKPTD_HAVE_ETCD
// The address standbys name for this replica: --advertise, else --listen
// with the port bound and, for no host or a wildcard one, this host's name.
std::string AdvertisedAddress(const co::CoordinatorFlags& flags, int port) {
  if (!flags.etcd->advertise.empty()) return flags.etcd->advertise;
  absl::StatusOr<std::pair<std::string, uint16_t>> hp = ckptd::base::ParseHostPort(flags.listen);
  std::string host = hp.ok() ? hp->first : std::string();
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    char name[256] = {};
    host = ::gethostname(name, sizeof(name) - 1) == 0 ? name : "localhost";
  }
  if (absl::StrContains(host, ':')) host = absl::StrCat("[", host, "]");
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<std::string> ReadPasswordFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string password(absl::StripTrailingAsciiWhitespace(ss.str()));
  if (password.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " is empty"));
  return password;
}

// Failure events a replicated coordinator keeps in etcd (the newest).
constexpr size_t kEtcdMaxEvents = 10'000;

// --import-state: the single coordinator's state in `dir`, read whole. The
// directory stays locked while this process runs, so that no coordinator
// starts on it and writes what etcd would not see.
absl::StatusOr<co::StateSnapshot> ReadStateToImport(ckptd::storage::FileSystem* fs, const std::string& dir) {
  const std::string db = absl::StrCat(dir, "/", co::kStateDbFileName);
  if (absl::Status there = fs->Stat(db).status(); !there.ok()) {
    return absl::Status(there.code(), absl::StrCat(dir, " holds no coordinator state to import (", db, ": ",
                                                   there.message(), ")"));
  }
  if (absl::StatusOr<int> lock = LockStateDir(dir); !lock.ok()) return lock.status();
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<co::StateStore> sqlite, co::OpenSqliteStateStore(dir));
  return co::ReadState(*sqlite, kEtcdMaxEvents);
}

// Writes `state` into etcd when the prefix holds none; says which.
absl::Status ImportState(const co::StateSnapshot& state, co::StateStore& to, const co::CoordinatorFlags::Etcd& e) {
  CKPTD_ASSIGN_OR_RETURN(const bool empty, co::StateIsEmpty(to));
  if (!empty) {
    Log().Warning(absl::StrCat("--import-state ", e.import_state, ": not imported, etcd already holds state under ",
                               e.prefix, " (imported before, or written by replicas); it is kept as it is"));
    return absl::OkStatus();
  }
  if (absl::Status s = co::WriteState(state, to); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--import-state ", e.import_state, ": ", s.message()));
  }
  Log().Info(absl::StrCat("imported ", co::DescribeState(state), " from ", e.import_state, " into etcd under ",
                          e.prefix));
  return absl::OkStatus();
}

// GetClusterStatus's replication part: the leader (this replica), the
// others present in etcd, and etcd's members.
void FillReplication(const ckptd::etcd::LeaderInfo& leader, const ckptd::etcd::RosterView& view,
                     const co::CoordinatorFlags::Etcd& e, ckptd::v1::CoordinatorReplication* r) {
  r->set_leader(leader.candidate);
  r->set_epoch(static_cast<uint64_t>(leader.epoch));
  for (const std::string& replica : view.replicas) {
    if (replica != leader.candidate) r->add_standbys(replica);
  }
  r->set_etcd_prefix(e.prefix);
  r->set_lease_ttl_seconds(static_cast<uint32_t>(e.lease_ttl_seconds));
  for (const ckptd::etcd::MemberHealth& h : view.members) {
    ckptd::v1::CoordinatorReplication::EtcdMember* m = r->add_etcd_members();
    m->set_endpoint(h.endpoint);
    m->set_healthy(h.healthy);
    m->set_error(h.error);
    m->set_version(h.version);
    m->set_raft_leader(h.raft_leader);
    m->set_db_size_bytes(h.db_size_bytes);
  }
  if (view.checked != absl::InfinitePast()) r->set_checked_unix_nanos(absl::ToUnixNanos(view.checked));
}

// One leadership: the state store on etcd, the core recovered from it and
// storage, the service on the --listen port. Gone when the leadership ends.
struct Leadership {
  int64_t epoch = 0;
  std::unique_ptr<co::StateStore> state;
  std::unique_ptr<co::CoordinatorCore> core;
  ckptd::metrics::CollectorHandle collector;
  std::unique_ptr<co::CoordinatorService> service;
  co::CoordinatorServer server;

  ~Leadership() {
    if (server.server != nullptr) co::ShutdownCoordinatorServer(server.server.get());
    service.reset();  // stops the ticker
    collector.Reset();
    core.reset();
    state.reset();
  }
};

// Replicated coordinators (--etcd-endpoints): campaigns through etcd, serves
// as the leader while it leads and as a standby otherwise, until SIGINT or
// SIGTERM (then resigns, so that another takes over at once).
int RunReplicated(const co::CoordinatorFlags& flags, const std::shared_ptr<grpc::ServerCredentials>& credentials,
                  const co::CoordinatorServiceOptions& service_options, ckptd::storage::CheckpointStore* store,
                  ckptd::base::Clock* clock, co::CoordinatorMetrics* metrics, const sigset_t& stop_signals,
                  const co::StateSnapshot* import) {
  const co::CoordinatorFlags::Etcd& e = *flags.etcd;
  ckptd::etcd::EtcdOptions etcd_options;
  etcd_options.endpoints = e.endpoints;
  etcd_options.tls = e.tls;
  etcd_options.user = e.user;
  if (!e.password_file.empty()) {
    absl::StatusOr<std::string> password = ReadPasswordFile(e.password_file);
    if (!password.ok()) return Fail("--etcd-password-file", password.status(), kExitUsage);
    etcd_options.password = *password;
  }
  etcd_options.on_call = [metrics](absl::string_view call, absl::Duration took, const absl::Status& result) {
    metrics->OnEtcdCall(call, took, result);
  };
  metrics->SetLeadership(false, 0);
  absl::StatusOr<std::unique_ptr<ckptd::etcd::EtcdClient>> etcd = ckptd::etcd::EtcdClient::Connect(etcd_options);
  if (!etcd.ok()) return Fail("etcd", etcd.status(), kExitUsage);

  // The standby answer names the leader the election knows.
  std::atomic<ckptd::etcd::LeaderElection*> election_for_answers{nullptr};
  std::string advertise;
  auto answer = [&]() {
    co::StandbyAnswer a;
    ckptd::etcd::LeaderElection* el = election_for_answers.load();
    const ckptd::etcd::LeaderInfo info = el != nullptr ? el->Leader() : ckptd::etcd::LeaderInfo();
    if (info.candidate.empty() || info.self) {
      a.message = absl::StrCat("ckptd-coordinator ", advertise,
                               " is a standby and no coordinator leads at the moment (an election is under way); "
                               "retry shortly");
    } else {
      a.message = absl::StrCat("ckptd-coordinator ", advertise, " is a standby; the leader is ", info.candidate,
                               " (epoch ", info.epoch, ")");
      a.leader = info.candidate;
    }
    return a;
  };
  // gRPC takes a generic service for one server only: each standby spell
  // has a service of its own.
  struct Standby {
    std::unique_ptr<co::StandbyService> service;
    co::CoordinatorServer server;
    ~Standby() {
      if (server.server != nullptr) co::ShutdownCoordinatorServer(server.server.get(), absl::ZeroDuration());
    }
  };
  auto start_standby = [&](const std::string& address) -> absl::StatusOr<std::unique_ptr<Standby>> {
    auto s = std::make_unique<Standby>();
    s->service = std::make_unique<co::StandbyService>(answer);
    absl::StatusOr<co::CoordinatorServer> server = co::StartStandbyServer(address, s->service.get(), credentials);
    if (!server.ok()) return server.status();
    s->server = std::move(*server);
    return s;
  };
  absl::StatusOr<std::unique_ptr<Standby>> first = start_standby(flags.listen);
  if (!first.ok()) {
    return Fail(absl::StrCat("--listen ", flags.listen), first.status(),
                absl::IsInvalidArgument(first.status()) ? kExitUsage : kExitUnavailable);
  }
  std::unique_ptr<Standby> standby = std::move(*first);
  const int port = standby->server.port;
  const std::string listen = WithPort(flags.listen, port);
  advertise = AdvertisedAddress(flags, port);

  ckptd::etcd::ElectionOptions election_options;
  election_options.key = absl::StrCat(e.prefix, "/leader");
  election_options.candidate = advertise;
  election_options.lease_ttl_seconds = e.lease_ttl_seconds;
  election_options.keepalive_every = absl::Seconds(e.lease_ttl_seconds) / 3;
  election_options.poll_every = absl::Milliseconds(250);
  ckptd::etcd::LeaderElection election(etcd->get(), election_options);
  election_for_answers = &election;
  if (absl::Status s = election.Start(); !s.ok()) return Fail("election", s, kExitUsage);
  // The replicas and etcd's health, for ckptctl status.
  ckptd::etcd::RosterOptions roster_options;
  roster_options.prefix = e.prefix;
  roster_options.self = advertise;
  roster_options.ttl_seconds = std::max<int64_t>(10, e.lease_ttl_seconds);
  ckptd::etcd::ReplicaRoster roster(etcd->get(), roster_options);
  if (absl::Status s = roster.Start(); !s.ok()) return Fail("replica roster", s, kExitUsage);
  co::CoordinatorServiceOptions leader_service_options = service_options;
  leader_service_options.replication = [&election, &roster, &e](ckptd::v1::CoordinatorReplication* r) {
    FillReplication(election.Leader(), roster.View(), e, r);
  };
  Log().Info(absl::StrCat("replicated through etcd ", absl::StrJoin(e.endpoints, ","), " under ", e.prefix, " as ",
                          advertise, " (lease TTL ", e.lease_ttl_seconds, "s)"));
  Log().Info(absl::StrCat("standby on ", listen));

  std::atomic<bool> stopping{false};
  std::thread signals([&] {
    const int sig = ckptd::base::WaitForStopSignal(stop_signals);
    Log().Info(absl::StrCat("stopping on signal ", sig));
    stopping = true;
  });

  std::unique_ptr<Leadership> leading;
  ckptd::etcd::LeaderInfo known;
  while (!stopping) {
    const ckptd::etcd::LeaderInfo info = election.AwaitChange(known, absl::Milliseconds(200));
    if (stopping) break;
    known = info;
    if (leading != nullptr && (!info.self || info.epoch != leading->epoch)) {
      Log().Warning(absl::StrCat("no longer the leader of epoch ", leading->epoch, " (",
                                 info.self ? absl::StrCat("leading again, as epoch ", info.epoch)
                                           : std::string(election.Leading().status().message()),
                                 "); standing by"));
      leading.reset();
    }
    if (info.self && leading == nullptr) {
      const absl::Time won = absl::Now();
      auto l = std::make_unique<Leadership>();
      l->epoch = info.epoch;
      absl::StatusOr<std::unique_ptr<co::StateStore>> state =
          co::OpenEtcdStateStore(etcd->get(), &election, co::EtcdStateStoreOptions{e.prefix, kEtcdMaxEvents, 1000});
      absl::Status recovered = state.status();
      if (recovered.ok()) {
        l->state = std::move(*state);
        if (import != nullptr) recovered = ImportState(*import, *l->state, e);
      }
      if (recovered.ok()) {
        import = nullptr;  // once
        co::CoordinatorOptions options = flags.options;
        // A replica that lost its leadership writes nothing more.
        options.may_write = [&election] { return election.Leading().status(); };
        options.epoch = static_cast<uint64_t>(info.epoch);
        // The drill KILL_COORDINATOR: this process dies as a crashed leader
        // would, once the answer is out.
        options.kill_self = [advertise]() {
          std::thread([] {
            absl::SleepFor(absl::Milliseconds(300));
            Log().Warning("drill KILL_COORDINATOR: SIGKILL to this process");
            ::kill(::getpid(), SIGKILL);
          }).detach();
          return advertise;
        };
        l->core = std::make_unique<co::CoordinatorCore>(store, l->state.get(), clock, options, metrics);
        recovered = l->core->Recover();
      }
      if (!recovered.ok()) {
        Log().Error(absl::StrCat("leading (epoch ", info.epoch, ") but cannot recover the state: ",
                                 recovered.message(), "; stepping down"));
        election.Fenced(info.epoch, "recovery failed");
        continue;
      }
      l->collector = metrics->Watch(l->core.get());
      l->service = std::make_unique<co::CoordinatorService>(l->core.get(), leader_service_options);
      standby.reset();
      absl::StatusOr<co::CoordinatorServer> server = co::StartCoordinatorServer(listen, l->service.get(), credentials);
      if (!server.ok()) {
        Log().Error(absl::StrCat("leading but cannot serve on ", listen, ": ", server.status().message(),
                                 "; stepping down"));
        election.Fenced(info.epoch, "cannot serve");
        l.reset();
      } else {
        l->server = std::move(*server);
        leading = std::move(l);
        Log().Info(absl::StrCat("leading (epoch ", info.epoch, "), serving on ", listen, " after ",
                                absl::FormatDuration(absl::Now() - won), " of recovery"));
      }
    }
    metrics->SetLeadership(leading != nullptr, info.epoch);
    if (leading == nullptr && standby == nullptr) {
      absl::StatusOr<std::unique_ptr<Standby>> again = start_standby(listen);
      if (again.ok()) {
        standby = std::move(*again);
      } else {
        Log().Error(absl::StrCat("cannot serve as a standby on ", listen, ": ", again.status().message()));
      }
    }
  }
  leading.reset();
  standby.reset();
  election_for_answers = nullptr;
  election.Stop();  // resigns
  roster.Stop();    // withdraws this replica
  signals.join();
  return ckptd::base::kExitOk;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  ckptd::base::SetProgramName("ckptd-coordinator");
  if (ckptd::base::AsksForVersion(std::vector<std::string>(argv + 1, argv + argc))) {
    std::cout << ckptd::base::VersionLine("ckptd-coordinator") << "\n";
    return 0;
  }
  const sigset_t stop_signals = ckptd::base::BlockStopSignals();
  absl::StatusOr<co::CoordinatorFlags> flags =
      co::ParseCoordinatorFlags(std::vector<std::string>(argv + 1, argv + argc));
  if (!flags.ok()) {
    std::cerr << "ckptd-coordinator: " << flags.status().message() << "\n" << co::kCoordinatorUsage;
    return kExitUsage;
  }
  if (flags->help) {
    std::cout << co::kCoordinatorUsage;
    return ckptd::base::kExitOk;
  }
  // Every connection is a file.
  if (const std::string warning = ckptd::base::RaiseOpenFileLimitForServer("agents and operators"); !warning.empty()) {
    Log().Warning(warning);
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = ServerCredentials(*flags);
  if (!credentials.ok()) return Fail("TLS", credentials.status(), kExitUsage);
  std::unique_ptr<ckptd::storage::PosixFileSystem> fs = ckptd::storage::NewPosixFileSystem();
  // A directory or an object store (s3://bucket/prefix).
  absl::StatusOr<ckptd::objstore::StorageRoot> root = ckptd::objstore::OpenStorageRoot(flags->storage_root, fs.get());
  if (!root.ok()) return Fail("storage root", root.status(), kExitFailed);
  flags->storage_root = root->path;
  if (absl::Status s = ckptd::storage::CreateDirs(root->fs, flags->storage_root); !s.ok()) {
    return Fail("storage root", s, kExitFailed);
  }
  ckptd::objstore::AbortAbandonedUploads(*root, Log());
#ifdef CKPTD_HAVE_ETCD
  if (flags->etcd) {
    co::CoordinatorServiceOptions service_options;
    bool generated = false;
    if (int code = ServiceCredentials(*flags, &service_options, &generated, &generated); code != ckptd::base::kExitOk) {
      return code;
    }
    ckptd::base::RealClock clock;
    ckptd::storage::CheckpointStore store(root->fs, flags->storage_root, &clock);
    ckptd::metrics::Registry registry;
    absl::StatusOr<std::unique_ptr<co::CoordinatorMetrics>> metrics = co::CoordinatorMetrics::Create(&registry);
    if (!metrics.ok()) return Fail("metrics", metrics.status(), kExitFailed);
    // One audit trail for every leadership of this replica.
    std::unique_ptr<co::AuditLog> audit;
    if (int code = OpenAuditLog(*flags, metrics->get(), &audit); code != ckptd::base::kExitOk) return code;
    service_options.audit_log = audit.get();
    std::unique_ptr<ckptd::metrics::HttpServer> http;
    if (int code = StartMetrics(*flags, registry, &http); code != ckptd::base::kExitOk) return code;
    if (http != nullptr) {
      Log().Info(absl::StrCat("metrics on http://", WithPort(*flags->metrics_listen, http->port()), "/metrics"));
    }
    Log().Info(absl::StrCat("storage root ", root->description, flags->tls ? ", mutual TLS" : ", no TLS"));
    std::optional<co::StateSnapshot> import;
    if (!flags->etcd->import_state.empty()) {
      absl::StatusOr<co::StateSnapshot> read = ReadStateToImport(fs.get(), flags->etcd->import_state);
      if (!read.ok()) return Fail("--import-state", read.status(), kExitFailed);
      Log().Info(absl::StrCat("--import-state ", flags->etcd->import_state, ": ", co::DescribeState(*read),
                              " to import when this replica leads"));
      import = *std::move(read);
    }
    const int code = RunReplicated(*flags, *credentials, service_options, &store, &clock, metrics->get(), stop_signals,
                                   import ? &*import : nullptr);
    if (http != nullptr) http->Stop();
    return code;
  }
#endif
  // The lock comes first: nothing in the state directory (the database, the
  // token) is touched while another coordinator runs on it.
  if (absl::Status s = ckptd::storage::CreateDirs(fs.get(), flags->state_dir); !s.ok()) {
    return Fail("state directory", s, kExitFailed);
  }
  if (absl::Status s = fs->SyncDir(ckptd::storage::DirName(flags->state_dir)); !s.ok()) {
    return Fail("state directory", s, kExitFailed);
  }
  if (absl::StatusOr<int> lock = LockStateDir(flags->state_dir); !lock.ok()) {
    return Fail("state directory", lock.status(), absl::IsUnavailable(lock.status()) ? kExitUnavailable : kExitFailed);
  }
  absl::StatusOr<std::unique_ptr<co::StateStore>> state = co::OpenSqliteStateStore(flags->state_dir);
  if (!state.ok()) {
    return Fail("state database", state.status(), absl::IsUnavailable(state.status()) ? kExitUnavailable : kExitFailed);
  }
  co::CoordinatorServiceOptions service_options;
  bool token_generated = false;
  bool agent_token_generated = false;
  if (int code = ServiceCredentials(*flags, &service_options, &token_generated, &agent_token_generated);
      code != ckptd::base::kExitOk) {
    return code;
  }

  ckptd::base::RealClock clock;
  ckptd::storage::CheckpointStore store(root->fs, flags->storage_root, &clock);
  ckptd::metrics::Registry registry;
  absl::StatusOr<std::unique_ptr<co::CoordinatorMetrics>> metrics = co::CoordinatorMetrics::Create(&registry);
  if (!metrics.ok()) return Fail("metrics", metrics.status(), kExitFailed);
  std::unique_ptr<co::AuditLog> audit;
  if (int code = OpenAuditLog(*flags, metrics->get(), &audit); code != ckptd::base::kExitOk) return code;
  service_options.audit_log = audit.get();
  co::CoordinatorCore core(&store, state->get(), &clock, flags->options, metrics->get());
  if (absl::Status s = core.Recover(); !s.ok()) return Fail("recovering state", s, kExitFailed);
  ckptd::metrics::CollectorHandle collector = (*metrics)->Watch(&core);

  std::unique_ptr<ckptd::metrics::HttpServer> http;
  if (int code = StartMetrics(*flags, registry, &http); code != ckptd::base::kExitOk) return code;
  auto service = std::make_unique<co::CoordinatorService>(&core, service_options);
  absl::StatusOr<co::CoordinatorServer> server = co::StartCoordinatorServer(flags->listen, service.get(), *credentials);
  if (!server.ok()) {
    return Fail(absl::StrCat("--listen ", flags->listen), server.status(),
                absl::IsInvalidArgument(server.status()) ? kExitUsage : kExitUnavailable);
  }
  // Both ports are bound: only now are generated tokens written.
  for (const auto& [generated, file_name, what, token] :
       {std::tuple(token_generated, ckptd::rpc::kOperatorTokenFileName, "operator token",
                   &service_options.operator_token),
        std::tuple(agent_token_generated, ckptd::rpc::kAgentTokenFileName, "agent token",
                   &service_options.agent_token)}) {
    if (!generated) continue;
    if (int code = WriteGeneratedToken(*flags, file_name, what, *token); code != ckptd::base::kExitOk) {
      co::ShutdownCoordinatorServer(server->server.get());
      if (http != nullptr) http->Stop();
      return code;
    }
  }
  if (flags->insecure_agents) {
    Log().Warning(absl::StrCat("--insecure-agents: agent RPCs need no credential; anyone who can reach port ",
                               server->port,
                               " can register nodes, report failures and restart jobs (give agents the agent token "
                               "or a certificate instead)"));
  }
  if (http != nullptr) {
    Log().Info(absl::StrCat("metrics on http://", WithPort(*flags->metrics_listen, http->port()), "/metrics"));
  }
  Log().Info(absl::StrCat("storage root ", root->description, ", state ", flags->state_dir,
                          flags->tls ? ", mutual TLS" : ", no TLS",
                          flags->insecure_agents ? ", agents unauthenticated"
                          : flags->tls           ? ", agents by certificate or agent token"
                                                 : ", agents by agent token"));
  Log().Info(absl::StrCat("listening on ", WithPort(flags->listen, server->port)));

  const int sig = ckptd::base::WaitForStopSignal(stop_signals);
  Log().Info(absl::StrCat("stopping on signal ", sig));
  co::ShutdownCoordinatorServer(server->server.get());
  if (http != nullptr) http->Stop();
  service.reset();  // stops the ticker
  collector.Reset();
  return ckptd::base::kExitOk;
}
