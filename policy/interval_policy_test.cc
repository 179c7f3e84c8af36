#include "policy/interval_policy.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::policy {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr double kHour = 3600;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------- Daly, waste

TEST(DalyOptimumTest, Anchors) {
  // δ = 300 s: the figures quoted in docs/interval.md.
  EXPECT_NEAR(DalyOptimum(300, 24 * kHour) / 60, 116.7, 0.05);
  EXPECT_NEAR(DalyOptimum(300, 6 * kHour) / 60, 56.7, 0.05);
  EXPECT_NEAR(DalyOptimum(300, 15 * 60) / 60, 9.14, 0.005);
  // The same by hand: sqrt(2·300·86400) = 7200, r = 300/172800.
  const double r = 300.0 / 172800;
  EXPECT_DOUBLE_EQ(DalyOptimum(300, 24 * kHour), 7200 * (1 + std::sqrt(r) / 3 + r / 9) - 300);
}

TEST(DalyOptimumTest, TendsToYoungForSmallCost) {
  // δ ≪ M: τ → sqrt(2δM) (Young's first-order optimum).
  const double delta = 1;
  const double mtbf = 1e8;
  EXPECT_NEAR(DalyOptimum(delta, mtbf) / std::sqrt(2 * delta * mtbf), 1.0, 1e-3);
}

TEST(DalyOptimumTest, CostAtLeastTwiceMtbfGivesMtbf) {
  EXPECT_EQ(DalyOptimum(2 * kHour, kHour), kHour);
  EXPECT_EQ(DalyOptimum(10 * kHour, kHour), kHour);
  // Just below the switch the formula is used, and is continuous enough.
  EXPECT_NEAR(DalyOptimum(2 * kHour - 1e-6, kHour) / kHour, 1.0, 0.2);
}

TEST(DalyOptimumTest, InvalidInputsAreNaN) {
  for (double bad : {0.0, -1.0, kNaN, kInf}) {
    EXPECT_TRUE(std::isnan(DalyOptimum(bad, kHour))) << bad;
    EXPECT_TRUE(std::isnan(DalyOptimum(60, bad))) << bad;
  }
}

TEST(ExpectedWasteTest, Formula) {
  // 300/1800 + (900 + 0)/86400.
  EXPECT_DOUBLE_EQ(ExpectedWaste(1800, 300, 0, 24 * kHour), 300.0 / 1800 + 900.0 / 86400);
  EXPECT_DOUBLE_EQ(ExpectedWaste(1000, 10, 600, kHour), 0.01 + 1100.0 / 3600);
}

TEST(ExpectedWasteTest, NotClamped) {
  // τ far beyond M: the first-order figure exceeds 1 and is reported as such.
  EXPECT_GT(ExpectedWaste(10 * kHour, 60, 0, kHour), 1.0);
}

TEST(ExpectedWasteTest, InvalidInputsAreNaN) {
  EXPECT_TRUE(std::isnan(ExpectedWaste(0, 1, 0, kHour)));
  EXPECT_TRUE(std::isnan(ExpectedWaste(10, 0, 0, kHour)));
  EXPECT_TRUE(std::isnan(ExpectedWaste(10, 1, -1, kHour)));
  EXPECT_TRUE(std::isnan(ExpectedWaste(10, 1, 0, kInf)));
  EXPECT_TRUE(std::isnan(ExpectedWaste(kNaN, 1, 0, kHour)));
}

TEST(ExpectedWasteTest, DalyIsNearTheFormulasMinimum) {
  // Daly minimises the exact model, W the first-order one; for δ ≪ M they agree.
  const double delta = 60;
  const double mtbf = 24 * kHour;
  const double daly = DalyOptimum(delta, mtbf);
  const double at_daly = ExpectedWaste(daly, delta, 0, mtbf);
  for (double f : {0.5, 0.8, 1.25, 2.0}) EXPECT_LT(at_daly, ExpectedWaste(f * daly, delta, 0, mtbf)) << f;
}

// ------------------------------------------------------------ gamma functions

TEST(GammaTest, RegularizedGammaPKnownValues) {
  for (double x : {0.001, 0.1, 0.5, 1.0, 2.0, 5.0, 30.0}) {
    // a = 1: the exponential CDF; a = 0.5: erf(sqrt(x)).
    EXPECT_NEAR(RegularizedGammaP(1, x), -std::expm1(-x), 1e-14) << x;
    EXPECT_NEAR(RegularizedGammaP(0.5, x), std::erf(std::sqrt(x)), 1e-14) << x;
    // Integer a: 1 − e^{-x} Σ_{k<a} x^k/k! (both the series and the continued fraction).
    for (int a : {2, 3, 10}) {
      double sum = 0;
      double term = 1;
      for (int k = 0; k < a; ++k) {
        sum += term;
        term *= x / (k + 1);
      }
      EXPECT_NEAR(RegularizedGammaP(a, x), 1 - std::exp(-x) * sum, 1e-13) << "a " << a << " x " << x;
    }
  }
  EXPECT_EQ(RegularizedGammaP(3, 0), 0);
  EXPECT_EQ(RegularizedGammaP(3, kInf), 1);
  EXPECT_TRUE(std::isnan(RegularizedGammaP(0, 1)));
  EXPECT_TRUE(std::isnan(RegularizedGammaP(1, -1)));
  EXPECT_TRUE(std::isnan(RegularizedGammaP(1, kNaN)));
}

TEST(GammaTest, LargeShape) {
  // Gamma(a, 1) for a = 1e4 is close to normal(a, sqrt(a)): P at the mean ≈ 0.5
  // (0.5 + 1/(3·sqrt(2πa)) to first order).
  const double a = 1e4;
  EXPECT_NEAR(RegularizedGammaP(a, a), 0.5 + 1 / (3 * std::sqrt(2 * std::numbers::pi * a)), 1e-4);
  EXPECT_NEAR(RegularizedGammaP(a, a + 1.6448536269514722 * std::sqrt(a)), 0.95, 2e-3);
}

TEST(GammaTest, QuantileKnownValues) {
  EXPECT_NEAR(GammaQuantile(1, 1, 0.5), std::log(2.0), 1e-12);
  // Chi-square with k degrees of freedom is Gamma(k/2, rate 1/2).
  EXPECT_NEAR(GammaQuantile(0.5, 0.5, 0.95), 3.841458820694124, 1e-9);
  EXPECT_NEAR(GammaQuantile(5, 0.5, 0.95), 18.307038053275146, 1e-9);
  EXPECT_NEAR(GammaQuantile(5, 0.5, 0.05), 3.940299136119247, 1e-9);
  EXPECT_NEAR(GammaQuantile(1, 0.5, 0.5), 2 * std::log(2.0), 1e-12);
  // The rate scales.
  EXPECT_NEAR(GammaQuantile(1, 1e6, 0.5), std::log(2.0) / 1e6, 1e-18);
}

TEST(GammaTest, QuantileInvertsTheCdf) {
  for (double a : {0.05, 0.3, 1.0, 2.5, 17.0, 400.0, 1e5}) {
    for (double p : {1e-10, 1e-4, 0.05, 0.3, 0.5, 0.7, 0.95, 0.9999, 1 - 1e-10}) {
      const double x = GammaQuantile(a, 1, p);
      ASSERT_TRUE(std::isfinite(x) && x > 0) << "a " << a << " p " << p;
      if (p <= 0.5) {
        EXPECT_NEAR(RegularizedGammaP(a, x) / p, 1.0, 1e-9) << "a " << a << " p " << p;
      } else {
        EXPECT_NEAR((1 - RegularizedGammaP(a, x)) / (1 - p), 1.0, 1e-6) << "a " << a << " p " << p;
      }
    }
  }
}

TEST(GammaTest, QuantileEdges) {
  EXPECT_EQ(GammaQuantile(2, 1, 0), 0);
  EXPECT_EQ(GammaQuantile(2, 1, 1), kInf);
  EXPECT_TRUE(std::isnan(GammaQuantile(2, 1, 1.5)));
  EXPECT_TRUE(std::isnan(GammaQuantile(2, 1, -0.1)));
  EXPECT_TRUE(std::isnan(GammaQuantile(0, 1, 0.5)));
  EXPECT_TRUE(std::isnan(GammaQuantile(2, 0, 0.5)));
  EXPECT_TRUE(std::isnan(GammaQuantile(2, 1, kNaN)));
}

// --------------------------------------------------------------- failure rate

TEST(FailureRateTest, PriorOnly) {
  const FailurePrior prior;  // 3e-6 per GPU-hour, shape 1: exponential
  const FailureRateEstimate e = EstimateFailureRate(prior, 0, 0);
  EXPECT_DOUBLE_EQ(e.mean, 3e-6);
  // Exponential(mean μ): quantile q is −μ·ln(1 − q).
  EXPECT_NEAR(e.lower / (-3e-6 * std::log(0.95)), 1.0, 1e-9);
  EXPECT_NEAR(e.upper / (-3e-6 * std::log(0.05)), 1.0, 1e-9);
  EXPECT_EQ(e.failures, 0);
  EXPECT_EQ(e.exposure_gpu_hours, 0);
  EXPECT_EQ(e.credible, 0.9);
}

TEST(FailureRateTest, PosteriorByHand) {
  // Prior Gamma(2, 2/1e-5 = 2e5); 3 failures over 1e6 GPU-hours:
  // posterior Gamma(5, 1.2e6).
  const FailurePrior prior{1e-5, 2};
  const FailureRateEstimate e = EstimateFailureRate(prior, 3, 1e6, 0.95);
  EXPECT_DOUBLE_EQ(e.mean, 5 / 1.2e6);
  EXPECT_NEAR(e.lower, GammaQuantile(5, 1.2e6, 0.025), 1e-20);
  EXPECT_NEAR(e.upper, GammaQuantile(5, 1.2e6, 0.975), 1e-20);
  // Chi-square view: 2βλ ~ χ²(2α) = χ²(10); its 0.025 quantile is 3.2469727802368.
  EXPECT_NEAR(e.lower * 2 * 1.2e6, 3.246972780236841, 1e-8);
  EXPECT_LT(e.lower, e.mean);
  EXPECT_GT(e.upper, e.mean);
}

TEST(FailureRateTest, ManyFailuresDominateThePrior) {
  const FailurePrior prior;
  // True rate 1e-4 per GPU-hour: 10000 failures over 1e8 GPU-hours.
  const FailureRateEstimate e = EstimateFailureRate(prior, 10000, 1e8);
  // (1 + 10000) / (1/3e-6 + 1e8): the prior's 333333 GPU-hours still show.
  EXPECT_DOUBLE_EQ(e.mean, 10001 / (1 / 3e-6 + 1e8));
  EXPECT_NEAR(e.mean / 1e-4, 1.0, 5e-3);
  // The interval narrows to about ±1.645/sqrt(n) = ±1.6 %.
  EXPECT_NEAR(e.upper / e.mean - 1, 1.645 / 100, 2e-3);
  EXPECT_NEAR(1 - e.lower / e.mean, 1.645 / 100, 2e-3);
}

TEST(FailureRateTest, ExposureWithoutFailuresLowersTheRate) {
  const FailurePrior prior;
  const FailureRateEstimate none = EstimateFailureRate(prior, 0, 0);
  const FailureRateEstimate quiet = EstimateFailureRate(prior, 0, 1e6);
  EXPECT_LT(quiet.mean, none.mean);
  EXPECT_LT(quiet.upper, none.upper);
}

TEST(FailureRateTest, InvalidInputsGiveNaN) {
  const FailurePrior prior;
  EXPECT_TRUE(std::isnan(EstimateFailureRate(prior, -1, 10).mean));
  EXPECT_TRUE(std::isnan(EstimateFailureRate(prior, 1, -10).mean));
  EXPECT_TRUE(std::isnan(EstimateFailureRate(prior, 1, kInf).upper));
  EXPECT_TRUE(std::isnan(EstimateFailureRate(prior, 1, 10, 1.0).lower));
  EXPECT_TRUE(std::isnan(EstimateFailureRate(FailurePrior{0, 1}, 1, 10).mean));
  EXPECT_TRUE(std::isnan(EstimateFailureRate(FailurePrior{1e-6, -1}, 1, 10).mean));
}

TEST(FailureRateTest, ValidateFailurePrior) {
  EXPECT_TRUE(ValidateFailurePrior(FailurePrior{}).ok());
  const absl::Status mean = ValidateFailurePrior(FailurePrior{-3e-6, 1});
  EXPECT_EQ(mean.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mean.message(), AllOf(HasSubstr("mean"), HasSubstr("-3e-06")));
  const absl::Status shape = ValidateFailurePrior(FailurePrior{3e-6, 0});
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shape.message(), HasSubstr("shape"));
}

TEST(JobMtbfTest, Values) {
  EXPECT_NEAR(JobMtbfSeconds(3e-6, 8192) / kHour, 40.69, 0.01);
  EXPECT_DOUBLE_EQ(JobMtbfSeconds(1e-3, 1), 3.6e6);
  EXPECT_TRUE(std::isnan(JobMtbfSeconds(0, 8)));
  EXPECT_TRUE(std::isnan(JobMtbfSeconds(1e-6, 0)));
}

// -------------------------------------------------------------- RecentWindow

TEST(MedianTest, MiddleValueOrMeanOfTheTwoMiddleOnes) {
  EXPECT_DOUBLE_EQ(Median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(Median({7}), 7);
  EXPECT_TRUE(std::isnan(Median({})));
}

TEST(RecentWindowTest, EmptyIsNaN) {
  RecentWindow w;
  EXPECT_EQ(w.capacity(), RecentWindow::kDefaultCapacity);
  EXPECT_TRUE(w.empty());
  EXPECT_TRUE(std::isnan(w.Median()));
  EXPECT_TRUE(std::isnan(w.Mad()));
}

TEST(RecentWindowTest, MedianAndMad) {
  RecentWindow w(10);
  for (double v : {5.0, 1.0, 3.0}) w.Push(v);
  EXPECT_EQ(w.size(), 3u);
  EXPECT_EQ(w.Median(), 3);
  EXPECT_EQ(w.Mad(), 2);  // deviations 2, 2, 0
  w.Push(100);            // an outlier barely moves them: {1, 3, 5, 100}
  EXPECT_EQ(w.Median(), 4);
  EXPECT_EQ(w.Mad(), 2);  // deviations 3, 1, 1, 96 → (1 + 3)/2
}

TEST(RecentWindowTest, KeepsTheLastCapacitySamples) {
  RecentWindow w(4);
  for (int i = 1; i <= 10; ++i) w.Push(i);
  EXPECT_EQ(w.size(), 4u);
  EXPECT_EQ(w.Median(), 8.5);  // {7, 8, 9, 10}
  EXPECT_EQ(w.Mad(), 1);       // deviations 1.5, 0.5, 0.5, 1.5
  w.Clear();
  EXPECT_TRUE(w.empty());
  w.Push(2);
  EXPECT_EQ(w.Median(), 2);
  EXPECT_EQ(w.Mad(), 0);
}

TEST(RecentWindowTest, DropsNonFiniteSamples) {
  RecentWindow w(4);
  EXPECT_TRUE(w.Push(1));
  EXPECT_FALSE(w.Push(kNaN));
  EXPECT_FALSE(w.Push(kInf));
  EXPECT_EQ(w.size(), 1u);
  EXPECT_EQ(w.Median(), 1);
}

TEST(RecentWindowTest, ZeroCapacityHoldsOne) {
  RecentWindow w(0);
  EXPECT_EQ(w.capacity(), 1u);
  w.Push(1);
  w.Push(2);
  EXPECT_EQ(w.Median(), 2);
}

// ------------------------------------------------------------------ decision

IntervalInputs Inputs(double mtbf_s, double delta_s) {
  IntervalInputs in;
  in.mtbf_s = mtbf_s;
  in.delta_s = delta_s;
  return in;
}

TEST(DecideIntervalTest, DalyWhenUnconstrained) {
  IntervalInputs in = Inputs(24 * kHour, 300);
  in.step_s = 10;
  absl::StatusOr<IntervalDecision> d = DecideInterval(in);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_DOUBLE_EQ(d->daly_s, DalyOptimum(300, 24 * kHour));
  EXPECT_DOUBLE_EQ(d->interval_s, d->daly_s);
  EXPECT_EQ(d->interval_steps, static_cast<uint64_t>(std::round(d->daly_s / 10)));
  EXPECT_EQ(d->reason, "Daly optimum");
  EXPECT_DOUBLE_EQ(d->expected_waste, ExpectedWaste(d->interval_s, 300, 0, 24 * kHour));
  EXPECT_DOUBLE_EQ(d->alternative_waste, ExpectedWaste(1800, 300, 0, 24 * kHour));
  EXPECT_LT(d->expected_waste, d->alternative_waste);
}

TEST(DecideIntervalTest, NoStepTimeNoSteps) {
  absl::StatusOr<IntervalDecision> d = DecideInterval(Inputs(6 * kHour, 300));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->interval_steps, 0u);
}

TEST(DecideIntervalTest, CostAboveTwiceMtbf) {
  absl::StatusOr<IntervalDecision> d = DecideInterval(Inputs(100, 300));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->interval_s, 100);
  EXPECT_THAT(d->reason, HasSubstr("τ = M"));
}

TEST(DecideIntervalTest, PersistFloor) {
  IntervalInputs in = Inputs(6 * kHour, 300);  // Daly ≈ 3403 s
  in.persist_s = 5000;
  absl::StatusOr<IntervalDecision> d = DecideInterval(in);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->interval_s, 5000);
  EXPECT_NEAR(d->daly_s, 3402.8, 0.1);
  EXPECT_EQ(d->reason, "raised to persist time P");
  EXPECT_DOUBLE_EQ(d->expected_waste, ExpectedWaste(5000, 300, 0, 6 * kHour));
}

TEST(DecideIntervalTest, StepsNeverUnderPersist) {
  IntervalInputs in = Inputs(6 * kHour, 300);
  in.persist_s = 5000;
  in.step_s = 4000;  // 5000/4000 = 1.25 would round to 1 (4000 s < P): rounded up to 2
  absl::StatusOr<IntervalDecision> d = DecideInterval(in);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->interval_steps, 2u);
  in.step_s = 500;  // an exact multiple stays exact
  d = DecideInterval(in);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->interval_steps, 10u);
}

TEST(DecideIntervalTest, AtLeastOneStep) {
  IntervalInputs in = Inputs(24 * kHour, 300);
  in.step_s = 1e6;
  absl::StatusOr<IntervalDecision> d = DecideInterval(in);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->interval_steps, 1u);
}

TEST(DecideIntervalTest, OperatorBounds) {
  IntervalInputs in = Inputs(24 * kHour, 300);  // Daly ≈ 7001 s
  in.max_interval_s = 3600;
  absl::StatusOr<IntervalDecision> d = DecideInterval(in);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->interval_s, 3600);
  EXPECT_EQ(d->reason, "clamped to operator maximum");

  in.max_interval_s = 0;
  in.min_interval_s = 10000;
  d = DecideInterval(in);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->interval_s, 10000);
  EXPECT_EQ(d->reason, "raised to operator minimum");

  // Bounds that contain Daly change nothing.
  in.min_interval_s = 600;
  in.max_interval_s = 20000;
  d = DecideInterval(in);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->interval_s, d->daly_s);
  EXPECT_EQ(d->reason, "Daly optimum");
}

TEST(DecideIntervalTest, PersistWinsOverOperatorMaximum) {
  IntervalInputs in = Inputs(24 * kHour, 300);
  in.max_interval_s = 3600;
  in.persist_s = 4000;
  absl::StatusOr<IntervalDecision> d = DecideInterval(in);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->interval_s, 4000);
  EXPECT_THAT(d->reason, AllOf(HasSubstr("persist time P"), HasSubstr("maximum")));
}

TEST(DecideIntervalTest, InvalidInputsNameTheField) {
  struct Case {
    IntervalInputs in;
    const char* field;
  };
  IntervalInputs ok = Inputs(kHour, 60);
  std::vector<Case> cases;
  IntervalInputs c = ok;
  c.mtbf_s = 0;
  cases.push_back({c, "mtbf_s"});
  c = ok;
  c.delta_s = -5;
  cases.push_back({c, "delta_s"});
  c = ok;
  c.delta_s = kNaN;
  cases.push_back({c, "delta_s"});
  c = ok;
  c.persist_s = -1;
  cases.push_back({c, "persist_s"});
  c = ok;
  c.restart_s = kInf;
  cases.push_back({c, "restart_s"});
  c = ok;
  c.step_s = -1;
  cases.push_back({c, "step_s"});
  c = ok;
  c.min_interval_s = -1;
  cases.push_back({c, "min_interval_s"});
  c = ok;
  c.max_interval_s = kNaN;
  cases.push_back({c, "max_interval_s"});
  c = ok;
  c.alternative_s = 0;
  cases.push_back({c, "alternative_s"});
  c = ok;
  c.min_interval_s = 100;
  c.max_interval_s = 50;
  cases.push_back({c, "exceeds max_interval_s 50"});
  for (const Case& k : cases) {
    absl::StatusOr<IntervalDecision> d = DecideInterval(k.in);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << k.field;
    EXPECT_THAT(d.status().message(), HasSubstr(k.field));
  }
  absl::StatusOr<IntervalDecision> d = DecideInterval(Inputs(kHour, -5));
  EXPECT_THAT(d.status().message(), HasSubstr("-5"));
}

// ---------------------------------------------------------------- hysteresis

class HysteresisTest : public ::testing::Test {
 protected:
  HysteresisTest() {
    in_ = Inputs(24 * kHour, 300);
    in_.step_s = 10;
    next_ = *DecideInterval(in_);  // ≈ 700 steps
  }
  IntervalInputs in_;
  IntervalDecision next_;
};

TEST_F(HysteresisTest, NoScheduleYet) { EXPECT_TRUE(ShouldChangeInterval(0, next_, in_)); }

TEST_F(HysteresisTest, SameScheduleStays) { EXPECT_FALSE(ShouldChangeInterval(next_.interval_steps, next_, in_)); }

TEST_F(HysteresisTest, SmallRelativeChangeStays) {
  // 650 → 700 is +7.7 %: under the 20 % threshold.
  EXPECT_FALSE(ShouldChangeInterval(650, next_, in_));
  EXPECT_FALSE(ShouldChangeInterval(800, next_, in_));
}

TEST_F(HysteresisTest, LargeChangeWithGainMoves) {
  // 180 steps = 30 min: waste 17.7 % vs 8.3 %.
  EXPECT_TRUE(ShouldChangeInterval(180, next_, in_));
  EXPECT_TRUE(ShouldChangeInterval(3000, next_, in_));
}

TEST_F(HysteresisTest, LargeChangeWithoutEnoughGainStays) {
  // 580 → 700 is 20.7 % but the curve is flat near the optimum: W(5800 s) −
  // W(7000 s) ≈ 0.0019. Demand more gain than that.
  EXPECT_TRUE(ShouldChangeInterval(580, next_, in_, 0.2, 0.001));
  EXPECT_FALSE(ShouldChangeInterval(580, next_, in_, 0.2, 0.002));
  // And a relative threshold above the change keeps it too.
  EXPECT_FALSE(ShouldChangeInterval(580, next_, in_, 0.3, 0.0));
}

TEST_F(HysteresisTest, CurrentUnderPersistMovesRegardless) {
  in_.persist_s = 6990;  // current 690 steps = 6900 s < P
  next_ = *DecideInterval(in_);
  ASSERT_EQ(next_.interval_steps, 700u);
  EXPECT_TRUE(ShouldChangeInterval(690, next_, in_));
}

TEST_F(HysteresisTest, CurrentOutsideOperatorBoundsMoves) {
  in_.max_interval_s = 6600;
  next_ = *DecideInterval(in_);
  ASSERT_EQ(next_.interval_steps, 660u);
  EXPECT_TRUE(ShouldChangeInterval(700, next_, in_));   // 7000 s > max
  EXPECT_FALSE(ShouldChangeInterval(660, next_, in_));  // already there
}

TEST_F(HysteresisTest, UnknownStepTimeNeverChanges) {
  in_.step_s = 0;
  next_ = *DecideInterval(in_);
  ASSERT_EQ(next_.interval_steps, 0u);
  EXPECT_FALSE(ShouldChangeInterval(0, next_, in_));
  EXPECT_FALSE(ShouldChangeInterval(100, next_, in_));
}

}  // namespace
}  // namespace ckptd::policy
