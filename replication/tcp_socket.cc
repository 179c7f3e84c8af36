#include "replication/tcp_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/posix_error.h"
#include "base/status_macros.h"

namespace ckptd::replication::tcp {

void Fd::Reset() {
  // A socket's close reports nothing this side still waits for.
  if (fd_ >= 0) (void)::close(fd_);
  fd_ = -1;
}

absl::Status SetBlocking(int fd, bool blocking, absl::string_view what) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, blocking ? flags & ~O_NONBLOCK : flags | O_NONBLOCK) < 0) {
    return base::PosixError(absl::StrCat("fcntl O_NONBLOCK on ", what), errno);
  }
  return absl::OkStatus();
}

absl::Status SetIoTimeout(int fd, absl::Duration timeout, absl::string_view what) {
  const timeval tv = absl::ToTimeval(timeout);
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
    return base::PosixError(absl::StrCat("setsockopt SO_SNDTIMEO/SO_RCVTIMEO on ", what), errno);
  }
  return absl::OkStatus();
}

void PushNow(int fd) {
  const int one = 1;
  // Best effort: without it the last bytes wait for an acknowledgement.
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

absl::Status SendAll(int fd, absl::Span<const uint8_t> data, absl::string_view what, uint64_t offset) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": the other side took no byte for too long at offset ", offset + done));
    }
    return base::PosixError(absl::StrCat(what, ": send at offset ", offset + done), n < 0 ? errno : EPIPE);
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> RecvAll(int fd, absl::Span<uint8_t> out, absl::string_view what, uint64_t offset) {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::recv(fd, out.data() + done, out.size() - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": no byte came for too long at offset ", offset + done));
    }
    return base::PosixError(absl::StrCat(what, ": recv at offset ", offset + done), errno);
  }
  return done;
}

absl::StatusOr<Fd> Connect(const std::string& host, int port, absl::Duration connect_timeout, absl::Duration io_timeout,
                           base::Clock* clock) {
  const std::string where =
      absl::StrCat(host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("data lane ", where, ": cannot resolve the host: ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("data lane ", where, ": no address"));
  const absl::Time deadline = clock->Now() + connect_timeout;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) {
      last = base::PosixError(absl::StrCat("data lane ", where, ": socket"), errno);
      continue;
    }
    int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      do {
        const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - clock->Now()));
        rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 60'000)));
      } while (rc < 0 && errno == EINTR);
      if (rc == 0) {
        last = absl::UnavailableError(
            absl::StrCat("data lane ", where, ": no connection within ", absl::FormatDuration(connect_timeout)));
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      if (rc < 0 || ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      errno = err;
      rc = err == 0 ? 0 : -1;
    }
    if (rc != 0) {
      last = base::PosixError(absl::StrCat("data lane ", where, ": connect"), errno);
      continue;
    }
    ::freeaddrinfo(found);
    CKPTD_RETURN_IF_ERROR(SetBlocking(fd.get(), true, where));
    CKPTD_RETURN_IF_ERROR(SetIoTimeout(fd.get(), io_timeout, where));
    return fd;
  }
  ::freeaddrinfo(found);
  return last;
}

absl::StatusOr<Fd> Listen(const std::string& host, int port, int* bound, absl::string_view what) {
  const std::string where =
      absl::StrCat(host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve ", what, " on ", where, ": ", gai_strerror(rc)));
  }
  // Every interface: IPv6 first, which takes IPv4 too where it can.
  std::vector<addrinfo*> order;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) order.push_back(a);
  if (host.empty()) {
    std::stable_sort(order.begin(), order.end(),
                     [](addrinfo* x, addrinfo* y) { return x->ai_family == AF_INET6 && y->ai_family != AF_INET6; });
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("cannot serve ", what, " on ", where, ": no address"));
  for (addrinfo* a : order) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) {
      last = base::PosixError(absl::StrCat(what, " ", where, ": socket"), errno);
      continue;
    }
    const int one = 1, zero = 0;
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // a restart binds at once
    if (a->ai_family == AF_INET6 && host.empty()) {
      (void)::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // IPv6 only where it must
    }
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
      last = absl::UnavailableError(
          absl::StrCat("cannot serve ", what, " on ", where, ": ", base::PosixError("bind", errno).message()));
      continue;
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      last = base::PosixError(absl::StrCat(what, " ", where, ": getsockname"), errno);
      continue;
    }
    *bound = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    ::freeaddrinfo(found);
    return fd;
  }
  ::freeaddrinfo(found);
  return last;
}

std::string PeerName(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      ::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  return addr.ss_family == AF_INET6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

}  // namespace ckptd::replication::tcp
