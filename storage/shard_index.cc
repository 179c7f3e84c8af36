#include "storage/shard_index.h"
#include "storage/replica.h"

#include "absl/strings/string_view.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/aligned_buffer.h"
#include "base/status_macros.h"
#include "format/tensor_size.h"
#include "storage/codec.h"
#include "storage/shard_format.h"

namespace ckptd::storage {

using ckptd::v1::Block;
using ckptd::v1::Chunk;
using ckptd::v1::ShardIndex;
using ckptd::v1::Tensor;

bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
      return false;
    }
    i += len;
  }
  return true;
}

absl::Status ValidateTensorMeta(const Tensor& meta, absl::string_view what) {
  if (meta.name().empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": tensor name is empty"));
  if (meta.name().size() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": tensor name longer than 4096 bytes"));
  }
  const std::string where = absl::StrCat(what, ": tensor '", absl::CHexEscape(meta.name()), "'");
  if (!IsValidUtf8(meta.name())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": name is not valid UTF-8"));
  }
  if (!ckptd::v1::Component_IsValid(meta.component()) ||
      meta.component() == ckptd::v1::COMPONENT_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": component is unspecified or unknown (",
                                                   static_cast<int>(meta.component()), ")"));
  }
  if (!ckptd::v1::DType_IsValid(meta.dtype()) || format::DTypeSize(meta.dtype()) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": dtype is unspecified or unknown (", static_cast<int>(meta.dtype()), ")"));
  }
  if (meta.global_shape_size() == 0) {
    if (meta.offsets_size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": offsets given without a global shape"));
    }
  } else {
    if (meta.global_shape_size() != meta.shape_size() || meta.offsets_size() != meta.shape_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": shape, global_shape and offsets must have the same rank (", meta.shape_size(), ", ",
          meta.global_shape_size(), ", ", meta.offsets_size(), ")"));
    }
    for (int i = 0; i < meta.shape_size(); ++i) {
      const uint64_t g = meta.global_shape(i);
      if (meta.offsets(i) > g || meta.shape(i) > g - meta.offsets(i)) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": slice [", meta.offsets(i), ", +",
                                                       meta.shape(i), ") exceeds global dimension ", i,
                                                       " of size ", g));
      }
    }
  }
  if (absl::Status s = format::TensorByteLength(meta).status(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
  }
  if (!meta.has_replica()) return absl::OkStatus();
  if (meta.replica().block_bytes() != 0) return ValidateShare(meta, what);
  return ValidateReplicaGroup(meta.replica(), where);
}

ByteRange BlockFileRange(const Block& block) {
  const Chunk& first = block.chunks(0);
  const Chunk& last = block.chunks(block.chunks_size() - 1);
  const uint64_t end = base::AlignUp(last.file_offset() + last.stored_length(), kShardAlignment);
  return {first.file_offset(), end - first.file_offset()};
}

absl::Status ValidateShardIndex(const ShardIndex& index, uint64_t index_offset, uint32_t version,
                                absl::string_view what) {
  if (index.format_version() != version) {
    return absl::DataLossError(absl::StrCat(what, ": index format_version ", index.format_version(),
                                            " does not match the footer's ", version));
  }
  if (index.alignment() != kShardAlignment) {
    return absl::DataLossError(absl::StrCat(what, ": index alignment ", index.alignment(), " is not ",
                                            kShardAlignment));
  }
  if (index.world_size() == 0 || index.rank() >= index.world_size()) {
    return absl::DataLossError(
        absl::StrCat(what, ": rank ", index.rank(), " is not inside world size ", index.world_size()));
  }
  absl::flat_hash_set<absl::string_view> names;
  uint64_t raw_total = 0;
  uint64_t stored_total = 0;
  for (int t = 0; t < index.tensors_size(); ++t) {
    const Tensor& tensor = index.tensors(t);
    if (absl::Status s = ValidateTensorMeta(tensor, what); !s.ok()) {
      return absl::DataLossError(s.message());
    }
    const std::string where = absl::StrCat(what, ": tensor '", absl::CHexEscape(tensor.name()), "'");
    if (tensor.has_replica() && version < kShardFormatVersionReplicas) {
      return absl::DataLossError(
          absl::StrCat(where, " is a share of a replicated tensor in a shard of format version ", version));
    }
    if (tensor.has_replica() && tensor.replica().block_bytes() == 0) {
      return absl::DataLossError(absl::StrCat(where, ": its replica carries no checksums of the whole buffer"));
    }
    if (!names.insert(tensor.name()).second) {
      return absl::DataLossError(absl::StrCat(where, " appears twice in the index"));
    }
    CKPTD_ASSIGN_OR_RETURN(uint64_t expected, format::TensorByteLength(tensor));
    if (tensor.raw_length() != expected) {
      return absl::DataLossError(absl::StrCat(where, ": raw_length ", tensor.raw_length(),
                                              " does not match its shape and dtype (", expected, ")"));
    }
    uint64_t covered = 0;
    for (int b = 0; b < tensor.blocks_size(); ++b) {
      const Block& block = tensor.blocks(b);
      const std::string bwhere = absl::StrCat(where, " block ", b);
      if (block.raw_offset() != covered || block.raw_length() > tensor.raw_length() - covered) {
        return absl::DataLossError(absl::StrCat(bwhere, ": covers [", block.raw_offset(), ", +",
                                                block.raw_length(), ") but the next byte is ", covered,
                                                " of ", tensor.raw_length()));
      }
      if (block.raw_length() > kMaxBlockBytes) {
        return absl::DataLossError(absl::StrCat(bwhere, ": raw_length ", block.raw_length(),
                                                " exceeds the limit ", kMaxBlockBytes));
      }
      if (absl::Status s = BlockDecoder::Validate(block); !s.ok()) {
        return absl::DataLossError(absl::StrCat(bwhere, ": ", s.message()));
      }
      uint64_t next = kShardHeaderBlock;
      for (int c = 0; c < block.chunks_size(); ++c) {
        const Chunk& chunk = block.chunks(c);
        if (!base::IsAligned(chunk.file_offset(), kShardAlignment) || chunk.file_offset() < next ||
            chunk.file_offset() > index_offset || chunk.stored_length() > index_offset - chunk.file_offset()) {
          return absl::DataLossError(absl::StrCat(bwhere, " chunk ", c, ": file range [", chunk.file_offset(),
                                                  ", +", chunk.stored_length(),
                                                  ") is misaligned, out of order or outside the chunk area "
                                                  "ending at ",
                                                  index_offset));
        }
        next = chunk.file_offset() + chunk.stored_length();
        stored_total += chunk.stored_length();
      }
      const ByteRange range = BlockFileRange(block);
      if (range.length > BlockEncoder::MaxEncodedLength(block.raw_length(), kShardAlignment)) {
        return absl::DataLossError(absl::StrCat(bwhere, ": chunks span ", range.length,
                                                " bytes, more than an encoded block can take"));
      }
      covered += block.raw_length();
    }
    if (covered != tensor.raw_length()) {
      return absl::DataLossError(
          absl::StrCat(where, ": blocks cover ", covered, " of ", tensor.raw_length(), " bytes"));
    }
    raw_total += tensor.raw_length();
  }
  if (raw_total != index.raw_bytes() || stored_total != index.stored_bytes()) {
    return absl::DataLossError(absl::StrCat(what, ": index totals (raw ", index.raw_bytes(), ", stored ",
                                            index.stored_bytes(), ") do not match its tensors (raw ",
                                            raw_total, ", stored ", stored_total, ")"));
  }
  return absl::OkStatus();
}

absl::string_view ComponentName(ckptd::v1::Component c) {
  switch (c) {
    case ckptd::v1::PARAMS: return "PARAMS";
    case ckptd::v1::GRADS: return "GRADS";
    case ckptd::v1::OPTIMIZER: return "OPTIMIZER";
    case ckptd::v1::RNG: return "RNG";
    case ckptd::v1::DATA_CURSOR: return "DATA_CURSOR";
    default: return "UNKNOWN";
  }
}

absl::string_view DTypeName(ckptd::v1::DType d) {
  if (!ckptd::v1::DType_IsValid(d)) return "UNKNOWN";
  return ckptd::v1::DType_Name(d);
}

}  // namespace ckptd::storage
