// CoordinatorCore: membership, failure detection, recovery, saving and listing steps.
#include "coordinator/coordinator_core.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "absl/strings/match.h"
#include "base/testing/capturing_logger.h"
#include "base/testing/matchers.h"
#include "coordinator/state_store.h"
#include "coordinator/testing_core_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/layout.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST_F(CoordinatorCoreTest, SlowHeartbeatsAreNotANodeLossButSilenceIs) {
  TwoNodes();
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Milliseconds(4500));  // slow, under the 5 s threshold
    CKPTD_ASSERT_OK(Beat("node-a").status());
    CKPTD_ASSERT_OK(Beat("node-b").status());
    core_->Tick();
  }
  EXPECT_TRUE(EventKinds().empty());
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RUNNING);

  clock_.Advance(absl::Seconds(4));
  CKPTD_ASSERT_OK(Beat("node-a").status());
  core_->Tick();
  EXPECT_TRUE(EventKinds().empty());
  clock_.Advance(absl::Seconds(2));  // node-b silent for 6 s
  CKPTD_ASSERT_OK(Beat("node-a").status());
  core_->Tick();
  EXPECT_THAT(EventKinds(), ElementsAre(ckptd::v1::NODE_LOST));
  ckptd::v1::JobStatus s = JobState();
  EXPECT_EQ(s.state(), ckptd::v1::JOB_RESTARTING);
  EXPECT_EQ(s.ranks_alive(), 2u);
  CKPTD_ASSERT_OK_AND_ASSIGN(auto ack, Beat("node-a"));
  EXPECT_EQ(ack.schedules(0).state(), ckptd::v1::JOB_RESTARTING);
  // The lost node's session is void; it registers again when it is back.
  CKPTD_ASSERT_OK_AND_ASSIGN(auto stale, Beat("node-b"));
  EXPECT_FALSE(stale.known());
  Register("node-b", {2, 3});
  CKPTD_ASSERT_OK_AND_ASSIGN(auto back, Beat("node-b"));
  EXPECT_TRUE(back.known());
  EXPECT_EQ(JobState().ranks_alive(), 4u);
  core_->Tick();
  EXPECT_EQ(EventKinds().size(), 1u);
}

// Issue 40: a job whose ranks all said goodbye is `finished`, not `running`
// with 0 ranks; its name reused by a new run is a warning.
TEST_F(CoordinatorCoreTest, AJobWhoseRanksAllLeftIsFinishedUntilItsNameIsReused) {
  ckptd::testing::CapturingLogger log;
  options_.logger = &log;
  Reset();
  TwoNodes();
  ASSERT_TRUE(Beat("node-a", {{0, 10}, {1, 10}}).ok());
  ASSERT_TRUE(Beat("node-b", {{2, 10}, {3, 10}}).ok());
  CommitStep(10);
  EXPECT_FALSE(JobState().finished());
  const ckptd::v1::RegisterAgentRequest a = ranks_["node-a"], b = ranks_["node-b"];
  // node-a's trainers leave: half the world is gone, the run goes on.
  ranks_["node-a"].clear_ranks();
  ASSERT_TRUE(Beat("node-a").ok());
  EXPECT_FALSE(JobState().finished());
  EXPECT_EQ(JobState().ranks_alive(), 2u);
  ranks_["node-b"].clear_ranks();
  ASSERT_TRUE(Beat("node-b").ok());
  const ckptd::v1::JobStatus done = JobState();
  EXPECT_TRUE(done.finished());
  EXPECT_EQ(done.state(), ckptd::v1::JOB_RUNNING);
  EXPECT_EQ(done.ranks_alive(), 0u);
  EXPECT_THAT(EventKinds(), ::testing::IsEmpty());
  EXPECT_FALSE(log.Contains("registered again"));
  // A new run under the same name: running again, and warned of once.
  ranks_["node-a"] = a;
  ASSERT_TRUE(Beat("node-a").ok());
  EXPECT_FALSE(JobState().finished());
  EXPECT_TRUE(log.Contains("rank 0 on node node-a registered again: job llm-7b was used by a run that finished "
                           "(every rank said goodbye); this run restores that run's newest committed step 10"));
  ranks_["node-b"] = b;
  ASSERT_TRUE(Beat("node-b").ok());
  int warnings = 0;
  for (const std::string& line : log.lines()) warnings += absl::StrContains(line, "registered again") ? 1 : 0;
  EXPECT_EQ(warnings, 1);
  // Every rank of the new run hears it with its restore plan, whatever it
  // is told to do...
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(PlanResponse p, Plan(r, std::nullopt, true, 4, /*trainer=*/2));
    EXPECT_THAT(p.warning(), HasSubstr("job llm-7b was used by a run that finished")) << r;
    EXPECT_THAT(p.warning(), HasSubstr("give a new run a job name of its own")) << r;
  }
  uint64_t incarnation = 0;
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(PlanResponse p, Plan(r, 10, true, 4, /*trainer=*/2));
    EXPECT_EQ(p.verdict(), r == 3 ? PlanResponse::GO : PlanResponse::WAIT) << r;
    EXPECT_THAT(p.warning(), HasSubstr("restores that run's newest committed step 10")) << r;
    incarnation = p.incarnation();
  }
  // Nothing failed: the new run is no restart.
  EXPECT_THAT(EventKinds(), ::testing::IsEmpty());
  // ...until the new run commits a step of its own: a restart after that
  // restores this run's work.
  CommitStep(20, incarnation);
  CKPTD_ASSERT_OK_AND_ASSIGN(PlanResponse later, Plan(1, std::nullopt, true, 4, /*trainer=*/3));
  EXPECT_EQ(later.step(), 20u);
  EXPECT_EQ(later.warning(), "");
}

// The new run's first rank may ask for its restore plan before its agent's
// heartbeat lists it: the same warning, a new round, and no failure counted
// against the job (its new trainers are no restart of dead ones).
TEST_F(CoordinatorCoreTest, ANewRunThatAsksForItsPlanFirstIsWarnedAndNoFailure) {
  ckptd::testing::CapturingLogger log;
  options_.logger = &log;
  Reset();
  TwoNodes();
  CommitStep(10);
  const uint64_t first = RestoreAll(10);  // the first run restored (and so took part in a round)
  ASSERT_TRUE(Beat("node-a", {{0, 12}, {1, 12}}).ok());
  ASSERT_TRUE(Beat("node-b", {{2, 12}, {3, 12}}).ok());
  ranks_["node-a"].clear_ranks();
  ranks_["node-b"].clear_ranks();
  ASSERT_TRUE(Beat("node-a").ok());
  ASSERT_TRUE(Beat("node-b").ok());
  ASSERT_TRUE(JobState().finished());
  for (uint32_t r = 0; r < 4; ++r) {
    // (No heartbeat lists the rank yet: the request names its node.)
    ckptd::v1::RestorePlanRequest req = PlanRequest(r, std::nullopt, true, 4, /*trainer=*/7);
    req.set_node_id(r < 2 ? "node-a" : "node-b");
    req.set_session(sessions_[req.node_id()]);
    CKPTD_ASSERT_OK_AND_ASSIGN(PlanResponse p, core_->GetRestorePlan(req));
    EXPECT_EQ(p.verdict(), PlanResponse::LOAD) << r;
    EXPECT_EQ(p.step(), 10u) << r;
    EXPECT_GT(p.incarnation(), first) << r;
    EXPECT_THAT(p.warning(), HasSubstr("was used by a run that finished")) << r;
  }
  EXPECT_THAT(EventKinds(), ::testing::IsEmpty());
  EXPECT_FALSE(JobState().finished());
  int warnings = 0;
  for (const std::string& line : log.lines()) warnings += absl::StrContains(line, "registered again") ? 1 : 0;
  EXPECT_EQ(warnings, 1);
}

// Issue 41: what the live ranks skipped (no free staging slot), summed.
TEST_F(CoordinatorCoreTest, TheJobsStatusSumsTheSnapshotsItsLiveRanksSkipped) {
  TwoNodes();
  ckptd::v1::Heartbeat a = HeartbeatOf("node-a", {{0, 10}, {1, 10}});
  a.mutable_progress(0)->set_snapshots_skipped(3);
  a.mutable_progress(1)->set_snapshots_skipped(4);
  ASSERT_TRUE(core_->OnHeartbeat(a).ok());
  ckptd::v1::Heartbeat b = HeartbeatOf("node-b", {{2, 10}, {3, 10}});
  b.mutable_progress(0)->set_snapshots_skipped(5);
  ASSERT_TRUE(core_->OnHeartbeat(b).ok());
  EXPECT_EQ(JobState().snapshots_skipped(), 12u);
  // node-b's trainers leave: only the live ranks' count.
  ranks_["node-b"].clear_ranks();
  ASSERT_TRUE(Beat("node-b").ok());
  EXPECT_EQ(JobState().snapshots_skipped(), 7u);
}

TEST_F(CoordinatorCoreTest, RanksThatDiedAreNoFinishedRun) {
  TwoNodes();
  ASSERT_TRUE(Beat("node-a", {{0, 10}, {1, 10}}).ok());
  ASSERT_TRUE(Beat("node-b", {{2, 10}, {3, 10}}).ok());
  for (uint32_t rank : {0u, 1u}) ASSERT_TRUE(ReportFailure("node-a", rank, ckptd::v1::TRAINER_DIED).ok());
  ranks_["node-a"].clear_ranks();
  ranks_["node-b"].clear_ranks();
  ASSERT_TRUE(Beat("node-a").ok());
  ASSERT_TRUE(Beat("node-b").ok());
  const ckptd::v1::JobStatus s = JobState();
  EXPECT_EQ(s.state(), ckptd::v1::JOB_RESTARTING);
  EXPECT_FALSE(s.finished());
}

TEST_F(CoordinatorCoreTest, TrainerDeathIsAFailureAtOnce) {
  TwoNodes();
  ckptd::v1::ReportFailureRequest req = FailureRequest("node-b", 3, ckptd::v1::TRAINER_DIED, 0, "killed by signal 9");
  CKPTD_ASSERT_OK(core_->ReportFailure(req));
  ckptd::v1::ListEventsRequest list;
  CKPTD_ASSERT_OK_AND_ASSIGN(auto events, core_->ListEvents(list));
  ASSERT_EQ(events.events_size(), 1);
  EXPECT_EQ(events.events(0).kind(), ckptd::v1::TRAINER_DIED);
  EXPECT_EQ(events.events(0).node_id(), "node-b");
  EXPECT_TRUE(events.events(0).has_rank());
  EXPECT_EQ(events.events(0).rank(), 3u);
  EXPECT_THAT(events.events(0).detail(), HasSubstr("signal 9"));
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RESTARTING);

  req.set_rank(4);
  EXPECT_THAT(core_->ReportFailure(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 4")));
  req.set_rank(3);
  req.set_session(sessions_["node-b"] + "0");
  EXPECT_THAT(core_->ReportFailure(req), StatusIs(absl::StatusCode::kNotFound, HasSubstr("register again")));
  req.set_session(sessions_["node-b"]);
  req.set_kind(ckptd::v1::NODE_LOST);
  EXPECT_THAT(core_->ReportFailure(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NODE_LOST")));
}

// The job restarts on fewer ranks, and the first the coordinator hears of it
// is a heartbeat that lists the new rank 0 where the old rank 0 was: the old
// rank is gone and the job takes its new world, or it never could.
TEST_F(CoordinatorCoreTest, AHeartbeatListingARankOfAnotherWorldSizeResizesTheJob) {
  TwoNodes();
  ranks_["node-b"] = Registration("node-b", {});
  CKPTD_ASSERT_OK(Beat("node-b").status());
  EXPECT_EQ(JobState().ranks_alive(), 2u);
  ranks_["node-a"] = Registration("node-a", {0, 1}, /*world=*/2);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::HeartbeatAck ack, Beat("node-a"));
  EXPECT_TRUE(ack.known());
  EXPECT_EQ(JobState().world_size(), 2u);
  EXPECT_EQ(JobState().ranks_alive(), 2u);
  // The same rank numbers of the same world: the same trainers, no change.
  CKPTD_ASSERT_OK(Beat("node-a").status());
  EXPECT_EQ(JobState().world_size(), 2u);
  EXPECT_EQ(JobState().ranks_alive(), 2u);
}

TEST_F(CoordinatorCoreTest, RankWithoutProgressIsHungAfterTheThreshold) {
  options_.hang_floor = absl::Seconds(30);
  options_.hang_multiple = 10;
  Reset();
  TwoNodes();
  for (uint64_t step = 1; step <= 5; ++step) {
    clock_.Advance(absl::Seconds(1));
    CKPTD_ASSERT_OK(Beat("node-a", {{0, step}, {1, step}}, 1.0).status());
    CKPTD_ASSERT_OK(Beat("node-b", {{2, step}, {3, step == 5 ? 4 : step}}, 1.0).status());
  }
  // Rank 3 stops at step 4: at 1 s a step the floor (30 s) decides.
  for (int i = 0; i < 25; ++i) {
    clock_.Advance(absl::Seconds(1));
    CKPTD_ASSERT_OK(Beat("node-a", {{0, 6 + i}, {1, 6 + i}}, 1.0).status());
    CKPTD_ASSERT_OK(Beat("node-b", {{2, 6 + i}, {3, 4}}, 1.0).status());
    core_->Tick();
  }
  EXPECT_TRUE(EventKinds().empty());
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(absl::Seconds(1));
    CKPTD_ASSERT_OK(Beat("node-a").status());
    CKPTD_ASSERT_OK(Beat("node-b", {{3, 4}}, 1.0).status());
    core_->Tick();
  }
  ckptd::v1::ListEventsRequest list;
  CKPTD_ASSERT_OK_AND_ASSIGN(auto events, core_->ListEvents(list));
  ASSERT_GE(events.events_size(), 1);
  EXPECT_EQ(events.events(events.events_size() - 1).kind(), ckptd::v1::TRAINER_HUNG);
  EXPECT_EQ(events.events(events.events_size() - 1).rank(), 3u);
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RESTARTING);
}

// One node reporting an absurd step time (1e300 s) must not lift the hang
// limit of the other nodes' ranks, which the job's mean step time feeds.
TEST_F(CoordinatorCoreTest, AnAbsurdStepTimeFromOneNodeLeavesHangDetectionToTheOthers) {
  options_.hang_floor = absl::Seconds(30);
  options_.hang_multiple = 10;
  Reset();
  TwoNodes();
  for (int i = 0; i < 40; ++i) {
    clock_.Advance(absl::Seconds(1));
    const uint64_t step = 1 + i;
    CKPTD_ASSERT_OK(Beat("node-a", {{0, step}, {1, step}}, 1e300).status());
    // Rank 3 stops at step 4.
    CKPTD_ASSERT_OK(Beat("node-b", {{2, step}, {3, std::min<uint64_t>(step, 4)}}, 1.0).status());
    core_->Tick();
  }
  EXPECT_LT(JobState().step_seconds(), 2.0);
  ckptd::v1::ListEventsRequest list;
  CKPTD_ASSERT_OK_AND_ASSIGN(auto events, core_->ListEvents(list));
  ASSERT_EQ(events.events_size(), 1);
  EXPECT_EQ(events.events(0).kind(), ckptd::v1::TRAINER_HUNG);
  EXPECT_EQ(events.events(0).rank(), 3u);
}

TEST_F(CoordinatorCoreTest, RestartedCoordinatorLosesNoCommittedStepAndTakesLateReports) {
  TwoNodes();
  CommitStep(10);
  const uint64_t inc = RestoreAll(10);
  std::vector<ckptd::v1::ShardReport> reports;
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ShardReport rep, Write(20, r, 4, inc));
    reports.push_back(rep);
  }
  for (uint32_t r = 0; r < 2; ++r) {
    CKPTD_ASSERT_OK(core_->ReportShard(ShardRequest("node-a", reports[r])).status());
  }
  // The coordinator restarts (node b wrote its shards of 20 meanwhile): the
  // pending reports are lost with it, the committed step is not.
  Reset();
  ckptd::v1::JobStatus s = JobState();
  EXPECT_TRUE(s.has_committed());
  EXPECT_EQ(s.newest_committed_step(), 10u);
  EXPECT_EQ(s.schedule().incarnation(), inc);
  EXPECT_EQ(s.checkpoints_committed(), 1u);
  // Old sessions are unknown; agents register again with the durable shards
  // whose commit they have not seen.
  CKPTD_ASSERT_OK_AND_ASSIGN(auto stale, Beat("node-a"));
  EXPECT_FALSE(stale.known());
  for (const std::string node : {"node-a", "node-b"}) {
    ckptd::v1::RegisterAgentRequest req = ranks_[node];
    for (uint32_t r = node == "node-a" ? 0 : 2, end = r + 2; r < end; ++r) *req.add_durable_shards() = reports[r];
    CKPTD_ASSERT_OK_AND_ASSIGN(auto resp, core_->RegisterAgent(req));
    sessions_[node] = resp.session();
  }
  EXPECT_EQ(JobState().newest_committed_step(), 20u);
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 20)));
  // Checkpoints resume.
  CommitStep(30, inc);
  EXPECT_EQ(JobState().newest_committed_step(), 30u);
}

// Counts the job records written, to show what reaches the database when.
class CountingStateStore : public StateStore {
 public:
  explicit CountingStateStore(StateStore* base) : base_(base) {}
  absl::Status AppendEvent(const ckptd::v1::FailureEvent& e) override { return base_->AppendEvent(e); }
  absl::StatusOr<std::vector<ckptd::v1::FailureEvent>> ListEvents(absl::string_view job, size_t limit) override {
    return base_->ListEvents(job, limit);
  }
  absl::StatusOr<absl::flat_hash_map<ckptd::v1::FailureKind, uint64_t>> CountEventsByKind(absl::string_view job,
                                                                                          absl::Time since) override {
    return base_->CountEventsByKind(job, since);
  }
  absl::Status PutJob(const ckptd::v1::JobRecord& r) override {
    ++puts;
    return base_->PutJob(r);
  }
  absl::StatusOr<std::vector<ckptd::v1::JobRecord>> ListJobs() override { return base_->ListJobs(); }
  absl::Status DeleteJob(absl::string_view job) override { return base_->DeleteJob(job); }
  absl::Status PutQuarantine(const ckptd::v1::QuarantinedStep& q) override { return base_->PutQuarantine(q); }
  absl::StatusOr<std::vector<ckptd::v1::QuarantinedStep>> ListQuarantined(absl::string_view job) override {
    return base_->ListQuarantined(job);
  }
  absl::Status PutDrill(const ckptd::v1::DrillRecord& d) override { return base_->PutDrill(d); }
  absl::StatusOr<std::vector<ckptd::v1::DrillRecord>> ListDrills() override { return base_->ListDrills(); }
  absl::Status PutCommitIntent(const ckptd::v1::CommitIntent& c) override { return base_->PutCommitIntent(c); }
  absl::StatusOr<std::vector<ckptd::v1::CommitIntent>> ListCommitIntents() override {
    return base_->ListCommitIntents();
  }
  int puts = 0;

 private:
  StateStore* base_;
};

TEST_F(CoordinatorCoreTest, DecisionsAreSavedAtOnceAndTimingsOnlyNowAndThen) {
  std::unique_ptr<StateStore> base = NewMemStateStore();
  CountingStateStore counting(base.get());
  core_ = std::make_unique<CoordinatorCore>(&store_, &counting, &clock_, options_);
  CKPTD_ASSERT_OK(core_->Recover());
  TwoNodes();
  const int after_register = counting.puts;
  for (uint64_t step = 1; step <= 20; ++step) {
    clock_.Advance(absl::Milliseconds(100));
    CKPTD_ASSERT_OK(Beat("node-a", {{0, step}, {1, step}}).status());
    CKPTD_ASSERT_OK(Beat("node-b", {{2, step}, {3, step}}).status());
    core_->Tick();
  }
  EXPECT_LE(counting.puts - after_register, 1);  // 2 s of heartbeats: timings saved at most once
  const int before_failure = counting.puts;
  CKPTD_ASSERT_OK(ReportFailure("node-b", 2, ckptd::v1::TRAINER_DIED));
  EXPECT_EQ(counting.puts, before_failure + 1);
  // A coordinator that restarts now still knows the job must restart.
  core_ = std::make_unique<CoordinatorCore>(&store_, base.get(), &clock_, options_);
  CKPTD_ASSERT_OK(core_->Recover());
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RESTARTING);
  EXPECT_GT(JobState().schedule().generation(), 1u);
}

TEST_F(CoordinatorCoreTest, MalformedRequestsChangeNothing) {
  TwoNodes();
  ckptd::v1::RegisterAgentRequest reg;
  reg.set_node_id("../../etc");
  EXPECT_THAT(core_->RegisterAgent(reg), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node id")));
  reg.set_node_id("node-c");
  ckptd::v1::RankInfo* r = reg.add_ranks();
  r->set_job("bad/job");
  r->set_world_size(4);
  EXPECT_THAT(core_->RegisterAgent(reg), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name")));
  r->set_job(kJob);
  r->set_rank(4);
  EXPECT_THAT(core_->RegisterAgent(reg), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 4")));
  r->set_rank(1);
  r->set_world_size(8);
  EXPECT_THAT(core_->RegisterAgent(reg), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("world size 4")));
  EXPECT_EQ(core_->ClusterStatus().agents_size(), 2);

  EXPECT_THAT(ReportOnly("node-a", 10, 0, 0, 1), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("length")));
  EXPECT_THAT(ReportOnly("node-a", 10, 7, 4096, 1), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 7")));
  EXPECT_THAT(ReportOnly("node-a", uint64_t{1} << 63, 0, 4096, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step")));
  EXPECT_THAT(ReportOnly("node-a", 10, 0, 4096, 1, 8),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("the job runs 4")));
  sessions_["node-a"] += "7";
  EXPECT_THAT(ReportOnly("node-a", 10, 0, 4096, 1), StatusIs(absl::StatusCode::kNotFound, HasSubstr("register again")));
  EXPECT_TRUE(JobState().pending_steps().empty());
  ckptd::v1::RestorePlanRequest outside = PlanRequest(0);
  outside.set_rank(4);
  EXPECT_THAT(core_->GetRestorePlan(outside), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 4")));
  ckptd::v1::ListEventsRequest list;
  list.set_job("a b");
  EXPECT_THAT(core_->ListEvents(list), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name")));
}

// A registration refused by a check that needs the coordinator's state (one
// new job listed in two world sizes) leaves the node as it was: its
// session, its ranks, and no new job.
TEST_F(CoordinatorCoreTest, ARefusedRegistrationLeavesTheNodesSessionAndRanksAlone) {
  TwoNodes();
  ckptd::v1::RegisterAgentRequest reg = Registration("node-a", {0, 1});
  for (uint32_t world : {4u, 8u}) {
    ckptd::v1::RankInfo* r = reg.add_ranks();
    r->set_job("other");
    r->set_rank(world == 4 ? 0 : 1);
    r->set_world_size(world);
    r->set_pid(77);
  }
  EXPECT_THAT(core_->RegisterAgent(reg),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job other in world sizes 4 and 8")));
  // The same for a job that runs: its world size is checked before anything changes.
  reg = Registration("node-a", {0, 1}, /*world=*/8);
  EXPECT_THAT(core_->RegisterAgent(reg),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("runs with world size 4, not 8")));
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::HeartbeatAck ack, Beat("node-a"));
  EXPECT_TRUE(ack.known());
  const ckptd::v1::GetClusterStatusResponse status = core_->ClusterStatus();
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).job(), kJob);
  EXPECT_EQ(status.jobs(0).ranks_alive(), 4u);
  for (const auto& a : status.agents()) {
    if (a.node_id() == "node-a") {
      EXPECT_EQ(a.ranks_size(), 2);
    }
  }
}

// What a registration carries beside its ranks is bounded, so that one node
// cannot make the cluster status too large to send (gRPC's 4 MiB) or the
// coordinator's memory grow without end.
TEST_F(CoordinatorCoreTest, ARegistrationsAddressAndGpusAreBounded) {
  ckptd::v1::RegisterAgentRequest reg = Registration("node-a", {0});
  reg.set_address(std::string(256, 'h'));
  EXPECT_THAT(core_->RegisterAgent(reg),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("address is 256 bytes; at most 255")));
  reg.set_address(std::string(255, 'h'));
  for (int i = 0; i < 257; ++i) reg.add_gpus(absl::StrCat("cuda:", i));
  EXPECT_THAT(core_->RegisterAgent(reg),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("registers 257 gpus; at most 256")));
  reg.mutable_gpus()->RemoveLast();
  reg.set_gpus(7, std::string(129, 'g'));
  EXPECT_THAT(core_->RegisterAgent(reg),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gpus[7] is 129 bytes; at most 128")));
  EXPECT_EQ(core_->ClusterStatus().agents_size(), 0);
  // At the limits, it registers.
  reg.set_gpus(7, std::string(128, 'g'));
  CKPTD_ASSERT_OK(core_->RegisterAgent(reg).status());
  const ckptd::v1::GetClusterStatusResponse status = core_->ClusterStatus();
  ASSERT_EQ(status.agents_size(), 1);
  EXPECT_EQ(status.agents(0).address().size(), 255u);
  EXPECT_EQ(status.agents(0).gpus_size(), 256);
}

TEST_F(CoordinatorCoreTest, ListStepsShowsCommittedPendingAbortedAndIncompleteSteps) {
  TwoNodes();
  CommitStep(10);
  CommitStep(20);
  // Step 30: three of four ranks so far.
  for (uint32_t r = 0; r < 3; ++r) CKPTD_ASSERT_OK(Shard(r < 2 ? "node-a" : "node-b", 30, r).status());
  // Step 25: files nobody reports (a crashed writer).
  CKPTD_ASSERT_OK(Write(25, 0).status());
  // Step 40: aborted when rank 3's file turned out missing.
  CKPTD_ASSERT_OK(store_.PrepareStep(kJob, 40));
  EXPECT_THAT(ReportOnly("node-b", 40, 3, 8192, 42),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 3")));
  ckptd::v1::ListStepsRequest req;
  req.set_job(kJob);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ListStepsResponse list, core_->ListSteps(req));
  std::vector<std::pair<uint64_t, ckptd::v1::StepState>> got;
  for (const auto& e : list.steps()) got.emplace_back(e.step(), e.state());
  EXPECT_THAT(got, ElementsAre(std::pair(uint64_t{10}, ckptd::v1::STEP_COMMITTED),
                               std::pair(uint64_t{20}, ckptd::v1::STEP_COMMITTED),
                               std::pair(uint64_t{25}, ckptd::v1::STEP_INCOMPLETE),
                               std::pair(uint64_t{30}, ckptd::v1::STEP_PENDING),
                               std::pair(uint64_t{40}, ckptd::v1::STEP_ABORTED)));
  const ckptd::v1::StepEntry& committed = list.steps(1);
  EXPECT_EQ(committed.world_size(), 4u);
  EXPECT_EQ(committed.ranks_reported(), 4u);
  EXPECT_GT(committed.stored_bytes(), 0u);
  EXPECT_GT(committed.committed_unix_nanos(), 0);
  EXPECT_DOUBLE_EQ(committed.persist_seconds(), 0.25);
  EXPECT_EQ(list.steps(3).ranks_reported(), 3u);
  EXPECT_THAT(list.steps(4).reason(), HasSubstr("rank 3 has no durable shard"));
  req.set_job("unknown");
  EXPECT_THAT(core_->ListSteps(req), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no job unknown")));
  req.set_job("a/b");
  EXPECT_THAT(core_->ListSteps(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name")));
}

TEST_F(CoordinatorCoreTest, AnAgentRestartedBeforeItWasMissedLosesItsNode) {
  auto register_as = [&](const std::string& node, std::vector<uint32_t> ranks, uint64_t instance) {
    ckptd::v1::RegisterAgentRequest req = Registration(node, std::move(ranks));
    req.set_instance(instance);
    Register(req);
  };
  register_as("node-a", {0, 1}, 111);
  register_as("node-b", {2, 3}, 222);
  CKPTD_ASSERT_OK(Beat("node-a", {{0, 10}, {1, 10}}).status());
  CKPTD_ASSERT_OK(Beat("node-b", {{2, 10}, {3, 10}}).status());
  // The same process registering again (a coordinator blip): nothing lost.
  register_as("node-b", {2, 3}, 222);
  EXPECT_THAT(EventKinds(), ::testing::IsEmpty());
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RUNNING);
  // A new process, a moment after the old one died: node-b is lost.
  clock_.Advance(absl::Milliseconds(300));
  register_as("node-b", {}, 333);
  EXPECT_THAT(EventKinds(), ElementsAre(ckptd::v1::NODE_LOST));
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RESTARTING);
  ckptd::v1::ListEventsRequest req;
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ListEventsResponse events, core_->ListEvents(req));
  ASSERT_EQ(events.events_size(), 1);
  EXPECT_EQ(events.events(0).node_id(), "node-b");
  EXPECT_THAT(events.events(0).detail(), HasSubstr("agent restarted"));
  // An agent that does not say which process it is changes nothing.
  register_as("node-a", {0, 1}, 0);
  EXPECT_EQ(EventKinds().size(), 1u);
}

// What the service's audit trail says of a registration: whether it
// replaced a live one, from where that came, and whether the node was lost.
TEST_F(CoordinatorCoreTest, ARegistrationSaysWhatItReplaced) {
  auto register_from = [&](uint64_t instance, const std::string& from) {
    ckptd::v1::RegisterAgentRequest req = Registration("node-a", {0});
    req.set_instance(instance);
    PreviousRegistration previous;
    EXPECT_THAT(core_->RegisterAgent(req, from, &previous).status(), ::ckptd::testing::IsOk());
    return previous;
  };
  const absl::Time first = clock_.Now();
  PreviousRegistration p = register_from(111, "ipv4:10.0.0.1:4000");
  EXPECT_FALSE(p.known);
  EXPECT_FALSE(p.alive);
  clock_.Advance(absl::Seconds(1));
  p = register_from(111, "ipv4:10.0.0.1:4001");  // the same agent again
  EXPECT_TRUE(p.known);
  EXPECT_TRUE(p.alive);
  EXPECT_FALSE(p.agent_restarted);
  EXPECT_EQ(p.from, "ipv4:10.0.0.1:4000");
  EXPECT_EQ(p.at, first);
  p = register_from(999, "ipv4:192.0.2.9:5000");  // another process while node-a is live
  EXPECT_TRUE(p.alive);
  EXPECT_TRUE(p.agent_restarted);
  EXPECT_EQ(p.from, "ipv4:10.0.0.1:4001");
  EXPECT_EQ(p.at, first + absl::Seconds(1));
  EXPECT_THAT(EventKinds(), ElementsAre(ckptd::v1::NODE_LOST));
  // Once the node was lost, a registration replaces no live one.
  clock_.Advance(options_.node_lost_after + absl::Seconds(1));
  core_->Tick();
  p = register_from(1000, "ipv4:10.0.0.1:4002");
  EXPECT_TRUE(p.known);
  EXPECT_FALSE(p.alive);
  EXPECT_FALSE(p.agent_restarted);
  EXPECT_EQ(p.from, "ipv4:192.0.2.9:5000");
}

TEST_F(CoordinatorCoreTest, RanksOfASilentNodeAreNotCalledHung) {
  options_.hang_floor = absl::Seconds(1);
  options_.heartbeat_interval = absl::Milliseconds(200);
  options_.node_lost_after = absl::Seconds(10);
  Reset();
  TwoNodes();
  CKPTD_ASSERT_OK(Beat("node-a", {{0, 10}, {1, 10}}).status());
  CKPTD_ASSERT_OK(Beat("node-b", {{2, 10}, {3, 10}}).status());
  // node-a keeps beating without progress; node-b goes quiet.
  for (int i = 0; i < 25; ++i) {
    clock_.Advance(absl::Milliseconds(200));
    CKPTD_ASSERT_OK(Beat("node-a", {{0, 10}, {1, 10}}).status());
    core_->Tick();
  }
  ckptd::v1::ListEventsRequest req;
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ListEventsResponse events, core_->ListEvents(req));
  ASSERT_FALSE(events.events().empty());
  for (const auto& e : events.events()) {
    EXPECT_EQ(e.node_id(), "node-a") << "a rank of the quiet node-b was called hung: " << e.DebugString();
    EXPECT_EQ(e.kind(), ckptd::v1::TRAINER_HUNG);
  }
}


TEST_F(CoordinatorCoreTest, NodesAndJobsPastTheirLimitsAreRefusedAndNothingChanges) {
  options_.max_nodes = 2;
  options_.max_jobs = 2;
  Reset();
  TwoNodes();  // one job, two nodes
  ckptd::v1::RegisterAgentRequest third = Registration("node-c", {0}, 1);
  third.mutable_ranks(0)->set_job("other");
  EXPECT_THAT(core_->RegisterAgent(third),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-nodes")));
  // node-b, registering again, brings ranks of two new jobs: one too many.
  ckptd::v1::RegisterAgentRequest more = Registration("node-b", {0}, 1);
  more.mutable_ranks(0)->set_job("job-1");
  *more.add_ranks() = more.ranks(0);
  more.mutable_ranks(1)->set_job("job-2");
  EXPECT_THAT(core_->RegisterAgent(more), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max-jobs")));
  const ckptd::v1::GetClusterStatusResponse status = core_->ClusterStatus();
  EXPECT_EQ(status.agents_size(), 2);
  EXPECT_EQ(status.jobs_size(), 1);
  // node-b's session still stands: the refused registration changed nothing.
  CKPTD_EXPECT_OK(Beat("node-b").status());
  EXPECT_TRUE(Beat("node-b")->known());
}

TEST_F(CoordinatorCoreTest, LostNodesAndJobsWithoutRanksAreForgotten) {
  options_.forget_after = absl::Hours(1);
  Reset();
  TwoNodes();
  CommitStep(10);
  clock_.Advance(absl::Minutes(30));
  core_->Tick();  // both nodes lost; the job ran half an hour ago
  EXPECT_EQ(core_->ClusterStatus().agents_size(), 2);
  EXPECT_EQ(core_->ClusterStatus().jobs_size(), 1);
  clock_.Advance(absl::Hours(2));
  core_->Tick();
  EXPECT_EQ(core_->ClusterStatus().agents_size(), 0);
  EXPECT_EQ(core_->ClusterStatus().jobs_size(), 0);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<ckptd::v1::JobRecord> saved, state_->ListJobs());
  EXPECT_TRUE(saved.empty());
  // Its committed steps stay in storage, and a new coordinator finds them.
  Reset();
  EXPECT_EQ(JobState().newest_committed_step(), 10u);
}

}  // namespace
}  // namespace ckptd::coordinator
