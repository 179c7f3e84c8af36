// Issue 16, item 3: with --trainer-group, trainers of other users in the group
// checkpoint through the agent, and a user outside it is refused but keeps
// training. End to end with the real binaries, as users of the test's own
// making (numbers that name no user and no group here, taken on by forked
// children, which only root can do): the agent runs as A, the trainers as B (in
// the group) and as C (not in it).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/testing/eventually.h"
#include "base/testing/temp_dir.h"
#include "base/testing/users.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::ckptd::testing::BecomeUser;
using ::ckptd::testing::Eventually;
using ::ckptd::testing::TestUser;
using ::ckptd::testing::UnusedIds;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The last line without its timing: "final_step=<n> digest=<hex>".
std::string LastLine(const std::string& text) {
  std::string last;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    if (end > begin) last = text.substr(begin, end - begin);
    begin = end + 1;
  }
  return last.substr(0, last.find(" train_s="));
}

// Starts `argv` as `user`, with stdout and stderr to `out_path` and
// `err_path` (made by root, before it becomes `user`); returns its pid. The
// child is killed when the test process dies, so none outlives a crashed test.
// With `more_threads`, the child's user may start only that many threads
// or processes more (RLIMIT_NPROC) once it is `user`.
pid_t SpawnAs(const TestUser& user, const std::vector<std::string>& argv, const std::string& out_path,
              const std::string& err_path, const std::vector<std::string>& env = {},
              std::optional<size_t> more_threads = std::nullopt) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) ::_exit(126);
  if (std::string why = BecomeUser(user); !why.empty()) {
    why += "\n";
    (void)!::write(2, why.data(), why.size());
    ::_exit(126);
  }
  if (more_threads.has_value()) {
    if (std::string why = ckptd::testing::LimitNewThreads(*more_threads); !why.empty()) {
      why += "\n";
      (void)!::write(2, why.data(), why.size());
      ::_exit(126);
    }
  }
  // After setuid, which clears it; exec of a binary that is not set-id keeps it.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(126);
  for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
  ::execv(args[0], args.data());
  ::_exit(127);
}

// The exit code of `pid` (128 + the signal that ended it), or nullopt when
// it is still running after `limit`: then it is killed.
std::optional<int> WaitWithin(pid_t pid, absl::Duration limit) {
  if (pid <= 0) return std::nullopt;  // fork failed
  int status = 0;
  pid_t done = 0;
  if (!Eventually([&] { return (done = ::waitpid(pid, &status, WNOHANG)) != 0; }, limit) || done != pid) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return std::nullopt;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// What a trainer run left: its exit code (-1 when it had to be killed), stderr and last line.
struct TrainerRun {
  int code = -1;
  std::string err;
  std::string last;
};

// Agent A and trainers B and C: A and B are members of group G, C is not.
class TrainerGroupEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run the agent and the trainers as users of its own making";
    const std::vector<uint32_t> ids = UnusedIds(4);
    if (ids.size() < 4) GTEST_SKIP() << "no 4 unused uids and gids in 61000..61999";
    g_ = ids[0];
    a_ = {ids[1], {ids[1], g_}};
    b_ = {ids[2], {ids[2], g_}};
    c_ = {ids[3], {ids[3]}};
    struct stat st;
    ASSERT_EQ(::stat("/dev/shm", &st), 0);
    // Every user must be able to create and reach segments in it.
    ASSERT_EQ(st.st_mode & 07777, 01777u) << "/dev/shm is not 1777";

    dir_ = tmp_.path();
    ASSERT_FALSE(dir_.empty());
    // Reachable by every user (the trainers find the socket below it), writable by root alone.
    ASSERT_EQ(::chmod(dir_.c_str(), 0711), 0) << std::strerror(errno);
    // C runs the trainer: the least of the users must reach the binary and the temp dir.
    const std::optional<int> probe = WaitWithin(
        SpawnAs(c_, {CKPTD_TRAINER_BIN, "--help"}, dir_ + "/probe.out", dir_ + "/probe.err"), absl::Seconds(30));
    if (probe != 0) {
      GTEST_SKIP() << "user " << c_.uid << " cannot run " << CKPTD_TRAINER_BIN << " here (exit " << probe.value_or(-1)
                   << "): " << ReadFile(dir_ + "/probe.err");
    }
    // The socket's folder: the agent's, which others may search but not change.
    run_dir_ = dir_ + "/run";
    socket_ = run_dir_ + "/agent.sock";
    root_ = dir_ + "/root";
    for (const std::string& d : {run_dir_, root_}) {
      ASSERT_EQ(::mkdir(d.c_str(), 0700), 0) << d << ": " << std::strerror(errno);
      ASSERT_EQ(::chown(d.c_str(), a_.uid, a_.groups[0]), 0) << d << ": " << std::strerror(errno);
    }
    ASSERT_EQ(::chmod(run_dir_.c_str(), 0711), 0);

    agent_err_ = dir_ + "/agent.err";
    agent_ = SpawnAs(a_,
                     {CKPTD_AGENT_BIN, "--storage-root", root_, "--socket", socket_, "--threads", "1",
                      "--trainer-group", std::to_string(g_)},
                     dir_ + "/agent.out", agent_err_);
    ASSERT_GT(agent_, 0);
    agent_pid_ = agent_;
    // Serving: it says so once its socket listens, for the group.
    bool exited = false;
    const bool serving = Eventually([&] {
      if (ReadFile(agent_err_).find("ckptd-agent: serving on unix:" + socket_) != std::string::npos) return true;
      int status = 0;
      exited = ::waitpid(agent_, &status, WNOHANG) == agent_;
      return exited;
    });
    if (exited) agent_ = -1;  // reaped: not to be signalled again
    ASSERT_TRUE(serving && !exited) << "the agent did not start:\n" << ReadFile(agent_err_);
  }

  void TearDown() override {
    StopAgent();
    // The staging of an agent that had to be killed: "ckptd-<its pid>-..." (a
    // clean stop removes its own). Only its: other tests may use the same uid.
    DIR* shm = agent_pid_ > 0 ? ::opendir("/dev/shm") : nullptr;
    if (shm == nullptr) return;
    const std::string prefix = absl::StrCat("ckptd-", agent_pid_, "-");
    while (const dirent* e = ::readdir(shm)) {
      const std::string path = absl::StrCat("/dev/shm/", e->d_name);
      struct stat st;
      if (absl::StartsWith(e->d_name, prefix) && ::lstat(path.c_str(), &st) == 0 && st.st_uid == a_.uid) {
        ::unlink(path.c_str());
      }
    }
    ::closedir(shm);
  }

  // Stops the agent (SIGTERM, then SIGKILL after 30 s); its exit code, or
  // nullopt when it had to be killed or was not running.
  std::optional<int> StopAgent() {
    if (agent_ <= 0) return std::nullopt;
    ::kill(agent_, SIGTERM);
    const std::optional<int> code = WaitWithin(agent_, absl::Seconds(30));
    agent_ = -1;
    return code;
  }

  // Runs the trainer as `user` for job `job` to step `steps`, a snapshot
  // every 10 steps. 7 micro-batches per optimizer step: a snapshot lands
  // mid-accumulation, so the gradients matter to a resumed run's result.
  // The trainers trust A to run the node's agent, as a cluster whose agent
  // runs as a user of its own tells them (CKPTD_TRUSTED_AGENT_UIDS), unless
  // `trust_agent` is false.
  TrainerRun Train(const TestUser& user, const std::string& name, const std::string& job, int steps,
                   const std::vector<std::string>& extra = {}, bool trust_agent = true,
                   const std::string& socket = "") {
    const std::string out = dir_ + "/" + name + ".out", err = dir_ + "/" + name + ".err";
    std::vector<std::string> args = {CKPTD_TRAINER_BIN, "--socket", socket.empty() ? socket_ : socket, "--job", job,
                                     "--steps", std::to_string(steps), "--state-mb", "1", "--every", "10",
                                     "--accum", "7"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<std::string> env;
    if (trust_agent) env.push_back(absl::StrCat("CKPTD_TRUSTED_AGENT_UIDS=", a_.uid));
    const pid_t pid = SpawnAs(user, args, out, err, env);
    TrainerRun run;
    run.code = WaitWithin(pid, absl::Seconds(60)).value_or(-1);
    run.err = ReadFile(err);
    run.last = LastLine(ReadFile(out));
    return run;
  }

  uint32_t g_ = 0;
  TestUser a_, b_, c_;
  ckptd::testing::TempDir tmp_{"ckptd-trainer-group-"};
  std::string dir_, run_dir_, socket_, root_, agent_err_;
  pid_t agent_ = -1;      // while it runs
  pid_t agent_pid_ = -1;  // the agent's pid, also once stopped
};

TEST_F(TrainerGroupEndToEndTest, TrainersOfTheGroupCheckpointAndOthersTrainWithout) {
  // The agent, user A, gave its socket to the group.
  struct stat st;
  ASSERT_EQ(::stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, a_.uid);
  EXPECT_EQ(st.st_gid, g_);
  EXPECT_EQ(st.st_mode & 0777, 0660u);

  // B, in the group, checkpoints through the agent: steps 10, 20 and 30.
  const TrainerRun first = Train(b_, "b-first", "group", 30);
  EXPECT_EQ(first.code, 0) << first.err;
  EXPECT_THAT(first.err, AllOf(Not(HasSubstr("checkpointing unavailable")), HasSubstr("3 snapshots")));
  EXPECT_THAT(first.last, StartsWith("final_step=30 digest="));
  const std::string manifest = root_ + "/group/step-30/MANIFEST";
  ASSERT_TRUE(Eventually([&] { return ::access(manifest.c_str(), F_OK) == 0; }))
      << "step 30 of user " << b_.uid << " was not committed\ntrainer:\n"
      << first.err << "agent:\n"
      << ReadFile(agent_err_);
  // Written by the agent's user.
  ASSERT_EQ(::stat(manifest.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, a_.uid);

  // B again: it resumes from step 30, which the agent restores into its staging.
  const TrainerRun resumed = Train(b_, "b-resumed", "group", 60);
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_THAT(resumed.err, AllOf(Not(HasSubstr("checkpointing unavailable")), HasSubstr("restored step 30"),
                                 HasSubstr("30 steps in"), HasSubstr("3 snapshots")));
  EXPECT_TRUE(Eventually([&] { return ::access((root_ + "/group/step-60/MANIFEST").c_str(), F_OK) == 0; }))
      << resumed.err << ReadFile(agent_err_);

  // C, not in the group, cannot connect to the socket: it trains all the same,
  // without checkpoints, and says why. Checkpointing is a weak dependency. The
  // refusal is final: no waiting for an agent that is up (--agent-wait-ms two
  // minutes; Train gives up on the trainer after one).
  const TrainerRun outsider = Train(c_, "c", "outsider", 60, {"--agent-wait-ms", "120000"});
  EXPECT_EQ(outsider.code, 0) << outsider.err;
  EXPECT_THAT(outsider.err, AllOf(HasSubstr("ckptd-demo-trainer: checkpointing unavailable"), HasSubstr(socket_),
                                  HasSubstr("is not open to this process"), HasSubstr("--trainer-group"),
                                  HasSubstr("Permission denied"), HasSubstr("60 steps in"), HasSubstr("0 snapshots")))
      << outsider.err;
  EXPECT_NE(::access((root_ + "/outsider").c_str(), F_OK), 0) << "the agent took a checkpoint of user " << c_.uid;
  // C trained from step 0 to 60 without a checkpoint; B's restored run ends in the same state.
  EXPECT_THAT(outsider.last, StartsWith("final_step=60 digest="));
  EXPECT_EQ(resumed.last, outsider.last);

  EXPECT_EQ(StopAgent(), 0) << ReadFile(agent_err_);
}

// A trainer that was not told to trust the agent's user refuses its socket,
// naming the owner, and trains on without checkpoints.
TEST_F(TrainerGroupEndToEndTest, ATrainerRefusesAnAgentOfAUserItDoesNotTrust) {
  const TrainerRun run = Train(b_, "b-untrusting", "untrusting", 20, {"--agent-wait-ms", "120000"},
                               /*trust_agent=*/false);
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_THAT(run.err, AllOf(HasSubstr("checkpointing unavailable"),
                             HasSubstr(absl::StrCat("the agent's socket ", socket_, " belongs to uid ", a_.uid)),
                             HasSubstr(absl::StrCat("CKPTD_TRUSTED_AGENT_UIDS=", a_.uid)), HasSubstr("0 snapshots")))
      << run.err;
  EXPECT_NE(::access((root_ + "/untrusting").c_str(), F_OK), 0);
  EXPECT_EQ(StopAgent(), 0) << ReadFile(agent_err_);
}

// Socket squatting on a shared node: in a folder every user may write to (as
// /tmp), user C takes the name trainers are told to use. The stock agent
// refuses to serve from such a folder, and B's trainer refuses C's socket,
// naming C, instead of sending C its state; it trains on without checkpoints.
TEST_F(TrainerGroupEndToEndTest, ASocketSquattedByAnotherUserIsRefused) {
  const std::string shared = dir_ + "/shared";
  ASSERT_EQ(::mkdir(shared.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);
  const std::string squatted = shared + "/ckptd.sock";
  // C's own agent there: refused, and says why.
  ASSERT_EQ(::mkdir((dir_ + "/c-root").c_str(), 0700), 0);
  ASSERT_EQ(::chown((dir_ + "/c-root").c_str(), c_.uid, c_.groups[0]), 0);
  const pid_t c_agent = SpawnAs(c_, {CKPTD_AGENT_BIN, "--storage-root", dir_ + "/c-root", "--socket", squatted},
                                dir_ + "/c-agent.out", dir_ + "/c-agent.err");
  EXPECT_EQ(WaitWithin(c_agent, absl::Seconds(30)), 3) << ReadFile(dir_ + "/c-agent.err");
  EXPECT_THAT(ReadFile(dir_ + "/c-agent.err"), HasSubstr("may be written by other users"));
  // C binds the name itself, as a server of its own would.
  const std::string bound = ckptd::testing::RunAs(c_, [&squatted] {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, squatted.data(), squatted.size());
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 8) != 0) {
      return std::string(std::strerror(errno));
    }
    return std::string("ok");
  });
  ASSERT_EQ(bound, "ok");
  const TrainerRun run = Train(b_, "b-squatted", "squatted", 20, {"--agent-wait-ms", "120000"},
                               /*trust_agent=*/true, squatted);
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_THAT(run.err, AllOf(HasSubstr("checkpointing unavailable"),
                             HasSubstr(absl::StrCat("the agent's socket ", squatted, " belongs to uid ", c_.uid)),
                             HasSubstr("0 snapshots")))
      << run.err;
  EXPECT_EQ(StopAgent(), 0) << ReadFile(agent_err_);
}

// An agent started where its user may start only a few more threads (the
// review's pids.max of 300 with the room spent) says so and exits 1 instead
// of aborting inside gRPC's server; with room for its threads it serves.
TEST_F(TrainerGroupEndToEndTest, AnAgentWithoutRoomForItsThreadsSaysSoAndExits) {
  const std::string run = dir_ + "/c-run";
  ASSERT_EQ(::mkdir(run.c_str(), 0700), 0) << std::strerror(errno);
  ASSERT_EQ(::chown(run.c_str(), c_.uid, c_.groups[0]), 0) << std::strerror(errno);
  const std::string c_root = dir_ + "/c-root";
  ASSERT_EQ(::mkdir(c_root.c_str(), 0700), 0) << std::strerror(errno);
  ASSERT_EQ(::chown(c_root.c_str(), c_.uid, c_.groups[0]), 0) << std::strerror(errno);
  const std::vector<std::string> argv = {CKPTD_AGENT_BIN, "--storage-root", c_root, "--socket", run + "/agent.sock"};
  const pid_t cramped = SpawnAs(c_, argv, dir_ + "/cramped.out", dir_ + "/cramped.err", {}, 8);
  const std::optional<int> code = WaitWithin(cramped, absl::Seconds(60));
  const std::string err = ReadFile(dir_ + "/cramped.err");
  EXPECT_EQ(code, std::optional<int>(1)) << err;
  EXPECT_THAT(err, HasSubstr("ckptd-agent: cannot start: cannot start a thread for the agent"));
  EXPECT_THAT(err, HasSubstr("RLIMIT_NPROC"));
  EXPECT_THAT(err, HasSubstr("of the 32 threads it needs to start could run"));

  const pid_t roomy = SpawnAs(c_, argv, dir_ + "/roomy.out", dir_ + "/roomy.err", {}, 64);
  ASSERT_GT(roomy, 0);
  const bool serving = Eventually(
      [&] { return ReadFile(dir_ + "/roomy.err").find("ckptd-agent: serving on unix:") != std::string::npos; });
  ::kill(roomy, SIGTERM);
  EXPECT_EQ(WaitWithin(roomy, absl::Seconds(30)), std::optional<int>(0));
  EXPECT_TRUE(serving) << ReadFile(dir_ + "/roomy.err");
}

}  // namespace
