// A smoke run of `ckptd-bench reshard` with tiny sizes: checks what it
// reports (the shards each way opens, the bytes verified), not how fast.
#include "bench/reshard_bench.h"

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

TEST(ReshardBenchTest, CoordinatedRanksOpenOnlyTheShardsTheyRead) {
  std::ostringstream out, err;
  ASSERT_EQ(RunReshardBench({"--saved-ranks", "8", "--ranks", "4", "--tensors", "3", "--rows-per-rank", "2",
                             "--cols", "16", "--json"},
                            out, err),
            base::kExitOk)
      << err.str();
  google::protobuf::Struct json;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out.str(), &json).ok()) << out.str();
  const auto& f = json.fields();
  EXPECT_TRUE(f.at("verified").bool_value());
  EXPECT_EQ(f.at("bytes").number_value(), 8 * 3 * 2 * 16 * 4);
  // Self-planned: every rank opens the 8 saved shards (kept open for the reads).
  EXPECT_EQ(f.at("self_shards_opened").number_value(), 4 * 8);
  // Coordinated: the layout reads 8; rank 0 opens shards 0 and 1 (its rows
  // and its RNG), ranks 1..3 two for their rows and one for their RNG.
  EXPECT_EQ(f.at("coordinated_layout_shards").number_value(), 8);
  EXPECT_EQ(f.at("coordinated_shards_opened").number_value(), 2 + 3 * 3);
  EXPECT_DOUBLE_EQ(f.at("opened_ratio").number_value(), (8.0 + 11.0) / 32.0);
  for (const char* key : {"self_s", "self_rank_s", "coordinated_layout_s", "coordinated_plan_s", "coordinated_s",
                          "coordinated_rank_s", "time_ratio"}) {
    EXPECT_TRUE(f.contains(key)) << key << " missing from " << out.str();
  }
}

TEST(ReshardBenchTest, BadArgumentsAreUsageErrorsNamingTheFlag) {
  for (const auto& [argv, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--saved-ranks", "0"}, "--saved-ranks must be an integer in 1..4096"},
           {{"--ranks", "5000"}, "--ranks must be an integer in 1..4096"},
           {{"--cols", "x"}, "--cols must be an integer in 1..65536"},
           {{"--bytes", "1M"}, "--bytes"},
       }) {
    std::ostringstream out, err;
    EXPECT_EQ(RunReshardBench(argv, out, err), base::kExitUsage) << message;
    EXPECT_THAT(err.str(), HasSubstr(message));
  }
}

}  // namespace
}  // namespace ckptd::bench
