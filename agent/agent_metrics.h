// The agent's Prometheus metrics (ckptd-agent --metrics-listen): counters
// and histograms of what the core does, told as it happens (AgentObserver),
// and gauges read at every scrape from the core, the replication sender and
// the copies held for partners, and the coordinator link.
//
//   ckptd_build_info{component="agent",version}       1
//   ckptd_agent_trainers                               trainers registered now (one per job and rank)
//   ckptd_agent_snapshots_persisted_total{job}         snapshots made durable in storage
//   ckptd_agent_persisted_bytes_total{job}             their shard files' bytes
//   ckptd_agent_persist_failures_total{job}            persists that failed (not those stopped at shutdown)
//   ckptd_agent_persist_seconds{job}                   histogram, a snapshot's publish to durable
//   ckptd_agent_memory_checkpoints_total{job}          snapshots kept in memory only (Schedule.durable_every)
//   ckptd_agent_restores_total{job,source}             restores that handed a step over, by where it was read
//   ckptd_agent_restored_bytes_total{job}              the bytes of the buffers they filled
//   ckptd_agent_restore_failures_total{job}            restores that failed
//   ckptd_agent_restore_seconds{job}                   histogram, a restore call to its step in staging
//   ckptd_agent_snapshots_skipped_total{job}           snapshots the trainers skipped (no free slot)
//   ckptd_agent_trainer_failures_total{job}            trainers that died without saying goodbye
//   ckptd_agent_staging_bytes                          staging memory mapped for trainers (live and parked)
//   ckptd_agent_memory_tier_bytes                      of it, the slots keeping a step in memory
//   ckptd_agent_memory_budget_bytes                    --memory-budget (0: no limit)
//   ckptd_agent_partner_copies_bytes                   memory held for partners' copies (peer replication)
//   ckptd_agent_replication_lag_steps{job}             steps the partners are behind (0 without replication)
//   ckptd_agent_replication_failures_total             copies a partner refused or could not be reached for
//   ckptd_agent_coordinator_connected                  1 while registered with the coordinator, heartbeats answered
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/agent_core.h"
#include "agent/agent_types.h"
#include "metrics/registry.h"
#include "replication/replica_store.h"
#include "replication/replicator.h"

namespace ckptd::agent {

class AgentMetrics final : public AgentObserver {
 public:
  // Registers the families in `registry`, which must outlive the result.
  static absl::StatusOr<std::unique_ptr<AgentMetrics>> Create(metrics::Registry* registry);

  // What a scrape reads; any of them may be null (left out, or 0).
  struct Sources {
    AgentCore* core = nullptr;
    replication::Replicator* replicator = nullptr;
    replication::ReplicaStore* replicas = nullptr;
    // With a coordinator: whether the agent is registered with it now.
    std::function<bool()> coordinator_connected;
  };
  // Refreshes the gauges from `sources` at every scrape while the returned
  // handle lives. Drop the handle before any of them goes away.
  [[nodiscard]] metrics::CollectorHandle Watch(Sources sources);

  // AgentObserver (from the core's threads).
  void OnPersisted(const std::string& job, uint64_t bytes, double seconds) override;
  void OnMemoryCheckpoint(const std::string& job) override;
  void OnPersistFailed(const std::string& job) override;
  void OnRestored(const std::string& job, RestoreSource source, uint64_t bytes, double seconds) override;
  void OnRestoreFailed(const std::string& job) override;
  void OnSnapshotSkipped(const std::string& job) override;
  void OnTrainerDied(const std::string& job) override;

 private:
  explicit AgentMetrics(metrics::Registry* registry) : registry_(registry) {}
  void Collect(const Sources& sources);
  // Every per-job series of `job` from 0, so that rates over them are defined.
  void StartJob(const std::string& job);

  metrics::Registry* const registry_;
  metrics::GaugeFamily* trainers_ = nullptr;
  metrics::CounterFamily* persisted_ = nullptr;
  metrics::CounterFamily* persisted_bytes_ = nullptr;
  metrics::CounterFamily* persist_failures_ = nullptr;
  metrics::HistogramFamily* persist_seconds_ = nullptr;
  metrics::CounterFamily* memory_checkpoints_ = nullptr;
  metrics::CounterFamily* restores_ = nullptr;
  metrics::CounterFamily* restored_bytes_ = nullptr;
  metrics::CounterFamily* restore_failures_ = nullptr;
  metrics::HistogramFamily* restore_seconds_ = nullptr;
  metrics::CounterFamily* skipped_ = nullptr;
  metrics::CounterFamily* trainer_failures_ = nullptr;
  metrics::GaugeFamily* staging_bytes_ = nullptr;
  metrics::GaugeFamily* memory_tier_bytes_ = nullptr;
  metrics::GaugeFamily* memory_budget_bytes_ = nullptr;
  metrics::GaugeFamily* partner_copies_bytes_ = nullptr;
  metrics::GaugeFamily* replication_lag_ = nullptr;
  metrics::CounterFamily* replication_failures_ = nullptr;
  metrics::GaugeFamily* coordinator_connected_ = nullptr;
  // The jobs the last scrape set a replication lag for, so that a job with
  // no trainer here any more loses its series. Only Collect touches it, and
  // the registry runs collectors one at a time.
  std::set<std::string> lag_jobs_seen_;
};

// What /readyz says keeps the agent from being ready, in one line; empty
// when it is ready: the trainers' socket served (`socket_served`) and, with a
// coordinator (`coordinator`, its address; empty: none), registered with it
// (`registered`; `last_error` says why not).
std::string AgentNotReady(bool socket_served, const std::string& coordinator, bool registered,
                          const absl::Status& last_error);

}  // namespace ckptd::agent
