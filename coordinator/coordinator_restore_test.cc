// CoordinatorCore: restore rounds after a failure, quarantine, and the restore preview.
#include <cstdint>
#include <string>

#include "base/status_macros.h"
#include "base/testing/matchers.h"
#include "coordinator/coordinator_core.h"
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
  // A later restart is a new round.
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(2));
  EXPECT_EQ(p.verdict(), v1::LOAD);
  EXPECT_EQ(p.incarnation(), 2u);
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
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 later, Plan(1));
  EXPECT_EQ(later.step(), 10u);
  state_ = NewMemStateStore();
  Reset();
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

}  // namespace
}  // namespace ckptd::coordinator
