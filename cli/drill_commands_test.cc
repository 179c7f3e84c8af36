#include "cli/drill_commands.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/testing/json_checker.h"
#include "cli/testing_drills.h"
#include "cli/testing_fake_coordinator.h"
#include "cli/testing_terminal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::cli {
namespace {

using ::ckptd::testing::IsValidJson;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// ----------------------------------------------------------------- drills

class DrillCommandTest : public OperatorCommandsTest {
 protected:
  void SetUp() override {
    now_ = absl::FromUnixNanos(kT0);  // the coordinator's clock and this one agree
    fake_.run_drill->set_drill_id(7);
    fake_.run_drill->set_node_id("node-b");
  }
  // The drill as ordered, steps 20 and 40 committed by then.
  static ckptd::v1::DrillStatus AtOrder(ckptd::v1::DrillStatus st) {
    st.set_had_committed_at_order(true);
    st.set_newest_committed_at_order(40);
    return st;
  }
  static ckptd::v1::DrillStatus Base() { return AtOrder(OrderedDrill()); }
  // ckptctl drill run --coordinator kAddress `argv`.
  Result Drill(std::vector<std::string> argv) {
    argv.insert(argv.begin(), {"run", "--coordinator", kAddress});
    return RunExactly(RunDrillCommand, argv);
  }
  // ResumedDrill() as the agent ends it: the killed trainer is let go at once.
  static ckptd::v1::DrillStatus Resumed() {
    ckptd::v1::DrillStatus st = AtOrder(ResumedDrill());
    st.mutable_report()->set_drill_id(7);
    st.mutable_report()->set_ended(true);
    st.mutable_report()->set_ended_unix_nanos(kT0 + 50'000'000);
    return st;
  }
  // Steps 20 and 40 committed, and a running job "llm" with every rank alive.
  void HealthyJob() {
    ckptd::v1::ListStepsResponse steps;
    *steps.add_steps() = Step(20, ckptd::v1::STEP_COMMITTED);
    *steps.add_steps() = Step(40, ckptd::v1::STEP_COMMITTED);
    fake_.steps = {steps};
    fake_.preview->set_step(40);
    fake_.cluster = Running(47, {});
    fake_.cluster.mutable_jobs(0)->set_ranks_alive(4);
  }
  // A suite file named after the test.
  std::string SuiteFile(absl::string_view contents) { return TokenFile("suite", contents); }
  // ckptctl drill suite `file` --coordinator kAddress --job llm --token-file F `more`.
  Result Suite(const std::string& file, std::vector<std::string> more = {}) {
    std::vector<std::string> argv = {"suite", file, "--coordinator", kAddress, "--job", "llm", "--token-file",
                                     TokenFile("drill-token", "s3cret")};
    argv.insert(argv.end(), more.begin(), more.end());
    return RunExactly(RunDrillCommand, argv);
  }
  std::string ReadBack(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Step `step`, committed at kT0 - 1 s + `step` ms.
  static ckptd::v1::StepEntry Step(uint64_t step, ckptd::v1::StepState state, uint32_t ranks = 4) {
    return StepAt(step, state, kT0 - 1'000'000'000 + static_cast<int64_t>(step) * 1'000'000, ranks);
  }
};

// kill-coordinator: the leader answers the order and dies; the drill
// follows the replica that leads under a new epoch, waits for a step
// committed after the kill, and reports both times.
TEST_F(DrillCommandTest, KillCoordinatorFollowsTheNewLeaderToTheNextCommit) {
  fake_.run_drill->set_node_id("10.0.0.1:7070");
  ckptd::v1::GetClusterStatusResponse before = Running(47, {});
  before.mutable_jobs(0)->set_ranks_alive(4);
  before.mutable_replication()->set_leader("10.0.0.1:7070");
  before.mutable_replication()->set_epoch(5);
  fake_.cluster = before;
  ckptd::v1::GetClusterStatusResponse after = Running(63, {});
  after.mutable_replication()->set_leader("10.0.0.2:7070");
  after.mutable_replication()->set_epoch(9);
  fake_.cluster_from_call[3] = after;  // two answers of the old epoch (before the order, and one poll)
  ckptd::v1::ListStepsResponse old_steps;
  *old_steps.add_steps() = Step(20, ckptd::v1::STEP_COMMITTED);
  *old_steps.add_steps() = Step(40, ckptd::v1::STEP_COMMITTED);
  ckptd::v1::ListStepsResponse new_steps = old_steps;
  ckptd::v1::StepEntry* next = new_steps.add_steps();
  *next = Step(60, ckptd::v1::STEP_COMMITTED);
  next->set_committed_unix_nanos(absl::ToUnixNanos(now_ + absl::Seconds(30)));
  fake_.steps = {old_steps, new_steps};

  Result r = Drill({"--job", "llm", "--scenario", "kill-coordinator", "--json", "--token-file",
                    TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(r.code, base::kExitOk) << r.out << r.err;
  ASSERT_TRUE(fake_.drill_request.has_value());
  EXPECT_EQ(fake_.drill_request->scenario(), ckptd::v1::KILL_COORDINATOR);
  EXPECT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\"new_leader\":\"10.0.0.2:7070\""));
  EXPECT_THAT(r.out, HasSubstr("\"failover_seconds\":"));
  EXPECT_THAT(r.out, HasSubstr("\"next_commit_seconds\":"));
  EXPECT_THAT(r.out, HasSubstr("SIGKILL to the leading coordinator 10.0.0.1:7070 (epoch 5)"));
  EXPECT_THAT(r.out, HasSubstr("\"detail\":\"step 60, "));
  EXPECT_THAT(r.out, HasSubstr("\"passed\":true"));
  EXPECT_THAT(r.out, HasSubstr("the fastest rank at step 63, 47 before the kill"));
  EXPECT_THAT(r.out, HasSubstr("\"scenario\":\"kill-coordinator\""));

  // No new leader within --watch: the verdict fails, naming it.
  fake_.cluster_from_call.clear();
  fake_.cluster_calls = 0;
  fake_.list_steps_calls = 0;
  r = Drill({"--job", "llm", "--scenario", "kill-coordinator", "--watch", "5s", "--token-file",
             TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(r.code, base::kExitFailed) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("FAIL  a standby took over: no new leader within --watch 5s"));
  EXPECT_THAT(r.out, HasSubstr("FAIL  the job committed a step after the kill: none within --watch"));
  EXPECT_THAT(r.out, HasSubstr("kill-coordinator: the leader 10.0.0.1:7070"));
}

TEST_F(DrillCommandTest, KillCoordinatorTakesNoTargetAndASingleCoordinatorRefusesIt) {
  Result r = Drill({"--job", "llm", "--scenario", "kill-coordinator", "--target", "1", "--token-file",
                    TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(r.code, base::kExitUsage) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("kill-coordinator strikes the leading coordinator at once: no --target or --at-step"));
  EXPECT_FALSE(fake_.drill_request.has_value());
  fake_.run_drill = absl::FailedPreconditionError(
      "KILL_COORDINATOR needs replicated coordinators (--etcd-endpoints): a single coordinator has no standby");
  r = Drill({"--job", "llm", "--scenario", "kill-coordinator", "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(r.code, base::kExitFailed) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("needs replicated coordinators"));
}

TEST_F(DrillCommandTest, KilledTrainerIsDetectedRestoredAndJudged) {
  // Reported, then detected and resumed.
  const ckptd::v1::DrillStatus after = Resumed();
  ckptd::v1::DrillStatus injected = Base();
  *injected.mutable_report() = after.report();
  fake_.drill = {Base(), injected, injected, after};
  ckptd::v1::ListStepsResponse steps;
  *steps.add_steps() = Step(20, ckptd::v1::STEP_COMMITTED);
  *steps.add_steps() = Step(40, ckptd::v1::STEP_COMMITTED);
  fake_.steps = {steps};
  fake_.preview->set_step(40);
  fake_.verify_stream = {Verified(40, true)};

  Result r = Drill({"--job", "llm", "--scenario", "kill-trainer", "--target", "2",
                                   "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(r.code, base::kExitOk) << r.out << r.err;
  ASSERT_TRUE(fake_.drill_request.has_value());
  EXPECT_EQ(fake_.drill_request->scenario(), ckptd::v1::KILL_TRAINER);
  EXPECT_EQ(fake_.drill_request->rank(), 2u);
  EXPECT_THAT(r.out, HasSubstr("drill 7: kill-trainer on node node-b (rank 2 of job llm)"));
  EXPECT_THAT(r.out, HasSubstr("+0.012 s  detected"));
  EXPECT_THAT(r.out, HasSubstr("training resumed from step 40"));
  EXPECT_THAT(r.out, HasSubstr("work lost    7 steps (0.1 s at 0.015 s per step)"));
  EXPECT_THAT(r.out, HasSubstr("restart      2.000 s"));
  EXPECT_THAT(r.out, HasSubstr("PASS  the failure was detected: 0.012 s after the injection"));
  EXPECT_THAT(r.out, HasSubstr("PASS  the restored step verifies intact: 4 shards"));
  EXPECT_THAT(r.out, HasSubstr("drill: PASS"));
  ASSERT_TRUE(fake_.verify_request.has_value());
  EXPECT_EQ(fake_.verify_request->step(), 40u);

  fake_.get_drill_calls = 0;
  Result j = Drill({"--job", "llm", "--scenario", "kill-trainer", "--target", "2",
                                   "--token-file", TokenFile("drill-token", "s3cret"), "--json"});
  EXPECT_EQ(j.code, base::kExitOk);
  EXPECT_TRUE(IsValidJson(j.out)) << j.out;
  EXPECT_THAT(j.out, AllOf(HasSubstr("\"detection_seconds\":0.012"), HasSubstr("\"lost_steps\":7"),
                           HasSubstr("\"restored_step\":40"), HasSubstr("\"passed\":true")));
}

TEST_F(DrillCommandTest, ARestoreOfTheCorruptedStepFailsTheVerdict) {
  ckptd::v1::DrillStatus st = Base();
  st.mutable_report()->set_injected(true);
  st.mutable_report()->set_injected_unix_nanos(kT0 + 1'000'000);
  st.mutable_report()->set_detail("flipped a byte of rank-0002.shard");
  st.set_newest_committed_at_order(30);  // step 40 committed between the order and the injection
  st.mutable_report()->set_step(40);
  fake_.drill = {st};
  ckptd::v1::VerifyProgress done;
  done.set_step(40);
  done.set_done(true);
  done.set_ok(false);
  done.add_problems("rank-0002.shard: tensor w block 0 chunk 3: checksum mismatch");
  fake_.verify_stream = {done};
  ckptd::v1::ListStepsResponse steps;
  *steps.add_steps() = Step(20, ckptd::v1::STEP_COMMITTED);
  *steps.add_steps() = Step(40, ckptd::v1::STEP_QUARANTINED);
  fake_.steps = {steps};
  fake_.preview->set_step(20);
  Result good = Drill({"--job", "llm", "--scenario", "corrupt-shard", "--target", "2",
                                      "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(good.code, base::kExitOk) << good.out;
  ASSERT_TRUE(fake_.verify_request.has_value());
  EXPECT_EQ(fake_.verify_request->step(), 40u);
  EXPECT_THAT(good.out, AllOf(HasSubstr("PASS  the damaged step is quarantined"),
                              HasSubstr("PASS  corrupt data is never restored: a restart would restore step 20"),
                              HasSubstr("PASS  a restart picks the newest intact committed step: step 20 (the one "
                                        "before the damaged step)")));
  // A coordinator that would still restore step 40 fails the drill.
  fake_.preview->set_step(40);
  fake_.get_drill_calls = 0;
  Result bad = Drill({"--job", "llm", "--scenario", "corrupt-shard", "--target", "2",
                                     "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(bad.code, base::kExitFailed);
  EXPECT_THAT(bad.out, AllOf(HasSubstr("FAIL  corrupt data is never restored"), HasSubstr("drill: FAIL")));
}

TEST_F(DrillCommandTest, CorruptMemoryPassesOnlyWhenTheRankReadTheDamagedStepFromDisk) {
  // Rank 2's copy of step 40 in memory was damaged, its trainer killed; every
  // rank restored step 40, rank 2 from `source`.
  auto drill = [](ckptd::v1::RestoreSource source) {
    ckptd::v1::DrillStatus st = Resumed();
    st.mutable_request()->set_scenario(ckptd::v1::CORRUPT_MEMORY);
    st.mutable_request()->set_step(40);
    st.mutable_report()->set_step(40);
    st.mutable_report()->set_detail(
        "flipped the byte at offset 131072 of buffer 'w' in the kept copy of step 40 of rank 2 of job llm (staging "
        "slot 0); SIGKILL sent to pid 4242 (rank 2 of job llm, at step 47)");
    ckptd::v1::RestoreSummary* sources = st.mutable_restore_sources();
    sources->set_step(40);
    for (uint32_t r = 0; r < 4; ++r) {
      ckptd::v1::RestoreSummary::Rank* e = sources->add_ranks();
      e->set_rank(r);
      e->set_source(r == 2 ? source : ckptd::v1::AGENT_MEMORY);
      e->set_node_id(r < 2 ? "node-a" : "node-b");
    }
    return st;
  };
  HealthyJob();
  fake_.verify_stream = {Verified(40, true)};
  const std::vector<std::string> argv = {"--job",    "llm", "--scenario",   "corrupt-memory",
                                         "--target", "2",   "--token-file", TokenFile("drill-token", "s3cret")};
  fake_.drill = {drill(ckptd::v1::NODE_LOCAL)};
  Result good = Drill(argv);
  EXPECT_EQ(good.code, base::kExitOk) << good.out << good.err;
  ASSERT_TRUE(fake_.drill_request.has_value());
  EXPECT_EQ(fake_.drill_request->scenario(), ckptd::v1::CORRUPT_MEMORY);
  EXPECT_EQ(fake_.drill_request->rank(), 2u);
  EXPECT_THAT(
      good.out,
      AllOf(HasSubstr("PASS  the failure was detected"), HasSubstr("PASS  the job restarted and resumed training"),
            HasSubstr("PASS  it restored the step whose copy in memory was damaged: step 40; the damaged "
                      "copy was of step 40"),
            HasSubstr("PASS  the damaged copy was detected and the rank read the step from disk: rank 2 read "
                      "it from node-local"),
            HasSubstr("PASS  the restored step verifies intact"), HasSubstr("drill: PASS")));
  fake_.drill = {drill(ckptd::v1::STORAGE_ROOT)};
  fake_.get_drill_calls = 0;
  Result root = Drill(argv);
  EXPECT_EQ(root.code, base::kExitOk) << root.out;
  EXPECT_THAT(root.out, HasSubstr("rank 2 read it from storage-root"));
  // Read from the damaged copy in memory: the drill fails.
  fake_.drill = {drill(ckptd::v1::AGENT_MEMORY)};
  fake_.get_drill_calls = 0;
  Result bad = Drill(argv);
  EXPECT_EQ(bad.code, base::kExitFailed) << bad.out;
  EXPECT_THAT(bad.out, AllOf(HasSubstr("FAIL  the damaged copy was detected and the rank read the step from disk: "
                                       "rank 2 read it from memory: the damaged copy was used"),
                             HasSubstr("drill: FAIL")));
  // A restart from another step proves nothing about the damaged copy.
  ckptd::v1::DrillStatus other = drill(ckptd::v1::NODE_LOCAL);
  other.mutable_report()->set_step(20);
  fake_.drill = {other};
  fake_.get_drill_calls = 0;
  std::vector<std::string> json = argv;
  json.push_back("--json");
  Result elsewhere = Drill(json);
  EXPECT_EQ(elsewhere.code, base::kExitFailed) << elsewhere.out;
  EXPECT_TRUE(IsValidJson(elsewhere.out)) << elsewhere.out;
  EXPECT_THAT(elsewhere.out,
              AllOf(HasSubstr("\"damaged_step\":20"),
                    HasSubstr("{\"expectation\":\"it restored the step whose copy in memory was damaged\",\"held\":"
                              "false,\"detail\":\"step 40; the damaged copy was of step 20\"}")));
}

TEST_F(DrillCommandTest, StorageFaultMustLeaveTrainingRunningAndCheckpointsCommittingAfterward) {
  ckptd::v1::DrillStatus st = Base();
  st.mutable_report()->set_injected(true);
  st.mutable_report()->set_injected_unix_nanos(kT0);
  st.mutable_report()->set_ended(true);
  st.mutable_report()->set_ended_unix_nanos(kT0 + 10'000'000);
  ckptd::v1::FailureEvent* e = st.add_events();
  e->set_kind(ckptd::v1::PERSIST_FAILED);
  e->set_node_id("node-b");
  e->set_unix_nanos(kT0 + 5'000'000);
  st.set_first_detection_unix_nanos(kT0 + 5'000'000);
  fake_.drill = {st};
  ckptd::v1::ListStepsResponse steps;
  *steps.add_steps() = Step(40, ckptd::v1::STEP_COMMITTED);
  ckptd::v1::StepEntry later = Step(60, ckptd::v1::STEP_COMMITTED);
  later.set_committed_unix_nanos(kT0 + 20'000'000);
  *steps.add_steps() = later;
  fake_.steps = {steps};
  fake_.preview->set_step(60);
  Result r = Drill({"--job", "llm", "--scenario", "storage-enospc", "--target", "node-b",
                                   "--duration", "10ms", "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(r.code, base::kExitOk) << r.out << r.err;
  EXPECT_EQ(fake_.drill_request->target_node(), "node-b");
  EXPECT_DOUBLE_EQ(fake_.drill_request->duration_seconds(), 0.01);
  EXPECT_THAT(r.out, AllOf(HasSubstr("PASS  training went on without a restart"),
                           HasSubstr("PASS  checkpoints commit again after the fault: step 60")));
}

TEST_F(DrillCommandTest, RefusalsAndBadFlags) {
  ckptd::v1::DrillStatus st = Base();
  st.mutable_report()->set_error("drills are not allowed on this agent; start it with --allow-drills");
  fake_.drill = {st};
  Result refused = Drill({"--job", "llm", "--scenario", "kill-agent", "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(refused.code, base::kExitFailed);
  EXPECT_THAT(refused.err, HasSubstr("--allow-drills"));
  Result no_scenario = Drill({"--job", "llm", "--scenario", "meteor", "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(no_scenario.code, base::kExitUsage);
  EXPECT_THAT(no_scenario.err, HasSubstr("--scenario must be one of kill-trainer, hang-trainer"));
  Result node_for_rank =
      Drill({"--job", "llm", "--scenario", "kill-trainer", "--target", "node-a"});
  EXPECT_EQ(node_for_rank.code, base::kExitUsage);
  EXPECT_THAT(node_for_rank.err, HasSubstr("--target of kill-trainer is a rank number"));
  Result bad_duration =
      Drill({"--job", "llm", "--scenario", "hang-trainer", "--duration", "soon"});
  EXPECT_EQ(bad_duration.code, base::kExitUsage);
  EXPECT_THAT(bad_duration.err, HasSubstr("--duration: \"soon\""));
  Result not_run = RunExactly(RunDrillCommand, {"start"});
  EXPECT_EQ(not_run.code, base::kExitUsage);
  fake_.error = absl::UnavailableError("coordinator c:1: connection refused");
  Result down = Drill({"--job", "llm", "--scenario", "kill-agent", "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(down.code, base::kExitUnavailable);
  Result help = RunExactly(RunDrillCommand, {"--help"});
  EXPECT_EQ(help.code, base::kExitOk);
  for (const char* s : {"kill-trainer", "hang-trainer", "kill-agent", "cut-off-agent", "corrupt-shard",
                        "corrupt-memory", "storage-eio", "storage-enospc", "storage-slow", "--watch", "--at-step"}) {
    EXPECT_THAT(help.out, HasSubstr(s));
  }
}

TEST_F(DrillCommandTest, KillNodeWithPartnersAsksForThemAndSaysWhichWereKilled) {
  fake_.run_drill->add_partner_nodes("node-c");
  fake_.run_drill->add_partner_nodes("node-d");
  ckptd::v1::DrillStatus st = Resumed();
  st.mutable_request()->set_scenario(ckptd::v1::KILL_NODE);
  st.mutable_request()->set_target_node("node-b");
  st.mutable_request()->set_with_partners(true);
  st.add_partner_nodes("node-c");
  st.add_partner_nodes("node-d");
  fake_.drill = {st};
  HealthyJob();
  fake_.verify_stream = {Verified(40, true)};
  const std::string token = TokenFile("drill-token", "s3cret");
  Result r = Drill({"--job", "llm", "--scenario", "kill-node", "--target", "node-b", "--with-partners",
                    "--token-file", token});
  EXPECT_EQ(r.code, base::kExitOk) << r.out << r.err;
  ASSERT_TRUE(fake_.drill_request.has_value());
  EXPECT_EQ(fake_.drill_request->scenario(), ckptd::v1::KILL_NODE);
  EXPECT_TRUE(fake_.drill_request->with_partners());
  EXPECT_THAT(r.out, HasSubstr("drill 7: kill-node on node node-b, and on its replication partners node-c, node-d"));
  EXPECT_THAT(r.out, HasSubstr("partner nodes killed with node node-b: node-c, node-d"));

  fake_.get_drill_calls = 0;
  Result j = Drill({"--job", "llm", "--scenario", "kill-node", "--target", "node-b", "--with-partners",
                    "--token-file", token, "--json"});
  EXPECT_EQ(j.code, base::kExitOk) << j.err;
  EXPECT_TRUE(IsValidJson(j.out)) << j.out;
  EXPECT_THAT(j.out, HasSubstr("\"partner_nodes\":[\"node-c\",\"node-d\"]"));

  // Without the flag nothing asks for partners, and the report names none.
  fake_.drill = {Resumed()};
  r = Drill({"--job", "llm", "--scenario", "kill-node", "--target", "node-b", "--token-file", token});
  ASSERT_TRUE(fake_.drill_request.has_value());
  EXPECT_FALSE(fake_.drill_request->with_partners());
  EXPECT_THAT(r.out, Not(HasSubstr("partner nodes killed")));

  // Only kill-node takes it, on the command line and in a suite file.
  fake_.drill_request.reset();
  Result wrong = Drill({"--job", "llm", "--scenario", "kill-trainer", "--with-partners", "--token-file", token});
  EXPECT_EQ(wrong.code, base::kExitUsage);
  EXPECT_THAT(wrong.err, HasSubstr("--with-partners applies to kill-node only, not to kill-trainer"));
  EXPECT_FALSE(fake_.drill_request.has_value()) << "a refused flag still ordered a drill";
  Result suite = Suite(SuiteFile("kill-node --target node-b --with-partners\nkill-agent --with-partners\n"));
  EXPECT_EQ(suite.code, base::kExitUsage);
  EXPECT_THAT(suite.err, HasSubstr("line 2: --with-partners applies to kill-node only, not to kill-agent"));
  // The coordinator's own refusal (a partner without --allow-drills) is said as it is.
  fake_.run_drill = absl::FailedPreconditionError(
      "partner node node-c of node node-b: its agent was not started with --allow-drills");
  Result refused = Drill({"--job", "llm", "--scenario", "kill-node", "--target", "node-b", "--with-partners",
                          "--token-file", token});
  EXPECT_EQ(refused.code, base::kExitFailed);
  EXPECT_THAT(refused.err, HasSubstr("partner node node-c of node node-b"));
  Result help = RunExactly(RunDrillCommand, {"--help"});
  EXPECT_THAT(help.out, HasSubstr("--with-partners"));
}

TEST_F(DrillCommandTest, ADamagedRestoredStepFailsTheVerdictAndAnUnreadableOneIsNotAFailure) {
  fake_.drill = {Resumed()};
  HealthyJob();
  fake_.verify_stream = {Verified(40, false)};
  Result bad = Drill({"--job", "llm", "--scenario", "kill-trainer", "--target", "2", "--token-file",
                      TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(bad.code, base::kExitFailed) << bad.out;
  EXPECT_THAT(bad.out, AllOf(HasSubstr("FAIL  the restored step verifies intact: rank-0001.shard"),
                             HasSubstr("drill: FAIL")));
  // Retention may remove the restored step before the drill reads it:
  // said, not judged.
  fake_.verify_stream.clear();
  fake_.verify_end = absl::FailedPreconditionError("step 40 of job llm is not committed");
  Result gone = Drill({"--job", "llm", "--scenario", "kill-trainer", "--target", "2", "--token-file",
                       TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(gone.code, base::kExitOk) << gone.out;
  EXPECT_THAT(gone.out, HasSubstr("restored step not verified: step 40 of job llm is not committed"));
  EXPECT_THAT(gone.out, Not(HasSubstr("verifies intact")));
  // A verification that breaks for another reason fails the drill.
  fake_.verify_end = absl::DataLossError("shard rank-0003.shard: read failed");
  Result broken = Drill({"--job", "llm", "--scenario", "kill-trainer", "--target", "2", "--token-file",
                         TokenFile("drill-token", "s3cret"), "--json"});
  EXPECT_EQ(broken.code, base::kExitFailed);
  EXPECT_TRUE(IsValidJson(broken.out)) << broken.out;
  EXPECT_THAT(broken.out, HasSubstr("\"restored_verify_error\":\"shard rank-0003.shard: read failed\""));
  // --no-verify-restored reads nothing back.
  fake_.verify_request.reset();
  Result skipped = Drill({"--job", "llm", "--scenario", "kill-trainer", "--target", "2", "--no-verify-restored",
                          "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(skipped.code, base::kExitOk) << skipped.out;
  EXPECT_FALSE(fake_.verify_request.has_value());
  EXPECT_THAT(skipped.out, HasSubstr("not asked for (--no-verify-restored)"));
}

// The page's content is tested in drill_report_test.cc.
TEST_F(DrillCommandTest, HtmlWritesThePageAndFailsTheDrillWhenItCannot) {
  fake_.drill = {Resumed()};
  HealthyJob();
  fake_.verify_stream = {Verified(40, true)};
  const std::string page = TokenFile("report.html", "");
  Result r = Drill({"--job", "llm", "--scenario", "kill-trainer", "--target", "2", "--html", page, "--token-file",
                    TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(r.code, base::kExitOk) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("report written to ", page)));
  const std::string html = ReadBack(page);
  EXPECT_THAT(html, ::testing::StartsWith("<!DOCTYPE html>"));
  EXPECT_THAT(html, AllOf(HasSubstr("<title>ckptd drill: kill-trainer on node node-b (rank 2)</title>"),
                          HasSubstr("<svg"), HasSubstr("1 of 1 drill passed")));
  // --json says nothing of the page.
  Result j = Drill({"--job", "llm", "--scenario", "kill-trainer", "--target", "2", "--html", page, "--json",
                    "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(j.code, base::kExitOk) << j.out << j.err;
  EXPECT_TRUE(IsValidJson(j.out)) << j.out;
  // Where the page cannot be written: said, and the drill fails.
  Result unwritable = Drill({"--job", "llm", "--scenario", "kill-trainer", "--target", "2", "--html",
                             "/nonexistent-dir/x/report.html", "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(unwritable.code, base::kExitFailed);
  EXPECT_THAT(unwritable.err, HasSubstr("--html: cannot write /nonexistent-dir/x/report.html"));
}

TEST_F(DrillCommandTest, SuiteRunsEveryLineInOrderAndSumsUp) {
  fake_.drill = {Resumed()};
  HealthyJob();
  fake_.verify_stream = {Verified(40, true)};
  const std::string file = SuiteFile(
      "# this week's drills\n"
      "\n"
      "kill-trainer --target 2 --at-step 45\n"
      "   kill-trainer\t--target 3 once\n");
  Result bad = Suite(file);
  EXPECT_EQ(bad.code, base::kExitUsage);
  EXPECT_THAT(bad.err, HasSubstr(absl::StrCat(file, " line 4: unexpected \"once\"")));
  EXPECT_EQ(fake_.drill_request, std::nullopt) << "a bad file runs nothing";

  const std::string good = SuiteFile(
      "# this week's drills\n"
      "\n"
      "kill-trainer --target 2 --at-step 45\n"
      "   kill-trainer\t--target 3   # and the other node\n");
  // A step commits after each drill: the next one starts from it.
  ckptd::v1::StepEntry later = Step(60, ckptd::v1::STEP_COMMITTED);
  later.set_committed_unix_nanos(kT0 + 3600'000'000'000);
  *fake_.steps[0]->add_steps() = later;
  const std::string page = TokenFile("suite.html", "");
  Result r = Suite(good, {"--html", page});
  EXPECT_EQ(r.code, base::kExitOk) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("=== drill 1/2 (line 3): kill-trainer --target 2 --at-step 45"));
  EXPECT_THAT(r.out, HasSubstr("=== drill 2/2 (line 4): kill-trainer\\t--target 3\n"));  // TerminalSafe
  ASSERT_TRUE(fake_.drill_request.has_value());
  EXPECT_EQ(fake_.drill_request->rank(), 3u);  // the last one ordered
  EXPECT_EQ(fake_.drill_request->job(), "llm");
  EXPECT_THAT(r.out, HasSubstr("suite summary: job llm"));
  EXPECT_THAT(r.out, HasSubstr("suite: PASS (2 of 2 drills passed)"));
  const std::string html = ReadBack(page);
  EXPECT_THAT(html, AllOf(HasSubstr("2 of 2 drills passed"), HasSubstr("id=\"drill-1\""), HasSubstr("id=\"drill-2\"")));

  Result j = Suite(good, {"--json"});
  EXPECT_EQ(j.code, base::kExitOk);
  EXPECT_TRUE(IsValidJson(j.out)) << j.out;
  EXPECT_THAT(j.out, AllOf(HasSubstr("\"drills_passed\":2"), HasSubstr("\"drills_not_run\":0"),
                           HasSubstr("\"line\":3"), HasSubstr("\"passed\":true")));
}

TEST_F(DrillCommandTest, SuiteWaitsForAHealthyJobAndReportsWhatItCouldNotRun) {
  fake_.drill = {Resumed()};
  HealthyJob();
  fake_.verify_stream = {Verified(40, true)};
  // The job is restarting, and stays so.
  fake_.cluster.mutable_jobs(0)->set_state(ckptd::v1::JOB_RESTARTING);
  const std::string file = SuiteFile("kill-trainer --target 2\nstorage-eio --target node-b --duration 5s\n");
  Result r = Suite(file, {"--settle", "3s"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_EQ(fake_.drill_request, std::nullopt);
  EXPECT_THAT(r.out, HasSubstr("suite: FAIL (0 of 2 drills passed, 2 not run)"));
  EXPECT_THAT(r.err, HasSubstr("job llm was not healthy within 3s: the job is restarting"));
  // Back to running halfway through the wait: the drills run.
  fake_.cluster_calls = 0;
  ckptd::v1::GetClusterStatusResponse running = fake_.cluster;
  running.mutable_jobs(0)->set_state(ckptd::v1::JOB_RUNNING);
  fake_.cluster_from_call[3] = running;
  Result later = Suite(SuiteFile("kill-trainer --target 2\n"), {"--settle", "3s"});
  EXPECT_EQ(later.code, base::kExitOk) << later.out << later.err;
  // A failing drill with --stop-on-failure leaves the rest not run.
  fake_.verify_stream = {Verified(40, false)};
  Result stop = Suite(SuiteFile("kill-trainer --target 2\nkill-trainer --target 1\n"),
                      {"--stop-on-failure", "--json"});
  EXPECT_EQ(stop.code, base::kExitFailed);
  EXPECT_TRUE(IsValidJson(stop.out)) << stop.out;
  EXPECT_THAT(stop.out, AllOf(HasSubstr("\"drills_failed\":1"), HasSubstr("\"drills_not_run\":1"),
                              HasSubstr("--stop-on-failure")));
  EXPECT_EQ(fake_.drill_request->rank(), 2u);
}

TEST_F(DrillCommandTest, SuiteFileErrorsNameTheFileAndLine) {
  struct Case {
    std::string contents;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"", "lists no drill"},
      {"# only a comment\n", "lists no drill"},
      {"meteor --target 1\n", "line 1: the scenario must be one of kill-trainer"},
      {"kill-trainer --target node-a\n", "line 1: --target of kill-trainer is a rank number"},
      {"\nhang-trainer --duration soon\n", "line 2: --duration: \"soon\""},
      {"storage-slow --bogus 1\n", "line 1: unknown flag --bogus"},
      {"kill-trainer --target\n", "line 1:"},
      {std::string("kill-trainer\x01\n"), "line 1: holds a control character"},
  };
  for (const Case& c : cases) {
    const std::string file = SuiteFile(c.contents);
    Result r = Suite(file);
    EXPECT_EQ(r.code, base::kExitUsage) << c.contents;
    EXPECT_THAT(r.err, HasSubstr(c.says)) << c.contents;
  }
  Result missing = Suite("/nonexistent-dir/drills.txt");
  EXPECT_EQ(missing.code, base::kExitUsage);
  EXPECT_THAT(missing.err, HasSubstr("cannot read the suite file /nonexistent-dir/drills.txt"));
  Result no_file = RunExactly(RunDrillCommand, {"suite", "--coordinator", kAddress, "--job", "llm"});
  EXPECT_EQ(no_file.code, base::kExitUsage);
  EXPECT_THAT(no_file.err, HasSubstr("the suite FILE is required"));
  Result two = RunExactly(RunDrillCommand, {"suite", "a", "b", "--coordinator", kAddress, "--job", "llm"});
  EXPECT_EQ(two.code, base::kExitUsage);
  EXPECT_THAT(two.err, HasSubstr("unexpected argument \"b\""));
  Result help = RunExactly(RunDrillCommand, {"suite", "--help"});
  EXPECT_EQ(help.code, base::kExitOk);
  EXPECT_THAT(help.out, AllOf(HasSubstr("--settle"), HasSubstr("--stop-on-failure"), HasSubstr("exit status")));
}

// ----------------------------------------------------------------- hang-trainer

// A hang-trainer drill on rank 2 as the coordinator tells of it at `now`:
// SIGSTOP 50 ms after the order for `hang`; the hang detected at 10 s and
// the job resumed from step 40 at 12 s when `detected`; the trainer let go
// (SIGCONT) when the hang has run out, unless `never_let_go`.
ckptd::v1::DrillStatus HangAt(absl::Time now, absl::Duration hang, bool detected, bool never_let_go = false) {
  ckptd::v1::DrillStatus st = OrderedDrill();
  st.set_had_committed_at_order(true);
  st.set_newest_committed_at_order(40);
  st.mutable_request()->set_scenario(ckptd::v1::HANG_TRAINER);
  st.mutable_request()->set_rank(2);
  st.mutable_request()->set_duration_seconds(absl::ToDoubleSeconds(hang));
  const int64_t t = absl::ToUnixNanos(now);
  const int64_t injected = kT0 + 50'000'000;
  if (t < injected) return st;
  st.mutable_report()->set_drill_id(7);
  st.mutable_report()->set_injected(true);
  st.mutable_report()->set_injected_unix_nanos(injected);
  st.mutable_report()->set_detail(
      absl::StrCat("SIGSTOP sent to pid 4242 (rank 2 of job llm, at step 47) for ", absl::FormatDuration(hang)));
  if (detected && t >= kT0 + 10'000'000'000) {
    ckptd::v1::FailureEvent* e = st.add_events();
    e->set_kind(ckptd::v1::TRAINER_HUNG);
    e->set_node_id("node-b");
    e->set_has_rank(true);
    e->set_rank(2);
    e->set_unix_nanos(kT0 + 10'000'000'000);
    e->set_detail("no step for 10 s");
    st.set_first_detection_unix_nanos(e->unix_nanos());
    st.set_failed_unix_nanos(e->unix_nanos());
    st.set_step_at_failure(47);
  }
  if (detected && t >= kT0 + 12'000'000'000) {
    st.set_resumed(true);
    st.set_restored_step(40);
    st.set_resumed_unix_nanos(kT0 + 12'000'000'000);
  }
  const int64_t let_go = injected + absl::ToInt64Nanoseconds(hang);
  if (!never_let_go && t >= let_go) {
    st.mutable_report()->set_ended(true);
    st.mutable_report()->set_ended_unix_nanos(let_go);
    st.mutable_report()->set_detail(absl::StrCat(st.report().detail(), "; SIGCONT sent"));
  }
  return st;
}

// Issue 16 (11): a 20 s hang watched for 90 s, detected at 10 s and the job
// resumed at 12 s. The drill judged at 12 s, before the agent let the
// trainer go at 20 s, and failed "the trainer was let go again".
TEST_F(DrillCommandTest, HangTrainerWaitsForTheHangToRunOutBeforeItsVerdict) {
  HealthyJob();
  fake_.verify_stream = {Verified(40, true)};
  fake_.drill_now = [this] { return HangAt(now_, absl::Seconds(20), /*detected=*/true); };
  Result r = Drill({"--job", "llm", "--scenario", "hang-trainer", "--target", "2", "--duration", "20s", "--watch",
                    "90s", "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(r.code, base::kExitOk) << r.out << r.err;
  EXPECT_DOUBLE_EQ(fake_.drill_request->duration_seconds(), 20);
  EXPECT_THAT(r.out, AllOf(HasSubstr("PASS  the failure was detected: 9.950 s after the injection"),
                           HasSubstr("PASS  the job restarted and resumed training: from step 40"),
                           HasSubstr("PASS  the restored step verifies intact"),
                           HasSubstr("PASS  the trainer was let go again: 20.000 s after the injection"),
                           HasSubstr("+20.000 s  fault lifted"), HasSubstr("drill: PASS")));
  // It watched until the trainer was let go, not to the end of --watch...
  EXPECT_GE(now_, absl::FromUnixNanos(kT0 + 20'050'000'000));
  EXPECT_LT(now_, absl::FromUnixNanos(kT0 + 21'000'000'000));
  // ...and read the restored step back as soon as the job resumed from it.
  ASSERT_TRUE(fake_.verify_request.has_value());
  EXPECT_EQ(fake_.verify_request->step(), 40u);
  EXPECT_THAT(r.out, HasSubstr("+11.950 s  training resumed from step 40"));
  EXPECT_THAT(r.out, HasSubstr("+11.950 s  verified the restored step 40: intact"));

  // A hang shorter than the coordinator's threshold: nothing detected, the
  // trainer let go at 5 s; settled 5 s later.
  fake_.get_drill_calls = 0;
  now_ = absl::FromUnixNanos(kT0);
  fake_.drill_now = [this] { return HangAt(now_, absl::Seconds(5), /*detected=*/false); };
  Result brief = Drill({"--job", "llm", "--scenario", "hang-trainer", "--target", "2", "--duration", "5s", "--watch",
                        "90s", "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(brief.code, base::kExitOk) << brief.out << brief.err;
  EXPECT_THAT(brief.out, AllOf(HasSubstr("PASS  the trainer was let go again: 5.000 s after the injection"),
                               Not(HasSubstr("the failure was detected")), HasSubstr("drill: PASS")));
  EXPECT_LT(now_, absl::FromUnixNanos(kT0 + 11'000'000'000));
}

// The same hang whose trainer is never let go: failed at the end of
// --watch (90 s), not when the job resumed at 12 s.
TEST_F(DrillCommandTest, HangTrainerNeverLetGoFailsOnlyWhenTheWatchEnds) {
  HealthyJob();
  fake_.verify_stream = {Verified(40, true)};
  fake_.drill_now = [this] { return HangAt(now_, absl::Seconds(20), /*detected=*/true, /*never_let_go=*/true); };
  Result r = Drill({"--job", "llm", "--scenario", "hang-trainer", "--target", "2", "--duration", "20s", "--watch",
                    "90s", "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(r.code, base::kExitFailed) << r.out << r.err;
  EXPECT_GE(now_, absl::FromUnixNanos(kT0 + 90'000'000'000));
  EXPECT_THAT(r.out, AllOf(HasSubstr("PASS  the job restarted and resumed training: from step 40"),
                           HasSubstr("FAIL  the trainer was let go again: not within --watch 1m30s (the hang lasts "
                                     "20s)"),
                           HasSubstr("drill: FAIL")));
  Result j = Drill({"--job", "llm", "--scenario", "hang-trainer", "--target", "2", "--duration", "20s", "--watch",
                    "90s", "--json", "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(j.code, base::kExitFailed);
  EXPECT_TRUE(IsValidJson(j.out)) << j.out;
  EXPECT_THAT(j.out, AllOf(HasSubstr("\"fault_lifted\":false"), HasSubstr("\"passed\":false")));
}

// ----------------------------------------------------------------- terminal safety (issue 16, finding 10)

TEST_F(DrillCommandTest, WhatTheAgentAndTheCoordinatorSentIsEscaped) {
  // The node named in the progress line, the agent's refusal on stderr.
  fake_.run_drill->set_node_id(absl::StrCat("node-", kHostile));
  ckptd::v1::DrillStatus refused = Base();
  refused.set_node_id(absl::StrCat("node-", kHostile));
  refused.mutable_report()->set_error(absl::StrCat("drills are not allowed: ", kHostile));
  fake_.drill = {refused};
  Result r = Drill({"--job", "llm", "--scenario", "kill-agent", "--token-file", TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(r.code, base::kExitFailed);
  ExpectTerminalSafe(r.out);
  ExpectTerminalSafe(r.err);
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("drill 7: kill-agent on node node-", kShown, " (rank 0 of job llm)\n")));
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("ckptctl drill run: node node-", kShown,
                                            " did not carry the drill out: drills are not allowed: ", kShown, "\n")));

  // A drill's report: the injection's detail, the failures, the verdict.
  fake_.run_drill->set_node_id("node-b");
  ckptd::v1::DrillStatus resumed = Resumed();
  resumed.mutable_report()->set_detail(absl::StrCat("SIGKILL ", kHostile));
  resumed.mutable_events(0)->set_detail(kHostile);
  fake_.drill = {resumed};
  HealthyJob();
  fake_.verify_stream = {Verified(40, false)};
  fake_.verify_stream[0].set_problems(0, absl::StrCat("rank-0001.shard: ", kHostile));
  Result report = Drill({"--job", "llm", "--scenario", "kill-trainer", "--target", "2", "--token-file",
                         TokenFile("drill-token", "s3cret")});
  EXPECT_EQ(report.code, base::kExitFailed);
  ExpectTerminalSafe(report.out);
  EXPECT_THAT(report.out, AllOf(HasSubstr(absl::StrCat("injected: SIGKILL ", kShown, "\n")),
                                HasSubstr(absl::StrCat("detected trainer_died on node-b rank 2: ", kShown, "\n")),
                                HasSubstr(absl::StrCat("FAIL  the restored step verifies intact: rank-0001.shard: ",
                                                       kShown, "\n"))));
  Result j = Drill({"--job", "llm", "--scenario", "kill-trainer", "--target", "2", "--json", "--token-file",
                    TokenFile("drill-token", "s3cret")});
  EXPECT_TRUE(IsValidJson(j.out)) << j.out;
  ExpectTerminalSafe(j.out);

  // A suite: the file's line in its heading, why the suite stopped.
  fake_.cluster.mutable_jobs(0)->set_state(ckptd::v1::JOB_RESTARTING);
  Result suite = Suite(SuiteFile("storage-eio --target node-\x7f\xC2\x9B" "2J\xFF\n"), {"--settle", "1s"});
  EXPECT_EQ(suite.code, base::kExitFailed);
  ExpectTerminalSafe(suite.out);
  ExpectTerminalSafe(suite.err);
  EXPECT_THAT(suite.out, AllOf(HasSubstr("=== drill 1/1 (line 1): storage-eio --target node-\\x7f\\u009b2J\\xff\n"),
                               HasSubstr("storage-eio  node-\\x7f\\u009b2J\\xff")));
  // And a line that is not a drill, quoted in the usage error.
  Result bad = Suite(SuiteFile("kill-trainer --target 2 \x7f\xC2\x9B" "2J\xFF\n"));
  EXPECT_EQ(bad.code, base::kExitUsage);
  ExpectTerminalSafe(bad.err);
  EXPECT_THAT(bad.err, HasSubstr("line 1: unexpected \"\\x7f\\u009b2J\\xff\""));
}

}  // namespace
}  // namespace ckptd::cli
