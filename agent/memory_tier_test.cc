// The agent's memory tier (AgentCore): persisted steps kept in their staging
// slots, restores served from them (and checked against the committed
// shard's checksums), segments parked for a restarted trainer, the memory
// budget, the eviction of idle parked segments and the background
// preparation of large segments.
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "agent/agent_core.h"
#include "agent/testing_agent_harness.h"
#include "base/clock.h"
#include "base/testing/capturing_logger.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "staging/staging.h"
#include "storage/layout.h"
#include "storage/mem_file_system.h"
#include "storage/shard_index.h"
#include "storage/store.h"

namespace ckptd::agent {
namespace {

using ::ckptd::testing::Eventually;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::StatusIs;
using staging::SlotState;
using ::testing::_;
using ::testing::HasSubstr;
using ::testing::Optional;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

// Rank `rank` of a job of `world` ranks, all on this node: buffers of several
// 4096-byte blocks each (TestAgentOptions writes 4096-byte blocks).
TrainerRegistration Rank(const std::string& job, uint32_t rank = 0, uint32_t world = 1) {
  TrainerRegistration r;
  r.job = job;
  r.rank = rank;
  r.world_size = world;
  r.local_world_size = world;
  r.buffers = {Buffer("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 3000),
               Buffer("adam", ckptd::v1::OPTIMIZER, ckptd::v1::FLOAT32, 6000),
               Buffer("cursor", ckptd::v1::DATA_CURSOR, ckptd::v1::BYTES, 24)};
  return r;
}

// What rank `rank` holds at `step`: each rank's shard differs.
uint8_t RankFill(uint64_t step, uint32_t rank) { return static_cast<uint8_t>((step * 3 + rank) & 0xff); }

// A registered trainer: its handle and its own mapping of the segment.
struct Started {
  TrainerRegistration reg;
  TrainerHandle h;
  std::unique_ptr<staging::StagingSegment> seg;
};

void Start(AgentCore& agent, const TrainerRegistration& reg, Started* out) {
  out->reg = reg;
  CKPTD_ASSERT_OK_AND_ASSIGN(out->h, agent.Register(reg));
  CKPTD_ASSERT_OK_AND_ASSIGN(out->seg, staging::StagingSegment::Open(out->h.segment));
}

// Every byte of every registered buffer in `slot` is `fill`.
void ExpectHolds(const Started& t, uint32_t slot, uint8_t fill) {
  ASSERT_EQ(t.h.offsets.size(), t.reg.buffers.size());
  for (size_t i = 0; i < t.reg.buffers.size(); ++i) {
    CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t length, storage::TensorByteLength(t.reg.buffers[i]));
    const uint8_t* data = t.seg->slot_data(slot) + t.h.offsets[i];
    uint64_t wrong = 0;
    std::optional<uint64_t> first;
    for (uint64_t b = 0; b < length; ++b) {
      if (data[b] != fill) {
        ++wrong;
        if (!first) first = b;
      }
    }
    EXPECT_EQ(wrong, 0u) << "buffer " << t.reg.buffers[i].name() << ": " << wrong << " bytes are not " << int{fill}
                         << ", the first at " << first.value_or(0) << " holds " << int{data[first.value_or(0)]};
  }
}

// The slots of the trainer's segment that keep a step in memory: slot -> step.
std::vector<std::pair<uint32_t, uint64_t>> KeptSlots(const staging::StagingSegment& seg) {
  std::vector<std::pair<uint32_t, uint64_t>> kept;
  for (uint32_t i = 0; i < seg.slots(); ++i) {
    if (seg.state(i) == SlotState::kKept) kept.emplace_back(i, seg.step(i));
  }
  return kept;
}

// The slot of the trainer's segment that keeps `step` in memory.
std::optional<uint32_t> SlotKeeping(const staging::StagingSegment& seg, uint64_t step) {
  for (const auto& [slot, kept] : KeptSlots(seg)) {
    if (kept == step) return slot;
  }
  return std::nullopt;
}

// Every trainer restores at once, each from a thread of its own, as the ranks
// of a job do.
std::vector<absl::StatusOr<RestoreResult>> RestoreAll(AgentCore& agent, const std::vector<Started>& ranks) {
  std::vector<absl::StatusOr<RestoreResult>> results(ranks.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r) {
    threads.emplace_back([&, r] { results[r] = agent.Restore(ranks[r].h.trainer_id, absl::Seconds(10)); });
  }
  for (std::thread& th : threads) th.join();
  return results;
}

class MemoryTierTest : public ::testing::Test {
 protected:
  MemoryTierTest() {
    EXPECT_THAT(mem_.CreateDir("/ckpt"), IsOk());
    options_.logger = &logger_;
  }

  // The bytes of one segment of `Rank()`'s registration, as an agent with
  // these options makes it.
  uint64_t SegmentBytesOfOneTrainer() {
    AgentCore probe(&mem_, TestAgentOptions("probe"));
    absl::StatusOr<TrainerHandle> h = probe.Register(Rank("probe"));
    EXPECT_THAT(h, IsOk());
    if (!h.ok()) return 0;
    const uint64_t bytes = staging::SegmentBytes(h->slots, h->slot_bytes);
    EXPECT_EQ(probe.Memory().bytes, bytes);
    EXPECT_THAT(probe.TrainerExited(h->trainer_id), IsOk());
    return bytes;
  }

  storage::MemFileSystem mem_;
  ckptd::testing::CapturingLogger logger_;
  AgentOptions options_ = TestAgentOptions("memory");
};

TEST_F(MemoryTierTest, ARestartedTrainerGetsItsSegmentBackAndRestoresFromMemory) {
  AgentCore agent(&mem_, options_);
  Started first;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &first));
  for (uint64_t step : {1u, 2u}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *first.seg, first.h, step));
  // Every persisted step stays in memory, one per slot: the newest may never
  // commit, and the one before must still be restorable.
  ASSERT_THAT(KeptSlots(*first.seg), UnorderedElementsAre(Pair(_, 1u), Pair(_, 2u)));
  CKPTD_ASSERT_OK(agent.TrainerExited(first.h.trainer_id, /*died=*/true));
  EXPECT_EQ(agent.Memory().parked, 1u);
  EXPECT_EQ(agent.Memory().parked_bytes, staging::SegmentBytes(first.h.slots, first.h.slot_bytes));

  Started second;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &second));
  EXPECT_EQ(second.h.segment, first.h.segment);
  EXPECT_NE(second.h.trainer_id, first.h.trainer_id);
  EXPECT_EQ(agent.Memory().parked, 0u);
  EXPECT_EQ(agent.Memory().bytes, staging::SegmentBytes(second.h.slots, second.h.slot_bytes));
  EXPECT_TRUE(logger_.Contains("job job rank 0 registered again")) << ::testing::PrintToString(logger_.lines());
  EXPECT_TRUE(logger_.Contains("is taken over, steps 1, 2 in memory")) << ::testing::PrintToString(logger_.lines());
  EXPECT_THAT(KeptSlots(*second.seg), UnorderedElementsAre(Pair(_, 1u), Pair(_, 2u)));

  const std::optional<uint32_t> slot_of_2 = SlotKeeping(*second.seg, 2);
  ASSERT_TRUE(slot_of_2.has_value());
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(second.h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(2u));
  EXPECT_EQ(r.source, RestoreSource::kMemory);
  EXPECT_EQ(r.slot, *slot_of_2);
  EXPECT_EQ(second.seg->state(r.slot), SlotState::kRestored);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(second, r.slot, 2));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(second.h.trainer_id));
  EXPECT_EQ(st.memory_restores, 1u);
  EXPECT_EQ(st.memory_rejected, 0u);
  EXPECT_TRUE(logger_.Contains("job job rank 0: step 2 read from the agent's memory"));

  // Copied out, the step stays in memory (and so does step 1, below it): the
  // next restore reads it again.
  CKPTD_ASSERT_OK(second.seg->Release(r.slot));
  EXPECT_EQ(second.seg->state(r.slot), SlotState::kKept);
  EXPECT_THAT(KeptSlots(*second.seg), UnorderedElementsAre(Pair(_, 1u), Pair(r.slot, 2u)));
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult again, agent.Restore(second.h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(again.step, Optional(2u));
  EXPECT_EQ(again.source, RestoreSource::kMemory);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(second, again.slot, 2));
  CKPTD_ASSERT_OK_AND_ASSIGN(st, agent.Status(second.h.trainer_id));
  EXPECT_EQ(st.memory_restores, 2u);
  CKPTD_ASSERT_OK(second.seg->Release(again.slot));

  // Training goes on in the same segment: no slot is free, so the next
  // snapshot takes step 1's slot, and steps 2 and 3 are kept.
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *second.seg, second.h, 3));
  EXPECT_THAT(KeptSlots(*second.seg), UnorderedElementsAre(Pair(*slot_of_2, 2u), Pair(_, 3u)));
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id));
}

TEST_F(MemoryTierTest, ATrainerOnAnotherDeviceStillGetsTheParkedSegment) {
  AgentCore agent(&mem_, options_);
  TrainerRegistration on_gpu0 = Rank("job");
  on_gpu0.buffers[0].mutable_device()->set_kind(ckptd::v1::Device::CUDA);
  on_gpu0.buffers[0].mutable_device()->set_index(0);
  Started first;
  ASSERT_NO_FATAL_FAILURE(Start(agent, on_gpu0, &first));
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *first.seg, first.h, 5));
  CKPTD_ASSERT_OK(agent.TrainerExited(first.h.trainer_id, /*died=*/true));

  TrainerRegistration on_gpu3 = on_gpu0;
  on_gpu3.buffers[0].mutable_device()->set_index(3);
  Started second;
  ASSERT_NO_FATAL_FAILURE(Start(agent, on_gpu3, &second));
  EXPECT_EQ(second.h.segment, first.h.segment);
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(second.h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(5u));
  EXPECT_EQ(r.source, RestoreSource::kMemory);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(second, r.slot, 5));
  CKPTD_ASSERT_OK(second.seg->Release(r.slot));
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id));
}

TEST_F(MemoryTierTest, ADamagedMemoryCopyIsReadFromDiskInstead) {
  AgentCore agent(&mem_, options_);
  Started first;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &first));
  for (uint64_t step : {1u, 2u}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *first.seg, first.h, step));
  CKPTD_ASSERT_OK(agent.TrainerExited(first.h.trainer_id, /*died=*/true));
  Started second;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &second));
  ASSERT_EQ(second.h.segment, first.h.segment);
  // A byte of the kept copy of step 2 goes bad (a stray write of the trainer).
  ASSERT_THAT(KeptSlots(*second.seg), UnorderedElementsAre(Pair(_, 1u), Pair(_, 2u)));
  const std::optional<uint32_t> slot_of_1 = SlotKeeping(*second.seg, 1);
  const std::optional<uint32_t> slot_of_2 = SlotKeeping(*second.seg, 2);
  ASSERT_TRUE(slot_of_1.has_value() && slot_of_2.has_value());
  second.seg->slot_data(*slot_of_2)[second.h.offsets[1] + 5000] ^= 0x01;

  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(second.h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(2u));
  EXPECT_EQ(r.source, RestoreSource::kRoot);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(second, r.slot, 2));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(second.h.trainer_id));
  EXPECT_EQ(st.memory_rejected, 1u);
  EXPECT_EQ(st.memory_restores, 0u);
  EXPECT_TRUE(logger_.Contains("job job rank 0: the copy of step 2 in the agent's memory is damaged"))
      << ::testing::PrintToString(logger_.lines());
  EXPECT_TRUE(logger_.Contains("buffer 'adam' bytes 4096..8192 do not match their checksum"))
      << ::testing::PrintToString(logger_.lines());
  // The step is not quarantined: the disk copy was intact.
  EXPECT_THAT(mem_.Stat(storage::QuarantinePath("/ckpt", "job", 2)), StatusIs(absl::StatusCode::kNotFound, _));

  // What was read from disk is kept in memory now, intact (in the slot the
  // damaged copy freed); step 1's copy was left alone.
  CKPTD_ASSERT_OK(second.seg->Release(r.slot));
  EXPECT_EQ(second.seg->state(r.slot), SlotState::kKept);
  EXPECT_EQ(r.slot, *slot_of_2);
  EXPECT_THAT(KeptSlots(*second.seg), UnorderedElementsAre(Pair(*slot_of_1, 1u), Pair(*slot_of_2, 2u)));
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult again, agent.Restore(second.h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(again.step, Optional(2u));
  EXPECT_EQ(again.source, RestoreSource::kMemory);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(second, again.slot, 2));
  CKPTD_ASSERT_OK_AND_ASSIGN(st, agent.Status(second.h.trainer_id));
  EXPECT_EQ(st.memory_rejected, 1u);
  EXPECT_EQ(st.memory_restores, 1u);
  CKPTD_ASSERT_OK(second.seg->Release(again.slot));
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id));
}

TEST_F(MemoryTierTest, MemoryComesBeforeTheLocalTierWhichServesADamagedMemoryCopy) {
  CKPTD_ASSERT_OK(mem_.CreateDir("/nvme"));
  options_.local_cache = "/nvme";
  AgentCore agent(&mem_, options_);
  Started first;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &first));
  for (uint64_t step : {1u, 2u}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *first.seg, first.h, step));
  CKPTD_ASSERT_OK(agent.TrainerExited(first.h.trainer_id, /*died=*/true));
  Started second;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &second));
  ASSERT_EQ(second.h.segment, first.h.segment);
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(second.h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(2u));
  EXPECT_EQ(r.source, RestoreSource::kMemory);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(second, r.slot, 2));
  CKPTD_ASSERT_OK(second.seg->Release(r.slot));
  // Damaged in memory: the node-local copy serves it.
  ASSERT_EQ(second.seg->state(r.slot), SlotState::kKept);
  second.seg->slot_data(r.slot)[second.h.offsets[2]] ^= 0x80;
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult local, agent.Restore(second.h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(local.step, Optional(2u));
  EXPECT_EQ(local.source, RestoreSource::kLocal);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(second, local.slot, 2));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(second.h.trainer_id));
  EXPECT_EQ(st.memory_restores, 1u);
  EXPECT_EQ(st.memory_rejected, 1u);
  EXPECT_EQ(st.local_restores, 1u);
  CKPTD_ASSERT_OK(second.seg->Release(local.slot));
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id));
}

TEST_F(MemoryTierTest, AKeptCopyThatIsNotTheCommittedShardIsNotUsed) {
  AgentCore agent(&mem_, options_);
  Started first;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &first));
  for (uint64_t step : {1u, 2u}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *first.seg, first.h, step));
  CKPTD_ASSERT_OK(agent.TrainerExited(first.h.trainer_id, /*died=*/true));
  // Step 2 is written and committed again, with other bytes (another run of
  // the job, through another agent): the copy in memory, intact by its own
  // checksums, is not the shard the step committed.
  storage::CheckpointStore store(&mem_, "/ckpt");
  CKPTD_ASSERT_OK(store.RemoveStep("job", 2));
  {
    AgentCore other(&mem_, TestAgentOptions("other"));
    Started rewrite;
    ASSERT_NO_FATAL_FAILURE(Start(other, Rank("job"), &rewrite));
    ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(other, *rewrite.seg, rewrite.h, 2, 0x55));
    CKPTD_ASSERT_OK(other.TrainerExited(rewrite.h.trainer_id));
  }
  ASSERT_THAT(store.LatestCommittedStep("job"), IsOkAndHolds(Optional(2u)));

  Started second;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &second));
  ASSERT_EQ(second.h.segment, first.h.segment);
  ASSERT_THAT(KeptSlots(*second.seg), UnorderedElementsAre(Pair(_, 1u), Pair(_, 2u)));
  const std::optional<uint32_t> slot_of_1 = SlotKeeping(*second.seg, 1);
  const std::optional<uint32_t> slot_of_2 = SlotKeeping(*second.seg, 2);
  ASSERT_TRUE(slot_of_1.has_value() && slot_of_2.has_value());
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(second.h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(2u));
  EXPECT_EQ(r.source, RestoreSource::kRoot);
  // Read into the slot the stale copy freed: step 1's copy stays.
  EXPECT_EQ(r.slot, *slot_of_2);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(second, r.slot, 0x55));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(second.h.trainer_id));
  EXPECT_EQ(st.memory_restores, 0u);
  EXPECT_EQ(st.memory_rejected, 0u);  // not damaged: another shard
  CKPTD_ASSERT_OK(second.seg->Release(r.slot));
  // The committed shard is what memory keeps now.
  EXPECT_THAT(KeptSlots(*second.seg), UnorderedElementsAre(Pair(*slot_of_1, 1u), Pair(*slot_of_2, 2u)));
  CKPTD_ASSERT_OK_AND_ASSIGN(r, agent.Restore(second.h.trainer_id, absl::Seconds(10)));
  EXPECT_EQ(r.source, RestoreSource::kMemory);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(second, r.slot, 0x55));
  CKPTD_ASSERT_OK(second.seg->Release(r.slot));
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id));
}

TEST_F(MemoryTierTest, OtherBuffersGetANewSegmentAndTheParkedOneIsReleased) {
  AgentCore agent(&mem_, options_);
  Started first;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &first));
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *first.seg, first.h, 1));
  CKPTD_ASSERT_OK(agent.TrainerExited(first.h.trainer_id, /*died=*/true));
  ASSERT_EQ(agent.Memory().parked, 1u);

  // The same bytes in another shape are another model.
  TrainerRegistration reshaped = Rank("job");
  reshaped.buffers[0].clear_shape();
  reshaped.buffers[0].add_shape(1000);
  reshaped.buffers[0].add_shape(3);
  Started second;
  ASSERT_NO_FATAL_FAILURE(Start(agent, reshaped, &second));
  EXPECT_NE(second.h.segment, first.h.segment);
  const AgentCore::MemoryUsage m = agent.Memory();
  EXPECT_EQ(m.parked, 0u);
  EXPECT_EQ(m.parked_bytes, 0u);
  EXPECT_EQ(m.bytes, staging::SegmentBytes(second.h.slots, second.h.slot_bytes));
  // Its name is gone: nobody else can open the old segment.
  EXPECT_THAT(staging::StagingSegment::Open(first.h.segment), StatusIs(absl::StatusCode::kNotFound, _));
  EXPECT_TRUE(logger_.Contains("left by an exited trainer is released"));
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id));
}

TEST_F(MemoryTierTest, TheMemoryBudgetEvictsParkedSegmentsAndRefusesWhatDoesNotFit) {
  const uint64_t one = SegmentBytesOfOneTrainer();
  ASSERT_GT(one, 0u);
  options_.memory_budget_bytes = 2 * one;
  AgentCore agent(&mem_, options_);
  Started a, b, c;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("a"), &a));
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("b"), &b));
  AgentCore::MemoryUsage m = agent.Memory();
  EXPECT_EQ(m.bytes, 2 * one);
  EXPECT_EQ(m.budget, 2 * one);
  EXPECT_EQ(m.parked, 0u);
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *a.seg, a.h, 1));
  CKPTD_ASSERT_OK(agent.TrainerExited(a.h.trainer_id, /*died=*/true));
  m = agent.Memory();
  EXPECT_EQ(m.bytes, 2 * one);  // parked segments count
  EXPECT_EQ(m.parked, 1u);
  EXPECT_EQ(m.parked_bytes, one);

  // c fits once a's parked segment goes.
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("c"), &c));
  m = agent.Memory();
  EXPECT_EQ(m.bytes, 2 * one);
  EXPECT_EQ(m.parked, 0u);
  EXPECT_THAT(staging::StagingSegment::Open(a.h.segment), StatusIs(absl::StatusCode::kNotFound, _));
  EXPECT_TRUE(logger_.Contains("the staging of job a rank 0")) << ::testing::PrintToString(logger_.lines());

  // b and c hold the whole budget: d is refused at once, and nothing changes.
  EXPECT_THAT(agent.Register(Rank("d")), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("memory budget")));
  m = agent.Memory();
  EXPECT_EQ(m.bytes, 2 * one);
  EXPECT_EQ(m.parked, 0u);
  EXPECT_FALSE(agent.FindTrainer("d", 0).has_value());
  // b and c go on.
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *b.seg, b.h, 1));
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *c.seg, c.h, 1));

  // Once b exits, its parked segment makes room for d.
  CKPTD_ASSERT_OK(agent.TrainerExited(b.h.trainer_id));
  Started d;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("d"), &d));
  m = agent.Memory();
  EXPECT_EQ(m.bytes, 2 * one);
  EXPECT_EQ(m.parked, 0u);
  // a came back too late: its step is read from disk, and there is no room.
  EXPECT_THAT(agent.Register(Rank("a")), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("memory budget")));
  CKPTD_ASSERT_OK(agent.TrainerExited(c.h.trainer_id));
  CKPTD_ASSERT_OK(agent.TrainerExited(d.h.trainer_id));
  EXPECT_EQ(agent.Memory().bytes, 2 * one);
  EXPECT_EQ(agent.Memory().parked, 2u);
}

TEST_F(MemoryTierTest, TheLeastRecentlyParkedSegmentGoesFirst) {
  const uint64_t one = SegmentBytesOfOneTrainer();
  ASSERT_GT(one, 0u);
  options_.memory_budget_bytes = 3 * one;
  AgentCore agent(&mem_, options_);
  Started a, b, c, d;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("a"), &a));
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("b"), &b));
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("c"), &c));
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *b.seg, b.h, 7));
  // b exits before a: a is the more recently parked.
  CKPTD_ASSERT_OK(agent.TrainerExited(b.h.trainer_id, /*died=*/true));
  CKPTD_ASSERT_OK(agent.TrainerExited(a.h.trainer_id, /*died=*/true));
  ASSERT_EQ(agent.Memory().parked, 2u);
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("d"), &d));
  AgentCore::MemoryUsage m = agent.Memory();
  EXPECT_EQ(m.bytes, 3 * one);
  EXPECT_EQ(m.parked, 1u);
  EXPECT_EQ(m.parked_bytes, one);
  EXPECT_THAT(staging::StagingSegment::Open(b.h.segment), StatusIs(absl::StatusCode::kNotFound, _));
  CKPTD_EXPECT_OK(staging::StagingSegment::Open(a.h.segment).status());
  // a gets its segment back; b, whose segment went, no longer fits: a, c
  // and d fill the budget.
  Started a2;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("a"), &a2));
  EXPECT_EQ(a2.h.segment, a.h.segment);
  EXPECT_EQ(agent.Memory().parked, 0u);
  EXPECT_THAT(agent.Register(Rank("b")), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("memory budget")));
  for (const Started* t : {&a2, &c, &d}) CKPTD_ASSERT_OK(agent.TrainerExited(t->h.trainer_id));
}

TEST_F(MemoryTierTest, ParkedSegmentsGoAfterParkFor) {
  base::FakeClock clock;
  options_.clock = &clock;
  options_.park_for = absl::Minutes(10);
  AgentCore agent(&mem_, options_);
  Started first;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &first));
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *first.seg, first.h, 1));
  CKPTD_ASSERT_OK(agent.TrainerExited(first.h.trainer_id, /*died=*/true));
  ASSERT_EQ(agent.Memory().parked, 1u);

  clock.Advance(absl::Minutes(10) - absl::Seconds(1));
  agent.EvictIdle();
  EXPECT_EQ(agent.Memory().parked, 1u);
  clock.Advance(absl::Seconds(1));
  agent.EvictIdle();
  EXPECT_EQ(agent.Memory().parked, 0u);
  EXPECT_EQ(agent.Memory().bytes, 0u);
  EXPECT_THAT(staging::StagingSegment::Open(first.h.segment), StatusIs(absl::StatusCode::kNotFound, _));

  // The trainer that comes back after that gets a new segment and reads disk.
  Started second;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &second));
  EXPECT_NE(second.h.segment, first.h.segment);
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(second.h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(1u));
  EXPECT_EQ(r.source, RestoreSource::kRoot);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(second, r.slot, 1));
  CKPTD_ASSERT_OK(second.seg->Release(r.slot));
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id, /*died=*/true));
  ASSERT_EQ(agent.Memory().parked, 1u);

  // A registration evicts what is too old before it looks for its own.
  clock.Advance(absl::Minutes(10));
  Started third;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &third));
  EXPECT_NE(third.h.segment, second.h.segment);
  EXPECT_EQ(agent.Memory().parked, 0u);
  EXPECT_EQ(agent.Memory().bytes, staging::SegmentBytes(third.h.slots, third.h.slot_bytes));
  CKPTD_ASSERT_OK(agent.TrainerExited(third.h.trainer_id));
}

TEST_F(MemoryTierTest, SmallSegmentsAreReadyAtRegistration) {
  AgentCore agent(&mem_, options_);
  Started t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &t));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(t.h.trainer_id));
  EXPECT_EQ(st.slots, 2u);
  EXPECT_EQ(st.slots_ready, 2u);
  for (uint32_t i = 0; i < t.seg->slots(); ++i) EXPECT_EQ(t.seg->state(i), SlotState::kFree) << i;
  CKPTD_ASSERT_OK(agent.TrainerExited(t.h.trainer_id));
  EXPECT_FALSE(logger_.Contains("allocated in the background"));
}

TEST_F(MemoryTierTest, LargeSegmentsArePreparedInTheBackground) {
  options_.prepare_inline_bytes = 0;  // every segment is "large"
  AgentCore agent(&mem_, options_);
  Started t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &t));
  EXPECT_EQ(agent.Memory().bytes, staging::SegmentBytes(t.h.slots, t.h.slot_bytes));
  std::optional<PersistStatus> last;
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<PersistStatus> st = agent.Status(t.h.trainer_id);
        if (!st.ok()) return false;
        last = *st;
        return st->slots_ready == st->slots;
      },
      absl::Seconds(10), absl::Milliseconds(5)))
      << (last ? absl::StrCat(last->slots_ready, " of ", last->slots, " slots ready") : "no status");
  EXPECT_EQ(last->slots, 2u);
  EXPECT_TRUE(Eventually([&] { return logger_.Contains("2 slots of"); })) << ::testing::PrintToString(logger_.lines());
  EXPECT_TRUE(logger_.Contains("allocated in the background"));
  for (uint32_t i = 0; i < t.seg->slots(); ++i) EXPECT_EQ(t.seg->state(i), SlotState::kFree) << i;

  for (uint64_t step : {1u, 2u}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *t.seg, t.h, step));
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(t.h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(2u));
  EXPECT_EQ(r.source, RestoreSource::kMemory);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(t, r.slot, 2));
  CKPTD_ASSERT_OK(t.seg->Release(r.slot));

  // Parked and taken over, it is not prepared again: its step is still there.
  CKPTD_ASSERT_OK(agent.TrainerExited(t.h.trainer_id, /*died=*/true));
  Started again;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &again));
  EXPECT_EQ(again.h.segment, t.h.segment);
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r2, agent.Restore(again.h.trainer_id, absl::Seconds(10)));
  EXPECT_EQ(r2.source, RestoreSource::kMemory);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(again, r2.slot, 2));
  CKPTD_ASSERT_OK(again.seg->Release(r2.slot));
  CKPTD_ASSERT_OK(agent.TrainerExited(again.h.trainer_id));
}

// A job of two ranks: both persist `committed`, which commits; then rank 0
// alone persists `committed + 1` before the job goes down (rank 1 died
// first), so that step never commits.
void PersistACommittedStepAndANewerUncommittedOne(AgentCore& agent, std::vector<Started>& ranks, uint64_t committed,
                                                  storage::MemFileSystem* mem) {
  for (uint32_t r = 0; r < ranks.size(); ++r) {
    ASSERT_NO_FATAL_FAILURE(
        SnapshotAndWait(agent, *ranks[r].seg, ranks[r].h, committed, RankFill(committed, r)));
  }
  storage::CheckpointStore store(mem, "/ckpt");
  ASSERT_THAT(store.LatestCommittedStep("job"), IsOkAndHolds(Optional(committed)));
  ASSERT_NO_FATAL_FAILURE(
      SnapshotAndWait(agent, *ranks[0].seg, ranks[0].h, committed + 1, RankFill(committed + 1, 0)));
  ASSERT_THAT(store.LatestCommittedStep("job"), IsOkAndHolds(Optional(committed)));
}

// Every trainer of `ranks` dies, and registers again: each gets its parked
// segment back.
void RestartAll(AgentCore& agent, std::vector<Started>& ranks) {
  std::vector<std::string> segments;
  for (const Started& t : ranks) {
    segments.push_back(t.h.segment);
    CKPTD_ASSERT_OK(agent.TrainerExited(t.h.trainer_id, /*died=*/true));
  }
  EXPECT_EQ(agent.Memory().parked, ranks.size());
  for (uint32_t r = 0; r < ranks.size(); ++r) {
    const TrainerRegistration reg = ranks[r].reg;
    ASSERT_NO_FATAL_FAILURE(Start(agent, reg, &ranks[r]));
    EXPECT_EQ(ranks[r].h.segment, segments[r]) << "rank " << r;
  }
}

TEST_F(MemoryTierTest, ACommittedStepBehindANewerUncommittedOneStillRestoresFromMemory) {
  AgentCore agent(&mem_, options_);
  std::vector<Started> ranks(2);
  for (uint32_t r = 0; r < 2; ++r) ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job", r, 2), &ranks[r]));
  ASSERT_NO_FATAL_FAILURE(PersistACommittedStepAndANewerUncommittedOne(agent, ranks, 2, &mem_));
  // Rank 0 keeps both its steps: step 3, which never committed, did not push
  // step 2 out of memory.
  EXPECT_THAT(KeptSlots(*ranks[0].seg), UnorderedElementsAre(Pair(_, 2u), Pair(_, 3u)));
  EXPECT_THAT(KeptSlots(*ranks[1].seg), UnorderedElementsAre(Pair(_, 2u)));
  std::vector<std::optional<uint32_t>> slot_of_2;
  for (const Started& t : ranks) slot_of_2.push_back(SlotKeeping(*t.seg, 2));
  const std::optional<uint32_t> slot_of_3 = SlotKeeping(*ranks[0].seg, 3);
  ASSERT_TRUE(slot_of_2[0] && slot_of_2[1] && slot_of_3);

  ASSERT_NO_FATAL_FAILURE(RestartAll(agent, ranks));
  EXPECT_TRUE(logger_.Contains("job job rank 0 registered again: its staging"))
      << ::testing::PrintToString(logger_.lines());
  EXPECT_TRUE(logger_.Contains("is taken over, steps 2, 3 in memory")) << ::testing::PrintToString(logger_.lines());
  std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll(agent, ranks);
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_THAT(results[r], IsOk()) << "rank " << r;
    EXPECT_THAT(results[r]->step, Optional(2u)) << "rank " << r;
    EXPECT_EQ(results[r]->source, RestoreSource::kMemory) << "rank " << r;
    EXPECT_EQ(results[r]->slot, *slot_of_2[r]) << "rank " << r;
    ASSERT_NO_FATAL_FAILURE(ExpectHolds(ranks[r], results[r]->slot, RankFill(2, r))) << "rank " << r;
    CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(ranks[r].h.trainer_id));
    EXPECT_EQ(st.memory_restores, 1u) << "rank " << r;
    EXPECT_EQ(st.memory_rejected, 0u) << "rank " << r;
    EXPECT_TRUE(logger_.Contains(absl::StrCat("job job rank ", r, ": step 2 read from the agent's memory")))
        << "rank " << r;
  }
  // The job went back to step 2: rank 0's step 3, of a timeline that is
  // gone, no longer holds memory.
  EXPECT_EQ(ranks[0].seg->state(*slot_of_3), SlotState::kFree);
  for (uint32_t r = 0; r < 2; ++r) CKPTD_ASSERT_OK(ranks[r].seg->Release(results[r]->slot));
  for (uint32_t r = 0; r < 2; ++r) {
    EXPECT_THAT(KeptSlots(*ranks[r].seg), UnorderedElementsAre(Pair(*slot_of_2[r], 2u))) << "rank " << r;
  }

  // The next restart finds both copies in memory again.
  results = RestoreAll(agent, ranks);
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_THAT(results[r], IsOk()) << "rank " << r;
    EXPECT_THAT(results[r]->step, Optional(2u)) << "rank " << r;
    EXPECT_EQ(results[r]->source, RestoreSource::kMemory) << "rank " << r;
    ASSERT_NO_FATAL_FAILURE(ExpectHolds(ranks[r], results[r]->slot, RankFill(2, r))) << "rank " << r;
    CKPTD_ASSERT_OK(ranks[r].seg->Release(results[r]->slot));
  }
  for (const Started& t : ranks) CKPTD_ASSERT_OK(agent.TrainerExited(t.h.trainer_id));
}

TEST_F(MemoryTierTest, ACommittedStepWhoseSlotTheTrainerTookBackIsReadFromDisk) {
  AgentCore agent(&mem_, options_);
  std::vector<Started> ranks(2);
  for (uint32_t r = 0; r < 2; ++r) ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job", r, 2), &ranks[r]));
  ASSERT_NO_FATAL_FAILURE(PersistACommittedStepAndANewerUncommittedOne(agent, ranks, 2, &mem_));
  ASSERT_THAT(KeptSlots(*ranks[0].seg), UnorderedElementsAre(Pair(_, 2u), Pair(_, 3u)));
  const std::optional<uint32_t> slot_of_2 = SlotKeeping(*ranks[0].seg, 2);
  const std::optional<uint32_t> slot_of_3 = SlotKeeping(*ranks[0].seg, 3);
  ASSERT_TRUE(slot_of_2 && slot_of_3);
  // Rank 0's trainer starts another snapshot: no slot is free, so it takes
  // back the kept slot with the lowest step, step 2's; it dies before
  // publishing.
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t filling, ranks[0].seg->AcquireForFill(absl::ZeroDuration()));
  EXPECT_EQ(filling, *slot_of_2);
  EXPECT_THAT(KeptSlots(*ranks[0].seg), UnorderedElementsAre(Pair(*slot_of_3, 3u)));
  std::memset(ranks[0].seg->slot_data(filling), 0xee, 4096);
  CKPTD_ASSERT_OK(ranks[0].seg->Abandon(filling));

  ASSERT_NO_FATAL_FAILURE(RestartAll(agent, ranks));
  std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll(agent, ranks);
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_THAT(results[r], IsOk()) << "rank " << r;
    EXPECT_THAT(results[r]->step, Optional(2u)) << "rank " << r;
    ASSERT_NO_FATAL_FAILURE(ExpectHolds(ranks[r], results[r]->slot, RankFill(2, r))) << "rank " << r;
  }
  // Rank 0's copy of step 2 is gone: it reads the committed shard from disk
  // (into the slot that is free, not step 3's); rank 1 still has its copy.
  EXPECT_EQ(results[0]->source, RestoreSource::kRoot);
  EXPECT_EQ(results[0]->slot, *slot_of_2);
  EXPECT_EQ(results[1]->source, RestoreSource::kMemory);
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st0, agent.Status(ranks[0].h.trainer_id));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st1, agent.Status(ranks[1].h.trainer_id));
  EXPECT_EQ(st0.memory_restores, 0u);
  EXPECT_EQ(st0.memory_rejected, 0u);  // not damaged: just not there any more
  EXPECT_EQ(st1.memory_restores, 1u);
  // Step 3 went with the timeline the job left; step 2 is kept by both now.
  EXPECT_EQ(ranks[0].seg->state(*slot_of_3), SlotState::kFree);
  for (uint32_t r = 0; r < 2; ++r) CKPTD_ASSERT_OK(ranks[r].seg->Release(results[r]->slot));
  for (uint32_t r = 0; r < 2; ++r) {
    EXPECT_THAT(KeptSlots(*ranks[r].seg), UnorderedElementsAre(Pair(_, 2u))) << "rank " << r;
  }
  results = RestoreAll(agent, ranks);
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_THAT(results[r], IsOk()) << "rank " << r;
    EXPECT_EQ(results[r]->source, RestoreSource::kMemory) << "rank " << r;
    ASSERT_NO_FATAL_FAILURE(ExpectHolds(ranks[r], results[r]->slot, RankFill(2, r))) << "rank " << r;
    CKPTD_ASSERT_OK(ranks[r].seg->Release(results[r]->slot));
  }
  for (const Started& t : ranks) CKPTD_ASSERT_OK(agent.TrainerExited(t.h.trainer_id));
}

TEST_F(MemoryTierTest, EveryPersistedStepIsKeptUntilATrainerNeedsItsSlot) {
  options_.slots = 3;
  AgentCore agent(&mem_, options_);
  Started t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &t));
  ASSERT_EQ(t.seg->slots(), 3u);
  for (uint64_t step : {1u, 2u, 3u}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *t.seg, t.h, step));
  ASSERT_THAT(KeptSlots(*t.seg), UnorderedElementsAre(Pair(_, 1u), Pair(_, 2u), Pair(_, 3u)));
  const std::optional<uint32_t> slot_of_1 = SlotKeeping(*t.seg, 1);
  const std::optional<uint32_t> slot_of_2 = SlotKeeping(*t.seg, 2);
  const std::optional<uint32_t> slot_of_3 = SlotKeeping(*t.seg, 3);
  ASSERT_TRUE(slot_of_1 && slot_of_2 && slot_of_3);

  // No slot is free: the next snapshot takes the oldest step's slot.
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *t.seg, t.h, 4));
  EXPECT_THAT(KeptSlots(*t.seg),
              UnorderedElementsAre(Pair(*slot_of_2, 2u), Pair(*slot_of_3, 3u), Pair(*slot_of_1, 4u)));
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(t, *slot_of_1, 4));
  // And the one after that, step 2's.
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t filling, t.seg->AcquireForFill(absl::ZeroDuration()));
  EXPECT_EQ(filling, *slot_of_2);
  CKPTD_ASSERT_OK(t.seg->Abandon(filling));
  EXPECT_THAT(KeptSlots(*t.seg), UnorderedElementsAre(Pair(*slot_of_3, 3u), Pair(*slot_of_1, 4u)));

  // The newest step restores from memory.
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(t.h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(4u));
  EXPECT_EQ(r.source, RestoreSource::kMemory);
  EXPECT_EQ(r.slot, *slot_of_1);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(t, r.slot, 4));
  CKPTD_ASSERT_OK(t.seg->Release(r.slot));
  EXPECT_THAT(KeptSlots(*t.seg), UnorderedElementsAre(Pair(*slot_of_3, 3u), Pair(*slot_of_1, 4u)));
  CKPTD_ASSERT_OK(agent.TrainerExited(t.h.trainer_id));
}

TEST_F(MemoryTierTest, ARestoreThatGoesBackDropsKeptCopiesOfNewerSteps) {
  options_.slots = 3;
  options_.keep_last = 3;  // step 1 stays on disk: the job goes back to it
  AgentCore agent(&mem_, options_);
  // The same process registers twice (it lost its connection): both live.
  TrainerRegistration reg = Rank("job");
  reg.pid = 4242;
  Started old;
  ASSERT_NO_FATAL_FAILURE(Start(agent, reg, &old));
  for (uint64_t step : {1u, 2u, 3u}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *old.seg, old.h, step));
  ASSERT_THAT(KeptSlots(*old.seg), UnorderedElementsAre(Pair(_, 1u), Pair(_, 2u), Pair(_, 3u)));
  const std::optional<uint32_t> slot_of_1 = SlotKeeping(*old.seg, 1);
  const std::optional<uint32_t> slot_of_2 = SlotKeeping(*old.seg, 2);
  const std::optional<uint32_t> slot_of_3 = SlotKeeping(*old.seg, 3);
  ASSERT_TRUE(slot_of_1 && slot_of_2 && slot_of_3);
  Started current;
  ASSERT_NO_FATAL_FAILURE(Start(agent, reg, &current));
  ASSERT_NE(current.h.segment, old.h.segment);
  // Step 3 goes bad on disk (found by a scrub): the job goes back to step 2.
  storage::CheckpointStore store(&mem_, "/ckpt");
  CKPTD_ASSERT_OK(store.QuarantineStep("job", 3, "test"));
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(current.h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(2u));
  EXPECT_EQ(r.source, RestoreSource::kRoot);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(current, r.slot, 2));
  // Step 3 of the timeline that is gone no longer holds memory; steps 2 (the
  // one restored) and 1 (below it) stay kept.
  EXPECT_EQ(old.seg->state(*slot_of_3), SlotState::kFree);
  EXPECT_THAT(KeptSlots(*old.seg), UnorderedElementsAre(Pair(*slot_of_1, 1u), Pair(*slot_of_2, 2u)));
  CKPTD_ASSERT_OK(current.seg->Release(r.slot));
  EXPECT_THAT(KeptSlots(*current.seg), UnorderedElementsAre(Pair(r.slot, 2u)));

  // Further back: step 2 goes bad too, and the job restores step 1. Kept
  // copies above it go, in both segments; step 1's stays.
  CKPTD_ASSERT_OK(store.QuarantineStep("job", 2, "test"));
  CKPTD_ASSERT_OK_AND_ASSIGN(r, agent.Restore(current.h.trainer_id, absl::Seconds(10)));
  EXPECT_THAT(r.step, Optional(1u));
  EXPECT_EQ(r.source, RestoreSource::kRoot);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(current, r.slot, 1));
  EXPECT_THAT(KeptSlots(*old.seg), UnorderedElementsAre(Pair(*slot_of_1, 1u)));
  CKPTD_ASSERT_OK(current.seg->Release(r.slot));
  EXPECT_THAT(KeptSlots(*current.seg), UnorderedElementsAre(Pair(r.slot, 1u)));
  CKPTD_ASSERT_OK(agent.TrainerExited(old.h.trainer_id));
  CKPTD_ASSERT_OK(agent.TrainerExited(current.h.trainer_id));
}

TEST_F(MemoryTierTest, WithoutKeepInMemoryNothingIsKeptOrHandedOn) {
  options_.keep_in_memory = false;
  AgentCore agent(&mem_, options_);
  Started first;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &first));
  for (uint64_t step : {1u, 2u}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *first.seg, first.h, step));
  for (uint32_t i = 0; i < first.seg->slots(); ++i) EXPECT_EQ(first.seg->state(i), SlotState::kFree) << i;
  CKPTD_ASSERT_OK(agent.TrainerExited(first.h.trainer_id, /*died=*/true));
  EXPECT_EQ(agent.Memory().parked, 0u);
  EXPECT_EQ(agent.Memory().bytes, 0u);
  EXPECT_THAT(staging::StagingSegment::Open(first.h.segment), StatusIs(absl::StatusCode::kNotFound, _));

  Started second;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &second));
  EXPECT_NE(second.h.segment, first.h.segment);
  for (int i = 0; i < 2; ++i) {
    CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(second.h.trainer_id, absl::Seconds(10)));
    EXPECT_THAT(r.step, Optional(2u));
    EXPECT_EQ(r.source, RestoreSource::kRoot) << i;
    ASSERT_NO_FATAL_FAILURE(ExpectHolds(second, r.slot, 2));
    CKPTD_ASSERT_OK(second.seg->Release(r.slot));
    EXPECT_EQ(second.seg->state(r.slot), SlotState::kFree);
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(second.h.trainer_id));
  EXPECT_EQ(st.memory_restores, 0u);
  EXPECT_EQ(st.memory_rejected, 0u);
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id));
}

}  // namespace
}  // namespace ckptd::agent
