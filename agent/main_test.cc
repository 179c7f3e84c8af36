// The ckptd-agent binary's metrics endpoint (--metrics-listen), end to end:
// the binary (CKPTD_AGENT_BINARY) run with its stderr in a file, /metrics,
// /healthz and /readyz over loopback, and the flag's errors.
#include <signal.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/host_port.h"
#include "base/testing/eventually.h"
#include "base/testing/http_get.h"
#include "base/testing/spawned_process.h"
#include "base/testing/temp_dir.h"
#include "base/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::ckptd::testing::Eventually;
using ::ckptd::testing::HttpBody;
using ::ckptd::testing::HttpGet;
using ::ckptd::testing::NumberAfter;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// ckptd-agent (CKPTD_AGENT_BINARY) run with `args`, its stderr and stdout
// in `log`; killed when the object goes.
class Agent {
 public:
  Agent(std::vector<std::string> args, std::string log) : process_(WithBinary(std::move(args)), std::move(log)) {}

  std::string Log() const { return process_.Log(); }
  // The exit code once it ends within `wait` (128 + signal); -1 while it runs.
  int Wait(absl::Duration wait) { return process_.Wait(wait); }

  // The metrics port once the agent serves its trainers (its log says
  // both); 0 when it ended first or took too long.
  int WaitServing() {
    int port = 0;
    (void)Eventually(
        [&] {
          const std::string log = Log();
          if (log.find("ckptd-agent: serving on unix:") != std::string::npos) {
            port = NumberAfter(log, "ckptd-agent: metrics on http://127.0.0.1:").value_or(0);
            return true;
          }
          return Wait(absl::ZeroDuration()) >= 0;
        },
        absl::Seconds(60), absl::Milliseconds(20));
    return port;
  }

  // SIGTERM, then the exit code (-1 if it did not stop within 30 s).
  int Stop() {
    if (process_.pid() > 0) ::kill(process_.pid(), SIGTERM);
    return Wait(absl::Seconds(30));
  }

 private:
  static std::vector<std::string> WithBinary(std::vector<std::string> args) {
    args.insert(args.begin(), CKPTD_AGENT_BINARY);
    return args;
  }

  ckptd::testing::SpawnedProcess process_;
};

class AgentMainTest : public ::testing::Test {
 protected:
  std::vector<std::string> Args(std::vector<std::string> more) {
    std::vector<std::string> args = {
        "--storage-root", dir_ + "/root", "--socket", dir_ + "/agent.sock", "--threads", "1", "--memory-budget", "64M"};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }

  ckptd::testing::TempDir tmp_{"ckptd-agent-main-"};
  const std::string dir_ = tmp_.path();
};

TEST_F(AgentMainTest, ServesMetricsHealthAndReadiness) {
  Agent agent(Args({"--metrics-listen", "127.0.0.1:0"}), dir_ + "/agent.log");
  const int port = agent.WaitServing();
  ASSERT_GT(port, 0) << agent.Log();

  const std::string metrics = HttpGet(port, "/metrics");
  EXPECT_THAT(metrics, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(metrics, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(metrics, HasSubstr(absl::StrCat("\nckptd_build_info{component=\"agent\",version=\"",
                                              ckptd::base::Version(), "\"} 1\n")));
  EXPECT_THAT(metrics, HasSubstr("\nckptd_agent_trainers 0\n"));
  EXPECT_THAT(metrics, HasSubstr("\nckptd_agent_memory_budget_bytes 67108864\n"));
  // The per-job families start with the job's first trainer here.
  EXPECT_THAT(metrics, ::testing::Not(HasSubstr("ckptd_agent_persist_seconds")));

  const std::string health = HttpGet(port, "/healthz");
  EXPECT_THAT(health, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(HttpBody(health), "ok\n");
  // No coordinator: ready once the trainers' socket is served.
  const std::string ready = HttpGet(port, "/readyz");
  EXPECT_THAT(ready, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(HttpBody(ready), "ready\n");
  EXPECT_EQ(agent.Stop(), 0) << agent.Log();
}

TEST_F(AgentMainTest, NotReadyWhileTheCoordinatorIsAway) {
  const int away = ckptd::base::FreeLoopbackPort();  // nothing listens there
  ASSERT_GT(away, 0);
  const std::string coordinator = absl::StrCat("127.0.0.1:", away);
  Agent agent(Args({"--metrics-listen", "127.0.0.1:0", "--coordinator", coordinator, "--node-id", "n1"}),
              dir_ + "/agent.log");
  const int port = agent.WaitServing();
  ASSERT_GT(port, 0) << agent.Log();
  // Once a registration failed, /readyz says so, with why.
  std::string ready;
  EXPECT_TRUE(Eventually([&] {
    ready = HttpGet(port, "/readyz");
    return HttpBody(ready) != absl::StrCat("not registered with the coordinator at ", coordinator, " yet\n");
  }));
  EXPECT_THAT(ready, StartsWith("HTTP/1.1 503 Service Unavailable\r\n"));
  EXPECT_THAT(HttpBody(ready), StartsWith(absl::StrCat("not registered with the coordinator at ", coordinator, ": ")));
  EXPECT_EQ(HttpBody(ready).find('\n'), HttpBody(ready).size() - 1) << "one line";
  // Alive all the same.
  EXPECT_THAT(HttpGet(port, "/healthz"), StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(HttpGet(port, "/metrics"), HasSubstr("\nckptd_agent_coordinator_connected 0\n"));
  EXPECT_EQ(agent.Stop(), 0) << agent.Log();
}

TEST_F(AgentMainTest, ABadMetricsAddressIsAUsageError) {
  for (const char* bad : {"nope", "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:"}) {
    SCOPED_TRACE(bad);
    Agent agent(Args({"--metrics-listen", bad}), dir_ + "/agent.log");
    EXPECT_EQ(agent.Wait(absl::Seconds(30)), 2);
    EXPECT_THAT(agent.Log(), HasSubstr("ckptd-agent: --metrics-listen: "));
  }
}

TEST_F(AgentMainTest, AMetricsPortInUseStopsTheAgentAtOnce) {
  Agent first(Args({"--metrics-listen", "127.0.0.1:0"}), dir_ + "/first.log");
  const int port = first.WaitServing();
  ASSERT_GT(port, 0) << first.Log();
  Agent second({"--storage-root", dir_ + "/root", "--socket", dir_ + "/second.sock", "--threads", "1",
                "--memory-budget", "64M", "--metrics-listen", absl::StrCat("127.0.0.1:", port)},
               dir_ + "/second.log");
  EXPECT_EQ(second.Wait(absl::Seconds(30)), 3);
  EXPECT_THAT(second.Log(), HasSubstr(absl::StrCat("ckptd-agent: --metrics-listen 127.0.0.1:", port, ": ")));
  // It served no trainer.
  EXPECT_THAT(second.Log(), ::testing::Not(HasSubstr("serving on unix:")));
  EXPECT_EQ(first.Stop(), 0) << first.Log();
}

}  // namespace
