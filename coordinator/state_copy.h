// Moving a coordinator's durable state from one StateStore to another:
// `ckptd-coordinator --etcd-endpoints ... --import-state DIR` reads a single
// coordinator's SQLite database and writes it into etcd, so that a cluster
// going from one coordinator to replicated ones keeps its jobs' records,
// quarantined steps and failure history (the MTBF the interval comes from).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/v1/coordinator.pb.h"
#include "coordinator/state_store.h"

namespace ckptd::coordinator {

// Everything a StateStore holds.
struct StateSnapshot {
  std::vector<ckptd::v1::JobRecord> jobs;
  std::vector<ckptd::v1::QuarantinedStep> quarantined;
  std::vector<ckptd::v1::FailureEvent> events;  // oldest first, at most ReadState's max_events
};

// Reads `from` whole, keeping its newest `max_events` events.
absl::StatusOr<StateSnapshot> ReadState(StateStore& from, size_t max_events);

// True when `store` holds no job, no quarantined step and no event.
absl::StatusOr<bool> StateIsEmpty(StateStore& store);

// Writes `state` into `to`: the events in their order, then the quarantined
// steps, then the job records. Stops at the first write that fails, naming
// what it was writing; what was written stays (each write is idempotent
// except events, so retry into an empty store only).
absl::Status WriteState(const StateSnapshot& state, StateStore& to);

// "3 jobs, 2 quarantined steps, 41 failure events".
std::string DescribeState(const StateSnapshot& state);

}  // namespace ckptd::coordinator
