#include "cli/svg.h"

#include <string>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::cli::svg {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kSecond = 1'000'000'000;

TEST(SvgTest, ElementsAndAttributes) {
  EXPECT_EQ(Begin(200, 100, "timeline", " role=\"img\""),
            "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"timeline\" width=\"200\" height=\"100\" "
            "viewBox=\"0 0 200 100\" role=\"img\">\n");
  EXPECT_EQ(Begin(760.4, 440, "", ""),
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"760\" height=\"440\" viewBox=\"0 0 760 440\">\n");
  EXPECT_EQ(Title("a <b> & \"c\""), "<title>a &lt;b&gt; &amp; &quot;c&quot;</title>\n");
  EXPECT_EQ(LineAt(1, 2.25, 3.04, 4), " x1=\"1.0\" y1=\"2.2\" x2=\"3.0\" y2=\"4.0\"");
  // Code points, not bytes: τ is two bytes of UTF-8.
  EXPECT_DOUBLE_EQ(TextWidth("ab"), 2 * 6.6);
  EXPECT_DOUBLE_EQ(TextWidth("τ"), 6.6);
}

TEST(SvgTest, OffsetLabelsAndTickSteps) {
  EXPECT_EQ(OffsetLabel(0), "0");
  EXPECT_EQ(OffsetLabel(1e-12), "0");
  EXPECT_EQ(OffsetLabel(0.25), "+0.25 s");
  EXPECT_EQ(OffsetLabel(-1.5), "-1.5 s");
  EXPECT_EQ(OffsetLabel(119), "+119.0 s");
  EXPECT_EQ(OffsetLabel(300), "+5 min");
  EXPECT_DOUBLE_EQ(TickStep(10), 1);
  EXPECT_DOUBLE_EQ(TickStep(35), 5);
  EXPECT_DOUBLE_EQ(TickStep(0.5), 0.05);
  EXPECT_DOUBLE_EQ(TickStep(150), 20);
  EXPECT_DOUBLE_EQ(TickStep(0), 1e-4);  // a span of nothing still gets a step
}

TEST(SvgTest, TimeAxisMapsAndClamps) {
  TimeAxis axis;
  axis.from = 10 * kSecond;
  axis.to = 20 * kSecond;
  axis.left = 100;
  axis.width = 500;
  EXPECT_DOUBLE_EQ(axis.X(10 * kSecond), 100);
  EXPECT_DOUBLE_EQ(axis.X(15 * kSecond), 350);
  EXPECT_DOUBLE_EQ(axis.X(20 * kSecond), 600);
  EXPECT_DOUBLE_EQ(axis.X(0), 100);
  EXPECT_DOUBLE_EQ(axis.X(99 * kSecond), 600);
  TimeAxis empty;  // from == to: everything at the left edge
  empty.left = 7;
  empty.width = 50;
  EXPECT_DOUBLE_EQ(empty.X(123), 7);
}

TimeAxis TenSeconds() {
  TimeAxis axis;
  axis.origin = 2 * kSecond;
  axis.from = kSecond;
  axis.to = 11 * kSecond;
  axis.left = 130;
  axis.width = 820;
  return axis;
}

TEST(SvgTest, TimelineDrawsLanesBandsTicksMarksAndTheAxis) {
  Timeline t(TenSeconds());
  const size_t fault = t.AddLane("fault <active>");
  const size_t checkpoints = t.AddLane("checkpoints");
  EXPECT_EQ(fault, 0u);
  EXPECT_EQ(checkpoints, 1u);
  t.AddBand(fault, 2 * kSecond, 4 * kSecond, "band-fault", "fault active 2.000 s");
  t.AddTick(checkpoints, 6 * kSecond, "ckpt", "step 60 committed");
  t.AddTick(checkpoints, 30 * kSecond, "ckpt", "step 90 committed");  // past the axis
  t.AddTick(checkpoints, 0, "ckpt", "step 0 committed");              // unknown
  t.AddMark({2 * kSecond, "injected", "fault", "SIGKILL & more"});
  t.AddMark({kSecond, "ordered", "ordered", ""});
  const std::string s = t.Render("Timeline of <it>");

  EXPECT_TRUE(absl::StartsWith(s, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"timeline\" width=\"970\""));
  EXPECT_TRUE(absl::EndsWith(s, "</svg>\n"));
  EXPECT_THAT(s, HasSubstr("<title>Timeline of &lt;it&gt;</title>\n"));
  EXPECT_THAT(s, HasSubstr(">fault &lt;active&gt;</text>"));
  EXPECT_THAT(s, HasSubstr("<rect class=\"band-fault\" x=\"212.0\""));
  EXPECT_THAT(s, HasSubstr("<title>step 60 committed</title>"));
  EXPECT_THAT(s, Not(HasSubstr("step 90")));
  EXPECT_THAT(s, Not(HasSubstr("step 0 ")));
  // Marks are titled with their offset from the origin.
  EXPECT_THAT(s, HasSubstr("<g class=\"mark fault\"><title>injected at 0: SIGKILL &amp; more</title>"));
  EXPECT_THAT(s, HasSubstr("<g class=\"mark ordered\"><title>ordered at -1.0 s</title>"));
  // The axis: ticks a second apart from -1 s to +9 s.
  EXPECT_THAT(s, HasSubstr(">-1.0 s</text>"));
  EXPECT_THAT(s, HasSubstr(">+9.0 s</text>"));
  EXPECT_THAT(s, Not(HasSubstr(">+10.0 s</text>")));
}

TEST(SvgTest, TimelineLabelsTakeRowsAndEndAtTheRightEdge) {
  Timeline t(TenSeconds());
  t.AddLane("lane");
  // Two labels at the same instant overlap: the second takes a second row.
  t.AddMark({3 * kSecond, "first", "a", ""});
  t.AddMark({3 * kSecond, "second", "b", ""});
  // One at the right edge ends at its mark.
  t.AddMark({11 * kSecond, "the last one", "c", ""});
  const std::string s = t.Render("rows");
  EXPECT_THAT(s, HasSubstr("y=\"18.0\">first</text>"));
  EXPECT_THAT(s, HasSubstr("y=\"34.0\">second</text>"));
  EXPECT_THAT(s, HasSubstr("x=\"947.0\" y=\"18.0\" text-anchor=\"end\">the last one</text>"));
  // Two rows of labels, then the lane: its grid line and the axis below it.
  EXPECT_THAT(s, HasSubstr("<line class=\"grid\" x1=\"130.0\" y1=\"76.0\" x2=\"950.0\" y2=\"76.0\"/>"));
  EXPECT_THAT(s, HasSubstr("<line class=\"axis\" x1=\"130.0\" y1=\"86.0\" x2=\"950.0\" y2=\"86.0\"/>"));
}

}  // namespace
}  // namespace ckptd::cli::svg
