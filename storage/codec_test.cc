#include "storage/codec.h"

#include <zstd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "base/aligned_buffer.h"
#include "base/testing/matchers.h"
#include "format/checksum.h"
#include "format/tensor_size.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/testing_data.h"

namespace ckptd::storage {
namespace {

using ::ckptd::format::CopyAndXxh3;
using ::ckptd::format::DTypeSize;
using ::ckptd::format::Xxh3;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::ckptd::v1::DType;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

using ::ckptd::testing::Bytes;

using ::ckptd::testing::NormalFp32;
using ::ckptd::testing::RandomBytes;
using ::ckptd::testing::ToBf16;

// Data of `n` elements of `dtype`: normal floats for float dtypes, else random bytes.
Bytes DataFor(DType dtype, size_t n, uint64_t seed) {
  switch (dtype) {
    case ckptd::v1::FLOAT32:
      return NormalFp32(n, seed);
    case ckptd::v1::BFLOAT16:
    case ckptd::v1::FLOAT16:  // bf16 bits stand in for fp16: same plane structure
      return ToBf16(NormalFp32(n, seed));
    default:
      return RandomBytes(n * DTypeSize(dtype), seed);
  }
}

ckptd::v1::Block ToProto(const EncodedBlock& e, size_t raw_length) {
  ckptd::v1::Block b;
  b.set_raw_length(raw_length);
  b.set_filter(e.filter);
  b.set_element_size(e.element_size);
  b.set_raw_xxh3(e.raw_xxh3);
  for (const EncodedChunk& c : e.chunks) {
    ckptd::v1::Chunk* pc = b.add_chunks();
    pc->set_file_offset(c.buffer_offset);
    pc->set_stored_length(c.stored_length);
    pc->set_raw_length(c.raw_length);
    pc->set_codec(c.codec);
    pc->set_stored_xxh3(c.stored_xxh3);
  }
  return b;
}

// An encoded block with its output buffer, ready to decode.
struct Encoded {
  EncodedBlock block;
  Bytes out;
  ckptd::v1::Block proto;
  std::vector<const uint8_t*> ptrs;

  void RefreshPointers() {
    ptrs.clear();
    for (const auto& c : proto.chunks()) ptrs.push_back(out.data() + c.file_offset());
  }
};

// Encodes `raw`, checks the layout invariants, returns the result.
Encoded EncodeChecked(BlockEncoder& enc, DType dtype, const Bytes& raw, size_t alignment) {
  Encoded e;
  // Garbage-filled output: padding must be written as zero by Encode.
  e.out.assign(BlockEncoder::MaxEncodedLength(raw.size(), alignment), 0xA5);
  auto r = enc.Encode(dtype, raw.data(), raw.size(), e.out.data(), e.out.size(), alignment);
  EXPECT_THAT(r.status(), IsOk());
  if (!r.ok()) return e;
  e.block = *r;
  EXPECT_EQ(e.block.raw_xxh3, Xxh3(raw.data(), raw.size()));
  EXPECT_EQ(e.block.encoded_length % alignment, 0u);
  EXPECT_LE(e.block.encoded_length, e.out.size());
  uint64_t cursor = 0;
  for (size_t i = 0; i < e.block.chunks.size(); ++i) {
    const EncodedChunk& c = e.block.chunks[i];
    EXPECT_EQ(c.buffer_offset % alignment, 0u) << "chunk " << i;
    EXPECT_GE(c.buffer_offset, cursor) << "chunk " << i;
    for (uint64_t j = cursor; j < c.buffer_offset; ++j) {
      EXPECT_EQ(e.out[j], 0) << "padding before chunk " << i << " at " << j;
    }
    EXPECT_EQ(c.stored_xxh3, Xxh3(e.out.data() + c.buffer_offset, c.stored_length));
    cursor = c.buffer_offset + c.stored_length;
  }
  EXPECT_LE(cursor, e.block.encoded_length);
  for (uint64_t j = cursor; j < e.block.encoded_length; ++j) {
    EXPECT_EQ(e.out[j], 0) << "tail padding at " << j;
  }
  e.proto = ToProto(e.block, raw.size());
  EXPECT_THAT(BlockDecoder::Validate(e.proto), IsOk());
  e.RefreshPointers();
  return e;
}

absl::Status DecodeInto(BlockDecoder& dec, const Encoded& e, Bytes& dest) {
  dest.assign(e.proto.raw_length(), 0x5A);
  return dec.Decode(e.proto, e.ptrs.data(), dest.data());
}

void ExpectRoundTrip(BlockEncoder& enc, BlockDecoder& dec, DType dtype, const Bytes& raw,
                     size_t alignment) {
  Encoded e = EncodeChecked(enc, dtype, raw, alignment);
  Bytes back;
  ASSERT_THAT(DecodeInto(dec, e, back), IsOk());
  ASSERT_TRUE(back == raw) << "round trip differs, dtype " << dtype << " bytes " << raw.size();
}

double Ratio(const EncodedBlock& b) {
  uint64_t raw = 0, stored = 0;
  for (const auto& c : b.chunks) {
    raw += c.raw_length;
    stored += c.stored_length;
  }
  return stored == 0 ? 0 : static_cast<double>(raw) / static_cast<double>(stored);
}

const DType kAllDTypes[] = {
    ckptd::v1::BYTES,      ckptd::v1::FLOAT32,     ckptd::v1::BFLOAT16, ckptd::v1::FLOAT16,
    ckptd::v1::FLOAT64,    ckptd::v1::INT8,        ckptd::v1::UINT8,    ckptd::v1::INT16,
    ckptd::v1::INT32,      ckptd::v1::INT64,       ckptd::v1::BOOL,     ckptd::v1::FLOAT8_E4M3,
    ckptd::v1::FLOAT8_E5M2,
};

TEST(DTypeTest, Sizes) {
  EXPECT_EQ(DTypeSize(ckptd::v1::FLOAT32), 4u);
  EXPECT_EQ(DTypeSize(ckptd::v1::INT32), 4u);
  EXPECT_EQ(DTypeSize(ckptd::v1::BFLOAT16), 2u);
  EXPECT_EQ(DTypeSize(ckptd::v1::FLOAT16), 2u);
  EXPECT_EQ(DTypeSize(ckptd::v1::INT16), 2u);
  EXPECT_EQ(DTypeSize(ckptd::v1::FLOAT64), 8u);
  EXPECT_EQ(DTypeSize(ckptd::v1::INT64), 8u);
  for (DType d : {ckptd::v1::BYTES, ckptd::v1::INT8, ckptd::v1::UINT8, ckptd::v1::BOOL,
                  ckptd::v1::FLOAT8_E4M3, ckptd::v1::FLOAT8_E5M2}) {
    EXPECT_EQ(DTypeSize(d), 1u) << d;
  }
  EXPECT_EQ(DTypeSize(ckptd::v1::DTYPE_UNSPECIFIED), 0u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(99)), 0u);
  EXPECT_TRUE(UsesBytePlanes(ckptd::v1::FLOAT32));
  EXPECT_TRUE(UsesBytePlanes(ckptd::v1::BFLOAT16));
  EXPECT_TRUE(UsesBytePlanes(ckptd::v1::FLOAT16));
  EXPECT_FALSE(UsesBytePlanes(ckptd::v1::FLOAT64));
  EXPECT_FALSE(UsesBytePlanes(ckptd::v1::INT32));
  EXPECT_FALSE(UsesBytePlanes(ckptd::v1::BYTES));
}

class RoundTripTest : public ::testing::TestWithParam<size_t> {};

TEST_P(RoundTripTest, EveryDTypeSeveralLengths) {
  const size_t alignment = GetParam();
  BlockEncoder enc(EncodeOptions{});  // reused across all calls
  BlockDecoder dec;
  uint64_t seed = 1;
  for (DType dtype : kAllDTypes) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{17}, size_t{31}, size_t{33},
                     size_t{1001}, size_t{4097}, size_t{65537}}) {
      SCOPED_TRACE(::testing::Message() << "dtype " << dtype << " elements " << n);
      Bytes raw = DataFor(dtype, n, seed++);
      ExpectRoundTrip(enc, dec, dtype, raw, alignment);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST_P(RoundTripTest, FourMiBBlocks) {
  const size_t alignment = GetParam();
  BlockEncoder enc(EncodeOptions{});
  BlockDecoder dec;
  constexpr size_t kBytes = 4 << 20;
  for (DType dtype : {ckptd::v1::FLOAT32, ckptd::v1::BFLOAT16, ckptd::v1::BYTES, ckptd::v1::INT64}) {
    SCOPED_TRACE(::testing::Message() << "dtype " << dtype);
    ExpectRoundTrip(enc, dec, dtype, DataFor(dtype, kBytes / DTypeSize(dtype), 7), alignment);
  }
}

INSTANTIATE_TEST_SUITE_P(Alignments, RoundTripTest, ::testing::Values(1, 512, 4096));

TEST(CodecTest, ZeroLengthIsOneRawChunk) {
  for (DType dtype : {ckptd::v1::FLOAT32, ckptd::v1::BYTES}) {
    BlockEncoder enc(EncodeOptions{});
    Encoded e = EncodeChecked(enc, dtype, Bytes{}, 4096);
    ASSERT_EQ(e.block.chunks.size(), 1u);
    EXPECT_EQ(e.block.filter, ckptd::v1::FILTER_NONE);
    EXPECT_EQ(e.block.chunks[0].codec, ckptd::v1::RAW);
    EXPECT_EQ(e.block.chunks[0].stored_length, 0u);
    EXPECT_EQ(e.block.encoded_length, 0u);
    BlockDecoder dec;
    const uint8_t* none = nullptr;
    EXPECT_THAT(dec.Decode(e.proto, &none, nullptr), IsOk());
  }
}

TEST(CodecTest, CompressFalseGivesOneRawChunk) {
  EncodeOptions opt;
  opt.compress = false;
  BlockEncoder enc(opt);
  BlockDecoder dec;
  for (DType dtype : {ckptd::v1::FLOAT32, ckptd::v1::BFLOAT16, ckptd::v1::BYTES}) {
    // Compressible data of each kind: must still be stored RAW.
    Bytes data = dtype == ckptd::v1::BYTES ? Bytes(100000, 0) : DataFor(dtype, 1000, 3);
    Encoded e = EncodeChecked(enc, dtype, data, 4096);
    ASSERT_EQ(e.block.chunks.size(), 1u);
    EXPECT_EQ(e.block.filter, ckptd::v1::FILTER_NONE);
    EXPECT_EQ(e.block.element_size, 0u);
    EXPECT_EQ(e.block.chunks[0].codec, ckptd::v1::RAW);
    EXPECT_EQ(e.block.chunks[0].buffer_offset, 0u);
    EXPECT_EQ(e.block.chunks[0].stored_length, data.size());
    EXPECT_EQ(e.block.chunks[0].stored_xxh3, e.block.raw_xxh3);
    EXPECT_EQ(0, std::memcmp(e.out.data(), data.data(), data.size()));
    Bytes back;
    ASSERT_THAT(DecodeInto(dec, e, back), IsOk());
    EXPECT_TRUE(back == data);
  }
}

TEST(CodecTest, RatioOnNormalFloats) {
  BlockEncoder enc(EncodeOptions{});
  BlockDecoder dec;
  Bytes fp32 = NormalFp32((4 << 20) / 4, 42);
  Bytes bf16 = ToBf16(NormalFp32((4 << 20) / 2, 43));

  Encoded e32 = EncodeChecked(enc, ckptd::v1::FLOAT32, fp32, 4096);
  ASSERT_EQ(e32.block.filter, ckptd::v1::BYTE_PLANES);
  ASSERT_EQ(e32.block.element_size, 4u);
  ASSERT_EQ(e32.block.chunks.size(), 4u);
  EXPECT_EQ(e32.block.chunks[0].codec, ckptd::v1::RAW);
  EXPECT_EQ(e32.block.chunks[1].codec, ckptd::v1::RAW);
  EXPECT_EQ(e32.block.chunks[2].codec, ckptd::v1::RAW);
  EXPECT_EQ(e32.block.chunks[3].codec, ckptd::v1::ZSTD);
  double r32 = Ratio(e32.block);
  EXPECT_GE(r32, 1.15);

  Encoded e16 = EncodeChecked(enc, ckptd::v1::BFLOAT16, bf16, 4096);
  ASSERT_EQ(e16.block.chunks.size(), 2u);
  EXPECT_EQ(e16.block.chunks[0].codec, ckptd::v1::RAW);
  EXPECT_EQ(e16.block.chunks[1].codec, ckptd::v1::ZSTD);
  double r16 = Ratio(e16.block);
  EXPECT_GE(r16, 1.40);

  std::cout << "ratio fp32 normal(0,0.02): " << r32 << ", bf16: " << r16 << std::endl;
  RecordProperty("ratio_fp32", std::to_string(r32));
  RecordProperty("ratio_bf16", std::to_string(r16));

  Bytes back;
  ASSERT_THAT(DecodeInto(dec, e32, back), IsOk());
  EXPECT_TRUE(back == fp32);
  ASSERT_THAT(DecodeInto(dec, e16, back), IsOk());
  EXPECT_TRUE(back == bf16);
}

// Other optimizer-like distributions: must round-trip and never expand.
TEST(CodecTest, OtherDistributions) {
  BlockEncoder enc(EncodeOptions{});
  BlockDecoder dec;
  constexpr size_t kN = 1 << 18;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<std::pair<std::string, std::vector<float>>> sets;
  {
    std::vector<float> v(kN);  // Adam second moment: small, all positive
    for (auto& x : v) x = normal(rng) * normal(rng);
    sets.emplace_back("adam_v", v);
  }
  {
    std::vector<float> v(kN);  // master weights with wide spread
    std::normal_distribution<float> wide(0.0f, 1.0f);
    for (auto& x : v) x = wide(rng) * std::exp(wide(rng) * 3);
    sets.emplace_back("wide", v);
  }
  {
    std::vector<float> v(kN, 1.0f);  // constant (e.g. LayerNorm init)
    sets.emplace_back("ones", v);
  }
  for (const auto& [name, v] : sets) {
    Bytes fp32(v.size() * 4);
    std::memcpy(fp32.data(), v.data(), fp32.size());
    for (const Bytes& raw : {fp32, ToBf16(fp32)}) {
      DType dtype = raw.size() == fp32.size() ? ckptd::v1::FLOAT32 : ckptd::v1::BFLOAT16;
      Encoded e = EncodeChecked(enc, dtype, raw, 4096);
      double r = Ratio(e.block);
      EXPECT_GE(r, 1.0) << name;
      std::cout << "ratio " << name << (dtype == ckptd::v1::FLOAT32 ? " fp32: " : " bf16: ") << r
                << std::endl;
      Bytes back;
      ASSERT_THAT(DecodeInto(dec, e, back), IsOk());
      EXPECT_TRUE(back == raw) << name;
    }
  }
}

TEST(CodecTest, IncompressibleStoredRaw) {
  BlockEncoder enc(EncodeOptions{});
  Bytes random = RandomBytes(1 << 20, 5);
  Encoded e = EncodeChecked(enc, ckptd::v1::BYTES, random, 4096);
  ASSERT_EQ(e.block.chunks.size(), 1u);
  EXPECT_EQ(e.block.chunks[0].codec, ckptd::v1::RAW);
  EXPECT_EQ(e.block.chunks[0].stored_length, random.size());
  // Random bit patterns as fp32: every plane near 8 bits/byte, all RAW.
  Encoded f = EncodeChecked(enc, ckptd::v1::FLOAT32, random, 4096);
  ASSERT_EQ(f.block.chunks.size(), 4u);
  for (const auto& c : f.block.chunks) EXPECT_EQ(c.codec, ckptd::v1::RAW);
}

TEST(CodecTest, ZerosCompressWell) {
  BlockEncoder enc(EncodeOptions{});
  BlockDecoder dec;
  Bytes zeros(1 << 20, 0);
  for (DType dtype : {ckptd::v1::BYTES, ckptd::v1::FLOAT32, ckptd::v1::BFLOAT16, ckptd::v1::INT64}) {
    Encoded e = EncodeChecked(enc, dtype, zeros, 1);
    for (const auto& c : e.block.chunks) EXPECT_EQ(c.codec, ckptd::v1::ZSTD) << dtype;
    EXPECT_GE(Ratio(e.block), 100.0) << dtype;
    Bytes back;
    ASSERT_THAT(DecodeInto(dec, e, back), IsOk());
    EXPECT_TRUE(back == zeros);
  }
}

TEST(CodecTest, MinSavingIsHonoured) {
  // bf16 exponent plane compresses ~2.9x; demand more and it must be RAW.
  EncodeOptions opt;
  opt.min_saving = 0.9;
  BlockEncoder enc(opt);
  Encoded e = EncodeChecked(enc, ckptd::v1::BFLOAT16, ToBf16(NormalFp32(1 << 16, 8)), 64);
  for (const auto& c : e.block.chunks) EXPECT_EQ(c.codec, ckptd::v1::RAW);
  BlockDecoder dec;
  Bytes back;
  EXPECT_THAT(DecodeInto(dec, e, back), IsOk());
}

TEST(CodecTest, EncodeRejectsBadArguments) {
  BlockEncoder enc(EncodeOptions{});
  Bytes raw(10, 1);
  Bytes out(BlockEncoder::MaxEncodedLength(raw.size(), 4096));
  EXPECT_THAT(enc.Encode(ckptd::v1::FLOAT32, raw.data(), raw.size(), out.data(), out.size(), 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiple")));
  EXPECT_THAT(enc.Encode(ckptd::v1::BYTES, raw.data(), raw.size(), out.data(), out.size() - 1, 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("MaxEncodedLength")));
  EXPECT_THAT(enc.Encode(ckptd::v1::DTYPE_UNSPECIFIED, raw.data(), raw.size(), out.data(),
                         out.size(), 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
  EXPECT_THAT(enc.Encode(ckptd::v1::BYTES, raw.data(), raw.size(), out.data(), out.size(), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("alignment")));
}

TEST(CodecTest, MaxEncodedLengthCoversWorstCase) {
  // k chunks, each up to ZSTD_compressBound of its share, plus up to
  // alignment - 1 bytes of padding after each.
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{200000}, size_t{1} << 20}) {
    for (size_t a : {size_t{1}, size_t{4096}}) {
      for (size_t k = 1; k <= 8; ++k) {
        size_t need = k * (a - 1);
        for (size_t i = 0; i < k; ++i) need += ZSTD_compressBound(n / k + (i == 0 ? n % k : 0));
        EXPECT_GE(BlockEncoder::MaxEncodedLength(n, a), need) << n << " " << a << " " << k;
      }
    }
  }
}

std::string ShellQuote(const std::string& s) { return "'" + s + "'"; }

TEST(CodecTest, ZstdCliDecodesChunk) {
  if (!std::filesystem::exists("/usr/bin/zstd")) GTEST_SKIP() << "no /usr/bin/zstd";
  BlockEncoder enc(EncodeOptions{});
  Bytes fp32 = NormalFp32(100000, 11);
  Encoded e = EncodeChecked(enc, ckptd::v1::FLOAT32, fp32, 4096);
  ASSERT_EQ(e.block.chunks[3].codec, ckptd::v1::ZSTD);
  Bytes planes(fp32.size());
  SplitBytePlanes(fp32.data(), fp32.size() / 4, 4, planes.data());
  Bytes plane3(planes.begin() + 3 * 100000, planes.end());

  Encoded b = EncodeChecked(enc, ckptd::v1::BYTES, Bytes(50000, 7), 1);
  ASSERT_EQ(b.block.chunks[0].codec, ckptd::v1::ZSTD);

  const std::string dir = ::testing::TempDir();
  for (const auto& [enc_block, expected] :
       {std::pair<const Encoded*, Bytes>{&e, plane3}, {&b, Bytes(50000, 7)}}) {
    const EncodedChunk& c = enc_block->block.chunks.back();
    std::string in = dir + "/codec_test_chunk.zst";
    std::string out = dir + "/codec_test_chunk.raw";
    {
      std::ofstream f(in, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(enc_block->out.data() + c.buffer_offset),
              static_cast<std::streamsize>(c.stored_length));
    }
    std::string cmd = "/usr/bin/zstd -q -d -f " + ShellQuote(in) + " -o " + ShellQuote(out);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream f(out, std::ios::binary);
    Bytes got((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(got == expected);
    std::remove(in.c_str());
    std::remove(out.c_str());
  }
}

// A compressible fp32 block: chunk 3 ZSTD, chunks 0..2 RAW.
Encoded Fp32Block(BlockEncoder& enc) {
  return EncodeChecked(enc, ckptd::v1::FLOAT32, NormalFp32(50000, 21), 512);
}

void Recompute(Encoded& e, int i) {
  auto* c = e.proto.mutable_chunks(i);
  c->set_stored_xxh3(Xxh3(e.out.data() + c->file_offset(), c->stored_length()));
}

TEST(CodecCorruptionTest, FlippedByteIsChecksumMismatch) {
  BlockEncoder enc(EncodeOptions{});
  BlockDecoder dec;
  for (int i = 0; i < 4; ++i) {
    Encoded e = Fp32Block(enc);
    e.out[e.proto.chunks(i).file_offset() + e.proto.chunks(i).stored_length() / 2] ^= 0x10;
    Bytes back;
    EXPECT_THAT(DecodeInto(dec, e, back),
                StatusIs(absl::StatusCode::kDataLoss,
                         StartsWith("chunk " + std::to_string(i) + ": checksum mismatch")));
  }
  // Unfiltered ZSTD and RAW blocks too.
  for (const Bytes& raw : {Bytes(10000, 3), RandomBytes(10000, 4)}) {
    Encoded e = EncodeChecked(enc, ckptd::v1::BYTES, raw, 1);
    e.out[5] ^= 1;
    Bytes back;
    EXPECT_THAT(DecodeInto(dec, e, back),
                StatusIs(absl::StatusCode::kDataLoss, StartsWith("chunk 0: checksum mismatch")));
  }
}

TEST(CodecCorruptionTest, CorruptRawPlaneWithValidChecksumFailsBlockChecksum) {
  BlockEncoder enc(EncodeOptions{});
  BlockDecoder dec;
  Encoded e = Fp32Block(enc);
  e.out[e.proto.chunks(1).file_offset() + 7] ^= 0x01;
  Recompute(e, 1);
  Bytes back;
  EXPECT_THAT(DecodeInto(dec, e, back),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("block checksum mismatch")));
}

TEST(CodecCorruptionTest, CorruptZstdFrameWithValidChecksum) {
  BlockEncoder enc(EncodeOptions{});
  BlockDecoder dec;
  Encoded clean = Fp32Block(enc);
  const auto& c3 = clean.proto.chunks(3);
  ASSERT_EQ(c3.codec(), ckptd::v1::ZSTD);
  std::mt19937_64 rng(77);
  int errors = 0;
  for (int iter = 0; iter < 300; ++iter) {
    Encoded e = clean;
    size_t pos = c3.file_offset() + rng() % c3.stored_length();
    e.out[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
    Recompute(e, 3);
    e.RefreshPointers();
    Bytes back;
    absl::Status s = DecodeInto(dec, e, back);
    if (s.ok()) {
      // A flip zstd cannot notice must still have produced the original data.
      Bytes expected = DataFor(ckptd::v1::FLOAT32, 50000, 21);
      EXPECT_TRUE(back == expected) << "pos " << pos;
    } else {
      ++errors;
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss,
                              AnyOf(StartsWith("chunk 3: zstd"), HasSubstr("block checksum"))))
          << "pos " << pos;
    }
  }
  EXPECT_GT(errors, 250);
}

TEST(CodecCorruptionTest, TruncatedFrame) {
  BlockEncoder enc(EncodeOptions{});
  BlockDecoder dec;
  Encoded clean = Fp32Block(enc);
  const uint64_t full = clean.proto.chunks(3).stored_length();
  for (uint64_t len : {uint64_t{1}, uint64_t{3}, uint64_t{6}, full / 2, full - 1}) {
    Encoded e = clean;
    e.proto.mutable_chunks(3)->set_stored_length(len);
    Recompute(e, 3);
    // The decoder must not read past the declared length: copy the frame
    // into an exactly-sized heap buffer so ASan would notice.
    std::vector<uint8_t> exact(e.out.begin() + e.proto.chunks(3).file_offset(),
                               e.out.begin() + e.proto.chunks(3).file_offset() + len);
    e.ptrs[3] = exact.data();
    Bytes back;
    EXPECT_THAT(DecodeInto(dec, e, back),
                StatusIs(absl::StatusCode::kDataLoss, StartsWith("chunk 3: zstd")))
        << "len " << len;
  }
}

TEST(CodecCorruptionTest, TrailingBytesAfterFrame) {
  BlockEncoder enc(EncodeOptions{});
  BlockDecoder dec;
  Encoded e = EncodeChecked(enc, ckptd::v1::BYTES, Bytes(10000, 3), 4096);
  ASSERT_EQ(e.proto.chunks(0).codec(), ckptd::v1::ZSTD);
  e.proto.mutable_chunks(0)->set_stored_length(e.proto.chunks(0).stored_length() + 1);
  Recompute(e, 0);
  Bytes back;
  EXPECT_THAT(DecodeInto(dec, e, back),
              StatusIs(absl::StatusCode::kDataLoss, StartsWith("chunk 0: zstd")));
}

TEST(CodecCorruptionTest, FrameContentSizeDisagrees) {
  BlockEncoder enc(EncodeOptions{});
  BlockDecoder dec;
  Encoded e = EncodeChecked(enc, ckptd::v1::BYTES, Bytes(10000, 3), 4096);
  ASSERT_EQ(e.proto.chunks(0).codec(), ckptd::v1::ZSTD);
  e.proto.set_raw_length(10001);
  e.proto.mutable_chunks(0)->set_raw_length(10001);
  Bytes back;
  EXPECT_THAT(DecodeInto(dec, e, back),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("content size")));
}

TEST(CodecValidateTest, Rejects) {
  BlockEncoder enc(EncodeOptions{});
  const Encoded good = Fp32Block(enc);
  ASSERT_THAT(BlockDecoder::Validate(good.proto), IsOk());
  const auto dataloss = [](auto matcher) {
    return StatusIs(absl::StatusCode::kDataLoss, matcher);
  };

  {  // wrong chunk count
    ckptd::v1::Block b = good.proto;
    b.mutable_chunks()->RemoveLast();
    EXPECT_THAT(BlockDecoder::Validate(b), dataloss(HasSubstr("3 chunks")));
  }
  {  // wrong element size
    ckptd::v1::Block b = good.proto;
    b.set_element_size(3);
    EXPECT_THAT(BlockDecoder::Validate(b), dataloss(HasSubstr("element_size 3")));
    b.set_element_size(8);
    EXPECT_THAT(BlockDecoder::Validate(b), dataloss(HasSubstr("element_size 8")));
    b.set_element_size(2);
    EXPECT_THAT(BlockDecoder::Validate(b), dataloss(HasSubstr("4 chunks != element_size 2")));
  }
  {  // plane length disagrees
    ckptd::v1::Block b = good.proto;
    b.mutable_chunks(1)->set_raw_length(b.chunks(1).raw_length() + 1);
    EXPECT_THAT(BlockDecoder::Validate(b), dataloss(StartsWith("chunk 1: raw_length")));
  }
  {  // raw_length not a multiple of element size
    ckptd::v1::Block b = good.proto;
    b.set_raw_length(b.raw_length() + 1);
    EXPECT_THAT(BlockDecoder::Validate(b), dataloss(HasSubstr("not a multiple")));
  }
  {  // RAW with stored != raw
    ckptd::v1::Block b = good.proto;
    b.mutable_chunks(2)->set_stored_length(5);
    b.mutable_chunks(2)->set_raw_length(b.chunks(2).raw_length());
    EXPECT_THAT(BlockDecoder::Validate(b),
                dataloss(AllOf(StartsWith("chunk 2: stored_length 5 != raw_length"),
                               HasSubstr("for RAW"))));
  }
  {  // ZSTD stored > bound, and 0
    ckptd::v1::Block b = good.proto;
    b.mutable_chunks(3)->set_stored_length(ZSTD_compressBound(b.chunks(3).raw_length()) + 1);
    EXPECT_THAT(BlockDecoder::Validate(b), dataloss(StartsWith("chunk 3: stored_length")));
    b.mutable_chunks(3)->set_stored_length(0);
    EXPECT_THAT(BlockDecoder::Validate(b), dataloss(StartsWith("chunk 3: stored_length 0")));
  }
  {  // unknown codec values
    ckptd::v1::Block b = good.proto;
    b.mutable_chunks(0)->set_codec(static_cast<ckptd::v1::Codec>(7));
    EXPECT_THAT(BlockDecoder::Validate(b), dataloss(HasSubstr("chunk 0: unknown codec 7")));
    b.mutable_chunks(0)->set_codec(ckptd::v1::CODEC_UNSPECIFIED);
    EXPECT_THAT(BlockDecoder::Validate(b), dataloss(HasSubstr("chunk 0: unknown codec 0")));
  }
  {  // unknown filter
    ckptd::v1::Block b = good.proto;
    b.set_filter(static_cast<ckptd::v1::Filter>(9));
    EXPECT_THAT(BlockDecoder::Validate(b), dataloss(HasSubstr("unknown filter 9")));
  }
  {  // FILTER_NONE shapes
    Encoded e = EncodeChecked(enc, ckptd::v1::BYTES, Bytes(1000, 1), 1);
    ckptd::v1::Block b = e.proto;
    ASSERT_THAT(BlockDecoder::Validate(b), IsOk());
    b.set_element_size(4);
    EXPECT_THAT(BlockDecoder::Validate(b), dataloss(HasSubstr("element_size 4")));
    b = e.proto;
    *b.add_chunks() = b.chunks(0);
    EXPECT_THAT(BlockDecoder::Validate(b), dataloss(HasSubstr("2 chunks")));
    b = e.proto;
    b.set_raw_length(999);
    EXPECT_THAT(BlockDecoder::Validate(b), dataloss(StartsWith("chunk 0: raw_length 1000")));
  }
  {  // Decode validates first
    ckptd::v1::Block b = good.proto;
    b.mutable_chunks()->RemoveLast();
    BlockDecoder dec;
    Bytes back(b.raw_length());
    EXPECT_THAT(dec.Decode(b, good.ptrs.data(), back.data()), dataloss(HasSubstr("chunks")));
  }
}

TEST(BytePlanesTest, SplitJoinRoundTrip) {
  for (size_t es = 1; es <= 8; ++es) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{15}, size_t{16}, size_t{17},
                     size_t{31}, size_t{32}, size_t{33}, size_t{63}, size_t{64}, size_t{65},
                     size_t{100}, size_t{1000}, size_t{4099}}) {
      SCOPED_TRACE(::testing::Message() << "es " << es << " n " << n);
      Bytes src = RandomBytes(n * es, es * 1000 + n);
      Bytes planes(n * es + 1, 0xEE);  // the extra byte must stay untouched
      SplitBytePlanes(src.data(), n, es, planes.data());
      for (size_t i = 0; i < n; ++i) {
        for (size_t b = 0; b < es; ++b) {
          ASSERT_EQ(planes[b * n + i], src[i * es + b]) << "element " << i << " byte " << b;
        }
      }
      EXPECT_EQ(planes.back(), 0xEE);
      Bytes back(n * es + 1, 0xEE);
      JoinBytePlanes(planes.data(), n, es, back.data());
      EXPECT_TRUE(std::equal(src.begin(), src.end(), back.begin()));
      EXPECT_EQ(back.back(), 0xEE);
    }
  }
}

TEST(CodecBenchmark, Throughput64MiBFp32) {
  // Informational only: best of 3 passes over 64 MiB in 4 MiB blocks, one
  // encoder and one decoder (steady state: contexts and scratch warm).
  constexpr size_t kBytes = 64 << 20;
  constexpr size_t kBlock = 4 << 20;
  constexpr size_t kBlocks = kBytes / kBlock;
  Bytes raw = NormalFp32(kBytes / 4, 99);
  BlockEncoder enc(EncodeOptions{});
  BlockDecoder dec;
  const size_t cap = BlockEncoder::MaxEncodedLength(kBlock, 4096);
  base::AlignedBuffer out(cap * kBlocks);  // zero-filled, so pre-faulted
  Bytes back(kBytes);
  std::vector<EncodedBlock> blocks(kBlocks);
  double enc_s = 1e9, dec_s = 1e9;
  uint64_t stored = 0;
  using Clock = std::chrono::steady_clock;
  for (int pass = 0; pass < 3; ++pass) {
    stored = 0;
    auto t0 = Clock::now();
    for (size_t i = 0; i < kBlocks; ++i) {
      auto r = enc.Encode(ckptd::v1::FLOAT32, raw.data() + i * kBlock, kBlock,
                          out.data() + i * cap, cap, 4096);
      ASSERT_THAT(r.status(), IsOk());
      for (const auto& c : r->chunks) stored += c.stored_length;
      blocks[i] = *std::move(r);
    }
    auto t1 = Clock::now();
    for (size_t i = 0; i < kBlocks; ++i) {
      ckptd::v1::Block b = ToProto(blocks[i], kBlock);
      const uint8_t* ptrs[4];
      for (size_t c = 0; c < 4; ++c) ptrs[c] = out.data() + i * cap + blocks[i].chunks[c].buffer_offset;
      ASSERT_THAT(dec.Decode(b, ptrs, back.data() + i * kBlock), IsOk());
    }
    auto t2 = Clock::now();
    enc_s = std::min(enc_s, std::chrono::duration<double>(t1 - t0).count());
    dec_s = std::min(dec_s, std::chrono::duration<double>(t2 - t1).count());
  }
  EXPECT_TRUE(back == raw);
  const double mb = kBytes / 1e6;
  std::cout << "fp32 normal(0,0.02), 64 MiB in 4 MiB blocks, one thread: encode " << mb / enc_s
            << " MB/s, decode " << mb / dec_s << " MB/s, ratio "
            << static_cast<double>(kBytes) / static_cast<double>(stored) << std::endl;
  RecordProperty("encode_mb_per_s", std::to_string(mb / enc_s));
  RecordProperty("decode_mb_per_s", std::to_string(mb / dec_s));

  // The byte-plane transform alone, on one 4 MiB block (cache-warm).
  Bytes planes(kBlock);
  double split_s = 1e9, join_s = 1e9;
  for (int pass = 0; pass < 5; ++pass) {
    auto t3 = Clock::now();
    SplitBytePlanes(raw.data(), kBlock / 4, 4, planes.data());
    auto t4 = Clock::now();
    JoinBytePlanes(planes.data(), kBlock / 4, 4, back.data());
    auto t5 = Clock::now();
    split_s = std::min(split_s, std::chrono::duration<double>(t4 - t3).count());
    join_s = std::min(join_s, std::chrono::duration<double>(t5 - t4).count());
  }
  EXPECT_EQ(0, std::memcmp(back.data(), raw.data(), kBlock));
  std::cout << "4-byte planes, 4 MiB: split " << kBlock / 1e6 / split_s << " MB/s, join "
            << kBlock / 1e6 / join_s << " MB/s" << std::endl;
}

}  // namespace
TEST(ChecksumTest, CopyAndXxh3CopiesAndHashesLikeAPlainCopyThenXxh3) {
  // Around the pieces it works in: empty, one byte, one piece, a piece and a
  // bit, many pieces and a tail.
  for (size_t n : {size_t{0}, size_t{1}, size_t{65536}, size_t{65537}, size_t{(4u << 20) + 12345}}) {
    std::vector<uint8_t> src(n);
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
    std::vector<uint8_t> dst(n, 0xEE);
    const uint64_t before = CopyAndXxh3(dst.data(), src.data(), n);
    EXPECT_EQ(before, Xxh3(src.data(), n)) << n;
    EXPECT_EQ(dst, src) << n;
    if (n > 0) {
      src[n - 1] ^= 1;  // the last byte counts
      const uint64_t after = CopyAndXxh3(dst.data(), src.data(), n);
      EXPECT_NE(after, before) << n;
      EXPECT_EQ(after, Xxh3(src.data(), n)) << n;
    }
  }
}

}  // namespace ckptd::storage
