#include "staging/staging.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/statvfs.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/clock.h"
#include "base/status_macros.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "base/testing/users.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::staging {
namespace {

using ::ckptd::testing::Eventually;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;

std::string UniqueName() {
  static std::atomic<int> counter{0};
  return absl::StrCat("/ckptd-test-", ::getpid(), "-", counter++);
}

TEST(PlanLayoutTest, AlignsEveryBuffer) {
  StagingLayout l = PlanLayout({10, 4096, 0, 5000});
  EXPECT_THAT(l.offsets, ElementsAre(0, 4096, 8192, 12288));
  EXPECT_EQ(l.slot_bytes, 12288u + 8192u);
  EXPECT_EQ(PlanLayout({}).slot_bytes, 4096u);
}

TEST(PlanLayoutTest, TheCheckedPlanIsTheSameForLengthsThatFit) {
  for (const std::vector<uint64_t>& lengths :
       {std::vector<uint64_t>{10, 4096, 0, 5000}, std::vector<uint64_t>{}, std::vector<uint64_t>{kMaxSlotBytes},
        std::vector<uint64_t>{kMaxSlotBytes - 8192, 4096, 1}}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(const StagingLayout checked, PlanLayoutChecked(lengths));
    const StagingLayout plain = PlanLayout(lengths);
    EXPECT_EQ(checked.offsets, plain.offsets);
    EXPECT_EQ(checked.lengths, plain.lengths);
    EXPECT_EQ(checked.slot_bytes, plain.slot_bytes);
  }
  EXPECT_EQ(PlanLayoutChecked({kMaxSlotBytes - 8192, 4096, 1})->slot_bytes, kMaxSlotBytes);
}

TEST(PlanLayoutTest, LengthsThatWouldWrapAreRefusedNamingTheBuffer) {
  // Unchecked, 2^64 - 4096 then 8192 wraps to a slot of 4096 bytes.
  EXPECT_THAT(PlanLayoutChecked({~uint64_t{0} - 4095, 8192}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("buffer 0 (of 2) is 18446744073709547520 bytes"), HasSubstr("1 PiB"))));
  // Rounding up to 4096 alone would wrap to 0.
  EXPECT_THAT(PlanLayoutChecked({4096, ~uint64_t{0}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("buffer 1 (of 2) is 18446744073709551615 bytes")));
  // Each fits, together they do not.
  EXPECT_THAT(PlanLayoutChecked({kMaxSlotBytes / 2, kMaxSlotBytes / 2, 1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("buffer 2 (of 3) of 1 bytes (4096 aligned) at offset ", kMaxSlotBytes,
                                              " ends past"))));
  EXPECT_THAT(PlanLayoutChecked({kMaxSlotBytes - 4096, 4097}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("buffer 1 (of 2) of 4097 bytes")));
}

TEST(SlotsWithinBudgetTest, CapsByBudgetAndRefusesWhenNothingFits) {
  EXPECT_THAT(SlotsWithinBudget(1 << 20, 2, 10 << 20), IsOkAndHolds(2u));
  EXPECT_THAT(SlotsWithinBudget(1 << 20, 4, 3 << 20), IsOkAndHolds(3u));
  EXPECT_THAT(SlotsWithinBudget(8 << 20, 2, 1 << 20),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("8388608")));
}

TEST(StagingSegmentTest, IsOwnerOnlyAndPreFaultedAndUnlinkedByItsOwner) {
  const std::string name = UniqueName();
  {
    const mode_t old = ::umask(0);  // a permissive umask must not widen the segment
    CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, StagingSegment::Create(name, 2, 1 << 20));
    ::umask(old);
    struct stat st;
    ASSERT_EQ(::stat(absl::StrCat("/dev/shm", name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(seg->slots(), 2u);
    EXPECT_EQ(seg->slot_bytes(), 1u << 20);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(seg->slot_data(1)) % 4096, 0u);
    EXPECT_EQ(seg->state(0), SlotState::kFree);
    EXPECT_THAT(StagingSegment::Create(name, 2, 1 << 20), StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr(name)));
  }
  EXPECT_THAT(StagingSegment::Open(name), StatusIs(absl::StatusCode::kNotFound, HasSubstr(name)));
}

TEST(StagingSegmentTest, RejectsBadArguments) {
  EXPECT_THAT(StagingSegment::Create("no-slash", 2, 4096), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(StagingSegment::Create("/a/b", 2, 4096), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(StagingSegment::Create("/..", 2, 4096), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'.'")));
  EXPECT_THAT(StagingSegment::Create("/.", 2, 4096), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(StagingSegment::Open("/../etc"), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(StagingSegment::Create(UniqueName(), 0, 4096), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(StagingSegment::Create(UniqueName(), 2, 1000), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(StagingSegment::Create(UniqueName(), 1000, 4096), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

TEST(StagingSegmentTest, OpenRefusesWhatIsNotASegment) {
  const std::string name = UniqueName();
  const std::string path = absl::StrCat("/dev/shm", name);
  int fd = ::open(path.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  std::string garbage(8192, 'x');
  ASSERT_EQ(::write(fd, garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
  ::close(fd);
  EXPECT_THAT(StagingSegment::Open(name), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not a ckptd staging")));
  ASSERT_EQ(::truncate(path.c_str(), 100), 0);
  EXPECT_THAT(StagingSegment::Open(name), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("too short")));
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  EXPECT_THAT(StagingSegment::Open(name),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("gives other users access")));
  ::unlink(path.c_str());
}

TEST(StagingSegmentTest, SnapshotCycleAcrossProcesses) {
  const std::string name = UniqueName();
  CKPTD_ASSERT_OK_AND_ASSIGN(auto agent, StagingSegment::Create(name, 2, 64 << 10));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The trainer: open, fill two slots with steps 20 and 10, publish.
    auto seg = StagingSegment::Open(name);
    if (!seg.ok()) ::_exit(10);
    for (uint64_t step : {20u, 10u}) {
      auto slot = (*seg)->AcquireForFill(absl::Seconds(5));
      if (!slot.ok()) ::_exit(11);
      std::memset((*seg)->slot_data(*slot), static_cast<int>(step), (*seg)->slot_bytes());
      if (!(*seg)->Publish(*slot, step).ok()) ::_exit(12);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  // Persisted in step order, data as the trainer left it, even though it exited.
  for (uint64_t want : {10u, 20u}) {
    std::optional<uint32_t> slot = agent->TakeReady();
    ASSERT_TRUE(slot.has_value());
    EXPECT_EQ(agent->step(*slot), want);
    EXPECT_EQ(agent->slot_data(*slot)[agent->slot_bytes() - 1], static_cast<uint8_t>(want));
    EXPECT_EQ(agent->state(*slot), SlotState::kPersisting);
    CKPTD_EXPECT_OK(agent->Release(*slot));
  }
  EXPECT_EQ(agent->TakeReady(), std::nullopt);
}

// AcquireForFill(wait) on a thread of its own, as a trainer would. Going, it
// moves the clock past every deadline first, so that a failed test cannot hang.
class BackgroundAcquire {
 public:
  BackgroundAcquire(StagingSegment* seg, absl::Duration wait, base::FakeClock* clock)
      : clock_(clock), thread_([this, seg, wait] {
          absl::StatusOr<uint32_t> r = seg->AcquireForFill(wait);
          absl::MutexLock l(&mu_);
          result_ = std::move(r);
        }) {}
  ~BackgroundAcquire() {
    if (!done()) clock_->Set(absl::InfiniteFuture());
    thread_.join();
  }
  bool done() {
    absl::MutexLock l(&mu_);
    return result_.has_value();
  }
  // Waits (in real time) for the result.
  absl::StatusOr<uint32_t> Get() {
    if (!Eventually([this] { return done(); })) return absl::DeadlineExceededError("AcquireForFill did not return");
    absl::MutexLock l(&mu_);
    return *result_;
  }

 private:
  base::FakeClock* const clock_;
  absl::Mutex mu_;
  std::optional<absl::StatusOr<uint32_t>> result_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

TEST(StagingSegmentTest, NoFreeSlotWaitsWithABoundOrSkips) {
  base::FakeClock clock;
  const absl::Time start = clock.Now();
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, StagingSegment::Create(UniqueName(), 1, 4096, std::nullopt, &clock));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::ZeroDuration()));
  // Skip policy: no wait at all.
  EXPECT_THAT(seg->AcquireForFill(absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("no free staging slot")));
  {
    // Wait policy: gives up once the bound has passed on the segment's clock.
    BackgroundAcquire trainer(seg.get(), absl::Seconds(30), &clock);
    ASSERT_TRUE(Eventually([&] { return clock.waiters() == 1; }));
    clock.Advance(absl::Seconds(29));
    // Waiting again, the bound not yet reached (the wait it left has ended by now).
    ASSERT_TRUE(Eventually([&] { return clock.waiters() == 1; }));
    EXPECT_FALSE(trainer.done());
    clock.Advance(absl::Seconds(1));
    EXPECT_THAT(trainer.Get(), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("after 30s")));
  }
  {
    // And succeeds once the agent frees the slot meanwhile, time standing still.
    CKPTD_ASSERT_OK(seg->Publish(slot, 1));
    BackgroundAcquire trainer(seg.get(), absl::Seconds(10), &clock);
    ASSERT_TRUE(Eventually([&] { return clock.waiters() == 1; }));
    std::optional<uint32_t> s = seg->TakeReady();
    ASSERT_TRUE(s.has_value());
    CKPTD_ASSERT_OK(seg->Release(*s));
    EXPECT_THAT(trainer.Get(), IsOkAndHolds(slot));
  }
  EXPECT_EQ(clock.Now(), start + absl::Seconds(30));
  EXPECT_EQ(clock.waiters(), 0);
}

TEST(StagingSegmentTest, WaitsOnTheRealClockByDefault) {
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, StagingSegment::Create(UniqueName(), 1, 4096));
  CKPTD_ASSERT_OK(seg->AcquireForFill(absl::ZeroDuration()).status());
  const absl::Time t0 = absl::Now();
  EXPECT_THAT(seg->AcquireForFill(absl::Milliseconds(3)),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("after 3ms")));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(3));
}

TEST(StagingSegmentTest, RestoreCycleAndWrongTransitions) {
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, StagingSegment::Create(UniqueName(), 2, 4096));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForRestore(absl::ZeroDuration()));
  EXPECT_EQ(seg->state(slot), SlotState::kRestoring);
  EXPECT_THAT(seg->Release(slot), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("RESTORING")));
  CKPTD_ASSERT_OK(seg->Publish(slot, 42));
  EXPECT_EQ(seg->state(slot), SlotState::kRestored);
  EXPECT_EQ(seg->TakeReady(), std::nullopt);  // a restored slot is not persisted
  CKPTD_ASSERT_OK(seg->Release(slot));
  EXPECT_THAT(seg->Publish(slot, 1), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("FREE")));
  EXPECT_THAT(seg->Release(7), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

TEST(StagingSegmentTest, ReclaimAfterTrainerExitKeepsReadySnapshots) {
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, StagingSegment::Create(UniqueName(), 3, 4096));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t filling, seg->AcquireForFill(absl::ZeroDuration()));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t ready, seg->AcquireForFill(absl::ZeroDuration()));
  CKPTD_ASSERT_OK(seg->Publish(ready, 5));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t restored, seg->AcquireForRestore(absl::ZeroDuration()));
  CKPTD_ASSERT_OK(seg->Publish(restored, 4));
  EXPECT_EQ(seg->ReclaimAfterTrainerExit(), 2);
  EXPECT_EQ(seg->state(filling), SlotState::kFree);
  EXPECT_EQ(seg->state(restored), SlotState::kFree);
  EXPECT_THAT(seg->TakeReady(), Optional(ready));
}

// A slot holding `step` as the memory tier leaves it: filled by the trainer,
// published, persisted by the agent and kept.
absl::StatusOr<uint32_t> KeepStep(StagingSegment& seg, uint64_t step) {
  CKPTD_ASSIGN_OR_RETURN(const uint32_t slot, seg.AcquireForFill(absl::ZeroDuration()));
  CKPTD_RETURN_IF_ERROR(seg.Publish(slot, step));
  const std::optional<uint32_t> taken = seg.TakeReady();
  if (taken != slot) return absl::InternalError(absl::StrCat("TakeReady did not take slot ", slot));
  CKPTD_RETURN_IF_ERROR(seg.Keep(slot));
  return slot;
}

// Bytes of shared memory that the segment `name` holds (tmpfs counts the
// pages given to it).
uint64_t AllocatedBytes(const std::string& name) {
  struct stat st;
  if (::stat(absl::StrCat(kShmDir, name).c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

TEST(StagingSegmentTest, KeptLifecycle) {
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, StagingSegment::Create(UniqueName(), 2, 4096));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::ZeroDuration()));
  std::memset(seg->slot_data(slot), 0x77, seg->slot_bytes());
  CKPTD_ASSERT_OK(seg->Publish(slot, 7));
  ASSERT_THAT(seg->TakeReady(), Optional(slot));
  ASSERT_EQ(seg->state(slot), SlotState::kPersisting);
  CKPTD_ASSERT_OK(seg->Keep(slot));
  EXPECT_EQ(seg->state(slot), SlotState::kKept);
  EXPECT_EQ(seg->step(slot), 7u);
  EXPECT_EQ(seg->slot_data(slot)[seg->slot_bytes() - 1], 0x77);
  EXPECT_EQ(seg->TakeReady(), std::nullopt);  // kept, not persisted again
  EXPECT_THAT(seg->Keep(slot), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("KEPT")));
  EXPECT_THAT(seg->Release(slot), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("KEPT")));
  // A mistaken Publish changes nothing: the kept slot is known by its step.
  EXPECT_THAT(seg->Publish(slot, 99), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("KEPT")));
  EXPECT_EQ(seg->step(slot), 7u);
  // Only the step it holds frees it.
  EXPECT_FALSE(seg->Unkeep(slot, 8));
  EXPECT_EQ(seg->state(slot), SlotState::kKept);
  EXPECT_EQ(seg->step(slot), 7u);
  EXPECT_FALSE(seg->Unkeep(7, 7));  // no such slot
  EXPECT_TRUE(seg->Unkeep(slot, 7));
  EXPECT_EQ(seg->state(slot), SlotState::kFree);
  EXPECT_FALSE(seg->Unkeep(slot, 7));  // no longer kept
  EXPECT_EQ(seg->state(slot), SlotState::kFree);
}

TEST(StagingSegmentTest, KeepNeedsAPersistingSlot) {
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, StagingSegment::Create(UniqueName(), 2, 4096));
  EXPECT_THAT(seg->Keep(0), StatusIs(absl::StatusCode::kFailedPrecondition,
                                     AllOf(HasSubstr("slot 0 is FREE"), HasSubstr("not PERSISTING"))));
  EXPECT_EQ(seg->state(0), SlotState::kFree);
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::ZeroDuration()));
  EXPECT_THAT(seg->Keep(slot), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("FILLING")));
  CKPTD_ASSERT_OK(seg->Publish(slot, 3));
  EXPECT_THAT(seg->Keep(slot), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("READY")));
  EXPECT_EQ(seg->state(slot), SlotState::kReady);
  EXPECT_THAT(seg->Keep(2), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not exist")));
}

TEST(StagingSegmentTest, AcquirePrefersFreeSlotsThenGivesUpTheOldestKeptStep) {
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, StagingSegment::Create(UniqueName(), 3, 4096));
  // The newer step in the lower slot, so that neither slot order nor the
  // first KEPT slot found picks the right one by chance.
  CKPTD_ASSERT_OK_AND_ASSIGN(const uint32_t kept9, KeepStep(*seg, 9));
  CKPTD_ASSERT_OK_AND_ASSIGN(const uint32_t kept5, KeepStep(*seg, 5));
  ASSERT_EQ(kept9, 0u);
  ASSERT_EQ(kept5, 1u);
  EXPECT_THAT(seg->AcquireForFill(absl::ZeroDuration()), IsOkAndHolds(2u));  // the FREE one
  EXPECT_EQ(seg->state(kept9), SlotState::kKept);
  EXPECT_EQ(seg->state(kept5), SlotState::kKept);
  EXPECT_THAT(seg->AcquireForFill(absl::ZeroDuration()), IsOkAndHolds(kept5));  // the oldest step
  EXPECT_EQ(seg->state(kept5), SlotState::kFilling);
  EXPECT_EQ(seg->state(kept9), SlotState::kKept);
  // The agent's hold on step 5 is gone: it can neither free nor restore it.
  EXPECT_FALSE(seg->Unkeep(kept5, 5));
  EXPECT_FALSE(seg->TakeKept(kept5, 5));
  EXPECT_EQ(seg->state(kept5), SlotState::kFilling);
  EXPECT_THAT(seg->AcquireForFill(absl::ZeroDuration()), IsOkAndHolds(kept9));
  EXPECT_THAT(seg->AcquireForFill(absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("(3 slots, all in use)")));
}

// The newest committed step, pinned, outlives newer steps that never
// committed: a restart after a failure elsewhere restores it from memory.
TEST(StagingSegmentTest, ThePinnedStepIsGivenUpLast) {
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, StagingSegment::Create(UniqueName(), 3, 4096));
  EXPECT_EQ(seg->pinned_step(), std::nullopt);
  CKPTD_ASSERT_OK_AND_ASSIGN(const uint32_t kept60, KeepStep(*seg, 60));
  CKPTD_ASSERT_OK_AND_ASSIGN(const uint32_t kept80, KeepStep(*seg, 80));
  CKPTD_ASSERT_OK_AND_ASSIGN(const uint32_t kept100, KeepStep(*seg, 100));
  seg->PinKept(60);
  EXPECT_EQ(seg->pinned_step(), std::optional<uint64_t>(60));
  // The trainer opens the segment again (a restart): the pin is in the segment.
  CKPTD_ASSERT_OK_AND_ASSIGN(auto trainer, StagingSegment::Open(seg->name()));
  EXPECT_EQ(trainer->pinned_step(), std::optional<uint64_t>(60));
  EXPECT_THAT(trainer->AcquireForFill(absl::ZeroDuration()), IsOkAndHolds(kept80));  // not 60, the oldest
  EXPECT_THAT(trainer->AcquireForFill(absl::ZeroDuration()), IsOkAndHolds(kept100));
  EXPECT_EQ(seg->state(kept60), SlotState::kKept);
  // Only the pinned step is left: it goes rather than stall the trainer.
  EXPECT_THAT(trainer->AcquireForFill(absl::ZeroDuration()), IsOkAndHolds(kept60));
  // Unpinned: the oldest goes first again.
  seg->PinKept(std::nullopt);
  EXPECT_EQ(seg->pinned_step(), std::nullopt);
}

TEST(StagingSegmentTest, AcquireForRestoreAlsoTakesTheOldestKeptStep) {
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, StagingSegment::Create(UniqueName(), 2, 4096));
  CKPTD_ASSERT_OK_AND_ASSIGN(const uint32_t kept8, KeepStep(*seg, 8));
  CKPTD_ASSERT_OK_AND_ASSIGN(const uint32_t kept4, KeepStep(*seg, 4));
  EXPECT_THAT(seg->AcquireForRestore(absl::ZeroDuration()), IsOkAndHolds(kept4));
  EXPECT_EQ(seg->state(kept4), SlotState::kRestoring);
  EXPECT_EQ(seg->state(kept8), SlotState::kKept);
}

TEST(StagingSegmentTest, WaitingAcquireTakesASlotKeptMeanwhile) {
  base::FakeClock clock;
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, StagingSegment::Create(UniqueName(), 1, 4096, std::nullopt, &clock));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::ZeroDuration()));
  CKPTD_ASSERT_OK(seg->Publish(slot, 3));
  ASSERT_THAT(seg->TakeReady(), Optional(slot));
  BackgroundAcquire trainer(seg.get(), absl::Seconds(10), &clock);
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 1; }));
  EXPECT_FALSE(trainer.done());  // PERSISTING is not to be taken
  CKPTD_ASSERT_OK(seg->Keep(slot));
  EXPECT_THAT(trainer.Get(), IsOkAndHolds(slot));
  EXPECT_EQ(seg->state(slot), SlotState::kFilling);
}

TEST(StagingSegmentTest, TakeKeptOnlyForTheStepItHolds) {
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, StagingSegment::Create(UniqueName(), 2, 4096));
  CKPTD_ASSERT_OK_AND_ASSIGN(const uint32_t slot, KeepStep(*seg, 5));
  EXPECT_FALSE(seg->TakeKept(slot, 6));
  EXPECT_EQ(seg->state(slot), SlotState::kKept);
  EXPECT_EQ(seg->step(slot), 5u);
  EXPECT_FALSE(seg->TakeKept(1 - slot, 0));  // FREE, step 0
  EXPECT_EQ(seg->state(1 - slot), SlotState::kFree);
  EXPECT_FALSE(seg->TakeKept(9, 5));
  EXPECT_TRUE(seg->TakeKept(slot, 5));
  EXPECT_EQ(seg->state(slot), SlotState::kRestoring);
  EXPECT_EQ(seg->step(slot), 5u);
  EXPECT_FALSE(seg->TakeKept(slot, 5));  // taken already
  // Restored from memory, then copied out by the trainer: FREE again.
  CKPTD_ASSERT_OK(seg->Publish(slot, 5));
  EXPECT_EQ(seg->state(slot), SlotState::kRestored);
  CKPTD_ASSERT_OK(seg->Release(slot));
  EXPECT_EQ(seg->state(slot), SlotState::kFree);
}

TEST(StagingSegmentTest, KeepOnReleaseKeepsTheRestoredStep) {
  const std::string name = UniqueName();
  CKPTD_ASSERT_OK_AND_ASSIGN(auto agent, StagingSegment::Create(name, 2, 4096));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto trainer, StagingSegment::Open(name));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, agent->AcquireForRestore(absl::ZeroDuration()));
  CKPTD_ASSERT_OK(agent->Publish(slot, 12, /*keep_on_release=*/true));
  EXPECT_EQ(trainer->state(slot), SlotState::kRestored);
  CKPTD_ASSERT_OK(trainer->Release(slot));
  EXPECT_EQ(agent->state(slot), SlotState::kKept);
  EXPECT_EQ(agent->step(slot), 12u);
  // The kept step restores again from memory; published without the flag,
  // it is FREE once copied out.
  ASSERT_TRUE(agent->TakeKept(slot, 12));
  CKPTD_ASSERT_OK(agent->Publish(slot, 12));
  CKPTD_ASSERT_OK(trainer->Release(slot));
  EXPECT_EQ(agent->state(slot), SlotState::kFree);
  // A snapshot that the trainer fills in a slot once published with the
  // flag is persisted and freed as any other.
  CKPTD_ASSERT_OK_AND_ASSIGN(slot, agent->AcquireForRestore(absl::ZeroDuration()));
  CKPTD_ASSERT_OK(agent->Publish(slot, 13, /*keep_on_release=*/true));
  CKPTD_ASSERT_OK(trainer->Release(slot));
  ASSERT_EQ(agent->state(slot), SlotState::kKept);
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t filled, trainer->AcquireForFill(absl::ZeroDuration()));
  ASSERT_NE(filled, slot);  // the FREE one first
  CKPTD_ASSERT_OK_AND_ASSIGN(filled, trainer->AcquireForFill(absl::ZeroDuration()));
  ASSERT_EQ(filled, slot);
  CKPTD_ASSERT_OK(trainer->Publish(filled, 14));
  ASSERT_THAT(agent->TakeReady(), Optional(filled));
  CKPTD_ASSERT_OK(agent->Release(filled));
  EXPECT_EQ(agent->state(filled), SlotState::kFree);
}

TEST(StagingSegmentTest, ReclaimAfterTrainerExitKeepsWhatWasToBeKept) {
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, StagingSegment::Create(UniqueName(), 4, 4096));
  CKPTD_ASSERT_OK_AND_ASSIGN(const uint32_t kept, KeepStep(*seg, 2));
  CKPTD_ASSERT_OK_AND_ASSIGN(const uint32_t ready, seg->AcquireForFill(absl::ZeroDuration()));
  CKPTD_ASSERT_OK(seg->Publish(ready, 6));
  CKPTD_ASSERT_OK_AND_ASSIGN(const uint32_t restored_keep, seg->AcquireForRestore(absl::ZeroDuration()));
  CKPTD_ASSERT_OK(seg->Publish(restored_keep, 3, /*keep_on_release=*/true));
  CKPTD_ASSERT_OK_AND_ASSIGN(const uint32_t restored, seg->AcquireForRestore(absl::ZeroDuration()));
  CKPTD_ASSERT_OK(seg->Publish(restored, 4));
  EXPECT_EQ(seg->ReclaimAfterTrainerExit(), 2);
  EXPECT_EQ(seg->state(kept), SlotState::kKept);
  EXPECT_EQ(seg->step(kept), 2u);
  EXPECT_EQ(seg->state(ready), SlotState::kReady);
  EXPECT_EQ(seg->state(restored_keep), SlotState::kKept);
  EXPECT_EQ(seg->step(restored_keep), 3u);
  EXPECT_EQ(seg->state(restored), SlotState::kFree);
  EXPECT_EQ(seg->ReclaimAfterTrainerExit(), 0);
  EXPECT_EQ(seg->state(restored_keep), SlotState::kKept);
  EXPECT_TRUE(seg->Unkeep(restored_keep, 3));
}

TEST(StagingSegmentTest, SlotsPreparedOneByOne) {
  const std::string name = UniqueName();
  constexpr uint64_t kSlotBytes = 4 << 20;
  CKPTD_ASSERT_OK_AND_ASSIGN(
      auto agent, StagingSegment::Create(name, 2, kSlotBytes, std::nullopt, nullptr, /*prepare_slots=*/false));
  EXPECT_EQ(agent->state(0), SlotState::kPreparing);
  EXPECT_EQ(agent->state(1), SlotState::kPreparing);
  EXPECT_EQ(agent->slots_prepared(), 0u);
  // Only the header is reserved so far.
  EXPECT_LT(AllocatedBytes(name), kSlotBytes);
  EXPECT_THAT(agent->AcquireForFill(absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("no free staging slot"), HasSubstr("2 of them still being allocated"))));
  EXPECT_THAT(agent->AcquireForRestore(absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("still being allocated")));
  EXPECT_EQ(agent->ReclaimAfterTrainerExit(), 0);
  agent->Prefault(0);  // not prepared: left alone
  EXPECT_EQ(agent->state(0), SlotState::kPreparing);

  CKPTD_ASSERT_OK(agent->PrepareSlot(0));
  EXPECT_EQ(agent->state(0), SlotState::kFree);
  EXPECT_EQ(agent->state(1), SlotState::kPreparing);
  EXPECT_EQ(agent->slots_prepared(), 1u);
  EXPECT_GE(AllocatedBytes(name), kSlotBytes);
  EXPECT_LT(AllocatedBytes(name), 2 * kSlotBytes);
  CKPTD_EXPECT_OK(agent->PrepareSlot(0));  // prepared already: nothing to do
  EXPECT_EQ(agent->slots_prepared(), 1u);
  EXPECT_THAT(agent->PrepareSlot(2), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not exist")));

  // The trainer's mapping of the same memory: what it writes, the agent reads.
  CKPTD_ASSERT_OK_AND_ASSIGN(auto trainer, StagingSegment::Open(name));
  EXPECT_EQ(trainer->slots_prepared(), 1u);
  trainer->Prefault(0);
  trainer->Prefault(1);  // PREPARING: left alone
  EXPECT_EQ(trainer->state(1), SlotState::kPreparing);
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, trainer->AcquireForFill(absl::ZeroDuration()));
  ASSERT_EQ(slot, 0u);
  std::memset(trainer->slot_data(slot), 0x3c, kSlotBytes);
  CKPTD_ASSERT_OK(trainer->Publish(slot, 11));
  EXPECT_THAT(trainer->AcquireForFill(absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("1 of them still being allocated")));
  ASSERT_THAT(agent->TakeReady(), Optional(slot));
  EXPECT_EQ(agent->step(slot), 11u);
  EXPECT_EQ(agent->slot_data(slot)[0], 0x3c);
  EXPECT_EQ(agent->slot_data(slot)[kSlotBytes - 1], 0x3c);

  // Every slot prepared: a full segment is "all in use" again.
  CKPTD_ASSERT_OK(agent->PrepareSlot(1));
  EXPECT_EQ(trainer->slots_prepared(), 2u);
  EXPECT_GE(AllocatedBytes(name), 2 * kSlotBytes);
  EXPECT_THAT(trainer->AcquireForFill(absl::ZeroDuration()), IsOkAndHolds(1u));
  EXPECT_THAT(trainer->AcquireForFill(absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("all in use")));
}

TEST(StagingSegmentTest, WaitingAcquireTakesASlotPreparedMeanwhile) {
  base::FakeClock clock;
  CKPTD_ASSERT_OK_AND_ASSIGN(
      auto seg, StagingSegment::Create(UniqueName(), 1, 4096, std::nullopt, &clock, /*prepare_slots=*/false));
  BackgroundAcquire trainer(seg.get(), absl::Seconds(10), &clock);
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 1; }));
  EXPECT_FALSE(trainer.done());
  CKPTD_ASSERT_OK(seg->PrepareSlot(0));
  EXPECT_THAT(trainer.Get(), IsOkAndHolds(0u));
}

TEST(StagingSegmentTest, OnlyTheCreatorPreparesSlots) {
  const std::string name = UniqueName();
  CKPTD_ASSERT_OK_AND_ASSIGN(auto agent,
                             StagingSegment::Create(name, 2, 4096, std::nullopt, nullptr, /*prepare_slots=*/false));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto trainer, StagingSegment::Open(name));
  EXPECT_THAT(trainer->PrepareSlot(0),
              StatusIs(absl::StatusCode::kFailedPrecondition, AllOf(HasSubstr(name), HasSubstr("only its creator"))));
  EXPECT_EQ(agent->state(0), SlotState::kPreparing);
  EXPECT_EQ(trainer->slots_prepared(), 0u);
  CKPTD_ASSERT_OK(agent->PrepareSlot(0));
  CKPTD_EXPECT_OK(trainer->PrepareSlot(0));  // FREE now: nothing to do
  EXPECT_EQ(trainer->state(0), SlotState::kFree);
  EXPECT_EQ(trainer->state(1), SlotState::kPreparing);
}

// Runs `fn` in a child process with a /dev/shm of its own: a tmpfs mounted
// with `options` in a mount namespace of its own, gone with the child.
// Returns what `fn` returned, or "skip: <why>" when the child cannot have it.
std::string WithOwnShm(const std::string& options, const std::function<std::string()>& fn) {
  if (::geteuid() != 0) return "skip: needs root, to mount a tmpfs of its own on /dev/shm";
  return ckptd::testing::RunInChild([&]() -> std::string {
    if (::unshare(CLONE_NEWNS) != 0) return absl::StrCat("skip: unshare(CLONE_NEWNS): ", std::strerror(errno));
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      return absl::StrCat("skip: making mounts private: ", std::strerror(errno));
    }
    const std::string all = absl::StrCat("mode=1777,", options);
    if (::mount("ckptd-test", kShmDir, "tmpfs", MS_NOSUID | MS_NODEV, all.c_str()) != 0) {
      // Not allowed here is a reason to skip; options refused are a failure.
      const int err = errno;
      return absl::StrCat(err == EPERM || err == EACCES ? "skip: " : "", "mounting a tmpfs with ", all, " on ",
                          kShmDir, ": ", std::strerror(err));
    }
    return fn();
  });
}

#define RUN_WITH_OWN_SHM(options, fn)                                   \
  do {                                                                  \
    const std::string result = WithOwnShm(options, fn);                 \
    if (absl::StartsWith(result, "skip: ")) GTEST_SKIP() << result;     \
    EXPECT_EQ(result, "ok");                                            \
  } while (false)

// Checks in a child: the first that fails says what it found.
#define CHILD_CHECK(cond, ...) \
  if (!(cond)) return absl::StrCat(#cond, ": ", __VA_ARGS__)

uint64_t FreeShmBytes() {
  struct statvfs st;
  return ::statvfs(kShmDir, &st) == 0 ? static_cast<uint64_t>(st.f_bfree) * st.f_frsize : 0;
}

std::string FillingAFullShm() {
  // 3 slots of 3 MiB do not fit in 8 MiB: the third is refused, the
  // others keep what they hold.
  const std::string name = UniqueName();
  absl::StatusOr<std::unique_ptr<StagingSegment>> agent =
      StagingSegment::Create(name, 3, 3 << 20, std::nullopt, nullptr, /*prepare_slots=*/false);
  CHILD_CHECK(agent.ok(), agent.status().ToString());
  for (uint32_t slot : {0u, 1u}) {
    const absl::Status s = (*agent)->PrepareSlot(slot);
    CHILD_CHECK(s.ok(), s.ToString());
  }
  absl::StatusOr<std::unique_ptr<StagingSegment>> trainer = StagingSegment::Open(name);
  CHILD_CHECK(trainer.ok(), trainer.status().ToString());
  absl::StatusOr<uint32_t> slot = (*trainer)->AcquireForFill(absl::ZeroDuration());
  CHILD_CHECK(slot.ok(), slot.status().ToString());
  std::memset((*trainer)->slot_data(*slot), 0x5a, 3 << 20);
  const uint64_t free_before = FreeShmBytes();
  const absl::Status full = (*agent)->PrepareSlot(2);
  CHILD_CHECK(!full.ok(), "slot 2 was prepared");
  const std::string why = full.ToString();
  CHILD_CHECK(absl::StrContains(why, "reserving 3145728 bytes of shared memory for staging slot 2 of " + name) &&
                  absl::StrContains(why, std::strerror(ENOSPC)),
              why);
  CHILD_CHECK((*agent)->state(2) == SlotState::kPreparing, SlotStateName((*agent)->state(2)));
  CHILD_CHECK((*agent)->slot_data(*slot)[0] == 0x5a && (*agent)->slot_data(*slot)[(3 << 20) - 1] == 0x5a,
              "slot ", *slot, " lost its bytes");
  // A segment made whole at once is refused, and leaves no name behind.
  const std::string whole = UniqueName();
  absl::StatusOr<std::unique_ptr<StagingSegment>> big = StagingSegment::Create(whole, 2, 4 << 20);
  CHILD_CHECK(!big.ok(), "a 8 MiB segment was made beside 6 MiB in a tmpfs of 8 MiB");
  CHILD_CHECK(absl::StrContains(big.status().message(), "reserving") &&
                  absl::StrContains(big.status().message(), std::strerror(ENOSPC)),
              big.status().ToString());
  CHILD_CHECK(::access(absl::StrCat(kShmDir, whole).c_str(), F_OK) != 0, whole, " is left behind");
  // What the refused slot had taken before /dev/shm filled up is given
  // back: the rest of /dev/shm is still there for others.
  CHILD_CHECK(FreeShmBytes() >= free_before, FreeShmBytes(), " bytes free after, ", free_before, " before");
  absl::StatusOr<std::unique_ptr<StagingSegment>> small = StagingSegment::Create(UniqueName(), 1, 1 << 20);
  CHILD_CHECK(small.ok(), "a 1 MiB segment after the refused slot: ", small.status().ToString());
  return "ok";
}

TEST(StagingSegmentTest, AFullDevShmIsAClearErrorNotASigbus) {
  RUN_WITH_OWN_SHM("size=8m", FillingAFullShm);
}

// The kernel's setting for shared memory's huge pages ("always within_size
// advise [never] deny force"), "" without them.
std::string ShmemHugePageModes() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string modes;
  return std::getline(f, modes) ? modes : "";
}

bool KernelHasShmemHugePages() {
  const std::string modes = ShmemHugePageModes();
  return !modes.empty() && !absl::StrContains(modes, "[deny]") && ::prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) != 1;
}

// /proc/vmstat's count of huge page allocations for files (shared memory
// included) that found no free huge page.
uint64_t HugePageFallbacks() {
  std::ifstream f("/proc/vmstat");
  std::string key;
  uint64_t value = 0;
  while (f >> key >> value) {
    if (key == "thp_file_fallback") return value;
  }
  return 0;
}

TEST(StagingSegmentTest, AFullDevShmWithHugePagesIsAClearErrorToo) {
  if (!KernelHasShmemHugePages()) GTEST_SKIP() << "this kernel gives shared memory no huge pages";
  RUN_WITH_OWN_SHM("size=8m,huge=advise", FillingAFullShm);
}

TEST(StagingSegmentTest, SlotsMadeInTheBackgroundGetHugePagesWhereDevShmOffersThem) {
  if (!KernelHasShmemHugePages()) GTEST_SKIP() << "this kernel gives shared memory no huge pages";
  constexpr uint64_t kSlotBytes = 8 << 20;
  RUN_WITH_OWN_SHM("size=64m,huge=advise", [&]() -> std::string {
    const std::string name = UniqueName();
    absl::StatusOr<std::unique_ptr<StagingSegment>> agent =
        StagingSegment::Create(name, 2, kSlotBytes, std::nullopt, nullptr, /*prepare_slots=*/false);
    CHILD_CHECK(agent.ok(), agent.status().ToString());
    const uint64_t fallbacks = HugePageFallbacks();
    for (uint32_t slot : {0u, 1u}) {
      const absl::Status s = (*agent)->PrepareSlot(slot);
      CHILD_CHECK(s.ok(), s.ToString());
    }
    const MappedPages a = (*agent)->Mapped();
    if (a.huge_bytes == 0 && HugePageFallbacks() > fallbacks) {
      return std::string("skip: the kernel found no free huge page (memory too fragmented)");
    }
    CHILD_CHECK(a.bytes == (*agent)->total_bytes(), a.bytes, " bytes mapped");
    // 2 MiB pages where the kernel found them (all but the first, which
    // holds the header, when memory is not fragmented).
    CHILD_CHECK(a.huge_bytes > 0 && a.huge_bytes % (2 << 20) == 0 && a.huge_bytes < a.bytes, a.huge_bytes,
                " bytes on huge pages");
    // The trainer maps what the agent made: its reads take huge pages too.
    absl::StatusOr<std::unique_ptr<StagingSegment>> trainer = StagingSegment::Open(name);
    CHILD_CHECK(trainer.ok(), trainer.status().ToString());
    CHILD_CHECK((*trainer)->Mapped().huge_bytes == 0, (*trainer)->Mapped().huge_bytes, " before a read");
    (*trainer)->Prefault(1);
    const MappedPages t = (*trainer)->Mapped();
    CHILD_CHECK(t.huge_bytes > 0 && t.huge_bytes <= kSlotBytes, t.huge_bytes, " bytes on huge pages");
    // Both mappings, by name.
    const MappedPages both = MappedStaging(name);
    CHILD_CHECK(both.bytes == 2 * a.bytes && both.huge_bytes == a.huge_bytes + t.huge_bytes, both.bytes, " and ",
                both.huge_bytes);
    return "ok";
  });
}

TEST(StagingSegmentTest, NoHugePagesUnlessDevShmOffersThem) {
  // "force" gives them whatever the mount says.
  if (absl::StrContains(ShmemHugePageModes(), "[force]")) GTEST_SKIP() << "shared memory has huge pages forced";
  RUN_WITH_OWN_SHM("size=64m,huge=never", [&]() -> std::string {
    const std::string name = UniqueName();
    absl::StatusOr<std::unique_ptr<StagingSegment>> agent =
        StagingSegment::Create(name, 2, 8 << 20, std::nullopt, nullptr, /*prepare_slots=*/false);
    CHILD_CHECK(agent.ok(), agent.status().ToString());
    for (uint32_t slot : {0u, 1u}) {
      const absl::Status s = (*agent)->PrepareSlot(slot);
      CHILD_CHECK(s.ok(), s.ToString());
    }
    const MappedPages a = (*agent)->Mapped();
    CHILD_CHECK(a.bytes == (*agent)->total_bytes() && a.huge_bytes == 0, a.bytes, " and ", a.huge_bytes);
    CHILD_CHECK(MappedStaging("/no-such-segment").bytes == 0, "a mapping was found");
    return "ok";
  });
}

}  // namespace
}  // namespace ckptd::staging

namespace ckptd::staging {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;

// A raw shared-memory object, as a killed agent leaves it.
bool MakeShm(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}
bool ShmExists(const std::string& name) { return ::access(("/dev/shm" + name).c_str(), F_OK) == 0; }

TEST(ReclaimStaleSegmentsTest, FreesSegmentsOfDeadAgentsOnly) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // now a pid of nobody
  const std::string dead = absl::StrCat("/ckptd-", child, "-3");
  const std::string dead_tagged = absl::StrCat("/ckptd-", child, "-0badc0de-3");
  const std::string live = absl::StrCat("/ckptd-", ::getppid(), "-12345678-3");  // a live process's
  const std::string own = AgentSegmentPrefix() + "-3";
  // This process's pid with another tag: a predecessor in another PID
  // namespace (a restarted agent container is pid 1 again).
  const std::string predecessor = absl::StrCat("/ckptd-", ::getpid(), "-",
                                               AgentSegmentPrefix().substr(AgentSegmentPrefix().size() - 8) ==
                                                       "00000000"
                                                   ? "11111111"
                                                   : "00000000",
                                               "-3");
  const std::string other = absl::StrCat("/ckptd-test-", child, "-3");  // not an agent's name
  const std::string not_a_tag = absl::StrCat("/ckptd-", child, "-xyz-3");
  for (const std::string& s : {dead, dead_tagged, live, own, predecessor, other, not_a_tag}) ASSERT_TRUE(MakeShm(s)) << s;
  absl::StatusOr<std::vector<std::string>> removed = ReclaimStaleSegments();
  ASSERT_THAT(removed.status(), IsOk());
  EXPECT_THAT(*removed, ::testing::IsSupersetOf({dead.substr(1), dead_tagged.substr(1), predecessor.substr(1)}));
  for (const std::string& s : {dead, dead_tagged, predecessor}) EXPECT_FALSE(ShmExists(s)) << s;
  for (const std::string& s : {live, own, other, not_a_tag}) {
    EXPECT_TRUE(ShmExists(s)) << s;
    ::shm_unlink(s.c_str());
  }
  EXPECT_THAT(ReclaimStaleSegments("/no/such/dir").status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::HasSubstr("/no/such/dir")));
}

}  // namespace
}  // namespace ckptd::staging

namespace ckptd::staging {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::RunAs;
using ::ckptd::testing::StatusIs;
using ::ckptd::testing::TestUser;
using ::ckptd::testing::UnusedIds;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr FileAccess kShm{0, 0, 01777};

TEST(CheckSegmentAccessTest, OwnSegmentWithoutAccessForOthers) {
  const SegmentOpener me{1000, {1000, 50}, std::nullopt};
  EXPECT_THAT(CheckSegmentAccess("/dev/shm/s", {1000, 1000, 0600}, "/dev/shm", kShm, me), IsOk());
  // The agent's own user, with --trainer-group: its segment is 0660 for the group.
  EXPECT_THAT(CheckSegmentAccess("/dev/shm/s", {1000, 77, 0660}, "/dev/shm", kShm, me), IsOk());
  EXPECT_THAT(CheckSegmentAccess("/dev/shm/s", {1000, 1000, 0604}, "/dev/shm", kShm, me),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("staging segment /dev/shm/s (owner uid 1000, group 1000, mode 0604)"),
                             HasSubstr("gives other users access"))));
}

TEST(CheckSegmentAccessTest, AgentsSegmentThroughAGroupOfTheOpener) {
  const SegmentOpener trainer{1002, {1002, 500}, 1001};
  EXPECT_THAT(CheckSegmentAccess("/dev/shm/s", {1001, 500, 0660}, "/dev/shm", kShm, trainer), IsOk());
  // Not shared with a group, or with a group the trainer is not in.
  EXPECT_THAT(CheckSegmentAccess("/dev/shm/s", {1001, 500, 0600}, "/dev/shm", kShm, trainer),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("is not shared with its group")));
  EXPECT_THAT(CheckSegmentAccess("/dev/shm/s", {1001, 500, 0640}, "/dev/shm", kShm, trainer),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("is not shared with its group")));
  EXPECT_THAT(CheckSegmentAccess("/dev/shm/s", {1001, 501, 0660}, "/dev/shm", kShm, trainer),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("(owner uid 1001, group 501, mode 0660)"),
                             HasSubstr("shared with group 501, which this process is not in"),
                             HasSubstr("this process: uid 1002, groups 1002,500; the agent's uid 1001"))));
  EXPECT_THAT(CheckSegmentAccess("/dev/shm/s", {1001, 500, 0666}, "/dev/shm", kShm, trainer),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("gives other users access")));
  // A third user's, even in the group: it could have planted it.
  EXPECT_THAT(CheckSegmentAccess("/dev/shm/s", {1003, 500, 0660}, "/dev/shm", kShm, trainer),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("belongs to neither this process's user nor the agent's"),
                             HasSubstr("expected the owner to be uid 1002 or 1001"))));
  // Without the agent's uid, only the opener's own segments.
  EXPECT_THAT(CheckSegmentAccess("/dev/shm/s", {1001, 500, 0660}, "/dev/shm", kShm, {1002, {1002, 500}, {}}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("(the agent's uid not known)")));
  // Root may use the agent's segment without being in its group.
  EXPECT_THAT(CheckSegmentAccess("/dev/shm/s", {1001, 1001, 0600}, "/dev/shm", kShm, {0, {0}, 1001}), IsOk());
  EXPECT_THAT(CheckSegmentAccess("/dev/shm/s", {1003, 1003, 0600}, "/dev/shm", kShm, {0, {0}, 1001}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("belongs to neither")));
}

TEST(CheckSegmentAccessTest, DirectoryWhereOthersCannotReplaceSegments) {
  const SegmentOpener trainer{1002, {1002, 500}, 1001};
  const FileAccess seg{1001, 500, 0660};
  EXPECT_THAT(CheckSegmentAccess("/d/s", seg, "/d", {0, 0, 0755}, trainer), IsOk());
  EXPECT_THAT(CheckSegmentAccess("/d/s", seg, "/d", {1001, 1001, 0700}, trainer), IsOk());
  EXPECT_THAT(CheckSegmentAccess("/d/s", seg, "/d", {1001, 500, 03770}, trainer), IsOk());
  // A segment of the opener's own is for it alone, wherever it is.
  EXPECT_THAT(CheckSegmentAccess("/d/s", {1002, 1002, 0600}, "/d", {0, 0, 0777}, trainer), IsOk());
  EXPECT_THAT(CheckSegmentAccess("/d/s", seg, "/d", {0, 0, 0777}, trainer),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("staging directory /d (owner uid 0, group 0, mode 0777)"),
                             HasSubstr("lets other users replace /d/s"), HasSubstr("sticky"))));
  EXPECT_THAT(CheckSegmentAccess("/d/s", seg, "/d", {0, 500, 0775}, trainer),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("lets other users replace")));
  EXPECT_THAT(CheckSegmentAccess("/d/s", seg, "/d", {1003, 1003, 01777}, trainer),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("lets other users replace")));
  EXPECT_THAT(CheckSegmentAccess("/d/s", seg, "/d", {0, 0, 0777}, {0, {0}, 1001}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("lets other users replace")));
}

std::string Result(const absl::Status& s) { return s.ok() ? "ok" : s.ToString(); }

// Agent A and trainers B and C: A and B are members of group G, C is not; D,
// a member of G too, is neither the agent nor the trainer.
class TrainerGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root, to act as users of its own making (setuid)";
    const std::vector<uint32_t> ids = UnusedIds(5);
    if (ids.size() < 5) GTEST_SKIP() << "no 5 unused uids and gids in 61000..61999";
    g_ = ids[0];
    a_ = {ids[1], {ids[1], g_}};
    b_ = {ids[2], {ids[2], g_}};
    c_ = {ids[3], {ids[3]}};
    d_ = {ids[4], {ids[4], g_}};
    const std::string probe = RunAs(a_, [] { return std::string("ok"); });
    if (probe != "ok") GTEST_SKIP() << "root here cannot act as another user: " << probe;
    struct stat st;
    ASSERT_EQ(::stat(kShmDir, &st), 0);
    // Every user must be able to create and reach segments in it.
    ASSERT_EQ(st.st_mode & 07777, 01777u) << kShmDir << " is not 1777";
  }
  void TearDown() override {
    for (const std::string& name : names_) ::shm_unlink(name.c_str());
  }

  // A segment made by `user` (group `group` when given) and left behind.
  std::string Make(const TestUser& user, std::optional<uint32_t> group) {
    const std::string name = UniqueName();
    names_.push_back(name);
    const std::string made = RunAs(user, [&] {
      absl::StatusOr<std::unique_ptr<StagingSegment>> seg = StagingSegment::Create(name, 2, 4096, group);
      if (!seg.ok()) return Result(seg.status());
      std::memset((*seg)->slot_data(0), 0xa5, 4096);
      (void)seg->release();  // the name stays, as if the agent were still running
      return std::string("ok");
    });
    EXPECT_EQ(made, "ok");
    return name;
  }

  static std::string Path(const std::string& name) { return absl::StrCat(kShmDir, name); }
  std::string Owned(const TestUser& user, uint32_t group, int mode) {
    return absl::StrFormat("(owner uid %u, group %u, mode %04o)", user.uid, group, mode);
  }

  uint32_t g_ = 0;
  TestUser a_, b_, c_, d_;
  std::vector<std::string> names_;
};

TEST_F(TrainerGroupTest, AnotherUserOfTheGroupUsesTheAgentsSegment) {
  const std::string name = Make(a_, g_);
  struct stat st;
  ASSERT_EQ(::stat(Path(name).c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, a_.uid);
  EXPECT_EQ(st.st_gid, g_);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  // Trainer B (in G) sees what the agent wrote and publishes a snapshot.
  EXPECT_EQ(RunAs(b_,
                  [&] {
                    absl::StatusOr<std::unique_ptr<StagingSegment>> seg = StagingSegment::Open(name, nullptr, a_.uid);
                    if (!seg.ok()) return Result(seg.status());
                    if ((*seg)->slot_data(0)[4095] != 0xa5) return std::string("not the agent's data");
                    absl::StatusOr<uint32_t> slot = (*seg)->AcquireForFill(absl::ZeroDuration());
                    if (!slot.ok()) return Result(slot.status());
                    std::memset((*seg)->slot_data(*slot), 0x5b, 4096);
                    return Result((*seg)->Publish(*slot, 7));
                  }),
            "ok");
  // The agent's user opens it as well (its own, group-shared), and finds the snapshot.
  EXPECT_EQ(RunAs(a_,
                  [&] {
                    absl::StatusOr<std::unique_ptr<StagingSegment>> seg = StagingSegment::Open(name);
                    if (!seg.ok()) return Result(seg.status());
                    std::optional<uint32_t> slot = (*seg)->TakeReady();
                    if (!slot || (*seg)->step(*slot) != 7 || (*seg)->slot_data(*slot)[4095] != 0x5b) {
                      return std::string("no snapshot of step 7");
                    }
                    return Result((*seg)->Release(*slot));
                  }),
            "ok");
  // So does root, from the agent.
  EXPECT_THAT(StagingSegment::Open(name, nullptr, a_.uid), IsOk());
  // C, not in G, is refused, and told why.
  const std::string refused = RunAs(c_, [&] { return Result(StagingSegment::Open(name, nullptr, a_.uid).status()); });
  EXPECT_THAT(refused,
              AllOf(HasSubstr("PERMISSION_DENIED: staging segment " + Path(name)), HasSubstr(Owned(a_, g_, 0660)),
                    HasSubstr(absl::StrCat("shared with group ", g_, ", which this process is not in")),
                    HasSubstr("--trainer-group")));
  // B, not told who the agent is, trusts no segment of another user.
  EXPECT_THAT(RunAs(b_, [&] { return Result(StagingSegment::Open(name).status()); }),
              AllOf(HasSubstr("PERMISSION_DENIED"), HasSubstr(Owned(a_, g_, 0660)),
                    HasSubstr("belongs to neither this process's user nor the agent's")));
}

TEST_F(TrainerGroupTest, RefusesWhatAnotherUserCouldHavePlantedOrOthersCanReach) {
  // D is in G, but it is not the agent: its segment is refused.
  const std::string planted = Make(d_, g_);
  EXPECT_THAT(RunAs(b_, [&] { return Result(StagingSegment::Open(planted, nullptr, a_.uid).status()); }),
              AllOf(HasSubstr("PERMISSION_DENIED: staging segment " + Path(planted)), HasSubstr(Owned(d_, g_, 0660)),
                    HasSubstr("belongs to neither"),
                    HasSubstr(absl::StrCat("expected the owner to be uid ", b_.uid, " or ", a_.uid))));
  // The agent's segment without --trainer-group is not for B.
  const std::string private_one = Make(a_, std::nullopt);
  EXPECT_THAT(RunAs(b_, [&] { return Result(StagingSegment::Open(private_one, nullptr, a_.uid).status()); }),
              AllOf(HasSubstr("PERMISSION_DENIED"), HasSubstr(Owned(a_, a_.groups[0], 0600)),
                    HasSubstr("not shared with its group")));
  // Nor one that every user can reach, for anyone.
  const std::string open_one = Make(a_, g_);
  ASSERT_EQ(::chmod(Path(open_one).c_str(), 0666), 0);
  for (const TestUser* user : {&a_, &b_, &c_}) {
    EXPECT_THAT(
        RunAs(*user, [&] { return Result(StagingSegment::Open(open_one, nullptr, a_.uid).status()); }),
        AllOf(HasSubstr("PERMISSION_DENIED"), HasSubstr(Owned(a_, g_, 0666)), HasSubstr("gives other users access")))
        << user->uid;
  }
}

}  // namespace
}  // namespace ckptd::staging
