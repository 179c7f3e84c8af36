#include "storage/fault_injection_file_system.h"

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "base/status_macros.h"  // CKPTD_STATUS_CONCAT_, used by testing_matchers.h
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/mem_file_system.h"

namespace ckptd::storage {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::StatusIs;
using ::testing::_;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The StatusOr is ok and its value matches `matcher`.

OpenOptions Buffered() {
  OpenOptions options;
  options.direct_io = false;
  return options;
}

class FaultInjectionFileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CKPTD_ASSERT_OK(mem_.CreateDir("/root"));
    CKPTD_ASSERT_OK(mem_.SyncDir("/"));
  }

  MemFileSystem mem_;
  int crashes_ = 0;
  FaultInjectionFileSystem fs_{&mem_, [this] {
                                 ++crashes_;
                                 mem_.Crash();
                               }};
};

TEST_F(FaultInjectionFileSystemTest, CountsEveryOperation) {
  EXPECT_EQ(fs_.operation_count(), 0u);
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/d"));  // 0
  EXPECT_EQ(fs_.operation_count(), 1u);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w,
                             fs_.NewWritableFile("/root/d/a", Buffered()));  // 1
  CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t ticket, w->Write(0, "abcd", 4));        // 2
  CKPTD_ASSERT_OK(w->WaitFor(ticket));                                        // not counted
  CKPTD_ASSERT_OK(w->WaitAll());                                              // not counted
  CKPTD_ASSERT_OK(w->Sync());                                                 // 3
  CKPTD_ASSERT_OK(w->Close());                                                // 4
  EXPECT_EQ(fs_.operation_count(), 5u);
  CKPTD_ASSERT_OK(fs_.SyncDir("/root/d"));                                     // 5
  CKPTD_ASSERT_OK(fs_.Stat("/root/d/a").status());                             // 6
  CKPTD_ASSERT_OK(fs_.ListDir("/root/d").status());                            // 7
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> r,
                             fs_.NewReadableFile("/root/d/a", Buffered()));  // 8
  char buf[4];
  CKPTD_ASSERT_OK(r->ReadAt(0, buf, 4));  // 9
  CKPTD_ASSERT_OK(r->Close());            // 10
  CKPTD_ASSERT_OK(fs_.Rename("/root/d/a", "/root/d/b"));  // 11
  CKPTD_ASSERT_OK(fs_.RemoveFile("/root/d/b"));           // 12
  CKPTD_ASSERT_OK(fs_.RemoveDir("/root/d"));              // 13
  EXPECT_EQ(fs_.operation_count(), 14u);
  EXPECT_EQ(fs_.NextOperation("/x", 0), Fault::kNone);  // 14
  EXPECT_EQ(fs_.operation_count(), 15u);
  fs_.Reset();
  EXPECT_EQ(fs_.operation_count(), 0u);
}

TEST_F(FaultInjectionFileSystemTest, WrappedFilesForwardProperties) {
  CKPTD_ASSERT_OK(mem_.SetFileContents("/root/a", "hello"));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> r, fs_.NewReadableFile("/root/a", Buffered()));
  EXPECT_EQ(r->path(), "/root/a");
  EXPECT_EQ(r->alignment(), 1u);
  EXPECT_EQ(r->size(), 5u);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w, fs_.NewWritableFile("/root/b", Buffered()));
  EXPECT_EQ(w->path(), "/root/b");
  EXPECT_EQ(w->alignment(), 1u);
  // Errors of the base pass through unchanged.
  char buf[8];
  EXPECT_THAT(r->ReadAt(0, buf, 8), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  EXPECT_THAT(fs_.Stat("/root/none"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("/root/none")));
}

TEST(FaultStatusTest, NamesOperationAndPath) {
  CKPTD_EXPECT_OK(FaultStatus(Fault::kNone, "write", "/a"));
  EXPECT_THAT(FaultStatus(Fault::kEio, "write", "/a/b"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("write /a/b")));
  EXPECT_THAT(FaultStatus(Fault::kEnospc, "fsync", "/a"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("fsync /a")));
  EXPECT_THAT(FaultStatus(Fault::kShortWrite, "write", "/a"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("write /a")));
  EXPECT_THAT(FaultStatus(Fault::kCrash, "mkdir", "/a"),
              StatusIs(absl::StatusCode::kAborted, AllOf(HasSubstr("mkdir /a"), HasSubstr("simulated crash"))));
}

// Fault kind, expected code of a failed non-write operation.
class FailAtOperationTest : public FaultInjectionFileSystemTest,
                            public ::testing::WithParamInterface<std::tuple<Fault, absl::StatusCode>> {};

TEST_P(FailAtOperationTest, FailsExactlyThatOperationOnce) {
  const auto [fault, code] = GetParam();
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/a"));  // 0
  fs_.FailAtOperation(1, fault);
  EXPECT_THAT(fs_.CreateDir("/root/b"), StatusIs(code, HasSubstr("mkdir /root/b")));  // 1
  if (fault == Fault::kCrash) {
    EXPECT_EQ(crashes_, 1);
    EXPECT_TRUE(fs_.crashed());
    EXPECT_THAT(fs_.CreateDir("/root/b"), StatusIs(absl::StatusCode::kAborted, HasSubstr("simulated crash")));
    EXPECT_EQ(crashes_, 1);
  } else {
    EXPECT_FALSE(fs_.crashed());
    CKPTD_EXPECT_OK(fs_.CreateDir("/root/b"));  // 2: the rule fired once
  }
  EXPECT_EQ(fs_.operation_count(), 3u);
}

TEST_P(FailAtOperationTest, FailsAWrite) {
  const auto [fault, code] = GetParam();
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w,
                             fs_.NewWritableFile("/root/a", Buffered()));  // 0
  CKPTD_ASSERT_OK(w->Write(0, "1234", 4).status());                       // 1
  fs_.FailAtOperation(2, fault);
  EXPECT_THAT(w->Write(4, "5678", 4), StatusIs(code, HasSubstr("write /root/a")));  // 2
  // The first error sticks to the file.
  EXPECT_THAT(w->WaitAll(), StatusIs(code, _));
  EXPECT_THAT(w->Sync(), StatusIs(code, _));
  EXPECT_THAT(w->Close(), StatusIs(code, _));
}

INSTANTIATE_TEST_SUITE_P(
    AllFaults, FailAtOperationTest,
    ::testing::Values(std::make_tuple(Fault::kEio, absl::StatusCode::kDataLoss),
                      std::make_tuple(Fault::kEnospc, absl::StatusCode::kResourceExhausted),
                      std::make_tuple(Fault::kShortWrite, absl::StatusCode::kResourceExhausted),
                      std::make_tuple(Fault::kCrash, absl::StatusCode::kAborted)));

TEST_F(FaultInjectionFileSystemTest, FailAtOperationOnReadSyncAndClose) {
  CKPTD_ASSERT_OK(mem_.SetFileContents("/root/r", "data"));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> r,
                             fs_.NewReadableFile("/root/r", Buffered()));  // 0
  fs_.FailAtOperation(1, Fault::kEio);
  char buf[4];
  EXPECT_THAT(r->Read(0, buf, 4), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("read /root/r")));  // 1

  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w,
                             fs_.NewWritableFile("/root/w", Buffered()));  // 2
  fs_.FailAtOperation(3, Fault::kEio);
  EXPECT_THAT(w->Sync(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("fsync /root/w")));  // 3

  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w2,
                             fs_.NewWritableFile("/root/w2", Buffered()));  // 4
  fs_.FailAtOperation(5, Fault::kEnospc);
  EXPECT_THAT(w2->Close(), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("close /root/w2")));  // 5
}

TEST_F(FaultInjectionFileSystemTest, FailWritesAfterBytes) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w, fs_.NewWritableFile("/root/a", Buffered()));
  CKPTD_ASSERT_OK(w->Write(0, "abcdef", 6).status());  // before the budget is set
  fs_.FailWritesAfterBytes(10);
  CKPTD_ASSERT_OK(w->Write(6, "123456", 6).status());
  CKPTD_ASSERT_OK(w->Write(12, "7890", 4).status());  // exactly fills the budget
  EXPECT_THAT(w->Write(16, "x", 1), StatusIs(absl::StatusCode::kResourceExhausted,
                                             AllOf(HasSubstr("write /root/a"), HasSubstr("No space"))));
  // Non-write operations still work; every later write fails, on any file.
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/d"));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w2, fs_.NewWritableFile("/root/b", Buffered()));
  EXPECT_THAT(w2->Write(0, "y", 1), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("/root/b")));
  EXPECT_THAT(ReadFileToString(&mem_, "/root/a"), IsOkAndHolds(std::string("abcdef1234567890")));

  fs_.Reset();
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w3, fs_.NewWritableFile("/root/c", Buffered()));
  CKPTD_EXPECT_OK(w3->Write(0, "z", 1).status());
}

TEST_F(FaultInjectionFileSystemTest, FailWritesAfterBytesWithEio) {
  fs_.FailWritesAfterBytes(3, Fault::kEio);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w, fs_.NewWritableFile("/root/a", Buffered()));
  EXPECT_THAT(w->Write(0, "abcd", 4), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("write /root/a")));
}

TEST_F(FaultInjectionFileSystemTest, FailPath) {
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/step-1"));
  fs_.FailPath("step-2", Fault::kEio);
  CKPTD_EXPECT_OK(fs_.CreateDir("/root/step-3"));
  EXPECT_THAT(fs_.CreateDir("/root/step-2"), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("mkdir /root/step-2")));
  EXPECT_THAT(fs_.NewWritableFile("/root/step-2.tmp", Buffered()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("open /root/step-2.tmp")));
  // Either side of a rename matches.
  EXPECT_THAT(fs_.Rename("/root/step-1", "/root/step-2"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rename /root/step-1 -> /root/step-2")));
  CKPTD_EXPECT_OK(fs_.Rename("/root/step-1", "/root/step-4"));
  // Operations on an open file match too.
  fs_.FailPath("rank-0", Fault::kEnospc);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w,
                             fs_.NewWritableFile("/root/step-4/rank-1.shard", Buffered()));
  CKPTD_EXPECT_OK(w->Write(0, "a", 1).status());
  fs_.FailPath("rank-1", Fault::kEnospc);
  EXPECT_THAT(w->Sync(), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("fsync /root/step-4/rank-1")));
}

TEST_F(FaultInjectionFileSystemTest, ClearPathLiftsOnlyItsRule) {
  fs_.FailPath("step-1", Fault::kEio);
  fs_.FailPath("step-2", Fault::kEnospc);
  EXPECT_THAT(fs_.CreateDir("/root/step-1"), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("mkdir /root/step-1")));
  EXPECT_THAT(fs_.CreateDir("/root/step-2"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("mkdir /root/step-2")));
  fs_.ClearPath("step-1");
  CKPTD_EXPECT_OK(fs_.CreateDir("/root/step-1"));
  EXPECT_THAT(fs_.CreateDir("/root/step-2"), StatusIs(absl::StatusCode::kResourceExhausted, _));
  fs_.ClearPath("step-9");  // no such rule: nothing changes
  EXPECT_THAT(fs_.CreateDir("/root/step-2"), StatusIs(absl::StatusCode::kResourceExhausted, _));
  fs_.FailPath("step-2", Fault::kNone);
  CKPTD_EXPECT_OK(fs_.CreateDir("/root/step-2"));
}

TEST_F(FaultInjectionFileSystemTest, WriteScopedRuleLetsReadsThrough) {
  CKPTD_ASSERT_OK(WriteFileAtomically(&fs_, "/root/a", "abc"));
  fs_.FailPath("/root", Fault::kEnospc, FaultScope::kWrites);
  // Reads, listings and stats pass.
  EXPECT_THAT(ReadFileToString(&fs_, "/root/a"), IsOkAndHolds(std::string("abc")));
  CKPTD_EXPECT_OK(fs_.ListDir("/root").status());
  CKPTD_EXPECT_OK(fs_.Stat("/root/a").status());
  // Every kind of write fails.
  EXPECT_THAT(fs_.NewWritableFile("/root/b", Buffered()),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("open /root/b")));
  EXPECT_THAT(fs_.CreateDir("/root/d"), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("mkdir")));
  EXPECT_THAT(WriteFileAtomically(&fs_, "/root/a", "xyz"), StatusIs(absl::StatusCode::kResourceExhausted, _));
  fs_.ClearPath("/root");
  CKPTD_EXPECT_OK(WriteFileAtomically(&fs_, "/root/a", "xyz"));
  EXPECT_THAT(ReadFileToString(&fs_, "/root/a"), IsOkAndHolds(std::string("xyz")));
}

TEST_F(FaultInjectionFileSystemTest, CopyThatFailsLeavesNeitherTheTargetNorItsTempFile) {
  CKPTD_ASSERT_OK(WriteFileAtomically(&mem_, "/root/from", std::string(10000, 'a')));
  CKPTD_ASSERT_OK(mem_.CreateDir("/root/dst"));
  fs_.FailWritesAfterBytes(4096, Fault::kEnospc);
  CopyOptions copy;
  copy.chunk_bytes = 4096;
  EXPECT_THAT(CopyFileDurably(&mem_, "/root/from", &fs_, "/root/dst/to", copy),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("copy: writing /root/dst/to.tmp")));
  EXPECT_THAT(mem_.ListDir("/root/dst"), IsOkAndHolds(::testing::IsEmpty()));
}

// A copy asked to stop (the agent shuts down) ends there: nothing of it is
// left, and the target as it was before is untouched.
TEST_F(FaultInjectionFileSystemTest, CopyAskedToStopLeavesNothingAndTheOldTargetUntouched) {
  const std::string contents(10000, 'a');  // three chunks of 4096
  CKPTD_ASSERT_OK(WriteFileAtomically(&mem_, "/root/from", contents));
  CKPTD_ASSERT_OK(mem_.CreateDir("/root/dst"));
  CKPTD_ASSERT_OK(WriteFileAtomically(&mem_, "/root/dst/to", "old"));
  // Asked before each of the three chunk writes and once before the fsync.
  for (const auto& [after, how_far] : {std::pair<int, std::string>{1, "stopped with 4096 of 10000 bytes written"},
                                       {2, "stopped with 8192 of 10000 bytes written"},
                                       {3, "stopped with all 10000 bytes written, before the fsync and rename"}}) {
    SCOPED_TRACE(after);
    int asked = 0;
    CopyOptions copy;
    copy.chunk_bytes = 4096;
    copy.stop = [&asked, after = after] { return asked++ >= after; };
    EXPECT_THAT(CopyFileDurably(&mem_, "/root/from", &fs_, "/root/dst/to", copy),
                StatusIs(absl::StatusCode::kCancelled,
                         AllOf(HasSubstr("copy of /root/from to /root/dst/to"), HasSubstr(how_far),
                               HasSubstr("nothing of the copy is kept"))));
    EXPECT_EQ(asked, after + 1);
    EXPECT_THAT(mem_.ListDir("/root/dst"), IsOkAndHolds(::testing::SizeIs(1)));  // no to.tmp
    EXPECT_THAT(ReadFileToString(&mem_, "/root/dst/to"), IsOkAndHolds(std::string("old")));
  }
  // Never asked to stop: copied as without a stop.
  int asked = 0;
  CopyOptions copy;
  copy.chunk_bytes = 4096;
  copy.stop = [&] { return ++asked < 0; };
  EXPECT_THAT(CopyFileDurably(&mem_, "/root/from", &fs_, "/root/dst/to", copy), IsOkAndHolds(contents.size()));
  EXPECT_EQ(asked, 4);
  EXPECT_THAT(ReadFileToString(&mem_, "/root/dst/to"), IsOkAndHolds(contents));
  EXPECT_THAT(mem_.ListDir("/root/dst"), IsOkAndHolds(::testing::SizeIs(1)));
  // And without one.
  CKPTD_ASSERT_OK(mem_.RemoveFile("/root/dst/to"));
  copy.stop = nullptr;
  EXPECT_THAT(CopyFileDurably(&mem_, "/root/from", &fs_, "/root/dst/to", copy), IsOkAndHolds(contents.size()));
  EXPECT_THAT(ReadFileToString(&mem_, "/root/dst/to"), IsOkAndHolds(contents));
}

// A buffered copy (memory files have alignment 1) hands what it has written
// to writeback as it goes: in order, without gaps or overlaps, each piece at
// least writeback_bytes, so the fsync has at most about that much left.
TEST_F(FaultInjectionFileSystemTest, ABufferedCopyStartsWritebackAsItGoes) {
  const uint64_t length = 10 * 4096 + 5;
  CKPTD_ASSERT_OK(WriteFileAtomically(&mem_, "/root/from", std::string(length, 'b')));
  CopyOptions copy;
  copy.chunk_bytes = 4096;
  copy.writeback_bytes = 8192;
  EXPECT_THAT(CopyFileDurably(&mem_, "/root/from", &fs_, "/root/to", copy), IsOkAndHolds(length));
  const std::vector<FaultInjectionFileSystem::Writeback> writebacks = fs_.writebacks();
  ASSERT_FALSE(writebacks.empty());
  uint64_t next = 0;
  for (const FaultInjectionFileSystem::Writeback& w : writebacks) {
    EXPECT_EQ(w.path, "/root/to.tmp");
    EXPECT_EQ(w.offset, next) << "not in order, or a gap or overlap";
    EXPECT_GE(w.length, copy.writeback_bytes);
    next = w.offset + w.length;
  }
  // All but the last chunk and less than writeback_bytes before it.
  EXPECT_LE(next, length);
  EXPECT_GE(next + copy.writeback_bytes + copy.chunk_bytes, length);
  EXPECT_THAT(ReadFileToString(&mem_, "/root/to"), IsOkAndHolds(std::string(length, 'b')));
  // Off: only the fsync writes back.
  fs_.Reset();
  copy.writeback_bytes = 0;
  EXPECT_THAT(CopyFileDurably(&mem_, "/root/from", &fs_, "/root/to", copy), IsOkAndHolds(length));
  EXPECT_TRUE(fs_.writebacks().empty());
}

TEST_F(FaultInjectionFileSystemTest, StartWritebackIsForwardedAndRecordedNotCounted) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w, fs_.NewWritableFile("/root/a", Buffered()));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t ticket, w->Write(0, "abcd", 4));
  CKPTD_ASSERT_OK(w->WaitFor(ticket));
  const uint64_t ops = fs_.operation_count();
  CKPTD_ASSERT_OK(w->StartWriteback(0, 4));
  EXPECT_EQ(fs_.operation_count(), ops);
  ASSERT_EQ(fs_.writebacks().size(), 1u);
  EXPECT_EQ(fs_.writebacks()[0].path, "/root/a");
  EXPECT_EQ(fs_.writebacks()[0].offset, 0u);
  EXPECT_EQ(fs_.writebacks()[0].length, 4u);
  CKPTD_ASSERT_OK(w->Close());
  // The wrapped file's answer: a closed memory file says so.
  EXPECT_THAT(w->StartWriteback(0, 4), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("closed")));
}

TEST_F(FaultInjectionFileSystemTest, SlowPathDelaysOnlyMatchingFiles) {
  const absl::Duration delay = absl::Milliseconds(30);
  fs_.SlowPath("/root/slow", delay);
  EXPECT_EQ(fs_.LatencyFor("/root/slow/a"), delay);
  EXPECT_EQ(fs_.LatencyFor("/root/fast/a"), absl::ZeroDuration());
  fs_.SetLatency(absl::Milliseconds(1));
  EXPECT_EQ(fs_.LatencyFor("/root/slow/a"), delay + absl::Milliseconds(1));
  fs_.SetLatency(absl::ZeroDuration());
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/slow"));
  absl::Time start = absl::Now();
  CKPTD_ASSERT_OK(WriteFileAtomically(&fs_, "/root/slow/a", "abc"));
  EXPECT_GE(absl::Now() - start, delay);
  fs_.SlowPath("/root/slow", absl::ZeroDuration());
  EXPECT_EQ(fs_.LatencyFor("/root/slow/a"), absl::ZeroDuration());
}

TEST_F(FaultInjectionFileSystemTest, ShortWriteStoresFirstHalf) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w, fs_.NewWritableFile("/root/a", Buffered()));
  CKPTD_ASSERT_OK(w->Write(0, "xy", 2).status());
  fs_.FailAtOperation(fs_.operation_count(), Fault::kShortWrite);
  EXPECT_THAT(w->Write(2, "0123456789", 10),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("write /root/a")));
  EXPECT_THAT(w->Close(), StatusIs(absl::StatusCode::kResourceExhausted, _));
  EXPECT_THAT(ReadFileToString(&mem_, "/root/a"), IsOkAndHolds(std::string("xy01234")));
}

TEST_F(FaultInjectionFileSystemTest, CrashLeavesOnlyDurableState) {
  CKPTD_ASSERT_OK(WriteFileAtomically(&fs_, "/root/MANIFEST", "v1"));
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/step-1"));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w,
                             fs_.NewWritableFile("/root/data", Buffered()));
  CKPTD_ASSERT_OK(fs_.SyncDir("/root"));
  CKPTD_ASSERT_OK(w->Write(0, "synced", 6).status());
  CKPTD_ASSERT_OK(w->Sync());
  CKPTD_ASSERT_OK(w->Write(6, "-unsynced", 9).status());
  CKPTD_ASSERT_OK(fs_.RemoveFile("/root/MANIFEST"));  // not durable: "/root" not synced since
  CKPTD_ASSERT_OK(fs_.CreateDir("/root/step-2"));     // not durable either

  fs_.FailAtOperation(fs_.operation_count(), Fault::kCrash);
  EXPECT_EQ(crashes_, 0);
  EXPECT_THAT(w->Write(15, "z", 1), StatusIs(absl::StatusCode::kAborted, HasSubstr("simulated crash")));
  EXPECT_EQ(crashes_, 1);
  EXPECT_TRUE(fs_.crashed());
  // Every later operation fails, of any kind, and the callback does not run again.
  EXPECT_THAT(w->WaitAll(), StatusIs(absl::StatusCode::kAborted, _));
  EXPECT_THAT(w->Sync(), StatusIs(absl::StatusCode::kAborted, _));
  EXPECT_THAT(fs_.Stat("/root/data"), StatusIs(absl::StatusCode::kAborted, HasSubstr("stat /root/data")));
  EXPECT_THAT(fs_.ListDir("/root"), StatusIs(absl::StatusCode::kAborted, _));
  EXPECT_EQ(crashes_, 1);

  // The base now holds exactly the durable state.
  EXPECT_THAT(ReadFileToString(&mem_, "/root/data"), IsOkAndHolds(std::string("synced")));
  EXPECT_THAT(ReadFileToString(&mem_, "/root/MANIFEST"), IsOkAndHolds(std::string("v1")));
  EXPECT_THAT(mem_.Stat("/root/step-1"), IsOkAndHolds(::testing::Field(&FileInfo::is_directory, true)));
  EXPECT_THAT(mem_.Stat("/root/step-2"), StatusIs(absl::StatusCode::kNotFound, _));
}

TEST_F(FaultInjectionFileSystemTest, ResetAfterCrashAllowsOperations) {
  fs_.FailAtOperation(0, Fault::kCrash);
  EXPECT_THAT(fs_.CreateDir("/root/a"), StatusIs(absl::StatusCode::kAborted, _));
  fs_.Reset();
  EXPECT_FALSE(fs_.crashed());
  CKPTD_EXPECT_OK(fs_.CreateDir("/root/a"));
  EXPECT_EQ(fs_.operation_count(), 1u);
}

TEST_F(FaultInjectionFileSystemTest, LatencyDelaysReadsAndWrites) {
  const absl::Duration delay = absl::Milliseconds(20);
  fs_.SetLatency(delay);
  EXPECT_EQ(fs_.latency(), delay);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w, fs_.NewWritableFile("/root/a", Buffered()));
  absl::Time start = absl::Now();
  CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t ticket, w->Write(0, "abc", 3));
  CKPTD_ASSERT_OK(w->WaitFor(ticket));
  EXPECT_GE(absl::Now() - start, delay);
  CKPTD_ASSERT_OK(w->Close());

  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> r, fs_.NewReadableFile("/root/a", Buffered()));
  char buf[3];
  start = absl::Now();
  CKPTD_ASSERT_OK(r->ReadAt(0, buf, 3));
  EXPECT_GE(absl::Now() - start, delay);
}

}  // namespace
}  // namespace ckptd::storage
