// The replica roster against a real etcd of three members.
#include "etcd/replica_roster.h"

#include <memory>
#include <string>
#include <vector>

#include "base/status_macros.h"  // base/testing/matchers.h uses its CONCAT macro
#include "base/testing/matchers.h"
#include "etcd/testing_etcd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::etcd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

std::unique_ptr<EtcdClient> Client(const std::string& endpoints) {
  EtcdOptions o;
  o.endpoints = ParseEndpoints(endpoints).value();
  o.attempt_timeout = absl::Milliseconds(700);
  return std::move(EtcdClient::Connect(o).value());
}

RosterOptions Options(const std::string& self) {
  RosterOptions o;
  o.prefix = "/ckptd/roster-test";
  o.self = self;
  o.ttl_seconds = 5;
  o.refresh_every = absl::Hours(1);  // the test refreshes by hand
  return o;
}

// Two replicas see each other; every member's health is reported (one raft
// leader, versions, database sizes); a member killed shows as unhealthy
// naming itself while the others stay healthy; a replica that stops drops
// out of the roster at once.
TEST(ReplicaRoster, ListsTheReplicasAndEachMembersHealth) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 3);
  std::unique_ptr<EtcdClient> ca = Client(etcd->endpoints());
  std::unique_ptr<EtcdClient> cb = Client(etcd->endpoints());
  ReplicaRoster a(ca.get(), Options("coord-a:7070"));
  ReplicaRoster b(cb.get(), Options("coord-b:7070"));
  EXPECT_EQ(a.View().checked, absl::InfinitePast());
  CKPTD_ASSERT_OK(a.Start());
  CKPTD_ASSERT_OK(b.Start());
  b.Refresh();
  a.Refresh();
  RosterView view = a.View();
  EXPECT_THAT(view.replicas, ElementsAre("coord-a:7070", "coord-b:7070"));
  ASSERT_THAT(view.members, SizeIs(3));
  int raft_leaders = 0;
  size_t follower = 0;  // a member that is not raft's leader: losing it costs no election
  for (size_t i = 0; i < view.members.size(); ++i) {
    const MemberHealth& m = view.members[i];
    EXPECT_TRUE(m.healthy) << m.endpoint << ": " << m.error;
    EXPECT_THAT(m.version, Not(IsEmpty()));
    EXPECT_GT(m.db_size_bytes, 0);
    raft_leaders += m.raft_leader;
    if (!m.raft_leader) follower = i;
  }
  EXPECT_EQ(raft_leaders, 1);
  EXPECT_EQ(view.members[2].endpoint, etcd->endpoint(2));

  CKPTD_ASSERT_OK(etcd->Kill(static_cast<int>(follower)));
  a.Refresh();
  view = a.View();
  ASSERT_THAT(view.members, SizeIs(3));
  for (size_t i = 0; i < view.members.size(); ++i) {
    EXPECT_EQ(view.members[i].healthy, i != follower) << view.members[i].endpoint << ": " << view.members[i].error;
  }
  EXPECT_THAT(view.members[follower].error, HasSubstr(etcd->endpoint(static_cast<int>(follower))));
  EXPECT_THAT(view.replicas, SizeIs(2));  // quorum holds: the roster still reads

  b.Stop();
  a.Refresh();
  EXPECT_THAT(a.View().replicas, ElementsAre("coord-a:7070"));
}

// Refreshes by a caller racing the roster's own thread grant one lease for
// the key, so that Stop() still withdraws the replica.
TEST(ReplicaRoster, StopWithdrawsEvenWhenRefreshesRace) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  std::unique_ptr<EtcdClient> ca = Client(etcd->endpoints());
  std::unique_ptr<EtcdClient> cb = Client(etcd->endpoints());
  ReplicaRoster a(ca.get(), Options("coord-a:7070"));
  for (int round = 0; round < 5; ++round) {
    RosterOptions o = Options("coord-b:7070");
    o.refresh_every = absl::Milliseconds(1);
    ReplicaRoster b(cb.get(), o);
    CKPTD_ASSERT_OK(b.Start());
    for (int i = 0; i < 20; ++i) b.Refresh();
    a.Refresh();
    EXPECT_THAT(a.View().replicas, ElementsAre("coord-a:7070", "coord-b:7070"));
    b.Stop();
    b.Refresh();  // after Stop: no announcement again
    a.Refresh();
    EXPECT_THAT(a.View().replicas, ElementsAre("coord-a:7070")) << "round " << round;
  }
}

// With etcd out of reach the roster keeps the last list it read, and says
// each member's error.
TEST(ReplicaRoster, KeepsTheLastListWhileEtcdIsOutOfReach) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  std::unique_ptr<EtcdClient> ca = Client(etcd->endpoints());
  std::unique_ptr<EtcdClient> cb = Client(etcd->endpoints());
  ReplicaRoster a(ca.get(), Options("coord-a:7070"));
  ReplicaRoster b(cb.get(), Options("coord-b:7070"));
  b.Refresh();
  a.Refresh();
  ASSERT_THAT(a.View().replicas, ElementsAre("coord-a:7070", "coord-b:7070"));
  CKPTD_ASSERT_OK(etcd->Kill(0));
  a.Refresh();
  RosterView view = a.View();
  EXPECT_THAT(view.replicas, ElementsAre("coord-a:7070", "coord-b:7070"));
  ASSERT_THAT(view.members, SizeIs(1));
  EXPECT_FALSE(view.members[0].healthy);
  EXPECT_THAT(view.members[0].error, HasSubstr(etcd->endpoint(0)));
}

TEST(ReplicaRoster, RefusesAnEmptyAddressOrAShortLease) {
  std::unique_ptr<EtcdClient> c = Client("127.0.0.1:1");
  RosterOptions o = Options("");
  EXPECT_FALSE(ReplicaRoster(c.get(), o).Start().ok());
  o = Options("a:1");
  o.ttl_seconds = 1;
  EXPECT_FALSE(ReplicaRoster(c.get(), o).Start().ok());
}

}  // namespace
}  // namespace ckptd::etcd
