// Checks on a shard index that a reader makes before trusting any of it.
#pragma once

#include "absl/strings/string_view.h"
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/v1/shard.pb.h"

namespace ckptd::storage {

// True when `s` is well-formed UTF-8 (no overlong forms or surrogates).
bool IsValidUtf8(absl::string_view s);

// Checks name (1..4096 bytes of UTF-8), component, dtype, that shape, global_shape and offsets
// agree, and a replica: its group (storage/replica.h) and, once it holds
// checksums, the whole share. `what` prefixes errors. kInvalidArgument.
absl::Status ValidateTensorMeta(const ckptd::v1::Tensor& meta, absl::string_view what);

// Checks a whole index read from a file of format `version` whose chunk area
// ends at `index_offset`: version (the file's; shares of replicated tensors
// from version 2 on), alignment, tensor metadata, names unique, blocks
// covering each tensor in order, every block well-formed, every chunk inside
// the chunk area, aligned and within its block's span, totals consistent.
// Errors are kDataLoss and name the tensor, block and chunk.
absl::Status ValidateShardIndex(const ckptd::v1::ShardIndex& index, uint64_t index_offset, uint32_t version,
                                absl::string_view what);

// [first chunk offset, aligned end of last chunk) of a validated block.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};
ByteRange BlockFileRange(const ckptd::v1::Block& block);

absl::string_view ComponentName(ckptd::v1::Component c);
absl::string_view DTypeName(ckptd::v1::DType d);

}  // namespace ckptd::storage
