#include "base/random.h"

#include <sys/random.h>

#include <cerrno>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/posix_error.h"

namespace ckptd::base {

absl::StatusOr<std::string> RandomHex(size_t bytes) {
  if (bytes == 0 || bytes > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("random value of ", bytes, " bytes: must be 1 to 4096"));
  }
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("getrandom", errno);
    }
    got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(raw);
}

bool ConstantTimeEquals(absl::string_view given, absl::string_view expected) {
  // Touches every byte of `expected` whatever `given` holds.
  volatile unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff = diff | (g ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

}  // namespace ckptd::base
