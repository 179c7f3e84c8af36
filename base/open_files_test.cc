#include "base/open_files.h"

#include <sys/resource.h>

#include <string>

#include "base/testing/matchers.h"
#include "base/testing/users.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

using ::ckptd::testing::IsOkAndHolds;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(RaiseOpenFileLimitTest, TheSoftLimitGoesUpToTheHardOne) {
  struct rlimit was;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &was), 0);
  if (was.rlim_max < 64) GTEST_SKIP() << "a hard limit of " << was.rlim_max << " open files";
  struct rlimit low = was;
  low.rlim_cur = 32;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  EXPECT_THAT(RaiseOpenFileLimit(), IsOkAndHolds(static_cast<uint64_t>(was.rlim_max)));
  struct rlimit now;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(now.rlim_cur, was.rlim_max);
  EXPECT_EQ(now.rlim_max, was.rlim_max);
  // At the hard limit already: nothing changes.
  EXPECT_THAT(RaiseOpenFileLimit(), IsOkAndHolds(static_cast<uint64_t>(was.rlim_max)));
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &was), 0);
}

TEST(RaiseOpenFileLimitTest, AServerIsWarnedOfALowHardLimit) {
  struct rlimit was;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &was), 0);
  if (was.rlim_max < 1000) GTEST_SKIP() << "a hard limit of " << was.rlim_max << " open files";
  if (was.rlim_max >= kFewOpenFiles) {
    EXPECT_EQ(RaiseOpenFileLimitForServer("agents"), "");
  }
  // Lowering the hard limit cannot be undone without privilege: in a child.
  const std::string warned = ckptd::testing::RunInChild([] {
    struct rlimit low = {1000, 1000};
    if (::setrlimit(RLIMIT_NOFILE, &low) != 0) return std::string("setrlimit failed");
    return RaiseOpenFileLimitForServer("agents");
  });
  EXPECT_THAT(warned, AllOf(HasSubstr("at most 1000 open files"), HasSubstr("lock agents out"),
                            HasSubstr("LimitNOFILE")));
}

}  // namespace
}  // namespace ckptd::base
