// Human-readable sizes, durations and times for tables, logs and reports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace ckptd::base {

// "1.5 GiB", "12.0 MiB", "512 B".
std::string HumanBytes(uint64_t bytes);
// "2024-05-01T12:00:00Z"; "-" for 0 (unknown).
std::string IsoTime(int64_t unix_nanos);
// "0.4 s", "12 s", "5.2 min", "3.1 h", "2.0 d"; negative (clock skew) as 0.
std::string ShortDuration(double s);
// "0.04 s", "1.5 s", "35.2 s", "412 s"; "-" for 0 (unknown).
std::string Seconds(double s);

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
