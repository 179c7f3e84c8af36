#include "coordinator/replication.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace ckptd::coordinator {

const std::string& DomainOf(const ReplicationMember& m) {
  return m.failure_domain.empty() ? m.node_id : m.failure_domain;
}

uint64_t RingPosition(const std::string& node_id) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (unsigned char c : node_id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  // splitmix64's finalizer: FNV alone leaves ids that differ in the last
  // character next to each other on the ring.
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

namespace {

struct RingNode {
  uint64_t position;
  const ReplicationMember* member;
  size_t domain;  // an index into the domains
};

}  // namespace

std::map<std::string, PartnerList> AssignPartners(const std::vector<ReplicationMember>& members) {
  std::map<std::string, PartnerList> out;
  std::vector<RingNode> ring;
  std::map<std::string, size_t> domains;
  for (const ReplicationMember& m : members) {
    if (out.count(m.node_id) > 0) continue;  // the first counts
    out[m.node_id].wanted = m.replicas;
    const size_t domain = domains.emplace(DomainOf(m), domains.size()).first->second;
    ring.push_back({RingPosition(m.node_id), &m, domain});
  }
  const size_t n = ring.size();
  if (n < 2 || domains.size() < 2) return out;
  std::sort(ring.begin(), ring.end(), [](const RingNode& a, const RingNode& b) {
    return std::tie(a.position, a.member->node_id) < std::tie(b.position, b.member->node_id);
  });
  std::vector<size_t> domain_size(domains.size(), 0);
  for (const RingNode& r : ring) ++domain_size[r.domain];
  // skip[i]: how far past i the next node of another domain than i's is (a
  // run of one domain is crossed in one step). There is one: domains >= 2.
  std::vector<size_t> skip(n, 0);
  for (size_t k = 2 * n; k-- > 0;) {
    const size_t i = k % n, next = (k + 1) % n;
    skip[i] = ring[next].domain != ring[i].domain ? 1 : (skip[next] == 0 ? 0 : skip[next] + 1);
  }
  for (size_t i = 0; i < n; ++i) {
    const ReplicationMember& sender = *ring[i].member;
    PartnerList& list = out[sender.node_id];
    if (sender.replicas == 0) continue;
    const size_t own = ring[i].domain;
    const size_t foreign_nodes = n - domain_size[own];
    const size_t foreign_domains = domains.size() - 1;
    // The next node after ring position p that is not in the sender's domain.
    auto next = [&](size_t p) {
      size_t q = (p + 1) % n;
      if (ring[q].domain == own) q = (q + skip[q]) % n;
      return q;
    };
    std::vector<size_t> picked;  // ring positions, in the order taken
    std::vector<size_t> picked_domains;
    auto has = [](const std::vector<size_t>& v, size_t x) { return std::find(v.begin(), v.end(), x) != v.end(); };
    // 1. One node per other domain, the first met on the walk, until every
    //    other domain has one or the sender has its replicas.
    const size_t first_round = std::min<size_t>(sender.replicas, foreign_domains);
    size_t p = i;
    for (size_t seen = 0; seen < foreign_nodes && picked.size() < first_round; ++seen) {
      p = next(p);
      if (has(picked_domains, ring[p].domain)) continue;
      picked.push_back(p);
      picked_domains.push_back(ring[p].domain);
    }
    // 2. Further nodes of those domains, in the walk's order.
    p = i;
    for (size_t seen = 0; seen < foreign_nodes && picked.size() < sender.replicas; ++seen) {
      p = next(p);
      if (!has(picked, p)) picked.push_back(p);
    }
    for (size_t q : picked) list.partners.push_back(ring[q].member->node_id);
  }
  return out;
}

}  // namespace ckptd::coordinator
