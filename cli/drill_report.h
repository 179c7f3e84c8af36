// The renderings of drills (cli/drill_runner.h): a drill's report as text
// (timeline from the injection, work lost, verdict) and as JSON, a suite's
// summary as a table and as JSON, and a self-contained HTML page with an SVG
// timeline per drill. docs/ckptctl.md describes them. Internal to ckptd::cli.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "base/json.h"
#include "cli/drill_runner.h"

namespace ckptd::cli {

using base::JsonWriter;

// The report as text: timeline from the injection, work lost, verdict.
void PrintDrillReport(const DrillOutcome& d, std::ostream& out);
// The report as one JSON object (the fields docs/ckptctl.md lists).
void WriteDrillJson(const DrillOutcome& d, JsonWriter& w);
// A self-contained HTML page (no scripts, no outside resources) with a
// summary table and, per drill, an SVG timeline, the figures and the verdict.
std::string DrillHtmlPage(const std::vector<DrillOutcome>& drills, absl::string_view title);
// "kill-trainer on node node-b (rank 2)".
std::string DrillTitle(const DrillOutcome& d);

// What `drill suite` did with a suite file.
struct SuiteReport {
  // One drill of the file.
  struct Line {
    int number = 0;    // in the file
    std::string text;  // as written, without a comment
    std::string scenario;
    std::string target;  // as given; empty: the default
  };
  std::string job;
  std::string file;
  std::vector<Line> lines;  // every drill of the file, in order
  // The outcomes of the first drills.size() lines: those run. The rest were
  // not.
  std::vector<DrillOutcome> drills;
  std::string stopped;  // why the suite ended early; empty when it did not

  // Every drill of the file ran and passed.
  bool passed() const { return PassedCount(drills) == lines.size(); }
};

// The summary after the drills' reports: a table of every drill and the
// suite's verdict.
void PrintSuiteSummary(const SuiteReport& s, std::ostream& out);
// The suite as one JSON object: each drill's report, the drills not run,
// the counts and the verdict.
void WriteSuiteJson(const SuiteReport& s, JsonWriter& w);

}  // namespace ckptd::cli
