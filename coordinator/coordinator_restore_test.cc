// CoordinatorCore: restore rounds after a failure, quarantine, and the restore preview.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "base/testing/capturing_logger.h"
#include "base/testing/matchers.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/state_store.h"
#include "coordinator/testing_core_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/layout.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using v1 = ::ckptd::v1::RestorePlanResponse;

TEST_F(CoordinatorCoreTest, NothingCommittedMeansEveryRankStartsFresh) {
  TwoNodes();
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(r));
    EXPECT_EQ(p.verdict(), v1::FRESH_START);
    EXPECT_EQ(p.incarnation(), 1u);
  }
}

TEST_F(CoordinatorCoreTest, RestoreIsABarrierAndEveryRankGetsTheSameStep) {
  TwoNodes();
  CommitStep(10);
  CommitStep(20);
  const uint64_t incarnation = RestoreAll(20);
  EXPECT_EQ(incarnation, 1u);
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RUNNING);
  // A later restart (rank 2 asks as a new trainer) is a failure and a new round.
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(2, std::nullopt, true, 4, /*trainer=*/2));
  EXPECT_EQ(p.verdict(), v1::LOAD);
  EXPECT_EQ(p.incarnation(), 2u);
  EXPECT_THAT(EventKinds(), ElementsAre(ckptd::v1::TRAINER_DIED));
}

TEST_F(CoordinatorCoreTest, TheJobsStatusSaysWhereEachRankReadTheRestoredStep) {
  TwoNodes();
  CommitStep(10);
  for (uint32_t r = 0; r < 4; ++r) CKPTD_ASSERT_OK(Plan(r).status());
  const ckptd::v1::RestoreSource sources[] = {ckptd::v1::AGENT_MEMORY, ckptd::v1::AGENT_MEMORY,
                                              ckptd::v1::NODE_LOCAL, ckptd::v1::STORAGE_ROOT};
  for (uint32_t r = 0; r < 4; ++r) {
    // Not before every rank loaded it: the round is not over.
    EXPECT_FALSE(JobState().has_last_restore()) << r;
    ckptd::v1::RestorePlanRequest req = PlanRequest(r, 10, true);
    req.set_attempt_source(sources[r]);
    CKPTD_ASSERT_OK(core_->GetRestorePlan(req).status());
  }
  const ckptd::v1::JobStatus job = JobState();
  ASSERT_TRUE(job.has_last_restore());
  EXPECT_EQ(job.last_restore().step(), 10u);
  EXPECT_EQ(job.last_restore().incarnation(), 1u);
  ASSERT_EQ(job.last_restore().ranks_size(), 4);
  for (uint32_t r = 0; r < 4; ++r) {
    EXPECT_EQ(job.last_restore().ranks(r).rank(), r);
    EXPECT_EQ(job.last_restore().ranks(r).source(), sources[r]);
    EXPECT_EQ(job.last_restore().ranks(r).node_id(), NodeOf(r));
    EXPECT_FALSE(job.last_restore().ranks(r).resharded());
  }
  EXPECT_EQ(job.last_restore().saved_world_size(), 0u);
  // A new failure opens a new round: the old summary goes until it ends.
  CKPTD_ASSERT_OK(Plan(2, std::nullopt, true, 4, /*trainer=*/2).status());
  EXPECT_FALSE(JobState().has_last_restore());
}

// Ranks that read the step resharded say so, with the world that saved it
// (the same world: other slices); a rank asking again as the same trainer
// and reading it as saved is no longer counted.
TEST_F(CoordinatorCoreTest, TheJobsStatusSaysWhichRanksReadTheStepResharded) {
  TwoNodes();
  CommitStep(10);
  for (uint32_t r = 0; r < 4; ++r) CKPTD_ASSERT_OK(Plan(r).status());
  for (uint32_t r = 0; r < 4; ++r) {
    ckptd::v1::RestorePlanRequest req = PlanRequest(r, 10, true);
    req.set_attempt_source(ckptd::v1::STORAGE_ROOT);
    if (r != 3) req.set_attempt_saved_world_size(4);
    CKPTD_ASSERT_OK(core_->GetRestorePlan(req).status());
  }
  ckptd::v1::RestoreSummary last = JobState().last_restore();
  EXPECT_EQ(last.saved_world_size(), 4u);
  ASSERT_EQ(last.ranks_size(), 4);
  for (uint32_t r = 0; r < 4; ++r) EXPECT_EQ(last.ranks(r).resharded(), r != 3) << r;
  // Rank 0 reports the step again, read as saved this time.
  ckptd::v1::RestorePlanRequest again = PlanRequest(0, 10, true);
  again.set_attempt_source(ckptd::v1::STORAGE_ROOT);
  CKPTD_ASSERT_OK(core_->GetRestorePlan(again).status());
  last = JobState().last_restore();
  EXPECT_FALSE(last.ranks(0).resharded());
  EXPECT_TRUE(last.ranks(1).resharded());
  EXPECT_EQ(last.saved_world_size(), 4u);
}

// What an agent says of a resharded read is held to what one can be: from
// the storage root, intact, within the largest world.
TEST_F(CoordinatorCoreTest, AReshardedReportThatCannotBeTrueIsRefused) {
  TwoNodes();
  CommitStep(10);
  for (uint32_t r = 0; r < 4; ++r) CKPTD_ASSERT_OK(Plan(r).status());
  ckptd::v1::RestorePlanRequest req = PlanRequest(0, 10, true);
  req.set_attempt_source(ckptd::v1::AGENT_MEMORY);
  req.set_attempt_saved_world_size(2);
  EXPECT_THAT(core_->GetRestorePlan(req).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("from the storage root")));
  req.set_attempt_source(ckptd::v1::STORAGE_ROOT);
  req.set_attempt_saved_world_size(0xFFFFFFFFu);
  EXPECT_THAT(core_->GetRestorePlan(req).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("above the largest world")));
  req = PlanRequest(0, 10, false);
  req.set_attempt_source(ckptd::v1::STORAGE_ROOT);
  req.set_attempt_saved_world_size(2);
  EXPECT_THAT(core_->GetRestorePlan(req).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("loaded intact")));
  EXPECT_FALSE(JobState().has_last_restore());
}

TEST_F(CoordinatorCoreTest, ARereadChangesOnlyWhereTheRankReadTheStep) {
  TwoNodes();
  CommitStep(10);
  for (uint32_t r = 0; r < 4; ++r) CKPTD_ASSERT_OK(Plan(r).status());
  ckptd::v1::RestorePlanRequest reread = PlanRequest(2, 10, true);
  reread.set_attempt_source(ckptd::v1::NODE_LOCAL);
  reread.set_reread(true);
  // Not before the rank loaded the step.
  EXPECT_THAT(core_->GetRestorePlan(reread),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 2 of job llm-7b did not load step 10")));
  for (uint32_t r = 0; r < 4; ++r) {
    ckptd::v1::RestorePlanRequest req = PlanRequest(r, 10, true);
    req.set_attempt_source(ckptd::v1::AGENT_MEMORY);
    CKPTD_ASSERT_OK(core_->GetRestorePlan(req).status());
  }
  const std::vector<ckptd::v1::FailureKind> events = EventKinds();
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 go, core_->GetRestorePlan(reread));
  EXPECT_EQ(go.verdict(), v1::GO);
  EXPECT_EQ(JobState().last_restore().ranks(2).source(), ckptd::v1::NODE_LOCAL);
  EXPECT_EQ(JobState().last_restore().ranks(3).source(), ckptd::v1::AGENT_MEMORY);
  EXPECT_EQ(EventKinds(), events);  // no failure recorded, no new round
  EXPECT_EQ(JobState().last_restore().incarnation(), go.incarnation());
  // Only the trainer that loaded it, of a step the round restored, and a
  // step loaded intact.
  ckptd::v1::RestorePlanRequest other = reread;
  other.set_trainer_id(9);
  EXPECT_THAT(core_->GetRestorePlan(other), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("did not load")));
  other = reread;
  other.set_attempt_step(5);
  EXPECT_THAT(core_->GetRestorePlan(other), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("step 5")));
  other = reread;
  other.set_attempt_ok(false);
  EXPECT_THAT(core_->GetRestorePlan(other), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reread")));
  EXPECT_EQ(JobState().last_restore().ranks(2).source(), ckptd::v1::NODE_LOCAL);
}

TEST_F(CoordinatorCoreTest, ADamagedShardQuarantinesTheStepAndTheWholeJobFallsBack) {
  TwoNodes();
  CommitStep(10);
  CommitStep(20);
  for (uint32_t r = 0; r < 4; ++r) CKPTD_ASSERT_OK(Plan(r).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 w0, Plan(0, 20, true));
  EXPECT_EQ(w0.verdict(), v1::WAIT);
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 bad, Plan(2, 20, false));
  EXPECT_EQ(bad.verdict(), v1::LOAD);
  EXPECT_EQ(bad.step(), 10u);
  // Rank 0 already loaded 20: it is sent to 10 as well.
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 again, Plan(0, 20, true));
  EXPECT_EQ(again.verdict(), v1::LOAD);
  EXPECT_EQ(again.step(), 10u);
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(r, 10, true));
    EXPECT_EQ(p.verdict(), r == 3 ? v1::GO : v1::WAIT);
    EXPECT_EQ(p.step(), 10u);
  }
  EXPECT_THAT(JobState().quarantined_steps(), ElementsAre(20u));
  EXPECT_THAT(EventKinds(), ElementsAre(ckptd::v1::SHARD_DAMAGED));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto q, state_->ListQuarantined(kJob));
  ASSERT_EQ(q.size(), 1u);
  EXPECT_THAT(q[0].reason(), HasSubstr("checksum mismatch"));
  // Kept on disk and marked there, never chosen again (also after a
  // coordinator restart, and even one that lost its database).
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 20)));
  EXPECT_TRUE(Exists(storage::QuarantinePath(kRoot, kJob, 20)));
  Reset();
  TwoNodes();  // the agents register with the new coordinator
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 later, Plan(1));
  EXPECT_EQ(later.step(), 10u);
  state_ = NewMemStateStore();
  Reset();
  TwoNodes();
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 without_db, Plan(1));
  EXPECT_EQ(without_db.step(), 10u);
}

TEST_F(CoordinatorCoreTest, AgentLostMidCheckpointLeavesTheStepUncommittedAndThePreviousRestores) {
  TwoNodes();
  CommitStep(10);
  const uint64_t inc = RestoreAll(10);
  CKPTD_ASSERT_OK(Shard("node-a", 20, 0, 4, inc).status());
  CKPTD_ASSERT_OK(Shard("node-a", 20, 1, 4, inc).status());
  CKPTD_ASSERT_OK(Shard("node-b", 20, 2, 4, inc).status());
  clock_.Advance(absl::Seconds(3));
  CKPTD_ASSERT_OK(Beat("node-a").status());
  clock_.Advance(absl::Seconds(3));
  CKPTD_ASSERT_OK(Beat("node-a").status());
  core_->Tick();  // node-b lost before rank 3 reported
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RESTARTING);
  EXPECT_FALSE(Exists(storage::ManifestPath(kRoot, kJob, 20)));
  Register("node-b", {2, 3});
  const uint64_t inc2 = RestoreAll(10);
  EXPECT_GT(inc2, inc);
  // The half-written step is gone, and a late shard of it is refused.
  EXPECT_FALSE(Exists(storage::StepDir(kRoot, kJob, 20)));
  EXPECT_THAT(Shard("node-b", 20, 3, 4, inc), StatusIs(absl::StatusCode::kAborted, HasSubstr("latest restore")));
  // The rerun checkpoints step 20 again, this time completely.
  CommitStep(20, inc2);
  EXPECT_EQ(JobState().newest_committed_step(), 20u);
}

TEST_F(CoordinatorCoreTest, ShardFinishedAfterItsTrainerDiedStillCompletesTheStep) {
  TwoNodes();
  CommitStep(10);
  const uint64_t inc = RestoreAll(10);
  for (uint32_t r = 0; r < 3; ++r) CKPTD_ASSERT_OK(Shard(r < 2 ? "node-a" : "node-b", 20, r, 4, inc).status());
  CKPTD_ASSERT_OK(ReportFailure("node-b", 3, ckptd::v1::TRAINER_DIED));
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RESTARTING);
  // Its agent still persists what the trainer had published.
  CKPTD_ASSERT_OK_AND_ASSIGN(auto resp, Shard("node-b", 20, 3, 4, inc));
  EXPECT_TRUE(resp.committed());
  RestoreAll(20);
}

TEST_F(CoordinatorCoreTest, RestorePreviewNamesTheStepAndWhatItPassesOver) {
  TwoNodes();
  ckptd::v1::RestorePreviewRequest req;
  req.set_job(kJob);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RestorePreview fresh, core_->GetRestorePreview(req));
  EXPECT_TRUE(fresh.fresh_start());
  EXPECT_THAT(fresh.reason(), HasSubstr("no step of the job is committed"));
  CommitStep(10);
  CommitStep(20);
  for (uint32_t r = 0; r < 2; ++r) CKPTD_ASSERT_OK(Shard("node-a", 30, r).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RestorePreview p, core_->GetRestorePreview(req));
  EXPECT_FALSE(p.fresh_start());
  EXPECT_EQ(p.step(), 20u);
  EXPECT_THAT(p.reason(), HasSubstr("newest committed step"));
  ASSERT_EQ(p.passed_over_size(), 1);
  EXPECT_EQ(p.passed_over(0).step(), 30u);
  EXPECT_THAT(p.passed_over(0).reason(), HasSubstr("2 of 4 ranks durable"));
  // Nothing changed: no round was started.
  EXPECT_EQ(JobState().schedule().incarnation(), p.incarnation());
  req.set_job("nope");
  EXPECT_THAT(core_->GetRestorePreview(req), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no job nope")));
}

// After the job came back on fewer ranks, the preview says that the step was
// saved by more and that every rank reads its part resharded from disk.
TEST_F(CoordinatorCoreTest, RestorePreviewAfterAResizeSaysTheStepIsReadResharded) {
  TwoNodes();
  CommitStep(10);
  ckptd::v1::RestorePreviewRequest req;
  req.set_job(kJob);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RestorePreview same, core_->GetRestorePreview(req));
  EXPECT_EQ(same.world_size(), 4u);
  EXPECT_EQ(same.saved_world_size(), 4u);
  EXPECT_THAT(same.reason(), Not(HasSubstr("resharded")));
  ranks_["node-b"] = Registration("node-b", {});
  CKPTD_ASSERT_OK(Beat("node-b").status());
  ranks_["node-a"] = Registration("node-a", {0, 1}, /*world=*/2);
  CKPTD_ASSERT_OK(Beat("node-a").status());
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RestorePreview p, core_->GetRestorePreview(req));
  EXPECT_EQ(p.step(), 10u);
  EXPECT_EQ(p.world_size(), 2u);
  EXPECT_EQ(p.saved_world_size(), 4u);
  EXPECT_THAT(p.reason(), HasSubstr("saved by 4 ranks and the job runs 2: every rank reads its part of it "
                                    "resharded from disk"));
  ASSERT_EQ(p.ranks_size(), 2);
  for (const auto& r : p.ranks()) EXPECT_EQ(r.planned(), ckptd::v1::STORAGE_ROOT) << r.rank();
}


// The attacks of a caller that reaches the agent API (issue: a running job
// made to restart, or its committed steps quarantined, by a request).
class RunningJobTest : public CoordinatorCoreTest {
 protected:
  // Two nodes, step 10 committed, every rank resumed from it and past it.
  void SetUp() override {
    options_.logger = &log_;
    Reset();
    TwoNodes();
    CommitStep(10);
    incarnation_ = RestoreAll(10);
    CKPTD_ASSERT_OK(Beat("node-a", {{0, 12}, {1, 12}}).status());
    CKPTD_ASSERT_OK(Beat("node-b", {{2, 12}, {3, 12}}).status());
  }

  // Registers `node` listing `ranks` of kJob, without making it the node
  // the harness's plan requests of those ranks go through.
  void RegisterOnly(const std::string& node, std::vector<uint32_t> ranks, uint32_t world = 4) {
    absl::StatusOr<ckptd::v1::RegisterAgentResponse> resp = core_->RegisterAgent(Registration(node, ranks, world));
    ASSERT_THAT(resp.status(), IsOk());
    sessions_[node] = resp->session();
  }

  // The plan request of `rank` sent by `node`'s agent (world `world`).
  ckptd::v1::RestorePlanRequest PlanFrom(const std::string& node, uint32_t rank,
                                         std::optional<uint64_t> attempt = std::nullopt, bool ok = true,
                                         uint32_t world = 4) {
    ckptd::v1::RestorePlanRequest req = PlanRequest(rank, attempt, ok, world, /*trainer=*/9);
    req.set_node_id(node);
    req.set_session(sessions_[node]);
    return req;
  }

  // The node the cluster status lists `rank` of kJob under ("" when none, and
  // every such node when several).
  std::string ListedUnder(uint32_t rank) {
    std::string nodes;
    const ckptd::v1::GetClusterStatusResponse status = core_->ClusterStatus();
    for (const auto& a : status.agents()) {
      for (const auto& r : a.ranks()) {
        if (r.job() == kJob && r.rank() == rank) absl::StrAppend(&nodes, nodes.empty() ? "" : ",", a.node_id());
      }
    }
    return nodes;
  }

  uint64_t incarnation_ = 0;
  ckptd::testing::CapturingLogger log_;
};

TEST_F(RunningJobTest, APlanRequestOfARunningTrainerOpensNoRound) {
  // The trainer that took part asks again: the round's plan stands.
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 again, Plan(2));
  EXPECT_EQ(again.verdict(), v1::GO);
  EXPECT_EQ(again.step(), 10u);
  EXPECT_EQ(again.incarnation(), incarnation_);
  // Anyone else for a running rank (a trainer the agent does not name, the
  // same process) is refused.
  EXPECT_THAT(core_->GetRestorePlan(PlanRequest(0, std::nullopt, true, 4, /*trainer=*/0)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no failure is recorded")));
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RUNNING);
  EXPECT_EQ(JobState().schedule().incarnation(), incarnation_);
  EXPECT_TRUE(EventKinds().empty());
  // The ranks' checkpoints still commit.
  CommitStep(20, incarnation_);
  EXPECT_EQ(JobState().newest_committed_step(), 20u);
}

TEST_F(RunningJobTest, AFailedLoadReportedAfterEveryRankResumedQuarantinesNothing) {
  EXPECT_THAT(Plan(2, 10, false), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no longer news")));
  EXPECT_TRUE(JobState().quarantined_steps().empty());
  EXPECT_TRUE(EventKinds().empty());
  EXPECT_EQ(JobState().schedule().incarnation(), incarnation_);
}

TEST_F(RunningJobTest, ARestartedTrainerIsAFailureAndTheRoundBringsEveryRankBack) {
  // Rank 2's trainer was started again before its agent reported the exit.
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(2, std::nullopt, true, 4, /*trainer=*/7));
  EXPECT_EQ(p.verdict(), v1::LOAD);
  EXPECT_EQ(p.step(), 10u);
  EXPECT_GT(p.incarnation(), incarnation_);
  EXPECT_THAT(EventKinds(), ElementsAre(ckptd::v1::TRAINER_DIED));
}

TEST_F(RunningJobTest, ATrainerRunningAsANewProcessIsAFailure) {
  // The heartbeat lists rank 3 with another pid than the one that made progress.
  ckptd::v1::Heartbeat hb = HeartbeatOf("node-b", {{2, 13}});
  for (auto& r : *hb.mutable_ranks()) {
    if (r.rank() == 3) r.set_pid(4242);
  }
  CKPTD_ASSERT_OK(core_->OnHeartbeat(hb).status());
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RESTARTING);
  EXPECT_THAT(EventKinds(), ElementsAre(ckptd::v1::TRAINER_DIED));
}

TEST_F(RunningJobTest, ARankListedTwiceCountsByItsLastEntryAndIsNoFailureEveryBeat) {
  // node-b's agent lists rank 3 twice: a stale entry of another pid first,
  // then the running process. Heartbeat after heartbeat, nothing fails.
  for (int beat = 0; beat < 3; ++beat) {
    ckptd::v1::Heartbeat hb = HeartbeatOf("node-b", {{2, 13}, {3, 13}});
    ckptd::v1::RankInfo stale;
    for (const auto& r : hb.ranks()) {
      if (r.rank() == 3) stale = r;
    }
    stale.set_pid(4242);
    ckptd::v1::Heartbeat listed = hb;
    listed.clear_ranks();
    *listed.add_ranks() = stale;
    for (const auto& r : hb.ranks()) *listed.add_ranks() = r;
    CKPTD_ASSERT_OK(core_->OnHeartbeat(listed).status());
  }
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RUNNING);
  EXPECT_TRUE(EventKinds().empty());
}

TEST_F(RunningJobTest, ANodeSpeaksOnlyForItsOwnRanks) {
  // node-b reports rank 0 (node-a's) dead, a bogus shard of it, asks its plan.
  EXPECT_THAT(ReportFailure("node-b", 0, ckptd::v1::TRAINER_DIED),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("runs on node node-a")));
  CKPTD_ASSERT_OK(Shard("node-a", 20, 1, 4, incarnation_).status());
  EXPECT_THAT(ReportOnly("node-b", 20, 0, 1, 1, 4, incarnation_),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("runs on node node-a")));
  ckptd::v1::RestorePlanRequest plan = PlanRequest(0, std::nullopt, true, 4, /*trainer=*/9);
  plan.set_node_id("node-b");
  plan.set_session(sessions_["node-b"]);
  EXPECT_THAT(core_->GetRestorePlan(plan), StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("node-a")));
  // Nothing changed: no failure, the pending step is not aborted.
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RUNNING);
  EXPECT_TRUE(EventKinds().empty());
  EXPECT_THAT(JobState().pending_steps(), ElementsAre(20u));
}

// Under per-node credentials any node's agent can register: listing another
// live node's running rank takes nothing (issue: it took the rank, then
// restarted the job with a failure report, and the owner was refused).
TEST_F(RunningJobTest, ARegistrationTakesNoRankThatRunsOnAnotherNode) {
  ASSERT_NO_FATAL_FAILURE(RegisterOnly("node-c", {0, 1}));
  EXPECT_EQ(ListedUnder(0), "node-a");
  EXPECT_TRUE(log_.Contains("registration of node node-c: rank 0 of job llm-7b runs on node node-a"));
  EXPECT_THAT(ReportFailure("node-c", 0, ckptd::v1::TRAINER_DIED),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("runs on node node-a")));
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RUNNING);
  EXPECT_TRUE(EventKinds().empty());
  // node-a still speaks for its ranks, and node-c's heartbeats take nothing.
  CKPTD_ASSERT_OK(Shard("node-a", 20, 0, 4, incarnation_).status());
  ranks_["node-c"] = Registration("node-c", {0, 1});
  CKPTD_ASSERT_OK(Beat("node-c").status());
  EXPECT_EQ(ListedUnder(0), "node-a");
  CKPTD_ASSERT_OK(Shard("node-a", 20, 1, 4, incarnation_).status());
  EXPECT_THAT(JobState().pending_steps(), ElementsAre(20u));
  EXPECT_EQ(JobState().ranks_alive(), 4u);
}

// A node that may not speak for a rank (it runs on another node) cannot
// resize the job by asking for that rank's plan, or listing it, in another
// world size: the rank is checked against the job as it is first.
TEST_F(RunningJobTest, AnotherNodesRankResizesNothing) {
  ASSERT_NO_FATAL_FAILURE(RegisterOnly("node-c", {}));
  EXPECT_THAT(core_->GetRestorePlan(PlanFrom("node-c", 0, std::nullopt, true, /*world=*/2)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("runs on node node-a")));
  ranks_["node-c"] = Registration("node-c", {0}, /*world=*/2);
  CKPTD_ASSERT_OK(Beat("node-c").status());
  EXPECT_EQ(JobState().world_size(), 4u);
  EXPECT_EQ(ListedUnder(0), "node-a");
}

TEST_F(RunningJobTest, APlanRequestNeedsTheNodesSession) {
  ckptd::v1::RestorePlanRequest plan = PlanRequest(2, std::nullopt, true, 4, /*trainer=*/9);
  plan.clear_session();
  EXPECT_THAT(core_->GetRestorePlan(plan), StatusIs(absl::StatusCode::kNotFound, HasSubstr("register again")));
  plan.set_session(sessions_["node-a"]);  // another node's session
  EXPECT_THAT(core_->GetRestorePlan(plan), StatusIs(absl::StatusCode::kNotFound, HasSubstr("register again")));
  plan.set_node_id("node-z");
  EXPECT_THAT(core_->GetRestorePlan(plan), StatusIs(absl::StatusCode::kNotFound, HasSubstr("register again")));
  EXPECT_EQ(JobState().schedule().incarnation(), incarnation_);
  EXPECT_TRUE(EventKinds().empty());
}

TEST_F(RunningJobTest, ARankRestartsOnAReplacementNodeOnceItsNodeIsLost) {
  clock_.Advance(absl::Seconds(6));
  CKPTD_ASSERT_OK(Beat("node-a").status());
  core_->Tick();  // node-b lost
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RESTARTING);
  Register("node-c", {2, 3});
  ranks_.erase("node-b");  // the harness asks through node-c now
  const uint64_t again = RestoreAll(10);
  EXPECT_GT(again, incarnation_);
  // node-b, back with its old session, speaks for nothing.
  EXPECT_THAT(ReportFailure("node-b", 2, ckptd::v1::TRAINER_DIED),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("register again")));
}

TEST_F(CoordinatorCoreTest, SessionsAreUnguessable) {
  const std::string first = Register("node-a", {0, 1});
  const std::string second = Register("node-a", {0, 1});
  EXPECT_THAT(first, ::testing::MatchesRegex("[0-9a-f]{32}"));
  EXPECT_THAT(second, ::testing::MatchesRegex("[0-9a-f]{32}"));
  EXPECT_NE(first, second);
  // Only the newest is valid.
  sessions_["node-a"] = first;
  EXPECT_THAT(ReportFailure("node-a", 0, ckptd::v1::TRAINER_DIED),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("register again")));
}


TEST_F(CoordinatorCoreTest, NoFreshStartOverDamagedStepsUntilTheOperatorAllowsIt) {
  TwoNodes();
  CommitStep(10);
  CommitStep(20);
  for (uint64_t step : {10u, 20u}) CKPTD_ASSERT_OK(store_.QuarantineStep(kJob, step, "chunk 3 checksum mismatch"));
  Reset();
  TwoNodes();
  // Every rank is refused, the same way, and the status says why.
  for (uint32_t r = 0; r < 4; ++r) {
    EXPECT_THAT(Plan(r), StatusIs(absl::StatusCode::kFailedPrecondition,
                                  AllOf(HasSubstr("none intact"), HasSubstr("ckptctl start-fresh --root /ckpt --job "),
                                        HasSubstr("step 20: chunk 3 checksum mismatch"))));
  }
  EXPECT_THAT(JobState().restore_blocked(), HasSubstr("none intact"));
  // The operator allows it (in storage); the next request starts fresh.
  CKPTD_ASSERT_OK(store_.AllowFreshStart(kJob, "the data set changed").status());
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(r));
    EXPECT_EQ(p.verdict(), v1::FRESH_START);
  }
  EXPECT_EQ(JobState().restore_blocked(), "");
  // A coordinator started later knows the choice at once.
  Reset();
  TwoNodes();
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(0));
  EXPECT_EQ(p.verdict(), v1::FRESH_START);
}

TEST_F(CoordinatorCoreTest, AStepDamagedDuringTheRestoreHoldsTheRestartBackToo) {
  TwoNodes();
  CommitStep(10);
  for (uint32_t r = 0; r < 4; ++r) CKPTD_ASSERT_OK(Plan(r).status());
  // The only committed step is found damaged: nothing intact is left.
  EXPECT_THAT(Plan(1, 10, false), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("none intact")));
  EXPECT_THAT(JobState().quarantined_steps(), ElementsAre(10u));
  EXPECT_THAT(Plan(0, 10, true), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("none intact")));
}

// A coordinator that takes the job over mid-restore (a standby after the
// leader died, a restarted coordinator) reads the round from the job's
// record: every rank of it gets the same step, in the same incarnation.
class TakenOverRoundTest : public CoordinatorCoreTest {
 protected:
  // The record of kJob as the state store holds it.
  ckptd::v1::JobRecord Saved() {
    absl::StatusOr<std::vector<ckptd::v1::JobRecord>> jobs = state_->ListJobs();
    Check(jobs.status(), "ListJobs");
    for (const auto& j : jobs.value_or(std::vector<ckptd::v1::JobRecord>{})) {
      if (j.job() == kJob) return j;
    }
    ADD_FAILURE() << "no saved record of " << kJob;
    return {};
  }

  // Every rank is told to load step 20; ranks 0..2 loaded it and wait, rank
  // 3 loaded it last and was told GO.
  uint64_t RoundDecidedButNotToldToAll() {
    TwoNodes();
    CommitStep(10);
    CommitStep(20);
    for (uint32_t r = 0; r < 4; ++r) {
      absl::StatusOr<v1> p = Plan(r);
      EXPECT_TRUE(p.ok() && p->verdict() == v1::LOAD && p->step() == 20u) << r;
    }
    for (uint32_t r = 0; r < 3; ++r) {
      absl::StatusOr<v1> p = Plan(r, 20);
      EXPECT_TRUE(p.ok() && p->verdict() == v1::WAIT) << r;
    }
    absl::StatusOr<v1> go = Plan(3, 20);
    EXPECT_TRUE(go.ok() && go->verdict() == v1::GO);
    return go.ok() ? go->incarnation() : 0;
  }
};

TEST_F(TakenOverRoundTest, RanksThatLoadedTheStepGetGoWhileTheRankToldGoTrains) {
  const uint64_t incarnation = RoundDecidedButNotToldToAll();
  const ckptd::v1::RestoreRoundRecord saved = Saved().round();
  EXPECT_TRUE(saved.open());
  EXPECT_TRUE(saved.go());
  EXPECT_EQ(saved.step(), 20u);
  EXPECT_EQ(saved.incarnation(), incarnation);

  Reset();  // the leader is gone; another takes the job over
  TwoNodes();
  CKPTD_ASSERT_OK(Beat("node-b", {{3, 21}}).status());  // rank 3 trains on
  for (uint32_t r = 0; r < 3; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(r, 20));
    EXPECT_EQ(p.verdict(), v1::GO) << r;
    EXPECT_EQ(p.step(), 20u) << r;
    EXPECT_EQ(p.incarnation(), incarnation) << r;
  }
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RUNNING);
  EXPECT_TRUE(EventKinds().empty());
  CommitStep(30, incarnation);  // and the job's checkpoints commit
}

TEST_F(TakenOverRoundTest, ARoundNotDecidedYetKeepsItsStepAndIncarnation) {
  TwoNodes();
  CommitStep(10);
  for (uint32_t r = 0; r < 4; ++r) CKPTD_ASSERT_OK(Plan(r).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 waiting, Plan(0, 10));
  ASSERT_EQ(waiting.verdict(), v1::WAIT);
  EXPECT_FALSE(Saved().round().go());

  Reset();
  TwoNodes();
  // Rank 2 lost the answer and asks again; ranks 0, 1 and 3 report theirs.
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(2));
  EXPECT_EQ(p.verdict(), v1::LOAD);
  EXPECT_EQ(p.step(), 10u);
  EXPECT_EQ(p.incarnation(), waiting.incarnation());
  for (uint32_t r = 0; r < 3; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(v1 w, Plan(r, 10));
    EXPECT_EQ(w.verdict(), v1::WAIT) << r;
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 go, Plan(3, 10));
  EXPECT_EQ(go.verdict(), v1::GO);
  EXPECT_EQ(go.incarnation(), waiting.incarnation());
}

TEST_F(TakenOverRoundTest, ATrainerAskingAfreshStillOpensANewRound) {
  const uint64_t incarnation = RoundDecidedButNotToldToAll();
  Reset();
  TwoNodes();
  // Nothing trains yet and a trainer asks with nothing loaded: the round
  // taken over does not know who took part in it, so this is a new one.
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(1, std::nullopt, true, 4, /*trainer=*/7));
  EXPECT_EQ(p.verdict(), v1::LOAD);
  EXPECT_EQ(p.step(), 20u);
  EXPECT_EQ(p.incarnation(), incarnation + 1);
  EXPECT_EQ(Saved().round().incarnation(), incarnation + 1);
  EXPECT_FALSE(Saved().round().go());
}

TEST_F(TakenOverRoundTest, ARestartClearsTheRoundFromTheRecord) {
  const uint64_t incarnation = RoundDecidedButNotToldToAll();
  CKPTD_ASSERT_OK(ReportFailure("node-a", 0, ckptd::v1::TRAINER_DIED));
  EXPECT_FALSE(Saved().round().open());
  Reset();
  TwoNodes();
  // A new round (the one told GO is over), in which rank 0 alone loaded 20.
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(0, 20));
  EXPECT_EQ(p.verdict(), v1::WAIT);
  EXPECT_EQ(p.incarnation(), incarnation + 1);
  EXPECT_TRUE(Saved().round().open());
}

// A round the job resumed from is over once a newer step commits: a
// coordinator that takes over later (the whole job requeued, say) opens a
// new round from the newest step, never the old round's fresh start or
// step. Also when the record was saved before that commit (a coordinator
// killed before its next save): the storage root has the newer step.
TEST_F(TakenOverRoundTest, ARoundTheJobTrainedPastIsNotTakenOver) {
  TwoNodes();
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(v1 fresh, Plan(r));
    ASSERT_EQ(fresh.verdict(), v1::FRESH_START);
  }
  const ckptd::v1::JobRecord at_fresh_start = Saved();
  ASSERT_TRUE(at_fresh_start.round().open());
  ASSERT_TRUE(at_fresh_start.round().fresh_start());
  CommitStep(10, at_fresh_start.schedule().incarnation());
  core_->Tick();
  EXPECT_FALSE(Saved().round().open());
  for (bool stale_record : {false, true}) {
    if (stale_record) {
      CKPTD_ASSERT_OK(state_->PutJob(at_fresh_start));
    }
    Reset();
    TwoNodes();
    for (uint32_t r = 0; r < 4; ++r) {
      CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(r, std::nullopt, true, 4, /*trainer=*/5 + r));
      EXPECT_EQ(p.verdict(), v1::LOAD) << "rank " << r << (stale_record ? ", stale record" : "");
      EXPECT_EQ(p.step(), 10u) << r;
    }
  }
}

// A record whose round cannot be (a fresh start with a step) or belongs to
// another incarnation is not taken over.
TEST_F(TakenOverRoundTest, ARoundRecordThatDoesNotFitIsIgnored) {
  const uint64_t incarnation = RoundDecidedButNotToldToAll();
  for (int bad = 0; bad < 2; ++bad) {
    ckptd::v1::JobRecord r = Saved();
    if (bad == 0) r.mutable_round()->set_fresh_start(true);
    if (bad == 1) r.mutable_round()->set_incarnation(incarnation + 5);
    CKPTD_ASSERT_OK(state_->PutJob(r));
    Reset();
    TwoNodes();
    CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(0, 20));
    EXPECT_EQ(p.verdict(), v1::WAIT) << bad;  // a new round, in which rank 0 alone loaded 20
    EXPECT_EQ(p.incarnation(), incarnation + 1 + bad) << bad;
  }
}

}  // namespace
}  // namespace ckptd::coordinator
