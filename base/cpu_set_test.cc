#include "base/cpu_set.h"

#include <sched.h>

#include <thread>
#include <vector>

#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(CpuSetTest, ParsesNumbersAndRanges) {
  EXPECT_THAT(ParseCpuList("0-3,8"), IsOkAndHolds(ElementsAre(0, 1, 2, 3, 8)));
  EXPECT_THAT(ParseCpuList("5"), IsOkAndHolds(ElementsAre(5)));
  EXPECT_THAT(ParseCpuList("8,2-3,3,2"), IsOkAndHolds(ElementsAre(2, 3, 8)));
  EXPECT_THAT(ParseCpuList("7-7"), IsOkAndHolds(ElementsAre(7)));
  EXPECT_THAT(ParseCpuList("8191"), IsOkAndHolds(ElementsAre(8191)));
}

TEST(CpuSetTest, RefusesWhatIsNoCpuList) {
  EXPECT_THAT(ParseCpuList(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty CPU list")));
  EXPECT_THAT(ParseCpuList("3-1"), StatusIs(absl::StatusCode::kInvalidArgument, "the range \"3-1\" goes down"));
  for (const char* bad : {"a", "1,", ",1", "-1", "1-", "1--2", "0x1", " 1", "+1", "8192", "1-99999999999"}) {
    EXPECT_THAT(ParseCpuList(bad), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not a CPU number")))
        << bad;
  }
}

TEST(CpuSetTest, FormatsRuns) {
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8}), "0-3,8");
  EXPECT_EQ(FormatCpuList({1, 3, 5}), "1,3,5");
  EXPECT_EQ(FormatCpuList({4, 5}), "4-5");
  EXPECT_EQ(FormatCpuList({}), "");
}

TEST(CpuSetTest, ChecksAgainstTheAllowedCpus) {
  EXPECT_THAT(CheckCpusAllowed({0, 2}, {0, 1, 2, 3}), IsOk());
  EXPECT_THAT(CheckCpusAllowed({2, 9}, {0, 1, 2, 3}),
              StatusIs(absl::StatusCode::kInvalidArgument, "CPU 9 is not one this process may use (it may use 0-3)"));
  EXPECT_THAT(
      CheckCpusAllowed({8, 9, 12}, {0, 1, 2, 3}),
      StatusIs(absl::StatusCode::kInvalidArgument, "CPUs 8-9,12 are not ones this process may use (it may use 0-3)"));
}

TEST(CpuSetTest, PinsThreadsRunningAndStartedLater) {
  absl::StatusOr<std::vector<int>> allowed = AllowedCpus();
  ASSERT_THAT(allowed, IsOk());
  ASSERT_FALSE(allowed->empty());
  const std::vector<int> all = *allowed;
  std::vector<int> seen_by_older;
  // A thread that runs before the pin and looks after it.
  absl::Mutex mu;
  bool pinned = false;
  std::thread older([&] {
    absl::MutexLock l(&mu);
    mu.Await(absl::Condition(&pinned));
    seen_by_older = *AllowedCpus();
  });
  ASSERT_THAT(PinProcessToCpus({all.back()}), IsOk());
  {
    absl::MutexLock l(&mu);
    pinned = true;
  }
  older.join();
  EXPECT_THAT(seen_by_older, ElementsAre(all.back()));
  std::vector<int> seen_by_newer;
  std::thread newer([&] { seen_by_newer = *AllowedCpus(); });
  newer.join();
  EXPECT_THAT(seen_by_newer, ElementsAre(all.back()));
  EXPECT_THAT(AllowedCpus(), IsOkAndHolds(ElementsAre(all.back())));
  // Back to every CPU for the rest of the tests.
  ASSERT_THAT(PinProcessToCpus(all), IsOk());
  EXPECT_THAT(AllowedCpus(), IsOkAndHolds(all));
  EXPECT_THAT(PinProcessToCpus({}), Not(IsOk()));
}

TEST(CpuSetTest, PinsTheCallingThreadOnly) {
  absl::StatusOr<std::vector<int>> allowed = AllowedCpus();
  ASSERT_THAT(allowed, IsOk());
  std::vector<int> seen;
  std::thread t([&] {
    ASSERT_THAT(PinCallingThreadToCpus({allowed->front()}), IsOk());
    seen = *AllowedCpus();
  });
  t.join();
  EXPECT_THAT(seen, ElementsAre(allowed->front()));
  EXPECT_THAT(AllowedCpus(), IsOkAndHolds(*allowed));
  EXPECT_THAT(PinCallingThreadToCpus({kMaxCpu + 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "CPU 8192 is out of range"));
}

}  // namespace
}  // namespace ckptd::base
