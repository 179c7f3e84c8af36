// The storage engine (CheckpointStore) with its root in an object store: the
// commit protocol, listing, retention, quarantine, cleanup of steps that
// never committed and verification, against a real S3 server (the test RGW).
#include <cstring>
#include <string>
#include <vector>

#include "base/testing/matchers.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "objstore/object_file_system.h"
#include "objstore/testing_rgw.h"
#include "storage/layout.h"
#include "storage/reshard.h"
#include "storage/shard_reader.h"
#include "storage/store.h"
#include "storage/testing_data.h"

namespace ckptd::objstore {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::RankData;
using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kJob[] = "llm";
constexpr char kParams[] = "layer0.weight";
constexpr char kRng[] = "rng.state";
constexpr size_t kParamCount = 3 << 20;  // 12 MiB of floats: a multipart upload
constexpr size_t kRngBytes = 100;

class StoreOnObjectStoreTest : public ::testing::Test {
 protected:
  bool Start() {
    std::string why;
    rgw_ = testing::FindTestRgw(&why);
    if (!rgw_) {
      why_ = why;
      return false;
    }
    S3Options o = rgw_->options;
    o.part_bytes = 5 << 20;
    o.max_connections = 4;
    absl::StatusOr<std::unique_ptr<ObjectStoreFileSystem>> fs = ObjectStoreFileSystem::Create(o);
    EXPECT_THAT(fs.status(), IsOk());
    if (!fs.ok()) return false;
    fs_ = std::move(*fs);
    root_ = testing::UniqueRoot(*rgw_, "root");
    store_ = std::make_unique<storage::CheckpointStore>(fs_.get(), root_);
    return true;
  }

  absl::Status WriteRank(uint64_t step, uint32_t rank, uint32_t world) {
    const RankData data = ::ckptd::testing::MakeRankData(step, rank, kParamCount, kRngBytes);
    const std::vector<storage::TensorSource> sources = ::ckptd::testing::RankSources(data, kParams, kRng);
    storage::ShardWriteOptions opts;
    opts.direct_io = false;
    return store_->WriteShard(kJob, step, rank, world, sources, opts, &pool_).status();
  }

  absl::Status Commit(uint64_t step, uint32_t world) {
    CKPTD_RETURN_IF_ERROR(store_->PrepareStep(kJob, step));
    for (uint32_t r = 0; r < world; ++r) CKPTD_RETURN_IF_ERROR(WriteRank(step, r, world));
    return store_->CommitStep(kJob, step, world).status();
  }

  void ExpectRank(uint64_t step, uint32_t rank) {
    CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::StepManifest m, store_->ReadManifest(kJob, step));
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<storage::ShardReader> reader,
                               store_->OpenCommittedShard(kJob, step, m, rank));
    const RankData want = ::ckptd::testing::MakeRankData(step, rank, kParamCount, kRngBytes);
    std::vector<float> params(kParamCount, -1.0f);
    std::string rng(kRngBytes, '\0');
    const storage::TensorDest dests[] = {{kParams, params.data(), params.size() * sizeof(float)},
                                         {kRng, rng.data(), rng.size()}};
    CKPTD_ASSERT_OK(reader->ReadTensors(dests));
    EXPECT_EQ(0, std::memcmp(params.data(), want.params.data(), params.size() * sizeof(float)));
    EXPECT_EQ(rng, want.rng);
  }

  std::vector<uint64_t> Committed() {
    std::vector<uint64_t> out;
    absl::StatusOr<std::vector<storage::StepInfo>> steps = store_->ListSteps(kJob);
    EXPECT_THAT(steps.status(), IsOk());
    if (!steps.ok()) return out;
    for (const storage::StepInfo& s : *steps) {
      if (s.state == storage::StepState::kCommitted) out.push_back(s.step);
    }
    return out;
  }

  std::optional<testing::TestRgw> rgw_;
  std::string why_;
  std::unique_ptr<ObjectStoreFileSystem> fs_;
  std::string root_;
  std::unique_ptr<storage::CheckpointStore> store_;
  base::ThreadPool pool_{2};
};

#define START_OR_SKIP() \
  if (!Start()) GTEST_SKIP() << "no S3 server for this test: " << why_

TEST_F(StoreOnObjectStoreTest, AStepIsCommittedExactlyWhenItsManifestExistsAndReadsBackBitExact) {
  START_OR_SKIP();
  CKPTD_ASSERT_OK(store_->PrepareStep(kJob, 10));
  CKPTD_ASSERT_OK(WriteRank(10, 0, 2));
  // One rank missing: no commit, no MANIFEST.
  EXPECT_THAT(store_->CommitStep(kJob, 10, 2), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 1")));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<storage::StepInfo> steps, store_->ListSteps(kJob));
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].state, storage::StepState::kIncomplete);
  CKPTD_ASSERT_OK(WriteRank(10, 1, 2));
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::StepManifest m, store_->CommitStep(kJob, 10, 2));
  EXPECT_EQ(m.shards_size(), 2);
  EXPECT_THAT(store_->CommitStep(kJob, 10, 2), StatusIs(absl::StatusCode::kAlreadyExists, ::testing::_));
  EXPECT_THAT(store_->LatestCommittedStep(kJob), ::ckptd::testing::IsOkAndHolds(std::optional<uint64_t>(10)));
  ExpectRank(10, 0);
  ExpectRank(10, 1);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<std::string> jobs, store_->ListJobs());
  EXPECT_THAT(jobs, ElementsAre(kJob));
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::StepVerifyReport report, store_->VerifyStep(kJob, 10));
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.shards, 2);
}

TEST_F(StoreOnObjectStoreTest, VerifyFindsACorruptedObjectAndQuarantineAndRetentionKeepTheRightSteps) {
  START_OR_SKIP();
  for (uint64_t step : {1, 2, 3}) CKPTD_ASSERT_OK(Commit(step, 1));
  // Corrupt step 3's shard in the store: one byte of a block, rewritten whole.
  const std::string shard = storage::ShardPath(root_, kJob, 3, 0);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string bytes, storage::ReadFileToString(fs_.get(), shard));
  bytes[bytes.size() / 2] ^= 0x40;
  CKPTD_ASSERT_OK(storage::WriteFileAtomically(fs_.get(), shard, bytes));
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::StepVerifyReport report, store_->VerifyStep(kJob, 3));
  EXPECT_FALSE(report.ok());
  CKPTD_ASSERT_OK(store_->QuarantineStep(kJob, 3, "checksum mismatch"));
  EXPECT_THAT(store_->LatestCommittedStep(kJob), ::ckptd::testing::IsOkAndHolds(std::optional<uint64_t>(2)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> dropped, store_->ApplyRetention(kJob, 1));
  EXPECT_THAT(dropped, ElementsAre(1u));
  EXPECT_THAT(Committed(), ElementsAre(2u, 3u)) << "the newest intact step and the quarantined one stay";
  // Nothing of step 1 is left: no object, no marker, no open upload.
  CKPTD_ASSERT_OK_AND_ASSIGN(ObjectUrl url, ParseObjectUrl(storage::StepDir(root_, kJob, 1)));
  CKPTD_ASSERT_OK_AND_ASSIGN(ListResult left, fs_->client()->List(url.bucket, url.key));
  EXPECT_THAT(left.objects, IsEmpty());
}

TEST_F(StoreOnObjectStoreTest, APersistThatDiedLeavesNothingAReaderTakesAndTheCleanupAbortsItsUpload) {
  START_OR_SKIP();
  CKPTD_ASSERT_OK(Commit(1, 1));
  CKPTD_ASSERT_OK(store_->PrepareStep(kJob, 2));
  {
    // A shard upload under way when its writer is gone (a process that died
    // keeps its parts on the server; a dropped file aborts them itself, so
    // the parts are made by hand here).
    CKPTD_ASSERT_OK_AND_ASSIGN(ObjectUrl url, ParseObjectUrl(storage::ShardPath(root_, kJob, 2, 0)));
    CKPTD_ASSERT_OK_AND_ASSIGN(std::string id, fs_->client()->CreateUpload(url.bucket, url.key));
    CKPTD_ASSERT_OK(fs_->client()->UploadPart(url.bucket, url.key, id, 1, std::string(5 << 20, 'x')).status());
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<storage::StepInfo> steps, store_->ListSteps(kJob));
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[1].state, storage::StepState::kIncomplete);
  EXPECT_THAT(store_->LatestCommittedStep(kJob), ::ckptd::testing::IsOkAndHolds(std::optional<uint64_t>(1)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> removed, store_->RemoveIncompleteSteps(kJob));
  EXPECT_THAT(removed, ElementsAre(2u));
  CKPTD_ASSERT_OK_AND_ASSIGN(ObjectUrl job, ParseObjectUrl(storage::JobDir(root_, kJob)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<UploadInfo> open, fs_->client()->ListUploads(job.bucket, job.key + "/"));
  EXPECT_THAT(open, IsEmpty());
  ExpectRank(1, 0);
}

TEST_F(StoreOnObjectStoreTest, ARankThatMovedRewritesItsShardWholeNeverAMix) {
  START_OR_SKIP();
  CKPTD_ASSERT_OK(store_->PrepareStep(kJob, 4));
  // Two writers of the same shard (the old and the new home of a rank);
  // each object version is complete, and the commit checks the one it finds.
  CKPTD_ASSERT_OK(WriteRank(4, 0, 1));
  CKPTD_ASSERT_OK(WriteRank(4, 0, 1));
  CKPTD_ASSERT_OK(store_->CommitStep(kJob, 4, 1).status());
  ExpectRank(4, 0);
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::StepVerifyReport report, store_->VerifyStep(kJob, 4));
  EXPECT_TRUE(report.ok());
}

TEST_F(StoreOnObjectStoreTest, AFreshStartIsRecordedInTheBucket) {
  START_OR_SKIP();
  CKPTD_ASSERT_OK(Commit(7, 1));
  CKPTD_ASSERT_OK(store_->QuarantineStep(kJob, 7, "bad"));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t over, store_->AllowFreshStart(kJob, "operator"));
  EXPECT_EQ(over, 7u);
  EXPECT_THAT(store_->FreshStartAllowedOver(kJob), ::ckptd::testing::IsOkAndHolds(std::optional<uint64_t>(7)));
}

}  // namespace
}  // namespace ckptd::objstore
