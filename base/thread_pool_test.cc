#include "base/thread_pool.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/testing/busy_cpu.h"
#include "base/testing/matchers.h"
#include "base/testing/threads.h"
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

// Scheduler counts that a test sets: since `start` (on the fake clock), the
// workers were runnable all the time and got `share` of it on a CPU.
class FakeCounts {
 public:
  FakeCounts(FakeClock* clock, double share) : clock_(clock), start_(clock->Now()), share_(share) {}
  void set_share(double share) {
    absl::MutexLock l(&mu_);
    share_ = share;
  }
  void set_unavailable() {
    absl::MutexLock l(&mu_);
    unavailable_ = true;
  }
  absl::StatusOr<ThreadCpuTimes> Read(int /*tid*/) {
    const absl::Duration elapsed = clock_->Now() - start_;
    absl::MutexLock l(&mu_);
    if (unavailable_) return absl::UnavailableError("no schedstat here");
    return ThreadCpuTimes{elapsed * share_, elapsed * (1 - share_)};
  }

 private:
  FakeClock* clock_;
  const absl::Time start_;
  absl::Mutex mu_;
  double share_ ABSL_GUARDED_BY(mu_);
  bool unavailable_ ABSL_GUARDED_BY(mu_) = false;
};

class StarvationGuardTest : public ::testing::Test {
 protected:
  StarvationGuard Guard() {
    StarvationGuard g;
    g.after = absl::Seconds(2);
    g.share = 0.1;
    g.tick = absl::Milliseconds(250);
    g.clock = &clock_;
    g.read_times = [this](int tid) { return counts_.Read(tid); };
    g.on_boost = [this](const std::string& why) {
      absl::MutexLock l(&mu_);
      whys_.push_back(why);
    };
    return g;
  }
  std::vector<std::string> whys() {
    absl::MutexLock l(&mu_);
    return whys_;
  }
  // Until `n` threads wait on the fake clock: the watcher waits for a tick
  // once it has opened its window on the pool's work, and leaves that wait
  // when the pool has none.
  void AwaitClockWaiters(int n) {
    while (clock_.waiters() != n) absl::SleepFor(absl::Milliseconds(1));
  }
  // Queues `task` with the worker held (and watched since).
  void ScheduleWatched(ThreadPool& pool, std::function<void()> task) {
    pool.Schedule(std::move(task));
    AwaitClockWaiters(1);
  }
  // Moves the fake clock `n` ticks. With `watched`, one tick at a time: the
  // next only once the pool's watcher waits on the clock again (having read
  // the time of this one) or has called the reserve in. Ticks in a row
  // could otherwise pass while the watcher is between two waits: it would
  // judge an earlier time and then wait for a tick that never comes.
  void AdvanceTicks(int n, ThreadPool* watched = nullptr) {
    for (int i = 0; i < n; ++i) {
      clock_.Advance(absl::Milliseconds(250));
      if (watched == nullptr) continue;
      const absl::Time give_up = absl::Now() + absl::Seconds(60);
      while (clock_.waiters() != 1 && !watched->boosted()) {
        if (absl::Now() > give_up) {
          ADD_FAILURE() << "the watcher neither waits on the clock nor called the reserve in after tick " << i + 1;
          return;
        }
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
  }
  // Occupies the pool's one worker until `release_` is notified; returns
  // the worker's thread id.
  int HoldTheWorker(ThreadPool& pool) {
    absl::Notification holding;
    std::atomic<int> tid{0};
    pool.Schedule([&] {
      tid.store(CurrentThreadId());
      holding.Notify();
      // Bounded: a test that fails before it lets go ends instead of hanging
      // in the pool's destructor.
      release_.WaitForNotificationWithTimeout(absl::Seconds(120));
    });
    holding.WaitForNotification();
    // A worker that holds a task may be starving with it: watched.
    AwaitClockWaiters(1);
    return tid.load();
  }

  FakeClock clock_;
  FakeCounts counts_{&clock_, 0.003};
  absl::Notification release_;
  absl::Mutex mu_;
  std::vector<std::string> whys_ ABSL_GUARDED_BY(mu_);
};

// A task that records the thread it ran on.
struct Probe {
  absl::Notification ran;
  std::atomic<int> tid{0};
  std::function<void()> Task() {
    return [this] {
      tid.store(CurrentThreadId());
      ran.Notify();
    };
  }
};

TEST_F(StarvationGuardTest, StarvedWorkersHandTheirTasksToTheReserveAfterTheWindow) {
  ThreadPool pool(1, ThreadPriority::kIdle, Guard());
  ASSERT_EQ(pool.reserve_size(), 1);
  const int worker = HoldTheWorker(pool);
  Probe probe;
  ScheduleWatched(pool, probe.Task());
  AdvanceTicks(7, &pool);  // 1.75 s: less than the window
  EXPECT_FALSE(probe.ran.HasBeenNotified());
  EXPECT_EQ(pool.boosts(), 0);
  AdvanceTicks(2, &pool);
  ASSERT_TRUE(probe.ran.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_NE(probe.tid.load(), worker);  // a reserve worker ran it
  EXPECT_EQ(pool.boosts(), 1);
  EXPECT_TRUE(pool.boosted());
  EXPECT_THAT(whys(), ::testing::ElementsAre(::testing::HasSubstr("the workers got 0.3% of the CPU time")));
  release_.Notify();
}

TEST_F(StarvationGuardTest, BoostCallsTheReserveInAtOnce) {
  ThreadPool pool(1, ThreadPriority::kIdle, Guard());
  const int worker = HoldTheWorker(pool);
  Probe probe;
  ScheduleWatched(pool, probe.Task());
  EXPECT_FALSE(probe.ran.HasBeenNotified());
  pool.Boost();  // no time passes
  ASSERT_TRUE(probe.ran.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_NE(probe.tid.load(), worker);
  EXPECT_EQ(pool.boosts(), 1);
  EXPECT_TRUE(pool.boosted());
  pool.Boost();  // already boosted: not counted again
  EXPECT_EQ(pool.boosts(), 1);
  EXPECT_TRUE(whys().empty());
  release_.Notify();
}

TEST_F(StarvationGuardTest, WorkersThatGetTheirShareAreNotHelped) {
  counts_.set_share(0.5);  // two runnable threads on one core
  ThreadPool pool(1, ThreadPriority::kIdle, Guard());
  const int worker = HoldTheWorker(pool);
  Probe probe;
  ScheduleWatched(pool, probe.Task());
  AdvanceTicks(40, &pool);  // 10 s
  EXPECT_FALSE(probe.ran.HasBeenNotified());
  EXPECT_EQ(pool.boosts(), 0);
  release_.Notify();
  ASSERT_TRUE(probe.ran.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(probe.tid.load(), worker);
  EXPECT_TRUE(whys().empty());
}

TEST_F(StarvationGuardTest, WithoutSchedulerCountsNoTaskFinishingIsStarvation) {
  counts_.set_unavailable();
  ThreadPool pool(1, ThreadPriority::kIdle, Guard());
  const int worker = HoldTheWorker(pool);
  Probe probe;
  ScheduleWatched(pool, probe.Task());
  AdvanceTicks(9, &pool);
  ASSERT_TRUE(probe.ran.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_NE(probe.tid.load(), worker);
  EXPECT_THAT(whys(), ::testing::ElementsAre(::testing::HasSubstr("no task finished in 2")));
  release_.Notify();
}

TEST_F(StarvationGuardTest, TheBoostEndsOnceThePoolHasBeenIdleForTheWindow) {
  ThreadPool pool(1, ThreadPriority::kIdle, Guard());
  const int worker = HoldTheWorker(pool);
  Probe starved;
  ScheduleWatched(pool, starved.Task());
  AdvanceTicks(9, &pool);
  ASSERT_TRUE(starved.ran.WaitForNotificationWithTimeout(absl::Seconds(60)));
  release_.Notify();
  // Work that follows at once is still the reserve's.
  WaitGroup first;
  first.Add(1);
  pool.Schedule([&] { first.Done(); });
  first.Wait();
  EXPECT_TRUE(pool.boosted());
  // Let the worker leave the task it held, then idle for the window.
  absl::SleepFor(absl::Milliseconds(50));
  AdvanceTicks(8);
  EXPECT_FALSE(pool.boosted());
  counts_.set_share(0.5);
  Probe next;
  pool.Schedule(next.Task());
  ASSERT_TRUE(next.ran.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(next.tid.load(), worker);
  EXPECT_EQ(pool.boosts(), 1);
}

// A task a worker already runs cannot be handed to the reserve: while
// boosted, the worker itself runs at normal priority (where the kernel
// allows: root or CAP_SYS_NICE), and goes back once the boost ends.
TEST_F(StarvationGuardTest, ABoostRaisesTheWorkersForTheTasksTheyHold) {
  ThreadPool pool(1, ThreadPriority::kIdle, Guard());
  const int worker = HoldTheWorker(pool);
  if (pool.priority().applied != "SCHED_IDLE") {
    release_.Notify();
    GTEST_SKIP() << "no SCHED_IDLE here: " << pool.priority().ToString();
  }
  EXPECT_EQ(::sched_getscheduler(worker), SCHED_IDLE);
  CKPTD_EXPECT_OK(pool.workers_raised());  // nothing asked yet
  pool.Boost();
  if (!pool.workers_raised().ok()) {
    // Unprivileged: said, and the worker's task goes on at idle priority.
    EXPECT_EQ(pool.workers_raised().code(), absl::StatusCode::kPermissionDenied) << pool.workers_raised();
    EXPECT_THAT(pool.workers_raised().message(), ::testing::HasSubstr("CAP_SYS_NICE"));
    EXPECT_EQ(::sched_getscheduler(worker), SCHED_IDLE);
    release_.Notify();
    return;
  }
  EXPECT_EQ(::sched_getscheduler(worker), SCHED_OTHER);
  release_.Notify();
  // Idle for the window: the next task ends the boost and finds the worker
  // at its own priority again.
  absl::SleepFor(absl::Milliseconds(50));
  AdvanceTicks(8);
  Probe next;
  pool.Schedule(next.Task());
  ASSERT_TRUE(next.ran.WaitForNotificationWithTimeout(absl::Seconds(60)));
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (::sched_getscheduler(worker) != SCHED_IDLE && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(::sched_getscheduler(worker), SCHED_IDLE);
  EXPECT_FALSE(pool.boosted());
}

TEST(StarvationGuardRealTest, NoGuardForNormalPoolsOrAZeroWindow) {
  StarvationGuard g;
  g.after = absl::Seconds(1);
  ThreadPool normal(2, ThreadPriority::kNormal, g);
  EXPECT_EQ(normal.reserve_size(), 0);
  ThreadPool unguarded(2, ThreadPriority::kIdle);
  EXPECT_EQ(unguarded.reserve_size(), 0);
}

TEST(ThreadPoolTest, WorkersAndTheReserveSayWhatTheyAre) {
  using ::ckptd::testing::ThreadsNamed;
  std::string seen;
  {
    ThreadPool pool(1);
    absl::Notification ran;
    pool.Schedule([&] {
      std::ifstream f("/proc/self/task/" + std::to_string(::syscall(SYS_gettid)) + "/comm");
      std::getline(f, seen);
      ran.Notify();
    });
    ran.WaitForNotification();
  }
  EXPECT_EQ(seen, "ckptd-pool");
  // A guarded idle pool's reserve runs at its creator's priority, named so.
  const int policy = ::sched_getscheduler(0);
  const int nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
  StarvationGuard g;
  g.after = absl::Seconds(1);
  ThreadPool idle(2, ThreadPriority::kIdle, g);
  ASSERT_EQ(idle.reserve_size(), 2);
  // The reserve threads name themselves once started.
  std::vector<int> reserve;
  for (int i = 0; i < 500 && (reserve = ThreadsNamed("ckptd-reserve")).size() < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(reserve.size(), 2u);
  for (int tid : reserve) {
    EXPECT_EQ(::sched_getscheduler(tid), policy);
    EXPECT_EQ(::getpriority(PRIO_PROCESS, static_cast<id_t>(tid)), nice);
  }
  EXPECT_EQ(ThreadsNamed("ckptd-pool").size(), 2u);
}

// Spends `cpu` of the calling thread's own CPU time.
void Burn(absl::Duration cpu) {
  auto now = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return absl::DurationFromTimespec(ts);
  };
  const absl::Duration until = now() + cpu;
  while (now() < until) {
  }
}

// For real: an idle-priority pool and two busy threads, all on one CPU.
TEST(StarvationGuardRealTest, AnIdlePoolBesideBusyThreadsOnItsCpuFinishesItsWork) {
  int64_t boosts = 0;
  bool done = false;
  std::string applied;
  ::ckptd::testing::OnABusyCpu(2, [&] {
    StarvationGuard g;
    g.after = absl::Milliseconds(500);
    g.tick = absl::Milliseconds(100);
    ThreadPool pool(1, ThreadPriority::kIdle, g);
    applied = pool.priority().ToString();
    absl::Notification all;
    std::atomic<int> left{20};
    for (int i = 0; i < 20; ++i) {
      pool.Schedule([&] {
        Burn(absl::Milliseconds(5));
        if (left.fetch_sub(1) == 1) all.Notify();
      });
    }
    done = all.WaitForNotificationWithTimeout(absl::Seconds(120));
    boosts = pool.boosts();
  });
  EXPECT_TRUE(done) << "the pool at " << applied << " did not finish 100 ms of work in 120 s";
  EXPECT_GE(boosts, 1) << applied;
}

}  // namespace
}  // namespace ckptd::base
