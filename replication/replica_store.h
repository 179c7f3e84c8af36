// The copies of other nodes' snapshots this agent holds in memory for peer
// replication (proto/ckptd/v1/peer.proto): at most two steps per rank and
// sender (the newest, and the one before while the newest may not commit
// yet), within what the agent's memory budget leaves over after its own
// trainers' staging.
// A copy is visible only once every byte of it arrived; one being received
// counts against the budget from the start, and one dropped while a fetch
// still sends it counts until that fetch lets go. The memory of a dropped
// copy is kept (within the budget) for the next copy of the same size: a
// partner sending every checkpoint does not make this node clear fresh pages
// each time.
//
// A copy is its sender's (header.from_node): only a put from that node
// replaces it, or pushes its older steps out. Within the budget a sender
// pushes out another sender's copies only while that one holds more than it
// will: a partner sending junk cannot crowd the others' copies out.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/clock.h"
#include "base/logger.h"
#include "ckptd/v1/coordinator.pb.h"
#include "ckptd/v1/peer.pb.h"

namespace ckptd::replication {

// Bounds on what a partner may send: the serialized shard index, and a job
// name (as storage::ValidateJobName allows).
inline constexpr uint64_t kMaxReplicaIndexBytes = uint64_t{64} << 20;

// A copy held in memory: its header (without the ticket) and its bytes.
class Replica {
 public:
  // `memory` (of at least `bytes`, possibly a dropped copy's) or, when null,
  // new memory.
  Replica(ckptd::v1::ReplicaHeader header, uint64_t bytes, std::unique_ptr<uint8_t[]> memory = nullptr);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;
  const ckptd::v1::ReplicaHeader& header() const { return header_; }
  uint64_t size() const { return size_; }
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }

 private:
  ckptd::v1::ReplicaHeader header_;
  uint64_t size_;
  std::unique_ptr<uint8_t[]> data_;  // not cleared: every byte is written before the copy is kept
  // Set when the store dropped the copy while a fetch still read it: the
  // store's count of such bytes, which size_ leaves with this copy.
  std::shared_ptr<std::atomic<uint64_t>> pinned_;
  friend class ReplicaStore;  // takes data_ back for the next copy of the size
};

struct ReplicaStoreOptions {
  // The agent's memory budget (0: no limit) and what its own trainers'
  // staging holds of it now: copies fit in the rest.
  uint64_t budget_bytes = 0;
  std::function<uint64_t()> staging_bytes;
  base::Logger* logger = nullptr;
  base::Clock* clock = nullptr;
};

class ReplicaStore {
 public:
  explicit ReplicaStore(ReplicaStoreOptions options);

  // Room for the copy `header` describes (header.data_bytes): older copies
  // go to make it (copies of ranks that have a newer one first, then those
  // of the sender holding the most, least recently received first): the
  // sender's own, and another sender's only while that one holds more than
  // this sender will with the new copy; never one a fetch still reads, nor
  // the rank's newest one when the new copy is older. kResourceExhausted
  // when it cannot fit; kPermissionDenied naming both nodes when the key is
  // held (or being received) for another node than header.from_node;
  // kInvalidArgument for a header without a job or from_node, or an index
  // above the bound. The memory is counted until the copy is kept (Keep) or
  // the result dropped.
  class Reservation;
  absl::StatusOr<std::unique_ptr<Reservation>> Reserve(const ckptd::v1::ReplicaHeader& header);
  // Every byte of the reserved copy arrived: it replaces the sender's older
  // copies of the rank beyond its two newest steps (another sender's stay).
  void Keep(std::unique_ptr<Reservation> reservation);

  // The copy of `key`, or null. It stays valid while held, even once dropped.
  std::shared_ptr<const Replica> Find(const ckptd::v1::ReplicaKey& key) const;
  // Every copy held, for the coordinator (owner_node: the sender).
  std::vector<ckptd::v1::MemoryCopy> List() const;
  // Bytes held, reserved, and of dropped copies still being fetched.
  uint64_t bytes() const;
  // Bytes of dropped copies that fetches still read (in bytes()).
  uint64_t pinned_bytes() const { return pinned_->load(std::memory_order_relaxed); }
  // Drops copies (least useful first, as above, from any sender) until at
  // least `want` bytes are freed or none is left; returns the bytes freed
  // (a copy still being fetched counts: it goes when its fetch ends). The
  // agent's own trainers come first.
  uint64_t Shed(uint64_t want);

 private:
  using RankKey = std::tuple<std::string, uint32_t>;           // job, rank
  using CopyKey = std::tuple<std::string, uint32_t, uint64_t>;  // job, rank, step
  struct Held {
    std::shared_ptr<Replica> replica;
    absl::Time received;
  };
  // Copies being received for a key: their sender, and how many.
  struct Receiving {
    std::string from_node;
    size_t count = 0;
  };
  // Removes spare memory, else the least useful copy (see Reserve) that
  // `for_node` may push out when it will hold `for_bytes` (any copy when
  // `for_node` is null); false when none is left. `protect` is never removed.
  bool EvictOneLocked(const Held* protect, const std::string* for_node, uint64_t for_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `held`'s bytes off its sender's count. Its memory, when nobody
  // reads the copy any more, is kept for the next copy of its size when
  // `recycle`, else freed; a copy still read stays counted (pinned_) until
  // its last reader lets go.
  void DropLocked(Held held, bool recycle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(const Replica& replica);
  uint64_t SenderBytesLocked(const std::string& node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ReplicaStoreOptions options_;
  base::Logger* const logger_;
  base::Clock* const clock_;
  mutable absl::Mutex mu_;
  // By rank, then step (ascending).
  std::map<RankKey, std::map<uint64_t, Held>> held_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;  // held, reserved and spare
  // Bytes held and reserved, by sender (those with any).
  std::map<std::string, uint64_t> sender_bytes_ ABSL_GUARDED_BY(mu_);
  std::map<CopyKey, Receiving> receiving_ ABSL_GUARDED_BY(mu_);
  // Memory of dropped copies, by size (at most kMaxSpare buffers).
  std::multimap<uint64_t, std::unique_ptr<uint8_t[]>> spare_ ABSL_GUARDED_BY(mu_);
  // Dropped copies' bytes that fetches still hold (Replica::pinned_).
  const std::shared_ptr<std::atomic<uint64_t>> pinned_ = std::make_shared<std::atomic<uint64_t>>(0);
};

class ReplicaStore::Reservation {
 public:
  ~Reservation();
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  Replica& replica() { return *replica_; }

 private:
  friend class ReplicaStore;
  Reservation(ReplicaStore* store, std::shared_ptr<Replica> replica) : store_(store), replica_(std::move(replica)) {}
  ReplicaStore* store_;
  std::shared_ptr<Replica> replica_;
};

}  // namespace ckptd::replication
