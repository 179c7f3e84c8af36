// Replicated state written once (docs/format.md §2.4, `Replica`): a buffer
// that every rank of a group holds the same (the weights and optimizer state
// of data parallelism) is stored as shares, member i of the group writing its
// rows of dimension 0 (ShareRows: in order, balanced), each share carrying
// the checksums of the whole buffer so that a copy of the whole kept in
// memory is verified through any member's shard index.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ckptd/v1/shard.pb.h"
#include "storage/reshard.h"
#include "storage/shard_writer.h"

namespace ckptd::base {
class ThreadPool;
}  // namespace ckptd::base

namespace ckptd::storage {

inline constexpr size_t kMaxReplicaGroupName = 256;

// Rows [begin, end) of `rows` that member `index` of `count` stores: in
// order, balanced (the first rows % count members store one row more).
struct RowRange {
  uint64_t begin = 0;
  uint64_t end = 0;
};
RowRange ShareRows(uint64_t rows, uint32_t count, uint32_t index);

// Checks what every replica names: the group (1..256 bytes of UTF-8) and a
// place inside it (count >= 1, index < count). kInvalidArgument starting
// with `what`.
absl::Status ValidateReplicaGroup(const ckptd::v1::Replica& replica, absl::string_view what);

// Checks a replica as a registration declares it (only group, count and
// index set): the group named (1..256 bytes of UTF-8), 1 <= count <=
// world_size, index < count. kInvalidArgument starting with `what`.
absl::Status ValidateReplicaRequest(const ckptd::v1::Tensor& meta, uint32_t world_size, absl::string_view what);

// Checks a stored share (`meta.replica` as a shard index holds it): group,
// count and index as above, the member's box inside the tensor's global
// shape, the share inside the member's box and split along dimension 0 only,
// the whole buffer's checksums one per `block_bytes` of it.
// kInvalidArgument starting with `what`.
absl::Status ValidateShare(const ckptd::v1::Tensor& meta, absl::string_view what);

// What to write for `whole` (a rank's buffers, as registered, with their
// bytes): each buffer replicated over a group becomes this rank's share of
// it, with the checksums of the whole buffer per `block_bytes` (computed on
// `pool`, or on the calling thread when null); the other buffers as they
// are. A scalar is not split: every member stores it. `block_bytes` is
// normalized as the shard writer's (4 KiB to 256 MiB, a multiple of 8);
// kInvalidArgument for a buffer of more checksum blocks than that allows.
absl::StatusOr<std::vector<TensorSource>> ShareSources(absl::Span<const TensorSource> whole, uint64_t block_bytes,
                                                       base::ThreadPool* pool);

// The box of the whole buffer each member of a stored share's group holds.
// REQUIRES: ValidateShare(share) is ok.
Box MemberBox(const ckptd::v1::Tensor& share);

// Where a stored share's bytes start in the whole buffer.
// REQUIRES: ValidateShare(share) is ok.
uint64_t ShareByteOffset(const ckptd::v1::Tensor& share);

// Bytes of the whole buffer a stored tensor is (a share) or holds (any other
// tensor: its raw_length). REQUIRES: validated.
uint64_t WholeByteLength(const ckptd::v1::Tensor& saved);

// What tells the shares of one group's buffer from another group's: the
// members of a group store the same checksums of the same box, a buffer of
// other bytes (another tensor-parallel rank's of the same name) others.
// REQUIRES: validated.
std::string WholeIdentity(const ckptd::v1::Tensor& share);

// Whether a stored share is the whole buffer (a group of one, a scalar).
bool IsWholeShare(const ckptd::v1::Tensor& share);

// The checksummed blocks of the whole buffer (`whole_length` bytes) a stored
// share describes. kDataLoss when the checksums do not cover that length.
struct WholeBlock {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t xxh3 = 0;
};
absl::StatusOr<std::vector<WholeBlock>> WholeBlocks(const ckptd::v1::Tensor& share, uint64_t whole_length);

}  // namespace ckptd::storage
