// Time for the coordinator's decisions, behind an interface so that tests of
// failure detection and deadlines run on a fake clock.
#pragma once

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ckptd::coordinator {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
};

class RealClock : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
};

class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'800'000'000)) : now_(start) {}
  absl::Time Now() override {
    absl::MutexLock l(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock l(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd::coordinator
