// How the C ABI's option structs become ClientOptions; apart from c_api.cc
// so that tests can check the translation, old-caller struct sizes included.
#pragma once

#include "absl/status/statusor.h"
#include "client/ckptd.h"
#include "client/client.h"

namespace ckptd::client {

// `options` is required (socket and job set); `ext` may be null. An `ext`
// whose size is below its `size` field, or with non-zero bytes past the
// fields this library knows, is kInvalidArgument.
absl::StatusOr<ClientOptions> ClientOptionsFromC(const ckptd_options* options, const ckptd_options_ext* ext);

}  // namespace ckptd::client
