// A base::Logger that keeps every line, for tests that check what a
// component reported.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "base/logger.h"

namespace ckptd::testing {

class CapturingLogger : public base::Logger {
 public:
  void Log(base::LogSeverity severity, absl::string_view message) override {
    absl::MutexLock l(&mu_);
    lines_.emplace_back(message);
  }
  std::vector<std::string> lines() {
    absl::MutexLock l(&mu_);
    return lines_;
  }
  // Whether some line contains `needle`.
  bool Contains(absl::string_view needle) {
    absl::MutexLock l(&mu_);
    for (const std::string& line : lines_) {
      if (absl::StrContains(line, needle)) return true;
    }
    return false;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd::testing
