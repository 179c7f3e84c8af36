#include "agent/drills.h"

#include <csignal>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/testing_agent_harness.h"
#include "base/clock.h"
#include "base/status_macros.h"  // CKPTD_STATUS_CONCAT_, used by testing_matchers.h
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "staging/staging.h"
#include "storage/layout.h"
#include "storage/mem_file_system.h"
#include "storage/store.h"
#include "storage/testing_data.h"

namespace ckptd::agent {
namespace {

using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::SizeIs;

constexpr char kRoot[] = "/ckpt";
constexpr char kJob[] = "job";
constexpr int32_t kPid = 4242;

using ::ckptd::testing::Eventually;

ckptd::v1::DrillOrder Order(uint64_t id, ckptd::v1::DrillScenario scenario, double duration = 0) {
  ckptd::v1::DrillOrder o;
  o.set_drill_id(id);
  o.set_scenario(scenario);
  o.set_job(kJob);
  o.set_rank(1);
  o.set_duration_seconds(duration);
  return o;
}

class DrillsTest : public ::testing::Test {
 protected:
  DrillsTest() {
    EXPECT_TRUE(mem_.CreateDir(kRoot).ok());
    options_.allowed = true;
    options_.storage_root = kRoot;
    options_.step_poll = absl::Milliseconds(1);
    options_.clock = &clock_;
    SetTrainer(kPid, 0);
  }

  DrillHooks Hooks() {
    DrillHooks h;
    h.find_trainer = [this](const std::string& job, uint32_t rank) -> std::optional<TrainerInfo> {
      absl::MutexLock l(&mu_);
      ++lookups_;
      if (job != kJob || rank != 1 || !trainer_) return std::nullopt;
      return trainer_;
    };
    h.signal = [this](int32_t pid, int sig) {
      absl::MutexLock l(&mu_);
      signals_.emplace_back(pid, sig);
      return absl::OkStatus();
    };
    h.kill_self = [this] {
      absl::MutexLock l(&mu_);
      ++self_kills_;
    };
    h.cut_off = [this](absl::Duration d) {
      absl::MutexLock l(&mu_);
      cut_offs_.push_back(d);
    };
    h.fault_fs = &fault_fs_;
    h.real_fs = &mem_;
    return h;
  }

  void SetTrainer(int32_t pid, uint64_t step) {
    absl::MutexLock l(&mu_);
    trainer_ = TrainerInfo{pid, step, kJob, 1};
  }
  std::vector<std::pair<int32_t, int>> signals() {
    absl::MutexLock l(&mu_);
    return signals_;
  }
  int self_kills() {
    absl::MutexLock l(&mu_);
    return self_kills_;
  }
  int lookups() {
    absl::MutexLock l(&mu_);
    return lookups_;
  }
  // Whether `n` threads (drills) wait on the clock, soon.
  bool Parked(int n = 1) {
    return Eventually([this, n] { return clock_.waiters() == n; });
  }
  std::vector<absl::Duration> cut_offs() {
    absl::MutexLock l(&mu_);
    return cut_offs_;
  }

  // Waits until drill `id` has a report that is ended or failed.
  static ckptd::v1::DrillReport Finished(DrillExecutor& ex, uint64_t id) {
    std::optional<ckptd::v1::DrillReport> r;
    EXPECT_TRUE(Eventually([&] {
      r = ex.Report(id);
      return r && (r->ended() || !r->error().empty());
    })) << "drill " << id << " did not finish";
    return r.value_or(ckptd::v1::DrillReport());
  }
  static ckptd::v1::DrillReport InjectedReport(DrillExecutor& ex, uint64_t id) {
    std::optional<ckptd::v1::DrillReport> r;
    EXPECT_TRUE(Eventually([&] {
      r = ex.Report(id);
      return r && (r->injected() || !r->error().empty());
    })) << "drill " << id << " was not injected";
    return r.value_or(ckptd::v1::DrillReport());
  }

  base::FakeClock clock_;
  const absl::Time start_ = clock_.Now();
  storage::MemFileSystem mem_;
  storage::FaultInjectionFileSystem fault_fs_{&mem_};
  DrillOptions options_;
  absl::Mutex mu_;
  std::optional<TrainerInfo> trainer_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int32_t, int>> signals_ ABSL_GUARDED_BY(mu_);
  int self_kills_ ABSL_GUARDED_BY(mu_) = 0;
  int lookups_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Duration> cut_offs_ ABSL_GUARDED_BY(mu_);
};

TEST_F(DrillsTest, NotAllowedReportsAnErrorAndDoesNothing) {
  options_.allowed = false;
  DrillExecutor ex(options_, Hooks());
  ex.Submit(Order(1, ckptd::v1::KILL_TRAINER));
  ckptd::v1::Heartbeat hb;
  ex.FillReports(&hb);
  ASSERT_THAT(hb.drill_reports(), SizeIs(1));
  EXPECT_EQ(hb.drill_reports(0).drill_id(), 1u);
  EXPECT_FALSE(hb.drill_reports(0).injected());
  EXPECT_EQ(hb.drill_reports(0).error(), "drills are not allowed on this agent; start it with --allow-drills");
  EXPECT_THAT(signals(), IsEmpty());
}

TEST_F(DrillsTest, KillTrainerSignalsItsPid) {
  SetTrainer(kPid, 12);
  DrillExecutor ex(options_, Hooks());
  ex.Submit(Order(1, ckptd::v1::KILL_TRAINER));
  const ckptd::v1::DrillReport r = Finished(ex, 1);
  EXPECT_TRUE(r.injected());
  EXPECT_GT(r.injected_unix_nanos(), 0);
  EXPECT_TRUE(r.ended());
  EXPECT_EQ(r.error(), "");
  EXPECT_THAT(r.detail(), AllOf(HasSubstr("SIGKILL"), HasSubstr("pid 4242"), HasSubstr("rank 1"),
                                HasSubstr("job job"), HasSubstr("step 12")));
  EXPECT_THAT(signals(), ElementsAre(Pair(kPid, SIGKILL)));
}

TEST_F(DrillsTest, KillTrainerOfAnUnknownRankReportsAnError) {
  DrillExecutor ex(options_, Hooks());
  ckptd::v1::DrillOrder o = Order(1, ckptd::v1::KILL_TRAINER);
  o.set_rank(7);
  ex.Submit(o);
  const ckptd::v1::DrillReport r = Finished(ex, 1);
  EXPECT_FALSE(r.injected());
  EXPECT_THAT(r.error(), AllOf(HasSubstr("no trainer"), HasSubstr("rank 7")));
  // A trainer without a usable pid is never signalled (kill(0) would hit the group).
  SetTrainer(0, 0);
  ex.Submit(Order(2, ckptd::v1::KILL_TRAINER));
  EXPECT_THAT(Finished(ex, 2).error(), HasSubstr("pid"));
  EXPECT_THAT(signals(), IsEmpty());
}

TEST_F(DrillsTest, ResubmittedOrderRunsOnce) {
  DrillExecutor ex(options_, Hooks());
  for (int i = 0; i < 5; ++i) ex.Submit(Order(9, ckptd::v1::KILL_TRAINER));
  Finished(ex, 9);
  ckptd::v1::HeartbeatAck ack;
  *ack.add_drills() = Order(9, ckptd::v1::KILL_TRAINER);
  ex.OnAck(ack);
  // Submit decides at once; a new drill after the resends runs and ends, and
  // the resends did not run.
  ex.Submit(Order(10, ckptd::v1::KILL_TRAINER));
  Finished(ex, 10);
  EXPECT_THAT(signals(), SizeIs(2));
}

TEST_F(DrillsTest, AtStepWaitsUntilTheRankReachesIt) {
  SetTrainer(kPid, 3);
  DrillExecutor ex(options_, Hooks());
  ckptd::v1::DrillOrder o = Order(1, ckptd::v1::KILL_TRAINER);
  o.set_at_step(5);
  ex.Submit(o);
  // The drill looks at the rank's step every step_poll of the clock, and
  // waits on while it is short of 5.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Parked());
    const int looked = lookups();
    clock_.Advance(options_.step_poll);
    ASSERT_TRUE(Parked());
    EXPECT_GT(lookups(), looked);
  }
  EXPECT_THAT(signals(), IsEmpty());
  EXPECT_EQ(ex.Report(1), std::nullopt);  // nothing to report while waiting
  SetTrainer(kPid, 5);
  clock_.Advance(options_.step_poll);
  EXPECT_THAT(Finished(ex, 1).detail(), HasSubstr("step 5"));
  EXPECT_THAT(signals(), ElementsAre(Pair(kPid, SIGKILL)));
}

TEST_F(DrillsTest, AtStepWaitIsBounded) {
  options_.max_wait_for_step = absl::Hours(1);
  SetTrainer(kPid, 3);
  DrillExecutor ex(options_, Hooks());
  ckptd::v1::DrillOrder o = Order(1, ckptd::v1::KILL_TRAINER);
  o.set_at_step(100);
  ex.Submit(o);
  ASSERT_TRUE(Parked());
  clock_.Advance(absl::Minutes(59));
  ASSERT_TRUE(Parked());  // looked again, and waits on
  EXPECT_EQ(ex.Report(1), std::nullopt);
  clock_.Advance(absl::Minutes(1));
  EXPECT_THAT(Finished(ex, 1).error(), AllOf(HasSubstr("did not reach step 100 within 1h"),
                                             HasSubstr("last seen at step 3")));
  EXPECT_THAT(signals(), IsEmpty());
}

TEST_F(DrillsTest, HangTrainerStopsAndResumesIt) {
  DrillExecutor ex(options_, Hooks());
  ex.Submit(Order(1, ckptd::v1::HANG_TRAINER, 60));
  InjectedReport(ex, 1);
  ASSERT_TRUE(Parked());
  clock_.Advance(absl::Seconds(59));
  EXPECT_EQ(clock_.waiters(), 1);  // saw 59 s go by and hangs on
  EXPECT_THAT(signals(), ElementsAre(Pair(kPid, SIGSTOP)));
  clock_.Advance(absl::Seconds(1));
  const ckptd::v1::DrillReport r = Finished(ex, 1);
  EXPECT_TRUE(r.injected());
  EXPECT_TRUE(r.ended());
  EXPECT_EQ(r.injected_unix_nanos(), absl::ToUnixNanos(start_));
  EXPECT_EQ(r.ended_unix_nanos(), absl::ToUnixNanos(start_ + absl::Seconds(60)));
  EXPECT_THAT(r.detail(), AllOf(HasSubstr("SIGSTOP"), HasSubstr("pid 4242"), HasSubstr("SIGCONT sent")));
  EXPECT_THAT(signals(), ElementsAre(Pair(kPid, SIGSTOP), Pair(kPid, SIGCONT)));
}

TEST_F(DrillsTest, HangWithoutDurationIsRefused) {
  DrillExecutor ex(options_, Hooks());
  ex.Submit(Order(1, ckptd::v1::HANG_TRAINER, 0));
  EXPECT_THAT(Finished(ex, 1).error(), HasSubstr("duration_seconds must be positive"));
  EXPECT_THAT(signals(), IsEmpty());
}

TEST_F(DrillsTest, DestructorDuringHangResumesTheTrainer) {
  {
    DrillExecutor ex(options_, Hooks());
    ex.Submit(Order(1, ckptd::v1::HANG_TRAINER, 600));
    InjectedReport(ex, 1);
    ASSERT_TRUE(Parked());
  }
  // The clock never moved: only the destructor ended the hang.
  EXPECT_EQ(clock_.Now(), start_);
  EXPECT_THAT(signals(), ElementsAre(Pair(kPid, SIGSTOP), Pair(kPid, SIGCONT)));
}

TEST_F(DrillsTest, KillAgentWaitsForItsReportToBeDelivered) {
  options_.kill_agent_grace = absl::Seconds(30);
  DrillExecutor ex(options_, Hooks());
  ex.Submit(Order(1, ckptd::v1::KILL_AGENT));
  InjectedReport(ex, 1);
  // The drill waits for delivery; each Advance makes it look again, and a
  // drill still waiting after one has not killed anything.
  ASSERT_TRUE(Parked());
  clock_.Advance(absl::Seconds(29));
  EXPECT_EQ(clock_.waiters(), 1);
  EXPECT_EQ(self_kills(), 0);
  ckptd::v1::Heartbeat hb;
  ex.FillReports(&hb);
  ASSERT_THAT(hb.drill_reports(), SizeIs(1));
  EXPECT_TRUE(hb.drill_reports(0).injected());
  clock_.Advance(absl::ZeroDuration());
  EXPECT_EQ(clock_.waiters(), 1);
  EXPECT_EQ(self_kills(), 0);  // sent, not yet answered
  ckptd::v1::HeartbeatAck unknown;
  ex.OnAck(unknown);  // the coordinator did not take it
  clock_.Advance(absl::ZeroDuration());
  EXPECT_EQ(clock_.waiters(), 1);
  EXPECT_EQ(self_kills(), 0);
  ckptd::v1::Heartbeat again;
  ex.FillReports(&again);
  ASSERT_THAT(again.drill_reports(), SizeIs(1));
  ckptd::v1::HeartbeatAck ack;
  ack.set_known(true);
  ex.OnAck(ack);
  EXPECT_TRUE(Eventually([&] { return self_kills() == 1; }));
}

TEST_F(DrillsTest, KillAgentWaitsForDeliveryOnlySoLong) {
  options_.kill_agent_grace = absl::Seconds(2);
  DrillExecutor ex(options_, Hooks());
  ex.Submit(Order(1, ckptd::v1::KILL_AGENT));
  ASSERT_TRUE(Parked());
  clock_.Advance(absl::Seconds(2));
  EXPECT_TRUE(Eventually([&] { return self_kills() == 1; }));
}

TEST_F(DrillsTest, KillNodeKillsEveryTrainerThenTheAgent) {
  options_.kill_agent_grace = absl::Seconds(2);
  DrillHooks hooks = Hooks();
  hooks.list_trainers = [] {
    TrainerInfo a{101, 40, "llm", 0};
    TrainerInfo b{102, 41, "llm", 1};
    TrainerInfo unusable{1, 0, "llm", 2};  // kill(1) would reach init's group: never
    return std::vector<TrainerInfo>{a, b, unusable};
  };
  DrillExecutor ex(options_, hooks);
  ex.Submit(Order(1, ckptd::v1::KILL_NODE));
  ASSERT_TRUE(Parked());  // the report waits for delivery, for 2 s at most
  EXPECT_EQ(self_kills(), 0);
  clock_.Advance(absl::Seconds(2));
  EXPECT_TRUE(Eventually([&] { return self_kills() == 1; }));
  EXPECT_THAT(signals(), ElementsAre(std::make_pair(101, SIGKILL), std::make_pair(102, SIGKILL)));
  std::optional<ckptd::v1::DrillReport> r = ex.Report(1);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->injected());
  EXPECT_THAT(r->detail(), AllOf(HasSubstr("node crash: SIGKILL sent to 2 trainer(s)"),
                                 HasSubstr("rank 1 of job llm (pid 102, at step 41)"), HasSubstr("then to agent pid")));
  // An agent that cannot list its trainers says so.
  DrillExecutor bare(options_, Hooks());
  bare.Submit(Order(2, ckptd::v1::KILL_NODE));
  EXPECT_THAT(Finished(bare, 2).error(), HasSubstr("cannot list its trainers"));
  EXPECT_EQ(self_kills(), 1);
}

TEST_F(DrillsTest, CutOffAgentCutsTheLinkForTheDuration) {
  DrillExecutor ex(options_, Hooks());
  ex.Submit(Order(1, ckptd::v1::CUT_OFF_AGENT, 90));
  InjectedReport(ex, 1);
  ASSERT_TRUE(Parked());
  clock_.Advance(absl::Seconds(89));
  EXPECT_EQ(clock_.waiters(), 1);
  EXPECT_FALSE(ex.Report(1)->ended());
  clock_.Advance(absl::Seconds(1));
  const ckptd::v1::DrillReport r = Finished(ex, 1);
  EXPECT_TRUE(r.injected());
  EXPECT_TRUE(r.ended());
  EXPECT_THAT(r.detail(), AllOf(HasSubstr("cut off"), HasSubstr("reconnecting")));
  EXPECT_EQ(r.ended_unix_nanos() - r.injected_unix_nanos(), absl::ToInt64Nanoseconds(absl::Seconds(90)));
  EXPECT_THAT(cut_offs(), ElementsAre(absl::Seconds(90)));  // lifted by the link itself, not the drill
}

TEST_F(DrillsTest, DestructorLiftsACutOff) {
  {
    DrillExecutor ex(options_, Hooks());
    ex.Submit(Order(1, ckptd::v1::CUT_OFF_AGENT, 600));
    InjectedReport(ex, 1);
  }
  EXPECT_THAT(cut_offs(), ElementsAre(absl::Seconds(600), absl::ZeroDuration()));
}

TEST_F(DrillsTest, StorageEioFailsWritesAndReadsUntilLifted) {
  const std::string path = absl::StrCat(kRoot, "/file");
  ASSERT_TRUE(storage::WriteFileAtomically(&fault_fs_, path, "before").ok());
  DrillExecutor ex(options_, Hooks());
  ex.Submit(Order(1, ckptd::v1::STORAGE_EIO, 60));
  const ckptd::v1::DrillReport injected = InjectedReport(ex, 1);
  EXPECT_THAT(injected.detail(), AllOf(HasSubstr("EIO"), HasSubstr(kRoot)));
  ASSERT_TRUE(Parked());
  EXPECT_THAT(storage::WriteFileAtomically(&fault_fs_, path, "during"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
  EXPECT_THAT(storage::ReadFileToString(&fault_fs_, path), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
  clock_.Advance(absl::Seconds(60));
  EXPECT_TRUE(Finished(ex, 1).ended());
  EXPECT_TRUE(storage::WriteFileAtomically(&fault_fs_, path, "after").ok());
  EXPECT_THAT(storage::ReadFileToString(&fault_fs_, path), IsOkAndHolds(std::string("after")));
}

TEST_F(DrillsTest, StorageEnospcFailsWritesButNotReads) {
  const std::string path = absl::StrCat(kRoot, "/file");
  ASSERT_TRUE(storage::WriteFileAtomically(&fault_fs_, path, "before").ok());
  DrillExecutor ex(options_, Hooks());
  ex.Submit(Order(1, ckptd::v1::STORAGE_ENOSPC, 60));
  InjectedReport(ex, 1);
  ASSERT_TRUE(Parked());
  EXPECT_THAT(storage::WriteFileAtomically(&fault_fs_, path, "during"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr(path)));
  EXPECT_THAT(storage::ReadFileToString(&fault_fs_, path), IsOkAndHolds(std::string("before")));
  clock_.Advance(absl::Seconds(60));
  EXPECT_TRUE(Finished(ex, 1).ended());
  EXPECT_TRUE(storage::WriteFileAtomically(&fault_fs_, path, "after").ok());
}

TEST_F(DrillsTest, StorageSlowDelaysReadsAndWritesUntilLifted) {
  DrillExecutor ex(options_, Hooks());
  ckptd::v1::DrillOrder o = Order(1, ckptd::v1::STORAGE_SLOW, 60);
  o.set_slow_seconds(0.02);
  ex.Submit(o);
  InjectedReport(ex, 1);
  ASSERT_TRUE(Parked());
  EXPECT_EQ(fault_fs_.LatencyFor(absl::StrCat(kRoot, "/job/x")), absl::Milliseconds(20));
  clock_.Advance(absl::Seconds(60));
  EXPECT_TRUE(Finished(ex, 1).ended());
  EXPECT_EQ(fault_fs_.LatencyFor(absl::StrCat(kRoot, "/job/x")), absl::ZeroDuration());
}

TEST_F(DrillsTest, OneStorageDrillAtATime) {
  DrillExecutor ex(options_, Hooks());
  ex.Submit(Order(1, ckptd::v1::STORAGE_EIO, 600));
  InjectedReport(ex, 1);
  ex.Submit(Order(2, ckptd::v1::STORAGE_ENOSPC, 1));
  EXPECT_THAT(Finished(ex, 2).error(), HasSubstr("storage drill 1 is still running"));
}

TEST_F(DrillsTest, DestructorLiftsAStorageFault) {
  const std::string path = absl::StrCat(kRoot, "/file");
  {
    DrillExecutor ex(options_, Hooks());
    ex.Submit(Order(1, ckptd::v1::STORAGE_EIO, 600));
    InjectedReport(ex, 1);
    EXPECT_FALSE(storage::WriteFileAtomically(&fault_fs_, path, "during").ok());
  }
  EXPECT_TRUE(storage::WriteFileAtomically(&fault_fs_, path, "after").ok());
}

TEST_F(DrillsTest, StorageDrillWithoutAFaultFileSystemReportsAnError) {
  DrillHooks hooks = Hooks();
  hooks.fault_fs = nullptr;
  DrillExecutor ex(options_, std::move(hooks));
  ex.Submit(Order(1, ckptd::v1::STORAGE_EIO, 1));
  EXPECT_THAT(Finished(ex, 1).error(), HasSubstr("fault-injecting file system"));
}

TEST_F(DrillsTest, CorruptShardIsFoundByVerifyStep) {
  storage::CheckpointStore store(&mem_, kRoot);
  ASSERT_TRUE(store.PrepareStep(kJob, 7).ok());
  std::vector<testing::RankData> data;
  for (uint32_t rank = 0; rank < 2; ++rank) data.push_back(testing::MakeRankData(7, rank, 5000, 64));
  for (uint32_t rank = 0; rank < 2; ++rank) {
    const std::vector<storage::TensorSource> sources = testing::RankSources(data[rank], "params", "rng");
    ASSERT_TRUE(store.WriteShard(kJob, 7, rank, 2, sources, testing::SmallBlocks()).ok());
  }
  ASSERT_TRUE(store.CommitStep(kJob, 7, 2).ok());
  const std::string shard = storage::ShardPath(kRoot, kJob, 7, 1);
  absl::StatusOr<storage::FileInfo> before = mem_.Stat(shard);
  ASSERT_TRUE(before.ok());
  absl::StatusOr<std::string> old_bytes = storage::ReadFileToString(&mem_, shard);
  ASSERT_TRUE(old_bytes.ok());

  DrillExecutor ex(options_, Hooks());
  ex.Submit(Order(1, ckptd::v1::CORRUPT_SHARD));
  const ckptd::v1::DrillReport r = Finished(ex, 1);
  ASSERT_EQ(r.error(), "");
  EXPECT_TRUE(r.injected());
  EXPECT_EQ(r.step(), 7u);
  EXPECT_THAT(r.detail(), AllOf(HasSubstr(shard), HasSubstr("offset"), HasSubstr("tensor '"), HasSubstr("chunk 0"),
                                HasSubstr("step 7")));
  EXPECT_THAT(mem_.Stat(shard), IsOkAndHolds(::testing::Field(&storage::FileInfo::size, before->size)));
  // Exactly one byte changed, the one the report names; no temp file left.
  absl::StatusOr<std::string> new_bytes = storage::ReadFileToString(&mem_, shard);
  ASSERT_TRUE(new_bytes.ok());
  std::vector<size_t> changed;
  for (size_t i = 0; i < old_bytes->size() && i < new_bytes->size(); ++i) {
    if ((*old_bytes)[i] != (*new_bytes)[i]) changed.push_back(i);
  }
  ASSERT_THAT(changed, SizeIs(1));
  EXPECT_THAT(r.detail(), HasSubstr(absl::StrCat("offset ", changed[0], " ")));
  EXPECT_FALSE(mem_.Stat(absl::StrCat(shard, storage::kTempSuffix)).ok());

  absl::StatusOr<storage::StepVerifyReport> verify = store.VerifyStep(kJob, 7, testing::OneThread());
  ASSERT_TRUE(verify.ok()) << verify.status();
  ASSERT_THAT(verify->problems, SizeIs(1));
  EXPECT_THAT(verify->problems[0].file, HasSubstr("rank-1.shard"));
  EXPECT_EQ(verify->problems[0].chunk, 0);
  EXPECT_FALSE(verify->problems[0].tensor.empty());
  EXPECT_THAT(r.detail(), HasSubstr(absl::StrCat("tensor '", verify->problems[0].tensor, "'")));
}

TEST_F(DrillsTest, CorruptShardWithoutACommittedStepReportsAnError) {
  DrillExecutor ex(options_, Hooks());
  ex.Submit(Order(1, ckptd::v1::CORRUPT_SHARD));
  EXPECT_THAT(Finished(ex, 1).error(), HasSubstr("job"));
}

// CORRUPT_MEMORY against a real agent core: rank 0 of a one-rank job, its
// steps committed by the agent itself, kept in its staging slots.
class CorruptMemoryTest : public DrillsTest {
 protected:
  static TrainerRegistration Rank0() {
    TrainerRegistration r;
    r.job = kJob;
    r.rank = 0;
    r.world_size = 1;
    r.local_world_size = 1;
    r.pid = kPid;
    r.buffers = {Buffer("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 3000),
                 Buffer("cursor", ckptd::v1::DATA_CURSOR, ckptd::v1::BYTES, 24)};
    return r;
  }
  // Drill hooks that act on `agent`'s trainers (signals are only recorded).
  DrillHooks HooksOf(AgentCore& agent) {
    DrillHooks h = Hooks();
    h.find_trainer = [&agent](const std::string& job, uint32_t rank) { return agent.FindTrainer(job, rank); };
    h.corrupt_kept = [&agent](const std::string& job, uint32_t rank, uint64_t step) {
      return agent.CorruptKeptStep(job, rank, step);
    };
    return h;
  }
  static ckptd::v1::DrillOrder CorruptOrder(uint64_t id, uint64_t step) {
    ckptd::v1::DrillOrder o = Order(id, ckptd::v1::CORRUPT_MEMORY);
    o.set_rank(0);
    o.set_step(step);
    return o;
  }
  // The bytes of every slot of `seg`.
  static std::vector<std::string> Slots(const staging::StagingSegment& seg) {
    std::vector<std::string> slots;
    for (uint32_t i = 0; i < seg.slots(); ++i) {
      slots.emplace_back(reinterpret_cast<const char*>(seg.slot_data(i)), seg.slot_bytes());
    }
    return slots;
  }
  // The slot of `seg` that keeps `step`.
  static std::optional<uint32_t> SlotKeeping(const staging::StagingSegment& seg, uint64_t step) {
    for (uint32_t i = 0; i < seg.slots(); ++i) {
      if (seg.state(i) == staging::SlotState::kKept && seg.step(i) == step) return i;
    }
    return std::nullopt;
  }
};

TEST_F(CorruptMemoryTest, FlipsAByteOfTheKeptCopyOfTheNewestCommittedStepThenKillsTheTrainer) {
  AgentCore agent(&mem_, TestAgentOptions("drills"));
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(Rank0()));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<staging::StagingSegment> seg, staging::StagingSegment::Open(h.segment));
  for (uint64_t step : {1u, 2u}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *seg, h, step));
  const std::optional<uint32_t> slot_of_1 = SlotKeeping(*seg, 1);
  const std::optional<uint32_t> slot_of_2 = SlotKeeping(*seg, 2);
  ASSERT_TRUE(slot_of_1.has_value() && slot_of_2.has_value());
  const std::vector<std::string> before = Slots(*seg);
  {
    DrillExecutor ex(options_, HooksOf(agent));
    // Step 1 was the newest committed step when the drill was ordered; step
    // 2 committed since: a restart restores step 2, so its copy is damaged.
    ex.Submit(CorruptOrder(1, 1));
    const ckptd::v1::DrillReport r = Finished(ex, 1);
    ASSERT_EQ(r.error(), "");
    EXPECT_TRUE(r.injected());
    EXPECT_TRUE(r.ended());
    EXPECT_EQ(r.step(), 2u);
    EXPECT_THAT(r.detail(), AllOf(HasSubstr("flipped the byte at offset 6000 of buffer 'params' in the kept copy of "
                                            "step 2 of rank 0 of job job"),
                                  HasSubstr("SIGKILL sent to pid 4242 (rank 0 of job job")));
  }
  EXPECT_THAT(signals(), ElementsAre(Pair(kPid, SIGKILL)));
  // One byte of step 2's kept copy changed, and the copy is still kept.
  const std::vector<std::string> after = Slots(*seg);
  EXPECT_EQ(after[*slot_of_1], before[*slot_of_1]);
  std::vector<size_t> changed;
  for (size_t i = 0; i < before[*slot_of_2].size(); ++i) {
    if (after[*slot_of_2][i] != before[*slot_of_2][i]) changed.push_back(i);
  }
  EXPECT_THAT(changed, ElementsAre(h.offsets[0] + 6000));
  EXPECT_EQ(seg->state(*slot_of_2), staging::SlotState::kKept);
  EXPECT_EQ(seg->step(*slot_of_2), 2u);

  // The trainer's successor gets the segment back; the damage is caught and
  // step 2 is read from the storage root, intact.
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id, /*died=*/true));
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle again, agent.Register(Rank0()));
  ASSERT_EQ(again.segment, h.segment);
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult restored, agent.Restore(again.trainer_id, absl::Seconds(10)));
  EXPECT_EQ(restored.step, std::optional<uint64_t>(2));
  EXPECT_EQ(restored.source, RestoreSource::kRoot);
  EXPECT_EQ(seg->slot_data(restored.slot)[h.offsets[0] + 6000], 2);
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(again.trainer_id));
  EXPECT_EQ(st.memory_rejected, 1u);
  CKPTD_ASSERT_OK(seg->Release(restored.slot));
  CKPTD_ASSERT_OK(agent.TrainerExited(again.trainer_id));
}

TEST_F(CorruptMemoryTest, ARankWithoutACopyOfTheStepIsAClearErrorAndNothingIsTouched) {
  AgentCore agent(&mem_, TestAgentOptions("drills"));
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(Rank0()));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<staging::StagingSegment> seg, staging::StagingSegment::Open(h.segment));
  for (uint64_t step : {1u, 2u}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *seg, h, step));
  const std::vector<std::string> before = Slots(*seg);
  // Asked directly: no such rank, a step it does not keep, an older step
  // than one it keeps (which a restart would restore instead).
  EXPECT_THAT(agent.CorruptKeptStep(kJob, 5, 2),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no trainer of rank 5 of job job")));
  EXPECT_THAT(agent.CorruptKeptStep(kJob, 0, 7),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("rank 0 of job job keeps no copy of step 7 in memory (it keeps steps 1, 2)")));
  EXPECT_THAT(agent.CorruptKeptStep(kJob, 0, 1),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("holds step 2, newer than step 1")));
  // Step 5 committed by others (another run of the job wrote it): the rank
  // keeps no copy of it, and the drill says so and kills nothing.
  storage::CheckpointStore store(&mem_, kRoot);
  CKPTD_ASSERT_OK(store.PrepareStep(kJob, 5));
  const testing::RankData data = testing::MakeRankData(5, 0, 3000, 24);
  CKPTD_ASSERT_OK(
      store.WriteShard(kJob, 5, 0, 1, testing::RankSources(data, "params", "cursor"), testing::SmallBlocks()).status());
  CKPTD_ASSERT_OK(store.CommitStep(kJob, 5, 1).status());
  {
    DrillExecutor ex(options_, HooksOf(agent));
    ex.Submit(CorruptOrder(1, 2));
    EXPECT_THAT(Finished(ex, 1).error(), HasSubstr("rank 0 of job job keeps no copy of step 5 in memory (it keeps "
                                                   "steps 1, 2)"));
  }
  EXPECT_THAT(signals(), IsEmpty());
  EXPECT_EQ(Slots(*seg), before);
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

// The trainer gave up the kept copy of the committed step for its next
// snapshot (no slot was free) before the agent heard of the commit: that
// snapshot may commit next, so the drill is told to look again, not that the
// rank keeps no copy.
TEST_F(CorruptMemoryTest, ACopyGivenUpForANewerSnapshotMakesTheDrillWaitForThatOne) {
  AgentCore agent(&mem_, TestAgentOptions("drills"));
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(Rank0()));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<staging::StagingSegment> seg, staging::StagingSegment::Open(h.segment));
  for (uint64_t step : {1u, 2u}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *seg, h, step));
  // Both kept copies given up: step 1's for one snapshot, step 2's (the
  // pinned one, last) for another.
  std::vector<uint32_t> filling;
  for (int i = 0; i < 2; ++i) {
    CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::ZeroDuration()));
    filling.push_back(slot);
  }
  const std::vector<std::string> before = Slots(*seg);
  EXPECT_THAT(agent.CorruptKeptStep(kJob, 0, 2),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("rank 0 of job job keeps no copy of step 2 in memory while it takes a newer "
                                 "snapshot in staging slot")));
  // Once the trainer is done with them, the rank keeps no copy: a clear error.
  for (uint32_t slot : filling) CKPTD_ASSERT_OK(seg->Abandon(slot));
  EXPECT_THAT(agent.CorruptKeptStep(kJob, 0, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("rank 0 of job job keeps no copy of step 2 in memory (it keeps no step)")));
  EXPECT_EQ(Slots(*seg), before);
  CKPTD_ASSERT_OK(agent.TrainerExited(h.trainer_id));
}

TEST_F(DrillsTest, CorruptMemoryWaitsWhileANewerStepMayStillCommit) {
  options_.max_wait_for_commit = absl::Seconds(1);
  int asked = 0;
  absl::Status answer = absl::UnavailableError("rank 1 of job job holds step 8, newer than step 7, in staging slot 1");
  DrillHooks hooks = Hooks();
  hooks.corrupt_kept = [&](const std::string& job, uint32_t rank, uint64_t step) -> absl::StatusOr<std::string> {
    absl::MutexLock l(&mu_);
    ++asked;
    EXPECT_EQ(step, 7u);  // nothing committed in storage: the order's step
    if (!answer.ok()) return answer;
    return std::string("flipped a byte of step 7");
  };
  DrillExecutor ex(options_, hooks);
  ckptd::v1::DrillOrder o = Order(1, ckptd::v1::CORRUPT_MEMORY);
  o.set_step(7);
  ex.Submit(o);
  // Asked again every step_poll, and nothing is killed meanwhile.
  ASSERT_TRUE(Parked());
  clock_.Advance(options_.step_poll);
  ASSERT_TRUE(Parked());
  EXPECT_THAT(signals(), IsEmpty());
  {
    absl::MutexLock l(&mu_);
    EXPECT_EQ(asked, 2);
    answer = absl::OkStatus();
  }
  clock_.Advance(options_.step_poll);
  const ckptd::v1::DrillReport r = Finished(ex, 1);
  EXPECT_EQ(r.step(), 7u);
  EXPECT_THAT(r.detail(), AllOf(HasSubstr("flipped a byte of step 7"), HasSubstr("SIGKILL sent to pid 4242")));
  EXPECT_THAT(signals(), ElementsAre(Pair(kPid, SIGKILL)));

  // Only so long; and an agent without the hook says so.
  {
    absl::MutexLock l(&mu_);
    answer = absl::UnavailableError("rank 1 of job job holds step 8, newer than step 7, in staging slot 1");
  }
  ckptd::v1::DrillOrder late = o;
  late.set_drill_id(2);
  ex.Submit(late);
  ASSERT_TRUE(Parked());
  clock_.Advance(absl::Seconds(1));
  EXPECT_THAT(Finished(ex, 2).error(), HasSubstr("holds step 8, newer than step 7, in staging slot 1, and it did "
                                                 "not commit within 1s"));
  EXPECT_THAT(signals(), SizeIs(1));
  DrillHooks bare_hooks = Hooks();
  DrillExecutor bare(options_, bare_hooks);
  bare.Submit(o);
  EXPECT_THAT(Finished(bare, 1).error(), HasSubstr("keeps no steps in memory"));
}

TEST_F(DrillsTest, ReportsAreSentUntilDeliveredAndAgainWhenTheyChange) {
  DrillExecutor ex(options_, Hooks());
  ex.Submit(Order(1, ckptd::v1::HANG_TRAINER, 60));
  InjectedReport(ex, 1);
  ASSERT_TRUE(Parked());
  // Sent in every heartbeat until one carrying it is answered.
  ckptd::v1::Heartbeat hb1;
  ex.FillReports(&hb1);
  ASSERT_THAT(hb1.drill_reports(), SizeIs(1));
  ckptd::v1::Heartbeat hb2;
  ex.FillReports(&hb2);  // the answer to hb1 never came
  ASSERT_THAT(hb2.drill_reports(), SizeIs(1));
  ex.Delivered();
  ckptd::v1::Heartbeat hb3;
  ex.FillReports(&hb3);
  EXPECT_THAT(hb3.drill_reports(), IsEmpty());
  ex.Delivered();
  // The drill ends: its new state goes out until delivered.
  clock_.Advance(absl::Seconds(60));
  Finished(ex, 1);
  ckptd::v1::Heartbeat hb4;
  ex.FillReports(&hb4);
  ASSERT_THAT(hb4.drill_reports(), SizeIs(1));
  EXPECT_TRUE(hb4.drill_reports(0).ended());
  ex.Delivered();
  ckptd::v1::Heartbeat hb5;
  ex.FillReports(&hb5);
  EXPECT_THAT(hb5.drill_reports(), IsEmpty());
}

TEST_F(DrillsTest, AReportChangedWhileInFlightIsSentAgain) {
  DrillExecutor ex(options_, Hooks());
  ex.Submit(Order(1, ckptd::v1::HANG_TRAINER, 60));
  InjectedReport(ex, 1);
  ASSERT_TRUE(Parked());
  ckptd::v1::Heartbeat hb1;
  ex.FillReports(&hb1);
  ASSERT_THAT(hb1.drill_reports(), SizeIs(1));
  EXPECT_FALSE(hb1.drill_reports(0).ended());
  clock_.Advance(absl::Seconds(60));
  Finished(ex, 1);  // changes after hb1 went out
  ex.Delivered();
  ckptd::v1::Heartbeat hb2;
  ex.FillReports(&hb2);
  ASSERT_THAT(hb2.drill_reports(), SizeIs(1));
  EXPECT_TRUE(hb2.drill_reports(0).ended());
}

}  // namespace
}  // namespace ckptd::agent
