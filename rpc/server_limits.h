// What every ckptd gRPC server on a TCP port does about connections that
// hold a file and do nothing: a TLS handshake never finished, a peer gone
// without closing, a client that opens a connection and sends nothing.
#pragma once

#include "absl/time/time.h"

namespace grpc {
class ServerBuilder;
}

namespace ckptd::rpc {

// How long a connection may take to finish its handshake (TLS) by default:
// long enough for thousands of agents reconnecting at once to a restarted
// coordinator.
inline constexpr absl::Duration kHandshakeTimeout = absl::Seconds(20);

// Sets on `builder`: a connection that has not finished its handshake within
// `handshake_timeout` (one that connects and sends nothing included) is
// closed; a connection without a call for 5 minutes is closed (clients
// reconnect by themselves when they need to; an agent's heartbeat stream is
// a call); every connection is pinged after 30 s without traffic and closed
// when the ping goes unanswered for 20 s (a peer that vanished); clients may
// ping every 5 s at most.
void LimitIdleConnections(grpc::ServerBuilder* builder, absl::Duration handshake_timeout = kHandshakeTimeout);

}  // namespace ckptd::rpc
