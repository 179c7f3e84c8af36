#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "agent/agent_core.h"
#include "agent/agent_service.h"
#include "client/ckptd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/mem_file_system.h"
#include "storage/testing_matchers.h"

extern "C" int ckptd_c_smoke(const char* socket, const char* job);

namespace {

using ::testing::HasSubstr;

TEST(CApiTest, ConnectSnapshotRestoreFromC) {
  char tmpl[] = "/tmp/ckptd-capi-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string socket = dir + "/agent.sock";
  ckptd::storage::MemFileSystem mem;
  ASSERT_TRUE(mem.CreateDir("/ckpt").ok());
  ckptd::agent::AgentOptions o;
  o.storage_root = "/ckpt";
  o.io_threads = 1;
  o.segment_prefix = absl::StrCat("/ckptd-test-capi-", ::getpid());
  ckptd::agent::AgentCore core(&mem, o);
  ckptd::agent::AgentService service(&core);
  auto server = ckptd::agent::StartUnixServer(socket, &service);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(ckptd_c_smoke(socket.c_str(), "capi"), 0) << ckptd_last_error();
  (*server)->Shutdown();
  std::system(absl::StrCat("rm -rf ", dir).c_str());
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

}  // namespace
