#include "bench/restore_bench.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <new>
#include <optional>
#include <system_error>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agent/agent_core.h"
#include "agent/agent_service.h"
#include "base/aligned_buffer.h"
#include "base/flags.h"
#include "base/format.h"
#include "base/json.h"
#include "base/logger.h"
#include "base/posix_error.h"
#include "base/status_macros.h"
#include "bench/bench_util.h"
#include "client/client.h"
#include "objstore/storage_root.h"
#include "replication/peer_service.h"
#include "replication/replica_store.h"
#include "replication/replicator.h"
#include "staging/staging.h"
#include "storage/file_system.h"
#include "storage/layout.h"
#include "storage/posix_file_system.h"
#include "storage/store.h"

namespace ckptd::bench {

const char kRegisterHelp[] =
    "usage: ckptd-bench register --bytes <n> [--buffers K] [--slots S] [--repeat R] [--dir <dir>] [--json] [--log]\n"
    "\n"
    "A trainer's registration with an agent started in this process (Unix socket\n"
    "and storage under --dir, default a new folder under /tmp, removed afterwards).\n"
    "Its state is K buffers (default 1) of <n> bytes in all, staged in S slots\n"
    "(default 2). Each of R rounds (default 3) starts a fresh agent and times:\n"
    "  first_register_s  Connect of a new job: the agent creates its staging\n"
    "                    segment (one above 64 MiB is allocated in the background,\n"
    "                    after Connect returns)\n"
    "  ready_s           from the start of that Connect until every slot is\n"
    "                    allocated (as the agent logs it)\n"
    "  first_snapshot_s  from the start of that Connect until a Snapshot, tried\n"
    "                    every 1 ms, first gets a slot\n"
    "  again_register_s  once that trainer's snapshot is persisted and it said\n"
    "                    goodbye: Connect of the same job, rank and buffers, which\n"
    "                    takes over the segment the agent parked\n"
    "Calls use the client's default 5 s RPC timeout. Target: again < 0.050 s for\n"
    "any size.\n"
    "--json keys: bytes, buffers, slots, segment_bytes, rounds, first_register_s,\n"
    "ready_s, first_snapshot_s, again_register_s (medians), again_reused (every\n"
    "second Connect took the parked segment over), again_target_s,\n"
    "again_target_met, staging_huge_fraction (0..1: of the agent's staging, what\n"
    "huge pages map; see huge pages in docs/operations.md).\n"
    "--log writes the agent's log, timed, to stderr.\n"
    "Ranges: --bytes 1..1T (K, M, G, T suffixes; at least K), --buffers 1..1024,\n"
    "--slots 1..16, --repeat 1..100.\n";

const char kRestoreHelp[] =
    "usage: ckptd-bench restore --bytes <n> [--from memory|peer|local|root] [--root s3://bucket/prefix] [--repeat R]\n"
    "                           [--dir <dir>] [--json] [--log]\n"
    "       ckptd-bench restore --bytes <n> --cuda D [--repeat R] [--dir <dir>] [--json] [--log]\n"
    "\n"
    "A trainer's restore after a restart, through an agent started in this process\n"
    "(Unix socket and storage under --dir, default a new folder under /tmp, removed\n"
    "afterwards). Each of R rounds (default 3): a trainer with one buffer of <n>\n"
    "bytes snapshots step r (a new pattern each round), waits until it is\n"
    "persisted and committed, and exits; a new trainer with a zeroed, pre-faulted\n"
    "buffer connects with the same job, rank and buffer, calls Restore, and its\n"
    "bytes are compared with the pattern. --from sets the tier to read:\n"
    "  memory  the agent keeps the persisted step in staging (its default).\n"
    "          Yardstick: a single-threaded memcpy of <n> bytes between\n"
    "          pre-faulted buffers; target: restore <= 1.3x memcpy.\n"
    "  peer    a node lost: three agents in this process, each its own node\n"
    "          (node-a, node-b, node-c), the bench playing the coordinator.\n"
    "          The trainer on node-a snapshots; once persisted and committed,\n"
    "          node-a's agent sends the step over TCP on loopback (the Peer\n"
    "          service's data lane, uncapped) to its partner node-b. Then a\n"
    "          trainer on a new node-c restores, its plan naming node-b:\n"
    "          node-c's agent pulls the copy from node-b's memory (over the\n"
    "          data lane too). Three rounds more than R run first, unmeasured,\n"
    "          as in a job that checkpoints again and again: node-a's staging\n"
    "          is cleared in the first; node-b keeps the two newest steps of\n"
    "          the rank, so its fourth copy is the first into memory a dropped\n"
    "          copy left (the second and third go into new memory: their\n"
    "          median is reported apart).\n"
    "          Yardstick: iperf3 (when on PATH) sending <n> bytes over loopback\n"
    "          after each round; target: replication >= 0.8x iperf3's throughput.\n"
    "  local   no memory tier; a node-local tier under <dir>/local.\n"
    "  root    no memory tier; the storage root only.\n"
    "For local and root, every file under the storage root and the tier is\n"
    "fsynced and dropped from the page cache (POSIX_FADV_DONTNEED) before each\n"
    "restore; without root privileges the page cache may still serve part of it\n"
    "(resident_after_evict says how much of the shard it held). Yardsticks, run\n"
    "after the restore: a plain read() of the shard file after the same\n"
    "eviction, and fio's O_DIRECT sequential read of it when fio is on PATH.\n"
    "--root s3://bucket/prefix (local and root): the storage root is that object\n"
    "store location instead of a folder under --dir (endpoint, region and\n"
    "credentials from the environment, as for ckptd-agent; the bucket must exist).\n"
    "The steps go under a job of this run's own, restorebench-<unix ms>-<pid>,\n"
    "removed afterwards. With local the node-local tier stays in front, its\n"
    "yardsticks as above. With root nothing is evicted (the agent reads the\n"
    "object store over HTTP); the yardstick, run after each restore, is boto3's\n"
    "transfer manager at its defaults (s3_transfer.py in this program's folder,\n"
    "where the build copies bench/s3_transfer.py; it needs python3 and boto3)\n"
    "downloading the whole shard object the restore read into a file under\n"
    "<dir>, removed afterwards; when it cannot run it is reported missing, with\n"
    "why.\n"
    "Without the memory tier the new trainer's staging is allocated anew: that\n"
    "wait (staging_wait_s) is not part of restore_s.\n"
    "--cuda D (memory only): the trainer's buffer lives on CUDA device D. Each\n"
    "round times two restores from the agent's memory: the trainer that took the\n"
    "snapshot restores it again (rollback_s: a rollback, its staging slot\n"
    "page-locked by the snapshot), then a new trainer restores it (restore_s: a\n"
    "restart; a restore never page-locks the slot, whose locking would cost more\n"
    "than the copy it speeds up). Yardsticks: one cudaMemcpy of <n> bytes from\n"
    "page-locked host memory (cuda_memcpy_s; locking it with cudaHostRegister:\n"
    "host_register_s) and from pageable memory (pageable_memcpy_s); target:\n"
    "restore <= 1.2x the page-locked cudaMemcpy (ratio, rollback_ratio).\n"
    "Holds about 4x <n> of memory (two buffers, two staging slots; with --cuda two\n"
    "host buffers and two of <n> on the device).\n"
    "--json keys: bytes, from, rounds, source (where the agent read the step, as\n"
    "the client reports it: memory, node-local or storage-root; '+'-joined when\n"
    "rounds differ), source_as_expected, verified, and the medians connect_s,\n"
    "staging_wait_s, restore_s; for memory memcpy_s, ratio (restore_s /\n"
    "memcpy_s), target_ratio, target_met, staging_huge_fraction (0..1: of the\n"
    "agent's staging, what huge pages map; see huge pages in\n"
    "docs/operations.md); for local and root read_s, ratio\n"
    "(restore_s / read_s), fio_read_s (when fio ran), resident_after_evict (0..1);\n"
    "with --root also root (where it is and how it is reached, no secrets), and\n"
    "for root, instead of read_s to resident_after_evict: restore_gbps (<n>\n"
    "bytes over restore_s), s3_client_gbps (the yardstick's median) and\n"
    "restore_vs_s3_client (restore_gbps / s3_client_gbps: above 1, the restore\n"
    "is faster), or s3_client_missing (why the yardstick never ran);\n"
    "for peer replicate_s (node-a to node-b), replicate_gbps,\n"
    "replicate_new_memory_gbps (the warm-up copies into new memory), restore_gbps,\n"
    "iperf3_gbps, ratio (replicate_gbps / iperf3_gbps), target_ratio, target_met;\n"
    "with --cuda device, restore_s, rollback_s, cuda_memcpy_s, pageable_memcpy_s,\n"
    "host_register_s, ratio, rollback_ratio, restore_vs_pageable, target_ratio,\n"
    "target_met, rollback_target_met, staging_huge_fraction. Every *_gbps is in\n"
    "1e9 bits per second (the S3 yardstick's own GB/s times 8).\n"
    "--log writes the agent's log, timed, to stderr.\n"
    "Ranges: --bytes 1..1T (K, M, G, T suffixes), --repeat 1..100, --cuda 0..1023.\n";

namespace {

constexpr uint64_t kMaxBytes = uint64_t{1} << 40;
constexpr double kAgainTarget = 0.050;
constexpr double kMemoryTargetRatio = 1.3;
// A restore onto a device against one cudaMemcpy from page-locked memory.
constexpr double kDeviceTargetRatio = 1.2;
constexpr double kPeerTargetRatio = 0.8;
// Unmeasured rounds before --from peer's (see kRestoreHelp).
constexpr int kPeerWarmupRounds = 3;
// How long the agent may take to allocate a staging segment in the background.
constexpr absl::Duration kReadyWait = absl::Minutes(2);

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// `bytes` in `seconds` as 1e9 bits per second (0 for no time).
double Gbps(double bytes, double seconds) { return seconds > 0 ? bytes * 8 / seconds / 1e9 : 0; }

// The agent's log, each line with the time it came.
class LineLogger : public base::Logger {
 public:
  struct Line {
    absl::Time time;
    base::LogSeverity severity;
    std::string text;
  };
  // Each line is also written to `echo` when not null (--log).
  explicit LineLogger(std::ostream* echo) : echo_(echo) {}
  void Log(base::LogSeverity severity, absl::string_view message) override {
    absl::MutexLock l(&mu_);
    lines_.push_back({absl::Now(), severity, std::string(message)});
    if (echo_ != nullptr) {
      *echo_ << absl::FormatTime("%H:%M:%E6S", lines_.back().time, absl::LocalTimeZone()) << " agent: " << message
             << "\n";
    }
  }
  size_t size() {
    absl::MutexLock l(&mu_);
    return lines_.size();
  }
  // The first line from index `from` on that holds one of `needles`, waiting
  // for it until `deadline` (the line's own time is when it was logged).
  std::optional<Line> Find(size_t from, std::initializer_list<absl::string_view> needles,
                           absl::Time deadline = absl::InfinitePast()) {
    for (;;) {
      {
        absl::MutexLock l(&mu_);
        for (size_t i = from; i < lines_.size(); ++i) {
          for (absl::string_view needle : needles) {
            if (absl::StrContains(lines_[i].text, needle)) return lines_[i];
          }
        }
      }
      if (absl::Now() >= deadline) return std::nullopt;
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  // The warnings and errors, for the report of a failure.
  void PrintProblems(std::ostream& err) {
    absl::MutexLock l(&mu_);
    if (echo_ != nullptr) return;  // printed already
    for (const Line& line : lines_) {
      if (line.severity != base::LogSeverity::kInfo) err << "  agent: " << line.text << "\n";
    }
  }

 private:
  std::ostream* const echo_;
  absl::Mutex mu_;
  std::vector<Line> lines_ ABSL_GUARDED_BY(mu_);
};

// An agent serving its Unix socket from this process.
class LocalAgent {
 public:
  // `root_fs` serves the storage root and must outlive the agent; null: a
  // POSIX file system of the agent's own.
  static absl::StatusOr<std::unique_ptr<LocalAgent>> Start(const agent::AgentOptions& options,
                                                           const std::string& socket,
                                                           storage::FileSystem* root_fs = nullptr) {
    std::unique_ptr<LocalAgent> a(new LocalAgent(options, root_fs));
    CKPTD_ASSIGN_OR_RETURN(a->server_, agent::StartUnixServer(socket, &a->service_, a->service_.peers()));
    return a;
  }
  // Clients say goodbye before this.
  ~LocalAgent() {
    if (server_ != nullptr) server_->Shutdown();
  }

 private:
  LocalAgent(const agent::AgentOptions& options, storage::FileSystem* root_fs)
      : fs_(storage::NewPosixFileSystem()),
        core_(root_fs != nullptr ? root_fs : fs_.get(), options),
        service_(&core_) {}
  std::unique_ptr<storage::PosixFileSystem> fs_;
  agent::AgentCore core_;
  agent::AgentService service_;
  std::unique_ptr<agent::UnixServer> server_;
};

// A benchmark's failure: `why` (and the agent's warnings and errors from
// `log`) on `err`; returns the exit code `rc`.
int Fail(std::ostream& err, absl::string_view bench, absl::string_view why, LineLogger* log, int rc) {
  err << "ckptd-bench " << bench << ": " << why << "\n";
  if (log != nullptr) log->PrintProblems(err);
  return rc;
}

// Whether the agent allocates the staging of one trainer buffer of `n`
// bytes within Register (else in the background).
bool AllocatedInline(const agent::AgentOptions& options, uint64_t n) {
  return staging::SegmentBytes(options.slots, staging::PlanLayout({n}).slot_bytes) <= options.prepare_inline_bytes;
}

// The agent's options shared by both benchmarks; creates the storage root:
// `root` when given (--root), else a folder under `dir`.
absl::StatusOr<agent::AgentOptions> BaseOptions(const std::string& dir, absl::string_view tag, base::Logger* log,
                                                const objstore::StorageRoot* root = nullptr) {
  agent::AgentOptions o;
  o.storage_root = root != nullptr ? root->path : storage::JoinPath(dir, "root");
  o.keep_last = 1;
  o.segment_prefix = absl::StrCat("/ckptd-", tag, "-", ::getpid());
  o.logger = log;
  std::unique_ptr<storage::PosixFileSystem> fs = storage::NewPosixFileSystem();
  CKPTD_RETURN_IF_ERROR(storage::CreateDirs(root != nullptr ? root->fs : fs.get(), o.storage_root));
  return o;
}

// --root: an object store location, its bucket checked. `posix` must
// outlive the result.
absl::StatusOr<objstore::StorageRoot> OpenObjectStoreRoot(const std::string& url, storage::FileSystem* posix) {
  if (!objstore::IsObjectStoreRoot(url)) {
    return absl::InvalidArgumentError(
        absl::StrCat("`", base::TerminalSafe(url), "` is not an object store location (s3://bucket/prefix)"));
  }
  return objstore::OpenStorageRoot(url, posix);
}

// Removes the steps of `job` under `root`; a failure is a warning on `err`
// (what is left harms no later run, each with a job of its own).
void RemoveJob(const objstore::StorageRoot& root, const std::string& job, std::ostream& err) {
  const std::string path = storage::JobDir(root.path, job);
  if (absl::Status s = storage::RemoveTree(root.fs, path); !s.ok()) {
    err << "ckptd-bench restore: warning: cannot remove " << path << ": " << s.message() << "\n";
  }
}

// `data` cut into buffers of `lengths` bytes.
std::vector<client::BufferSpec> Specs(uint8_t* data, const std::vector<uint64_t>& lengths) {
  std::vector<client::BufferSpec> specs;
  uint64_t at = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    client::BufferSpec s;
    s.name = absl::StrCat("buffer", i);
    s.component = ckptd::v1::PARAMS;
    s.dtype = ckptd::v1::BYTES;
    s.shape = {lengths[i]};
    s.data = data + at;
    at += lengths[i];
    specs.push_back(std::move(s));
  }
  return specs;
}

// When every staging slot of the trainer registered since log line `mark`
// was ready: at `connected` for a parked segment taken over or one allocated
// within Register (`inline_alloc`), else when the agent logs that it
// allocated the slots in the background.
absl::StatusOr<absl::Time> AwaitStaging(LineLogger& log, size_t mark, absl::Time connected, bool inline_alloc) {
  if (inline_alloc || log.Find(mark, {"is taken over"})) return connected;
  std::optional<LineLogger::Line> line =
      log.Find(mark, {"staging ready", "could not be allocated"}, absl::Now() + kReadyWait);
  if (!line) {
    return absl::DeadlineExceededError(
        absl::StrCat("the agent did not allocate the staging within ", absl::FormatDuration(kReadyWait)));
  }
  if (!absl::StrContains(line->text, "staging ready")) return absl::ResourceExhaustedError(line->text);
  return line->time;
}

// Of the staging mapped in this process under `prefix` (the agent's
// mapping, and a trainer's while one runs), the fraction that huge pages map.
double HugeFraction(absl::string_view prefix) {
  const staging::MappedPages m = staging::MappedStaging(prefix);
  return m.bytes > 0 ? static_cast<double>(m.huge_bytes) / static_cast<double>(m.bytes) : 0;
}

struct RegisterTimes {
  double first = 0, ready = 0, first_snapshot = 0, again = 0, huge = 0;
  bool reused = false;
};

// One round of the register benchmark against a fresh agent.
absl::StatusOr<RegisterTimes> RegisterRound(const client::ClientOptions& co,
                                            const std::vector<client::BufferSpec>& specs, LineLogger& log,
                                            bool inline_alloc, absl::string_view prefix) {
  RegisterTimes t;
  const size_t mark = log.size();
  const absl::Time t0 = absl::Now();
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, client::Client::Connect(co, specs));
  const absl::Time connected = absl::Now();
  t.first = Seconds(connected - t0);
  // A snapshot gets a slot once the agent has one ready.
  for (;;) {
    const absl::Time at = absl::Now();
    absl::StatusOr<client::SnapshotResult> s = c->Snapshot(1);
    if (s.ok()) {
      t.first_snapshot = Seconds(at - t0);
      break;
    }
    if (!absl::IsResourceExhausted(s.status()) || at - t0 > kReadyWait) return s.status();
    absl::SleepFor(absl::Milliseconds(1));
  }
  CKPTD_ASSIGN_OR_RETURN(absl::Time ready, AwaitStaging(log, mark, connected, inline_alloc));
  t.ready = Seconds(ready - t0);
  CKPTD_RETURN_IF_ERROR(c->WaitPersisted(1, absl::Minutes(10)));
  c.reset();  // goodbye: the agent parks the segment
  t.huge = HugeFraction(prefix);  // the agent's mapping alone
  const size_t again_mark = log.size();
  const absl::Time t1 = absl::Now();
  CKPTD_ASSIGN_OR_RETURN(c, client::Client::Connect(co, specs));
  t.again = Seconds(absl::Now() - t1);
  t.reused = log.Find(again_mark, {"is taken over"}).has_value();
  return t;
}

// Bytes that differ from round to round (xorshift, seeded by the step).
void Fill(uint8_t* p, uint64_t n, uint64_t seed) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(i ^ seed);
}

// Writes back and drops from the page cache every file under `dirs` (an
// object store location has none).
void EvictPageCache(std::initializer_list<std::string> dirs) {
  for (const std::string& dir : dirs) {
    if (dir.empty() || objstore::IsObjectStoreRoot(dir)) continue;
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      const int fd = ::open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      (void)::fsync(fd);
      (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }
}

// The fraction of the file's pages in the page cache (mincore).
std::optional<double> ResidentFraction(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st;
  void* m =
      ::fstat(fd, &st) == 0 && st.st_size > 0 ? ::mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  if (m == MAP_FAILED) return std::nullopt;
  const size_t page = ::sysconf(_SC_PAGESIZE), pages = (st.st_size + page - 1) / page;
  std::vector<unsigned char> in(pages);
  std::optional<double> fraction;
  if (::mincore(m, st.st_size, in.data()) == 0) {
    fraction = static_cast<double>(std::count_if(in.begin(), in.end(), [](unsigned char c) { return c & 1; })) / pages;
  }
  ::munmap(m, st.st_size);
  return fraction;
}

// A plain read() of the file, 4 MiB at a time: its first `n` bytes into
// `into` (pre-faulted), the rest into a pre-faulted scratch block. Seconds.
absl::StatusOr<double> TimeRead(const std::string& path, uint8_t* into, uint64_t n) {
  constexpr uint64_t kChunk = uint64_t{4} << 20;
  std::vector<uint8_t> scratch(kChunk);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return base::PosixError(absl::StrCat("open ", path), errno);
  uint64_t at = 0;
  const absl::Time t0 = absl::Now();
  for (;;) {
    const ssize_t got = at < n ? ::read(fd, into + at, std::min(kChunk, n - at)) : ::read(fd, scratch.data(), kChunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int e = errno;
      ::close(fd);
      return base::PosixError(absl::StrCat("read ", path), e);
    }
    if (got == 0) break;
    at += got;
  }
  const double s = Seconds(absl::Now() - t0);
  ::close(fd);
  return s;
}

// fio's O_DIRECT sequential read of the file, in seconds for the whole file;
// nullopt without fio (or when it fails).
std::optional<double> FioReadSeconds(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !Capture("command -v fio >/dev/null 2>&1")) return std::nullopt;
  std::optional<std::string> json = Capture(absl::StrCat(
      "fio --name=r --rw=read --bs=4M --direct=1 --filename=", ShellQuote(path), " --output-format=json 2>/dev/null"));
  std::optional<double> bw = json ? JsonNumberAfter(*json, "read", "bw_bytes") : std::nullopt;  // bytes/s
  if (!bw || *bw <= 0) return std::nullopt;
  return st.st_size / *bw;
}

enum class Tier { kMemory, kLocal, kRoot };

// `a` and `b` of `n` bytes each.
absl::Status AllocateTwo(uint64_t n, base::AlignedBuffer* a, base::AlignedBuffer* b) {
  try {
    *a = base::AlignedBuffer(n);
    *b = base::AlignedBuffer(n);
  } catch (const std::bad_alloc&) {  // the one exception a size the user chose may raise
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate twice ", base::HumanBytes(n), " (--bytes)"));
  }
  return absl::OkStatus();
}

// The trainer `c` restores into `dst`: it must get `step`, with the bytes of
// `src`. Where it read them; `*seconds` gets how long the Restore took.
absl::StatusOr<std::string> RestoreAndCompare(client::Client& c, const uint8_t* dst, const uint8_t* src, uint64_t n,
                                              uint64_t step, double* seconds) {
  const absl::Time t0 = absl::Now();
  CKPTD_ASSIGN_OR_RETURN(std::optional<uint64_t> restored, c.Restore());
  *seconds = Seconds(absl::Now() - t0);
  if (restored != step) {
    return absl::FailedPreconditionError(
        absl::StrCat("the restore returned step ", restored ? absl::StrCat(*restored) : "none", ", not step ", step));
  }
  if (std::memcmp(dst, src, n) != 0) {
    return absl::DataLossError(absl::StrCat("the restored bytes differ from those of step ", step));
  }
  return std::string(c.last_restore_source());
}

struct RestoreTimes {
  double connect = 0, staging_wait = 0, restore = 0, huge = 0;
  double yardstick = 0;  // memcpy or read()
  std::optional<double> fio, resident;
  // For a shard in an object store, instead of the others: the S3
  // yardstick's bytes per second, or why it did not run.
  absl::StatusOr<double> s3_client = absl::UnknownError("not run");
  std::string source;
};

// The S3 yardstick (see kRestoreHelp): boto3 downloads the object at `url`
// into the local file `scratch`, removed afterwards. Bytes per second.
absl::StatusOr<double> S3ClientBytesPerSecond(const std::string& url, const std::string& scratch) {
  absl::StatusOr<double> gbytes_per_s = RunS3Yardstick("download", url, scratch);
  std::error_code ec;
  std::filesystem::remove(scratch, ec);  // absent when the download failed
  if (!gbytes_per_s.ok()) return gbytes_per_s.status();
  return *gbytes_per_s * 1e9;
}

// One round of the restore benchmark: step `step` snapshotted from `src`,
// restored into `dst` by a new trainer. `scratch`: a local file the S3
// yardstick may write.
absl::StatusOr<RestoreTimes> RestoreRound(const client::ClientOptions& co, const agent::AgentOptions& options,
                                          Tier tier, bool inline_alloc, uint8_t* src, uint8_t* dst, uint64_t n,
                                          uint64_t step, const std::string& scratch, LineLogger& log) {
  RestoreTimes t;
  Fill(src, n, step);
  {
    client::ClientOptions writer = co;
    writer.slot_wait = kReadyWait;  // the agent may still be allocating the staging
    CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, client::Client::Connect(writer, Specs(src, {n})));
    CKPTD_RETURN_IF_ERROR(c->Snapshot(step).status());
    CKPTD_RETURN_IF_ERROR(c->WaitPersisted(step, absl::Minutes(10)));
  }  // the trainer exits
  const std::string shard =
      storage::ShardPath(tier == Tier::kLocal ? options.local_cache : options.storage_root, co.job, step, co.rank);
  const bool in_object_store = objstore::IsObjectStoreRoot(shard);
  if (tier != Tier::kMemory) {
    EvictPageCache({options.storage_root, options.local_cache});
    if (!in_object_store) t.resident = ResidentFraction(shard);
  }
  std::memset(dst, 0, n);
  const size_t mark = log.size();
  const absl::Time t0 = absl::Now();
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, client::Client::Connect(co, Specs(dst, {n})));
  const absl::Time connected = absl::Now();
  t.connect = Seconds(connected - t0);
  CKPTD_ASSIGN_OR_RETURN(absl::Time ready, AwaitStaging(log, mark, connected, inline_alloc));
  t.staging_wait = std::max(0.0, Seconds(ready - connected));
  CKPTD_ASSIGN_OR_RETURN(t.source, RestoreAndCompare(*c, dst, src, n, step, &t.restore));
  // The yardsticks come after the restore: a disk still busy with the
  // persist slows the restore, not them.
  if (tier == Tier::kMemory) {
    const absl::Time t2 = absl::Now();
    std::memcpy(dst, src, n);
    t.yardstick = Seconds(absl::Now() - t2);
    c.reset();
    t.huge = HugeFraction(options.segment_prefix);  // the agent's mapping alone
  } else if (in_object_store) {
    t.s3_client = S3ClientBytesPerSecond(shard, scratch);
  } else {
    EvictPageCache({options.storage_root, options.local_cache});
    CKPTD_ASSIGN_OR_RETURN(t.yardstick, TimeRead(shard, dst, n));
    t.fio = FioReadSeconds(shard);
  }
  return t;
}

// The coordinator of a one-rank job, played by the benchmark: it commits each
// step once its shard is durable, and plans a restore of the newest committed
// step from `peers`.
class BenchCoordinator : public agent::CoordinatorClient {
 public:
  BenchCoordinator(const std::string& root, std::vector<ckptd::v1::PeerCopy> peers)
      : fs_(storage::NewPosixFileSystem()), store_(fs_.get(), root), peers_(std::move(peers)) {}
  void ShardDurable(const ckptd::v1::ShardReport& report) override {
    std::vector<ckptd::v1::ShardRef> refs = {report.shard()};
    absl::StatusOr<ckptd::v1::StepManifest> m = store_.CommitStep(
        report.job(), report.step(), 1, &refs, storage::CheckpointStore::CommitCheck::kCheckedByCaller);
    absl::MutexLock l(&mu_);
    if (m.ok()) newest_ = report.step();
    status_.Update(m.status());
  }
  void Failure(const ckptd::v1::ReportFailureRequest&) override {}
  absl::StatusOr<ckptd::v1::RestorePlanResponse> RestorePlan(const ckptd::v1::RestorePlanRequest& request,
                                                             absl::Duration) override {
    ckptd::v1::RestorePlanResponse r;
    absl::MutexLock l(&mu_);
    r.set_step(newest_);
    if (request.has_attempt() && request.attempt_ok()) {
      r.set_verdict(ckptd::v1::RestorePlanResponse::GO);
    } else {
      r.set_verdict(ckptd::v1::RestorePlanResponse::LOAD);
      for (const ckptd::v1::PeerCopy& p : peers_) *r.add_peers() = p;
    }
    return r;
  }
  std::optional<ckptd::v1::Schedule> ScheduleFor(const std::string&) override { return std::nullopt; }
  absl::Status status() {
    absl::MutexLock l(&mu_);
    return status_;
  }

 private:
  std::unique_ptr<storage::PosixFileSystem> fs_;
  storage::CheckpointStore store_;
  const std::vector<ckptd::v1::PeerCopy> peers_;
  absl::Mutex mu_;
  uint64_t newest_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// Three nodes in one process: node-a (the trainer's, sending), node-b (its
// partner: a Peer service on loopback holding the copy) and node-c (the
// replacement, pulling it).
class PeerNodes {
 public:
  static absl::StatusOr<std::unique_ptr<PeerNodes>> Start(const agent::AgentOptions& base, const std::string& dir) {
    std::unique_ptr<PeerNodes> p(new PeerNodes());
    p->store_ = std::make_unique<replication::ReplicaStore>(replication::ReplicaStoreOptions());
    replication::PeerServiceOptions so;
    so.node_id = "node-b";
    p->service_ = std::make_unique<replication::PeerService>(p->store_.get(), so);
    const std::string ticket = "bench-ticket";
    google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner> partners;
    ckptd::v1::ReplicationPartner* partner = partners.Add();
    partner->set_node_id("node-a");
    partner->set_ticket(ticket);
    p->service_->SetSenders(partners);
    int port = 0;
    CKPTD_ASSIGN_OR_RETURN(p->server_, replication::StartPeerServer("127.0.0.1:0", p->service_.get(), nullptr, &port));
    // Without TLS, as an agent started with --peer-listen: the bytes go over
    // the data lane.
    CKPTD_RETURN_IF_ERROR(p->service_->StartDataLane("127.0.0.1", 0).status());
    partner->set_node_id("node-b");
    partner->set_address(absl::StrCat("127.0.0.1:", port));
    replication::GrpcPeerNetworkOptions no;
    no.node_id = "node-a";
    p->network_ = std::make_unique<replication::GrpcPeerNetwork>(no);
    replication::ReplicatorOptions ro;
    ro.low_priority = false;  // measured: nothing else runs
    p->replicator_ = std::make_unique<replication::Replicator>(p->network_.get(), ro);
    p->replicator_->SetPartners(partners);
    ckptd::v1::PeerCopy b;
    b.set_node_id("node-b");
    b.set_address(partner->address());
    p->coordinator_ = std::make_unique<BenchCoordinator>(base.storage_root, std::vector<ckptd::v1::PeerCopy>{b});
    agent::AgentOptions a = base;
    a.node_id = "node-a";
    a.coordinator = p->coordinator_.get();
    a.replicator = p->replicator_.get();
    a.segment_prefix = base.segment_prefix + "-a";
    p->socket_a_ = storage::JoinPath(dir, "node-a.sock");
    CKPTD_ASSIGN_OR_RETURN(p->a_, LocalAgent::Start(a, p->socket_a_));
    p->base_ = base;
    p->dir_ = dir;
    return p;
  }
  // A new node-c (its agent has never seen the rank), replacing the last.
  absl::Status NewReplacement(int round) {
    c_.reset();
    agent::AgentOptions c = base_;
    c.node_id = "node-c";
    c.coordinator = coordinator_.get();
    c.peer_network = network_.get();
    c.segment_prefix = absl::StrCat(base_.segment_prefix, "-c", round);
    socket_c_ = storage::JoinPath(dir_, absl::StrCat("node-c", round, ".sock"));
    CKPTD_ASSIGN_OR_RETURN(c_, LocalAgent::Start(c, socket_c_));
    return absl::OkStatus();
  }
  ~PeerNodes() {
    a_.reset();
    c_.reset();
    replicator_.reset();
    if (server_ != nullptr) server_->Shutdown();
  }
  const std::string& socket_a() const { return socket_a_; }
  const std::string& socket_c() const { return socket_c_; }
  replication::Replicator& replicator() { return *replicator_; }
  BenchCoordinator& coordinator() { return *coordinator_; }

 private:
  PeerNodes() = default;
  std::unique_ptr<replication::ReplicaStore> store_;
  std::unique_ptr<replication::PeerService> service_;
  std::unique_ptr<replication::PeerServer> server_;
  std::unique_ptr<replication::GrpcPeerNetwork> network_;
  std::unique_ptr<replication::Replicator> replicator_;
  std::unique_ptr<BenchCoordinator> coordinator_;
  agent::AgentOptions base_;
  std::string dir_, socket_a_, socket_c_;
  std::unique_ptr<LocalAgent> a_, c_;
};

// iperf3 sending `n` bytes over loopback: bytes per second received, or
// nullopt without iperf3 (or when it fails).
std::optional<double> Iperf3BytesPerSecond(uint64_t n) {
  if (!Capture("command -v iperf3 >/dev/null 2>&1")) return std::nullopt;
  const int port = 20000 + ::getpid() % 20000;
  std::optional<std::string> json = Capture(absl::StrCat(
      "iperf3 -s -1 -p ", port, " >/dev/null 2>&1 & sleep 0.3; iperf3 -c 127.0.0.1 -p ", port, " -n ", n,
      " -J 2>/dev/null; wait"));
  // "sum_received": { ... "bits_per_second": 1.5e10, ... } (iperf3 -J)
  const size_t section = json ? json->find("\"sum_received\"") : std::string::npos;
  const size_t key = section == std::string::npos ? section : json->find("\"bits_per_second\"", section);
  const size_t colon = key == std::string::npos ? key : json->find(':', key);
  if (colon == std::string::npos) return std::nullopt;
  const char* start = json->c_str() + colon + 1;
  char* end = nullptr;
  const double bits = std::strtod(start, &end);
  if (end == start || !(bits > 0)) return std::nullopt;
  return bits / 8;
}

struct PeerTimes {
  double replicate = 0, restore = 0, connect = 0;
  std::string source;
};

// One round: step `step` snapshotted on node-a and sent to node-b, then
// restored on node-c from node-b's memory.
absl::StatusOr<PeerTimes> PeerRound(PeerNodes& nodes, const client::ClientOptions& co, uint8_t* src, uint8_t* dst,
                                    uint64_t n, uint64_t step) {
  PeerTimes t;
  Fill(src, n, step);
  const uint64_t sent_before = nodes.replicator().Stats().sent;
  {
    client::ClientOptions writer = co;
    writer.socket = nodes.socket_a();
    writer.slot_wait = kReadyWait;
    CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, client::Client::Connect(writer, Specs(src, {n})));
    CKPTD_RETURN_IF_ERROR(c->Snapshot(step).status());
    CKPTD_RETURN_IF_ERROR(c->WaitPersisted(step, absl::Minutes(10)));
  }  // node-a's trainer is gone with its node
  CKPTD_RETURN_IF_ERROR(nodes.coordinator().status());
  if (!nodes.replicator().WaitIdle(absl::Minutes(10))) {
    return absl::DeadlineExceededError("node-a's agent did not finish sending the step to node-b");
  }
  const replication::ReplicationStats st = nodes.replicator().Stats();
  if (st.sent != sent_before + 1) {
    return absl::InternalError(absl::StrCat("the copy of step ", step, " did not reach node-b: ",
                                            st.last_error.ok() ? "abandoned" : st.last_error.message()));
  }
  t.replicate = st.last_seconds;
  std::memset(dst, 0, n);
  client::ClientOptions reader = co;
  reader.socket = nodes.socket_c();
  reader.slot_wait = kReadyWait;
  const absl::Time t0 = absl::Now();
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, client::Client::Connect(reader, Specs(dst, {n})));
  t.connect = Seconds(absl::Now() - t0);
  CKPTD_ASSIGN_OR_RETURN(t.source, RestoreAndCompare(*c, dst, src, n, step, &t.restore));
  return t;
}

// --from peer (see kRestoreHelp).
int RunPeerRestore(const base::Args& args, uint64_t n, int rounds, std::ostream& out, std::ostream& err) {
  auto fail = [&](absl::string_view why, LineLogger* log = nullptr, int rc = base::kExitFailed) {
    return Fail(err, "restore", why, log, rc);
  };
  ScratchDir dir;
  LineLogger log(args.Has("log") ? &err : nullptr);
  absl::Status made = dir.Init(args.Get("dir"), "ckptd-restorebench");
  absl::StatusOr<agent::AgentOptions> options =
      made.ok() ? BaseOptions(dir.path(), "peerbench", &log) : absl::StatusOr<agent::AgentOptions>(made);
  if (!options.ok()) return fail(options.status().message());
  base::AlignedBuffer src, dst;
  if (absl::Status s = AllocateTwo(n, &src, &dst); !s.ok()) return fail(s.message());
  std::vector<double> replicate, restore, connect, iperf;
  std::vector<std::string> sources;
  absl::StatusOr<std::unique_ptr<PeerNodes>> nodes = PeerNodes::Start(*options, dir.path());
  if (!nodes.ok()) return fail(nodes.status().message(), nullptr, base::kExitUnavailable);
  client::ClientOptions co;
  co.job = "peerbench";
  // Rounds before kPeerWarmupRounds warm up (see kRestoreHelp); the copies
  // of all but the first went into new memory on node-b.
  std::vector<double> new_memory;
  for (int r = 0; r < kPeerWarmupRounds + rounds; ++r) {
    if (absl::Status s = (*nodes)->NewReplacement(r); !s.ok()) return fail(s.message(), nullptr, base::kExitUnavailable);
    absl::StatusOr<PeerTimes> t = PeerRound(**nodes, co, src.data(), dst.data(), n, r + 1);
    if (!t.ok()) return fail(t.status().message(), &log);
    if (r < kPeerWarmupRounds) {
      if (r > 0) new_memory.push_back(t->replicate);
      continue;
    }
    replicate.push_back(t->replicate);
    restore.push_back(t->restore);
    connect.push_back(t->connect);
    if (std::find(sources.begin(), sources.end(), t->source) == sources.end()) sources.push_back(t->source);
    // The yardstick right after, on the same loopback.
    if (std::optional<double> bps = Iperf3BytesPerSecond(n)) iperf.push_back(*bps);
  }
  nodes->reset();
  const std::string source = absl::StrJoin(sources, "+");
  const double replicate_s = Median(replicate), restore_s = Median(restore);
  const double gbps = Gbps(n, replicate_s), restore_gbps = Gbps(n, restore_s);
  const double new_memory_gbps = Gbps(n, Median(new_memory));
  const bool yardstick = !iperf.empty();
  const double iperf_gbps = Median(iperf) * 8 / 1e9;
  const double ratio = yardstick ? gbps / iperf_gbps : 0;
  if (args.Has("json")) {
    base::JsonWriter w;
    w.BeginObject();
    w.Field("bytes", n);
    w.Field("from", "peer");
    w.Field("rounds", rounds);
    w.Field("source", source);
    w.Field("source_as_expected", source == "peer");
    w.Field("verified", true);
    w.Field("connect_s", Median(connect));
    w.Field("replicate_s", replicate_s);
    w.Field("replicate_gbps", gbps);
    w.Field("replicate_new_memory_gbps", new_memory_gbps);
    w.Field("restore_s", restore_s);
    w.Field("restore_gbps", restore_gbps);
    if (yardstick) {
      w.Field("iperf3_gbps", iperf_gbps);
      w.Field("ratio", ratio);
      w.Field("target_ratio", kPeerTargetRatio);
      w.Field("target_met", ratio >= kPeerTargetRatio);
    }
    w.EndObject();
    out << w.str() << "\n";
    return base::kExitOk;
  }
  out << absl::StrFormat("restore of %s from peer (read from %s%s, bytes verified), median of %d:\n",
                         base::HumanBytes(n), source, source == "peer" ? "" : ", NOT peer", rounds);
  out << absl::StrFormat("  replicate node-a -> node-b %.4f s (%.2f Gbit/s; %.2f Gbit/s into new memory, warm-up)\n",
                         replicate_s, gbps, new_memory_gbps);
  out << absl::StrFormat("  restore on node-c from node-b %.4f s (%.2f Gbit/s; connect %.4f s before it)\n",
                         restore_s, restore_gbps, Median(connect));
  if (yardstick) {
    out << absl::StrFormat("  iperf3 loopback %.2f Gbit/s: replication %.2fx iperf3 (target >= %.1fx: %s)\n",
                           iperf_gbps, ratio, kPeerTargetRatio, ratio >= kPeerTargetRatio ? "met" : "MISSED");
  } else {
    out << "  iperf3 not on PATH: no yardstick\n";
  }
  return base::kExitOk;
}

// --from memory --cuda D: the trainer's buffer lives on a device.
class DeviceBuffers {
 public:
  DeviceBuffers(client::DeviceCopier* copier, int device) : copier_(copier) {
    device_.set_kind(ckptd::v1::Device::CUDA);
    device_.set_index(device);
  }
  ~DeviceBuffers() {
    for (void* p : owned_) copier_->FreeOnDevice(p, device_);
  }
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;

  const ckptd::v1::Device& device() const { return device_; }
  absl::StatusOr<void*> Allocate(uint64_t n) {
    CKPTD_ASSIGN_OR_RETURN(void* p, copier_->AllocateOnDevice(n, device_));
    owned_.push_back(p);
    return p;
  }
  // Plain copies, each waited for.
  absl::Status ToDevice(void* dst, const uint8_t* src, uint64_t n) {
    CKPTD_RETURN_IF_ERROR(copier_->CopyFromHost(dst, src, n, device_));
    return copier_->Synchronize();
  }
  absl::Status ToHost(uint8_t* dst, const void* src, uint64_t n) {
    CKPTD_RETURN_IF_ERROR(copier_->CopyToHost(dst, src, n, device_));
    return copier_->Synchronize();
  }
  // The trainer's buffer of `n` bytes at `p` on the device.
  std::vector<client::BufferSpec> Specs(void* p, uint64_t n) const {
    std::vector<client::BufferSpec> specs = bench::Specs(static_cast<uint8_t*>(p), {n});
    specs[0].device = device_;
    return specs;
  }

 private:
  client::DeviceCopier* const copier_;
  ckptd::v1::Device device_;
  std::vector<void*> owned_;
};

struct DeviceTimes {
  double connect = 0, staging_wait = 0, restore = 0, rollback = 0;
  double pinned = 0, pageable = 0, lock = 0, huge = 0;
  std::string source;
};

// `c` restores into `dst` on the device (zeroed first): it must get `step`,
// with the bytes of `pattern` (`scratch` holds the read-back). Seconds of the
// Restore; `*source` gets where it read them.
absl::StatusOr<double> RestoreToDevice(client::Client& c, DeviceBuffers& dev, void* dst, const uint8_t* pattern,
                                       uint8_t* scratch, uint64_t n, uint64_t step, std::string* source) {
  std::memset(scratch, 0, n);
  CKPTD_RETURN_IF_ERROR(dev.ToDevice(dst, scratch, n));
  const absl::Time t0 = absl::Now();
  CKPTD_ASSIGN_OR_RETURN(std::optional<uint64_t> restored, c.Restore());
  const double seconds = Seconds(absl::Now() - t0);
  if (restored != step) {
    return absl::FailedPreconditionError(
        absl::StrCat("the restore returned step ", restored ? absl::StrCat(*restored) : "none", ", not step ", step));
  }
  CKPTD_RETURN_IF_ERROR(dev.ToHost(scratch, dst, n));
  if (std::memcmp(scratch, pattern, n) != 0) {
    return absl::DataLossError(absl::StrCat("the bytes restored on ", "cuda:", dev.device().index(),
                                            " differ from those of step ", step));
  }
  *source = std::string(c.last_restore_source());
  return seconds;
}

// One round: a trainer snapshots step `step` from device memory `a` and,
// once it is persisted, restores it into `a` again (a rollback: its staging
// slot is page-locked by the snapshot); then it exits and a new trainer
// restores into `b` (a restart). The yardsticks: the same bytes copied from
// host memory into `b`, page-locked (cudaHostRegister, timed too) and not.
absl::StatusOr<DeviceTimes> DeviceRound(const client::ClientOptions& co, DeviceBuffers& dev, void* a, void* b,
                                        uint8_t* pattern, uint8_t* scratch, uint64_t n, uint64_t step,
                                        bool inline_alloc, LineLogger& log, client::DeviceCopier* copier,
                                        absl::string_view prefix) {
  DeviceTimes t;
  Fill(pattern, n, step);
  CKPTD_RETURN_IF_ERROR(dev.ToDevice(a, pattern, n));
  std::string source;
  {
    client::ClientOptions writer = co;
    writer.slot_wait = kReadyWait;  // the agent may still be allocating the staging
    CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, client::Client::Connect(writer, dev.Specs(a, n)));
    CKPTD_RETURN_IF_ERROR(c->Snapshot(step).status());
    CKPTD_RETURN_IF_ERROR(c->WaitPersisted(step, absl::Minutes(10)));
    CKPTD_ASSIGN_OR_RETURN(t.rollback, RestoreToDevice(*c, dev, a, pattern, scratch, n, step, &source));
    if (source != "memory") {
      return absl::FailedPreconditionError(absl::StrCat("the rollback read the step from ", source, ", not memory"));
    }
  }  // the trainer exits
  std::memset(scratch, 0, n);
  CKPTD_RETURN_IF_ERROR(dev.ToDevice(b, scratch, n));
  const size_t mark = log.size();
  const absl::Time t0 = absl::Now();
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, client::Client::Connect(co, dev.Specs(b, n)));
  const absl::Time connected = absl::Now();
  t.connect = Seconds(connected - t0);
  CKPTD_ASSIGN_OR_RETURN(absl::Time ready, AwaitStaging(log, mark, connected, inline_alloc));
  t.staging_wait = std::max(0.0, Seconds(ready - connected));
  CKPTD_ASSIGN_OR_RETURN(t.restore, RestoreToDevice(*c, dev, b, pattern, scratch, n, step, &t.source));
  c.reset();
  t.huge = HugeFraction(prefix);  // the agent's mapping alone
  // The yardsticks, after the restores; each copy once untimed first, as
  // the snapshot benchmark's yardstick.
  CKPTD_RETURN_IF_ERROR(dev.ToDevice(b, pattern, n));
  absl::Time y = absl::Now();
  CKPTD_RETURN_IF_ERROR(dev.ToDevice(b, pattern, n));
  t.pageable = Seconds(absl::Now() - y);
  y = absl::Now();
  CKPTD_RETURN_IF_ERROR(copier->RegisterHostMemory(pattern, n));
  t.lock = Seconds(absl::Now() - y);
  absl::Status copied = dev.ToDevice(b, pattern, n);  // once untimed
  if (copied.ok()) {
    y = absl::Now();
    copied = dev.ToDevice(b, pattern, n);
    t.pinned = Seconds(absl::Now() - y);
  }
  CKPTD_RETURN_IF_ERROR(copier->UnregisterHostMemory(pattern));
  CKPTD_RETURN_IF_ERROR(copied);
  return t;
}

int RunDeviceRestore(const base::Args& args, uint64_t n, int rounds, int device, client::DeviceCopier* copier,
                     std::ostream& out, std::ostream& err) {
  auto fail = [&](absl::string_view why, LineLogger* log = nullptr, int rc = base::kExitFailed) {
    return Fail(err, "restore", why, log, rc);
  };
  // The benchmark's own copies; the trainers' go through a copier of their
  // own, as in a trainer process (or through `copier` when one is given).
  std::unique_ptr<client::DeviceCopier> cuda;
  client::DeviceCopier* own = copier;
  if (own == nullptr) {
    absl::StatusOr<std::unique_ptr<client::DeviceCopier>> made = client::NewCudaCopier();
    if (!made.ok()) return fail(absl::StrCat("--cuda ", device, ": ", made.status().message()));
    cuda = *std::move(made);
    own = cuda.get();
  }
  ScratchDir dir;
  LineLogger log(args.Has("log") ? &err : nullptr);
  absl::Status made = dir.Init(args.Get("dir"), "ckptd-restorebench");
  absl::StatusOr<agent::AgentOptions> options =
      made.ok() ? BaseOptions(dir.path(), "restorebench", &log) : absl::StatusOr<agent::AgentOptions>(made);
  if (!options.ok()) return fail(options.status().message());
  const bool inline_alloc = AllocatedInline(*options, n);
  base::AlignedBuffer pattern, scratch;
  if (absl::Status s = AllocateTwo(n, &pattern, &scratch); !s.ok()) return fail(s.message());
  std::optional<DeviceBuffers> dev;
  dev.emplace(own, device);
  absl::StatusOr<void*> a = dev->Allocate(n);
  absl::StatusOr<void*> b = a.ok() ? dev->Allocate(n) : a;
  if (!b.ok()) return fail(absl::StrCat("--cuda ", device, ": ", b.status().message()));
  const std::string socket = storage::JoinPath(dir.path(), "agent.sock");
  absl::StatusOr<std::unique_ptr<LocalAgent>> agent = LocalAgent::Start(*options, socket);
  if (!agent.ok()) return fail(agent.status().message(), nullptr, base::kExitUnavailable);
  client::ClientOptions co;
  co.socket = socket;
  co.job = "restorebench";
  co.copier = copier;
  std::vector<double> connect, staging_wait, restore, rollback, pinned, pageable, lock, huge;
  std::vector<std::string> sources;
  for (int r = 0; r < rounds; ++r) {
    absl::StatusOr<DeviceTimes> t = DeviceRound(co, *dev, *a, *b, pattern.data(), scratch.data(), n, r + 1,
                                                inline_alloc, log, own, options->segment_prefix);
    if (!t.ok()) return fail(t.status().message(), &log);
    connect.push_back(t->connect);
    staging_wait.push_back(t->staging_wait);
    restore.push_back(t->restore);
    rollback.push_back(t->rollback);
    pinned.push_back(t->pinned);
    pageable.push_back(t->pageable);
    lock.push_back(t->lock);
    huge.push_back(t->huge);
    if (std::find(sources.begin(), sources.end(), t->source) == sources.end()) sources.push_back(t->source);
  }
  agent->reset();
  dev.reset();
  const std::string source = absl::StrJoin(sources, "+");
  const bool as_expected = source == "memory";
  const double restore_s = Median(restore), rollback_s = Median(rollback), pinned_s = Median(pinned),
               pageable_s = Median(pageable);
  const double ratio = pinned_s > 0 ? restore_s / pinned_s : 0;
  const double rollback_ratio = pinned_s > 0 ? rollback_s / pinned_s : 0;
  const double vs_pageable = pageable_s > 0 ? restore_s / pageable_s : 0;
  const std::string where = absl::StrCat("cuda:", device);
  if (args.Has("json")) {
    base::JsonWriter w;
    w.BeginObject();
    w.Field("bytes", n);
    w.Field("from", "memory");
    w.Field("device", where);
    w.Field("rounds", rounds);
    w.Field("source", source);
    w.Field("source_as_expected", as_expected);
    w.Field("verified", true);
    w.Field("connect_s", Median(connect));
    w.Field("staging_wait_s", Median(staging_wait));
    w.Field("restore_s", restore_s);
    w.Field("rollback_s", rollback_s);
    w.Field("cuda_memcpy_s", pinned_s);
    w.Field("pageable_memcpy_s", pageable_s);
    w.Field("host_register_s", Median(lock));
    w.Field("ratio", ratio);
    w.Field("rollback_ratio", rollback_ratio);
    w.Field("restore_vs_pageable", vs_pageable);
    w.Field("target_ratio", kDeviceTargetRatio);
    w.Field("target_met", ratio <= kDeviceTargetRatio);
    w.Field("rollback_target_met", rollback_ratio <= kDeviceTargetRatio);
    w.Field("staging_huge_fraction", Median(huge));
    w.EndObject();
    out << w.str() << "\n";
    return base::kExitOk;
  }
  auto verdict = [](double r) { return r <= kDeviceTargetRatio ? "met" : "MISSED"; };
  out << absl::StrFormat("restore of %s from memory onto %s (read from %s%s, bytes verified), median of %d:\n",
                         base::HumanBytes(n), where, source, as_expected ? "" : ", NOT memory", rounds);
  out << absl::StrFormat("  restart  %.4f s: a new trainer (connect %.4f s, staging wait %.4f s before it)\n",
                         restore_s, Median(connect), Median(staging_wait));
  out << absl::StrFormat("  rollback %.4f s: the trainer that took the snapshot, its slot page-locked\n", rollback_s);
  out << absl::StrFormat("  cudaMemcpy from page-locked memory %.4f s (locking it: cudaHostRegister %.4f s), "
                         "from pageable memory %.4f s\n",
                         pinned_s, Median(lock), pageable_s);
  out << absl::StrFormat("  restart %.2fx page-locked cudaMemcpy (target <= %.1fx: %s), %.2fx pageable\n", ratio,
                         kDeviceTargetRatio, verdict(ratio), vs_pageable);
  out << absl::StrFormat("  rollback %.2fx page-locked cudaMemcpy (target <= %.1fx: %s)\n", rollback_ratio,
                         kDeviceTargetRatio, verdict(rollback_ratio));
  out << absl::StrFormat("  staging on huge pages: %.0f%%\n", 100 * Median(huge));
  return base::kExitOk;
}

}  // namespace

int RunRegisterBench(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  absl::StatusOr<base::Args> args =
      base::Args::Parse(argv, {"bytes", "buffers", "slots", "repeat", "dir"}, {"json", "log", "help"});
  if (args.ok() && args->Has("help")) {
    out << kRegisterHelp;
    return base::kExitOk;
  }
  auto usage = [&](absl::string_view why) {
    err << "ckptd-bench register: " << why << "\n" << kRegisterHelp;
    return base::kExitUsage;
  };
  if (!args.ok()) return usage(args.status().message());
  uint64_t n = 0;
  uint32_t buffers = 1, slots = 2;
  int rounds = 3;
  for (const absl::Status& s :
       {args->ReadUint("bytes", 1, kMaxBytes, &n, /*allow_suffix=*/true), args->ReadUint("buffers", 1, 1024, &buffers),
        args->ReadUint("slots", 1, 16, &slots), args->ReadUint("repeat", 1, 100, &rounds)}) {
    if (!s.ok()) return usage(s.message());
  }
  if (n == 0) return usage("--bytes is required");
  if (n < buffers) return usage(absl::StrCat("--bytes ", n, " cannot be cut into ", buffers, " buffers (--buffers)"));
  auto fail = [&](absl::string_view why, LineLogger* log = nullptr, int rc = base::kExitFailed) {
    return Fail(err, "register", why, log, rc);
  };

  ScratchDir dir;
  LineLogger log(args->Has("log") ? &err : nullptr);
  absl::Status made = dir.Init(args->Get("dir"), "ckptd-regbench");
  absl::StatusOr<agent::AgentOptions> options =
      made.ok() ? BaseOptions(dir.path(), "regbench", &log) : absl::StatusOr<agent::AgentOptions>(made);
  if (!options.ok()) return fail(options.status().message());
  options->slots = slots;
  std::vector<uint64_t> lengths(buffers, n / buffers);
  for (uint64_t i = 0; i < n % buffers; ++i) ++lengths[i];
  const uint64_t segment_bytes = staging::SegmentBytes(slots, staging::PlanLayout(lengths).slot_bytes);
  const bool inline_alloc = segment_bytes <= options->prepare_inline_bytes;
  base::AlignedBuffer buffer;
  try {
    buffer = base::AlignedBuffer(n);
  } catch (const std::bad_alloc&) {  // the one exception a size the user chose may raise
    return fail(absl::StrCat("cannot allocate ", base::HumanBytes(n), " (--bytes)"));
  }
  const std::vector<client::BufferSpec> specs = Specs(buffer.data(), lengths);
  const std::string socket = storage::JoinPath(dir.path(), "agent.sock");
  const std::string prefix = options->segment_prefix;
  std::vector<double> first, ready, first_snapshot, again, huge;
  bool reused = true;
  for (int r = 0; r < rounds; ++r) {
    options->segment_prefix = absl::StrCat(prefix, "-", r);
    absl::StatusOr<std::unique_ptr<LocalAgent>> agent = LocalAgent::Start(*options, socket);
    if (!agent.ok()) return fail(agent.status().message(), nullptr, base::kExitUnavailable);
    client::ClientOptions co;
    co.socket = socket;
    co.job = absl::StrCat("regbench-", r);  // new to the agent
    absl::StatusOr<RegisterTimes> t = RegisterRound(co, specs, log, inline_alloc, options->segment_prefix);
    if (!t.ok()) return fail(t.status().message(), &log);
    first.push_back(t->first);
    ready.push_back(t->ready);
    first_snapshot.push_back(t->first_snapshot);
    again.push_back(t->again);
    huge.push_back(t->huge);
    reused = reused && t->reused;
  }
  const double again_s = Median(again);
  const bool met = again_s < kAgainTarget;
  if (args->Has("json")) {
    base::JsonWriter w;
    w.BeginObject();
    w.Field("bytes", n);
    w.Field("buffers", buffers);
    w.Field("slots", slots);
    w.Field("segment_bytes", segment_bytes);
    w.Field("rounds", rounds);
    w.Field("first_register_s", Median(first));
    w.Field("ready_s", Median(ready));
    w.Field("first_snapshot_s", Median(first_snapshot));
    w.Field("again_register_s", again_s);
    w.Field("again_reused", reused);
    w.Field("again_target_s", kAgainTarget);
    w.Field("again_target_met", met);
    w.Field("staging_huge_fraction", Median(huge));
    w.EndObject();
    out << w.str() << "\n";
  } else {
    out << absl::StrFormat(
        "register of %s in %u buffer%s, segment %s (%u slots), median of %d:\n"
        "  first %.4f s (first snapshot at %.4f s, every slot ready at %.4f s)\n"
        "  again %.4f s%s (target: again < %.3f s for any size: %s)\n"
        "  staging on huge pages: %.0f%%\n",
        base::HumanBytes(n), buffers, buffers == 1 ? "" : "s", base::HumanBytes(segment_bytes), slots, rounds,
        Median(first), Median(first_snapshot), Median(ready), again_s,
        reused ? "" : ", the parked segment NOT taken over", kAgainTarget, met ? "met" : "MISSED", 100 * Median(huge));
  }
  return base::kExitOk;
}

int RunRestoreBench(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err,
                    client::DeviceCopier* device_copier) {
  absl::StatusOr<base::Args> args =
      base::Args::Parse(argv, {"bytes", "from", "repeat", "dir", "cuda", "root"}, {"json", "log", "help"});
  if (args.ok() && args->Has("help")) {
    out << kRestoreHelp;
    return base::kExitOk;
  }
  auto usage = [&](absl::string_view why) {
    err << "ckptd-bench restore: " << why << "\n" << kRestoreHelp;
    return base::kExitUsage;
  };
  if (!args.ok()) return usage(args.status().message());
  uint64_t n = 0;
  int rounds = 3;
  int device = 0;
  for (const absl::Status& s :
       {args->ReadUint("bytes", 1, kMaxBytes, &n, /*allow_suffix=*/true), args->ReadUint("repeat", 1, 100, &rounds),
        args->ReadUint("cuda", 0, kMaxCudaDevice, &device)}) {
    if (!s.ok()) return usage(s.message());
  }
  if (n == 0) return usage("--bytes is required");
  const std::string from = args->Get("from").value_or("memory");
  const std::optional<std::string> root_url = args->Get("root");
  if (root_url && (from == "memory" || from == "peer")) return usage("--root goes with --from local or --from root");
  if (args->Get("cuda")) {
    if (from != "memory") return usage("--cuda goes with --from memory");
    return RunDeviceRestore(*args, n, rounds, device, device_copier, out, err);
  }
  if (from == "peer") return RunPeerRestore(*args, n, rounds, out, err);
  Tier tier;
  if (from == "memory") {
    tier = Tier::kMemory;
  } else if (from == "local") {
    tier = Tier::kLocal;
  } else if (from == "root") {
    tier = Tier::kRoot;
  } else {
    return usage(absl::StrCat("--from must be memory, peer, local or root, got \"", base::TerminalSafe(from), "\""));
  }
  const char* expected = tier == Tier::kMemory ? "memory" : tier == Tier::kLocal ? "node-local" : "storage-root";
  auto fail = [&](absl::string_view why, LineLogger* log = nullptr, int rc = base::kExitFailed) {
    return Fail(err, "restore", why, log, rc);
  };

  ScratchDir dir;
  LineLogger log(args->Has("log") ? &err : nullptr);
  absl::Status made = dir.Init(args->Get("dir"), "ckptd-restorebench");
  // Declared before the agent, which they outlive: --root's file system and,
  // with --root, the node-local tier's.
  std::unique_ptr<storage::PosixFileSystem> posix = storage::NewPosixFileSystem();
  std::optional<objstore::StorageRoot> root;
  if (made.ok() && root_url) {
    absl::StatusOr<objstore::StorageRoot> opened = OpenObjectStoreRoot(*root_url, posix.get());
    if (!opened.ok()) return fail(absl::StrCat("--root: ", opened.status().message()));
    root = *std::move(opened);
  }
  absl::StatusOr<agent::AgentOptions> options =
      made.ok() ? BaseOptions(dir.path(), "restorebench", &log, root ? &*root : nullptr)
                : absl::StatusOr<agent::AgentOptions>(made);
  if (options.ok() && tier != Tier::kMemory) {
    options->keep_in_memory = false;
    if (tier == Tier::kLocal) {
      options->local_cache = storage::JoinPath(dir.path(), "local");
      if (root) options->local_fs = posix.get();  // not the object store's
      if (absl::Status s = storage::CreateDirs(posix.get(), options->local_cache); !s.ok()) options = s;
    }
  }
  if (!options.ok()) return fail(options.status().message());
  // In an object store other runs may share: a job of this run's own, whose
  // steps go once the agent has stopped (this is declared before it).
  const std::string job =
      root ? absl::StrCat("restorebench-", absl::ToUnixMillis(absl::Now()), "-", ::getpid()) : "restorebench";
  absl::Cleanup remove_job = [&] {
    if (root) RemoveJob(*root, job, err);
  };
  const bool inline_alloc = AllocatedInline(*options, n);
  // The first trainer's buffer (the pattern) and the second's (pre-faulted).
  base::AlignedBuffer src, dst;
  if (absl::Status s = AllocateTwo(n, &src, &dst); !s.ok()) return fail(s.message());
  const std::string socket = storage::JoinPath(dir.path(), "agent.sock");
  absl::StatusOr<std::unique_ptr<LocalAgent>> agent = LocalAgent::Start(*options, socket, root ? root->fs : nullptr);
  if (!agent.ok()) return fail(agent.status().message(), nullptr, base::kExitUnavailable);
  client::ClientOptions co;
  co.socket = socket;
  co.job = job;
  const bool s3 = root && tier == Tier::kRoot;  // the S3 yardstick instead of the files'
  const std::string scratch = storage::JoinPath(dir.path(), "s3-yardstick.shard");
  std::vector<double> connect, staging_wait, restore, yardstick, fio, resident, huge, s3_client;
  std::string s3_missing;
  std::vector<std::string> sources;
  for (int r = 0; r < rounds; ++r) {
    absl::StatusOr<RestoreTimes> t =
        RestoreRound(co, *options, tier, inline_alloc, src.data(), dst.data(), n, r + 1, scratch, log);
    if (!t.ok()) return fail(t.status().message(), &log);
    if (s3 && t->s3_client.ok()) s3_client.push_back(*t->s3_client);
    if (s3 && !t->s3_client.ok()) s3_missing = std::string(t->s3_client.status().message());
    connect.push_back(t->connect);
    staging_wait.push_back(t->staging_wait);
    restore.push_back(t->restore);
    yardstick.push_back(t->yardstick);
    huge.push_back(t->huge);
    if (t->fio) fio.push_back(*t->fio);
    if (t->resident) resident.push_back(*t->resident);
    if (std::find(sources.begin(), sources.end(), t->source) == sources.end()) sources.push_back(t->source);
  }
  agent->reset();
  const std::string source = absl::StrJoin(sources, "+");
  const bool as_expected = source == expected;
  const double restore_s = Median(restore), yard_s = Median(yardstick);
  const double ratio = yard_s > 0 ? restore_s / yard_s : 0;
  const double restore_gbps = Gbps(n, restore_s), s3_gbps = Median(s3_client) * 8 / 1e9;
  const double s3_ratio = s3_gbps > 0 ? restore_gbps / s3_gbps : 0;
  if (args->Has("json")) {
    base::JsonWriter w;
    w.BeginObject();
    w.Field("bytes", n);
    w.Field("from", from);
    w.Field("rounds", rounds);
    w.Field("source", source);
    w.Field("source_as_expected", as_expected);
    w.Field("verified", true);
    w.Field("connect_s", Median(connect));
    w.Field("staging_wait_s", Median(staging_wait));
    w.Field("restore_s", restore_s);
    if (root) w.Field("root", root->description);
    if (s3) {
      w.Field("restore_gbps", restore_gbps);
      if (s3_client.empty()) {
        w.Field("s3_client_missing", s3_missing);
      } else {
        w.Field("s3_client_gbps", s3_gbps);
        w.Field("restore_vs_s3_client", s3_ratio);
      }
    } else if (tier == Tier::kMemory) {
      w.Field("memcpy_s", yard_s);
      w.Field("ratio", ratio);
      w.Field("target_ratio", kMemoryTargetRatio);
      w.Field("target_met", ratio <= kMemoryTargetRatio);
      w.Field("staging_huge_fraction", Median(huge));
    } else {
      w.Field("read_s", yard_s);
      w.Field("ratio", ratio);
      if (!fio.empty()) w.Field("fio_read_s", Median(fio));
      if (!resident.empty()) w.Field("resident_after_evict", Median(resident));
    }
    w.EndObject();
    out << w.str() << "\n";
    return base::kExitOk;
  }
  out << absl::StrFormat("restore of %s from %s (read from %s%s, bytes verified), median of %d:\n", base::HumanBytes(n),
                         from, source, as_expected ? "" : absl::StrCat(", NOT ", expected), rounds);
  out << absl::StrFormat("  restore %.4f s (connect %.4f s, staging wait %.4f s before it)\n", restore_s,
                         Median(connect), Median(staging_wait));
  if (root) out << "  storage root " << root->description << "\n";
  if (s3) {
    out << absl::StrFormat("  restore %.2f Gbit/s; ", restore_gbps)
        << (s3_client.empty() ? absl::StrCat("no S3 client yardstick: ", s3_missing)
                              : absl::StrFormat("S3 client (boto3's transfer manager) %.2f Gbit/s: restore %.2fx "
                                                "its throughput",
                                                s3_gbps, s3_ratio))
        << "\n";
  } else if (tier == Tier::kMemory) {
    out << absl::StrFormat("  memcpy  %.4f s: restore %.2fx memcpy (target <= %.1fx: %s)\n", yard_s, ratio,
                           kMemoryTargetRatio, ratio <= kMemoryTargetRatio ? "met" : "MISSED");
    out << absl::StrFormat("  staging on huge pages: %.0f%%\n", 100 * Median(huge));
  } else {
    out << absl::StrFormat("  read()  %.4f s: restore %.2fx read()\n", yard_s, ratio);
    if (!fio.empty()) out << absl::StrFormat("  fio     %.4f s (O_DIRECT, 4 MiB blocks)\n", Median(fio));
    if (!resident.empty()) {
      out << absl::StrFormat("  page cache after eviction: %.0f%% of the shard\n", 100 * Median(resident));
    }
  }
  return base::kExitOk;
}

}  // namespace ckptd::bench
