#pragma once

#include <cstddef>

namespace ckptd::client {

// memcpy split over up to `threads` threads when `n` is large enough to gain.
void ParallelMemcpy(void* dst, const void* src, size_t n, int threads);

}  // namespace ckptd::client
