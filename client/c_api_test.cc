#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "agent/agent_core.h"
#include "agent/agent_service.h"
#include "base/testing/matchers.h"
#include "base/testing/temp_dir.h"
#include "client/c_options.h"
#include "client/ckptd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/file_system.h"
#include "storage/layout.h"
#include "storage/mem_file_system.h"
#include "storage/shard_reader.h"

extern "C" int ckptd_c_smoke(const char* socket, const char* job, int ext_spare);

namespace {

using ::ckptd::client::ClientOptions;
using ::ckptd::client::ClientOptionsFromC;
using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// An agent over an in-memory storage root "/ckpt" serving `socket`, its
// staging segments named after `tag`; `prepare` runs on the storage root
// before the agent starts.
class ServedAgent {
 public:
  ServedAgent(const std::string& socket, const std::string& tag,
              const std::function<void(ckptd::storage::MemFileSystem&)>& prepare = {})
      : root_made_(MakeRoot(prepare)), core_(&mem_, Options(tag)), service_(&core_) {
    auto server = ckptd::agent::StartUnixServer(socket, &service_);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = *std::move(server);
  }
  ~ServedAgent() {
    if (server_ != nullptr) server_->Shutdown();
  }
  bool serving() const { return root_made_ && server_ != nullptr; }
  ckptd::storage::MemFileSystem& mem() { return mem_; }

 private:
  bool MakeRoot(const std::function<void(ckptd::storage::MemFileSystem&)>& prepare) {
    const bool made = mem_.CreateDir("/ckpt").ok();
    EXPECT_TRUE(made);
    if (prepare) prepare(mem_);
    return made;
  }
  static ckptd::agent::AgentOptions Options(const std::string& tag) {
    ckptd::agent::AgentOptions o;
    o.storage_root = "/ckpt";
    o.io_threads = 1;
    o.segment_prefix = absl::StrCat("/ckptd-test-", tag, "-", ::getpid());
    return o;
  }

  ckptd::storage::MemFileSystem mem_;
  const bool root_made_;  // before the agent: it starts over the root
  ckptd::agent::AgentCore core_;
  ckptd::agent::AgentService service_;
  std::unique_ptr<ckptd::agent::UnixServer> server_;
};

TEST(CApiTest, ConnectSnapshotRestoreFromC) {
  ckptd::testing::TempDir tmp("ckptd-capi-");
  const std::string dir = tmp.path();
  const std::string socket = dir + "/agent.sock";
  {
    ServedAgent agent(socket, "capi");
    ASSERT_TRUE(agent.serving());
    EXPECT_EQ(ckptd_c_smoke(socket.c_str(), "capi", -1), 0) << ckptd_last_error();
    // The ext entry point; the spare is for device buffers, these are on the host.
    EXPECT_EQ(ckptd_c_smoke(socket.c_str(), "capi-ext", 1), 0) << ckptd_last_error();
  }
  std::system(absl::StrCat("rm -rf ", dir).c_str());
}

// A buffer declared replicated through ckptd_options_ext.replicas reaches
// the agent, which writes it as a share; a group the job cannot hold, or one
// without a name, is refused.
TEST(CApiTest, ReplicatedBuffersAreDeclaredThroughExtOptions) {
  ckptd::testing::TempDir tmp("ckptd-capi-");
  const std::string socket = tmp.path() + "/agent.sock";
  ServedAgent agent(socket, "capi-dp");
  ASSERT_TRUE(agent.serving());
  const ckptd_options options = {socket.c_str(), "capi-dp", 0, 1, 0, 1000, 5000};
  float w[6] = {1, 2, 3, 4, 5, 6};
  uint64_t shape[2] = {3, 2};
  ckptd_buffer b = {"w", CKPTD_PARAMS, CKPTD_FLOAT32, 2, shape, nullptr, nullptr, CKPTD_DEVICE_HOST, 0, w};
  ckptd_replica replica = {"dp", 2, 0};
  ckptd_options_ext ext = {sizeof(ckptd_options_ext), 0, 0, &replica, nullptr, 0, 0};
  ckptd_client* client = nullptr;
  EXPECT_EQ(ckptd_connect_ext(&options, &ext, &b, 1, &client), 3);
  EXPECT_THAT(ckptd_last_error(), HasSubstr("larger than the job's world of 1"));
  replica = {nullptr, 1, 0};
  EXPECT_EQ(ckptd_connect_ext(&options, &ext, &b, 1, &client), 3);
  EXPECT_THAT(ckptd_last_error(), HasSubstr("without a name"));
  replica = {"dp", 1, 0};
  ASSERT_EQ(ckptd_connect_ext(&options, &ext, &b, 1, &client), 0) << ckptd_last_error();
  int found = 1;
  uint64_t step = 0;
  ASSERT_EQ(ckptd_restore(client, &found, &step), 0) << ckptd_last_error();
  ASSERT_EQ(ckptd_snapshot(client, 5, nullptr), 0) << ckptd_last_error();
  ASSERT_EQ(ckptd_wait_persisted(client, 5, 30000), 0) << ckptd_last_error();
  ckptd_close(client);
  auto reader =
      ckptd::storage::ShardReader::Open(&agent.mem(), ckptd::storage::ShardPath("/ckpt", "capi-dp", 5, 0), {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  const ckptd::v1::Tensor* saved = (*reader)->FindTensor("w");
  ASSERT_NE(saved, nullptr);
  EXPECT_EQ(saved->replica().group(), "dp");
  EXPECT_EQ(saved->replica().count(), 1u);
}

// Issue 16 (5): the C ABI tells the trainer of persists that failed.
TEST(CApiTest, PersistFailuresReachTheCaller) {
  ckptd::testing::TempDir tmp("ckptd-capi-");
  const std::string socket = tmp.path() + "/agent.sock";
  // A file where the job's folder goes: every persist of the job fails.
  ServedAgent agent(socket, "capi-full", [](ckptd::storage::MemFileSystem& mem) {
    ASSERT_TRUE(ckptd::storage::WriteFileAtomically(&mem, "/ckpt/capi-full", "in the way").ok());
  });
  ASSERT_TRUE(agent.serving());
  ckptd_options options = {socket.c_str(), "capi-full", 0, 1, 0, 1000, 2000};
  float x[4] = {1, 2, 3, 4};
  uint64_t shape[1] = {4};
  ckptd_buffer b = {"x", CKPTD_PARAMS, CKPTD_FLOAT32, 1, shape, nullptr, nullptr, CKPTD_DEVICE_HOST, 0, x};
  ckptd_client* client = nullptr;
  ASSERT_EQ(ckptd_connect(&options, &b, 1, &client), 0) << ckptd_last_error();
  ASSERT_EQ(ckptd_snapshot(client, 7, nullptr), 0) << ckptd_last_error();
  EXPECT_EQ(ckptd_wait_persisted(client, 7, 30000), 10);  // ABORTED
  EXPECT_THAT(ckptd_last_error(), HasSubstr("persisting step 7 failed"));
  uint64_t failed = 0, last = 0;
  char error[512];
  ASSERT_EQ(ckptd_persist_failures(client, &failed, &last, error, sizeof(error)), 0);
  EXPECT_EQ(failed, 1u);
  EXPECT_EQ(last, 7u);
  EXPECT_THAT(error, HasSubstr("/ckpt/capi-full"));
  char small[6];
  ASSERT_EQ(ckptd_persist_failures(client, nullptr, nullptr, small, sizeof(small)), 0);
  EXPECT_EQ(std::strlen(small), sizeof(small) - 1);
  EXPECT_EQ(std::string(small), std::string(error).substr(0, sizeof(small) - 1));
  EXPECT_EQ(ckptd_persist_failures(nullptr, &failed, &last, error, sizeof(error)), 3);
  ckptd_close(client);
}

// ABI 9: the schedule should_snapshot follows, here the caller's own (an
// agent without a coordinator).
TEST(CApiTest, ScheduleIsTheCallersWithoutACoordinator) {
  ckptd::testing::TempDir tmp("ckptd-capi-");
  const std::string socket = tmp.path() + "/agent.sock";
  ServedAgent agent(socket, "capi-sched", [](ckptd::storage::MemFileSystem&) {});
  ASSERT_TRUE(agent.serving());
  ckptd_options options = {socket.c_str(), "capi-sched", 0, 1, 25, 1000, 2000};
  float x[4] = {1, 2, 3, 4};
  uint64_t shape[1] = {4};
  ckptd_buffer b = {"x", CKPTD_PARAMS, CKPTD_FLOAT32, 1, shape, nullptr, nullptr, CKPTD_DEVICE_HOST, 0, x};
  ckptd_client* client = nullptr;
  ASSERT_EQ(ckptd_connect(&options, &b, 1, &client), 0) << ckptd_last_error();
  int coordinated = 1, known = 1;
  uint64_t start = 9, every = 0, durable = 9, generation = 9;
  ASSERT_EQ(ckptd_schedule(client, &coordinated, &known, &start, &every, &durable, &generation), 0)
      << ckptd_last_error();
  EXPECT_EQ(coordinated, 0);
  EXPECT_EQ(known, 0);
  EXPECT_EQ(every, 25u);
  EXPECT_EQ(start, 0u);
  EXPECT_EQ(durable, 0u);
  EXPECT_EQ(generation, 0u);
  EXPECT_EQ(ckptd_should_snapshot(client, 25), 1);
  EXPECT_EQ(ckptd_schedule(client, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), 0);
  EXPECT_EQ(ckptd_schedule(nullptr, &coordinated, &known, &start, &every, &durable, &generation), 3);
  // ABI 10: no coordinator, nothing to be told of a restore; the buffer is
  // written even so, and a null or empty one is left alone.
  char warning[8] = "garbage";
  EXPECT_EQ(ckptd_restore_warning(client, warning, sizeof(warning)), 0) << ckptd_last_error();
  EXPECT_STREQ(warning, "");
  int found = 1;
  uint64_t step = 9;
  ASSERT_EQ(ckptd_restore(client, &found, &step), 0) << ckptd_last_error();
  EXPECT_EQ(found, 0);
  std::memcpy(warning, "garbage", sizeof(warning));
  EXPECT_EQ(ckptd_restore_warning(client, warning, sizeof(warning)), 0);
  EXPECT_STREQ(warning, "");
  EXPECT_EQ(ckptd_restore_warning(client, nullptr, 0), 0);
  EXPECT_EQ(ckptd_restore_warning(nullptr, warning, sizeof(warning)), 3);
  ckptd_close(client);
}

TEST(CApiTest, ErrorsAreCodesWithMessages) {
  EXPECT_EQ(ckptd_abi_version(), CKPTD_ABI_VERSION);
  ckptd_client* client = nullptr;
  EXPECT_EQ(ckptd_connect(nullptr, nullptr, 0, &client), 3);  // INVALID_ARGUMENT
  EXPECT_THAT(ckptd_last_error(), HasSubstr("required"));
  ckptd_options options = {"/nonexistent/agent.sock", "job", 0, 1, 0, 0, 300};
  float x = 0;
  uint64_t shape[1] = {1};
  ckptd_buffer b = {"x", CKPTD_PARAMS, CKPTD_FLOAT32, 1, shape, nullptr, nullptr, CKPTD_DEVICE_HOST, 0, &x};
  const int rc = ckptd_connect(&options, &b, 1, &client);
  EXPECT_TRUE(rc == 14 || rc == 4) << rc << " " << ckptd_last_error();  // UNAVAILABLE or DEADLINE_EXCEEDED
  EXPECT_EQ(client, nullptr);
  EXPECT_EQ(ckptd_snapshot(nullptr, 1, nullptr), 3);
  EXPECT_EQ(ckptd_should_snapshot(nullptr, 1), 0);
}

TEST(CApiTest, ExtOptionsReachTheClientAndOlderOrNewerCallersAreHandled) {
  const ckptd_options options = {"/run/agent.sock", "job", 3, 0, 10, -5, 0};
  CKPTD_ASSERT_OK_AND_ASSIGN(ClientOptions plain, ClientOptionsFromC(&options, nullptr));
  EXPECT_EQ(plain.socket, "/run/agent.sock");
  EXPECT_EQ(plain.rank, 3u);
  EXPECT_EQ(plain.world_size, 1u);
  EXPECT_EQ(plain.slot_wait, absl::ZeroDuration());
  EXPECT_EQ(plain.rpc_timeout, absl::Seconds(5));
  EXPECT_FALSE(plain.spare_device_buffer);

  ckptd_options_ext ext = {sizeof(ckptd_options_ext), 1, 0, nullptr, nullptr, 0, 0};
  CKPTD_ASSERT_OK_AND_ASSIGN(ClientOptions spare, ClientOptionsFromC(&options, &ext));
  EXPECT_TRUE(spare.spare_device_buffer);
  // `reserved` is where the next option goes: set, it is not ignored.
  ext.reserved = 1;
  EXPECT_THAT(ClientOptionsFromC(&options, &ext),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown to this libckptd")));
  ext.reserved = 0;
  // ABI 6's replicas are known (read by ckptd_connect_ext with the buffers).
  const ckptd_replica replicas[1] = {{"dp", 1, 0}};
  ext.replicas = replicas;
  CKPTD_EXPECT_OK(ClientOptionsFromC(&options, &ext).status());
  // A struct that holds part of the pointer: nothing this library reads.
  ckptd_options_ext partial = ext;
  partial.size = offsetof(ckptd_options_ext, replicas) + 4;
  partial.replicas = reinterpret_cast<const ckptd_replica*>(uintptr_t{0x1000});
  EXPECT_THAT(ClientOptionsFromC(&options, &partial),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown to this libckptd")));

  // A caller built before spare_device_buffer existed: the field lies
  // outside its struct and is not read, whatever the memory there holds.
  ckptd_options_ext old = {sizeof(size_t), 1, 0, nullptr, nullptr, 0, 0};
  CKPTD_ASSERT_OK_AND_ASSIGN(ClientOptions older, ClientOptionsFromC(&options, &old));
  EXPECT_FALSE(older.spare_device_buffer);

  // A newer caller: fields this library does not know must be left zero.
  struct Newer {
    ckptd_options_ext ext;
    uint64_t future;
  } newer;
  std::memset(&newer, 0, sizeof(newer));
  newer.ext.size = sizeof(Newer);
  newer.ext.spare_device_buffer = 1;
  CKPTD_ASSERT_OK_AND_ASSIGN(ClientOptions from_newer, ClientOptionsFromC(&options, &newer.ext));
  EXPECT_TRUE(from_newer.spare_device_buffer);
  newer.future = 7;
  EXPECT_THAT(ClientOptionsFromC(&options, &newer.ext),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown to this libckptd")));

  // ABI 8: the users trusted to run the agent; both fields or neither.
  const uint32_t trusted[2] = {1001, 1002};
  ckptd_options_ext trusting = {sizeof(ckptd_options_ext), 0, 0, nullptr, trusted, 2, 0};
  CKPTD_ASSERT_OK_AND_ASSIGN(ClientOptions trusts, ClientOptionsFromC(&options, &trusting));
  EXPECT_THAT(trusts.trusted_agent_uids, ElementsAre(1001u, 1002u));
  trusting.trusted_agent_uids = nullptr;
  EXPECT_THAT(ClientOptionsFromC(&options, &trusting),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("trusted_agent_uid_count 2 needs")));
  trusting.trusted_agent_uids = trusted;
  trusting.trusted_agent_uid_count = 1025;
  EXPECT_THAT(ClientOptionsFromC(&options, &trusting),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 1024")));
  ckptd_options_ext half = trusting;  // an ABI 7 caller: the pointer's bytes lie outside its struct
  half.size = offsetof(ckptd_options_ext, trusted_agent_uid_count);
  EXPECT_THAT(ClientOptionsFromC(&options, &half),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown to this libckptd")));
  half.trusted_agent_uids = nullptr;
  CKPTD_ASSERT_OK_AND_ASSIGN(ClientOptions abi7, ClientOptionsFromC(&options, &half));
  EXPECT_THAT(abi7.trusted_agent_uids, ::testing::IsEmpty());
  // ABI 11: the wait for slots being allocated; 0 the default, negative
  // none beyond slot_wait; an ABI 10 caller's struct ends before it.
  EXPECT_EQ(plain.prepare_wait, absl::Seconds(60));
  ckptd_options_ext waits = {sizeof(ckptd_options_ext), 0, 0, nullptr, nullptr, 0, 2500};
  CKPTD_ASSERT_OK_AND_ASSIGN(ClientOptions waiting, ClientOptionsFromC(&options, &waits));
  EXPECT_EQ(waiting.prepare_wait, absl::Milliseconds(2500));
  waits.prepare_wait_ms = -1;
  CKPTD_ASSERT_OK_AND_ASSIGN(ClientOptions no_wait, ClientOptionsFromC(&options, &waits));
  EXPECT_EQ(no_wait.prepare_wait, absl::ZeroDuration());
  waits.prepare_wait_ms = 0;
  CKPTD_ASSERT_OK_AND_ASSIGN(ClientOptions default_wait, ClientOptionsFromC(&options, &waits));
  EXPECT_EQ(default_wait.prepare_wait, absl::Seconds(60));
  ckptd_options_ext abi10 = waits;
  abi10.size = offsetof(ckptd_options_ext, prepare_wait_ms);
  abi10.prepare_wait_ms = 5;  // outside its struct: not read
  CKPTD_ASSERT_OK_AND_ASSIGN(ClientOptions from_abi10, ClientOptionsFromC(&options, &abi10));
  EXPECT_EQ(from_abi10.prepare_wait, absl::Seconds(60));
  // No socket: the default one (chosen when connecting).
  const ckptd_options no_socket = {nullptr, "job", 0, 1, 0, 0, 0};
  CKPTD_ASSERT_OK_AND_ASSIGN(ClientOptions defaulted, ClientOptionsFromC(&no_socket, nullptr));
  EXPECT_EQ(defaulted.socket, "");

  ckptd_options_ext unset = {0, 1, 0, nullptr, nullptr, 0, 0};
  EXPECT_THAT(ClientOptionsFromC(&options, &unset),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sizeof(ckptd_options_ext)")));
  ckptd_client* client = nullptr;
  EXPECT_EQ(ckptd_connect_ext(&options, &unset, nullptr, 0, &client), 3);
  EXPECT_THAT(ckptd_last_error(), HasSubstr("ext->size"));
  EXPECT_EQ(client, nullptr);
}

// Issue 16, finding 9: a C caller's huge rank or world is an error naming the
// field, never truncated, and sizes it gives are checked before anything is
// allocated for them.
TEST(CApiTest, RankAndWorldOutsideWhatCkptdHandlesAreInvalidArgument) {
  struct Case {
    uint32_t rank;
    uint32_t world_size;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {0, 4294967295u, "world_size 4294967295 is outside 1..1048576"},
           {4294967295u, 4294967295u, "world_size 4294967295 is outside 1..1048576"},
           {0, (1u << 20) + 1, "world_size 1048577 is outside 1..1048576"},
           {4294967295u, 8, "rank 4294967295 is not inside world_size 8"},
           {1, 0, "rank 1 is not inside world_size 1"},  // 0 means 1
           {4, 4, "rank 4 is not inside world_size 4 (rank must be 0..3)"},
       }) {
    ckptd_options options = {"/nonexistent/agent.sock", "job", c.rank, c.world_size, 0, 0, 300};
    float x = 0;
    uint64_t shape[1] = {1};
    ckptd_buffer b = {"x", CKPTD_PARAMS, CKPTD_FLOAT32, 1, shape, nullptr, nullptr, CKPTD_DEVICE_HOST, 0, &x};
    ckptd_client* client = nullptr;
    EXPECT_EQ(ckptd_connect(&options, &b, 1, &client), 3) << c.message;  // INVALID_ARGUMENT, before connecting
    EXPECT_THAT(ckptd_last_error(), HasSubstr(c.message));
    EXPECT_EQ(client, nullptr);
  }
  // The largest world passes the check and fails only at the (absent) agent.
  ckptd_options largest = {"/nonexistent/agent.sock", "job", (1u << 20) - 1, 1u << 20, 0, 0, 300};
  float x = 0;
  uint64_t shape[1] = {1};
  ckptd_buffer b = {"x", CKPTD_PARAMS, CKPTD_FLOAT32, 1, shape, nullptr, nullptr, CKPTD_DEVICE_HOST, 0, &x};
  ckptd_client* client = nullptr;
  const int rc = ckptd_connect(&largest, &b, 1, &client);
  EXPECT_TRUE(rc == 14 || rc == 4) << rc << " " << ckptd_last_error();  // UNAVAILABLE or DEADLINE_EXCEEDED
  EXPECT_EQ(client, nullptr);
}

TEST(CApiTest, HugeBufferCountsAndRanksAreInvalidArgumentNotAnException) {
  ckptd_options options = {"/nonexistent/agent.sock", "job", 0, 1, 0, 0, 300};
  float x = 0;
  uint64_t shape[1] = {1};
  ckptd_buffer b = {"x", CKPTD_PARAMS, CKPTD_FLOAT32, 1, shape, nullptr, nullptr, CKPTD_DEVICE_HOST, 0, &x};
  ckptd_client* client = nullptr;
  // Only the first buffer is ever read: the count is refused first.
  EXPECT_EQ(ckptd_connect(&options, &b, SIZE_MAX, &client), 3);
  EXPECT_THAT(ckptd_last_error(), HasSubstr("count 18446744073709551615 is outside 0..1048576"));
  EXPECT_EQ(client, nullptr);
  // An ndim past any tensor's: refused before the shape is read or copied.
  b.ndim = SIZE_MAX;
  EXPECT_EQ(ckptd_connect(&options, &b, 1, &client), 3);
  EXPECT_THAT(ckptd_last_error(), HasSubstr("buffer 0: ndim 18446744073709551615 is outside 0..64"));
  EXPECT_EQ(client, nullptr);
}

}  // namespace
