// The resume contract, end to end with real processes: a trainer killed with
// SIGKILL and restarted ends with the same digest as an uninterrupted run, and
// leaving any one of the five components out of the restore changes it.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "base/testing/eventually.h"
#include "base/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

// Starts `argv` with stdout to `out_path` (stderr to the test's); returns pid.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& out_path) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) ::dup2(fd, 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The last line without its timing: "final_step=<n> digest=<hex>".
std::string LastLine(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last.substr(0, last.find(" train_s="));
}

class DemoTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path();
    socket_ = dir_ + "/agent.sock";
    agent_ = Spawn({CKPTD_AGENT_BIN, "--storage-root", dir_ + "/root", "--socket", socket_, "--threads", "1"},
                   dir_ + "/agent.out");
    ASSERT_TRUE(ckptd::testing::Eventually([this] { return ::access(socket_.c_str(), F_OK) == 0; }, absl::Seconds(5)))
        << "agent did not start";
  }
  void TearDown() override {
    ::kill(agent_, SIGTERM);
    Wait(agent_);
  }

  std::vector<std::string> Trainer(const std::string& job, int step_ms, const std::string& skip = "") {
    std::vector<std::string> argv = {CKPTD_TRAINER_BIN, "--socket", socket_, "--job", job, "--steps", "60",
                                     "--state-mb", "1", "--every", "10", "--step-ms", std::to_string(step_ms),
                                     // 7 micro-batches per optimizer step: every snapshot (a
                                     // multiple of 10) lands mid-accumulation, so gradients matter.
                                     "--accum", "7"};
    if (!skip.empty()) {
      argv.push_back("--skip-restore");
      argv.push_back(skip);
    }
    return argv;
  }

  // Runs to the end; returns the digest line.
  std::string Run(const std::string& job, const std::string& skip = "") {
    const std::string out = dir_ + "/" + job + ".out";
    EXPECT_EQ(Wait(Spawn(Trainer(job, 0, skip), out)), 0);
    return LastLine(out);
  }

  // Starts a slow run, kills it once a step is committed, and resumes it.
  std::string KillAndResume(const std::string& job, const std::string& skip = "") {
    const pid_t pid = Spawn(Trainer(job, 25), dir_ + "/" + job + ".killed.out");
    const std::string committed = absl::StrCat(dir_, "/root/", job, "/step-20/MANIFEST");
    // Killed after at most 10 s all the same: the resume then starts earlier.
    (void)ckptd::testing::Eventually([&committed] { return ::access(committed.c_str(), F_OK) == 0; });
    ::kill(pid, SIGKILL);
    EXPECT_EQ(Wait(pid), 128 + SIGKILL) << "the trainer finished before it was killed";
    return Run(job, skip);
  }

  ckptd::testing::TempDir tmp_{"ckptd-demo-"};
  std::string dir_, socket_;
  pid_t agent_ = -1;
};

TEST_F(DemoTrainerTest, KilledAndResumedRunMatchesAnUninterruptedOne) {
  const std::string reference = Run("reference");
  ASSERT_THAT(reference, ::testing::StartsWith("final_step=60 digest="));
  EXPECT_EQ(KillAndResume("resumed"), reference);
}

TEST_F(DemoTrainerTest, EveryComponentIsNeededForTheSameResult) {
  const std::string reference = Run("reference");
  for (const char* component : {"PARAMS", "GRADS", "OPTIMIZER", "RNG", "DATA_CURSOR"}) {
    SCOPED_TRACE(component);
    EXPECT_NE(KillAndResume(absl::StrCat("skip-", component), component), reference);
  }
}

}  // namespace

// Issue 16, finding 9: the trainer's numbers are checked at the command line,
// never truncated (a rank of 2^32 was rank 0), wrapped, or left to abort.
namespace {

// Runs the trainer with `flags` (no agent: an unreachable socket); returns
// its exit code and stderr.
std::pair<int, std::string> RunTrainerWithFlags(const std::string& dir, std::vector<std::string> flags) {
  std::vector<std::string> argv = {CKPTD_TRAINER_BIN, "--socket", dir + "/no-agent.sock", "--job", "flags"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const std::string err_path = dir + "/flags.err";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) ::dup2(fd, 2);
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  const int code = Wait(pid);
  std::ifstream in(err_path);
  std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return {code, err};
}

TEST(DemoTrainerFlagsTest, NumbersOutsideTheirRangeAreUsageErrorsNamingTheFlag) {
  ckptd::testing::TempDir tmp("ckptd-demo-flags-");
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<std::string> small = {"--steps", "2", "--state-mb", "1"};
  auto with = [&small](std::vector<std::string> more) {
    more.insert(more.begin(), small.begin(), small.end());
    return more;
  };
  for (const Case& c : std::vector<Case>{
           {with({"--rank", "4294967296", "--world-size", "2"}),
            "--rank must be an integer in 0..1, got \"4294967296\""},
           {with({"--rank", "2", "--world-size", "2"}),
            "--rank must be an integer in 0..1, got \"2\" (--world-size is 2)"},
           {with({"--rank", "1"}), "--rank must be an integer in 0..0"},
           {with({"--world-size", "4294967295"}), "--world-size must be an integer in 1..1048576, got \"4294967295\""},
           {with({"--world-size", "4294967297"}), "--world-size must be an integer in 1..1048576"},
           {with({"--world-size", "0"}), "--world-size must be an integer in 1..1048576, got \"0\""},
           {{"--steps", "2", "--state-mb", "18446744073709551615"}, "--state-mb must be an integer in 1..65536"},
           {{"--steps", "2", "--state-mb", "17592186044416"}, "--state-mb must be an integer in 1..65536"},  // 2^44
           {{"--steps", "2", "--state-mb", "0"}, "--state-mb must be an integer in 1..65536, got \"0\""},
           {{"--steps", "18446744073709551615", "--state-mb", "1"},
            "--steps must be an integer in 1..4611686018427387904"},
           {with({"--step-ms", "18446744073709551615"}), "--step-ms must be an integer in 0..3600000"},
           {with({"--agent-wait-ms", "9223372036854775808"}), "--agent-wait-ms must be an integer in 0..86400000"},
           {with({"--accum", "0"}), "--accum must be an integer in 1..1000000, got \"0\""},
           {with({"--accum", "4294967297"}), "--accum must be an integer in 1..1000000"},
           {with({"--every", "-1"}), "--every must be an integer in 0..1099511627776, got \"-1\""},
           {with({"--skip-restore", "EVERYTHING"}), "--skip-restore must be one of"},
       }) {
    auto [code, err] = RunTrainerWithFlags(tmp.path(), c.flags);
    EXPECT_EQ(code, 2) << c.message << "\n" << err;
    EXPECT_THAT(err, ::testing::HasSubstr(c.message));
    EXPECT_THAT(err, ::testing::HasSubstr("usage: ckptd-demo-trainer"));
  }
  // The ends of the ranges run (without an agent: training without checkpoints).
  auto [code, err] = RunTrainerWithFlags(
      tmp.path(), with({"--rank", "1048575", "--world-size", "1048576", "--every", "0", "--accum", "1", "--step-ms",
                        "0", "--agent-wait-ms", "0"}));
  EXPECT_EQ(code, 0) << err;
}

}  // namespace
