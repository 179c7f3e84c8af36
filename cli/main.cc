// ckptctl: the operator's command line.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "base/flags.h"
#include "base/logger.h"
#include "base/version.h"
#include "cli/command.h"
#include "cli/drill_commands.h"
#include "cli/interval_commands.h"
#include "cli/offline_commands.h"
#include "cli/operator_commands.h"
#include "cli/remote.h"
#include "objstore/routing_file_system.h"
#include "storage/posix_file_system.h"

namespace {

const char kUsage[] =
    "usage: ckptctl <command> [options]\n"
    "\n"
    "offline commands (a shard file or a storage root, no coordinator):\n"
    "  inspect <shard file>   show the tensors, components, dtypes, sizes, chunks and codecs of a shard\n"
    "  verify --root <root>   read committed checkpoints back and check every chunk\n"
    "  export --root <root> --job J --out DIR   write a committed step's full tensors as safetensors\n"
    "  start-fresh --root <root> --job J   let a job whose committed steps are all damaged start from scratch\n"
    "  (a <root> or shard file is a path or an object store URL, s3://bucket/prefix[/...]: credentials,\n"
    "  region and endpoint come from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,\n"
    "  AWS_REGION, AWS_ENDPOINT_URL or the profile AWS_PROFILE of ~/.aws/credentials and ~/.aws/config)\n"
    "  interval               the checkpoint interval for a failure rate and costs (or a live job's,\n"
    "                         with --job and --coordinator), and its expected waste\n"
    "  plan                   checkpoint size, stall, persist time and interval for a model and layout\n"
    "\n"
    "online commands (--coordinator HOST:PORT, or replicas as HOST:PORT,HOST:PORT,... whose leader\n"
    "is followed; optionally --tls-ca/--tls-cert/--tls-key; the environment's CKPTD_COORDINATOR and\n"
    "CKPTD_TOKEN_FILE stand for --coordinator and --token-file when they are left out):\n"
    "  status                 agents (and their replication partners), jobs, schedules, the\n"
    "                         policy's interval and recent failures\n"
    "  checkpoint --job J     take a manual checkpoint now and wait for it to commit (--token-file F)\n"
    "  list --job J           every step of a job: state, ranks, size, ratio, commit time, persist time\n"
    "  restore-plan --job J   the step a restart would restore now, where each rank would read it\n"
    "                         (memory, peer memory, disk), and the newer steps passed over\n"
    "  drill run --job J --scenario S   inject a failure through an agent, watch, and report a verdict\n"
    "  drill suite FILE --job J         run the drills FILE lists, one after the other, and sum them up\n"
    "  verify --job J         the coordinator reads a committed step back and checks it (--token-file F)\n"
    "\n"
    "`ckptctl <command> --help` describes a command; `ckptctl --version` prints the version.\n"
    "exit status: 0 success, 1 failure, 2 usage error, 3 the coordinator cannot be reached\n";

}  // namespace

int main(int argc, char** argv) {
  ckptd::base::SetProgramName("ckptctl");
  std::vector<std::string> args(argv + 1, argv + argc);
  if (ckptd::base::AsksForVersion(args)) {
    std::cout << ckptd::base::VersionLine("ckptctl") << "\n";
    return 0;
  }
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    (args.empty() ? std::cerr : std::cout) << kUsage;
    return args.empty() ? ckptd::base::kExitUsage : ckptd::base::kExitOk;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  ckptd::cli::AddEnvironmentDefaults(command, &args, ::getenv);
  std::unique_ptr<ckptd::storage::PosixFileSystem> posix = ckptd::storage::NewPosixFileSystem();
  // --root may name a directory or an object store (s3://bucket/prefix).
  auto fs = std::make_unique<ckptd::objstore::RoutingFileSystem>(posix.get());
  if (command == "inspect") return ckptd::cli::RunInspect(fs.get(), args, std::cout, std::cerr);
  if (command == "export") return ckptd::cli::RunExport(fs.get(), args, std::cout, std::cerr);
  if (command == "start-fresh") return ckptd::cli::RunStartFresh(fs.get(), args, std::cout, std::cerr);
  const ckptd::cli::CoordinatorApiFactory remote = ckptd::cli::NewRemoteCoordinatorApi;
  if (command == "verify") return ckptd::cli::RunVerifyCommand(fs.get(), args, remote, std::cout, std::cerr);
  if (command == "interval") return ckptd::cli::RunInterval(args, std::cout, std::cerr, ckptd::cli::FetchInterval);
  if (command == "drill") return ckptd::cli::RunDrillCommand(args, remote, std::cout, std::cerr);
  if (command == "plan") return ckptd::cli::RunPlan(args, std::cout, std::cerr);
  if (command == "status") return ckptd::cli::RunStatus(args, remote, std::cout, std::cerr);
  if (command == "checkpoint") return ckptd::cli::RunCheckpoint(args, remote, std::cout, std::cerr);
  if (command == "list") return ckptd::cli::RunList(args, remote, std::cout, std::cerr);
  if (command == "restore-plan") return ckptd::cli::RunRestorePlan(args, remote, std::cout, std::cerr);
  std::cerr << "ckptctl: unknown command \"" << command << "\"\n\n" << kUsage;
  return ckptd::base::kExitUsage;
}
