#include "bench/snapshot_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "agent/agent_core.h"
#include "agent/agent_service.h"
#include "base/aligned_buffer.h"
#include "base/flags.h"
#include "base/format.h"
#include "base/json.h"
#include "base/limits.h"
#include "bench/bench_util.h"
#include "client/client.h"
#include "storage/posix_file_system.h"

namespace ckptd::bench {

const char kSnapshotHelp[] =
    "usage: ckptd-bench snapshot --bytes <n> [--dir <dir>] [--threads T] [--repeat N] [--cuda D [--spare]]\n"
    "                            [--json]\n"
    "\n"
    "Starts an agent in this process (Unix socket and storage under --dir, default\n"
    "a new folder under /tmp, removed afterwards), registers one trainer buffer of\n"
    "<n> bytes, and takes N snapshots (default 5), waiting for each to be persisted.\n"
    "Reports the median blocking time of Snapshot (stall_s) and of a plain\n"
    "single-threaded memcpy of the same bytes into pre-faulted memory (memcpy_s),\n"
    "measured in the same rounds, and their ratio. --threads sets the copy threads\n"
    "of the client (1..1024; default: one per core). --cuda D puts the buffer on\n"
    "CUDA device D; the yardstick is then one cudaMemcpy into page-locked memory.\n"
    "--spare (with --cuda) snapshots in two hops through a spare device buffer:\n"
    "the stall is then the device-to-device copy; the copy into staging runs in\n"
    "the background and is waited for with the persist.\n"
    "staging_ready_s is how long the agent took, from the trainer's registration,\n"
    "to allocate its staging slots (large ones are allocated in the background):\n"
    "at most what a snapshot asked for right after the start waits. The snapshots\n"
    "start once they are ready. first_stall_s is the first snapshot's stall, apart:\n"
    "its staging slot is mapped into the trainer then (and page-locked, for a\n"
    "device buffer), as at the first snapshot into each slot after a trainer starts.\n"
    "Ranges: --bytes 1..1T (K, M, G, T suffixes), --repeat 1..100, --cuda 0..1023.\n";

namespace {

// The largest --bytes (held twice in memory, once more in staging).
constexpr uint64_t kMaxBytes = uint64_t{1} << 40;

}  // namespace

int RunSnapshotBench(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  absl::StatusOr<base::Args> args =
      base::Args::Parse(argv, {"bytes", "dir", "threads", "repeat", "cuda"}, {"spare", "json", "help"});
  if (args.ok() && args->Has("help")) {
    out << kSnapshotHelp;
    return base::kExitOk;
  }
  auto usage = [&](const std::string& why) {
    err << "ckptd-bench snapshot: " << why << "\n" << kSnapshotHelp;
    return base::kExitUsage;
  };
  if (!args.ok()) return usage(std::string(args.status().message()));
  // Every number is parsed wide and checked against what the bench handles
  // before it is narrowed.
  uint64_t n = 0;
  int threads = 0, rounds = 5;
  std::optional<int> cuda;
  int device_index = 0;
  for (const absl::Status& s :
       {args->ReadUint("bytes", 1, kMaxBytes, &n, /*allow_suffix=*/true),
        args->ReadUint("threads", 1, base::kMaxThreads, &threads), args->ReadUint("repeat", 1, 100, &rounds),
        args->ReadUint("cuda", 0, kMaxCudaDevice, &device_index)}) {
    if (!s.ok()) return usage(std::string(s.message()));
  }
  if (args->Get("cuda")) cuda = device_index;
  if (n == 0) return usage("--bytes is required");
  const bool spare = args->Has("spare");
  if (spare && !cuda) return usage("--spare needs --cuda: host buffers have no spare");

  ScratchDir scratch;
  if (absl::Status s = scratch.Init(args->Get("dir"), "ckptd-snapbench"); !s.ok()) {
    err << "ckptd-bench snapshot: " << s.message() << "\n";
    return base::kExitFailed;
  }
  const std::string& dir = scratch.path();
  std::unique_ptr<storage::PosixFileSystem> fs = storage::NewPosixFileSystem();
  agent::AgentOptions options;
  options.storage_root = storage::JoinPath(dir, "root");
  options.keep_last = 1;
  options.segment_prefix = absl::StrCat("/ckptd-snapbench-", ::getpid());
  options.first_trainer_id = 1;  // the bench's one trainer: Status(1)
  if (absl::Status s = storage::CreateDirs(fs.get(), options.storage_root); !s.ok()) {
    err << "ckptd-bench snapshot: " << s.message() << "\n";
    return base::kExitFailed;
  }
  const std::string socket = storage::JoinPath(dir, "agent.sock");
  int rc = base::kExitOk;
  std::vector<double> stalls, memcpys;
  double staging_ready = 0;
  {
    agent::AgentCore core(fs.get(), options);
    agent::AgentService service(&core);
    absl::StatusOr<std::unique_ptr<agent::UnixServer>> server = agent::StartUnixServer(socket, &service, service.peers());
    if (!server.ok()) {
      err << "ckptd-bench snapshot: " << server.status().message() << "\n";
      return base::kExitUnavailable;
    }
    // The trainer's buffer, and a pre-faulted target for the memcpy yardstick.
    base::AlignedBuffer buffer, target;
    try {
      buffer = base::AlignedBuffer(cuda ? 1 : n);
      target = base::AlignedBuffer(cuda ? 1 : n);
    } catch (const std::bad_alloc&) {  // the one exception a size the user chose may raise
      err << "ckptd-bench snapshot: cannot allocate twice " << base::HumanBytes(n) << " (--bytes)\n";
      (*server)->Shutdown();
      return base::kExitFailed;
    }
    for (uint64_t i = 0; !cuda && i < n; i += 4096) buffer.data()[i] = static_cast<uint8_t>(i >> 12);
    void* device_buffer = nullptr;
    const int device = cuda.value_or(0);
    if (cuda) {
      absl::StatusOr<void*> p = client::AllocateDeviceMemory(device, n, 0x5a);
      if (!p.ok()) {
        err << "ckptd-bench snapshot: " << p.status().message() << "\n";
        (*server)->Shutdown();
        return base::kExitFailed;
      }
      device_buffer = *p;
    }
    client::ClientOptions co;
    co.socket = socket;
    co.job = "snapbench";
    co.slot_wait = absl::Seconds(60);
    co.rpc_timeout = absl::Seconds(60);
    if (threads > 0) co.copy_threads = threads;
    co.spare_device_buffer = spare;
    client::BufferSpec spec;
    spec.name = "params";
    spec.component = ckptd::v1::PARAMS;
    spec.dtype = ckptd::v1::BYTES;
    spec.shape = {n};
    spec.data = cuda ? device_buffer : buffer.data();
    if (cuda) {
      spec.device.set_kind(ckptd::v1::Device::CUDA);
      spec.device.set_index(device);
    }
    const absl::Time connecting = absl::Now();
    absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(co, {spec});
    if (!c.ok()) {
      err << "ckptd-bench snapshot: " << c.status().message() << "\n";
      rc = base::kExitFailed;
    }
    // The agent allocates large slots in the background: the stalls are
    // those of ready staging, and the allocation is reported apart.
    while (rc == base::kExitOk) {
      absl::StatusOr<agent::PersistStatus> st = core.Status(1);
      if (!st.ok() || absl::Now() - connecting > absl::Minutes(10)) {
        err << "ckptd-bench snapshot: the agent's staging was not ready in 10 min"
            << (st.ok() ? std::string() : absl::StrCat(": ", st.status().message())) << "\n";
        rc = base::kExitFailed;
        break;
      }
      if (st->slots_ready == st->slots) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    staging_ready = absl::ToDoubleSeconds(absl::Now() - connecting);
    for (int r = 0; rc == base::kExitOk && r < rounds; ++r) {
      if (cuda) {
        absl::StatusOr<double> t = client::TimeDeviceToPinnedCopy(device, device_buffer, n);
        if (!t.ok()) {
          err << "ckptd-bench snapshot: " << t.status().message() << "\n";
          rc = base::kExitFailed;
          break;
        }
        memcpys.push_back(*t);
      } else {
        const absl::Time t0 = absl::Now();
        std::memcpy(target.data(), buffer.data(), n);
        memcpys.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
      }
      absl::StatusOr<client::SnapshotResult> s = (*c)->Snapshot(r + 1);
      absl::Status persisted = s.ok() ? (*c)->WaitPersisted(r + 1, absl::Minutes(10)) : s.status();
      if (!persisted.ok()) {
        err << "ckptd-bench snapshot: " << persisted.message() << "\n";
        rc = base::kExitFailed;
        break;
      }
      stalls.push_back(s->stall_seconds);
    }
    c = absl::CancelledError();  // the client says goodbye before the agent stops
    (*server)->Shutdown();
    if (device_buffer != nullptr) client::FreeDeviceMemory(device, device_buffer);
  }
  if (rc != base::kExitOk) return rc;
  const double stall = Median(stalls), copy = Median(memcpys);
  if (args->Has("json")) {
    base::JsonWriter w;
    w.BeginObject();
    w.Field("bytes", n);
    w.Field("device", cuda ? absl::StrCat("cuda:", *cuda) : std::string("host"));
    w.Field("spare", spare);
    w.Field("rounds", rounds);
    w.Field("stall_s", stall);
    w.Field("first_stall_s", stalls.front());
    w.Field("staging_ready_s", staging_ready);
    w.Field("memcpy_s", copy);
    w.Field("stall_vs_memcpy", copy > 0 ? stall / copy : 0.0);
    w.EndObject();
    out << w.str() << "\n";
  } else {
    out << absl::StrFormat(
        "snapshot of %s%s: stall %.4f s, memcpy %.4f s (stall %.2fx memcpy), median of %d; the first %.4f s "
        "(%.2fx the median); staging ready %.3f s after registering\n",
        base::HumanBytes(n), spare ? " (two hops)" : "", stall, copy, copy > 0 ? stall / copy : 0.0, rounds,
        stalls.front(), stall > 0 ? stalls.front() / stall : 0.0, staging_ready);
  }
  return base::kExitOk;
}

}  // namespace ckptd::bench
