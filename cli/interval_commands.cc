#include "cli/interval_commands.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/args.h"
#include "cli/command.h"
#include "cli/json.h"

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
    "usage: ckptctl interval --job J --coordinator HOST:PORT [--json] [--svg FILE]\n"
    "\n"
    "Live mode: the coordinator's current decision for job J and every input behind\n"
    "it (failures seen over GPU-hours observed and the prior, λ with its credible\n"
    "interval, M, δ as stall plus slowdown, P, R measured or assumed, the step\n"
    "time, τ in seconds and steps, the expected waste), and the schedule in force\n"
    "(the policy changes it only past its hysteresis). Before the first measured\n"
    "checkpoint it says what it is waiting for.\n"
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
    "\n"
    "exit status: 0 success, 1 the SVG could not be written (or live: no such job,\n"
    "or no decision yet to draw), 2 usage error, 3 the coordinator cannot be reached\n";

const char kPlanHelp[] =
    "usage: ckptctl plan --params N --gpus G [options]\n"
    "\n"
    "Estimates what one checkpoint of a training job holds per rank, per node and\n"
    "in all, how long it blocks training and takes to persist, and the interval\n"
    "and waste that follow. Offline arithmetic from the assumptions below.\n"
    "\n"
    "  --params N               model parameters: a number (7e9) or one with a\n"
    "                           decimal suffix K, M, B, T (350M, 7B, 1.5T)\n"
    "  --gpus G                 GPUs in the job, one rank each\n"
    "  --dtype D                weights' dtype: bf16 (default), fp16 or fp32\n"
    "  --optimizer O            adam (default), adam-8bit or sgd\n"
    "  --zero Z                 ZeRO stage 0 (default), 1, 2 or 3\n"
    "  --tp T                   tensor-parallel degree (default 1)\n"
    "  --pp P                   pipeline-parallel degree (default 1); G must be a\n"
    "                           multiple of T·P, and dp = G/(T·P)\n"
    "  --gpus-per-node K        default 8\n"
    "  --d2h-gbps X             device-to-host copy bandwidth per GPU, GB/s\n"
    "                           (default 25)\n"
    "  --write-gbps Y           storage write bandwidth per node, GB/s (default 2)\n"
    "  --fail-rate L            failures per GPU-hour (default 3e-6)\n"
    "  --restart-seconds R      cost of one restart, seconds (default 300)\n"
    "  --alternative-seconds T  interval to compare with, seconds (default 1800)\n"
    "  --json                   one JSON object instead of the table (bytes, seconds,\n"
    "                           waste as fractions)\n"
    "\n"
    "Assumptions:\n"
    "  bytes per parameter      weights  grads  optimizer state\n"
    "    bf16/fp16, adam           2       2    12: fp32 master 4, m 4, v 4\n"
    "    fp32, adam                4       4     8: m 4, v 4\n"
    "    bf16/fp16, adam-8bit      2       2     6.004: master 4, m 1, v 1, and two\n"
    "                                            fp32 scales per block of 2048\n"
    "    fp32, adam-8bit           4       4     2.004: m 1, v 1, scales\n"
    "    bf16/fp16, sgd            2       2     8: master 4, momentum 4\n"
    "    fp32, sgd                 4       4     4: momentum 4\n"
    "  (mixed-precision Adam: 16 bytes per parameter, as in the ZeRO paper)\n"
    "  Each rank holds params/(tp·pp) parameters. ZeRO stage 1 divides the\n"
    "  optimizer state by dp, stage 2 also the grads, stage 3 also the weights.\n"
    "  RNG: 7572 bytes per rank (CPU Mersenne Twister 5056, one CUDA Philox 16,\n"
    "  Python random 2500). Data cursor: 4096 bytes per rank.\n"
    "  Every rank writes its own shard, data-parallel replicas included; sizes\n"
    "  are before compression. GB = 1e9 bytes, GB/s = 1e9 bytes/s.\n"
    "  stall = bytes per rank / --d2h-gbps; persist P = bytes per node /\n"
    "  --write-gbps (ranks per node = --gpus-per-node, or G when fewer).\n"
    "  δ = stall only: the slowdown of steps while a persist is in flight is not\n"
    "  modelled offline (`ckptctl interval` takes a measured δ).\n"
    "  M = 1/(G·λ); interval = Daly's optimum for (δ, M), never under P;\n"
    "  waste W(τ) = δ/τ + (τ/2 + R)/M (see `ckptctl interval --help`).\n"
    "\n"
    "exit status: 0 success, 2 usage error\n";

namespace {

constexpr double kMinute = 60;
constexpr double kHour = 3600;
constexpr double kDay = 86400;

// ------------------------------------------------------------------ flags

enum class Range { kPositive, kNonNegative };

// Reads --flag into *value when given (leaves it otherwise), as a finite
// number in `range`; kInvalidArgument naming the flag and the text.
absl::Status ReadNumber(const Args& args, absl::string_view flag, Range range, double* value) {
  std::optional<std::string> text = args.Get(flag);
  if (!text) return absl::OkStatus();
  double v = 0;
  if (!absl::SimpleAtod(*text, &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", *text, "\" is not a number"));
  }
  if (range == Range::kPositive && !(v > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be positive, got ", *text));
  }
  if (range == Range::kNonNegative && v < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " must not be negative, got ", *text));
  }
  *value = v;
  return absl::OkStatus();
}

// Reads --flag into *value when given, as an integer in [min, max].
absl::Status ReadInt(const Args& args, absl::string_view flag, int min, int max, int* value) {
  absl::StatusOr<std::optional<uint64_t>> v = args.GetUint(flag);
  if (!v.ok()) return v.status();
  if (!*v) return absl::OkStatus();
  if (**v < static_cast<uint64_t>(min) || **v > static_cast<uint64_t>(max)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be in ", min, "..", max, ", got ", *args.Get(flag)));
  }
  *value = static_cast<int>(**v);
  return absl::OkStatus();
}

// ------------------------------------------------------------- formatting

// Display width of UTF-8 text: code points, not bytes (labels use δ, τ).
size_t Width(absl::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

void Line(std::ostream& out, absl::string_view label, absl::string_view value) {
  constexpr size_t kLabelWidth = 28;
  out << "  " << label << std::string(kLabelWidth > Width(label) ? kLabelWidth - Width(label) : 1, ' ') << value
      << "\n";
}

// "7001 s (116.7 min)", "300.0 s (5.0 min)", "1.17 s".
std::string Duration(double s) {
  if (!std::isfinite(s)) return "-";
  const std::string main =
      s < 10 ? absl::StrFormat("%.2f s", s) : s < 1000 ? absl::StrFormat("%.1f s", s) : absl::StrFormat("%.0f s", s);
  if (s >= 2 * kDay) return absl::StrFormat("%s (%.1f d)", main, s / kDay);
  if (s >= 2 * kHour) return absl::StrFormat("%s (%.2f h)", main, s / kHour);
  if (s >= 2 * kMinute) return absl::StrFormat("%s (%.1f min)", main, s / kMinute);
  return main;
}

// "30 s", "1 min", "1.94 h", "217 d": labels, three significant digits.
std::string LabelDuration(double s) {
  if (s < kMinute) return absl::StrFormat("%.3g s", s);
  if (s < kHour) return absl::StrFormat("%.3g min", s / kMinute);
  if (s < kDay) return absl::StrFormat("%.3g h", s / kHour);
  return absl::StrFormat("%.3g d", s / kDay);
}

// "7B", "1.5T", "350M", "125000": parameter counts with decimal suffixes.
std::string Count(double n) {
  if (n >= 1e12) return absl::StrFormat("%.4gT", n / 1e12);
  if (n >= 1e9) return absl::StrFormat("%.4gB", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.4gM", n / 1e6);
  if (n >= 1e3) return absl::StrFormat("%.4gK", n / 1e3);
  return absl::StrFormat("%.4g", n);
}

// Decimal units, to match bandwidths in GB/s: "14.00 GB", "7.57 kB".
std::string DecimalBytes(double bytes) {
  static const char* kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
  int u = 0;
  double v = bytes;
  while (v >= 1000 && u < 6) {
    v /= 1000;
    ++u;
  }
  if (u == 0) return absl::StrFormat("%.0f B", v);
  return absl::StrFormat("%.2f %s", v, kUnits[u]);
}

uint64_t WholeBytes(double bytes) { return static_cast<uint64_t>(std::llround(bytes)); }

// The smallest round number (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k) that is ≥ v
// (v > 0): the top of the waste axis, in five ticks.
double NiceCeil(double v) {
  const double base = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0}) {
    if (m * base >= v * (1 - 1e-12)) return m * base;
  }
  return 10 * base;
}

}  // namespace

// ------------------------------------------------------------- interval

void PrintIntervalTable(const IntervalReport& r, std::ostream& out) {
  const policy::IntervalInputs& in = r.inputs;
  const policy::IntervalDecision& d = r.decision;
  if (r.job.empty()) {
    out << "checkpoint interval (offline, from the figures given)\n";
  } else {
    out << "checkpoint interval for job " << r.job << "\n";
  }
  out << "\ninputs\n";
  if (r.gpus > 0) Line(out, "GPUs G", absl::StrCat(r.gpus));
  if (r.rate) {
    const policy::FailureRateEstimate& e = *r.rate;
    Line(out, "failure rate λ",
         absl::StrFormat("%.3g per GPU-hour (%g%% credible %.3g .. %.3g)", e.mean, 100 * e.credible, e.lower,
                         e.upper));
    Line(out, "observed", absl::StrFormat("%.0f failures over %.4g GPU-hours", e.failures, e.exposure_gpu_hours));
    if (r.gpus > 0) {
      // A higher rate means a shorter MTBF: the bounds swap.
      Line(out, "MTBF range",
           absl::StrCat(Duration(policy::JobMtbfSeconds(e.upper, r.gpus)), " .. ",
                        Duration(policy::JobMtbfSeconds(e.lower, r.gpus))));
    }
  }
  Line(out, "MTBF M", Duration(in.mtbf_s));
  Line(out, "checkpoint cost δ", Duration(in.delta_s));
  if (r.live) {
    Line(out, "  stall", absl::StrCat(Duration(r.live->stall_seconds()), ", median of ",
                                      r.live->checkpoints_measured(), " checkpoints (slowest rank)"));
    Line(out, "  slowdown", r.live->step_seconds_persisting() > 0
                                ? absl::StrFormat("%s (steps %s while persisting)",
                                                  Duration(r.live->slowdown_seconds()),
                                                  Duration(r.live->step_seconds_persisting()))
                                : "none measured");
  }
  Line(out, "persist time P", in.persist_s > 0 ? Duration(in.persist_s) : "0 (no floor)");
  Line(out, "restart cost R",
       r.live ? absl::StrCat(Duration(in.restart_s), r.live->restart_assumed()
                                                         ? " (assumed: no restart measured yet)"
                                                         : absl::StrCat(", median of ", r.live->restarts_measured(),
                                                                        " restarts"))
              : Duration(in.restart_s));
  Line(out, "step time", in.step_s > 0 ? Duration(in.step_s) : "unknown (no step conversion)");
  std::string bounds = "none";
  if (in.min_interval_s > 0 || in.max_interval_s > 0) {
    bounds = absl::StrCat(in.min_interval_s > 0 ? Duration(in.min_interval_s) : "-", " .. ",
                          in.max_interval_s > 0 ? Duration(in.max_interval_s) : "-");
  }
  Line(out, "operator bounds", bounds);
  Line(out, "alternative interval", Duration(in.alternative_s));

  out << "\ndecision\n";
  Line(out, "Daly optimum τ", Duration(d.daly_s));
  std::string chosen = Duration(d.interval_s);
  if (d.interval_steps > 0) absl::StrAppend(&chosen, ", every ", d.interval_steps, " steps");
  Line(out, "chosen interval τ", chosen);
  Line(out, "reason", d.reason);
  Line(out, "expected waste W(τ)", Percent(d.expected_waste));
  Line(out, "waste at alternative", absl::StrFormat("%s (%+.2f points)", Percent(d.alternative_waste),
                                                     100 * (d.alternative_waste - d.expected_waste)));
  if (r.live) {
    std::string force = absl::StrCat("every ", r.live->every_steps(), " steps");
    if (!r.live->automatic()) {
      absl::StrAppend(&force, " (fixed with --every: the policy only advises)");
    } else if (r.live->every_steps() != d.interval_steps) {
      absl::StrAppend(&force, " (kept: the change is inside the hysteresis)");
    }
    Line(out, "schedule in force", force);
  }
}

std::string IntervalJson(const IntervalReport& r) {
  const policy::IntervalInputs& in = r.inputs;
  const policy::IntervalDecision& d = r.decision;
  auto positive_or_null = [](JsonWriter& w, absl::string_view key, double v) {
    w.Key(key);
    if (v > 0) {
      w.Double(v);
    } else {
      w.Null();
    }
  };
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
  w.Field("mtbf_hours", in.mtbf_s / kHour);
  w.Field("cost_seconds", in.delta_s);
  w.Field("persist_seconds", in.persist_s);
  w.Field("restart_seconds", in.restart_s);
  positive_or_null(w, "step_seconds", in.step_s);
  positive_or_null(w, "min_seconds", in.min_interval_s);
  positive_or_null(w, "max_seconds", in.max_interval_s);
  w.Field("alternative_seconds", in.alternative_s);
  w.Field("daly_seconds", d.daly_s);
  w.Field("interval_seconds", d.interval_s);
  w.Field("interval_minutes", d.interval_s / kMinute);
  w.Key("interval_steps");
  if (d.interval_steps > 0) {
    w.Uint(d.interval_steps);
  } else {
    w.Null();
  }
  w.Field("expected_waste", d.expected_waste);
  w.Field("alternative_waste", d.alternative_waste);
  w.Field("reason", d.reason);
  if (r.live) {
    w.Field("automatic", r.live->automatic());
    w.Field("decided", r.live->decided());
    w.Field("every_steps", r.live->every_steps());
    w.Field("stall_seconds", r.live->stall_seconds());
    w.Field("slowdown_seconds", r.live->slowdown_seconds());
    w.Field("step_seconds_persisting", r.live->step_seconds_persisting());
    w.Field("restart_assumed", r.live->restart_assumed());
    w.Field("checkpoints_measured", r.live->checkpoints_measured());
    w.Field("restarts_measured", r.live->restarts_measured());
    w.Field("prior_per_gpu_hour", r.live->prior_per_gpu_hour());
    w.Field("prior_shape", r.live->prior_shape());
  }
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

  std::string s;
  absl::StrAppendFormat(&s,
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                        "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
                        kWidth, kHeight, kWidth, kHeight);
  absl::StrAppend(&s, "<title>Expected waste W(τ)", r.job.empty() ? "" : " for job ", XmlEscape(r.job),
                  "</title>\n");
  absl::StrAppend(&s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  absl::StrAppendFormat(&s,
                        "<text x=\"%.0f\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">Expected waste "
                        "W(τ) = δ/τ + (τ/2 + R)/M%s</text>\n",
                        kWidth / 2, r.job.empty() ? "" : XmlEscape(absl::StrCat(" — job ", r.job)));
  absl::StrAppendFormat(&s, "<text x=\"%.0f\" y=\"42\" text-anchor=\"middle\" fill=\"#555\">%s</text>\n", kWidth / 2,
                        XmlEscape(absl::StrCat("M ", LabelDuration(in.mtbf_s), ", δ ", LabelDuration(in.delta_s),
                                               ", R ", LabelDuration(in.restart_s),
                                               in.persist_s > 0 ? absl::StrCat(", P ", LabelDuration(in.persist_s))
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
    absl::StrAppendFormat(&s,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                          x, y0, x, y1, x, y1, x, y1 + 5, x, y1 + 19, LabelDuration(ticks[i]));
  }
  // Y ticks: five steps of y_max.
  for (int i = 0; i <= 5; ++i) {
    const double w = y_max * i / 5;
    const double y = Y(w);
    absl::StrAppendFormat(&s,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g %%</text>\n",
                          x0, y, x1, y, x0 - 5, y, x0, y, x0 - 8, y + 4, 100 * w);
  }
  // Axes and their labels.
  absl::StrAppendFormat(&s,
                        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
                        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                        x0, y1, x1, y1, x0, y0, x0, y1);
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
    absl::StrAppendFormat(&s,
                          "<g id=\"%s\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                          "stroke-width=\"1.5\"%s/><circle cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" fill=\"%s\"/></g>\n",
                          id, x, y0, x, y1, colour, dash, x, Y(waste(tau)), colour);
    // Label over a white box of its estimated width (~6.6 px a character at 12 px).
    const double text_x = right_half ? x - 6 : x + 6;
    const double text_y = y0 + 14 + 16 * row;
    const double box_w = 6.6 * static_cast<double>(Width(label)) + 6;
    absl::StrAppendFormat(&labels,
                          "<g id=\"%s-label\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"15\" fill=\"white\" "
                          "fill-opacity=\"0.85\"/><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" fill=\"%s\">%s</text></g>\n",
                          id, right_half ? text_x - box_w + 3 : text_x - 3, text_y - 11.5, box_w, text_x, text_y,
                          right_half ? "end" : "start", colour, XmlEscape(label));
  };
  marker("alternative", "#d62728", " stroke-dasharray=\"5 4\"",
         absl::StrCat("alternative ", LabelDuration(in.alternative_s), ": ", Percent(d.alternative_waste)),
         in.alternative_s, 1);
  if (std::fabs(d.daly_s - d.interval_s) > 1e-9 * d.interval_s) {
    marker("daly", "#7f7f7f", " stroke-dasharray=\"2 3\"",
           absl::StrCat("Daly optimum ", LabelDuration(d.daly_s), ": ", Percent(waste(d.daly_s))), d.daly_s, 2);
  }
  marker("chosen", "#2ca02c", "",
         absl::StrCat("chosen ", LabelDuration(d.interval_s), ": ", Percent(d.expected_waste)), d.interval_s, 0);
  s += labels;
  s += "</svg>\n";
  return s;
}

namespace {

// The table or JSON, and the SVG when asked for.
int PrintReport(const Args& args, const IntervalReport& report, std::ostream& out, std::ostream& err) {
  if (args.Has("json")) {
    out << IntervalJson(report) << "\n";
  } else {
    PrintIntervalTable(report, out);
  }
  if (std::optional<std::string> svg = args.Get("svg")) {
    if (absl::Status s = WriteTextFile(*svg, WasteCurveSvg(report)); !s.ok()) {
      err << "ckptctl interval: --svg: " << s.message() << "\n";
      return kExitFailed;
    }
    if (!args.Has("json")) out << "\nwaste curve written to " << *svg << "\n";
  }
  return kExitOk;
}

// A live status without a decision: what is known and what is missing.
void PrintUndecided(const ckptd::v1::IntervalStatus& st, const Args& args, std::ostream& out) {
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
  out << "checkpoint interval for job " << st.job() << "\n\n";
  Line(out, "policy", st.automatic() ? "automatic, not decided yet" : st.reason());
  Line(out, "waiting for", st.waiting_for());
  Line(out, "schedule in force", absl::StrCat("every ", st.every_steps(), " steps"));
  Line(out, "GPUs G", absl::StrCat(st.gpus()));
  Line(out, "failure rate λ", absl::StrFormat("%.3g per GPU-hour (%.0f failures over %.4g GPU-hours)",
                                               st.rate_per_gpu_hour(), static_cast<double>(st.failures()),
                                               st.exposure_gpu_hours()));
  Line(out, "MTBF M", Duration(st.mtbf_seconds()));
}

int RunLiveInterval(const Args& args, const IntervalFetcher& fetch, std::ostream& out, std::ostream& err) {
  const std::string job = *args.Get("job");
  absl::StatusOr<ckptd::v1::IntervalStatus> st = fetch(args, job);
  if (!st.ok()) {
    err << "ckptctl interval: " << st.status().message() << "\n";
    if (absl::IsUnavailable(st.status()) || absl::IsDeadlineExceeded(st.status())) return kExitUnavailable;
    return absl::IsInvalidArgument(st.status()) ? kExitUsage : kExitFailed;
  }
  if (!st->decided()) {
    PrintUndecided(*st, args, out);
    if (args.Has("svg")) {
      err << "ckptctl interval: no curve to draw for job " << job << " yet: waiting for " << st->waiting_for()
          << "\n";
      return kExitFailed;
    }
    return kExitOk;
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
  return r;
}

int RunInterval(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err,
                const IntervalFetcher& fetch) {
  const std::set<std::string> offline_flags = {"mtbf-hours",  "cost-seconds", "restart-seconds",
                                               "persist-seconds", "step-seconds", "min-seconds",
                                               "max-seconds", "alternative-seconds"};
  std::set<std::string> value_flags = offline_flags;
  value_flags.insert({"svg", "job"});
  value_flags.insert(CoordinatorValueFlags().begin(), CoordinatorValueFlags().end());
  absl::StatusOr<Args> args = Args::Parse(argv, value_flags, {"json", "help"});
  auto usage = [&](absl::string_view why) {
    err << "ckptctl interval: " << why << "\n(`ckptctl interval --help` describes the flags)\n";
    return kExitUsage;
  };
  if (!args.ok()) return usage(args.status().message());
  if (args->Has("help")) {
    out << kIntervalHelp;
    return kExitOk;
  }
  if (!args->positional().empty()) return usage(absl::StrCat("unexpected argument \"", args->positional()[0], "\""));
  if (args->Has("job") || args->Has("coordinator")) {
    if (!args->Has("coordinator")) return usage("--job (live mode) needs --coordinator host:port");
    if (!args->Has("job")) return usage("--coordinator (live mode) needs --job J");
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
  for (absl::Status s : {ReadNumber(*args, "mtbf-hours", Range::kPositive, &mtbf_hours),
                         ReadNumber(*args, "cost-seconds", Range::kPositive, &in.delta_s),
                         ReadNumber(*args, "restart-seconds", Range::kNonNegative, &in.restart_s),
                         ReadNumber(*args, "persist-seconds", Range::kNonNegative, &in.persist_s),
                         ReadNumber(*args, "step-seconds", Range::kNonNegative, &in.step_s),
                         ReadNumber(*args, "min-seconds", Range::kNonNegative, &in.min_interval_s),
                         ReadNumber(*args, "max-seconds", Range::kNonNegative, &in.max_interval_s),
                         ReadNumber(*args, "alternative-seconds", Range::kPositive, &in.alternative_s)}) {
    if (!s.ok()) return usage(s.message());
  }
  in.mtbf_s = mtbf_hours * kHour;
  if (in.min_interval_s > 0 && in.max_interval_s > 0 && in.min_interval_s > in.max_interval_s) {
    return usage(absl::StrCat("--min-seconds ", *args->Get("min-seconds"), " exceeds --max-seconds ",
                              *args->Get("max-seconds")));
  }
  absl::StatusOr<policy::IntervalDecision> decision = policy::DecideInterval(in);
  if (!decision.ok()) return usage(decision.status().message());  // e.g. M overflowing to inf
  report.decision = *std::move(decision);

  return PrintReport(*args, report, out, err);
}

// ------------------------------------------------------------------ plan

absl::StatusOr<double> ParseParameterCount(absl::string_view text) {
  absl::string_view number = text;
  double scale = 1;
  if (!number.empty()) {
    switch (absl::ascii_toupper(static_cast<unsigned char>(number.back()))) {
      case 'K': scale = 1e3; break;
      case 'M': scale = 1e6; break;
      case 'B': scale = 1e9; break;
      case 'T': scale = 1e12; break;
      default: break;
    }
    if (scale != 1) number.remove_suffix(1);
  }
  double v = 0;
  if (number.empty() || !absl::SimpleAtod(number, &v) || !std::isfinite(v * scale) || !(v > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", text, "\" is not a positive parameter count (a number, optionally with K, M, B or T)"));
  }
  return v * scale;
}

void PrintPlanTable(const policy::PlanInputs& in, const policy::Plan& p, std::ostream& out) {
  out << absl::StrFormat("checkpoint plan: %s parameters, %d GPUs on %d node%s (tp %d × pp %d × dp %d), %s, %s, "
                         "ZeRO-%d\n",
                         Count(in.params), in.gpus, p.nodes, p.nodes == 1 ? "" : "s", in.tp, in.pp, p.dp, in.dtype,
                         in.optimizer, in.zero);
  out << absl::StrFormat("%s parameters per rank\n", Count(p.params_per_rank));
  // "2 B/param", "12 B/param / dp 64".
  auto per_param = [&](double bytes, bool partitioned) {
    return partitioned ? absl::StrFormat("%g B/param / dp %d", bytes, p.dp) : absl::StrFormat("%g B/param", bytes);
  };
  out << "\nper rank\n";
  Line(out, "params (weights)", absl::StrFormat("%-12s %s", DecimalBytes(p.params_bytes),
                                                per_param(p.per_param.weights, in.zero >= 3)));
  Line(out, "grads",
       absl::StrFormat("%-12s %s", DecimalBytes(p.grads_bytes), per_param(p.per_param.grads, in.zero >= 2)));
  Line(out, "optimizer", absl::StrFormat("%-12s %s", DecimalBytes(p.optimizer_bytes),
                                         per_param(p.per_param.optimizer, in.zero >= 1)));
  Line(out, "rng", absl::StrFormat("%-12s fixed", DecimalBytes(p.rng_bytes)));
  Line(out, "data cursor", absl::StrFormat("%-12s fixed", DecimalBytes(p.data_cursor_bytes)));
  Line(out, "total per rank", DecimalBytes(p.rank_bytes));
  Line(out, absl::StrFormat("per node (%d ranks)", p.ranks_per_node), DecimalBytes(p.node_bytes));
  Line(out, absl::StrFormat("job (%d ranks)", in.gpus), DecimalBytes(p.job_bytes));

  out << "\ntime and interval\n";
  Line(out, "stall (= δ)", absl::StrFormat("%s at %g GB/s device-to-host", Duration(p.stall_s), in.d2h_gbps));
  Line(out, "persist P", absl::StrFormat("%s at %g GB/s per node", Duration(p.persist_s), in.write_gbps));
  Line(out, "job MTBF M",
       absl::StrFormat("%s at %g failures per GPU-hour", Duration(p.job_mtbf_s), in.fail_rate_per_gpu_hour));
  Line(out, "restart cost R", Duration(in.restart_s));
  Line(out, "Daly optimum τ", Duration(p.interval.daly_s));
  Line(out, "interval τ", absl::StrCat(Duration(p.interval.interval_s), ", ", p.interval.reason));
  Line(out, "expected waste W(τ)", Percent(p.interval.expected_waste));
  Line(out, absl::StrCat("waste at ", LabelDuration(in.alternative_s)), Percent(p.interval.alternative_waste));
}

std::string PlanJson(const policy::PlanInputs& in, const policy::Plan& p) {
  JsonWriter w;
  w.BeginObject();
  w.Field("params", in.params);
  w.Field("gpus", in.gpus);
  w.Field("dtype", in.dtype);
  w.Field("optimizer", in.optimizer);
  w.Field("zero", in.zero);
  w.Field("tp", in.tp);
  w.Field("pp", in.pp);
  w.Field("dp", p.dp);
  w.Field("gpus_per_node", in.gpus_per_node);
  w.Field("nodes", p.nodes);
  w.Field("ranks_per_node", p.ranks_per_node);
  w.Field("d2h_gbps", in.d2h_gbps);
  w.Field("write_gbps", in.write_gbps);
  w.Field("fail_rate_per_gpu_hour", in.fail_rate_per_gpu_hour);
  w.Field("restart_seconds", in.restart_s);
  w.Field("alternative_seconds", in.alternative_s);
  w.Field("params_per_rank", p.params_per_rank);
  w.Key("bytes_per_param");
  w.BeginObject();
  w.Field("weights", p.per_param.weights);
  w.Field("grads", p.per_param.grads);
  w.Field("optimizer", p.per_param.optimizer);
  w.EndObject();
  w.Key("rank_bytes");
  w.BeginObject();
  w.Field("params", WholeBytes(p.params_bytes));
  w.Field("grads", WholeBytes(p.grads_bytes));
  w.Field("optimizer", WholeBytes(p.optimizer_bytes));
  w.Field("rng", WholeBytes(p.rng_bytes));
  w.Field("data_cursor", WholeBytes(p.data_cursor_bytes));
  w.Field("total", WholeBytes(p.rank_bytes));
  w.EndObject();
  w.Field("node_bytes", WholeBytes(p.node_bytes));
  w.Field("job_bytes", WholeBytes(p.job_bytes));
  w.Field("stall_seconds", p.stall_s);
  w.Field("persist_seconds", p.persist_s);
  w.Field("mtbf_seconds", p.job_mtbf_s);
  w.Field("mtbf_hours", p.job_mtbf_s / kHour);
  w.Field("cost_seconds", p.delta_s);
  w.Field("daly_seconds", p.interval.daly_s);
  w.Field("interval_seconds", p.interval.interval_s);
  w.Field("interval_minutes", p.interval.interval_s / kMinute);
  w.Field("expected_waste", p.interval.expected_waste);
  w.Field("alternative_waste", p.interval.alternative_waste);
  w.Field("reason", p.interval.reason);
  w.EndObject();
  return w.str();
}

int RunPlan(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  absl::StatusOr<Args> args =
      Args::Parse(argv,
                  {"params", "gpus", "dtype", "optimizer", "zero", "tp", "pp", "gpus-per-node", "d2h-gbps",
                   "write-gbps", "fail-rate", "restart-seconds", "alternative-seconds"},
                  {"json", "help"});
  auto usage = [&](absl::string_view why) {
    err << "ckptctl plan: " << why << "\n(`ckptctl plan --help` describes the flags)\n";
    return kExitUsage;
  };
  if (!args.ok()) return usage(args.status().message());
  if (args->Has("help")) {
    out << kPlanHelp;
    return kExitOk;
  }
  if (!args->positional().empty()) return usage(absl::StrCat("unexpected argument \"", args->positional()[0], "\""));
  if (!args->Has("params")) return usage("--params is required");
  if (!args->Has("gpus")) return usage("--gpus is required");

  policy::PlanInputs in;
  absl::StatusOr<double> params = ParseParameterCount(*args->Get("params"));
  if (!params.ok()) return usage(absl::StrCat("--params: ", params.status().message()));
  in.params = *params;
  constexpr int kIntMax = std::numeric_limits<int>::max();
  for (absl::Status s : {ReadInt(*args, "gpus", 1, kIntMax, &in.gpus), ReadInt(*args, "zero", 0, 3, &in.zero),
                         ReadInt(*args, "tp", 1, kIntMax, &in.tp), ReadInt(*args, "pp", 1, kIntMax, &in.pp),
                         ReadInt(*args, "gpus-per-node", 1, kIntMax, &in.gpus_per_node),
                         ReadNumber(*args, "d2h-gbps", Range::kPositive, &in.d2h_gbps),
                         ReadNumber(*args, "write-gbps", Range::kPositive, &in.write_gbps),
                         ReadNumber(*args, "fail-rate", Range::kPositive, &in.fail_rate_per_gpu_hour),
                         ReadNumber(*args, "restart-seconds", Range::kNonNegative, &in.restart_s),
                         ReadNumber(*args, "alternative-seconds", Range::kPositive, &in.alternative_s)}) {
    if (!s.ok()) return usage(s.message());
  }
  if (std::optional<std::string> dtype = args->Get("dtype")) in.dtype = *dtype;
  if (std::optional<std::string> optimizer = args->Get("optimizer")) in.optimizer = *optimizer;
  // Checked one at a time so that the message names the flag.
  if (absl::Status s = policy::BytesPerParameter(in.dtype, "adam").status(); !s.ok()) {
    return usage(absl::StrCat("--dtype: ", s.message()));
  }
  if (absl::Status s = policy::BytesPerParameter("bf16", in.optimizer).status(); !s.ok()) {
    return usage(absl::StrCat("--optimizer: ", s.message()));
  }
  if (in.gpus % (int64_t{in.tp} * in.pp) != 0) {
    return usage(absl::StrCat("--gpus ", in.gpus, " is not a multiple of --tp × --pp = ", int64_t{in.tp} * in.pp,
                              " (tp ", in.tp, ", pp ", in.pp, ")"));
  }
  absl::StatusOr<policy::Plan> plan = policy::PlanCheckpoint(in);
  if (!plan.ok()) return usage(plan.status().message());
  if (args->Has("json")) {
    out << PlanJson(in, *plan) << "\n";
  } else {
    PrintPlanTable(in, *plan, out);
  }
  return kExitOk;
}

}  // namespace ckptd::cli
