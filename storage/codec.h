// Block encoding for shard files: an optional byte-plane filter for float
// dtypes, then each piece (a plane, or the whole block) stored as one standard
// zstd frame or as raw bytes when compression does not pay.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/v1/shard.pb.h"

namespace ckptd::storage {

// True for the 2- and 4-byte float dtypes that get the byte-plane filter.
bool UsesBytePlanes(ckptd::v1::DType dtype);

struct EncodeOptions {
  bool compress = true;       // false: every chunk RAW, no filter
  int zstd_level = 1;         // for unfiltered blocks
  // A compressed chunk is kept only when it saves at least this fraction.
  double min_saving = 0.02;
};

struct EncodedChunk {
  uint64_t buffer_offset = 0;  // where the stored bytes start in the output buffer (aligned)
  uint64_t stored_length = 0;
  uint64_t raw_length = 0;
  ckptd::v1::Codec codec = ckptd::v1::RAW;
  uint64_t stored_xxh3 = 0;
};

struct EncodedBlock {
  ckptd::v1::Filter filter = ckptd::v1::FILTER_NONE;
  uint32_t element_size = 0;
  std::vector<EncodedChunk> chunks;
  uint64_t raw_xxh3 = 0;
  // Bytes of the output buffer used, a multiple of the alignment; padding is zero.
  uint64_t encoded_length = 0;
};

// Holds compression contexts and scratch memory; one per thread.
class BlockEncoder {
 public:
  explicit BlockEncoder(const EncodeOptions& options);
  ~BlockEncoder();
  BlockEncoder(const BlockEncoder&) = delete;
  BlockEncoder& operator=(const BlockEncoder&) = delete;

  // The output capacity Encode needs for a block of `raw_length` bytes.
  static size_t MaxEncodedLength(size_t raw_length, size_t alignment);

  // Encodes `raw` (a whole number of elements of `dtype`) into `out`, chunk by
  // chunk, each starting at a multiple of `alignment`.
  absl::StatusOr<EncodedBlock> Encode(ckptd::v1::DType dtype, const uint8_t* raw, size_t raw_length,
                                      uint8_t* out, size_t out_capacity, size_t alignment);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Holds decompression contexts and scratch memory; one per thread.
class BlockDecoder {
 public:
  BlockDecoder();
  ~BlockDecoder();
  BlockDecoder(const BlockDecoder&) = delete;
  BlockDecoder& operator=(const BlockDecoder&) = delete;

  // Checks that `block` is well-formed (filter, element size, chunk count and
  // lengths agree), without reading data. kDataLoss naming what disagrees.
  static absl::Status Validate(const ckptd::v1::Block& block);

  // Decodes `block` into `dest` (block.raw_length() bytes). chunk_data[i]
  // points at the stored bytes of block.chunks(i). Verifies every chunk's
  // stored checksum, the frame, and the block's raw checksum. Errors are
  // kDataLoss and start with "chunk <i>: " when a chunk is at fault.
  absl::Status Decode(const ckptd::v1::Block& block, const uint8_t* const* chunk_data, uint8_t* dest);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The byte-plane transform, exposed for tests and benchmarks. `planes` holds
// element_size planes of n elements each, plane p = byte p of every element.
void SplitBytePlanes(const uint8_t* src, size_t n_elements, size_t element_size, uint8_t* planes);
void JoinBytePlanes(const uint8_t* planes, size_t n_elements, size_t element_size, uint8_t* dst);

}  // namespace ckptd::storage
