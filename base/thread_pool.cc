#include "base/thread_pool.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/thread.h"

namespace ckptd::base {

ThreadPool::ThreadPool(int threads, ThreadPriority priority, StarvationGuard guard)
    : guard_(std::move(guard)),
      clock_(guard_.clock != nullptr ? guard_.clock : RealClock::Get()),
      guarded_(priority != ThreadPriority::kNormal && guard_.after > absl::ZeroDuration()) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (!guard_.read_times) guard_.read_times = ReadThreadCpuTimes;
  workers_.reserve(threads);
  for (int i = 0; i < threads && not_started_.ok(); ++i) {
    absl::StatusOr<std::thread> worker = StartThread("a worker of a thread pool", [this] { WorkerLoop(); });
    if (worker.ok()) {
      workers_.push_back(*std::move(worker));
    } else {
      not_started_ = worker.status();
    }
  }
  const int started = static_cast<int>(workers_.size());
  std::vector<int> tids;
  {
    absl::MutexLock l(&mu_);
    auto all_started = [this, started]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(worker_tids_.size()) == started;
    };
    mu_.Await(absl::Condition(&all_started));
    tids = worker_tids_;
  }
  normal_nice_ = CallingThreadNice();
  // No task can have been scheduled yet: every one runs at `priority`.
  if (!tids.empty()) priority_ = SetThreadPriority(tids.front(), priority);
  for (size_t i = 1; i < tids.size(); ++i) {
    AppliedPriority applied = SetThreadPriority(tids[i], priority);
    if (priority_.why_not.ok() && !applied.why_not.ok()) priority_ = std::move(applied);
  }
  if (guarded_) {
    reserve_.reserve(threads);
    for (int i = 0; i < threads && not_started_.ok(); ++i) {
      absl::StatusOr<std::thread> reserve =
          StartThread("a reserve worker of a thread pool", [this, i] { ReserveLoop(/*watcher=*/i == 0); });
      if (reserve.ok()) {
        reserve_.push_back(*std::move(reserve));
      } else {
        not_started_ = reserve.status();
      }
    }
  }
}

absl::StatusOr<std::unique_ptr<ThreadPool>> ThreadPool::Create(int threads, ThreadPriority priority,
                                                                StarvationGuard guard) {
  auto pool = std::make_unique<ThreadPool>(threads, priority, std::move(guard));
  if (!pool->not_started_.ok()) return pool->not_started_;  // the workers started are joined
  return pool;
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
  for (std::thread& t : reserve_) t.join();
}

void ThreadPool::Schedule(std::function<void()> task) {
  if (workers_.empty()) {
    // No worker could be started (status() says why): the caller runs the
    // task, slower, rather than leave it queued for no one.
    task();
    return;
  }
  absl::MutexLock l(&mu_);
  tasks_.push_back(std::move(task));
}

int64_t ThreadPool::boosts() const {
  absl::MutexLock l(&mu_);
  return boosts_;
}

bool ThreadPool::boosted() const {
  const absl::Time now = clock_->Now();
  absl::MutexLock l(&mu_);
  return boosted_ && !(tasks_.empty() && IdleForWindowLocked(now));
}

void ThreadPool::Boost() {
  if (!guarded_) return;
  {
    absl::MutexLock l(&mu_);
    if (boosted_) return;
    boosted_ = true;
    ++boosts_;
    idle_since_ = absl::InfinitePast();  // busy since the boost
  }
  RaiseWorkers();
}

absl::Status ThreadPool::workers_raised() const {
  absl::MutexLock l(&raise_mu_);
  return raise_refused_;
}

void ThreadPool::RaiseWorkers() {
  absl::MutexLock r(&raise_mu_);
  std::vector<int> tids;
  {
    absl::MutexLock l(&mu_);
    if (!boosted_ || workers_high_) return;  // the boost ended meanwhile, or done
    tids = worker_tids_;
  }
  absl::Status refused;
  for (int tid : tids) {
    if (absl::Status s = RaiseThreadPriority(tid, normal_nice_); !s.ok() && refused.ok()) refused = s;
  }
  workers_high_ = true;
  raise_refused_ = refused;
}

void ThreadPool::LowerWorkers() {
  absl::MutexLock r(&raise_mu_);
  std::vector<int> tids;
  {
    absl::MutexLock l(&mu_);
    if (boosted_ || !workers_high_) return;  // boosted again meanwhile, or done
    tids = worker_tids_;
  }
  for (int tid : tids) (void)SetThreadPriority(tid, priority_.requested);
  workers_high_ = false;
}

bool ThreadPool::IdleForWindowLocked(absl::Time now) const {
  return running_ == 0 && idle_since_ != absl::InfinitePast() && now - idle_since_ >= guard_.after;
}

std::function<void()> ThreadPool::TakeLocked() {
  std::function<void()> task = std::move(tasks_.front());
  tasks_.pop_front();
  ++running_;
  return task;
}

void ThreadPool::Finished() {
  const absl::Time now = guarded_ ? clock_->Now() : absl::InfinitePast();
  absl::MutexLock l(&mu_);
  --running_;
  ++finished_;
  if (running_ == 0 && tasks_.empty()) idle_since_ = now;
}

void ThreadPool::WorkerLoop() {
  SetCallingThreadName("ckptd-pool");
  {
    absl::MutexLock l(&mu_);
    worker_tids_.push_back(CurrentThreadId());
  }
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock l(&mu_);
      // While the reserve is called in, the workers stand aside: a task
      // they took would wait for them at their priority.
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || (!tasks_.empty() && !boosted_); };
      mu_.Await(absl::Condition(&ready));
      if (tasks_.empty()) return;  // stopping and drained
      task = TakeLocked();
    }
    task();
    Finished();
  }
}

std::optional<ThreadCpuTimes> ThreadPool::SampleWorkers(const std::vector<int>& tids) {
  ThreadCpuTimes sum{};
  for (int tid : tids) {
    absl::StatusOr<ThreadCpuTimes> t = guard_.read_times(tid);
    if (!t.ok()) return std::nullopt;
    sum.on_cpu += t->on_cpu;
    sum.waiting += t->waiting;
  }
  return sum;
}

void ThreadPool::ReserveLoop(bool watcher) {
  SetCallingThreadName("ckptd-reserve");
  // The watcher's window: since when it has looked, and what it saw then.
  struct Window {
    bool open = false;
    absl::Time start;
    std::optional<ThreadCpuTimes> times;
    uint64_t finished = 0;
  };
  Window window;
  while (true) {
    std::function<void()> task;
    std::vector<int> tids;
    uint64_t finished = 0;
    bool lower = false;  // the boost ended: the workers go back to their priority
    {
      absl::MutexLock l(&mu_);
      // The reserve takes tasks only while called in. The watcher, until
      // then, looks at the workers while the pool has work: tasks queued, or
      // taken by workers that may be starving with them.
      auto ready = [this, watcher]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stopping_ || (boosted_ && !tasks_.empty())) return true;
        return watcher && !boosted_ && (!tasks_.empty() || running_ > 0);
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_ && (!boosted_ || tasks_.empty())) return;  // the workers drain what is left
      if (boosted_ && !tasks_.empty()) {
        const absl::Time now = clock_->Now();
        // Idle for `after` since the boost: the next work starts at the
        // workers' priority again, and must starve anew to be helped.
        if (IdleForWindowLocked(now)) {
          boosted_ = false;
          idle_since_ = absl::InfinitePast();
          lower = true;
        } else {
          task = TakeLocked();
        }
      }
      if (!task && (!watcher || boosted_)) {
        // (Out of the lock first.)
      } else if (!task) {
        tids = worker_tids_;
        finished = finished_;
      }
    }
    if (lower) LowerWorkers();
    if (!task && (!watcher || tids.empty())) continue;
    if (task) {
      task();
      Finished();
      continue;
    }
    const absl::Time now = clock_->Now();
    std::optional<ThreadCpuTimes> times = SampleWorkers(tids);
    std::string why;
    if (window.open && now - window.start >= guard_.after) {
      const absl::Duration elapsed = now - window.start;
      if (times && window.times) {
        const absl::Duration on_cpu = times->on_cpu - window.times->on_cpu;
        const absl::Duration waiting = times->waiting - window.times->waiting;
        const double got = absl::FDivDuration(on_cpu, std::max(on_cpu + waiting, absl::Nanoseconds(1)));
        if (waiting >= elapsed / 2 && got < guard_.share) {
          why = absl::StrFormat("the workers got %.1f%% of the CPU time they were runnable for over %s", 100 * got,
                                absl::FormatDuration(elapsed));
        }
      } else if (finished == window.finished) {
        why = absl::StrCat("no task finished in ", absl::FormatDuration(elapsed), " while the pool had work");
      }
      window.open = false;
    }
    if (!why.empty()) {
      {
        absl::MutexLock l(&mu_);
        boosted_ = true;
        ++boosts_;
        idle_since_ = absl::InfinitePast();  // busy since the boost
      }
      RaiseWorkers();
      if (guard_.on_boost) guard_.on_boost(why);
      continue;
    }
    if (!window.open) window = Window{true, now, times, finished};
    absl::MutexLock l(&mu_);
    auto drained = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || (tasks_.empty() && running_ == 0); };
    // Boost() calls the reserve in between two ticks.
    auto wake = [this, &drained]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return drained() || (boosted_ && !tasks_.empty()); };
    // A window ends with the work it watched.
    if (clock_->AwaitWithTimeout(&mu_, absl::Condition(&wake), guard_.tick) && drained()) window.open = false;
  }
}

}  // namespace ckptd::base
