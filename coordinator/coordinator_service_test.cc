#include "coordinator/coordinator_service.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "coordinator/testing_service_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/grpc_status.h"
#include "rpc/operator_token.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::rpc::FromGrpcStatus;
using ::ckptd::testing::Eventually;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Plan = ::ckptd::v1::RestorePlanResponse;

// The core's requests sent over gRPC (testing_service_harness.h), with both
// tokens configured and the agent token on agent calls.
class CoordinatorServiceTest : public ::testing::Test, public ServiceHarness {
 protected:
  static constexpr const char* kToken = kOperatorToken;

  CoordinatorServiceTest() {
    options_.every_steps = 50;
    options_.heartbeat_interval = absl::Milliseconds(200);
  }
  void SetUp() override { Start(); }
  void TearDown() override { Stop(); }
  void Fail(const std::string& what) override { ADD_FAILURE() << what; }

  // The service with `token` as the operator token.
  void Start(const std::string& token = kToken) {
    CoordinatorServiceOptions so = DefaultServiceOptions();
    so.operator_token = token;
    ServiceHarness::Start(std::move(so));
  }
};

TEST_F(CoordinatorServiceTest, RegisterHeartbeatAndCommitOverGrpc) {
  Register("node-a", {0});
  Register("node-b", {1});
  grpc::ClientContext ctx;
  std::unique_ptr<Stream> stream = OpenHeartbeats(&ctx);
  ASSERT_TRUE(stream->Write(BeatAt("node-a", 7)));
  ckptd::v1::HeartbeatAck ack;
  ASSERT_TRUE(stream->Read(&ack));
  EXPECT_TRUE(ack.known());
  ASSERT_EQ(ack.schedules_size(), 1);
  EXPECT_EQ(ack.schedules(0).job(), kJob);
  EXPECT_EQ(ack.schedules(0).every_steps(), 50u);
  EXPECT_EQ(ack.schedules(0).state(), ckptd::v1::JOB_RUNNING);
  // Every heartbeat gets its answer on the same stream.
  for (uint64_t step = 8; step < 12; ++step) {
    ASSERT_TRUE(stream->Write(BeatAt("node-a", step)));
    ASSERT_TRUE(stream->Read(&ack));
    EXPECT_TRUE(ack.known());
  }
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_FALSE(stream->Read(&ack));
  EXPECT_THAT(FromGrpcStatus(stream->Finish()), IsOk());

  CommitStep(50);
  ckptd::v1::GetClusterStatusResponse status = Status();
  ASSERT_EQ(status.agents_size(), 2);
  EXPECT_TRUE(status.agents(0).alive());
  EXPECT_EQ(status.agents(0).address(), "host-node-a");
  ckptd::v1::JobStatus job = Job();
  EXPECT_TRUE(job.has_committed());
  EXPECT_EQ(job.newest_committed_step(), 50u);
  EXPECT_EQ(job.checkpoints_committed(), 1u);
  EXPECT_EQ(job.world_size(), 2u);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::optional<uint64_t> latest, store_.LatestCommittedStep(kJob));
  EXPECT_EQ(latest, 50u);
}

TEST_F(CoordinatorServiceTest, RestorePlanIsABarrierOverGrpc) {
  Register("node-a", {0});
  Register("node-b", {1});
  CommitStep(50);
  CommitStep(100);
  CKPTD_ASSERT_OK_AND_ASSIGN(Plan p0, RestorePlan(0));
  EXPECT_EQ(p0.verdict(), Plan::LOAD);
  EXPECT_EQ(p0.step(), 100u);
  CKPTD_ASSERT_OK_AND_ASSIGN(Plan p1, RestorePlan(1));
  EXPECT_EQ(p1.verdict(), Plan::LOAD);
  EXPECT_EQ(p1.step(), 100u);
  CKPTD_ASSERT_OK_AND_ASSIGN(Plan w0, RestorePlan(0, 100));
  EXPECT_EQ(w0.verdict(), Plan::WAIT);
  CKPTD_ASSERT_OK_AND_ASSIGN(Plan g1, RestorePlan(1, 100));
  EXPECT_EQ(g1.verdict(), Plan::GO);
  EXPECT_EQ(g1.step(), 100u);
  CKPTD_ASSERT_OK_AND_ASSIGN(Plan g0, RestorePlan(0, 100));
  EXPECT_EQ(g0.verdict(), Plan::GO);
  EXPECT_EQ(g0.incarnation(), g1.incarnation());
}

TEST_F(CoordinatorServiceTest, RequestCheckpointNeedsTheOperatorToken) {
  Register("node-a", {0});
  Register("node-b", {1});
  const uint64_t generation = Job().schedule().generation();
  ckptd::v1::RequestCheckpointRequest req;
  req.set_job(kJob);
  const auto rpc = &ckptd::v1::Coordinator::Stub::RequestCheckpoint;
  EXPECT_THAT(Call(rpc, req),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("authorization: Bearer <token>")));
  EXPECT_THAT(Call(rpc, req, absl::StrCat("Basic ", kToken)),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("Bearer <operator token>")));
  EXPECT_THAT(Call(rpc, req, "Bearer not-the-token"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("operator token is wrong")));
  EXPECT_THAT(Call(rpc, req, absl::StrCat("Bearer ", kToken, "x")),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("operator token is wrong")));
  EXPECT_THAT(Call(rpc, req, "Bearer "), StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("wrong")));
  // Refused requests changed nothing.
  EXPECT_EQ(Job().schedule().generation(), generation);
  EXPECT_TRUE(Job().schedule().extra_steps().empty());

  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RequestCheckpointResponse resp,
                             Call(rpc, req, absl::StrCat("Bearer ", kToken)));
  EXPECT_GT(resp.target_step(), 0u);
  EXPECT_THAT(Job().schedule().extra_steps(), ElementsAre(resp.target_step()));
  // Read-only operator RPCs need no token.
  ckptd::v1::ListEventsRequest list;
  EXPECT_THAT(Call(&ckptd::v1::Coordinator::Stub::ListEvents, list).status(), IsOk());
}

TEST_F(CoordinatorServiceTest, VerifyStreamsProgressAndNeedsTheToken) {
  Register("node-a", {0});
  Register("node-b", {1});
  CommitStep(50);
  ckptd::v1::VerifyStepRequest req;
  req.set_job(kJob);
  auto verify = [&](const std::string& authorization, std::vector<ckptd::v1::VerifyProgress>* got) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    std::unique_ptr<grpc::ClientReader<ckptd::v1::VerifyProgress>> reader = stub_->VerifyStep(&ctx, req);
    for (ckptd::v1::VerifyProgress p; reader->Read(&p);) got->push_back(p);
    return FromGrpcStatus(reader->Finish());
  };
  std::vector<ckptd::v1::VerifyProgress> none;
  EXPECT_THAT(verify("", &none), StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("VerifyStep")));
  EXPECT_THAT(verify("Bearer wrong", &none), StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("wrong")));
  EXPECT_TRUE(none.empty());
  std::vector<ckptd::v1::VerifyProgress> got;
  EXPECT_THAT(verify(absl::StrCat("Bearer ", kToken), &got), IsOk());
  ASSERT_FALSE(got.empty());
  const ckptd::v1::VerifyProgress& last = got.back();
  EXPECT_TRUE(last.done());
  EXPECT_TRUE(last.ok());
  EXPECT_EQ(last.step(), 50u);
  EXPECT_EQ(last.shards_done(), 2u);
  EXPECT_EQ(last.shards_total(), 2u);
  for (size_t i = 1; i < got.size(); ++i) EXPECT_GE(got[i].shards_done(), got[i - 1].shards_done());
  // An unknown job ends the stream with the core's error.
  req.set_job("other");
  got.clear();
  EXPECT_THAT(verify(absl::StrCat("Bearer ", kToken), &got), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no job")));

  ckptd::v1::ListStepsRequest list;
  list.set_job(kJob);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ListStepsResponse steps, Call(&ckptd::v1::Coordinator::Stub::ListSteps, list));
  ASSERT_EQ(steps.steps_size(), 1);
  EXPECT_EQ(steps.steps(0).state(), ckptd::v1::STEP_COMMITTED);
  ckptd::v1::RestorePreviewRequest preview;
  preview.set_job(kJob);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RestorePreview p,
                             Call(&ckptd::v1::Coordinator::Stub::GetRestorePreview, preview));
  EXPECT_EQ(p.step(), 50u);
}

TEST_F(CoordinatorServiceTest, DrillsNeedTheOperatorToken) {
  Register("node-a", {0});
  ckptd::v1::RunDrillRequest req;
  req.set_job(kJob);
  req.set_scenario(ckptd::v1::KILL_TRAINER);
  const auto rpc = &ckptd::v1::Coordinator::Stub::RunDrill;
  EXPECT_THAT(Call(rpc, req), StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("RunDrill")));
  EXPECT_THAT(Call(rpc, req, "Bearer nope"), StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("wrong")));
  // With the token the core decides: this agent does not allow drills.
  EXPECT_THAT(Call(rpc, req, absl::StrCat("Bearer ", kToken)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--allow-drills")));
  ckptd::v1::GetDrillRequest get;
  get.set_drill_id(1);
  EXPECT_THAT(Call(&ckptd::v1::Coordinator::Stub::GetDrill, get),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no drill 1")));
}

TEST_F(CoordinatorServiceTest, ACoordinatorWithoutTokenRefusesOperatorChanges) {
  Stop();
  Start(/*token=*/"");
  ckptd::v1::RequestCheckpointRequest req;
  req.set_job(kJob);
  EXPECT_THAT(Call(&ckptd::v1::Coordinator::Stub::RequestCheckpoint, req, "Bearer anything"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("no operator token configured")));
}

TEST_F(CoordinatorServiceTest, MalformedRequestsGetInvalidArgumentAndChangeNothing) {
  ckptd::v1::RegisterAgentRequest bad = Registration("../etc", {0}, 2);
  EXPECT_THAT(AgentCall(&ckptd::v1::Coordinator::Stub::RegisterAgent, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node id")));
  bad = Registration("node-a", {5}, 2);
  EXPECT_THAT(AgentCall(&ckptd::v1::Coordinator::Stub::RegisterAgent, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 5")));
  EXPECT_EQ(Status().agents_size(), 0);
  EXPECT_EQ(Status().jobs_size(), 0);

  Register("node-a", {0});
  Register("node-b", {1});
  ckptd::v1::ReportShardRequest report;
  report.set_node_id("node-a");
  report.set_session(sessions_["node-a"]);
  report.mutable_report()->set_job(kJob);
  report.mutable_report()->set_step(50);
  report.mutable_report()->set_world_size(2);
  report.mutable_report()->mutable_shard()->set_rank(0);  // no file length, no digest
  EXPECT_THAT(AgentCall(&ckptd::v1::Coordinator::Stub::ReportShard, report),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("length")));
  ckptd::v1::RestorePlanRequest plan;
  plan.set_node_id("node-a");
  plan.set_session(sessions_["node-a"]);
  plan.set_job("no/such job");
  plan.set_world_size(2);
  EXPECT_THAT(AgentCall(&ckptd::v1::Coordinator::Stub::GetRestorePlan, plan),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name")));
  ckptd::v1::RequestCheckpointRequest manual;
  manual.set_job("");
  EXPECT_THAT(Call(&ckptd::v1::Coordinator::Stub::RequestCheckpoint, manual, absl::StrCat("Bearer ", kToken)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name")));
  ckptd::v1::JobStatus job = Job();
  EXPECT_TRUE(job.pending_steps().empty());
  EXPECT_FALSE(job.has_committed());
  EXPECT_EQ(Status().jobs_size(), 1);
  EXPECT_EQ(Status().agents_size(), 2);
}

TEST_F(CoordinatorServiceTest, HeartbeatOfAnUnknownSessionIsAnsweredNotKnown) {
  Register("node-a", {0});
  grpc::ClientContext ctx;
  std::unique_ptr<Stream> stream = OpenHeartbeats(&ctx);
  ckptd::v1::Heartbeat stale = BeatAt("node-a", 3);
  stale.set_session(sessions_["node-a"] + "0");
  ASSERT_TRUE(stream->Write(stale));
  ckptd::v1::HeartbeatAck ack;
  ASSERT_TRUE(stream->Read(&ack));
  EXPECT_FALSE(ack.known());
  EXPECT_EQ(ack.schedules_size(), 0);
  // The stream goes on: the agent registers again and keeps beating on it.
  Register("node-a", {0});
  ASSERT_TRUE(stream->Write(BeatAt("node-a", 4)));
  ASSERT_TRUE(stream->Read(&ack));
  EXPECT_TRUE(ack.known());
  stream->WritesDone();
  EXPECT_THAT(FromGrpcStatus(stream->Finish()), IsOk());
}

TEST_F(CoordinatorServiceTest, InvalidHeartbeatEndsTheStreamWithTheCoreError) {
  Register("node-a", {0});
  grpc::ClientContext ctx;
  std::unique_ptr<Stream> stream = OpenHeartbeats(&ctx);
  ckptd::v1::Heartbeat bad = BeatAt("node-a", 3);
  bad.set_node_id("node a!");
  ASSERT_TRUE(stream->Write(bad));
  ckptd::v1::HeartbeatAck ack;
  EXPECT_FALSE(stream->Read(&ack));
  EXPECT_THAT(FromGrpcStatus(stream->Finish()), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node id")));
}

TEST_F(CoordinatorServiceTest, ClientGoneWhileTheServerWritesDoesNotCrash) {
  Register("node-a", {0});
  for (int round = 0; round < 20; ++round) {
    grpc::ClientContext ctx;
    std::unique_ptr<Stream> stream = OpenHeartbeats(&ctx);
    // Heartbeats are sent, their answers never read, then the call is dropped.
    for (int i = 0; i < 50; ++i) {
      if (!stream->Write(BeatAt("node-a", static_cast<uint64_t>(i)))) break;
    }
    // A real wait on even rounds only: the cancel comes both before and while the server writes answers.
    if (round % 2 == 0) absl::SleepFor(absl::Milliseconds(5));
    ctx.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // A stream left open is cut by the shutdown in TearDown; the server still serves.
  grpc::ClientContext open_ctx;
  open_ctx.AddMetadata("authorization", agent_authorization_);
  std::unique_ptr<Stream> open = stub_->Heartbeats(&open_ctx);
  ASSERT_TRUE(open->Write(BeatAt("node-a", 60)));
  ckptd::v1::HeartbeatAck ack;
  ASSERT_TRUE(open->Read(&ack));
  EXPECT_TRUE(ack.known());
  EXPECT_EQ(Status().agents_size(), 1);
  const absl::Time before = absl::Now();
  ShutdownCoordinatorServer(server_.server.get(), absl::Milliseconds(200));
  EXPECT_LT(absl::Now() - before, absl::Seconds(10));
  EXPECT_FALSE(open->Read(&ack));
  EXPECT_FALSE(open->Finish().ok());
}

TEST_F(CoordinatorServiceTest, TickerDeclaresASilentNodeLost) {
  Stop();
  options_.heartbeat_interval = absl::Milliseconds(40);
  options_.node_lost_after = absl::Milliseconds(200);
  Start();
  Register("node-a", {0});
  // Silent past node_lost_after on the core's clock: the ticker, on real time, notices.
  clock_.Advance(absl::Milliseconds(201));
  EXPECT_TRUE(Eventually([&] { return !Status().agents(0).alive(); }, absl::Seconds(20)));
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ListEventsResponse events,
                             Call(&ckptd::v1::Coordinator::Stub::ListEvents, ckptd::v1::ListEventsRequest()));
  ASSERT_GE(events.events_size(), 1);
  EXPECT_EQ(events.events(0).kind(), ckptd::v1::NODE_LOST);
  EXPECT_EQ(events.events(0).node_id(), "node-a");
}

TEST_F(CoordinatorServiceTest, ServerAddressErrors) {
  EXPECT_THAT(StartCoordinatorServer("no-port", service_.get(), grpc::InsecureServerCredentials()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no-port")));
  EXPECT_THAT(StartCoordinatorServer(absl::StrCat("127.0.0.1:", server_.port), service_.get(),
                                     grpc::InsecureServerCredentials()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot listen")));
}

// The attack: one holder of the agent token registers fake nodes, each with
// the most ranks and GPU names a registration may carry. What the nodes hold
// together is bounded, so registrations past the bound are refused, and the
// status, however many nodes there are, comes in pages that each fit a gRPC
// message, together naming every node.
class RegistrationMemoryTest : public CoordinatorServiceTest {
 protected:
  RegistrationMemoryTest() { options_.max_registration_bytes = size_t{24} << 20; }

  // A node as big as a registration may be: 4096 ranks of a job of its own
  // (so that no node speaks for another's), 256 GPU names of 128 bytes.
  static ckptd::v1::RegisterAgentRequest Biggest(int n) {
    ckptd::v1::RegisterAgentRequest req;
    req.set_node_id(absl::StrCat("fake-", 1000 + n));
    req.set_address(std::string(255, 'a'));
    for (int g = 0; g < 256; ++g) req.add_gpus(std::string(128, static_cast<char>('A' + g % 26)));
    for (uint32_t r = 0; r < 4096; ++r) {
      ckptd::v1::RankInfo* info = req.add_ranks();
      info->set_job(absl::StrCat("job-", n));
      info->set_rank(r);
      info->set_world_size(4096);
      info->set_pid(static_cast<int>(10000 + r));
    }
    return req;
  }
};

TEST_F(RegistrationMemoryTest, FakeNodesCannotGrowTheCoordinatorPastItsBoundAndStatusStaysReadable) {
  int registered = 0;
  absl::Status refused;
  for (int n = 0; n < 100 && refused.ok(); ++n) {
    absl::StatusOr<ckptd::v1::RegisterAgentResponse> r = AgentCall(&Stub::RegisterAgent, Biggest(n));
    if (r.ok()) {
      ++registered;
    } else {
      refused = r.status();
    }
  }
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted,
                                HasSubstr("past its limit of 25165824 (--max-registration-memory)")));
  // 4096 ranks cost about 2.2 MB here: ten of them fit 24 MiB, not twenty.
  EXPECT_GE(registered, 5);
  EXPECT_LT(registered, 20);

  // Every page fits the default message size of 4 MiB, and together they
  // name every node once, in order: pages bounded by bytes (all of them fit
  // one here) or by max_agents.
  for (uint32_t max_agents : {0u, 3u}) {
    std::vector<std::string> nodes;
    ckptd::v1::GetClusterStatusRequest req;
    req.set_max_agents(max_agents);
    int pages = 0;
    while (pages < 1000) {
      absl::StatusOr<ckptd::v1::GetClusterStatusResponse> page = Call(&Stub::GetClusterStatus, req);
      ASSERT_THAT(page.status(), IsOk());
      ++pages;
      EXPECT_LE(page->ByteSizeLong(), size_t{4} << 20);
      EXPECT_EQ(page->agents_total(), static_cast<uint32_t>(registered));
      EXPECT_EQ(page->jobs_size() > 0, req.agents_after().empty());  // the jobs with the first page
      if (max_agents > 0) {
        EXPECT_LE(page->agents_size(), static_cast<int>(max_agents));
      }
      for (const auto& a : page->agents()) nodes.push_back(a.node_id());
      if (page->next_agents_after().empty()) break;
      req.set_agents_after(page->next_agents_after());
    }
    EXPECT_EQ(pages, max_agents == 0 ? 1 : (registered + 2) / 3) << max_agents;
    ASSERT_EQ(nodes.size(), static_cast<size_t>(registered));
    for (int n = 0; n < registered; ++n) EXPECT_EQ(nodes[n], absl::StrCat("fake-", 1000 + n));
  }

  // A node registered again replaces what it held: no growth.
  CKPTD_EXPECT_OK(AgentCall(&Stub::RegisterAgent, Biggest(0)).status());
  // A small node's heartbeat that lists the most ranks gets only those that
  // fit; the rest are left out, and the node keeps its session.
  ckptd::v1::RegisterAgentRequest small = Biggest(500);
  small.clear_ranks();
  small.clear_gpus();
  absl::StatusOr<ckptd::v1::RegisterAgentResponse> s = AgentCall(&Stub::RegisterAgent, small);
  ASSERT_THAT(s.status(), IsOk());
  ckptd::v1::Heartbeat hb;
  hb.set_node_id(small.node_id());
  hb.set_session(s->session());
  *hb.mutable_ranks() = Biggest(500).ranks();
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::HeartbeatAck ack, core_->OnHeartbeat(hb));
  EXPECT_TRUE(ack.known());
  const ckptd::v1::GetClusterStatusResponse all = core_->ClusterStatus();
  size_t ranks = 0;
  for (const auto& a : all.agents()) {
    if (a.node_id() == small.node_id()) ranks = static_cast<size_t>(a.ranks_size());
  }
  EXPECT_LT(ranks, 4096u);
}

}  // namespace
}  // namespace ckptd::coordinator
