// CoordinatorCore: peer replication. Each agent that registered a peer
// address sends its ranks' snapshots to partners the coordinator picks
// (replication.h) and learns them, with a ticket per partnership, from its
// heartbeat answers; each heartbeat lists the copies of steps the agent
// holds in memory, which restore plans and previews name as sources.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/host_port.h"
#include "base/random.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/coordinator_core_internal.h"
#include "coordinator/job.h"
#include "coordinator/replication.h"
#include "rpc/fetch_ticket.h"
#include "storage/layout.h"

namespace ckptd::coordinator {

using internal::CopyKey;
using internal::HeldCopy;

namespace internal {

absl::Status ValidateReplication(const ckptd::v1::RegisterAgentRequest& r) {
  const std::string& node = r.node_id();
  const std::string& address = r.peer_address();
  if (!address.empty()) {
    if (address.size() > kMaxPeerAddress) {
      return absl::InvalidArgumentError(absl::StrCat("node ", node, ": peer address is ", address.size(),
                                                     " characters; at most ", kMaxPeerAddress));
    }
    for (unsigned char c : address) {
      if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '_' && c != ':' && c != '[' && c != ']' &&
          c != '%') {
        return absl::InvalidArgumentError(absl::StrCat("node ", node, ": peer address \"",
                                                       absl::CHexEscape(address), "\" is not host:port"));
      }
    }
    absl::StatusOr<std::pair<std::string, uint16_t>> hp = base::ParseHostPort(address, base::PortUse::kConnect);
    if (!hp.ok()) return absl::InvalidArgumentError(absl::StrCat("node ", node, ": peer address ", hp.status().message()));
    if (hp->first.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("node ", node, ": peer address \"", address, "\" names no host"));
    }
  }
  if (!r.failure_domain().empty()) {
    if (absl::Status s = storage::ValidateJobName(r.failure_domain()); !s.ok()) {
      std::string message(s.message());
      if (absl::StartsWith(message, "job name")) message.replace(0, 8, "failure domain");
      return absl::InvalidArgumentError(absl::StrCat("node ", node, ": ", message));
    }
  }
  if (r.replicas() > kMaxReplicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", node, " asks for ", r.replicas(), " replication partners; at most ", kMaxReplicas));
  }
  return absl::OkStatus();
}

}  // namespace internal

const CoordinatorCore::Agent* CoordinatorCore::AliveAgent(const std::string& node) const {
  auto it = agents_.find(node);
  return it == agents_.end() || !it->second->alive ? nullptr : it->second.get();
}

void CoordinatorCore::MaybeRecomputePartners(absl::Time now, bool force) {
  if (!partners_dirty_ || (!force && now - partners_computed_ < options_.partners_recompute_every)) return;
  partners_dirty_ = false;
  partners_computed_ = now;
  std::vector<ReplicationMember> members;
  for (auto& [node, agent] : agents_) {
    agent->send_to.clear();
    agent->receive_from.clear();
    if (agent->alive && !agent->peer_address.empty()) {
      members.push_back({node, agent->failure_domain, agent->replicas});
    }
  }
  const std::map<std::string, PartnerList> lists = AssignPartners(members);
  std::map<std::pair<std::string, std::string>, std::string> tickets;
  for (const auto& [node, list] : lists) {
    Agent& sender = *agents_.at(node);
    for (const std::string& partner : list.partners) {
      std::pair<std::string, std::string> pair(node, partner);
      auto old = tickets_.find(pair);
      std::string ticket;
      if (old != tickets_.end()) {
        ticket = std::move(old->second);
      } else {
        absl::StatusOr<std::string> fresh = base::RandomHex(16);
        if (!fresh.ok()) {
          // No partnership without a ticket nobody can guess; the next
          // recomputation tries again.
          logger_->Warning(absl::StrCat("no ticket for the replication of node ", node, " to node ", partner, ": ",
                                        fresh.status().ToString()));
          partners_dirty_ = true;
          continue;
        }
        ticket = *std::move(fresh);
      }
      tickets.emplace(std::move(pair), std::move(ticket));
      sender.send_to.push_back(partner);
      agents_.at(partner)->receive_from.push_back(node);
    }
    // Fewer partners than asked for: said once per change, not at every
    // recomputation.
    const size_t got = sender.send_to.size();
    if (got < list.wanted && sender.short_of_partners_logged != got) {
      logger_->Warning(absl::StrCat("node ", node, " asks for ", list.wanted, " replication partners; it has ", got,
                                    ": there are not enough agents with a peer address in other failure domains"));
      sender.short_of_partners_logged = got;
    } else if (got >= list.wanted) {
      sender.short_of_partners_logged = SIZE_MAX;
    }
  }
  // Pairs that ended lose their ticket: one that comes back gets a new one.
  tickets_ = std::move(tickets);
}

void CoordinatorCore::EndReplication(Agent* agent) {
  const std::string& node = agent->node_id;
  if (!agent->peer_address.empty() || !agent->send_to.empty() || !agent->receive_from.empty()) {
    partners_dirty_ = true;
  }
  auto drop = [&](std::vector<std::string>& list) { list.erase(std::remove(list.begin(), list.end(), node), list.end()); };
  for (const std::string& other : agent->send_to) {
    if (auto it = agents_.find(other); it != agents_.end()) drop(it->second->receive_from);
  }
  for (const std::string& other : agent->receive_from) {
    if (auto it = agents_.find(other); it != agents_.end()) drop(it->second->send_to);
  }
  agent->send_to.clear();
  agent->receive_from.clear();
  for (auto it = tickets_.begin(); it != tickets_.end();) {
    it = it->first.first == node || it->first.second == node ? tickets_.erase(it) : std::next(it);
  }
  // Its memory is gone with it (or unreachable): no plan names it.
  for (const auto& [key, copy] : agent->memory) {
    auto h = holders_.find({key.job, key.rank});
    if (h == holders_.end()) continue;
    h->second.erase(node);
    if (h->second.empty()) holders_.erase(h);
  }
  agent->memory.clear();
}

void CoordinatorCore::RecordMemory(Agent* agent, const ckptd::v1::Heartbeat& hb) {
  std::map<CopyKey, HeldCopy> memory;
  size_t invalid = 0;
  const size_t listed = static_cast<size_t>(hb.memory_size());
  const size_t kept = std::min(listed, internal::kMaxMemoryCopies);
  for (size_t i = 0; i < kept; ++i) {
    const ckptd::v1::MemoryCopy& c = hb.memory(static_cast<int>(i));
    // Copies of jobs the coordinator does not know, of ranks outside the
    // job's world, or with a step or length no shard can have, say nothing
    // a plan could use. Checked before the job is looked up.
    if (!storage::ValidateJobName(c.job()).ok() || c.step() > internal::kMaxStep || c.file_length() == 0 ||
        c.file_length() > internal::kMaxShardBytes) {
      ++invalid;
      continue;
    }
    const Job* job = FindJob(c.job());
    if (job == nullptr || c.rank() >= job->world_size()) {
      ++invalid;
      continue;
    }
    // The holder is always the heartbeat's node: owner_node only says
    // whether the copy is of a rank the node hosts itself.
    memory.emplace(CopyKey{c.job(), c.rank(), c.step()},
                   HeldCopy{c.file_length(), c.index_xxh3(), c.owner_node() == agent->node_id});
  }
  if (listed > kept && !agent->memory_overflow_logged) {
    agent->memory_overflow_logged = true;
    logger_->Warning(absl::StrCat("node ", agent->node_id, "'s heartbeat lists ", listed,
                                  " copies in memory; only the first ", internal::kMaxMemoryCopies,
                                  " are kept (said once)"));
  }
  if (invalid > 0 && !agent->memory_invalid_logged) {
    agent->memory_invalid_logged = true;
    logger_->Warning(absl::StrCat("node ", agent->node_id, "'s heartbeat lists ", invalid,
                                  " copies in memory of unknown jobs, ranks outside their world or impossible "
                                  "steps or lengths; ignored (said once)"));
  }
  if (memory == agent->memory) return;
  const std::string& node = agent->node_id;
  for (const auto& [key, copy] : agent->memory) {
    auto h = holders_.find({key.job, key.rank});
    if (h == holders_.end()) continue;
    h->second.erase(node);
    if (h->second.empty()) holders_.erase(h);
  }
  for (const auto& [key, copy] : memory) holders_[{key.job, key.rank}].insert(node);
  agent->memory = std::move(memory);
}

void CoordinatorCore::AddPartners(const Agent& agent, ckptd::v1::HeartbeatAck* ack) const {
  auto add = [&](const std::string& other, const std::pair<std::string, std::string>& pair,
                 google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner>* out)
                 ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    const Agent* a = AliveAgent(other);
    auto ticket = tickets_.find(pair);
    if (a == nullptr || ticket == tickets_.end()) return;
    ckptd::v1::ReplicationPartner* p = out->Add();
    p->set_node_id(other);
    p->set_address(a->peer_address);
    p->set_failure_domain(a->failure_domain);
    p->set_ticket(ticket->second);
  };
  for (const std::string& to : agent.send_to) add(to, {agent.node_id, to}, ack->mutable_send_to());
  for (const std::string& from : agent.receive_from) add(from, {from, agent.node_id}, ack->mutable_receive_from());
}

namespace {

// Whether `copy` is of the committed shard of `rank` at `step`. The
// coordinator keeps every committed step's shard digests (from the commit,
// or the MANIFEST read at recovery), so the match is on the whole
// (file_length, index_xxh3) pair.
bool IsCommittedShard(const internal::Job& job, uint32_t rank, uint64_t step, const HeldCopy& copy) {
  const std::optional<internal::Job::ShardDigest> shard = job.CommittedShard(step, rank);
  return shard && shard->file_length == copy.file_length && shard->index_xxh3 == copy.index_xxh3;
}

}  // namespace

bool CoordinatorCore::HoldsOwnCopy(const Agent& agent, const Job& job, uint32_t rank, uint64_t step) const {
  auto it = agent.memory.find(CopyKey{job.name(), rank, step});
  return it != agent.memory.end() && it->second.own && IsCommittedShard(job, rank, step, it->second);
}

bool CoordinatorCore::CopyHeldBy(const Agent& agent, const Job& job, uint32_t rank, uint64_t step) const {
  auto it = agent.memory.find(CopyKey{job.name(), rank, step});
  return it != agent.memory.end() && IsCommittedShard(job, rank, step, it->second);
}

std::vector<const CoordinatorCore::Agent*> CoordinatorCore::PeerHolders(const Job& job, uint32_t rank, uint64_t step,
                                                                        const std::string& exclude,
                                                                        const std::string& domain) const {
  std::vector<const Agent*> found;
  auto h = holders_.find({job.name(), rank});
  if (h == holders_.end()) return found;
  const CopyKey key{job.name(), rank, step};
  for (const std::string& node : h->second) {
    if (node == exclude) continue;
    const Agent* a = AliveAgent(node);
    if (a == nullptr || a->peer_address.empty()) continue;
    auto copy = a->memory.find(key);
    if (copy == a->memory.end() || !IsCommittedShard(job, rank, step, copy->second)) continue;
    found.push_back(a);
  }
  // Another failure domain first: a failure that took the rank's node may
  // have taken its whole domain. Then by node id (holders_ is ordered).
  auto same_domain = [&](const Agent* a) {
    return !domain.empty() && (a->failure_domain.empty() ? a->node_id : a->failure_domain) == domain;
  };
  std::stable_partition(found.begin(), found.end(), [&](const Agent* a) { return !same_domain(a); });
  if (found.size() > internal::kMaxPlanPeers) found.resize(internal::kMaxPlanPeers);
  return found;
}

void CoordinatorCore::AddPlanPeers(const Agent& asker, const Job& job, uint32_t rank,
                                   ckptd::v1::RestorePlanResponse* plan) const {
  if (plan->verdict() != ckptd::v1::RestorePlanResponse::LOAD) return;
  const std::string domain = asker.failure_domain.empty() ? asker.node_id : asker.failure_domain;
  for (const Agent* a : PeerHolders(job, rank, plan->step(), asker.node_id, domain)) {
    ckptd::v1::PeerCopy* p = plan->add_peers();
    p->set_node_id(a->node_id);
    p->set_address(a->peer_address);
    p->set_ticket(rpc::FetchTicket(a->fetch_key, asker.node_id, job.name(), rank, plan->step()));
  }
}

void CoordinatorCore::AddRankSources(const Job& job, uint64_t step, ckptd::v1::RestorePreview* preview) const {
  for (uint32_t r = 0; r < job.world_size(); ++r) {
    ckptd::v1::RankRestoreSources* s = preview->add_ranks();
    s->set_rank(r);
    const Agent* host = nullptr;
    if (auto it = job.ranks().find(r); it != job.ranks().end()) host = AliveAgent(it->second.node_id);
    std::string domain;
    if (host != nullptr) {
      s->set_node_id(host->node_id);
      s->set_own_memory(HoldsOwnCopy(*host, job, r, step));
      domain = host->failure_domain.empty() ? host->node_id : host->failure_domain;
    }
    for (const Agent* a : PeerHolders(job, r, step, s->node_id(), domain)) s->add_peer_nodes(a->node_id);
    s->set_planned(s->own_memory()           ? ckptd::v1::AGENT_MEMORY
                   : s->peer_nodes_size() > 0 ? ckptd::v1::PEER_MEMORY
                                              : ckptd::v1::STORAGE_ROOT);
  }
}

uint32_t CoordinatorCore::PeerCopies(const Job& job, uint64_t step) const {
  uint32_t n = 0;
  // Only ranks some agent lists: a job of a million ranks without peer
  // replication costs nothing here.
  for (auto h = holders_.lower_bound({job.name(), 0}); h != holders_.end() && h->first.first == job.name(); ++h) {
    const uint32_t rank = h->first.second;
    std::string host;
    if (auto it = job.ranks().find(rank); it != job.ranks().end() && AliveAgent(it->second.node_id) != nullptr) {
      host = it->second.node_id;
    }
    if (!PeerHolders(job, rank, step, host, "").empty()) ++n;
  }
  return n;
}

}  // namespace ckptd::coordinator
