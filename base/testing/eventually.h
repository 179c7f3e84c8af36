// Polling for a condition that another thread or process makes true.
#pragma once

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ckptd::testing {

// Polls `done` every `poll` until it holds (true) or `limit` of real time
// passes (false). For waiting on other threads and processes; time that the
// code under test measures belongs on a base::FakeClock instead.
inline bool Eventually(const std::function<bool()>& done, absl::Duration limit = absl::Seconds(10),
                       absl::Duration poll = absl::Milliseconds(2)) {
  const absl::Time deadline = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(poll);
  }
  return true;
}

}  // namespace ckptd::testing
