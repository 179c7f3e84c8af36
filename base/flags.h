// Command-line parsing for every ckptd program: "--name value",
// "--name=value", boolean "--name", and positional arguments.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv,
                                    const std::set<std::string>& value_flags,
                                    const std::set<std::string>& bool_flags);

  bool Has(absl::string_view flag) const;
  std::optional<std::string> Get(absl::string_view flag) const;
  // The flag's value as an unsigned integer with an optional K/M/G/T suffix
  // (powers of 1024) when `allow_suffix`; kInvalidArgument naming the flag.
  absl::StatusOr<std::optional<uint64_t>> GetUint(absl::string_view flag, bool allow_suffix = false) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string, std::less<>> values_;
  std::set<std::string, std::less<>> bools_;
  std::vector<std::string> positional_;
};

}  // namespace ckptd::base
