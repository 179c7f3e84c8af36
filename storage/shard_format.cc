#include "storage/shard_format.h"

#include "absl/strings/string_view.h"
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/aligned_buffer.h"
#include "format/checksum.h"

namespace ckptd::storage {

void PutFixed32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutFixed64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetFixed32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t GetFixed64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Header: magic[8] | version u32 | alignment u32 | zero[40] | xxh3(bytes 0..55) u64
void EncodeShardHeader(uint8_t out[kShardHeaderBytes], uint32_t version) {
  std::memset(out, 0, kShardHeaderBytes);
  std::memcpy(out, kShardMagic.data(), 8);
  PutFixed32(out + 8, version);
  PutFixed32(out + 12, kShardAlignment);
  PutFixed64(out + 56, format::Xxh3(out, 56));
}

namespace {

bool KnownVersion(uint32_t v) { return v >= kOldestShardFormatVersion && v <= kShardFormatVersion; }

std::string Unsupported(absl::string_view what, uint32_t version) {
  return absl::StrCat(what, ": shard format version ", version, " is not supported (this build reads ",
                      kOldestShardFormatVersion, " to ", kShardFormatVersion, ")");
}

}  // namespace

absl::StatusOr<uint32_t> DecodeShardHeader(const uint8_t in[kShardHeaderBytes], absl::string_view what) {
  if (std::memcmp(in, kShardMagic.data(), 8) != 0) {
    return absl::DataLossError(absl::StrCat(what, ": not a ckptd shard file (bad header magic)"));
  }
  const uint32_t version = GetFixed32(in + 8);
  if (!KnownVersion(version)) return absl::UnimplementedError(Unsupported(what, version));
  if (GetFixed64(in + 56) != format::Xxh3(in, 56)) {
    return absl::DataLossError(absl::StrCat(what, ": header checksum mismatch"));
  }
  if (GetFixed32(in + 12) != kShardAlignment) {
    return absl::DataLossError(absl::StrCat(what, ": header alignment ", GetFixed32(in + 12),
                                            " is not ", kShardAlignment));
  }
  return version;
}

// Footer: magic[8] | version u32 | flags u32 | index_offset u64 | index_length u64 |
//         index_xxh3 u64 | file_length u64 | zero u64 | xxh3(bytes 0..55) u64
void EncodeShardFooter(const ShardFooter& f, uint8_t out[kShardFooterBytes]) {
  std::memset(out, 0, kShardFooterBytes);
  std::memcpy(out, kShardFooterMagic.data(), 8);
  PutFixed32(out + 8, f.format_version);
  PutFixed32(out + 12, f.flags);
  PutFixed64(out + 16, f.index_offset);
  PutFixed64(out + 24, f.index_length);
  PutFixed64(out + 32, f.index_xxh3);
  PutFixed64(out + 40, f.file_length);
  PutFixed64(out + 56, format::Xxh3(out, 56));
}

absl::StatusOr<ShardFooter> DecodeShardFooter(const uint8_t in[kShardFooterBytes],
                                              uint64_t actual_file_length, absl::string_view what) {
  if (std::memcmp(in, kShardFooterMagic.data(), 8) != 0) {
    return absl::DataLossError(
        absl::StrCat(what, ": bad footer magic (file truncated, extended or not a shard)"));
  }
  if (!KnownVersion(GetFixed32(in + 8))) return absl::UnimplementedError(Unsupported(what, GetFixed32(in + 8)));
  if (GetFixed64(in + 56) != format::Xxh3(in, 56)) {
    return absl::DataLossError(absl::StrCat(what, ": footer checksum mismatch"));
  }
  if (actual_file_length < kShardHeaderBlock + kShardFooterBytes) {
    return absl::DataLossError(absl::StrCat(what, ": file of ", actual_file_length, " bytes is too short"));
  }
  ShardFooter f;
  f.format_version = GetFixed32(in + 8);
  f.flags = GetFixed32(in + 12);
  f.index_offset = GetFixed64(in + 16);
  f.index_length = GetFixed64(in + 24);
  f.index_xxh3 = GetFixed64(in + 32);
  f.file_length = GetFixed64(in + 40);
  if (f.flags != 0) {
    return absl::DataLossError(absl::StrCat(what, ": unknown footer flags ", f.flags));
  }
  if (f.file_length != actual_file_length) {
    return absl::DataLossError(absl::StrCat(what, ": file is ", actual_file_length,
                                            " bytes but its footer says ", f.file_length));
  }
  // The index lies between the header block and the footer, aligned.
  const uint64_t index_limit = f.file_length - kShardFooterBytes;
  if (f.index_offset < kShardHeaderBlock || !base::IsAligned(f.index_offset, kShardAlignment) ||
      f.index_offset > index_limit || f.index_length > index_limit - f.index_offset ||
      f.index_length > kMaxIndexBytes) {
    return absl::DataLossError(absl::StrCat(what, ": footer index range [", f.index_offset, ", +",
                                            f.index_length, ") does not fit the file of ",
                                            f.file_length, " bytes"));
  }
  return f;
}

}  // namespace ckptd::storage
