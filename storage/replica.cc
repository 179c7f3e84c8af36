#include "storage/replica.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/thread_pool.h"
#include "format/checksum.h"
#include "format/tensor_size.h"
#include "storage/codec.h"
#include "storage/shard_format.h"
#include "storage/shard_index.h"
#include "base/status_macros.h"

namespace ckptd::storage {
namespace {

using ckptd::v1::Tensor;

template <typename A, typename B>
bool Same(const A& a, const B& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

// Bytes of one row (dimension 0) of a tensor of `meta`'s dtype whose shape is `shape`.
uint64_t RowBytes(const Tensor& meta, const std::vector<uint64_t>& shape) {
  uint64_t row = format::DTypeSize(meta.dtype());
  for (size_t d = 1; d < shape.size(); ++d) row *= shape[d];
  return row;
}

}  // namespace

absl::Status ValidateReplicaGroup(const ckptd::v1::Replica& r, absl::string_view where) {
  if (r.group().empty() || r.group().size() > kMaxReplicaGroupName || !IsValidUtf8(r.group())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the replica group's name must be 1..", kMaxReplicaGroupName, " bytes of UTF-8"));
  }
  if (r.count() == 0 || r.index() >= r.count()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": place ", r.index(), " in a replica group of ",
                                                   r.count(), " is not inside the group"));
  }
  return absl::OkStatus();
}

RowRange ShareRows(uint64_t rows, uint32_t count, uint32_t index) {
  if (count == 0 || index >= count) return {};
  const uint64_t base = rows / count;
  const uint64_t extra = rows % count;
  const uint64_t begin = base * index + std::min<uint64_t>(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

absl::Status ValidateReplicaRequest(const Tensor& meta, uint32_t world_size, absl::string_view what) {
  const std::string where = absl::StrCat(what, ": buffer '", absl::CHexEscape(meta.name()), "'");
  const ckptd::v1::Replica& r = meta.replica();
  CKPTD_RETURN_IF_ERROR(ValidateReplicaGroup(r, where));
  if (r.count() > world_size) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a replica group of ", r.count(),
                                                   " ranks is larger than the job's world of ", world_size));
  }
  if (r.shape_size() != 0 || r.offsets_size() != 0 || r.block_bytes() != 0 || r.block_xxh3_size() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a registration names the replica group, its size and the rank's place only"));
  }
  return absl::OkStatus();
}

absl::Status ValidateShare(const Tensor& meta, absl::string_view what) {
  const std::string where = absl::StrCat(what, ": tensor '", absl::CHexEscape(meta.name()), "'");
  const ckptd::v1::Replica& r = meta.replica();
  CKPTD_RETURN_IF_ERROR(ValidateReplicaGroup(r, where));
  const int ndim = meta.shape_size();
  if (r.shape_size() != ndim || r.offsets_size() != ndim || meta.global_shape_size() != ndim) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a share's shape, global_shape and replica shape and "
                                                          "offsets must have the same rank"));
  }
  for (int d = 0; d < ndim; ++d) {
    const uint64_t g = meta.global_shape(d);
    if (r.offsets(d) > g || r.shape(d) > g - r.offsets(d)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the replicated box exceeds global dimension ", d));
    }
    const bool inside = meta.offsets(d) >= r.offsets(d) && meta.shape(d) <= r.shape(d) &&
                        meta.offsets(d) - r.offsets(d) <= r.shape(d) - meta.shape(d);
    if (!inside || (d > 0 && (meta.offsets(d) != r.offsets(d) || meta.shape(d) != r.shape(d)))) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the share is not rows of the replicated box"));
    }
  }
  if (ndim > 0) {
    const RowRange rows = ShareRows(r.shape(0), r.count(), r.index());
    if (meta.offsets(0) - r.offsets(0) != rows.begin || meta.shape(0) != rows.end - rows.begin) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the share is not rows [", rows.begin, ", ", rows.end,
                                                     ") of the replicated box, member ", r.index(), "'s of ",
                                                     r.count()));
    }
  }
  if (r.block_bytes() < kShardAlignment || r.block_bytes() > kMaxBlockBytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": replica checksum block of ", r.block_bytes(),
                                                   " bytes is not in ", kShardAlignment, "..", kMaxBlockBytes));
  }
  Tensor whole;
  whole.set_dtype(meta.dtype());
  *whole.mutable_shape() = r.shape();
  CKPTD_ASSIGN_OR_RETURN(const uint64_t length, format::TensorByteLength(whole));
  const uint64_t blocks = length / r.block_bytes() + (length % r.block_bytes() != 0 ? 1 : 0);
  if (static_cast<uint64_t>(r.block_xxh3_size()) != blocks) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", r.block_xxh3_size(),
                                                   " replica checksums for a whole buffer of ", blocks, " blocks"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TensorSource>> ShareSources(absl::Span<const TensorSource> whole, uint64_t block_bytes,
                                                       base::ThreadPool* pool) {
  block_bytes = std::clamp<uint64_t>(block_bytes, kShardAlignment, kMaxBlockBytes);
  block_bytes -= block_bytes % 8;
  std::vector<TensorSource> out(whole.begin(), whole.end());
  base::WaitGroup hashed;
  for (size_t i = 0; i < out.size(); ++i) {
    TensorSource& s = out[i];
    if (!s.meta.has_replica()) continue;
    Tensor& m = s.meta;
    ckptd::v1::Replica& r = *m.mutable_replica();
    const std::vector<uint64_t> shape(m.shape().begin(), m.shape().end());
    std::vector<uint64_t> offsets(m.offsets().begin(), m.offsets().end());
    if (offsets.empty()) offsets.assign(shape.size(), 0);
    if (m.global_shape_size() == 0) *m.mutable_global_shape() = m.shape();
    *r.mutable_shape() = {shape.begin(), shape.end()};
    *r.mutable_offsets() = {offsets.begin(), offsets.end()};
    *m.mutable_offsets() = {offsets.begin(), offsets.end()};
    r.set_block_bytes(block_bytes);
    const uint64_t blocks = s.length / block_bytes + (s.length % block_bytes != 0 ? 1 : 0);
    if (blocks > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", absl::CHexEscape(m.name()), "': ", s.length,
                                                     " bytes are too many to checksum in blocks of ", block_bytes));
    }
    r.mutable_block_xxh3()->Resize(static_cast<int>(blocks), 0);
    const auto* data = static_cast<const uint8_t*>(s.data);
    uint64_t* sums = r.mutable_block_xxh3()->mutable_data();
    for (uint64_t b = 0; b < blocks; ++b) {
      const uint64_t at = b * block_bytes;
      const uint64_t n = std::min<uint64_t>(block_bytes, s.length - at);
      auto hash = [data, at, n, sums, b] { sums[b] = format::Xxh3(data + at, n); };
      if (pool == nullptr) {
        hash();
        continue;
      }
      hashed.Add();
      pool->Schedule([hash, &hashed] {
        hash();
        hashed.Done();
      });
    }
    if (shape.empty()) continue;  // a scalar: every member stores it
    const RowRange rows = ShareRows(shape[0], r.count(), r.index());
    const uint64_t row = RowBytes(m, shape);
    m.set_shape(0, rows.end - rows.begin);
    m.set_offsets(0, offsets[0] + rows.begin);
    s.data = data + rows.begin * row;
    s.length = (rows.end - rows.begin) * row;
  }
  hashed.Wait();
  return out;
}

Box MemberBox(const Tensor& share) {
  Box b;
  b.shape.assign(share.replica().shape().begin(), share.replica().shape().end());
  b.offsets.assign(share.replica().offsets().begin(), share.replica().offsets().end());
  return b;
}

uint64_t ShareByteOffset(const Tensor& share) {
  if (share.shape_size() == 0) return 0;
  const std::vector<uint64_t> shape(share.shape().begin(), share.shape().end());
  return (share.offsets(0) - share.replica().offsets(0)) * RowBytes(share, shape);
}

std::string WholeIdentity(const Tensor& share) {
  const ckptd::v1::Replica& r = share.replica();
  std::string id = absl::StrCat(static_cast<int>(share.dtype()), "/", absl::StrJoin(r.shape(), ","), "@",
                                absl::StrJoin(r.offsets(), ","), "/", r.block_bytes(), "/");
  id.append(reinterpret_cast<const char*>(r.block_xxh3().data()), sizeof(uint64_t) * r.block_xxh3_size());
  return id;
}

uint64_t WholeByteLength(const Tensor& saved) {
  if (!saved.has_replica()) return saved.raw_length();
  Tensor whole;
  whole.set_dtype(saved.dtype());
  *whole.mutable_shape() = saved.replica().shape();
  return format::TensorByteLength(whole).value_or(0);
}

bool IsWholeShare(const Tensor& share) {
  return Same(share.shape(), share.replica().shape()) && Same(share.offsets(), share.replica().offsets());
}

absl::StatusOr<std::vector<WholeBlock>> WholeBlocks(const Tensor& share, uint64_t whole_length) {
  const ckptd::v1::Replica& r = share.replica();
  if (WholeByteLength(share) != whole_length) {
    return absl::DataLossError(absl::StrCat("tensor '", absl::CHexEscape(share.name()), "' is a share of ",
                                            WholeByteLength(share), " bytes, not of ", whole_length));
  }
  std::vector<WholeBlock> blocks;
  uint64_t at = 0;
  for (int b = 0; b < r.block_xxh3_size() && at < whole_length; ++b) {
    const uint64_t n = std::min<uint64_t>(r.block_bytes(), whole_length - at);
    blocks.push_back({at, n, r.block_xxh3(b)});
    at += n;
  }
  if (r.block_bytes() == 0 || at != whole_length || static_cast<size_t>(r.block_xxh3_size()) != blocks.size()) {
    return absl::DataLossError(absl::StrCat("tensor '", absl::CHexEscape(share.name()), "': ", r.block_xxh3_size(),
                                            " replica checksums do not cover its ", whole_length, " bytes"));
  }
  return blocks;
}

}  // namespace ckptd::storage
