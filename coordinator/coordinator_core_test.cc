#include "coordinator/coordinator_core.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/layout.h"
#include "storage/status_macros.h"
#include "storage/mem_file_system.h"
#include "storage/testing_data.h"
#include "storage/testing_matchers.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using v1 = ::ckptd::v1::RestorePlanResponse;

constexpr char kJob[] = "llm-7b";
constexpr char kRoot[] = "/ckpt";

class CoordinatorCoreTest : public ::testing::Test {
 protected:
  CoordinatorCoreTest() { Reset(); }

  void Reset() {
    core_ = std::make_unique<CoordinatorCore>(&store_, state_.get(), &clock_, options_);
    CKPTD_EXPECT_OK(core_->Recover());
  }

  // Registers node `node` hosting `ranks` of kJob (world `world`).
  uint64_t Register(const std::string& node, std::vector<uint32_t> ranks, uint32_t world = 4,
                    bool drills_allowed = false) {
    ckptd::v1::RegisterAgentRequest req;
    req.set_node_id(node);
    req.set_drills_allowed(drills_allowed);
    for (uint32_t r : ranks) {
      ckptd::v1::RankInfo* info = req.add_ranks();
      info->set_job(kJob);
      info->set_rank(r);
      info->set_world_size(world);
      info->set_pid(1000 + static_cast<int>(r));
    }
    absl::StatusOr<ckptd::v1::RegisterAgentResponse> resp = core_->RegisterAgent(req);
    EXPECT_THAT(resp.status(), IsOk());
    sessions_[node] = resp.ok() ? resp->session() : 0;
    ranks_[node] = req;
    return sessions_[node];
  }

  absl::StatusOr<ckptd::v1::HeartbeatAck> Beat(const std::string& node, std::vector<std::pair<uint32_t, uint64_t>> progress = {},
                                               double step_seconds = 0.1) {
    ckptd::v1::Heartbeat hb;
    hb.set_node_id(node);
    hb.set_session(sessions_[node]);
    for (const auto& r : ranks_[node].ranks()) *hb.add_ranks() = r;
    for (const auto& [rank, step] : progress) {
      ckptd::v1::RankProgress* p = hb.add_progress();
      p->set_job(kJob);
      p->set_rank(rank);
      p->set_step(step);
      p->set_step_seconds(step_seconds);
    }
    return core_->OnHeartbeat(hb);
  }

  // Writes a real shard of (step, rank): the report its agent would send.
  absl::StatusOr<ckptd::v1::ShardReport> Write(uint64_t step, uint32_t rank, uint32_t world = 4,
                                               uint64_t incarnation = 0) {
    absl::Status prep = store_.PrepareStep(kJob, step);
    if (!prep.ok()) return prep;
    ckptd::testing::RankData data = ckptd::testing::MakeRankData(step, rank, 256, 16);
    std::vector<storage::TensorSource> src = ckptd::testing::RankSources(data, "w", "rng");
    absl::StatusOr<storage::ShardWriteResult> w = store_.WriteShard(kJob, step, rank, world, src);
    if (!w.ok()) return w.status();
    ckptd::v1::ShardReport r;
    r.set_job(kJob);
    r.set_step(step);
    r.set_world_size(world);
    r.set_incarnation(incarnation);
    r.mutable_shard()->set_rank(rank);
    r.mutable_shard()->set_file_length(w->file_length);
    r.mutable_shard()->set_index_xxh3(w->index_xxh3);
    r.mutable_shard()->set_persist_seconds(0.25);
    r.mutable_shard()->set_raw_bytes(w->raw_bytes);
    r.mutable_shard()->set_stored_bytes(w->stored_bytes);
    r.set_stall_seconds(0.01);
    return r;
  }

  // Writes a real shard of (step, rank) and reports it from `node`.
  absl::StatusOr<ckptd::v1::ReportShardResponse> Shard(const std::string& node, uint64_t step, uint32_t rank,
                                                       uint32_t world = 4, uint64_t incarnation = 0) {
    absl::StatusOr<ckptd::v1::ShardReport> r = Write(step, rank, world, incarnation);
    if (!r.ok()) return r.status();
    ckptd::v1::ReportShardRequest req;
    req.set_node_id(node);
    req.set_session(sessions_[node]);
    *req.mutable_report() = *r;
    return core_->ReportShard(req);
  }

  absl::StatusOr<ckptd::v1::ReportShardResponse> ReportOnly(const std::string& node, uint64_t step, uint32_t rank,
                                                            uint64_t length, uint64_t digest, uint32_t world = 4,
                                                            uint64_t incarnation = 0) {
    ckptd::v1::ReportShardRequest req;
    req.set_node_id(node);
    req.set_session(sessions_[node]);
    ckptd::v1::ShardReport* r = req.mutable_report();
    r->set_job(kJob);
    r->set_step(step);
    r->set_world_size(world);
    r->set_incarnation(incarnation);
    r->mutable_shard()->set_rank(rank);
    r->mutable_shard()->set_file_length(length);
    r->mutable_shard()->set_index_xxh3(digest);
    r->mutable_shard()->set_persist_seconds(0.25);
    r->set_stall_seconds(0.01);
    return core_->ReportShard(req);
  }

  absl::StatusOr<v1> Plan(uint32_t rank, std::optional<uint64_t> attempt = std::nullopt, bool ok = true,
                          uint32_t world = 4) {
    ckptd::v1::RestorePlanRequest req;
    req.set_job(kJob);
    req.set_rank(rank);
    req.set_world_size(world);
    if (attempt) {
      req.set_has_attempt(true);
      req.set_attempt_step(*attempt);
      req.set_attempt_ok(ok);
      if (!ok) req.set_problem("chunk 3 checksum mismatch");
    }
    return core_->GetRestorePlan(req);
  }

  // Every rank loads `step` intact; returns the incarnation of the round.
  uint64_t RestoreAll(uint64_t step, uint32_t world = 4) {
    for (uint32_t r = 0; r < world; ++r) {
      absl::StatusOr<v1> p = Plan(r, std::nullopt, true, world);
      EXPECT_THAT(p.status(), IsOk());
      EXPECT_EQ(p->verdict(), v1::LOAD);
      EXPECT_EQ(p->step(), step);
    }
    uint64_t incarnation = 0;
    for (uint32_t r = 0; r < world; ++r) {
      absl::StatusOr<v1> p = Plan(r, step, true, world);
      EXPECT_THAT(p.status(), IsOk());
      EXPECT_EQ(p->verdict(), r + 1 == world ? v1::GO : v1::WAIT);
      incarnation = p->incarnation();
    }
    return incarnation;
  }

  void CommitStep(uint64_t step, uint64_t incarnation = 0) {
    for (uint32_t r = 0; r < 4; ++r) {
      absl::StatusOr<ckptd::v1::ReportShardResponse> resp = Shard(r < 2 ? "node-a" : "node-b", step, r, 4, incarnation);
      ASSERT_THAT(resp.status(), IsOk());
      EXPECT_EQ(resp->committed(), r == 3);
    }
  }

  bool Exists(const std::string& path) { return fs_.Stat(path).ok(); }

  ckptd::v1::JobStatus JobState() {
    ckptd::v1::GetClusterStatusResponse s = core_->ClusterStatus();
    for (const auto& j : s.jobs()) {
      if (j.job() == kJob) return j;
    }
    ADD_FAILURE() << "no job " << kJob;
    return {};
  }

  std::vector<ckptd::v1::FailureKind> EventKinds() {
    ckptd::v1::ListEventsRequest req;
    absl::StatusOr<ckptd::v1::ListEventsResponse> r = core_->ListEvents(req);
    EXPECT_THAT(r.status(), IsOk());
    std::vector<ckptd::v1::FailureKind> kinds;
    for (const auto& e : r->events()) kinds.push_back(e.kind());
    return kinds;
  }

  void TwoNodes() {
    Register("node-a", {0, 1});
    Register("node-b", {2, 3});
  }

  storage::MemFileSystem fs_;
  storage::CheckpointStore store_{&fs_, kRoot};
  std::unique_ptr<StateStore> state_ = NewMemStateStore();
  FakeClock clock_;
  CoordinatorOptions options_;
  std::unique_ptr<CoordinatorCore> core_;
  std::map<std::string, uint64_t> sessions_;
  std::map<std::string, ckptd::v1::RegisterAgentRequest> ranks_;
};

TEST_F(CoordinatorCoreTest, StepCommitsOnlyWhenEveryRankReportedItsShard) {
  TwoNodes();
  for (uint32_t r = 0; r < 3; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(auto resp, Shard(r < 2 ? "node-a" : "node-b", 10, r));
    EXPECT_FALSE(resp.committed());
    EXPECT_FALSE(Exists(storage::ManifestPath(kRoot, kJob, 10)));
  }
  EXPECT_THAT(JobState().pending_steps(), ElementsAre(10u));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto resp, Shard("node-b", 10, 3));
  EXPECT_TRUE(resp.committed());
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 10)));
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::StepManifest m, store_.ReadManifest(kJob, 10));
  EXPECT_EQ(m.world_size(), 4u);
  ASSERT_EQ(m.shards_size(), 4);
  EXPECT_DOUBLE_EQ(m.shards(2).persist_seconds(), 0.25);
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::StepVerifyReport verify, store_.VerifyStep(kJob, 10));
  EXPECT_TRUE(verify.ok());
  ckptd::v1::JobStatus s = JobState();
  EXPECT_TRUE(s.has_committed());
  EXPECT_EQ(s.newest_committed_step(), 10u);
  EXPECT_EQ(s.checkpoints_committed(), 1u);
  EXPECT_TRUE(s.pending_steps().empty());
  // A repeated report of a committed step is answered, not re-committed.
  CKPTD_ASSERT_OK_AND_ASSIGN(auto again, Shard("node-a", 10, 0));
  EXPECT_TRUE(again.committed());
  EXPECT_EQ(core_->Counters().committed, 1u);
}

TEST_F(CoordinatorCoreTest, AnAgentReportsItsRanksInOneBatchAndABadEntryFailsAlone) {
  TwoNodes();
  ckptd::v1::ReportShardRequest a;
  a.set_node_id("node-a");
  a.set_session(sessions_["node-a"]);
  for (uint32_t r : {0u, 1u}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(*a.add_batch(), Write(10, r));
  }
  ckptd::v1::ShardReport bad = a.batch(0);
  bad.mutable_shard()->set_rank(9);
  *a.add_batch() = bad;
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ReportShardResponse ra, core_->ReportShard(a));
  ASSERT_EQ(ra.batch_results_size(), 3);
  EXPECT_EQ(ra.batch_results(0).code(), 0);
  EXPECT_FALSE(ra.batch_results(1).committed());
  EXPECT_EQ(ra.batch_results(2).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ra.batch_results(2).message(), HasSubstr("rank 9"));
  ckptd::v1::ReportShardRequest b;
  b.set_node_id("node-b");
  b.set_session(sessions_["node-b"]);
  for (uint32_t r : {2u, 3u}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(*b.add_batch(), Write(10, r));
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ReportShardResponse rb, core_->ReportShard(b));
  ASSERT_EQ(rb.batch_results_size(), 2);
  EXPECT_TRUE(rb.batch_results(0).committed());
  EXPECT_TRUE(rb.batch_results(1).committed());
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 10)));
  ckptd::v1::ReportShardRequest empty;
  empty.set_node_id("node-b");
  empty.set_session(sessions_["node-b"]);
  EXPECT_THAT(core_->ReportShard(empty), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no shard")));
}

TEST_F(CoordinatorCoreTest, ShardWhoseFileDisagreesWithTheReportAbortsTheStep) {
  TwoNodes();
  for (uint32_t r = 0; r < 3; ++r) CKPTD_ASSERT_OK(Shard(r < 2 ? "node-a" : "node-b", 10, r).status());
  CKPTD_ASSERT_OK(store_.PrepareStep(kJob, 10));
  // Rank 3 claims a shard that is not on disk: the report is refused, naming
  // the rank, and the step is aborted at once rather than at its deadline.
  EXPECT_THAT(ReportOnly("node-b", 10, 3, 8192, 42),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("rank 3 has no durable shard"), HasSubstr("aborted"))));
  EXPECT_FALSE(Exists(storage::ManifestPath(kRoot, kJob, 10)));
  EXPECT_FALSE(Exists(storage::StepDir(kRoot, kJob, 10)));
  EXPECT_EQ(JobState().checkpoints_aborted(), 1u);
  EXPECT_THAT(Shard("node-a", 10, 0), StatusIs(absl::StatusCode::kAborted, HasSubstr("aborted")));
}

TEST_F(CoordinatorCoreTest, EveryRankGetsTheSameSchedule) {
  TwoNodes();
  CKPTD_ASSERT_OK_AND_ASSIGN(auto a, Beat("node-a"));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto b, Beat("node-b"));
  ASSERT_TRUE(a.known());
  ASSERT_EQ(a.schedules_size(), 1);
  ASSERT_EQ(b.schedules_size(), 1);
  EXPECT_EQ(a.schedules(0).SerializeAsString(), b.schedules(0).SerializeAsString());
  EXPECT_EQ(a.schedules(0).every_steps(), options_.every_steps);
  EXPECT_TRUE(ScheduledAt(a.schedules(0), 200));
  EXPECT_FALSE(ScheduledAt(a.schedules(0), 150));
  EXPECT_FALSE(ScheduledAt(a.schedules(0), 0));
}

TEST_F(CoordinatorCoreTest, ManualCheckpointTargetsAStepAheadOfTheFastestRank) {
  TwoNodes();
  CKPTD_ASSERT_OK(Beat("node-a", {{0, 40}, {1, 42}}, 0.5).status());
  CKPTD_ASSERT_OK(Beat("node-b", {{2, 41}, {3, 39}}, 0.5).status());
  ckptd::v1::RequestCheckpointRequest req;
  req.set_job(kJob);
  CKPTD_ASSERT_OK_AND_ASSIGN(auto target, core_->RequestCheckpoint(req));
  EXPECT_GT(target.target_step(), 42u);
  CKPTD_ASSERT_OK_AND_ASSIGN(auto ack, Beat("node-b"));
  EXPECT_TRUE(ScheduledAt(ack.schedules(0), target.target_step()));
  const uint64_t generation = ack.schedules(0).generation();

  // A rank that passed the target before it heard of it says so: a new one.
  ckptd::v1::Heartbeat hb;
  hb.set_node_id("node-a");
  hb.set_session(sessions_["node-a"]);
  for (const auto& r : ranks_["node-a"].ranks()) *hb.add_ranks() = r;
  ckptd::v1::RankProgress* p = hb.add_progress();
  p->set_job(kJob);
  p->set_rank(1);
  p->set_step(target.target_step() + 3);
  p->add_missed_targets(target.target_step());
  CKPTD_ASSERT_OK_AND_ASSIGN(auto moved, core_->OnHeartbeat(hb));
  EXPECT_GT(moved.schedules(0).generation(), generation);
  EXPECT_FALSE(ScheduledAt(moved.schedules(0), target.target_step()));
  ASSERT_EQ(moved.schedules(0).extra_steps_size(), 1);
  EXPECT_GT(moved.schedules(0).extra_steps(0), target.target_step() + 3);

  req.set_job("no-such-job");
  EXPECT_THAT(core_->RequestCheckpoint(req), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no-such-job")));
}

TEST_F(CoordinatorCoreTest, SlowHeartbeatsAreNotANodeLossButSilenceIs) {
  TwoNodes();
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Milliseconds(4500));  // slow, under the 5 s threshold
    CKPTD_ASSERT_OK(Beat("node-a").status());
    CKPTD_ASSERT_OK(Beat("node-b").status());
    core_->Tick();
  }
  EXPECT_TRUE(EventKinds().empty());
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RUNNING);

  clock_.Advance(absl::Seconds(4));
  CKPTD_ASSERT_OK(Beat("node-a").status());
  core_->Tick();
  EXPECT_TRUE(EventKinds().empty());
  clock_.Advance(absl::Seconds(2));  // node-b silent for 6 s
  CKPTD_ASSERT_OK(Beat("node-a").status());
  core_->Tick();
  EXPECT_THAT(EventKinds(), ElementsAre(ckptd::v1::NODE_LOST));
  ckptd::v1::JobStatus s = JobState();
  EXPECT_EQ(s.state(), ckptd::v1::JOB_RESTARTING);
  EXPECT_EQ(s.ranks_alive(), 2u);
  CKPTD_ASSERT_OK_AND_ASSIGN(auto ack, Beat("node-a"));
  EXPECT_EQ(ack.schedules(0).state(), ckptd::v1::JOB_RESTARTING);
  // The lost node's session is void; it registers again when it is back.
  CKPTD_ASSERT_OK_AND_ASSIGN(auto stale, Beat("node-b"));
  EXPECT_FALSE(stale.known());
  Register("node-b", {2, 3});
  CKPTD_ASSERT_OK_AND_ASSIGN(auto back, Beat("node-b"));
  EXPECT_TRUE(back.known());
  EXPECT_EQ(JobState().ranks_alive(), 4u);
  core_->Tick();
  EXPECT_EQ(EventKinds().size(), 1u);
}

TEST_F(CoordinatorCoreTest, TrainerDeathIsAFailureAtOnce) {
  TwoNodes();
  ckptd::v1::ReportFailureRequest req;
  req.set_node_id("node-b");
  req.set_session(sessions_["node-b"]);
  req.set_job(kJob);
  req.set_rank(3);
  req.set_kind(ckptd::v1::TRAINER_DIED);
  req.set_detail("killed by signal 9");
  CKPTD_ASSERT_OK(core_->ReportFailure(req));
  ckptd::v1::ListEventsRequest list;
  CKPTD_ASSERT_OK_AND_ASSIGN(auto events, core_->ListEvents(list));
  ASSERT_EQ(events.events_size(), 1);
  EXPECT_EQ(events.events(0).kind(), ckptd::v1::TRAINER_DIED);
  EXPECT_EQ(events.events(0).node_id(), "node-b");
  EXPECT_TRUE(events.events(0).has_rank());
  EXPECT_EQ(events.events(0).rank(), 3u);
  EXPECT_THAT(events.events(0).detail(), HasSubstr("signal 9"));
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RESTARTING);

  req.set_rank(4);
  EXPECT_THAT(core_->ReportFailure(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 4")));
  req.set_rank(3);
  req.set_session(sessions_["node-b"] + 1);
  EXPECT_THAT(core_->ReportFailure(req), StatusIs(absl::StatusCode::kNotFound, HasSubstr("register again")));
  req.set_session(sessions_["node-b"]);
  req.set_kind(ckptd::v1::NODE_LOST);
  EXPECT_THAT(core_->ReportFailure(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NODE_LOST")));
}

TEST_F(CoordinatorCoreTest, RankWithoutProgressIsHungAfterTheThreshold) {
  options_.hang_floor = absl::Seconds(30);
  options_.hang_multiple = 10;
  Reset();
  TwoNodes();
  for (uint64_t step = 1; step <= 5; ++step) {
    clock_.Advance(absl::Seconds(1));
    CKPTD_ASSERT_OK(Beat("node-a", {{0, step}, {1, step}}, 1.0).status());
    CKPTD_ASSERT_OK(Beat("node-b", {{2, step}, {3, step == 5 ? 4 : step}}, 1.0).status());
  }
  // Rank 3 stops at step 4: at 1 s a step the floor (30 s) decides.
  for (int i = 0; i < 25; ++i) {
    clock_.Advance(absl::Seconds(1));
    CKPTD_ASSERT_OK(Beat("node-a", {{0, 6 + i}, {1, 6 + i}}, 1.0).status());
    CKPTD_ASSERT_OK(Beat("node-b", {{2, 6 + i}, {3, 4}}, 1.0).status());
    core_->Tick();
  }
  EXPECT_TRUE(EventKinds().empty());
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(absl::Seconds(1));
    CKPTD_ASSERT_OK(Beat("node-a").status());
    CKPTD_ASSERT_OK(Beat("node-b", {{3, 4}}, 1.0).status());
    core_->Tick();
  }
  ckptd::v1::ListEventsRequest list;
  CKPTD_ASSERT_OK_AND_ASSIGN(auto events, core_->ListEvents(list));
  ASSERT_GE(events.events_size(), 1);
  EXPECT_EQ(events.events(events.events_size() - 1).kind(), ckptd::v1::TRAINER_HUNG);
  EXPECT_EQ(events.events(events.events_size() - 1).rank(), 3u);
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RESTARTING);
}

TEST_F(CoordinatorCoreTest, NothingCommittedMeansEveryRankStartsFresh) {
  TwoNodes();
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(r));
    EXPECT_EQ(p.verdict(), v1::FRESH_START);
    EXPECT_EQ(p.incarnation(), 1u);
  }
}

TEST_F(CoordinatorCoreTest, RestoreIsABarrierAndEveryRankGetsTheSameStep) {
  TwoNodes();
  CommitStep(10);
  CommitStep(20);
  const uint64_t incarnation = RestoreAll(20);
  EXPECT_EQ(incarnation, 1u);
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RUNNING);
  // A later restart is a new round.
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(2));
  EXPECT_EQ(p.verdict(), v1::LOAD);
  EXPECT_EQ(p.incarnation(), 2u);
}

TEST_F(CoordinatorCoreTest, ADamagedShardQuarantinesTheStepAndTheWholeJobFallsBack) {
  TwoNodes();
  CommitStep(10);
  CommitStep(20);
  for (uint32_t r = 0; r < 4; ++r) CKPTD_ASSERT_OK(Plan(r).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 w0, Plan(0, 20, true));
  EXPECT_EQ(w0.verdict(), v1::WAIT);
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 bad, Plan(2, 20, false));
  EXPECT_EQ(bad.verdict(), v1::LOAD);
  EXPECT_EQ(bad.step(), 10u);
  // Rank 0 already loaded 20: it is sent to 10 as well.
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 again, Plan(0, 20, true));
  EXPECT_EQ(again.verdict(), v1::LOAD);
  EXPECT_EQ(again.step(), 10u);
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(r, 10, true));
    EXPECT_EQ(p.verdict(), r == 3 ? v1::GO : v1::WAIT);
    EXPECT_EQ(p.step(), 10u);
  }
  EXPECT_THAT(JobState().quarantined_steps(), ElementsAre(20u));
  EXPECT_THAT(EventKinds(), ElementsAre(ckptd::v1::SHARD_DAMAGED));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto q, state_->ListQuarantined(kJob));
  ASSERT_EQ(q.size(), 1u);
  EXPECT_THAT(q[0].reason(), HasSubstr("checksum mismatch"));
  // Kept on disk and marked there, never chosen again (also after a
  // coordinator restart, and even one that lost its database).
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 20)));
  EXPECT_TRUE(Exists(storage::QuarantinePath(kRoot, kJob, 20)));
  Reset();
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 later, Plan(1));
  EXPECT_EQ(later.step(), 10u);
  state_ = NewMemStateStore();
  Reset();
  CKPTD_ASSERT_OK_AND_ASSIGN(v1 without_db, Plan(1));
  EXPECT_EQ(without_db.step(), 10u);
}

TEST_F(CoordinatorCoreTest, AgentLostMidCheckpointLeavesTheStepUncommittedAndThePreviousRestores) {
  TwoNodes();
  CommitStep(10);
  const uint64_t inc = RestoreAll(10);
  CKPTD_ASSERT_OK(Shard("node-a", 20, 0, 4, inc).status());
  CKPTD_ASSERT_OK(Shard("node-a", 20, 1, 4, inc).status());
  CKPTD_ASSERT_OK(Shard("node-b", 20, 2, 4, inc).status());
  clock_.Advance(absl::Seconds(3));
  CKPTD_ASSERT_OK(Beat("node-a").status());
  clock_.Advance(absl::Seconds(3));
  CKPTD_ASSERT_OK(Beat("node-a").status());
  core_->Tick();  // node-b lost before rank 3 reported
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RESTARTING);
  EXPECT_FALSE(Exists(storage::ManifestPath(kRoot, kJob, 20)));
  Register("node-b", {2, 3});
  const uint64_t inc2 = RestoreAll(10);
  EXPECT_GT(inc2, inc);
  // The half-written step is gone, and a late shard of it is refused.
  EXPECT_FALSE(Exists(storage::StepDir(kRoot, kJob, 20)));
  EXPECT_THAT(Shard("node-b", 20, 3, 4, inc), StatusIs(absl::StatusCode::kAborted, HasSubstr("latest restore")));
  // The rerun checkpoints step 20 again, this time completely.
  CommitStep(20, inc2);
  EXPECT_EQ(JobState().newest_committed_step(), 20u);
}

TEST_F(CoordinatorCoreTest, ShardFinishedAfterItsTrainerDiedStillCompletesTheStep) {
  TwoNodes();
  CommitStep(10);
  const uint64_t inc = RestoreAll(10);
  for (uint32_t r = 0; r < 3; ++r) CKPTD_ASSERT_OK(Shard(r < 2 ? "node-a" : "node-b", 20, r, 4, inc).status());
  ckptd::v1::ReportFailureRequest died;
  died.set_node_id("node-b");
  died.set_session(sessions_["node-b"]);
  died.set_job(kJob);
  died.set_rank(3);
  died.set_kind(ckptd::v1::TRAINER_DIED);
  CKPTD_ASSERT_OK(core_->ReportFailure(died));
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RESTARTING);
  // Its agent still persists what the trainer had published.
  CKPTD_ASSERT_OK_AND_ASSIGN(auto resp, Shard("node-b", 20, 3, 4, inc));
  EXPECT_TRUE(resp.committed());
  RestoreAll(20);
}

TEST_F(CoordinatorCoreTest, RetentionKeepsTheNewestStepsAndQuarantinedOnes) {
  options_.keep_last = 2;
  Reset();
  TwoNodes();
  CommitStep(10);
  CommitStep(20);
  // Quarantine 20 through a failed restore.
  for (uint32_t r = 0; r < 4; ++r) CKPTD_ASSERT_OK(Plan(r).status());
  CKPTD_ASSERT_OK(Plan(0, 20, false).status());
  uint64_t inc = 0;
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(v1 p, Plan(r, 10, true));
    inc = p.incarnation();
  }
  CommitStep(30, inc);
  CommitStep(40, inc);
  // Retention is not on the commit's path: the next tick removes the files.
  EXPECT_EQ(JobState().newest_committed_step(), 40u);
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 10)));
  core_->Tick();
  EXPECT_FALSE(Exists(storage::ManifestPath(kRoot, kJob, 10)));
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 20)));  // quarantined: kept
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 30)));
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 40)));
}

TEST_F(CoordinatorCoreTest, StepPastItsDeadlineIsAborted) {
  options_.step_deadline = absl::Minutes(5);
  options_.node_lost_after = absl::Hours(1);
  Reset();
  TwoNodes();
  CKPTD_ASSERT_OK(Shard("node-a", 10, 0).status());
  clock_.Advance(absl::Minutes(4));
  core_->Tick();
  EXPECT_THAT(JobState().pending_steps(), ElementsAre(10u));
  clock_.Advance(absl::Minutes(2));
  core_->Tick();
  EXPECT_TRUE(JobState().pending_steps().empty());
  EXPECT_EQ(JobState().checkpoints_aborted(), 1u);
  EXPECT_FALSE(Exists(storage::StepDir(kRoot, kJob, 10)));
}

TEST_F(CoordinatorCoreTest, PersistFailureAbortsTheStep) {
  TwoNodes();
  CKPTD_ASSERT_OK(Shard("node-a", 10, 0).status());
  ckptd::v1::ReportFailureRequest req;
  req.set_node_id("node-b");
  req.set_session(sessions_["node-b"]);
  req.set_job(kJob);
  req.set_rank(2);
  req.set_kind(ckptd::v1::PERSIST_FAILED);
  req.set_step(10);
  req.set_detail("No space left on device");
  CKPTD_ASSERT_OK(core_->ReportFailure(req));
  EXPECT_TRUE(JobState().pending_steps().empty());
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RUNNING);  // training goes on
  EXPECT_THAT(Shard("node-a", 10, 1), StatusIs(absl::StatusCode::kAborted, HasSubstr("aborted")));
}

TEST_F(CoordinatorCoreTest, RestartedCoordinatorLosesNoCommittedStepAndTakesLateReports) {
  TwoNodes();
  CommitStep(10);
  const uint64_t inc = RestoreAll(10);
  std::vector<ckptd::v1::ShardReport> reports;
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ShardReport rep, Write(20, r, 4, inc));
    reports.push_back(rep);
  }
  for (uint32_t r = 0; r < 2; ++r) {
    ckptd::v1::ReportShardRequest req;
    req.set_node_id("node-a");
    req.set_session(sessions_["node-a"]);
    *req.mutable_report() = reports[r];
    CKPTD_ASSERT_OK(core_->ReportShard(req).status());
  }
  // The coordinator restarts (node b wrote its shards of 20 meanwhile): the
  // pending reports are lost with it, the committed step is not.
  Reset();
  ckptd::v1::JobStatus s = JobState();
  EXPECT_TRUE(s.has_committed());
  EXPECT_EQ(s.newest_committed_step(), 10u);
  EXPECT_EQ(s.schedule().incarnation(), inc);
  EXPECT_EQ(s.checkpoints_committed(), 1u);
  // Old sessions are unknown; agents register again with the durable shards
  // whose commit they have not seen.
  CKPTD_ASSERT_OK_AND_ASSIGN(auto stale, Beat("node-a"));
  EXPECT_FALSE(stale.known());
  for (const std::string node : {"node-a", "node-b"}) {
    ckptd::v1::RegisterAgentRequest req = ranks_[node];
    for (uint32_t r = node == "node-a" ? 0 : 2, end = r + 2; r < end; ++r) *req.add_durable_shards() = reports[r];
    CKPTD_ASSERT_OK_AND_ASSIGN(auto resp, core_->RegisterAgent(req));
    sessions_[node] = resp.session();
  }
  EXPECT_EQ(JobState().newest_committed_step(), 20u);
  EXPECT_TRUE(Exists(storage::ManifestPath(kRoot, kJob, 20)));
  // Checkpoints resume.
  CommitStep(30, inc);
  EXPECT_EQ(JobState().newest_committed_step(), 30u);
}

// Counts the job records written, to show what reaches the database when.
class CountingStateStore : public StateStore {
 public:
  explicit CountingStateStore(StateStore* base) : base_(base) {}
  absl::Status AppendEvent(const ckptd::v1::FailureEvent& e) override { return base_->AppendEvent(e); }
  absl::StatusOr<std::vector<ckptd::v1::FailureEvent>> ListEvents(absl::string_view job, size_t limit) override {
    return base_->ListEvents(job, limit);
  }
  absl::StatusOr<absl::flat_hash_map<ckptd::v1::FailureKind, uint64_t>> CountEventsByKind(absl::string_view job,
                                                                                         absl::Time since) override {
    return base_->CountEventsByKind(job, since);
  }
  absl::Status PutJob(const ckptd::v1::JobRecord& r) override {
    ++puts;
    return base_->PutJob(r);
  }
  absl::StatusOr<std::vector<ckptd::v1::JobRecord>> ListJobs() override { return base_->ListJobs(); }
  absl::Status PutQuarantine(const ckptd::v1::QuarantinedStep& q) override { return base_->PutQuarantine(q); }
  absl::StatusOr<std::vector<ckptd::v1::QuarantinedStep>> ListQuarantined(absl::string_view job) override {
    return base_->ListQuarantined(job);
  }
  int puts = 0;

 private:
  StateStore* base_;
};

TEST_F(CoordinatorCoreTest, DecisionsAreSavedAtOnceAndTimingsOnlyNowAndThen) {
  std::unique_ptr<StateStore> base = NewMemStateStore();
  CountingStateStore counting(base.get());
  core_ = std::make_unique<CoordinatorCore>(&store_, &counting, &clock_, options_);
  CKPTD_ASSERT_OK(core_->Recover());
  TwoNodes();
  const int after_register = counting.puts;
  for (uint64_t step = 1; step <= 20; ++step) {
    clock_.Advance(absl::Milliseconds(100));
    CKPTD_ASSERT_OK(Beat("node-a", {{0, step}, {1, step}}).status());
    CKPTD_ASSERT_OK(Beat("node-b", {{2, step}, {3, step}}).status());
    core_->Tick();
  }
  EXPECT_LE(counting.puts - after_register, 1);  // 2 s of heartbeats: timings saved at most once
  ckptd::v1::ReportFailureRequest req;
  req.set_node_id("node-b");
  req.set_session(sessions_["node-b"]);
  req.set_job(kJob);
  req.set_rank(2);
  req.set_kind(ckptd::v1::TRAINER_DIED);
  const int before_failure = counting.puts;
  CKPTD_ASSERT_OK(core_->ReportFailure(req));
  EXPECT_EQ(counting.puts, before_failure + 1);
  // A coordinator that restarts now still knows the job must restart.
  core_ = std::make_unique<CoordinatorCore>(&store_, base.get(), &clock_, options_);
  CKPTD_ASSERT_OK(core_->Recover());
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RESTARTING);
  EXPECT_GT(JobState().schedule().generation(), 1u);
}

TEST_F(CoordinatorCoreTest, MalformedRequestsChangeNothing) {
  TwoNodes();
  ckptd::v1::RegisterAgentRequest reg;
  reg.set_node_id("../../etc");
  EXPECT_THAT(core_->RegisterAgent(reg), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node id")));
  reg.set_node_id("node-c");
  ckptd::v1::RankInfo* r = reg.add_ranks();
  r->set_job("bad/job");
  r->set_world_size(4);
  EXPECT_THAT(core_->RegisterAgent(reg), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name")));
  r->set_job(kJob);
  r->set_rank(4);
  EXPECT_THAT(core_->RegisterAgent(reg), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 4")));
  r->set_rank(1);
  r->set_world_size(8);
  EXPECT_THAT(core_->RegisterAgent(reg), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("world size 4")));
  EXPECT_EQ(core_->ClusterStatus().agents_size(), 2);

  EXPECT_THAT(ReportOnly("node-a", 10, 0, 0, 1), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("length")));
  EXPECT_THAT(ReportOnly("node-a", 10, 7, 4096, 1), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 7")));
  EXPECT_THAT(ReportOnly("node-a", uint64_t{1} << 63, 0, 4096, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step")));
  EXPECT_THAT(ReportOnly("node-a", 10, 0, 4096, 1, 8),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("the job runs 4")));
  sessions_["node-a"] += 7;
  EXPECT_THAT(ReportOnly("node-a", 10, 0, 4096, 1),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("register again")));
  EXPECT_TRUE(JobState().pending_steps().empty());
  EXPECT_THAT(Plan(4), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 4")));
  ckptd::v1::ListEventsRequest list;
  list.set_job("a b");
  EXPECT_THAT(core_->ListEvents(list), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name")));
}

TEST_F(CoordinatorCoreTest, ListStepsShowsCommittedPendingAbortedAndIncompleteSteps) {
  TwoNodes();
  CommitStep(10);
  CommitStep(20);
  // Step 30: three of four ranks so far.
  for (uint32_t r = 0; r < 3; ++r) CKPTD_ASSERT_OK(Shard(r < 2 ? "node-a" : "node-b", 30, r).status());
  // Step 25: files nobody reports (a crashed writer).
  CKPTD_ASSERT_OK(Write(25, 0).status());
  // Step 40: aborted when rank 3's file turned out missing.
  CKPTD_ASSERT_OK(store_.PrepareStep(kJob, 40));
  EXPECT_THAT(ReportOnly("node-b", 40, 3, 8192, 42), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank 3")));
  ckptd::v1::ListStepsRequest req;
  req.set_job(kJob);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ListStepsResponse list, core_->ListSteps(req));
  std::vector<std::pair<uint64_t, ckptd::v1::StepState>> got;
  for (const auto& e : list.steps()) got.emplace_back(e.step(), e.state());
  EXPECT_THAT(got, ElementsAre(std::pair(uint64_t{10}, ckptd::v1::STEP_COMMITTED),
                               std::pair(uint64_t{20}, ckptd::v1::STEP_COMMITTED),
                               std::pair(uint64_t{25}, ckptd::v1::STEP_INCOMPLETE),
                               std::pair(uint64_t{30}, ckptd::v1::STEP_PENDING),
                               std::pair(uint64_t{40}, ckptd::v1::STEP_ABORTED)));
  const ckptd::v1::StepEntry& committed = list.steps(1);
  EXPECT_EQ(committed.world_size(), 4u);
  EXPECT_EQ(committed.ranks_reported(), 4u);
  EXPECT_GT(committed.stored_bytes(), 0u);
  EXPECT_GT(committed.committed_unix_nanos(), 0);
  EXPECT_DOUBLE_EQ(committed.persist_seconds(), 0.25);
  EXPECT_EQ(list.steps(3).ranks_reported(), 3u);
  EXPECT_THAT(list.steps(4).reason(), HasSubstr("rank 3 has no durable shard"));
  req.set_job("unknown");
  EXPECT_THAT(core_->ListSteps(req), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no job unknown")));
  req.set_job("a/b");
  EXPECT_THAT(core_->ListSteps(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name")));
}

TEST_F(CoordinatorCoreTest, RestorePreviewNamesTheStepAndWhatItPassesOver) {
  TwoNodes();
  ckptd::v1::RestorePreviewRequest req;
  req.set_job(kJob);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RestorePreview fresh, core_->GetRestorePreview(req));
  EXPECT_TRUE(fresh.fresh_start());
  EXPECT_THAT(fresh.reason(), HasSubstr("no step of the job is committed"));
  CommitStep(10);
  CommitStep(20);
  for (uint32_t r = 0; r < 2; ++r) CKPTD_ASSERT_OK(Shard("node-a", 30, r).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RestorePreview p, core_->GetRestorePreview(req));
  EXPECT_FALSE(p.fresh_start());
  EXPECT_EQ(p.step(), 20u);
  EXPECT_THAT(p.reason(), HasSubstr("newest committed step"));
  ASSERT_EQ(p.passed_over_size(), 1);
  EXPECT_EQ(p.passed_over(0).step(), 30u);
  EXPECT_THAT(p.passed_over(0).reason(), HasSubstr("2 of 4 ranks durable"));
  // Nothing changed: no round was started.
  EXPECT_EQ(JobState().schedule().incarnation(), p.incarnation());
  req.set_job("nope");
  EXPECT_THAT(core_->GetRestorePreview(req), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no job nope")));
}

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

TEST_F(CoordinatorCoreTest, DrillGoesToTheRanksAgentUntilItReportsAndShowsWhatFollowed) {
  // node-a allows drills, node-b does not.
  Register("node-a", {0, 1}, 4, /*drills_allowed=*/true);
  const ckptd::v1::RegisterAgentRequest a = ranks_["node-a"];
  Register("node-b", {2, 3});
  CommitStep(10);

  ckptd::v1::RunDrillRequest req;
  req.set_job(kJob);
  req.set_scenario(ckptd::v1::KILL_TRAINER);
  req.set_rank(3);
  EXPECT_THAT(core_->RunDrill(req),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("node-b's agent was not started with --allow-drills")));
  req.set_rank(1);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RunDrillResponse ordered, core_->RunDrill(req));
  EXPECT_EQ(ordered.node_id(), "node-a");

  // The order rides on node-a's heartbeat answers, not node-b's, until reported.
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::HeartbeatAck b_ack, Beat("node-b"));
  EXPECT_TRUE(b_ack.drills().empty());
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::HeartbeatAck ack, Beat("node-a"));
  ASSERT_EQ(ack.drills_size(), 1);
  EXPECT_EQ(ack.drills(0).drill_id(), ordered.drill_id());
  EXPECT_EQ(ack.drills(0).scenario(), ckptd::v1::KILL_TRAINER);
  EXPECT_EQ(ack.drills(0).rank(), 1u);
  CKPTD_ASSERT_OK_AND_ASSIGN(ack, Beat("node-a"));
  EXPECT_EQ(ack.drills_size(), 1);  // sent again: not reported yet

  clock_.Advance(absl::Milliseconds(300));
  ckptd::v1::Heartbeat hb;
  hb.set_node_id("node-a");
  hb.set_session(sessions_["node-a"]);
  for (const auto& r : a.ranks()) *hb.add_ranks() = r;
  ckptd::v1::DrillReport* rep = hb.add_drill_reports();
  rep->set_drill_id(ordered.drill_id());
  rep->set_injected(true);
  rep->set_injected_unix_nanos(absl::ToUnixNanos(clock_.Now()));
  rep->set_detail("SIGKILL to pid 1001");
  CKPTD_ASSERT_OK_AND_ASSIGN(ack, core_->OnHeartbeat(hb));
  EXPECT_TRUE(ack.drills().empty());
  // The agent saw its trainer die.
  clock_.Advance(absl::Milliseconds(20));
  ckptd::v1::ReportFailureRequest died;
  died.set_node_id("node-a");
  died.set_session(sessions_["node-a"]);
  died.set_job(kJob);
  died.set_rank(1);
  died.set_kind(ckptd::v1::TRAINER_DIED);
  CKPTD_ASSERT_OK(core_->ReportFailure(died));

  ckptd::v1::GetDrillRequest get;
  get.set_drill_id(ordered.drill_id());
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::DrillStatus st, core_->GetDrill(get));
  EXPECT_EQ(st.node_id(), "node-a");
  EXPECT_TRUE(st.report().injected());
  EXPECT_EQ(st.report().detail(), "SIGKILL to pid 1001");
  EXPECT_TRUE(st.had_committed_at_order());
  EXPECT_EQ(st.newest_committed_at_order(), 10u);
  ASSERT_EQ(st.events_size(), 1);
  EXPECT_EQ(st.events(0).kind(), ckptd::v1::TRAINER_DIED);
  EXPECT_EQ(st.first_detection_unix_nanos() - st.report().injected_unix_nanos(), 20'000'000);
  EXPECT_FALSE(st.resumed());
  // Every rank restores step 10 and takes a step 3 s after the failure.
  clock_.Advance(absl::Seconds(3));
  RestoreAll(10);
  CKPTD_ASSERT_OK(Beat("node-a", {{0, 11}, {1, 11}}).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(st, core_->GetDrill(get));
  EXPECT_TRUE(st.resumed());
  EXPECT_FALSE(st.fresh_start());
  EXPECT_EQ(st.restored_step(), 10u);
  EXPECT_EQ(st.resumed_unix_nanos() - st.failed_unix_nanos(), 3'000'000'000);
  get.set_drill_id(999);
  EXPECT_THAT(core_->GetDrill(get), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no drill 999")));
}

TEST_F(CoordinatorCoreTest, AnAgentKilledBeforeItsReportIsNotToldToDieAgain) {
  Register("node-a", {0, 1}, 4, /*drills_allowed=*/true);
  const ckptd::v1::RegisterAgentRequest a = ranks_["node-a"];
  for (ckptd::v1::DrillScenario scenario : {ckptd::v1::KILL_AGENT, ckptd::v1::KILL_NODE}) {
    SCOPED_TRACE(ckptd::v1::DrillScenario_Name(scenario));
    ckptd::v1::RunDrillRequest req;
    req.set_job(kJob);
    req.set_scenario(scenario);
    req.set_rank(0);
    CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RunDrillResponse ordered, core_->RunDrill(req));
    EXPECT_EQ(ordered.node_id(), "node-a");
    // It dies without a word and comes back as a new process.
    clock_.Advance(absl::Seconds(2));
    CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RegisterAgentResponse again, core_->RegisterAgent(a));
    sessions_["node-a"] = again.session();
    ranks_["node-a"] = a;
    CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::HeartbeatAck ack, Beat("node-a"));
    EXPECT_TRUE(ack.drills().empty());
    ckptd::v1::GetDrillRequest get;
    get.set_drill_id(ordered.drill_id());
    CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::DrillStatus st, core_->GetDrill(get));
    EXPECT_TRUE(st.report().injected());
    EXPECT_THAT(st.report().detail(), HasSubstr("registered again"));
  }
}

TEST_F(CoordinatorCoreTest, AnAgentRestartedBeforeItWasMissedLosesItsNode) {
  auto register_as = [&](const std::string& node, std::vector<uint32_t> ranks, uint64_t instance) {
    ckptd::v1::RegisterAgentRequest req;
    req.set_node_id(node);
    req.set_instance(instance);
    for (uint32_t r : ranks) {
      ckptd::v1::RankInfo* info = req.add_ranks();
      info->set_job(kJob);
      info->set_rank(r);
      info->set_world_size(4);
      info->set_pid(1000 + static_cast<int>(r));
    }
    absl::StatusOr<ckptd::v1::RegisterAgentResponse> resp = core_->RegisterAgent(req);
    EXPECT_THAT(resp.status(), IsOk());
    sessions_[node] = resp.ok() ? resp->session() : 0;
    ranks_[node] = req;
  };
  register_as("node-a", {0, 1}, 111);
  register_as("node-b", {2, 3}, 222);
  CKPTD_ASSERT_OK(Beat("node-a", {{0, 10}, {1, 10}}).status());
  CKPTD_ASSERT_OK(Beat("node-b", {{2, 10}, {3, 10}}).status());
  // The same process registering again (a coordinator blip): nothing lost.
  register_as("node-b", {2, 3}, 222);
  EXPECT_THAT(EventKinds(), ::testing::IsEmpty());
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RUNNING);
  // A new process, a moment after the old one died: node-b is lost.
  clock_.Advance(absl::Milliseconds(300));
  register_as("node-b", {}, 333);
  EXPECT_THAT(EventKinds(), ElementsAre(ckptd::v1::NODE_LOST));
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RESTARTING);
  ckptd::v1::ListEventsRequest req;
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ListEventsResponse events, core_->ListEvents(req));
  ASSERT_EQ(events.events_size(), 1);
  EXPECT_EQ(events.events(0).node_id(), "node-b");
  EXPECT_THAT(events.events(0).detail(), HasSubstr("agent restarted"));
  // An agent that does not say which process it is changes nothing.
  register_as("node-a", {0, 1}, 0);
  EXPECT_EQ(EventKinds().size(), 1u);
}

TEST_F(CoordinatorCoreTest, TheStepAtTheFailureFollowsRanksThatTrainUntilTheyHear) {
  Register("node-a", {0, 1}, 4, /*drills_allowed=*/true);
  Register("node-b", {2, 3}, 4, /*drills_allowed=*/true);
  CKPTD_ASSERT_OK(Beat("node-a", {{0, 20}, {1, 20}}).status());
  CKPTD_ASSERT_OK(Beat("node-b", {{2, 20}, {3, 20}}).status());
  ckptd::v1::RunDrillRequest drill;
  drill.set_job(kJob);
  drill.set_scenario(ckptd::v1::KILL_TRAINER);
  drill.set_rank(2);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RunDrillResponse ordered, core_->RunDrill(drill));
  ckptd::v1::ReportFailureRequest died;
  died.set_node_id("node-b");
  died.set_session(sessions_["node-b"]);
  died.set_job(kJob);
  died.set_rank(2);
  died.set_kind(ckptd::v1::TRAINER_DIED);
  CKPTD_ASSERT_OK(core_->ReportFailure(died));
  // The others' progress arrives late, and they train on until told.
  CKPTD_ASSERT_OK(Beat("node-a", {{0, 27}, {1, 26}}).status());
  // Once the restore round starts, steps are the new run's.
  for (uint32_t r = 0; r < 4; ++r) CKPTD_ASSERT_OK(Plan(r).status());
  CKPTD_ASSERT_OK(Beat("node-a", {{0, 3}, {1, 3}}).status());
  CKPTD_ASSERT_OK(Beat("node-b", {{2, 3}, {3, 3}}).status());
  ckptd::v1::GetDrillRequest get;
  get.set_drill_id(ordered.drill_id());
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::DrillStatus st, core_->GetDrill(get));
  ASSERT_TRUE(st.resumed()) << st.DebugString();
  EXPECT_TRUE(st.fresh_start());
  EXPECT_EQ(st.step_at_failure(), 27u);
}

TEST_F(CoordinatorCoreTest, ANodeDrillAtAStepWatchesARankOfThatNode) {
  Register("node-a", {0, 1}, 4, /*drills_allowed=*/true);
  Register("node-b", {2, 3}, 4, /*drills_allowed=*/true);
  ckptd::v1::RunDrillRequest req;
  req.set_job(kJob);
  req.set_scenario(ckptd::v1::STORAGE_EIO);
  req.set_duration_seconds(1);
  req.set_target_node("node-b");
  req.set_at_step(50);
  CKPTD_ASSERT_OK(core_->RunDrill(req).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::HeartbeatAck ack, Beat("node-b"));
  ASSERT_EQ(ack.drills_size(), 1);
  EXPECT_EQ(ack.drills(0).rank(), 2u);  // the lowest rank node-b hosts
  EXPECT_EQ(ack.drills(0).at_step(), 50u);
  // A node with no rank of the job has nothing to watch.
  Register("node-c", {}, 4, /*drills_allowed=*/true);
  req.set_target_node("node-c");
  EXPECT_THAT(core_->RunDrill(req),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("hosts no rank of job")));
  req.set_at_step(0);  // at once it can
  CKPTD_EXPECT_OK(core_->RunDrill(req).status());
}

TEST_F(CoordinatorCoreTest, RanksOfASilentNodeAreNotCalledHung) {
  options_.hang_floor = absl::Seconds(1);
  options_.heartbeat_interval = absl::Milliseconds(200);
  options_.node_lost_after = absl::Seconds(10);
  Reset();
  TwoNodes();
  CKPTD_ASSERT_OK(Beat("node-a", {{0, 10}, {1, 10}}).status());
  CKPTD_ASSERT_OK(Beat("node-b", {{2, 10}, {3, 10}}).status());
  // node-a keeps beating without progress; node-b goes quiet.
  for (int i = 0; i < 25; ++i) {
    clock_.Advance(absl::Milliseconds(200));
    CKPTD_ASSERT_OK(Beat("node-a", {{0, 10}, {1, 10}}).status());
    core_->Tick();
  }
  ckptd::v1::ListEventsRequest req;
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ListEventsResponse events, core_->ListEvents(req));
  ASSERT_FALSE(events.events().empty());
  for (const auto& e : events.events()) {
    EXPECT_EQ(e.node_id(), "node-a") << "a rank of the quiet node-b was called hung: " << e.DebugString();
    EXPECT_EQ(e.kind(), ckptd::v1::TRAINER_HUNG);
  }
}

TEST_F(CoordinatorCoreTest, MalformedDrillsAreRefused) {
  TwoNodes();
  ckptd::v1::RunDrillRequest req;
  req.set_job(kJob);
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown drill scenario")));
  req.set_scenario(ckptd::v1::HANG_TRAINER);
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs a duration")));
  req.set_duration_seconds(1e9);
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs a duration")));
  req.set_scenario(ckptd::v1::STORAGE_SLOW);
  req.set_duration_seconds(5);
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("delay per operation")));
  req.set_scenario(ckptd::v1::KILL_TRAINER);
  req.set_rank(9);
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 9")));
  req.set_target_node("node-a");
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("targets a rank")));
  req.set_scenario(ckptd::v1::KILL_AGENT);
  req.set_target_node("node-z");
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no live agent")));
  req.set_target_node("../x");
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node id")));
  req.set_target_node("node-a");
  req.set_job("other");
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no job other")));
}

class IntervalPolicyTest : public CoordinatorCoreTest {
 protected:
  IntervalPolicyTest() {
    // A failure-prone cluster, so that the optimum is seconds, not days.
    options_.failure_prior.mean_per_gpu_hour = 10.0;
    options_.min_interval = absl::ZeroDuration();
    StartOver();
  }

  // A new coordinator with options_ and nothing remembered.
  void StartOver() {
    state_ = NewMemStateStore();
    Reset();
    TwoNodes();
  }

  absl::Status BeatAll(uint64_t step, double idle, double persisting) {
    for (const std::string node : {"node-a", "node-b"}) {
      ckptd::v1::Heartbeat hb;
      hb.set_node_id(node);
      hb.set_session(sessions_[node]);
      for (const auto& r : ranks_[node].ranks()) {
        *hb.add_ranks() = r;
        ckptd::v1::RankProgress* p = hb.add_progress();
        p->set_job(kJob);
        p->set_rank(r.rank());
        p->set_step(step);
        p->set_step_seconds((idle + persisting) / 2);
        p->set_step_seconds_idle(idle);
        p->set_step_seconds_persisting(persisting);
      }
      absl::StatusOr<ckptd::v1::HeartbeatAck> ack = core_->OnHeartbeat(hb);
      if (!ack.ok()) return ack.status();
    }
    return absl::OkStatus();
  }

  ckptd::v1::IntervalStatus Interval() {
    ckptd::v1::GetIntervalRequest req;
    req.set_job(kJob);
    absl::StatusOr<ckptd::v1::IntervalStatus> s = core_->GetInterval(req);
    EXPECT_THAT(s.status(), IsOk());
    return s.ok() ? *s : ckptd::v1::IntervalStatus();
  }

  // The policy's next decision, with every rank at `step` (heartbeats keep
  // the nodes alive across the wait).
  absl::Status DecideAt(uint64_t step, double idle = 0.1, double persisting = 0.125) {
    clock_.Advance(options_.decide_every);
    CKPTD_RETURN_IF_ERROR(BeatAll(step, idle, persisting));
    core_->Tick();
    return absl::OkStatus();
  }

  ckptd::v1::Schedule Schedule() { return JobState().schedule(); }

  absl::Status Die(const std::string& node, uint32_t rank) {
    ckptd::v1::ReportFailureRequest died;
    died.set_node_id(node);
    died.set_session(sessions_[node]);
    died.set_job(kJob);
    died.set_rank(rank);
    died.set_kind(ckptd::v1::TRAINER_DIED);
    return core_->ReportFailure(died);
  }
};

TEST_F(IntervalPolicyTest, WaitsForAMeasuredCheckpointThenMovesTheScheduleToTheOptimum) {
  CKPTD_ASSERT_OK(BeatAll(95, 0.1, 0.125));
  ckptd::v1::IntervalStatus before = Interval();
  EXPECT_TRUE(before.automatic());
  EXPECT_FALSE(before.decided());
  EXPECT_THAT(before.waiting_for(), HasSubstr("committed checkpoint"));
  EXPECT_EQ(before.every_steps(), options_.every_steps);

  CommitStep(100);  // stall 0.01 s, persist 0.25 s on every rank
  const uint64_t generation = Schedule().generation();
  CKPTD_ASSERT_OK(DecideAt(105));

  const ckptd::v1::IntervalStatus st = Interval();
  ASSERT_TRUE(st.decided()) << st.waiting_for();
  EXPECT_EQ(st.gpus(), 4u);
  EXPECT_EQ(st.failures(), 0u);
  EXPECT_DOUBLE_EQ(st.stall_seconds(), 0.01);
  EXPECT_DOUBLE_EQ(st.persist_seconds(), 0.25);
  // Steps run 25 % slower for the 0.25 s of a persist: 0.05 s per checkpoint.
  EXPECT_NEAR(st.slowdown_seconds(), 0.25 * (1 - 0.1 / 0.125), 1e-12);
  EXPECT_NEAR(st.cost_seconds(), 0.06, 1e-12);
  EXPECT_DOUBLE_EQ(st.step_seconds(), 0.1);
  EXPECT_TRUE(st.restart_assumed());
  EXPECT_DOUBLE_EQ(st.restart_seconds(), absl::ToDoubleSeconds(options_.restart_guess));
  // λ from the prior alone (a few GPU-seconds seen), M = 1/(G λ).
  const policy::FailureRateEstimate rate =
      policy::EstimateFailureRate(options_.failure_prior, 0, st.exposure_gpu_hours(), 0.9);
  EXPECT_DOUBLE_EQ(st.rate_per_gpu_hour(), rate.mean);
  EXPECT_LT(st.rate_lower(), st.rate_per_gpu_hour());
  EXPECT_GT(st.rate_upper(), st.rate_per_gpu_hour());
  EXPECT_NEAR(st.mtbf_seconds(), 3600 / (4 * rate.mean), 1e-6);
  EXPECT_NEAR(st.daly_seconds(), policy::DalyOptimum(0.06, st.mtbf_seconds()), 1e-9);
  EXPECT_NEAR(st.expected_waste(),
              policy::ExpectedWaste(st.interval_seconds(), 0.06, st.restart_seconds(), st.mtbf_seconds()), 1e-12);
  EXPECT_GT(st.alternative_waste(), st.expected_waste());
  EXPECT_FALSE(st.reason().empty());

  // The schedule moved to the decision, from a step ahead of every rank.
  const ckptd::v1::Schedule sched = Schedule();
  EXPECT_GT(sched.generation(), generation);
  EXPECT_EQ(sched.every_steps(), st.interval_steps());
  EXPECT_NE(sched.every_steps(), options_.every_steps);
  EXPECT_GT(sched.start_step(), 105u);
  EXPECT_EQ(st.every_steps(), st.interval_steps());

  // The same measurements again: no churn.
  CKPTD_ASSERT_OK(DecideAt(110));
  EXPECT_EQ(Schedule().generation(), sched.generation());
  // Twice the stall on every later checkpoint moves the optimum by ~40 %: the
  // schedule follows once the median does.
  for (uint64_t step : {200u, 300u, 400u}) {
    for (uint32_t r = 0; r < 4; ++r) {
      absl::StatusOr<ckptd::v1::ShardReport> rep = Write(step, r);
      ASSERT_THAT(rep.status(), IsOk());
      rep->set_stall_seconds(0.2);
      ckptd::v1::ReportShardRequest req;
      req.set_node_id(r < 2 ? "node-a" : "node-b");
      req.set_session(sessions_[req.node_id()]);
      *req.mutable_report() = *rep;
      CKPTD_ASSERT_OK(core_->ReportShard(req).status());
    }
  }
  CKPTD_ASSERT_OK(DecideAt(405));
  const ckptd::v1::IntervalStatus later = Interval();
  EXPECT_DOUBLE_EQ(later.stall_seconds(), 0.2);
  EXPECT_GT(Schedule().every_steps(), sched.every_steps());
  EXPECT_EQ(Schedule().every_steps(), later.interval_steps());
}

TEST_F(IntervalPolicyTest, OldTargetsBeforeTheNewStartStayForRanksThatHaveNotHeard) {
  options_.every_steps = 5;
  StartOver();
  CKPTD_ASSERT_OK(BeatAll(3, 0.1, 0.125));
  CommitStep(5);
  CKPTD_ASSERT_OK(DecideAt(7));
  const ckptd::v1::Schedule sched = Schedule();
  ASSERT_NE(sched.every_steps(), 5u);
  // Between the fastest rank (7) and the new start, every step the old rule
  // named is still a target, and no other.
  ckptd::v1::Schedule old;
  old.set_every_steps(5);
  for (uint64_t step = 8; step < sched.start_step(); ++step) {
    EXPECT_EQ(ScheduledAt(sched, step), ScheduledAt(old, step)) << step;
  }
  EXPECT_TRUE(ScheduledAt(sched, sched.start_step()));
}

TEST_F(IntervalPolicyTest, FixedIntervalNeverMoves) {
  options_.interval_automatic = false;
  StartOver();
  CKPTD_ASSERT_OK(BeatAll(95, 0.1, 0.125));
  CommitStep(100);
  CKPTD_ASSERT_OK(DecideAt(105));
  EXPECT_EQ(Schedule().every_steps(), options_.every_steps);
  const ckptd::v1::IntervalStatus st = Interval();
  EXPECT_FALSE(st.automatic());
  EXPECT_THAT(st.reason(), HasSubstr("fixed"));
  EXPECT_GT(st.interval_steps(), 0u);  // what the policy would choose, for comparison
}

TEST_F(IntervalPolicyTest, AFailureCountsOnceAndItsRestartIsTimedToTheFirstStepAfterTheRestore) {
  CKPTD_ASSERT_OK(BeatAll(95, 0.1, 0.125));
  CommitStep(100);
  CKPTD_ASSERT_OK(BeatAll(120, 0.1, 0.125));
  CKPTD_ASSERT_OK(Die("node-a", 1));
  CKPTD_ASSERT_OK(Die("node-b", 3));  // the same incident
  EXPECT_EQ(Interval().failures(), 1u);
  clock_.Advance(absl::Seconds(30));
  RestoreAll(100);
  CKPTD_ASSERT_OK(BeatAll(100, 0.1, 0.125));  // loaded, not yet stepping
  EXPECT_EQ(Interval().restarts_measured(), 0u);
  clock_.Advance(absl::Seconds(2));
  CKPTD_ASSERT_OK(BeatAll(101, 0.1, 0.125));
  const ckptd::v1::IntervalStatus st = Interval();
  EXPECT_EQ(st.restarts_measured(), 1u);
  EXPECT_FALSE(st.restart_assumed());
  EXPECT_DOUBLE_EQ(st.restart_seconds(), 32);
  // More failures raise the estimated rate.
  const double rate = st.rate_per_gpu_hour();
  CKPTD_ASSERT_OK(Die("node-a", 0));
  EXPECT_EQ(Interval().failures(), 2u);
  EXPECT_GT(Interval().rate_per_gpu_hour(), rate);
}

TEST_F(IntervalPolicyTest, RestoreToAnOlderStepCountsTheScheduleFromTheStart) {
  options_.every_steps = 10;
  StartOver();
  CKPTD_ASSERT_OK(BeatAll(5, 0.1, 0.125));
  CommitStep(10);
  CKPTD_ASSERT_OK(DecideAt(12));
  const ckptd::v1::Schedule moved = Schedule();
  ASSERT_GT(moved.start_step(), 12u);
  CKPTD_ASSERT_OK(Die("node-a", 0));
  RestoreAll(10);
  const ckptd::v1::Schedule after = Schedule();
  EXPECT_EQ(after.every_steps(), moved.every_steps());
  EXPECT_LT(after.start_step(), after.every_steps());
  // Same phase: the steps the moved rule named are still named.
  EXPECT_TRUE(ScheduledAt(after, moved.start_step() + moved.every_steps()));
}

TEST_F(IntervalPolicyTest, UnknownOrHostileJobIsAnError) {
  ckptd::v1::GetIntervalRequest req;
  req.set_job("nope");
  EXPECT_THAT(core_->GetInterval(req), StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  req.set_job("../x");
  EXPECT_THAT(core_->GetInterval(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name")));
}

}  // namespace
}  // namespace ckptd::coordinator
