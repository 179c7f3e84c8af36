// CoordinatorCore: verifying a committed step, and retention while it runs.
#include <cstdint>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "base/testing/matchers.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/testing_core_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/file_system.h"
#include "storage/layout.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST_F(CoordinatorCoreTest, VerifyReadsTheStepBackAndQuarantinesItWhenDamaged) {
  TwoNodes();
  CommitStep(10);
  CommitStep(20);
  ckptd::v1::VerifyStepRequest req;
  req.set_job(kJob);
  std::vector<uint32_t> seen;
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::VerifyProgress ok, core_->VerifyStep(req, [&](const auto& p) {
    seen.push_back(p.shards_done());
    EXPECT_EQ(p.shards_total(), 4u);
  }));
  EXPECT_THAT(seen, ElementsAre(1u, 2u, 3u, 4u));
  EXPECT_TRUE(ok.done());
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.step(), 20u);  // the newest usable step by default
  EXPECT_EQ(ok.bytes_done(), ok.bytes_total());
  EXPECT_GT(ok.bytes_total(), 0u);

  // Rank 2's shard of step 20 loses its last byte.
  const std::string path = storage::ShardPath(kRoot, kJob, 20, 2);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string bytes, storage::ReadFileToString(&fs_, path));
  bytes.pop_back();
  CKPTD_ASSERT_OK(fs_.SetFileContents(path, bytes));
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::VerifyProgress bad, core_->VerifyStep(req));
  EXPECT_TRUE(bad.done());
  EXPECT_FALSE(bad.ok());
  ASSERT_FALSE(bad.problems().empty());
  EXPECT_THAT(bad.problems(0), HasSubstr("rank-2"));
  // Never restored again: the plan falls back to step 10.
  ckptd::v1::RestorePreviewRequest preview;
  preview.set_job(kJob);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RestorePreview p, core_->GetRestorePreview(preview));
  EXPECT_EQ(p.step(), 10u);
  ASSERT_EQ(p.passed_over_size(), 1);
  EXPECT_EQ(p.passed_over(0).state(), ckptd::v1::STEP_QUARANTINED);
  EXPECT_THAT(EventKinds(), ::testing::Contains(ckptd::v1::SHARD_DAMAGED));
  EXPECT_TRUE(Exists(storage::QuarantinePath(kRoot, kJob, 20)));

  req.set_has_step(true);
  req.set_step(15);
  EXPECT_THAT(core_->VerifyStep(req), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not committed")));
  req.set_job("nope");
  EXPECT_THAT(core_->VerifyStep(req), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no job nope")));
}

TEST_F(CoordinatorCoreTest, RetentionLeavesAStepAloneWhileItIsVerified) {
  options_.keep_last = 1;
  Reset();
  TwoNodes();
  CommitStep(10);
  ckptd::v1::VerifyStepRequest req;
  req.set_job(kJob);
  req.set_has_step(true);
  req.set_step(10);
  bool committed_meanwhile = false;
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::VerifyProgress v, core_->VerifyStep(req, [&](const auto&) {
    if (committed_meanwhile) return;
    committed_meanwhile = true;
    // Two newer steps commit while step 10 is read back; with keep_last 1
    // step 10 would go, but not under the verification.
    CommitStep(20);
    CommitStep(30);
    core_->Tick();
    EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 10)));
    EXPECT_FALSE(Exists(storage::ManifestPath(kRoot, kJob, 20)));
  }));
  EXPECT_TRUE(v.ok()) << v.DebugString();
  EXPECT_EQ(v.step(), 10u);
  // Once verified it is retained no more: the next commit drops it.
  CommitStep(40);
  core_->Tick();
  EXPECT_FALSE(Exists(storage::ManifestPath(kRoot, kJob, 10)));
  EXPECT_FALSE(Exists(storage::ManifestPath(kRoot, kJob, 30)));
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 40)));
}

}  // namespace
}  // namespace ckptd::coordinator
