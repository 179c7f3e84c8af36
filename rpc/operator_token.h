// The operator token that RPCs changing the coordinator's state require
// (metadata "authorization: Bearer <token>"): generated at start-up unless the
// operator supplies one, and kept in a file only the owner can read, so that
// ckptctl on the same machine can pick it up.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckptd::rpc {

// The token file's name inside the coordinator's state directory.
inline constexpr absl::string_view kOperatorTokenFileName = "operator-token";

// 32 bytes from /dev/urandom as 64 lower-case hex digits.
absl::StatusOr<std::string> GenerateOperatorToken();

// Reads a token file: its content without surrounding whitespace. Errors name
// the path: kInvalidArgument when the token is empty, longer than 4096 bytes,
// or holds characters other than printable ASCII without spaces (what gRPC
// metadata can carry); errno-mapped codes when it cannot be read.
absl::StatusOr<std::string> ReadOperatorTokenFile(const std::string& path);

// Writes `token` and a newline to `path`, owner read/write only (0600),
// atomically (temp file, fsync, rename, directory fsync).
absl::Status WriteOperatorTokenFile(const std::string& path, absl::string_view token);

}  // namespace ckptd::rpc
