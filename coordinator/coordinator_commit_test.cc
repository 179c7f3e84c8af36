// CoordinatorCore: shard reports, the global commit, aborts and retention.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using v1 = ::ckptd::v1::RestorePlanResponse;

TEST_F(CoordinatorCoreTest, StepCommitsOnlyWhenEveryRankReportedItsShard) {
  TwoNodes();
  for (uint32_t r = 0; r < 3; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(auto resp, Shard(r < 2 ? "node-a" : "node-b", 10, r));
    EXPECT_FALSE(resp.committed());
    EXPECT_FALSE(Exists(storage::ManifestPath(kRoot, kJob, 10)));
  }
  EXPECT_THAT(JobState().pending_steps(), ElementsAre(10u));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto resp, Shard("node-b", 10, 3));
  EXPECT_TRUE(resp.committed());
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 10)));
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::StepManifest m, store_.ReadManifest(kJob, 10));
  EXPECT_EQ(m.world_size(), 4u);
  ASSERT_EQ(m.shards_size(), 4);
  EXPECT_DOUBLE_EQ(m.shards(2).persist_seconds(), 0.25);
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::StepVerifyReport verify, store_.VerifyStep(kJob, 10));
  EXPECT_TRUE(verify.ok());
  ckptd::v1::JobStatus s = JobState();
  EXPECT_TRUE(s.has_committed());
  EXPECT_EQ(s.newest_committed_step(), 10u);
  EXPECT_EQ(s.checkpoints_committed(), 1u);
  EXPECT_TRUE(s.pending_steps().empty());
  // A repeated report of a committed step is answered, not re-committed.
  CKPTD_ASSERT_OK_AND_ASSIGN(auto again, Shard("node-a", 10, 0));
  EXPECT_TRUE(again.committed());
  EXPECT_EQ(core_->Counters().committed, 1u);
}

TEST_F(CoordinatorCoreTest, AnAgentReportsItsRanksInOneBatchAndABadEntryFailsAlone) {
  TwoNodes();
  ckptd::v1::ReportShardRequest a;
  a.set_node_id("node-a");
  a.set_session(sessions_["node-a"]);
  for (uint32_t r : {0u, 1u}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(*a.add_batch(), Write(10, r));
  }
  ckptd::v1::ShardReport bad = a.batch(0);
  bad.mutable_shard()->set_rank(9);
  *a.add_batch() = bad;
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ReportShardResponse ra, core_->ReportShard(a));
  ASSERT_EQ(ra.batch_results_size(), 3);
  EXPECT_EQ(ra.batch_results(0).code(), 0);
  EXPECT_FALSE(ra.batch_results(1).committed());
  EXPECT_EQ(ra.batch_results(2).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ra.batch_results(2).message(), HasSubstr("rank 9"));
  ckptd::v1::ReportShardRequest b;
  b.set_node_id("node-b");
  b.set_session(sessions_["node-b"]);
  for (uint32_t r : {2u, 3u}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(*b.add_batch(), Write(10, r));
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ReportShardResponse rb, core_->ReportShard(b));
  ASSERT_EQ(rb.batch_results_size(), 2);
  EXPECT_TRUE(rb.batch_results(0).committed());
  EXPECT_TRUE(rb.batch_results(1).committed());
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 10)));
  ckptd::v1::ReportShardRequest empty;
  empty.set_node_id("node-b");
  empty.set_session(sessions_["node-b"]);
  EXPECT_THAT(core_->ReportShard(empty), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no shard")));
}

// A rank cannot have been told of a restore round that has not happened: a
// report of a later incarnation than the job's (UINT64_MAX) is refused and
// changes nothing, and the other ranks' reports still commit the step.
TEST_F(CoordinatorCoreTest, AReportOfAnIncarnationTheJobHasNotReachedIsRefused) {
  TwoNodes();
  CommitStep(10);
  const uint64_t inc = RestoreAll(10);
  EXPECT_THAT(Shard("node-a", 20, 0, 4, UINT64_MAX),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("incarnation 18446744073709551615 is out of range (at most 4294967296)")));
  EXPECT_THAT(Shard("node-a", 20, 0, 4, inc + 1),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(absl::StrCat("reported for incarnation ", inc + 1, ", but job llm-7b is at incarnation ",
                                                 inc))));
  EXPECT_EQ(JobState().schedule().incarnation(), inc);
  EXPECT_TRUE(JobState().pending_steps().empty());
  CommitStep(20, inc);
  EXPECT_EQ(JobState().newest_committed_step(), 20u);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<ckptd::v1::JobRecord> saved, state_->ListJobs());
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(saved[0].schedule().incarnation(), inc);
}

// A coordinator that lost its database learns the job's incarnation from
// its ranks' reports (within kMaxIncarnation), until it opens a restore
// round of its own; a report from before that round is then stale.
TEST_F(CoordinatorCoreTest, ACoordinatorThatLostItsDatabaseTakesTheRanksIncarnation) {
  TwoNodes();
  CommitStep(10);
  RestoreAll(10);
  CKPTD_ASSERT_OK(ReportFailure("node-b", 3, ckptd::v1::TRAINER_DIED));
  const uint64_t inc = RestoreAll(10);
  ASSERT_EQ(inc, 2u);
  state_ = NewMemStateStore();
  Reset();
  TwoNodes();
  ASSERT_EQ(JobState().schedule().incarnation(), 0u);
  EXPECT_THAT(Shard("node-a", 20, 0, 4, UINT64_MAX), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
  CommitStep(20, inc);
  EXPECT_EQ(JobState().schedule().incarnation(), inc);
  CKPTD_ASSERT_OK(ReportFailure("node-b", 3, ckptd::v1::TRAINER_DIED));
  EXPECT_EQ(RestoreAll(20), inc + 1);
  EXPECT_THAT(Shard("node-a", 30, 0, 4, inc), StatusIs(absl::StatusCode::kAborted, HasSubstr("latest restore")));
  EXPECT_THAT(Shard("node-a", 30, 0, 4, inc + 2), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                           HasSubstr("no rank was told of a later restore round")));
  CommitStep(30, inc + 1);
  EXPECT_EQ(JobState().newest_committed_step(), 30u);
}

// A saved record whose incarnation no job reaches (written before reports
// were bounded) is not used: the job is found again from storage and takes
// its ranks' count from their reports.
TEST_F(CoordinatorCoreTest, ASavedRecordOfAnImpossibleIncarnationIsNotUsed) {
  TwoNodes();
  CommitStep(10);
  const uint64_t inc = RestoreAll(10);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<ckptd::v1::JobRecord> saved, state_->ListJobs());
  ASSERT_EQ(saved.size(), 1u);
  ckptd::v1::JobRecord poisoned = saved[0];
  poisoned.mutable_schedule()->set_incarnation(UINT64_MAX);
  CKPTD_ASSERT_OK(state_->PutJob(poisoned));
  Reset();
  EXPECT_EQ(JobState().schedule().incarnation(), 0u);
  EXPECT_EQ(JobState().newest_committed_step(), 10u);
  TwoNodes();
  CommitStep(20, inc);
  EXPECT_EQ(JobState().schedule().incarnation(), inc);
}

TEST_F(CoordinatorCoreTest, ShardWhoseFileDisagreesWithTheReportAbortsTheStep) {
  TwoNodes();
  for (uint32_t r = 0; r < 3; ++r) CKPTD_ASSERT_OK(Shard(r < 2 ? "node-a" : "node-b", 10, r).status());
  CKPTD_ASSERT_OK(store_.PrepareStep(kJob, 10));
  // Rank 3 claims a shard that is not on disk: the report is refused, naming
  // the rank, and the step is aborted at once rather than at its deadline.
  EXPECT_THAT(ReportOnly("node-b", 10, 3, 8192, 42),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("rank 3 has no durable shard"), HasSubstr("aborted"))));
  EXPECT_FALSE(Exists(storage::ManifestPath(kRoot, kJob, 10)));
  EXPECT_FALSE(Exists(storage::StepDir(kRoot, kJob, 10)));
  EXPECT_EQ(JobState().checkpoints_aborted(), 1u);
  EXPECT_THAT(Shard("node-a", 10, 0), StatusIs(absl::StatusCode::kAborted, HasSubstr("aborted")));
}

TEST_F(CoordinatorCoreTest, RetentionKeepsTheNewestStepsAndQuarantinedOnes) {
  options_.keep_last = 2;
  Reset();
  TwoNodes();
  CommitStep(10);
  CommitStep(20);
  // Quarantine 20 through a failed restore.
  for (uint32_t r = 0; r < 4; ++r) CKPTD_ASSERT_OK(Plan(r).status());
  CKPTD_ASSERT_OK(Plan(0, 20, false).status());
  uint64_t inc = 0;
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(r, 10, true));
    inc = p.incarnation();
  }
  CommitStep(30, inc);
  CommitStep(40, inc);
  // Retention is not on the commit's path: the next tick removes the files.
  EXPECT_EQ(JobState().newest_committed_step(), 40u);
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 10)));
  core_->Tick();
  EXPECT_FALSE(Exists(storage::ManifestPath(kRoot, kJob, 10)));
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 20)));  // quarantined: kept
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 30)));
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 40)));
}

// A coordinator stopping while retention has a backlog (a leader that took
// over from one that fell behind) waits for one step's removal, not all.
TEST_F(CoordinatorCoreTest, RetentionStopsBetweenStepsWhenAskedAndKeepsTheRestQueued) {
  options_.keep_last = 1;
  options_.retention_in_tick = false;
  Reset();
  TwoNodes();
  for (uint64_t step : {10, 20, 30, 40}) CommitStep(step);
  int asked = 0;
  core_->RunRetention([&asked] { return ++asked > 1; });
  EXPECT_EQ(asked, 2);
  EXPECT_FALSE(Exists(storage::StepDir(kRoot, kJob, 10)));
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 20)));
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 30)));
  core_->RunRetention();  // the rest, at the next run
  EXPECT_FALSE(Exists(storage::StepDir(kRoot, kJob, 20)));
  EXPECT_FALSE(Exists(storage::StepDir(kRoot, kJob, 30)));
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 40)));
}

TEST_F(CoordinatorCoreTest, StepPastItsDeadlineIsAborted) {
  options_.step_deadline = absl::Minutes(5);
  options_.node_lost_after = absl::Hours(1);
  Reset();
  TwoNodes();
  CKPTD_ASSERT_OK(Shard("node-a", 10, 0).status());
  clock_.Advance(absl::Minutes(4));
  core_->Tick();
  EXPECT_THAT(JobState().pending_steps(), ElementsAre(10u));
  clock_.Advance(absl::Minutes(2));
  core_->Tick();
  EXPECT_TRUE(JobState().pending_steps().empty());
  EXPECT_EQ(JobState().checkpoints_aborted(), 1u);
  EXPECT_FALSE(Exists(storage::StepDir(kRoot, kJob, 10)));
}

TEST_F(CoordinatorCoreTest, PersistFailureAbortsTheStep) {
  TwoNodes();
  CKPTD_ASSERT_OK(Shard("node-a", 10, 0).status());
  CKPTD_ASSERT_OK(ReportFailure("node-b", 2, ckptd::v1::PERSIST_FAILED, 10, "No space left on device"));
  EXPECT_TRUE(JobState().pending_steps().empty());
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RUNNING);  // training goes on
  EXPECT_THAT(Shard("node-a", 10, 1), StatusIs(absl::StatusCode::kAborted, HasSubstr("aborted")));
}


// Replicated leaders: the commit intent, written (guarded by the leadership)
// before the MANIFEST, and what a leader that takes over makes of it.
class CommitIntentTest : public CoordinatorCoreTest {
 protected:
  CommitIntentTest() {
    // Leads until an intent for step `deposed_after_` (0: none) is recorded:
    // paused past its lease right after etcd answered.
    options_.may_write = [this]() -> absl::Status {
      if (deposed_after_ == 0) return absl::OkStatus();
      absl::StatusOr<std::vector<ckptd::v1::CommitIntent>> got = state_->ListCommitIntents();
      for (const ckptd::v1::CommitIntent& c : got.value_or(std::vector<ckptd::v1::CommitIntent>{})) {
        if (c.step() == deposed_after_) return absl::FailedPreconditionError("deposed in the test");
      }
      return absl::OkStatus();
    };
    Reset();
  }
  std::vector<ckptd::v1::CommitIntent> Intents() {
    absl::StatusOr<std::vector<ckptd::v1::CommitIntent>> got = state_->ListCommitIntents();
    Check(got.status(), "ListCommitIntents");
    return got.value_or(std::vector<ckptd::v1::CommitIntent>{});
  }
  // Ranks 0..3 report `step`; the last report's answer.
  absl::StatusOr<ckptd::v1::ReportShardResponse> ReportAll(uint64_t step) {
    absl::StatusOr<ckptd::v1::ReportShardResponse> last;
    for (uint32_t r = 0; r < 4; ++r) last = Shard(r < 2 ? "node-a" : "node-b", step, r);
    return last;
  }
  uint64_t deposed_after_ = 0;
};

TEST_F(CommitIntentTest, EachCommitRecordsItsIntentFirst) {
  TwoNodes();
  CommitStep(10);
  ASSERT_THAT(Intents(), ElementsAre(::testing::Property(&ckptd::v1::CommitIntent::step, 10u)));
  EXPECT_EQ(Intents()[0].job(), kJob);
  EXPECT_EQ(Intents()[0].world_size(), 4u);
  CommitStep(20);  // one per job: the next replaces it
  EXPECT_THAT(Intents(), ElementsAre(::testing::Property(&ckptd::v1::CommitIntent::step, 20u)));
}

TEST_F(CommitIntentTest, ALeaderDeposedAfterItsIntentWritesNoManifestAndRemovesNothing) {
  deposed_after_ = 20;
  TwoNodes();
  CommitStep(10);
  for (uint32_t r = 0; r < 3; ++r) CKPTD_ASSERT_OK(Shard(r < 2 ? "node-a" : "node-b", 20, r).status());
  // The last report: Apply's check and the commit's first pass; the check
  // after the intent fails (paused past the lease after etcd answered).
  absl::StatusOr<ckptd::v1::ReportShardResponse> last = Shard("node-b", 20, 3);
  EXPECT_FALSE(last.ok() && last->committed());
  EXPECT_THAT(Intents(), ElementsAre(::testing::Property(&ckptd::v1::CommitIntent::step, 20u)));
  EXPECT_FALSE(Exists(storage::ManifestPath(kRoot, kJob, 20)));
  // Its files stay for the leader that takes over.
  for (uint32_t r = 0; r < 4; ++r) EXPECT_TRUE(Exists(storage::ShardPath(kRoot, kJob, 20, r))) << r;
}

TEST_F(CommitIntentTest, ALeaderThatTakesOverKeepsTheFilesOfAStepAnotherMayStillCommit) {
  deposed_after_ = 20;
  TwoNodes();
  CommitStep(10);
  // The old leader recorded its intent to commit step 20 and was paused
  // before the MANIFEST; every shard of 20 is durable.
  std::vector<ckptd::v1::ShardRef> shards;
  std::vector<ckptd::v1::ShardReport> reports;
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ShardReport report, Write(20, r));
    shards.push_back(report.shard());
    reports.push_back(report);
    absl::StatusOr<ckptd::v1::ReportShardResponse> resp =
        core_->ReportShard(ShardRequest(r < 2 ? "node-a" : "node-b", report));
    if (r < 3) {
      CKPTD_ASSERT_OK(resp.status());
    }
  }
  ASSERT_FALSE(Exists(storage::ManifestPath(kRoot, kJob, 20)));

  deposed_after_ = 0;
  Reset();  // a new leader
  TwoNodes();
  CommitStep(30);  // the job went on: step 30 commits first
  // A late report of 20 is older than committed 30: not committed here, and
  // (the intent) not removed either.
  EXPECT_THAT(core_->ReportShard(ShardRequest("node-a", reports[0])),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("older than")));
  for (uint32_t r = 0; r < 4; ++r) EXPECT_TRUE(Exists(storage::ShardPath(kRoot, kJob, 20, r))) << r;
  // So the MANIFEST the old leader writes when it resumes names files that
  // exist: an intact older step, not a broken one.
  CKPTD_ASSERT_OK(store_.CommitStep(kJob, 20, 4, &shards).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::StepVerifyReport verify, store_.VerifyStep(kJob, 20));
  EXPECT_TRUE(verify.ok());

  // Without an intent, a step older than the committed one is removed.
  EXPECT_THAT(Shard("node-a", 25, 0), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("older than")));
  EXPECT_FALSE(Exists(storage::ShardPath(kRoot, kJob, 25, 0)));
}

TEST_F(CommitIntentTest, ALeaderThatTakesOverCommitsTheStepWhenItsReportsComeAgain) {
  deposed_after_ = 20;
  TwoNodes();
  CommitStep(10);
  for (uint32_t r = 0; r < 3; ++r) CKPTD_ASSERT_OK(Shard(r < 2 ? "node-a" : "node-b", 20, r).status());
  (void)Shard("node-b", 20, 3);
  deposed_after_ = 0;
  Reset();
  TwoNodes();
  // The agents send their reports of 20 again to the new leader.
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ReportShardResponse last, ReportAll(20));
  EXPECT_TRUE(last.committed());
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 20)));
  EXPECT_EQ(JobState().newest_committed_step(), 20u);
}

}  // namespace
}  // namespace ckptd::coordinator
