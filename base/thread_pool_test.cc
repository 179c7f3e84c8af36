#include "base/thread_pool.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

int HardwareThreads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

TEST(ThreadPoolTest, RunsEveryTaskExactlyOnce) {
  constexpr int kTasks = 2000;
  std::vector<std::atomic<int>> runs(kTasks);
  std::atomic<int> total{0};
  WaitGroup wg;
  // Declared last, so that its workers are joined before what the tasks
  // touch goes (a task may still be leaving wg.Done() when Wait returns).
  ThreadPool pool(4);
  wg.Add(kTasks);
  for (int i = 0; i < kTasks; ++i) {
    pool.Schedule([&, i] {
      runs[i].fetch_add(1);
      total.fetch_add(1);
      wg.Done();
    });
  }
  wg.Wait();
  EXPECT_EQ(total.load(), kTasks);
  for (int i = 0; i < kTasks; ++i) EXPECT_EQ(runs[i].load(), 1) << "task " << i;
}

TEST(ThreadPoolTest, TasksRunOnTheWorkersNotTheCaller) {
  constexpr int kTasks = 200;
  absl::Mutex mu;
  std::set<std::thread::id> ids;
  WaitGroup wg;
  ThreadPool pool(3);
  wg.Add(kTasks);
  for (int i = 0; i < kTasks; ++i) {
    pool.Schedule([&] {
      {
        absl::MutexLock l(&mu);
        ids.insert(std::this_thread::get_id());
      }
      wg.Done();
    });
  }
  wg.Wait();
  absl::MutexLock l(&mu);
  EXPECT_EQ(ids.count(std::this_thread::get_id()), 0u);
  EXPECT_GE(ids.size(), 1u);
  EXPECT_LE(ids.size(), 3u);
}

TEST(ThreadPoolTest, OneWorkerRunsTasksInFifoOrder) {
  std::vector<int> order;  // only the one worker touches it until the pool is gone
  {
    ThreadPool pool(1);
    for (int i = 0; i < 100; ++i) pool.Schedule([&order, i] { order.push_back(i); });
  }
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(ThreadPoolTest, WorkersRunConcurrently) {
  // Each of the 4 tasks waits for all 4 to have started: with fewer than 4
  // workers running at once this would never finish.
  constexpr int kWorkers = 4;
  absl::Mutex mu;
  int started = 0;
  WaitGroup wg;
  ThreadPool pool(kWorkers);
  wg.Add(kWorkers);
  for (int i = 0; i < kWorkers; ++i) {
    pool.Schedule([&] {
      absl::MutexLock l(&mu);
      ++started;
      mu.Await(absl::Condition(
          +[](int* n) { return *n == kWorkers; }, &started));
      wg.Done();
    });
  }
  wg.Wait();
  absl::MutexLock l(&mu);
  EXPECT_EQ(started, kWorkers);
}

TEST(ThreadPoolTest, DestructorRunsTasksStillQueued) {
  constexpr int kQueued = 10000;
  std::atomic<int> ran{0};
  absl::Notification blocker_started;
  absl::Notification release;
  {
    ThreadPool pool(1);
    // The one worker is held while the queue fills, so the queue is still
    // (nearly) full when the destructor begins.
    pool.Schedule([&] {
      blocker_started.Notify();
      release.WaitForNotification();
    });
    blocker_started.WaitForNotification();
    for (int i = 0; i < kQueued; ++i) pool.Schedule([&ran] { ran.fetch_add(1); });
    EXPECT_EQ(ran.load(), 0);
    release.Notify();
  }
  EXPECT_EQ(ran.load(), kQueued);
}

TEST(ThreadPoolTest, DestroyingAnIdlePoolReturns) {
  auto pool = std::make_unique<ThreadPool>(8);
  pool.reset();  // must not hang with every worker waiting for work
  SUCCEED();
}

TEST(ThreadPoolTest, TasksMayScheduleMoreTasks) {
  std::atomic<int> ran{0};
  WaitGroup wg;
  ThreadPool pool(2);
  wg.Add(2);
  pool.Schedule([&] {
    ran.fetch_add(1);
    pool.Schedule([&] {
      ran.fetch_add(1);
      wg.Done();
    });
    wg.Done();
  });
  wg.Wait();
  EXPECT_EQ(ran.load(), 2);
}

TEST(ThreadPoolTest, SizeIsTheThreadsAsked) {
  EXPECT_EQ(ThreadPool(1).size(), 1);
  EXPECT_EQ(ThreadPool(3).size(), 3);
  EXPECT_EQ(ThreadPool(16).size(), 16);
}

TEST(ThreadPoolTest, SizeForZeroOrLessIsOnePerHardwareThread) {
  const ThreadPool zero(0);
  const ThreadPool negative(-5);
  EXPECT_GE(zero.size(), 1);
  EXPECT_EQ(zero.size(), HardwareThreads());
  EXPECT_EQ(negative.size(), HardwareThreads());
}

TEST(ThreadPoolTest, ZeroMeansHardwareThreadsThatAllRunTasks) {
  std::atomic<int> ran{0};
  WaitGroup wg;
  ThreadPool pool(0);
  const int tasks = pool.size() * 10;
  wg.Add(tasks);
  for (int i = 0; i < tasks; ++i) {
    pool.Schedule([&] {
      ran.fetch_add(1);
      wg.Done();
    });
  }
  wg.Wait();
  EXPECT_EQ(ran.load(), tasks);
}

// What the thread running a task runs at: its policy and nice value.
struct TaskPriority {
  int policy = -1;
  int nice = 0;
};
std::vector<TaskPriority> PrioritiesOfTasks(ThreadPool& pool, int tasks) {
  absl::Mutex mu;
  std::vector<TaskPriority> seen;
  WaitGroup wg;
  wg.Add(tasks);
  for (int i = 0; i < tasks; ++i) {
    pool.Schedule([&] {
      TaskPriority p{::sched_getscheduler(0), ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)))};
      {
        absl::MutexLock l(&mu);
        seen.push_back(p);
      }
      wg.Done();
    });
  }
  wg.Wait();
  absl::MutexLock l(&mu);
  return seen;
}

TEST(ThreadPoolTest, WorkersRunAtTheRequestedPriorityAndTheCallerDoesNot) {
  const int policy = ::sched_getscheduler(0);
  const int nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
  ThreadPool idle(3, ThreadPriority::kIdle);
  EXPECT_EQ(idle.priority().requested, ThreadPriority::kIdle);
  for (const TaskPriority& p : PrioritiesOfTasks(idle, 30)) {
    if (idle.priority().applied == "SCHED_IDLE") {
      EXPECT_EQ(p.policy, SCHED_IDLE);
    } else {
      ASSERT_EQ(idle.priority().applied, "nice 19") << idle.priority().ToString();
      EXPECT_EQ(p.nice, 19);
    }
  }
  ThreadPool low(2, ThreadPriority::kLow);
  EXPECT_EQ(low.priority().applied, "nice 19") << low.priority().ToString();
  for (const TaskPriority& p : PrioritiesOfTasks(low, 20)) EXPECT_EQ(p.nice, 19);
  ThreadPool normal(2);
  EXPECT_EQ(normal.priority().requested, ThreadPriority::kNormal);
  EXPECT_EQ(normal.priority().applied, "unchanged");
  for (const TaskPriority& p : PrioritiesOfTasks(normal, 20)) {
    EXPECT_EQ(p.policy, policy);
    EXPECT_EQ(p.nice, nice);
  }
  EXPECT_EQ(::sched_getscheduler(0), policy);
  EXPECT_EQ(::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid))), nice);
}

TEST(WaitGroupTest, WaitWithNothingAddedReturnsAtOnce) {
  WaitGroup wg;
  wg.Wait();
  wg.Add(0);
  wg.Wait();
  SUCCEED();
}

TEST(WaitGroupTest, WaitReturnsOnlyAfterTheLastDone) {
  WaitGroup wg;
  wg.Add(2);
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    wg.Wait();
    returned.store(true);
  });
  wg.Done();
  EXPECT_FALSE(returned.load());  // one still outstanding
  wg.Done();
  waiter.join();
  EXPECT_TRUE(returned.load());
}

TEST(WaitGroupTest, AddAndDoneAcrossThreads) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 500;
  WaitGroup wg;
  std::atomic<int> done{0};
  wg.Add(kThreads * kPerThread);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        done.fetch_add(1);
        wg.Done();
      }
    });
  }
  wg.Wait();
  EXPECT_EQ(done.load(), kThreads * kPerThread);
  for (std::thread& t : threads) t.join();
}

TEST(WaitGroupTest, AddOfSeveralFromWorkersThenWait) {
  // Each thread adds its own items before finishing them; Wait, started after
  // every Add, returns only when all are done.
  constexpr int kThreads = 4;
  WaitGroup started;
  started.Add(kThreads);
  WaitGroup wg;
  absl::Notification go;
  std::atomic<int> finished{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      wg.Add(3);
      started.Done();
      go.WaitForNotification();
      for (int i = 0; i < 3; ++i) {
        finished.fetch_add(1);
        wg.Done();
      }
    });
  }
  started.Wait();
  go.Notify();
  wg.Wait();
  EXPECT_EQ(finished.load(), kThreads * 3);
  for (std::thread& t : threads) t.join();
}

TEST(WaitGroupTest, ReusableAfterReachingZero) {
  WaitGroup wg;
  for (int round = 0; round < 3; ++round) {
    wg.Add(2);
    std::thread a([&] { wg.Done(); });
    std::thread b([&] { wg.Done(); });
    wg.Wait();
    a.join();
    b.join();
  }
  SUCCEED();
}

}  // namespace
}  // namespace ckptd::base
