// The file-system interface that every storage path goes through, so tests can
// swap in an in-memory or fault-injecting implementation.
//
// Writes and reads are queued: Write/Read return a ticket at once, and the
// caller's buffer must stay valid and unchanged until a WaitFor covering that
// ticket (or WaitAll) has returned. Implementations may keep several transfers
// in flight (io_uring) or run each one at once (pread/pwrite, memory).
// After a queued transfer fails, every later call on that file returns the
// first error.
#pragma once

#include "absl/strings/string_view.h"
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckptd::storage {

struct OpenOptions {
  // Ask for O_DIRECT. An implementation that cannot honour it (tmpfs, memory)
  // opens buffered and reports alignment() == 1.
  bool direct_io = true;
};

// REQUIRES for Write/Read: buffer address, offset and length are multiples of
// alignment() (always true when alignment() == 1).
class WritableFile {
 public:
  virtual ~WritableFile() = default;

  virtual const std::string& path() const = 0;
  virtual size_t alignment() const = 0;

  // Queues writing `n` bytes from `data` at `offset`. A transfer that completes
  // short is continued until all bytes are written or an error occurs.
  virtual absl::StatusOr<uint64_t> Write(uint64_t offset, const void* data, size_t n) = 0;
  // Waits until the transfer with `ticket` has completed; returns its error, if any.
  virtual absl::Status WaitFor(uint64_t ticket) = 0;
  // Waits until every queued transfer has completed.
  virtual absl::Status WaitAll() = 0;
  // Reserves disk space and extends the file to at least `length` bytes
  // (zeros), so that later writes inside it neither extend the file (which
  // some file systems serialise for O_DIRECT) nor run out of space.
  // kUnimplemented when the file system cannot; callers may go on without.
  virtual absl::Status Allocate(uint64_t length) = 0;
  // Waits for all transfers, then sets the file's length.
  virtual absl::Status Truncate(uint64_t length) = 0;
  // Waits for all transfers, then makes the file's data and size durable (fsync).
  virtual absl::Status Sync() = 0;
  // Waits for all transfers and closes. A file not closed is closed by the
  // destructor, which ignores errors.
  virtual absl::Status Close() = 0;
};

class ReadableFile {
 public:
  virtual ~ReadableFile() = default;

  virtual const std::string& path() const = 0;
  virtual size_t alignment() const = 0;
  virtual uint64_t size() const = 0;

  // Queues reading exactly `n` bytes at `offset` into `buf`. Reading past the
  // end of the file completes with kDataLoss ("... truncated ...").
  virtual absl::StatusOr<uint64_t> Read(uint64_t offset, void* buf, size_t n) = 0;
  virtual absl::Status WaitFor(uint64_t ticket) = 0;
  virtual absl::Status WaitAll() = 0;
  virtual absl::Status Close() = 0;

  // Read + WaitFor.
  absl::Status ReadAt(uint64_t offset, void* buf, size_t n);
};

struct FileInfo {
  std::string name;  // entry name within its directory (ListDir) or the path (Stat)
  bool is_directory = false;
  uint64_t size = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Creates or truncates `path` for writing.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const OpenOptions& options) = 0;
  virtual absl::StatusOr<std::unique_ptr<ReadableFile>> NewReadableFile(
      const std::string& path, const OpenOptions& options) = 0;

  // Creates one directory; ok when it already exists as a directory.
  virtual absl::Status CreateDir(const std::string& path) = 0;
  // Removes a file (kNotFound when absent).
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // Removes an empty directory (kNotFound when absent).
  virtual absl::Status RemoveDir(const std::string& path) = 0;
  // Atomically replaces `to` with `from`.
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // Makes the directory's entries (creations, renames, removals) durable.
  virtual absl::Status SyncDir(const std::string& path) = 0;
  // Entries of a directory, without "." and "..", sorted by name. kNotFound
  // when the directory does not exist.
  virtual absl::StatusOr<std::vector<FileInfo>> ListDir(const std::string& path) = 0;
  // kNotFound when absent.
  virtual absl::StatusOr<FileInfo> Stat(const std::string& path) = 0;
};

// Helpers built on the interface.

// Creates `path` and every missing parent.
absl::Status CreateDirs(FileSystem* fs, const std::string& path);
// Removes `path` and everything below it; ok when absent.
absl::Status RemoveTree(FileSystem* fs, const std::string& path);
// Reads a whole (small) file.
absl::StatusOr<std::string> ReadFileToString(FileSystem* fs, const std::string& path);
// Writes `contents` to `path` durably and atomically: write to `path` + ".tmp",
// fsync, rename over `path`, fsync the directory. The temp file is removed on
// failure.
absl::Status WriteFileAtomically(FileSystem* fs, const std::string& path, absl::string_view contents);

// Copies `from` (on `from_fs`) to `to` (on `to_fs`) durably and atomically:
// into `to` + ".tmp" in chunks of `chunk_bytes`, reading the next chunk while
// the last one is written, then fsync, rename over `to`, fsync the directory.
// The temp file is removed on failure. Returns the bytes copied. Errors name
// the file and the side (reading or writing) that failed.
absl::StatusOr<uint64_t> CopyFileDurably(FileSystem* from_fs, const std::string& from, FileSystem* to_fs,
                                         const std::string& to, size_t chunk_bytes = 4 << 20);

// Path helpers ("a/b" + "c" -> "a/b/c"; dirname of "a/b/c" is "a/b").
std::string JoinPath(absl::string_view a, absl::string_view b);
std::string DirName(absl::string_view path);
std::string BaseName(absl::string_view path);

}  // namespace ckptd::storage
