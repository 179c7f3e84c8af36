// A file system that keeps nothing: files opened for writing accept every
// write and drop its bytes, and Sync, Close, Truncate, Rename, CreateDir and
// SyncDir succeed without effect. Nothing can be read back: NewReadableFile,
// Stat and ListDir are kNotFound, and so are RemoveFile and RemoveDir (there
// is never anything to remove). Files report alignment() 1; Allocate is
// kUnimplemented (a writer goes on without).
//
// For what a write would produce without making it: storage::WriteShard into
// it returns the file_length, index and index_xxh3 of the shard it would
// have written (the agent's memory checkpoints are described to the
// coordinator this way). Safe to use from several threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "storage/file_system.h"

namespace ckptd::storage {

class DiscardingFileSystem : public FileSystem {
 public:
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
};

}  // namespace ckptd::storage
