// Bounding a call that a FIFO could block for ever (opening a FIFO waits for
// the other side), so that a test that would hang fails instead.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <utility>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace ckptd::testing {

// Runs `fn` on a thread of its own and returns what it returned. A call still
// running after `limit` fails the test; `fifo` is then opened from both sides
// until it returns (a reader releases a writer stuck in open(2), a writer a
// reader), so that the test ends failed instead of hanging.
template <typename Fn>
auto WithinOrReleaseFifo(const std::string& fifo, Fn fn, absl::Duration limit = absl::Seconds(10)) -> decltype(fn()) {
  std::packaged_task<decltype(fn())()> task(std::move(fn));
  std::future<decltype(fn())> done = task.get_future();
  std::thread thread(std::move(task));
  if (done.wait_for(absl::ToChronoMilliseconds(limit)) != std::future_status::ready) {
    ADD_FAILURE() << "still blocked after " << limit << " on " << fifo;
    while (done.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
      const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
      const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (writer >= 0) ::close(writer);
      if (reader >= 0) ::close(reader);
    }
  }
  thread.join();
  return done.get();
}

}  // namespace ckptd::testing
