// What every ckptd gRPC server on a TCP port does about connections that
// hold a file and do nothing: a TLS handshake never finished, a peer gone
// without closing, a client that opens a connection and sends nothing.
#pragma once

#include "absl/time/time.h"

namespace grpc {
class ServerBuilder;
}

namespace ckptd::rpc {

// How long a connection may take to finish its handshake (TLS) by default.
inline constexpr absl::Duration kHandshakeTimeout = absl::Seconds(10);

// Sets on `builder`: a connection that has not finished its handshake
// within `handshake_timeout` is closed; every connection is pinged after 30
// s without traffic (calls or not) and closed when the ping is not answered
// within 20 s, so a vanished peer, or one that never speaks, holds its file
// for under a minute; clients may ping every 5 s at most.
void LimitIdleConnections(grpc::ServerBuilder* builder, absl::Duration handshake_timeout = kHandshakeTimeout);

}  // namespace ckptd::rpc
