// ckptd-bench: benchmarks that measure ckptd beside a yardstick in one run.
#include <iostream>
#include <string>
#include <vector>

#include "base/flags.h"
#include "base/version.h"
#include "bench/coordinator_bench.h"
#include "bench/overhead_bench.h"
#include "bench/persist_bench.h"
#include "bench/reshard_bench.h"
#include "bench/restore_bench.h"
#include "bench/snapshot_bench.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (ckptd::base::AsksForVersion(args)) {
    std::cout << ckptd::base::VersionLine("ckptd-bench") << "\n";
    return 0;
  }
  const char kUsage[] =
      "usage: ckptd-bench <benchmark> [options]\n"
      "\n"
      "benchmarks:\n"
      "  persist   write a synthetic rank checkpoint, read it back verified; with\n"
      "            --compare, beside fio and the zstd CLI\n"
      "  snapshot  the blocking part of a snapshot through a live agent, beside memcpy\n"
      "            (cudaMemcpy for a buffer on a GPU)\n"
      "  overhead  the demo trainer's training time with snapshots every k steps vs none\n"
      "  coordinator  ckptd-coordinator's CPU use and commit latency under many simulated agents\n"
      "  register  a trainer's registration with a live agent, fresh and after a restart\n"
      "  restore   a restarted trainer's restore from the agent's memory (onto a GPU\n"
      "            too), a peer's, the node-local tier or the storage root, beside\n"
      "            memcpy, cudaMemcpy, iperf3, read() and fio\n"
      "  reshard   a step of N ranks restored onto M: the coordinator's plans beside each\n"
      "            rank planning from every saved index\n"
      "\n"
      "`ckptd-bench <benchmark> --help` describes a benchmark; `ckptd-bench --version` prints the version.\n";
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    (args.empty() ? std::cerr : std::cout) << kUsage;
    return args.empty() ? ckptd::base::kExitUsage : ckptd::base::kExitOk;
  }
  const std::string name = args[0];
  args.erase(args.begin());
  if (name == "persist") return ckptd::bench::RunPersistBench(args, std::cout, std::cerr);
  if (name == "snapshot") return ckptd::bench::RunSnapshotBench(args, std::cout, std::cerr);
  if (name == "overhead") return ckptd::bench::RunOverheadBench(args, std::cout, std::cerr);
  if (name == "register") return ckptd::bench::RunRegisterBench(args, std::cout, std::cerr);
  if (name == "restore") return ckptd::bench::RunRestoreBench(args, std::cout, std::cerr);
  if (name == "reshard") return ckptd::bench::RunReshardBench(args, std::cout, std::cerr);
  if (name == "coordinator") return ckptd::bench::RunCoordinatorBench(args, std::cout, std::cerr);
  std::cerr << "ckptd-bench: unknown benchmark \"" << name << "\"\n\n" << kUsage;
  return ckptd::base::kExitUsage;
}
