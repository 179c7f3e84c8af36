#include "base/thread_priority.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;

struct Seen {
  AppliedPriority applied;
  int policy = -1;
  int nice = 0;
  long ioprio = -1;
};

int Nice() { return ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid))); }

// Applies `p` on a thread of its own and reads back what that thread runs at.
Seen ApplyOnAThread(ThreadPriority p) {
  Seen seen;
  std::thread t([&] {
    seen.applied = SetCallingThreadPriority(p);
    seen.policy = ::sched_getscheduler(0);
    seen.nice = Nice();
    seen.ioprio = ::syscall(SYS_ioprio_get, 1 /* IOPRIO_WHO_PROCESS */, ::syscall(SYS_gettid));
  });
  t.join();
  return seen;
}

TEST(ThreadPriorityTest, NamesParseBack) {
  for (ThreadPriority p : {ThreadPriority::kNormal, ThreadPriority::kLow, ThreadPriority::kIdle}) {
    EXPECT_THAT(ParseThreadPriority(ThreadPriorityName(p)), ::ckptd::testing::IsOkAndHolds(p));
  }
  EXPECT_THAT(ParseThreadPriority("lowest"),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be idle, low or normal, got \"lowest\""));
  EXPECT_THAT(ParseThreadPriority(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("idle, low or normal")));
}

TEST(ThreadPriorityTest, NormalChangesNothing) {
  const int policy = ::sched_getscheduler(0);
  const int nice = Nice();
  Seen seen = ApplyOnAThread(ThreadPriority::kNormal);
  EXPECT_EQ(seen.applied.applied, "unchanged");
  EXPECT_THAT(seen.applied.why_not, IsOk());
  EXPECT_EQ(seen.policy, policy);
  EXPECT_EQ(seen.nice, nice);
  EXPECT_EQ(seen.applied.ToString(), "unchanged");
}

TEST(ThreadPriorityTest, LowIsNice19ForTheCallingThreadOnly) {
  const int nice = Nice();
  Seen seen = ApplyOnAThread(ThreadPriority::kLow);
  EXPECT_EQ(seen.applied.requested, ThreadPriority::kLow);
  EXPECT_EQ(seen.applied.applied, "nice 19");
  EXPECT_THAT(seen.applied.why_not, IsOk());
  EXPECT_EQ(seen.nice, 19);
  EXPECT_EQ(Nice(), nice) << "the caller's own nice value moved";
}

TEST(ThreadPriorityTest, IdleIsSchedIdleWithBestEffortIoOrNice19) {
  const int policy = ::sched_getscheduler(0);
  Seen seen = ApplyOnAThread(ThreadPriority::kIdle);
  EXPECT_EQ(seen.applied.requested, ThreadPriority::kIdle);
  if (seen.applied.applied == "SCHED_IDLE") {
    EXPECT_EQ(seen.policy, SCHED_IDLE);
    if (seen.applied.why_not.ok()) {
      EXPECT_EQ(seen.ioprio, (2 << 13) | 7) << "best-effort, level 7";
    }
  } else {
    // Where SCHED_IDLE is refused (a seccomp filter), nice 19, and why.
    EXPECT_EQ(seen.applied.applied, "nice 19");
    EXPECT_EQ(seen.nice, 19);
    EXPECT_THAT(seen.applied.why_not.message(), HasSubstr("SCHED_IDLE refused"));
    EXPECT_THAT(seen.applied.ToString(), HasSubstr("nice 19 (SCHED_IDLE refused"));
  }
  EXPECT_EQ(::sched_getscheduler(0), policy) << "the caller's own policy moved";
}

TEST(ThreadPriorityTest, AnotherThreadOfTheProcessByItsId) {
  absl::Mutex mu;
  int tid = 0;
  bool applied = false;
  int nice_seen = 0;
  std::thread t([&] {
    absl::MutexLock l(&mu);
    tid = CurrentThreadId();
    mu.Await(absl::Condition(&applied));
    nice_seen = Nice();
  });
  {
    absl::MutexLock l(&mu);
    mu.Await(absl::Condition(
        +[](int* id) { return *id != 0; }, &tid));
  }
  EXPECT_NE(tid, CurrentThreadId());
  const int mine = Nice();
  AppliedPriority a = SetThreadPriority(tid, ThreadPriority::kLow);
  EXPECT_EQ(a.applied, "nice 19");
  {
    absl::MutexLock l(&mu);
    applied = true;
  }
  t.join();
  EXPECT_EQ(nice_seen, 19);
  EXPECT_EQ(Nice(), mine);
}

// What /proc says the calling thread is called.
std::string CallingThreadComm() {
  std::ifstream f("/proc/self/task/" + std::to_string(::syscall(SYS_gettid)) + "/comm");
  std::string name;
  std::getline(f, name);
  return name;
}

TEST(ThreadNameTest, NamesTheCallingThreadOnlyAndCutsAt15Bytes) {
  const std::string mine = CallingThreadComm();
  std::string named, cut;
  std::thread t([&] {
    SetCallingThreadName("ckptd-persist");
    named = CallingThreadComm();
    SetCallingThreadName("a-name-longer-than-fifteen-bytes");
    cut = CallingThreadComm();
  });
  t.join();
  EXPECT_EQ(named, "ckptd-persist");
  EXPECT_EQ(cut, "a-name-longer-t");
  EXPECT_EQ(CallingThreadComm(), mine);
}

}  // namespace
}  // namespace ckptd::base
