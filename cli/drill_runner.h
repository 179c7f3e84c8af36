// The engine of `ckptctl drill`: orders a failure drill through the
// coordinator (CoordinatorApi), watches what follows and judges it against
// what ckptd promises, giving the DrillOutcome that cli/drill_report.h
// renders. Internal to ckptd::cli.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckptd/v1/coordinator.pb.h"
#include "cli/operator_commands.h"

namespace ckptd::cli {

struct DrillScenarioInfo {
  const char* name;  // as `drill run --scenario` takes it
  ckptd::v1::DrillScenario scenario;
  bool timed;       // lasts --duration
  bool node_level;  // may target a node
};
// Every scenario, in the order kDrillHelp lists them.
inline constexpr DrillScenarioInfo kDrillScenarios[] = {
    {"kill-trainer", ckptd::v1::KILL_TRAINER, false, false},
    {"hang-trainer", ckptd::v1::HANG_TRAINER, true, false},
    {"kill-agent", ckptd::v1::KILL_AGENT, false, true},
    {"kill-node", ckptd::v1::KILL_NODE, false, true},
    {"cut-off-agent", ckptd::v1::CUT_OFF_AGENT, true, true},
    {"corrupt-shard", ckptd::v1::CORRUPT_SHARD, false, false},
    {"corrupt-memory", ckptd::v1::CORRUPT_MEMORY, false, false},
    {"storage-eio", ckptd::v1::STORAGE_EIO, true, true},
    {"storage-enospc", ckptd::v1::STORAGE_ENOSPC, true, true},
    {"storage-slow", ckptd::v1::STORAGE_SLOW, true, true},
    {"kill-coordinator", ckptd::v1::KILL_COORDINATOR, false, false},
};
// The entry of `s`; null for one this ckptctl does not know.
const DrillScenarioInfo* FindDrillScenario(ckptd::v1::DrillScenario s);

// One drill to run: the request (without the job) and how long to watch.
struct DrillSpec {
  const DrillScenarioInfo* info = nullptr;
  ckptd::v1::RunDrillRequest request;
  std::string target;  // as given: a rank or a node; empty: the default rank 0
  absl::Duration watch;
};

// One expectation of a drill and whether it held.
struct DrillVerdict {
  std::string expectation;
  bool held = false;
  std::string detail;
};

// Everything a drill's report shows.
struct DrillOutcome {
  std::string scenario;  // "kill-trainer", ...
  std::string job;
  std::string target;             // as given: a rank or a node; empty: the default rank 0
  ckptd::v1::DrillStatus status;  // the coordinator's view when the drill ended
  bool injected = false;
  // corrupt-shard: the verification of the damaged step, and when it ended.
  std::optional<ckptd::v1::VerifyProgress> damaged_verified;
  int64_t damaged_verified_unix_nanos = 0;
  // After a restart: the verification of the step restored, when it ended,
  // or why it could not be verified.
  std::optional<ckptd::v1::VerifyProgress> restored_verified;
  int64_t restored_verified_unix_nanos = 0;
  std::string restored_unverified_reason;   // not verified, and not a failure
  std::string restored_verify_error;        // the verification itself failed
  std::vector<ckptd::v1::StepEntry> steps;  // the job's steps when it ended
  int64_t ended_unix_nanos = 0;             // when the drill stopped watching
  std::vector<DrillVerdict> verdicts;
  uint64_t lost_steps = 0;
  double lost_seconds = 0;
  double restart_seconds = 0;
  // kill-coordinator: from the kill to a new leader answering, and to the
  // job's next global commit; the new leader's address.
  std::optional<double> failover_seconds;
  std::optional<double> next_commit_seconds;
  std::string new_leader;

  // Every expectation held (and there was one).
  bool passed() const;
  // From the injection to the first failure recorded; absent when either is
  // unknown.
  std::optional<double> detection_seconds() const;
};

// How many of `drills` passed.
size_t PassedCount(const std::vector<DrillOutcome>& drills);

// A call to the coordinator failed: which one, and how.
struct RpcError {
  std::string rpc;
  absl::Status status;
};

// Runs drills against one job and judges them.
class DrillRunner {
 public:
  // `progress`: where to say what happens while a drill runs; null: nowhere
  // (--json).
  DrillRunner(CoordinatorApi& api, std::string job, const OperatorEnv& env, bool verify_restored,
              std::ostream* progress)
      : api_(api), job_(std::move(job)), env_(env), verify_restored_(verify_restored), progress_(progress) {}

  // Orders the drill, watches what follows and judges it. An RpcError when
  // the coordinator could not be asked (a drill the agent refused is an
  // outcome whose first expectation failed).
  absl::StatusOr<DrillOutcome> Run(const DrillSpec& spec, RpcError* error);

  // Waits until the job runs with every rank alive and, when
  // `committed_after` is not 0, a step committed after it. An error saying
  // what was missing when `settle` passes first.
  absl::Status Settle(int64_t committed_after, absl::Duration settle, RpcError* error);

 private:
  absl::Status Refresh(uint64_t drill_id, ckptd::v1::DrillStatus* st, RpcError* error);
  // kill-coordinator: the leader kills itself; the drill follows the replica
  // that takes over (no agent reports on it).
  absl::StatusOr<DrillOutcome> RunKillCoordinator(const DrillSpec& spec, RpcError* error);
  // The newest step committed after `nanos`, if any.
  std::optional<uint64_t> CommittedAfter(int64_t nanos);
  void Judge(const DrillSpec& spec, const ckptd::v1::RestorePreview& preview, DrillOutcome* d) const;

  CoordinatorApi& api_;
  const std::string job_;
  const OperatorEnv& env_;
  const bool verify_restored_;
  std::ostream* const progress_;
};

}  // namespace ckptd::cli
