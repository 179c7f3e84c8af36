#include "coordinator/reshard_layouts.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/thread_pool.h"

namespace ckptd::coordinator::internal {

ReshardLayouts::ReshardLayouts(storage::CheckpointStore* store, size_t keep, int readers)
    : store_(store), keep_(std::max<size_t>(keep, 1)), readers_(std::max(readers, 1)) {}

uint64_t ReshardLayouts::loads() const {
  absl::MutexLock l(&mu_);
  return loads_;
}

absl::StatusOr<std::shared_ptr<const storage::SavedLayout>> ReshardLayouts::Get(const std::string& job,
                                                                                uint64_t step) {
  const std::pair<std::string, uint64_t> key(job, step);
  std::shared_ptr<Entry> entry;
  bool load = false;
  {
    absl::MutexLock l(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      it = entries_.emplace(key, std::make_shared<Entry>()).first;
      load = true;
      ++loads_;
    }
    entry = it->second;
    entry->used = ++uses_;
    if (!load) {
      Entry* e = entry.get();
      auto done = [e]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return e->done; };
      mu_.Await(absl::Condition(&done));
      return entry->result;
    }
    // At most kMaxLoading steps are read at once; the others wait their turn.
    auto turn = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return loading_ < kMaxLoading; };
    mu_.Await(absl::Condition(&turn));
    ++loading_;
  }
  absl::StatusOr<std::shared_ptr<const storage::SavedLayout>> result = Load(job, step);
  absl::MutexLock l(&mu_);
  --loading_;
  entry->result = result;
  entry->done = true;
  entry->used = ++uses_;
  if (!result.ok()) {
    entries_.erase(key);
    return result;
  }
  // The least recently used layouts beyond `keep_` go: never the one just
  // read, nor those still being read.
  while (entries_.size() > keep_) {
    auto oldest = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->first == key || !it->second->done) continue;
      if (oldest == entries_.end() || it->second->used < oldest->second->used) oldest = it;
    }
    if (oldest == entries_.end()) break;
    entries_.erase(oldest);
  }
  return result;
}

absl::StatusOr<std::shared_ptr<const storage::SavedLayout>> ReshardLayouts::Load(const std::string& job,
                                                                                 uint64_t step) {
  absl::StatusOr<ckptd::v1::StepManifest> manifest = store_->ReadManifest(job, step);
  if (!manifest.ok()) return manifest.status();
  const uint32_t world = manifest->world_size();
  if (world == 0 || static_cast<uint32_t>(manifest->shards_size()) != world) {
    return absl::DataLossError(absl::StrCat("the MANIFEST of step ", step, " of job ", job, " lists ",
                                            manifest->shards_size(), " shards for a world of ", world));
  }
  auto layout = std::make_shared<storage::SavedLayout>(world);
  // Indexes are read `readers_` at a time and added in rank order: at most
  // that many whole indexes (with their block lists) are held at once.
  std::vector<absl::StatusOr<std::unique_ptr<storage::ShardReader>>> batch;
  std::unique_ptr<base::ThreadPool> pool;
  if (readers_ > 1 && world > 1) pool = std::make_unique<base::ThreadPool>(std::min<int>(readers_, world));
  for (uint32_t first = 0; first < world; first += static_cast<uint32_t>(readers_)) {
    const uint32_t end = std::min<uint32_t>(world, first + static_cast<uint32_t>(readers_));
    batch.clear();
    for (uint32_t r = first; r < end; ++r) batch.emplace_back(absl::UnknownError("not read"));
    auto read = [&, first](uint32_t r) { batch[r - first] = store_->OpenCommittedShard(job, step, *manifest, r); };
    if (pool == nullptr) {
      for (uint32_t r = first; r < end; ++r) read(r);
    } else {
      absl::Mutex done_mu;
      uint32_t done = 0;
      for (uint32_t r = first; r < end; ++r) {
        pool->Schedule([&, r] {
          read(r);
          absl::MutexLock l(&done_mu);
          ++done;
        });
      }
      const uint32_t count = end - first;
      auto all_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(done_mu) { return done == count; };
      absl::MutexLock l(&done_mu);
      done_mu.Await(absl::Condition(&all_done));
    }
    for (uint32_t r = first; r < end; ++r) {
      absl::StatusOr<std::unique_ptr<storage::ShardReader>>& reader = batch[r - first];
      if (!reader.ok()) return reader.status();
      layout->Add(r, (*reader)->index());
    }
  }
  layout->Seal();
  return std::shared_ptr<const storage::SavedLayout>(std::move(layout));
}

}  // namespace ckptd::coordinator::internal
