// The figures of ckptctl's offline reports (`interval` and `plan`, in
// cli/interval_commands.h): one labelled figure a line (durations written by
// base::FormatSeconds), and the number flags they are computed from.
// Internal to ckptd::cli.
#pragma once

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "base/flags.h"

namespace ckptd::cli {

// "  label   value": the label padded to 28 columns (at least one space);
// the value TerminalSafe (a live job's reason comes from the coordinator).
void FigureLine(std::ostream& out, absl::string_view label, absl::string_view value);

enum class NumberRange { kPositive, kNonNegative };
// Reads --flag into *value when given (leaves it otherwise), as a finite
// number in `range`; kInvalidArgument naming the flag and the text.
absl::Status ReadNumber(const base::Args& args, absl::string_view flag, NumberRange range, double* value);
// Reads --flag into *value when given, as an integer in [min, max].
absl::Status ReadInt(const base::Args& args, absl::string_view flag, int min, int max, int* value);

}  // namespace ckptd::cli
