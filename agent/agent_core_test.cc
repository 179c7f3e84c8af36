#include "agent/agent_core.h"

#include <cstring>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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
using ::testing::HasSubstr;
using ::testing::Optional;

ckptd::v1::Tensor Buffer(const std::string& name, ckptd::v1::Component c, ckptd::v1::DType d, uint64_t n) {
  ckptd::v1::Tensor t;
  t.set_name(name);
  t.set_component(c);
  t.set_dtype(d);
  t.add_shape(n);
  return t;
}

// One rank's five components.
TrainerRegistration FiveComponents(const std::string& job) {
  TrainerRegistration r;
  r.job = job;
  r.buffers = {Buffer("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 3000),
               Buffer("grads", ckptd::v1::GRADS, ckptd::v1::FLOAT32, 3000),
               Buffer("adam", ckptd::v1::OPTIMIZER, ckptd::v1::FLOAT32, 6000),
               Buffer("rng", ckptd::v1::RNG, ckptd::v1::BYTES, 100),
               Buffer("cursor", ckptd::v1::DATA_CURSOR, ckptd::v1::BYTES, 24)};
  return r;
}

class AgentCoreTest : public ::testing::Test {
 protected:
  AgentCoreTest() {
    EXPECT_THAT(mem_.CreateDir("/ckpt"), IsOk());
    options_.storage_root = "/ckpt";
    options_.segment_prefix = absl::StrCat("/ckptd-test-agent-", ::getpid(), "-", counter_++);
    options_.io_threads = 2;
    options_.write.block_bytes = 4096;
  }

  // Fills every buffer of `slot` with a pattern of `step`, as a trainer would.
  static void Fill(staging::StagingSegment& seg, const TrainerHandle& h, uint32_t slot, uint64_t step) {
    std::memset(seg.slot_data(slot), static_cast<int>(step & 0xff), h.slot_bytes);
  }

  static inline int counter_ = 0;
  storage::MemFileSystem mem_;
  AgentOptions options_;
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

  for (uint64_t step : {10u, 20u, 30u}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::Seconds(10)));
    Fill(*seg, h, slot, step);
    CKPTD_ASSERT_OK(seg->Publish(slot, step));
    CKPTD_ASSERT_OK(agent.SnapshotPublished(h.trainer_id, slot, step));
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.WaitPersisted(h.trainer_id, 30, absl::Seconds(30)));
  EXPECT_THAT(st.last_persisted_step, Optional(30u));
  EXPECT_THAT(st.last_committed_step, Optional(30u));
  EXPECT_EQ(st.failed, 0u);

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

TEST_F(AgentCoreTest, DamagedNewestStepFallsBackToThePreviousOne) {
  AgentCore agent(&mem_, options_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  for (uint64_t step : {1u, 2u}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::Seconds(10)));
    Fill(*seg, h, slot, step);
    CKPTD_ASSERT_OK(seg->Publish(slot, step));
    CKPTD_ASSERT_OK(agent.SnapshotPublished(h.trainer_id, slot, step));
    CKPTD_ASSERT_OK(agent.WaitPersisted(h.trainer_id, step, absl::Seconds(30)).status());
  }
  // Flip a byte in the first chunk of step 2's shard.
  const std::string path = storage::ShardPath("/ckpt", "job", 2, 0);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string bytes, storage::ReadFileToString(&mem_, path));
  bytes[4096 + 10] ^= 0x40;
  CKPTD_ASSERT_OK(mem_.SetFileContents(path, bytes));
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(1u));
  EXPECT_EQ(seg->slot_data(r.slot)[0], 1);
  // The agent commits this job alone: it marks step 2, kept but never restored.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string mark,
                             storage::ReadFileToString(&mem_, storage::QuarantinePath("/ckpt", "job", 2)));
  EXPECT_THAT(mark, HasSubstr("rank 0"));
  CKPTD_ASSERT_OK(seg->Release(r.slot));
  CKPTD_ASSERT_OK(mem_.SetFileContents(path, std::string(bytes.size(), '\0')));  // even worse now: not read again
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult again, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(again.step, Optional(1u));
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
  absl::Mutex mu;
  std::optional<absl::StatusOr<PersistStatus>> result;
  std::thread waiter([&] {
    absl::StatusOr<PersistStatus> r = agent.WaitPersisted(h.trainer_id, 5, absl::Seconds(10));
    absl::MutexLock l(&mu);
    result = std::move(r);
  });
  auto done = [&] {
    absl::MutexLock l(&mu);
    return result.has_value();
  };
  absl::Cleanup join = [&] {
    if (!done()) clock.Set(absl::InfiniteFuture());
    waiter.join();
  };
  // The persister and WaitPersisted wait on the clock.
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 2; }));
  clock.Advance(absl::Seconds(9));
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 2; }));
  EXPECT_FALSE(done());
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(Eventually(done));
  absl::MutexLock l(&mu);
  EXPECT_THAT(*result, StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("not persisted within 10s")));
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

// Snapshots `step` (every byte = the step's low byte) and waits until persisted.
void SnapshotAndWait(AgentCore& agent, staging::StagingSegment& seg, const TrainerHandle& h, uint64_t step) {
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg.AcquireForFill(absl::Seconds(10)));
  std::memset(seg.slot_data(slot), static_cast<int>(step & 0xff), h.slot_bytes);
  CKPTD_ASSERT_OK(seg.Publish(slot, step));
  CKPTD_ASSERT_OK(agent.SnapshotPublished(h.trainer_id, slot, step));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.WaitPersisted(h.trainer_id, step, absl::Seconds(30)));
  ASSERT_THAT(st.last_persisted_step, Optional(step)) << st.last_error;
}

class LocalTierTest : public AgentCoreTest {
 protected:
  LocalTierTest() {
    EXPECT_THAT(mem_.CreateDir("/nvme"), IsOk());
    options_.local_cache = "/nvme";
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
  EXPECT_TRUE(r.from_local_cache);
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
  EXPECT_FALSE(r.from_local_cache);
  EXPECT_EQ(seg->slot_data(r.slot)[0], 2);
  CKPTD_ASSERT_OK(seg->Release(r.slot));
  // A truncated local copy: read from the root, and the copy is dropped.
  CKPTD_ASSERT_OK(mem_.SetFileContents(local2, one.substr(0, one.size() / 2)));
  CKPTD_ASSERT_OK_AND_ASSIGN(r, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(2u));
  EXPECT_FALSE(r.from_local_cache);
  EXPECT_EQ(seg->slot_data(r.slot)[0], 2);
  CKPTD_ASSERT_OK(seg->Release(r.slot));
  EXPECT_THAT(mem_.Stat(local2), StatusIs(absl::StatusCode::kNotFound, _));
  EXPECT_FALSE(logger.Contains("step 2 read from the node-local tier"));
  // Gone from the root: the local copy of an uncommitted step is never used.
  storage::CheckpointStore store(&mem_, "/ckpt");
  CKPTD_ASSERT_OK(store.RemoveStep("job", 2));
  CKPTD_ASSERT_OK_AND_ASSIGN(r, agent.Restore(h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(1u));
  EXPECT_TRUE(r.from_local_cache);
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
  EXPECT_TRUE(r.from_local_cache);
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
  EXPECT_TRUE(r.from_local_cache);
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

}  // namespace
}  // namespace ckptd::agent
