#include "base/version.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

TEST(VersionTest, IsTheProjectsDottedVersion) {
  const std::vector<std::string> parts = absl::StrSplit(Version(), '.');
  ASSERT_EQ(parts.size(), 3u) << Version();
  for (const std::string& p : parts) {
    EXPECT_FALSE(p.empty()) << Version();
    EXPECT_EQ(p.find_first_not_of("0123456789"), std::string::npos) << Version();
  }
  EXPECT_EQ(VersionLine("ckptctl"), std::string("ckptctl ") + std::string(Version()));
}

TEST(VersionTest, AskedAnywhereAmongTheFlagsButNotAfterTheirEnd) {
  EXPECT_TRUE(AsksForVersion({"--version"}));
  EXPECT_TRUE(AsksForVersion({"status", "--job", "x", "--version"}));
  EXPECT_FALSE(AsksForVersion({}));
  EXPECT_FALSE(AsksForVersion({"--versions"}));
  EXPECT_FALSE(AsksForVersion({"--", "--version"}));
  EXPECT_FALSE(AsksForVersion({"--job", "--version-x"}));
}

}  // namespace
}  // namespace ckptd::base
