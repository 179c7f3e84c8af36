#include "base/posix_error.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

struct Mapping {
  int error_number;
  const char* name;
  absl::StatusCode code;
};

// The table of base/posix_error.cc, entry by entry.
constexpr Mapping kMappings[] = {
    {ENOENT, "ENOENT", absl::StatusCode::kNotFound},
    {ENOTDIR, "ENOTDIR", absl::StatusCode::kNotFound},
    {EEXIST, "EEXIST", absl::StatusCode::kAlreadyExists},
    {ENOTEMPTY, "ENOTEMPTY", absl::StatusCode::kAlreadyExists},
    {ENOSPC, "ENOSPC", absl::StatusCode::kResourceExhausted},
    {EDQUOT, "EDQUOT", absl::StatusCode::kResourceExhausted},
    {EMFILE, "EMFILE", absl::StatusCode::kResourceExhausted},
    {ENFILE, "ENFILE", absl::StatusCode::kResourceExhausted},
    {ENOMEM, "ENOMEM", absl::StatusCode::kResourceExhausted},
    {EFBIG, "EFBIG", absl::StatusCode::kResourceExhausted},
    {ENOBUFS, "ENOBUFS", absl::StatusCode::kResourceExhausted},
    {EACCES, "EACCES", absl::StatusCode::kPermissionDenied},
    {EPERM, "EPERM", absl::StatusCode::kPermissionDenied},
    {EROFS, "EROFS", absl::StatusCode::kPermissionDenied},
    {EIO, "EIO", absl::StatusCode::kDataLoss},
    {EAGAIN, "EAGAIN", absl::StatusCode::kUnavailable},
    {EWOULDBLOCK, "EWOULDBLOCK", absl::StatusCode::kUnavailable},
    {EINTR, "EINTR", absl::StatusCode::kUnavailable},
    {EBUSY, "EBUSY", absl::StatusCode::kUnavailable},
    {ETIMEDOUT, "ETIMEDOUT", absl::StatusCode::kUnavailable},
    {EADDRINUSE, "EADDRINUSE", absl::StatusCode::kUnavailable},
    {EINVAL, "EINVAL", absl::StatusCode::kInvalidArgument},
    {ENAMETOOLONG, "ENAMETOOLONG", absl::StatusCode::kInvalidArgument},
    {EISDIR, "EISDIR", absl::StatusCode::kInvalidArgument},
    {ELOOP, "ELOOP", absl::StatusCode::kInvalidArgument},
    {EBADF, "EBADF", absl::StatusCode::kInvalidArgument},
    {EADDRNOTAVAIL, "EADDRNOTAVAIL", absl::StatusCode::kInvalidArgument},
    {ENOSYS, "ENOSYS", absl::StatusCode::kUnimplemented},
    {EOPNOTSUPP, "EOPNOTSUPP", absl::StatusCode::kUnimplemented},
    {ENOTSUP, "ENOTSUP", absl::StatusCode::kUnimplemented},
    {EAFNOSUPPORT, "EAFNOSUPPORT", absl::StatusCode::kUnimplemented},
    {EPROTONOSUPPORT, "EPROTONOSUPPORT", absl::StatusCode::kUnimplemented},
};

TEST(PosixErrorTest, MapsEachErrnoToItsCode) {
  for (const Mapping& m : kMappings) {
    EXPECT_EQ(PosixError("op", m.error_number).code(), m.code)
        << m.name << " (" << m.error_number << ") maps to " << PosixError("op", m.error_number);
  }
}

TEST(PosixErrorTest, ErrnosNotInTheTableAreInternal) {
  for (int error_number : {EPIPE, ECONNREFUSED, ESPIPE, EXDEV, E2BIG, 9999}) {
    EXPECT_EQ(PosixError("op", error_number).code(), absl::StatusCode::kInternal) << error_number;
  }
}

TEST(PosixErrorTest, ErrnoZeroIsStillAnError) {
  // A caller that forgot to check errno must not get an OK status back.
  const absl::Status s = PosixError("op", 0);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
}

TEST(PosixErrorTest, MessageIsContextStrerrorAndErrnoNumber) {
  const std::string context = "open /data/ckpt/step-100/shard-0";
  EXPECT_THAT(PosixError(context, ENOENT),
              StatusIs(absl::StatusCode::kNotFound,
                       absl::StrCat(context, ": ", std::strerror(ENOENT), " (errno ", ENOENT, ")")));
  EXPECT_THAT(PosixError("fsync f", ENOSPC),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       absl::StrCat("fsync f: ", std::strerror(ENOSPC), " (errno ", ENOSPC, ")")));
  // The glibc text, so that a wrong strerror_r variant (an int taken as a
  // pointer, an unfilled buffer) shows.
  EXPECT_THAT(PosixError("read x", EIO),
              StatusIs(absl::StatusCode::kDataLoss, absl::StrCat("read x: Input/output error (errno ", EIO, ")")));
}

TEST(PosixErrorTest, UnknownErrnoStillGetsATextAndItsNumber) {
  EXPECT_THAT(PosixError("ioctl", 9999),
              StatusIs(absl::StatusCode::kInternal, absl::StrCat("ioctl: ", std::strerror(9999), " (errno 9999)")));
  EXPECT_THAT(PosixError("ioctl", 9999),
              StatusIs(absl::StatusCode::kInternal, StartsWith("ioctl: Unknown error 9999")));
}

TEST(PosixErrorTest, EmptyContext) {
  EXPECT_THAT(PosixError("", EACCES), StatusIs(absl::StatusCode::kPermissionDenied,
                                               absl::StrCat(": ", std::strerror(EACCES), " (errno ", EACCES, ")")));
}

TEST(PosixErrorTest, ContextIsKeptVerbatim) {
  // Bytes that StrFormat would interpret and a NUL-free non-ASCII path.
  const std::string context = "rename /tmp/%s%d \xc3\xa9t\xc3\xa9";
  EXPECT_THAT(PosixError(context, EEXIST), StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr(context + ": ")));
}

}  // namespace
}  // namespace ckptd::base
