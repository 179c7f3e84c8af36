// Time behind an interface, so that tests of failure detection, deadlines and
// intervals run on a fake clock instead of sleeping. Components take a Clock*
// in their options; nullptr means RealClock::Get().
//
// Reading the time (Now) and waiting on it (AwaitWithDeadline, SleepUntil and
// their duration forms) both go through the clock: a wait measured by a
// FakeClock ends when the test moves that clock, never by itself.
// Deadlines of network calls (gRPC) stay on real time.
#pragma once

#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ckptd::base {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;

  // Releases `mu` (held in some mode on entry) and waits until `cond` holds
  // or Now() reaches `deadline`, then holds `mu` again as before; returns
  // whether `cond` holds. `cond` follows absl::Condition's rules: a pure
  // function of state that `mu` guards, never of the time.
  virtual bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline)
      ABSL_SHARED_LOCKS_REQUIRED(mu) = 0;
  // Returns once Now() has reached `deadline` (at once for a past one).
  virtual void SleepUntil(absl::Time deadline) = 0;

  // The same, `timeout` (or `d`) from Now().
  bool AwaitWithTimeout(absl::Mutex* mu, const absl::Condition& cond, absl::Duration timeout)
      ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return AwaitWithDeadline(mu, cond, Now() + timeout);
  }
  void SleepFor(absl::Duration d) { SleepUntil(Now() + d); }
};

// absl::Now() and absl's own waits.
class RealClock : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline) override
      ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return mu->AwaitWithDeadline(cond, deadline);
  }
  void SleepUntil(absl::Time deadline) override {
    const absl::Duration left = deadline - absl::Now();
    if (left > absl::ZeroDuration()) absl::SleepFor(left);
  }
  // The process's one real clock.
  static Clock* Get() {
    static RealClock* const clock = new RealClock();
    return clock;
  }
};

// Time that stands still until a test moves it (Advance, Set). Thread-safe.
//
// A thread waiting on it (AwaitWithDeadline, SleepUntil) re-checks its
// condition and the fake time every kPollSlice of real time, and its
// condition also whenever another thread releases the waiter's mutex (as
// absl does). Advance() and Set() return only once every waiting thread has
// checked against the new time: a waiter whose deadline was reached has left
// by then, and one still counted by waiters() saw the new time and kept
// waiting. Advance(absl::ZeroDuration()) thus makes every waiter re-check its
// condition. Advance and Set must not be called while holding a mutex that a
// waiter waits with (they would wait for that waiter forever).
class FakeClock : public Clock {
 public:
  static constexpr absl::Duration kPollSlice = absl::Milliseconds(1);

  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'800'000'000)) : now_(start) {}
  // REQUIRES: nobody waits on it any more.
  ~FakeClock() override = default;

  absl::Time Now() override {
    absl::MutexLock l(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock l(&mu_);
    now_ += d;
    AwaitWaitersLocked();
  }
  void Set(absl::Time t) {
    absl::MutexLock l(&mu_);
    now_ = t;
    AwaitWaitersLocked();
  }
  // How many threads wait on this clock now.
  int waiters() {
    absl::MutexLock l(&mu_);
    return static_cast<int>(waiters_.size());
  }

  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline) override
      ABSL_SHARED_LOCKS_REQUIRED(mu) {
    uint64_t id = 0;
    {
      absl::MutexLock l(&mu_);
      id = next_waiter_++;
      waiters_[id] = epoch_;
    }
    while (true) {
      const bool holds = cond.Eval();
      {
        // The time is read and the check recorded together: Advance counts
        // on it.
        absl::MutexLock l(&mu_);
        waiters_[id] = epoch_;
        if (holds || now_ >= deadline) {
          waiters_.erase(id);
          return holds;
        }
      }
      mu->AwaitWithTimeout(cond, kPollSlice);
    }
  }
  void SleepUntil(absl::Time deadline) override {
    static constexpr bool kNever = false;
    absl::Mutex mu;
    absl::MutexLock l(&mu);
    AwaitWithDeadline(&mu, absl::Condition(&kNever), deadline);
  }

 private:
  // Bumps the epoch and waits until every waiter has checked against it.
  void AwaitWaitersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t epoch = ++epoch_;
    auto checked = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& [id, seen] : waiters_) {
        if (seen < epoch) return false;
      }
      return true;
    };
    mu_.Await(absl::Condition(&checked));
  }

  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  // Grows with every Advance and Set.
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 0;
  // Each waiting thread's id -> the newest epoch it checked against.
  std::map<uint64_t, uint64_t> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd::base
