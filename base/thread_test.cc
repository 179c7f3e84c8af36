#include "base/thread.h"

#include <unistd.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/testing/matchers.h"
#include "base/thread_pool.h"
#include "base/testing/users.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(StartThread, RunsTheFunction) {
  std::atomic<int> ran{0};
  absl::StatusOr<std::thread> t = StartThread("a test", [&ran] { ran.store(1); });
  CKPTD_ASSERT_OK(t.status());
  t->join();
  EXPECT_EQ(ran.load(), 1);
}

// Runs `fn` in a forked child that may start no thread at all: as a user of
// the test's own when root (root is exempt from RLIMIT_NPROC), else as this
// user. "SKIP: <why>" when the child could not be set up so.
std::string WithoutThreads(const std::function<std::string()>& fn) {
  auto limited = [&fn] {
    const std::string why = ckptd::testing::LimitNewThreads(0);
    return why.empty() ? fn() : absl::StrCat("SKIP: ", why);
  };
  if (::geteuid() != 0) return ckptd::testing::RunInChild(limited);
  const std::vector<uint32_t> ids = ckptd::testing::UnusedIds(24);
  if (ids.empty()) return "SKIP: no unused uid in 61000..61999";
  return ckptd::testing::RunAs({.uid = ids.back(), .groups = {ids.back()}}, limited);
}

TEST(StartThread, ThreadRefusedIsResourceExhaustedNamingWhatAndWhy) {
  const std::string out = WithoutThreads([] {
    std::atomic<int> ran{0};
    absl::StatusOr<std::thread> t = StartThread("the test's worker", [&ran] { ran.store(1); });
    if (t.ok()) {
      t->join();
      return std::string("a thread started");
    }
    return absl::StrCat(absl::StatusCodeToString(t.status().code()), ": ", t.status().message(), "; ran ", ran.load());
  });
  if (absl::StartsWith(out, "SKIP: ")) GTEST_SKIP() << out;
  EXPECT_THAT(out, AllOf(StartsWith("RESOURCE_EXHAUSTED: cannot start a thread for the test's worker: "),
                         HasSubstr("Resource temporarily unavailable"), HasSubstr("RLIMIT_NPROC"),
                         HasSubstr("pids.max"), HasSubstr("; ran 0")));
}

// A pool none of whose workers could start still runs what it is given:
// on the caller's thread, never queued for no one.
TEST(ThreadPoolWithoutThreads, TasksRunOnTheCallersThread) {
  const std::string out = WithoutThreads([] {
    ThreadPool pool(4);
    if (pool.size() != 0 || pool.status().ok()) return std::string("the pool started workers");
    std::atomic<int> ran{0};
    const std::thread::id caller = std::this_thread::get_id();
    std::atomic<bool> inline_run{false};
    for (int i = 0; i < 3; ++i) {
      pool.Schedule([&] {
        ran.fetch_add(1);
        inline_run.store(std::this_thread::get_id() == caller);
      });
    }
    return absl::StrCat("ran ", ran.load(), inline_run.load() ? " inline; " : " elsewhere; ",
                        pool.status().message());
  });
  if (absl::StartsWith(out, "SKIP: ")) GTEST_SKIP() << out;
  EXPECT_THAT(out, AllOf(StartsWith("ran 3 inline; cannot start a thread for a worker of a thread pool")));
}

}  // namespace
}  // namespace ckptd::base
