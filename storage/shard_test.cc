#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/aligned_buffer.h"
#include "base/status_macros.h"  // testing_matchers.h uses its CONCAT macro
#include "base/testing/matchers.h"
#include "base/thread_pool.h"
#include "format/checksum.h"
#include "format/tensor_size.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/codec.h"
#include "storage/fault_injection_file_system.h"
#include "storage/file_system.h"
#include "storage/layout.h"
#include "storage/mem_file_system.h"
#include "storage/posix_file_system.h"
#include "storage/shard_format.h"
#include "storage/shard_index.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"
#include "storage/testing_data.h"

namespace ckptd::storage {
namespace {

using ::ckptd::format::DTypeSize;
using ::ckptd::format::Xxh3;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::ckptd::v1::Component;
using ::ckptd::v1::DType;
using ::ckptd::v1::ShardIndex;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

using ::ckptd::testing::Bytes;

// ---- Test data ---------------------------------------------------------------

using ::ckptd::testing::NormalFp32;
using ::ckptd::testing::RandomBytes;
using ::ckptd::testing::ToBf16;

// Small gradients-like int64 values (compressible high bytes).
Bytes SmallInt64(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(-5000, 5000);
  Bytes out(n * 8);
  for (size_t i = 0; i < n; ++i) {
    int64_t v = dist(rng);
    std::memcpy(&out[i * 8], &v, 8);
  }
  return out;
}

struct TestTensor {
  ckptd::v1::Tensor meta;
  Bytes data;
};

ckptd::v1::Tensor Meta(const std::string& name, Component component, DType dtype,
                       std::vector<uint64_t> shape) {
  ckptd::v1::Tensor m;
  m.set_name(name);
  m.set_component(component);
  m.set_dtype(dtype);
  for (uint64_t d : shape) m.add_shape(d);
  return m;
}

void SetSharding(ckptd::v1::Tensor* m, std::vector<uint64_t> global, std::vector<uint64_t> offsets) {
  for (uint64_t d : global) m->add_global_shape(d);
  for (uint64_t d : offsets) m->add_offsets(d);
}

// Every component, several dtypes, a sharded tensor, a scalar, an empty tensor.
// `scale` multiplies the sizes of the large tensors.
std::vector<TestTensor> MakeTensors(uint64_t seed, size_t scale) {
  std::vector<TestTensor> t;
  {
    // This rank's slice of a [128, 300*scale] weight sharded along dim 0.
    TestTensor w{Meta("model.layers.0.attn.qkv.weight", ckptd::v1::PARAMS, ckptd::v1::FLOAT32,
                      {64, 300 * scale}),
                 NormalFp32(64 * 300 * scale, seed + 1)};
    SetSharding(&w.meta, {128, 300 * scale}, {64, 0});
    w.meta.mutable_device()->set_kind(ckptd::v1::Device::CUDA);
    w.meta.mutable_device()->set_index(3);
    t.push_back(std::move(w));
  }
  t.push_back({Meta("model.layers.0.norm.bias", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, {300}),
               NormalFp32(300, seed + 2)});
  {
    TestTensor m{Meta("optimizer.exp_avg.model.layers.0.attn.qkv.weight", ckptd::v1::OPTIMIZER,
                      ckptd::v1::BFLOAT16, {64, 100 * scale}),
                 ToBf16(NormalFp32(64 * 100 * scale, seed + 3))};
    SetSharding(&m.meta, {64, 400 * scale}, {0, 100 * scale});
    t.push_back(std::move(m));
  }
  t.push_back({Meta("optimizer.step", ckptd::v1::OPTIMIZER, ckptd::v1::INT64, {}), SmallInt64(1, seed + 4)});
  t.push_back({Meta("grads.model.layers.0.counts", ckptd::v1::GRADS, ckptd::v1::INT64, {1000 * scale}),
               SmallInt64(1000 * scale, seed + 5)});
  t.push_back({Meta("rng.cuda_state", ckptd::v1::RNG, ckptd::v1::BYTES, {5000}), RandomBytes(5000, seed + 6)});
  t.push_back({Meta("data.cursor", ckptd::v1::DATA_CURSOR, ckptd::v1::BYTES, {24}), RandomBytes(24, seed + 7)});
  t.push_back({Meta("model.empty", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, {0, 16}), Bytes{}});
  return t;
}

// A few small tensors: with 4 KiB blocks the file is about 60 KiB, small
// enough to corrupt at every byte.
std::vector<TestTensor> SmallTensors(uint64_t seed) {
  std::vector<TestTensor> t;
  TestTensor w{Meta("w", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, {24, 64}), NormalFp32(24 * 64, seed + 1)};
  SetSharding(&w.meta, {48, 64}, {24, 0});
  t.push_back(std::move(w));  // 6144 bytes: two blocks
  t.push_back({Meta("m", ckptd::v1::OPTIMIZER, ckptd::v1::BFLOAT16, {700}), ToBf16(NormalFp32(700, seed + 2))});
  t.push_back({Meta("g", ckptd::v1::GRADS, ckptd::v1::INT64, {40}), SmallInt64(40, seed + 3)});
  t.push_back({Meta("rng", ckptd::v1::RNG, ckptd::v1::BYTES, {100}), RandomBytes(100, seed + 4)});
  t.push_back({Meta("cursor", ckptd::v1::DATA_CURSOR, ckptd::v1::BYTES, {16}), RandomBytes(16, seed + 5)});
  t.push_back({Meta("empty", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, {0}), Bytes{}});
  return t;
}

std::vector<TensorSource> Sources(const std::vector<TestTensor>& tensors) {
  std::vector<TensorSource> out;
  for (const TestTensor& t : tensors) out.push_back({t.meta, t.data.data(), t.data.size()});
  return out;
}

ShardIdentity Identity() { return {"llama-test", 1200, 3, 8}; }

ShardWriteOptions SmallBlocks(bool compress = true) {
  ShardWriteOptions o;
  o.block_bytes = 4096;
  o.encode.compress = compress;
  o.writes_in_flight = 3;
  return o;
}

// ---- Reading helpers ---------------------------------------------------------

// Reads every tensor of `tensors` by name into fresh buffers filled with 0xCC.
absl::StatusOr<std::vector<Bytes>> ReadAll(ShardReader& reader, const std::vector<TestTensor>& tensors) {
  std::vector<Bytes> out(tensors.size());
  std::vector<TensorDest> dests;
  for (size_t i = 0; i < tensors.size(); ++i) {
    out[i].assign(tensors[i].data.size(), 0xCC);
    dests.push_back({tensors[i].meta.name(), out[i].data(), out[i].size()});
  }
  CKPTD_RETURN_IF_ERROR(reader.ReadTensors(dests));
  return out;
}

void ExpectSameData(const std::vector<Bytes>& got, const std::vector<TestTensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(got[i] == want[i].data) << "tensor " << want[i].meta.name() << " differs";
  }
}

// Opens `path`, checks Verify finds nothing and every tensor reads back.
void ExpectReadsBack(FileSystem* fs, const std::string& path, const std::vector<TestTensor>& tensors,
                     base::ThreadPool* pool, const ShardReadOptions& options = {}) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, ShardReader::Open(fs, path, options, pool));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<VerifyProblem> problems, reader->Verify());
  EXPECT_THAT(problems, IsEmpty());
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<Bytes> got, ReadAll(*reader, tensors));
  ExpectSameData(got, tensors);
}

std::vector<std::string> Names(FileSystem* fs, const std::string& dir) {
  std::vector<std::string> names;
  absl::StatusOr<std::vector<FileInfo>> entries = fs->ListDir(dir);
  EXPECT_THAT(entries.status(), IsOk());
  if (entries.ok()) {
    for (const FileInfo& e : *entries) names.push_back(e.name);
  }
  return names;
}

bool Exists(FileSystem* fs, const std::string& path) { return fs->Stat(path).ok(); }

// Failures recorded so far in the running test, to stop long loops early.
int FailureCount() {
  return ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
}

// ---- File layout -------------------------------------------------------------

struct ChunkRange {
  int tensor = 0;
  int block = 0;
  int chunk = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct FileLayout {
  ShardFooter footer;
  std::vector<ChunkRange> chunks;
  // Bytes some checksum covers: header, chunks' stored bytes, index, footer.
  // The rest is alignment padding.
  std::vector<bool> covered;
};

void ComputeLayout(const std::string& file, const ShardIndex& index, FileLayout* layout) {
  ASSERT_GE(file.size(), kShardHeaderBlock + kShardAlignment);
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(file.data());
  CKPTD_ASSERT_OK_AND_ASSIGN(layout->footer,
                             DecodeShardFooter(bytes + file.size() - kShardFooterBytes, file.size(), "layout"));
  layout->covered.assign(file.size(), false);
  auto cover = [&](uint64_t offset, uint64_t length) {
    ASSERT_LE(offset + length, file.size());
    for (uint64_t i = offset; i < offset + length; ++i) {
      ASSERT_FALSE(layout->covered[i]) << "byte " << i << " belongs to two parts of the file";
      layout->covered[i] = true;
    }
  };
  cover(0, kShardHeaderBytes);
  for (int t = 0; t < index.tensors_size(); ++t) {
    for (int b = 0; b < index.tensors(t).blocks_size(); ++b) {
      const ckptd::v1::Block& block = index.tensors(t).blocks(b);
      for (int c = 0; c < block.chunks_size(); ++c) {
        const ckptd::v1::Chunk& chunk = block.chunks(c);
        layout->chunks.push_back({t, b, c, chunk.file_offset(), chunk.stored_length()});
        cover(chunk.file_offset(), chunk.stored_length());
      }
    }
  }
  cover(layout->footer.index_offset, layout->footer.index_length);
  cover(file.size() - kShardFooterBytes, kShardFooterBytes);
}

// `file` with its index replaced by `serialized`, and a footer whose
// checksum and lengths match the new index.
std::string WithIndexBytes(const std::string& file, const ShardFooter& footer, const std::string& serialized) {
  std::string out = file.substr(0, footer.index_offset);
  ShardFooter f = footer;
  f.index_length = serialized.size();
  f.index_xxh3 = Xxh3(serialized);
  f.file_length = footer.index_offset + base::AlignUp(serialized.size() + kShardFooterBytes, kShardAlignment);
  out += serialized;
  out.resize(f.file_length, '\0');
  EncodeShardFooter(f, reinterpret_cast<uint8_t*>(out.data()) + out.size() - kShardFooterBytes);
  return out;
}

std::string WithIndex(const std::string& file, const ShardFooter& footer, const ShardIndex& index) {
  return WithIndexBytes(file, footer, index.SerializeAsString());
}

// `file` with its footer replaced by `footer`, checksum recomputed.
std::string WithFooter(std::string file, const ShardFooter& footer) {
  EncodeShardFooter(footer, reinterpret_cast<uint8_t*>(file.data()) + file.size() - kShardFooterBytes);
  return file;
}

// ---- Round trip --------------------------------------------------------------

// Checks the index against what was written.
void ExpectIndexDescribes(const ShardReader& reader, const std::vector<TestTensor>& tensors,
                          const ShardIdentity& identity, const ShardWriteResult& result,
                          const ShardWriteOptions& options) {
  const ShardIndex& index = reader.index();
  // Version 1: nothing here needs version 2 (docs/format.md §5).
  EXPECT_EQ(index.format_version(), kOldestShardFormatVersion);
  EXPECT_EQ(index.job(), identity.job);
  EXPECT_EQ(index.step(), identity.step);
  EXPECT_EQ(index.rank(), identity.rank);
  EXPECT_EQ(index.world_size(), identity.world_size);
  EXPECT_EQ(index.alignment(), kShardAlignment);
  EXPECT_GT(index.created_unix_nanos(), 0);
  ASSERT_EQ(index.tensors_size(), static_cast<int>(tensors.size()));

  uint64_t raw = 0;
  uint64_t stored = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ckptd::v1::Tensor& got = index.tensors(static_cast<int>(i));
    SCOPED_TRACE(got.name());
    // Everything the caller gave, sharding and device included, is kept as is.
    ckptd::v1::Tensor meta = got;
    meta.clear_blocks();
    meta.clear_raw_length();
    EXPECT_EQ(meta.DebugString(), tensors[i].meta.DebugString());
    EXPECT_EQ(reader.FindTensor(tensors[i].meta.name()), &got);
    EXPECT_EQ(got.raw_length(), tensors[i].data.size());
    raw += got.raw_length();

    const uint64_t block_bytes = options.block_bytes;
    EXPECT_EQ(static_cast<uint64_t>(got.blocks_size()), (got.raw_length() + block_bytes - 1) / block_bytes);
    for (int b = 0; b < got.blocks_size(); ++b) {
      const ckptd::v1::Block& block = got.blocks(b);
      EXPECT_EQ(block.raw_offset(), b * block_bytes);
      EXPECT_EQ(block.raw_length(), std::min<uint64_t>(block_bytes, got.raw_length() - b * block_bytes));
      EXPECT_EQ(block.raw_xxh3(), Xxh3(tensors[i].data.data() + block.raw_offset(), block.raw_length()));
      if (!options.encode.compress) {
        EXPECT_EQ(block.filter(), ckptd::v1::FILTER_NONE);
        ASSERT_EQ(block.chunks_size(), 1);
        EXPECT_EQ(block.chunks(0).codec(), ckptd::v1::RAW);
      } else if (UsesBytePlanes(got.dtype())) {
        EXPECT_EQ(block.filter(), ckptd::v1::BYTE_PLANES);
        EXPECT_EQ(static_cast<size_t>(block.chunks_size()), DTypeSize(got.dtype()));
      }
      for (const ckptd::v1::Chunk& c : block.chunks()) {
        EXPECT_EQ(c.file_offset() % kShardAlignment, 0u);
        EXPECT_GE(c.file_offset(), kShardHeaderBlock);
        stored += c.stored_length();
      }
    }
  }
  EXPECT_EQ(index.raw_bytes(), raw);
  EXPECT_EQ(index.stored_bytes(), stored);
  EXPECT_EQ(result.raw_bytes, raw);
  EXPECT_EQ(result.stored_bytes, stored);
  if (options.encode.compress) {
    // Normal fp32/bf16 exponents and small int64 values compress.
    EXPECT_LT(stored, raw);
  } else {
    EXPECT_EQ(stored, raw);
  }
  EXPECT_EQ(result.file_length, reader.file_length());
  EXPECT_EQ(result.file_length % kShardAlignment, 0u);
  EXPECT_EQ(result.index_xxh3, reader.index_xxh3());
  EXPECT_EQ(reader.FindTensor("no.such.tensor"), nullptr);
}

struct RoundTripParam {
  bool compress;
  size_t block_bytes;
};

std::string RoundTripName(const ::testing::TestParamInfo<RoundTripParam>& info) {
  return absl::StrCat(info.param.compress ? "Compressed" : "Raw", "Blocks", info.param.block_bytes);
}

class MemRoundTripTest : public ::testing::TestWithParam<RoundTripParam> {};

TEST_P(MemRoundTripTest, WritesReadsAndVerifies) {
  MemFileSystem fs;
  base::ThreadPool pool(4);
  const std::string dir = "/ckpt/llama-test/step-1200";
  CKPTD_ASSERT_OK(CreateDirs(&fs, dir));
  const std::string path = JoinPath(dir, ShardFileName(3));

  const std::vector<TestTensor> tensors = MakeTensors(11, /*scale=*/4);
  ShardWriteOptions options = SmallBlocks(GetParam().compress);
  options.block_bytes = GetParam().block_bytes;
  CKPTD_ASSERT_OK_AND_ASSIGN(ShardWriteResult result,
                             WriteShard(&fs, path, Identity(), Sources(tensors), options, &pool));
  EXPECT_EQ(result.path, path);
  // The weight spans many blocks at either block size.
  EXPECT_GE(tensors[0].data.size() / options.block_bytes, 4u);

  EXPECT_THAT(Names(&fs, dir), ::testing::ElementsAre(ShardFileName(3)));
  CKPTD_ASSERT_OK_AND_ASSIGN(FileInfo info, fs.Stat(path));
  EXPECT_EQ(info.size, result.file_length);

  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, ShardReader::Open(&fs, path, {}, &pool));
  EXPECT_EQ(reader->path(), path);
  ExpectIndexDescribes(*reader, tensors, Identity(), result, options);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<VerifyProblem> problems, reader->Verify());
  EXPECT_THAT(problems, IsEmpty());
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<Bytes> got, ReadAll(*reader, tensors));
  ExpectSameData(got, tensors);
  // A reader can be read again.
  CKPTD_ASSERT_OK_AND_ASSIGN(got, ReadAll(*reader, tensors));
  ExpectSameData(got, tensors);

  // Padding (between chunks, after the header and before the footer) is zero.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string file, ReadFileToString(&fs, path));
  FileLayout layout;
  ASSERT_NO_FATAL_FAILURE(ComputeLayout(file, reader->index(), &layout));
  EXPECT_EQ(layout.footer.index_xxh3, result.index_xxh3);
  for (size_t i = 0; i < file.size(); ++i) {
    if (!layout.covered[i] && file[i] != '\0') {
      ADD_FAILURE() << "padding byte " << i << " is not zero";
      break;
    }
  }
}

TEST_P(MemRoundTripTest, OwnThreadPoolsWhenNoneIsPassed) {
  MemFileSystem fs;
  const std::string path = "/rank-0.shard";
  const std::vector<TestTensor> tensors = MakeTensors(12, 1);
  ShardWriteOptions options = SmallBlocks(GetParam().compress);
  options.block_bytes = GetParam().block_bytes;
  options.threads = 2;
  options.writes_in_flight = 1;
  CKPTD_ASSERT_OK(WriteShard(&fs, path, Identity(), Sources(tensors), options).status());
  ShardReadOptions read;
  read.threads = 3;
  read.reads_in_flight = 1;
  ExpectReadsBack(&fs, path, tensors, nullptr, read);
}

INSTANTIATE_TEST_SUITE_P(Options, MemRoundTripTest,
                         ::testing::Values(RoundTripParam{true, 4096}, RoundTripParam{false, 4096},
                                           RoundTripParam{true, 64 << 10}, RoundTripParam{false, 64 << 10}),
                         RoundTripName);

TEST(ShardTest, EmptyShardRoundTrips) {
  MemFileSystem fs;
  base::ThreadPool pool(2);
  CKPTD_ASSERT_OK_AND_ASSIGN(ShardWriteResult result,
                             WriteShard(&fs, "/rank-0.shard", {"j", 1, 0, 1}, {}, SmallBlocks(), &pool));
  EXPECT_EQ(result.file_length, kShardHeaderBlock + kShardAlignment);
  EXPECT_EQ(result.raw_bytes, 0u);
  EXPECT_EQ(result.stored_bytes, 0u);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader,
                             ShardReader::Open(&fs, "/rank-0.shard", {}, &pool));
  EXPECT_EQ(reader->index().tensors_size(), 0);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<VerifyProblem> problems, reader->Verify());
  EXPECT_THAT(problems, IsEmpty());
  CKPTD_EXPECT_OK(reader->ReadTensors({}));
}

TEST(ShardTest, OnlyEmptyTensors) {
  MemFileSystem fs;
  base::ThreadPool pool(2);
  std::vector<TestTensor> tensors;
  tensors.push_back({Meta("a", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, {0}), Bytes{}});
  tensors.push_back({Meta("b", ckptd::v1::RNG, ckptd::v1::BYTES, {0}), Bytes{}});
  CKPTD_ASSERT_OK_AND_ASSIGN(ShardWriteResult result,
                             WriteShard(&fs, "/s", Identity(), Sources(tensors), SmallBlocks(), &pool));
  EXPECT_EQ(result.raw_bytes, 0u);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, ShardReader::Open(&fs, "/s", {}, &pool));
  ASSERT_EQ(reader->index().tensors_size(), 2);
  EXPECT_EQ(reader->index().tensors(0).blocks_size(), 0);
  // A zero-length tensor needs no buffer.
  CKPTD_EXPECT_OK(reader->ReadTensors({TensorDest{"a", nullptr, 0}, TensorDest{"b", nullptr, 0}}));
}

TEST(ShardTest, OverwritesAnExistingShard) {
  MemFileSystem fs;
  base::ThreadPool pool(2);
  const std::vector<TestTensor> first = MakeTensors(1, 1);
  const std::vector<TestTensor> second = SmallTensors(2);
  CKPTD_ASSERT_OK(WriteShard(&fs, "/s", Identity(), Sources(first), SmallBlocks(), &pool).status());
  CKPTD_ASSERT_OK(WriteShard(&fs, "/s", Identity(), Sources(second), SmallBlocks(), &pool).status());
  ExpectReadsBack(&fs, "/s", second, &pool);
  EXPECT_THAT(Names(&fs, "/"), ::testing::ElementsAre("s"));
}

TEST(ShardTest, TensorNamesWithOddBytesRoundTripOrAreRejected) {
  // Proto3 string fields must be UTF-8: a name that is not must either be
  // refused by the writer or read back, never produce a shard that the reader
  // then calls corrupt.
  MemFileSystem fs;
  base::ThreadPool pool(2);
  std::vector<TestTensor> tensors;
  tensors.push_back({Meta("layer\xff\xfe.weight", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, {4}), NormalFp32(4, 1)});
  absl::StatusOr<ShardWriteResult> written =
      WriteShard(&fs, "/odd", Identity(), Sources(tensors), SmallBlocks(), &pool);
  if (!written.ok()) {
    EXPECT_THAT(written.status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer")));
    EXPECT_FALSE(Exists(&fs, "/odd"));
    EXPECT_FALSE(Exists(&fs, "/odd.tmp"));
    return;
  }
  ExpectReadsBack(&fs, "/odd", tensors, &pool);

  // A newline and a quote are valid UTF-8 and must simply round trip.
  MemFileSystem fs2;
  std::vector<TestTensor> ok;
  ok.push_back({Meta("a\n'b'\x01", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, {4}), NormalFp32(4, 1)});
  CKPTD_ASSERT_OK(WriteShard(&fs2, "/ok", Identity(), Sources(ok), SmallBlocks(), &pool).status());
  ExpectReadsBack(&fs2, "/ok", ok, &pool);
}

TEST(ShardTest, WriterAndReaderAgreeOnAllDTypes) {
  MemFileSystem fs;
  base::ThreadPool pool(2);
  std::vector<TestTensor> tensors;
  int i = 0;
  for (DType d : {ckptd::v1::BYTES, ckptd::v1::FLOAT32, ckptd::v1::BFLOAT16, ckptd::v1::FLOAT16,
                  ckptd::v1::FLOAT64, ckptd::v1::INT8, ckptd::v1::UINT8, ckptd::v1::INT16, ckptd::v1::INT32,
                  ckptd::v1::INT64, ckptd::v1::BOOL, ckptd::v1::FLOAT8_E4M3, ckptd::v1::FLOAT8_E5M2}) {
    // An odd element count, so the last block is short and not a multiple of 8.
    const size_t n = 1531;
    Bytes data = d == ckptd::v1::FLOAT32 ? NormalFp32(n, i)
                 : (d == ckptd::v1::BFLOAT16 || d == ckptd::v1::FLOAT16)
                     ? ToBf16(NormalFp32(n, i))
                     : RandomBytes(n * DTypeSize(d), i);
    tensors.push_back({Meta(absl::StrCat("t", i++), ckptd::v1::PARAMS, d, {n}), std::move(data)});
  }
  CKPTD_ASSERT_OK(WriteShard(&fs, "/s", Identity(), Sources(tensors), SmallBlocks(), &pool).status());
  ExpectReadsBack(&fs, "/s", tensors, &pool);
}

// ---- Real file system ----------------------------------------------------------

std::string MakeTempDir(std::string tmpl) {
  if (mkdtemp(tmpl.data()) == nullptr) return "";
  return tmpl;
}

class PosixShardTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {
 protected:
  void SetUp() override {
    PosixFileSystemOptions options;
    options.use_io_uring = std::get<0>(GetParam());
    fs_ = NewPosixFileSystem(options);
    if (options.use_io_uring && !fs_->uses_io_uring()) GTEST_SKIP() << "io_uring is not available here";
    dir_ = MakeTempDir(JoinPath(::testing::TempDir(), "shard_test_XXXXXX"));
    ASSERT_FALSE(dir_.empty()) << "mkdtemp: " << std::strerror(errno);
  }
  void TearDown() override {
    if (!dir_.empty()) {
      EXPECT_THAT(RemoveTree(fs_.get(), dir_), IsOk());
    }
  }

  std::unique_ptr<PosixFileSystem> fs_;
  std::string dir_;
};

std::string PosixName(const ::testing::TestParamInfo<std::tuple<bool, bool>>& info) {
  return absl::StrCat(std::get<0>(info.param) ? "IoUring" : "Pread", std::get<1>(info.param) ? "Compressed" : "Raw");
}

TEST_P(PosixShardTest, WritesReadsAndVerifies) {
  base::ThreadPool pool(4);
  const std::string path = JoinPath(dir_, ShardFileName(3));
  const std::vector<TestTensor> tensors = MakeTensors(21, /*scale=*/4);
  ShardWriteOptions options = SmallBlocks(std::get<1>(GetParam()));
  options.block_bytes = 64 << 10;
  CKPTD_ASSERT_OK_AND_ASSIGN(ShardWriteResult result,
                             WriteShard(fs_.get(), path, Identity(), Sources(tensors), options, &pool));
  EXPECT_THAT(Names(fs_.get(), dir_), ::testing::ElementsAre(ShardFileName(3)));
  CKPTD_ASSERT_OK_AND_ASSIGN(FileInfo info, fs_->Stat(path));
  EXPECT_EQ(info.size, result.file_length);

  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "O_DIRECT" : "buffered");
    ShardReadOptions read;
    read.direct_io = direct;
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, ShardReader::Open(fs_.get(), path, read, &pool));
    ExpectIndexDescribes(*reader, tensors, Identity(), result, options);
    CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<VerifyProblem> problems, reader->Verify());
    EXPECT_THAT(problems, IsEmpty());
    CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<Bytes> got, ReadAll(*reader, tensors));
    ExpectSameData(got, tensors);
  }
}

TEST_P(PosixShardTest, SmallBlocksBufferedWrites) {
  base::ThreadPool pool(3);
  const std::string path = JoinPath(dir_, ShardFileName(0));
  const std::vector<TestTensor> tensors = MakeTensors(22, 1);
  ShardWriteOptions options = SmallBlocks(std::get<1>(GetParam()));
  options.direct_io = false;
  CKPTD_ASSERT_OK(WriteShard(fs_.get(), path, Identity(), Sources(tensors), options, &pool).status());
  ExpectReadsBack(fs_.get(), path, tensors, &pool);
  EXPECT_THAT(Names(fs_.get(), dir_), ::testing::ElementsAre(ShardFileName(0)));
}

TEST_P(PosixShardTest, DetectsCorruptionOnDisk) {
  base::ThreadPool pool(2);
  const std::string path = JoinPath(dir_, ShardFileName(0));
  const std::vector<TestTensor> tensors = SmallTensors(23);
  CKPTD_ASSERT_OK(WriteShard(fs_.get(), path, Identity(), Sources(tensors), SmallBlocks(), &pool).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string file, ReadFileToString(fs_.get(), path));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, ShardReader::Open(fs_.get(), path, {}, &pool));
  const ckptd::v1::Chunk chunk = reader->index().tensors(0).blocks(1).chunks(2);
  reader.reset();
  file[chunk.file_offset() + chunk.stored_length() / 2] ^= 0x10;
  CKPTD_ASSERT_OK(WriteFileAtomically(fs_.get(), path, file));
  CKPTD_ASSERT_OK_AND_ASSIGN(reader, ShardReader::Open(fs_.get(), path, {}, &pool));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<VerifyProblem> problems, reader->Verify());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].tensor, "w");
  EXPECT_EQ(problems[0].block, 1);
  EXPECT_EQ(problems[0].chunk, 2);
  EXPECT_THAT(problems[0].message, HasSubstr(path));
}

INSTANTIATE_TEST_SUITE_P(Modes, PosixShardTest, ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         PosixName);

// ---- ReadTensors errors ----------------------------------------------------------

class ShardReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tensors_ = MakeTensors(31, 1);
    CKPTD_ASSERT_OK(WriteShard(&fs_, path_, Identity(), Sources(tensors_), SmallBlocks(), &pool_).status());
    CKPTD_ASSERT_OK_AND_ASSIGN(reader_, ShardReader::Open(&fs_, path_, {}, &pool_));
  }

  MemFileSystem fs_;
  base::ThreadPool pool_{3};
  const std::string path_ = "/rank-3.shard";
  std::vector<TestTensor> tensors_;
  std::unique_ptr<ShardReader> reader_;
};

TEST_F(ShardReadTest, UnknownTensorIsNotFound) {
  Bytes buf(16);
  EXPECT_THAT(reader_->ReadTensors({TensorDest{"model.nope", buf.data(), buf.size()}}),
              StatusIs(absl::StatusCode::kNotFound, AllOf(HasSubstr("'model.nope'"), HasSubstr(path_))));
  // Even after valid names.
  Bytes cursor(24);
  EXPECT_THAT(reader_->ReadTensors({TensorDest{"data.cursor", cursor.data(), cursor.size()},
                                    TensorDest{"data.cursor2", cursor.data(), cursor.size()}}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'data.cursor2'")));
  // Names are exact.
  EXPECT_THAT(reader_->ReadTensors({TensorDest{"Data.Cursor", cursor.data(), cursor.size()}}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'Data.Cursor'")));
}

TEST_F(ShardReadTest, WrongBufferLengthIsInvalidArgument) {
  const TestTensor& t = tensors_[0];
  for (size_t len : {t.data.size() - 1, t.data.size() + 1, size_t{0}, t.data.size() * 2}) {
    SCOPED_TRACE(len);
    Bytes buf(len + 1);
    EXPECT_THAT(reader_->ReadTensors({TensorDest{t.meta.name(), buf.data(), len}}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(absl::StrCat("'", t.meta.name(), "'")),
                               HasSubstr(absl::StrCat("is ", t.data.size(), " bytes")),
                               HasSubstr(absl::StrCat("buffer is ", len, " bytes")), HasSubstr(path_))));
  }
  // A non-empty tensor without a buffer.
  EXPECT_THAT(reader_->ReadTensors({TensorDest{"data.cursor", nullptr, 24}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'data.cursor'")));
}

TEST_F(ShardReadTest, ReadsASubset) {
  std::vector<size_t> pick = {5, 0, 3};
  std::vector<Bytes> bufs(pick.size());
  std::vector<TensorDest> dests;
  for (size_t i = 0; i < pick.size(); ++i) {
    bufs[i].assign(tensors_[pick[i]].data.size(), 0xCC);
    dests.push_back({tensors_[pick[i]].meta.name(), bufs[i].data(), bufs[i].size()});
  }
  CKPTD_ASSERT_OK(reader_->ReadTensors(dests));
  for (size_t i = 0; i < pick.size(); ++i) {
    EXPECT_TRUE(bufs[i] == tensors_[pick[i]].data) << tensors_[pick[i]].meta.name();
  }
  CKPTD_EXPECT_OK(reader_->ReadTensors({}));
}

TEST_F(ShardReadTest, FailedReadLeavesReaderUsable) {
  Bytes buf(8);
  EXPECT_THAT(reader_->ReadTensors({TensorDest{"x", buf.data(), buf.size()}}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'x'")));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<Bytes> got, ReadAll(*reader_, tensors_));
  ExpectSameData(got, tensors_);
}

TEST_F(ShardReadTest, MissingFileIsNotFound) {
  EXPECT_THAT(ShardReader::Open(&fs_, "/rank-9.shard", {}, &pool_).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/rank-9.shard")));
}

// ---- Writer input validation ---------------------------------------------------

struct BadInput {
  const char* what;
  std::function<void(std::vector<TensorSource>&)> mutate;
  std::vector<std::string> substrings;
};

TEST(ShardWriterTest, RejectsBadTensorsBeforeCreatingAnyFile) {
  const std::vector<TestTensor> tensors = SmallTensors(41);
  const std::vector<BadInput> cases = {
      {"duplicate name", [](auto& s) { s[2].meta.set_name("w"); }, {"'w'", "registered twice"}},
      {"empty name", [](auto& s) { s[1].meta.set_name(""); }, {"tensor name is empty"}},
      {"name too long", [](auto& s) { s[1].meta.set_name(std::string(4097, 'n')); }, {"longer than 4096"}},
      {"length short by an element", [](auto& s) { s[0].length -= 4; }, {"'w'", "6140 bytes", "make 6144"}},
      {"length not whole elements", [](auto& s) { s[1].length -= 1; }, {"'m'", "1399 bytes", "make 1400"}},
      {"empty tensor given bytes", [](auto& s) { s[5].length = 4; s[5].data = s[4].data; },
       {"'empty'", "4 bytes", "make 0"}},
      {"unknown dtype", [](auto& s) { s[2].meta.set_dtype(static_cast<DType>(99)); },
       {"'g'", "dtype is unspecified or unknown (99)"}},
      {"unspecified dtype", [](auto& s) { s[3].meta.set_dtype(ckptd::v1::DTYPE_UNSPECIFIED); },
       {"'rng'", "dtype is unspecified or unknown (0)"}},
      {"unspecified component", [](auto& s) { s[3].meta.set_component(ckptd::v1::COMPONENT_UNSPECIFIED); },
       {"'rng'", "component is unspecified or unknown (0)"}},
      {"unknown component", [](auto& s) { s[4].meta.set_component(static_cast<Component>(42)); },
       {"'cursor'", "component is unspecified or unknown (42)"}},
      {"slice past the global shape", [](auto& s) { s[0].meta.set_offsets(0, 25); },
       {"'w'", "slice [25, +24) exceeds global dimension 0 of size 48"}},
      {"offset past the global shape", [](auto& s) { s[0].meta.set_offsets(1, 65); },
       {"'w'", "exceeds global dimension 1 of size 64"}},
      {"global rank differs", [](auto& s) { s[0].meta.add_global_shape(2); }, {"'w'", "same rank (2, 3, 2)"}},
      {"offsets rank differs", [](auto& s) { s[0].meta.clear_offsets(); }, {"'w'", "same rank (2, 2, 0)"}},
      {"offsets without a global shape", [](auto& s) { s[1].meta.add_offsets(0); },
       {"'m'", "offsets given without a global shape"}},
      {"shape overflows", [](auto& s) {
         s[4].meta.set_shape(0, uint64_t{1} << 40);
         s[4].meta.add_shape(uint64_t{1} << 40);
       },
       {"'cursor'", "overflows"}},
      {"no data", [](auto& s) { s[4].data = nullptr; }, {"'cursor'", "has no data"}},
  };
  for (const BadInput& c : cases) {
    SCOPED_TRACE(c.what);
    MemFileSystem mem;
    FaultInjectionFileSystem fs(&mem);
    base::ThreadPool pool(1);
    std::vector<TensorSource> sources = Sources(tensors);
    c.mutate(sources);
    std::vector<::testing::Matcher<std::string>> subs;
    for (const std::string& s : c.substrings) subs.push_back(HasSubstr(s));
    EXPECT_THAT(ValidateTensorSources(sources),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::AllOfArray(subs)));
    EXPECT_THAT(WriteShard(&fs, "/s", Identity(), sources, SmallBlocks(), &pool).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("writing shard /s"), ::testing::AllOfArray(subs))));
    // Nothing was created (the writer's best-effort removal of the temp file
    // may still count as an operation).
    EXPECT_LE(fs.operation_count(), 1u);
    EXPECT_FALSE(Exists(&mem, "/s"));
    EXPECT_FALSE(Exists(&mem, "/s.tmp"));
  }
  CKPTD_EXPECT_OK(ValidateTensorSources(Sources(tensors)));
}

TEST(ShardWriterTest, RejectsAnIdentityItsReaderWouldRefuse) {
  // The reader refuses a shard whose rank is not inside its world size; the
  // writer must refuse to write one rather than leave a file nobody can read.
  const std::vector<TestTensor> tensors = SmallTensors(42);
  for (ShardIdentity id : {ShardIdentity{"j", 1, 8, 8}, ShardIdentity{"j", 1, 0, 0}}) {
    SCOPED_TRACE(absl::StrCat("rank ", id.rank, " world ", id.world_size));
    MemFileSystem fs;
    base::ThreadPool pool(1);
    EXPECT_THAT(WriteShard(&fs, "/s", id, Sources(tensors), SmallBlocks(), &pool).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("writing shard /s"), HasSubstr(absl::StrCat("rank ", id.rank)))));
    EXPECT_FALSE(Exists(&fs, "/s"));
    EXPECT_FALSE(Exists(&fs, "/s.tmp"));
  }
}

TEST(ShardWriterTest, MissingDirectoryIsNotFoundAndLeavesNothing) {
  MemFileSystem fs;
  base::ThreadPool pool(1);
  const std::vector<TestTensor> tensors = SmallTensors(43);
  EXPECT_THAT(WriteShard(&fs, "/no/such/dir/s", Identity(), Sources(tensors), SmallBlocks(), &pool).status(),
              StatusIs(absl::StatusCode::kNotFound, AllOf(HasSubstr("writing shard /no/such/dir/s"))));
  EXPECT_THAT(Names(&fs, "/"), IsEmpty());
}

// ---- Corruption ----------------------------------------------------------------

class ShardCorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tensors_ = SmallTensors(51);
    CKPTD_ASSERT_OK(CreateDirs(&fs_, "/ckpt"));
    CKPTD_ASSERT_OK(WriteShard(&fs_, path_, Identity(), Sources(tensors_), SmallBlocks(), &pool_).status());
    CKPTD_ASSERT_OK_AND_ASSIGN(file_, ReadFileToString(&fs_, path_));
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, ShardReader::Open(&fs_, path_, {}, &pool_));
    index_ = reader->index();
    ASSERT_NO_FATAL_FAILURE(ComputeLayout(file_, index_, &layout_));
  }

  absl::StatusOr<std::unique_ptr<ShardReader>> OpenWith(std::string contents) {
    CKPTD_RETURN_IF_ERROR(fs_.SetFileContents(path_, std::move(contents)));
    return ShardReader::Open(&fs_, path_, {}, &pool_);
  }

  absl::Status OpenStatus(std::string contents) { return OpenWith(std::move(contents)).status(); }

  // Outcome of reading a damaged file; fails the test if a read succeeds
  // with bytes that differ from what was written.
  enum class Outcome { kOpenFailed, kVerifyFailed, kIntact };
  Outcome Probe(const std::string& contents) {
    absl::StatusOr<std::unique_ptr<ShardReader>> reader = OpenWith(contents);
    if (!reader.ok()) {
      EXPECT_THAT(reader.status(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path_)));
      return Outcome::kOpenFailed;
    }
    absl::StatusOr<std::vector<VerifyProblem>> problems = (*reader)->Verify();
    EXPECT_THAT(problems.status(), IsOk());
    absl::StatusOr<std::vector<Bytes>> got = ReadAll(**reader, tensors_);
    if (problems.ok() && !problems->empty()) {
      EXPECT_THAT(got.status(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path_)));
      return Outcome::kVerifyFailed;
    }
    EXPECT_THAT(got.status(), IsOk()) << "Verify found nothing but the read failed";
    if (got.ok()) ExpectSameData(*got, tensors_);
    return Outcome::kIntact;
  }

  MemFileSystem fs_;
  base::ThreadPool pool_{2};
  const std::string path_ = "/ckpt/rank-3.shard";
  std::vector<TestTensor> tensors_;
  std::string file_;
  ShardIndex index_;
  FileLayout layout_;
};

TEST_F(ShardCorruptionTest, EveryByteFlipIsDetected) {
  // Which chunk, if any, holds each byte.
  std::vector<int> chunk_at(file_.size(), -1);
  for (size_t i = 0; i < layout_.chunks.size(); ++i) {
    for (uint64_t o = layout_.chunks[i].offset; o < layout_.chunks[i].offset + layout_.chunks[i].length; ++o) {
      chunk_at[o] = static_cast<int>(i);
    }
  }
  ASSERT_GT(file_.size(), 8 * kShardAlignment);
  ASSERT_LT(file_.size(), 128u << 10) << "too large to flip every byte";
  const uint64_t index_begin = layout_.footer.index_offset;
  const uint64_t index_end = index_begin + layout_.footer.index_length;
  const uint64_t footer_begin = file_.size() - kShardFooterBytes;
  size_t chunk_flips = 0, padding_flips = 0, meta_flips = 0;

  for (size_t off = 0; off < file_.size(); ++off) {
    if (!layout_.covered[off]) {
      // Alignment padding (after the header, between chunks, between the index
      // and the footer) is not data and no checksum covers it: a flip there
      // may go unnoticed. Sample it only to check that nothing wrong is read.
      if (off % 61 != 0) continue;
      ++padding_flips;
      std::string bad = file_;
      bad[off] ^= static_cast<char>(1 << (off % 8));
      Probe(bad);
      if (HasFailure()) {
        ADD_FAILURE() << "padding flip at " << off;
        return;
      }
      continue;
    }
    SCOPED_TRACE(::testing::Message() << "flip at offset " << off << " of " << file_.size());
    std::string bad = file_;
    bad[off] ^= static_cast<char>(1 << (off % 8));
    absl::StatusOr<std::unique_ptr<ShardReader>> reader = OpenWith(bad);
    if (chunk_at[off] < 0) {
      ++meta_flips;
      const char* part = off < kShardHeaderBytes                     ? "header"
                         : (off >= index_begin && off < index_end) ? "index checksum mismatch"
                                                                   : "footer";
      ASSERT_TRUE(off < kShardHeaderBytes || off >= footer_begin || (off >= index_begin && off < index_end));
      const bool version_field = (off >= 8 && off < 12) || (off >= footer_begin + 8 && off < footer_begin + 12);
      if (version_field) {
        // docs/format.md checks the header/footer checksum before the version
        // (kDataLoss); a reader that looks at the version first reports
        // kUnimplemented. Either refuses the file.
        EXPECT_THAT(reader.status(),
                    AnyOf(StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path_), HasSubstr(part))),
                          StatusIs(absl::StatusCode::kUnimplemented,
                                   AllOf(HasSubstr(path_), HasSubstr("shard format version")))));
      } else {
        EXPECT_THAT(reader.status(),
                    StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path_), HasSubstr(part))));
      }
    } else {
      ++chunk_flips;
      const ChunkRange& where = layout_.chunks[chunk_at[off]];
      const std::string name = index_.tensors(where.tensor).name();
      ASSERT_THAT(reader.status(), IsOk()) << "chunk bytes are not read by Open";
      CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<VerifyProblem> problems, (*reader)->Verify());
      ASSERT_EQ(problems.size(), 1u);
      EXPECT_EQ(problems[0].file, path_);
      EXPECT_EQ(problems[0].tensor, name);
      EXPECT_EQ(problems[0].block, where.block);
      EXPECT_EQ(problems[0].chunk, where.chunk);
      EXPECT_THAT(problems[0].message,
                  AllOf(HasSubstr(path_), HasSubstr(absl::StrCat("'", name, "' block ", where.block)),
                        HasSubstr(absl::StrCat("chunk ", where.chunk, ": checksum mismatch"))));
      // Reading is slower than Verify: check it at the chunk's ends and a stride.
      const bool read_too =
          off == where.offset || off + 1 == where.offset + where.length || (off - where.offset) % 16 == 0;
      if (!read_too) {
        if (HasFailure()) return;
        continue;
      }
      EXPECT_THAT(ReadAll(**reader, tensors_).status(),
                  StatusIs(absl::StatusCode::kDataLoss,
                           AllOf(HasSubstr(path_), HasSubstr(absl::StrCat("'", name, "' block ", where.block)),
                                 HasSubstr(absl::StrCat("chunk ", where.chunk)))));
      // The other tensors still read.
      std::vector<TestTensor> others;
      for (const TestTensor& t : tensors_) {
        if (t.meta.name() != name) others.push_back(t);
      }
      CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<Bytes> got, ReadAll(**reader, others));
      ExpectSameData(got, others);
    }
    if (HasFailure()) return;
  }
  // Every part of the file was exercised.
  EXPECT_GT(chunk_flips, 1000u);
  EXPECT_GT(meta_flips, 128u + 200u);
  EXPECT_GT(padding_flips, 100u);
}

TEST_F(ShardCorruptionTest, ChunkFlipsInLargeFileAreDetected) {
  // A shard too large to flip byte by byte: the first and last stored byte of
  // every chunk and a stride through its middle.
  const std::vector<TestTensor> tensors = MakeTensors(52, 2);
  const std::string path = "/big.shard";
  CKPTD_ASSERT_OK(WriteShard(&fs_, path, Identity(), Sources(tensors), SmallBlocks(), &pool_).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string file, ReadFileToString(&fs_, path));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> clean, ShardReader::Open(&fs_, path, {}, &pool_));
  FileLayout layout;
  ASSERT_NO_FATAL_FAILURE(ComputeLayout(file, clean->index(), &layout));
  ASSERT_GT(layout.chunks.size(), 100u);
  size_t flips = 0;
  for (const ChunkRange& c : layout.chunks) {
    const std::string& name = clean->index().tensors(c.tensor).name();
    std::vector<uint64_t> offsets = {c.offset, c.offset + c.length - 1};
    for (uint64_t o = c.offset + 997; o + 1 < c.offset + c.length; o += 997) offsets.push_back(o);
    for (uint64_t off : offsets) {
      SCOPED_TRACE(::testing::Message() << "flip at " << off << " in " << name << " block " << c.block << " chunk "
                                        << c.chunk);
      std::string bad = file;
      bad[off] ^= 0x80;
      CKPTD_ASSERT_OK(fs_.SetFileContents(path, bad));
      CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, ShardReader::Open(&fs_, path, {}, &pool_));
      CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<VerifyProblem> problems, reader->Verify());
      ASSERT_EQ(problems.size(), 1u);
      EXPECT_EQ(problems[0].tensor, name);
      EXPECT_EQ(problems[0].block, c.block);
      EXPECT_EQ(problems[0].chunk, c.chunk);
      EXPECT_THAT(problems[0].message, HasSubstr(path));
      ++flips;
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(flips, 2 * layout.chunks.size() - 1);
}

TEST_F(ShardCorruptionTest, SeveralDamagedBlocksAreAllReported) {
  // One chunk in each of several blocks (a block's decode stops at its first
  // bad chunk, so Verify reports one problem per block).
  std::string bad = file_;
  std::vector<const ChunkRange*> hit;
  for (size_t i = 0; i < layout_.chunks.size(); ++i) {
    const ChunkRange& c = layout_.chunks[i];
    if (i > 0 && c.tensor == layout_.chunks[i - 1].tensor && c.block == layout_.chunks[i - 1].block) continue;
    if (c.block == 0 && c.tensor == 1) continue;  // leave one block intact
    bad[c.offset + c.length - 1] ^= 1;
    hit.push_back(&c);
  }
  ASSERT_GE(hit.size(), 3u);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, OpenWith(bad));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<VerifyProblem> problems, reader->Verify());
  ASSERT_EQ(problems.size(), hit.size());
  std::vector<std::tuple<std::string, int, int>> want, got;
  for (const ChunkRange* c : hit) want.emplace_back(index_.tensors(c->tensor).name(), c->block, c->chunk);
  for (const VerifyProblem& p : problems) got.emplace_back(p.tensor, p.block, p.chunk);
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
}

TEST_F(ShardCorruptionTest, TruncationIsDataLoss) {
  const uint64_t len = file_.size();
  std::vector<uint64_t> lengths = {0, 1, 63, 64, 4095, 4096, 4097, 8191, 8192, 8193,
                                   len - 4096 - 1, len - 4096, len - 4096 + 1, len - 64, len - 1};
  for (uint64_t l = 3 * 4096; l < len; l += 4096) lengths.push_back(l);
  for (uint64_t l : lengths) {
    SCOPED_TRACE(::testing::Message() << "truncated to " << l);
    EXPECT_THAT(OpenStatus(file_.substr(0, l)), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path_)));
  }
  EXPECT_THAT(OpenStatus(file_.substr(0, 4096)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("too short to be a shard")));
  EXPECT_THAT(OpenStatus(file_.substr(0, len - 1)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not a multiple of 4096")));
  EXPECT_THAT(OpenStatus(file_.substr(0, len - 4096)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad footer magic")));
}

TEST_F(ShardCorruptionTest, ExtensionIsDataLoss) {
  const std::string last_block = file_.substr(file_.size() - 4096);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {file_ + std::string(1, '\0'), "not a multiple of 4096"},
      {file_ + std::string(64, '\0'), "not a multiple of 4096"},
      {file_ + std::string(4096, '\0'), "bad footer magic"},
      {file_ + std::string(8192, '\xff'), "bad footer magic"},
      // The footer block written twice: a valid footer at the wrong length.
      {file_ + last_block, absl::StrCat("file is ", file_.size() + 4096, " bytes but its footer says ", file_.size())},
      // A second shard appended.
      {file_ + file_, absl::StrCat("footer says ", file_.size())},
  };
  for (const auto& [contents, message] : cases) {
    SCOPED_TRACE(contents.size());
    EXPECT_THAT(OpenStatus(contents), StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path_), HasSubstr(message))));
  }
}

TEST_F(ShardCorruptionTest, GarbageIsDataLoss) {
  std::mt19937_64 rng(53);
  for (size_t size : {size_t{0}, size_t{1}, size_t{64}, size_t{4095}, size_t{4096}, size_t{8191}, size_t{8192},
                      size_t{12288}, size_t{65536}, size_t{65537}, size_t{1} << 20}) {
    for (int round = 0; round < 3; ++round) {
      SCOPED_TRACE(::testing::Message() << size << " random bytes, round " << round);
      std::string garbage(size, '\0');
      for (char& c : garbage) c = static_cast<char>(rng());
      if (round == 2) garbage.assign(size, '\0');  // all zeros
      const std::string expected = size >= 8192 && size % 4096 == 0 ? "not a ckptd shard" : "";
      EXPECT_THAT(OpenStatus(garbage),
                  StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path_), HasSubstr(expected))));
    }
  }
  // A valid header followed by garbage.
  std::string bad = file_.substr(0, 4096);
  for (int i = 0; i < 4; ++i) {
    std::string block(4096, '\0');
    for (char& c : block) c = static_cast<char>(rng());
    bad += block;
  }
  EXPECT_THAT(OpenStatus(bad), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad footer magic")));
}

TEST_F(ShardCorruptionTest, HeaderProblems) {
  std::string bad = file_;
  bad[0] = 'X';
  EXPECT_THAT(OpenStatus(bad),
              StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path_), HasSubstr("not a ckptd shard"))));

  // A newer format version, with a correct checksum.
  bad = file_;
  uint8_t* h = reinterpret_cast<uint8_t*>(bad.data());
  PutFixed32(h + 8, 3);
  PutFixed64(h + 56, Xxh3(h, 56));
  EXPECT_THAT(OpenStatus(bad), StatusIs(absl::StatusCode::kUnimplemented,
                                        AllOf(HasSubstr(path_), HasSubstr("shard format version 3"),
                                              HasSubstr("this build reads 1 to 2"))));

  bad = file_;
  h = reinterpret_cast<uint8_t*>(bad.data());
  PutFixed32(h + 12, 512);
  PutFixed64(h + 56, Xxh3(h, 56));
  EXPECT_THAT(OpenStatus(bad), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("header alignment 512")));

  // A version change without a new checksum: docs/format.md §5 calls it
  // corruption (the v1 checksum comes first); a reader may also name the
  // version. Never accepted.
  bad = file_;
  PutFixed32(reinterpret_cast<uint8_t*>(bad.data()) + 8, 3);
  EXPECT_THAT(OpenStatus(bad), AnyOf(StatusIs(absl::StatusCode::kDataLoss, HasSubstr("header checksum mismatch")),
                                     StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("version 3"))));
}

TEST_F(ShardCorruptionTest, FooterProblems) {
  ShardFooter f = layout_.footer;
  f.format_version = 3;
  EXPECT_THAT(OpenStatus(WithFooter(file_, f)),
              StatusIs(absl::StatusCode::kUnimplemented, AllOf(HasSubstr(path_), HasSubstr("version 3"))));
  // A known version, but not the header's.
  f.format_version = 2;
  EXPECT_THAT(OpenStatus(WithFooter(file_, f)),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(path_), HasSubstr("footer version 2 does not match the header's 1"))));

  f = layout_.footer;
  f.flags = 1;
  EXPECT_THAT(OpenStatus(WithFooter(file_, f)), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("unknown footer flags 1")));

  f = layout_.footer;
  f.file_length += 4096;
  EXPECT_THAT(OpenStatus(WithFooter(file_, f)), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("footer says")));

  // Index ranges that do not fit: before the first block, misaligned, past the
  // footer, overlapping the footer, huge.
  const uint64_t len = file_.size();
  for (auto [offset, length] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 10}, {4095, 10}, {layout_.footer.index_offset + 1, 10}, {len, 0}, {len - 4096, 4096 - 63},
           {layout_.footer.index_offset, UINT64_MAX}, {UINT64_MAX - 4095, 10}, {4096, kMaxIndexBytes + 1}}) {
    SCOPED_TRACE(::testing::Message() << "index at " << offset << " +" << length);
    f = layout_.footer;
    f.index_offset = offset;
    f.index_length = length;
    EXPECT_THAT(OpenStatus(WithFooter(file_, f)),
                StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path_), HasSubstr("does not fit"))));
  }

  // The footer's index checksum disagrees with the index.
  f = layout_.footer;
  f.index_xxh3 ^= 1;
  EXPECT_THAT(OpenStatus(WithFooter(file_, f)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("index checksum mismatch")));
  // An index that is a prefix of the real one.
  f = layout_.footer;
  f.index_length -= 1;
  f.index_xxh3 = Xxh3(file_.data() + f.index_offset, f.index_length);
  EXPECT_THAT(OpenStatus(WithFooter(file_, f)), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path_)));
}

TEST_F(ShardCorruptionTest, RewrittenIndexStillOpens) {
  // The helper below only moves the index: the same index opens and reads.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, OpenWith(WithIndex(file_, layout_.footer, index_)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<Bytes> got, ReadAll(*reader, tensors_));
  ExpectSameData(got, tensors_);
}

struct IndexTamper {
  const char* what;
  std::function<void(ShardIndex&, uint64_t index_offset)> mutate;
  std::vector<std::string> substrings;
};

TEST_F(ShardCorruptionTest, TamperedIndexWithValidChecksumIsDataLoss) {
  const std::vector<IndexTamper> cases = {
      {"chunk past the index",
       [](ShardIndex& x, uint64_t end) { x.mutable_tensors(0)->mutable_blocks(0)->mutable_chunks(0)->set_file_offset(end + 4096); },
       {"tensor 'w' block 0 chunk 0", "outside the chunk area"}},
      {"chunk running into the index",
       [](ShardIndex& x, uint64_t end) {
         x.mutable_tensors(3)->mutable_blocks(0)->mutable_chunks(0)->set_file_offset(end);
       },
       {"tensor 'rng' block 0 chunk 0", "outside the chunk area"}},
      {"chunk in the header",
       [](ShardIndex& x, uint64_t) { x.mutable_tensors(2)->mutable_blocks(0)->mutable_chunks(0)->set_file_offset(0); },
       {"tensor 'g' block 0 chunk 0", "misaligned"}},
      {"misaligned chunk",
       [](ShardIndex& x, uint64_t) {
         auto* c = x.mutable_tensors(2)->mutable_blocks(0)->mutable_chunks(0);
         c->set_file_offset(c->file_offset() + 8);
       },
       {"tensor 'g' block 0 chunk 0", "misaligned"}},
      {"chunks out of order",
       [](ShardIndex& x, uint64_t) {
         auto* b = x.mutable_tensors(0)->mutable_blocks(0);
         b->mutable_chunks(1)->set_file_offset(b->chunks(0).file_offset());
       },
       {"tensor 'w' block 0 chunk 1", "out of order"}},
      {"stored length past the chunk area",
       [](ShardIndex& x, uint64_t) {
         x.mutable_tensors(3)->mutable_blocks(0)->mutable_chunks(0)->set_stored_length(uint64_t{1} << 40);
       },
       {"tensor 'rng' block 0"}},
      {"raw length that disagrees with the shape",
       [](ShardIndex& x, uint64_t) { x.mutable_tensors(4)->set_raw_length(17); },
       {"tensor 'cursor'", "raw_length 17 does not match its shape and dtype (16)"}},
      {"shape that disagrees with the raw length",
       [](ShardIndex& x, uint64_t) { x.mutable_tensors(1)->set_shape(0, 701); },
       {"tensor 'm'", "raw_length 1400 does not match its shape and dtype (1402)"}},
      {"dtype that disagrees with the raw length",
       [](ShardIndex& x, uint64_t) { x.mutable_tensors(2)->set_dtype(ckptd::v1::INT32); },
       {"tensor 'g'", "does not match its shape and dtype"}},
      {"duplicate tensor name", [](ShardIndex& x, uint64_t) { x.mutable_tensors(4)->set_name("rng"); },
       {"tensor 'rng' appears twice"}},
      {"empty tensor name", [](ShardIndex& x, uint64_t) { x.mutable_tensors(4)->set_name(""); },
       {"tensor name is empty"}},
      {"unspecified component",
       [](ShardIndex& x, uint64_t) { x.mutable_tensors(1)->set_component(ckptd::v1::COMPONENT_UNSPECIFIED); },
       {"tensor 'm'", "component"}},
      {"bad sharding", [](ShardIndex& x, uint64_t) { x.mutable_tensors(0)->set_offsets(0, 25); },
       {"tensor 'w'", "exceeds global dimension 0"}},
      {"missing block",
       [](ShardIndex& x, uint64_t) { x.mutable_tensors(0)->mutable_blocks()->RemoveLast(); },
       {"tensor 'w'", "blocks cover 4096 of 6144 bytes"}},
      {"blocks swapped",
       [](ShardIndex& x, uint64_t) { x.mutable_tensors(0)->mutable_blocks()->SwapElements(0, 1); },
       {"tensor 'w' block 0", "covers [4096"}},
      {"block longer than its tensor",
       [](ShardIndex& x, uint64_t) { x.mutable_tensors(4)->mutable_blocks(0)->set_raw_length(32); },
       {"tensor 'cursor' block 0", "covers [0, +32)"}},
      {"unknown codec",
       [](ShardIndex& x, uint64_t) {
         x.mutable_tensors(3)->mutable_blocks(0)->mutable_chunks(0)->set_codec(static_cast<ckptd::v1::Codec>(9));
       },
       {"tensor 'rng' block 0", "unknown codec 9"}},
      {"unknown filter",
       [](ShardIndex& x, uint64_t) {
         x.mutable_tensors(3)->mutable_blocks(0)->set_filter(static_cast<ckptd::v1::Filter>(5));
       },
       {"tensor 'rng' block 0", "unknown filter 5"}},
      {"raw chunk of the wrong length",
       [](ShardIndex& x, uint64_t) { x.mutable_tensors(3)->mutable_blocks(0)->mutable_chunks(0)->set_raw_length(99); },
       {"tensor 'rng' block 0", "chunk 0: raw_length 99"}},
      {"raw totals", [](ShardIndex& x, uint64_t) { x.set_raw_bytes(x.raw_bytes() + 1); }, {"index totals"}},
      {"stored totals", [](ShardIndex& x, uint64_t) { x.set_stored_bytes(x.stored_bytes() - 1); }, {"index totals"}},
      {"rank outside the world", [](ShardIndex& x, uint64_t) { x.set_rank(8); }, {"rank 8 is not inside world size 8"}},
      {"no world", [](ShardIndex& x, uint64_t) { x.set_world_size(0); }, {"world size 0"}},
      {"index version", [](ShardIndex& x, uint64_t) { x.set_format_version(2); }, {"index format_version 2"}},
      {"index alignment", [](ShardIndex& x, uint64_t) { x.set_alignment(512); }, {"index alignment 512"}},
  };
  for (const IndexTamper& c : cases) {
    SCOPED_TRACE(c.what);
    ShardIndex index = index_;
    c.mutate(index, layout_.footer.index_offset);
    std::vector<::testing::Matcher<std::string>> subs = {HasSubstr(path_)};
    for (const std::string& s : c.substrings) subs.push_back(HasSubstr(s));
    EXPECT_THAT(OpenStatus(WithIndex(file_, layout_.footer, index)),
                StatusIs(absl::StatusCode::kDataLoss, ::testing::AllOfArray(subs)));
  }

  // Bytes that do not parse as an index, with a matching checksum.
  EXPECT_THAT(OpenStatus(WithIndexBytes(file_, layout_.footer, std::string(16, '\xff'))),
              StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path_), HasSubstr("index does not parse"))));
  EXPECT_THAT(OpenStatus(WithIndexBytes(file_, layout_.footer, "")),
              StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path_), HasSubstr("format_version 0"))));
}

TEST_F(ShardCorruptionTest, IndexChecksumsThatLieAreCaughtByVerify) {
  {
    // A chunk checksum that does not match its (intact) bytes.
    ShardIndex index = index_;
    auto* chunk = index.mutable_tensors(1)->mutable_blocks(0)->mutable_chunks(1);
    chunk->set_stored_xxh3(chunk->stored_xxh3() ^ 1);
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, OpenWith(WithIndex(file_, layout_.footer, index)));
    CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<VerifyProblem> problems, reader->Verify());
    ASSERT_EQ(problems.size(), 1u);
    EXPECT_EQ(problems[0].tensor, "m");
    EXPECT_EQ(problems[0].block, 0);
    EXPECT_EQ(problems[0].chunk, 1);
  }
  {
    // A block checksum that does not match the decoded bytes: no chunk at fault.
    ShardIndex index = index_;
    auto* block = index.mutable_tensors(0)->mutable_blocks(1);
    block->set_raw_xxh3(block->raw_xxh3() ^ 1);
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, OpenWith(WithIndex(file_, layout_.footer, index)));
    CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<VerifyProblem> problems, reader->Verify());
    ASSERT_EQ(problems.size(), 1u);
    EXPECT_EQ(problems[0].tensor, "w");
    EXPECT_EQ(problems[0].block, 1);
    EXPECT_EQ(problems[0].chunk, -1);
    EXPECT_THAT(problems[0].message, AllOf(HasSubstr(path_), HasSubstr("block checksum mismatch")));
    EXPECT_THAT(ReadAll(*reader, tensors_).status(),
                StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("'w' block 1"), HasSubstr("block checksum"))));
  }
}

TEST_F(ShardCorruptionTest, EveryIndexByteFlipWithValidChecksumIsSafe) {
  // An index damaged before it was checksummed: Open either refuses it as
  // kDataLoss, or what it accepts never reads wrong bytes and never crashes.
  const std::string serialized = index_.SerializeAsString();
  size_t refused = 0;
  for (size_t flip = 0; flip < serialized.size() * 8; ++flip) {
    const size_t i = flip / 8;
    SCOPED_TRACE(::testing::Message() << "index byte " << i << " of " << serialized.size() << ", bit " << flip % 8);
    std::string mutated = serialized;
    mutated[i] ^= static_cast<char>(1 << (flip % 8));
    absl::StatusOr<std::unique_ptr<ShardReader>> reader = OpenWith(WithIndexBytes(file_, layout_.footer, mutated));
    if (!reader.ok()) {
      EXPECT_THAT(reader.status(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path_)));
      ++refused;
      if (FailureCount() > 10) return;
      continue;
    }
    const ShardIndex& index = (*reader)->index();
    CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<VerifyProblem> problems, (*reader)->Verify());
    // Read whatever the accepted index lists, into buffers of its sizes.
    std::vector<Bytes> bufs(index.tensors_size());
    std::vector<TensorDest> dests;
    for (int t = 0; t < index.tensors_size(); ++t) {
      bufs[t].assign(index.tensors(t).raw_length(), 0xCC);
      dests.push_back({index.tensors(t).name(), bufs[t].data(), bufs[t].size()});
    }
    absl::Status read = (*reader)->ReadTensors(dests);
    if (problems.empty()) {
      EXPECT_THAT(read, IsOk()) << "Verify found nothing but the read failed";
    } else {
      EXPECT_THAT(read, StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path_)));
    }
    if (read.ok()) {
      for (int t = 0; t < index.tensors_size(); ++t) {
        for (const TestTensor& want : tensors_) {
          if (want.meta.name() == index.tensors(t).name()) {
            EXPECT_TRUE(bufs[t] == want.data) << "tensor " << want.meta.name() << " read wrong bytes";
          }
        }
      }
    }
    if (FailureCount() > 10) return;
  }
  EXPECT_GT(refused, serialized.size() * 8 / 2);
}

// ---- Fault injection while writing ------------------------------------------------

struct FaultCase {
  Fault fault;
  absl::StatusCode code;
};

std::string FaultName(const ::testing::TestParamInfo<FaultCase>& info) {
  switch (info.param.fault) {
    case Fault::kEio: return "Eio";
    case Fault::kEnospc: return "Enospc";
    case Fault::kShortWrite: return "ShortWrite";
    default: return "Other";
  }
}

class ShardWriteFaultTest : public ::testing::TestWithParam<FaultCase> {
 protected:
  void SetUp() override {
    CKPTD_ASSERT_OK(CreateDirs(&mem_, dir_));
    tensors_ = SmallTensors(61);
  }

  absl::StatusOr<ShardWriteResult> Write() {
    return WriteShard(&fs_, path_, Identity(), Sources(tensors_), SmallBlocks(), &pool_);
  }

  MemFileSystem mem_;
  FaultInjectionFileSystem fs_{&mem_};
  base::ThreadPool pool_{3};
  const std::string dir_ = "/ckpt/job/step-1";
  const std::string path_ = "/ckpt/job/step-1/rank-3.shard";
  std::vector<TestTensor> tensors_;
};

TEST_P(ShardWriteFaultTest, FaultAtEveryOperation) {
  CKPTD_ASSERT_OK_AND_ASSIGN(ShardWriteResult clean, Write());
  const uint64_t clean_ops = fs_.operation_count();
  CKPTD_ASSERT_OK(mem_.RemoveFile(path_));
  // open, one write per block, header, tail, fsync, close, rename, fsync dir.
  ASSERT_GE(clean_ops, 12u);

  for (uint64_t op = 0;; ++op) {
    SCOPED_TRACE(::testing::Message() << "fault at operation " << op << " of " << clean_ops);
    ASSERT_LE(op, clean_ops) << "the fault never stopped a write";
    fs_.Reset();
    fs_.FailAtOperation(op, GetParam().fault);
    absl::StatusOr<ShardWriteResult> result = Write();
    if (result.ok()) {
      // Only when the fault came after the last operation.
      EXPECT_EQ(op, clean_ops);
      EXPECT_EQ(result->file_length, clean.file_length);
      ExpectReadsBack(&mem_, path_, tensors_, &pool_);
      break;
    }
    EXPECT_THAT(result.status(),
                StatusIs(GetParam().code, AllOf(HasSubstr(absl::StrCat("writing shard ", path_)), HasSubstr(path_))));
    // The temp file never survives. The final file may only exist when the
    // fault hit the directory fsync that follows the rename, and then it is
    // complete.
    const bool after_rename = op == clean_ops - 1;
    std::vector<std::string> names = Names(&mem_, dir_);
    if (after_rename) {
      EXPECT_THAT(result.status().message(), HasSubstr("fsync dir"));
      EXPECT_THAT(names, ::testing::AnyOf(IsEmpty(), ::testing::ElementsAre("rank-3.shard")));
      if (Exists(&mem_, path_)) {
        ExpectReadsBack(&mem_, path_, tensors_, &pool_);
        CKPTD_ASSERT_OK(mem_.RemoveFile(path_));
      }
    } else {
      EXPECT_THAT(names, IsEmpty());
    }
    if (HasFailure()) return;
  }
}

TEST_P(ShardWriteFaultTest, PersistentFaultFromEveryOperation) {
  // Every operation from `first` on fails, the cleanup included: the status is
  // still the first failure; a temp file may stay since its removal failed.
  CKPTD_ASSERT_OK(Write().status());
  const uint64_t clean_ops = fs_.operation_count();
  CKPTD_ASSERT_OK(mem_.RemoveFile(path_));
  for (uint64_t first = 0; first < clean_ops; ++first) {
    SCOPED_TRACE(::testing::Message() << "faults from operation " << first);
    fs_.Reset();
    for (uint64_t op = first; op < first + 64; ++op) fs_.FailAtOperation(op, GetParam().fault);
    EXPECT_THAT(Write().status(), StatusIs(GetParam().code, HasSubstr(absl::StrCat("writing shard ", path_))));
    fs_.Reset();
    const bool after_rename = first == clean_ops - 1;
    if (!after_rename) {
      EXPECT_FALSE(Exists(&mem_, path_));
    }
    (void)mem_.RemoveFile(path_);           // may be absent
    (void)mem_.RemoveFile(path_ + ".tmp");  // may be left by the failed cleanup
    if (HasFailure()) return;
  }
}

TEST_P(ShardWriteFaultTest, DiskFillsUpMidShard) {
  CKPTD_ASSERT_OK_AND_ASSIGN(ShardWriteResult clean, Write());
  CKPTD_ASSERT_OK(mem_.RemoveFile(path_));
  const uint64_t len = clean.file_length;
  for (uint64_t budget : {uint64_t{0}, uint64_t{1}, uint64_t{4096}, uint64_t{4097}, uint64_t{3 * 4096}, len / 2,
                          len - 4096, len - 1}) {
    SCOPED_TRACE(::testing::Message() << "disk full after " << budget << " of " << len << " bytes");
    fs_.Reset();
    fs_.FailWritesAfterBytes(budget, GetParam().fault);
    EXPECT_THAT(Write().status(),
                StatusIs(GetParam().code, AllOf(HasSubstr(absl::StrCat("writing shard ", path_)), HasSubstr(".tmp"))));
    EXPECT_THAT(Names(&mem_, dir_), IsEmpty());
  }
  // Exactly enough room.
  fs_.Reset();
  fs_.FailWritesAfterBytes(len, GetParam().fault);
  CKPTD_ASSERT_OK(Write().status());
  ExpectReadsBack(&mem_, path_, tensors_, &pool_);
}

TEST_P(ShardWriteFaultTest, FaultsOnTheTempPath) {
  fs_.FailPath(".tmp", GetParam().fault);
  EXPECT_THAT(Write().status(), StatusIs(GetParam().code, HasSubstr(absl::StrCat("writing shard ", path_))));
  EXPECT_THAT(Names(&mem_, dir_), IsEmpty());
}

INSTANTIATE_TEST_SUITE_P(Faults, ShardWriteFaultTest,
                         ::testing::Values(FaultCase{Fault::kEio, absl::StatusCode::kDataLoss},
                                           FaultCase{Fault::kEnospc, absl::StatusCode::kResourceExhausted},
                                           FaultCase{Fault::kShortWrite, absl::StatusCode::kResourceExhausted}),
                         FaultName);

TEST(ShardCrashTest, CrashAtEveryOperationLeavesNoPartialShard) {
  MemFileSystem mem;
  FaultInjectionFileSystem fs(&mem, [&mem] { mem.Crash(); });
  base::ThreadPool pool(2);
  const std::string dir = "/ckpt/step-1";
  CKPTD_ASSERT_OK(CreateDirs(&mem, dir));
  CKPTD_ASSERT_OK(mem.SyncDir("/"));
  CKPTD_ASSERT_OK(mem.SyncDir("/ckpt"));
  CKPTD_ASSERT_OK(mem.SyncDir(dir));
  const std::string path = JoinPath(dir, "rank-0.shard");
  const std::vector<TestTensor> tensors = SmallTensors(62);

  CKPTD_ASSERT_OK(WriteShard(&fs, path, Identity(), Sources(tensors), SmallBlocks(), &pool).status());
  const uint64_t clean_ops = fs.operation_count();
  CKPTD_ASSERT_OK(mem.RemoveFile(path));
  CKPTD_ASSERT_OK(mem.SyncDir(dir));
  for (uint64_t op = 0; op < clean_ops; ++op) {
    SCOPED_TRACE(::testing::Message() << "crash at operation " << op);
    fs.Reset();
    fs.FailAtOperation(op, Fault::kCrash);
    EXPECT_THAT(WriteShard(&fs, path, Identity(), Sources(tensors), SmallBlocks(), &pool).status(),
                StatusIs(absl::StatusCode::kAborted, HasSubstr(absl::StrCat("writing shard ", path))));
    EXPECT_TRUE(fs.crashed());
    // After the crash: no shard, complete or partial, and no temp file.
    EXPECT_THAT(Names(&mem, dir), IsEmpty());
    if (HasFailure()) return;
  }
  // Without a crash, the shard survives one right after the write returns.
  fs.Reset();
  CKPTD_ASSERT_OK(WriteShard(&fs, path, Identity(), Sources(tensors), SmallBlocks(), &pool).status());
  mem.Crash();
  ExpectReadsBack(&mem, path, tensors, &pool);
}

// ---- Faults while reading -------------------------------------------------------

TEST(ShardReadFaultTest, EioAtEveryReadOperation) {
  MemFileSystem mem;
  FaultInjectionFileSystem fs(&mem);
  base::ThreadPool pool(2);
  const std::string path = "/rank-1.shard";
  const std::vector<TestTensor> tensors = SmallTensors(65);
  CKPTD_ASSERT_OK(WriteShard(&mem, path, Identity(), Sources(tensors), SmallBlocks(), &pool).status());

  for (bool verify : {false, true}) {
    for (uint64_t op = 0;; ++op) {
      SCOPED_TRACE(::testing::Message() << (verify ? "Verify" : "ReadTensors") << ", EIO at operation " << op);
      ASSERT_LT(op, 1000u);
      fs.Reset();
      fs.FailAtOperation(op, Fault::kEio);
      absl::StatusOr<std::unique_ptr<ShardReader>> reader = ShardReader::Open(&fs, path, {}, &pool);
      if (!reader.ok()) {
        EXPECT_THAT(reader.status(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
        continue;
      }
      bool hit = false;
      if (verify) {
        absl::StatusOr<std::vector<VerifyProblem>> problems = (*reader)->Verify();
        hit = fs.operation_count() > op;
        if (problems.ok()) {
          // A failed transfer is a problem; it must never look like a clean file.
          EXPECT_EQ(problems->empty(), !hit);
          for (const VerifyProblem& p : *problems) EXPECT_THAT(p.message, HasSubstr(path));
        } else {
          EXPECT_TRUE(hit);
          EXPECT_THAT(problems.status(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
        }
      } else {
        absl::StatusOr<std::vector<Bytes>> got = ReadAll(**reader, tensors);
        hit = fs.operation_count() > op;
        if (got.ok()) {
          EXPECT_FALSE(hit) << "the fault was swallowed";
          ExpectSameData(*got, tensors);
        } else {
          EXPECT_TRUE(hit);
          EXPECT_THAT(got.status(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
        }
      }
      if (!hit) {
        // Past the last operation: open, header, footer, index and the six
        // blocks were each failed once.
        EXPECT_EQ(op, 4u + 6u);
      }
      if (HasFailure() || !hit) break;
    }
  }
}

// ---- Block sizes and many tensors ------------------------------------------------

TEST(ShardTest, OddBlockSizesAreRoundedToWholeElements) {
  MemFileSystem fs;
  base::ThreadPool pool(3);
  const std::vector<TestTensor> tensors = MakeTensors(81, 2);
  // Requested -> used: at least one alignment unit, a multiple of 8 bytes.
  for (auto [requested, used] : std::vector<std::pair<size_t, uint64_t>>{
           {0, 4096}, {1, 4096}, {4100, 4096}, {6000, 6000}, {12345, 12344}, {100001, 100000}}) {
    SCOPED_TRACE(::testing::Message() << "block_bytes " << requested);
    ShardWriteOptions options = SmallBlocks();
    options.block_bytes = requested;
    CKPTD_ASSERT_OK(WriteShard(&fs, "/s", Identity(), Sources(tensors), options, &pool).status());
    ExpectReadsBack(&fs, "/s", tensors, &pool);
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, ShardReader::Open(&fs, "/s", {}, &pool));
    const ckptd::v1::Tensor& w = reader->index().tensors(0);
    ASSERT_GT(w.blocks_size(), 1);
    for (int b = 0; b + 1 < w.blocks_size(); ++b) EXPECT_EQ(w.blocks(b).raw_length(), used) << "block " << b;
  }
}

TEST(ShardTest, ManyTinyTensorsGiveAMultiBlockIndex) {
  MemFileSystem fs;
  base::ThreadPool pool(3);
  std::vector<TestTensor> tensors;
  for (int i = 0; i < 600; ++i) {
    const DType d = i % 3 == 0 ? ckptd::v1::FLOAT32 : i % 3 == 1 ? ckptd::v1::BFLOAT16 : ckptd::v1::INT64;
    const size_t n = 1 + i % 7;
    Bytes data = d == ckptd::v1::FLOAT32 ? NormalFp32(n, i) : d == ckptd::v1::BFLOAT16 ? ToBf16(NormalFp32(n, i))
                                                                                      : SmallInt64(n, i);
    tensors.push_back({Meta(absl::StrCat("model.layers.", i / 10, ".p", i), ckptd::v1::PARAMS, d, {n}), data});
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(ShardWriteResult result,
                             WriteShard(&fs, "/s", Identity(), Sources(tensors), SmallBlocks(), &pool));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::string file, ReadFileToString(&fs, "/s"));
  const ShardFooter footer = *DecodeShardFooter(
      reinterpret_cast<const uint8_t*>(file.data()) + file.size() - kShardFooterBytes, file.size(), "s");
  EXPECT_GT(footer.index_length, 2 * kShardAlignment);
  EXPECT_EQ(result.file_length, file.size());
  ExpectReadsBack(&fs, "/s", tensors, &pool);
}

// ---- Slow I/O and concurrency ----------------------------------------------------

TEST(ShardTest, SlowIoRoundTrips) {
  MemFileSystem mem;
  FaultInjectionFileSystem fs(&mem);
  fs.SetLatency(absl::Milliseconds(1));
  base::ThreadPool pool(3);
  const std::vector<TestTensor> tensors = SmallTensors(71);
  CKPTD_ASSERT_OK(WriteShard(&fs, "/slow", Identity(), Sources(tensors), SmallBlocks(), &pool).status());
  ExpectReadsBack(&fs, "/slow", tensors, &pool);
  EXPECT_GT(fs.operation_count(), 20u);
}

TEST(ShardTest, ParallelWritersShareOnePool) {
  MemFileSystem fs;
  base::ThreadPool pool(3);
  constexpr int kWriters = 6;
  std::vector<std::vector<TestTensor>> tensors;
  for (int i = 0; i < kWriters; ++i) tensors.push_back(MakeTensors(100 + i, 1));
  CKPTD_ASSERT_OK(CreateDirs(&fs, "/p"));
  std::vector<absl::Status> written(kWriters);
  std::vector<absl::Status> read(kWriters);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWriters; ++i) {
    threads.emplace_back([&, i] {
      const std::string path = JoinPath("/p", ShardFileName(i));
      ShardWriteOptions options = SmallBlocks(i % 2 == 0);
      written[i] = WriteShard(&fs, path, {"job", 5, static_cast<uint32_t>(i), kWriters}, Sources(tensors[i]),
                              options, &pool)
                       .status();
      if (!written[i].ok()) return;
      absl::StatusOr<std::unique_ptr<ShardReader>> reader = ShardReader::Open(&fs, path, {}, &pool);
      if (!reader.ok()) {
        read[i] = reader.status();
        return;
      }
      absl::StatusOr<std::vector<Bytes>> got = ReadAll(**reader, tensors[i]);
      if (!got.ok()) {
        read[i] = got.status();
        return;
      }
      for (size_t t = 0; t < got->size(); ++t) {
        if ((*got)[t] != tensors[i][t].data) read[i] = absl::InternalError(absl::StrCat("tensor ", t, " differs"));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kWriters; ++i) {
    EXPECT_THAT(written[i], IsOk()) << "writer " << i;
    EXPECT_THAT(read[i], IsOk()) << "reader " << i;
  }
  EXPECT_EQ(Names(&fs, "/p").size(), static_cast<size_t>(kWriters));
}

}  // namespace
}  // namespace ckptd::storage
