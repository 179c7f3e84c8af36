#include "staging/staging.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <functional>
#include <new>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/aligned_buffer.h"
#include "base/posix_error.h"
#include "base/status_macros.h"

namespace ckptd::staging {

using base::AlignUp;
using base::PosixError;

namespace {

constexpr char kMagic[8] = {'C', 'K', 'P', 'T', 'S', 'T', 'G', '1'};
constexpr uint32_t kVersion = 2;  // 2: PREPARING and KEPT slots, keep_on_release
constexpr uint64_t kAlign = base::kDirectIoAlignment;
constexpr uint64_t kHeaderBlock = kAlign;
constexpr size_t kSlotHeaderBytes = 64;
// Slot headers follow the 64-byte segment header inside the header block.
constexpr uint32_t kMaxSlots = (kHeaderBlock - 64) / kSlotHeaderBytes;

absl::Status ValidateName(const std::string& name) {
  bool ok = name.size() >= 2 && name.size() <= 200 && name[0] == '/' && name[1] != '.';
  for (size_t i = 1; ok && i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    ok = absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat("staging segment name \"", absl::CHexEscape(name),
                                                   "\" must be '/' then 1..199 of A-Z a-z 0-9 . _ -, not starting with '.'"));
  }
  return absl::OkStatus();
}

// Reads a byte of every page of [p, p + len): maps pages that exist.
void TouchPages(const uint8_t* p, uint64_t len) {
  const volatile uint8_t* v = p;
  for (uint64_t off = 0; off < len; off += 4096) (void)v[off];
}

// Reserves bytes [offset, offset + len) of the segment file `fd`, mapped at
// `base` (offset page-aligned), and faults them into the mapping: they exist
// in /dev/shm afterwards, so a full /dev/shm is an error here, not a SIGBUS
// in the trainer later. Returns 0 or an errno; on an error the range holds
// no memory. The pages are made through the mapping (MADV_POPULATE_WRITE,
// as first writes would), so that a MADV_HUGEPAGE mapping gets huge pages;
// fallocate follows no mapping. It serves where the kernel lacks
// MADV_POPULATE_WRITE (before 5.14), and says why populating failed (a full
// /dev/shm fails it with EFAULT, fallocate with ENOSPC).
int Reserve(int fd, uint8_t* base, uint64_t offset, uint64_t len) {
  if (::madvise(base + offset, len, MADV_POPULATE_WRITE) == 0) return 0;
  if (int err = ::posix_fallocate(fd, static_cast<off_t>(offset), static_cast<off_t>(len)); err != 0) {
    // What populating made before /dev/shm filled up goes back: it would
    // starve every other user of /dev/shm (other ranks, NCCL, data loaders).
    (void)::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                      static_cast<off_t>(len));
    return err;
  }
  TouchPages(base + offset, len);
  return 0;
}

// What ScanSmaps does with a mapping, from its first line.
enum class Scan { kSkip, kTake, kStop };

// Adds up /proc/self/smaps over the mappings `which` takes, in address
// order, until it says stop (the kernel walks the page tables of each
// mapping read: stopping early spares the rest).
MappedPages ScanSmaps(const std::function<Scan(absl::string_view first_line)>& which) {
  MappedPages m;
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool taken = false;
  while (std::getline(smaps, line)) {
    // A mapping's first line starts "<start>-<end> ", its other lines "<Key>:".
    const size_t space = line.find(' ');
    const bool first = space != std::string::npos && line.find(':') > space && line.find('-') < space;
    if (first) {
      const Scan scan = which(line);
      if (scan == Scan::kStop) break;
      taken = scan == Scan::kTake;
      continue;
    }
    if (!taken) continue;
    uint64_t* to = absl::StartsWith(line, "Size:")             ? &m.bytes
                   : absl::StartsWith(line, "ShmemPmdMapped:") ? &m.huge_bytes
                                                               : nullptr;
    if (to == nullptr) continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint64_t kib = 0;
    if (f.size() == 3 && f[2] == "kB" && absl::SimpleAtoi(f[1], &kib)) *to += kib * 1024;
  }
  return m;
}

std::string Describe(absl::string_view what, absl::string_view path, const FileAccess& f) {
  return absl::StrFormat("%s %s (owner uid %u, group %u, mode %04o)", what, path, f.uid, f.gid, f.mode & 07777);
}

std::string DescribeOpener(const SegmentOpener& opener) {
  return absl::StrCat(
      "this process: uid ", opener.uid, ", groups ", absl::StrJoin(opener.groups, ","),
      opener.agent_uid ? absl::StrCat("; the agent's uid ", *opener.agent_uid) : "; the agent's uid not known");
}

FileAccess AccessOf(const struct stat& st) {
  return {static_cast<uint32_t>(st.st_uid), static_cast<uint32_t>(st.st_gid), static_cast<uint32_t>(st.st_mode)};
}

absl::StatusOr<SegmentOpener> ThisProcess(std::optional<uint32_t> agent_uid) {
  SegmentOpener opener;
  opener.uid = static_cast<uint32_t>(::geteuid());
  opener.agent_uid = agent_uid;
  opener.groups.push_back(static_cast<uint32_t>(::getegid()));
  const int n = ::getgroups(0, nullptr);
  if (n < 0) return PosixError("getgroups", errno);
  std::vector<gid_t> groups(static_cast<size_t>(n));
  const int got = ::getgroups(n, groups.data());
  if (got < 0) return PosixError("getgroups", errno);
  for (int i = 0; i < got; ++i) {
    if (groups[i] != ::getegid()) opener.groups.push_back(static_cast<uint32_t>(groups[i]));
  }
  return opener;
}

}  // namespace

absl::Status CheckSegmentAccess(absl::string_view path, const FileAccess& segment, absl::string_view dir,
                                const FileAccess& dir_access, const SegmentOpener& opener) {
  auto trusted = [&](uint32_t uid) { return uid == opener.uid || (opener.agent_uid && uid == *opener.agent_uid); };
  const std::string seg = Describe("staging segment", path, segment);
  // What was opened must be the agent's (or this user's own): anybody may
  // create files in /dev/shm, and one of another user's making, put there
  // before the agent made its own or in its place, must not be used.
  if (!trusted(segment.uid)) {
    return absl::PermissionDeniedError(absl::StrCat(
        seg,
        " belongs to neither this process's user nor the agent's, so another user may have planted it: "
        "expected the owner to be uid ",
        opener.uid, opener.agent_uid ? absl::StrCat(" or ", *opener.agent_uid) : " (the agent's uid not known)", " (",
        DescribeOpener(opener), ")"));
  }
  if ((segment.mode & 007) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(seg, " gives other users access: expected none (0600, or 0660 with the agent's --trainer-group) (",
                     DescribeOpener(opener), ")"));
  }
  if (segment.uid == opener.uid) return absl::OkStatus();
  // The agent's segment, for a trainer of another user. Where others may
  // rename the directory's entries (no sticky bit), they could swap in
  // another segment of the agent's under this name.
  if (!(dir_access.uid == 0 || trusted(dir_access.uid)) ||
      ((dir_access.mode & S_ISVTX) == 0 && (dir_access.mode & 022) != 0)) {
    return absl::PermissionDeniedError(absl::StrCat(
        Describe("staging directory", dir, dir_access), " lets other users replace ", path,
        ", a segment of the agent's user: expected the sticky bit (as 1777) or write access for its owner only, "
        "and root, this process's user or the agent's as its owner (",
        DescribeOpener(opener), ")"));
  }
  if (opener.uid == 0) return absl::OkStatus();
  // Shared only through a group of both (the agent's --trainer-group).
  if ((segment.mode & 060) != 060) {
    return absl::PermissionDeniedError(absl::StrCat(
        seg, " belongs to the agent's user and is not shared with its group: run the trainer as uid ", segment.uid,
        ", or start the agent with --trainer-group naming a group of this process (", DescribeOpener(opener), ")"));
  }
  if (std::find(opener.groups.begin(), opener.groups.end(), segment.gid) == opener.groups.end()) {
    return absl::PermissionDeniedError(absl::StrCat(
        seg, " is shared with group ", segment.gid,
        ", which this process is not in: expected the trainer's user to be a member of the agent's --trainer-group (",
        DescribeOpener(opener), ")"));
  }
  return absl::OkStatus();
}

absl::string_view SlotStateName(SlotState s) {
  switch (s) {
    case SlotState::kFree: return "FREE";
    case SlotState::kFilling: return "FILLING";
    case SlotState::kReady: return "READY";
    case SlotState::kPersisting: return "PERSISTING";
    case SlotState::kRestoring: return "RESTORING";
    case SlotState::kRestored: return "RESTORED";
    case SlotState::kPreparing: return "PREPARING";
    case SlotState::kKept: return "KEPT";
  }
  return "UNKNOWN";
}

struct StagingSegment::Header {
  char magic[8];
  uint32_t version;
  uint32_t slots;
  uint64_t slot_bytes;
  uint64_t data_offset;
  uint64_t total_bytes;
  // The kept step a slot acquisition gives up last, plus one (0: none): the
  // step a restart restores (PinKept). Written by
  // the agent; zero in a segment of an agent that does not pin.
  std::atomic<uint64_t> pinned;
  uint8_t reserved[16];
};

// Shared between processes: only address-free (lock-free) atomics.
struct StagingSegment::SlotHeader {
  std::atomic<uint32_t> state;
  std::atomic<uint32_t> keep_on_release;  // RESTORED -> KEPT on Release
  std::atomic<uint64_t> step;
  uint8_t reserved[48];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free);

StagingLayout PlanLayout(const std::vector<uint64_t>& lengths) {
  StagingLayout layout;
  uint64_t offset = 0;
  for (uint64_t len : lengths) {
    layout.offsets.push_back(offset);
    layout.lengths.push_back(len);
    offset += AlignUp(std::max<uint64_t>(len, 1), kAlign);
  }
  layout.slot_bytes = std::max<uint64_t>(offset, kAlign);
  return layout;
}

absl::StatusOr<StagingLayout> PlanLayoutChecked(const std::vector<uint64_t>& lengths) {
  uint64_t offset = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    // Each length is bounded before it is rounded up or added: neither wraps.
    if (lengths[i] > kMaxSlotBytes) {
      return absl::InvalidArgumentError(absl::StrCat("buffer ", i, " (of ", lengths.size(), ") is ", lengths[i],
                                                     " bytes, above the ", kMaxSlotBytes,
                                                     " bytes (1 PiB) a staging slot may hold"));
    }
    const uint64_t aligned = AlignUp(std::max<uint64_t>(lengths[i], 1), kAlign);
    if (aligned > kMaxSlotBytes - offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "buffer ", i, " (of ", lengths.size(), ") of ", lengths[i], " bytes (", aligned, " aligned) at offset ",
          offset, " ends past the ", kMaxSlotBytes, " bytes (1 PiB) a staging slot may hold"));
    }
    offset += aligned;
  }
  return PlanLayout(lengths);
}

MappedPages MappedStaging(absl::string_view name_prefix) {
  const std::string path = absl::StrCat(kShmDir, name_prefix);
  return ScanSmaps([&](absl::string_view first) {
    // "<range> <perms> <offset> <dev> <inode>   <path>[ (deleted)]"
    const size_t slash = first.find('/');
    return slash != absl::string_view::npos && absl::StartsWith(first.substr(slash), path) ? Scan::kTake
                                                                                            : Scan::kSkip;
  });
}

MappedPages StagingSegment::Mapped() const {
  const uintptr_t from = reinterpret_cast<uintptr_t>(base_);
  // Every part of it (the kernel may split a mapping in several), and no
  // mapping past it.
  return ScanSmaps([&](absl::string_view first) {
    uint64_t start = 0;
    if (!absl::SimpleHexAtoi(first.substr(0, first.find('-')), &start) || start < from) return Scan::kSkip;
    return start - from < mapped_ ? Scan::kTake : Scan::kStop;
  });
}

uint64_t SegmentBytes(uint32_t slots, uint64_t slot_bytes) { return kHeaderBlock + slots * slot_bytes; }

absl::StatusOr<uint32_t> SlotsWithinBudget(uint64_t slot_bytes, uint32_t wanted, uint64_t budget_bytes) {
  const uint64_t fit = slot_bytes == 0 ? wanted : budget_bytes / slot_bytes;
  if (fit == 0) {
    return absl::ResourceExhaustedError(absl::StrCat("one staging slot needs ", slot_bytes,
                                                     " bytes but the staging budget is ", budget_bytes,
                                                     " bytes"));
  }
  return static_cast<uint32_t>(std::min<uint64_t>({fit, wanted, kMaxSlots}));
}

StagingSegment::StagingSegment(std::string name, bool owner, uint8_t* base, uint64_t mapped, base::Clock* clock,
                               int fd)
    : name_(std::move(name)),
      owner_(owner),
      base_(base),
      mapped_(mapped),
      clock_(clock != nullptr ? clock : base::RealClock::Get()),
      fd_(fd) {}

StagingSegment::~StagingSegment() {
  if (fd_ >= 0) ::close(fd_);
  ::munmap(base_, mapped_);
  // Mapped segments stay valid for the trainer; the name only stops new opens.
  if (owner_) ::shm_unlink(name_.c_str());
}

absl::StatusOr<std::unique_ptr<StagingSegment>> StagingSegment::Create(const std::string& name, uint32_t slots,
                                                                      uint64_t slot_bytes,
                                                                      std::optional<uint32_t> group,
                                                                      base::Clock* clock, bool prepare_slots) {
  CKPTD_RETURN_IF_ERROR(ValidateName(name));
  if (slots == 0 || slots > kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat("staging slots must be 1..", kMaxSlots, ", not ", slots));
  }
  if (slot_bytes == 0 || slot_bytes % kAlign != 0 || slot_bytes > kMaxSlotBytes / slots) {
    return absl::InvalidArgumentError(absl::StrCat("staging slot size ", slot_bytes, " must be a positive multiple of ",
                                                   kAlign, ", and ", slots, " slots of it at most ", kMaxSlotBytes,
                                                   " bytes"));
  }
  const uint64_t total = SegmentBytes(slots, slot_bytes);
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return PosixError(absl::StrCat("shm_open ", name), errno);
  auto fail = [&](absl::string_view op, int err) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    return PosixError(absl::StrCat(op, " ", name), err);
  };
  // The umask must not widen it: owner-only, whatever the process's umask,
  // or owner and `group` (the trainers' group) read-write.
  if (group) {
    if (::fchown(fd, static_cast<uid_t>(-1), static_cast<gid_t>(*group)) != 0) {
      return fail(absl::StrCat("giving group ", *group, " (the trainers' group) the staging segment"), errno);
    }
    if (::fchmod(fd, 0660) != 0) return fail("fchmod", errno);
  } else if (::fchmod(fd, 0600) != 0) {
    return fail("fchmod", errno);
  }
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) return fail("ftruncate", errno);
  void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return fail("mmap", errno);
  // Reserve the memory now (or slot by slot in PrepareSlot): a full /dev/shm
  // must be an error here, not a SIGBUS in the trainer later.
  auto reserve = [&](uint64_t offset, uint64_t len) {
    const int err = Reserve(fd, static_cast<uint8_t*>(base), offset, len);
    if (err != 0) ::munmap(base, total);
    return err;
  };
  if (int err = reserve(0, kHeaderBlock); err != 0) return fail("reserving the header block of", err);
  if (prepare_slots) {
    if (int err = reserve(kHeaderBlock, total - kHeaderBlock); err != 0) {
      return fail(absl::StrCat("reserving ", total, " bytes of shared memory for"), err);
    }
  } else {
    // Huge pages for slots made in the background (PrepareSlot) where
    // /dev/shm is mounted with huge=advise (always and within_size give
    // them without asking): allocation, page-locking and a new trainer's
    // first touch then go 2 MiB at a time, not 4 KiB. Not for a segment
    // made here, within a registration, nor for its header: the kernel may
    // compact memory to find huge pages. Ignored by a kernel without them.
    (void)::madvise(static_cast<uint8_t*>(base) + kHeaderBlock, total - kHeaderBlock, MADV_HUGEPAGE);
  }
  auto* header = static_cast<Header*>(base);
  std::memcpy(header->magic, kMagic, sizeof(kMagic));
  header->version = kVersion;
  header->slots = slots;
  header->slot_bytes = slot_bytes;
  header->data_offset = kHeaderBlock;
  header->total_bytes = total;
  auto* bytes = static_cast<uint8_t*>(base);
  const SlotState initial = prepare_slots ? SlotState::kFree : SlotState::kPreparing;
  for (uint32_t i = 0; i < slots; ++i) {
    new (bytes + 64 + i * kSlotHeaderBytes) SlotHeader{{static_cast<uint32_t>(initial)}, {0}, {0}, {}};
  }
  // Kept open while slots remain to be reserved (PrepareSlot).
  int kept_fd = -1;
  if (prepare_slots) {
    ::close(fd);
  } else {
    kept_fd = fd;
  }
  return std::unique_ptr<StagingSegment>(new StagingSegment(name, /*owner=*/true, bytes, total, clock, kept_fd));
}

absl::StatusOr<std::unique_ptr<StagingSegment>> StagingSegment::Open(const std::string& name, base::Clock* clock,
                                                                     std::optional<uint32_t> agent_uid) {
  CKPTD_RETURN_IF_ERROR(ValidateName(name));
  const std::string path = absl::StrCat(kShmDir, name);
  CKPTD_ASSIGN_OR_RETURN(const SegmentOpener opener, ThisProcess(agent_uid));
  struct stat dir_st;
  if (::stat(kShmDir, &dir_st) != 0) return PosixError(absl::StrCat("stat ", kShmDir), errno);
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    // Say what the segment is and what was expected, when that explains it.
    struct stat st;
    if (err == EACCES && ::stat(path.c_str(), &st) == 0) {
      CKPTD_RETURN_IF_ERROR(CheckSegmentAccess(path, AccessOf(st), kShmDir, AccessOf(dir_st), opener));
    }
    return PosixError(absl::StrCat("shm_open ", name), err);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return PosixError(absl::StrCat("fstat ", name), err);
  }
  // What was opened is checked, not what the name means a moment later.
  if (absl::Status s = CheckSegmentAccess(path, AccessOf(st), kShmDir, AccessOf(dir_st), opener); !s.ok()) {
    ::close(fd);
    return s;
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kHeaderBlock) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat("staging segment ", name, " is ", size, " bytes: too short"));
  }
  // Not faulted in here: a large segment would hold the trainer up for
  // seconds; slots fault in when first used, or in the background (Prefault).
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) return PosixError(absl::StrCat("mmap ", name), err);
  std::unique_ptr<StagingSegment> seg(
      new StagingSegment(name, /*owner=*/false, static_cast<uint8_t*>(base), size, clock));
  const Header* h = static_cast<const Header*>(base);
  if (std::memcmp(h->magic, kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat(name, " is not a ckptd staging segment"));
  }
  if (h->version != kVersion) {
    return absl::UnimplementedError(absl::StrCat(name, ": staging version ", h->version, " is not supported"));
  }
  if (h->slots == 0 || h->slots > kMaxSlots || h->slot_bytes == 0 || h->slot_bytes % kAlign != 0 ||
      h->data_offset != kHeaderBlock || h->total_bytes != size ||
      h->slot_bytes > (size - kHeaderBlock) / h->slots) {
    return absl::DataLossError(absl::StrCat(name, ": staging header does not match a segment of ", size, " bytes"));
  }
  return seg;
}

void StagingSegment::PinKept(std::optional<uint64_t> step) {
  reinterpret_cast<Header*>(base_)->pinned.store(step ? *step + 1 : 0, std::memory_order_release);
}

std::optional<uint64_t> StagingSegment::pinned_step() const {
  const uint64_t pinned = reinterpret_cast<const Header*>(base_)->pinned.load(std::memory_order_acquire);
  return pinned == 0 ? std::nullopt : std::optional<uint64_t>(pinned - 1);
}

uint32_t StagingSegment::slots() const { return reinterpret_cast<const Header*>(base_)->slots; }
uint64_t StagingSegment::slot_bytes() const { return reinterpret_cast<const Header*>(base_)->slot_bytes; }

uint8_t* StagingSegment::slot_data(uint32_t slot) const {
  return base_ + kHeaderBlock + static_cast<uint64_t>(slot) * slot_bytes();
}

StagingSegment::SlotHeader* StagingSegment::slot_header(uint32_t slot) const {
  static_assert(sizeof(Header) == 64 && sizeof(SlotHeader) == kSlotHeaderBytes);
  // Where trainers built from older sources find it: the layout is shared.
  static_assert(offsetof(Header, pinned) == 40);
  return reinterpret_cast<SlotHeader*>(base_ + 64 + static_cast<uint64_t>(slot) * kSlotHeaderBytes);
}

SlotState StagingSegment::state(uint32_t slot) const {
  return static_cast<SlotState>(slot_header(slot)->state.load(std::memory_order_acquire));
}

uint64_t StagingSegment::step(uint32_t slot) const { return slot_header(slot)->step.load(std::memory_order_acquire); }

bool StagingSegment::Transition(uint32_t slot, SlotState from, SlotState to) {
  uint32_t expected = static_cast<uint32_t>(from);
  return slot_header(slot)->state.compare_exchange_strong(expected, static_cast<uint32_t>(to),
                                                          std::memory_order_acq_rel);
}

bool StagingSegment::AnyFree(bool or_kept) const {
  for (uint32_t i = 0; i < slots(); ++i) {
    const SlotState s = state(i);
    if (s == SlotState::kFree || (or_kept && s == SlotState::kKept)) return true;
  }
  return false;
}

absl::StatusOr<uint32_t> StagingSegment::Acquire(SlotState to, absl::Duration wait, absl::string_view what) {
  const absl::Time deadline = clock_->Now() + wait;
  absl::Duration backoff = absl::Microseconds(20);
  // Nobody else takes `mu`: the slots change in another process without
  // telling, so the wait looks at them again after each backoff (and, on a
  // fake clock, at every poll of the clock).
  absl::Mutex mu;
  absl::MutexLock l(&mu);
  while (true) {
    for (uint32_t i = 0; i < slots(); ++i) {
      if (Transition(i, SlotState::kFree, to)) return i;
    }
    // No slot is free: the kept copy of the oldest step is given up, the
    // pinned one (the newest committed step) last.
    while (true) {
      const uint64_t pinned = reinterpret_cast<const Header*>(base_)->pinned.load(std::memory_order_acquire);
      std::optional<uint32_t> oldest;
      std::optional<uint32_t> kept_pinned;
      for (uint32_t i = 0; i < slots(); ++i) {
        if (state(i) != SlotState::kKept) continue;
        if (pinned != 0 && step(i) == pinned - 1) {
          kept_pinned = i;
        } else if (!oldest || step(i) < step(*oldest)) {
          oldest = i;
        }
      }
      if (!oldest) oldest = kept_pinned;
      if (!oldest) break;
      if (Transition(*oldest, SlotState::kKept, to)) return *oldest;
    }
    const absl::Time now = clock_->Now();
    if (now >= deadline) {
      const uint32_t prepared = slots_prepared();
      return absl::ResourceExhaustedError(absl::StrCat(
          "no free staging slot in ", name_, " for ", what, " after ", absl::FormatDuration(wait), " (", slots(),
          " slots, ",
          prepared == slots() ? std::string("all in use")
                              : absl::StrCat(slots() - prepared, " of them still being allocated by the agent"),
          ")"));
    }
    auto any = [this] { return AnyFree(/*or_kept=*/true); };
    clock_->AwaitWithDeadline(&mu, absl::Condition(&any), std::min(deadline, now + backoff));
    backoff = std::min(backoff * 2, absl::Milliseconds(1));
  }
}

absl::StatusOr<uint32_t> StagingSegment::AcquireForFill(absl::Duration wait) {
  return Acquire(SlotState::kFilling, wait, "a snapshot");
}

absl::StatusOr<uint32_t> StagingSegment::AcquireForRestore(absl::Duration wait) {
  return Acquire(SlotState::kRestoring, wait, "a restore");
}

absl::Status StagingSegment::Publish(uint32_t slot, uint64_t step, bool keep_on_release) {
  if (slot >= slots()) return absl::InvalidArgumentError(absl::StrCat("staging slot ", slot, " does not exist"));
  // Only whoever holds a FILLING or RESTORING slot changes it: any other
  // slot is left as it is (a KEPT slot is known by its step).
  const SlotState from = state(slot);
  if (from != SlotState::kFilling && from != SlotState::kRestoring) {
    return absl::FailedPreconditionError(
        absl::StrCat("staging slot ", slot, " is ", SlotStateName(from), ", not FILLING or RESTORING"));
  }
  // The step is written before the state that makes it visible.
  slot_header(slot)->step.store(step, std::memory_order_relaxed);
  slot_header(slot)->keep_on_release.store(keep_on_release ? 1 : 0, std::memory_order_relaxed);
  if (Transition(slot, from, from == SlotState::kFilling ? SlotState::kReady : SlotState::kRestored)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat("staging slot ", slot, " is ", SlotStateName(state(slot)),
                                                    ", not FILLING or RESTORING"));
}

std::optional<uint32_t> StagingSegment::TakeReady() {
  while (true) {
    std::optional<uint32_t> best;
    for (uint32_t i = 0; i < slots(); ++i) {
      if (state(i) == SlotState::kReady && (!best || step(i) < step(*best))) best = i;
    }
    if (!best) return std::nullopt;
    if (Transition(*best, SlotState::kReady, SlotState::kPersisting)) return best;
    // Another taker won the race for that slot: look again.
  }
}

bool StagingSegment::TakeReadySlot(uint32_t slot, uint64_t step) {
  // The step is read before the state is taken: a slot republished in
  // between holds another step, and is left alone.
  return slot < slots() && state(slot) == SlotState::kReady && this->step(slot) == step &&
         Transition(slot, SlotState::kReady, SlotState::kPersisting);
}

absl::Status StagingSegment::Release(uint32_t slot) {
  if (slot >= slots()) return absl::InvalidArgumentError(absl::StrCat("staging slot ", slot, " does not exist"));
  if (Transition(slot, SlotState::kPersisting, SlotState::kFree) || ReleaseRestored(slot)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat("staging slot ", slot, " is ", SlotStateName(state(slot)),
                                                    ", not PERSISTING or RESTORED"));
}

bool StagingSegment::ReleaseRestored(uint32_t slot) {
  const bool keep = slot_header(slot)->keep_on_release.load(std::memory_order_relaxed) != 0;
  return Transition(slot, SlotState::kRestored, keep ? SlotState::kKept : SlotState::kFree);
}

void StagingSegment::Advise(uint32_t slot, int advice) const {
  // madvise wants a page-aligned start: slot data is 4096-aligned.
  if (::madvise(slot_data(slot), slot_bytes(), advice) != 0 && errno == EINVAL) {
    // Older kernels lack MADV_POPULATE_*: touch a byte per page instead.
    TouchPages(slot_data(slot), slot_bytes());
  }
}

absl::Status StagingSegment::PrepareSlot(uint32_t slot) {
  if (slot >= slots()) return absl::InvalidArgumentError(absl::StrCat("staging slot ", slot, " does not exist"));
  if (state(slot) != SlotState::kPreparing) return absl::OkStatus();
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(name_, ": only its creator prepares slots"));
  // Made here, in the background: the first touch of fresh memory (clearing
  // it, and on a virtual machine the host backing it) is the costly part,
  // and a trainer's snapshot must not pay it.
  if (int err = Reserve(fd_, base_, kHeaderBlock + static_cast<uint64_t>(slot) * slot_bytes(), slot_bytes());
      err != 0) {
    return PosixError(absl::StrCat("reserving ", slot_bytes(), " bytes of shared memory for staging slot ", slot,
                                   " of ", name_),
                      err);
  }
  if (!Transition(slot, SlotState::kPreparing, SlotState::kFree)) {
    return absl::InternalError(absl::StrCat(name_, ": staging slot ", slot, " left PREPARING while being prepared"));
  }
  return absl::OkStatus();
}

uint32_t StagingSegment::slots_prepared() const {
  uint32_t n = 0;
  for (uint32_t i = 0; i < slots(); ++i) n += state(i) != SlotState::kPreparing ? 1 : 0;
  return n;
}

void StagingSegment::Prefault(uint32_t slot) const {
  if (slot >= slots() || state(slot) == SlotState::kPreparing) return;
  // Read-faulting maps the shared pages without writing them: a snapshot
  // being filled meanwhile is not disturbed.
  Advise(slot, MADV_POPULATE_READ);
}

absl::Status StagingSegment::Keep(uint32_t slot) {
  if (slot >= slots()) return absl::InvalidArgumentError(absl::StrCat("staging slot ", slot, " does not exist"));
  if (Transition(slot, SlotState::kPersisting, SlotState::kKept)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("staging slot ", slot, " is ", SlotStateName(state(slot)),
                                                    ", not PERSISTING"));
}

bool StagingSegment::Unkeep(uint32_t slot, uint64_t step) {
  if (slot >= slots() || !TakeKept(slot, step)) return false;
  return Transition(slot, SlotState::kRestoring, SlotState::kFree);
}

bool StagingSegment::TakeKept(uint32_t slot, uint64_t step) {
  // Looked at first: a slot of another step is never taken, not even for a
  // moment in which the trainer would find no slot to fill.
  if (slot >= slots() || state(slot) != SlotState::kKept || this->step(slot) != step) return false;
  if (!Transition(slot, SlotState::kKept, SlotState::kRestoring)) return false;
  // Held now: nobody else changes its step.
  if (this->step(slot) == step) return true;
  Transition(slot, SlotState::kRestoring, SlotState::kKept);
  return false;
}

absl::Status StagingSegment::Abandon(uint32_t slot) {
  if (slot >= slots()) return absl::InvalidArgumentError(absl::StrCat("staging slot ", slot, " does not exist"));
  if (Transition(slot, SlotState::kFilling, SlotState::kFree)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("staging slot ", slot, " is ", SlotStateName(state(slot)),
                                                    ", not FILLING"));
}

int StagingSegment::ReclaimAfterTrainerExit() {
  int freed = 0;
  for (uint32_t i = 0; i < slots(); ++i) {
    if (Transition(i, SlotState::kFilling, SlotState::kFree) || ReleaseRestored(i)) ++freed;
  }
  return freed;
}

const std::string& AgentSegmentPrefix() {
  static const std::string prefix = [] {
    std::random_device rd;
    return absl::StrFormat("/ckptd-%d-%08x", ::getpid(), rd());
  }();
  return prefix;
}

absl::StatusOr<std::vector<std::string>> ReclaimStaleSegments(const std::string& shm_dir) {
  DIR* dir = ::opendir(shm_dir.c_str());
  if (dir == nullptr) return base::PosixError(absl::StrCat("opendir ", shm_dir), errno);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(dir)) names.emplace_back(e->d_name);
  ::closedir(dir);
  // "ckptd-<pid>-<tag>" of this process.
  const std::string own = AgentSegmentPrefix().substr(1);
  const std::string own_pid = absl::StrCat("ckptd-", ::getpid(), "-");
  std::vector<std::string> removed;
  for (const std::string& name : names) {
    // ckptd-<pid>-<n> or ckptd-<pid>-<tag>-<n>, exactly: other names (tests'
    // prefixes included) are not ours to judge.
    std::vector<absl::string_view> parts = absl::StrSplit(name, '-');
    int64_t pid = 0;
    uint64_t n = 0;
    if ((parts.size() != 3 && parts.size() != 4) || parts[0] != "ckptd" || !absl::SimpleAtoi(parts[1], &pid) ||
        !absl::SimpleAtoi(parts.back(), &n) || pid <= 0) {
      continue;
    }
    if (parts.size() == 4 && (parts[2].size() != 8 || !std::all_of(parts[2].begin(), parts[2].end(), [](char c) {
                                return absl::ascii_isxdigit(static_cast<unsigned char>(c));
                              }))) {
      continue;
    }
    if (absl::StartsWith(name, absl::StrCat(own, "-"))) continue;  // this agent's own
    struct stat st;
    const std::string path = absl::StrCat(shm_dir, "/", name);
    if (::stat(path.c_str(), &st) != 0 || st.st_uid != ::geteuid()) continue;
    // Our pid with another tag: a predecessor that had our pid in another
    // PID namespace. Otherwise EPERM means the process exists (as another
    // user): leave it.
    const bool predecessor = parts.size() == 4 && absl::StartsWith(name, own_pid);
    if (!predecessor && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)) continue;
    if (::shm_unlink(absl::StrCat("/", name).c_str()) == 0) removed.push_back(name);
  }
  return removed;
}

}  // namespace ckptd::staging
