// A Monte Carlo model of a job that checkpoints every τ of work under
// exponentially distributed failures: the check that Daly's optimum, and the
// waste formula the policy reports, hold (policy/simulator_test.cc).
#pragma once

#include <cstdint>

namespace ckptd::policy {

struct SimParams {
  double mtbf_s = 0;     // M: failures are a Poisson process in wall time
  double delta_s = 0;    // δ: each checkpoint costs δ after τ of work
  double restart_s = 0;  // R: after each failure, before work resumes
  double tau_s = 0;      // τ: work between checkpoints
  double work_s = 0;     // useful work to complete
  uint64_t seed = 1;
};

// Runs the job until `work_s` of work is done and returns the fraction of wall
// time wasted, 1 − work_s / wall time. Failures strike during work, checkpoints
// and restarts alike; one loses everything since the last completed checkpoint
// (a failure during a restart starts the restart again). Every segment,
// including a final shorter one, ends with a checkpoint. Deterministic for a
// seed, and the failure times depend on the seed only (one exponential draw per
// failure, never per segment), so sweeps over τ with one seed share their
// failures: common random numbers, which cancel most noise between τ values.
// Cost is O(number of failures), not of segments.
// NaN unless M, τ, work are positive and δ, R non-negative (all finite), and
// (τ + δ)/M and R/M are at most 40 (beyond that the job would need more than
// e^40 attempts per segment).
double SimulateWaste(const SimParams& params);

}  // namespace ckptd::policy
