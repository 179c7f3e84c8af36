#include "storage/reshard_plan.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "format/checksum.h"
#include "storage/replica.h"
#include "storage/shard_index.h"

namespace ckptd::storage {
namespace {

using ckptd::v1::Tensor;

// Rows [first, end) of dimension 0 a box spans; a scalar spans row 0.
uint64_t FirstRow(const Box& b) { return b.shape.empty() ? 0 : b.offsets[0]; }
uint64_t EndRow(const Box& b) { return b.shape.empty() ? 1 : b.offsets[0] + b.shape[0]; }

std::string ShapeText(const google::protobuf::RepeatedField<uint64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The tensor a slice is of: its global shape, or its own shape without one.
const google::protobuf::RepeatedField<uint64_t>& GlobalOf(const Tensor& t) {
  return t.global_shape_size() > 0 ? t.global_shape() : t.shape();
}

std::string BufferWhat(const Tensor& b) { return absl::StrCat("buffer '", absl::CHexEscape(b.name()), "'"); }

// Whether `saved` is of the tensor `b` is a slice of (dtype and global
// shape); the mismatch, said, when not.
std::optional<std::string> GlobalMismatch(const Tensor& saved, const Tensor& b, uint32_t rank) {
  const auto& global = GlobalOf(b);
  const auto& saved_global = GlobalOf(saved);
  if (saved.dtype() == b.dtype() && std::equal(saved_global.begin(), saved_global.end(), global.begin(), global.end())) {
    return std::nullopt;
  }
  return absl::StrCat(
      "is registered as ", DTypeName(b.dtype()), " of global shape ", ShapeText(global), "; rank ", rank, " saved ", DTypeName(saved.dtype()),
      saved.global_shape_size() > 0 ? absl::StrCat(" of global shape ", ShapeText(saved.global_shape()))
                                    : absl::StrCat(" ", ShapeText(saved.shape()), " without a global layout"));
}

}  // namespace

SavedLayout::SavedLayout(uint32_t world_size) : world_size_(world_size) {}

void SavedLayout::Add(uint32_t rank, const ckptd::v1::ShardIndex& index) {
  for (const Tensor& t : index.tensors()) {
    SavedTensor s;
    s.rank = rank;
    s.meta = t;
    s.meta.clear_blocks();
    if (t.has_replica()) {
      s.whole = format::Xxh3(WholeIdentity(t));
      s.meta.mutable_replica()->clear_block_xxh3();
    }
    Entries& e = tensors_[t.name()];
    e.by_rank.push_back(std::move(s));
    e.sorted = false;
    ++size_;
  }
}

void SavedLayout::Seal() {
  for (auto& named : tensors_) {
    Entries& e = named.second;
    if (e.sorted) continue;
    std::stable_sort(e.by_rank.begin(), e.by_rank.end(),
                     [](const SavedTensor& a, const SavedTensor& b) { return a.rank < b.rank; });
    e.by_row.resize(e.by_rank.size());
    e.max_rows = 0;
    e.first_row.assign(e.by_rank.size(), 0);
    e.uniform = true;
    absl::flat_hash_map<std::string, uint64_t> group_of_box;
    for (size_t i = 0; i < e.by_rank.size(); ++i) {
      e.by_row[i] = static_cast<uint32_t>(i);
      const Box box = SliceBox(e.by_rank[i].meta);
      e.first_row[i] = FirstRow(box);
      e.max_rows = std::max(e.max_rows, EndRow(box) - FirstRow(box));
      const Tensor& a = e.by_rank[0].meta;
      const Tensor& b = e.by_rank[i].meta;
      const auto& ga = GlobalOf(a);
      const auto& gb = GlobalOf(b);
      e.uniform = e.uniform && a.dtype() == b.dtype() && std::equal(ga.begin(), ga.end(), gb.begin(), gb.end());
      // Of the elements of each member box, one group's shares are read:
      // the lowest rank's.
      SavedTensor& s = e.by_rank[i];
      if (s.meta.has_replica()) {
        s.first_group = group_of_box.emplace(BoxText(MemberBox(s.meta)), s.whole).first->second == s.whole;
      }
    }
    std::stable_sort(e.by_row.begin(), e.by_row.end(),
                     [&](uint32_t a, uint32_t b) { return e.first_row[a] < e.first_row[b]; });
    e.sorted = true;
  }
}

const SavedLayout::Entries* SavedLayout::EntriesOf(absl::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const SavedTensor* SavedLayout::Find(uint32_t rank, absl::string_view name) const {
  const Entries* e = EntriesOf(name);
  if (e == nullptr) return nullptr;
  auto it = std::lower_bound(e->by_rank.begin(), e->by_rank.end(), rank,
                             [](const SavedTensor& s, uint32_t r) { return s.rank < r; });
  return it != e->by_rank.end() && it->rank == rank ? &*it : nullptr;
}

const SavedTensor* SavedLayout::Representative(absl::string_view name) const {
  const Entries* e = EntriesOf(name);
  return e == nullptr || e->by_rank.empty() || !e->uniform ? nullptr : &e->by_rank.front();
}

std::vector<const SavedTensor*> SavedLayout::Candidates(absl::string_view name, const Box& target) const {
  std::vector<const SavedTensor*> out;
  const Entries* e = EntriesOf(name);
  if (e == nullptr) return out;
  const uint64_t first = FirstRow(target);
  const uint64_t end = EndRow(target);
  // Slices that start at or after `end`, or end at or before `first`, miss
  // the target's rows; one that starts more than max_rows before `first`
  // ends before it.
  const uint64_t from = first >= e->max_rows ? first - e->max_rows + 1 : 0;
  auto row = [&](uint32_t i) { return e->first_row[i]; };
  auto lo = std::lower_bound(e->by_row.begin(), e->by_row.end(), from,
                             [&](uint32_t i, uint64_t r) { return row(i) < r; });
  for (auto it = lo; it != e->by_row.end() && row(*it) < end; ++it) {
    const SavedTensor& s = e->by_rank[*it];
    if (EndRow(SliceBox(s.meta)) > first) out.push_back(&s);
  }
  std::sort(out.begin(), out.end(), [](const SavedTensor* a, const SavedTensor* b) { return a->rank < b->rank; });
  return out;
}

std::vector<absl::string_view> SavedLayout::NamesOf(uint32_t rank) const {
  std::vector<absl::string_view> names;
  for (const auto& [name, e] : tensors_) {
    if (Find(rank, name) != nullptr) names.push_back(name);
  }
  return names;
}

absl::StatusOr<std::vector<PlannedRead>> PlanReshard(uint64_t step, uint32_t rank, absl::Span<const Tensor> buffers,
                                                     const SavedLayout& saved) {
  const uint32_t saved_world = saved.world_size();
  if (saved_world == 0) return absl::FailedPreconditionError(absl::StrCat("step ", step, " was saved by no rank"));
  std::vector<PlannedRead> reads;
  // Buffers without a global layout are each rank's own: rank r reads
  // rank r's, a rank the saved world did not have rank r mod that world's.
  const uint32_t own = rank % saved_world;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Tensor& b = buffers[i];
    const std::string what = BufferWhat(b);
    // A buffer saved as shares of a replicated buffer is put together from
    // the shares of the group `own` belonged to; saved whole, it is read
    // whole (whether this rank declares it replicated or not).
    const SavedTensor* own_saved = saved.Find(own, b.name());
    if (b.global_shape_size() == 0 && (own_saved == nullptr || !own_saved->meta.has_replica())) {
      if (own_saved == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(what, " is not in rank ", own, "'s shard of step ", step,
                                                          " (saved by ", saved_world, " ranks)"));
      }
      const Tensor& s = own_saved->meta;
      if (s.global_shape_size() > 0 || s.dtype() != b.dtype() ||
          !std::equal(s.shape().begin(), s.shape().end(), b.shape().begin(), b.shape().end())) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, " is registered as ", DTypeName(b.dtype()), " ", ShapeText(b.shape()),
            " without a global layout; rank ", own, " saved ", DTypeName(s.dtype()), " ", ShapeText(s.shape()),
            s.global_shape_size() > 0 ? absl::StrCat(" of global shape ", ShapeText(s.global_shape())) : ""));
      }
      reads.push_back({own, i, SliceBox(s), SliceBox(s)});
      continue;
    }
    // Shares of the group's buffer only: a group is told by the checksums of
    // the whole its members store (other groups' buffers of the same name
    // and shape, another tensor-parallel rank's, hold other bytes). Without
    // a global layout, the group of `own`; with one, of the elements of each
    // member box, one group's (the lowest rank's).
    const bool own_group = b.global_shape_size() == 0;
    const uint64_t want = own_group ? own_saved->whole : 0;
    const Box target = SliceBox(b);
    // Every rank saved the tensor alike, or the step is not one to reshard.
    if (saved.Has(b.name())) {
      const SavedTensor* like = saved.Representative(b.name());
      if (like == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(what, ": the ranks of step ", step,
                                                          " saved it with different dtypes or global shapes"));
      }
      if (std::optional<std::string> wrong = GlobalMismatch(like->meta, b, like->rank)) {
        return absl::FailedPreconditionError(absl::StrCat(what, " ", *wrong, " at step ", step));
      }
    }
    std::vector<SavedSlice> slices;
    for (const SavedTensor* c : saved.Candidates(b.name(), target)) {
      const Tensor& s = c->meta;
      if (own_group && (!s.has_replica() || c->whole != want)) continue;
      if (!own_group && s.has_replica() && !c->first_group) continue;
      if (std::optional<std::string> wrong = GlobalMismatch(s, b, c->rank)) {
        return absl::FailedPreconditionError(absl::StrCat(what, " ", *wrong, " at step ", step));
      }
      // A member's share of no rows holds nothing.
      if (s.raw_length() == 0 && s.shape_size() > 0) continue;
      const Box box = SliceBox(s);
      if (OverlapVolume(box, target) == 0) continue;
      slices.push_back({c->rank, box});
    }
    CKPTD_ASSIGN_OR_RETURN(
        const std::vector<SavedSlice> from,
        SlicesFor(absl::StrCat(what, " of step ", step,
                               !own_group ? ""
                                          : absl::StrCat(" (the shares of rank ", own, "'s replica group '",
                                                        absl::CHexEscape(own_saved->meta.replica().group()),
                                                        "', which must all hold the same buffer)")),
                  target, slices));
    for (const SavedSlice& f : from) reads.push_back({f.rank, i, f.box, target});
  }
  // A saved tensor this rank does not register would be dropped: another model.
  absl::flat_hash_set<absl::string_view> registered;
  for (const Tensor& b : buffers) registered.insert(b.name());
  for (absl::string_view name : saved.NamesOf(own)) {
    if (!registered.contains(name)) {
      return absl::FailedPreconditionError(
          absl::StrCat("step ", step, " holds tensor '", absl::CHexEscape(name), "' that is not registered"));
    }
  }
  std::stable_sort(reads.begin(), reads.end(), [](const PlannedRead& a, const PlannedRead& b) { return a.rank < b.rank; });
  return reads;
}

absl::Status CheckPlan(absl::Span<const Tensor> buffers, absl::Span<const PlannedRead> reads) {
  std::vector<std::vector<SavedSlice>> per_buffer(buffers.size());
  for (const PlannedRead& r : reads) {
    if (r.buffer >= buffers.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a planned read names buffer ", r.buffer, " of ", buffers.size(), " registered"));
    }
    const Tensor& b = buffers[r.buffer];
    const Box target = SliceBox(b);
    const auto& global = GlobalOf(b);
    if (!(r.target == target) || r.source.shape.size() != target.shape.size() ||
        r.source.offsets.size() != target.shape.size()) {
      return absl::InvalidArgumentError(absl::StrCat("a planned read of ", BufferWhat(b), " (", BoxText(r.source),
                                                     " into ", BoxText(r.target), ") is not of its slice ",
                                                     BoxText(target)));
    }
    for (size_t d = 0; d < r.source.shape.size(); ++d) {
      if (r.source.offsets[d] > global[d] || r.source.shape[d] > global[d] - r.source.offsets[d]) {
        return absl::InvalidArgumentError(absl::StrCat("a planned read of ", BufferWhat(b), " names slice ",
                                                       BoxText(r.source), " outside its global shape ",
                                                       ShapeText(global)));
      }
    }
    per_buffer[r.buffer].push_back({r.rank, r.source});
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    const std::string what = absl::StrCat("the plan for ", BufferWhat(buffers[i]));
    absl::StatusOr<std::vector<SavedSlice>> distinct = SlicesFor(what, SliceBox(buffers[i]), per_buffer[i]);
    if (!distinct.ok()) return absl::InvalidArgumentError(distinct.status().message());
    if (distinct->size() != per_buffer[i].size()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " reads ", per_buffer[i].size(), " slices where ",
                                                     distinct->size(), " distinct ones fill it"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPlannedSource(const Tensor& saved, uint32_t rank, const Tensor& buffer, const Box& source,
                                absl::string_view what) {
  if (std::optional<std::string> wrong = GlobalMismatch(saved, buffer, rank)) {
    return absl::DataLossError(absl::StrCat(what, ": ", BufferWhat(buffer), " ", *wrong));
  }
  if (!(SliceBox(saved) == source)) {
    return absl::DataLossError(absl::StrCat(what, ": the plan reads ", BufferWhat(buffer), "'s slice ",
                                            BoxText(source), " where the shard holds ", BoxText(SliceBox(saved))));
  }
  return absl::OkStatus();
}

}  // namespace ckptd::storage
