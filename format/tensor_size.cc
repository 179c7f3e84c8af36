#include "format/tensor_size.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ckptd::format {

size_t DTypeSize(ckptd::v1::DType dtype) {
  switch (dtype) {
    case ckptd::v1::FLOAT32:
    case ckptd::v1::INT32:
      return 4;
    case ckptd::v1::BFLOAT16:
    case ckptd::v1::FLOAT16:
    case ckptd::v1::INT16:
      return 2;
    case ckptd::v1::FLOAT64:
    case ckptd::v1::INT64:
      return 8;
    case ckptd::v1::BYTES:
    case ckptd::v1::INT8:
    case ckptd::v1::UINT8:
    case ckptd::v1::BOOL:
    case ckptd::v1::FLOAT8_E4M3:
    case ckptd::v1::FLOAT8_E5M2:
      return 1;
    default:
      return 0;
  }
}

absl::StatusOr<uint64_t> TensorByteLength(const ckptd::v1::Tensor& meta) {
  const size_t elem = DTypeSize(meta.dtype());
  if (elem == 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(meta.dtype())));
  }
  uint64_t n = elem;
  for (uint64_t d : meta.shape()) {
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / d) {
      return absl::InvalidArgumentError("shape overflows 64 bits");
    }
    n *= d;
  }
  return n;
}

}  // namespace ckptd::format
