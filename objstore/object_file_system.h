// A storage::FileSystem over an S3-compatible object store, so that the
// storage engine, the agent, the coordinator and ckptctl take a storage root
// "s3://bucket/prefix" as they take a directory. Paths are s3:// URLs; the
// file system maps what the engine does onto what an object store has:
//
//   a file            an object; a file written under a name ending ".tmp"
//                     is uploaded (multipart, parts in parallel) for the key
//                     without the suffix, and the object appears only when
//                     that temp file is renamed onto it: the completion of a
//                     multipart upload (or one PUT, for a small file) is
//                     atomic, as the rename it stands for. Removing the temp
//                     file aborts its upload. A file written under any other
//                     name appears when it is closed.
//   a directory       a prefix: "key/". CreateDir writes a zero-byte marker
//                     object "key/" so that an empty directory exists (a
//                     step being written shows in a listing before any of its
//                     shards complete); RemoveDir removes it when nothing else
//                     is below.
//   fsync, dir fsync  nothing to do: an object exists durably once the
//                     request that made it has succeeded.
//   RemoveTree        batch deletes (DeleteObjects, 1000 keys a request), the
//                     `remove_first` keys before the rest, then every
//                     multipart upload still open below the prefix is
//                     aborted, and the marker goes last.
//   reads             ranged GETs in parallel, each pinned to the ETag the
//                     file was opened with: an object replaced while it is
//                     read (a rank that moved writing the same key) fails the
//                     read rather than mixing two versions.
//
// There are no symbolic links, FIFOs or devices in an object store: every
// entry is a regular file or a directory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/thread_pool.h"
#include "objstore/s3_client.h"
#include "objstore/s3_options.h"
#include "storage/file_system.h"

namespace ckptd::objstore {

class ObjectStoreFileSystem final : public storage::FileSystem {
 public:
  // `fault`: S3Client's test hook.
  static absl::StatusOr<std::unique_ptr<ObjectStoreFileSystem>> Create(S3Options options,
                                                                       S3Client::FaultHook fault = nullptr);
  ~ObjectStoreFileSystem() override;

  S3Client* client() const { return client_.get(); }
  const S3Options& options() const { return client_->options(); }

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

  // Aborts every multipart upload open below `path` (a directory) that
  // this process is not writing, started before `started_before`: what a
  // persist that died left. Returns how many went.
  absl::StatusOr<int> AbortStaleUploads(const std::string& path, absl::Time started_before);

  // The multipart part size for a file of about `size_hint` bytes (0:
  // unknown): S3Options::part_bytes when set, else 16 MiB, more for a file
  // that would need over 9,000 parts (S3 allows 10,000).
  uint64_t PartBytesFor(uint64_t size_hint) const;

 private:
  class Writer;
  class Reader;
  friend class Writer;
  friend class Reader;

  // A temp file closed and waiting for its rename: the upload to complete.
  struct Staged {
    std::string bucket;
    std::string key;
    std::string upload_id;  // empty: one PUT of `data`
    std::string data;
    std::vector<CompletedPart> parts;
    uint64_t size = 0;
  };

  explicit ObjectStoreFileSystem(std::unique_ptr<S3Client> client);
  absl::Status Commit(const std::string& from, Staged staged);
  void Stage(const std::string& tmp_path, Staged staged);
  // Keys of uploads this process has open (not stale).
  void NoteUpload(const std::string& upload_id, bool open);
  bool UploadIsOurs(const std::string& upload_id);

  std::unique_ptr<S3Client> client_;
  base::ThreadPool pool_;  // the requests of every file, max_connections at once

  absl::Mutex mu_;
  std::map<std::string, Staged> staged_ ABSL_GUARDED_BY(mu_);  // by temp path
  std::map<std::string, int> open_uploads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd::objstore
