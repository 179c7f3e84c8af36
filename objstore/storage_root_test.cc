// OpenStorageRoot without a server: what every binary does with the name
// of its root before any request (object_file_system_test and
// store_on_object_store_test have the RGW).
#include "objstore/storage_root.h"

#include <memory>

#include "base/testing/capturing_logger.h"
#include "base/testing/matchers.h"
#include "base/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "objstore/routing_file_system.h"
#include "storage/posix_file_system.h"

namespace ckptd::objstore {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(StorageRootTest, ADirectoryIsServedByTheFileSystemGiven) {
  std::unique_ptr<storage::PosixFileSystem> posix = storage::NewPosixFileSystem();
  ckptd::testing::TempDir dir("ckptd-root-");
  absl::StatusOr<StorageRoot> root = OpenStorageRoot(dir.path(), posix.get());
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(root->fs, posix.get());
  EXPECT_EQ(root->path, dir.path());
  EXPECT_FALSE(root->object_store);
  EXPECT_EQ(root->owned, nullptr);
  // Nothing to abort on a directory, and nothing said.
  ckptd::testing::CapturingLogger log;
  AbortAbandonedUploads(*root, log);
  EXPECT_TRUE(log.lines().empty());
}

TEST(StorageRootTest, AnObjectStoreRootThatCannotBeUsedSaysWhy) {
  std::unique_ptr<storage::PosixFileSystem> posix = storage::NewPosixFileSystem();
  // A malformed URL, in every build.
  absl::StatusOr<StorageRoot> bad = OpenStorageRoot("s3://Not_A_Bucket/x", posix.get());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_THAT(bad.status().message(), HasSubstr("Not_A_Bucket"));

  S3Options s3;
  s3.endpoint = "http://127.0.0.1:1";  // nothing listens on port 1
  s3.addressing = Addressing::kPath;
  s3.credentials = {"AKIDSTORAGEROOTTEST1", "secret-never-shown-0123456789", "", "test"};
  s3.max_attempts = 1;
  OpenRootOptions options;
  options.s3 = s3;
  absl::StatusOr<StorageRoot> root = OpenStorageRoot("s3://ckpt-bucket/runs", posix.get(), options);
  ASSERT_FALSE(root.ok());
  EXPECT_THAT(root.status().message(), AllOf(HasSubstr("s3://ckpt-bucket/runs"), Not(HasSubstr(s3.credentials.secret_access_key))));
  if (!ObjectStoreSupported()) {
    // A build without libcurl and pugixml refuses, naming what it lacks.
    EXPECT_EQ(root.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(root.status().message(), HasSubstr("no object-store support"));
    return;
  }
  // The bucket is checked at once: a store that cannot be reached is an error now, not at the first checkpoint.
  EXPECT_EQ(root.status().code(), absl::StatusCode::kUnavailable) << root.status();
}

TEST(StorageRootTest, TheRoutingFileSystemSendsDirectoriesToTheLocalOne) {
  std::unique_ptr<storage::PosixFileSystem> posix = storage::NewPosixFileSystem();
  ckptd::testing::TempDir dir("ckptd-route-");
  RoutingFileSystem fs(posix.get());
  ASSERT_TRUE(fs.CreateDir(dir.Sub("a")).ok());
  EXPECT_TRUE(posix->Stat(dir.Sub("a")).ok());
  // A rename between a directory and an object store is refused, naming both.
  const absl::Status across = fs.Rename(dir.Sub("a"), "s3://ckpt-bucket/a");
  EXPECT_EQ(across.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(across.message(), AllOf(HasSubstr(dir.Sub("a")), HasSubstr("s3://ckpt-bucket/a")));
}

}  // namespace
}  // namespace ckptd::objstore
