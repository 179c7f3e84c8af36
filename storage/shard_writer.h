// Writes one rank's shard file: blocks are encoded on a thread pool while
// earlier blocks are written (several writes in flight), then the index and
// footer; the file is fsynced under a temp name, renamed into place, and its
// directory fsynced. Nothing is left behind on failure.
#pragma once

#include "absl/strings/string_view.h"
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ckptd/v1/shard.pb.h"
#include "storage/codec.h"
#include "storage/file_system.h"

namespace ckptd::base {
class ThreadPool;
}  // namespace ckptd::base

namespace ckptd::storage {

// One buffer to store. `meta` carries name, component, dtype, shape, sharding
// and device; the writer fills raw_length and blocks.
struct TensorSource {
  ckptd::v1::Tensor meta;
  const void* data = nullptr;
  size_t length = 0;
};

struct ShardIdentity {
  std::string job;
  uint64_t step = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
};

struct ShardWriteOptions {
  EncodeOptions encode;
  // Raw bytes per block, the unit of compression and of one write.
  size_t block_bytes = 4u << 20;
  // Encoder threads when no pool is passed; <= 0: one per hardware thread.
  int threads = 0;
  // Writes kept in flight.
  int writes_in_flight = 8;
  bool direct_io = true;
};

struct ShardWriteResult {
  std::string path;
  uint64_t file_length = 0;
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;
  uint64_t index_xxh3 = 0;
  // The index as written (each block's raw_xxh3 checks a copy of the
  // tensors kept in memory).
  std::shared_ptr<const ckptd::v1::ShardIndex> index;
};

// Validates the tensors (names unique and non-empty, dtype known, length a
// whole number of elements matching the shape) before touching the disk.
absl::Status ValidateTensorSources(absl::Span<const TensorSource> tensors);

// Writes `tensors` to `path` (through `path` + ".tmp"). `pool` may be null.
absl::StatusOr<ShardWriteResult> WriteShard(FileSystem* fs, const std::string& path,
                                            const ShardIdentity& identity,
                                            absl::Span<const TensorSource> tensors,
                                            const ShardWriteOptions& options, base::ThreadPool* pool = nullptr);

}  // namespace ckptd::storage
