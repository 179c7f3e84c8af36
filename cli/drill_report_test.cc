#include "cli/drill_report.h"

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/testing/json_checker.h"
#include "cli/testing_drills.h"
#include "cli/testing_terminal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::cli {
namespace {

using ::ckptd::testing::IsValidJson;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// The drill of ResumedDrill(), its restored step read back intact.
DrillOutcome Resumed() {
  DrillOutcome d;
  d.scenario = "kill-trainer";
  d.job = "llm";
  d.target = "2";
  d.status = ResumedDrill();
  d.injected = true;
  d.restored_verified = Verified(40, true);
  d.restored_verified_unix_nanos = kT0 + 2'500'000'000;
  d.steps = {StepAt(20, ckptd::v1::STEP_COMMITTED, kT0 - 980'000'000),
             StepAt(40, ckptd::v1::STEP_COMMITTED, kT0 - 960'000'000),
             StepAt(60, ckptd::v1::STEP_COMMITTED, kT0 + 1'500'000'000)};
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

TEST(DrillReportTest, SaysWhereTheRanksReadTheRestoredStep) {
  DrillOutcome d = Resumed();
  ckptd::v1::RestoreSummary* r = d.status.mutable_restore_sources();
  r->set_step(40);
  for (uint32_t rank = 0; rank < 4; ++rank) {
    auto* e = r->add_ranks();
    e->set_rank(rank);
    e->set_source(rank == 2 ? ckptd::v1::PEER_MEMORY : ckptd::v1::AGENT_MEMORY);
    e->set_node_id(rank < 2 ? "node-a" : "node-b");
  }
  std::ostringstream out;
  PrintDrillReport(d, out);
  EXPECT_THAT(out.str(), HasSubstr("read from    3 ranks from memory, 1 from peer\n"));
  JsonWriter w;
  WriteDrillJson(d, w);
  EXPECT_TRUE(IsValidJson(w.str())) << w.str();
  EXPECT_THAT(w.str(), HasSubstr("\"restore_sources\":{\"step\":40,\"incarnation\":0,\"saved_world_size\":null,"
                                 "\"sources\":{\"memory\":3,\"peer\":1},\"ranks\":[{\"rank\":0,\"source\":\"memory\","
                                 "\"node\":\"node-a\",\"resharded\":false}"));
  EXPECT_THAT(DrillHtmlPage({d}, "drill"), HasSubstr("<th>read from</th><td>3 ranks from memory, 1 from peer</td>"));
  // Nothing known (a fresh start, or an older coordinator): null, no line.
  JsonWriter none;
  WriteDrillJson(Resumed(), none);
  EXPECT_THAT(none.str(), HasSubstr("\"restore_sources\":null"));
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

// ----------------------------------------------------------------- terminal safety (issue 16, finding 10)

// The drill with kHostile in every text the agent and the coordinator send.
DrillOutcome HostileDrill() {
  DrillOutcome d = Resumed();
  d.status.set_node_id(absl::StrCat("node-", kHostile));
  d.status.mutable_report()->set_detail(absl::StrCat("SIGKILL ", kHostile));
  d.status.mutable_events(0)->set_node_id(absl::StrCat("node-", kHostile));
  d.status.mutable_events(0)->set_detail(absl::StrCat("exited ", kHostile));
  d.restored_verified.reset();
  d.restored_unverified_reason = absl::StrCat("gone ", kHostile);
  d.verdicts.push_back({"the restored step verifies intact", false, absl::StrCat("problem ", kHostile)});
  return d;
}

TEST(DrillReportTest, TextEscapesWhatAgentsAndTheCoordinatorSent) {
  std::ostringstream out;
  PrintDrillReport(HostileDrill(), out);
  ExpectTerminalSafe(out.str());
  EXPECT_THAT(out.str(), AllOf(HasSubstr(absl::StrCat("injected: SIGKILL ", kShown, "\n")),
                               HasSubstr(absl::StrCat("detected trainer_died on node-", kShown, " rank 2: exited ",
                                                      kShown, "\n")),
                               HasSubstr(absl::StrCat("restored step not verified: gone ", kShown, "\n")),
                               HasSubstr(absl::StrCat("FAIL  the restored step verifies intact: problem ", kShown,
                                                      "\n"))));
  // The suite's summary too: the node in its table, why it stopped.
  SuiteReport s = TwoLines();
  s.drills = {HostileDrill()};
  s.stopped = absl::StrCat("job llm was not healthy within 2m: ", kHostile);
  std::ostringstream summary;
  PrintSuiteSummary(s, summary);
  ExpectTerminalSafe(summary.str());
  EXPECT_THAT(summary.str(), AllOf(HasSubstr(absl::StrCat("node-", kShown)),
                                   HasSubstr(absl::StrCat("stopped early: job llm was not healthy within 2m: ",
                                                          kShown, "\n"))));
}

TEST(DrillReportTest, JsonAndHtmlEscapeByTheirOwnRules) {
  JsonWriter w;
  WriteDrillJson(HostileDrill(), w);
  EXPECT_TRUE(IsValidJson(w.str())) << w.str();
  ExpectTerminalSafe(w.str());
  EXPECT_THAT(w.str(), HasSubstr("\"detail\":\"exited \\u001b[2J\\rFAKE\\nline\\u001b]0;pwned\\u0007\\u009b31m"
                                 "\\u00ff\""));
  // XML allows no C0 control but TAB, LF and CR, not even as a character
  // reference, and the page is UTF-8: both shown as in the text report.
  const std::string html = DrillHtmlPage({HostileDrill()}, absl::StrCat("drill ", kHostile));
  ExpectTerminalSafe(html);
  EXPECT_THAT(html, AllOf(HasSubstr(absl::StrCat("<title>drill ", kShown, "</title>")),
                          HasSubstr(absl::StrCat("exited ", kShown)), Not(HasSubstr("\xFF"))));
}

}  // namespace
}  // namespace ckptd::cli
