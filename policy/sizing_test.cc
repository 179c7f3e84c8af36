#include "policy/sizing.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/interval_policy.h"

namespace ckptd::policy {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(BytesPerParameterTest, Table) {
  struct Case {
    const char* dtype;
    const char* optimizer;
    double weights, grads, optimizer_bytes;
  };
  const double scales = 8.0 / 2048;  // two fp32 scales per block of 2048
  for (const Case& c : {Case{"bf16", "adam", 2, 2, 12}, Case{"fp16", "adam", 2, 2, 12}, Case{"fp32", "adam", 4, 4, 8},
                        Case{"bf16", "adam-8bit", 2, 2, 6 + scales}, Case{"fp32", "adam-8bit", 4, 4, 2 + scales},
                        Case{"bf16", "sgd", 2, 2, 8}, Case{"fp32", "sgd", 4, 4, 4}}) {
    absl::StatusOr<BytesPerParam> b = BytesPerParameter(c.dtype, c.optimizer);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->weights, c.weights) << c.dtype << " " << c.optimizer;
    EXPECT_EQ(b->grads, c.grads) << c.dtype << " " << c.optimizer;
    EXPECT_DOUBLE_EQ(b->optimizer, c.optimizer_bytes) << c.dtype << " " << c.optimizer;
  }
  // Mixed-precision Adam: the ZeRO paper's 16 bytes per parameter.
  absl::StatusOr<BytesPerParam> b = BytesPerParameter("bf16", "adam");
  EXPECT_EQ(b->weights + b->grads + b->optimizer, 16);
}

TEST(BytesPerParameterTest, UnknownNamesListTheAccepted) {
  absl::StatusOr<BytesPerParam> b = BytesPerParameter("fp8", "adam");
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(b.status().message(), AllOf(HasSubstr("\"fp8\""), HasSubstr("bf16, fp16, fp32")));
  b = BytesPerParameter("bf16", "lion");
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(b.status().message(), AllOf(HasSubstr("\"lion\""), HasSubstr("adam, adam-8bit, sgd")));
}

PlanInputs SevenB() {
  PlanInputs in;
  in.params = 7e9;
  in.gpus = 64;
  in.zero = 1;
  return in;
}

TEST(PlanCheckpointTest, SevenBillionZero1) {
  absl::StatusOr<Plan> p = PlanCheckpoint(SevenB());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dp, 64);
  EXPECT_EQ(p->nodes, 8);
  EXPECT_EQ(p->ranks_per_node, 8);
  EXPECT_EQ(p->params_per_rank, 7e9);
  EXPECT_EQ(p->params_bytes, 14e9);
  EXPECT_EQ(p->grads_bytes, 14e9);
  EXPECT_EQ(p->optimizer_bytes, 84e9 / 64);
  EXPECT_EQ(p->rng_bytes, 7572);
  EXPECT_EQ(p->data_cursor_bytes, 4096);
  const double rank = 14e9 + 14e9 + 84e9 / 64 + 7572 + 4096;
  EXPECT_DOUBLE_EQ(p->rank_bytes, rank);
  EXPECT_DOUBLE_EQ(p->node_bytes, 8 * rank);
  EXPECT_DOUBLE_EQ(p->job_bytes, 64 * rank);
  EXPECT_DOUBLE_EQ(p->stall_s, rank / 25e9);     // ≈ 1.17 s
  EXPECT_DOUBLE_EQ(p->persist_s, 8 * rank / 2e9);  // ≈ 117 s
  EXPECT_DOUBLE_EQ(p->delta_s, p->stall_s);
  EXPECT_DOUBLE_EQ(p->job_mtbf_s, 3600 / (64 * 3e-6));  // ≈ 217 days
  // Daly for δ ≈ 1.17 s, M ≈ 1.9e7 s: sqrt(2δM) ≈ 6.6e3 s, above P.
  EXPECT_DOUBLE_EQ(p->interval.daly_s, DalyOptimum(p->delta_s, p->job_mtbf_s));
  EXPECT_DOUBLE_EQ(p->interval.interval_s, p->interval.daly_s);
  EXPECT_DOUBLE_EQ(p->interval.expected_waste,
                   ExpectedWaste(p->interval.interval_s, p->delta_s, 300, p->job_mtbf_s));
  EXPECT_DOUBLE_EQ(p->interval.alternative_waste, ExpectedWaste(1800, p->delta_s, 300, p->job_mtbf_s));
}

TEST(PlanCheckpointTest, ZeroStagesPartitionMore) {
  PlanInputs in = SevenB();
  in.zero = 0;
  absl::StatusOr<Plan> p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->optimizer_bytes, 84e9);
  in.zero = 2;
  p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->params_bytes, 14e9);
  EXPECT_EQ(p->grads_bytes, 14e9 / 64);
  EXPECT_EQ(p->optimizer_bytes, 84e9 / 64);
  in.zero = 3;
  p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->params_bytes, 14e9 / 64);
  EXPECT_EQ(p->grads_bytes, 14e9 / 64);
  EXPECT_EQ(p->optimizer_bytes, 84e9 / 64);
  // Sharded evenly: the job holds each byte of model state once, plus per-rank constants.
  EXPECT_DOUBLE_EQ(p->job_bytes, 112e9 + 64 * (7572 + 4096));
}

TEST(PlanCheckpointTest, ModelParallelSplitsParameters) {
  // 70B, 512 GPUs, tp 8, pp 4: dp 16, 70e9/32 parameters per rank.
  PlanInputs in;
  in.params = 70e9;
  in.gpus = 512;
  in.tp = 8;
  in.pp = 4;
  in.zero = 1;
  absl::StatusOr<Plan> p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dp, 16);
  EXPECT_EQ(p->params_per_rank, 70e9 / 32);
  EXPECT_EQ(p->params_bytes, 2 * 70e9 / 32);
  EXPECT_EQ(p->optimizer_bytes, 12 * 70e9 / 32 / 16);
  EXPECT_EQ(p->nodes, 64);
}

TEST(PlanCheckpointTest, PersistFloorsTheInterval) {
  // Slow storage: fp32 Adam, no ZeRO, 8 ranks per node of 1e9 params each
  // (16 GB per rank) at 0.1 GB/s: persist 1280 s; a high failure rate makes
  // Daly shorter than that.
  PlanInputs in;
  in.params = 1e9;
  in.gpus = 8;
  in.dtype = "fp32";
  in.write_gbps = 0.1;
  in.fail_rate_per_gpu_hour = 0.01;  // M = 12.5 h, δ = 0.64 s: Daly ≈ 240 s
  absl::StatusOr<Plan> p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(p->persist_s, 8 * (16e9 + 11668) / 0.1e9, 1e-6);
  EXPECT_LT(p->interval.daly_s, p->persist_s);
  EXPECT_EQ(p->interval.interval_s, p->persist_s);
  EXPECT_EQ(p->interval.reason, "raised to persist time P");
}

TEST(PlanCheckpointTest, FewerGpusThanANode) {
  PlanInputs in;
  in.params = 1e8;
  in.gpus = 2;
  absl::StatusOr<Plan> p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->nodes, 1);
  EXPECT_EQ(p->ranks_per_node, 2);
  EXPECT_DOUBLE_EQ(p->node_bytes, p->job_bytes);
}

TEST(PlanCheckpointTest, InvalidInputsNameTheValue) {
  struct Case {
    PlanInputs in;
    std::string want;
  };
  std::vector<Case> cases;
  auto with = [&](auto change, std::string want) {
    PlanInputs in = SevenB();
    change(in);
    cases.push_back({in, std::move(want)});
  };
  with([](PlanInputs& in) { in.params = 0; }, "params must be positive and finite, got 0");
  with([](PlanInputs& in) { in.params = std::numeric_limits<double>::quiet_NaN(); }, "params must be positive");
  with([](PlanInputs& in) { in.gpus = -8; }, "gpus must be at least 1, got -8");
  with([](PlanInputs& in) { in.dtype = "int4"; }, "unknown dtype \"int4\" (accepted: bf16, fp16, fp32)");
  with([](PlanInputs& in) { in.optimizer = "adagrad"; }, "unknown optimizer \"adagrad\"");
  with([](PlanInputs& in) { in.zero = 4; }, "zero stage must be 0, 1, 2 or 3, got 4");
  with([](PlanInputs& in) { in.zero = -1; }, "got -1");
  with([](PlanInputs& in) { in.tp = 0; }, "tp must be at least 1, got 0");
  with([](PlanInputs& in) { in.pp = 0; }, "pp must be at least 1");
  with([](PlanInputs& in) { in.tp = 3; }, "gpus 64 is not a multiple of tp·pp = 3 (tp 3, pp 1)");
  with([](PlanInputs& in) { in.gpus_per_node = 0; }, "gpus_per_node must be at least 1");
  with([](PlanInputs& in) { in.d2h_gbps = -1; }, "d2h_gbps must be positive and finite, got -1");
  with([](PlanInputs& in) { in.write_gbps = 0; }, "write_gbps");
  with([](PlanInputs& in) { in.fail_rate_per_gpu_hour = 0; }, "fail_rate_per_gpu_hour");
  with([](PlanInputs& in) { in.restart_s = -3; }, "restart_s must be non-negative and finite, got -3");
  with([](PlanInputs& in) { in.alternative_s = 0; }, "alternative_s");
  for (const Case& c : cases) {
    absl::StatusOr<Plan> p = PlanCheckpoint(c.in);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << c.want;
    EXPECT_THAT(p.status().message(), HasSubstr(c.want));
  }
}

}  // namespace
}  // namespace ckptd::policy
