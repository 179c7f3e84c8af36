#include "storage/file_system.h"

#include "absl/strings/string_view.h"
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/aligned_buffer.h"
#include "base/status_macros.h"

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

absl::string_view FileTypeName(FileType type) {
  switch (type) {
    case FileType::kRegular:
      return "regular file";
    case FileType::kDirectory:
      return "directory";
    case FileType::kSymlink:
      return "symbolic link";
    case FileType::kOther:
      return "FIFO, socket or device";
  }
  return "unknown file type";
}

absl::Status CreateDirs(FileSystem* fs, const std::string& path) {
  if (path.empty() || path == "/" || path == ".") return absl::OkStatus();
  absl::StatusOr<FileInfo> info = fs->Stat(path);
  if (info.ok()) {
    // A link here is one the operator made (e.g. the root on another disk):
    // the paths through it follow it, and whatever it points to is checked
    // by the first mkdir or open below it.
    if (info->is_directory || info->type == FileType::kSymlink) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a directory"));
  }
  if (!absl::IsNotFound(info.status())) return info.status();
  CKPTD_RETURN_IF_ERROR(CreateDirs(fs, DirName(path)));
  return fs->CreateDir(path);
}

absl::Status FileSystem::RemoveTree(const std::string& path, const RemoveTreeOptions& options) {
  if (!options.links_allowed_up_to.empty()) {
    std::string base = options.links_allowed_up_to;
    while (base.size() > 1 && base.back() == '/') base.pop_back();
    const std::string prefix = base == "/" ? base : absl::StrCat(base, "/");
    if (!absl::StartsWith(path, prefix)) {
      return absl::InvalidArgumentError(absl::StrCat("remove ", path, ": not below ", base));
    }
    std::string at = base;
    for (absl::string_view c : absl::StrSplit(absl::string_view(path).substr(prefix.size()), '/', absl::SkipEmpty())) {
      at = JoinPath(at, c);
      absl::StatusOr<FileInfo> step = Stat(at);
      if (absl::IsNotFound(step.status())) return absl::OkStatus();
      CKPTD_RETURN_IF_ERROR(step.status());
      if (!step->is_directory) {
        return absl::FailedPreconditionError(
            absl::StrCat(at, " is a ", FileTypeName(step->type), ", not a directory: left alone"));
      }
    }
  }
  absl::StatusOr<FileInfo> info = Stat(path);
  if (absl::IsNotFound(info.status())) return absl::OkStatus();
  CKPTD_RETURN_IF_ERROR(info.status());
  if (info->is_directory && !options.remove_first.empty()) {
    bool removed = false;
    for (const std::string& name : options.remove_first) {
      absl::Status s = RemoveFile(JoinPath(path, name));
      if (!s.ok() && !absl::IsNotFound(s)) return s;
      removed |= s.ok();
    }
    if (removed) CKPTD_RETURN_IF_ERROR(SyncDir(path));
  }
  // Stat does not follow links: a link is removed as a file is.
  if (!info->is_directory) return RemoveFile(path);
  CKPTD_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, ListDir(path));
  const size_t batch = std::max<size_t>(options.batch, 1);
  for (size_t i = 0; i < entries.size(); ++i) {
    if (options.before_batch && i % batch == 0) CKPTD_RETURN_IF_ERROR(options.before_batch(i));
    CKPTD_RETURN_IF_ERROR(RemoveTree(JoinPath(path, entries[i].name), RemoveTreeOptions()));
  }
  return RemoveDir(path);
}

absl::Status RemoveTree(FileSystem* fs, const std::string& path) { return fs->RemoveTree(path, RemoveTreeOptions()); }

absl::Status RemoveTree(FileSystem* fs, const std::string& path, const RemoveTreeOptions& options) {
  return fs->RemoveTree(path, options);
}

absl::Status CheckIsDirectory(FileSystem* fs, const std::string& path) {
  CKPTD_ASSIGN_OR_RETURN(FileInfo info, fs->Stat(path));
  if (info.is_directory) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(path, " is a ", FileTypeName(info.type), ", not a directory"));
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

WritebackPacer::WritebackPacer(WritableFile* file, uint64_t start, uint64_t every)
    : file_(file), every_(file->alignment() <= 1 ? every : 0), next_(start) {}

absl::Status WritebackPacer::Completed(uint64_t end) {
  if (every_ == 0 || end <= next_ || end - next_ < every_) return absl::OkStatus();
  const uint64_t offset = next_;
  next_ = end;
  return file_->StartWriteback(offset, end - offset);
}

absl::StatusOr<uint64_t> CopyFileDurably(FileSystem* from_fs, const std::string& from, FileSystem* to_fs,
                                         const std::string& to, const CopyOptions& options) {
  const std::string tmp = absl::StrCat(to, ".tmp");
  auto in_context = [&](const absl::Status& s, absl::string_view what) {
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  };
  auto stopped = [&](absl::string_view how_far) {
    return absl::CancelledError(absl::StrCat("copy of ", from, " to ", to, " stopped with ", how_far,
                                             "; nothing of the copy is kept"));
  };
  // The source is read buffered (its tail is not a whole block); the copy is
  // written direct where the file system allows, padded to the block and cut
  // back to the source's length at the end.
  OpenOptions read_options;
  read_options.direct_io = false;
  absl::StatusOr<std::unique_ptr<ReadableFile>> in = from_fs->NewReadableFile(from, read_options);
  if (!in.ok()) return in_context(in.status(), absl::StrCat("copy: reading ", from));
  const uint64_t length = (*in)->size();
  absl::StatusOr<uint64_t> copied = [&]() -> absl::StatusOr<uint64_t> {
    // Declared before the file: on an early return the file (whose
    // destructor waits for queued writes) goes first, then the buffers.
    base::AlignedBuffer buffers[2];
    absl::StatusOr<std::unique_ptr<WritableFile>> out = to_fs->NewWritableFile(tmp, OpenOptions());
    if (!out.ok()) return in_context(out.status(), absl::StrCat("copy: creating ", tmp));
    const size_t align = std::max<size_t>((*out)->alignment(), 1);
    const size_t chunk = base::AlignUp(std::max<size_t>(options.chunk_bytes, align), align);
    if (absl::Status s = length == 0 ? absl::OkStatus() : (*out)->Allocate(base::AlignUp(length, align));
        !s.ok() && !absl::IsUnimplemented(s)) {
      return in_context(s, absl::StrCat("copy: reserving ", length, " bytes for ", tmp));
    }
    for (base::AlignedBuffer& b : buffers) b = base::AlignedBuffer(chunk, std::max<size_t>(align, base::kDirectIoAlignment));
    WritebackPacer writeback(out->get(), 0, options.writeback_bytes);
    // Chunk i is read into buffers[i % 2]; its write is queued while chunk
    // i + 1 is read into the other buffer.
    std::optional<uint64_t> pending_write;  // ticket of the write of the previous chunk
    uint64_t offset = 0;
    for (int i = 0; offset < length; ++i, offset += chunk) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, length - offset));
      base::AlignedBuffer& buf = buffers[i % 2];
      if (absl::Status s = (*in)->ReadAt(offset, buf.data(), n); !s.ok()) {
        return in_context(s, absl::StrCat("copy: reading ", from, " at ", offset));
      }
      if (pending_write) {
        absl::Status s = (*out)->WaitFor(*pending_write);
        if (s.ok()) s = writeback.Completed(offset);
        if (!s.ok()) return in_context(s, absl::StrCat("copy: writing ", tmp));
      }
      if (options.stop && options.stop()) return stopped(absl::StrCat(offset, " of ", length, " bytes written"));
      const size_t padded = base::AlignUp(n, align);
      if (padded > n) std::memset(buf.data() + n, 0, padded - n);
      absl::StatusOr<uint64_t> ticket = (*out)->Write(offset, buf.data(), padded);
      if (!ticket.ok()) return in_context(ticket.status(), absl::StrCat("copy: writing ", tmp, " at ", offset));
      pending_write = *ticket;
    }
    absl::Status s = (*out)->WaitAll();
    if (!s.ok()) return in_context(s, absl::StrCat("copy: writing ", tmp));
    if (options.stop && options.stop()) {
      return stopped(absl::StrCat("all ", length, " bytes written, before the fsync and rename"));
    }
    s = (*out)->Truncate(length);
    if (s.ok()) s = (*out)->Sync();
    if (s.ok()) s = (*out)->Close();
    if (!s.ok()) return in_context(s, absl::StrCat("copy: writing ", tmp));
    if (s = to_fs->Rename(tmp, to); !s.ok()) return in_context(s, absl::StrCat("copy: renaming ", tmp));
    if (s = to_fs->SyncDir(DirName(to)); !s.ok()) return in_context(s, absl::StrCat("copy: syncing ", DirName(to)));
    return length;
  }();
  (void)(*in)->Close();
  if (!copied.ok()) (void)to_fs->RemoveFile(tmp);  // best effort: it may not exist
  return copied;
}

}  // namespace ckptd::storage
