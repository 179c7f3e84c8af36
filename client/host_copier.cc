#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <new>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/device_copy.h"
#include "client/host_copy.h"

namespace ckptd::client {

ParallelCopier::ParallelCopier(int threads)
    : threads_(threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))) {
  if (threads_ > 1) helpers_ = std::make_unique<base::ThreadPool>(threads_ - 1);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

void PrefaultForWrite(void* p, size_t n) {
  // Once refused (an older kernel: EINVAL), not asked again.
  static std::atomic<bool> unsupported{false};
  if (n == 0 || unsupported.load(std::memory_order_relaxed)) return;
  const uintptr_t page = 4096;
  const uintptr_t start = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) & ~(page - 1);
  if (end <= start) return;
  if (::madvise(reinterpret_cast<void*>(start), end - start, MADV_POPULATE_WRITE) != 0 && errno == EINVAL) {
    unsupported.store(true, std::memory_order_relaxed);
  }
}

void ParallelCopier::Copy(void* dst, const void* src, size_t n, bool fresh_dst) {
  // Below a few MiB a single memcpy wins: handing work out costs more.
  constexpr size_t kMinPerThread = 8u << 20;
  const size_t by_size = std::max<size_t>(1, n / kMinPerThread);
  const size_t count = std::min<size_t>(static_cast<size_t>(threads_), by_size);
  if (count <= 1 || helpers_ == nullptr) {
    if (fresh_dst) PrefaultForWrite(dst, n);
    if (n > 0) std::memcpy(dst, src, n);
    return;
  }
  // 4 KiB-aligned pieces keep each thread on whole pages.
  const size_t per = (n / count + 4095) / 4096 * 4096;
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
  base::WaitGroup done;
  for (size_t i = 1; i < count; ++i) {
    const size_t begin = std::min(n, i * per);
    const size_t end = std::min(n, begin + per);
    if (begin >= end) continue;
    done.Add();
    helpers_->Schedule([=, &done] {
      if (fresh_dst) PrefaultForWrite(d + begin, end - begin);
      std::memcpy(d + begin, s + begin, end - begin);
      done.Done();
    });
  }
  if (fresh_dst) PrefaultForWrite(d, std::min(n, per));
  std::memcpy(d, s, std::min(n, per));
  done.Wait();
}

void ParallelCopier::ForEach(size_t count, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < count; i = next++) fn(i);
  };
  const size_t helpers = helpers_ == nullptr ? 0 : std::min<size_t>(static_cast<size_t>(threads_ - 1), count);
  base::WaitGroup done;
  for (size_t h = 1; h <= helpers && h < count; ++h) {
    done.Add();
    helpers_->Schedule([&] {
      work();
      done.Done();
    });
  }
  work();
  done.Wait();
}

void* AllocateHostMemory(size_t n) {
  return ::operator new(std::max<size_t>(n, 4096), std::align_val_t{4096});
}

void FreeHostMemory(void* p) { ::operator delete(p, std::align_val_t{4096}); }

namespace {

class HostCopier final : public DeviceCopier {
 public:
  explicit HostCopier(int threads) : copier_(threads) {}

  absl::Status CopyToHost(void* dst, const void* src, size_t n, const ckptd::v1::Device& device) override {
    if (device.kind() != ckptd::v1::Device::HOST) return NotHost(device);
    copier_.Copy(dst, src, n);
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(void* dst, const void* src, size_t n, const ckptd::v1::Device& device) override {
    if (device.kind() != ckptd::v1::Device::HOST) return NotHost(device);
    // A restore's destination: a restarted trainer's state, often new.
    copier_.Copy(dst, src, n, /*fresh_dst=*/true);
    return absl::OkStatus();
  }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t n, const ckptd::v1::Device& device) override {
    if (device.kind() != ckptd::v1::Device::HOST) return NotHost(device);
    copier_.Copy(dst, src, n);
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status RegisterHostMemory(void*, size_t) override { return absl::OkStatus(); }
  absl::Status UnregisterHostMemory(void*) override { return absl::OkStatus(); }
  absl::StatusOr<void*> AllocateOnDevice(size_t n, const ckptd::v1::Device& device) override {
    if (device.kind() != ckptd::v1::Device::HOST) return NotHost(device);
    return AllocateHostMemory(n);
  }
  void FreeOnDevice(void* p, const ckptd::v1::Device&) override { FreeHostMemory(p); }

 private:
  static absl::Status NotHost(const ckptd::v1::Device& device) {
    return absl::FailedPreconditionError(
        absl::StrCat("buffer on cuda:", device.index(), " but this copier handles host memory only"));
  }
  ParallelCopier copier_;
};

}  // namespace

std::unique_ptr<DeviceCopier> NewHostCopier(int threads) { return std::make_unique<HostCopier>(threads); }

}  // namespace ckptd::client
