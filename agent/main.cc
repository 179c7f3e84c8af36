// ckptd-agent: the per-node sidecar that owns staging memory and persists and
// restores the trainers' checkpoints.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/agent_core.h"
#include "agent/agent_metrics.h"
#include "agent/agent_service.h"
#include "agent/coordinator_link.h"
#include "agent/drills.h"
#include "agent/flags.h"
#include "base/cpu_set.h"
#include "base/flags.h"
#include "base/logger.h"
#include "base/open_files.h"
#include "base/stop_signals.h"
#include "base/status_macros.h"
#include "base/thread.h"
#include "base/version.h"
#include "metrics/http_server.h"
#include "metrics/registry.h"
#include "objstore/storage_root.h"
#include "replication/peer_service.h"
#include "replication/replica_store.h"
#include "replication/replicator.h"
#include "staging/staging.h"
#include "storage/fault_injection_file_system.h"
#include "storage/file_system.h"
#include "storage/posix_file_system.h"

namespace {

namespace agent = ckptd::agent;
namespace replication = ckptd::replication;
namespace storage = ckptd::storage;

// How long past --shutdown-grace the agent may take to stop before it
// exits regardless (the flush allowance of docs/operations.md's budget).
constexpr absl::Duration kShutdownOverrun = absl::Seconds(5);
// The threads an agent must be able to run at once to start.
constexpr int kStartThreads = 32;

// The agent's log: stderr, each line with its time and severity.
ckptd::base::Logger& Log() { return ckptd::base::DefaultLogger(); }

// Logs "<what>: <why>" as an error; returns `code`.
int Fail(absl::string_view what, const absl::Status& why, int code = ckptd::base::kExitFailed) {
  Log().Error(absl::StrCat(what, ": ", why.message()));
  return code;
}

// The link and the core refer to each other: the link asks the core for
// heartbeat contents, and hands heartbeat answers to the drill executor,
// through this relay; both are cut (Connect(nullptr, nullptr)) before they go.
class HeartbeatRelay {
 public:
  void Connect(agent::AgentCore* core, agent::DrillExecutor* drills) {
    absl::MutexLock l(&mu_);
    core_ = core;
    drills_ = drills;
  }
  void Fill(ckptd::v1::Heartbeat* hb) {
    absl::MutexLock l(&mu_);
    if (core_ != nullptr) core_->FillHeartbeat(hb);
    if (drills_ != nullptr) drills_->FillReports(hb);
  }
  void OnAck(const ckptd::v1::HeartbeatAck& ack) {
    absl::MutexLock l(&mu_);
    if (drills_ != nullptr) drills_->OnAck(ack);
    if (core_ != nullptr) core_->OnPersistOrders(ack.persist());
    if (core_ != nullptr) core_->OnCommittedSteps(ack);
    if (replicator_ != nullptr) replicator_->SetPartners(ack.send_to());
    if (peer_service_ != nullptr) peer_service_->SetSenders(ack.receive_from());
  }
  // The key of the latest registration, for the Peer service's fetch
  // tickets (kept for a service connected later).
  void OnRegistered(const ckptd::v1::RegisterAgentResponse& response) {
    absl::MutexLock l(&mu_);
    fetch_key_ = response.fetch_key();
    if (peer_service_ != nullptr) peer_service_->SetFetchKey(fetch_key_);
  }
  // Peer replication: who to send to and whom to take copies from.
  void ConnectPeers(replication::Replicator* replicator, replication::PeerService* service) {
    absl::MutexLock l(&mu_);
    replicator_ = replicator;
    peer_service_ = service;
    if (peer_service_ != nullptr && !fetch_key_.empty()) peer_service_->SetFetchKey(fetch_key_);
  }

 private:
  absl::Mutex mu_;
  replication::Replicator* replicator_ ABSL_GUARDED_BY(mu_) = nullptr;
  replication::PeerService* peer_service_ ABSL_GUARDED_BY(mu_) = nullptr;
  agent::AgentCore* core_ ABSL_GUARDED_BY(mu_) = nullptr;
  agent::DrillExecutor* drills_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string fetch_key_ ABSL_GUARDED_BY(mu_);
};

// Testing and drills: slow storage (so that a persist is reliably in flight),
// and storage faults that drills switch on and off. Null without either.
std::unique_ptr<storage::FaultInjectionFileSystem> NewFaultFileSystem(const agent::AgentFlags& flags,
                                                                      storage::FileSystem* fs) {
  if (flags.inject_write_latency == absl::ZeroDuration() && !flags.allow_drills) return nullptr;
  auto fault_fs = std::make_unique<storage::FaultInjectionFileSystem>(fs);
  if (flags.inject_write_latency > absl::ZeroDuration()) {
    fault_fs->SetLatency(flags.inject_write_latency);
    Log().Warning(absl::StrCat("injecting ", absl::FormatDuration(flags.inject_write_latency),
                               " of latency into every write and read"));
  }
  return fault_fs;
}

// Without --allow-drills the executor only refuses (and reports) orders.
std::unique_ptr<agent::DrillExecutor> NewDrillExecutor(const agent::AgentFlags& flags, agent::AgentCore* core,
                                                       agent::CoordinatorLink* link,
                                                       storage::FaultInjectionFileSystem* fault_fs,
                                                       storage::FileSystem* real_fs) {
  agent::DrillOptions options;
  options.allowed = flags.allow_drills;
  options.storage_root = flags.options.storage_root;
  agent::DrillHooks hooks;
  hooks.find_trainer = [core](const std::string& job, uint32_t rank) { return core->FindTrainer(job, rank); };
  hooks.list_trainers = [core] { return core->Trainers(); };
  hooks.corrupt_kept = [core](const std::string& job, uint32_t rank, uint64_t step) {
    return core->CorruptKeptStep(job, rank, step);
  };
  if (link != nullptr) hooks.cut_off = [link](absl::Duration d) { link->CutOff(d); };
  hooks.fault_fs = fault_fs;
  hooks.real_fs = real_fs;
  auto drills = std::make_unique<agent::DrillExecutor>(options, std::move(hooks));
  if (flags.allow_drills) Log().Warning("drills allowed: the coordinator may inject failures on this node");
  return drills;
}

// Peer replication (--peer-listen): the copies held for partners, the Peer
// service, the client side, and the sender. All null without it.
struct PeerParts {
  std::atomic<agent::AgentCore*> core{nullptr};  // for the staging it holds
  std::unique_ptr<replication::ReplicaStore> store;
  std::unique_ptr<replication::PeerService> service;
  std::unique_ptr<replication::PeerServer> server;
  std::unique_ptr<replication::GrpcPeerNetwork> network;
  std::unique_ptr<replication::Replicator> replicator;
};

// Starts the Peer service and tells the coordinator link where it is.
absl::Status StartPeers(const agent::AgentFlags& flags, agent::CoordinatorLinkOptions* link, PeerParts* parts) {
  const agent::PeerFlags& peer = *flags.peer;
  replication::ReplicaStoreOptions store;
  store.budget_bytes = flags.options.memory_budget_bytes;
  store.staging_bytes = [parts] {
    agent::AgentCore* core = parts->core.load();
    return core != nullptr ? core->StagingBytes() : 0;
  };
  parts->store = std::make_unique<replication::ReplicaStore>(store);
  replication::PeerServiceOptions service;
  service.node_id = link->node_id;
  service.agent_token = link->agent_token;
  service.tls = peer.server_credentials != nullptr;
  parts->service = std::make_unique<replication::PeerService>(parts->store.get(), service);
  int port = 0;
  CKPTD_ASSIGN_OR_RETURN(parts->server,
                         replication::StartPeerServer(peer.listen, parts->service.get(), peer.server_credentials, &port));
  // Without TLS the copies' bytes go over the data lane, on the same host.
  int data_port = 0;
  if (!service.tls) {
    absl::StatusOr<int> bound = parts->service->StartDataLane(peer.listen_host, peer.data_port);
    if (!bound.ok()) {
      return absl::Status(bound.status().code(), absl::StrCat(bound.status().message(), " (--peer-data-port)"));
    }
    data_port = *bound;
  }
  // Partners dial --peer-address, else the address listened on when it
  // names one host, else this host's name.
  const bool any_host = peer.listen_host.empty() || peer.listen_host == "0.0.0.0" || peer.listen_host == "::" ||
                        peer.listen_host == "[::]";
  const std::string host = any_host ? link->host_name : peer.listen_host;
  link->peer_address = peer.advertise.empty() ? absl::StrCat(host, ":", port) : peer.advertise;
  link->failure_domain = peer.failure_domain;
  link->replicas = peer.replicas;
  replication::GrpcPeerNetworkOptions network;
  network.node_id = link->node_id;
  network.credentials = link->credentials;
  network.agent_token = link->agent_token;
  parts->network = std::make_unique<replication::GrpcPeerNetwork>(network);
  replication::ReplicatorOptions replicator;
  replicator.max_bytes_per_second = peer.max_bytes_per_second;
  parts->replicator = std::make_unique<replication::Replicator>(parts->network.get(), replicator);
  Log().Info(absl::StrCat(
      "serving partners on ", peer.listen, " as ", link->peer_address,
      data_port != 0 ? absl::StrCat(" (copies' bytes on data lane port ", data_port, ")") : std::string(),
      peer.failure_domain.empty() ? "" : ", failure domain " + peer.failure_domain, ", sending to ", peer.replicas,
      peer.replicas == 1 ? " partner" : " partners",
      peer.max_bytes_per_second > 0 ? absl::StrCat(" at most ", peer.max_bytes_per_second * 8 / 1e9, " Gbit/s")
                                    : std::string(" uncapped"),
      service.tls                   ? " (TLS)"
      : service.agent_token.empty() ? " (no credential: any host that reaches the port can fetch copies)"
                                    : " (agent token, proven before gRPC reads a call)"));
  return absl::OkStatus();
}

// The metrics endpoint of --metrics-listen: /metrics from `registry`, and
// /readyz once `serving` (the trainers' socket) and, with `link`, registered.
// Null without the flag; kExitUnavailable when the address cannot be served.
absl::StatusOr<std::unique_ptr<ckptd::metrics::HttpServer>> StartMetrics(const agent::AgentFlags& flags,
                                                                         ckptd::metrics::Registry& registry,
                                                                         const std::atomic<bool>& serving,
                                                                         agent::CoordinatorLink* link) {
  if (!flags.metrics_listen) return nullptr;
  auto not_ready = [&serving, link] {
    if (link == nullptr) return agent::AgentNotReady(serving.load(), "", false, absl::OkStatus());
    return agent::AgentNotReady(serving.load(), link->address(), link->registered(), link->last_error());
  };
  absl::StatusOr<std::unique_ptr<ckptd::metrics::HttpServer>> http =
      ckptd::metrics::HttpServer::Start(*flags.metrics_listen, ckptd::metrics::MetricsHandler(registry, not_ready));
  if (!http.ok()) {
    return absl::Status(http.status().code(),
                        absl::StrCat("--metrics-listen ", *flags.metrics_listen, ": ", http.status().message()));
  }
  return http;
}

}  // namespace

int main(int argc, char** argv) {
  ckptd::base::SetProgramName("ckptd-agent");
  if (ckptd::base::AsksForVersion(std::vector<std::string>(argv + 1, argv + argc))) {
    std::cout << ckptd::base::VersionLine("ckptd-agent") << "\n";
    return 0;
  }
  // Before any thread starts, so that a SIGTERM waits for main() whichever
  // thread it lands on.
  const sigset_t stop_signals = ckptd::base::BlockStopSignals();
  absl::StatusOr<agent::AgentFlags> flags = agent::ParseAgentFlags(std::vector<std::string>(argv + 1, argv + argc));
  if (!flags.ok()) {
    std::cerr << "ckptd-agent: " << flags.status().message() << "\n" << agent::kAgentUsage;
    return ckptd::base::kExitUsage;
  }
  if (flags->help) {
    std::cout << agent::kAgentUsage;
    return ckptd::base::kExitOk;
  }
  // gRPC's server aborts when its first threads are refused: an agent
  // started where its user's threads are spent (RLIMIT_NPROC, pids.max)
  // says so and exits instead. An idle agent runs about 20 threads, one
  // with a coordinator and partners about 30.
  if (absl::Status s = ckptd::base::CheckThreadHeadroom("the agent", kStartThreads); !s.ok()) {
    return Fail("cannot start", s);
  }
  // Every connection is a file (said only of the Peer port, the agent's
  // only one on the network).
  if (const std::string warning = ckptd::base::RaiseOpenFileLimitForServer("partner agents");
      !warning.empty() && flags->peer) {
    Log().Warning(warning);
  }
  // Before any thread starts: every later one inherits the CPUs.
  if (!flags->cpu_set.empty()) {
    if (absl::Status s = ckptd::base::PinProcessToCpus(flags->cpu_set); !s.ok()) return Fail("--cpu-set", s);
    Log().Info(absl::StrCat("running on CPUs ", ckptd::base::FormatCpuList(flags->cpu_set)));
  }
  agent::AgentOptions& options = flags->options;
  std::unique_ptr<storage::PosixFileSystem> fs = storage::NewPosixFileSystem();
  // A directory or an object store (s3://bucket/prefix).
  absl::StatusOr<ckptd::objstore::StorageRoot> root = ckptd::objstore::OpenStorageRoot(options.storage_root, fs.get());
  if (!root.ok()) return Fail("storage root", root.status());
  options.storage_root = root->path;
  if (absl::Status s = storage::CreateDirs(root->fs, options.storage_root); !s.ok()) return Fail("storage root", s);
  ckptd::objstore::AbortAbandonedUploads(*root, Log());
  if (!options.local_cache.empty()) {
    if (absl::Status s = storage::CreateDirs(fs.get(), options.local_cache); !s.ok()) return Fail("--local-cache", s);
    // The local tier is this node's own disk: drills and injected latency
    // are about the shared storage root, and leave it alone.
    options.local_fs = fs.get();
  }
  HeartbeatRelay relay;
  PeerParts peers;
  if (flags->peer) {
    if (absl::Status s = StartPeers(*flags, &*flags->link, &peers); !s.ok()) {
      return Fail("partner service", s, ckptd::base::kExitUnavailable);
    }
    options.replicator = peers.replicator.get();
    options.peer_network = peers.network.get();
    options.replicas = peers.store.get();
  }
  std::unique_ptr<agent::CoordinatorLink> link;
  if (flags->link) {
    flags->link->on_ack = [&relay](const ckptd::v1::HeartbeatAck& ack) { relay.OnAck(ack); };
    flags->link->on_registered = [&relay](const ckptd::v1::RegisterAgentResponse& r) { relay.OnRegistered(r); };
    flags->link->memory_tier = options.keep_in_memory;
    link =
        std::make_unique<agent::CoordinatorLink>(*flags->link, [&relay](ckptd::v1::Heartbeat* hb) { relay.Fill(hb); });
    options.coordinator = link.get();
    Log().Info(absl::StrCat("reporting to coordinator ", flags->link->address, " as node ", flags->link->node_id,
                            flags->link->agent_token.empty()
                                ? " without an agent token (the coordinator must know this node by its TLS client "
                                  "certificate, or run with --insecure-agents)"
                                : " with the agent token of --agent-token-file"));
  }
  // Before the trainers are served: a port that cannot be bound stops the
  // agent at once, and /healthz answers while it starts.
  ckptd::metrics::Registry registry;
  absl::StatusOr<std::unique_ptr<agent::AgentMetrics>> agent_metrics = agent::AgentMetrics::Create(&registry);
  if (!agent_metrics.ok()) return Fail("metrics", agent_metrics.status());
  options.observer = agent_metrics->get();
  std::atomic<bool> serving{false};
  absl::StatusOr<std::unique_ptr<ckptd::metrics::HttpServer>> http =
      StartMetrics(*flags, registry, serving, link.get());
  if (!http.ok()) {  // its message names --metrics-listen
    Log().Error(http.status().message());
    return ckptd::base::kExitUnavailable;
  }
  if (*http != nullptr) {
    const std::string& listen = *flags->metrics_listen;
    Log().Info(absl::StrCat("metrics on http://", listen.substr(0, listen.rfind(':')), ":", (*http)->port(),
                            "/metrics (and /healthz, /readyz)"));
  }
  std::unique_ptr<storage::FaultInjectionFileSystem> fault_fs = NewFaultFileSystem(*flags, root->fs);
  storage::FileSystem* const data_fs =
      fault_fs != nullptr ? static_cast<storage::FileSystem*>(fault_fs.get()) : root->fs;
  auto core = std::make_unique<agent::AgentCore>(data_fs, options);
  peers.core.store(core.get());
  relay.ConnectPeers(peers.replicator.get(), peers.service.get());
  std::unique_ptr<agent::DrillExecutor> drills =
      NewDrillExecutor(*flags, core.get(), link.get(), fault_fs.get(), root->fs);
  relay.Connect(core.get(), drills.get());
  agent::AgentMetrics::Sources sources;
  sources.core = core.get();
  sources.replicator = peers.replicator.get();
  sources.replicas = peers.store.get();
  if (link != nullptr) {
    sources.coordinator_connected = [l = link.get()] { return l->registered(); };
  }
  ckptd::metrics::CollectorHandle collector = (*agent_metrics)->Watch(std::move(sources));
  // Staging left behind by an agent that was killed (SIGKILL, OOM) is freed.
  if (absl::StatusOr<std::vector<std::string>> stale = ckptd::staging::ReclaimStaleSegments(); stale.ok()) {
    for (const std::string& name : *stale) Log().Info(absl::StrCat("freed stale staging /dev/shm/", name));
  }
  auto service = std::make_unique<agent::AgentService>(core.get());
  absl::StatusOr<std::unique_ptr<agent::UnixServer>> server =
      agent::StartUnixServer(flags->socket, service.get(), service->peers(), options.trainer_group);
  if (!server.ok()) return Fail("trainer socket", server.status(), ckptd::base::kExitUnavailable);
  Log().Info(absl::StrCat("serving on unix:", flags->socket, ", storage root ", root->description,
                          root->object_store ? "" : fs->uses_io_uring() ? " (io_uring)" : " (pread/pwrite)",
                          options.local_cache.empty() ? "" : ", node-local tier " + options.local_cache, ", compression ",
                          !options.write.encode.compress ? "none" : options.write.adaptive.enabled ? "auto" : "zstd"));
  serving.store(true);
  const int sig = ckptd::base::WaitForStopSignal(stop_signals);
  serving.store(false);  // /readyz: not ready while it stops
  const absl::Time deadline = absl::Now() + flags->shutdown_grace;
  // Whatever still runs kShutdownOverrun past the grace period (a restore
  // reading a large step from a slow disk, a peer's fetch, a coordinator
  // that does not answer) does not keep the agent from exiting before the
  // supervisor's SIGKILL: the persists have stopped by then, and what is
  // left is what a SIGKILL would leave.
  absl::Notification stopped;
  std::thread watchdog([&stopped, deadline] {
    if (stopped.WaitForNotificationWithDeadline(deadline + kShutdownOverrun)) return;
    Log().Error(absl::StrCat("still stopping ", absl::FormatDuration(kShutdownOverrun),
                             " after --shutdown-grace ended (a restore or a peer's fetch under way, or the coordinator "
                             "not answering): exiting now"));
    std::_Exit(ckptd::base::kExitFailed);
  });
  // What is being persisted now ends within the grace period, or stops with
  // nothing of it left; the log says which of each step.
  Log().Info(absl::StrCat("stopping on signal ", sig,
                          ": persisting each trainer's snapshots not yet durable, newest first, within ",
                          absl::FormatDuration(flags->shutdown_grace), " (--shutdown-grace)"));
  core->BeginShutdown(deadline);
  // Calls still running at the deadline are cancelled (a restore waiting
  // for other ranks sees the shutdown and ends); the server waits for their
  // handlers to return.
  (*server)->Shutdown(deadline);
  server->reset();
  service.reset();  // stops watching the trainers: no death reaches the core after it is gone
  relay.Connect(nullptr, nullptr);
  relay.ConnectPeers(nullptr, nullptr);
  drills.reset();  // lifts faults in place and resumes a stopped trainer
  peers.core.store(nullptr);
  collector.Reset();  // a scrape reads the core no more
  core.reset();    // persists what trainers already published
  peers.replicator.reset();  // after the copy under way
  if (peers.server != nullptr) peers.server->Shutdown();
  if (link != nullptr && !link->Flush(std::max(absl::Seconds(2), deadline - absl::Now()))) {
    Log().Warning(
        "some reports did not reach the coordinator; they are on disk and its deadline cleans them up");
  }
  stopped.Notify();
  watchdog.join();
  return ckptd::base::kExitOk;
}
