#include "base/clock.h"

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

TEST(FakeClockTest, StartsAtAFixedTimeByDefault) {
  FakeClock clock;
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1'800'000'000));
  EXPECT_EQ(clock.Now(), clock.Now());  // time stands still until told
}

TEST(FakeClockTest, StartsWhereTold) {
  const absl::Time start = absl::FromUnixSeconds(1'700'000'000) + absl::Milliseconds(5);
  FakeClock clock(start);
  EXPECT_EQ(clock.Now(), start);
}

TEST(FakeClockTest, AdvanceAddsUp) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), start + absl::Seconds(5));
  clock.Advance(absl::Milliseconds(250));
  clock.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(clock.Now(), start + absl::Seconds(5) + absl::Milliseconds(250) + absl::Nanoseconds(1));
  clock.Advance(absl::ZeroDuration());
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(5250) + absl::Nanoseconds(1));
  clock.Advance(-absl::Seconds(1));  // backwards, as a stepped wall clock would
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(4250) + absl::Nanoseconds(1));
}

TEST(FakeClockTest, SetJumpsEitherWay) {
  FakeClock clock;
  const absl::Time later = absl::FromUnixSeconds(1'900'000'000);
  clock.Set(later);
  EXPECT_EQ(clock.Now(), later);
  const absl::Time earlier = absl::FromUnixSeconds(1'000);
  clock.Set(earlier);
  EXPECT_EQ(clock.Now(), earlier);
  clock.Advance(absl::Minutes(1));
  EXPECT_EQ(clock.Now(), earlier + absl::Minutes(1));
}

TEST(FakeClockTest, WorksThroughTheInterface) {
  FakeClock fake;
  Clock* clock = &fake;
  const absl::Time before = clock->Now();
  fake.Advance(absl::Hours(2));
  EXPECT_EQ(clock->Now() - before, absl::Hours(2));
}

TEST(FakeClockTest, ConcurrentAdvancesAreNotLost) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&clock] {
      for (int i = 0; i < 1000; ++i) {
        clock.Advance(absl::Milliseconds(1));
        (void)clock.Now();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(clock.Now(), start + absl::Seconds(4));
}

TEST(RealClockTest, GetReturnsTheSameClock) {
  Clock* a = RealClock::Get();
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(RealClock::Get(), a);
  Clock* from_thread = nullptr;
  std::thread([&from_thread] { from_thread = RealClock::Get(); }).join();
  EXPECT_EQ(from_thread, a);
}

TEST(RealClockTest, NowIsAbslNow) {
  Clock* clock = RealClock::Get();
  const absl::Time before = absl::Now();
  const absl::Time now = clock->Now();
  const absl::Time after = absl::Now();
  EXPECT_LE(before, now);
  EXPECT_LE(now, after);
  EXPECT_LT(after - before, absl::Seconds(1));
}

TEST(RealClockTest, AnInstanceOfItsOwnAlsoTellsTheTime) {
  RealClock clock;
  const absl::Time before = absl::Now();
  const absl::Time now = clock.Now();
  EXPECT_LE(before, now);
  EXPECT_LE(now, absl::Now());
}

}  // namespace
}  // namespace ckptd::base
