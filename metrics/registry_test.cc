#include "metrics/registry.h"

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::metrics {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;

TEST(RegistryTest, EmptyRegistryRendersNothing) {
  Registry registry;
  EXPECT_EQ(registry.Render(), "");
}

TEST(RegistryTest, CounterWithoutLabelsRendersZeroFromTheStart) {
  Registry registry;
  CKPTD_ASSERT_OK_AND_ASSIGN(CounterFamily * c, registry.AddCounter("ckptd_restores_total", "Restores."));
  EXPECT_EQ(registry.Render(),
            "# HELP ckptd_restores_total Restores.\n"
            "# TYPE ckptd_restores_total counter\n"
            "ckptd_restores_total 0\n");
  c->With()->Increment();
  c->With()->Increment(2);
  EXPECT_EQ(c->With()->Value(), 3);
  EXPECT_THAT(registry.Render(), HasSubstr("\nckptd_restores_total 3\n"));
}

TEST(RegistryTest, CountersAndGaugesWithLabelsRenderSortedExactly) {
  Registry registry;
  CKPTD_ASSERT_OK_AND_ASSIGN(
      CounterFamily * committed,
      registry.AddCounter("ckptd_checkpoints_committed_total", "Checkpoints committed.", {"job", "tier"}));
  CKPTD_ASSERT_OK_AND_ASSIGN(GaugeFamily * bytes, registry.AddGauge("ckptd_staging_bytes", "Staged bytes.", {"job"}));
  committed->With({"job-b", "disk"})->Increment(5);
  committed->With({"job-a", "disk"})->Increment();
  committed->With({"job-a", "disk"})->Increment();
  bytes->With({"job-a"})->Set(1024);
  bytes->With({"job-a"})->Add(-24);
  bytes->With({"job-b"})->Set(0.5);
  EXPECT_EQ(registry.Render(),
            "# HELP ckptd_checkpoints_committed_total Checkpoints committed.\n"
            "# TYPE ckptd_checkpoints_committed_total counter\n"
            "ckptd_checkpoints_committed_total{job=\"job-a\",tier=\"disk\"} 2\n"
            "ckptd_checkpoints_committed_total{job=\"job-b\",tier=\"disk\"} 5\n"
            "# HELP ckptd_staging_bytes Staged bytes.\n"
            "# TYPE ckptd_staging_bytes gauge\n"
            "ckptd_staging_bytes{job=\"job-a\"} 1000\n"
            "ckptd_staging_bytes{job=\"job-b\"} 0.5\n");
}

TEST(RegistryTest, FamilyWithLabelsButNoChildrenRendersNothing) {
  Registry registry;
  ASSERT_THAT(registry.AddGauge("ckptd_jobs", "Jobs.", {"state"}), IsOk());
  EXPECT_EQ(registry.Render(), "");
}

TEST(RegistryTest, WithReturnsTheSameChild) {
  Registry registry;
  CKPTD_ASSERT_OK_AND_ASSIGN(CounterFamily * c, registry.AddCounter("x_total", "X.", {"a"}));
  std::string value = "v";
  Counter* first = c->With({value});
  EXPECT_EQ(c->With({"v"}), first);
  EXPECT_NE(c->With({"w"}), first);
}

TEST(RegistryTest, EscapesLabelValuesAndHelp) {
  Registry registry;
  CKPTD_ASSERT_OK_AND_ASSIGN(GaugeFamily * g,
                             registry.AddGauge("g", "Help with \\ backslash,\nnewline and \"quotes\".", {"path"}));
  g->With({"C:\\dir\n\"x\""})->Set(1);
  EXPECT_EQ(registry.Render(),
            "# HELP g Help with \\\\ backslash,\\nnewline and \"quotes\".\n"
            "# TYPE g gauge\n"
            "g{path=\"C:\\\\dir\\n\\\"x\\\"\"} 1\n");
}

TEST(RegistryTest, InvalidUtf8BecomesReplacementCharacter) {
  EXPECT_EQ(EscapeLabelValue("ok \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), "ok \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  EXPECT_EQ(EscapeLabelValue("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(EscapeLabelValue("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong '/'
  EXPECT_EQ(EscapeLabelValue("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(EscapeLabelValue("\xE2\x82"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // truncated
  EXPECT_EQ(EscapeHelp(std::string("a\0b", 3)), std::string("a\0b", 3));
  EXPECT_EQ(EscapeHelp("say \"hi\""), "say \"hi\"");
}

TEST(RegistryTest, EmptyHelpOmitsTheHelpLine) {
  Registry registry;
  ASSERT_THAT(registry.AddGauge("g", ""), IsOk());
  EXPECT_EQ(registry.Render(), "# TYPE g gauge\ng 0\n");
}

TEST(RegistryTest, HistogramRendersCumulativeBucketsSumAndCount) {
  Registry registry;
  CKPTD_ASSERT_OK_AND_ASSIGN(HistogramFamily * h,
                             registry.AddHistogram("ckptd_commit_seconds", "Commit latency.", {0.1, 1, 10}, {"job"}));
  Histogram* a = h->With({"a"});
  a->Observe(0.05);
  a->Observe(0.1);  // bounds are inclusive
  a->Observe(0.5);
  a->Observe(20);
  h->With({"b"});
  EXPECT_EQ(registry.Render(),
            "# HELP ckptd_commit_seconds Commit latency.\n"
            "# TYPE ckptd_commit_seconds histogram\n"
            "ckptd_commit_seconds_bucket{job=\"a\",le=\"0.1\"} 2\n"
            "ckptd_commit_seconds_bucket{job=\"a\",le=\"1\"} 3\n"
            "ckptd_commit_seconds_bucket{job=\"a\",le=\"10\"} 3\n"
            "ckptd_commit_seconds_bucket{job=\"a\",le=\"+Inf\"} 4\n"
            "ckptd_commit_seconds_sum{job=\"a\"} 20.65\n"
            "ckptd_commit_seconds_count{job=\"a\"} 4\n"
            "ckptd_commit_seconds_bucket{job=\"b\",le=\"0.1\"} 0\n"
            "ckptd_commit_seconds_bucket{job=\"b\",le=\"1\"} 0\n"
            "ckptd_commit_seconds_bucket{job=\"b\",le=\"10\"} 0\n"
            "ckptd_commit_seconds_bucket{job=\"b\",le=\"+Inf\"} 0\n"
            "ckptd_commit_seconds_sum{job=\"b\"} 0\n"
            "ckptd_commit_seconds_count{job=\"b\"} 0\n");
}

TEST(RegistryTest, HistogramWithoutLabelsOrBounds) {
  Registry registry;
  CKPTD_ASSERT_OK_AND_ASSIGN(HistogramFamily * h,
                             registry.AddHistogram("h_bytes", "H.", {std::numeric_limits<double>::infinity()}));
  h->With()->Observe(3);
  h->With()->Observe(std::nan(""));
  EXPECT_EQ(registry.Render(),
            "# HELP h_bytes H.\n"
            "# TYPE h_bytes histogram\n"
            "h_bytes_bucket{le=\"+Inf\"} 2\n"
            "h_bytes_sum NaN\n"
            "h_bytes_count 2\n");
}

TEST(RegistryTest, HistogramRejectsBadBounds) {
  Registry registry;
  EXPECT_THAT(registry.AddHistogram("h", "H.", {1, 1}), StatusIs(absl::StatusCode::kInvalidArgument,
                                                                 HasSubstr("strictly increasing")));
  EXPECT_THAT(registry.AddHistogram("h", "H.", {2, 1}), StatusIs(absl::StatusCode::kInvalidArgument,
                                                                 HasSubstr("strictly increasing")));
  EXPECT_THAT(registry.AddHistogram("h", "H.", {std::nan(""), 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bound 0 is NaN")));
  EXPECT_THAT(registry.AddHistogram("h", "H.", {-std::numeric_limits<double>::infinity(), 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("finite")));
  EXPECT_THAT(registry.AddHistogram("h", "H.", {1}, {"le"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"le\" is reserved")));
}

TEST(RegistryTest, FormatValue) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(-0.0), "0");
  EXPECT_EQ(FormatValue(42), "42");
  EXPECT_EQ(FormatValue(-7), "-7");
  EXPECT_EQ(FormatValue(1e15), "1000000000000000");
  EXPECT_EQ(FormatValue(9007199254740992.0), "9007199254740992");
  EXPECT_EQ(FormatValue(1e20), "1e+20");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(2.5e-7), "2.5e-07");
  EXPECT_EQ(FormatValue(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  EXPECT_EQ(std::stod(FormatValue(1.0 / 3)), 1.0 / 3);
}

TEST(RegistryTest, GaugeSpecialValues) {
  Registry registry;
  CKPTD_ASSERT_OK_AND_ASSIGN(GaugeFamily * g, registry.AddGauge("g", "G.", {"v"}));
  g->With({"inf"})->Set(std::numeric_limits<double>::infinity());
  g->With({"nan"})->Set(std::nan(""));
  g->With({"neg"})->Set(-std::numeric_limits<double>::infinity());
  EXPECT_EQ(registry.Render(),
            "# HELP g G.\n# TYPE g gauge\n"
            "g{v=\"inf\"} +Inf\n"
            "g{v=\"nan\"} NaN\n"
            "g{v=\"neg\"} -Inf\n");
}

TEST(RegistryTest, CounterIgnoresNegativeAndNaNIncrements) {
  Counter c;
  c.Increment(2);
  c.Increment(-1);
  c.Increment(std::nan(""));
  EXPECT_EQ(c.Value(), 2);
}

TEST(RegistryTest, CounterIncrementToRaisesToATotalAndNeverLowers) {
  Counter c;
  c.IncrementTo(5);
  EXPECT_EQ(c.Value(), 5);
  c.IncrementTo(3);  // a total read lower (a source that restarted): the counter stays
  c.IncrementTo(std::nan(""));
  EXPECT_EQ(c.Value(), 5);
  c.Increment();
  c.IncrementTo(8);
  EXPECT_EQ(c.Value(), 8);
}

TEST(RegistryTest, ValidatesNames) {
  Registry registry;
  for (const char* bad : {"", "1abc", "a-b", "a b", "é", "a.b"}) {
    EXPECT_THAT(registry.AddCounter(bad, "x"),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("invalid metric name")))
        << bad;
  }
  for (const char* good : {"a", "_a", ":a", "a:b_c9", "ABC"}) {
    EXPECT_THAT(registry.AddCounter(good, "x"), IsOk()) << good;
  }
  for (const char* bad : {"", "1a", "a:b", "__reserved", "a-b"}) {
    EXPECT_THAT(registry.AddGauge("labelled", "x", {bad}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("invalid label name")))
        << bad;
  }
  EXPECT_THAT(registry.AddGauge("labelled", "x", {"a", "b", "a"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"a\" repeats")));
  EXPECT_THAT(registry.AddGauge("labelled", "x", {"_a", "a9"}), IsOk());
}

TEST(RegistryTest, RepeatedRegistration) {
  Registry registry;
  CKPTD_ASSERT_OK_AND_ASSIGN(CounterFamily * c1, registry.AddCounter("c_total", "C.", {"job"}));
  CKPTD_ASSERT_OK_AND_ASSIGN(CounterFamily * c2, registry.AddCounter("c_total", "Other help.", {"job"}));
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(c2->help(), "C.");
  EXPECT_THAT(registry.AddGauge("c_total", "C.", {"job"}),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("already registered as a counter")));
  EXPECT_THAT(registry.AddCounter("c_total", "C.", {"node"}),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("other label names")));
  EXPECT_THAT(registry.AddCounter("c_total", "C."),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("other label names")));

  CKPTD_ASSERT_OK_AND_ASSIGN(HistogramFamily * h1, registry.AddHistogram("h", "H.", {1, 2}));
  CKPTD_ASSERT_OK_AND_ASSIGN(HistogramFamily * h2,
                             registry.AddHistogram("h", "H.", {1, 2, std::numeric_limits<double>::infinity()}));
  EXPECT_EQ(h1, h2);
  EXPECT_THAT(registry.AddHistogram("h", "H.", {1, 3}),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("other buckets")));
}

TEST(RegistryTest, RemoveAndClearDropChildren) {
  Registry registry;
  CKPTD_ASSERT_OK_AND_ASSIGN(GaugeFamily * g, registry.AddGauge("g", "G.", {"job"}));
  g->With({"a"})->Set(1);
  g->With({"b"})->Set(2);
  g->Remove({"a"});
  g->Remove({"missing"});
  EXPECT_EQ(registry.Render(), "# HELP g G.\n# TYPE g gauge\ng{job=\"b\"} 2\n");
  g->Clear();
  EXPECT_EQ(registry.Render(), "");
  EXPECT_EQ(g->With({"a"})->Value(), 0);

  CKPTD_ASSERT_OK_AND_ASSIGN(GaugeFamily * unlabelled, registry.AddGauge("u", "U."));
  unlabelled->Clear();
  EXPECT_THAT(registry.Render(), HasSubstr("\nu 0\n"));
}

TEST(RegistryTest, WrongNumberOfLabelValues) {
  Registry registry;
  CKPTD_ASSERT_OK_AND_ASSIGN(GaugeFamily * g, registry.AddGauge("g", "G.", {"a", "b"}));
#ifdef NDEBUG
  g->With({"x"})->Set(1);
  g->With({"y", "z", "extra"})->Set(2);
  EXPECT_EQ(registry.Render(),
            "# HELP g G.\n# TYPE g gauge\n"
            "g{a=\"x\",b=\"\"} 1\n"
            "g{a=\"y\",b=\"z\"} 2\n");
#else
  EXPECT_DEATH(g->With({"x"}), "one value per label name");
#endif
}

TEST(RegistryTest, CollectorsRunBeforeRenderingUntilTheirHandleGoes) {
  Registry registry;
  CKPTD_ASSERT_OK_AND_ASSIGN(GaugeFamily * jobs, registry.AddGauge("ckptd_jobs", "Jobs.", {"job"}));
  std::vector<std::string> live_jobs = {"a", "b"};
  int runs = 0;
  CollectorHandle handle = registry.AddCollector([&] {
    ++runs;
    jobs->Clear();
    for (const std::string& j : live_jobs) jobs->With({j})->Set(1);
  });
  EXPECT_EQ(registry.Render(), "# HELP ckptd_jobs Jobs.\n# TYPE ckptd_jobs gauge\n"
                               "ckptd_jobs{job=\"a\"} 1\nckptd_jobs{job=\"b\"} 1\n");
  live_jobs = {"b"};
  EXPECT_EQ(registry.Render(), "# HELP ckptd_jobs Jobs.\n# TYPE ckptd_jobs gauge\nckptd_jobs{job=\"b\"} 1\n");
  EXPECT_EQ(runs, 2);

  CollectorHandle moved = std::move(handle);
  registry.Render();
  EXPECT_EQ(runs, 3);
  moved.Reset();
  registry.Render();
  EXPECT_EQ(runs, 3);
}

TEST(RegistryTest, CollectorMayRegisterFamilies) {
  Registry registry;
  CollectorHandle handle = registry.AddCollector([&] {
    absl::StatusOr<GaugeFamily*> g = registry.AddGauge("late", "Late.");
    if (g.ok()) (*g)->With()->Set(7);
  });
  EXPECT_EQ(registry.Render(), "# HELP late Late.\n# TYPE late gauge\nlate 7\n");
}

TEST(RegistryTest, ConcurrentUpdatesSumCorrectly) {
  Registry registry;
  CKPTD_ASSERT_OK_AND_ASSIGN(CounterFamily * c, registry.AddCounter("c_total", "C.", {"job"}));
  CKPTD_ASSERT_OK_AND_ASSIGN(GaugeFamily * g, registry.AddGauge("g", "G."));
  CKPTD_ASSERT_OK_AND_ASSIGN(HistogramFamily * h, registry.AddHistogram("h", "H.", {10, 100}));
  constexpr int kThreads = 8;
  constexpr int kIterations = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter* mine = c->With({t % 2 == 0 ? "even" : "odd"});
      for (int i = 0; i < kIterations; ++i) {
        mine->Increment();
        c->With({"shared"})->Increment(2);  // looked up every time
        g->With()->Add(1);
        h->With()->Observe(i % 200);
        if (i % 1000 == 0) registry.Render();  // rendering concurrently is safe
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(c->With({"even"})->Value(), kThreads / 2 * kIterations);
  EXPECT_EQ(c->With({"odd"})->Value(), kThreads / 2 * kIterations);
  EXPECT_EQ(c->With({"shared"})->Value(), 2.0 * kThreads * kIterations);
  EXPECT_EQ(g->With()->Value(), kThreads * kIterations);
  const Histogram::Snapshot s = h->With()->Read();
  EXPECT_EQ(s.count, static_cast<uint64_t>(kThreads) * kIterations);
  // i % 200 in 0..199: 11 values <= 10, 101 values <= 100, each kIterations/200 times per thread.
  EXPECT_EQ(s.cumulative_counts[0], static_cast<uint64_t>(kThreads) * (kIterations / 200) * 11);
  EXPECT_EQ(s.cumulative_counts[1], static_cast<uint64_t>(kThreads) * (kIterations / 200) * 101);
  EXPECT_EQ(s.sum, static_cast<double>(kThreads) * (kIterations / 200) * (199 * 200 / 2));
}

}  // namespace
}  // namespace ckptd::metrics
