// PosixFileSystem: io_uring transfers (one ring per open file) with a
// pread/pwrite fallback. All ring code lives in this file.
#include "storage/posix_file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/aligned_buffer.h"
#include "base/posix_error.h"
#include "base/status_macros.h"

namespace ckptd::storage {
namespace {

constexpr mode_t kFileMode = 0640;
constexpr mode_t kDirMode = 0750;
// Largest piece handed to one read/write (the kernel caps a transfer at
// ~2 GiB anyway); the rest continues like a short transfer.
constexpr size_t kMaxChunk = size_t{1} << 30;
// io_uring refuses rings larger than this (IORING_MAX_ENTRIES).
constexpr unsigned kMaxQueueDepth = 32768;

// True when a ring can be set up and it supports IORING_OP_READ/WRITE (5.6+).
// Fails under seccomp filters (ENOSYS/EPERM) or io_uring_disabled sysctl.
bool ProbeIoUring() {
  io_uring ring;
  if (io_uring_queue_init(2, &ring, 0) < 0) return false;
  bool ok = false;
  if (io_uring_probe* probe = io_uring_get_probe_ring(&ring); probe != nullptr) {
    ok = io_uring_opcode_supported(probe, IORING_OP_READ) &&
         io_uring_opcode_supported(probe, IORING_OP_WRITE);
    io_uring_free_probe(probe);
  }
  io_uring_queue_exit(&ring);
  return ok;
}

int RetryOpen(const std::string& path, int flags, mode_t mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

struct OpenedFd {
  int fd = -1;
  bool direct = false;
  int error = 0;  // errno when fd < 0
};

// Opens `path`; with `want_direct`, O_DIRECT where the file system honours it.
// File systems that refuse O_DIRECT (EINVAL) and tmpfs, which accepts it since
// Linux 6.6 but still goes through the page cache, end up buffered.
OpenedFd OpenFd(const std::string& path, int flags, bool want_direct) {
  OpenedFd result;
  if (want_direct) {
    result.fd = RetryOpen(path, flags | O_DIRECT, kFileMode);
    if (result.fd >= 0) {
      result.direct = true;
      struct statfs sfs;
      if (::fstatfs(result.fd, &sfs) == 0 && sfs.f_type == TMPFS_MAGIC) {
        const int fl = ::fcntl(result.fd, F_GETFL);
        // If clearing O_DIRECT fails we simply stay direct (alignment 4096).
        if (fl >= 0 && ::fcntl(result.fd, F_SETFL, fl & ~O_DIRECT) == 0) result.direct = false;
      }
      return result;
    }
    if (errno != EINVAL) {
      result.error = errno;
      return result;
    }
  }
  result.fd = RetryOpen(path, flags, kFileMode);
  if (result.fd < 0) result.error = errno;
  return result;
}

FileType TypeOf(mode_t mode) {
  if (S_ISREG(mode)) return FileType::kRegular;
  if (S_ISDIR(mode)) return FileType::kDirectory;
  if (S_ISLNK(mode)) return FileType::kSymlink;
  return FileType::kOther;
}

FileInfo InfoOf(std::string name, const struct stat& st) {
  const FileType type = TypeOf(st.st_mode);
  return FileInfo{std::move(name), type, type == FileType::kDirectory,
                  type == FileType::kRegular ? static_cast<uint64_t>(st.st_size) : 0};
}

const char* ModeName(mode_t mode) {
  if (S_ISLNK(mode)) return "symbolic link";
  if (S_ISFIFO(mode)) return "FIFO";
  if (S_ISSOCK(mode)) return "socket";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISDIR(mode)) return "directory";
  return "special file";
}

// kDataLoss, as for a damaged file: whatever stands where a shard or MANIFEST
// should be, that file's data is not there, and readers handle it as they
// handle damage (a corrupt step, a problem found by verification).
absl::Status NotARegularFile(const std::string& path, mode_t mode) {
  return absl::DataLossError(
      absl::StrCat(path, " is a ", ModeName(mode), ", not a regular file", S_ISLNK(mode) ? " (not followed)" : ""));
}

absl::Status RemoveDirContents(int dir_fd, const std::string& path, const RemoveTreeOptions* options);

// Calls `fn` for each entry of `dir` but "." and "..", until it fails, then
// closes `dir` (closedir only fails on a bad DIR*). `path` names the
// directory in messages.
absl::Status ForEachEntry(DIR* dir, const std::string& path,
                          const std::function<absl::Status(const dirent&)>& fn) {
  absl::Status status;
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(dir);
    if (entry == nullptr) {
      if (errno != 0) status = base::PosixError(absl::StrCat("readdir ", path), errno);
      break;
    }
    const absl::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    status = fn(*entry);
    if (!status.ok()) break;
  }
  (void)::closedir(dir);
  return status;
}

// Removes `name` in the directory open as `dir_fd` (`dir_path` in messages),
// and everything below it when it is a directory. Never follows a link: a
// link is unlinked like a file, and a directory is entered only through
// openat(O_NOFOLLOW | O_DIRECTORY), so that one swapped for a link after it
// was listed is unlinked instead. `looks_like_dir` (readdir's d_type) only
// picks the first try.
absl::Status RemoveEntryAt(int dir_fd, const std::string& dir_path, const std::string& name, bool looks_like_dir) {
  const std::string path = JoinPath(dir_path, name);
  bool as_dir = looks_like_dir;
  // Each retry follows a change of the entry's type since the last try.
  for (int attempt = 0; attempt < 4; ++attempt) {
    if (!as_dir) {
      if (::unlinkat(dir_fd, name.c_str(), 0) == 0 || errno == ENOENT) return absl::OkStatus();
      if (errno != EISDIR) return base::PosixError(absl::StrCat("unlink ", path), errno);
      as_dir = true;
      continue;
    }
    int fd;
    do {
      fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      if (errno == ENOENT) return absl::OkStatus();
      if (errno != ENOTDIR && errno != ELOOP) return base::PosixError(absl::StrCat("open ", path), errno);
      as_dir = false;  // not (or no longer) a directory: the entry itself goes
      continue;
    }
    absl::Status s = RemoveDirContents(fd, path, nullptr);
    ::close(fd);
    CKPTD_RETURN_IF_ERROR(s);
    if (::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) return absl::OkStatus();
    return base::PosixError(absl::StrCat("rmdir ", path), errno);
  }
  return absl::UnavailableError(absl::StrCat("remove ", path, ": it keeps changing type while being removed"));
}

// Removes every entry of the directory open as `dir_fd` (`path` in messages),
// paced by `options` when given.
absl::Status RemoveDirContents(int dir_fd, const std::string& path, const RemoveTreeOptions* options) {
  // The names are read first: entries removed while readdir runs may make it
  // skip others.
  std::vector<std::pair<std::string, bool>> entries;  // name, looks like a directory
  {
    const int list_fd = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);  // closedir closes it
    if (list_fd < 0) return base::PosixError(absl::StrCat("dup ", path), errno);
    DIR* dir = ::fdopendir(list_fd);
    if (dir == nullptr) {
      const int err = errno;
      ::close(list_fd);
      return base::PosixError(absl::StrCat("opendir ", path), err);
    }
    CKPTD_RETURN_IF_ERROR(ForEachEntry(dir, path, [&entries](const dirent& entry) {
      entries.emplace_back(entry.d_name, entry.d_type == DT_DIR);
      return absl::OkStatus();
    }));
  }
  const size_t batch = options != nullptr ? std::max<size_t>(options->batch, 1) : 1;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (options != nullptr && options->before_batch && i % batch == 0) {
      CKPTD_RETURN_IF_ERROR(options->before_batch(i));
    }
    CKPTD_RETURN_IF_ERROR(RemoveEntryAt(dir_fd, path, entries[i].first, entries[i].second));
  }
  return absl::OkStatus();
}

// One open file's transfers: on a ring of its own (several in flight) or with
// pread/pwrite (each done inside Submit). Used by one thread at a time.
// Tickets start at 1; a ticket is done when it is below next_ticket_ and not
// in in_flight_. After the first failure every call returns that error.
class PosixFile {
 public:
  PosixFile(std::string path, int fd, bool direct, bool is_write, uint64_t size)
      : path_(std::move(path)), fd_(fd), direct_(direct), is_write_(is_write), size_(size) {}

  ~PosixFile() {
    // A destructor cannot report errors; callers who care call Close().
    if (!closed_) (void)Close();
  }

  PosixFile(const PosixFile&) = delete;
  PosixFile& operator=(const PosixFile&) = delete;

  // Sets up a ring of `queue_depth` entries. When that fails (e.g. locked
  // memory limits) this file keeps working with pread/pwrite.
  void InitRing(unsigned queue_depth) {
    depth_ = std::clamp(queue_depth, 1u, kMaxQueueDepth);
    has_ring_ = io_uring_queue_init(depth_, &ring_, 0) == 0;
  }

  const std::string& path() const { return path_; }
  size_t alignment() const { return direct_ ? base::kDirectIoAlignment : 1; }
  uint64_t size() const { return size_; }

  // Submit for a file opened for writing.
  absl::StatusOr<uint64_t> Write(uint64_t offset, const void* data, size_t n) {
    // The file is only written from `data`; Submit serves reads too.
    return Submit(offset, const_cast<void*>(data), n);
  }

  absl::StatusOr<uint64_t> Submit(uint64_t offset, void* buf, size_t n) {
    if (closed_) return Closed();
    CKPTD_RETURN_IF_ERROR(error_);
    const size_t align = alignment();
    if (!base::IsAligned(reinterpret_cast<uintptr_t>(buf), align) || !base::IsAligned(offset, align) ||
        !base::IsAligned(n, align)) {
      return absl::InvalidArgumentError(
          absl::StrCat(OpName(), " ", path_, ": buffer, offset ", offset, " and length ", n,
                       " must be multiples of ", align, " with O_DIRECT"));
    }
    if (!has_ring_) {
      const uint64_t ticket = next_ticket_++;
      TransferSync(offset, static_cast<uint8_t*>(buf), n);
      return ticket;
    }
    // Make room: at most depth_ transfers in flight.
    while (in_flight_.size() >= depth_ && !ring_broken_) {
      ReapAndResubmit();
    }
    CKPTD_RETURN_IF_ERROR(error_);
    const uint64_t ticket = next_ticket_++;
    if (n == 0) return ticket;
    auto it =
        in_flight_.emplace(ticket, Transfer{static_cast<uint8_t*>(buf), offset, n, offset, n}).first;
    Prep(ticket, it->second);
    Flush();
    return ticket;
  }

  absl::Status WaitFor(uint64_t ticket) {
    if (closed_) return Closed();
    if (ticket == 0 || ticket >= next_ticket_) {
      return absl::InvalidArgumentError(absl::StrCat("wait ", path_, ": unknown ticket ", ticket));
    }
    while (in_flight_.contains(ticket) && !ring_broken_) ReapAndResubmit();
    return error_;
  }

  absl::Status WaitAll() {
    if (closed_) return Closed();
    DrainAll();
    return error_;
  }

  absl::Status Allocate(uint64_t length) {
    if (closed_) return Closed();
    CKPTD_RETURN_IF_ERROR(error_);
    int ret;
    do {
      ret = ::fallocate(fd_, 0, 0, static_cast<off_t>(length));
    } while (ret < 0 && errno == EINTR);
    if (ret == 0) return absl::OkStatus();
    // Not sticky: the file is still usable without the reservation.
    return base::PosixError(absl::StrCat("fallocate ", path_, " to ", length, " bytes"), errno);
  }

  absl::Status Truncate(uint64_t length) {
    CKPTD_RETURN_IF_ERROR(WaitAll());
    int ret;
    do {
      ret = ::ftruncate(fd_, static_cast<off_t>(length));
    } while (ret < 0 && errno == EINTR);
    if (ret < 0) Fail(base::PosixError(absl::StrCat("ftruncate ", path_, " to ", length, " bytes"), errno));
    return error_;
  }

  absl::Status Sync() {
    CKPTD_RETURN_IF_ERROR(WaitAll());
    int ret;
    do {
      ret = ::fsync(fd_);
    } while (ret < 0 && errno == EINTR);
    // After a failed fsync the kernel may have dropped dirty pages: the file
    // can no longer be trusted, so the error sticks.
    if (ret < 0) Fail(base::PosixError(absl::StrCat("fsync ", path_), errno));
    return error_;
  }

  // sync_file_range(SYNC_FILE_RANGE_WRITE) of a buffered file; nothing for
  // one written direct (no dirty pages). A file system without it (EINVAL,
  // ENOSYS, EOPNOTSUPP) leaves everything to Sync.
  absl::Status StartWriteback(uint64_t offset, uint64_t length) {
    if (closed_) return Closed();
    CKPTD_RETURN_IF_ERROR(error_);
    if (direct_ || length == 0) return absl::OkStatus();
    int ret;
    do {
      ret = ::sync_file_range(fd_, static_cast<off64_t>(offset), static_cast<off64_t>(length), SYNC_FILE_RANGE_WRITE);
    } while (ret < 0 && errno == EINTR);
    if (ret == 0 || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) return absl::OkStatus();
    // EIO: the disk already refused dirty pages of the file; the fsync would
    // fail too, so the error sticks.
    Fail(base::PosixError(absl::StrCat("sync_file_range ", path_, " of ", length, " bytes at offset ", offset), errno));
    return error_;
  }

  absl::Status Close() {
    if (closed_) return error_;
    DrainAll();
    if (has_ring_) io_uring_queue_exit(&ring_);
    has_ring_ = false;
    closed_ = true;
    // No retry on EINTR: Linux releases the descriptor regardless.
    if (::close(fd_) < 0) Fail(base::PosixError(absl::StrCat("close ", path_), errno));
    fd_ = -1;
    return error_;
  }

 private:
  struct Transfer {
    uint8_t* buf;         // next byte to transfer
    uint64_t offset;      // file offset of `buf`
    size_t remaining;     // bytes still to transfer
    uint64_t start;       // the request as queued, for messages
    size_t length;
  };

  const char* OpName() const { return is_write_ ? "write" : "read"; }

  absl::Status Closed() const {
    return absl::FailedPreconditionError(absl::StrCat(OpName(), " ", path_, ": file is closed"));
  }

  void Fail(absl::Status s) {
    if (error_.ok()) error_ = std::move(s);
  }

  // Accounts `res` (bytes or -errno) to `t`. Returns true when `t` is
  // finished (all bytes moved, or failed); otherwise `t` must be resubmitted.
  bool Advance(Transfer& t, int64_t res) {
    if (res == -EINTR || res == -EAGAIN) return false;
    if (res < 0) {
      Fail(base::PosixError(absl::StrCat(OpName(), " ", path_, " at offset ", t.offset), static_cast<int>(-res)));
      return true;
    }
    if (res == 0) {
      if (is_write_) {
        Fail(absl::InternalError(
            absl::StrCat("write ", path_, ": no progress at offset ", t.offset)));
      } else {
        Fail(Truncated(t));
      }
      return true;
    }
    const size_t done = std::min(static_cast<size_t>(res), t.remaining);
    t.buf += done;
    t.offset += done;
    t.remaining -= done;
    if (t.remaining == 0) return true;
    // A short O_DIRECT read that stops unaligned at or past the size seen at
    // open hit end of file; resubmitting would fail with EINVAL instead.
    if (!is_write_ && direct_ && !base::IsAligned(t.offset, base::kDirectIoAlignment) && t.offset >= size_) {
      Fail(Truncated(t));
      return true;
    }
    return false;
  }

  absl::Status Truncated(const Transfer& t) const {
    return absl::DataLossError(absl::StrCat("read ", path_, ": file truncated: wanted ", t.length,
                                            " bytes at offset ", t.start, ", got ",
                                            t.length - t.remaining, " before end of file"));
  }

  // pread/pwrite the whole transfer now; a failure is kept in error_.
  void TransferSync(uint64_t offset, uint8_t* buf, size_t n) {
    Transfer t{buf, offset, n, offset, n};
    while (t.remaining > 0) {
      const size_t chunk = std::min(t.remaining, kMaxChunk);
      const ssize_t r = is_write_ ? ::pwrite(fd_, t.buf, chunk, static_cast<off_t>(t.offset))
                                  : ::pread(fd_, t.buf, chunk, static_cast<off_t>(t.offset));
      if (Advance(t, r < 0 ? -static_cast<int64_t>(errno) : r)) break;
    }
  }

  // Queues `t` on the ring (not yet submitted; see Flush).
  void Prep(uint64_t ticket, const Transfer& t) {
    // Copied first: Flush below may reap, which can rehash in_flight_.
    uint8_t* const buf = t.buf;
    const uint64_t offset = t.offset;
    const unsigned chunk = static_cast<unsigned>(std::min(t.remaining, kMaxChunk));
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      // Cannot happen while in_flight_ <= depth_ <= SQ size; submit and retry.
      Flush();
      sqe = io_uring_get_sqe(&ring_);
    }
    if (sqe == nullptr) {
      Fail(absl::InternalError(absl::StrCat(OpName(), " ", path_, ": io_uring submission queue full")));
      in_flight_.erase(ticket);
      return;
    }
    if (is_write_) {
      io_uring_prep_write(sqe, fd_, buf, chunk, offset);
    } else {
      io_uring_prep_read(sqe, fd_, buf, chunk, offset);
    }
    io_uring_sqe_set_data64(sqe, ticket);
    unsubmitted_.push_back(ticket);
  }

  // Submits every prepped SQE. On a submit failure the unsubmitted transfers
  // are dropped (their buffers are never touched) and the ring is not
  // submitted to again.
  void Flush() {
    while (!unsubmitted_.empty() && !submit_broken_ && !ring_broken_) {
      const int ret = io_uring_submit(&ring_);
      if (ret > 0) {
        unsubmitted_.erase(unsubmitted_.begin(),
                           unsubmitted_.begin() + std::min<size_t>(ret, unsubmitted_.size()));
        continue;
      }
      if (ret == -EINTR) continue;
      const bool others_in_flight = in_flight_.size() > unsubmitted_.size();
      if ((ret == 0 || ret == -EAGAIN || ret == -EBUSY) && others_in_flight) {
        // Out of kernel resources for now: let a submitted transfer finish.
        ReapOnce();
        continue;
      }
      Fail(base::PosixError(absl::StrCat("io_uring_submit ", path_), ret == 0 ? EAGAIN : -ret));
      for (uint64_t ticket : unsubmitted_) in_flight_.erase(ticket);
      unsubmitted_.clear();
      // The dropped SQEs stay in the queue and must never be submitted;
      // transfers already submitted are still reaped by WaitFor/WaitAll.
      submit_broken_ = true;
      return;
    }
  }

  // Waits for at least one completion and handles every ready one; short or
  // retryable transfers are prepped again (Flush submits them).
  void ReapOnce() {
    io_uring_cqe* cqe = nullptr;
    int ret;
    do {
      ret = io_uring_wait_cqe(&ring_, &cqe);
    } while (ret == -EINTR);
    if (ret < 0) {
      // The ring itself failed; nothing more can be learnt about the transfers.
      Fail(base::PosixError(absl::StrCat("io_uring_wait_cqe ", path_), -ret));
      in_flight_.clear();
      unsubmitted_.clear();
      ring_broken_ = true;
      return;
    }
    do {
      const uint64_t ticket = io_uring_cqe_get_data64(cqe);
      const int64_t res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      auto it = in_flight_.find(ticket);
      if (it != in_flight_.end()) {
        // After a failure, unfinished transfers are abandoned, not continued.
        if (Advance(it->second, res) || !error_.ok() || submit_broken_) {
          in_flight_.erase(it);
        } else {
          Prep(ticket, it->second);
        }
      }
    } while (io_uring_peek_cqe(&ring_, &cqe) == 0);
  }

  void ReapAndResubmit() {
    ReapOnce();
    Flush();
  }

  void DrainAll() {
    while (!in_flight_.empty() && !ring_broken_) ReapAndResubmit();
  }

  const std::string path_;
  int fd_;
  const bool direct_;
  const bool is_write_;
  const uint64_t size_;  // at open; readable files only

  bool has_ring_ = false;
  bool closed_ = false;
  // io_uring_wait_cqe failed: the ring can no longer be used at all.
  bool ring_broken_ = false;
  // A submit failed: SQEs left in the queue must never be submitted.
  bool submit_broken_ = false;
  unsigned depth_ = 1;
  io_uring ring_{};
  uint64_t next_ticket_ = 1;
  absl::flat_hash_map<uint64_t, Transfer> in_flight_;
  std::vector<uint64_t> unsubmitted_;  // prepped, in queue order
  absl::Status error_;
};

// A PosixFile opened for writing, as a WritableFile.
using PosixWritableFile = ForwardingWritableFileOf<PosixFile>;

class PosixReadableFile final : public ReadableFile {
 public:
  explicit PosixReadableFile(std::unique_ptr<PosixFile> file) : file_(std::move(file)) {}

  const std::string& path() const override { return file_->path(); }
  size_t alignment() const override { return file_->alignment(); }
  uint64_t size() const override { return file_->size(); }
  absl::StatusOr<uint64_t> Read(uint64_t offset, void* buf, size_t n) override {
    return file_->Submit(offset, buf, n);
  }
  absl::Status WaitFor(uint64_t ticket) override { return file_->WaitFor(ticket); }
  absl::Status WaitAll() override { return file_->WaitAll(); }
  absl::Status Close() override { return file_->Close(); }

 private:
  std::unique_ptr<PosixFile> file_;
};

// A regular file opened with `flags` (plus O_NONBLOCK, cleared again before
// it is returned, and O_NOFOLLOW unless `follow_symlinks`): a FIFO at `path`
// would otherwise make the open wait for a peer, for ever, and a link there
// may point anywhere. Anything but a regular file is an error naming what it is.
struct OpenedRegular {
  int fd = -1;
  bool direct = false;
  uint64_t size = 0;
};
absl::StatusOr<OpenedRegular> OpenRegular(const std::string& path, int flags, bool direct_io, bool follow_symlinks) {
  const OpenedFd opened = OpenFd(path, flags | O_NONBLOCK | (follow_symlinks ? 0 : O_NOFOLLOW), direct_io);
  if (opened.fd < 0) {
    struct stat st;
    // ELOOP: a link, not followed; ENXIO: a FIFO without a reader opened for
    // writing (or a socket).
    if ((opened.error == ELOOP || opened.error == ENXIO) && ::lstat(path.c_str(), &st) == 0 &&
        !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
      return NotARegularFile(path, st.st_mode);
    }
    return base::PosixError(absl::StrCat("open ", path), opened.error);
  }
  struct stat st;
  if (::fstat(opened.fd, &st) < 0) {
    const int err = errno;
    ::close(opened.fd);  // The fstat error is the one worth reporting.
    return base::PosixError(absl::StrCat("fstat ", path), err);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(opened.fd);
    return base::PosixError(absl::StrCat("open ", path), EISDIR);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(opened.fd);
    return NotARegularFile(path, st.st_mode);
  }
  // I/O waits for the disk: with O_NONBLOCK left on, io_uring may answer
  // EAGAIN instead of waiting.
  const int fl = ::fcntl(opened.fd, F_GETFL);
  if (fl < 0 || ::fcntl(opened.fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
    const int err = errno;
    ::close(opened.fd);
    return base::PosixError(absl::StrCat("fcntl ", path), err);
  }
  return OpenedRegular{opened.fd, opened.direct, static_cast<uint64_t>(st.st_size)};
}

// Stateless apart from its options, so safe to use from many threads.
class PosixFileSystemImpl final : public PosixFileSystem {
 public:
  explicit PosixFileSystemImpl(const PosixFileSystemOptions& options)
      : options_(options), uses_io_uring_(options.use_io_uring && ProbeIoUring()) {}

  bool uses_io_uring() const override { return uses_io_uring_; }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const OpenOptions& options) override {
    // The same guards as for reading: a link or FIFO planted at the name is
    // an error, never written through or waited on. Writes go to fresh names,
    // so nothing legitimate is refused.
    CKPTD_ASSIGN_OR_RETURN(const OpenedRegular opened,
                           OpenRegular(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, options.direct_io,
                                       /*follow_symlinks=*/false));
    auto file = std::make_unique<PosixFile>(path, opened.fd, opened.direct, /*is_write=*/true, 0);
    if (uses_io_uring_) file->InitRing(options_.queue_depth);
    return std::make_unique<PosixWritableFile>(std::move(file));
  }

  absl::StatusOr<std::unique_ptr<ReadableFile>> NewReadableFile(
      const std::string& path, const OpenOptions& options) override {
    CKPTD_ASSIGN_OR_RETURN(const OpenedRegular opened,
                           OpenRegular(path, O_RDONLY | O_CLOEXEC, options.direct_io, options.follow_symlinks));
    auto file = std::make_unique<PosixFile>(path, opened.fd, opened.direct, /*is_write=*/false,
                                            opened.size);
    if (uses_io_uring_) file->InitRing(options_.queue_depth);
    return std::make_unique<PosixReadableFile>(std::move(file));
  }

  absl::Status CreateDir(const std::string& path) override {
    if (::mkdir(path.c_str(), kDirMode) == 0) return absl::OkStatus();
    const int err = errno;
    if (err == EEXIST) {
      struct stat st;
      // lstat: a link to a directory is not one. Below a storage root the
      // layout makes none, and writing through one would put shards wherever
      // it points.
      if (::lstat(path.c_str(), &st) == 0) {
        if (S_ISDIR(st.st_mode)) return absl::OkStatus();
        if (S_ISLNK(st.st_mode)) {
          return base::PosixError(absl::StrCat("mkdir ", path, " (a symbolic link, not followed)"), err);
        }
      }
    }
    return base::PosixError(absl::StrCat("mkdir ", path), err);
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) < 0) return base::PosixError(absl::StrCat("unlink ", path), errno);
    return absl::OkStatus();
  }

  absl::Status RemoveDir(const std::string& path) override {
    if (::rmdir(path.c_str()) < 0) return base::PosixError(absl::StrCat("rmdir ", path), errno);
    return absl::OkStatus();
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) < 0) {
      return base::PosixError(absl::StrCat("rename ", from, " to ", to), errno);
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& path) override {
    const int fd = RetryOpen(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0) return base::PosixError(absl::StrCat("open ", path), errno);
    int ret;
    do {
      ret = ::fsync(fd);
    } while (ret < 0 && errno == EINTR);
    absl::Status status;
    if (ret < 0) status = base::PosixError(absl::StrCat("fsync ", path), errno);
    if (::close(fd) < 0 && status.ok()) status = base::PosixError(absl::StrCat("close ", path), errno);
    return status;
  }

  absl::StatusOr<std::vector<FileInfo>> ListDir(const std::string& path) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return base::PosixError(absl::StrCat("opendir ", path), errno);
    std::vector<FileInfo> entries;
    const int dir_fd = ::dirfd(dir);
    CKPTD_RETURN_IF_ERROR(ForEachEntry(dir, path, [&](const dirent& entry) {
      struct stat st;
      // Each entry as what it is itself: a link is never reported as (and so
      // never walked into as) what it points to.
      if (::fstatat(dir_fd, entry.d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno == ENOENT) return absl::OkStatus();  // removed since readdir saw it
        return base::PosixError(absl::StrCat("stat ", JoinPath(path, entry.d_name)), errno);
      }
      entries.push_back(InfoOf(entry.d_name, st));
      return absl::OkStatus();
    }));
    std::sort(entries.begin(), entries.end(),
              [](const FileInfo& a, const FileInfo& b) { return a.name < b.name; });
    return entries;
  }

  absl::StatusOr<FileInfo> Stat(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) < 0) return base::PosixError(absl::StrCat("stat ", path), errno);
    return InfoOf(path, st);
  }

  absl::Status RemoveTree(const std::string& dir_or_file, const RemoveTreeOptions& options) override {
    // The components above `path` are followed (a storage root may be a
    // link); from `path` down nothing is, and the walk goes by descriptor.
    // A trailing slash would make the kernel follow a link at `path`.
    std::string path = dir_or_file;
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    if (!options.links_allowed_up_to.empty()) return RemoveTreeBelow(path, options);
    for (int attempt = 0; attempt < 4; ++attempt) {
      const int fd = RetryOpen(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0);
      if (fd >= 0) {
        absl::Status s = RemoveFirst(fd, path, options);
        if (s.ok()) s = RemoveDirContents(fd, path, &options);
        ::close(fd);
        CKPTD_RETURN_IF_ERROR(s);
        if (::rmdir(path.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
        return base::PosixError(absl::StrCat("rmdir ", path), errno);
      }
      if (errno == ENOENT) return absl::OkStatus();
      if (errno != ENOTDIR && errno != ELOOP) return base::PosixError(absl::StrCat("open ", path), errno);
      // Not a directory (a file, a link, a FIFO): the entry itself goes. A
      // parent that is not a directory (ENOTDIR) means there is nothing here.
      if (::unlink(path.c_str()) == 0 || errno == ENOENT || errno == ENOTDIR) return absl::OkStatus();
      if (errno != EISDIR) return base::PosixError(absl::StrCat("unlink ", path), errno);
      // It became a directory since the open: again.
    }
    return absl::UnavailableError(absl::StrCat("remove ", path, ": it keeps changing type while being removed"));
  }

 private:
  // options.remove_first below the directory open as `fd`, made durable.
  static absl::Status RemoveFirst(int fd, const std::string& path, const RemoveTreeOptions& options) {
    bool removed = false;
    for (const std::string& name : options.remove_first) {
      if (::unlinkat(fd, name.c_str(), 0) == 0) {
        removed = true;
      } else if (errno != ENOENT) {
        return base::PosixError(absl::StrCat("unlink ", JoinPath(path, name)), errno);
      }
    }
    if (removed && ::fsync(fd) != 0) return base::PosixError(absl::StrCat("fsync ", path), errno);
    return absl::OkStatus();
  }

  // RemoveTree with options.links_allowed_up_to: the walk from the prefix
  // down to `path` goes one component at a time by descriptor, never through
  // a link, so that a directory swapped for a link after it was checked is
  // not followed out of the prefix.
  static absl::Status RemoveTreeBelow(const std::string& path, const RemoveTreeOptions& options) {
    std::string base = options.links_allowed_up_to;
    while (base.size() > 1 && base.back() == '/') base.pop_back();
    const std::string prefix = base == "/" ? base : absl::StrCat(base, "/");
    if (!absl::StartsWith(path, prefix)) {
      return absl::InvalidArgumentError(absl::StrCat("remove ", path, ": not below ", base));
    }
    std::vector<std::string> parts = absl::StrSplit(absl::string_view(path).substr(prefix.size()), '/', absl::SkipEmpty());
    if (parts.empty()) return absl::InvalidArgumentError(absl::StrCat("remove ", path, ": nothing below ", base));
    int parent = RetryOpen(base, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (parent < 0) return errno == ENOENT ? absl::OkStatus() : base::PosixError(absl::StrCat("open ", base), errno);
    std::string at = base;
    absl::Status result = absl::OkStatus();
    for (size_t i = 0; i < parts.size(); ++i) {
      const std::string& name = parts[i];
      const std::string here = JoinPath(at, name);
      int fd;
      do {
        fd = ::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      } while (fd < 0 && errno == EINTR);
      if (fd < 0) {
        const int err = errno;
        if (err == ENOTDIR || err == ELOOP) {
          result = absl::FailedPreconditionError(absl::StrCat(here, " is not a directory (a link?): left alone"));
        } else if (err != ENOENT) {
          result = base::PosixError(absl::StrCat("open ", here), err);
        }
        break;
      }
      if (i + 1 < parts.size()) {
        ::close(parent);
        parent = fd;
        at = here;
        continue;
      }
      result = RemoveFirst(fd, here, options);
      if (result.ok()) result = RemoveDirContents(fd, here, &options);
      ::close(fd);
      if (result.ok() && ::unlinkat(parent, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
        result = base::PosixError(absl::StrCat("rmdir ", here), errno);
      }
    }
    ::close(parent);
    return result;
  }
  const PosixFileSystemOptions options_;
  const bool uses_io_uring_;
};

}  // namespace

std::unique_ptr<PosixFileSystem> NewPosixFileSystem(const PosixFileSystemOptions& options) {
  return std::make_unique<PosixFileSystemImpl>(options);
}

}  // namespace ckptd::storage
