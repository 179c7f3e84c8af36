#include "objstore/routing_file_system.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "objstore/storage_root.h"

namespace ckptd::objstore {

absl::StatusOr<storage::FileSystem*> RoutingFileSystem::For(const std::string& path) {
  if (!IsObjectStoreRoot(path)) return local_;
  absl::MutexLock l(&mu_);
  if (remote_ == nullptr) {
    // The bucket is checked by the first request on it, which names it.
    OpenRootOptions options;
    options.check_bucket = false;
    CKPTD_ASSIGN_OR_RETURN(StorageRoot root, OpenStorageRoot(path, local_, options));
    remote_ = std::move(root.owned);
  }
  return remote_.get();
}

absl::StatusOr<std::unique_ptr<storage::WritableFile>> RoutingFileSystem::NewWritableFile(
    const std::string& path, const storage::OpenOptions& options) {
  CKPTD_ASSIGN_OR_RETURN(storage::FileSystem * fs, For(path));
  return fs->NewWritableFile(path, options);
}

absl::StatusOr<std::unique_ptr<storage::ReadableFile>> RoutingFileSystem::NewReadableFile(
    const std::string& path, const storage::OpenOptions& options) {
  CKPTD_ASSIGN_OR_RETURN(storage::FileSystem * fs, For(path));
  return fs->NewReadableFile(path, options);
}

absl::Status RoutingFileSystem::CreateDir(const std::string& path) {
  CKPTD_ASSIGN_OR_RETURN(storage::FileSystem * fs, For(path));
  return fs->CreateDir(path);
}

absl::Status RoutingFileSystem::RemoveFile(const std::string& path) {
  CKPTD_ASSIGN_OR_RETURN(storage::FileSystem * fs, For(path));
  return fs->RemoveFile(path);
}

absl::Status RoutingFileSystem::RemoveDir(const std::string& path) {
  CKPTD_ASSIGN_OR_RETURN(storage::FileSystem * fs, For(path));
  return fs->RemoveDir(path);
}

absl::Status RoutingFileSystem::Rename(const std::string& from, const std::string& to) {
  if (IsObjectStoreRoot(from) != IsObjectStoreRoot(to)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot rename ", from, " to ", to, ": not on one file system"));
  }
  CKPTD_ASSIGN_OR_RETURN(storage::FileSystem * fs, For(from));
  return fs->Rename(from, to);
}

absl::Status RoutingFileSystem::SyncDir(const std::string& path) {
  CKPTD_ASSIGN_OR_RETURN(storage::FileSystem * fs, For(path));
  return fs->SyncDir(path);
}

absl::StatusOr<std::vector<storage::FileInfo>> RoutingFileSystem::ListDir(const std::string& path) {
  CKPTD_ASSIGN_OR_RETURN(storage::FileSystem * fs, For(path));
  return fs->ListDir(path);
}

absl::StatusOr<storage::FileInfo> RoutingFileSystem::Stat(const std::string& path) {
  CKPTD_ASSIGN_OR_RETURN(storage::FileSystem * fs, For(path));
  return fs->Stat(path);
}

absl::Status RoutingFileSystem::RemoveTree(const std::string& path, const storage::RemoveTreeOptions& options) {
  CKPTD_ASSIGN_OR_RETURN(storage::FileSystem * fs, For(path));
  return fs->RemoveTree(path, options);
}

}  // namespace ckptd::objstore
