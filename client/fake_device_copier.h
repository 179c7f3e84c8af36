// For tests: a DeviceCopier whose "device" memory is ordinary host memory, so
// that the device paths of the client (two-hop snapshots, restores into
// device buffers) and of the benchmarks run without a GPU.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/device_copy.h"
#include "client/host_copy.h"

namespace ckptd::client {

// Logs every copy ("d2d <bytes>", "d2h", "h2d", "host" for host buffers,
// "sync"), counts page-locking, can hold device-to-host copies and
// page-locking at gates, fail the next device-to-host copy, and fail an
// allocation. Thread-safe.
class FakeDeviceCopier final : public DeviceCopier {
 public:
  absl::Status CopyToHost(void* dst, const void* src, size_t n, const ckptd::v1::Device& device) override {
    if (device.kind() == ckptd::v1::Device::HOST) return Copy("host", dst, src, n);
    NoteThread();
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(&open_));
    if (!fail_next_d2h_.ok()) return std::exchange(fail_next_d2h_, absl::OkStatus());
    if (n > 0) std::memcpy(dst, src, n);
    log_.push_back(absl::StrCat("d2h ", n));
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(void* dst, const void* src, size_t n, const ckptd::v1::Device& device) override {
    if (device.kind() != ckptd::v1::Device::HOST) {
      NoteThread();
      absl::MutexLock l(&mu_);
      if (lock_waiting_ > 0) ++copies_while_locking_;
    }
    return Copy(device.kind() == ckptd::v1::Device::HOST ? "host" : "h2d", dst, src, n);
  }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t n, const ckptd::v1::Device& device) override {
    if (device.kind() != ckptd::v1::Device::HOST) NoteThread();
    return Copy(device.kind() == ckptd::v1::Device::HOST ? "host" : "d2d", dst, src, n);
  }
  absl::Status Synchronize() override {
    absl::MutexLock l(&mu_);
    log_.push_back("sync");
    return absl::OkStatus();
  }
  absl::Status UseDeviceOnThisThread(const ckptd::v1::Device& device) override {
    if (device.kind() != ckptd::v1::Device::HOST) chose_device_ = true;
    return absl::OkStatus();
  }
  absl::Status RegisterHostMemory(void*, size_t) override {
    NoteThread();
    absl::MutexLock l(&mu_);
    ++lock_waiting_;
    // Bounded: a caller that should not have been held fails its test
    // instead of hanging it.
    mu_.AwaitWithTimeout(absl::Condition(&lock_open_), absl::Seconds(30));
    --lock_waiting_;
    ++locks_;
    ++locked_;
    return absl::OkStatus();
  }
  absl::Status UnregisterHostMemory(void*) override {
    absl::MutexLock l(&mu_);
    --locked_;
    return absl::OkStatus();
  }
  absl::StatusOr<void*> AllocateOnDevice(size_t n, const ckptd::v1::Device& device) override {
    if (device.kind() == ckptd::v1::Device::HOST) return AllocateHostMemory(n);
    absl::MutexLock l(&mu_);
    if (allocations_left_ == 0) return absl::ResourceExhaustedError("fake device is full");
    --allocations_left_;
    ++allocated_;
    ++live_;
    return static_cast<void*>(new uint8_t[n]);
  }
  void FreeOnDevice(void* p, const ckptd::v1::Device& device) override {
    if (device.kind() == ckptd::v1::Device::HOST) {
      FreeHostMemory(p);
      return;
    }
    absl::MutexLock l(&mu_);
    --live_;
    delete[] static_cast<uint8_t*>(p);
  }

  void CloseGate() {
    absl::MutexLock l(&mu_);
    open_ = false;
  }
  void OpenGate() {
    absl::MutexLock l(&mu_);
    open_ = true;
  }
  // Holds page-locking (RegisterHostMemory) until opened, for up to 30 s.
  void CloseLockGate() {
    absl::MutexLock l(&mu_);
    lock_open_ = false;
  }
  void OpenLockGate() {
    absl::MutexLock l(&mu_);
    lock_open_ = true;
  }
  // Callers held at that gate now.
  int lock_waiting() {
    absl::MutexLock l(&mu_);
    return lock_waiting_;
  }
  void FailNextDeviceToHost(absl::Status s) {
    absl::MutexLock l(&mu_);
    fail_next_d2h_ = std::move(s);
  }
  void LimitAllocations(int n) {
    absl::MutexLock l(&mu_);
    allocations_left_ = n;
  }
  std::vector<std::string> TakeLog() {
    absl::MutexLock l(&mu_);
    return std::exchange(log_, {});
  }
  int allocated() {
    absl::MutexLock l(&mu_);
    return allocated_;
  }
  int live() {
    absl::MutexLock l(&mu_);
    return live_;
  }
  // Device copies and page-locking by a thread other than the one that made
  // this copier (the test's, standing for the trainer's) that had not
  // chosen its device first (UseDeviceOnThisThread): on CUDA those would
  // run on device 0, creating a context there.
  int calls_on_no_device() {
    absl::MutexLock l(&mu_);
    return calls_on_no_device_;
  }
  // Host-to-device copies (restores) made while a page-locking was held at
  // the gate.
  int copies_while_locking() {
    absl::MutexLock l(&mu_);
    return copies_while_locking_;
  }
  // RegisterHostMemory calls so far, and those not yet unregistered.
  int locks() {
    absl::MutexLock l(&mu_);
    return locks_;
  }
  int locked() {
    absl::MutexLock l(&mu_);
    return locked_;
  }

 private:
  void NoteThread() {
    if (chose_device_ || std::this_thread::get_id() == owner_) return;
    absl::MutexLock l(&mu_);
    ++calls_on_no_device_;
  }
  absl::Status Copy(const char* what, void* dst, const void* src, size_t n) {
    if (n > 0) std::memcpy(dst, src, n);
    absl::MutexLock l(&mu_);
    log_.push_back(absl::StrCat(what, " ", n));
    return absl::OkStatus();
  }

  static inline thread_local bool chose_device_ = false;
  const std::thread::id owner_ = std::this_thread::get_id();
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  absl::Status fail_next_d2h_ ABSL_GUARDED_BY(mu_);
  int allocations_left_ ABSL_GUARDED_BY(mu_) = 1000;
  int allocated_ ABSL_GUARDED_BY(mu_) = 0;
  int live_ ABSL_GUARDED_BY(mu_) = 0;
  bool lock_open_ ABSL_GUARDED_BY(mu_) = true;
  int lock_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int locks_ ABSL_GUARDED_BY(mu_) = 0;
  int calls_on_no_device_ ABSL_GUARDED_BY(mu_) = 0;
  int copies_while_locking_ ABSL_GUARDED_BY(mu_) = 0;
  int locked_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd::client
