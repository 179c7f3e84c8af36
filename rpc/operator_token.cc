#include "rpc/operator_token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/posix_error.h"
#include "base/status_macros.h"

namespace ckptd::rpc {
namespace {

constexpr size_t kMaxTokenBytes = 4096;

// Reads exactly `n` bytes (or up to EOF when `to_eof`) from `fd`.
absl::StatusOr<std::string> ReadFd(int fd, size_t n, bool to_eof, const std::string& what) {
  std::string out;
  out.resize(n);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::read(fd, out.data() + done, n - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return base::PosixError(absl::StrCat("read ", what), errno);
    if (r == 0) {
      if (to_eof) break;
      return absl::DataLossError(absl::StrCat("read ", what, ": ended after ", done, " of ", n, " bytes"));
    }
    done += static_cast<size_t>(r);
  }
  out.resize(done);
  return out;
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& what) {
  while (!data.empty()) {
    const ssize_t w = ::write(fd, data.data(), data.size());
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return base::PosixError(absl::StrCat("write ", what), errno);
    data.remove_prefix(static_cast<size_t>(w));
  }
  return absl::OkStatus();
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::StatusOr<std::string> GenerateToken() {
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return base::PosixError("open /dev/urandom", errno);
  absl::StatusOr<std::string> bytes = ReadFd(fd, 32, /*to_eof=*/false, "/dev/urandom");
  ::close(fd);  // read-only
  if (!bytes.ok()) return bytes.status();
  return absl::BytesToHexString(*bytes);
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view what, bool follow_links) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (follow_links ? 0 : O_NOFOLLOW | O_NONBLOCK));
  if (fd < 0) return base::PosixError(absl::StrCat("open ", what, " file ", path), errno);
  if (!follow_links) {
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);  // read-only
      return base::PosixError(absl::StrCat("stat ", what, " file ", path), err);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);  // read-only
      return absl::FailedPreconditionError(absl::StrCat(what, " file ", path, " is not a regular file"));
    }
  }
  absl::StatusOr<std::string> data = ReadFd(fd, kMaxTokenBytes + 2, /*to_eof=*/true, path);
  ::close(fd);  // read-only
  if (!data.ok()) return data.status();
  const std::string token(absl::StripAsciiWhitespace(*data));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " file ", path, " is empty"));
  if (token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " in ", path, " is longer than ", kMaxTokenBytes, " bytes"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " in ", path, " may hold only printable ASCII characters without spaces"));
    }
  }
  return token;
}

absl::Status WriteTokenFile(const std::string& path, absl::string_view token) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  // A leftover temp file could carry wider permissions than O_CREAT's.
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) return base::PosixError(absl::StrCat("unlink ", tmp), errno);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return base::PosixError(absl::StrCat("create ", tmp), errno);
  absl::Status s = WriteAll(fd, absl::StrCat(token, "\n"), tmp);
  if (s.ok() && ::fchmod(fd, 0600) != 0) s = base::PosixError(absl::StrCat("chmod ", tmp), errno);
  if (s.ok() && ::fsync(fd) != 0) s = base::PosixError(absl::StrCat("fsync ", tmp), errno);
  if (::close(fd) != 0 && s.ok()) s = base::PosixError(absl::StrCat("close ", tmp), errno);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = base::PosixError(absl::StrCat("rename ", tmp, " to ", path), errno);
  }
  if (!s.ok()) {
    (void)::unlink(tmp.c_str());  // best effort: the error above is what counts
    return s;
  }
  const std::string dir = DirName(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return base::PosixError(absl::StrCat("open directory ", dir), errno);
  if (::fsync(dfd) != 0) s = base::PosixError(absl::StrCat("fsync directory ", dir), errno);
  ::close(dfd);  // read-only descriptor
  return s;
}

}  // namespace ckptd::rpc
