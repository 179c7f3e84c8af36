#include "storage/mem_file_system.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"  // CKPTD_STATUS_CONCAT_, used by testing_matchers.h
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::storage {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::StatusIs;
using ::testing::_;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The StatusOr is ok and its value matches `matcher`.

OpenOptions Buffered() {
  OpenOptions options;
  options.direct_io = false;
  return options;
}

// Writes `contents` at offset 0 of a new file at `path`; syncs when `sync`.
absl::Status WriteFile(FileSystem* fs, const std::string& path, std::string_view contents, bool sync) {
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs->NewWritableFile(path, Buffered());
  if (!file.ok()) return file.status();
  absl::StatusOr<uint64_t> ticket = (*file)->Write(0, contents.data(), contents.size());
  if (!ticket.ok()) return ticket.status();
  if (absl::Status s = (*file)->WaitFor(*ticket); !s.ok()) return s;
  if (sync) {
    if (absl::Status s = (*file)->Sync(); !s.ok()) return s;
  }
  return (*file)->Close();
}

class MemFileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CKPTD_ASSERT_OK(fs_.CreateDir("/root"));
    CKPTD_ASSERT_OK(fs_.SyncDir("/"));
  }

  MemFileSystem fs_;
};

TEST_F(MemFileSystemTest, WriteThenRead) {
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/a", "hello", /*sync=*/false));
  EXPECT_THAT(ReadFileToString(&fs_, "/root/a"), IsOkAndHolds(std::string("hello")));
  CKPTD_ASSERT_OK_AND_ASSIGN(FileInfo info, fs_.Stat("/root/a"));
  EXPECT_EQ(info.name, "/root/a");
  EXPECT_FALSE(info.is_directory);
  EXPECT_EQ(info.size, 5u);
}

TEST_F(MemFileSystemTest, WritePastEndZeroFills) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                             fs_.NewWritableFile("/root/a", Buffered()));
  EXPECT_EQ(file->alignment(), 1u);
  EXPECT_EQ(file->path(), "/root/a");
  CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t t1, file->Write(3, "xy", 2));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t t2, file->Write(0, "a", 1));
  EXPECT_NE(t1, t2);
  CKPTD_EXPECT_OK(file->WaitFor(t1));
  CKPTD_EXPECT_OK(file->WaitAll());
  CKPTD_ASSERT_OK(file->Close());
  EXPECT_THAT(ReadFileToString(&fs_, "/root/a"), IsOkAndHolds(std::string("a\0\0xy", 5)));
}

TEST_F(MemFileSystemTest, NewWritableFileTruncates) {
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/a", "hello", /*sync=*/true));
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/a", "hi", /*sync=*/false));
  EXPECT_THAT(ReadFileToString(&fs_, "/root/a"), IsOkAndHolds(std::string("hi")));
}

TEST_F(MemFileSystemTest, ReadPastEndIsTruncated) {
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/a", "hello", /*sync=*/false));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> file,
                             fs_.NewReadableFile("/root/a", Buffered()));
  EXPECT_EQ(file->size(), 5u);
  char buf[8];
  CKPTD_ASSERT_OK(file->ReadAt(1, buf, 4));
  EXPECT_EQ(std::string(buf, 4), "ello");
  EXPECT_THAT(file->ReadAt(2, buf, 4),
              StatusIs(absl::StatusCode::kDataLoss,
                       ::testing::AllOf(HasSubstr("truncated"), HasSubstr("/root/a"))));
  // The failure is sticky.
  EXPECT_THAT(file->ReadAt(0, buf, 1), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
}

TEST_F(MemFileSystemTest, MissingFilesAndParents) {
  EXPECT_THAT(fs_.NewReadableFile("/root/nope", Buffered()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/root/nope")));
  EXPECT_THAT(fs_.NewWritableFile("/root/no/file", Buffered()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("open /root/no/file")));
  EXPECT_THAT(fs_.CreateDir("/root/no/dir"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("/root/no/dir")));
  EXPECT_THAT(fs_.Stat("/root/nope"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("stat /root/nope")));
  EXPECT_THAT(fs_.ListDir("/root/nope"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("/root/nope")));
  EXPECT_THAT(fs_.RemoveFile("/root/nope"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("/root/nope")));
  EXPECT_THAT(fs_.RemoveDir("/root/nope"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("/root/nope")));
  EXPECT_THAT(fs_.Rename("/root/nope", "/root/x"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("/root/nope")));
  // A file used as a directory.
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/f", "", /*sync=*/false));
  EXPECT_THAT(fs_.NewWritableFile("/root/f/x", Buffered()), StatusIs(absl::StatusCode::kNotFound, _));
  EXPECT_THAT(fs_.ListDir("/root/f"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("/root/f")));
}

TEST_F(MemFileSystemTest, Directories) {
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/d"));
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/d"));   // already there: ok
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/d/"));  // trailing slash
  CKPTD_ASSERT_OK(fs_.CreateDir("/"));
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/d/b", "12", /*sync=*/false));
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/d/a", "1", /*sync=*/false));
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/d/c"));
  EXPECT_THAT(fs_.CreateDir("/root/d/a"), StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("/root/d/a")));

  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FileInfo> entries, fs_.ListDir("/root/d"));
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].name, "a");
  EXPECT_FALSE(entries[0].is_directory);
  EXPECT_EQ(entries[0].size, 1u);
  EXPECT_EQ(entries[1].name, "b");
  EXPECT_EQ(entries[1].size, 2u);
  EXPECT_EQ(entries[2].name, "c");
  EXPECT_TRUE(entries[2].is_directory);
  CKPTD_ASSERT_OK_AND_ASSIGN(FileInfo info, fs_.Stat("/root/d/"));
  EXPECT_TRUE(info.is_directory);

  EXPECT_THAT(fs_.RemoveDir("/root/d"), StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("rmdir /root/d")));
  EXPECT_THAT(fs_.RemoveFile("/root/d/c"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/root/d/c")));
  EXPECT_THAT(fs_.RemoveDir("/root/d/a"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("/root/d/a")));
  EXPECT_THAT(fs_.NewWritableFile("/root/d/c", Buffered()), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(fs_.NewReadableFile("/root/d/c", Buffered()), StatusIs(absl::StatusCode::kInvalidArgument, _));

  CKPTD_ASSERT_OK(RemoveTree(&fs_, "/root/d"));
  EXPECT_THAT(fs_.Stat("/root/d"), StatusIs(absl::StatusCode::kNotFound, _));
  EXPECT_THAT(fs_.ListDir("/root"), IsOkAndHolds(IsEmpty()));
}

TEST_F(MemFileSystemTest, RootListing) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FileInfo> entries, fs_.ListDir("/"));
  EXPECT_THAT(entries, ElementsAre(Field(&FileInfo::name, "root")));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FileInfo> same, fs_.ListDir(""));
  EXPECT_EQ(same.size(), 1u);
}

TEST_F(MemFileSystemTest, RenameReplacesFileAndKeepsOpenHandle) {
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/old", "old", /*sync=*/false));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                             fs_.NewWritableFile("/root/tmp", Buffered()));
  CKPTD_ASSERT_OK(file->Write(0, "ab", 2).status());
  CKPTD_ASSERT_OK(fs_.Rename("/root/tmp", "/root/old"));
  // The handle still writes to the renamed node.
  CKPTD_ASSERT_OK(file->Write(2, "cd", 2).status());
  CKPTD_ASSERT_OK(file->Close());
  EXPECT_THAT(ReadFileToString(&fs_, "/root/old"), IsOkAndHolds(std::string("abcd")));
  EXPECT_THAT(fs_.Stat("/root/tmp"), StatusIs(absl::StatusCode::kNotFound, _));
  // Renaming a file onto itself is a no-op.
  CKPTD_ASSERT_OK(fs_.Rename("/root/old", "/root/old"));
  EXPECT_THAT(ReadFileToString(&fs_, "/root/old"), IsOkAndHolds(std::string("abcd")));
}

TEST_F(MemFileSystemTest, RenameDirectories) {
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/a"));
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/a/f", "x", /*sync=*/false));
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/empty"));
  CKPTD_ASSERT_OK(fs_.Rename("/root/a", "/root/empty"));  // empty target is replaced
  EXPECT_THAT(ReadFileToString(&fs_, "/root/empty/f"), IsOkAndHolds(std::string("x")));
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/b"));
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/b/g", "y", /*sync=*/false));
  EXPECT_THAT(fs_.Rename("/root/b", "/root/empty"),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("rename /root/b")));
  EXPECT_THAT(fs_.Rename("/root/b", "/root/b/g/h"), StatusIs(absl::StatusCode::kNotFound, _));
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/b/sub"));
  EXPECT_THAT(fs_.Rename("/root/b", "/root/b/sub/x"), StatusIs(absl::StatusCode::kInvalidArgument, _));
  EXPECT_THAT(fs_.Rename("/root/b", "/root/empty/f"), StatusIs(absl::StatusCode::kNotFound, _));  // ENOTDIR
  EXPECT_THAT(fs_.Rename("/root/empty/f", "/root/b/sub"), StatusIs(absl::StatusCode::kInvalidArgument, _));
}

TEST_F(MemFileSystemTest, CrashDropsUnsyncedFileData) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                             fs_.NewWritableFile("/root/a", Buffered()));
  CKPTD_ASSERT_OK(file->Write(0, "synced", 6).status());
  CKPTD_ASSERT_OK(file->Sync());
  CKPTD_ASSERT_OK(fs_.SyncDir("/root"));
  CKPTD_ASSERT_OK(file->Write(6, "-lost", 5).status());
  CKPTD_ASSERT_OK(file->Write(0, "S", 1).status());
  EXPECT_THAT(ReadFileToString(&fs_, "/root/a"), IsOkAndHolds(std::string("Synced-lost")));
  fs_.Crash();
  EXPECT_THAT(ReadFileToString(&fs_, "/root/a"), IsOkAndHolds(std::string("synced")));
}

TEST_F(MemFileSystemTest, CrashDropsUnsyncedDirectoryEntries) {
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/not-dir-synced", "data", /*sync=*/true));
  fs_.Crash();
  EXPECT_THAT(fs_.Stat("/root/not-dir-synced"), StatusIs(absl::StatusCode::kNotFound, _));

  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/dir-synced", "data", /*sync=*/true));
  CKPTD_ASSERT_OK(fs_.SyncDir("/root"));
  fs_.Crash();
  EXPECT_THAT(ReadFileToString(&fs_, "/root/dir-synced"), IsOkAndHolds(std::string("data")));

  // A file whose entry is durable but whose data was never synced survives empty.
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/no-data", "data", /*sync=*/false));
  CKPTD_ASSERT_OK(fs_.SyncDir("/root"));
  fs_.Crash();
  EXPECT_THAT(ReadFileToString(&fs_, "/root/no-data"), IsOkAndHolds(std::string()));
}

TEST_F(MemFileSystemTest, CrashDropsDirectoryWhoseParentWasNotSynced) {
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/job"));
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/job/f", "x", /*sync=*/true));
  CKPTD_ASSERT_OK(fs_.SyncDir("/root/job"));
  fs_.Crash();
  EXPECT_THAT(fs_.Stat("/root/job"), StatusIs(absl::StatusCode::kNotFound, _));

  CKPTD_ASSERT_OK(fs_.CreateDir("/root/job"));
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/job/f", "x", /*sync=*/true));
  CKPTD_ASSERT_OK(fs_.SyncDir("/root/job"));
  CKPTD_ASSERT_OK(fs_.SyncDir("/root"));
  fs_.Crash();
  EXPECT_THAT(ReadFileToString(&fs_, "/root/job/f"), IsOkAndHolds(std::string("x")));
}

TEST_F(MemFileSystemTest, RenameRevertsUnlessDirectorySynced) {
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/tmp", "new", /*sync=*/true));
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/final", "old", /*sync=*/true));
  CKPTD_ASSERT_OK(fs_.SyncDir("/root"));

  CKPTD_ASSERT_OK(fs_.Rename("/root/tmp", "/root/final"));
  fs_.Crash();
  EXPECT_THAT(ReadFileToString(&fs_, "/root/final"), IsOkAndHolds(std::string("old")));
  EXPECT_THAT(ReadFileToString(&fs_, "/root/tmp"), IsOkAndHolds(std::string("new")));

  CKPTD_ASSERT_OK(fs_.Rename("/root/tmp", "/root/final"));
  CKPTD_ASSERT_OK(fs_.SyncDir("/root"));
  fs_.Crash();
  EXPECT_THAT(ReadFileToString(&fs_, "/root/final"), IsOkAndHolds(std::string("new")));
  EXPECT_THAT(fs_.Stat("/root/tmp"), StatusIs(absl::StatusCode::kNotFound, _));
}

TEST_F(MemFileSystemTest, RemovalRevertsUnlessDirectorySynced) {
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/a", "keep", /*sync=*/true));
  CKPTD_ASSERT_OK(fs_.SyncDir("/root"));
  CKPTD_ASSERT_OK(fs_.RemoveFile("/root/a"));
  EXPECT_THAT(fs_.Stat("/root/a"), StatusIs(absl::StatusCode::kNotFound, _));
  fs_.Crash();
  EXPECT_THAT(ReadFileToString(&fs_, "/root/a"), IsOkAndHolds(std::string("keep")));

  CKPTD_ASSERT_OK(fs_.RemoveFile("/root/a"));
  CKPTD_ASSERT_OK(fs_.SyncDir("/root"));
  fs_.Crash();
  EXPECT_THAT(fs_.Stat("/root/a"), StatusIs(absl::StatusCode::kNotFound, _));
}

TEST_F(MemFileSystemTest, HandlesFailAfterCrash) {
  CKPTD_ASSERT_OK(WriteFile(&fs_, "/root/r", "data", /*sync=*/true));
  CKPTD_ASSERT_OK(fs_.SyncDir("/root"));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> writer,
                             fs_.NewWritableFile("/root/w", Buffered()));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> reader,
                             fs_.NewReadableFile("/root/r", Buffered()));
  fs_.Crash();
  const auto aborted = StatusIs(absl::StatusCode::kAborted, HasSubstr("invalidated by simulated crash"));
  EXPECT_THAT(writer->Write(0, "x", 1), aborted);
  EXPECT_THAT(writer->WaitAll(), aborted);
  EXPECT_THAT(writer->Sync(), StatusIs(absl::StatusCode::kAborted, HasSubstr("/root/w")));
  EXPECT_THAT(writer->Close(), aborted);
  char c;
  EXPECT_THAT(reader->Read(0, &c, 1), aborted);
  EXPECT_THAT(reader->Close(), aborted);
  // New handles work.
  EXPECT_THAT(ReadFileToString(&fs_, "/root/r"), IsOkAndHolds(std::string("data")));
}

TEST_F(MemFileSystemTest, SyncAfterRemovalKeepsNodeAlive) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                             fs_.NewWritableFile("/root/a", Buffered()));
  CKPTD_ASSERT_OK(fs_.RemoveFile("/root/a"));
  CKPTD_ASSERT_OK(file->Write(0, "x", 1).status());
  CKPTD_ASSERT_OK(file->Sync());
  CKPTD_ASSERT_OK(file->Close());
  EXPECT_THAT(file->Close(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("closed")));
}

TEST_F(MemFileSystemTest, SetFileContentsIsDurable) {
  CKPTD_ASSERT_OK(fs_.SetFileContents("/root/planted", "corrupt"));
  fs_.Crash();
  EXPECT_THAT(ReadFileToString(&fs_, "/root/planted"), IsOkAndHolds(std::string("corrupt")));
  CKPTD_ASSERT_OK(fs_.SetFileContents("/root/planted", "other"));
  EXPECT_THAT(ReadFileToString(&fs_, "/root/planted"), IsOkAndHolds(std::string("other")));
  EXPECT_THAT(fs_.SetFileContents("/root/no/planted", "x"), StatusIs(absl::StatusCode::kNotFound, _));
}

TEST_F(MemFileSystemTest, WriteFileAtomicallySurvivesCrash) {
  CKPTD_ASSERT_OK(WriteFileAtomically(&fs_, "/root/MANIFEST", "v1"));
  fs_.Crash();
  EXPECT_THAT(ReadFileToString(&fs_, "/root/MANIFEST"), IsOkAndHolds(std::string("v1")));
  EXPECT_THAT(fs_.Stat("/root/MANIFEST.tmp"), StatusIs(absl::StatusCode::kNotFound, _));
}

TEST_F(MemFileSystemTest, ConcurrentUse) {
  constexpr int kThreads = 4;
  constexpr int kFiles = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      const std::string dir = absl::StrCat("/root/t", t);
      ASSERT_THAT(fs_.CreateDir(dir), IsOk());
      for (int i = 0; i < kFiles; ++i) {
        const std::string path = absl::StrCat(dir, "/f", i);
        ASSERT_THAT(WriteFile(&fs_, path + ".tmp", path, /*sync=*/true), IsOk());
        ASSERT_THAT(fs_.Rename(path + ".tmp", path), IsOk());
        ASSERT_THAT(fs_.SyncDir(dir), IsOk());
        ASSERT_THAT(ReadFileToString(&fs_, path), IsOkAndHolds(path));
        ASSERT_THAT(fs_.ListDir("/root").status(), IsOk());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_THAT(fs_.ListDir(absl::StrCat("/root/t", t)), IsOkAndHolds(::testing::SizeIs(kFiles)));
  }
}

TEST_F(MemFileSystemTest, ConcurrentCrash) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < 200; ++i) {
        absl::Status s = WriteFile(&fs_, absl::StrCat("/root/f", t, "-", i), "data", /*sync=*/true);
        // A handle opened before a concurrent crash is aborted.
        EXPECT_TRUE(s.ok() || absl::IsAborted(s)) << s;
        (void)fs_.SyncDir("/root");
      }
    });
  }
  for (int i = 0; i < 20; ++i) fs_.Crash();
  for (std::thread& thread : threads) thread.join();
  CKPTD_EXPECT_OK(fs_.ListDir("/root").status());
}

TEST(MemFileSystemAllocateTest, AllocateAndTruncateFollowTheSyncRule) {
  MemFileSystem fs;
  CKPTD_ASSERT_OK(fs.CreateDir("/d"));
  CKPTD_ASSERT_OK(fs.SyncDir("/"));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto f, fs.NewWritableFile("/d/f", OpenOptions{}));
  CKPTD_ASSERT_OK(fs.SyncDir("/d"));
  CKPTD_ASSERT_OK(f->Allocate(100));
  EXPECT_THAT(fs.Stat("/d/f"), IsOkAndHolds(::testing::Field(&FileInfo::size, 100u)));
  CKPTD_ASSERT_OK(f->Write(0, "abc", 3).status());
  CKPTD_ASSERT_OK(f->Truncate(3));
  CKPTD_ASSERT_OK(f->Sync());
  CKPTD_ASSERT_OK(f->Allocate(50));  // not synced: gone after a crash
  fs.Crash();
  EXPECT_THAT(ReadFileToString(&fs, "/d/f"), IsOkAndHolds(std::string("abc")));
}

}  // namespace
}  // namespace ckptd::storage
