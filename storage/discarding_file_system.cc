#include "storage/discarding_file_system.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ckptd::storage {
namespace {

absl::Status NothingKept(absl::string_view op, absl::string_view path) {
  return absl::NotFoundError(absl::StrCat(op, " ", path, ": the discarding file system keeps nothing"));
}

// Takes every write and drops it. Tickets only need to be distinct; every
// transfer is complete (and never failed) as soon as it is queued.
class DiscardingFile : public WritableFile {
 public:
  explicit DiscardingFile(std::string path) : path_(std::move(path)) {}

  const std::string& path() const override { return path_; }
  size_t alignment() const override { return 1; }
  absl::StatusOr<uint64_t> Write(uint64_t, const void*, size_t) override { return next_ticket_++; }
  absl::Status WaitFor(uint64_t) override { return absl::OkStatus(); }
  absl::Status WaitAll() override { return absl::OkStatus(); }
  absl::Status Allocate(uint64_t) override {
    return absl::UnimplementedError(absl::StrCat("allocate ", path_, ": the discarding file system reserves nothing"));
  }
  absl::Status Truncate(uint64_t) override { return absl::OkStatus(); }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::Status StartWriteback(uint64_t, uint64_t) override { return absl::OkStatus(); }
  absl::Status Close() override { return absl::OkStatus(); }

 private:
  const std::string path_;
  uint64_t next_ticket_ = 1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<WritableFile>> DiscardingFileSystem::NewWritableFile(const std::string& path,
                                                                                    const OpenOptions&) {
  return std::make_unique<DiscardingFile>(path);
}

absl::StatusOr<std::unique_ptr<ReadableFile>> DiscardingFileSystem::NewReadableFile(const std::string& path,
                                                                                    const OpenOptions&) {
  return NothingKept("open", path);
}

absl::Status DiscardingFileSystem::CreateDir(const std::string&) { return absl::OkStatus(); }

absl::Status DiscardingFileSystem::RemoveFile(const std::string& path) { return NothingKept("remove", path); }

absl::Status DiscardingFileSystem::RemoveDir(const std::string& path) { return NothingKept("rmdir", path); }

absl::Status DiscardingFileSystem::Rename(const std::string&, const std::string&) { return absl::OkStatus(); }

absl::Status DiscardingFileSystem::SyncDir(const std::string&) { return absl::OkStatus(); }

absl::StatusOr<std::vector<FileInfo>> DiscardingFileSystem::ListDir(const std::string& path) {
  return NothingKept("list", path);
}

absl::StatusOr<FileInfo> DiscardingFileSystem::Stat(const std::string& path) { return NothingKept("stat", path); }

}  // namespace ckptd::storage
