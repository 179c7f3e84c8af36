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
  PlanInputs in = SevenB();
  in.replicated = ReplicatedWrites::kOnce;
  absl::StatusOr<Plan> p = PlanCheckpoint(in);
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
  // Counted as written once (declared replicated state): weights and grads are
  // replicated over the 64 ranks, each writes 1/64 of them and its own 1/64 of
  // the optimizer state.
  const double share = 112e9 / 64 + 7572 + 4096;
  EXPECT_DOUBLE_EQ(p->unique_bytes, 112e9 + 64 * (7572 + 4096));
  EXPECT_DOUBLE_EQ(p->rank_write_bytes, share);
  EXPECT_DOUBLE_EQ(p->node_write_bytes, 8 * share);
  EXPECT_DOUBLE_EQ(p->job_write_bytes, 64 * share);
  EXPECT_DOUBLE_EQ(p->stall_s, rank / 25e9);        // ≈ 1.17 s: the whole state
  EXPECT_DOUBLE_EQ(p->persist_s, 8 * share / 2e9);  // ≈ 7 s: the node's share
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
  // (16 GB per rank), each written by every rank, at 0.1 GB/s: persist 1280 s;
  // a high failure rate makes Daly shorter than that.
  PlanInputs in;
  in.params = 1e9;
  in.gpus = 8;
  in.dtype = "fp32";
  in.replicated = ReplicatedWrites::kEvery;
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

// The default is what ckptd writes of declared replicated state: once per
// job. Undeclared (kEvery): 70B, 8192 GPUs, ZeRO-0: every rank writes its
// 1.12 TB, 9.18 PB per job and a 75-minute persist that raises the interval.
TEST(PlanCheckpointTest, UndeclaredReplicatedStateCountsEveryRankWritingItsWholeState) {
  EXPECT_EQ(PlanInputs().replicated, ReplicatedWrites::kOnce);
  PlanInputs in;
  in.replicated = ReplicatedWrites::kEvery;
  in.params = 70e9;
  in.gpus = 8192;
  absl::StatusOr<Plan> p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  const double fixed = 7572 + 4096;
  EXPECT_EQ(p->dp, 8192);
  EXPECT_DOUBLE_EQ(p->rank_bytes, 1.12e12 + fixed);
  EXPECT_DOUBLE_EQ(p->unique_bytes, 1.12e12 + 8192 * fixed);
  EXPECT_DOUBLE_EQ(p->rank_write_bytes, p->rank_bytes);
  EXPECT_DOUBLE_EQ(p->node_write_bytes, 8 * (1.12e12 + fixed));
  EXPECT_DOUBLE_EQ(p->job_write_bytes, p->job_bytes);
  EXPECT_NEAR(p->job_write_bytes, 9.18e15, 0.005e15);
  EXPECT_DOUBLE_EQ(p->persist_s, 8 * (1.12e12 + fixed) / 2e9);  // ≈ 4480 s
  EXPECT_NEAR(p->persist_s, 4480, 1e-3);
  EXPECT_EQ(p->interval.reason, "raised to persist time P");
  EXPECT_DOUBLE_EQ(p->interval.interval_s, p->persist_s);
}

// Declared (the default): 70B, 8192 GPUs, ZeRO-0, every rank holds 1.12 TB, and
// the job's state is 16 B/param × 70e9 = 1.12 TB; counted as written once,
// each rank writes a 1/8192 sliver of it.
TEST(PlanCheckpointTest, SeventyBillionOn8192GpusCountedAsWrittenOnce) {
  PlanInputs in;
  in.params = 70e9;
  in.gpus = 8192;
  in.replicated = ReplicatedWrites::kOnce;
  absl::StatusOr<Plan> p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  const double fixed = 7572 + 4096;
  EXPECT_EQ(p->dp, 8192);
  EXPECT_DOUBLE_EQ(p->rank_bytes, 1.12e12 + fixed);          // held: the whole model state
  EXPECT_DOUBLE_EQ(p->job_bytes, 8192 * (1.12e12 + fixed));  // ≈ 9.18 PB held
  EXPECT_DOUBLE_EQ(p->unique_bytes, 1.12e12 + 8192 * fixed);
  const double share = 1.12e12 / 8192 + fixed;  // ≈ 136.73 MB
  EXPECT_DOUBLE_EQ(p->rank_write_bytes, share);
  EXPECT_NEAR(p->rank_write_bytes, 136.73e6, 0.01e6);
  EXPECT_DOUBLE_EQ(p->node_write_bytes, 8 * share);
  EXPECT_DOUBLE_EQ(p->job_write_bytes, p->unique_bytes);
  EXPECT_DOUBLE_EQ(p->stall_s, (1.12e12 + fixed) / 25e9);  // the whole state is snapshotted: 44.8 s
  EXPECT_DOUBLE_EQ(p->persist_s, 8 * share / 2e9);         // ≈ 0.55 s
  EXPECT_LT(p->persist_s, 1);
  // Daly's optimum (≈ 60 min) stands: such a persist would not raise it.
  EXPECT_EQ(p->interval.reason, "Daly optimum");
  EXPECT_DOUBLE_EQ(p->interval.interval_s, DalyOptimum(p->delta_s, p->job_mtbf_s));
  EXPECT_LT(p->interval.interval_s, 3600);

  // As ckptd writes, every rank writes its 1.12 TB: 9.18 PB per job and a
  // 75-minute persist that raises the interval.
  in.replicated = ReplicatedWrites::kEvery;
  absl::StatusOr<Plan> every = PlanCheckpoint(in);
  ASSERT_TRUE(every.ok()) << every.status();
  EXPECT_DOUBLE_EQ(every->unique_bytes, p->unique_bytes);
  EXPECT_DOUBLE_EQ(every->rank_bytes, p->rank_bytes);
  EXPECT_DOUBLE_EQ(every->rank_write_bytes, 1.12e12 + fixed);
  EXPECT_DOUBLE_EQ(every->job_write_bytes, 8192 * (1.12e12 + fixed));
  EXPECT_NEAR(every->job_write_bytes, 9.18e15, 0.005e15);
  EXPECT_DOUBLE_EQ(every->persist_s, 8 * (1.12e12 + fixed) / 2e9);  // ≈ 4480 s
  EXPECT_EQ(every->interval.reason, "raised to persist time P");
  EXPECT_DOUBLE_EQ(every->interval.interval_s, every->persist_s);
  EXPECT_DOUBLE_EQ(every->stall_s, p->stall_s);
}

// Whatever the ZeRO stage, `once` counts 1/dp of each rank's tp/pp shard of
// the model state; `every` counts what the rank holds, which ZeRO shrinks.
TEST(PlanCheckpointTest, WrittenBytesAcrossZeroStages) {
  const double fixed = 7572 + 4096;
  const double unique = 7e9 * 16 + 64 * fixed;
  const double once_share = 7e9 * 16 / 64 + fixed;
  struct Case {
    int zero;
    double held;  // per rank
  };
  for (const Case& c : {Case{0, 7e9 * 16 + fixed}, Case{1, 7e9 * 4 + 7e9 * 12 / 64 + fixed},
                        Case{2, 7e9 * 2 + 7e9 * 14 / 64 + fixed}, Case{3, 7e9 * 16 / 64 + fixed}}) {
    PlanInputs in = SevenB();
    in.zero = c.zero;
    in.replicated = ReplicatedWrites::kOnce;
    absl::StatusOr<Plan> once = PlanCheckpoint(in);
    ASSERT_TRUE(once.ok()) << once.status();
    EXPECT_DOUBLE_EQ(once->rank_bytes, c.held) << "ZeRO-" << c.zero;
    EXPECT_DOUBLE_EQ(once->unique_bytes, unique) << "ZeRO-" << c.zero;
    EXPECT_DOUBLE_EQ(once->rank_write_bytes, once_share) << "ZeRO-" << c.zero;
    EXPECT_DOUBLE_EQ(once->node_write_bytes, 8 * once_share) << "ZeRO-" << c.zero;
    EXPECT_DOUBLE_EQ(once->job_write_bytes, unique) << "ZeRO-" << c.zero;
    EXPECT_DOUBLE_EQ(once->persist_s, 8 * once_share / 2e9) << "ZeRO-" << c.zero;
    EXPECT_DOUBLE_EQ(once->stall_s, c.held / 25e9) << "ZeRO-" << c.zero;

    in.replicated = ReplicatedWrites::kEvery;
    absl::StatusOr<Plan> every = PlanCheckpoint(in);
    ASSERT_TRUE(every.ok()) << every.status();
    EXPECT_DOUBLE_EQ(every->unique_bytes, unique) << "ZeRO-" << c.zero;
    EXPECT_DOUBLE_EQ(every->rank_write_bytes, c.held) << "ZeRO-" << c.zero;
    EXPECT_DOUBLE_EQ(every->node_write_bytes, 8 * c.held) << "ZeRO-" << c.zero;
    EXPECT_DOUBLE_EQ(every->job_write_bytes, 64 * c.held) << "ZeRO-" << c.zero;
    EXPECT_DOUBLE_EQ(every->persist_s, 8 * c.held / 2e9) << "ZeRO-" << c.zero;
    // ZeRO-3 partitions everything: nothing is replicated, so both write the same.
    if (c.zero == 3) {
      EXPECT_DOUBLE_EQ(every->rank_write_bytes, once->rank_write_bytes);
    } else {
      EXPECT_GT(every->rank_write_bytes, 2 * once->rank_write_bytes) << "ZeRO-" << c.zero;
    }
  }
}

TEST(PlanCheckpointTest, WrittenBytesWithModelParallelism) {
  // 70B, 512 GPUs, tp 8, pp 4, ZeRO-1: dp 16; each rank holds 70e9/32
  // parameters' weights and grads whole and 1/16 of their optimizer state.
  PlanInputs in;
  in.params = 70e9;
  in.gpus = 512;
  in.tp = 8;
  in.pp = 4;
  in.zero = 1;
  in.replicated = ReplicatedWrites::kOnce;
  const double fixed = 7572 + 4096;
  const double shard = 70e9 / 32;
  absl::StatusOr<Plan> p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->unique_bytes, 70e9 * 16 + 512 * fixed);
  EXPECT_DOUBLE_EQ(p->rank_write_bytes, shard * 16 / 16 + fixed);
  EXPECT_DOUBLE_EQ(p->node_write_bytes, 8 * (shard + fixed));
  EXPECT_NEAR(p->job_write_bytes, p->unique_bytes, p->unique_bytes * 1e-12);
  EXPECT_DOUBLE_EQ(p->rank_bytes, shard * 4 + shard * 12 / 16 + fixed);

  in.replicated = ReplicatedWrites::kEvery;
  p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->rank_write_bytes, shard * 4 + shard * 12 / 16 + fixed);
  EXPECT_DOUBLE_EQ(p->job_write_bytes, 512 * (shard * 4 + shard * 12 / 16 + fixed));

  // dp 1 (tp·pp = G): nothing is replicated; both ways write what is held.
  in.gpus = 32;
  in.zero = 0;
  for (ReplicatedWrites r : {ReplicatedWrites::kOnce, ReplicatedWrites::kEvery}) {
    in.replicated = r;
    p = PlanCheckpoint(in);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->dp, 1);
    EXPECT_DOUBLE_EQ(p->rank_write_bytes, p->rank_bytes) << ReplicatedWritesName(r);
    EXPECT_DOUBLE_EQ(p->job_write_bytes, p->unique_bytes) << ReplicatedWritesName(r);
  }
}

TEST(PlanCheckpointTest, WrittenBytesOnFewerGpusThanANode) {
  // 1e8 params on 2 GPUs, ZeRO-0, dp 2: one node of 2 ranks writes the job.
  PlanInputs in;
  in.params = 1e8;
  in.gpus = 2;
  in.replicated = ReplicatedWrites::kOnce;
  const double fixed = 7572 + 4096;
  absl::StatusOr<Plan> p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->rank_write_bytes, 1e8 * 16 / 2 + fixed);
  EXPECT_DOUBLE_EQ(p->node_write_bytes, p->job_write_bytes);
  EXPECT_DOUBLE_EQ(p->node_write_bytes, 1.6e9 + 2 * fixed);
  EXPECT_DOUBLE_EQ(p->job_write_bytes, p->unique_bytes);
  EXPECT_DOUBLE_EQ(p->persist_s, (1.6e9 + 2 * fixed) / 2e9);
  in.replicated = ReplicatedWrites::kEvery;
  p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->node_write_bytes, 2 * (1.6e9 + fixed));
  EXPECT_DOUBLE_EQ(p->node_write_bytes, p->node_bytes);
}

TEST(ReplicatedWritesTest, NamesRoundTripAndUnknownOnesListTheAccepted) {
  for (ReplicatedWrites r : {ReplicatedWrites::kOnce, ReplicatedWrites::kEvery}) {
    absl::StatusOr<ReplicatedWrites> parsed = ParseReplicatedWrites(ReplicatedWritesName(r));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, r);
  }
  EXPECT_EQ(ReplicatedWritesName(ReplicatedWrites::kOnce), "once");
  EXPECT_EQ(ReplicatedWritesName(ReplicatedWrites::kEvery), "every");
  absl::StatusOr<ReplicatedWrites> bad = ParseReplicatedWrites("twice");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), AllOf(HasSubstr("\"twice\""), HasSubstr("accepted: once, every")));
  EXPECT_FALSE(ParseReplicatedWrites("Once").ok());
  EXPECT_FALSE(ParseReplicatedWrites("").ok());
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
  with([](PlanInputs& in) { in.params = 0; }, "params must be a whole number in 1..9007199254740992, got 0");
  with([](PlanInputs& in) { in.params = std::numeric_limits<double>::quiet_NaN(); }, "params must be a whole number");
  with([](PlanInputs& in) { in.params = 2.5; }, "params must be a whole number in 1..9007199254740992, got 2.5");
  with([](PlanInputs& in) { in.params = kMaxPlanParams * 2; }, "params must be a whole number in 1..");
  with([](PlanInputs& in) { in.params = std::numeric_limits<double>::infinity(); }, "params must be a whole number");
  with([](PlanInputs& in) { in.gpus = -8; }, "gpus must be at least 1, got -8");
  with([](PlanInputs& in) { in.dtype = "int4"; }, "unknown dtype \"int4\" (accepted: bf16, fp16, fp32)");
  with([](PlanInputs& in) { in.optimizer = "adagrad"; }, "unknown optimizer \"adagrad\"");
  with([](PlanInputs& in) { in.zero = 4; }, "zero stage must be 0, 1, 2 or 3, got 4");
  with([](PlanInputs& in) { in.zero = -1; }, "got -1");
  with([](PlanInputs& in) { in.tp = 0; }, "tp must be at least 1, got 0");
  with([](PlanInputs& in) { in.pp = 0; }, "pp must be at least 1");
  with([](PlanInputs& in) { in.tp = 3; }, "gpus 64 is not a multiple of tp·pp = 3 (tp 3, pp 1)");
  with([](PlanInputs& in) { in.gpus_per_node = 0; }, "gpus_per_node must be at least 1");
  with([](PlanInputs& in) { in.d2h_gbps = -1; }, "d2h_gbps must be in 1e-09..1e+09, got -1");
  with([](PlanInputs& in) { in.d2h_gbps = 2e9; }, "d2h_gbps must be in 1e-09..1e+09, got 2e+09");
  with([](PlanInputs& in) { in.d2h_gbps = std::numeric_limits<double>::quiet_NaN(); }, "d2h_gbps must be in");
  with([](PlanInputs& in) { in.write_gbps = 0; }, "write_gbps must be in 1e-09..1e+09, got 0");
  with([](PlanInputs& in) { in.write_gbps = std::numeric_limits<double>::infinity(); }, "write_gbps must be in");
  with([](PlanInputs& in) { in.fail_rate_per_gpu_hour = 0; }, "fail_rate_per_gpu_hour must be in 1e-30..1e+06");
  with([](PlanInputs& in) { in.fail_rate_per_gpu_hour = 1e7; }, "fail_rate_per_gpu_hour must be in");
  with([](PlanInputs& in) { in.restart_s = -3; }, "restart_s must be in 0..1e+12, got -3");
  with([](PlanInputs& in) { in.restart_s = 1e13; }, "restart_s must be in 0..1e+12, got 1e+13");
  with([](PlanInputs& in) { in.alternative_s = 0; }, "alternative_s must be in 1e-06..1e+12, got 0");
  with([](PlanInputs& in) { in.replicated = static_cast<ReplicatedWrites>(7); }, "replicated must be once or every");
  for (const Case& c : cases) {
    absl::StatusOr<Plan> p = PlanCheckpoint(c.in);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << c.want;
    EXPECT_THAT(p.status().message(), HasSubstr(c.want));
  }
}

// Issue 39, finding 8: ZeRO-0 over 8192 GPUs holds 1.12 TB per rank, which no
// GPU holds; the plan says so. The stall stays the copy of all a rank holds
// (what ckptd's client copies), the share copy is what it writes.
TEST(PlanCheckpointTest, StateOverTheGpuMemoryDoesNotFit) {
  EXPECT_EQ(PlanInputs().gpu_memory_bytes, uint64_t{80} << 30);
  PlanInputs in;
  in.params = 70e9;
  in.gpus = 8192;
  absl::StatusOr<Plan> p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->fits_gpu_memory);
  EXPECT_DOUBLE_EQ(p->stall_s, (1.12e12 + 11668) / 25e9);
  EXPECT_DOUBLE_EQ(p->share_copy_s, (1.12e12 / 8192 + 11668) / 25e9);
  EXPECT_DOUBLE_EQ(p->delta_s, p->stall_s);
  in.replicated = ReplicatedWrites::kEvery;
  p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->share_copy_s, p->stall_s);
  // At the limit: the memory holding exactly the state fits, one byte less does not.
  in.gpu_memory_bytes = p->rank_bytes;
  EXPECT_TRUE(PlanCheckpoint(in)->fits_gpu_memory);
  in.gpu_memory_bytes = p->rank_bytes - 1;
  EXPECT_FALSE(PlanCheckpoint(in)->fits_gpu_memory);
  // ZeRO-3 over 8192 ranks: 137 MB each.
  in.gpu_memory_bytes = kDefaultGpuMemoryBytes;
  in.zero = 3;
  p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->fits_gpu_memory);
  in.gpu_memory_bytes = 0;
  EXPECT_THAT(PlanCheckpoint(in).status().message(), HasSubstr("gpu_memory_bytes must be at least 1, got 0"));
}

// Byte figures are whole bytes computed exactly: each total is the sum or
// product of its parts, a share that does not divide evenly is rounded up.
void ExpectConsistent(const PlanInputs& in, const Plan& p) {
  EXPECT_EQ(p.rank_bytes, p.params_bytes + p.grads_bytes + p.optimizer_bytes + p.rng_bytes + p.data_cursor_bytes);
  EXPECT_EQ(p.node_bytes, p.rank_bytes * static_cast<uint64_t>(p.ranks_per_node));
  EXPECT_EQ(p.job_bytes, p.rank_bytes * static_cast<uint64_t>(in.gpus));
  EXPECT_EQ(p.node_write_bytes, p.rank_write_bytes * static_cast<uint64_t>(p.ranks_per_node));
  EXPECT_EQ(p.job_write_bytes, p.rank_write_bytes * static_cast<uint64_t>(in.gpus));
  EXPECT_LE(p.unique_bytes, p.job_write_bytes);
  EXPECT_LE(p.job_write_bytes, p.job_bytes);
  EXPECT_LE(p.job_bytes, kMaxPlanBytes);
  if (in.replicated == ReplicatedWrites::kOnce) {
    EXPECT_LT(p.job_write_bytes - p.unique_bytes, static_cast<uint64_t>(in.gpus));
  } else {
    EXPECT_EQ(p.rank_write_bytes, p.rank_bytes);
  }
}

TEST(PlanCheckpointTest, UnevenSharesAreRoundedUpAndTotalsAddUp) {
  // 1000 parameters over dp 3 under ZeRO-3: 2000 / 3 bytes of weights per
  // rank, 667 for the fullest.
  PlanInputs in;
  in.params = 1000;
  in.gpus = 3;
  in.zero = 3;
  absl::StatusOr<Plan> p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->params_bytes, 667u);
  EXPECT_EQ(p->grads_bytes, 667u);
  EXPECT_EQ(p->optimizer_bytes, 4000u);
  EXPECT_EQ(p->rank_bytes, 667u + 667 + 4000 + 11668);
  EXPECT_EQ(p->unique_bytes, 16000u + 3 * 11668);
  EXPECT_EQ(p->rank_write_bytes, 5334u + 11668);  // ceil(16000 / 3)
  ExpectConsistent(in, *p);
  // adam-8bit: 8 bytes of scales per 2048 parameters, whole bytes in all.
  in.optimizer = "adam-8bit";
  in.params = 1e9 + 1;
  for (ReplicatedWrites r : {ReplicatedWrites::kOnce, ReplicatedWrites::kEvery}) {
    in.replicated = r;
    p = PlanCheckpoint(in);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->unique_bytes, static_cast<uint64_t>(std::ceil((1e9 + 1) * (2 + 2 + 6 + 8.0 / 2048))) + 3 * 11668);
    ExpectConsistent(in, *p);
  }
}

// Issue 39, finding 6: --params 1e30 saturated at 2^63 with totals
// inconsistent with their parts. The largest count a layout takes plans with
// every figure in range and consistent; one more is refused, naming the most.
TEST(PlanCheckpointTest, ByteFiguresFitSignedSixtyFourBitsOrAreRefused) {
  PlanInputs in;
  in.gpus = 8192;
  // job = 8192 × (16 P + 11668) ≤ 2^63 − 1.
  const uint64_t max = MaxPlanParams(in);
  EXPECT_EQ(max, 70368744176934u);
  for (ReplicatedWrites r : {ReplicatedWrites::kOnce, ReplicatedWrites::kEvery}) {
    in.replicated = r;
    in.params = static_cast<double>(max);
    absl::StatusOr<Plan> p = PlanCheckpoint(in);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->rank_bytes, 16 * max + 11668);
    EXPECT_EQ(p->job_bytes, 8192 * (16 * max + 11668));
    EXPECT_GT(p->job_bytes, kMaxPlanBytes - 8192 * 16);
    EXPECT_EQ(p->unique_bytes, 16 * max + 8192 * 11668);
    ExpectConsistent(in, *p);
    EXPECT_TRUE(std::isfinite(p->stall_s) && std::isfinite(p->persist_s) && std::isfinite(p->interval.interval_s));

    in.params = static_cast<double>(max + 1);
    p = PlanCheckpoint(in);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_THAT(p.status().message(),
                AllOf(HasSubstr("params 70368744176935: the job's ranks would hold "),
                      HasSubstr("more than the 9223372036854775807 (2^63 - 1)"),
                      HasSubstr("params may be at most 70368744176934")));
  }
  // One GPU holds 16 bytes per parameter: 2^53 parameters fit.
  in.gpus = 1;
  EXPECT_EQ(MaxPlanParams(in), static_cast<uint64_t>(kMaxPlanParams));
  in.params = kMaxPlanParams;
  absl::StatusOr<Plan> p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rank_bytes, 16 * (uint64_t{1} << 53) + 11668);
  ExpectConsistent(in, *p);
  // The most GPUs: the layout shrinks what fits, and still plans.
  in.gpus = std::numeric_limits<int>::max();
  in.params = static_cast<double>(MaxPlanParams(in));
  EXPECT_GE(in.params, 1);
  p = PlanCheckpoint(in);
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectConsistent(in, *p);
  in.params = 7e9;
  EXPECT_EQ(PlanCheckpoint(in).status().code(), absl::StatusCode::kOutOfRange);
}

// At the ends of the input ranges every time and waste is finite.
TEST(PlanCheckpointTest, FiguresStayFiniteAtTheEndsOfTheRanges) {
  for (double gbps : {kMinPlanGbps, kMaxPlanGbps}) {
    for (double rate : {kMinPlanFailRate, kMaxPlanFailRate}) {
      for (double seconds : {kMinPlanAlternativeSeconds, kMaxPlanSeconds}) {
        for (int gpus : {1, std::numeric_limits<int>::max()}) {
          PlanInputs in;
          in.gpus = gpus;
          in.params = static_cast<double>(MaxPlanParams(in));
          in.d2h_gbps = in.write_gbps = gbps;
          in.fail_rate_per_gpu_hour = rate;
          in.restart_s = in.alternative_s = seconds;
          absl::StatusOr<Plan> p = PlanCheckpoint(in);
          ASSERT_TRUE(p.ok()) << p.status();
          for (double v : {p->stall_s, p->persist_s, p->job_mtbf_s, p->interval.daly_s, p->interval.interval_s,
                           p->interval.expected_waste, p->interval.alternative_waste}) {
            EXPECT_TRUE(std::isfinite(v) && v > 0) << v << " at " << gbps << " GB/s, " << rate << "/GPU-h, "
                                                   << seconds << " s, " << gpus << " GPUs";
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace ckptd::policy
