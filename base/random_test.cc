#include "base/random.h"

#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

TEST(RandomHexTest, GivesTwoLowerCaseHexDigitsPerByte) {
  absl::StatusOr<std::string> v = RandomHex(16);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(*v, ::testing::MatchesRegex("[0-9a-f]{32}"));
}

TEST(RandomHexTest, NeverRepeatsInAThousandDraws) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<std::string> v = RandomHex(16);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_TRUE(seen.insert(*v).second) << "repeated " << *v;
  }
}

TEST(RandomHexTest, RefusesSizesOutsideTheRange) {
  EXPECT_EQ(RandomHex(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RandomHex(4097).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::string> big = RandomHex(4096);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->size(), 8192u);
}

TEST(ConstantTimeEqualsTest, MatchesOnlyTheSameBytes) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abcd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals(absl::string_view("a\0c", 3), "abc"));
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secreT", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret2", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secre", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", ""));
  EXPECT_FALSE(ConstantTimeEquals(absl::string_view("secret\0", 7), "secret"));
}

}  // namespace
}  // namespace ckptd::base
