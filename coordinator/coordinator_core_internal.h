// Private parts of CoordinatorCore shared by its coordinator_*.cc files: the
// limits on requests, the agent record, the effects of a decision, and the
// pure functions its decisions are made of. Nothing outside coordinator/
// includes this header.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ckptd/v1/coordinator.pb.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/job.h"
#include "policy/interval_policy.h"

namespace ckptd::coordinator {

namespace internal {

// Steps are counted by trainers; anything near 2^64 is a corrupt request.
constexpr uint64_t kMaxStep = uint64_t{1} << 62;
constexpr uint64_t kMaxShardBytes = uint64_t{1} << 50;
constexpr size_t kMaxRanksPerAgent = 4096;

absl::Status ValidateRankInfo(const ckptd::v1::RankInfo& r, uint32_t max_world);
absl::Status ValidateShardReport(const ckptd::v1::ShardReport& r, uint32_t max_world);

// What the interval policy makes of a job (coordinator_interval.cc): the
// status to show, and (when every input is known) the decision.
struct IntervalView {
  ckptd::v1::IntervalStatus status;
  std::optional<policy::IntervalInputs> inputs;
  std::optional<policy::IntervalDecision> decision;
};

// The cluster's failure history: every job's failures over every job's
// GPU time, the exposure the failure rate is estimated from.
struct ClusterExposure {
  uint64_t failures = 0;
  double gpu_seconds = 0;
};

// The interval policy's view of `job`, from its measurements so far.
IntervalView ViewInterval(const Job& job, const ClusterExposure& cluster, const CoordinatorOptions& options);

// The one-off targets that keep the current rule's checkpoints when the
// rule changes at `start`: the current targets ahead of `fastest`, and the
// current rule's steps after `fastest` and before `start` (64 at most), so
// that a rank that has not heard of the change yet snapshots the same steps.
std::vector<uint64_t> TargetsUntilNewRule(const ckptd::v1::Schedule& current, uint64_t fastest, uint64_t start);

// The committed steps retention drops, newest first: all but the newest
// `keep_last` (at least 1) that are not quarantined. Quarantined steps are
// kept and not counted; a step being verified is kept until its
// verification ends (and dropped by a later commit if still due): storage's
// one retention rule (storage::RetentionDrops) over what the coordinator
// knows. Oldest first.
std::vector<uint64_t> RetentionDrops(const Job& job, int keep_last);

}  // namespace internal

struct CoordinatorCore::Agent {
  std::string node_id;
  std::string address;
  std::string session;  // 32 hex digits (RegisterAgentResponse.session)
  std::vector<std::string> gpus;
  std::vector<ckptd::v1::RankInfo> ranks;
  absl::Time last_heartbeat;
  bool alive = true;
  bool drills_allowed = false;
  uint64_t instance = 0;  // the agent process's (0: an agent that does not say)
};

struct CoordinatorCore::Effects {
  struct CommitTask {
    std::string job;
    uint64_t step = 0;
    uint32_t world_size = 0;
    std::vector<ckptd::v1::ShardRef> shards;
    absl::Time last_report;
    double stall = 0;  // the slowest rank's
    double persist = 0;
  };
  std::vector<ckptd::v1::FailureEvent> events;
  std::vector<ckptd::v1::JobRecord> records;
  std::vector<ckptd::v1::QuarantinedStep> quarantines;
  std::vector<CommitTask> commits;
  std::vector<std::pair<std::string, uint64_t>> aborts;  // remove an uncommitted step's files
  std::vector<std::string> forgotten_jobs;                 // delete from the state database
  std::vector<std::pair<std::string, std::string>> blocked;        // job, why its restart is held back
  std::vector<std::pair<std::string, uint64_t>> fresh_over_damaged;  // job, its newest damaged step
  std::vector<std::tuple<std::string, uint64_t, std::string>> aborted_notes;
  bool empty() const {
    return events.empty() && records.empty() && quarantines.empty() && commits.empty() && aborts.empty() &&
           aborted_notes.empty() && forgotten_jobs.empty() && blocked.empty() && fresh_over_damaged.empty();
  }
};

struct CoordinatorCore::CommitResult {
  Effects::CommitTask task;
  absl::Status status;     // of storage's commit
  absl::Duration latency;  // from the last report to the MANIFEST
  bool counted = false;    // set by AfterCommit when the job took the step as committed
};

}  // namespace ckptd::coordinator
