#include "storage/reshard_plan.h"

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"  // CKPTD_STATUS_CONCAT_, used by testing_matchers.h
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::storage {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using ckptd::v1::Tensor;

// A slice `box` of a float tensor of shape `global`, as a shard's index
// (with a block list, which the layout drops) or a registration holds it.
Tensor Slice(const std::string& name, std::vector<uint64_t> global, const Box& box) {
  Tensor t;
  t.set_name(name);
  t.set_component(ckptd::v1::PARAMS);
  t.set_dtype(ckptd::v1::FLOAT32);
  uint64_t elements = 1;
  for (size_t d = 0; d < global.size(); ++d) {
    t.add_global_shape(global[d]);
    t.add_offsets(box.offsets[d]);
    t.add_shape(box.shape[d]);
    elements *= box.shape[d];
  }
  t.set_raw_length(elements * 4);
  t.add_blocks()->set_raw_length(elements * 4);
  return t;
}

// A buffer of its own (no global layout): bytes of `n`.
Tensor Own(const std::string& name, uint64_t n) {
  Tensor t;
  t.set_name(name);
  t.set_component(ckptd::v1::RNG);
  t.set_dtype(ckptd::v1::BYTES);
  t.add_shape(n);
  t.set_raw_length(n);
  return t;
}

// Rows [rows * i / parts, rows * (i + 1) / parts) of [rows, cols].
Box RowBlock(uint64_t rows, uint64_t cols, uint32_t i, uint32_t parts) {
  const uint64_t begin = rows * i / parts;
  const uint64_t end = rows * (i + 1) / parts;
  return Box{{begin, 0}, {end - begin, cols}};
}
Box ColBlock(uint64_t rows, uint64_t cols, uint32_t i, uint32_t parts) {
  const uint64_t begin = cols * i / parts;
  const uint64_t end = cols * (i + 1) / parts;
  return Box{{0, begin}, {rows, end - begin}};
}

// The layout of a step whose rank r saved `per_rank[r]`.
SavedLayout Layout(const std::vector<std::vector<Tensor>>& per_rank) {
  SavedLayout layout(static_cast<uint32_t>(per_rank.size()));
  for (uint32_t r = 0; r < per_rank.size(); ++r) {
    ckptd::v1::ShardIndex index;
    for (const Tensor& t : per_rank[r]) *index.add_tensors() = t;
    layout.Add(r, index);
  }
  layout.Seal();
  return layout;
}

std::set<uint32_t> RanksOf(const std::vector<PlannedRead>& reads) {
  std::set<uint32_t> ranks;
  for (const PlannedRead& r : reads) ranks.insert(r.rank);
  return ranks;
}

TEST(SavedLayoutTest, DropsBlockListsAndFindsByRankAndName) {
  SavedLayout layout = Layout({{Slice("w", {8, 4}, RowBlock(8, 4, 0, 2)), Own("rng", 16)},
                               {Slice("w", {8, 4}, RowBlock(8, 4, 1, 2)), Own("rng", 16)}});
  EXPECT_EQ(layout.world_size(), 2u);
  EXPECT_EQ(layout.size(), 4u);
  const SavedTensor* w1 = layout.Find(1, "w");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w1->rank, 1u);
  EXPECT_EQ(w1->meta.blocks_size(), 0);
  EXPECT_EQ(SliceBox(w1->meta), RowBlock(8, 4, 1, 2));
  EXPECT_EQ(layout.Find(2, "w"), nullptr);
  EXPECT_EQ(layout.Find(0, "nope"), nullptr);
  std::vector<absl::string_view> names = layout.NamesOf(0);
  std::sort(names.begin(), names.end());
  EXPECT_THAT(names, ElementsAre("rng", "w"));
}

// Candidates are found through rows of dimension 0; whatever the cut, they
// hold every saved slice that overlaps the target.
TEST(SavedLayoutTest, CandidatesHoldEverySliceThatOverlaps) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    const uint64_t rows = 1 + rng() % 64;
    const uint32_t parts = 1 + static_cast<uint32_t>(rng() % std::min<uint64_t>(rows, 16));
    // Uneven cuts: random points.
    std::set<uint64_t> points = {0, rows};
    while (points.size() < parts + 1) points.insert(1 + rng() % std::max<uint64_t>(rows - 1, 1));
    std::vector<uint64_t> cut(points.begin(), points.end());
    std::vector<std::vector<Tensor>> saved;
    std::vector<Box> boxes;
    for (size_t i = 0; i + 1 < cut.size(); ++i) {
      boxes.push_back(Box{{cut[i], 0}, {cut[i + 1] - cut[i], 3}});
      saved.push_back({Slice("w", {rows, 3}, boxes.back())});
    }
    // Saved out of row order: ranks shuffled over the slices.
    std::vector<size_t> order(boxes.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::vector<Tensor>> shuffled;
    for (size_t i : order) shuffled.push_back(saved[i]);
    const SavedLayout layout = Layout(shuffled);
    const uint64_t begin = rng() % rows;
    const uint64_t length = 1 + rng() % (rows - begin);
    const Box target{{begin, 0}, {length, 3}};
    std::set<uint32_t> want;
    for (uint32_t r = 0; r < order.size(); ++r) {
      if (OverlapVolume(boxes[order[r]], target) > 0) want.insert(r);
    }
    std::set<uint32_t> got;
    uint32_t last = 0;
    for (const SavedTensor* c : layout.Candidates("w", target)) {
      EXPECT_GE(c->rank, last) << "candidates are ordered by rank";
      last = c->rank;
      got.insert(c->rank);
    }
    EXPECT_EQ(got, want) << "round " << round << ": rows [" << begin << ", " << begin + length << ") of " << rows;
  }
}

// N -> M for N, M in 1..6, rows split both times: every new rank reads
// exactly the saved slices that overlap its own, and they fill it.
TEST(PlanReshardTest, RowSplitsOntoAnyOtherNumberOfRanks) {
  for (uint32_t n = 1; n <= 6; ++n) {
    std::vector<std::vector<Tensor>> saved;
    for (uint32_t r = 0; r < n; ++r) saved.push_back({Slice("w", {12, 5}, RowBlock(12, 5, r, n)), Own("rng", 8)});
    const SavedLayout layout = Layout(saved);
    for (uint32_t m = 1; m <= 6; ++m) {
      for (uint32_t rank = 0; rank < m; ++rank) {
        SCOPED_TRACE(absl::StrCat(n, " -> ", m, ", rank ", rank));
        const Box mine = RowBlock(12, 5, rank, m);
        const std::vector<Tensor> buffers = {Slice("w", {12, 5}, mine), Own("rng", 8)};
        CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<PlannedRead> reads, PlanReshard(10, rank, buffers, layout));
        std::set<uint32_t> want;
        for (uint32_t r = 0; r < n; ++r) {
          if (OverlapVolume(RowBlock(12, 5, r, n), mine) > 0) want.insert(r);
        }
        want.insert(rank % n);  // the RNG: its own, or rank mod n's
        EXPECT_EQ(RanksOf(reads), want);
        uint64_t covered = 0;
        for (const PlannedRead& r : reads) {
          if (r.buffer == 0) {
            EXPECT_EQ(r.target, mine);
            EXPECT_EQ(r.source, RowBlock(12, 5, r.rank, n));
            covered += OverlapVolume(r.source, r.target);
          } else {
            EXPECT_EQ(r.rank, rank % n);
          }
        }
        EXPECT_EQ(covered, mine.shape[0] * 5);
        EXPECT_TRUE(std::is_sorted(reads.begin(), reads.end(),
                                   [](const PlannedRead& a, const PlannedRead& b) { return a.rank < b.rank; }));
        EXPECT_THAT(CheckPlan(buffers, reads), IsOk());
      }
    }
  }
}

TEST(PlanReshardTest, AChangeOfTheSplitDimensionReadsEveryOverlappingSlice) {
  // Saved split by columns over 4 ranks, read split by rows over 3: every
  // new rank needs a part of every saved slice.
  std::vector<std::vector<Tensor>> saved;
  for (uint32_t r = 0; r < 4; ++r) saved.push_back({Slice("w", {9, 8}, ColBlock(9, 8, r, 4))});
  const SavedLayout layout = Layout(saved);
  for (uint32_t rank = 0; rank < 3; ++rank) {
    const std::vector<Tensor> buffers = {Slice("w", {9, 8}, RowBlock(9, 8, rank, 3))};
    CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<PlannedRead> reads, PlanReshard(10, rank, buffers, layout));
    EXPECT_EQ(RanksOf(reads), (std::set<uint32_t>{0, 1, 2, 3}));
    EXPECT_THAT(CheckPlan(buffers, reads), IsOk());
  }
}

// Shares of replicated buffers: two groups of two hold other bytes under the
// same name; each rank reads its own group's shares.
TEST(PlanReshardTest, SharesAreReadFromTheRanksOwnGroup) {
  auto share = [](uint32_t index, uint64_t xxh3) {
    Tensor t = Slice("adam", {8, 4}, RowBlock(8, 4, index, 2));
    t.mutable_replica()->set_group("dp");
    t.mutable_replica()->set_count(2);
    t.mutable_replica()->set_index(index);
    t.mutable_replica()->add_shape(8);
    t.mutable_replica()->add_shape(4);
    t.mutable_replica()->add_offsets(0);
    t.mutable_replica()->add_offsets(0);
    t.mutable_replica()->set_block_bytes(4096);
    t.mutable_replica()->add_block_xxh3(xxh3);
    return t;
  };
  // Ranks 0, 1: group A; ranks 2, 3: group B (other bytes, other checksums).
  const SavedLayout layout = Layout({{share(0, 111)}, {share(1, 111)}, {share(0, 222)}, {share(1, 222)}});
  EXPECT_EQ(layout.Find(2, "adam")->meta.replica().block_xxh3_size(), 0);  // digested
  Tensor whole = Own("adam", 0);
  whole.set_component(ckptd::v1::OPTIMIZER);
  whole.set_dtype(ckptd::v1::FLOAT32);
  whole.set_shape(0, 8);
  whole.add_shape(4);
  for (uint32_t rank = 0; rank < 4; ++rank) {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<PlannedRead> reads, PlanReshard(10, rank, {whole}, layout));
    EXPECT_EQ(RanksOf(reads), rank < 2 ? (std::set<uint32_t>{0, 1}) : (std::set<uint32_t>{2, 3})) << rank;
  }
  // Two ranks after four: rank r reads the group of saved rank r.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<PlannedRead> one, PlanReshard(10, 1, {whole}, layout));
  EXPECT_EQ(RanksOf(one), (std::set<uint32_t>{0, 1}));
  // With a global layout, the elements of one member box come from one
  // group: the lowest rank's.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<PlannedRead> global,
                             PlanReshard(10, 3, {Slice("adam", {8, 4}, WholeBox({8, 4}))}, layout));
  EXPECT_EQ(RanksOf(global), (std::set<uint32_t>{0, 1}));
}

TEST(PlanReshardTest, WhatTheStepCannotFillIsNamed) {
  std::vector<std::vector<Tensor>> saved;
  for (uint32_t r = 0; r < 2; ++r) saved.push_back({Slice("w", {8, 4}, RowBlock(8, 4, r, 4)), Own("rng", 8)});
  // Ranks 0 and 1 of 4 saved: rows 4..8 are nowhere.
  const SavedLayout layout = Layout(saved);
  EXPECT_THAT(PlanReshard(10, 0, {Slice("w", {8, 4}, WholeBox({8, 4})), Own("rng", 8)}, layout),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cover 16 of the 32 elements")));
  // Another global shape, another dtype, another own shape.
  EXPECT_THAT(PlanReshard(10, 0, {Slice("w", {8, 5}, Box{{0, 0}, {2, 5}}), Own("rng", 8)}, layout),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("global shape [8, 4]")));
  Tensor half = Slice("w", {8, 4}, RowBlock(8, 4, 0, 4));
  half.set_dtype(ckptd::v1::FLOAT16);
  EXPECT_THAT(PlanReshard(10, 0, {half, Own("rng", 8)}, layout),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("FLOAT32")));
  EXPECT_THAT(PlanReshard(10, 1, {Slice("w", {8, 4}, RowBlock(8, 4, 1, 4)), Own("rng", 9)}, layout),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("without a global layout")));
  // A buffer the step lacks, a tensor the rank does not register.
  EXPECT_THAT(PlanReshard(10, 0, {Slice("w", {8, 4}, RowBlock(8, 4, 0, 4)), Own("rng", 8), Own("extra", 4)},
                          layout),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("'extra' is not in rank 0's shard")));
  EXPECT_THAT(PlanReshard(10, 0, {Slice("w", {8, 4}, RowBlock(8, 4, 0, 4))}, layout),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("holds tensor 'rng' that is not registered")));
  // The tensor grew: rows the step never had are named by the shape, not
  // as a hole.
  EXPECT_THAT(PlanReshard(10, 1, {Slice("w", {16, 4}, Box{{8, 0}, {8, 4}}), Own("rng", 8)}, layout),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 0 saved FLOAT32 of global shape [8, 4]")));
  // Ranks that saved one tensor two ways.
  const SavedLayout mixed =
      Layout({{Slice("w", {8, 4}, RowBlock(8, 4, 0, 2))}, {Slice("w", {9, 4}, Box{{4, 0}, {5, 4}})}});
  EXPECT_THAT(PlanReshard(10, 0, {Slice("w", {8, 4}, WholeBox({8, 4}))}, mixed),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("different dtypes or global shapes")));
  // Saved slices that overlap without being the same.
  const SavedLayout overlapping =
      Layout({{Slice("w", {8, 4}, Box{{0, 0}, {5, 4}})}, {Slice("w", {8, 4}, Box{{4, 0}, {4, 4}})}});
  EXPECT_THAT(PlanReshard(10, 0, {Slice("w", {8, 4}, WholeBox({8, 4}))}, overlapping),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("overlap without being the same slice")));
}

// A plan made elsewhere is checked before a byte is read.
TEST(CheckPlanTest, RefusesPlansThatDoNotFillTheBuffersExactly) {
  const std::vector<Tensor> buffers = {Slice("w", {8, 4}, RowBlock(8, 4, 0, 2))};  // rows 0..4
  const Box mine = RowBlock(8, 4, 0, 2);
  auto read = [&](uint32_t rank, size_t buffer, Box source) { return PlannedRead{rank, buffer, source, mine}; };
  const Box a{{0, 0}, {2, 4}};
  const Box b{{2, 0}, {2, 4}};
  EXPECT_THAT(CheckPlan(buffers, {read(0, 0, a), read(1, 0, b)}), IsOk());
  EXPECT_THAT(CheckPlan(buffers, {read(0, 0, a), read(1, 1, b)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("names buffer 1 of 1")));
  EXPECT_THAT(CheckPlan(buffers, {read(0, 0, a)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cover 8 of the 16 elements")));
  EXPECT_THAT(CheckPlan(buffers, {read(0, 0, a), read(1, 0, Box{{1, 0}, {3, 4}})}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
  EXPECT_THAT(CheckPlan(buffers, {read(0, 0, a), read(1, 0, b), read(2, 0, b)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reads 3 slices where 2 distinct ones")));
  EXPECT_THAT(CheckPlan(buffers, {read(0, 0, a), read(1, 0, Box{{2, 0}, {7, 4}})}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside its global shape [8, 4]")));
  EXPECT_THAT(CheckPlan(buffers, {read(0, 0, Box{{0}, {4}})}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not of its slice")));
  PlannedRead elsewhere = read(0, 0, a);
  elsewhere.target = b;
  EXPECT_THAT(CheckPlan(buffers, {elsewhere, read(1, 0, b)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not of its slice")));
  // Nothing planned for a buffer fills nothing.
  EXPECT_THAT(CheckPlan(buffers, {}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no saved slice")));
}

TEST(CheckPlannedSourceTest, TheShardMustHoldThePlannedSlice) {
  const Tensor buffer = Slice("w", {8, 4}, RowBlock(8, 4, 0, 2));
  const Tensor saved = Slice("w", {8, 4}, Box{{0, 0}, {2, 4}});
  EXPECT_THAT(CheckPlannedSource(saved, 3, buffer, Box{{0, 0}, {2, 4}}, "rank 3's shard"), IsOk());
  EXPECT_THAT(CheckPlannedSource(saved, 3, buffer, Box{{0, 0}, {3, 4}}, "rank 3's shard"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("the shard holds [0:2, 0:4]")));
  Tensor other = saved;
  other.set_global_shape(0, 9);
  EXPECT_THAT(CheckPlannedSource(other, 3, buffer, Box{{0, 0}, {2, 4}}, "rank 3's shard"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rank 3 saved FLOAT32 of global shape [9, 4]")));
}

}  // namespace
}  // namespace ckptd::storage
