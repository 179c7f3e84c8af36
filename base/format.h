// Human-readable sizes, durations and times for tables, logs and reports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace ckptd::base {

// How FormatBytes writes a size.
enum class ByteUnits {
  kBinary,   // "512 B", "12.0 MiB", "1.5 GiB": one decimal, in the largest of KiB..PiB it reaches
  kGiB,      // "0.25 GiB", "80.00 GiB": two decimals, always in GiB
  kDecimal,  // "512 B", "7.57 kB", "14.00 GB": two decimals in kB..EB, to go with bandwidths in GB/s
};
std::string FormatBytes(double bytes, ByteUnits units);
// FormatBytes(bytes, ByteUnits::kBinary).
inline std::string HumanBytes(uint64_t bytes) { return FormatBytes(static_cast<double>(bytes), ByteUnits::kBinary); }

// Seconds in a minute, an hour and a day.
inline constexpr double kMinute = 60;
inline constexpr double kHour = 3600;
inline constexpr double kDay = 86400;

// How FormatSeconds writes a duration.
enum class DurationStyle {
  kShort,    // "0.4 s", "12 s", "5.2 min", "3.1 h", "2.0 d"; negative (clock skew) as 0; "-" when not finite
  kSeconds,  // "0.04 s", "1.5 s", "35.2 s", "412 s"; "-" for 0 (unknown), negative or not finite
  kFigure,   // "7001 s (116.7 min)", "300.0 s (5.0 min)", "1.17 s"; "-" when not finite
  kLabel,    // "30 s", "1 min", "1.94 h", "217 d": three significant digits
};
std::string FormatSeconds(double seconds, DurationStyle style);
// FormatSeconds(s, DurationStyle::kShort).
inline std::string ShortDuration(double s) { return FormatSeconds(s, DurationStyle::kShort); }
// FormatSeconds(s, DurationStyle::kSeconds).
inline std::string Seconds(double s) { return FormatSeconds(s, DurationStyle::kSeconds); }

// "2024-05-01T12:00:00Z"; "-" for 0 (unknown).
std::string IsoTime(int64_t unix_nanos);

// `s` safe to print on a terminal, for text that came from elsewhere (the
// network, a file): valid, printable UTF-8 is kept; control characters are
// written visibly instead: \n, \r, \t, other C0 characters and DEL as \x1b,
// C1 controls (U+0080..U+009F), the bidirectional overrides and isolates and
// the line and paragraph separators as \u009b, and bytes that are not UTF-8
// as \xff. A backslash is kept, so applying it twice changes nothing more.
std::string TerminalSafe(absl::string_view s);

// The length of the well-formed UTF-8 sequence of 2..4 bytes at s[i] (i <
// s.size()), with its code point in `*cp`; 0 when the bytes there are not
// one (ASCII, overlong forms, surrogates and truncated sequences included).
size_t Utf8SequenceAt(absl::string_view s, size_t i, uint32_t* cp);

}  // namespace ckptd::base
