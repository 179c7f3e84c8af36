// A heap buffer whose start and capacity are multiples of an alignment, for
// O_DIRECT I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace ckptd::base {

inline constexpr size_t kDirectIoAlignment = 4096;

inline constexpr uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline constexpr bool IsAligned(uint64_t v, uint64_t a) { return v % a == 0; }

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Allocates at least `size` bytes (rounded up to `alignment`), zero-filled.
  explicit AlignedBuffer(size_t size, size_t alignment = kDirectIoAlignment)
      : capacity_(AlignUp(size, alignment)) {
    if (capacity_ == 0) return;
    data_ = static_cast<uint8_t*>(std::aligned_alloc(alignment, capacity_));
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_, 0, capacity_);
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), capacity_(std::exchange(o.capacity_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      capacity_ = std::exchange(o.capacity_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace ckptd::base
