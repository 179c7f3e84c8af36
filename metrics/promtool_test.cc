// Checks a rendered exposition with Prometheus' own parser and linter,
// `promtool check metrics`, when promtool is on PATH (Debian: prometheus).
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/testing/env.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/registry.h"
#include "metrics/testing_exposition.h"

namespace ckptd::metrics {
namespace {

// The path of `name` on PATH, or "".
using ::ckptd::testing::FindOnPath;

using ::ckptd::metrics::testing::PromtoolCheck;

class PromtoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    promtool_ = FindOnPath("promtool");
    if (promtool_.empty()) {
      GTEST_SKIP() << "promtool is not on PATH; it comes with the Debian package 'prometheus' "
                      "(scripts/install-deps.sh installs it)";
    }
  }
  std::string promtool_;
};

TEST_F(PromtoolTest, RenderedExpositionPassesCheckMetrics) {
  Registry registry;
  CKPTD_ASSERT_OK_AND_ASSIGN(
      CounterFamily * committed,
      registry.AddCounter("ckptd_checkpoints_committed_total", "Checkpoints committed,\nper \\job\\.", {"job"}));
  committed->With({"job-a"})->Increment(3);
  committed->With({"we\"ird\\job\nname \xC3\xA9 \xFF"})->Increment(0.5);
  CKPTD_ASSERT_OK_AND_ASSIGN(CounterFamily * restores, registry.AddCounter("ckptd_restores_total", "Restores."));
  restores->With()->Increment(1e20);
  CKPTD_ASSERT_OK_AND_ASSIGN(GaugeFamily * staged,
                             registry.AddGauge("ckptd_staging_bytes", "Bytes in staging.", {"job", "node"}));
  staged->With({"job-a", "n1"})->Set(1.5e9);
  staged->With({"job-a", "n2"})->Set(std::numeric_limits<double>::infinity());
  staged->With({"job-b", ""})->Set(std::nan(""));
  staged->With({"job-c", "n3"})->Set(-2.5e-7);
  CKPTD_ASSERT_OK_AND_ASSIGN(
      HistogramFamily * latency,
      registry.AddHistogram("ckptd_commit_duration_seconds", "Commit latency.", {0.005, 0.1, 1, 60}, {"job"}));
  latency->With({"job-a"})->Observe(0.05);
  latency->With({"job-a"})->Observe(120);
  latency->With({"job-b"});
  CKPTD_ASSERT_OK_AND_ASSIGN(HistogramFamily * sizes,
                             registry.AddHistogram("ckptd_shard_size_bytes", "Shard sizes.", {1e6, 1e9}));
  sizes->With()->Observe(5e5);

  const std::string exposition = registry.Render();
  const testing::PromtoolResult result = PromtoolCheck(promtool_, exposition);
  EXPECT_EQ(result.exit_code, 0) << "promtool says:\n" << result.output << "\non:\n" << exposition;
  EXPECT_EQ(result.output, "") << exposition;
}

// Guards the test above: promtool does reject a broken exposition.
TEST_F(PromtoolTest, CheckMetricsRejectsBrokenText) {
  const testing::PromtoolResult result = PromtoolCheck(promtool_, "# TYPE x_total counter\nx_total{job=\"a} 1\n");
  EXPECT_NE(result.exit_code, 0) << result.output;
}

}  // namespace
}  // namespace ckptd::metrics
