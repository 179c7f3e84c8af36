#include "policy/sizing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"

namespace ckptd::policy {
namespace {

absl::Status CheckInRange(const char* name, double v, double min, double max) {
  if (v >= min && v <= max) return absl::OkStatus();  // false for NaN
  return absl::InvalidArgumentError(absl::StrCat(name, " must be in ", min, "..", max, ", got ", v));
}

absl::Status CheckAtLeastOne(const char* name, int v) {
  if (v >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, " must be at least 1, got ", v));
}

// Everything but params.
absl::Status ValidateLayout(const PlanInputs& in) {
  for (absl::Status s :
       {CheckAtLeastOne("gpus", in.gpus), CheckAtLeastOne("tp", in.tp), CheckAtLeastOne("pp", in.pp),
        CheckAtLeastOne("gpus_per_node", in.gpus_per_node),
        CheckInRange("d2h_gbps", in.d2h_gbps, kMinPlanGbps, kMaxPlanGbps),
        CheckInRange("write_gbps", in.write_gbps, kMinPlanGbps, kMaxPlanGbps),
        CheckInRange("fail_rate_per_gpu_hour", in.fail_rate_per_gpu_hour, kMinPlanFailRate, kMaxPlanFailRate),
        CheckInRange("restart_s", in.restart_s, 0, kMaxPlanSeconds),
        CheckInRange("alternative_s", in.alternative_s, kMinPlanAlternativeSeconds, kMaxPlanSeconds)}) {
    if (!s.ok()) return s;
  }
  if (in.replicated != ReplicatedWrites::kOnce && in.replicated != ReplicatedWrites::kEvery) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicated must be once or every, got ", static_cast<int>(in.replicated)));
  }
  if (in.gpu_memory_bytes < 1) return absl::InvalidArgumentError("gpu_memory_bytes must be at least 1, got 0");
  if (in.zero < 0 || in.zero > 3) {
    return absl::InvalidArgumentError(absl::StrCat("zero stage must be 0, 1, 2 or 3, got ", in.zero));
  }
  const int64_t model_parallel = int64_t{in.tp} * in.pp;
  if (in.gpus % model_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat("gpus ", in.gpus, " is not a multiple of tp·pp = ", model_parallel,
                                                   " (tp ", in.tp, ", pp ", in.pp, ")"));
  }
  return BytesPerParameter(in.dtype, in.optimizer).status();
}

// The byte figures of a plan, exact: a product of up to 2^53 parameters and
// 2^31 ranks does not fit 64 bits.
struct Figures {
  absl::uint128 params, grads, optimizer, rank, node, job;
  absl::uint128 unique, rank_write, node_write, job_write;
};

// Bytes per parameter in 1/kQuantBlock bytes: whole for every dtype and
// optimizer of the table (the 8-bit scales are 8 bytes per 2048 parameters).
absl::uint128 Num(double bytes_per_param) { return static_cast<uint64_t>(std::llround(bytes_per_param * kQuantBlock)); }

absl::uint128 CeilDiv(absl::uint128 a, absl::uint128 b) { return (a + b - 1) / b; }

// REQUIRES: ValidateLayout(in) ok; params ≤ kMaxPlanParams.
Figures Compute(const PlanInputs& in, const BytesPerParam& b, uint64_t params) {
  const uint64_t model_parallel = uint64_t(in.tp) * uint64_t(in.pp);
  const uint64_t dp = uint64_t(in.gpus) / model_parallel;
  const uint64_t gpus = uint64_t(in.gpus);
  const uint64_t ranks_per_node = uint64_t(std::min(in.gpus, in.gpus_per_node));
  const uint64_t block = static_cast<uint64_t>(kQuantBlock);
  // params × bytes / (tp·pp · divisor), rounded up: the fullest rank's.
  auto per_rank = [&](double bytes_per_param, bool partitioned) {
    return CeilDiv(absl::uint128(params) * Num(bytes_per_param),
                   absl::uint128(block) * model_parallel * (partitioned ? dp : 1));
  };
  const uint64_t fixed = kRngBytesPerRank + kDataCursorBytesPerRank;
  Figures f;
  f.params = per_rank(b.weights, in.zero >= 3);
  f.grads = per_rank(b.grads, in.zero >= 2);
  f.optimizer = per_rank(b.optimizer, in.zero >= 1);
  f.rank = f.params + f.grads + f.optimizer + fixed;
  f.node = f.rank * ranks_per_node;
  f.job = f.rank * gpus;
  const double model_per_param = b.weights + b.grads + b.optimizer;
  f.unique = CeilDiv(absl::uint128(params) * Num(model_per_param), block) + absl::uint128(gpus) * fixed;
  // kOnce: a component ZeRO partitions is already 1/dp of the tp/pp shard per
  // rank, and one it does not is replicated over dp ranks that write 1/dp of
  // it each, so every component's share is 1/dp of the shard.
  f.rank_write = in.replicated == ReplicatedWrites::kEvery ? f.rank : per_rank(model_per_param, true) + fixed;
  f.node_write = f.rank_write * ranks_per_node;
  f.job_write = f.rank_write * gpus;
  return f;
}

// The first figure over kMaxPlanBytes, largest first; null when all fit.
const char* FigureOverLimit(const Figures& f, absl::uint128* bytes) {
  for (const auto& [name, v] : std::initializer_list<std::pair<const char*, absl::uint128>>{
           {"the job's ranks would hold", f.job},
           {"the job would write", f.job_write},
           {"one copy of the state would be", f.unique},
           {"a node's ranks would hold", f.node},
           {"a node would write", f.node_write},
           {"a rank would hold", f.rank}}) {
    if (v > kMaxPlanBytes) {
      *bytes = v;
      return name;
    }
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<ReplicatedWrites> ParseReplicatedWrites(absl::string_view name) {
  if (name == "once") return ReplicatedWrites::kOnce;
  if (name == "every") return ReplicatedWrites::kEvery;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown way to write replicated state \"", name, "\" (accepted: once, every)"));
}

absl::string_view ReplicatedWritesName(ReplicatedWrites r) { return r == ReplicatedWrites::kEvery ? "every" : "once"; }

absl::StatusOr<BytesPerParam> BytesPerParameter(absl::string_view dtype, absl::string_view optimizer) {
  BytesPerParam b;
  bool mixed = false;  // 16-bit weights train against an fp32 master copy
  if (dtype == "bf16" || dtype == "fp16") {
    b.weights = b.grads = 2;
    mixed = true;
  } else if (dtype == "fp32") {
    b.weights = b.grads = 4;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", dtype, "\" (accepted: bf16, fp16, fp32)"));
  }
  const double master = mixed ? 4 : 0;
  if (optimizer == "adam") {
    b.optimizer = master + 4 + 4;
  } else if (optimizer == "adam-8bit") {
    b.optimizer = master + 1 + 1 + 2 * 4 / kQuantBlock;
  } else if (optimizer == "sgd") {
    b.optimizer = master + 4;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown optimizer \"", optimizer, "\" (accepted: adam, adam-8bit, sgd)"));
  }
  return b;
}

uint64_t MaxPlanParams(const PlanInputs& in) {
  absl::StatusOr<BytesPerParam> b = BytesPerParameter(in.dtype, in.optimizer);
  if (!ValidateLayout(in).ok() || !b.ok()) return 0;
  absl::uint128 unused;
  // Every figure grows with params: the largest count that fits, by halving.
  uint64_t lo = 0, hi = static_cast<uint64_t>(kMaxPlanParams);
  if (FigureOverLimit(Compute(in, *b, hi), &unused) == nullptr) return hi;
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    (FigureOverLimit(Compute(in, *b, mid), &unused) == nullptr ? lo : hi) = mid;
  }
  return lo;
}

absl::StatusOr<Plan> PlanCheckpoint(const PlanInputs& in) {
  if (!(in.params >= 1 && in.params <= kMaxPlanParams && std::floor(in.params) == in.params)) {
    return absl::InvalidArgumentError(
        absl::StrCat("params must be a whole number in 1..", static_cast<uint64_t>(kMaxPlanParams), ", got ",
                     in.params));
  }
  if (absl::Status s = ValidateLayout(in); !s.ok()) return s;
  absl::StatusOr<BytesPerParam> per_param = BytesPerParameter(in.dtype, in.optimizer);
  if (!per_param.ok()) return per_param.status();
  const uint64_t params = static_cast<uint64_t>(in.params);
  const Figures f = Compute(in, *per_param, params);
  absl::uint128 over = 0;
  if (const char* what = FigureOverLimit(f, &over)) {
    return absl::OutOfRangeError(absl::StrCat(
        "params ", params, ": ", what, " ", static_cast<double>(over), " bytes, more than the ", kMaxPlanBytes,
        " (2^63 - 1) a figure may be; with these gpus, tp, pp, zero, dtype and optimizer, params may be at most ",
        MaxPlanParams(in)));
  }

  Plan p;
  p.per_param = *per_param;
  p.dp = static_cast<int>(in.gpus / (int64_t{in.tp} * in.pp));
  p.nodes = static_cast<int>((int64_t{in.gpus} + in.gpus_per_node - 1) / in.gpus_per_node);
  p.ranks_per_node = std::min(in.gpus, in.gpus_per_node);
  p.params_per_rank = in.params / (static_cast<double>(in.tp) * in.pp);
  p.params_bytes = static_cast<uint64_t>(f.params);
  p.grads_bytes = static_cast<uint64_t>(f.grads);
  p.optimizer_bytes = static_cast<uint64_t>(f.optimizer);
  p.rng_bytes = kRngBytesPerRank;
  p.data_cursor_bytes = kDataCursorBytesPerRank;
  p.rank_bytes = static_cast<uint64_t>(f.rank);
  p.node_bytes = static_cast<uint64_t>(f.node);
  p.job_bytes = static_cast<uint64_t>(f.job);
  p.unique_bytes = static_cast<uint64_t>(f.unique);
  p.rank_write_bytes = static_cast<uint64_t>(f.rank_write);
  p.node_write_bytes = static_cast<uint64_t>(f.node_write);
  p.job_write_bytes = static_cast<uint64_t>(f.job_write);
  p.fits_gpu_memory = p.rank_bytes <= in.gpu_memory_bytes;

  p.stall_s = static_cast<double>(p.rank_bytes) / (in.d2h_gbps * 1e9);
  p.share_copy_s = static_cast<double>(p.rank_write_bytes) / (in.d2h_gbps * 1e9);
  p.persist_s = static_cast<double>(p.node_write_bytes) / (in.write_gbps * 1e9);
  p.job_mtbf_s = JobMtbfSeconds(in.fail_rate_per_gpu_hour, in.gpus);
  p.delta_s = p.stall_s;

  IntervalInputs interval;
  interval.mtbf_s = p.job_mtbf_s;
  interval.delta_s = p.delta_s;
  interval.persist_s = p.persist_s;
  interval.restart_s = in.restart_s;
  interval.alternative_s = in.alternative_s;
  absl::StatusOr<IntervalDecision> decision = DecideInterval(interval);
  if (!decision.ok()) return decision.status();
  p.interval = *std::move(decision);
  return p;
}

}  // namespace ckptd::policy
