#include "base/stop_signals.h"

#include <pthread.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

// A stop signal sent to the process while a thread other than the waiting
// one runs is still taken by WaitForStopSignal: the mask every thread
// inherited keeps it pending instead of letting the kernel hand it to a
// thread that does not wait for it.
TEST(StopSignals, ASignalToTheProcessReachesTheWaiterWhateverThreadsRun) {
  const sigset_t stop_signals = BlockStopSignals();
  std::atomic<bool> done{false};
  // Busy threads the kernel could pick to deliver the signal to.
  std::thread busy1([&done] {
    while (!done.load()) std::this_thread::yield();
  });
  std::thread busy2([&done] {
    while (!done.load()) std::this_thread::yield();
  });
  std::thread sender([] { ::kill(::getpid(), SIGTERM); });
  EXPECT_EQ(WaitForStopSignal(stop_signals), SIGTERM);
  sender.join();
  std::thread sender2([] { ::kill(::getpid(), SIGINT); });
  EXPECT_EQ(WaitForStopSignal(stop_signals), SIGINT);
  sender2.join();
  done.store(true);
  busy1.join();
  busy2.join();
  // Both are still blocked in this thread, and neither is left pending.
  sigset_t mask;
  pthread_sigmask(SIG_BLOCK, nullptr, &mask);
  EXPECT_EQ(sigismember(&mask, SIGTERM), 1);
  EXPECT_EQ(sigismember(&mask, SIGINT), 1);
  sigset_t pending;
  sigpending(&pending);
  EXPECT_EQ(sigismember(&pending, SIGTERM), 0);
  EXPECT_EQ(sigismember(&pending, SIGINT), 0);
}

}  // namespace
}  // namespace ckptd::base
