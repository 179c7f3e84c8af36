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
  // With `fresh_dst` (memory that may not have been touched yet, e.g. a
  // restarted trainer's new optimizer state), each thread maps its piece of
  // `dst` (PrefaultForWrite) before copying into it.
  void Copy(void* dst, const void* src, size_t n, bool fresh_dst = false);
  // Runs fn(0) .. fn(count - 1) over the same threads (the caller's
  // included), each index once, in no particular order; returns when all ran.
  void ForEach(size_t count, const std::function<void(size_t)>& fn);

 private:
  int threads_;
  std::unique_ptr<base::ThreadPool> helpers_;  // threads_ - 1 workers, or none
};

// Maps the whole pages of [p, p + n) writable before a copy writes all of
// them (madvise MADV_POPULATE_WRITE): one call instead of a page fault per
// 4 KiB, about a fifth less time for memory never touched yet. The bytes are
// left as they are. Best effort: nothing where the kernel lacks it (< 5.14).
void PrefaultForWrite(void* p, size_t n);

// Page-aligned host memory of `n` bytes (at least one page is reserved for
// n == 0), freed by FreeHostMemory; what the copiers hand out as "device"
// memory of the host device.
void* AllocateHostMemory(size_t n);
void FreeHostMemory(void* p);

}  // namespace ckptd::client
