#include "agent/agent_metrics.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "metrics/build_info.h"
#include "protocol/restore_source.h"

namespace ckptd::agent {
namespace {

// The `source` label of a restore: protocol::RestoreSourceName's, as the
// coordinator's ckptd_restored_ranks has it.
std::string SourceLabel(RestoreSource source) {
  const absl::string_view name = protocol::RestoreSourceName(RestoreSourceProto(source));
  return name.empty() ? std::string("unknown") : std::string(name);
}

constexpr RestoreSource kSources[] = {RestoreSource::kMemory, RestoreSource::kPeer, RestoreSource::kLocal,
                                      RestoreSource::kRoot};

// A duration as a histogram takes it (a clock that went back: 0).
double Seconds(double s) { return std::isfinite(s) ? std::max(0.0, s) : 0.0; }

// The buckets of the persist and restore times: 10 ms to an hour.
std::vector<double> SecondsBuckets() {
  return {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600};
}

}  // namespace

absl::StatusOr<std::unique_ptr<AgentMetrics>> AgentMetrics::Create(metrics::Registry* registry) {
  std::unique_ptr<AgentMetrics> m(new AgentMetrics(registry));
  metrics::Registry& r = *registry;
  CKPTD_RETURN_IF_ERROR(metrics::AddBuildInfo(r, "agent"));
  CKPTD_ASSIGN_OR_RETURN(m->trainers_,
                         r.AddGauge("ckptd_agent_trainers", "Trainers registered with the agent now (one per rank)."));
  CKPTD_ASSIGN_OR_RETURN(m->persisted_, r.AddCounter("ckptd_agent_snapshots_persisted_total",
                                                     "Ranks' snapshots the agent made durable in storage.", {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->persisted_bytes_,
                         r.AddCounter("ckptd_agent_persisted_bytes_total",
                                      "Bytes of the shard files the agent made durable in storage.", {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->persist_failures_,
                         r.AddCounter("ckptd_agent_persist_failures_total",
                                      "Persists of ranks' snapshots that failed (those stopped by the agent's "
                                      "shutdown not counted).",
                                      {"job"}));
  CKPTD_ASSIGN_OR_RETURN(
      m->persist_seconds_,
      r.AddHistogram("ckptd_agent_persist_seconds",
                     "Time from a rank's publish of a snapshot to the snapshot durable in storage.",
                     SecondsBuckets(), {"job"}));
  CKPTD_ASSIGN_OR_RETURN(
      m->memory_checkpoints_,
      r.AddCounter("ckptd_agent_memory_checkpoints_total",
                   "Ranks' snapshots kept in memory as memory checkpoints, nothing written.", {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->restores_,
                         r.AddCounter("ckptd_agent_restores_total",
                                      "Restores that handed a step over, by where it was read: memory (this "
                                      "agent's), peer (another node's agent), node-local, storage-root.",
                                      {"job", "source"}));
  CKPTD_ASSIGN_OR_RETURN(m->restored_bytes_,
                         r.AddCounter("ckptd_agent_restored_bytes_total",
                                      "Bytes of the trainers' buffers that restores filled.", {"job"}));
  CKPTD_ASSIGN_OR_RETURN(
      m->restore_failures_,
      r.AddCounter("ckptd_agent_restore_failures_total", "Restores that failed (the trainer got an error).", {"job"}));
  CKPTD_ASSIGN_OR_RETURN(
      m->restore_seconds_,
      r.AddHistogram("ckptd_agent_restore_seconds",
                     "Time from a trainer's restore call to its step in staging, of restores that handed one over.",
                     SecondsBuckets(), {"job"}));
  CKPTD_ASSIGN_OR_RETURN(
      m->skipped_,
      r.AddCounter("ckptd_agent_snapshots_skipped_total",
                   "Snapshots the trainers skipped and reported (no free staging slot in time).", {"job"}));
  CKPTD_ASSIGN_OR_RETURN(
      m->trainer_failures_,
      r.AddCounter("ckptd_agent_trainer_failures_total",
                   "Trainers the agent saw die (their process exited without saying goodbye).", {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->staging_bytes_,
                         r.AddGauge("ckptd_agent_staging_bytes",
                                    "Staging memory the agent maps for trainers, live and parked for their "
                                    "successors."));
  CKPTD_ASSIGN_OR_RETURN(m->memory_tier_bytes_,
                         r.AddGauge("ckptd_agent_memory_tier_bytes",
                                    "Staging slots that keep a snapshot in memory for a restore (the memory tier)."));
  CKPTD_ASSIGN_OR_RETURN(m->memory_budget_bytes_,
                         r.AddGauge("ckptd_agent_memory_budget_bytes",
                                    "The agent's memory budget for staging and partners' copies (0: no limit)."));
  CKPTD_ASSIGN_OR_RETURN(m->partner_copies_bytes_, r.AddGauge("ckptd_agent_partner_copies_bytes",
                                                              "Memory holding partners' copies (peer replication)."));
  CKPTD_ASSIGN_OR_RETURN(m->replication_lag_,
                         r.AddGauge("ckptd_agent_replication_lag_steps",
                                    "Steps the partners are behind: the newest step of a rank sent for replication "
                                    "minus the newest one every partner took, the most of the job's ranks here "
                                    "(0 without replication).",
                                    {"job"}));
  CKPTD_ASSIGN_OR_RETURN(m->replication_failures_,
                         r.AddCounter("ckptd_agent_replication_failures_total",
                                      "Copies to partners that a partner refused or could not be reached for."));
  CKPTD_ASSIGN_OR_RETURN(m->coordinator_connected_,
                         r.AddGauge("ckptd_agent_coordinator_connected",
                                    "1 while the agent is registered with the coordinator and its heartbeats are "
                                    "answered (0 without one)."));
  return m;
}

metrics::CollectorHandle AgentMetrics::Watch(Sources sources) {
  return registry_->AddCollector([this, sources = std::move(sources)] { Collect(sources); });
}

void AgentMetrics::StartJob(const std::string& job) {
  persisted_->With({job});
  persisted_bytes_->With({job});
  persist_failures_->With({job});
  memory_checkpoints_->With({job});
  for (const RestoreSource s : kSources) restores_->With({job, SourceLabel(s)});
  restored_bytes_->With({job});
  restore_failures_->With({job});
  skipped_->With({job});
  trainer_failures_->With({job});
}

void AgentMetrics::Collect(const Sources& sources) {
  std::set<std::string> jobs;
  if (sources.core != nullptr) {
    const std::vector<TrainerInfo> trainers = sources.core->Trainers();
    trainers_->With()->Set(static_cast<double>(trainers.size()));
    for (const TrainerInfo& t : trainers) jobs.insert(t.job);
    const AgentCore::MemoryUsage memory = sources.core->Memory();
    staging_bytes_->With()->Set(static_cast<double>(memory.bytes));
    memory_tier_bytes_->With()->Set(static_cast<double>(memory.kept_bytes));
    memory_budget_bytes_->With()->Set(static_cast<double>(memory.budget));
  }
  for (const std::string& job : jobs) StartJob(job);
  if (sources.replicas != nullptr) partner_copies_bytes_->With()->Set(static_cast<double>(sources.replicas->bytes()));
  std::map<std::string, uint64_t> lag;
  if (sources.replicator != nullptr) {
    replication_failures_->With()->IncrementTo(static_cast<double>(sources.replicator->Stats().failed));
    // Without partners nothing is sent, and no partner is behind.
    if (sources.replicator->has_partners()) lag = sources.replicator->LagSteps();
  }
  for (const std::string& job : jobs) replication_lag_->With({job})->Set(static_cast<double>(lag[job]));
  for (const std::string& job : lag_jobs_seen_) {
    if (!jobs.count(job)) replication_lag_->Remove({job});
  }
  lag_jobs_seen_ = std::move(jobs);
  if (sources.coordinator_connected) coordinator_connected_->With()->Set(sources.coordinator_connected() ? 1 : 0);
}

void AgentMetrics::OnPersisted(const std::string& job, uint64_t bytes, double seconds) {
  persisted_->With({job})->Increment();
  persisted_bytes_->With({job})->Increment(static_cast<double>(bytes));
  persist_seconds_->With({job})->Observe(Seconds(seconds));
}

void AgentMetrics::OnMemoryCheckpoint(const std::string& job) { memory_checkpoints_->With({job})->Increment(); }

void AgentMetrics::OnPersistFailed(const std::string& job) { persist_failures_->With({job})->Increment(); }

void AgentMetrics::OnRestored(const std::string& job, RestoreSource source, uint64_t bytes, double seconds) {
  restores_->With({job, SourceLabel(source)})->Increment();
  restored_bytes_->With({job})->Increment(static_cast<double>(bytes));
  restore_seconds_->With({job})->Observe(Seconds(seconds));
}

void AgentMetrics::OnRestoreFailed(const std::string& job) { restore_failures_->With({job})->Increment(); }

void AgentMetrics::OnSnapshotSkipped(const std::string& job) { skipped_->With({job})->Increment(); }

void AgentMetrics::OnTrainerDied(const std::string& job) { trainer_failures_->With({job})->Increment(); }

std::string AgentNotReady(bool socket_served, const std::string& coordinator, bool registered,
                          const absl::Status& last_error) {
  if (!socket_served) return "the trainers' socket is not served";
  if (coordinator.empty() || registered) return "";
  if (last_error.ok()) return absl::StrCat("not registered with the coordinator at ", coordinator, " yet");
  // The link's errors start with the coordinator they are of: said once.
  absl::string_view why = last_error.message();
  absl::ConsumePrefix(&why, absl::StrCat(coordinator, ": "));
  return absl::StrCat("not registered with the coordinator at ", coordinator, ": ", why);
}

}  // namespace ckptd::agent
