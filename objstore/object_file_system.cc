#include "objstore/object_file_system.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "storage/layout.h"

namespace ckptd::objstore {
namespace {

constexpr uint64_t kDefaultPartBytes = uint64_t{16} << 20;
constexpr uint64_t kMinPartBytes = uint64_t{5} << 20;
constexpr uint64_t kMaxParts = 9000;  // S3 allows 10,000: room for a file longer than its hint
// A read larger than this goes as several ranged GETs in parallel.
constexpr uint64_t kRangeBytes = uint64_t{8} << 20;

absl::StatusOr<ObjectUrl> Locate(const std::string& path) { return ParseObjectUrl(path); }

std::string DirPrefix(const ObjectUrl& url) { return url.key.empty() ? "" : absl::StrCat(url.key, "/"); }

absl::Status InContext(const absl::Status& s, absl::string_view what) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

}  // namespace

// ---------------------------------------------------------------------------
// Writer: parts are copied out of the caller's buffer at once, and each part
// is uploaded as soon as every byte of it has been written (the shard
// writer's header, written last at offset 0, holds back only the first).

class ObjectStoreFileSystem::Writer final : public storage::WritableFile {
 public:
  Writer(ObjectStoreFileSystem* fs, std::string path, ObjectUrl url, bool staged, uint64_t part_bytes)
      : fs_(fs),
        path_(std::move(path)),
        url_(std::move(url)),
        staged_(staged),
        part_bytes_(part_bytes),
        max_inflight_(std::max(2, fs->options().max_connections / 2)) {}

  ~Writer() override {
    if (closed_) return;
    absl::Status ignored = WaitAll();
    Abandon();
  }

  const std::string& path() const override { return path_; }
  size_t alignment() const override { return 1; }

  absl::StatusOr<uint64_t> Write(uint64_t offset, const void* data, size_t n) override {
    CKPTD_RETURN_IF_ERROR(Usable());
    const char* src = static_cast<const char*>(data);
    while (n > 0) {
      const uint64_t index = offset / part_bytes_;
      const uint64_t in = offset % part_bytes_;
      const uint64_t take = std::min<uint64_t>(n, part_bytes_ - in);
      Part& part = parts_[index];
      if (part.shipped) {
        return Fail(absl::FailedPreconditionError(
            absl::StrCat(path_, ": a write at byte ", offset, " rewrites part ", index + 1,
                         ", which is already uploaded (an object store file is written once, front to back)")));
      }
      if (part.data == nullptr) part.data.reset(new char[part_bytes_]());
      std::memcpy(part.data.get() + in, src, take);
      part.Cover(in, in + take);
      src += take;
      offset += take;
      n -= take;
      end_ = std::max(end_, offset);
      if (part.covered == part_bytes_) CKPTD_RETURN_IF_ERROR(Ship(index, part_bytes_));
    }
    return ++tickets_;
  }

  absl::Status WaitFor(uint64_t) override { return Sticky(); }

  absl::Status WaitAll() override {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &inflight_));
    return error_;
  }

  // Nothing to reserve; the size is the hint for the part size.
  absl::Status Allocate(uint64_t length) override {
    if (parts_.empty() && fs_->options().part_bytes == 0) part_bytes_ = fs_->PartBytesFor(length);
    return absl::UnimplementedError("an object store has no space to reserve");
  }

  absl::Status Truncate(uint64_t length) override {
    CKPTD_RETURN_IF_ERROR(Usable());
    CKPTD_RETURN_IF_ERROR(WaitAll());
    for (auto it = parts_.begin(); it != parts_.end();) {
      const uint64_t start = it->first * part_bytes_;
      if (start + part_bytes_ > length && it->second.shipped) {
        return Fail(absl::UnimplementedError(absl::StrCat(path_, ": cannot truncate to ", length, " bytes: part ",
                                                          it->first + 1, " is already uploaded")));
      }
      if (start >= length) {
        it = parts_.erase(it);
      } else {
        it->second.Cover(length - start, part_bytes_);  // bytes past the end count as settled
        ++it;
      }
    }
    end_ = length;
    return absl::OkStatus();
  }

  // Uploads every part not yet sent; a file of one part that never started
  // an upload stays in memory for one PUT when it is committed.
  absl::Status Sync() override {
    CKPTD_RETURN_IF_ERROR(Usable());
    if (synced_) return WaitAll();
    const uint64_t size = end_;
    const uint64_t count = size == 0 ? 0 : (size - 1) / part_bytes_ + 1;
    if (upload_id_.empty() && count <= 1) {
      auto it = parts_.find(0);
      inline_data_.assign(size, '\0');
      if (it != parts_.end() && size > 0) std::memcpy(inline_data_.data(), it->second.data.get(), size);
      parts_.clear();
      synced_ = true;
      return absl::OkStatus();
    }
    for (uint64_t index = 0; index < count; ++index) {
      Part& part = parts_[index];
      if (part.shipped) continue;
      if (part.data == nullptr) part.data.reset(new char[part_bytes_]());  // a hole reads as zeros
      CKPTD_RETURN_IF_ERROR(Ship(index, std::min(part_bytes_, size - index * part_bytes_)));
    }
    CKPTD_RETURN_IF_ERROR(WaitAll());
    synced_ = true;
    return absl::OkStatus();
  }

  absl::Status Close() override {
    if (closed_) return Sticky();
    absl::Status s = Sync();
    closed_ = true;
    if (!s.ok()) {
      Abandon();
      return s;
    }
    Staged staged;
    staged.bucket = url_.bucket;
    staged.key = url_.key;
    staged.upload_id = upload_id_;
    staged.data = std::move(inline_data_);
    staged.size = end_;
    {
      absl::MutexLock l(&mu_);
      for (auto& [number, etag] : etags_) staged.parts.push_back({number, etag});
    }
    std::sort(staged.parts.begin(), staged.parts.end(),
              [](const CompletedPart& a, const CompletedPart& b) { return a.number < b.number; });
    if (staged_) {
      fs_->Stage(path_, std::move(staged));
      return absl::OkStatus();
    }
    return fs_->Commit(path_, std::move(staged));
  }

 private:
  struct Part {
    std::unique_ptr<char[]> data;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;  // written, merged
    uint64_t covered = 0;
    bool shipped = false;

    void Cover(uint64_t begin, uint64_t end) {
      if (begin >= end) return;
      ranges.emplace_back(begin, end);
      std::sort(ranges.begin(), ranges.end());
      std::vector<std::pair<uint64_t, uint64_t>> merged;
      for (const auto& r : ranges) {
        if (!merged.empty() && r.first <= merged.back().second) {
          merged.back().second = std::max(merged.back().second, r.second);
        } else {
          merged.push_back(r);
        }
      }
      ranges = std::move(merged);
      covered = 0;
      for (const auto& r : ranges) covered += r.second - r.first;
    }
  };

  absl::Status Sticky() {
    absl::MutexLock l(&mu_);
    return error_;
  }
  absl::Status Usable() {
    if (closed_) return absl::FailedPreconditionError(absl::StrCat(path_, " is closed"));
    return Sticky();
  }
  absl::Status Fail(absl::Status s) {
    absl::MutexLock l(&mu_);
    if (error_.ok()) error_ = s;
    return error_;
  }

  // Sends part `index` (its first `length` bytes) in the background, once
  // fewer than max_inflight_ are on their way.
  absl::Status Ship(uint64_t index, uint64_t length) {
    if (index + 1 > 10000) {
      return Fail(absl::ResourceExhaustedError(
          absl::StrCat(path_, ": over 10,000 parts of ", part_bytes_, " bytes (the S3 limit)")));
    }
    if (upload_id_.empty()) {
      absl::StatusOr<std::string> id = fs_->client_->CreateUpload(url_.bucket, url_.key);
      if (!id.ok()) return Fail(id.status());
      upload_id_ = *id;
      fs_->NoteUpload(upload_id_, true);
    }
    Part& part = parts_[index];
    part.shipped = true;
    std::shared_ptr<char[]> data(part.data.release());
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &Writer::HasRoom));
      if (!error_.ok()) return error_;
      ++inflight_;
    }
    const int number = static_cast<int>(index) + 1;
    fs_->pool_.Schedule([this, data, length, number] {
      absl::StatusOr<std::string> etag =
          fs_->client_->UploadPart(url_.bucket, url_.key, upload_id_, number, absl::string_view(data.get(), length));
      absl::MutexLock l(&mu_);
      if (etag.ok()) {
        etags_[number] = *etag;
      } else if (error_.ok()) {
        error_ = etag.status();
      }
      --inflight_;
    });
    return absl::OkStatus();
  }

  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return inflight_ < max_inflight_ || !error_.ok(); }

  // Nothing of this file is kept: its upload is aborted.
  void Abandon() {
    if (upload_id_.empty()) return;
    absl::Status ignored = fs_->client_->AbortUpload(url_.bucket, url_.key, upload_id_);
    fs_->NoteUpload(upload_id_, false);
    upload_id_.clear();
  }

  ObjectStoreFileSystem* const fs_;
  const std::string path_;
  const ObjectUrl url_;
  const bool staged_;
  uint64_t part_bytes_;
  const int max_inflight_;

  std::map<uint64_t, Part> parts_;  // not yet shipped (and shipped markers)
  uint64_t end_ = 0;
  uint64_t tickets_ = 0;
  std::string upload_id_;
  std::string inline_data_;
  bool synced_ = false;
  bool closed_ = false;

  absl::Mutex mu_;
  int inflight_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, std::string> etags_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------
// Reader: each Read is one or more ranged GETs in the background, pinned to
// the ETag the object had when it was opened.

class ObjectStoreFileSystem::Reader final : public storage::ReadableFile {
 public:
  Reader(ObjectStoreFileSystem* fs, std::string path, ObjectUrl url, ObjectInfo info)
      : fs_(fs), path_(std::move(path)), url_(std::move(url)), info_(std::move(info)) {}
  ~Reader() override { absl::Status ignored = WaitAll(); }

  const std::string& path() const override { return path_; }
  size_t alignment() const override { return 1; }
  uint64_t size() const override { return info_.size; }

  absl::StatusOr<uint64_t> Read(uint64_t offset, void* buf, size_t n) override {
    if (offset > info_.size || n > info_.size - offset) {
      return absl::DataLossError(absl::StrCat(path_, " is truncated: reading bytes ", offset, "-", offset + n,
                                              " of an object of ", info_.size, " bytes"));
    }
    absl::MutexLock l(&mu_);
    if (!error_.ok()) return error_;
    const uint64_t ticket = ++tickets_;
    if (n == 0) return ticket;
    const int pieces = static_cast<int>((n - 1) / kRangeBytes + 1);
    pending_[ticket] = pieces;
    for (int i = 0; i < pieces; ++i) {
      const uint64_t at = static_cast<uint64_t>(i) * kRangeBytes;
      const uint64_t len = std::min<uint64_t>(kRangeBytes, n - at);
      char* dst = static_cast<char*>(buf) + at;
      fs_->pool_.Schedule([this, ticket, offset, at, len, dst] {
        absl::Status s = fs_->client_->GetRange(url_.bucket, url_.key, offset + at, len, dst, info_.etag);
        if (absl::IsFailedPrecondition(s)) {
          s = absl::DataLossError(absl::StrCat(path_, " changed while it was read (its ETag is no longer ", info_.etag,
                                               "): ", s.message()));
        }
        absl::MutexLock l2(&mu_);
        if (!s.ok() && error_.ok()) error_ = s;
        if (--pending_[ticket] == 0) pending_.erase(ticket);
      });
    }
    return ticket;
  }

  absl::Status WaitFor(uint64_t ticket) override {
    absl::MutexLock l(&mu_);
    auto done = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_.count(ticket) == 0; };
    mu_.Await(absl::Condition(&done));
    return error_;
  }

  absl::Status WaitAll() override {
    absl::MutexLock l(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_.empty(); };
    mu_.Await(absl::Condition(&done));
    return error_;
  }

  absl::Status Close() override { return WaitAll(); }

 private:
  ObjectStoreFileSystem* const fs_;
  const std::string path_;
  const ObjectUrl url_;
  const ObjectInfo info_;

  absl::Mutex mu_;
  uint64_t tickets_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, int> pending_ ABSL_GUARDED_BY(mu_);  // ticket -> ranges still in flight
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ObjectStoreFileSystem>> ObjectStoreFileSystem::Create(S3Options options,
                                                                                     S3Client::FaultHook fault) {
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> client, S3Client::Create(std::move(options), std::move(fault)));
  return std::unique_ptr<ObjectStoreFileSystem>(new ObjectStoreFileSystem(std::move(client)));
}

ObjectStoreFileSystem::ObjectStoreFileSystem(std::unique_ptr<S3Client> client)
    : client_(std::move(client)), pool_(client_->options().max_connections) {}

ObjectStoreFileSystem::~ObjectStoreFileSystem() {
  // Temp files never renamed: their uploads go.
  absl::MutexLock l(&mu_);
  for (auto& [path, s] : staged_) {
    if (!s.upload_id.empty()) absl::Status ignored = client_->AbortUpload(s.bucket, s.key, s.upload_id);
  }
}

uint64_t ObjectStoreFileSystem::PartBytesFor(uint64_t size_hint) const {
  if (options().part_bytes != 0) return options().part_bytes;
  uint64_t part = kDefaultPartBytes;
  if (size_hint / part > kMaxParts) {
    const uint64_t mib = uint64_t{1} << 20;
    part = ((size_hint / kMaxParts) + mib) / mib * mib;
  }
  return std::max(part, kMinPartBytes);
}

void ObjectStoreFileSystem::NoteUpload(const std::string& upload_id, bool open) {
  absl::MutexLock l(&mu_);
  if (open) {
    ++open_uploads_[upload_id];
  } else {
    open_uploads_.erase(upload_id);
  }
}

bool ObjectStoreFileSystem::UploadIsOurs(const std::string& upload_id) {
  absl::MutexLock l(&mu_);
  return open_uploads_.count(upload_id) != 0;
}

void ObjectStoreFileSystem::Stage(const std::string& tmp_path, Staged staged) {
  absl::MutexLock l(&mu_);
  auto it = staged_.find(tmp_path);
  if (it != staged_.end() && !it->second.upload_id.empty()) {
    // The same temp name written again: the older upload is dropped.
    absl::Status ignored = client_->AbortUpload(it->second.bucket, it->second.key, it->second.upload_id);
    open_uploads_.erase(it->second.upload_id);
  }
  staged_[tmp_path] = std::move(staged);
}

absl::Status ObjectStoreFileSystem::Commit(const std::string& from, Staged staged) {
  const std::string url = ObjectUrl{staged.bucket, staged.key}.ToString();
  if (staged.upload_id.empty()) {
    return InContext(client_->Put(staged.bucket, staged.key, staged.data).status(), absl::StrCat("writing ", url));
  }
  absl::StatusOr<std::string> etag = client_->CompleteUpload(staged.bucket, staged.key, staged.upload_id, staged.parts);
  if (!etag.ok()) {
    absl::Status ignored = client_->AbortUpload(staged.bucket, staged.key, staged.upload_id);
  }
  NoteUpload(staged.upload_id, false);
  return InContext(etag.status(), absl::StrCat("completing ", url, " from ", from));
}

absl::StatusOr<std::unique_ptr<storage::WritableFile>> ObjectStoreFileSystem::NewWritableFile(
    const std::string& path, const storage::OpenOptions&) {
  CKPTD_ASSIGN_OR_RETURN(ObjectUrl url, Locate(path));
  if (url.key.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " is a bucket, not a file"));
  const bool staged = absl::EndsWith(url.key, storage::kTempSuffix) && url.key.size() > storage::kTempSuffix.size();
  if (staged) url.key.resize(url.key.size() - storage::kTempSuffix.size());
  return std::unique_ptr<storage::WritableFile>(new Writer(this, path, std::move(url), staged, PartBytesFor(0)));
}

absl::StatusOr<std::unique_ptr<storage::ReadableFile>> ObjectStoreFileSystem::NewReadableFile(
    const std::string& path, const storage::OpenOptions&) {
  CKPTD_ASSIGN_OR_RETURN(ObjectUrl url, Locate(path));
  if (url.key.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " is a bucket, not a file"));
  absl::StatusOr<ObjectInfo> info = client_->Head(url.bucket, url.key);
  if (absl::IsNotFound(info.status())) return absl::NotFoundError(absl::StrCat(path, ": no such object"));
  CKPTD_RETURN_IF_ERROR(info.status());
  return std::unique_ptr<storage::ReadableFile>(new Reader(this, path, std::move(url), std::move(*info)));
}

absl::Status ObjectStoreFileSystem::CreateDir(const std::string& path) {
  CKPTD_ASSIGN_OR_RETURN(ObjectUrl url, Locate(path));
  if (url.key.empty()) return client_->HeadBucket(url.bucket);
  return InContext(client_->Put(url.bucket, DirPrefix(url), "").status(), absl::StrCat("creating ", path));
}

absl::Status ObjectStoreFileSystem::RemoveFile(const std::string& path) {
  CKPTD_ASSIGN_OR_RETURN(ObjectUrl url, Locate(path));
  if (url.key.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " is a bucket, not a file"));
  std::optional<Staged> staged;
  {
    absl::MutexLock l(&mu_);
    auto it = staged_.find(path);
    if (it != staged_.end()) {
      staged = std::move(it->second);
      staged_.erase(it);
    }
  }
  if (staged) {
    if (staged->upload_id.empty()) return absl::OkStatus();
    NoteUpload(staged->upload_id, false);
    return client_->AbortUpload(staged->bucket, staged->key, staged->upload_id);
  }
  if (absl::EndsWith(url.key, storage::kTempSuffix)) {
    // Another process's temp file: its open uploads.
    const std::string key = url.key.substr(0, url.key.size() - storage::kTempSuffix.size());
    CKPTD_ASSIGN_OR_RETURN(std::vector<UploadInfo> uploads, client_->ListUploads(url.bucket, key));
    int aborted = 0;
    for (const UploadInfo& u : uploads) {
      if (u.key != key || UploadIsOurs(u.upload_id)) continue;
      CKPTD_RETURN_IF_ERROR(client_->AbortUpload(url.bucket, u.key, u.upload_id));
      ++aborted;
    }
    if (aborted > 0) return absl::OkStatus();
  }
  absl::StatusOr<ObjectInfo> info = client_->Head(url.bucket, url.key);
  if (absl::IsNotFound(info.status())) return absl::NotFoundError(absl::StrCat(path, ": no such object"));
  CKPTD_RETURN_IF_ERROR(info.status());
  return client_->Delete(url.bucket, url.key);
}

absl::Status ObjectStoreFileSystem::RemoveDir(const std::string& path) {
  CKPTD_ASSIGN_OR_RETURN(ObjectUrl url, Locate(path));
  if (url.key.empty()) return absl::InvalidArgumentError(absl::StrCat("refusing to remove the bucket ", path));
  const std::string prefix = DirPrefix(url);
  CKPTD_ASSIGN_OR_RETURN(ListResult list, client_->List(url.bucket, prefix, "/", 2));
  bool marker = false;
  for (const ObjectInfo& o : list.objects) {
    if (o.key == prefix) {
      marker = true;
    } else {
      return absl::FailedPreconditionError(absl::StrCat(path, " is not empty"));
    }
  }
  if (!list.prefixes.empty()) return absl::FailedPreconditionError(absl::StrCat(path, " is not empty"));
  if (!marker) return absl::NotFoundError(absl::StrCat(path, ": no such directory"));
  return client_->Delete(url.bucket, prefix);
}

absl::Status ObjectStoreFileSystem::Rename(const std::string& from, const std::string& to) {
  std::optional<Staged> staged;
  {
    absl::MutexLock l(&mu_);
    auto it = staged_.find(from);
    if (it != staged_.end()) {
      const std::string target = ObjectUrl{it->second.bucket, it->second.key}.ToString();
      if (to != target) {
        return absl::UnimplementedError(absl::StrCat("an object store cannot rename ", from, " to ", to,
                                                     ": a temp file becomes ", target, " only"));
      }
      staged = std::move(it->second);
      staged_.erase(it);
    }
  }
  if (!staged) {
    return absl::UnimplementedError(absl::StrCat("an object store cannot rename ", from, " to ", to,
                                                 " (only a temp file written here becomes the object it names)"));
  }
  return Commit(from, std::move(*staged));
}

absl::Status ObjectStoreFileSystem::SyncDir(const std::string& path) {
  CKPTD_ASSIGN_OR_RETURN(ObjectUrl url, Locate(path));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<storage::FileInfo>> ObjectStoreFileSystem::ListDir(const std::string& path) {
  CKPTD_ASSIGN_OR_RETURN(ObjectUrl url, Locate(path));
  const std::string prefix = DirPrefix(url);
  absl::StatusOr<ListResult> list = client_->List(url.bucket, prefix, "/");
  if (absl::IsNotFound(list.status())) {
    return absl::NotFoundError(absl::StrCat(path, ": the bucket does not exist (", list.status().message(), ")"));
  }
  CKPTD_RETURN_IF_ERROR(list.status());
  std::vector<storage::FileInfo> out;
  bool marker = false;
  for (const ObjectInfo& o : list->objects) {
    if (o.key == prefix) {
      marker = true;
      continue;
    }
    storage::FileInfo f;
    f.name = o.key.substr(prefix.size());
    f.type = storage::FileType::kRegular;
    f.size = o.size;
    out.push_back(std::move(f));
  }
  for (const std::string& p : list->prefixes) {
    storage::FileInfo f;
    f.name = p.substr(prefix.size());
    while (!f.name.empty() && f.name.back() == '/') f.name.pop_back();
    if (f.name.empty()) continue;  // "key//": not a name this layout makes
    f.type = storage::FileType::kDirectory;
    f.is_directory = true;
    out.push_back(std::move(f));
  }
  if (out.empty() && !marker && !url.key.empty()) {
    return absl::NotFoundError(absl::StrCat(path, ": no such directory"));
  }
  std::sort(out.begin(), out.end(),
            [](const storage::FileInfo& a, const storage::FileInfo& b) { return a.name < b.name; });
  return out;
}

absl::StatusOr<storage::FileInfo> ObjectStoreFileSystem::Stat(const std::string& path) {
  CKPTD_ASSIGN_OR_RETURN(ObjectUrl url, Locate(path));
  storage::FileInfo f;
  f.name = path;
  if (url.key.empty()) {
    absl::Status s = client_->HeadBucket(url.bucket);
    // Not kNotFound: nothing above a bucket can be created.
    if (absl::IsNotFound(s)) return absl::FailedPreconditionError(s.message());
    CKPTD_RETURN_IF_ERROR(s);
    f.type = storage::FileType::kDirectory;
    f.is_directory = true;
    return f;
  }
  absl::StatusOr<ObjectInfo> info = client_->Head(url.bucket, url.key);
  if (info.ok()) {
    f.size = info->size;
    return f;
  }
  if (!absl::IsNotFound(info.status())) return info.status();
  {
    absl::MutexLock l(&mu_);
    auto it = staged_.find(path);
    if (it != staged_.end()) {
      f.size = it->second.size;
      return f;
    }
  }
  CKPTD_ASSIGN_OR_RETURN(ListResult list, client_->List(url.bucket, DirPrefix(url), "", 1));
  if (list.objects.empty() && list.prefixes.empty()) return absl::NotFoundError(absl::StrCat(path, ": not found"));
  f.type = storage::FileType::kDirectory;
  f.is_directory = true;
  return f;
}

absl::Status ObjectStoreFileSystem::RemoveTree(const std::string& path, const storage::RemoveTreeOptions& options) {
  CKPTD_ASSIGN_OR_RETURN(ObjectUrl url, Locate(path));
  if (url.key.empty()) return absl::InvalidArgumentError(absl::StrCat("refusing to remove the bucket ", path));
  // A file at `path` itself.
  absl::StatusOr<ObjectInfo> self = client_->Head(url.bucket, url.key);
  if (self.ok()) return client_->Delete(url.bucket, url.key);
  if (!absl::IsNotFound(self.status())) return self.status();

  const std::string prefix = DirPrefix(url);
  CKPTD_ASSIGN_OR_RETURN(ListResult list, client_->List(url.bucket, prefix));
  std::vector<std::string> first, rest;
  bool marker = false;
  for (const ObjectInfo& o : list.objects) {
    if (o.key == prefix) {
      marker = true;
      continue;
    }
    const std::string name = o.key.substr(prefix.size());
    if (std::find(options.remove_first.begin(), options.remove_first.end(), name) != options.remove_first.end()) {
      first.push_back(o.key);
    } else {
      rest.push_back(o.key);
    }
  }
  // What makes a step committed goes first, on its own.
  if (!first.empty()) CKPTD_RETURN_IF_ERROR(InContext(client_->DeleteMany(url.bucket, first), path));
  const size_t batch = std::max<size_t>(1, options.batch);
  for (size_t at = 0; at < rest.size(); at += batch) {
    if (options.before_batch) CKPTD_RETURN_IF_ERROR(options.before_batch(at));
    const size_t end = std::min(rest.size(), at + batch);
    CKPTD_RETURN_IF_ERROR(InContext(
        client_->DeleteMany(url.bucket, std::vector<std::string>(rest.begin() + at, rest.begin() + end)), path));
  }
  CKPTD_ASSIGN_OR_RETURN(std::vector<UploadInfo> uploads, client_->ListUploads(url.bucket, prefix));
  for (const UploadInfo& u : uploads) {
    CKPTD_RETURN_IF_ERROR(InContext(client_->AbortUpload(url.bucket, u.key, u.upload_id), path));
    NoteUpload(u.upload_id, false);
  }
  if (marker) CKPTD_RETURN_IF_ERROR(client_->Delete(url.bucket, prefix));
  return absl::OkStatus();
}

absl::StatusOr<int> ObjectStoreFileSystem::AbortStaleUploads(const std::string& path, absl::Time started_before) {
  CKPTD_ASSIGN_OR_RETURN(ObjectUrl url, Locate(path));
  CKPTD_ASSIGN_OR_RETURN(std::vector<UploadInfo> uploads, client_->ListUploads(url.bucket, DirPrefix(url)));
  int aborted = 0;
  for (const UploadInfo& u : uploads) {
    if (u.initiated >= started_before || UploadIsOurs(u.upload_id)) continue;
    CKPTD_RETURN_IF_ERROR(client_->AbortUpload(url.bucket, u.key, u.upload_id));
    ++aborted;
  }
  return aborted;
}

}  // namespace ckptd::objstore
