#include "base/logger.h"

#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ckptd::base {
namespace {

absl::Mutex default_mu;
std::string* default_name ABSL_GUARDED_BY(default_mu) = nullptr;

class DefaultStderrLogger : public Logger {
 public:
  void Log(LogSeverity severity, absl::string_view message) override {
    std::string program;
    {
      absl::MutexLock l(&default_mu);
      program = default_name != nullptr ? *default_name : "ckptd";
    }
    StderrLogger(program).Log(severity, message);
  }
};

// One write(2) per line, so that lines of several threads and processes
// sharing the stream do not interleave.
void WriteLine(const std::string& line) {
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr closed or full: a log line is not worth failing for
    done += static_cast<size_t>(n);
  }
}

}  // namespace

absl::string_view SeverityName(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kInfo:
      return "INFO";
    case LogSeverity::kWarning:
      return "WARNING";
    case LogSeverity::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

std::string FormatLogLine(absl::Time when, LogSeverity severity, absl::string_view program,
                          absl::string_view message) {
  return absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", when, absl::UTCTimeZone()), " ",
                      SeverityName(severity), " ", program, ": ", message, "\n");
}

void StderrLogger::Log(LogSeverity severity, absl::string_view message) {
  const std::string line = FormatLogLine(absl::Now(), severity, program_, message);
  absl::MutexLock l(&mu_);
  WriteLine(line);
}

Logger& DefaultLogger() {
  static DefaultStderrLogger* const logger = new DefaultStderrLogger();
  return *logger;
}

void SetProgramName(absl::string_view program) {
  absl::MutexLock l(&default_mu);
  delete default_name;
  default_name = new std::string(program);
}

}  // namespace ckptd::base
