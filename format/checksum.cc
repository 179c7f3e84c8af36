#include "format/checksum.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_format.h"

// xxHash compiled into this file (its functions static): nothing that links
// ckptd::format needs libxxhash.so, and the state's layout is known here.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace ckptd::format {

uint64_t Xxh3(const void* data, size_t n) { return XXH3_64bits(data, n); }

uint64_t CopyAndXxh3(void* dst, const void* src, size_t n) {
  // Well inside a core's L1/L2 caches.
  constexpr size_t kPiece = 64 << 10;
  if (n <= kPiece) {
    if (n > 0) std::memcpy(dst, src, n);
    return XXH3_64bits(dst, n);
  }
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t off = 0; off < n; off += kPiece) {
    const size_t len = std::min(kPiece, n - off);
    std::memcpy(d + off, s + off, len);
    XXH3_64bits_update(&state, d + off, len);
  }
  return XXH3_64bits_digest(&state);
}

std::string ChecksumHex(uint64_t checksum) { return absl::StrFormat("%016x", checksum); }

}  // namespace ckptd::format
