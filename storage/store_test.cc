#include "storage/store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/status_macros.h"  // CKPTD_STATUS_CONCAT_, used by testing_matchers.h
#include "base/testing/fifo.h"
#include "base/testing/matchers.h"
#include "base/testing/temp_dir.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/fault_injection_file_system.h"
#include "storage/layout.h"
#include "storage/manifest.h"
#include "storage/mem_file_system.h"
#include "storage/posix_file_system.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"
#include "storage/testing_data.h"

namespace ckptd::storage {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::StatusIs;
using ::ckptd::testing::WithinOrReleaseFifo;
using ::ckptd::v1::ShardRef;
using ::ckptd::v1::StepManifest;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Optional;
using ::testing::UnorderedElementsAre;

constexpr char kJob[] = "job-a";
constexpr char kParams[] = "layer0.weight";
constexpr char kRng[] = "rng.state";
// 3000 floats = 12000 bytes: three blocks of 4096 bytes (the last one short).
constexpr size_t kParamCount = 3000;
constexpr size_t kRngBytes = 100;

using ::ckptd::testing::OneThread;
using ::ckptd::testing::RankData;
using ::ckptd::testing::SmallBlocks;

RankData MakeRankData(uint64_t step, uint32_t rank) {
  return ::ckptd::testing::MakeRankData(step, rank, kParamCount, kRngBytes);
}
std::vector<TensorSource> Sources(const RankData& d) { return ::ckptd::testing::RankSources(d, kParams, kRng); }

std::vector<uint64_t> StepNumbers(const std::vector<StepInfo>& steps) {
  std::vector<uint64_t> out;
  for (const StepInfo& s : steps) out.push_back(s.step);
  return out;
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CKPTD_ASSERT_OK(mem_.CreateDir("/root"));
    CKPTD_ASSERT_OK(mem_.SyncDir("/"));
  }

  // Prepares `step` and writes the shards of `ranks` (of a world of `world`).
  absl::StatusOr<std::vector<ShardWriteResult>> WriteRanks(uint64_t step, uint32_t world,
                                                           const std::vector<uint32_t>& ranks,
                                                           const std::string& job = kJob) {
    CKPTD_RETURN_IF_ERROR(store_.PrepareStep(job, step));
    std::vector<ShardWriteResult> results;
    for (uint32_t rank : ranks) {
      const RankData data = MakeRankData(step, rank);
      const std::vector<TensorSource> sources = Sources(data);
      CKPTD_ASSIGN_OR_RETURN(ShardWriteResult r,
                             store_.WriteShard(job, step, rank, world, sources, SmallBlocks(), &pool_));
      results.push_back(std::move(r));
    }
    return results;
  }

  absl::StatusOr<std::vector<ShardWriteResult>> WriteAll(uint64_t step, uint32_t world,
                                                         const std::string& job = kJob) {
    std::vector<uint32_t> ranks;
    for (uint32_t r = 0; r < world; ++r) ranks.push_back(r);
    return WriteRanks(step, world, ranks, job);
  }

  // Writes every rank of `step` and commits it.
  void Commit(uint64_t step, uint32_t world = 2, const std::string& job = kJob) {
    CKPTD_ASSERT_OK(WriteAll(step, world, job).status());
    CKPTD_ASSERT_OK(store_.CommitStep(job, step, world).status());
  }

  // Reads rank `rank` of `step` back and compares it with what was written.
  void ExpectShardData(uint64_t step, uint32_t rank) {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader,
                               ShardReader::Open(&mem_, ShardPath("/root", kJob, step, rank), OneThread()));
    const RankData want = MakeRankData(step, rank);
    std::vector<float> params(kParamCount, -1.0f);
    std::string rng(kRngBytes, '\0');
    const TensorDest dests[] = {{kParams, params.data(), params.size() * sizeof(float)},
                                {kRng, rng.data(), rng.size()}};
    CKPTD_ASSERT_OK(reader->ReadTensors(dests));
    EXPECT_EQ(0, std::memcmp(params.data(), want.params.data(), params.size() * sizeof(float)));
    EXPECT_EQ(rng, want.rng);
  }

  std::string ReadFile(const std::string& path) {
    absl::StatusOr<std::string> s = ReadFileToString(&mem_, path);
    EXPECT_THAT(s.status(), IsOk());
    return s.ok() ? *s : std::string();
  }

  // Flips one byte of `path` (durably, as corruption on disk would be).
  void FlipByte(const std::string& path, uint64_t offset) {
    std::string bytes = ReadFile(path);
    ASSERT_LT(offset, bytes.size());
    bytes[offset] = static_cast<char>(bytes[offset] ^ 0x5a);
    CKPTD_ASSERT_OK(mem_.SetFileContents(path, bytes));
  }

  bool Exists(const std::string& path) { return mem_.Stat(path).ok(); }

  MemFileSystem mem_;
  base::ThreadPool pool_{1};
  CheckpointStore store_{&mem_, "/root"};
};

TEST_F(StoreTest, CommitListsEveryShard) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<ShardWriteResult> written, WriteAll(5, 3));
  ASSERT_EQ(written.size(), 3u);
  EXPECT_FALSE(Exists(ManifestPath("/root", kJob, 5)));
  CKPTD_ASSERT_OK_AND_ASSIGN(StepManifest m, store_.CommitStep(kJob, 5, 3));
  EXPECT_EQ(m.format_version(), kManifestFormatVersion);
  EXPECT_EQ(m.job(), kJob);
  EXPECT_EQ(m.step(), 5u);
  EXPECT_EQ(m.world_size(), 3u);
  EXPECT_GT(m.committed_unix_nanos(), 0);
  ASSERT_EQ(m.shards_size(), 3);
  for (uint32_t r = 0; r < 3; ++r) {
    const ShardRef& ref = m.shards(r);
    EXPECT_EQ(ref.rank(), r);
    EXPECT_EQ(ref.file(), ShardFileName(r));
    EXPECT_EQ(ref.file_length(), written[r].file_length);
    EXPECT_EQ(ref.index_xxh3(), written[r].index_xxh3);
    EXPECT_EQ(ref.raw_bytes(), written[r].raw_bytes);
    EXPECT_EQ(ref.raw_bytes(), kParamCount * sizeof(float) + kRngBytes);
    EXPECT_EQ(ref.stored_bytes(), written[r].stored_bytes);
    EXPECT_EQ(written[r].path, ShardPath("/root", kJob, 5, r));
    EXPECT_EQ(mem_.Stat(written[r].path)->size, written[r].file_length);
  }
  // The MANIFEST on disk says the same; no temp file is left behind.
  CKPTD_ASSERT_OK_AND_ASSIGN(StepManifest read, store_.ReadManifest(kJob, 5));
  EXPECT_EQ(read.SerializeAsString(), m.SerializeAsString());
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FileInfo> files, mem_.ListDir(StepDir("/root", kJob, 5)));
  EXPECT_THAT(files, ElementsAre(Field(&FileInfo::name, "MANIFEST"), Field(&FileInfo::name, "rank-0.shard"),
                                 Field(&FileInfo::name, "rank-1.shard"), Field(&FileInfo::name, "rank-2.shard")));
  for (uint32_t r = 0; r < 3; ++r) ExpectShardData(5, r);
}

TEST_F(StoreTest, TheManifestIsStampedWithTheStoresClock) {
  base::FakeClock clock;
  CheckpointStore store(&mem_, "/root", &clock);
  CKPTD_ASSERT_OK(WriteAll(5, 2).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(StepManifest m, store.CommitStep(kJob, 5, 2));
  EXPECT_EQ(m.committed_unix_nanos(), absl::ToUnixNanos(clock.Now()));
  CKPTD_ASSERT_OK_AND_ASSIGN(StepManifest read, store_.ReadManifest(kJob, 5));
  EXPECT_EQ(read.committed_unix_nanos(), m.committed_unix_nanos());
}

TEST_F(StoreTest, CommittedStepSurvivesACrash) {
  Commit(1, 3);
  mem_.Crash();
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, store_.ListSteps(kJob));
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].state, StepState::kCommitted);
  CKPTD_ASSERT_OK_AND_ASSIGN(StepVerifyReport report, store_.VerifyStep(kJob, 1, OneThread()));
  EXPECT_THAT(report.problems, IsEmpty());
  for (uint32_t r = 0; r < 3; ++r) ExpectShardData(1, r);
}

TEST_F(StoreTest, ListStepsReportsStates) {
  Commit(1);
  CKPTD_ASSERT_OK(WriteRanks(2, 2, {0}).status());  // incomplete: no MANIFEST
  Commit(3);
  CKPTD_ASSERT_OK(mem_.SetFileContents(ManifestPath("/root", kJob, 3), "this is not a manifest"));
  CKPTD_ASSERT_OK(store_.PrepareStep(kJob, 4));  // incomplete: empty
  // Another step's MANIFEST planted in step 5: corrupt, not committed as step 1.
  Commit(5);
  CKPTD_ASSERT_OK(mem_.SetFileContents(ManifestPath("/root", kJob, 5), ReadFile(ManifestPath("/root", kJob, 1))));
  // Names that are not steps are ignored.
  CKPTD_ASSERT_OK(mem_.CreateDir("/root/job-a/step-01"));
  CKPTD_ASSERT_OK(mem_.CreateDir("/root/job-a/other"));
  // A step's name on a file: corrupt (reported, kept), not a step to read.
  CKPTD_ASSERT_OK(mem_.SetFileContents("/root/job-a/step-9", "a file, not a directory"));

  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, store_.ListSteps(kJob));
  ASSERT_EQ(StepNumbers(steps), (std::vector<uint64_t>{1, 2, 3, 4, 5, 9}));
  EXPECT_EQ(steps[5].state, StepState::kCorrupt);
  EXPECT_THAT(steps[5].detail, HasSubstr("/root/job-a/step-9 is a regular file, not a directory"));
  EXPECT_EQ(steps[0].state, StepState::kCommitted);
  ASSERT_TRUE(steps[0].manifest.has_value());
  EXPECT_EQ(steps[0].manifest->step(), 1u);
  EXPECT_EQ(steps[0].manifest->shards_size(), 2);
  EXPECT_EQ(steps[1].state, StepState::kIncomplete);
  EXPECT_FALSE(steps[1].manifest.has_value());
  EXPECT_EQ(steps[2].state, StepState::kCorrupt);
  EXPECT_FALSE(steps[2].manifest.has_value());
  EXPECT_THAT(steps[2].detail, HasSubstr(ManifestPath("/root", kJob, 3)));
  EXPECT_EQ(steps[3].state, StepState::kIncomplete);
  EXPECT_EQ(steps[4].state, StepState::kCorrupt);
  EXPECT_THAT(steps[4].detail, HasSubstr("manifest is for job job-a step 1"));

  EXPECT_EQ(StepStateName(StepState::kCommitted), "committed");
  EXPECT_EQ(StepStateName(StepState::kIncomplete), "incomplete");
  EXPECT_EQ(StepStateName(StepState::kCorrupt), "corrupt");

  EXPECT_THAT(store_.ReadManifest(kJob, 3), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("MANIFEST")));
  EXPECT_THAT(store_.ReadManifest(kJob, 5),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("manifest is for job job-a step 1")));
  EXPECT_THAT(store_.ReadManifest(kJob, 2), StatusIs(absl::StatusCode::kNotFound, HasSubstr("step-2/MANIFEST")));
}

TEST_F(StoreTest, LatestCommittedStepIgnoresIncompleteAndCorrupt) {
  EXPECT_THAT(store_.LatestCommittedStep(kJob), IsOkAndHolds(std::nullopt));  // no job directory
  EXPECT_THAT(store_.ListSteps(kJob), StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-a")));
  CKPTD_ASSERT_OK(store_.PrepareStep(kJob, 1));
  EXPECT_THAT(store_.LatestCommittedStep(kJob), IsOkAndHolds(std::nullopt));
  Commit(2);
  Commit(3);
  CKPTD_ASSERT_OK(mem_.SetFileContents(ManifestPath("/root", kJob, 3), std::string(64, '\xee')));
  CKPTD_ASSERT_OK(WriteRanks(4, 2, {0, 1}).status());  // all shards, never committed
  CKPTD_ASSERT_OK(store_.PrepareStep(kJob, 10));
  EXPECT_THAT(store_.LatestCommittedStep(kJob), IsOkAndHolds(Optional(uint64_t{2})));
  CKPTD_ASSERT_OK(store_.CommitStep(kJob, 4, 2).status());
  EXPECT_THAT(store_.LatestCommittedStep(kJob), IsOkAndHolds(Optional(uint64_t{4})));
}

TEST_F(StoreTest, CommitWithAMissingRankFailsAndWritesNoManifest) {
  CKPTD_ASSERT_OK(WriteRanks(7, 3, {0, 2}).status());
  EXPECT_THAT(store_.CommitStep(kJob, 7, 3),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("commit job-a step 7"), HasSubstr("rank 1 has no durable shard"))));
  EXPECT_FALSE(Exists(ManifestPath("/root", kJob, 7)));
  EXPECT_FALSE(Exists(ManifestPath("/root", kJob, 7) + ".tmp"));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, store_.ListSteps(kJob));
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].state, StepState::kIncomplete);
}

TEST_F(StoreTest, CommitOfAStepThatWasNeverPreparedFails) {
  EXPECT_THAT(store_.CommitStep(kJob, 1, 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 0 has no durable shard")));
  EXPECT_THAT(store_.CommitStep(kJob, 1, 0), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world size is 0")));
}

TEST_F(StoreTest, CommitWithALeftoverTempShardOnlyFails) {
  CKPTD_ASSERT_OK(WriteRanks(7, 2, {0, 1}).status());
  // Rank 1's shard exists only under its temp name: not durable, not committed.
  CKPTD_ASSERT_OK(mem_.Rename(ShardPath("/root", kJob, 7, 1), ShardPath("/root", kJob, 7, 1) + ".tmp"));
  EXPECT_THAT(store_.CommitStep(kJob, 7, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 1 has no durable shard")));
  EXPECT_FALSE(Exists(ManifestPath("/root", kJob, 7)));
}

TEST_F(StoreTest, CommitTwiceIsAlreadyExists) {
  Commit(3);
  const std::string before = ReadFile(ManifestPath("/root", kJob, 3));
  EXPECT_THAT(store_.CommitStep(kJob, 3, 2),
              StatusIs(absl::StatusCode::kAlreadyExists, AllOf(HasSubstr("step 3"), HasSubstr("already committed"))));
  EXPECT_EQ(ReadFile(ManifestPath("/root", kJob, 3)), before);
}

TEST_F(StoreTest, CommitChecksReportedRefs) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<ShardWriteResult> written, WriteAll(4, 3));
  auto refs_of = [&] {
    std::vector<ShardRef> refs;
    for (uint32_t r = 0; r < 3; ++r) {
      ShardRef ref;
      ref.set_rank(r);
      ref.set_file_length(written[r].file_length);
      ref.set_index_xxh3(written[r].index_xxh3);
      ref.set_persist_seconds(0.5 + r);
      refs.push_back(ref);
    }
    return refs;
  };

  std::vector<ShardRef> wrong_digest = refs_of();
  wrong_digest[1].set_index_xxh3(written[1].index_xxh3 ^ 1);
  EXPECT_THAT(store_.CommitStep(kJob, 4, 3, &wrong_digest),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 1 reported digest")));
  EXPECT_FALSE(Exists(ManifestPath("/root", kJob, 4)));

  std::vector<ShardRef> wrong_length = refs_of();
  wrong_length[2].set_file_length(written[2].file_length + 4096);
  EXPECT_THAT(store_.CommitStep(kJob, 4, 3, &wrong_length),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("rank 2 reported"), HasSubstr(absl::StrCat(written[2].file_length + 4096)))));

  std::vector<ShardRef> too_few = refs_of();
  too_few.pop_back();
  EXPECT_THAT(store_.CommitStep(kJob, 4, 3, &too_few),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("2 shards reported for a world of 3")));

  std::vector<ShardRef> duplicate_rank = refs_of();
  duplicate_rank[2] = duplicate_rank[0];
  EXPECT_THAT(store_.CommitStep(kJob, 4, 3, &duplicate_rank),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 0 reported twice")));
  EXPECT_FALSE(Exists(ManifestPath("/root", kJob, 4)));

  std::vector<ShardRef> reversed = refs_of();  // order does not matter
  std::reverse(reversed.begin(), reversed.end());
  CKPTD_ASSERT_OK_AND_ASSIGN(StepManifest m, store_.CommitStep(kJob, 4, 3, &reversed));
  ASSERT_EQ(m.shards_size(), 3);
  for (uint32_t r = 0; r < 3; ++r) {
    EXPECT_EQ(m.shards(r).rank(), r);
    EXPECT_DOUBLE_EQ(m.shards(r).persist_seconds(), 0.5 + r);
  }
}

TEST_F(StoreTest, StatOnlyCommitTrustsReportedDigestsButChecksEachFile) {
  using Check = CheckpointStore::CommitCheck;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<ShardWriteResult> written, WriteAll(5, 2));
  std::vector<ShardRef> refs;
  for (uint32_t r = 0; r < 2; ++r) {
    ShardRef ref;
    ref.set_rank(r);
    ref.set_file_length(written[r].file_length);
    ref.set_index_xxh3(written[r].index_xxh3);
    ref.set_raw_bytes(1000 + r);
    refs.push_back(ref);
  }
  EXPECT_THAT(store_.CommitStep(kJob, 5, 2, nullptr, Check::kStatOnly),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs the reported shards")));
  std::vector<ShardRef> wrong_length = refs;
  wrong_length[1].set_file_length(written[1].file_length - 1);
  EXPECT_THAT(store_.CommitStep(kJob, 5, 2, &wrong_length, Check::kStatOnly),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 1 reported")));
  std::vector<ShardRef> missing_rank = refs;
  missing_rank[1].set_rank(0);
  EXPECT_THAT(store_.CommitStep(kJob, 5, 2, &missing_rank, Check::kStatOnly),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 0 reported twice")));
  std::vector<ShardRef> outside = refs;
  outside[1].set_rank(2);
  EXPECT_THAT(store_.CommitStep(kJob, 5, 2, &outside, Check::kStatOnly),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 2 outside the world of 2")));
  CKPTD_ASSERT_OK(mem_.RemoveFile(ShardPath("/root", kJob, 5, 0)));
  EXPECT_THAT(store_.CommitStep(kJob, 5, 2, &refs, Check::kStatOnly),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 0 has no durable shard")));
  EXPECT_FALSE(Exists(ManifestPath("/root", kJob, 5)));

  CKPTD_ASSERT_OK(WriteAll(6, 2).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<ShardWriteResult> again, WriteAll(7, 2));
  for (uint32_t r = 0; r < 2; ++r) {
    refs[r].set_file_length(again[r].file_length);
    refs[r].set_index_xxh3(again[r].index_xxh3);
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(StepManifest m, store_.CommitStep(kJob, 7, 2, &refs, Check::kStatOnly));
  ASSERT_EQ(m.shards_size(), 2);
  EXPECT_EQ(m.shards(1).raw_bytes(), 1001u);
  EXPECT_EQ(m.shards(1).index_xxh3(), again[1].index_xxh3);
  CKPTD_ASSERT_OK_AND_ASSIGN(StepVerifyReport report, store_.VerifyStep(kJob, 7));
  EXPECT_TRUE(report.ok());
}

TEST_F(StoreTest, CheckReportedShardNamesTheRankAndACommitCheckedByTheCallerReadsNothing) {
  using Check = CheckpointStore::CommitCheck;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<ShardWriteResult> written, WriteAll(5, 2));
  std::vector<ShardRef> refs;
  for (uint32_t r = 0; r < 2; ++r) {
    ShardRef ref;
    ref.set_rank(r);
    ref.set_file_length(written[r].file_length);
    ref.set_index_xxh3(written[r].index_xxh3);
    refs.push_back(ref);
  }
  CKPTD_EXPECT_OK(store_.CheckReportedShard(kJob, 5, refs[1]));
  ShardRef longer = refs[1];
  longer.set_file_length(refs[1].file_length() + 1);
  EXPECT_THAT(store_.CheckReportedShard(kJob, 5, longer),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 1 reported")));
  EXPECT_THAT(store_.CheckReportedShard(kJob, 6, refs[0]),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 0 has no durable shard")));
  EXPECT_THAT(store_.CheckReportedShard("../etc", 5, refs[0]), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name")));
  EXPECT_THAT(store_.CommitStep(kJob, 5, 2, nullptr, Check::kCheckedByCaller),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs the reported shards")));
  // The caller vouched for the files: the commit writes the MANIFEST from the
  // reports alone, and the step then verifies.
  CKPTD_ASSERT_OK_AND_ASSIGN(StepManifest m, store_.CommitStep(kJob, 5, 2, &refs, Check::kCheckedByCaller));
  ASSERT_EQ(m.shards_size(), 2);
  EXPECT_EQ(m.shards(1).index_xxh3(), written[1].index_xxh3);
  EXPECT_EQ(m.shards(1).file(), ShardFileName(1));
  CKPTD_ASSERT_OK_AND_ASSIGN(StepVerifyReport report, store_.VerifyStep(kJob, 5));
  EXPECT_TRUE(report.ok());
}

TEST_F(StoreTest, AFreshStartIsAllowedOnlyOverCommittedStepsThatAreAllDamaged) {
  EXPECT_THAT(store_.AllowFreshStart(kJob, "op"), StatusIs(absl::StatusCode::kNotFound, HasSubstr(kJob)));
  CKPTD_ASSERT_OK(WriteAll(1, 2).status());
  EXPECT_THAT(store_.AllowFreshStart(kJob, "op"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no committed step")));
  for (uint64_t step : {2u, 3u}) {
    CKPTD_ASSERT_OK(WriteAll(step, 2).status());
    CKPTD_ASSERT_OK(store_.CommitStep(kJob, step, 2).status());
  }
  CKPTD_ASSERT_OK(store_.QuarantineStep(kJob, 3, "chunk 2 checksum mismatch"));
  EXPECT_THAT(store_.AllowFreshStart(kJob, "op"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("step 2 is committed and not quarantined")));
  EXPECT_THAT(store_.FreshStartAllowedOver(kJob), IsOkAndHolds(std::nullopt));
  CKPTD_ASSERT_OK(store_.QuarantineStep(kJob, 2, "shard missing"));
  EXPECT_THAT(store_.AllowFreshStart(kJob, "alice: the data set changed"), IsOkAndHolds(3u));
  // Durable, and not a step: listing and retention pass it by.
  mem_.Crash();
  EXPECT_THAT(store_.FreshStartAllowedOver(kJob), IsOkAndHolds(Optional(3u)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, store_.ListSteps(kJob));
  EXPECT_EQ(steps.size(), 3u);  // 1 (incomplete), 2 and 3
  CKPTD_ASSERT_OK(mem_.SetFileContents(FreshStartPath("/root", kJob), "three\n"));
  EXPECT_THAT(store_.FreshStartAllowedOver(kJob),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("does not start with a step number")));
}

TEST_F(StoreTest, QuarantinedStepIsListedKeptByRetentionAndNotTheLatest) {
  for (uint64_t step : {1u, 2u, 3u}) {
    CKPTD_ASSERT_OK(WriteAll(step, 2).status());
    CKPTD_ASSERT_OK(store_.CommitStep(kJob, step, 2).status());
  }
  CKPTD_ASSERT_OK(WriteAll(4, 2).status());
  EXPECT_THAT(store_.QuarantineStep(kJob, 4, "x"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not committed")));
  CKPTD_ASSERT_OK(store_.QuarantineStep(kJob, 3, "rank 1: chunk 2 checksum mismatch"));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, store_.ListSteps(kJob));
  ASSERT_EQ(steps.size(), 4u);
  EXPECT_EQ(steps[2].step, 3u);
  EXPECT_THAT(steps[2].quarantined, Optional(HasSubstr("checksum mismatch")));
  EXPECT_EQ(steps[1].quarantined, std::nullopt);
  EXPECT_THAT(store_.LatestCommittedStep(kJob), IsOkAndHolds(Optional(2u)));
  // Retention counts usable steps only, and keeps the quarantined one.
  EXPECT_THAT(store_.ApplyRetention(kJob, 1), IsOkAndHolds(ElementsAre(1u)));
  EXPECT_TRUE(Exists(ManifestPath("/root", kJob, 2)));
  EXPECT_TRUE(Exists(ManifestPath("/root", kJob, 3)));
  // The mark survives a crash once written.
  mem_.Crash();
  CKPTD_ASSERT_OK_AND_ASSIGN(steps, store_.ListSteps(kJob));
  ASSERT_GE(steps.size(), 2u);
  EXPECT_TRUE(steps[1].quarantined.has_value());
}

TEST_F(StoreTest, CommitRejectsAShardOfAnotherRankOrStep) {
  CKPTD_ASSERT_OK(WriteAll(6, 2).status());
  const std::string rank1 = ShardPath("/root", kJob, 6, 1);
  const std::string rank1_bytes = ReadFile(rank1);
  CKPTD_ASSERT_OK(mem_.SetFileContents(rank1, ReadFile(ShardPath("/root", kJob, 6, 0))));
  EXPECT_THAT(store_.CommitStep(kJob, 6, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(rank1), HasSubstr("belongs to job job-a step 6 rank 0 of 2"))));
  EXPECT_FALSE(Exists(ManifestPath("/root", kJob, 6)));

  // A shard of another step.
  CKPTD_ASSERT_OK(WriteAll(8, 2).status());
  CKPTD_ASSERT_OK(mem_.SetFileContents(rank1, ReadFile(ShardPath("/root", kJob, 8, 1))));
  EXPECT_THAT(store_.CommitStep(kJob, 6, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("belongs to job job-a step 8 rank 1")));

  // A shard written for a different world size.
  CKPTD_ASSERT_OK(mem_.SetFileContents(rank1, rank1_bytes));
  CKPTD_ASSERT_OK(WriteAll(9, 3).status());
  EXPECT_THAT(store_.CommitStep(kJob, 9, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("step 9 rank 0 of 3")));

  // A shard of another job.
  CKPTD_ASSERT_OK(WriteAll(6, 2, "job-b").status());
  CKPTD_ASSERT_OK(mem_.SetFileContents(rank1, ReadFile(ShardPath("/root", "job-b", 6, 1))));
  EXPECT_THAT(store_.CommitStep(kJob, 6, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("belongs to job job-b step 6 rank 1")));

  CKPTD_ASSERT_OK(mem_.SetFileContents(rank1, rank1_bytes));
  CKPTD_EXPECT_OK(store_.CommitStep(kJob, 6, 2).status());
}

TEST_F(StoreTest, CommitRejectsATruncatedShard) {
  CKPTD_ASSERT_OK(WriteAll(2, 2).status());
  const std::string rank0 = ShardPath("/root", kJob, 2, 0);
  std::string bytes = ReadFile(rank0);
  bytes.resize(bytes.size() - 4096);
  CKPTD_ASSERT_OK(mem_.SetFileContents(rank0, bytes));
  EXPECT_THAT(store_.CommitStep(kJob, 2, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, AllOf(HasSubstr("rank 0"), HasSubstr(rank0))));
  EXPECT_FALSE(Exists(ManifestPath("/root", kJob, 2)));
}

TEST_F(StoreTest, WriteShardRejectsARankOutsideTheWorld) {
  CKPTD_ASSERT_OK(store_.PrepareStep(kJob, 1));
  const RankData data = MakeRankData(1, 0);
  const std::vector<TensorSource> sources = Sources(data);
  EXPECT_THAT(store_.WriteShard(kJob, 1, 2, 2, sources, SmallBlocks(), &pool_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 2 is not inside world size 2")));
  EXPECT_THAT(store_.WriteShard(kJob, 1, 0, 0, sources, SmallBlocks(), &pool_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world size 0")));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FileInfo> files, mem_.ListDir(StepDir("/root", kJob, 1)));
  EXPECT_THAT(files, IsEmpty());
}

TEST(RetentionDropsTest, KeepsTheNewestAndDropsOlderOnesOldestFirst) {
  EXPECT_THAT(RetentionDrops({1, 2, 3, 4, 5}, 2), ElementsAre(1u, 2u, 3u));
  EXPECT_THAT(RetentionDrops({1, 2, 3}, 3), IsEmpty());
  EXPECT_THAT(RetentionDrops({}, 2), IsEmpty());
  // keep_last 0 or less still keeps the newest step.
  EXPECT_THAT(RetentionDrops({7, 9}, 0), ElementsAre(7u));
  EXPECT_THAT(RetentionDrops({7, 9}, -3), ElementsAre(7u));
}

TEST(RetentionDropsTest, PinnedStepsStayWithoutCountingAsKept) {
  auto pin_two = [](uint64_t step) { return step == 2; };
  EXPECT_THAT(RetentionDrops({1, 2, 3, 4}, 1, pin_two), ElementsAre(1u, 3u));
  EXPECT_THAT(RetentionDrops({2, 3}, 1, pin_two), IsEmpty());
  // A pinned step among the newest counts as kept.
  EXPECT_THAT(RetentionDrops({1, 2, 3}, 2, pin_two), ElementsAre(1u));
}

TEST_F(StoreTest, ApplyRetentionKeepsTheNewestCommitted) {
  for (uint64_t s = 1; s <= 5; ++s) Commit(s);
  EXPECT_THAT(store_.ApplyRetention(kJob, 2), IsOkAndHolds(ElementsAre(1u, 2u, 3u)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, store_.ListSteps(kJob));
  EXPECT_EQ(StepNumbers(steps), (std::vector<uint64_t>{4, 5}));
  EXPECT_FALSE(Exists(StepDir("/root", kJob, 1)));
  EXPECT_THAT(store_.ApplyRetention(kJob, 2), IsOkAndHolds(IsEmpty()));
  // keep_last 0 (or less) still keeps the newest committed step.
  EXPECT_THAT(store_.ApplyRetention(kJob, 0), IsOkAndHolds(ElementsAre(4u)));
  EXPECT_THAT(store_.ApplyRetention(kJob, -3), IsOkAndHolds(IsEmpty()));
  EXPECT_THAT(store_.LatestCommittedStep(kJob), IsOkAndHolds(Optional(uint64_t{5})));
  CKPTD_ASSERT_OK_AND_ASSIGN(StepVerifyReport report, store_.VerifyStep(kJob, 5, OneThread()));
  EXPECT_TRUE(report.ok());
  ExpectShardData(5, 0);
  ExpectShardData(5, 1);
  // The removals are durable.
  mem_.Crash();
  CKPTD_ASSERT_OK_AND_ASSIGN(steps, store_.ListSteps(kJob));
  EXPECT_EQ(StepNumbers(steps), (std::vector<uint64_t>{5}));
}

TEST_F(StoreTest, ApplyRetentionIgnoresIncompleteSteps) {
  Commit(1);
  CKPTD_ASSERT_OK(WriteRanks(2, 2, {0}).status());  // older incomplete
  Commit(3);
  CKPTD_ASSERT_OK(WriteRanks(4, 2, {1}).status());  // newer incomplete (being written)
  // Incomplete steps neither count towards keep_last nor get removed.
  EXPECT_THAT(store_.ApplyRetention(kJob, 2), IsOkAndHolds(IsEmpty()));
  EXPECT_THAT(store_.ApplyRetention(kJob, 1), IsOkAndHolds(ElementsAre(1u)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, store_.ListSteps(kJob));
  EXPECT_EQ(StepNumbers(steps), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(steps[0].state, StepState::kIncomplete);
  EXPECT_EQ(steps[1].state, StepState::kCommitted);
  EXPECT_EQ(steps[2].state, StepState::kIncomplete);
  EXPECT_TRUE(Exists(ShardPath("/root", kJob, 4, 1)));
  EXPECT_THAT(store_.ApplyRetention("no-such-job", 1), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no-such-job")));
}

TEST_F(StoreTest, PacedRemovalGoesInDurableBatchesAndAsksBeforeEach) {
  CKPTD_ASSERT_OK(WriteAll(4, 7).status());
  CKPTD_ASSERT_OK(store_.CommitStep(kJob, 4, 7).status());
  CheckpointStore::RemovePacing pacing;
  pacing.batch = 3;
  std::vector<size_t> left_at_each_batch;
  pacing.before_batch = [&] {
    absl::StatusOr<std::vector<FileInfo>> left = mem_.ListDir(StepDir("/root", kJob, 4));
    left_at_each_batch.push_back(left.ok() ? left->size() : 0);
  };
  CKPTD_ASSERT_OK(store_.RemoveStep(kJob, 4, &pacing));
  // 7 shards (the MANIFEST went first): batches of 3, 3 and 1.
  EXPECT_THAT(left_at_each_batch, ::testing::ElementsAre(7u, 4u, 1u));
  EXPECT_FALSE(Exists(StepDir("/root", kJob, 4)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, store_.ListSteps(kJob));
  EXPECT_TRUE(steps.empty());
  // A step that is already gone is no error.
  CKPTD_EXPECT_OK(store_.RemoveStep(kJob, 4, &pacing));
}

TEST_F(StoreTest, RemoveIncompleteStepsKeepsCommittedAndRecentOnes) {
  Commit(1);
  CKPTD_ASSERT_OK(WriteRanks(2, 2, {0}).status());  // incomplete
  CKPTD_ASSERT_OK(store_.PrepareStep(kJob, 3));    // incomplete, empty
  Commit(4);
  CKPTD_ASSERT_OK(mem_.SetFileContents(ShardPath("/root", kJob, 4, 0) + ".tmp", "stray"));
  CKPTD_ASSERT_OK(mem_.SetFileContents(ManifestPath("/root", kJob, 4) + ".tmp", "stray"));
  Commit(5);
  // A MANIFEST that does not decode may hold committed data: kept for an operator.
  CKPTD_ASSERT_OK(mem_.SetFileContents(ManifestPath("/root", kJob, 5), "garbage"));
  CKPTD_ASSERT_OK(WriteRanks(6, 2, {1}).status());  // incomplete, but not below the bound
  CKPTD_ASSERT_OK(mem_.SetFileContents(ShardPath("/root", kJob, 6, 0) + ".tmp", "being written"));

  EXPECT_THAT(store_.RemoveIncompleteSteps(kJob, 6), IsOkAndHolds(ElementsAre(2u, 3u)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, store_.ListSteps(kJob));
  EXPECT_EQ(StepNumbers(steps), (std::vector<uint64_t>{1, 4, 5, 6}));
  EXPECT_FALSE(Exists(StepDir("/root", kJob, 2)));
  EXPECT_FALSE(Exists(StepDir("/root", kJob, 3)));
  EXPECT_EQ(steps[2].state, StepState::kCorrupt);
  EXPECT_TRUE(Exists(ShardPath("/root", kJob, 5, 0)));
  EXPECT_TRUE(Exists(ShardPath("/root", kJob, 5, 1)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FileInfo> files, mem_.ListDir(StepDir("/root", kJob, 4)));
  EXPECT_THAT(files, ElementsAre(Field(&FileInfo::name, "MANIFEST"), Field(&FileInfo::name, "rank-0.shard"),
                                 Field(&FileInfo::name, "rank-1.shard")));
  // The step still being written (at or above the bound) is left alone, temp file included.
  EXPECT_TRUE(Exists(ShardPath("/root", kJob, 6, 0) + ".tmp"));
  EXPECT_TRUE(Exists(ShardPath("/root", kJob, 6, 1)));
  for (uint64_t s : {1u, 4u}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(StepVerifyReport report, store_.VerifyStep(kJob, s, OneThread()));
    EXPECT_THAT(report.problems, IsEmpty());
  }

  // Without a bound every incomplete step goes.
  EXPECT_THAT(store_.RemoveIncompleteSteps(kJob), IsOkAndHolds(ElementsAre(6u)));
  CKPTD_ASSERT_OK_AND_ASSIGN(steps, store_.ListSteps(kJob));
  EXPECT_EQ(StepNumbers(steps), (std::vector<uint64_t>{1, 4, 5}));
  EXPECT_THAT(store_.RemoveIncompleteSteps(kJob), IsOkAndHolds(IsEmpty()));
  // Removing the damaged step is a deliberate RemoveStep.
  CKPTD_ASSERT_OK(store_.RemoveStep(kJob, 5));
  CKPTD_ASSERT_OK_AND_ASSIGN(steps, store_.ListSteps(kJob));
  EXPECT_EQ(StepNumbers(steps), (std::vector<uint64_t>{1, 4}));
  // A job without a directory has nothing to remove.
  EXPECT_THAT(store_.RemoveIncompleteSteps("other-job"), IsOkAndHolds(IsEmpty()));
}

TEST_F(StoreTest, AnUnreadableManifestIsNeverCleanedUp) {
  Commit(1);
  Commit(2);
  Commit(3);
  FaultInjectionFileSystem fi(&mem_);
  CheckpointStore store(&fi, "/root");
  fi.FailPath("step-2/MANIFEST", Fault::kEio);
  // An I/O error is not proof that step 2 never committed.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, store.ListSteps(kJob));
  ASSERT_EQ(StepNumbers(steps), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_NE(steps[1].state, StepState::kCommitted);
  EXPECT_THAT(steps[1].detail, HasSubstr("step-2/MANIFEST"));
  EXPECT_THAT(store.RemoveIncompleteSteps(kJob), IsOkAndHolds(IsEmpty()));
  EXPECT_THAT(store.RemoveIncompleteSteps(kJob, 3), IsOkAndHolds(IsEmpty()));
  EXPECT_THAT(store.ApplyRetention(kJob, 2), IsOkAndHolds(IsEmpty()));
  fi.Reset();
  CKPTD_ASSERT_OK_AND_ASSIGN(StepVerifyReport report, store_.VerifyStep(kJob, 2, OneThread()));
  EXPECT_THAT(report.problems, IsEmpty());
  ExpectShardData(2, 0);
  ExpectShardData(2, 1);
}

// A shard that cannot be read for lack of resources (ENOSPC, EMFILE, ...) is
// not a missing or disagreeing shard: the caller may retry the commit.
TEST_F(StoreTest, CommitKeepsTheCodeOfAResourceErrorReadingAShard) {
  CKPTD_ASSERT_OK(WriteAll(4, 2).status());
  FaultInjectionFileSystem fi(&mem_);
  CheckpointStore store(&fi, "/root");
  fi.FailPath("step-4/rank-1.shard", Fault::kEnospc);
  EXPECT_THAT(store.CommitStep(kJob, 4, 2),
              StatusIs(absl::StatusCode::kResourceExhausted, AllOf(HasSubstr("rank-1.shard"), HasSubstr("errno 28"))));
  EXPECT_FALSE(Exists(ManifestPath("/root", kJob, 4)));
  fi.Reset();
  CKPTD_EXPECT_OK(store.CommitStep(kJob, 4, 2).status());
}

TEST_F(StoreTest, AbortStep) {
  Commit(1);
  EXPECT_THAT(store_.AbortStep(kJob, 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, AllOf(HasSubstr("step 1"), HasSubstr("committed"))));
  EXPECT_TRUE(Exists(ManifestPath("/root", kJob, 1)));
  CKPTD_ASSERT_OK(WriteRanks(2, 2, {0}).status());
  CKPTD_ASSERT_OK(store_.AbortStep(kJob, 2));
  EXPECT_FALSE(Exists(StepDir("/root", kJob, 2)));
  CKPTD_EXPECT_OK(store_.AbortStep(kJob, 3));  // absent: nothing to do
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, store_.ListSteps(kJob));
  EXPECT_EQ(StepNumbers(steps), (std::vector<uint64_t>{1}));
  // RemoveStep removes committed steps on purpose.
  CKPTD_ASSERT_OK(store_.RemoveStep(kJob, 1));
  EXPECT_FALSE(Exists(StepDir("/root", kJob, 1)));
}

TEST_F(StoreTest, VerifyIntactStep) {
  Commit(1, 3);
  CKPTD_ASSERT_OK_AND_ASSIGN(StepVerifyReport report, store_.VerifyStep(kJob, 1, OneThread()));
  EXPECT_TRUE(report.ok());
  EXPECT_THAT(report.problems, IsEmpty());
  EXPECT_EQ(report.job, kJob);
  EXPECT_EQ(report.step, 1u);
  EXPECT_EQ(report.shards, 3);
  EXPECT_EQ(report.raw_bytes, 3 * (kParamCount * sizeof(float) + kRngBytes));
  EXPECT_GT(report.stored_bytes, 0u);
}

TEST_F(StoreTest, VerifyFindsAFlippedByteInAChunk) {
  Commit(1, 3);
  const std::string rank1 = ShardPath("/root", kJob, 1, 1);
  uint64_t offset = 0;
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, ShardReader::Open(&mem_, rank1, OneThread()));
    const ckptd::v1::Tensor* t = reader->FindTensor(kParams);
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->blocks_size(), 3);
    ASSERT_GE(t->blocks(1).chunks_size(), 1);
    const ckptd::v1::Chunk& c = t->blocks(1).chunks(0);
    ASSERT_GT(c.stored_length(), 2u);
    offset = c.file_offset() + c.stored_length() / 2;
  }
  FlipByte(rank1, offset);

  CKPTD_ASSERT_OK_AND_ASSIGN(StepVerifyReport report, store_.VerifyStep(kJob, 1, OneThread()));
  EXPECT_FALSE(report.ok());
  ASSERT_EQ(report.problems.size(), 1u);
  const VerifyProblem& p = report.problems[0];
  EXPECT_EQ(p.file, rank1);
  EXPECT_EQ(p.tensor, kParams);
  EXPECT_EQ(p.block, 1);
  EXPECT_EQ(p.chunk, 0);
  EXPECT_THAT(p.message, AllOf(HasSubstr(rank1), HasSubstr(kParams), HasSubstr("block 1"), HasSubstr("chunk 0")));
  // The other ranks are still counted.
  EXPECT_EQ(report.shards, 3);
}

TEST_F(StoreTest, VerifyFindsAMissingShard) {
  Commit(1, 3);
  const std::string rank2 = ShardPath("/root", kJob, 1, 2);
  CKPTD_ASSERT_OK(mem_.RemoveFile(rank2));
  CKPTD_ASSERT_OK_AND_ASSIGN(StepVerifyReport report, store_.VerifyStep(kJob, 1, OneThread()));
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_EQ(report.problems[0].file, rank2);
  EXPECT_EQ(report.problems[0].tensor, "");
  EXPECT_THAT(report.problems[0].message, HasSubstr(rank2));
}

TEST_F(StoreTest, VerifyFindsAShardReplacedByAnotherValidOne) {
  Commit(1, 2);
  Commit(2, 2);
  const std::string rank0 = ShardPath("/root", kJob, 1, 0);
  // A well-formed shard, but not the one the manifest names.
  CKPTD_ASSERT_OK(mem_.SetFileContents(rank0, ReadFile(ShardPath("/root", kJob, 2, 0))));
  CKPTD_ASSERT_OK_AND_ASSIGN(StepVerifyReport report, store_.VerifyStep(kJob, 1, OneThread()));
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_EQ(report.problems[0].file, rank0);
  EXPECT_THAT(report.problems[0].message, HasSubstr("differ from the manifest"));
}

TEST_F(StoreTest, VerifyOfAStepThatIsNotCommitted) {
  CKPTD_ASSERT_OK(WriteAll(1, 2).status());
  EXPECT_THAT(store_.VerifyStep(kJob, 1, OneThread()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(ManifestPath("/root", kJob, 1))));
  CKPTD_ASSERT_OK(mem_.SetFileContents(ManifestPath("/root", kJob, 1), "junk"));
  EXPECT_THAT(store_.VerifyStep(kJob, 1, OneThread()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(ManifestPath("/root", kJob, 1))));
}

TEST_F(StoreTest, HostileJobNamesAreRejectedEverywhere) {
  Commit(1);
  const RankData data = MakeRankData(1, 0);
  const std::vector<TensorSource> sources = Sources(data);
  for (const std::string& job : {std::string(""), std::string("."), std::string(".."), std::string("../x"),
                                 std::string("a/b"), std::string("/abs"), std::string("-rf"),
                                 std::string("job-a/../job-a"), std::string("a\nb"), std::string("a\0b", 3),
                                 std::string(129, 'x')}) {
    SCOPED_TRACE(absl::StrCat("job of ", job.size(), " bytes"));
    const auto invalid = StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name"));
    EXPECT_THAT(store_.PrepareStep(job, 1), invalid);
    EXPECT_THAT(store_.WriteShard(job, 1, 0, 2, sources, SmallBlocks(), &pool_), invalid);
    EXPECT_THAT(store_.CommitStep(job, 1, 2), invalid);
    EXPECT_THAT(store_.ListSteps(job), invalid);
    EXPECT_THAT(store_.LatestCommittedStep(job), invalid);
    EXPECT_THAT(store_.ReadManifest(job, 1), invalid);
    EXPECT_THAT(store_.RemoveStep(job, 1), invalid);
    EXPECT_THAT(store_.AbortStep(job, 1), invalid);
    EXPECT_THAT(store_.RemoveIncompleteSteps(job), invalid);
    EXPECT_THAT(store_.ApplyRetention(job, 1), invalid);
    EXPECT_THAT(store_.VerifyStep(job, 1, OneThread()), invalid);
  }
  // Nothing was created or removed outside the job.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FileInfo> root, mem_.ListDir("/root"));
  EXPECT_THAT(root, ElementsAre(Field(&FileInfo::name, kJob)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FileInfo> top, mem_.ListDir("/"));
  EXPECT_THAT(top, ElementsAre(Field(&FileInfo::name, "root")));
  EXPECT_THAT(store_.LatestCommittedStep(kJob), IsOkAndHolds(Optional(uint64_t{1})));
}

TEST_F(StoreTest, ListJobsSkipsInvalidNames) {
  EXPECT_THAT(store_.ListJobs(), IsOkAndHolds(IsEmpty()));
  Commit(1, 1, "alpha");
  CKPTD_ASSERT_OK(store_.PrepareStep("beta.2", 1));
  CKPTD_ASSERT_OK(mem_.CreateDir("/root/.hidden"));
  CKPTD_ASSERT_OK(mem_.CreateDir("/root/-rf"));
  CKPTD_ASSERT_OK(mem_.CreateDir("/root/has space"));
  CKPTD_ASSERT_OK(mem_.CreateDir("/root/caf\xc3\xa9"));
  CKPTD_ASSERT_OK(mem_.CreateDir(absl::StrCat("/root/", std::string(129, 'y'))));
  CKPTD_ASSERT_OK(mem_.SetFileContents("/root/a-file", "not a job"));
  EXPECT_THAT(store_.ListJobs(), IsOkAndHolds(UnorderedElementsAre("alpha", "beta.2")));

  MemFileSystem empty;
  CheckpointStore missing(&empty, "/nowhere");
  EXPECT_THAT(missing.ListJobs(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nowhere")));
}

TEST_F(StoreTest, JobsAreIndependent) {
  Commit(1, 2, "alpha");
  Commit(1, 2, "beta");
  Commit(2, 2, "beta");
  EXPECT_THAT(store_.ApplyRetention("beta", 1), IsOkAndHolds(ElementsAre(1u)));
  EXPECT_THAT(store_.LatestCommittedStep("alpha"), IsOkAndHolds(Optional(uint64_t{1})));
  CKPTD_ASSERT_OK_AND_ASSIGN(StepVerifyReport report, store_.VerifyStep("alpha", 1, OneThread()));
  EXPECT_TRUE(report.ok());
}

// The same flow on the real file system, in a temp directory.
TEST(StorePosixTest, WriteCommitVerifyReadBack) {
  ckptd::testing::TempDir tmp("ckptd_store_");
  const std::string root = tmp.path();
  std::unique_ptr<PosixFileSystem> fs = NewPosixFileSystem();
  {
    CheckpointStore store(fs.get(), root);
    base::ThreadPool pool(2);
    std::vector<RankData> data;
    for (uint32_t r = 0; r < 2; ++r) data.push_back(MakeRankData(3, r));
    CKPTD_ASSERT_OK(store.PrepareStep(kJob, 3));
    std::vector<ShardRef> refs;
    for (uint32_t r = 0; r < 2; ++r) {
      const std::vector<TensorSource> sources = Sources(data[r]);
      CKPTD_ASSERT_OK_AND_ASSIGN(ShardWriteResult w, store.WriteShard(kJob, 3, r, 2, sources, SmallBlocks(), &pool));
      EXPECT_EQ(w.file_length % 4096, 0u);
      ShardRef ref;
      ref.set_rank(r);
      ref.set_file_length(w.file_length);
      ref.set_index_xxh3(w.index_xxh3);
      refs.push_back(ref);
    }
    CKPTD_ASSERT_OK_AND_ASSIGN(StepManifest m, store.CommitStep(kJob, 3, 2, &refs));
    EXPECT_EQ(m.shards_size(), 2);
    EXPECT_THAT(store.CommitStep(kJob, 3, 2), StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("already")));
    EXPECT_THAT(store.ListJobs(), IsOkAndHolds(ElementsAre(kJob)));
    EXPECT_THAT(store.LatestCommittedStep(kJob), IsOkAndHolds(Optional(uint64_t{3})));
    CKPTD_ASSERT_OK_AND_ASSIGN(StepVerifyReport report, store.VerifyStep(kJob, 3));
    EXPECT_THAT(report.problems, IsEmpty());
    EXPECT_EQ(report.shards, 2);

    for (uint32_t r = 0; r < 2; ++r) {
      CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader,
                                 ShardReader::Open(fs.get(), ShardPath(root, kJob, 3, r)));
      std::vector<float> params(kParamCount);
      std::string rng(kRngBytes, '\0');
      const TensorDest dests[] = {{kParams, params.data(), params.size() * sizeof(float)},
                                  {kRng, rng.data(), rng.size()}};
      CKPTD_ASSERT_OK(reader->ReadTensors(dests));
      EXPECT_EQ(params, data[r].params);
      EXPECT_EQ(rng, data[r].rng);
    }

    // A step that never committed is cleaned up; nothing else is touched.
    CKPTD_ASSERT_OK(store.PrepareStep(kJob, 4));
    EXPECT_THAT(store.RemoveIncompleteSteps(kJob), IsOkAndHolds(ElementsAre(4u)));
    CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, store.ListSteps(kJob));
    EXPECT_EQ(StepNumbers(steps), (std::vector<uint64_t>{3}));
  }
  CKPTD_EXPECT_OK(RemoveTree(fs.get(), root));
  EXPECT_THAT(fs->Stat(root), StatusIs(absl::StatusCode::kNotFound, HasSubstr(root)));
}

// A storage root on the real file system (links and FIFOs need one) and a
// folder beside it, outside the root, that links under the root point to.
class StoreLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    CKPTD_ASSERT_OK(CreateDirs(fs_.get(), outside_));
  }

  // Writes the one shard of `step` (a world of 1) in `store` and commits it.
  void Commit(uint64_t step, CheckpointStore* store = nullptr, const std::string& job = kJob) {
    if (store == nullptr) store = &store_;
    CKPTD_ASSERT_OK(store->PrepareStep(job, step));
    const RankData data = MakeRankData(step, 0);
    const std::vector<TensorSource> sources = Sources(data);
    CKPTD_ASSERT_OK(store->WriteShard(job, step, 0, 1, sources, SmallBlocks(), &pool_).status());
    CKPTD_ASSERT_OK(store->CommitStep(job, step, 1).status());
  }

  void Link(const std::string& target, const std::string& link) {
    ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0) << link << ": " << std::strerror(errno);
  }
  void MakeFifo(const std::string& path) {
    ASSERT_EQ(::unlink(path.c_str()) == 0 || errno == ENOENT, true) << path << ": " << std::strerror(errno);
    ASSERT_EQ(::mkfifo(path.c_str(), 0640), 0) << path << ": " << std::strerror(errno);
  }
  static bool IsLink(const std::string& path) {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
  }
  bool Exists(const std::string& path) { return fs_->Stat(path).ok(); }

  ckptd::testing::TempDir tmp_{"ckptd_store_links_"};
  std::unique_ptr<PosixFileSystem> fs_ = NewPosixFileSystem();
  const std::string root_ = tmp_.Sub("root");
  const std::string outside_ = tmp_.Sub("outside");
  base::ThreadPool pool_{2};
  CheckpointStore store_{fs_.get(), root_};
};

// Issue 16 (2): a step folder that is a link to a folder outside the root had
// everything in that folder deleted by retention.
TEST_F(StoreLinkTest, RetentionLeavesALinkedStepFolderAndWhatItPointsTo) {
  Commit(1);
  Commit(2);
  // Step 2's folder goes outside the root and a link takes its place: a
  // committed step, to anything that follows the link.
  const std::string moved = JoinPath(outside_, "step-2");
  const std::string link = StepDir(root_, kJob, 2);
  CKPTD_ASSERT_OK(fs_->Rename(link, moved));
  Link(moved, link);
  Commit(3);
  Commit(4);

  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, store_.ListSteps(kJob));
  ASSERT_EQ(StepNumbers(steps), (std::vector<uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(steps[1].state, StepState::kCorrupt);
  EXPECT_FALSE(steps[1].manifest.has_value());
  EXPECT_THAT(steps[1].detail, HasSubstr(link + " is a symbolic link, not a directory"));

  EXPECT_THAT(store_.ApplyRetention(kJob, 1), IsOkAndHolds(ElementsAre(1u, 3u)));
  EXPECT_THAT(store_.RemoveIncompleteSteps(kJob), IsOkAndHolds(IsEmpty()));
  // What a committer that decided the drop on its own (the coordinator) calls.
  CheckpointStore::RemovePacing pacing;
  pacing.batch = 1;
  const auto refused = StatusIs(absl::StatusCode::kFailedPrecondition,
                                AllOf(HasSubstr(link + " is a symbolic link"), HasSubstr("left alone")));
  EXPECT_THAT(store_.RemoveStep(kJob, 2, &pacing), refused);
  EXPECT_THAT(store_.RemoveStep(kJob, 2), refused);
  EXPECT_THAT(store_.AbortStep(kJob, 2), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("step 2")));

  // What the link points to is all there, and so is the link.
  EXPECT_TRUE(Exists(JoinPath(moved, kManifestName)));
  EXPECT_TRUE(Exists(JoinPath(moved, ShardFileName(0))));
  EXPECT_TRUE(IsLink(link));
  EXPECT_FALSE(Exists(StepDir(root_, kJob, 1)));
  EXPECT_FALSE(Exists(StepDir(root_, kJob, 3)));
  EXPECT_THAT(store_.LatestCommittedStep(kJob), IsOkAndHolds(Optional(uint64_t{4})));
}

TEST_F(StoreLinkTest, RemovingAStepRemovesLinksInItNotWhatTheyPointTo) {
  Commit(1);
  Commit(2);
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), JoinPath(outside_, "precious"), "keep me"));
  CKPTD_ASSERT_OK(CreateDirs(fs_.get(), JoinPath(outside_, "dir")));
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), JoinPath(outside_, "dir/inner"), "keep me too"));
  // A link to a file in place of step 1's shard, and a link to a folder.
  const std::string shard = ShardPath(root_, kJob, 1, 0);
  CKPTD_ASSERT_OK(fs_->RemoveFile(shard));
  Link(JoinPath(outside_, "precious"), shard);
  Link(JoinPath(outside_, "dir"), JoinPath(StepDir(root_, kJob, 1), "extra"));

  // Neither verification nor a commit's check reads through the link.
  CKPTD_ASSERT_OK_AND_ASSIGN(StepVerifyReport report, store_.VerifyStep(kJob, 1, OneThread()));
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_THAT(report.problems[0].message, HasSubstr(shard + " is a symbolic link, not a regular file"));
  ShardRef ref;
  ref.set_rank(0);
  ref.set_file_length(7);  // the length of what the link points to
  EXPECT_THAT(store_.CheckReportedShard(kJob, 1, ref),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(shard + " is a symbolic link")));

  EXPECT_THAT(store_.ApplyRetention(kJob, 1), IsOkAndHolds(ElementsAre(1u)));
  EXPECT_FALSE(Exists(StepDir(root_, kJob, 1)));
  EXPECT_THAT(ReadFileToString(fs_.get(), JoinPath(outside_, "precious")), IsOkAndHolds(std::string("keep me")));
  EXPECT_THAT(ReadFileToString(fs_.get(), JoinPath(outside_, "dir/inner")), IsOkAndHolds(std::string("keep me too")));
}

TEST_F(StoreLinkTest, AJobFolderThatIsALinkIsNeitherListedNorRemovedNorWrittenThrough) {
  // Another root's job, with committed steps, that a link under this root points to.
  CheckpointStore elsewhere(fs_.get(), outside_);
  Commit(1, &elsewhere, "job-b");
  Commit(2, &elsewhere, "job-b");
  Commit(1);
  const std::string link = JobDir(root_, "job-b");
  Link(JobDir(outside_, "job-b"), link);

  EXPECT_THAT(store_.ListJobs(), IsOkAndHolds(ElementsAre(kJob)));
  const auto refused =
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(link + " is a symbolic link, not a directory"));
  EXPECT_THAT(store_.ListSteps("job-b"), refused);
  EXPECT_THAT(store_.LatestCommittedStep("job-b"), refused);
  EXPECT_THAT(store_.ApplyRetention("job-b", 1), refused);
  EXPECT_THAT(store_.RemoveIncompleteSteps("job-b"), refused);
  EXPECT_THAT(store_.RemoveStep("job-b", 1), refused);
  EXPECT_THAT(store_.PrepareStep("job-b", 3), StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("symbolic link")));

  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> there, elsewhere.ListSteps("job-b"));
  EXPECT_EQ(StepNumbers(there), (std::vector<uint64_t>{1, 2}));
  for (uint64_t step : {1u, 2u}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(StepVerifyReport report, elsewhere.VerifyStep("job-b", step, OneThread()));
    EXPECT_THAT(report.problems, IsEmpty()) << step;
  }
}

// Only what is under the root is never followed: a root that is itself a link
// (to another disk) works as before.
TEST_F(StoreLinkTest, ARootThatIsALinkIsFollowed) {
  const std::string real_root = tmp_.Sub("real-root");
  const std::string linked_root = tmp_.Sub("linked-root");
  CKPTD_ASSERT_OK(fs_->CreateDir(real_root));
  Link(real_root, linked_root);
  CheckpointStore store(fs_.get(), linked_root);
  for (uint64_t step : {1u, 2u, 3u}) Commit(step, &store);
  EXPECT_THAT(store.ListJobs(), IsOkAndHolds(ElementsAre(kJob)));
  EXPECT_THAT(store.ApplyRetention(kJob, 2), IsOkAndHolds(ElementsAre(1u)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, store.ListSteps(kJob));
  EXPECT_EQ(StepNumbers(steps), (std::vector<uint64_t>{2, 3}));
  CKPTD_ASSERT_OK_AND_ASSIGN(StepVerifyReport report, store.VerifyStep(kJob, 3, OneThread()));
  EXPECT_THAT(report.problems, IsEmpty());
  EXPECT_TRUE(Exists(StepDir(real_root, kJob, 3)));
  EXPECT_FALSE(Exists(StepDir(real_root, kJob, 1)));
  EXPECT_TRUE(IsLink(linked_root));
}

// Issue 16 (4): a FIFO in place of a shard hung verification and restores.
TEST_F(StoreLinkTest, AFifoInPlaceOfAShardOrManifestIsAnErrorNotAHang) {
  Commit(1);
  const std::string shard = ShardPath(root_, kJob, 1, 0);
  MakeFifo(shard);
  absl::StatusOr<StepVerifyReport> report =
      WithinOrReleaseFifo(shard, [&] { return store_.VerifyStep(kJob, 1, OneThread()); });
  CKPTD_ASSERT_OK(report.status());
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_EQ(report->problems[0].file, shard);
  EXPECT_THAT(report->problems[0].message, HasSubstr(shard + " is a FIFO, not a regular file"));
  EXPECT_THAT(WithinOrReleaseFifo(shard, [&] { return ShardReader::Open(fs_.get(), shard, OneThread()).status(); }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("is a FIFO")));

  // A commit that reads the shards names the rank without one.
  CKPTD_ASSERT_OK(store_.PrepareStep(kJob, 2));
  const std::string shard2 = ShardPath(root_, kJob, 2, 0);
  MakeFifo(shard2);
  EXPECT_THAT(WithinOrReleaseFifo(shard2, [&] { return store_.CommitStep(kJob, 2, 1).status(); }),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("rank 0 has no durable shard"), HasSubstr("is a FIFO"))));
  ShardRef ref;
  ref.set_rank(0);
  ref.set_file_length(0);
  EXPECT_THAT(store_.CheckReportedShard(kJob, 2, ref),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(shard2 + " is a FIFO, socket or device")));

  // A FIFO for a MANIFEST: the step is corrupt (kept and reported) and the
  // listing finishes.
  Commit(3);
  const std::string manifest = ManifestPath(root_, kJob, 3);
  MakeFifo(manifest);
  absl::StatusOr<std::vector<StepInfo>> steps = WithinOrReleaseFifo(manifest, [&] { return store_.ListSteps(kJob); });
  CKPTD_ASSERT_OK(steps.status());
  ASSERT_EQ(StepNumbers(*steps), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ((*steps)[2].state, StepState::kCorrupt);
  EXPECT_THAT((*steps)[2].detail, HasSubstr(manifest + " is a FIFO, not a regular file"));
  EXPECT_THAT(WithinOrReleaseFifo(manifest, [&] { return store_.ReadManifest(kJob, 3).status(); }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("is a FIFO")));
}

// Issue 16 (5): what a failed persist leaves of its step goes when empty,
// and only then.
TEST_F(StoreTest, RemoveEmptyStepRemovesOnlyAnEmptyStepDirectory) {
  CKPTD_ASSERT_OK(store_.PrepareStep(kJob, 1));
  CKPTD_ASSERT_OK(store_.RemoveEmptyStep(kJob, 1));
  EXPECT_FALSE(Exists(StepDir("/root", kJob, 1)));
  CKPTD_EXPECT_OK(store_.RemoveEmptyStep(kJob, 1));  // gone already
  CKPTD_EXPECT_OK(store_.RemoveEmptyStep("other-job", 1));

  // Another rank's shard, a MANIFEST: kept.
  CKPTD_ASSERT_OK(WriteRanks(2, 2, {1}).status());
  EXPECT_THAT(store_.RemoveEmptyStep(kJob, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, AllOf(HasSubstr("holds rank-1.shard"), HasSubstr("kept"))));
  EXPECT_TRUE(Exists(ShardPath("/root", kJob, 2, 1)));
  Commit(3);
  EXPECT_THAT(store_.RemoveEmptyStep(kJob, 3), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("kept")));
  EXPECT_TRUE(Exists(ManifestPath("/root", kJob, 3)));
  EXPECT_THAT(store_.RemoveEmptyStep("bad/job", 1), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad/job")));
}

TEST_F(StoreLinkTest, RemoveEmptyStepLeavesALinkedStepFolderAndWhatItPointsTo) {
  CKPTD_ASSERT_OK(store_.PrepareStep(kJob, 1));
  CKPTD_ASSERT_OK(CreateDirs(fs_.get(), JoinPath(outside_, "empty")));
  const std::string link = StepDir(root_, kJob, 2);
  Link(JoinPath(outside_, "empty"), link);
  EXPECT_THAT(store_.RemoveEmptyStep(kJob, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(link + " is a symbolic link")));
  EXPECT_TRUE(IsLink(link));
  EXPECT_TRUE(Exists(JoinPath(outside_, "empty")));
}

}  // namespace
}  // namespace ckptd::storage
