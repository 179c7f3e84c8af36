#include "coordinator/drill_book.h"

#include <algorithm>
#include <utility>

namespace ckptd::coordinator::internal {

uint64_t DrillBook::Order(const ckptd::v1::RunDrillRequest& order, const std::string& node, absl::Time now,
                          std::optional<uint64_t> newest_at_order, std::vector<std::string> partners) {
  const uint64_t id = next_id_++;
  Drill& d = drills_[id];
  d.request = order;
  d.node = node;
  d.ordered = now;
  d.newest_at_order = newest_at_order;
  d.partners = std::move(partners);
  changed_.insert(id);
  while (drills_.size() > kMaxDrills) drills_.erase(drills_.begin());
  return id;
}

void DrillBook::AgentRegistered(const std::string& node, absl::Time last_heartbeat) {
  for (auto& [id, drill] : drills_) {
    const bool kills_agent =
        drill.request.scenario() == ckptd::v1::KILL_AGENT || drill.request.scenario() == ckptd::v1::KILL_NODE;
    if (drill.node != node || drill.report || !kills_agent) continue;
    ckptd::v1::DrillReport r;
    r.set_drill_id(id);
    r.set_injected(true);
    r.set_injected_unix_nanos(absl::ToUnixNanos(std::max(drill.ordered, last_heartbeat)));
    r.set_detail("the agent registered again without reporting: it was killed");
    drill.report = r;
    changed_.insert(id);
  }
}

void DrillBook::Report(const std::string& node, const ckptd::v1::DrillReport& report) {
  auto d = drills_.find(report.drill_id());
  if (d == drills_.end() || d->second.node != node) return;
  // Agents send their reports again with later heartbeats: only news counts.
  if (d->second.report && d->second.report->SerializeAsString() == report.SerializeAsString()) return;
  d->second.report = report;
  changed_.insert(report.drill_id());
}

std::optional<ckptd::v1::DrillRecord> DrillBook::RecordOf(uint64_t id) const {
  const Drill* d = Find(id);
  if (d == nullptr) return std::nullopt;
  ckptd::v1::DrillRecord r;
  r.set_id(id);
  *r.mutable_request() = d->request;
  r.set_node(d->node);
  r.set_ordered_unix_nanos(absl::ToUnixNanos(d->ordered));
  r.set_has_newest_at_order(d->newest_at_order.has_value());
  r.set_newest_at_order(d->newest_at_order.value_or(0));
  if (d->report) *r.mutable_report() = *d->report;
  for (const std::string& p : d->partners) r.add_partners(p);
  return r;
}

std::vector<uint64_t> DrillBook::TakeChanged() {
  std::vector<uint64_t> ids(changed_.begin(), changed_.end());
  changed_.clear();
  return ids;
}

void DrillBook::Restore(const std::vector<ckptd::v1::DrillRecord>& records) {
  for (const ckptd::v1::DrillRecord& r : records) {
    if (r.id() == 0 || r.node().empty()) continue;
    Drill& d = drills_[r.id()];
    d.request = r.request();
    d.node = r.node();
    d.ordered = absl::FromUnixNanos(r.ordered_unix_nanos());
    d.newest_at_order = r.has_newest_at_order() ? std::optional<uint64_t>(r.newest_at_order()) : std::nullopt;
    d.report = r.has_report() ? std::optional<ckptd::v1::DrillReport>(r.report()) : std::nullopt;
    d.partners.assign(r.partners().begin(), r.partners().end());
    if (r.id() >= next_id_ && r.id() < UINT64_MAX) next_id_ = r.id() + 1;
  }
  while (drills_.size() > kMaxDrills) drills_.erase(drills_.begin());
}

void DrillBook::AddOrders(const std::string& node, ckptd::v1::HeartbeatAck* ack) const {
  for (const auto& [id, drill] : drills_) {
    if (drill.node != node || drill.report) continue;
    ckptd::v1::DrillOrder* o = ack->add_drills();
    o->set_drill_id(id);
    o->set_scenario(drill.request.scenario());
    o->set_job(drill.request.job());
    o->set_rank(drill.request.rank());
    o->set_at_step(drill.request.at_step());
    o->set_duration_seconds(drill.request.duration_seconds());
    o->set_slow_seconds(drill.request.slow_seconds());
    o->set_step(drill.request.step());
  }
}

std::optional<int64_t> DrillBook::FirstInjection(const Drill& drill) const {
  std::optional<int64_t> first;
  auto note = [&](const Drill& d) {
    if (!d.report || !d.report->injected()) return;
    const int64_t at = d.report->injected_unix_nanos();
    if (!first || at < *first) first = at;
  };
  note(drill);
  if (drill.partners.empty()) return first;
  for (const auto& [id, d] : drills_) {
    const bool partner = std::find(drill.partners.begin(), drill.partners.end(), d.node) != drill.partners.end();
    if (partner && d.ordered == drill.ordered && d.request.job() == drill.request.job()) note(d);
  }
  return first;
}

const Drill* DrillBook::Find(uint64_t id) const {
  auto d = drills_.find(id);
  return d == drills_.end() ? nullptr : &d->second;
}

}  // namespace ckptd::coordinator::internal
