// Adaptive compression: the decision from measured rates, and shards whose
// blocks are partly compressed, partly raw.
#include "storage/shard_writer.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/aligned_buffer.h"
#include "base/testing/matchers.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/fault_injection_file_system.h"
#include "storage/layout.h"
#include "storage/mem_file_system.h"
#include "storage/shard_format.h"
#include "storage/shard_reader.h"
#include "storage/testing_data.h"

namespace ckptd::storage {
namespace {

using ::ckptd::testing::Bytes;
using ::ckptd::testing::NormalFp32;
using ::ckptd::testing::ToBf16;
using ::testing::IsEmpty;

// ---- The decision -----------------------------------------------------------

CompressionRates Rates(double encode_gbps, double write_gbps, double ratio) {
  CompressionRates r;
  r.encode_bytes_per_second = encode_gbps * 1e9;
  r.write_bytes_per_second = write_gbps * 1e9;
  r.ratio = ratio;
  return r;
}

TEST(CompressionPaysTest, DiskBoundCompressionPaysByItsRatio) {
  // Encoders far ahead of a slow disk: the ratio decides.
  EXPECT_TRUE(CompressionPays(Rates(4.0, 0.5, 1.2), 1.1));
  EXPECT_TRUE(CompressionPays(Rates(4.0, 0.5, 1.49), 1.1));
  // Data that barely compresses is written raw, however fast the encoders.
  EXPECT_FALSE(CompressionPays(Rates(40.0, 0.5, 1.05), 1.1));
  EXPECT_FALSE(CompressionPays(Rates(40.0, 0.5, 1.0), 1.0 + 1e-9));
}

TEST(CompressionPaysTest, EncodersSlowerThanTheDiskGoRaw) {
  // A fast NVMe and encoders that get one core: raw is sooner.
  EXPECT_FALSE(CompressionPays(Rates(0.8, 2.2, 1.2), 1.1));
  // Faster than the disk, but by less than the margin.
  EXPECT_FALSE(CompressionPays(Rates(1.05, 1.0, 1.5), 1.1));
  // Enough faster.
  EXPECT_TRUE(CompressionPays(Rates(1.15, 1.0, 1.5), 1.1));
  // The encoders' rate bounds what compression delivers, even with a great ratio.
  EXPECT_FALSE(CompressionPays(Rates(0.9, 1.0, 3.0), 1.0));
}

TEST(CompressionPaysTest, TheMarginIsInclusive) {
  EXPECT_TRUE(CompressionPays(Rates(1.1, 1.0, 1.1), 1.1));
  EXPECT_TRUE(CompressionPays(Rates(1.0, 1.0, 1.0), 1.0));
}

TEST(CompressionPaysTest, NothingMeasuredKeepsCompressing) {
  EXPECT_TRUE(CompressionPays(CompressionRates(), 1.1));
  EXPECT_TRUE(CompressionPays(Rates(0, 1.0, 1.2), 1.1));
  EXPECT_TRUE(CompressionPays(Rates(1.0, 0, 1.2), 1.1));
  EXPECT_TRUE(CompressionPays(Rates(1.0, 1.0, 0), 1.1));
}

// ---- Shards with both kinds of blocks --------------------------------------

struct FloatTensor {
  ckptd::v1::Tensor meta;
  Bytes data;
};

// Float tensors only: with compression every block gets byte planes, without
// it none does, so the filter tells how each block was written.
std::vector<FloatTensor> FloatTensors() {
  std::vector<FloatTensor> t(2);
  t[0].meta.set_name("w");
  t[0].meta.set_component(ckptd::v1::PARAMS);
  t[0].meta.set_dtype(ckptd::v1::FLOAT32);
  t[0].meta.add_shape(40 * 16384);  // 40 blocks of 64 KiB
  t[0].data = NormalFp32(40 * 16384, 7);
  t[1].meta.set_name("m");
  t[1].meta.set_component(ckptd::v1::OPTIMIZER);
  t[1].meta.set_dtype(ckptd::v1::BFLOAT16);
  t[1].meta.add_shape(12 * 32768);  // 12 blocks
  t[1].data = ToBf16(NormalFp32(12 * 32768, 8));
  return t;
}

ShardWriteOptions Adaptive(std::function<bool(const CompressionRates&)> decide) {
  ShardWriteOptions o;
  // Large enough that a compressed plane saves whole 4 KiB pages.
  o.block_bytes = 64 << 10;
  o.writes_in_flight = 1;
  o.encode.compress = true;
  o.adaptive.enabled = true;
  o.adaptive.decide_every_blocks = 3;
  o.adaptive.decide = std::move(decide);
  return o;
}

struct Written {
  ShardWriteResult result;
  int planes = 0;  // blocks with byte planes (compressed)
  int raw = 0;     // blocks without (raw)
};

// Writes `tensors` (from 4 KiB-aligned copies when `aligned`, the raw blocks
// then going out of the caller's memory), checks that they read back
// bit-exact and verify, and counts the blocks of each kind.
Written WriteAndReadBack(const std::vector<FloatTensor>& tensors, const ShardWriteOptions& options, bool aligned) {
  Written w;
  MemFileSystem fs;
  base::ThreadPool pool(1);
  std::vector<base::AlignedBuffer> copies;
  std::vector<TensorSource> sources;
  for (const FloatTensor& t : tensors) {
    const void* data = t.data.data();  // a vector's: not 4 KiB-aligned, encoded through a copy
    if (aligned) {
      copies.emplace_back(t.data.size(), kShardAlignment);
      std::memcpy(copies.back().data(), t.data.data(), t.data.size());
      data = copies.back().data();
    }
    sources.push_back({t.meta, data, t.data.size()});
  }
  absl::StatusOr<ShardWriteResult> result = WriteShard(&fs, "/rank-0.shard", {"job", 5, 0, 1}, sources, options, &pool);
  EXPECT_THAT(result, ::ckptd::testing::IsOk());
  if (!result.ok()) return w;
  w.result = *result;
  absl::StatusOr<std::unique_ptr<ShardReader>> reader = ShardReader::Open(&fs, "/rank-0.shard", {}, &pool);
  EXPECT_THAT(reader, ::ckptd::testing::IsOk());
  if (!reader.ok()) return w;
  absl::StatusOr<std::vector<VerifyProblem>> problems = (*reader)->Verify();
  EXPECT_THAT(problems, ::ckptd::testing::IsOkAndHolds(IsEmpty()));
  std::vector<Bytes> got(tensors.size());
  std::vector<TensorDest> dests;
  for (size_t i = 0; i < tensors.size(); ++i) {
    got[i].assign(tensors[i].data.size(), 0xCC);
    dests.push_back({tensors[i].meta.name(), got[i].data(), got[i].size()});
  }
  EXPECT_THAT((*reader)->ReadTensors(dests), ::ckptd::testing::IsOk());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_TRUE(got[i] == tensors[i].data) << "tensor " << tensors[i].meta.name() << " differs";
  }
  for (const ckptd::v1::Tensor& t : (*reader)->index().tensors()) {
    for (const ckptd::v1::Block& b : t.blocks()) {
      if (b.filter() == ckptd::v1::BYTE_PLANES) {
        ++w.planes;
      } else {
        ++w.raw;
        EXPECT_EQ(b.chunks_size(), 1);
        EXPECT_EQ(b.chunks(0).codec(), ckptd::v1::RAW);
      }
    }
  }
  return w;
}

class MixedShardTest : public ::testing::TestWithParam<bool> {};

TEST_P(MixedShardTest, ADecisionForRawMakesTheRestRawAndAllReadsBack) {
  std::vector<CompressionRates> asked;
  const ShardWriteOptions options = Adaptive([&](const CompressionRates& r) {
    asked.push_back(r);
    return false;
  });
  const Written w = WriteAndReadBack(FloatTensors(), options, GetParam());
  ASSERT_EQ(asked.size(), 1u) << "no decision after the one for raw";
  EXPECT_EQ(w.result.compression_decisions, 1);
  // The rates the decision saw were measured: the fp32 and bf16 blocks
  // written so far compress by their exponent planes.
  EXPECT_GT(asked[0].encode_bytes_per_second, 0);
  EXPECT_GT(asked[0].write_bytes_per_second, 0);
  EXPECT_GT(asked[0].ratio, 1.05);
  EXPECT_EQ(w.result.compression_rates.ratio, asked[0].ratio);
  // Some blocks compressed (those before the decision), the rest raw.
  EXPECT_GE(w.planes, 3);
  EXPECT_GT(w.raw, 0);
  EXPECT_EQ(w.planes + w.raw, 52);
  EXPECT_EQ(static_cast<int>(w.result.blocks_raw_by_decision), w.raw);
  // The raw blocks cost their size on disk; the compressed ones less.
  EXPECT_LT(w.result.stored_bytes, w.result.raw_bytes);
}

TEST_P(MixedShardTest, KeepsCompressingWhileItPays) {
  int decisions = 0;
  const Written w = WriteAndReadBack(FloatTensors(), Adaptive([&](const CompressionRates&) {
                                       ++decisions;
                                       return true;
                                     }),
                                     GetParam());
  EXPECT_EQ(w.raw, 0);
  EXPECT_EQ(w.planes, 52);
  EXPECT_EQ(w.result.blocks_raw_by_decision, 0u);
  // Every 3 blocks written, until the last.
  EXPECT_EQ(decisions, 52 / 3);
  EXPECT_EQ(w.result.compression_decisions, decisions);
}

INSTANTIATE_TEST_SUITE_P(Sources, MixedShardTest, ::testing::Bool(), [](const ::testing::TestParamInfo<bool>& p) {
  return p.param ? "AlignedSources" : "UnalignedSources";
});

TEST(AdaptiveCompressionTest, OffMeansNoDecision) {
  int decisions = 0;
  ShardWriteOptions options = Adaptive([&](const CompressionRates&) {
    ++decisions;
    return false;
  });
  options.adaptive.enabled = false;
  const Written w = WriteAndReadBack(FloatTensors(), options, false);
  EXPECT_EQ(decisions, 0);
  EXPECT_EQ(w.result.compression_decisions, 0);
  EXPECT_EQ(w.planes, 52);
}

TEST(AdaptiveCompressionTest, NothingToDecideWithoutCompression) {
  int decisions = 0;
  ShardWriteOptions options = Adaptive([&](const CompressionRates&) {
    ++decisions;
    return true;
  });
  options.encode.compress = false;
  const Written w = WriteAndReadBack(FloatTensors(), options, true);
  EXPECT_EQ(decisions, 0);
  EXPECT_EQ(w.raw, 52);
  EXPECT_EQ(w.result.blocks_raw_by_decision, 0u);
  EXPECT_EQ(w.result.stored_bytes, w.result.raw_bytes);
}

// The tensors as a writer takes them (pointing into `tensors`).
std::vector<TensorSource> SourcesOf(const std::vector<FloatTensor>& tensors) {
  std::vector<TensorSource> sources;
  for (const FloatTensor& t : tensors) sources.push_back({t.meta, t.data.data(), t.data.size()});
  return sources;
}

// A write asked to stop (the agent shuts down) ends there, and nothing of
// the shard is left: neither the temp file nor the shard.
TEST(StopTest, AWriteAskedToStopEndsWithNothingLeft) {
  for (int after : {0, 1, 17, 51}) {
    SCOPED_TRACE(after);
    MemFileSystem fs;
    const std::vector<FloatTensor> tensors = FloatTensors();
    const std::vector<TensorSource> sources = SourcesOf(tensors);
    ShardWriteOptions options;
    options.block_bytes = 64 << 10;
    int asked = 0;
    options.stop = [&] { return asked++ >= after; };
    absl::StatusOr<ShardWriteResult> w = WriteShard(&fs, "/shard", {"job", 10, 0, 1}, sources, options);
    EXPECT_THAT(w.status(), ::ckptd::testing::StatusIs(absl::StatusCode::kCancelled,
                                                        ::testing::HasSubstr(absl::StrCat("stopped with "))));
    EXPECT_THAT(w.status().message(), ::testing::HasSubstr("of 52 blocks written; nothing of the shard is kept"));
    EXPECT_FALSE(fs.Stat("/shard").ok());
    EXPECT_FALSE(fs.Stat(absl::StrCat("/shard", kTempSuffix)).ok());
  }
  // Never asked to stop: written whole.
  MemFileSystem fs;
  const std::vector<FloatTensor> tensors = FloatTensors();
  ShardWriteOptions options;
  options.block_bytes = 64 << 10;
  options.stop = [] { return false; };
  CKPTD_ASSERT_OK(WriteShard(&fs, "/shard", {"job", 10, 0, 1}, SourcesOf(tensors), options).status());
  EXPECT_TRUE(fs.Stat("/shard").ok());
}

// The checks after the blocks: a stop that turns true only once every
// block's write is submitted still stops the write, before the index or
// before the fsync, and nothing of the shard is left.
TEST(StopTest, AStopAfterTheLastBlockStillLeavesNothing) {
  // Asked before each of the 52 blocks (0..51), before the index (52) and
  // before the fsync (53).
  for (const auto& [after, where] : {std::pair<int, std::string>{52, "with all 52 blocks written, before the index"},
                                     {53, "with all 52 blocks and the index written, before the fsync"}}) {
    SCOPED_TRACE(after);
    MemFileSystem fs;
    const std::vector<FloatTensor> tensors = FloatTensors();
    ShardWriteOptions options;
    options.block_bytes = 64 << 10;
    int asked = 0;
    options.stop = [&asked, after = after] { return asked++ >= after; };
    absl::StatusOr<ShardWriteResult> w = WriteShard(&fs, "/shard", {"job", 10, 0, 1}, SourcesOf(tensors), options);
    EXPECT_THAT(w.status(), ::ckptd::testing::StatusIs(
                                absl::StatusCode::kCancelled,
                                ::testing::AllOf(::testing::HasSubstr("writing shard /shard: stopped"),
                                                 ::testing::HasSubstr(where),
                                                 ::testing::HasSubstr("nothing of the shard is kept"))));
    EXPECT_EQ(asked, after + 1);
    EXPECT_FALSE(fs.Stat("/shard").ok());
    EXPECT_FALSE(fs.Stat(absl::StrCat("/shard", kTempSuffix)).ok());
  }
  // Asked 54 times in all, never saying stop: written whole.
  MemFileSystem fs;
  const std::vector<FloatTensor> tensors = FloatTensors();
  ShardWriteOptions options;
  options.block_bytes = 64 << 10;
  int asked = 0;
  options.stop = [&] { return asked++ >= 54; };
  CKPTD_ASSERT_OK(WriteShard(&fs, "/shard", {"job", 10, 0, 1}, SourcesOf(tensors), options).status());
  EXPECT_EQ(asked, 54);
  EXPECT_TRUE(fs.Stat("/shard").ok());
}

// Files that report the alignment of O_DIRECT (what a writer takes for a
// file written direct) around another file system's.
class PretendDirectFileSystem : public FileSystem {
 public:
  explicit PretendDirectFileSystem(FileSystem* base) : base_(base) {}
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                                const OpenOptions& options) override {
    absl::StatusOr<std::unique_ptr<WritableFile>> f = base_->NewWritableFile(path, options);
    if (!f.ok() || !options.direct_io) return f;
    return std::unique_ptr<WritableFile>(std::make_unique<File>(*std::move(f)));
  }
  absl::StatusOr<std::unique_ptr<ReadableFile>> NewReadableFile(const std::string& path,
                                                                const OpenOptions& options) override {
    return base_->NewReadableFile(path, options);
  }
  absl::Status CreateDir(const std::string& path) override { return base_->CreateDir(path); }
  absl::Status RemoveFile(const std::string& path) override { return base_->RemoveFile(path); }
  absl::Status RemoveDir(const std::string& path) override { return base_->RemoveDir(path); }
  absl::Status Rename(const std::string& from, const std::string& to) override { return base_->Rename(from, to); }
  absl::Status SyncDir(const std::string& path) override { return base_->SyncDir(path); }
  absl::StatusOr<std::vector<FileInfo>> ListDir(const std::string& path) override { return base_->ListDir(path); }
  absl::StatusOr<FileInfo> Stat(const std::string& path) override { return base_->Stat(path); }

 private:
  class File : public ForwardingWritableFile {
   public:
    using ForwardingWritableFile::ForwardingWritableFile;
    size_t alignment() const override { return kShardAlignment; }
  };

  FileSystem* const base_;
};

// Buffered writes (memory files have alignment 1) are handed to writeback
// as they complete: in order, without gaps or overlaps, from the first block
// on, each piece at least writeback_bytes, so that the fsync has at most
// about that much left. A file written direct is not.
TEST(WritebackTest, BufferedWritesStartWritebackAsTheyGoDirectOnesDoNot) {
  const std::vector<FloatTensor> tensors = FloatTensors();  // 52 blocks of 64 KiB
  ShardWriteOptions options;
  options.block_bytes = 64 << 10;
  options.writeback_bytes = 256 << 10;
  options.direct_io = false;
  options.encode.compress = false;  // raw: block i ends at the header + (i + 1) x 64 KiB
  MemFileSystem mem;
  FaultInjectionFileSystem fs(&mem);
  CKPTD_ASSERT_OK_AND_ASSIGN(ShardWriteResult w,
                             WriteShard(&fs, "/shard", {"job", 10, 0, 1}, SourcesOf(tensors), options));
  const std::vector<FaultInjectionFileSystem::Writeback> writebacks = fs.writebacks();
  ASSERT_FALSE(writebacks.empty());
  uint64_t next = kShardHeaderBlock;  // the header is written last, with the index
  for (const FaultInjectionFileSystem::Writeback& b : writebacks) {
    EXPECT_EQ(b.path, absl::StrCat("/shard", kTempSuffix));
    EXPECT_EQ(b.offset, next) << "not in order, or a gap or overlap";
    EXPECT_GE(b.length, options.writeback_bytes);
    next = b.offset + b.length;
  }
  // Up to less than writeback_bytes before the blocks' end, never past it.
  const uint64_t blocks_end = kShardHeaderBlock + w.stored_bytes;
  EXPECT_LE(next, blocks_end);
  EXPECT_GT(next + options.writeback_bytes, blocks_end);
  EXPECT_EQ(writebacks.size(), 13u);  // 4 blocks each
  // Off: none.
  fs.Reset();
  options.writeback_bytes = 0;
  CKPTD_ASSERT_OK(WriteShard(&fs, "/shard", {"job", 10, 0, 1}, SourcesOf(tensors), options).status());
  EXPECT_TRUE(fs.writebacks().empty());
  // Written direct: none, whatever writeback_bytes says.
  fs.Reset();
  options.writeback_bytes = 256 << 10;
  options.direct_io = true;
  PretendDirectFileSystem direct(&fs);
  CKPTD_ASSERT_OK(WriteShard(&direct, "/shard", {"job", 10, 0, 1}, SourcesOf(tensors), options).status());
  EXPECT_TRUE(fs.writebacks().empty());
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, ShardReader::Open(&mem, "/shard", {}, nullptr));
  EXPECT_THAT(reader->Verify(), ::ckptd::testing::IsOkAndHolds(IsEmpty()));
}

}  // namespace
}  // namespace ckptd::storage
