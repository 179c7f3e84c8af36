// The drills an operator ordered (the newest few hundred): each one's order,
// the node whose agent carries it out, and the agent's report. A private
// part of CoordinatorCore, which holds its mutex around every call.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ckptd/v1/coordinator.pb.h"

namespace ckptd::coordinator::internal {

struct Drill {
  ckptd::v1::RunDrillRequest request;
  std::string node;
  absl::Time ordered;
  std::optional<uint64_t> newest_at_order;  // the job's newest usable step then
  std::optional<ckptd::v1::DrillReport> report;
  // KILL_NODE with_partners: the node's replication partners, each killed
  // by a drill of its own (ordered with this one).
  std::vector<std::string> partners;
};

class DrillBook {
 public:
  // Ids start at `first_id` and grow by one per order. Agents ignore an id
  // they carried out already, so a coordinator that restarts, or a new
  // leader of replicated ones, must not reuse its predecessor's ids: the
  // core starts them at its start time in seconds, times 2^20.
  explicit DrillBook(uint64_t first_id = 1) : next_id_(first_id) {}
  // Records an order for `node`'s agent; returns the drill's id.
  uint64_t Order(const ckptd::v1::RunDrillRequest& order, const std::string& node, absl::Time now,
                 std::optional<uint64_t> newest_at_order, std::vector<std::string> partners = {});
  // `node`'s agent registered again. An agent told to kill itself may die
  // before its report gets out: an order to kill it that it never reported
  // is taken as carried out (by `last_heartbeat` at the latest), so that it
  // is not sent again.
  void AgentRegistered(const std::string& node, absl::Time last_heartbeat);
  // An agent's report on an order of its node; others are ignored.
  void Report(const std::string& node, const ckptd::v1::DrillReport& report);
  // Adds the orders `node`'s agent has not reported on to its heartbeat answer.
  void AddOrders(const std::string& node, ckptd::v1::HeartbeatAck* ack) const;
  const Drill* Find(uint64_t id) const;
  // The drill `id` as a store keeps it; nullopt when the book has none.
  std::optional<ckptd::v1::DrillRecord> RecordOf(uint64_t id) const;
  // The drills ordered, reported or taken as carried out since the last
  // call (to be saved).
  std::vector<uint64_t> TakeChanged();
  // Takes over the drills a previous coordinator saved (a restart, a new
  // leader): orders not reported yet are sent again, and new ids start above
  // every one of them. Records without an id or node are left out.
  void Restore(const std::vector<ckptd::v1::DrillRecord>& records);
  // An id for a drill carried out without an agent (KILL_COORDINATOR).
  uint64_t TakeId() { return next_id_++; }
  // When the first node `drill` strikes was struck: its own report's time or,
  // with partners, the earliest of the reports of the drills ordered with it
  // on the partners (any of them may fail first). nullopt before any report.
  std::optional<int64_t> FirstInjection(const Drill& drill) const;

 private:
  static constexpr size_t kMaxDrills = 256;
  std::map<uint64_t, Drill> drills_;
  std::set<uint64_t> changed_;
  uint64_t next_id_;
};

}  // namespace ckptd::coordinator::internal
