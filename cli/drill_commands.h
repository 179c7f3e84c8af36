// ckptctl drill: failure drills against a live job. `drill run` orders one
// scenario through the coordinator, watches what follows and judges it;
// `drill suite FILE` runs several in order and sums them up. Each report
// prints as text, as JSON (--json) and as a self-contained HTML page with an
// SVG timeline (--html FILE). docs/ckptctl.md describes them.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "ckptd/v1/coordinator.pb.h"
#include "cli/json.h"
#include "cli/operator_commands.h"

namespace ckptd::cli {

extern const char kDrillHelp[];
extern const char kDrillSuiteHelp[];

// One expectation of a drill and whether it held.
struct DrillVerdict {
  std::string expectation;
  bool held = false;
  std::string detail;
};

// Everything a drill's report shows.
struct DrillOutcome {
  std::string scenario;  // "kill-trainer", ...
  std::string job;
  std::string target;    // as given: a rank or a node; empty: the default rank 0
  ckptd::v1::DrillStatus status;  // the coordinator's view when the drill ended
  bool injected = false;
  // corrupt-shard: the verification of the damaged step, and when it ended.
  std::optional<ckptd::v1::VerifyProgress> damaged_verified;
  int64_t damaged_verified_unix_nanos = 0;
  // After a restart: the verification of the step restored, when it ended,
  // or why it could not be verified.
  std::optional<ckptd::v1::VerifyProgress> restored_verified;
  int64_t restored_verified_unix_nanos = 0;
  std::string restored_unverified_reason;  // not verified, and not a failure
  std::string restored_verify_error;       // the verification itself failed
  std::vector<ckptd::v1::StepEntry> steps;  // the job's steps when it ended
  int64_t ended_unix_nanos = 0;             // when the drill stopped watching
  std::vector<DrillVerdict> verdicts;
  uint64_t lost_steps = 0;
  double lost_seconds = 0;
  double restart_seconds = 0;

  bool passed() const;
  std::optional<double> detection_seconds() const;
};

// The report as text: timeline from the injection, work lost, verdict.
void PrintDrillReport(const DrillOutcome& d, std::ostream& out);
// The report as one JSON object (the fields docs/ckptctl.md lists).
void WriteDrillJson(const DrillOutcome& d, JsonWriter& w);
// A self-contained HTML page (no scripts, no outside resources) with a
// summary table and, per drill, an SVG timeline, the figures and the verdict.
std::string DrillHtmlPage(const std::vector<DrillOutcome>& drills, absl::string_view title);

// ckptctl drill run|suite ...; see kDrillHelp and kDrillSuiteHelp. Exit 0
// when every expectation of every drill held, 1 when one did not (or a drill
// could not be carried out), 2 usage, 3 the coordinator cannot be reached.
int RunDrillCommand(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
                    std::ostream& err, const OperatorEnv& env = {});

}  // namespace ckptd::cli
