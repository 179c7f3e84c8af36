// CoordinatorLink against a fake coordinator served over gRPC on a local port.
#include "agent/coordinator_link.h"

#include <functional>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent_metrics.h"
#include "base/clock.h"
#include "base/testing/eventually.h"
#include "base/testing/http_get.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "metrics/http_server.h"
#include "metrics/registry.h"

namespace ckptd::agent {
namespace {

using ::ckptd::testing::Eventually;

class FakeCoordinator final : public ckptd::v1::Coordinator::Service {
 public:
  grpc::Status RegisterAgent(grpc::ServerContext*, const ckptd::v1::RegisterAgentRequest* req,
                             ckptd::v1::RegisterAgentResponse* resp) override {
    absl::MutexLock l(&mu_);
    if (refuse_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not taking registrations");
    registrations_.push_back(*req);
    forgotten_ = false;
    resp->set_session(absl::StrCat("session-", registrations_.size()));
    resp->set_heartbeat_interval_ms(10);
    resp->set_coordinator_epoch(epoch_);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeats(grpc::ServerContext*,
                          grpc::ServerReaderWriter<ckptd::v1::HeartbeatAck, ckptd::v1::Heartbeat>* stream) override {
    ckptd::v1::Heartbeat hb;
    while (stream->Read(&hb)) {
      ckptd::v1::HeartbeatAck ack;
      {
        absl::MutexLock l(&mu_);
        ++heartbeats_;
        ack.set_known(!forgotten_);
        ack.set_coordinator_epoch(epoch_);
        for (const auto& o : orders_) *ack.add_drills() = o;
      }
      if (!stream->Write(ack)) break;
    }
    return grpc::Status::OK;
  }

  grpc::Status ReportShard(grpc::ServerContext*, const ckptd::v1::ReportShardRequest* req,
                           ckptd::v1::ReportShardResponse* resp) override {
    absl::MutexLock l(&mu_);
    shard_reports_ += req->batch_size();
    for (int i = 0; i < req->batch_size(); ++i) resp->add_batch_results();
    return grpc::Status::OK;
  }

  int heartbeats() {
    absl::MutexLock l(&mu_);
    return heartbeats_;
  }
  int shard_reports() {
    absl::MutexLock l(&mu_);
    return shard_reports_;
  }
  std::vector<ckptd::v1::RegisterAgentRequest> registrations() {
    absl::MutexLock l(&mu_);
    return registrations_;
  }
  void Forget() {
    absl::MutexLock l(&mu_);
    forgotten_ = true;
  }
  // Registrations fail (UNAVAILABLE) while set.
  void Refuse(bool refuse) {
    absl::MutexLock l(&mu_);
    refuse_ = refuse;
  }
  void SetEpoch(uint64_t epoch) {
    absl::MutexLock l(&mu_);
    epoch_ = epoch;
  }
  void AddOrder(const ckptd::v1::DrillOrder& o) {
    absl::MutexLock l(&mu_);
    orders_.push_back(o);
  }

 private:
  absl::Mutex mu_;
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int shard_reports_ ABSL_GUARDED_BY(mu_) = 0;
  bool forgotten_ ABSL_GUARDED_BY(mu_) = false;
  bool refuse_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<ckptd::v1::RegisterAgentRequest> registrations_ ABSL_GUARDED_BY(mu_);
  std::vector<ckptd::v1::DrillOrder> orders_ ABSL_GUARDED_BY(mu_);
};

class CoordinatorLinkTest : public ::testing::Test {
 protected:
  CoordinatorLinkTest() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
  }
  ~CoordinatorLinkTest() override { server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1))); }

  CoordinatorLinkOptions Options() {
    CoordinatorLinkOptions o;
    o.address = absl::StrCat("127.0.0.1:", port_);
    o.node_id = "node-a";
    o.heartbeat_interval = absl::Milliseconds(10);
    o.max_backoff = absl::Milliseconds(200);
    o.clock = &clock_;
    return o;
  }

  // Both threads of the link (heartbeats, sender) wait on its clock: nothing
  // of it is in flight, and nothing happens until the clock moves.
  bool Idle() {
    return Eventually([this] { return clock_.waiters() == 2; });
  }
  // Moves the link's clock by `step` at a time, each time once the link is
  // idle, until `done` holds; false when it does not within `max`.
  bool AdvanceUntil(const std::function<bool()>& done, absl::Duration step, absl::Duration max = absl::Minutes(1)) {
    for (absl::Duration spent = absl::ZeroDuration();; spent += step) {
      if (!Idle()) return false;
      if (done()) return true;
      if (spent >= max) return false;
      clock_.Advance(step);
    }
  }

  base::FakeClock clock_;
  FakeCoordinator fake_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(CoordinatorLinkTest, RegistrationSaysDrillsAllowedAndAcksReachTheCaller) {
  ASSERT_NE(port_, 0);
  ckptd::v1::DrillOrder order;
  order.set_drill_id(7);
  order.set_scenario(ckptd::v1::KILL_TRAINER);
  fake_.AddOrder(order);
  absl::Mutex mu;
  std::vector<uint64_t> seen;
  CoordinatorLinkOptions o = Options();
  o.drills_allowed = true;
  o.on_ack = [&](const ckptd::v1::HeartbeatAck& ack) {
    absl::MutexLock l(&mu);
    for (const auto& d : ack.drills()) seen.push_back(d.drill_id());
  };
  CoordinatorLink link(o, [](ckptd::v1::Heartbeat*) {});
  ASSERT_TRUE(AdvanceUntil(
      [&] {
        absl::MutexLock l(&mu);
        return !seen.empty();
      },
      absl::Milliseconds(100)));
  {
    absl::MutexLock l(&mu);
    EXPECT_EQ(seen.front(), 7u);
  }
  ASSERT_FALSE(fake_.registrations().empty());
  EXPECT_TRUE(fake_.registrations().front().drills_allowed());
}

TEST_F(CoordinatorLinkTest, CutOffSendsNothingThenReconnectsAndRegistersAgain) {
  CoordinatorLink link(Options(), [](ckptd::v1::Heartbeat*) {});
  // A beat every interval (10 ms) of the link's clock.
  ASSERT_TRUE(AdvanceUntil([&] { return fake_.heartbeats() >= 3; }, absl::Milliseconds(10)));
  EXPECT_FALSE(link.cut_off());
  // Idle: no beat is in flight that could still land.
  link.CutOff(absl::Minutes(1));
  EXPECT_TRUE(link.cut_off());
  const int during = fake_.heartbeats();
  // Reports wait, and restore plans fail as if the coordinator were away.
  ckptd::v1::ShardReport shard;
  shard.set_job("job");
  shard.set_step(1);
  link.ShardDurable(shard);
  EXPECT_EQ(link.RestorePlan(ckptd::v1::RestorePlanRequest(), absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnavailable);
  // The coordinator forgets the node meanwhile. 59 s of the cut-off go by:
  // nothing is sent.
  fake_.Forget();
  for (int i = 0; i < 59; ++i) {
    ASSERT_TRUE(Idle());
    clock_.Advance(absl::Seconds(1));
  }
  ASSERT_TRUE(Idle());
  EXPECT_TRUE(link.cut_off());
  EXPECT_EQ(fake_.heartbeats(), during);
  EXPECT_EQ(fake_.shard_reports(), 0);
  EXPECT_EQ(fake_.registrations().size(), 1u);
  EXPECT_EQ(link.unanswered_shards(), 1u);
  // Afterwards it beats again, registers anew and sends what it held.
  ASSERT_TRUE(AdvanceUntil([&] { return fake_.registrations().size() >= 2 && fake_.heartbeats() > during + 2; },
                           absl::Seconds(1)));
  EXPECT_FALSE(link.cut_off());
  EXPECT_TRUE(AdvanceUntil([&] { return link.unanswered_shards() == 0; }, absl::Milliseconds(100)));
}

TEST_F(CoordinatorLinkTest, AnsweredReportsGoAgainWithTheNextRegistration) {
  CoordinatorLink link(Options(), [](ckptd::v1::Heartbeat*) {});
  ASSERT_TRUE(AdvanceUntil([&] { return fake_.heartbeats() >= 1; }, absl::Milliseconds(10)));
  auto report = [](uint64_t step, uint32_t rank) {
    ckptd::v1::ShardReport r;
    r.set_job("job");
    r.set_step(step);
    r.mutable_shard()->set_rank(rank);
    return r;
  };
  link.ShardDurable(report(5, 0));
  link.ShardDurable(report(5, 1));
  ASSERT_TRUE(AdvanceUntil([&] { return fake_.shard_reports() == 2; }, absl::Milliseconds(100)));
  link.ShardDurable(report(10, 0));  // rank 0's newer step replaces its step 5
  ASSERT_TRUE(AdvanceUntil([&] { return fake_.shard_reports() == 3; }, absl::Milliseconds(100)));
  EXPECT_EQ(link.unanswered_shards(), 0u);
  EXPECT_EQ(link.answered_shards(), 2u);
  // The coordinator dies before committing (or a new leader takes over):
  // the agent registers again with what it reported.
  fake_.Forget();
  ASSERT_TRUE(AdvanceUntil([&] { return fake_.registrations().size() >= 2; }, absl::Milliseconds(10)));
  const ckptd::v1::RegisterAgentRequest again = fake_.registrations()[1];
  std::vector<std::pair<uint64_t, uint32_t>> sent;
  for (const auto& r : again.durable_shards()) sent.emplace_back(r.step(), r.shard().rank());
  EXPECT_THAT(sent, ::testing::UnorderedElementsAre(std::pair<uint64_t, uint32_t>(10, 0),
                                                    std::pair<uint64_t, uint32_t>(5, 1)));
}

TEST_F(CoordinatorLinkTest, AnswersOfAnOlderLeadershipEpochAreRefused) {
  fake_.SetEpoch(7);
  absl::Mutex mu;
  int orders_seen = 0;
  CoordinatorLinkOptions o = Options();
  o.on_ack = [&](const ckptd::v1::HeartbeatAck& ack) {
    absl::MutexLock l(&mu);
    orders_seen += ack.drills_size();
  };
  CoordinatorLink link(o, [](ckptd::v1::Heartbeat*) {});
  ASSERT_TRUE(AdvanceUntil([&] { return fake_.heartbeats() >= 2; }, absl::Milliseconds(10)));
  EXPECT_EQ(link.coordinator_epoch(), 7u);
  // A deposed leader (epoch 3) answers, with an order: refused.
  fake_.SetEpoch(3);
  ckptd::v1::DrillOrder order;
  order.set_drill_id(1);
  fake_.AddOrder(order);
  // The link drops the stream and keeps trying to register: refused too.
  const size_t before = fake_.registrations().size();
  ASSERT_TRUE(AdvanceUntil([&] { return fake_.registrations().size() >= before + 2; }, absl::Milliseconds(10)));
  {
    absl::MutexLock l(&mu);
    EXPECT_EQ(orders_seen, 0);
  }
  EXPECT_EQ(link.coordinator_epoch(), 7u);
  EXPECT_FALSE(link.connected());
  // The next leader (epoch 8) is heard, and its orders carried out.
  fake_.SetEpoch(8);
  ASSERT_TRUE(AdvanceUntil(
      [&] {
        absl::MutexLock l(&mu);
        return orders_seen > 0;
      },
      absl::Milliseconds(10)));
  EXPECT_EQ(link.coordinator_epoch(), 8u);
  EXPECT_TRUE(link.connected());
}

TEST_F(CoordinatorLinkTest, ACutOffCanBeLiftedEarly) {
  CoordinatorLink link(Options(), [](ckptd::v1::Heartbeat*) {});
  ASSERT_TRUE(AdvanceUntil([&] { return fake_.heartbeats() >= 1; }, absl::Milliseconds(10)));
  link.CutOff(absl::Hours(1));
  ASSERT_TRUE(Idle());
  const int during = fake_.heartbeats();
  link.CutOff(absl::ZeroDuration());
  EXPECT_FALSE(link.cut_off());
  // It beats again within its back-off, long before the hour is up.
  EXPECT_TRUE(AdvanceUntil([&] { return fake_.heartbeats() > during; }, absl::Milliseconds(100), absl::Seconds(5)));
}

// The agent's /readyz (as ckptd-agent --metrics-listen serves it) over the
// link: 503 with why until the coordinator takes the registration, then 200.
TEST_F(CoordinatorLinkTest, ReadyzWaitsForTheRegistration) {
  fake_.Refuse(true);
  CoordinatorLink link(Options(), [](ckptd::v1::Heartbeat*) {});
  metrics::Registry registry;
  absl::StatusOr<std::unique_ptr<AgentMetrics>> agent_metrics = AgentMetrics::Create(&registry);
  ASSERT_TRUE(agent_metrics.ok()) << agent_metrics.status();
  AgentMetrics::Sources sources;
  sources.coordinator_connected = [&link] { return link.registered(); };
  metrics::CollectorHandle collector = (*agent_metrics)->Watch(sources);
  absl::StatusOr<std::unique_ptr<metrics::HttpServer>> http =
      metrics::HttpServer::Start("127.0.0.1:0", metrics::MetricsHandler(registry, [&link] {
                                   return AgentNotReady(true, link.address(), link.registered(), link.last_error());
                                 }));
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();
  const std::string address = absl::StrCat("127.0.0.1:", port_);

  // A registration was refused: not ready, and why.
  ASSERT_TRUE(AdvanceUntil([&] { return !link.last_error().ok(); }, absl::Milliseconds(100)));
  std::string ready = ::ckptd::testing::HttpGet(port, "/readyz");
  EXPECT_THAT(ready, ::testing::StartsWith("HTTP/1.1 503 Service Unavailable\r\n"));
  EXPECT_EQ(::ckptd::testing::HttpBody(ready),
            absl::StrCat("not registered with the coordinator at ", address, ": not taking registrations\n"));
  EXPECT_THAT(::ckptd::testing::HttpGet(port, "/metrics"),
              ::testing::HasSubstr("\nckptd_agent_coordinator_connected 0\n"));
  EXPECT_THAT(::ckptd::testing::HttpGet(port, "/healthz"), ::testing::StartsWith("HTTP/1.1 200 OK\r\n"));

  // The coordinator takes it: ready.
  fake_.Refuse(false);
  ASSERT_TRUE(AdvanceUntil([&] { return link.registered(); }, absl::Milliseconds(100)));
  EXPECT_TRUE(link.last_error().ok()) << link.last_error();
  ready = ::ckptd::testing::HttpGet(port, "/readyz");
  EXPECT_THAT(ready, ::testing::StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(::ckptd::testing::HttpBody(ready), "ready\n");
  EXPECT_THAT(::ckptd::testing::HttpGet(port, "/metrics"),
              ::testing::HasSubstr("\nckptd_agent_coordinator_connected 1\n"));
  // A drill cuts the link off: not ready while it lasts.
  link.CutOff(absl::Minutes(1));
  EXPECT_FALSE(link.registered());
  EXPECT_THAT(::ckptd::testing::HttpGet(port, "/readyz"), ::testing::StartsWith("HTTP/1.1 503 "));
  (*http)->Stop();  // before the link it asks goes
  collector.Reset();
}

}  // namespace
}  // namespace ckptd::agent
