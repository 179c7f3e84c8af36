#include "cli/drill_report.h"

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/testing_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::cli {
namespace {

using ::ckptd::testing::IsValidJson;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kT0 = 1'900'000'000'000'000'000;

ckptd::v1::StepEntry Step(uint64_t step, ckptd::v1::StepState state, int64_t committed) {
  ckptd::v1::StepEntry e;
  e.set_step(step);
  e.set_state(state);
  e.set_world_size(4);
  e.set_ranks_reported(4);
  e.set_committed_unix_nanos(committed);
  return e;
}

// A kill-trainer drill on rank 2 of job llm: injected 50 ms after the order,
// detected 12 ms later, resumed from step 40 two seconds after the failure
// at step 47, and the restored step read back intact.
DrillOutcome Resumed() {
  DrillOutcome d;
  d.scenario = "kill-trainer";
  d.job = "llm";
  d.target = "2";
  ckptd::v1::DrillStatus& st = d.status;
  st.set_drill_id(7);
  st.set_node_id("node-b");
  st.set_ordered_unix_nanos(kT0);
  st.set_step_seconds(0.015);
  st.mutable_request()->set_scenario(ckptd::v1::KILL_TRAINER);
  st.mutable_request()->set_rank(2);
  st.mutable_report()->set_injected(true);
  st.mutable_report()->set_injected_unix_nanos(kT0 + 50'000'000);
  st.mutable_report()->set_detail("SIGKILL to pid 4242 (rank 2 of job llm)");
  ckptd::v1::FailureEvent* e = st.add_events();
  e->set_kind(ckptd::v1::TRAINER_DIED);
  e->set_node_id("node-b");
  e->set_has_rank(true);
  e->set_rank(2);
  e->set_unix_nanos(kT0 + 62'000'000);
  e->set_detail("exited on signal 9");
  st.set_first_detection_unix_nanos(kT0 + 62'000'000);
  st.set_resumed(true);
  st.set_restored_step(40);
  st.set_step_at_failure(47);
  st.set_failed_unix_nanos(kT0 + 62'000'000);
  st.set_resumed_unix_nanos(kT0 + 2'062'000'000);
  d.injected = true;
  ckptd::v1::VerifyProgress v;
  v.set_step(40);
  v.set_done(true);
  v.set_ok(true);
  v.set_shards_done(4);
  v.set_bytes_done(4 << 20);
  d.restored_verified = v;
  d.restored_verified_unix_nanos = kT0 + 2'500'000'000;
  d.steps = {Step(20, ckptd::v1::STEP_COMMITTED, kT0 - 980'000'000),
             Step(40, ckptd::v1::STEP_COMMITTED, kT0 - 960'000'000),
             Step(60, ckptd::v1::STEP_COMMITTED, kT0 + 1'500'000'000)};
  d.ended_unix_nanos = kT0 + 2'600'000'000;
  d.verdicts = {{"the agent injected the fault", true, "SIGKILL to pid 4242 (rank 2 of job llm)"},
                {"the failure was detected", true, "0.012 s after the injection"},
                {"the job restarted and resumed training", true, "from step 40"}};
  d.lost_steps = 7;
  d.lost_seconds = 0.105;
  d.restart_seconds = 2;
  return d;
}

TEST(DrillReportTest, TextShowsTheTimelineTheFiguresAndTheVerdict) {
  std::ostringstream out;
  PrintDrillReport(Resumed(), out);
  EXPECT_EQ(out.str(),
            "\n"
            "timeline (from the injection)\n"
            "    -0.050 s  ordered\n"
            "    +0.000 s  injected: SIGKILL to pid 4242 (rank 2 of job llm)\n"
            "    +0.012 s  detected trainer_died on node-b rank 2: exited on signal 9\n"
            "    +2.012 s  training resumed from step 40\n"
            "    +2.450 s  verified the restored step 40: intact\n"
            "\n"
            "work lost    7 steps (0.1 s at 0.015 s per step)\n"
            "restart      2.000 s from the failure to the first step after the restore\n"
            "\n"
            "verdict\n"
            "  PASS  the agent injected the fault: SIGKILL to pid 4242 (rank 2 of job llm)\n"
            "  PASS  the failure was detected: 0.012 s after the injection\n"
            "  PASS  the job restarted and resumed training: from step 40\n"
            "drill: PASS\n");

  // Not injected: times are absolute, and a failed expectation fails the drill.
  DrillOutcome refused;
  refused.scenario = "kill-agent";
  refused.status.set_ordered_unix_nanos(kT0);
  refused.verdicts = {{"the agent injected the fault", false, "node node-b did not carry the drill out: no"}};
  std::ostringstream text;
  PrintDrillReport(refused, text);
  EXPECT_THAT(text.str(), AllOf(HasSubstr("  2030-03-17T17:46:40Z  ordered\n"),
                                HasSubstr("  FAIL  the agent injected the fault: node node-b"),
                                HasSubstr("drill: FAIL\n"), Not(HasSubstr("work lost"))));
}

TEST(DrillReportTest, JsonHoldsTheFiguresAndNullsWhatIsUnknown) {
  JsonWriter w;
  WriteDrillJson(Resumed(), w);
  EXPECT_TRUE(IsValidJson(w.str())) << w.str();
  EXPECT_THAT(
      w.str(),
      AllOf(HasSubstr("\"drill_id\":7"), HasSubstr("\"detection_seconds\":0.012"), HasSubstr("\"lost_steps\":7"),
            HasSubstr("\"restored_step\":40"), HasSubstr("\"restored_verified\":{\"step\":40,\"ok\":true,\"shards\":4"),
            HasSubstr("\"commits\":[{\"step\":60,\"state\":\"committed\""), HasSubstr("\"passed\":true")));
  DrillOutcome nothing;
  JsonWriter empty;
  WriteDrillJson(nothing, empty);
  EXPECT_TRUE(IsValidJson(empty.str())) << empty.str();
  EXPECT_THAT(empty.str(), AllOf(HasSubstr("\"detection_seconds\":null"), HasSubstr("\"restored_verified\":null"),
                                 HasSubstr("\"verdict\":[]"), HasSubstr("\"passed\":false")));
}

TEST(DrillReportTest, HtmlIsOneSelfContainedPageWithATimelinePerDrill) {
  DrillOutcome d = Resumed();
  // Names and details come from agents and the job: escaped on the page.
  d.status.set_node_id("node-<b>&\"x\"");
  d.status.mutable_events(0)->set_detail("<script>alert(1)</script>");
  const std::string html = DrillHtmlPage({d}, "ckptd drill: <it>");
  EXPECT_TRUE(absl::StartsWith(html, "<!DOCTYPE html>"));
  EXPECT_TRUE(absl::EndsWith(html, "</html>\n"));
  EXPECT_THAT(html, HasSubstr("<title>ckptd drill: &lt;it&gt;</title>"));
  // Nothing from outside: no scripts, no links to fetch.
  EXPECT_THAT(html, AllOf(Not(HasSubstr("<script")), Not(HasSubstr("src=")), Not(HasSubstr("http://www.w3.org/1999")),
                          Not(HasSubstr("<link"))));
  EXPECT_THAT(html, HasSubstr("&lt;script&gt;alert(1)&lt;/script&gt;"));
  EXPECT_THAT(html, HasSubstr("node-&lt;b&gt;&amp;&quot;x&quot;"));
  // The timeline: one SVG with the injection, the detection, the commit
  // after the restart, the downtime band and the axis from the injection.
  EXPECT_THAT(html, HasSubstr("<svg"));
  EXPECT_THAT(html, AllOf(HasSubstr(">injected</text>"), HasSubstr(">detected trainer_died</text>"),
                          HasSubstr(">resumed from 40</text>"), HasSubstr(">verified step 40</text>"),
                          HasSubstr("class=\"band-down\""), HasSubstr("step 60 committed"), HasSubstr(">+1.0 s</text>"),
                          HasSubstr(">0</text>")));
  EXPECT_THAT(html, AllOf(HasSubstr("0.012 s"), HasSubstr("7 steps"), HasSubstr("class=\"pass\">PASS"),
                          HasSubstr("1 of 1 drill passed"), HasSubstr("<section id=\"drill-1\">")));

  DrillOutcome failed = Resumed();
  failed.verdicts[1].held = false;
  const std::string two = DrillHtmlPage({Resumed(), failed}, "suite");
  EXPECT_THAT(two, AllOf(HasSubstr("1 of 2 drills passed: <span class=\"fail\">FAIL"),
                         HasSubstr("<section id=\"drill-2\">"), HasSubstr("<td class=\"fail\">FAIL</td>")));
  EXPECT_THAT(DrillHtmlPage({}, "none"), HasSubstr("0 of 0 drills passed: <span class=\"fail\">FAIL"));
}

SuiteReport TwoLines() {
  SuiteReport s;
  s.job = "llm";
  s.file = "drills.txt";
  s.lines = {{3, "kill-trainer --target 2", "kill-trainer", "2"}, {5, "storage-eio", "storage-eio", ""}};
  s.drills = {Resumed()};
  s.stopped = "job llm was not healthy within 2m: the job is restarting";
  return s;
}

TEST(DrillReportTest, SuiteSummaryTableListsEveryDrillAndWhatWasNotRun) {
  std::ostringstream out;
  const SuiteReport s = TwoLines();
  EXPECT_FALSE(s.passed());
  PrintSuiteSummary(s, out);
  EXPECT_EQ(out.str(),
            "\n"
            "suite summary: job llm, drills.txt\n"
            "  #  line  scenario      target  node    detected  restored  lost     verdict\n"
            "  1     3  kill-trainer  2       node-b  0.012 s   step 40   7 steps  PASS\n"
            "  2     5  storage-eio   -       -       -         -         -        not run\n"
            "stopped early: job llm was not healthy within 2m: the job is restarting\n"
            "suite: FAIL (1 of 2 drills passed, 1 not run)\n");
}

TEST(DrillReportTest, SuiteJsonCountsTheDrills) {
  JsonWriter w;
  WriteSuiteJson(TwoLines(), w);
  EXPECT_TRUE(IsValidJson(w.str())) << w.str();
  EXPECT_THAT(w.str(), AllOf(HasSubstr("{\"job\":\"llm\",\"file\":\"drills.txt\",\"drills\":[{\"line\":3,"
                                       "\"spec\":\"kill-trainer --target 2\",\"report\":{\"drill_id\":7"),
                             HasSubstr("\"not_run\":[{\"line\":5,\"spec\":\"storage-eio\"}]"),
                             HasSubstr("\"drills_passed\":1,\"drills_failed\":0,\"drills_not_run\":1,"
                                       "\"passed\":false}")));
}

}  // namespace
}  // namespace ckptd::cli
