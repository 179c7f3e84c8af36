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

// Two cadences (policy/two_level.h): each segment of τ work ends with a
// memory checkpoint costing δm, every k-th also durable, costing δd more.
// Failures are two independent Poisson processes in wall time: one at
// memory_rate rolls back to the last completed checkpoint and restarts in
// R1, one at durable_rate rolls back to the last durable checkpoint (every
// memory copy since is gone) and restarts in R2. A failure during a restart
// starts the restart again, with the R of its own class (a durable-class one
// also rolls back further). The job ends after ceil(work/τ) whole segments.
struct TwoLevelSimParams {
  double memory_rate_per_s = 0;   // λ1
  double durable_rate_per_s = 0;  // λ2
  double memory_cost_s = 0;       // δm
  double durable_cost_s = 0;      // δd
  double memory_restart_s = 0;    // R1
  double durable_restart_s = 0;   // R2
  double tau_s = 0;
  uint64_t durable_every = 1;     // k
  double work_s = 0;
  uint64_t seed = 1;
};

// The fraction of wall time wasted, 1 − (segments·τ) / wall time.
// Deterministic for a seed, with common random numbers across τ and k: each
// failure draws one exponential (its time) and one uniform (its class).
// Cost O(failures · k). NaN unless the rates are non-negative with a positive
// sum, τ and work positive, k ≥ 1, costs and restarts non-negative (all
// finite), and (k·(τ + δm) + δd)·λ and R·λ at most 40 (λ = λ1 + λ2).
double SimulateTwoLevelWaste(const TwoLevelSimParams& params);

}  // namespace ckptd::policy
