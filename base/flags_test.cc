#include "base/flags.h"

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::Optional;

const std::set<std::string> kValueFlags = {"root", "size", "name"};
const std::set<std::string> kBoolFlags = {"verbose", "json"};

absl::StatusOr<Args> Parse(const std::vector<std::string>& argv) { return Args::Parse(argv, kValueFlags, kBoolFlags); }

TEST(ArgsTest, EmptyCommandLine) {
  CKPTD_ASSERT_OK_AND_ASSIGN(Args args, Parse({}));
  EXPECT_THAT(args.positional(), IsEmpty());
  EXPECT_FALSE(args.Has("root"));
  EXPECT_FALSE(args.Has("verbose"));
  EXPECT_EQ(args.Get("root"), std::nullopt);
}

TEST(ArgsTest, ValueInTheNextArgument) {
  CKPTD_ASSERT_OK_AND_ASSIGN(Args args, Parse({"--root", "/data/ckpt"}));
  EXPECT_TRUE(args.Has("root"));
  EXPECT_THAT(args.Get("root"), Optional(std::string("/data/ckpt")));
  EXPECT_THAT(args.positional(), IsEmpty());
  EXPECT_FALSE(args.Has("name"));
  EXPECT_EQ(args.Get("name"), std::nullopt);
}

TEST(ArgsTest, ValueAfterEquals) {
  CKPTD_ASSERT_OK_AND_ASSIGN(Args args, Parse({"--root=/data/ckpt", "--name=a=b", "--size="}));
  EXPECT_THAT(args.Get("root"), Optional(std::string("/data/ckpt")));
  EXPECT_THAT(args.Get("name"), Optional(std::string("a=b")));  // split at the first '='
  EXPECT_TRUE(args.Has("size"));
  EXPECT_THAT(args.Get("size"), Optional(std::string("")));
  EXPECT_THAT(args.positional(), IsEmpty());
}

TEST(ArgsTest, NextArgumentIsTakenAsTheValueVerbatim) {
  CKPTD_ASSERT_OK_AND_ASSIGN(Args args, Parse({"--name", "-x", "--root", ""}));
  EXPECT_THAT(args.Get("name"), Optional(std::string("-x")));
  EXPECT_THAT(args.Get("root"), Optional(std::string("")));
  EXPECT_THAT(args.positional(), IsEmpty());
}

TEST(ArgsTest, LastValueWins) {
  CKPTD_ASSERT_OK_AND_ASSIGN(Args args, Parse({"--root", "/a", "--root=/b"}));
  EXPECT_THAT(args.Get("root"), Optional(std::string("/b")));
}

TEST(ArgsTest, BooleanFlags) {
  CKPTD_ASSERT_OK_AND_ASSIGN(Args args, Parse({"--verbose", "pos"}));
  EXPECT_TRUE(args.Has("verbose"));
  EXPECT_FALSE(args.Has("json"));
  EXPECT_EQ(args.Get("verbose"), std::nullopt);  // a boolean has no value
  // A boolean flag does not take the next argument as its value.
  EXPECT_THAT(args.positional(), ElementsAre("pos"));
}

TEST(ArgsTest, BooleanFlagWithAValueIsRefused) {
  EXPECT_THAT(Parse({"--verbose=true"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--verbose takes no value")));
  EXPECT_THAT(Parse({"--json="}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--json takes no value")));
}

TEST(ArgsTest, PositionalArgumentsKeepTheirOrderAroundFlags) {
  CKPTD_ASSERT_OK_AND_ASSIGN(Args args, Parse({"verify", "--root", "/r", "step-100", "--json", "-", "-v", "last"}));
  EXPECT_THAT(args.positional(), ElementsAre("verify", "step-100", "-", "-v", "last"));
  EXPECT_THAT(args.Get("root"), Optional(std::string("/r")));
  EXPECT_TRUE(args.Has("json"));
}

TEST(ArgsTest, DoubleDashEndsFlags) {
  CKPTD_ASSERT_OK_AND_ASSIGN(Args args, Parse({"run", "--verbose", "--", "--root", "/r", "--bogus", "--", "x"}));
  EXPECT_TRUE(args.Has("verbose"));
  EXPECT_FALSE(args.Has("root"));
  EXPECT_THAT(args.positional(), ElementsAre("run", "--root", "/r", "--bogus", "--", "x"));
}

TEST(ArgsTest, DoubleDashAtTheEnd) {
  CKPTD_ASSERT_OK_AND_ASSIGN(Args args, Parse({"a", "--"}));
  EXPECT_THAT(args.positional(), ElementsAre("a"));
}

TEST(ArgsTest, UnknownFlagIsAnErrorNamingIt) {
  EXPECT_THAT(Parse({"--roots", "/r"}), StatusIs(absl::StatusCode::kInvalidArgument, "unknown flag --roots"));
  EXPECT_THAT(Parse({"pos", "--bogus=1"}), StatusIs(absl::StatusCode::kInvalidArgument, "unknown flag --bogus"));
  // "--" alone ends the flags, but "---x" and "--=" are flags nobody defined.
  EXPECT_THAT(Parse({"---x"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown flag ---x")));
  EXPECT_THAT(Parse({"--=v"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown flag --")));
}

TEST(ArgsTest, FlagNamesAreCaseSensitive) {
  EXPECT_THAT(Parse({"--Root", "/r"}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--Root")));
}

TEST(ArgsTest, ValueFlagWithoutAValueIsAnError) {
  EXPECT_THAT(Parse({"--root"}), StatusIs(absl::StatusCode::kInvalidArgument, "--root needs a value"));
  EXPECT_THAT(Parse({"verify", "--verbose", "--size"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "--size needs a value"));
}

TEST(ArgsTest, NoFlagsDefined) {
  CKPTD_ASSERT_OK_AND_ASSIGN(Args args, Args::Parse({"a", "b"}, {}, {}));
  EXPECT_THAT(args.positional(), ElementsAre("a", "b"));
  EXPECT_THAT(Args::Parse({"--a"}, {}, {}), StatusIs(absl::StatusCode::kInvalidArgument, "unknown flag --a"));
}

// GetUint.

absl::StatusOr<std::optional<uint64_t>> SizeOf(const std::string& value, bool allow_suffix) {
  absl::StatusOr<Args> args = Parse({"--size", value});
  if (!args.ok()) return args.status();
  return args->GetUint("size", allow_suffix);
}

TEST(ArgsGetUintTest, AbsentFlagIsNoValue) {
  CKPTD_ASSERT_OK_AND_ASSIGN(Args args, Parse({"--root", "/r"}));
  EXPECT_THAT(args.GetUint("size"), IsOkAndHolds(std::optional<uint64_t>()));
  EXPECT_THAT(args.GetUint("size", /*allow_suffix=*/true), IsOkAndHolds(std::optional<uint64_t>()));
}

TEST(ArgsGetUintTest, PlainNumbers) {
  EXPECT_THAT(SizeOf("0", false), IsOkAndHolds(Optional(uint64_t{0})));
  EXPECT_THAT(SizeOf("42", false), IsOkAndHolds(Optional(uint64_t{42})));
  EXPECT_THAT(SizeOf("007", false), IsOkAndHolds(Optional(uint64_t{7})));
  EXPECT_THAT(SizeOf("18446744073709551615", false), IsOkAndHolds(Optional(UINT64_MAX)));
  // Suffixes allowed but not used.
  EXPECT_THAT(SizeOf("4096", true), IsOkAndHolds(Optional(uint64_t{4096})));
}

TEST(ArgsGetUintTest, SuffixesArePowersOf1024) {
  EXPECT_THAT(SizeOf("1K", true), IsOkAndHolds(Optional(uint64_t{1} << 10)));
  EXPECT_THAT(SizeOf("4k", true), IsOkAndHolds(Optional(uint64_t{4} << 10)));
  EXPECT_THAT(SizeOf("64M", true), IsOkAndHolds(Optional(uint64_t{64} << 20)));
  EXPECT_THAT(SizeOf("2m", true), IsOkAndHolds(Optional(uint64_t{2} << 20)));
  EXPECT_THAT(SizeOf("3G", true), IsOkAndHolds(Optional(uint64_t{3} << 30)));
  EXPECT_THAT(SizeOf("3g", true), IsOkAndHolds(Optional(uint64_t{3} << 30)));
  EXPECT_THAT(SizeOf("1T", true), IsOkAndHolds(Optional(uint64_t{1} << 40)));
  EXPECT_THAT(SizeOf("5t", true), IsOkAndHolds(Optional(uint64_t{5} << 40)));
  EXPECT_THAT(SizeOf("0G", true), IsOkAndHolds(Optional(uint64_t{0})));
}

TEST(ArgsGetUintTest, SuffixRefusedWhenNotAllowed) {
  EXPECT_THAT(SizeOf("4K", false),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--size"), HasSubstr("\"4K\""), HasSubstr("is not a non-negative integer"),
                             Not(HasSubstr("optionally")))));
  EXPECT_THAT(SizeOf("1T", false), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"1T\"")));
}

TEST(ArgsGetUintTest, OverflowIsRefused) {
  EXPECT_THAT(SizeOf("18446744073709551616", false), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--size")));
  EXPECT_THAT(SizeOf("99999999999999999999999", true),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--size")));
  // 2^24 T = 2^64: one past the largest; 2^24 - 1 T fits.
  EXPECT_THAT(SizeOf("16777216T", true),
              StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("--size"), HasSubstr("\"16777216T\""))));
  EXPECT_THAT(SizeOf("16777215T", true), IsOkAndHolds(Optional(uint64_t{16777215} << 40)));
  // 2^54 K = 2^64.
  EXPECT_THAT(SizeOf("18014398509481984K", true), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--size")));
  EXPECT_THAT(SizeOf("18014398509481983K", true), IsOkAndHolds(Optional(uint64_t{18014398509481983} << 10)));
  EXPECT_THAT(SizeOf("18446744073709551615K", true), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--size")));
}

TEST(ArgsGetUintTest, NonNumbersAreRefusedNamingTheFlag) {
  for (const char* bad : {"abc", "-1", "+1", " 1", "1.5", "0x10", "1e3", "K", "12KB", "KK", "1P", "--"}) {
    EXPECT_THAT(SizeOf(bad, true), StatusIs(absl::StatusCode::kInvalidArgument,
                                            AllOf(HasSubstr("--size: \""), HasSubstr(bad),
                                                  HasSubstr("is not a non-negative integer (optionally with K, M, "
                                                            "G or T)"))))
        << bad;
    EXPECT_THAT(SizeOf(bad, false),
                StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("--size"), HasSubstr(bad))))
        << bad;
  }
}

TEST(ArgsGetUintTest, EmptyValueIsRefused) {
  CKPTD_ASSERT_OK_AND_ASSIGN(Args args, Parse({"--size="}));
  EXPECT_THAT(args.GetUint("size"),
              StatusIs(absl::StatusCode::kInvalidArgument, "--size: \"\" is not a non-negative integer"));
  EXPECT_THAT(args.GetUint("size", true), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--size")));
}

TEST(ArgsGetUintTest, ExactMessage) {
  EXPECT_THAT(SizeOf("ten", false),
              StatusIs(absl::StatusCode::kInvalidArgument, "--size: \"ten\" is not a non-negative integer"));
  EXPECT_THAT(SizeOf("tenG", true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--size: \"tenG\" is not a non-negative integer (optionally with K, M, G or T)"));
}

// GetUintInRange, ReadUint, GetDurationInRange.

TEST(ArgsGetUintInRangeTest, InsideTheRange) {
  CKPTD_ASSERT_OK_AND_ASSIGN(Args args, Parse({"--size", "1024", "--name", "2G"}));
  EXPECT_THAT(args.GetUintInRange("size", 1, 1024), IsOkAndHolds(Optional(uint64_t{1024})));
  EXPECT_THAT(args.GetUintInRange("name", 1, uint64_t{2} << 30, /*allow_suffix=*/true),
              IsOkAndHolds(Optional(uint64_t{2} << 30)));
  EXPECT_THAT(args.GetUintInRange("root", 1, 2), IsOkAndHolds(std::optional<uint64_t>()));
}

TEST(ArgsGetUintInRangeTest, OutsideTheRangeNamesTheFlagAndTheRange) {
  CKPTD_ASSERT_OK_AND_ASSIGN(Args args, Parse({"--size", "100000"}));
  EXPECT_THAT(args.GetUintInRange("size", 1, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument, "--size must be an integer in 1..1024, got \"100000\""));
  CKPTD_ASSERT_OK_AND_ASSIGN(Args zero, Parse({"--size", "0"}));
  EXPECT_THAT(zero.GetUintInRange("size", 1, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1..1024, got \"0\"")));
  CKPTD_ASSERT_OK_AND_ASSIGN(Args big, Parse({"--size", "2T"}));
  EXPECT_THAT(big.GetUintInRange("size", 1, uint64_t{1} << 40, /*allow_suffix=*/true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--size must be a size in 1..1T (bytes, or with K, M, G or T), got \"2T\""));
  // Past 64 bits, and not numbers at all: the same message.
  for (const char* bad : {"18446744073709551616", "99999999999999999999999", "-1", "+1", " 1", "1.5", "x"}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(Args a, Parse({"--size", bad}));
    EXPECT_THAT(a.GetUintInRange("size", 0, UINT64_MAX),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("--size must be an integer in 0..18446744073709551615"), HasSubstr(bad))))
        << bad;
  }
}

TEST(ArgsReadUintTest, NarrowsOnlyWhatFits) {
  // 4294967296 is 2^32: a 32-bit destination would hold 0.
  CKPTD_ASSERT_OK_AND_ASSIGN(Args args, Parse({"--size", "4294967296"}));
  uint32_t narrow = 7;
  EXPECT_THAT(args.ReadUint("size", 0, UINT32_MAX, &narrow),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--size must be an integer in 0..4294967295")));
  EXPECT_EQ(narrow, 7u);
  uint64_t wide = 0;
  CKPTD_ASSERT_OK(args.ReadUint("size", 0, UINT64_MAX, &wide));
  EXPECT_EQ(wide, uint64_t{1} << 32);
  // A range wider than the destination is the caller's mistake, never a truncation.
  int small = 3;
  EXPECT_THAT(args.ReadUint("size", 0, UINT64_MAX, &small), StatusIs(absl::StatusCode::kInternal, HasSubstr("--size")));
  EXPECT_EQ(small, 3);
  // Absent: left alone.
  int absent = 5;
  CKPTD_ASSERT_OK(args.ReadUint("name", 1, 10, &absent));
  EXPECT_EQ(absent, 5);
}

TEST(ArgsGetDurationInRangeTest, FiniteAndInsideTheRange) {
  auto parse = [](const std::string& v) {
    return Parse({"--name", v})->GetDurationInRange("name", absl::Milliseconds(1), absl::Hours(1));
  };
  EXPECT_THAT(parse("250ms"), IsOkAndHolds(Optional(absl::Milliseconds(250))));
  EXPECT_THAT(parse("1h"), IsOkAndHolds(Optional(absl::Hours(1))));
  for (const char* bad : {"inf", "-inf", "0", "500us", "2h", "-1s", "soon", ""}) {
    EXPECT_THAT(parse(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                     AllOf(HasSubstr("--name must be a duration in 1ms..1h"), HasSubstr(bad))))
        << bad;
  }
}

}  // namespace
}  // namespace ckptd::base
