// A smoke run of `ckptd-bench coordinator` against the real ckptd-coordinator
// with tiny numbers: checks what it reports, not how fast anything was.
#include "bench/coordinator_bench.h"

#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "base/flags.h"
#include "bench/overhead_bench.h"
#include "bench/persist_bench.h"
#include "bench/snapshot_bench.h"
#ifdef CKPTD_HAVE_ETCD
#include "etcd/testing_etcd.h"
#endif
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

#ifdef CKPTD_HAVE_ETCD
TEST(CoordinatorBenchTest, AReplicatedCoordinatorCommitsAndTheWritesToEtcdAreCounted) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  std::ostringstream out, err;
  const int rc = RunCoordinatorBench({"--agents", "20", "--ranks", "16", "--seconds", "2", "--checkpoints", "3",
                                      "--rate", "4", "--channels", "4", "--coordinator-bin", CKPTD_COORDINATOR_BINARY,
                                      "--etcd-endpoints", etcd->endpoints(), "--json"},
                                     out, err);
  ASSERT_EQ(rc, base::kExitOk) << err.str();
  google::protobuf::Struct json;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out.str(), &json).ok()) << out.str();
  const auto& fields = json.fields();
  EXPECT_EQ(fields.at("checkpoints_committed").number_value(), 3);
  ASSERT_TRUE(fields.contains("etcd_writes_per_checkpoint")) << out.str();
  // Each commit saves the job's record (heartbeats write nothing).
  EXPECT_GE(fields.at("etcd_writes_per_checkpoint").number_value(), 1);
  EXPECT_LT(fields.at("etcd_writes_per_checkpoint").number_value(), 10);
  EXPECT_LT(fields.at("etcd_writes_per_s_steady").number_value(), 5);
  EXPECT_GT(fields.at("etcd_db_bytes").number_value(), 0);
}

// The leader SIGKILLed with the agents beating it: a standby leads, every
// agent registers with it, and the next step commits there.
TEST(CoordinatorBenchTest, FailoverToTheStandbyIsMeasured) {
  CKPTD_START_ETCD_OR_SKIP(etcd, 1);
  std::ostringstream out, err;
  const int rc = RunCoordinatorBench({"--agents", "20", "--ranks", "16", "--seconds", "1", "--checkpoints", "2",
                                      "--rate", "4", "--channels", "4", "--coordinator-bin", CKPTD_COORDINATOR_BINARY,
                                      "--etcd-endpoints", etcd->endpoints(), "--failover", "--json"},
                                     out, err);
  ASSERT_EQ(rc, base::kExitOk) << err.str();
  google::protobuf::Struct json;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out.str(), &json).ok()) << out.str();
  const auto& fields = json.fields();
  for (const char* key : {"failover_serving_s", "failover_registered_s", "failover_commit_s"}) {
    ASSERT_TRUE(fields.contains(key)) << key << " missing from " << out.str();
  }
  const double serving = fields.at("failover_serving_s").number_value();
  const double registered = fields.at("failover_registered_s").number_value();
  const double committed = fields.at("failover_commit_s").number_value();
  // The standby waits out the dead leader's lease (3 s) before it leads.
  EXPECT_GT(serving, 0.5);
  EXPECT_LE(serving, registered);
  EXPECT_LE(registered, committed);
  EXPECT_LT(committed, 60);
  EXPECT_EQ(fields.at("checkpoints_committed").number_value(), 2);
  EXPECT_FALSE(fields.contains("first_error")) << out.str();
}
#endif

TEST(CoordinatorBenchTest, FailoverWithoutEtcdIsAUsageError) {
  std::ostringstream out, err;
  EXPECT_EQ(RunCoordinatorBench({"--agents", "2", "--ranks", "2", "--failover"}, out, err), base::kExitUsage);
  EXPECT_THAT(err.str(), HasSubstr("--failover needs --etcd-endpoints"));
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

// Issue 16, finding 9: every benchmark's numbers are parsed wide and checked
// before anything runs or is allocated (--threads 100000 was a thread pool
// of 100000, --repeat 1000 silently 100, --bytes 16777216T an overflow).
TEST(BenchFlagsTest, NumbersOutsideTheirRangeAreUsageErrorsNamingTheFlag) {
  using Bench = std::function<int(const std::vector<std::string>&, std::ostream&, std::ostream&)>;
  // Never written: every command line below is refused before anything runs.
  const std::string dir = ::testing::TempDir() + "/ckptd-bench-flags";
  struct Case {
    Bench run;
    std::vector<std::string> argv;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {RunPersistBench, {"--dir", dir, "--bytes", "1M", "--threads", "100000"},
            "--threads must be an integer in 1..1024, got \"100000\""},
           {RunPersistBench, {"--dir", dir, "--bytes", "1M", "--threads", "4294967297"},
            "--threads must be an integer in 1..1024"},
           {RunPersistBench, {"--dir", dir, "--bytes", "16777216T"}, "--bytes must be a size in 1..1T"},
           {RunPersistBench, {"--dir", dir, "--bytes", "2T"}, "--bytes must be a size in 1..1T"},
           {RunPersistBench, {"--dir", dir, "--bytes", "1M", "--io-depth", "4294967297"},
            "--io-depth must be an integer in 1..256"},
           {RunPersistBench, {"--dir", dir, "--bytes", "1M", "--step", "18446744073709551615"},
            "--step must be an integer in 0..4611686018427387904"},
           {RunSnapshotBench, {"--bytes", "1M", "--repeat", "1000"}, "--repeat must be an integer in 1..100"},
           {RunSnapshotBench, {"--bytes", "1M", "--threads", "100000"}, "--threads must be an integer in 1..1024"},
           {RunSnapshotBench, {"--bytes", "1M", "--cuda", "4294967296"}, "--cuda must be an integer in 0..1023"},
           {RunOverheadBench, {"--state-mb", "18446744073709551615"}, "--state-mb must be an integer in 1..65536"},
           {RunOverheadBench, {"--step-ms", "18446744073709551615"}, "--step-ms must be an integer in 0..3600000"},
           {RunOverheadBench, {"--every", "1,4294967296000"}, "--every must be integers in 1..1099511627776"},
           {RunCoordinatorBench, {"--seconds", "1e300"}, "--seconds must be at most 86400"},
       }) {
    std::ostringstream out, err;
    EXPECT_EQ(c.run(c.argv, out, err), base::kExitUsage) << c.message;
    EXPECT_THAT(err.str(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace ckptd::bench
