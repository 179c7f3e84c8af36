// The checksum of the shard format, which the trainer library computes too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace ckptd::format {

// XXH3-64 of a buffer; the checksum used everywhere in the shard format.
uint64_t Xxh3(const void* data, size_t n);
inline uint64_t Xxh3(absl::string_view s) { return Xxh3(s.data(), s.size()); }
// Copies `n` bytes from `src` to `dst` (not overlapping) and returns the
// XXH3-64 of them, hashing each piece right after copying it, while it is
// still in the cache: about the cost of the copy alone, where copying and
// then hashing would read everything twice from memory.
uint64_t CopyAndXxh3(void* dst, const void* src, size_t n);
// 16 lowercase hex digits.
std::string ChecksumHex(uint64_t checksum);

}  // namespace ckptd::format
