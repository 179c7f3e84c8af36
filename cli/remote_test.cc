// ckptctl's live calls against a coordinator served in-process on loopback.
#include "cli/remote.h"

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/interval_commands.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/state_store.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "storage/mem_file_system.h"
#include "storage/store.h"
#include "storage/testing_matchers.h"

namespace ckptd::cli {
namespace {

using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

class RemoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CKPTD_ASSERT_OK(core_.Recover());
    absl::StatusOr<coordinator::CoordinatorServer> s =
        coordinator::StartCoordinatorServer("127.0.0.1:0", &service_, grpc::InsecureServerCredentials());
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    ckptd::v1::RegisterAgentRequest req;
    req.set_node_id("node-a");
    ckptd::v1::RankInfo* r = req.add_ranks();
    r->set_job("llm");
    r->set_rank(0);
    r->set_world_size(1);
    r->set_pid(42);
    ASSERT_TRUE(core_.RegisterAgent(req).ok());
  }
  void TearDown() override { coordinator::ShutdownCoordinatorServer(server_.server.get()); }

  Args Flags(const std::string& address) {
    absl::StatusOr<Args> a = Args::Parse({"--coordinator", address}, CoordinatorValueFlags(), {});
    EXPECT_TRUE(a.ok());
    return *a;
  }
  std::string Address() const { return absl::StrCat("127.0.0.1:", server_.port); }

  storage::MemFileSystem fs_;
  storage::CheckpointStore store_{&fs_, "/ckpt"};
  std::unique_ptr<coordinator::StateStore> state_ = coordinator::NewMemStateStore();
  coordinator::RealClock clock_;
  coordinator::CoordinatorCore core_{&store_, state_.get(), &clock_, coordinator::CoordinatorOptions()};
  coordinator::CoordinatorService service_{&core_, coordinator::CoordinatorServiceOptions()};
  coordinator::CoordinatorServer server_;
};

TEST_F(RemoteTest, FetchesTheLiveIntervalOfAJob) {
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::IntervalStatus st, FetchInterval(Flags(Address()), "llm"));
  EXPECT_EQ(st.job(), "llm");
  EXPECT_TRUE(st.automatic());
  EXPECT_FALSE(st.decided());
  EXPECT_THAT(st.waiting_for(), HasSubstr("committed checkpoint"));
  EXPECT_EQ(st.gpus(), 1u);
  EXPECT_THAT(FetchInterval(Flags(Address()), "other"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no job")));
  EXPECT_THAT(FetchInterval(Flags(Address()), "../x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name")));

  // The command end to end.
  std::ostringstream out, err;
  EXPECT_EQ(RunInterval({"--job", "llm", "--coordinator", Address()}, out, err, FetchInterval), kExitOk) << err.str();
  EXPECT_THAT(out.str(), AllOf(HasSubstr("job llm"), HasSubstr("waiting for")));
}

TEST_F(RemoteTest, UnreachableCoordinatorAndBadFlagsAreTold) {
  // Nothing listens on the port the server had before it stopped.
  const std::string gone = Address();
  coordinator::ShutdownCoordinatorServer(server_.server.get());
  absl::Status s = FetchInterval(Flags(gone), "llm").status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr(gone)));
  EXPECT_EQ(ExitCodeFor(s), kExitUnavailable);
  std::ostringstream out, err;
  EXPECT_EQ(RunInterval({"--job", "llm", "--coordinator", gone}, out, err, FetchInterval), kExitUnavailable);
  EXPECT_THAT(err.str(), HasSubstr(gone));

  absl::StatusOr<Args> half = Args::Parse({"--coordinator", gone, "--tls-ca", "ca.pem"}, CoordinatorValueFlags(), {});
  ASSERT_TRUE(half.ok());
  EXPECT_THAT(FetchInterval(*half, "llm"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls-cert")));
  absl::StatusOr<Args> files = Args::Parse(
      {"--coordinator", gone, "--tls-ca", "/no/ca.pem", "--tls-cert", "/no/c.pem", "--tls-key", "/no/k.pem"},
      CoordinatorValueFlags(), {});
  ASSERT_TRUE(files.ok());
  EXPECT_THAT(FetchInterval(*files, "llm"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/no/")));
  EXPECT_EQ(ExitCodeFor(absl::NotFoundError("x")), kExitFailed);
}

}  // namespace
}  // namespace ckptd::cli
