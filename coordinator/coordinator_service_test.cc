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
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/grpc_status.h"
#include "rpc/operator_token.h"
#include "storage/mem_file_system.h"
#include "storage/testing_data.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::rpc::FromGrpcStatus;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Plan = ::ckptd::v1::RestorePlanResponse;
using Stream = grpc::ClientReaderWriter<ckptd::v1::Heartbeat, ckptd::v1::HeartbeatAck>;

constexpr char kJob[] = "llm-7b";
constexpr char kToken[] = "0123456789abcdef-operator";

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(); }
  void TearDown() override { Stop(); }

  void Start() {
    CoordinatorOptions o = options_;
    core_ = std::make_unique<CoordinatorCore>(&store_, state_.get(), &clock_, o);
    CKPTD_ASSERT_OK(core_->Recover());
    CoordinatorServiceOptions so;
    so.operator_token = kToken;
    service_ = std::make_unique<CoordinatorService>(core_.get(), so);
    CKPTD_ASSERT_OK_AND_ASSIGN(
        server_, StartCoordinatorServer("127.0.0.1:0", service_.get(), grpc::InsecureServerCredentials()));
    ASSERT_GT(server_.port, 0);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_.port), grpc::InsecureChannelCredentials());
    stub_ = ckptd::v1::Coordinator::NewStub(channel_);
  }

  void Stop() {
    ShutdownCoordinatorServer(server_.server.get());
    server_.server.reset();
    service_.reset();
    core_.reset();
  }

  static void Deadline(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  }

  ckptd::v1::RegisterAgentRequest Registration(const std::string& node, std::vector<uint32_t> ranks,
                                               uint32_t world = 2) {
    ckptd::v1::RegisterAgentRequest req;
    req.set_node_id(node);
    req.set_address("host-" + node);
    for (uint32_t r : ranks) {
      ckptd::v1::RankInfo* info = req.add_ranks();
      info->set_job(kJob);
      info->set_rank(r);
      info->set_world_size(world);
      info->set_pid(1000 + static_cast<int>(r));
      info->set_gpu(static_cast<int>(r));
    }
    return req;
  }

  // Registers `node` hosting `ranks` of kJob over gRPC; returns the session.
  uint64_t Register(const std::string& node, std::vector<uint32_t> ranks, uint32_t world = 2) {
    registrations_[node] = Registration(node, ranks, world);
    grpc::ClientContext ctx;
    Deadline(&ctx);
    ckptd::v1::RegisterAgentResponse resp;
    EXPECT_THAT(FromGrpcStatus(stub_->RegisterAgent(&ctx, registrations_[node], &resp)), IsOk());
    sessions_[node] = resp.session();
    return resp.session();
  }

  ckptd::v1::Heartbeat Beat(const std::string& node, uint64_t step) {
    ckptd::v1::Heartbeat hb;
    hb.set_node_id(node);
    hb.set_session(sessions_[node]);
    for (const auto& r : registrations_[node].ranks()) {
      *hb.add_ranks() = r;
      ckptd::v1::RankProgress* p = hb.add_progress();
      p->set_job(r.job());
      p->set_rank(r.rank());
      p->set_step(step);
      p->set_step_seconds(0.5);
    }
    return hb;
  }

  // Writes a real shard of (step, rank) into the store and reports it from
  // `node` over gRPC.
  absl::StatusOr<ckptd::v1::ReportShardResponse> Shard(const std::string& node, uint64_t step, uint32_t rank,
                                                       uint32_t world = 2, uint64_t incarnation = 0) {
    if (absl::Status s = store_.PrepareStep(kJob, step); !s.ok()) return s;
    ckptd::testing::RankData data = ckptd::testing::MakeRankData(step, rank, 512, 16);
    std::vector<storage::TensorSource> src = ckptd::testing::RankSources(data, "w", "rng");
    absl::StatusOr<storage::ShardWriteResult> w = store_.WriteShard(kJob, step, rank, world, src);
    if (!w.ok()) return w.status();
    ckptd::v1::ReportShardRequest req;
    req.set_node_id(node);
    req.set_session(sessions_[node]);
    ckptd::v1::ShardReport* r = req.mutable_report();
    r->set_job(kJob);
    r->set_step(step);
    r->set_world_size(world);
    r->set_incarnation(incarnation);
    r->set_stall_seconds(0.02);
    r->mutable_shard()->set_rank(rank);
    r->mutable_shard()->set_file_length(w->file_length);
    r->mutable_shard()->set_index_xxh3(w->index_xxh3);
    r->mutable_shard()->set_raw_bytes(w->raw_bytes);
    r->mutable_shard()->set_stored_bytes(w->stored_bytes);
    r->mutable_shard()->set_persist_seconds(0.3);
    return Call(&ckptd::v1::Coordinator::Stub::ReportShard, req);
  }

  absl::StatusOr<Plan> RestorePlan(uint32_t rank, std::optional<uint64_t> attempt = std::nullopt) {
    ckptd::v1::RestorePlanRequest req;
    req.set_job(kJob);
    req.set_rank(rank);
    req.set_world_size(2);
    if (attempt) {
      req.set_has_attempt(true);
      req.set_attempt_step(*attempt);
      req.set_attempt_ok(true);
    }
    return Call(&ckptd::v1::Coordinator::Stub::GetRestorePlan, req);
  }

  // A unary call with a deadline and optional authorization metadata.
  template <typename Req, typename Resp>
  absl::StatusOr<Resp> Call(grpc::Status (ckptd::v1::Coordinator::Stub::*method)(grpc::ClientContext*, const Req&,
                                                                                Resp*),
                            const Req& req, const std::string& authorization = "") {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    Resp resp;
    absl::Status s = FromGrpcStatus((stub_.get()->*method)(&ctx, req, &resp));
    if (!s.ok()) return s;
    return resp;
  }

  ckptd::v1::GetClusterStatusResponse Status() {
    absl::StatusOr<ckptd::v1::GetClusterStatusResponse> s =
        Call(&ckptd::v1::Coordinator::Stub::GetClusterStatus, ckptd::v1::GetClusterStatusRequest());
    EXPECT_THAT(s.status(), IsOk());
    return s.ok() ? *s : ckptd::v1::GetClusterStatusResponse();
  }

  ckptd::v1::JobStatus Job() {
    const ckptd::v1::GetClusterStatusResponse status = Status();
    for (const auto& j : status.jobs()) {
      if (j.job() == kJob) return j;
    }
    ADD_FAILURE() << "no job " << kJob;
    return {};
  }

  // Commits `step` of the 2-rank job, reported by node-a (rank 0) and node-b (rank 1).
  void CommitStep(uint64_t step) {
    CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ReportShardResponse r0, Shard("node-a", step, 0));
    EXPECT_FALSE(r0.committed());
    CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ReportShardResponse r1, Shard("node-b", step, 1));
    EXPECT_TRUE(r1.committed());
  }

  CoordinatorOptions options_ = [] {
    CoordinatorOptions o;
    o.every_steps = 50;
    o.heartbeat_interval = absl::Milliseconds(200);
    return o;
  }();
  storage::MemFileSystem fs_;
  storage::CheckpointStore store_{&fs_, "/ckpt"};
  std::unique_ptr<StateStore> state_ = NewMemStateStore();
  base::RealClock clock_;
  std::unique_ptr<CoordinatorCore> core_;
  std::unique_ptr<CoordinatorService> service_;
  CoordinatorServer server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ckptd::v1::Coordinator::Stub> stub_;
  std::map<std::string, ckptd::v1::RegisterAgentRequest> registrations_;
  std::map<std::string, uint64_t> sessions_;
};

TEST_F(CoordinatorServiceTest, RegisterHeartbeatAndCommitOverGrpc) {
  Register("node-a", {0});
  Register("node-b", {1});
  grpc::ClientContext ctx;
  Deadline(&ctx);
  std::unique_ptr<Stream> stream = stub_->Heartbeats(&ctx);
  ASSERT_TRUE(stream->Write(Beat("node-a", 7)));
  ckptd::v1::HeartbeatAck ack;
  ASSERT_TRUE(stream->Read(&ack));
  EXPECT_TRUE(ack.known());
  ASSERT_EQ(ack.schedules_size(), 1);
  EXPECT_EQ(ack.schedules(0).job(), kJob);
  EXPECT_EQ(ack.schedules(0).every_steps(), 50u);
  EXPECT_EQ(ack.schedules(0).state(), ckptd::v1::JOB_RUNNING);
  // Every heartbeat gets its answer on the same stream.
  for (uint64_t step = 8; step < 12; ++step) {
    ASSERT_TRUE(stream->Write(Beat("node-a", step)));
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
  core_ = std::make_unique<CoordinatorCore>(&store_, state_.get(), &clock_, options_);
  service_ = std::make_unique<CoordinatorService>(core_.get(), CoordinatorServiceOptions());
  CKPTD_ASSERT_OK_AND_ASSIGN(
      server_, StartCoordinatorServer("127.0.0.1:0", service_.get(), grpc::InsecureServerCredentials()));
  stub_ = ckptd::v1::Coordinator::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_.port), grpc::InsecureChannelCredentials()));
  ckptd::v1::RequestCheckpointRequest req;
  req.set_job(kJob);
  EXPECT_THAT(Call(&ckptd::v1::Coordinator::Stub::RequestCheckpoint, req, "Bearer anything"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("no operator token configured")));
}

TEST_F(CoordinatorServiceTest, MalformedRequestsGetInvalidArgumentAndChangeNothing) {
  ckptd::v1::RegisterAgentRequest bad = Registration("../etc", {0});
  EXPECT_THAT(Call(&ckptd::v1::Coordinator::Stub::RegisterAgent, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node id")));
  bad = Registration("node-a", {5});
  EXPECT_THAT(Call(&ckptd::v1::Coordinator::Stub::RegisterAgent, bad),
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
  EXPECT_THAT(Call(&ckptd::v1::Coordinator::Stub::ReportShard, report),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("length")));
  ckptd::v1::RestorePlanRequest plan;
  plan.set_job("no/such job");
  plan.set_world_size(2);
  EXPECT_THAT(Call(&ckptd::v1::Coordinator::Stub::GetRestorePlan, plan),
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
  Deadline(&ctx);
  std::unique_ptr<Stream> stream = stub_->Heartbeats(&ctx);
  ckptd::v1::Heartbeat stale = Beat("node-a", 3);
  stale.set_session(sessions_["node-a"] + 1);
  ASSERT_TRUE(stream->Write(stale));
  ckptd::v1::HeartbeatAck ack;
  ASSERT_TRUE(stream->Read(&ack));
  EXPECT_FALSE(ack.known());
  EXPECT_EQ(ack.schedules_size(), 0);
  // The stream goes on: the agent registers again and keeps beating on it.
  Register("node-a", {0});
  ASSERT_TRUE(stream->Write(Beat("node-a", 4)));
  ASSERT_TRUE(stream->Read(&ack));
  EXPECT_TRUE(ack.known());
  stream->WritesDone();
  EXPECT_THAT(FromGrpcStatus(stream->Finish()), IsOk());
}

TEST_F(CoordinatorServiceTest, InvalidHeartbeatEndsTheStreamWithTheCoreError) {
  Register("node-a", {0});
  grpc::ClientContext ctx;
  Deadline(&ctx);
  std::unique_ptr<Stream> stream = stub_->Heartbeats(&ctx);
  ckptd::v1::Heartbeat bad = Beat("node-a", 3);
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
    Deadline(&ctx);
    std::unique_ptr<Stream> stream = stub_->Heartbeats(&ctx);
    // Heartbeats are sent, their answers never read, then the call is dropped.
    for (int i = 0; i < 50; ++i) {
      if (!stream->Write(Beat("node-a", static_cast<uint64_t>(i)))) break;
    }
    if (round % 2 == 0) absl::SleepFor(absl::Milliseconds(5));
    ctx.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // A stream left open is cut by the shutdown in TearDown; the server still serves.
  grpc::ClientContext open_ctx;
  std::unique_ptr<Stream> open = stub_->Heartbeats(&open_ctx);
  ASSERT_TRUE(open->Write(Beat("node-a", 60)));
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
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  bool lost = false;
  while (!lost && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    lost = !Status().agents(0).alive();
  }
  EXPECT_TRUE(lost);
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

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("secreT", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret2", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secre", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", ""));
  EXPECT_FALSE(ConstantTimeEquals(absl::string_view("secret\0", 7), "secret"));
}

}  // namespace
}  // namespace ckptd::coordinator
