#include "storage/fault_injection_file_system.h"

#include <cerrno>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/posix_error.h"
#include "base/status_macros.h"

namespace ckptd::storage {

absl::Status FaultStatus(Fault fault, absl::string_view operation, absl::string_view path) {
  const std::string context = absl::StrCat(operation, " ", path);
  switch (fault) {
    case Fault::kNone:
      return absl::OkStatus();
    case Fault::kEio:
      return base::PosixError(context, EIO);
    case Fault::kEnospc:
    case Fault::kShortWrite:
      return base::PosixError(context, ENOSPC);
    case Fault::kCrash:
      return absl::AbortedError(absl::StrCat(context, ": simulated crash"));
  }
  return absl::InternalError(absl::StrCat(context, ": unknown fault"));
}

namespace {

// What a fault-injecting file and reader share: the wrapped `File` (a
// WritableFile or a ReadableFile), the first injected failure, which every
// later call returns, and the calls both have.
template <typename File>
class FaultFile : public File {
 public:
  FaultFile(FaultInjectionFileSystem* fs, std::unique_ptr<File> base) : fs_(fs), base_(std::move(base)) {}

  const std::string& path() const override { return base_->path(); }
  size_t alignment() const override { return base_->alignment(); }

  absl::Status WaitFor(uint64_t ticket) override {
    CKPTD_RETURN_IF_ERROR(CheckCrashed("wait"));
    if (!error_.ok()) return error_;
    return base_->WaitFor(ticket);
  }

  absl::Status WaitAll() override {
    CKPTD_RETURN_IF_ERROR(CheckCrashed("wait"));
    if (!error_.ok()) return error_;
    return base_->WaitAll();
  }

  absl::Status Close() override {
    const Fault fault = fs_->NextOperation(path(), 0);
    // The base file is closed in every case, as close(2) releases the fd even
    // when it reports an error.
    absl::Status status = base_->Close();
    if (fault != Fault::kNone) return Fail(FaultStatus(fault, "close", path()));
    if (!error_.ok()) return error_;
    return status;
  }

 protected:
  // Counts a read or write (of `write_bytes`) as an operation and waits the
  // latency set for the path; returns the fault to inject.
  Fault BeginTransfer(uint64_t write_bytes, bool writes) {
    const Fault fault = fs_->NextOperation(path(), write_bytes, writes);
    const absl::Duration delay = fs_->LatencyFor(path());
    if (delay > absl::ZeroDuration()) absl::SleepFor(delay);
    return fault;
  }

  // Records the first error (later calls return it) and returns `status`.
  absl::Status Fail(absl::Status status) {
    if (error_.ok()) error_ = status;
    return status;
  }

  absl::Status CheckCrashed(absl::string_view op) const {
    if (fs_->crashed()) return FaultStatus(Fault::kCrash, op, path());
    return absl::OkStatus();
  }

  FaultInjectionFileSystem* const fs_;
  const std::unique_ptr<File> base_;
  absl::Status error_;  // first injected failure; a file is used by one thread
};

class FaultWritableFile final : public FaultFile<WritableFile> {
 public:
  using FaultFile::FaultFile;

  absl::StatusOr<uint64_t> Write(uint64_t offset, const void* data, size_t n) override {
    const Fault fault = BeginTransfer(n, /*writes=*/true);
    if (fault == Fault::kShortWrite) {
      // Store the first half (rounded down to the alignment), then report ENOSPC.
      const size_t align = alignment() == 0 ? 1 : alignment();
      const size_t half = n / 2 / align * align;
      if (half > 0) {
        absl::StatusOr<uint64_t> ticket = base_->Write(offset, data, half);
        absl::Status status = ticket.ok() ? base_->WaitFor(*ticket) : ticket.status();
        if (!status.ok()) return Fail(std::move(status));
      }
    }
    if (fault != Fault::kNone) return Fail(FaultStatus(fault, "write", path()));
    if (!error_.ok()) return error_;
    return base_->Write(offset, data, n);
  }

  absl::Status Allocate(uint64_t length) override {
    const Fault fault = fs_->NextOperation(path(), 0, /*writes=*/true);
    if (fault == Fault::kCrash) return Fail(FaultStatus(fault, "fallocate", path()));
    // A failed reservation leaves the file usable, as fallocate(2) does.
    if (fault != Fault::kNone) return FaultStatus(fault, "fallocate", path());
    if (!error_.ok()) return error_;
    return base_->Allocate(length);
  }

  absl::Status Truncate(uint64_t length) override {
    const Fault fault = fs_->NextOperation(path(), 0, /*writes=*/true);
    if (fault != Fault::kNone) return Fail(FaultStatus(fault, "ftruncate", path()));
    if (!error_.ok()) return error_;
    return base_->Truncate(length);
  }

  absl::Status Sync() override {
    const Fault fault = fs_->NextOperation(path(), 0, /*writes=*/true);
    if (fault != Fault::kNone) return Fail(FaultStatus(fault, "fsync", path()));
    if (!error_.ok()) return error_;
    return base_->Sync();
  }

  // Forwarded, not counted as an operation (a hint that changes nothing
  // durable), but recorded (writebacks()).
  absl::Status StartWriteback(uint64_t offset, uint64_t length) override {
    CKPTD_RETURN_IF_ERROR(CheckCrashed("sync_file_range"));
    if (!error_.ok()) return error_;
    fs_->RecordWriteback(path(), offset, length);
    return base_->StartWriteback(offset, length);
  }
};

class FaultReadableFile final : public FaultFile<ReadableFile> {
 public:
  using FaultFile::FaultFile;

  uint64_t size() const override { return base_->size(); }

  absl::StatusOr<uint64_t> Read(uint64_t offset, void* buf, size_t n) override {
    const Fault fault = BeginTransfer(0, /*writes=*/false);
    if (fault != Fault::kNone) return Fail(FaultStatus(fault, "read", path()));
    if (!error_.ok()) return error_;
    return base_->Read(offset, buf, n);
  }
};

}  // namespace

FaultInjectionFileSystem::FaultInjectionFileSystem(FileSystem* base, std::function<void()> on_crash)
    : base_(base), on_crash_(std::move(on_crash)) {}

FaultInjectionFileSystem::~FaultInjectionFileSystem() = default;

void FaultInjectionFileSystem::FailAtOperation(uint64_t op, Fault fault) {
  absl::MutexLock lock(&mu_);
  if (fault == Fault::kNone) {
    fail_ops_.erase(op);
  } else {
    fail_ops_[op] = fault;
  }
}

void FaultInjectionFileSystem::FailWritesAfterBytes(uint64_t bytes, Fault fault) {
  absl::MutexLock lock(&mu_);
  bytes_budget_ = bytes;
  bytes_fault_ = fault;
  disk_full_ = false;
}

void FaultInjectionFileSystem::FailPath(const std::string& path_substring, Fault fault, FaultScope scope) {
  absl::MutexLock lock(&mu_);
  if (fault == Fault::kNone) {
    path_rules_.erase(path_substring);
  } else {
    path_rules_[path_substring] = PathRule{fault, scope};
  }
}

void FaultInjectionFileSystem::ClearPath(const std::string& path_substring) {
  absl::MutexLock lock(&mu_);
  path_rules_.erase(path_substring);
}

void FaultInjectionFileSystem::SetLatency(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  latency_ = delay;
}

void FaultInjectionFileSystem::SlowPath(const std::string& path_substring, absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  if (delay <= absl::ZeroDuration()) {
    slow_paths_.erase(path_substring);
  } else {
    slow_paths_[path_substring] = delay;
  }
}

void FaultInjectionFileSystem::Reset() {
  absl::MutexLock lock(&mu_);
  ops_ = 0;
  fail_ops_.clear();
  bytes_budget_ = UINT64_MAX;
  bytes_fault_ = Fault::kNone;
  disk_full_ = false;
  path_rules_.clear();
  latency_ = absl::ZeroDuration();
  slow_paths_.clear();
  crashed_ = false;
  writebacks_.clear();
}

std::vector<FaultInjectionFileSystem::Writeback> FaultInjectionFileSystem::writebacks() const {
  absl::MutexLock lock(&mu_);
  return writebacks_;
}

void FaultInjectionFileSystem::RecordWriteback(const std::string& path, uint64_t offset, uint64_t length) {
  absl::MutexLock lock(&mu_);
  // Bounded: the wrapper also serves agents started with --allow-drills.
  if (writebacks_.size() >= kMaxWritebacksRecorded) writebacks_.erase(writebacks_.begin());
  writebacks_.push_back({path, offset, length});
}

uint64_t FaultInjectionFileSystem::operation_count() const {
  absl::MutexLock lock(&mu_);
  return ops_;
}

bool FaultInjectionFileSystem::crashed() const {
  absl::MutexLock lock(&mu_);
  return crashed_;
}

absl::Duration FaultInjectionFileSystem::latency() const {
  absl::MutexLock lock(&mu_);
  return latency_;
}

absl::Duration FaultInjectionFileSystem::LatencyFor(const std::string& path) const {
  absl::MutexLock lock(&mu_);
  absl::Duration delay = latency_;
  for (const auto& [substring, extra] : slow_paths_) {
    if (absl::StrContains(path, substring)) delay += extra;
  }
  return delay;
}

Fault FaultInjectionFileSystem::NextOperation(const std::string& path, uint64_t write_bytes, bool writes) {
  return Next({path}, write_bytes, writes);
}

Fault FaultInjectionFileSystem::Next(std::initializer_list<absl::string_view> paths, uint64_t write_bytes,
                                     bool writes) {
  Fault fault = Fault::kNone;
  {
    absl::MutexLock lock(&mu_);
    const uint64_t op = ops_++;
    if (crashed_) return Fault::kCrash;
    if (auto it = fail_ops_.find(op); it != fail_ops_.end()) {
      fault = it->second;
      fail_ops_.erase(it);
    }
    for (const auto& [substring, rule] : path_rules_) {
      if (fault != Fault::kNone) break;
      if (rule.scope == FaultScope::kWrites && !writes) continue;
      for (absl::string_view path : paths) {
        if (absl::StrContains(path, substring)) fault = rule.fault;
      }
    }
    if (fault == Fault::kNone && write_bytes > 0 && bytes_fault_ != Fault::kNone) {
      if (disk_full_ || write_bytes > bytes_budget_) {
        disk_full_ = true;
        fault = bytes_fault_;
      } else {
        bytes_budget_ -= write_bytes;
      }
    }
    if (fault != Fault::kCrash) return fault;
    crashed_ = true;
  }
  // Outside mu_, so the callback may call back into this wrapper.
  if (on_crash_) on_crash_();
  return Fault::kCrash;
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionFileSystem::NewWritableFile(
    const std::string& path, const OpenOptions& options) {
  const Fault fault = NextOperation(path, 0, /*writes=*/true);
  if (fault != Fault::kNone) return FaultStatus(fault, "open", path);
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, base_->NewWritableFile(path, options));
  return std::make_unique<FaultWritableFile>(this, std::move(file));
}

absl::StatusOr<std::unique_ptr<ReadableFile>> FaultInjectionFileSystem::NewReadableFile(
    const std::string& path, const OpenOptions& options) {
  const Fault fault = NextOperation(path, 0);
  if (fault != Fault::kNone) return FaultStatus(fault, "open", path);
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file, base_->NewReadableFile(path, options));
  return std::make_unique<FaultReadableFile>(this, std::move(file));
}

absl::Status FaultInjectionFileSystem::CreateDir(const std::string& path) {
  const Fault fault = NextOperation(path, 0, /*writes=*/true);
  if (fault != Fault::kNone) return FaultStatus(fault, "mkdir", path);
  return base_->CreateDir(path);
}

absl::Status FaultInjectionFileSystem::RemoveFile(const std::string& path) {
  const Fault fault = NextOperation(path, 0);
  if (fault != Fault::kNone) return FaultStatus(fault, "unlink", path);
  return base_->RemoveFile(path);
}

absl::Status FaultInjectionFileSystem::RemoveDir(const std::string& path) {
  const Fault fault = NextOperation(path, 0);
  if (fault != Fault::kNone) return FaultStatus(fault, "rmdir", path);
  return base_->RemoveDir(path);
}

absl::Status FaultInjectionFileSystem::Rename(const std::string& from, const std::string& to) {
  const Fault fault = Next({from, to}, 0, /*writes=*/true);
  if (fault != Fault::kNone) return FaultStatus(fault, "rename", absl::StrCat(from, " -> ", to));
  return base_->Rename(from, to);
}

absl::Status FaultInjectionFileSystem::SyncDir(const std::string& path) {
  const Fault fault = NextOperation(path, 0);
  if (fault != Fault::kNone) return FaultStatus(fault, "fsync dir", path);
  return base_->SyncDir(path);
}

absl::StatusOr<std::vector<FileInfo>> FaultInjectionFileSystem::ListDir(const std::string& path) {
  const Fault fault = NextOperation(path, 0);
  if (fault != Fault::kNone) return FaultStatus(fault, "opendir", path);
  return base_->ListDir(path);
}

absl::StatusOr<FileInfo> FaultInjectionFileSystem::Stat(const std::string& path) {
  const Fault fault = NextOperation(path, 0);
  if (fault != Fault::kNone) return FaultStatus(fault, "stat", path);
  return base_->Stat(path);
}

}  // namespace ckptd::storage
