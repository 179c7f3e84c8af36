// The checkpoint-interval policy: failure-rate estimate, job MTBF, Daly's
// optimum interval, expected waste, robust statistics over recent samples, and
// the decision (with hysteresis) that the coordinator turns into a schedule.
// docs/interval.md describes the model; everything here is pure arithmetic,
// with no clock, I/O or locking.
//
// Conventions (all functions):
// - Times are seconds, rates are failures per GPU-hour, waste is a fraction of
//   wall time (0.05 = 5 %).
// - Functions returning a plain number or struct (the formulas) return NaN for
//   inputs outside their domain, as <cmath> does; they never abort. The two
//   entry points that take operator input, DecideInterval here and
//   PlanCheckpoint in sizing.h, return kInvalidArgument naming the bad value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckptd::policy {

// ---------------------------------------------------------------------------
// Daly's optimum and the waste it minimises.

// Daly's higher-order optimum compute time between checkpoints (J. T. Daly,
// "A higher order estimate of the optimum checkpoint interval for restart
// dumps", FGCS 22(3), 2006), for checkpoint cost `delta_s` and MTBF `mtbf_s`:
//   δ < 2M:  τ = sqrt(2δM)·[1 + (1/3)·sqrt(δ/(2M)) + (1/9)·(δ/(2M))] − δ
//   δ ≥ 2M:  τ = M
// τ excludes δ: a period between checkpoint starts lasts τ + δ without failures.
// NaN unless both inputs are positive and finite.
double DalyOptimum(double delta_s, double mtbf_s);

// First-order expected fraction of wall time wasted with interval τ:
//   W(τ) = δ/τ + (τ/2 + R)/M
// (checkpoint overhead, plus per failure half an interval of lost work and a
// restart). The raw figure, deliberately not clamped to [0, 1]: a value near or
// above 1 says the first-order model no longer holds (τ or R comparable to M),
// which the caller should see rather than a plausible-looking 100 %.
// NaN unless τ, δ, M are positive and finite and R is non-negative and finite.
double ExpectedWaste(double tau_s, double delta_s, double restart_s, double mtbf_s);

// ---------------------------------------------------------------------------
// Failure rate: Gamma–Poisson conjugate estimate.

// The prior on λ (failures per GPU-hour) is Gamma(shape, rate β0 = shape/mean):
// its mean is `mean_per_gpu_hour`, and `shape` is its strength in
// pseudo-failures (shape 1 weighs as much as one observed failure).
struct FailurePrior {
  double mean_per_gpu_hour = 3e-6;  // 8192 GPUs → job MTBF ≈ 40.7 h
  double shape = 1.0;
};

// kInvalidArgument naming the field unless both fields are positive and finite.
absl::Status ValidateFailurePrior(const FailurePrior& prior);

struct FailureRateEstimate {
  double mean = 0;   // posterior mean of λ, per GPU-hour
  double lower = 0;  // equal-tailed credible interval of λ: P(λ < lower) = (1 − credible)/2
  double upper = 0;  //                                      P(λ > upper) = (1 − credible)/2
  double failures = 0;            // n, as given
  double exposure_gpu_hours = 0;  // E, as given
  double credible = 0.9;
};

// Posterior Gamma(α0 + n, β0 + E) for n failures observed over E GPU-hours.
// With n = 0 and E = 0 it is the prior; as n grows the mean tends to n/E.
// mean/lower/upper are NaN when the prior is invalid, n < 0, E is negative or
// not finite, or `credible` is not in (0, 1).
FailureRateEstimate EstimateFailureRate(const FailurePrior& prior, int64_t failures, double exposure_gpu_hours,
                                        double credible = 0.9);

// Job MTBF in seconds for `gpus` GPUs failing independently at λ per GPU-hour:
// 3600 / (G·λ). NaN unless λ > 0 (finite) and gpus > 0.
double JobMtbfSeconds(double lambda_per_gpu_hour, int gpus);

// The regularized lower incomplete gamma function P(a, x) = γ(a, x)/Γ(a), the
// CDF of Gamma(shape a, rate 1) at x. NaN unless a > 0 and x ≥ 0 (both finite;
// x = +inf gives 1).
double RegularizedGammaP(double a, double x);

// The p-quantile of Gamma(shape, rate): the x with P(shape, x·rate) = p,
// to about 1e-12 relative. 0 for p = 0 (and where the quantile is below the
// smallest double: tiny p with a shape ≪ 1), +inf for p = 1; NaN unless shape
// and rate are positive and finite and p is in [0, 1].
double GammaQuantile(double shape, double rate, double p);

// ---------------------------------------------------------------------------
// Robust statistics over a recent window.

// The median of `values` (the mean of the two middle ones for an even count);
// NaN when there is none.
double Median(std::vector<double> values);

// The last `capacity` samples of one measurement (stall, persist time, step
// time with and without a persist in flight, restart cost), with the median
// and the median absolute deviation, which one slow outlier cannot move much.
// Not thread-safe: the owner's lock guards it.
class RecentWindow {
 public:
  static constexpr size_t kDefaultCapacity = 64;

  // A capacity of 0 is taken as 1.
  explicit RecentWindow(size_t capacity = kDefaultCapacity);

  // Adds a sample, evicting the oldest once full. A non-finite sample is
  // dropped (it would poison every statistic) and false is returned.
  bool Push(double sample);

  size_t size() const { return size_; }
  size_t capacity() const { return samples_.size(); }
  bool empty() const { return size_ == 0; }
  void Clear() { size_ = next_ = 0; }

  // The median (mean of the two middle samples for an even count); NaN when empty.
  double Median() const;
  // median(|x − median|), unscaled (multiply by 1.4826 for a normal σ); NaN when empty.
  double Mad() const;

 private:
  std::vector<double> Contents() const;

  std::vector<double> samples_;
  size_t size_ = 0;
  size_t next_ = 0;  // where the next sample goes
};

// ---------------------------------------------------------------------------
// The decision.

struct IntervalInputs {
  double mtbf_s = 0;             // M, job MTBF
  double delta_s = 0;            // δ: blocking stall + step slowdown while a persist runs
  double persist_s = 0;          // P: τ is never shorter (a checkpoint must persist before the next)
  double restart_s = 0;          // R
  // Observed time of a step without a persist in flight; 0 = unknown (no
  // step conversion). See IntervalDecision::interval_steps.
  double step_s = 0;
  double min_interval_s = 0;     // operator bounds on τ; 0 = none
  double max_interval_s = 0;
  double alternative_s = 1800;   // the interval the user would otherwise use
};

struct IntervalDecision {
  double daly_s = 0;      // unconstrained optimum, DalyOptimum(δ, M)
  double interval_s = 0;  // τ after the operator bounds and the P floor
  // Steps between checkpoints: max(1, round(τ / step_s)) when step_s > 0, else
  // 0. τ is compute time and δ (stall + slowdown) is accounted separately, so
  // steps convert from τ with the step time *without* a persist in flight.
  // (Converting with an all-in average step time instead over-counts by about
  // δ/τ, a few %, well inside the hysteresis band.) Where rounding to the
  // nearest step would fall under P, the count is rounded up instead.
  uint64_t interval_steps = 0;
  double expected_waste = 0;     // W(interval_s)
  double alternative_waste = 0;  // W(alternative_s)
  std::string reason;            // which rule decided, for humans
};

// Daly's optimum for (δ, M), then the operator bounds, then the P floor: P
// wins over an operator maximum below it, because a shorter interval cannot be
// realized (the next checkpoint would find the previous one still persisting).
// kInvalidArgument naming the field when M or δ is not positive and finite,
// P, R, step_s or a bound is negative or not finite, the minimum exceeds the
// maximum, or the alternative is not positive.
absl::StatusOr<IntervalDecision> DecideInterval(const IntervalInputs& inputs);

// Hysteresis, so that noise in the measurements does not churn the schedule.
// True (change the schedule to next.interval_steps) when:
// - there is no schedule yet (current_steps == 0), or
// - the current schedule breaks a hard rule of `inputs` (shorter than P, or
//   outside the operator bounds) and next differs from it, or
// - next differs from current by more than `relative` (|next − cur| / cur) AND
//   its expected waste is lower by at least `min_waste_gain` (absolute),
//   both evaluated at the step counts times step_s.
// False when next has no step count (step time unknown) or inputs.step_s ≤ 0.
bool ShouldChangeInterval(uint64_t current_steps, const IntervalDecision& next, const IntervalInputs& inputs,
                          double relative = 0.2, double min_waste_gain = 0.001);

}  // namespace ckptd::policy
