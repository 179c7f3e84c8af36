// A FileSystem wrapper that injects faults for tests: EIO, ENOSPC, short
// writes, slow I/O, and a simulated crash at a chosen operation number.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "storage/file_system.h"

namespace ckptd::storage {

enum class Fault {
  kNone,
  kEio,         // the operation fails with EIO (kDataLoss)
  kEnospc,      // the operation fails with ENOSPC (kResourceExhausted)
  kShortWrite,  // a write stores only its first half, then fails with ENOSPC
  kCrash,       // the crash callback runs; this and every later operation fail (kAborted)
};

// Which operations a path rule applies to.
enum class FaultScope {
  kAll,     // every operation on a matching path
  kWrites,  // only those that write: open for writing, write, fallocate,
            // ftruncate, fsync of a written file, mkdir, rename (a full disk)
};

// Operations counted: every FileSystem call, and every Write, Read, Sync and
// Close on files opened through the wrapper. Numbering starts at 0 after
// construction or Reset(). StartWriteback is forwarded and recorded
// (writebacks()), not counted: it makes nothing durable.
class FaultInjectionFileSystem : public FileSystem {
 public:
  // `base` must outlive the wrapper. `on_crash` runs once when a kCrash fault
  // fires (e.g. [&] { mem_fs.Crash(); }).
  explicit FaultInjectionFileSystem(FileSystem* base, std::function<void()> on_crash = nullptr);
  ~FaultInjectionFileSystem() override;

  // Makes operation number `op` fail with `fault`.
  void FailAtOperation(uint64_t op, Fault fault);
  // Makes every write fail with `fault` once `bytes` more bytes have been
  // written through the wrapper (a disk that fills up).
  void FailWritesAfterBytes(uint64_t bytes, Fault fault = Fault::kEnospc);
  // Makes every operation (in `scope`) whose path contains `path_substring`
  // fail with `fault`. Rules for different substrings apply together; a new
  // rule for the same substring replaces the old one, and kNone removes it.
  void FailPath(const std::string& path_substring, Fault fault, FaultScope scope = FaultScope::kAll);
  // Removes the FailPath rule for exactly `path_substring` (others stay).
  void ClearPath(const std::string& path_substring);
  // Adds `delay` to every read and write.
  void SetLatency(absl::Duration delay);
  // Adds `delay` to every read and write whose path contains
  // `path_substring`, on top of SetLatency's; zero removes the rule.
  void SlowPath(const std::string& path_substring, absl::Duration delay);
  // Clears all faults, the crash flag, the operation counter and the
  // writebacks recorded.
  void Reset();

  uint64_t operation_count() const;
  bool crashed() const;

  // WritableFile::StartWriteback calls made through the wrapper, oldest
  // first: the newest kMaxWritebacksRecorded.
  static constexpr size_t kMaxWritebacksRecorded = 1024;
  struct Writeback {
    std::string path;
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  std::vector<Writeback> writebacks() const;

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

  // Internal, used by the wrapped files: counts one operation on `path` and
  // returns the fault to apply (kNone to proceed). `write_bytes` is the size
  // of a write, 0 otherwise; `writes` says whether the operation writes
  // (FaultScope::kWrites rules apply only then).
  Fault NextOperation(const std::string& path, uint64_t write_bytes, bool writes = false);
  // Internal, used by the wrapped files: records a StartWriteback.
  void RecordWriteback(const std::string& path, uint64_t offset, uint64_t length);
  // SetLatency's delay.
  absl::Duration latency() const;
  // The delay of a read or write of `path`: SetLatency's plus every
  // matching SlowPath rule's.
  absl::Duration LatencyFor(const std::string& path) const;

 private:
  // NextOperation for an operation on one or more paths (a rename has two);
  // a FailPath rule matches when any of them contains the substring.
  Fault Next(std::initializer_list<absl::string_view> paths, uint64_t write_bytes, bool writes);

  FileSystem* const base_;
  std::function<void()> on_crash_;
  mutable absl::Mutex mu_;
  uint64_t ops_ ABSL_GUARDED_BY(mu_) = 0;
  // Operation number -> fault; each entry fires once.
  std::map<uint64_t, Fault> fail_ops_ ABSL_GUARDED_BY(mu_);
  // Bytes that may still be written before writes fail with bytes_fault_.
  uint64_t bytes_budget_ ABSL_GUARDED_BY(mu_) = UINT64_MAX;
  Fault bytes_fault_ ABSL_GUARDED_BY(mu_) = Fault::kNone;
  bool disk_full_ ABSL_GUARDED_BY(mu_) = false;  // a write exceeded the budget
  struct PathRule {
    Fault fault = Fault::kNone;
    FaultScope scope = FaultScope::kAll;
  };
  std::map<std::string, PathRule> path_rules_ ABSL_GUARDED_BY(mu_);  // by substring
  absl::Duration latency_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  std::map<std::string, absl::Duration> slow_paths_ ABSL_GUARDED_BY(mu_);  // by substring
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Writeback> writebacks_ ABSL_GUARDED_BY(mu_);
};

// The status a fault turns into, naming the operation and path.
absl::Status FaultStatus(Fault fault, absl::string_view operation, absl::string_view path);

}  // namespace ckptd::storage
