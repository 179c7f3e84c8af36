// CoordinatorCore: the schedule every rank evaluates. Manual checkpoints at
// a step ahead of every rank, and the interval policy: a view of the job's
// measurements (a pure function), the decision, and the move to a new rule
// that keeps every rank snapshotting the same steps.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/coordinator_core_internal.h"
#include "coordinator/job.h"
#include "storage/layout.h"

namespace ckptd::coordinator {

namespace internal {
namespace {

constexpr size_t kMaxTargets = 64;

// The median of the positive values (0 when there is none).
double MedianOfPositive(std::vector<double> v) {
  std::erase_if(v, [](double x) { return !(x > 0) || !std::isfinite(x); });
  return v.empty() ? 0 : policy::Median(std::move(v));
}

// The failure classes' estimates into `two`, and which of them memory
// recovers from (a lost node's only with partners holding its ranks).
void FillClasses(const ClusterExposure& cluster, const CoordinatorOptions& options, double exposure_gpu_hours,
                 MemoryTiers tiers, ckptd::v1::TwoLevelStatus* two) {
  std::array<int64_t, policy::kFailureClasses> seen;
  for (int c = 0; c < policy::kFailureClasses; ++c) seen[c] = static_cast<int64_t>(cluster.by_class[c]);
  const auto rates = policy::EstimateRatesByClass(options.failure_prior, options.failure_mix, seen, exposure_gpu_hours);
  const policy::FailureMix& mix = options.failure_mix;
  const double total = mix.process + mix.node + mix.wide;
  two->set_memory_tier(tiers.memory_tier);
  two->set_peer_copies(tiers.memory_tier && tiers.peer_copies);
  two->set_replicate_seconds(two->peer_copies() ? tiers.replicate_seconds : 0);
  for (int c = 0; c < policy::kFailureClasses; ++c) {
    const auto cls = static_cast<policy::FailureClass>(c);
    ckptd::v1::FailureClassStatus* f = two->add_classes();
    f->set_name(policy::FailureClassName(cls));
    f->set_failures(cluster.by_class[c]);
    f->set_prior_fraction(mix.of(cls) / total);
    f->set_rate_per_gpu_hour(rates[c].mean);
    f->set_rate_lower(rates[c].lower);
    f->set_rate_upper(rates[c].upper);
    f->set_from_memory(tiers.memory_tier && (cls == policy::FailureClass::kProcess ||
                                             (cls == policy::FailureClass::kNode && tiers.peer_copies)));
  }
}

// The two cadences from the single level's measurements: every checkpoint
// costs the stall (δm), a durable one also the persist's slowdown (δd).
void ViewTwoLevel(const ckptd::v1::IntervalStatus& st, const CoordinatorOptions& options, IntervalView* view) {
  ckptd::v1::TwoLevelStatus* two = view->status.mutable_two_level();
  policy::TwoLevelInputs in;
  // Without the memory tier on every node there are no memory checkpoints.
  in.fixed_durable_every = two->memory_tier() ? options.durable_every : 0;
  for (const ckptd::v1::FailureClassStatus& f : two->classes()) {
    const double per_s = f.rate_per_gpu_hour() * st.gpus() / 3600;
    (f.from_memory() ? in.memory_rate_per_s : in.durable_rate_per_s) += per_s;
  }
  in.memory_cost_s = std::max(st.stall_seconds(), 1e-6);
  in.durable_cost_s = st.slowdown_seconds();
  in.persist_s = st.persist_seconds();
  in.replicate_s = two->replicate_seconds();
  in.memory_restart_s = in.durable_restart_s = st.restart_seconds();
  in.step_s = st.step_seconds();
  in.min_interval_s = st.min_interval_seconds();
  in.max_interval_s = st.max_interval_seconds();
  two->set_memory_rate_per_s(in.memory_rate_per_s);
  two->set_durable_rate_per_s(in.durable_rate_per_s);
  two->set_memory_cost_seconds(in.memory_cost_s);
  two->set_durable_cost_seconds(in.durable_cost_s);
  two->set_memory_restart_seconds(in.memory_restart_s);
  two->set_durable_restart_seconds(in.durable_restart_s);
  absl::StatusOr<policy::TwoLevelDecision> d = policy::DecideTwoLevel(in);
  if (!d.ok()) {
    two->set_reason(std::string(d.status().message()));
    return;
  }
  two->set_durable_every_optimum(d->durable_every_optimum);
  two->set_durable_every(d->durable_every);
  two->set_daly_seconds(d->daly_s);
  two->set_memory_interval_seconds(d->memory_interval_s);
  two->set_memory_interval_steps(d->memory_steps);
  two->set_durable_interval_seconds(d->durable_interval_s);
  two->set_durable_interval_steps(d->durable_steps);
  two->set_expected_waste(d->expected_waste);
  two->set_single_interval_seconds(d->single_interval_s);
  two->set_single_waste(d->single_waste);
  two->set_reason(d->reason);
  view->two_level_inputs = in;
  view->two_level = *std::move(d);
}

}  // namespace

IntervalView ViewInterval(const Job& job, const ClusterExposure& cluster, const CoordinatorOptions& options,
                          MemoryTiers tiers) {
  IntervalView view;
  ckptd::v1::IntervalStatus& st = view.status;
  st.set_job(job.name());
  st.set_automatic(options.interval_automatic);
  st.set_every_steps(job.schedule().every_steps());
  st.set_durable_every(job.schedule().durable_every());
  st.set_gpus(job.world_size());
  st.set_failures(cluster.failures);
  st.set_exposure_gpu_hours(cluster.gpu_seconds / 3600);
  st.set_prior_per_gpu_hour(options.failure_prior.mean_per_gpu_hour);
  st.set_prior_shape(options.failure_prior.shape);
  const policy::FailureRateEstimate rate = policy::EstimateFailureRate(
      options.failure_prior, static_cast<int64_t>(cluster.failures), st.exposure_gpu_hours(), 0.9);
  st.set_rate_per_gpu_hour(rate.mean);
  st.set_rate_lower(rate.lower);
  st.set_rate_upper(rate.upper);
  st.set_credible(rate.credible);
  st.set_mtbf_seconds(policy::JobMtbfSeconds(rate.mean, static_cast<int>(job.world_size())));
  FillClasses(cluster, options, st.exposure_gpu_hours(), tiers, st.mutable_two_level());
  std::vector<double> idle, persisting;
  for (const auto& [r, rank] : job.ranks()) {
    if (!rank.alive) continue;
    idle.push_back(rank.step_seconds_idle);
    persisting.push_back(rank.step_seconds_persisting);
  }
  const double step_idle = MedianOfPositive(idle);
  const double step_persisting = MedianOfPositive(persisting);
  st.set_step_seconds(step_idle > 0 ? step_idle : job.record().step_seconds());
  st.set_step_seconds_persisting(step_persisting);
  st.set_checkpoints_measured(static_cast<uint32_t>(job.stalls().size()));
  st.set_restarts_measured(static_cast<uint32_t>(job.restarts().size()));
  const double stall = job.stalls().empty() ? 0 : job.stalls().Median();
  const double persist = job.persists().empty() ? 0 : job.persists().Median();
  // Steps during a persist run slower by (1 - idle/persisting) of their time,
  // for as long as the persist lasts.
  const double slowdown =
      step_idle > 0 && step_persisting > step_idle ? persist * (1 - step_idle / step_persisting) : 0;
  st.set_stall_seconds(stall);
  st.set_persist_seconds(persist);
  st.set_slowdown_seconds(slowdown);
  // A cost measured as zero (a clock too coarse) is still a cost.
  st.set_cost_seconds(std::max(stall + slowdown, 1e-6));
  st.set_restart_assumed(job.restarts().empty());
  st.set_restart_seconds(job.restarts().empty() ? absl::ToDoubleSeconds(options.restart_guess)
                                                : job.restarts().Median());
  st.set_min_interval_seconds(absl::ToDoubleSeconds(options.min_interval));
  st.set_max_interval_seconds(absl::ToDoubleSeconds(options.max_interval));
  st.set_alternative_seconds(absl::ToDoubleSeconds(options.alternative_interval));
  if (!options.interval_automatic) {
    st.set_reason(absl::StrCat("fixed interval of ", st.every_steps(), " steps (--every)"));
  }
  if (job.stalls().empty()) {
    st.set_waiting_for("a committed checkpoint, to measure its stall and persist time");
    return view;
  }
  if (st.step_seconds() <= 0) {
    st.set_waiting_for("step times from the ranks");
    return view;
  }
  policy::IntervalInputs in;
  in.mtbf_s = st.mtbf_seconds();
  in.delta_s = st.cost_seconds();
  in.persist_s = persist;
  in.restart_s = st.restart_seconds();
  in.step_s = st.step_seconds();
  in.min_interval_s = st.min_interval_seconds();
  in.max_interval_s = st.max_interval_seconds();
  in.alternative_s = st.alternative_seconds();
  absl::StatusOr<policy::IntervalDecision> d = policy::DecideInterval(in);
  if (!d.ok()) {
    st.set_waiting_for(std::string(d.status().message()));
    return view;
  }
  st.set_daly_seconds(d->daly_s);
  st.set_interval_seconds(d->interval_s);
  st.set_interval_steps(d->interval_steps);
  st.set_expected_waste(d->expected_waste);
  st.set_alternative_waste(d->alternative_waste);
  if (options.interval_automatic) st.set_reason(d->reason);
  st.set_decided(true);
  view.inputs = in;
  view.decision = *std::move(d);
  ViewTwoLevel(st, options, &view);
  return view;
}

uint64_t DurablePhase(const Job& job, const OneOffTargets& kept, uint64_t every, uint64_t durable_every,
                      uint64_t start) {
  const uint64_t k = std::max<uint64_t>(1, durable_every);
  if (k == 1 || every == 0) return 0;
  // The newest durable step known: committed, pending, or still ahead as a
  // one-off target of the old rule.
  uint64_t last = job.NewestUsable().value_or(0);
  if (!job.pending().empty()) last = std::max(last, job.pending().rbegin()->first);
  for (uint64_t d : kept.durable) last = std::max(last, d);
  // The first durable step of the new rule: k intervals after it.
  const uint64_t due = last + std::min<uint64_t>(k * every, std::numeric_limits<uint64_t>::max() - last);
  const uint64_t first = due <= start ? 0 : (due - start + every - 1) / every;
  return (k - first % k) % k;
}

OneOffTargets TargetsUntilNewRule(const ckptd::v1::Schedule& current, uint64_t fastest, uint64_t start) {
  OneOffTargets t;
  for (uint64_t e : current.extra_steps()) {
    if (e > fastest) t.durable.push_back(e);
  }
  for (uint64_t e : current.memory_steps()) {
    if (e > fastest && !protocol::DurableAt(current, e)) t.memory.push_back(e);
  }
  auto known = [&t](uint64_t step) {
    return std::find(t.durable.begin(), t.durable.end(), step) != t.durable.end() ||
           std::find(t.memory.begin(), t.memory.end(), step) != t.memory.end();
  };
  if (current.every_steps() > 0) {
    const uint64_t every = current.every_steps();
    uint64_t next = fastest + 1;
    if (next < current.start_step()) {
      next = current.start_step();
    } else {
      next += (every - (next - current.start_step()) % every) % every;
    }
    for (; next < start && t.durable.size() + t.memory.size() < kMaxTargets; next += every) {
      if (known(next)) continue;
      (protocol::DurableAt(current, next) ? t.durable : t.memory).push_back(next);
    }
  }
  return t;
}

}  // namespace internal

uint64_t CoordinatorCore::ManualLead(const Job& job) const {
  // Far enough ahead that every rank hears of it first: two heartbeats and
  // the client's poll, in steps of the job's pace (at least two steps).
  const double seconds = 2 * absl::ToDoubleSeconds(options_.heartbeat_interval) + 0.5;
  const double step_s = job.record().step_seconds();
  if (step_s <= 0) return 10;
  return std::max<uint64_t>(2, static_cast<uint64_t>(std::ceil(seconds / step_s)) + 1);
}

absl::StatusOr<ckptd::v1::RequestCheckpointResponse> CoordinatorCore::RequestCheckpoint(
    const ckptd::v1::RequestCheckpointRequest& request) {
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  Effects fx;
  ckptd::v1::RequestCheckpointResponse response;
  {
    absl::MutexLock l(&mu_);
    Job* job = FindJob(request.job());
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", request.job()));
    if (job->state() != ckptd::v1::JOB_RUNNING) {
      return absl::FailedPreconditionError(absl::StrCat("job ", request.job(), " is restarting"));
    }
    uint64_t fastest = 0;
    bool any = false;
    for (const auto& [r, rank] : job->ranks()) {
      if (!rank.alive) continue;
      any = true;
      fastest = std::max(fastest, rank.step);
    }
    if (!any) return absl::FailedPreconditionError(absl::StrCat("job ", request.job(), " has no live rank"));
    const uint64_t target = fastest + ManualLead(*job);
    job->AddManualTarget(target, fastest);
    response.set_target_step(target);
    SaveJob(job, &fx);
  }
  Apply(fx);
  return response;
}

internal::MemoryTiers CoordinatorCore::TiersOf(const Job& job) const {
  internal::MemoryTiers tiers{true, true};
  bool any = false;
  for (const auto& [r, rank] : job.ranks()) {
    if (!rank.alive) continue;
    auto agent = agents_.find(rank.node_id);
    if (agent == agents_.end()) return {};
    any = true;
    tiers.memory_tier &= agent->second->memory_tier;
    tiers.peer_copies &= !agent->second->send_to.empty();
    tiers.replicate_seconds = std::max(tiers.replicate_seconds, agent->second->replicate_seconds);
  }
  return any ? tiers : internal::MemoryTiers{};
}

internal::IntervalView CoordinatorCore::IntervalFor(const Job& job) const {
  // The failure rate is the cluster's: every job's failures over every job's
  // GPU-hours.
  internal::ClusterExposure cluster;
  for (const auto& [name, j] : jobs_) {
    cluster.failures += j->record().failures();
    cluster.gpu_seconds += j->record().gpu_seconds();
    const std::array<uint64_t, 3> by_class = j->FailuresByClass();
    for (int c = 0; c < policy::kFailureClasses; ++c) cluster.by_class[c] += by_class[c];
  }
  return internal::ViewInterval(job, cluster, options_, TiersOf(job));
}

void CoordinatorCore::DecideInterval(Job* job) {
  internal::IntervalView v = IntervalFor(*job);
  if (!v.decision) return;
  const ckptd::v1::Schedule& current = job->schedule();
  const uint64_t current_k = std::max<uint64_t>(1, current.durable_every());
  if (v.two_level && v.two_level->memory_steps > 0) {
    // Two cadences wherever the job's memory tier makes them worth it (k = 1
    // otherwise: then this is the one-cadence decision).
    const policy::TwoLevelDecision& d = *v.two_level;
    if (policy::ShouldChangeTwoLevel(current.every_steps(), current_k, d, *v.two_level_inputs, options_.hysteresis)) {
      Reschedule(job, d.memory_steps, d.durable_every);
    }
    return;
  }
  if (policy::ShouldChangeInterval(current.every_steps(), *v.decision, *v.inputs, options_.hysteresis) ||
      current_k != 1) {
    Reschedule(job, v.decision->interval_steps, 1);
  }
}

void CoordinatorCore::Reschedule(Job* job, uint64_t every_steps, uint64_t durable_every) {
  const uint64_t fastest = job->FastestStep();
  // The new rule starts where every rank has heard of it. Until then a rank
  // may still follow the old one, so the old rule's targets before that step
  // stay as one-off targets (durable or memory, as the old rule had them):
  // every rank snapshots the same steps either way.
  const uint64_t start = fastest + ManualLead(*job);
  internal::OneOffTargets t = internal::TargetsUntilNewRule(job->schedule(), fastest, start);
  job->SetRule(every_steps, durable_every, start, t.durable, t.memory,
               internal::DurablePhase(*job, t, every_steps, durable_every, start));
}

absl::StatusOr<ckptd::v1::IntervalStatus> CoordinatorCore::GetInterval(const ckptd::v1::GetIntervalRequest& request) {
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(request.job()));
  absl::MutexLock l(&mu_);
  const Job* job = FindJob(request.job());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job ", request.job()));
  internal::IntervalView v = IntervalFor(*job);
  if (job->last_decided() != absl::Time()) {
    v.status.set_decided_unix_nanos(absl::ToUnixNanos(job->last_decided()));
  }
  return v.status;
}

}  // namespace ckptd::coordinator
