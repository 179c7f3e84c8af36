// Sizes of the tensors a shard holds, which the trainer library computes too.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "ckptd/v1/shard.pb.h"

namespace ckptd::format {

// Bytes per element of `dtype` (1 for BYTES, BOOL, INT8, ...); 0 for unknown values.
size_t DTypeSize(ckptd::v1::DType dtype);

// Bytes of a tensor with `meta`'s dtype and shape (an empty shape is one
// element). kInvalidArgument on an unknown dtype or overflow.
absl::StatusOr<uint64_t> TensorByteLength(const ckptd::v1::Tensor& meta);

}  // namespace ckptd::format
