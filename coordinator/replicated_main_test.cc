// Replicated ckptd-coordinator binaries on a real etcd: one leads, the others
// stand by naming it, and one takes over when the leader is killed, paused or
// stopped, with the state the leader kept in etcd.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "base/testing/temp_dir.h"
#include "ckptd/v1/coordinator.grpc.pb.h"
#include "coordinator/standby_service.h"
#include "coordinator/state_store.h"
#include "coordinator/testing_coordinator_process.h"
#include "etcd/testing_etcd.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "rpc/grpc_status.h"
#include "storage/layout.h"
#include "storage/posix_file_system.h"
#include "storage/store.h"
#include "storage/testing_data.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::coordinator::testing::CoordinatorProcess;
using ::ckptd::coordinator::testing::HttpGet;
using ::ckptd::coordinator::testing::NumberAfter;
using ::ckptd::testing::Eventually;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kOperatorToken[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
constexpr char kAgentToken[] = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

class ReplicatedCoordinatorTest : public ::testing::Test {
 protected:
  explicit ReplicatedCoordinatorTest(int etcd_members = 1) : etcd_members_(etcd_members) {}

  void SetUp() override {
    CKPTD_START_ETCD_OR_SKIP(etcd, etcd_members_);
    etcd_ = std::move(etcd);
    for (const auto& [name, token] : {std::pair("operator-token", kOperatorToken), std::pair("agent-token", kAgentToken)}) {
      std::ofstream(dir_.Sub(name)) << token << "\n";
      ::chmod(dir_.Sub(name).c_str(), 0600);
    }
  }

  std::unique_ptr<CoordinatorProcess> Start(const std::string& name, std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = {"--listen", "127.0.0.1:0", "--storage-root", dir_.Sub("root"),
                                      "--etcd-endpoints", etcd_->endpoints(), "--etcd-prefix", "/ckptd/test",
                                      "--operator-token-file", dir_.Sub("operator-token"),
                                      "--agent-token-file", dir_.Sub("agent-token"),
                                      "--heartbeat-interval", "100ms", "--every", "5"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return std::make_unique<CoordinatorProcess>(flags, dir_.Sub(name + ".log"));
  }

  // The port a replica serves on (as a standby first); 0 when it did not start.
  static int Port(CoordinatorProcess& c) {
    int port = 0;
    (void)Eventually(
        [&] {
          port = NumberAfter(c.Log(), "standby on 127.0.0.1:").value_or(0);
          return port != 0 || c.Exited(absl::ZeroDuration());
        },
        absl::Seconds(30));
    return port;
  }

  // GetClusterStatus on `port`: its status, and the ckptd-leader trailer.
  static std::pair<absl::Status, std::string> Status(int port, ckptd::v1::GetClusterStatusResponse* out = nullptr) {
    auto stub = ckptd::v1::Coordinator::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    ckptd::v1::GetClusterStatusResponse resp;
    const grpc::Status s = stub->GetClusterStatus(&ctx, ckptd::v1::GetClusterStatusRequest(), &resp);
    if (out != nullptr) *out = resp;
    std::string leader;
    auto it = ctx.GetServerTrailingMetadata().find(kLeaderMetadataKey);
    if (it != ctx.GetServerTrailingMetadata().end()) leader = std::string(it->second.data(), it->second.size());
    return {rpc::FromGrpcStatus(s), leader};
  }

  // Registers a node with one rank of `job` at the leader on `port`.
  static absl::Status Register(int port, const std::string& job) {
    auto stub = ckptd::v1::Coordinator::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
    ckptd::v1::RegisterAgentRequest req;
    req.set_node_id("node-0");
    ckptd::v1::RankInfo* r = req.add_ranks();
    r->set_job(job);
    r->set_rank(0);
    r->set_world_size(1);
    r->set_pid(4242);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kAgentToken));
    ckptd::v1::RegisterAgentResponse resp;
    return rpc::FromGrpcStatus(stub->RegisterAgent(&ctx, req, &resp));
  }

  static bool Leads(CoordinatorProcess& c) { return c.Log().find("leading (epoch") != std::string::npos; }

  // Starts replica a, waits until it leads, then replica b (a standby); their
  // ports in pa_ and pb_.
  void StartLeaderThenStandby(const std::vector<std::string>& extra = {}) {
    a_ = Start("a", extra);
    pa_ = Port(*a_);
    ASSERT_GT(pa_, 0) << a_->Log();
    ASSERT_TRUE(Eventually([&] { return Leads(*a_); }, absl::Seconds(15))) << a_->Log();
    b_ = Start("b", extra);
    pb_ = Port(*b_);
    ASSERT_GT(pb_, 0) << b_->Log();
  }

  const int etcd_members_;
  ckptd::testing::TempDir dir_{"ckptd_replicated_"};
  std::unique_ptr<CoordinatorProcess> a_, b_;
  int pa_ = 0, pb_ = 0;
  std::unique_ptr<etcd::testing::EtcdCluster> etcd_;
};

TEST_F(ReplicatedCoordinatorTest, OneLeadsTheOtherNamesItAndTakesOverWithTheStateWhenItIsKilled) {
  ASSERT_NO_FATAL_FAILURE(StartLeaderThenStandby());
  CoordinatorProcess* a = a_.get();
  CoordinatorProcess* b = b_.get();
  const int pa = pa_;
  const int pb = pb_;

  EXPECT_THAT(Status(pa).first, ::ckptd::testing::IsOk());
  // The standby answers UNAVAILABLE, naming the leader in words and metadata.
  std::pair<absl::Status, std::string> standby;
  ASSERT_TRUE(Eventually([&] {
    standby = Status(pb);
    return !standby.second.empty();
  })) << standby.first;
  EXPECT_THAT(standby.first, ::ckptd::testing::StatusIs(absl::StatusCode::kUnavailable,
                                                         HasSubstr(absl::StrCat("the leader is 127.0.0.1:", pa))));
  EXPECT_EQ(standby.second, absl::StrCat("127.0.0.1:", pa));

  // A job the leader records (in etcd, with its next tick).
  ASSERT_THAT(Register(pa, "replicated-job"), ::ckptd::testing::IsOk());
  absl::SleepFor(absl::Seconds(1));

  const absl::Time killed = absl::Now();
  a->Signal(SIGKILL);
  ASSERT_TRUE(Eventually([&] { return Status(pb).first.ok(); }, absl::Seconds(15), absl::Milliseconds(50)))
      << b->Log();
  const absl::Duration failover = absl::Now() - killed;
  std::cerr << "failover after SIGKILL of the leader (lease TTL 3s): " << absl::FormatDuration(failover) << "\n";
  // The target is 5 s with the default 3 s lease; a loaded test
  // machine gets some slack.
  EXPECT_LT(failover, absl::Seconds(8));
  ckptd::v1::GetClusterStatusResponse status;
  ASSERT_THAT(Status(pb, &status).first, ::ckptd::testing::IsOk());
  EXPECT_THAT(status.DebugString(), HasSubstr("replicated-job")) << b->Log();
  EXPECT_THAT(b->Log(), HasSubstr("leading (epoch"));
}

TEST_F(ReplicatedCoordinatorTest, APausedLeaderIsReplacedAndStandsByWhenItResumes) {
  ASSERT_NO_FATAL_FAILURE(StartLeaderThenStandby());
  CoordinatorProcess* a = a_.get();
  CoordinatorProcess* b = b_.get();
  const int pa = pa_;
  const int pb = pb_;

  a->Signal(SIGSTOP);
  ASSERT_TRUE(Eventually([&] { return Status(pb).first.ok(); }, absl::Seconds(15), absl::Milliseconds(50)))
      << b->Log();
  a->Signal(SIGCONT);
  // It notices its lease lapsed, says so, and names the new leader.
  ASSERT_TRUE(Eventually(
      [&] {
        const std::string log = a->Log();
        return log.find("no longer the leader") != std::string::npos && log.find("stepping down") != std::string::npos;
      },
      absl::Seconds(10)))
      << a->Log();
  std::pair<absl::Status, std::string> answer;
  ASSERT_TRUE(Eventually([&] {
    answer = Status(pa);
    return answer.second == absl::StrCat("127.0.0.1:", pb);
  })) << answer.first << "\n" << a->Log();
  EXPECT_TRUE(absl::IsUnavailable(answer.first));
  EXPECT_THAT(Status(pb).first, ::ckptd::testing::IsOk());
}

TEST_F(ReplicatedCoordinatorTest, AStoppedLeaderResignsAndTheStandbyTakesOverAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartLeaderThenStandby({"--etcd-lease-ttl", "30s"}));
  CoordinatorProcess* a = a_.get();
  CoordinatorProcess* b = b_.get();
  const int pb = pb_;
  ASSERT_TRUE(Eventually([&] { return !Status(pb).second.empty(); }));
  const absl::Time stopped = absl::Now();
  EXPECT_EQ(a->Stop(), 0) << a->Log();
  ASSERT_TRUE(Eventually([&] { return Status(pb).first.ok(); }, absl::Seconds(10), absl::Milliseconds(50)))
      << b->Log();
  // Not the 30 s lease: the leader resigned.
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(5));
}

// Whether the coordinator on `port` serves and lists `node` as alive.
bool ListsAliveNode(int port, const std::string& node) {
  ckptd::v1::GetClusterStatusResponse status;
  auto stub = ckptd::v1::Coordinator::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (!stub->GetClusterStatus(&ctx, ckptd::v1::GetClusterStatusRequest(), &status).ok()) return false;
  for (const auto& a : status.agents()) {
    if (a.node_id() == node && a.alive()) return true;
  }
  return false;
}

// Runs `argv` to its end (at most 30 s): its exit code and output.
std::pair<int, std::string> RunToEnd(const std::vector<std::string>& argv, const std::string& log) {
  CoordinatorProcess::Spawned p(argv, log);
  const int code = p.Wait(absl::Seconds(30));
  return {code, p.Log()};
}

TEST_F(ReplicatedCoordinatorTest, AgentsAndCkptctlGivenTheReplicasFollowTheLeaderAcrossAFailover) {
  ASSERT_NO_FATAL_FAILURE(StartLeaderThenStandby());
  CoordinatorProcess* a = a_.get();
  CoordinatorProcess* b = b_.get();
  const int pa = pa_;
  const int pb = pb_;
  ASSERT_TRUE(Eventually([&] { return !Status(pb).second.empty(); }));
  // The standby first: the agent is sent on to the leader.
  const std::string both = absl::StrCat("127.0.0.1:", pb, ",127.0.0.1:", pa);
  CoordinatorProcess::Spawned agent({CKPTD_AGENT_BIN, "--storage-root", dir_.Sub("root"), "--socket",
                                     dir_.Sub("agent.sock"), "--coordinator", both, "--node-id", "node-a",
                                     "--agent-token-file", dir_.Sub("agent-token"), "--threads", "2"},
                                    dir_.Sub("agent.log"));
  ASSERT_TRUE(Eventually([&] { return ListsAliveNode(pa, "node-a"); }, absl::Seconds(20))) << agent.Log();
  auto [code, out] = RunToEnd({CKPTD_CTL_BIN, "status", "--coordinator", both}, dir_.Sub("ctl1.log"));
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("node-a"));

  const absl::Time killed = absl::Now();
  a->Signal(SIGKILL);
  ASSERT_TRUE(Eventually([&] { return ListsAliveNode(pb, "node-a"); }, absl::Seconds(20), absl::Milliseconds(50)))
      << agent.Log() << b->Log();
  std::cerr << "from the leader's SIGKILL to the agent registered with the new leader: "
            << absl::FormatDuration(absl::Now() - killed) << "\n";
  EXPECT_THAT(agent.Log(), HasSubstr(absl::StrCat("registered with coordinator 127.0.0.1:", pb)));
  // The dead replica first in the list: ckptctl goes on to the live one.
  std::tie(code, out) = RunToEnd({CKPTD_CTL_BIN, "status", "--coordinator", absl::StrCat("127.0.0.1:", pa, ",127.0.0.1:", pb)},
                            dir_.Sub("ctl2.log"));
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("node-a"));
}

// What an operator sees of replicated coordinators: `ckptctl status` names
// the leader, the standby and etcd's members, as text and as JSON; /metrics
// says which replica leads, counts the leader change and times the calls to
// etcd. The first leader imports a single coordinator's state directory
// (--import-state) into the empty prefix, and the standby, taking over,
// serves that imported job.
TEST_F(ReplicatedCoordinatorTest, OperatorsSeeTheReplicasEtcdAndMetricsAndAStateDirIsImported) {
  const std::string single = dir_.Sub("single-state");
  {
    absl::StatusOr<std::unique_ptr<StateStore>> sqlite = OpenSqliteStateStore(single);
    ASSERT_THAT(sqlite.status(), ::ckptd::testing::IsOk());
    ckptd::v1::JobRecord job;
    job.set_job("imported-job");
    job.set_checkpoints_committed(17);
    job.set_world_size(4);
    ASSERT_THAT((*sqlite)->PutJob(job), ::ckptd::testing::IsOk());
    ckptd::v1::FailureEvent e;
    e.set_job("imported-job");
    e.set_node_id("node-9");
    e.set_kind(ckptd::v1::NODE_LOST);
    e.set_unix_nanos(absl::ToUnixNanos(absl::Now()));
    ASSERT_THAT((*sqlite)->AppendEvent(e), ::ckptd::testing::IsOk());
  }
  a_ = Start("a", {"--import-state", single, "--metrics-listen", "127.0.0.1:0"});
  pa_ = Port(*a_);
  ASSERT_GT(pa_, 0) << a_->Log();
  ASSERT_TRUE(Eventually([&] { return Leads(*a_); }, absl::Seconds(15))) << a_->Log();
  EXPECT_THAT(a_->Log(), HasSubstr("imported 1 job, 0 quarantined steps, 1 failure event from " + single));
  b_ = Start("b", {"--metrics-listen", "127.0.0.1:0"});
  pb_ = Port(*b_);
  ASSERT_GT(pb_, 0) << b_->Log();

  const std::string both = absl::StrCat("127.0.0.1:", pb_, ",127.0.0.1:", pa_);
  // The standby shows once its first roster refresh is in etcd.
  std::pair<int, std::string> ctl;
  ASSERT_TRUE(Eventually(
      [&] {
        ctl = RunToEnd({CKPTD_CTL_BIN, "status", "--coordinator", both}, dir_.Sub("status.log"));
        return ctl.second.find(absl::StrCat("standby 127.0.0.1:", pb_)) != std::string::npos;
      },
      absl::Seconds(15), absl::Milliseconds(500)))
      << ctl.second;
  EXPECT_EQ(ctl.first, 0) << ctl.second;
  EXPECT_THAT(ctl.second, HasSubstr(absl::StrCat("coordinators: leader 127.0.0.1:", pa_, " (epoch ")));
  EXPECT_THAT(ctl.second, HasSubstr("etcd prefix /ckptd/test, lease 3s"));
  EXPECT_THAT(ctl.second, HasSubstr("etcd: 1 of 1 members healthy"));
  EXPECT_THAT(ctl.second, HasSubstr(absl::StrCat(etcd_->endpoint(0), "  healthy  leader")));
  EXPECT_THAT(ctl.second, HasSubstr("imported-job: checkpoints 17 committed"));
  std::cerr << ctl.second;
  ctl = RunToEnd({CKPTD_CTL_BIN, "status", "--json", "--coordinator", both}, dir_.Sub("status-json.log"));
  EXPECT_EQ(ctl.first, 0) << ctl.second;
  EXPECT_THAT(ctl.second, HasSubstr(absl::StrCat("\"replication\":{\"leader\":\"127.0.0.1:", pa_, "\"")));
  EXPECT_THAT(ctl.second, HasSubstr(absl::StrCat("\"standbys\":[\"127.0.0.1:", pb_, "\"]")));
  EXPECT_THAT(ctl.second, HasSubstr("\"healthy\":true"));

  const int ma = NumberAfter(a_->Log(), "metrics on http://127.0.0.1:").value_or(0);
  const int mb = NumberAfter(b_->Log(), "metrics on http://127.0.0.1:").value_or(0);
  ASSERT_GT(ma, 0) << a_->Log();
  ASSERT_GT(mb, 0) << b_->Log();
  std::string metrics = HttpGet(ma, "/metrics");
  EXPECT_THAT(metrics, HasSubstr("ckptd_coordinator_is_leader 1\n"));
  EXPECT_THAT(metrics, HasSubstr("ckptd_etcd_request_seconds_count{call=\"Txn\"}"));
  EXPECT_THAT(metrics, HasSubstr("ckptd_etcd_request_seconds_count{call=\"LeaseKeepAlive\"}"));
  metrics = HttpGet(mb, "/metrics");
  EXPECT_THAT(metrics, HasSubstr("ckptd_coordinator_is_leader 0\n"));
  EXPECT_THAT(metrics, HasSubstr("ckptd_coordinator_leader_changes_total 0\n"));

  // The leader dies: the standby leads, with the imported job, and counts
  // one change of leader.
  a_->Signal(SIGKILL);
  ASSERT_TRUE(Eventually([&] { return Status(pb_).first.ok(); }, absl::Seconds(15))) << b_->Log();
  ckptd::v1::GetClusterStatusResponse status;
  ASSERT_THAT(Status(pb_, &status).first, ::ckptd::testing::IsOk());
  EXPECT_THAT(status.DebugString(), HasSubstr("imported-job"));
  EXPECT_EQ(status.replication().leader(), absl::StrCat("127.0.0.1:", pb_));
  ASSERT_TRUE(Eventually([&] { return HttpGet(mb, "/metrics").find("ckptd_coordinator_is_leader 1\n") != std::string::npos; }));
  metrics = HttpGet(mb, "/metrics");
  EXPECT_THAT(metrics, HasSubstr("ckptd_coordinator_leader_changes_total 1\n"));
  EXPECT_THAT(b_->Log(), Not(HasSubstr("imported")));
}

// What agents of a job of two ranks (node-0 hosts rank 0, node-1 rank 1)
// send a coordinator, over gRPC with the agents' token.
class TwoRankAgents {
 public:
  static constexpr char kJob[] = "restoring";

  // Registers both nodes at the leader on `port` (retried while it is not
  // the leader yet), sending `durable` again as an agent does.
  absl::Status RegisterAt(int port, const std::vector<ckptd::v1::ShardReport>& durable = {}) {
    stub_ = ckptd::v1::Coordinator::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
    for (uint32_t r = 0; r < 2; ++r) {
      ckptd::v1::RegisterAgentRequest req;
      req.set_node_id(absl::StrCat("node-", r));
      req.set_instance(77 + r);
      req.set_drills_allowed(true);
      ckptd::v1::RankInfo* info = req.add_ranks();
      info->set_job(kJob);
      info->set_rank(r);
      info->set_world_size(2);
      info->set_pid(4242 + static_cast<int>(r));
      for (const auto& d : durable) {
        if (d.shard().rank() == r) *req.add_durable_shards() = d;
      }
      absl::StatusOr<ckptd::v1::RegisterAgentResponse> resp;
      (void)Eventually([&] {
        resp = Call(&ckptd::v1::Coordinator::Stub::RegisterAgent, req);
        return resp.ok();
      }, absl::Seconds(15));
      if (!resp.ok()) return resp.status();
      sessions_[r] = resp->session();
    }
    return absl::OkStatus();
  }

  // Writes rank `rank`'s shard of `step` into `root`: the report its agent sends.
  static absl::StatusOr<ckptd::v1::ShardReport> Write(const std::string& root, uint64_t step, uint32_t rank) {
    std::unique_ptr<storage::PosixFileSystem> fs = storage::NewPosixFileSystem();
    storage::CheckpointStore store(fs.get(), root);
    if (absl::Status s = store.PrepareStep(kJob, step); !s.ok()) return s;
    ckptd::testing::RankData data = ckptd::testing::MakeRankData(step, rank, 256, 16);
    absl::StatusOr<storage::ShardWriteResult> w =
        store.WriteShard(kJob, step, rank, 2, ckptd::testing::RankSources(data, "w", "rng"));
    if (!w.ok()) return w.status();
    ckptd::v1::ShardReport r;
    r.set_job(kJob);
    r.set_step(step);
    r.set_world_size(2);
    r.mutable_shard()->set_rank(rank);
    r.mutable_shard()->set_file_length(w->file_length);
    r.mutable_shard()->set_index_xxh3(w->index_xxh3);
    r.mutable_shard()->set_raw_bytes(w->raw_bytes);
    r.mutable_shard()->set_stored_bytes(w->stored_bytes);
    return r;
  }

  absl::StatusOr<ckptd::v1::ReportShardResponse> Report(const ckptd::v1::ShardReport& report) {
    ckptd::v1::ReportShardRequest req;
    req.set_node_id(absl::StrCat("node-", report.shard().rank()));
    req.set_session(sessions_[report.shard().rank()]);
    *req.mutable_report() = report;
    return Call(&ckptd::v1::Coordinator::Stub::ReportShard, req);
  }

  absl::Status TrainerDied(uint32_t rank) {
    ckptd::v1::ReportFailureRequest req;
    req.set_node_id(absl::StrCat("node-", rank));
    req.set_session(sessions_[rank]);
    req.set_job(kJob);
    req.set_rank(rank);
    req.set_kind(ckptd::v1::TRAINER_DIED);
    return Call(&ckptd::v1::Coordinator::Stub::ReportFailure, req).status();
  }

  // A heartbeat of node-`rank` (a stream of one): its answer, with the
  // drill orders it carries.
  absl::StatusOr<ckptd::v1::HeartbeatAck> Beat(uint32_t rank) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kAgentToken));
    auto stream = stub_->Heartbeats(&ctx);
    ckptd::v1::Heartbeat hb;
    hb.set_node_id(absl::StrCat("node-", rank));
    hb.set_session(sessions_[rank]);
    ckptd::v1::RankInfo* info = hb.add_ranks();
    info->set_job(kJob);
    info->set_rank(rank);
    info->set_world_size(2);
    info->set_pid(4242 + static_cast<int>(rank));
    ckptd::v1::HeartbeatAck ack;
    if (!stream->Write(hb) || !stream->Read(&ack)) return absl::UnavailableError("heartbeat stream broke");
    stream->WritesDone();
    (void)stream->Finish();
    return ack;
  }

  // Rank `rank` asks for its plan, having loaded `attempt` intact.
  absl::StatusOr<ckptd::v1::RestorePlanResponse> Plan(uint32_t rank, std::optional<uint64_t> attempt = std::nullopt) {
    ckptd::v1::RestorePlanRequest req;
    req.set_node_id(absl::StrCat("node-", rank));
    req.set_session(sessions_[rank]);
    req.set_pid(4242 + static_cast<int>(rank));
    req.set_trainer_id(1);
    req.set_job(kJob);
    req.set_rank(rank);
    req.set_world_size(2);
    if (attempt) {
      req.set_has_attempt(true);
      req.set_attempt_step(*attempt);
      req.set_attempt_ok(true);
      req.set_attempt_source(ckptd::v1::STORAGE_ROOT);
    }
    return Call(&ckptd::v1::Coordinator::Stub::GetRestorePlan, req);
  }

 private:
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(grpc::Status (ckptd::v1::Coordinator::Stub::*method)(grpc::ClientContext*,
                                                                                     const Request&, Response*),
                                const Request& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kAgentToken));
    Response resp;
    const grpc::Status s = (stub_.get()->*method)(&ctx, req, &resp);
    if (!s.ok()) return rpc::FromGrpcStatus(s);
    return resp;
  }

  std::unique_ptr<ckptd::v1::Coordinator::Stub> stub_;
  std::map<uint32_t, std::string> sessions_;
};

// The leader is SIGKILLed in the middle of a restore round: every rank had
// loaded step 10, rank 1 was told GO (and trains), rank 0 was told to wait.
// The replica that takes over tells rank 0 GO for the same step in the same
// incarnation (not a new round rank 1 never joins).
TEST_F(ReplicatedCoordinatorTest, ARestoreRoundUnderWayKeepsItsStepWhenTheLeaderIsKilled) {
  ASSERT_NO_FATAL_FAILURE(StartLeaderThenStandby());
  TwoRankAgents agents;
  ASSERT_THAT(agents.RegisterAt(pa_), ::ckptd::testing::IsOk()) << a_->Log();
  for (uint32_t r = 0; r < 2; ++r) {
    absl::StatusOr<ckptd::v1::ShardReport> report = TwoRankAgents::Write(dir_.Sub("root"), 10, r);
    ASSERT_THAT(report.status(), ::ckptd::testing::IsOk());
    absl::StatusOr<ckptd::v1::ReportShardResponse> resp = agents.Report(*report);
    ASSERT_THAT(resp.status(), ::ckptd::testing::IsOk());
    EXPECT_EQ(resp->committed(), r == 1);
  }
  ASSERT_THAT(agents.TrainerDied(0), ::ckptd::testing::IsOk());
  for (uint32_t r = 0; r < 2; ++r) {
    absl::StatusOr<ckptd::v1::RestorePlanResponse> plan = agents.Plan(r);
    ASSERT_THAT(plan.status(), ::ckptd::testing::IsOk());
    ASSERT_EQ(plan->verdict(), ckptd::v1::RestorePlanResponse::LOAD);
    ASSERT_EQ(plan->step(), 10u);
  }
  absl::StatusOr<ckptd::v1::RestorePlanResponse> wait = agents.Plan(0, 10);
  ASSERT_THAT(wait.status(), ::ckptd::testing::IsOk());
  ASSERT_EQ(wait->verdict(), ckptd::v1::RestorePlanResponse::WAIT);
  absl::StatusOr<ckptd::v1::RestorePlanResponse> go = agents.Plan(1, 10);
  ASSERT_THAT(go.status(), ::ckptd::testing::IsOk());
  ASSERT_EQ(go->verdict(), ckptd::v1::RestorePlanResponse::GO);

  a_->Signal(SIGKILL);
  ASSERT_THAT(agents.RegisterAt(pb_), ::ckptd::testing::IsOk()) << b_->Log();
  absl::StatusOr<ckptd::v1::RestorePlanResponse> taken = agents.Plan(0, 10);
  ASSERT_THAT(taken.status(), ::ckptd::testing::IsOk()) << b_->Log();
  EXPECT_EQ(taken->verdict(), ckptd::v1::RestorePlanResponse::GO);
  EXPECT_EQ(taken->step(), 10u);
  EXPECT_EQ(taken->incarnation(), go->incarnation());
}

// The leader is SIGKILLed between two ranks' reports of a step: the agent
// that reported to it sends its report again when it registers with the new
// leader, which commits the step once, from both shards.
TEST_F(ReplicatedCoordinatorTest, AStepHalfReportedWhenTheLeaderIsKilledCommitsOnceAtTheNext) {
  ASSERT_NO_FATAL_FAILURE(StartLeaderThenStandby());
  TwoRankAgents agents;
  ASSERT_THAT(agents.RegisterAt(pa_), ::ckptd::testing::IsOk()) << a_->Log();
  std::vector<ckptd::v1::ShardReport> reports;
  for (uint32_t r = 0; r < 2; ++r) {
    absl::StatusOr<ckptd::v1::ShardReport> report = TwoRankAgents::Write(dir_.Sub("root"), 20, r);
    ASSERT_THAT(report.status(), ::ckptd::testing::IsOk());
    reports.push_back(*report);
  }
  absl::StatusOr<ckptd::v1::ReportShardResponse> first = agents.Report(reports[0]);
  ASSERT_THAT(first.status(), ::ckptd::testing::IsOk());
  EXPECT_FALSE(first->committed());
  const std::string manifest = storage::ManifestPath(dir_.Sub("root"), TwoRankAgents::kJob, 20);
  EXPECT_FALSE(std::filesystem::exists(manifest));

  a_->Signal(SIGKILL);
  ASSERT_THAT(agents.RegisterAt(pb_, {reports[0]}), ::ckptd::testing::IsOk()) << b_->Log();
  absl::StatusOr<ckptd::v1::ReportShardResponse> second = agents.Report(reports[1]);
  ASSERT_THAT(second.status(), ::ckptd::testing::IsOk()) << b_->Log();
  EXPECT_TRUE(second->committed());
  EXPECT_TRUE(std::filesystem::exists(manifest));
  // Reported again (an agent that did not hear the answer): committed, once.
  absl::StatusOr<ckptd::v1::ReportShardResponse> again = agents.Report(reports[1]);
  ASSERT_THAT(again.status(), ::ckptd::testing::IsOk());
  EXPECT_TRUE(again->committed());
  ckptd::v1::GetClusterStatusResponse status;
  ASSERT_TRUE(Eventually([&] { return Status(pb_, &status).first.ok(); }));
  ASSERT_EQ(status.jobs_size(), 1) << status.DebugString();
  EXPECT_EQ(status.jobs(0).newest_committed_step(), 20u);
  EXPECT_EQ(status.jobs(0).checkpoints_committed(), 1u) << status.DebugString();
}

// The leader is SIGKILLed right after it ordered a drill that no agent has
// carried out yet: the next leader answers for the drill and sends the order.
TEST_F(ReplicatedCoordinatorTest, ADrillOrderedByALeaderThatDiedIsFollowedByTheNext) {
  ASSERT_NO_FATAL_FAILURE(StartLeaderThenStandby());
  TwoRankAgents agents;
  ASSERT_THAT(agents.RegisterAt(pa_), ::ckptd::testing::IsOk()) << a_->Log();
  auto ctl = [](int port) {
    return ckptd::v1::Coordinator::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  };
  ckptd::v1::RunDrillRequest order;
  order.set_job(TwoRankAgents::kJob);
  order.set_scenario(ckptd::v1::KILL_TRAINER);
  order.set_rank(1);
  ckptd::v1::RunDrillResponse ordered;
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kOperatorToken));
    ASSERT_TRUE(ctl(pa_)->RunDrill(&ctx, order, &ordered).ok()) << a_->Log();
  }
  EXPECT_EQ(ordered.node_id(), "node-1");

  a_->Signal(SIGKILL);
  ASSERT_THAT(agents.RegisterAt(pb_), ::ckptd::testing::IsOk()) << b_->Log();
  ckptd::v1::GetDrillRequest get;
  get.set_drill_id(ordered.drill_id());
  ckptd::v1::DrillStatus status;
  grpc::Status got;
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kOperatorToken));
    got = ctl(pb_)->GetDrill(&ctx, get, &status);
  }
  ASSERT_TRUE(got.ok()) << got.error_message() << "\n" << b_->Log();
  EXPECT_EQ(status.node_id(), "node-1");
  EXPECT_EQ(status.request().scenario(), ckptd::v1::KILL_TRAINER);
  absl::StatusOr<ckptd::v1::HeartbeatAck> ack = agents.Beat(1);
  ASSERT_THAT(ack.status(), ::ckptd::testing::IsOk());
  ASSERT_EQ(ack->drills_size(), 1) << ack->DebugString();
  EXPECT_EQ(ack->drills(0).drill_id(), ordered.drill_id());
  EXPECT_EQ(ack->drills(0).rank(), 1u);
}

// A state directory that is not one is refused before the replica joins
// the election, naming the directory.
TEST_F(ReplicatedCoordinatorTest, ImportingAMissingStateDirFailsAtStart) {
  auto c = Start("bad", {"--import-state", dir_.Sub("no-such-state")});
  ASSERT_TRUE(c->Exited(absl::Seconds(20))) << c->Log();
  EXPECT_THAT(c->Log(), HasSubstr("holds no coordinator state to import"));
  EXPECT_THAT(c->Log(), HasSubstr(dir_.Sub("no-such-state")));
  EXPECT_THAT(c->Log(), Not(HasSubstr("standby on")));
}

// The same on a cluster of three etcd members.
class ReplicatedOnThreeMembersTest : public ReplicatedCoordinatorTest {
 protected:
  ReplicatedOnThreeMembersTest() : ReplicatedCoordinatorTest(3) {}
};

TEST_F(ReplicatedOnThreeMembersTest, AMemberLostChangesNothingAQuorumLostStopsServiceUntilItReturns) {
  ASSERT_NO_FATAL_FAILURE(StartLeaderThenStandby());
  ASSERT_THAT(Register(pa_, "quorum-job"), ::ckptd::testing::IsOk());
  absl::SleepFor(absl::Seconds(1));  // the job's record reaches etcd at a tick

  // One member of three lost (etcd's raft leader, maybe: etcd then elects
  // another, a second or two without answers): service goes on, with the
  // job's record. The leader renews its lease again at once when a renewal
  // fails, so it normally keeps leading; on a loaded machine the
  // leadership may move to the other replica, which is service too.
  ASSERT_TRUE(etcd_->Kill(2).ok());
  absl::SleepFor(absl::Seconds(5));
  int serving = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        serving = Status(pa_).first.ok() ? pa_ : Status(pb_).first.ok() ? pb_ : 0;
        return serving != 0;
      },
      absl::Seconds(10), absl::Milliseconds(100)))
      << a_->Log() << b_->Log();
  {
    ckptd::v1::GetClusterStatusResponse status;
    ASSERT_THAT(Status(serving, &status).first, ::ckptd::testing::IsOk());
    EXPECT_THAT(status.DebugString(), HasSubstr("quorum-job"));
    EXPECT_EQ(status.replication().etcd_members_size(), 3);
  }
  if (serving != pa_) std::cerr << "the leadership moved when an etcd member was lost:\n" << a_->Log();

  // Two lost: no lease can be renewed; the leader steps down saying why, and
  // no replica serves.
  CoordinatorProcess& leader = serving == pa_ ? *a_ : *b_;
  const size_t seen = leader.Log().size();
  ASSERT_TRUE(etcd_->Kill(1).ok());
  ASSERT_TRUE(Eventually([&] { return leader.Log().find("no longer the leader", seen) != std::string::npos; },
                         absl::Seconds(15)))
      << leader.Log();
  EXPECT_THAT(leader.Log().substr(seen), HasSubstr("cut off from etcd"));
  EXPECT_TRUE(absl::IsUnavailable(Status(pa_).first));
  EXPECT_TRUE(absl::IsUnavailable(Status(pb_).first));

  // The quorum returns: a replica leads again, with the job's record.
  ASSERT_TRUE(etcd_->Restart(1, /*wait_healthy=*/false).ok());
  ASSERT_TRUE(etcd_->Restart(2, /*wait_healthy=*/false).ok());
  serving = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        serving = Status(pa_).first.ok() ? pa_ : Status(pb_).first.ok() ? pb_ : 0;
        return serving != 0;
      },
      absl::Seconds(40), absl::Milliseconds(200)))
      << a_->Log() << b_->Log();
  ckptd::v1::GetClusterStatusResponse status;
  ASSERT_THAT(Status(serving, &status).first, ::ckptd::testing::IsOk());
  EXPECT_THAT(status.DebugString(), HasSubstr("quorum-job"));
}

}  // namespace
}  // namespace ckptd::coordinator
