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


double SimulateTwoLevelWaste(const TwoLevelSimParams& p) {
  const auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  const auto non_negative = [](double v) { return std::isfinite(v) && v >= 0; };
  const double rate = p.memory_rate_per_s + p.durable_rate_per_s;
  if (!non_negative(p.memory_rate_per_s) || !non_negative(p.durable_rate_per_s) || !positive(rate) ||
      !positive(p.tau_s) || !positive(p.work_s) || p.durable_every < 1 || !non_negative(p.memory_cost_s) ||
      !non_negative(p.durable_cost_s) || !non_negative(p.memory_restart_s) || !non_negative(p.durable_restart_s)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  const auto k = p.durable_every;
  const double segment = p.tau_s + p.memory_cost_s;
  const double cycle = static_cast<double>(k) * segment + p.durable_cost_s;  // k segments, the last durable
  if (cycle * rate > 40 || std::max(p.memory_restart_s, p.durable_restart_s) * rate > 40) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  std::mt19937_64 rng(p.seed);
  std::exponential_distribution<double> next_failure(rate);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const double durable_share = p.durable_rate_per_s / rate;

  const auto total = static_cast<uint64_t>(std::ceil(p.work_s / p.tau_s - 1e-9));
  uint64_t done = 0;        // segments completed and checkpointed
  uint64_t durable_at = 0;  // segments at the last durable checkpoint
  double wall = 0;
  double until_failure = next_failure(rng);
  // A failure strikes now: rolls back and restarts (restarts struck again
  // start over, with the newest failure's class).
  const auto fail = [&] {
    wall += until_failure;
    for (;;) {
      const bool durable_class = uniform(rng) < durable_share;
      if (durable_class) done = durable_at;
      const double restart = durable_class ? p.durable_restart_s : p.memory_restart_s;
      until_failure = next_failure(rng);
      if (until_failure >= restart) {
        wall += restart;
        until_failure -= restart;
        return;
      }
      wall += until_failure;
    }
  };
  while (done < total) {
    // Whole cycles, from a durable checkpoint, in one step.
    if (done % k == 0 && total - done >= k && until_failure >= cycle) {
      const uint64_t cycles =
          std::min<uint64_t>((total - done) / k, static_cast<uint64_t>(std::min(until_failure / cycle, 1e18)));
      done += cycles * k;
      durable_at = done;
      wall += static_cast<double>(cycles) * cycle;
      until_failure -= static_cast<double>(cycles) * cycle;
      continue;
    }
    const bool durable = (done + 1) % k == 0;
    const double need = segment + (durable ? p.durable_cost_s : 0);
    if (until_failure >= need) {
      ++done;
      if (durable) durable_at = done;
      wall += need;
      until_failure -= need;
      continue;
    }
    fail();
  }
  return 1 - static_cast<double>(total) * p.tau_s / wall;
}

}  // namespace ckptd::policy
