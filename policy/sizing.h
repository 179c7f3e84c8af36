// The capacity planner behind `ckptctl plan`: how many bytes each rank holds
// and writes for a model and parallel layout, how many one checkpoint of the
// job holds uniquely, how long the blocking copy and the persist take, and the
// interval and waste that follow.
// An offline estimate from stated assumptions (docs/interval.md), not a
// measurement.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "policy/interval_policy.h"

namespace ckptd::policy {

// Generator states per rank: PyTorch's CPU Mersenne Twister (5056 bytes, as
// torch.get_rng_state() returns it), one CUDA Philox state (seed + offset, 16
// bytes) and Python's `random` (625 × 4 bytes ≈ 2500). Tiny next to the model;
// stated so the totals are reproducible.
inline constexpr uint64_t kRngBytesPerRank = 5056 + 16 + 2500;
// Data-loader position per rank (epoch, sample offset, shuffle seed, worker
// states): a serialized loader state is a few KB; 4 KiB is assumed.
inline constexpr uint64_t kDataCursorBytesPerRank = 4096;
// 8-bit optimizers quantize each state in blocks of 2048 values with one fp32
// scale per block and state (bitsandbytes' blockwise quantization).
inline constexpr double kQuantBlock = 2048;

// Every byte figure of a plan is a whole number of bytes of at most this:
// 2^63 − 1 (9.22 EB), what a signed 64-bit integer holds, so that JSON
// readers take it exactly. A layout whose figures would not fit is refused.
inline constexpr uint64_t kMaxPlanBytes = std::numeric_limits<int64_t>::max();
// The most parameters a plan counts: 2^53, the whole numbers a double holds
// exactly.
inline constexpr double kMaxPlanParams = 9007199254740992.0;
// The ranges of the other real inputs, far beyond any real machine, that
// keep every time and waste of a plan finite and positive: bandwidths 1e-9
// to 1e9 GB/s (1 byte/s to 1 EB/s), failure rates 1e-30 to 1e6 per GPU-hour,
// the restart cost 0 to 1e12 s and the alternative interval 1e-6 to 1e12 s
// (1e12 s: about 31,700 years).
inline constexpr double kMinPlanGbps = 1e-9;
inline constexpr double kMaxPlanGbps = 1e9;
inline constexpr double kMinPlanFailRate = 1e-30;
inline constexpr double kMaxPlanFailRate = 1e6;
inline constexpr double kMinPlanAlternativeSeconds = 1e-6;
inline constexpr double kMaxPlanSeconds = 1e12;
// GPU memory assumed when none is given: 80 GiB, an H100's (and an A100
// 80GB's) HBM.
inline constexpr uint64_t kDefaultGpuMemoryBytes = uint64_t{80} << 30;

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
  double params = 0;             // parameters of the whole model: whole, 1..kMaxPlanParams
  int gpus = 0;                  // one rank per GPU
  std::string dtype = "bf16";    // bf16 | fp16 | fp32: the training (weight) dtype
  std::string optimizer = "adam";  // adam | adam-8bit | sgd
  int zero = 0;                  // ZeRO stage 0..3
  int tp = 1, pp = 1;            // tensor- and pipeline-parallel degrees
  int gpus_per_node = 8;
  ReplicatedWrites replicated = ReplicatedWrites::kOnce;  // replicated state declared
  uint64_t gpu_memory_bytes = kDefaultGpuMemoryBytes;     // each GPU's memory, ≥ 1
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

  // Byte figures are whole bytes, at most kMaxPlanBytes; a per-rank figure
  // that is a fraction of a shard is rounded up (the fullest rank's), and
  // every total is the exact sum or product of the figures it is made of.
  //
  // State held: bytes per rank, each component after ZeRO partitioning (stage
  // 1 divides the optimizer state by dp, 2 also the grads, 3 also the
  // weights); a component ZeRO does not partition is replicated over the dp
  // ranks. Every rank copies all of it device-to-host (client::Client::
  // Snapshot copies each buffer whole, replicated ones included: the memory
  // tier keeps the whole state).
  uint64_t params_bytes = 0;
  uint64_t grads_bytes = 0;
  uint64_t optimizer_bytes = 0;
  uint64_t rng_bytes = 0;
  uint64_t data_cursor_bytes = 0;
  uint64_t rank_bytes = 0;  // the sum of the five
  uint64_t node_bytes = 0;  // rank_bytes × ranks_per_node
  uint64_t job_bytes = 0;   // rank_bytes × gpus: held by all ranks, replicas included
  // rank_bytes ≤ gpu_memory_bytes: the state alone (activations, workspace
  // and fragmentation need more), so true is necessary, not sufficient.
  bool fits_gpu_memory = true;

  // Written per checkpoint. unique_bytes: one copy of each tp/pp shard of
  // weights, grads and optimizer state (params × bytes per parameter, whatever
  // dp and ZeRO) plus rng and data cursor for every rank, which differ per rank.
  uint64_t unique_bytes = 0;
  // Each rank's share. kOnce: its partitioned components, 1/dp of its
  // replicated ones, rng and cursor; kEvery: rank_bytes.
  uint64_t rank_write_bytes = 0;
  uint64_t node_write_bytes = 0;  // rank_write_bytes × ranks_per_node
  // rank_write_bytes × gpus: with kOnce unique_bytes, or up to gpus − 1 bytes
  // more where the shares were rounded up
  uint64_t job_write_bytes = 0;

  double stall_s = 0;  // rank_bytes / d2h bandwidth: the blocking copy of the whole state, what ckptd does
  // rank_write_bytes / d2h bandwidth: the copy if a rank copied only its
  // share. ckptd does not (the memory tier keeps the whole state); stated to
  // compare, never used for δ. stall_s with kEvery.
  double share_copy_s = 0;
  double persist_s = 0;  // node_write_bytes / write bandwidth (uncompressed)
  double job_mtbf_s = 0;
  // δ = stall_s: the slowdown of steps while a persist is in flight is not
  // modelled offline (the live policy measures it).
  double delta_s = 0;
  IntervalDecision interval;  // Daly for (δ, M), never under persist_s
};

// kInvalidArgument naming the input and value when it is out of range: params
// whole in 1..kMaxPlanParams; gpus ≥ 1; bandwidths, the failure rate, restart
// and alternative in the ranges above; zero in 0..3; tp, pp, gpus_per_node
// ≥ 1; gpus a multiple of tp·pp; gpu_memory_bytes ≥ 1; dtype and optimizer
// known; replicated kOnce or kEvery. kOutOfRange when a byte figure would be over kMaxPlanBytes,
// naming the figure and MaxPlanParams.
absl::StatusOr<Plan> PlanCheckpoint(const PlanInputs& in);

// The most parameters whose plan's byte figures all fit kMaxPlanBytes, for
// the other inputs of `in` (its params ignored); at most kMaxPlanParams.
// REQUIRES: the other inputs valid (as PlanCheckpoint checks).
uint64_t MaxPlanParams(const PlanInputs& in);

}  // namespace ckptd::policy
