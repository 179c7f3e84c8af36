// The schedule rule every rank evaluates identically. Header-only, so that
// the client library (which links nothing of the coordinator) uses the very
// same rule as the coordinator.
#pragma once

#include <cstdint>

#include "ckptd/v1/coordinator.pb.h"

namespace ckptd::rpc {

// Whether `schedule` asks for a snapshot at `step`: one of its extra steps,
// or start_step + a multiple of every_steps (every_steps > 0). Step 0, the
// state before training, never is.
inline bool ScheduledAt(const ckptd::v1::Schedule& schedule, uint64_t step) {
  if (step == 0) return false;
  for (uint64_t s : schedule.extra_steps()) {
    if (s == step) return true;
  }
  return schedule.every_steps() > 0 && step >= schedule.start_step() &&
         (step - schedule.start_step()) % schedule.every_steps() == 0;
}

}  // namespace ckptd::rpc
