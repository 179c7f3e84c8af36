#include "cli/interval_commands.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/flags.h"
#include "base/testing/json_checker.h"
#include "cli/testing_terminal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/interval_policy.h"
#include "policy/two_level.h"

namespace ckptd::cli {
namespace {

using ::testing::AllOf;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

using ::ckptd::testing::IsValidJson;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

Result Interval(const std::vector<std::string>& argv, const IntervalFetcher& fetch = {}) {
  std::ostringstream out, err;
  Result r;
  r.code = RunInterval(argv, out, err, fetch);
  r.out = out.str();
  r.err = err.str();
  return r;
}

Result Plan(const std::vector<std::string>& argv) {
  std::ostringstream out, err;
  Result r;
  r.code = RunPlan(argv, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// The number after "key": in a flat JSON object; NaN when absent or not a number.
double JsonNumber(absl::string_view json, absl::string_view key) {
  const std::string needle = absl::StrCat("\"", key, "\":");
  const size_t at = json.find(needle);
  if (at == absl::string_view::npos) return std::nan("");
  absl::string_view rest = json.substr(at + needle.size());
  const size_t end = rest.find_first_of(",}");
  double v = 0;
  if (!absl::SimpleAtod(rest.substr(0, end), &v)) return std::nan("");
  return v;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// ------------------------------------------------------------------ interval

TEST(IntervalCommandTest, TableShowsInputsAndDecision) {
  Result r = Interval({"--mtbf-hours", "24", "--cost-seconds", "300", "--step-seconds", "10", "--restart-seconds",
                       "600", "--persist-seconds", "120"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  EXPECT_THAT(r.out, AllOf(HasSubstr("MTBF M"), HasSubstr("86400 s (24.00 h)"), HasSubstr("checkpoint cost δ"),
                           HasSubstr("300.0 s (5.0 min)"), HasSubstr("persist time P"), HasSubstr("120.0 s"),
                           HasSubstr("restart cost R"), HasSubstr("600.0 s (10.0 min)"), HasSubstr("step time"),
                           HasSubstr("10.0 s"), HasSubstr("alternative interval"), HasSubstr("1800 s (30.0 min)")));
  // τ = 7001.4 s, 700 steps of 10 s; W = 300/7001 + (3501 + 600)/86400 = 9.03 %.
  EXPECT_THAT(r.out, AllOf(HasSubstr("Daly optimum τ"), HasSubstr("7001 s (116.7 min)"),
                           HasSubstr("every 700 steps"), HasSubstr("reason"), HasSubstr("Daly optimum"),
                           HasSubstr("9.03 %"), HasSubstr("18.4 %")));
}

TEST(IntervalCommandTest, JsonCarriesInputsAndOutputs) {
  Result r = Interval({"--mtbf-hours", "24", "--cost-seconds", "300", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  // The anchor: δ = 300 s, M = 24 h → τ ≈ 7000 s.
  EXPECT_NEAR(JsonNumber(r.out, "interval_seconds"), 7000, 70);
  EXPECT_NEAR(JsonNumber(r.out, "daly_seconds"), 7001.39, 0.01);
  EXPECT_NEAR(JsonNumber(r.out, "expected_waste"), policy::ExpectedWaste(7001.39, 300, 0, 86400), 1e-5);
  EXPECT_NEAR(JsonNumber(r.out, "alternative_waste"), 300.0 / 1800 + 900.0 / 86400, 1e-5);
  EXPECT_EQ(JsonNumber(r.out, "mtbf_seconds"), 86400);
  EXPECT_EQ(JsonNumber(r.out, "mtbf_hours"), 24);
  EXPECT_EQ(JsonNumber(r.out, "cost_seconds"), 300);
  EXPECT_EQ(JsonNumber(r.out, "persist_seconds"), 0);
  EXPECT_EQ(JsonNumber(r.out, "restart_seconds"), 0);
  EXPECT_EQ(JsonNumber(r.out, "alternative_seconds"), 1800);
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"mode\":\"offline\""), HasSubstr("\"step_seconds\":null"),
                           HasSubstr("\"min_seconds\":null"), HasSubstr("\"max_seconds\":null"),
                           HasSubstr("\"interval_steps\":null"), HasSubstr("\"reason\":\"Daly optimum\"")));
  EXPECT_THAT(r.out, Not(HasSubstr("failure_rate")));
}

TEST(IntervalCommandTest, JsonWithStepsAndBounds) {
  Result r = Interval({"--mtbf-hours=24", "--cost-seconds=300", "--step-seconds=10", "--max-seconds=3600",
                       "--min-seconds=60", "--alternative-seconds=600", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_EQ(JsonNumber(r.out, "interval_seconds"), 3600);
  EXPECT_EQ(JsonNumber(r.out, "interval_steps"), 360);
  EXPECT_EQ(JsonNumber(r.out, "step_seconds"), 10);
  EXPECT_EQ(JsonNumber(r.out, "min_seconds"), 60);
  EXPECT_EQ(JsonNumber(r.out, "max_seconds"), 3600);
  EXPECT_EQ(JsonNumber(r.out, "alternative_seconds"), 600);
  EXPECT_THAT(r.out, HasSubstr("\"reason\":\"clamped to operator maximum\""));
}

TEST(IntervalCommandTest, PersistFloorIsTheReason) {
  Result r = Interval({"--mtbf-hours", "6", "--cost-seconds", "300", "--persist-seconds", "5000"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("5000 s (83.3 min)"), HasSubstr("raised to persist time P")));
}

TEST(IntervalCommandTest, TwoCadencesOffline) {
  // M = 24 h split 75/20/5: λ1 (process + node, with partners) = 0.95/M,
  // λ2 = 0.05/M; δm = 2 s, δd = 30 s: k* = sqrt(30·19/2) ≈ 16.9.
  const std::vector<std::string> base = {"--mtbf-hours", "24", "--cost-seconds", "32", "--memory-cost-seconds", "2",
                                         "--restart-seconds", "300", "--step-seconds", "5"};
  Result r = Interval(base);
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("two cadences"), HasSubstr("process failures"), HasSubstr("75.0 % of failures"),
                           HasSubstr("the agent's memory"), HasSubstr("a partner's memory"), HasSubstr("wide failures"),
                           HasSubstr("memory checkpoint cost δm"), HasSubstr("durable extra cost δd"),
                           HasSubstr("30.0 s"), HasSubstr("16.9"), HasSubstr("memory interval τ"),
                           HasSubstr("durable interval k·τ"), HasSubstr("every 17 checkpoints"),
                           HasSubstr("two-level Daly optimum"), HasSubstr("every checkpoint durable")));
  std::vector<std::string> json = base;
  json.push_back("--json");
  Result j = Interval(json);
  ASSERT_EQ(j.code, base::kExitOk) << j.err;
  ASSERT_TRUE(IsValidJson(j.out)) << j.out;
  const size_t at = j.out.find("\"two_level\":");
  ASSERT_NE(at, std::string::npos) << j.out;
  const std::string two = j.out.substr(at);
  policy::TwoLevelInputs in;
  in.memory_rate_per_s = 0.95 / (24 * 3600);
  in.durable_rate_per_s = 0.05 / (24 * 3600);
  in.memory_cost_s = 2;
  in.durable_cost_s = 30;
  in.memory_restart_s = in.durable_restart_s = 300;
  in.step_s = 5;
  const policy::TwoLevelDecision d = *policy::DecideTwoLevel(in);
  EXPECT_EQ(JsonNumber(two, "durable_every"), static_cast<double>(d.durable_every));
  EXPECT_NEAR(JsonNumber(two, "memory_interval_seconds"), d.memory_interval_s, 1e-6 * d.memory_interval_s);
  EXPECT_EQ(JsonNumber(two, "memory_interval_steps"), static_cast<double>(d.memory_steps));
  EXPECT_NEAR(JsonNumber(two, "expected_waste"), d.expected_waste, 1e-5 * d.expected_waste);
  EXPECT_LT(JsonNumber(two, "expected_waste"), JsonNumber(two, "single_waste"));
  EXPECT_THAT(two, HasSubstr("\"peer_copies\":true"));

  // Without partners a lost node needs disk: a smaller λ1, a smaller k.
  std::vector<std::string> lonely = json;
  lonely.push_back("--no-peer-copies");
  Result l = Interval(lonely);
  ASSERT_EQ(l.code, base::kExitOk) << l.err;
  const std::string lonely_two = l.out.substr(l.out.find("\"two_level\":"));
  EXPECT_THAT(lonely_two, HasSubstr("\"peer_copies\":false"));
  EXPECT_LT(JsonNumber(lonely_two, "durable_every"), JsonNumber(two, "durable_every"));
  // A mix with rarer process failures moves k down too.
  std::vector<std::string> mixed = json;
  mixed.insert(mixed.end(), {"--failure-mix", "0.2,0.2,0.6"});
  Result m = Interval(mixed);
  ASSERT_EQ(m.code, base::kExitOk) << m.err;
  EXPECT_LT(JsonNumber(m.out.substr(m.out.find("\"two_level\":")), "durable_every"), JsonNumber(two, "durable_every"));
  // Without --memory-cost-seconds there is no two-level section.
  Result plain = Interval({"--mtbf-hours", "24", "--cost-seconds", "32", "--json"});
  EXPECT_THAT(plain.out, Not(HasSubstr("two_level")));
}

TEST(IntervalCommandTest, TwoCadencesBadInput) {
  const std::vector<std::string> base = {"--mtbf-hours", "24", "--cost-seconds", "32"};
  struct Case {
    std::vector<std::string> extra;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--memory-cost-seconds", "40"}, "--memory-cost-seconds 40 exceeds --cost-seconds 32"},
           {{"--memory-cost-seconds", "0"}, "--memory-cost-seconds"},
           {{"--memory-cost-seconds", "2", "--failure-mix", "1,2"}, "--failure-mix: a failure mix is three fractions"},
           {{"--memory-cost-seconds", "2", "--failure-mix", "1,0,2"}, "node fraction must be positive"},
           {{"--memory-cost-seconds", "2", "--replicate-seconds", "-1"}, "--replicate-seconds"},
           {{"--failure-mix", "1,1,1"}, "--failure-mix needs --memory-cost-seconds"},
           {{"--no-peer-copies"}, "--no-peer-copies needs --memory-cost-seconds"},
       }) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), c.extra.begin(), c.extra.end());
    Result r = Interval(argv);
    EXPECT_EQ(r.code, base::kExitUsage) << c.message;
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_THAT(r.out, IsEmpty()) << c.message;
  }
}

TEST(IntervalCommandTest, SvgHasTheCurveAndBothMarkers) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/interval_curve.svg");
  std::remove(path.c_str());
  Result r = Interval({"--mtbf-hours", "24", "--cost-seconds", "300", "--svg", path});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("waste curve written to ", path)));
  const std::string svg = ReadFile(path);
  EXPECT_THAT(svg, StartsWith("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, EndsWith("</svg>\n"));
  EXPECT_THAT(svg, AllOf(HasSubstr("id=\"chosen\""), HasSubstr("id=\"alternative\""), HasSubstr("id=\"curve\""),
                         HasSubstr("<polyline"), HasSubstr("log scale"), HasSubstr("expected waste"),
                         HasSubstr("chosen 1.94 h: 8.34 %"), HasSubstr("alternative 30 min: 17.7 %"),
                         HasSubstr(">1 h</text>"), HasSubstr(">0 %</text>")));
  // Daly is the chosen interval here: no separate marker.
  EXPECT_THAT(svg, Not(HasSubstr("id=\"daly\"")));
  // Tags balance (a cheap well-formedness check; the text holds no '<').
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '<'), std::count(svg.begin(), svg.end(), '>'));
  std::remove(path.c_str());
}

TEST(IntervalCommandTest, SvgMarksDalyWhenAFloorMovedTheInterval) {
  IntervalReport report;
  report.inputs.mtbf_s = 6 * 3600;
  report.inputs.delta_s = 300;
  report.inputs.persist_s = 5000;
  report.decision = *policy::DecideInterval(report.inputs);
  const std::string svg = WasteCurveSvg(report);
  EXPECT_THAT(svg, AllOf(HasSubstr("id=\"daly\""), HasSubstr("id=\"persist-floor\""), HasSubstr("τ &lt; P")));
}

TEST(IntervalCommandTest, SvgWriteFailureExitsOne) {
  Result r = Interval({"--mtbf-hours", "24", "--cost-seconds", "300", "--svg", "/nonexistent-dir/x/curve.svg"});
  EXPECT_EQ(r.code, base::kExitFailed);
  EXPECT_THAT(r.err, HasSubstr("--svg: cannot write /nonexistent-dir/x/curve.svg"));
}

TEST(IntervalCommandTest, LiveReportRendersTheRate) {
  // What the live mode fills in: the same renderers show the estimate.
  IntervalReport report;
  report.job = "llama<70b>";
  report.gpus = 8192;
  report.rate = policy::EstimateFailureRate(policy::FailurePrior{}, 12, 2e6);
  report.inputs.mtbf_s = policy::JobMtbfSeconds(report.rate->mean, report.gpus);
  report.inputs.delta_s = 20;
  report.inputs.step_s = 4;
  report.decision = *policy::DecideInterval(report.inputs);

  std::ostringstream table;
  PrintIntervalTable(report, table);
  EXPECT_THAT(table.str(), AllOf(HasSubstr("job llama<70b>"), HasSubstr("GPUs G"), HasSubstr("8192"),
                                 HasSubstr("failure rate λ"), HasSubstr("90% credible"),
                                 HasSubstr("12 failures over 2e+06 GPU-hours"), HasSubstr("MTBF range")));
  const std::string json = IntervalJson(report);
  ASSERT_TRUE(IsValidJson(json)) << json;
  EXPECT_THAT(json, AllOf(HasSubstr("\"mode\":\"live\""), HasSubstr("\"job\":\"llama<70b>\""),
                          HasSubstr("\"gpus\":8192"), HasSubstr("\"failure_rate\":{"), HasSubstr("\"failures\":12")));
  EXPECT_NEAR(JsonNumber(json, "mean_per_gpu_hour"), 13.0 / (1 / 3e-6 + 2e6), 1e-11);
  const std::string svg = WasteCurveSvg(report);
  EXPECT_THAT(svg, HasSubstr("job llama&lt;70b&gt;"));
  EXPECT_THAT(svg, Not(HasSubstr("llama<70b>")));
}

TEST(IntervalCommandTest, Help) {
  Result r = Interval({"--help"});
  EXPECT_EQ(r.code, base::kExitOk);
  for (const char* flag : {"--mtbf-hours", "--cost-seconds", "--restart-seconds", "--persist-seconds",
                           "--step-seconds", "--min-seconds", "--max-seconds", "--alternative-seconds", "--json",
                           "--svg", "--job", "--coordinator"}) {
    EXPECT_THAT(r.out, HasSubstr(flag));
  }
  EXPECT_THAT(r.out, AllOf(HasSubstr("Daly"), HasSubstr("W(τ) = δ/τ + (τ/2 + R)/M"), HasSubstr("never under P")));
}

TEST(IntervalCommandTest, BadInputIsAUsageError) {
  struct Case {
    std::vector<std::string> argv;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--cost-seconds", "300"}, "--mtbf-hours is required"},
           {{"--mtbf-hours", "24"}, "--cost-seconds is required"},
           {{"--mtbf-hours", "abc", "--cost-seconds", "300"}, "--mtbf-hours: \"abc\" is not a number"},
           {{"--mtbf-hours", "-2", "--cost-seconds", "300"}, "--mtbf-hours must be positive, got -2"},
           {{"--mtbf-hours", "24", "--cost-seconds", "0"}, "--cost-seconds must be positive, got 0"},
           {{"--mtbf-hours", "24", "--cost-seconds", "inf"}, "--cost-seconds: \"inf\" is not a number"},
           {{"--mtbf-hours", "24", "--cost-seconds", "3", "--restart-seconds", "-1"},
            "--restart-seconds must not be negative, got -1"},
           {{"--mtbf-hours", "24", "--cost-seconds", "3", "--alternative-seconds", "0"},
            "--alternative-seconds must be positive, got 0"},
           {{"--mtbf-hours", "24", "--cost-seconds", "3", "--min-seconds", "100", "--max-seconds", "50"},
            "--min-seconds 100 exceeds --max-seconds 50"},
           {{"--mtbf-hours", "24", "--cost-seconds", "3", "--bogus"}, "unknown flag --bogus"},
           {{"--mtbf-hours", "24", "--cost-seconds", "3", "extra"}, "unexpected argument \"extra\""},
           {{"--mtbf-hours"}, "--mtbf-hours needs a value"},
           {{"--job", "train"}, "--job (live mode) needs --coordinator"},
           {{"--job", "train", "--coordinator", "host:1234"}, "not available in this build"},
       }) {
    Result r = Interval(c.argv);
    EXPECT_EQ(r.code, base::kExitUsage) << c.message;
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_THAT(r.out, IsEmpty()) << c.message;
  }
}

// ---------------------------------------------------------------------- plan

TEST(ParseParameterCountTest, SuffixesAreDecimal) {
  EXPECT_EQ(*ParseParameterCount("7B"), 7e9);
  EXPECT_EQ(*ParseParameterCount("70b"), 70e9);
  EXPECT_EQ(*ParseParameterCount("1.5T"), 1.5e12);
  EXPECT_EQ(*ParseParameterCount("350M"), 350e6);
  EXPECT_EQ(*ParseParameterCount("125K"), 125e3);
  EXPECT_EQ(*ParseParameterCount("7e9"), 7e9);
  EXPECT_EQ(*ParseParameterCount("1000"), 1000);
  for (const char* bad : {"", "B", "-7B", "0", "7X", "seven", "nan", "inf", "7BB"}) {
    absl::StatusOr<double> v = ParseParameterCount(bad);
    EXPECT_FALSE(v.ok()) << bad;
    EXPECT_THAT(v.status().message(), HasSubstr(absl::StrCat("\"", bad, "\""))) << bad;
  }
}

// Issue 39, finding 6: counts are whole, digits read exactly, at most 2^53.
TEST(ParseParameterCountTest, WholeCountsUpTo2To53) {
  EXPECT_EQ(*ParseParameterCount("1.1T"), 1.1e12);
  EXPECT_EQ(*ParseParameterCount("9007199254740992"), 9007199254740992.0);
  EXPECT_EQ(*ParseParameterCount("9007199254740992"), policy::kMaxPlanParams);
  EXPECT_EQ(*ParseParameterCount("9007199254740K"), 9007199254740000.0);
  for (const char* over : {"9007199254740993", "9007199254741K", "9.1e15", "1e30", "99999999999999999999999"}) {
    absl::StatusOr<double> v = ParseParameterCount(over);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << over;
    EXPECT_THAT(v.status().message(),
                HasSubstr(absl::StrCat("\"", over, "\" is more than 9007199254740992 (2^53) parameters")))
        << over;
  }
  for (const char* fraction : {"2.5", "0.4", "1.0000001K"}) {
    absl::StatusOr<double> v = ParseParameterCount(fraction);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << fraction;
    EXPECT_THAT(v.status().message(), HasSubstr("is not a whole number of parameters")) << fraction;
  }
}

TEST(PlanCommandTest, TableSevenBillion) {
  Result r = Plan({"--params", "7B", "--gpus", "64", "--zero", "1", "--replicated", "once"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("7B parameters, 64 GPUs on 8 nodes (tp 1 × pp 1 × dp 64), bf16, adam, ZeRO-1"),
                           HasSubstr("params (weights)"), HasSubstr("14.00 GB"), HasSubstr("grads"),
                           HasSubstr("optimizer"), HasSubstr("1.31 GB"), HasSubstr("12 B/param / dp 64"),
                           HasSubstr("rng"), HasSubstr("7.57 kB"), HasSubstr("data cursor"), HasSubstr("4.10 kB"),
                           HasSubstr("total per rank"), HasSubstr("29.31 GB"), HasSubstr("per node (8 ranks)"),
                           HasSubstr("234.50 GB"), HasSubstr("job (64 ranks)"), HasSubstr("1.88 TB")));
  // Counted as written once: 112 GB of model state, 1/64 of it per rank.
  EXPECT_THAT(r.out, AllOf(HasSubstr("written per checkpoint (replicated state declared: written once per job, "
                                     "spread over dp 64)\n"),
                           HasSubstr("unique (one copy)           112.00 GB    16 B/param, rng and cursor per rank"),
                           HasSubstr("rank share                  1.75 GB      16 B/param / dp 64, rng, cursor"),
                           HasSubstr("node share (8 ranks)        14.00 GB\n"),
                           HasSubstr("job total (64 ranks)        112.00 GB    1× unique")));
  EXPECT_THAT(r.out, AllOf(HasSubstr("stall (= δ)"), HasSubstr("1.17 s: state held at 25 GB/s"),
                           HasSubstr("persist P                   7.00 s: node share at 2 GB/s"),
                           HasSubstr("job MTBF M"), HasSubstr("217.0 d"), HasSubstr("interval τ"),
                           HasSubstr("expected waste"), HasSubstr("waste at 30 min")));
}

TEST(PlanCommandTest, JsonSevenBillion) {
  Result r = Plan({"--params", "7e9", "--gpus", "64", "--zero", "1", "--replicated", "once", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"rank_bytes\":{\"params\":14000000000,\"grads\":14000000000,"
                                     "\"optimizer\":1312500000,\"rng\":7572,\"data_cursor\":4096,"
                                     "\"total\":29312511668}"),
                           HasSubstr("\"node_bytes\":234500093344"), HasSubstr("\"job_bytes\":1876000746752"),
                           HasSubstr("\"dp\":64"), HasSubstr("\"dtype\":\"bf16\""), HasSubstr("\"optimizer\":\"adam\""),
                           HasSubstr("\"bytes_per_param\":{\"weights\":2,\"grads\":2,\"optimizer\":12}")));
  EXPECT_NEAR(JsonNumber(r.out, "stall_seconds"), 29312511668 / 25e9, 1e-5);
  EXPECT_THAT(r.out,
              AllOf(HasSubstr("\"replicated\":\"once\""), HasSubstr("\"unique_bytes\":112000746752,"),
                    HasSubstr("\"rank_write_bytes\":1750011668,"), HasSubstr("\"node_write_bytes\":14000093344,"),
                    HasSubstr("\"job_write_bytes\":112000746752,")));
  EXPECT_NEAR(JsonNumber(r.out, "persist_seconds"), 14000093344 / 2e9, 1e-5);
  EXPECT_NEAR(JsonNumber(r.out, "mtbf_seconds"), 3600 / (64 * 3e-6), 100);
  const double daly = policy::DalyOptimum(29312511668 / 25e9, 3600 / (64 * 3e-6));
  EXPECT_NEAR(JsonNumber(r.out, "interval_seconds"), daly, daly * 1e-5);
  EXPECT_GT(JsonNumber(r.out, "expected_waste"), 0);
  EXPECT_GT(JsonNumber(r.out, "alternative_waste"), JsonNumber(r.out, "expected_waste"));
}

// `plan --params 70B --gpus 8192` (dp 8192, ZeRO-0) with `--replicated
// every` counts a job that does not declare its replicated state: every rank
// writes its whole 1.12 TB, 9.18 PB per job, a 4480 s persist per node that
// raises the interval.
TEST(PlanCommandTest, SeventyBillionOn8192GpusEveryRankWritingItsWholeState) {
  Result r = Plan({"--params", "70B", "--gpus", "8192", "--replicated", "every"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(
      r.out,
      AllOf(HasSubstr("(tp 1 × pp 1 × dp 8192), bf16, adam, ZeRO-0"),
            HasSubstr("total per rank              1.12 TB\n"), HasSubstr("per node (8 ranks)          8.96 TB\n"),
            HasSubstr("job (8192 ranks)            9.18 PB\n"),
            HasSubstr("written per checkpoint (replicated state not declared: every rank all it holds, replicas "
                      "included)\n"),
            HasSubstr("unique (one copy)           1.12 TB "),
            HasSubstr("rank share                  1.12 TB      all it holds"),
            HasSubstr("node share (8 ranks)        8.96 TB\n"),
            HasSubstr("job total (8192 ranks)      9.18 PB      8191× unique"),
            HasSubstr("stall (= δ)                 44.8 s: state held"),
            HasSubstr("persist P                   4480 s (74.7 min): node share at 2 GB/s"),
            HasSubstr("Daly optimum τ              3593 s (59.9 min)"),
            HasSubstr("interval τ                  4480 s (74.7 min), raised to persist time P")));

  Result json = Plan({"--params", "70B", "--gpus", "8192", "--replicated", "every", "--json"});
  ASSERT_EQ(json.code, base::kExitOk) << json.err;
  ASSERT_TRUE(IsValidJson(json.out)) << json.out;
  EXPECT_THAT(json.out,
              AllOf(HasSubstr("\"replicated\":\"every\""), HasSubstr("\"unique_bytes\":1120095584256,"),
                    HasSubstr("\"rank_write_bytes\":1120000011668,"), HasSubstr("\"node_write_bytes\":8960000093344,"),
                    HasSubstr("\"job_write_bytes\":9175040095584256,")));
  EXPECT_NEAR(JsonNumber(json.out, "persist_seconds"), 4480, 1e-3);
  EXPECT_NEAR(JsonNumber(json.out, "interval_seconds"), 4480, 1e-3);
}

// The default, what ckptd writes of declared replicated state: the 1.12 TB
// written once per job, a 137 MB share per rank, a 0.55 s persist and Daly's
// interval; `--replicated once` is the same.
TEST(PlanCommandTest, SeventyBillionOn8192GpusDefaultIsReplicatedStateWrittenOnce) {
  Result r = Plan({"--params", "70B", "--gpus", "8192"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(
      r.out,
      AllOf(HasSubstr("(tp 1 × pp 1 × dp 8192), bf16, adam, ZeRO-0"),
            HasSubstr("total per rank              1.12 TB\n"), HasSubstr("per node (8 ranks)          8.96 TB\n"),
            HasSubstr("job (8192 ranks)            9.18 PB\n"),
            HasSubstr("written per checkpoint (replicated state declared: written once per job, spread over dp "
                      "8192)\n"),
            HasSubstr("unique (one copy)           1.12 TB "),
            HasSubstr("rank share                  136.73 MB    16 B/param / dp 8192, rng, cursor"),
            HasSubstr("node share (8 ranks)        1.09 GB\n"),
            HasSubstr("job total (8192 ranks)      1.12 TB      1× unique"),
            HasSubstr("stall (= δ)                 44.8 s: state held"),
            HasSubstr("persist P                   0.55 s: node share at 2 GB/s"),
            HasSubstr("interval τ                  3593 s (59.9 min), Daly optimum")));
  EXPECT_THAT(r.out, Not(HasSubstr("raised to persist time P")));
  Result once_text = Plan({"--params", "70B", "--gpus", "8192", "--replicated", "once"});
  ASSERT_EQ(once_text.code, base::kExitOk) << once_text.err;
  EXPECT_EQ(once_text.out, r.out);

  Result once = Plan({"--params", "70B", "--gpus", "8192", "--json"});
  ASSERT_EQ(once.code, base::kExitOk) << once.err;
  ASSERT_TRUE(IsValidJson(once.out)) << once.out;
  // 70e9 × 16 + 8192 × 11668; 1.12e12 / 8192 + 11668; 8 shares.
  EXPECT_THAT(once.out,
              AllOf(HasSubstr("\"replicated\":\"once\""), HasSubstr("\"job_bytes\":9175040095584256,"),
                    HasSubstr("\"unique_bytes\":1120095584256,"), HasSubstr("\"rank_write_bytes\":136730418,"),
                    HasSubstr("\"node_write_bytes\":1093843344,"), HasSubstr("\"job_write_bytes\":1120095584256,")));
  EXPECT_NEAR(JsonNumber(once.out, "persist_seconds"), 1093843344 / 2e9, 1e-5);
  EXPECT_NEAR(JsonNumber(once.out, "stall_seconds"), 44.8, 1e-5);
}

TEST(PlanCommandTest, AllFlags) {
  Result r = Plan({"--params", "70B", "--gpus", "512", "--dtype", "fp32", "--optimizer", "sgd", "--zero", "3", "--tp",
                   "8", "--pp", "4", "--gpus-per-node", "4", "--d2h-gbps", "10", "--write-gbps", "5", "--fail-rate",
                   "1e-5", "--restart-seconds", "120", "--alternative-seconds", "3600", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  // 70e9/32 params per rank, dp 16, ZeRO-3 fp32 SGD: 4 + 4 + 4 bytes, all / 16.
  const double rank = 70e9 / 32 * 12 / 16 + 7572 + 4096;
  EXPECT_NEAR(JsonNumber(r.out, "stall_seconds"), rank / 10e9, 1e-6);
  EXPECT_NEAR(JsonNumber(r.out, "persist_seconds"), 4 * rank / 5e9, 1e-5);
  EXPECT_NEAR(JsonNumber(r.out, "mtbf_hours"), 1 / (512 * 1e-5), 1e-3);
  EXPECT_EQ(JsonNumber(r.out, "nodes"), 128);
  EXPECT_EQ(JsonNumber(r.out, "restart_seconds"), 120);
  EXPECT_EQ(JsonNumber(r.out, "alternative_seconds"), 3600);
}

TEST(PlanCommandTest, Help) {
  Result r = Plan({"--help"});
  EXPECT_EQ(r.code, base::kExitOk);
  for (const char* flag : {"--params", "--gpus", "--dtype", "--optimizer", "--zero", "--tp", "--pp", "--gpus-per-node",
                           "--d2h-gbps", "--write-gbps", "--fail-rate", "--restart-seconds", "--alternative-seconds",
                           "--json", "--replicated once|every", "--gpu-memory"}) {
    EXPECT_THAT(r.out, HasSubstr(flag));
  }
  EXPECT_THAT(r.out,
              AllOf(HasSubstr("once (default): what ckptd"), HasSubstr("writes when the job declares its replicated"),
                    HasSubstr("every: what it"), HasSubstr("--replicated once (replicated state declared)"),
                    HasSubstr("With every (not declared)")));
  EXPECT_THAT(r.out,
              AllOf(HasSubstr("the memory tier keeps\n  the whole state"), HasSubstr("copies every buffer whole"),
                    HasSubstr("--gpu-memory M"), HasSubstr("(default 80 GiB,\n"), HasSubstr("fits_gpu_memory"),
                    HasSubstr("share_copy_seconds"), HasSubstr("Share copy = rank\n  share / --d2h-gbps"),
                    HasSubstr("exit status: 0 success (a plan that does not fit the GPU's memory\nincluded)"),
                    HasSubstr("Unique bytes: one copy of each tp/pp shard"), HasSubstr("unique_bytes"),
                    HasSubstr("rank_write_bytes"), HasSubstr("node_write_bytes"), HasSubstr("job_write_bytes"),
                    HasSubstr("persist P = node share / --write-gbps")));
  EXPECT_THAT(r.out, AllOf(HasSubstr("bytes per parameter"), HasSubstr("fp32 master 4, m 4, v 4"),
                           HasSubstr("ZeRO stage 1 divides the"), HasSubstr("7572 bytes per rank"),
                           HasSubstr("GB = 1e9 bytes"), HasSubstr("not\n  modelled offline")));
}

TEST(PlanCommandTest, BadInputIsAUsageError) {
  struct Case {
    std::vector<std::string> argv;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--gpus", "8"}, "--params is required"},
           {{"--params", "7B"}, "--gpus is required"},
           {{"--params", "7Q", "--gpus", "8"}, "--params: \"7Q\" is not a positive parameter count"},
           {{"--params", "7B", "--gpus", "0"}, "--gpus must be in 1..2147483647, got 0"},
           {{"--params", "7B", "--gpus", "-8"}, "--gpus: \"-8\" is not a non-negative integer"},
           {{"--params", "7B", "--gpus", "99999999999"}, "--gpus must be in 1..2147483647, got 99999999999"},
           {{"--params", "7B", "--gpus", "8", "--zero", "4"}, "--zero must be in 0..3, got 4"},
           {{"--params", "7B", "--gpus", "8", "--tp", "0"}, "--tp must be in 1.."},
           {{"--params", "7B", "--gpus", "8", "--dtype", "fp8"},
            "--dtype: unknown dtype \"fp8\" (accepted: bf16, fp16, fp32)"},
           {{"--params", "7B", "--gpus", "8", "--optimizer", "lion"},
            "--optimizer: unknown optimizer \"lion\" (accepted: adam, adam-8bit, sgd)"},
           {{"--params", "7B", "--gpus", "12", "--tp", "8"}, "--gpus 12 is not a multiple of --tp × --pp = 8"},
           {{"--params", "7B", "--gpus", "8", "--d2h-gbps", "0"}, "--d2h-gbps must be positive, got 0"},
           {{"--params", "7B", "--gpus", "8", "--write-gbps", "x"}, "--write-gbps: \"x\" is not a number"},
           {{"--params", "7B", "--gpus", "8", "--fail-rate", "-1e-6"}, "--fail-rate must be positive, got -1e-6"},
           {{"--params", "7B", "--gpus", "8", "--restart-seconds", "-5"}, "--restart-seconds must not be negative"},
           {{"--params", "7B", "--gpus", "8", "--gpus-per-node", "0"}, "--gpus-per-node must be in 1.."},
           {{"--params", "7B", "--gpus", "8", "--svg", "x"}, "unknown flag --svg"},
           {{"--params", "7B", "--gpus", "8", "--replicated", "twice"},
            "--replicated: unknown way to write replicated state \"twice\" (accepted: once, every)"},
           {{"--params", "7B", "--gpus", "8", "--replicated", "EVERY"}, "--replicated: "},
       }) {
    Result r = Plan(c.argv);
    EXPECT_EQ(r.code, base::kExitUsage) << c.message;
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_THAT(r.out, IsEmpty()) << c.message;
  }
}

TEST(ParseGpuMemoryTest, GibOrAUnit) {
  EXPECT_EQ(*ParseGpuMemory("80"), uint64_t{80} << 30);
  EXPECT_EQ(*ParseGpuMemory("79.5"), uint64_t{159} << 29);
  EXPECT_EQ(*ParseGpuMemory("96G"), uint64_t{96} << 30);
  EXPECT_EQ(*ParseGpuMemory("96gib"), uint64_t{96} << 30);
  EXPECT_EQ(*ParseGpuMemory("141GB"), uint64_t{141} * 1000 * 1000 * 1000);
  EXPECT_EQ(*ParseGpuMemory("1TiB"), uint64_t{1} << 40);
  EXPECT_EQ(*ParseGpuMemory("2T"), uint64_t{2} << 40);
  EXPECT_EQ(*ParseGpuMemory("1.5TB"), uint64_t{1500} * 1000 * 1000 * 1000);
  EXPECT_EQ(*ParseGpuMemory("512MiB"), uint64_t{512} << 20);
  EXPECT_EQ(*ParseGpuMemory("1K"), uint64_t{1024});
  EXPECT_EQ(*ParseGpuMemory("1kb"), uint64_t{1000});
  for (const char* bad : {"", "G", "80X", "80PB", "nan", "inf", "eighty", "80 G B"}) {
    absl::StatusOr<uint64_t> v = ParseGpuMemory(bad);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(v.status().message(), HasSubstr(absl::StrCat("\"", bad, "\" is not a memory size"))) << bad;
  }
  for (const char* out_of_range : {"0", "-80", "0.0000000001K", "1048577TiB", "1e300"}) {
    absl::StatusOr<uint64_t> v = ParseGpuMemory(out_of_range);
    EXPECT_THAT(v.status().message(), HasSubstr("is not a memory size from 1 byte to 1 EiB (2^60 bytes)"))
        << out_of_range;
  }
}

// Issue 39, finding 8: `plan --params 70B --gpus 8192` (ZeRO-0) accepted 1.12
// TB of state per rank; it is still planned (exit 0), with a warning in the
// table, on stderr with --json, and fits_gpu_memory false. The stall is the
// copy of all a rank holds, what ckptd's client copies; the share copy, what
// it writes, is shown beside it and not used for δ.
TEST(PlanCommandTest, StateOverTheGpuMemoryIsPlannedWithAWarning) {
  const char* warning =
      "WARNING: does not fit: each rank holds 1.12 TB (1120000011668 bytes) of state, more than the GPU's memory, "
      "85.90 GB (80.0 GiB, --gpu-memory); partition it further (--zero, --tp, --pp) or plan for larger GPUs";
  Result r = Plan({"--params", "70B", "--gpus", "8192"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out,
              AllOf(StartsWith("checkpoint plan: 70B parameters"), HasSubstr(absl::StrCat("\n\n", warning, "\n\n")),
                    HasSubstr("  GPU memory                  85.90 GB (80.0 GiB): the state per rank takes "
                              "1304 %, DOES NOT FIT\n"),
                    HasSubstr("stall (= δ)                 44.8 s: state held at 25 GB/s device-to-host (ckptd "
                              "copies all of it)\n"),
                    HasSubstr("share copy                  0.01 s: rank share at 25 GB/s, were a rank to copy "
                              "only that (ckptd does not)\n")));
  EXPECT_THAT(r.err, IsEmpty());

  Result json = Plan({"--params", "70B", "--gpus", "8192", "--json"});
  ASSERT_EQ(json.code, base::kExitOk) << json.err;
  ASSERT_TRUE(IsValidJson(json.out)) << json.out;
  EXPECT_THAT(json.out, AllOf(HasSubstr("\"gpu_memory_bytes\":85899345920,\"fits_gpu_memory\":false,"),
                              HasSubstr(absl::StrCat("\"warnings\":[\"", warning, "\"],"))));
  EXPECT_NEAR(JsonNumber(json.out, "stall_seconds"), 1120000011668 / 25e9, 1e-5);
  EXPECT_NEAR(JsonNumber(json.out, "share_copy_seconds"), 136730418 / 25e9, 1e-8);
  EXPECT_NEAR(JsonNumber(json.out, "cost_seconds"), 1120000011668 / 25e9, 1e-5);
  EXPECT_EQ(json.err, absl::StrCat("ckptctl plan: ", warning, "\n"));

  // Memory that holds it: no warning.
  for (const char* memory : {"2TB", "1043.1"}) {
    Result fits = Plan({"--params", "70B", "--gpus", "8192", "--gpu-memory", memory, "--json"});
    ASSERT_EQ(fits.code, base::kExitOk) << fits.err;
    EXPECT_THAT(fits.out, AllOf(HasSubstr("\"fits_gpu_memory\":true,"), HasSubstr("\"warnings\":[],"))) << memory;
    EXPECT_THAT(fits.err, IsEmpty());
  }
  // Partitioned: 8.85 GB per rank fits the default 80 GiB.
  Result sharded = Plan({"--params", "70B", "--gpus", "8192", "--tp", "8", "--pp", "4", "--zero", "1"});
  ASSERT_EQ(sharded.code, base::kExitOk) << sharded.err;
  EXPECT_THAT(sharded.out, AllOf(HasSubstr("GPU memory                  85.90 GB (80.0 GiB): the state per rank "
                                           "takes 10.3 %\n"),
                                 Not(HasSubstr("WARNING")), Not(HasSubstr("DOES NOT FIT"))));
  Result bad = Plan({"--params", "70B", "--gpus", "8192", "--gpu-memory", "0"});
  EXPECT_EQ(bad.code, base::kExitUsage);
  EXPECT_THAT(bad.err, HasSubstr("--gpu-memory: \"0\" is not a memory size from 1 byte to 1 EiB"));
}

// Issue 39, finding 6: `plan --params 1e30` saturated at 2^63 and printed
// totals inconsistent with their parts. The largest --params a layout takes
// plans with every total the exact sum or product of its parts; one more is
// refused naming --params, the limit and the most it takes.
TEST(PlanCommandTest, LargestParamsPlanConsistentlyAndOneMoreIsRefused) {
  // 8192 × (16 P + 11668) ≤ 2^63 − 1.
  Result r = Plan({"--params", "70368744176934", "--gpus", "8192", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ASSERT_TRUE(IsValidJson(r.out)) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"params\":70368744176934,"),
                           HasSubstr("\"rank_bytes\":{\"params\":140737488353868,\"grads\":140737488353868,"
                                     "\"optimizer\":844424930123208,\"rng\":7572,\"data_cursor\":4096,"
                                     "\"total\":1125899906842612}"),
                           HasSubstr("\"node_bytes\":9007199254740896,"),
                           HasSubstr("\"job_bytes\":9223372036854677504,"),
                           HasSubstr("\"unique_bytes\":1125900002415200,"),
                           HasSubstr("\"rank_write_bytes\":137438965139,"),
                           HasSubstr("\"node_write_bytes\":1099511721112,"),
                           HasSubstr("\"job_write_bytes\":1125900002418688,")));
  // job_write_bytes is 3488 over unique_bytes: the 8192 shares rounded up to whole bytes.
  Result table = Plan({"--params", "70368744176934", "--gpus", "8192", "--replicated", "every"});
  ASSERT_EQ(table.code, base::kExitOk) << table.err;
  EXPECT_THAT(table.out, AllOf(HasSubstr("total per rank              1.13 PB\n"),
                               HasSubstr("per node (8 ranks)          9.01 PB\n"),
                               HasSubstr("job (8192 ranks)            9.22 EB\n"),
                               HasSubstr("job total (8192 ranks)      9.22 EB      8192× unique")));

  Result over = Plan({"--params", "70368744176935", "--gpus", "8192"});
  EXPECT_EQ(over.code, base::kExitUsage);
  EXPECT_THAT(over.err, HasSubstr("--params 70368744176935: the job's ranks would hold more than 9223372036854775807 "
                                  "bytes (2^63 - 1), the most a figure of the plan may be; with --gpus 8192, --tp 1, "
                                  "--pp 1, --zero 0, --dtype bf16 and --optimizer adam, --params may be at most "
                                  "70368744176934"));
  EXPECT_THAT(over.out, IsEmpty());

  // The most GPUs refuse a 7B model, and take what fits.
  Result gpus = Plan({"--params", "7B", "--gpus", "2147483647"});
  EXPECT_EQ(gpus.code, base::kExitUsage);
  EXPECT_THAT(gpus.err, AllOf(HasSubstr("--params 7B: the job's ranks would hold more than 9223372036854775807"),
                              HasSubstr("--params may be at most 268434726\n")));
  EXPECT_EQ(Plan({"--params", "268434726", "--gpus", "2147483647"}).code, base::kExitOk);

  // 2^53 parameters on one GPU: the most --params counts.
  Result most = Plan({"--params", "9007199254740992", "--gpus", "1", "--json"});
  ASSERT_EQ(most.code, base::kExitOk) << most.err;
  EXPECT_THAT(most.out, AllOf(HasSubstr("\"params\":9007199254740992,"), HasSubstr("\"total\":144115188075867540}")));
  for (const char* params : {"9007199254740993", "1e30"}) {
    Result r2 = Plan({"--params", params, "--gpus", "1"});
    EXPECT_EQ(r2.code, base::kExitUsage) << params;
    EXPECT_THAT(r2.err,
                HasSubstr(absl::StrCat("--params: \"", params, "\" is more than 9007199254740992 (2^53) parameters")));
  }
}

// Issue 39, finding 6: bandwidths, rates and times far outside any machine
// would make times infinite or zero; refused naming the flag and the range.
TEST(PlanCommandTest, RealInputsOutsideTheirRangesAreRefused) {
  struct Case {
    std::vector<std::string> flags;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--d2h-gbps", "1e300"}, "--d2h-gbps must be in 1e-09..1e+09, got 1e+300"},
           {{"--d2h-gbps", "1e-320"}, "--d2h-gbps must be in 1e-09..1e+09, got 9.99989e-321"},
           {{"--d2h-gbps", "nan"}, "--d2h-gbps: \"nan\" is not a number"},
           {{"--d2h-gbps", "inf"}, "--d2h-gbps: \"inf\" is not a number"},
           {{"--d2h-gbps", "-25"}, "--d2h-gbps must be positive, got -25"},
           {{"--write-gbps", "2e9"}, "--write-gbps must be in 1e-09..1e+09, got 2e+09"},
           {{"--write-gbps", "-inf"}, "--write-gbps: \"-inf\" is not a number"},
           {{"--fail-rate", "1e-31"}, "--fail-rate must be in 1e-30..1e+06, got 1e-31"},
           {{"--fail-rate", "1e7"}, "--fail-rate must be in 1e-30..1e+06, got 1e+07"},
           {{"--fail-rate", "NaN"}, "--fail-rate: \"NaN\" is not a number"},
           {{"--restart-seconds", "1e13"}, "--restart-seconds must be in 0..1e+12, got 1e+13"},
           {{"--alternative-seconds", "1e-7"}, "--alternative-seconds must be in 1e-06..1e+12, got 1e-07"},
           {{"--alternative-seconds", "1e300"}, "--alternative-seconds must be in 1e-06..1e+12, got 1e+300"},
       }) {
    std::vector<std::string> argv = {"--params", "7B", "--gpus", "8"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    Result r = Plan(argv);
    EXPECT_EQ(r.code, base::kExitUsage) << c.message;
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_THAT(r.out, IsEmpty()) << c.message;
  }
  // The ends of the ranges plan.
  Result r = Plan({"--params", "7B", "--gpus", "8", "--d2h-gbps", "1e-9", "--write-gbps", "1e9", "--fail-rate", "1e6",
                   "--restart-seconds", "1e12", "--alternative-seconds", "1e-6", "--json"});
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_TRUE(std::isfinite(JsonNumber(r.out, "expected_waste")));
  EXPECT_TRUE(std::isfinite(JsonNumber(r.out, "alternative_waste")));
}

// What a coordinator answers once it has measured a checkpoint.
ckptd::v1::IntervalStatus DecidedStatus() {
  ckptd::v1::IntervalStatus st;
  st.set_job("llm");
  st.set_automatic(true);
  st.set_decided(true);
  st.set_every_steps(300);
  st.set_gpus(64);
  st.set_failures(3);
  st.set_exposure_gpu_hours(1e5);
  st.set_prior_per_gpu_hour(3e-6);
  st.set_prior_shape(1);
  st.set_rate_per_gpu_hour(4e-6);
  st.set_rate_lower(1e-6);
  st.set_rate_upper(9e-6);
  st.set_credible(0.9);
  st.set_mtbf_seconds(3600 / (64 * 4e-6));
  st.set_stall_seconds(2);
  st.set_slowdown_seconds(1);
  st.set_cost_seconds(3);
  st.set_persist_seconds(20);
  st.set_restart_seconds(300);
  st.set_restart_assumed(true);
  st.set_step_seconds(1.5);
  st.set_step_seconds_persisting(1.6);
  st.set_checkpoints_measured(7);
  policy::IntervalInputs in;
  in.mtbf_s = st.mtbf_seconds();
  in.delta_s = 3;
  in.persist_s = 20;
  in.restart_s = 300;
  in.step_s = 1.5;
  absl::StatusOr<policy::IntervalDecision> d = policy::DecideInterval(in);
  EXPECT_TRUE(d.ok());
  st.set_daly_seconds(d->daly_s);
  st.set_interval_seconds(d->interval_s);
  st.set_interval_steps(d->interval_steps);
  st.set_expected_waste(d->expected_waste);
  st.set_alternative_seconds(1800);
  st.set_alternative_waste(policy::ExpectedWaste(1800, 3, 300, in.mtbf_s));
  st.set_reason(d->reason);
  return st;
}

TEST(IntervalLiveTest, ShowsTheCoordinatorsDecisionAndEveryInput) {
  std::string asked;
  IntervalFetcher fetch = [&](const base::Args& args, const std::string& job) -> absl::StatusOr<ckptd::v1::IntervalStatus> {
    asked = absl::StrCat(*args.Get("coordinator"), " ", job);
    return DecidedStatus();
  };
  Result r = Interval({"--job", "llm", "--coordinator", "coord:7070"}, fetch);
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_EQ(asked, "coord:7070 llm");
  EXPECT_THAT(r.out, AllOf(HasSubstr("job llm"), HasSubstr("3 failures over 1e+05 GPU-hours"), HasSubstr("stall"),
                           HasSubstr("median of 7 checkpoints"), HasSubstr("slowdown"),
                           HasSubstr("assumed: no restart measured yet"), HasSubstr("schedule in force"),
                           HasSubstr("every 300 steps"), HasSubstr("inside the hysteresis")));
  Result j = Interval({"--job", "llm", "--coordinator", "coord:7070", "--json"}, fetch);
  ASSERT_EQ(j.code, base::kExitOk);
  EXPECT_TRUE(IsValidJson(j.out)) << j.out;
  EXPECT_THAT(j.out, AllOf(HasSubstr("\"mode\":\"live\""), HasSubstr("\"every_steps\":300"),
                           HasSubstr("\"restart_assumed\":true"), HasSubstr("\"checkpoints_measured\":7"),
                           HasSubstr("\"interval_seconds\":"), HasSubstr("\"expected_waste\":")));
  const std::string svg_path = ::testing::TempDir() + "/live_waste.svg";
  Result s = Interval({"--job", "llm", "--coordinator", "coord:7070", "--svg", svg_path}, fetch);
  ASSERT_EQ(s.code, base::kExitOk) << s.err;
  std::ifstream in(svg_path);
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(svg, AllOf(StartsWith("<svg"), HasSubstr("id=\"chosen\""), HasSubstr("job llm")));
  std::remove(svg_path.c_str());
}

TEST(IntervalLiveTest, ShowsTheTwoCadencesByClass) {
  IntervalFetcher fetch = [](const base::Args&, const std::string&) -> absl::StatusOr<ckptd::v1::IntervalStatus> {
    ckptd::v1::IntervalStatus st = DecidedStatus();
    ckptd::v1::TwoLevelStatus* two = st.mutable_two_level();
    const char* names[] = {"process", "node", "wide"};
    const double rates[] = {3e-6, 0.8e-6, 0.2e-6};
    const uint64_t seen[] = {2, 1, 0};
    for (int c = 0; c < 3; ++c) {
      ckptd::v1::FailureClassStatus* f = two->add_classes();
      f->set_name(names[c]);
      f->set_rate_per_gpu_hour(rates[c]);
      f->set_failures(seen[c]);
      f->set_from_memory(c == 0);
    }
    two->set_memory_rate_per_s(3e-6 * 64 / 3600);
    two->set_durable_rate_per_s(1e-6 * 64 / 3600);
    two->set_memory_cost_seconds(2);
    two->set_durable_cost_seconds(1);
    two->set_durable_every(2);
    two->set_durable_every_optimum(std::sqrt(1.5));
    two->set_memory_interval_seconds(600);
    two->set_memory_interval_steps(400);
    two->set_durable_interval_seconds(1200);
    two->set_durable_interval_steps(800);
    two->set_expected_waste(0.0123);
    two->set_single_interval_seconds(700);
    two->set_single_waste(0.012);
    two->set_reason("two-level Daly optimum");
    two->set_replicate_seconds(42);
    return st;
  };
  Result r = Interval({"--job", "llm", "--coordinator", "c:1"}, fetch);
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("replication time Q"));
  EXPECT_THAT(r.out, AllOf(HasSubstr("process failures"), HasSubstr("75.0 % of failures"), HasSubstr("2 seen"),
                           HasSubstr("disk (no replication partners)"), HasSubstr("(the stall)"),
                           HasSubstr("(the persist's slowdown)"), HasSubstr("every 400 steps"),
                           HasSubstr("every 2 checkpoints"), HasSubstr("every 800 steps"), HasSubstr("1.23 %")));
  Result j = Interval({"--job", "llm", "--coordinator", "c:1", "--json"}, fetch);
  ASSERT_EQ(j.code, base::kExitOk);
  ASSERT_TRUE(IsValidJson(j.out)) << j.out;
  EXPECT_THAT(j.out, AllOf(HasSubstr("\"two_level\":"), HasSubstr("\"failures\":2"), HasSubstr("\"durable_every\":2"),
                           HasSubstr("\"replicate_seconds\":42")));
}

TEST(IntervalLiveTest, UndecidedSaysWhatItWaitsFor) {
  IntervalFetcher fetch = [](const base::Args&, const std::string& job) -> absl::StatusOr<ckptd::v1::IntervalStatus> {
    ckptd::v1::IntervalStatus st;
    st.set_job(job);
    st.set_automatic(true);
    st.set_every_steps(100);
    st.set_waiting_for("a committed checkpoint, to measure its stall and persist time");
    return st;
  };
  Result r = Interval({"--job", "fresh", "--coordinator", "c:1"}, fetch);
  EXPECT_EQ(r.code, base::kExitOk);
  EXPECT_THAT(r.out, AllOf(HasSubstr("waiting for"), HasSubstr("a committed checkpoint"), HasSubstr("every 100 steps")));
  Result j = Interval({"--job", "fresh", "--coordinator", "c:1", "--json"}, fetch);
  EXPECT_TRUE(IsValidJson(j.out)) << j.out;
  EXPECT_THAT(j.out, AllOf(HasSubstr("\"decided\":false"), HasSubstr("\"waiting_for\":\"a committed")));
  Result s = Interval({"--job", "fresh", "--coordinator", "c:1", "--svg", ::testing::TempDir() + "/none.svg"}, fetch);
  EXPECT_EQ(s.code, base::kExitFailed);
  EXPECT_THAT(s.err, HasSubstr("no curve to draw"));
}

TEST(IntervalLiveTest, ErrorsMapToExitCodes) {
  auto failing = [](absl::Status status) {
    return [status](const base::Args&, const std::string&) -> absl::StatusOr<ckptd::v1::IntervalStatus> { return status; };
  };
  Result down = Interval({"--job", "j", "--coordinator", "c:1"},
                         failing(absl::UnavailableError("coordinator c:1: failed to connect")));
  EXPECT_EQ(down.code, base::kExitUnavailable);
  EXPECT_THAT(down.err, HasSubstr("failed to connect"));
  Result missing = Interval({"--job", "j", "--coordinator", "c:1"}, failing(absl::NotFoundError("no job j")));
  EXPECT_EQ(missing.code, base::kExitFailed);
  EXPECT_THAT(missing.err, HasSubstr("no job j"));
  Result mixed = Interval({"--job", "j", "--coordinator", "c:1", "--mtbf-hours", "3"}, failing(absl::OkStatus()));
  EXPECT_EQ(mixed.code, base::kExitUsage);
  EXPECT_THAT(mixed.err, HasSubstr("--mtbf-hours is for offline mode"));
  Result no_job = Interval({"--coordinator", "c:1"}, failing(absl::OkStatus()));
  EXPECT_EQ(no_job.code, base::kExitUsage);
  EXPECT_THAT(no_job.err, HasSubstr("needs --job"));
}

// Issue 16 (finding 10): the coordinator's texts reach the terminal escaped,
// the SVG as valid XML.
TEST(IntervalLiveTest, TheCoordinatorsTextsAreEscaped) {
  IntervalFetcher decided = [](const base::Args&, const std::string&) -> absl::StatusOr<ckptd::v1::IntervalStatus> {
    ckptd::v1::IntervalStatus st = DecidedStatus();
    st.set_job(absl::StrCat("llm", kHostile));
    st.set_reason(kHostile);
    return st;
  };
  Result r = Interval({"--job", "llm", "--coordinator", "c:1"}, decided);
  ASSERT_EQ(r.code, base::kExitOk) << r.err;
  ExpectTerminalSafe(r.out);
  EXPECT_THAT(r.out, AllOf(HasSubstr(absl::StrCat("checkpoint interval for job llm", kShown, "\n")),
                           HasSubstr(absl::StrCat("reason                      ", kShown, "\n"))));
  Result j = Interval({"--job", "llm", "--coordinator", "c:1", "--json"}, decided);
  EXPECT_TRUE(IsValidJson(j.out)) << j.out;
  ExpectTerminalSafe(j.out);
  const std::string svg_path = ::testing::TempDir() + "/hostile_waste.svg";
  Result s = Interval({"--job", "llm", "--coordinator", "c:1", "--svg", svg_path}, decided);
  ASSERT_EQ(s.code, base::kExitOk) << s.err;
  std::ifstream in(svg_path);
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ExpectTerminalSafe(svg);
  EXPECT_THAT(svg, HasSubstr(absl::StrCat("job llm", kShown)));
  std::remove(svg_path.c_str());

  IntervalFetcher undecided = [](const base::Args&, const std::string&) -> absl::StatusOr<ckptd::v1::IntervalStatus> {
    ckptd::v1::IntervalStatus st;
    st.set_job(absl::StrCat("llm", kHostile));
    st.set_reason(kHostile);
    st.set_waiting_for(kHostile);
    return st;
  };
  Result u = Interval({"--job", "llm", "--coordinator", "c:1", "--svg", ::testing::TempDir() + "/none.svg"}, undecided);
  EXPECT_EQ(u.code, base::kExitFailed);
  ExpectTerminalSafe(u.out);
  ExpectTerminalSafe(u.err);
  EXPECT_THAT(u.out, HasSubstr(absl::StrCat("waiting for                 ", kShown, "\n")));
  EXPECT_THAT(u.err, HasSubstr(absl::StrCat("yet: waiting for ", kShown, "\n")));
  auto failing = [](const base::Args&, const std::string&) -> absl::StatusOr<ckptd::v1::IntervalStatus> {
    return absl::NotFoundError(kHostile);
  };
  Result f = Interval({"--job", "llm", "--coordinator", "c:1"}, failing);
  EXPECT_EQ(f.code, base::kExitFailed);
  ExpectTerminalSafe(f.err);
  EXPECT_THAT(f.err, HasSubstr(kShown));
}

// Issue 16, finding 9: live mode's --coordinator port is checked before the
// coordinator is asked: never wrapped to another port.
TEST(IntervalLiveTest, ACoordinatorPortOutsideItsRangeIsAUsageError) {
  int fetches = 0;
  IntervalFetcher counting = [&fetches](const base::Args&,
                                        const std::string&) -> absl::StatusOr<ckptd::v1::IntervalStatus> {
    ++fetches;
    return absl::UnavailableError("not reached");
  };
  for (const char* address : {"127.0.0.1:99999", "c:0", "c:65536", "c"}) {
    Result r = Interval({"--job", "llm", "--coordinator", address}, counting);
    EXPECT_EQ(r.code, base::kExitUsage) << address;
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("--coordinator: \"", address, "\""))) << address;
  }
  EXPECT_EQ(fetches, 0);
}

// Issue 16, finding 9: plan's integers are parsed wide (2^32 + 8 GPUs was 8).
TEST(PlanCommandTest, IntegersPastTheirRangeAreUsageErrorsNotTruncated) {
  for (const char* gpus : {"4294967304", "2147483648", "0"}) {
    Result r = Plan({"--params", "7B", "--gpus", gpus});
    EXPECT_EQ(r.code, base::kExitUsage) << gpus;
    EXPECT_THAT(r.err, HasSubstr("--gpus")) << gpus;
  }
  Result zero = Plan({"--params", "7B", "--gpus", "8", "--zero", "4294967296"});
  EXPECT_EQ(zero.code, base::kExitUsage);
  EXPECT_THAT(zero.err, HasSubstr("--zero"));
}

}  // namespace
}  // namespace ckptd::cli
