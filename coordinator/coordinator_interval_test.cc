// CoordinatorCore: the schedule (manual checkpoints and the interval policy).
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "base/status_macros.h"
#include "base/testing/matchers.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/state_store.h"
#include "coordinator/testing_core_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/two_level.h"
#include "protocol/schedule.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;

TEST_F(CoordinatorCoreTest, EveryRankGetsTheSameSchedule) {
  TwoNodes();
  CKPTD_ASSERT_OK_AND_ASSIGN(auto a, Beat("node-a"));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto b, Beat("node-b"));
  ASSERT_TRUE(a.known());
  ASSERT_EQ(a.schedules_size(), 1);
  ASSERT_EQ(b.schedules_size(), 1);
  EXPECT_EQ(a.schedules(0).SerializeAsString(), b.schedules(0).SerializeAsString());
  EXPECT_EQ(a.schedules(0).every_steps(), options_.every_steps);
  EXPECT_TRUE(protocol::ScheduledAt(a.schedules(0), 200));
  EXPECT_FALSE(protocol::ScheduledAt(a.schedules(0), 150));
  EXPECT_FALSE(protocol::ScheduledAt(a.schedules(0), 0));
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
  EXPECT_TRUE(protocol::ScheduledAt(ack.schedules(0), target.target_step()));
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
  EXPECT_FALSE(protocol::ScheduledAt(moved.schedules(0), target.target_step()));
  ASSERT_EQ(moved.schedules(0).extra_steps_size(), 1);
  EXPECT_GT(moved.schedules(0).extra_steps(0), target.target_step() + 3);

  req.set_job("no-such-job");
  EXPECT_THAT(core_->RequestCheckpoint(req), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no-such-job")));
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
    return ReportFailure(node, rank, ckptd::v1::TRAINER_DIED);
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

  // The schedule moved to the decision, from a step ahead of every rank:
  // two cadences, since trainers that die on a healthy node come back from
  // their agent's memory.
  const ckptd::v1::Schedule sched = Schedule();
  EXPECT_GT(sched.generation(), generation);
  EXPECT_EQ(sched.every_steps(), st.two_level().memory_interval_steps());
  EXPECT_EQ(sched.durable_every(), st.two_level().durable_every());
  EXPECT_GT(sched.durable_every(), 1u);
  EXPECT_NE(sched.every_steps(), options_.every_steps);
  EXPECT_GT(sched.start_step(), 105u);
  EXPECT_EQ(st.every_steps(), sched.every_steps());
  EXPECT_EQ(st.durable_every(), sched.durable_every());

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
      CKPTD_ASSERT_OK(core_->ReportShard(ShardRequest(r < 2 ? "node-a" : "node-b", *rep)).status());
    }
  }
  CKPTD_ASSERT_OK(DecideAt(405));
  const ckptd::v1::IntervalStatus later = Interval();
  EXPECT_DOUBLE_EQ(later.stall_seconds(), 0.2);
  EXPECT_GT(Schedule().every_steps(), sched.every_steps());
  EXPECT_EQ(Schedule().every_steps(), later.two_level().memory_interval_steps());
}

TEST_F(IntervalPolicyTest, OneCadenceWhereANodeKeepsNothingInMemoryOrTheOperatorFixesK) {
  // node-b's agent runs without its memory tier: nothing comes back from
  // memory, so every checkpoint is durable.
  ckptd::v1::RegisterAgentRequest req = Registration("node-b", {2, 3});
  req.set_memory_tier(false);
  Register(req);
  CKPTD_ASSERT_OK(BeatAll(95, 0.1, 0.125));
  CommitStep(100);
  CKPTD_ASSERT_OK(DecideAt(105));
  ckptd::v1::IntervalStatus st = Interval();
  ASSERT_TRUE(st.decided()) << st.waiting_for();
  EXPECT_FALSE(st.two_level().memory_tier());
  for (const auto& c : st.two_level().classes()) EXPECT_FALSE(c.from_memory()) << c.name();
  EXPECT_EQ(st.two_level().durable_every(), 1u);
  EXPECT_LE(Schedule().durable_every(), 1u);
  EXPECT_EQ(Schedule().every_steps(), st.interval_steps());

  // --durable-every 5 with every node's memory tier: k stays 5.
  options_.durable_every = 5;
  StartOver();
  EXPECT_EQ(Schedule().durable_every(), 5u);  // from the start
  CKPTD_ASSERT_OK(BeatAll(195, 0.1, 0.125));
  CommitStep(200);
  CKPTD_ASSERT_OK(DecideAt(205));
  st = Interval();
  EXPECT_EQ(st.two_level().durable_every(), 5u);
  EXPECT_EQ(st.two_level().reason(), "durable every k set by the operator");
  EXPECT_EQ(Schedule().durable_every(), 5u);
  EXPECT_EQ(Schedule().every_steps(), st.two_level().memory_interval_steps());
}

TEST_F(IntervalPolicyTest, AMemoryCheckpointCompletesWhenEveryRankReportedIt) {
  options_.durable_every = 3;
  StartOver();
  CKPTD_ASSERT_OK(BeatAll(95, 0.1, 0.125));
  CommitStep(100);
  // Step 110: kept in memory on every rank, reported without a file.
  for (uint32_t r = 0; r < 4; ++r) {
    ckptd::v1::ShardReport rep;
    rep.set_job(kJob);
    rep.set_step(110);
    rep.set_world_size(4);
    rep.set_memory_only(true);
    rep.set_stall_seconds(0.02);
    rep.mutable_shard()->set_rank(r);
    rep.mutable_shard()->set_file_length(4096 + r);
    rep.mutable_shard()->set_index_xxh3(77 + r);
    CKPTD_ASSERT_OK_AND_ASSIGN(auto resp, core_->ReportShard(ShardRequest(r < 2 ? "node-a" : "node-b", rep)));
    EXPECT_FALSE(resp.committed());
  }
  // Nothing was written, nothing committed; the coordinator knows the step in memory.
  EXPECT_FALSE(Exists(absl::StrCat(kRoot, "/", kJob, "/step-110")));
  ckptd::v1::ListStepsRequest list;
  list.set_job(kJob);
  CKPTD_ASSERT_OK_AND_ASSIGN(auto steps, core_->ListSteps(list));
  for (const auto& e : steps.steps()) EXPECT_NE(e.step(), 110u);
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
    EXPECT_EQ(protocol::ScheduledAt(sched, step), protocol::ScheduledAt(old, step)) << step;
  }
  EXPECT_TRUE(protocol::ScheduledAt(sched, sched.start_step()));
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
  // Within one durable period, so that the durable steps stay where they were.
  EXPECT_LT(after.start_step(), after.every_steps() * std::max<uint64_t>(1, after.durable_every()));
  EXPECT_EQ(after.durable_every(), moved.durable_every());
  // Same phase: the steps the moved rule named are still named.
  EXPECT_TRUE(protocol::ScheduledAt(after, moved.start_step() + moved.every_steps()));
}

// The failures seen by class, for the two cadences: [process, node, wide].
std::array<uint64_t, 3> ByClass(const ckptd::v1::IntervalStatus& st) {
  std::array<uint64_t, 3> n = {0, 0, 0};
  if (st.two_level().classes_size() != 3) return n;
  for (int c = 0; c < 3; ++c) n[c] = st.two_level().classes(c).failures();
  return n;
}

TEST_F(IntervalPolicyTest, AFailureCountsOnceInTheWidestClassOfItsRestart) {
  using Counts = std::array<uint64_t, 3>;
  CKPTD_ASSERT_OK(BeatAll(95, 0.1, 0.125));
  CommitStep(100);
  CKPTD_ASSERT_OK(BeatAll(101, 0.1, 0.125));
  // A trainer dies: a process failure, however many ranks go with it.
  CKPTD_ASSERT_OK(Die("node-a", 1));
  CKPTD_ASSERT_OK(Die("node-b", 2));
  ckptd::v1::IntervalStatus st = Interval();
  ASSERT_EQ(st.two_level().classes_size(), 3);
  EXPECT_EQ(st.two_level().classes(0).name(), "process");
  EXPECT_EQ(st.two_level().classes(1).name(), "node");
  EXPECT_EQ(st.two_level().classes(2).name(), "wide");
  EXPECT_EQ(ByClass(st), (Counts{1, 0, 0}));
  // Then, before the job runs again, node-a is lost: the same restart, now
  // a node failure.
  clock_.Advance(options_.node_lost_after + absl::Seconds(1));
  CKPTD_ASSERT_OK(Beat("node-b").status());
  core_->Tick();
  st = Interval();
  EXPECT_EQ(ByClass(st), (Counts{0, 1, 0}));
  EXPECT_EQ(st.failures(), 1u);
  // And node-b too: several nodes at once, a wide failure.
  clock_.Advance(options_.node_lost_after + absl::Seconds(1));
  core_->Tick();
  st = Interval();
  EXPECT_EQ(ByClass(st), (Counts{0, 0, 1}));
  EXPECT_EQ(st.failures(), 1u);
  // Nothing is lost over a coordinator restart: the counts live in the job's record.
  Reset();
  EXPECT_EQ(ByClass(Interval()), (Counts{0, 0, 1}));
}

TEST_F(IntervalPolicyTest, TwoCadencesFromTheClassesAndTheMeasuredCosts) {
  options_.failure_mix = policy::FailureMix{0.5, 0.3, 0.2};
  StartOver();
  CKPTD_ASSERT_OK(BeatAll(95, 0.1, 0.125));
  CommitStep(100);  // stall 0.01 s, persist 0.25 s
  CKPTD_ASSERT_OK(DecideAt(105));
  const ckptd::v1::IntervalStatus st = Interval();
  ASSERT_TRUE(st.decided()) << st.waiting_for();
  const ckptd::v1::TwoLevelStatus& two = st.two_level();
  ASSERT_EQ(two.classes_size(), 3);
  EXPECT_NEAR(two.classes(0).prior_fraction(), 0.5, 1e-12);
  // No replication partners here: only process failures come back from memory.
  EXPECT_FALSE(two.peer_copies());
  EXPECT_TRUE(two.classes(0).from_memory());
  EXPECT_FALSE(two.classes(1).from_memory());
  EXPECT_FALSE(two.classes(2).from_memory());
  double total_rate = 0;
  for (const auto& c : two.classes()) total_rate += c.rate_per_gpu_hour();
  EXPECT_NEAR(total_rate, st.rate_per_gpu_hour(), 1e-9 * st.rate_per_gpu_hour());
  EXPECT_NEAR(two.memory_rate_per_s(), two.classes(0).rate_per_gpu_hour() * 4 / 3600, 1e-12);
  EXPECT_NEAR(two.durable_rate_per_s(),
              (two.classes(1).rate_per_gpu_hour() + two.classes(2).rate_per_gpu_hour()) * 4 / 3600, 1e-12);
  // δm is the stall, δd the persist's slowdown.
  EXPECT_DOUBLE_EQ(two.memory_cost_seconds(), 0.01);
  EXPECT_NEAR(two.durable_cost_seconds(), 0.25 * (1 - 0.1 / 0.125), 1e-12);
  // The decision is DecideTwoLevel's for those inputs.
  policy::TwoLevelInputs in;
  in.memory_rate_per_s = two.memory_rate_per_s();
  in.durable_rate_per_s = two.durable_rate_per_s();
  in.memory_cost_s = two.memory_cost_seconds();
  in.durable_cost_s = two.durable_cost_seconds();
  in.persist_s = st.persist_seconds();
  in.memory_restart_s = in.durable_restart_s = st.restart_seconds();
  in.step_s = st.step_seconds();
  in.max_interval_s = st.max_interval_seconds();
  CKPTD_ASSERT_OK_AND_ASSIGN(policy::TwoLevelDecision d, policy::DecideTwoLevel(in));
  EXPECT_EQ(two.durable_every(), d.durable_every);
  EXPECT_GT(two.durable_every(), 1u);
  EXPECT_EQ(two.memory_interval_steps(), d.memory_steps);
  EXPECT_EQ(two.durable_interval_steps(), d.memory_steps * d.durable_every);
  EXPECT_DOUBLE_EQ(two.expected_waste(), d.expected_waste);
  EXPECT_LT(two.expected_waste(), two.single_waste());
  EXPECT_EQ(two.reason(), d.reason);
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
