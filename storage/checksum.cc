#include "storage/checksum.h"

#include "absl/strings/string_view.h"
#include <xxhash.h>

#include "absl/strings/str_format.h"

namespace ckptd::storage {

uint64_t Xxh3(const void* data, size_t n) { return XXH3_64bits(data, n); }

std::string ChecksumHex(uint64_t checksum) { return absl::StrFormat("%016x", checksum); }

}  // namespace ckptd::storage
