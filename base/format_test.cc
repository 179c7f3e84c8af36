#include "base/format.h"

#include <cstdint>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kTiB = uint64_t{1} << 40;
constexpr uint64_t kPiB = uint64_t{1} << 50;

TEST(HumanBytesTest, BytesBelowOneKiBAreWhole) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1), "1 B");
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
}

TEST(HumanBytesTest, LargerSizesHaveOneDecimalAndABinaryUnit) {
  EXPECT_EQ(HumanBytes(kKiB), "1.0 KiB");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(12 * kMiB), "12.0 MiB");
  EXPECT_EQ(HumanBytes(kGiB + kGiB / 2), "1.5 GiB");
  EXPECT_EQ(HumanBytes(kTiB), "1.0 TiB");
  EXPECT_EQ(HumanBytes(3 * kTiB + kTiB / 4 + kGiB), "3.3 TiB");
  EXPECT_EQ(HumanBytes(kPiB), "1.0 PiB");
}

TEST(HumanBytesTest, UnitChangesAtEach1024) {
  EXPECT_EQ(HumanBytes(kMiB - kKiB), "1023.0 KiB");
  EXPECT_EQ(HumanBytes(kMiB), "1.0 MiB");
  EXPECT_EQ(HumanBytes(kGiB), "1.0 GiB");
  EXPECT_EQ(HumanBytes(kGiB - kMiB), "1023.0 MiB");
}

TEST(HumanBytesTest, PiBIsTheLargestUnit) {
  EXPECT_EQ(HumanBytes(1024 * kPiB), "1024.0 PiB");
  EXPECT_EQ(HumanBytes(std::numeric_limits<uint64_t>::max()), "16384.0 PiB");
}

TEST(FormatBytesTest, BinaryIsHumanBytes) {
  EXPECT_EQ(FormatBytes(512, ByteUnits::kBinary), "512 B");
  EXPECT_EQ(FormatBytes(1536, ByteUnits::kBinary), "1.5 KiB");
  EXPECT_EQ(FormatBytes(12 * kMiB, ByteUnits::kBinary), HumanBytes(12 * kMiB));
}

TEST(FormatBytesTest, GiBAlwaysWithTwoDecimals) {
  EXPECT_EQ(FormatBytes(0, ByteUnits::kGiB), "0.00 GiB");
  EXPECT_EQ(FormatBytes(kGiB / 4, ByteUnits::kGiB), "0.25 GiB");
  EXPECT_EQ(FormatBytes(80 * kGiB, ByteUnits::kGiB), "80.00 GiB");
  EXPECT_EQ(FormatBytes(2 * kTiB, ByteUnits::kGiB), "2048.00 GiB");
}

TEST(FormatBytesTest, DecimalUnitsWithTwoDecimals) {
  EXPECT_EQ(FormatBytes(0, ByteUnits::kDecimal), "0 B");
  EXPECT_EQ(FormatBytes(999.4, ByteUnits::kDecimal), "999 B");
  EXPECT_EQ(FormatBytes(1000, ByteUnits::kDecimal), "1.00 kB");
  EXPECT_EQ(FormatBytes(7570, ByteUnits::kDecimal), "7.57 kB");
  EXPECT_EQ(FormatBytes(14e9, ByteUnits::kDecimal), "14.00 GB");
  EXPECT_EQ(FormatBytes(2e21, ByteUnits::kDecimal), "2000.00 EB");  // EB is the largest unit
}

TEST(IsoTimeTest, ZeroIsUnknown) { EXPECT_EQ(IsoTime(0), "-"); }

TEST(IsoTimeTest, KnownTimesInUtc) {
  constexpr int64_t kNanos = 1'000'000'000;
  EXPECT_EQ(IsoTime(int64_t{1714564800} * kNanos), "2024-05-01T12:00:00Z");
  EXPECT_EQ(IsoTime(int64_t{1'800'000'000} * kNanos), "2027-01-15T08:00:00Z");
  EXPECT_EQ(IsoTime(1), "1970-01-01T00:00:00Z");  // not "unknown": only 0 is
  EXPECT_EQ(IsoTime(-kNanos), "1969-12-31T23:59:59Z");
}

TEST(IsoTimeTest, FractionsOfASecondAreDropped) {
  EXPECT_EQ(IsoTime(int64_t{1714564800} * 1'000'000'000 + 999'999'999), "2024-05-01T12:00:00Z");
}

TEST(ShortDurationTest, Seconds) {
  EXPECT_EQ(ShortDuration(0), "0.0 s");
  EXPECT_EQ(ShortDuration(0.4), "0.4 s");
  EXPECT_EQ(ShortDuration(9.9), "9.9 s");
  EXPECT_EQ(ShortDuration(10), "10 s");
  EXPECT_EQ(ShortDuration(12), "12 s");
  EXPECT_EQ(ShortDuration(119), "119 s");
}

TEST(ShortDurationTest, MinutesFromTwo) {
  EXPECT_EQ(ShortDuration(120), "2.0 min");
  EXPECT_EQ(ShortDuration(312), "5.2 min");
  EXPECT_EQ(ShortDuration(7140), "119.0 min");
}

TEST(ShortDurationTest, HoursFromTwo) {
  EXPECT_EQ(ShortDuration(7200), "2.0 h");
  EXPECT_EQ(ShortDuration(3.1 * 3600), "3.1 h");
  EXPECT_EQ(ShortDuration(172440), "47.9 h");
}

TEST(ShortDurationTest, DaysFromTwo) {
  EXPECT_EQ(ShortDuration(172800), "2.0 d");
  EXPECT_EQ(ShortDuration(10 * 86400), "10.0 d");
}

TEST(ShortDurationTest, NegativeIsZeroAndNonFiniteIsUnknown) {
  EXPECT_EQ(ShortDuration(-5), "0.0 s");
  EXPECT_EQ(ShortDuration(-1e9), "0.0 s");
  EXPECT_EQ(ShortDuration(std::numeric_limits<double>::quiet_NaN()), "-");
  EXPECT_EQ(ShortDuration(std::numeric_limits<double>::infinity()), "-");
  EXPECT_EQ(ShortDuration(-std::numeric_limits<double>::infinity()), "-");
}

TEST(SecondsTest, BelowOneSecondTwoDecimals) {
  EXPECT_EQ(Seconds(0.04), "0.04 s");
  EXPECT_EQ(Seconds(0.5), "0.50 s");
  EXPECT_EQ(Seconds(0.99), "0.99 s");
}

TEST(SecondsTest, BelowOneHundredOneDecimal) {
  EXPECT_EQ(Seconds(1), "1.0 s");
  EXPECT_EQ(Seconds(1.5), "1.5 s");
  EXPECT_EQ(Seconds(35.2), "35.2 s");
  EXPECT_EQ(Seconds(99.9), "99.9 s");
}

TEST(SecondsTest, FromOneHundredWhole) {
  EXPECT_EQ(Seconds(100), "100 s");
  EXPECT_EQ(Seconds(412), "412 s");
  EXPECT_EQ(Seconds(86400), "86400 s");
}

TEST(SecondsTest, ZeroNegativeAndNonFiniteAreUnknown) {
  EXPECT_EQ(Seconds(0), "-");
  EXPECT_EQ(Seconds(-0.0), "-");
  EXPECT_EQ(Seconds(-1), "-");
  EXPECT_EQ(Seconds(std::numeric_limits<double>::quiet_NaN()), "-");
  EXPECT_EQ(Seconds(std::numeric_limits<double>::infinity()), "-");
}

TEST(FormatSecondsTest, ShortAndSecondsAreTheirShorthands) {
  EXPECT_EQ(FormatSeconds(312, DurationStyle::kShort), ShortDuration(312));
  EXPECT_EQ(FormatSeconds(0.04, DurationStyle::kSeconds), Seconds(0.04));
}

TEST(FormatSecondsTest, FigureIsSecondsWithALargerUnitFromTwoOfIt) {
  EXPECT_EQ(FormatSeconds(1.17, DurationStyle::kFigure), "1.17 s");
  EXPECT_EQ(FormatSeconds(35.25, DurationStyle::kFigure), "35.2 s");
  EXPECT_EQ(FormatSeconds(119, DurationStyle::kFigure), "119.0 s");
  EXPECT_EQ(FormatSeconds(300, DurationStyle::kFigure), "300.0 s (5.0 min)");
  EXPECT_EQ(FormatSeconds(7001, DurationStyle::kFigure), "7001 s (116.7 min)");
  EXPECT_EQ(FormatSeconds(7200, DurationStyle::kFigure), "7200 s (2.00 h)");
  EXPECT_EQ(FormatSeconds(3 * kDay, DurationStyle::kFigure), "259200 s (3.0 d)");
  EXPECT_EQ(FormatSeconds(std::numeric_limits<double>::infinity(), DurationStyle::kFigure), "-");
  EXPECT_EQ(FormatSeconds(std::numeric_limits<double>::quiet_NaN(), DurationStyle::kFigure), "-");
}

TEST(FormatSecondsTest, LabelHasThreeSignificantDigits) {
  EXPECT_EQ(FormatSeconds(30, DurationStyle::kLabel), "30 s");
  EXPECT_EQ(FormatSeconds(60, DurationStyle::kLabel), "1 min");
  EXPECT_EQ(FormatSeconds(1.94 * kHour, DurationStyle::kLabel), "1.94 h");
  EXPECT_EQ(FormatSeconds(217 * kDay, DurationStyle::kLabel), "217 d");
}

TEST(TerminalSafeTest, PrintableAsciiAndUtf8AreKept) {
  EXPECT_EQ(TerminalSafe(""), "");
  EXPECT_EQ(TerminalSafe("step 40: rank-1.shard 'w' ~!@#$%^&*()"), "step 40: rank-1.shard 'w' ~!@#$%^&*()");
  EXPECT_EQ(TerminalSafe("τ δ — 节点 \xF0\x9F\x98\x80"), "τ δ — 节点 \xF0\x9F\x98\x80");
  EXPECT_EQ(TerminalSafe("C:\\dir\\x1b"), "C:\\dir\\x1b");  // a backslash stays
}

TEST(TerminalSafeTest, ControlCharactersAreWrittenVisibly) {
  EXPECT_EQ(TerminalSafe("\x1b[2J\rFAKE\nline\tend"), "\\x1b[2J\\rFAKE\\nline\\tend");
  EXPECT_EQ(TerminalSafe(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(TerminalSafe("\x07\x08\x7f"), "\\x07\\x08\\x7f");
  // C1 controls: as UTF-8 (U+009B, CSI) and as raw bytes, which are not UTF-8.
  EXPECT_EQ(TerminalSafe("\xC2\x9B" "31m"), "\\u009b31m");
  EXPECT_EQ(TerminalSafe("\x9B" "31m\x85"), "\\x9b31m\\x85");
  // Text that reorders or breaks what follows.
  EXPECT_EQ(TerminalSafe("a\xE2\x80\xAE" "b\xE2\x81\xA6" "c\xE2\x80\xA8"), "a\\u202eb\\u2066c\\u2028");
}

TEST(TerminalSafeTest, BytesThatAreNotUtf8AreEscapedOneByOne) {
  EXPECT_EQ(TerminalSafe("\xFF\xFE"), "\\xff\\xfe");
  EXPECT_EQ(TerminalSafe("\xC0\xAF"), "\\xc0\\xaf");                    // overlong '/'
  EXPECT_EQ(TerminalSafe("\xED\xA0\x80"), "\\xed\\xa0\\x80");           // a surrogate
  EXPECT_EQ(TerminalSafe("ok\xE2\x82"), "ok\\xe2\\x82");                // cut short
  EXPECT_EQ(TerminalSafe("\xF4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // past U+10FFFF
}

TEST(TerminalSafeTest, TwiceIsOnce) {
  const std::string once = TerminalSafe("\x1b]0;title\x07\xC2\x9B\xFF x");
  EXPECT_EQ(TerminalSafe(once), once);
  for (char c : once) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << static_cast<int>(c);
}

}  // namespace
}  // namespace ckptd::base
