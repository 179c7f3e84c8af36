#include "rpc/operator_token.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/ascii.h"
#include "base/testing/matchers.h"
#include "base/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::rpc {
namespace {

using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;

class OperatorTokenTest : public ::testing::Test {
 protected:
  ckptd::testing::TempDir tmp_{"ckptd-token-"};
  const std::string dir_ = tmp_.path();
};

TEST_F(OperatorTokenTest, GeneratedTokensAreRandomHex) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string a, GenerateOperatorToken());
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string b, GenerateOperatorToken());
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
  for (char c : a) EXPECT_TRUE(absl::ascii_isxdigit(static_cast<unsigned char>(c)) && !absl::ascii_isupper(c)) << a;
}

TEST_F(OperatorTokenTest, WrittenOwnerOnlyAndReadBack) {
  const std::string path = dir_ + "/operator-token";
  CKPTD_ASSERT_OK(WriteOperatorTokenFile(path, "tok-1"));
  CKPTD_ASSERT_OK(WriteOperatorTokenFile(path, "tok-2"));  // replaces
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_THAT(ReadOperatorTokenFile(path), ckptd::testing::IsOkAndHolds(std::string("tok-2")));
  EXPECT_NE(::access((path + ".tmp").c_str(), F_OK), 0);
}

TEST_F(OperatorTokenTest, BadTokenFilesAreRefusedWithTheirPath) {
  const std::string path = dir_ + "/token";
  EXPECT_THAT(ReadOperatorTokenFile(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  std::ofstream(path) << "  \n";
  EXPECT_THAT(ReadOperatorTokenFile(path), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  std::ofstream(path) << "two words\n";
  EXPECT_THAT(ReadOperatorTokenFile(path), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("printable")));
  std::ofstream(path) << std::string(5000, 'x');
  EXPECT_THAT(ReadOperatorTokenFile(path), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4096")));
  std::ofstream(path) << "\n  s3cret-token \n";
  EXPECT_THAT(ReadOperatorTokenFile(path), ckptd::testing::IsOkAndHolds(std::string("s3cret-token")));
}

TEST_F(OperatorTokenTest, AgentTokenFilesSayWhichTokenIsBad) {
  const std::string path = dir_ + "/" + std::string(kAgentTokenFileName);
  EXPECT_THAT(ReadAgentTokenFile(path),
              StatusIs(absl::StatusCode::kNotFound, ::testing::AllOf(HasSubstr("agent token"), HasSubstr(path))));
  std::ofstream(path) << "\n";
  EXPECT_THAT(ReadAgentTokenFile(path), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("agent token file")));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string token, GenerateToken());
  CKPTD_ASSERT_OK(WriteTokenFile(path, token));
  EXPECT_THAT(ReadAgentTokenFile(path), ckptd::testing::IsOkAndHolds(token));
  EXPECT_THAT(ReadOperatorTokenFile(dir_ + "/none"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("operator token")));
}

TEST_F(OperatorTokenTest, WithoutFollowingLinksOnlyARegularFileIsRead) {
  const std::string real = dir_ + "/real";
  CKPTD_ASSERT_OK(WriteTokenFile(real, "tok"));
  const std::string link = dir_ + "/link";
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  EXPECT_THAT(ReadTokenFile(link, "agent token"), ckptd::testing::IsOkAndHolds(std::string("tok")));
  EXPECT_FALSE(ReadTokenFile(link, "agent token", /*follow_links=*/false).ok());
  EXPECT_THAT(ReadTokenFile(real, "agent token", /*follow_links=*/false), ckptd::testing::IsOkAndHolds(std::string("tok")));
  EXPECT_THAT(ReadTokenFile(dir_, "agent token", /*follow_links=*/false),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a regular file")));
  EXPECT_THAT(ReadTokenFile(dir_ + "/none", "agent token", /*follow_links=*/false),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("none")));
}

}  // namespace
}  // namespace ckptd::rpc
