// Staging memory shared between the agent (which owns it) and one trainer
// rank: a POSIX shared-memory segment with owner-only permissions (or shared
// with the trainers' group, see StagingSegment::Create), allocated
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
// and, for the memory tier (persisted steps stay in memory until their slot
// is needed):
//   PREPARING -> FREE (agent, PrepareSlot: its memory reserved and touched)
//   PERSISTING -> KEPT (agent, Keep: the persisted snapshot stays readable)
//   KEPT -> FREE (agent, Unkeep: the step is of no more use)
//   KEPT -> FILLING (trainer, AcquireForFill when no slot is FREE: the kept
//                    copy is given up, training never waits for it)
//   KEPT -> RESTORING (agent, TakeKept: the kept step restores from memory)
//   RESTORED -> KEPT (trainer, Release of a slot published with
//                     keep_on_release: the restored step stays in memory)
// A slot left FILLING by a trainer that died is returned to FREE by the agent
// (ReclaimAfterTrainerExit); a READY slot is still persisted after its
// trainer died, and KEPT slots stay KEPT for the trainer's successor.
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
  kPreparing = 6,
  kKept = 7,
};
absl::string_view SlotStateName(SlotState s);

// Where each buffer sits inside a slot.
struct StagingLayout {
  std::vector<uint64_t> offsets;  // per buffer, 4096-aligned
  std::vector<uint64_t> lengths;
  uint64_t slot_bytes = 0;        // a multiple of 4096
};
// The largest staging slot (and segment): above any machine's memory, and
// low enough that no offset or size inside one wraps past 2^64 or off_t.
inline constexpr uint64_t kMaxSlotBytes = uint64_t{1} << 50;

// Lays out buffers of `lengths` bytes one after another, each aligned.
// REQUIRES: the lengths fit kMaxSlotBytes together (their sum wraps
// otherwise); lengths from outside go through PlanLayoutChecked.
StagingLayout PlanLayout(const std::vector<uint64_t>& lengths);
// PlanLayout for lengths from outside this process (a trainer's
// registration, a partner's shard index): kInvalidArgument naming the
// buffer, its length and its offset when the slot would pass kMaxSlotBytes.
absl::StatusOr<StagingLayout> PlanLayoutChecked(const std::vector<uint64_t>& lengths);

// The bytes of a segment of `slots` slots of `slot_bytes` (header included).
uint64_t SegmentBytes(uint32_t slots, uint64_t slot_bytes);

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

// Where shm_open keeps POSIX shared memory (glibc, Linux).
inline constexpr char kShmDir[] = "/dev/shm";

// Staging memory mapped into this process, from /proc/self/smaps: how many
// bytes, and how many of them huge pages map (2 MiB at a time: /dev/shm
// mounted with huge=advise, within_size or always; see docs/operations.md).
struct MappedPages {
  uint64_t bytes = 0;
  uint64_t huge_bytes = 0;
};
// This process's mappings of segments whose name ("/ckptd-...") starts with
// `name_prefix`. Zeros when /proc cannot be read. Huge pages need a kernel
// of 5.14 or later (MADV_POPULATE_WRITE; see Create).
MappedPages MappedStaging(absl::string_view name_prefix);

// The owner, group and mode of a file, as stat() reports them.
struct FileAccess {
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t mode = 0;  // permission bits, the sticky bit included
};

// The process that opens a segment.
struct SegmentOpener {
  uint32_t uid = 0;                   // effective uid
  std::vector<uint32_t> groups;       // effective gid and supplementary groups
  std::optional<uint32_t> agent_uid;  // the agent's user, when the opener knows it
};

// Whether `opener` may trust the staging segment at `path` (in directory
// `dir`): PermissionDenied naming the segment's (or the directory's) owner,
// group and mode, and what was expected, unless all of these hold:
//  - the segment belongs to the opener's user or to the agent's
//    (`opener.agent_uid`): no other user can have planted it;
//  - others have no access to it (mode & 007 == 0);
//  - when it belongs to the agent's user and not the opener's:
//    - others cannot rename entries of the directory (it is sticky, or
//      writable by its owner only, and owned by root, the opener's user or
//      the agent's), so they cannot swap in another segment of the agent's;
//    - it is read-write for its group and that group is the opener's or one
//      of its supplementary groups (the agent's --trainer-group), or the
//      opener is root.
absl::Status CheckSegmentAccess(absl::string_view path, const FileAccess& segment, absl::string_view dir,
                                const FileAccess& dir_access, const SegmentOpener& opener);

class StagingSegment {
 public:
  // Agent side: creates segment `name` ("/ckptd-..." as for shm_open; must not
  // exist) with `slots` slots of `slot_bytes`, mode 0600 (0660 and group
  // `group` when given: the trainers' group), pre-faulted. The segment's name
  // is unlinked when this object is destroyed. `clock` measures the waits for
  // a slot (default base::RealClock::Get()); it must outlive the object.
  // With `prepare_slots` false only the header is made: every slot is
  // PREPARING, its memory neither reserved nor faulted in, until PrepareSlot.
  static absl::StatusOr<std::unique_ptr<StagingSegment>> Create(const std::string& name, uint32_t slots,
                                                                uint64_t slot_bytes,
                                                                std::optional<uint32_t> group = std::nullopt,
                                                                base::Clock* clock = nullptr,
                                                                bool prepare_slots = true);
  // Trainer side: maps an existing segment (not faulted in: see Prefault) after checking, with
  // CheckSegmentAccess, that this process may trust it (kPermissionDenied
  // naming its owner, group and mode otherwise, also when the system refuses
  // to open it), and then its header. `agent_uid` is the agent's user (the
  // owner of the agent's socket): a segment of another user than this
  // process's is accepted only from it, shared with a group of this process.
  // kNotFound when absent, kDataLoss when it is not a staging segment.
  static absl::StatusOr<std::unique_ptr<StagingSegment>> Open(const std::string& name, base::Clock* clock = nullptr,
                                                              std::optional<uint32_t> agent_uid = std::nullopt);
  ~StagingSegment();
  StagingSegment(const StagingSegment&) = delete;
  StagingSegment& operator=(const StagingSegment&) = delete;

  const std::string& name() const { return name_; }
  // The whole segment: header block and slots.
  uint64_t total_bytes() const { return mapped_; }
  // This mapping of it, as MappedStaging. The kernel walks its page tables
  // (about 13 ms per GiB on 4 KiB pages) and those of the mappings below it.
  MappedPages Mapped() const;
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
  // FILLING -> READY, or RESTORING -> RESTORED, with the step it holds. A
  // RESTORED slot published with `keep_on_release` becomes KEPT instead of
  // FREE when the trainer releases it (or exits without doing so).
  absl::Status Publish(uint32_t slot, uint64_t step, bool keep_on_release = false);
  // Agent: the READY slot with the lowest step, now PERSISTING; nullopt if none.
  std::optional<uint32_t> TakeReady();
  // READY -> PERSISTING of `slot` alone, if it is READY holding `step`.
  bool TakeReadySlot(uint32_t slot, uint64_t step);
  // Agent: claims a FREE slot to restore into (RESTORING), or, when none is
  // free, the KEPT slot with the lowest step.
  absl::StatusOr<uint32_t> AcquireForRestore(absl::Duration wait);
  // Agent: reserves the memory of a PREPARING slot (a full /dev/shm is an
  // error here, not a SIGBUS later) and faults it into this mapping (the
  // first touch, which clears it); the slot is then FREE. A slot in another
  // state is left alone (OK).
  absl::Status PrepareSlot(uint32_t slot);
  // Slots no longer PREPARING.
  uint32_t slots_prepared() const;
  // Trainer: AcquireForFill would find a slot now (a FREE one, or a KEPT
  // copy it may give up), unless another caller takes it first. No wait.
  bool CanAcquireForFill() const { return AnyFree(/*or_kept=*/true); }
  // Faults a slot's pages into this process's mapping (a trainer does this in
  // the background so that its first snapshot does not pay for page faults).
  // A PREPARING slot is left alone. Best effort.
  void Prefault(uint32_t slot) const;
  // Agent: PERSISTING -> KEPT.
  absl::Status Keep(uint32_t slot);
  // Agent: the kept step that a slot acquisition with no free slot gives up
  // last (the newest committed step: what a restart restores), or none.
  // Older and newer kept steps go first, the oldest first; when only the
  // pinned one is kept, it goes too rather than stall the trainer.
  void PinKept(std::optional<uint64_t> step);
  std::optional<uint64_t> pinned_step() const;
  // Agent: KEPT -> FREE when the slot still holds `step`; false otherwise.
  bool Unkeep(uint32_t slot, uint64_t step);
  // Agent: KEPT -> RESTORING when the slot holds `step`; false when it does
  // not (the trainer took it for a snapshot, or it holds another step).
  bool TakeKept(uint32_t slot, uint64_t step);
  // FILLING -> FREE: the trainer gives up a snapshot it could not finish.
  absl::Status Abandon(uint32_t slot);
  // PERSISTING -> FREE (agent) or RESTORED -> FREE or KEPT (trainer; see
  // Publish). A slot in any other state is kFailedPrecondition naming the
  // state.
  absl::Status Release(uint32_t slot);
  // Agent, once the trainer using this segment has exited: slots it left
  // FILLING (a half-made copy) or RESTORED (never copied out) become FREE (or
  // KEPT, see Publish); READY and KEPT slots stay. Returns how many changed.
  int ReclaimAfterTrainerExit();

 private:
  struct Header;
  struct SlotHeader;
  StagingSegment(std::string name, bool owner, uint8_t* base, uint64_t mapped, base::Clock* clock, int fd = -1);
  SlotHeader* slot_header(uint32_t slot) const;
  absl::StatusOr<uint32_t> Acquire(SlotState to, absl::Duration wait, absl::string_view what);
  bool Transition(uint32_t slot, SlotState from, SlotState to);
  // FREE or (when `or_kept`) KEPT slots exist.
  bool AnyFree(bool or_kept) const;
  // RESTORED -> KEPT or FREE, as it was published.
  bool ReleaseRestored(uint32_t slot);
  // A byte range of the slot's data in this mapping.
  void Advise(uint32_t slot, int advice) const;

  const std::string name_;
  const bool owner_;
  uint8_t* const base_;
  const uint64_t mapped_;
  base::Clock* const clock_;
  // The creator's descriptor when it was made with slots PREPARING (closed
  // with the segment); -1 otherwise.
  const int fd_;
};

}  // namespace ckptd::staging
