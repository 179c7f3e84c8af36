// AgentCore: registration and the trainer lifecycle (take-over, exit,
// parked segments, the memory budget).
#include "agent/agent_core.h"

#include <algorithm>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/agent_core_internal.h"
#include "base/format.h"
#include "base/limits.h"
#include "base/status_macros.h"
#include "base/thread.h"
#include "format/tensor_size.h"
#include "storage/layout.h"
#include "storage/replica.h"
#include "storage/shard_index.h"

namespace ckptd::agent {

using base::ByteUnits;
using base::FormatBytes;
using internal::ForgetTakenBack;
using internal::TrainerState;

namespace {

// What a parked segment must match to be handed to a new registration: the
// job, rank, world size and every buffer's name, component, dtype, shape and
// sharding (not its device: a restarted trainer may get another GPU).
std::string LayoutKey(const TrainerRegistration& reg) {
  std::string key = absl::StrCat(reg.job.size(), ":", reg.job, "/", reg.rank, "/", reg.world_size);
  for (const ckptd::v1::Tensor& b : reg.buffers) {
    ckptd::v1::Tensor meta = b;
    meta.clear_device();
    const std::string bytes = meta.SerializeAsString();
    absl::StrAppend(&key, "/", bytes.size(), ":", bytes);
  }
  return key;
}

// ", steps 40, 60 in memory" (empty when none).
template <typename Kept>
std::string KeptText(const std::vector<Kept>& kept) {
  std::vector<uint64_t> steps;
  for (const Kept& k : kept) steps.push_back(k.step);
  std::sort(steps.begin(), steps.end());
  if (steps.empty()) return "";
  return absl::StrCat(steps.size() == 1 ? ", step " : ", steps ", absl::StrJoin(steps, ", "), " in memory");
}

// `kept` joins `into`: each slot once (what `into` says of a slot stands),
// then only what its slot still holds.
template <typename Kept>
void MergeKept(const staging::StagingSegment& segment, std::vector<Kept> kept, std::vector<Kept>* into) {
  for (Kept& k : kept) {
    const bool known = std::any_of(into->begin(), into->end(), [&](const Kept& i) { return i.slot == k.slot; });
    if (!known) into->push_back(std::move(k));
  }
  ForgetTakenBack(segment, into);
}

// The registration's fields checked, and the length of each buffer.
// `coordinated`: the agent has a coordinator (else it commits only jobs whose
// ranks all register with it).
absl::StatusOr<std::vector<uint64_t>> CheckRegistration(const TrainerRegistration& reg, bool coordinated) {
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(reg.job));
  // A world the coordinator would refuse (and a single-rank agent would
  // never commit) is refused here, at registration.
  if (reg.world_size == 0 || reg.world_size > base::kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("register: world_size ", reg.world_size, " is outside 1..", base::kMaxWorldSize));
  }
  if (reg.rank >= reg.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("register: rank ", reg.rank, " is not inside world size ",
                                                   reg.world_size, " (rank must be 0..", reg.world_size - 1, ")"));
  }
  if (reg.local_world_size > reg.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("register: local world size ", reg.local_world_size,
                                                   " is larger than world size ", reg.world_size));
  }
  if (!coordinated && reg.local_world_size != 0 && reg.local_world_size < reg.world_size) {
    // Its ranks on other nodes write to other agents: none of them sees a
    // whole step, and nothing would ever commit.
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", reg.job, " has ", reg.world_size, " ranks, ", reg.local_world_size,
        " of them on this node: this agent runs without a coordinator and commits only jobs whose ranks all run on "
        "its node; run ckptd-coordinator and start the agent of every node with --coordinator HOST:PORT"));
  }
  if (reg.buffers.empty()) return absl::InvalidArgumentError("no buffers registered");
  std::vector<uint64_t> lengths;
  absl::flat_hash_set<std::string> names;
  for (const ckptd::v1::Tensor& b : reg.buffers) {
    CKPTD_RETURN_IF_ERROR(storage::ValidateTensorMeta(b, "register"));
    if (b.has_replica()) CKPTD_RETURN_IF_ERROR(storage::ValidateReplicaRequest(b, reg.world_size, "register"));
    if (!names.insert(b.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("buffer '", absl::CHexEscape(b.name()), "' is registered twice"));
    }
    CKPTD_ASSIGN_OR_RETURN(uint64_t length, format::TensorByteLength(b));
    lengths.push_back(length);
  }
  return lengths;
}

}  // namespace

namespace internal {

absl::string_view TrainerStateName(TrainerState state) {
  switch (state) {
    case TrainerState::kRegistering: return "registering";
    case TrainerState::kRegistered: return "registered";
    case TrainerState::kExiting: return "exiting";
    case TrainerState::kTakenOver: return "taken over";
    case TrainerState::kRetired: return "retired";
  }
  return "unknown";
}

bool TrainerMoveAllowed(TrainerState from, TrainerState to) {
  switch (from) {
    case TrainerState::kRegistering: return to == TrainerState::kRegistered || to == TrainerState::kRetired;
    case TrainerState::kRegistered: return to == TrainerState::kExiting;
    case TrainerState::kExiting: return to == TrainerState::kTakenOver || to == TrainerState::kRetired;
    case TrainerState::kTakenOver: return to == TrainerState::kExiting || to == TrainerState::kRetired;
    case TrainerState::kRetired: return false;
  }
  return false;
}

}  // namespace internal

absl::Status AgentCore::MoveLocked(const std::shared_ptr<Trainer>& t, TrainerState to,
                                   std::shared_ptr<Trainer> successor) {
  const TrainerState from = t->state;
  if (!internal::TrainerMoveAllowed(from, to)) {
    const absl::Status refused = absl::InternalError(absl::StrCat(
        "trainer ", t->id, " of job ", t->reg.job, " rank ", t->reg.rank, " cannot go from ",
        internal::TrainerStateName(from), " to ", internal::TrainerStateName(to), "; it stays ",
        internal::TrainerStateName(from)));
    logger_->Error(refused.message());
    return refused;
  }
  switch (to) {
    case TrainerState::kRegistered:
      trainers_[t->id] = t;
      break;
    case TrainerState::kExiting:
      if (from == TrainerState::kRegistered) {
        trainers_.erase(t->id);
        exiting_.push_back(t);
      }
      t->successor.reset();  // from kTakenOver: its successor was refused
      break;
    case TrainerState::kTakenOver:
      t->successor = std::move(successor);
      break;
    case TrainerState::kRetired:
      std::erase(exiting_, t);
      break;
    case TrainerState::kRegistering:
      break;  // never allowed
  }
  t->state = to;
  return absl::OkStatus();
}

absl::StatusOr<TrainerHandle> AgentCore::Register(const TrainerRegistration& reg) {
  CKPTD_ASSIGN_OR_RETURN(const std::vector<uint64_t> lengths, CheckRegistration(reg, options_.coordinator != nullptr));
  auto t = std::make_shared<Trainer>();
  t->reg = reg;
  t->key = LayoutKey(reg);
  CKPTD_ASSIGN_OR_RETURN(const uint32_t slots, PlanStaging(t.get(), lengths));
  const uint64_t need = staging::SegmentBytes(slots, t->layout.slot_bytes);
  // Declared before the locks: what it releases goes outside them.
  Claim claim;
  {
    absl::MutexLock l(&mu_);
    CKPTD_RETURN_IF_ERROR(CheckLoneWorldLocked(reg));
    // Refused before any memory is claimed (and checked again when listed).
    CKPTD_RETURN_IF_ERROR(CheckRegistrationCapLocked(reg));
    t->id = next_id_++;
    ClaimStagingLocked(t, slots, need, &claim);
  }
  ReleaseClaimed(reg, &claim);
  if (!claim.refused.ok()) return claim.refused;
  ShedPartnersCopiesFor(reg);
  claim.reused = claim.reuse.has_value();
  CKPTD_RETURN_IF_ERROR(AttachSegment(t.get(), &claim, slots, need));
  TrainerHandle handle;
  handle.trainer_id = t->id;
  handle.segment = t->segment->name();
  handle.slots = slots;
  handle.slot_bytes = t->layout.slot_bytes;
  handle.offsets = t->layout.offsets;
  handle.coordinated = options_.coordinator != nullptr;
  if (options_.before_enlisting) options_.before_enlisting(reg);
  absl::MutexLock l(&mu_);
  CKPTD_RETURN_IF_ERROR(EnlistLocked(t, &claim));
  return handle;
}

absl::StatusOr<uint32_t> AgentCore::PlanStaging(Trainer* t, const std::vector<uint64_t>& lengths) {
  // The lengths are the trainer's: unchecked, their sum could wrap to a
  // small slot that the offsets run past.
  absl::StatusOr<staging::StagingLayout> layout = staging::PlanLayoutChecked(lengths);
  if (!layout.ok()) return absl::InvalidArgumentError(absl::StrCat("register: ", layout.status().message()));
  t->layout = *std::move(layout);
  const uint64_t budget =
      options_.staging_budget_bytes != 0 ? options_.staging_budget_bytes : options_.slots * t->layout.slot_bytes;
  return staging::SlotsWithinBudget(t->layout.slot_bytes, options_.slots, budget);
}

void AgentCore::ClaimStagingLocked(const std::shared_ptr<Trainer>& t, uint32_t slots, uint64_t need, Claim* claim) {
  const TrainerRegistration& reg = t->reg;
  EvictIdleLocked(&claim->evicted);
  // The same process registering the same rank again: it dropped its
  // registration (a call of it timed out, say). That one is retired here,
  // and its segment taken over below, rather than a second one allocated
  // (which the memory budget might refuse) while the first stays.
  claim->retired = RetireSameProcessLocked(reg, 0);
  // At most one parked segment per job and rank: its successor's, or of no use.
  for (auto it = parked_.begin(); it != parked_.end(); ++it) {
    if (it->job != reg.job || it->rank != reg.rank) continue;
    if (it->key == t->key && it->segment->slots() == slots && it->layout.slot_bytes == t->layout.slot_bytes) {
      claim->reuse = std::move(*it);
    } else {
      claim->evicted.push_back(std::move(*it));
    }
    parked_.erase(it);
    break;
  }
  if (claim->reuse) return;
  // A predecessor still writing its last snapshots: its segment is taken
  // over now (the restart must not wait for that write, nor allocate the
  // memory a second time); its persister takes only its own slots.
  for (const std::shared_ptr<Trainer>& e : exiting_) {
    if (e->reg.job == reg.job && e->reg.rank == reg.rank && e->state == TrainerState::kExiting &&
        e->key == t->key && e->segment->slots() == slots && e->layout.slot_bytes == t->layout.slot_bytes) {
      claim->adopt = e;
      break;
    }
  }
  if (claim->adopt != nullptr) {
    if (MoveLocked(claim->adopt, TrainerState::kTakenOver, t).ok()) return;
    claim->adopt = nullptr;
  }
  ReserveBudgetLocked(*t, slots, need, claim);
}

void AgentCore::ReserveBudgetLocked(const Trainer& t, uint32_t slots, uint64_t need, Claim* claim) {
  const TrainerRegistration& reg = t.reg;
  const uint64_t limit = options_.memory_budget_bytes;
  // What evicting a parked segment frees: its bytes, unless another user
  // still holds it (a predecessor writing into it, a copy under way).
  auto freeable = [](const Parked& p) { return p.segment.use_count() == 1 ? p.segment->total_bytes() : 0; };
  uint64_t held = staging_bytes_->load();
  for (const Parked& p : claim->evicted) held -= freeable(p);  // freed below
  uint64_t parked_bytes = 0;
  for (const Parked& p : parked_) parked_bytes += freeable(p);
  if (limit != 0 && held - parked_bytes + need > limit) {
    claim->refused = absl::ResourceExhaustedError(absl::StrCat(
        "job ", reg.job, " rank ", reg.rank, ": staging of ", slots, " slots of ", t.layout.slot_bytes, " bytes needs ",
        need, " bytes (", FormatBytes(need, ByteUnits::kGiB), ") but the agent's memory budget is ", limit, " bytes (",
        FormatBytes(limit, ByteUnits::kGiB), "), ", held - parked_bytes,
        " of them held by registered trainers: raise "
        "ckptd-agent --memory-budget, or lower --slots or --staging-budget"));
    return;
  }
  // Least recently parked first, until the new segment fits.
  for (auto it = parked_.begin(); limit != 0 && held + need > limit && it != parked_.end();) {
    const uint64_t frees = freeable(*it);
    if (frees == 0) {
      ++it;
      continue;
    }
    held -= frees;
    claim->evicted.push_back(std::move(*it));
    it = parked_.erase(it);
  }
  staging_bytes_->fetch_add(need);  // reserved
}

void AgentCore::ReleaseClaimed(const TrainerRegistration& reg, Claim* claim) {
  for (const Parked& p : claim->evicted) {
    logger_->Info(absl::StrCat("memory tier: the staging of job ", p.job, " rank ", p.rank, " (",
                               FormatBytes(p.segment->total_bytes(), ByteUnits::kGiB), KeptText(p.kept),
                               ") left by an exited trainer is released"));
  }
  claim->evicted.clear();
  for (std::shared_ptr<Trainer>& r : claim->retired) {
    logger_->Info(absl::StrCat("job ", reg.job, " rank ", reg.rank, ": its process (pid ", reg.pid,
                               ") registers again; its registration ", r->id, " is retired"));
    FinishExitInBackground(std::move(r), /*died=*/false);
  }
  claim->retired.clear();
}

void AgentCore::ShedPartnersCopiesFor(const TrainerRegistration& reg) {
  if (options_.replicas == nullptr || options_.memory_budget_bytes == 0) return;
  // Copies held for partners make room: this node's trainers come first.
  const uint64_t staging = StagingBytes();
  const uint64_t held = options_.replicas->bytes();
  if (staging + held > options_.memory_budget_bytes) {
    const uint64_t freed = options_.replicas->Shed(staging + held - options_.memory_budget_bytes);
    logger_->Info(absl::StrCat("memory tier: ", FormatBytes(freed, ByteUnits::kGiB),
                               " of partners' copies dropped for the staging of job ", reg.job, " rank ", reg.rank));
  }
}

absl::Status AgentCore::AttachSegment(Trainer* t, Claim* claim, uint32_t slots, uint64_t need) {
  const TrainerRegistration& reg = t->reg;
  if (claim->reuse) {
    t->segment = std::move(claim->reuse->segment);
    std::string kept;
    {
      absl::MutexLock l(&t->mu);
      t->kept = std::move(claim->reuse->kept);
      ForgetTakenBack(*t->segment, &t->kept);
      kept = KeptText(t->kept);
      t->predecessor = std::move(claim->reuse->draining);
    }
    logger_->Info(absl::StrCat("job ", reg.job, " rank ", reg.rank, " registered again: its staging (",
                               FormatBytes(t->segment->total_bytes(), ByteUnits::kGiB), ") is taken over", kept));
    return absl::OkStatus();
  }
  if (claim->adopt) {
    t->segment = claim->adopt->segment;
    std::vector<KeptStep> kept;
    {
      absl::MutexLock l(&claim->adopt->mu);
      kept = claim->adopt->kept;
    }
    std::string text;
    {
      // Merged: a predecessor that finished meanwhile handed its kept steps
      // to this trainer already.
      absl::MutexLock l(&t->mu);
      MergeKept(*t->segment, std::move(kept), &t->kept);
      text = KeptText(t->kept);
      t->predecessor = claim->adopt;
    }
    logger_->Info(absl::StrCat("job ", reg.job, " rank ", reg.rank, " registered again: its staging (",
                               FormatBytes(t->segment->total_bytes(), ByteUnits::kGiB), ") is taken over", text,
                               ", while the previous trainer's last snapshots are still written"));
    return absl::OkStatus();
  }
  const std::string prefix = options_.segment_prefix.empty() ? staging::AgentSegmentPrefix() : options_.segment_prefix;
  absl::StatusOr<std::unique_ptr<staging::StagingSegment>> segment =
      staging::StagingSegment::Create(absl::StrCat(prefix, "-", t->id), slots, t->layout.slot_bytes,
                                      options_.trainer_group, clock_, need <= options_.prepare_inline_bytes);
  if (!segment.ok()) {
    staging_bytes_->fetch_sub(need);
    return segment.status();
  }
  // Its bytes are given back when the last user of the segment lets go.
  t->segment = std::shared_ptr<staging::StagingSegment>(segment->release(),
                                                         [bytes = staging_bytes_, need](staging::StagingSegment* s) {
                                                           delete s;
                                                           bytes->fetch_sub(need);
                                                         });
  return absl::OkStatus();
}

absl::Status AgentCore::EnlistLocked(const std::shared_ptr<Trainer>& t, Claim* claim) {
  const TrainerRegistration& reg = t->reg;
  // Checked again: other registrations may have been listed since the
  // checks in Register.
  absl::Status refused = CheckRegistrationCapLocked(reg);
  if (refused.ok()) refused = CheckLoneWorldLocked(reg);
  if (refused.ok()) {
    // The persister's two threads: the encoder first, for the persister to take.
    absl::StatusOr<std::unique_ptr<base::ThreadPool>> encoder =
        base::ThreadPool::Create(1, options_.background_priority, PersistGuard());
    absl::StatusOr<std::thread> persister = absl::UnknownError("no encoder");
    if (!encoder.ok()) {
      persister = encoder.status();
    } else {
      t->memory_encoder = *std::move(encoder);
      t->preparing.store(t->segment->slots_prepared() < t->segment->slots());
      Trainer* raw = t.get();
      persister = base::StartThread("the persister", [this, raw] { PersistLoop(raw); });
    }
    if (persister.ok()) {
      t->persister = *std::move(persister);
    } else {
      t->memory_encoder.reset();
      refused = absl::ResourceExhaustedError(absl::StrCat("register: job ", reg.job, " rank ", reg.rank,
                                                          " is refused, no thread for its persister: ",
                                                          persister.status().message()));
      logger_->Error(refused.message());
    }
  }
  if (!refused.ok()) {
    // Its segment goes with `t` (or back where it was found); nothing of it
    // was shown to anyone.
    UndoClaimLocked(t, claim);
    (void)MoveLocked(t, TrainerState::kRetired);  // listed nowhere: nothing to undo
    return refused;
  }
  if (options_.coordinator == nullptr) {
    absl::MutexLock ll(&lone_mu_);
    LoneJob& job = lone_[reg.job];
    if (job.world_size != reg.world_size) {
      // Its first registration, or the job came back with another world size.
      job = LoneJob();
      job.world_size = reg.world_size;
    }
    // From now on the shards of this rank count only if this trainer (or its
    // process) wrote them: a predecessor's that are not committed are void.
    job.newest[reg.rank] = {t->id, reg.pid};
  }
  // A registration of the same process that came in meanwhile (its caller
  // gave up on it and asked again) is retired as well.
  for (std::shared_ptr<Trainer>& r : RetireSameProcessLocked(reg, 0)) FinishExitInBackground(std::move(r), false);
  return MoveLocked(t, TrainerState::kRegistered);
}

absl::Status AgentCore::CheckRegistrationCapLocked(const TrainerRegistration& reg) {
  const uint32_t cap = options_.max_registrations;
  if (cap == 0 || trainers_.size() < cap) return absl::OkStatus();
  // The same process registering its rank again retires its registration.
  size_t others = 0;
  for (const auto& [id, o] : trainers_) {
    if (reg.pid <= 0 || o->reg.pid != reg.pid || o->reg.job != reg.job || o->reg.rank != reg.rank) ++others;
  }
  if (others < cap) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "register: job ", reg.job, " rank ", reg.rank, " is refused: ", others,
      " trainers are registered with this agent, its limit (ckptd-agent --max-registrations ", cap,
      "); each holds a thread and staging memory until its process exits"));
}

void AgentCore::UndoClaimLocked(const std::shared_ptr<Trainer>& t, Claim* claim) {
  // What was taken over is left as it was found: a draining predecessor's
  // for the next one to adopt, a parked segment parked.
  if (claim->adopt) {
    (void)MoveLocked(claim->adopt, TrainerState::kExiting);  // logged if refused
    absl::MutexLock tl(&t->mu);
    t->predecessor.reset();
  } else if (claim->reused) {
    std::vector<KeptStep> kept;
    std::shared_ptr<Trainer> before;
    {
      absl::MutexLock tl(&t->mu);
      kept = t->kept;
      before = t->predecessor;
    }
    ParkLocked(t, std::move(kept), std::move(before), &claim->evicted);
  }
}

absl::Status AgentCore::CheckLoneWorldLocked(const TrainerRegistration& reg) {
  if (options_.coordinator != nullptr) return absl::OkStatus();
  for (const auto& [id, other] : trainers_) {
    if (other->reg.job == reg.job && other->reg.world_size != reg.world_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", reg.job, " rank ", reg.rank, " registers a world of ", reg.world_size, " ranks, but rank ",
          other->reg.rank, " is registered here with a world of ", other->reg.world_size));
    }
  }
  return absl::OkStatus();
}

void AgentCore::WaitForPredecessor(Trainer* t) {
  std::shared_ptr<Trainer> before;
  {
    absl::MutexLock l(&t->mu);
    before = t->predecessor;
  }
  // Each trainer before it in turn, until all are drained (one that exited
  // while it waited for its own predecessor left that one's link), or `t`
  // stops too (its own exit drains only its own snapshots). Never two locks
  // at once: BeginExit takes `t`'s, then the predecessors'.
  while (before != nullptr) {
    {
      absl::MutexLock l(&t->mu);
      if (t->stopping) return;  // its exit reads the predecessors' drains
    }
    absl::MutexLock l(&before->mu);
    const auto drained = +[](Trainer* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b->mu) { return b->drained; };
    clock_->AwaitWithTimeout(&before->mu, absl::Condition(drained, before.get()), absl::Milliseconds(100));
    if (before->drained) before = before->predecessor;
  }
  absl::MutexLock l(&t->mu);
  if (!t->stopping) t->predecessor.reset();
}

std::vector<std::shared_ptr<AgentCore::Trainer>> AgentCore::Predecessors(Trainer* t) {
  std::vector<std::shared_ptr<Trainer>> chain;
  std::shared_ptr<Trainer> next;
  {
    absl::MutexLock l(&t->mu);
    next = t->predecessor;
  }
  while (next != nullptr) {
    chain.push_back(next);
    // On past a drained one too: it stopped waiting for its own when it
    // exited, and may have drained before them.
    absl::MutexLock l(&next->mu);
    next = next->predecessor;
  }
  return chain;
}

absl::Status AgentCore::TrainerExited(uint64_t trainer_id, bool died) {
  CKPTD_ASSIGN_OR_RETURN(std::shared_ptr<Trainer> t, BeginExit(trainer_id));
  FinishExit(std::move(t), died);
  return absl::OkStatus();
}

void AgentCore::TrainerDied(uint64_t trainer_id) { ExitInBackground(trainer_id, /*died=*/true); }

void AgentCore::ExitInBackground(uint64_t trainer_id, bool died) {
  absl::StatusOr<std::shared_ptr<Trainer>> t = BeginExit(trainer_id);
  if (!t.ok()) return;  // it said goodbye first
  FinishExitInBackground(*std::move(t), died);
}

std::vector<std::shared_ptr<AgentCore::Trainer>> AgentCore::RetireSameProcessLocked(const TrainerRegistration& reg,
                                                                                    uint64_t except) {
  std::vector<std::shared_ptr<Trainer>> retired;
  if (reg.pid <= 0) return retired;
  std::vector<uint64_t> same;
  for (const auto& [id, o] : trainers_) {
    if (id != except && o->reg.pid == reg.pid && o->reg.job == reg.job && o->reg.rank == reg.rank) same.push_back(id);
  }
  for (uint64_t id : same) {
    absl::StatusOr<std::shared_ptr<Trainer>> t = BeginExitLocked(id);
    if (t.ok()) retired.push_back(*std::move(t));
  }
  return retired;
}

void AgentCore::FinishExitInBackground(std::shared_ptr<Trainer> t, bool died) {
  // The rest waits for the trainer's last snapshots to be written: on a
  // thread of its own, so that the ranks of a node that die together are
  // drained together, and the next death is noticed at once. Queued first:
  // the thread takes the oldest exit queued, and one that cannot be started
  // leaves it to the next exit thread (or the destructor).
  absl::MutexLock l(&exit_mu_);
  std::erase_if(exit_threads_, [](ExitThread& e) {
    if (!e.done->load()) return false;
    e.thread.join();
    return true;
  });
  const std::string what = absl::StrCat("the exit of trainer ", t->id, " (job ", t->reg.job, " rank ", t->reg.rank, ")");
  pending_exits_.push_back({std::move(t), died});
  auto done = std::make_shared<std::atomic<bool>>(false);
  absl::StatusOr<std::thread> thread = base::StartThread(what, [this, done] {
    base::SetCallingThreadName("ckptd-exit");
    FinishPendingExits();
    done->store(true);
  });
  if (!thread.ok()) {
    logger_->Error(absl::StrCat(thread.status().message(), "; it waits for the next exit's thread, ",
                                pending_exits_.size(), " exit(s) waiting"));
    return;
  }
  exit_threads_.push_back({*std::move(thread), done});
}

void AgentCore::FinishPendingExits() {
  while (true) {
    PendingExit next;
    {
      absl::MutexLock l(&exit_mu_);
      if (pending_exits_.empty()) return;
      next = std::move(pending_exits_.front());
      pending_exits_.pop_front();
    }
    FinishExit(std::move(next.trainer), next.died);
  }
}

absl::StatusOr<std::shared_ptr<AgentCore::Trainer>> AgentCore::BeginExit(uint64_t trainer_id) {
  absl::MutexLock l(&mu_);
  return BeginExitLocked(trainer_id);
}

absl::StatusOr<std::shared_ptr<AgentCore::Trainer>> AgentCore::BeginExitLocked(uint64_t trainer_id) {
  auto it = trainers_.find(trainer_id);
  if (it == trainers_.end()) return absl::NotFoundError(absl::StrCat("no trainer ", trainer_id, " is registered"));
  std::shared_ptr<Trainer> t = it->second;
  CKPTD_RETURN_IF_ERROR(MoveLocked(t, TrainerState::kExiting));
  staging::StagingSegment& seg = *t->segment;
  seg.ReclaimAfterTrainerExit();
  // Taken over while those drained: the snapshots they left are theirs.
  std::vector<std::pair<uint32_t, uint64_t>> theirs;
  for (const std::shared_ptr<Trainer>& p : Predecessors(t.get())) {
    absl::MutexLock pl(&p->mu);
    if (p->exit_drain) theirs.insert(theirs.end(), p->exit_drain->begin(), p->exit_drain->end());
  }
  {
    absl::MutexLock tl(&t->mu);
    // What it published and nobody took yet is still persisted; nothing a
    // successor publishes in the same segment is (its own persister's).
    std::vector<std::pair<uint32_t, uint64_t>> drain;
    for (uint32_t i = 0; i < seg.slots(); ++i) {
      const std::pair<uint32_t, uint64_t> d(i, seg.step(i));
      if (seg.state(i) == staging::SlotState::kReady && std::find(theirs.begin(), theirs.end(), d) == theirs.end()) {
        drain.push_back(d);
      }
    }
    std::sort(drain.begin(), drain.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    t->exit_drain = std::move(drain);
    t->stopping = true;  // the persister drains those first
    t->wake = true;
  }
  return t;
}

void AgentCore::FinishExit(std::shared_ptr<Trainer> t, bool died) {
  if (died && options_.observer != nullptr) options_.observer->OnTrainerDied(t->reg.job);
  t->persister.join();
  if (died && options_.coordinator != nullptr) {
    ckptd::v1::ReportFailureRequest f;
    f.set_job(t->reg.job);
    f.set_rank(t->reg.rank);
    f.set_kind(ckptd::v1::TRAINER_DIED);
    f.set_detail(absl::StrCat("trainer process ", t->reg.pid, " exited without saying goodbye"));
    options_.coordinator->Failure(f);
  }
  std::vector<KeptStep> kept;
  std::shared_ptr<Trainer> before;
  {
    absl::MutexLock l(&t->mu);
    kept = std::move(t->kept);
    before = t->predecessor;
  }
  std::vector<Parked> evicted;  // unmapped and unlinked outside the lock
  {
    // One section from leaving exiting_ to parked (or handed on): a
    // registration meanwhile finds the segment either way.
    absl::MutexLock l(&mu_);
    const bool taken_over = t->state == TrainerState::kTakenOver;
    (void)MoveLocked(t, TrainerState::kRetired);  // logged if refused
    // A segment parked while this trainer still wrote into it waits on the
    // ones before it now, if any.
    for (Parked& p : parked_) {
      if (p.draining == t) p.draining = before;
    }
    if (!taken_over) {
      ParkLocked(t, std::move(kept), std::move(before), &evicted);
    } else {
      HandKeptOnLocked(*t, std::move(kept));
    }
  }
}

void AgentCore::HandKeptOnLocked(const Trainer& t, std::vector<KeptStep> kept) {
  // The segment lives on with whoever holds it now (the trainer that took it
  // over, or one after it; registered, exiting or parked): so do the steps
  // written into it since.
  for (const auto& [id, o] : trainers_) {
    if (o->segment != t.segment) continue;
    absl::MutexLock ol(&o->mu);
    MergeKept(*o->segment, std::move(kept), &o->kept);
    return;
  }
  for (const std::shared_ptr<Trainer>& o : exiting_) {
    if (o->segment != t.segment || o->state == TrainerState::kTakenOver) continue;
    absl::MutexLock ol(&o->mu);
    MergeKept(*o->segment, std::move(kept), &o->kept);
    return;
  }
  for (Parked& p : parked_) {
    if (p.segment != t.segment) continue;
    MergeKept(*p.segment, std::move(kept), &p.kept);
    return;
  }
  // Still registering (not in trainers_ yet): it merges what it copies.
  if (std::shared_ptr<Trainer> heir = t.successor.lock()) {
    absl::MutexLock hl(&heir->mu);
    MergeKept(*t.segment, std::move(kept), &heir->kept);
  }
}

void AgentCore::ParkLocked(const std::shared_ptr<Trainer>& t, std::vector<KeptStep> kept,
                           std::shared_ptr<Trainer> before, std::vector<Parked>* evicted) {
  EvictIdleLocked(evicted);
  // A call of the trainer still under way (nothing else can find it now)
  // may use its segment: then it is not handed on. (An unparked segment is
  // unmapped when the caller lets `t` go, outside the lock.)
  if (!options_.keep_in_memory || t.use_count() != 1) return;
  for (auto it = parked_.begin(); it != parked_.end(); ++it) {
    if (it->job == t->reg.job && it->rank == t->reg.rank) {
      evicted->push_back(std::move(*it));
      parked_.erase(it);
      break;
    }
  }
  Parked p;
  p.key = t->key;
  p.job = t->reg.job;
  p.rank = t->reg.rank;
  p.layout = t->layout;
  p.segment = t->segment;
  p.kept = std::move(kept);
  p.draining = std::move(before);
  ForgetTakenBack(*p.segment, &p.kept);
  p.since = clock_->Now();
  parked_.push_back(std::move(p));
}

void AgentCore::EvictIdleLocked(std::vector<Parked>* out) {
  const absl::Time now = clock_->Now();
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (now - it->since < options_.park_for) {
      ++it;
      continue;
    }
    out->push_back(std::move(*it));
    it = parked_.erase(it);
  }
}

void AgentCore::EvictIdle() {
  std::vector<Parked> evicted;  // unmapped and unlinked outside the lock
  absl::MutexLock l(&mu_);
  EvictIdleLocked(&evicted);
}

}  // namespace ckptd::agent
