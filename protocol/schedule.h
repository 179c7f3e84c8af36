// The schedule rule every rank evaluates identically. Header-only, so that
// the client library (which links nothing of the coordinator) uses the very
// same rule as the coordinator.
#pragma once

#include <cstdint>

#include "ckptd/v1/coordinator.pb.h"

namespace ckptd::protocol {

// Whether `step` is start_step + a multiple of every_steps (every_steps > 0).
// Whether `schedule` asks for a snapshot at `step` (ScheduledAt): one of its
// extra or memory steps, or a step of the rule. Step 0, the state before
// training, never is.
inline bool OnRule(const ckptd::v1::Schedule& schedule, uint64_t step) {
  return schedule.every_steps() > 0 && step >= schedule.start_step() &&
         (step - schedule.start_step()) % schedule.every_steps() == 0;
}

inline bool ScheduledAt(const ckptd::v1::Schedule& schedule, uint64_t step) {
  if (step == 0) return false;
  for (uint64_t s : schedule.extra_steps()) {
    if (s == step) return true;
  }
  for (uint64_t s : schedule.memory_steps()) {
    if (s == step) return true;
  }
  return OnRule(schedule, step);
}

// Whether the snapshot `schedule` asks for at `step` is durable (written to
// storage and committed) rather than a memory checkpoint: an extra step, or
// a rule step whose count from start_step plus durable_phase is a multiple
// of durable_every (0 or 1: every one). False where ScheduledAt is not.
inline bool DurableAt(const ckptd::v1::Schedule& schedule, uint64_t step) {
  if (step == 0) return false;
  for (uint64_t s : schedule.extra_steps()) {
    if (s == step) return true;
  }
  for (uint64_t s : schedule.memory_steps()) {
    if (s == step) return false;
  }
  if (!OnRule(schedule, step)) return false;
  const uint64_t k = schedule.durable_every();
  if (k <= 1) return true;
  const uint64_t count = (step - schedule.start_step()) / schedule.every_steps();
  return (count % k + schedule.durable_phase() % k) % k == 0;
}

}  // namespace ckptd::protocol
