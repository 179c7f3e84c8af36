#include "cli/offline_commands.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/flags.h"
#include "base/testing/fifo.h"
#include "base/testing/json_checker.h"
#include "base/testing/temp_dir.h"
#include "base/thread_pool.h"
#include "cli/testing_terminal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/layout.h"
#include "storage/mem_file_system.h"
#include "storage/posix_file_system.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"
#include "storage/store.h"

namespace ckptd::cli {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

using ::ckptd::testing::IsValidJson;
using ::ckptd::testing::WithinOrReleaseFifo;

constexpr char kRoot[] = "/root";
constexpr char kJob[] = "train";
constexpr uint32_t kWorld = 2;

// One rank's state: four tensors of four components and dtypes.
struct RankData {
  std::vector<float> params;     // layer0.weight, PARAMS, FLOAT32, 3 blocks
  std::vector<uint16_t> moment;  // adam.m, OPTIMIZER, BFLOAT16
  std::string rng;               // rng.state, RNG, BYTES
  std::vector<int64_t> cursor;   // data.cursor, DATA_CURSOR, INT64
};

RankData MakeRankData(uint64_t step, uint32_t rank) {
  RankData d;
  for (size_t i = 0; i < 3000; ++i) d.params.push_back(static_cast<float>((i * 7 + step + rank) % 50) * 0.25f);
  for (size_t i = 0; i < 2048; ++i) d.moment.push_back(static_cast<uint16_t>(0x3f80 + (i % 16)));
  for (size_t i = 0; i < 64; ++i) d.rng.push_back(static_cast<char>((i * 37 + rank) & 0xff));
  d.cursor = {static_cast<int64_t>(step), static_cast<int64_t>(rank), 1234, -1};
  return d;
}

std::vector<storage::TensorSource> Sources(const RankData& d, uint32_t rank) {
  std::vector<storage::TensorSource> out(4);
  out[0].meta.set_name("layer0.weight");
  out[0].meta.set_component(ckptd::v1::PARAMS);
  out[0].meta.set_dtype(ckptd::v1::FLOAT32);
  out[0].meta.add_shape(3000);
  out[0].meta.add_global_shape(3000 * kWorld);
  out[0].meta.add_offsets(3000 * rank);
  out[0].data = d.params.data();
  out[0].length = d.params.size() * sizeof(float);
  out[1].meta.set_name("adam.m");
  out[1].meta.set_component(ckptd::v1::OPTIMIZER);
  out[1].meta.set_dtype(ckptd::v1::BFLOAT16);
  out[1].meta.add_shape(32);
  out[1].meta.add_shape(64);
  out[1].data = d.moment.data();
  out[1].length = d.moment.size() * sizeof(uint16_t);
  out[2].meta.set_name("rng.state");
  out[2].meta.set_component(ckptd::v1::RNG);
  out[2].meta.set_dtype(ckptd::v1::BYTES);
  out[2].meta.add_shape(64);
  out[2].data = d.rng.data();
  out[2].length = d.rng.size();
  out[3].meta.set_name("data.cursor");
  out[3].meta.set_component(ckptd::v1::DATA_CURSOR);
  out[3].meta.set_dtype(ckptd::v1::INT64);
  out[3].meta.add_shape(4);
  out[3].data = d.cursor.data();
  out[3].length = d.cursor.size() * sizeof(int64_t);
  return out;
}

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

class OfflineCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(mem_.CreateDir(kRoot).ok());
    ASSERT_TRUE(mem_.SyncDir("/").ok());
    WriteStep(kJob, 10, kWorld, true);
    WriteStep(kJob, 11, kWorld, false);  // incomplete: no MANIFEST
  }

  void WriteStep(const std::string& job, uint64_t step, uint32_t world, bool commit) {
    ASSERT_TRUE(store_.PrepareStep(job, step).ok());
    storage::ShardWriteOptions options;
    options.block_bytes = 4096;
    options.threads = 1;
    for (uint32_t rank = 0; rank < world; ++rank) {
      const RankData data = MakeRankData(step, rank);
      const std::vector<storage::TensorSource> sources = Sources(data, rank);
      absl::StatusOr<storage::ShardWriteResult> r =
          store_.WriteShard(job, step, rank, world, sources, options, &pool_);
      ASSERT_TRUE(r.ok()) << r.status();
    }
    if (commit) {
      absl::Status s = store_.CommitStep(job, step, world).status();
      ASSERT_TRUE(s.ok()) << s;
    }
  }

  Result Inspect(const std::vector<std::string>& argv) {
    std::ostringstream out, err;
    Result r;
    r.code = RunInspect(&mem_, argv, out, err);
    r.out = out.str();
    r.err = err.str();
    return r;
  }

  Result Verify(const std::vector<std::string>& argv) {
    std::ostringstream out, err;
    Result r;
    r.code = RunVerify(&mem_, argv, out, err);
    r.out = out.str();
    r.err = err.str();
    return r;
  }

  // Flips a byte in the middle of chunk 0 of block 1 of layer0.weight in rank 1 of `step`.
  std::string CorruptChunk(uint64_t step) {
    const std::string path = storage::ShardPath(kRoot, kJob, step, 1);
    storage::ShardReadOptions ro;
    ro.threads = 1;
    absl::StatusOr<std::unique_ptr<storage::ShardReader>> reader = storage::ShardReader::Open(&mem_, path, ro);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return path;
    const ckptd::v1::Chunk& c = (*reader)->FindTensor("layer0.weight")->blocks(1).chunks(0);
    absl::StatusOr<std::string> bytes = storage::ReadFileToString(&mem_, path);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    const uint64_t at = c.file_offset() + c.stored_length() / 2;
    (*bytes)[at] = static_cast<char>((*bytes)[at] ^ 0x40);
    EXPECT_TRUE(mem_.SetFileContents(path, *bytes).ok());
    return path;
  }

  storage::MemFileSystem mem_;
  base::ThreadPool pool_{1};
  storage::CheckpointStore store_{&mem_, kRoot};
};

TEST_F(OfflineCommandsTest, StartFreshIsRecordedOnlyWhenEveryCommittedStepIsDamaged) {
  auto run = [this](const std::vector<std::string>& argv) {
    std::ostringstream out, err;
    Result r;
    r.code = RunStartFresh(&mem_, argv, out, err);
    r.out = out.str();
    r.err = err.str();
    return r;
  };
  Result intact = run({"--root", kRoot, "--job", kJob});
  EXPECT_EQ(intact.code, 1);
  EXPECT_THAT(intact.err, HasSubstr("step 10 is committed and not quarantined"));
  ASSERT_TRUE(store_.QuarantineStep(kJob, 10, "chunk 0 checksum mismatch").ok());
  Result ok = run({"--root", kRoot, "--job", kJob, "--note", "bob: data changed"});
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("up to 10"));
  absl::StatusOr<std::optional<uint64_t>> over = store_.FreshStartAllowedOver(kJob);
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_EQ(*over, std::optional<uint64_t>(10));
  EXPECT_THAT(storage::ReadFileToString(&mem_, storage::FreshStartPath(kRoot, kJob)).value_or(""),
              HasSubstr("bob: data changed"));
  EXPECT_EQ(run({"--root", kRoot, "--job", "nope"}).code, 1);
  EXPECT_EQ(run({"--root", kRoot}).code, 2);
  EXPECT_EQ(run({"--job", kJob}).code, 2);
  Result hostile = run({"--root", kRoot, "--job", "../x\x1b[2J"});
  EXPECT_EQ(hostile.code, 2);
  EXPECT_THAT(hostile.err, Not(HasSubstr("\x1b")));
  EXPECT_EQ(run({"--help"}).code, 0);
}

TEST_F(OfflineCommandsTest, InspectPrintsTheTensors) {
  const std::string path = storage::ShardPath(kRoot, kJob, 10, 1);
  Result r = Inspect({path});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  EXPECT_THAT(r.out, AllOf(HasSubstr(path), HasSubstr("job     train  step 10  rank 1 of 2"), HasSubstr("ratio")));
  EXPECT_THAT(r.out, AllOf(HasSubstr("layer0.weight"), HasSubstr("adam.m"), HasSubstr("rng.state"),
                           HasSubstr("data.cursor")));
  EXPECT_THAT(r.out, AllOf(HasSubstr("PARAMS"), HasSubstr("OPTIMIZER"), HasSubstr("RNG"), HasSubstr("DATA_CURSOR")));
  EXPECT_THAT(r.out, AllOf(HasSubstr("FLOAT32"), HasSubstr("BFLOAT16"), HasSubstr("BYTES"), HasSubstr("INT64")));
  EXPECT_THAT(r.out, AllOf(HasSubstr("zstd"), HasSubstr("[3000]"), HasSubstr("[6000]@[3000]"), HasSubstr("[32,64]")));
  EXPECT_THAT(r.out, Not(HasSubstr("block 0 chunk 0")));
}

TEST_F(OfflineCommandsTest, InspectChunksListsEveryChunk) {
  Result r = Inspect({storage::ShardPath(kRoot, kJob, 10, 0), "--chunks"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("block 0 chunk 0"), HasSubstr("block 2 chunk 3"), HasSubstr("plane 3"),
                           HasSubstr("  zstd"), HasSubstr("xxh3")));
}

TEST_F(OfflineCommandsTest, InspectJson) {
  const std::string path = storage::ShardPath(kRoot, kJob, 10, 0);
  Result r = Inspect({"--json", path});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"tensors\":["), HasSubstr(absl::StrCat("\"file\":\"", path, "\"")),
                           HasSubstr("\"job\":\"train\""), HasSubstr("\"step\":10"), HasSubstr("\"rank\":0"),
                           HasSubstr("\"world_size\":2"), HasSubstr("\"format_version\":1"),
                           HasSubstr("\"index_xxh3\":\""), HasSubstr("\"ratio\":")));
  for (const char* name : {"layer0.weight", "adam.m", "rng.state", "data.cursor"}) {
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("\"name\":\"", name, "\""))) << name;
  }
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"component\":\"PARAMS\""), HasSubstr("\"dtype\":\"FLOAT32\""),
                           HasSubstr("\"shape\":[3000]"), HasSubstr("\"global_shape\":[6000]"),
                           HasSubstr("\"offsets\":[0]"), HasSubstr("\"shape\":[32,64]"),
                           HasSubstr("\"device\":\"host\""), HasSubstr("\"blocks\":3"),
                           HasSubstr("\"raw_bytes\":12000"), HasSubstr("\"zstd_chunks\":")));
  EXPECT_THAT(r.out, Not(HasSubstr("\"zstd_chunks\":0,\"raw_chunks\":12")));  // layer0.weight compresses
  EXPECT_THAT(r.out, Not(HasSubstr("block_list")));

  Result chunks = Inspect({path, "--json", "--chunks"});
  ASSERT_EQ(chunks.code, base::kExitOk) << chunks.err;
  EXPECT_TRUE(IsValidJson(chunks.out));
  EXPECT_THAT(chunks.out, AllOf(HasSubstr("\"block_list\":["), HasSubstr("\"codec\":\"zstd\""),
                                HasSubstr("\"filter\":\"byte-planes\""), HasSubstr("\"stored_xxh3\":\"")));
}

TEST_F(OfflineCommandsTest, InspectMissingFile) {
  Result r = Inspect({"/root/train/step-10/rank-7.shard"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, AllOf(HasSubstr("ckptctl inspect"), HasSubstr("/root/train/step-10/rank-7.shard")));
  EXPECT_THAT(r.out, IsEmpty());
}

TEST_F(OfflineCommandsTest, InspectNotAShard) {
  Result r = Inspect({storage::ManifestPath(kRoot, kJob, 10)});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr(storage::ManifestPath(kRoot, kJob, 10)));
}

TEST_F(OfflineCommandsTest, InspectUsageErrors) {
  Result none = Inspect({});
  EXPECT_EQ(none.code, base::kExitUsage);
  EXPECT_THAT(none.err, HasSubstr("usage: ckptctl inspect"));
  EXPECT_THAT(none.out, IsEmpty());

  Result two = Inspect({"a.shard", "b.shard"});
  EXPECT_EQ(two.code, base::kExitUsage);
  EXPECT_THAT(two.err, HasSubstr("usage: ckptctl inspect"));

  Result bogus = Inspect({"--bogus", storage::ShardPath(kRoot, kJob, 10, 0)});
  EXPECT_EQ(bogus.code, base::kExitUsage);
  EXPECT_THAT(bogus.err, AllOf(HasSubstr("unknown flag --bogus"), HasSubstr("usage: ckptctl inspect")));

  Result value = Inspect({"--json=yes", storage::ShardPath(kRoot, kJob, 10, 0)});
  EXPECT_EQ(value.code, base::kExitUsage);
  EXPECT_THAT(value.err, HasSubstr("--json takes no value"));

  Result help = Inspect({"--help"});
  EXPECT_EQ(help.code, base::kExitOk);
  EXPECT_THAT(help.out, HasSubstr("usage: ckptctl inspect"));
}

TEST_F(OfflineCommandsTest, VerifyIntactRoot) {
  Result r = Verify({"--root", kRoot});
  EXPECT_EQ(r.code, base::kExitOk) << r.out << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  EXPECT_THAT(r.out, AllOf(HasSubstr("train"), HasSubstr("step 10"), HasSubstr("OK"), HasSubstr("2 shards"),
                           HasSubstr("1 step(s) checked, 0 failed: OK")));
  // The incomplete step is listed, not counted as a failure.
  EXPECT_THAT(r.out, HasSubstr("INCOMPLETE"));
}

TEST_F(OfflineCommandsTest, VerifyJson) {
  Result r = Verify({"--root=/root", "--json", "--threads", "2"});
  EXPECT_EQ(r.code, base::kExitOk) << r.out << r.err;
  EXPECT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"root\":\"/root\""), HasSubstr("\"steps\":["), HasSubstr("\"job\":\"train\""),
                           HasSubstr("\"step\":10"), HasSubstr("\"shards\":2"), HasSubstr("\"problems\":[]"),
                           HasSubstr("\"checked\":1"), HasSubstr("\"failed\":0"), HasSubstr("\"errors\":[]"),
                           HasSubstr("\"ok\":true}")));
  EXPECT_THAT(r.out, Not(HasSubstr("\"ok\":false")));
  EXPECT_THAT(r.out, Not(HasSubstr("INCOMPLETE")));
}

TEST_F(OfflineCommandsTest, VerifyCorruptedChunk) {
  const std::string path = CorruptChunk(10);
  Result r = Verify({"--root", kRoot});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.out, AllOf(HasSubstr("FAIL"), HasSubstr(path), HasSubstr("layer0.weight"), HasSubstr("block 1"),
                           HasSubstr("chunk 0"), HasSubstr("1 step(s) checked, 1 failed: FAILED")));

  Result j = Verify({"--root", kRoot, "--json", "--job", kJob, "--step", "10"});
  EXPECT_EQ(j.code, base::kExitFailed);
  EXPECT_TRUE(IsValidJson(j.out)) << j.out;
  EXPECT_THAT(j.out, AllOf(HasSubstr(absl::StrCat("\"file\":\"", path, "\"")), HasSubstr("\"tensor\":\"layer0.weight\""),
                           HasSubstr("\"block\":1"), HasSubstr("\"chunk\":0"), HasSubstr("\"failed\":1"),
                           HasSubstr("\"ok\":false")));
}

TEST_F(OfflineCommandsTest, VerifyCorruptManifest) {
  ASSERT_TRUE(mem_.SetFileContents(storage::ManifestPath(kRoot, kJob, 10), "not a manifest").ok());
  Result r = Verify({"--root", kRoot, "--job", kJob});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.out, AllOf(HasSubstr("FAIL"), HasSubstr(storage::ManifestPath(kRoot, kJob, 10))));
}

TEST_F(OfflineCommandsTest, VerifyMissingStep) {
  Result r = Verify({"--root", kRoot, "--job", kJob, "--step", "99"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.out, HasSubstr("job train has no step 99"));
  EXPECT_THAT(r.out, HasSubstr("0 step(s) checked"));

  Result j = Verify({"--root", kRoot, "--job", kJob, "--step", "99", "--json"});
  EXPECT_EQ(j.code, base::kExitFailed);
  EXPECT_TRUE(IsValidJson(j.out)) << j.out;
  EXPECT_THAT(j.out, AllOf(HasSubstr("has no step 99"), HasSubstr("\"ok\":false")));
}

TEST_F(OfflineCommandsTest, VerifyMissingJob) {
  Result r = Verify({"--root", kRoot, "--job", "nope"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.out, HasSubstr("job nope"));
}

TEST_F(OfflineCommandsTest, VerifyIncompleteStepNamedExplicitly) {
  Result r = Verify({"--root", kRoot, "--job", kJob, "--step", "11"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.out, AllOf(HasSubstr("job train step 11 is not committed"), HasSubstr("INCOMPLETE")));
}

TEST_F(OfflineCommandsTest, VerifyMissingRoot) {
  Result r = Verify({"--root", "/nowhere"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("/nowhere"));
}

TEST_F(OfflineCommandsTest, VerifyUsageErrors) {
  Result no_root = Verify({});
  EXPECT_EQ(no_root.code, base::kExitUsage);
  EXPECT_THAT(no_root.err, AllOf(HasSubstr("--root is required"), HasSubstr("usage: ckptctl verify")));
  EXPECT_THAT(no_root.out, IsEmpty());

  Result no_root_json = Verify({"--json", "--job", kJob});
  EXPECT_EQ(no_root_json.code, base::kExitUsage);
  EXPECT_THAT(no_root_json.err, HasSubstr("--root is required"));

  Result unknown = Verify({"--root", kRoot, "--frobnicate"});
  EXPECT_EQ(unknown.code, base::kExitUsage);
  EXPECT_THAT(unknown.err, HasSubstr("unknown flag --frobnicate"));

  Result hostile = Verify({"--root", kRoot, "--job", "../x"});
  EXPECT_EQ(hostile.code, base::kExitUsage);
  EXPECT_THAT(hostile.err, AllOf(HasSubstr("ckptctl verify"), HasSubstr("must not start with")));
  Result slash = Verify({"--root", kRoot, "--job", "a/b"});
  EXPECT_EQ(slash.code, base::kExitUsage);
  EXPECT_THAT(slash.err, HasSubstr("not allowed"));

  Result step_without_job = Verify({"--root", kRoot, "--step", "10"});
  EXPECT_EQ(step_without_job.code, base::kExitUsage);
  EXPECT_THAT(step_without_job.err, HasSubstr("--step needs --job"));

  Result bad_step = Verify({"--root", kRoot, "--job", kJob, "--step", "ten"});
  EXPECT_EQ(bad_step.code, base::kExitUsage);
  EXPECT_THAT(bad_step.err, HasSubstr("--step: \"ten\" is not a non-negative integer"));

  Result negative = Verify({"--root", kRoot, "--job", kJob, "--step", "-1"});
  EXPECT_EQ(negative.code, base::kExitUsage);
  EXPECT_THAT(negative.err, HasSubstr("--step"));

  Result bad_threads = Verify({"--root", kRoot, "--threads", "x"});
  EXPECT_EQ(bad_threads.code, base::kExitUsage);
  EXPECT_THAT(bad_threads.err, HasSubstr("--threads"));

  Result missing_value = Verify({"--root"});
  EXPECT_EQ(missing_value.code, base::kExitUsage);
  EXPECT_THAT(missing_value.err, HasSubstr("--root needs a value"));

  Result extra = Verify({"--root", kRoot, "stray"});
  EXPECT_EQ(extra.code, base::kExitUsage);
  EXPECT_THAT(extra.err, HasSubstr("unexpected argument stray"));

  Result help = Verify({"--help"});
  EXPECT_EQ(help.code, base::kExitOk);
  EXPECT_THAT(help.out, HasSubstr("usage: ckptctl verify"));
}

TEST_F(OfflineCommandsTest, VerifyEveryJobUnderTheRoot) {
  WriteStep("other", 1, 1, true);
  WriteStep("other", 2, 1, true);
  // A directory that is not a valid job name is not a job.
  ASSERT_TRUE(mem_.CreateDir("/root/.trash").ok());
  Result r = Verify({"--root", kRoot});
  EXPECT_EQ(r.code, base::kExitOk) << r.out << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("other"), HasSubstr("3 step(s) checked, 0 failed: OK")));
  EXPECT_THAT(r.out, Not(HasSubstr(".trash")));

  // One bad step fails the run, the others are still reported.
  const std::string path = CorruptChunk(10);
  Result bad = Verify({"--root", kRoot, "--json"});
  EXPECT_EQ(bad.code, base::kExitFailed);
  EXPECT_TRUE(IsValidJson(bad.out)) << bad.out;
  EXPECT_THAT(bad.out, AllOf(HasSubstr("\"checked\":3"), HasSubstr("\"failed\":1"), HasSubstr(path)));
}

// Issue 16 (finding 10): text read from the storage root (a quarantine's
// reason) reaches the terminal escaped.
TEST_F(OfflineCommandsTest, VerifyEscapesWhatTheRootHolds) {
  ASSERT_TRUE(store_.QuarantineStep(kJob, 10, absl::StrCat("verification: ", kHostile)).ok());
  Result r = Verify({"--root", kRoot});
  ExpectTerminalSafe(r.out);
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("    quarantined (never restored): verification: ", kShown, "\n")));
  Result j = Verify({"--root", kRoot, "--json"});
  EXPECT_TRUE(IsValidJson(j.out)) << j.out;
  ExpectTerminalSafe(j.out);
}

// Issue 16, finding 9: --threads is parsed wide and checked before it is
// narrowed (2^32 + 1 was 1 thread, 100000 threads the machine cannot start).
TEST_F(OfflineCommandsTest, VerifyThreadsOutsideOneTo1024IsAUsageError) {
  for (const char* threads : {"0", "1025", "100000", "4294967297", "18446744073709551617"}) {
    Result r = Verify({"--root", kRoot, "--threads", threads});
    EXPECT_EQ(r.code, base::kExitUsage) << threads;
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("--threads must be an integer in 1..1024, got \"", threads, "\"")));
  }
  for (const char* threads : {"1", "1024"}) {
    Result r = Verify({"--root", kRoot, "--threads", threads});
    EXPECT_EQ(r.code, base::kExitOk) << threads << " " << r.err;
  }
}

// Issue 16 (4): a FIFO in place of a shard hung `ckptctl verify --root` for
// ever (opening a FIFO for reading waits for a writer). On the real file
// system, since memory holds no FIFOs.
TEST_F(OfflineCommandsTest, ExportJsonAnswersAFailureWithItsStatusCode) {
  auto run = [this](const std::vector<std::string>& argv) {
    std::ostringstream out, err;
    Result r;
    r.code = RunExport(&mem_, argv, out, err);
    r.out = out.str();
    r.err = err.str();
    return r;
  };
  Result missing = run({"--root", kRoot, "--job", "nope", "--out", "/out", "--json"});
  EXPECT_EQ(missing.code, base::kExitFailed);
  EXPECT_TRUE(IsValidJson(missing.out)) << missing.out;
  EXPECT_THAT(missing.out, AllOf(HasSubstr("{\"error\":{\"code\":5,\"status\":\"NOT_FOUND\",\"message\":\""),
                                 HasSubstr("nope")));
  EXPECT_THAT(missing.err, HasSubstr("nope"));
  Result usage = run({"--root", kRoot, "--job", kJob, "--out", "/out", "--components", "weights", "--json"});
  EXPECT_EQ(usage.code, base::kExitUsage);
  EXPECT_TRUE(IsValidJson(usage.out)) << usage.out;
  EXPECT_THAT(usage.out, AllOf(HasSubstr("\"code\":3,\"status\":\"INVALID_ARGUMENT\""), HasSubstr("weights")));
  // Without --json stdout stays empty.
  EXPECT_THAT(run({"--root", kRoot, "--job", "nope", "--out", "/out"}).out, IsEmpty());
}

TEST(OfflineVerifyPosixTest, AFifoInPlaceOfAShardIsReportedAndVerifyFinishes) {
  ckptd::testing::TempDir tmp("ckptd_verify_fifo_");
  std::unique_ptr<storage::PosixFileSystem> fs = storage::NewPosixFileSystem();
  const std::string root = tmp.Sub("root");
  storage::CheckpointStore store(fs.get(), root);
  base::ThreadPool pool(1);
  storage::ShardWriteOptions options;
  options.block_bytes = 4096;
  options.threads = 1;
  for (uint64_t step : {1u, 2u}) {
    ASSERT_TRUE(store.PrepareStep(kJob, step).ok());
    const RankData data = MakeRankData(step, 0);
    const std::vector<storage::TensorSource> sources = Sources(data, 0);
    absl::StatusOr<storage::ShardWriteResult> written = store.WriteShard(kJob, step, 0, 1, sources, options, &pool);
    ASSERT_TRUE(written.ok()) << written.status();
    absl::Status committed = store.CommitStep(kJob, step, 1).status();
    ASSERT_TRUE(committed.ok()) << committed;
  }
  const std::string fifo = storage::ShardPath(root, kJob, 1, 0);
  ASSERT_EQ(::unlink(fifo.c_str()), 0) << std::strerror(errno);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0640), 0) << std::strerror(errno);

  for (bool json : {false, true}) {
    std::vector<std::string> argv = {"--root", root};
    if (json) argv.push_back("--json");
    Result r = WithinOrReleaseFifo(fifo, [&] {
      std::ostringstream out, err;
      Result result;
      result.code = RunVerify(fs.get(), argv, out, err);
      result.out = out.str();
      result.err = err.str();
      return result;
    });
    EXPECT_EQ(r.code, base::kExitFailed) << r.err;
    EXPECT_THAT(r.out, HasSubstr(fifo + " is a FIFO, not a regular file")) << r.out;
    if (json) {
      EXPECT_TRUE(IsValidJson(r.out)) << r.out;
      EXPECT_THAT(r.out, AllOf(HasSubstr("\"checked\":2"), HasSubstr("\"failed\":1")));
    } else {
      EXPECT_THAT(r.out, HasSubstr("2 step(s) checked, 1 failed: FAILED"));
    }
  }
}

}  // namespace
}  // namespace ckptd::cli
