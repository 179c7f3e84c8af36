#include "staging/staging.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/clock.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::staging {
namespace {

using ::ckptd::testing::Eventually;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::StatusIs;
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
  EXPECT_THAT(StagingSegment::Open(name), StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("not private")));
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
