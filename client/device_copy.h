// Copies between a trainer's buffers (host memory or a CUDA device) and host
// staging memory. The host implementation is what tests use everywhere; the
// CUDA one is built when the CUDA toolkit is found.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/v1/shard.pb.h"

namespace ckptd::client {

class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;

  // Queues copying `n` bytes from `src` (memory of `device`) to host memory
  // `dst`. `dst` stays in use until Synchronize() returns.
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t n, const ckptd::v1::Device& device) = 0;
  // Queues copying `n` bytes from host memory `src` to `dst` on `device`.
  virtual absl::Status CopyFromHost(void* dst, const void* src, size_t n, const ckptd::v1::Device& device) = 0;
  // Queues copying `n` bytes from `src` to `dst`, both memory of `device`
  // (device to device, on the same stream as the other copies).
  virtual absl::Status CopyOnDevice(void* dst, const void* src, size_t n, const ckptd::v1::Device& device) = 0;
  // Waits for every queued copy; returns the first error of any of them.
  virtual absl::Status Synchronize() = 0;

  // Makes `device` the current one of the calling thread, a thread of
  // ckptd's own, before its first call: page-locking and copies from it then
  // use that device's context and never create one on another device (a
  // thread that chose none is on device 0). No-op on host.
  virtual absl::Status UseDeviceOnThisThread(const ckptd::v1::Device& device) { return absl::OkStatus(); }

  // Makes host memory page-locked for the device runtime, so that device
  // copies into it run as DMA without an intermediate buffer. No-op on host.
  // The client calls these from its locking thread too, while another
  // thread copies: they must be safe beside the other calls.
  virtual absl::Status RegisterHostMemory(void* p, size_t n) = 0;
  virtual absl::Status UnregisterHostMemory(void* p) = 0;

  // `n` bytes (n > 0) of memory on `device`, e.g. a spare copy of a buffer;
  // kResourceExhausted when the device has no room. FreeOnDevice takes back
  // what AllocateOnDevice returned, for the same device.
  virtual absl::StatusOr<void*> AllocateOnDevice(size_t n, const ckptd::v1::Device& device) = 0;
  virtual void FreeOnDevice(void* p, const ckptd::v1::Device& device) = 0;
};

// memcpy for host buffers, split over `threads` threads for large copies
// (<= 0: one per hardware thread); "device" memory on the host device is
// ordinary host memory. Device buffers are kFailedPrecondition.
std::unique_ptr<DeviceCopier> NewHostCopier(int threads = 0);

// Host buffers as NewHostCopier; CUDA buffers with cudaMemcpyAsync on a
// dedicated non-blocking stream per device (device-to-device copies too), and
// device memory from cudaMalloc. kUnimplemented when ckptd was
// built without the CUDA toolkit, kFailedPrecondition when no CUDA device or
// driver is usable.
absl::StatusOr<std::unique_ptr<DeviceCopier>> NewCudaCopier(int host_threads = 0);

// True when this build includes the CUDA copier.
bool BuiltWithCuda();

// For benchmarks and GPU checks: device memory filled with a byte pattern,
// and the time of one plain cudaMemcpy of `n` bytes from it into page-locked
// host memory (the yardstick for a snapshot's stall). kUnimplemented without
// CUDA, kFailedPrecondition without a device.
absl::StatusOr<void*> AllocateDeviceMemory(int device, size_t n, uint8_t pattern);
void FreeDeviceMemory(int device, void* p);
absl::StatusOr<double> TimeDeviceToPinnedCopy(int device, const void* src, size_t n);

}  // namespace ckptd::client
