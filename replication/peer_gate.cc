#include "replication/peer_gate.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/posix_error.h"
#include "base/random.h"
#include "base/thread.h"
#include "base/thread_priority.h"
#include "grpcpp/server.h"
#include "grpcpp/server_posix.h"
#include "grpcpp/support/channel_arguments.h"

namespace ckptd::replication {
namespace {

// The longest the loop sleeps without looking at the clock.
constexpr absl::Duration kLoopSlice = absl::Milliseconds(100);
// Connections taken from the listen queue per round of the loop.
constexpr int kMaxAcceptsPerRound = 256;
// Refused connections logged at most once in this (with a count since).
constexpr absl::Duration kRefusalLogInterval = absl::Seconds(10);
// What every HTTP/2 connection starts with: a client that sends it first
// speaks gRPC without the gate's preamble.
constexpr absl::string_view kHttp2Preface = "PRI * HTTP/2.0\r\n";
constexpr absl::string_view kEnd = "\r\n\r\n";

}  // namespace

// A connection presenting its preamble (the loop's own).
struct PeerGate::Pending {
  tcp::Fd fd;
  absl::Time deadline;
  std::string peer;  // host:port, for logs
  std::string got;   // what it sent so far
};

absl::StatusOr<std::unique_ptr<PeerGate>> PeerGate::Start(tcp::Fd listener, grpc::Server* server,
                                                          PeerGateOptions options) {
  if (options.token.empty()) return absl::InvalidArgumentError("the Peer port's gate needs the agent token");
  tcp::Fd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (wake.get() < 0) return base::PosixError("the Peer port's gate: eventfd", errno);
  std::unique_ptr<PeerGate> gate(new PeerGate(std::move(listener), std::move(wake), server, std::move(options)));
  PeerGate* raw = gate.get();
  absl::StatusOr<std::thread> thread = base::StartThread("the Peer port's gate", [raw] { raw->Loop(); });
  if (!thread.ok()) return thread.status();
  gate->thread_ = *std::move(thread);
  return gate;
}

PeerGate::PeerGate(tcp::Fd listener, tcp::Fd wake, grpc::Server* server, PeerGateOptions options)
    : listener_(std::move(listener)),
      wake_(std::move(wake)),
      server_(server),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : base::RealClock::Get()) {}

PeerGate::~PeerGate() { Stop(); }

void PeerGate::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));  // a full counter wakes the loop just as well
  if (thread_.joinable()) thread_.join();
}

PeerGateStats PeerGate::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

void PeerGate::Loop() {
  base::SetCallingThreadName("ckptd-peer-gate");
  base::Logger& logger = options_.logger != nullptr ? *options_.logger : base::DefaultLogger();
  std::list<Pending> pending;
  absl::Time listener_paused_until = absl::InfinitePast();
  std::vector<pollfd> fds;
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;  // `pending` closes its connections
    }
    absl::Time now = clock_->Now();
    absl::Duration wait = kLoopSlice;
    for (const Pending& p : pending) wait = std::min(wait, p.deadline - now);
    const bool listening = now >= listener_paused_until;
    fds.clear();
    fds.push_back({wake_.get(), POLLIN, 0});
    fds.push_back({listening ? listener_.get() : -1, POLLIN, 0});
    for (const Pending& p : pending) fds.push_back({p.fd.get(), POLLIN, 0});
    const int rc =
        ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(wait))));
    if (rc < 0 && errno != EINTR) {
      logger.Error(base::PosixError("the Peer port's gate: poll", errno).ToString());
      absl::SleepFor(kLoopSlice);  // not a busy loop on a lasting error
    }
    if (rc > 0 && fds[0].revents != 0) {
      uint64_t count;
      (void)!::read(wake_.get(), &count, sizeof(count));  // only to clear it
    }
    now = clock_->Now();
    size_t i = 2;
    for (auto it = pending.begin(); it != pending.end(); ++i) {
      if (rc > 0 && fds[i].revents != 0 && !Read(*it)) {
        it = pending.erase(it);
      } else if (now >= it->deadline) {
        Refuse(*it, &PeerGateStats::idle_closed, "", "sent no whole preamble in time");
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
    if (!listening || rc <= 0 || fds[1].revents == 0) continue;
    for (int k = 0; k < kMaxAcceptsPerRound; ++k) {
      tcp::Fd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (fd.get() < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          // Out of descriptors or memory: the queue waits a moment rather
          // than spin.
          logger.Warning(base::PosixError("the Peer port's gate: accept", errno).ToString());
          listener_paused_until = now + kLoopSlice;
        }
        break;
      }
      while (!pending.empty() && pending.size() >= std::max<size_t>(1, options_.max_handshakes)) {
        Refuse(pending.front(), &PeerGateStats::idle_closed, "",
               absl::StrCat("was crowded out: ", options_.max_handshakes, " connections were presenting a preamble"));
        pending.pop_front();
      }
      Pending p;
      p.peer = tcp::PeerName(fd.get());
      p.fd = std::move(fd);
      p.deadline = now + options_.handshake_timeout;
      // The preamble usually came with the connection.
      if (Read(p)) pending.push_back(std::move(p));
    }
  }
}

bool PeerGate::Read(Pending& p) {
  char buffer[1024];
  while (true) {
    // Never more than the preamble's limit, and never past its end: a
    // client that is admitted sends nothing more before the answer.
    const size_t room = std::min(sizeof(buffer), kMaxPreambleBytes + 1 - p.got.size());
    const ssize_t n = ::recv(p.fd.get(), buffer, room, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) {
      Refuse(p, &PeerGateStats::idle_closed, "", n == 0 ? "closed before a whole preamble" : std::strerror(errno));
      return false;
    }
    {
      absl::MutexLock l(&mu_);
      stats_.bytes_read += static_cast<uint64_t>(n);
    }
    p.got.append(buffer, static_cast<size_t>(n));
    if (p.got.size() >= 4 && absl::StartsWith(kHttp2Preface, absl::string_view(p.got).substr(0, 4))) {
      Refuse(p, &PeerGateStats::malformed, "",
             "spoke gRPC without the Peer port's preamble (an agent of an older version, or no agent token?)");
      return false;
    }
    if (absl::StrContains(p.got, kEnd)) {
      Decide(p);
      return false;
    }
    if (p.got.size() > kMaxPreambleBytes) {
      Refuse(p, &PeerGateStats::malformed, "HTTP/1.0 400 Bad Request\r\n\r\n",
             absl::StrCat("sent more than ", kMaxPreambleBytes, " bytes without finishing its preamble"));
      return false;
    }
  }
}

void PeerGate::Decide(Pending& p) {
  const size_t end = absl::string_view(p.got).find(kEnd);
  if (end + kEnd.size() != p.got.size()) {
    Refuse(p, &PeerGateStats::malformed, "HTTP/1.0 400 Bad Request\r\n\r\n",
           "sent more than its preamble before it was answered");
    return;
  }
  std::vector<absl::string_view> lines = absl::StrSplit(absl::string_view(p.got).substr(0, end), "\r\n");
  if (lines.empty() || !absl::StartsWith(lines[0], "CONNECT ")) {
    Refuse(p, &PeerGateStats::malformed, "HTTP/1.0 400 Bad Request\r\n\r\n",
           "sent no CONNECT request as its preamble");
    return;
  }
  std::optional<absl::string_view> credential;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::pair<absl::string_view, absl::string_view> field = absl::StrSplit(lines[i], absl::MaxSplits(':', 1));
    if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(field.first), "authorization")) {
      credential = absl::StripAsciiWhitespace(field.second);
    }
  }
  if (!credential.has_value()) {
    Refuse(p, &PeerGateStats::refused, "HTTP/1.0 401 Unauthorized\r\n\r\n",
           "presented no agent token (\"Authorization: Bearer <token>\")");
    return;
  }
  if (!absl::ConsumePrefix(&*credential, "Bearer ") || !base::ConstantTimeEquals(*credential, options_.token)) {
    Refuse(p, &PeerGateStats::refused, "HTTP/1.0 403 Forbidden\r\n\r\n", "presented a wrong agent token");
    return;
  }
  // The answer is short and the socket's buffer empty: it goes whole, or the
  // client is gone (its gRPC then finds the connection closed).
  constexpr absl::string_view kOk = "HTTP/1.0 200 OK\r\n\r\n";
  if (::send(p.fd.get(), kOk.data(), kOk.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(kOk.size())) {
    Refuse(p, &PeerGateStats::idle_closed, "", "was gone before it was answered");
    return;
  }
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;  // the server may be shutting down: closed
    ++stats_.admitted;
  }
  grpc::AddInsecureChannelFromFd(server_, p.fd.Release());  // gRPC owns (and closes) it now
}

void PeerGate::Refuse(Pending& p, uint64_t PeerGateStats::*counter, absl::string_view answer, absl::string_view why) {
  if (!answer.empty()) (void)!::send(p.fd.get(), answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  {
    absl::MutexLock l(&mu_);
    ++(stats_.*counter);
  }
  if (counter == &PeerGateStats::idle_closed) return;  // the ordinary end of port scans and vanished peers
  ++unlogged_;
  const absl::Time now = clock_->Now();
  if (now < next_log_) return;
  base::Logger& logger = options_.logger != nullptr ? *options_.logger : base::DefaultLogger();
  logger.Warning(absl::StrCat("Peer port: closed ", unlogged_, " connection(s) without handing them to the Peer",
                              " service; the last, from ", p.peer, ", ", why));
  unlogged_ = 0;
  next_log_ = now + kRefusalLogInterval;
}

void PeerGateChannelArguments(const std::string& address, const std::string& token, grpc::ChannelArguments* args) {
  // gRPC's HTTP CONNECT handshaker (a proxy's, in its usual use) sends the
  // preamble before HTTP/2 on each connection it makes.
  args->SetString("grpc.http_connect_server", address);
  args->SetString("grpc.http_connect_headers", absl::StrCat("Authorization:Bearer ", token));
  args->SetInt("grpc.enable_http_proxy", 0);
}

}  // namespace ckptd::replication
