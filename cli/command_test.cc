#include "cli/command.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::cli {
namespace {

using ::testing::ElementsAre;

// AddEnvironmentDefaults with `env` as the environment.
std::vector<std::string> WithEnv(const std::string& command, std::vector<std::string> argv,
                                 const std::map<std::string, std::string>& env) {
  AddEnvironmentDefaults(command, &argv, [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  return argv;
}

const std::map<std::string, std::string> kBoth = {{"CKPTD_COORDINATOR", "coord:7070"},
                                                   {"CKPTD_TOKEN_FILE", "/etc/ckptd/operator-token"}};

TEST(EnvironmentDefaultsTest, OnlineCommandsTakeTheCoordinatorAndTokenFile) {
  for (const char* command : {"status", "checkpoint", "list", "restore-plan"}) {
    EXPECT_THAT(WithEnv(command, {"--job", "j"}, kBoth),
                ElementsAre("--job", "j", "--coordinator", "coord:7070", "--token-file", "/etc/ckptd/operator-token"))
        << command;
  }
  EXPECT_THAT(WithEnv("drill", {"run", "--job", "j"}, kBoth),
              ElementsAre("run", "--job", "j", "--coordinator", "coord:7070", "--token-file",
                          "/etc/ckptd/operator-token"));
  EXPECT_THAT(WithEnv("verify", {"--job", "j"}, kBoth), ::testing::Contains("--coordinator"));
  EXPECT_THAT(WithEnv("interval", {"--job", "j"}, kBoth), ::testing::Contains("--coordinator"));
}

TEST(EnvironmentDefaultsTest, TheCommandLineWins) {
  EXPECT_THAT(WithEnv("status", {"--coordinator=other:1"}, kBoth),
              ElementsAre("--coordinator=other:1", "--token-file", "/etc/ckptd/operator-token"));
  EXPECT_THAT(WithEnv("list", {"--token-file", "mine", "--coordinator", "x:2"}, kBoth),
              ElementsAre("--token-file", "mine", "--coordinator", "x:2"));
}

TEST(EnvironmentDefaultsTest, OfflineUsesAndEmptyVariablesGetNothing) {
  // verify over --root, interval's calculation, the offline commands and a
  // drill without a subcommand stay as they were.
  EXPECT_THAT(WithEnv("verify", {"--root", "/ckpt"}, kBoth), ElementsAre("--root", "/ckpt"));
  EXPECT_THAT(WithEnv("interval", {"--mtbf", "4h"}, kBoth), ElementsAre("--mtbf", "4h"));
  for (const char* command : {"inspect", "export", "start-fresh", "plan"}) {
    EXPECT_THAT(WithEnv(command, {"x"}, kBoth), ElementsAre("x")) << command;
  }
  EXPECT_THAT(WithEnv("drill", {"--help"}, kBoth), ElementsAre("--help"));
  EXPECT_THAT(WithEnv("status", {}, {{"CKPTD_COORDINATOR", ""}}), ::testing::IsEmpty());
  EXPECT_THAT(WithEnv("status", {}, {}), ::testing::IsEmpty());
}

TEST(EnvironmentDefaultsTest, AddedBeforeTheEndOfTheFlags) {
  EXPECT_THAT(WithEnv("status", {"--json", "--", "--coordinator"}, {{"CKPTD_COORDINATOR", "c:1"}}),
              ElementsAre("--json", "--coordinator", "c:1", "--", "--coordinator"));
}

TEST(JobStateNameTest, AFinishedRunIsFinishedNotRunning) {
  ckptd::v1::JobStatus j;
  j.set_state(ckptd::v1::JOB_RUNNING);
  EXPECT_EQ(JobStateName(j), "running");
  j.set_finished(true);
  EXPECT_EQ(JobStateName(j), "finished");
  j.set_finished(false);
  j.set_state(ckptd::v1::JOB_RESTARTING);
  EXPECT_EQ(JobStateName(j), "restarting");
}

}  // namespace
}  // namespace ckptd::cli
