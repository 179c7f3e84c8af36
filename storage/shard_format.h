// Fixed-size parts of shard format v1: the header block at the start of the
// file and the footer at its end. docs/format.md specifies them byte by byte.
#pragma once

#include "absl/strings/string_view.h"
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckptd::storage {

inline constexpr uint32_t kShardFormatVersion = 1;
// Every chunk, the index and the file length are multiples of this.
inline constexpr uint32_t kShardAlignment = 4096;
// The header occupies the first block; its first kShardHeaderBytes are defined.
inline constexpr size_t kShardHeaderBlock = kShardAlignment;
inline constexpr size_t kShardHeaderBytes = 64;
inline constexpr size_t kShardFooterBytes = 64;
inline constexpr absl::string_view kShardMagic = "CKPTSHRD";
inline constexpr absl::string_view kShardFooterMagic = "CKPTFOOT";
// Upper bounds a reader enforces before allocating.
inline constexpr uint64_t kMaxIndexBytes = 1ull << 30;
inline constexpr uint64_t kMaxBlockBytes = 256ull << 20;

struct ShardFooter {
  uint32_t format_version = kShardFormatVersion;
  uint32_t flags = 0;
  uint64_t index_offset = 0;
  uint64_t index_length = 0;
  uint64_t index_xxh3 = 0;
  uint64_t file_length = 0;
};

// Writes the 64 defined header bytes into `out`.
void EncodeShardHeader(uint8_t out[kShardHeaderBytes]);
// Checks magic, version and checksum. `what` names the file in errors.
absl::Status DecodeShardHeader(const uint8_t in[kShardHeaderBytes], absl::string_view what);

void EncodeShardFooter(const ShardFooter& footer, uint8_t out[kShardFooterBytes]);
// Checks magic, version, checksum, and that every offset and length fits a
// file of `actual_file_length` bytes. Errors are kDataLoss (kUnimplemented
// for a newer format version) and name `what`.
absl::StatusOr<ShardFooter> DecodeShardFooter(const uint8_t in[kShardFooterBytes],
                                              uint64_t actual_file_length, absl::string_view what);

// Little-endian fixed-width encoding.
void PutFixed32(uint8_t* p, uint32_t v);
void PutFixed64(uint8_t* p, uint64_t v);
uint32_t GetFixed32(const uint8_t* p);
uint64_t GetFixed64(const uint8_t* p);

}  // namespace ckptd::storage
