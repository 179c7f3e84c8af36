// Staging memory shared between the agent (which owns it) and one trainer
// rank: a POSIX shared-memory segment with owner-only permissions, allocated
// and pre-faulted once, cut into slots that are reused. Each slot holds one
// snapshot of every registered buffer, each buffer at a 4096-aligned offset
// so that the agent can persist straight from it (O_DIRECT, no copy).
//
// Slot states live in the segment and change with atomic compare-and-swap,
// so the trainer claims and fills a slot without any RPC:
//   FREE -> FILLING (trainer, AcquireForFill) -> READY (trainer, Publish)
//   READY -> PERSISTING (agent, TakeReady) -> FREE (agent, Release)
//   FREE -> RESTORING (agent, AcquireForRestore) -> RESTORED (agent, Publish)
//   RESTORED -> FREE (trainer, Release, after copying out)
// A slot left FILLING by a trainer that died is returned to FREE by the agent
// (ReclaimAfterTrainerExit); a READY slot is still persisted after its
// trainer died.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/clock.h"

namespace ckptd::staging {

enum class SlotState : uint32_t {
  kFree = 0,
  kFilling = 1,
  kReady = 2,
  kPersisting = 3,
  kRestoring = 4,
  kRestored = 5,
};
absl::string_view SlotStateName(SlotState s);

// Where each buffer sits inside a slot.
struct StagingLayout {
  std::vector<uint64_t> offsets;  // per buffer, 4096-aligned
  std::vector<uint64_t> lengths;
  uint64_t slot_bytes = 0;        // a multiple of 4096
};
// Lays out buffers of `lengths` bytes one after another, each aligned.
StagingLayout PlanLayout(const std::vector<uint64_t>& lengths);

// How many slots fit `budget_bytes` (at most `wanted`); kResourceExhausted
// naming both sizes when not even one does.
absl::StatusOr<uint32_t> SlotsWithinBudget(uint64_t slot_bytes, uint32_t wanted, uint64_t budget_bytes);

// The prefix of this agent process's staging segment names:
// "/ckptd-<pid>-<tag>", the tag random per process. In a container the
// agent's pid is the same at every start (often 1), so the pid alone would
// not tell this agent's segments from those a killed predecessor left in the
// host's /dev/shm.
const std::string& AgentSegmentPrefix();

// Removes staging segments that agents killed without a chance to clean up
// left behind, owned by this user, in `shm_dir` (default /dev/shm): names
// "ckptd-<pid>-<tag>-<n>" (or the older "ckptd-<pid>-<n>") of a process that
// no longer exists, and those with this process's pid but another tag (a
// predecessor in another PID namespace). Returns the names removed. Segments
// of other live processes and this process's own are never touched.
absl::StatusOr<std::vector<std::string>> ReclaimStaleSegments(const std::string& shm_dir = "/dev/shm");

class StagingSegment {
 public:
  // Agent side: creates segment `name` ("/ckptd-..." as for shm_open; must not
  // exist) with `slots` slots of `slot_bytes`, mode 0600 (0660 and group
  // `group` when given: the trainers' group), pre-faulted. The segment's name
  // is unlinked when this object is destroyed. `clock` measures the waits for
  // a slot (default base::RealClock::Get()); it must outlive the object.
  static absl::StatusOr<std::unique_ptr<StagingSegment>> Create(const std::string& name, uint32_t slots,
                                                                uint64_t slot_bytes,
                                                                std::optional<uint32_t> group = std::nullopt,
                                                                base::Clock* clock = nullptr);
  // Trainer side: maps an existing segment (pre-faulted) after checking its
  // header. kNotFound when absent, kDataLoss when it is not a staging segment.
  static absl::StatusOr<std::unique_ptr<StagingSegment>> Open(const std::string& name, base::Clock* clock = nullptr);
  ~StagingSegment();
  StagingSegment(const StagingSegment&) = delete;
  StagingSegment& operator=(const StagingSegment&) = delete;

  const std::string& name() const { return name_; }
  uint32_t slots() const;
  uint64_t slot_bytes() const;
  uint8_t* slot_data(uint32_t slot) const;
  SlotState state(uint32_t slot) const;
  uint64_t step(uint32_t slot) const;

  // Trainer: claims a FREE slot for filling, waiting up to `wait` of the
  // segment's clock (zero: do not wait); the slots are looked at again at least
  // once a millisecond, since the other process frees them without telling.
  // kResourceExhausted "no free staging slot" when none frees up.
  absl::StatusOr<uint32_t> AcquireForFill(absl::Duration wait);
  // FILLING -> READY, or RESTORING -> RESTORED, with the step it holds.
  absl::Status Publish(uint32_t slot, uint64_t step);
  // Agent: the READY slot with the lowest step, now PERSISTING; nullopt if none.
  std::optional<uint32_t> TakeReady();
  // Agent: claims a FREE slot to restore into (RESTORING).
  absl::StatusOr<uint32_t> AcquireForRestore(absl::Duration wait);
  // FILLING -> FREE: the trainer gives up a snapshot it could not finish.
  absl::Status Abandon(uint32_t slot);
  // PERSISTING -> FREE (agent) or RESTORED -> FREE (trainer). A slot in any
  // other state is kFailedPrecondition naming the state.
  absl::Status Release(uint32_t slot);
  // Agent, once the trainer using this segment has exited: slots it left
  // FILLING (a half-made copy) or RESTORED (never copied out) become FREE;
  // READY slots stay, to be persisted. Returns how many were freed.
  int ReclaimAfterTrainerExit();

 private:
  struct Header;
  struct SlotHeader;
  StagingSegment(std::string name, bool owner, uint8_t* base, uint64_t mapped, base::Clock* clock);
  SlotHeader* slot_header(uint32_t slot) const;
  absl::StatusOr<uint32_t> Acquire(SlotState to, absl::Duration wait, absl::string_view what);
  bool Transition(uint32_t slot, SlotState from, SlotState to);
  bool AnyFree() const;

  const std::string name_;
  const bool owner_;
  uint8_t* const base_;
  const uint64_t mapped_;
  base::Clock* const clock_;
};

}  // namespace ckptd::staging
