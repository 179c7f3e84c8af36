// A smoke run of `ckptd-bench coordinator` against the real ckptd-coordinator
// with tiny numbers: checks what it reports, not how fast anything was.
#include "bench/coordinator_bench.h"

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

TEST(CoordinatorBenchTest, SmallRunCommitsEveryCheckpointAndReportsTheFields) {
  std::ostringstream out, err;
  const int rc = RunCoordinatorBench({"--agents", "20", "--ranks", "16", "--seconds", "2", "--checkpoints", "3",
                                      "--rate", "4", "--channels", "4", "--coordinator-bin", CKPTD_COORDINATOR_BINARY,
                                      "--json"},
                                     out, err);
  ASSERT_EQ(rc, base::kExitOk) << err.str();
  google::protobuf::Struct json;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out.str(), &json).ok()) << out.str();
  const auto& fields = json.fields();
  for (const char* key :
       {"agents", "ranks", "rate_hz", "heartbeats_per_s", "coordinator_cores", "loadgen_cores", "checkpoints",
        "commit_latency_p50_ms", "commit_latency_p99_ms", "commit_latency_max_ms", "cores_target_met",
        "latency_target_met", "all_committed", "agents_alive"}) {
    EXPECT_TRUE(fields.contains(key)) << key << " missing from " << out.str();
  }
  EXPECT_EQ(fields.at("agents").number_value(), 20);
  EXPECT_EQ(fields.at("ranks").number_value(), 16);
  EXPECT_EQ(fields.at("rank_agents").number_value(), 2);
  EXPECT_EQ(fields.at("checkpoints").number_value(), 3);
  EXPECT_EQ(fields.at("checkpoints_committed").number_value(), 3);
  EXPECT_EQ(fields.at("coordinator_checkpoints_committed").number_value(), 3);
  EXPECT_EQ(fields.at("manifests_verified").number_value(), 3);
  EXPECT_TRUE(fields.at("all_committed").bool_value());
  EXPECT_EQ(fields.at("commit_latency_ms").list_value().values_size(), 3);
  EXPECT_EQ(fields.at("agents_alive").number_value(), 20);
  EXPECT_EQ(fields.at("streams_broken").number_value(), 0);
  EXPECT_EQ(fields.at("acks_unknown").number_value(), 0);
  EXPECT_GT(fields.at("heartbeats_per_s").number_value(), 0);
  EXPECT_GT(fields.at("coordinator_cores").number_value(), 0);
  EXPECT_GE(fields.at("commit_latency_max_ms").number_value(), fields.at("commit_latency_p50_ms").number_value());
  EXPECT_FALSE(fields.contains("coordinator_exit")) << out.str();
}

TEST(CoordinatorBenchTest, TooFewAgentsForTheRanksIsAUsageError) {
  std::ostringstream out, err;
  EXPECT_EQ(RunCoordinatorBench({"--agents", "10", "--ranks", "4096"}, out, err), base::kExitUsage);
  EXPECT_THAT(err.str(), HasSubstr("need 512 agents; --agents is 10"));
}

TEST(CoordinatorBenchTest, MissingCoordinatorBinaryFailsNamingIt) {
  std::ostringstream out, err;
  EXPECT_EQ(RunCoordinatorBench({"--agents", "2", "--ranks", "2", "--checkpoints", "1", "--coordinator-bin",
                                 "/nonexistent/ckptd-coordinator"},
                                out, err),
            base::kExitFailed);
  EXPECT_THAT(err.str(), HasSubstr("cannot run /nonexistent/ckptd-coordinator"));
}

}  // namespace
}  // namespace ckptd::bench
