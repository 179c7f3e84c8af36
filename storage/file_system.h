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
#include <functional>
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
  // For reading: open a symbolic link at `path` (its last component) as what
  // it points to. Off by default because under a storage root the layout
  // makes no links, and one in place of a shard or MANIFEST may point
  // anywhere; only a path an operator names (ckptctl inspect) follows one.
  bool follow_symlinks = false;
};

// Bytes of completed buffered writes (a WritableFile whose alignment() is 1)
// that a writer hands to StartWriteback at a time: the final Sync then has at
// most about this much left to flush, and a stop asked for between writes is
// not held up by gigabytes of dirty pages.
inline constexpr uint64_t kWritebackBytes = uint64_t{64} << 20;

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
  // Starts writing [offset, offset + length) back to the disk without
  // waiting for it (sync_file_range's SYNC_FILE_RANGE_WRITE), so that a
  // buffered file's Sync has little left to flush. REQUIRES: the writes of
  // that range have completed (WaitFor). A hint, never a substitute for
  // Sync: ok where the file system cannot, and for a file written direct.
  virtual absl::Status StartWriteback(uint64_t offset, uint64_t length) {
    (void)offset;
    (void)length;
    return absl::OkStatus();
  }
  // Waits for all transfers and closes. A file not closed is closed by the
  // destructor, which ignores errors.
  virtual absl::Status Close() = 0;
};

// A WritableFile that hands every call to a `File`: a subclass overrides
// only what it changes. `File` is another WritableFile (ForwardingWritableFile,
// for wrappers) or an implementation's own file class with the same calls.
template <typename File>
class ForwardingWritableFileOf : public WritableFile {
 public:
  explicit ForwardingWritableFileOf(std::unique_ptr<File> file) : file_(std::move(file)) {}
  const std::string& path() const override { return file_->path(); }
  size_t alignment() const override { return file_->alignment(); }
  absl::StatusOr<uint64_t> Write(uint64_t offset, const void* data, size_t n) override {
    return file_->Write(offset, data, n);
  }
  absl::Status WaitFor(uint64_t ticket) override { return file_->WaitFor(ticket); }
  absl::Status WaitAll() override { return file_->WaitAll(); }
  absl::Status Allocate(uint64_t length) override { return file_->Allocate(length); }
  absl::Status Truncate(uint64_t length) override { return file_->Truncate(length); }
  absl::Status Sync() override { return file_->Sync(); }
  absl::Status StartWriteback(uint64_t offset, uint64_t length) override {
    return file_->StartWriteback(offset, length);
  }
  absl::Status Close() override { return file_->Close(); }

 protected:
  File& wrapped() { return *file_; }

 private:
  const std::unique_ptr<File> file_;
};
// Wraps another WritableFile.
class ForwardingWritableFile : public ForwardingWritableFileOf<WritableFile> {
 public:
  using ForwardingWritableFileOf::ForwardingWritableFileOf;
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

// What an entry is. Stat and ListDir report a symbolic link as kSymlink, never
// as what it points to, so that a walk under a storage root never descends
// into or deletes through one.
enum class FileType {
  kRegular,
  kDirectory,
  kSymlink,
  kOther,  // a FIFO, socket or device
};
// "regular file", "directory", "symbolic link", "FIFO, socket or device".
absl::string_view FileTypeName(FileType type);

struct FileInfo {
  std::string name;  // entry name within its directory (ListDir) or the path (Stat)
  FileType type = FileType::kRegular;
  bool is_directory = false;  // type == FileType::kDirectory
  uint64_t size = 0;          // of a regular file; 0 for anything else
};

// How RemoveTree paces a large removal: `before_batch`, when set, runs before
// each `batch` entries directly below the removed directory go (the first
// batch included) with the number gone so far; its error stops the removal
// and is returned.
struct RemoveTreeOptions {
  size_t batch = 256;  // 0 counts as 1
  std::function<absl::Status(size_t removed)> before_batch;
  // When set (a prefix of the path, such as a storage root): every component
  // of the path below it, the path itself included, must be a directory
  // itself, never a link, at the moment it is walked through (openat with
  // O_NOFOLLOW, one component at a time): one that is not fails with
  // kFailedPrecondition, and nothing outside is touched. The prefix itself
  // may be, or go through, a link.
  std::string links_allowed_up_to;
  // Entries directly below the path that go first, made durable (a
  // directory sync) before anything else is removed: a MANIFEST, so that a
  // crash part-way leaves an incomplete step, never a committed one with
  // holes.
  std::vector<std::string> remove_first;
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
  // Entries of a directory, without "." and "..", sorted by name, each as
  // what it is itself (a link is kSymlink). kNotFound when the directory does
  // not exist. A link at `path` itself is followed (a storage root may be one).
  virtual absl::StatusOr<std::vector<FileInfo>> ListDir(const std::string& path) = 0;
  // What `path` is itself (lstat: a link is kSymlink). kNotFound when absent.
  virtual absl::StatusOr<FileInfo> Stat(const std::string& path) = 0;

  // Removes `path` and everything below it; ok when absent. Never follows a
  // symbolic link, `path` included: a link is removed, never anything it
  // points to. This implementation walks with Stat, ListDir, RemoveFile and
  // RemoveDir (what a fault-injecting wrapper counts); a real file system
  // overrides it to walk by descriptor, so that a directory swapped for a
  // link during the walk is not followed either. Use the RemoveTree helpers.
  virtual absl::Status RemoveTree(const std::string& path, const RemoveTreeOptions& options);
};

// Helpers built on the interface.

// Creates `path` and every missing parent. A symbolic link on the way (or at
// `path`) is taken as the operator's: a storage root may be one.
absl::Status CreateDirs(FileSystem* fs, const std::string& path);
// Removes `path` and everything below it; ok when absent. Removes a
// symbolic link itself, never what it points to (FileSystem::RemoveTree).
absl::Status RemoveTree(FileSystem* fs, const std::string& path);
absl::Status RemoveTree(FileSystem* fs, const std::string& path, const RemoveTreeOptions& options);
// Ok when `path` is a directory itself; kFailedPrecondition naming what it is
// instead (e.g. "<path> is a symbolic link, not a directory") for anything
// else; the file system's error (kNotFound when absent) otherwise. For the
// directories of a layout, which are never links: what a link points to is
// neither read nor removed.
absl::Status CheckIsDirectory(FileSystem* fs, const std::string& path);
// Reads a whole (small) file.
absl::StatusOr<std::string> ReadFileToString(FileSystem* fs, const std::string& path);
// Writes `contents` to `path` durably and atomically: write to `path` + ".tmp",
// fsync, rename over `path`, fsync the directory. The temp file is removed on
// failure.
absl::Status WriteFileAtomically(FileSystem* fs, const std::string& path, absl::string_view contents);

// Hands the completed writes of a file written front to back to
// StartWriteback, `every` bytes at a time, when the file is buffered
// (alignment() 1); does nothing for a file written direct or when `every`
// is 0. Used by one thread, as the file is.
class WritebackPacer {
 public:
  // `start`: the offset of the first byte written in order.
  WritebackPacer(WritableFile* file, uint64_t start, uint64_t every);
  // Every write below `end` has completed: starts writeback of what is not
  // yet handed over once that is at least `every` bytes. Returns the
  // file's StartWriteback error.
  absl::Status Completed(uint64_t end);

 private:
  WritableFile* const file_;
  const uint64_t every_;  // 0: off
  uint64_t next_ = 0;     // the first byte not yet handed to writeback
};

struct CopyOptions {
  // Bytes read and written at a time.
  size_t chunk_bytes = 4 << 20;
  // Asked before each chunk's write is submitted and once more before the
  // copy is made durable (truncate, fsync, rename): true stops the copy
  // there (kCancelled, naming the file and how far it got), and the temp
  // file is removed: nothing of the copy is left, and a `to` that existed
  // before is untouched. Null: never stops.
  std::function<bool()> stop;
  // A buffered copy (a destination that cannot be written direct) starts
  // writeback every this many bytes (WritebackPacer); 0: only the fsync
  // writes back.
  uint64_t writeback_bytes = kWritebackBytes;
};

// Copies `from` (on `from_fs`) to `to` (on `to_fs`) durably and atomically:
// into `to` + ".tmp" in chunks of `options.chunk_bytes`, reading the next
// chunk while the last one is written, then fsync, rename over `to`, fsync
// the directory. The temp file is removed on failure. Returns the bytes
// copied. Errors name the file and the side (reading or writing) that
// failed.
absl::StatusOr<uint64_t> CopyFileDurably(FileSystem* from_fs, const std::string& from, FileSystem* to_fs,
                                         const std::string& to, const CopyOptions& options = CopyOptions());

// Path helpers ("a/b" + "c" -> "a/b/c"; dirname of "a/b/c" is "a/b").
std::string JoinPath(absl::string_view a, absl::string_view b);
std::string DirName(absl::string_view path);
std::string BaseName(absl::string_view path);

}  // namespace ckptd::storage
