// Crash consistency of CheckpointStore: a simulated power loss, EIO or ENOSPC
// at every file-system operation of "write a step, commit it, apply retention,
// clean up", then recovery, then checks that no committed step was lost or
// damaged and nothing half-written is left behind.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_macros.h"  // CKPTD_STATUS_CONCAT_, used by testing_matchers.h
#include "base/testing/matchers.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/fault_injection_file_system.h"
#include "storage/layout.h"
#include "storage/mem_file_system.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"
#include "storage/store.h"
#include "storage/testing_data.h"

namespace ckptd::storage {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kRoot[] = "/root";
constexpr char kJob[] = "crash-job";
constexpr uint32_t kWorld = 2;
constexpr char kParams[] = "w";
constexpr char kRng[] = "rng";
// 1500 floats = 6000 bytes: two blocks of 4096 bytes.
constexpr size_t kParamCount = 1500;
constexpr size_t kRngBytes = 40;

using ::ckptd::testing::OneThread;
using ::ckptd::testing::RankData;
using ::ckptd::testing::SmallBlocks;

RankData MakeRankData(uint64_t step, uint32_t rank) {
  return ::ckptd::testing::MakeRankData(step, rank, kParamCount, kRngBytes);
}
std::vector<TensorSource> Sources(const RankData& d) { return ::ckptd::testing::RankSources(d, kParams, kRng); }

// A memory file system behind a fault injector, with a store on top. The
// injector's crash drops everything not yet durable.
struct World {
  World() {
    // The storage root exists durably before the store is used.
    EXPECT_THAT(mem.CreateDir(kRoot), IsOk());
    EXPECT_THAT(mem.SyncDir("/"), IsOk());
  }
  MemFileSystem mem;
  FaultInjectionFileSystem fi{&mem, [this] { mem.Crash(); }};
  CheckpointStore store{&fi, kRoot};
  base::ThreadPool pool{1};
};

absl::Status WriteStep(World& w, uint64_t step) {
  CKPTD_RETURN_IF_ERROR(w.store.PrepareStep(kJob, step));
  for (uint32_t rank = 0; rank < kWorld; ++rank) {
    const RankData data = MakeRankData(step, rank);
    const std::vector<TensorSource> sources = Sources(data);
    CKPTD_RETURN_IF_ERROR(w.store.WriteShard(kJob, step, rank, kWorld, sources, SmallBlocks(), &w.pool).status());
  }
  return absl::OkStatus();
}

absl::Status WriteAndCommit(World& w, uint64_t step) {
  CKPTD_RETURN_IF_ERROR(WriteStep(w, step));
  return w.store.CommitStep(kJob, step, kWorld).status();
}

// A world with steps 1 and 2 committed and the injector's counter at 0.
std::unique_ptr<World> NewWorld() {
  auto w = std::make_unique<World>();
  EXPECT_THAT(WriteAndCommit(*w, 1), IsOk());
  EXPECT_THAT(WriteAndCommit(*w, 2), IsOk());
  w->fi.Reset();
  return w;
}

// How far the sequence under test got.
struct Progress {
  std::string call;                     // the call running (or that failed)
  uint64_t committed_at = UINT64_MAX;   // operation count when CommitStep(3) returned ok
  uint64_t retained_at = UINT64_MAX;    // ... when ApplyRetention returned ok
};

// The sequence under test, stopping at the first error.
absl::Status RunSequence(World& w, Progress* p) {
  p->call = "write step 3";
  CKPTD_RETURN_IF_ERROR(WriteStep(w, 3));
  p->call = "commit step 3";
  CKPTD_RETURN_IF_ERROR(w.store.CommitStep(kJob, 3, kWorld).status());
  p->committed_at = w.fi.operation_count();
  p->call = "apply retention";
  CKPTD_RETURN_IF_ERROR(w.store.ApplyRetention(kJob, 2).status());
  p->retained_at = w.fi.operation_count();
  p->call = "remove incomplete steps";
  CKPTD_RETURN_IF_ERROR(w.store.RemoveIncompleteSteps(kJob, 3).status());
  p->call = "(none: the sequence completed)";
  return absl::OkStatus();
}

// Every path under `dir` whose name ends in ".tmp".
void FindTempFiles(FileSystem* fs, const std::string& dir, std::vector<std::string>* out) {
  absl::StatusOr<std::vector<FileInfo>> entries = fs->ListDir(dir);
  ASSERT_THAT(entries.status(), IsOk());
  for (const FileInfo& e : *entries) {
    const std::string path = JoinPath(dir, e.name);
    if (absl::EndsWith(e.name, kTempSuffix)) out->push_back(path);
    if (e.is_directory) FindTempFiles(fs, path, out);
  }
}

// Reads every rank of a committed step back and compares it with what was written.
void ExpectStepData(FileSystem* fs, uint64_t step) {
  for (uint32_t rank = 0; rank < kWorld; ++rank) {
    SCOPED_TRACE(absl::StrCat("step ", step, " rank ", rank));
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader,
                               ShardReader::Open(fs, ShardPath(kRoot, kJob, step, rank), OneThread()));
    const RankData want = MakeRankData(step, rank);
    std::vector<float> params(kParamCount, -1.0f);
    std::string rng(kRngBytes, '\0');
    const TensorDest dests[] = {{kParams, params.data(), params.size() * sizeof(float)},
                                {kRng, rng.data(), rng.size()}};
    CKPTD_ASSERT_OK(reader->ReadTensors(dests));
    EXPECT_EQ(0, std::memcmp(params.data(), want.params.data(), params.size() * sizeof(float)));
    EXPECT_EQ(rng, want.rng);
  }
}

enum class Expect { kPresent, kAbsent, kEither };

// Checks the state after recovery: only committed steps, each verifying and
// holding exactly what was written; step 2 always there; no temp files.
void CheckRecovered(FileSystem* fs, Expect step1, Expect step3) {
  CheckpointStore store(fs, kRoot);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, store.ListSteps(kJob));
  std::vector<uint64_t> committed;
  for (const StepInfo& s : steps) {
    EXPECT_EQ(s.state, StepState::kCommitted)
        << "step " << s.step << " is " << StepStateName(s.state) << " after recovery: " << s.detail;
    if (s.state == StepState::kCommitted) committed.push_back(s.step);
  }
  auto has = [&](uint64_t step) { return std::find(committed.begin(), committed.end(), step) != committed.end(); };
  EXPECT_TRUE(has(2)) << "committed step 2 was lost";
  if (step1 != Expect::kEither) {
    EXPECT_EQ(has(1), step1 == Expect::kPresent) << "step 1";
  }
  if (step3 != Expect::kEither) {
    EXPECT_EQ(has(3), step3 == Expect::kPresent) << "step 3";
  }
  for (uint64_t step : committed) {
    SCOPED_TRACE(absl::StrCat("committed step ", step));
    absl::StatusOr<StepVerifyReport> report = store.VerifyStep(kJob, step, OneThread());
    ASSERT_THAT(report.status(), IsOk());
    for (const VerifyProblem& p : report->problems) ADD_FAILURE() << "verify: " << p.message;
    ExpectStepData(fs, step);
  }
  std::vector<std::string> temps;
  FindTempFiles(fs, kRoot, &temps);
  EXPECT_THAT(temps, IsEmpty());
}

TEST(CrashTest, CrashAtEveryOperationLosesNoCommittedStep) {
  const absl::Time start = absl::Now();
  // A run without faults numbers the operations.
  Progress ref;
  uint64_t total_ops = 0;
  {
    std::unique_ptr<World> w = NewWorld();
    ASSERT_THAT(RunSequence(*w, &ref), IsOk());
    total_ops = w->fi.operation_count();
    CheckRecovered(&w->mem, Expect::kAbsent, Expect::kPresent);
  }
  ASSERT_GT(total_ops, 20u) << "the sequence should take many operations";
  ASSERT_LT(ref.committed_at, ref.retained_at);

  uint64_t op = 0;
  int crashes = 0;
  for (;; ++op) {
    SCOPED_TRACE(absl::StrCat("crash at operation ", op, " of ", total_ops));
    std::unique_ptr<World> w = NewWorld();
    w->fi.FailAtOperation(op, Fault::kCrash);
    Progress p;
    const absl::Status s = RunSequence(*w, &p);
    if (!w->fi.crashed()) {
      // Past the last operation: the whole sequence ran.
      EXPECT_THAT(s, IsOk());
      break;
    }
    ++crashes;
    // Writing and committing must report the crash; cleanup may shrug off an
    // unreadable MANIFEST (it keeps such steps).
    if (op < ref.committed_at) {
      EXPECT_FALSE(s.ok()) << "a crash during \"" << p.call << "\" went unnoticed";
    }
    if (!s.ok()) {
      EXPECT_THAT(std::string(s.message()), HasSubstr("simulated crash")) << p.call;
    }

    // Restart: a fresh store on the surviving state, recovery, then checks.
    CheckpointStore recovered(&w->mem, kRoot);
    ASSERT_THAT(recovered.RemoveIncompleteSteps(kJob).status(), IsOk());
    // Step 3 exists exactly when its MANIFEST had become durable, i.e. the
    // crash came after CommitStep's last operation.
    const Expect step3 = op >= ref.committed_at ? Expect::kPresent : Expect::kAbsent;
    // Step 1 goes only in retention, MANIFEST first.
    const Expect step1 = op < ref.committed_at    ? Expect::kPresent
                         : op >= ref.retained_at ? Expect::kAbsent
                                                 : Expect::kEither;
    CheckRecovered(&w->mem, step1, step3);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_EQ(op, total_ops);
  EXPECT_EQ(crashes, static_cast<int>(total_ops));
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
}

// EIO or ENOSPC at one operation: the call fails with the fault's code, the
// committed steps stay intact, and cleanup leaves nothing half-written.
class IoFaultTest : public ::testing::TestWithParam<Fault> {};

TEST_P(IoFaultTest, FaultAtEveryOperation) {
  const Fault fault = GetParam();
  const absl::StatusCode want_code =
      fault == Fault::kEio ? absl::StatusCode::kDataLoss : absl::StatusCode::kResourceExhausted;
  const std::string want_errno = fault == Fault::kEio ? "(errno 5)" : "(errno 28)";
  uint64_t op = 0;
  int failures = 0;
  for (;; ++op) {
    SCOPED_TRACE(absl::StrCat("fault at operation ", op));
    std::unique_ptr<World> w = NewWorld();
    w->fi.FailAtOperation(op, fault);
    Progress p;
    const absl::Status s = RunSequence(*w, &p);
    const bool fired = w->fi.operation_count() > op;
    if (!fired) {
      EXPECT_THAT(s, IsOk());
      break;
    }
    if (!s.ok()) {
      ++failures;
      if (fault == Fault::kEio && p.call == "commit step 3" &&
          s.code() == absl::StatusCode::kFailedPrecondition) {
        // EIO reads as kDataLoss, which CommitStep cannot tell from a corrupt
        // shard: "do not retry" is acceptable, but the cause must be named.
        EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(want_errno)));
      } else {
        // Anything else (ENOSPC above all: retry later) keeps the fault's code.
        EXPECT_THAT(s, StatusIs(want_code, HasSubstr(want_errno))) << "during \"" << p.call << "\"";
      }
    }
    // Committed steps are intact right away, before any cleanup.
    {
      w->fi.Reset();
      CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<StepInfo> steps, w->store.ListSteps(kJob));
      bool has2 = false;
      for (const StepInfo& info : steps) has2 |= info.step == 2 && info.state == StepState::kCommitted;
      EXPECT_TRUE(has2) << "committed step 2 lost after a fault during \"" << p.call << "\": " << s;
    }
    // Cleanup (again, with the fault gone, in case it hit the cleanup itself).
    ASSERT_THAT(w->store.RemoveIncompleteSteps(kJob).status(), IsOk());
    const Expect step3 = p.committed_at != UINT64_MAX ? Expect::kPresent : Expect::kEither;
    const Expect step1 = p.call == "write step 3" || p.call == "commit step 3" ? Expect::kPresent : Expect::kEither;
    CheckRecovered(&w->fi, step1, step3);
    if (p.committed_at == UINT64_MAX && p.call != "commit step 3") {
      // Failed before committing: step 3 must not have appeared.
      CheckpointStore store(&w->mem, kRoot);
      EXPECT_FALSE(store.ReadManifest(kJob, 3).ok()) << "step 3 committed although " << p.call << " failed";
    }
    // What survives in memory also survives a crash now.
    w->mem.Crash();
    CheckpointStore restarted(&w->mem, kRoot);
    ASSERT_THAT(restarted.RemoveIncompleteSteps(kJob).status(), IsOk());
    CheckRecovered(&w->mem, Expect::kEither, p.committed_at != UINT64_MAX ? Expect::kPresent : Expect::kEither);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(op, 20u);
  EXPECT_GT(failures, 20);
}

INSTANTIATE_TEST_SUITE_P(Faults, IoFaultTest, ::testing::Values(Fault::kEio, Fault::kEnospc),
                         [](const ::testing::TestParamInfo<Fault>& param_info) {
                           return param_info.param == Fault::kEio ? std::string("Eio") : std::string("Enospc");
                         });

// A PrepareStep that failed part-way and was retried must still leave the job
// and step directories durable: a step committed afterwards survives a crash.
TEST(CrashTest, RetriedPrepareStepIsDurable) {
  for (uint64_t op = 0;; ++op) {
    SCOPED_TRACE(absl::StrCat("EIO at operation ", op, " of the first PrepareStep"));
    World w;
    w.fi.FailAtOperation(op, Fault::kEio);
    absl::Status first = w.store.PrepareStep(kJob, 1);
    const bool fired = w.fi.operation_count() > op;
    w.fi.Reset();
    if (!fired) {
      EXPECT_THAT(first, IsOk());
      break;
    }
    if (!first.ok()) {
      EXPECT_THAT(first, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("(errno 5)")));
      ASSERT_THAT(w.store.PrepareStep(kJob, 1), IsOk());  // the retry
    }
    for (uint32_t rank = 0; rank < kWorld; ++rank) {
      const RankData data = MakeRankData(1, rank);
      const std::vector<TensorSource> sources = Sources(data);
      ASSERT_THAT(w.store.WriteShard(kJob, 1, rank, kWorld, sources, SmallBlocks(), &w.pool).status(), IsOk());
    }
    ASSERT_THAT(w.store.CommitStep(kJob, 1, kWorld).status(), IsOk());
    w.mem.Crash();
    CheckpointStore after(&w.mem, kRoot);
    absl::StatusOr<std::optional<uint64_t>> latest = after.LatestCommittedStep(kJob);
    ASSERT_THAT(latest.status(), IsOk());
    EXPECT_EQ(*latest, std::optional<uint64_t>(1)) << "a committed step vanished in a crash";
    if (latest->has_value()) ExpectStepData(&w.mem, 1);
  }
}

}  // namespace
}  // namespace ckptd::storage
