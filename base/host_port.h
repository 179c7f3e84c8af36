// "host:port" parsing, shared by every listener and client address flag.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckptd::base {

// Splits "host:port" / "[v6]:port" into host (brackets removed, may be empty)
// and port. kInvalidArgument when malformed, including an IPv6 address
// without brackets or a port outside 0..65535.
absl::StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(absl::string_view host_port);

}  // namespace ckptd::base
