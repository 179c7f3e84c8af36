// ckptctl's live calls against a coordinator served in-process on loopback.
#include "cli/remote.h"

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/testing/json_checker.h"
#include "base/testing/matchers.h"
#include "cli/command.h"
#include "cli/interval_commands.h"
#include "cli/operator_commands.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/state_store.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "storage/mem_file_system.h"
#include "storage/store.h"

namespace ckptd::cli {
namespace {

using ::ckptd::testing::IsValidJson;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr char kToken[] = "s3cret-operator-token";

coordinator::CoordinatorServiceOptions ServiceOptions() {
  coordinator::CoordinatorServiceOptions o;
  o.operator_token = kToken;
  return o;
}

std::string WriteFile(absl::string_view name, absl::string_view contents) {
  // Named after the test: ctest runs tests side by side.
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string path = absl::StrCat(::testing::TempDir(), "/", t->test_suite_name(), ".", t->name(), ".", name);
  std::ofstream(path) << contents;
  return path;
}

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

Result RunCli(int (*run)(const std::vector<std::string>&, const CoordinatorApiFactory&, std::ostream&, std::ostream&,
                      const OperatorEnv&),
           const std::vector<std::string>& argv) {
  std::ostringstream out, err;
  Result r;
  r.code = run(argv, NewRemoteCoordinatorApi, out, err, OperatorEnv());
  r.out = out.str();
  r.err = err.str();
  return r;
}

class RemoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CKPTD_ASSERT_OK(core_.Recover());
    absl::StatusOr<coordinator::CoordinatorServer> s =
        coordinator::StartCoordinatorServer("127.0.0.1:0", &service_, grpc::InsecureServerCredentials());
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    ckptd::v1::RegisterAgentRequest req;
    req.set_node_id("node-a");
    ckptd::v1::RankInfo* r = req.add_ranks();
    r->set_job("llm");
    r->set_rank(0);
    r->set_world_size(1);
    r->set_pid(42);
    ASSERT_TRUE(core_.RegisterAgent(req).ok());
  }
  void TearDown() override { coordinator::ShutdownCoordinatorServer(server_.server.get()); }

  base::Args Flags(const std::string& address) {
    absl::StatusOr<base::Args> a = base::Args::Parse({"--coordinator", address}, CoordinatorValueFlags(), {});
    EXPECT_TRUE(a.ok());
    return *a;
  }
  std::string Address() const { return absl::StrCat("127.0.0.1:", server_.port); }

  storage::MemFileSystem fs_;
  storage::CheckpointStore store_{&fs_, "/ckpt"};
  std::unique_ptr<coordinator::StateStore> state_ = coordinator::NewMemStateStore();
  base::RealClock clock_;
  coordinator::CoordinatorCore core_{&store_, state_.get(), &clock_, coordinator::CoordinatorOptions()};
  coordinator::CoordinatorService service_{&core_, ServiceOptions()};
  coordinator::CoordinatorServer server_;
};

TEST_F(RemoteTest, FetchesTheLiveIntervalOfAJob) {
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::IntervalStatus st, FetchInterval(Flags(Address()), "llm"));
  EXPECT_EQ(st.job(), "llm");
  EXPECT_TRUE(st.automatic());
  EXPECT_FALSE(st.decided());
  EXPECT_THAT(st.waiting_for(), HasSubstr("committed checkpoint"));
  EXPECT_EQ(st.gpus(), 1u);
  EXPECT_THAT(FetchInterval(Flags(Address()), "other"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no job")));
  EXPECT_THAT(FetchInterval(Flags(Address()), "../x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name")));

  // The command end to end.
  std::ostringstream out, err;
  EXPECT_EQ(RunInterval({"--job", "llm", "--coordinator", Address()}, out, err, FetchInterval), base::kExitOk) << err.str();
  EXPECT_THAT(out.str(), AllOf(HasSubstr("job llm"), HasSubstr("waiting for")));
}

TEST_F(RemoteTest, UnreachableCoordinatorAndBadFlagsAreTold) {
  // Nothing listens on the port the server had before it stopped.
  const std::string gone = Address();
  coordinator::ShutdownCoordinatorServer(server_.server.get());
  absl::Status s = FetchInterval(Flags(gone), "llm").status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr(gone)));
  EXPECT_EQ(ExitCodeFor(s), base::kExitUnavailable);
  std::ostringstream out, err;
  EXPECT_EQ(RunInterval({"--job", "llm", "--coordinator", gone}, out, err, FetchInterval), base::kExitUnavailable);
  EXPECT_THAT(err.str(), HasSubstr(gone));

  absl::StatusOr<base::Args> half = base::Args::Parse({"--coordinator", gone, "--tls-ca", "ca.pem"}, CoordinatorValueFlags(), {});
  ASSERT_TRUE(half.ok());
  EXPECT_THAT(FetchInterval(*half, "llm"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls-cert")));
  absl::StatusOr<base::Args> files = base::Args::Parse(
      {"--coordinator", gone, "--tls-ca", "/no/ca.pem", "--tls-cert", "/no/c.pem", "--tls-key", "/no/k.pem"},
      CoordinatorValueFlags(), {});
  ASSERT_TRUE(files.ok());
  EXPECT_THAT(FetchInterval(*files, "llm"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/no/")));
  EXPECT_EQ(ExitCodeFor(absl::NotFoundError("x")), base::kExitFailed);
}

TEST_F(RemoteTest, StatusEndToEnd) {
  Result r = RunCli(RunStatus, {"--coordinator", Address()});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr(absl::StrCat("coordinator ", Address())), HasSubstr("agents: 1 (1 alive)"),
                           HasSubstr("node-a"), HasSubstr("llm 0"), HasSubstr("jobs: 1"),
                           HasSubstr("recent failures: none")));
  EXPECT_THAT(r.out, HasSubstr("waiting"));  // no interval decided before a committed checkpoint

  r = RunCli(RunStatus, {"--coordinator", Address(), "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"count\":1"), HasSubstr("\"node_id\":\"node-a\""),
                           HasSubstr("\"job\":\"llm\""), HasSubstr("\"state\":\"running\""),
                           HasSubstr("\"ranks_alive\":1"), HasSubstr("\"newest_committed_step\":null"),
                           HasSubstr("\"decided\":false")));

  r = RunCli(RunStatus, {"--coordinator", Address(), "--job", "other"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("no job other"));
}

// A status larger than one gRPC message (4 MiB by default) comes in pages;
// ckptctl reads them all.
TEST_F(RemoteTest, AStatusOfManyPagesIsReadWhole) {
  for (int n = 0; n < 80; ++n) {
    ckptd::v1::RegisterAgentRequest req;
    req.set_node_id(absl::StrCat("big-", 100 + n));
    for (int g = 0; g < 256; ++g) req.add_gpus(std::string(128, 'g'));
    for (uint32_t rank = 0; rank < 1024; ++rank) {
      ckptd::v1::RankInfo* r = req.add_ranks();
      r->set_job(absl::StrCat("job-", n));
      r->set_rank(rank);
      r->set_world_size(1024);
      r->set_pid(static_cast<int>(1000 + rank));
    }
    ASSERT_TRUE(core_.RegisterAgent(req).ok());
  }
  ASSERT_GT(core_.ClusterStatus().ByteSizeLong(), size_t{4} << 20);
  ckptd::v1::GetClusterStatusRequest first;
  ASSERT_FALSE(core_.ClusterStatusPage(first).next_agents_after().empty());
  const Result r = RunCli(RunStatus, {"--coordinator", Address(), "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"count\":81"), HasSubstr("\"node_id\":\"big-100\""),
                           HasSubstr("\"node_id\":\"big-179\""), HasSubstr("\"node_id\":\"node-a\"")));
}

TEST_F(RemoteTest, CheckpointNoWaitEndToEnd) {
  const std::string token = WriteFile("remote-token", absl::StrCat("  ", kToken, "\n"));
  Result r = RunCli(RunCheckpoint, {"--coordinator", Address(), "--job", "llm", "--no-wait", "--token-file", token});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  // No step time known yet: ten steps ahead of the fastest rank (step 0).
  EXPECT_THAT(r.out, HasSubstr("job llm at step 10"));
  r = RunCli(RunCheckpoint,
          {"--coordinator", Address(), "--job", "llm", "--no-wait", "--token-file", token, "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"outcome\":\"requested\""), HasSubstr("\"target_step\":10")));
  // The schedule carries the target.
  r = RunCli(RunStatus, {"--coordinator", Address(), "--json"});
  EXPECT_THAT(r.out, HasSubstr("\"extra_steps\":[10]"));

  r = RunCli(RunCheckpoint, {"--coordinator", Address(), "--job", "nope", "--no-wait", "--token-file", token});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("no job nope"));
  r = RunCli(RunCheckpoint, {"--coordinator", Address(), "--job", "../x", "--no-wait", "--token-file", token});
  EXPECT_EQ(r.code, base::kExitUsage);
}

TEST_F(RemoteTest, TheOperatorTokenIsCheckedEndToEnd) {
  // Wrong token: PermissionDenied, naming the file.
  const std::string wrong = WriteFile("wrong-token", "not-the-token\n");
  Result r = RunCli(RunCheckpoint, {"--coordinator", Address(), "--job", "llm", "--no-wait", "--token-file", wrong});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, AllOf(HasSubstr("the operator token is wrong"), HasSubstr(wrong), HasSubstr("--token-file")));
  EXPECT_THAT(r.out, IsEmpty());
  // No token: Unauthenticated, saying to pass one.
  r = RunCli(RunCheckpoint, {"--coordinator", Address(), "--job", "llm", "--no-wait"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, AllOf(HasSubstr("needs the operator token"), HasSubstr("pass --token-file")));
  // A token file that is not there: a usage error before any call.
  r = RunCli(RunCheckpoint,
          {"--coordinator", Address(), "--job", "llm", "--no-wait", "--token-file", "/no/such/operator-token"});
  EXPECT_EQ(r.code, base::kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("/no/such/operator-token"));
  // Read-only RPCs carry no token and need none.
  EXPECT_EQ(RunCli(RunStatus, {"--coordinator", Address(), "--token-file", wrong}).code, base::kExitOk);
}

TEST_F(RemoteTest, ListRestorePlanAndVerifyOfAJobWithoutCheckpoints) {
  Result r = RunCli(RunList, {"--coordinator", Address(), "--job", "llm"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_EQ(r.out, "job llm: no steps\n");
  r = RunCli(RunList, {"--coordinator", Address(), "--job", "other"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("no job other"));

  r = RunCli(RunRestorePlan, {"--coordinator", Address(), "--job", "llm", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"fresh_start\":true"), HasSubstr("\"step\":null"),
                           HasSubstr("\"state\":\"running\"")));

  const std::string token = WriteFile("verify-token", kToken);
  r = RunCli(RunOnlineVerify, {"--coordinator", Address(), "--job", "llm", "--token-file", token});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("no committed step"));
  r = RunCli(RunOnlineVerify, {"--coordinator", Address(), "--job", "llm"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("pass --token-file"));
}

TEST_F(RemoteTest, OperatorCommandsSayWhenTheCoordinatorIsUnreachable) {
  const std::string gone = Address();
  coordinator::ShutdownCoordinatorServer(server_.server.get());
  for (auto* run : {RunStatus, RunList, RunRestorePlan}) {
    Result r = RunCli(run, {"--coordinator", gone, "--job", "llm"});
    EXPECT_EQ(r.code, base::kExitUnavailable);
    EXPECT_THAT(r.err, AllOf(HasSubstr("cannot reach the coordinator"), HasSubstr(gone)));
  }
}

// A coordinator that answers only what the newer operator commands need, in
// the sync API: ListSteps, GetRestorePreview and VerifyStep (which wants the
// token, and for job "slow" never finishes). Everything else is UNIMPLEMENTED,
// as on an older coordinator.
class ScriptedCoordinator final : public ckptd::v1::Coordinator::Service {
 public:
  grpc::Status ListSteps(grpc::ServerContext*, const ckptd::v1::ListStepsRequest* req,
                         ckptd::v1::ListStepsResponse* resp) override {
    if (req->job() != "llm") return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job " + req->job());
    ckptd::v1::StepEntry* e = resp->add_steps();
    e->set_step(100);
    e->set_state(ckptd::v1::STEP_COMMITTED);
    e->set_world_size(2);
    e->set_ranks_reported(2);
    e->set_raw_bytes(3000);
    e->set_stored_bytes(1000);
    e->set_committed_unix_nanos(1714564800000000000);
    e->set_persist_seconds(1.5);
    return grpc::Status::OK;
  }
  grpc::Status GetRestorePreview(grpc::ServerContext*, const ckptd::v1::RestorePreviewRequest* req,
                                 ckptd::v1::RestorePreview* resp) override {
    resp->set_job(req->job());
    resp->set_step(100);
    resp->set_reason("the newest committed step");
    resp->set_state(ckptd::v1::JOB_RUNNING);
    return grpc::Status::OK;
  }
  grpc::Status VerifyStep(grpc::ServerContext* ctx, const ckptd::v1::VerifyStepRequest* req,
                          grpc::ServerWriter<ckptd::v1::VerifyProgress>* writer) override {
    auto it = ctx->client_metadata().find("authorization");
    if (it == ctx->client_metadata().end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "VerifyStep needs the operator token");
    }
    if (std::string(it->second.data(), it->second.size()) != absl::StrCat("Bearer ", kToken)) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "VerifyStep: the operator token is wrong");
    }
    ckptd::v1::VerifyProgress p;
    p.set_step(req->has_step() ? req->step() : 100);
    p.set_shards_total(2);
    p.set_bytes_total(1000);
    writer->Write(p);
    if (req->job() == "slow") {
      for (int i = 0; i < 500 && !ctx->IsCancelled(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return grpc::Status(grpc::StatusCode::ABORTED, "should have been cancelled");
    }
    p.set_shards_done(2);
    p.set_bytes_done(1000);
    p.set_done(true);
    p.set_ok(req->job() != "bad");
    if (req->job() == "bad") p.add_problems("rank-1.shard: tensor w block 0 chunk 0: checksum mismatch");
    writer->Write(p);
    return grpc::Status::OK;
  }
};

class ScriptedRemoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    token_ = WriteFile("scripted-token", kToken);
  }
  void TearDown() override { server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1)); }
  std::string Address() const { return absl::StrCat("127.0.0.1:", port_); }

  ScriptedCoordinator service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string token_;
};

TEST_F(ScriptedRemoteTest, ListAndRestorePlanOverGrpc) {
  Result r = RunCli(RunList, {"--coordinator", Address(), "--job", "llm"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("job llm: 1 step"), HasSubstr("committed"), HasSubstr("2/2"),
                           HasSubstr("1000 B"), HasSubstr("3.00"), HasSubstr("2024-05-01T12:00:00Z"),
                           HasSubstr("1.5 s")));
  r = RunCli(RunList, {"--coordinator", Address(), "--job", "other"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, AllOf(HasSubstr(Address()), HasSubstr("no job other")));
  r = RunCli(RunRestorePlan, {"--coordinator", Address(), "--job", "llm", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"step\":100"), HasSubstr("\"fresh_start\":false")));
}

TEST_F(ScriptedRemoteTest, VerifyStreamsWithTheTokenOverGrpc) {
  Result r = RunCli(RunOnlineVerify, {"--coordinator", Address(), "--job", "llm", "--token-file", token_});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("step 100: 0/2 shards"), HasSubstr("job llm step 100: OK  2/2 shards")));
  r = RunCli(RunOnlineVerify, {"--coordinator", Address(), "--job", "bad", "--step", "7", "--token-file", token_,
                            "--json"});
  EXPECT_EQ(r.code, base::kExitFailed);
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"step\":7"), HasSubstr("\"ok\":false"), HasSubstr("checksum mismatch")));
  r = RunCli(RunOnlineVerify, {"--coordinator", Address(), "--job", "llm"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("pass --token-file"));
  const std::string wrong = WriteFile("scripted-wrong-token", "nope");
  r = RunCli(RunOnlineVerify, {"--coordinator", Address(), "--job", "llm", "--token-file", wrong});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, AllOf(HasSubstr("the operator token is wrong"), HasSubstr(wrong)));
}

TEST_F(ScriptedRemoteTest, VerifyHonorsTimeout) {
  const auto start = std::chrono::steady_clock::now();
  Result r = RunCli(RunOnlineVerify,
                 {"--coordinator", Address(), "--job", "slow", "--token-file", token_, "--timeout", "300ms"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("did not finish within --timeout 300ms"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
}

TEST_F(ScriptedRemoteTest, AnOlderCoordinatorIsToldApart) {
  Result r = RunCli(RunStatus, {"--coordinator", Address()});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, AllOf(HasSubstr("too old for `ckptctl status`"), HasSubstr("GetClusterStatus"),
                           HasSubstr(Address())));
  r = RunCli(RunCheckpoint, {"--coordinator", Address(), "--job", "llm", "--token-file", token_});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("too old for `ckptctl checkpoint`"));
  EXPECT_THAT(r.out, Not(HasSubstr("requested")));
}

}  // namespace
}  // namespace ckptd::cli
