// ckptd-agent: the per-node sidecar that owns staging memory and persists and
// restores the trainers' checkpoints.
#include <unistd.h>

#include <csignal>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent_core.h"
#include "agent/agent_service.h"
#include "agent/coordinator_link.h"
#include "agent/drills.h"
#include "agent/flags.h"
#include "base/flags.h"
#include "base/logger.h"
#include "staging/staging.h"
#include "storage/fault_injection_file_system.h"
#include "storage/file_system.h"
#include "storage/posix_file_system.h"

namespace {

namespace agent = ckptd::agent;
namespace storage = ckptd::storage;

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

// Prints "ckptd-agent: <what>: <why>"; returns the exit code of a failure.
int Fail(absl::string_view what, const absl::Status& why) {
  std::cerr << "ckptd-agent: " << what << ": " << why.message() << "\n";
  return ckptd::base::kExitFailed;
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
  }

 private:
  absl::Mutex mu_;
  agent::AgentCore* core_ ABSL_GUARDED_BY(mu_) = nullptr;
  agent::DrillExecutor* drills_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// Testing and drills: slow storage (so that a persist is reliably in flight),
// and storage faults that drills switch on and off. Null without either.
std::unique_ptr<storage::FaultInjectionFileSystem> NewFaultFileSystem(const agent::AgentFlags& flags,
                                                                      storage::FileSystem* fs) {
  if (flags.inject_write_latency == absl::ZeroDuration() && !flags.allow_drills) return nullptr;
  auto fault_fs = std::make_unique<storage::FaultInjectionFileSystem>(fs);
  if (flags.inject_write_latency > absl::ZeroDuration()) {
    fault_fs->SetLatency(flags.inject_write_latency);
    std::cerr << "ckptd-agent: injecting " << absl::FormatDuration(flags.inject_write_latency)
              << " of latency into every write and read\n";
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
  if (flags.allow_drills)
    std::cerr << "ckptd-agent: drills allowed: the coordinator may inject failures on this node\n";
  return drills;
}

}  // namespace

int main(int argc, char** argv) {
  ckptd::base::SetProgramName("ckptd-agent");
  absl::StatusOr<agent::AgentFlags> flags = agent::ParseAgentFlags(std::vector<std::string>(argv + 1, argv + argc));
  if (!flags.ok()) {
    std::cerr << "ckptd-agent: " << flags.status().message() << "\n" << agent::kAgentUsage;
    return ckptd::base::kExitUsage;
  }
  if (flags->help) {
    std::cout << agent::kAgentUsage;
    return ckptd::base::kExitOk;
  }
  agent::AgentOptions& options = flags->options;
  std::unique_ptr<storage::PosixFileSystem> fs = storage::NewPosixFileSystem();
  if (absl::Status s = storage::CreateDirs(fs.get(), options.storage_root); !s.ok()) return Fail("storage root", s);
  if (!options.local_cache.empty()) {
    if (absl::Status s = storage::CreateDirs(fs.get(), options.local_cache); !s.ok()) return Fail("--local-cache", s);
    // The local tier is this node's own disk: drills and injected latency
    // are about the shared storage root, and leave it alone.
    options.local_fs = fs.get();
  }
  HeartbeatRelay relay;
  std::unique_ptr<agent::CoordinatorLink> link;
  if (flags->link) {
    flags->link->on_ack = [&relay](const ckptd::v1::HeartbeatAck& ack) { relay.OnAck(ack); };
    link =
        std::make_unique<agent::CoordinatorLink>(*flags->link, [&relay](ckptd::v1::Heartbeat* hb) { relay.Fill(hb); });
    options.coordinator = link.get();
    std::cerr << "ckptd-agent: reporting to coordinator " << flags->link->address << " as node "
              << flags->link->node_id
              << (flags->link->agent_token.empty()
                      ? " without an agent token (the coordinator must know this node by its TLS client certificate, "
                        "or run with --insecure-agents)"
                      : " with the agent token of --agent-token-file")
              << "\n";
  }
  std::unique_ptr<storage::FaultInjectionFileSystem> fault_fs = NewFaultFileSystem(*flags, fs.get());
  storage::FileSystem* const data_fs =
      fault_fs != nullptr ? static_cast<storage::FileSystem*>(fault_fs.get()) : fs.get();
  auto core = std::make_unique<agent::AgentCore>(data_fs, options);
  std::unique_ptr<agent::DrillExecutor> drills =
      NewDrillExecutor(*flags, core.get(), link.get(), fault_fs.get(), fs.get());
  relay.Connect(core.get(), drills.get());
  // Staging left behind by an agent that was killed (SIGKILL, OOM) is freed.
  if (absl::StatusOr<std::vector<std::string>> stale = ckptd::staging::ReclaimStaleSegments(); stale.ok()) {
    for (const std::string& name : *stale) std::cerr << "ckptd-agent: freed stale staging /dev/shm/" << name << "\n";
  }
  auto service = std::make_unique<agent::AgentService>(core.get());
  absl::StatusOr<std::unique_ptr<agent::UnixServer>> server =
      agent::StartUnixServer(flags->socket, service.get(), service->peers(), options.trainer_group);
  if (!server.ok()) {
    std::cerr << "ckptd-agent: " << server.status().message() << "\n";
    return ckptd::base::kExitUnavailable;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::cerr << "ckptd-agent: serving on unix:" << flags->socket << ", storage root " << options.storage_root
            << (fs->uses_io_uring() ? " (io_uring)" : " (pread/pwrite)")
            << (options.local_cache.empty() ? "" : ", node-local tier " + options.local_cache) << "\n";
  while (!g_stop) ::pause();
  std::cerr << "ckptd-agent: stopping\n";
  (*server)->Shutdown();
  server->reset();
  service.reset();  // stops watching the trainers: no death reaches the core after it is gone
  relay.Connect(nullptr, nullptr);
  drills.reset();  // lifts faults in place and resumes a stopped trainer
  core.reset();    // persists what trainers already published
  if (link != nullptr && !link->Flush(absl::Seconds(5))) {
    std::cerr << "ckptd-agent: some reports did not reach the coordinator; they are on disk and its deadline "
                 "cleans them up\n";
  }
  return ckptd::base::kExitOk;
}
