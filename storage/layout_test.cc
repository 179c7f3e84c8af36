#include "storage/layout.h"

#include <cstdint>
#include <optional>
#include <string>

#include "base/status_macros.h"  // CKPTD_STATUS_CONCAT_, used by testing_matchers.h
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::storage {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Optional;

TEST(ValidateJobNameTest, AcceptsOrdinaryNames) {
  for (const std::string& name :
       {std::string("job"), std::string("A"), std::string("0"), std::string("llama-70b_run.3"),
        std::string("a..b"), std::string("x-"), std::string("x."), std::string("UPPER_lower-123"),
        std::string(128, 'j')}) {
    EXPECT_THAT(ValidateJobName(name), IsOk()) << name;
  }
}

TEST(ValidateJobNameTest, RejectsEmpty) {
  EXPECT_THAT(ValidateJobName(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
}

TEST(ValidateJobNameTest, RejectsTooLong) {
  EXPECT_THAT(ValidateJobName(std::string(129, 'j')),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("129 characters"), HasSubstr("at most 128"))));
  EXPECT_THAT(ValidateJobName(std::string(100000, 'j')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("100000 characters")));
}

TEST(ValidateJobNameTest, RejectsLeadingDotOrDash) {
  for (const char* name : {".", "..", "../x", "../../etc", ".hidden", "-rf", "--help", "-"}) {
    EXPECT_THAT(ValidateJobName(name),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must not start with '.' or '-'")))
        << name;
  }
}

struct BadCharCase {
  std::string name;
  const char* expected;  // position and byte in the message
};

TEST(ValidateJobNameTest, RejectsCharactersOutsideTheAllowedSet) {
  const BadCharCase cases[] = {
      {"a/b", "position 1 (0x2f)"},
      {"x/../y", "position 1 (0x2f)"},
      {std::string("a\0b", 3), "position 1 (0x00)"},
      {"a\nb", "position 1 (0x0a)"},
      {"a b", "position 1 (0x20)"},
      {"tab\there", "position 3 (0x09)"},
      {"caf\xc3\xa9", "position 3 (0xc3)"},
      {"job\xff", "position 3 (0xff)"},
      {"a\\b", "position 1 (0x5c)"},
      {"semi;colon", "position 4 (0x3b)"},
      {"star*", "position 4 (0x2a)"},
      {"del\x7f", "position 3 (0x7f)"},
  };
  for (const BadCharCase& c : cases) {
    EXPECT_THAT(ValidateJobName(c.name),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("not allowed"), HasSubstr(c.expected), HasSubstr("A-Z a-z 0-9 . _ -"))))
        << "name of " << c.name.size() << " bytes";
  }
}

TEST(ValidateJobNameTest, MessageEscapesTheName) {
  // A newline or NUL in the name must not reach the message raw.
  absl::Status s = ValidateJobName(std::string("bad\nname\0x", 10));
  ASSERT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad\\nname")));
  EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos);
  EXPECT_EQ(std::string(s.message()).find('\0'), std::string::npos);
}

TEST(ParseStepDirNameTest, AcceptsCanonicalNames) {
  EXPECT_THAT(ParseStepDirName("step-0"), Optional(uint64_t{0}));
  EXPECT_THAT(ParseStepDirName("step-1"), Optional(uint64_t{1}));
  EXPECT_THAT(ParseStepDirName("step-42"), Optional(uint64_t{42}));
  EXPECT_THAT(ParseStepDirName("step-1000000"), Optional(uint64_t{1000000}));
  EXPECT_THAT(ParseStepDirName("step-18446744073709551615"), Optional(UINT64_MAX));
}

TEST(ParseStepDirNameTest, RejectsEverythingElse) {
  for (const char* name :
       {"", "step", "step-", "step-01", "step-00", "step--1", "step-+1", "step-1x", "step-x1", "step- 1",
        "step-1 ", " step-1", "Step-1", "STEP-1", "step_1", "step1", "step-1/", "step-1.tmp", "step-0x10",
        "step-1e3", "step-18446744073709551616", "step-99999999999999999999", "step-184467440737095516150",
        "xstep-1", "rank-1.shard", "MANIFEST"}) {
    EXPECT_EQ(ParseStepDirName(name), std::nullopt) << name;
  }
  EXPECT_EQ(ParseStepDirName(std::string("step-1\0", 7)), std::nullopt);
}

TEST(ParseShardFileNameTest, AcceptsCanonicalNames) {
  EXPECT_THAT(ParseShardFileName("rank-0.shard"), Optional(uint32_t{0}));
  EXPECT_THAT(ParseShardFileName("rank-7.shard"), Optional(uint32_t{7}));
  EXPECT_THAT(ParseShardFileName("rank-1023.shard"), Optional(uint32_t{1023}));
  EXPECT_THAT(ParseShardFileName("rank-4294967295.shard"), Optional(UINT32_MAX));
}

TEST(ParseShardFileNameTest, RejectsEverythingElse) {
  for (const char* name :
       {"", "rank-", "rank-.shard", "rank-01.shard", "rank-00.shard", "rank--1.shard", "rank-+1.shard",
        "rank-1x.shard", "rank-1", "rank-1.", "rank-1.shard.tmp", "rank-1.SHARD", "Rank-1.shard",
        "rank-1.shardx", "rank-1..shard", "rank-4294967296.shard", "rank-18446744073709551615.shard",
        "rank-18446744073709551616.shard", "rank- 1.shard", "xrank-1.shard", "step-1", "MANIFEST",
        "rank-1.shard/"}) {
    EXPECT_EQ(ParseShardFileName(name), std::nullopt) << name;
  }
}

TEST(LayoutPathTest, BuildsPaths) {
  EXPECT_EQ(JobDir("/root", "job"), "/root/job");
  EXPECT_EQ(JobDir("/root/", "job"), "/root/job");
  EXPECT_EQ(JobDir("rel", "job"), "rel/job");
  EXPECT_EQ(StepDirName(0), "step-0");
  EXPECT_EQ(StepDirName(UINT64_MAX), "step-18446744073709551615");
  EXPECT_EQ(StepDir("/root", "job", 7), "/root/job/step-7");
  EXPECT_EQ(ShardFileName(0), "rank-0.shard");
  EXPECT_EQ(ShardFileName(UINT32_MAX), "rank-4294967295.shard");
  EXPECT_EQ(ShardPath("/root", "job", 7, 3), "/root/job/step-7/rank-3.shard");
  EXPECT_EQ(ManifestPath("/root", "job", 7), "/root/job/step-7/MANIFEST");
  EXPECT_EQ(kManifestName, "MANIFEST");
  EXPECT_EQ(kTempSuffix, ".tmp");
}

TEST(LayoutPathTest, NamesRoundTrip) {
  for (uint64_t step : {uint64_t{0}, uint64_t{1}, uint64_t{10}, uint64_t{123456789}, UINT64_MAX - 1, UINT64_MAX}) {
    EXPECT_THAT(ParseStepDirName(StepDirName(step)), Optional(step));
  }
  for (uint32_t rank : {uint32_t{0}, uint32_t{1}, uint32_t{100}, UINT32_MAX}) {
    EXPECT_THAT(ParseShardFileName(ShardFileName(rank)), Optional(rank));
  }
}

}  // namespace
}  // namespace ckptd::storage
