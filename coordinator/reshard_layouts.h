// The saved layouts of the steps ranks restore resharded (a step saved by
// another number of ranks, or holding shares of replicated buffers): read
// once per step from its N shard indexes, shared by every rank's plan, the
// few most recently used kept (a few hundred bytes per saved tensor each),
// at most two steps read at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/reshard_plan.h"
#include "storage/store.h"

namespace ckptd::coordinator::internal {

class ReshardLayouts {
 public:
  // `keep` layouts stay cached (at least 1); `readers` shard indexes are
  // read at once (at least 1). `store` must outlive this.
  ReshardLayouts(storage::CheckpointStore* store, size_t keep, int readers);

  // The layout of `job`'s committed `step`: its MANIFEST and every shard's
  // index (each checked against the MANIFEST), read by the first caller
  // while later ones wait for it. A failure is not kept: the next call
  // reads again.
  absl::StatusOr<std::shared_ptr<const storage::SavedLayout>> Get(const std::string& job, uint64_t step);

  // Steps read since construction (a cached one is not read again).
  uint64_t loads() const;

 private:
  struct Entry {
    bool done = false;
    absl::StatusOr<std::shared_ptr<const storage::SavedLayout>> result;
    uint64_t used = 0;
  };
  absl::StatusOr<std::shared_ptr<const storage::SavedLayout>> Load(const std::string& job, uint64_t step);

  storage::CheckpointStore* const store_;
  const size_t keep_;
  const int readers_;
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t uses_ ABSL_GUARDED_BY(mu_) = 0;
  // Steps being read now, at most kMaxLoading (each holds `readers_` whole
  // indexes and threads while it reads).
  static constexpr int kMaxLoading = 2;
  int loading_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t loads_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckptd::coordinator::internal
