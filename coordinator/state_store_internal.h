// Helpers shared by the StateStore implementations, so that they agree on
// what they accept.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/message.h"

namespace ckptd::coordinator::internal {

// `message` serialized, or kInvalidArgument when the bytes would not parse
// back (proto3 refuses a string field that is not valid UTF-8): a store must
// never accept what it cannot return.
inline absl::StatusOr<std::string> SerializeForStore(const google::protobuf::Message& message) {
  std::string bytes;
  if (!message.SerializeToString(&bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot serialize ", message.GetTypeName(), " for the state store"));
  }
  std::unique_ptr<google::protobuf::Message> check(message.New());
  if (!check->ParseFromString(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        message.GetTypeName(), " has a string field that is not valid UTF-8; the state store refuses it"));
  }
  return bytes;
}

}  // namespace ckptd::coordinator::internal
