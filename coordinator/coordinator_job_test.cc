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
#include "protocol/schedule.h"

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
  // A memory checkpoint of the four ranks: their slices, which the eight
  // ranks cannot restore from (they read a durable step resharded).
  for (uint32_t r = 0; r < 4; ++r) job->AddMemoryShard(30, r, {100, 7}, 0.1, 0);
  ASSERT_TRUE(job->memory_steps().contains(30));
  // A step two of the four ranks had written when they all went: it can
  // never complete.
  job->AddShard(40, ShardOf(0), 0.1, 0, kNow);
  job->AddShard(40, ShardOf(1), 0.1, 0, kNow);
  ASSERT_TRUE(job->pending().contains(40));
  EXPECT_THAT(job->Resize(8), IsOk());
  EXPECT_EQ(job->world_size(), 8u);
  EXPECT_TRUE(job->ranks().empty());
  EXPECT_TRUE(job->memory_steps().empty());
  EXPECT_TRUE(job->pending().empty());
  ASSERT_TRUE(job->aborted().contains(40));
  EXPECT_THAT(job->aborted().at(40).reason, HasSubstr("8 ranks instead of 4"));
}

// A saved step time (or stall, or persist time) beyond a day, from before
// reports were bounded, would keep every rank's hang limit out of reach.
TEST(JobTest, ARecoveredRecordForgetsTimingsThatAreNoMeasurement) {
  ckptd::v1::JobRecord record;
  record.set_job("j");
  record.set_world_size(2);
  record.set_step_seconds(1e300);
  record.set_stall_seconds(2e5);
  record.set_persist_seconds(3.5);
  std::unique_ptr<Job> job = Job::Recovered(record);
  EXPECT_EQ(job->record().step_seconds(), 0);
  EXPECT_EQ(job->record().stall_seconds(), 0);
  EXPECT_EQ(job->stalls().size(), 0u);
  EXPECT_EQ(job->record().persist_seconds(), 3.5);
  EXPECT_EQ(job->persists().size(), 1u);
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
  EXPECT_THAT(TargetsUntilNewRule(s, /*fastest=*/12, /*start=*/45).durable, ElementsAre(47u, 20u, 30u, 40u));
  EXPECT_THAT(TargetsUntilNewRule(s, 12, 45).memory, ElementsAre());
  s.set_every_steps(0);
  EXPECT_THAT(TargetsUntilNewRule(s, 12, 45).durable, ElementsAre(47u));
}

TEST(TargetsUntilNewRuleTest, KeepsWhetherEachOldStepWasDurableOrInMemory) {
  ckptd::v1::Schedule s;
  s.set_every_steps(10);
  s.set_start_step(0);
  s.set_durable_every(3);  // durable: 0, 30, 60, ...
  s.add_memory_steps(15);  // an older rule's memory checkpoint, still ahead
  s.add_memory_steps(5);   // behind the fastest rank: dropped
  const OneOffTargets t = TargetsUntilNewRule(s, /*fastest=*/12, /*start=*/65);
  EXPECT_THAT(t.durable, ElementsAre(30u, 60u));
  EXPECT_THAT(t.memory, ElementsAre(15u, 20u, 40u, 50u));
}

TEST(DurablePhaseTest, ANewRuleContinuesTheDurableCadence) {
  std::unique_ptr<Job> job = Job::Create("j", 1, 10, 4);
  // Nothing durable yet: the new rule's first step is durable.
  EXPECT_EQ(DurablePhase(*job, {}, 10, 4, 100), 0u);
  // Durable step 90 committed: the next durable one is due at 130, the new
  // rule's count 3 (100, 110, 120, 130): phase 1.
  job->MarkCommitted(90, 0.1, 1);
  EXPECT_EQ(DurablePhase(*job, {}, 10, 4, 100), 1u);
  ckptd::v1::Schedule s;
  s.set_start_step(100);
  s.set_every_steps(10);
  s.set_durable_every(4);
  s.set_durable_phase(1);
  EXPECT_FALSE(protocol::DurableAt(s, 100));
  EXPECT_TRUE(protocol::DurableAt(s, 130));
  EXPECT_TRUE(protocol::DurableAt(s, 170));
  // A durable one-off kept from the old rule counts too; so does a pending step.
  EXPECT_EQ(DurablePhase(*job, OneOffTargets{{95}, {}}, 10, 4, 100), 0u);  // due at 135: count 4
  job->AddShard(120, ckptd::v1::ShardRef(), 0, 0, absl::Now());
  EXPECT_EQ(DurablePhase(*job, {}, 10, 4, 100), (4 - 6 % 4) % 4);  // due at 160: count 6
  // One cadence: no phase.
  EXPECT_EQ(DurablePhase(*job, {}, 10, 1, 100), 0u);
}

TEST(JobMemoryStepsTest, CompleteWhenEveryRankReportedAndForgottenOnceADurableStepIsNewer) {
  std::unique_ptr<Job> job = Job::Create("j", 2, 10, 3);
  EXPECT_FALSE(job->AddMemoryShard(10, 0, {100, 7}, 0.5, 0));
  EXPECT_FALSE(job->CommittedShard(10, 0).has_value());  // not complete yet
  EXPECT_FALSE(job->AddMemoryShard(10, 0, {100, 7}, 0.5, 0));  // repeated
  EXPECT_TRUE(job->AddMemoryShard(10, 1, {200, 9}, 0.7, 0));
  EXPECT_FALSE(job->AddMemoryShard(10, 1, {200, 9}, 0.7, 0));  // after completion
  ASSERT_TRUE(job->CommittedShard(10, 1).has_value());
  EXPECT_EQ(job->CommittedShard(10, 1)->file_length, 200u);
  EXPECT_EQ(job->CommittedShard(10, 1)->index_xxh3, 9u);
  EXPECT_EQ(job->stalls().size(), 1u);  // its stall is measured
  EXPECT_DOUBLE_EQ(job->stalls().Median(), 0.7);
  // An incomplete one before a complete one is of no use any more.
  EXPECT_FALSE(job->AddMemoryShard(15, 0, {1, 1}, 0, 0));
  EXPECT_FALSE(job->AddMemoryShard(20, 0, {1, 1}, 0, 0));
  EXPECT_TRUE(job->AddMemoryShard(20, 1, {1, 1}, 0, 0));
  EXPECT_FALSE(job->memory_steps().contains(15));
  EXPECT_TRUE(job->memory_steps().contains(10));
  // A durable commit at 20 makes both unnecessary; older reports are ignored.
  job->MarkCommitted(20, 0.1, 1);
  EXPECT_TRUE(job->memory_steps().empty());
  EXPECT_FALSE(job->AddMemoryShard(20, 0, {1, 1}, 0, 0));
  EXPECT_TRUE(job->memory_steps().empty());
  // At most kMaxMemorySteps are kept, the oldest dropped first.
  for (uint64_t step = 21; step < 21 + 3 * Job::kMaxMemorySteps; ++step) job->AddMemoryShard(step, 0, {1, 1}, 0, 0);
  EXPECT_EQ(job->memory_steps().size(), Job::kMaxMemorySteps);
  EXPECT_EQ(job->memory_steps().rbegin()->first, 20 + 3 * Job::kMaxMemorySteps);
}

TEST(JobMemoryStepsTest, ARestoreRoundTakesTheMemoryStepItIsGivenAndForgetsNewerOnes) {
  std::unique_ptr<Job> job = Job::Create("j", 1, 10, 3);
  job->MarkCommitted(10, 0.1, 1);
  job->AddMemoryShard(20, 0, {5, 6}, 0, 0);
  job->AddMemoryShard(30, 0, {5, 6}, 0, 0);
  job->Restart(absl::Now());
  job->StartRestoreRound(20);
  ASSERT_TRUE(job->round().has_value());
  EXPECT_EQ(job->round()->step, 20u);
  EXPECT_TRUE(job->round()->memory);
  EXPECT_TRUE(job->Plan().memory_step());
  EXPECT_FALSE(job->memory_steps().contains(30));
  // A failed load falls back to the durable step.
  job->DropMemoryStep(20);
  EXPECT_EQ(job->FallBack().step(), 10u);
  EXPECT_FALSE(job->round()->memory);
  EXPECT_FALSE(job->Plan().memory_step());
  // A memory step older than the durable one is never taken.
  job->Restart(absl::Now());
  job->StartRestoreRound(5);
  EXPECT_EQ(job->round()->step, 10u);
  EXPECT_FALSE(job->round()->memory);
}

}  // namespace
}  // namespace ckptd::coordinator::internal
