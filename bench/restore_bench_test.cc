// Smoke runs of `ckptd-bench register` and `ckptd-bench restore` with tiny
// sizes: checks what they report, not how fast anything was.
#include "bench/restore_bench.h"

#include <sstream>
#include <string>
#include <vector>

#include "base/flags.h"
#include "client/fake_device_copier.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace ckptd::bench {
namespace {

using ::testing::HasSubstr;

google::protobuf::Struct ParseJson(const std::string& text) {
  google::protobuf::Struct json;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text, &json).ok()) << text;
  return json;
}

TEST(RegisterBenchTest, SecondRegistrationTakesTheParkedSegmentOver) {
  std::ostringstream out, err;
  // 3 buffers of 40 MiB in 2 slots: above 64 MiB, allocated in the background.
  ASSERT_EQ(RunRegisterBench({"--bytes", "40M", "--buffers", "3", "--repeat", "1", "--json"}, out, err),
            base::kExitOk)
      << err.str();
  const google::protobuf::Struct json = ParseJson(out.str());
  const auto& f = json.fields();
  for (const char* key : {"bytes", "buffers", "slots", "segment_bytes", "rounds", "first_register_s", "ready_s",
                          "first_snapshot_s", "again_register_s", "again_reused", "again_target_s",
                          "again_target_met"}) {
    EXPECT_TRUE(f.contains(key)) << key << " missing from " << out.str();
  }
  EXPECT_EQ(f.at("buffers").number_value(), 3);
  EXPECT_GE(f.at("segment_bytes").number_value(), 2 * 40.0 * (1 << 20));
  EXPECT_TRUE(f.at("again_reused").bool_value()) << out.str();
  EXPECT_GE(f.at("ready_s").number_value(), f.at("first_register_s").number_value());
}

TEST(RestoreBenchTest, EachTierRestoresVerifiedBytesFromWhereItShould) {
  for (const auto& [from, source] : std::vector<std::pair<std::string, std::string>>{
           {"memory", "memory"}, {"local", "node-local"}, {"root", "storage-root"}}) {
    std::ostringstream out, err;
    ASSERT_EQ(RunRestoreBench({"--bytes", "3M", "--from", from, "--repeat", "2", "--json"}, out, err), base::kExitOk)
        << from << ": " << err.str();
    const google::protobuf::Struct json = ParseJson(out.str());
    const auto& f = json.fields();
    EXPECT_EQ(f.at("source").string_value(), source) << out.str();
    EXPECT_TRUE(f.at("source_as_expected").bool_value()) << out.str();
    EXPECT_TRUE(f.at("verified").bool_value());
    EXPECT_EQ(f.at("rounds").number_value(), 2);
    EXPECT_GT(f.at("restore_s").number_value(), 0);
    EXPECT_TRUE(f.contains(from == "memory" ? "memcpy_s" : "read_s")) << out.str();
    EXPECT_EQ(f.contains("target_met"), from == "memory") << out.str();
  }
}

// --cuda through a copier whose "device" memory is host memory: the restart
// and the rollback restore verified bytes onto the device from the agent's
// memory, and the yardsticks run.
TEST(RestoreBenchTest, DeviceRestoresAreVerifiedAndMeasuredBesideCudaMemcpy) {
  client::FakeDeviceCopier fake;
  std::ostringstream out, err;
  ASSERT_EQ(RunRestoreBench({"--bytes", "3M", "--cuda", "0", "--repeat", "2", "--json"}, out, err, &fake),
            base::kExitOk)
      << err.str();
  const google::protobuf::Struct json = ParseJson(out.str());
  const auto& f = json.fields();
  EXPECT_EQ(f.at("device").string_value(), "cuda:0");
  EXPECT_EQ(f.at("source").string_value(), "memory") << out.str();
  EXPECT_TRUE(f.at("source_as_expected").bool_value());
  EXPECT_TRUE(f.at("verified").bool_value());
  for (const char* key : {"restore_s", "rollback_s", "cuda_memcpy_s", "pageable_memcpy_s", "host_register_s", "ratio",
                          "rollback_ratio", "restore_vs_pageable", "target_ratio", "target_met",
                          "rollback_target_met"}) {
    EXPECT_TRUE(f.contains(key)) << key << " missing from " << out.str();
  }
  EXPECT_GT(f.at("restore_s").number_value(), 0);
  EXPECT_GT(f.at("rollback_s").number_value(), 0);
  EXPECT_EQ(f.at("target_ratio").number_value(), 1.2);
  // The writer's snapshots lock their slots (and after a restore the slots
  // are locked in the background), the yardstick its pattern: everything is
  // unlocked again.
  EXPECT_GE(fake.locks(), 2 * 2);
  EXPECT_EQ(fake.locked(), 0);
  EXPECT_EQ(fake.live(), 0);  // both device buffers freed
  EXPECT_EQ(fake.calls_on_no_device(), 0);
  // The text report says both ratios.
  std::ostringstream text, text_err;
  ASSERT_EQ(RunRestoreBench({"--bytes", "1M", "--cuda", "0", "--repeat", "1"}, text, text_err, &fake), base::kExitOk)
      << text_err.str();
  EXPECT_THAT(text.str(), HasSubstr("onto cuda:0 (read from memory, bytes verified)"));
  EXPECT_THAT(text.str(), HasSubstr("page-locked cudaMemcpy (target <= 1.2x"));
}

// Without a usable device (no GPU here, or no CUDA in the build) --cuda
// fails at once, naming it.
TEST(RestoreBenchTest, CudaWithoutADeviceIsAClearError) {
  if (client::NewCudaCopier().ok()) GTEST_SKIP() << "this machine has a CUDA device";
  std::ostringstream out, err;
  EXPECT_EQ(RunRestoreBench({"--bytes", "1M", "--cuda", "0"}, out, err), base::kExitFailed);
  EXPECT_THAT(err.str(), HasSubstr("--cuda 0: "));
  EXPECT_EQ(out.str(), "");
}

TEST(RestoreBenchTest, BadArgumentsAreUsageErrorsNamingTheFlag) {
  struct Case {
    bool restore;
    std::vector<std::string> argv;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {true, {"--bytes", "1M", "--from", "disk"}, "--from must be memory, peer, local or root, got \"disk\""},
           {true, {"--bytes", "2T"}, "--bytes must be a size in 1..1T"},
           {true, {"--bytes", "1M", "--repeat", "0"}, "--repeat must be an integer in 1..100"},
           {true, {"--from", "root"}, "--bytes is required"},
           {true, {"--bytes", "1M", "--from", "root", "--cuda", "0"}, "--cuda goes with --from memory"},
           {true, {"--bytes", "1M", "--cuda", "1024"}, "--cuda must be an integer in 0..1023"},
           {false, {"--bytes", "1M", "--slots", "17"}, "--slots must be an integer in 1..16"},
           {false, {"--bytes", "1M", "--buffers", "1025"}, "--buffers must be an integer in 1..1024"},
           {false, {"--bytes", "2", "--buffers", "3"}, "cannot be cut into 3 buffers"},
       }) {
    std::ostringstream out, err;
    EXPECT_EQ(c.restore ? RunRestoreBench(c.argv, out, err) : RunRegisterBench(c.argv, out, err), base::kExitUsage)
        << c.message;
    EXPECT_THAT(err.str(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace ckptd::bench
