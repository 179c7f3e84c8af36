// The node credential on the coordinator's agent RPCs (issue 16): each test is
// an attack that must fail, or the configuration that must let agents in.
// Certificates naming a node are tested in tls_test.cc.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/testing/matchers.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/testing_service_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/grpc_status.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::rpc::FromGrpcStatus;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr const char* kAgentRpcs[] = {"RegisterAgent", "Heartbeats", "ReportShard", "ReportFailure",
                                      "GetRestorePlan", "GetReshardPlan"};

class AgentAuthTest : public ::testing::Test, public ServiceHarness {
 protected:
  AgentAuthTest() { options_.every_steps = 50; }
  void SetUp() override { Start(DefaultServiceOptions()); }
  void TearDown() override { Stop(); }
  void Fail(const std::string& what) override { ADD_FAILURE() << what; }

  // Every agent RPC, as node-a hosting rank 0 of the 2-rank job, with
  // `authorization` ("": none); each RPC's status by name.
  std::map<std::string, absl::Status> EveryAgentRpc(const std::string& authorization) {
    std::map<std::string, absl::Status> out;
    ranks_["node-a"] = Registration("node-a", {0}, 2);
    absl::StatusOr<ckptd::v1::RegisterAgentResponse> registered =
        Call(&Stub::RegisterAgent, ranks_["node-a"], authorization);
    out["RegisterAgent"] = registered.status();
    if (registered.ok()) sessions_["node-a"] = registered->session();
    {
      grpc::ClientContext ctx;
      std::unique_ptr<Stream> stream = OpenHeartbeats(&ctx, authorization);
      const ckptd::v1::Heartbeat hb = HeartbeatOf("node-a");
      ckptd::v1::HeartbeatAck ack;
      if (stream->Write(hb) && stream->Read(&ack)) {
        stream->WritesDone();
        // Drained so that Finish does not wait on an unread message.
        while (stream->Read(&ack)) {
        }
      }
      out["Heartbeats"] = FromGrpcStatus(stream->Finish());
    }
    out["ReportShard"] =
        Call(&Stub::ReportShard, ShardRequest("node-a", ReportOf(50, 0, 4096, 7, 2)), authorization).status();
    out["ReportFailure"] =
        Call(&Stub::ReportFailure, FailureRequest("node-a", 0, ckptd::v1::TRAINER_DIED, 0, "killed"), authorization)
            .status();
    ckptd::v1::RestorePlanRequest plan = PlanRequest(0, std::nullopt, true, 2);
    plan.set_node_id("node-a");
    plan.set_session(sessions_["node-a"]);
    out["GetRestorePlan"] = Call(&Stub::GetRestorePlan, plan, authorization).status();
    ckptd::v1::ReshardPlanRequest reshard;
    reshard.set_node_id("node-a");
    reshard.set_session(sessions_["node-a"]);
    reshard.set_job(kJob);
    reshard.set_world_size(2);
    reshard.set_step(50);
    reshard.add_buffers()->set_name("w");
    out["GetReshardPlan"] = Call(&Stub::GetReshardPlan, reshard, authorization).status();
    return out;
  }

  // Nothing an agent RPC could change has changed: no agent, no job, no event.
  void ExpectNothingChanged() {
    const ckptd::v1::GetClusterStatusResponse status = Status();
    EXPECT_EQ(status.agents_size(), 0);
    EXPECT_EQ(status.jobs_size(), 0);
    absl::StatusOr<ckptd::v1::ListEventsResponse> events = Call(&Stub::ListEvents, ckptd::v1::ListEventsRequest());
    ASSERT_THAT(events.status(), IsOk());
    EXPECT_EQ(events->events_size(), 0);
  }
};

TEST_F(AgentAuthTest, AgentRpcsWithoutACredentialAreUnauthenticatedAndChangeNothing) {
  const std::map<std::string, absl::Status> got = EveryAgentRpc("");
  ASSERT_EQ(got.size(), std::size(kAgentRpcs));
  for (const char* rpc : kAgentRpcs) {
    EXPECT_THAT(got.at(rpc), StatusIs(absl::StatusCode::kUnauthenticated,
                                      AllOf(HasSubstr(rpc), HasSubstr("agent token (ckptd-agent --agent-token-file)"),
                                            HasSubstr("client certificate naming the node"),
                                            HasSubstr("--insecure-agents"))))
        << rpc;
  }
  ExpectNothingChanged();
}

TEST_F(AgentAuthTest, AWrongAgentTokenIsPermissionDenied) {
  for (const std::string& wrong : {std::string("Bearer wrong"), absl::StrCat("Bearer ", kAgentToken, "x"),
                                   std::string("Bearer ")}) {
    const std::map<std::string, absl::Status> got = EveryAgentRpc(wrong);
    for (const char* rpc : kAgentRpcs) {
      EXPECT_THAT(got.at(rpc), StatusIs(absl::StatusCode::kPermissionDenied,
                                        AllOf(HasSubstr(rpc), HasSubstr("agent token is wrong"),
                                              HasSubstr("--agent-token-file"))))
          << rpc << " with " << wrong;
    }
  }
  // Not a bearer token at all: no credential.
  const std::map<std::string, absl::Status> basic = EveryAgentRpc(absl::StrCat("Basic ", kAgentToken));
  for (const char* rpc : kAgentRpcs) {
    EXPECT_THAT(basic.at(rpc), StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("Bearer <agent token>"))) << rpc;
  }
  ExpectNothingChanged();
}

TEST_F(AgentAuthTest, TheOperatorTokenIsNoAgentCredential) {
  const std::map<std::string, absl::Status> got = EveryAgentRpc(absl::StrCat("Bearer ", kOperatorToken));
  for (const char* rpc : kAgentRpcs) {
    EXPECT_THAT(got.at(rpc), StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("agent token is wrong"))) << rpc;
  }
  ExpectNothingChanged();
}

TEST_F(AgentAuthTest, TheAgentTokenIsNoOperatorCredential) {
  Register("node-a", {0});
  Register("node-b", {1});
  const uint64_t generation = Job().schedule().generation();
  ckptd::v1::RequestCheckpointRequest manual;
  manual.set_job(kJob);
  EXPECT_THAT(Call(&Stub::RequestCheckpoint, manual, absl::StrCat("Bearer ", kAgentToken)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("operator token is wrong")));
  ckptd::v1::RunDrillRequest drill;
  drill.set_job(kJob);
  drill.set_scenario(ckptd::v1::KILL_TRAINER);
  EXPECT_THAT(Call(&Stub::RunDrill, drill, absl::StrCat("Bearer ", kAgentToken)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("operator token is wrong")));
  EXPECT_EQ(Job().schedule().generation(), generation);
  EXPECT_TRUE(Job().schedule().extra_steps().empty());
  // The operator token still works.
  EXPECT_THAT(Call(&Stub::RequestCheckpoint, manual, absl::StrCat("Bearer ", kOperatorToken)).status(), IsOk());
}

TEST_F(AgentAuthTest, TheAgentTokenLetsAgentsIn) {
  Register("node-a", {0});
  Register("node-b", {1});
  {
    grpc::ClientContext ctx;
    std::unique_ptr<Stream> stream = OpenHeartbeats(&ctx);
    ASSERT_TRUE(stream->Write(BeatAt("node-a", 7)));
    ckptd::v1::HeartbeatAck ack;
    ASSERT_TRUE(stream->Read(&ack));
    EXPECT_TRUE(ack.known());
    ASSERT_TRUE(stream->WritesDone());
    EXPECT_FALSE(stream->Read(&ack));
    EXPECT_THAT(FromGrpcStatus(stream->Finish()), IsOk());
  }
  CommitStep(50);
  EXPECT_EQ(Job().newest_committed_step(), 50u);
  EXPECT_THAT(AgentCall(&Stub::ReportFailure, FailureRequest("node-a", 0, ckptd::v1::TRAINER_DIED, 51, "killed"))
                  .status(),
              IsOk());
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RestorePlanResponse plan, RestorePlan(0));
  EXPECT_EQ(plan.verdict(), ckptd::v1::RestorePlanResponse::LOAD);
  EXPECT_EQ(plan.step(), 50u);
  EXPECT_EQ(Status().agents_size(), 2);
}

TEST_F(AgentAuthTest, AHeartbeatStreamEndsAtTheFirstRefusedHeartbeat) {
  Register("node-a", {0});
  grpc::ClientContext ctx;
  std::unique_ptr<Stream> stream = OpenHeartbeats(&ctx, "Bearer wrong");
  ASSERT_TRUE(stream->Write(BeatAt("node-a", 3)));
  ckptd::v1::HeartbeatAck ack;
  EXPECT_FALSE(stream->Read(&ack));
  EXPECT_THAT(FromGrpcStatus(stream->Finish()),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("Heartbeats: the agent token is wrong")));
}

TEST_F(AgentAuthTest, InsecureAgentsNeedNoCredential) {
  Stop();
  CoordinatorServiceOptions so = DefaultServiceOptions();
  so.agent_token.clear();
  so.insecure_agents = true;
  Start(so);
  const std::map<std::string, absl::Status> got = EveryAgentRpc("");
  for (const char* rpc : kAgentRpcs) {
    EXPECT_NE(got.at(rpc).code(), absl::StatusCode::kUnauthenticated) << rpc << ": " << got.at(rpc);
    EXPECT_NE(got.at(rpc).code(), absl::StatusCode::kPermissionDenied) << rpc << ": " << got.at(rpc);
  }
  EXPECT_THAT(got.at("RegisterAgent"), IsOk());
  EXPECT_THAT(got.at("Heartbeats"), IsOk());
  EXPECT_EQ(Status().agents_size(), 1);
  // Operator RPCs still need the operator token.
  ckptd::v1::RequestCheckpointRequest manual;
  manual.set_job(kJob);
  EXPECT_THAT(Call(&Stub::RequestCheckpoint, manual), StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("operator token")));
}

TEST_F(AgentAuthTest, WithoutAnAgentTokenOnlyCertificatesCouldLetAgentsIn) {
  Stop();
  CoordinatorServiceOptions so = DefaultServiceOptions();
  so.agent_token.clear();
  Start(so);
  const std::map<std::string, absl::Status> none = EveryAgentRpc("");
  const std::map<std::string, absl::Status> any = EveryAgentRpc("Bearer anything");
  for (const char* rpc : kAgentRpcs) {
    EXPECT_THAT(none.at(rpc), StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr(rpc))) << rpc;
    EXPECT_THAT(any.at(rpc), StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("takes no agent token"))) << rpc;
  }
  ExpectNothingChanged();
}

}  // namespace
}  // namespace ckptd::coordinator
