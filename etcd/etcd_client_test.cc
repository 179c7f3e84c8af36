// EtcdClient against a real etcd (Debian's etcd-server, started per test).
#include "etcd/etcd_client.h"

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/testing/matchers.h"
#include "etcd/testing_etcd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::etcd {
namespace {

using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<EtcdClient> ClientFor(const std::string& endpoints) {
  EtcdOptions o;
  o.endpoints = {endpoints};
  o.attempt_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

absl::StatusOr<std::string> Get(EtcdClient& c, const std::string& key) {
  pb::RangeRequest r;
  r.set_key(key);
  absl::StatusOr<pb::RangeResponse> got = c.Range(r);
  if (!got.ok()) return got.status();
  if (got->kvs_size() == 0) return absl::NotFoundError(key);
  return got->kvs(0).value();
}

TEST(ParseEndpoints, AcceptsListsWithSchemesAndRefusesGarbage) {
  absl::StatusOr<std::vector<std::string>> e = ParseEndpoints("http://a:2379, b:2380,https://[::1]:2379/");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_THAT(*e, ::testing::ElementsAre("a:2379", "b:2380", "[::1]:2379"));
  EXPECT_THAT(ParseEndpoints(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no etcd endpoint")));
  EXPECT_THAT(ParseEndpoints("a:2379,nonsense"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"nonsense\" is not host:port")));
  EXPECT_THAT(ParseEndpoints("a:99999"), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(ParseEndpoints(":2379"), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

TEST(EtcdClientConnect, RefusesHalfAnAuthAndTlsWithoutCa) {
  EtcdOptions o;
  o.endpoints = {"127.0.0.1:1"};
  o.user = "root";
  EXPECT_THAT(EtcdClient::Connect(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("user and a password")));
  o.user.clear();
  o.endpoints = {"https://127.0.0.1:1"};
  EXPECT_THAT(EtcdClient::Connect(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("CA")));
}

TEST(EtcdClient, PutRangeTxnAndDeleteOnOneMember) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  std::unique_ptr<EtcdClient> c = ClientFor(etcd->endpoints());
  ASSERT_NE(c, nullptr);
  pb::PutRequest put;
  put.set_key("/t/a");
  put.set_value(std::string("v\0\xff", 3));
  ASSERT_TRUE(c->Put(put).ok());
  EXPECT_EQ(Get(*c, "/t/a").value_or(""), std::string("v\0\xff", 3));

  // A transaction that requires the key absent fails and reads it instead.
  pb::TxnRequest txn;
  *txn.add_compare() = CreateRevisionIs("/t/a", 0);
  *txn.add_success() = PutOp("/t/a", "overwritten");
  *txn.add_failure() = RangeOp("/t/a");
  absl::StatusOr<pb::TxnResponse> r = c->Txn(txn);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->succeeded());
  ASSERT_EQ(r->responses(0).response_range().kvs_size(), 1);
  EXPECT_EQ(r->responses(0).response_range().kvs(0).value(), std::string("v\0\xff", 3));

  ASSERT_TRUE(c->Put(put).ok());
  pb::DeleteRangeRequest del;
  del.set_key("/t/");
  del.set_range_end(PrefixEnd("/t/"));
  absl::StatusOr<pb::DeleteRangeResponse> d = c->DeleteRange(del);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->deleted(), 1);
  EXPECT_THAT(Get(*c, "/t/a"), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

TEST(EtcdClient, RequestsOverEtcdsLimitAreRefusedBeforeSending) {
  EtcdOptions o;
  o.endpoints = {"127.0.0.1:1"};
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(o);
  ASSERT_TRUE(c.ok());
  pb::PutRequest put;
  put.set_key("/big");
  put.set_value(std::string(kMaxRequestBytes + 1, 'x'));
  EXPECT_THAT((*c)->Put(put), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("request limit")));
}

TEST(EtcdClient, NoMemberReachableIsUnavailableNamingEveryMember) {
  EtcdOptions o;
  o.endpoints = {"127.0.0.1:1,127.0.0.1:2"};
  o.attempt_timeout = absl::Milliseconds(500);
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(o);
  ASSERT_TRUE(c.ok());
  pb::RangeRequest r;
  r.set_key("/x");
  absl::StatusOr<pb::RangeResponse> got = (*c)->Range(r);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().code(),
              ::testing::AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(got.status().message(),
              ::testing::AllOf(HasSubstr("127.0.0.1:1: Range"), HasSubstr("127.0.0.1:2: Range")));
}

TEST(EtcdClient, LeaseGrantKeepAliveAndRevoke) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  std::unique_ptr<EtcdClient> c = ClientFor(etcd->endpoints());
  ASSERT_NE(c, nullptr);
  absl::StatusOr<pb::LeaseGrantResponse> lease = c->LeaseGrant(5);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_GE(lease->ttl(), 5);
  absl::StatusOr<int64_t> ttl = c->LeaseKeepAliveOnce(lease->id());
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_GE(*ttl, 4);
  // A key bound to the lease goes with it.
  ASSERT_TRUE(c->Txn([&] {
                 pb::TxnRequest t;
                 *t.add_success() = PutOp("/leased", "x", lease->id());
                 return t;
               }())
                  .ok());
  ASSERT_TRUE(c->LeaseRevoke(lease->id()).ok());
  EXPECT_THAT(Get(*c, "/leased"), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_THAT(c->LeaseKeepAliveOnce(lease->id()), StatusIs(absl::StatusCode::kNotFound, HasSubstr("expired")));
  // Revoking twice is fine.
  EXPECT_TRUE(c->LeaseRevoke(lease->id()).ok());
}

TEST(EtcdClient, CompactsAndCompactingTwiceIsFine) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  std::unique_ptr<EtcdClient> c = ClientFor(etcd->endpoints());
  ASSERT_NE(c, nullptr);
  int64_t revision = 0;
  for (int i = 0; i < 10; ++i) {
    pb::PutRequest put;
    put.set_key("/c");
    put.set_value(absl::StrCat(i));
    absl::StatusOr<pb::PutResponse> r = c->Put(put);
    ASSERT_TRUE(r.ok()) << r.status();
    revision = r->header().revision();
  }
  EXPECT_TRUE(c->Compact(revision).ok());
  EXPECT_TRUE(c->Compact(revision - 2).ok());
  EXPECT_EQ(Get(*c, "/c").value_or(""), "9");
}

TEST(EtcdClient, AMemberKilledIsPassedOverAndQuorumLostIsUnavailable) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 3);
  std::unique_ptr<EtcdClient> c = ClientFor(etcd->endpoints());
  ASSERT_NE(c, nullptr);
  pb::PutRequest put;
  put.set_key("/k");
  put.set_value("1");
  ASSERT_TRUE(c->Put(put).ok());
  // The first member (the one the client prefers) dies: the others answer.
  ASSERT_TRUE(etcd->Kill(0).ok());
  put.set_value("2");
  absl::StatusOr<pb::PutResponse> r = c->Put(put);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Get(*c, "/k").value_or(""), "2");
  // A second one dies: no quorum, and the error says so.
  ASSERT_TRUE(etcd->Kill(1).ok());
  put.set_value("3");
  absl::StatusOr<pb::PutResponse> lost = c->Put(put);
  ASSERT_FALSE(lost.ok());
  EXPECT_THAT(lost.status().code(),
              ::testing::AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(lost.status().message(), HasSubstr("etcd 127.0.0.1:"));
  // Quorum returns: the value written before is there, the refused one not.
  ASSERT_TRUE(etcd->Restart(1, /*wait_healthy=*/false).ok());
  absl::StatusOr<std::string> v;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  do {
    v = Get(*c, "/k");
    if (v.ok()) break;
    absl::SleepFor(absl::Milliseconds(200));
  } while (absl::Now() < deadline);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(*v, ::testing::AnyOf("2", "3"));  // a timed-out proposal may still apply
}

TEST(EtcdClient, AuthenticatesAndRenewsItsToken) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  ASSERT_TRUE(etcd->Ctl("user add root:rootpw").ok());
  ASSERT_TRUE(etcd->Ctl("auth enable").ok());
  EtcdOptions o;
  o.endpoints = {etcd->endpoints()};
  o.user = "root";
  o.password = "rootpw";
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(o);
  ASSERT_TRUE(c.ok());
  pb::PutRequest put;
  put.set_key("/auth");
  put.set_value("ok");
  absl::StatusOr<pb::PutResponse> r = (*c)->Put(put);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Get(**c, "/auth").value_or(""), "ok");
  // A member restarted forgets the simple tokens it issued: the client
  // authenticates again.
  ASSERT_TRUE(etcd->Restart(0, /*wait_healthy=*/false).ok());
  absl::StatusOr<pb::PutResponse> again;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  do {
    again = (*c)->Put(put);
    if (again.ok() || !(absl::IsUnavailable(again.status()) || absl::IsDeadlineExceeded(again.status()))) break;
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < deadline);
  EXPECT_TRUE(again.ok()) << again.status() << "\n" << std::ifstream(etcd->log(0)).rdbuf();

  // A wrong password is an error naming the user, never the password.
  o.password = "wrong-secret";
  absl::StatusOr<std::unique_ptr<EtcdClient>> bad = EtcdClient::Connect(o);
  ASSERT_TRUE(bad.ok());
  absl::StatusOr<pb::PutResponse> refused = (*bad)->Put(put);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("authenticating as root"));
  EXPECT_THAT(refused.status().message(), ::testing::Not(HasSubstr("wrong-secret")));
  // Without credentials, etcd refuses.
  o.user.clear();
  o.password.clear();
  absl::StatusOr<std::unique_ptr<EtcdClient>> anon = EtcdClient::Connect(o);
  ASSERT_TRUE(anon.ok());
  EXPECT_FALSE((*anon)->Put(put).ok());
}

}  // namespace
}  // namespace ckptd::etcd
