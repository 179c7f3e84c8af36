// A saturated CPU for tests of what runs at a low priority: `body` runs on a
// thread pinned to one CPU this process may use, beside `busy` threads that
// spin there at normal priority until it returns. Threads that `body`
// starts inherit the pinning.
#pragma once

#include <sched.h>

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ckptd::testing {

inline void OnABusyCpu(int busy, const std::function<void()>& body) {
  cpu_set_t allowed;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed)) ++cpu;
  ASSERT_LT(cpu, CPU_SETSIZE);
  std::atomic<bool> stop{false};
  std::thread scene([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ASSERT_EQ(::sched_setaffinity(0, sizeof(one), &one), 0);
    std::vector<std::thread> spinners;
    for (int i = 0; i < busy; ++i) {
      spinners.emplace_back([&] {
        while (!stop.load(std::memory_order_relaxed)) {
        }
      });
    }
    body();
    stop.store(true);
    for (std::thread& t : spinners) t.join();
  });
  scene.join();
}

}  // namespace ckptd::testing
