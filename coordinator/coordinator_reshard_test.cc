// The coordinator's reshard plans: which slices of which saved shards each
// rank of a resized job reads, from the step's indexes read once.
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/testing/matchers.h"
#include "coordinator/testing_core_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/layout.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// "w": rows [2r, 2r + 2) of a float [8, 4] tensor; "rng": 16 bytes of its own.
ckptd::v1::Tensor Rows(uint64_t first, uint64_t count) {
  ckptd::v1::Tensor t;
  t.set_name("w");
  t.set_component(ckptd::v1::PARAMS);
  t.set_dtype(ckptd::v1::FLOAT32);
  t.add_global_shape(8);
  t.add_global_shape(4);
  t.add_offsets(first);
  t.add_offsets(0);
  t.add_shape(count);
  t.add_shape(4);
  return t;
}
ckptd::v1::Tensor Rng() {
  ckptd::v1::Tensor t;
  t.set_name("rng");
  t.set_component(ckptd::v1::RNG);
  t.set_dtype(ckptd::v1::BYTES);
  t.add_shape(16);
  return t;
}

class ReshardPlanTest : public CoordinatorCoreTest {
 protected:
  // Four ranks on two nodes commit step 10, "w" split by rows; then node-b
  // is gone and node-a runs the job as two ranks.
  void SetUp() override {
    TwoNodes();
    CKPTD_ASSERT_OK(store_.PrepareStep(kJob, 10));
    for (uint32_t r = 0; r < 4; ++r) {
      std::vector<float> w(2 * 4, static_cast<float>(r));
      std::vector<uint8_t> rng(16, static_cast<uint8_t>(r));
      std::vector<storage::TensorSource> src = {{Rows(2 * r, 2), w.data(), w.size() * sizeof(float)},
                                                {Rng(), rng.data(), rng.size()}};
      CKPTD_ASSERT_OK_AND_ASSIGN(storage::ShardWriteResult written, store_.WriteShard(kJob, 10, r, 4, src));
      CKPTD_ASSERT_OK_AND_ASSIGN(
          ckptd::v1::ReportShardResponse resp,
          core_->ReportShard(ShardRequest(r < 2 ? "node-a" : "node-b",
                                          ReportOf(10, r, written.file_length, written.index_xxh3))));
      EXPECT_EQ(resp.committed(), r == 3);
    }
    ranks_["node-b"] = Registration("node-b", {});
    CKPTD_ASSERT_OK(Beat("node-b").status());
    ranks_["node-a"] = Registration("node-a", {0, 1}, /*world=*/2);
    CKPTD_ASSERT_OK(Beat("node-a").status());
    ASSERT_EQ(JobState().world_size(), 2u);
  }

  // Rank `rank` of 2 asks, through `node`, for step `step`.
  ckptd::v1::ReshardPlanRequest Request(uint32_t rank, const std::string& node = "node-a", uint64_t step = 10) {
    ckptd::v1::ReshardPlanRequest req;
    req.set_job(kJob);
    req.set_rank(rank);
    req.set_world_size(2);
    req.set_step(step);
    req.set_node_id(node);
    req.set_session(sessions_[node]);
    *req.add_buffers() = Rows(4 * rank, 4);
    *req.add_buffers() = Rng();
    return req;
  }

  static std::vector<uint32_t> SavedRanks(const ckptd::v1::ReshardPlanResponse& plan) {
    std::vector<uint32_t> ranks;
    for (const ckptd::v1::ReshardRead& r : plan.reads()) ranks.push_back(r.saved_rank());
    return ranks;
  }
};

TEST_F(ReshardPlanTest, EachRankReadsOnlyTheSlicesThatHoldItsOwn) {
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ReshardPlanResponse zero, core_->GetReshardPlan(Request(0)));
  EXPECT_EQ(zero.saved_world_size(), 4u);
  // Rows 0..4 are saved ranks 0's and 1's; its RNG is rank 0's.
  EXPECT_THAT(SavedRanks(zero), ElementsAre(0, 0, 1));
  EXPECT_EQ(zero.shards(), 2u);
  for (const ckptd::v1::ReshardRead& r : zero.reads()) {
    if (r.buffer() == 0) {
      EXPECT_THAT(r.offsets(), ElementsAre(2 * r.saved_rank(), 0));
      EXPECT_THAT(r.shape(), ElementsAre(2, 4));
    } else {
      EXPECT_EQ(r.buffer(), 1u);
      EXPECT_THAT(r.shape(), ElementsAre(16));
    }
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ReshardPlanResponse one, core_->GetReshardPlan(Request(1)));
  EXPECT_THAT(SavedRanks(one), ElementsAre(1, 2, 3));  // its RNG is rank 1's; rows 4..8 ranks 2's and 3's
  EXPECT_EQ(one.shards(), 3u);
  // The step's indexes were read once for both.
  EXPECT_EQ(core_->reshard_layouts_read(), 1u);
}

TEST_F(ReshardPlanTest, RanksAskingAtOnceShareOneReadOfTheStep) {
  std::vector<absl::StatusOr<ckptd::v1::ReshardPlanResponse>> plans(8, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < plans.size(); ++i) {
    threads.emplace_back([&, i] { plans[i] = core_->GetReshardPlan(Request(static_cast<uint32_t>(i % 2))); });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < plans.size(); ++i) {
    ASSERT_THAT(plans[i].status(), IsOk()) << i;
    EXPECT_EQ(plans[i]->shards(), i % 2 == 0 ? 2u : 3u);
  }
  EXPECT_EQ(core_->reshard_layouts_read(), 1u);
}

TEST_F(ReshardPlanTest, ACallerMustSpeakForTheRankInItsSession) {
  ckptd::v1::ReshardPlanRequest stale = Request(0);
  stale.set_session("not-the-session");
  EXPECT_THAT(core_->GetReshardPlan(stale), StatusIs(absl::StatusCode::kNotFound, HasSubstr("register again")));
  // node-b is registered, but rank 0 runs on node-a.
  EXPECT_THAT(core_->GetReshardPlan(Request(0, "node-b")),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("a node speaks only for its own ranks")));
  ckptd::v1::ReshardPlanRequest unknown = Request(0);
  unknown.set_job("other-job");
  EXPECT_THAT(core_->GetReshardPlan(unknown), StatusIs(absl::StatusCode::kNotFound, HasSubstr("other-job")));
  ckptd::v1::ReshardPlanRequest hostile_job = Request(0);
  hostile_job.set_job("../../etc");
  EXPECT_THAT(core_->GetReshardPlan(hostile_job), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("etc")));
  EXPECT_EQ(core_->reshard_layouts_read(), 0u);  // nothing was read for them
}

TEST_F(ReshardPlanTest, OnlyCommittedStepsOfTheJobsWorldArePlanned) {
  EXPECT_THAT(core_->GetReshardPlan(Request(0, "node-a", 20)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("step 20 of job llm-7b is not committed")));
  ckptd::v1::ReshardPlanRequest old_world = Request(0);
  old_world.set_world_size(4);
  EXPECT_THAT(core_->GetReshardPlan(old_world),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("runs 2 ranks, not 4")));
  ckptd::v1::ReshardPlanRequest outside = Request(0);
  outside.set_rank(2);
  EXPECT_THAT(core_->GetReshardPlan(outside),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not inside world size 2")));
  EXPECT_EQ(core_->reshard_layouts_read(), 0u);
}

TEST_F(ReshardPlanTest, MalformedBuffersAreRefusedByName) {
  auto with = [&](const std::function<void(ckptd::v1::ReshardPlanRequest*)>& change) {
    ckptd::v1::ReshardPlanRequest req = Request(0);
    change(&req);
    return core_->GetReshardPlan(req).status();
  };
  EXPECT_THAT(with([](auto* r) { r->clear_buffers(); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 buffers")));
  EXPECT_THAT(with([](auto* r) { r->mutable_buffers(0)->set_offsets(0, 7); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds global dimension 0")));
  EXPECT_THAT(with([](auto* r) { r->mutable_buffers(1)->set_name(""); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("buffer 1: tensor name is empty")));
  EXPECT_THAT(with([](auto* r) { *r->add_buffers() = Rng(); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("buffer 2: its name is another buffer's")));
  EXPECT_THAT(with([](auto* r) { r->mutable_buffers(0)->add_blocks()->set_raw_length(4); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("carries no blocks")));
  EXPECT_THAT(with([](auto* r) { r->mutable_buffers(0)->add_shape(1); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("same rank")));
  // Well-formed, but not what the step holds: the planner says which.
  EXPECT_THAT(with([](auto* r) {
                r->mutable_buffers(0)->set_global_shape(1, 5);
                r->mutable_buffers(0)->set_shape(1, 5);
              }),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("global shape [8, 4]")));
  EXPECT_THAT(with([](auto* r) { r->mutable_buffers()->RemoveLast(); }),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("'rng' that is not registered")));
}

TEST_F(ReshardPlanTest, ADamagedShardFailsThePlanAndIsReadAgainNextTime) {
  const std::string path = storage::ShardPath(kRoot, kJob, 10, 2);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string bytes, storage::ReadFileToString(&fs_, path));
  CKPTD_ASSERT_OK(fs_.SetFileContents(path, bytes.substr(0, bytes.size() - 8)));
  EXPECT_THAT(core_->GetReshardPlan(Request(0)), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rank-2.shard")));
  EXPECT_EQ(core_->reshard_layouts_read(), 1u);
  // Not kept: repaired, the next plan reads the step again.
  CKPTD_ASSERT_OK(fs_.SetFileContents(path, bytes));
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ReshardPlanResponse plan, core_->GetReshardPlan(Request(1)));
  EXPECT_EQ(plan.shards(), 3u);
  EXPECT_EQ(core_->reshard_layouts_read(), 2u);
}

}  // namespace
}  // namespace ckptd::coordinator
