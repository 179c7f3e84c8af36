#include "cli/figures.h"

#include <cmath>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cli/command.h"

namespace ckptd::cli {

void FigureLine(std::ostream& out, absl::string_view label, absl::string_view value) {
  constexpr size_t kLabelWidth = 28;
  const size_t width = DisplayWidth(label);
  out << "  " << label << std::string(kLabelWidth > width ? kLabelWidth - width : 1, ' ') << TerminalSafe(value)
      << "\n";
}

absl::Status ReadNumber(const base::Args& args, absl::string_view flag, NumberRange range, double* value) {
  std::optional<std::string> text = args.Get(flag);
  if (!text) return absl::OkStatus();
  double v = 0;
  if (!absl::SimpleAtod(*text, &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", *text, "\" is not a number"));
  }
  if (range == NumberRange::kPositive && !(v > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be positive, got ", *text));
  }
  if (range == NumberRange::kNonNegative && v < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " must not be negative, got ", *text));
  }
  *value = v;
  return absl::OkStatus();
}

absl::Status ReadInt(const base::Args& args, absl::string_view flag, int min, int max, int* value) {
  absl::StatusOr<std::optional<uint64_t>> v = args.GetUint(flag);
  if (!v.ok()) return v.status();
  if (!*v) return absl::OkStatus();
  if (**v < static_cast<uint64_t>(min) || **v > static_cast<uint64_t>(max)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be in ", min, "..", max, ", got ", *args.Get(flag)));
  }
  *value = static_cast<int>(**v);
  return absl::OkStatus();
}

}  // namespace ckptd::cli
