#include "storage/checksum.h"

#include "absl/strings/string_view.h"
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#include "absl/strings/str_format.h"

namespace ckptd::storage {

uint64_t Xxh3(const void* data, size_t n) { return XXH3_64bits(data, n); }

uint64_t CopyAndXxh3(void* dst, const void* src, size_t n) {
  // Well inside a core's L1/L2 caches.
  constexpr size_t kPiece = 64 << 10;
  if (n <= kPiece) {
    if (n > 0) std::memcpy(dst, src, n);
    return XXH3_64bits(dst, n);
  }
  // Only the library knows the state's layout.
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  if (state == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(state.get());
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t off = 0; off < n; off += kPiece) {
    const size_t len = std::min(kPiece, n - off);
    std::memcpy(d + off, s + off, len);
    XXH3_64bits_update(state.get(), d + off, len);
  }
  return XXH3_64bits_digest(state.get());
}

std::string ChecksumHex(uint64_t checksum) { return absl::StrFormat("%016x", checksum); }

}  // namespace ckptd::storage
