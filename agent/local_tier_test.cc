// LocalTier on its own, on an in-memory file system (what agent_core_test's
// LocalTierTest checks through AgentCore is not repeated here).
#include "agent/local_tier.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/capturing_logger.h"
#include "base/testing/matchers.h"
#include "base/testing/temp_dir.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/fault_injection_file_system.h"
#include "storage/layout.h"
#include "storage/mem_file_system.h"
#include "storage/posix_file_system.h"
#include "storage/store.h"
#include "storage/testing_data.h"

namespace ckptd::agent {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kRoot[] = "/ckpt";
constexpr char kLocal[] = "/nvme";
constexpr char kJob[] = "job";

class LocalTierAloneTest : public ::testing::Test {
 protected:
  LocalTierAloneTest() {
    EXPECT_THAT(mem_.CreateDir(kRoot), IsOk());
    EXPECT_THAT(mem_.CreateDir(kLocal), IsOk());
  }

  LocalTierOptions Options(storage::FileSystem* fs = nullptr, int keep = 2) {
    LocalTierOptions o;
    o.dir = kLocal;
    o.fs = fs != nullptr ? fs : &mem_;
    o.keep = keep;
    o.write = ::ckptd::testing::SmallBlocks();
    o.pool = &pool_;
    o.logger = &logger_;
    return o;
  }

  // Persists rank 0 of `step` through `tier`; `released` says whether the
  // sources were handed back, `on_release` runs when they are.
  absl::StatusOr<storage::ShardWriteResult> Persist(LocalTier& tier, uint64_t step, bool* released = nullptr,
                                                    const std::function<void()>& on_release = nullptr) {
    const ::ckptd::testing::RankData data = ::ckptd::testing::MakeRankData(step, 0, 3000, 64);
    const std::vector<storage::TensorSource> sources = ::ckptd::testing::RankSources(data, "params", "rng");
    if (released != nullptr) *released = false;
    return tier.Persist({kJob, step, 0, 1}, sources,
                        [&] {
                          if (released != nullptr) *released = true;
                          if (on_release) on_release();
                        },
                        &counters_);
  }

  // Commits `step` (rank 0 of 1) in the storage root, as the agent would.
  void Commit(uint64_t step, const storage::ShardWriteResult& written) {
    ckptd::v1::ShardRef ref;
    ref.set_rank(0);
    ref.set_file(storage::ShardFileName(0));
    ref.set_file_length(written.file_length);
    ref.set_index_xxh3(written.index_xxh3);
    std::vector<ckptd::v1::ShardRef> reported{ref};
    ASSERT_THAT(root_.CommitStep(kJob, step, 1, &reported).status(), IsOk());
  }

  // A step directory with one file, as another run would have left it.
  void LeaveStep(uint64_t step, const std::string& contents = "old") {
    ASSERT_THAT(storage::CreateDirs(&mem_, storage::StepDir(kLocal, kJob, step)), IsOk());
    ASSERT_THAT(mem_.SetFileContents(storage::ShardPath(kLocal, kJob, step, 0), contents), IsOk());
  }

  bool Exists(const std::string& path) { return mem_.Stat(path).ok(); }

  storage::MemFileSystem mem_;
  storage::CheckpointStore root_{&mem_, kRoot};
  base::ThreadPool pool_{2};
  ckptd::testing::CapturingLogger logger_;
  LocalTierCounters counters_;
};

TEST_F(LocalTierAloneTest, PersistHandsTheSourcesBackBeforeTheCopyToTheRoot) {
  LocalTier tier(Options(), &root_);
  bool released = false;
  bool root_copy_at_release = true;
  bool local_copy_at_release = false;
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::ShardWriteResult written,
                             Persist(tier, 5, &released, [&] {
                               local_copy_at_release = Exists(storage::ShardPath(kLocal, kJob, 5, 0));
                               root_copy_at_release = Exists(storage::ShardPath(kRoot, kJob, 5, 0));
                             }));
  EXPECT_TRUE(released);
  EXPECT_TRUE(local_copy_at_release);
  EXPECT_FALSE(root_copy_at_release);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string local,
                             storage::ReadFileToString(&mem_, storage::ShardPath(kLocal, kJob, 5, 0)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string root, storage::ReadFileToString(&mem_, storage::ShardPath(kRoot, kJob, 5, 0)));
  EXPECT_EQ(local, root);
  EXPECT_EQ(written.file_length, root.size());
  const LocalTierStats stats = counters_.Get();
  EXPECT_EQ(stats.writes, 1u);
  EXPECT_EQ(stats.fallbacks, 0u);
  EXPECT_THAT(stats.last_error, IsOk());
  EXPECT_EQ(stats.restores, 0u);
  EXPECT_THAT(tier.Steps(kJob), ElementsAre(5u));
}

TEST_F(LocalTierAloneTest, AFailingLocalDiskFallsBackToTheRootWithoutReleasingEarly) {
  storage::FaultInjectionFileSystem local(&mem_);
  local.FailPath(kLocal, storage::Fault::kEio, storage::FaultScope::kWrites);
  LocalTier tier(Options(&local), &root_);
  bool released = true;
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::ShardWriteResult written, Persist(tier, 3, &released));
  EXPECT_FALSE(released);  // the sources are read by the root write: the caller releases after
  EXPECT_TRUE(Exists(storage::ShardPath(kRoot, kJob, 3, 0)));
  EXPECT_FALSE(Exists(storage::ShardPath(kLocal, kJob, 3, 0)));
  const LocalTierStats stats = counters_.Get();
  EXPECT_EQ(stats.writes, 0u);
  EXPECT_EQ(stats.fallbacks, 1u);
  EXPECT_THAT(stats.last_error, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("node-local tier /nvme: ")));
  EXPECT_TRUE(logger_.Contains("job job rank 0 step 3: node-local tier /nvme: "));
  EXPECT_TRUE(logger_.Contains("writing the storage root directly"));
  // The shard is as good as one that went through the tier.
  Commit(3, written);
  EXPECT_THAT(root_.LatestCommittedStep(kJob), ::ckptd::testing::IsOkAndHolds(std::optional<uint64_t>(3)));
}

TEST_F(LocalTierAloneTest, AFailingStorageRootIsAnErrorAfterTheLocalWrite) {
  storage::FaultInjectionFileSystem shared(&mem_);
  shared.FailPath(kRoot, storage::Fault::kEnospc, storage::FaultScope::kWrites);
  storage::CheckpointStore root(&shared, kRoot);
  LocalTier tier(Options(), &root);
  bool released = false;
  EXPECT_THAT(Persist(tier, 4, &released), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr(kRoot)));
  EXPECT_TRUE(released);
  EXPECT_TRUE(Exists(storage::ShardPath(kLocal, kJob, 4, 0)));
  const LocalTierStats stats = counters_.Get();
  EXPECT_EQ(stats.writes, 1u);
  EXPECT_EQ(stats.fallbacks, 0u);  // not the tier's fault
}

TEST_F(LocalTierAloneTest, KeepsTheNewestStepsPerJobAndAtLeastOne) {
  {
    LocalTier tier(Options(&mem_, 3), &root_);
    for (uint64_t step : {1u, 2u, 3u, 4u, 5u}) CKPTD_ASSERT_OK(Persist(tier, step).status());
    EXPECT_THAT(tier.Steps(kJob), ElementsAre(3u, 4u, 5u));
    EXPECT_THAT(tier.Steps("other"), ElementsAre());
  }
  LocalTier one(Options(&mem_, 0), &root_);  // 0 keeps one all the same
  EXPECT_THAT(one.Steps(kJob), ElementsAre(5u));
  CKPTD_ASSERT_OK(Persist(one, 6).status());
  EXPECT_THAT(one.Steps(kJob), ElementsAre(6u));
}

TEST_F(LocalTierAloneTest, TheNewestCommittedStepStaysWhenNewerOnesAreNotCommittedYet) {
  LocalTier tier(Options(&mem_, 2), &root_);
  for (uint64_t step : {1u, 2u}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(storage::ShardWriteResult written, Persist(tier, step));
    Commit(step, written);
  }
  // The storage root lags: steps 3 and 4 are written here, not committed.
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::ShardWriteResult third, Persist(tier, 3));
  CKPTD_ASSERT_OK(Persist(tier, 4).status());
  EXPECT_THAT(tier.Steps(kJob), ElementsAre(2u, 3u, 4u));
  // A restart now restores step 2, from here.
  int reads = 0;
  std::optional<absl::Status> got = tier.Read(
      {kJob, 2, 0, 1},
      [&](storage::ShardReader&) {
        ++reads;
        return absl::OkStatus();
      },
      &counters_);
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(*got, IsOk());
  EXPECT_EQ(reads, 1);
  // Once a newer step commits, the older one goes.
  Commit(3, third);
  CKPTD_ASSERT_OK(Persist(tier, 5).status());
  EXPECT_THAT(tier.Steps(kJob), ElementsAre(3u, 4u, 5u));
  CKPTD_ASSERT_OK(Persist(tier, 6).status());
  EXPECT_THAT(tier.Steps(kJob), ElementsAre(3u, 5u, 6u));
}

TEST_F(LocalTierAloneTest, StepsInFlightAreNeitherPrunedNorDropped) {
  LocalTier tier(Options(&mem_, 1), &root_);
  LeaveStep(9);  // newer, from a run that is gone
  bool checked = false;
  CKPTD_ASSERT_OK(Persist(tier, 7, nullptr, [&] {
                    // Step 7 is in the tier, its copy to the root not made yet.
                    // A restore that goes back to step 0 leaves it.
                    tier.DropStepsAbove(kJob, 0);
                    EXPECT_THAT(tier.Steps(kJob), ElementsAre(7u));
                    // Step 8 (another trainer's) is done meanwhile: its prune
                    // keeps 7, and so whatever is newer.
                    EXPECT_THAT(Persist(tier, 8).status(), IsOk());
                    EXPECT_THAT(tier.Steps(kJob), ElementsAre(7u, 8u));
                    checked = true;
                  }).status());
  EXPECT_TRUE(checked);
  EXPECT_THAT(tier.Steps(kJob), ElementsAre(7u, 8u));
  // Nothing in flight any more: down to the newest.
  CKPTD_ASSERT_OK(Persist(tier, 11).status());
  EXPECT_THAT(tier.Steps(kJob), ElementsAre(11u));
}

TEST_F(LocalTierAloneTest, ReadUsesOnlyTheCopyTheManifestNames) {
  LocalTier tier(Options(), &root_);
  int reads = 0;
  auto read = [&](storage::ShardReader& reader) {
    ++reads;
    EXPECT_NE(reader.FindTensor("params"), nullptr);
    return absl::OkStatus();
  };
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::ShardWriteResult written, Persist(tier, 2));
  // Not committed yet: no MANIFEST says which copy is right.
  EXPECT_EQ(tier.Read({kJob, 2, 0, 1}, read, &counters_), std::nullopt);
  EXPECT_EQ(reads, 0);
  Commit(2, written);
  // Another rank's shard is not this one.
  EXPECT_EQ(tier.Read({kJob, 2, 1, 2}, read, &counters_), std::nullopt);
  std::optional<absl::Status> got = tier.Read({kJob, 2, 0, 1}, read, &counters_);
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(*got, IsOk());
  EXPECT_EQ(reads, 1);
  EXPECT_EQ(counters_.Get().restores, 1u);
  EXPECT_TRUE(logger_.Contains("job job rank 0: step 2 read from the node-local tier"));
  // A well-formed shard, but not the one the MANIFEST names (another
  // attempt's): not read.
  CKPTD_ASSERT_OK(Persist(tier, 20).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string other,
                             storage::ReadFileToString(&mem_, storage::ShardPath(kLocal, kJob, 20, 0)));
  CKPTD_ASSERT_OK(mem_.SetFileContents(storage::ShardPath(kLocal, kJob, 2, 0), other));
  EXPECT_EQ(tier.Read({kJob, 2, 0, 1}, read, &counters_), std::nullopt);
  EXPECT_EQ(reads, 1);
  EXPECT_TRUE(Exists(storage::ShardPath(kLocal, kJob, 2, 0)));  // not damaged: kept
}

TEST_F(LocalTierAloneTest, WhatAReadErrorMeansForTheCopy) {
  LocalTier tier(Options(), &root_);
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::ShardWriteResult written, Persist(tier, 2));
  Commit(2, written);
  const ShardId id{kJob, 2, 0, 1};
  const std::string path = storage::ShardPath(kLocal, kJob, 2, 0);
  auto failing = [](absl::Status s) { return [s](storage::ShardReader&) { return s; }; };
  // What reading the storage root would not cure comes back as it is.
  for (absl::Status s : {absl::FailedPreconditionError("buffer 'x' does not fit"),
                         absl::DeadlineExceededError("no slot"), absl::ResourceExhaustedError("no free staging slot")}) {
    std::optional<absl::Status> got = tier.Read(id, failing(s), &counters_);
    ASSERT_TRUE(got.has_value()) << s;
    EXPECT_EQ(*got, s);
  }
  EXPECT_EQ(counters_.Get().restores, 0u);
  EXPECT_TRUE(Exists(path));
  // Anything else: read the root instead; the copy stays unless damaged.
  EXPECT_EQ(tier.Read(id, failing(absl::UnavailableError("EIO")), &counters_), std::nullopt);
  EXPECT_TRUE(Exists(path));
  EXPECT_TRUE(logger_.Contains("job job rank 0: the node-local copy of step 2 cannot be read (EIO); reading the storage root"));
  EXPECT_EQ(tier.Read(id, failing(absl::DataLossError("chunk 3 checksum")), &counters_), std::nullopt);
  EXPECT_FALSE(Exists(path));
  EXPECT_EQ(tier.Read(id, failing(absl::OkStatus()), &counters_), std::nullopt);  // gone now
  EXPECT_EQ(counters_.Get().restores, 0u);
}

TEST_F(LocalTierAloneTest, ACopyThatCannotBeOpenedForDamageIsRemoved) {
  LocalTier tier(Options(), &root_);
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::ShardWriteResult written, Persist(tier, 2));
  Commit(2, written);
  const std::string path = storage::ShardPath(kLocal, kJob, 2, 0);
  CKPTD_ASSERT_OK(mem_.SetFileContents(path, std::string(written.file_length, 'x')));
  bool read = false;
  EXPECT_EQ(tier.Read({kJob, 2, 0, 1},
                      [&](storage::ShardReader&) {
                        read = true;
                        return absl::OkStatus();
                      },
                      &counters_),
            std::nullopt);
  EXPECT_FALSE(read);
  EXPECT_FALSE(Exists(path));
}

TEST_F(LocalTierAloneTest, StartingUpCleansEveryJobAndKeepsFinishedShards) {
  for (const std::string job : {"a", "b"}) {
    for (uint64_t step : {1u, 2u, 3u, 4u}) {
      ASSERT_THAT(storage::CreateDirs(&mem_, storage::StepDir(kLocal, job, step)), IsOk());
      ASSERT_THAT(mem_.SetFileContents(storage::ShardPath(kLocal, job, step, 0), "done"), IsOk());
      ASSERT_THAT(mem_.SetFileContents(absl::StrCat(storage::ShardPath(kLocal, job, step, 1), storage::kTempSuffix),
                                       "half"),
                  IsOk());
    }
  }
  LocalTier tier(Options(&mem_, 3), &root_);
  for (const std::string job : {"a", "b"}) {
    EXPECT_THAT(tier.Steps(job), ElementsAre(2u, 3u, 4u)) << job;
    for (uint64_t step : {2u, 3u, 4u}) {
      EXPECT_TRUE(Exists(storage::ShardPath(kLocal, job, step, 0))) << job << step;
      EXPECT_FALSE(Exists(absl::StrCat(storage::ShardPath(kLocal, job, step, 1), storage::kTempSuffix)));
    }
  }
  // An empty or missing tier directory is no error.
  LocalTierOptions missing = Options();
  missing.dir = "/nowhere";
  LocalTier empty(missing, &root_);
  EXPECT_THAT(empty.Steps(kJob), ElementsAre());
}

// Issue 16 (2): a step folder of the tier that is a link to a folder
// elsewhere had everything in that folder deleted by the tier's pruning. On
// the real file system, since memory holds no links.
TEST_F(LocalTierAloneTest, ALinkInPlaceOfAStepIsReportedAndNothingIsPrunedThroughIt) {
  ckptd::testing::TempDir tmp("ckptd_local_tier_");
  std::unique_ptr<storage::PosixFileSystem> posix = storage::NewPosixFileSystem();
  const std::string local = tmp.Sub("nvme");
  const std::string outside = tmp.Sub("outside");
  ASSERT_THAT(storage::CreateDirs(posix.get(), storage::JobDir(local, kJob)), IsOk());
  ASSERT_THAT(storage::CreateDirs(posix.get(), storage::JoinPath(outside, "sub")), IsOk());
  ASSERT_THAT(storage::WriteFileAtomically(posix.get(), storage::JoinPath(outside, "rank-0.shard"), "keep"), IsOk());
  ASSERT_THAT(storage::WriteFileAtomically(posix.get(), storage::JoinPath(outside, "sub/inner"), "keep"), IsOk());
  const std::string link = storage::StepDir(local, kJob, 1);
  ASSERT_EQ(::symlink(outside.c_str(), link.c_str()), 0) << std::strerror(errno);

  LocalTierOptions options = Options(posix.get(), /*keep=*/1);
  options.dir = local;
  {
    LocalTier tier(options, &root_);
    for (uint64_t step : {2u, 3u, 4u}) ASSERT_THAT(Persist(tier, step).status(), IsOk()) << step;
    EXPECT_EQ(counters_.Get().writes, 3u);
    EXPECT_THAT(tier.Steps(kJob), ElementsAre(4u));
    tier.DropStepsAbove(kJob, 0);
    EXPECT_THAT(tier.Steps(kJob), ElementsAre());
  }
  EXPECT_TRUE(logger_.Contains(absl::StrCat(link, " is a symbolic link, not a directory; left alone")));
  struct stat st;
  ASSERT_EQ(::lstat(link.c_str(), &st), 0) << std::strerror(errno);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  for (const char* name : {"rank-0.shard", "sub/inner"}) {
    EXPECT_THAT(storage::ReadFileToString(posix.get(), storage::JoinPath(outside, name)),
                ::ckptd::testing::IsOkAndHolds(std::string("keep")))
        << name;
  }
}

TEST_F(LocalTierAloneTest, ALinkInPlaceOfTheJobsFolderIsNeitherWrittenNorPrunedThrough) {
  ckptd::testing::TempDir tmp("ckptd_local_tier_");
  std::unique_ptr<storage::PosixFileSystem> posix = storage::NewPosixFileSystem();
  const std::string local = tmp.Sub("nvme");
  const std::string elsewhere = tmp.Sub("elsewhere");
  for (uint64_t step : {1u, 2u}) {
    ASSERT_THAT(storage::CreateDirs(posix.get(), storage::StepDir(elsewhere, kJob, step)), IsOk());
    ASSERT_THAT(storage::WriteFileAtomically(posix.get(), storage::ShardPath(elsewhere, kJob, step, 0), "keep"),
                IsOk());
  }
  ASSERT_THAT(posix->CreateDir(local), IsOk());
  const std::string link = storage::JobDir(local, kJob);
  ASSERT_EQ(::symlink(storage::JobDir(elsewhere, kJob).c_str(), link.c_str()), 0) << std::strerror(errno);

  LocalTierOptions options = Options(posix.get(), /*keep=*/1);
  options.dir = local;
  {
    LocalTier tier(options, &root_);
    // The shards go to the storage root directly: the tier writes nothing
    // through the link.
    for (uint64_t step : {5u, 6u}) ASSERT_THAT(Persist(tier, step).status(), IsOk()) << step;
    EXPECT_EQ(counters_.Get().writes, 0u);
    EXPECT_EQ(counters_.Get().fallbacks, 2u);
    EXPECT_TRUE(Exists(storage::ShardPath(kRoot, kJob, 6, 0)));
    EXPECT_THAT(tier.Steps(kJob), ElementsAre());
    tier.DropStepsAbove(kJob, 0);
  }
  EXPECT_TRUE(logger_.Contains(absl::StrCat(link, " is a symbolic link, not a directory; left alone")));
  for (uint64_t step : {1u, 2u}) {
    EXPECT_THAT(storage::ReadFileToString(posix.get(), storage::ShardPath(elsewhere, kJob, step, 0)),
                ::ckptd::testing::IsOkAndHolds(std::string("keep")))
        << step;
  }
  for (uint64_t step : {5u, 6u}) EXPECT_FALSE(posix->Stat(storage::StepDir(elsewhere, kJob, step)).ok()) << step;
}

}  // namespace
}  // namespace ckptd::agent
