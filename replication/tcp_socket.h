// Blocking TCP sockets for peer replication's data lane (replication/peer_service.cc):
// an owned descriptor, connect and listen with timeouts, and whole sends and
// receives whose errors name what was being sent and at which offset.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/clock.h"

namespace ckptd::replication::tcp {

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  int get() const { return fd_; }
  // The descriptor, no longer owned.
  int Release() { return std::exchange(fd_, -1); }
  void Reset();

 private:
  int fd_ = -1;
};

absl::Status SetBlocking(int fd, bool blocking, absl::string_view what);

// A blocking send or receive on `fd` gives up after `timeout` without a byte.
absl::Status SetIoTimeout(int fd, absl::Duration timeout, absl::string_view what);

// Nagle's algorithm off: a short write after the bulk goes out at once.
void PushNow(int fd);

// Writes all of `data` to blocking `fd`; `what` and `offset` (of data's
// first byte in what is sent) name it in errors.
absl::Status SendAll(int fd, absl::Span<const uint8_t> data, absl::string_view what, uint64_t offset = 0);

// Reads into `out` from blocking `fd` until it is full or the other side
// closed; returns the bytes read. Errors as SendAll's.
absl::StatusOr<size_t> RecvAll(int fd, absl::Span<uint8_t> out, absl::string_view what, uint64_t offset = 0);

// A TCP connection to `host`:`port`, blocking, with `io_timeout` on each
// send and receive; `connect_timeout` is measured on `clock`.
absl::StatusOr<Fd> Connect(const std::string& host, int port, absl::Duration connect_timeout, absl::Duration io_timeout,
                           base::Clock* clock);

// A listening TCP socket (non-blocking) on `host` (empty: every interface)
// and `port` (0: any free one); `*bound` gets the port. Errors name it
// `what` ("the data lane").
absl::StatusOr<Fd> Listen(const std::string& host, int port, int* bound, absl::string_view what = "the data lane");

// "host:port" of the other end of `fd`, for logs.
std::string PeerName(int fd);

}  // namespace ckptd::replication::tcp
