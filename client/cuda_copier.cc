// The CUDA copier: cudaMemcpyAsync on one non-blocking stream per device.
// Built only when the CUDA toolkit is found (CKPTD_HAVE_CUDA).
#include <cuda_runtime_api.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "client/device_copy.h"
#include "client/host_copy.h"

namespace ckptd::client {
namespace {

// The one place where cudaError_t becomes a Status.
absl::Status CudaStatus(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
  switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
      return absl::FailedPreconditionError(message);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidValue:
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorHostMemoryNotRegistered:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

// Switches the calling thread's current device for a scope and restores the
// caller's afterwards: the trainer's own device choice is never disturbed.
// A thread already on `device` is left alone: switching back would create
// a context on the previous device (cudaSetDevice does, since CUDA 12), and
// a thread that never chose one is "on" device 0. The client's own threads
// choose theirs first (UseDeviceOnThisThread), so they never touch a device
// that holds none of the trainer's buffers.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ == device) {
      previous_ = -1;  // nothing to switch, nothing to restore
      return;
    }
    status_ = CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
  }
  ~ScopedDevice() {
    // Restoring is best effort; the copy's own status is what is reported.
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

class CudaCopier final : public DeviceCopier {
 public:
  CudaCopier(int device_count, int host_threads)
      : host_copier_(host_threads), streams_(device_count, nullptr),
        used_(device_count, false) {}

  ~CudaCopier() override {
    // Errors while tearing down are not actionable.
    (void)Synchronize();
    for (size_t d = 0; d < streams_.size(); ++d) {
      if (streams_[d] == nullptr) continue;
      ScopedDevice scope(static_cast<int>(d));
      (void)cudaStreamDestroy(streams_[d]);
    }
  }

  absl::Status CopyToHost(void* dst, const void* src, size_t n, const ckptd::v1::Device& device) override {
    return Copy(dst, src, n, device, cudaMemcpyDeviceToHost);
  }
  absl::Status CopyFromHost(void* dst, const void* src, size_t n, const ckptd::v1::Device& device) override {
    return Copy(dst, src, n, device, cudaMemcpyHostToDevice);
  }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t n, const ckptd::v1::Device& device) override {
    return Copy(dst, src, n, device, cudaMemcpyDeviceToDevice);
  }

  absl::Status Synchronize() override {
    absl::Status first;
    for (size_t d = 0; d < streams_.size(); ++d) {
      if (!used_[d]) continue;
      used_[d] = false;
      ScopedDevice scope(static_cast<int>(d));
      absl::Status s = scope.status().ok()
                           ? CudaStatus(cudaStreamSynchronize(streams_[d]), absl::StrCat("copy on cuda:", d))
                           : scope.status();
      if (first.ok()) first = s;
    }
    return first;
  }

  absl::Status UseDeviceOnThisThread(const ckptd::v1::Device& device) override {
    if (device.kind() == ckptd::v1::Device::HOST) return absl::OkStatus();
    CKPTD_RETURN_IF_ERROR(CheckDevice(device.index()));
    return CudaStatus(cudaSetDevice(device.index()), absl::StrCat("cudaSetDevice(", device.index(), ")"));
  }

  absl::Status RegisterHostMemory(void* p, size_t n) override {
    return CudaStatus(cudaHostRegister(p, n, cudaHostRegisterPortable),
                      absl::StrCat("cudaHostRegister of ", n, " bytes"));
  }
  absl::Status UnregisterHostMemory(void* p) override {
    return CudaStatus(cudaHostUnregister(p), "cudaHostUnregister");
  }

  absl::StatusOr<void*> AllocateOnDevice(size_t n, const ckptd::v1::Device& device) override {
    if (device.kind() == ckptd::v1::Device::HOST) return AllocateHostMemory(n);
    CKPTD_RETURN_IF_ERROR(CheckDevice(device.index()));
    ScopedDevice scope(device.index());
    CKPTD_RETURN_IF_ERROR(scope.status());
    void* p = nullptr;
    CKPTD_RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&p, n), absl::StrCat("cudaMalloc of ", n, " bytes on cuda:", device.index())));
    return p;
  }
  void FreeOnDevice(void* p, const ckptd::v1::Device& device) override {
    if (device.kind() == ckptd::v1::Device::HOST) {
      FreeHostMemory(p);
      return;
    }
    ScopedDevice scope(device.index());
    (void)cudaFree(p);  // freeing is not actionable
  }

 private:
  absl::Status CheckDevice(int d) const {
    if (d < 0 || d >= static_cast<int>(streams_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("buffer on cuda:", d, " but this process sees ", streams_.size(), " CUDA devices"));
    }
    return absl::OkStatus();
  }

  absl::Status Copy(void* dst, const void* src, size_t n, const ckptd::v1::Device& device, cudaMemcpyKind kind) {
    if (device.kind() == ckptd::v1::Device::HOST) {
      host_copier_.Copy(dst, src, n);
      return absl::OkStatus();
    }
    const int d = device.index();
    CKPTD_RETURN_IF_ERROR(CheckDevice(d));
    ScopedDevice scope(d);
    CKPTD_RETURN_IF_ERROR(scope.status());
    if (streams_[d] == nullptr) {
      CKPTD_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&streams_[d], cudaStreamNonBlocking),
                                       absl::StrCat("creating the copy stream on cuda:", d)));
    }
    used_[d] = true;
    return CudaStatus(cudaMemcpyAsync(dst, src, n, kind, streams_[d]),
                      absl::StrCat("cudaMemcpyAsync of ", n, " bytes on cuda:", d));
  }

  ParallelCopier host_copier_;
  std::vector<cudaStream_t> streams_;
  std::vector<bool> used_;
};

}  // namespace

bool BuiltWithCuda() { return true; }

absl::StatusOr<std::unique_ptr<DeviceCopier>> NewCudaCopier(int host_threads) {
  int count = 0;
  CKPTD_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (count == 0) return absl::FailedPreconditionError("cudaGetDeviceCount: no CUDA device");
  return std::unique_ptr<DeviceCopier>(std::make_unique<CudaCopier>(count, host_threads));
}

absl::StatusOr<void*> AllocateDeviceMemory(int device, size_t n, uint8_t pattern) {
  ScopedDevice scope(device);
  CKPTD_RETURN_IF_ERROR(scope.status());
  void* p = nullptr;
  CKPTD_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, n), absl::StrCat("cudaMalloc of ", n, " bytes")));
  if (absl::Status s = CudaStatus(cudaMemset(p, pattern, n), "cudaMemset"); !s.ok()) {
    (void)cudaFree(p);
    return s;
  }
  return p;
}

void FreeDeviceMemory(int device, void* p) {
  ScopedDevice scope(device);
  (void)cudaFree(p);  // freeing is not actionable
}

absl::StatusOr<double> TimeDeviceToPinnedCopy(int device, const void* src, size_t n) {
  ScopedDevice scope(device);
  CKPTD_RETURN_IF_ERROR(scope.status());
  void* host = nullptr;
  CKPTD_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&host, n), absl::StrCat("cudaMallocHost of ", n, " bytes")));
  // Touch once so that the timed copy measures the transfer alone.
  absl::Status s = CudaStatus(cudaMemcpy(host, src, n, cudaMemcpyDeviceToHost), "cudaMemcpy");
  double seconds = 0;
  if (s.ok()) {
    const absl::Time t0 = absl::Now();
    s = CudaStatus(cudaMemcpy(host, src, n, cudaMemcpyDeviceToHost), "cudaMemcpy");
    seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  }
  (void)cudaFreeHost(host);
  CKPTD_RETURN_IF_ERROR(s);
  return seconds;
}

}  // namespace ckptd::client
