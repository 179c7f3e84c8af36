// Private parts of AgentCore shared by its agent_*.cc files: the trainer
// record and the small helpers its concerns have in common. Nothing outside
// agent/ includes this header.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent_core.h"
#include "agent/local_tier.h"
#include "ckptd/v1/agent.pb.h"
#include "staging/staging.h"
#include "storage/shard_writer.h"

namespace ckptd::agent {

namespace internal {

// Where a trainer is in its lifecycle (docs/agent.md, "A trainer's
// lifecycle"). AgentCore::MoveLocked makes every change, under AgentCore::mu_.
enum class TrainerState {
  kRegistering,  // Register claims its staging; listed nowhere yet
  kRegistered,   // in trainers_: it snapshots, its persister persists
  kExiting,      // in exiting_: its persister writes what it left READY
  kTakenOver,    // in exiting_, still draining; a successor holds its segment
  kRetired,      // drained (or refused); its segment parked, handed on or let go
};
absl::string_view TrainerStateName(TrainerState state);
// The lifecycle's transitions: registering -> registered or retired (refused);
// registered -> exiting; exiting <-> taken over (a successor's registration,
// undone when it is refused); exiting or taken over -> retired.
bool TrainerMoveAllowed(TrainerState from, TrainerState to);

// What a commit records of rank `rank`'s shard file, as written.
ckptd::v1::ShardRef ShardRefOf(uint32_t rank, const storage::ShardWriteResult& written);

// The CUDA device a trainer's buffers live on (-1: none), as the
// coordinator is told.
int32_t GpuOf(const TrainerRegistration& reg);

// Whether the trainer took the slot of kept step `k` back for a snapshot.
template <typename Kept>
bool TakenBack(const staging::StagingSegment& segment, const Kept& k) {
  const staging::SlotState s = segment.state(k.slot);
  return segment.step(k.slot) != k.step ||
         (s != staging::SlotState::kKept && s != staging::SlotState::kRestoring && s != staging::SlotState::kRestored);
}

// Kept steps whose slot the trainer took back for a snapshot are forgotten.
template <typename Kept>
void ForgetTakenBack(const staging::StagingSegment& segment, std::vector<Kept>* kept) {
  std::erase_if(*kept, [&](const Kept& k) { return TakenBack(segment, k); });
}

}  // namespace internal

struct AgentCore::Trainer {
  uint64_t id = 0;
  TrainerRegistration reg;
  std::string key;  // LayoutKey(reg)
  staging::StagingLayout layout;
  std::shared_ptr<staging::StagingSegment> segment;
  std::thread persister;
  // The persister's thread id once it runs (0 before): raised to normal
  // priority for the shutdown (BeginShutdown).
  std::atomic<int> persister_tid{0};
  // The persister's encoder of memory checkpoints, made with the persister
  // and taken by it (PersistLoop).
  std::unique_ptr<base::ThreadPool> memory_encoder;
  // The persister is still allocating the segment's slots in the background
  // (a restore waits for them rather than fail after its usual wait).
  std::atomic<bool> preparing{false};

  absl::Mutex mu;
  bool wake ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // Set when the trainer exited: the snapshots it left READY (slot, step;
  // in step order), the only ones its persister still takes, since a
  // successor may publish its own in the same segment. Then `drained` once
  // the persister is done.
  std::optional<std::vector<std::pair<uint32_t, uint64_t>>> exit_drain ABSL_GUARDED_BY(mu);
  bool drained ABSL_GUARDED_BY(mu) = false;
  // A trainer that took over the segment of one still draining: its
  // persister waits for that one's drain before it takes READY slots.
  std::shared_ptr<Trainer> predecessor ABSL_GUARDED_BY(mu);
  // Under AgentCore::mu_ (AgentCore::MoveLocked): its lifecycle state, and
  // once taken over, the successor registered with the same layout that
  // holds its segment (the steps it keeps from now on go to that one).
  internal::TrainerState state = internal::TrainerState::kRegistering;
  std::weak_ptr<Trainer> successor;
  PersistStatus status ABSL_GUARDED_BY(mu);
  // Reporting failed persists (NotePersisted): failures since the last
  // success, those not logged yet, and when the last warning was logged
  // (nullopt: none since the last success).
  uint64_t failed_in_a_row ABSL_GUARDED_BY(mu) = 0;
  uint64_t failures_unlogged ABSL_GUARDED_BY(mu) = 0;
  std::optional<absl::Time> failure_logged_at ABSL_GUARDED_BY(mu);
  // For the coordinator: progress, pace, timings, and the restore round the
  // trainer came from (stamped on its shard reports).
  uint64_t step ABSL_GUARDED_BY(mu) = 0;
  double step_seconds ABSL_GUARDED_BY(mu) = 0;
  double step_seconds_idle ABSL_GUARDED_BY(mu) = 0;
  double step_seconds_persisting ABSL_GUARDED_BY(mu) = 0;
  double last_stall ABSL_GUARDED_BY(mu) = 0;
  double last_persist ABSL_GUARDED_BY(mu) = 0;
  std::map<uint32_t, double> stall_by_slot ABSL_GUARDED_BY(mu);
  // When each slot's snapshot was published, and its step (the persister
  // may take a slot before the trainer's call arrives: a time for another
  // step is not that snapshot's).
  std::map<uint32_t, std::pair<uint64_t, absl::Time>> published_by_slot ABSL_GUARDED_BY(mu);
  std::vector<uint64_t> missed_targets ABSL_GUARDED_BY(mu);
  uint64_t incarnation ABSL_GUARDED_BY(mu) = 0;
  // What the local tier did for this trainer.
  LocalTierCounters local;
  // The memory tier: the steps kept in the segment, and what restores from
  // memory did.
  std::vector<KeptStep> kept ABSL_GUARDED_BY(mu);  // one per KEPT slot
  uint64_t memory_restores ABSL_GUARDED_BY(mu) = 0;
  uint64_t memory_rejected ABSL_GUARDED_BY(mu) = 0;
  uint64_t peer_restores ABSL_GUARDED_BY(mu) = 0;
  uint64_t peer_rejected ABSL_GUARDED_BY(mu) = 0;
  uint64_t resharded_restores ABSL_GUARDED_BY(mu) = 0;
  uint64_t resharded_shards_opened ABSL_GUARDED_BY(mu) = 0;
  // The step the trainer's last restore handed over (nullopt: none, or a
  // fresh start), and for a memory checkpoint the shard it must be and the
  // peers the plan named (a reread of it has no disk to go to).
  std::optional<uint64_t> restored ABSL_GUARDED_BY(mu);
  std::optional<ckptd::v1::ShardRef> restored_expected ABSL_GUARDED_BY(mu);
  std::vector<ckptd::v1::PeerCopy> restored_peers ABSL_GUARDED_BY(mu);
  // Where that step came from among the peers (LoadCall::handed_from), and
  // the peers whose copy of it the trainer found damaged since.
  std::string restored_from ABSL_GUARDED_BY(mu);
  std::set<std::string> rejected_sources ABSL_GUARDED_BY(mu);

  // `status` with the local tier's counters.
  PersistStatus StatusLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    PersistStatus s = status;
    const LocalTierStats l = local.Get();
    s.local_writes = l.writes;
    s.local_fallbacks = l.fallbacks;
    s.last_local_error = l.last_error;
    s.local_restores = l.restores;
    s.memory_restores = memory_restores;
    s.memory_rejected = memory_rejected;
    s.peer_restores = peer_restores;
    s.peer_rejected = peer_rejected;
    s.resharded_restores = resharded_restores;
    s.resharded_shards_opened = resharded_shards_opened;
    s.slots = segment->slots();
    s.slots_ready = segment->slots_prepared();
    return s;
  }
};

}  // namespace ckptd::agent
