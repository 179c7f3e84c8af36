#include "storage/testing_data.h"

#include <cstring>
#include <random>

namespace ckptd::testing {

Bytes NormalFp32(size_t n, uint64_t seed, double stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, static_cast<float>(stddev));
  Bytes out(n * 4);
  for (size_t i = 0; i < n; ++i) {
    float f = dist(rng);
    std::memcpy(&out[i * 4], &f, 4);
  }
  return out;
}

Bytes ToBf16(const Bytes& fp32) {
  Bytes out(fp32.size() / 2);
  for (size_t i = 0; i < fp32.size() / 4; ++i) {
    out[2 * i] = fp32[4 * i + 2];
    out[2 * i + 1] = fp32[4 * i + 3];
  }
  return out;
}

Bytes RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

RankData MakeRankData(uint64_t step, uint32_t rank, size_t param_count, size_t rng_bytes) {
  RankData d;
  d.params.resize(param_count);
  for (size_t i = 0; i < param_count; ++i) {
    d.params[i] = static_cast<float>((i * 7 + step * 13 + rank * 101) % 50) * 0.25f;
  }
  for (size_t i = 0; i < rng_bytes; ++i) {
    d.rng.push_back(static_cast<char>((i * 31 + step * 7 + rank) & 0xff));
  }
  return d;
}

std::vector<storage::TensorSource> RankSources(const RankData& d, absl::string_view params_name,
                                               absl::string_view rng_name) {
  std::vector<storage::TensorSource> out(2);
  out[0].meta.set_name(std::string(params_name));
  out[0].meta.set_component(ckptd::v1::PARAMS);
  out[0].meta.set_dtype(ckptd::v1::FLOAT32);
  out[0].meta.add_shape(d.params.size());
  out[0].data = d.params.data();
  out[0].length = d.params.size() * sizeof(float);
  out[1].meta.set_name(std::string(rng_name));
  out[1].meta.set_component(ckptd::v1::RNG);
  out[1].meta.set_dtype(ckptd::v1::BYTES);
  out[1].meta.add_shape(d.rng.size());
  out[1].data = d.rng.data();
  out[1].length = d.rng.size();
  return out;
}

storage::ShardWriteOptions SmallBlocks() {
  storage::ShardWriteOptions o;
  o.block_bytes = 4096;
  o.threads = 1;
  o.writes_in_flight = 2;
  return o;
}

storage::ShardReadOptions OneThread() {
  storage::ShardReadOptions o;
  o.threads = 1;
  return o;
}

}  // namespace ckptd::testing
