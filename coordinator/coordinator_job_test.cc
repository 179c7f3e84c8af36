// The job's bookkeeping (coordinator/job.h) and the pure rules of the core
// (coordinator_core_internal.h), without a CoordinatorCore.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "base/testing/matchers.h"
#include "coordinator/coordinator_core_internal.h"
#include "coordinator/job.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::coordinator::internal {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

ckptd::v1::ShardRef ShardOf(uint32_t rank) {
  ckptd::v1::ShardRef s;
  s.set_rank(rank);
  s.set_persist_seconds(0.5);
  return s;
}

// A job of `world` ranks that committed `steps`.
std::unique_ptr<Job> JobWithCommitted(uint32_t world, const std::vector<uint64_t>& steps) {
  std::unique_ptr<Job> job = Job::Create("j", world, 100);
  for (uint64_t step : steps) {
    for (uint32_t r = 0; r < world; ++r) job->AddShard(step, ShardOf(r), 0.1, job->incarnation(), kNow);
    job->EndCommit(step);
    job->MarkCommitted(step, 0.1, 0.5);
  }
  return job;
}

TEST(JobTest, AStepCompletesOnceEveryRankReportedAndCommitsOnce) {
  std::unique_ptr<Job> job = Job::Create("j", 2, 100);
  EXPECT_FALSE(job->AddShard(10, ShardOf(0), 0.1, 0, kNow));
  EXPECT_FALSE(job->AddShard(10, ShardOf(0), 0.1, 0, kNow));  // the same rank again
  EXPECT_TRUE(job->AddShard(10, ShardOf(1), 0.3, 0, kNow));
  EXPECT_FALSE(job->AddShard(10, ShardOf(1), 0.3, 0, kNow));  // already committing
  EXPECT_DOUBLE_EQ(job->pending().at(10).max_stall, 0.3);
  // A committing step is not aborted: the commit decides.
  EXPECT_FALSE(job->AbortStep(10, "too late"));
  EXPECT_TRUE(job->pending().contains(10));
  job->EndCommit(10);
  job->MarkCommitted(10, 0.3, 0.5);
  EXPECT_TRUE(job->pending().empty());
  EXPECT_THAT(job->committed(), ElementsAre(10u));
  EXPECT_EQ(job->record().checkpoints_committed(), 1u);
  EXPECT_EQ(job->stalls().size(), 1u);
}

TEST(JobTest, AnAbortedStepIsRememberedAndCounted) {
  std::unique_ptr<Job> job = Job::Create("j", 2, 100);
  job->AddShard(10, ShardOf(0), 0.1, 0, kNow);
  EXPECT_TRUE(job->AbortStep(10, "deadline"));
  EXPECT_TRUE(job->pending().empty());
  ASSERT_TRUE(job->aborted().contains(10));
  EXPECT_EQ(job->aborted().at(10).reason, "deadline");
  EXPECT_EQ(job->record().checkpoints_aborted(), 1u);
}

TEST(JobTest, AnotherWorldSizeOnlyWhenNothingRuns) {
  std::unique_ptr<Job> job = Job::Create("j", 4, 100);
  job->RegisterRank(0, "node-a", 10);
  EXPECT_THAT(job->Resize(8), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("world size 4, not 8")));
  EXPECT_THAT(job->Resize(4), IsOk());
  job->RankGone(0, "node-b");  // not its node
  EXPECT_TRUE(job->AnyRankAlive());
  job->RankGone(0, "node-a");
  EXPECT_THAT(job->Resize(8), IsOk());
  EXPECT_EQ(job->world_size(), 8u);
  EXPECT_TRUE(job->ranks().empty());
}

TEST(JobTest, ARestartCountsOnceAndTheRoundRestoresTheNewestUsableStep) {
  std::unique_ptr<Job> job = JobWithCommitted(2, {10, 20});
  job->Quarantine(20, "damaged");
  ASSERT_TRUE(job->AddManualTarget(150, 100));
  const uint64_t generation = job->schedule().generation();
  EXPECT_TRUE(job->Restart(kNow));
  EXPECT_FALSE(job->Restart(kNow));
  EXPECT_EQ(job->record().failures(), 1u);
  EXPECT_EQ(job->state(), ckptd::v1::JOB_RESTARTING);
  EXPECT_THAT(job->schedule().extra_steps(), IsEmpty());
  EXPECT_GT(job->schedule().generation(), generation);
  EXPECT_TRUE(job->NeedsNewRound(0, /*has_attempt=*/false));
  const uint64_t incarnation = job->incarnation();
  job->StartRestoreRound();
  EXPECT_EQ(job->incarnation(), incarnation + 1);
  EXPECT_EQ(job->state(), ckptd::v1::JOB_RUNNING);
  EXPECT_EQ(job->NotLoaded(0).step(), 10u);
  EXPECT_EQ(job->Loaded(0).verdict(), ckptd::v1::RestorePlanResponse::WAIT);
  EXPECT_EQ(job->Loaded(1).verdict(), ckptd::v1::RestorePlanResponse::GO);
  EXPECT_TRUE(job->NeedsNewRound(0, /*has_attempt=*/false));
  EXPECT_FALSE(job->NeedsNewRound(0, /*has_attempt=*/true));
}

TEST(JobTest, ARecordIsSavedAtOnceAfterADecisionAndTimingsNowAndThen) {
  std::unique_ptr<Job> job = Job::Create("j", 2, 100);
  EXPECT_TRUE(job->RecordToSave(kNow).has_value());  // created
  EXPECT_FALSE(job->RecordToSave(kNow).has_value());
  job->Tick(/*ranks_alive=*/2, /*elapsed=*/1.0);  // GPU time: a timing
  EXPECT_FALSE(job->RecordToSave(kNow + absl::Seconds(1)).has_value());
  std::optional<ckptd::v1::JobRecord> r = job->RecordToSave(kNow + absl::Seconds(10));
  ASSERT_TRUE(r.has_value());
  EXPECT_DOUBLE_EQ(r->gpu_seconds(), 2.0);
}

TEST(RetentionDropsTest, KeepsTheNewestUsableStepsAndEveryQuarantinedOne) {
  std::unique_ptr<Job> job = JobWithCommitted(1, {1, 2, 3, 4, 5});
  job->Quarantine(4, "damaged");
  EXPECT_THAT(RetentionDrops(*job, 2), ElementsAre(1u, 2u));
  // keep_last 0 (or less) still keeps the newest usable step.
  EXPECT_THAT(RetentionDrops(*job, 0), ElementsAre(1u, 2u, 3u));
  EXPECT_THAT(RetentionDrops(*job, 9), IsEmpty());
}

TEST(RetentionDropsTest, AStepBeingVerifiedStaysUntilItsVerificationEnds) {
  std::unique_ptr<Job> job = JobWithCommitted(1, {1, 2, 3});
  job->Pin(1);
  job->Pin(1);
  EXPECT_THAT(RetentionDrops(*job, 1), ElementsAre(2u));
  job->Unpin(1);
  EXPECT_THAT(RetentionDrops(*job, 1), ElementsAre(2u));
  job->Unpin(1);
  EXPECT_THAT(RetentionDrops(*job, 1), ElementsAre(1u, 2u));
}

TEST(TargetsUntilNewRuleTest, KeepsTheOldRulesStepsBeforeTheNewStart) {
  ckptd::v1::Schedule s;
  s.set_every_steps(10);
  s.set_start_step(0);
  s.add_extra_steps(5);   // behind the fastest rank: dropped
  s.add_extra_steps(47);  // ahead: kept
  EXPECT_THAT(TargetsUntilNewRule(s, /*fastest=*/12, /*start=*/45), ElementsAre(47u, 20u, 30u, 40u));
  s.set_every_steps(0);
  EXPECT_THAT(TargetsUntilNewRule(s, 12, 45), ElementsAre(47u));
}

}  // namespace
}  // namespace ckptd::coordinator::internal
