#include "format/tensor_size.h"

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::format {
namespace {

using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;

ckptd::v1::Tensor Meta(ckptd::v1::DType dtype, std::initializer_list<uint64_t> shape) {
  ckptd::v1::Tensor t;
  t.set_dtype(dtype);
  for (uint64_t d : shape) t.add_shape(d);
  return t;
}

TEST(TensorByteLengthTest, IsTheElementSizeTimesEveryDimension) {
  EXPECT_THAT(TensorByteLength(Meta(ckptd::v1::FLOAT32, {3, 5})), IsOkAndHolds(60u));
  EXPECT_THAT(TensorByteLength(Meta(ckptd::v1::BFLOAT16, {7})), IsOkAndHolds(14u));
  EXPECT_THAT(TensorByteLength(Meta(ckptd::v1::INT64, {})), IsOkAndHolds(8u));  // a scalar
  EXPECT_THAT(TensorByteLength(Meta(ckptd::v1::BYTES, {4, 0, 9})), IsOkAndHolds(0u));
}

TEST(TensorByteLengthTest, RefusesAnUnknownDTypeAndAShapeBeyond64Bits) {
  EXPECT_THAT(TensorByteLength(Meta(ckptd::v1::DTYPE_UNSPECIFIED, {2})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown dtype 0")));
  EXPECT_THAT(TensorByteLength(Meta(ckptd::v1::FLOAT32, {uint64_t{1} << 32, uint64_t{1} << 30})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overflows 64 bits")));
  // Up to the last byte that fits.
  EXPECT_THAT(TensorByteLength(Meta(ckptd::v1::UINT8, {uint64_t{1} << 32, (uint64_t{1} << 32) - 1})),
              IsOkAndHolds((uint64_t{1} << 32) * ((uint64_t{1} << 32) - 1)));
}

}  // namespace
}  // namespace ckptd::format
