// Unguessable random values from the kernel (getrandom(2)): session ids,
// credentials and other names an outsider must not be able to predict; and
// their comparison in a time that does not tell how much of a guess matched.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckptd::base {

// `bytes` random bytes (1..4096) as 2 x `bytes` lower-case hex digits.
// kInvalidArgument for a size outside that range; the errno-mapped error of
// getrandom(2) when the kernel cannot give them.
absl::StatusOr<std::string> RandomHex(size_t bytes);

// Whether `given` equals the secret `expected`, in a time that depends only
// on `expected`'s length.
bool ConstantTimeEquals(absl::string_view given, absl::string_view expected);

}  // namespace ckptd::base
