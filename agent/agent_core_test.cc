#include "agent/agent_core.h"

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/testing_agent_harness.h"
#include "base/clock.h"
#include "base/testing/capturing_logger.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/fault_injection_file_system.h"
#include "storage/layout.h"
#include "storage/mem_file_system.h"

namespace ckptd::agent {
namespace {

using ::ckptd::testing::Eventually;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::_;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Optional;

class AgentCoreTest : public ::testing::Test {
 protected:
  AgentCoreTest() { EXPECT_THAT(mem_.CreateDir("/ckpt"), IsOk()); }

  // Fills every buffer of `slot` with a pattern of `step`, as a trainer would.
  static void Fill(staging::StagingSegment& seg, const TrainerHandle& h, uint32_t slot, uint64_t step) {
    std::memset(seg.slot_data(slot), static_cast<int>(step & 0xff), h.slot_bytes);
  }

  storage::MemFileSystem mem_;
  AgentOptions options_ = TestAgentOptions("agent");
};

TEST_F(AgentCoreTest, SnapshotPersistsCommitsAndRestoresAllFiveComponents) {
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  EXPECT_EQ(h.offsets.size(), 5u);
  EXPECT_EQ(h.slots, 2u);

  // Nothing committed yet.
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult none, agent.Restore(h.trainer_id, absl::ZeroDuration()));
  EXPECT_EQ(none.step, std::nullopt);

  for (uint64_t step : {10u, 20u, 30u}) ASSERT_NO_FATAL_FAILURE(Snapshot(agent, *seg, h, step));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.WaitPersisted(h.trainer_id, 30, absl::Seconds(30)));
  EXPECT_THAT(st.last_persisted_step, Optional(30u));
  EXPECT_THAT(st.last_committed_step, Optional(30u));
  EXPECT_EQ(st.failed, 0u);
  EXPECT_EQ(seg->pinned_step(), std::optional<uint64_t>(30));  // kept in memory last

  // Retention kept two; the newest is committed and restorable.
  storage::CheckpointStore store(&mem_, "/ckpt");
  CKPTD_ASSERT_OK_AND_ASSIGN(auto steps, store.ListSteps("job"));
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[1].step, 30u);
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(30u));
  EXPECT_EQ(seg->state(r.slot), staging::SlotState::kRestored);
  for (size_t i = 0; i < h.offsets.size(); ++i) {
    EXPECT_EQ(seg->slot_data(r.slot)[h.offsets[i]], 30) << i;
  }
  CKPTD_ASSERT_OK(seg->Release(r.slot));
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_F(AgentCoreTest, PublishedSnapshotIsPersistedAfterTheTrainerDies) {
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t ready, seg->AcquireForFill(absl::ZeroDuration()));
  Fill(*seg, h, ready, 5);
  CKPTD_ASSERT_OK(seg->Publish(ready, 5));  // published, never notified
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t half, seg->AcquireForFill(absl::ZeroDuration()));
  (void)half;  // the trainer died mid-copy
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
  storage::CheckpointStore store(&mem_, "/ckpt");
  EXPECT_THAT(store.LatestCommittedStep("job"), ::ckptd::testing::IsOkAndHolds(Optional(5u)));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto steps, store.ListSteps("job"));
  EXPECT_EQ(steps.size(), 1u);  // the half-made copy was never persisted
}

TEST_F(AgentCoreTest, RestoreNamesTheBufferThatDoesNotMatch) {
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::ZeroDuration()));
  CKPTD_ASSERT_OK(seg->Publish(slot, 1));
  CKPTD_ASSERT_OK(agent.SnapshotPublished(h.trainer_id, slot, 1));
  CKPTD_ASSERT_OK(agent.WaitPersisted(h.trainer_id, 1, absl::Seconds(30)).status());

  TrainerRegistration bigger = FiveComponents("job");
  bigger.buffers[2] = Buffer("adam", ckptd::v1::OPTIMIZER, ckptd::v1::FLOAT32, 6001);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h2, agent.Register(bigger));
  EXPECT_THAT(agent.Restore(h2.trainer_id, absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("buffer 'adam'")));

  TrainerRegistration reshaped = FiveComponents("job");
  reshaped.buffers[0].clear_shape();
  reshaped.buffers[0].add_shape(1000);
  reshaped.buffers[0].add_shape(3);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h5, agent.Register(reshaped));
  EXPECT_THAT(agent.Restore(h5.trainer_id, absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("buffer 'params' is registered with shape [1000, 3] but step 1 holds shape [3000]")));

  TrainerRegistration renamed = FiveComponents("job");
  renamed.buffers[3].set_name("rng.cpu");
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h3, agent.Register(renamed));
  EXPECT_THAT(agent.Restore(h3.trainer_id, absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("buffer 'rng.cpu' is not in the checkpoint")));

  TrainerRegistration fewer = FiveComponents("job");
  fewer.buffers.pop_back();
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h4, agent.Register(fewer));
  EXPECT_THAT(agent.Restore(h4.trainer_id, absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("'cursor' that is not registered")));
}

// The coordinator's heartbeat answers move the pin only for the jobs the
// heartbeat listed (those it has a schedule for), and an answer of a
// coordinator that does not know the agent moves nothing.
TEST_F(AgentCoreTest, HeartbeatAnswersPinOnlyTheJobsTheyCoverAndOnlyWhenTheyKnowTheAgent) {
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *seg, h, 10));
  ASSERT_EQ(seg->pinned_step(), std::optional<uint64_t>(10));
  auto answer = [](bool known, bool lists_job, std::optional<uint64_t> step) {
    ckptd::v1::HeartbeatAck ack;
    ack.set_known(known);
    if (lists_job) ack.add_schedules()->set_job("job");
    ack.add_schedules()->set_job("other");
    if (step) {
      ckptd::v1::CommittedStep* c = ack.add_committed();
      c->set_job("job");
      c->set_step(*step);
    }
    return ack;
  };
  agent.OnCommittedSteps(answer(false, false, std::nullopt));  // a coordinator that restarted
  EXPECT_EQ(seg->pinned_step(), std::optional<uint64_t>(10));
  agent.OnCommittedSteps(answer(true, false, std::nullopt));  // sent before the job registered
  EXPECT_EQ(seg->pinned_step(), std::optional<uint64_t>(10));
  agent.OnCommittedSteps(answer(true, true, 20));
  EXPECT_EQ(seg->pinned_step(), std::optional<uint64_t>(20));
  agent.OnCommittedSteps(answer(true, true, std::nullopt));  // the job has no step to restore
  EXPECT_EQ(seg->pinned_step(), std::nullopt);
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_F(AgentCoreTest, DamagedNewestStepFallsBackToThePreviousOne) {
  options_.keep_in_memory = false;  // the damage is on disk
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  for (uint64_t step : {1u, 2u}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *seg, h, step));
  // Flip a byte in the first chunk of step 2's shard.
  const std::string path = storage::ShardPath("/ckpt", "job", 2, 0);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string bytes, storage::ReadFileToString(&mem_, path));
  bytes[4096 + 10] ^= 0x40;
  CKPTD_ASSERT_OK(mem_.SetFileContents(path, bytes));
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(1u));
  EXPECT_EQ(seg->slot_data(r.slot)[0], 1);
  // The job goes on from step 1: that is what a restart restores now, and
  // what the staging keeps last, not step 2.
  EXPECT_EQ(seg->pinned_step(), std::optional<uint64_t>(1));
  EXPECT_THAT(agent.Status(h.trainer_id),
              ::ckptd::testing::IsOkAndHolds(::testing::Field(&PersistStatus::last_committed_step, Optional(1u))));
  // The agent commits this job alone: it marks step 2, kept but never restored.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string mark,
                             storage::ReadFileToString(&mem_, storage::QuarantinePath("/ckpt", "job", 2)));
  EXPECT_THAT(mark, HasSubstr("rank 0"));
  CKPTD_ASSERT_OK(seg->Release(r.slot));
  CKPTD_ASSERT_OK(mem_.SetFileContents(path, std::string(bytes.size(), '\0')));  // even worse now: not read again
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult again, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(again.step, Optional(1u));
}

// A shard file that is intact but not the one the step committed (another
// attempt at the step renamed over it, or another step's or rank's copied
// there) passes its own block checks: the MANIFEST's digest of its index
// tells it apart, and the restore falls back as for a damaged one.
TEST_F(AgentCoreTest, AnIntactShardThatIsNotTheCommittedOneIsNotRestored) {
  options_.keep_in_memory = false;  // read from the storage root
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  for (uint64_t step : {1u, 2u}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *seg, h, step));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string older,
                             storage::ReadFileToString(&mem_, storage::ShardPath("/ckpt", "job", 1, 0)));
  CKPTD_ASSERT_OK(mem_.SetFileContents(storage::ShardPath("/ckpt", "job", 2, 0), older));
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(1u));
  EXPECT_EQ(seg->slot_data(r.slot)[0], 1);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string mark,
                             storage::ReadFileToString(&mem_, storage::QuarantinePath("/ckpt", "job", 2)));
  EXPECT_THAT(mark, HasSubstr("does not match the MANIFEST"));
  CKPTD_ASSERT_OK(seg->Release(r.slot));
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_F(AgentCoreTest, AFreshStartOverDamagedStepsWaitsForTheOperator) {
  options_.keep_in_memory = false;  // the damage is on disk
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *seg, h, 1));
  const std::string path = storage::ShardPath("/ckpt", "job", 1, 0);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string bytes, storage::ReadFileToString(&mem_, path));
  bytes[4096 + 10] ^= 0x40;
  CKPTD_ASSERT_OK(mem_.SetFileContents(path, bytes));
  // The first restart finds the damage; the next ones find nothing intact.
  // Neither starts from scratch on its own.
  EXPECT_THAT(agent.Restore(h.trainer_id, absl::Seconds(10)), StatusIs(absl::StatusCode::kDataLoss, _));
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(agent.Restore(h.trainer_id, absl::Seconds(10)),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("none intact"), HasSubstr("ckptctl start-fresh --root /ckpt --job job"))));
  }
  storage::CheckpointStore store(&mem_, "/ckpt");
  CKPTD_ASSERT_OK(store.AllowFreshStart("job", "test").status());
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult fresh, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_EQ(fresh.step, std::nullopt);
  // Nothing to restore: nothing kept last.
  EXPECT_EQ(seg->pinned_step(), std::nullopt);
  EXPECT_THAT(agent.Status(h.trainer_id), ::ckptd::testing::IsOkAndHolds(::testing::Field(
                                              &PersistStatus::last_committed_step, std::optional<uint64_t>())));
  // A step committed after the choice is not covered by it.
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *seg, h, 2));
  CKPTD_ASSERT_OK(store.QuarantineStep("job", 2, "checksum mismatch"));
  EXPECT_THAT(agent.Restore(h.trainer_id, absl::Seconds(10)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("none intact")));
}

TEST_F(AgentCoreTest, SkippedSnapshotsAreCountedInTheStatus) {
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus before, agent.Status(h.trainer_id));
  EXPECT_EQ(before.skipped, 0u);
  EXPECT_EQ(before.last_skipped_step, std::nullopt);
  EXPECT_EQ(before.last_skip_reason, "");

  CKPTD_ASSERT_OK(agent.SnapshotSkipped(h.trainer_id, 10, "no free staging slot"));
  CKPTD_ASSERT_OK(agent.SnapshotSkipped(h.trainer_id, 20, "second hop still in flight"));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(h.trainer_id));
  EXPECT_EQ(st.skipped, 2u);
  EXPECT_THAT(st.last_skipped_step, Optional(20u));
  EXPECT_EQ(st.last_skip_reason, "second hop still in flight");
  // A skip is not a failure: persist counters are untouched.
  EXPECT_EQ(st.failed, 0u);
  EXPECT_EQ(st.persisted, 0u);

  // A long reason is cut on a character boundary ("é" is two bytes).
  std::string reason(AgentCore::kMaxSkipReasonBytes - 1, 'x');
  reason += "\xc3\xa9tail";
  CKPTD_ASSERT_OK(agent.SnapshotSkipped(h.trainer_id, 30, reason));
  CKPTD_ASSERT_OK_AND_ASSIGN(st, agent.Status(h.trainer_id));
  EXPECT_EQ(st.skipped, 3u);
  EXPECT_EQ(st.last_skip_reason, std::string(AgentCore::kMaxSkipReasonBytes - 1, 'x'));

  EXPECT_THAT(agent.SnapshotSkipped(h.trainer_id + 100, 1, "x"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no trainer")));
}

TEST_F(AgentCoreTest, FindTrainerByJobAndRank) {
  AgentCore agent(&mem_, options_);
  EXPECT_EQ(agent.FindTrainer("job", 0), std::nullopt);
  TrainerRegistration r = FiveComponents("job");
  r.pid = 4242;
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(r));
  std::optional<TrainerInfo> info = agent.FindTrainer("job", 0);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->pid, 4242);
  EXPECT_EQ(info->step, 0u);
  ckptd::v1::SyncScheduleRequest sync;
  sync.set_trainer_id(h.trainer_id);
  sync.set_step(17);
  CKPTD_ASSERT_OK(agent.SyncSchedule(sync).status());
  info = agent.FindTrainer("job", 0);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->step, 17u);
  EXPECT_EQ(agent.FindTrainer("job", 1), std::nullopt);
  EXPECT_EQ(agent.FindTrainer("other", 0), std::nullopt);
  // Every trainer of the node, the newest registration per rank.
  TrainerRegistration again = FiveComponents("job");
  again.pid = 4343;
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h2, agent.Register(again));
  TrainerRegistration other = FiveComponents("other");
  other.pid = 5000;
  other.rank = 3;
  other.world_size = 4;
  CKPTD_ASSERT_OK(agent.Register(other).status());
  std::vector<TrainerInfo> all = agent.Trainers();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].job, "job");
  EXPECT_EQ(all[0].pid, 4343);
  EXPECT_EQ(all[1].job, "other");
  EXPECT_EQ(all[1].rank, 3u);
  EXPECT_EQ(all[1].pid, 5000);
  CKPTD_ASSERT_OK(agent.TrainerExited(h2.trainer_id));
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
  EXPECT_EQ(agent.FindTrainer("job", 0), std::nullopt);
}

TEST_F(AgentCoreTest, AnAgentAfterARestartDoesNotKnowTheTrainerIdsOfTheOneBefore) {
  uint64_t old_id = 0;
  {
    AgentCore before(&mem_, options_);
    CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, before.Register(FiveComponents("job")));
    old_id = h.trainer_id;
  }
  AgentCore after(&mem_, options_);
  for (const char* job : {"job", "j1", "j2", "j3"}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, after.Register(FiveComponents(job)));
    EXPECT_NE(h.trainer_id, old_id) << job;
    EXPECT_NE(h.trainer_id, 0u) << job;
  }
  EXPECT_THAT(after.Status(old_id), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no trainer")));
}

TEST_F(AgentCoreTest, RegistrationErrorsNameTheProblem) {
  AgentCore agent(&mem_, options_);
  TrainerRegistration r = FiveComponents("../etc");
  EXPECT_THAT(agent.Register(r), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name")));
  r = FiveComponents("job");
  r.buffers.push_back(r.buffers[0]);
  EXPECT_THAT(agent.Register(r), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'params' is registered twice")));
  r = FiveComponents("job");
  r.rank = 3;
  EXPECT_THAT(agent.Register(r), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world size")));
  AgentOptions tiny = options_;
  tiny.staging_budget_bytes = 4096;
  AgentCore small(&mem_, tiny);
  EXPECT_THAT(small.Register(FiveComponents("job")),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("staging budget")));
}

TEST_F(AgentCoreTest, APublishedSnapshotIsFoundByThePersistersPollWithoutANotification) {
  base::FakeClock clock;
  options_.clock = &clock;
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  // The persister waits for a notification, or 100 ms of the agent's clock.
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 1; }));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::ZeroDuration()));
  Fill(*seg, h, slot, 4);
  CKPTD_ASSERT_OK(seg->Publish(slot, 4));  // the trainer dies before it can notify
  clock.Advance(absl::Milliseconds(99));
  EXPECT_EQ(clock.waiters(), 1);  // saw the time and waits on: nothing taken yet
  EXPECT_EQ(seg->state(slot), staging::SlotState::kReady);
  clock.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(Eventually([&] {
    absl::StatusOr<PersistStatus> st = agent.Status(h.trainer_id);
    return st.ok() && st->last_committed_step == std::optional<uint64_t>(4);
  }));
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_F(AgentCoreTest, WaitPersistedGivesUpAfterItsTimeoutOnTheAgentsClock) {
  base::FakeClock clock;
  options_.clock = &clock;
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  BackgroundCall<absl::StatusOr<PersistStatus>> wait(
      &clock, [&] { return agent.WaitPersisted(h.trainer_id, 5, absl::Seconds(10)); });
  // The persister and WaitPersisted wait on the clock.
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 2; }));
  clock.Advance(absl::Seconds(9));
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 2; }));
  EXPECT_FALSE(wait.done());
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] { return wait.done(); }));
  EXPECT_THAT(wait.result(), StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("not persisted within 10s")));
}

TEST_F(AgentCoreTest, PersistSecondsAreMeasuredOnTheAgentsClock) {
  // The agent's clock stands still: the persist took no time by it.
  base::FakeClock clock;
  options_.clock = &clock;
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::ZeroDuration()));
  CKPTD_ASSERT_OK(seg->Publish(slot, 1));
  CKPTD_ASSERT_OK(agent.SnapshotPublished(h.trainer_id, slot, 1));
  CKPTD_ASSERT_OK(agent.WaitPersisted(h.trainer_id, 1, absl::Seconds(30)).status());
  ckptd::v1::Heartbeat hb;
  agent.FillHeartbeat(&hb);
  ASSERT_EQ(hb.progress_size(), 1);
  EXPECT_EQ(hb.progress(0).persist_seconds(), 0.0);
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_F(AgentCoreTest, AHeartbeatNamesEachRankOnceByItsNewestRegistration) {
  // A new process of rank 0 registers before the old one's exit is known
  // (it is still winding down): the coordinator hears of the new one only,
  // not of two processes of one rank, which it would take for a restart
  // every time.
  AgentCore agent(&mem_, options_);
  TrainerRegistration old_reg = FiveComponents("job");
  old_reg.pid = 100;
  TrainerRegistration new_reg = old_reg;
  new_reg.pid = 200;
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle old_h, agent.Register(old_reg));
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle new_h, agent.Register(new_reg));
  ckptd::v1::Heartbeat hb;
  agent.FillHeartbeat(&hb);
  ASSERT_EQ(hb.ranks_size(), 1);
  EXPECT_EQ(hb.ranks(0).pid(), 200);
  ASSERT_EQ(hb.progress_size(), 1);
  // Once the newer one is gone too, the older one (if it still runs) is
  // the rank's process again.
  CKPTD_ASSERT_OK(agent.TrainerExited(new_h.trainer_id));
  hb.Clear();
  agent.FillHeartbeat(&hb);
  ASSERT_EQ(hb.ranks_size(), 1);
  EXPECT_EQ(hb.ranks(0).pid(), 100);
  CKPTD_ASSERT_OK(agent.TrainerExited(old_h.trainer_id));
}

class LocalTierTest : public AgentCoreTest {
 protected:
  LocalTierTest() {
    EXPECT_THAT(mem_.CreateDir("/nvme"), IsOk());
    options_.local_cache = "/nvme";
    options_.keep_in_memory = false;  // these restores read the disk tiers
  }
  std::vector<uint64_t> LocalSteps(const std::string& job) {
    std::vector<uint64_t> out;
    absl::StatusOr<std::vector<storage::FileInfo>> entries = mem_.ListDir(storage::JobDir("/nvme", job));
    if (!entries.ok()) return out;
    for (const storage::FileInfo& e : *entries) {
      if (std::optional<uint64_t> s = storage::ParseStepDirName(e.name)) out.push_back(*s);
    }
    return out;
  }
};

TEST_F(LocalTierTest, WritesLocallyCopiesToTheRootAndRestoresFromTheLocalCopy) {
  ckptd::testing::CapturingLogger logger;
  options_.logger = &logger;
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  for (uint64_t step : {10u, 20u, 30u}) SnapshotAndWait(agent, *seg, h, step);
  // The storage root has the committed steps, byte for byte the local copies.
  storage::CheckpointStore store(&mem_, "/ckpt");
  EXPECT_THAT(store.LatestCommittedStep("job"), ::ckptd::testing::IsOkAndHolds(Optional(30u)));
  for (uint64_t step : {20u, 30u}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::string local,
                               storage::ReadFileToString(&mem_, storage::ShardPath("/nvme", "job", step, 0)));
    CKPTD_ASSERT_OK_AND_ASSIGN(std::string root,
                               storage::ReadFileToString(&mem_, storage::ShardPath("/ckpt", "job", step, 0)));
    EXPECT_EQ(local, root) << step;
    EXPECT_FALSE(local.empty());
  }
  // The tier keeps the newest two steps.
  EXPECT_EQ(LocalSteps("job"), (std::vector<uint64_t>{20, 30}));
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(30u));
  EXPECT_EQ(r.source, RestoreSource::kLocal);
  for (size_t i = 0; i < h.offsets.size(); ++i) EXPECT_EQ(seg->slot_data(r.slot)[h.offsets[i]], 30) << i;
  CKPTD_ASSERT_OK(seg->Release(r.slot));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(h.trainer_id));
  EXPECT_EQ(st.local_writes, 3u);
  EXPECT_EQ(st.local_fallbacks, 0u);
  EXPECT_EQ(st.local_restores, 1u);
  EXPECT_TRUE(logger.Contains("job job rank 0: step 30 read from the node-local tier"));
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_F(LocalTierTest, ALocalCopyThatIsDamagedOrNotTheCommittedShardIsNotUsed) {
  ckptd::testing::CapturingLogger logger;
  options_.logger = &logger;
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  for (uint64_t step : {1u, 2u}) SnapshotAndWait(agent, *seg, h, step);
  const std::string local2 = storage::ShardPath("/nvme", "job", 2, 0);
  // Step 1's shard where step 2's should be: a well-formed file, but not the
  // shard step 2 committed.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string one,
                             storage::ReadFileToString(&mem_, storage::ShardPath("/nvme", "job", 1, 0)));
  CKPTD_ASSERT_OK(mem_.SetFileContents(local2, one));
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(2u));
  EXPECT_NE(r.source, RestoreSource::kLocal);
  EXPECT_EQ(seg->slot_data(r.slot)[0], 2);
  CKPTD_ASSERT_OK(seg->Release(r.slot));
  // A truncated local copy: read from the root, and the copy is dropped.
  CKPTD_ASSERT_OK(mem_.SetFileContents(local2, one.substr(0, one.size() / 2)));
  CKPTD_ASSERT_OK_AND_ASSIGN(r, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(2u));
  EXPECT_NE(r.source, RestoreSource::kLocal);
  EXPECT_EQ(seg->slot_data(r.slot)[0], 2);
  CKPTD_ASSERT_OK(seg->Release(r.slot));
  EXPECT_THAT(mem_.Stat(local2), StatusIs(absl::StatusCode::kNotFound, _));
  EXPECT_FALSE(logger.Contains("step 2 read from the node-local tier"));
  // Gone from the root: the local copy of an uncommitted step is never used.
  storage::CheckpointStore store(&mem_, "/ckpt");
  CKPTD_ASSERT_OK(store.RemoveStep("job", 2));
  CKPTD_ASSERT_OK_AND_ASSIGN(r, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(1u));
  EXPECT_EQ(r.source, RestoreSource::kLocal);
  CKPTD_ASSERT_OK(seg->Release(r.slot));
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_F(LocalTierTest, AFullLocalDiskFallsBackToTheStorageRoot) {
  storage::FaultInjectionFileSystem local(&mem_);
  local.FailPath("/nvme", storage::Fault::kEnospc, storage::FaultScope::kWrites);
  options_.local_fs = &local;
  ckptd::testing::CapturingLogger logger;
  options_.logger = &logger;
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  SnapshotAndWait(agent, *seg, h, 7);
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(h.trainer_id));
  EXPECT_THAT(st.last_committed_step, Optional(7u));
  EXPECT_EQ(st.failed, 0u);
  EXPECT_EQ(st.local_writes, 0u);
  EXPECT_EQ(st.local_fallbacks, 1u);
  EXPECT_THAT(st.last_local_error,
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("node-local tier /nvme")));
  EXPECT_TRUE(logger.Contains("job job rank 0 step 7: node-local tier /nvme: "));
  EXPECT_TRUE(logger.Contains("; writing the storage root directly"));
  // Space again: the next snapshot goes through the tier.
  local.ClearPath("/nvme");
  SnapshotAndWait(agent, *seg, h, 8);
  CKPTD_ASSERT_OK_AND_ASSIGN(st, agent.Status(h.trainer_id));
  EXPECT_EQ(st.local_writes, 1u);
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(8u));
  EXPECT_EQ(r.source, RestoreSource::kLocal);
  CKPTD_ASSERT_OK(seg->Release(r.slot));
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_F(LocalTierTest, TheSlotIsHandedBackBeforeTheCopyToSlowSharedStorage) {
  storage::FaultInjectionFileSystem shared(&mem_);
  shared.SlowPath("/ckpt", absl::Milliseconds(300));
  options_.local_fs = &mem_;
  options_.slots = 1;
  AgentCore agent(&shared, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::ZeroDuration()));
  CKPTD_ASSERT_OK(seg->Publish(slot, 1));
  CKPTD_ASSERT_OK(agent.SnapshotPublished(h.trainer_id, slot, 1));
  // The only slot comes back once the local write is done, while the copy to
  // the storage root (300 ms per read and write there) is still running.
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t again, seg->AcquireForFill(absl::Seconds(30)));
  EXPECT_EQ(again, slot);
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(h.trainer_id));
  EXPECT_EQ(st.last_persisted_step, std::nullopt);
  CKPTD_ASSERT_OK(seg->Publish(again, 2));
  CKPTD_ASSERT_OK(agent.SnapshotPublished(h.trainer_id, again, 2));
  CKPTD_ASSERT_OK_AND_ASSIGN(st, agent.WaitPersisted(h.trainer_id, 2, absl::Seconds(60)));
  EXPECT_THAT(st.last_committed_step, Optional(2u));
  EXPECT_EQ(st.persisted, 2u);
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_F(LocalTierTest, NewerStepsOfAGoneRunNeitherPushOutTheCurrentOnesNorOutliveTheRestore) {
  // A run that got to step 60 on this node, then went back (e.g. to 10).
  for (uint64_t step : {50u, 60u}) {
    CKPTD_ASSERT_OK(storage::CreateDirs(&mem_, storage::StepDir("/nvme", "job", step)));
    CKPTD_ASSERT_OK(mem_.SetFileContents(storage::ShardPath("/nvme", "job", step, 0), "old"));
  }
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  // Kept by number, 50 and 60 outrank it; the copy of 10 still completes.
  SnapshotAndWait(agent, *seg, h, 10);
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(h.trainer_id));
  EXPECT_EQ(st.failed, 0u);
  EXPECT_THAT(st.last_committed_step, Optional(10u));
  // The restore goes back to 10: what is newer on this node is gone with it.
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(10u));
  CKPTD_ASSERT_OK(seg->Release(r.slot));
  std::vector<uint64_t> left = LocalSteps("job");
  EXPECT_THAT(left, ::testing::Not(::testing::Contains(50u)));
  EXPECT_THAT(left, ::testing::Not(::testing::Contains(60u)));
  SnapshotAndWait(agent, *seg, h, 20);
  CKPTD_ASSERT_OK_AND_ASSIGN(r, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(20u));
  EXPECT_EQ(r.source, RestoreSource::kLocal);
  CKPTD_ASSERT_OK(seg->Release(r.slot));
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_F(LocalTierTest, StartingUpDropsHalfWrittenFilesAndOldSteps) {
  for (uint64_t step : {1u, 2u, 3u}) {
    CKPTD_ASSERT_OK(storage::CreateDirs(&mem_, storage::StepDir("/nvme", "job", step)));
    CKPTD_ASSERT_OK(mem_.SetFileContents(storage::ShardPath("/nvme", "job", step, 0), "x"));
  }
  const std::string tmp = absl::StrCat(storage::ShardPath("/nvme", "job", 3, 1), storage::kTempSuffix);
  CKPTD_ASSERT_OK(mem_.SetFileContents(tmp, "half"));
  AgentCore agent(&mem_, options_);
  EXPECT_EQ(LocalSteps("job"), (std::vector<uint64_t>{2, 3}));
  EXPECT_THAT(mem_.Stat(tmp), StatusIs(absl::StatusCode::kNotFound, _));
  CKPTD_EXPECT_OK(mem_.Stat(storage::ShardPath("/nvme", "job", 3, 0)).status());
}

// --- One node, many ranks, no coordinator (the torchrun --nproc-per-node case).

// Rank `rank` of a job of `world` ranks, all on this node.
TrainerRegistration LoneRank(const std::string& job, uint32_t rank, uint32_t world) {
  TrainerRegistration r;
  r.job = job;
  r.rank = rank;
  r.world_size = world;
  r.local_world_size = world;
  r.buffers = {Buffer("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 1000),
               Buffer("cursor", ckptd::v1::DATA_CURSOR, ckptd::v1::BYTES, 24)};
  return r;
}

// What rank `rank` holds at `step`: each rank's shard differs.
uint8_t RankFill(uint64_t step, uint32_t rank) { return static_cast<uint8_t>((step * 3 + rank) & 0xff); }

// Every rank of one job, each registered as a trainer of its own.
struct LoneJobRanks {
  std::vector<TrainerHandle> handles;
  std::vector<std::unique_ptr<staging::StagingSegment>> segments;
};

void RegisterRanks(AgentCore& agent, const std::string& job, uint32_t world, LoneJobRanks* out) {
  *out = LoneJobRanks();
  for (uint32_t r = 0; r < world; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(LoneRank(job, r, world)));
    CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
    out->handles.push_back(h);
    out->segments.push_back(std::move(seg));
  }
}

// Rank `rank` snapshots `step` and waits until it is persisted.
void RankSnapshot(AgentCore& agent, LoneJobRanks& ranks, uint32_t rank, uint64_t step) {
  SnapshotAndWait(agent, *ranks.segments[rank], ranks.handles[rank], step, RankFill(step, rank));
}

// Every rank restores at once, each from a thread of its own, as trainers do.
std::vector<absl::StatusOr<RestoreResult>> RestoreAll(AgentCore& agent, const LoneJobRanks& ranks) {
  std::vector<absl::StatusOr<RestoreResult>> results(ranks.handles.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.handles.size(); ++r) {
    threads.emplace_back([&, r] { results[r] = agent.Restore(ranks.handles[r].trainer_id, absl::Seconds(10)); });
  }
  for (std::thread& th : threads) th.join();
  return results;
}

// Every rank restored `step`, each its own shard of it; the slots go back.
void ExpectAllRestored(LoneJobRanks& ranks, const std::vector<absl::StatusOr<RestoreResult>>& results, uint64_t step) {
  ASSERT_EQ(results.size(), ranks.handles.size());
  for (uint32_t r = 0; r < results.size(); ++r) {
    ASSERT_THAT(results[r], IsOk()) << "rank " << r;
    EXPECT_THAT(results[r]->step, Optional(step)) << "rank " << r;
    if (!results[r]->step) continue;
    staging::StagingSegment& seg = *ranks.segments[r];
    for (uint64_t offset : ranks.handles[r].offsets) {
      EXPECT_EQ(seg.slot_data(results[r]->slot)[offset], RankFill(step, r)) << "rank " << r;
    }
    CKPTD_EXPECT_OK(seg.Release(results[r]->slot));
  }
}

class LoneAgentTest : public AgentCoreTest, public ::testing::WithParamInterface<uint32_t> {
 protected:
  // The shards the MANIFEST of `step` lists, by rank.
  std::vector<uint32_t> ManifestRanks(uint64_t step) {
    storage::CheckpointStore store(&mem_, "/ckpt");
    std::vector<uint32_t> ranks;
    absl::StatusOr<ckptd::v1::StepManifest> m = store.ReadManifest("job", step);
    if (!m.ok()) return ranks;
    for (const ckptd::v1::ShardRef& s : m->shards()) ranks.push_back(s.rank());
    return ranks;
  }
  std::vector<uint32_t> AllRanks() {
    std::vector<uint32_t> all(GetParam());
    for (uint32_t r = 0; r < GetParam(); ++r) all[r] = r;
    return all;
  }
};

INSTANTIATE_TEST_SUITE_P(Ranks, LoneAgentTest, ::testing::Values(2u, 4u),
                         [](const ::testing::TestParamInfo<uint32_t>& p) { return absl::StrCat(p.param); });

TEST_P(LoneAgentTest, CommitsEveryStepThatAllRanksWroteAndRestoresThemAllToTheSameStep) {
  const uint32_t world = GetParam();
  AgentCore agent(&mem_, options_);
  LoneJobRanks ranks;
  ASSERT_NO_FATAL_FAILURE(RegisterRanks(agent, "job", world, &ranks));
  storage::CheckpointStore store(&mem_, "/ckpt");
  for (uint64_t step : {10u, 20u, 30u}) {
    for (uint32_t r = 0; r < world; ++r) {
      // Not before the last rank's shard is durable.
      EXPECT_THAT(mem_.Stat(storage::ManifestPath("/ckpt", "job", step)), StatusIs(absl::StatusCode::kNotFound, _));
      ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, ranks, r, step));
    }
    EXPECT_EQ(ManifestRanks(step), AllRanks()) << step;
    EXPECT_THAT(store.LatestCommittedStep("job"), ::ckptd::testing::IsOkAndHolds(Optional(step)));
    for (uint32_t r = 0; r < world; ++r) {
      CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(ranks.handles[r].trainer_id));
      EXPECT_THAT(st.last_committed_step, Optional(step)) << "rank " << r;
    }
  }
  // The retention rule of every committer: the newest two stay.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<storage::StepInfo> steps, store.ListSteps("job"));
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].step, 20u);
  EXPECT_EQ(steps[1].step, 30u);

  // Step 40: only rank 0 got to write it before the job went down.
  ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, ranks, 0, 40));
  EXPECT_THAT(mem_.Stat(storage::ManifestPath("/ckpt", "job", 40)), StatusIs(absl::StatusCode::kNotFound, _));
  EXPECT_THAT(store.LatestCommittedStep("job"), ::ckptd::testing::IsOkAndHolds(Optional(30u)));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(ranks.handles[0].trainer_id));
  EXPECT_THAT(st.last_persisted_step, Optional(40u));
  EXPECT_THAT(st.last_committed_step, Optional(30u));

  // The restart: every rank comes back and restores step 30, its own shard.
  for (const TrainerHandle& h : ranks.handles) CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id, /*died=*/true));
  ASSERT_NO_FATAL_FAILURE(RegisterRanks(agent, "job", world, &ranks));
  ASSERT_NO_FATAL_FAILURE(ExpectAllRestored(ranks, RestoreAll(agent, ranks), 30));
  for (const TrainerHandle& h : ranks.handles) CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_P(LoneAgentTest, OneRanksDamagedShardSendsEveryRankBackAStep) {
  const uint32_t world = GetParam();
  options_.keep_in_memory = false;  // the damage is on disk
  AgentCore agent(&mem_, options_);
  LoneJobRanks ranks;
  ASSERT_NO_FATAL_FAILURE(RegisterRanks(agent, "job", world, &ranks));
  for (uint64_t step : {10u, 20u}) {
    for (uint32_t r = 0; r < world; ++r) ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, ranks, r, step));
  }
  ASSERT_EQ(ManifestRanks(20), AllRanks());
  // Flip a byte in the first chunk of the last rank's shard of step 20.
  const uint32_t damaged = world - 1;
  const std::string path = storage::ShardPath("/ckpt", "job", 20, damaged);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string bytes, storage::ReadFileToString(&mem_, path));
  bytes[4096 + 10] ^= 0x40;
  CKPTD_ASSERT_OK(mem_.SetFileContents(path, bytes));

  for (const TrainerHandle& h : ranks.handles) CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id, /*died=*/true));
  ASSERT_NO_FATAL_FAILURE(RegisterRanks(agent, "job", world, &ranks));
  // Every rank, those whose shard of step 20 is intact included, loads step 10.
  ASSERT_NO_FATAL_FAILURE(ExpectAllRestored(ranks, RestoreAll(agent, ranks), 10));
  // The agent commits this job alone: it marks step 20, kept but never restored.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string mark,
                             storage::ReadFileToString(&mem_, storage::QuarantinePath("/ckpt", "job", 20)));
  EXPECT_THAT(mark, HasSubstr(absl::StrCat("rank ", damaged)));
  // A second restart does not even try step 20.
  ASSERT_NO_FATAL_FAILURE(ExpectAllRestored(ranks, RestoreAll(agent, ranks), 10));
  for (const TrainerHandle& h : ranks.handles) CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_P(LoneAgentTest, ShardsOfARankThatRegisteredAgainFromAnotherProcessAreNotMixedIn) {
  const uint32_t world = GetParam();
  AgentCore agent(&mem_, options_);
  LoneJobRanks ranks;
  ASSERT_NO_FATAL_FAILURE(RegisterRanks(agent, "job", world, &ranks));
  for (uint32_t r = 0; r < world; ++r) ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, ranks, r, 10));
  // Every rank but 0 writes step 20; rank 0 fails before it does.
  for (uint32_t r = 1; r < world; ++r) ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, ranks, r, 20));
  for (const TrainerHandle& h : ranks.handles) CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id, /*died=*/true));
  // The launcher starts every rank again, as new processes.
  ASSERT_NO_FATAL_FAILURE(RegisterRanks(agent, "job", world, &ranks));
  // The new rank 0's step 20 does not complete the old ranks' step 20 ...
  ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, ranks, 0, 20));
  EXPECT_THAT(mem_.Stat(storage::ManifestPath("/ckpt", "job", 20)), StatusIs(absl::StatusCode::kNotFound, _));
  // ... the new ranks' own do.
  for (uint32_t r = 1; r < world; ++r) ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, ranks, r, 20));
  EXPECT_EQ(ManifestRanks(20), AllRanks());
  ASSERT_NO_FATAL_FAILURE(ExpectAllRestored(ranks, RestoreAll(agent, ranks), 20));

  for (const TrainerHandle& h : ranks.handles) CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_F(AgentCoreTest, LoneAgentKeepsTheShardsOfAProcessThatRegistersAgain) {
  AgentCore agent(&mem_, options_);
  LoneJobRanks ranks;
  ranks.handles.resize(2);
  ranks.segments.resize(2);
  auto register_rank = [&](uint32_t rank, int32_t pid) {
    TrainerRegistration r = LoneRank("job", rank, 2);
    r.pid = pid;
    CKPTD_ASSERT_OK_AND_ASSIGN(ranks.handles[rank], agent.Register(r));
    CKPTD_ASSERT_OK_AND_ASSIGN(ranks.segments[rank], staging::StagingSegment::Open(ranks.handles[rank].segment));
  };
  ASSERT_NO_FATAL_FAILURE(register_rank(0, 1000));
  ASSERT_NO_FATAL_FAILURE(register_rank(1, 1001));
  ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, ranks, 1, 10));
  // Rank 1's process lost its connection to the agent and registers again:
  // what it wrote before still counts.
  const TrainerHandle first = ranks.handles[1];
  ASSERT_NO_FATAL_FAILURE(register_rank(1, 1001));
  ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, ranks, 0, 10));
  storage::CheckpointStore store(&mem_, "/ckpt");
  EXPECT_THAT(store.LatestCommittedStep("job"), ::ckptd::testing::IsOkAndHolds(Optional(10u)));
  // Another process as rank 1 (a restart): the old one's step 20 is void.
  ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, ranks, 1, 20));
  const TrainerHandle second = ranks.handles[1];
  ASSERT_NO_FATAL_FAILURE(register_rank(1, 2001));
  ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, ranks, 0, 20));
  EXPECT_THAT(store.LatestCommittedStep("job"), ::ckptd::testing::IsOkAndHolds(Optional(10u)));
  ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, ranks, 1, 20));
  EXPECT_THAT(store.LatestCommittedStep("job"), ::ckptd::testing::IsOkAndHolds(Optional(20u)));
  // The registration its process replaced was retired then.
  EXPECT_THAT(agent.TrainerExited(first.trainer_id),
              ::ckptd::testing::StatusIs(absl::StatusCode::kNotFound, HasSubstr("no trainer")));
  for (const TrainerHandle& h : {second, ranks.handles[0], ranks.handles[1]}) {
    CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
  }
}

// A lone agent's job of two ranks, both at step 10.
void TwoRanksAtStep10(AgentCore& agent, LoneJobRanks* ranks) {
  ASSERT_NO_FATAL_FAILURE(RegisterRanks(agent, "job", 2, ranks));
  for (uint32_t r = 0; r < 2; ++r) ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, *ranks, r, 10));
}

// Rank 0 restores with `options` and rank 1 never asks: rank 0 holds step 10
// and waits for it, until `after` passed on `clock` (not a moment before),
// then fails saying `what`.
void ExpectRank0sRestoreEndsAfter(AgentCore& agent, base::FakeClock& clock, LoneJobRanks& ranks,
                                  const RestoreOptions& options, absl::Duration after, absl::string_view what) {
  BackgroundCall<absl::StatusOr<RestoreResult>> restore(
      &clock, [&] { return agent.Restore(ranks.handles[0].trainer_id, options); });
  // Both persisters and the restore wait on the clock.
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 3; }));
  clock.Advance(after - absl::Milliseconds(1));
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 3; }));
  EXPECT_FALSE(restore.done());
  clock.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(Eventually([&] { return restore.done(); }));
  EXPECT_THAT(restore.result(), StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr(what)));
}

TEST_F(AgentCoreTest, LoneAgentRestoreThatNotEveryRankJoinsIsBounded) {
  base::FakeClock clock;
  options_.clock = &clock;
  options_.restore_timeout = absl::Minutes(5);
  AgentCore agent(&mem_, options_);
  LoneJobRanks ranks;
  ASSERT_NO_FATAL_FAILURE(TwoRanksAtStep10(agent, &ranks));
  RestoreOptions options;
  options.wait_for_slot = absl::Seconds(10);
  ASSERT_NO_FATAL_FAILURE(
      ExpectRank0sRestoreEndsAfter(agent, clock, ranks, options, absl::Minutes(5), "loaded step 10 within 5m"));
  // The slot it held went back, and the next restore is a round of its own.
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t a, ranks.segments[0]->AcquireForFill(absl::ZeroDuration()));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t b, ranks.segments[0]->AcquireForFill(absl::ZeroDuration()));
  CKPTD_ASSERT_OK(ranks.segments[0]->Abandon(a));
  CKPTD_ASSERT_OK(ranks.segments[0]->Abandon(b));
  ASSERT_NO_FATAL_FAILURE(ExpectAllRestored(ranks, RestoreAll(agent, ranks), 10));
  for (const TrainerHandle& h : ranks.handles) CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

// The trainer's call gives up after its own deadline: the agent ends the
// restore a second before, so that the trainer reads why rather than a bare
// "Deadline Exceeded".
TEST_F(AgentCoreTest, ARestoreEndsBeforeItsCallerGivesUp) {
  base::FakeClock clock;
  options_.clock = &clock;
  options_.restore_timeout = absl::Minutes(5);
  AgentCore agent(&mem_, options_);
  LoneJobRanks ranks;
  ASSERT_NO_FATAL_FAILURE(TwoRanksAtStep10(agent, &ranks));
  RestoreOptions options;
  options.wait_for_slot = absl::Seconds(10);
  options.caller_timeout = absl::Seconds(30);
  ASSERT_NO_FATAL_FAILURE(
      ExpectRank0sRestoreEndsAfter(agent, clock, ranks, options, absl::Seconds(29), "loaded step 10 within 29s"));
  // A caller that leaves no time is told so at once.
  options.caller_timeout = absl::ZeroDuration();
  EXPECT_THAT(agent.Restore(ranks.handles[0].trainer_id, options),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("the caller's deadline leaves no time")));
  for (const TrainerHandle& h : ranks.handles) CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_F(AgentCoreTest, LoneAgentRestoreWaitingForOtherRanksEndsWhenTheAgentShutsDown) {
  base::FakeClock clock;
  options_.clock = &clock;
  options_.restore_timeout = absl::Minutes(5);
  AgentCore agent(&mem_, options_);
  LoneJobRanks ranks;
  ASSERT_NO_FATAL_FAILURE(RegisterRanks(agent, "job", 2, &ranks));
  for (uint32_t r = 0; r < 2; ++r) ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, ranks, r, 10));
  BackgroundCall<absl::StatusOr<RestoreResult>> restore(
      &clock, [&] { return agent.Restore(ranks.handles[0].trainer_id, absl::Seconds(10)); });
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 3; }));
  // SIGTERM: the restore does not wait out its 5 minutes (nor holds the
  // agent's server that long); the clock does not move.
  agent.BeginShutdown(clock.Now() + absl::Seconds(30));
  ASSERT_TRUE(Eventually([&] { return restore.done(); }));
  EXPECT_THAT(restore.result(), StatusIs(absl::StatusCode::kUnavailable,
                                         HasSubstr("restore of job job rank 0: the agent is shutting down")));
  for (const TrainerHandle& h : ranks.handles) CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

// A coordinator that is never asked anything: for registrations only.
class SilentCoordinator : public CoordinatorClient {
 public:
  void ShardDurable(const ckptd::v1::ShardReport&) override {}
  void Failure(const ckptd::v1::ReportFailureRequest&) override {}
  absl::StatusOr<ckptd::v1::RestorePlanResponse> RestorePlan(const ckptd::v1::RestorePlanRequest&,
                                                             absl::Duration) override {
    return absl::UnavailableError("silent");
  }
  std::optional<ckptd::v1::Schedule> ScheduleFor(const std::string&) override { return std::nullopt; }
};

TEST_F(AgentCoreTest, LoneAgentRefusesAJobWithRanksOnOtherNodes) {
  AgentCore agent(&mem_, options_);
  // Two nodes of two ranks each: this agent would never see a whole step.
  TrainerRegistration r = LoneRank("job", 1, 4);
  r.local_world_size = 2;
  EXPECT_THAT(agent.Register(r), StatusIs(absl::StatusCode::kFailedPrecondition,
                                          AllOf(HasSubstr("4 ranks, 2 of them on this node"),
                                                HasSubstr("run ckptd-coordinator"), HasSubstr("--coordinator"))));
  r.local_world_size = 5;
  EXPECT_THAT(agent.Register(r), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("local world size 5")));
  // Unknown (an older client), or every rank here: accepted.
  r.local_world_size = 0;
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle unknown, agent.Register(r));
  r.rank = 0;
  r.local_world_size = 4;
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle all, agent.Register(r));
  // The same job registered with another world size while its ranks run.
  TrainerRegistration other = LoneRank("job", 0, 2);
  EXPECT_THAT(agent.Register(other),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("registered here with a world of 4")));
  CKPTD_ASSERT_OK(agent.TrainerExited(unknown.trainer_id));
  CKPTD_ASSERT_OK(agent.TrainerExited(all.trainer_id));
  // With a coordinator the agent commits nothing itself: ranks on other nodes are fine.
  SilentCoordinator coordinator;
  AgentOptions coordinated = options_;
  coordinated.coordinator = &coordinator;
  coordinated.segment_prefix += "-coordinated";  // `agent` keeps its segments parked
  AgentCore with(&mem_, coordinated);
  r.local_world_size = 2;
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, with.Register(r));
  EXPECT_TRUE(h.coordinated);
  CKPTD_ASSERT_OK(with.TrainerExited(h.trainer_id));
}

TEST_F(LocalTierTest, LoneAgentJobOfTwoRanksCommitsAndRestoresFromTheLocalCopies) {
  AgentCore agent(&mem_, options_);
  LoneJobRanks ranks;
  ASSERT_NO_FATAL_FAILURE(RegisterRanks(agent, "job", 2, &ranks));
  for (uint64_t step : {10u, 20u, 30u}) {
    for (uint32_t r = 0; r < 2; ++r) ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, ranks, r, step));
  }
  storage::CheckpointStore store(&mem_, "/ckpt");
  EXPECT_THAT(store.LatestCommittedStep("job"), ::ckptd::testing::IsOkAndHolds(Optional(30u)));
  EXPECT_EQ(LocalSteps("job"), (std::vector<uint64_t>{20, 30}));
  std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll(agent, ranks);
  for (const absl::StatusOr<RestoreResult>& r : results) {
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->source, RestoreSource::kLocal);
  }
  ASSERT_NO_FATAL_FAILURE(ExpectAllRestored(ranks, results, 30));
  for (const TrainerHandle& h : ranks.handles) CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

// Issue 16 (5): failed persists are logged, rate-limited, counted, and leave
// no empty step folders behind.

// Keeps every line with its severity.
class SeverityLogger : public base::Logger {
 public:
  void Log(base::LogSeverity severity, absl::string_view message) override {
    absl::MutexLock l(&mu_);
    lines_.emplace_back(severity, std::string(message));
  }
  // The lines that contain `needle`, with their severity.
  std::vector<std::pair<base::LogSeverity, std::string>> With(absl::string_view needle) {
    absl::MutexLock l(&mu_);
    std::vector<std::pair<base::LogSeverity, std::string>> out;
    for (const auto& line : lines_) {
      if (absl::StrContains(line.second, needle)) out.push_back(line);
    }
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<base::LogSeverity, std::string>> lines_ ABSL_GUARDED_BY(mu_);
};

// Snapshots `step` and waits until its persist ended, failed or not.
PersistStatus SnapshotAndWaitEither(AgentCore& agent, staging::StagingSegment& seg, const TrainerHandle& h,
                                    uint64_t step, uint8_t fill) {
  Snapshot(agent, seg, h, step, fill);
  absl::StatusOr<PersistStatus> st = agent.WaitPersisted(h.trainer_id, step, absl::Seconds(30));
  EXPECT_THAT(st, IsOk());
  return st.ok() ? *st : PersistStatus();
}

TEST_F(AgentCoreTest, FailedPersistsAreLoggedRateLimitedCountedAndLeaveNoEmptyStepFolder) {
  storage::FaultInjectionFileSystem fs(&mem_);
  // A full disk for the shard files: the step folder is made, the shard not.
  fs.FailPath("rank-0.shard", storage::Fault::kEnospc, storage::FaultScope::kWrites);
  base::FakeClock clock;
  options_.clock = &clock;
  SeverityLogger logger;
  options_.logger = &logger;
  AgentCore agent(&fs, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));

  PersistStatus st = SnapshotAndWaitEither(agent, *seg, h, 1, 1);
  EXPECT_EQ(st.failed, 1u);
  EXPECT_THAT(st.last_failed_step, Optional(1u));
  EXPECT_THAT(st.last_error, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("rank-0.shard")));
  // The first failure at once, with the error and the path.
  auto first = logger.With("persist of job job rank 0 step 1 failed: ");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].first, base::LogSeverity::kWarning);
  EXPECT_THAT(first[0].second, AllOf(HasSubstr("/ckpt/job/step-1/rank-0.shard"), HasSubstr("No space left on device"),
                                     HasSubstr("reported at most every 30s")));
  // A storm within 30 s: counted, not logged.
  for (uint64_t step = 2; step <= 4; ++step) st = SnapshotAndWaitEither(agent, *seg, h, step, 2);
  EXPECT_EQ(st.failed, 4u);
  EXPECT_THAT(st.last_failed_step, Optional(4u));
  EXPECT_THAT(logger.With("failed: "), ::testing::SizeIs(1));
  // No empty step folder is left behind.
  for (uint64_t step = 1; step <= 4; ++step) EXPECT_FALSE(mem_.Stat(storage::StepDir("/ckpt", "job", step)).ok());

  // 30 s later: one line for the next failure and those held back.
  clock.Advance(absl::Seconds(30));
  st = SnapshotAndWaitEither(agent, *seg, h, 5, 5);
  auto second = logger.With("persist of job job rank 0 step 5 failed: ");
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].first, base::LogSeverity::kWarning);
  EXPECT_THAT(second[0].second, HasSubstr("; 3 more failed since the last report (5 in a row)"));

  // Space again: one INFO line, and the status keeps the count.
  fs.ClearPath("rank-0.shard");
  SnapshotAndWait(agent, *seg, h, 6);
  auto again = logger.With("persists of job job rank 0 succeed again after 5 failures");
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].first, base::LogSeverity::kInfo);
  CKPTD_ASSERT_OK_AND_ASSIGN(st, agent.Status(h.trainer_id));
  EXPECT_EQ(st.failed, 5u);
  EXPECT_EQ(st.persisted, 1u);
  EXPECT_THAT(st.last_failed_step, Optional(5u));

  // A new storm is reported at once again.
  fs.FailPath("rank-0.shard", storage::Fault::kEnospc, storage::FaultScope::kWrites);
  SnapshotAndWaitEither(agent, *seg, h, 7, 7);
  SnapshotAndWaitEither(agent, *seg, h, 8, 8);
  EXPECT_THAT(logger.With("persist of job job rank 0 step 7 failed: "), ::testing::SizeIs(1));
  EXPECT_THAT(logger.With("step 8 failed"), ::testing::IsEmpty());
  // What was held back is reported when the trainer goes.
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
  auto last = logger.With("job job rank 0: 1 more persists failed since the last report, the newest of step 8: ");
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].first, base::LogSeverity::kWarning);
}

TEST_F(AgentCoreTest, AFailedPersistKeepsAStepFolderHoldingAnotherRanksShard) {
  storage::FaultInjectionFileSystem fs(&mem_);
  fs.FailPath("rank-1.shard", storage::Fault::kEnospc, storage::FaultScope::kWrites);
  AgentCore agent(&fs, options_);
  LoneJobRanks ranks;
  ASSERT_NO_FATAL_FAILURE(RegisterRanks(agent, "job", 2, &ranks));
  // Rank 0 wrote step 1, rank 1 cannot: the folder stays with rank 0's shard.
  ASSERT_NO_FATAL_FAILURE(RankSnapshot(agent, ranks, 0, 1));
  PersistStatus st = SnapshotAndWaitEither(agent, *ranks.segments[1], ranks.handles[1], 1, 1);
  EXPECT_EQ(st.failed, 1u);
  EXPECT_TRUE(mem_.Stat(storage::ShardPath("/ckpt", "job", 1, 0)).ok());
  // Rank 1 alone at step 2: nothing of it stays.
  st = SnapshotAndWaitEither(agent, *ranks.segments[1], ranks.handles[1], 2, 2);
  EXPECT_EQ(st.failed, 2u);
  EXPECT_FALSE(mem_.Stat(storage::StepDir("/ckpt", "job", 2)).ok());
  for (const TrainerHandle& h : ranks.handles) CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_F(LocalTierTest, AFailedPersistLeavesNoEmptyStepFolderInTheTierOrTheStorageRoot) {
  storage::FaultInjectionFileSystem fs(&mem_);
  AgentCore agent(&fs, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  SnapshotAndWait(agent, *seg, h, 1);
  // The tier takes the shard, the storage root is full: the tier's copy of a
  // step that never commits goes too.
  fs.FailPath("/ckpt/job/step-2/", storage::Fault::kEnospc, storage::FaultScope::kWrites);
  PersistStatus st = SnapshotAndWaitEither(agent, *seg, h, 2, 2);
  EXPECT_EQ(st.failed, 1u);
  EXPECT_EQ(st.local_writes, 2u);
  EXPECT_FALSE(mem_.Stat(storage::StepDir("/ckpt", "job", 2)).ok());
  EXPECT_EQ(LocalSteps("job"), (std::vector<uint64_t>{1}));
  // Both full: the tier falls back to the root, which fails too.
  fs.FailPath("/nvme/", storage::Fault::kEnospc, storage::FaultScope::kWrites);
  fs.FailPath("/ckpt/job/step-3/", storage::Fault::kEnospc, storage::FaultScope::kWrites);
  st = SnapshotAndWaitEither(agent, *seg, h, 3, 3);
  EXPECT_EQ(st.failed, 2u);
  EXPECT_EQ(st.local_fallbacks, 1u);
  EXPECT_FALSE(mem_.Stat(storage::StepDir("/ckpt", "job", 3)).ok());
  EXPECT_EQ(LocalSteps("job"), (std::vector<uint64_t>{1}));
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

// The agent's exit (SIGTERM): BeginShutdown bounds the persists under way.
class ShutdownTest : public AgentCoreTest {
 protected:
  ShutdownTest() {
    options_.logger = &log_;
    options_.slots = 3;
    // Each 4 KiB block write of the storage root takes 20 ms: a snapshot of
    // 12 KiB of params and more is a persist of a few hundred milliseconds.
    slow_.SetLatency(absl::Milliseconds(20));
  }
  static TrainerRegistration Rank0() {
    TrainerRegistration r;
    r.job = "job";
    r.buffers = {Buffer("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 12000)};
    return r;
  }
  // Nothing of `step` on disk: no step folder, no temp file.
  void ExpectNothingOf(uint64_t step) {
    EXPECT_FALSE(mem_.Stat(absl::StrCat("/ckpt/job/step-", step)).ok()) << "step " << step << " left a folder";
    EXPECT_FALSE(mem_.Stat(absl::StrCat(storage::ShardPath("/ckpt", "job", step, 0), storage::kTempSuffix)).ok());
  }

  ckptd::testing::CapturingLogger log_;
  storage::FaultInjectionFileSystem slow_{&mem_};
};

TEST_F(ShutdownTest, APersistPastTheDeadlineStopsAndLeavesNothing) {
  auto agent = std::make_unique<AgentCore>(&slow_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent->Register(Rank0()));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(*agent, *seg, h, 10));
  ASSERT_NO_FATAL_FAILURE(Snapshot(*agent, *seg, h, 20));
  // SIGTERM while step 20 is being written, with 50 ms to go.
  ASSERT_TRUE(Eventually([&] { return mem_.Stat(absl::StrCat(storage::ShardPath("/ckpt", "job", 20, 0),
                                                             storage::kTempSuffix)).ok(); },
                         absl::Seconds(10)));
  const absl::Time start = absl::Now();
  agent->BeginShutdown(absl::Now() + absl::Milliseconds(50));
  agent.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "the persist was not stopped at the deadline";
  ExpectNothingOf(20);
  EXPECT_TRUE(log_.Contains("shutting down: job job rank 0: step 20 was stopped at the end of the shutdown's grace "
                            "period"));
  EXPECT_TRUE(log_.Contains("nothing of it is left on disk"));
  // Step 10 is untouched and still the one to restore.
  storage::CheckpointStore store(&mem_, "/ckpt");
  CKPTD_ASSERT_OK_AND_ASSIGN(std::optional<uint64_t> latest, store.LatestCommittedStep("job"));
  EXPECT_THAT(latest, Optional(10u));
}

// With a node-local tier a shard is written there, then copied to the
// storage root: a copy still running at the deadline stops too, and leaves
// nothing of the step in the root (nor in the tier).
TEST_F(ShutdownTest, ACopyFromTheLocalTierPastTheDeadlineStopsAndLeavesNothing) {
  CKPTD_ASSERT_OK(mem_.CreateDir("/nvme"));
  options_.local_cache = "/nvme";
  options_.local_fs = &mem_;  // the tier is fast: the time goes into the copy
  // The copy of a shard (one chunk) is one write to the root: 20 + 250 ms.
  slow_.SlowPath("/ckpt", absl::Milliseconds(250));
  auto agent = std::make_unique<AgentCore>(&slow_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent->Register(Rank0()));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(*agent, *seg, h, 10));
  ASSERT_NO_FATAL_FAILURE(Snapshot(*agent, *seg, h, 20));
  // SIGTERM while step 20, whole in the tier, is being copied to the root,
  // with 50 ms to go.
  const std::string root_shard = storage::ShardPath("/ckpt", "job", 20, 0);
  ASSERT_TRUE(Eventually([&] { return mem_.Stat(absl::StrCat(root_shard, storage::kTempSuffix)).ok(); },
                         absl::Seconds(10)));
  EXPECT_TRUE(mem_.Stat(storage::ShardPath("/nvme", "job", 20, 0)).ok()) << "not a copy from the tier";
  const absl::Time start = absl::Now();
  agent->BeginShutdown(absl::Now() + absl::Milliseconds(50));
  agent.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "the copy was not stopped at the deadline";
  ExpectNothingOf(20);
  EXPECT_FALSE(mem_.Stat(root_shard).ok()) << "the copy reached the storage root";
  EXPECT_FALSE(mem_.Stat(storage::ShardPath("/nvme", "job", 20, 0)).ok()) << "the tier kept an uncommitted step";
  EXPECT_TRUE(log_.Contains("shutting down: job job rank 0: step 20 was stopped at the end of the shutdown's grace "
                            "period"));
  EXPECT_TRUE(log_.Contains(absl::StrCat("copy of ", storage::ShardPath("/nvme", "job", 20, 0), " to ", root_shard,
                                         " stopped with")));
  storage::CheckpointStore store(&mem_, "/ckpt");
  CKPTD_ASSERT_OK_AND_ASSIGN(std::optional<uint64_t> latest, store.LatestCommittedStep("job"));
  EXPECT_THAT(latest, Optional(10u));
}

TEST_F(ShutdownTest, ThePersistUnderWayAndTheNewestSnapshotAreWrittenOlderOnesNotOnceItCommitted) {
  auto agent = std::make_unique<AgentCore>(&slow_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent->Register(Rank0()));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  // Step 10 is being written; 20 and 30 wait behind it.
  ASSERT_NO_FATAL_FAILURE(Snapshot(*agent, *seg, h, 10));
  ASSERT_TRUE(Eventually([&] { return mem_.Stat(absl::StrCat(storage::ShardPath("/ckpt", "job", 10, 0),
                                                             storage::kTempSuffix)).ok(); },
                         absl::Seconds(10)));
  ASSERT_NO_FATAL_FAILURE(Snapshot(*agent, *seg, h, 20));
  ASSERT_NO_FATAL_FAILURE(Snapshot(*agent, *seg, h, 30));
  agent->BeginShutdown(absl::Now() + absl::Seconds(60));
  agent.reset();
  storage::CheckpointStore store(&mem_, "/ckpt");
  CKPTD_ASSERT_OK_AND_ASSIGN(auto steps, store.ListSteps("job"));
  std::vector<uint64_t> committed;
  for (const auto& s : steps) {
    if (s.state == storage::StepState::kCommitted) committed.push_back(s.step);
  }
  EXPECT_THAT(committed, ::testing::ElementsAre(10u, 30u));
  ExpectNothingOf(20);
  EXPECT_TRUE(log_.Contains("shutting down: job job rank 0: step 30 is durable and handed to this agent's commit"));
  EXPECT_TRUE(log_.Contains("shutting down: job job rank 0: step 20 is not persisted: step 30, newer, is committed"));
}

// A rank of a job of two whose other rank is elsewhere: nothing commits
// here, so the older snapshots are written too, after the newest, for as
// long as the grace period lasts.
TEST_F(ShutdownTest, OlderSnapshotsFollowTheNewestWhileTimeRemains) {
  for (const bool enough_time : {true, false}) {
    SCOPED_TRACE(enough_time ? "60 s of grace" : "grace ends during the newest");
    const std::string job = enough_time ? "long" : "short";
    ckptd::testing::CapturingLogger log;
    AgentOptions options = options_;
    options.logger = &log;
    auto agent = std::make_unique<AgentCore>(&slow_, options);
    TrainerRegistration reg = Rank0();
    reg.job = job;
    reg.world_size = 2;
    CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent->Register(reg));
    CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
    ASSERT_NO_FATAL_FAILURE(Snapshot(*agent, *seg, h, 10));
    ASSERT_TRUE(Eventually([&] { return mem_.Stat(absl::StrCat(storage::ShardPath("/ckpt", job, 10, 0),
                                                               storage::kTempSuffix)).ok(); },
                           absl::Seconds(10)));
    ASSERT_NO_FATAL_FAILURE(Snapshot(*agent, *seg, h, 20));
    ASSERT_NO_FATAL_FAILURE(Snapshot(*agent, *seg, h, 30));
    agent->BeginShutdown(absl::Now() + (enough_time ? absl::Seconds(60) : absl::Milliseconds(150)));
    const absl::Time start = absl::Now();
    agent.reset();
    const std::string durable = absl::StrCat("shutting down: job ", job, " rank 0: step 30 is durable");
    if (enough_time) {
      for (uint64_t step : {10, 20, 30}) {
        EXPECT_TRUE(mem_.Stat(storage::ShardPath("/ckpt", job, step, 0)).ok()) << "no shard of step " << step;
      }
      // Newest first.
      const std::vector<std::string> lines = log.lines();
      auto at = [&](absl::string_view what) {
        for (size_t i = 0; i < lines.size(); ++i) {
          if (absl::StrContains(lines[i], what)) return static_cast<int>(i);
        }
        return -1;
      };
      const int newest = at(durable);
      const int older = at(absl::StrCat("shutting down: job ", job, " rank 0: step 20 is durable"));
      ASSERT_GE(newest, 0);
      ASSERT_GE(older, 0);
      EXPECT_LT(newest, older) << "step 20 was written before step 30";
    } else {
      EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "the persists were not stopped at the deadline";
      EXPECT_FALSE(mem_.Stat(storage::ShardPath("/ckpt", job, 20, 0)).ok());
      EXPECT_FALSE(mem_.Stat(absl::StrCat(storage::ShardPath("/ckpt", job, 20, 0), storage::kTempSuffix)).ok());
      const std::string who = absl::StrCat("shutting down: job ", job, " rank 0: step 20 ");
      EXPECT_TRUE(log.Contains(who + "is not persisted: the shutdown's grace period ended before its turn") ||
                  log.Contains(who + "was stopped at the end"));
    }
  }
}

}  // namespace
}  // namespace ckptd::agent
