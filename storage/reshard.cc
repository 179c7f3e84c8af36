#include "storage/reshard.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckptd::storage {

Box WholeBox(const std::vector<uint64_t>& global) { return Box{std::vector<uint64_t>(global.size(), 0), global}; }

Box SliceBox(const ckptd::v1::Tensor& meta) {
  Box b;
  b.shape.assign(meta.shape().begin(), meta.shape().end());
  if (meta.offsets_size() > 0) {
    b.offsets.assign(meta.offsets().begin(), meta.offsets().end());
  } else {
    b.offsets.assign(b.shape.size(), 0);
  }
  return b;
}

bool operator==(const Box& a, const Box& b) { return a.offsets == b.offsets && a.shape == b.shape; }

namespace {

// The intersection of a and b: false when it is empty.
bool Intersect(const Box& a, const Box& b, Box* out) {
  const size_t dims = a.shape.size();
  out->offsets.resize(dims);
  out->shape.resize(dims);
  for (size_t d = 0; d < dims; ++d) {
    const uint64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const uint64_t hi = std::min(a.offsets[d] + a.shape[d], b.offsets[d] + b.shape[d]);
    if (hi <= lo) return false;
    out->offsets[d] = lo;
    out->shape[d] = hi - lo;
  }
  return true;
}

// Bytes per index of each dimension of a dense row-major box.
std::vector<uint64_t> Strides(const std::vector<uint64_t>& shape, uint64_t element) {
  std::vector<uint64_t> s(shape.size(), element);
  for (size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

}  // namespace

uint64_t OverlapVolume(const Box& a, const Box& b) {
  Box i;
  if (!Intersect(a, b, &i)) return 0;
  uint64_t v = 1;
  for (uint64_t d : i.shape) v *= d;
  return v;
}

std::vector<SliceCopy> SliceCopies(const Box& source, const Box& target, uint64_t element) {
  const size_t dims = source.shape.size();
  if (dims == 0) return {SliceCopy{0, 0, element}};  // a scalar
  Box in;
  if (!Intersect(source, target, &in)) return {};
  // Dimensions after k span both boxes whole: each run covers k.. at once.
  size_t k = dims - 1;
  while (k > 0 && in.shape[k] == source.shape[k] && in.shape[k] == target.shape[k]) --k;
  uint64_t run = element;
  for (size_t d = k; d < dims; ++d) run *= in.shape[d];
  const std::vector<uint64_t> ss = Strides(source.shape, element);
  const std::vector<uint64_t> ts = Strides(target.shape, element);
  std::vector<SliceCopy> out;
  std::vector<uint64_t> index(k, 0);  // odometer over the dimensions before k
  for (;;) {
    SliceCopy c{0, 0, run};
    for (size_t d = 0; d < dims; ++d) {
      const uint64_t at = in.offsets[d] + (d < k ? index[d] : 0);
      c.source_offset += (at - source.offsets[d]) * ss[d];
      c.target_offset += (at - target.offsets[d]) * ts[d];
    }
    out.push_back(c);
    size_t d = k;
    for (;;) {
      if (d == 0) return out;
      --d;
      if (++index[d] < in.shape[d]) break;
      index[d] = 0;
    }
  }
}

std::string BoxText(const Box& box) {
  std::vector<std::string> dims;
  for (size_t d = 0; d < box.shape.size(); ++d) {
    dims.push_back(absl::StrCat(box.offsets[d], ":", box.offsets[d] + box.shape[d]));
  }
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

absl::StatusOr<std::vector<SavedSlice>> SlicesFor(absl::string_view what, const Box& target,
                                                  const std::vector<SavedSlice>& saved) {
  // Distinct places only (replicas read once), and only those that matter.
  std::vector<SavedSlice> distinct;
  std::set<std::pair<std::vector<uint64_t>, std::vector<uint64_t>>> seen;
  for (const SavedSlice& s : saved) {
    if (OverlapVolume(s.box, target) == 0) continue;
    if (seen.insert({s.box.offsets, s.box.shape}).second) distinct.push_back(s);
  }
  // Pairwise disjoint: a sweep along dimension 0 compares only slices whose
  // rows meet.
  std::vector<const SavedSlice*> by_start;
  for (const SavedSlice& s : distinct) by_start.push_back(&s);
  auto start = [](const SavedSlice* s) { return s->box.shape.empty() ? 0 : s->box.offsets[0]; };
  auto end = [](const SavedSlice* s) { return s->box.shape.empty() ? 1 : s->box.offsets[0] + s->box.shape[0]; };
  std::sort(by_start.begin(), by_start.end(), [&](const SavedSlice* a, const SavedSlice* b) {
    return start(a) != start(b) ? start(a) < start(b) : a->rank < b->rank;
  });
  std::vector<const SavedSlice*> active;
  for (const SavedSlice* s : by_start) {
    std::erase_if(active, [&](const SavedSlice* a) { return end(a) <= start(s); });
    for (const SavedSlice* a : active) {
      if (OverlapVolume(a->box, s->box) > 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, ": the slices of ranks ", std::min(a->rank, s->rank), " and ", std::max(a->rank, s->rank), " (",
            BoxText(a->rank < s->rank ? a->box : s->box), " and ", BoxText(a->rank < s->rank ? s->box : a->box),
            ") overlap without being the same slice"));
      }
    }
    active.push_back(s);
  }
  uint64_t covered = 0;
  for (const SavedSlice& s : distinct) covered += OverlapVolume(s.box, target);
  uint64_t volume = 1;
  for (uint64_t d : target.shape) volume *= d;
  if (covered != volume) {
    std::vector<uint32_t> ranks;
    for (const SavedSlice& s : distinct) ranks.push_back(s.rank);
    const std::string who =
        ranks.empty() ? std::string("no saved slice")
                      : absl::StrCat("the saved slices (ranks ",
                                     ranks.size() > 8 ? absl::StrCat(absl::StrJoin(ranks.begin(), ranks.begin() + 8,
                                                                                   ", "), ", ... ", ranks.size(),
                                                                     " ranks")
                                                      : absl::StrJoin(ranks, ", "),
                                     ")");
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", who, " cover ", covered, " of the ", volume,
                                                      " elements of ", BoxText(target)));
  }
  return distinct;
}

absl::Status ReadIntoSlice(ShardReader& reader, absl::string_view name, const Box& source, const Box& target,
                           uint64_t element, void* dst) {
  std::vector<RangeDest> ranges;
  for (const SliceCopy& c : SliceCopies(source, target, element)) {
    ranges.push_back({std::string(name), c.source_offset, c.length, static_cast<char*>(dst) + c.target_offset});
  }
  return reader.ReadRanges(ranges);
}

}  // namespace ckptd::storage
