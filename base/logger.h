// Where library code reports what an operator should read: handed to each
// component through its options (as LevelDB's Options::info_log), so that tests
// capture it and embedders redirect it. Library code never writes to stderr.
#pragma once

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckptd::base {

enum class LogSeverity { kInfo, kWarning, kError };

class Logger {
 public:
  virtual ~Logger() = default;
  // One line; no trailing newline. Thread-safe.
  virtual void Log(LogSeverity severity, absl::string_view message) = 0;

  void Info(absl::string_view message) { Log(LogSeverity::kInfo, message); }
  void Warning(absl::string_view message) { Log(LogSeverity::kWarning, message); }
  void Error(absl::string_view message) { Log(LogSeverity::kError, message); }
};

// The name a log line gives `severity`: "INFO", "WARNING" or "ERROR".
absl::string_view SeverityName(LogSeverity severity);

// One line as StderrLogger writes it, with its newline: the time in UTC to
// the millisecond (RFC 3339), the severity, the program, the message:
//   2026-12-08T01:09:51.123Z WARNING ckptd-agent: cannot reach the coordinator
std::string FormatLogLine(absl::Time when, LogSeverity severity, absl::string_view program,
                          absl::string_view message);

// FormatLogLine(now, ...) on stderr, one write(2) per line.
class StderrLogger : public Logger {
 public:
  explicit StderrLogger(std::string program) : program_(std::move(program)) {}
  void Log(LogSeverity severity, absl::string_view message) override;

 private:
  const std::string program_;
  absl::Mutex mu_;
};

// The logger of components given none: a StderrLogger named after the
// program that SetProgramName() was last called with ("ckptd" before any).
Logger& DefaultLogger();
// Names the program for DefaultLogger(); each main() calls it first.
void SetProgramName(absl::string_view program);

}  // namespace ckptd::base
