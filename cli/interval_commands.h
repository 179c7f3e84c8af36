// ckptctl interval and ckptctl plan: the checkpoint-interval policy explained
// from given inputs, and the capacity planner. Both work offline; the
// rendering of an interval decision (table, JSON, SVG) takes an IntervalReport
// so that a live mode that fills one from the coordinator prints the same way.
// `plan` is implemented in cli/plan_command.cc.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <functional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/flags.h"
#include "ckptd/v1/coordinator.pb.h"
#include "policy/interval_policy.h"
#include "policy/sizing.h"
#include "policy/two_level.h"

namespace ckptd::cli {

// The two cadences (memory checkpoints every τ, every k-th durable) and the
// failure classes they come from (policy/two_level.h).
struct TwoLevelReport {
  struct Class {
    std::string name;                  // process, node, wide
    double rate_per_s = 0;             // the job's failures of this class per second
    std::optional<uint64_t> failures;  // live: seen across the coordinator's jobs
    bool from_memory = false;          // recovered from memory rather than disk
  };
  std::vector<Class> classes;
  bool peer_copies = false;  // node failures come back from a partner's memory
  policy::TwoLevelInputs inputs;
  // Absent with `error` when the decision could not be made.
  std::optional<policy::TwoLevelDecision> decision;
  std::string error;
};

// One interval decision and what it came from.
struct IntervalReport {
  policy::IntervalInputs inputs;
  policy::IntervalDecision decision;
  // Live mode only; empty, 0 and absent offline. `rate` is the failure-rate
  // estimate inputs.mtbf_s came from, with the failures seen and the exposure
  // (GPU-hours) it was computed over.
  std::string job;
  int gpus = 0;
  std::optional<policy::FailureRateEstimate> rate;
  // Live mode: the coordinator's whole answer (schedule in force, how δ splits
  // into stall and slowdown, whether R is measured or assumed, samples).
  std::optional<ckptd::v1::IntervalStatus> live;
  // Offline with --memory-cost-seconds; live whenever the coordinator decided.
  std::optional<TwoLevelReport> two_level;
};

// The two cadences decided for `inputs`, with the classes they came from.
TwoLevelReport DecideTwoLevelReport(std::vector<TwoLevelReport::Class> classes, bool peer_copies,
                                    const policy::TwoLevelInputs& inputs);

// The report for a live status that has a decision (status.decided()).
IntervalReport IntervalReportFromStatus(const ckptd::v1::IntervalStatus& status);

// How live mode asks the coordinator (cli/remote.h: FetchInterval); tests
// pass a fake.
using IntervalFetcher = std::function<absl::StatusOr<ckptd::v1::IntervalStatus>(const base::Args&, const std::string& job)>;

// Every input and output, one per line, times in seconds and a readable unit,
// waste in %.
void PrintIntervalTable(const IntervalReport& report, std::ostream& out);
// One JSON object: the inputs (mtbf_seconds, cost_seconds, persist_seconds,
// restart_seconds, step_seconds, min_seconds, max_seconds, alternative_seconds)
// and outputs (daly_seconds, interval_seconds, interval_steps, expected_waste,
// alternative_waste as fractions, reason); live fields when present; the two
// cadences under "two_level". Unknown or unset values (step time, bounds,
// steps, an unbounded k*) are null.
std::string IntervalJson(const IntervalReport& report);
// A self-contained SVG of W(τ) over a log-scale τ axis with the chosen
// interval (element id "chosen"), the alternative ("alternative") and, where
// it differs from the chosen one, Daly's optimum ("daly") marked.
std::string WasteCurveSvg(const IntervalReport& report);

void PrintPlanTable(const policy::PlanInputs& inputs, const policy::Plan& plan, std::ostream& out);
std::string PlanJson(const policy::PlanInputs& inputs, const policy::Plan& plan);

// A parameter count: a plain number ("7000000000", "7e9") or one with a
// decimal suffix K, M, B or T (any case): "350M", "7B", "1.5T". A whole
// number: digits are read exactly, other forms rounded to the nearest whole
// count when within 1e-9 of it. kInvalidArgument naming the text unless a
// whole number in 1..policy::kMaxPlanParams (2^53).
absl::StatusOr<double> ParseParameterCount(absl::string_view text);
// A GPU's memory in bytes: a number of GiB ("80", "79.6"), or one with a
// unit, K, M, G, T or KiB .. TiB (powers of 1024) or KB .. TB (powers of
// 1000), any case: "96G", "141GB". Rounded to whole bytes; kInvalidArgument
// naming the text unless 1 byte to 1 EiB (2^60).
absl::StatusOr<uint64_t> ParseGpuMemory(absl::string_view text);

// ckptctl interval --mtbf-hours M --cost-seconds δ [...]; see kIntervalHelp.
// Returns a base::ExitCode (base/flags.h): 0, 1 when the SVG cannot be written, 2 on
// a usage error (message naming the flag and value on `err`).
// With --job J --coordinator HOST:PORT (live mode) the figures come from
// `fetch`; an empty one makes live mode a usage error. Exit 3 when the
// coordinator cannot be reached, 1 when it has no such job.
int RunInterval(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err,
                const IntervalFetcher& fetch = {});

// ckptctl plan --params N --gpus G [...]; see kPlanHelp. Returns a base::ExitCode.
int RunPlan(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

extern const char kIntervalHelp[];
extern const char kPlanHelp[];

}  // namespace ckptd::cli
