// The figures of ckptctl's offline reports (`interval` and `plan`, in
// cli/interval_commands.h): one labelled figure a line, durations in seconds
// with a readable unit, and the number flags they are computed from.
// Internal to ckptd::cli.
#pragma once

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "base/flags.h"

namespace ckptd::cli {

inline constexpr double kMinute = 60;
inline constexpr double kHour = 3600;
inline constexpr double kDay = 86400;

// "  label   value": the label padded to 28 columns (at least one space);
// the value TerminalSafe (a live job's reason comes from the coordinator).
void FigureLine(std::ostream& out, absl::string_view label, absl::string_view value);
// "7001 s (116.7 min)", "300.0 s (5.0 min)", "1.17 s"; "-" when not finite.
std::string DurationFigure(double s);
// "30 s", "1 min", "1.94 h", "217 d": labels, three significant digits.
std::string DurationLabel(double s);

enum class NumberRange { kPositive, kNonNegative };
// Reads --flag into *value when given (leaves it otherwise), as a finite
// number in `range`; kInvalidArgument naming the flag and the text.
absl::Status ReadNumber(const base::Args& args, absl::string_view flag, NumberRange range, double* value);
// Reads --flag into *value when given, as an integer in [min, max].
absl::Status ReadInt(const base::Args& args, absl::string_view flag, int min, int max, int* value);

}  // namespace ckptd::cli
