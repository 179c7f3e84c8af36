// ckptd-agent: the per-node sidecar that owns staging memory and persists and
// restores the trainers' checkpoints.
#include <csignal>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/agent_core.h"
#include "agent/agent_service.h"
#include "cli/args.h"
#include "storage/file_system.h"
#include "storage/posix_file_system.h"

namespace {

const char kUsage[] =
    "usage: ckptd-agent --storage-root <dir> --socket <path> [--staging-budget <bytes>] [--slots N]\n"
    "                   [--keep N] [--threads N]\n"
    "\n"
    "Serves the trainer ranks of this node over a Unix socket (owner-only):\n"
    "owns their shared-memory staging, persists every published snapshot in\n"
    "the background (per rank, in step order), commits single-rank steps by\n"
    "itself, and restores the newest committed step that reads back intact.\n"
    "\n"
    "  --storage-root <dir>      where checkpoints live (<dir>/<job>/step-<s>/...)\n"
    "  --socket <path>           Unix socket to serve on\n"
    "  --staging-budget <bytes>  staging memory per trainer (K/M/G suffixes); default: --slots slots\n"
    "  --slots N                 staging slots per trainer (default 2)\n"
    "  --keep N                  committed steps kept per job (default 2)\n"
    "  --threads N               persist/restore threads (default: one per core)\n"
    "\n"
    "Stops on SIGINT or SIGTERM after persisting what trainers already published.\n";

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

}  // namespace

int main(int argc, char** argv) {
  using ckptd::cli::Args;
  std::vector<std::string> argv_list(argv + 1, argv + argc);
  absl::StatusOr<Args> args = Args::Parse(argv_list, {"storage-root", "socket", "staging-budget", "slots", "keep", "threads"},
                                          {"help"});
  if (args.ok() && args->Has("help")) {
    std::cout << kUsage;
    return 0;
  }
  auto usage = [](const std::string& why) {
    std::cerr << "ckptd-agent: " << why << "\n" << kUsage;
    return ckptd::cli::kExitUsage;
  };
  if (!args.ok()) return usage(std::string(args.status().message()));
  if (!args->Get("storage-root") || !args->Get("socket")) return usage("--storage-root and --socket are required");
  ckptd::agent::AgentOptions options;
  options.storage_root = *args->Get("storage-root");
  for (const char* flag : {"staging-budget", "slots", "keep", "threads"}) {
    absl::StatusOr<std::optional<uint64_t>> v = args->GetUint(flag, std::string(flag) == "staging-budget");
    if (!v.ok()) return usage(std::string(v.status().message()));
    if (!*v) continue;
    const std::string f = flag;
    if (f == "staging-budget") options.staging_budget_bytes = **v;
    if (f == "slots") options.slots = static_cast<uint32_t>(**v);
    if (f == "keep") options.keep_last = static_cast<int>(**v);
    if (f == "threads") options.io_threads = static_cast<int>(**v);
  }
  if (options.slots == 0) return usage("--slots must be at least 1");

  std::unique_ptr<ckptd::storage::PosixFileSystem> fs = ckptd::storage::NewPosixFileSystem();
  if (absl::Status s = ckptd::storage::CreateDirs(fs.get(), options.storage_root); !s.ok()) {
    std::cerr << "ckptd-agent: storage root: " << s.message() << "\n";
    return ckptd::cli::kExitFailed;
  }
  ckptd::agent::AgentCore core(fs.get(), options);
  ckptd::agent::AgentService service(&core);
  absl::StatusOr<std::unique_ptr<grpc::Server>> server =
      ckptd::agent::StartUnixServer(*args->Get("socket"), &service);
  if (!server.ok()) {
    std::cerr << "ckptd-agent: " << server.status().message() << "\n";
    return ckptd::cli::kExitUnavailable;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::cerr << "ckptd-agent: serving on unix:" << *args->Get("socket") << ", storage root "
            << options.storage_root << (fs->uses_io_uring() ? " (io_uring)" : " (pread/pwrite)") << "\n";
  while (!g_stop) ::pause();
  std::cerr << "ckptd-agent: stopping\n";
  (*server)->Shutdown();
  return 0;
}
