// CoordinatorCore: drills (orders to agents, their reports, and what followed).
#include <cstdint>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "base/testing/matchers.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/testing_core_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;

// KILL_COORDINATOR is carried out by the coordinator itself, and only by a
// replicated one (options.kill_self, set by the binary with --etcd-endpoints):
// a single coordinator refuses it, saying why; a replica answers with its
// own address and a fresh drill id, and has kill_self called once.
TEST_F(CoordinatorCoreTest, KillCoordinatorIsForReplicatedCoordinatorsOnly) {
  Register("node-a", {0, 1});
  Register("node-b", {2, 3});
  ckptd::v1::RunDrillRequest req;
  req.set_job(kJob);
  req.set_scenario(ckptd::v1::KILL_COORDINATOR);
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kFailedPrecondition,
                                             HasSubstr("KILL_COORDINATOR needs replicated coordinators")));
  int kills = 0;
  options_.kill_self = [&kills] {
    ++kills;
    return std::string("10.0.0.2:7070");
  };
  Reset();
  Register("node-a", {0, 1});
  Register("node-b", {2, 3});
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RunDrillResponse ordered, core_->RunDrill(req));
  EXPECT_EQ(ordered.node_id(), "10.0.0.2:7070");
  EXPECT_GT(ordered.drill_id(), 0u);
  EXPECT_EQ(kills, 1);
  // No agent is told anything.
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::HeartbeatAck ack, Beat("node-a"));
  EXPECT_TRUE(ack.drills().empty());
  // It strikes the leader at once: a target or a step is refused.
  req.set_target_node("node-a");
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no target or step")));
  req.clear_target_node();
  req.set_at_step(100);
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no target or step")));
  req.set_job("no-such-job");
  req.set_at_step(0);
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no job no-such-job")));
  EXPECT_EQ(kills, 1);
}

// Agents ignore a drill id they carried out already: a coordinator started
// again (or a new leader of replicated ones) a second later orders drills
// under ids its predecessor never gave, and the agent gets the new order.
TEST_F(CoordinatorCoreTest, ARestartedCoordinatorNeverReusesADrillId) {
  Register("node-a", {0, 1}, 4, /*drills_allowed=*/true);
  Register("node-b", {2, 3});
  CommitStep(10);
  ckptd::v1::RunDrillRequest req;
  req.set_job(kJob);
  req.set_scenario(ckptd::v1::KILL_TRAINER);
  req.set_rank(1);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RunDrillResponse first, core_->RunDrill(req));
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RunDrillResponse second, core_->RunDrill(req));
  EXPECT_EQ(second.drill_id(), first.drill_id() + 1);
  clock_.Advance(absl::Seconds(1));
  Reset();
  Register("node-a", {0, 1}, 4, /*drills_allowed=*/true);
  Register("node-b", {2, 3});
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RunDrillResponse after, core_->RunDrill(req));
  EXPECT_GT(after.drill_id(), second.drill_id());
  // The new order, and the two its predecessor saved that no report closed.
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::HeartbeatAck ack, Beat("node-a"));
  ASSERT_EQ(ack.drills_size(), 3);
  EXPECT_EQ(ack.drills(0).drill_id(), first.drill_id());
  EXPECT_EQ(ack.drills(1).drill_id(), second.drill_id());
  EXPECT_EQ(ack.drills(2).drill_id(), after.drill_id());
}

// A coordinator that takes over (a restart, a new leader) reads the drills
// its predecessor saved: an order not carried out yet is sent again,
// GetDrill answers for it, and once the agent reported it the report
// survives the next takeover and the order is not sent again.
TEST_F(CoordinatorCoreTest, ANewCoordinatorTakesOverTheDrillsUnderWay) {
  Register("node-a", {0, 1}, 4, /*drills_allowed=*/true);
  Register("node-b", {2, 3});
  CommitStep(10);
  ckptd::v1::RunDrillRequest req;
  req.set_job(kJob);
  req.set_scenario(ckptd::v1::KILL_TRAINER);
  req.set_rank(1);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RunDrillResponse ordered, core_->RunDrill(req));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<ckptd::v1::DrillRecord> saved, state_->ListDrills());
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(saved[0].id(), ordered.drill_id());
  EXPECT_FALSE(saved[0].has_report());

  Reset();  // the leader died before node-a's agent heard of the order
  Register("node-a", {0, 1}, 4, /*drills_allowed=*/true);
  Register("node-b", {2, 3});
  ckptd::v1::GetDrillRequest get;
  get.set_drill_id(ordered.drill_id());
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::DrillStatus st, core_->GetDrill(get));
  EXPECT_EQ(st.node_id(), "node-a");
  EXPECT_EQ(st.request().scenario(), ckptd::v1::KILL_TRAINER);
  EXPECT_EQ(st.newest_committed_at_order(), 10u);
  EXPECT_FALSE(st.has_report());
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::HeartbeatAck ack, Beat("node-a"));
  ASSERT_EQ(ack.drills_size(), 1);
  EXPECT_EQ(ack.drills(0).drill_id(), ordered.drill_id());
  EXPECT_EQ(ack.drills(0).rank(), 1u);

  // The agent carries it out and reports (again with later heartbeats: one save).
  ckptd::v1::Heartbeat hb = HeartbeatOf("node-a");
  ckptd::v1::DrillReport* report = hb.add_drill_reports();
  report->set_drill_id(ordered.drill_id());
  report->set_injected(true);
  report->set_injected_unix_nanos(absl::ToUnixNanos(clock_.Now()));
  report->set_detail("SIGKILL to rank 1's trainer");
  CKPTD_ASSERT_OK(core_->OnHeartbeat(hb).status());
  CKPTD_ASSERT_OK(core_->OnHeartbeat(hb).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(saved, state_->ListDrills());
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_TRUE(saved[0].has_report());

  clock_.Advance(absl::Seconds(1));
  Reset();
  Register("node-a", {0, 1}, 4, /*drills_allowed=*/true);
  Register("node-b", {2, 3});
  CKPTD_ASSERT_OK_AND_ASSIGN(st, core_->GetDrill(get));
  EXPECT_TRUE(st.report().injected());
  EXPECT_EQ(st.report().detail(), "SIGKILL to rank 1's trainer");
  CKPTD_ASSERT_OK_AND_ASSIGN(ack, Beat("node-a"));
  EXPECT_TRUE(ack.drills().empty());
  // New orders take ids above every saved one.
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RunDrillResponse next, core_->RunDrill(req));
  EXPECT_GT(next.drill_id(), ordered.drill_id());
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
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kFailedPrecondition,
                                             HasSubstr("node-b's agent was not started with --allow-drills")));
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
  CKPTD_ASSERT_OK(ReportFailure("node-a", 1, ckptd::v1::TRAINER_DIED));

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
  CKPTD_ASSERT_OK(ReportFailure("node-b", 2, ckptd::v1::TRAINER_DIED));
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
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("hosts no rank of job")));
  req.set_at_step(0);  // at once it can
  CKPTD_EXPECT_OK(core_->RunDrill(req).status());
}

TEST_F(CoordinatorCoreTest, CorruptMemoryCarriesTheNewestCommittedStepAndTheDrillSaysWhereTheRankReadIt) {
  Register("node-a", {0, 1}, 4, /*drills_allowed=*/true);
  Register("node-b", {2, 3}, 4, /*drills_allowed=*/true);
  ckptd::v1::RunDrillRequest req;
  req.set_job(kJob);
  req.set_scenario(ckptd::v1::CORRUPT_MEMORY);
  req.set_rank(1);
  // Nothing committed: no copy in memory is worth damaging.
  EXPECT_THAT(core_->RunDrill(req),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("job llm-7b has no committed step")));
  req.set_target_node("node-a");
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("targets a rank")));
  req.clear_target_node();
  CommitStep(10);
  CommitStep(20);
  req.set_step(5);  // the coordinator's to fill
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RunDrillResponse ordered, core_->RunDrill(req));
  EXPECT_EQ(ordered.node_id(), "node-a");
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::HeartbeatAck ack, Beat("node-a"));
  ASSERT_EQ(ack.drills_size(), 1);
  EXPECT_EQ(ack.drills(0).scenario(), ckptd::v1::CORRUPT_MEMORY);
  EXPECT_EQ(ack.drills(0).rank(), 1u);
  EXPECT_EQ(ack.drills(0).step(), 20u);
  // Other scenarios carry no step.
  req.set_scenario(ckptd::v1::KILL_TRAINER);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RunDrillResponse kill, core_->RunDrill(req));
  CKPTD_ASSERT_OK_AND_ASSIGN(ack, Beat("node-a"));
  for (const ckptd::v1::DrillOrder& o : ack.drills()) {
    if (o.drill_id() == kill.drill_id()) {
      EXPECT_EQ(o.step(), 0u);
    }
  }

  // The trainer dies; every rank loads step 20 from memory, and the job
  // resumes before rank 1's trainer finds its copy damaged and its agent
  // reads the step again from the storage root.
  CKPTD_ASSERT_OK(ReportFailure("node-a", 1, ckptd::v1::TRAINER_DIED));
  for (uint32_t r = 0; r < 4; ++r) CKPTD_ASSERT_OK(Plan(r).status());
  for (uint32_t r = 0; r < 4; ++r) {
    ckptd::v1::RestorePlanRequest loaded = PlanRequest(r, 20, true);
    loaded.set_attempt_source(ckptd::v1::AGENT_MEMORY);
    CKPTD_ASSERT_OK(core_->GetRestorePlan(loaded).status());
  }
  CKPTD_ASSERT_OK(Beat("node-b", {{2, 21}, {3, 21}}).status());
  ckptd::v1::GetDrillRequest get;
  get.set_drill_id(ordered.drill_id());
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::DrillStatus st, core_->GetDrill(get));
  ASSERT_TRUE(st.resumed());
  EXPECT_EQ(st.request().step(), 20u);
  ASSERT_EQ(st.restore_sources().ranks_size(), 4);
  EXPECT_EQ(st.restore_sources().ranks(1).source(), ckptd::v1::AGENT_MEMORY);
  ckptd::v1::RestorePlanRequest reread = PlanRequest(1, 20, true);
  reread.set_attempt_source(ckptd::v1::STORAGE_ROOT);
  reread.set_reread(true);
  CKPTD_ASSERT_OK_AND_ASSIGN(PlanResponse go, core_->GetRestorePlan(reread));
  EXPECT_EQ(go.verdict(), PlanResponse::GO);
  EXPECT_EQ(go.step(), 20u);
  CKPTD_ASSERT_OK_AND_ASSIGN(st, core_->GetDrill(get));
  for (uint32_t r = 0; r < 4; ++r) {
    EXPECT_EQ(st.restore_sources().ranks(r).source(), r == 1 ? ckptd::v1::STORAGE_ROOT : ckptd::v1::AGENT_MEMORY)
        << "rank " << r;
  }
  EXPECT_EQ(JobState().last_restore().ranks(1).source(), ckptd::v1::STORAGE_ROOT);
  // The reread is no failure and no new round.
  EXPECT_EQ(JobState().state(), ckptd::v1::JOB_RUNNING);
  EXPECT_EQ(JobState().last_restore().incarnation(), go.incarnation());
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

}  // namespace
}  // namespace ckptd::coordinator
