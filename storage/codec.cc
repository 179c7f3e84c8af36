#include "storage/codec.h"

#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/aligned_buffer.h"
#include "format/checksum.h"
#include "format/tensor_size.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ckptd::storage {
namespace {

using ckptd::v1::DType;

// The most chunks a block has (one per byte plane; element sizes are <= 8).
constexpr size_t kMaxChunks = 8;
// ZSTD_compressBound's per-call margin for small inputs is at most this.
constexpr size_t kZstdSmallMargin = 64;

// Entropy sampling: up to kSampleSegments runs of kSampleSegmentLength
// consecutive elements, spread evenly across the block.
constexpr size_t kSampleSegments = 16;
constexpr size_t kSampleSegmentLength = 256;

// Entropy-style parameters for the sign+exponent plane (docs/format.md,
// "Compression"): within ~2% of order-0 entropy and ~3x faster than level 1.
// They change the search only; the output is a standard frame.
constexpr int kPlaneLevel = 1;
constexpr int kPlaneMinMatch = 7;
constexpr int kPlaneSearchLog = 1;
constexpr int kPlaneHashLog = 6;
constexpr int kPlaneChainLog = 6;

// Grow-only, uninitialised byte scratch.
class Scratch {
 public:
  uint8_t* Get(size_t n) {
    if (n > capacity_) {
      data_.reset(new uint8_t[n]);
      capacity_ = n;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t capacity_ = 0;
};

// memcpy that accepts null pointers when n == 0.
inline void CopyBytes(uint8_t* dst, const uint8_t* src, size_t n) {
  if (n != 0) std::memcpy(dst, src, n);
}
inline void ZeroBytes(uint8_t* dst, size_t n) {
  if (n != 0) std::memset(dst, 0, n);
}

// ---- Byte planes ----------------------------------------------------------
// planes[p] receives byte p of each of the n elements of src.

void SplitPlanes2(const uint8_t* src, size_t n, uint8_t* p0, uint8_t* p1) {
  size_t i = 0;
#if defined(__SSE2__)
  const __m128i lo = _mm_set1_epi16(0x00FF);
  for (; i + 32 <= n; i += 32) {
    const uint8_t* s = src + 2 * i;
    __m128i a0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    __m128i a1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    __m128i a2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    __m128i a3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    __m128i e01 = _mm_packus_epi16(_mm_and_si128(a0, lo), _mm_and_si128(a1, lo));
    __m128i e23 = _mm_packus_epi16(_mm_and_si128(a2, lo), _mm_and_si128(a3, lo));
    __m128i o01 = _mm_packus_epi16(_mm_srli_epi16(a0, 8), _mm_srli_epi16(a1, 8));
    __m128i o23 = _mm_packus_epi16(_mm_srli_epi16(a2, 8), _mm_srli_epi16(a3, 8));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p0 + i), e01);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p0 + i + 16), e23);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p1 + i), o01);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p1 + i + 16), o23);
  }
#endif
  for (; i < n; ++i) {
    p0[i] = src[2 * i];
    p1[i] = src[2 * i + 1];
  }
}

void SplitPlanes4(const uint8_t* src, size_t n, uint8_t* p0, uint8_t* p1, uint8_t* p2,
                  uint8_t* p3) {
  size_t i = 0;
#if defined(__SSE2__)
  const __m128i lo = _mm_set1_epi16(0x00FF);
  for (; i + 16 <= n; i += 16) {
    const uint8_t* s = src + 4 * i;
    __m128i a0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    __m128i a1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    __m128i a2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    __m128i a3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    // Even bytes (0, 2 of each element) and odd bytes (1, 3), interleaved per element.
    __m128i e01 = _mm_packus_epi16(_mm_and_si128(a0, lo), _mm_and_si128(a1, lo));
    __m128i e23 = _mm_packus_epi16(_mm_and_si128(a2, lo), _mm_and_si128(a3, lo));
    __m128i o01 = _mm_packus_epi16(_mm_srli_epi16(a0, 8), _mm_srli_epi16(a1, 8));
    __m128i o23 = _mm_packus_epi16(_mm_srli_epi16(a2, 8), _mm_srli_epi16(a3, 8));
    __m128i b0 = _mm_packus_epi16(_mm_and_si128(e01, lo), _mm_and_si128(e23, lo));
    __m128i b2 = _mm_packus_epi16(_mm_srli_epi16(e01, 8), _mm_srli_epi16(e23, 8));
    __m128i b1 = _mm_packus_epi16(_mm_and_si128(o01, lo), _mm_and_si128(o23, lo));
    __m128i b3 = _mm_packus_epi16(_mm_srli_epi16(o01, 8), _mm_srli_epi16(o23, 8));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p0 + i), b0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p1 + i), b1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p2 + i), b2);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p3 + i), b3);
  }
#endif
  for (; i < n; ++i) {
    p0[i] = src[4 * i];
    p1[i] = src[4 * i + 1];
    p2[i] = src[4 * i + 2];
    p3[i] = src[4 * i + 3];
  }
}

void JoinPlanes2(const uint8_t* p0, const uint8_t* p1, size_t n, uint8_t* dst) {
  size_t i = 0;
#if defined(__SSE2__)
  for (; i + 32 <= n; i += 32) {
    __m128i b0a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + i));
    __m128i b0b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + i + 16));
    __m128i b1a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + i));
    __m128i b1b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + i + 16));
    uint8_t* d = dst + 2 * i;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm_unpacklo_epi8(b0a, b1a));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 16), _mm_unpackhi_epi8(b0a, b1a));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 32), _mm_unpacklo_epi8(b0b, b1b));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 48), _mm_unpackhi_epi8(b0b, b1b));
  }
#endif
  for (; i < n; ++i) {
    dst[2 * i] = p0[i];
    dst[2 * i + 1] = p1[i];
  }
}

void JoinPlanes4(const uint8_t* p0, const uint8_t* p1, const uint8_t* p2, const uint8_t* p3,
                 size_t n, uint8_t* dst) {
  size_t i = 0;
#if defined(__SSE2__)
  for (; i + 16 <= n; i += 16) {
    __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + i));
    __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + i));
    __m128i b2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p2 + i));
    __m128i b3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p3 + i));
    __m128i lo01 = _mm_unpacklo_epi8(b0, b1);  // (byte0, byte1) of elements 0..7
    __m128i hi01 = _mm_unpackhi_epi8(b0, b1);  // ... of elements 8..15
    __m128i lo23 = _mm_unpacklo_epi8(b2, b3);
    __m128i hi23 = _mm_unpackhi_epi8(b2, b3);
    uint8_t* d = dst + 4 * i;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm_unpacklo_epi16(lo01, lo23));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 16), _mm_unpackhi_epi16(lo01, lo23));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 32), _mm_unpacklo_epi16(hi01, hi23));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 48), _mm_unpackhi_epi16(hi01, hi23));
  }
#endif
  for (; i < n; ++i) {
    dst[4 * i] = p0[i];
    dst[4 * i + 1] = p1[i];
    dst[4 * i + 2] = p2[i];
    dst[4 * i + 3] = p3[i];
  }
}

// Splits into `es` planes at arbitrary addresses (so RAW planes can land in
// the output directly).
void SplitPlanesTo(const uint8_t* src, size_t n, size_t es, uint8_t* const* planes) {
  switch (es) {
    case 1:
      CopyBytes(planes[0], src, n);
      return;
    case 2:
      SplitPlanes2(src, n, planes[0], planes[1]);
      return;
    case 4:
      SplitPlanes4(src, n, planes[0], planes[1], planes[2], planes[3]);
      return;
    default:
      for (size_t i = 0; i < n; ++i) {
        for (size_t b = 0; b < es; ++b) planes[b][i] = src[i * es + b];
      }
  }
}

// Joins `es` planes at arbitrary addresses (so RAW planes are read in place).
void JoinPlanesFrom(const uint8_t* const* planes, size_t n, size_t es, uint8_t* dst) {
  switch (es) {
    case 1:
      CopyBytes(dst, planes[0], n);
      return;
    case 2:
      JoinPlanes2(planes[0], planes[1], n, dst);
      return;
    case 4:
      JoinPlanes4(planes[0], planes[1], planes[2], planes[3], n, dst);
      return;
    default:
      for (size_t i = 0; i < n; ++i) {
        for (size_t b = 0; b < es; ++b) dst[i * es + b] = planes[b][i];
      }
  }
}

// ---- Compressibility estimate ---------------------------------------------

// Order-0 entropy in bits/byte of each byte plane of `raw` (n elements of
// es <= kMaxChunks bytes), from a sample of up to a few KiB per plane.
void EstimatePlaneEntropy(const uint8_t* raw, size_t n, size_t es, double* bits) {
  std::array<std::array<uint32_t, 256>, kMaxChunks> hist{};
  size_t segments = kSampleSegments;
  size_t seg_len = kSampleSegmentLength;
  if (n <= kSampleSegments * kSampleSegmentLength) {
    segments = 1;
    seg_len = n;
  }
  for (size_t s = 0; s < segments; ++s) {
    size_t start = segments == 1 ? 0 : s * (n - seg_len) / (segments - 1);
    const uint8_t* p = raw + start * es;
    for (size_t i = 0; i < seg_len * es; i += es) {
      for (size_t b = 0; b < es; ++b) ++hist[b][p[i + b]];
    }
  }
  const double total = static_cast<double>(segments * seg_len);
  for (size_t b = 0; b < es; ++b) {
    double h = 0;
    if (total > 0) {
      for (uint32_t c : hist[b]) {
        if (c == 0) continue;
        double q = c / total;
        h -= q * std::log2(q);
      }
    }
    bits[b] = h;
  }
}

// Largest stored length that still saves `min_saving` of n bytes.
size_t KeepLimit(size_t n, double min_saving) {
  double saving = std::clamp(min_saving, 0.0, 1.0);
  double limit = std::floor(static_cast<double>(n) * (1.0 - saving));
  return std::min(n, static_cast<size_t>(limit));
}

absl::Status ZstdError(const char* what, size_t code) {
  return absl::InternalError(absl::StrFormat("zstd %s: %s", what, ZSTD_getErrorName(code)));
}

}  // namespace

// ---- DType ----------------------------------------------------------------

bool UsesBytePlanes(DType dtype) {
  return dtype == ckptd::v1::FLOAT32 || dtype == ckptd::v1::BFLOAT16 ||
         dtype == ckptd::v1::FLOAT16;
}

// ---- Public byte-plane transform -------------------------------------------

void SplitBytePlanes(const uint8_t* src, size_t n_elements, size_t element_size,
                     uint8_t* planes) {
  if (element_size == 0 || n_elements == 0) return;
  if (element_size > kMaxChunks) {
    for (size_t i = 0; i < n_elements; ++i) {
      for (size_t b = 0; b < element_size; ++b) {
        planes[b * n_elements + i] = src[i * element_size + b];
      }
    }
    return;
  }
  std::array<uint8_t*, kMaxChunks> ptrs{};
  for (size_t b = 0; b < element_size; ++b) ptrs[b] = planes + b * n_elements;
  SplitPlanesTo(src, n_elements, element_size, ptrs.data());
}

void JoinBytePlanes(const uint8_t* planes, size_t n_elements, size_t element_size, uint8_t* dst) {
  if (element_size == 0 || n_elements == 0) return;
  if (element_size > kMaxChunks) {
    for (size_t i = 0; i < n_elements; ++i) {
      for (size_t b = 0; b < element_size; ++b) {
        dst[i * element_size + b] = planes[b * n_elements + i];
      }
    }
    return;
  }
  std::array<const uint8_t*, kMaxChunks> ptrs{};
  for (size_t b = 0; b < element_size; ++b) ptrs[b] = planes + b * n_elements;
  JoinPlanesFrom(ptrs.data(), n_elements, element_size, dst);
}

// ---- Encoder ---------------------------------------------------------------

struct BlockEncoder::Impl {
  enum class Kind { kPlane, kLevel };

  explicit Impl(const EncodeOptions& o) : options(o) {}
  ~Impl() { ZSTD_freeCCtx(cctx); }

  // Compresses src[0, n) into dst as one frame if it fits in `capacity`
  // bytes; returns the frame length, or 0 when it does not fit.
  absl::StatusOr<size_t> Compress(Kind kind, const uint8_t* src, size_t n, uint8_t* dst,
                                  size_t capacity) {
    if (capacity == 0) return 0;
    if (cctx == nullptr) {
      cctx = ZSTD_createCCtx();
      if (cctx == nullptr) return absl::ResourceExhaustedError("ZSTD_createCCtx failed");
    }
    size_t r = ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
    if (ZSTD_isError(r)) return ZstdError("reset", r);
    std::pair<ZSTD_cParameter, int> common[] = {
        {ZSTD_c_compressionLevel, kind == Kind::kPlane ? kPlaneLevel : options.zstd_level},
        {ZSTD_c_contentSizeFlag, 1},
        {ZSTD_c_checksumFlag, 0},
    };
    for (auto [param, value] : common) {
      r = ZSTD_CCtx_setParameter(cctx, param, value);
      if (ZSTD_isError(r)) return ZstdError("setParameter", r);
    }
    if (kind == Kind::kPlane) {
      std::pair<ZSTD_cParameter, int> plane[] = {
          {ZSTD_c_strategy, ZSTD_fast},
          {ZSTD_c_minMatch, kPlaneMinMatch},
          {ZSTD_c_searchLog, kPlaneSearchLog},
          {ZSTD_c_hashLog, kPlaneHashLog},
          {ZSTD_c_chainLog, kPlaneChainLog},
      };
      for (auto [param, value] : plane) {
        r = ZSTD_CCtx_setParameter(cctx, param, value);
        if (ZSTD_isError(r)) return ZstdError("setParameter", r);
      }
    }
    r = ZSTD_compress2(cctx, dst, capacity, src, n);
    if (ZSTD_isError(r)) {
      if (ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall) return 0;
      return ZstdError("compress", r);
    }
    return r;
  }

  EncodeOptions options;
  ZSTD_CCtx* cctx = nullptr;
  Scratch planes;
};

BlockEncoder::BlockEncoder(const EncodeOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}
BlockEncoder::~BlockEncoder() = default;

size_t BlockEncoder::MaxEncodedLength(size_t raw_length, size_t alignment) {
  // Sum over k <= 8 chunks of ZSTD_compressBound(chunk) <= compressBound(raw)
  // + 64 * k; each chunk adds at most alignment - 1 bytes of padding.
  size_t bound = ZSTD_compressBound(raw_length);
  if (ZSTD_isError(bound)) return std::numeric_limits<size_t>::max();
  return bound + kMaxChunks * (kZstdSmallMargin + alignment);
}

absl::StatusOr<EncodedBlock> BlockEncoder::Encode(DType dtype, const uint8_t* raw,
                                                  size_t raw_length, uint8_t* out,
                                                  size_t out_capacity, size_t alignment) {
  const size_t es = format::DTypeSize(dtype);
  if (es == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("unknown dtype %d", static_cast<int>(dtype)));
  }
  if (raw_length % es != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "raw_length %d is not a multiple of the element size %d", raw_length, es));
  }
  if (alignment == 0) return absl::InvalidArgumentError("alignment must be positive");
  const size_t need = MaxEncodedLength(raw_length, alignment);
  if (out_capacity < need) {
    return absl::InvalidArgumentError(
        absl::StrFormat("out_capacity %d < MaxEncodedLength %d", out_capacity, need));
  }
  if ((raw == nullptr && raw_length != 0) || out == nullptr) {
    return absl::InvalidArgumentError("null buffer");
  }

  EncodedBlock block;
  block.raw_xxh3 = format::Xxh3(raw, raw_length);
  const EncodeOptions& opt = impl_->options;

  if (!opt.compress || raw_length == 0 || !UsesBytePlanes(dtype)) {
    EncodedChunk chunk;
    chunk.raw_length = raw_length;
    if (opt.compress && raw_length != 0) {
      auto stored = impl_->Compress(Impl::Kind::kLevel, raw, raw_length, out,
                                    KeepLimit(raw_length, opt.min_saving));
      if (!stored.ok()) return stored.status();
      if (*stored != 0) {
        chunk.codec = ckptd::v1::ZSTD;
        chunk.stored_length = *stored;
        chunk.stored_xxh3 = format::Xxh3(out, *stored);
      }
    }
    if (chunk.codec == ckptd::v1::RAW) {
      CopyBytes(out, raw, raw_length);
      chunk.stored_length = raw_length;
      chunk.stored_xxh3 = block.raw_xxh3;
    }
    block.encoded_length = base::AlignUp(chunk.stored_length, alignment);
    ZeroBytes(out + chunk.stored_length, block.encoded_length - chunk.stored_length);
    block.chunks.push_back(chunk);
    return block;
  }

  // Byte planes: one chunk per plane.
  const size_t n = raw_length / es;
  block.filter = ckptd::v1::BYTE_PLANES;
  block.element_size = static_cast<uint32_t>(es);

  std::array<double, kMaxChunks> bits{};
  EstimatePlaneEntropy(raw, n, es, bits.data());
  const double try_below = 8.0 * (1.0 - std::clamp(opt.min_saving, 0.0, 1.0));
  std::array<bool, kMaxChunks> try_zstd{};
  size_t first_zstd = es;
  for (size_t p = 0; p < es; ++p) {
    try_zstd[p] = bits[p] < try_below;
    if (try_zstd[p] && first_zstd == es) first_zstd = p;
  }

  // Planes before the first one that may compress have known offsets and are
  // split straight into `out`; the rest go through scratch.
  std::array<uint8_t*, kMaxChunks> dst{};
  uint8_t* scratch = first_zstd < es ? impl_->planes.Get(raw_length) : nullptr;
  uint64_t offset = 0;
  for (size_t p = 0; p < es; ++p) {
    if (p < first_zstd) {
      dst[p] = out + offset;
      offset = base::AlignUp(offset + n, alignment);
    } else {
      dst[p] = scratch + p * n;
    }
  }
  SplitPlanesTo(raw, n, es, dst.data());

  uint64_t cursor = 0;
  for (size_t p = 0; p < es; ++p) {
    const uint64_t start = base::AlignUp(cursor, alignment);
    ZeroBytes(out + cursor, start - cursor);
    uint8_t* at = out + start;
    EncodedChunk chunk;
    chunk.buffer_offset = start;
    chunk.raw_length = n;
    chunk.stored_length = n;
    if (p >= first_zstd) {
      if (try_zstd[p]) {
        auto stored =
            impl_->Compress(Impl::Kind::kPlane, dst[p], n, at, KeepLimit(n, opt.min_saving));
        if (!stored.ok()) return stored.status();
        if (*stored != 0) {
          chunk.codec = ckptd::v1::ZSTD;
          chunk.stored_length = *stored;
        }
      }
      if (chunk.codec == ckptd::v1::RAW) CopyBytes(at, dst[p], n);
    }
    chunk.stored_xxh3 = format::Xxh3(at, chunk.stored_length);
    cursor = start + chunk.stored_length;
    block.chunks.push_back(chunk);
  }
  block.encoded_length = base::AlignUp(cursor, alignment);
  ZeroBytes(out + cursor, block.encoded_length - cursor);
  return block;
}

// ---- Decoder ---------------------------------------------------------------

struct BlockDecoder::Impl {
  ~Impl() { ZSTD_freeDCtx(dctx); }

  // Decompresses chunk `index` (one frame of `stored` bytes) into exactly
  // `raw_length` bytes at dst.
  absl::Status Decompress(int index, const uint8_t* src, size_t stored, uint8_t* dst,
                          size_t raw_length) {
    unsigned long long content = ZSTD_getFrameContentSize(src, stored);
    if (content == ZSTD_CONTENTSIZE_ERROR) {
      return absl::DataLossError(absl::StrFormat("chunk %d: zstd: not a valid frame header", index));
    }
    if (content == ZSTD_CONTENTSIZE_UNKNOWN) {
      return absl::DataLossError(absl::StrFormat("chunk %d: zstd: frame content size missing", index));
    }
    if (content != raw_length) {
      return absl::DataLossError(absl::StrFormat(
          "chunk %d: zstd frame content size %d != raw_length %d", index, content, raw_length));
    }
    size_t frame = ZSTD_findFrameCompressedSize(src, stored);
    if (ZSTD_isError(frame)) {
      return absl::DataLossError(
          absl::StrFormat("chunk %d: zstd: %s", index, ZSTD_getErrorName(frame)));
    }
    if (frame != stored) {
      return absl::DataLossError(absl::StrFormat(
          "chunk %d: zstd frame is %d bytes, stored_length %d", index, frame, stored));
    }
    if (dctx == nullptr) {
      dctx = ZSTD_createDCtx();
      if (dctx == nullptr) return absl::ResourceExhaustedError("ZSTD_createDCtx failed");
    }
    size_t r = ZSTD_decompressDCtx(dctx, dst, raw_length, src, stored);
    if (ZSTD_isError(r)) {
      return absl::DataLossError(absl::StrFormat("chunk %d: zstd: %s", index, ZSTD_getErrorName(r)));
    }
    if (r != raw_length) {
      return absl::DataLossError(absl::StrFormat("chunk %d: zstd decoded %d bytes, raw_length %d",
                                                 index, r, raw_length));
    }
    return absl::OkStatus();
  }

  ZSTD_DCtx* dctx = nullptr;
  Scratch planes;
};

BlockDecoder::BlockDecoder() : impl_(std::make_unique<Impl>()) {}
BlockDecoder::~BlockDecoder() = default;

absl::Status BlockDecoder::Validate(const ckptd::v1::Block& block) {
  const uint64_t raw_length = block.raw_length();
  const int n_chunks = block.chunks_size();
  uint64_t chunk_raw = 0;
  switch (block.filter()) {
    case ckptd::v1::FILTER_NONE:
      if (block.element_size() != 0) {
        return absl::DataLossError(
            absl::StrFormat("filter NONE: element_size %d != 0", block.element_size()));
      }
      if (n_chunks != 1) {
        return absl::DataLossError(absl::StrFormat("filter NONE: %d chunks, expected 1", n_chunks));
      }
      chunk_raw = raw_length;
      break;
    case ckptd::v1::BYTE_PLANES: {
      const uint32_t es = block.element_size();
      if (es != 2 && es != 4) {
        return absl::DataLossError(
            absl::StrFormat("BYTE_PLANES: element_size %d not in {2, 4}", es));
      }
      if (raw_length % es != 0) {
        return absl::DataLossError(absl::StrFormat(
            "BYTE_PLANES: raw_length %d not a multiple of element_size %d", raw_length, es));
      }
      if (static_cast<uint32_t>(n_chunks) != es) {
        return absl::DataLossError(
            absl::StrFormat("BYTE_PLANES: %d chunks != element_size %d", n_chunks, es));
      }
      chunk_raw = raw_length / es;
      break;
    }
    default:
      return absl::DataLossError(
          absl::StrFormat("unknown filter %d", static_cast<int>(block.filter())));
  }
  for (int i = 0; i < n_chunks; ++i) {
    const ckptd::v1::Chunk& c = block.chunks(i);
    if (c.raw_length() != chunk_raw) {
      return absl::DataLossError(absl::StrFormat("chunk %d: raw_length %d != expected %d", i,
                                                 c.raw_length(), chunk_raw));
    }
    switch (c.codec()) {
      case ckptd::v1::RAW:
        if (c.stored_length() != c.raw_length()) {
          return absl::DataLossError(absl::StrFormat("chunk %d: stored_length %d != raw_length %d for RAW",
                                                     i, c.stored_length(), c.raw_length()));
        }
        break;
      case ckptd::v1::ZSTD: {
        size_t bound = ZSTD_compressBound(c.raw_length());
        if (ZSTD_isError(bound)) {
          return absl::DataLossError(
              absl::StrFormat("chunk %d: raw_length %d too large for ZSTD", i, c.raw_length()));
        }
        if (c.stored_length() == 0 || c.stored_length() > bound) {
          return absl::DataLossError(absl::StrFormat(
              "chunk %d: stored_length %d outside (0, ZSTD_compressBound(%d) = %d] for ZSTD", i,
              c.stored_length(), c.raw_length(), bound));
        }
        break;
      }
      default:
        return absl::DataLossError(
            absl::StrFormat("chunk %d: unknown codec %d", i, static_cast<int>(c.codec())));
    }
  }
  return absl::OkStatus();
}

absl::Status BlockDecoder::Decode(const ckptd::v1::Block& block, const uint8_t* const* chunk_data,
                                  uint8_t* dest) {
  absl::Status valid = Validate(block);
  if (!valid.ok()) return valid;
  const size_t raw_length = block.raw_length();
  if (dest == nullptr && raw_length != 0) return absl::InvalidArgumentError("null dest");
  const int n_chunks = block.chunks_size();

  // Verifies chunk i's stored checksum; returns its stored bytes.
  auto checked = [&](int i, const uint8_t** data) -> absl::Status {
    const ckptd::v1::Chunk& c = block.chunks(i);
    *data = chunk_data[i];
    if (*data == nullptr && c.stored_length() != 0) {
      return absl::InvalidArgumentError(absl::StrFormat("chunk %d: null data", i));
    }
    uint64_t h = format::Xxh3(*data, c.stored_length());
    if (h != c.stored_xxh3()) {
      return absl::DataLossError(absl::StrFormat("chunk %d: checksum mismatch (stored xxh3 %s, expected %s)",
                                                 i, format::ChecksumHex(h), format::ChecksumHex(c.stored_xxh3())));
    }
    return absl::OkStatus();
  };

  if (block.filter() == ckptd::v1::FILTER_NONE) {
    const uint8_t* data = nullptr;
    absl::Status s = checked(0, &data);
    if (!s.ok()) return s;
    const ckptd::v1::Chunk& c = block.chunks(0);
    if (c.codec() == ckptd::v1::RAW) {
      CopyBytes(dest, data, raw_length);
    } else {
      s = impl_->Decompress(0, data, c.stored_length(), dest, raw_length);
      if (!s.ok()) return s;
    }
  } else {
    const size_t es = block.element_size();
    const size_t n = raw_length / es;
    std::array<const uint8_t*, kMaxChunks> planes{};
    uint8_t* scratch = nullptr;
    for (int i = 0; i < n_chunks; ++i) {
      const uint8_t* data = nullptr;
      absl::Status s = checked(i, &data);
      if (!s.ok()) return s;
      const ckptd::v1::Chunk& c = block.chunks(i);
      if (c.codec() == ckptd::v1::RAW) {
        planes[i] = data;  // joined in place, no copy
        continue;
      }
      if (scratch == nullptr) scratch = impl_->planes.Get(raw_length);
      uint8_t* plane = scratch + static_cast<size_t>(i) * n;
      s = impl_->Decompress(i, data, c.stored_length(), plane, n);
      if (!s.ok()) return s;
      planes[i] = plane;
    }
    if (n != 0) JoinPlanesFrom(planes.data(), n, es, dest);
  }

  uint64_t h = format::Xxh3(dest, raw_length);
  if (h != block.raw_xxh3()) {
    return absl::DataLossError(absl::StrFormat("block checksum mismatch (xxh3 %s, expected %s)",
                                               format::ChecksumHex(h), format::ChecksumHex(block.raw_xxh3())));
  }
  return absl::OkStatus();
}

}  // namespace ckptd::storage
