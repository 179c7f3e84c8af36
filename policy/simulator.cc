#include "policy/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace ckptd::policy {

double SimulateWaste(const SimParams& p) {
  const auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  const auto non_negative = [](double v) { return std::isfinite(v) && v >= 0; };
  if (!positive(p.mtbf_s) || !positive(p.tau_s) || !positive(p.work_s) || !non_negative(p.delta_s) ||
      !non_negative(p.restart_s) || (p.tau_s + p.delta_s) / p.mtbf_s > 40 || p.restart_s / p.mtbf_s > 40) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  std::mt19937_64 rng(p.seed);
  std::exponential_distribution<double> next_failure(1.0 / p.mtbf_s);

  // Work as whole segments plus a shorter last one, counted in integers so that
  // no rounding residue turns into an extra checkpoint.
  const double full_segments = std::floor(p.work_s / p.tau_s);
  double tail = p.work_s - full_segments * p.tau_s;
  if (tail <= 1e-9 * p.tau_s) tail = 0;
  auto full_left = static_cast<uint64_t>(full_segments);
  bool tail_left = tail > 0;

  const double period = p.tau_s + p.delta_s;
  double wall = 0;
  double until_failure = next_failure(rng);  // wall time from now to the next failure
  while (full_left > 0 || tail_left) {
    const double need = full_left > 0 ? period : tail + p.delta_s;
    if (until_failure >= need) {
      // As many whole segments as fit before the failure, in one step.
      uint64_t k = 1;
      if (full_left > 0) {
        const double fit = std::floor(until_failure / period);
        k = fit >= static_cast<double>(full_left) ? full_left : std::max<uint64_t>(1, static_cast<uint64_t>(fit));
        full_left -= k;
      } else {
        tail_left = false;
      }
      wall += static_cast<double>(k) * need;
      until_failure -= static_cast<double>(k) * need;
      continue;
    }
    // A failure: the partial segment is lost, then a restart that a further
    // failure starts over.
    wall += until_failure;
    until_failure = next_failure(rng);
    while (until_failure < p.restart_s) {
      wall += until_failure;
      until_failure = next_failure(rng);
    }
    wall += p.restart_s;
    until_failure -= p.restart_s;
  }
  return 1 - p.work_s / wall;
}

}  // namespace ckptd::policy
