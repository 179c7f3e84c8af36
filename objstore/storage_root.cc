#include "objstore/storage_root.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#if CKPTD_HAVE_OBJSTORE
#include "objstore/object_file_system.h"
#endif

namespace ckptd::objstore {

#if CKPTD_HAVE_OBJSTORE
bool ObjectStoreSupported() { return true; }
#else
bool ObjectStoreSupported() { return false; }

absl::Status NoObjectStores(absl::string_view root) {
  return absl::FailedPreconditionError(
      absl::StrCat("storage root ", root,
                   ": this build of ckptd has no object-store support (it was built without libcurl and "
                   "pugixml; rebuild with libcurl4-openssl-dev and libpugixml-dev installed)"));
}
#endif

absl::StatusOr<StorageRoot> OpenStorageRoot(const std::string& root, storage::FileSystem* posix,
                                            const OpenRootOptions& options) {
  StorageRoot out;
  if (!IsObjectStoreRoot(root)) {
    out.fs = posix;
    out.path = root;
    out.description = root;
    return out;
  }
  CKPTD_ASSIGN_OR_RETURN(ObjectUrl url, ParseObjectUrl(root));
#if !CKPTD_HAVE_OBJSTORE
  return NoObjectStores(root);
#else
  S3Options s3;
  if (options.s3) {
    s3 = *options.s3;
  } else {
    absl::StatusOr<S3Options> env = S3OptionsFromEnvironment();
    if (!env.ok()) {
      return absl::Status(env.status().code(), absl::StrCat("storage root ", root, ": ", env.status().message()));
    }
    s3 = std::move(*env);
  }
  const std::string description = absl::StrCat(url.ToString(), " (", s3.Describe(), ")");
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<ObjectStoreFileSystem> fs,
                         ObjectStoreFileSystem::Create(std::move(s3), options.fault));
  if (options.check_bucket) {
    absl::Status s = fs->client()->HeadBucket(url.bucket);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("storage root ", url.ToString(), ": ", s.message()));
  }
  out.fs = fs.get();
  out.owned = std::move(fs);
  out.path = url.ToString();
  out.object_store = true;
  out.description = description;
  return out;
#endif
}

void AbortAbandonedUploads(const StorageRoot& root, base::Logger& log, absl::Duration older_than) {
  if (!root.object_store) return;
#if CKPTD_HAVE_OBJSTORE
  auto* fs = static_cast<ObjectStoreFileSystem*>(root.owned.get());
  absl::StatusOr<int> aborted = fs->AbortStaleUploads(root.path, absl::Now() - older_than);
  if (!aborted.ok()) {
    log.Warning(absl::StrCat("cannot look for abandoned uploads under ", root.path, ": ", aborted.status().message(),
                             " (an S3 lifecycle rule for incomplete multipart uploads cleans them)"));
  } else if (*aborted > 0) {
    log.Info(absl::StrCat("aborted ", *aborted, " multipart upload(s) under ", root.path,
                          " that writers which died had left open"));
  }
#else
  (void)log, (void)older_than;
#endif
}

}  // namespace ckptd::objstore
