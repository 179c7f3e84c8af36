// ckptd-agent: the per-node sidecar that owns staging memory and persists and
// restores the trainers' checkpoints.
#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "agent/agent_core.h"
#include "agent/agent_service.h"
#include "agent/coordinator_link.h"
#include "agent/drills.h"
#include "base/flags.h"
#include "base/logger.h"
#include "rpc/tls.h"
#include "storage/fault_injection_file_system.h"
#include "storage/file_system.h"
#include "storage/layout.h"
#include "storage/posix_file_system.h"

namespace {

const char kUsage[] =
    "usage: ckptd-agent --storage-root <dir> --socket <path> [--staging-budget <bytes>] [--slots N]\n"
    "                   [--keep N] [--threads N] [--local-cache <dir> [--local-cache-keep N]]\n"
    "                   [--trainer-group <group>]\n"
    "                   [--coordinator <host:port> [--node-id <id>]\n"
    "                   [--tls-ca <pem> [--tls-cert <pem> --tls-key <pem>]]]\n"
    "                   [--inject-write-latency <duration>] [--allow-drills]\n"
    "\n"
    "Serves the trainer ranks of this node over a Unix socket (owner-only):\n"
    "owns their shared-memory staging, persists every published snapshot in\n"
    "the background (per rank, in step order), commits single-rank steps by\n"
    "itself, and restores the newest committed step that reads back intact.\n"
    "It watches each trainer process to notice its death at once; a trainer in\n"
    "another PID namespace (a pod of its own) is watched by the pid the kernel\n"
    "recorded for its connection, so the agent must see the trainers' processes.\n"
    "\n"
    "  --storage-root <dir>      where checkpoints live (<dir>/<job>/step-<s>/...)\n"
    "  --socket <path>           Unix socket to serve on\n"
    "  --staging-budget <bytes>  staging memory per trainer (K/M/G suffixes); default: --slots slots\n"
    "  --slots N                 staging slots per trainer (default 2)\n"
    "  --keep N                  committed steps kept per job (default 2)\n"
    "  --threads N               persist/restore threads (default: one per core)\n"
    "  --local-cache <dir>       node-local tier (e.g. an NVMe mount): each shard is written here\n"
    "                            first and its staging slot handed back, then copied to the storage\n"
    "                            root, where the step commits as usual; restores read the local copy\n"
    "                            when it is the committed shard, else the storage root. A local\n"
    "                            write that fails (full disk) falls back to the storage root\n"
    "  --local-cache-keep N      steps per job kept in the local tier (default 2)\n"
    "  --trainer-group <group>   let this group's processes use the agent: the socket and the\n"
    "                            staging memory become 0660 with this group (name or number);\n"
    "                            the agent must be a member. Default: owner-only (0600)\n"
    "  --coordinator <host:port> report to a ckptd-coordinator: it commits every step (single-rank\n"
    "                            ones too), sets the schedule and plans restores\n"
    "  --node-id <id>            this node's name for the coordinator (default: the host name)\n"
    "  --tls-ca <pem>            talk TLS to the coordinator, trusting this CA\n"
    "  --tls-cert/--tls-key <pem> this agent's client certificate and key (the coordinator\n"
    "                            requires one when it runs with mutual TLS)\n"
    "  --inject-write-latency <d>  testing and drills only: every write (and read) of checkpoint\n"
    "                            data in the storage root sleeps <d> first (e.g. 200ms), so a persist\n"
    "                            stays in flight long enough to kill the agent in the middle of it\n"
    "  --allow-drills            testing and drills only: carry out the failure drills the coordinator\n"
    "                            sends (ckptctl drill): SIGKILL or SIGSTOP this node's trainers, kill\n"
    "                            this agent, cut it off from the coordinator, corrupt a byte of a\n"
    "                            committed shard, make checkpoint storage fail (EIO, ENOSPC) or slow\n"
    "                            for a while. Without it, every drill is refused with an error report\n"
    "\n"
    "Stops on SIGINT or SIGTERM after persisting what trainers already published.\n";

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

}  // namespace

int main(int argc, char** argv) {
  ckptd::base::SetProgramName("ckptd-agent");
  using ckptd::base::Args;
  std::vector<std::string> argv_list(argv + 1, argv + argc);
  absl::StatusOr<Args> args = Args::Parse(argv_list, {"storage-root", "socket", "staging-budget", "slots", "keep", "threads", "coordinator", "node-id",
                                                     "local-cache", "local-cache-keep", "trainer-group",
                                                     "inject-write-latency", "tls-ca", "tls-cert", "tls-key"},
                                          {"help", "allow-drills"});
  if (args.ok() && args->Has("help")) {
    std::cout << kUsage;
    return 0;
  }
  auto usage = [](const std::string& why) {
    std::cerr << "ckptd-agent: " << why << "\n" << kUsage;
    return ckptd::base::kExitUsage;
  };
  if (!args.ok()) return usage(std::string(args.status().message()));
  if (!args->Get("storage-root") || !args->Get("socket")) return usage("--storage-root and --socket are required");
  ckptd::agent::AgentOptions options;
  options.storage_root = *args->Get("storage-root");
  for (const char* flag : {"staging-budget", "slots", "keep", "threads", "local-cache-keep"}) {
    absl::StatusOr<std::optional<uint64_t>> v = args->GetUint(flag, std::string(flag) == "staging-budget");
    if (!v.ok()) return usage(std::string(v.status().message()));
    if (!*v) continue;
    const std::string f = flag;
    if (f == "staging-budget") options.staging_budget_bytes = **v;
    if (f == "slots") options.slots = static_cast<uint32_t>(**v);
    if (f == "keep") options.keep_last = static_cast<int>(**v);
    if (f == "threads") options.io_threads = static_cast<int>(**v);
    if (f == "local-cache-keep") options.local_cache_keep = static_cast<int>(std::min<uint64_t>(**v, 1000000));
  }
  if (options.local_cache_keep < 1) return usage("--local-cache-keep must be at least 1");
  if (args->Get("local-cache-keep") && !args->Get("local-cache")) return usage("--local-cache-keep needs --local-cache");
  if (options.slots == 0) return usage("--slots must be at least 1");

  std::unique_ptr<ckptd::storage::PosixFileSystem> fs = ckptd::storage::NewPosixFileSystem();
  if (absl::Status s = ckptd::storage::CreateDirs(fs.get(), options.storage_root); !s.ok()) {
    std::cerr << "ckptd-agent: storage root: " << s.message() << "\n";
    return ckptd::base::kExitFailed;
  }
  if (std::optional<std::string> group = args->Get("trainer-group")) {
    uint32_t gid = 0;
    if (absl::SimpleAtoi(*group, &gid)) {
      options.trainer_group = gid;
    } else {
      struct group entry;
      struct group* found = nullptr;
      std::vector<char> buf(16384);
      int err;
      // Groups with many members (LDAP) need a larger buffer.
      while ((err = ::getgrnam_r(group->c_str(), &entry, buf.data(), buf.size(), &found)) == ERANGE &&
             buf.size() < (64u << 20)) {
        buf.resize(buf.size() * 4);
      }
      if (err != 0 || found == nullptr) {
        return usage(absl::StrCat("--trainer-group: no group \"", *group, "\" on this machine",
                                  err != 0 ? absl::StrCat(" (", std::strerror(err), ")") : ""));
      }
      options.trainer_group = static_cast<uint32_t>(found->gr_gid);
    }
  }
  if (std::optional<std::string> local = args->Get("local-cache")) {
    options.local_cache = *local;
    // Neither may hold the other: the coordinator would take the local
    // tier for a job, or the tier would copy files onto themselves. Checked
    // before the tier's directory is created (in the storage root, perhaps).
    std::error_code ec1, ec2;
    const std::filesystem::path root = std::filesystem::weakly_canonical(options.storage_root, ec1);
    const std::filesystem::path tier = std::filesystem::weakly_canonical(options.local_cache, ec2);
    if (ec1 || ec2) {
      return usage(absl::StrCat("--local-cache ", options.local_cache, ": cannot resolve it or the storage root (",
                                (ec1 ? ec1 : ec2).message(), ")"));
    }
    auto inside = [](const std::filesystem::path& a, const std::filesystem::path& b) {  // a at or below b
      auto [end_b, at_a] = std::mismatch(b.begin(), b.end(), a.begin(), a.end());
      return end_b == b.end();
    };
    if (inside(root, tier) || inside(tier, root)) {
      return usage(absl::StrCat("--local-cache ", options.local_cache, " and --storage-root ", options.storage_root,
                                " overlap: the node-local tier must be a directory of its own"));
    }
    if (absl::Status s = ckptd::storage::CreateDirs(fs.get(), options.local_cache); !s.ok()) {
      std::cerr << "ckptd-agent: --local-cache: " << s.message() << "\n";
      return ckptd::base::kExitFailed;
    }
    // The local tier is this node's own disk: drills and injected latency
    // are about the shared storage root, and leave it alone.
    options.local_fs = fs.get();
  }
  const bool allow_drills = args->Has("allow-drills");
  // The link and the core refer to each other: the link asks the core for
  // heartbeat contents through `heartbeat_source`, and hands heartbeat answers
  // to the drill executor through `drill_sink`; both are cut before they go.
  absl::Mutex source_mu;
  ckptd::agent::AgentCore* heartbeat_source = nullptr;
  ckptd::agent::DrillExecutor* drill_sink = nullptr;
  std::unique_ptr<ckptd::agent::CoordinatorLink> link;
  if (args->Get("coordinator")) {
    ckptd::agent::CoordinatorLinkOptions lo;
    lo.address = *args->Get("coordinator");
    char host[256] = {};
    (void)::gethostname(host, sizeof(host) - 1);  // informational only
    lo.host_name = host;
    lo.node_id = args->Get("node-id") ? *args->Get("node-id") : std::string(host);
    if (absl::Status v = ckptd::storage::ValidateJobName(lo.node_id); !v.ok()) {
      return usage(absl::StrCat("--node-id \"", lo.node_id, "\" is not a valid name: use A-Z a-z 0-9 . _ -"));
    }
    options.node_id = lo.node_id;
    if (args->Get("tls-ca") || args->Get("tls-cert") || args->Get("tls-key")) {
      ckptd::rpc::TlsFiles files;
      files.ca = args->Get("tls-ca").value_or("");
      files.cert = args->Get("tls-cert").value_or("");
      files.key = args->Get("tls-key").value_or("");
      absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
          ckptd::rpc::ChannelCredentialsFromFiles(files);
      if (!creds.ok()) return usage(std::string(creds.status().message()));
      lo.credentials = *creds;
    }
    lo.drills_allowed = allow_drills;
    lo.on_ack = [&](const ckptd::v1::HeartbeatAck& ack) {
      absl::MutexLock l(&source_mu);
      if (drill_sink != nullptr) drill_sink->OnAck(ack);
    };
    link = std::make_unique<ckptd::agent::CoordinatorLink>(lo, [&](ckptd::v1::Heartbeat* hb) {
      absl::MutexLock l(&source_mu);
      if (heartbeat_source != nullptr) heartbeat_source->FillHeartbeat(hb);
      if (drill_sink != nullptr) drill_sink->FillReports(hb);
    });
    options.coordinator = link.get();
  } else if (args->Get("node-id") || args->Get("tls-ca") || args->Get("tls-cert") || args->Get("tls-key")) {
    return usage("--node-id and --tls-* need --coordinator");
  }
  // Testing and drills: slow storage (so that a persist is reliably in
  // flight), and storage faults that drills switch on and off.
  std::unique_ptr<ckptd::storage::FaultInjectionFileSystem> fault_fs;
  if (std::optional<std::string> v = args->Get("inject-write-latency")) {
    absl::Duration d;
    if (!absl::ParseDuration(*v, &d) || d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
      return usage(absl::StrCat("--inject-write-latency: \"", *v, "\" is not a positive duration (e.g. 200ms)"));
    }
    fault_fs = std::make_unique<ckptd::storage::FaultInjectionFileSystem>(fs.get());
    fault_fs->SetLatency(d);
    std::cerr << "ckptd-agent: injecting " << absl::FormatDuration(d) << " of latency into every write and read\n";
  }
  if (allow_drills && fault_fs == nullptr) {
    fault_fs = std::make_unique<ckptd::storage::FaultInjectionFileSystem>(fs.get());
  }
  ckptd::storage::FileSystem* const data_fs =
      fault_fs != nullptr ? static_cast<ckptd::storage::FileSystem*>(fault_fs.get()) : fs.get();
  auto core = std::make_unique<ckptd::agent::AgentCore>(data_fs, options);
  // Without --allow-drills the executor only refuses (and reports) orders.
  ckptd::agent::DrillOptions drill_options;
  drill_options.allowed = allow_drills;
  drill_options.storage_root = options.storage_root;
  ckptd::agent::DrillHooks hooks;
  hooks.find_trainer = [&core](const std::string& job, uint32_t rank) { return core->FindTrainer(job, rank); };
  hooks.list_trainers = [&core] { return core->Trainers(); };
  if (link != nullptr) hooks.cut_off = [&link](absl::Duration d) { link->CutOff(d); };
  hooks.fault_fs = fault_fs.get();
  hooks.real_fs = fs.get();
  auto drills = std::make_unique<ckptd::agent::DrillExecutor>(drill_options, std::move(hooks));
  if (allow_drills) std::cerr << "ckptd-agent: drills allowed: the coordinator may inject failures on this node\n";
  {
    absl::MutexLock l(&source_mu);
    heartbeat_source = core.get();
    drill_sink = drills.get();
  }
  // Staging left behind by an agent that was killed (SIGKILL, OOM) is freed.
  if (absl::StatusOr<std::vector<std::string>> stale = ckptd::staging::ReclaimStaleSegments(); stale.ok()) {
    for (const std::string& name : *stale) std::cerr << "ckptd-agent: freed stale staging /dev/shm/" << name << "\n";
  }
  auto service = std::make_unique<ckptd::agent::AgentService>(core.get());
  absl::StatusOr<std::unique_ptr<ckptd::agent::UnixServer>> server =
      ckptd::agent::StartUnixServer(*args->Get("socket"), service.get(), service->peers(), options.trainer_group);
  if (!server.ok()) {
    std::cerr << "ckptd-agent: " << server.status().message() << "\n";
    return ckptd::base::kExitUnavailable;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::cerr << "ckptd-agent: serving on unix:" << *args->Get("socket") << ", storage root "
            << options.storage_root << (fs->uses_io_uring() ? " (io_uring)" : " (pread/pwrite)")
            << (options.local_cache.empty() ? "" : ", node-local tier " + options.local_cache) << "\n";
  while (!g_stop) ::pause();
  std::cerr << "ckptd-agent: stopping\n";
  (*server)->Shutdown();
  server->reset();
  service.reset();  // stops watching the trainers: no death reaches the core after it is gone
  {
    absl::MutexLock l(&source_mu);
    heartbeat_source = nullptr;
    drill_sink = nullptr;
  }
  drills.reset();  // lifts faults in place and resumes a stopped trainer
  core.reset();  // persists what trainers already published
  if (link != nullptr && !link->Flush(absl::Seconds(5))) {
    std::cerr << "ckptd-agent: some reports did not reach the coordinator; they are on disk and its deadline "
                 "cleans them up\n";
  }
  return 0;
}
