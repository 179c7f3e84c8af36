// ObjectStoreFileSystem against a real S3 server (the test RGW): what each
// file-system call becomes on objects, and the faults a store shows.
#include "objstore/object_file_system.h"

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "objstore/storage_root.h"
#include "objstore/testing_rgw.h"
#include "storage/testing_data.h"

namespace ckptd::objstore {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string Pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> b = ::ckptd::testing::RandomBytes(n, seed);
  return std::string(b.begin(), b.end());
}

S3Options Fast(S3Options o) {
  o.part_bytes = 5 * kMiB;
  o.max_connections = 4;
  o.base_backoff = absl::Milliseconds(5);
  o.max_backoff = absl::Milliseconds(50);
  return o;
}

std::unique_ptr<ObjectStoreFileSystem> NewFs(const S3Options& o, S3Client::FaultHook fault = nullptr) {
  absl::StatusOr<std::unique_ptr<ObjectStoreFileSystem>> fs = ObjectStoreFileSystem::Create(o, std::move(fault));
  EXPECT_THAT(fs.status(), IsOk());
  return fs.ok() ? std::move(*fs) : nullptr;
}

std::string ReadAll(storage::FileSystem* fs, const std::string& path) {
  absl::StatusOr<std::string> s = storage::ReadFileToString(fs, path);
  EXPECT_THAT(s.status(), IsOk());
  return s.ok() ? *s : "";
}

// Writes `data` to `path` in `chunk`-byte writes, the first chunk last (as
// the shard writer writes its header), then syncs and closes.
absl::Status WriteFile(storage::FileSystem* fs, const std::string& path, const std::string& data, size_t chunk) {
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<storage::WritableFile> f, fs->NewWritableFile(path, {}));
  for (size_t at = chunk; at < data.size(); at += chunk) {
    CKPTD_RETURN_IF_ERROR(f->Write(at, data.data() + at, std::min(chunk, data.size() - at)).status());
  }
  CKPTD_RETURN_IF_ERROR(f->Write(0, data.data(), std::min(chunk, data.size())).status());
  CKPTD_RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

TEST(ObjectFileSystemTest, ATempFileBecomesItsObjectOnlyWhenRenamed) {
  CKPTD_REQUIRE_RGW(rgw);
  auto fs = NewFs(Fast(rgw.options));
  const std::string dir = UniqueRoot(rgw, "rename");
  CKPTD_ASSERT_OK(fs->CreateDir(dir));
  const std::string data = Pattern(12 * kMiB + 123, 1);  // three parts, the last short
  CKPTD_ASSERT_OK(WriteFile(fs.get(), dir + "/a.shard.tmp", data, 1 * kMiB + 7));

  // Uploaded, closed, not renamed: no object a reader could take.
  EXPECT_THAT(fs->Stat(dir + "/a.shard"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("a.shard")));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<storage::FileInfo> before, fs->ListDir(dir));
  EXPECT_THAT(before, IsEmpty());
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::FileInfo tmp, fs->Stat(dir + "/a.shard.tmp"));
  EXPECT_EQ(tmp.size, data.size());

  // A temp file becomes the key without its suffix, nothing else.
  EXPECT_THAT(fs->Rename(dir + "/a.shard.tmp", dir + "/b.shard"), StatusIs(absl::StatusCode::kUnimplemented, ::testing::_));
  CKPTD_ASSERT_OK(fs->Rename(dir + "/a.shard.tmp", dir + "/a.shard"));
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::FileInfo info, fs->Stat(dir + "/a.shard"));
  EXPECT_EQ(info.size, data.size());
  EXPECT_EQ(ReadAll(fs.get(), dir + "/a.shard"), data);
  CKPTD_ASSERT_OK_AND_ASSIGN(ObjectUrl url, ParseObjectUrl(dir));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<UploadInfo> open, fs->client()->ListUploads(url.bucket, url.key + "/"));
  EXPECT_THAT(open, IsEmpty());
}

TEST(ObjectFileSystemTest, ASmallFileIsOnePutAndAFileNotNamedTmpAppearsWhenClosed) {
  CKPTD_REQUIRE_RGW(rgw);
  auto fs = NewFs(Fast(rgw.options));
  const std::string dir = UniqueRoot(rgw, "small");
  CKPTD_ASSERT_OK(storage::WriteFileAtomically(fs.get(), dir + "/MANIFEST", "committed"));
  EXPECT_EQ(ReadAll(fs.get(), dir + "/MANIFEST"), "committed");
  const uint64_t before = fs->client()->stats().requests;
  CKPTD_ASSERT_OK(WriteFile(fs.get(), dir + "/plain", "hello", 2));
  EXPECT_EQ(fs->client()->stats().requests - before, 1u) << "one PUT, no multipart upload";
  EXPECT_EQ(ReadAll(fs.get(), dir + "/plain"), "hello");
  CKPTD_ASSERT_OK(WriteFile(fs.get(), dir + "/empty", "", 1));
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::FileInfo e, fs->Stat(dir + "/empty"));
  EXPECT_EQ(e.size, 0u);
}

TEST(ObjectFileSystemTest, RemovingATempFileOrDroppingItsWriterAbortsTheUpload) {
  CKPTD_REQUIRE_RGW(rgw);
  auto fs = NewFs(Fast(rgw.options));
  const std::string dir = UniqueRoot(rgw, "abort");
  CKPTD_ASSERT_OK_AND_ASSIGN(ObjectUrl url, ParseObjectUrl(dir));
  const std::string data = Pattern(11 * kMiB, 2);
  CKPTD_ASSERT_OK(WriteFile(fs.get(), dir + "/x.tmp", data, kMiB));
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<storage::WritableFile> f, fs->NewWritableFile(dir + "/y.tmp", {}));
    ASSERT_THAT(f->Write(0, data.data(), data.size()).status(), IsOk());
    CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<UploadInfo> open, fs->client()->ListUploads(url.bucket, url.key + "/"));
    EXPECT_EQ(open.size(), 2u) << "x (closed, not renamed) and y (being written)";
  }  // y's writer dropped: a persist that stopped midway
  CKPTD_ASSERT_OK(fs->RemoveFile(dir + "/x.tmp"));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<UploadInfo> open, fs->client()->ListUploads(url.bucket, url.key + "/"));
  EXPECT_THAT(open, IsEmpty());
  EXPECT_THAT(fs->Stat(dir + "/x"), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_THAT(fs->RemoveFile(dir + "/x.tmp"), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

TEST(ObjectFileSystemTest, UploadsLeftByAProcessThatDiedAreAbortedByTheNextOne) {
  CKPTD_REQUIRE_RGW(rgw);
  const std::string dir = UniqueRoot(rgw, "stale");
  CKPTD_ASSERT_OK_AND_ASSIGN(ObjectUrl url, ParseObjectUrl(dir));
  auto dead = NewFs(Fast(rgw.options));
  // What a process killed mid-persist leaves: an open upload with a part.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string id, dead->client()->CreateUpload(url.bucket, url.key + "/step-1/rank-0.shard"));
  CKPTD_ASSERT_OK(dead->client()->UploadPart(url.bucket, url.key + "/step-1/rank-0.shard", id, 1, Pattern(6 * kMiB, 3))
                      .status());
  auto next = NewFs(Fast(rgw.options));
  // Its own uploads in flight are not touched.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<storage::WritableFile> mine,
                             next->NewWritableFile(dir + "/step-2/rank-0.shard.tmp", {}));
  const std::string data = Pattern(6 * kMiB, 4);
  ASSERT_THAT(mine->Write(0, data.data(), data.size()).status(), IsOk());
  CKPTD_ASSERT_OK_AND_ASSIGN(int aborted, next->AbortStaleUploads(dir, absl::Now() + absl::Minutes(1)));
  EXPECT_EQ(aborted, 1);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<UploadInfo> open, next->client()->ListUploads(url.bucket, url.key + "/"));
  ASSERT_EQ(open.size(), 1u);
  EXPECT_EQ(open[0].key, url.key + "/step-2/rank-0.shard");
  CKPTD_ASSERT_OK(mine->Close());
  CKPTD_ASSERT_OK(next->Rename(dir + "/step-2/rank-0.shard.tmp", dir + "/step-2/rank-0.shard"));
  EXPECT_EQ(ReadAll(next.get(), dir + "/step-2/rank-0.shard"), data);
}

TEST(ObjectFileSystemTest, DirectoriesArePrefixesWithAMarker) {
  CKPTD_REQUIRE_RGW(rgw);
  auto fs = NewFs(Fast(rgw.options));
  const std::string dir = UniqueRoot(rgw, "dirs");
  EXPECT_THAT(fs->ListDir(dir), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_THAT(fs->Stat(dir), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  CKPTD_ASSERT_OK(storage::CreateDirs(fs.get(), dir + "/job/step-5"));
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::FileInfo st, fs->Stat(dir + "/job/step-5"));
  EXPECT_TRUE(st.is_directory);
  CKPTD_ASSERT_OK(storage::CheckIsDirectory(fs.get(), dir + "/job"));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<storage::FileInfo> empty, fs->ListDir(dir + "/job/step-5"));
  EXPECT_THAT(empty, IsEmpty());
  CKPTD_ASSERT_OK(WriteFile(fs.get(), dir + "/job/notes", "n", 1));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<storage::FileInfo> entries, fs->ListDir(dir + "/job"));
  EXPECT_THAT(entries, ElementsAre(AllOf(Field(&storage::FileInfo::name, "notes"),
                                         Field(&storage::FileInfo::is_directory, false),
                                         Field(&storage::FileInfo::size, 1u)),
                                   AllOf(Field(&storage::FileInfo::name, "step-5"),
                                         Field(&storage::FileInfo::is_directory, true))));
  EXPECT_THAT(fs->RemoveDir(dir + "/job"), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not empty")));
  CKPTD_ASSERT_OK(fs->RemoveDir(dir + "/job/step-5"));
  EXPECT_THAT(fs->RemoveDir(dir + "/job/step-5"), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  CKPTD_ASSERT_OK(fs->SyncDir(dir + "/job"));
}

TEST(ObjectFileSystemTest, RemoveTreeDeletesInBatchesFirstThingsFirstAndAbortsOpenUploads) {
  CKPTD_REQUIRE_RGW(rgw);
  auto fs = NewFs(Fast(rgw.options));
  const std::string dir = UniqueRoot(rgw, "tree");
  CKPTD_ASSERT_OK(storage::CreateDirs(fs.get(), dir + "/step-1"));
  for (int i = 0; i < 7; ++i) CKPTD_ASSERT_OK(WriteFile(fs.get(), absl::StrCat(dir, "/step-1/f", i), "x", 1));
  CKPTD_ASSERT_OK(WriteFile(fs.get(), dir + "/step-1/MANIFEST", "m", 1));
  CKPTD_ASSERT_OK(WriteFile(fs.get(), dir + "/step-1/sub/deep", "d", 1));
  const std::string big = Pattern(6 * kMiB, 5);
  CKPTD_ASSERT_OK(WriteFile(fs.get(), dir + "/step-1/open.tmp", big, kMiB));  // never renamed
  std::vector<size_t> batches;
  storage::RemoveTreeOptions opts;
  opts.batch = 3;
  opts.remove_first = {"MANIFEST"};
  opts.before_batch = [&](size_t removed) -> absl::Status {
    batches.push_back(removed);
    // The MANIFEST went first.
    EXPECT_THAT(fs->Stat(dir + "/step-1/MANIFEST"), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
    return absl::OkStatus();
  };
  CKPTD_ASSERT_OK(fs->RemoveTree(dir + "/step-1", opts));
  EXPECT_THAT(batches, ElementsAre(0u, 3u, 6u));
  EXPECT_THAT(fs->Stat(dir + "/step-1"), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  CKPTD_ASSERT_OK_AND_ASSIGN(ObjectUrl url, ParseObjectUrl(dir));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<UploadInfo> open, fs->client()->ListUploads(url.bucket, url.key + "/"));
  EXPECT_THAT(open, IsEmpty());
  EXPECT_THAT(fs->RemoveTree("s3://" + rgw.bucket, {}), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

TEST(ObjectFileSystemTest, AnObjectReplacedWhileItIsReadFailsTheReadInsteadOfMixingVersions) {
  CKPTD_REQUIRE_RGW(rgw);
  auto fs = NewFs(Fast(rgw.options));
  const std::string dir = UniqueRoot(rgw, "etag");
  CKPTD_ASSERT_OK(storage::WriteFileAtomically(fs.get(), dir + "/rank-0.shard", Pattern(100000, 6)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<storage::ReadableFile> r,
                             fs->NewReadableFile(dir + "/rank-0.shard", {}));
  std::string first(50000, '\0');
  CKPTD_ASSERT_OK(r->ReadAt(0, first.data(), first.size()));
  // A rank that moved writes the same key.
  CKPTD_ASSERT_OK(storage::WriteFileAtomically(fs.get(), dir + "/rank-0.shard", Pattern(100000, 7)));
  std::string second(50000, '\0');
  EXPECT_THAT(r->ReadAt(50000, second.data(), second.size()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("changed while it was read")));
  // Past the end.
  CKPTD_ASSERT_OK_AND_ASSIGN(r, fs->NewReadableFile(dir + "/rank-0.shard", {}));
  EXPECT_THAT(r->ReadAt(99990, second.data(), 20), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  EXPECT_THAT(fs->NewReadableFile(dir + "/nothing", {}), StatusIs(absl::StatusCode::kNotFound, HasSubstr("nothing")));
}

TEST(ObjectFileSystemTest, LargeReadsGoAsParallelRangesAndComeBackExact) {
  CKPTD_REQUIRE_RGW(rgw);
  auto fs = NewFs(Fast(rgw.options));
  const std::string dir = UniqueRoot(rgw, "ranges");
  const std::string data = Pattern(21 * kMiB + 5, 8);
  CKPTD_ASSERT_OK(WriteFile(fs.get(), dir + "/big.tmp", data, 3 * kMiB));
  CKPTD_ASSERT_OK(fs->Rename(dir + "/big.tmp", dir + "/big"));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<storage::ReadableFile> r, fs->NewReadableFile(dir + "/big", {}));
  ASSERT_EQ(r->size(), data.size());
  std::string back(data.size(), '\0');
  // Two reads in flight at once, one of them several ranges long.
  CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t t1, r->Read(0, back.data(), 20 * kMiB));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t t2, r->Read(20 * kMiB, back.data() + 20 * kMiB, data.size() - 20 * kMiB));
  CKPTD_ASSERT_OK(r->WaitFor(t2));
  CKPTD_ASSERT_OK(r->WaitFor(t1));
  EXPECT_TRUE(back == data);
}

TEST(ObjectFileSystemTest, KeysWithCharactersThatNeedEncodingRoundTrip) {
  CKPTD_REQUIRE_RGW(rgw);
  auto fs = NewFs(Fast(rgw.options));
  const std::string dir = UniqueRoot(rgw, "names");
  for (const std::string name : {"a b", "plus+sign", "per%cent", "eq=amp&q?", "\xc3\xa9t\xc3\xa9", "t~ilde,comma;"}) {
    SCOPED_TRACE(name);
    CKPTD_ASSERT_OK(storage::WriteFileAtomically(fs.get(), dir + "/" + name, name));
    EXPECT_EQ(ReadAll(fs.get(), dir + "/" + name), name);
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<storage::FileInfo> entries, fs->ListDir(dir));
  EXPECT_EQ(entries.size(), 6u);
}

TEST(ObjectFileSystemTest, SlowDownIsRetriedWithBackoffAndAStoreThatKeepsRefusingIsAnErrorNamingTheKey) {
  CKPTD_REQUIRE_RGW(rgw);
  std::atomic<int> refused{0};
  // Every second attempt of every part upload is throttled.
  auto fs = NewFs(Fast(rgw.options), [&](const RequestInfo& r) {
    if (r.what.rfind("upload-part", 0) == 0 && r.attempt == 1) {
      ++refused;
      return 503;
    }
    return 0;
  });
  const std::string dir = UniqueRoot(rgw, "slowdown");
  const std::string data = Pattern(16 * kMiB, 9);
  CKPTD_ASSERT_OK(WriteFile(fs.get(), dir + "/s.tmp", data, 2 * kMiB));
  CKPTD_ASSERT_OK(fs->Rename(dir + "/s.tmp", dir + "/s"));
  EXPECT_EQ(ReadAll(fs.get(), dir + "/s"), data);
  EXPECT_EQ(refused.load(), 4);
  EXPECT_GE(fs->client()->stats().retries, 4u);

  // Always throttled: bounded tries, then an error that says what and why.
  S3Options o = Fast(rgw.options);
  o.max_attempts = 3;
  auto stuck = NewFs(o, [](const RequestInfo& r) { return r.method == "PUT" ? 503 : 0; });
  const absl::Time start = absl::Now();
  absl::Status s = storage::WriteFileAtomically(stuck.get(), dir + "/MANIFEST", "m");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable,
                          AllOf(HasSubstr(dir + "/MANIFEST"), HasSubstr("503 SlowDown"), HasSubstr("3 times"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_THAT(fs->Stat(dir + "/MANIFEST"), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

TEST(ObjectFileSystemTest, WrongCredentialsAMissingBucketAndABadTokenAreClearErrorsWithoutSecrets) {
  CKPTD_REQUIRE_RGW(rgw);
  S3Options wrong = Fast(rgw.options);
  wrong.credentials.secret_access_key = "not-the-secret-0123456789";
  OpenRootOptions open;
  open.s3 = wrong;
  absl::StatusOr<StorageRoot> root = OpenStorageRoot(UniqueRoot(rgw, "creds"), nullptr, open);
  EXPECT_THAT(root.status(), Not(IsOk()));
  EXPECT_THAT(std::string(root.status().message()),
              AllOf(HasSubstr(rgw.bucket), HasSubstr(wrong.credentials.access_key_id),
                    Not(HasSubstr(wrong.credentials.secret_access_key)),
                    Not(HasSubstr(rgw.options.credentials.secret_access_key))));

  S3Options token = Fast(rgw.options);
  token.credentials.session_token = "an-expired-session-token";
  open.s3 = token;
  // A store that checks session tokens refuses this one; whatever it says,
  // the token is not repeated.
  root = OpenStorageRoot(UniqueRoot(rgw, "token"), nullptr, open);
  EXPECT_THAT(std::string(root.status().message()), Not(HasSubstr("an-expired-session-token")));
  if (root.ok()) {
    EXPECT_THAT(root->description, AllOf(HasSubstr("session token"), Not(HasSubstr("an-expired"))));
  }

  open.s3 = Fast(rgw.options);
  root = OpenStorageRoot("s3://no-such-bucket-ckptd/prefix", nullptr, open);
  EXPECT_THAT(root.status(), StatusIs(absl::StatusCode::kNotFound, AllOf(HasSubstr("no-such-bucket-ckptd"),
                                                                        HasSubstr("does not exist"))));
  // A fresh root (no bucket check): creating its directories says so too.
  open.check_bucket = false;
  CKPTD_ASSERT_OK_AND_ASSIGN(StorageRoot lazy, OpenStorageRoot("s3://no-such-bucket-ckptd/p", nullptr, open));
  EXPECT_THAT(storage::CreateDirs(lazy.fs, lazy.path + "/job"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no-such-bucket-ckptd")));
}

TEST(ObjectFileSystemTest, AnEndpointThatRefusesConnectionsFailsAfterBoundedRetries) {
  CKPTD_REQUIRE_RGW(rgw);
  S3Options o = Fast(rgw.options);
  o.endpoint = "http://127.0.0.1:1";  // nothing listens there
  o.max_attempts = 3;
  auto fs = NewFs(o);
  const absl::Time start = absl::Now();
  EXPECT_THAT(fs->Stat("s3://" + rgw.bucket + "/x"),
              StatusIs(absl::StatusCode::kUnavailable, AllOf(HasSubstr("/x"), HasSubstr("3 times"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

}  // namespace
}  // namespace ckptd::objstore
