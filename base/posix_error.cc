#include "base/posix_error.h"

#include "absl/strings/string_view.h"
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ckptd::base {

absl::Status PosixError(absl::string_view context, int error_number) {
  absl::StatusCode code;
  switch (error_number) {
    case ENOENT:
    case ENOTDIR:
      code = absl::StatusCode::kNotFound;
      break;
    case EEXIST:
    case ENOTEMPTY:
      code = absl::StatusCode::kAlreadyExists;
      break;
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case EFBIG:
    case ENOBUFS:
      code = absl::StatusCode::kResourceExhausted;
      break;
    case EACCES:
    case EPERM:
    case EROFS:
      code = absl::StatusCode::kPermissionDenied;
      break;
    case EIO:
      code = absl::StatusCode::kDataLoss;
      break;
    case EAGAIN:
    case EINTR:
    case EBUSY:
    case ETIMEDOUT:
    case EADDRINUSE:
      code = absl::StatusCode::kUnavailable;
      break;
    case EINVAL:
    case ENAMETOOLONG:
    case EISDIR:
    case ELOOP:
    case EBADF:
    case EADDRNOTAVAIL:
      code = absl::StatusCode::kInvalidArgument;
      break;
    case ENOSYS:
    case EOPNOTSUPP:
    case EAFNOSUPPORT:
    case EPROTONOSUPPORT:
      code = absl::StatusCode::kUnimplemented;
      break;
    default:
      code = absl::StatusCode::kInternal;
      break;
  }
  char buf[256];
  // GNU strerror_r returns the message pointer (possibly not buf).
  const char* msg = strerror_r(error_number, buf, sizeof(buf));
  return absl::Status(code, absl::StrCat(context, ": ", msg, " (errno ", error_number, ")"));
}

}  // namespace ckptd::base
