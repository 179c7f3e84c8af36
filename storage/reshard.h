// The geometry of resharding: which bytes of a slice that one rank saved
// hold which bytes of a slice that another rank (of another layout or
// world size) needs. Slices are boxes of a row-major tensor: an offset and
// a length per dimension (ckptd.v1.Tensor offsets and shape inside
// global_shape), their bytes dense and row-major.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckptd/v1/shard.pb.h"
#include "storage/shard_reader.h"

namespace ckptd::storage {

struct Box {
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> shape;
};

// The whole tensor of `global`.
Box WholeBox(const std::vector<uint64_t>& global);
// The slice a tensor's metadata declares (offsets 0 and its shape when it
// has no global layout).
Box SliceBox(const ckptd::v1::Tensor& meta);
bool operator==(const Box& a, const Box& b);

// Elements the two boxes share (0 when disjoint). REQUIRES: same rank.
uint64_t OverlapVolume(const Box& a, const Box& b);

// A contiguous run of bytes the part of a source slice inside a target
// slice is made of: where it starts in the source's bytes and in the
// target's bytes, and its length.
struct SliceCopy {
  uint64_t source_offset = 0;
  uint64_t target_offset = 0;
  uint64_t length = 0;
};

// The runs that carry the elements of `source` that lie in `target`, in
// the source's order, as few as the boxes allow (dimensions that both span
// whole are merged into one run). Empty when they do not overlap.
// REQUIRES: same rank; `element` bytes per element.
std::vector<SliceCopy> SliceCopies(const Box& source, const Box& target, uint64_t element);

// One rank's saved slice of a tensor.
struct SavedSlice {
  uint32_t rank = 0;
  Box box;
};

// "[0:4, 2:6]": a box as ranges per dimension, for messages.
std::string BoxText(const Box& box);

// Of the slices ranks saved of one tensor (ordered by rank; all of one
// global shape), the ones to read for `target`: one per distinct place that
// overlaps it, a replica's copy of the same slice left out (the lowest
// rank's is read). kFailedPrecondition, starting with `what`, when two
// saved slices overlap without being the same slice, or when the slices
// leave part of `target` uncovered.
absl::StatusOr<std::vector<SavedSlice>> SlicesFor(absl::string_view what, const Box& target,
                                                  const std::vector<SavedSlice>& saved);

// Reads the part of tensor `name` (whose slice is `source`) that lies in
// `target` from `reader` into `dst`, the dense bytes of `target`: only the
// blocks that hold it, each verified.
absl::Status ReadIntoSlice(ShardReader& reader, absl::string_view name, const Box& source, const Box& target,
                           uint64_t element, void* dst);

}  // namespace ckptd::storage
