#include "base/host_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ckptd::base {

absl::StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(absl::string_view host_port, PortUse use) {
  absl::string_view host;
  absl::string_view port;
  if (absl::StartsWith(host_port, "[")) {
    const size_t close = host_port.find(']');
    if (close == absl::string_view::npos || host_port.substr(close + 1, 1) != ":") {
      return absl::InvalidArgumentError(absl::StrCat("\"", host_port, "\" is not [ipv6]:port"));
    }
    host = host_port.substr(1, close - 1);
    port = host_port.substr(close + 2);
    if (host.empty()) return absl::InvalidArgumentError(absl::StrCat("\"", host_port, "\" has an empty [host]"));
  } else {
    const size_t colon = host_port.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("\"", host_port, "\" is not host:port"));
    }
    host = host_port.substr(0, colon);
    port = host_port.substr(colon + 1);
    if (host.find(':') != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", host_port, "\": an IPv6 address needs brackets, as in [::1]:9090"));
    }
  }
  // Parsed wide and checked before it is narrowed to 16 bits.
  const uint32_t lowest = use == PortUse::kListen ? 0 : 1;
  uint32_t port_number = 0;
  if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &port_number) || port_number < lowest || port_number > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("\"", host_port, "\": port must be ", lowest, "..65535"));
  }
  return std::make_pair(std::string(host), static_cast<uint16_t>(port_number));
}

int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace ckptd::base
