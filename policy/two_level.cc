#include "policy/two_level.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "policy/checks.h"

namespace ckptd::policy {
namespace {

using internal::CheckNonNegative;
using internal::CheckPositive;
using internal::PositiveFinite;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
// Far beyond any real schedule, and keeps the conversion to uint64 defined.
constexpr double kMaxSteps = 1e15;

absl::Status ValidateTwoLevel(const TwoLevelInputs& in) {
  for (absl::Status s : {CheckNonNegative("memory_rate_per_s", in.memory_rate_per_s),
                         CheckNonNegative("durable_rate_per_s", in.durable_rate_per_s),
                         CheckPositive("memory_cost_s", in.memory_cost_s),
                         CheckNonNegative("durable_cost_s", in.durable_cost_s),
                         CheckNonNegative("persist_s", in.persist_s), CheckNonNegative("replicate_s", in.replicate_s),
                         CheckNonNegative("memory_restart_s", in.memory_restart_s),
                         CheckNonNegative("durable_restart_s", in.durable_restart_s),
                         CheckNonNegative("step_s", in.step_s), CheckNonNegative("min_interval_s", in.min_interval_s),
                         CheckNonNegative("max_interval_s", in.max_interval_s)}) {
    if (!s.ok()) return s;
  }
  if (!(in.memory_rate_per_s + in.durable_rate_per_s > 0)) {
    return absl::InvalidArgumentError("memory_rate_per_s and durable_rate_per_s are both 0: no failure to plan for");
  }
  if (in.max_durable_every < 1) return absl::InvalidArgumentError("max_durable_every must be at least 1, got 0");
  if (in.fixed_durable_every > in.max_durable_every) {
    return absl::InvalidArgumentError(absl::StrCat("fixed_durable_every ", in.fixed_durable_every,
                                                   " exceeds max_durable_every ", in.max_durable_every));
  }
  if (in.min_interval_s > 0 && in.max_interval_s > 0 && in.min_interval_s > in.max_interval_s) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_interval_s ", in.min_interval_s, " exceeds max_interval_s ", in.max_interval_s));
  }
  return absl::OkStatus();
}

// (δm + δd/k)(λ1 + kλ2): the square of the optimal waste's k-dependent part.
double KObjective(double k, const TwoLevelInputs& in) {
  return (in.memory_cost_s + in.durable_cost_s / k) * (in.memory_rate_per_s + k * in.durable_rate_per_s);
}

double StepsFor(double seconds, double step_s) {
  return std::max(1.0, std::round(std::min(seconds / step_s, kMaxSteps)));
}

// The smallest whole number of steps not under `floor_s` (the tolerance keeps
// an exact multiple from rounding up).
double StepsAtLeast(double floor_s, double step_s) {
  return std::min(kMaxSteps, std::ceil(floor_s / step_s - 1e-9));
}

}  // namespace

const char* FailureClassName(FailureClass c) {
  switch (c) {
    case FailureClass::kProcess:
      return "process";
    case FailureClass::kNode:
      return "node";
    case FailureClass::kWide:
      return "wide";
  }
  return "unknown";
}

double FailureMix::of(FailureClass c) const {
  switch (c) {
    case FailureClass::kProcess:
      return process;
    case FailureClass::kNode:
      return node;
    case FailureClass::kWide:
      return wide;
  }
  return kNaN;
}

absl::Status ValidateFailureMix(const FailureMix& mix) {
  for (int c = 0; c < kFailureClasses; ++c) {
    const double f = mix.of(static_cast<FailureClass>(c));
    if (!PositiveFinite(f)) {
      return absl::InvalidArgumentError(absl::StrCat("the failure mix's ", FailureClassName(static_cast<FailureClass>(c)),
                                                     " fraction must be positive and finite, got ", f));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<FailureMix> ParseFailureMix(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  if (parts.size() != kFailureClasses) {
    return absl::InvalidArgumentError(
        absl::StrCat("a failure mix is three fractions, process,node,wide (e.g. 0.75,0.2,0.05), got '", text, "'"));
  }
  double v[kFailureClasses];
  for (int c = 0; c < kFailureClasses; ++c) {
    if (!absl::SimpleAtod(parts[c], &v[c])) {
      return absl::InvalidArgumentError(absl::StrCat("the failure mix's ", FailureClassName(static_cast<FailureClass>(c)),
                                                     " fraction '", parts[c], "' is not a number"));
    }
  }
  FailureMix mix{v[0], v[1], v[2]};
  if (absl::Status s = ValidateFailureMix(mix); !s.ok()) return s;
  return mix;
}

std::array<FailureRateEstimate, kFailureClasses> EstimateRatesByClass(
    const FailurePrior& prior, const FailureMix& mix, const std::array<int64_t, kFailureClasses>& failures,
    double exposure_gpu_hours, double credible) {
  std::array<FailureRateEstimate, kFailureClasses> out;
  const bool mix_ok = ValidateFailureMix(mix).ok();
  const double total = mix.process + mix.node + mix.wide;
  for (int c = 0; c < kFailureClasses; ++c) {
    const double f = mix_ok ? mix.of(static_cast<FailureClass>(c)) / total : kNaN;
    const FailurePrior share{prior.mean_per_gpu_hour * f, prior.shape * f};
    out[c] = EstimateFailureRate(share, failures[c], exposure_gpu_hours, credible);
  }
  return out;
}

double TwoLevelWaste(double tau_s, double k, const TwoLevelInputs& in) {
  if (!PositiveFinite(tau_s) || !(k >= 1) || !std::isfinite(k) || !ValidateTwoLevel(in).ok()) return kNaN;
  return (in.memory_cost_s + in.durable_cost_s / k) / tau_s +
         in.memory_rate_per_s * (tau_s / 2 + in.memory_restart_s) +
         in.durable_rate_per_s * (k * tau_s / 2 + in.durable_restart_s);
}

absl::StatusOr<TwoLevelDecision> DecideTwoLevel(const TwoLevelInputs& in) {
  if (absl::Status s = ValidateTwoLevel(in); !s.ok()) return s;
  TwoLevelDecision d;
  const double k_max = static_cast<double>(in.max_durable_every);
  // 1. k.
  double k = 1;
  const bool fixed = in.fixed_durable_every > 0;
  if (fixed) {
    k = static_cast<double>(in.fixed_durable_every);
    d.durable_every_optimum =
        in.durable_rate_per_s == 0
            ? kInf
            : std::max(1.0, std::sqrt(in.durable_cost_s * in.memory_rate_per_s /
                                      (in.memory_cost_s * in.durable_rate_per_s)));
    d.reason = "durable every k set by the operator";
  } else if (in.memory_rate_per_s == 0 || in.durable_cost_s == 0) {
    d.durable_every_optimum = 1;
    d.reason = in.memory_rate_per_s == 0 ? "every checkpoint durable: no failure that memory recovers from"
                                         : "every checkpoint durable: a persist costs training nothing measurable";
  } else {
    d.durable_every_optimum =
        in.durable_rate_per_s == 0
            ? kInf
            : std::sqrt(in.durable_cost_s * in.memory_rate_per_s / (in.memory_cost_s * in.durable_rate_per_s));
    const double lo = std::clamp(std::floor(d.durable_every_optimum), 1.0, k_max);
    const double hi = std::clamp(std::ceil(d.durable_every_optimum), 1.0, k_max);
    k = KObjective(hi, in) < KObjective(lo, in) ? hi : lo;
    d.reason = "two-level Daly optimum";
  }
  // 2. τ.
  const double effective_cost = in.memory_cost_s + in.durable_cost_s / k;
  const double effective_mtbf = 1 / (in.memory_rate_per_s + k * in.durable_rate_per_s);
  d.daly_s = DalyOptimum(effective_cost, effective_mtbf);
  double tau = d.daly_s;
  // 3. Floors of τ.
  if (in.min_interval_s > 0 && tau < in.min_interval_s) {
    tau = in.min_interval_s;
    d.reason = "memory interval raised to the operator minimum";
  }
  if (in.replicate_s > 0 && tau < in.replicate_s) {
    tau = in.replicate_s;
    d.reason = "memory interval raised to the replication time Q";
  }
  // 4. The operator's ceiling on the durable interval.
  bool clamped_to_max = false;
  if (in.max_interval_s > 0 && k * tau > in.max_interval_s) {
    clamped_to_max = true;
    if (fixed) {
      tau = in.max_interval_s / k;
      d.reason = "memory interval lowered so that k·τ keeps to the operator maximum";
    } else if (tau > in.max_interval_s) {
      tau = in.max_interval_s;
      k = 1;
      d.reason = "clamped to the operator maximum, every checkpoint durable";
    } else {
      k = std::max(1.0, std::floor(in.max_interval_s / tau));
      d.reason = "durable every k lowered to the operator maximum";
    }
  }
  // 5. A persist must finish before the next durable checkpoint.
  const char* p_note = clamped_to_max ? " (the operator maximum is below P)" : "";
  if (in.persist_s > 0 && k * tau < in.persist_s) {
    if (fixed) {
      tau = in.persist_s / k;
      d.reason = absl::StrCat("memory interval raised so that k·τ keeps to the persist time P", p_note);
    } else {
      k = std::ceil(in.persist_s / tau - 1e-9);
      if (k > k_max) {
        k = k_max;
        tau = in.persist_s / k;
      }
      d.reason = absl::StrCat("durable every k raised to the persist time P", p_note);
    }
  }
  // 6. Steps.
  if (in.step_s > 0) {
    double m = StepsFor(tau, in.step_s);
    if (in.replicate_s > 0 && m * in.step_s < in.replicate_s) m = StepsAtLeast(in.replicate_s, in.step_s);
    if (in.persist_s > 0 && k * m * in.step_s < in.persist_s) {
      if (fixed) {
        m = std::ceil(StepsAtLeast(in.persist_s, in.step_s) / k);
      } else {
        k = std::ceil(StepsAtLeast(in.persist_s, in.step_s) / m);
        d.reason = absl::StrCat("durable every k raised to the persist time P", p_note);
      }
    }
    d.memory_steps = static_cast<uint64_t>(m);
    d.durable_steps = static_cast<uint64_t>(std::min(kMaxSteps, k * m));
  }
  d.durable_every = static_cast<uint64_t>(k);
  d.memory_interval_s = tau;
  d.durable_interval_s = k * tau;
  d.expected_waste = TwoLevelWaste(tau, k, in);
  IntervalInputs single;
  single.mtbf_s = 1 / (in.memory_rate_per_s + in.durable_rate_per_s);
  single.delta_s = in.memory_cost_s + in.durable_cost_s;
  single.persist_s = in.persist_s;
  single.min_interval_s = in.min_interval_s;
  single.max_interval_s = in.max_interval_s;
  if (absl::StatusOr<IntervalDecision> one = DecideInterval(single); one.ok()) {
    d.single_interval_s = one->interval_s;
    d.single_waste = TwoLevelWaste(one->interval_s, 1, in);
  }
  return d;
}

bool ShouldChangeTwoLevel(uint64_t current_memory_steps, uint64_t current_durable_every, const TwoLevelDecision& next,
                          const TwoLevelInputs& in, double relative, double min_waste_gain) {
  if (next.memory_steps == 0 || !PositiveFinite(in.step_s)) return false;
  if (current_memory_steps == 0) return true;
  const uint64_t cur_k = std::max<uint64_t>(1, current_durable_every);
  if (current_memory_steps == next.memory_steps && cur_k == next.durable_every) return false;
  const double cur_tau = static_cast<double>(current_memory_steps) * in.step_s;
  const double cur_durable = cur_tau * static_cast<double>(cur_k);
  const double half_step = 0.5 * in.step_s;
  const bool breaks_rule = (in.replicate_s > 0 && cur_tau < in.replicate_s) ||
                           (in.min_interval_s > 0 && cur_tau < in.min_interval_s - half_step) ||
                           (in.persist_s > 0 && cur_durable < in.persist_s) ||
                           (in.max_interval_s > 0 && cur_durable > in.max_interval_s + half_step);
  if (breaks_rule) return true;
  const double next_tau = static_cast<double>(next.memory_steps) * in.step_s;
  const double next_durable = static_cast<double>(next.durable_steps) * in.step_s;
  const double change = std::max(std::fabs(next_tau - cur_tau) / cur_tau,
                                 std::fabs(next_durable - cur_durable) / cur_durable);
  if (!(change > relative)) return false;
  const double gain = TwoLevelWaste(cur_tau, static_cast<double>(cur_k), in) -
                      TwoLevelWaste(next_tau, static_cast<double>(next.durable_every), in);
  return gain >= min_waste_gain;
}

}  // namespace ckptd::policy
