#include "storage/reshard.h"

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"  // CKPTD_STATUS_CONCAT_, used by testing_matchers.h
#include "base/testing/matchers.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/mem_file_system.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"
#include "storage/testing_data.h"

namespace ckptd::storage {
namespace {

using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::FieldsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(SliceCopiesTest, RowsOfTheWholeAreOneRun) {
  // Rows [2, 4) of a [6, 5] float tensor, into the whole.
  const Box rows{{2, 0}, {2, 5}};
  EXPECT_THAT(SliceCopies(rows, WholeBox({6, 5}), 4), ElementsAre(FieldsAre(0, 2 * 5 * 4, 2 * 5 * 4)));
  // The whole into those rows: the same bytes, the other way round.
  EXPECT_THAT(SliceCopies(WholeBox({6, 5}), rows, 4), ElementsAre(FieldsAre(2 * 5 * 4, 0, 2 * 5 * 4)));
}

TEST(SliceCopiesTest, ColumnsAreOneRunPerRow) {
  // Columns [2, 4) of a [3, 8] float tensor, into the whole: a run of two
  // floats per row.
  const Box cols{{0, 2}, {3, 2}};
  EXPECT_THAT(SliceCopies(cols, WholeBox({3, 8}), 4),
              ElementsAre(FieldsAre(0, 8, 8), FieldsAre(8, 40, 8), FieldsAre(16, 72, 8)));
}

TEST(SliceCopiesTest, PartialOverlapAndDisjointBoxes) {
  // Rows [0, 4) saved, rows [3, 6) needed: row 3 only.
  EXPECT_THAT(SliceCopies(Box{{0, 0}, {4, 5}}, Box{{3, 0}, {3, 5}}, 2), ElementsAre(FieldsAre(3 * 5 * 2, 0, 5 * 2)));
  EXPECT_THAT(SliceCopies(Box{{0, 0}, {3, 5}}, Box{{3, 0}, {3, 5}}, 2), IsEmpty());
  EXPECT_EQ(OverlapVolume(Box{{0, 0}, {4, 5}}, Box{{3, 1}, {3, 4}}), 4u);
  EXPECT_EQ(OverlapVolume(Box{{0, 0}, {3, 5}}, Box{{3, 0}, {3, 5}}), 0u);
  // A scalar is one element.
  EXPECT_THAT(SliceCopies(Box{}, Box{}, 8), ElementsAre(FieldsAre(0, 0, 8)));
}

// Cuts [0, n) at `parts` - 1 random points (parts <= n).
std::vector<std::pair<uint64_t, uint64_t>> Cut(uint64_t n, uint64_t parts, std::mt19937_64& rng) {
  std::vector<uint64_t> points = {0, n};
  while (points.size() < parts + 1) {
    const uint64_t p = 1 + rng() % (n - 1);
    if (std::find(points.begin(), points.end(), p) == points.end()) points.push_back(p);
  }
  std::sort(points.begin(), points.end());
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (size_t i = 0; i + 1 < points.size(); ++i) out.push_back({points[i], points[i + 1] - points[i]});
  return out;
}

// A grid of boxes over `global`, a random number of parts per dimension.
std::vector<Box> Grid(const std::vector<uint64_t>& global, std::mt19937_64& rng) {
  std::vector<Box> boxes = {Box{}};
  for (uint64_t n : global) {
    const uint64_t parts = 1 + rng() % std::min<uint64_t>(n, 4);
    std::vector<Box> next;
    for (const Box& b : boxes) {
      for (auto [at, len] : Cut(n, parts, rng)) {
        Box c = b;
        c.offsets.push_back(at);
        c.shape.push_back(len);
        next.push_back(c);
      }
    }
    boxes = next;
  }
  return boxes;
}

// The dense bytes of `box` of the tensor whose element i is float(i).
std::vector<float> Expected(const std::vector<uint64_t>& global, const Box& box) {
  std::vector<float> out;
  const size_t dims = global.size();
  std::vector<uint64_t> index(dims, 0);
  uint64_t volume = 1;
  for (uint64_t d : box.shape) volume *= d;
  for (uint64_t n = 0; n < volume; ++n) {
    uint64_t flat = 0;
    for (size_t d = 0; d < dims; ++d) flat = flat * global[d] + box.offsets[d] + index[d];
    out.push_back(static_cast<float>(flat));
    for (size_t d = dims; d-- > 0;) {
      if (++index[d] < box.shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

class ReshardTest : public ::testing::Test {
 protected:
  void SetUp() override { CKPTD_ASSERT_OK(fs_.CreateDir("/s")); }

  // Writes `box` of tensor "t" of `global` as the shard of `rank`.
  void WriteSlice(uint32_t rank, uint32_t world, const std::vector<uint64_t>& global, const Box& box) {
    const std::vector<float> data = Expected(global, box);
    TensorSource src;
    src.meta.set_name("t");
    src.meta.set_component(ckptd::v1::PARAMS);
    src.meta.set_dtype(ckptd::v1::FLOAT32);
    for (size_t d = 0; d < global.size(); ++d) {
      src.meta.add_shape(box.shape[d]);
      src.meta.add_global_shape(global[d]);
      src.meta.add_offsets(box.offsets[d]);
    }
    src.meta.set_raw_length(data.size() * sizeof(float));
    src.data = data.data();
    src.length = data.size() * sizeof(float);
    ShardIdentity id{"job", 1, rank, world};
    CKPTD_ASSERT_OK(WriteShard(&fs_, Path(rank), id, {&src, 1}, ::ckptd::testing::SmallBlocks(), &pool_).status());
  }

  std::string Path(uint32_t rank) { return absl::StrCat("/s/rank-", rank); }

  std::unique_ptr<ShardReader> Open(uint32_t rank) {
    absl::StatusOr<std::unique_ptr<ShardReader>> r = ShardReader::Open(&fs_, Path(rank), {}, &pool_);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }

  MemFileSystem fs_;
  base::ThreadPool pool_{2};
};

// Tensors of 1 to 3 dimensions saved on one random grid of slices and read
// back on another: every target slice, put together from the parts of the
// saved slices that it overlaps, equals the tensor's bytes there.
TEST_F(ReshardTest, AnyGridReadsBackOntoAnyOtherGrid) {
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937_64 rng(seed);
    std::vector<uint64_t> global;
    const int dims = 1 + static_cast<int>(seed % 3);
    for (int d = 0; d < dims; ++d) {
      global.push_back(dims == 1 ? 2000 + rng() % 5000 : 2 + rng() % (dims == 2 ? 90 : 20));
    }
    const std::vector<Box> saved = Grid(global, rng);
    for (uint32_t r = 0; r < saved.size(); ++r) {
      ASSERT_NO_FATAL_FAILURE(WriteSlice(r, static_cast<uint32_t>(saved.size()), global, saved[r]));
    }
    for (const Box& target : Grid(global, rng)) {
      const std::vector<float> want = Expected(global, target);
      std::vector<float> got(want.size(), -1.0f);
      uint64_t covered = 0;
      for (uint32_t r = 0; r < saved.size(); ++r) {
        const uint64_t overlap = OverlapVolume(saved[r], target);
        if (overlap == 0) continue;
        covered += overlap;
        std::unique_ptr<ShardReader> reader = Open(r);
        ASSERT_NE(reader, nullptr);
        CKPTD_ASSERT_OK(ReadIntoSlice(*reader, "t", saved[r], target, sizeof(float), got.data()));
      }
      EXPECT_EQ(covered, want.size());
      ASSERT_EQ(got, want);
    }
  }
}

TEST_F(ReshardTest, RangesPastTheEndOrOfUnknownTensorsAreRefused) {
  const std::vector<uint64_t> global = {3000};
  ASSERT_NO_FATAL_FAILURE(WriteSlice(0, 1, global, WholeBox(global)));
  std::unique_ptr<ShardReader> reader = Open(0);
  ASSERT_NE(reader, nullptr);
  std::vector<char> buf(16);
  const RangeDest past[] = {{"t", 12000 - 8, 16, buf.data()}};
  EXPECT_THAT(reader->ReadRanges(past), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("past its end")));
  const RangeDest unknown[] = {{"u", 0, 4, buf.data()}};
  EXPECT_THAT(reader->ReadRanges(unknown), StatusIs(absl::StatusCode::kNotFound, HasSubstr("'u'")));
  // Ranges inside one block and across a block boundary (blocks of 4096 bytes).
  std::vector<float> a(3), b(4);
  const RangeDest ok[] = {{"t", 40, 12, a.data()}, {"t", 4096 - 8, 16, b.data()}};
  CKPTD_ASSERT_OK(reader->ReadRanges(ok));
  EXPECT_THAT(a, ElementsAre(10, 11, 12));
  EXPECT_THAT(b, ElementsAre(1022, 1023, 1024, 1025));
}

TEST_F(ReshardTest, ACorruptBlockFailsAPartialRead) {
  const std::vector<uint64_t> global = {3000};
  ASSERT_NO_FATAL_FAILURE(WriteSlice(0, 1, global, WholeBox(global)));
  // Flip a byte of the second block's data, then read 8 bytes of it.
  std::unique_ptr<ShardReader> reader = Open(0);
  ASSERT_NE(reader, nullptr);
  const uint64_t at = reader->index().tensors(0).blocks(1).chunks(0).file_offset();
  reader.reset();
  absl::StatusOr<std::string> bytes = ReadFileToString(&fs_, Path(0));
  CKPTD_ASSERT_OK(bytes.status());
  (*bytes)[at] ^= 0x40;
  CKPTD_ASSERT_OK(WriteFileAtomically(&fs_, Path(0), *bytes));
  reader = Open(0);
  ASSERT_NE(reader, nullptr);
  std::vector<char> buf(8);
  const RangeDest r[] = {{"t", 4096 + 100, 8, buf.data()}};
  EXPECT_THAT(reader->ReadRanges(r), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("block 1")));
  // The first block is intact.
  const RangeDest first[] = {{"t", 100, 8, buf.data()}};
  CKPTD_EXPECT_OK(reader->ReadRanges(first));
}

}  // namespace
}  // namespace ckptd::storage
