// Writes the seed corpora of the fuzz targets:
//   <out>/shard/*.shard      valid shard files (fuzz_shard_reader)
//   <out>/manifest/*         valid MANIFEST files (fuzz_manifest)
// Shards are written with WriteShard into an in-memory file system and copied
// out; each is read back and compared before it is kept. Every seed stays
// under 64 KiB (run.sh passes -max_len=65536).
//
// usage: fuzz_make_corpus <out-dir>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "ckptd/v1/manifest.pb.h"
#include "ckptd/v1/shard.pb.h"
#include "format/tensor_size.h"
#include "storage/codec.h"
#include "storage/file_system.h"
#include "storage/manifest.h"
#include "storage/mem_file_system.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"

namespace {

using ckptd::storage::TensorSource;

constexpr size_t kMaxSeedBytes = 65536;

struct Tensor {
  ckptd::v1::Tensor meta;
  std::vector<uint8_t> data;
};

Tensor Make(std::string name, ckptd::v1::Component component, ckptd::v1::DType dtype, std::vector<uint64_t> shape) {
  Tensor t;
  t.meta.set_name(std::move(name));
  t.meta.set_component(component);
  t.meta.set_dtype(dtype);
  uint64_t n = ckptd::format::DTypeSize(dtype);
  for (uint64_t d : shape) {
    t.meta.add_shape(d);
    n *= d;
  }
  t.data.resize(n);
  return t;
}

// Smooth values (a compressible exponent plane, noisy low mantissa bytes).
void FillFloat32(Tensor& t, double scale) {
  std::mt19937 rng(7);
  std::normal_distribution<float> noise(0.0f, 0.01f);
  for (size_t i = 0; i < t.data.size() / 4; ++i) {
    float v = static_cast<float>(scale * std::sin(0.01 * static_cast<double>(i))) + noise(rng);
    std::memcpy(&t.data[4 * i], &v, 4);
  }
}
// bfloat16 / float16 bit patterns from float32 (truncated; fine for seeds).
void FillHalf(Tensor& t, bool bf16) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  for (size_t i = 0; i < t.data.size() / 2; ++i) {
    float v = dist(rng);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    uint16_t h;
    if (bf16) {
      h = static_cast<uint16_t>(bits >> 16);
    } else {
      // sign | 5-bit exponent | 10-bit mantissa, small normal values only.
      const uint32_t sign = bits >> 31;
      int exp = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
      if (exp < 1) exp = 1;
      if (exp > 30) exp = 30;
      h = static_cast<uint16_t>((sign << 15) | (static_cast<uint32_t>(exp) << 10) | ((bits >> 13) & 0x3ff));
    }
    std::memcpy(&t.data[2 * i], &h, 2);
  }
}
void FillText(Tensor& t) {
  static constexpr absl::string_view kText = "rng state: mt19937 seed=1234 position=";
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<uint8_t>(kText[i % kText.size()] + (i / 997) % 3);
}
void FillRandom(Tensor& t, uint32_t seed) {
  std::mt19937 rng(seed);
  for (uint8_t& b : t.data) b = static_cast<uint8_t>(rng());
}
void FillCounting(Tensor& t) {
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<uint8_t>(i * 7 + i / 8);
}

bool WriteFile(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz_make_corpus: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

// Writes one shard through WriteShard, reads it back, and copies it to `dir`.
bool MakeShard(ckptd::storage::MemFileSystem& fs, const std::filesystem::path& dir, const std::string& name,
               uint32_t rank, uint32_t world_size, std::vector<Tensor> tensors, bool compress) {
  std::vector<TensorSource> sources;
  for (const Tensor& t : tensors) sources.push_back({t.meta, t.data.data(), t.data.size()});
  ckptd::storage::ShardIdentity id{"corpus-job", 100, rank, world_size};
  ckptd::storage::ShardWriteOptions options;
  options.encode.compress = compress;
  options.block_bytes = 4096;  // the smallest block: several blocks per tensor
  options.threads = 2;
  options.direct_io = false;
  const std::string path = absl::StrCat("/seeds/", name);
  absl::StatusOr<ckptd::storage::ShardWriteResult> written =
      ckptd::storage::WriteShard(&fs, path, id, sources, options);
  if (!written.ok()) {
    std::fprintf(stderr, "fuzz_make_corpus: %s: %s\n", name.c_str(), written.status().ToString().c_str());
    return false;
  }

  // Read it back: the seed must be a valid shard holding exactly the data.
  ckptd::storage::ShardReadOptions ro;
  ro.threads = 1;
  ro.direct_io = false;
  auto reader = ckptd::storage::ShardReader::Open(&fs, path, ro);
  if (!reader.ok()) {
    std::fprintf(stderr, "fuzz_make_corpus: %s: %s\n", name.c_str(), reader.status().ToString().c_str());
    return false;
  }
  auto problems = (*reader)->Verify();
  if (!problems.ok() || !problems->empty()) {
    std::fprintf(stderr, "fuzz_make_corpus: %s does not verify\n", name.c_str());
    return false;
  }
  std::vector<std::vector<uint8_t>> back(tensors.size());
  std::vector<ckptd::storage::TensorDest> dests;
  for (size_t i = 0; i < tensors.size(); ++i) {
    back[i].resize(tensors[i].data.size());
    dests.push_back({tensors[i].meta.name(), back[i].data(), back[i].size()});
  }
  if (absl::Status s = (*reader)->ReadTensors(dests); !s.ok()) {
    std::fprintf(stderr, "fuzz_make_corpus: %s: %s\n", name.c_str(), s.ToString().c_str());
    return false;
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (back[i] != tensors[i].data) {
      std::fprintf(stderr, "fuzz_make_corpus: %s: tensor %s reads back different\n", name.c_str(),
                   tensors[i].meta.name().c_str());
      return false;
    }
  }

  absl::StatusOr<std::string> bytes = ckptd::storage::ReadFileToString(&fs, path);
  if (!bytes.ok()) {
    std::fprintf(stderr, "fuzz_make_corpus: %s: %s\n", name.c_str(), bytes.status().ToString().c_str());
    return false;
  }
  if (bytes->size() > kMaxSeedBytes) {
    std::fprintf(stderr, "fuzz_make_corpus: %s is %zu bytes, more than the fuzzers' -max_len %zu\n",
                 name.c_str(), bytes->size(), kMaxSeedBytes);
    return false;
  }
  int zstd = 0, raw = 0, blocks = 0;
  for (const auto& t : (*reader)->index().tensors()) {
    for (const auto& b : t.blocks()) {
      ++blocks;
      for (const auto& c : b.chunks()) (c.codec() == ckptd::v1::ZSTD ? zstd : raw)++;
    }
  }
  std::printf("  shard/%-24s %6zu bytes, %zu tensors, %d blocks, %d zstd + %d raw chunks\n", name.c_str(),
              bytes->size(), tensors.size(), blocks, zstd, raw);
  return WriteFile(dir / name, *bytes);
}

bool MakeManifest(const std::filesystem::path& dir, const std::string& name, uint32_t world_size, bool metadata) {
  ckptd::v1::StepManifest m;
  m.set_format_version(ckptd::storage::kManifestFormatVersion);
  m.set_job("corpus-job");
  m.set_step(100);
  m.set_world_size(world_size);
  m.set_committed_unix_nanos(1700000000123456789);
  for (uint32_t r = 0; r < world_size; ++r) {
    ckptd::v1::ShardRef* s = m.add_shards();
    s->set_rank(r);
    s->set_file(absl::StrCat("rank-", r, ".shard"));
    s->set_file_length(40960 + 4096 * r);
    s->set_index_xxh3(0x0123456789abcdefull ^ r);
    s->set_raw_bytes(6144 * (r + 1));
    s->set_stored_bytes(5000 * (r + 1));
    s->set_persist_seconds(0.25 * (r + 1));
  }
  if (metadata) {
    (*m.mutable_metadata())["source"] = "fuzz_make_corpus";
    (*m.mutable_metadata())["trainer"] = "demo";
  }
  const std::string bytes = ckptd::storage::EncodeManifest(m);
  if (absl::StatusOr<ckptd::v1::StepManifest> back = ckptd::storage::DecodeManifest(bytes, name); !back.ok()) {
    std::fprintf(stderr, "fuzz_make_corpus: %s: %s\n", name.c_str(), back.status().ToString().c_str());
    return false;
  }
  std::printf("  manifest/%-21s %6zu bytes, world %u\n", name.c_str(), bytes.size(), world_size);
  return WriteFile(dir / name, bytes);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <out-dir>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path out = argv[1];
  std::error_code ec;
  std::filesystem::create_directories(out / "shard", ec);
  std::filesystem::create_directories(out / "manifest", ec);
  if (ec) {
    std::fprintf(stderr, "fuzz_make_corpus: cannot create %s: %s\n", out.c_str(), ec.message().c_str());
    return 1;
  }

  ckptd::storage::MemFileSystem fs;
  if (absl::Status s = fs.CreateDir("/seeds"); !s.ok()) {
    std::fprintf(stderr, "fuzz_make_corpus: %s\n", s.ToString().c_str());
    return 1;
  }
  using ckptd::v1::BFLOAT16;
  using ckptd::v1::BOOL;
  using ckptd::v1::BYTES;
  using ckptd::v1::DATA_CURSOR;
  using ckptd::v1::FLOAT16;
  using ckptd::v1::FLOAT32;
  using ckptd::v1::FLOAT64;
  using ckptd::v1::FLOAT8_E4M3;
  using ckptd::v1::GRADS;
  using ckptd::v1::INT32;
  using ckptd::v1::INT64;
  using ckptd::v1::OPTIMIZER;
  using ckptd::v1::PARAMS;
  using ckptd::v1::RNG;
  using ckptd::v1::UINT8;

  bool ok = true;
  std::printf("fuzz_make_corpus: writing seeds to %s\n", out.c_str());
  const std::filesystem::path shard_dir = out / "shard";

  {  // fp32, compressed byte planes, two blocks (4096 + 2048 bytes), sharded.
    Tensor w = Make("layer0.weight", PARAMS, FLOAT32, {1536});
    w.meta.add_global_shape(3072);
    w.meta.add_offsets(1536);
    FillFloat32(w, 1.0);
    std::vector<Tensor> ts;
    ts.push_back(std::move(w));
    ok &= MakeShard(fs, shard_dir, "fp32_zstd.shard", 1, 2, std::move(ts), true);
  }
  {  // bf16, two planes per block, two blocks; on a CUDA device.
    Tensor g = Make("layer0.weight.grad", GRADS, BFLOAT16, {48, 64});
    g.meta.mutable_device()->set_kind(ckptd::v1::Device::CUDA);
    g.meta.mutable_device()->set_index(3);
    FillHalf(g, true);
    std::vector<Tensor> ts;
    ts.push_back(std::move(g));
    ok &= MakeShard(fs, shard_dir, "bf16.shard", 0, 1, std::move(ts), true);
  }
  {  // Opaque bytes: compressible (one zstd chunk per block) and random (raw).
    Tensor rng = Make("rng.cpu", RNG, BYTES, {5000});
    FillText(rng);
    Tensor cursor = Make("data.cursor", DATA_CURSOR, BYTES, {100});
    FillRandom(cursor, 3);
    std::vector<Tensor> ts;
    ts.push_back(std::move(rng));
    ts.push_back(std::move(cursor));
    ok &= MakeShard(fs, shard_dir, "bytes.shard", 0, 1, std::move(ts), true);
  }
  {  // Compression off: every chunk RAW, no filter.
    Tensor w = Make("w", PARAMS, FLOAT32, {2048});
    FillFloat32(w, 3.0);
    Tensor h = Make("h", PARAMS, FLOAT16, {100});
    FillHalf(h, false);
    std::vector<Tensor> ts;
    ts.push_back(std::move(w));
    ts.push_back(std::move(h));
    ok &= MakeShard(fs, shard_dir, "raw_codec.shard", 0, 1, std::move(ts), false);
  }
  {  // Many small tensors of every kind, an empty one and a scalar.
    std::vector<Tensor> ts;
    Tensor m = Make("adam.m", OPTIMIZER, FLOAT32, {4, 4});
    FillFloat32(m, 0.1);
    ts.push_back(std::move(m));
    Tensor h = Make("fp16", PARAMS, FLOAT16, {33});
    FillHalf(h, false);
    ts.push_back(std::move(h));
    Tensor step = Make("adam.step", OPTIMIZER, INT64, {10});
    FillCounting(step);
    ts.push_back(std::move(step));
    Tensor mask = Make("mask", PARAMS, BOOL, {7});
    FillCounting(mask);
    ts.push_back(std::move(mask));
    Tensor f8 = Make("f8", PARAMS, FLOAT8_E4M3, {9});
    FillRandom(f8, 5);
    ts.push_back(std::move(f8));
    Tensor d = Make("f64", OPTIMIZER, FLOAT64, {5});
    FillRandom(d, 6);
    ts.push_back(std::move(d));
    Tensor empty = Make("empty", PARAMS, FLOAT32, {0, 3});
    empty.meta.add_global_shape(4);
    empty.meta.add_global_shape(3);
    empty.meta.add_offsets(4);
    empty.meta.add_offsets(0);
    ts.push_back(std::move(empty));
    Tensor scalar = Make("scalar", DATA_CURSOR, INT32, {});
    FillCounting(scalar);
    ts.push_back(std::move(scalar));
    Tensor u8 = Make("u8", RNG, UINT8, {4096 + 17});  // two blocks, the first compressible
    FillText(u8);
    ts.push_back(std::move(u8));
    ok &= MakeShard(fs, shard_dir, "multi.shard", 2, 4, std::move(ts), true);
  }
  // No tensors at all: header block, index and footer only.
  ok &= MakeShard(fs, shard_dir, "empty.shard", 0, 1, {}, true);

  const std::filesystem::path manifest_dir = out / "manifest";
  ok &= MakeManifest(manifest_dir, "MANIFEST-world1", 1, false);
  ok &= MakeManifest(manifest_dir, "MANIFEST-world4", 4, true);

  if (!ok) {
    std::fprintf(stderr, "fuzz_make_corpus: FAILED\n");
    return 1;
  }
  return 0;
}
