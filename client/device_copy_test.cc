#include "client/device_copy.h"
#include "client/host_copy.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <vector>

#include "base/aligned_buffer.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#if defined(CKPTD_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace ckptd::client {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;

ckptd::v1::Device Host() { return ckptd::v1::Device(); }
ckptd::v1::Device Cuda(int index) {
  ckptd::v1::Device d;
  d.set_kind(ckptd::v1::Device::CUDA);
  d.set_index(index);
  return d;
}

void Fill(uint8_t* p, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = static_cast<uint8_t>(x);
  }
}

TEST(HostCopierTest, CopiesSmallAndLargeBuffersBothWays) {
  std::unique_ptr<DeviceCopier> copier = NewHostCopier(4);
  for (size_t n : {size_t{0}, size_t{1}, size_t{4097}, size_t{40} << 20}) {
    base::AlignedBuffer src(n + 1), staging(n + 1), back(n + 1);
    Fill(src.data(), n, static_cast<uint32_t>(n));
    CKPTD_ASSERT_OK(copier->CopyToHost(staging.data(), src.data(), n, Host()));
    CKPTD_ASSERT_OK(copier->Synchronize());
    ASSERT_EQ(std::memcmp(staging.data(), src.data(), n), 0) << n;
    CKPTD_ASSERT_OK(copier->CopyFromHost(back.data(), staging.data(), n, Host()));
    CKPTD_ASSERT_OK(copier->Synchronize());
    ASSERT_EQ(std::memcmp(back.data(), src.data(), n), 0) << n;
  }
}

// Pages of [p, p + n) in memory (mincore), of those wholly inside.
size_t ResidentPages(const void* p, size_t n) {
  const uintptr_t start = (reinterpret_cast<uintptr_t>(p) + 4095) & ~uintptr_t{4095};
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) & ~uintptr_t{4095};
  if (end <= start) return 0;
  std::vector<unsigned char> in((end - start) / 4096);
  if (::mincore(reinterpret_cast<void*>(start), end - start, in.data()) != 0) return 0;
  size_t resident = 0;
  for (unsigned char c : in) resident += c & 1;
  return resident;
}

TEST(HostCopierTest, PrefaultForWriteMapsFreshPagesAndChangesNoByte) {
  constexpr size_t kBytes = 8u << 20;
  void* fresh = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(fresh, MAP_FAILED);
  EXPECT_EQ(ResidentPages(fresh, kBytes), 0u);
  // Not page-aligned at either end: the whole pages inside are mapped.
  auto* bytes = static_cast<uint8_t*>(fresh);
  PrefaultForWrite(bytes + 100, kBytes - 200);
  const size_t resident = ResidentPages(fresh, kBytes);
  // Kernels before 5.14 lack MADV_POPULATE_WRITE: nothing mapped, no harm.
  EXPECT_TRUE(resident == 0 || resident >= kBytes / 4096 - 2) << resident;
  EXPECT_EQ(std::count(bytes, bytes + kBytes, 0), static_cast<std::ptrdiff_t>(kBytes));
  // Memory that holds data keeps it.
  Fill(bytes, kBytes, 7);
  std::vector<uint8_t> before(bytes, bytes + kBytes);
  PrefaultForWrite(bytes, kBytes);
  PrefaultForWrite(bytes, 0);
  EXPECT_EQ(std::memcmp(bytes, before.data(), kBytes), 0);
  // A restore's copy into fresh memory is exact.
  std::unique_ptr<DeviceCopier> copier = NewHostCopier(3);
  void* dst = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(dst, MAP_FAILED);
  CKPTD_ASSERT_OK(copier->CopyFromHost(static_cast<uint8_t*>(dst) + 1, bytes, kBytes - 1, Host()));
  EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(dst) + 1, bytes, kBytes - 1), 0);
  ::munmap(dst, kBytes);
  ::munmap(fresh, kBytes);
}

TEST(HostCopierTest, DeviceBuffersAreRefused) {
  std::unique_ptr<DeviceCopier> copier = NewHostCopier(1);
  uint8_t a = 0, b = 0;
  EXPECT_THAT(copier->CopyToHost(&a, &b, 1, Cuda(0)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cuda:0")));
  EXPECT_THAT(copier->RegisterHostMemory(&a, 1), IsOk());
}

TEST(HostCopierTest, HostDeviceMemoryIsOrdinaryMemoryAndCudaIsRefused) {
  std::unique_ptr<DeviceCopier> copier = NewHostCopier(2);
  constexpr size_t kBytes = 10000;
  std::vector<uint8_t> src(kBytes), back(kBytes);
  Fill(src.data(), kBytes, 3);
  CKPTD_ASSERT_OK_AND_ASSIGN(void* spare, copier->AllocateOnDevice(kBytes, Host()));
  ASSERT_NE(spare, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(spare) % 4096, 0u);
  CKPTD_ASSERT_OK(copier->CopyOnDevice(spare, src.data(), kBytes, Host()));
  CKPTD_ASSERT_OK(copier->CopyToHost(back.data(), spare, kBytes, Host()));
  CKPTD_ASSERT_OK(copier->Synchronize());
  EXPECT_EQ(back, src);
  copier->FreeOnDevice(spare, Host());

  EXPECT_THAT(copier->AllocateOnDevice(kBytes, Cuda(1)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cuda:1")));
  EXPECT_THAT(copier->CopyOnDevice(back.data(), src.data(), kBytes, Cuda(0)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cuda:0")));
}

// Without the toolkit the CUDA copier says so; without a device, it says that.
TEST(CudaCopierTest, ReportsWhyItIsUnavailable) {
  absl::StatusOr<std::unique_ptr<DeviceCopier>> copier = NewCudaCopier();
  if (!BuiltWithCuda()) {
    EXPECT_THAT(copier, StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("without the CUDA toolkit")));
  } else if (!copier.ok()) {
    EXPECT_THAT(copier, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cuda")));
  }
}

#if defined(CKPTD_HAVE_CUDA)

// The checks below need a GPU; tests/gpu/run.sh runs them on a machine with one.
class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<DeviceCopier>> copier = NewCudaCopier(4);
    if (!copier.ok()) GTEST_SKIP() << "no usable CUDA device: " << copier.status();
    copier_ = *std::move(copier);
  }
  std::unique_ptr<DeviceCopier> copier_;
};

double Seconds(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

TEST_F(CudaDeviceTest, DeviceToPinnedStagingAndBackIsExact) {
  constexpr size_t kBytes = size_t{512} << 20;
  base::AlignedBuffer src(kBytes), staging(kBytes), back(kBytes);
  Fill(src.data(), kBytes, 7);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, src.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);

  // Pageable staging first, then the same memory page-locked.
  auto t0 = std::chrono::steady_clock::now();
  CKPTD_ASSERT_OK(copier_->CopyToHost(staging.data(), dev, kBytes, Cuda(0)));
  CKPTD_ASSERT_OK(copier_->Synchronize());
  const double pageable_s = Seconds(t0);
  ASSERT_EQ(std::memcmp(staging.data(), src.data(), kBytes), 0);

  CKPTD_ASSERT_OK(copier_->RegisterHostMemory(staging.data(), kBytes));
  std::memset(staging.data(), 0, kBytes);
  t0 = std::chrono::steady_clock::now();
  CKPTD_ASSERT_OK(copier_->CopyToHost(staging.data(), dev, kBytes, Cuda(0)));
  const double enqueue_s = Seconds(t0);
  CKPTD_ASSERT_OK(copier_->Synchronize());
  const double pinned_s = Seconds(t0);
  ASSERT_EQ(std::memcmp(staging.data(), src.data(), kBytes), 0);

  // Back to the device (restore direction), then check it there.
  ASSERT_EQ(cudaMemset(dev, 0, kBytes), cudaSuccess);
  t0 = std::chrono::steady_clock::now();
  CKPTD_ASSERT_OK(copier_->CopyFromHost(dev, staging.data(), kBytes, Cuda(0)));
  CKPTD_ASSERT_OK(copier_->Synchronize());
  const double restore_s = Seconds(t0);
  ASSERT_EQ(cudaMemcpy(back.data(), dev, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(back.data(), src.data(), kBytes), 0);

  CKPTD_EXPECT_OK(copier_->UnregisterHostMemory(staging.data()));
  ASSERT_EQ(cudaFree(dev), cudaSuccess);
  const double gb = kBytes / 1e9;
  std::cout << "cuda copy 512 MiB: device->pageable " << gb / pageable_s << " GB/s, device->pinned "
            << gb / pinned_s << " GB/s (enqueue " << enqueue_s * 1e6 << " us), pinned->device "
            << gb / restore_s << " GB/s\n";
}

// The two hops of a snapshot with a spare device buffer: device to device
// (the stall), then spare to page-locked staging; exact, and how long each is.
TEST_F(CudaDeviceTest, SpareDeviceBufferTwoHopsAreExact) {
  constexpr size_t kBytes = size_t{512} << 20;
  base::AlignedBuffer src(kBytes), staging(kBytes);
  Fill(src.data(), kBytes, 11);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, src.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  CKPTD_ASSERT_OK_AND_ASSIGN(void* spare, copier_->AllocateOnDevice(kBytes, Cuda(0)));
  CKPTD_ASSERT_OK(copier_->RegisterHostMemory(staging.data(), kBytes));

  auto t0 = std::chrono::steady_clock::now();
  CKPTD_ASSERT_OK(copier_->CopyOnDevice(spare, dev, kBytes, Cuda(0)));
  CKPTD_ASSERT_OK(copier_->Synchronize());
  const double d2d_s = Seconds(t0);
  // The trainer's buffer changes right after the first hop: the spare keeps the snapshot.
  ASSERT_EQ(cudaMemset(dev, 0, kBytes), cudaSuccess);
  t0 = std::chrono::steady_clock::now();
  CKPTD_ASSERT_OK(copier_->CopyToHost(staging.data(), spare, kBytes, Cuda(0)));
  CKPTD_ASSERT_OK(copier_->Synchronize());
  const double d2h_s = Seconds(t0);
  EXPECT_EQ(std::memcmp(staging.data(), src.data(), kBytes), 0);

  CKPTD_EXPECT_OK(copier_->UnregisterHostMemory(staging.data()));
  copier_->FreeOnDevice(spare, Cuda(0));
  ASSERT_EQ(cudaFree(dev), cudaSuccess);
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_THAT(copier_->AllocateOnDevice(4096, Cuda(count)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("CUDA devices")));
  const double gb = kBytes / 1e9;
  std::cout << "cuda spare 512 MiB: device->device (stall) " << d2d_s * 1e3 << " ms, " << gb / d2d_s
            << " GB/s; spare->pinned " << d2h_s * 1e3 << " ms, " << gb / d2h_s << " GB/s\n";
}

TEST_F(CudaDeviceTest, KeepsTheCallersCurrentDevice) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  const int mine = count - 1;
  ASSERT_EQ(cudaSetDevice(mine), cudaSuccess);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 4096), cudaSuccess);
  std::vector<uint8_t> host(4096, 1);
  CKPTD_ASSERT_OK(copier_->CopyFromHost(dev, host.data(), host.size(), Cuda(mine)));
  CKPTD_ASSERT_OK(copier_->CopyToHost(host.data(), dev, host.size(), Cuda(0 == mine ? 0 : mine)));
  CKPTD_ASSERT_OK(copier_->Synchronize());
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, mine);
  ASSERT_EQ(cudaFree(dev), cudaSuccess);
}

TEST_F(CudaDeviceTest, UnknownDeviceAndBadPointersAreErrors) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  uint8_t a = 0;
  EXPECT_THAT(copier_->CopyToHost(&a, &a, 1, Cuda(count)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("CUDA devices")));
  EXPECT_THAT(copier_->UnregisterHostMemory(&a), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cudaHostUnregister")));
}

#endif  // CKPTD_HAVE_CUDA

}  // namespace
}  // namespace ckptd::client
