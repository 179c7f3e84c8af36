// A whole cluster on loopback, with real processes: one ckptd-coordinator,
// two ckptd-agents (node-a hosts ranks 0 and 1, node-b ranks 2 and 3 of a job
// of world size 4), and an elastic launcher that runs the four
// ckptd-demo-trainer ranks and, like torchrun, starts all four again whenever
// one exits non-zero (75: the coordinator asked for a restart; or killed).
// Each scenario injects one fault (a trainer, an agent or the coordinator
// killed, an agent cut off), checks what the coordinator recorded, and checks
// that every rank ends with the digest of an uninterrupted run.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/host_port.h"
#include "ckptd/v1/coordinator.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

extern char** environ;

namespace ckptd::v1 {
// For gtest's messages (its generic protobuf printer trips GCC 12's
// -Wrestrict false positive in this file).
void PrintTo(const FailureEvent& e, std::ostream* os) { *os << e.ShortDebugString(); }
}  // namespace ckptd::v1

namespace ckptd::cluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Lt;

constexpr char kCoordinatorBin[] = CKPTD_COORDINATOR_BIN;
constexpr char kAgentBin[] = CKPTD_AGENT_BIN;
constexpr char kTrainerBin[] = CKPTD_TRAINER_BIN;
constexpr char kCtlBin[] = CKPTD_CTL_BIN;

constexpr char kJob[] = "cluster-job";
constexpr uint32_t kWorld = 4;
// Small state and a steady pace (about 5 s of training), a checkpoint every
// 20 steps (the coordinator's --every), and 7 micro-batches per optimizer
// step so that snapshots land mid-accumulation and gradients matter.
constexpr int kSteps = 300;
constexpr int kStepMs = 15;
constexpr int kStateMb = 1;
constexpr uint64_t kEvery = 20;
constexpr int kAccum = 7;
// The coordinator's failure detection: heartbeats, node-lost silence, and how
// often it looks (a quarter of the heartbeat interval).
constexpr absl::Duration kHeartbeat = absl::Milliseconds(200);
constexpr absl::Duration kNodeLostAfter = absl::Milliseconds(1500);
constexpr absl::Duration kTick = absl::Milliseconds(50);
// ckptd-demo-trainer's "restart requested" status (EX_TEMPFAIL).
constexpr int kExitRestart = 75;
constexpr int kExitKilled = 128 + SIGKILL;

const char* NodeOf(uint32_t rank) { return rank < 2 ? "node-a" : "node-b"; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// The number right after `prefix` in `text` (its last occurrence), if any.
std::optional<uint64_t> NumberAfter(const std::string& text, const std::string& prefix) {
  const size_t at = text.rfind(prefix);
  if (at == std::string::npos) return std::nullopt;
  size_t end = at + prefix.size();
  while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
  uint64_t n = 0;
  if (!absl::SimpleAtoi(text.substr(at + prefix.size(), end - at - prefix.size()), &n)) return std::nullopt;
  return n;
}

// NumberAfter in the file at `path`, once the line holding it is complete.
std::optional<uint64_t> NumberInLogLine(const std::string& path, const std::string& prefix) {
  const std::string text = ReadFile(path);
  const size_t at = text.find(prefix);
  if (at == std::string::npos || text.find('\n', at) == std::string::npos) return std::nullopt;
  return NumberAfter(text, prefix);
}

// Polls `done` every `poll` until it holds or `timeout` passes.
bool WaitUntil(const std::function<bool()>& done, absl::Duration timeout,
               absl::Duration poll = absl::Milliseconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(poll);
  }
  return true;
}

// A SIGKILLed agent leaves its staging segments in /dev/shm and no later
// agent reclaims them (a known gap): removes those of agent `pid`.
void RemoveStagingSegments(pid_t pid) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    if (absl::StartsWith(e.path().filename().string(), absl::StrCat("ckptd-", pid, "-"))) {
      std::filesystem::remove(e.path(), ec);
    }
  }
}

// One child process with its stdout and stderr in files; killed (SIGKILL)
// and reaped when destroyed. Not thread-safe.
class Process {
 public:
  Process(std::vector<std::string> argv, const std::string& out, const std::string& err) {
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (posix_spawn(&pid_, cargv[0], &fa, nullptr, cargv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Process() {
    if (running()) {
      ::kill(pid_, SIGKILL);
      Wait(absl::InfiniteDuration());
    }
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !exit_code_; }
  // Sends `sig` unless the process was already reaped.
  bool Signal(int sig) { return running() && ::kill(pid_, sig) == 0; }

  // Its exit status (the code, or 128 + the signal) once it ended within `wait`.
  std::optional<int> Wait(absl::Duration wait) {
    if (pid_ <= 0) return 127;
    const absl::Time deadline = absl::Now() + wait;
    while (!exit_code_) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (absl::Now() >= deadline) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return exit_code_;
  }

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

// One coordinator and one agent per node, in `dir` (storage root, state
// directory, sockets and logs). Every start of a process logs to a new file.
class Cluster {
 public:
  explicit Cluster(std::string dir) : dir_(std::move(dir)), root_(dir_ + "/root"), state_(dir_ + "/state") {
    ::mkdir(dir_.c_str(), 0700);
  }
  // Stops the agents gracefully (a killed agent leaves its staging segments
  // in /dev/shm), then the coordinator.
  ~Cluster() {
    for (auto& [node, agent] : agents_) {
      agent->Signal(SIGCONT);
      agent->Signal(SIGTERM);
    }
    for (auto& [node, agent] : agents_) agent->Wait(absl::Seconds(10));
    if (coordinator_ != nullptr) {
      coordinator_->Signal(SIGTERM);
      coordinator_->Wait(absl::Seconds(10));
    }
  }

  const std::string& root() const { return root_; }
  std::string socket(const std::string& node) const { return absl::StrCat(dir_, "/", node, ".sock"); }
  std::string StepDir(uint64_t step) const { return absl::StrCat(root_, "/", kJob, "/step-", step); }
  std::string Manifest(uint64_t step) const { return StepDir(step) + "/MANIFEST"; }

  // Starts the coordinator on `port` (0: any free one) with `flags` beyond
  // the timing ones (a fixed interval unless told otherwise); its port, or 0
  // when it did not come up.
  int StartCoordinator(int port = 0, std::vector<std::string> flags = {"--every", std::to_string(kEvery)}) {
    const std::string log = NextLog("coordinator");
    std::vector<std::string> argv = {kCoordinatorBin,       "--listen",  absl::StrCat("127.0.0.1:", port),
                                     "--storage-root",      root_,       "--state-dir",
                                     state_,                "--heartbeat-interval", absl::FormatDuration(kHeartbeat),
                                     "--node-lost-after",   absl::FormatDuration(kNodeLostAfter)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    coordinator_ = std::make_unique<Process>(argv, log + ".stdout", log);
    const std::string prefix = "ckptd-coordinator: listening on 127.0.0.1:";
    std::optional<uint64_t> listening;
    WaitUntil(
        [&] {
          listening = NumberInLogLine(log, prefix);
          return listening.has_value() || coordinator_->Wait(absl::ZeroDuration()).has_value();
        },
        absl::Seconds(30));
    if (!listening) return 0;
    port_ = static_cast<int>(*listening);
    grpc::ChannelArguments args;
    // Reconnect quickly once a restarted coordinator is back.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
    stub_ = ckptd::v1::Coordinator::NewStub(grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port_),
                                                                      grpc::InsecureChannelCredentials(), args));
    return port_;
  }
  Process* coordinator() { return coordinator_.get(); }
  int port() const { return port_; }
  // The operator token the coordinator generated at its start.
  std::string token_file() const { return state_ + "/operator-token"; }
  // The agent token it generated at its first start (and keeps after a restart).
  std::string agent_token_file() const { return state_ + "/agent-token"; }

  // Starts node's agent (again), with the coordinator's agent token, and
  // waits until it serves its socket.
  bool StartAgent(const std::string& node, const std::vector<std::string>& extra = {}) {
    agent_flags_[node] = extra;
    const std::string log = NextLog(node);
    std::vector<std::string> argv = {kAgentBin,     "--storage-root", root_, "--socket", socket(node),
                                     "--coordinator", absl::StrCat("127.0.0.1:", port_), "--node-id", node,
                                     "--agent-token-file", agent_token_file(), "--threads", "2"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto agent = std::make_unique<Process>(argv, log + ".stdout", log);
    Process* p = agent.get();
    agents_[node] = std::move(agent);
    return WaitUntil(
        [&] {
          return absl::StrContains(ReadFile(log), "ckptd-agent: serving on") ||
                 p->Wait(absl::ZeroDuration()).has_value();
        },
        absl::Seconds(30)) &&
           p->running();
  }
  Process* agent(const std::string& node) { return agents_[node].get(); }
  // Starts node's agent again with the flags of its last start.
  bool RestartAgent(const std::string& node) { return StartAgent(node, agent_flags_[node]); }

  // The coordinator's view of the job; nullopt when it cannot say.
  std::optional<ckptd::v1::JobStatus> Job() {
    std::optional<ckptd::v1::GetClusterStatusResponse> s = Status();
    if (!s) return std::nullopt;
    for (const ckptd::v1::JobStatus& j : s->jobs()) {
      if (j.job() == kJob) return j;
    }
    return std::nullopt;
  }
  // The newest committed step the coordinator reports, if any.
  std::optional<uint64_t> Committed() {
    std::optional<ckptd::v1::JobStatus> j = Job();
    if (!j || !j->has_committed()) return std::nullopt;
    return j->newest_committed_step();
  }
  bool AgentAlive(const std::string& node) {
    std::optional<ckptd::v1::GetClusterStatusResponse> s = Status();
    if (!s) return false;
    for (const ckptd::v1::AgentStatus& a : s->agents()) {
      if (a.node_id() == node) return a.alive();
    }
    return false;
  }
  std::optional<ckptd::v1::GetClusterStatusResponse> Status() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    ckptd::v1::GetClusterStatusResponse resp;
    if (stub_ == nullptr || !stub_->GetClusterStatus(&ctx, ckptd::v1::GetClusterStatusRequest(), &resp).ok()) {
      return std::nullopt;
    }
    return resp;
  }
  // The job's steps as the coordinator knows them, ascending.
  std::vector<ckptd::v1::StepEntry> Steps() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    ckptd::v1::ListStepsRequest req;
    req.set_job(kJob);
    ckptd::v1::ListStepsResponse resp;
    if (stub_ == nullptr || !stub_->ListSteps(&ctx, req, &resp).ok()) return {};
    return {resp.steps().begin(), resp.steps().end()};
  }
  // The job's failure events, newest first.
  // The job's failure events. A coordinator that does not answer (it is up in
  // every test that asks) fails the test rather than reading as "no events":
  // under load (sanitizers, a busy machine) one call can miss a short
  // deadline, so it is asked again for up to 20 s.
  std::vector<ckptd::v1::FailureEvent> Events() {
    ckptd::v1::ListEventsRequest req;
    req.set_job(kJob);
    grpc::Status status(grpc::StatusCode::UNAVAILABLE, "no coordinator started");
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (stub_ != nullptr) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      ckptd::v1::ListEventsResponse resp;
      status = stub_->ListEvents(&ctx, req, &resp);
      if (status.ok()) return {resp.events().begin(), resp.events().end()};
      if (absl::Now() >= give_up) break;
      absl::SleepFor(absl::Milliseconds(200));
    }
    ADD_FAILURE() << "ListEvents: " << status.error_message();
    return {};
  }
  // Events of `kind` on `node` (and `rank`, when given).
  std::vector<ckptd::v1::FailureEvent> EventsOf(ckptd::v1::FailureKind kind, const std::string& node,
                                                std::optional<uint32_t> rank = std::nullopt) {
    std::vector<ckptd::v1::FailureEvent> out;
    for (const ckptd::v1::FailureEvent& e : Events()) {
      if (e.kind() != kind || e.node_id() != node) continue;
      if (rank && (!e.has_rank() || e.rank() != *rank)) continue;
      out.push_back(e);
    }
    return out;
  }

 private:
  std::string NextLog(const std::string& what) { return absl::StrCat(dir_, "/", what, ".", ++starts_[what], ".log"); }

  std::string dir_, root_, state_;
  std::map<std::string, int> starts_;
  std::unique_ptr<Process> coordinator_;
  std::map<std::string, std::unique_ptr<Process>> agents_;
  std::map<std::string, std::vector<std::string>> agent_flags_;
  std::unique_ptr<ckptd::v1::Coordinator::Stub> stub_;
  int port_ = 0;
};

// The elastic launcher: runs the four ranks, each on its node's agent socket.
// When one exits non-zero it gives the others `grace` to exit by themselves
// (they should exit 75 once the coordinator declared the failure), kills
// those still running, and starts all four again; done when all four of one
// attempt exit 0. Restarts can be held (a node whose agent is down starts
// nothing).
class Launcher {
 public:
  struct Options {
    int max_attempts = 5;
    absl::Duration grace = absl::Seconds(6);
    absl::Duration deadline = absl::Seconds(100);
    // The trainers' pace (it does not change what they compute).
    int step_ms = kStepMs;
  };

  Launcher(std::string dir, Cluster* cluster, Options options)
      : dir_(std::move(dir)), cluster_(cluster), options_(options) {
    ::mkdir(dir_.c_str(), 0700);
  }
  explicit Launcher(std::string dir, Cluster* cluster) : Launcher(std::move(dir), cluster, Options()) {}
  ~Launcher() {
    ReleaseRestarts();
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  void Start() {
    start_ = absl::Now();
    thread_ = std::thread([this] { Run(); });
  }
  // Waits for the loop to end; true when every rank of one attempt exited 0.
  bool Join() {
    if (thread_.joinable()) thread_.join();
    absl::MutexLock l(&mu_);
    return succeeded_;
  }
  absl::Duration elapsed() const { return end_ - start_; }

  // Sends `sig` to `rank` of the running attempt.
  bool Signal(uint32_t rank, int sig) {
    absl::MutexLock l(&mu_);
    return procs_[rank] != nullptr && procs_[rank]->Signal(sig);
  }
  void HoldRestarts() {
    absl::MutexLock l(&mu_);
    hold_ = true;
  }
  void ReleaseRestarts() {
    absl::MutexLock l(&mu_);
    hold_ = false;
  }

  // Per attempt, the exit status of each rank (137 for one the launcher killed).
  std::vector<std::array<int, kWorld>> exit_codes() {
    absl::MutexLock l(&mu_);
    return exit_codes_;
  }
  // "final_step=<n> digest=<hex>" of each rank of the attempt that succeeded.
  std::array<std::string, kWorld> final_lines() {
    absl::MutexLock l(&mu_);
    return final_lines_;
  }
  // What `rank` wrote to stderr in `attempt`.
  std::string Stderr(int attempt, uint32_t rank) const { return ReadFile(Log(attempt, rank, "err")); }
  // The step `rank` restored in `attempt`, if it restored one.
  std::optional<uint64_t> Restored(int attempt, uint32_t rank) const {
    return NumberAfter(Stderr(attempt, rank), "ckptd-demo-trainer: restored step ");
  }

 private:
  std::string Log(int attempt, uint32_t rank, const char* ext) const {
    return absl::StrCat(dir_, "/attempt-", attempt, ".rank-", rank, ".", ext);
  }

  void Run() {
    const absl::Time deadline = start_ + options_.deadline;
    for (int attempt = 0; attempt < options_.max_attempts; ++attempt) {
      {
        absl::MutexLock l(&mu_);
        auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !hold_ || stop_; };
        if (attempt > 0) mu_.AwaitWithDeadline(absl::Condition(&released), deadline);
        if (stop_ || absl::Now() >= deadline) break;
        for (uint32_t r = 0; r < kWorld; ++r) {
          procs_[r] = std::make_unique<Process>(
              std::vector<std::string>{kTrainerBin, "--socket", cluster_->socket(NodeOf(r)), "--job", kJob,
                                       "--steps", std::to_string(kSteps), "--state-mb", std::to_string(kStateMb),
                                       "--rank", std::to_string(r), "--world-size", std::to_string(kWorld),
                                       "--every", std::to_string(kEvery), "--step-ms", std::to_string(options_.step_ms),
                                       "--accum", std::to_string(kAccum)},
              Log(attempt, r, "out"), Log(attempt, r, "err"));
        }
      }
      std::array<std::optional<int>, kWorld> codes;
      std::optional<absl::Time> first_failure;
      while (true) {
        bool all_ended = true;
        bool stop = false;
        {
          absl::MutexLock l(&mu_);
          stop = stop_;
          for (uint32_t r = 0; r < kWorld; ++r) {
            if (!codes[r]) codes[r] = procs_[r]->Wait(absl::ZeroDuration());
            if (codes[r] && *codes[r] != 0 && !first_failure) first_failure = absl::Now();
            all_ended &= codes[r].has_value();
          }
          const absl::Time now = absl::Now();
          if (!all_ended && (stop || now >= deadline || (first_failure && now >= *first_failure + options_.grace))) {
            for (uint32_t r = 0; r < kWorld; ++r) procs_[r]->Signal(SIGKILL);
          }
        }
        if (all_ended) break;
        absl::SleepFor(absl::Milliseconds(10));
      }
      absl::MutexLock l(&mu_);
      std::array<int, kWorld> ended;
      bool ok = true;
      for (uint32_t r = 0; r < kWorld; ++r) {
        ended[r] = *codes[r];
        ok &= ended[r] == 0;
        procs_[r].reset();
      }
      exit_codes_.push_back(ended);
      if (ok) {
        for (uint32_t r = 0; r < kWorld; ++r) {
          std::string line, last;
          std::istringstream in(ReadFile(Log(attempt, r, "out")));
          while (std::getline(in, line)) {
            if (!line.empty()) last = line;
          }
          final_lines_[r] = last.substr(0, last.find(" train_s="));
        }
        succeeded_ = true;
        break;
      }
      if (stop_) break;
    }
    end_ = absl::Now();
  }

  const std::string dir_;
  Cluster* const cluster_;
  const Options options_;
  absl::Time start_, end_;
  std::thread thread_;
  absl::Mutex mu_;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool succeeded_ ABSL_GUARDED_BY(mu_) = false;
  std::array<std::unique_ptr<Process>, kWorld> procs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::array<int, kWorld>> exit_codes_ ABSL_GUARDED_BY(mu_);
  std::array<std::string, kWorld> final_lines_ ABSL_GUARDED_BY(mu_);
};

std::string Codes(const std::vector<std::array<int, kWorld>>& attempts) {
  std::vector<std::string> out;
  for (const auto& a : attempts) out.push_back(absl::StrCat("[", absl::StrJoin(a, ","), "]"));
  return absl::StrJoin(out, " ");
}

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ckptd-cluster-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (HasFailure()) DumpLogs();
    if (std::getenv("CKPTD_CLUSTER_TEST_KEEP") != nullptr) {
      std::cerr << "kept " << dir_ << "\n";
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);  // a temp dir left behind fails nothing
  }

  // A coordinator and both agents under dir_/name; `coordinator_flags` go to
  // the coordinator (a fixed interval unless told otherwise), `agent_flags` to
  // both agents, `node_b_flags` to node-b's only.
  std::unique_ptr<Cluster> StartCluster(const std::string& name, int port = 0,
                                        const std::vector<std::string>& node_b_flags = {},
                                        std::vector<std::string> coordinator_flags = {"--every",
                                                                                      std::to_string(kEvery)},
                                        const std::vector<std::string>& agent_flags = {}) {
    auto cluster = std::make_unique<Cluster>(dir_ + "/" + name);
    const int got = cluster->StartCoordinator(port, std::move(coordinator_flags));
    EXPECT_GT(got, 0) << "the coordinator did not start";
    if (port != 0) {
      EXPECT_EQ(got, port);
    }
    std::vector<std::string> b_flags = agent_flags;
    b_flags.insert(b_flags.end(), node_b_flags.begin(), node_b_flags.end());
    EXPECT_TRUE(cluster->StartAgent("node-a", agent_flags)) << "node-a's agent did not start";
    EXPECT_TRUE(cluster->StartAgent("node-b", b_flags)) << "node-b's agent did not start";
    return cluster;
  }

  // The digest lines of an uninterrupted run of the same job (all four
  // ranks, no faults, a cluster and storage root of its own), once per process.
  // The pace does not change what the trainers compute: 3 ms a step is
  // cheap, and slow enough for every rank to take checkpoints.
  void Reference(std::array<std::string, kWorld>* out) {
    static std::optional<std::array<std::string, kWorld>> cached;
    if (!cached) {
      std::unique_ptr<Cluster> cluster = StartCluster("reference");
      ASSERT_FALSE(HasFailure());
      Launcher::Options fast;
      fast.step_ms = 3;
      Launcher launcher(dir_ + "/reference/launcher", cluster.get(), fast);
      launcher.Start();
      ASSERT_TRUE(launcher.Join()) << "exit codes per attempt: " << Codes(launcher.exit_codes());
      EXPECT_EQ(launcher.exit_codes().size(), 1u) << "the reference run restarted: " << Codes(launcher.exit_codes());
      const std::array<std::string, kWorld> lines = launcher.final_lines();
      for (const std::string& line : lines) {
        ASSERT_THAT(line, ::testing::StartsWith(absl::StrCat("final_step=", kSteps, " digest=")));
      }
      std::optional<uint64_t> committed = cluster->Committed();
      EXPECT_TRUE(committed.has_value()) << "the reference run committed no checkpoint";
      std::cerr << "reference run: " << absl::FormatDuration(launcher.elapsed()) << ", newest committed step "
                << committed.value_or(0) << "\n";
      cached = lines;
    }
    *out = *cached;
  }

  // Steps of the job on disk (committed or not) that hold a temp shard file
  // of `rank` and no MANIFEST: a persist of that rank in flight.
  std::vector<uint64_t> InFlight(Cluster* cluster, uint32_t rank) {
    std::vector<uint64_t> steps;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(cluster->root() + "/" + kJob, ec)) {
      std::optional<uint64_t> step = NumberAfter(e.path().filename().string(), "step-");
      if (!step) continue;
      if (Exists(absl::StrCat(e.path().string(), "/rank-", rank, ".shard.tmp")) && !Exists(cluster->Manifest(*step))) {
        steps.push_back(*step);
      }
    }
    std::sort(steps.begin(), steps.end());
    return steps;
  }

  void DumpLogs() {
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_, ec)) {
      const std::string p = e.path().string();
      if (e.is_regular_file() && (absl::EndsWith(p, ".log") || absl::EndsWith(p, ".err"))) files.push_back(p);
    }
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      std::istringstream in(ReadFile(f));
      std::deque<std::string> tail;
      for (std::string line; std::getline(in, line);) {
        tail.push_back(line);
        if (tail.size() > 25) tail.pop_front();
      }
      std::cerr << "==== " << f << "\n" << absl::StrJoin(tail, "\n") << "\n";
    }
  }

  std::string dir_;
};

// The steps an agent held in memory for `rank` when the rank's trainer
// registered again (the last "rank R registered again: ..., steps A, B in
// memory" of its log `log`); empty when it logged none.
std::set<uint64_t> StepsHeldAtRestart(const std::string& log, uint32_t rank) {
  std::set<uint64_t> steps;
  const size_t at = log.rfind(absl::StrCat(" rank ", rank, " registered again: "));
  if (at == std::string::npos) return steps;
  const size_t end = log.find('\n', at);
  const std::string line = log.substr(at, end == std::string::npos ? std::string::npos : end - at);
  size_t from = line.find(", steps ");
  size_t skip = 8;
  if (from == std::string::npos) {
    from = line.find(", step ");
    skip = 7;
  }
  const size_t to = line.find(" in memory");
  if (from == std::string::npos || to == std::string::npos || to < from + skip) return steps;
  for (absl::string_view s : absl::StrSplit(line.substr(from + skip, to - from - skip), ", ")) {
    uint64_t v = 0;
    if (absl::SimpleAtoi(s, &v)) steps.insert(v);
  }
  return steps;
}

// Expects every rank of `attempt` to have restored the same step, and returns it.
std::optional<uint64_t> SameRestoredStep(const Launcher& launcher, int attempt) {
  std::array<std::optional<uint64_t>, kWorld> steps;
  for (uint32_t r = 0; r < kWorld; ++r) steps[r] = launcher.Restored(attempt, r);
  for (uint32_t r = 1; r < kWorld; ++r) {
    EXPECT_EQ(steps[r], steps[0]) << "rank " << r << " restored another step than rank 0 in attempt " << attempt;
  }
  return steps[0];
}

// Starts `launcher`, SIGKILLs rank 2 (on node-b) once two checkpoints have
// committed, waits until the job finishes, and sets `committed` to the newest
// step committed before the kill and `restored` to the step every rank
// restored in the second attempt.
void CrashRank2AfterTwoCheckpoints(Cluster* cluster, Launcher* launcher, uint64_t* committed,
                                   std::optional<uint64_t>* restored) {
  launcher->Start();
  ASSERT_TRUE(WaitUntil([&] { return (*committed = cluster->Committed().value_or(0)) >= 2 * kEvery; },
                        absl::Seconds(30)))
      << "no second checkpoint committed";
  ASSERT_TRUE(launcher->Signal(2, SIGKILL));
  ASSERT_TRUE(launcher->Join()) << "exit codes per attempt: " << Codes(launcher->exit_codes());
  *restored = SameRestoredStep(*launcher, 1);
  ASSERT_TRUE(restored->has_value()) << launcher->Stderr(1, 0);
  EXPECT_GE(**restored, *committed);
}

// 1. A trainer rank is SIGKILLed mid-run.
TEST_F(ClusterTest, KilledTrainerRestartsEveryRankFromTheSameCommittedStep) {
  std::array<std::string, kWorld> reference;
  ASSERT_NO_FATAL_FAILURE(Reference(&reference));
  const absl::Time start = absl::Now();
  std::unique_ptr<Cluster> cluster = StartCluster("run");
  ASSERT_FALSE(HasFailure());
  Launcher launcher(dir_ + "/run/launcher", cluster.get());
  // Two checkpoints in, rank 2 (on node-b) dies; every rank comes back at the
  // same step, no older than the one committed before the kill.
  uint64_t committed = 0;
  std::optional<uint64_t> restored;
  ASSERT_NO_FATAL_FAILURE(CrashRank2AfterTwoCheckpoints(cluster.get(), &launcher, &committed, &restored));

  // node-b's agent saw it die; the coordinator recorded it.
  EXPECT_THAT(cluster->EventsOf(ckptd::v1::TRAINER_DIED, "node-b", 2), ::testing::Not(::testing::IsEmpty()));
  // The other ranks heard of the restart from their agents and exited 75 by themselves.
  const std::vector<std::array<int, kWorld>> codes = launcher.exit_codes();
  ASSERT_GE(codes.size(), 2u);
  EXPECT_THAT(codes[0], ElementsAre(kExitRestart, kExitRestart, kExitKilled, kExitRestart)) << Codes(codes);
  EXPECT_EQ(*restored % kEvery, 0u);
  EXPECT_EQ(launcher.final_lines(), reference);
  std::optional<ckptd::v1::JobStatus> job = cluster->Job();
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), ckptd::v1::JOB_RUNNING);
  // Every restarted rank got its state back from its agent's memory: the
  // agents kept the newest step each had persisted, and handed each new
  // trainer its predecessor's staging.
  EXPECT_EQ(job->last_restore().step(), *restored);
  ASSERT_EQ(job->last_restore().ranks_size(), static_cast<int>(kWorld));
  for (const auto& r : job->last_restore().ranks()) {
    EXPECT_EQ(r.source(), ckptd::v1::AGENT_MEMORY) << "rank " << r.rank();
    EXPECT_EQ(r.node_id(), r.rank() < 2 ? "node-a" : "node-b") << "rank " << r.rank();
  }
  EXPECT_THAT(ReadFile(dir_ + "/run/node-b.1.log"),
              HasSubstr(absl::StrCat("rank 2: step ", *restored, " read from the agent's memory")));
  std::cerr << "scenario: " << absl::FormatDuration(absl::Now() - start) << ", exit codes " << Codes(codes)
            << ", restored step " << *restored << "\n";
}

// 1b. The same crash with each agent's node-local tier (--local-cache) and
// no memory tier: the restart reads every shard from the nodes' own disks,
// and the storage root still holds every committed step in full.
TEST_F(ClusterTest, NodeLocalTierServesTheRestoreAfterATrainerCrash) {
  std::array<std::string, kWorld> reference;
  ASSERT_NO_FATAL_FAILURE(Reference(&reference));
  auto cluster = std::make_unique<Cluster>(dir_ + "/run");
  ASSERT_GT(cluster->StartCoordinator(), 0);
  for (const char* node : {"node-a", "node-b"}) {
    ASSERT_TRUE(cluster->StartAgent(
        node, {"--local-cache", absl::StrCat(dir_, "/run/", node, "-nvme"), "--no-memory-tier"}))
        << node;
  }
  Launcher launcher(dir_ + "/run/launcher", cluster.get());
  uint64_t committed = 0;
  std::optional<uint64_t> restored;
  ASSERT_NO_FATAL_FAILURE(CrashRank2AfterTwoCheckpoints(cluster.get(), &launcher, &committed, &restored));
  EXPECT_EQ(launcher.final_lines(), reference);
  // Each agent read its ranks' shards of the restored step from its tier.
  for (const auto& [node, ranks] : std::vector<std::pair<std::string, std::vector<uint32_t>>>{
           {"node-a", {0, 1}}, {"node-b", {2, 3}}}) {
    const std::string logs = ReadFile(absl::StrCat(dir_, "/run/", node, ".1.log"));
    for (uint32_t r : ranks) {
      EXPECT_THAT(logs, HasSubstr(absl::StrCat("rank ", r, ": step ", *restored, " read from the node-local tier")))
          << node;
    }
  }
  // The tier keeps two steps per job; what it holds of a committed step is
  // byte for byte the storage root's shard.
  const std::optional<uint64_t> newest = cluster->Committed();
  ASSERT_TRUE(newest.has_value());
  int compared = 0;
  for (const auto& [node, ranks] : std::vector<std::pair<std::string, std::vector<uint32_t>>>{
           {"node-a", {0, 1}}, {"node-b", {2, 3}}}) {
    const std::string job_dir = absl::StrCat(dir_, "/run/", node, "-nvme/", kJob);
    int steps = 0;
    for (const auto& e : std::filesystem::directory_iterator(job_dir)) steps += e.is_directory() ? 1 : 0;
    EXPECT_LE(steps, 2) << job_dir;
    for (uint32_t r : ranks) {
      const std::string local = absl::StrCat(job_dir, "/step-", *newest, "/rank-", r, ".shard");
      if (!std::filesystem::exists(local)) continue;
      EXPECT_EQ(ReadFile(local), ReadFile(absl::StrCat(cluster->StepDir(*newest), "/rank-", r, ".shard"))) << local;
      ++compared;
    }
  }
  EXPECT_GT(compared, 0) << "no local copy of the newest committed step " << *newest;
}

// 1c. A trainer in a PID namespace of its own (as in a pod without hostPID)
// reports its pid as 1; the agent watches the pid the kernel gave for its
// connection instead, so the trainer's death is still noticed at once.
TEST_F(ClusterTest, TrainerInItsOwnPidNamespaceIsWatchedByItsRealPid) {
  if (::access("/usr/bin/unshare", X_OK) != 0) GTEST_SKIP() << "no unshare (util-linux)";
  auto cluster = std::make_unique<Cluster>(dir_ + "/run");
  ASSERT_GT(cluster->StartCoordinator(), 0);
  ASSERT_TRUE(cluster->StartAgent("node-a"));
  const std::string err = dir_ + "/run/trainer.err";
  Process trainer({"/usr/bin/unshare", "--pid", "--fork", "--kill-child", kTrainerBin, "--socket",
                   cluster->socket("node-a"), "--job", kJob, "--steps", "100000", "--state-mb", "1", "--every",
                   std::to_string(kEvery), "--step-ms", "5"},
                  dir_ + "/run/trainer.out", err);
  const std::string log = dir_ + "/run/node-a.1.log";
  const std::string prefix = "reports pid 1 from another PID namespace; watching its pid here, ";
  std::optional<uint64_t> real;
  WaitUntil(
      [&] {
        real = NumberInLogLine(log, prefix);
        return real.has_value() || trainer.Wait(absl::ZeroDuration()).has_value();
      },
      absl::Seconds(30));
  if (!real && absl::StrContains(ReadFile(err), "unshare failed")) GTEST_SKIP() << ReadFile(err);
  ASSERT_TRUE(real.has_value()) << "agent log:\n" << ReadFile(log) << "\ntrainer:\n" << ReadFile(err);
  EXPECT_NE(*real, 1u);
  EXPECT_THAT(ReadFile(absl::StrCat("/proc/", *real, "/cmdline")), HasSubstr("ckptd-demo-trainer"));
  ASSERT_TRUE(WaitUntil([&] { return cluster->Committed().has_value(); }, absl::Seconds(30)))
      << "no checkpoint committed";
  ASSERT_EQ(::kill(static_cast<pid_t>(*real), SIGKILL), 0);
  EXPECT_TRUE(WaitUntil([&] { return !cluster->EventsOf(ckptd::v1::TRAINER_DIED, "node-a", 0).empty(); },
                        absl::Seconds(5)))
      << "the trainer's death was not reported";
  EXPECT_TRUE(trainer.Wait(absl::Seconds(10)).has_value());
}

// 2. node-b's agent is SIGKILLed while it persists a snapshot of its ranks.
TEST_F(ClusterTest, AgentKilledMidCheckpointLosesOnlyThatStep) {
  std::array<std::string, kWorld> reference;
  ASSERT_NO_FATAL_FAILURE(Reference(&reference));
  const absl::Time start = absl::Now();
  // Slow storage on node-b: every persist there stays in flight for a while.
  std::unique_ptr<Cluster> cluster = StartCluster("run", 0, {"--inject-write-latency", "100ms"});
  ASSERT_FALSE(HasFailure());
  Launcher launcher(dir_ + "/run/launcher", cluster.get());
  launcher.HoldRestarts();  // until node-b has an agent again
  launcher.Start();

  uint64_t committed = 0;
  ASSERT_TRUE(WaitUntil([&] { return (committed = cluster->Committed().value_or(0)) >= kEvery; }, absl::Seconds(30)))
      << "no checkpoint committed";
  // The next snapshot of rank 2: its shard is being written under a temp name.
  uint64_t in_flight = 0;
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (uint64_t s : InFlight(cluster.get(), 2)) {
          if (s > committed) in_flight = s;
        }
        return in_flight != 0;
      },
      absl::Seconds(30), absl::Milliseconds(2)))
      << "no persist of rank 2 seen after step " << committed;
  const pid_t killed_pid = cluster->agent("node-b")->pid();
  ASSERT_TRUE(cluster->agent("node-b")->Signal(SIGKILL));
  ASSERT_EQ(cluster->agent("node-b")->Wait(absl::Seconds(10)), kExitKilled);

  ASSERT_TRUE(WaitUntil([&] { return !cluster->EventsOf(ckptd::v1::NODE_LOST, "node-b").empty(); },
                        absl::Seconds(15)))
      << "node-b was not declared lost";
  const absl::Duration lost_after = absl::Now() - start;
  // The step that was in flight was never committed; an older one is the newest.
  EXPECT_FALSE(Exists(cluster->Manifest(in_flight))) << "step " << in_flight << " was committed";
  const std::optional<uint64_t> newest = cluster->Committed();
  ASSERT_TRUE(newest.has_value());
  EXPECT_LT(*newest, in_flight);

  ASSERT_TRUE(cluster->StartAgent("node-b")) << "node-b's agent did not start again";
  launcher.ReleaseRestarts();
  ASSERT_TRUE(launcher.Join()) << "exit codes per attempt: " << Codes(launcher.exit_codes());

  const std::vector<std::array<int, kWorld>> codes = launcher.exit_codes();
  ASSERT_GE(codes.size(), 2u);
  // node-a's ranks heard of the lost node and exited 75 by themselves.
  EXPECT_EQ(codes[0][0], kExitRestart) << Codes(codes);
  EXPECT_EQ(codes[0][1], kExitRestart) << Codes(codes);
  // The run resumed from the step committed before the kill, not the one in flight.
  std::optional<uint64_t> restored = SameRestoredStep(launcher, 1);
  ASSERT_TRUE(restored.has_value()) << launcher.Stderr(1, 0);
  EXPECT_EQ(*restored, *newest);
  EXPECT_THAT(*restored, Lt(in_flight));
  EXPECT_EQ(launcher.final_lines(), reference);
  RemoveStagingSegments(killed_pid);
  std::cerr << "scenario: " << absl::FormatDuration(absl::Now() - start) << ", step " << in_flight
            << " in flight at the kill, node lost at " << absl::FormatDuration(lost_after) << ", exit codes "
            << Codes(codes) << ", restored step " << *restored << "\n";
}

// 3. The coordinator is SIGKILLed mid-run and started again on the same port
// and state directory.
TEST_F(ClusterTest, CoordinatorRestartLosesNoCommittedStep) {
  std::array<std::string, kWorld> reference;
  ASSERT_NO_FATAL_FAILURE(Reference(&reference));
  const absl::Time start = absl::Now();
  const int port = ckptd::base::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  std::unique_ptr<Cluster> cluster = StartCluster("run", port);
  ASSERT_FALSE(HasFailure());
  Launcher launcher(dir_ + "/run/launcher", cluster.get());
  launcher.Start();

  uint64_t committed = 0;
  ASSERT_TRUE(WaitUntil([&] { return (committed = cluster->Committed().value_or(0)) >= 2 * kEvery; },
                        absl::Seconds(30)))
      << "no second checkpoint committed";
  ASSERT_TRUE(cluster->coordinator()->Signal(SIGKILL));
  ASSERT_EQ(cluster->coordinator()->Wait(absl::Seconds(10)), kExitKilled);
  absl::SleepFor(absl::Seconds(1));  // the agents go on without it meanwhile
  ASSERT_EQ(cluster->StartCoordinator(port), port) << "the coordinator did not come back on its port";

  // Nothing committed before the kill is lost.
  std::optional<uint64_t> after_restart = cluster->Committed();
  ASSERT_TRUE(after_restart.has_value()) << "the restarted coordinator lists no committed step";
  EXPECT_GE(*after_restart, committed);
  EXPECT_TRUE(Exists(cluster->Manifest(*after_restart)));
  // Checkpoints resume: a newer step commits.
  uint64_t newer = 0;
  EXPECT_TRUE(WaitUntil([&] { return (newer = cluster->Committed().value_or(0)) > *after_restart; },
                        absl::Seconds(30)))
      << "no step committed after the restart";
  ASSERT_TRUE(launcher.Join()) << "exit codes per attempt: " << Codes(launcher.exit_codes());
  EXPECT_EQ(launcher.final_lines(), reference);
  const std::vector<std::array<int, kWorld>> codes = launcher.exit_codes();
  // Losing the coordinator for a moment is no failure of the job.
  EXPECT_EQ(codes.size(), 1u) << "the job restarted: " << Codes(codes);
  EXPECT_THAT(cluster->Events(), ::testing::IsEmpty());
  std::cerr << "scenario: " << absl::FormatDuration(absl::Now() - start) << ", committed " << committed
            << " before the kill, " << *after_restart << " after the restart, then " << newer << "; exit codes "
            << Codes(codes) << "\n";
}

// 4. node-b's agent is cut off (SIGSTOP) for 3 s, then comes back (SIGCONT).
TEST_F(ClusterTest, AgentCutOffIsDeclaredLostAndRejoins) {
  std::array<std::string, kWorld> reference;
  ASSERT_NO_FATAL_FAILURE(Reference(&reference));
  const absl::Time start = absl::Now();
  std::unique_ptr<Cluster> cluster = StartCluster("run");
  ASSERT_FALSE(HasFailure());
  Launcher launcher(dir_ + "/run/launcher", cluster.get());
  launcher.HoldRestarts();  // until node-b's agent is back
  launcher.Start();

  uint64_t committed = 0;
  ASSERT_TRUE(WaitUntil([&] { return (committed = cluster->Committed().value_or(0)) >= 2 * kEvery; },
                        absl::Seconds(30)))
      << "no second checkpoint committed";
  Process* agent = cluster->agent("node-b");
  const absl::Time stopped = absl::Now();
  ASSERT_TRUE(agent->Signal(SIGSTOP));
  const bool lost = WaitUntil([&] { return !cluster->EventsOf(ckptd::v1::NODE_LOST, "node-b").empty(); },
                              absl::Seconds(10));
  const absl::Duration detected = absl::Now() - stopped;
  absl::SleepFor(stopped + absl::Seconds(3) - absl::Now());
  const std::optional<ckptd::v1::JobStatus> before = cluster->Job();
  const bool alive_while_stopped = cluster->AgentAlive("node-b");
  ASSERT_TRUE(agent->Signal(SIGCONT));
  ASSERT_TRUE(lost) << "node-b was not declared lost";
  EXPECT_FALSE(alive_while_stopped);
  ASSERT_TRUE(before.has_value());
  EXPECT_EQ(before->state(), ckptd::v1::JOB_RESTARTING);

  // It registers again by itself, and reports the snapshots its ranks
  // published meanwhile once they are durable: a newer step commits before
  // any rank restarts.
  EXPECT_TRUE(WaitUntil([&] { return cluster->AgentAlive("node-b"); }, absl::Seconds(10)))
      << "node-b did not register again";
  uint64_t rejoined = 0;
  EXPECT_TRUE(WaitUntil([&] { return (rejoined = cluster->Committed().value_or(0)) > before->newest_committed_step(); },
                        absl::Seconds(10)))
      << "no step committed with node-b's shards after it returned (newest " << before->newest_committed_step() << ")";
  launcher.ReleaseRestarts();
  ASSERT_TRUE(launcher.Join()) << "exit codes per attempt: " << Codes(launcher.exit_codes());
  const std::vector<std::array<int, kWorld>> codes = launcher.exit_codes();
  ASSERT_GE(codes.size(), 2u);
  // Every rank heard of the restart: node-b's once their agent was back.
  EXPECT_THAT(codes[0], ElementsAre(kExitRestart, kExitRestart, kExitRestart, kExitRestart)) << Codes(codes);
  // node-b's shards count again: steps commit after it returned.
  std::optional<ckptd::v1::JobStatus> after = cluster->Job();
  ASSERT_TRUE(after.has_value());
  EXPECT_GT(after->checkpoints_committed(), before->checkpoints_committed());
  EXPECT_GT(after->newest_committed_step(), before->newest_committed_step());
  std::optional<uint64_t> restored = SameRestoredStep(launcher, 1);
  ASSERT_TRUE(restored.has_value()) << launcher.Stderr(1, 0);
  EXPECT_GE(*restored, rejoined);
  EXPECT_EQ(launcher.final_lines(), reference);
  std::cerr << "scenario: " << absl::FormatDuration(absl::Now() - start) << ", node lost after "
            << absl::FormatDuration(detected) << ", committed " << before->newest_committed_step()
            << " when cut off, " << rejoined << " after it returned; exit codes " << Codes(codes)
            << ", restored step " << *restored << "\n";
}

// 5. No fixed interval: the coordinator's policy measures the job and moves
// its schedule; `ckptctl interval` shows the decision from the live job.
TEST_F(ClusterTest, IntervalPolicyMovesALiveJobsScheduleAndCkptctlExplainsIt) {
  std::array<std::string, kWorld> reference;
  ASSERT_NO_FATAL_FAILURE(Reference(&reference));
  // 0.5 failures per GPU-hour on 4 GPUs: M = 30 min, so Daly's interval is
  // seconds (over 100 steps of 15 ms) for any stall from 1 to 100 ms.
  std::unique_ptr<Cluster> cluster =
      StartCluster("policy", 0, {},
                   {"--initial-every", std::to_string(kEvery), "--failure-rate", "0.5", "--min-interval", "0",
                    "--decide-every", "300ms"});
  ASSERT_FALSE(HasFailure());
  Launcher launcher(dir_ + "/policy/launcher", cluster.get());
  launcher.Start();
  ASSERT_TRUE(launcher.Join()) << "exit codes per attempt: " << Codes(launcher.exit_codes());
  EXPECT_EQ(launcher.exit_codes().size(), 1u) << Codes(launcher.exit_codes());
  // Which steps were snapshotted does not change what training computes.
  EXPECT_EQ(launcher.final_lines(), reference);

  std::optional<ckptd::v1::JobStatus> job = cluster->Job();
  ASSERT_TRUE(job.has_value());
  EXPECT_GE(job->checkpoints_committed(), 2u);
  EXPECT_GT(job->schedule().every_steps(), kEvery * 2) << job->schedule().DebugString();

  const std::string out = dir_ + "/policy/interval.json";
  Process ctl({kCtlBin, "interval", "--job", kJob, "--coordinator", absl::StrCat("127.0.0.1:", cluster->port()),
               "--json"},
              out, dir_ + "/policy/interval.err");
  ASSERT_EQ(ctl.Wait(absl::Seconds(30)), 0) << ReadFile(dir_ + "/policy/interval.err");
  const std::string json = ReadFile(out);
  EXPECT_THAT(json, HasSubstr("\"mode\":\"live\""));
  EXPECT_THAT(json, HasSubstr("\"decided\":true"));
  EXPECT_THAT(json, HasSubstr("\"restart_assumed\":true"));
  EXPECT_THAT(json, HasSubstr(absl::StrCat("\"every_steps\":", job->schedule().every_steps())));
  std::optional<uint64_t> stall_samples = NumberAfter(json, "\"checkpoints_measured\":");
  ASSERT_TRUE(stall_samples.has_value()) << json;
  EXPECT_GE(*stall_samples, 2u);
  std::cerr << "scenario: every " << job->schedule().every_steps() << " steps after the policy, "
            << job->checkpoints_committed() << " checkpoints; " << json << "\n";
}

// 6. `ckptctl drill run` on the live job, one scenario each: the coordinator
// has the agent concerned (started with --allow-drills) inject the failure,
// ckptctl watches what follows and gives its verdict. Each drill must pass,
// its figures must agree with the cluster's flags and with what the ranks
// printed, and the job must end with the digests of an uninterrupted run.

// A rank without step progress for max(kHangFloor, kHangMultiple x its step
// time) is hung (the coordinator's --hang-floor; the multiple is fixed). Above
// kNodeLostAfter, so that a silent node is lost before its ranks look hung.
constexpr absl::Duration kHangFloor = absl::Milliseconds(2500);
constexpr double kHangMultiple = 20;
// How often a trainer tells its agent its step (the client's sync interval).
constexpr absl::Duration kSync = absl::Milliseconds(200);
// Added to every latency bound the flags imply: a loaded or sanitized build
// on a shared machine is slow, but not this slow. Taken off the earliest
// detection the flags allow: how late a heartbeat or progress report may be.
constexpr absl::Duration kSlack = absl::Seconds(2);
constexpr absl::Duration kJitter = absl::Milliseconds(500);

struct DrillCase {
  std::string scenario;
  uint32_t target;  // a rank of the job (node scenarios: the node hosting it)
  uint64_t at_step;
  absl::Duration duration;  // of the timed scenarios; zero for the others
  // The failure the coordinator must record first, which restarts the job;
  // unspecified: the job must not restart because of the drill.
  ckptd::v1::FailureKind detected = ckptd::v1::FAILURE_KIND_UNSPECIFIED;
  // Another kind that may come first (a node crash: its agent may report its
  // trainers' deaths, or die before it could and come back as a new process).
  ckptd::v1::FailureKind or_detected = ckptd::v1::FAILURE_KIND_UNSPECIFIED;
  // The agent killed is started again at once, as systemd with a short
  // RestartSec would, rather than after its node was declared lost.
  bool restart_agent_at_once = false;
};

void PrintTo(const DrillCase& c, std::ostream* os) { *os << c.scenario; }

// Starts an agent whose process ended again with the flags of its last start,
// as systemd would, once the coordinator has declared its node lost; removes
// the staging segments the dead one left and releases the launcher's restarts.
class AgentSupervisor {
 public:
  AgentSupervisor(Cluster* cluster, Launcher* launcher, bool at_once = false)
      : cluster_(cluster), launcher_(launcher), at_once_(at_once) {}

  // One look at each agent; call it every few ms.
  void Poll() {
    for (const char* node : {"node-a", "node-b"}) {
      Process* agent = cluster_->agent(node);
      if (!agent->Wait(absl::ZeroDuration()).has_value()) continue;
      const absl::Time ended = ended_.try_emplace(node, absl::Now()).first->second;
      // Like systemd with a RestartSec beyond --node-lost-after: the drill
      // expects the loss to be detected and the job restarted.
      if (!at_once_ && cluster_->AgentAlive(node) && absl::Now() < ended + absl::Seconds(10)) continue;
      RemoveStagingSegments(agent->pid());
      EXPECT_TRUE(cluster_->RestartAgent(node)) << node << "'s agent did not start again";
      ended_.erase(node);
      ++restarts_;
      launcher_->ReleaseRestarts();
    }
  }
  int restarts() const { return restarts_; }

 private:
  Cluster* const cluster_;
  Launcher* const launcher_;
  const bool at_once_;
  std::map<std::string, absl::Time> ended_;  // agents seen ended, not started again yet
  int restarts_ = 0;
};

// In ckptctl's compact JSON: the number after "key": at its last occurrence
// (nullopt for null), whether "key":true occurs, whether an expectation held.
std::optional<double> JsonNumber(const std::string& json, const std::string& key) {
  const std::string k = absl::StrCat("\"", key, "\":");
  const size_t at = json.rfind(k);
  if (at == std::string::npos) return std::nullopt;
  const size_t from = at + k.size();
  double v = 0;
  if (!absl::SimpleAtod(json.substr(from, json.find_first_of(",}]", from) - from), &v)) return std::nullopt;
  return v;
}
bool JsonTrue(const std::string& json, const std::string& key) {
  return absl::StrContains(json, absl::StrCat("\"", key, "\":true"));
}
bool VerdictHeld(const std::string& json, const std::string& expectation) {
  return absl::StrContains(json, absl::StrCat("{\"expectation\":\"", expectation, "\",\"held\":true"));
}

class DrillTest : public ClusterTest, public ::testing::WithParamInterface<DrillCase> {};

TEST_P(DrillTest, PassesAndTheJobEndsWithTheReferenceDigests) {
  const DrillCase& c = GetParam();
  const bool restarts = c.detected != ckptd::v1::FAILURE_KIND_UNSPECIFIED;
  const bool storage = absl::StartsWith(c.scenario, "storage-");
  std::array<std::string, kWorld> reference;
  ASSERT_NO_FATAL_FAILURE(Reference(&reference));
  const absl::Time start = absl::Now();
  std::unique_ptr<Cluster> cluster = StartCluster(
      "drill", 0, {}, {"--every", std::to_string(kEvery), "--hang-floor", absl::FormatDuration(kHangFloor)},
      {"--allow-drills"});
  ASSERT_FALSE(HasFailure());
  Launcher launcher(dir_ + "/drill/launcher", cluster.get());
  // A node whose agent is down starts nothing: the supervisor releases them.
  const bool kills_agent = c.scenario == "kill-agent" || c.scenario == "kill-node";
  if (kills_agent) launcher.HoldRestarts();
  launcher.Start();
  ASSERT_TRUE(WaitUntil([&] { return cluster->Committed().value_or(0) >= kEvery; }, absl::Seconds(30)))
      << "no checkpoint committed";

  std::vector<std::string> argv = {kCtlBin, "drill", "run", "--job", kJob, "--scenario", c.scenario,
                                   "--target", std::to_string(c.target), "--at-step", std::to_string(c.at_step),
                                   "--watch", "40s", "--coordinator", absl::StrCat("127.0.0.1:", cluster->port()),
                                   "--token-file", cluster->token_file(), "--json"};
  if (c.duration > absl::ZeroDuration()) argv.insert(argv.end(), {"--duration", absl::FormatDuration(c.duration)});
  if (c.scenario == "storage-slow") argv.insert(argv.end(), {"--slow", "200ms"});
  const std::string out = dir_ + "/drill/ctl.json";
  const std::string err = dir_ + "/drill/ctl.err";
  Process ctl(argv, out, err);
  AgentSupervisor supervisor(cluster.get(), &launcher, c.restart_agent_at_once);
  // The job's step time while it runs (the hang threshold follows from it).
  double step_seconds = 0;
  std::optional<int> exit_code;
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (!(exit_code = ctl.Wait(absl::ZeroDuration())) && absl::Now() < give_up) {
    supervisor.Poll();
    if (std::optional<ckptd::v1::JobStatus> job = cluster->Job(); job && job->state() == ckptd::v1::JOB_RUNNING) {
      step_seconds = std::max(step_seconds, job->step_seconds());
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  const std::string json = ReadFile(out);
  const std::string report = absl::StrCat("ckptctl drill run exited ", exit_code.value_or(-1), "; stdout:\n", json,
                                          "stderr:\n", ReadFile(err));
  ASSERT_EQ(exit_code, 0) << report;
  EXPECT_TRUE(JsonTrue(json, "passed")) << report;
  EXPECT_TRUE(JsonTrue(json, "injected")) << report;
  const std::optional<double> ordered_nanos = JsonNumber(json, "ordered_unix_nanos");
  const std::optional<double> injected_nanos = JsonNumber(json, "injected_unix_nanos");
  ASSERT_TRUE(ordered_nanos.has_value() && injected_nanos.has_value()) << report;
  const absl::Time injected = absl::FromUnixNanos(static_cast<int64_t>(*injected_nanos));
  const std::optional<double> detection = JsonNumber(json, "detection_seconds");

  if (restarts) {
    // The coordinator recorded the failure the scenario causes on the target's
    // node, before any other there. (The demo's ranks do not wait for each
    // other as ranks in collectives would: when the target's ranks were held
    // up, the other node's ranks can finish the job before the drill strikes,
    // and their launcher starting them again is recorded on their node first.)
    std::vector<ckptd::v1::FailureEvent> since;
    for (const ckptd::v1::FailureEvent& e : cluster->Events()) {
      if (static_cast<double>(e.unix_nanos()) >= *ordered_nanos && e.node_id() == NodeOf(c.target)) {
        since.push_back(e);
      }
    }
    ASSERT_FALSE(since.empty()) << report;
    EXPECT_THAT(since.back().kind(), ::testing::AnyOf(c.detected, c.or_detected)) << since.back().ShortDebugString();
    // Detected within what the flags allow, and not before they allow it.
    absl::Duration earliest = absl::ZeroDuration();
    absl::Duration latest = kSlack;  // a trainer's death: its agent reports it at once
    if (c.restart_agent_at_once) {
      // Its trainers' deaths, or the agent back as a new process: both soon.
      latest = kSlack + kHeartbeat;
    } else if (c.detected == ckptd::v1::NODE_LOST) {
      earliest = kNodeLostAfter - kHeartbeat - kJitter;
      latest = kNodeLostAfter + kHeartbeat + kTick + kSlack;
    } else if (c.detected == ckptd::v1::TRAINER_HUNG) {
      const absl::Duration threshold = std::max(kHangFloor, absl::Seconds(kHangMultiple * step_seconds));
      ASSERT_LT(threshold + kSlack, c.duration) << "the hang does not outlast the threshold";
      earliest = kHangFloor - kSync - kHeartbeat - kJitter;
      latest = threshold + kSync + kHeartbeat + kTick + kSlack;
    }
    ASSERT_TRUE(detection.has_value()) << report;
    EXPECT_GE(*detection, absl::ToDoubleSeconds(earliest)) << report;
    EXPECT_LE(*detection, absl::ToDoubleSeconds(latest)) << report;
    EXPECT_TRUE(JsonTrue(json, "resumed")) << report;
    EXPECT_FALSE(JsonTrue(json, "fresh_start")) << report;
  }
  std::optional<uint64_t> damaged;
  if (c.scenario == "corrupt-shard") {
    // The damage was found and the step quarantined at once.
    EXPECT_TRUE(VerdictHeld(json, "verification found the damage")) << report;
    damaged = NumberAfter(json, "\"verified_step\":");
    ASSERT_TRUE(damaged.has_value()) << report;
    bool quarantined = false;
    for (const ckptd::v1::StepEntry& e : cluster->Steps()) {
      quarantined |= e.step() == *damaged && e.state() == ckptd::v1::STEP_QUARANTINED;
    }
    EXPECT_TRUE(quarantined) << "step " << *damaged << " is not quarantined";
    // A failure now must restore another step.
    ASSERT_TRUE(launcher.Signal(0, SIGKILL)) << "the job ended before the kill";
  }
  if (storage) {
    // The fault is lifted and a step commits after it, as the coordinator lists it.
    EXPECT_TRUE(JsonTrue(json, "fault_lifted")) << report;
    std::optional<uint64_t> after;
    for (const ckptd::v1::StepEntry& e : cluster->Steps()) {
      if (e.state() == ckptd::v1::STEP_COMMITTED &&
          absl::FromUnixNanos(e.committed_unix_nanos()) > injected + c.duration) {
        after = e.step();
      }
    }
    EXPECT_TRUE(after.has_value()) << "no step committed after the fault was lifted\n" << report;
  }

  ASSERT_TRUE(launcher.Join()) << "exit codes per attempt: " << Codes(launcher.exit_codes());
  const std::vector<std::array<int, kWorld>> codes = launcher.exit_codes();
  std::optional<uint64_t> restored;
  if (restarts || damaged) {
    ASSERT_GE(codes.size(), 2u) << Codes(codes);
    restored = SameRestoredStep(launcher, 1);
    ASSERT_TRUE(restored.has_value()) << launcher.Stderr(1, 0);
    EXPECT_EQ(*restored % kEvery, 0u);
  } else {
    EXPECT_EQ(codes.size(), 1u) << "the job restarted: " << Codes(codes);
  }
  if (restarts) {
    // The drill reports the step the ranks restored, no newer than the failure.
    EXPECT_EQ(NumberAfter(json, "\"restored_step\":"), restored) << report;
    const std::optional<uint64_t> at_failure = NumberAfter(json, "\"step_at_failure\":");
    ASSERT_TRUE(at_failure.has_value()) << report;
    EXPECT_LE(*restored, *at_failure) << report;
  }
  if (damaged) {
    EXPECT_NE(*restored, *damaged) << "the damaged step was restored";
  }
  if (c.scenario == "corrupt-memory") {
    // The step whose copy in memory was damaged is the one restored; the
    // rank's trainer caught the damage as it copied it out, and the rank
    // read the step from disk while the others read theirs from memory.
    EXPECT_EQ(NumberAfter(json, "\"damaged_step\":"), restored) << report;
    EXPECT_TRUE(VerdictHeld(json, "the damaged copy was detected and the rank read the step from disk")) << report;
    EXPECT_THAT(ReadFile(absl::StrCat(dir_, "/drill/", NodeOf(c.target), ".1.log")),
                HasSubstr(absl::StrCat("rank ", c.target, ": the copy of step ", *restored,
                                       " in the agent's memory failed the trainer's check")));
    std::optional<ckptd::v1::JobStatus> job = cluster->Job();
    ASSERT_TRUE(job.has_value());
    ASSERT_EQ(job->last_restore().step(), *restored);
    for (const auto& r : job->last_restore().ranks()) {
      // The others read theirs from memory when their agent still held it
      // as the restart began: one that took a newer snapshot before it heard
      // the step committed kept the older committed one instead (its log,
      // as the restarted trainer registered, lists the steps it held), and
      // read the step from disk.
      const bool held =
          r.rank() != c.target &&
          StepsHeldAtRestart(ReadFile(absl::StrCat(dir_, "/drill/", NodeOf(r.rank()), ".1.log")), r.rank())
              .contains(*restored);
      EXPECT_EQ(r.source(), held ? ckptd::v1::AGENT_MEMORY : ckptd::v1::STORAGE_ROOT) << "rank " << r.rank();
    }
  }
  EXPECT_EQ(supervisor.restarts(), kills_agent ? 1 : 0);
  EXPECT_EQ(launcher.final_lines(), reference);
  std::cerr << "scenario " << c.scenario << ": " << absl::FormatDuration(absl::Now() - start) << ", detection "
            << (detection ? absl::StrCat(*detection, " s") : "none") << ", exit codes " << Codes(codes)
            << (restored ? absl::StrCat(", restored step ", *restored) : "") << "\n";
}

// `ckptctl drill suite`: two drills from a file in one run of the job, one
// summary, one HTML page.
TEST_F(ClusterTest, DrillSuiteRunsItsDrillsInOrderAndSumsThemUp) {
  std::array<std::string, kWorld> reference;
  ASSERT_NO_FATAL_FAILURE(Reference(&reference));
  std::unique_ptr<Cluster> cluster = StartCluster(
      "suite", 0, {}, {"--every", std::to_string(kEvery), "--hang-floor", absl::FormatDuration(kHangFloor)},
      {"--allow-drills"});
  ASSERT_FALSE(HasFailure());
  Launcher launcher(dir_ + "/suite/launcher", cluster.get());
  launcher.Start();
  const std::string file = dir_ + "/suite/drills.txt";
  std::ofstream(file) << "# a storage fault, then a crash, in one run\n"
                         "storage-eio  --target 0 --at-step 40 --duration 1s --watch 30s\n"
                         "kill-trainer --target 2 --at-step 200 --watch 30s   # rank 2 is on node-b\n";
  const std::string page = dir_ + "/suite/report.html";
  Process ctl({kCtlBin, "drill", "suite", file, "--job", kJob, "--coordinator",
               absl::StrCat("127.0.0.1:", cluster->port()), "--token-file", cluster->token_file(), "--settle", "30s",
               "--json", "--html", page},
              dir_ + "/suite/ctl.json", dir_ + "/suite/ctl.err");
  const std::optional<int> code = ctl.Wait(absl::Seconds(90));
  const std::string json = ReadFile(dir_ + "/suite/ctl.json");
  const std::string report = absl::StrCat("stdout:\n", json, "stderr:\n", ReadFile(dir_ + "/suite/ctl.err"));
  ASSERT_EQ(code, 0) << report;
  EXPECT_THAT(json, HasSubstr("\"drills_passed\":2")) << report;
  EXPECT_THAT(json, HasSubstr("\"drills_not_run\":0")) << report;
  EXPECT_THAT(json, HasSubstr("\"spec\":\"storage-eio  --target 0 --at-step 40 --duration 1s --watch 30s\""));
  const std::string html = ReadFile(page);
  EXPECT_THAT(html, HasSubstr("2 of 2 drills passed"));
  EXPECT_THAT(html, HasSubstr("id=\"drill-2\""));
  EXPECT_THAT(html, HasSubstr("<svg"));
  ASSERT_TRUE(launcher.Join()) << "exit codes per attempt: " << Codes(launcher.exit_codes());
  // The storage fault restarted nothing; the crash restarted the job once.
  EXPECT_EQ(launcher.exit_codes().size(), 2u) << Codes(launcher.exit_codes());
  EXPECT_EQ(launcher.final_lines(), reference);
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, DrillTest,
    ::testing::Values(DrillCase{"kill-trainer", 2, 60, absl::ZeroDuration(), ckptd::v1::TRAINER_DIED},
                      DrillCase{"hang-trainer", 1, 60, absl::Seconds(5), ckptd::v1::TRAINER_HUNG},
                      DrillCase{"kill-agent", 2, 60, absl::ZeroDuration(), ckptd::v1::NODE_LOST},
                      DrillCase{"kill-node", 2, 60, absl::ZeroDuration(), ckptd::v1::TRAINER_DIED,
                                ckptd::v1::NODE_LOST, /*restart_agent_at_once=*/true},
                      DrillCase{"cut-off-agent", 3, 60, absl::Seconds(3), ckptd::v1::NODE_LOST},
                      DrillCase{"corrupt-shard", 3, 60, absl::ZeroDuration()},
                      DrillCase{"corrupt-memory", 1, 60, absl::ZeroDuration(), ckptd::v1::TRAINER_DIED},
                      DrillCase{"storage-eio", 0, 60, absl::Seconds(1)},
                      DrillCase{"storage-enospc", 2, 60, absl::Seconds(1)},
                      DrillCase{"storage-slow", 3, 60, absl::Seconds(1)}),
    [](const ::testing::TestParamInfo<DrillCase>& param) {
      std::string name = param.param.scenario;
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

}  // namespace
}  // namespace ckptd::cluster
