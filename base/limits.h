// Limits on the numbers that command lines and RPCs carry, shared by every
// program and service so that a value one of them accepts is one the next can
// handle: nothing is truncated on the way.
#pragma once

#include <cstdint>

namespace ckptd::base {

// Ranks in one job (--world-size, a registration's world_size). The
// coordinator's CoordinatorOptions::max_world_size defaults to it.
inline constexpr uint32_t kMaxWorldSize = uint32_t{1} << 20;

// Worker threads a --threads flag may ask for.
inline constexpr int kMaxThreads = 1024;

}  // namespace ckptd::base
