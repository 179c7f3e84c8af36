#include "storage/posix_file_system.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/aligned_buffer.h"
#include "base/status_macros.h"  // testing_matchers.h uses its CONCAT macro
#include "base/testing/fifo.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::storage {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::StatusIs;
using ::ckptd::testing::WithinOrReleaseFifo;
using ::testing::_;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr size_t kBlock = base::kDirectIoAlignment;

enum class Mode { kIoUring, kPread };

std::string ModeName(const ::testing::TestParamInfo<Mode>& info) {
  return info.param == Mode::kIoUring ? "IoUring" : "Pread";
}

// Creates a fresh directory from a mkdtemp template ending in XXXXXX.
std::string MakeTempDir(std::string tmpl) {
  if (mkdtemp(tmpl.data()) == nullptr) return "";
  return tmpl;
}

// Mirrors what the file system should decide: O_DIRECT accepted and not tmpfs.
bool DirHonoursDirectIo(const std::string& dir) {
  const std::string probe = JoinPath(dir, ".direct_probe");
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0640);
  if (fd < 0) return false;
  struct statfs sfs;
  const bool tmpfs = ::fstatfs(fd, &sfs) == 0 && sfs.f_type == TMPFS_MAGIC;
  ::close(fd);
  ::unlink(probe.c_str());
  return !tmpfs;
}

// Deterministic contents for block `index`.
void FillBlock(uint8_t* p, size_t size, uint64_t index) {
  for (size_t i = 0; i < size; ++i) p[i] = static_cast<uint8_t>((index * 131 + i * 7 + i / 251) & 0xff);
}

std::vector<size_t> Shuffled(size_t n, uint32_t seed) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

class PosixFileSystemTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    fs_ = MakeFs(16);
    if (GetParam() == Mode::kIoUring && !fs_->uses_io_uring()) {
      GTEST_SKIP() << "io_uring is not available here";
    }
    dir_ = MakeTempDir(JoinPath(::testing::TempDir(), "posix_fs_test_XXXXXX"));
    ASSERT_FALSE(dir_.empty()) << "mkdtemp: " << std::strerror(errno);
  }

  void TearDown() override {
    if (!dir_.empty()) {
      EXPECT_THAT(RemoveTree(fs_.get(), dir_), IsOk());
    }
  }

  std::unique_ptr<PosixFileSystem> MakeFs(unsigned queue_depth) const {
    PosixFileSystemOptions options;
    options.use_io_uring = GetParam() == Mode::kIoUring;
    options.queue_depth = queue_depth;
    return NewPosixFileSystem(options);
  }

  std::string Path(const std::string& name) const { return JoinPath(dir_, name); }

  static OpenOptions Direct(bool direct) {
    OpenOptions o;
    o.direct_io = direct;
    return o;
  }

  std::unique_ptr<PosixFileSystem> fs_;
  std::string dir_;
};

TEST_P(PosixFileSystemTest, CopyFileDurablyCopiesEveryByteOfAnOddLength) {
  // Longer than two chunks and not a whole block: the tail is padded for the
  // direct write and cut back.
  const size_t length = 3 * 8192 + 4096 + 123;
  std::string contents(length, '\0');
  FillBlock(reinterpret_cast<uint8_t*>(contents.data()), length, 7);
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("from"), contents));
  CKPTD_ASSERT_OK(fs_->CreateDir(Path("sub")));
  CopyOptions copy;
  copy.chunk_bytes = 8192;
  EXPECT_THAT(CopyFileDurably(fs_.get(), Path("from"), fs_.get(), Path("sub/to"), copy),
              ::ckptd::testing::IsOkAndHolds(length));
  EXPECT_THAT(ReadFileToString(fs_.get(), Path("sub/to")), ::ckptd::testing::IsOkAndHolds(contents));
  EXPECT_THAT(fs_->ListDir(Path("sub")), ::ckptd::testing::IsOkAndHolds(::testing::SizeIs(1)));
  // An empty file and a missing one.
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("empty"), ""));
  EXPECT_THAT(CopyFileDurably(fs_.get(), Path("empty"), fs_.get(), Path("sub/empty")),
              ::ckptd::testing::IsOkAndHolds(0u));
  EXPECT_THAT(CopyFileDurably(fs_.get(), Path("nope"), fs_.get(), Path("sub/nope")),
              ::ckptd::testing::StatusIs(absl::StatusCode::kNotFound, ::testing::HasSubstr("copy: reading")));
}

TEST_P(PosixFileSystemTest, CopyFileDurablyAskedToStopLeavesNothingAndTheOldTargetUntouched) {
  const size_t length = 3 * 8192 + 123;
  std::string contents(length, '\0');
  FillBlock(reinterpret_cast<uint8_t*>(contents.data()), length, 9);
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("from"), contents));
  CKPTD_ASSERT_OK(fs_->CreateDir(Path("sub")));
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("sub/to"), "old"));
  // Stops once the first chunk is written.
  int asked = 0;
  CopyOptions copy;
  copy.chunk_bytes = 8192;
  copy.stop = [&] { return asked++ >= 1; };
  EXPECT_THAT(CopyFileDurably(fs_.get(), Path("from"), fs_.get(), Path("sub/to"), copy),
              StatusIs(absl::StatusCode::kCancelled,
                       AllOf(HasSubstr(Path("from")), HasSubstr(Path("sub/to")),
                             HasSubstr(absl::StrCat("stopped with 8192 of ", length, " bytes written")))));
  EXPECT_EQ(asked, 2);
  EXPECT_THAT(fs_->ListDir(Path("sub")), IsOkAndHolds(::testing::SizeIs(1)));  // no sub/to.tmp
  EXPECT_THAT(ReadFileToString(fs_.get(), Path("sub/to")), IsOkAndHolds(std::string("old")));
  // A stop that never says stop: copied whole.
  copy.stop = [] { return false; };
  EXPECT_THAT(CopyFileDurably(fs_.get(), Path("from"), fs_.get(), Path("sub/to"), copy), IsOkAndHolds(length));
  EXPECT_THAT(ReadFileToString(fs_.get(), Path("sub/to")), IsOkAndHolds(contents));
  EXPECT_THAT(fs_->ListDir(Path("sub")), IsOkAndHolds(::testing::SizeIs(1)));
}

// sync_file_range on a buffered file; nothing (and no error) on one written
// direct; the closed file's error after Close.
TEST_P(PosixFileSystemTest, StartWritebackOfCompletedWrites) {
  base::AlignedBuffer buf(4 * kBlock);
  FillBlock(buf.data(), 4 * kBlock, 5);
  for (const bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct" : "buffered");
    const std::string path = Path(direct ? "wb-direct" : "wb-buffered");
    CKPTD_ASSERT_OK_AND_ASSIGN(auto writer, fs_->NewWritableFile(path, Direct(direct)));
    CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t t, writer->Write(0, buf.data(), 4 * kBlock));
    CKPTD_ASSERT_OK(writer->WaitFor(t));
    CKPTD_EXPECT_OK(writer->StartWriteback(0, 2 * kBlock));
    CKPTD_EXPECT_OK(writer->StartWriteback(2 * kBlock, 2 * kBlock));
    CKPTD_EXPECT_OK(writer->StartWriteback(0, 0));
    CKPTD_ASSERT_OK(writer->Sync());
    CKPTD_ASSERT_OK(writer->Close());
    EXPECT_THAT(writer->StartWriteback(0, kBlock), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(path)));
    CKPTD_ASSERT_OK_AND_ASSIGN(std::string got, ReadFileToString(fs_.get(), path));
    ASSERT_EQ(got.size(), 4 * kBlock);
    EXPECT_EQ(std::memcmp(got.data(), buf.data(), got.size()), 0);
  }
}

TEST_P(PosixFileSystemTest, ReportsIoMode) {
  EXPECT_EQ(fs_->uses_io_uring(), GetParam() == Mode::kIoUring);
}

TEST_P(PosixFileSystemTest, WritesOutOfOrderBlocksInFlightAndReadsBack) {
  constexpr size_t kBlocks = 64;
  const std::string path = Path("blocks");
  base::AlignedBuffer src(kBlocks * kBlock);
  for (size_t i = 0; i < kBlocks; ++i) FillBlock(src.data() + i * kBlock, kBlock, i);

  CKPTD_ASSERT_OK_AND_ASSIGN(auto writer, fs_->NewWritableFile(path, Direct(true)));
  std::vector<uint64_t> tickets;
  for (size_t i : Shuffled(kBlocks, 1)) {
    CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t t, writer->Write(i * kBlock, src.data() + i * kBlock, kBlock));
    if (!tickets.empty()) {
      EXPECT_GT(t, tickets.back());
    }
    tickets.push_back(t);
  }
  CKPTD_ASSERT_OK(writer->WaitAll());
  CKPTD_ASSERT_OK(writer->Sync());
  CKPTD_ASSERT_OK(writer->Close());

  CKPTD_ASSERT_OK_AND_ASSIGN(FileInfo info, fs_->Stat(path));
  EXPECT_EQ(info.size, kBlocks * kBlock);

  CKPTD_ASSERT_OK_AND_ASSIGN(auto reader, fs_->NewReadableFile(path, Direct(true)));
  EXPECT_EQ(reader->size(), kBlocks * kBlock);
  base::AlignedBuffer dst(kBlocks * kBlock);
  std::vector<uint64_t> read_tickets(kBlocks);
  for (size_t i : Shuffled(kBlocks, 2)) {
    CKPTD_ASSERT_OK_AND_ASSIGN(read_tickets[i], reader->Read(i * kBlock, dst.data() + i * kBlock, kBlock));
  }
  for (size_t i : Shuffled(kBlocks, 3)) CKPTD_ASSERT_OK(reader->WaitFor(read_tickets[i]));
  CKPTD_ASSERT_OK(reader->Close());
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), kBlocks * kBlock), 0);
}

TEST_P(PosixFileSystemTest, QueueDeeperThanQueueDepth) {
  auto fs = MakeFs(4);
  constexpr size_t kWrites = 100;
  const std::string path = Path("deep");
  base::AlignedBuffer src(kWrites * kBlock);
  for (size_t i = 0; i < kWrites; ++i) FillBlock(src.data() + i * kBlock, kBlock, i + 1000);

  CKPTD_ASSERT_OK_AND_ASSIGN(auto writer, fs->NewWritableFile(path, Direct(true)));
  for (size_t i : Shuffled(kWrites, 4)) {
    CKPTD_ASSERT_OK(writer->Write(i * kBlock, src.data() + i * kBlock, kBlock).status());
  }
  CKPTD_ASSERT_OK(writer->Close());

  CKPTD_ASSERT_OK_AND_ASSIGN(auto reader, fs->NewReadableFile(path, Direct(true)));
  base::AlignedBuffer dst(kWrites * kBlock);
  for (size_t i = 0; i < kWrites; ++i) {
    CKPTD_ASSERT_OK(reader->Read(i * kBlock, dst.data() + i * kBlock, kBlock).status());
  }
  CKPTD_ASSERT_OK(reader->WaitAll());
  CKPTD_ASSERT_OK(reader->Close());
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), kWrites * kBlock), 0);
}

TEST_P(PosixFileSystemTest, WaitForInArbitraryOrder) {
  constexpr size_t kWrites = 32;
  const std::string path = Path("wait_order");
  base::AlignedBuffer src(kWrites * kBlock);
  for (size_t i = 0; i < kWrites; ++i) FillBlock(src.data() + i * kBlock, kBlock, i + 7);

  CKPTD_ASSERT_OK_AND_ASSIGN(auto writer, fs_->NewWritableFile(path, Direct(true)));
  std::vector<uint64_t> tickets;
  for (size_t i = 0; i < kWrites; ++i) {
    CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t t, writer->Write(i * kBlock, src.data() + i * kBlock, kBlock));
    tickets.push_back(t);
  }
  for (size_t i : Shuffled(kWrites, 5)) CKPTD_EXPECT_OK(writer->WaitFor(tickets[i]));
  // Waiting again on a completed ticket is fine; unknown tickets are not.
  CKPTD_EXPECT_OK(writer->WaitFor(tickets.front()));
  EXPECT_THAT(writer->WaitFor(0), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path)));
  EXPECT_THAT(writer->WaitFor(tickets.back() + 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path)));
  CKPTD_ASSERT_OK(writer->Close());

  CKPTD_ASSERT_OK_AND_ASSIGN(std::string contents, ReadFileToString(fs_.get(), path));
  ASSERT_EQ(contents.size(), kWrites * kBlock);
  EXPECT_EQ(std::memcmp(contents.data(), src.data(), contents.size()), 0);
}

TEST_P(PosixFileSystemTest, DirectIoReportsAlignmentAndRejectsMisalignedTransfers) {
  const std::string path = Path("direct");
  const bool direct = DirHonoursDirectIo(dir_);
  base::AlignedBuffer buf(2 * kBlock);
  FillBlock(buf.data(), 2 * kBlock, 3);

  CKPTD_ASSERT_OK_AND_ASSIGN(auto writer, fs_->NewWritableFile(path, Direct(true)));
  EXPECT_EQ(writer->alignment(), direct ? base::kDirectIoAlignment : 1);
  if (direct) {
    const auto invalid = StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path));
    EXPECT_THAT(writer->Write(0, buf.data() + 1, kBlock), invalid);
    EXPECT_THAT(writer->Write(100, buf.data(), kBlock), invalid);
    EXPECT_THAT(writer->Write(0, buf.data(), 100), invalid);
  }
  // A rejected request does not fail the file.
  CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t t, writer->Write(0, buf.data(), 2 * kBlock));
  CKPTD_ASSERT_OK(writer->WaitFor(t));
  CKPTD_ASSERT_OK(writer->Close());

  CKPTD_ASSERT_OK_AND_ASSIGN(auto reader, fs_->NewReadableFile(path, Direct(true)));
  EXPECT_EQ(reader->alignment(), direct ? base::kDirectIoAlignment : 1);
  base::AlignedBuffer dst(2 * kBlock);
  if (direct) {
    EXPECT_THAT(reader->Read(0, dst.data() + 512, kBlock),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path)));
  }
  CKPTD_ASSERT_OK(reader->ReadAt(kBlock, dst.data(), kBlock));
  EXPECT_EQ(std::memcmp(dst.data(), buf.data() + kBlock, kBlock), 0);
  CKPTD_ASSERT_OK(reader->Close());

  // Buffered files accept any alignment.
  CKPTD_ASSERT_OK_AND_ASSIGN(auto buffered, fs_->NewWritableFile(Path("buffered"), Direct(false)));
  EXPECT_EQ(buffered->alignment(), 1u);
  CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t bt, buffered->Write(3, buf.data() + 1, 100));
  CKPTD_ASSERT_OK(buffered->WaitFor(bt));
  CKPTD_ASSERT_OK(buffered->Close());
  CKPTD_ASSERT_OK_AND_ASSIGN(FileInfo info, fs_->Stat(Path("buffered")));
  EXPECT_EQ(info.size, 103u);
}

TEST_P(PosixFileSystemTest, TmpfsFileFallsBackToBuffered) {
  if (::access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no writable /dev/shm";
  const std::string shm_dir = MakeTempDir("/dev/shm/ckptd_posix_fs_test_XXXXXX");
  ASSERT_FALSE(shm_dir.empty());
  const std::string path = JoinPath(shm_dir, "f");
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(auto writer, fs_->NewWritableFile(path, Direct(true)));
    EXPECT_EQ(writer->alignment(), 1u);
    const std::string data = "unaligned tmpfs data";
    CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t t, writer->Write(5, data.data(), data.size()));
    CKPTD_ASSERT_OK(writer->WaitFor(t));
    CKPTD_ASSERT_OK(writer->Sync());
    CKPTD_ASSERT_OK(writer->Close());

    CKPTD_ASSERT_OK_AND_ASSIGN(auto reader, fs_->NewReadableFile(path, Direct(true)));
    EXPECT_EQ(reader->alignment(), 1u);
    EXPECT_EQ(reader->size(), 5 + data.size());
    std::string got(data.size(), '\0');
    CKPTD_ASSERT_OK(reader->ReadAt(5, got.data(), got.size()));
    EXPECT_EQ(got, data);
    CKPTD_ASSERT_OK(reader->Close());
  }
  CKPTD_EXPECT_OK(RemoveTree(fs_.get(), shm_dir));
}

TEST_P(PosixFileSystemTest, ReadPastEndIsTruncatedAndTheErrorSticks) {
  const std::string path = Path("short");
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), path, std::string(5000, 'x')));

  CKPTD_ASSERT_OK_AND_ASSIGN(auto reader, fs_->NewReadableFile(path, Direct(false)));
  EXPECT_EQ(reader->size(), 5000u);
  std::string buf(8192, '\0');
  const auto truncated =
      StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("truncated"), HasSubstr(path)));
  EXPECT_THAT(reader->ReadAt(0, buf.data(), buf.size()), truncated);
  // The partial data arrived before the end of file was hit.
  EXPECT_EQ(buf.substr(0, 5000), std::string(5000, 'x'));
  // Every later call returns the first error.
  EXPECT_THAT(reader->Read(0, buf.data(), 10), truncated);
  EXPECT_THAT(reader->WaitAll(), truncated);
  EXPECT_THAT(reader->Close(), truncated);

  CKPTD_ASSERT_OK_AND_ASSIGN(auto beyond, fs_->NewReadableFile(path, Direct(false)));
  EXPECT_THAT(beyond->ReadAt(6000, buf.data(), 1), truncated);
}

TEST_P(PosixFileSystemTest, DirectReadPastEndIsTruncated) {
  const std::string path = Path("direct_short");
  base::AlignedBuffer buf(3 * kBlock);
  FillBlock(buf.data(), 3 * kBlock, 9);
  {
    // Two whole blocks, then a partial one through a buffered file.
    CKPTD_ASSERT_OK_AND_ASSIGN(auto writer, fs_->NewWritableFile(path, Direct(false)));
    CKPTD_ASSERT_OK(writer->Write(0, buf.data(), 2 * kBlock + 100).status());
    CKPTD_ASSERT_OK(writer->Close());
  }
  const auto truncated =
      StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("truncated"), HasSubstr(path)));
  base::AlignedBuffer dst(4 * kBlock);
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(auto reader, fs_->NewReadableFile(path, Direct(true)));
    EXPECT_THAT(reader->ReadAt(0, dst.data(), 3 * kBlock), truncated);
  }
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(auto reader, fs_->NewReadableFile(path, Direct(true)));
    CKPTD_ASSERT_OK(reader->ReadAt(0, dst.data(), 2 * kBlock));
    EXPECT_THAT(reader->ReadAt(3 * kBlock, dst.data(), kBlock), truncated);
  }
  EXPECT_EQ(std::memcmp(dst.data(), buf.data(), 2 * kBlock), 0);
}

TEST_P(PosixFileSystemTest, MissingPathsAreNotFoundAndNamed) {
  const std::string missing = Path("missing");
  const auto not_found = StatusIs(absl::StatusCode::kNotFound, HasSubstr(missing));
  EXPECT_THAT(fs_->NewReadableFile(missing, Direct(true)), not_found);
  EXPECT_THAT(fs_->NewReadableFile(missing, Direct(false)), not_found);
  EXPECT_THAT(fs_->NewWritableFile(JoinPath(missing, "f"), Direct(true)), not_found);
  EXPECT_THAT(fs_->Stat(missing), not_found);
  EXPECT_THAT(fs_->RemoveFile(missing), not_found);
  EXPECT_THAT(fs_->RemoveDir(missing), not_found);
  EXPECT_THAT(fs_->ListDir(missing), not_found);
  EXPECT_THAT(fs_->SyncDir(missing), not_found);
  EXPECT_THAT(fs_->Rename(missing, Path("to")), not_found);
  EXPECT_THAT(fs_->CreateDir(JoinPath(missing, "child")), not_found);
}

TEST_P(PosixFileSystemTest, OpeningADirectoryAsAFileFails) {
  EXPECT_THAT(fs_->NewReadableFile(dir_, Direct(false)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(dir_)));
  EXPECT_THAT(fs_->NewWritableFile(dir_, Direct(false)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(dir_)));
}

TEST_P(PosixFileSystemTest, RenameReplacesTargetAndSyncDir) {
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("a"), "new contents"));
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("b"), "old"));
  CKPTD_ASSERT_OK(fs_->Rename(Path("a"), Path("b")));
  CKPTD_ASSERT_OK(fs_->SyncDir(dir_));
  EXPECT_THAT(fs_->Stat(Path("a")), StatusIs(absl::StatusCode::kNotFound, HasSubstr(Path("a"))));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string contents, ReadFileToString(fs_.get(), Path("b")));
  EXPECT_EQ(contents, "new contents");
  // No temp file is left behind by WriteFileAtomically.
  CKPTD_ASSERT_OK_AND_ASSIGN(auto entries, fs_->ListDir(dir_));
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].name, "b");
  // SyncDir on a file is rejected (O_DIRECTORY).
  EXPECT_THAT(fs_->SyncDir(Path("b")), StatusIs(absl::StatusCode::kNotFound, HasSubstr(Path("b"))));
}

TEST_P(PosixFileSystemTest, ListDirIsSortedWithTypesAndSizes) {
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("b"), "12345"));
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("a"), ""));
  CKPTD_ASSERT_OK(fs_->CreateDir(Path("c")));
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("Z"), "xy"));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto entries, fs_->ListDir(dir_));
  std::vector<std::string> names;
  for (const FileInfo& e : entries) names.push_back(e.name);
  EXPECT_THAT(names, ElementsAre("Z", "a", "b", "c"));
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_FALSE(entries[0].is_directory);
  EXPECT_EQ(entries[0].size, 2u);
  EXPECT_EQ(entries[1].size, 0u);
  EXPECT_EQ(entries[2].size, 5u);
  EXPECT_TRUE(entries[3].is_directory);

  CKPTD_ASSERT_OK_AND_ASSIGN(auto empty, fs_->ListDir(Path("c")));
  EXPECT_TRUE(empty.empty());
}

TEST_P(PosixFileSystemTest, StatReportsFilesAndDirectories) {
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("f"), "hello"));
  CKPTD_ASSERT_OK_AND_ASSIGN(FileInfo file, fs_->Stat(Path("f")));
  EXPECT_EQ(file.name, Path("f"));
  EXPECT_FALSE(file.is_directory);
  EXPECT_EQ(file.size, 5u);
  CKPTD_ASSERT_OK_AND_ASSIGN(FileInfo dir, fs_->Stat(dir_));
  EXPECT_TRUE(dir.is_directory);
}

TEST_P(PosixFileSystemTest, RemoveDirOnlyRemovesEmptyDirectories) {
  CKPTD_ASSERT_OK(fs_->CreateDir(Path("d")));
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("d/f"), "x"));
  EXPECT_THAT(fs_->RemoveDir(Path("d")),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr(Path("d"))));
  CKPTD_ASSERT_OK(fs_->RemoveFile(Path("d/f")));
  CKPTD_ASSERT_OK(fs_->RemoveDir(Path("d")));
  EXPECT_THAT(fs_->Stat(Path("d")), StatusIs(absl::StatusCode::kNotFound, HasSubstr(Path("d"))));
}

TEST_P(PosixFileSystemTest, CreateDirOnExistingFileFails) {
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("f"), "x"));
  EXPECT_THAT(fs_->CreateDir(Path("f")),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr(Path("f"))));
  // An existing directory is fine.
  CKPTD_ASSERT_OK(fs_->CreateDir(Path("d")));
  CKPTD_EXPECT_OK(fs_->CreateDir(Path("d")));
  CKPTD_EXPECT_OK(CreateDirs(fs_.get(), Path("x/y/z")));
  CKPTD_ASSERT_OK_AND_ASSIGN(FileInfo info, fs_->Stat(Path("x/y/z")));
  EXPECT_TRUE(info.is_directory);
}

TEST_P(PosixFileSystemTest, ZeroLengthTransfersAndCallsAfterClose) {
  const std::string path = Path("zero");
  CKPTD_ASSERT_OK_AND_ASSIGN(auto writer, fs_->NewWritableFile(path, Direct(true)));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t t, writer->Write(0, nullptr, 0));
  CKPTD_EXPECT_OK(writer->WaitFor(t));
  CKPTD_ASSERT_OK(writer->Sync());
  CKPTD_ASSERT_OK(writer->Close());
  CKPTD_EXPECT_OK(writer->Close());
  const auto closed = StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(path));
  EXPECT_THAT(writer->Write(0, nullptr, 0), closed);
  EXPECT_THAT(writer->WaitAll(), closed);
  EXPECT_THAT(writer->Sync(), closed);

  CKPTD_ASSERT_OK_AND_ASSIGN(auto reader, fs_->NewReadableFile(path, Direct(true)));
  EXPECT_EQ(reader->size(), 0u);
  CKPTD_EXPECT_OK(reader->ReadAt(0, nullptr, 0));
  CKPTD_ASSERT_OK(reader->Close());
  EXPECT_THAT(reader->Read(0, nullptr, 0), closed);
}

TEST_P(PosixFileSystemTest, CreatingTruncatesAnExistingFile) {
  const std::string path = Path("trunc");
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), path, std::string(10000, 'a')));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto writer, fs_->NewWritableFile(path, Direct(false)));
  CKPTD_ASSERT_OK(writer->Write(0, "bb", 2).status());
  CKPTD_ASSERT_OK(writer->Close());
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string contents, ReadFileToString(fs_.get(), path));
  EXPECT_EQ(contents, "bb");
}

TEST_P(PosixFileSystemTest, AllocateExtendsAndTruncateCuts) {
  const std::string path = Path("alloc");
  base::AlignedBuffer src(2 * kBlock);
  FillBlock(src.data(), 2 * kBlock, 5);
  CKPTD_ASSERT_OK_AND_ASSIGN(auto writer, fs_->NewWritableFile(path, Direct(true)));
  // ext4 and xfs support fallocate; a file system that does not says so.
  absl::Status allocated = writer->Allocate(16 * kBlock);
  if (absl::IsUnimplemented(allocated)) GTEST_SKIP() << allocated;
  CKPTD_ASSERT_OK(allocated);
  CKPTD_ASSERT_OK_AND_ASSIGN(FileInfo info, fs_->Stat(path));
  EXPECT_EQ(info.size, 16 * kBlock);
  CKPTD_ASSERT_OK(writer->Write(0, src.data(), 2 * kBlock).status());
  CKPTD_ASSERT_OK(writer->Truncate(2 * kBlock));
  CKPTD_ASSERT_OK(writer->Sync());
  CKPTD_ASSERT_OK(writer->Close());
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string contents, ReadFileToString(fs_.get(), path));
  ASSERT_EQ(contents.size(), 2 * kBlock);
  EXPECT_EQ(std::memcmp(contents.data(), src.data(), contents.size()), 0);
}

TEST_P(PosixFileSystemTest, AllocatePastFreeSpaceIsResourceExhausted) {
  const std::string path = Path("huge");
  CKPTD_ASSERT_OK_AND_ASSIGN(auto writer, fs_->NewWritableFile(path, Direct(false)));
  // 1 EiB: no disk here has that much free space.
  absl::Status allocated = writer->Allocate(uint64_t{1} << 60);
  if (absl::IsUnimplemented(allocated)) GTEST_SKIP() << allocated;
  EXPECT_THAT(allocated, ::testing::AnyOf(StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr(path)),
                                          StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path))));
  // The file stays usable.
  CKPTD_ASSERT_OK(writer->Write(0, "ok", 2).status());
  CKPTD_ASSERT_OK(writer->Close());
}

TEST_P(PosixFileSystemTest, DestructorFinishesQueuedWrites) {
  constexpr size_t kBlocks = 8;
  const std::string path = Path("unclosed");
  base::AlignedBuffer src(kBlocks * kBlock);
  FillBlock(src.data(), kBlocks * kBlock, 11);
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(auto writer, fs_->NewWritableFile(path, Direct(true)));
    for (size_t i = 0; i < kBlocks; ++i) {
      CKPTD_ASSERT_OK(writer->Write(i * kBlock, src.data() + i * kBlock, kBlock).status());
    }
    // Destroyed without WaitAll or Close.
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string contents, ReadFileToString(fs_.get(), path));
  ASSERT_EQ(contents.size(), kBlocks * kBlock);
  EXPECT_EQ(std::memcmp(contents.data(), src.data(), contents.size()), 0);
}

TEST_P(PosixFileSystemTest, LargeTransfer) {
  constexpr size_t kSize = 8 << 20;
  const std::string path = Path("large");
  base::AlignedBuffer src(kSize);
  FillBlock(src.data(), kSize, 17);
  CKPTD_ASSERT_OK_AND_ASSIGN(auto writer, fs_->NewWritableFile(path, Direct(true)));
  CKPTD_ASSERT_OK(writer->Write(0, src.data(), kSize).status());
  CKPTD_ASSERT_OK(writer->Sync());
  CKPTD_ASSERT_OK(writer->Close());
  CKPTD_ASSERT_OK_AND_ASSIGN(auto reader, fs_->NewReadableFile(path, Direct(true)));
  base::AlignedBuffer dst(kSize);
  CKPTD_ASSERT_OK(reader->ReadAt(0, dst.data(), kSize));
  CKPTD_ASSERT_OK(reader->Close());
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), kSize), 0);
}

TEST_P(PosixFileSystemTest, OneFileSystemManyThreads) {
  constexpr int kThreads = 4;
  constexpr size_t kBlocks = 16;
  std::vector<absl::Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      results[t] = [&]() -> absl::Status {
        const std::string path = Path(absl::StrCat("thread_", t));
        base::AlignedBuffer src(kBlocks * kBlock);
        FillBlock(src.data(), kBlocks * kBlock, 100 + t);
        absl::StatusOr<std::unique_ptr<WritableFile>> writer = fs_->NewWritableFile(path, Direct(true));
        if (!writer.ok()) return writer.status();
        for (size_t i = 0; i < kBlocks; ++i) {
          absl::StatusOr<uint64_t> w = (*writer)->Write(i * kBlock, src.data() + i * kBlock, kBlock);
          if (!w.ok()) return w.status();
        }
        if (absl::Status s = (*writer)->Close(); !s.ok()) return s;
        absl::StatusOr<std::string> contents = ReadFileToString(fs_.get(), path);
        if (!contents.ok()) return contents.status();
        if (contents->size() != kBlocks * kBlock ||
            std::memcmp(contents->data(), src.data(), contents->size()) != 0) {
          return absl::InternalError(absl::StrCat(path, ": contents differ"));
        }
        return absl::OkStatus();
      }();
    });
  }
  for (std::thread& th : threads) th.join();
  for (const absl::Status& s : results) CKPTD_EXPECT_OK(s);
}

INSTANTIATE_TEST_SUITE_P(Modes, PosixFileSystemTest, ::testing::Values(Mode::kIoUring, Mode::kPread),
                         ModeName);

TEST(PosixFileSystemOptionsTest, UseIoUringFalseForcesPreadPwrite) {
  PosixFileSystemOptions options;
  options.use_io_uring = false;
  EXPECT_FALSE(NewPosixFileSystem(options)->uses_io_uring());
}

bool IsLink(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

// Issue 16 (2): a step folder under a storage root that is a link to a folder
// elsewhere had everything in that folder deleted by RemoveTree.
TEST_P(PosixFileSystemTest, RemoveTreeRemovesALinkNeverWhatItPointsTo) {
  CKPTD_ASSERT_OK(CreateDirs(fs_.get(), Path("outside/sub")));
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("outside/a"), "keep a"));
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("outside/sub/b"), "keep b"));
  auto expect_outside_intact = [&] {
    EXPECT_THAT(ReadFileToString(fs_.get(), Path("outside/a")), IsOkAndHolds(std::string("keep a")));
    EXPECT_THAT(ReadFileToString(fs_.get(), Path("outside/sub/b")), IsOkAndHolds(std::string("keep b")));
  };
  // step-1 is a link to the outside folder; step-2 a folder holding a link to
  // a file in place of a shard and a link to the outside folder.
  CKPTD_ASSERT_OK(CreateDirs(fs_.get(), Path("root/job/step-2")));
  ASSERT_EQ(::symlink(Path("outside").c_str(), Path("root/job/step-1").c_str()), 0) << std::strerror(errno);
  ASSERT_EQ(::symlink(Path("outside/a").c_str(), Path("root/job/step-2/rank-0.shard").c_str()), 0);
  ASSERT_EQ(::symlink(Path("outside").c_str(), Path("root/job/step-2/extra").c_str()), 0);

  // The link named as the tree goes, and nothing it points to; a trailing
  // slash (which makes the kernel follow a link) changes nothing.
  CKPTD_EXPECT_OK(RemoveTree(fs_.get(), Path("root/job/step-1/")));
  EXPECT_FALSE(IsLink(Path("root/job/step-1")));
  expect_outside_intact();
  ASSERT_EQ(::symlink(Path("outside").c_str(), Path("root/job/step-1").c_str()), 0);
  CKPTD_EXPECT_OK(RemoveTree(fs_.get(), Path("root/job/step-1")));
  EXPECT_FALSE(IsLink(Path("root/job/step-1")));
  expect_outside_intact();

  // Links below the tree go as entries, in a paced removal too.
  ASSERT_EQ(::symlink(Path("outside").c_str(), Path("root/job/step-1").c_str()), 0);
  RemoveTreeOptions paced;
  paced.batch = 1;
  std::vector<size_t> asked;
  paced.before_batch = [&](size_t removed) {
    asked.push_back(removed);
    return absl::OkStatus();
  };
  CKPTD_EXPECT_OK(RemoveTree(fs_.get(), Path("root/job"), paced));
  EXPECT_THAT(asked, ElementsAre(0u, 1u));  // step-1, step-2
  EXPECT_THAT(fs_->Stat(Path("root/job")), StatusIs(absl::StatusCode::kNotFound, HasSubstr(Path("root/job"))));
  expect_outside_intact();
  // The generic walk (what a wrapper such as FaultInjectionFileSystem uses)
  // does not follow links either.
  ASSERT_EQ(::symlink(Path("outside").c_str(), Path("root/link").c_str()), 0);
  CKPTD_EXPECT_OK(fs_->FileSystem::RemoveTree(Path("root"), RemoveTreeOptions()));
  EXPECT_THAT(fs_->Stat(Path("root")), StatusIs(absl::StatusCode::kNotFound, HasSubstr(Path("root"))));
  expect_outside_intact();
}

TEST_P(PosixFileSystemTest, RemoveTreeBelowAPrefixNeverWalksThroughALinkOnTheWay) {
  CKPTD_ASSERT_OK(CreateDirs(fs_.get(), Path("outside/step-1")));
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("outside/step-1/MANIFEST"), "keep m"));
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("outside/step-1/rank-0.shard"), "keep s"));
  CKPTD_ASSERT_OK(CreateDirs(fs_.get(), Path("root")));
  // The job folder is a link (as if swapped in after the store checked it).
  ASSERT_EQ(::symlink(Path("outside").c_str(), Path("root/job").c_str()), 0) << std::strerror(errno);
  RemoveTreeOptions below;
  below.links_allowed_up_to = Path("root");
  below.remove_first = {"MANIFEST"};
  // Both walks: the one by descriptor and the generic one.
  EXPECT_THAT(RemoveTree(fs_.get(), Path("root/job/step-1"), below),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("left alone")));
  EXPECT_THAT(fs_->FileSystem::RemoveTree(Path("root/job/step-1"), below),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("left alone")));
  EXPECT_THAT(ReadFileToString(fs_.get(), Path("outside/step-1/MANIFEST")), IsOkAndHolds(std::string("keep m")));
  EXPECT_THAT(ReadFileToString(fs_.get(), Path("outside/step-1/rank-0.shard")), IsOkAndHolds(std::string("keep s")));
  // A real folder goes, the MANIFEST first; a missing one is no error.
  ASSERT_EQ(::unlink(Path("root/job").c_str()), 0);
  CKPTD_ASSERT_OK(CreateDirs(fs_.get(), Path("root/job/step-1")));
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("root/job/step-1/MANIFEST"), "m"));
  CKPTD_EXPECT_OK(RemoveTree(fs_.get(), Path("root/job/step-1"), below));
  EXPECT_THAT(fs_->Stat(Path("root/job/step-1")), StatusIs(absl::StatusCode::kNotFound, _));
  CKPTD_EXPECT_OK(RemoveTree(fs_.get(), Path("root/job/step-1"), below));
  CKPTD_EXPECT_OK(fs_->FileSystem::RemoveTree(Path("root/job/step-1"), below));
  EXPECT_THAT(RemoveTree(fs_.get(), Path("elsewhere/x"), below), StatusIs(absl::StatusCode::kInvalidArgument, _));
}

TEST_P(PosixFileSystemTest, StatAndListDirReportALinkAsALink) {
  CKPTD_ASSERT_OK(fs_->CreateDir(Path("d")));
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("f"), "12345"));
  ASSERT_EQ(::symlink(Path("d").c_str(), Path("link-to-dir").c_str()), 0) << std::strerror(errno);
  ASSERT_EQ(::symlink(Path("f").c_str(), Path("link-to-file").c_str()), 0);
  ASSERT_EQ(::symlink(Path("nowhere").c_str(), Path("dangling").c_str()), 0);
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0640), 0) << std::strerror(errno);

  for (const char* name : {"link-to-dir", "link-to-file", "dangling"}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(FileInfo info, fs_->Stat(Path(name)));
    EXPECT_EQ(info.type, FileType::kSymlink) << name;
    EXPECT_FALSE(info.is_directory) << name;
    EXPECT_EQ(info.size, 0u) << name;
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(FileInfo fifo, fs_->Stat(Path("fifo")));
  EXPECT_EQ(fifo.type, FileType::kOther);
  CKPTD_ASSERT_OK_AND_ASSIGN(FileInfo file, fs_->Stat(Path("f")));
  EXPECT_EQ(file.type, FileType::kRegular);
  EXPECT_EQ(file.size, 5u);
  CKPTD_ASSERT_OK_AND_ASSIGN(FileInfo dir, fs_->Stat(Path("d")));
  EXPECT_EQ(dir.type, FileType::kDirectory);
  EXPECT_TRUE(dir.is_directory);

  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FileInfo> entries, fs_->ListDir(dir_));
  std::vector<std::pair<std::string, FileType>> got;
  for (const FileInfo& e : entries) {
    got.emplace_back(e.name, e.type);
    EXPECT_EQ(e.is_directory, e.type == FileType::kDirectory) << e.name;
  }
  EXPECT_THAT(got, ElementsAre(std::pair{std::string("d"), FileType::kDirectory},
                               std::pair{std::string("dangling"), FileType::kSymlink},
                               std::pair{std::string("f"), FileType::kRegular},
                               std::pair{std::string("fifo"), FileType::kOther},
                               std::pair{std::string("link-to-dir"), FileType::kSymlink},
                               std::pair{std::string("link-to-file"), FileType::kSymlink}));

  CKPTD_EXPECT_OK(CheckIsDirectory(fs_.get(), Path("d")));
  EXPECT_THAT(CheckIsDirectory(fs_.get(), Path("link-to-dir")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(Path("link-to-dir") + " is a symbolic link, not a directory")));
  EXPECT_THAT(CheckIsDirectory(fs_.get(), Path("fifo")),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("FIFO, socket or device")));
  EXPECT_THAT(CheckIsDirectory(fs_.get(), Path("missing")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(Path("missing"))));

  // A directory of the layout is never taken through a link to one...
  EXPECT_THAT(fs_->CreateDir(Path("link-to-dir")),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("symbolic link")));
  // ...but a link the operator put on the way to a root is theirs to follow.
  CKPTD_EXPECT_OK(CreateDirs(fs_.get(), Path("link-to-dir")));
  CKPTD_EXPECT_OK(CreateDirs(fs_.get(), Path("link-to-dir/x/y")));
  CKPTD_ASSERT_OK_AND_ASSIGN(FileInfo made, fs_->Stat(Path("d/x/y")));
  EXPECT_TRUE(made.is_directory);
}

// Issue 16 (4): opening a FIFO for reading waits for a writer: a FIFO in place
// of a shard hung `ckptctl verify` and the agent's restore.
TEST_P(PosixFileSystemTest, OpeningAFifoForReadingIsAnErrorNotAHang) {
  const std::string fifo = Path("rank-0.shard");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0640), 0) << std::strerror(errno);
  const auto is_fifo_error = StatusIs(absl::StatusCode::kDataLoss, HasSubstr(fifo + " is a FIFO, not a regular file"));
  for (bool direct : {true, false}) {
    EXPECT_THAT(WithinOrReleaseFifo(fifo, [&] { return fs_->NewReadableFile(fifo, Direct(direct)).status(); }),
                is_fifo_error)
        << "direct " << direct;
  }
  EXPECT_THAT(WithinOrReleaseFifo(fifo, [&] { return ReadFileToString(fs_.get(), fifo).status(); }), is_fifo_error);
  // Following links does not make a FIFO a file.
  OpenOptions follow = Direct(false);
  follow.follow_symlinks = true;
  EXPECT_THAT(WithinOrReleaseFifo(fifo, [&] { return fs_->NewReadableFile(fifo, follow).status(); }), is_fifo_error);
  // A regular file opened the same way reads normally (O_NONBLOCK is cleared).
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("f"), "contents"));
  EXPECT_THAT(ReadFileToString(fs_.get(), Path("f")), IsOkAndHolds(std::string("contents")));
}

TEST_P(PosixFileSystemTest, OpeningALinkForReadingIsRefusedUnlessAsked) {
  CKPTD_ASSERT_OK(fs_->CreateDir(Path("outside")));
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("outside/secret"), "not a shard"));
  const std::string link = Path("MANIFEST");
  ASSERT_EQ(::symlink(Path("outside/secret").c_str(), link.c_str()), 0) << std::strerror(errno);
  const auto is_link_error =
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr(link + " is a symbolic link, not a regular file"));
  EXPECT_THAT(fs_->NewReadableFile(link, Direct(true)), is_link_error);
  EXPECT_THAT(fs_->NewReadableFile(link, Direct(false)), is_link_error);
  EXPECT_THAT(ReadFileToString(fs_.get(), link), is_link_error);
  // Asked for (a path an operator names), the link is followed.
  OpenOptions follow = Direct(false);
  follow.follow_symlinks = true;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> file, fs_->NewReadableFile(link, follow));
  EXPECT_EQ(file->size(), 11u);
  // Links above the file (a storage root that is one) are followed as ever.
  ASSERT_EQ(::symlink(Path("outside").c_str(), Path("root-link").c_str()), 0);
  EXPECT_THAT(ReadFileToString(fs_.get(), Path("root-link/secret")), IsOkAndHolds(std::string("not a shard")));
}

TEST_P(PosixFileSystemTest, WritingAtALinkOrFifoIsRefusedNeverWrittenThroughOrWaitedOn) {
  CKPTD_ASSERT_OK(fs_->CreateDir(Path("outside")));
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), Path("outside/secret"), "keep me"));
  const std::string link = Path("rank-0.shard.tmp");
  ASSERT_EQ(::symlink(Path("outside/secret").c_str(), link.c_str()), 0) << std::strerror(errno);
  EXPECT_THAT(fs_->NewWritableFile(link, Direct(true)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(link + " is a symbolic link, not a regular file")));
  EXPECT_THAT(fs_->NewWritableFile(link, Direct(false)), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("symbolic link")));
  // Not truncated, not written.
  EXPECT_THAT(ReadFileToString(fs_.get(), Path("outside/secret")), IsOkAndHolds(std::string("keep me")));

  const std::string fifo = Path("MANIFEST.tmp");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  // Without a reader, a plain open for writing would fail with ENXIO only
  // because of O_NONBLOCK; without it, the open would wait for ever.
  EXPECT_THAT(WithinOrReleaseFifo(fifo, [&] { return fs_->NewWritableFile(fifo, Direct(false)).status(); }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(fifo + " is a FIFO")));
}

}  // namespace
}  // namespace ckptd::storage
