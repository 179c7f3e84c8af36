// DiscardingFileSystem: a shard "written" into it is described exactly as
// the same write into a real file system describes it, and nothing of it can
// be read back.
#include "storage/discarding_file_system.h"

#include <memory>
#include <string>
#include <vector>

#include "base/testing/matchers.h"
#include "format/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/mem_file_system.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"
#include "storage/testing_data.h"

namespace ckptd::storage {
namespace {

using ::ckptd::format::Xxh3;
using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;

// Raw blocks of 4096 bytes, written by one encoder thread: blocks reach the
// file in order, so two writes of the same bytes lay them out alike.
ShardWriteOptions RawOneThread() {
  ShardWriteOptions o;
  o.encode.compress = false;
  o.block_bytes = 4096;
  o.threads = 1;
  return o;
}

uint64_t Xxh3Of(const ckptd::v1::ShardIndex& index) {
  std::string bytes;
  EXPECT_TRUE(index.SerializeToString(&bytes));
  return Xxh3(bytes);
}

TEST(DiscardingFileSystemTest, AShardWrittenIntoItIsDescribedAsOnARealFileSystem) {
  // 10001 floats: the last block of the parameters is short and unaligned.
  const ckptd::testing::RankData data = ckptd::testing::MakeRankData(7, 1, 10001, 333);
  const std::vector<TensorSource> sources = ckptd::testing::RankSources(data, "params", "rng");
  const ShardIdentity id{"job", 7, 1, 2};

  MemFileSystem mem;
  CKPTD_ASSERT_OK(mem.CreateDir("/s"));
  CKPTD_ASSERT_OK_AND_ASSIGN(ShardWriteResult real, WriteShard(&mem, "/s/rank-1.shard", id, sources, RawOneThread()));
  DiscardingFileSystem discard;
  CKPTD_ASSERT_OK_AND_ASSIGN(ShardWriteResult none,
                             WriteShard(&discard, "/s/rank-1.shard", id, sources, RawOneThread()));

  EXPECT_EQ(none.file_length, real.file_length);
  EXPECT_EQ(none.raw_bytes, real.raw_bytes);
  EXPECT_EQ(none.stored_bytes, real.stored_bytes);
  EXPECT_EQ(none.stored_bytes, none.raw_bytes) << "raw blocks";
  ASSERT_NE(none.index, nullptr);
  ASSERT_NE(real.index, nullptr);
  EXPECT_EQ(Xxh3Of(*none.index), none.index_xxh3);
  EXPECT_EQ(Xxh3Of(*real.index), real.index_xxh3);
  // The index records when it was made: the same index made at the same
  // time has the same digest.
  ckptd::v1::ShardIndex same_time = *none.index;
  same_time.set_created_unix_nanos(real.index->created_unix_nanos());
  EXPECT_EQ(same_time.SerializeAsString(), real.index->SerializeAsString()) << same_time.DebugString() << "\nvs\n"
                                                                            << real.index->DebugString();
  EXPECT_EQ(Xxh3Of(same_time), real.index_xxh3);

  // The real file is what its result says.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader,
                             ShardReader::Open(&mem, "/s/rank-1.shard", ShardReadOptions()));
  EXPECT_EQ(reader->file_length(), real.file_length);
  EXPECT_EQ(reader->index_xxh3(), real.index_xxh3);
}

TEST(DiscardingFileSystemTest, AWriteWithTheIndexsCreationTimeIsTheShardDescribedEarlier) {
  const ckptd::testing::RankData data = ckptd::testing::MakeRankData(9, 0, 5000, 40);
  const std::vector<TensorSource> sources = ckptd::testing::RankSources(data, "params", "rng");
  const ShardIdentity id{"job", 9, 0, 1};
  DiscardingFileSystem discard;
  CKPTD_ASSERT_OK_AND_ASSIGN(ShardWriteResult described,
                             WriteShard(&discard, "/s/rank-0.shard", id, sources, RawOneThread()));
  ASSERT_NE(described.index, nullptr);
  ASSERT_NE(described.index->created_unix_nanos(), 0);

  // Later, the same bytes written for real at the described index's time.
  ShardWriteOptions again = RawOneThread();
  again.created_unix_nanos = described.index->created_unix_nanos();
  MemFileSystem mem;
  CKPTD_ASSERT_OK(mem.CreateDir("/s"));
  CKPTD_ASSERT_OK_AND_ASSIGN(ShardWriteResult written, WriteShard(&mem, "/s/rank-0.shard", id, sources, again));
  EXPECT_EQ(written.file_length, described.file_length);
  EXPECT_EQ(written.index_xxh3, described.index_xxh3);
  EXPECT_EQ(written.index->created_unix_nanos(), described.index->created_unix_nanos());
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader,
                             ShardReader::Open(&mem, "/s/rank-0.shard", ShardReadOptions()));
  EXPECT_EQ(reader->index_xxh3(), described.index_xxh3);

  // One changed byte is another shard: the digest tells.
  ckptd::testing::RankData changed = data;
  changed.params[17] += 1.0f;
  const std::vector<TensorSource> other = ckptd::testing::RankSources(changed, "params", "rng");
  CKPTD_ASSERT_OK_AND_ASSIGN(ShardWriteResult differs, WriteShard(&mem, "/s/rank-0.shard", id, other, again));
  EXPECT_NE(differs.index_xxh3, described.index_xxh3);
}

TEST(DiscardingFileSystemTest, NothingCanBeReadBack) {
  const ckptd::testing::RankData data = ckptd::testing::MakeRankData(3, 0, 2000, 16);
  const std::vector<TensorSource> sources = ckptd::testing::RankSources(data, "params", "rng");
  DiscardingFileSystem fs;
  CKPTD_ASSERT_OK(CreateDirs(&fs, "/a/b"));
  CKPTD_ASSERT_OK(WriteShard(&fs, "/a/b/rank-0.shard", {"job", 3, 0, 1}, sources, RawOneThread()).status());
  CKPTD_ASSERT_OK(WriteFileAtomically(&fs, "/a/b/MANIFEST", "contents"));

  EXPECT_THAT(ShardReader::Open(&fs, "/a/b/rank-0.shard", ShardReadOptions()).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/a/b/rank-0.shard")));
  EXPECT_THAT(ReadFileToString(&fs, "/a/b/MANIFEST").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("keeps nothing")));
  EXPECT_THAT(fs.Stat("/a/b/rank-0.shard").status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("keeps nothing")));
  EXPECT_THAT(fs.Stat("/a/b").status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("keeps nothing")));
  EXPECT_THAT(fs.ListDir("/a").status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("keeps nothing")));
  EXPECT_THAT(fs.RemoveFile("/a/b/MANIFEST"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("keeps nothing")));
  EXPECT_THAT(fs.RemoveDir("/a/b"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("keeps nothing")));
  CKPTD_EXPECT_OK(RemoveTree(&fs, "/a")) << "absent, so already removed";
}

}  // namespace
}  // namespace ckptd::storage
