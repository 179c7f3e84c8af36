// The coordinator's durable state beside the storage manifests: failure
// history, per-job records (schedule, timings, counters, the restore round)
// quarantined steps, the newest drills and each job's commit intent. Behind an interface so that a replicated store (etcd) can replace the
// embedded SQLite database later; an in-memory one serves the core's tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ckptd/v1/coordinator.pb.h"

namespace ckptd::coordinator {

// Every string in a stored message must be valid UTF-8 (proto3 would refuse
// to read it back); other bytes, quotes and NULs included, are stored as given.
// Methods that write return kInvalidArgument for such a message.
class StateStore {  // thread-safe
 public:
  virtual ~StateStore() = default;

  // Appends `event`. Only the newest `StateStoreOptions::max_events` appended
  // events are kept; older ones are dropped.
  virtual absl::Status AppendEvent(const ckptd::v1::FailureEvent& event) = 0;
  // Events of `job` (empty: every job), newest first by unix_nanos (ties:
  // last appended first), at most `limit`.
  virtual absl::StatusOr<std::vector<ckptd::v1::FailureEvent>> ListEvents(absl::string_view job,
                                                                          size_t limit) = 0;
  // Kept events of `job` (empty: every job) with unix_nanos >= `since`: the
  // sum of CountEventsByKind.
  absl::StatusOr<uint64_t> CountEvents(absl::string_view job, absl::Time since) {
    absl::StatusOr<absl::flat_hash_map<ckptd::v1::FailureKind, uint64_t>> by_kind = CountEventsByKind(job, since);
    if (!by_kind.ok()) return by_kind.status();
    uint64_t total = 0;
    for (const auto& [kind, n] : *by_kind) total += n;
    return total;
  }
  // The same, per kind (kinds without events are absent).
  virtual absl::StatusOr<absl::flat_hash_map<ckptd::v1::FailureKind, uint64_t>> CountEventsByKind(
      absl::string_view job, absl::Time since) = 0;

  // Inserts or replaces the record of `record.job()` (kInvalidArgument when
  // empty).
  virtual absl::Status PutJob(const ckptd::v1::JobRecord& record) = 0;
  // Every job record, ordered by job name (bytewise).
  virtual absl::StatusOr<std::vector<ckptd::v1::JobRecord>> ListJobs() = 0;
  // Forgets `job`: its record and its quarantined steps (storage marks those
  // too). Its events stay until they age out. OK when there is none.
  virtual absl::Status DeleteJob(absl::string_view job) = 0;

  // Records a quarantined step; idempotent per (job, step): the first record
  // of a step is kept. kInvalidArgument when `q.job()` is empty.
  virtual absl::Status PutQuarantine(const ckptd::v1::QuarantinedStep& q) = 0;
  // Quarantined steps of `job` (empty: every job), ordered by (job, step).
  virtual absl::StatusOr<std::vector<ckptd::v1::QuarantinedStep>> ListQuarantined(
      absl::string_view job) = 0;

  // Inserts or replaces the drill `d.id()` (kInvalidArgument for id 0). Only
  // the kMaxStoredDrills highest ids are kept; older ones are dropped.
  virtual absl::Status PutDrill(const ckptd::v1::DrillRecord& d) = 0;
  // The kept drills, by id.
  virtual absl::StatusOr<std::vector<ckptd::v1::DrillRecord>> ListDrills() = 0;

  // Inserts or replaces the commit intent of `c.job()` (one per job;
  // kInvalidArgument when it names no job). DeleteJob removes it.
  virtual absl::Status PutCommitIntent(const ckptd::v1::CommitIntent& c) = 0;
  // Every job's commit intent, ordered by job name (bytewise).
  virtual absl::StatusOr<std::vector<ckptd::v1::CommitIntent>> ListCommitIntents() = 0;
};

// Drills a store keeps (as many as a coordinator's drill book holds).
inline constexpr size_t kMaxStoredDrills = 256;

struct StateStoreOptions {
  // Events kept (at least 1); the oldest appended are dropped beyond it.
  size_t max_events = 100'000;
  // SQLite only: how long a write waits for another connection's lock before
  // failing with kUnavailable.
  absl::Duration busy_timeout = absl::Seconds(5);
};

// In memory, for tests of the coordinator core.
std::unique_ptr<StateStore> NewMemStateStore(const StateStoreOptions& options = {});

// The SQLite database `<state_dir>/coordinator.db` (state_dir and its parents
// are created when missing). Every acknowledged write is durable (WAL,
// synchronous=FULL). Errors name the database path: kDataLoss for a file that
// is not a database or is corrupt, kFailedPrecondition for a database of
// another application or of a newer schema version, kPermissionDenied when
// the directory or file is not writable, kUnavailable when another process
// holds the database locked past `busy_timeout`.
absl::StatusOr<std::unique_ptr<StateStore>> OpenSqliteStateStore(const std::string& state_dir,
                                                                 const StateStoreOptions& options = {});

// The database's file name inside the state directory.
inline constexpr absl::string_view kStateDbFileName = "coordinator.db";
// PRAGMA user_version of the databases this build writes.
inline constexpr int kStateSchemaVersion = 1;

}  // namespace ckptd::coordinator
