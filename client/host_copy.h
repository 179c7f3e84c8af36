#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "base/thread_pool.h"

namespace ckptd::client {

// memcpy split over up to `threads` threads (the caller's included) when the
// size is large enough to gain. The helper threads are started once and
// reused: a snapshot's copy creates no thread.
class ParallelCopier {
 public:
  // `threads` <= 0: one per hardware thread.
  explicit ParallelCopier(int threads);
  void Copy(void* dst, const void* src, size_t n);
  // Runs fn(0) .. fn(count - 1) over the same threads (the caller's
  // included), each index once, in no particular order; returns when all ran.
  void ForEach(size_t count, const std::function<void(size_t)>& fn);

 private:
  int threads_;
  std::unique_ptr<base::ThreadPool> helpers_;  // threads_ - 1 workers, or none
};

// Page-aligned host memory of `n` bytes (at least one page is reserved for
// n == 0), freed by FreeHostMemory; what the copiers hand out as "device"
// memory of the host device.
void* AllocateHostMemory(size_t n);
void FreeHostMemory(void* p);

}  // namespace ckptd::client
