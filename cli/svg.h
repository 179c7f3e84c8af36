// Small builders for the SVG figures of ckptctl's reports: the drill
// timelines (cli/drill_report.h) and the interval waste curve
// (cli/interval_commands.h). Text in them goes through XmlEscape
// (cli/command.h). Internal to ckptd::cli.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ckptd::cli::svg {

// The opening tag of a standalone figure of `width` × `height` px (its
// viewBox the same), then a newline. `css_class` may be empty; `attributes`
// (each with a leading space) go after the viewBox.
std::string Begin(double width, double height, absl::string_view css_class, absl::string_view attributes);
inline constexpr char kEnd[] = "</svg>\n";
// <title>`text`</title>, escaped, then a newline.
std::string Title(absl::string_view text);
// A line's end points to 0.1 px, each attribute with a leading space:
// ` x1="…" y1="…" x2="…" y2="…"`.
std::string LineAt(double x1, double y1, double x2, double y2);
// The estimated width in px of `text` at the 11 to 12 px sans-serif of the
// figures (nothing measures it): 6.6 px a character, UTF-8 counted in code
// points.
double TextWidth(absl::string_view text);

// ------------------------------------------------------------- timelines

// Unix nanoseconds mapped onto [left, left + width] px; labels say seconds
// from `origin`.
struct TimeAxis {
  int64_t origin = 0;
  int64_t from = 0, to = 0;  // the span shown
  double left = 0, width = 0;
  // The x of `nanos`, clamped to the span.
  double X(int64_t nanos) const;
};

// "0", "+0.25 s", "-1.5 s", "+3 min": seconds from an axis's origin.
std::string OffsetLabel(double seconds);
// A round tick spacing (1, 2 or 5 × 10^k seconds) giving at most ten ticks
// over `seconds`.
double TickStep(double seconds);

// An instant on a timeline, drawn as a dashed line down to the axis with
// `label` above; `title` (shown on hover) may be empty.
struct Mark {
  int64_t nanos;
  std::string label;
  std::string css_class;
  std::string title;
};

// A horizontal timeline: marks with their labels in rows at the top, each in
// the first row where it overlaps none; named lanes below them holding bands
// (spans) and ticks (instants); and the axis in seconds from its origin. The
// page styles it through the classes timeline, lane, grid, mark, axis and
// tick, and the classes given here.
class Timeline {
 public:
  explicit Timeline(const TimeAxis& axis) : axis_(axis) {}

  // Returns the lane's index, from the top.
  size_t AddLane(std::string name);
  void AddBand(size_t lane, int64_t from, int64_t to, std::string css_class, std::string title);
  // A tick outside the axis' span, or at 0 (unknown), is not drawn.
  void AddTick(size_t lane, int64_t nanos, std::string css_class, std::string title);
  // A mark at 0 (unknown) takes a label row but is not drawn.
  void AddMark(Mark mark);

  // The figure: an <svg> element, `title` its accessible name.
  std::string Render(absl::string_view title) const;

 private:
  struct Span {
    size_t lane;
    int64_t from, to;
    std::string css_class;
    std::string title;
  };
  TimeAxis axis_;
  std::vector<std::string> lanes_;
  std::vector<Span> bands_;
  std::vector<Span> ticks_;
  std::vector<Mark> marks_;
};

}  // namespace ckptd::cli::svg
