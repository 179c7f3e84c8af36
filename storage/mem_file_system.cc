#include "storage/mem_file_system.h"

#include <cerrno>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/posix_error.h"
#include "base/status_macros.h"

namespace ckptd::storage {

// A file or a directory. All fields are guarded by FsState::mu (not annotated:
// the mutex lives in another object).
struct MemFileSystem::Node {
  explicit Node(bool dir) : is_directory(dir) {}

  const bool is_directory;
  // Files: the data as seen now, and as of the last WritableFile::Sync.
  std::string data;
  std::string durable_data;
  // Directories: the entries as seen now, and as of the last SyncDir.
  std::map<std::string, std::shared_ptr<Node>> entries;
  std::map<std::string, std::shared_ptr<Node>> durable_entries;
};

namespace {

using Node = MemFileSystem::Node;

// Components of `path`; empty and "." components are dropped, so "", "/" and
// "." all name the root.
std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (part == ".") continue;
    parts.emplace_back(part);
  }
  return parts;
}

absl::Status CrashedError(absl::string_view op, absl::string_view path) {
  return absl::AbortedError(absl::StrCat(op, " ", path, ": file handle invalidated by simulated crash"));
}

// Shared by the file system and its open handles.
struct FsState {
  absl::Mutex mu;
  const std::shared_ptr<Node> root = std::make_shared<Node>(/*dir=*/true);
  // Incremented by Crash(); handles opened in an older epoch are dead.
  uint64_t epoch ABSL_GUARDED_BY(mu) = 0;

  // The node at `path`, or ENOENT/ENOTDIR as a status with context `op path`.
  absl::StatusOr<std::shared_ptr<Node>> Resolve(absl::string_view op, const std::string& path)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::shared_ptr<Node> node = root;
    for (const std::string& part : SplitPath(path)) {
      if (!node->is_directory) return base::PosixError(absl::StrCat(op, " ", path), ENOTDIR);
      auto it = node->entries.find(part);
      if (it == node->entries.end()) return base::PosixError(absl::StrCat(op, " ", path), ENOENT);
      node = it->second;
    }
    return node;
  }

  struct Parent {
    std::shared_ptr<Node> dir;
    std::string name;  // empty for the root
  };

  // The directory that holds `path` and the entry name. The parent must exist.
  absl::StatusOr<Parent> ResolveParent(absl::string_view op, const std::string& path)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<std::string> parts = SplitPath(path);
    if (parts.empty()) return Parent{root, ""};
    std::shared_ptr<Node> node = root;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = node->entries.find(parts[i]);
      if (it == node->entries.end()) return base::PosixError(absl::StrCat(op, " ", path), ENOENT);
      node = it->second;
      if (!node->is_directory) return base::PosixError(absl::StrCat(op, " ", path), ENOTDIR);
    }
    return Parent{std::move(node), parts.back()};
  }
};

class MemWritableFile : public WritableFile {
 public:
  MemWritableFile(std::shared_ptr<FsState> state, std::shared_ptr<Node> node, std::string path,
                  uint64_t epoch)
      : state_(std::move(state)), node_(std::move(node)), path_(std::move(path)), epoch_(epoch) {}

  const std::string& path() const override { return path_; }
  size_t alignment() const override { return 1; }

  absl::StatusOr<uint64_t> Write(uint64_t offset, const void* data, size_t n) override {
    absl::MutexLock lock(&state_->mu);
    CKPTD_RETURN_IF_ERROR(Check("write"));
    if (offset + n < offset) {
      return base::PosixError(absl::StrCat("write ", path_), EFBIG);
    }
    std::string& contents = node_->data;
    if (contents.size() < offset + n) contents.resize(offset + n, '\0');
    if (n > 0) std::memcpy(contents.data() + offset, data, n);
    return next_ticket_++;
  }

  absl::Status WaitFor(uint64_t ticket) override {
    absl::MutexLock lock(&state_->mu);
    return Check("wait");
  }

  absl::Status WaitAll() override {
    absl::MutexLock lock(&state_->mu);
    return Check("wait");
  }

  absl::Status Allocate(uint64_t length) override {
    absl::MutexLock lock(&state_->mu);
    CKPTD_RETURN_IF_ERROR(Check("fallocate"));
    if (node_->data.size() < length) node_->data.resize(length, '\0');
    return absl::OkStatus();
  }

  absl::Status Truncate(uint64_t length) override {
    absl::MutexLock lock(&state_->mu);
    CKPTD_RETURN_IF_ERROR(Check("ftruncate"));
    node_->data.resize(length, '\0');
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    absl::MutexLock lock(&state_->mu);
    CKPTD_RETURN_IF_ERROR(Check("fsync"));
    node_->durable_data = node_->data;
    return absl::OkStatus();
  }

  // Nothing to start: only Sync makes data durable here, as on a disk whose
  // writeback a crash overtakes.
  absl::Status StartWriteback(uint64_t, uint64_t) override {
    absl::MutexLock lock(&state_->mu);
    return Check("sync_file_range");
  }

  absl::Status Close() override {
    absl::MutexLock lock(&state_->mu);
    CKPTD_RETURN_IF_ERROR(Check("close"));
    closed_ = true;
    return absl::OkStatus();
  }

 private:
  // REQUIRES: state_->mu held.
  absl::Status Check(absl::string_view op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    if (epoch_ != state_->epoch) return CrashedError(op, path_);
    if (closed_) return absl::FailedPreconditionError(absl::StrCat(op, " ", path_, ": file is closed"));
    return absl::OkStatus();
  }

  const std::shared_ptr<FsState> state_;
  const std::shared_ptr<Node> node_;
  const std::string path_;
  const uint64_t epoch_;
  uint64_t next_ticket_ ABSL_GUARDED_BY(state_->mu) = 0;
  bool closed_ ABSL_GUARDED_BY(state_->mu) = false;
};

class MemReadableFile : public ReadableFile {
 public:
  MemReadableFile(std::shared_ptr<FsState> state, std::shared_ptr<Node> node, std::string path,
                  uint64_t epoch, uint64_t size)
      : state_(std::move(state)),
        node_(std::move(node)),
        path_(std::move(path)),
        epoch_(epoch),
        size_(size) {}

  const std::string& path() const override { return path_; }
  size_t alignment() const override { return 1; }
  uint64_t size() const override { return size_; }

  absl::StatusOr<uint64_t> Read(uint64_t offset, void* buf, size_t n) override {
    absl::MutexLock lock(&state_->mu);
    CKPTD_RETURN_IF_ERROR(Check("read"));
    if (!error_.ok()) return error_;
    const std::string& contents = node_->data;
    if (offset + n < offset || offset + n > contents.size()) {
      // Recorded and reported by WaitFor, as a queued read would be.
      error_ = absl::DataLossError(absl::StrCat("read ", path_, ": file truncated: ", n,
                                                " bytes at offset ", offset, " past size ",
                                                contents.size()));
    } else if (n > 0) {
      std::memcpy(buf, contents.data() + offset, n);
    }
    return next_ticket_++;
  }

  absl::Status WaitFor(uint64_t ticket) override {
    absl::MutexLock lock(&state_->mu);
    CKPTD_RETURN_IF_ERROR(Check("wait"));
    return error_;
  }

  absl::Status WaitAll() override {
    absl::MutexLock lock(&state_->mu);
    CKPTD_RETURN_IF_ERROR(Check("wait"));
    return error_;
  }

  absl::Status Close() override {
    absl::MutexLock lock(&state_->mu);
    CKPTD_RETURN_IF_ERROR(Check("close"));
    closed_ = true;
    return error_;
  }

 private:
  absl::Status Check(absl::string_view op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    if (epoch_ != state_->epoch) return CrashedError(op, path_);
    if (closed_) return absl::FailedPreconditionError(absl::StrCat(op, " ", path_, ": file is closed"));
    return absl::OkStatus();
  }

  const std::shared_ptr<FsState> state_;
  const std::shared_ptr<Node> node_;
  const std::string path_;
  const uint64_t epoch_;
  const uint64_t size_;
  uint64_t next_ticket_ ABSL_GUARDED_BY(state_->mu) = 0;
  bool closed_ ABSL_GUARDED_BY(state_->mu) = false;
  absl::Status error_ ABSL_GUARDED_BY(state_->mu);  // first failed read
};

// Whether `node` is `ancestor` or lies below it in the current tree.
bool IsWithin(const Node* ancestor, const Node* node) {
  if (ancestor == node) return true;
  if (!ancestor->is_directory) return false;
  for (const auto& [name, child] : ancestor->entries) {
    if (child->is_directory && IsWithin(child.get(), node)) return true;
  }
  return false;
}

// Reverts `node` and everything reachable from it to its durable state.
void RevertToDurable(Node* node, std::set<const Node*>* visited) {
  if (!visited->insert(node).second) return;
  if (!node->is_directory) {
    node->data = node->durable_data;
    return;
  }
  node->entries = node->durable_entries;
  for (const auto& [name, child] : node->entries) RevertToDurable(child.get(), visited);
}

// What Stat and ListDir report. Memory holds no links, FIFOs or devices.
FileInfo InfoOf(const std::string& name, const Node& node) {
  return FileInfo{name, node.is_directory ? FileType::kDirectory : FileType::kRegular, node.is_directory,
                  node.is_directory ? 0 : node.data.size()};
}

}  // namespace

struct MemFileSystem::State : FsState {};

MemFileSystem::MemFileSystem() : state_(std::make_shared<State>()) {}

MemFileSystem::~MemFileSystem() = default;

absl::StatusOr<std::unique_ptr<WritableFile>> MemFileSystem::NewWritableFile(
    const std::string& path, const OpenOptions& options) {
  absl::MutexLock lock(&state_->mu);
  CKPTD_ASSIGN_OR_RETURN(FsState::Parent parent, state_->ResolveParent("open", path));
  if (parent.name.empty()) return base::PosixError(absl::StrCat("open ", path), EISDIR);
  std::shared_ptr<Node>& slot = parent.dir->entries[parent.name];
  if (slot == nullptr) {
    slot = std::make_shared<Node>(/*dir=*/false);
  } else if (slot->is_directory) {
    return base::PosixError(absl::StrCat("open ", path), EISDIR);
  } else {
    slot->data.clear();  // O_TRUNC; durable once synced
  }
  return std::make_unique<MemWritableFile>(state_, slot, path, state_->epoch);
}

absl::StatusOr<std::unique_ptr<ReadableFile>> MemFileSystem::NewReadableFile(
    const std::string& path, const OpenOptions& options) {
  absl::MutexLock lock(&state_->mu);
  CKPTD_ASSIGN_OR_RETURN(std::shared_ptr<Node> node, state_->Resolve("open", path));
  if (node->is_directory) return base::PosixError(absl::StrCat("open ", path), EISDIR);
  const uint64_t size = node->data.size();
  return std::make_unique<MemReadableFile>(state_, std::move(node), path, state_->epoch, size);
}

absl::Status MemFileSystem::CreateDir(const std::string& path) {
  absl::MutexLock lock(&state_->mu);
  CKPTD_ASSIGN_OR_RETURN(FsState::Parent parent, state_->ResolveParent("mkdir", path));
  if (parent.name.empty()) return absl::OkStatus();  // the root
  auto it = parent.dir->entries.find(parent.name);
  if (it != parent.dir->entries.end()) {
    if (it->second->is_directory) return absl::OkStatus();
    return base::PosixError(absl::StrCat("mkdir ", path), EEXIST);
  }
  parent.dir->entries.emplace(parent.name, std::make_shared<Node>(/*dir=*/true));
  return absl::OkStatus();
}

absl::Status MemFileSystem::RemoveFile(const std::string& path) {
  absl::MutexLock lock(&state_->mu);
  CKPTD_ASSIGN_OR_RETURN(FsState::Parent parent, state_->ResolveParent("unlink", path));
  if (parent.name.empty()) return base::PosixError(absl::StrCat("unlink ", path), EISDIR);
  auto it = parent.dir->entries.find(parent.name);
  if (it == parent.dir->entries.end()) return base::PosixError(absl::StrCat("unlink ", path), ENOENT);
  if (it->second->is_directory) return base::PosixError(absl::StrCat("unlink ", path), EISDIR);
  parent.dir->entries.erase(it);
  return absl::OkStatus();
}

absl::Status MemFileSystem::RemoveDir(const std::string& path) {
  absl::MutexLock lock(&state_->mu);
  CKPTD_ASSIGN_OR_RETURN(FsState::Parent parent, state_->ResolveParent("rmdir", path));
  if (parent.name.empty()) return base::PosixError(absl::StrCat("rmdir ", path), EBUSY);
  auto it = parent.dir->entries.find(parent.name);
  if (it == parent.dir->entries.end()) return base::PosixError(absl::StrCat("rmdir ", path), ENOENT);
  if (!it->second->is_directory) return base::PosixError(absl::StrCat("rmdir ", path), ENOTDIR);
  if (!it->second->entries.empty()) return base::PosixError(absl::StrCat("rmdir ", path), ENOTEMPTY);
  parent.dir->entries.erase(it);
  return absl::OkStatus();
}

absl::Status MemFileSystem::Rename(const std::string& from, const std::string& to) {
  absl::MutexLock lock(&state_->mu);
  const std::string context = absl::StrCat("rename ", from, " -> ", to);
  absl::StatusOr<FsState::Parent> src = state_->ResolveParent("rename", from);
  if (!src.ok()) return base::PosixError(context, ENOENT);
  absl::StatusOr<FsState::Parent> dst = state_->ResolveParent("rename", to);
  if (!dst.ok()) return base::PosixError(context, ENOENT);
  if (src->name.empty() || dst->name.empty()) return base::PosixError(context, EBUSY);
  auto src_it = src->dir->entries.find(src->name);
  if (src_it == src->dir->entries.end()) return base::PosixError(context, ENOENT);
  std::shared_ptr<Node> node = src_it->second;
  auto dst_it = dst->dir->entries.find(dst->name);
  if (dst_it != dst->dir->entries.end()) {
    const std::shared_ptr<Node>& target = dst_it->second;
    if (target == node) return absl::OkStatus();  // same file: POSIX does nothing
    if (node->is_directory && !target->is_directory) return base::PosixError(context, ENOTDIR);
    if (!node->is_directory && target->is_directory) return base::PosixError(context, EISDIR);
    if (target->is_directory && !target->entries.empty()) return base::PosixError(context, ENOTEMPTY);
  }
  if (node->is_directory && IsWithin(node.get(), dst->dir.get())) return base::PosixError(context, EINVAL);
  dst->dir->entries[dst->name] = node;
  src->dir->entries.erase(src->name);
  return absl::OkStatus();
}

absl::Status MemFileSystem::SyncDir(const std::string& path) {
  absl::MutexLock lock(&state_->mu);
  CKPTD_ASSIGN_OR_RETURN(std::shared_ptr<Node> node, state_->Resolve("fsync dir", path));
  if (!node->is_directory) return base::PosixError(absl::StrCat("fsync dir ", path), ENOTDIR);
  node->durable_entries = node->entries;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<FileInfo>> MemFileSystem::ListDir(const std::string& path) {
  absl::MutexLock lock(&state_->mu);
  CKPTD_ASSIGN_OR_RETURN(std::shared_ptr<Node> node, state_->Resolve("opendir", path));
  if (!node->is_directory) return base::PosixError(absl::StrCat("opendir ", path), ENOTDIR);
  std::vector<FileInfo> infos;
  infos.reserve(node->entries.size());
  for (const auto& [name, child] : node->entries) {
    infos.push_back(InfoOf(name, *child));
  }
  return infos;
}

absl::StatusOr<FileInfo> MemFileSystem::Stat(const std::string& path) {
  absl::MutexLock lock(&state_->mu);
  CKPTD_ASSIGN_OR_RETURN(std::shared_ptr<Node> node, state_->Resolve("stat", path));
  return InfoOf(path, *node);
}

void MemFileSystem::Crash() {
  absl::MutexLock lock(&state_->mu);
  ++state_->epoch;
  std::set<const Node*> visited;
  RevertToDurable(state_->root.get(), &visited);
}

absl::Status MemFileSystem::SetFileContents(const std::string& path, std::string contents) {
  absl::MutexLock lock(&state_->mu);
  CKPTD_ASSIGN_OR_RETURN(FsState::Parent parent, state_->ResolveParent("open", path));
  if (parent.name.empty()) return base::PosixError(absl::StrCat("open ", path), EISDIR);
  std::shared_ptr<Node>& slot = parent.dir->entries[parent.name];
  if (slot == nullptr) {
    slot = std::make_shared<Node>(/*dir=*/false);
  } else if (slot->is_directory) {
    return base::PosixError(absl::StrCat("open ", path), EISDIR);
  }
  slot->durable_data = contents;
  slot->data = std::move(contents);
  parent.dir->durable_entries[parent.name] = slot;
  return absl::OkStatus();
}

}  // namespace ckptd::storage
