// Agents under a coordinator, without sockets: two AgentCores (two nodes)
// talk to one CoordinatorCore through an in-process CoordinatorClient.
#include <cstring>
#include <thread>

#include "agent/agent_core.h"
#include "agent/testing_agent_harness.h"
#include "base/clock.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "coordinator/coordinator_core.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/restore_source.h"
#include "replication/peer_service.h"
#include "replication/replica_store.h"
#include "replication/replicator.h"
#include "storage/layout.h"
#include "storage/mem_file_system.h"
#include "storage/shard_reader.h"
#include "storage/store.h"

namespace ckptd::agent {
namespace {

using ::ckptd::replication::GrpcPeerNetwork;
using ::ckptd::replication::GrpcPeerNetworkOptions;
using ::ckptd::replication::PeerService;
using ::ckptd::replication::PeerServiceOptions;
using ::ckptd::replication::ReplicaStore;
using ::ckptd::replication::ReplicaStoreOptions;
using ::ckptd::replication::Replicator;
using ::ckptd::replication::ReplicatorOptions;
using ::ckptd::replication::StartPeerServer;
using ::ckptd::testing::Eventually;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Optional;
using ::testing::SizeIs;

// CoordinatorClient calling the core directly (what CoordinatorLink does over gRPC).
class InProcessCoordinator : public CoordinatorClient {
 public:
  // `req` says what else the agent registers with (its peer service).
  InProcessCoordinator(coordinator::CoordinatorCore* core, std::string node,
                       ckptd::v1::RegisterAgentRequest req = {})
      : core_(core), node_(std::move(node)) {
    req.set_node_id(node_);
    absl::StatusOr<ckptd::v1::RegisterAgentResponse> r = core_->RegisterAgent(req);
    EXPECT_THAT(r.status(), IsOk());
    session_ = r.ok() ? r->session() : "";
    fetch_key_ = r.ok() ? r->fetch_key() : "";
  }
  void ShardDurable(const ckptd::v1::ShardReport& report) override {
    ckptd::v1::ReportShardRequest req;
    req.set_node_id(node_);
    req.set_session(session_);
    *req.mutable_report() = report;
    absl::MutexLock l(&mu_);
    reports_.push_back(report);
    results_.push_back(core_->ReportShard(req).status());
  }
  void Failure(const ckptd::v1::ReportFailureRequest& failure) override {
    ckptd::v1::ReportFailureRequest req = failure;
    req.set_node_id(node_);
    req.set_session(session_);
    EXPECT_THAT(core_->ReportFailure(req), IsOk());
  }
  absl::StatusOr<ckptd::v1::RestorePlanResponse> RestorePlan(const ckptd::v1::RestorePlanRequest& request,
                                                             absl::Duration) override {
    {
      // The coordinator out of reach: refused connections, then a new
      // leader that does not know this agent's session yet.
      absl::MutexLock l(&mu_);
      if (plans_refused_ > 0) {
        --plans_refused_;
        ++plans_asked_while_gone_;
        if (plans_refused_ % 2 == 0) return absl::NotFoundError(
              "restore plan from coordinator c1:7070: node is not registered with this session; register again");
        return absl::UnavailableError("restore plan from coordinator c1:7070: failed to connect: Connection refused");
      }
    }
    ckptd::v1::RestorePlanRequest req = request;
    req.set_node_id(node_);
    req.set_session(session_);
    return core_->GetRestorePlan(req);
  }
  std::optional<ckptd::v1::Schedule> ScheduleFor(const std::string& job) override {
    absl::MutexLock l(&mu_);
    auto it = schedules_.find(job);
    if (it == schedules_.end()) return std::nullopt;
    return it->second;
  }
  // One heartbeat with what `agent` reports (none: an agent with no
  // trainer); `on_ack` gets the answer (the partners).
  void Beat(AgentCore* agent, const std::function<void(const ckptd::v1::HeartbeatAck&)>& on_ack = {}) {
    ckptd::v1::Heartbeat hb;
    if (agent != nullptr) agent->FillHeartbeat(&hb);
    hb.set_node_id(node_);
    hb.set_session(session_);
    absl::StatusOr<ckptd::v1::HeartbeatAck> ack = core_->OnHeartbeat(hb);
    ASSERT_THAT(ack.status(), IsOk());
    ASSERT_TRUE(ack->known());
    if (agent != nullptr) agent->OnCommittedSteps(*ack);  // as ckptd-agent's relay does
    if (on_ack) on_ack(*ack);
    absl::MutexLock l(&mu_);
    for (const auto& s : ack->schedules()) schedules_[s.job()] = s;
  }
  void Beat(AgentCore& agent) { Beat(&agent); }
  std::vector<ckptd::v1::ShardReport> reports() {
    absl::MutexLock l(&mu_);
    return reports_;
  }
  std::vector<absl::Status> results() {
    absl::MutexLock l(&mu_);
    return results_;
  }
  absl::StatusOr<ckptd::v1::ReshardPlanResponse> ReshardPlan(const ckptd::v1::ReshardPlanRequest& request,
                                                             absl::Duration) override {
    if (!plans_reshards) return absl::UnimplementedError("this coordinator makes no reshard plans");
    ckptd::v1::ReshardPlanRequest req = request;
    req.set_node_id(node_);
    req.set_session(session_);
    absl::StatusOr<ckptd::v1::ReshardPlanResponse> plan = core_->GetReshardPlan(req);
    if (plan.ok() && tamper) tamper(&*plan);
    return plan;
  }

  // The next `n` plan requests fail as if the coordinator were gone.
  void RefusePlans(int n) {
    absl::MutexLock l(&mu_);
    plans_refused_ = n;
  }
  int plans_asked_while_gone() {
    absl::MutexLock l(&mu_);
    return plans_asked_while_gone_;
  }

  // Whether reshard plans are served (as an older coordinator's are not),
  // and what is done to them on the way (an attack).
  bool plans_reshards = true;
  std::function<void(ckptd::v1::ReshardPlanResponse*)> tamper;
  // The registration's key for the node's Peer service.
  const std::string& fetch_key() const { return fetch_key_; }

 private:
  coordinator::CoordinatorCore* const core_;
  const std::string node_;
  std::string session_;
  std::string fetch_key_;
  absl::Mutex mu_;
  std::map<std::string, ckptd::v1::Schedule> schedules_ ABSL_GUARDED_BY(mu_);
  std::vector<ckptd::v1::ShardReport> reports_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  int plans_refused_ ABSL_GUARDED_BY(mu_) = 0;
  int plans_asked_while_gone_ ABSL_GUARDED_BY(mu_) = 0;
};

TrainerRegistration Rank(uint32_t rank, uint32_t world) {
  TrainerRegistration r;
  r.job = "job";
  r.rank = rank;
  r.world_size = world;
  r.buffers = {Buffer("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 2000),
               Buffer("adam", ckptd::v1::OPTIMIZER, ckptd::v1::FLOAT32, 4000),
               Buffer("rng", ckptd::v1::RNG, ckptd::v1::BYTES, 64)};
  return r;
}

uint8_t Pattern(uint64_t step, uint32_t rank) { return static_cast<uint8_t>(step * 7 + rank * 31 + 1); }

class CoordinatedAgentTest : public ::testing::Test {
 protected:
  explicit CoordinatedAgentTest(coordinator::CoordinatorOptions options = {})
      : core_(&store_, state_.get(), &clock_, options) {
    EXPECT_THAT(mem_.CreateDir("/ckpt"), IsOk());
    EXPECT_THAT(core_.Recover(), IsOk());
  }

  AgentOptions Options(CoordinatorClient* c) {
    AgentOptions o = TestAgentOptions("coord");
    o.coordinator = c;
    o.restore_timeout = absl::Seconds(20);
    o.plan_poll = absl::Milliseconds(2);
    o.keep_in_memory = keep_in_memory_;
    return o;
  }
  bool keep_in_memory_ = true;

  struct Node {
    std::unique_ptr<InProcessCoordinator> link;
    std::unique_ptr<AgentCore> agent;
    TrainerHandle handle;
    std::unique_ptr<staging::StagingSegment> seg;
  };

  Node Start(const std::string& name, uint32_t rank, uint32_t world) { return Start(name, Rank(rank, world)); }

  Node Start(const std::string& name, const TrainerRegistration& reg) {
    Node n;
    n.link = std::make_unique<InProcessCoordinator>(&core_, name);
    AgentOptions options = Options(n.link.get());
    options.node_id = name;  // what its heartbeats say it holds in memory is its own
    n.agent = std::make_unique<AgentCore>(&mem_, options);
    absl::StatusOr<TrainerHandle> h = n.agent->Register(reg);
    EXPECT_THAT(h.status(), IsOk());
    n.handle = *h;
    absl::StatusOr<std::unique_ptr<staging::StagingSegment>> seg = staging::StagingSegment::Open(h->segment);
    EXPECT_THAT(seg.status(), IsOk());
    n.seg = std::move(*seg);
    n.link->Beat(*n.agent);
    return n;
  }

  // The agent of `n` reports that `rank`'s trainer died: the job restarts.
  void TrainerDied(Node& n, uint32_t rank) {
    ckptd::v1::ReportFailureRequest f;
    f.set_job("job");
    f.set_rank(rank);
    f.set_kind(ckptd::v1::TRAINER_DIED);
    n.link->Failure(f);
  }

  // Ranks 0 and 1 on node-a and node-b start fresh and commit step 10;
  // then rank 0's trainer dies (the job restarts).
  void StartTwoCommitStep10AndFailRank0(Node* a, Node* b) {
    *a = Start("node-a", 0, 2);
    *b = Start("node-b", 1, 2);
    RestoreAll({a, b});
    Snapshot(*a, 0, 10);
    Snapshot(*b, 1, 10);
    TrainerDied(*a, 0);
  }

  void Snapshot(Node& n, uint32_t rank, uint64_t step) {
    SnapshotAndWait(*n.agent, *n.seg, n.handle, step, Pattern(step, rank), /*stall_seconds=*/0.003);
  }

  // Restores every node at once (the restore is a barrier) and checks the bytes.
  std::vector<std::optional<uint64_t>> RestoreAll(std::vector<Node*> nodes) {
    std::vector<absl::StatusOr<RestoreResult>> results(nodes.size(), absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < nodes.size(); ++i) {
      threads.emplace_back([&, i] { results[i] = nodes[i]->agent->Restore(nodes[i]->handle.trainer_id, absl::Seconds(5)); });
    }
    for (auto& t : threads) t.join();
    std::vector<std::optional<uint64_t>> steps;
    for (size_t i = 0; i < nodes.size(); ++i) {
      EXPECT_THAT(results[i].status(), IsOk());
      if (!results[i].ok()) {
        steps.push_back(std::nullopt);
        continue;
      }
      steps.push_back(results[i]->step);
      if (results[i]->step) {
        const uint8_t* p = nodes[i]->seg->slot_data(results[i]->slot);
        EXPECT_EQ(p[0], Pattern(*results[i]->step, static_cast<uint32_t>(i)));
        EXPECT_EQ(p[nodes[i]->handle.offsets.back()], Pattern(*results[i]->step, static_cast<uint32_t>(i)));
        EXPECT_THAT(nodes[i]->seg->Release(results[i]->slot), IsOk());
      }
    }
    return steps;
  }

  bool Exists(const std::string& path) { return mem_.Stat(path).ok(); }

  storage::MemFileSystem mem_;
  storage::CheckpointStore store_{&mem_, "/ckpt"};
  std::unique_ptr<coordinator::StateStore> state_ = coordinator::NewMemStateStore();
  base::FakeClock clock_;
  coordinator::CoordinatorCore core_{&store_, state_.get(), &clock_, coordinator::CoordinatorOptions()};
};

TEST_F(CoordinatedAgentTest, TwoNodesCommitThroughTheCoordinatorAndRestoreTheSameStep) {
  Node a = Start("node-a", 0, 2);
  Node b = Start("node-b", 1, 2);
  EXPECT_EQ(RestoreAll({&a, &b}), (std::vector<std::optional<uint64_t>>{std::nullopt, std::nullopt}));

  Snapshot(a, 0, 10);
  EXPECT_FALSE(Exists(storage::ManifestPath("/ckpt", "job", 10)));  // rank 1 has not reported
  Snapshot(b, 1, 10);
  EXPECT_TRUE(Exists(storage::ManifestPath("/ckpt", "job", 10)));
  ASSERT_EQ(a.link->reports().size(), 1u);
  const ckptd::v1::ShardReport r = a.link->reports()[0];
  EXPECT_EQ(r.step(), 10u);
  EXPECT_EQ(r.incarnation(), 1u);  // from the fresh-start plan
  EXPECT_DOUBLE_EQ(r.stall_seconds(), 0.003);
  EXPECT_GT(r.shard().persist_seconds(), 0);
  // The agent itself commits nothing under a coordinator.
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, a.agent->Status(a.handle.trainer_id));
  EXPECT_EQ(st.last_committed_step, std::nullopt);

  Snapshot(a, 0, 20);
  Snapshot(b, 1, 20);
  TrainerDied(a, 0);
  EXPECT_EQ(RestoreAll({&a, &b}), (std::vector<std::optional<uint64_t>>{20u, 20u}));
}

// A rank that runs ahead keeps persisting steps that cannot commit (the
// other rank lags, then dies): its agent keeps the newest committed step in
// memory all along (the coordinator names it in its heartbeat answers), so
// the restart that follows reads it from there, not from disk.
TEST_F(CoordinatedAgentTest, TheNewestCommittedStepStaysInMemoryWhileNewerOnesDoNotCommit) {
  Node a = Start("node-a", 0, 2);
  Node b = Start("node-b", 1, 2);
  RestoreAll({&a, &b});
  Snapshot(a, 0, 10);
  Snapshot(b, 1, 10);
  ASSERT_TRUE(Exists(storage::ManifestPath("/ckpt", "job", 10)));
  a.link->Beat(*a.agent);  // the answer names step 10 as committed
  EXPECT_EQ(a.seg->pinned_step(), std::optional<uint64_t>(10));
  // Rank 0 alone goes on: 20 and 30 are persisted and kept, never committed.
  // Two slots: 30 takes 20's, not 10's.
  Snapshot(a, 0, 20);
  Snapshot(a, 0, 30);
  TrainerDied(b, 1);
  EXPECT_EQ(RestoreAll({&a, &b}), (std::vector<std::optional<uint64_t>>{10u, 10u}));
  const ckptd::v1::GetClusterStatusResponse status = core_.ClusterStatus();
  ASSERT_EQ(status.jobs(0).last_restore().ranks_size(), 2);
  for (const auto& r : status.jobs(0).last_restore().ranks()) {
    EXPECT_EQ(r.source(), ckptd::v1::AGENT_MEMORY) << "rank " << r.rank();
  }
}

TEST_F(CoordinatedAgentTest, ATrainerThatRestoresAgainGetsTheSameStepWithoutANewRound) {
  Node a, b;
  StartTwoCommitStep10AndFailRank0(&a, &b);
  EXPECT_EQ(RestoreAll({&a, &b}), (std::vector<std::optional<uint64_t>>{10u, 10u}));
  const uint64_t incarnation = core_.ClusterStatus().jobs(0).schedule().incarnation();
  // Rank 1's trainer starts its restore over (its first answer was lost):
  // it loads the round's step again; nobody else restarts.
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult again, b.agent->Restore(b.handle.trainer_id, absl::Seconds(10)));
  EXPECT_EQ(again.step, std::optional<uint64_t>(10));
  EXPECT_EQ(again.incarnation, incarnation);
  EXPECT_EQ(b.seg->slot_data(again.slot)[0], Pattern(10, 1));
  CKPTD_ASSERT_OK(b.seg->Release(again.slot));
  EXPECT_EQ(core_.ClusterStatus().jobs(0).schedule().incarnation(), incarnation);
  EXPECT_EQ(core_.ClusterStatus().jobs(0).state(), ckptd::v1::JOB_RUNNING);
}

TEST_F(CoordinatedAgentTest, ACopyFromMemoryThatFailsTheTrainersCheckIsReportedReadFromDisk) {
  Node a, b;
  StartTwoCommitStep10AndFailRank0(&a, &b);
  // Both ranks are handed step 10 from memory, to check as they copy it out.
  RestoreOptions verify;
  verify.client_verifies = true;
  std::vector<absl::StatusOr<RestoreResult>> results(2, absl::UnknownError("not run"));
  std::thread ta([&] { results[0] = a.agent->Restore(a.handle.trainer_id, verify); });
  std::thread tb([&] { results[1] = b.agent->Restore(b.handle.trainer_id, verify); });
  ta.join();
  tb.join();
  for (const absl::StatusOr<RestoreResult>& r : results) {
    ASSERT_THAT(r.status(), IsOk());
    EXPECT_EQ(r->step, std::optional<uint64_t>(10));
    EXPECT_EQ(r->source, RestoreSource::kMemory);
  }
  auto source_of = [&](uint32_t rank) {
    const ckptd::v1::GetClusterStatusResponse status = core_.ClusterStatus();
    for (const auto& r : status.jobs(0).last_restore().ranks()) {
      if (r.rank() == rank) return r.source();
    }
    return ckptd::v1::RESTORE_SOURCE_UNSPECIFIED;
  };
  EXPECT_EQ(source_of(0), ckptd::v1::AGENT_MEMORY);
  // Rank 0's trainer finds a block damaged: the step is read from disk, and
  // the coordinator hears where rank 0 read it in the end.
  CKPTD_ASSERT_OK(a.seg->Release(results[0]->slot));
  CKPTD_ASSERT_OK(b.seg->Release(results[1]->slot));
  RestoreOptions reread;
  reread.reread_step = 10;
  reread.reread_problem = "buffer 'params' bytes 0..4096 do not match their checksum";
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult again, a.agent->Restore(a.handle.trainer_id, reread));
  EXPECT_EQ(again.step, std::optional<uint64_t>(10));
  EXPECT_EQ(again.source, RestoreSource::kRoot);
  EXPECT_EQ(a.seg->slot_data(again.slot)[0], Pattern(10, 0));
  CKPTD_ASSERT_OK(a.seg->Release(again.slot));
  EXPECT_EQ(source_of(0), ckptd::v1::STORAGE_ROOT);
  EXPECT_EQ(source_of(1), ckptd::v1::AGENT_MEMORY);
  EXPECT_EQ(core_.ClusterStatus().jobs(0).state(), ckptd::v1::JOB_RUNNING);
}

// Two cadences: every 10 steps, 1 in 2 durable (steps 20, 40, ...).
class MemoryCheckpointTest : public CoordinatedAgentTest {
 protected:
  static coordinator::CoordinatorOptions TwoCadences() {
    coordinator::CoordinatorOptions o;
    o.every_steps = 10;
    o.durable_every = 2;
    return o;
  }
  MemoryCheckpointTest() : CoordinatedAgentTest(TwoCadences()) {}

  // Every node snapshots `step`; waits until each agent is done with it.
  void SnapshotAll(std::vector<Node*> nodes, uint64_t step) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      Node& n = *nodes[i];
      ASSERT_NO_FATAL_FAILURE(
          agent::Snapshot(*n.agent, *n.seg, n.handle, step, Pattern(step, static_cast<uint32_t>(i)), 0.002));
      CKPTD_ASSERT_OK(n.agent->WaitPersisted(n.handle.trainer_id, step, absl::Seconds(30)).status());
    }
    for (Node* n : nodes) n->link->Beat(*n->agent);  // what each keeps in memory
  }
};

TEST_F(MemoryCheckpointTest, ATrainerCrashRestoresTheNewestMemoryCheckpointAndADamagedCopyFallsBackToDisk) {
  Node a = Start("node-a", 0, 2);
  Node b = Start("node-b", 1, 2);
  EXPECT_EQ(RestoreAll({&a, &b}), (std::vector<std::optional<uint64_t>>{std::nullopt, std::nullopt}));
  for (uint64_t step : {10u, 20u, 30u}) SnapshotAll({&a, &b}, step);
  // 20 was written and committed; 10 and 30 were kept in memory only.
  EXPECT_TRUE(Exists(storage::ManifestPath("/ckpt", "job", 20)));
  EXPECT_FALSE(Exists("/ckpt/job/step-10"));
  EXPECT_FALSE(Exists("/ckpt/job/step-30"));
  ckptd::v1::GetClusterStatusResponse status = core_.ClusterStatus();
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).newest_committed_step(), 20u);
  EXPECT_TRUE(status.jobs(0).has_memory_checkpoint());
  EXPECT_EQ(status.jobs(0).newest_memory_checkpoint(), 30u);
  EXPECT_TRUE(status.jobs(0).memory_checkpoint_restorable());
  for (const ckptd::v1::ShardReport& r : a.link->reports()) EXPECT_EQ(r.memory_only(), r.step() != 20) << r.step();

  // Rank 0's trainer dies on a healthy node: both ranks come back at step 30,
  // from their agents' memory, and the bytes are step 30's (RestoreAll checks).
  TrainerDied(a, 0);
  EXPECT_EQ(RestoreAll({&a, &b}), (std::vector<std::optional<uint64_t>>{30u, 30u}));
  const ckptd::v1::GetClusterStatusResponse restored = core_.ClusterStatus();
  for (const auto& r : restored.jobs(0).last_restore().ranks()) {
    EXPECT_EQ(r.source(), ckptd::v1::AGENT_MEMORY) << r.rank();
  }

  // Later: 40 durable, 50 in memory; then rank 1's copy of 50 is damaged and
  // its trainer dies. No disk holds step 50: every rank goes back to 40.
  for (uint64_t step : {40u, 50u}) SnapshotAll({&a, &b}, step);
  CKPTD_ASSERT_OK(b.agent->CorruptKeptStep("job", 1, 50).status());
  TrainerDied(b, 1);
  EXPECT_EQ(RestoreAll({&a, &b}), (std::vector<std::optional<uint64_t>>{40u, 40u}));
  EXPECT_TRUE(core_.ClusterStatus().jobs(0).quarantined_steps().empty());
  EXPECT_EQ(core_.ClusterStatus().jobs(0).state(), ckptd::v1::JOB_RUNNING);
}

TEST_F(MemoryCheckpointTest, AfterAFailureTheNewestMemoryCheckpointIsWrittenFromMemoryAndCommitted) {
  Node a = Start("node-a", 0, 2);
  Node b = Start("node-b", 1, 2);
  EXPECT_EQ(RestoreAll({&a, &b}), (std::vector<std::optional<uint64_t>>{std::nullopt, std::nullopt}));
  for (uint64_t step : {10u, 20u, 30u}) SnapshotAll({&a, &b}, step);
  ASSERT_FALSE(Exists("/ckpt/job/step-30"));
  // Rank 0's trainer dies: the coordinator orders each node to write its
  // rank's copy of step 30, which only memory holds, through the heartbeat
  // answers.
  TrainerDied(a, 0);
  std::vector<ckptd::v1::PersistOrder> ordered;
  for (Node* n : {&a, &b}) {
    n->link->Beat(n->agent.get(), [&](const ckptd::v1::HeartbeatAck& ack) {
      ordered.insert(ordered.end(), ack.persist().begin(), ack.persist().end());
      n->agent->OnPersistOrders(ack.persist());
    });
  }
  ASSERT_THAT(ordered, SizeIs(2));
  for (const ckptd::v1::PersistOrder& o : ordered) EXPECT_EQ(o.step(), 30u) << o.rank();
  const std::string manifest = storage::ManifestPath("/ckpt", "job", 30);
  ASSERT_TRUE(Eventually([&] { return Exists(manifest); }, absl::Seconds(30))) << "step 30 was not committed";
  for (Node* n : {&a, &b}) {
    for (const absl::Status& s : n->link->results()) EXPECT_THAT(s, IsOk());
    bool emergency = false;
    for (const ckptd::v1::ShardReport& r : n->link->reports()) emergency |= r.emergency() && r.step() == 30;
    EXPECT_TRUE(emergency);
  }
  const ckptd::v1::GetClusterStatusResponse status = core_.ClusterStatus();
  EXPECT_EQ(status.jobs(0).newest_committed_step(), 30u);
  // The step is durable now and still in memory: both ranks restore it from
  // there, and read from disk it is the same (RestoreAll checks the bytes).
  EXPECT_EQ(RestoreAll({&a, &b}), (std::vector<std::optional<uint64_t>>{30u, 30u}));
  storage::CheckpointStore store(&mem_, "/ckpt");
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::StepManifest m, store.ReadManifest("job", 30));
  EXPECT_EQ(m.shards_size(), 2);
}

// A node is lost for good: the job comes back with fewer ranks (and later
// with more), the coordinator takes the new world size once no rank of the
// old one runs, and each new rank reads the committed step resharded from
// disk. Buffers without a global layout are each rank's own: rank r's, or
// rank r mod the saved world's for a rank that world did not have.
TEST_F(CoordinatedAgentTest, AJobRestoresOntoAnotherNumberOfRanks) {
  Node a, b;
  StartTwoCommitStep10AndFailRank0(&a, &b);
  TrainerDied(b, 1);
  CKPTD_ASSERT_OK(a.agent->TrainerExited(a.handle.trainer_id, /*died=*/true));
  CKPTD_ASSERT_OK(b.agent->TrainerExited(b.handle.trainer_id, /*died=*/true));
  a.link->Beat(*a.agent);
  b.link->Beat(*b.agent);
  // Node-b is gone; node-a runs the job alone, as rank 0 of 1.
  auto reregister = [&](Node& n, uint32_t rank, uint32_t world) {
    CKPTD_ASSERT_OK_AND_ASSIGN(n.handle, n.agent->Register(Rank(rank, world)));
    CKPTD_ASSERT_OK_AND_ASSIGN(n.seg, staging::StagingSegment::Open(n.handle.segment));
    n.link->Beat(*n.agent);
  };
  ASSERT_NO_FATAL_FAILURE(reregister(a, 0, 1));
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult one, a.agent->Restore(a.handle.trainer_id, absl::Seconds(10)));
  EXPECT_EQ(one.step, std::optional<uint64_t>(10));
  EXPECT_EQ(one.source, RestoreSource::kRoot);  // never the old world's copies in memory
  EXPECT_EQ(a.seg->slot_data(one.slot)[0], Pattern(10, 0));
  EXPECT_EQ(a.seg->slot_data(one.slot)[a.handle.offsets.back()], Pattern(10, 0));
  CKPTD_ASSERT_OK(a.seg->Release(one.slot));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, a.agent->Status(a.handle.trainer_id));
  EXPECT_EQ(st.resharded_restores, 1u);
  const ckptd::v1::GetClusterStatusResponse status = core_.ClusterStatus();
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).world_size(), 1u);
  ASSERT_EQ(status.jobs(0).last_restore().ranks_size(), 1);
  EXPECT_EQ(status.jobs(0).last_restore().ranks(0).source(), ckptd::v1::STORAGE_ROOT);
  // The coordinator heard it was read resharded, and from which world.
  EXPECT_TRUE(status.jobs(0).last_restore().ranks(0).resharded());
  EXPECT_EQ(status.jobs(0).last_restore().saved_world_size(), 2u);
  // The one rank saves step 20 (a world of 1), then dies; the job comes
  // back with three ranks over two nodes.
  Snapshot(a, 0, 20);
  EXPECT_TRUE(Exists(storage::ManifestPath("/ckpt", "job", 20)));
  TrainerDied(a, 0);
  CKPTD_ASSERT_OK(a.agent->TrainerExited(a.handle.trainer_id, /*died=*/true));
  a.link->Beat(*a.agent);
  ASSERT_NO_FATAL_FAILURE(reregister(a, 0, 3));
  ASSERT_NO_FATAL_FAILURE(reregister(b, 2, 3));
  Node c;  // rank 1 of 3 on node-a's agent as a second trainer
  c.handle = *a.agent->Register(Rank(1, 3));
  CKPTD_ASSERT_OK_AND_ASSIGN(c.seg, staging::StagingSegment::Open(c.handle.segment));
  a.link->Beat(*a.agent);
  std::vector<absl::StatusOr<RestoreResult>> results(3, absl::UnknownError("not run"));
  std::thread t0([&] { results[0] = a.agent->Restore(a.handle.trainer_id, absl::Seconds(10)); });
  std::thread t1([&] { results[1] = a.agent->Restore(c.handle.trainer_id, absl::Seconds(10)); });
  std::thread t2([&] { results[2] = b.agent->Restore(b.handle.trainer_id, absl::Seconds(10)); });
  t0.join();
  t1.join();
  t2.join();
  staging::StagingSegment* segs[] = {a.seg.get(), c.seg.get(), b.seg.get()};
  for (int r = 0; r < 3; ++r) {
    ASSERT_THAT(results[r].status(), IsOk()) << "rank " << r;
    EXPECT_EQ(results[r]->step, std::optional<uint64_t>(20));
    EXPECT_EQ(results[r]->source, RestoreSource::kRoot);
    // Step 20 was saved by rank 0 alone: every rank gets rank 0's.
    EXPECT_EQ(segs[r]->slot_data(results[r]->slot)[0], Pattern(20, 0)) << "rank " << r;
    CKPTD_ASSERT_OK(segs[r]->Release(results[r]->slot));
  }
  const ckptd::v1::RestoreSummary last = core_.ClusterStatus().jobs(0).last_restore();
  EXPECT_EQ(last.step(), 20u);
  EXPECT_EQ(last.saved_world_size(), 1u);
  ASSERT_EQ(last.ranks_size(), 3);
  for (const auto& k : last.ranks()) EXPECT_TRUE(k.resharded()) << "rank " << k.rank();
}

// Rank `rank` of a data-parallel job of `world` ranks: weights and Adam
// state the same on every rank (replicated over the group "dp"), its own RNG.
// With `group` < world, the groups are ranks [0, group), [group, 2 group), ...
// (tensor parallelism over the groups: each group's buffers of the same names
// hold other bytes).
TrainerRegistration DataParallel(uint32_t rank, uint32_t world, uint32_t group = 0) {
  if (group == 0) group = world;
  TrainerRegistration r;
  r.job = "job";
  r.rank = rank;
  r.world_size = world;
  auto replicated = [&](ckptd::v1::Tensor t, uint64_t rows, uint64_t cols) {
    t.clear_shape();
    t.add_shape(rows);
    t.add_shape(cols);
    t.mutable_replica()->set_group("dp");
    t.mutable_replica()->set_count(group);
    t.mutable_replica()->set_index(rank % group);
    return t;
  };
  r.buffers = {replicated(Buffer("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 0), 40, 25),
               replicated(Buffer("adam", ckptd::v1::OPTIMIZER, ckptd::v1::FLOAT32, 0), 80, 25),
               Buffer("rng", ckptd::v1::RNG, ckptd::v1::BYTES, 64)};
  return r;
}

class ReplicatedStateTest : public CoordinatedAgentTest {
 protected:
  // A snapshot of `step` on rank `rank` (its node `n`): the replicated
  // buffers hold the same bytes on every rank, the RNG the rank's own.
  void SnapshotDp(Node& n, uint32_t rank, uint64_t step, uint32_t group = 0) {
    CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, n.seg->AcquireForFill(absl::Seconds(10)));
    uint8_t* p = n.seg->slot_data(slot);
    std::memset(p, ReplicatedFill(step, rank, group), n.handle.slot_bytes);
    for (uint64_t i = 0; i < 64; ++i) p[n.handle.offsets[2] + i] = static_cast<uint8_t>(Pattern(step, rank) + i);
    CKPTD_ASSERT_OK(n.seg->Publish(slot, step));
    CKPTD_ASSERT_OK(n.agent->SnapshotPublished(n.handle.trainer_id, slot, step, 0.001));
    CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, n.agent->WaitPersisted(n.handle.trainer_id, step, absl::Seconds(30)));
    ASSERT_THAT(st.last_persisted_step, Optional(step)) << st.last_error;
  }

  // Every node restores at once; each must get `step` from `source` with
  // every byte of its buffers as saved (rank r's RNG that of rank `rng_of[r]`).
  // What the replicated buffers of `rank` hold at `step`: the same on every
  // rank of its group of `group` ranks (0: all of them).
  static uint8_t ReplicatedFill(uint64_t step, uint32_t rank, uint32_t group) {
    return Pattern(step, group == 0 ? 0 : 100 + rank / group);
  }

  void RestoreDp(std::vector<Node*> nodes, uint64_t step, RestoreSource source, std::vector<uint32_t> rng_of,
                 uint32_t group = 0) {
    std::vector<absl::StatusOr<RestoreResult>> results(nodes.size(), absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < nodes.size(); ++i) {
      threads.emplace_back([&, i] { results[i] = nodes[i]->agent->Restore(nodes[i]->handle.trainer_id, absl::Seconds(10)); });
    }
    for (auto& t : threads) t.join();
    for (size_t r = 0; r < nodes.size(); ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r));
      ASSERT_THAT(results[r].status(), IsOk());
      EXPECT_THAT(results[r]->step, Optional(step));
      EXPECT_EQ(results[r]->source, source);
      const uint8_t* p = nodes[r]->seg->slot_data(results[r]->slot);
      const uint64_t rng_at = nodes[r]->handle.offsets[2];
      ASSERT_GE(rng_at, 12000u);
      // Every byte of params and adam (the bytes between buffers are padding).
      uint64_t wrong = 0;
      for (int b = 0; b < 2; ++b) {
        for (uint64_t i = 0; i < (b == 0 ? 4000u : 8000u); ++i) {
          wrong += p[nodes[r]->handle.offsets[b] + i] != ReplicatedFill(step, static_cast<uint32_t>(r), group);
        }
      }
      EXPECT_EQ(wrong, 0u) << "bytes of the replicated buffers not as saved";
      for (uint64_t i = 0; i < 64; ++i) {
        ASSERT_EQ(p[rng_at + i], static_cast<uint8_t>(Pattern(step, rng_of[r]) + i)) << "rng byte " << i;
      }
      CKPTD_ASSERT_OK(nodes[r]->seg->Release(results[r]->slot));
    }
  }

  // Four nodes of one rank each, fresh, that commit step 10.
  std::vector<Node> StartFourAndCommit10() {
    std::vector<Node> nodes;
    for (uint32_t r = 0; r < 4; ++r) nodes.push_back(Start(absl::StrCat("node-", r), DataParallel(r, 4)));
    std::vector<Node*> all;
    for (Node& n : nodes) all.push_back(&n);
    RestoreAll(all);
    for (uint32_t r = 0; r < 4; ++r) SnapshotDp(nodes[r], r, 10);
    EXPECT_TRUE(Exists(storage::ManifestPath("/ckpt", "job", 10)));
    return nodes;
  }
};

TEST_F(ReplicatedStateTest, ADataParallelJobWritesItsReplicatedStateOnceAndEveryRankRestoresAllOfIt) {
  std::vector<Node> nodes = StartFourAndCommit10();
  // Each rank wrote a quarter of the weights and of Adam, and its own RNG.
  uint64_t raw = 0;
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<storage::ShardReader> reader,
                               storage::ShardReader::Open(&mem_, storage::ShardPath("/ckpt", "job", 10, r), {}));
    EXPECT_EQ(reader->FindTensor("params")->raw_length(), 4000u / 4);
    EXPECT_EQ(reader->FindTensor("adam")->raw_length(), 8000u / 4);
    EXPECT_EQ(reader->FindTensor("rng")->raw_length(), 64u);
    raw += reader->index().raw_bytes();
  }
  EXPECT_EQ(raw, 4000u + 8000u + 4 * 64u);  // not 4 x (4000 + 8000 + 64)
  // Rank 2's trainer dies: every rank gets all of its state back from its
  // agent's memory, checked against the checksums of the whole buffers.
  TrainerDied(nodes[2], 2);
  std::vector<Node*> all;
  for (Node& n : nodes) all.push_back(&n);
  ASSERT_NO_FATAL_FAILURE(RestoreDp(all, 10, RestoreSource::kMemory, {0, 1, 2, 3}));
  // Then from disk, each rank putting the group's shares together: the
  // copies in memory are damaged (a byte each), which the whole buffers'
  // checksums catch.
  for (uint32_t r = 0; r < 4; ++r) CKPTD_ASSERT_OK(nodes[r].agent->CorruptKeptStep("job", r, 10).status());
  TrainerDied(nodes[0], 0);
  ASSERT_NO_FATAL_FAILURE(RestoreDp(all, 10, RestoreSource::kRoot, {0, 1, 2, 3}));
  for (Node& n : nodes) {
    CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, n.agent->Status(n.handle.trainer_id));
    EXPECT_EQ(st.resharded_restores, 0u);  // the same slices: not a resharding
  }
  // Nor does the coordinator hear of one.
  const ckptd::v1::RestoreSummary last = core_.ClusterStatus().jobs(0).last_restore();
  ASSERT_EQ(last.ranks_size(), 4);
  EXPECT_EQ(protocol::ReshardedRanks(last), 0);
  EXPECT_EQ(last.saved_world_size(), 0u);
  // Read from disk, the step is kept in memory again, verifiable as a whole.
  TrainerDied(nodes[1], 1);
  ASSERT_NO_FATAL_FAILURE(RestoreDp(all, 10, RestoreSource::kMemory, {0, 1, 2, 3}));
}

// Two groups of two (tensor parallelism over them): the buffers of the same
// names hold other bytes in each group, and every rank gets its own group's
// back from disk, never the other's.
TEST_F(ReplicatedStateTest, EachRankPutsTogetherTheSharesOfItsOwnGroup) {
  std::vector<Node> nodes;
  for (uint32_t r = 0; r < 4; ++r) nodes.push_back(Start(absl::StrCat("node-", r), DataParallel(r, 4, 2)));
  std::vector<Node*> all;
  for (Node& n : nodes) all.push_back(&n);
  RestoreAll(all);
  for (uint32_t r = 0; r < 4; ++r) SnapshotDp(nodes[r], r, 10, /*group=*/2);
  ASSERT_TRUE(Exists(storage::ManifestPath("/ckpt", "job", 10)));
  for (uint32_t r = 0; r < 4; ++r) CKPTD_ASSERT_OK(nodes[r].agent->CorruptKeptStep("job", r, 10).status());
  // A coordinator whose plan sends rank 1 to the other group's shares (the
  // same boxes, other bytes): the agent checks them against the whole its
  // own share describes, and plans by itself.
  nodes[1].link->tamper = [](ckptd::v1::ReshardPlanResponse* plan) {
    for (ckptd::v1::ReshardRead& r : *plan->mutable_reads()) {
      if (r.buffer() < 2) r.set_saved_rank(r.saved_rank() + 2);
    }
  };
  TrainerDied(nodes[1], 1);
  ASSERT_NO_FATAL_FAILURE(RestoreDp(all, 10, RestoreSource::kRoot, {0, 1, 2, 3}, /*group=*/2));
}

// A rank whose own shard of the newest step cannot be opened (its index cut
// off after the coordinator planned from it) while it checks its group's
// shares against it: the step is quarantined, every rank goes back a step,
// and the failed read leaves no restore slot taken.
TEST_F(ReplicatedStateTest, AnOwnShardThatCannotBeOpenedSendsTheJobBackAndHoldsNoSlot) {
  std::vector<Node> nodes = StartFourAndCommit10();
  for (uint32_t r = 0; r < 4; ++r) SnapshotDp(nodes[r], r, 20);
  ASSERT_TRUE(Exists(storage::ManifestPath("/ckpt", "job", 20)));
  // The memory copies of step 20 are damaged: each rank reads it from disk.
  for (uint32_t r = 0; r < 4; ++r) CKPTD_ASSERT_OK(nodes[r].agent->CorruptKeptStep("job", r, 20).status());
  const std::string path = storage::ShardPath("/ckpt", "job", 20, 1);
  CKPTD_ASSERT_OK_AND_ASSIGN(const std::string bytes, storage::ReadFileToString(&mem_, path));
  nodes[1].link->tamper = [&](ckptd::v1::ReshardPlanResponse*) {
    if (bytes.size() > 0) (void)mem_.SetFileContents(path, bytes.substr(0, bytes.size() / 2));
  };
  TrainerDied(nodes[1], 1);
  std::vector<Node*> all;
  for (Node& n : nodes) all.push_back(&n);
  ASSERT_NO_FATAL_FAILURE(RestoreDp(all, 10, RestoreSource::kMemory, {0, 1, 2, 3}));
  EXPECT_THAT(core_.ClusterStatus().jobs(0).quarantined_steps(), ::testing::ElementsAre(20u));
  for (uint32_t r = 0; r < 4; ++r) {
    for (uint32_t slot = 0; slot < nodes[r].seg->slots(); ++slot) {
      const staging::SlotState state = nodes[r].seg->state(slot);
      EXPECT_TRUE(state == staging::SlotState::kFree || state == staging::SlotState::kKept)
          << "rank " << r << " slot " << slot << " is " << staging::SlotStateName(state);
    }
  }
  // Every rank goes on saving.
  for (uint32_t r = 0; r < 4; ++r) SnapshotDp(nodes[r], r, 30);
  EXPECT_TRUE(Exists(storage::ManifestPath("/ckpt", "job", 30)));
}

TEST_F(ReplicatedStateTest, TwoRanksRestoreWhatFourWroteOnce) {
  std::vector<Node> nodes = StartFourAndCommit10();
  TrainerDied(nodes[3], 3);
  for (Node& n : nodes) {
    CKPTD_ASSERT_OK(n.agent->TrainerExited(n.handle.trainer_id, /*died=*/true));
    n.link->Beat(*n.agent);
  }
  // Nodes 2 and 3 are gone for good; the job goes on as two ranks, a group
  // of two.
  for (uint32_t r = 0; r < 2; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(nodes[r].handle, nodes[r].agent->Register(DataParallel(r, 2)));
    CKPTD_ASSERT_OK_AND_ASSIGN(nodes[r].seg, staging::StagingSegment::Open(nodes[r].handle.segment));
    nodes[r].link->Beat(*nodes[r].agent);
  }
  ASSERT_NO_FATAL_FAILURE(RestoreDp({&nodes[0], &nodes[1]}, 10, RestoreSource::kRoot, {0, 1}));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, nodes[0].agent->Status(nodes[0].handle.trainer_id));
  EXPECT_EQ(st.resharded_restores, 1u);
  // The two go on, and write half each.
  for (uint32_t r = 0; r < 2; ++r) SnapshotDp(nodes[r], r, 20);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<storage::ShardReader> reader,
                             storage::ShardReader::Open(&mem_, storage::ShardPath("/ckpt", "job", 20, 1), {}));
  EXPECT_EQ(reader->FindTensor("params")->raw_length(), 4000u / 2);
}

// Rank `rank` of `world` of a sharded job (FSDP's Shard(0)): "w", a float
// [40, 25] tensor split by rows, and an RNG of its own.
TrainerRegistration Sharded(uint32_t rank, uint32_t world) {
  TrainerRegistration r;
  r.job = "job";
  r.rank = rank;
  r.world_size = world;
  ckptd::v1::Tensor w = Buffer("w", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 0);
  w.clear_shape();
  const uint64_t first = 40 * rank / world;
  const uint64_t end = 40 * (rank + 1) / world;
  for (uint64_t d : {uint64_t{40}, uint64_t{25}}) w.add_global_shape(d);
  for (uint64_t d : {first, uint64_t{0}}) w.add_offsets(d);
  for (uint64_t d : {end - first, uint64_t{25}}) w.add_shape(d);
  r.buffers = {w, Buffer("rng", ckptd::v1::RNG, ckptd::v1::BYTES, 64)};
  return r;
}

class ShardedStateTest : public CoordinatedAgentTest {
 protected:
  // A node and what its trainer registered last.
  struct Node2 {
    Node node;
    TrainerRegistration agent_reg;
  };

  // Every byte of global row `row` of "w" at `step`.
  static uint8_t RowByte(uint64_t step, uint64_t row) { return static_cast<uint8_t>(step * 3 + row * 5 + 1); }

  void SnapshotSharded(Node2& n, uint64_t step) {
    const ckptd::v1::Tensor& w = n.agent_reg.buffers[0];
    CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, n.node.seg->AcquireForFill(absl::Seconds(10)));
    uint8_t* p = n.node.seg->slot_data(slot);
    for (uint64_t i = 0; i < w.shape(0); ++i) {
      std::memset(p + n.node.handle.offsets[0] + i * 100, RowByte(step, w.offsets(0) + i), 100);
    }
    std::memset(p + n.node.handle.offsets[1], Pattern(step, n.agent_reg.rank), 64);
    CKPTD_ASSERT_OK(n.node.seg->Publish(slot, step));
    CKPTD_ASSERT_OK(n.node.agent->SnapshotPublished(n.node.handle.trainer_id, slot, step, 0.001));
    CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st,
                               n.node.agent->WaitPersisted(n.node.handle.trainer_id, step, absl::Seconds(30)));
    ASSERT_THAT(st.last_persisted_step, Optional(step)) << st.last_error;
  }

  // Four nodes of one rank each commit step 10; their trainers die, nodes 2
  // and 3 are gone for good, and nodes 0 and 1 come back as a job of two
  // (`prepare` runs before they restore). Each new rank must get rows
  // [20r, 20r + 20) of step 10 and saved rank r's RNG. Returns how many
  // saved shards each opened.
  std::vector<uint64_t> FourThenTwo(const std::function<void(std::vector<Node2>&)>& prepare) {
    std::vector<Node2> nodes(4);
    std::vector<Node*> all;
    for (uint32_t r = 0; r < 4; ++r) {
      nodes[r].agent_reg = Sharded(r, 4);
      nodes[r].node = Start(absl::StrCat("node-", r), nodes[r].agent_reg);
      all.push_back(&nodes[r].node);
    }
    std::vector<absl::StatusOr<RestoreResult>> fresh(4, absl::UnknownError("not run"));
    {
      std::vector<std::thread> threads;
      for (uint32_t r = 0; r < 4; ++r) {
        threads.emplace_back([&, r] { fresh[r] = all[r]->agent->Restore(all[r]->handle.trainer_id, absl::Seconds(5)); });
      }
      for (auto& t : threads) t.join();
    }
    for (uint32_t r = 0; r < 4; ++r) {
      EXPECT_THAT(fresh[r].status(), IsOk());
      SnapshotSharded(nodes[r], 10);
    }
    EXPECT_TRUE(Exists(storage::ManifestPath("/ckpt", "job", 10)));
    TrainerDied(nodes[3].node, 3);
    for (Node2& n : nodes) {
      EXPECT_THAT(n.node.agent->TrainerExited(n.node.handle.trainer_id, /*died=*/true), IsOk());
      n.node.link->Beat(*n.node.agent);
    }
    for (uint32_t r = 0; r < 2; ++r) {
      nodes[r].agent_reg = Sharded(r, 2);
      absl::StatusOr<TrainerHandle> h = nodes[r].node.agent->Register(nodes[r].agent_reg);
      EXPECT_THAT(h.status(), IsOk());
      nodes[r].node.handle = *h;
      nodes[r].node.seg = *staging::StagingSegment::Open(h->segment);
      nodes[r].node.link->Beat(*nodes[r].node.agent);
    }
    prepare(nodes);
    std::vector<absl::StatusOr<RestoreResult>> results(2, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        results[r] = nodes[r].node.agent->Restore(nodes[r].node.handle.trainer_id, absl::Seconds(10));
      });
    }
    for (auto& t : threads) t.join();
    std::vector<uint64_t> opened;
    for (uint32_t r = 0; r < 2; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " of 2"));
      EXPECT_THAT(results[r].status(), IsOk());
      if (!results[r].ok()) continue;
      EXPECT_THAT(results[r]->step, Optional(10u));
      EXPECT_EQ(results[r]->source, RestoreSource::kRoot);
      const uint8_t* p = nodes[r].node.seg->slot_data(results[r]->slot);
      uint64_t wrong = 0;
      for (uint64_t i = 0; i < 20; ++i) {
        for (uint64_t b = 0; b < 100; ++b) wrong += p[nodes[r].node.handle.offsets[0] + i * 100 + b] != RowByte(10, 20 * r + i);
      }
      EXPECT_EQ(wrong, 0u) << "bytes of rows [" << 20 * r << ", " << 20 * r + 20 << ") not as saved";
      for (uint64_t b = 0; b < 64; ++b) {
        wrong += p[nodes[r].node.handle.offsets[1] + b] != Pattern(10, r);
      }
      EXPECT_EQ(wrong, 0u) << "the RNG is not saved rank " << r << "'s";
      EXPECT_THAT(nodes[r].node.seg->Release(results[r]->slot), IsOk());
      absl::StatusOr<PersistStatus> st = nodes[r].node.agent->Status(nodes[r].node.handle.trainer_id);
      EXPECT_THAT(st.status(), IsOk());
      if (!st.ok()) continue;
      EXPECT_EQ(st->resharded_restores, 1u);
      opened.push_back(st->resharded_shards_opened);
    }
    return opened;
  }
};

// The coordinator reads the step's four indexes once and tells each rank
// which slices to read: rank 0 opens saved shards 0 and 1 only (its rows
// and its RNG), rank 1 shards 1, 2 and 3; neither reads all four indexes.
TEST_F(ShardedStateTest, TheCoordinatorPlansAndEachRankOpensOnlyTheShardsItReads) {
  EXPECT_EQ(FourThenTwo([](std::vector<Node2>&) {}), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(core_.reshard_layouts_read(), 1u);
}

// A coordinator that plans nothing (an older one): each agent plans from
// the four saved indexes by itself, and reads through the shards it opened
// to plan (a small saved world: each opened once).
TEST_F(ShardedStateTest, WithoutTheCoordinatorsPlanTheAgentPlansFromEveryIndex) {
  EXPECT_EQ(FourThenTwo([](std::vector<Node2>& nodes) {
              for (uint32_t r = 0; r < 2; ++r) nodes[r].node.link->plans_reshards = false;
            }),
            (std::vector<uint64_t>{4, 4}));
  EXPECT_EQ(core_.reshard_layouts_read(), 0u);
}

// A plan that does not fit the files (the coordinator's sources of two
// reads swapped: still covering the slice, so only the shards can tell) is
// caught before its bytes are used, and the agent plans by itself.
TEST_F(ShardedStateTest, APlanThatDoesNotFitTheShardsIsCaughtAndReplanned) {
  EXPECT_EQ(FourThenTwo([](std::vector<Node2>& nodes) {
              nodes[0].node.link->tamper = [](ckptd::v1::ReshardPlanResponse* plan) {
                ASSERT_GE(plan->reads_size(), 3);
                // Reads 0 and 2 are of "w" (rows 0..10 from rank 0, 10..20 from rank 1).
                ckptd::v1::ReshardRead* a = nullptr;
                ckptd::v1::ReshardRead* b = nullptr;
                for (ckptd::v1::ReshardRead& r : *plan->mutable_reads()) {
                  if (r.buffer() != 0) continue;
                  (a == nullptr ? a : b) = &r;
                }
                ASSERT_NE(b, nullptr);
                const uint32_t saved = a->saved_rank();
                a->set_saved_rank(b->saved_rank());
                b->set_saved_rank(saved);
              };
              nodes[1].node.link->tamper = [](ckptd::v1::ReshardPlanResponse* plan) {
                // A read of a rank the step does not have.
                plan->mutable_reads(0)->set_saved_rank(9);
              };
            }),
            // Rank 0 opened one shard of the bad plan, then all four; rank 1
            // refused its plan before opening anything.
            (std::vector<uint64_t>{5, 4}));
}

// A plan that reads a buffer without a global layout (the RNG) from another
// rank's shard: the slice is the same shape, so only the rule "rank r's own"
// tells it; the agent holds the coordinator's plan to it.
TEST_F(ShardedStateTest, APlanReadingAnotherRanksOwnBufferIsCaught) {
  EXPECT_EQ(FourThenTwo([](std::vector<Node2>& nodes) {
              nodes[1].node.link->tamper = [](ckptd::v1::ReshardPlanResponse* plan) {
                for (ckptd::v1::ReshardRead& r : *plan->mutable_reads()) {
                  if (r.buffer() == 1) r.set_saved_rank(0);  // rank 0's RNG for rank 1
                }
              };
            }),
            // Rank 1 opened its own shard (to check against) and rank 0's,
            // then planned from all four.
            (std::vector<uint64_t>{2, 6}));
}

TEST_F(CoordinatedAgentTest, DamagedShardOnOneNodeSendsEveryRankBackAStep) {
  keep_in_memory_ = false;  // the damage is on disk
  Node a = Start("node-a", 0, 2);
  Node b = Start("node-b", 1, 2);
  RestoreAll({&a, &b});
  for (uint64_t step : {10u, 20u}) {
    Snapshot(a, 0, step);
    Snapshot(b, 1, step);
  }
  // Rank 1's shard of step 20 loses its tail (index and footer).
  const std::string path = storage::ShardPath("/ckpt", "job", 20, 1);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string bytes, storage::ReadFileToString(&mem_, path));
  CKPTD_ASSERT_OK(mem_.SetFileContents(path, bytes.substr(0, bytes.size() / 2)));
  TrainerDied(b, 1);
  EXPECT_EQ(RestoreAll({&a, &b}), (std::vector<std::optional<uint64_t>>{10u, 10u}));
  ckptd::v1::GetClusterStatusResponse s = core_.ClusterStatus();
  ASSERT_EQ(s.jobs_size(), 1);
  EXPECT_THAT(s.jobs(0).quarantined_steps(), ::testing::ElementsAre(20u));
}

TEST_F(CoordinatedAgentTest, TrainerDeathAndPersistFailureReachTheCoordinator) {
  Node a = Start("node-a", 0, 2);
  CKPTD_ASSERT_OK(a.agent->TrainerExited(a.handle.trainer_id, /*died=*/true));
  ckptd::v1::ListEventsRequest list;
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ListEventsResponse events, core_.ListEvents(list));
  ASSERT_EQ(events.events_size(), 1);
  EXPECT_EQ(events.events(0).kind(), ckptd::v1::TRAINER_DIED);
  EXPECT_EQ(events.events(0).node_id(), "node-a");
  EXPECT_EQ(events.events(0).rank(), 0u);
}

TEST_F(CoordinatedAgentTest, ProgressAndScheduleFlowThroughTheAgent) {
  Node a = Start("node-a", 0, 2);
  ckptd::v1::SyncScheduleRequest sync;
  sync.set_trainer_id(a.handle.trainer_id);
  sync.set_step(57);
  sync.set_step_seconds(0.25);
  sync.set_step_seconds_idle(0.2);
  sync.set_step_seconds_persisting(0.3);
  sync.add_missed_targets(40);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::optional<ckptd::v1::Schedule> sched, a.agent->SyncSchedule(sync));
  ASSERT_TRUE(sched.has_value());
  EXPECT_EQ(sched->every_steps(), coordinator::CoordinatorOptions().every_steps);
  ckptd::v1::Heartbeat hb;
  a.agent->FillHeartbeat(&hb);
  ASSERT_EQ(hb.ranks_size(), 1);
  EXPECT_EQ(hb.ranks(0).job(), "job");
  EXPECT_EQ(hb.ranks(0).world_size(), 2u);
  ASSERT_EQ(hb.progress_size(), 1);
  EXPECT_EQ(hb.progress(0).step(), 57u);
  EXPECT_DOUBLE_EQ(hb.progress(0).step_seconds(), 0.25);
  EXPECT_DOUBLE_EQ(hb.progress(0).step_seconds_idle(), 0.2);
  EXPECT_DOUBLE_EQ(hb.progress(0).step_seconds_persisting(), 0.3);
  EXPECT_THAT(hb.progress(0).missed_targets(), ::testing::ElementsAre(40u));
  ckptd::v1::Heartbeat again;
  a.agent->FillHeartbeat(&again);
  EXPECT_TRUE(again.progress(0).missed_targets().empty());  // reported once
  // A nonsense time is not passed on; the last good one stays.
  sync.set_step_seconds_persisting(-1);
  CKPTD_ASSERT_OK(a.agent->SyncSchedule(sync).status());
  ckptd::v1::Heartbeat third;
  a.agent->FillHeartbeat(&third);
  EXPECT_DOUBLE_EQ(third.progress(0).step_seconds_persisting(), 0.3);
  sync.set_trainer_id(999);
  EXPECT_THAT(a.agent->SyncSchedule(sync), StatusIs(absl::StatusCode::kNotFound, HasSubstr("999")));
}

TEST_F(CoordinatedAgentTest, RestoreWaitingForARankThatNeverComesIsBounded) {
  Node a, b;
  StartTwoCommitStep10AndFailRank0(&a, &b);
  // The agent's own clock bounds the restore and spaces its plan polls.
  base::FakeClock agent_clock;
  AgentOptions o = Options(a.link.get());
  o.restore_timeout = absl::Seconds(30);
  o.plan_poll = absl::Milliseconds(50);
  o.clock = &agent_clock;
  AgentCore impatient(&mem_, o);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, impatient.Register(Rank(0, 2)));
  BackgroundCall<absl::StatusOr<RestoreResult>> restore(
      &agent_clock, [&] { return impatient.Restore(h.trainer_id, absl::Seconds(1)); });
  // Its persister and the restore, between two polls for a plan, wait on the
  // agent's clock.
  ASSERT_TRUE(Eventually([&] { return agent_clock.waiters() == 2; }));
  agent_clock.Advance(absl::Seconds(29));
  ASSERT_TRUE(Eventually([&] { return agent_clock.waiters() == 2; }));  // polled again, and waits on
  EXPECT_FALSE(restore.done());
  agent_clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] { return restore.done(); }));
  EXPECT_THAT(restore.result(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("did not finish loading within 30s")));
}

// A coordinator out of reach for a while during a restore (a leader that
// died before a standby took over, an agent not yet registered with the new
// one) delays the restore; every rank still restores the same step.
TEST_F(CoordinatedAgentTest, ARestoreRidesOutACoordinatorOutOfReach) {
  Node a, b;
  StartTwoCommitStep10AndFailRank0(&a, &b);
  a.link->RefusePlans(3);
  b.link->RefusePlans(6);
  EXPECT_EQ(RestoreAll({&a, &b}), (std::vector<std::optional<uint64_t>>{10u, 10u}));
  EXPECT_EQ(a.link->plans_asked_while_gone(), 3);
  EXPECT_EQ(b.link->plans_asked_while_gone(), 6);
}

// ... but not past the restore's deadline, which names why.
TEST_F(CoordinatedAgentTest, ACoordinatorOutOfReachForTheWholeRestoreIsAClearError) {
  Node a, b;
  StartTwoCommitStep10AndFailRank0(&a, &b);
  base::FakeClock agent_clock;
  AgentOptions o = Options(a.link.get());
  o.restore_timeout = absl::Seconds(30);
  o.plan_poll = absl::Milliseconds(50);
  o.clock = &agent_clock;
  AgentCore patient(&mem_, o);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, patient.Register(Rank(0, 2)));
  a.link->RefusePlans(1 << 30);
  BackgroundCall<absl::StatusOr<RestoreResult>> restore(
      &agent_clock, [&] { return patient.Restore(h.trainer_id, absl::Seconds(1)); });
  ASSERT_TRUE(Eventually([&] { return agent_clock.waiters() == 2; }));
  agent_clock.Advance(absl::Seconds(29));
  ASSERT_TRUE(Eventually([&] { return agent_clock.waiters() == 2; }));  // asks again, backing off
  EXPECT_FALSE(restore.done());
  EXPECT_GT(a.link->plans_asked_while_gone(), 1);
  agent_clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] { return restore.done(); }));
  EXPECT_THAT(restore.result(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                         AllOf(HasSubstr("no restore plan within 30s"), HasSubstr("c1:7070"))));
}

TEST_F(CoordinatedAgentTest, SingleRankJobIsCommittedByTheCoordinator) {
  Node a = Start("node-a", 0, 1);
  RestoreAll({&a});
  Snapshot(a, 0, 5);
  EXPECT_TRUE(Exists(storage::ManifestPath("/ckpt", "job", 5)));
  ASSERT_EQ(a.link->results().size(), 1u);
  EXPECT_THAT(a.link->results()[0], IsOk());
}

// ---- Peer replication ----

// A node with peer replication: its Peer service on loopback, the copies it
// holds for partners, its sender, and its agent (trainers come and go).
struct PeerNode {
  std::string name;
  std::unique_ptr<ReplicaStore> store;
  std::unique_ptr<PeerService> service;
  std::unique_ptr<replication::PeerServer> server;
  std::string address;
  std::unique_ptr<GrpcPeerNetwork> network;
  std::unique_ptr<Replicator> replicator;
  std::unique_ptr<InProcessCoordinator> link;
  std::unique_ptr<AgentCore> agent;
  std::vector<std::string> partners;  // as the last heartbeat answer said

  void Beat() {
    link->Beat(agent.get(), [this](const ckptd::v1::HeartbeatAck& ack) {
      replicator->SetPartners(ack.send_to());
      service->SetSenders(ack.receive_from());
      partners.clear();
      for (const auto& p : ack.send_to()) partners.push_back(p.node_id());
    });
  }
  // The node crashes: its agent (and what it held in memory) is gone.
  void Crash() {
    agent.reset();
    replicator.reset();
    if (server != nullptr) server->Shutdown();
    server.reset();
    store.reset();
  }
};

class PeerReplicationTest : public CoordinatedAgentTest {
 protected:
  void StartNode(const std::string& name, const std::string& domain, PeerNode* n) {
    n->name = name;
    n->store = std::make_unique<ReplicaStore>(ReplicaStoreOptions());
    PeerServiceOptions so;
    so.node_id = name;
    n->service = std::make_unique<PeerService>(n->store.get(), so);
    int port = 0;
    CKPTD_ASSERT_OK_AND_ASSIGN(n->server, StartPeerServer("127.0.0.1:0", n->service.get(), nullptr, &port));
    n->address = absl::StrCat("127.0.0.1:", port);
    GrpcPeerNetworkOptions no;
    no.node_id = name;
    n->network = std::make_unique<GrpcPeerNetwork>(no);
    n->replicator = std::make_unique<Replicator>(n->network.get(), ReplicatorOptions());
    ckptd::v1::RegisterAgentRequest req;
    req.set_peer_address(n->address);
    req.set_failure_domain(domain);
    req.set_replicas(1);
    n->link = std::make_unique<InProcessCoordinator>(&core_, name, req);
    n->service->SetFetchKey(n->link->fetch_key());
    AgentOptions o = Options(n->link.get());
    o.node_id = name;
    o.replicator = n->replicator.get();
    o.peer_network = n->network.get();
    o.replicas = n->store.get();
    n->agent = std::make_unique<AgentCore>(&mem_, o);
  }

  // A trainer of `rank` on node `n`: its handle and segment.
  struct Trainer {
    PeerNode* node = nullptr;
    uint32_t rank = 0;
    TrainerHandle handle;
    std::unique_ptr<staging::StagingSegment> seg;
  };
  void StartTrainer(PeerNode* n, uint32_t rank, Trainer* t) {
    t->node = n;
    t->rank = rank;
    CKPTD_ASSERT_OK_AND_ASSIGN(t->handle, n->agent->Register(Rank(rank, 2)));
    CKPTD_ASSERT_OK_AND_ASSIGN(t->seg, staging::StagingSegment::Open(t->handle.segment));
  }

  // Every trainer restores at once; each must get `step` with its rank's
  // bytes (nullopt: a fresh start). Returns where each read it.
  std::vector<RestoreSource> RestoreEach(std::vector<Trainer*> trainers, std::optional<uint64_t> step) {
    std::vector<absl::StatusOr<RestoreResult>> results(trainers.size(), absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < trainers.size(); ++i) {
      threads.emplace_back([&, i] {
        results[i] = trainers[i]->node->agent->Restore(trainers[i]->handle.trainer_id, absl::Seconds(5));
      });
    }
    for (auto& th : threads) th.join();
    std::vector<RestoreSource> sources;
    for (size_t i = 0; i < trainers.size(); ++i) {
      const Trainer& t = *trainers[i];
      EXPECT_THAT(results[i].status(), IsOk()) << "rank " << t.rank;
      if (!results[i].ok()) continue;
      EXPECT_EQ(results[i]->step, step) << "rank " << t.rank;
      sources.push_back(results[i]->source);
      if (!step || results[i]->step != step) continue;
      const uint8_t* p = t.seg->slot_data(results[i]->slot);
      EXPECT_EQ(p[0], Pattern(*step, t.rank)) << "rank " << t.rank;
      EXPECT_EQ(p[t.handle.offsets.back()], Pattern(*step, t.rank)) << "rank " << t.rank;
      EXPECT_THAT(t.seg->Release(results[i]->slot), IsOk());
    }
    return sources;
  }

  // Nodes a, b, c in three racks; ranks 0 and 1 on a and b commit step 10,
  // and each node's partner holds its rank's copy.
  void CommitStep10WithCopies() {
    StartNode("node-a", "rack-1", &a_);
    StartNode("node-b", "rack-2", &b_);
    StartNode("node-c", "rack-3", &c_);
    clock_.Advance(absl::Seconds(1));  // past the coordinator's recompute spacing
    for (PeerNode* n : {&a_, &b_, &c_}) n->Beat();
    ASSERT_EQ(a_.partners.size(), 1u);
    ASSERT_EQ(b_.partners.size(), 1u);
    ASSERT_NE(a_.partners[0], "node-a");
    StartTrainer(&a_, 0, &t0_);
    StartTrainer(&b_, 1, &t1_);
    RestoreEach({&t0_, &t1_}, std::nullopt);  // a fresh start: nothing committed
    for (Trainer* t : {&t0_, &t1_}) {
      SnapshotAndWait(*t->node->agent, *t->seg, t->handle, 10, Pattern(10, t->rank), 0.003);
    }
    ASSERT_TRUE(Exists(storage::ManifestPath("/ckpt", "job", 10)));
    for (PeerNode* n : {&a_, &b_}) {
      ASSERT_TRUE(n->replicator->WaitIdle(absl::Seconds(30)));
      ASSERT_EQ(n->replicator->Stats().sent, 1u) << n->name << ": " << n->replicator->Stats().last_error;
    }
    for (PeerNode* n : {&a_, &b_, &c_}) n->Beat();
    ckptd::v1::ReplicaKey key;
    key.set_job("job");
    key.set_rank(0);
    key.set_step(10);
    ASSERT_NE(Node(a_.partners[0])->store->Find(key), nullptr);
  }

  PeerNode* Node(const std::string& name) {
    for (PeerNode* n : {&a_, &b_, &c_}) {
      if (n->name == name) return n;
    }
    return nullptr;
  }

  // `lost` crash; the others keep beating until the coordinator declares
  // them lost.
  void Lose(std::vector<PeerNode*> lost) {
    for (PeerNode* n : lost) n->Crash();
    for (int i = 0; i < 8; ++i) {
      clock_.Advance(absl::Seconds(1));
      for (PeerNode* n : {&a_, &b_, &c_}) {
        if (n->agent != nullptr) n->Beat();
      }
      core_.Tick();
    }
    const ckptd::v1::GetClusterStatusResponse status = core_.ClusterStatus();
    for (const auto& agent : status.agents()) {
      const bool crashed = std::any_of(lost.begin(), lost.end(), [&](PeerNode* n) { return n->name == agent.node_id(); });
      EXPECT_EQ(agent.alive(), !crashed) << agent.node_id();
    }
  }

  PeerNode a_, b_, c_;
  Trainer t0_, t1_;
};

TEST_F(PeerReplicationTest, ALostNodesRankRestoresFromItsPartnersMemory) {
  ASSERT_NO_FATAL_FAILURE(CommitStep10WithCopies());
  const std::string partner = a_.partners[0];
  // The preview names the source of each rank: rank 0's node is gone, its
  // copy is in the partner's memory.
  ckptd::v1::RestorePreviewRequest pr;
  pr.set_job("job");
  ASSERT_NO_FATAL_FAILURE(Lose({&a_}));
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RestorePreview preview, core_.GetRestorePreview(pr));
  ASSERT_EQ(preview.step(), 10u);
  ASSERT_EQ(preview.ranks_size(), 2);
  EXPECT_EQ(preview.ranks(0).planned(), ckptd::v1::PEER_MEMORY);
  EXPECT_THAT(preview.ranks(0).peer_nodes(), ::testing::ElementsAre(partner));
  EXPECT_EQ(preview.ranks(1).planned(), ckptd::v1::AGENT_MEMORY);
  // Rank 0 comes back on the surviving node that is not the partner: its
  // agent pulls the copy over the network.
  PeerNode* replacement = partner == "node-b" ? &c_ : &b_;
  Trainer t0;
  StartTrainer(replacement, 0, &t0);
  replacement->Beat();
  Trainer t1;  // rank 1's trainer restarts on node-b
  ASSERT_THAT(b_.agent->TrainerExited(t1_.handle.trainer_id, /*died=*/true), IsOk());
  StartTrainer(&b_, 1, &t1);
  EXPECT_EQ(RestoreEach({&t0, &t1}, 10), (std::vector<RestoreSource>{RestoreSource::kPeer, RestoreSource::kMemory}));
  const ckptd::v1::JobStatus job = core_.ClusterStatus().jobs(0);
  ASSERT_EQ(job.last_restore().ranks_size(), 2);
  EXPECT_EQ(job.last_restore().ranks(0).source(), ckptd::v1::PEER_MEMORY);
  EXPECT_EQ(job.last_restore().ranks(0).node_id(), replacement->name);
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, replacement->agent->Status(t0.handle.trainer_id));
  EXPECT_EQ(st.peer_restores, 1u);
}

TEST_F(PeerReplicationTest, ThePartnerItselfRestoresTheLostRankFromTheCopyItHolds) {
  ASSERT_NO_FATAL_FAILURE(CommitStep10WithCopies());
  PeerNode* partner = Node(a_.partners[0]);
  ASSERT_NO_FATAL_FAILURE(Lose({&a_}));
  Trainer t0, t1;
  StartTrainer(partner, 0, &t0);
  ASSERT_THAT(b_.agent->TrainerExited(t1_.handle.trainer_id, /*died=*/true), IsOk());
  StartTrainer(&b_, 1, &t1);
  EXPECT_EQ(RestoreEach({&t0, &t1}, 10), (std::vector<RestoreSource>{RestoreSource::kPeer, RestoreSource::kMemory}));
}

TEST_F(PeerReplicationTest, LosingANodeAndItsPartnerFallsBackToDisk) {
  ASSERT_NO_FATAL_FAILURE(CommitStep10WithCopies());
  PeerNode* partner = Node(a_.partners[0]);
  ASSERT_NO_FATAL_FAILURE(Lose({&a_, partner}));
  PeerNode* survivor = partner == &b_ ? &c_ : &b_;
  Trainer t0, t1;
  StartTrainer(survivor, 0, &t0);
  if (survivor == &b_) {
    ASSERT_THAT(b_.agent->TrainerExited(t1_.handle.trainer_id, /*died=*/true), IsOk());
  }
  StartTrainer(survivor, 1, &t1);
  const std::vector<RestoreSource> sources = RestoreEach({&t0, &t1}, 10);
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[0], RestoreSource::kRoot) << "no copy of rank 0 is left in any memory";
}

}  // namespace
}  // namespace ckptd::agent
