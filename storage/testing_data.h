// Test data shared by the storage tests (and later components' tests):
// float-like tensors, random bytes, and a small deterministic rank state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"

namespace ckptd::testing {

using Bytes = std::vector<uint8_t>;

// `n` normal(0, stddev) fp32 values as little-endian bytes.
Bytes NormalFp32(size_t n, uint64_t seed, double stddev = 0.02);
// bf16 = the top half of each fp32.
Bytes ToBf16(const Bytes& fp32);
Bytes RandomBytes(size_t n, uint64_t seed);

// What one rank saves at one step: float parameters and an RNG blob, both
// deterministic in (step, rank) so that any step read back can be checked.
struct RankData {
  std::vector<float> params;
  std::string rng;
};
RankData MakeRankData(uint64_t step, uint32_t rank, size_t param_count, size_t rng_bytes);
// PARAMS (FLOAT32) and RNG (BYTES) tensors pointing into `d`.
std::vector<storage::TensorSource> RankSources(const RankData& d, absl::string_view params_name,
                                               absl::string_view rng_name);

// 4096-byte blocks, one encoder thread, two writes in flight: many blocks and
// few threads, for tests that count operations.
storage::ShardWriteOptions SmallBlocks();
storage::ShardReadOptions OneThread();

}  // namespace ckptd::testing
