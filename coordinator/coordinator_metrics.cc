#include "coordinator/coordinator_metrics.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "base/status_macros.h"
#include "metrics/build_info.h"
#include "protocol/restore_source.h"

namespace ckptd::coordinator {
namespace {

std::string KindLabel(ckptd::v1::FailureKind kind) {
  return absl::AsciiStrToLower(ckptd::v1::FailureKind_Name(kind));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> CoordinatorMetrics::Create(metrics::Registry* registry) {
  std::unique_ptr<CoordinatorMetrics> m(new CoordinatorMetrics(registry));
  metrics::Registry& r = *registry;
  CKPTD_ASSIGN_OR_RETURN(m->agents_, r.AddGauge("ckptd_agents", "Agents the coordinator knows of."));
  CKPTD_ASSIGN_OR_RETURN(m->agents_alive_,
                         r.AddGauge("ckptd_agents_alive", "Agents whose heartbeats are arriving."));
  CKPTD_ASSIGN_OR_RETURN(
      m->job_state_, r.AddGauge("ckptd_job_state", "1 for the state the job is in, 0 for the others.", {"job", "state"}));
  CKPTD_ASSIGN_OR_RETURN(m->world_size_, r.AddGauge("ckptd_job_world_size", "Ranks in the job's world.", {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->ranks_alive_,
                         r.AddGauge("ckptd_job_ranks_alive", "Ranks of the job hosted by live agents.", {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->snapshots_skipped_,
                         r.AddGauge("ckptd_job_snapshots_skipped",
                                    "Snapshots the job's live ranks skipped for want of a free staging slot, each "
                                    "since it registered.",
                                    {"job"}));
  CKPTD_ASSIGN_OR_RETURN(
      m->job_step_, r.AddGauge("ckptd_job_step", "Training step reached by the job's fastest and slowest live rank.",
                               {"job", "which"}));
  CKPTD_ASSIGN_OR_RETURN(m->newest_committed_,
                         r.AddGauge("ckptd_job_newest_committed_step",
                                    "Newest committed step a restore would use.", {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->interval_steps_,
                         r.AddGauge("ckptd_job_checkpoint_interval_steps",
                                    "Steps between scheduled checkpoints (the schedule's every_steps).", {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->durable_every_,
                         r.AddGauge("ckptd_job_durable_every",
                                    "Every how many scheduled checkpoints one is durable; the others are memory "
                                    "checkpoints (1: every checkpoint durable).",
                                    {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->newest_memory_,
                         r.AddGauge("ckptd_job_newest_memory_checkpoint_step",
                                    "Newest memory checkpoint every rank reported, newer than every durable step.",
                                    {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->interval_seconds_,
                         r.AddGauge("ckptd_job_checkpoint_interval_seconds",
                                    "The interval policy's choice: compute time between checkpoints.", {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->expected_waste_,
                         r.AddGauge("ckptd_job_expected_waste_ratio",
                                    "Expected fraction of time lost to checkpoints and failures, at the chosen "
                                    "interval and at the alternative one.",
                                    {"job", "interval"}));
  CKPTD_ASSIGN_OR_RETURN(m->mtbf_,
                         r.AddGauge("ckptd_job_mtbf_seconds", "Estimated mean time between failures of the job.",
                                    {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->cost_, r.AddGauge("ckptd_job_checkpoint_cost_seconds",
                                              "Measured cost of a checkpoint: stall plus slowdown while persisting.",
                                              {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->failure_rate_,
                         r.AddGauge("ckptd_failure_rate_per_gpu_hour",
                                    "Estimated failure rate per GPU-hour: posterior mean and 90% credible bounds.",
                                    {"bound"}));
  CKPTD_ASSIGN_OR_RETURN(m->committed_, r.AddCounter("ckptd_checkpoints_committed_total",
                                                     "Global checkpoints committed (manifest written).", {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->aborted_,
                         r.AddCounter("ckptd_checkpoints_aborted_total", "Global checkpoints aborted.", {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->last_commit_,
                         r.AddGauge("ckptd_job_last_commit_timestamp_seconds",
                                    "Unix time of the job's newest commit (its MANIFEST written).", {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->bytes_committed_,
                         r.AddCounter("ckptd_checkpoint_bytes_committed_total",
                                      "Bytes of the shard files of the steps this coordinator committed.", {"job"}));
  CKPTD_RETURN_IF_ERROR(metrics::AddBuildInfo(r, "coordinator"));
  CKPTD_ASSIGN_OR_RETURN(
      m->stall_, r.AddHistogram("ckptd_snapshot_stall_seconds",
                                "Time a trainer rank waited to take a snapshot, per reported shard.",
                                {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
                                {"job"}));
  CKPTD_ASSIGN_OR_RETURN(
      m->persist_, r.AddHistogram("ckptd_shard_persist_seconds", "Time an agent took to make a shard durable.",
                                  {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}, {"job"}));
  CKPTD_ASSIGN_OR_RETURN(
      m->commit_latency_,
      r.AddHistogram("ckptd_commit_latency_seconds",
                     "Time from a step's last shard report to its manifest being durable.",
                     {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}, {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->failures_,
                         r.AddCounter("ckptd_failures_total", "Failures detected, by kind.", {"kind"}));
  CKPTD_ASSIGN_OR_RETURN(m->restore_blocked_,
                         r.AddGauge("ckptd_job_restore_blocked",
                                    "1 while a restart of the job is held back: it has committed steps but none "
                                    "intact, and a fresh start waits for the operator (ckptctl start-fresh).",
                                    {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->restored_ranks_,
                         r.AddGauge("ckptd_restored_ranks",
                                    "Ranks of the job's last restore by where they read it: memory (their agent's), "
                                    "peer (another node's agent), node-local (the node's disk tier), storage-root.",
                                    {"job", "source"}));
  CKPTD_ASSIGN_OR_RETURN(m->restored_resharded_,
                         r.AddGauge("ckptd_restored_ranks_resharded",
                                    "Ranks of the job's last restore that read it resharded: the step was saved by "
                                    "another number of ranks (ckptd_restored_saved_world_size), or with other "
                                    "slices.",
                                    {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->restored_saved_world_,
                         r.AddGauge("ckptd_restored_saved_world_size",
                                    "The number of ranks that saved the step of the job's last restore, when ranks "
                                    "read it resharded; 0 otherwise.",
                                    {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->fresh_over_damaged_,
                         r.AddCounter("ckptd_fresh_starts_over_damaged_total",
                                      "Restarts from scratch over committed steps that were all damaged, as the "
                                      "operator allowed.",
                                      {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->persist_failures_,
                         r.AddCounter("ckptd_persist_failures_total",
                                      "Shards the job's agents could not make durable (PERSIST_FAILED), since this "
                                      "coordinator started.",
                                      {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->replication_partners_,
                         r.AddGauge("ckptd_replication_partners",
                                    "Peer replication: the partners an alive agent with a peer address sends its "
                                    "ranks' snapshots to (fewer than it asked for when other failure domains lack "
                                    "agents).",
                                    {"node"}));
  CKPTD_ASSIGN_OR_RETURN(m->peer_copies_,
                         r.AddGauge("ckptd_peer_copies",
                                    "Ranks of the job's newest committed step that an alive agent other than the "
                                    "rank's own holds in memory (peer replication).",
                                    {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->is_leader_,
                         r.AddGauge("ckptd_coordinator_is_leader",
                                    "1 while this coordinator serves agents and operators (a single coordinator "
                                    "always), 0 while it stands by for the leader of its replicas."));
  CKPTD_ASSIGN_OR_RETURN(m->leader_epoch_,
                         r.AddGauge("ckptd_coordinator_leader_epoch",
                                    "The epoch of the leader this replica knows (the revision of the election key "
                                    "in etcd); 0 for a single coordinator, or while no leader is known."));
  CKPTD_ASSIGN_OR_RETURN(m->leader_changes_,
                         r.AddCounter("ckptd_coordinator_leader_changes_total",
                                      "Changes of leader this replica saw (a new epoch after a known one)."));
  CKPTD_ASSIGN_OR_RETURN(
      m->etcd_seconds_,
      r.AddHistogram("ckptd_etcd_request_seconds",
                     "Time of the replicated coordinator's calls to etcd, failover to other members included.",
                     {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}, {"call"}));
  CKPTD_ASSIGN_OR_RETURN(m->etcd_errors_,
                         r.AddCounter("ckptd_etcd_request_errors_total",
                                      "Calls to etcd that failed on every member tried, by gRPC code.",
                                      {"call", "code"}));
  CKPTD_ASSIGN_OR_RETURN(m->audit_records_,
                         r.AddCounter("ckptd_audit_records_total",
                                      "Audit records made (registrations, failure reports, operator actions, calls "
                                      "refused at authentication), by outcome.",
                                      {"outcome"}));
  CKPTD_ASSIGN_OR_RETURN(m->audit_suppressed_,
                         r.AddCounter("ckptd_audit_records_suppressed_total",
                                      "Calls refused at authentication left out of the audit trail by its rate "
                                      "limit."));
  CKPTD_ASSIGN_OR_RETURN(m->audit_write_errors_,
                         r.AddCounter("ckptd_audit_write_errors_total",
                                      "Audit records that did not reach the audit log file (--audit-log): a write "
                                      "failed, or the file fell too far behind."));
  m->audit_records_->With({"granted"});
  m->audit_records_->With({"refused"});
  m->audit_suppressed_->With();
  m->audit_write_errors_->With();
  m->is_leader_->With()->Set(1);
  m->leader_changes_->With();
  // Every kind shows from the start, so that rates over it are defined.
  for (int k = ckptd::v1::FailureKind_MIN; k <= ckptd::v1::FailureKind_MAX; ++k) {
    if (k == ckptd::v1::FAILURE_KIND_UNSPECIFIED || !ckptd::v1::FailureKind_IsValid(k)) continue;
    m->failures_->With({KindLabel(static_cast<ckptd::v1::FailureKind>(k))});
  }
  return m;
}

void CoordinatorMetrics::SetLeadership(bool leading, int64_t epoch) {
  is_leader_->With()->Set(leading ? 1 : 0);
  leader_epoch_->With()->Set(static_cast<double>(epoch));
  if (epoch == 0) return;
  const int64_t before = last_epoch_.exchange(epoch);
  if (before != 0 && before != epoch) leader_changes_->With()->Increment();
}

void CoordinatorMetrics::OnEtcdCall(absl::string_view call, absl::Duration took, const absl::Status& result) {
  etcd_seconds_->With({call})->Observe(std::max(0.0, absl::ToDoubleSeconds(took)));
  if (!result.ok()) {
    etcd_errors_->With({call, absl::AsciiStrToLower(absl::StatusCodeToString(result.code()))})->Increment();
  }
}

metrics::CollectorHandle CoordinatorMetrics::Watch(CoordinatorCore* core) {
  return registry_->AddCollector([this, core] { Collect(core); });
}

void CoordinatorMetrics::Collect(CoordinatorCore* core) {
  const ckptd::v1::GetClusterStatusResponse status = core->ClusterStatus();
  for (const auto& [job, at] : core->LastCommitTimes()) {
    last_commit_->With({job})->Set(absl::ToDoubleSeconds(at - absl::UnixEpoch()));
  }
  int alive = 0;
  for (const auto& a : status.agents()) alive += a.alive() ? 1 : 0;
  agents_->With()->Set(status.agents_size());
  agents_alive_->With()->Set(alive);
  std::set<std::string> partner_nodes;
  for (const auto& a : status.agents()) {
    if (!a.alive() || a.peer_address().empty()) continue;
    replication_partners_->With({a.node_id()})->Set(a.send_to_size());
    partner_nodes.insert(a.node_id());
  }
  for (const std::string& node : partner_nodes_seen_) {
    if (!partner_nodes.count(node)) replication_partners_->Remove({node});
  }
  partner_nodes_seen_ = std::move(partner_nodes);
  std::set<std::string> peer_copy_jobs;
  for (const ckptd::v1::JobStatus& j : status.jobs()) {
    const std::string& job = j.job();
    job_state_->With({job, "running"})->Set(j.state() == ckptd::v1::JOB_RUNNING && !j.finished() ? 1 : 0);
    job_state_->With({job, "finished"})->Set(j.finished() ? 1 : 0);
    job_state_->With({job, "restarting"})->Set(j.state() == ckptd::v1::JOB_RESTARTING ? 1 : 0);
    world_size_->With({job})->Set(j.world_size());
    restore_blocked_->With({job})->Set(j.restore_blocked().empty() ? 0 : 1);
    if (j.has_last_restore()) {
      std::map<std::string, int> by_source;
      for (int s = ckptd::v1::RestoreSource_MIN; s <= ckptd::v1::RestoreSource_MAX; ++s) {
        const absl::string_view name = protocol::RestoreSourceName(static_cast<ckptd::v1::RestoreSource>(s));
        if (!name.empty()) by_source[std::string(name)] = 0;
      }
      for (const auto& rank : j.last_restore().ranks()) {
        const absl::string_view name = protocol::RestoreSourceName(rank.source());
        if (!name.empty()) ++by_source[std::string(name)];
      }
      for (const auto& [source, n] : by_source) restored_ranks_->With({job, source})->Set(n);
      restored_resharded_->With({job})->Set(protocol::ReshardedRanks(j.last_restore()));
      restored_saved_world_->With({job})->Set(j.last_restore().saved_world_size());
    }
    ranks_alive_->With({job})->Set(j.ranks_alive());
    snapshots_skipped_->With({job})->Set(static_cast<double>(j.snapshots_skipped()));
    job_step_->With({job, "fastest"})->Set(static_cast<double>(j.fastest_step()));
    job_step_->With({job, "slowest"})->Set(static_cast<double>(j.slowest_step()));
    if (j.has_committed()) {
      newest_committed_->With({job})->Set(static_cast<double>(j.newest_committed_step()));
      peer_copies_->With({job})->Set(j.peer_copies());
      peer_copy_jobs.insert(job);
    } else {
      newest_committed_->Remove({job});
    }
    interval_steps_->With({job})->Set(static_cast<double>(j.schedule().every_steps()));
    durable_every_->With({job})->Set(static_cast<double>(std::max<uint64_t>(1, j.schedule().durable_every())));
    if (j.has_memory_checkpoint()) {
      newest_memory_->With({job})->Set(static_cast<double>(j.newest_memory_checkpoint()));
    } else {
      newest_memory_->Remove({job});
    }
    ckptd::v1::GetIntervalRequest req;
    req.set_job(job);
    absl::StatusOr<ckptd::v1::IntervalStatus> iv = core->GetInterval(req);
    if (iv.ok()) {
      // The failure rate is the cluster's: any job's status carries it.
      failure_rate_->With({"mean"})->Set(iv->rate_per_gpu_hour());
      failure_rate_->With({"lower"})->Set(iv->rate_lower());
      failure_rate_->With({"upper"})->Set(iv->rate_upper());
      mtbf_->With({job})->Set(iv->mtbf_seconds());
    }
    if (iv.ok() && iv->decided()) {
      interval_seconds_->With({job})->Set(iv->interval_seconds());
      expected_waste_->With({job, "chosen"})->Set(iv->expected_waste());
      expected_waste_->With({job, "alternative"})->Set(iv->alternative_waste());
      cost_->With({job})->Set(iv->cost_seconds());
    }
    // Totals that never go down in the job's record: a scrape adds what was counted since the last one.
    committed_->With({job})->IncrementTo(static_cast<double>(j.checkpoints_committed()));
    aborted_->With({job})->IncrementTo(static_cast<double>(j.checkpoints_aborted()));
    persist_failures_->With({job})->IncrementTo(static_cast<double>(j.persist_failures()));
    bytes_committed_->With({job});  // from 0, so that rates over it are defined
  }
  for (const std::string& job : peer_copy_jobs_seen_) {
    if (!peer_copy_jobs.count(job)) peer_copies_->Remove({job});
  }
  peer_copy_jobs_seen_ = std::move(peer_copy_jobs);
}

void CoordinatorMetrics::OnShardReported(const ckptd::v1::ShardReport& report) {
  const absl::string_view job = report.job();
  if (std::isfinite(report.stall_seconds()) && report.stall_seconds() >= 0) {
    stall_->With({job})->Observe(report.stall_seconds());
  }
  const double persist = report.shard().persist_seconds();
  if (std::isfinite(persist) && persist >= 0) persist_->With({job})->Observe(persist);
}

void CoordinatorMetrics::OnCommitted(const std::string& job, uint64_t, absl::Duration last_report_to_manifest,
                                     uint64_t bytes) {
  commit_latency_->With({job})->Observe(std::max(0.0, absl::ToDoubleSeconds(last_report_to_manifest)));
  bytes_committed_->With({job})->Increment(static_cast<double>(bytes));
}

void CoordinatorMetrics::OnFreshStartOverDamaged(const std::string& job, uint64_t) {
  fresh_over_damaged_->With({job})->Increment();
}

void CoordinatorMetrics::OnFailure(const ckptd::v1::FailureEvent& event) {
  failures_->With({KindLabel(event.kind())})->Increment();
}

void CoordinatorMetrics::OnAuditRecord(bool granted) {
  audit_records_->With({granted ? "granted" : "refused"})->Increment();
}

void CoordinatorMetrics::OnAuditSuppressed() { audit_suppressed_->With()->Increment(); }

void CoordinatorMetrics::OnAuditWriteError() { audit_write_errors_->With()->Increment(); }

}  // namespace ckptd::coordinator
