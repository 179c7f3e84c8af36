#include "rpc/coordinator_targets.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"

namespace ckptd::rpc {
namespace {

using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseCoordinatorAddresses, OneOrSeveralDuplicatesDroppedAndBadEntriesNamed) {
  EXPECT_THAT(ParseCoordinatorAddresses("c:7070").value(), ElementsAre("c:7070"));
  EXPECT_THAT(ParseCoordinatorAddresses("a:1, b:2,a:1,[::1]:3").value(), ElementsAre("a:1", "b:2", "[::1]:3"));
  EXPECT_THAT(ParseCoordinatorAddresses("a:1,b"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"b\"")));
  EXPECT_THAT(ParseCoordinatorAddresses("a:1,"), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(ParseCoordinatorAddresses("a:0"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("port")));
  std::vector<std::string> many;
  for (int i = 1; i <= 17; ++i) many.push_back(absl::StrCat("h", i, ":1"));
  EXPECT_THAT(ParseCoordinatorAddresses(absl::StrJoin(many, ",")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 16")));
}

// A server that refuses every call as a standby naming `leader`.
class Standby final : public grpc::CallbackGenericService {
 public:
  explicit Standby(std::string leader) : leader_(std::move(leader)) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    class R final : public grpc::ServerGenericBidiReactor {
     public:
      R(grpc::GenericCallbackServerContext* ctx, const std::string& leader) {
        if (!leader.empty()) ctx->AddTrailingMetadata(kLeaderMetadataKey, leader);
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "standby"));
      }
      void OnDone() override { delete this; }
    };
    return new R(ctx, leader_);
  }

 private:
  const std::string leader_;
};

// Calls any method on `target`; the status, with the context's trailers.
grpc::Status Call(const CoordinatorTargets::Target& target, grpc::ClientContext* ctx) {
  grpc::GenericStub stub(target.channel);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status out;
  absl::Mutex mu;
  bool done = false;
  stub.UnaryCall(ctx, "/ckptd.v1.Coordinator/GetClusterStatus", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   absl::MutexLock l(&mu);
                   out = s;
                   done = true;
                 });
  absl::MutexLock l(&mu);
  mu.Await(absl::Condition(&done));
  return out;
}

TEST(CoordinatorTargets, FollowsTheLeaderAStandbyNamesWhenItIsOneOfTheAddresses) {
  Standby s1("");  // names no leader (none known)
  grpc::ServerBuilder b;
  int port1 = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port1);
  b.RegisterCallbackGenericService(&s1);
  std::unique_ptr<grpc::Server> standby1 = b.BuildAndStart();
  ASSERT_NE(standby1, nullptr);
  const std::string a1 = absl::StrCat("127.0.0.1:", port1);
  const std::string leader = "127.0.0.1:1";  // never called here
  const std::string third = "127.0.0.1:2";

  // The second standby names the leader.
  Standby s2(leader);
  grpc::ServerBuilder b2;
  int port2 = 0;
  b2.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port2);
  b2.RegisterCallbackGenericService(&s2);
  std::unique_ptr<grpc::Server> standby2 = b2.BuildAndStart();
  const std::string a2 = absl::StrCat("127.0.0.1:", port2);

  CoordinatorTargets t({a1, a2, third, leader}, grpc::InsecureChannelCredentials(), grpc::ChannelArguments());
  EXPECT_EQ(t.size(), 4u);
  EXPECT_EQ(t.Describe(), absl::StrCat(a1, ",", a2, ",", third, ",", leader));
  EXPECT_EQ(t.Current().address, a1);
  {
    grpc::ClientContext ctx;
    grpc::Status s = Call(t.Current(), &ctx);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    // No leader named: the next address.
    EXPECT_TRUE(t.Observe(a1, ctx, s));
    EXPECT_EQ(t.Current().address, a2);
  }
  {
    grpc::ClientContext ctx;
    grpc::Status s = Call(t.Current(), &ctx);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    // Named: straight to it, past the third.
    EXPECT_TRUE(t.Observe(a2, ctx, s));
    EXPECT_EQ(t.Current().address, leader);
  }
  // A stale observation (another call moved on already) changes nothing
  // more; other codes do not move.
  EXPECT_TRUE(t.Observe(a1, grpc::Status(grpc::StatusCode::UNAVAILABLE, "x")));
  EXPECT_EQ(t.Current().address, leader);
  EXPECT_FALSE(t.Observe(leader, grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "x")));
  EXPECT_EQ(t.Current().address, leader);
  // No answer at all: round the list.
  EXPECT_TRUE(t.Observe(leader, grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "x")));
  EXPECT_EQ(t.Current().address, a1);
  standby1->Shutdown();
  standby2->Shutdown();
}

TEST(CoordinatorTargets, AStandbyCannotSendACallToAnAddressNotConfigured) {
  Standby s("evil.example:443");
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterCallbackGenericService(&s);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  const std::string a = absl::StrCat("127.0.0.1:", port);
  CoordinatorTargets t({a, "127.0.0.1:3"}, grpc::InsecureChannelCredentials(), grpc::ChannelArguments());
  grpc::ClientContext ctx;
  grpc::Status st = Call(t.Current(), &ctx);
  EXPECT_TRUE(t.Observe(a, ctx, st));
  EXPECT_EQ(t.Current().address, "127.0.0.1:3");
  server->Shutdown();
}

TEST(CoordinatorTargets, OneAddressNeverMoves) {
  CoordinatorTargets t({"127.0.0.1:4"}, grpc::InsecureChannelCredentials(), grpc::ChannelArguments());
  EXPECT_FALSE(t.Observe("127.0.0.1:4", grpc::Status(grpc::StatusCode::UNAVAILABLE, "x")));
  EXPECT_EQ(t.Current().address, "127.0.0.1:4");
}

}  // namespace
}  // namespace ckptd::rpc
