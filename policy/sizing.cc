#include "policy/sizing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckptd::policy {
namespace {

bool PositiveFinite(double v) { return std::isfinite(v) && v > 0; }

absl::Status CheckPositive(const char* name, double v) {
  if (PositiveFinite(v)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, " must be positive and finite, got ", v));
}

absl::Status CheckAtLeastOne(const char* name, int v) {
  if (v >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, " must be at least 1, got ", v));
}

absl::Status Validate(const PlanInputs& in) {
  for (absl::Status s :
       {CheckPositive("params", in.params), CheckAtLeastOne("gpus", in.gpus), CheckAtLeastOne("tp", in.tp),
        CheckAtLeastOne("pp", in.pp), CheckAtLeastOne("gpus_per_node", in.gpus_per_node),
        CheckPositive("d2h_gbps", in.d2h_gbps), CheckPositive("write_gbps", in.write_gbps),
        CheckPositive("fail_rate_per_gpu_hour", in.fail_rate_per_gpu_hour),
        CheckPositive("alternative_s", in.alternative_s)}) {
    if (!s.ok()) return s;
  }
  if (!(std::isfinite(in.restart_s) && in.restart_s >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("restart_s must be non-negative and finite, got ", in.restart_s));
  }
  if (in.replicated != ReplicatedWrites::kOnce && in.replicated != ReplicatedWrites::kEvery) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicated must be once or every, got ", static_cast<int>(in.replicated)));
  }
  if (in.zero < 0 || in.zero > 3) {
    return absl::InvalidArgumentError(absl::StrCat("zero stage must be 0, 1, 2 or 3, got ", in.zero));
  }
  const int64_t model_parallel = int64_t{in.tp} * in.pp;
  if (in.gpus % model_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat("gpus ", in.gpus, " is not a multiple of tp·pp = ", model_parallel,
                                                   " (tp ", in.tp, ", pp ", in.pp, ")"));
  }
  return absl::OkStatus();
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

absl::StatusOr<Plan> PlanCheckpoint(const PlanInputs& in) {
  if (absl::Status s = Validate(in); !s.ok()) return s;
  absl::StatusOr<BytesPerParam> per_param = BytesPerParameter(in.dtype, in.optimizer);
  if (!per_param.ok()) return per_param.status();

  Plan p;
  p.per_param = *per_param;
  p.dp = static_cast<int>(in.gpus / (int64_t{in.tp} * in.pp));
  p.nodes = static_cast<int>((int64_t{in.gpus} + in.gpus_per_node - 1) / in.gpus_per_node);
  p.ranks_per_node = std::min(in.gpus, in.gpus_per_node);
  p.params_per_rank = in.params / (static_cast<double>(in.tp) * in.pp);

  const double dp = p.dp;
  p.params_bytes = p.params_per_rank * p.per_param.weights / (in.zero >= 3 ? dp : 1);
  p.grads_bytes = p.params_per_rank * p.per_param.grads / (in.zero >= 2 ? dp : 1);
  p.optimizer_bytes = p.params_per_rank * p.per_param.optimizer / (in.zero >= 1 ? dp : 1);
  p.rng_bytes = kRngBytesPerRank;
  p.data_cursor_bytes = kDataCursorBytesPerRank;
  p.rank_bytes = p.params_bytes + p.grads_bytes + p.optimizer_bytes + p.rng_bytes + p.data_cursor_bytes;
  p.node_bytes = p.rank_bytes * p.ranks_per_node;
  p.job_bytes = p.rank_bytes * in.gpus;

  const double model_per_param = p.per_param.weights + p.per_param.grads + p.per_param.optimizer;
  const double per_rank_fixed = p.rng_bytes + p.data_cursor_bytes;
  p.unique_bytes = in.params * model_per_param + in.gpus * per_rank_fixed;
  // kOnce: a component ZeRO partitions is already 1/dp of the tp/pp shard per
  // rank, and one it does not is replicated over dp ranks that write 1/dp of
  // it each, so every component's share is 1/dp of the shard.
  p.rank_write_bytes = in.replicated == ReplicatedWrites::kEvery
                           ? p.rank_bytes
                           : p.params_per_rank * model_per_param / dp + per_rank_fixed;
  p.node_write_bytes = p.rank_write_bytes * p.ranks_per_node;
  p.job_write_bytes = p.rank_write_bytes * in.gpus;

  p.stall_s = p.rank_bytes / (in.d2h_gbps * 1e9);
  p.persist_s = p.node_write_bytes / (in.write_gbps * 1e9);
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
