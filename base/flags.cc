#include "base/flags.h"

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

absl::StatusOr<std::optional<uint64_t>> Args::GetUint(absl::string_view flag, bool allow_suffix) const {
  std::optional<std::string> v = Get(flag);
  if (!v) return std::optional<uint64_t>();
  std::string s = *v;
  uint64_t mult = 1;
  if (allow_suffix && !s.empty()) {
    const char c = absl::ascii_toupper(static_cast<unsigned char>(s.back()));
    const int shift = c == 'K' ? 10 : c == 'M' ? 20 : c == 'G' ? 30 : c == 'T' ? 40 : 0;
    if (shift != 0) {
      mult = uint64_t{1} << shift;
      s.pop_back();
    }
  }
  uint64_t n = 0;
  if (s.empty() || !absl::ascii_isdigit(static_cast<unsigned char>(s[0])) || !absl::SimpleAtoi(s, &n) ||
      (n != 0 && mult > UINT64_MAX / n)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", *v, "\" is not a non-negative integer",
                                                   allow_suffix ? " (optionally with K, M, G or T)" : ""));
  }
  return std::optional<uint64_t>(n * mult);
}

}  // namespace ckptd::base
