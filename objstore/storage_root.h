// Opens a storage root by its name: a directory (local disk, NFS, Lustre)
// or an object store location "s3://bucket/prefix". Every binary that takes
// --storage-root (or --root) opens it here, so that each takes both kinds.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/logger.h"
#include "objstore/s3_client.h"
#include "objstore/s3_options.h"
#include "storage/file_system.h"

namespace ckptd::objstore {

struct StorageRoot {
  // The file system the root's paths go through: `posix` for a directory,
  // an ObjectStoreFileSystem (owned here) for s3://.
  storage::FileSystem* fs = nullptr;
  std::unique_ptr<storage::FileSystem> owned;
  // The root as the engine names it: the directory, or the normalised
  // s3:// URL (no trailing '/').
  std::string path;
  bool object_store = false;
  // For logs: where the root is and how it is reached, never a secret.
  std::string description;
};

struct OpenRootOptions {
  // For an object store: the options; nullopt: S3OptionsFromEnvironment().
  std::optional<S3Options> s3;
  // Check at once that the bucket exists and the credentials reach it.
  bool check_bucket = true;
  S3Client::FaultHook fault;  // tests only
};

// True when this build reaches object stores (libcurl and pugixml were found).
bool ObjectStoreSupported();

// `posix` serves a directory root and must outlive the result. An s3:// root
// that does not parse, credentials that cannot be found, a bucket that does
// not exist or refuses these credentials: an error saying which.
absl::StatusOr<StorageRoot> OpenStorageRoot(const std::string& root, storage::FileSystem* posix,
                                            const OpenRootOptions& options = {});

// For an object store root: aborts the multipart uploads below it that were
// started over `older_than` ago (what writers that died mid-persist left; a
// live persist finishes well within it), and says on `log` how many went.
// An error (a store that refuses to list uploads) is logged as a warning,
// never fatal. Nothing for a directory root.
void AbortAbandonedUploads(const StorageRoot& root, base::Logger& log, absl::Duration older_than = absl::Hours(1));

}  // namespace ckptd::objstore
