#include "coordinator/replication.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAre;

// `per_domain` nodes in each of `domains` racks: "rack<d>-n<i>" in "rack<d>".
std::vector<ReplicationMember> Racks(int domains, int per_domain, uint32_t replicas) {
  std::vector<ReplicationMember> m;
  for (int d = 0; d < domains; ++d) {
    for (int i = 0; i < per_domain; ++i) {
      m.push_back({absl::StrCat("rack", d, "-n", i), absl::StrCat("rack", d), replicas});
    }
  }
  return m;
}

std::map<std::string, std::string> DomainMap(const std::vector<ReplicationMember>& members) {
  std::map<std::string, std::string> d;
  for (const auto& m : members) d[m.node_id] = DomainOf(m);
  return d;
}

// The rules every assignment keeps: never itself, never its own domain, no
// partner twice, at most `replicas`, and one per other domain before a
// second in any.
void ExpectRules(const std::vector<ReplicationMember>& members, const std::map<std::string, PartnerList>& got) {
  const std::map<std::string, std::string> domain = DomainMap(members);
  std::set<std::string> domains;
  for (const auto& [node, d] : domain) domains.insert(d);
  for (const ReplicationMember& m : members) {
    SCOPED_TRACE(m.node_id);
    ASSERT_TRUE(got.count(m.node_id));
    const std::vector<std::string>& p = got.at(m.node_id).partners;
    EXPECT_LE(p.size(), m.replicas);
    std::set<std::string> distinct(p.begin(), p.end());
    EXPECT_EQ(distinct.size(), p.size()) << "a partner twice";
    std::map<std::string, int> per_domain;
    for (const std::string& q : p) {
      EXPECT_NE(q, m.node_id);
      EXPECT_NE(domain.at(q), DomainOf(m)) << q << " is in the sender's domain";
      ++per_domain[domain.at(q)];
    }
    const size_t other_domains = domains.size() - 1;
    if (p.size() <= other_domains) {
      for (const auto& [d, n] : per_domain) EXPECT_EQ(n, 1) << "two partners in " << d << " before every domain has one";
    } else {
      EXPECT_EQ(per_domain.size(), other_domains) << "a domain left out while another has two";
    }
  }
}

TEST(PartnerAssignmentTest, OnePartnerPerOtherDomainFirst) {
  const std::vector<ReplicationMember> members = Racks(4, 3, 3);
  const auto got = AssignPartners(members);
  ExpectRules(members, got);
  const auto domain = DomainMap(members);
  for (const auto& m : members) {
    const auto& p = got.at(m.node_id).partners;
    ASSERT_THAT(p, SizeIs(3));
    std::set<std::string> ds;
    for (const auto& q : p) ds.insert(domain.at(q));
    EXPECT_EQ(ds.size(), 3u) << m.node_id << ": its three partners are in the three other racks";
    EXPECT_FALSE(got.at(m.node_id).short_of_wanted());
  }
}

TEST(PartnerAssignmentTest, MoreReplicasThanOtherDomainsTakesFurtherNodesOfThem) {
  const std::vector<ReplicationMember> members = Racks(3, 4, 5);
  const auto got = AssignPartners(members);
  ExpectRules(members, got);
  const auto domain = DomainMap(members);
  for (const auto& m : members) {
    const auto& p = got.at(m.node_id).partners;
    ASSERT_THAT(p, SizeIs(5));
    // The first two: one in each other rack.
    EXPECT_NE(domain.at(p[0]), domain.at(p[1]));
  }
}

TEST(PartnerAssignmentTest, NotEnoughEligibleNodesGivesFewerAndSaysSo) {
  // Two racks of two: two eligible nodes per sender, which wants three.
  const std::vector<ReplicationMember> members = Racks(2, 2, 3);
  const auto got = AssignPartners(members);
  ExpectRules(members, got);
  for (const auto& m : members) {
    EXPECT_THAT(got.at(m.node_id).partners, SizeIs(2));
    EXPECT_TRUE(got.at(m.node_id).short_of_wanted());
    EXPECT_EQ(got.at(m.node_id).wanted, 3u);
  }
}

TEST(PartnerAssignmentTest, OneDomainGivesNoPartners) {
  const std::vector<ReplicationMember> members = Racks(1, 5, 2);
  const auto got = AssignPartners(members);
  ASSERT_THAT(got, SizeIs(5));
  for (const auto& [node, list] : got) {
    EXPECT_THAT(list.partners, IsEmpty()) << node;
    EXPECT_TRUE(list.short_of_wanted());
  }
}

TEST(PartnerAssignmentTest, AnEmptyDomainIsTheNodeAlone) {
  std::vector<ReplicationMember> members = {{"a", "", 2}, {"b", "", 2}, {"c", "", 2}};
  const auto got = AssignPartners(members);
  ExpectRules(members, got);
  EXPECT_THAT(got.at("a").partners, UnorderedElementsAre("b", "c"));
  EXPECT_THAT(got.at("b").partners, UnorderedElementsAre("a", "c"));
  // A node named like another's domain is in that domain.
  members = {{"a", "", 1}, {"x", "a", 1}};
  EXPECT_THAT(AssignPartners(members).at("a").partners, IsEmpty());
}

TEST(PartnerAssignmentTest, ZeroReplicasSendsToNobodyButReceives) {
  const std::vector<ReplicationMember> members = {{"a", "r1", 0}, {"b", "r2", 1}};
  const auto got = AssignPartners(members);
  EXPECT_THAT(got.at("a").partners, IsEmpty());
  EXPECT_FALSE(got.at("a").short_of_wanted());
  EXPECT_THAT(got.at("b").partners, ElementsAre("a"));
}

TEST(PartnerAssignmentTest, DeterministicWhateverTheInputOrder) {
  std::vector<ReplicationMember> members = Racks(5, 6, 2);
  const auto first = AssignPartners(members);
  std::reverse(members.begin(), members.end());
  const auto second = AssignPartners(members);
  for (const auto& [node, list] : first) EXPECT_EQ(list.partners, second.at(node).partners) << node;
  // And the ring is a fixed function of the ids (the same in every process).
  EXPECT_EQ(RingPosition("node-a"), RingPosition("node-a"));
  EXPECT_NE(RingPosition("node-a"), RingPosition("node-b"));
  EXPECT_EQ(RingPosition(""), 0xf52a15e9a9b5e89bull) << "the hash changed: every partnership would move";
  EXPECT_EQ(RingPosition("node-a"), 0x82995e46723a0e5full);
}

TEST(PartnerAssignmentTest, LoadIsSpreadNotPiledOnOneNodePerDomain) {
  // Eight racks of eight, one partner each: a walk over nodes ordered by
  // rack would send all of a rack's copies to the first node of the next.
  const std::vector<ReplicationMember> members = Racks(8, 8, 1);
  const auto got = AssignPartners(members);
  ExpectRules(members, got);
  std::map<std::string, int> received;
  for (const auto& [node, list] : got) {
    for (const auto& q : list.partners) ++received[q];
  }
  int most = 0;
  for (const auto& [node, n] : received) most = std::max(most, n);
  EXPECT_LE(most, 5) << "one node receives the copies of " << most << " senders";
  EXPECT_GE(received.size(), 32u) << "only " << received.size() << " of 64 nodes receive anything";
}

TEST(PartnerAssignmentTest, OneNodeJoiningMovesFewPartnerships) {
  for (uint32_t replicas : {1u, 2u, 3u, 6u}) {
    SCOPED_TRACE(absl::StrCat("replicas ", replicas));
    std::vector<ReplicationMember> members = Racks(5, 8, replicas);
    const auto before = AssignPartners(members);
    for (int j = 0; j < 10; ++j) {
      std::vector<ReplicationMember> grown = members;
      const std::string joined = absl::StrCat("rack", j % 6, "-new", j);  // rack5 is a new domain
      grown.push_back({joined, absl::StrCat("rack", j % 6), replicas});
      const auto after = AssignPartners(grown);
      ExpectRules(grown, after);
      int changed = 0;
      for (const ReplicationMember& m : members) {
        const auto& b = before.at(m.node_id).partners;
        const auto& a = after.at(m.node_id).partners;
        std::set<std::string> bs(b.begin(), b.end()), as(a.begin(), a.end());
        if (bs == as) continue;
        ++changed;
        // The only change a sender sees: the newcomer in place of one partner.
        std::vector<std::string> gone, came;
        std::set_difference(bs.begin(), bs.end(), as.begin(), as.end(), std::back_inserter(gone));
        std::set_difference(as.begin(), as.end(), bs.begin(), bs.end(), std::back_inserter(came));
        EXPECT_THAT(came, ElementsAre(joined)) << m.node_id;
        EXPECT_THAT(gone, SizeIs(1)) << m.node_id;
      }
      if (j % 6 == 5 && replicas >= 4) {
        // A new domain while senders want more partners than there are other
        // domains: the rules give each a node there (in place of a second one
        // in another domain).
        EXPECT_EQ(changed, 40) << joined;
      } else {
        EXPECT_LE(changed, 10) << joined << " moved the partners of " << changed << " of 40 senders";
      }
    }
  }
}

TEST(PartnerAssignmentTest, OneNodeLeavingMovesOnlyItsOwnPartnerships) {
  const std::vector<ReplicationMember> members = Racks(4, 6, 2);
  const auto before = AssignPartners(members);
  std::vector<ReplicationMember> shrunk = members;
  const std::string left = shrunk[7].node_id;
  shrunk.erase(shrunk.begin() + 7);
  const auto after = AssignPartners(shrunk);
  ExpectRules(shrunk, after);
  for (const ReplicationMember& m : shrunk) {
    const auto& b = before.at(m.node_id).partners;
    if (std::find(b.begin(), b.end(), left) != b.end()) continue;  // it had to move
    EXPECT_EQ(std::set<std::string>(b.begin(), b.end()),
              std::set<std::string>(after.at(m.node_id).partners.begin(), after.at(m.node_id).partners.end()))
        << m.node_id << " did not send to " << left << " but its partners moved";
  }
}

TEST(PartnerAssignmentTest, ADuplicateNodeCountsOnce) {
  const std::vector<ReplicationMember> members = {{"a", "r1", 1}, {"a", "r2", 1}, {"b", "r2", 1}};
  const auto got = AssignPartners(members);
  ASSERT_THAT(got, SizeIs(2));
  EXPECT_THAT(got.at("a").partners, ElementsAre("b"));
  EXPECT_THAT(got.at("b").partners, ElementsAre("a"));
}

}  // namespace
}  // namespace ckptd::coordinator
