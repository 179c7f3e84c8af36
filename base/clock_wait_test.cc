// Waiting on a Clock: RealClock forwards to absl; FakeClock's waits end when
// their condition holds or when the test moves the clock past the deadline.
#include <atomic>
#include <functional>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/testing/eventually.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

using ::ckptd::testing::Eventually;

// A flag guarded by a mutex, and a thread that waits on it through a clock.
class Flag {
 public:
  void Set() {
    absl::MutexLock l(&mu_);
    set_ = true;
  }
  // Waits through `clock` until set or `timeout` passes; returns whether set.
  bool Await(Clock* clock, absl::Duration timeout) {
    absl::MutexLock l(&mu_);
    return clock->AwaitWithTimeout(&mu_, absl::Condition(&set_), timeout);
  }
  bool AwaitUntil(Clock* clock, absl::Time deadline) {
    absl::MutexLock l(&mu_);
    return clock->AwaitWithDeadline(&mu_, absl::Condition(&set_), deadline);
  }

 private:
  absl::Mutex mu_;
  bool set_ ABSL_GUARDED_BY(mu_) = false;
};

// Runs `wait` on a thread of its own; result() once it returned. Going, it
// first sets `clock` (if any) past every deadline, so that a test that failed
// half-way does not hang.
class Waiter {
 public:
  explicit Waiter(std::function<bool()> wait, FakeClock* clock = nullptr)
      : clock_(clock), thread_([this, wait = std::move(wait)] {
          const bool r = wait();
          absl::MutexLock l(&mu_);
          result_ = r;
        }) {}
  ~Waiter() {
    if (clock_ != nullptr) clock_->Set(absl::InfiniteFuture());
    thread_.join();
  }
  std::optional<bool> result() {
    absl::MutexLock l(&mu_);
    return result_;
  }
  bool Returned() { return Eventually([this] { return result().has_value(); }); }

 private:
  FakeClock* const clock_;
  absl::Mutex mu_;
  std::optional<bool> result_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

TEST(RealClockWaitTest, AwaitReturnsAtOnceWhenTheConditionHolds) {
  Flag flag;
  flag.Set();
  const absl::Time start = absl::Now();
  EXPECT_TRUE(flag.Await(RealClock::Get(), absl::Hours(1)));
  EXPECT_LT(absl::Now() - start, absl::Minutes(1));
}

TEST(RealClockWaitTest, AwaitGivesUpAtTheDeadline) {
  Flag flag;
  const absl::Time start = absl::Now();
  EXPECT_FALSE(flag.Await(RealClock::Get(), absl::Milliseconds(20)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(20));
  EXPECT_FALSE(flag.AwaitUntil(RealClock::Get(), absl::InfinitePast()));
}

TEST(RealClockWaitTest, AwaitEndsWhenAnotherThreadSetsTheCondition) {
  Flag flag;
  Waiter w([&] { return flag.Await(RealClock::Get(), absl::Hours(1)); });
  flag.Set();
  ASSERT_TRUE(w.Returned());
  EXPECT_EQ(w.result(), true);
}

TEST(RealClockWaitTest, SleepForAndSleepUntil) {
  Clock* clock = RealClock::Get();
  const absl::Time start = absl::Now();
  clock->SleepFor(absl::Milliseconds(20));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(20));
  clock->SleepUntil(absl::Now() + absl::Milliseconds(5));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(25));
  clock->SleepUntil(absl::InfinitePast());  // at once
  clock->SleepFor(-absl::Seconds(1));
}

TEST(FakeClockWaitTest, AwaitReturnsAtOnceWhenTheConditionHoldsOrTheDeadlinePassed) {
  FakeClock clock;
  Flag flag;
  EXPECT_FALSE(flag.Await(&clock, absl::ZeroDuration()));
  EXPECT_FALSE(flag.Await(&clock, -absl::Seconds(1)));
  EXPECT_FALSE(flag.AwaitUntil(&clock, clock.Now()));
  flag.Set();
  EXPECT_TRUE(flag.Await(&clock, absl::Hours(1)));
  EXPECT_TRUE(flag.Await(&clock, absl::ZeroDuration()));
  EXPECT_EQ(clock.waiters(), 0);
}

TEST(FakeClockWaitTest, AwaitEndsWhenTheClockReachesTheDeadline) {
  FakeClock clock;
  Flag flag;
  Waiter w([&] { return flag.Await(&clock, absl::Seconds(10)); }, &clock);
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 1; }));
  clock.Advance(absl::Seconds(9));
  // Advance returned: the waiter saw the new time and kept waiting.
  EXPECT_EQ(clock.waiters(), 1);
  EXPECT_EQ(w.result(), std::nullopt);
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(clock.waiters(), 0);  // gone by the time Advance returned
  ASSERT_TRUE(w.Returned());
  EXPECT_EQ(w.result(), false);
}

TEST(FakeClockWaitTest, AwaitEndsWhenTheConditionComesTrueWithoutTimeMoving) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  Flag flag;
  Waiter w([&] { return flag.Await(&clock, absl::Seconds(10)); }, &clock);
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 1; }));
  flag.Set();
  ASSERT_TRUE(w.Returned());
  EXPECT_EQ(w.result(), true);
  EXPECT_EQ(clock.Now(), start);
  EXPECT_EQ(clock.waiters(), 0);
}

TEST(FakeClockWaitTest, AnInfiniteTimeoutEndsOnlyByTheCondition) {
  FakeClock clock;
  Flag flag;
  Waiter w([&] { return flag.Await(&clock, absl::InfiniteDuration()); }, &clock);
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 1; }));
  clock.Advance(absl::Hours(24 * 365 * 100));
  EXPECT_EQ(clock.waiters(), 1);
  flag.Set();
  ASSERT_TRUE(w.Returned());
  EXPECT_EQ(w.result(), true);
}

TEST(FakeClockWaitTest, SetMovesWaitersEitherWay) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  Flag flag;
  Waiter w([&] { return flag.AwaitUntil(&clock, start + absl::Minutes(1)); }, &clock);
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 1; }));
  clock.Set(start - absl::Hours(1));  // backwards: still waiting
  EXPECT_EQ(clock.waiters(), 1);
  clock.Set(start + absl::Minutes(1));
  EXPECT_EQ(clock.waiters(), 0);
  ASSERT_TRUE(w.Returned());
  EXPECT_EQ(w.result(), false);
}

TEST(FakeClockWaitTest, SleepEndsWhenTheClockGetsThere) {
  FakeClock clock;
  Clock* c = &clock;
  c->SleepFor(absl::ZeroDuration());  // at once
  c->SleepUntil(clock.Now() - absl::Seconds(1));
  Waiter w(
      [&] {
        c->SleepFor(absl::Seconds(30));
        return true;
      },
      &clock);
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 1; }));
  clock.Advance(absl::Seconds(29));
  EXPECT_EQ(clock.waiters(), 1);
  EXPECT_EQ(w.result(), std::nullopt);
  clock.Advance(absl::Seconds(2));
  ASSERT_TRUE(w.Returned());
}

TEST(FakeClockWaitTest, EachWaiterEndsAtItsOwnDeadline) {
  FakeClock clock;
  Flag never;
  std::atomic<bool> slept{false};
  Waiter soon([&] { return never.Await(&clock, absl::Seconds(1)); }, &clock);
  Waiter later([&] { return never.Await(&clock, absl::Seconds(5)); }, &clock);
  Waiter sleeper(
      [&] {
        clock.SleepFor(absl::Seconds(3));
        slept = true;
        return true;
      },
      &clock);
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 3; }));
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(clock.waiters(), 2);
  ASSERT_TRUE(soon.Returned());
  EXPECT_EQ(later.result(), std::nullopt);
  EXPECT_FALSE(slept);
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(clock.waiters(), 1);
  ASSERT_TRUE(sleeper.Returned());
  EXPECT_TRUE(slept);
  EXPECT_EQ(later.result(), std::nullopt);
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(clock.waiters(), 0);
  ASSERT_TRUE(later.Returned());
  EXPECT_EQ(later.result(), false);
}

TEST(FakeClockWaitTest, AdvanceByZeroMakesWaitersLookAgain) {
  FakeClock clock;
  absl::Mutex mu;
  // Changed without the waiter's mutex, as another process changes shared
  // memory: only a new look at the condition notices.
  std::atomic<bool> ready{false};
  Waiter w(
      [&] {
        absl::MutexLock l(&mu);
        return clock.AwaitWithTimeout(
            &mu, absl::Condition(+[](std::atomic<bool>* r) { return r->load(); }, &ready), absl::Hours(1));
      },
      &clock);
  ASSERT_TRUE(Eventually([&] { return clock.waiters() == 1; }));
  clock.Advance(absl::ZeroDuration());
  EXPECT_EQ(clock.waiters(), 1);
  ready = true;
  clock.Advance(absl::ZeroDuration());
  EXPECT_EQ(clock.waiters(), 0);
  ASSERT_TRUE(w.Returned());
  EXPECT_EQ(w.result(), true);
}

TEST(FakeClockWaitTest, AdvanceWithoutWaitersReturnsAtOnce) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  for (int i = 0; i < 1000; ++i) clock.Advance(absl::Milliseconds(1));
  EXPECT_EQ(clock.Now(), start + absl::Seconds(1));
  EXPECT_EQ(clock.waiters(), 0);
}

}  // namespace
}  // namespace ckptd::base
