#include "storage/file_system.h"

#include "absl/strings/string_view.h"
#include <string>

#include "absl/strings/str_cat.h"
#include "storage/status_macros.h"

namespace ckptd::storage {

absl::Status ReadableFile::ReadAt(uint64_t offset, void* buf, size_t n) {
  CKPTD_ASSIGN_OR_RETURN(uint64_t ticket, Read(offset, buf, n));
  return WaitFor(ticket);
}

std::string JoinPath(absl::string_view a, absl::string_view b) {
  if (a.empty()) return std::string(b);
  if (b.empty()) return std::string(a);
  if (a.back() == '/') return absl::StrCat(a, b);
  return absl::StrCat(a, "/", b);
}

std::string DirName(absl::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  size_t slash = path.rfind('/');
  if (slash == absl::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

std::string BaseName(absl::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  size_t slash = path.rfind('/');
  if (slash == absl::string_view::npos) return std::string(path);
  return std::string(path.substr(slash + 1));
}

absl::Status CreateDirs(FileSystem* fs, const std::string& path) {
  if (path.empty() || path == "/" || path == ".") return absl::OkStatus();
  absl::StatusOr<FileInfo> info = fs->Stat(path);
  if (info.ok()) {
    if (info->is_directory) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a directory"));
  }
  if (!absl::IsNotFound(info.status())) return info.status();
  CKPTD_RETURN_IF_ERROR(CreateDirs(fs, DirName(path)));
  return fs->CreateDir(path);
}

absl::Status RemoveTree(FileSystem* fs, const std::string& path) {
  absl::StatusOr<FileInfo> info = fs->Stat(path);
  if (absl::IsNotFound(info.status())) return absl::OkStatus();
  CKPTD_RETURN_IF_ERROR(info.status());
  if (!info->is_directory) return fs->RemoveFile(path);
  CKPTD_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs->ListDir(path));
  for (const FileInfo& e : entries) {
    CKPTD_RETURN_IF_ERROR(RemoveTree(fs, JoinPath(path, e.name)));
  }
  return fs->RemoveDir(path);
}

absl::StatusOr<std::string> ReadFileToString(FileSystem* fs, const std::string& path) {
  OpenOptions options;
  options.direct_io = false;
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file, fs->NewReadableFile(path, options));
  std::string contents(file->size(), '\0');
  if (!contents.empty()) CKPTD_RETURN_IF_ERROR(file->ReadAt(0, contents.data(), contents.size()));
  CKPTD_RETURN_IF_ERROR(file->Close());
  return contents;
}

absl::Status WriteFileAtomically(FileSystem* fs, const std::string& path, absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  OpenOptions options;
  options.direct_io = false;
  absl::Status status = [&]() -> absl::Status {
    CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewWritableFile(tmp, options));
    if (!contents.empty()) {
      CKPTD_ASSIGN_OR_RETURN(uint64_t ticket, file->Write(0, contents.data(), contents.size()));
      CKPTD_RETURN_IF_ERROR(file->WaitFor(ticket));
    }
    CKPTD_RETURN_IF_ERROR(file->Sync());
    CKPTD_RETURN_IF_ERROR(file->Close());
    CKPTD_RETURN_IF_ERROR(fs->Rename(tmp, path));
    return fs->SyncDir(DirName(path));
  }();
  if (!status.ok()) {
    // Best effort: the temp file may not exist, or the disk may be gone.
    (void)fs->RemoveFile(tmp);
  }
  return status;
}

}  // namespace ckptd::storage
