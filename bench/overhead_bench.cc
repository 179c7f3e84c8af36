#include "bench/overhead_bench.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/cpu_set.h"
#include "base/flags.h"
#include "base/json.h"
#include "base/thread_priority.h"
#include "bench/bench_util.h"
#include "client/client.h"
#include "objstore/s3_options.h"
#include "objstore/storage_root.h"
#include "storage/layout.h"
#include "storage/posix_file_system.h"
#include "storage/shard_reader.h"

namespace ckptd::bench {

const char kOverheadHelp[] =
    "usage: ckptd-bench overhead [--state-mb M] [--steps N] [--step-ms T] [--every K,K,...] [--repeat R] [--json]\n"
    "\n"
    "Starts ckptd-agent (from this binary's folder) on a scratch folder and runs\n"
    "ckptd-demo-trainer with --state-mb M (default 4) for N steps (default 200),\n"
    "each padded to T ms of compute (default 50), without checkpoints and with a\n"
    "snapshot every K steps for each K (default 1,50), R rounds each (default 3)\n"
    "in alternating order. Reports the median training time of each and the\n"
    "overhead against the run without checkpoints.\n"
    "Ranges: --state-mb 1..65536, --steps 1..2^62, --step-ms 0..3600000, --every\n"
    "1..2^40 each, --repeat 1..100.\n"
    "\n"
    "usage: ckptd-bench overhead --during-persist [--state-mb M] [--configs C;C;...]\n"
    "                            [--work-kb W] [--quiet-ms Q] [--persists N] [--repeat R]\n"
    "                            [--root <dir|s3://bucket/prefix>] [--json]\n"
    "\n"
    "How much a persist slows a 1-thread training loop on the same machine, for\n"
    "each agent configuration C, side by side: P/C[@CPUS] is ckptd-agent\n"
    "--background-priority P --compression C [--cpu-set CPUS] (the training loop\n"
    "then on the other CPUs), `control` the same procedure without snapshots\n"
    "(the noise of the machine), `spin` that with a busy thread at SCHED_IDLE\n"
    "on a second CPU instead of a persist (the loop on the first; what any work\n"
    "on another CPU costs it, whatever its priority: SMT siblings, shared caches\n"
    "and memory, a VM's vCPUs on one core), and `write` that with a thread at\n"
    "SCHED_IDLE and the lowest I/O priority writing as many bytes as the state\n"
    "with O_DIRECT and fsyncing them (what a persist's disk traffic alone costs\n"
    "it, as dd would write them); default control;spin;write;idle/auto;\n"
    "normal/auto;idle/zstd;normal/zstd. For each, this process registers M MiB\n"
    "of fp32 state (default 1335, 1.4 GB: params, grads and two Adam moments)\n"
    "with a fresh ckptd-agent, snapshots once to warm up, then trains in one\n"
    "thread (Adam-like steps of about 10 ms over W KiB that stay in the caches,\n"
    "default 512) for Q ms (default 2000), and N times (default 3) snapshots,\n"
    "trains until the step is persisted and Q ms more. Reports per configuration\n"
    "the median over R rounds (default 3, configurations in alternating order)\n"
    "of: the slowdown of the steps taken while persists ran against the others,\n"
    "the training time that cost per persist (lost s), the stall (the copy into\n"
    "staging), the durable time (from the snapshot to the shard fsynced and\n"
    "renamed), the agent's CPU seconds per persist, and what the last shard holds\n"
    "(stored/raw bytes, blocks written raw); and the host's steal time and load.\n"
    "Each agent's storage root is a new folder under a scratch folder in /tmp,\n"
    "or with --root a new folder or prefix below it (removed afterwards); an\n"
    "object store root (credentials as for ckptd-agent) gets a node-local tier\n"
    "in the scratch folder (--local-cache), so the durable time is the upload's.\n"
    "Ranges: --state-mb 1..65536, --work-kb 4..1048576, --quiet-ms 100..600000,\n"
    "--persists 1..100, --repeat 1..100; P is idle, low or normal, C is auto, zstd or none.\n";

namespace {

// Runs the trainer; returns train_s from its last line.
std::optional<double> RunTrainer(const std::string& command) {
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return std::nullopt;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0) return std::nullopt;
  const size_t at = out.rfind("train_s=");
  double v = 0;
  if (at == std::string::npos || !absl::SimpleAtod(absl::StripTrailingAsciiWhitespace(out.substr(at + 8)), &v)) {
    return std::nullopt;
  }
  return v;
}

// ---- --during-persist ---------------------------------------------------------

// An agent configuration: --background-priority, --compression and, when
// not empty, --cpu-set (the training loop then runs on the other CPUs).
struct AgentConfig {
  std::string priority;
  std::string compression;
  std::vector<int> cpus;
  // The control: no snapshot in the measured windows (what noise alone
  // shows); with `spin`, a busy thread at SCHED_IDLE on another CPU instead
  // (what any work there costs the training loop, whatever its priority);
  // with `write`, a thread at SCHED_IDLE and the lowest I/O priority that
  // writes as many bytes as the state with O_DIRECT and fsyncs them (what
  // the disk traffic of a persist alone costs, as dd would do it).
  bool control = false;
  bool spin = false;
  bool write = false;
  std::string Name() const {
    if (control) return spin ? "spin" : write ? "write" : "control";
    return absl::StrCat(priority, "/", compression, cpus.empty() ? "" : "@", base::FormatCpuList(cpus));
  }
};

// One round of one configuration.
struct PersistCycle {
  double quiet_step_s = 0;    // mean step time with no persist in flight
  double persist_step_s = 0;  // mean step time while the persist ran
  uint64_t persist_steps = 0;
  double stall_s = 0;          // the snapshot's copy into staging
  double durable_s = 0;        // from the snapshot call to the step persisted
  double agent_cpu_s = 0;      // the agent's CPU time over the same span
  uint64_t blocks = 0;         // the shard's blocks of float tensors ...
  uint64_t raw_blocks = 0;     // ... and those of them stored without byte planes (raw)
  double stored_fraction = 1;  // stored bytes / raw bytes of the shard
  uint64_t last_step = 1;      // the shard inspected
  double lost_s = 0;           // training time lost per persist: the extra time of the steps during it
};

double Slowdown(const PersistCycle& c) { return c.quiet_step_s > 0 ? c.persist_step_s / c.quiet_step_s - 1 : 0; }

// Normal-like fp32 values of standard deviation about `stddev` (a sum of
// four uniforms), `square`d for Adam's second moment.
void FillNormalish(float* out, size_t n, uint64_t seed, float stddev, bool square) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  const float scale = stddev * std::sqrt(3.0f / 4.0f) / 32768.0f;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float u =
        static_cast<float>(static_cast<int64_t>(x & 0xffff) + static_cast<int64_t>((x >> 16) & 0xffff) +
                           static_cast<int64_t>((x >> 32) & 0xffff) + static_cast<int64_t>(x >> 48) - 4 * 32768);
    const float v = u * scale;
    out[i] = square ? v * v : v;
  }
}

// The training loop's work: Adam-like passes over a working set small
// enough to stay in the caches, so that what slows a step is the CPU the
// agent takes (and what it does to the caches).
class TrainingWork {
 public:
  explicit TrainingWork(size_t floats) : p_(floats), g_(floats), m_(floats), v_(floats) {
    FillNormalish(p_.data(), floats, 1, 0.02f, false);
  }
  void Pass() {
    ++t_;
    const float b1 = 0.9f, b2 = 0.999f, lr = 1e-3f, eps = 1e-8f;
    for (size_t i = 0; i < p_.size(); ++i) {
      g_[i] = p_[i] * 0.5f + 1e-3f * static_cast<float>(t_ & 7);
      m_[i] = b1 * m_[i] + (1 - b1) * g_[i];
      v_[i] = b2 * v_[i] + (1 - b2) * g_[i] * g_[i];
      p_[i] -= lr * m_[i] / (std::sqrt(v_[i]) + eps);
    }
  }
  void Step() {
    for (int i = 0; i < passes_; ++i) Pass();
  }
  // Sets the passes per step so that one takes about `target` here and now.
  void Calibrate(absl::Duration target) {
    passes_ = 1;
    const absl::Time start = absl::Now();
    int n = 0;
    while (absl::Now() - start < absl::Milliseconds(300)) {
      Pass();
      ++n;
    }
    const absl::Duration per_pass = (absl::Now() - start) / n;
    passes_ = std::max<int>(1, static_cast<int>(target / per_pass));
  }
  float sink() const { return p_.empty() ? 0 : p_[0]; }

 private:
  std::vector<float> p_, g_, m_, v_;
  uint64_t t_ = 0;
  int passes_ = 1;
};

// The machine's CPU time so far, and of it the time stolen by the host of
// this VM (/proc/stat), in clock ticks.
std::pair<double, double> CpuAndStealTicks() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  double total = 0, steal = 0, v = 0;
  f >> cpu;
  for (int i = 0; i < 8 && f >> v; ++i) {  // user nice system idle iowait irq softirq steal
    total += v;
    if (i == 7) steal = v;
  }
  return {total, steal};
}

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string one;
  f >> one;
  return one;
}

// utime + stime of `pid` in seconds; 0 when it cannot be read.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream fields(stat.substr(paren + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {  // field 3 is the state; 14 utime, 15 stime
    double v = 0;
    if ((i == 14 || i == 15) && absl::SimpleAtod(field, &v)) ticks += v;
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Starts ckptd-agent with `config` on `root`, serving `socket`; waits for the socket.
std::optional<pid_t> StartAgent(const std::string& bin, const std::string& root, const std::string& socket,
                                const AgentConfig& config, const std::string& local_cache = "") {
  const std::string agent = bin + "/ckptd-agent";
  std::vector<std::string> args = {agent,
                                   "--storage-root",
                                   root,
                                   "--socket",
                                   socket,
                                   "--keep",
                                   "1",
                                   "--background-priority",
                                   config.priority,
                                   "--compression",
                                   config.compression};
  if (!config.cpus.empty()) {
    args.push_back("--cpu-set");
    args.push_back(base::FormatCpuList(config.cpus));
  }
  if (!local_cache.empty()) {
    args.push_back("--local-cache");
    args.push_back(local_cache);
  }
  const pid_t pid = ::fork();
  if (pid < 0) return std::nullopt;
  if (pid == 0) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // Its log would interleave with the report.
    if (std::FILE* null = std::freopen("/dev/null", "w", stderr); null == nullptr) ::_exit(127);
    ::execv(agent.c_str(), argv.data());
    ::_exit(127);
  }
  for (int i = 0; i < 1000 && ::access(socket.c_str(), F_OK) != 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  if (::access(socket.c_str(), F_OK) != 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return std::nullopt;
  }
  return pid;
}

// The fp32 state a trainer of `state_mb` MiB registers (as ckptd-demo-trainer:
// params, grads and two Adam moments).
struct BenchState {
  explicit BenchState(uint64_t state_mb) : n(std::max<size_t>(1, state_mb * (uint64_t{1} << 20) / 16)) {
    for (int b = 0; b < 4; ++b) buffers[b].reset(new float[n]);
    FillNormalish(buffers[0].get(), n, 11, 0.02f, false);  // params
    FillNormalish(buffers[1].get(), n, 12, 1e-3f, false);  // grads
    FillNormalish(buffers[2].get(), n, 13, 1e-4f, false);  // exp_avg
    FillNormalish(buffers[3].get(), n, 14, 1e-3f, true);   // exp_avg_sq: all positive
  }
  std::vector<client::BufferSpec> Specs() {
    const char* names[4] = {"model.params", "model.grads", "adam.exp_avg", "adam.exp_avg_sq"};
    const v1::Component components[4] = {v1::PARAMS, v1::GRADS, v1::OPTIMIZER, v1::OPTIMIZER};
    std::vector<client::BufferSpec> specs;
    for (int b = 0; b < 4; ++b) {
      client::BufferSpec s;
      s.name = names[b];
      s.component = components[b];
      s.dtype = v1::FLOAT32;
      s.shape = {n};
      s.data = buffers[b].get();
      specs.push_back(std::move(s));
    }
    return specs;
  }
  uint64_t bytes() const { return 4 * n * sizeof(float); }

  const size_t n;
  std::unique_ptr<float[]> buffers[4];
};

// Counts the shard's float blocks stored raw, and its stored/raw bytes.
void InspectShard(storage::FileSystem* fs, const std::string& path, PersistCycle* c) {
  absl::StatusOr<std::unique_ptr<storage::ShardReader>> reader = storage::ShardReader::Open(fs, path);
  if (!reader.ok()) return;
  const v1::ShardIndex& index = (*reader)->index();
  for (const v1::Tensor& t : index.tensors()) {
    for (const v1::Block& b : t.blocks()) {
      ++c->blocks;
      if (b.filter() != v1::BYTE_PLANES) ++c->raw_blocks;
    }
  }
  if (index.raw_bytes() > 0) {
    c->stored_fraction = static_cast<double>(index.stored_bytes()) / static_cast<double>(index.raw_bytes());
  }
}

// The `write` yardstick: `bytes` written to `path` in 4 MiB O_DIRECT writes
// and fsynced, from a thread at SCHED_IDLE with the lowest best-effort I/O
// priority (as the agent's background work); the file is removed.
absl::Status WriteLikeAPersist(const std::string& path, uint64_t bytes) {
  (void)base::SetCallingThreadPriority(base::ThreadPriority::kIdle);
  (void)base::SetCallingThreadLowestIoPriority();
  constexpr size_t kChunk = 4u << 20;
  void* mem = nullptr;
  if (::posix_memalign(&mem, 4096, kChunk) != 0) return absl::ResourceExhaustedError("write: no memory");
  std::unique_ptr<void, decltype(&std::free)> buf(mem, &std::free);
  std::memset(mem, 0x5a, kChunk);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("write: open ", path));
  absl::Cleanup close_and_remove = [fd, &path] {
    ::close(fd);
    ::unlink(path.c_str());
  };
  for (uint64_t off = 0; off < bytes; off += kChunk) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, (bytes - off + 4095) / 4096 * 4096));
    if (::pwrite(fd, mem, n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
      return absl::ErrnoToStatus(errno, absl::StrCat("write: pwrite ", path));
    }
  }
  if (::fsync(fd) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("write: fsync ", path));
  return absl::OkStatus();
}

// One round of one configuration: a fresh agent, a warm-up snapshot, then the
// measured one. `why` says what failed.
std::optional<PersistCycle> RunPersistCycle(const std::string& bin, const std::string& dir,
                                            const std::string& root_base, int n,
                                            const AgentConfig& config, BenchState& state, TrainingWork& work,
                                            absl::Duration quiet, int persists, absl::Duration control_window,
                                            std::string* why) {
  // A root of the caller's (--root) gets a folder (or prefix) per agent; an
  // object store root gets a node-local tier in front, as on a cloud node.
  const bool remote = objstore::IsObjectStoreRoot(root_base);
  const std::string root = root_base.empty() ? absl::StrCat(dir, "/root-", n)
                                             : absl::StrCat(root_base, "/overhead-", ::getpid(), "-", n);
  const std::string local = remote ? absl::StrCat(dir, "/local-", n) : std::string();
  const std::string socket = absl::StrCat(dir, "/agent-", n, ".sock");
  std::optional<pid_t> agent = StartAgent(bin, root, socket, config, local);
  if (!agent) {
    *why = absl::StrCat("ckptd-agent ", config.Name(), " did not start");
    return std::nullopt;
  }
  // With CPUs of its own for the agent (which was started with all of this
  // process's), this process (the trainer) keeps to the others.
  absl::StatusOr<std::vector<int>> allowed = base::AllowedCpus();
  if (!allowed.ok()) {
    *why = std::string(allowed.status().message());
    ::kill(*agent, SIGKILL);
    ::waitpid(*agent, nullptr, 0);
    return std::nullopt;
  }
  if (!config.cpus.empty()) {
    std::vector<int> rest;
    for (int cpu : *allowed) {
      if (!std::binary_search(config.cpus.begin(), config.cpus.end(), cpu)) rest.push_back(cpu);
    }
    if (absl::Status s = rest.empty() ? absl::OkStatus() : base::PinProcessToCpus(rest); !s.ok()) {
      *why = std::string(s.message());
      ::kill(*agent, SIGKILL);
      ::waitpid(*agent, nullptr, 0);
      return std::nullopt;
    }
  }
  // `spin`: the training loop on the first CPU, the spinner on another.
  const int spin_cpu = allowed->size() > 1 ? (*allowed)[1] : allowed->front();
  if (config.spin && allowed->size() > 1) {
    if (absl::Status s = base::PinProcessToCpus({allowed->front()}); !s.ok()) {
      *why = std::string(s.message());
      ::kill(*agent, SIGKILL);
      ::waitpid(*agent, nullptr, 0);
      return std::nullopt;
    }
  }
  absl::Cleanup unpin = [&] {
    // As it was; best effort.
    if (!config.cpus.empty() || config.spin) (void)base::PinProcessToCpus(*allowed);
  };

  std::optional<PersistCycle> result;
  {
    client::ClientOptions options;
    options.socket = socket;
    options.job = "bench";
    options.connect_wait = absl::Seconds(10);
    options.slot_wait = absl::Seconds(120);  // the staging is allocated in the background
    options.rpc_timeout = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<client::Client>> connected = client::Client::Connect(options, state.Specs());
    if (!connected.ok()) {
      *why = absl::StrCat("connect: ", connected.status().message());
    } else {
      client::Client& c = **connected;
      PersistCycle cycle;
      absl::Status s = c.Snapshot(1).status();
      if (s.ok()) s = c.WaitPersisted(1, absl::Minutes(10));
      // Trains for `d` (or, with d infinite, until `step` is persisted, or
      // `until` is set), asking the agent every 20 ms whether `step` is
      // persisted (the same calls in every phase); returns the step times.
      absl::Time persisted_at;
      auto train = [&](absl::Duration d, uint64_t step, const std::atomic<bool>* until = nullptr) {
        std::vector<double> times;
        const absl::Time start = absl::Now();
        absl::Time next_poll = start;
        while (absl::Now() - start < std::min(d, absl::Minutes(20))) {
          const absl::Time t0 = absl::Now();
          work.Step();
          times.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
          if (until != nullptr && until->load()) break;
          if (absl::Now() >= next_poll) {
            next_poll = absl::Now() + absl::Milliseconds(20);
            if (c.WaitPersisted(step, absl::ZeroDuration()).ok() && d == absl::InfiniteDuration()) {
              persisted_at = absl::Now();
              break;
            }
          }
        }
        return times;
      };
      auto mean = [](const std::vector<double>& v) {
        double sum = 0;
        for (double x : v) sum += x;
        return v.empty() ? 0 : sum / static_cast<double>(v.size());
      };
      // Quiet, then `persists` times: a snapshot, training until it is
      // persisted, quiet again. The control takes no snapshot and trains
      // `control_window` instead.
      std::vector<double> quiet_steps, persist_steps, stalls, durables, cpus;
      uint64_t step = 1;
      if (s.ok()) {
        std::vector<double> first = train(quiet, step);
        quiet_steps.insert(quiet_steps.end(), first.begin(), first.end());
      }
      for (int i = 0; s.ok() && i < persists; ++i) {
        const double cpu0 = ProcessCpuSeconds(*agent);
        const absl::Time snap = absl::Now();
        std::vector<double> during;
        if (config.control && config.write) {
          absl::Status written;
          std::atomic<bool> done{false};
          std::thread writer([&] {
            written = WriteLikeAPersist(absl::StrCat(dir, "/write-", n), state.bytes());
            done = true;
          });
          during = train(absl::Minutes(20), step, &done);
          writer.join();
          if (!written.ok()) {
            s = written;
            break;
          }
          durables.push_back(absl::ToDoubleSeconds(absl::Now() - snap));
        } else if (config.control) {
          std::atomic<bool> stop{false};
          std::thread spinner;
          if (config.spin) {
            spinner = std::thread([&stop, cpu = spin_cpu] {
              (void)base::SetCallingThreadPriority(base::ThreadPriority::kIdle);
              (void)base::PinCallingThreadToCpus({cpu});
              uint64_t x = 1;
              while (!stop.load(std::memory_order_relaxed)) x = x * 6364136223846793005ull + 1;
              volatile uint64_t sink = x;
              (void)sink;
            });
          }
          during = train(control_window, step);
          stop = true;
          if (spinner.joinable()) spinner.join();
        } else {
          absl::StatusOr<client::SnapshotResult> taken = c.Snapshot(++step);
          if (!taken.ok()) {
            s = taken.status();
            break;
          }
          stalls.push_back(taken->stall_seconds);
          persisted_at = absl::Time();
          during = train(absl::InfiniteDuration(), step);
          if (persisted_at == absl::Time()) {
            s = absl::DeadlineExceededError(absl::StrCat("step ", step, " not persisted within 20 minutes"));
            break;
          }
          durables.push_back(absl::ToDoubleSeconds(persisted_at - snap));
        }
        cpus.push_back(ProcessCpuSeconds(*agent) - cpu0);
        persist_steps.insert(persist_steps.end(), during.begin(), during.end());
        std::vector<double> after = train(quiet, step);
        quiet_steps.insert(quiet_steps.end(), after.begin(), after.end());
      }
      if (s.ok()) {
        cycle.quiet_step_s = mean(quiet_steps);
        cycle.persist_step_s = mean(persist_steps);
        cycle.persist_steps = persist_steps.size();
        cycle.lost_s = (cycle.persist_step_s - cycle.quiet_step_s) * static_cast<double>(persist_steps.size()) /
                       static_cast<double>(persists);
        cycle.stall_s = Median(stalls);
        cycle.durable_s = Median(durables);
        cycle.agent_cpu_s = Median(cpus);
        cycle.last_step = step;
      }
      if (s.ok()) {
        result = cycle;
      } else {
        *why = absl::StrCat(config.Name(), ": ", s.message());
      }
    }
  }  // the client says goodbye before the agent stops
  ::kill(*agent, SIGTERM);
  ::waitpid(*agent, nullptr, 0);
  std::unique_ptr<storage::PosixFileSystem> posix = storage::NewPosixFileSystem();
  absl::StatusOr<objstore::StorageRoot> opened = objstore::OpenStorageRoot(root, posix.get());
  if (opened.ok()) {
    if (result && result->last_step > 1) {
      InspectShard(opened->fs, storage::ShardPath(opened->path, "bench", result->last_step, 0), &*result);
    }
    (void)storage::RemoveTree(opened->fs, opened->path);
  }
  if (!local.empty()) std::system(absl::StrCat("rm -rf '", local, "'").c_str());
  return result;
}

int RunDuringPersist(const base::Args& args, std::ostream& out, std::ostream& err,
                     const std::function<int(const std::string&)>& usage) {
  uint64_t state_mb = 1335, work_kb = 512, quiet_ms = 2000, repeat = 3;
  int persists = 3;
  for (const absl::Status& s :
       {args.ReadUint("state-mb", 1, 65536, &state_mb), args.ReadUint("work-kb", 4, 1 << 20, &work_kb),
        args.ReadUint("quiet-ms", 100, 600'000, &quiet_ms), args.ReadUint("repeat", 1, 100, &repeat),
        args.ReadUint("persists", 1, 100, &persists)}) {
    if (!s.ok()) return usage(std::string(s.message()));
  }
  std::vector<AgentConfig> configs;
  absl::StatusOr<std::vector<int>> allowed = base::AllowedCpus();
  if (!allowed.ok()) return usage(std::string(allowed.status().message()));
  for (absl::string_view part :
       absl::StrSplit(args.Get("configs").value_or("control;spin;write;idle/auto;normal/auto;idle/zstd;normal/zstd"), ';')) {
    AgentConfig config;
    if (part == "control" || part == "spin" || part == "write") {
      config = {"idle", "auto", {}, true, part == "spin", part == "write"};
      configs.push_back(std::move(config));
      continue;
    }
    std::vector<std::string> at = absl::StrSplit(part, absl::MaxSplits('@', 1));
    std::vector<std::string> pc = absl::StrSplit(at[0], '/');
    if (pc.size() != 2 || (pc[0] != "idle" && pc[0] != "low" && pc[0] != "normal") ||
        (pc[1] != "auto" && pc[1] != "zstd" && pc[1] != "none")) {
      return usage(absl::StrCat("--configs must be PRIORITY/COMPRESSION[@CPUS] separated by semicolons (idle, low ",
                                "or normal / auto, zstd or none), got \"", part, "\""));
    }
    config.priority = pc[0];
    config.compression = pc[1];
    if (at.size() == 2) {
      absl::StatusOr<std::vector<int>> cpus = base::ParseCpuList(at[1]);
      absl::Status s = cpus.ok() ? base::CheckCpusAllowed(*cpus, *allowed) : cpus.status();
      if (!s.ok()) return usage(absl::StrCat("--configs \"", part, "\": ", s.message()));
      config.cpus = *std::move(cpus);
    }
    configs.push_back(std::move(config));
  }
  // --root: where the agents' storage roots go (a directory or s3://); the
  // store is checked before any training starts.
  const std::string root_base = std::string(absl::StripSuffix(args.Get("root").value_or(""), "/"));
  if (!root_base.empty()) {
    std::unique_ptr<storage::PosixFileSystem> posix = storage::NewPosixFileSystem();
    absl::StatusOr<objstore::StorageRoot> opened = objstore::OpenStorageRoot(root_base, posix.get());
    if (!opened.ok()) {
      err << "ckptd-bench overhead: --root " << root_base << ": " << opened.status().message() << "\n";
      return base::kExitFailed;
    }
  }
  char tmpl[] = "/tmp/ckptd-overhead-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    err << "ckptd-bench overhead: cannot create a temporary folder\n";
    return base::kExitFailed;
  }
  const std::string dir = tmpl;
  BenchState state(state_mb);
  TrainingWork work(work_kb * 1024 / 16);
  work.Calibrate(absl::Milliseconds(10));
  std::vector<std::vector<PersistCycle>> runs(configs.size());
  const std::pair<double, double> ticks0 = CpuAndStealTicks();
  const std::string load0 = LoadAverage();
  int rc = base::kExitOk;
  int n = 0;
  for (uint64_t round = 0; rc == base::kExitOk && round < repeat; ++round) {
    for (size_t k = 0; k < configs.size(); ++k) {
      const size_t which = round % 2 == 0 ? k : configs.size() - 1 - k;
      std::string why;
      // The control trains as long as the persists took so far.
      std::vector<double> durables;
      for (const std::vector<PersistCycle>& r : runs) {
        for (const PersistCycle& c : r) {
          if (c.durable_s > 0) durables.push_back(c.durable_s);
        }
      }
      const absl::Duration control_window = absl::Seconds(durables.empty() ? 1.5 : Median(durables));
      std::optional<PersistCycle> cycle =
          RunPersistCycle(SelfDir(), dir, root_base, n++, configs[which], state, work,
                          absl::Milliseconds(static_cast<int64_t>(quiet_ms)), persists, control_window, &why);
      if (!cycle) {
        err << "ckptd-bench overhead: " << why << "\n";
        rc = base::kExitFailed;
        break;
      }
      runs[which].push_back(*cycle);
    }
  }
  std::system(absl::StrCat("rm -rf '", dir, "'").c_str());
  if (rc != base::kExitOk) return rc;
  const std::pair<double, double> ticks1 = CpuAndStealTicks();
  const double steal =
      ticks1.first > ticks0.first ? (ticks1.second - ticks0.second) / (ticks1.first - ticks0.first) : 0;
  const std::string load1 = LoadAverage();
  auto median_of = [](const std::vector<PersistCycle>& v, auto get) {
    std::vector<double> x;
    for (const PersistCycle& c : v) x.push_back(get(c));
    return Median(x);
  };
  base::JsonWriter w;
  w.BeginObject();
  w.Field("state_bytes", state.bytes());
  w.Field("cpus", static_cast<uint64_t>(std::thread::hardware_concurrency()));
  w.Field("rounds", repeat);
  w.Field("persists", persists);
  w.Field("steal", steal);
  w.Field("load_start", load0);
  w.Field("load_end", load1);
  w.Key("configs");
  w.BeginArray();
  const bool json = args.Has("json");
  if (!json) {
    out << absl::StrFormat(
        "A 1-thread training loop while ckptd-agent persists %.2f GB of fp32 state, %d CPUs, median of %d rounds\n"
        "of %d persists (host steal %.1f%% of CPU time, load average %s at the start, %s at the end):\n",
        static_cast<double>(state.bytes()) / 1e9, std::thread::hardware_concurrency(), repeat, persists, 100 * steal,
        load0, load1);
    out << absl::StrFormat("%-16s %9s %8s %9s %8s %10s %9s %8s %11s\n", "agent config", "slowdown", "lost s", "step ms",
                           "stall s", "durable s", "agent s", "stored", "raw blocks");
  }
  for (size_t k = 0; k < configs.size(); ++k) {
    const std::vector<PersistCycle>& v = runs[k];
    const double slowdown = median_of(v, [](const PersistCycle& c) { return Slowdown(c); });
    const double quiet_ms_step = 1e3 * median_of(v, [](const PersistCycle& c) { return c.quiet_step_s; });
    const double stall = median_of(v, [](const PersistCycle& c) { return c.stall_s; });
    const double durable = median_of(v, [](const PersistCycle& c) { return c.durable_s; });
    const double cpu = median_of(v, [](const PersistCycle& c) { return c.agent_cpu_s; });
    const double lost = median_of(v, [](const PersistCycle& c) { return c.lost_s; });
    const double stored = median_of(v, [](const PersistCycle& c) { return c.stored_fraction; });
    const double raw_blocks = median_of(v, [](const PersistCycle& c) { return static_cast<double>(c.raw_blocks); });
    const uint64_t blocks = v.empty() ? 0 : v.front().blocks;
    w.BeginObject();
    w.Field("config", configs[k].Name());
    w.Field("priority", configs[k].priority);
    w.Field("compression", configs[k].compression);
    w.Field("agent_cpus", base::FormatCpuList(configs[k].cpus));
    w.Field("slowdown", slowdown);
    w.Field("quiet_step_s", quiet_ms_step / 1e3);
    w.Field("stall_s", stall);
    w.Field("durable_s", durable);
    w.Field("agent_cpu_s", cpu);
    w.Field("lost_s", lost);
    w.Field("stored_fraction", stored);
    w.Field("raw_blocks", raw_blocks);
    w.Field("blocks", blocks);
    w.Key("slowdowns");
    w.BeginArray();
    for (const PersistCycle& c : v) w.Double(Slowdown(c));
    w.EndArray();
    w.Key("durable_s_each");
    w.BeginArray();
    for (const PersistCycle& c : v) w.Double(c.durable_s);
    w.EndArray();
    w.EndObject();
    if (!json) {
      out << absl::StrFormat("%-16s %8.2f%% %8.3f %9.2f %8.3f %10.3f %9.2f %7.1f%% %7.0f/%d\n", configs[k].Name(),
                             100 * slowdown, lost, quiet_ms_step, stall, durable, cpu, 100 * stored, raw_blocks,
                             blocks);
    }
  }
  w.EndArray();
  w.EndObject();
  if (json) out << w.str() << "\n";
  (void)work.sink();
  return base::kExitOk;
}

}  // namespace

int RunOverheadBench(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  absl::StatusOr<base::Args> args = base::Args::Parse(
      argv, {"state-mb", "steps", "step-ms", "every", "repeat", "configs", "work-kb", "quiet-ms", "persists",
             "root"},
      {"json", "help", "during-persist"});
  if (args.ok() && args->Has("help")) {
    out << kOverheadHelp;
    return base::kExitOk;
  }
  auto usage = [&](const std::string& why) {
    err << "ckptd-bench overhead: " << why << "\n" << kOverheadHelp;
    return base::kExitUsage;
  };
  if (!args.ok()) return usage(std::string(args.status().message()));
  if (args->Has("during-persist")) return RunDuringPersist(*args, out, err, usage);
  for (const char* f : {"configs", "work-kb", "quiet-ms", "persists", "root"}) {
    if (args->Has(f)) return usage(absl::StrCat("--", f, " needs --during-persist"));
  }
  // The trainer's ranges (ckptd-demo-trainer --help), checked here so that a
  // bad value is a usage error of the bench rather than N failed runs.
  uint64_t vals[4] = {4, 200, 50, 3};
  struct Range {
    const char* name;
    uint64_t min, max;
  };
  const Range ranges[4] = {
      {"state-mb", 1, 65536}, {"steps", 1, uint64_t{1} << 62}, {"step-ms", 0, 3'600'000}, {"repeat", 1, 100}};
  for (int i = 0; i < 4; ++i) {
    if (absl::Status s = args->ReadUint(ranges[i].name, ranges[i].min, ranges[i].max, &vals[i]); !s.ok()) {
      return usage(std::string(s.message()));
    }
  }
  std::vector<uint64_t> everies;
  for (absl::string_view part : absl::StrSplit(args->Get("every").value_or("1,50"), ',')) {
    uint64_t k = 0;
    if (part.empty() || !std::all_of(part.begin(), part.end(), [](char c) { return absl::ascii_isdigit(c); }) ||
        !absl::SimpleAtoi(part, &k) || k == 0 || k > (uint64_t{1} << 40)) {
      return usage(
          absl::StrCat("--every must be integers in 1..1099511627776 separated by commas, got \"", part, "\""));
    }
    everies.push_back(k);
  }

  char tmpl[] = "/tmp/ckptd-overhead-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    err << "ckptd-bench overhead: cannot create a temporary folder\n";
    return base::kExitFailed;
  }
  const std::string dir = tmpl;
  const std::string bin = SelfDir();
  const std::string socket = dir + "/agent.sock";
  const pid_t agent = ::fork();
  if (agent == 0) {
    const std::string a = bin + "/ckptd-agent", root = dir + "/root";
    ::execl(a.c_str(), a.c_str(), "--storage-root", root.c_str(), "--socket", socket.c_str(), "--keep", "1",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 1000 && ::access(socket.c_str(), F_OK) != 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  int rc = base::kExitOk;
  // Index 0: no checkpoints; then one per --every value.
  std::vector<std::vector<double>> runs(everies.size() + 1);
  for (uint64_t round = 0; rc == base::kExitOk && round < vals[3]; ++round) {
    for (size_t k = 0; k <= everies.size(); ++k) {
      const size_t which = round % 2 == 0 ? k : everies.size() - k;
      const uint64_t every = which == 0 ? 0 : everies[which - 1];
      const std::string cmd = absl::StrCat("'", bin, "/ckptd-demo-trainer' --socket '", socket, "' --job run-", round,
                                           "-", which, " --steps ", vals[1], " --state-mb ", vals[0], " --step-ms ",
                                           vals[2], " --every ", every, " 2>/dev/null");
      std::optional<double> t = RunTrainer(cmd);
      if (!t) {
        err << "ckptd-bench overhead: the trainer failed: " << cmd << "\n";
        rc = base::kExitFailed;
        break;
      }
      runs[which].push_back(*t);
    }
  }
  ::kill(agent, SIGTERM);
  ::waitpid(agent, nullptr, 0);
  std::system(absl::StrCat("rm -rf '", dir, "'").c_str());
  if (rc != base::kExitOk) return rc;
  const double base = Median(runs[0]);
  base::JsonWriter w;
  w.BeginObject();
  w.Field("state_mb", vals[0]);
  w.Field("steps", vals[1]);
  w.Field("step_ms", vals[2]);
  w.Field("rounds", vals[3]);
  w.Field("no_checkpoint_s", base);
  w.Key("every");
  w.BeginArray();
  for (size_t i = 0; i < everies.size(); ++i) {
    const double t = Median(runs[i + 1]);
    w.BeginObject();
    w.Field("steps", everies[i]);
    w.Field("train_s", t);
    w.Field("overhead", base > 0 ? t / base - 1 : 0.0);
    w.EndObject();
    if (!args->Has("json")) {
      out << absl::StrFormat("snapshot every %d steps: %.3f s vs %.3f s without: overhead %.2f%%\n", everies[i], t,
                             base, base > 0 ? 100 * (t / base - 1) : 0.0);
    }
  }
  w.EndArray();
  w.EndObject();
  if (args->Has("json")) out << w.str() << "\n";
  return base::kExitOk;
}

}  // namespace ckptd::bench
