// Two cadences: memory checkpoints every τ of compute (the snapshot stays in
// the agents' memory and is replicated to partner agents) and durable ones
// every k-th of them. A failure that a memory copy recovers from (a trainer
// process lost on a healthy node; a node lost while its partners hold its
// ranks) loses at most τ; one that needs the disk (several nodes or a whole
// failure domain, or a node without partners) loses at most k·τ.
// docs/interval.md derives the rules; pure arithmetic like interval_policy.h.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "policy/interval_policy.h"

namespace ckptd::policy {

// ---------------------------------------------------------------------------
// Failure classes, by what a restore needs.

enum class FailureClass : int {
  kProcess = 0,  // a trainer died or hung, its node healthy: the agent's memory has the step
  kNode = 1,     // one node lost: a partner agent's memory has its ranks
  kWide = 2,     // several nodes (a rack, a switch): the durable copy is needed
};
inline constexpr int kFailureClasses = 3;

// "process", "node", "wide".
const char* FailureClassName(FailureClass c);

// How the prior splits over the classes: fractions of failures, normalised
// by their sum. Each must be positive (no class is impossible) and finite.
// The defaults follow what large training fleets report: about three quarters
// of interruptions are one process on a healthy node.
struct FailureMix {
  double process = 0.75;
  double node = 0.20;
  double wide = 0.05;

  double of(FailureClass c) const;
};

// kInvalidArgument naming the class unless every fraction is positive and finite.
absl::Status ValidateFailureMix(const FailureMix& mix);

// "P,N,W" (three numbers, e.g. "0.75,0.2,0.05"), then ValidateFailureMix.
absl::StatusOr<FailureMix> ParseFailureMix(absl::string_view text);

// The posterior of each class's rate: class c has the prior
// Gamma(shape·f_c, shape/mean) (the same pseudo-exposure for every class,
// the pseudo-failures split by the normalised mix f), so the class means add
// up to EstimateFailureRate's mean over all failures. NaN fields as
// EstimateFailureRate, and also when the mix is invalid.
std::array<FailureRateEstimate, kFailureClasses> EstimateRatesByClass(
    const FailurePrior& prior, const FailureMix& mix, const std::array<int64_t, kFailureClasses>& failures,
    double exposure_gpu_hours, double credible = 0.9);

// ---------------------------------------------------------------------------
// The two-level decision.

struct TwoLevelInputs {
  // λ1, λ2: the job's failures per second that a memory copy recovers from,
  // and that need a durable one. At least one positive.
  double memory_rate_per_s = 0;
  double durable_rate_per_s = 0;
  double memory_cost_s = 0;   // δm > 0: every checkpoint's cost (the stall and what replication slows)
  double durable_cost_s = 0;  // δd ≥ 0: a durable checkpoint's extra cost (steps slowed by the persist)
  double persist_s = 0;       // P: the durable interval k·τ is never shorter
  double replicate_s = 0;     // Q: the memory interval τ is never shorter (0 = unknown)
  double memory_restart_s = 0;   // R1: restart from memory
  double durable_restart_s = 0;  // R2: restart from disk
  double step_s = 0;             // step time with no persist in flight; 0 = no step conversion
  double min_interval_s = 0;     // operator floor of τ (0 = none)
  double max_interval_s = 0;     // operator ceiling of k·τ, the most work a disaster may lose (0 = none)
  uint64_t max_durable_every = 1000;  // bound on k
  // k set by the operator (0: the policy chooses); rule 1 then takes it, and
  // the floors and ceilings move τ instead of k.
  uint64_t fixed_durable_every = 0;
};

struct TwoLevelDecision {
  // k* = sqrt(δd·λ1 / (δm·λ2)), the continuous optimum; +inf when λ2 = 0.
  double durable_every_optimum = 0;
  uint64_t durable_every = 1;    // k: every k-th checkpoint is durable
  double daly_s = 0;             // DalyOptimum(δm + δd/k, 1/(λ1 + k·λ2)) at the optimum's k
  double memory_interval_s = 0;  // τ
  double durable_interval_s = 0; // k·τ
  uint64_t memory_steps = 0;     // τ in steps (0 without a step time)
  uint64_t durable_steps = 0;    // k · memory_steps
  double expected_waste = 0;     // TwoLevelWaste(τ, k)
  // Every checkpoint durable (what a single cadence does under the same
  // failures, costs and bounds): DecideInterval's τ and its waste.
  double single_interval_s = 0;
  double single_waste = 0;
  std::string reason;
};

// First-order expected fraction of wall time wasted with memory checkpoints
// every τ and every k-th durable:
//   W(τ, k) = (δm + δd/k)/τ + λ1·(τ/2 + R1) + λ2·(k·τ/2 + R2)
// NaN for τ not positive, k < 1, or inputs outside DecideTwoLevel's domain.
double TwoLevelWaste(double tau_s, double k, const TwoLevelInputs& in);

// The rules, in order (docs/interval.md):
// 1. k: the integer next to k* with the lower (δm + δd/k)(λ1 + kλ2), in
//    [1, max_durable_every] (1 when λ1 = 0 or δd = 0);
// 2. τ = Daly's optimum for the effective cost δm + δd/k and MTBF
//    1/(λ1 + kλ2) (with k = 1 this is DecideInterval's τ);
// 3. τ ≥ the operator minimum and ≥ Q;
// 4. k·τ ≤ the operator maximum: k lowered, or τ clamped with k = 1;
// 5. k·τ ≥ P: k raised (τ raised where k would pass its bound); P wins over
//    the operator maximum, as in DecideInterval;
// 6. steps: τ rounded to whole steps (up where it would fall under Q), k
//    raised where k steps-worth would fall under P.
// With fixed_durable_every, k is the operator's and rules 4–6 move τ (and
// its steps) instead of k.
// kInvalidArgument naming the field for inputs out of domain.
absl::StatusOr<TwoLevelDecision> DecideTwoLevel(const TwoLevelInputs& in);

// Hysteresis over both levels: true when there is no schedule yet, the
// current one breaks a hard rule (τ under Q or the operator minimum, k·τ under
// P or over the maximum), or either level moves by more than `relative` and
// the expected waste drops by at least `min_waste_gain`. False without step
// counts.
bool ShouldChangeTwoLevel(uint64_t current_memory_steps, uint64_t current_durable_every, const TwoLevelDecision& next,
                          const TwoLevelInputs& in, double relative = 0.2, double min_waste_gain = 0.001);

}  // namespace ckptd::policy
