// An in-memory file system that models what survives a crash: file data
// becomes durable at WritableFile::Sync, directory entries (creations, renames,
// removals) at SyncDir of their directory. Crash() throws away everything else,
// as a power loss would on a strict POSIX file system.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "storage/file_system.h"

namespace ckptd::storage {

class MemFileSystem : public FileSystem {
 public:
  MemFileSystem();
  ~MemFileSystem() override;

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                                const OpenOptions& options) override;
  absl::StatusOr<std::unique_ptr<ReadableFile>> NewReadableFile(const std::string& path,
                                                                const OpenOptions& options) override;
  absl::Status CreateDir(const std::string& path) override;
  absl::Status RemoveFile(const std::string& path) override;
  absl::Status RemoveDir(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::StatusOr<std::vector<FileInfo>> ListDir(const std::string& path) override;
  absl::StatusOr<FileInfo> Stat(const std::string& path) override;

  // Drops every change that was not made durable. Files opened before the
  // crash fail every later call with kAborted.
  void Crash();

  // Test access: replaces the current and durable contents of an existing file
  // (to plant corruption) or creates it durably.
  absl::Status SetFileContents(const std::string& path, std::string contents);

  struct Node;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace ckptd::storage
