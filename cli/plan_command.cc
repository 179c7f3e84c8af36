// ckptctl plan (cli/interval_commands.h): what one checkpoint of a job holds
// and costs, and the interval that follows.

#include "cli/interval_commands.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/flags.h"
#include "base/json.h"
#include "cli/command.h"
#include "cli/figures.h"

namespace ckptd::cli {

const char kPlanHelp[] =
    "usage: ckptctl plan --params N --gpus G [options]\n"
    "\n"
    "Estimates the state a training job's ranks hold, the bytes one checkpoint\n"
    "holds once and that each rank, node and the job write, how long it blocks\n"
    "training and takes to persist, and the interval and waste that follow.\n"
    "Offline arithmetic from the assumptions below.\n"
    "\n"
    "  --params N               model parameters: a number (7e9) or one with a\n"
    "                           decimal suffix K, M, B, T (350M, 7B, 1.5T); a\n"
    "                           whole number, at most 2^53 and at most what\n"
    "                           keeps every figure under 2^63 bytes (below)\n"
    "  --gpus G                 GPUs in the job, one rank each\n"
    "  --dtype D                weights' dtype: bf16 (default), fp16 or fp32\n"
    "  --optimizer O            adam (default), adam-8bit or sgd\n"
    "  --zero Z                 ZeRO stage 0 (default), 1, 2 or 3\n"
    "  --tp T                   tensor-parallel degree (default 1)\n"
    "  --pp P                   pipeline-parallel degree (default 1); G must be a\n"
    "                           multiple of T·P, and dp = G/(T·P)\n"
    "  --gpus-per-node K        default 8\n"
    "  --replicated once|every  how state replicated over the data-parallel ranks\n"
    "                           is counted as written. once (default): what ckptd\n"
    "                           writes when the job declares its replicated\n"
    "                           state (a replica group, DTensor Replicate\n"
    "                           placements, ckptd.torch replicated=): once per\n"
    "                           job, spread over the replicas. every: what it\n"
    "                           writes when the job does not, each rank its\n"
    "                           whole state, data-parallel replicas included\n"
    "  --gpu-memory M           each GPU's memory: GiB (80, 79.6), or with a unit,\n"
    "                           K, M, G, T or KiB .. TiB (powers of 1024) or KB ..\n"
    "                           TB (powers of 1000): 141GB, 96G (default 80 GiB,\n"
    "                           an H100's)\n"
    "  --d2h-gbps X             device-to-host copy bandwidth per GPU, GB/s\n"
    "                           (default 25; 1e-9..1e9)\n"
    "  --write-gbps Y           storage write bandwidth per node, GB/s (default 2;\n"
    "                           1e-9..1e9)\n"
    "  --fail-rate L            failures per GPU-hour (default 3e-6; 1e-30..1e6)\n"
    "  --restart-seconds R      cost of one restart, seconds (default 300; 0..1e12)\n"
    "  --alternative-seconds T  interval to compare with, seconds (default 1800;\n"
    "                           1e-6..1e12)\n"
    "  --json                   one JSON object instead of the table (bytes, seconds,\n"
    "                           waste as fractions; the fields below)\n"
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
    "  optimizer state by dp, stage 2 also the grads, stage 3 also the weights;\n"
    "  a component ZeRO does not divide is replicated over the dp ranks.\n"
    "  RNG: 7572 bytes per rank (CPU Mersenne Twister 5056, one CUDA Philox 16,\n"
    "  Python random 2500). Data cursor: 4096 bytes per rank.\n"
    "  State held: what each rank holds, replicas included. It must fit the\n"
    "  GPU's memory (the state alone; activations and workspace need more): a\n"
    "  layout whose state a rank holds exceeds --gpu-memory is still planned,\n"
    "  with a WARNING line and fits_gpu_memory false (exit status 0: a sweep of\n"
    "  layouts gets every plan; scripts test fits_gpu_memory).\n"
    "  Stall: at each snapshot ckptd's client copies every buffer whole\n"
    "  device-to-host, declared replicated ones included (the memory tier keeps\n"
    "  the whole state, so that a restarted trainer restores from its own\n"
    "  node's agent): stall = bytes per rank / --d2h-gbps. Share copy = rank\n"
    "  share / --d2h-gbps: what the copy would take if a rank copied only what\n"
    "  it writes; ckptd does not, so it is shown to compare and not used for δ.\n"
    "  Unique bytes: one copy of each tp/pp shard of weights, grads and optimizer\n"
    "  state, params × bytes per parameter whatever dp and ZeRO, plus the rng and\n"
    "  data cursor of every rank (they differ per rank).\n"
    "  Written: with --replicated once (replicated state declared), each rank\n"
    "  writes what ZeRO divided and 1/dp of what it holds replicated (1/dp of\n"
    "  its tp/pp shard in all) and its rng and cursor, and the job the unique\n"
    "  bytes. With every (not declared), each rank writes all it holds. A node\n"
    "  writes its ranks' shares (ranks per node = --gpus-per-node, or G when\n"
    "  fewer); persist P = node share / --write-gbps.\n"
    "  Sizes are before compression, in whole bytes: a rank's share of a shard\n"
    "  that does not divide evenly is rounded up (the fullest rank's), and each\n"
    "  total is the exact sum or product of what it is made of. Every figure\n"
    "  must fit a signed 64-bit integer (at most 2^63 - 1 bytes, 9.22 EB): a\n"
    "  larger --params is refused, naming the most the layout takes.\n"
    "  GB = 1e9 bytes, GB/s = 1e9 bytes/s.\n"
    "  δ = stall only: the slowdown of steps while a persist is in flight is not\n"
    "  modelled offline (`ckptctl interval` takes a measured δ).\n"
    "  M = 1/(G·λ); interval = Daly's optimum for (δ, M), never under P;\n"
    "  waste W(τ) = δ/τ + (τ/2 + R)/M (see `ckptctl interval --help`).\n"
    "\n"
    "JSON: the inputs (replicated: \"every\" or \"once\"), dp, nodes,\n"
    "ranks_per_node, params_per_rank, bytes_per_param; state held: rank_bytes\n"
    "(per component and total), node_bytes (a node's ranks), job_bytes (all ranks);\n"
    "written per checkpoint: unique_bytes, rank_write_bytes, node_write_bytes,\n"
    "job_write_bytes; gpu_memory_bytes, fits_gpu_memory (rank_bytes total at\n"
    "most gpu_memory_bytes), warnings (a list of lines, empty when none);\n"
    "stall_seconds, share_copy_seconds, persist_seconds, mtbf_seconds, mtbf_hours,\n"
    "cost_seconds (δ), daly_seconds, interval_seconds, interval_minutes,\n"
    "expected_waste, alternative_waste, reason.\n"
    "\n"
    "exit status: 0 success (a plan that does not fit the GPU's memory\n"
    "included), 2 usage error\n";

namespace {

// "7B", "1.5T", "350M", "125000": parameter counts with decimal suffixes.
std::string Count(double n) {
  if (n >= 1e12) return absl::StrFormat("%.4gT", n / 1e12);
  if (n >= 1e9) return absl::StrFormat("%.4gB", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.4gM", n / 1e6);
  if (n >= 1e3) return absl::StrFormat("%.4gK", n / 1e3);
  return absl::StrFormat("%.4g", n);
}

// "--d2h-gbps must be in 1e-09..1e+09, got 1e+300": the policy's ranges,
// named by flag.
absl::Status CheckRange(absl::string_view flag, double v, double min, double max) {
  if (v >= min && v <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be in ", min, "..", max, ", got ", v));
}

double Bytes(uint64_t bytes) { return static_cast<double>(bytes); }

// "85.90 GB (80.0 GiB)", or "85.90 GB (80.0 GiB, --gpu-memory)" with a note.
std::string GpuMemory(uint64_t bytes, absl::string_view note = "") {
  return absl::StrCat(FormatBytes(Bytes(bytes), ByteUnits::kDecimal), " (",
                      FormatBytes(Bytes(bytes), ByteUnits::kBinary), note.empty() ? "" : ", ", note, ")");
}

// The warning when the state a rank holds does not fit its GPU; empty when it fits.
std::string GpuMemoryWarning(const policy::PlanInputs& in, const policy::Plan& p) {
  if (p.fits_gpu_memory) return "";
  return absl::StrCat("WARNING: does not fit: each rank holds ", FormatBytes(Bytes(p.rank_bytes), ByteUnits::kDecimal),
                      " (", p.rank_bytes, " bytes) of state, more than the GPU's memory, ",
                      GpuMemory(in.gpu_memory_bytes, "--gpu-memory"),
                      "; partition it further (--zero, --tp, --pp) or plan for larger GPUs");
}

}  // namespace

absl::StatusOr<uint64_t> ParseGpuMemory(absl::string_view text) {
  absl::string_view number = text;
  size_t unit_at = number.size();
  while (unit_at > 0 && absl::ascii_isalpha(static_cast<unsigned char>(number[unit_at - 1]))) --unit_at;
  const std::string unit = absl::AsciiStrToLower(number.substr(unit_at));
  number = number.substr(0, unit_at);
  constexpr double kKi = 1024, kMi = kKi * 1024, kGi = kMi * 1024, kTi = kGi * 1024;
  static constexpr struct {
    const char* name;
    double scale;
  } kUnits[] = {{"", kGi},  {"k", kKi},   {"kib", kKi}, {"m", kMi},  {"mib", kMi}, {"g", kGi},  {"gib", kGi},
                {"t", kTi}, {"tib", kTi}, {"kb", 1e3},  {"mb", 1e6}, {"gb", 1e9},  {"tb", 1e12}};
  double scale = 0;
  for (const auto& u : kUnits) {
    if (unit == u.name) scale = u.scale;
  }
  double v = 0;
  if (scale == 0 || number.empty() || !absl::SimpleAtod(number, &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", text, "\" is not a memory size (GiB, or a number with K, M, G, T, KiB .. TiB, or KB .. TB)"));
  }
  const double bytes = std::round(v * scale);
  if (!(bytes >= 1 && bytes <= kTi * kMi)) {  // 2^60
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\" is not a memory size from 1 byte to 1 EiB (2^60 bytes)"));
  }
  return static_cast<uint64_t>(bytes);
}

absl::StatusOr<double> ParseParameterCount(absl::string_view text) {
  absl::string_view number = text;
  uint64_t scale = 1;
  if (!number.empty()) {
    switch (absl::ascii_toupper(static_cast<unsigned char>(number.back()))) {
      case 'K': scale = 1000; break;
      case 'M': scale = 1000 * 1000; break;
      case 'B': scale = 1000 * 1000 * 1000; break;
      case 'T': scale = uint64_t{1000} * 1000 * 1000 * 1000; break;
      default: break;
    }
    if (scale != 1) number.remove_suffix(1);
  }
  const uint64_t max = static_cast<uint64_t>(policy::kMaxPlanParams);
  auto too_many = [&] {
    return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is more than ", max,
                                                   " (2^53) parameters, the most ckptctl plan counts exactly"));
  };
  auto not_a_count = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", text, "\" is not a positive parameter count (a number, optionally with K, M, B or T)"));
  };
  if (!number.empty() && std::all_of(number.begin(), number.end(), [](char c) { return absl::ascii_isdigit(c); })) {
    // Digits: exact, however many (a double would take 2^53 + 1 for 2^53).
    uint64_t n = 0;
    if (!absl::SimpleAtoi(number, &n) || n > max / scale) return too_many();
    if (n == 0) return not_a_count();
    return static_cast<double>(n * scale);
  }
  double v = 0;
  if (number.empty() || !absl::SimpleAtod(number, &v) || !std::isfinite(v * static_cast<double>(scale)) ||
      !(v > 0)) {
    return not_a_count();
  }
  v *= static_cast<double>(scale);
  if (v > policy::kMaxPlanParams) return too_many();
  // "1.1T" is 1.1e12 give or take a double's rounding; "2.5" is no count.
  const double whole = std::round(v);
  if (whole < 1 || std::abs(v - whole) > 1e-9 * v) {
    return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is not a whole number of parameters"));
  }
  return whole;
}

void PrintPlanTable(const policy::PlanInputs& in, const policy::Plan& p, std::ostream& out) {
  out << absl::StrFormat("checkpoint plan: %s parameters, %d GPUs on %d node%s (tp %d × pp %d × dp %d), %s, %s, "
                         "ZeRO-%d\n",
                         Count(in.params), in.gpus, p.nodes, p.nodes == 1 ? "" : "s", in.tp, in.pp, p.dp, in.dtype,
                         in.optimizer, in.zero);
  out << absl::StrFormat("%s parameters per rank\n", Count(p.params_per_rank));
  if (std::string warning = GpuMemoryWarning(in, p); !warning.empty()) out << "\n" << warning << "\n";
  // "2 B/param", "12 B/param / dp 64".
  auto per_param = [&](double bytes, bool partitioned) {
    return partitioned ? absl::StrFormat("%g B/param / dp %d", bytes, p.dp) : absl::StrFormat("%g B/param", bytes);
  };
  out << "\nstate held per rank\n";
  FigureLine(out, "params (weights)",
             absl::StrFormat("%-12s %s", FormatBytes(Bytes(p.params_bytes), ByteUnits::kDecimal),
                             per_param(p.per_param.weights, in.zero >= 3)));
  FigureLine(out, "grads",
             absl::StrFormat("%-12s %s", FormatBytes(Bytes(p.grads_bytes), ByteUnits::kDecimal),
                             per_param(p.per_param.grads, in.zero >= 2)));
  FigureLine(out, "optimizer",
             absl::StrFormat("%-12s %s", FormatBytes(Bytes(p.optimizer_bytes), ByteUnits::kDecimal),
                             per_param(p.per_param.optimizer, in.zero >= 1)));
  FigureLine(out, "rng", absl::StrFormat("%-12s fixed", FormatBytes(Bytes(p.rng_bytes), ByteUnits::kDecimal)));
  FigureLine(out, "data cursor",
             absl::StrFormat("%-12s fixed", FormatBytes(Bytes(p.data_cursor_bytes), ByteUnits::kDecimal)));
  FigureLine(out, "total per rank", FormatBytes(Bytes(p.rank_bytes), ByteUnits::kDecimal));
  const double percent = 100 * Bytes(p.rank_bytes) / Bytes(in.gpu_memory_bytes);
  FigureLine(out, "GPU memory",
             absl::StrCat(GpuMemory(in.gpu_memory_bytes), ": the state per rank takes ",
                          percent >= 100 ? absl::StrFormat("%.0f %%", percent) : absl::StrFormat("%.3g %%", percent),
                          p.fits_gpu_memory ? "" : ", DOES NOT FIT"));
  FigureLine(out, absl::StrFormat("per node (%d ranks)", p.ranks_per_node),
             FormatBytes(Bytes(p.node_bytes), ByteUnits::kDecimal));
  FigureLine(out, absl::StrFormat("job (%d ranks)", in.gpus), FormatBytes(Bytes(p.job_bytes), ByteUnits::kDecimal));

  const bool once = in.replicated == policy::ReplicatedWrites::kOnce;
  out << (once ? absl::StrFormat("\nwritten per checkpoint (replicated state declared: written once per job, "
                                 "spread over dp %d)\n",
                                 p.dp)
               : std::string("\nwritten per checkpoint (replicated state not declared: every rank all it holds, "
                             "replicas included)\n"));
  const double model_per_param = p.per_param.weights + p.per_param.grads + p.per_param.optimizer;
  FigureLine(out, "unique (one copy)",
             absl::StrFormat("%-12s %g B/param, rng and cursor per rank",
                             FormatBytes(Bytes(p.unique_bytes), ByteUnits::kDecimal), model_per_param));
  FigureLine(out, "rank share",
             absl::StrFormat("%-12s %s", FormatBytes(Bytes(p.rank_write_bytes), ByteUnits::kDecimal),
                             once ? absl::StrFormat("%g B/param / dp %d, rng, cursor", model_per_param, p.dp)
                                  : std::string("all it holds")));
  FigureLine(out, absl::StrFormat("node share (%d ranks)", p.ranks_per_node),
             FormatBytes(Bytes(p.node_write_bytes), ByteUnits::kDecimal));
  FigureLine(out, absl::StrFormat("job total (%d ranks)", in.gpus),
             absl::StrFormat("%-12s %.4g× unique", FormatBytes(Bytes(p.job_write_bytes), ByteUnits::kDecimal),
                             Bytes(p.job_write_bytes) / Bytes(p.unique_bytes)));

  out << "\ntime and interval\n";
  FigureLine(out, "stall (= δ)",
             absl::StrFormat("%s: state held at %g GB/s device-to-host (ckptd copies all of it)",
                             FormatSeconds(p.stall_s, DurationStyle::kFigure), in.d2h_gbps));
  FigureLine(out, "share copy",
             absl::StrFormat("%s: rank share at %g GB/s, were a rank to copy only that (ckptd does not)",
                             FormatSeconds(p.share_copy_s, DurationStyle::kFigure), in.d2h_gbps));
  FigureLine(
      out, "persist P",
      absl::StrFormat("%s: node share at %g GB/s", FormatSeconds(p.persist_s, DurationStyle::kFigure), in.write_gbps));
  FigureLine(out, "job MTBF M",
             absl::StrFormat("%s at %g failures per GPU-hour", FormatSeconds(p.job_mtbf_s, DurationStyle::kFigure),
                             in.fail_rate_per_gpu_hour));
  FigureLine(out, "restart cost R", FormatSeconds(in.restart_s, DurationStyle::kFigure));
  FigureLine(out, "Daly optimum τ", FormatSeconds(p.interval.daly_s, DurationStyle::kFigure));
  FigureLine(out, "interval τ",
             absl::StrCat(FormatSeconds(p.interval.interval_s, DurationStyle::kFigure), ", ", p.interval.reason));
  FigureLine(out, "expected waste W(τ)", Percent(p.interval.expected_waste));
  FigureLine(out, absl::StrCat("waste at ", FormatSeconds(in.alternative_s, DurationStyle::kLabel)),
             Percent(p.interval.alternative_waste));
}

std::string PlanJson(const policy::PlanInputs& in, const policy::Plan& p) {
  JsonWriter w;
  w.BeginObject();
  w.Field("params", static_cast<uint64_t>(in.params));
  w.Field("gpus", in.gpus);
  w.Field("dtype", in.dtype);
  w.Field("optimizer", in.optimizer);
  w.Field("zero", in.zero);
  w.Field("tp", in.tp);
  w.Field("pp", in.pp);
  w.Field("dp", p.dp);
  w.Field("gpus_per_node", in.gpus_per_node);
  w.Field("replicated", policy::ReplicatedWritesName(in.replicated));
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
  w.Field("params", p.params_bytes);
  w.Field("grads", p.grads_bytes);
  w.Field("optimizer", p.optimizer_bytes);
  w.Field("rng", p.rng_bytes);
  w.Field("data_cursor", p.data_cursor_bytes);
  w.Field("total", p.rank_bytes);
  w.EndObject();
  w.Field("node_bytes", p.node_bytes);
  w.Field("job_bytes", p.job_bytes);
  w.Field("unique_bytes", p.unique_bytes);
  w.Field("rank_write_bytes", p.rank_write_bytes);
  w.Field("node_write_bytes", p.node_write_bytes);
  w.Field("job_write_bytes", p.job_write_bytes);
  w.Field("gpu_memory_bytes", in.gpu_memory_bytes);
  w.Field("fits_gpu_memory", p.fits_gpu_memory);
  w.Key("warnings");
  w.BeginArray();
  if (std::string warning = GpuMemoryWarning(in, p); !warning.empty()) w.String(warning);
  w.EndArray();
  w.Field("stall_seconds", p.stall_s);
  w.Field("share_copy_seconds", p.share_copy_s);
  w.Field("persist_seconds", p.persist_s);
  w.Field("mtbf_seconds", p.job_mtbf_s);
  w.Field("mtbf_hours", p.job_mtbf_s / base::kHour);
  w.Field("cost_seconds", p.delta_s);
  w.Field("daly_seconds", p.interval.daly_s);
  w.Field("interval_seconds", p.interval.interval_s);
  w.Field("interval_minutes", p.interval.interval_s / base::kMinute);
  w.Field("expected_waste", p.interval.expected_waste);
  w.Field("alternative_waste", p.interval.alternative_waste);
  w.Field("reason", p.interval.reason);
  w.EndObject();
  return w.str();
}

int RunPlan(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  absl::StatusOr<base::Args> args =
      base::Args::Parse(argv,
                        {"params", "gpus", "dtype", "optimizer", "zero", "tp", "pp", "gpus-per-node", "replicated",
                         "gpu-memory", "d2h-gbps", "write-gbps", "fail-rate", "restart-seconds", "alternative-seconds"},
                        {"json", "help"});
  auto usage = [&](absl::string_view why) {
    err << "ckptctl plan: " << why << "\n(`ckptctl plan --help` describes the flags)\n";
    return base::kExitUsage;
  };
  if (!args.ok()) return usage(args.status().message());
  if (args->Has("help")) {
    out << kPlanHelp;
    return base::kExitOk;
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
                         ReadNumber(*args, "d2h-gbps", NumberRange::kPositive, &in.d2h_gbps),
                         ReadNumber(*args, "write-gbps", NumberRange::kPositive, &in.write_gbps),
                         ReadNumber(*args, "fail-rate", NumberRange::kPositive, &in.fail_rate_per_gpu_hour),
                         ReadNumber(*args, "restart-seconds", NumberRange::kNonNegative, &in.restart_s),
                         ReadNumber(*args, "alternative-seconds", NumberRange::kPositive, &in.alternative_s)}) {
    if (!s.ok()) return usage(s.message());
  }
  // Ranges that keep every time and waste finite (policy/sizing.h).
  for (absl::Status s : {CheckRange("d2h-gbps", in.d2h_gbps, policy::kMinPlanGbps, policy::kMaxPlanGbps),
                         CheckRange("write-gbps", in.write_gbps, policy::kMinPlanGbps, policy::kMaxPlanGbps),
                         CheckRange("fail-rate", in.fail_rate_per_gpu_hour, policy::kMinPlanFailRate,
                                    policy::kMaxPlanFailRate),
                         CheckRange("restart-seconds", in.restart_s, 0, policy::kMaxPlanSeconds),
                         CheckRange("alternative-seconds", in.alternative_s, policy::kMinPlanAlternativeSeconds,
                                    policy::kMaxPlanSeconds)}) {
    if (!s.ok()) return usage(s.message());
  }
  if (std::optional<std::string> memory = args->Get("gpu-memory")) {
    absl::StatusOr<uint64_t> bytes = ParseGpuMemory(*memory);
    if (!bytes.ok()) return usage(absl::StrCat("--gpu-memory: ", bytes.status().message()));
    in.gpu_memory_bytes = *bytes;
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
  if (std::optional<std::string> replicated = args->Get("replicated")) {
    absl::StatusOr<policy::ReplicatedWrites> r = policy::ParseReplicatedWrites(*replicated);
    if (!r.ok()) return usage(absl::StrCat("--replicated: ", r.status().message()));
    in.replicated = *r;
  }
  if (in.gpus % (int64_t{in.tp} * in.pp) != 0) {
    return usage(absl::StrCat("--gpus ", in.gpus, " is not a multiple of --tp × --pp = ", int64_t{in.tp} * in.pp,
                              " (tp ", in.tp, ", pp ", in.pp, ")"));
  }
  // The job's ranks hold the largest figure; every figure must fit a signed 64-bit integer.
  if (const uint64_t max = policy::MaxPlanParams(in); in.params > static_cast<double>(max)) {
    return usage(absl::StrCat("--params ", *args->Get("params"), ": the job's ranks would hold more than ",
                              policy::kMaxPlanBytes, " bytes (2^63 - 1), the most a figure of the plan may be; ",
                              "with --gpus ", in.gpus, ", --tp ", in.tp, ", --pp ", in.pp, ", --zero ", in.zero,
                              ", --dtype ", in.dtype, " and --optimizer ", in.optimizer, ", --params may be at most ",
                              max));
  }
  absl::StatusOr<policy::Plan> plan = policy::PlanCheckpoint(in);
  if (!plan.ok()) return usage(plan.status().message());
  if (args->Has("json")) {
    out << PlanJson(in, *plan) << "\n";
    // The table says it; JSON readers have fits_gpu_memory, a person reading it this line.
    if (std::string warning = GpuMemoryWarning(in, *plan); !warning.empty()) err << "ckptctl plan: " << warning << "\n";
  } else {
    PrintPlanTable(in, *plan, out);
  }
  return base::kExitOk;
}

}  // namespace ckptd::cli
