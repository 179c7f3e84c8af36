// Smoke runs of `ckptd-bench register` and `ckptd-bench restore` with tiny
// sizes: checks what they report, not how fast anything was.
#include "bench/restore_bench.h"

#include <sstream>
#include <string>
#include <vector>

#include "base/flags.h"
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
           {false, {"--bytes", "1M", "--slots", "17"}, "--slots must be an integer in 1..16"},
           {false, {"--bytes", "1M", "--buffers", "1025"}, "--buffers must be an integer in 1..1024"},
           {false, {"--bytes", "2", "--buffers", "3"}, "cannot be cut into 3 buffers"},
       }) {
    std::ostringstream out, err;
    EXPECT_EQ((c.restore ? RunRestoreBench : RunRegisterBench)(c.argv, out, err), base::kExitUsage) << c.message;
    EXPECT_THAT(err.str(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace ckptd::bench
