#include "bench/coordinator_bench.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/flags.h"
#include "base/format.h"
#include "base/host_port.h"
#include "base/json.h"
#include "base/random.h"
#include "base/testing/http_get.h"
#include "base/thread_pool.h"
#include "bench/bench_util.h"
#include "ckptd/v1/coordinator.grpc.pb.h"
#ifdef CKPTD_HAVE_ETCD
#include "etcd/etcd_client.h"
#endif
#include "grpcpp/grpcpp.h"
#include "storage/layout.h"
#include "storage/posix_file_system.h"
#include "storage/store.h"

namespace ckptd::bench {

using base::Args;
using base::JsonWriter;
using SteadyClock = std::chrono::steady_clock;
namespace v1 = ::ckptd::v1;

const char kCoordinatorHelp[] =
    "usage: ckptd-bench coordinator [--agents 10000] [--ranks 4096] [--ranks-per-agent 8] [--rate 1]\n"
    "                               [--seconds 30] [--checkpoints 20] [--channels 64]\n"
    "                               [--retain N] [--coordinator-bin PATH] [--dir DIR] [--keep] [--json]\n"
    "                               [--etcd-endpoints H:P,... [--failover]]\n"
    "\n"
    "Starts ckptd-coordinator (default: next to this binary) on a scratch storage\n"
    "root and state folder under DIR (default $TMPDIR or /tmp) and simulates\n"
    "--agents agents (sim-00001, ...) from this process: each registers and keeps\n"
    "a heartbeat stream, sending a heartbeat every 1/--rate seconds (spread evenly\n"
    "over the period) over --channels gRPC connections. The first\n"
    "ranks/ranks-per-agent agents host the ranks of job `bench-job` (world size\n"
    "--ranks) and report them, with their progress, in every heartbeat.\n"
    "\n"
    "Measured:\n"
    "  coordinator_cores  the coordinator's CPU seconds (utime+stime from /proc)\n"
    "                     per wall second over a steady window of --seconds with\n"
    "                     every stream up; target: under one core\n"
    "  heartbeats_per_s   heartbeats answered per second in that window\n"
    "                     (expected: agents x rate)\n"
    "  loadgen_cores      this process's own CPU use in that window\n"
    "  commit_latency_*   for each of --checkpoints steps, with heartbeats going\n"
    "                     on: every hosting agent sends one ReportShard with its\n"
    "                     ranks' shards, all at once; the time from the last\n"
    "                     report sent to the first answer saying the step\n"
    "                     committed (p50, p99, max; nearest rank); target: p99\n"
    "                     under 100 ms\n"
    "  manifest_latency_* the same up to the MANIFEST renamed into place (inotify)\n"
    "  coordinator_commit_*  the coordinator's own ckptd_commit_latency_seconds\n"
    "                     (last report received to manifest durable), per step\n"
    "--retain N is passed to the coordinator as --keep N (default: its own, 2).\n"
    "With --etcd-endpoints the coordinator runs replicated (its state in that etcd,\n"
    "under a prefix of its own) and the bench also reports what it writes there:\n"
    "  etcd_writes_per_s_steady   etcd revisions per second in the steady window\n"
    "  etcd_writes_per_checkpoint revisions per checkpoint, heartbeats going on\n"
    "  etcd_db_bytes              the first member's database size at the end\n"
    "--failover (with --etcd-endpoints) also starts a standby replica, and at the\n"
    "end SIGKILLs the leader while every agent beats it; the agents ask the\n"
    "standby to register them until it answers, register, beat it, and report\n"
    "one more step. Measured from the kill:\n"
    "  failover_serving_s     the standby answered a registration (target <= 5 s)\n"
    "  failover_registered_s  every agent registered with it\n"
    "  failover_commit_s      the next step committed (target <= 10 s)\n"
    "The shard files the coordinator checks at commit (a small real shard per rank\n"
    "and step) are written before anything is timed. Without --keep the scratch\n"
    "folder is removed afterwards. The bench raises its open-file limit to the hard\n"
    "limit (the coordinator inherits it).\n"
    "Ranges: --agents 1..1000000, --ranks 1..1048576, --ranks-per-agent 1..4096,\n"
    "--rate (0, 1000], --seconds (0, 86400], --checkpoints 1..10000, --channels\n"
    "1..4096, --retain 1..1000000.\n";

namespace {

constexpr char kJob[] = "bench-job";

double MsBetween(SteadyClock::time_point from, SteadyClock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// Nearest-rank percentile (p in 0..100) of `v`; 0 for none.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100 * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

struct ProcUsage {
  double cpu_seconds = 0;  // utime + stime
  uint64_t rss_bytes = 0;
};

// From /proc/<pid>/stat; nullopt when the process is gone.
std::optional<ProcUsage> ReadProcUsage(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(f, line)) return std::nullopt;
  // The command name (field 2) may hold spaces; fields after its ')' do not.
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 > line.size()) return std::nullopt;
  const std::vector<std::string> fields = absl::StrSplit(line.substr(close + 2), ' ', absl::SkipEmpty());
  // fields[0] is field 3 (state): utime is field 14, stime 15, rss (pages) 24.
  uint64_t utime = 0, stime = 0, rss = 0;
  if (fields.size() < 22 || !absl::SimpleAtoi(fields[11], &utime) || !absl::SimpleAtoi(fields[12], &stime) ||
      !absl::SimpleAtoi(fields[21], &rss)) {
    return std::nullopt;
  }
  ProcUsage u;
  u.cpu_seconds = static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  u.rss_bytes = rss * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return u;
}

// Raises the soft open-file limit to the hard one; returns the soft limit now.
uint64_t RaiseOpenFileLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    // Not fatal: 10,000 streams over a few dozen channels need few descriptors.
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  return rl.rlim_cur;
}

// ckptd-coordinator as a child process: started, asked where it listens (its
// stderr line), and stopped with SIGTERM. Its stderr is kept (last lines).
class CoordinatorProcess {
 public:
  // Ready once it says it is listening (a replicated one: serving as the
  // leader), or, when `standby` is set, standing by.
  static absl::StatusOr<std::unique_ptr<CoordinatorProcess>> Start(const std::string& bin,
                                                                   const std::vector<std::string>& args,
                                                                   absl::Duration timeout, bool standby = false);
  ~CoordinatorProcess() { (void)Stop(); }  // a failure here was reported by an explicit Stop(), if it matters
  CoordinatorProcess(const CoordinatorProcess&) = delete;
  CoordinatorProcess& operator=(const CoordinatorProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& address() const { return address_; }
  // The port of its /metrics (with --metrics-listen); 0 when it said none.
  int metrics_port() const { return metrics_port_; }

  // SIGTERM, then waits up to 10 s (SIGKILL after that). OK when it exited 0.
  absl::Status Stop();
  // SIGKILL, as a machine's death: reaped at once.
  void Kill();
  // Its last lines on stderr.
  std::string StderrTail() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  CoordinatorProcess(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  void AddLine(std::string line) ABSL_LOCKS_EXCLUDED(mu_);
  void Drain(std::string partial);

  const pid_t pid_;
  const int fd_;
  std::string address_;
  int metrics_port_ = 0;
  std::thread drain_;
  bool stopped_ = false;
  absl::Status exit_;
  absl::Mutex mu_;
  std::deque<std::string> tail_ ABSL_GUARDED_BY(mu_);
};

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return absl::StrCat("wait status ", status);
}

absl::StatusOr<std::unique_ptr<CoordinatorProcess>> CoordinatorProcess::Start(const std::string& bin,
                                                                             const std::vector<std::string>& args,
                                                                             absl::Duration timeout, bool standby) {
  if (::access(bin.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot run ", bin, ": ", std::strerror(errno),
                                                      " (build the ckptd-coordinator target or pass --coordinator-bin)"));
  }
  std::vector<std::string> all = {bin};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (std::string& a : all) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(e)));
  }
  if (pid == 0) {
    // Only async-signal-safe calls until exec.
    ::dup2(fds[1], STDERR_FILENO);
    const int devnull = ::open("/dev/null", O_WRONLY);
    if (devnull >= 0) ::dup2(devnull, STDOUT_FILENO);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive the bench
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  std::unique_ptr<CoordinatorProcess> proc(new CoordinatorProcess(pid, fds[0]));
  const SteadyClock::time_point deadline = SteadyClock::now() + absl::ToChronoNanoseconds(timeout);
  std::string buf;
  while (true) {
    for (size_t nl; (nl = buf.find('\n')) != std::string::npos;) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      // A replicated coordinator says "leading (epoch N), serving on ADDR after ...".
      constexpr std::string_view kServing = "serving on ";
      std::string_view kListening = "listening on ";
      constexpr std::string_view kMetrics = "metrics on http://";
      // A replica that does not lead says "standby on ADDR".
      constexpr std::string_view kStandby = "standby on ";
      size_t at = line.find(kListening);
      if (at == std::string::npos && (at = line.find(kServing)) != std::string::npos) kListening = kServing;
      if (at == std::string::npos && standby && (at = line.find(kStandby)) != std::string::npos) {
        kListening = kStandby;
      }
      proc->AddLine(line);
      if (const size_t m = line.find(kMetrics); m != std::string::npos) {
        const std::string url = line.substr(m + kMetrics.size());  // host:port/metrics
        const size_t colon = url.rfind(':', url.find('/'));
        if (colon != std::string::npos) {
          (void)absl::SimpleAtoi(url.substr(colon + 1, url.find('/') - colon - 1), &proc->metrics_port_);
        }
      }
      if (at != std::string::npos) {
        proc->address_ = line.substr(at + kListening.size());
        proc->address_ = proc->address_.substr(0, proc->address_.find(' '));
        proc->drain_ = std::thread([p = proc.get(), rest = buf] { p->Drain(rest); });
        return proc;
      }
    }
    const int64_t left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
    if (left_ms <= 0) {
      const absl::Status stopped = proc->Stop();
      return absl::DeadlineExceededError(absl::StrCat(bin, " did not say it was listening within ",
                                                      absl::FormatDuration(timeout), " (", stopped.message(),
                                                      "); its stderr:\n", proc->StderrTail()));
    }
    pollfd p{proc->fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (r <= 0) continue;  // timeout or EINTR: the deadline check above decides
    char chunk[4096];
    const ssize_t n = ::read(proc->fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // stderr closed: it exited (or exec failed) before serving.
      if (!buf.empty()) proc->AddLine(buf);
      int status = 0;
      ::waitpid(pid, &status, 0);
      proc->stopped_ = true;
      return absl::UnavailableError(absl::StrCat(bin, " exited before serving (", DescribeWaitStatus(status),
                                                 WIFEXITED(status) && WEXITSTATUS(status) == 127
                                                     ? ", could not be executed"
                                                     : "",
                                                 "); its stderr:\n", proc->StderrTail()));
    }
    buf.append(chunk, static_cast<size_t>(n));
  }
}

void CoordinatorProcess::AddLine(std::string line) {
  absl::MutexLock l(&mu_);
  tail_.push_back(std::move(line));
  while (tail_.size() > 40) tail_.pop_front();
}

void CoordinatorProcess::Drain(std::string partial) {
  char chunk[4096];
  while (true) {
    const ssize_t n = ::read(fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    partial.append(chunk, static_cast<size_t>(n));
    for (size_t nl; (nl = partial.find('\n')) != std::string::npos;) {
      AddLine(partial.substr(0, nl));
      partial.erase(0, nl + 1);
    }
  }
  if (!partial.empty()) AddLine(partial);
}

std::string CoordinatorProcess::StderrTail() {
  absl::MutexLock l(&mu_);
  return absl::StrJoin(tail_, "\n");
}

absl::Status CoordinatorProcess::Stop() {
  if (stopped_) return exit_;
  stopped_ = true;
  ::kill(pid_, SIGTERM);
  int status = 0;
  bool exited = false;
  for (int i = 0; i < 1000; ++i) {
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exited = true;
      break;
    }
    if (r < 0 && errno != EINTR) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (!exited) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    exit_ = absl::DeadlineExceededError("ckptd-coordinator did not stop within 10 s of SIGTERM; killed");
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    exit_ = absl::InternalError(absl::StrCat("ckptd-coordinator stopped with ", DescribeWaitStatus(status)));
  }
  if (drain_.joinable()) drain_.join();  // stderr reaches EOF once it is gone
  ::close(fd_);
  return exit_;
}

void CoordinatorProcess::Kill() {
  if (stopped_) return;
  stopped_ = true;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  if (drain_.joinable()) drain_.join();
  ::close(fd_);
}

using ::ckptd::testing::HttpGet;

// The coordinator's own ckptd_commit_latency_seconds for the bench job (last
// report received to manifest durable): its sum and count, from /metrics.
struct CommitHistogram {
  double sum_seconds = 0;
  uint64_t count = 0;
};
std::optional<CommitHistogram> ScrapeCommitLatency(int metrics_port) {
  if (metrics_port == 0) return std::nullopt;
  const std::string body = HttpGet(metrics_port, "/metrics");
  const std::string sum_prefix = absl::StrCat("ckptd_commit_latency_seconds_sum{job=\"", kJob, "\"} ");
  const std::string count_prefix = absl::StrCat("ckptd_commit_latency_seconds_count{job=\"", kJob, "\"} ");
  std::optional<double> sum;
  std::optional<uint64_t> count;
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    double d = 0;
    uint64_t u = 0;
    if (absl::ConsumePrefix(&line, sum_prefix) && absl::SimpleAtod(line, &d)) sum = d;
    if (absl::ConsumePrefix(&line, count_prefix) && absl::SimpleAtoi(line, &u)) count = u;
  }
  if (!sum || !count) return std::nullopt;
  return CommitHistogram{*sum, *count};
}

// One gRPC connection (channels do not share TCP connections).
struct Connection {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Coordinator::Stub> stub;
};

absl::StatusOr<std::vector<Connection>> Connect(const std::string& address, int count, absl::Duration timeout) {
  std::vector<Connection> conns(count);
  for (int i = 0; i < count; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("ckptd.bench_channel", i);  // distinct arguments: never one shared subchannel
    // What ckptd-agent's link sets.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    conns[i].channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    conns[i].stub = v1::Coordinator::NewStub(conns[i].channel);
  }
  const auto deadline = std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout);
  for (int i = 0; i < count; ++i) {
    if (!conns[i].channel->WaitForConnected(deadline)) {
      return absl::UnavailableError(absl::StrCat("channel ", i, " to ", address, " did not connect within ",
                                                 absl::FormatDuration(timeout)));
    }
  }
  return conns;
}

struct SimAgent {
  std::string node_id;
  std::string session;
  int channel = 0;
  std::vector<v1::RankInfo> ranks;
};

v1::RegisterAgentRequest RegistrationOf(const SimAgent& agent) {
  v1::RegisterAgentRequest req;
  req.set_node_id(agent.node_id);
  req.set_address("ckptd-bench");
  for (const v1::RankInfo& r : agent.ranks) {
    *req.add_ranks() = r;
    req.add_gpus(absl::StrCat("cuda:", r.gpu()));
  }
  return req;
}

// Registers every agent, at most `window` calls in flight; fills sessions.
absl::Status RegisterAll(std::vector<Connection>& conns, std::vector<SimAgent>& agents, int window,
                         absl::Duration timeout) {
  struct Call {
    grpc::ClientContext ctx;
    v1::RegisterAgentRequest req;
    v1::RegisterAgentResponse resp;
  };
  struct State {
    absl::Mutex mu;
    int in_flight ABSL_GUARDED_BY(mu) = 0;
    size_t done ABSL_GUARDED_BY(mu) = 0;
    absl::Status first_error ABSL_GUARDED_BY(mu);
  };
  // Shared with the callbacks, which may still be leaving the lock when the wait ends.
  auto state = std::make_shared<State>();
  State& st = *state;
  std::vector<std::unique_ptr<Call>> calls(agents.size());
  for (size_t i = 0; i < agents.size(); ++i) {
    {
      absl::MutexLock l(&st.mu);
      auto room = [&st, window]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) { return st.in_flight < window; };
      st.mu.Await(absl::Condition(&room));
      ++st.in_flight;
    }
    calls[i] = std::make_unique<Call>();
    Call* c = calls[i].get();
    c->ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
    c->req = RegistrationOf(agents[i]);
    auto on_done = [state, &agents, c, i](grpc::Status s) {
      absl::MutexLock l(&state->mu);
      if (s.ok()) {
        agents[i].session = c->resp.session();
      } else if (state->first_error.ok()) {
        state->first_error =
            absl::UnavailableError(absl::StrCat("RegisterAgent ", agents[i].node_id, ": ", s.error_message()));
      }
      --state->in_flight;
      ++state->done;
    };
    conns[agents[i].channel].stub->async()->RegisterAgent(&c->ctx, &c->req, &c->resp, std::move(on_done));
  }
  absl::MutexLock l(&st.mu);
  auto all_done = [&st, n = agents.size()]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) { return st.done == n; };
  st.mu.Await(absl::Condition(&all_done));
  return st.first_error;
}

// What every heartbeat stream adds to.
struct HeartbeatTotals {
  explicit HeartbeatTotals(int shards) : latency(shards) {}

  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> acked{0};
  std::atomic<uint64_t> unknown{0};     // acks saying the coordinator does not know the session
  std::atomic<uint64_t> skipped{0};     // beats due while the previous one was unanswered
  std::atomic<uint64_t> broken{0};      // streams that ended before the bench stopped them
  std::atomic<uint64_t> first_acks{0};  // streams answered at least once
  std::atomic<bool> recording{false};   // collect ack latencies

  // Ack latencies in ms, sharded by channel to keep each lock cold.
  struct Shard {
    absl::Mutex mu;
    std::vector<float> ms ABSL_GUARDED_BY(mu);
  };
  std::deque<Shard> latency;

  absl::Mutex done_mu;
  size_t done ABSL_GUARDED_BY(done_mu) = 0;  // streams whose OnDone ran
};

// The ack latencies collected so far, which are then forgotten.
std::vector<double> TakeAckLatencies(HeartbeatTotals* totals) {
  std::vector<double> all;
  for (HeartbeatTotals::Shard& s : totals->latency) {
    absl::MutexLock l(&s.mu);
    all.insert(all.end(), s.ms.begin(), s.ms.end());
    s.ms.clear();
  }
  return all;
}

// One simulated agent's heartbeat stream. A scheduler thread calls Beat();
// acks are read as they come. Stop() only after the last Beat() returned.
class HeartbeatStream final : public grpc::ClientBidiReactor<v1::Heartbeat, v1::HeartbeatAck> {
 public:
  HeartbeatStream(const SimAgent& agent, double step_seconds, HeartbeatTotals* totals)
      : totals_(totals), shard_(agent.channel) {
    hb_.set_node_id(agent.node_id);
    hb_.set_session(agent.session);
    for (const v1::RankInfo& r : agent.ranks) {
      *hb_.add_ranks() = r;
      v1::RankProgress* p = hb_.add_progress();
      p->set_job(r.job());
      p->set_rank(r.rank());
      p->set_step_seconds(step_seconds);
    }
  }

  void Start(v1::Coordinator::Stub* stub) {
    stub->async()->Heartbeats(&ctx_, this);
    AddHold();  // Beat() writes from outside the reactor's callbacks
    StartRead(&ack_);
    StartCall();
  }

  // Sends the next heartbeat, unless the previous one is still unanswered.
  void Beat() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock l(&mu_);
      if (stopped_ || broken_) return;
      if (writing_ || awaiting_ack_) {
        totals_->skipped.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      ++beats_;
      for (v1::RankProgress& p : *hb_.mutable_progress()) p.set_step(beats_);  // one training step per beat
      writing_ = true;
      awaiting_ack_ = true;
      sent_at_ = SteadyClock::now();
    }
    totals_->sent.fetch_add(1, std::memory_order_relaxed);
    StartWrite(&hb_);
  }

  void Stop() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock l(&mu_);
      stopped_ = true;
    }
    ctx_.TryCancel();
    RemoveHold();
  }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    writing_ = false;
    if (!ok) MarkBroken();
  }

  void OnReadDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    if (!ok) {
      absl::MutexLock l(&mu_);
      MarkBroken();
      return;
    }
    const SteadyClock::time_point now = SteadyClock::now();
    std::optional<double> latency;
    {
      absl::MutexLock l(&mu_);
      if (awaiting_ack_) latency = MsBetween(sent_at_, now);
      awaiting_ack_ = false;
    }
    if (latency && totals_->recording.load(std::memory_order_relaxed)) {
      HeartbeatTotals::Shard& s = totals_->latency[shard_];
      absl::MutexLock l(&s.mu);
      s.ms.push_back(static_cast<float>(*latency));
    }
    totals_->acked.fetch_add(1, std::memory_order_relaxed);
    if (!ack_.known()) totals_->unknown.fetch_add(1, std::memory_order_relaxed);
    if (!answered_) {
      answered_ = true;
      totals_->first_acks.fetch_add(1, std::memory_order_relaxed);
    }
    ack_.Clear();
    StartRead(&ack_);
  }

  void OnDone(const grpc::Status&) override {
    absl::MutexLock l(&totals_->done_mu);
    ++totals_->done;
  }

 private:
  void MarkBroken() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!broken_ && !stopped_) totals_->broken.fetch_add(1, std::memory_order_relaxed);
    broken_ = true;
  }

  HeartbeatTotals* const totals_;
  const int shard_;
  grpc::ClientContext ctx_;
  v1::Heartbeat hb_;      // written only while no write is in flight
  v1::HeartbeatAck ack_;  // owned by the read in flight
  bool answered_ = false;  // only in OnReadDone, which gRPC never runs concurrently
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool awaiting_ack_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t beats_ ABSL_GUARDED_BY(mu_) = 0;
  SteadyClock::time_point sent_at_ ABSL_GUARDED_BY(mu_);
};

// Beats stream j % n at t0 + j * period / n until `stop`: every stream once a
// period, spread evenly. Sleeps at least 1 ms at a time and then sends what
// fell due, so that the scheduler itself stays cheap.
void RunBeats(const std::vector<std::unique_ptr<HeartbeatStream>>& streams, std::chrono::nanoseconds period,
              const std::atomic<bool>* stop) {
  const size_t n = streams.size();
  const SteadyClock::time_point t0 = SteadyClock::now();
  auto due = [&](uint64_t j) {
    return t0 + std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(period.count()) *
                                                                static_cast<double>(j) / static_cast<double>(n)));
  };
  uint64_t j = 0;
  while (!stop->load()) {
    const SteadyClock::time_point now = SteadyClock::now();
    if (due(j) > now) {
      std::this_thread::sleep_for(std::max<SteadyClock::duration>(due(j) - now, std::chrono::milliseconds(1)));
      continue;
    }
    for (; due(j) <= now && !stop->load(); ++j) streams[j % n]->Beat();
  }
}

// A heartbeat stream per agent over `conns`, and the scheduler that drives
// them, until Stop() (or destruction).
class Beating {
 public:
  Beating(const std::vector<SimAgent>& agents, std::vector<Connection>& conns, double rate_hz, int channels)
      : totals(channels), period(std::chrono::nanoseconds(std::llround(1e9 / rate_hz))) {
    streams_.reserve(agents.size());
    for (const SimAgent& a : agents) {
      streams_.push_back(std::make_unique<HeartbeatStream>(a, 1 / rate_hz, &totals));
      streams_.back()->Start(conns[a.channel].stub.get());
    }
    thread_ = std::thread([this] { RunBeats(streams_, period, &stop_); });
  }
  ~Beating() { Stop(); }
  Beating(const Beating&) = delete;
  Beating& operator=(const Beating&) = delete;

  // Stops the beats and ends every stream; waits for their last callbacks.
  void Stop() {
    if (std::exchange(stopped_, true)) return;
    stop_ = true;
    thread_.join();
    for (auto& st : streams_) st->Stop();
    absl::MutexLock l(&totals.done_mu);
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(totals.done_mu) { return totals.done == streams_.size(); };
    totals.done_mu.Await(absl::Condition(&all));
  }
  size_t size() const { return streams_.size(); }

  HeartbeatTotals totals;
  const std::chrono::nanoseconds period;

 private:
  std::vector<std::unique_ptr<HeartbeatStream>> streams_;
  std::atomic<bool> stop_{false};
  bool stopped_ = false;
  std::thread thread_;
};

// Notes when a MANIFEST is renamed (or created) into one directory, with inotify.
class ManifestWatcher {
 public:
  static absl::StatusOr<std::unique_ptr<ManifestWatcher>> Start(const std::string& dir) {
    const int fd = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (fd < 0) return absl::UnavailableError(absl::StrCat("inotify_init1: ", std::strerror(errno)));
    if (::inotify_add_watch(fd, dir.c_str(), IN_MOVED_TO | IN_CREATE) < 0) {
      const int e = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("inotify_add_watch ", dir, ": ", std::strerror(e)));
    }
    std::unique_ptr<ManifestWatcher> w(new ManifestWatcher(fd));
    w->thread_ = std::thread([p = w.get()] { p->Loop(); });
    return w;
  }
  ~ManifestWatcher() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }

  // When the MANIFEST appeared, waiting up to `timeout` for it.
  std::optional<SteadyClock::time_point> Seen(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    auto seen = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return seen_.has_value(); };
    mu_.AwaitWithTimeout(absl::Condition(&seen), timeout);
    return seen_;
  }

 private:
  explicit ManifestWatcher(int fd) : fd_(fd) {}

  void Loop() ABSL_LOCKS_EXCLUDED(mu_) {
    alignas(inotify_event) char buf[4096];
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = ::read(fd_, buf, sizeof(buf));
      const SteadyClock::time_point now = SteadyClock::now();
      for (ssize_t off = 0; n > 0 && off < n;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(buf + off);
        off += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
        if (ev->len > 0 && storage::kManifestName == ev->name) {
          absl::MutexLock l(&mu_);
          seen_ = now;
          return;
        }
      }
    }
  }

  const int fd_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::optional<SteadyClock::time_point> seen_ ABSL_GUARDED_BY(mu_);
};

// Writes a small real shard for every rank of every step 1..steps before
// anything is timed, so that the coordinator's stat check at commit finds each
// file with the length reported. Returns the ShardRefs, [step - 1][rank].
absl::StatusOr<std::vector<std::vector<v1::ShardRef>>> PrepareShards(storage::CheckpointStore* store,
                                                                     uint32_t world, uint64_t steps) {
  std::vector<uint8_t> payload(256);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 131 + 7);
  storage::TensorSource src;
  src.meta.set_name("bench.state");
  src.meta.set_component(v1::DATA_CURSOR);
  src.meta.set_dtype(v1::BYTES);
  src.meta.add_shape(payload.size());
  src.data = payload.data();
  src.length = payload.size();
  const std::vector<storage::TensorSource> sources = {src};
  storage::ShardWriteOptions o;
  o.encode.compress = false;
  o.direct_io = false;
  o.writes_in_flight = 1;
  base::ThreadPool pool(1);  // one block per shard: encoding is trivial
  std::vector<std::vector<v1::ShardRef>> refs(steps, std::vector<v1::ShardRef>(world));
  // Writers wait on fsync, not on the CPU.
  const uint32_t writers = std::min<uint32_t>(64, world);
  for (uint64_t step = 1; step <= steps; ++step) {
    if (absl::Status s = store->PrepareStep(kJob, step); !s.ok()) return s;
    absl::Mutex mu;
    absl::Status first_error;
    std::vector<std::thread> threads;
    for (uint32_t t = 0; t < writers; ++t) {
      threads.emplace_back([&, t] {
        for (uint32_t rank = t; rank < world; rank += writers) {
          absl::StatusOr<storage::ShardWriteResult> r = store->WriteShard(kJob, step, rank, world, sources, o, &pool);
          if (!r.ok()) {
            absl::MutexLock l(&mu);
            if (first_error.ok()) first_error = r.status();
            return;
          }
          v1::ShardRef& ref = refs[step - 1][rank];
          ref.set_rank(rank);
          ref.set_file(storage::ShardFileName(rank));
          ref.set_file_length(r->file_length);
          ref.set_index_xxh3(r->index_xxh3);
          ref.set_raw_bytes(r->raw_bytes);
          ref.set_stored_bytes(r->stored_bytes);
          ref.set_persist_seconds(0.01);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    if (!first_error.ok()) return first_error;
  }
  return refs;
}

struct CheckpointOutcome {
  bool committed = false;
  double latency_ms = 0;               // last report sent -> first answer saying committed
  std::optional<double> manifest_ms;   // last report sent -> MANIFEST renamed into place
  std::optional<double> coordinator_ms;  // the coordinator's own: last report received -> manifest durable
  double send_ms = 0;                  // first report sent -> last report sent
  std::string error;
};

// Sends every rank's shard report for `step` at once from `senders` threads,
// one batched ReportShard per hosting agent (as agents send them), and times
// the commit.
CheckpointOutcome RunCheckpoint(std::vector<Connection>& conns, const std::vector<SimAgent>& agents,
                                const std::vector<size_t>& host_of_rank, const std::vector<v1::ShardRef>& refs,
                                uint64_t step, const std::string& step_dir, int senders, int metrics_port) {
  CheckpointOutcome out;
  const std::optional<CommitHistogram> before = ScrapeCommitLatency(metrics_port);
  const uint32_t world = static_cast<uint32_t>(refs.size());
  struct Call {
    grpc::ClientContext ctx;
    v1::ReportShardRequest req;
    v1::ReportShardResponse resp;
  };
  // One call per hosting agent carrying its ranks' shards, as agents send them.
  std::vector<std::unique_ptr<Call>> calls;
  std::map<size_t, Call*> by_agent;
  for (uint32_t rank = 0; rank < world; ++rank) {
    Call*& c = by_agent[host_of_rank[rank]];
    if (c == nullptr) {
      calls.push_back(std::make_unique<Call>());
      c = calls.back().get();
      const SimAgent& a = agents[host_of_rank[rank]];
      c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      c->req.set_node_id(a.node_id);
      c->req.set_session(a.session);
    }
    v1::ShardReport* r = c->req.add_batch();
    r->set_job(kJob);
    r->set_step(step);
    r->set_world_size(world);
    *r->mutable_shard() = refs[rank];
    r->set_stall_seconds(0.001);
  }
  std::vector<size_t> call_agent;
  for (const auto& [agent, c] : by_agent) call_agent.push_back(agent);
  const uint32_t ncalls = static_cast<uint32_t>(calls.size());
  struct State {
    absl::Mutex mu;
    uint32_t answered ABSL_GUARDED_BY(mu) = 0;
    std::optional<SteadyClock::time_point> committed_at ABSL_GUARDED_BY(mu);
    std::string first_error ABSL_GUARDED_BY(mu);
  };
  // Shared with the callbacks, which may still be leaving the lock when the wait ends.
  auto state = std::make_shared<State>();
  State& st = *state;
  absl::StatusOr<std::unique_ptr<ManifestWatcher>> watcher = ManifestWatcher::Start(step_dir);

  std::vector<SteadyClock::time_point> first(senders), last(senders);
  std::vector<std::thread> threads;
  for (int t = 0; t < senders; ++t) {
    threads.emplace_back([&, t] {
      const uint32_t begin = static_cast<uint32_t>(uint64_t{ncalls} * t / senders);
      const uint32_t end = static_cast<uint32_t>(uint64_t{ncalls} * (t + 1) / senders);
      first[t] = SteadyClock::now();
      for (uint32_t i = begin; i < end; ++i) {
        Call* c = calls[i].get();
        conns[agents[call_agent[i]].channel].stub->async()->ReportShard(
            &c->ctx, &c->req, &c->resp, [state, c](grpc::Status s) {
              const SteadyClock::time_point now = SteadyClock::now();
              absl::MutexLock l(&state->mu);
              ++state->answered;
              bool committed = false;
              std::string bad;
              for (const v1::ShardResult& r : c->resp.batch_results()) {
                committed |= r.committed();
                if (r.code() != 0 && bad.empty()) bad = r.message();
              }
              if (!s.ok() || !bad.empty()) {
                if (state->first_error.empty()) {
                  state->first_error =
                      absl::StrCat("ReportShard of node ", c->req.node_id(), ": ", s.ok() ? bad : s.error_message());
                }
              } else if (committed && !state->committed_at) {
                state->committed_at = now;
              }
            });
      }
      last[t] = SteadyClock::now();
    });
  }
  for (std::thread& t : threads) t.join();
  const SteadyClock::time_point sent_first = *std::min_element(first.begin(), first.end());
  const SteadyClock::time_point sent_last = *std::max_element(last.begin(), last.end());
  out.send_ms = MsBetween(sent_first, sent_last);
  {
    // Every call has a deadline, so every callback runs.
    absl::MutexLock l(&st.mu);
    auto all = [&st, ncalls]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) { return st.answered == ncalls; };
    st.mu.Await(absl::Condition(&all));
    if (st.committed_at) {
      out.committed = true;
      out.latency_ms = MsBetween(sent_last, *st.committed_at);
    } else {
      out.error = st.first_error.empty() ? "every report was accepted but none said the step committed"
                                         : st.first_error;
    }
  }
  if (watcher.ok() && out.committed) {
    if (std::optional<SteadyClock::time_point> seen = (*watcher)->Seen(absl::Seconds(1))) {
      out.manifest_ms = MsBetween(sent_last, *seen);
    }
  }
  // The coordinator observes the commit before it answers.
  const std::optional<CommitHistogram> after = ScrapeCommitLatency(metrics_port);
  if (before && after && after->count == before->count + 1) {
    out.coordinator_ms = (after->sum_seconds - before->sum_seconds) * 1000;
  }
  return out;
}

// What one run measured.
// With --etcd-endpoints: the flags that make the coordinator replicated
// (a prefix of its own, the operator token it needs in a file), and etcd's
// revision, which grows by one with every write.
class EtcdWatch {
 public:
  absl::StatusOr<std::vector<std::string>> Start(const std::string& endpoints, const std::string& dir) {
#ifdef CKPTD_HAVE_ETCD
    etcd::EtcdOptions o;
    o.endpoints = {endpoints};
    absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> c = etcd::EtcdClient::Connect(o);
    if (!c.ok()) return c.status();
    client_ = std::move(*c);
    absl::StatusOr<std::string> suffix = base::RandomHex(8);
    absl::StatusOr<std::string> token = base::RandomHex(32);
    if (!suffix.ok() || !token.ok()) return absl::InternalError("no random bytes");
    prefix_ = absl::StrCat("/ckptd-bench/", *suffix);
    const std::string token_file = storage::JoinPath(dir, "operator-token");
    {
      std::ofstream out(token_file);
      out << *token << "\n";
    }
    ::chmod(token_file.c_str(), 0600);
    return std::vector<std::string>{"--etcd-endpoints", endpoints, "--etcd-prefix", prefix_,
                                    "--operator-token-file", token_file};
#else
    return absl::FailedPreconditionError("--etcd-endpoints: this build has no etcd client");
#endif
  }
  // etcd's revision now; none without etcd (or when it does not answer).
  std::optional<int64_t> Revision() {
#ifdef CKPTD_HAVE_ETCD
    if (client_ == nullptr) return std::nullopt;
    etcd::pb::RangeRequest r;
    r.set_key(prefix_);
    r.set_count_only(true);
    absl::StatusOr<etcd::pb::RangeResponse> got = client_->Range(r);
    if (got.ok()) return got->header().revision();
#endif
    return std::nullopt;
  }
  std::optional<int64_t> DbBytes() {
#ifdef CKPTD_HAVE_ETCD
    if (client_ == nullptr) return std::nullopt;
    absl::StatusOr<etcd::pb::StatusResponse> s = client_->MemberStatus(0);
    if (s.ok()) return s->dbsize();
#endif
    return std::nullopt;
  }

 private:
#ifdef CKPTD_HAVE_ETCD
  std::unique_ptr<etcd::EtcdClient> client_;
  std::string prefix_;
#endif
};

struct Results {
  uint64_t rank_agents = 0;
  uint64_t nofile_limit = 0;
  double prepare_s = 0;
  double register_s = 0;
  // The steady window (heartbeats only).
  double window_s = 0;
  double sent_per_s = 0;
  double heartbeats_per_s = 0;
  std::vector<double> ack_ms;
  uint64_t skipped = 0;
  double coordinator_cores = 0;
  uint64_t coordinator_rss = 0;
  double loadgen_cores = 0;
  // The checkpoints (heartbeats going on).
  std::vector<CheckpointOutcome> outcomes;
  uint64_t manifests_verified = 0;
  double checkpointing_cores = 0;
  std::vector<double> checkpointing_ack_ms;
  // At the end.
  uint64_t unknown = 0;
  uint64_t broken = 0;
  uint64_t agents_alive = 0;
  uint64_t coordinator_committed = 0;  // as GetClusterStatus counts them
  // With --etcd-endpoints: what the coordinator wrote to etcd.
  std::optional<double> etcd_writes_per_s_steady;
  std::optional<double> etcd_writes_per_checkpoint;
  std::optional<int64_t> etcd_db_bytes;
  // With --failover: from the leader's SIGKILL to the standby answering a
  // registration, to every agent registered with it, and to the next step
  // committed (all agents beating the new leader meanwhile).
  std::optional<double> failover_serving_s;
  std::optional<double> failover_registered_s;
  std::optional<double> failover_commit_s;
  std::string failover_error;
};

struct Flags {
  uint64_t agents = 10'000;
  uint64_t ranks = 4096;
  uint64_t ranks_per_agent = 8;
  double rate_hz = 1;
  double seconds = 30;
  uint64_t checkpoints = 20;
  uint64_t channels = 64;
  uint64_t retain = 0;  // the coordinator's --keep; 0: its default
  std::string coordinator_bin;
  std::string etcd_endpoints;  // replicated coordinator: its etcd
  bool failover = false;       // a standby, and the leader killed at the end
  std::string dir;
};

// 8. With --failover: the leader dies (SIGKILL) while every agent beats it;
// the agents ask the standby to register them until it answers (as agents
// given both addresses do), register with it, beat it, and report the next
// step. `old` are the streams to the leader.
void RunFailover(const Flags& f, CoordinatorProcess& leader, CoordinatorProcess& standby, Beating& old,
                 std::vector<SimAgent>& agents, const std::vector<size_t>& host_of_rank,
                 const std::vector<v1::ShardRef>& refs, const std::string& root, int senders, Results* r) {
  const uint64_t step = f.checkpoints + 1;
  const SteadyClock::time_point kill = SteadyClock::now();
  leader.Kill();
  old.Stop();  // its streams broke with it
  auto since_kill = [kill] { return MsBetween(kill, SteadyClock::now()) / 1000; };
  absl::StatusOr<std::vector<Connection>> conns =
      Connect(standby.address(), static_cast<int>(f.channels), absl::Seconds(30));
  if (!conns.ok()) {
    r->failover_error = absl::StrCat("connecting to the standby: ", conns.status().message());
    return;
  }
  const SimAgent& first = agents.front();
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::RegisterAgentResponse resp;
    const grpc::Status s = (*conns)[first.channel].stub->RegisterAgent(&ctx, RegistrationOf(first), &resp);
    if (s.ok()) break;
    // A standby answers UNAVAILABLE; calls in flight as it turns leader
    // (its standby server stops) end CANCELLED.
    const bool wait = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                      s.error_code() == grpc::StatusCode::CANCELLED;
    if (!wait || since_kill() > 60) {
      r->failover_error = absl::StrFormat("the standby did not serve within %.0f s of the leader's death: %s",
                                          since_kill(), s.error_message());
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r->failover_serving_s = since_kill();
  if (absl::Status s = RegisterAll(*conns, agents, 256, absl::Seconds(60)); !s.ok()) {
    r->failover_error = absl::StrCat("registering with the new leader: ", s.message());
    return;
  }
  r->failover_registered_s = since_kill();
  Beating beating(agents, *conns, f.rate_hz, static_cast<int>(f.channels));
  const double before_ckpt_s = since_kill();
  const CheckpointOutcome o = RunCheckpoint(*conns, agents, host_of_rank, refs, step,
                                            storage::StepDir(root, kJob, step), senders, standby.metrics_port());
  if (!o.committed) {
    r->failover_error = absl::StrCat("step ", step, " at the new leader: ", o.error);
    return;
  }
  r->failover_commit_s = before_ckpt_s + (o.send_ms + o.latency_ms) / 1000;
  beating.Stop();
  if (const uint64_t broken = beating.totals.broken.load(); broken > 0) {
    r->failover_error = absl::StrCat(broken, " heartbeat streams to the new leader ended early");
  }
}

// Writes `r` as JSON or as lines for people, and the errors to `err`.
// Returns whether every checkpoint committed and every stream lasted.
bool WriteResults(const Flags& f, const Results& r, bool json, std::ostream& out, std::ostream& err) {
  std::vector<double> latency_ms, manifest_ms, coordinator_ms, send_ms;
  std::vector<std::string> errors;
  for (size_t i = 0; i < r.outcomes.size(); ++i) {
    const CheckpointOutcome& o = r.outcomes[i];
    send_ms.push_back(o.send_ms);
    if (o.committed) latency_ms.push_back(o.latency_ms);
    if (o.manifest_ms) manifest_ms.push_back(*o.manifest_ms);
    if (o.coordinator_ms) coordinator_ms.push_back(*o.coordinator_ms);
    if (!o.error.empty()) errors.push_back(absl::StrCat("step ", i + 1, ": ", o.error));
  }
  const bool all_committed = latency_ms.size() == f.checkpoints && r.manifests_verified == f.checkpoints;
  const double p50 = Percentile(latency_ms, 50), p99 = Percentile(latency_ms, 99), pmax = Percentile(latency_ms, 100);
  const bool cores_met = r.coordinator_cores < 1;
  const bool latency_met = all_committed && p99 < 100;
  const unsigned cpus = std::thread::hardware_concurrency();
  const double expected_per_s = static_cast<double>(f.agents) * f.rate_hz;

  JsonWriter w;
  w.BeginObject();
  w.Field("agents", f.agents);
  w.Field("ranks", f.ranks);
  w.Field("ranks_per_agent", f.ranks_per_agent);
  w.Field("rank_agents", r.rank_agents);
  w.Field("rate_hz", f.rate_hz);
  w.Field("channels", f.channels);
  w.Field("cpus", cpus);
  w.Field("nofile_limit", r.nofile_limit);
  w.Field("prepare_s", r.prepare_s);
  w.Field("register_s", r.register_s);
  w.Field("window_s", r.window_s);
  w.Field("heartbeats_expected_per_s", expected_per_s);
  w.Field("heartbeats_sent_per_s", r.sent_per_s);
  w.Field("heartbeats_per_s", r.heartbeats_per_s);
  w.Field("heartbeat_ack_p50_ms", Percentile(r.ack_ms, 50));
  w.Field("heartbeat_ack_p99_ms", Percentile(r.ack_ms, 99));
  w.Field("heartbeat_ack_max_ms", Percentile(r.ack_ms, 100));
  w.Field("heartbeats_skipped", r.skipped);
  w.Field("acks_unknown", r.unknown);
  w.Field("streams_broken", r.broken);
  w.Field("coordinator_cores", r.coordinator_cores);
  w.Field("coordinator_rss_bytes", r.coordinator_rss);
  w.Field("loadgen_cores", r.loadgen_cores);
  w.Field("coordinator_cores_checkpointing", r.checkpointing_cores);
  w.Field("heartbeat_ack_checkpointing_p99_ms", Percentile(r.checkpointing_ack_ms, 99));
  w.Field("heartbeat_ack_checkpointing_max_ms", Percentile(r.checkpointing_ack_ms, 100));
  w.Field("checkpoints", f.checkpoints);
  w.Field("checkpoints_committed", static_cast<uint64_t>(latency_ms.size()));
  w.Field("coordinator_checkpoints_committed", r.coordinator_committed);
  w.Field("manifests_verified", r.manifests_verified);
  if (r.etcd_writes_per_s_steady) w.Field("etcd_writes_per_s_steady", *r.etcd_writes_per_s_steady);
  if (r.etcd_writes_per_checkpoint) w.Field("etcd_writes_per_checkpoint", *r.etcd_writes_per_checkpoint);
  if (r.etcd_db_bytes) w.Field("etcd_db_bytes", *r.etcd_db_bytes);
  w.Field("all_committed", all_committed);
  w.Field("report_send_p50_ms", Percentile(send_ms, 50));
  w.Field("report_send_max_ms", Percentile(send_ms, 100));
  w.Field("commit_latency_p50_ms", p50);
  w.Field("commit_latency_p99_ms", p99);
  w.Field("commit_latency_max_ms", pmax);
  w.Key("commit_latency_ms");
  w.BeginArray();
  for (double v : latency_ms) w.Double(v);
  w.EndArray();
  w.Key("manifest_latency_ms");
  w.BeginArray();
  for (double v : manifest_ms) w.Double(v);
  w.EndArray();
  if (!manifest_ms.empty()) {
    w.Field("manifest_latency_p50_ms", Percentile(manifest_ms, 50));
    w.Field("manifest_latency_p99_ms", Percentile(manifest_ms, 99));
    w.Field("manifest_latency_max_ms", Percentile(manifest_ms, 100));
  }
  if (!coordinator_ms.empty()) {
    w.Field("coordinator_commit_p50_ms", Percentile(coordinator_ms, 50));
    w.Field("coordinator_commit_p99_ms", Percentile(coordinator_ms, 99));
    w.Field("coordinator_commit_max_ms", Percentile(coordinator_ms, 100));
  }
  w.Field("agents_alive", r.agents_alive);
  w.Field("cores_target_met", cores_met);
  w.Field("latency_target_met", latency_met);
  w.Field("manifest_latency_target_met", all_committed && !manifest_ms.empty() && Percentile(manifest_ms, 99) < 100);
  if (r.failover_serving_s) w.Field("failover_serving_s", *r.failover_serving_s);
  if (r.failover_registered_s) w.Field("failover_registered_s", *r.failover_registered_s);
  if (r.failover_commit_s) w.Field("failover_commit_s", *r.failover_commit_s);
  if (f.failover) {
    w.Field("failover_target_met", r.failover_serving_s && *r.failover_serving_s <= 5 && r.failover_commit_s &&
                                       *r.failover_commit_s <= 10);
  }
  if (!r.failover_error.empty()) errors.push_back(absl::StrCat("failover: ", r.failover_error));
  if (!errors.empty()) w.Field("first_error", errors.front());
  w.EndObject();
  if (json) {
    out << w.str() << "\n";
  } else {
    out << absl::StrFormat("coordinator: %d agents at %g Hz over %d channels; job of %d ranks on %d agents\n",
                           f.agents, f.rate_hz, f.channels, f.ranks, r.rank_agents);
    out << absl::StrFormat(
        "  heartbeats   %.0f/s answered (expected %.0f/s) over %.1f s; ack p50 %.2f ms, p99 %.2f ms; "
        "%d skipped, %d unknown, %d streams broken\n",
        r.heartbeats_per_s, expected_per_s, r.window_s, Percentile(r.ack_ms, 50), Percentile(r.ack_ms, 99),
        r.skipped, r.unknown, r.broken);
    out << absl::StrFormat("  coordinator  %.3f cores (target < 1: %s), RSS %s; %.3f cores while checkpointing\n",
                           r.coordinator_cores, cores_met ? "met" : "NOT met", base::HumanBytes(r.coordinator_rss),
                           r.checkpointing_cores);
    out << absl::StrFormat("  load gen     %.3f cores of the %d on this machine\n", r.loadgen_cores, cpus);
    out << absl::StrFormat(
        "  commit       last report -> committed answer: p50 %.1f ms, p99 %.1f ms, max %.1f ms over %d/%d "
        "checkpoints (target p99 < 100 ms: %s)\n",
        p50, p99, pmax, latency_ms.size(), f.checkpoints, latency_met ? "met" : "NOT met");
    if (!manifest_ms.empty()) {
      out << absl::StrFormat("               last report -> MANIFEST in place: p50 %.1f ms, p99 %.1f ms\n",
                             Percentile(manifest_ms, 50), Percentile(manifest_ms, 99));
    }
    if (!coordinator_ms.empty()) {
      out << absl::StrFormat(
          "               the coordinator's own (last report received -> manifest durable): p50 %.1f ms, "
          "p99 %.1f ms\n",
          Percentile(coordinator_ms, 50), Percentile(coordinator_ms, 99));
    }
    out << absl::StrFormat("               %d reports sent in %.1f ms (p50); %d agents alive at the end\n",
                           f.ranks, Percentile(send_ms, 50), r.agents_alive);
    out << absl::StrFormat("               heartbeat acks while checkpointing: p99 %.2f ms, max %.1f ms\n",
                           Percentile(r.checkpointing_ack_ms, 99), Percentile(r.checkpointing_ack_ms, 100));
    if (r.etcd_writes_per_checkpoint) {
      out << absl::StrFormat("  etcd         %.2f writes/s between checkpoints, %.1f per checkpoint, database %s\n",
                             r.etcd_writes_per_s_steady.value_or(0), *r.etcd_writes_per_checkpoint,
                             base::HumanBytes(static_cast<uint64_t>(r.etcd_db_bytes.value_or(0))));
    }
    if (f.failover) {
      auto secs = [](const std::optional<double>& v) {
        return v ? absl::StrFormat("%.2f s", *v) : std::string("never");
      };
      out << absl::StrFormat(
          "  failover     leader SIGKILLed: the standby served after %s (target <= 5 s), all %d agents "
          "registered with it after %s, the next step committed after %s (target <= 10 s)\n",
          secs(r.failover_serving_s), f.agents, secs(r.failover_registered_s), secs(r.failover_commit_s));
    }
  }
  for (const std::string& e : errors) err << "ckptd-bench coordinator: " << e << "\n";
  return all_committed && r.broken == 0 && (!f.failover || (r.failover_commit_s && r.failover_error.empty()));
}

}  // namespace

int RunCoordinatorBench(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  absl::StatusOr<Args> args = Args::Parse(argv,
                                          {"agents", "ranks", "ranks-per-agent", "rate", "seconds", "checkpoints",
                                           "channels", "coordinator-bin", "dir", "retain", "etcd-endpoints"},
                                          {"json", "keep", "help", "failover"});
  if (args.ok() && args->Has("help")) {
    out << kCoordinatorHelp;
    return base::kExitOk;
  }
  auto usage = [&](const std::string& why) {
    err << "ckptd-bench coordinator: " << why << "\n" << kCoordinatorHelp;
    return base::kExitUsage;
  };
  if (!args.ok()) return usage(std::string(args.status().message()));
  if (!args->positional().empty()) return usage(absl::StrCat("unexpected argument \"", args->positional()[0], "\""));
  Flags f;
  struct UintFlag {
    const char* name;
    uint64_t* value;
    uint64_t max;
  };
  for (const UintFlag& u : {UintFlag{"agents", &f.agents, 1'000'000}, UintFlag{"ranks", &f.ranks, 1u << 20},
                            UintFlag{"ranks-per-agent", &f.ranks_per_agent, 4096},
                            UintFlag{"checkpoints", &f.checkpoints, 10'000}, UintFlag{"channels", &f.channels, 4096},
                            UintFlag{"retain", &f.retain, 1'000'000}}) {
    absl::StatusOr<std::optional<uint64_t>> v = args->GetUint(u.name);
    if (!v.ok()) return usage(std::string(v.status().message()));
    if (!*v) continue;
    if (**v == 0 || **v > u.max) return usage(absl::StrCat("--", u.name, " must be 1..", u.max));
    *u.value = **v;
  }
  for (auto [name, value] : {std::pair<const char*, double*>{"rate", &f.rate_hz}, {"seconds", &f.seconds}}) {
    std::optional<std::string> v = args->Get(name);
    if (!v) continue;
    if (!absl::SimpleAtod(*v, value) || !std::isfinite(*value) || *value <= 0) {
      return usage(absl::StrCat("--", name, ": \"", *v, "\" is not a positive number"));
    }
  }
  if (f.rate_hz > 1000) return usage("--rate must be at most 1000 (heartbeats per second per agent)");
  // Held as nanoseconds in 64 bits further on: a day is plenty.
  if (f.seconds > 86400) {
    return usage(absl::StrCat("--seconds must be at most 86400, got \"", *args->Get("seconds"), "\""));
  }
  const uint64_t rank_agents = (f.ranks + f.ranks_per_agent - 1) / f.ranks_per_agent;
  if (rank_agents > f.agents) {
    return usage(absl::StrCat("--ranks ", f.ranks, " at ", f.ranks_per_agent, " per agent need ", rank_agents,
                              " agents; --agents is ", f.agents));
  }
  f.channels = std::min(f.channels, f.agents);
  f.coordinator_bin = args->Get("coordinator-bin").value_or(SelfDir() + "/ckptd-coordinator");
  f.etcd_endpoints = args->Get("etcd-endpoints").value_or("");
  f.failover = args->Has("failover");
  if (f.failover && f.etcd_endpoints.empty()) return usage("--failover needs --etcd-endpoints (replicas elect a leader in etcd)");
  const char* tmpdir = std::getenv("TMPDIR");
  f.dir = args->Get("dir").value_or(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp");
  const bool json = args->Has("json");
  const uint32_t world = static_cast<uint32_t>(f.ranks);
  auto fail = [&](const std::string& what) {
    err << "ckptd-bench coordinator: " << what << "\n";
    return base::kExitFailed;
  };

  Results r;
  r.rank_agents = rank_agents;
  r.nofile_limit = RaiseOpenFileLimit();
  std::string scratch = storage::JoinPath(f.dir, "ckptd-coordbench-XXXXXX");
  if (::mkdtemp(scratch.data()) == nullptr) {
    return fail(absl::StrCat("cannot create a scratch folder under ", f.dir, ": ", std::strerror(errno)));
  }
  absl::Cleanup remove_scratch = [&] {
    if (args->Has("keep")) return;
    std::error_code ec;
    std::filesystem::remove_all(scratch, ec);  // best effort: a leftover temp folder is harmless
  };
  const std::string root = storage::JoinPath(scratch, "root");
  const std::string state_dir = storage::JoinPath(scratch, "state");
  std::unique_ptr<storage::PosixFileSystem> fs = storage::NewPosixFileSystem();
  storage::CheckpointStore store(fs.get(), root);
  if (absl::Status s = storage::CreateDirs(fs.get(), root); !s.ok()) return fail(std::string(s.message()));
  if (absl::Status s = storage::CreateDirs(fs.get(), state_dir); !s.ok()) return fail(std::string(s.message()));

  // 1. Shard files, untimed.
  const SteadyClock::time_point prep0 = SteadyClock::now();
  absl::StatusOr<std::vector<std::vector<v1::ShardRef>>> refs =
      PrepareShards(&store, world, f.checkpoints + (f.failover ? 1 : 0));
  if (!refs.ok()) return fail(absl::StrCat("writing the shard files: ", refs.status().message()));
  r.prepare_s = MsBetween(prep0, SteadyClock::now()) / 1000;

  // 2. The coordinator.
  const int64_t interval_ms = std::max<int64_t>(1, std::llround(1000 / f.rate_hz));
  const int64_t lost_ms = std::max<int64_t>(5000, 5 * interval_ms);
  std::vector<std::string> coordinator_args = {
      "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--storage-root", root,
      "--heartbeat-interval", absl::StrCat(interval_ms, "ms"), "--node-lost-after", absl::StrCat(lost_ms, "ms"),
      // The simulated agents present no node credential (checking one is a
      // comparison per call, nothing a load test needs to measure).
      "--insecure-agents"};
  EtcdWatch etcd_watch;
  if (f.etcd_endpoints.empty()) {
    coordinator_args.insert(coordinator_args.end(), {"--state-dir", state_dir});
  } else {
    absl::StatusOr<std::vector<std::string>> replicated = etcd_watch.Start(f.etcd_endpoints, state_dir);
    if (!replicated.ok()) return fail(std::string(replicated.status().message()));
    coordinator_args.insert(coordinator_args.end(), replicated->begin(), replicated->end());
  }
  if (f.retain > 0) coordinator_args.insert(coordinator_args.end(), {"--keep", absl::StrCat(f.retain)});
  absl::StatusOr<std::unique_ptr<CoordinatorProcess>> coordinator =
      CoordinatorProcess::Start(f.coordinator_bin, coordinator_args, absl::Seconds(30));
  if (!coordinator.ok()) return fail(std::string(coordinator.status().message()));
  CoordinatorProcess& coord = **coordinator;

  // 3. Agents: connect, register.
  absl::StatusOr<std::vector<Connection>> conns =
      Connect(coord.address(), static_cast<int>(f.channels), absl::Seconds(30));
  if (!conns.ok()) return fail(std::string(conns.status().message()));
  std::vector<SimAgent> agents(f.agents);
  std::vector<size_t> host_of_rank(world);
  for (size_t i = 0; i < agents.size(); ++i) {
    agents[i].node_id = absl::StrFormat("sim-%05d", i + 1);
    agents[i].channel = static_cast<int>(i % f.channels);
  }
  for (uint32_t rank = 0; rank < world; ++rank) {
    const size_t a = rank / f.ranks_per_agent;
    v1::RankInfo info;
    info.set_job(kJob);
    info.set_rank(rank);
    info.set_world_size(world);
    info.set_pid(static_cast<int32_t>(100'000 + rank));
    info.set_gpu(static_cast<int32_t>(rank % f.ranks_per_agent));
    agents[a].ranks.push_back(info);
    host_of_rank[rank] = a;
  }
  const SteadyClock::time_point reg0 = SteadyClock::now();
  if (absl::Status s = RegisterAll(*conns, agents, 256, absl::Seconds(60)); !s.ok()) {
    return fail(absl::StrCat(s.message(), "\ncoordinator stderr:\n", coord.StderrTail()));
  }
  r.register_s = MsBetween(reg0, SteadyClock::now()) / 1000;

  // With --failover, a standby: it waits for the leader's lease to lapse.
  std::unique_ptr<CoordinatorProcess> standby;
  if (f.failover) {
    const int port = base::FreeLoopbackPort();
    if (port == 0) return fail("no free port on 127.0.0.1 for the standby");
    std::vector<std::string> standby_args = coordinator_args;
    standby_args[1] = absl::StrCat("127.0.0.1:", port);  // --listen
    absl::StatusOr<std::unique_ptr<CoordinatorProcess>> started =
        CoordinatorProcess::Start(f.coordinator_bin, standby_args, absl::Seconds(30), /*standby=*/true);
    if (!started.ok()) return fail(absl::StrCat("the standby: ", started.status().message()));
    standby = *std::move(started);
  }

  // 4. Heartbeat streams, and the scheduler that drives them (stopped on
  // every path out).
  Beating beating(agents, *conns, f.rate_hz, static_cast<int>(f.channels));
  HeartbeatTotals& totals = beating.totals;
  const std::chrono::nanoseconds period = beating.period;

  // Warm-up: every stream answered once, then one more period.
  const SteadyClock::time_point warm0 = SteadyClock::now();
  const auto warm_limit = std::max<SteadyClock::duration>(std::chrono::seconds(30), 10 * period);
  while (totals.first_acks.load() < agents.size() && SteadyClock::now() - warm0 < warm_limit &&
         totals.broken.load() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (totals.first_acks.load() < agents.size()) {
    return fail(absl::StrCat("only ", totals.first_acks.load(), " of ", agents.size(),
                             " heartbeat streams were answered within ",
                             std::chrono::duration_cast<std::chrono::seconds>(warm_limit).count(), " s (",
                             totals.broken.load(), " ended early)\ncoordinator stderr:\n", coord.StderrTail()));
  }
  std::this_thread::sleep_for(period);

  // 5. Steady window: heartbeats only.
  const std::optional<int64_t> rev0 = etcd_watch.Revision();
  const uint64_t acked0 = totals.acked.load(), sent0 = totals.sent.load(), skipped0 = totals.skipped.load();
  const std::optional<ProcUsage> coord0 = ReadProcUsage(coord.pid());
  const std::optional<ProcUsage> self0 = ReadProcUsage(::getpid());
  const SteadyClock::time_point w0 = SteadyClock::now();
  totals.recording = true;
  std::this_thread::sleep_for(std::chrono::nanoseconds(std::llround(f.seconds * 1e9)));
  totals.recording = false;
  const SteadyClock::time_point w1 = SteadyClock::now();
  const std::optional<int64_t> rev1 = etcd_watch.Revision();
  const std::optional<ProcUsage> coord1 = ReadProcUsage(coord.pid());
  const std::optional<ProcUsage> self1 = ReadProcUsage(::getpid());
  const uint64_t acked1 = totals.acked.load(), sent1 = totals.sent.load(), skipped1 = totals.skipped.load();
  if (!coord0 || !coord1) {
    return fail(absl::StrCat("cannot read /proc/", coord.pid(), "/stat (did the coordinator exit?)\n",
                             coord.StderrTail()));
  }
  r.window_s = MsBetween(w0, w1) / 1000;
  r.coordinator_cores = (coord1->cpu_seconds - coord0->cpu_seconds) / r.window_s;
  r.coordinator_rss = coord1->rss_bytes;
  r.loadgen_cores = self0 && self1 ? (self1->cpu_seconds - self0->cpu_seconds) / r.window_s : 0;
  r.heartbeats_per_s = static_cast<double>(acked1 - acked0) / r.window_s;
  r.sent_per_s = static_cast<double>(sent1 - sent0) / r.window_s;
  r.skipped = skipped1 - skipped0;
  r.ack_ms = TakeAckLatencies(&totals);
  if (rev0 && rev1) r.etcd_writes_per_s_steady = static_cast<double>(*rev1 - *rev0) / r.window_s;

  // 6. Checkpoints, with the heartbeats going on.
  const std::optional<int64_t> rev2 = etcd_watch.Revision();
  const int senders = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  const std::optional<ProcUsage> ckpt_cpu0 = ReadProcUsage(coord.pid());
  const SteadyClock::time_point c0 = SteadyClock::now();
  totals.recording = true;
  for (uint64_t step = 1; step <= f.checkpoints; ++step) {
    CheckpointOutcome o = RunCheckpoint(*conns, agents, host_of_rank, (*refs)[step - 1], step,
                                        storage::StepDir(root, kJob, step), senders, coord.metrics_port());
    // Retention keeps at least the newest step, which this one is now.
    absl::StatusOr<v1::StepManifest> m = store.ReadManifest(kJob, step);
    if (m.ok() && m->world_size() == world && m->shards_size() == static_cast<int>(world)) ++r.manifests_verified;
    if (o.committed && !m.ok()) o.error = absl::StrCat("answered committed, but its MANIFEST: ", m.status().message());
    r.outcomes.push_back(std::move(o));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  totals.recording = false;
  const SteadyClock::time_point c1 = SteadyClock::now();
  const std::optional<ProcUsage> ckpt_cpu1 = ReadProcUsage(coord.pid());
  r.checkpointing_ack_ms = TakeAckLatencies(&totals);
  // The records of the last commits are saved at the coordinator's next ticks.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  if (const std::optional<int64_t> rev3 = etcd_watch.Revision(); rev2 && rev3) {
    r.etcd_writes_per_checkpoint = static_cast<double>(*rev3 - *rev2) / static_cast<double>(f.checkpoints);
  }
  r.etcd_db_bytes = etcd_watch.DbBytes();
  if (ckpt_cpu0 && ckpt_cpu1) {
    r.checkpointing_cores = (ckpt_cpu1->cpu_seconds - ckpt_cpu0->cpu_seconds) / (MsBetween(c0, c1) / 1000);
  }

  // 7. The coordinator's own view: every agent still alive, the commits counted.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::GetClusterStatusResponse status;
    grpc::Status s = (*conns)[0].stub->GetClusterStatus(&ctx, v1::GetClusterStatusRequest(), &status);
    if (!s.ok()) return fail(absl::StrCat("GetClusterStatus: ", s.error_message()));
    for (const v1::AgentStatus& a : status.agents()) r.agents_alive += a.alive();
    for (const v1::JobStatus& j : status.jobs()) {
      if (j.job() == kJob) r.coordinator_committed = j.checkpoints_committed();
    }
  }
  if (standby == nullptr) beating.Stop();
  r.broken = totals.broken.load();
  r.unknown = totals.unknown.load();
  if (standby != nullptr) {
    RunFailover(f, coord, *standby, beating, agents, host_of_rank, (*refs)[f.checkpoints], root, senders, &r);
    if (absl::Status s = standby->Stop(); !s.ok() && r.failover_error.empty()) {
      r.failover_error = absl::StrCat("the new leader: ", s.message(), "; its stderr (last lines):\n",
                                      standby->StderrTail());
    }
  }
  const absl::Status stopped = coord.Stop();
  const bool ok = WriteResults(f, r, json, out, err);
  if (!stopped.ok()) err << "ckptd-bench coordinator: " << stopped.message() << "\n";
  if (!ok || !stopped.ok()) {
    err << "ckptd-bench coordinator: coordinator stderr (last lines):\n" << coord.StderrTail() << "\n";
    return base::kExitFailed;
  }
  return base::kExitOk;
}

}  // namespace ckptd::bench
