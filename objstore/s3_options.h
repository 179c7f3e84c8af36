// How ckptd reaches an S3-compatible object store: the URL of a storage root
// (s3://bucket/prefix), the endpoint, region and addressing, and the
// credentials, taken from where S3 users already keep them (the AWS_*
// environment variables, the shared credentials and config files).
//
// Secrets stay here and in the request signer: nothing that prints an
// S3Options or a Credentials (logs, errors, status, metrics) shows one.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckptd::objstore {

inline constexpr absl::string_view kS3Scheme = "s3://";

// True for a storage root that names an object store ("s3://...").
bool IsObjectStoreRoot(absl::string_view root);

// An object store location: a bucket and a key (or key prefix) in it.
struct ObjectUrl {
  std::string bucket;
  std::string key;               // no leading '/'; "" for the bucket itself
  std::string ToString() const;  // "s3://bucket/key"
};

// Parses "s3://bucket" or "s3://bucket/a/b". The bucket must be a valid S3
// bucket name (3 to 63 of a-z 0-9 . -, starting and ending with a letter or
// digit); the key may not hold empty, "." or ".." components, control
// characters or a backslash, and is at most 1024 bytes. A trailing '/' is
// dropped. kInvalidArgument naming what is wrong.
absl::StatusOr<ObjectUrl> ParseObjectUrl(absl::string_view url);

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty: long-term keys
  // Where they came from, for messages: "environment", or the shared
  // credentials file and profile. Never a secret.
  std::string source;
  bool empty() const { return access_key_id.empty(); }
};

enum class Addressing {
  kPath,           // https://endpoint/bucket/key
  kVirtualHosted,  // https://bucket.endpoint/key
};

struct S3Options {
  // Scheme, host and optional port ("http://127.0.0.1:7480"); empty: AWS's
  // regional endpoint, https://s3.<region>.amazonaws.com.
  std::string endpoint;
  std::string region = "us-east-1";
  // Virtual-hosted for AWS's own endpoints, path-style for any other (what
  // MinIO, Ceph RGW and most on-premises stores serve without DNS set-up).
  Addressing addressing = Addressing::kVirtualHosted;
  // A PEM bundle of CA certificates for https; empty: the system's store.
  std::string ca_file;
  Credentials credentials;

  // Requests in flight at once, per file system (connections are reused).
  int max_connections = 16;
  // Multipart part size; 0: chosen per file (WritableFile) from its size.
  uint64_t part_bytes = 0;
  // A request that fails in a way worth retrying (5xx, SlowDown, a reset
  // connection, a timeout) is tried this many times in all, waiting between
  // tries a random time up to min(max_backoff, base_backoff * 2^try).
  int max_attempts = 6;
  absl::Duration base_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  absl::Duration connect_timeout = absl::Seconds(10);
  // A transfer slower than low_speed_bytes per second for low_speed_time
  // fails (and is retried): a stalled server is an error, never a hang.
  uint64_t low_speed_bytes = 1024;
  absl::Duration low_speed_time = absl::Seconds(30);

  // The endpoint actually used (the AWS default when `endpoint` is empty).
  std::string EffectiveEndpoint() const;
  // One line for logs and status: endpoint, region, addressing, credentials'
  // source and key id. No secret.
  std::string Describe() const;
};

// Reads an environment variable; nullopt when unset. Tests pass their own.
using EnvLookup = std::function<std::optional<std::string>(absl::string_view name)>;
EnvLookup ProcessEnvironment();

// S3Options from the environment, as the AWS CLI and SDKs read it:
//   credentials  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN;
//                else the profile AWS_PROFILE (default "default") of the
//                shared credentials file (AWS_SHARED_CREDENTIALS_FILE, default
//                ~/.aws/credentials)
//   region       AWS_REGION, AWS_DEFAULT_REGION, else the profile's `region`
//                in the config file (AWS_CONFIG_FILE, default ~/.aws/config),
//                else us-east-1
//   endpoint     AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else the profile's
//                `endpoint_url`
//   CA bundle    AWS_CA_BUNDLE, else the profile's `ca_bundle`
// and ckptd's own: CKPTD_S3_ADDRESSING (path or virtual),
// CKPTD_S3_MAX_CONNECTIONS, CKPTD_S3_PART_BYTES (e.g. 64MiB),
// CKPTD_S3_MAX_ATTEMPTS. No credentials anywhere is kFailedPrecondition
// saying where it looked; a malformed file or value is kInvalidArgument
// naming it (never quoting a secret).
absl::StatusOr<S3Options> S3OptionsFromEnvironment(const EnvLookup& env = ProcessEnvironment());

}  // namespace ckptd::objstore
