// "host:port" parsing, shared by every listener and client address flag.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckptd::base {

// What the address is for, which decides whether port 0 is one.
enum class PortUse {
  kListen,   // an address to serve on: port 0 asks for any free port (0..65535)
  kConnect,  // an address to connect to: 1..65535
};

// Splits "host:port" / "[v6]:port" into host (brackets removed, may be empty)
// and port. kInvalidArgument naming the text when malformed, including an
// IPv6 address without brackets or a port outside the range of `use`
// (never wrapped: 99999 is refused, not taken for 34463).
absl::StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(absl::string_view host_port,
                                                               PortUse use = PortUse::kListen);

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then
// closed), for a process that must be told its port before it starts (it
// names the port it was given, not the one it bound); 0 when none could be
// had. Another process may take it meanwhile: for tests and benchmarks.
int FreeLoopbackPort();

}  // namespace ckptd::base
