#include "protocol/schedule.h"

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <vector>

#include "ckptd/v1/coordinator.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::protocol {
namespace {

using ::ckptd::v1::Schedule;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

Schedule MakeSchedule(uint64_t start_step, uint64_t every_steps, std::initializer_list<uint64_t> extra_steps = {}) {
  Schedule s;
  s.set_job("job-a");
  s.set_start_step(start_step);
  s.set_every_steps(every_steps);
  for (uint64_t e : extra_steps) s.add_extra_steps(e);
  return s;
}

// The steps in [first, last] that `schedule` asks for.
std::vector<uint64_t> ScheduledIn(const Schedule& schedule, uint64_t first, uint64_t last) {
  std::vector<uint64_t> steps;
  for (uint64_t step = first; step <= last; ++step) {
    if (ScheduledAt(schedule, step)) steps.push_back(step);
  }
  return steps;
}

TEST(ScheduledAtTest, EmptyScheduleAsksForNothing) { EXPECT_THAT(ScheduledIn(Schedule(), 0, 1000), IsEmpty()); }

TEST(ScheduledAtTest, StepZeroNever) {
  EXPECT_FALSE(ScheduledAt(MakeSchedule(0, 1), 0));
  EXPECT_FALSE(ScheduledAt(MakeSchedule(0, 100), 0));
  EXPECT_FALSE(ScheduledAt(MakeSchedule(0, 0, {0}), 0));
  EXPECT_FALSE(ScheduledAt(MakeSchedule(0, 7, {0, 1}), 0));
  EXPECT_TRUE(ScheduledAt(MakeSchedule(0, 7, {0, 1}), 1));
}

TEST(ScheduledAtTest, EveryStepsFromZero) {
  EXPECT_THAT(ScheduledIn(MakeSchedule(0, 100), 0, 450), ElementsAre(100, 200, 300, 400));
  EXPECT_THAT(ScheduledIn(MakeSchedule(0, 1), 0, 5), ElementsAre(1, 2, 3, 4, 5));
}

TEST(ScheduledAtTest, EveryStepsCountsFromStartStep) {
  const Schedule s = MakeSchedule(250, 100);
  EXPECT_THAT(ScheduledIn(s, 0, 700), ElementsAre(250, 350, 450, 550, 650));
  // Multiples of every_steps are not what counts, nor steps one off.
  EXPECT_FALSE(ScheduledAt(s, 200));
  EXPECT_FALSE(ScheduledAt(s, 300));
  EXPECT_FALSE(ScheduledAt(s, 349));
  EXPECT_FALSE(ScheduledAt(s, 351));
}

TEST(ScheduledAtTest, NothingBeforeStartStep) {
  // 150 = 250 - 100 is on the schedule's beat, but before its start.
  const Schedule s = MakeSchedule(250, 100);
  EXPECT_FALSE(ScheduledAt(s, 150));
  EXPECT_FALSE(ScheduledAt(s, 50));
  EXPECT_FALSE(ScheduledAt(s, 249));
  EXPECT_TRUE(ScheduledAt(s, 250));
  EXPECT_THAT(ScheduledIn(MakeSchedule(1000, 1), 0, 1002), ElementsAre(1000, 1001, 1002));
}

TEST(ScheduledAtTest, ExtraStepsAnywhere) {
  // Extras before the start and off the beat count too.
  const Schedule s = MakeSchedule(250, 100, {10, 260, 350});
  EXPECT_THAT(ScheduledIn(s, 0, 500), ElementsAre(10, 250, 260, 350, 450));
}

TEST(ScheduledAtTest, EveryStepsZeroMeansOnlyExtras) {
  EXPECT_THAT(ScheduledIn(MakeSchedule(0, 0, {3, 17, 42}), 0, 1000), ElementsAre(3, 17, 42));
  // start_step alone asks for nothing, not even itself.
  EXPECT_THAT(ScheduledIn(MakeSchedule(5, 0), 0, 1000), IsEmpty());
  EXPECT_THAT(ScheduledIn(MakeSchedule(5, 0, {7}), 0, 1000), ElementsAre(7));
}

TEST(ScheduledAtTest, ExtraStepsInAnyOrderAndRepeated) {
  EXPECT_THAT(ScheduledIn(MakeSchedule(0, 0, {900, 5, 900, 70}), 0, 1000), ElementsAre(5, 70, 900));
}

TEST(ScheduledAtTest, StartStepZeroAndOneDifferOnlyByTheBeat) {
  EXPECT_THAT(ScheduledIn(MakeSchedule(1, 10), 0, 35), ElementsAre(1, 11, 21, 31));
  EXPECT_THAT(ScheduledIn(MakeSchedule(0, 10), 0, 35), ElementsAre(10, 20, 30));
}

TEST(ScheduledAtTest, LargeSteps) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  const Schedule s = MakeSchedule(0, 1000);
  const uint64_t last_beat = kMax / 1000 * 1000;
  EXPECT_TRUE(ScheduledAt(s, last_beat));
  EXPECT_FALSE(ScheduledAt(s, kMax));
  EXPECT_FALSE(ScheduledAt(s, last_beat - 1));
  EXPECT_TRUE(ScheduledAt(MakeSchedule(kMax, 7), kMax));
  EXPECT_FALSE(ScheduledAt(MakeSchedule(kMax, 7), kMax - 7));
  EXPECT_TRUE(ScheduledAt(MakeSchedule(0, 0, {kMax}), kMax));
}

TEST(ScheduledAtTest, OtherFieldsDoNotMatter) {
  Schedule s = MakeSchedule(0, 50, {7});
  const std::vector<uint64_t> want = ScheduledIn(s, 0, 300);
  s.set_generation(12);
  s.set_incarnation(3);
  s.set_job("another-job");
  EXPECT_THAT(ScheduledIn(s, 0, 300), ElementsAreArray(want));
  EXPECT_THAT(want, ElementsAre(7, 50, 100, 150, 200, 250, 300));
}

// The durable steps in [first, last] of `schedule`.
std::vector<uint64_t> DurableIn(const Schedule& schedule, uint64_t first, uint64_t last) {
  std::vector<uint64_t> steps;
  for (uint64_t step = first; step <= last; ++step) {
    if (DurableAt(schedule, step)) steps.push_back(step);
  }
  return steps;
}

TEST(DurableAtTest, EveryCheckpointIsDurableWithoutASecondCadence) {
  for (uint64_t k : {0u, 1u}) {
    Schedule s = MakeSchedule(5, 10, {7});
    s.set_durable_every(k);
    EXPECT_EQ(DurableIn(s, 0, 60), ScheduledIn(s, 0, 60)) << k;
  }
}

TEST(DurableAtTest, EveryKthRuleStepFromTheStartIsDurable) {
  Schedule s = MakeSchedule(5, 10, {7});
  s.set_durable_every(3);
  s.add_memory_steps(2);
  EXPECT_THAT(ScheduledIn(s, 0, 75), ElementsAre(2, 5, 7, 15, 25, 35, 45, 55, 65, 75));
  // Rule steps 5, 35, 65 (counts 0, 3, 6), and the extra step; the memory
  // step never.
  EXPECT_THAT(DurableIn(s, 0, 75), ElementsAre(5, 7, 35, 65));
  EXPECT_FALSE(DurableAt(s, 0));
  EXPECT_FALSE(DurableAt(s, 6));  // not scheduled at all
  // An extra step listed as a memory step too is durable: durable wins.
  s.add_memory_steps(7);
  EXPECT_TRUE(DurableAt(s, 7));
}

TEST(DurableAtTest, ThePhaseShiftsWhichRuleStepsAreDurable) {
  Schedule s = MakeSchedule(5, 10);
  s.set_durable_every(3);
  s.set_durable_phase(1);  // counts 2, 5, 8: steps 25, 55, 85
  EXPECT_THAT(DurableIn(s, 0, 90), ElementsAre(25, 55, 85));
  s.set_durable_phase(4);  // the same as 1
  EXPECT_THAT(DurableIn(s, 0, 90), ElementsAre(25, 55, 85));
}

TEST(DurableAtTest, HugeStepsDoNotOverflow) {
  Schedule s = MakeSchedule(std::numeric_limits<uint64_t>::max() - 20, 10);
  s.set_durable_every(std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(DurableAt(s, std::numeric_limits<uint64_t>::max() - 20));
  EXPECT_FALSE(DurableAt(s, std::numeric_limits<uint64_t>::max() - 10));
  EXPECT_TRUE(ScheduledAt(s, std::numeric_limits<uint64_t>::max() - 10));
}

}  // namespace
}  // namespace ckptd::protocol
