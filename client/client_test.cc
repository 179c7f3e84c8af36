#include "client/client.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/agent_core.h"
#include "agent/agent_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/mem_file_system.h"
#include "storage/testing_matchers.h"

namespace ckptd::client {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Optional;

// The trainer state: all five components.
struct State {
  std::vector<float> params = std::vector<float>(1000);
  std::vector<float> grads = std::vector<float>(1000);
  std::vector<float> adam = std::vector<float>(2000);
  std::vector<uint8_t> rng = std::vector<uint8_t>(64);
  std::vector<uint8_t> cursor = std::vector<uint8_t>(16);

  void Step(uint64_t step) {
    for (size_t i = 0; i < params.size(); ++i) params[i] += 0.001f * static_cast<float>((i + step) % 7);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(step) * 0.5f - static_cast<float>(i % 3);
    for (size_t i = 0; i < adam.size(); ++i) adam[i] = adam[i] * 0.9f + static_cast<float>(step % 5);
    for (size_t i = 0; i < rng.size(); ++i) rng[i] = static_cast<uint8_t>(rng[i] * 31 + step);
    std::memcpy(cursor.data(), &step, sizeof(step));
  }
  bool operator==(const State& o) const {
    return params == o.params && grads == o.grads && adam == o.adam && rng == o.rng && cursor == o.cursor;
  }

  std::vector<BufferSpec> Specs() {
    auto spec = [](std::string name, ckptd::v1::Component c, ckptd::v1::DType d, uint64_t n, void* p) {
      BufferSpec b;
      b.name = std::move(name);
      b.component = c;
      b.dtype = d;
      b.shape = {n};
      b.data = p;
      return b;
    };
    return {spec("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, params.size(), params.data()),
            spec("grads", ckptd::v1::GRADS, ckptd::v1::FLOAT32, grads.size(), grads.data()),
            spec("adam", ckptd::v1::OPTIMIZER, ckptd::v1::FLOAT32, adam.size(), adam.data()),
            spec("rng", ckptd::v1::RNG, ckptd::v1::BYTES, rng.size(), rng.data()),
            spec("cursor", ckptd::v1::DATA_CURSOR, ckptd::v1::BYTES, cursor.size(), cursor.data())};
  }
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ckptd-client-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/agent.sock";
    ASSERT_THAT(mem_.CreateDir("/ckpt"), IsOk());
    StartAgent();
  }
  void TearDown() override {
    StopAgent();
    std::system(absl::StrCat("rm -rf ", dir_).c_str());
  }
  void StartAgent() {
    agent::AgentOptions o;
    o.storage_root = "/ckpt";
    o.io_threads = 1;
    o.segment_prefix = absl::StrCat("/ckptd-test-client-", ::getpid(), "-", counter_++);
    core_ = std::make_unique<agent::AgentCore>(&mem_, o);
    service_ = std::make_unique<agent::AgentService>(core_.get());
    auto server = agent::StartUnixServer(socket_, service_.get());
    ASSERT_THAT(server.status(), IsOk());
    server_ = *std::move(server);
  }
  void StopAgent() {
    if (server_) server_->Shutdown();
    server_.reset();
    service_.reset();
    core_.reset();
  }
  ClientOptions Options() {
    ClientOptions o;
    o.socket = socket_;
    o.job = "train";
    o.every_steps = 5;
    o.slot_wait = absl::Seconds(5);
    o.rpc_timeout = absl::Seconds(2);
    return o;
  }

  static inline int counter_ = 0;
  std::string dir_, socket_;
  storage::MemFileSystem mem_;
  std::unique_ptr<agent::AgentCore> core_;
  std::unique_ptr<agent::AgentService> service_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(ClientTest, SnapshotsOnScheduleAndRestoresAllFiveComponentsExactly) {
  State state;
  std::unique_ptr<Client> client;
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(client, Client::Connect(Options(), state.Specs()));
  }
  EXPECT_THAT(client->Restore(), ::ckptd::testing::IsOkAndHolds(std::nullopt));
  EXPECT_FALSE(client->ShouldSnapshot(0));
  EXPECT_FALSE(client->ShouldSnapshot(7));
  State at10;
  for (uint64_t step = 1; step <= 12; ++step) {
    state.Step(step);
    if (client->ShouldSnapshot(step)) {
      CKPTD_ASSERT_OK_AND_ASSIGN(SnapshotResult r, client->Snapshot(step));
      EXPECT_EQ(r.step, step);
      EXPECT_GE(r.stall_seconds, 0);
    }
    if (step == 10) at10 = state;
  }
  EXPECT_EQ(client->snapshots_taken(), 2u);
  CKPTD_ASSERT_OK(client->WaitPersisted(10, absl::Seconds(30)));
  ASSERT_FALSE(state == at10);
  EXPECT_THAT(client->Restore(), ::ckptd::testing::IsOkAndHolds(Optional(10u)));
  EXPECT_TRUE(state == at10);
}

TEST_F(ClientTest, NoAgentIsABoundedError) {
  ClientOptions o = Options();
  o.socket = dir_ + "/nobody.sock";
  o.rpc_timeout = absl::Milliseconds(300);
  State state;
  const absl::Time t0 = absl::Now();
  EXPECT_THAT(Client::Connect(o, state.Specs()),
              AnyOf(StatusIs(absl::StatusCode::kUnavailable, HasSubstr("register")),
                    StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("register"))));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(30));  // generous: only "it returns"
}

TEST_F(ClientTest, AgentRestartIsReportedThenRecoveredFrom) {
  State state;
  ClientOptions o = Options();
  o.rpc_timeout = absl::Milliseconds(500);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.Specs()));
  CKPTD_ASSERT_OK(client->Snapshot(5).status());
  CKPTD_ASSERT_OK(client->WaitPersisted(5, absl::Seconds(30)));
  StopAgent();
  // The agent is gone: within a few attempts a snapshot says so.
  absl::Status seen;
  for (int i = 0; i < 20 && seen.ok(); ++i) {
    seen = client->Snapshot(10 + i).status();
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_THAT(seen, AnyOf(StatusIs(absl::StatusCode::kUnavailable, HasSubstr("agent")),
                          StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("agent"))));
  StartAgent();
  absl::Status back;
  for (int i = 0; i < 40; ++i) {
    back = client->Snapshot(100).status();
    if (back.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  CKPTD_ASSERT_OK(back);
  CKPTD_ASSERT_OK(client->WaitPersisted(100, absl::Seconds(30)));
}

TEST_F(ClientTest, RestoreWithAnotherLayoutNamesTheBuffer) {
  State state;
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(Options(), state.Specs()));
    CKPTD_ASSERT_OK(client->Snapshot(5).status());
    CKPTD_ASSERT_OK(client->WaitPersisted(5, absl::Seconds(30)));
  }
  State other;
  other.adam.resize(2001);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(Options(), other.Specs()));
  EXPECT_THAT(client->Restore(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("buffer 'adam'")));
}

}  // namespace
}  // namespace ckptd::client
