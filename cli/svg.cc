#include "cli/svg.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/command.h"

namespace ckptd::cli::svg {

std::string Begin(double width, double height, absl::string_view css_class, absl::string_view attributes) {
  return absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\"%s width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\"%s>\n",
      css_class.empty() ? "" : absl::StrCat(" class=\"", css_class, "\""), width, height, width, height, attributes);
}

std::string Title(absl::string_view text) { return absl::StrCat("<title>", XmlEscape(text), "</title>\n"); }

std::string LineAt(double x1, double y1, double x2, double y2) {
  return absl::StrFormat(" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"", x1, y1, x2, y2);
}

double TextWidth(absl::string_view text) { return 6.6 * static_cast<double>(DisplayWidth(text)); }

// ------------------------------------------------------------- timelines

double TimeAxis::X(int64_t nanos) const {
  const double span = std::max(1.0, static_cast<double>(to - from));
  return left + width * static_cast<double>(std::clamp(nanos, from, to) - from) / span;
}

std::string OffsetLabel(double s) {
  if (std::fabs(s) < 1e-9) return "0";
  if (std::fabs(s) >= 120) return absl::StrFormat("%+.0f min", s / 60);
  return std::fabs(s) < 1 ? absl::StrFormat("%+.2f s", s) : absl::StrFormat("%+.1f s", s);
}

double TickStep(double seconds) {
  const double rough = std::max(seconds, 1e-3) / 10;
  const double decade = std::pow(10.0, std::floor(std::log10(rough)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * decade >= rough) return m * decade;
  }
  return 10 * decade;
}

size_t Timeline::AddLane(std::string name) {
  lanes_.push_back(std::move(name));
  return lanes_.size() - 1;
}

void Timeline::AddBand(size_t lane, int64_t from, int64_t to, std::string css_class, std::string title) {
  bands_.push_back({lane, from, to, std::move(css_class), std::move(title)});
}

void Timeline::AddTick(size_t lane, int64_t nanos, std::string css_class, std::string title) {
  ticks_.push_back({lane, nanos, nanos, std::move(css_class), std::move(title)});
}

void Timeline::AddMark(Mark mark) { marks_.push_back(std::move(mark)); }

std::string Timeline::Render(absl::string_view title) const {
  const TimeAxis& axis = axis_;
  std::vector<Mark> marks = marks_;
  std::sort(marks.begin(), marks.end(), [](const Mark& a, const Mark& b) { return a.nanos < b.nanos; });

  // Labels in rows, each placed in the first row where it does not overlap.
  // A label that would run off the right edge ends at its mark instead.
  constexpr double kRowHeight = 16, kLaneHeight = 24;
  std::vector<double> row_end;
  std::vector<int> row_of(marks.size(), 0);
  std::vector<bool> flipped(marks.size(), false);
  for (size_t i = 0; i < marks.size(); ++i) {
    const double x = axis.X(marks[i].nanos);
    const double w = TextWidth(marks[i].label) + 8;
    flipped[i] = x + w > axis.left + axis.width + 20;
    const double begin = flipped[i] ? x - w : x, end = flipped[i] ? x : x + w;
    size_t r = 0;
    while (r < row_end.size() && row_end[r] > begin) ++r;
    if (r == row_end.size()) row_end.push_back(0);
    row_end[r] = end;
    row_of[i] = static_cast<int>(r);
  }
  const double label_top = 18;
  const double lanes_top = label_top + kRowHeight * static_cast<double>(std::max<size_t>(row_end.size(), 1)) + 8;
  auto lane_y = [&](size_t lane) { return lanes_top + kLaneHeight * static_cast<double>(lane); };
  const double axis_y = lane_y(lanes_.size()) + 4;
  const double height = axis_y + 30;

  std::string s = Begin(axis.left + axis.width + 20, height, "timeline", " role=\"img\"");
  s += Title(title);
  for (size_t lane = 0; lane < lanes_.size(); ++lane) {
    const double y = lane_y(lane);
    absl::StrAppendFormat(&s, "<text class=\"lane\" x=\"%.0f\" y=\"%.0f\">%s</text>\n", axis.left - 10, y + 13,
                          XmlEscape(lanes_[lane]));
    absl::StrAppend(&s, "<line class=\"grid\"", LineAt(axis.left, y + 18, axis.left + axis.width, y + 18), "/>\n");
  }
  for (const Span& b : bands_) {
    const double x0 = axis.X(b.from), x1 = std::max(axis.X(b.to), x0 + 2);
    absl::StrAppendFormat(&s,
                          "<rect class=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"16\"><title>%s</title>"
                          "</rect>\n",
                          b.css_class, x0, lane_y(b.lane) + 1, x1 - x0, XmlEscape(b.title));
  }
  for (const Span& t : ticks_) {
    if (t.from <= 0 || t.from < axis.from || t.from > axis.to) continue;
    const double x = axis.X(t.from), y = lane_y(t.lane);
    absl::StrAppend(&s, "<line class=\"", t.css_class, "\"", LineAt(x, y + 2, x, y + 17), "><title>",
                    XmlEscape(t.title), "</title></line>\n");
  }
  // Marks: a line down to the axis and the label in its row.
  for (size_t i = 0; i < marks.size(); ++i) {
    const Mark& m = marks[i];
    if (m.nanos <= 0) continue;
    const double x = axis.X(m.nanos);
    const double y = label_top + kRowHeight * row_of[i];
    absl::StrAppend(&s, "<g class=\"mark ", m.css_class, "\"><title>",
                    XmlEscape(absl::StrCat(m.label, " at ", OffsetLabel(SecondsBetween(axis.origin, m.nanos)),
                                           m.title.empty() ? "" : ": ", m.title)),
                    "</title>");
    absl::StrAppend(&s, "<line", LineAt(x, y + 3, x, axis_y), "/>");
    absl::StrAppendFormat(&s, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\"/>", x, axis_y);
    absl::StrAppendFormat(&s, "<text x=\"%.1f\" y=\"%.1f\"%s>%s</text></g>\n", flipped[i] ? x - 3 : x + 3, y,
                          flipped[i] ? " text-anchor=\"end\"" : "", XmlEscape(m.label));
  }
  // The axis, in seconds from its origin.
  absl::StrAppend(&s, "<line class=\"axis\"", LineAt(axis.left, axis_y, axis.left + axis.width, axis_y), "/>\n");
  const double lo = SecondsBetween(axis.origin, axis.from), hi = SecondsBetween(axis.origin, axis.to);
  const double step = TickStep(hi - lo);
  for (double t = std::ceil(lo / step) * step; t <= hi; t += step) {
    const double x = axis.X(axis.origin + static_cast<int64_t>(t * 1e9));
    absl::StrAppend(&s, "<line class=\"tick\"", LineAt(x, axis_y, x, axis_y + 5), "/>");
    absl::StrAppendFormat(&s, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\">%s</text>\n", x, axis_y + 18, OffsetLabel(t));
  }
  s += kEnd;
  return s;
}

}  // namespace ckptd::cli::svg
