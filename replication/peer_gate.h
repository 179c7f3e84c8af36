// The gate in front of a Peer service that has an agent token but no TLS:
// gRPC reads a whole message (up to the Peer service's ~69 MiB) before any
// handler can look at the call's credential, so without TLS anyone who
// reaches the port could make an agent buffer that much per call. The gate
// accepts the port's TCP connections itself and hands one to gRPC only once
// it has proven the token in a short preamble; a connection that does not
// is closed after at most kMaxPreambleBytes were read.
//
// The preamble is an HTTP/1.1 CONNECT request, which is what gRPC's own
// client sends first when a channel has the "grpc.http_connect_server"
// argument (PeerGateChannelArguments), so that a GrpcPeerNetwork channel
// presents it on every connection and reconnection by itself:
//
//   CONNECT <host:port> HTTP/1.0\r\n
//   Authorization: Bearer <agent token>\r\n
//   \r\n
//
// answered "HTTP/1.0 200 OK" (HTTP/2 follows, as on any gRPC connection) or
// with 400 (not such a request), 401 (no token) or 403 (a wrong token), and
// closed. A client that speaks gRPC straight away (an agent of a version
// before the gate) is refused and logged as such.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/logger.h"
#include "replication/tcp_socket.h"

namespace grpc {
class ChannelArguments;
class Server;
}  // namespace grpc

namespace ckptd::replication {

// The most a connection may send before its preamble is whole.
inline constexpr size_t kMaxPreambleBytes = 8192;

struct PeerGateOptions {
  std::string token;  // what the preamble must present (not empty)
  // How long a connection may take to present it, and how many may be
  // presenting one at a time (the longest waiting is closed for a new one).
  absl::Duration handshake_timeout = absl::Seconds(5);
  size_t max_handshakes = 64;
  base::Logger* logger = nullptr;
  base::Clock* clock = nullptr;  // nullptr: the real clock
};

// What the gate did, since it started.
struct PeerGateStats {
  uint64_t admitted = 0;     // handed to gRPC with the right token
  uint64_t refused = 0;      // closed for a missing or wrong token
  uint64_t malformed = 0;    // closed for not sending the preamble (gRPC at once, another protocol, too long)
  uint64_t idle_closed = 0;  // closed before a whole preamble: timeout, crowded out, or gone
  uint64_t bytes_read = 0;   // read from connections before they were admitted or closed
};

class PeerGate {
 public:
  // Serves `listener` (a listening, non-blocking TCP socket) for `server`,
  // which must have been built with no listening port of its own and must
  // outlive the gate (Stop, or destroy the gate, before shutting it down).
  static absl::StatusOr<std::unique_ptr<PeerGate>> Start(tcp::Fd listener, grpc::Server* server,
                                                        PeerGateOptions options);
  ~PeerGate();  // Stop()
  PeerGate(const PeerGate&) = delete;
  PeerGate& operator=(const PeerGate&) = delete;

  // No connection is taken or handed to the server after this returns;
  // those presenting a preamble are closed.
  void Stop();
  PeerGateStats stats() const;

 private:
  struct Pending;
  PeerGate(tcp::Fd listener, tcp::Fd wake, grpc::Server* server, PeerGateOptions options);
  void Loop();
  // Reads what `p` sent; false when it is done (admitted or closed).
  bool Read(Pending& p);
  // The preamble `p` sent in full: admitted or refused.
  void Decide(Pending& p);
  void Refuse(Pending& p, uint64_t PeerGateStats::*counter, absl::string_view answer, absl::string_view why);

  const tcp::Fd listener_;
  const tcp::Fd wake_;
  grpc::Server* const server_;
  const PeerGateOptions options_;
  base::Clock* const clock_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  PeerGateStats stats_ ABSL_GUARDED_BY(mu_);
  // Refusals are logged at most once in a while, with a count since (the
  // loop's own).
  uint64_t unlogged_ = 0;
  absl::Time next_log_ = absl::InfinitePast();
};

// The channel arguments under which a gRPC client presents the gate's
// preamble with `token` to `address` (host:port) on every connection, and
// is never sent through an HTTP proxy from the environment.
void PeerGateChannelArguments(const std::string& address, const std::string& token, grpc::ChannelArguments* args);

}  // namespace ckptd::replication
