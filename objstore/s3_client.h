// A small S3 client on libcurl: the requests a storage root needs (objects,
// ranged reads, multipart uploads, listings, batch deletes), signed with AWS
// Signature V4 by libcurl (CURLOPT_AWS_SIGV4), over reused connections, with
// bounded retries. Thread-safe: any number of threads may call at once; each
// call blocks its thread for the request (and its retries).
//
// Errors name the request, the s3:// URL and the status (and S3's error code
// and message when it sent one), never a credential. Statuses: kNotFound
// (404, NoSuchKey/NoSuchBucket/NoSuchUpload), kPermissionDenied (403),
// kUnauthenticated (a signature or key S3 refused, an expired token),
// kFailedPrecondition (412: a condition did not hold), kUnavailable (what
// kept failing after every retry: 5xx, SlowDown, a connection that could
// not be made or was reset), kDataLoss (a response shorter or longer than
// asked for), kInvalidArgument (anything else 4xx).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "objstore/s3_options.h"

namespace ckptd::objstore {

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // as S3 sent it, quotes included
};

struct ListResult {
  std::vector<ObjectInfo> objects;    // keys under the prefix (not past a delimiter)
  std::vector<std::string> prefixes;  // common prefixes, each ending with the delimiter
};

struct UploadInfo {
  std::string key;
  std::string upload_id;
  absl::Time initiated;
};

struct CompletedPart {
  int number = 0;
  std::string etag;
};

// What a request is, for the fault hook and the counters.
struct RequestInfo {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string what;    // "get", "head", "put", "create-upload", "upload-part", "complete-upload", ...
  std::string bucket;
  std::string key;
  int attempt = 1;
};

// Counters of one client, for metrics and benchmarks.
struct S3ClientStats {
  uint64_t requests = 0;  // attempts sent, retries included
  uint64_t retries = 0;
  uint64_t bytes_up = 0;
  uint64_t bytes_down = 0;
};

class S3Client {
 public:
  // A test hook run before each attempt: a non-zero return is taken as the
  // HTTP status of that attempt (with S3's "SlowDown" code for 503) instead
  // of sending it; 0 sends the request. Faults of a real server without one.
  using FaultHook = std::function<int(const RequestInfo&)>;

  static absl::StatusOr<std::unique_ptr<S3Client>> Create(S3Options options, FaultHook fault = nullptr);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  const S3Options& options() const { return options_; }

  // Ok when the bucket exists and these credentials reach it.
  absl::Status HeadBucket(const std::string& bucket);
  // Makes a bucket (ok when these credentials already own it). ckptd never
  // makes one on its own: for tests, benchmarks and `ckptctl`'s set-up help.
  absl::Status CreateBucket(const std::string& bucket);
  absl::StatusOr<ObjectInfo> Head(const std::string& bucket, const std::string& key);
  // Reads exactly `n` bytes at `offset` into `buf`. With `if_match` (an
  // ETag), a changed object fails with kFailedPrecondition instead of
  // mixing two versions. Past the end: kDataLoss.
  absl::Status GetRange(const std::string& bucket, const std::string& key, uint64_t offset, uint64_t n, void* buf,
                        const std::string& if_match = "");
  // A whole (small) object.
  absl::StatusOr<std::string> Get(const std::string& bucket, const std::string& key);
  // PUTs `data` (one request; up to 5 GiB). `if_none_match`: only when the
  // key does not exist yet (kAlreadyExists otherwise, where the store
  // supports conditional writes). Returns the ETag.
  absl::StatusOr<std::string> Put(const std::string& bucket, const std::string& key, absl::string_view data,
                                  bool if_none_match = false);
  absl::Status Delete(const std::string& bucket, const std::string& key);
  // Deletes up to any number of keys, 1000 a request (DeleteObjects). A key
  // that was already gone is not an error; one S3 refused is, naming it.
  absl::Status DeleteMany(const std::string& bucket, const std::vector<std::string>& keys);

  // Multipart uploads.
  absl::StatusOr<std::string> CreateUpload(const std::string& bucket, const std::string& key);
  absl::StatusOr<std::string> UploadPart(const std::string& bucket, const std::string& key,
                                         const std::string& upload_id, int part_number, absl::string_view data);
  absl::StatusOr<std::string> CompleteUpload(const std::string& bucket, const std::string& key,
                                             const std::string& upload_id, const std::vector<CompletedPart>& parts);
  absl::Status AbortUpload(const std::string& bucket, const std::string& key, const std::string& upload_id);
  // Uploads in progress under `prefix`, every page.
  absl::StatusOr<std::vector<UploadInfo>> ListUploads(const std::string& bucket, const std::string& prefix);

  // Every object under `prefix` (ListObjectsV2, every page); with a
  // `delimiter`, keys past it are grouped into `prefixes`. `max_keys` > 0
  // stops after that many entries (one page).
  absl::StatusOr<ListResult> List(const std::string& bucket, const std::string& prefix,
                                  const std::string& delimiter = "", int max_keys = 0);

  S3ClientStats stats() const;

 private:
  struct Request;
  struct Response;
  class Handle;

  explicit S3Client(S3Options options, FaultHook fault);
  static Request MakeRequest(std::string method, std::string what, std::string bucket, std::string key,
                             std::vector<std::pair<std::string, std::string>> query = {});
  // Sends `req`, retrying what is worth retrying; the final response, or an
  // error status naming the request.
  absl::StatusOr<Response> Send(Request& req);
  absl::StatusOr<Response> SendOnce(Request& req, Handle& handle, bool* retryable);
  std::string Url(const Request& req) const;
  absl::Status ErrorOf(const Request& req, const Response& resp) const;
  std::unique_ptr<Handle> TakeHandle();
  void ReturnHandle(std::unique_ptr<Handle> handle);

  const S3Options options_;
  const FaultHook fault_;
  std::string scheme_host_;  // "https://host:port" of the endpoint
  std::string sigv4_;        // "aws:amz:<region>:s3"
  std::string userpwd_;      // "<key id>:<secret>": only ever handed to libcurl

  absl::Mutex mu_;
  std::vector<std::unique_ptr<Handle>> idle_ ABSL_GUARDED_BY(mu_);

  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> retries_{0};
  std::atomic<uint64_t> bytes_up_{0};
  std::atomic<uint64_t> bytes_down_{0};
};

// URI-encodes `s` the way SigV4 wants it: every byte but A-Z a-z 0-9 - _ . ~
// as %XY (upper-case), and '/' too unless `keep_slash`.
std::string UriEncode(absl::string_view s, bool keep_slash);

}  // namespace ckptd::objstore
