#include "cli/interval_commands.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/flags.h"
#include "base/json.h"
#include "cli/command.h"
#include "cli/figures.h"
#include "cli/svg.h"

namespace ckptd::cli {

const char kIntervalHelp[] =
    "usage: ckptctl interval --mtbf-hours M --cost-seconds D [options]\n"
    "\n"
    "Explains the checkpoint interval the policy picks for the given failure and\n"
    "cost figures, and the waste it expects, against the interval you would\n"
    "otherwise use. Offline: nothing is contacted.\n"
    "\n"
    "  --mtbf-hours M           job mean time between failures M, hours (> 0); for G\n"
    "                           GPUs failing at λ per GPU-hour, M = 1/(G·λ)\n"
    "  --cost-seconds D         checkpoint cost δ, seconds (> 0): the blocking stall\n"
    "                           plus the slowdown of the steps that run while the\n"
    "                           persist is in flight\n"
    "  --restart-seconds R      cost of one restart R, seconds (default 0): detection,\n"
    "                           rescheduling, restore and warm-up\n"
    "  --persist-seconds P      time to persist one checkpoint P, seconds (default 0);\n"
    "                           the interval is never shorter\n"
    "  --step-seconds S         time of one training step without a persist in\n"
    "                           flight, seconds (default unknown: no steps shown)\n"
    "  --min-seconds A          operator bounds on the interval, seconds\n"
    "  --max-seconds B          (default none)\n"
    "  --alternative-seconds T  the interval you would otherwise use, for comparison\n"
    "                           (default 1800)\n"
    "  --json                   one JSON object instead of the table: seconds, waste\n"
    "                           as fractions, unset values null\n"
    "  --svg FILE               also write the expected-waste curve W(τ) as an SVG\n"
    "\n"
    "Two cadences: memory checkpoints every τ (kept in the agents' memory and\n"
    "replicated to partners) and every k-th of them durable, from the failures\n"
    "by class (a trainer process lost: its agent's memory has the step; one node\n"
    "lost: a partner's memory has it; several nodes: only disk has it):\n"
    "  --memory-cost-seconds DM the cost of a memory checkpoint δm, seconds (> 0, at\n"
    "                           most --cost-seconds, the durable one's cost): adds\n"
    "                           the two cadences to the report\n"
    "  --failure-mix P,N,W      the failures' split into process, node and wide\n"
    "                           (fractions, each > 0, normalised; default\n"
    "                           0.75,0.2,0.05)\n"
    "  --no-peer-copies         no replication partners: node failures need disk\n"
    "  --memory-restart-seconds R1  restart cost from memory (default --restart-seconds)\n"
    "  --replicate-seconds Q    time to replicate one snapshot: τ is never shorter\n"
    "\n"
    "usage: ckptctl interval --job J --coordinator HOST:PORT [--json] [--svg FILE]\n"
    "\n"
    "Live mode: the coordinator's current decision for job J and every input behind\n"
    "it (failures seen over GPU-hours observed and the prior, λ with its credible\n"
    "interval, M, δ as stall plus slowdown, P, R measured or assumed, the step\n"
    "time, τ in seconds and steps, the expected waste), and the schedule in force\n"
    "(the policy changes it only past its hysteresis); then the two cadences from\n"
    "the failures seen by class, with δm the stall and δd the persist's slowdown.\n"
    "Before the first measured checkpoint it says what it is waiting for.\n"
    "\n"
    "  --job J                  the job\n"
    "  --coordinator HOST:PORT  the coordinator to ask\n"
    "  --tls-ca F --tls-cert F --tls-key F\n"
    "                           mutual TLS (PEM files), as the coordinator was started with\n"
    "\n"
    "The model (docs/interval.md):\n"
    "  τ        compute time between checkpoints; a period lasts τ + δ\n"
    "  Daly     τ = sqrt(2δM)·[1 + (1/3)·sqrt(δ/2M) + (1/9)·(δ/2M)] − δ when δ < 2M,\n"
    "           else τ = M (J. T. Daly, FGCS 2006)\n"
    "  rules    Daly's τ, then the operator bounds, then never under P (P wins over\n"
    "           a maximum below it: a shorter interval cannot be kept)\n"
    "  steps    round(τ / step time), at least 1, rounded up where it would fall\n"
    "           under P\n"
    "  waste    W(τ) = δ/τ + (τ/2 + R)/M: the first-order fraction of wall time lost\n"
    "           to checkpoints, rework after a failure, and restarts; not clamped\n"
    "           (near or above 100 % the first-order model no longer holds)\n"
    "  two      λ1: failures memory recovers from, λ2: those that need disk;\n"
    "  levels   W(τ, k) = (δm + δd/k)/τ + λ1·(τ/2 + R1) + λ2·(kτ/2 + R2) with\n"
    "           δd = δ − δm; k = the integer next to √(δd·λ1 / (δm·λ2)), τ = Daly's\n"
    "           for δm + δd/k and MTBF 1/(λ1 + kλ2); τ ≥ Q and the minimum, k·τ at\n"
    "           most the maximum and at least P\n"
    "\n"
    "exit status: 0 success, 1 the SVG could not be written (or live: no such job,\n"
    "or no decision yet to draw), 2 usage error, 3 the coordinator cannot be reached\n";

namespace {

// The smallest round number (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k) that is ≥ v
// (v > 0): the top of the waste axis, in five ticks.
double NiceCeil(double v) {
  const double base = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0}) {
    if (m * base >= v * (1 - 1e-12)) return m * base;
  }
  return 10 * base;
}

// Where a class's failures come back from.
std::string ClassSource(const TwoLevelReport::Class& c) {
  if (!c.from_memory) return c.name == "node" ? "disk (no replication partners)" : "disk";
  return c.name == "node" ? "a partner's memory" : "the agent's memory";
}

void PrintTwoLevel(const IntervalReport& r, std::ostream& out) {
  const TwoLevelReport& t = *r.two_level;
  const policy::TwoLevelInputs& in = t.inputs;
  out << "\ntwo cadences (memory checkpoints every τ, every k-th durable)\n";
  double total = 0;
  for (const TwoLevelReport::Class& c : t.classes) total += c.rate_per_s;
  for (const TwoLevelReport::Class& c : t.classes) {
    std::string v = absl::StrFormat("%.1f %% of failures, MTBF %s, from %s", 100 * c.rate_per_s / total,
                                    FormatSeconds(1 / c.rate_per_s, DurationStyle::kFigure), ClassSource(c));
    if (c.failures) absl::StrAppend(&v, "; ", *c.failures, " seen");
    FigureLine(out, absl::StrCat(c.name, " failures"), v);
  }
  FigureLine(out, "memory checkpoint cost δm",
             absl::StrCat(FormatSeconds(in.memory_cost_s, DurationStyle::kFigure), r.live ? " (the stall)" : ""));
  FigureLine(out, "durable extra cost δd",
             absl::StrCat(FormatSeconds(in.durable_cost_s, DurationStyle::kFigure),
                          r.live ? " (the persist's slowdown)" : ""));
  if (in.replicate_s > 0) FigureLine(out, "replication time Q", FormatSeconds(in.replicate_s, DurationStyle::kFigure));
  if (!t.decision) {
    FigureLine(out, "decision", absl::StrCat("none: ", t.error));
    return;
  }
  const policy::TwoLevelDecision& d = *t.decision;
  FigureLine(out, "k* = √(δd·λ1 / δm·λ2)",
             std::isinf(d.durable_every_optimum) ? "unbounded: no failure needs disk"
                                                 : absl::StrFormat("%.3g", d.durable_every_optimum));
  std::string memory = FormatSeconds(d.memory_interval_s, DurationStyle::kFigure);
  if (d.memory_steps > 0) absl::StrAppend(&memory, ", every ", d.memory_steps, " steps");
  FigureLine(out, "memory interval τ", memory);
  std::string durable = absl::StrCat("every ", d.durable_every, d.durable_every == 1 ? " checkpoint" : " checkpoints",
                                     ": ", FormatSeconds(d.durable_interval_s, DurationStyle::kFigure));
  if (d.durable_steps > 0) absl::StrAppend(&durable, ", every ", d.durable_steps, " steps");
  FigureLine(out, "durable interval k·τ", durable);
  FigureLine(out, "reason", d.reason);
  FigureLine(out, "expected waste W(τ, k)", Percent(d.expected_waste));
  FigureLine(out, "every checkpoint durable",
             absl::StrFormat("τ %s: %s (%+.2f points)", FormatSeconds(d.single_interval_s, DurationStyle::kFigure),
                             Percent(d.single_waste), 100 * (d.single_waste - d.expected_waste)));
}

void TwoLevelJson(const TwoLevelReport& t, JsonWriter& w) {
  const policy::TwoLevelInputs& in = t.inputs;
  w.Key("two_level");
  w.BeginObject();
  w.Key("classes");
  w.BeginArray();
  for (const TwoLevelReport::Class& c : t.classes) {
    w.BeginObject();
    w.Field("name", c.name);
    w.Field("rate_per_second", c.rate_per_s);
    w.Field("mtbf_seconds", 1 / c.rate_per_s);
    if (c.failures) w.Field("failures", *c.failures);
    w.Field("from_memory", c.from_memory);
    w.EndObject();
  }
  w.EndArray();
  w.Field("peer_copies", t.peer_copies);
  w.Field("memory_rate_per_second", in.memory_rate_per_s);
  w.Field("durable_rate_per_second", in.durable_rate_per_s);
  w.Field("memory_cost_seconds", in.memory_cost_s);
  w.Field("durable_cost_seconds", in.durable_cost_s);
  w.Field("replicate_seconds", in.replicate_s);
  w.Field("memory_restart_seconds", in.memory_restart_s);
  w.Field("durable_restart_seconds", in.durable_restart_s);
  if (!t.decision) {
    w.Field("error", t.error);
    w.EndObject();
    return;
  }
  const policy::TwoLevelDecision& d = *t.decision;
  NullablePositive(w, "k_optimum", d.durable_every_optimum);
  w.Field("durable_every", d.durable_every);
  w.Field("daly_seconds", d.daly_s);
  w.Field("memory_interval_seconds", d.memory_interval_s);
  NullableUint(w, "memory_interval_steps", d.memory_steps > 0, d.memory_steps);
  w.Field("durable_interval_seconds", d.durable_interval_s);
  NullableUint(w, "durable_interval_steps", d.durable_steps > 0, d.durable_steps);
  w.Field("expected_waste", d.expected_waste);
  w.Field("single_interval_seconds", d.single_interval_s);
  w.Field("single_waste", d.single_waste);
  w.Field("reason", d.reason);
  w.EndObject();
}

}  // namespace

TwoLevelReport DecideTwoLevelReport(std::vector<TwoLevelReport::Class> classes, bool peer_copies,
                                    const policy::TwoLevelInputs& inputs) {
  TwoLevelReport t;
  t.classes = std::move(classes);
  t.peer_copies = peer_copies;
  t.inputs = inputs;
  absl::StatusOr<policy::TwoLevelDecision> d = policy::DecideTwoLevel(inputs);
  if (d.ok()) {
    t.decision = *std::move(d);
  } else {
    t.error = std::string(d.status().message());
  }
  return t;
}

// ------------------------------------------------------------- interval

void PrintIntervalTable(const IntervalReport& r, std::ostream& out) {
  const policy::IntervalInputs& in = r.inputs;
  const policy::IntervalDecision& d = r.decision;
  if (r.job.empty()) {
    out << "checkpoint interval (offline, from the figures given)\n";
  } else {
    out << "checkpoint interval for job " << TerminalSafe(r.job) << "\n";
  }
  out << "\ninputs\n";
  if (r.gpus > 0) FigureLine(out, "GPUs G", absl::StrCat(r.gpus));
  if (r.rate) {
    const policy::FailureRateEstimate& e = *r.rate;
    FigureLine(
        out, "failure rate λ",
        absl::StrFormat("%.3g per GPU-hour (%g%% credible %.3g .. %.3g)", e.mean, 100 * e.credible, e.lower, e.upper));
    FigureLine(out, "observed", absl::StrFormat("%.0f failures over %.4g GPU-hours", e.failures, e.exposure_gpu_hours));
    if (r.gpus > 0) {
      // A higher rate means a shorter MTBF: the bounds swap.
      FigureLine(out, "MTBF range",
                 absl::StrCat(FormatSeconds(policy::JobMtbfSeconds(e.upper, r.gpus), DurationStyle::kFigure), " .. ",
                              FormatSeconds(policy::JobMtbfSeconds(e.lower, r.gpus), DurationStyle::kFigure)));
    }
  }
  FigureLine(out, "MTBF M", FormatSeconds(in.mtbf_s, DurationStyle::kFigure));
  FigureLine(out, "checkpoint cost δ", FormatSeconds(in.delta_s, DurationStyle::kFigure));
  if (r.live) {
    FigureLine(out, "  stall",
               absl::StrCat(FormatSeconds(r.live->stall_seconds(), DurationStyle::kFigure), ", median of ",
                            r.live->checkpoints_measured(), " checkpoints (slowest rank)"));
    FigureLine(out, "  slowdown",
               r.live->step_seconds_persisting() > 0
                   ? absl::StrFormat("%s (steps %s while persisting)",
                                     FormatSeconds(r.live->slowdown_seconds(), DurationStyle::kFigure),
                                     FormatSeconds(r.live->step_seconds_persisting(), DurationStyle::kFigure))
                   : "none measured");
  }
  FigureLine(out, "persist time P",
             in.persist_s > 0 ? FormatSeconds(in.persist_s, DurationStyle::kFigure) : "0 (no floor)");
  FigureLine(out, "restart cost R",
             r.live ? absl::StrCat(FormatSeconds(in.restart_s, DurationStyle::kFigure),
                                   r.live->restart_assumed()
                                       ? " (assumed: no restart measured yet)"
                                       : absl::StrCat(", median of ", r.live->restarts_measured(), " restarts"))
                    : FormatSeconds(in.restart_s, DurationStyle::kFigure));
  FigureLine(out, "step time",
             in.step_s > 0 ? FormatSeconds(in.step_s, DurationStyle::kFigure) : "unknown (no step conversion)");
  std::string bounds = "none";
  if (in.min_interval_s > 0 || in.max_interval_s > 0) {
    bounds =
        absl::StrCat(in.min_interval_s > 0 ? FormatSeconds(in.min_interval_s, DurationStyle::kFigure) : "-", " .. ",
                     in.max_interval_s > 0 ? FormatSeconds(in.max_interval_s, DurationStyle::kFigure) : "-");
  }
  FigureLine(out, "operator bounds", bounds);
  FigureLine(out, "alternative interval", FormatSeconds(in.alternative_s, DurationStyle::kFigure));

  out << "\ndecision\n";
  FigureLine(out, "Daly optimum τ", FormatSeconds(d.daly_s, DurationStyle::kFigure));
  std::string chosen = FormatSeconds(d.interval_s, DurationStyle::kFigure);
  if (d.interval_steps > 0) absl::StrAppend(&chosen, ", every ", d.interval_steps, " steps");
  FigureLine(out, "chosen interval τ", chosen);
  FigureLine(out, "reason", d.reason);
  FigureLine(out, "expected waste W(τ)", Percent(d.expected_waste));
  FigureLine(out, "waste at alternative",
             absl::StrFormat("%s (%+.2f points)", Percent(d.alternative_waste),
                             100 * (d.alternative_waste - d.expected_waste)));
  if (r.live) {
    const uint64_t k = std::max<uint64_t>(1, r.live->durable_every());
    std::string force = absl::StrCat("every ", r.live->every_steps(), " steps");
    if (k > 1) absl::StrAppend(&force, ", 1 in ", k, " durable");
    // The policy's choice: the two cadences' wherever it made one.
    const bool two = r.two_level && r.two_level->decision && r.two_level->decision->memory_steps > 0;
    const bool differs = two ? (r.live->every_steps() != r.two_level->decision->memory_steps ||
                                k != r.two_level->decision->durable_every)
                             : r.live->every_steps() != d.interval_steps;
    if (!r.live->automatic()) {
      absl::StrAppend(&force, " (fixed with --every: the policy only advises)");
    } else if (differs) {
      absl::StrAppend(&force, " (kept: the change is inside the hysteresis)");
    }
    FigureLine(out, "schedule in force", force);
  }
  if (r.two_level) PrintTwoLevel(r, out);
}

std::string IntervalJson(const IntervalReport& r) {
  const policy::IntervalInputs& in = r.inputs;
  const policy::IntervalDecision& d = r.decision;
  JsonWriter w;
  w.BeginObject();
  w.Field("mode", r.job.empty() ? "offline" : "live");
  if (!r.job.empty()) w.Field("job", r.job);
  if (r.gpus > 0) w.Field("gpus", r.gpus);
  if (r.rate) {
    w.Key("failure_rate");
    w.BeginObject();
    w.Field("mean_per_gpu_hour", r.rate->mean);
    w.Field("lower_per_gpu_hour", r.rate->lower);
    w.Field("upper_per_gpu_hour", r.rate->upper);
    w.Field("credible", r.rate->credible);
    w.Field("failures", r.rate->failures);
    w.Field("exposure_gpu_hours", r.rate->exposure_gpu_hours);
    w.EndObject();
  }
  w.Field("mtbf_seconds", in.mtbf_s);
  w.Field("mtbf_hours", in.mtbf_s / base::kHour);
  w.Field("cost_seconds", in.delta_s);
  w.Field("persist_seconds", in.persist_s);
  w.Field("restart_seconds", in.restart_s);
  NullablePositive(w, "step_seconds", in.step_s);
  NullablePositive(w, "min_seconds", in.min_interval_s);
  NullablePositive(w, "max_seconds", in.max_interval_s);
  w.Field("alternative_seconds", in.alternative_s);
  w.Field("daly_seconds", d.daly_s);
  w.Field("interval_seconds", d.interval_s);
  w.Field("interval_minutes", d.interval_s / base::kMinute);
  NullableUint(w, "interval_steps", d.interval_steps > 0, d.interval_steps);
  w.Field("expected_waste", d.expected_waste);
  w.Field("alternative_waste", d.alternative_waste);
  w.Field("reason", d.reason);
  if (r.live) {
    w.Field("automatic", r.live->automatic());
    w.Field("decided", r.live->decided());
    w.Field("every_steps", r.live->every_steps());
    w.Field("durable_every", std::max<uint64_t>(1, r.live->durable_every()));
    w.Field("stall_seconds", r.live->stall_seconds());
    w.Field("slowdown_seconds", r.live->slowdown_seconds());
    w.Field("step_seconds_persisting", r.live->step_seconds_persisting());
    w.Field("restart_assumed", r.live->restart_assumed());
    w.Field("checkpoints_measured", r.live->checkpoints_measured());
    w.Field("restarts_measured", r.live->restarts_measured());
    w.Field("prior_per_gpu_hour", r.live->prior_per_gpu_hour());
    w.Field("prior_shape", r.live->prior_shape());
  }
  if (r.two_level) TwoLevelJson(*r.two_level, w);
  w.EndObject();
  return w.str();
}

std::string WasteCurveSvg(const IntervalReport& r) {
  const policy::IntervalInputs& in = r.inputs;
  const policy::IntervalDecision& d = r.decision;
  auto waste = [&](double tau) { return policy::ExpectedWaste(tau, in.delta_s, in.restart_s, in.mtbf_s); };

  // Geometry: the plot area is [x0, x1] × [y0, y1] (y grows downwards).
  constexpr double kWidth = 760, kHeight = 440;
  constexpr double x0 = 80, x1 = 730, y0 = 60, y1 = 370;
  // τ from a quarter of the smallest marked interval to four times the largest.
  const double t_lo = std::min({d.interval_s, d.daly_s, in.alternative_s}) / 4;
  const double t_hi = std::max({d.interval_s, d.daly_s, in.alternative_s}) * 4;
  const double log_lo = std::log(t_lo), log_span = std::log(t_hi) - std::log(t_lo);
  const double y_max = NiceCeil(1.5 * std::max({d.expected_waste, d.alternative_waste, 1e-6}));
  auto X = [&](double tau) { return x0 + (std::log(tau) - log_lo) / log_span * (x1 - x0); };
  auto Y = [&](double w) { return y1 - std::min(w, y_max) / y_max * (y1 - y0); };

  std::string s = svg::Begin(kWidth, kHeight, "", " font-family=\"sans-serif\" font-size=\"12\"");
  s += svg::Title(absl::StrCat("Expected waste W(τ)", r.job.empty() ? "" : " for job ", r.job));
  absl::StrAppend(&s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  absl::StrAppendFormat(&s,
                        "<text x=\"%.0f\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">Expected waste "
                        "W(τ) = δ/τ + (τ/2 + R)/M%s</text>\n",
                        kWidth / 2, r.job.empty() ? "" : XmlEscape(absl::StrCat(" — job ", r.job)));
  absl::StrAppendFormat(
      &s, "<text x=\"%.0f\" y=\"42\" text-anchor=\"middle\" fill=\"#555\">%s</text>\n", kWidth / 2,
      XmlEscape(absl::StrCat("M ", FormatSeconds(in.mtbf_s, DurationStyle::kLabel), ", δ ",
                             FormatSeconds(in.delta_s, DurationStyle::kLabel), ", R ",
                             FormatSeconds(in.restart_s, DurationStyle::kLabel),
                             in.persist_s > 0 ? absl::StrCat(", P ", FormatSeconds(in.persist_s, DurationStyle::kLabel))
                                              : std::string())));
  absl::StrAppendFormat(&s,
                        "<defs><clipPath id=\"plot\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                        "height=\"%.1f\"/></clipPath></defs>\n",
                        x0, y0, x1 - x0, y1 - y0);

  // Intervals under P cannot be kept: shaded.
  if (in.persist_s > t_lo) {
    const double xp = X(std::min(in.persist_s, t_hi));
    absl::StrAppendFormat(&s,
                          "<g id=\"persist-floor\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                          "fill=\"#eee\"/><text x=\"%.1f\" y=\"%.1f\" fill=\"#777\">τ &lt; P</text></g>\n",
                          x0, y0, xp - x0, y1 - y0, x0 + 6, y1 - 8);
  }

  // X ticks: round durations inside the range, thinned to at most 9.
  static constexpr double kNiceTicks[] = {
      1,     2,     5,     10,    20,    30,     60,     120,    300,     600,     900,     1200,    1800,
      3600,  7200,  10800, 21600, 43200, 86400,  172800, 432000, 864000,  1728000, 4320000, 8640000};
  std::vector<double> ticks;
  for (double t : kNiceTicks) {
    if (t >= t_lo && t <= t_hi) ticks.push_back(t);
  }
  const size_t stride = ticks.size() / 9 + 1;
  for (size_t i = 0; i < ticks.size(); i += stride) {
    const double x = X(ticks[i]);
    absl::StrAppend(&s, "<line", svg::LineAt(x, y0, x, y1), " stroke=\"#ddd\"/>", "<line",
                    svg::LineAt(x, y1, x, y1 + 5), " stroke=\"black\"/>");
    absl::StrAppendFormat(&s, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", x, y1 + 19,
                          FormatSeconds(ticks[i], DurationStyle::kLabel));
  }
  // Y ticks: five steps of y_max.
  for (int i = 0; i <= 5; ++i) {
    const double w = y_max * i / 5;
    const double y = Y(w);
    absl::StrAppend(&s, "<line", svg::LineAt(x0, y, x1, y), " stroke=\"#ddd\"/>", "<line",
                    svg::LineAt(x0 - 5, y, x0, y), " stroke=\"black\"/>");
    absl::StrAppendFormat(&s, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g %%</text>\n", x0 - 8, y + 4, 100 * w);
  }
  // Axes and their labels.
  absl::StrAppend(&s, "<line", svg::LineAt(x0, y1, x1, y1), " stroke=\"black\"/>", "<line", svg::LineAt(x0, y0, x0, y1),
                  " stroke=\"black\"/>\n");
  absl::StrAppendFormat(&s,
                        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">checkpoint interval τ "
                        "(compute time between checkpoints, log scale)</text>\n",
                        (x0 + x1) / 2, y1 + 42);
  absl::StrAppendFormat(&s,
                        "<text transform=\"translate(%.1f %.1f) rotate(-90)\" text-anchor=\"middle\">expected "
                        "waste (%% of wall time)</text>\n",
                        22.0, (y0 + y1) / 2);

  // The curve, clipped to the plot area where it leaves it.
  std::string points;
  constexpr int kPoints = 240;
  for (int i = 0; i <= kPoints; ++i) {
    const double tau = t_lo * std::exp(log_span * i / kPoints);
    const double w = waste(tau);
    if (!std::isfinite(w)) continue;
    // Unclamped y (the clip path cuts it), bounded so coordinates stay sane.
    const double y = y1 - std::min(w, 10 * y_max) / y_max * (y1 - y0);
    absl::StrAppendFormat(&points, "%s%.1f,%.1f", points.empty() ? "" : " ", X(tau), y);
  }
  absl::StrAppendFormat(&s,
                        "<polyline id=\"curve\" clip-path=\"url(#plot)\" fill=\"none\" stroke=\"#1f77b4\" "
                        "stroke-width=\"2\" points=\"%s\"/>\n",
                        points);

  // Markers: a vertical line and a dot on the curve; their labels (one row
  // each) come after all lines, on white boxes, so that no line crosses one.
  std::string labels;
  auto marker = [&](const char* id, const char* colour, const char* dash, const std::string& label, double tau,
                    int row) {
    const double x = X(tau);
    const bool right_half = x > (x0 + x1) / 2;
    absl::StrAppend(&s, "<g id=\"", id, "\"><line", svg::LineAt(x, y0, x, y1), " stroke=\"", colour,
                    "\" stroke-width=\"1.5\"", dash, "/>");
    absl::StrAppendFormat(&s, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" fill=\"%s\"/></g>\n", x, Y(waste(tau)),
                          colour);
    // Label over a white box of its estimated width.
    const double text_x = right_half ? x - 6 : x + 6;
    const double text_y = y0 + 14 + 16 * row;
    const double box_w = svg::TextWidth(label) + 6;
    absl::StrAppendFormat(&labels,
                          "<g id=\"%s-label\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"15\" fill=\"white\" "
                          "fill-opacity=\"0.85\"/><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" fill=\"%s\">%s</text></g>\n",
                          id, right_half ? text_x - box_w + 3 : text_x - 3, text_y - 11.5, box_w, text_x, text_y,
                          right_half ? "end" : "start", colour, XmlEscape(label));
  };
  marker("alternative", "#d62728", " stroke-dasharray=\"5 4\"",
         absl::StrCat("alternative ", FormatSeconds(in.alternative_s, DurationStyle::kLabel), ": ",
                      Percent(d.alternative_waste)),
         in.alternative_s, 1);
  if (std::fabs(d.daly_s - d.interval_s) > 1e-9 * d.interval_s) {
    marker(
        "daly", "#7f7f7f", " stroke-dasharray=\"2 3\"",
        absl::StrCat("Daly optimum ", FormatSeconds(d.daly_s, DurationStyle::kLabel), ": ", Percent(waste(d.daly_s))),
        d.daly_s, 2);
  }
  marker("chosen", "#2ca02c", "",
         absl::StrCat("chosen ", FormatSeconds(d.interval_s, DurationStyle::kLabel), ": ", Percent(d.expected_waste)),
         d.interval_s, 0);
  s += labels;
  s += svg::kEnd;
  return s;
}

namespace {

// The table or JSON, and the SVG when asked for.
int PrintReport(const base::Args& args, const IntervalReport& report, std::ostream& out, std::ostream& err) {
  if (args.Has("json")) {
    out << IntervalJson(report) << "\n";
  } else {
    PrintIntervalTable(report, out);
  }
  if (std::optional<std::string> svg = args.Get("svg")) {
    if (absl::Status s = WriteTextFile(*svg, WasteCurveSvg(report)); !s.ok()) {
      err << "ckptctl interval: --svg: " << s.message() << "\n";
      return base::kExitFailed;
    }
    if (!args.Has("json")) out << "\nwaste curve written to " << *svg << "\n";
  }
  return base::kExitOk;
}

// A live status without a decision: what is known and what is missing.
void PrintUndecided(const ckptd::v1::IntervalStatus& st, const base::Args& args, std::ostream& out) {
  if (args.Has("json")) {
    JsonWriter w;
    w.BeginObject();
    w.Field("mode", "live");
    w.Field("job", st.job());
    w.Field("automatic", st.automatic());
    w.Field("decided", false);
    w.Field("waiting_for", st.waiting_for());
    w.Field("every_steps", st.every_steps());
    w.Field("gpus", st.gpus());
    w.Field("failures", st.failures());
    w.Field("exposure_gpu_hours", st.exposure_gpu_hours());
    w.Field("rate_per_gpu_hour", st.rate_per_gpu_hour());
    w.Field("mtbf_seconds", st.mtbf_seconds());
    w.Field("checkpoints_measured", st.checkpoints_measured());
    w.EndObject();
    out << w.str() << "\n";
    return;
  }
  out << "checkpoint interval for job " << TerminalSafe(st.job()) << "\n\n";
  FigureLine(out, "policy", st.automatic() ? "automatic, not decided yet" : st.reason());
  FigureLine(out, "waiting for", st.waiting_for());
  FigureLine(out, "schedule in force", absl::StrCat("every ", st.every_steps(), " steps"));
  FigureLine(out, "GPUs G", absl::StrCat(st.gpus()));
  FigureLine(out, "failure rate λ",
             absl::StrFormat("%.3g per GPU-hour (%.0f failures over %.4g GPU-hours)", st.rate_per_gpu_hour(),
                             static_cast<double>(st.failures()), st.exposure_gpu_hours()));
  FigureLine(out, "MTBF M", FormatSeconds(st.mtbf_seconds(), DurationStyle::kFigure));
}

int RunLiveInterval(const base::Args& args, const IntervalFetcher& fetch, std::ostream& out, std::ostream& err) {
  const std::string job = *args.Get("job");
  absl::StatusOr<ckptd::v1::IntervalStatus> st = fetch(args, job);
  if (!st.ok()) {
    err << "ckptctl interval: " << TerminalSafe(st.status().message()) << "\n";
    if (absl::IsUnavailable(st.status()) || absl::IsDeadlineExceeded(st.status())) return base::kExitUnavailable;
    return absl::IsInvalidArgument(st.status()) ? base::kExitUsage : base::kExitFailed;
  }
  if (!st->decided()) {
    PrintUndecided(*st, args, out);
    if (args.Has("svg")) {
      err << "ckptctl interval: no curve to draw for job " << TerminalSafe(job) << " yet: waiting for "
          << TerminalSafe(st->waiting_for()) << "\n";
      return base::kExitFailed;
    }
    return base::kExitOk;
  }
  return PrintReport(args, IntervalReportFromStatus(*st), out, err);
}

}  // namespace

IntervalReport IntervalReportFromStatus(const ckptd::v1::IntervalStatus& st) {
  IntervalReport r;
  r.job = st.job();
  r.gpus = static_cast<int>(st.gpus());
  policy::FailureRateEstimate rate;
  rate.mean = st.rate_per_gpu_hour();
  rate.lower = st.rate_lower();
  rate.upper = st.rate_upper();
  rate.credible = st.credible();
  rate.failures = static_cast<double>(st.failures());
  rate.exposure_gpu_hours = st.exposure_gpu_hours();
  r.rate = rate;
  policy::IntervalInputs& in = r.inputs;
  in.mtbf_s = st.mtbf_seconds();
  in.delta_s = st.cost_seconds();
  in.persist_s = st.persist_seconds();
  in.restart_s = st.restart_seconds();
  in.step_s = st.step_seconds();
  in.min_interval_s = st.min_interval_seconds();
  in.max_interval_s = st.max_interval_seconds();
  in.alternative_s = st.alternative_seconds();
  policy::IntervalDecision& d = r.decision;
  d.daly_s = st.daly_seconds();
  d.interval_s = st.interval_seconds();
  d.interval_steps = st.interval_steps();
  d.expected_waste = st.expected_waste();
  d.alternative_waste = st.alternative_waste();
  d.reason = st.reason();
  r.live = st;
  const ckptd::v1::TwoLevelStatus& two = st.two_level();
  if (two.classes_size() == policy::kFailureClasses) {
    std::vector<TwoLevelReport::Class> classes;
    for (const ckptd::v1::FailureClassStatus& c : two.classes()) {
      classes.push_back({c.name(), c.rate_per_gpu_hour() * st.gpus() / base::kHour, c.failures(), c.from_memory()});
    }
    TwoLevelReport t;
    t.classes = std::move(classes);
    t.peer_copies = two.peer_copies();
    policy::TwoLevelInputs& ti = t.inputs;
    ti.memory_rate_per_s = two.memory_rate_per_s();
    ti.durable_rate_per_s = two.durable_rate_per_s();
    ti.memory_cost_s = two.memory_cost_seconds();
    ti.durable_cost_s = two.durable_cost_seconds();
    ti.persist_s = st.persist_seconds();
    ti.replicate_s = two.replicate_seconds();
    ti.memory_restart_s = two.memory_restart_seconds();
    ti.durable_restart_s = two.durable_restart_seconds();
    ti.step_s = st.step_seconds();
    ti.min_interval_s = st.min_interval_seconds();
    ti.max_interval_s = st.max_interval_seconds();
    if (two.durable_every() > 0) {
      policy::TwoLevelDecision td;
      td.durable_every_optimum = two.durable_every_optimum();
      td.durable_every = two.durable_every();
      td.daly_s = two.daly_seconds();
      td.memory_interval_s = two.memory_interval_seconds();
      td.memory_steps = two.memory_interval_steps();
      td.durable_interval_s = two.durable_interval_seconds();
      td.durable_steps = two.durable_interval_steps();
      td.expected_waste = two.expected_waste();
      td.single_interval_s = two.single_interval_seconds();
      td.single_waste = two.single_waste();
      td.reason = two.reason();
      t.decision = std::move(td);
    } else {
      t.error = two.reason();
    }
    r.two_level = std::move(t);
  }
  return r;
}

namespace {

// The two cadences from the offline figures: the failures split by the mix,
// δ split into δm (--memory-cost-seconds) and the rest.
absl::StatusOr<TwoLevelReport> OfflineTwoLevel(const base::Args& args, const policy::IntervalInputs& single) {
  policy::TwoLevelInputs in;
  in.memory_restart_s = single.restart_s;
  for (absl::Status s : {ReadNumber(args, "memory-cost-seconds", NumberRange::kPositive, &in.memory_cost_s),
                         ReadNumber(args, "memory-restart-seconds", NumberRange::kNonNegative, &in.memory_restart_s),
                         ReadNumber(args, "replicate-seconds", NumberRange::kNonNegative, &in.replicate_s)}) {
    if (!s.ok()) return s;
  }
  if (in.memory_cost_s > single.delta_s) {
    return absl::InvalidArgumentError(absl::StrCat("--memory-cost-seconds ", *args.Get("memory-cost-seconds"),
                                                   " exceeds --cost-seconds ", *args.Get("cost-seconds"),
                                                   ": a durable checkpoint costs at least what a memory one does"));
  }
  policy::FailureMix mix;
  if (std::optional<std::string> text = args.Get("failure-mix")) {
    absl::StatusOr<policy::FailureMix> parsed = policy::ParseFailureMix(*text);
    if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("--failure-mix: ", parsed.status().message()));
    mix = *parsed;
  }
  const bool peer_copies = !args.Has("no-peer-copies");
  const double total = mix.process + mix.node + mix.wide;
  std::vector<TwoLevelReport::Class> classes;
  for (int c = 0; c < policy::kFailureClasses; ++c) {
    const auto cls = static_cast<policy::FailureClass>(c);
    const double rate = mix.of(cls) / total / single.mtbf_s;
    const bool from_memory = cls == policy::FailureClass::kProcess || (cls == policy::FailureClass::kNode && peer_copies);
    classes.push_back({policy::FailureClassName(cls), rate, std::nullopt, from_memory});
    (from_memory ? in.memory_rate_per_s : in.durable_rate_per_s) += rate;
  }
  in.durable_cost_s = single.delta_s - in.memory_cost_s;
  in.persist_s = single.persist_s;
  in.durable_restart_s = single.restart_s;
  in.step_s = single.step_s;
  in.min_interval_s = single.min_interval_s;
  in.max_interval_s = single.max_interval_s;
  return DecideTwoLevelReport(std::move(classes), peer_copies, in);
}

}  // namespace

int RunInterval(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err,
                const IntervalFetcher& fetch) {
  const std::set<std::string> offline_flags = {
      "mtbf-hours",  "cost-seconds", "restart-seconds",        "persist-seconds",        "step-seconds",
      "min-seconds", "max-seconds",  "alternative-seconds",    "memory-cost-seconds",    "failure-mix",
      "no-peer-copies", "memory-restart-seconds", "replicate-seconds"};
  std::set<std::string> value_flags = offline_flags;
  value_flags.insert({"svg", "job"});
  value_flags.insert(CoordinatorValueFlags().begin(), CoordinatorValueFlags().end());
  value_flags.erase("no-peer-copies");
  absl::StatusOr<base::Args> args = base::Args::Parse(argv, value_flags, {"json", "help", "no-peer-copies"});
  auto usage = [&](absl::string_view why) {
    err << "ckptctl interval: " << why << "\n(`ckptctl interval --help` describes the flags)\n";
    return base::kExitUsage;
  };
  if (!args.ok()) return usage(args.status().message());
  if (args->Has("help")) {
    out << kIntervalHelp;
    return base::kExitOk;
  }
  if (!args->positional().empty()) return usage(absl::StrCat("unexpected argument \"", args->positional()[0], "\""));
  if (args->Has("job") || args->Has("coordinator")) {
    if (!args->Has("coordinator")) return usage("--job (live mode) needs --coordinator host:port");
    if (!args->Has("job")) return usage("--coordinator (live mode) needs --job J");
    if (absl::Status s = CheckCoordinatorAddress(*args); !s.ok()) return usage(s.message());
    for (const std::string& f : offline_flags) {
      if (args->Has(f)) return usage(absl::StrCat("--", f, " is for offline mode; live mode takes the coordinator's"));
    }
    if (!fetch) return usage("live mode is not available in this build");
    return RunLiveInterval(*args, fetch, out, err);
  }
  if (!args->Has("mtbf-hours")) return usage("--mtbf-hours is required");
  if (!args->Has("cost-seconds")) return usage("--cost-seconds is required");

  IntervalReport report;
  policy::IntervalInputs& in = report.inputs;
  double mtbf_hours = 0;
  for (absl::Status s : {ReadNumber(*args, "mtbf-hours", NumberRange::kPositive, &mtbf_hours),
                         ReadNumber(*args, "cost-seconds", NumberRange::kPositive, &in.delta_s),
                         ReadNumber(*args, "restart-seconds", NumberRange::kNonNegative, &in.restart_s),
                         ReadNumber(*args, "persist-seconds", NumberRange::kNonNegative, &in.persist_s),
                         ReadNumber(*args, "step-seconds", NumberRange::kNonNegative, &in.step_s),
                         ReadNumber(*args, "min-seconds", NumberRange::kNonNegative, &in.min_interval_s),
                         ReadNumber(*args, "max-seconds", NumberRange::kNonNegative, &in.max_interval_s),
                         ReadNumber(*args, "alternative-seconds", NumberRange::kPositive, &in.alternative_s)}) {
    if (!s.ok()) return usage(s.message());
  }
  in.mtbf_s = mtbf_hours * base::kHour;
  if (in.min_interval_s > 0 && in.max_interval_s > 0 && in.min_interval_s > in.max_interval_s) {
    return usage(absl::StrCat("--min-seconds ", *args->Get("min-seconds"), " exceeds --max-seconds ",
                              *args->Get("max-seconds")));
  }
  absl::StatusOr<policy::IntervalDecision> decision = policy::DecideInterval(in);
  if (!decision.ok()) return usage(decision.status().message());  // e.g. M overflowing to inf
  report.decision = *std::move(decision);
  if (args->Has("memory-cost-seconds")) {
    absl::StatusOr<TwoLevelReport> two = OfflineTwoLevel(*args, in);
    if (!two.ok()) return usage(two.status().message());
    report.two_level = *std::move(two);
  } else {
    for (const char* f : {"failure-mix", "no-peer-copies", "memory-restart-seconds", "replicate-seconds"}) {
      if (args->Has(f)) return usage(absl::StrCat("--", f, " needs --memory-cost-seconds (the two cadences)"));
    }
  }

  return PrintReport(*args, report, out, err);
}

}  // namespace ckptd::cli
