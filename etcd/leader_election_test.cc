// Leader election and fencing against a real etcd.
#include "etcd/leader_election.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "etcd/testing_etcd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::etcd {
namespace {

using ::ckptd::testing::Eventually;
using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kKey[] = "/ckptd/test/leader";

struct Replica {
  std::unique_ptr<EtcdClient> client;
  std::unique_ptr<LeaderElection> election;
};

Replica MakeReplica(const std::string& endpoints, const std::string& name, int64_t ttl = 2) {
  EtcdOptions o;
  o.endpoints = {endpoints};
  o.attempt_timeout = absl::Milliseconds(700);
  Replica r;
  r.client = std::move(EtcdClient::Connect(o).value());
  ElectionOptions e;
  e.key = kKey;
  e.candidate = name;
  e.lease_ttl_seconds = ttl;
  e.keepalive_every = absl::Milliseconds(500);
  e.poll_every = absl::Milliseconds(100);
  r.election = std::make_unique<LeaderElection>(r.client.get(), e);
  return r;
}

// The index of the one replica that leads, or -1 (none, or more than one).
int TheLeader(const std::vector<Replica>& rs) {
  int leader = -1;
  for (size_t i = 0; i < rs.size(); ++i) {
    if (rs[i].election->Leading().ok()) {
      if (leader != -1) return -1;
      leader = static_cast<int>(i);
    }
  }
  return leader;
}

// A write guarded by `epoch`: whether etcd applied it.
bool GuardedPut(EtcdClient& c, const LeaderElection& e, int64_t epoch, const std::string& value) {
  pb::TxnRequest txn;
  *txn.add_compare() = e.Guard(epoch);
  *txn.add_success() = PutOp("/ckptd/test/state", value);
  absl::StatusOr<pb::TxnResponse> r = c.Txn(txn);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() && r->succeeded();
}

TEST(LeaderElection, RefusesAnEmptyKeyOrCandidate) {
  EtcdOptions o;
  o.endpoints = {"127.0.0.1:1"};
  std::unique_ptr<EtcdClient> c = std::move(EtcdClient::Connect(o).value());
  LeaderElection no_key(c.get(), ElectionOptions{.key = "", .candidate = "a:1"});
  EXPECT_THAT(no_key.Start(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key")));
  LeaderElection no_name(c.get(), ElectionOptions{.key = kKey, .candidate = ""});
  EXPECT_THAT(no_name.Start(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("candidate")));
  LeaderElection ttl(c.get(), ElectionOptions{.key = kKey, .candidate = "a:1", .lease_ttl_seconds = 0});
  EXPECT_THAT(ttl.Start(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("TTL")));
}

TEST(LeaderElection, OneOfThreeLeadsAndTheOthersNameIt) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  std::vector<Replica> rs;
  for (int i = 0; i < 3; ++i) rs.push_back(MakeReplica(etcd->endpoints(), absl::StrCat("coord-", i, ":7000")));
  for (Replica& r : rs) ASSERT_TRUE(r.election->Start().ok());
  ASSERT_TRUE(Eventually([&] { return TheLeader(rs) >= 0; }));
  const int leader = TheLeader(rs);
  const int64_t epoch = rs[leader].election->Leading().value();
  EXPECT_GT(epoch, 0);
  for (size_t i = 0; i < rs.size(); ++i) {
    if (static_cast<int>(i) == leader) continue;
    ASSERT_TRUE(Eventually([&] { return rs[i].election->Leader().epoch == epoch; }));
    const LeaderInfo info = rs[i].election->Leader();
    EXPECT_FALSE(info.self);
    EXPECT_EQ(info.candidate, absl::StrCat("coord-", leader, ":7000"));
    EXPECT_THAT(rs[i].election->Leading(),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(absl::StrCat("coord-", leader))));
  }
  // Stays one leader for a while (several keep-alives).
  absl::SleepFor(absl::Seconds(3));
  EXPECT_EQ(TheLeader(rs), leader);
  EXPECT_EQ(rs[leader].election->Leading().value_or(0), epoch);
}

TEST(LeaderElection, AStoppedLeaderHandsOverAtOnceWithAGreaterEpoch) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  std::vector<Replica> rs;
  rs.push_back(MakeReplica(etcd->endpoints(), "a:1", /*ttl=*/10));
  ASSERT_TRUE(rs[0].election->Start().ok());
  ASSERT_TRUE(Eventually([&] { return rs[0].election->Leading().ok(); }));
  const int64_t first = rs[0].election->Leading().value();
  rs.push_back(MakeReplica(etcd->endpoints(), "b:1", /*ttl=*/10));
  ASSERT_TRUE(rs[1].election->Start().ok());
  ASSERT_TRUE(Eventually([&] { return rs[1].election->Leader().epoch == first; }));
  const absl::Time stopped = absl::Now();
  rs[0].election->Stop();
  // Resigning deletes the key: no wait for the 10 s TTL.
  ASSERT_TRUE(Eventually([&] { return rs[1].election->Leading().ok(); }, absl::Seconds(5)));
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(3));
  EXPECT_GT(rs[1].election->Leading().value(), first);
  EXPECT_FALSE(GuardedPut(*rs[0].client, *rs[0].election, first, "from the old leader"));
  EXPECT_TRUE(GuardedPut(*rs[1].client, *rs[1].election, rs[1].election->Leading().value(), "from the new"));
}

TEST(LeaderElection, APausedLeaderIsFencedStepsDownAndItsWritesAreRefused) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  std::vector<Replica> rs;
  rs.push_back(MakeReplica(etcd->endpoints(), "a:1"));
  ASSERT_TRUE(rs[0].election->Start().ok());
  ASSERT_TRUE(Eventually([&] { return rs[0].election->Leading().ok(); }));
  const int64_t old_epoch = rs[0].election->Leading().value();
  EXPECT_TRUE(GuardedPut(*rs[0].client, *rs[0].election, old_epoch, "a while leading"));
  rs.push_back(MakeReplica(etcd->endpoints(), "b:1"));
  ASSERT_TRUE(rs[1].election->Start().ok());

  // The leader stops renewing (as a SIGSTOPped or partitioned one would).
  const absl::Time paused = absl::Now();
  rs[0].election->PauseKeepAliveForTesting(true);
  ASSERT_TRUE(Eventually([&] { return rs[1].election->Leading().ok(); }, absl::Seconds(10)));
  const absl::Duration failover = absl::Now() - paused;
  // TTL 2 s (etcd's minimum with its default election timeout) + a poll.
  EXPECT_LT(failover, absl::Seconds(5)) << failover;
  const int64_t new_epoch = rs[1].election->Leading().value();
  EXPECT_GT(new_epoch, old_epoch);

  // The old leader's own clock has told it too: it no longer claims to lead.
  EXPECT_THAT(rs[0].election->Leading(), StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  // Whatever it believes, etcd refuses its writes.
  EXPECT_FALSE(GuardedPut(*rs[0].client, *rs[0].election, old_epoch, "a after losing"));
  rs[0].election->PauseKeepAliveForTesting(false);
  ASSERT_TRUE(Eventually([&] { return rs[0].election->Leader().epoch == new_epoch; }));
  EXPECT_EQ(rs[0].election->Leader().candidate, "b:1");
  EXPECT_EQ(TheLeader(rs), 1);
  pb::RangeRequest read;
  read.set_key("/ckptd/test/state");
  EXPECT_EQ(rs[1].client->Range(read).value().kvs(0).value(), "a while leading");
}

TEST(LeaderElection, FencedStepsDownAtOnceAndADeletedKeyIsNoticed) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  Replica a = MakeReplica(etcd->endpoints(), "a:1", /*ttl=*/10);
  ASSERT_TRUE(a.election->Start().ok());
  ASSERT_TRUE(Eventually([&] { return a.election->Leading().ok(); }));
  const int64_t epoch = a.election->Leading().value();
  a.election->Fenced(epoch + 1, "not this epoch");  // another epoch: ignored
  EXPECT_TRUE(a.election->Leading().ok());
  a.election->Fenced(epoch, "test");
  // While none leads, a write is refused with the reason this one stepped down.
  EXPECT_THAT(a.election->Leading(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(absl::StrCat("leadership (epoch ", epoch, ") ended: a write of epoch ", epoch,
                                              " was refused by etcd (test)"))));
  // Its lease is revoked as it steps down, so it campaigns again at once
  // and leads under a new epoch (not the old lease's 10 s later).
  ASSERT_TRUE(Eventually([&] { return a.election->Leading().ok(); }, absl::Seconds(5)));
  const int64_t second = a.election->Leading().value();
  EXPECT_GT(second, epoch);
  // An operator deletes the key by hand: the leader notices at its next renewal.
  ASSERT_TRUE(etcd->Ctl(absl::StrCat("del ", kKey)).ok());
  ASSERT_TRUE(Eventually([&] { return a.election->Leading().value_or(0) != second; }, absl::Seconds(5)));
}

// With the binary's default lease (3 s, renewed every second), losing the
// etcd member that leads etcd's raft (etcd answers nothing for a second or
// two while it elects another) does not cost the leadership: a renewal that
// failed is tried again at once, not a period later. What etcd itself took
// to answer again is measured beside it (a second client writing every
// 50 ms): when a loaded machine made etcd's own election outlast what the
// lease can cover (the lease runs out at the earliest 2 s after the loss),
// losing the leadership is right and the test says so instead of failing.
TEST(LeaderElection, KeepsItsLeadershipWhenEtcdsRaftLeaderDiesWithTheDefaultLease) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 3);
  EtcdOptions o;
  o.endpoints = ParseEndpoints(etcd->endpoints()).value();
  std::unique_ptr<EtcdClient> client = std::move(EtcdClient::Connect(o).value());
  EtcdOptions probe_options = o;
  probe_options.attempt_timeout = absl::Milliseconds(200);
  std::unique_ptr<EtcdClient> probe = std::move(EtcdClient::Connect(probe_options).value());
  ElectionOptions e;
  e.key = kKey;
  e.candidate = "c0:1";
  e.lease_ttl_seconds = 3;
  e.keepalive_every = absl::Seconds(1);
  e.poll_every = absl::Milliseconds(250);
  LeaderElection election(client.get(), e);
  ASSERT_TRUE(election.Start().ok());
  ASSERT_TRUE(Eventually([&] { return election.Leading().ok(); }));
  const int64_t epoch = election.Leading().value();
  int raft_leader = -1;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<pb::StatusResponse> s = client->MemberStatus(i);
    if (s.ok() && s->leader() != 0 && s->leader() == s->header().member_id()) raft_leader = i;
  }
  ASSERT_GE(raft_leader, 0);
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(etcd->Kill(raft_leader).ok());
  // Watched for two lease terms after the loss, while the probe writes.
  const absl::Time end = killed + absl::Seconds(6);
  absl::Duration etcd_out = absl::InfiniteDuration();  // until etcd took a write again
  absl::Duration lost_after = absl::InfiniteDuration();
  while (absl::Now() < end) {
    if (etcd_out == absl::InfiniteDuration()) {
      pb::PutRequest put;
      put.set_key("/ckptd/test/probe");
      put.set_value("x");
      if (probe->Put(put).ok()) etcd_out = absl::Now() - killed;
    }
    if (lost_after == absl::InfiniteDuration() && election.Leading().value_or(0) != epoch) {
      lost_after = absl::Now() - killed;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (lost_after == absl::InfiniteDuration()) return;  // kept: what the test is for
  if (etcd_out >= absl::Milliseconds(1800)) {
    GTEST_SKIP() << "etcd took " << absl::FormatDuration(etcd_out)
                 << " to take a write again after its raft leader died (a loaded machine): longer than a 3 s "
                    "lease renewed every second can cover, so losing the leadership after "
                 << absl::FormatDuration(lost_after) << " was right";
  }
  ADD_FAILURE() << "the leadership was lost " << absl::FormatDuration(lost_after)
                << " after etcd's raft leader died, although etcd took a write again after "
                << absl::FormatDuration(etcd_out);
}

TEST(LeaderElection, SurvivesAnEtcdMemberAndStepsDownWithoutQuorumThenComesBack) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 3);
  std::vector<Replica> rs;
  // A TTL well above etcd's own leader election (1 s), which losing the
  // member that led etcd's raft starts.
  for (int i = 0; i < 2; ++i) rs.push_back(MakeReplica(etcd->endpoints(), absl::StrCat("c", i, ":1"), /*ttl=*/5));
  for (Replica& r : rs) ASSERT_TRUE(r.election->Start().ok());
  ASSERT_TRUE(Eventually([&] { return TheLeader(rs) >= 0; }));
  const int leader = TheLeader(rs);
  const int64_t epoch = rs[leader].election->Leading().value();

  // One etcd member of three dies: the leadership holds.
  ASSERT_TRUE(etcd->Kill(0).ok());
  absl::SleepFor(absl::Seconds(4));
  EXPECT_EQ(TheLeader(rs), leader);
  EXPECT_EQ(rs[leader].election->Leading().value_or(0), epoch);

  // A second dies: no quorum, no renewal, the leader steps down within its TTL.
  ASSERT_TRUE(etcd->Kill(1).ok());
  ASSERT_TRUE(Eventually([&] { return TheLeader(rs) == -1 && !rs[leader].election->Leading().ok(); },
                         absl::Seconds(12)));

  // Quorum returns: one leads again, under a greater epoch.
  ASSERT_TRUE(etcd->Restart(0, /*wait_healthy=*/false).ok());
  ASSERT_TRUE(etcd->Restart(1, /*wait_healthy=*/false).ok());
  ASSERT_TRUE(Eventually([&] { return TheLeader(rs) >= 0; }, absl::Seconds(30)));
  EXPECT_GT(rs[TheLeader(rs)].election->Leading().value(), epoch);
}

}  // namespace
}  // namespace ckptd::etcd
