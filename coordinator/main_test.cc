// Runs the real ckptd-coordinator binary: port 0, the port read from its
// stderr, gRPC and /metrics over loopback, SIGTERM, and a restart on the same
// state directory.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "ckptd/v1/coordinator.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "coordinator/testing_coordinator_process.h"
#include "rpc/grpc_status.h"
#include "rpc/operator_token.h"
#include "storage/posix_file_system.h"
#include "storage/store.h"
#include "storage/testing_data.h"

extern char** environ;

namespace ckptd::coordinator {
namespace {

using ::ckptd::coordinator::testing::HttpGet;

using Coordinator = ::ckptd::coordinator::testing::CoordinatorProcess;
using ::ckptd::coordinator::testing::NumberAfter;
using ::ckptd::coordinator::testing::ReadAll;

using ::ckptd::rpc::FromGrpcStatus;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kJob[] = "bin-job";

class CoordinatorBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ckptd-coord-bin-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    root_ = dir_ + "/root";
    state_ = dir_ + "/state";
  }
  void TearDown() override {
    const int rc = std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
    (void)rc;  // a temp dir left behind fails nothing
  }

  std::vector<std::string> Flags(std::vector<std::string> extra = {}) {
    std::vector<std::string> f = {"--listen",     "127.0.0.1:0",        "--storage-root", root_,
                                  "--state-dir",  state_,               "--metrics-listen", "127.0.0.1:0",
                                  "--every",      "5",                  "--heartbeat-interval", "100ms"};
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
  }

  // Runs the binary to completion; returns its exit code and output.
  std::pair<int, std::string> RunToEnd(std::vector<std::string> args) {
    Coordinator c(std::move(args), dir_ + "/run.log");
    EXPECT_TRUE(c.Exited(absl::Seconds(60)));
    return {c.exit_code(), c.Log()};
  }

  std::unique_ptr<ckptd::v1::Coordinator::Stub> Stub(int port) {
    return ckptd::v1::Coordinator::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }

  static void Deadline(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  }

  std::string dir_, root_, state_;
};

TEST_F(CoordinatorBinaryTest, ServesCommitsExportsMetricsStopsAndRecovers) {
  std::optional<uint64_t> committed_step;
  std::string agent_token;
  {
    Coordinator c(Flags(), dir_ + "/first.log");
    ASSERT_GT(c.pid(), 0);
    const int port = c.WaitForPort();
    ASSERT_GT(port, 0) << c.Log();
    ASSERT_GT(c.metrics_port(), 0) << c.Log();
    const std::string token_path = state_ + "/operator-token";
    EXPECT_THAT(c.Log(), HasSubstr(absl::StrCat("operator token written to ", token_path)));
    struct stat st;
    ASSERT_EQ(::stat(token_path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    CKPTD_ASSERT_OK_AND_ASSIGN(std::string token, rpc::ReadOperatorTokenFile(token_path));
    EXPECT_EQ(token.size(), 64u);
    // The agent token, generated beside it.
    const std::string agent_token_path = state_ + "/agent-token";
    EXPECT_THAT(c.Log(), HasSubstr(absl::StrCat("agent token written to ", agent_token_path)));
    ASSERT_EQ(::stat(agent_token_path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    CKPTD_ASSERT_OK_AND_ASSIGN(agent_token, rpc::ReadAgentTokenFile(agent_token_path));
    EXPECT_EQ(agent_token.size(), 64u);
    EXPECT_NE(agent_token, token);

    std::unique_ptr<ckptd::v1::Coordinator::Stub> stub = Stub(port);
    std::map<std::string, std::string> sessions;
    for (uint32_t rank = 0; rank < 2; ++rank) {
      const std::string node = absl::StrCat("node-", rank);
      ckptd::v1::RegisterAgentRequest req;
      req.set_node_id(node);
      ckptd::v1::RankInfo* r = req.add_ranks();
      r->set_job(kJob);
      r->set_rank(rank);
      r->set_world_size(2);
      r->set_pid(4000 + static_cast<int>(rank));
      grpc::ClientContext ctx;
      Deadline(&ctx);
      ctx.AddMetadata("authorization", absl::StrCat("Bearer ", agent_token));
      ckptd::v1::RegisterAgentResponse resp;
      ASSERT_THAT(FromGrpcStatus(stub->RegisterAgent(&ctx, req, &resp)), IsOk());
      EXPECT_EQ(resp.heartbeat_interval_ms(), 100u);
      sessions[node] = resp.session();
    }
    // Real shards in the binary's storage root, reported over gRPC.
    std::unique_ptr<storage::PosixFileSystem> fs = storage::NewPosixFileSystem();
    storage::CheckpointStore store(fs.get(), root_);
    CKPTD_ASSERT_OK(store.PrepareStep(kJob, 5));
    for (uint32_t rank = 0; rank < 2; ++rank) {
      ckptd::testing::RankData data = ckptd::testing::MakeRankData(5, rank, 256, 16);
      std::vector<storage::TensorSource> src = ckptd::testing::RankSources(data, "w", "rng");
      CKPTD_ASSERT_OK_AND_ASSIGN(storage::ShardWriteResult w, store.WriteShard(kJob, 5, rank, 2, src));
      ckptd::v1::ReportShardRequest req;
      req.set_node_id(absl::StrCat("node-", rank));
      req.set_session(sessions[req.node_id()]);
      req.mutable_report()->set_job(kJob);
      req.mutable_report()->set_step(5);
      req.mutable_report()->set_world_size(2);
      req.mutable_report()->set_stall_seconds(0.01);
      req.mutable_report()->mutable_shard()->set_rank(rank);
      req.mutable_report()->mutable_shard()->set_file_length(w.file_length);
      req.mutable_report()->mutable_shard()->set_index_xxh3(w.index_xxh3);
      req.mutable_report()->mutable_shard()->set_persist_seconds(0.2);
      grpc::ClientContext ctx;
      Deadline(&ctx);
      ctx.AddMetadata("authorization", absl::StrCat("Bearer ", agent_token));
      ckptd::v1::ReportShardResponse resp;
      ASSERT_THAT(FromGrpcStatus(stub->ReportShard(&ctx, req, &resp)), IsOk());
      EXPECT_EQ(resp.committed(), rank == 1);
    }
    CKPTD_ASSERT_OK_AND_ASSIGN(committed_step, store.LatestCommittedStep(kJob));
    EXPECT_EQ(committed_step, 5u);

    // The generated token is the one operator RPCs need.
    ckptd::v1::RequestCheckpointRequest manual;
    manual.set_job(kJob);
    for (const std::string& auth : {std::string("Bearer wrong"), absl::StrCat("Bearer ", token)}) {
      grpc::ClientContext ctx;
      Deadline(&ctx);
      ctx.AddMetadata("authorization", auth);
      ckptd::v1::RequestCheckpointResponse resp;
      const absl::Status s = FromGrpcStatus(stub->RequestCheckpoint(&ctx, manual, &resp));
      if (auth == "Bearer wrong") {
        EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("wrong")));
      } else {
        EXPECT_THAT(s, IsOk());
        EXPECT_GT(resp.target_step(), 0u);
      }
    }

    const std::string metrics = HttpGet(c.metrics_port(), "/metrics");
    EXPECT_THAT(metrics, HasSubstr("HTTP/1.1 200"));
    EXPECT_THAT(metrics, HasSubstr("ckptd_checkpoints_committed_total{job=\"bin-job\"} 1\n"));
    EXPECT_THAT(metrics, HasSubstr("ckptd_job_newest_committed_step{job=\"bin-job\"} 5\n"));
    EXPECT_THAT(metrics, HasSubstr("ckptd_agents_alive 2\n"));
    EXPECT_THAT(metrics, HasSubstr("ckptd_coordinator_is_leader 1\n"));  // a single coordinator always leads
    EXPECT_THAT(metrics, HasSubstr("ckptd_commit_latency_seconds_count{job=\"bin-job\"} 1\n"));
    EXPECT_THAT(HttpGet(c.metrics_port(), "/nope"), HasSubstr("HTTP/1.1 404"));

    EXPECT_EQ(c.Stop(), 0) << c.Log();
    EXPECT_THAT(c.Log(), HasSubstr("stopping"));
  }
  {
    // Same state directory, an operator-supplied token this time.
    const std::string token_file = dir_ + "/my-token";
    std::ofstream(token_file) << "my-operator-token\n";
    Coordinator c(Flags({"--operator-token-file", token_file}), dir_ + "/second.log");
    const int port = c.WaitForPort();
    ASSERT_GT(port, 0) << c.Log();
    EXPECT_THAT(c.Log(), ::testing::Not(HasSubstr("operator token written")));
    // The generated agent token is kept: agents that have it go on working.
    EXPECT_THAT(c.Log(), ::testing::Not(HasSubstr("agent token written")));
    EXPECT_THAT(rpc::ReadAgentTokenFile(state_ + "/agent-token"), ckptd::testing::IsOkAndHolds(agent_token));
    std::unique_ptr<ckptd::v1::Coordinator::Stub> stub = Stub(port);
    grpc::ClientContext ctx;
    Deadline(&ctx);
    ckptd::v1::GetClusterStatusResponse status;
    ASSERT_THAT(FromGrpcStatus(stub->GetClusterStatus(&ctx, ckptd::v1::GetClusterStatusRequest(), &status)), IsOk());
    ASSERT_EQ(status.jobs_size(), 1);
    EXPECT_EQ(status.jobs(0).job(), kJob);
    EXPECT_TRUE(status.jobs(0).has_committed());
    EXPECT_EQ(status.jobs(0).newest_committed_step(), 5u);
    EXPECT_EQ(status.jobs(0).checkpoints_committed(), 1u);
    EXPECT_EQ(status.jobs(0).schedule().every_steps(), 5u);

    // The supplied token passes authorization (the job has no live rank now).
    grpc::ClientContext manual_ctx;
    Deadline(&manual_ctx);
    manual_ctx.AddMetadata("authorization", "Bearer my-operator-token");
    ckptd::v1::RequestCheckpointRequest manual;
    manual.set_job(kJob);
    ckptd::v1::RequestCheckpointResponse resp;
    EXPECT_THAT(FromGrpcStatus(stub->RequestCheckpoint(&manual_ctx, manual, &resp)),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no live rank")));
    EXPECT_EQ(c.Stop(), 0) << c.Log();
  }
}

TEST_F(CoordinatorBinaryTest, HelpNamesEveryFlag) {
  auto [code, out] = RunToEnd({"--help"});
  EXPECT_EQ(code, 0);
  for (const char* flag : {"--listen", "--storage-root", "--state-dir", "--metrics-listen", "--heartbeat-interval",
                           "--node-lost-after", "--hang-floor", "--every", "--keep", "--step-deadline",
                           "--operator-token-file", "--agent-token-file", "--insecure-agents", "--tls-cert", "--tls-key", "--tls-ca", "--help",
                           "--initial-every", "--min-interval", "--max-interval", "--failure-rate",
                           "--failure-prior-weight", "--restart-guess", "--alternative-interval",
                           "--interval-hysteresis", "--decide-every", "--audit-log"}) {
    EXPECT_THAT(out, HasSubstr(flag));
  }
}

TEST_F(CoordinatorBinaryTest, BadCommandLinesExitWithUsage) {
  auto [unknown, out1] = RunToEnd(Flags({"--frobnicate"}));
  EXPECT_EQ(unknown, 2);
  EXPECT_THAT(out1, HasSubstr("unknown flag --frobnicate"));
  auto [missing, out2] = RunToEnd({"--listen", "127.0.0.1:0"});
  EXPECT_EQ(missing, 2);
  EXPECT_THAT(out2, HasSubstr("required"));
  auto [duration, out3] = RunToEnd(Flags({"--node-lost-after", "soon"}));
  EXPECT_EQ(duration, 2);
  EXPECT_THAT(out3, HasSubstr("--node-lost-after: \"soon\" is not a positive duration"));
  auto [tls, out4] = RunToEnd(Flags({"--tls-cert", "/nonexistent.pem"}));
  EXPECT_EQ(tls, 2);
  EXPECT_THAT(out4, HasSubstr("needs all of --tls-cert, --tls-key and --tls-ca"));
  auto [every, out5] = RunToEnd(Flags({"--every", "0"}));
  EXPECT_EQ(every, 2);
  EXPECT_THAT(out5, HasSubstr("--every"));
  struct Case {
    std::vector<std::string> flags;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--initial-every", "7"}, "--every and --initial-every exclude each other"},  // Flags() has --every
           {{"--failure-rate", "-1"}, "--failure-rate: \"-1\" is not a number in (0, 1000]"},
           {{"--failure-rate", "nan"}, "--failure-rate: \"nan\" is not a number"},
           {{"--failure-prior-weight", "0"}, "--failure-prior-weight: \"0\" is not a number"},
           {{"--interval-hysteresis", "x"}, "--interval-hysteresis: \"x\" is not a number"},
           {{"--min-interval", "2h", "--max-interval", "1h"}, "--min-interval is longer than --max-interval"},
           {{"--max-interval", "-1s"}, "--max-interval: \"-1s\" is not a duration"},
           {{"--restart-guess", "0s"}, "--restart-guess: \"0s\" is not a positive duration"},
       }) {
    auto [code, out] = RunToEnd(Flags(c.flags));
    EXPECT_EQ(code, 2) << c.message;
    EXPECT_THAT(out, HasSubstr(c.message));
  }
}

TEST_F(CoordinatorBinaryTest, StateThatIsNotADatabaseFailsClearly) {
  ASSERT_EQ(::mkdir(state_.c_str(), 0700), 0);
  std::ofstream(state_ + "/coordinator.db") << std::string(8192, 'x');
  auto [code, out] = RunToEnd(Flags());
  EXPECT_EQ(code, 1);
  EXPECT_THAT(out, HasSubstr("ckptd-coordinator: state database: "));
  EXPECT_THAT(out, HasSubstr("coordinator.db"));
}

TEST_F(CoordinatorBinaryTest, PortInUseExitsUnavailable) {
  Coordinator first(Flags(), dir_ + "/first.log");
  const int port = first.WaitForPort();
  ASSERT_GT(port, 0) << first.Log();
  auto [code, out] = RunToEnd({"--listen", absl::StrCat("127.0.0.1:", port), "--storage-root", root_, "--state-dir",
                               dir_ + "/state2"});
  EXPECT_EQ(code, 3);
  EXPECT_THAT(out, HasSubstr("cannot listen"));
  EXPECT_EQ(first.Stop(), 0);
}

// Issue 16, finding 7: a second coordinator on a state directory in use is
// refused before it touches anything there, and the first one goes on.
TEST_F(CoordinatorBinaryTest, ASecondCoordinatorOnTheSameStateDirIsRefusedAndLeavesTheTokenAlone) {
  Coordinator a(Flags(), dir_ + "/a.log");
  const int port = a.WaitForPort();
  ASSERT_GT(port, 0) << a.Log();
  const std::string token_path = state_ + "/operator-token";
  const std::string token_file = ReadAll(token_path);
  ASSERT_EQ(token_file.size(), 65u) << token_file;
  struct stat before;
  ASSERT_EQ(::stat(token_path.c_str(), &before), 0);
  const std::string agent_token_path = state_ + "/agent-token";
  const std::string agent_token_file = ReadAll(agent_token_path);
  ASSERT_EQ(agent_token_file.size(), 65u) << agent_token_file;
  struct stat agent_before;
  ASSERT_EQ(::stat(agent_token_path.c_str(), &agent_before), 0);

  // B: the same state directory, ports of its own.
  auto [code, out] = RunToEnd(Flags());
  EXPECT_EQ(code, 3) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("ckptd-coordinator: state directory: the state directory ", state_,
                                          " is in use by another ckptd-coordinator (pid ", a.pid(), ")")));
  EXPECT_THAT(out, HasSubstr(state_ + "/coordinator.lock"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("listening on")));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("operator token written")));
  // A's token file is byte for byte (and inode for inode) what it was.
  EXPECT_EQ(ReadAll(token_path), token_file);
  struct stat after;
  ASSERT_EQ(::stat(token_path.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_EQ(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
  EXPECT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
  EXPECT_EQ(ReadAll(agent_token_path), agent_token_file);
  struct stat agent_after;
  ASSERT_EQ(::stat(agent_token_path.c_str(), &agent_after), 0);
  EXPECT_EQ(agent_after.st_ino, agent_before.st_ino);
  EXPECT_EQ(agent_after.st_mtim.tv_nsec, agent_before.st_mtim.tv_nsec);
  struct stat lock;
  ASSERT_EQ(::stat((state_ + "/coordinator.lock").c_str(), &lock), 0);
  EXPECT_EQ(lock.st_mode & 0777, 0600u);

  // A still serves, and its token still authorizes operator RPCs.
  std::unique_ptr<ckptd::v1::Coordinator::Stub> stub = Stub(port);
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    ckptd::v1::GetClusterStatusResponse status;
    EXPECT_THAT(FromGrpcStatus(stub->GetClusterStatus(&ctx, ckptd::v1::GetClusterStatusRequest(), &status)), IsOk());
  }
  for (const std::string& auth : {std::string("Bearer wrong"), absl::StrCat("Bearer ", token_file.substr(0, 64))}) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    ctx.AddMetadata("authorization", auth);
    ckptd::v1::RequestCheckpointRequest req;
    req.set_job(kJob);
    ckptd::v1::RequestCheckpointResponse resp;
    const absl::Status s = FromGrpcStatus(stub->RequestCheckpoint(&ctx, req, &resp));
    if (auth == "Bearer wrong") {
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("wrong")));
    } else {
      EXPECT_NE(s.code(), absl::StatusCode::kPermissionDenied) << s;
      EXPECT_NE(s.code(), absl::StatusCode::kUnauthenticated) << s;
      EXPECT_NE(s.code(), absl::StatusCode::kUnavailable) << s;
    }
  }
  EXPECT_EQ(a.Stop(), 0) << a.Log();

  // Once A is gone the directory is free (and the lock names the new holder).
  Coordinator c(Flags(), dir_ + "/c.log");
  ASSERT_GT(c.WaitForPort(), 0) << c.Log();
  EXPECT_EQ(ReadAll(state_ + "/coordinator.lock"), absl::StrCat(c.pid(), "\n"));
  EXPECT_EQ(c.Stop(), 0) << c.Log();
}

// Issue 16, finding 7: a coordinator that cannot bind its gRPC or its metrics
// port leaves the token file of the state directory as it was.
TEST_F(CoordinatorBinaryTest, ACoordinatorThatCannotBindLeavesTheTokenFileAsItWas) {
  {
    Coordinator first(Flags(), dir_ + "/first.log");
    ASSERT_GT(first.WaitForPort(), 0) << first.Log();
    ASSERT_EQ(first.Stop(), 0) << first.Log();
  }
  const std::string token_path = state_ + "/operator-token";
  const std::string token_file = ReadAll(token_path);
  ASSERT_EQ(token_file.size(), 65u) << token_file;

  // Another coordinator, on directories of its own, holds both ports.
  Coordinator other({"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--storage-root",
                     dir_ + "/other-root", "--state-dir", dir_ + "/other-state"},
                    dir_ + "/other.log");
  const int grpc_port = other.WaitForPort();
  ASSERT_GT(grpc_port, 0) << other.Log();
  ASSERT_GT(other.metrics_port(), 0) << other.Log();
  const std::string grpc_taken = absl::StrCat("127.0.0.1:", grpc_port);
  const std::string metrics_taken = absl::StrCat("127.0.0.1:", other.metrics_port());

  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{"--listen", grpc_taken, "--storage-root", root_, "--state-dir", state_},
            absl::StrCat("--listen ", grpc_taken)},
           {{"--listen", grpc_taken, "--metrics-listen", "127.0.0.1:0", "--storage-root", root_, "--state-dir",
             state_},
            absl::StrCat("--listen ", grpc_taken)},
           {{"--listen", "127.0.0.1:0", "--metrics-listen", metrics_taken, "--storage-root", root_, "--state-dir",
             state_},
            absl::StrCat("--metrics-listen ", metrics_taken)},
       }) {
    auto [code, out] = RunToEnd(c.flags);
    EXPECT_EQ(code, 3) << out;
    EXPECT_THAT(out, HasSubstr(c.says));
    EXPECT_THAT(out, ::testing::Not(HasSubstr("operator token written")));
    EXPECT_EQ(ReadAll(token_path), token_file) << c.says;
  }
  // On a fresh state directory, a coordinator that cannot bind writes no agent token at all.
  const std::string fresh_state = dir_ + "/fresh-state";
  auto [code, out] = RunToEnd({"--listen", grpc_taken, "--storage-root", root_, "--state-dir", fresh_state});
  EXPECT_EQ(code, 3) << out;
  EXPECT_THAT(out, ::testing::Not(HasSubstr("agent token written")));
  EXPECT_NE(::access((fresh_state + "/agent-token").c_str(), F_OK), 0);
  EXPECT_NE(::access((fresh_state + "/operator-token").c_str(), F_OK), 0);
  EXPECT_EQ(other.Stop(), 0) << other.Log();
}

// Issue 16: agent RPCs need the node credential; the agent token is written
// once both ports are bound, and --insecure-agents is a loud, explicit opt-out.
TEST_F(CoordinatorBinaryTest, AgentRpcsNeedTheAgentTokenUnlessInsecureAgents) {
  const std::string agent_token_path = state_ + "/agent-token";
  auto register_node = [&](int port, const std::string& authorization) {
    std::unique_ptr<ckptd::v1::Coordinator::Stub> stub = Stub(port);
    ckptd::v1::RegisterAgentRequest req;
    req.set_node_id("node-0");
    ckptd::v1::RankInfo* r = req.add_ranks();
    r->set_job(kJob);
    r->set_world_size(1);
    r->set_pid(4000);
    grpc::ClientContext ctx;
    Deadline(&ctx);
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    ckptd::v1::RegisterAgentResponse resp;
    return FromGrpcStatus(stub->RegisterAgent(&ctx, req, &resp));
  };
  {
    // A token of the operator's choosing.
    const std::string agent_file = dir_ + "/agent-secret";
    std::ofstream(agent_file) << "my-agent-token\n";
    Coordinator c(Flags({"--agent-token-file", agent_file}), dir_ + "/token.log");
    const int port = c.WaitForPort();
    ASSERT_GT(port, 0) << c.Log();
    EXPECT_THAT(c.Log(), ::testing::Not(HasSubstr("agent token written")));
    EXPECT_THAT(c.Log(), ::testing::Not(HasSubstr("--insecure-agents: agent RPCs need no credential")));
    EXPECT_NE(::access(agent_token_path.c_str(), F_OK), 0);
    EXPECT_THAT(register_node(port, ""),
                StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("ckptd-agent --agent-token-file")));
    EXPECT_THAT(register_node(port, "Bearer wrong"),
                StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("agent token is wrong")));
    // The operator token it generated is no agent credential.
    CKPTD_ASSERT_OK_AND_ASSIGN(std::string operator_token, rpc::ReadOperatorTokenFile(state_ + "/operator-token"));
    EXPECT_THAT(register_node(port, absl::StrCat("Bearer ", operator_token)),
                StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("agent token is wrong")));
    EXPECT_THAT(register_node(port, "Bearer my-agent-token"), IsOk());
    EXPECT_EQ(c.Stop(), 0) << c.Log();
  }
  {
    Coordinator c(Flags({"--insecure-agents"}), dir_ + "/insecure.log");
    const int port = c.WaitForPort();
    ASSERT_GT(port, 0) << c.Log();
    EXPECT_THAT(c.Log(), HasSubstr(absl::StrCat("WARNING ckptd-coordinator: --insecure-agents: agent RPCs need no "
                                                "credential; anyone who can reach port ",
                                                port, " can register nodes, report failures and restart jobs")));
    EXPECT_NE(::access(agent_token_path.c_str(), F_OK), 0);
    EXPECT_THAT(register_node(port, ""), IsOk());
    EXPECT_EQ(c.Stop(), 0) << c.Log();
  }
  // Excluding and bad flags are usage errors, before anything is written.
  auto [both, out1] = RunToEnd(Flags({"--insecure-agents", "--agent-token-file", dir_ + "/agent-secret"}));
  EXPECT_EQ(both, 2);
  EXPECT_THAT(out1, HasSubstr("--insecure-agents and --agent-token-file exclude each other"));
  auto [missing, out2] = RunToEnd(Flags({"--agent-token-file", dir_ + "/nope"}));
  EXPECT_EQ(missing, 2);
  EXPECT_THAT(out2, HasSubstr(absl::StrCat("--agent-token-file: open agent token file ", dir_, "/nope")));
  std::ofstream(dir_ + "/same") << "one-token-for-all\n";
  auto [same, out3] =
      RunToEnd(Flags({"--agent-token-file", dir_ + "/same", "--operator-token-file", dir_ + "/same"}));
  EXPECT_EQ(same, 2);
  EXPECT_THAT(out3, HasSubstr("the agent token and the operator token are the same"));
  EXPECT_NE(::access(agent_token_path.c_str(), F_OK), 0);
}

TEST_F(CoordinatorBinaryTest, TheAuditLogGetsARecordPerRegistrationAndRefusesALink) {
  const std::string audit = dir_ + "/audit.jsonl";
  {
    Coordinator c(Flags({"--insecure-agents", "--audit-log", audit}), dir_ + "/audit.log");
    const int port = c.WaitForPort();
    ASSERT_GT(port, 0) << c.Log();
    EXPECT_THAT(c.Log(), HasSubstr(absl::StrCat("ckptd-coordinator: audit log ", audit)));
    std::unique_ptr<ckptd::v1::Coordinator::Stub> stub = Stub(port);
    ckptd::v1::RegisterAgentRequest req;
    req.set_node_id("node-0");
    grpc::ClientContext ctx;
    Deadline(&ctx);
    ckptd::v1::RegisterAgentResponse resp;
    ASSERT_THAT(FromGrpcStatus(stub->RegisterAgent(&ctx, req, &resp)), IsOk());
    EXPECT_EQ(c.Stop(), 0) << c.Log();
    EXPECT_THAT(c.Log(), HasSubstr("ckptd-coordinator: audit: {"));
  }
  std::ifstream in(audit);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_THAT(line, HasSubstr("\"action\":\"RegisterAgent\""));
  EXPECT_THAT(line, HasSubstr("\"credential\":\"insecure-agents\""));
  EXPECT_THAT(line, HasSubstr("\"node\":\"node-0\""));
  struct stat st;
  ASSERT_EQ(::stat(audit.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u);

  const std::string link = dir_ + "/audit-link.jsonl";
  ASSERT_EQ(::symlink(audit.c_str(), link.c_str()), 0);
  auto [code, out] = RunToEnd(Flags({"--insecure-agents", "--audit-log", link}));
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr(absl::StrCat("ckptd-coordinator: --audit-log: audit log ", link, " is a symbolic link")));
  auto [dir_code, dir_out] = RunToEnd(Flags({"--insecure-agents", "--audit-log", dir_}));
  EXPECT_EQ(dir_code, 2);
  EXPECT_THAT(dir_out, HasSubstr("is not a regular file"));
}

}  // namespace
}  // namespace ckptd::coordinator
