// The agent's memory tier (AgentCore): persisted steps kept in their staging
// slots, restores served from them (and checked against the committed
// shard's checksums), segments parked for a restarted trainer, the memory
// budget, the eviction of idle parked segments and the background
// preparation of large segments.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "agent/agent_core.h"
#include "agent/agent_core_internal.h"
#include "agent/testing_agent_harness.h"
#include "base/clock.h"
#include "base/testing/capturing_logger.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "format/tensor_size.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/restore_source.h"
#include "staging/staging.h"
#include "storage/fault_injection_file_system.h"
#include "storage/layout.h"
#include "storage/mem_file_system.h"
#include "storage/shard_index.h"
#include "storage/store.h"

namespace ckptd::agent {

// Reads a trainer's lifecycle state (AgentCore::MoveLocked) for the tests.
class AgentCoreLifecycleProbe {
 public:
  // nullopt: listed nowhere (retired, or never registered).
  static std::optional<internal::TrainerState> StateOf(AgentCore& agent, uint64_t trainer_id) {
    absl::MutexLock l(&agent.mu_);
    if (auto it = agent.trainers_.find(trainer_id); it != agent.trainers_.end()) return it->second->state;
    for (const std::shared_ptr<AgentCore::Trainer>& t : agent.exiting_) {
      if (t->id == trainer_id) return t->state;
    }
    return std::nullopt;
  }
};

namespace {

using ::ckptd::testing::Eventually;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::StatusIs;
using staging::SlotState;
using ::testing::_;
using ::testing::Each;
using ::testing::HasSubstr;
using ::testing::Optional;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;
using ::testing::UnorderedElementsAreArray;

// Rank `rank` of a job of `world` ranks, all on this node: buffers of several
// 4096-byte blocks each (TestAgentOptions writes 4096-byte blocks).
TrainerRegistration Rank(const std::string& job, uint32_t rank = 0, uint32_t world = 1) {
  return {.job = job,
          .rank = rank,
          .world_size = world,
          .local_world_size = world,
          .buffers = {Buffer("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 3000),
                      Buffer("adam", ckptd::v1::OPTIMIZER, ckptd::v1::FLOAT32, 6000),
                      Buffer("cursor", ckptd::v1::DATA_CURSOR, ckptd::v1::BYTES, 24)}};
}

// What SnapshotAndWait() fills `step` with unless told otherwise.
uint8_t StepFill(uint64_t step) { return static_cast<uint8_t>(step & 0xff); }

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

// "job <job> rank <rank>": whose check failed, in a helper's failures.
std::string Who(const Started& t) { return absl::StrCat("job ", t.reg.job, " rank ", t.reg.rank); }

// The bytes of `t`'s segment.
uint64_t SegmentBytes(const Started& t) { return staging::SegmentBytes(t.h.slots, t.h.slot_bytes); }

// `t`'s trainer snapshots each of `steps` (filled with StepFill()) and waits
// until it is persisted.
void Persist(AgentCore& agent, const Started& t, std::initializer_list<uint64_t> steps) {
  for (uint64_t step : steps) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *t.seg, t.h, step));
}

// `t`'s trainer dies: the agent parks its segment, one more parked than
// before.
void Dies(AgentCore& agent, const Started& t) {
  const size_t parked = agent.Memory().parked;
  CKPTD_ASSERT_OK(agent.TrainerExited(t.h.trainer_id, /*died=*/true));
  ASSERT_EQ(agent.Memory().parked, parked + 1) << Who(t) << ": its segment is not parked";
}

// The trainer that left `old` registers again with `reg`: a new trainer,
// which takes over the segment `old` left parked.
void TakeOver(AgentCore& agent, const Started& old, const TrainerRegistration& reg, Started* out) {
  ASSERT_NO_FATAL_FAILURE(Start(agent, reg, out));
  EXPECT_NE(out->h.trainer_id, old.h.trainer_id) << Who(old);
  ASSERT_EQ(out->h.segment, old.h.segment) << Who(old) << ": the parked segment was not taken over";
}
// ... with the same buffers as before.
void TakeOver(AgentCore& agent, const Started& old, Started* out) { TakeOver(agent, old, old.reg, out); }

// `old`'s trainer dies and comes back with the same buffers: the new one,
// `out`, takes over its segment.
void Restart(AgentCore& agent, const Started& old, Started* out) {
  ASSERT_NO_FATAL_FAILURE(Dies(agent, old));
  ASSERT_NO_FATAL_FAILURE(TakeOver(agent, old, out));
}

// Every byte of every registered buffer in `slot` is `fill`.
void ExpectHolds(const Started& t, uint32_t slot, uint8_t fill) {
  ASSERT_EQ(t.h.offsets.size(), t.reg.buffers.size());
  for (size_t i = 0; i < t.reg.buffers.size(); ++i) {
    CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t length, format::TensorByteLength(t.reg.buffers[i]));
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

// How a restore source reads in a failure.
absl::string_view SourceName(RestoreSource source) {
  const absl::string_view name = protocol::RestoreSourceName(RestoreSourceProto(source));
  return name.empty() ? "none" : name;
}

// `r`, what a restore of `t` returned: `step`, read from `source`, in a slot
// where every byte of every buffer is `fill`. A failure names file:line, the
// test's line that asked.
void ExpectRestored(const Started& t, const absl::StatusOr<RestoreResult>& r, uint64_t step, RestoreSource source,
                    uint8_t fill, const char* file, int line) {
  ::testing::ScopedTrace trace(file, line, Who(t));
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->step, Optional(step));
  EXPECT_EQ(r->source, source) << "read from " << SourceName(r->source) << ", not " << SourceName(source);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(t, r->slot, fill));
}

// `t`'s trainer restores, as ExpectRestored() says; the slot, out->slot,
// stays RESTORED until the trainer releases it.
void ExpectRestore(AgentCore& agent, const Started& t, uint64_t step, RestoreSource source, uint8_t fill,
                   RestoreResult* out, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  absl::StatusOr<RestoreResult> r = agent.Restore(t.h.trainer_id, absl::Seconds(10));
  ASSERT_NO_FATAL_FAILURE(ExpectRestored(t, r, step, source, fill, file, line));
  *out = *std::move(r);
}
void ExpectRestore(AgentCore& agent, const Started& t, uint64_t step, RestoreSource source, RestoreResult* out,
                   const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ExpectRestore(agent, t, step, source, StepFill(step), out, file, line);
}

// ExpectRestore(), then the trainer copies the step out and releases the
// slot (which *slot, where given, says).
void ExpectRestoreAndRelease(AgentCore& agent, const Started& t, uint64_t step, RestoreSource source, uint8_t fill,
                             uint32_t* slot = nullptr, const char* file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
  RestoreResult r;
  ASSERT_NO_FATAL_FAILURE(ExpectRestore(agent, t, step, source, fill, &r, file, line));
  CKPTD_ASSERT_OK(t.seg->Release(r.slot)) << Who(t);
  if (slot != nullptr) *slot = r.slot;
}
void ExpectRestoreAndRelease(AgentCore& agent, const Started& t, uint64_t step, RestoreSource source,
                             uint32_t* slot = nullptr, const char* file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
  ExpectRestoreAndRelease(agent, t, step, source, StepFill(step), slot, file, line);
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

// RestoreAll(): rank r gets `step`, read from sources[r], holding its own
// bytes (RankFill()); then every rank copies it out and releases its slot
// (which slots[r], where given, says).
void RestoreAllAndRelease(AgentCore& agent, const std::vector<Started>& ranks, uint64_t step,
                          const std::vector<RestoreSource>& sources, std::vector<uint32_t>* slots = nullptr,
                          const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ASSERT_EQ(sources.size(), ranks.size());
  const std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll(agent, ranks);
  for (uint32_t r = 0; r < ranks.size(); ++r) {
    ASSERT_NO_FATAL_FAILURE(ExpectRestored(ranks[r], results[r], step, sources[r], RankFill(step, r), file, line));
  }
  if (slots != nullptr) slots->clear();
  for (uint32_t r = 0; r < ranks.size(); ++r) {
    CKPTD_ASSERT_OK(ranks[r].seg->Release(results[r]->slot)) << Who(ranks[r]);
    if (slots != nullptr) slots->push_back(results[r]->slot);
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

// Asserts that `seg` keeps `steps` in memory and no other, each in a slot of
// its own; *slot_of: step -> the slot that keeps it.
void ExpectKeepsOnly(const staging::StagingSegment& seg, const std::vector<uint64_t>& steps,
                     std::map<uint64_t, uint32_t>* slot_of) {
  std::vector<::testing::Matcher<std::pair<uint32_t, uint64_t>>> each_step;
  for (uint64_t step : steps) each_step.push_back(Pair(_, step));
  const std::vector<std::pair<uint32_t, uint64_t>> kept = KeptSlots(seg);
  ASSERT_THAT(kept, UnorderedElementsAreArray(each_step));
  slot_of->clear();
  for (const auto& [slot, step] : kept) (*slot_of)[step] = slot;
}

// The state of every slot of `seg`.
std::vector<SlotState> SlotStates(const staging::StagingSegment& seg) {
  std::vector<SlotState> states;
  for (uint32_t i = 0; i < seg.slots(); ++i) states.push_back(seg.state(i));
  return states;
}

// A trainer's PersistStatus: `restores` restores served from the agent's
// memory, and `rejected` copies there found damaged.
MATCHER_P2(MemoryRestores, restores, rejected,
           absl::StrCat(negation ? "not " : "", restores, " restores from memory, ", rejected, " rejected")) {
  *result_listener << arg.memory_restores << " restores from memory, " << arg.memory_rejected << " rejected";
  return arg.memory_restores == static_cast<uint64_t>(restores) &&
         arg.memory_rejected == static_cast<uint64_t>(rejected);
}

// The agent's MemoryUsage: `bytes` in all, `parked` segments parked.
MATCHER_P2(UsesMemory, bytes, parked,
           absl::StrCat(negation ? "not " : "", bytes, " bytes in all, ", parked, " segments parked")) {
  *result_listener << arg.bytes << " bytes in all, " << arg.parked << " segments parked";
  return arg.bytes == static_cast<uint64_t>(bytes) && arg.parked == static_cast<size_t>(parked);
}

// A segment's name that opens no segment any more: the agent released it.
MATCHER(IsGone, negation ? "names a segment" : "names no segment any more") {
  const absl::Status opened = staging::StagingSegment::Open(arg).status();
  *result_listener << "opening it: " << opened;
  return absl::IsNotFound(opened);
}

// What Register() answers when the new segment does not fit the memory
// budget.
auto RefusedForTheBudget() { return StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("memory budget")); }

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

  // Some line the agent logged contains `text`.
  void ExpectLogged(absl::string_view text) {
    EXPECT_TRUE(logger_.Contains(text)) << "no line logged contains \"" << text
                                        << "\": " << ::testing::PrintToString(logger_.lines());
  }

  storage::MemFileSystem mem_;
  ckptd::testing::CapturingLogger logger_;
  AgentOptions options_ = TestAgentOptions("memory");
};

TEST_F(MemoryTierTest, ARestartedTrainerGetsItsSegmentBackAndRestoresFromMemory) {
  AgentCore agent(&mem_, options_);
  Started first;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &first));
  ASSERT_NO_FATAL_FAILURE(Persist(agent, first, {1, 2}));
  // Every persisted step stays in memory, one per slot: the newest may never
  // commit, and the one before must still be restorable.
  ASSERT_THAT(KeptSlots(*first.seg), UnorderedElementsAre(Pair(_, 1u), Pair(_, 2u)));
  ASSERT_NO_FATAL_FAILURE(Dies(agent, first));
  EXPECT_EQ(agent.Memory().parked, 1u);
  EXPECT_EQ(agent.Memory().parked_bytes, SegmentBytes(first));

  Started second;
  ASSERT_NO_FATAL_FAILURE(TakeOver(agent, first, &second));
  EXPECT_THAT(agent.Memory(), UsesMemory(SegmentBytes(second), 0u));
  ExpectLogged("job job rank 0 registered again");
  ExpectLogged("is taken over, steps 1, 2 in memory");
  std::map<uint64_t, uint32_t> slot_of;
  ASSERT_NO_FATAL_FAILURE(ExpectKeepsOnly(*second.seg, {1, 2}, &slot_of));

  RestoreResult r;
  ASSERT_NO_FATAL_FAILURE(ExpectRestore(agent, second, 2, RestoreSource::kMemory, &r));
  EXPECT_EQ(r.slot, slot_of[2]);
  EXPECT_EQ(second.seg->state(r.slot), SlotState::kRestored);
  EXPECT_THAT(agent.Status(second.h.trainer_id), IsOkAndHolds(MemoryRestores(1, 0)));
  ExpectLogged("job job rank 0: step 2 read from the agent's memory");

  // Copied out, the step stays in memory (and so does step 1, below it): the
  // next restore reads it again.
  CKPTD_ASSERT_OK(second.seg->Release(r.slot));
  EXPECT_EQ(second.seg->state(r.slot), SlotState::kKept);
  EXPECT_THAT(KeptSlots(*second.seg), UnorderedElementsAre(Pair(slot_of[1], 1u), Pair(r.slot, 2u)));
  ASSERT_NO_FATAL_FAILURE(ExpectRestoreAndRelease(agent, second, 2, RestoreSource::kMemory));
  EXPECT_THAT(agent.Status(second.h.trainer_id), IsOkAndHolds(MemoryRestores(2, 0)));

  // Training goes on in the same segment: no slot is free, so the next
  // snapshot takes step 1's slot, and steps 2 and 3 are kept.
  ASSERT_NO_FATAL_FAILURE(Persist(agent, second, {3}));
  EXPECT_THAT(KeptSlots(*second.seg), UnorderedElementsAre(Pair(slot_of[2], 2u), Pair(slot_of[1], 3u)));
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id));
}

TEST_F(MemoryTierTest, ATrainerOnAnotherDeviceStillGetsTheParkedSegment) {
  AgentCore agent(&mem_, options_);
  TrainerRegistration on_gpu0 = Rank("job");
  on_gpu0.buffers[0].mutable_device()->set_kind(ckptd::v1::Device::CUDA);
  on_gpu0.buffers[0].mutable_device()->set_index(0);
  Started first;
  ASSERT_NO_FATAL_FAILURE(Start(agent, on_gpu0, &first));
  ASSERT_NO_FATAL_FAILURE(Persist(agent, first, {5}));
  ASSERT_NO_FATAL_FAILURE(Dies(agent, first));

  TrainerRegistration on_gpu3 = on_gpu0;
  on_gpu3.buffers[0].mutable_device()->set_index(3);
  Started second;
  ASSERT_NO_FATAL_FAILURE(TakeOver(agent, first, on_gpu3, &second));
  ASSERT_NO_FATAL_FAILURE(ExpectRestoreAndRelease(agent, second, 5, RestoreSource::kMemory));
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id));
}

TEST_F(MemoryTierTest, ADamagedMemoryCopyIsReadFromDiskInstead) {
  AgentCore agent(&mem_, options_);
  Started first, second;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &first));
  ASSERT_NO_FATAL_FAILURE(Persist(agent, first, {1, 2}));
  ASSERT_NO_FATAL_FAILURE(Restart(agent, first, &second));
  // A byte of the kept copy of step 2 goes bad (a stray write of the trainer).
  std::map<uint64_t, uint32_t> slot_of;
  ASSERT_NO_FATAL_FAILURE(ExpectKeepsOnly(*second.seg, {1, 2}, &slot_of));
  second.seg->slot_data(slot_of[2])[second.h.offsets[1] + 5000] ^= 0x01;

  RestoreResult r;
  ASSERT_NO_FATAL_FAILURE(ExpectRestore(agent, second, 2, RestoreSource::kRoot, &r));
  EXPECT_THAT(agent.Status(second.h.trainer_id), IsOkAndHolds(MemoryRestores(0, 1)));
  ExpectLogged("job job rank 0: the copy of step 2 in the agent's memory is damaged");
  ExpectLogged("buffer 'adam' bytes 4096..8192 do not match their checksum");
  // The step is not quarantined: the disk copy was intact.
  EXPECT_THAT(mem_.Stat(storage::QuarantinePath("/ckpt", "job", 2)), StatusIs(absl::StatusCode::kNotFound, _));

  // What was read from disk is kept in memory now, intact (in the slot the
  // damaged copy freed); step 1's copy was left alone.
  CKPTD_ASSERT_OK(second.seg->Release(r.slot));
  EXPECT_EQ(second.seg->state(r.slot), SlotState::kKept);
  EXPECT_EQ(r.slot, slot_of[2]);
  EXPECT_THAT(KeptSlots(*second.seg), UnorderedElementsAre(Pair(slot_of[1], 1u), Pair(slot_of[2], 2u)));
  ASSERT_NO_FATAL_FAILURE(ExpectRestoreAndRelease(agent, second, 2, RestoreSource::kMemory));
  EXPECT_THAT(agent.Status(second.h.trainer_id), IsOkAndHolds(MemoryRestores(1, 1)));
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id));
}

// The trainer found the copy it was handed damaged (its own check while
// copying out): the same step is read again, from disk. A reread of any other
// step than the one the last restore handed over is refused, changing nothing.
TEST_F(MemoryTierTest, AReReadIsOfTheStepTheLastRestoreHandedOverAndComesFromDisk) {
  AgentCore agent(&mem_, options_);
  Started first, second;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &first));
  ASSERT_NO_FATAL_FAILURE(Persist(agent, first, {1, 2}));
  ASSERT_NO_FATAL_FAILURE(Restart(agent, first, &second));
  RestoreOptions reread;
  reread.reread_step = 2;
  reread.reread_problem = "buffer 'adam' bytes 0..4096 do not match their checksum";
  // Nothing was handed over yet.
  EXPECT_THAT(agent.Restore(second.h.trainer_id, reread),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("handed over no step")));
  RestoreOptions verified;
  verified.client_verifies = true;
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(second.h.trainer_id, verified));
  EXPECT_THAT(r.step, Optional(2u));
  EXPECT_EQ(r.source, RestoreSource::kMemory);
  EXPECT_FALSE(r.verify.empty());  // the trainer checks the blocks
  CKPTD_ASSERT_OK(second.seg->Release(r.slot));
  reread.reread_step = 1;
  EXPECT_THAT(agent.Restore(second.h.trainer_id, reread),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("handed over step 2")));
  EXPECT_THAT(agent.Status(second.h.trainer_id), IsOkAndHolds(MemoryRestores(1, 0)));
  reread.reread_step = 2;
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult again, agent.Restore(second.h.trainer_id, reread));
  ASSERT_NO_FATAL_FAILURE(ExpectRestored(second, again, 2, RestoreSource::kRoot, StepFill(2), __FILE__, __LINE__));
  EXPECT_TRUE(again.verify.empty());  // the agent read it from disk, verified
  EXPECT_THAT(agent.Status(second.h.trainer_id), IsOkAndHolds(MemoryRestores(1, 1)));
  ExpectLogged("the copy of step 2 in the agent's memory failed the trainer's check (buffer 'adam' bytes 0..4096");
  CKPTD_ASSERT_OK(second.seg->Release(again.slot));
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id));
}

TEST_F(MemoryTierTest, MemoryComesBeforeTheLocalTierWhichServesADamagedMemoryCopy) {
  CKPTD_ASSERT_OK(mem_.CreateDir("/nvme"));
  options_.local_cache = "/nvme";
  AgentCore agent(&mem_, options_);
  Started first, second;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &first));
  ASSERT_NO_FATAL_FAILURE(Persist(agent, first, {1, 2}));
  ASSERT_NO_FATAL_FAILURE(Restart(agent, first, &second));
  uint32_t slot = 0;
  ASSERT_NO_FATAL_FAILURE(ExpectRestoreAndRelease(agent, second, 2, RestoreSource::kMemory, &slot));
  // Damaged in memory: the node-local copy serves it.
  ASSERT_EQ(second.seg->state(slot), SlotState::kKept);
  second.seg->slot_data(slot)[second.h.offsets[2]] ^= 0x80;
  ASSERT_NO_FATAL_FAILURE(ExpectRestoreAndRelease(agent, second, 2, RestoreSource::kLocal));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(second.h.trainer_id));
  EXPECT_THAT(st, MemoryRestores(1, 1));
  EXPECT_EQ(st.local_restores, 1u);
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id));
}

TEST_F(MemoryTierTest, AKeptCopyThatIsNotTheCommittedShardIsNotUsed) {
  AgentCore agent(&mem_, options_);
  Started first;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &first));
  ASSERT_NO_FATAL_FAILURE(Persist(agent, first, {1, 2}));
  ASSERT_NO_FATAL_FAILURE(Dies(agent, first));
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
  ASSERT_NO_FATAL_FAILURE(TakeOver(agent, first, &second));
  std::map<uint64_t, uint32_t> slot_of;
  ASSERT_NO_FATAL_FAILURE(ExpectKeepsOnly(*second.seg, {1, 2}, &slot_of));
  RestoreResult r;
  ASSERT_NO_FATAL_FAILURE(ExpectRestore(agent, second, 2, RestoreSource::kRoot, 0x55, &r));
  // Read into the slot the stale copy freed: step 1's copy stays.
  EXPECT_EQ(r.slot, slot_of[2]);
  // Not damaged (no copy rejected): another shard.
  EXPECT_THAT(agent.Status(second.h.trainer_id), IsOkAndHolds(MemoryRestores(0, 0)));
  CKPTD_ASSERT_OK(second.seg->Release(r.slot));
  // The committed shard is what memory keeps now.
  EXPECT_THAT(KeptSlots(*second.seg), UnorderedElementsAre(Pair(slot_of[1], 1u), Pair(slot_of[2], 2u)));
  ASSERT_NO_FATAL_FAILURE(ExpectRestoreAndRelease(agent, second, 2, RestoreSource::kMemory, 0x55));
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id));
}

TEST_F(MemoryTierTest, OtherBuffersGetANewSegmentAndTheParkedOneIsReleased) {
  AgentCore agent(&mem_, options_);
  Started first;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &first));
  ASSERT_NO_FATAL_FAILURE(Persist(agent, first, {1}));
  ASSERT_NO_FATAL_FAILURE(Dies(agent, first));

  // The same bytes in another shape are another model.
  TrainerRegistration reshaped = Rank("job");
  reshaped.buffers[0].clear_shape();
  reshaped.buffers[0].add_shape(1000);
  reshaped.buffers[0].add_shape(3);
  Started second;
  ASSERT_NO_FATAL_FAILURE(Start(agent, reshaped, &second));
  EXPECT_NE(second.h.segment, first.h.segment);
  EXPECT_THAT(agent.Memory(), UsesMemory(SegmentBytes(second), 0u));
  EXPECT_EQ(agent.Memory().parked_bytes, 0u);
  // Its name is gone: nobody else can open the old segment.
  EXPECT_THAT(first.h.segment, IsGone());
  ExpectLogged("left by an exited trainer is released");
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
  EXPECT_THAT(agent.Memory(), UsesMemory(2 * one, 0u));
  EXPECT_EQ(agent.Memory().budget, 2 * one);
  ASSERT_NO_FATAL_FAILURE(Persist(agent, a, {1}));
  ASSERT_NO_FATAL_FAILURE(Dies(agent, a));
  EXPECT_THAT(agent.Memory(), UsesMemory(2 * one, 1u));  // parked segments count
  EXPECT_EQ(agent.Memory().parked_bytes, one);

  // c fits once a's parked segment goes.
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("c"), &c));
  EXPECT_THAT(agent.Memory(), UsesMemory(2 * one, 0u));
  EXPECT_THAT(a.h.segment, IsGone());
  ExpectLogged("the staging of job a rank 0");

  // b and c hold the whole budget: d is refused at once, and nothing changes.
  EXPECT_THAT(agent.Register(Rank("d")), RefusedForTheBudget());
  EXPECT_THAT(agent.Memory(), UsesMemory(2 * one, 0u));
  EXPECT_FALSE(agent.FindTrainer("d", 0).has_value());
  // b and c go on.
  ASSERT_NO_FATAL_FAILURE(Persist(agent, b, {1}));
  ASSERT_NO_FATAL_FAILURE(Persist(agent, c, {1}));

  // Once b exits, its parked segment makes room for d.
  CKPTD_ASSERT_OK(agent.TrainerExited(b.h.trainer_id));
  Started d;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("d"), &d));
  EXPECT_THAT(agent.Memory(), UsesMemory(2 * one, 0u));
  // a came back too late: its step is read from disk, and there is no room.
  EXPECT_THAT(agent.Register(Rank("a")), RefusedForTheBudget());
  CKPTD_ASSERT_OK(agent.TrainerExited(c.h.trainer_id));
  CKPTD_ASSERT_OK(agent.TrainerExited(d.h.trainer_id));
  EXPECT_THAT(agent.Memory(), UsesMemory(2 * one, 2u));
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
  ASSERT_NO_FATAL_FAILURE(Persist(agent, b, {7}));
  // b exits before a: a is the more recently parked.
  ASSERT_NO_FATAL_FAILURE(Dies(agent, b));
  ASSERT_NO_FATAL_FAILURE(Dies(agent, a));
  ASSERT_EQ(agent.Memory().parked, 2u);
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("d"), &d));
  EXPECT_THAT(agent.Memory(), UsesMemory(3 * one, 1u));
  EXPECT_EQ(agent.Memory().parked_bytes, one);
  EXPECT_THAT(b.h.segment, IsGone());
  CKPTD_EXPECT_OK(staging::StagingSegment::Open(a.h.segment).status());
  // a gets its segment back; b, whose segment went, no longer fits: a, c
  // and d fill the budget.
  Started a2;
  ASSERT_NO_FATAL_FAILURE(TakeOver(agent, a, &a2));
  EXPECT_EQ(agent.Memory().parked, 0u);
  EXPECT_THAT(agent.Register(Rank("b")), RefusedForTheBudget());
  for (const Started* t : {&a2, &c, &d}) CKPTD_ASSERT_OK(agent.TrainerExited(t->h.trainer_id));
}

TEST_F(MemoryTierTest, ParkedSegmentsGoAfterParkFor) {
  base::FakeClock clock;
  options_.clock = &clock;
  options_.park_for = absl::Minutes(10);
  AgentCore agent(&mem_, options_);
  Started first;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &first));
  ASSERT_NO_FATAL_FAILURE(Persist(agent, first, {1}));
  ASSERT_NO_FATAL_FAILURE(Dies(agent, first));

  clock.Advance(absl::Minutes(10) - absl::Seconds(1));
  agent.EvictIdle();
  EXPECT_EQ(agent.Memory().parked, 1u);
  clock.Advance(absl::Seconds(1));
  agent.EvictIdle();
  EXPECT_THAT(agent.Memory(), UsesMemory(0u, 0u));
  EXPECT_THAT(first.h.segment, IsGone());

  // The trainer that comes back after that gets a new segment and reads disk.
  Started second;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &second));
  EXPECT_NE(second.h.segment, first.h.segment);
  ASSERT_NO_FATAL_FAILURE(ExpectRestoreAndRelease(agent, second, 1, RestoreSource::kRoot));
  ASSERT_NO_FATAL_FAILURE(Dies(agent, second));

  // A registration evicts what is too old before it looks for its own.
  clock.Advance(absl::Minutes(10));
  Started third;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &third));
  EXPECT_NE(third.h.segment, second.h.segment);
  EXPECT_THAT(agent.Memory(), UsesMemory(SegmentBytes(third), 0u));
  CKPTD_ASSERT_OK(agent.TrainerExited(third.h.trainer_id));
}

TEST_F(MemoryTierTest, SmallSegmentsAreReadyAtRegistration) {
  AgentCore agent(&mem_, options_);
  Started t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &t));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(t.h.trainer_id));
  EXPECT_EQ(st.slots, 2u);
  EXPECT_EQ(st.slots_ready, 2u);
  EXPECT_THAT(SlotStates(*t.seg), Each(SlotState::kFree));
  CKPTD_ASSERT_OK(agent.TrainerExited(t.h.trainer_id));
  EXPECT_FALSE(logger_.Contains("allocated in the background"));
}

TEST_F(MemoryTierTest, LargeSegmentsArePreparedInTheBackground) {
  options_.prepare_inline_bytes = 0;  // every segment is "large"
  AgentCore agent(&mem_, options_);
  Started t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &t));
  EXPECT_EQ(agent.Memory().bytes, SegmentBytes(t));
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
  ExpectLogged("allocated in the background");
  EXPECT_THAT(SlotStates(*t.seg), Each(SlotState::kFree));

  ASSERT_NO_FATAL_FAILURE(Persist(agent, t, {1, 2}));
  ASSERT_NO_FATAL_FAILURE(ExpectRestoreAndRelease(agent, t, 2, RestoreSource::kMemory));

  // Parked and taken over, it is not prepared again: its step is still there.
  Started again;
  ASSERT_NO_FATAL_FAILURE(Restart(agent, t, &again));
  ASSERT_NO_FATAL_FAILURE(ExpectRestoreAndRelease(agent, again, 2, RestoreSource::kMemory));
  CKPTD_ASSERT_OK(agent.TrainerExited(again.h.trainer_id));
}

// The trainer `reg` registers, persists step 1, and dies while step 2 is
// still being written (each write of it takes `delay` on `slow`): its exit
// runs on `*exit` (which sets `*exited` once done), and the trainer is no
// longer registered when this returns: a successor may register meanwhile.
void DieWhileWriting(AgentCore& agent, storage::FaultInjectionFileSystem& slow, const TrainerRegistration& reg,
                     absl::Duration delay, Started* dying, std::thread* exit, std::atomic<bool>* exited) {
  ASSERT_NO_FATAL_FAILURE(Start(agent, reg, dying));
  ASSERT_NO_FATAL_FAILURE(Persist(agent, *dying, {1}));
  slow.SlowPath(storage::StepDir("/ckpt", reg.job, 2), delay);
  ASSERT_NO_FATAL_FAILURE(Snapshot(agent, *dying->seg, dying->h, 2));
  *exit = std::thread([&agent, id = dying->h.trainer_id, exited] {
    EXPECT_THAT(agent.TrainerExited(id, /*died=*/true), IsOk());
    exited->store(true);
  });
  ASSERT_TRUE(Eventually([&] { return !agent.FindTrainer(reg.job, reg.rank).has_value(); }));
}

// The trainer dies while its last snapshot is still written (a slow disk):
// its successor, registering meanwhile, takes the segment over at once and
// restores from memory; it neither waits for the write nor allocates the
// memory a second time (with a budget of one segment, it would not fit).
TEST_F(MemoryTierTest, ASuccessorTakesOverTheSegmentWhileTheLastSnapshotIsWritten) {
  options_.memory_budget_bytes = SegmentBytesOfOneTrainer();
  storage::FaultInjectionFileSystem slow(&mem_);
  AgentCore agent(&slow, options_);
  Started first;
  std::thread exit;
  std::atomic<bool> exited{false};
  ASSERT_NO_FATAL_FAILURE(
      DieWhileWriting(agent, slow, Rank("job"), absl::Milliseconds(200), &first, &exit, &exited));
  Started second;
  ASSERT_NO_FATAL_FAILURE(TakeOver(agent, first, &second));
  EXPECT_FALSE(exited.load()) << "step 2 was written before the successor registered: nothing was tested";
  ExpectLogged("while the previous trainer's last snapshots are still written");
  EXPECT_EQ(agent.Memory().bytes, SegmentBytes(first));
  ASSERT_NO_FATAL_FAILURE(ExpectRestoreAndRelease(agent, second, 1, RestoreSource::kMemory));
  // The successor trains on; its snapshot waits for the predecessor's write,
  // then is its own persister's.
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *second.seg, second.h, 3));
  exit.join();
  EXPECT_EQ(agent.Memory().bytes, SegmentBytes(first));
  EXPECT_EQ(agent.Memory().parked, 0u);
  storage::CheckpointStore store(&mem_, "/ckpt");
  EXPECT_THAT(store.LatestCommittedStep("job"), IsOkAndHolds(Optional(3u)));
  ASSERT_NO_FATAL_FAILURE(Dies(agent, second));
  EXPECT_EQ(agent.Memory().parked_bytes, SegmentBytes(first));
  Started third;
  ASSERT_NO_FATAL_FAILURE(TakeOver(agent, second, &third));
  ASSERT_NO_FATAL_FAILURE(ExpectRestoreAndRelease(agent, third, 3, RestoreSource::kMemory));
  CKPTD_ASSERT_OK(agent.TrainerExited(third.h.trainer_id));
}

// The process watcher's path: TrainerDied forgets the trainer at once and
// drains it on a thread of its own, so that ranks dying together are
// drained together (and the next death is noticed meanwhile).
TEST_F(MemoryTierTest, TrainersThatDieTogetherAreDrainedTogether) {
  storage::FaultInjectionFileSystem slow(&mem_);
  AgentCore agent(&slow, options_);
  std::vector<Started> ranks(2);
  for (uint32_t r = 0; r < 2; ++r) ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job", r, 2), &ranks[r]));
  for (uint32_t r = 0; r < 2; ++r) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *ranks[r].seg, ranks[r].h, 1));
  slow.SlowPath(storage::StepDir("/ckpt", "job", 2), absl::Milliseconds(200));
  for (uint32_t r = 0; r < 2; ++r) ASSERT_NO_FATAL_FAILURE(Snapshot(agent, *ranks[r].seg, ranks[r].h, 2));
  for (const Started& t : ranks) agent.TrainerDied(t.h.trainer_id);
  EXPECT_FALSE(agent.FindTrainer("job", 0).has_value());
  EXPECT_FALSE(agent.FindTrainer("job", 1).has_value());
  EXPECT_EQ(agent.Memory().parked, 0u) << "parked before step 2 was written";
  ASSERT_TRUE(Eventually([&] { return agent.Memory().parked == 2; }, absl::Seconds(30)));
  // Both wrote step 2, which committed.
  storage::CheckpointStore store(&mem_, "/ckpt");
  EXPECT_THAT(store.LatestCommittedStep("job"), IsOkAndHolds(Optional(2u)));
  agent.TrainerDied(ranks[0].h.trainer_id);  // known no more: nothing happens
  for (Started& t : ranks) {
    Started back;
    ASSERT_NO_FATAL_FAILURE(TakeOver(agent, t, &back));
    t = std::move(back);
  }
  std::vector<absl::StatusOr<RestoreResult>> restored = RestoreAll(agent, ranks);
  for (size_t r = 0; r < ranks.size(); ++r) {
    CKPTD_ASSERT_OK(restored[r].status()) << "rank " << r;
    EXPECT_EQ(restored[r]->step, std::optional<uint64_t>(2));
    EXPECT_EQ(restored[r]->source, RestoreSource::kMemory);
    CKPTD_ASSERT_OK(ranks[r].seg->Release(restored[r]->slot));
    CKPTD_ASSERT_OK(agent.TrainerExited(ranks[r].h.trainer_id));
  }
}

namespace {
bool HasSlot(const staging::StagingSegment& seg, SlotState s, uint64_t step) {
  for (uint32_t i = 0; i < seg.slots(); ++i) {
    if (seg.state(i) == s && seg.step(i) == step) return true;
  }
  return false;
}
}  // namespace

// A dies leaving steps 2 (being written, slowly) and 3 (READY); B takes over
// and dies with its own step 5; C takes over B while B drains. C must not
// take A's step 3: a predecessor's snapshot is void once the rank
// registered again.
TEST_F(MemoryTierTest, ATrainerTakingOverFromATakerOverTakesNoneOfTheFirstOnesSnapshots) {
  options_.slots = 4;
  storage::FaultInjectionFileSystem slow(&mem_);
  AgentCore agent(&slow, options_);
  Started a;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &a));
  ASSERT_NO_FATAL_FAILURE(Persist(agent, a, {1}));
  slow.SlowPath(storage::StepDir("/ckpt", "job", 2), absl::Milliseconds(1500));
  slow.SlowPath(storage::StepDir("/ckpt", "job", 5), absl::Milliseconds(200));
  ASSERT_NO_FATAL_FAILURE(Snapshot(agent, *a.seg, a.h, 2));
  ASSERT_TRUE(Eventually([&] { return HasSlot(*a.seg, SlotState::kPersisting, 2); }));
  ASSERT_NO_FATAL_FAILURE(Snapshot(agent, *a.seg, a.h, 3));
  std::thread exit_a([&] { EXPECT_THAT(agent.TrainerExited(a.h.trainer_id, /*died=*/true), IsOk()); });
  ASSERT_TRUE(Eventually([&] { return !agent.FindTrainer("job", 0).has_value(); }));
  Started b;
  ASSERT_NO_FATAL_FAILURE(TakeOver(agent, a, &b));
  ASSERT_NO_FATAL_FAILURE(Snapshot(agent, *b.seg, b.h, 5));
  std::thread exit_b([&] { EXPECT_THAT(agent.TrainerExited(b.h.trainer_id, /*died=*/true), IsOk()); });
  ASSERT_TRUE(Eventually([&] { return !agent.FindTrainer("job", 0).has_value(); }));
  Started c;
  ASSERT_NO_FATAL_FAILURE(TakeOver(agent, b, &c));
  EXPECT_TRUE(HasSlot(*a.seg, SlotState::kReady, 3) || HasSlot(*a.seg, SlotState::kPersisting, 3));
  exit_b.join();
  exit_a.join();
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(c.h.trainer_id));
  EXPECT_FALSE(st.last_persisted_step.has_value()) << "C persisted step " << st.last_persisted_step.value_or(0);
  storage::CheckpointStore store(&mem_, "/ckpt");
  EXPECT_THAT(store.LatestCommittedStep("job"), IsOkAndHolds(Optional(1u)));
  CKPTD_ASSERT_OK(agent.TrainerExited(c.h.trainer_id));
}

// The successor's registration fails after it adopted the draining segment
// (lone agent: another rank registered with another world size).
TEST_F(MemoryTierTest, ARegistrationRefusedAfterTakingOverLeavesTheDrainingSegmentAlone) {
  storage::FaultInjectionFileSystem slow(&mem_);
  AgentCore agent(&slow, options_);
  Started a;
  std::thread exit;
  std::atomic<bool> exited{false};
  ASSERT_NO_FATAL_FAILURE(
      DieWhileWriting(agent, slow, Rank("job", 0, 2), absl::Milliseconds(300), &a, &exit, &exited));
  Started r;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job", 1, 3), &r));
  const uint64_t both = SegmentBytes(a) + SegmentBytes(r);
  EXPECT_EQ(agent.Memory().bytes, both);
  EXPECT_THAT(agent.Register(Rank("job", 0, 2)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("registers a world of 2 ranks")));
  EXPECT_FALSE(exited.load()) << "drained before: nothing tested";
  EXPECT_EQ(agent.Memory().bytes, both) << "the draining segment is still mapped";
  exit.join();
  EXPECT_EQ(agent.Memory().parked, 1u) << "the predecessor's segment was not parked";
  EXPECT_EQ(agent.Memory().bytes, both);
  EXPECT_THAT(staging::StagingSegment::Open(a.h.segment).status(), IsOk());
  CKPTD_ASSERT_OK(agent.TrainerExited(r.h.trainer_id));
}

// A dies draining; B takes over and exits at once (parked, still shared with
// A's drain); another layout for the rank evicts the parked entry: its
// bytes stay counted while A's drain keeps the segment mapped.
TEST_F(MemoryTierTest, AParkedSegmentEvictedWhileStillWrittenIntoStaysCounted) {
  storage::FaultInjectionFileSystem slow(&mem_);
  AgentCore agent(&slow, options_);
  Started a;
  std::thread exit;
  std::atomic<bool> exited{false};
  ASSERT_NO_FATAL_FAILURE(DieWhileWriting(agent, slow, Rank("job"), absl::Milliseconds(500), &a, &exit, &exited));
  Started b;
  ASSERT_NO_FATAL_FAILURE(TakeOver(agent, a, &b));
  ASSERT_NO_FATAL_FAILURE(Dies(agent, b));
  TrainerRegistration other = Rank("job");
  other.buffers.push_back(Buffer("extra", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 5000));
  Started d;
  ASSERT_NO_FATAL_FAILURE(Start(agent, other, &d));
  EXPECT_FALSE(exited.load()) << "drained before: nothing tested";
  EXPECT_THAT(staging::StagingSegment::Open(a.h.segment).status(), IsOk()) << "A's segment is still there";
  EXPECT_EQ(agent.Memory().bytes, SegmentBytes(a) + SegmentBytes(d)) << "A's segment is not counted";
  exit.join();
  CKPTD_ASSERT_OK(agent.TrainerExited(d.h.trainer_id));
}

// A trainer process that dropped its registration (a call of it timed out)
// registers again: the first registration is retired and its segment taken
// over, not a second one allocated beside it (the budget has room for one).
TEST_F(MemoryTierTest, AProcessThatRegistersAgainTakesItsOwnSegmentOver) {
  options_.memory_budget_bytes = SegmentBytesOfOneTrainer();
  AgentCore agent(&mem_, options_);
  TrainerRegistration reg = Rank("job");
  reg.pid = 4242;
  Started first;
  ASSERT_NO_FATAL_FAILURE(Start(agent, reg, &first));
  ASSERT_NO_FATAL_FAILURE(Persist(agent, first, {1}));
  Started again;
  ASSERT_NO_FATAL_FAILURE(TakeOver(agent, first, reg, &again));
  ExpectLogged("its process (pid 4242) registers again; its registration");
  EXPECT_THAT(agent.Status(first.h.trainer_id), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no trainer")));
  EXPECT_EQ(agent.Memory().bytes, SegmentBytes(first));
  ASSERT_NO_FATAL_FAILURE(ExpectRestoreAndRelease(agent, again, 1, RestoreSource::kMemory));
  ASSERT_NO_FATAL_FAILURE(Persist(agent, again, {2}));
  CKPTD_ASSERT_OK(agent.TrainerExited(again.h.trainer_id));
  EXPECT_EQ(agent.Memory().bytes, SegmentBytes(first));
}

// A trainer dies while writing; its successor takes over and dies too, and
// its segment is parked while the first still writes into it. Once that
// write is done, the parked segment is the parked entry's alone again: a
// registration that needs the memory can have it.
TEST_F(MemoryTierTest, AParkedSegmentIsFreeableOnceTheTrainerBeforeIsDoneWritingIntoIt) {
  options_.memory_budget_bytes = SegmentBytesOfOneTrainer();
  storage::FaultInjectionFileSystem slow(&mem_);
  AgentCore agent(&slow, options_);
  Started a;
  std::thread exit;
  std::atomic<bool> exited{false};
  ASSERT_NO_FATAL_FAILURE(DieWhileWriting(agent, slow, Rank("job"), absl::Milliseconds(100), &a, &exit, &exited));
  Started b;
  ASSERT_NO_FATAL_FAILURE(TakeOver(agent, a, &b));
  ASSERT_NO_FATAL_FAILURE(Dies(agent, b));
  exit.join();
  EXPECT_EQ(agent.Memory().parked, 1u);
  Started other;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("other"), &other));
  EXPECT_EQ(agent.Memory().parked, 0u);
  EXPECT_EQ(agent.Memory().bytes, SegmentBytes(other));
  CKPTD_ASSERT_OK(agent.TrainerExited(other.h.trainer_id));
}

// A replacement node: its agent allocates the new trainer's slots in the
// background, and the trainer's restore (its first call) waits for the first
// one rather than fail after the trainer's usual wait for a slot (seconds,
// while a slot of tens of GiB takes longer to allocate).
TEST_F(MemoryTierTest, ARestoreWaitsForTheSlotsBeingAllocatedInTheBackground) {
  {
    AgentCore before(&mem_, options_);
    Started t;
    ASSERT_NO_FATAL_FAILURE(Start(before, Rank("job"), &t));
    ASSERT_NO_FATAL_FAILURE(Persist(before, t, {4}));
    CKPTD_ASSERT_OK(before.TrainerExited(t.h.trainer_id));
  }
  absl::Notification allocate;
  options_.prepare_inline_bytes = 0;  // every segment is "large"
  options_.before_preparing_slot = [&](uint32_t) { allocate.WaitForNotification(); };
  AgentCore agent(&mem_, options_);
  Started t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &t));
  absl::StatusOr<RestoreResult> r = absl::UnknownError("not run");
  absl::Notification restored;
  std::thread restore([&] {
    r = agent.Restore(t.h.trainer_id, absl::ZeroDuration());
    restored.Notify();
  });
  EXPECT_FALSE(restored.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "the restore did not wait for a slot: " << r.status();
  allocate.Notify();
  restore.join();
  CKPTD_ASSERT_OK(r.status());
  EXPECT_EQ(r->step, std::optional<uint64_t>(4));
  EXPECT_EQ(r->source, RestoreSource::kRoot);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(t, r->slot, StepFill(4)));
  CKPTD_ASSERT_OK(t.seg->Release(r->slot));

  // Once the allocation is over (here: all slots ready), a restore that finds
  // none free says so after its wait, as before.
  ASSERT_TRUE(Eventually([&] {
    absl::StatusOr<PersistStatus> st = agent.Status(t.h.trainer_id);
    return st.ok() && st->slots_ready == st->slots;
  }));
  std::vector<uint32_t> held;
  for (uint32_t i = 0; i < t.h.slots; ++i) {
    CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, t.seg->AcquireForFill(absl::ZeroDuration()));
    held.push_back(slot);
  }
  EXPECT_THAT(agent.Restore(t.h.trainer_id, absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("no free staging slot")));
  for (uint32_t slot : held) CKPTD_ASSERT_OK(t.seg->Abandon(slot));
  CKPTD_ASSERT_OK(agent.TrainerExited(t.h.trainer_id));
}

// The ranks of a job of `world` ranks, each registered as a trainer.
void StartJob(AgentCore& agent, uint32_t world, std::vector<Started>* ranks) {
  ranks->resize(world);
  for (uint32_t r = 0; r < world; ++r) ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job", r, world), &(*ranks)[r]));
}

// A job of two ranks: both persist `committed`, which commits; then rank 0
// alone persists `committed + 1` before the job goes down (rank 1 died
// first), so that step never commits.
void PersistACommittedStepAndANewerUncommittedOne(AgentCore& agent, std::vector<Started>& ranks, uint64_t committed,
                                                  storage::MemFileSystem* mem) {
  for (uint32_t r = 0; r < ranks.size(); ++r) {
    ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *ranks[r].seg, ranks[r].h, committed, RankFill(committed, r)));
  }
  storage::CheckpointStore store(mem, "/ckpt");
  ASSERT_THAT(store.LatestCommittedStep("job"), IsOkAndHolds(Optional(committed)));
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *ranks[0].seg, ranks[0].h, committed + 1, RankFill(committed + 1, 0)));
  ASSERT_THAT(store.LatestCommittedStep("job"), IsOkAndHolds(Optional(committed)));
}

// Every trainer of `ranks` dies, and registers again: each gets its parked
// segment back.
void RestartAll(AgentCore& agent, std::vector<Started>& ranks) {
  for (const Started& t : ranks) ASSERT_NO_FATAL_FAILURE(Dies(agent, t));
  EXPECT_EQ(agent.Memory().parked, ranks.size());
  for (Started& t : ranks) {
    Started back;
    ASSERT_NO_FATAL_FAILURE(TakeOver(agent, t, &back));
    t = std::move(back);
  }
}

TEST_F(MemoryTierTest, ACommittedStepBehindANewerUncommittedOneStillRestoresFromMemory) {
  AgentCore agent(&mem_, options_);
  std::vector<Started> ranks;
  ASSERT_NO_FATAL_FAILURE(StartJob(agent, 2, &ranks));
  ASSERT_NO_FATAL_FAILURE(PersistACommittedStepAndANewerUncommittedOne(agent, ranks, 2, &mem_));
  // Rank 0 keeps both its steps: step 3, which never committed, did not push
  // step 2 out of memory.
  std::vector<std::map<uint64_t, uint32_t>> slot_of(2);
  ASSERT_NO_FATAL_FAILURE(ExpectKeepsOnly(*ranks[0].seg, {2, 3}, &slot_of[0]));
  ASSERT_NO_FATAL_FAILURE(ExpectKeepsOnly(*ranks[1].seg, {2}, &slot_of[1]));

  ASSERT_NO_FATAL_FAILURE(RestartAll(agent, ranks));
  ExpectLogged("job job rank 0 registered again: its staging");
  ExpectLogged("is taken over, steps 2, 3 in memory");
  std::vector<uint32_t> slots;
  ASSERT_NO_FATAL_FAILURE(
      RestoreAllAndRelease(agent, ranks, 2, {RestoreSource::kMemory, RestoreSource::kMemory}, &slots));
  for (uint32_t r = 0; r < 2; ++r) {
    EXPECT_EQ(slots[r], slot_of[r][2]) << "rank " << r;
    EXPECT_THAT(agent.Status(ranks[r].h.trainer_id), IsOkAndHolds(MemoryRestores(1, 0))) << "rank " << r;
    ExpectLogged(absl::StrCat("job job rank ", r, ": step 2 read from the agent's memory"));
  }
  // The job went back to step 2: rank 0's step 3, of a timeline that is
  // gone, no longer holds memory.
  EXPECT_EQ(ranks[0].seg->state(slot_of[0][3]), SlotState::kFree);
  for (uint32_t r = 0; r < 2; ++r) {
    EXPECT_THAT(KeptSlots(*ranks[r].seg), UnorderedElementsAre(Pair(slot_of[r][2], 2u))) << "rank " << r;
  }

  // The next restart finds both copies in memory again.
  ASSERT_NO_FATAL_FAILURE(RestoreAllAndRelease(agent, ranks, 2, {RestoreSource::kMemory, RestoreSource::kMemory}));
  for (const Started& t : ranks) CKPTD_ASSERT_OK(agent.TrainerExited(t.h.trainer_id));
}

TEST_F(MemoryTierTest, ACommittedStepWhoseSlotTheTrainerTookBackIsReadFromDisk) {
  AgentCore agent(&mem_, options_);
  std::vector<Started> ranks;
  ASSERT_NO_FATAL_FAILURE(StartJob(agent, 2, &ranks));
  ASSERT_NO_FATAL_FAILURE(PersistACommittedStepAndANewerUncommittedOne(agent, ranks, 2, &mem_));
  std::map<uint64_t, uint32_t> slot_of;
  ASSERT_NO_FATAL_FAILURE(ExpectKeepsOnly(*ranks[0].seg, {2, 3}, &slot_of));
  // Rank 0's trainer starts two more snapshots: no slot is free, so it takes
  // back the kept slots, step 3's first (step 2, the newest committed, is
  // pinned: given up last), then step 2's; it dies before publishing.
  EXPECT_EQ(ranks[0].seg->pinned_step(), std::optional<uint64_t>(2));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t first, ranks[0].seg->AcquireForFill(absl::ZeroDuration()));
  EXPECT_EQ(first, slot_of[3]);
  EXPECT_THAT(KeptSlots(*ranks[0].seg), UnorderedElementsAre(Pair(slot_of[2], 2u)));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t second, ranks[0].seg->AcquireForFill(absl::ZeroDuration()));
  EXPECT_EQ(second, slot_of[2]);
  EXPECT_THAT(KeptSlots(*ranks[0].seg), IsEmpty());
  for (uint32_t filling : {first, second}) {
    std::memset(ranks[0].seg->slot_data(filling), 0xee, 4096);
    CKPTD_ASSERT_OK(ranks[0].seg->Abandon(filling));
  }

  ASSERT_NO_FATAL_FAILURE(RestartAll(agent, ranks));
  // Rank 0's copy of step 2 is gone: it reads the committed shard from disk;
  // rank 1 still has its copy.
  std::vector<uint32_t> slots;
  ASSERT_NO_FATAL_FAILURE(
      RestoreAllAndRelease(agent, ranks, 2, {RestoreSource::kRoot, RestoreSource::kMemory}, &slots));
  // Rank 0's copy is not damaged, just not there any more: none rejected.
  EXPECT_THAT(agent.Status(ranks[0].h.trainer_id), IsOkAndHolds(MemoryRestores(0, 0)));
  EXPECT_THAT(agent.Status(ranks[1].h.trainer_id), IsOkAndHolds(MemoryRestores(1, 0)));
  // Step 3 went with the timeline the job left; step 2 is kept by both now.
  EXPECT_EQ(ranks[0].seg->state(slots[0] == slot_of[2] ? slot_of[3] : slot_of[2]), SlotState::kFree);
  for (uint32_t r = 0; r < 2; ++r) {
    EXPECT_THAT(KeptSlots(*ranks[r].seg), UnorderedElementsAre(Pair(slots[r], 2u))) << "rank " << r;
  }
  ASSERT_NO_FATAL_FAILURE(RestoreAllAndRelease(agent, ranks, 2, {RestoreSource::kMemory, RestoreSource::kMemory}));
  for (const Started& t : ranks) CKPTD_ASSERT_OK(agent.TrainerExited(t.h.trainer_id));
}

TEST_F(MemoryTierTest, EveryPersistedStepIsKeptUntilATrainerNeedsItsSlot) {
  options_.slots = 3;
  AgentCore agent(&mem_, options_);
  Started t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &t));
  ASSERT_EQ(t.seg->slots(), 3u);
  ASSERT_NO_FATAL_FAILURE(Persist(agent, t, {1, 2, 3}));
  std::map<uint64_t, uint32_t> slot_of;
  ASSERT_NO_FATAL_FAILURE(ExpectKeepsOnly(*t.seg, {1, 2, 3}, &slot_of));

  // No slot is free: the next snapshot takes the oldest step's slot.
  ASSERT_NO_FATAL_FAILURE(Persist(agent, t, {4}));
  EXPECT_THAT(KeptSlots(*t.seg),
              UnorderedElementsAre(Pair(slot_of[2], 2u), Pair(slot_of[3], 3u), Pair(slot_of[1], 4u)));
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(t, slot_of[1], 4));
  // And the one after that, step 2's.
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t filling, t.seg->AcquireForFill(absl::ZeroDuration()));
  EXPECT_EQ(filling, slot_of[2]);
  CKPTD_ASSERT_OK(t.seg->Abandon(filling));
  EXPECT_THAT(KeptSlots(*t.seg), UnorderedElementsAre(Pair(slot_of[3], 3u), Pair(slot_of[1], 4u)));

  // The newest step restores from memory.
  uint32_t slot = 0;
  ASSERT_NO_FATAL_FAILURE(ExpectRestoreAndRelease(agent, t, 4, RestoreSource::kMemory, &slot));
  EXPECT_EQ(slot, slot_of[1]);
  EXPECT_THAT(KeptSlots(*t.seg), UnorderedElementsAre(Pair(slot_of[3], 3u), Pair(slot_of[1], 4u)));
  CKPTD_ASSERT_OK(agent.TrainerExited(t.h.trainer_id));
}

TEST_F(MemoryTierTest, ARestoreThatGoesBackDropsKeptCopiesOfNewerSteps) {
  options_.slots = 3;
  options_.keep_last = 3;  // step 1 stays on disk: the job goes back to it
  AgentCore agent(&mem_, options_);
  // A new process of the rank registers before the agent noticed the old
  // one's exit: both live. (The same process registering again would
  // retire its first registration instead.)
  TrainerRegistration reg = Rank("job");
  reg.pid = 4242;
  Started old;
  ASSERT_NO_FATAL_FAILURE(Start(agent, reg, &old));
  ASSERT_NO_FATAL_FAILURE(Persist(agent, old, {1, 2, 3}));
  std::map<uint64_t, uint32_t> slot_of;
  ASSERT_NO_FATAL_FAILURE(ExpectKeepsOnly(*old.seg, {1, 2, 3}, &slot_of));
  Started current;
  reg.pid = 4243;
  ASSERT_NO_FATAL_FAILURE(Start(agent, reg, &current));
  ASSERT_NE(current.h.segment, old.h.segment);
  // Step 3 goes bad on disk (found by a scrub): the job goes back to step 2.
  storage::CheckpointStore store(&mem_, "/ckpt");
  CKPTD_ASSERT_OK(store.QuarantineStep("job", 3, "test"));
  RestoreResult r;
  ASSERT_NO_FATAL_FAILURE(ExpectRestore(agent, current, 2, RestoreSource::kRoot, &r));
  // Step 3 of the timeline that is gone no longer holds memory; steps 2 (the
  // one restored) and 1 (below it) stay kept.
  EXPECT_EQ(old.seg->state(slot_of[3]), SlotState::kFree);
  EXPECT_THAT(KeptSlots(*old.seg), UnorderedElementsAre(Pair(slot_of[1], 1u), Pair(slot_of[2], 2u)));
  CKPTD_ASSERT_OK(current.seg->Release(r.slot));
  EXPECT_THAT(KeptSlots(*current.seg), UnorderedElementsAre(Pair(r.slot, 2u)));

  // Further back: step 2 goes bad too, and the job restores step 1. Kept
  // copies above it go, in both segments; step 1's stays.
  CKPTD_ASSERT_OK(store.QuarantineStep("job", 2, "test"));
  ASSERT_NO_FATAL_FAILURE(ExpectRestore(agent, current, 1, RestoreSource::kRoot, &r));
  EXPECT_THAT(KeptSlots(*old.seg), UnorderedElementsAre(Pair(slot_of[1], 1u)));
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
  ASSERT_NO_FATAL_FAILURE(Persist(agent, first, {1, 2}));
  EXPECT_THAT(SlotStates(*first.seg), Each(SlotState::kFree));
  // It dies, and nothing is parked: its segment goes at once.
  CKPTD_ASSERT_OK(agent.TrainerExited(first.h.trainer_id, /*died=*/true));
  EXPECT_THAT(agent.Memory(), UsesMemory(0u, 0u));
  EXPECT_THAT(first.h.segment, IsGone());

  Started second;
  ASSERT_NO_FATAL_FAILURE(Start(agent, Rank("job"), &second));
  EXPECT_NE(second.h.segment, first.h.segment);
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(absl::StrCat("restore ", i));
    uint32_t slot = 0;
    ASSERT_NO_FATAL_FAILURE(ExpectRestoreAndRelease(agent, second, 2, RestoreSource::kRoot, &slot));
    EXPECT_EQ(second.seg->state(slot), SlotState::kFree);
  }
  EXPECT_THAT(agent.Status(second.h.trainer_id), IsOkAndHolds(MemoryRestores(0, 0)));
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id));
}

using internal::TrainerState;

// The lifecycle allows exactly its moves (docs/agent.md): anything else is
// refused and leaves the trainer where it was.
TEST(TrainerLifecycleTest, OnlyTheLifecyclesMovesAreAllowed) {
  const std::vector<TrainerState> all = {TrainerState::kRegistering, TrainerState::kRegistered,
                                         TrainerState::kExiting, TrainerState::kTakenOver, TrainerState::kRetired};
  const std::set<std::pair<TrainerState, TrainerState>> allowed = {
      {TrainerState::kRegistering, TrainerState::kRegistered}, {TrainerState::kRegistering, TrainerState::kRetired},
      {TrainerState::kRegistered, TrainerState::kExiting},     {TrainerState::kExiting, TrainerState::kTakenOver},
      {TrainerState::kTakenOver, TrainerState::kExiting},      {TrainerState::kExiting, TrainerState::kRetired},
      {TrainerState::kTakenOver, TrainerState::kRetired}};
  std::set<std::string> names;
  for (TrainerState from : all) {
    names.insert(std::string(internal::TrainerStateName(from)));
    for (TrainerState to : all) {
      EXPECT_EQ(internal::TrainerMoveAllowed(from, to), allowed.contains({from, to}))
          << internal::TrainerStateName(from) << " -> " << internal::TrainerStateName(to);
    }
  }
  EXPECT_EQ(names.size(), all.size());
  EXPECT_FALSE(names.contains("unknown"));
}

// A chain of take-overs, state by state: registered; exiting while its last
// snapshot is written; taken over by a successor, which is registered;
// retired once drained, while the successor goes on; the successor's own
// exit parks the segment.
TEST_F(MemoryTierTest, ATakeOverChainGoesThroughEachLifecycleState) {
  storage::FaultInjectionFileSystem slow(&mem_);
  AgentCore agent(&slow, options_);
  auto state = [&](const Started& t) { return AgentCoreLifecycleProbe::StateOf(agent, t.h.trainer_id); };
  Started first;
  std::thread exit;
  std::atomic<bool> exited{false};
  ASSERT_NO_FATAL_FAILURE(DieWhileWriting(agent, slow, Rank("job"), absl::Milliseconds(500), &first, &exit, &exited));
  EXPECT_EQ(state(first), TrainerState::kExiting);
  Started second;
  ASSERT_NO_FATAL_FAILURE(TakeOver(agent, first, &second));
  EXPECT_FALSE(exited.load()) << "step 2 was written before the successor registered: nothing was tested";
  EXPECT_EQ(state(first), TrainerState::kTakenOver);
  EXPECT_EQ(state(second), TrainerState::kRegistered);
  exit.join();
  EXPECT_EQ(state(first), std::nullopt) << "retired, listed nowhere";
  EXPECT_EQ(state(second), TrainerState::kRegistered);
  EXPECT_EQ(agent.Memory().parked, 0u) << "the segment is the successor's, not parked";
  CKPTD_ASSERT_OK(agent.TrainerExited(second.h.trainer_id));
  EXPECT_EQ(state(second), std::nullopt);
  EXPECT_EQ(agent.Memory().parked, 1u);
  Started third;
  ASSERT_NO_FATAL_FAILURE(TakeOver(agent, second, &third));
  EXPECT_EQ(state(third), TrainerState::kRegistered);
  CKPTD_ASSERT_OK(agent.TrainerExited(third.h.trainer_id));
}

// A registration that took a draining predecessor's segment over and is
// refused at the last check (another rank registered another world size
// meanwhile) hands the predecessor back to exiting: its segment is then
// parked when its drain ends, not handed to a successor that never was.
TEST_F(MemoryTierTest, ARefusedTakeOverLeavesThePredecessorExiting) {
  storage::FaultInjectionFileSystem slow(&mem_);
  std::optional<AgentCore> agent;
  bool armed = false;
  bool intervened = false;
  Started other;
  options_.before_enlisting = [&](const TrainerRegistration&) {
    if (!armed) return;
    armed = false;
    intervened = true;
    Start(*agent, Rank("job", 1, 3), &other);
  };
  agent.emplace(&slow, options_);
  auto state = [&](const Started& t) { return AgentCoreLifecycleProbe::StateOf(*agent, t.h.trainer_id); };
  Started first;
  std::thread exit;
  std::atomic<bool> exited{false};
  ASSERT_NO_FATAL_FAILURE(
      DieWhileWriting(*agent, slow, Rank("job", 0, 2), absl::Milliseconds(500), &first, &exit, &exited));
  armed = true;
  EXPECT_THAT(agent->Register(Rank("job", 0, 2)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("registers a world of 2 ranks")));
  EXPECT_TRUE(intervened);
  EXPECT_FALSE(exited.load()) << "drained before: nothing tested";
  EXPECT_EQ(state(first), TrainerState::kExiting);
  exit.join();
  EXPECT_EQ(state(first), std::nullopt);
  EXPECT_EQ(agent->Memory().parked, 1u) << "the predecessor's segment was not parked";
  CKPTD_ASSERT_OK(agent->TrainerExited(other.h.trainer_id));
}

}  // namespace
}  // namespace ckptd::agent
