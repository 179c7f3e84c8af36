#include "metrics/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/host_port.h"
#include "base/posix_error.h"
#include "metrics/registry.h"

namespace ckptd::metrics {
namespace {

// How long a connection may linger after its response, reading and discarding
// what the client still sends, so that closing does not reset the connection
// before the client has read the response; and how much it may send then.
constexpr absl::Duration kLingerTime = absl::Seconds(1);
constexpr size_t kMaxLingerBytes = 64 * 1024;
// How long accept() pauses after running out of file descriptors.
constexpr absl::Duration kAcceptBackoff = absl::Milliseconds(100);

const char* ReasonPhrase(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

std::string BuildResponse(const HttpResponse& response, bool head) {
  int code = response.status_code;
  if (code < 100 || code > 599) code = 500;
  // The content type comes from our own handler, but a line break in it would
  // still split the header.
  absl::string_view content_type = response.content_type;
  if (content_type.find_first_of("\r\n") != absl::string_view::npos) content_type = "application/octet-stream";
  std::string out = absl::StrCat("HTTP/1.1 ", code, " ", ReasonPhrase(code), "\r\nContent-Type: ", content_type,
                                 "\r\nContent-Length: ", response.body.size(), "\r\nConnection: close\r\n");
  if (code == 405) out += "Allow: GET, HEAD\r\n";
  out += "\r\n";
  if (!head) out += response.body;
  return out;
}

HttpResponse ErrorResponse(int code) {
  return HttpResponse{code, "text/plain; charset=utf-8", absl::StrCat(code, " ", ReasonPhrase(code), "\n")};
}

bool IsTokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         absl::string_view("!#$%&'*+-.^_`|~").find(c) != absl::string_view::npos;
}

// End of the request head (just past its empty line, CRLF or bare LF), or npos.
size_t FindHeadEnd(absl::string_view in) {
  for (size_t i = in.find('\n'); i != absl::string_view::npos; i = in.find('\n', i + 1)) {
    if (i + 1 < in.size() && in[i + 1] == '\n') return i + 2;
    if (i + 2 < in.size() && in[i + 1] == '\r' && in[i + 2] == '\n') return i + 3;
  }
  return absl::string_view::npos;
}

// Answers one complete request head.
std::string Respond(absl::string_view head, const HttpServer::Handler& handler) {
  absl::string_view line = head.substr(0, head.find('\n'));
  if (absl::EndsWith(line, "\r")) line.remove_suffix(1);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == absl::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == absl::string_view::npos || line.find(' ', sp2 + 1) != absl::string_view::npos) {
    return BuildResponse(ErrorResponse(400), false);
  }
  const absl::string_view method = line.substr(0, sp1);
  absl::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const absl::string_view version = line.substr(sp2 + 1);
  if (method.empty() || !std::all_of(method.begin(), method.end(), IsTokenChar) || target.empty() ||
      std::any_of(target.begin(), target.end(), [](char c) { return c <= ' ' || c == 0x7f; })) {
    return BuildResponse(ErrorResponse(400), false);
  }
  if (!absl::StartsWith(version, "HTTP/1.")) {
    return BuildResponse(ErrorResponse(absl::StartsWith(version, "HTTP/") ? 505 : 400), false);
  }
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) return BuildResponse(ErrorResponse(405), false);
  // Absolute form (RFC 9112 3.2.2): drop scheme and authority.
  if (const size_t scheme_end = target.find("://");
      target[0] != '/' && scheme_end != absl::string_view::npos) {
    const size_t path_start = target.find('/', scheme_end + 3);
    target = path_start == absl::string_view::npos ? "/" : target.substr(path_start);
  }
  if (target[0] != '/') return BuildResponse(ErrorResponse(400), false);
  const absl::string_view path = target.substr(0, target.find_first_of("?#"));
  return BuildResponse(handler(path), head_only);
}

struct Connection {
  enum class State { kReading, kWriting, kLingering };
  int fd = -1;
  State state = State::kReading;
  std::string in;
  std::string out;
  size_t written = 0;
  size_t discarded = 0;
  absl::Time accepted;
  // Reading: when accepted (bytes of an incomplete head are no progress, so
  // trickling them does not help). Writing: the last send that moved bytes.
  // Lingering: when the response was out.
  absl::Time last_progress;
  absl::Time deadline;
};

// Which connection to close when a new one needs the room (see
// HttpServerOptions::max_connections): the lowest (class, last progress).
size_t PickEviction(const std::vector<Connection>& conns) {
  const auto eviction_class = [](Connection::State s) {
    switch (s) {
      case Connection::State::kLingering:
        return 0;  // its response is out already
      case Connection::State::kReading:
        return 1;  // has not sent a complete request
      case Connection::State::kWriting:
        return 2;
    }
    return 2;
  };
  size_t best = 0;
  for (size_t i = 1; i < conns.size(); ++i) {
    const int ci = eviction_class(conns[i].state);
    const int cb = eviction_class(conns[best].state);
    if (ci < cb || (ci == cb && conns[i].last_progress < conns[best].last_progress)) best = i;
  }
  return best;
}

int PollTimeoutMs(absl::Time now, absl::Time next) {
  if (next == absl::InfiniteFuture()) return -1;
  if (next <= now) return 0;
  // Round up so the loop does not wake just before a deadline.
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(next - now) + 1, 60'000));
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& host_port, Handler handler,
                                                              HttpServerOptions options) {
  absl::StatusOr<std::pair<std::string, uint16_t>> parsed = base::ParseHostPort(host_port);
  if (!parsed.ok()) return parsed.status();
  const auto& [host, port] = *parsed;

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  if (absl::StartsWith(host_port, "[")) hints.ai_flags |= AI_NUMERICHOST;
  const std::string port_text = absl::StrCat(port);
  addrinfo* addrs = nullptr;
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &addrs); rc != 0) {
    const absl::StatusCode code = rc == EAI_AGAIN ? absl::StatusCode::kUnavailable
                                  : rc == EAI_SYSTEM ? absl::StatusCode::kInternal
                                                     : absl::StatusCode::kInvalidArgument;
    return absl::Status(code, absl::StrCat("resolve ", host_port, ": ", gai_strerror(rc)));
  }
  absl::Status last_error = absl::InvalidArgumentError(absl::StrCat("resolve ", host_port, ": no address"));
  int listen_fd = -1;
  for (const addrinfo* a = addrs; a != nullptr && listen_fd < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = base::PosixError(absl::StrCat("socket for ", host_port), errno);
      continue;
    }
    const int one = 1;
    // Lets a restarted daemon bind while old connections sit in TIME_WAIT;
    // failing to set it only costs that.
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      last_error = base::PosixError(absl::StrCat("bind ", host_port), errno);
      close(fd);
      continue;
    }
    if (listen(fd, 128) != 0) {
      last_error = base::PosixError(absl::StrCat("listen ", host_port), errno);
      close(fd);
      continue;
    }
    listen_fd = fd;
  }
  freeaddrinfo(addrs);
  if (listen_fd < 0) return last_error;

  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  if (getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0) {
    absl::Status s = base::PosixError(absl::StrCat("getsockname ", host_port), errno);
    close(listen_fd);
    return s;
  }
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  const int wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) {
    absl::Status s = base::PosixError("eventfd", errno);
    close(listen_fd);
    return s;
  }
  if (options.max_connections < 1) options.max_connections = 1;
  return std::unique_ptr<HttpServer>(
      new HttpServer(listen_fd, wake_fd, bound_port, std::move(handler), std::move(options)));
}

HttpServer::HttpServer(int listen_fd, int wake_fd, int port, Handler handler, HttpServerOptions options)
    : listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      port_(port),
      handler_(std::move(handler)),
      options_(std::move(options)) {
  absl::MutexLock l(&stop_mu_);
  thread_ = std::thread([this] { Loop(); });
}

HttpServer::~HttpServer() {
  Stop();
  close(wake_fd_);
}

void HttpServer::Stop() {
  absl::MutexLock l(&stop_mu_);
  if (!thread_.joinable()) return;
  stopping_.store(true);
  const uint64_t one = 1;
  // Can only fail if the counter overflows, which one write per Stop() can't do.
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
}

void HttpServer::Loop() {
  std::vector<Connection> conns;
  std::vector<pollfd> fds;
  absl::Time accept_paused_until = absl::InfinitePast();

  const auto close_conn = [](Connection& c) {
    close(c.fd);
    c.fd = -1;
  };
  // Starts lingering once the whole response is out.
  const auto write_some = [&](Connection& c, absl::Time now) {
    while (c.written < c.out.size()) {
      const ssize_t n = send(c.fd, c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) close_conn(c);
        return;
      }
      c.written += static_cast<size_t>(n);
      c.last_progress = now;
    }
    c.state = Connection::State::kLingering;
    c.last_progress = now;
    c.deadline = std::min(c.deadline, now + kLingerTime);
    if (shutdown(c.fd, SHUT_WR) != 0) close_conn(c);
  };
  const auto read_some = [&](Connection& c, absl::Time now) {
    char buf[4096];
    while (c.fd >= 0 && c.state != Connection::State::kWriting) {
      const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) close_conn(c);
        return;
      }
      if (n == 0) {  // the client is done sending: an incomplete request stays unanswered
        close_conn(c);
        return;
      }
      if (c.state == Connection::State::kLingering) {
        c.discarded += static_cast<size_t>(n);
        if (c.discarded > kMaxLingerBytes) close_conn(c);
        continue;
      }
      c.in.append(buf, static_cast<size_t>(n));
      const size_t head_end = FindHeadEnd(c.in);
      if (head_end == std::string::npos ? c.in.size() > options_.max_request_bytes
                                        : head_end > options_.max_request_bytes) {
        c.out = BuildResponse(ErrorResponse(431), false);
      } else if (head_end != std::string::npos) {
        c.out = Respond(absl::string_view(c.in).substr(0, head_end), handler_);
      } else {
        continue;
      }
      c.in.clear();
      c.in.shrink_to_fit();
      c.state = Connection::State::kWriting;
      c.last_progress = now;
      c.deadline = c.accepted + options_.request_timeout;  // no longer bound by header_timeout
      write_some(c, now);
    }
  };

  while (!stopping_.load()) {
    absl::Time now = absl::Now();
    // The listening socket is served even with the table full: a new
    // connection then takes the place of the least useful open one.
    const bool accepting = now >= accept_paused_until;
    absl::Time next_wake = accepting ? absl::InfiniteFuture() : accept_paused_until;
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, static_cast<short>(accepting ? POLLIN : 0), 0});
    for (const Connection& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.state == Connection::State::kWriting ? POLLOUT : POLLIN), 0});
      next_wake = std::min(next_wake, c.deadline);
    }
    if (poll(fds.data(), fds.size(), PollTimeoutMs(now, next_wake)) < 0 && errno != EINTR) {
      // Only EFAULT/EINVAL/ENOMEM; back off instead of spinning.
      absl::SleepFor(absl::Milliseconds(10));
      continue;
    }
    if (stopping_.load()) break;
    now = absl::Now();

    for (size_t i = 0; i < conns.size(); ++i) {
      Connection& c = conns[i];
      const short revents = fds[i + 2].revents;
      if (revents == 0) continue;
      if (c.state == Connection::State::kWriting) {
        if (revents & (POLLOUT | POLLERR | POLLHUP)) write_some(c, now);  // a dead peer fails send()
      } else {
        read_some(c, now);
      }
    }
    for (Connection& c : conns) {
      if (c.fd >= 0 && now >= c.deadline) close_conn(c);
    }
    conns.erase(std::remove_if(conns.begin(), conns.end(), [](const Connection& c) { return c.fd < 0; }),
                conns.end());

    if (fds[1].revents & POLLIN) {
      // At most a table's worth per round, so that a flood of new connections
      // cannot keep the open ones from being served.
      for (int accepted = 0; accepted < options_.max_connections; ++accepted) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            accept_paused_until = now + kAcceptBackoff;
          }
          // EAGAIN: no more pending; ECONNABORTED and the like: that client is gone.
          break;
        }
        if (static_cast<int>(conns.size()) >= options_.max_connections) {
          const size_t victim = PickEviction(conns);
          close(conns[victim].fd);
          conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(victim));
        }
        Connection c;
        c.fd = fd;
        c.accepted = now;
        c.last_progress = now;
        c.deadline = now + std::min(options_.header_timeout, options_.request_timeout);
        conns.push_back(std::move(c));
        // Most requests have already arrived; serve them without another poll.
        read_some(conns.back(), now);
        if (conns.back().fd < 0) conns.pop_back();
      }
    }
  }
  for (Connection& c : conns) {
    if (c.fd >= 0) close(c.fd);
  }
  close(listen_fd_);
}

HttpServer::Handler MetricsHandler(Registry& registry) {
  return [&registry](absl::string_view path) {
    if (path == "/healthz") return HttpResponse{200, "text/plain; charset=utf-8", "ok\n"};
    if (path != "/metrics") return ErrorResponse(404);
    return HttpResponse{200, std::string(kPrometheusContentType), registry.Render()};
  };
}

HttpServer::Handler MetricsHandler(Registry& registry, Readiness not_ready) {
  return [metrics = MetricsHandler(registry), not_ready = std::move(not_ready)](absl::string_view path) {
    if (path != "/readyz") return metrics(path);
    std::string why = not_ready ? not_ready() : std::string();
    if (why.empty()) return HttpResponse{200, "text/plain; charset=utf-8", "ready\n"};
    // One line, whatever the reason holds.
    for (char& c : why) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    return HttpResponse{503, "text/plain; charset=utf-8", why + "\n"};
  };
}

}  // namespace ckptd::metrics
