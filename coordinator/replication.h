// Peer replication: which agents each agent sends its ranks' in-memory
// snapshots to (docs/coordinator.md, "Peer replication"). A pure function of
// the membership, so that it is tested alone; CoordinatorCore calls it when
// the agents that take part change, and keeps the partnerships' tickets.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ckptd::coordinator {

// An alive agent that registered a peer address.
struct ReplicationMember {
  std::string node_id;
  std::string failure_domain;  // empty: the node is a domain of its own
  uint32_t replicas = 0;       // how many partners it sends to
};

// The domain a member is in: its failure_domain, or its node id.
const std::string& DomainOf(const ReplicationMember& m);

// What a sender gets: its partners in order, and whether there were enough
// eligible nodes for its `replicas`.
struct PartnerList {
  std::vector<std::string> partners;  // node ids
  uint32_t wanted = 0;                // the member's replicas
  bool short_of_wanted() const { return partners.size() < wanted; }
};

// The partners of every member (keyed by node id; a member with replicas 0
// gets an empty list). Rules:
//  - never the sender itself, never a node of the sender's failure domain;
//  - spread over distinct other domains first: at most one partner per
//    domain until every other domain has one, then further nodes of those
//    domains when `replicas` asks for more;
//  - fewer than `replicas` partners when there are not enough eligible nodes;
//  - deterministic (a function of the members alone, the same in every
//    process) and stable: the nodes sit on a ring ordered by a fixed hash of
//    their id, and each sender walks it starting after itself, so that one
//    node joining or leaving changes only the partnerships of the few
//    senders just before it on the ring.
// Members with the same node id twice: the first counts.
std::map<std::string, PartnerList> AssignPartners(const std::vector<ReplicationMember>& members);

// The ring position of `node_id`: a fixed 64-bit hash (FNV-1a, then the
// splitmix64 finalizer), the same on every platform and in every process.
uint64_t RingPosition(const std::string& node_id);

}  // namespace ckptd::coordinator
