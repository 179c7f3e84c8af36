#include "policy/interval_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <utility>

#include "absl/strings/str_cat.h"
#include "policy/checks.h"

namespace ckptd::policy {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

using internal::CheckNonNegative;
using internal::CheckPositive;
using internal::NonNegativeFinite;
using internal::PositiveFinite;

// log Γ(x) for x > 0 by the Lanczos approximation (g = 7, 9 terms; ~1e-15
// relative). Our own rather than std::lgamma, which writes the global
// `signgam` in glibc and so races when two threads estimate at once.
double LogGamma(double x) {
  static constexpr double kCoef[] = {0.99999999999980993,  676.5203681218851,     -1259.1392167224028,
                                     771.32342877765313,   -176.61502916214059,   12.507343278686905,
                                     -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7};
  constexpr double kPi = std::numbers::pi;
  if (x < 0.5) return std::log(kPi / std::sin(kPi * x)) - LogGamma(1 - x);  // reflection
  x -= 1;
  double sum = kCoef[0];
  for (int i = 1; i < 9; ++i) sum += kCoef[i] / (x + i);
  const double t = x + 7.5;
  return 0.5 * std::log(2 * kPi) + (x + 0.5) * std::log(t) - t + std::log(sum);
}

// Enough iterations for either expansion near x ≈ a, where both converge in
// O(sqrt(a)) terms.
int MaxIterations(double a) { return 200 + static_cast<int>(std::min(1e7, 20 * std::sqrt(a))); }

// P(a, x) and Q(a, x) = 1 − P(a, x), each accurate in its own right, so that
// both tails of the distribution keep their relative precision. REQUIRES:
// a > 0, x ≥ 0, both finite.
std::pair<double, double> GammaPQ(double a, double x) {
  if (x == 0) return {0.0, 1.0};
  constexpr double kEps = 1e-16;
  // x^a e^{-x} / Γ(a), the common factor of both expansions.
  const double front = std::exp(a * std::log(x) - x - LogGamma(a));
  const int max_it = MaxIterations(a);
  if (x < a + 1) {
    // Series: P = front · Σ x^k / (a (a+1) ... (a+k)).
    double ap = a;
    double term = 1 / a;
    double sum = term;
    for (int i = 0; i < max_it; ++i) {
      ap += 1;
      term *= x / ap;
      sum += term;
      if (std::fabs(term) < std::fabs(sum) * kEps) break;
    }
    const double p = std::min(1.0, sum * front);
    return {p, 1 - p};
  }
  // Continued fraction for Q, evaluated by the modified Lentz method.
  constexpr double kTiny = 1e-300;
  double b = x + 1 - a;
  double c = 1 / kTiny;
  double d = 1 / b;
  double h = d;
  for (int i = 1; i <= max_it; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = b + an / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < kEps) break;
  }
  const double q = std::min(1.0, front * h);
  return {1 - q, q};
}

// The median of `v` (reordered); NaN when empty.
double MedianOf(std::vector<double>& v) {
  if (v.empty()) return kNaN;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + mid);
  return 0.5 * (lower + upper);
}

absl::Status ValidateInputs(const IntervalInputs& in) {
  for (absl::Status s : {CheckPositive("mtbf_s", in.mtbf_s), CheckPositive("delta_s", in.delta_s),
                         CheckNonNegative("persist_s", in.persist_s), CheckNonNegative("restart_s", in.restart_s),
                         CheckNonNegative("step_s", in.step_s), CheckNonNegative("min_interval_s", in.min_interval_s),
                         CheckNonNegative("max_interval_s", in.max_interval_s),
                         CheckPositive("alternative_s", in.alternative_s)}) {
    if (!s.ok()) return s;
  }
  if (in.min_interval_s > 0 && in.max_interval_s > 0 && in.min_interval_s > in.max_interval_s) {
    return absl::InvalidArgumentError(absl::StrCat("min_interval_s ", in.min_interval_s,
                                                   " exceeds max_interval_s ", in.max_interval_s));
  }
  return absl::OkStatus();
}

}  // namespace

double Median(std::vector<double> values) { return MedianOf(values); }

double DalyOptimum(double delta_s, double mtbf_s) {
  if (!PositiveFinite(delta_s) || !PositiveFinite(mtbf_s)) return kNaN;
  if (delta_s >= 2 * mtbf_s) return mtbf_s;
  const double r = delta_s / (2 * mtbf_s);
  return std::sqrt(2 * delta_s * mtbf_s) * (1 + std::sqrt(r) / 3 + r / 9) - delta_s;
}

double ExpectedWaste(double tau_s, double delta_s, double restart_s, double mtbf_s) {
  if (!PositiveFinite(tau_s) || !PositiveFinite(delta_s) || !NonNegativeFinite(restart_s) ||
      !PositiveFinite(mtbf_s)) {
    return kNaN;
  }
  return delta_s / tau_s + (tau_s / 2 + restart_s) / mtbf_s;
}

absl::Status ValidateFailurePrior(const FailurePrior& prior) {
  if (!PositiveFinite(prior.mean_per_gpu_hour)) {
    return absl::InvalidArgumentError(
        absl::StrCat("failure prior mean must be positive and finite, got ", prior.mean_per_gpu_hour));
  }
  if (!PositiveFinite(prior.shape)) {
    return absl::InvalidArgumentError(absl::StrCat("failure prior shape must be positive and finite, got ",
                                                   prior.shape));
  }
  return absl::OkStatus();
}

FailureRateEstimate EstimateFailureRate(const FailurePrior& prior, int64_t failures, double exposure_gpu_hours,
                                        double credible) {
  FailureRateEstimate e;
  e.failures = static_cast<double>(failures);
  e.exposure_gpu_hours = exposure_gpu_hours;
  e.credible = credible;
  if (!ValidateFailurePrior(prior).ok() || failures < 0 || !NonNegativeFinite(exposure_gpu_hours) ||
      !(credible > 0 && credible < 1)) {
    e.mean = e.lower = e.upper = kNaN;
    return e;
  }
  const double alpha = prior.shape + e.failures;
  const double beta = prior.shape / prior.mean_per_gpu_hour + exposure_gpu_hours;
  const double tail = (1 - credible) / 2;
  e.mean = alpha / beta;
  e.lower = GammaQuantile(alpha, beta, tail);
  e.upper = GammaQuantile(alpha, beta, 1 - tail);
  return e;
}

double JobMtbfSeconds(double lambda_per_gpu_hour, int gpus) {
  if (!PositiveFinite(lambda_per_gpu_hour) || gpus <= 0) return kNaN;
  return 3600.0 / (gpus * lambda_per_gpu_hour);
}

double RegularizedGammaP(double a, double x) {
  if (!PositiveFinite(a) || std::isnan(x) || x < 0) return kNaN;
  if (x == kInf) return 1;
  return GammaPQ(a, x).first;
}

double GammaQuantile(double shape, double rate, double p) {
  if (!PositiveFinite(shape) || !PositiveFinite(rate) || !(p >= 0 && p <= 1)) return kNaN;
  if (p == 0) return 0;
  if (p == 1) return kInf;
  // Solve h(x) = 0 for x (rate 1), with h increasing and keeping its
  // precision in the tail p lies in: ln P(x) − ln p in the lower half (close
  // to linear in ln x there, since P ≈ x^a/Γ(a+1) for small x), and
  // ln(1 − p) − ln Q(x) above (close to linear in x).
  const bool lower_tail = p <= 0.5;
  const double target = lower_tail ? std::log(p) : std::log1p(-p);
  const double log_gamma = LogGamma(shape);
  // Lower tail: start from the series' leading term, which can be far below
  // the mean (1e-200 for shape 0.05, p 1e-10). Upper tail: at the mean.
  double x = shape;
  if (lower_tail) x = std::min(shape, std::exp((target + LogGamma(shape + 1)) / shape));
  if (!(x > 0)) x = std::numeric_limits<double>::min();

  // Safeguarded Newton: keep a bracket [lo, hi] around the root and fall back
  // to bisection (geometric while the bracket spans orders of magnitude)
  // whenever a Newton step would leave it.
  double lo = 0;
  double hi = kInf;
  for (int i = 0; i < 1000; ++i) {
    const auto [pp, qq] = GammaPQ(shape, x);
    const double h = lower_tail ? std::log(pp) - target : target - std::log(qq);
    if (h == 0) break;
    if (h < 0) {
      lo = x;
    } else {
      hi = x;
    }
    // dh/dx = density / P (lower) or density / Q (upper).
    const double density = std::exp((shape - 1) * std::log(x) - x - log_gamma);
    double next = lower_tail ? x * std::exp(-h * pp / (x * density))  // Newton in ln x
                             : x - h * qq / density;
    if (!std::isfinite(next) || next <= lo || next >= hi) {
      if (std::isinf(hi)) {
        next = 2 * x;
      } else if (lo == 0) {
        next = hi / 8;
      } else {
        next = hi > 4 * lo ? std::sqrt(lo * hi) : 0.5 * (lo + hi);
      }
    }
    const bool converged = std::fabs(next - x) <= 1e-14 * x || (std::isfinite(hi) && hi - lo <= 1e-15 * hi);
    x = next;
    if (converged) break;
  }
  return x / rate;
}

RecentWindow::RecentWindow(size_t capacity) : samples_(std::max<size_t>(capacity, 1)) {}

bool RecentWindow::Push(double sample) {
  if (!std::isfinite(sample)) return false;
  samples_[next_] = sample;
  next_ = (next_ + 1) % samples_.size();
  size_ = std::min(size_ + 1, samples_.size());
  return true;
}

std::vector<double> RecentWindow::Contents() const {
  // Order does not matter to the statistics: while not full the samples are
  // the first size_ slots, once full all of them.
  return std::vector<double>(samples_.begin(), samples_.begin() + static_cast<std::ptrdiff_t>(size_));
}

double RecentWindow::Median() const {
  std::vector<double> v = Contents();
  return MedianOf(v);
}

double RecentWindow::Mad() const {
  std::vector<double> v = Contents();
  const double median = MedianOf(v);
  for (double& x : v) x = std::fabs(x - median);
  return MedianOf(v);
}

absl::StatusOr<IntervalDecision> DecideInterval(const IntervalInputs& in) {
  if (absl::Status s = ValidateInputs(in); !s.ok()) return s;
  IntervalDecision d;
  d.daly_s = DalyOptimum(in.delta_s, in.mtbf_s);
  double tau = d.daly_s;
  d.reason = in.delta_s >= 2 * in.mtbf_s ? "Daly optimum (δ ≥ 2M, so τ = M)" : "Daly optimum";
  bool clamped_to_max = false;
  if (in.min_interval_s > 0 && tau < in.min_interval_s) {
    tau = in.min_interval_s;
    d.reason = "raised to operator minimum";
  }
  if (in.max_interval_s > 0 && tau > in.max_interval_s) {
    tau = in.max_interval_s;
    d.reason = "clamped to operator maximum";
    clamped_to_max = true;
  }
  if (in.persist_s > 0 && tau < in.persist_s) {
    tau = in.persist_s;
    d.reason = clamped_to_max ? "raised to persist time P (the operator maximum is below P)"
                              : "raised to persist time P";
  }
  d.interval_s = tau;
  if (in.step_s > 0) {
    // Far beyond any real schedule, and keeps the conversion to uint64 defined.
    constexpr double kMaxSteps = 1e15;
    double steps = std::max(1.0, std::round(std::min(tau / in.step_s, kMaxSteps)));
    // Rounding down must not bring the schedule under P (the tolerance keeps
    // an exact multiple, P/step_s = 10.000000001, from rounding up).
    if (in.persist_s > 0 && steps * in.step_s < in.persist_s) {
      steps = std::min(kMaxSteps, std::ceil(in.persist_s / in.step_s - 1e-9));
    }
    d.interval_steps = static_cast<uint64_t>(steps);
  }
  d.expected_waste = ExpectedWaste(tau, in.delta_s, in.restart_s, in.mtbf_s);
  d.alternative_waste = ExpectedWaste(in.alternative_s, in.delta_s, in.restart_s, in.mtbf_s);
  return d;
}

bool ShouldChangeInterval(uint64_t current_steps, const IntervalDecision& next, const IntervalInputs& in,
                          double relative, double min_waste_gain) {
  if (next.interval_steps == 0) return false;
  if (current_steps == 0) return true;
  if (current_steps == next.interval_steps) return false;
  if (!PositiveFinite(in.step_s)) return false;
  const double cur_s = static_cast<double>(current_steps) * in.step_s;
  const double next_s = static_cast<double>(next.interval_steps) * in.step_s;
  // Hard rules: P exactly (the decision rounds up to it), the operator bounds
  // within half a step (the decision rounds to the nearest step).
  const double half_step = 0.5 * in.step_s;
  const bool breaks_rule = (in.persist_s > 0 && cur_s < in.persist_s) ||
                           (in.min_interval_s > 0 && cur_s < in.min_interval_s - half_step) ||
                           (in.max_interval_s > 0 && cur_s > in.max_interval_s + half_step);
  if (breaks_rule) return true;
  const double change = std::fabs(next_s - cur_s) / cur_s;
  if (!(change > relative)) return false;
  const double gain = ExpectedWaste(cur_s, in.delta_s, in.restart_s, in.mtbf_s) -
                      ExpectedWaste(next_s, in.delta_s, in.restart_s, in.mtbf_s);
  return gain >= min_waste_gain;
}

}  // namespace ckptd::policy
