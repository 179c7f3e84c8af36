// The coordinator's Prometheus metrics: observations of the core's decisions
// (shard timings, commit latency, failures) and, at every scrape, gauges and
// per-job totals read from CoordinatorCore::ClusterStatus().
//
//   ckptd_agents / ckptd_agents_alive                  gauges
//   ckptd_job_state{job,state}                         1 for the job's state, 0 for the others
//   ckptd_job_world_size{job}, ckptd_job_ranks_alive{job}
//   ckptd_job_snapshots_skipped{job}                   skipped for want of a slot, by the live ranks
//   ckptd_job_step{job,which="fastest"|"slowest"}      step reached by the ranks
//   ckptd_job_newest_committed_step{job}               only for jobs with a committed step
//   ckptd_job_checkpoint_interval_steps{job}           the schedule's every_steps
//   ckptd_job_durable_every{job}                       the schedule's durable_every (at least 1)
//   ckptd_job_newest_memory_checkpoint_step{job}       newest complete memory checkpoint
//   ckptd_checkpoints_committed_total{job}             from the job's record (kept across restarts)
//   ckptd_checkpoints_aborted_total{job}               likewise
//   ckptd_job_last_commit_timestamp_seconds{job}       Unix time of the job's newest commit (MANIFEST written)
//   ckptd_checkpoint_bytes_committed_total{job}        shard bytes of the steps this coordinator committed
//   ckptd_build_info{component="coordinator",version}  1
//   ckptd_snapshot_stall_seconds{job}                  histogram, from each ShardReport
//   ckptd_shard_persist_seconds{job}                   histogram, from each ShardReport
//   ckptd_commit_latency_seconds{job}                  histogram, last shard report -> manifest
//   ckptd_failures_total{kind}                         counter, kind in lower case ("node_lost")
//   ckptd_replication_partners{node}                   partners an alive agent with a peer address sends to
//   ckptd_peer_copies{job}                             ranks of the newest committed step another agent holds in memory
//   ckptd_coordinator_is_leader                        1 while this coordinator serves (a single one always), 0 standing by
//   ckptd_coordinator_leader_epoch                     the epoch of the leader this replica knows (0 without etcd)
//   ckptd_coordinator_leader_changes_total             changes of leader this replica saw
//   ckptd_etcd_request_seconds{call}                   histogram of calls to etcd, failover to other members included
//   ckptd_etcd_request_errors_total{call,code}         calls to etcd that failed, by gRPC code name
//   ckptd_audit_records_total{outcome}                 audit records made, outcome "granted" or "refused"
//   ckptd_audit_records_suppressed_total               calls refused at authentication left out by the rate limit
//   ckptd_audit_write_errors_total                     audit records that did not reach --audit-log
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/audit_log.h"
#include "coordinator/coordinator_core.h"
#include "metrics/registry.h"

namespace ckptd::coordinator {

class CoordinatorMetrics final : public CoordinatorObserver, public AuditObserver {
 public:
  // Registers the families in `registry`, which must outlive the result.
  static absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> Create(metrics::Registry* registry);

  // Refreshes the gauges and totals from `core` at every scrape while the
  // returned handle lives. Drop the handle before `core` goes away.
  [[nodiscard]] metrics::CollectorHandle Watch(CoordinatorCore* core);

  // CoordinatorObserver. Called by the core (some under its lock): they only
  // update metrics and never call back into the core.
  void OnShardReported(const ckptd::v1::ShardReport& report) override;
  void OnCommitted(const std::string& job, uint64_t step, absl::Duration last_report_to_manifest,
                   uint64_t bytes) override;
  void OnFailure(const ckptd::v1::FailureEvent& event) override;
  void OnFreshStartOverDamaged(const std::string& job, uint64_t newest_damaged) override;

  // Replicated coordinators: whether this replica serves as the leader, and
  // the leader's epoch it knows (`epoch` 0: none). A change of epoch counts
  // one leader change.
  void SetLeadership(bool leading, int64_t epoch);
  // One call to etcd that ended (EtcdOptions::on_call).
  void OnEtcdCall(absl::string_view call, absl::Duration took, const absl::Status& result);

  // AuditObserver (from any thread).
  void OnAuditRecord(bool granted) override;
  void OnAuditSuppressed() override;
  void OnAuditWriteError() override;

 private:
  CoordinatorMetrics(metrics::Registry* registry) : registry_(registry) {}
  // Sets every gauge from one ClusterStatus.
  void Collect(CoordinatorCore* core);

  metrics::Registry* const registry_;
  metrics::GaugeFamily* agents_ = nullptr;
  metrics::GaugeFamily* agents_alive_ = nullptr;
  metrics::GaugeFamily* job_state_ = nullptr;
  metrics::GaugeFamily* world_size_ = nullptr;
  metrics::GaugeFamily* ranks_alive_ = nullptr;
  metrics::GaugeFamily* snapshots_skipped_ = nullptr;
  metrics::GaugeFamily* job_step_ = nullptr;
  metrics::GaugeFamily* newest_committed_ = nullptr;
  metrics::GaugeFamily* interval_steps_ = nullptr;
  metrics::GaugeFamily* durable_every_ = nullptr;
  metrics::GaugeFamily* newest_memory_ = nullptr;
  metrics::GaugeFamily* interval_seconds_ = nullptr;
  metrics::GaugeFamily* expected_waste_ = nullptr;
  metrics::GaugeFamily* mtbf_ = nullptr;
  metrics::GaugeFamily* cost_ = nullptr;
  metrics::GaugeFamily* failure_rate_ = nullptr;
  metrics::CounterFamily* committed_ = nullptr;
  metrics::CounterFamily* aborted_ = nullptr;
  metrics::GaugeFamily* last_commit_ = nullptr;
  metrics::CounterFamily* bytes_committed_ = nullptr;
  metrics::HistogramFamily* stall_ = nullptr;
  metrics::HistogramFamily* persist_ = nullptr;
  metrics::HistogramFamily* commit_latency_ = nullptr;
  metrics::CounterFamily* failures_ = nullptr;
  metrics::GaugeFamily* restore_blocked_ = nullptr;
  metrics::GaugeFamily* restored_ranks_ = nullptr;
  metrics::GaugeFamily* restored_resharded_ = nullptr;
  metrics::GaugeFamily* restored_saved_world_ = nullptr;
  metrics::CounterFamily* fresh_over_damaged_ = nullptr;
  metrics::CounterFamily* persist_failures_ = nullptr;
  metrics::GaugeFamily* replication_partners_ = nullptr;
  metrics::GaugeFamily* peer_copies_ = nullptr;
  metrics::GaugeFamily* is_leader_ = nullptr;
  metrics::GaugeFamily* leader_epoch_ = nullptr;
  metrics::CounterFamily* leader_changes_ = nullptr;
  metrics::HistogramFamily* etcd_seconds_ = nullptr;
  metrics::CounterFamily* etcd_errors_ = nullptr;
  metrics::CounterFamily* audit_records_ = nullptr;
  metrics::CounterFamily* audit_suppressed_ = nullptr;
  metrics::CounterFamily* audit_write_errors_ = nullptr;
  // The newest nonzero epoch SetLeadership was told of.
  std::atomic<int64_t> last_epoch_{0};
  // The nodes and jobs the last scrape set those for, so that a node or
  // job gone since loses its series. Only Collect touches them, and the
  // registry runs collectors one at a time.
  std::set<std::string> partner_nodes_seen_;
  std::set<std::string> peer_copy_jobs_seen_;
};

}  // namespace ckptd::coordinator
