#include "base/logger.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/civil_time.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/testing/capturing_logger.h"
#include "base/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// What `f` writes to file descriptor 2: fd 2 points at a file (opened with
// O_APPEND, as a shell's 2>> would) while `f` runs, and is restored after.
std::string CaptureStderr(const std::function<void()>& f) {
  ckptd::testing::TempDir dir("ckptd-logger-");
  const std::string path = dir.Sub("stderr");
  std::fflush(stderr);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) {
    ADD_FAILURE() << "open " << path << ": errno " << errno;
    return "";
  }
  const int saved = ::dup(STDERR_FILENO);
  if (saved < 0 || ::dup2(fd, STDERR_FILENO) < 0) {
    ADD_FAILURE() << "dup/dup2: errno " << errno;
    ::close(fd);
    return "";
  }
  f();
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = ::pread(fd, buf, sizeof(buf), static_cast<off_t>(out.size()))) > 0) out.append(buf, n);
  ::close(fd);
  return out;
}

// `out` with each line's time taken off ("SEVERITY program: message\n" per
// line); a time that is not RFC 3339 UTC to the millisecond, or not within
// a minute of now, or a severity that is not one of the three, is a failure.
std::string WithoutTimes(const std::string& out) {
  std::string rest;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    const size_t space = line.find(' ');
    const absl::string_view time = line.substr(0, space);
    const absl::string_view after = space == absl::string_view::npos ? "" : line.substr(space + 1);
    absl::Time when;
    std::string error;
    // 2026-12-08T01:09:51.123Z: 24 characters, three digits after the point.
    if (time.size() != 24 || time[19] != '.' || time.back() != 'Z' ||
        !absl::ParseTime("%Y-%m-%dT%H:%M:%E*SZ", time, absl::UTCTimeZone(), &when, &error)) {
      ADD_FAILURE() << "not a timed log line: " << line.substr(0, 80) << " " << error;
      continue;
    }
    EXPECT_LT(absl::AbsDuration(absl::Now() - when), absl::Minutes(1)) << line.substr(0, 80);
    EXPECT_TRUE(absl::StartsWith(after, "INFO ") || absl::StartsWith(after, "WARNING ") ||
                absl::StartsWith(after, "ERROR "))
        << line.substr(0, 80);
    absl::StrAppend(&rest, after, "\n");
  }
  return rest;
}

TEST(FormatLogLineTest, TimeInUtcToTheMillisecondSeverityProgramMessage) {
  const absl::Time t = absl::FromCivil(absl::CivilSecond(2026, 12, 8, 1, 9, 51), absl::UTCTimeZone()) +
                       absl::Microseconds(123456);
  EXPECT_EQ(FormatLogLine(t, LogSeverity::kInfo, "ckptd-agent", "listening on 127.0.0.1:9090"),
            "2026-12-08T01:09:51.123Z INFO ckptd-agent: listening on 127.0.0.1:9090\n");
  EXPECT_EQ(FormatLogLine(t, LogSeverity::kWarning, "p", "w"), "2026-12-08T01:09:51.123Z WARNING p: w\n");
  EXPECT_EQ(FormatLogLine(t, LogSeverity::kError, "p", ""), "2026-12-08T01:09:51.123Z ERROR p: \n");
  // Whatever the local time zone, the time is UTC.
  EXPECT_EQ(FormatLogLine(absl::UnixEpoch(), LogSeverity::kInfo, "p", "m"), "1970-01-01T00:00:00.000Z INFO p: m\n");
  EXPECT_EQ(SeverityName(LogSeverity::kWarning), "WARNING");
}

TEST(StderrLoggerTest, WritesTimeSeverityProgramColonMessageAndNewline) {
  StderrLogger logger("ckptd-agent");
  EXPECT_EQ(WithoutTimes(CaptureStderr([&] { logger.Info("listening on 127.0.0.1:9090"); })),
            "INFO ckptd-agent: listening on 127.0.0.1:9090\n");
}

TEST(StderrLoggerTest, EverySeverityIsNamed) {
  StderrLogger logger("prog");
  EXPECT_EQ(WithoutTimes(CaptureStderr([&] {
              logger.Info("i");
              logger.Warning("w");
              logger.Error("e");
              logger.Log(LogSeverity::kWarning, "via Log");
            })),
            "INFO prog: i\nWARNING prog: w\nERROR prog: e\nWARNING prog: via Log\n");
}

TEST(StderrLoggerTest, EmptyMessageAndLongMessage) {
  StderrLogger logger("p");
  const std::string long_message(100'000, 'x');
  const std::string out = CaptureStderr([&] {
    logger.Info("");
    logger.Info(long_message);
  });
  EXPECT_EQ(WithoutTimes(out), absl::StrCat("INFO p: \n", "INFO p: ", long_message, "\n"));
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2);
}

TEST(StderrLoggerTest, StderrIsRestoredAfterCapture) {
  // Each capture holds only what was written while it ran.
  StderrLogger logger("p");
  const std::string first = CaptureStderr([&] { logger.Info("one"); });
  const std::string second = CaptureStderr([&] { logger.Info("two"); });
  EXPECT_EQ(WithoutTimes(first), "INFO p: one\n");
  EXPECT_EQ(WithoutTimes(second), "INFO p: two\n");
}

TEST(DefaultLoggerTest, IsOneObject) { EXPECT_EQ(&DefaultLogger(), &DefaultLogger()); }

TEST(DefaultLoggerTest, UsesTheNameLastGivenToSetProgramName) {
  SetProgramName("ckptd-coordinator");
  EXPECT_EQ(WithoutTimes(CaptureStderr([] { DefaultLogger().Info("started"); })), "INFO ckptd-coordinator: started\n");
  SetProgramName("ckptctl");
  EXPECT_EQ(WithoutTimes(CaptureStderr([] { DefaultLogger().Warning("no coordinator"); })),
            "WARNING ckptctl: no coordinator\n");
  SetProgramName("ckptd");
  EXPECT_EQ(WithoutTimes(CaptureStderr([] { DefaultLogger().Error("x"); })), "ERROR ckptd: x\n");
}

TEST(DefaultLoggerTest, NameIsCopied) {
  {
    std::string name = "ckptd-bench";
    SetProgramName(name);
    name.assign("overwritten");
  }
  EXPECT_EQ(WithoutTimes(CaptureStderr([] { DefaultLogger().Info("m"); })), "INFO ckptd-bench: m\n");
}

TEST(DefaultLoggerDeathTest, IsNamedCkptdBeforeSetProgramName) {
  // A fresh process (the threadsafe style re-executes the binary, running
  // only this test), so that no other test's SetProgramName counts.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        DefaultLogger().Info("before any SetProgramName");
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), ::testing::ContainsRegex("(^|\n)[-0-9T:.]+Z INFO ckptd: before any SetProgramName\n"));
}

// Several threads logging at once: every line comes out whole.
void ExpectWholeLines(const std::string& timed_out, const std::string& program, int threads, int lines_per_thread) {
  const std::string out = WithoutTimes(timed_out);
  std::vector<std::string> want;
  for (int t = 0; t < threads; ++t) {
    for (int i = 0; i < lines_per_thread; ++i) {
      want.push_back(
          absl::StrCat("INFO ", program, ": thread ", t, " line ", i, " ",
                       std::string(200, static_cast<char>('a' + t % 26))));
    }
  }
  ASSERT_FALSE(out.empty());
  ASSERT_EQ(out.back(), '\n');
  std::vector<std::string> got = absl::StrSplit(out.substr(0, out.size() - 1), '\n');
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "line " << i << " of the sorted output";
}

void LogFromThreads(Logger& logger, int threads, int lines_per_thread) {
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&logger, t, lines_per_thread] {
      for (int i = 0; i < lines_per_thread; ++i) {
        logger.Info(absl::StrCat("thread ", t, " line ", i, " ", std::string(200, static_cast<char>('a' + t % 26))));
      }
    });
  }
  for (std::thread& w : workers) w.join();
}

TEST(StderrLoggerTest, ConcurrentLinesDoNotInterleave) {
  StderrLogger logger("conc");
  const std::string out = CaptureStderr([&] { LogFromThreads(logger, 8, 250); });
  ExpectWholeLines(out, "conc", 8, 250);
}

TEST(DefaultLoggerTest, ConcurrentLinesDoNotInterleave) {
  SetProgramName("conc-default");
  const std::string out = CaptureStderr([&] { LogFromThreads(DefaultLogger(), 8, 250); });
  ExpectWholeLines(out, "conc-default", 8, 250);
}

TEST(CapturingLoggerTest, KeepsLinesInOrder) {
  ckptd::testing::CapturingLogger capturing;
  Logger& logger = capturing;
  EXPECT_THAT(capturing.lines(), IsEmpty());
  logger.Info("first");
  logger.Warning("second");
  logger.Error("third");
  logger.Log(LogSeverity::kInfo, "");
  EXPECT_THAT(capturing.lines(), ElementsAre("first", "second", "third", ""));
}

TEST(CapturingLoggerTest, ContainsLooksForASubstringOfSomeLine) {
  ckptd::testing::CapturingLogger logger;
  EXPECT_FALSE(logger.Contains(""));
  EXPECT_FALSE(logger.Contains("step"));
  logger.Info("committed step 100 of job a");
  logger.Warning("node n2 lost");
  EXPECT_TRUE(logger.Contains("step 100"));
  EXPECT_TRUE(logger.Contains("n2 lost"));
  EXPECT_TRUE(logger.Contains("committed step 100 of job a"));
  EXPECT_TRUE(logger.Contains(""));
  EXPECT_FALSE(logger.Contains("step 200"));
  EXPECT_FALSE(logger.Contains("job a\nnode"));  // within one line only
  EXPECT_FALSE(logger.Contains("Step 100"));     // case-sensitive
}

TEST(CapturingLoggerTest, WritesNothingToStderr) {
  ckptd::testing::CapturingLogger logger;
  EXPECT_EQ(CaptureStderr([&] { logger.Error("quiet"); }), "");
  EXPECT_TRUE(logger.Contains("quiet"));
}

TEST(CapturingLoggerTest, ConcurrentLogging) {
  ckptd::testing::CapturingLogger logger;
  LogFromThreads(logger, 8, 100);
  const std::vector<std::string> lines = logger.lines();
  EXPECT_EQ(lines.size(), 800u);
  EXPECT_TRUE(logger.Contains("thread 7 line 99 "));
  EXPECT_TRUE(logger.Contains("thread 0 line 0 "));
}

}  // namespace
}  // namespace ckptd::base
