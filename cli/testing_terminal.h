// What the tests of ckptctl's output share to check that text from the
// coordinator, agents and files reaches the terminal escaped (TerminalSafe,
// base/format.h).
#pragma once

#include <string>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/format.h"
#include "gtest/gtest.h"

namespace ckptd::cli {

// What an agent or the coordinator may send: terminal escapes (clear the
// screen, retitle the window), CR and LF that forge lines, a C1 control (CSI,
// as UTF-8) and a byte that is not UTF-8.
inline constexpr char kHostile[] = "\x1b[2J\rFAKE\nline\x1b]0;pwned\x07\xC2\x9B" "31m\xFF";
// kHostile as ckptctl shows it.
inline constexpr char kShown[] = "\\x1b[2J\\rFAKE\\nline\\x1b]0;pwned\\x07\\u009b31m\\xff";

// `out` holds none of kHostile's raw controls, no line that it forged, and
// nothing on any line that TerminalSafe would change.
inline void ExpectTerminalSafe(absl::string_view out) {
  for (absl::string_view raw : {"\x1b", "\r", "\x07", "\xC2\x9B", "\xFF", "\nFAKE", "\nline"}) {
    EXPECT_EQ(out.find(raw), absl::string_view::npos) << base::TerminalSafe(raw) << " in:\n" << out;
  }
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    EXPECT_EQ(base::TerminalSafe(line), line) << "in:\n" << out;
  }
}

}  // namespace ckptd::cli
