// Fixed-size parts of the shard format (versions 1 and 2): the header block at the start of the
// file and the footer at its end. docs/format.md specifies them byte by byte.
#pragma once

#include "absl/strings/string_view.h"
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckptd::storage {

// The newest version this build writes and reads. A shard is written as
// version 1 unless it needs version 2 (a share of a replicated tensor), so
// that a reader of version 1 reads every shard that does not.
inline constexpr uint32_t kShardFormatVersion = 2;
inline constexpr uint32_t kOldestShardFormatVersion = 1;
// The first version whose index may hold shares of replicated tensors.
inline constexpr uint32_t kShardFormatVersionReplicas = 2;
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

// Writes the 64 defined header bytes of a shard of format `version` into `out`.
void EncodeShardHeader(uint8_t out[kShardHeaderBytes], uint32_t version = kShardFormatVersion);
// Checks magic, version and checksum; returns the version. `what` names the
// file in errors.
absl::StatusOr<uint32_t> DecodeShardHeader(const uint8_t in[kShardHeaderBytes], absl::string_view what);

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
