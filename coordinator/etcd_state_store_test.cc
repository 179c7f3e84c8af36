// The state store on a real etcd: what only a replicated store must do
// (the conformance tests in state_store_test.cc cover the shared contract).
#include "coordinator/etcd_state_store.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "etcd/testing_etcd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::testing::Eventually;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::ckptd::v1::FailureEvent;
using ::ckptd::v1::JobRecord;
using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr char kPrefix[] = "/ckptd/test";

JobRecord Job(const std::string& name, uint64_t committed) {
  JobRecord r;
  r.set_job(name);
  r.set_world_size(4);
  r.set_checkpoints_committed(committed);
  return r;
}

FailureEvent Event(const std::string& job, int64_t nanos) {
  FailureEvent e;
  e.set_job(job);
  e.set_unix_nanos(nanos);
  e.set_kind(ckptd::v1::NODE_LOST);
  return e;
}

// A coordinator replica's view of etcd: its client, election and store.
struct Replica {
  std::unique_ptr<etcd::EtcdClient> client;
  std::unique_ptr<etcd::LeaderElection> election;
  std::unique_ptr<StateStore> store;

  static Replica Make(const std::string& endpoints, const std::string& name) {
    Replica r;
    etcd::EtcdOptions o;
    o.endpoints = {endpoints};
    o.attempt_timeout = absl::Milliseconds(700);
    r.client = std::move(etcd::EtcdClient::Connect(o).value());
    etcd::ElectionOptions e;
    e.key = absl::StrCat(kPrefix, "/leader");
    e.candidate = name;
    e.lease_ttl_seconds = 2;
    e.keepalive_every = absl::Milliseconds(500);
    e.poll_every = absl::Milliseconds(100);
    r.election = std::make_unique<etcd::LeaderElection>(r.client.get(), e);
    EXPECT_THAT(r.election->Start(), IsOk());
    return r;
  }
  absl::Status Open(size_t max_events = 10'000, uint64_t compact_every = 1000) {
    absl::StatusOr<std::unique_ptr<StateStore>> s =
        OpenEtcdStateStore(client.get(), election.get(), EtcdStateStoreOptions{kPrefix, max_events, compact_every});
    if (!s.ok()) return s.status();
    store = std::move(*s);
    return absl::OkStatus();
  }
};

TEST(EtcdKeyName, EscapesEverythingButSafeBytes) {
  EXPECT_EQ(EtcdKeyName("job-1_a.b"), "job-1_a.b");
  EXPECT_EQ(EtcdKeyName("a/b"), "a%2Fb");
  EXPECT_EQ(EtcdKeyName(std::string("a\0b", 3)), "a%00b");
  EXPECT_EQ(EtcdKeyName("50%"), "50%25");
  EXPECT_EQ(EtcdKeyName("\xff"), "%FF");
}

TEST(EtcdStateStore, RefusesAPrefixThatIsNotAnAbsoluteKeyPath) {
  etcd::EtcdOptions o;
  o.endpoints = {"127.0.0.1:1"};
  std::unique_ptr<etcd::EtcdClient> c = std::move(etcd::EtcdClient::Connect(o).value());
  etcd::LeaderElection e(c.get(), etcd::ElectionOptions{.key = "/k", .candidate = "a:1"});
  for (const char* bad : {"", "ckptd", "/ckptd/"}) {
    EXPECT_THAT(OpenEtcdStateStore(c.get(), &e, EtcdStateStoreOptions{bad, 10, 0}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must start with /")));
  }
}

TEST(EtcdStateStore, ANewLeaderReadsEverythingAndTheDeposedOneCannotWrite) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  Replica a = Replica::Make(etcd->endpoints(), "a:1");
  ASSERT_TRUE(Eventually([&] { return a.election->Leading().ok(); }));
  ASSERT_THAT(a.Open(), IsOk());
  ASSERT_THAT(a.store->PutJob(Job("train", 7)), IsOk());
  ASSERT_THAT(a.store->AppendEvent(Event("train", 100)), IsOk());
  ASSERT_THAT(a.store->PutQuarantine([] {
    ckptd::v1::QuarantinedStep q;
    q.set_job("train");
    q.set_step(40);
    q.set_reason("bad chunk");
    return q;
  }()),
              IsOk());

  Replica b = Replica::Make(etcd->endpoints(), "b:1");
  ASSERT_THAT(b.Open(), IsOk());
  ASSERT_TRUE(Eventually([&] { return b.election->Leader().epoch != 0; }));
  // A standby's store reads, but does not write.
  EXPECT_THAT(b.store->PutJob(Job("train", 99)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("the leader is a:1")));

  // a stops renewing (as if SIGSTOPped): b takes over and finds it all.
  a.election->PauseKeepAliveForTesting(true);
  ASSERT_TRUE(Eventually([&] { return b.election->Leading().ok(); }, absl::Seconds(10)));
  ASSERT_THAT(b.Open(), IsOk());
  absl::StatusOr<std::vector<JobRecord>> jobs = b.store->ListJobs();
  ASSERT_THAT(jobs, ::ckptd::testing::IsOkAndHolds(SizeIs(1)));
  EXPECT_EQ((*jobs)[0].checkpoints_committed(), 7u);
  EXPECT_THAT(b.store->ListEvents("train", 10), ::ckptd::testing::IsOkAndHolds(SizeIs(1)));
  EXPECT_THAT(b.store->ListQuarantined("train"), ::ckptd::testing::IsOkAndHolds(SizeIs(1)));

  // a resumes and, before its own clock tells it, tries to write: refused.
  ASSERT_THAT(b.store->PutJob(Job("train", 8)), IsOk());
  EXPECT_THAT(a.store->PutJob(Job("train", 6)), StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  EXPECT_THAT(a.store->AppendEvent(Event("train", 200)), StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  EXPECT_THAT(a.store->DeleteJob("train"), StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  a.election->PauseKeepAliveForTesting(false);
  EXPECT_FALSE(a.election->Leading().ok());
  jobs = b.store->ListJobs();
  ASSERT_THAT(jobs, ::ckptd::testing::IsOkAndHolds(SizeIs(1)));
  EXPECT_EQ((*jobs)[0].checkpoints_committed(), 8u);
  EXPECT_THAT(b.store->ListEvents("train", 10), ::ckptd::testing::IsOkAndHolds(SizeIs(1)));
}

TEST(EtcdStateStore, AWriteRefusedByTheGuardStepsTheElectionDown) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  Replica a = Replica::Make(etcd->endpoints(), "a:1");
  ASSERT_TRUE(Eventually([&] { return a.election->Leading().ok(); }));
  ASSERT_THAT(a.Open(), IsOk());
  // Someone else's key in its place (an operator, or a replica that took
  // over while this one's clock ran slow).
  ASSERT_TRUE(etcd->Ctl(absl::StrCat("put ", kPrefix, "/leader intruder:1")).ok());
  absl::Status s = a.store->PutJob(Job("x", 1));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("another coordinator leads")));
  EXPECT_FALSE(a.election->Leading().ok());
  EXPECT_THAT(etcd->Ctl(absl::StrCat("get --prefix ", kPrefix, "/state/")), ::ckptd::testing::IsOkAndHolds(""));
}

TEST(EtcdStateStore, TheEventCapHoldsAcrossReopening) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  Replica a = Replica::Make(etcd->endpoints(), "a:1");
  ASSERT_TRUE(Eventually([&] { return a.election->Leading().ok(); }));
  ASSERT_THAT(a.Open(/*max_events=*/5), IsOk());
  for (int i = 0; i < 8; ++i) ASSERT_THAT(a.store->AppendEvent(Event(i % 2 ? "odd" : "even", i)), IsOk());
  ASSERT_THAT(a.Open(/*max_events=*/3), IsOk());
  ASSERT_THAT(a.store->AppendEvent(Event("odd", 8)), IsOk());
  absl::StatusOr<std::vector<FailureEvent>> events = a.store->ListEvents("", 100);
  ASSERT_THAT(events, ::ckptd::testing::IsOkAndHolds(SizeIs(3)));
  EXPECT_EQ((*events)[0].unix_nanos(), 8);
  EXPECT_EQ((*events)[2].unix_nanos(), 6);
}

TEST(EtcdStateStore, CompactsEtcdsHistoryBehindItsWrites) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  Replica a = Replica::Make(etcd->endpoints(), "a:1");
  ASSERT_TRUE(Eventually([&] { return a.election->Leading().ok(); }));
  ASSERT_THAT(a.Open(10'000, /*compact_every=*/10), IsOk());
  for (int i = 0; i < 25; ++i) ASSERT_THAT(a.store->PutJob(Job("j", i)), IsOk());
  // Two compaction points passed: the history of the first writes is gone.
  etcd::pb::RangeRequest old;
  old.set_key(absl::StrCat(kPrefix, "/state/jobs/j"));
  old.set_revision(3);
  EXPECT_THAT(a.client->Range(old), StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("compacted")));
  absl::StatusOr<std::vector<JobRecord>> jobs = a.store->ListJobs();
  ASSERT_THAT(jobs, ::ckptd::testing::IsOkAndHolds(SizeIs(1)));
  EXPECT_EQ((*jobs)[0].checkpoints_committed(), 24u);
}

TEST(EtcdStateStore, WithoutQuorumWritesFailSayingWhyAndNothingCommittedIsLost) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 3);
  Replica a = Replica::Make(etcd->endpoints(), "a:1");
  ASSERT_TRUE(Eventually([&] { return a.election->Leading().ok(); }));
  ASSERT_THAT(a.Open(), IsOk());
  ASSERT_THAT(a.store->PutJob(Job("train", 1)), IsOk());
  // One member of three lost: writes go on (once the other two have a raft
  // leader, if the one lost led them).
  ASSERT_TRUE(etcd->Kill(2).ok());
  ASSERT_TRUE(Eventually([&] { return a.store->PutJob(Job("train", 2)).ok(); }, absl::Seconds(15)));
  // Two lost: a write fails naming etcd (or the leadership that lapsed).
  ASSERT_TRUE(etcd->Kill(1).ok());
  absl::Status s = a.store->PutJob(Job("train", 3));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), ::testing::AnyOf(HasSubstr("etcd 127.0.0.1:"), HasSubstr("leadership")));
  // Quorum returns: a leader (this replica again, under a new epoch) reads
  // what was committed.
  ASSERT_TRUE(etcd->Restart(1, /*wait_healthy=*/false).ok());
  ASSERT_TRUE(etcd->Restart(2, /*wait_healthy=*/false).ok());
  ASSERT_TRUE(Eventually([&] { return a.election->Leading().ok(); }, absl::Seconds(30)));
  // The members just restarted may still be catching up: a read that misses
  // its deadline is asked again, as a leader that cannot recover yet does.
  absl::Status opened;
  ASSERT_TRUE(Eventually([&] { return (opened = a.Open()).ok(); }, absl::Seconds(30))) << opened;
  absl::StatusOr<std::vector<JobRecord>> jobs = a.store->ListJobs();
  ASSERT_THAT(jobs, ::ckptd::testing::IsOkAndHolds(SizeIs(1)));
  EXPECT_GE((*jobs)[0].checkpoints_committed(), 2u);
}

}  // namespace
}  // namespace ckptd::coordinator
