// Private parts of CoordinatorCore shared by its coordinator_*.cc files: the
// limits on requests, the agent record, the effects of a decision, and the
// pure functions its decisions are made of. Nothing outside coordinator/
// includes this header.
#pragma once

#include <array>
#include <cstdint>
#include <cstddef>
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
#include "policy/two_level.h"

namespace ckptd::coordinator {

namespace internal {

// Steps are counted by trainers; anything near 2^64 is a corrupt request.
constexpr uint64_t kMaxStep = uint64_t{1} << 62;
constexpr uint64_t kMaxShardBytes = uint64_t{1} << 50;
constexpr size_t kMaxRanksPerAgent = 4096;
// Peer replication: the copies in memory kept per heartbeat (the rest are
// ignored), the partners an agent may ask for, and a peer address's length.
constexpr size_t kMaxMemoryCopies = 4096;
constexpr uint32_t kMaxReplicas = 16;
// A node's replication time (Heartbeat.replicate_seconds) beyond this is no
// measurement.
constexpr double kMaxReplicateSeconds = kMaxReportedSeconds;
constexpr size_t kMaxPeerAddress = 255;
// A registration's address (a host name, as peer_address's host), and its
// GPUs: names such as "cuda:0" or a MIG instance's UUID, a few dozen per
// node. Bounded so that one node cannot make the cluster status exceed what
// one answer carries (gRPC's 4 MiB) nor the coordinator's memory grow.
constexpr size_t kMaxAgentAddress = 255;
constexpr size_t kMaxGpus = 256;
constexpr size_t kMaxGpuName = 128;
// The peers a restore plan names for a rank (nodes that claim to hold it).
constexpr size_t kMaxPlanPeers = 8;

absl::Status ValidateRankInfo(const ckptd::v1::RankInfo& r, uint32_t max_world);
absl::Status ValidateShardReport(const ckptd::v1::ShardReport& r, uint32_t max_world);
// A registration's peer replication fields: the peer address (host:port,
// non-empty host), the failure domain (the rule of node ids), the replicas.
absl::Status ValidateReplication(const ckptd::v1::RegisterAgentRequest& r);

// A rank's step an agent holds in memory, as its heartbeat said: the digest
// of the shard it is a copy of, and whether it is of a rank the agent hosts
// (owner_node is the agent's own node) or a partner's copy.
struct CopyKey {
  std::string job;
  uint32_t rank = 0;
  uint64_t step = 0;
  bool operator<(const CopyKey& o) const {
    return std::tie(job, rank, step) < std::tie(o.job, o.rank, o.step);
  }
  bool operator==(const CopyKey& o) const { return job == o.job && rank == o.rank && step == o.step; }
};
struct HeldCopy {
  uint64_t file_length = 0;
  uint64_t index_xxh3 = 0;
  bool own = false;
  bool operator==(const HeldCopy& o) const {
    return file_length == o.file_length && index_xxh3 == o.index_xxh3 && own == o.own;
  }
};

// What the interval policy makes of a job (coordinator_interval.cc): the
// status to show, and (when every input is known) the decision.
struct IntervalView {
  ckptd::v1::IntervalStatus status;
  std::optional<policy::IntervalInputs> inputs;
  std::optional<policy::IntervalDecision> decision;
  std::optional<policy::TwoLevelInputs> two_level_inputs;
  std::optional<policy::TwoLevelDecision> two_level;
};

// The cluster's failure history: every job's failures over every job's
// GPU time, the exposure the failure rate is estimated from.
struct ClusterExposure {
  uint64_t failures = 0;
  double gpu_seconds = 0;
  std::array<uint64_t, policy::kFailureClasses> by_class = {0, 0, 0};  // Job::FailuresByClass, summed
};

// Where the job's copies in memory are: every node with a rank of it keeps
// its trainers' snapshots (memory_tier), and sends them to a replication
// partner (peer_copies), so that a lost node's ranks come back from memory.
struct MemoryTiers {
  bool memory_tier = false;
  bool peer_copies = false;
  // With peer copies: the slowest of the job's nodes to copy a checkpoint
  // to its partners (0: not measured).
  double replicate_seconds = 0;
};

// The interval policy's view of `job`, from its measurements so far.
IntervalView ViewInterval(const Job& job, const ClusterExposure& cluster, const CoordinatorOptions& options,
                          MemoryTiers tiers = {});

// The one-off targets that keep the current rule's checkpoints when the
// rule changes at `start`: the current targets ahead of `fastest`, and the
// current rule's steps after `fastest` and before `start` (64 at most), so
// that a rank that has not heard of the change yet snapshots the same steps,
// durable ones (`durable`) and memory ones (`memory`) alike.
struct OneOffTargets {
  std::vector<uint64_t> durable;
  std::vector<uint64_t> memory;
};
OneOffTargets TargetsUntilNewRule(const ckptd::v1::Schedule& current, uint64_t fastest, uint64_t start);

// The durable_phase of a new rule (every `every` steps from `start`, one in
// `durable_every` durable) that makes its first durable step the first rule
// step at least durable_every intervals after the newest durable step known
// (committed, pending, or one of `kept`'s durable one-offs): a change of rule
// neither rushes nor delays the durable cadence.
uint64_t DurablePhase(const Job& job, const OneOffTargets& kept, uint64_t every, uint64_t durable_every,
                      uint64_t start);

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
  // What its Peer service checks fetch tickets with (RegisterAgentResponse.fetch_key).
  std::string fetch_key;
  std::vector<std::string> gpus;
  std::vector<ckptd::v1::RankInfo> ranks;
  // RegistrationBytes of the above, counted in the core's registration_bytes_.
  size_t registration_bytes = 0;
  bool ranks_over_logged = false;  // a heartbeat's ranks were left out (max_registration_bytes)
  absl::Time last_heartbeat;
  bool alive = true;
  bool drills_allowed = false;
  uint64_t instance = 0;  // the agent process's (0: an agent that does not say)
  // Where its latest registration came from (RegisterAgent's `from`), and when.
  std::string registered_from;
  absl::Time registered_at;
  // Peer replication, as registered: where its Peer service listens (empty:
  // it takes no part), its failure domain (empty: the node alone), and how
  // many partners it asks for. Its partners now (RecomputePartners): the
  // nodes it sends to, in order, and those that send to it.
  std::string peer_address;
  std::string failure_domain;
  uint32_t replicas = 0;
  bool memory_tier = false;  // it takes memory checkpoints (RegisterAgentRequest.memory_tier)
  // How long its last checkpoint took to reach its partners
  // (Heartbeat.replicate_seconds; 0: not measured).
  double replicate_seconds = 0;
  // Its peer copies, as its last heartbeat said (Heartbeat.replication_*).
  uint64_t replication_sent = 0;
  uint64_t replication_failed = 0;
  std::string replication_error;
  std::vector<std::string> send_to;
  std::vector<std::string> receive_from;
  size_t short_of_partners_logged = SIZE_MAX;  // the partner count last logged as short
  // What its latest heartbeat said it holds in memory (at most
  // kMaxMemoryCopies, of known jobs); forgotten when the node is lost.
  std::map<internal::CopyKey, internal::HeldCopy> memory;
  bool memory_overflow_logged = false;
  bool memory_invalid_logged = false;
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
    bool measured = true;  // false: written by emergency persists (not the policy's measurements)
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
  std::vector<uint64_t> drills;  // ids of drills to save (DrillBook::TakeChanged)
  bool empty() const {
    return events.empty() && records.empty() && quarantines.empty() && commits.empty() && aborts.empty() &&
           aborted_notes.empty() && forgotten_jobs.empty() && blocked.empty() && fresh_over_damaged.empty() &&
           drills.empty();
  }
};

struct CoordinatorCore::CommitResult {
  Effects::CommitTask task;
  absl::Status status;     // of storage's commit
  absl::Duration latency;  // from the last report to the MANIFEST
  bool counted = false;    // set by AfterCommit when the job took the step as committed
};

}  // namespace ckptd::coordinator
