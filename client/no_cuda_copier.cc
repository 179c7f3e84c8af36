// Stands in for cuda_copier.cc when ckptd is built without the CUDA toolkit.
#include "client/device_copy.h"

namespace ckptd::client {

bool BuiltWithCuda() { return false; }

absl::StatusOr<std::unique_ptr<DeviceCopier>> NewCudaCopier(int) {
  return absl::UnimplementedError("ckptd was built without the CUDA toolkit");
}

absl::StatusOr<void*> AllocateDeviceMemory(int, size_t, uint8_t) {
  return absl::UnimplementedError("ckptd was built without the CUDA toolkit");
}

void FreeDeviceMemory(int, void*) {}

absl::StatusOr<double> TimeDeviceToPinnedCopy(int, const void*, size_t) {
  return absl::UnimplementedError("ckptd was built without the CUDA toolkit");
}

}  // namespace ckptd::client
