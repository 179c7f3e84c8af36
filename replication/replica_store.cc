#include "replication/replica_store.h"

#include <unistd.h>

#include <cstdint>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/format.h"
#include "storage/layout.h"

namespace ckptd::replication {
namespace {

// Steps kept per rank: the newest, and the one before (the newest may never
// commit when another rank fails before it is durable).
constexpr size_t kStepsPerRank = 2;
// Buffers of dropped copies kept for the next ones.
constexpr size_t kMaxSpare = 4;

using base::ByteUnits;
using base::FormatBytes;

}  // namespace

Replica::Replica(ckptd::v1::ReplicaHeader header, uint64_t bytes, std::unique_ptr<uint8_t[]> memory)
    : header_(std::move(header)),
      size_(bytes),
      data_(memory != nullptr ? std::move(memory) : std::unique_ptr<uint8_t[]>(new uint8_t[bytes == 0 ? 1 : bytes])) {
  header_.clear_ticket();
}

Replica::~Replica() {
  if (pinned_ != nullptr) pinned_->fetch_sub(size_, std::memory_order_relaxed);
}

ReplicaStore::ReplicaStore(ReplicaStoreOptions options)
    : options_(std::move(options)),
      logger_(options_.logger != nullptr ? options_.logger : &base::DefaultLogger()),
      clock_(options_.clock != nullptr ? options_.clock : base::RealClock::Get()) {}

ReplicaStore::Reservation::~Reservation() {
  if (replica_ != nullptr) store_->Release(*replica_);
}

void ReplicaStore::Release(const Replica& replica) {
  const ckptd::v1::ReplicaHeader& h = replica.header();
  absl::MutexLock l(&mu_);
  bytes_ -= replica.size();
  if (auto it = sender_bytes_.find(h.from_node()); it != sender_bytes_.end() && (it->second -= replica.size()) == 0) {
    sender_bytes_.erase(it);
  }
  if (auto it = receiving_.find(CopyKey{h.key().job(), h.key().rank(), h.key().step()});
      it != receiving_.end() && --it->second.count == 0) {
    receiving_.erase(it);
  }
}

uint64_t ReplicaStore::SenderBytesLocked(const std::string& node) const {
  auto it = sender_bytes_.find(node);
  return it != sender_bytes_.end() ? it->second : 0;
}

absl::StatusOr<std::unique_ptr<ReplicaStore::Reservation>> ReplicaStore::Reserve(
    const ckptd::v1::ReplicaHeader& header) {
  const ckptd::v1::ReplicaKey& key = header.key();
  if (absl::Status s = storage::ValidateJobName(key.job()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("replica header: ", s.message()));
  }
  if (header.from_node().empty() || header.from_node().size() > 256) {
    return absl::InvalidArgumentError("replica header: from_node must be 1..256 bytes");
  }
  if (header.index().size() > kMaxReplicaIndexBytes) {
    return absl::InvalidArgumentError(absl::StrCat("replica header: an index of ", header.index().size(),
                                                   " bytes is above the bound of ", kMaxReplicaIndexBytes));
  }
  if (key.rank() >= header.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica header: rank ", key.rank(), " is not inside world size ", header.world_size()));
  }
  const uint64_t need = header.data_bytes();
  // Read before the lock: the agent's core takes its own lock for it, and
  // sheds copies (taking this one) under none.
  const uint64_t staging = options_.staging_bytes ? options_.staging_bytes() : 0;
  const uint64_t budget = options_.budget_bytes;
  const std::string& from = header.from_node();
  const std::string what = absl::StrCat("the copy of job ", key.job(), " rank ", key.rank(), " step ", key.step());
  const std::string who = absl::StrCat(what, " from node ", from);
  const CopyKey copy_key{key.job(), key.rank(), key.step()};
  absl::MutexLock l(&mu_);
  // A copy is its sender's: another node's put of the key is refused, not
  // taken (nor one racing another node's copy of the key in).
  const std::string* owner = nullptr;
  const char* state = "held";
  if (auto it = held_.find(RankKey{key.job(), key.rank()}); it != held_.end()) {
    if (auto s = it->second.find(key.step()); s != it->second.end()) owner = &s->second.replica->header().from_node();
  }
  if (auto r = receiving_.find(copy_key); (owner == nullptr || *owner == from) && r != receiving_.end()) {
    owner = &r->second.from_node;
    state = "being received";
  }
  if (owner != nullptr && *owner != from) {
    return absl::PermissionDeniedError(absl::StrCat(what, " is ", state, " here for node ", *owner, ": node ", from,
                                                    " may not replace it (only the node that sent a copy does)"));
  }
  // Spare memory of the size is taken as it is (it is counted already).
  std::unique_ptr<uint8_t[]> memory;
  if (auto it = spare_.find(need); it != spare_.end()) {
    memory = std::move(it->second);
    spare_.erase(it);
  }
  const uint64_t extra = memory != nullptr ? 0 : need;
  auto refuse = [&](absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (memory != nullptr) bytes_ -= need;  // freed with `memory`
    return s;
  };
  if (budget != 0) {
    if (staging > budget || need > budget - staging) {
      return refuse(absl::ResourceExhaustedError(
          absl::StrCat(who, " needs ", need, " bytes (", FormatBytes(need, ByteUnits::kGiB),
                       "), but of the agent's memory budget of ", FormatBytes(budget, ByteUnits::kGiB), " ",
                       FormatBytes(std::min(staging, budget), ByteUnits::kGiB), " hold its own trainers' staging")));
    }
    // The rank's newest copy stays unless the new one is newer.
    const Held* protect = nullptr;
    if (auto it = held_.find(RankKey{key.job(), key.rank()});
        it != held_.end() && !it->second.empty() && it->second.rbegin()->first > key.step()) {
      protect = &it->second.rbegin()->second;
    }
    // The sender may push out its own copies, and those of senders holding
    // more than it will.
    while (staging + bytes_ + pinned_->load(std::memory_order_relaxed) + extra > budget) {
      if (!EvictOneLocked(protect, &from, SenderBytesLocked(from) + need)) {
        const uint64_t pinned = pinned_->load(std::memory_order_relaxed);
        return refuse(absl::ResourceExhaustedError(absl::StrCat(
            who, " needs ", need, " bytes (", FormatBytes(need, ByteUnits::kGiB), "): the agent's memory budget of ",
            FormatBytes(budget, ByteUnits::kGiB), " holds ", FormatBytes(staging, ByteUnits::kGiB), " of staging and ",
            FormatBytes(bytes_, ByteUnits::kGiB), " of copies being received or kept (",
            FormatBytes(SenderBytesLocked(from), ByteUnits::kGiB), " of them node ", from,
            "'s: it may push out only its own copies and those of senders holding more than it would with this one)",
            pinned != 0 ? absl::StrCat(", and ", FormatBytes(pinned, ByteUnits::kGiB),
                                       " of dropped copies still being sent to fetching nodes")
                        : "")));
      }
    }
  }
  // No allocation is tried for more than the machine holds (a sanitizer's
  // allocator aborts on such a size rather than failing it).
  static const uint64_t kMachineBytes = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : UINT64_MAX;
  }();
  if (need > kMachineBytes) {
    return refuse(absl::ResourceExhaustedError(absl::StrCat(
        who, " needs ", need, " bytes (", FormatBytes(need, ByteUnits::kGiB),
        "): this machine cannot allocate them, it has ", FormatBytes(kMachineBytes, ByteUnits::kGiB), " of memory")));
  }
  std::shared_ptr<Replica> replica;
  try {
    replica = std::make_shared<Replica>(header, need, std::move(memory));
  } catch (const std::bad_alloc&) {  // a size no budget bounded
    return refuse(absl::ResourceExhaustedError(absl::StrCat(
        who, " needs ", need, " bytes (", FormatBytes(need, ByteUnits::kGiB), "): this machine cannot allocate them")));
  }
  bytes_ += extra;
  sender_bytes_[from] += need;
  Receiving& receiving = receiving_[copy_key];
  receiving.from_node = from;
  ++receiving.count;
  return std::unique_ptr<Reservation>(new Reservation(this, std::move(replica)));
}

void ReplicaStore::Keep(std::unique_ptr<Reservation> reservation) {
  std::shared_ptr<Replica> replica = std::move(reservation->replica_);
  reservation.reset();  // its memory is counted as held from here on
  const ckptd::v1::ReplicaKey& key = replica->header().key();
  const std::string& from = replica->header().from_node();
  {
    absl::MutexLock l(&mu_);
    if (auto it = receiving_.find(CopyKey{key.job(), key.rank(), key.step()});
        it != receiving_.end() && --it->second.count == 0) {
      receiving_.erase(it);
    }
    std::map<uint64_t, Held>& steps = held_[RankKey{key.job(), key.rank()}];
    if (auto it = steps.find(key.step()); it != steps.end()) {  // the sender's own (Reserve)
      DropLocked(std::move(it->second), /*recycle=*/true);
      steps.erase(it);
    }
    steps[key.step()] = Held{replica, clock_->Now()};
    // The sender's steps of the rank beyond its newest kStepsPerRank.
    size_t own = 0;
    for (auto it = steps.end(); it != steps.begin();) {
      --it;
      if (it->second.replica->header().from_node() != from || ++own <= kStepsPerRank) continue;
      DropLocked(std::move(it->second), /*recycle=*/true);
      it = steps.erase(it);
    }
  }
  logger_->Info(absl::StrCat("peer copy of job ", key.job(), " rank ", key.rank(), " step ", key.step(), " (",
                             FormatBytes(replica->size(), ByteUnits::kGiB), ") received from node ",
                             replica->header().from_node()));
}

void ReplicaStore::DropLocked(Held held, bool recycle) {
  Replica& r = *held.replica;
  bytes_ -= r.size();
  if (auto it = sender_bytes_.find(r.header().from_node());
      it != sender_bytes_.end() && (it->second -= r.size()) == 0) {
    sender_bytes_.erase(it);
  }
  if (held.replica.use_count() != 1) {
    // A fetch still reads it: counted until the last reader lets go (held
    // here until then, the copy cannot go before the count is set).
    r.pinned_ = pinned_;
    pinned_->fetch_add(r.size(), std::memory_order_relaxed);
    return;
  }
  if (!recycle || r.data_ == nullptr) return;
  if (spare_.size() >= kMaxSpare) {
    bytes_ -= spare_.begin()->first;
    spare_.erase(spare_.begin());
  }
  bytes_ += r.size();
  spare_.emplace(r.size(), std::move(r.data_));
}

bool ReplicaStore::EvictOneLocked(const Held* protect, const std::string* for_node, uint64_t for_bytes) {
  if (!spare_.empty()) {
    bytes_ -= spare_.begin()->first;
    spare_.erase(spare_.begin());
    return true;
  }
  // Older steps of ranks with a newer copy first; then the copies of the
  // sender holding the most; then the least recently received. For a
  // sender, only its own and those of senders holding more than it will,
  // and none that a fetch reads (its memory would stay counted).
  std::map<uint64_t, Held>* from = nullptr;
  std::map<uint64_t, Held>::iterator victim;
  bool victim_superseded = false;
  uint64_t victim_holds = 0;
  for (auto& [rank, steps] : held_) {
    for (auto it = steps.begin(); it != steps.end(); ++it) {
      if (&it->second == protect) continue;
      const std::string& node = it->second.replica->header().from_node();
      const uint64_t holds = SenderBytesLocked(node);
      if (for_node != nullptr && ((node != *for_node && holds <= for_bytes) || it->second.replica.use_count() > 1)) {
        continue;
      }
      const bool superseded = std::next(it) != steps.end();
      if (from == nullptr || (superseded && !victim_superseded) ||
          (superseded == victim_superseded &&
           (holds > victim_holds ||
            (holds == victim_holds && it->second.received < victim->second.received)))) {
        from = &steps;
        victim = it;
        victim_superseded = superseded;
        victim_holds = holds;
      }
    }
  }
  if (from == nullptr) return false;
  const ckptd::v1::ReplicaHeader& h = victim->second.replica->header();
  logger_->Info(absl::StrCat("peer copy of job ", h.key().job(), " rank ", h.key().rank(), " step ", h.key().step(),
                             " from node ", h.from_node(), " dropped to make room",
                             for_node != nullptr ? absl::StrCat(" for node ", *for_node, "'s") : ""));
  DropLocked(std::move(victim->second), /*recycle=*/false);
  from->erase(victim);
  for (auto it = held_.begin(); it != held_.end();) {
    it = it->second.empty() ? held_.erase(it) : std::next(it);
  }
  return true;
}

std::shared_ptr<const Replica> ReplicaStore::Find(const ckptd::v1::ReplicaKey& key) const {
  absl::MutexLock l(&mu_);
  auto it = held_.find(RankKey{key.job(), key.rank()});
  if (it == held_.end()) return nullptr;
  auto s = it->second.find(key.step());
  if (s == it->second.end()) return nullptr;
  return s->second.replica;
}

std::vector<ckptd::v1::MemoryCopy> ReplicaStore::List() const {
  std::vector<ckptd::v1::MemoryCopy> out;
  absl::MutexLock l(&mu_);
  for (const auto& [rank, steps] : held_) {
    for (const auto& [step, held] : steps) {
      const ckptd::v1::ReplicaHeader& h = held.replica->header();
      ckptd::v1::MemoryCopy& c = out.emplace_back();
      c.set_job(h.key().job());
      c.set_rank(h.key().rank());
      c.set_step(step);
      c.set_owner_node(h.from_node());
      c.set_file_length(h.file_length());
      c.set_index_xxh3(h.index_xxh3());
    }
  }
  return out;
}

uint64_t ReplicaStore::bytes() const {
  absl::MutexLock l(&mu_);
  return bytes_ + pinned_->load(std::memory_order_relaxed);
}

uint64_t ReplicaStore::Shed(uint64_t want) {
  absl::MutexLock l(&mu_);
  const uint64_t before = bytes_;
  while (before - bytes_ < want && EvictOneLocked(nullptr, nullptr, 0)) {
  }
  return before - bytes_;
}

}  // namespace ckptd::replication
