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
#include "absl/time/clock.h"
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
    for (int i = 0; i < 500 && ::access(socket_.c_str(), F_OK) != 0; ++i) absl::SleepFor(absl::Milliseconds(10));
    ASSERT_EQ(::access(socket_.c_str(), F_OK), 0) << "agent did not start";
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
    for (int i = 0; i < 1000 && ::access(committed.c_str(), F_OK) != 0; ++i) absl::SleepFor(absl::Milliseconds(10));
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
