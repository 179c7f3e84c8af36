#include "policy/simulator.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "policy/interval_policy.h"

namespace ckptd::policy {
namespace {

constexpr double kHour = 3600;
constexpr double kDay = 24 * kHour;

// Failures per simulated run. The waste's relative noise is about
// 0.3/sqrt(failures) between two τ values of one seed (the failure times are
// shared; only where each failure lands in its segment differs): 0.1 % here,
// against a 2 % tolerance.
constexpr double kFailures = 40000;

// Expected wall time for `work` with checkpoints every τ under exponential
// failures, failures striking restarts too (Daly 2006, eq. 13 for whole
// segments): M·e^{R/M}·(e^{(τ+δ)/M} − 1) per segment.
double ExactWallTime(double work, double tau, double delta, double restart, double mtbf) {
  const double segments = work / tau;
  return segments * mtbf * std::exp(restart / mtbf) * std::expm1((tau + delta) / mtbf);
}

TEST(SimulatorTest, MatchesTheExactExpectedTime) {
  struct Case {
    double mtbf, delta, restart, tau;
  };
  // Near Daly's optimum, and far above it where failures dominate.
  for (const Case& c : {Case{6 * kHour, 300, 600, DalyOptimum(300, 6 * kHour)}, Case{kHour, 60, 120, 4 * kHour},
                        Case{kDay, 10, 0, 900}}) {
    SimParams p;
    p.mtbf_s = c.mtbf;
    p.delta_s = c.delta;
    p.restart_s = c.restart;
    p.tau_s = c.tau;
    // A whole number of segments, so that the formula applies exactly.
    p.work_s = std::ceil(kFailures * c.mtbf / c.tau) * c.tau;
    p.seed = 7;
    const double simulated = SimulateWaste(p);
    const double exact = 1 - p.work_s / ExactWallTime(p.work_s, c.tau, c.delta, c.restart, c.mtbf);
    EXPECT_NEAR(simulated / exact, 1.0, 0.02) << "M " << c.mtbf << " δ " << c.delta << " R " << c.restart
                                               << " τ " << c.tau << ": simulated " << simulated << ", exact "
                                               << exact;
  }
}

TEST(SimulatorTest, FirstOrderWasteHoldsWhenEverythingIsShortAgainstM) {
  // W(τ) = δ/τ + (τ/2 + R)/M is what the policy reports; with τ, δ, R ≪ M it
  // is within a few % of the simulated waste.
  SimParams p;
  p.mtbf_s = 5 * kDay;
  p.delta_s = 60;
  p.restart_s = 120;
  p.tau_s = DalyOptimum(p.delta_s, p.mtbf_s);
  p.work_s = kFailures * p.mtbf_s;
  p.seed = 11;
  EXPECT_NEAR(SimulateWaste(p) / ExpectedWaste(p.tau_s, p.delta_s, p.restart_s, p.mtbf_s), 1.0, 0.03);
}

TEST(SimulatorTest, DeterministicForASeed) {
  SimParams p{kHour, 60, 120, 1200, 1000 * kHour, 3};
  EXPECT_EQ(SimulateWaste(p), SimulateWaste(p));
  SimParams q = p;
  q.seed = 4;
  EXPECT_NE(SimulateWaste(p), SimulateWaste(q));
}

TEST(SimulatorTest, NoFailuresMeansOnlyCheckpointCost) {
  // M far beyond the run: waste is δ/(τ + δ) exactly, with the last short
  // segment also checkpointed (10 segments of 100 s plus one of 50 s).
  SimParams p{1e300, 10, 0, 100, 1050, 1};
  EXPECT_NEAR(SimulateWaste(p), 1 - 1050.0 / (1050 + 11 * 10), 1e-12);
}

TEST(SimulatorTest, InvalidParamsAreNaN) {
  EXPECT_TRUE(std::isnan(SimulateWaste(SimParams{0, 1, 0, 10, 100, 1})));
  EXPECT_TRUE(std::isnan(SimulateWaste(SimParams{100, -1, 0, 10, 100, 1})));
  EXPECT_TRUE(std::isnan(SimulateWaste(SimParams{100, 1, 0, 0, 100, 1})));
  EXPECT_TRUE(std::isnan(SimulateWaste(SimParams{100, 1, 0, 10, 0, 1})));
  EXPECT_TRUE(std::isnan(SimulateWaste(SimParams{100, 1, -5, 10, 100, 1})));
  // (τ + δ)/M = 50: the job would (practically) never finish.
  EXPECT_TRUE(std::isnan(SimulateWaste(SimParams{100, 0, 0, 5000, 1e4, 1})));
}

// Daly's τ is (near) optimal: across a grid of (M, δ, R), the simulated waste
// at DalyOptimum(δ, M) is within 2 % of the best of 60 fixed intervals from
// τ/8 to 8τ, all run on the same failures.
class DalyIsOptimalTest : public ::testing::TestWithParam<std::tuple<double, double, double>> {};

TEST_P(DalyIsOptimalTest, WithinTwoPercentOfTheSweepMinimum) {
  const auto [mtbf, delta, restart] = GetParam();
  const double daly = DalyOptimum(delta, mtbf);
  SimParams p;
  p.mtbf_s = mtbf;
  p.delta_s = delta;
  p.restart_s = restart;
  p.work_s = kFailures * mtbf;
  p.seed = 20240601;
  p.tau_s = daly;
  const double at_daly = SimulateWaste(p);
  double best = std::numeric_limits<double>::infinity();
  double best_tau = 0;
  constexpr int kPoints = 60;
  for (int i = 0; i < kPoints; ++i) {
    p.tau_s = daly / 8 * std::pow(64.0, static_cast<double>(i) / (kPoints - 1));
    const double w = SimulateWaste(p);
    if (w < best) {
      best = w;
      best_tau = p.tau_s;
    }
  }
  ASSERT_TRUE(std::isfinite(at_daly) && std::isfinite(best));
  EXPECT_LE(at_daly, best * 1.02) << "Daly τ " << daly << " s wastes " << at_daly << "; the sweep's best, τ "
                                  << best_tau << " s, wastes " << best;
  // The sweep's best sits near Daly's τ, not at an end of the sweep.
  EXPECT_GT(best_tau, daly / 2);
  EXPECT_LT(best_tau, daly * 2);
}

INSTANTIATE_TEST_SUITE_P(Grid, DalyIsOptimalTest,
                         ::testing::Combine(::testing::Values(kHour, 6 * kHour, kDay, 5 * kDay),
                                            ::testing::Values(10.0, 60.0, 300.0), ::testing::Values(0.0, 120.0, 600.0)),
                         [](const ::testing::TestParamInfo<DalyIsOptimalTest::ParamType>& param_info) {
                           return absl::StrCat("M", std::get<0>(param_info.param), "s_delta", std::get<1>(param_info.param),
                                               "s_R", std::get<2>(param_info.param), "s");
                         });

}  // namespace
}  // namespace ckptd::policy
