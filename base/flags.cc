#include "base/flags.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckptd::base {

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv, const std::set<std::string>& value_flags,
                                 const std::set<std::string>& bool_flags) {
  Args args;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--") {
      args.positional_.insert(args.positional_.end(), argv.begin() + i + 1, argv.end());
      break;
    }
    if (!absl::StartsWith(a, "--")) {
      args.positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2);
    std::optional<std::string> value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (bool_flags.count(name)) {
      if (value) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      args.bools_.insert(name);
    } else if (value_flags.count(name)) {
      if (!value) {
        if (i + 1 >= argv.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
        value = argv[++i];
      }
      args.values_[name] = *value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
  }
  return args;
}

bool Args::Has(absl::string_view flag) const {
  return bools_.find(flag) != bools_.end() || values_.find(flag) != values_.end();
}

std::optional<std::string> Args::Get(absl::string_view flag) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

namespace {

// `text` as an unsigned integer with an optional K/M/G/T suffix (powers of
// 1024) when `allow_suffix`; nullopt when it is not one or overflows.
std::optional<uint64_t> ParseUint(absl::string_view text, bool allow_suffix) {
  uint64_t mult = 1;
  if (allow_suffix && !text.empty()) {
    const char c = absl::ascii_toupper(static_cast<unsigned char>(text.back()));
    const int shift = c == 'K' ? 10 : c == 'M' ? 20 : c == 'G' ? 30 : c == 'T' ? 40 : 0;
    if (shift != 0) {
      mult = uint64_t{1} << shift;
      text.remove_suffix(1);
    }
  }
  uint64_t n = 0;
  // SimpleAtoi takes a sign and surrounding spaces; a count takes neither.
  if (text.empty() || !std::all_of(text.begin(), text.end(), [](char c) { return absl::ascii_isdigit(c); }) ||
      !absl::SimpleAtoi(text, &n) || (n != 0 && mult > UINT64_MAX / n)) {
    return std::nullopt;
  }
  return n * mult;
}

// A bound of a range, with the largest K/M/G/T suffix that divides it when
// the flag takes suffixes: "1T" rather than "1099511627776".
std::string Bound(uint64_t v, bool allow_suffix) {
  if (allow_suffix && v != 0) {
    for (const auto& [shift, suffix] : {std::pair<int, const char*>{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}}) {
      if (v % (uint64_t{1} << shift) == 0) return absl::StrCat(v >> shift, suffix);
    }
  }
  return absl::StrCat(v);
}

}  // namespace

absl::StatusOr<std::optional<uint64_t>> Args::GetUint(absl::string_view flag, bool allow_suffix) const {
  std::optional<std::string> v = Get(flag);
  if (!v) return std::optional<uint64_t>();
  std::optional<uint64_t> n = ParseUint(*v, allow_suffix);
  if (!n) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", *v, "\" is not a non-negative integer",
                                                   allow_suffix ? " (optionally with K, M, G or T)" : ""));
  }
  return n;
}

absl::StatusOr<std::optional<uint64_t>> Args::GetUintInRange(absl::string_view flag, uint64_t min, uint64_t max,
                                                             bool allow_suffix) const {
  std::optional<std::string> v = Get(flag);
  if (!v) return std::optional<uint64_t>();
  std::optional<uint64_t> n = ParseUint(*v, allow_suffix);
  if (!n || *n < min || *n > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " must be ", allow_suffix ? "a size" : "an integer", " in ", Bound(min, allow_suffix), "..",
        Bound(max, allow_suffix), allow_suffix ? " (bytes, or with K, M, G or T)" : "", ", got \"", *v, "\""));
  }
  return n;
}

absl::StatusOr<std::optional<absl::Duration>> Args::GetDurationInRange(absl::string_view flag, absl::Duration min,
                                                                       absl::Duration max) const {
  std::optional<std::string> v = Get(flag);
  if (!v) return std::optional<absl::Duration>();
  absl::Duration d;
  if (!absl::ParseDuration(*v, &d) || d == absl::InfiniteDuration() || d == -absl::InfiniteDuration() || d < min ||
      d > max) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be a duration in ", absl::FormatDuration(min),
                                                   "..", absl::FormatDuration(max), " (like 500ms, 30s, 1h30m), got \"",
                                                   *v, "\""));
  }
  return d;
}

}  // namespace ckptd::base
