#include "storage/replica.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"  // CKPTD_STATUS_CONCAT_, used by testing_matchers.h
#include "base/testing/matchers.h"
#include "base/thread_pool.h"
#include "format/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/mem_file_system.h"
#include "storage/shard_format.h"
#include "storage/shard_index.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"
#include "storage/testing_data.h"

namespace ckptd::storage {
namespace {

using ::ckptd::format::Xxh3;
using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ShareRowsTest, MembersStoreEveryRowOnceInOrderAndBalanced) {
  for (uint64_t rows : {0, 1, 2, 5, 7, 100, 1001}) {
    for (uint32_t count : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE(absl::StrCat(rows, " rows over ", count));
      uint64_t next = 0;
      for (uint32_t i = 0; i < count; ++i) {
        const RowRange r = ShareRows(rows, count, i);
        EXPECT_EQ(r.begin, next);
        EXPECT_GE(r.end, r.begin);
        const uint64_t n = r.end - r.begin;
        EXPECT_TRUE(n == rows / count || n == rows / count + 1) << n;
        next = r.end;
      }
      EXPECT_EQ(next, rows);
    }
  }
  // Outside the group: nothing.
  EXPECT_EQ(ShareRows(10, 4, 4).end, 0u);
  EXPECT_EQ(ShareRows(10, 0, 0).end, 0u);
}

ckptd::v1::Tensor Replicated(const std::string& name, std::vector<uint64_t> shape, uint32_t count, uint32_t index) {
  ckptd::v1::Tensor t;
  t.set_name(name);
  t.set_component(ckptd::v1::PARAMS);
  t.set_dtype(ckptd::v1::FLOAT32);
  for (uint64_t d : shape) t.add_shape(d);
  t.mutable_replica()->set_group("dp");
  t.mutable_replica()->set_count(count);
  t.mutable_replica()->set_index(index);
  return t;
}

TEST(ReplicaRequestTest, AGroupIsNamedAndHoldsTheRankInsideTheWorld) {
  ckptd::v1::Tensor t = Replicated("w", {4, 4}, 4, 3);
  CKPTD_EXPECT_OK(ValidateReplicaRequest(t, 4, "register"));
  EXPECT_THAT(ValidateReplicaRequest(t, 2, "register"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("larger than the job's world of 2")));
  t.mutable_replica()->set_index(4);
  EXPECT_THAT(ValidateReplicaRequest(t, 8, "register"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("place 4 in a replica group of 4")));
  t.mutable_replica()->set_index(0);
  t.mutable_replica()->set_count(0);
  EXPECT_THAT(ValidateReplicaRequest(t, 8, "register"), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  t.mutable_replica()->set_count(2);
  t.mutable_replica()->set_group("");
  EXPECT_THAT(ValidateReplicaRequest(t, 8, "register"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group's name")));
  t.mutable_replica()->set_group(std::string(kMaxReplicaGroupName + 1, 'g'));
  EXPECT_THAT(ValidateReplicaRequest(t, 8, "register"), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  t.mutable_replica()->set_group("\xff\xfe");
  EXPECT_THAT(ValidateReplicaRequest(t, 8, "register"), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  t.mutable_replica()->set_group("dp");
  t.mutable_replica()->add_block_xxh3(7);
  EXPECT_THAT(ValidateReplicaRequest(t, 8, "register"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("names the replica group")));
}

class ReplicaShardTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kGroup = 4;
  static constexpr uint64_t kRows = 10;
  static constexpr uint64_t kCols = 300;  // 1200 bytes a row: blocks of 4096 split rows

  void SetUp() override { CKPTD_ASSERT_OK(fs_.CreateDir("/s")); }

  std::string Path(uint32_t rank) { return absl::StrCat("/s/shard-", rank); }

  // Member `rank` of the group writes its shard of `weights` (replicated)
  // and `rng` (its own).
  ShardWriteResult WriteMember(uint32_t rank, const std::vector<float>& weights, const std::string& rng,
                               uint64_t block_bytes = 4096) {
    std::vector<TensorSource> whole(2);
    whole[0].meta = Replicated("w", {kRows, kCols}, kGroup, rank);
    whole[0].data = weights.data();
    whole[0].length = weights.size() * sizeof(float);
    whole[1].meta.set_name("rng");
    whole[1].meta.set_component(ckptd::v1::RNG);
    whole[1].meta.set_dtype(ckptd::v1::BYTES);
    whole[1].meta.add_shape(rng.size());
    whole[1].data = rng.data();
    whole[1].length = rng.size();
    absl::StatusOr<std::vector<TensorSource>> shares = ShareSources(whole, block_bytes, &pool_);
    EXPECT_TRUE(shares.ok()) << shares.status();
    absl::StatusOr<ShardWriteResult> w = WriteShard(&fs_, Path(rank), {"job", 10, rank, kGroup}, *shares,
                                                    ::ckptd::testing::SmallBlocks(), &pool_);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? *w : ShardWriteResult{};
  }

  std::unique_ptr<ShardReader> Open(uint32_t rank) {
    absl::StatusOr<std::unique_ptr<ShardReader>> r = ShardReader::Open(&fs_, Path(rank), {}, &pool_);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }

  std::vector<float> Weights() {
    std::vector<float> w(kRows * kCols);
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f - 7.0f;
    return w;
  }

  MemFileSystem fs_;
  base::ThreadPool pool_{2};
};

TEST_F(ReplicaShardTest, TheGroupWritesTheBufferOnceAndEachShareChecksTheWhole) {
  const std::vector<float> weights = Weights();
  const uint64_t whole_bytes = weights.size() * sizeof(float);
  uint64_t written = 0;
  for (uint32_t rank = 0; rank < kGroup; ++rank) {
    SCOPED_TRACE(absl::StrCat("member ", rank));
    const std::string rng = absl::StrCat("rng of rank ", rank);
    WriteMember(rank, weights, rng);
    std::unique_ptr<ShardReader> reader = Open(rank);
    ASSERT_NE(reader, nullptr);
    EXPECT_EQ(reader->index().format_version(), kShardFormatVersionReplicas);
    const ckptd::v1::Tensor* w = reader->FindTensor("w");
    ASSERT_NE(w, nullptr);
    const RowRange rows = ShareRows(kRows, kGroup, rank);
    EXPECT_THAT(w->shape(), ElementsAre(rows.end - rows.begin, kCols));
    EXPECT_THAT(w->offsets(), ElementsAre(rows.begin, 0));
    EXPECT_THAT(w->global_shape(), ElementsAre(kRows, kCols));
    EXPECT_THAT(w->replica().shape(), ElementsAre(kRows, kCols));
    EXPECT_FALSE(IsWholeShare(*w));
    EXPECT_EQ(WholeByteLength(*w), whole_bytes);
    EXPECT_EQ(ShareByteOffset(*w), rows.begin * kCols * sizeof(float));
    written += w->raw_length();
    // The share's bytes are its rows of the whole.
    std::vector<float> got(w->raw_length() / sizeof(float));
    CKPTD_ASSERT_OK(reader->ReadTensors({{"w", got.data(), w->raw_length()}}));
    EXPECT_EQ(0, std::memcmp(got.data(), weights.data() + rows.begin * kCols, w->raw_length()));
    // Its replica checksums are those of the whole buffer.
    CKPTD_ASSERT_OK_AND_ASSIGN(const std::vector<WholeBlock> blocks, WholeBlocks(*w, whole_bytes));
    ASSERT_EQ(blocks.size(), (whole_bytes + 4095) / 4096);
    for (const WholeBlock& b : blocks) {
      EXPECT_EQ(b.xxh3, Xxh3(reinterpret_cast<const uint8_t*>(weights.data()) + b.offset, b.length));
    }
    EXPECT_THAT(WholeBlocks(*w, whole_bytes + 1), StatusIs(absl::StatusCode::kDataLoss, ::testing::_));
    // A buffer that is the rank's own is written whole.
    const ckptd::v1::Tensor* r = reader->FindTensor("rng");
    ASSERT_NE(r, nullptr);
    EXPECT_FALSE(r->has_replica());
    EXPECT_EQ(r->raw_length(), rng.size());
  }
  EXPECT_EQ(written, whole_bytes);
}

TEST_F(ReplicaShardTest, SharesPutTogetherAreTheWhole) {
  const std::vector<float> weights = Weights();
  std::vector<SavedSlice> saved;
  for (uint32_t rank = 0; rank < kGroup; ++rank) {
    WriteMember(rank, weights, "r");
    std::unique_ptr<ShardReader> reader = Open(rank);
    ASSERT_NE(reader, nullptr);
    saved.push_back({rank, SliceBox(*reader->FindTensor("w"))});
  }
  const Box whole = WholeBox({kRows, kCols});
  CKPTD_ASSERT_OK_AND_ASSIGN(const std::vector<SavedSlice> from, SlicesFor("w", whole, saved));
  ASSERT_EQ(from.size(), kGroup);
  std::vector<float> got(weights.size(), 0);
  for (const SavedSlice& s : from) {
    std::unique_ptr<ShardReader> reader = Open(s.rank);
    ASSERT_NE(reader, nullptr);
    CKPTD_ASSERT_OK(ReadIntoSlice(*reader, "w", s.box, whole, sizeof(float), got.data()));
  }
  EXPECT_EQ(got, weights);
}

TEST_F(ReplicaShardTest, MembersBeyondTheRowsStoreAnEmptyShareAndScalarsAreNotSplit) {
  std::vector<TensorSource> whole(2);
  const std::vector<float> two_rows = {1, 2, 3, 4};
  whole[0].meta = Replicated("bias", {2, 2}, 4, 3);
  whole[0].data = two_rows.data();
  whole[0].length = sizeof(float) * two_rows.size();
  const float step = 12;
  whole[1].meta = Replicated("step", {}, 4, 3);
  whole[1].data = &step;
  whole[1].length = sizeof(step);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<TensorSource> shares, ShareSources(whole, 4096, nullptr));
  EXPECT_EQ(shares[0].length, 0u);
  EXPECT_THAT(shares[0].meta.shape(), ElementsAre(0, 2));
  EXPECT_EQ(shares[1].length, sizeof(step));
  EXPECT_TRUE(IsWholeShare(shares[1].meta));
  CKPTD_ASSERT_OK(WriteShard(&fs_, Path(3), {"job", 1, 3, 4}, shares, ::ckptd::testing::SmallBlocks(), &pool_).status());
  std::unique_ptr<ShardReader> reader = Open(3);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->FindTensor("bias")->raw_length(), 0u);
  EXPECT_EQ(reader->FindTensor("bias")->replica().block_xxh3_size(), 1);
  float got = 0;
  CKPTD_ASSERT_OK(reader->ReadTensors({{"step", &got, sizeof(got)}}));
  EXPECT_EQ(got, step);
}

TEST_F(ReplicaShardTest, AShardWithoutSharesIsVersionOne) {
  ::ckptd::testing::RankData d = ::ckptd::testing::MakeRankData(1, 0, 64, 16);
  CKPTD_ASSERT_OK(WriteShard(&fs_, Path(0), {"job", 1, 0, 1}, ::ckptd::testing::RankSources(d, "w", "rng"),
                             ::ckptd::testing::SmallBlocks(), &pool_)
                      .status());
  std::unique_ptr<ShardReader> reader = Open(0);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->index().format_version(), kOldestShardFormatVersion);
}

TEST_F(ReplicaShardTest, AReplicatedBufferIsWrittenAsItsShareOnly) {
  const std::vector<float> weights = Weights();
  TensorSource whole;
  whole.meta = Replicated("w", {kRows, kCols}, kGroup, 0);
  whole.data = weights.data();
  whole.length = weights.size() * sizeof(float);
  EXPECT_THAT(WriteShard(&fs_, Path(0), {"job", 1, 0, kGroup}, {&whole, 1}, ::ckptd::testing::SmallBlocks(), &pool_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("its share is written")));
}

TEST_F(ReplicaShardTest, DamagedSharesAreRefused) {
  WriteMember(1, Weights(), "r");
  std::unique_ptr<ShardReader> reader = Open(1);
  ASSERT_NE(reader, nullptr);
  const ckptd::v1::ShardIndex good = reader->index();
  struct Tamper {
    std::string what;
    std::function<void(ckptd::v1::Tensor&)> mutate;
    std::string expect;
  };
  const std::vector<Tamper> cases = {
      {"a checksum missing", [](ckptd::v1::Tensor& t) { t.mutable_replica()->mutable_block_xxh3()->RemoveLast(); },
       "replica checksums"},
      {"no checksum block", [](ckptd::v1::Tensor& t) { t.mutable_replica()->set_block_bytes(0); },
       "no checksums of the whole"},
      // Millions of checksums for a small buffer: refused before anything is sized by them.
      {"a checksum block too small", [](ckptd::v1::Tensor& t) { t.mutable_replica()->set_block_bytes(8); },
       "is not in 4096.."},
      {"another member's rows", [](ckptd::v1::Tensor& t) { t.set_offsets(0, 0); }, "not rows [3, 6)"},
      {"a share of columns", [](ckptd::v1::Tensor& t) { t.mutable_replica()->set_offsets(1, 1); },
       "exceeds global dimension 1"},
      {"a member outside the group", [](ckptd::v1::Tensor& t) { t.mutable_replica()->set_index(4); },
       "not inside the group"},
      {"ranks that differ", [](ckptd::v1::Tensor& t) { t.mutable_replica()->add_shape(1); }, "same rank"},
  };
  for (const Tamper& c : cases) {
    SCOPED_TRACE(c.what);
    ckptd::v1::ShardIndex index = good;
    for (ckptd::v1::Tensor& t : *index.mutable_tensors()) {
      if (t.name() == "w") c.mutate(t);
    }
    EXPECT_THAT(ValidateShardIndex(index, 1 << 30, kShardFormatVersionReplicas, "shard"),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(c.expect)));
  }
  // A share in a shard of version 1, which has none: a v1 reader would read
  // a share as the buffer.
  ckptd::v1::ShardIndex v1 = good;
  v1.set_format_version(kOldestShardFormatVersion);
  EXPECT_THAT(ValidateShardIndex(v1, 1 << 30, kOldestShardFormatVersion, "shard"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("in a shard of format version 1")));
  CKPTD_EXPECT_OK(ValidateShardIndex(good, 1 << 30, kShardFormatVersionReplicas, "shard"));
}

}  // namespace
}  // namespace ckptd::storage
