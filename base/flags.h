// Command-line parsing for every ckptd program: "--name value",
// "--name=value", boolean "--name", and positional arguments.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckptd::base {

// Exit statuses shared by every program and command.
enum ExitCode : int {
  kExitOk = 0,           // success (and, for verify, everything verified)
  kExitFailed = 1,       // the operation ran and failed (e.g. verification found a problem)
  kExitUsage = 2,        // bad command line
  kExitUnavailable = 3,  // a service or the storage could not be reached
};

class Args {
 public:
  // `value_flags` take a value, `bool_flags` do not; anything else starting
  // with "--" is a usage error naming it.
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv, const std::set<std::string>& value_flags,
                                    const std::set<std::string>& bool_flags);

  bool Has(absl::string_view flag) const;
  std::optional<std::string> Get(absl::string_view flag) const;
  // The flag's value as an unsigned integer with an optional K/M/G/T suffix
  // (powers of 1024) when `allow_suffix`; kInvalidArgument naming the flag.
  absl::StatusOr<std::optional<uint64_t>> GetUint(absl::string_view flag, bool allow_suffix = false) const;
  // The flag's value as an integer in [min, max] (with an optional K/M/G/T
  // suffix when `allow_suffix`); nullopt when absent. A value that is not
  // such an integer, or lies outside the range, is kInvalidArgument naming
  // the flag and the range: `--threads must be an integer in 1..1024, got
  // "100000"`.
  absl::StatusOr<std::optional<uint64_t>> GetUintInRange(absl::string_view flag, uint64_t min, uint64_t max,
                                                         bool allow_suffix = false) const;
  // GetUintInRange into `*value`, which is left alone when the flag is
  // absent. `max` must fit T (kInternal otherwise): nothing is narrowed.
  template <typename T>
  absl::Status ReadUint(absl::string_view flag, uint64_t min, uint64_t max, T* value, bool allow_suffix = false) const {
    static_assert(std::numeric_limits<T>::is_integer, "ReadUint reads integers");
    if (max > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
      return absl::InternalError(absl::StrCat("--", flag, ": the range's top ", max, " does not fit its type"));
    }
    absl::StatusOr<std::optional<uint64_t>> v = GetUintInRange(flag, min, max, allow_suffix);
    if (!v.ok()) return v.status();
    if (*v) *value = static_cast<T>(**v);
    return absl::OkStatus();
  }
  // The flag's value as a duration (500ms, 1m30s, 2h; absl::ParseDuration)
  // in [min, max]; nullopt when absent. Anything else, infinity included,
  // is kInvalidArgument naming the flag and the range.
  absl::StatusOr<std::optional<absl::Duration>> GetDurationInRange(absl::string_view flag, absl::Duration min,
                                                                   absl::Duration max) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string, std::less<>> values_;
  std::set<std::string, std::less<>> bools_;
  std::vector<std::string> positional_;
};

}  // namespace ckptd::base
