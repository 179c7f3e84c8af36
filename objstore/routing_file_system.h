// A FileSystem that sends each path to the file system that serves it:
// s3:// URLs to an object store (made on first use, from the environment's
// S3 settings), everything else to a POSIX file system. For commands that
// take paths of both kinds in one run (ckptctl export reads a root in a
// bucket and writes a local directory).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "storage/file_system.h"

namespace ckptd::objstore {

class RoutingFileSystem final : public storage::FileSystem {
 public:
  // `local` serves every path that is not an s3:// URL; it must outlive this.
  explicit RoutingFileSystem(storage::FileSystem* local) : local_(local) {}

  absl::StatusOr<std::unique_ptr<storage::WritableFile>> NewWritableFile(const std::string& path,
                                                                        const storage::OpenOptions& options) override;
  absl::StatusOr<std::unique_ptr<storage::ReadableFile>> NewReadableFile(const std::string& path,
                                                                        const storage::OpenOptions& options) override;
  absl::Status CreateDir(const std::string& path) override;
  absl::Status RemoveFile(const std::string& path) override;
  absl::Status RemoveDir(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::StatusOr<std::vector<storage::FileInfo>> ListDir(const std::string& path) override;
  absl::StatusOr<storage::FileInfo> Stat(const std::string& path) override;
  absl::Status RemoveTree(const std::string& path, const storage::RemoveTreeOptions& options) override;

 private:
  // The file system for `path`: the object store's error when it cannot be
  // reached (no credentials, a malformed setting).
  absl::StatusOr<storage::FileSystem*> For(const std::string& path);

  storage::FileSystem* const local_;
  absl::Mutex mu_;
  std::unique_ptr<storage::FileSystem> remote_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd::objstore
