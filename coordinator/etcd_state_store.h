// The coordinator's state in etcd, for replicated coordinators: the same
// StateStore contract as the SQLite database, every write a transaction
// guarded by the writer's leadership (etcd/leader_election.h), so that a
// coordinator that lost its lease (paused, cut off) cannot write.
//
// Keys, under <prefix>/state/ (job names %-escaped outside [A-Za-z0-9._-]):
//   jobs/<job>                          JobRecord
//   quarantine/<job>/<step, 20 digits>  QuarantinedStep
//   events/<job>/<time, 20 digits>/<16 hex digits>   FailureEvent
//   drills/<id, 20 digits>              DrillRecord (the newest 256)
//   committing/<job>                    CommitIntent (the step being committed)
// (docs/operations.md: sizes and write rates).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/state_store.h"
#include "etcd/etcd_client.h"
#include "etcd/leader_election.h"

namespace ckptd::coordinator {

struct EtcdStateStoreOptions {
  // The cluster's prefix (e.g. /ckptd/<cluster>); the state is under
  // <prefix>/state/.
  std::string prefix;
  // Events kept (at least 1): the oldest appended are deleted beyond it.
  size_t max_events = 10'000;
  // After this many writes, etcd's history is compacted up to the revision
  // of the previous compaction point (0: never; etcd's own
  // --auto-compaction-retention may do it instead).
  uint64_t compact_every_writes = 1000;
};

// A store over `etcd` whose writes are guarded by `election`'s leadership:
// a write while this replica does not lead, or refused by etcd because
// another leads now, is kFailedPrecondition (and `election` steps down).
// Both must outlive the store. Reads what the store needs to know (the
// events' order) from etcd: kUnavailable when etcd does not answer.
absl::StatusOr<std::unique_ptr<StateStore>> OpenEtcdStateStore(etcd::EtcdClient* etcd,
                                                               etcd::LeaderElection* election,
                                                               const EtcdStateStoreOptions& options);

// How a job name appears in keys: bytes outside [A-Za-z0-9._-] as %XX.
std::string EtcdKeyName(absl::string_view job);

}  // namespace ckptd::coordinator
