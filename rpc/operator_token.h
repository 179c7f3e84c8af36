// The coordinator's bearer tokens (metadata "authorization: Bearer <token>"):
// the operator token that RPCs changing the coordinator's state require, and
// the agent token that agent RPCs require (unless the agent's TLS certificate
// names its node). Each is generated at start-up unless the operator supplies
// one, and kept in a file only the owner can read, so that ckptctl on the same
// machine, or an agent given the file, can pick it up.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckptd::rpc {

// The token files' names inside the coordinator's state directory.
inline constexpr absl::string_view kOperatorTokenFileName = "operator-token";
inline constexpr absl::string_view kAgentTokenFileName = "agent-token";

// 32 bytes from /dev/urandom as 64 lower-case hex digits.
absl::StatusOr<std::string> GenerateToken();

// Reads a token file: its content without surrounding whitespace. Errors name
// the path and `what` the token is ("operator token", "agent token"):
// kInvalidArgument when the token is empty, longer than 4096 bytes, or holds
// characters other than printable ASCII without spaces (what gRPC metadata can
// carry); errno-mapped codes when it cannot be read. Unless `follow_links`,
// a symbolic link at `path` is not followed (ELOOP) and anything but a regular
// file is refused (kFailedPrecondition): for files the coordinator itself
// keeps in its state directory.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view what,
                                          bool follow_links = true);

// Writes `token` and a newline to `path`, owner read/write only (0600),
// atomically (temp file, fsync, rename, directory fsync).
absl::Status WriteTokenFile(const std::string& path, absl::string_view token);

// The operator token's and the agent token's names for the above.
inline absl::StatusOr<std::string> GenerateOperatorToken() { return GenerateToken(); }
inline absl::StatusOr<std::string> ReadOperatorTokenFile(const std::string& path) {
  return ReadTokenFile(path, "operator token");
}
inline absl::Status WriteOperatorTokenFile(const std::string& path, absl::string_view token) {
  return WriteTokenFile(path, token);
}
inline absl::StatusOr<std::string> ReadAgentTokenFile(const std::string& path) {
  return ReadTokenFile(path, "agent token");
}

}  // namespace ckptd::rpc
