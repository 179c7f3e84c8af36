// Planning a resharded restore: for each buffer a rank registers, which
// slices of which saved shards hold its bytes. The plan is made from the
// tensors the saved shards' indexes declare (SavedLayout, without their
// block lists), once per step, by whoever can read every index cheaply: the
// coordinator for a job of many nodes (each new rank then opens only the
// shards it reads), the agent itself for a job of one node.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ckptd/v1/shard.pb.h"
#include "storage/reshard.h"

namespace ckptd::storage {

// What planning needs of one tensor one rank saved: its metadata without
// the block list (a share keeps its replica's group, count, index, shape and
// offsets, not the whole buffer's checksums), and for a share a digest of
// the whole buffer's identity (WholeIdentity), which tells groups apart.
struct SavedTensor {
  uint32_t rank = 0;
  ckptd::v1::Tensor meta;
  uint64_t whole = 0;  // a share's XXH3-64 of WholeIdentity (meta.has_replica())
  // Set by SavedLayout::Seal: whether a share is of the group whose shares
  // fill its member box (of several groups' shares of one box, the lowest
  // rank's group). Always true for a tensor that is not a share.
  bool first_group = true;
};

// The tensors every shard of one step declares, by name. A few hundred
// bytes per tensor per rank, whatever the state's size.
class SavedLayout {
 public:
  explicit SavedLayout(uint32_t world_size);

  // Adds the tensors of rank's shard index. REQUIRES: the index was
  // validated (as ShardReader::Open does); each rank added once.
  void Add(uint32_t rank, const ckptd::v1::ShardIndex& index);
  // Orders what was added for lookups. REQUIRES: after the last Add, before
  // any lookup.
  void Seal();

  uint32_t world_size() const { return world_size_; }
  // Rank's saved tensor of that name, or null.
  const SavedTensor* Find(uint32_t rank, absl::string_view name) const;
  // The saved slices of tensor `name` that may overlap `target` (a
  // superset, found through their rows of dimension 0), ordered by rank.
  std::vector<const SavedTensor*> Candidates(absl::string_view name, const Box& target) const;
  // When every rank's tensor of that name has one dtype and one global
  // shape, one of them; null when the ranks disagree or none saved it.
  const SavedTensor* Representative(absl::string_view name) const;
  // Whether some rank saved a tensor of that name.
  bool Has(absl::string_view name) const { return EntriesOf(name) != nullptr; }
  // Names rank saved, in no particular order.
  std::vector<absl::string_view> NamesOf(uint32_t rank) const;
  // Tensors held, over all ranks.
  size_t size() const { return size_; }

 private:
  struct Entries {
    std::vector<SavedTensor> by_rank;   // ordered by rank
    std::vector<uint32_t> by_row;       // positions in by_rank, ordered by first row of dimension 0
    uint64_t max_rows = 0;              // the most rows of dimension 0 of any entry
    std::vector<uint64_t> first_row;    // by_rank's: the first row of dimension 0 of its slice
    bool uniform = true;                // one dtype and one global shape
    bool sorted = true;
  };
  const Entries* EntriesOf(absl::string_view name) const;

  uint32_t world_size_ = 0;
  size_t size_ = 0;
  absl::flat_hash_map<std::string, Entries> tensors_;
};

// One read of a resharded restore: the part of the slice rank `rank` saved
// of buffer `buffer`'s tensor (its box `source`) that lies in the buffer's
// slice (`target`).
struct PlannedRead {
  uint32_t rank = 0;
  size_t buffer = 0;
  Box source;
  Box target;
};

// The reads that fill `buffers` (rank `rank`'s, as registered) from the step `saved` describes, ordered by saved rank.
// Buffers with a global layout read the slices that overlap theirs; a
// buffer without one is the rank's own: rank r reads rank r's (a rank the
// saved world did not have, rank r mod that world's), put together from
// its replica group's shares when it was saved as one. Each saved place is
// read once. kFailedPrecondition naming the buffer when the step cannot
// fill it (another dtype or global shape, a slice missing, slices that
// overlap) or holds a tensor the rank does not register.
absl::StatusOr<std::vector<PlannedRead>> PlanReshard(uint64_t step, uint32_t rank,
                                                     absl::Span<const ckptd::v1::Tensor> buffers,
                                                     const SavedLayout& saved);

// Checks a plan made elsewhere (the coordinator's) before any byte is read:
// every read names one of `buffers`, its target is the buffer's slice, and
// each buffer's sources are distinct places, pairwise disjoint, that cover
// its slice. kInvalidArgument saying what is wrong.
absl::Status CheckPlan(absl::Span<const ckptd::v1::Tensor> buffers, absl::Span<const PlannedRead> reads);

// Checks that `saved` (the tensor a shard's index declares) is the slice a
// planned read expects: the box `source`, and the dtype and global shape of
// `buffer`. kDataLoss saying what differs (naming saved rank `rank`),
// starting with `what`.
absl::Status CheckPlannedSource(const ckptd::v1::Tensor& saved, uint32_t rank, const ckptd::v1::Tensor& buffer,
                                const Box& source, absl::string_view what);

}  // namespace ckptd::storage
