#include "cli/operator_commands.h"

#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/flags.h"
#include "base/testing/json_checker.h"
#include "base/testing/matchers.h"
#include "cli/drill_commands.h"
#include "cli/offline_commands.h"
#include "cli/testing_fake_coordinator.h"
#include "cli/testing_terminal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/mem_file_system.h"

namespace ckptd::cli {
namespace {

using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::IsValidJson;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;


// ------------------------------------------------------------------ status

TEST_F(OperatorCommandsTest, StatusTableShowsAgentsJobsAndFailures) {
  TwoNodes();
  Result r = Run(RunStatus, {});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  EXPECT_THAT(r.out, AllOf(HasSubstr("coordinator coord.example:7070"), HasSubstr("agents: 2 (1 alive)"),
                           HasSubstr("jobs: 2"), HasSubstr("recent failures: 2")));
  std::vector<std::string> lines = Lines(r.out);
  auto line_with = [&](absl::string_view needle) -> std::string {
    for (const std::string& l : lines) {
      if (absl::StrContains(l, needle)) return l;
    }
    return "";
  };
  EXPECT_THAT(line_with("node-a"), AllOf(HasSubstr("alive"), HasSubstr("0.4 s ago"), HasSubstr("llm 0-1")));
  EXPECT_THAT(line_with("node-b "), AllOf(HasSubstr("LOST"), HasSubstr("12 s ago"), HasSubstr("llm 2-3")));
  // The job row: state, world, alive, fastest, slowest, committed, every, interval, waste.
  EXPECT_THAT(line_with("llm  restarting"), AllOf(HasSubstr("2/4"), HasSubstr("1240"), HasSubstr("1236"),
                                                  HasSubstr("1200"), HasSubstr("100"), HasSubstr("16.7 min"),
                                                  HasSubstr("3.1 %")));
  EXPECT_THAT(line_with("aaa  running"), HasSubstr("waiting"));
  EXPECT_THAT(r.out, AllOf(HasSubstr("llm: step 2.5 s; checkpoints 12 committed, 1 aborted; pending 1240; "
                                     "quarantined 1100"),
                           HasSubstr("aaa: checkpoints 0 committed, 0 aborted; policy waiting for a committed "
                                     "checkpoint")));
  // Jobs sorted by name; failures newest first, with their age.
  EXPECT_LT(r.out.find("aaa  running"), r.out.find("llm  restarting"));
  EXPECT_LT(r.out.find("node_lost"), r.out.find("trainer_hung"));
  EXPECT_THAT(line_with("node_lost"), AllOf(HasSubstr("5.0 min"), HasSubstr("2024-05-01T11:55:00Z"),
                                            HasSubstr("no heartbeat for 5 s")));
  EXPECT_THAT(line_with("trainer_hung"), AllOf(HasSubstr("3.0 h"), HasSubstr("llm"), HasSubstr("no step for 120 s")));
  ASSERT_TRUE(fake_.events_request.has_value());
  EXPECT_EQ(fake_.events_request->limit(), 10u);
  EXPECT_EQ(fake_.events_request->job(), "");
  EXPECT_THAT(fake_.interval_jobs, ElementsAre("aaa", "llm"));
}

TEST_F(OperatorCommandsTest, StatusJsonIsOneObjectWithTheKeyFields) {
  TwoNodes();
  Result r = Run(RunStatus, {"--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"coordinator\":\"coord.example:7070\""), HasSubstr("\"count\":2"),
                           HasSubstr("\"alive\":1"), HasSubstr("\"node_id\":\"node-a\""),
                           HasSubstr("\"seconds_since_heartbeat\":0.4"), HasSubstr("\"gpus\":[\"cuda:0\",\"cuda:1\"]"),
                           HasSubstr("{\"job\":\"llm\",\"rank\":1,\"world_size\":4,\"pid\":101,\"gpu\":1}")));
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"state\":\"restarting\""), HasSubstr("\"ranks_alive\":2"),
                           HasSubstr("\"fastest_step\":1240"), HasSubstr("\"slowest_step\":1236"),
                           HasSubstr("\"newest_committed_step\":1200"), HasSubstr("\"every_steps\":100"),
                           HasSubstr("\"pending_steps\":[1240]"), HasSubstr("\"quarantined_steps\":[1100]"),
                           HasSubstr("\"interval_seconds\":1000"), HasSubstr("\"expected_waste\":0.031")));
  // Job aaa: nothing committed, no decision yet.
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"newest_committed_step\":null"), HasSubstr("\"interval_seconds\":null"),
                           HasSubstr("\"waiting_for\":\"a committed checkpoint\"")));
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"kind\":\"node_lost\""), HasSubstr("\"rank\":null"),
                           HasSubstr("\"kind\":\"trainer_hung\""), HasSubstr("\"time\":\"2024-05-01T11:55:00Z\"")));
  EXPECT_EQ(JsonNumber(r.out, "age_seconds"), 300);  // the newest first
  EXPECT_EQ(r.out.back(), '\n');
  EXPECT_EQ(Lines(r.out).size(), 1u);
}

TEST_F(OperatorCommandsTest, StatusForOneJob) {
  TwoNodes();
  Result r = Run(RunStatus, {"--job", "llm"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("jobs: 1"), HasSubstr("llm  restarting"), Not(HasSubstr("aaa"))));
  EXPECT_EQ(fake_.events_request->job(), "llm");
  EXPECT_THAT(fake_.interval_jobs, ElementsAre("llm"));

  r = Run(RunStatus, {"--job", "nope"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("no job nope"));
  EXPECT_THAT(r.out, IsEmpty());
}

TEST_F(OperatorCommandsTest, StatusWithoutAnIntervalShowsItUnknown) {
  TwoNodes();
  fake_.intervals["llm"] = absl::UnimplementedError("GetInterval");
  Result r = Run(RunStatus, {"--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\"interval\":null"));
  // But a coordinator that cannot be reached fails the command.
  fake_.intervals["llm"] = absl::UnavailableError("coordinator coord.example:7070: connection refused");
  r = Run(RunStatus, {});
  EXPECT_EQ(r.code, base::kExitUnavailable);
  EXPECT_THAT(r.err, HasSubstr("coord.example:7070"));
}

// Issue 16 (5): persist failures per job, with the newest one's detail and age.
TEST_F(OperatorCommandsTest, StatusShowsAJobsPersistFailures) {
  TwoNodes();
  for (ckptd::v1::JobStatus& j : *fake_.cluster.mutable_jobs()) {
    if (j.job() != "llm") continue;
    j.set_persist_failures(59);
    j.set_last_persist_failure("rank 2: writing shard /ckpt/llm/step-1240/rank-2.shard: No space left on device; step 1240");
    j.set_last_persist_failure_unix_nanos(NanosBefore(absl::Seconds(150)));
  }
  Result r = Run(RunStatus, {});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("persist failures: 59 (last: rank 2: writing shard /ckpt/llm/step-1240/rank-2.shard: "
                               "No space left on device; step 1240, 2.5 min ago)"));
  EXPECT_THAT(r.out, HasSubstr("aaa: checkpoints 0 committed, 0 aborted; policy"));  // none: not shown
  r = Run(RunStatus, {"--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"persist_failures\":59,\"last_persist_failure\":{\"detail\":\"rank 2: "),
                           HasSubstr("\"persist_failures\":0,\"last_persist_failure\":null")));
}

// Issue 41: snapshots the job's ranks skipped for want of a staging slot.
TEST_F(OperatorCommandsTest, StatusShowsAJobsSkippedSnapshots) {
  TwoNodes();
  for (ckptd::v1::JobStatus& j : *fake_.cluster.mutable_jobs()) {
    if (j.job() == "llm") j.set_snapshots_skipped(12);
  }
  Result r = Run(RunStatus, {});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("snapshots skipped: 12 (no free staging slot: slot_wait, every, ckptd-agent --slots)"));
  EXPECT_EQ(r.out.find("snapshots skipped:"), r.out.rfind("snapshots skipped:"));  // none for the other job
  r = Run(RunStatus, {"--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"snapshots_skipped\":12"), HasSubstr("\"snapshots_skipped\":0")));
}

TEST_F(OperatorCommandsTest, StatusShowsARestartHeldBack) {
  TwoNodes();
  for (ckptd::v1::JobStatus& j : *fake_.cluster.mutable_jobs()) {
    if (j.job() == "llm") j.set_restore_blocked("job llm has 2 committed steps but none intact (...)");
  }
  Result r = Run(RunStatus, {});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("RESTORE HELD BACK: job llm has 2 committed steps but none intact"));
  r = Run(RunStatus, {"--json"});
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"restore_blocked\":\"job llm has 2 committed"),
                           HasSubstr("\"restore_blocked\":null")));
}

// Issue 17 (4): where each rank's state came from at the last restore.
TEST_F(OperatorCommandsTest, StatusSaysWhereTheLastRestoreReadEachRank) {
  TwoNodes();
  for (ckptd::v1::JobStatus& j : *fake_.cluster.mutable_jobs()) {
    if (j.job() != "llm") continue;
    ckptd::v1::RestoreSummary* r = j.mutable_last_restore();
    r->set_step(1240);
    r->set_incarnation(3);
    const ckptd::v1::RestoreSource sources[] = {ckptd::v1::AGENT_MEMORY, ckptd::v1::AGENT_MEMORY,
                                                ckptd::v1::STORAGE_ROOT};
    for (uint32_t rank = 0; rank < 3; ++rank) {
      auto* e = r->add_ranks();
      e->set_rank(rank);
      e->set_source(sources[rank]);
      e->set_node_id(rank < 2 ? "node-a" : "node-b");
    }
  }
  Result r = Run(RunStatus, {});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("last restore: step 1240 (incarnation 3), 2 ranks from memory, 1 from storage-root"));
  r = Run(RunStatus, {"--json"});
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"last_restore\":{\"step\":1240,\"incarnation\":3,\"saved_world_size\":null,"
                                     "\"sources\":{\"memory\":2,\"storage-root\":1},\"ranks\":[{\"rank\":0,"
                                     "\"source\":\"memory\",\"node\":\"node-a\",\"resharded\":false}"),
                           HasSubstr("\"last_restore\":null")));
}

// Elastic restore: the ranks that read the step resharded, and the world
// that saved it.
TEST_F(OperatorCommandsTest, StatusSaysTheLastRestoreWasReadResharded) {
  TwoNodes();
  for (ckptd::v1::JobStatus& j : *fake_.cluster.mutable_jobs()) {
    if (j.job() != "llm") continue;
    ckptd::v1::RestoreSummary* r = j.mutable_last_restore();
    r->set_step(131);
    r->set_incarnation(2);
    r->set_saved_world_size(6);
    for (uint32_t rank = 0; rank < 3; ++rank) {
      auto* e = r->add_ranks();
      e->set_rank(rank);
      e->set_source(ckptd::v1::STORAGE_ROOT);
      e->set_node_id(rank < 2 ? "node-a" : "node-b");
      e->set_resharded(true);
    }
  }
  Result r = Run(RunStatus, {});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("last restore: step 131 (incarnation 2), 3 ranks from storage-root, 3 ranks read "
                               "resharded (saved by 6 ranks)"));
  r = Run(RunStatus, {"--json"});
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"last_restore\":{\"step\":131,\"incarnation\":2,\"saved_world_size\":6,"),
                           HasSubstr("\"node\":\"node-b\",\"resharded\":true}")));
}

TEST_F(OperatorCommandsTest, StatusOfAnEmptyCluster) {
  Result r = Run(RunStatus, {});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("agents: 0 (0 alive)"), HasSubstr("jobs: 0"), HasSubstr("recent failures: none")));
  r = Run(RunStatus, {"--json"});
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"nodes\":[]"), HasSubstr("\"jobs\":[]"), HasSubstr("\"failures\":[]")));
}

// ------------------------------------------------------------------ checkpoint

TEST_F(OperatorCommandsTest, CheckpointNoWaitPrintsTheTarget) {
  Requested(1240);
  Result r = Run(RunCheckpoint, {"--job", "llm", "--no-wait"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("job llm at step 1240"), HasSubstr("not waiting")));
  EXPECT_EQ(fake_.list_steps_calls, 0);
  r = Run(RunCheckpoint, {"--job", "llm", "--no-wait", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"outcome\":\"requested\""), HasSubstr("\"target_step\":1240"),
                           HasSubstr("\"committed_step\":null")));
  EXPECT_EQ(Run(RunCheckpoint, {"--job", "llm", "--no-wait", "--timeout", "1m"}).code, base::kExitUsage);
}

TEST_F(OperatorCommandsTest, CheckpointWaitsUntilCommittedPrintingProgressWhenItChanges) {
  Requested(1240);
  // Files in storage before any report: incomplete, world unknown.
  ckptd::v1::ListStepsResponse files = Steps({{1200, ckptd::v1::STEP_COMMITTED, 4, ""}});
  StepEntry* incomplete = files.add_steps();
  incomplete->set_step(1240);
  incomplete->set_state(ckptd::v1::STEP_INCOMPLETE);
  fake_.steps = {Steps({{1200, ckptd::v1::STEP_COMMITTED, 4, ""}}),  // not reached yet
                 files,
                 Steps({{1200, ckptd::v1::STEP_COMMITTED, 4, ""}, {1240, ckptd::v1::STEP_PENDING, 1, ""}}),
                 Steps({{1200, ckptd::v1::STEP_COMMITTED, 4, ""}, {1240, ckptd::v1::STEP_PENDING, 3, ""}}),
                 Steps({{1200, ckptd::v1::STEP_COMMITTED, 4, ""}, {1240, ckptd::v1::STEP_PENDING, 3, ""}}),
                 Steps({{1200, ckptd::v1::STEP_COMMITTED, 4, ""}, {1240, ckptd::v1::STEP_PENDING, 3, ""}}),
                 Steps({{1200, ckptd::v1::STEP_COMMITTED, 4, ""}, {1240, ckptd::v1::STEP_COMMITTED, 4, ""}})};
  fake_.cluster_from_call[1] = Running(1236, {1240});  // the fastest rank moves: no new line for it
  Result r = Run(RunCheckpoint, {"--job", "llm"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(Lines(r.out), ElementsAre("requested a checkpoint of job llm at step 1240; waiting for it to commit "
                                        "(timeout 10m)",
                                        "step 1240: 0/4 ranks durable (fastest rank at step 1230)",
                                        "step 1240: 1/4 ranks durable", "step 1240: 3/4 ranks durable",
                                        "step 1240 committed: 4/4 ranks, 4.0 GiB stored, after 1.5 s"));
  EXPECT_THAT(r.err, IsEmpty());
  EXPECT_EQ(fake_.list_steps_calls, 7);
  // Six 250 ms polls on the fake clock, nothing slept for real.
  EXPECT_EQ(sleeps_, std::vector<absl::Duration>(6, absl::Milliseconds(250)));
}

TEST_F(OperatorCommandsTest, CheckpointJsonPrintsNothingButTheFinalObject) {
  Requested(1240);
  fake_.steps = {Steps({{1240, ckptd::v1::STEP_PENDING, 2, ""}}), Steps({{1240, ckptd::v1::STEP_COMMITTED, 4, ""}})};
  Result r = Run(RunCheckpoint, {"--job", "llm", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_EQ(Lines(r.out).size(), 1u);
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"job\":\"llm\""), HasSubstr("\"requested_step\":1240"),
                           HasSubstr("\"target_step\":1240"), HasSubstr("\"outcome\":\"committed\""),
                           HasSubstr("\"committed_step\":1240"), HasSubstr("\"ranks_reported\":4"),
                           HasSubstr("\"world_size\":4"), HasSubstr("\"stored_bytes\":4294967296")));
  EXPECT_EQ(JsonNumber(r.out, "waited_seconds"), 0.25);
}

TEST_F(OperatorCommandsTest, CheckpointAbortedExitsOneWithTheReason) {
  Requested(1240);
  fake_.steps = {Steps({{1240, ckptd::v1::STEP_PENDING, 3, ""}}),
                 Steps({{1240, ckptd::v1::STEP_ABORTED, 3, "rank 2 could not persist it"}})};
  Result r = Run(RunCheckpoint, {"--job", "llm"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("step 1240 was aborted: rank 2 could not persist it"));
  EXPECT_THAT(r.out, Not(HasSubstr("committed:")));

  fake_.list_steps_calls = 0;
  r = Run(RunCheckpoint, {"--job", "llm", "--json"});
  EXPECT_EQ(r.code, base::kExitFailed);
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"outcome\":\"aborted\""), HasSubstr("\"committed_step\":null"),
                           HasSubstr("rank 2 could not persist it")));
}

TEST_F(OperatorCommandsTest, CheckpointQuarantinedExitsOne) {
  Requested(1240);
  fake_.steps = {Steps({{1240, ckptd::v1::STEP_QUARANTINED, 4, "rank 1: chunk 3 checksum mismatch"}})};
  Result r = Run(RunCheckpoint, {"--job", "llm", "--json"});
  EXPECT_EQ(r.code, base::kExitFailed);
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\"outcome\":\"quarantined\""));
  EXPECT_THAT(r.err, AllOf(HasSubstr("quarantined"), HasSubstr("chunk 3 checksum mismatch")));
}

TEST_F(OperatorCommandsTest, CheckpointSupersededByANewerCommittedStepSucceedsAndSaysSo) {
  Requested(1240);
  fake_.steps = {Steps({{1240, ckptd::v1::STEP_PENDING, 3, ""}}),
                 Steps({{1240, ckptd::v1::STEP_ABORTED, 3, "step 1300 committed first"},
                        {1300, ckptd::v1::STEP_COMMITTED, 4, ""}})};
  Result r = Run(RunCheckpoint, {"--job", "llm"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("step 1240 was passed over: step 1300 committed first, so the job's state is saved at "
                               "step 1300"));
  fake_.list_steps_calls = 0;
  r = Run(RunCheckpoint, {"--job", "llm", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"outcome\":\"superseded\""), HasSubstr("\"target_step\":1240"),
                           HasSubstr("\"committed_step\":1300")));
}

TEST_F(OperatorCommandsTest, CheckpointFollowsATargetTheCoordinatorMoved) {
  Requested(1240);
  // A rank passed 1240 before it heard of it: the coordinator aborts it and
  // schedules 1260 instead.
  fake_.steps = {Steps({{1240, ckptd::v1::STEP_PENDING, 1, ""}}),
                 Steps({{1240, ckptd::v1::STEP_ABORTED, 1, "a rank passed the target before it knew"}}),
                 Steps({{1240, ckptd::v1::STEP_ABORTED, 1, "a rank passed the target before it knew"}}),
                 Steps({{1240, ckptd::v1::STEP_ABORTED, 1, "a rank passed the target before it knew"},
                        {1260, ckptd::v1::STEP_PENDING, 2, ""}}),
                 Steps({{1240, ckptd::v1::STEP_ABORTED, 1, "a rank passed the target before it knew"},
                        {1260, ckptd::v1::STEP_COMMITTED, 4, ""}})};
  fake_.cluster_from_call[0] = Running(1245, {1260});
  Result r = Run(RunCheckpoint, {"--job", "llm", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"requested_step\":1240"), HasSubstr("\"target_step\":1260"),
                           HasSubstr("\"outcome\":\"committed\""), HasSubstr("\"committed_step\":1260")));

  fake_.list_steps_calls = 0;
  fake_.cluster_calls = 0;
  r = Run(RunCheckpoint, {"--job", "llm"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("step 1240: 1/4 ranks durable"),
                           HasSubstr("step 1240: the coordinator moved the checkpoint to step 1260 (a rank passed the "
                                     "target before it knew)"),
                           HasSubstr("step 1260: 0/4 ranks durable (fastest rank at step 1245)"),
                           HasSubstr("step 1260: 2/4 ranks durable"), HasSubstr("step 1260 committed")));
}

TEST_F(OperatorCommandsTest, CheckpointTimesOut) {
  Requested(1240);
  fake_.steps = {Steps({{1240, ckptd::v1::STEP_PENDING, 3, ""}})};
  Result r = Run(RunCheckpoint, {"--job", "llm", "--timeout", "2s"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, AllOf(HasSubstr("step 1240 did not commit within 2s (3/4 ranks durable)"),
                           HasSubstr("stays scheduled")));
  EXPECT_EQ(sleeps_.size(), 8u);  // 2 s of 250 ms polls
  EXPECT_EQ(now_ - kNow, absl::Seconds(2));

  r = Run(RunCheckpoint, {"--job", "llm", "--timeout", "1", "--json"});
  EXPECT_EQ(r.code, base::kExitFailed);
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"outcome\":\"timeout\""), HasSubstr("\"ranks_reported\":3")));
  EXPECT_EQ(JsonNumber(r.out, "waited_seconds"), 1);
}

TEST_F(OperatorCommandsTest, CheckpointRidesOutABriefOutageButNotALongOne) {
  Requested(1240);
  fake_.steps = {absl::UnavailableError("coordinator coord.example:7070: connection refused"),
                 Steps({{1240, ckptd::v1::STEP_COMMITTED, 4, ""}})};
  Result r = Run(RunCheckpoint, {"--job", "llm"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.err, HasSubstr("connection refused; retrying"));
  EXPECT_THAT(r.out, HasSubstr("step 1240 committed"));

  fake_.steps = {absl::UnavailableError("coordinator coord.example:7070: connection refused")};
  r = Run(RunCheckpoint, {"--job", "llm", "--timeout", "1s"});
  EXPECT_EQ(r.code, base::kExitUnavailable);
  EXPECT_THAT(r.err, HasSubstr("cannot reach the coordinator coord.example:7070"));
}

TEST_F(OperatorCommandsTest, CheckpointOnACoordinatorWithoutListStepsSuggestsNoWait) {
  Requested(1240);
  fake_.steps = {absl::UnimplementedError("")};
  Result r = Run(RunCheckpoint, {"--job", "llm"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, AllOf(HasSubstr("step 1240 was requested"), HasSubstr("too old"), HasSubstr("--no-wait")));
}

TEST_F(OperatorCommandsTest, CheckpointOfAJobThatCannotTakeOne) {
  fake_.checkpoint = absl::FailedPreconditionError("job llm is restarting");
  Result r = Run(RunCheckpoint, {"--job", "llm"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("ckptctl checkpoint: job llm is restarting"));
  EXPECT_THAT(r.out, IsEmpty());
}

// ------------------------------------------------------------------ list

TEST_F(OperatorCommandsTest, ListTableAndJson) {
  ckptd::v1::ListStepsResponse steps;
  StepEntry* q = steps.add_steps();  // out of order on purpose
  q->set_step(1200);
  q->set_state(ckptd::v1::STEP_COMMITTED);
  q->set_world_size(4);
  q->set_ranks_reported(4);
  q->set_raw_bytes(uint64_t{12} << 30);
  q->set_stored_bytes(uint64_t{8} << 30);
  q->set_committed_unix_nanos(NanosBefore(absl::Minutes(10)));
  q->set_persist_seconds(35.25);
  StepEntry* old = steps.add_steps();
  old->set_step(1100);
  old->set_state(ckptd::v1::STEP_QUARANTINED);
  old->set_world_size(4);
  old->set_ranks_reported(4);
  old->set_raw_bytes(1000);
  old->set_stored_bytes(500);
  old->set_committed_unix_nanos(NanosBefore(absl::Hours(1)));
  old->set_persist_seconds(30);
  old->set_reason("rank 3: chunk 5 checksum mismatch");
  StepEntry* pending = steps.add_steps();
  pending->set_step(1240);
  pending->set_state(ckptd::v1::STEP_PENDING);
  pending->set_world_size(4);
  pending->set_ranks_reported(3);
  pending->set_first_report_unix_nanos(NanosBefore(absl::Seconds(12)));
  pending->set_persist_seconds(0.04);  // not sent for pending steps, but shown when it is
  StepEntry* aborted = steps.add_steps();
  aborted->set_step(1230);
  aborted->set_state(ckptd::v1::STEP_ABORTED);
  aborted->set_world_size(4);
  aborted->set_ranks_reported(1);
  aborted->set_reason("rank 2 could not persist it");
  fake_.steps = {steps};

  Result r = Run(RunList, {"--job", "llm"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 6u) << r.out;
  EXPECT_EQ(lines[0], "job llm: 4 steps");
  EXPECT_THAT(lines[1], AllOf(HasSubstr("STEP"), HasSubstr("STATE"), HasSubstr("RANKS"), HasSubstr("STORED"),
                              HasSubstr("RATIO"), HasSubstr("COMMITTED (UTC)"), HasSubstr("PERSIST"),
                              HasSubstr("REASON")));
  EXPECT_THAT(lines[2], AllOf(HasSubstr("1100"), HasSubstr("quarantined"), HasSubstr("4/4"), HasSubstr("500 B"),
                              HasSubstr("2.00"), HasSubstr("2024-05-01T11:00:00Z"), HasSubstr("30.0 s"),
                              HasSubstr("rank 3: chunk 5 checksum mismatch")));
  EXPECT_THAT(lines[3], AllOf(HasSubstr("1200"), HasSubstr("committed"), HasSubstr("8.0 GiB"), HasSubstr("1.50"),
                              HasSubstr("2024-05-01T11:50:00Z"), HasSubstr("35.2 s")));
  EXPECT_THAT(lines[4], AllOf(HasSubstr("1230"), HasSubstr("aborted"), HasSubstr("1/4"),
                              HasSubstr("rank 2 could not persist it")));
  EXPECT_THAT(lines[5], AllOf(HasSubstr("1240"), HasSubstr("pending"), HasSubstr("3/4"), HasSubstr("0.04 s"),
                              HasSubstr("first shard reported 12 s ago")));

  r = Run(RunList, {"--job", "llm", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"job\":\"llm\""),
                           HasSubstr("{\"step\":1100,\"state\":\"quarantined\",\"world_size\":4,\"ranks_reported\":4,"
                                     "\"raw_bytes\":1000,\"stored_bytes\":500,\"ratio\":2,"
                                     "\"committed\":\"2024-05-01T11:00:00Z\",\"persist_seconds\":30,"
                                     "\"first_report\":null,\"reason\":\"rank 3: chunk 5 checksum mismatch\"}"),
                           HasSubstr("\"step\":1240,\"state\":\"pending\""), HasSubstr("\"ratio\":null"),
                           HasSubstr("\"first_report\":\"2024-05-01T11:59:48Z\"")));
  EXPECT_LT(r.out.find("\"step\":1100"), r.out.find("\"step\":1200"));

  fake_.steps = {ckptd::v1::ListStepsResponse()};
  r = Run(RunList, {"--job", "llm"});
  EXPECT_EQ(r.code, base::kExitOk);
  EXPECT_EQ(r.out, "job llm: no steps\n");
}

// ------------------------------------------------------------------ restore-plan

TEST_F(OperatorCommandsTest, RestorePlanTextAndJson) {
  ckptd::v1::RestorePreview p;
  p.set_job("llm");
  p.set_step(1200);
  p.set_reason("the newest committed step that is not quarantined");
  p.set_state(ckptd::v1::JOB_RUNNING);
  p.set_incarnation(3);
  StepEntry* bad = p.add_passed_over();  // the coordinator leaves the ranks of a quarantined step out
  bad->set_step(1250);
  bad->set_state(ckptd::v1::STEP_QUARANTINED);
  bad->set_reason("quarantined: verification: rank-1.shard: checksum mismatch");
  StepEntry* pending = p.add_passed_over();
  pending->set_step(1240);
  pending->set_state(ckptd::v1::STEP_PENDING);
  pending->set_world_size(4);
  pending->set_ranks_reported(3);
  pending->set_reason("not committed: 3 of 4 ranks reported");
  fake_.preview = p;
  Result r = Run(RunRestorePlan, {"--job", "llm"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("job llm: running, incarnation 3"),
                           HasSubstr("a restart now restores step 1200"),
                           HasSubstr("why: the newest committed step that is not quarantined"),
                           HasSubstr("newer steps passed over: 2")));
  EXPECT_THAT(r.out, HasSubstr("1250  quarantined      -  quarantined: verification: rank-1.shard: checksum mismatch"));
  EXPECT_THAT(Lines(r.out).back(), AllOf(HasSubstr("1240"), HasSubstr("pending"), HasSubstr("3/4"),
                                         HasSubstr("not committed: 3 of 4 ranks reported")));

  r = Run(RunRestorePlan, {"--job", "llm", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"fresh_start\":false"), HasSubstr("\"step\":1200"),
                           HasSubstr("\"state\":\"running\""), HasSubstr("\"incarnation\":3"),
                           HasSubstr("{\"step\":1240,\"state\":\"pending\",\"ranks_reported\":3,"
                                     "\"world_size\":4,\"reason\":\"not committed: 3 of 4 ranks reported\"}]")));

  ckptd::v1::RestorePreview fresh;
  fresh.set_job("llm");
  fresh.set_fresh_start(true);
  fresh.set_reason("nothing is committed");
  fake_.preview = fresh;
  r = Run(RunRestorePlan, {"--job", "llm"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("a restart now starts fresh"), HasSubstr("why: nothing is committed"),
                           HasSubstr("no newer step is passed over")));
  r = Run(RunRestorePlan, {"--job", "llm", "--json"});
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"fresh_start\":true"), HasSubstr("\"step\":null"),
                           HasSubstr("\"passed_over\":[]")));
}

TEST_F(OperatorCommandsTest, RestorePlanOfAResizedJobSaysItReadsResharded) {
  ckptd::v1::RestorePreview p;
  p.set_job("llm");
  p.set_step(1200);
  p.set_world_size(4);
  p.set_saved_world_size(6);
  p.set_state(ckptd::v1::JOB_RUNNING);
  fake_.preview = p;
  Result r = Run(RunRestorePlan, {"--job", "llm"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("saved by 6 ranks, the job runs 4: each rank reads its part resharded from disk"));
  r = Run(RunRestorePlan, {"--job", "llm", "--json"});
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"world_size\":4,\"saved_world_size\":6")));
  p.set_saved_world_size(4);
  fake_.preview = p;
  r = Run(RunRestorePlan, {"--job", "llm"});
  EXPECT_THAT(r.out, Not(HasSubstr("resharded")));
  p.clear_saved_world_size();
  fake_.preview = p;
  r = Run(RunRestorePlan, {"--job", "llm", "--json"});
  EXPECT_THAT(r.out, HasSubstr("\"saved_world_size\":null"));
}

TEST_F(OperatorCommandsTest, RestorePlanOfAMemoryCheckpointNamesItsFallback) {
  ckptd::v1::RestorePreview p;
  p.set_job("llm");
  p.set_step(1230);
  p.set_memory_step(true);
  p.set_has_durable_step(true);
  p.set_durable_step(1200);
  p.set_reason("step 1230 is a memory checkpoint");
  p.set_state(ckptd::v1::JOB_RUNNING);
  fake_.preview = p;
  Result r = Run(RunRestorePlan, {"--job", "llm"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("a restart now restores step 1230, a memory checkpoint (from memory only; the "
                               "fallback is durable step 1200)"));
  r = Run(RunRestorePlan, {"--job", "llm", "--json"});
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"memory_checkpoint\":true"), HasSubstr("\"durable_step\":1200")));
  p.set_has_durable_step(false);
  fake_.preview = p;
  r = Run(RunRestorePlan, {"--job", "llm"});
  EXPECT_THAT(r.out, HasSubstr("the fallback is a fresh start"));
  r = Run(RunRestorePlan, {"--job", "llm", "--json"});
  EXPECT_THAT(r.out, HasSubstr("\"durable_step\":null"));
}

TEST_F(OperatorCommandsTest, RestorePlanSaysWhereEachRankWouldRead) {
  ckptd::v1::RestorePreview p;
  p.set_job("llm");
  p.set_step(1200);
  p.set_reason("the newest committed step");
  p.set_state(ckptd::v1::JOB_RESTARTING);
  auto add = [&](uint32_t rank, const std::string& node, bool own, std::vector<std::string> peers,
                 ckptd::v1::RestoreSource planned) {
    ckptd::v1::RankRestoreSources* r = p.add_ranks();
    r->set_rank(rank);
    r->set_node_id(node);
    r->set_own_memory(own);
    for (const auto& n : peers) r->add_peer_nodes(n);
    r->set_planned(planned);
  };
  add(0, "node-a", true, {"node-c"}, ckptd::v1::AGENT_MEMORY);
  add(1, "node-a", true, {"node-c"}, ckptd::v1::AGENT_MEMORY);
  add(2, "", false, {"node-c", "node-d"}, ckptd::v1::PEER_MEMORY);
  add(3, "node-e", false, {}, ckptd::v1::STORAGE_ROOT);
  add(4, "node-e", false, {}, ckptd::v1::STORAGE_ROOT);
  add(5, "node-e", false, {}, ckptd::v1::STORAGE_ROOT);
  fake_.preview = p;
  Result r = Run(RunRestorePlan, {"--job", "llm"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("a restart now restores step 1200"),
                           HasSubstr("where each rank would read step 1200: 2 ranks from memory, 1 from peer "
                                     "memory, 3 from disk")));
  auto line_with = [&](absl::string_view needle) -> std::string {
    for (const std::string& l : Lines(r.out)) {
      if (absl::StrContains(l, needle)) return l;
    }
    return "";
  };
  EXPECT_THAT(line_with("RANKS"), AllOf(HasSubstr("NODE"), HasSubstr("SOURCE"), HasSubstr("PEERS IN MEMORY")));
  // Ranks with the same node, source and peers share a row.
  EXPECT_EQ(line_with("0-1  "), "    0-1  node-a  memory       node-c");
  EXPECT_EQ(line_with("  2  "), "      2  -       peer memory  node-c,node-d");
  EXPECT_EQ(line_with("3-5  "), "    3-5  node-e  disk         -");

  r = Run(RunRestorePlan, {"--job", "llm", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"sources\":{\"memory\":2,\"peer memory\":1,\"disk\":3}"),
                           HasSubstr("{\"rank\":0,\"node\":\"node-a\",\"own_memory\":true,"
                                     "\"peer_nodes\":[\"node-c\"],\"planned\":\"memory\"}"),
                           HasSubstr("{\"rank\":2,\"node\":null,\"own_memory\":false,"
                                     "\"peer_nodes\":[\"node-c\",\"node-d\"],\"planned\":\"peer memory\"}"),
                           HasSubstr("\"planned\":\"disk\"")));
  // A node name from the coordinator is printed safely.
  p.mutable_ranks(3)->set_node_id("evil\x1b[2J");
  fake_.preview = p;
  r = Run(RunRestorePlan, {"--job", "llm"});
  EXPECT_THAT(r.out, Not(HasSubstr("\x1b[2J")));
}

TEST_F(OperatorCommandsTest, StatusShowsReplicationPartnersAndPeerCopies) {
  TwoNodes();
  ckptd::v1::AgentStatus* a = fake_.cluster.mutable_agents(0);
  a->set_peer_address("host-a:7300");
  a->set_failure_domain("rack-1");
  a->set_replicas(2);
  a->add_send_to("node-c");
  ckptd::v1::AgentStatus* b = fake_.cluster.mutable_agents(1);
  b->set_peer_address("host-b:7300");
  b->set_replicas(1);
  fake_.cluster.mutable_jobs(0)->set_peer_copies(3);
  // Copies that fail (a partner's certificate refused, say) are shown, with why.
  a->set_replication_sent(5);
  a->set_replication_failed(2);
  a->set_replication_error("certificate verify failed\x1b[2J");
  Result r = Run(RunStatus, {});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("replication (peer memory):"));
  EXPECT_THAT(r.out, HasSubstr("5 sent, 2 FAILED"));
  EXPECT_THAT(r.out, HasSubstr("  node-a: 2 peer copies failed; its checkpoints are on disk only. Last: certificate "
                               "verify failed"));
  EXPECT_THAT(r.out, Not(HasSubstr("\x1b[2J")));
  EXPECT_THAT(r.out, HasSubstr("node-a  rack-1  host-a:7300   node-c (1 of 2 asked for)"));
  EXPECT_THAT(r.out, HasSubstr("node-b  -       host-b:7300   - (lost)"));
  EXPECT_THAT(r.out, HasSubstr("peer copies 3/4 ranks of step 1200"));
  r = Run(RunStatus, {"--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"failure_domain\":\"rack-1\",\"peer_address\":\"host-a:7300\","
                                     "\"replicas\":2,\"send_to\":[\"node-c\"],\"replication_sent\":5,"
                                     "\"replication_failed\":2"),
                           HasSubstr("\"peer_copies\":3"), HasSubstr("\"peer_copies\":null")));
  // Without peer replication, none of it shows.
  fake_.cluster.mutable_agents(0)->clear_peer_address();
  fake_.cluster.mutable_agents(1)->clear_peer_address();
  fake_.cluster.mutable_jobs(0)->set_peer_copies(0);
  r = Run(RunStatus, {});
  EXPECT_THAT(r.out, AllOf(Not(HasSubstr("replication")), Not(HasSubstr("peer copies"))));
}

TEST_F(OperatorCommandsTest, StatusShowsTheMemoryCheckpointAndItsPartnerCopies) {
  TwoNodes();
  ckptd::v1::JobStatus* j = fake_.cluster.mutable_jobs(0);
  j->set_has_memory_checkpoint(true);
  j->set_newest_memory_checkpoint(1230);
  j->set_memory_checkpoint_restorable(true);
  j->set_memory_checkpoint_peer_copies(4);
  Result r = Run(RunStatus, {});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("memory checkpoint 1230 (every rank's copy in memory, 4/4 on a partner)"));
  r = Run(RunStatus, {"--json"});
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"newest_memory_checkpoint\":1230"),
                           HasSubstr("\"memory_checkpoint_restorable\":true"),
                           HasSubstr("\"memory_checkpoint_peer_copies\":4")));
  // A rank's copy gone: not restorable, and no partner copies to speak of.
  j->set_memory_checkpoint_restorable(false);
  j->set_memory_checkpoint_peer_copies(0);
  r = Run(RunStatus, {});
  EXPECT_THAT(r.out, HasSubstr("memory checkpoint 1230 (not every rank's copy is in memory)"));
  EXPECT_THAT(r.out, Not(HasSubstr("on a partner")));
  // Without a memory checkpoint, the JSON says null.
  j->set_has_memory_checkpoint(false);
  r = Run(RunStatus, {"--json"});
  EXPECT_THAT(r.out, HasSubstr("\"memory_checkpoint_peer_copies\":null"));
}

// ------------------------------------------------------------------ online verify

ckptd::v1::VerifyProgress Progress(uint32_t done, uint64_t bytes_done, bool last = false, bool ok = true) {
  ckptd::v1::VerifyProgress p;
  p.set_step(1200);
  p.set_shards_total(4);
  p.set_shards_done(done);
  p.set_bytes_total(uint64_t{4} << 30);
  p.set_bytes_done(bytes_done);
  p.set_done(last);
  p.set_ok(ok);
  return p;
}

TEST_F(OperatorCommandsTest, OnlineVerifyStreamsProgressAndSucceeds) {
  fake_.verify_stream = {Progress(0, 0), Progress(1, uint64_t{1} << 30), Progress(1, uint64_t{3} << 29),
                         Progress(4, uint64_t{4} << 30), Progress(4, uint64_t{4} << 30, /*last=*/true)};
  const std::string token = TokenFile("verify-token", "secret\n");
  Result r = Run(RunOnlineVerify, {"--job", "llm", "--token-file", token});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(Lines(r.out), ElementsAre("step 1200: 0/4 shards, 0 B of 4.0 GiB", "step 1200: 1/4 shards, 1.0 GiB of 4.0 GiB",
                                        "step 1200: 4/4 shards, 4.0 GiB of 4.0 GiB",
                                        "job llm step 1200: OK  4/4 shards, 4.0 GiB of 4.0 GiB stored bytes read"));
  ASSERT_TRUE(fake_.verify_request.has_value());
  EXPECT_FALSE(fake_.verify_request->has_step());
  EXPECT_EQ(*fake_.args->Get("token-file"), token);

  r = Run(RunOnlineVerify, {"--job", "llm", "--step", "1200", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_EQ(Lines(r.out).size(), 1u);
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"step\":1200"), HasSubstr("\"ok\":true"), HasSubstr("\"shards_total\":4"),
                           HasSubstr("\"shards_done\":4"), HasSubstr("\"bytes_total\":4294967296"),
                           HasSubstr("\"problems\":[]")));
  EXPECT_TRUE(fake_.verify_request->has_step());
  EXPECT_EQ(fake_.verify_request->step(), 1200u);
}

TEST_F(OperatorCommandsTest, OnlineVerifyReportsProblemsAndExitsOne) {
  ckptd::v1::VerifyProgress mid = Progress(2, uint64_t{2} << 30);
  mid.add_problems("rank-1.shard: tensor adam.m block 0 chunk 3: checksum mismatch");
  ckptd::v1::VerifyProgress last = Progress(4, uint64_t{4} << 30, /*last=*/true, /*ok=*/false);
  last.add_problems("rank-1.shard: tensor adam.m block 0 chunk 3: checksum mismatch");  // cumulative or not
  last.add_problems("rank-3.shard: file is 10 bytes shorter than the MANIFEST says");
  fake_.verify_stream = {mid, last};
  Result r = Run(RunOnlineVerify, {"--job", "llm"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.out, AllOf(HasSubstr("job llm step 1200: FAILED"), HasSubstr("    rank-1.shard: tensor adam.m"),
                           HasSubstr("    rank-3.shard: file is 10 bytes shorter")));
  EXPECT_EQ(r.out.find("chunk 3"), r.out.rfind("chunk 3"));  // said once

  r = Run(RunOnlineVerify, {"--job", "llm", "--json"});
  EXPECT_EQ(r.code, base::kExitFailed);
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"ok\":false"),
                           HasSubstr("\"problems\":[\"rank-1.shard: tensor adam.m block 0 chunk 3: checksum mismatch\","
                                     "\"rank-3.shard: file is 10 bytes shorter than the MANIFEST says\"]")));
}

TEST_F(OperatorCommandsTest, OnlineVerifyTimeoutAndBrokenStream) {
  fake_.verify_stream = {Progress(1, 100)};
  fake_.verify_end = absl::DeadlineExceededError("coordinator coord.example:7070: Deadline Exceeded");
  Result r = Run(RunOnlineVerify, {"--job", "llm", "--timeout", "30s"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("did not finish within --timeout 30s"));
  // Without progress a deadline means the coordinator was not reached.
  fake_.verify_stream.clear();
  r = Run(RunOnlineVerify, {"--job", "llm", "--timeout", "30s"});
  EXPECT_EQ(r.code, base::kExitUnavailable);

  fake_.verify_end = absl::OkStatus();
  fake_.verify_stream = {Progress(1, 100)};
  r = Run(RunOnlineVerify, {"--job", "llm"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("without a final result"));

  EXPECT_EQ(Run(RunOnlineVerify, {"--job", "llm", "--step", "x"}).code, base::kExitUsage);
}

// ------------------------------------------------------------------ the token

TEST_F(OperatorCommandsTest, ReadTokenFileTrimsAndChecks) {
  EXPECT_THAT(ReadTokenFile(TokenFile("t1", "  abc123\n\n")), IsOkAndHolds(std::string("abc123")));
  EXPECT_THAT(ReadTokenFile(TokenFile("t2", " \n\t")),
              StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("--token-file"), HasSubstr("t2"),
                                                                 HasSubstr("empty"))));
  EXPECT_THAT(ReadTokenFile(TokenFile("t3", "two words")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("printable ASCII")));
  EXPECT_THAT(ReadTokenFile(TokenFile("t4", std::string(5000, 'a'))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("longer than 4096")));
  EXPECT_THAT(ReadTokenFile("/no/such/token"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/no/such/token")));
  EXPECT_THAT(ReadTokenFile(::testing::TempDir()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("directory")));
}

TEST_F(OperatorCommandsTest, AMissingOrEmptyTokenFileIsAUsageErrorNamingIt) {
  Requested(1240);
  for (const std::string& file : {std::string("/no/such/token"), TokenFile("empty-token", "\n")}) {
    for (const Runner& run : std::vector<Runner>{RunCheckpoint, RunOnlineVerify, RunStatus}) {
      Result r = Run(run, {"--job", "llm", "--token-file", file});
      EXPECT_EQ(r.code, base::kExitUsage) << file;
      EXPECT_THAT(r.err, HasSubstr(file));
      EXPECT_THAT(r.out, IsEmpty());
    }
  }
  EXPECT_EQ(fake_.connects, 0);
}

// ------------------------------------------------------------------ errors

struct CommandCase {
  std::string name;
  Runner run;
  std::vector<std::string> argv;
  std::string rpc;
};

std::vector<CommandCase> AllCommands() {
  return {{"status", RunStatus, {}, "GetClusterStatus"},
          {"checkpoint", RunCheckpoint, {"--job", "llm"}, "RequestCheckpoint"},
          {"list", RunList, {"--job", "llm"}, "ListSteps"},
          {"restore-plan", RunRestorePlan, {"--job", "llm"}, "GetRestorePreview"},
          {"verify", RunOnlineVerify, {"--job", "llm"}, "VerifyStep"}};
}

TEST_F(OperatorCommandsTest, EveryCommandMapsErrorsToExitStatuses) {
  struct ErrorCase {
    absl::Status status;
    int code;
    std::vector<std::string> says;
  };
  const std::vector<ErrorCase> cases = {
      {absl::UnavailableError("coordinator coord.example:7070: failed to connect"), base::kExitUnavailable,
       {"cannot reach the coordinator coord.example:7070: failed to connect"}},
      {absl::UnavailableError("failed to connect"), base::kExitUnavailable, {"at coord.example:7070"}},
      {absl::DeadlineExceededError("coordinator coord.example:7070: Deadline Exceeded"), base::kExitUnavailable,
       {"cannot reach", "coord.example:7070"}},
      {absl::NotFoundError("coordinator coord.example:7070: no job llm"), base::kExitFailed, {"no job llm"}},
      {absl::InvalidArgumentError("coordinator coord.example:7070: bad job name"), base::kExitUsage, {"bad job name"}},
      {absl::UnauthenticatedError("RequestCheckpoint needs the operator token"), base::kExitFailed,
       {"needs the operator token", "pass --token-file"}},
      {absl::PermissionDeniedError("RequestCheckpoint: the operator token is wrong"), base::kExitFailed,
       {"the operator token is wrong", "--token-file"}},
      {absl::UnimplementedError(""), base::kExitFailed, {"too old", "upgrade ckptd-coordinator"}},
      {absl::FailedPreconditionError("job llm has no live rank"), base::kExitFailed, {"job llm has no live rank"}},
  };
  for (const CommandCase& cmd : AllCommands()) {
    for (const ErrorCase& e : cases) {
      fake_.error = e.status;
      Result r = Run(cmd.run, cmd.argv);
      EXPECT_EQ(r.code, e.code) << cmd.name << " " << e.status;
      EXPECT_THAT(r.err, HasSubstr(absl::StrCat("ckptctl ", cmd.name, ": "))) << e.status;
      for (const std::string& s : e.says) EXPECT_THAT(r.err, HasSubstr(s)) << cmd.name << " " << e.status;
      if (absl::IsUnimplemented(e.status)) {
        EXPECT_THAT(r.err, AllOf(HasSubstr(absl::StrCat("`ckptctl ", cmd.name, "`")), HasSubstr(cmd.rpc)));
      }
      EXPECT_THAT(r.out, IsEmpty()) << cmd.name << " " << e.status;
    }
  }
}

TEST_F(OperatorCommandsTest, ARefusedTokenFileIsNamed) {
  fake_.error = absl::PermissionDeniedError("RequestCheckpoint: the operator token is wrong");
  const std::string token = TokenFile("wrong-token", "nope\n");
  Result r = Run(RunCheckpoint, {"--job", "llm", "--token-file", token});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, AllOf(HasSubstr("refused the operator token in"), HasSubstr(token)));
}

TEST_F(OperatorCommandsTest, AFactoryErrorIsMappedToo) {
  std::ostringstream out, err;
  CoordinatorApiFactory broken = [](const base::Args&) -> absl::StatusOr<std::unique_ptr<CoordinatorApi>> {
    return absl::InvalidArgumentError("mutual TLS needs all of --tls-ca, --tls-cert and --tls-key");
  };
  EXPECT_EQ(RunList({"--coordinator", kAddress, "--job", "llm", "--tls-ca", "x"}, broken, out, err), base::kExitUsage);
  EXPECT_THAT(err.str(), HasSubstr("--tls-cert"));
}

TEST_F(OperatorCommandsTest, BadFlagsAreUsageErrorsNamingTheFlag) {
  for (const CommandCase& cmd : AllCommands()) {
    Result r = Run(cmd.run, {"--frobnicate"});
    EXPECT_EQ(r.code, base::kExitUsage) << cmd.name;
    EXPECT_THAT(r.err, AllOf(HasSubstr("unknown flag --frobnicate"),
                             HasSubstr(absl::StrCat("`ckptctl ", cmd.name, " --help`"))));
    r = RunExactly(cmd.run, cmd.argv);
    EXPECT_EQ(r.code, base::kExitUsage) << cmd.name;
    EXPECT_THAT(r.err, HasSubstr("--coordinator HOST:PORT is required"));
    r = Run(cmd.run, {"stray"});
    EXPECT_EQ(r.code, base::kExitUsage);
    EXPECT_THAT(r.err, HasSubstr("unexpected argument \"stray\""));
    r = Run(cmd.run, {"--job"});
    EXPECT_EQ(r.code, base::kExitUsage);
    EXPECT_THAT(r.err, HasSubstr("--job needs a value"));
  }
  for (const Runner& run : std::vector<Runner>{RunCheckpoint, RunList, RunRestorePlan, RunOnlineVerify}) {
    Result r = Run(run, {});
    EXPECT_EQ(r.code, base::kExitUsage);
    EXPECT_THAT(r.err, HasSubstr("--job is required"));
  }
  for (const char* bad : {"soon", "0", "-5s", "inf"}) {
    Result r = Run(RunCheckpoint, {"--job", "llm", "--timeout", bad});
    EXPECT_EQ(r.code, base::kExitUsage) << bad;
    EXPECT_THAT(r.err, HasSubstr("--timeout")) << bad;
  }
  EXPECT_EQ(Run(RunStatus, {"--no-wait"}).code, base::kExitUsage);
  EXPECT_EQ(fake_.connects, 0);
}

TEST_F(OperatorCommandsTest, TimeoutFlagParses) {
  auto parse = [](const std::string& v) { return TimeoutFlag(*base::Args::Parse({"--timeout", v}, {"timeout"}, {})); };
  EXPECT_THAT(parse("90s"), IsOkAndHolds(std::optional<absl::Duration>(absl::Seconds(90))));
  EXPECT_THAT(parse("10m"), IsOkAndHolds(std::optional<absl::Duration>(absl::Minutes(10))));
  EXPECT_THAT(parse("1h30m"), IsOkAndHolds(std::optional<absl::Duration>(absl::Minutes(90))));
  EXPECT_THAT(parse("2.5"), IsOkAndHolds(std::optional<absl::Duration>(absl::Milliseconds(2500))));
  EXPECT_THAT(TimeoutFlag(*base::Args::Parse({}, {"timeout"}, {})), IsOkAndHolds(std::nullopt));
}

TEST_F(OperatorCommandsTest, HelpDocumentsFlagsAndExitStatuses) {
  for (const CommandCase& cmd : AllCommands()) {
    Result r = RunExactly(cmd.run, {"--help"});
    EXPECT_EQ(r.code, base::kExitOk) << cmd.name;
    EXPECT_THAT(r.out, AllOf(HasSubstr(absl::StrCat("usage: ckptctl ", cmd.name)), HasSubstr("--coordinator HOST:PORT"),
                             HasSubstr("--json"), HasSubstr("exit status: 0"), HasSubstr("3 the coordinator")));
    EXPECT_THAT(r.err, IsEmpty());
  }
  EXPECT_THAT(kCheckpointHelp, AllOf(HasSubstr("--token-file"), HasSubstr("--no-wait"), HasSubstr("--timeout"),
                                     HasSubstr("superseded")));
  EXPECT_THAT(kOnlineVerifyHelp, AllOf(HasSubstr("--token-file"), HasSubstr("--step"), HasSubstr("--timeout")));
  EXPECT_EQ(fake_.connects, 0);
}

// ------------------------------------------------------------------ verify dispatch

TEST(VerifyDispatchTest, OnlyCoordinatorMakesItOnline) {
  EXPECT_TRUE(IsOnlineVerify({"--job", "x", "--coordinator", "h:1"}));
  EXPECT_TRUE(IsOnlineVerify({"--coordinator=h:1"}));
  EXPECT_FALSE(IsOnlineVerify({"--root", "/r", "--job", "x"}));
  EXPECT_FALSE(IsOnlineVerify({"--root", "/r", "--", "--coordinator"}));
  EXPECT_FALSE(IsOnlineVerify({"--coordinators"}));
}

TEST(VerifyDispatchTest, OfflineVerifyIsUnaffected) {
  storage::MemFileSystem fs;
  ASSERT_TRUE(fs.CreateDir("/root").ok());
  int connects = 0;
  CoordinatorApiFactory never = [&](const base::Args&) -> absl::StatusOr<std::unique_ptr<CoordinatorApi>> {
    ++connects;
    return absl::InternalError("not used");
  };
  for (const std::vector<std::string>& argv : std::vector<std::vector<std::string>>{
           {"--root", "/root"},
           {"--root", "/root", "--json"},
           {"--root", "/root", "--job", "train", "--step", "7"},
           {"--job", "train"},
           {"--root", "/root", "--step", "x", "--job", "j"},
           {"--root", "/root", "--help"}}) {
    std::ostringstream out1, err1, out2, err2;
    const int direct = RunVerify(&fs, argv, out1, err1);
    const int dispatched = RunVerifyCommand(&fs, argv, never, out2, err2);
    EXPECT_EQ(direct, dispatched) << argv[0];
    EXPECT_EQ(out1.str(), out2.str());
    EXPECT_EQ(err1.str(), err2.str());
  }
  EXPECT_EQ(connects, 0);

  // A bare --help describes both forms.
  std::ostringstream out, err;
  EXPECT_EQ(RunVerifyCommand(&fs, {"--help"}, never, out, err), base::kExitOk);
  EXPECT_THAT(out.str(), AllOf(HasSubstr(kVerifyHelp), HasSubstr(kOnlineVerifyHelp)));
}

TEST(VerifyDispatchTest, CoordinatorGoesOnlineAndRootWithItIsAUsageError) {
  storage::MemFileSystem fs;
  int connects = 0;
  CoordinatorApiFactory counting = [&](const base::Args&) -> absl::StatusOr<std::unique_ptr<CoordinatorApi>> {
    ++connects;
    return absl::UnavailableError("coordinator h:1: failed to connect");
  };
  std::ostringstream out, err;
  EXPECT_EQ(RunVerifyCommand(&fs, {"--job", "llm", "--coordinator", "h:1"}, counting, out, err), base::kExitUnavailable);
  EXPECT_EQ(connects, 1);
  EXPECT_THAT(err.str(), HasSubstr("ckptctl verify: cannot reach the coordinator h:1"));

  std::ostringstream out2, err2;
  EXPECT_EQ(RunVerifyCommand(&fs, {"--root", "/r", "--job", "llm", "--coordinator", "h:1"}, counting, out2, err2),
            base::kExitUsage);
  EXPECT_THAT(err2.str(), AllOf(HasSubstr("--root"), HasSubstr("--coordinator"), HasSubstr("do not go together")));
  EXPECT_EQ(connects, 1);
}

// ------------------------------------------------------------------ terminal safety (issue 16, finding 10)

// Failure details, names and reasons that agents and the coordinator send
// reach the terminal escaped: no escape sequence runs, no line is forged.
TEST_F(OperatorCommandsTest, StatusEscapesWhatAgentsAndTheCoordinatorSent) {
  // `text` in every name and detail the status shows.
  auto with = [this](absl::string_view text) {
    fake_ = FakeCoordinator();
    TwoNodes();
    fake_.events.mutable_events(1)->set_detail(std::string(text));  // the newest failure
    fake_.events.mutable_events(1)->set_node_id(absl::StrCat("node-", text));
    fake_.events.mutable_events(0)->set_job(absl::StrCat("llm", text));
    fake_.cluster.mutable_agents(0)->set_node_id(absl::StrCat("node-", text));
    fake_.cluster.mutable_agents(0)->mutable_ranks(0)->set_job(absl::StrCat("j", text));
    ckptd::v1::JobStatus* job = fake_.cluster.add_jobs();
    job->set_job(absl::StrCat("zz", text));
    job->set_state(ckptd::v1::JOB_RUNNING);
    ckptd::v1::IntervalStatus waiting;
    waiting.set_waiting_for(std::string(text));
    fake_.intervals[job->job()] = waiting;
  };
  with("plain");
  const size_t plain_lines = Lines(Run(RunStatus, {}).out).size();

  with(kHostile);
  Result r = Run(RunStatus, {});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ExpectTerminalSafe(r.out);
  EXPECT_THAT(r.out, AllOf(HasSubstr(absl::StrCat("  ", kShown, "\n")),
                           HasSubstr(absl::StrCat("node-", kShown)), HasSubstr(absl::StrCat("llm", kShown)),
                           HasSubstr(absl::StrCat("j", kShown, " 0")), HasSubstr(absl::StrCat("zz", kShown)),
                           HasSubstr(absl::StrCat("policy waiting for ", kShown, "\n"))));
  EXPECT_EQ(Lines(r.out).size(), plain_lines) << r.out;

  // JSON escapes by JSON's rules, and stays one line of valid JSON.
  Result j = Run(RunStatus, {"--json"});
  ASSERT_EQ(j.code, base::kExitOk) << j.err;
  ASSERT_TRUE(IsValidJson(j.out)) << j.out;
  ExpectTerminalSafe(j.out);
  EXPECT_EQ(Lines(j.out).size(), 1u);
  EXPECT_THAT(j.out, HasSubstr("\"detail\":\"\\u001b[2J\\rFAKE\\nline\\u001b]0;pwned\\u0007\\u009b31m\\u00ff\""));
}

TEST_F(OperatorCommandsTest, StepsRestorePlanVerifyAndCheckpointEscapeTheCoordinatorsTexts) {
  fake_.steps = {Steps({{1100, ckptd::v1::STEP_QUARANTINED, 4, absl::StrCat("verification: ", kHostile)}})};
  Result list = Run(RunList, {"--job", "llm"});
  ASSERT_EQ(list.code, base::kExitOk) << list.err;
  ExpectTerminalSafe(list.out);
  EXPECT_THAT(list.out, HasSubstr(absl::StrCat("verification: ", kShown, "\n")));

  ckptd::v1::RestorePreview p;
  p.set_job(absl::StrCat("llm", kHostile));
  p.set_state(ckptd::v1::JOB_RUNNING);
  p.set_step(1000);
  p.set_reason(kHostile);
  StepEntry* bad = p.add_passed_over();
  bad->set_step(1100);
  bad->set_state(ckptd::v1::STEP_QUARANTINED);
  bad->set_reason(absl::StrCat("quarantined: ", kHostile));
  fake_.preview = p;
  Result plan = Run(RunRestorePlan, {"--job", "llm"});
  ASSERT_EQ(plan.code, base::kExitOk) << plan.err;
  ExpectTerminalSafe(plan.out);
  EXPECT_THAT(plan.out, AllOf(HasSubstr(absl::StrCat("job llm", kShown, ": running")),
                              HasSubstr(absl::StrCat("  why: ", kShown, "\n")),
                              HasSubstr(absl::StrCat("quarantined: ", kShown, "\n"))));

  ckptd::v1::VerifyProgress last = Progress(4, uint64_t{4} << 30, /*last=*/true, /*ok=*/false);
  last.add_problems(absl::StrCat("rank-1.shard: tensor ", kHostile, ": checksum mismatch"));
  fake_.verify_stream = {last};
  Result verify = Run(RunOnlineVerify, {"--job", "llm"});
  EXPECT_EQ(verify.code, base::kExitFailed);
  ExpectTerminalSafe(verify.out);
  EXPECT_THAT(verify.out, HasSubstr(absl::StrCat("    rank-1.shard: tensor ", kShown, ": checksum mismatch\n")));

  // A reason on stderr too: an aborted checkpoint, a moved one.
  Requested(1240);
  fake_.steps = {Steps({{1240, ckptd::v1::STEP_PENDING, 3, ""}}),
                 Steps({{1240, ckptd::v1::STEP_ABORTED, 3, absl::StrCat("rank 2: ", kHostile)}})};
  Result aborted = Run(RunCheckpoint, {"--job", "llm"});
  EXPECT_EQ(aborted.code, base::kExitFailed);
  ExpectTerminalSafe(aborted.out);
  ExpectTerminalSafe(aborted.err);
  EXPECT_THAT(aborted.err, HasSubstr(absl::StrCat("step 1240 was aborted: rank 2: ", kShown, "\n")));
  fake_.list_steps_calls = 0;
  fake_.cluster = Running(1250, {1260});
  Result moved = Run(RunCheckpoint, {"--job", "llm", "--timeout", "1s"});
  ExpectTerminalSafe(moved.out);
  EXPECT_THAT(moved.out, HasSubstr(absl::StrCat("moved the checkpoint to step 1260 (rank 2: ", kShown, ")\n")));
}

TEST_F(OperatorCommandsTest, TheCoordinatorsErrorMessagesAreEscaped) {
  for (const CommandCase& cmd : AllCommands()) {
    for (const absl::Status& s : {absl::FailedPreconditionError(kHostile), absl::InvalidArgumentError(kHostile),
                                  absl::UnavailableError(kHostile), absl::PermissionDeniedError(kHostile)}) {
      fake_.error = s;
      Result r = Run(cmd.run, cmd.argv);
      EXPECT_NE(r.code, base::kExitOk) << cmd.name;
      ExpectTerminalSafe(r.err);
      EXPECT_THAT(r.err, HasSubstr(kShown)) << cmd.name << " " << s.code();
    }
  }
}

// ------------------------------------------------------------------ numbers (issue 16, finding 9)

// A port outside 1..65535 is a usage error naming --coordinator, before any
// connection: never wrapped to another port.
TEST_F(OperatorCommandsTest, ACoordinatorPortOutsideItsRangeIsAUsageErrorNotWrapped) {
  for (const CommandCase& cmd : AllCommands()) {
    for (const std::string address :
         {"127.0.0.1:99999", "127.0.0.1:65536", "127.0.0.1:0", "[::1]:4294967296", "coord", "::1:7070"}) {
      std::vector<std::string> argv = {"--coordinator", address};
      argv.insert(argv.end(), cmd.argv.begin(), cmd.argv.end());
      Result r = RunExactly(cmd.run, argv);
      EXPECT_EQ(r.code, base::kExitUsage) << cmd.name << " " << address;
      EXPECT_THAT(r.err, HasSubstr(absl::StrCat("ckptctl ", cmd.name, ": --coordinator: \"", address, "\"")))
          << cmd.name;
    }
    Result top = RunExactly(cmd.run, [&] {
      std::vector<std::string> argv = {"--coordinator", "coord.example:65535"};
      argv.insert(argv.end(), cmd.argv.begin(), cmd.argv.end());
      return argv;
    }());
    EXPECT_THAT(top.err, Not(HasSubstr("--coordinator:"))) << cmd.name;
  }
  EXPECT_EQ(fake_.connects, AllCommands().size());  // the valid addresses only
  Result r = RunExactly(RunStatus, {"--coordinator", "127.0.0.1:99999"});
  EXPECT_THAT(r.err, HasSubstr("port must be 1..65535"));
}

// A drill's rank is parsed wide: past the largest world it is an error, not
// another rank (2^32 + 2 was rank 2) nor, for node scenarios, a node name.
TEST_F(OperatorCommandsTest, ADrillTargetRankOutsideAnyWorldIsAUsageError) {
  for (const auto& [scenario, target] : std::vector<std::pair<std::string, std::string>>{
           {"kill-trainer", "1048576"},
           {"kill-trainer", "4294967298"},
           {"corrupt-shard", "99999999999999999999999"},
           {"kill-agent", "4294967296"},
       }) {
    std::ostringstream out, err;
    const int code = RunDrillCommand(
        {"run", "--coordinator", kAddress, "--job", "llm", "--scenario", scenario, "--target", target}, Factory(), out,
        err, Env());
    EXPECT_EQ(code, base::kExitUsage) << scenario << " " << target;
    EXPECT_THAT(err.str(), HasSubstr(absl::StrCat("--target: rank ", target, " is outside 0..1048575")));
  }
}

// A drill's durations and step are checked against the coordinator's limits
// before anything is sent.
TEST_F(OperatorCommandsTest, ADrillDurationOrStepOutsideItsRangeIsAUsageError) {
  for (const auto& [flags, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--scenario", "hang-trainer", "--target", "2", "--duration", "2h"},
            "--duration must be at most 1h, got \"2h\""},
           {{"--scenario", "storage-slow", "--target", "node-a", "--slow", "61s"},
            "--slow must be at most 1m, got \"61s\""},
           {{"--scenario", "kill-trainer", "--target", "2", "--watch", "25h"},
            "--watch must be at most 24h, got \"25h\""},
           {{"--scenario", "kill-trainer", "--target", "2", "--at-step", "4611686018427387905"},
            "--at-step must be an integer in 0..4611686018427387904"},
           {{"--scenario", "kill-trainer", "--target", "2", "--at-step", "18446744073709551616"},
            "--at-step must be an integer in 0..4611686018427387904"},
       }) {
    std::vector<std::string> argv = {"run", "--coordinator", kAddress, "--job", "llm"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::ostringstream out, err;
    EXPECT_EQ(RunDrillCommand(argv, Factory(), out, err, Env()), base::kExitUsage) << message;
    EXPECT_THAT(err.str(), HasSubstr(message));
  }
}

}  // namespace
}  // namespace ckptd::cli
