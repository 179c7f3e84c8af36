// The capacity planner behind `ckptctl plan`: how many bytes each rank holds
// and writes for a model and parallel layout, how many one checkpoint of the
// job holds uniquely, how long the blocking copy and the persist take, and the
// interval and waste that follow.
// An offline estimate from stated assumptions (docs/interval.md), not a
// measurement.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "policy/interval_policy.h"

namespace ckptd::policy {

// Generator states per rank: PyTorch's CPU Mersenne Twister (5056 bytes, as
// torch.get_rng_state() returns it), one CUDA Philox state (seed + offset, 16
// bytes) and Python's `random` (625 × 4 bytes ≈ 2500). Tiny next to the model;
// stated so the totals are reproducible.
inline constexpr double kRngBytesPerRank = 5056 + 16 + 2500;
// Data-loader position per rank (epoch, sample offset, shuffle seed, worker
// states): a serialized loader state is a few KB; 4 KiB is assumed.
inline constexpr double kDataCursorBytesPerRank = 4096;
// 8-bit optimizers quantize each state in blocks of 2048 values with one fp32
// scale per block and state (bitsandbytes' blockwise quantization).
inline constexpr double kQuantBlock = 2048;

// How state replicated over the data-parallel ranks is counted as written.
enum class ReplicatedWrites {
  // Once per job, its bytes spread evenly over the dp replicas: what ckptd
  // writes of state the job declares replicated (a replica group; DTensor
  // Replicate placements; ckptd.torch's replicated=; docs/elastic.md), and
  // the default.
  kOnce,
  // Every rank writes its whole state, replicas included: what ckptd writes
  // of state the job does not declare replicated.
  kEvery,
};
// "once" | "every"; kInvalidArgument naming the text and the accepted names.
absl::StatusOr<ReplicatedWrites> ParseReplicatedWrites(absl::string_view name);
absl::string_view ReplicatedWritesName(ReplicatedWrites r);

struct PlanInputs {
  double params = 0;             // parameters of the whole model
  int gpus = 0;                  // one rank per GPU
  std::string dtype = "bf16";    // bf16 | fp16 | fp32: the training (weight) dtype
  std::string optimizer = "adam";  // adam | adam-8bit | sgd
  int zero = 0;                  // ZeRO stage 0..3
  int tp = 1, pp = 1;            // tensor- and pipeline-parallel degrees
  int gpus_per_node = 8;
  ReplicatedWrites replicated = ReplicatedWrites::kOnce;  // replicated state declared
  double d2h_gbps = 25;          // device-to-host copy per GPU, GB/s (1e9 bytes/s)
  double write_gbps = 2;         // storage write per node, GB/s
  double fail_rate_per_gpu_hour = 3e-6;
  double restart_s = 300;
  double alternative_s = 1800;
};

// Bytes per parameter of each component, before any ZeRO partitioning.
struct BytesPerParam {
  double weights = 0;
  double grads = 0;
  double optimizer = 0;
};

// The table of docs/interval.md; kInvalidArgument listing the accepted names
// for an unknown dtype or optimizer.
//   weights, grads: bf16/fp16 2 + 2, fp32 4 + 4
//   adam:      fp32 master 4 (mixed precision only) + m 4 + v 4
//   adam-8bit: fp32 master 4 (mixed only) + m 1 + v 1 + 2 fp32 scales per 2048
//   sgd:       fp32 master 4 (mixed only) + momentum 4
absl::StatusOr<BytesPerParam> BytesPerParameter(absl::string_view dtype, absl::string_view optimizer);

struct Plan {
  int dp = 0;              // data-parallel degree, gpus / (tp·pp)
  int nodes = 0;           // ceil(gpus / gpus_per_node)
  int ranks_per_node = 0;  // on the fullest node: min(gpus, gpus_per_node)
  double params_per_rank = 0;  // params / (tp·pp)
  BytesPerParam per_param;

  // State held: bytes per rank, each component after ZeRO partitioning (stage
  // 1 divides the optimizer state by dp, 2 also the grads, 3 also the
  // weights); a component ZeRO does not partition is replicated over the dp
  // ranks. Every rank snapshots all of it.
  double params_bytes = 0;
  double grads_bytes = 0;
  double optimizer_bytes = 0;
  double rng_bytes = 0;
  double data_cursor_bytes = 0;
  double rank_bytes = 0;  // the sum of the five
  double node_bytes = 0;  // rank_bytes × ranks_per_node
  double job_bytes = 0;   // rank_bytes × gpus: held by all ranks, replicas included

  // Written per checkpoint. unique_bytes: one copy of each tp/pp shard of
  // weights, grads and optimizer state (params × bytes per parameter, whatever
  // dp and ZeRO) plus rng and data cursor for every rank, which differ per rank.
  double unique_bytes = 0;
  // Each rank's share. kOnce: its partitioned components, 1/dp of its
  // replicated ones, rng and cursor; kEvery: rank_bytes.
  double rank_write_bytes = 0;
  double node_write_bytes = 0;  // rank_write_bytes × ranks_per_node
  double job_write_bytes = 0;   // rank_write_bytes × gpus: unique_bytes with kOnce

  double stall_s = 0;    // rank_bytes / d2h bandwidth: the blocking copy of the whole state
  double persist_s = 0;  // node_write_bytes / write bandwidth (uncompressed)
  double job_mtbf_s = 0;
  // δ = stall_s: the slowdown of steps while a persist is in flight is not
  // modelled offline (the live policy measures it).
  double delta_s = 0;
  IntervalDecision interval;  // Daly for (δ, M), never under persist_s
};

// kInvalidArgument naming the input and value when it is out of range: params,
// gpus, bandwidths and the failure rate must be positive (and finite); zero in
// 0..3; tp, pp, gpus_per_node ≥ 1; gpus a multiple of tp·pp; restart ≥ 0;
// alternative > 0; dtype and optimizer known; replicated kOnce or kEvery.
absl::StatusOr<Plan> PlanCheckpoint(const PlanInputs& in);

}  // namespace ckptd::policy
