#pragma once

#include "absl/strings/string_view.h"
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ckptd::storage {

// XXH3-64 of a buffer; the checksum used everywhere in the shard format.
uint64_t Xxh3(const void* data, size_t n);
inline uint64_t Xxh3(absl::string_view s) { return Xxh3(s.data(), s.size()); }
// 16 lowercase hex digits.
std::string ChecksumHex(uint64_t checksum);

}  // namespace ckptd::storage
