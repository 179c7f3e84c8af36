#include "agent/agent_core.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/limits.h"
#include "base/status_macros.h"
#include "format/checksum.h"
#include "format/tensor_size.h"
#include "rpc/schedule.h"
#include "storage/discarding_file_system.h"
#include "storage/layout.h"
#include "storage/replica.h"
#include "storage/reshard.h"
#include "storage/reshard_plan.h"
#include "storage/shard_index.h"
#include "storage/shard_reader.h"

namespace ckptd::agent {

using storage::StepState;

namespace {
// Without a coordinator: steps of a job kept waiting for the rest of their
// ranks' shards.
constexpr size_t kMaxPendingSteps = 64;

// What a commit records of rank `rank`'s shard file, as written.
ckptd::v1::ShardRef ShardRefOf(uint32_t rank, const storage::ShardWriteResult& written) {
  ckptd::v1::ShardRef ref;
  ref.set_rank(rank);
  ref.set_file(storage::ShardFileName(rank));
  ref.set_file_length(written.file_length);
  ref.set_index_xxh3(written.index_xxh3);
  ref.set_raw_bytes(written.raw_bytes);
  ref.set_stored_bytes(written.stored_bytes);
  return ref;
}

// The CUDA device a trainer's buffers live on (-1: none), as the
// coordinator is told.
int32_t GpuOf(const TrainerRegistration& reg) {
  int32_t gpu = -1;
  for (const ckptd::v1::Tensor& b : reg.buffers) {
    if (b.device().kind() == ckptd::v1::Device::CUDA) gpu = static_cast<int32_t>(b.device().index());
  }
  return gpu;
}

// A restore-plan request of the trainer `trainer_id` registered as `reg`.
ckptd::v1::RestorePlanRequest PlanRequestOf(const TrainerRegistration& reg, uint64_t trainer_id) {
  ckptd::v1::RestorePlanRequest req;
  req.set_job(reg.job);
  req.set_rank(reg.rank);
  req.set_world_size(reg.world_size);
  req.set_pid(reg.pid);
  req.set_gpu(GpuOf(reg));
  req.set_trainer_id(trainer_id);
  return req;
}

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

// Whether `index` (this rank's shard of a step) holds another slice of a
// registered sharded buffer than the one registered, or a share of a
// replicated one: the step is then read resharded (LoadResharded).
bool Resliced(const TrainerRegistration& reg, const ckptd::v1::ShardIndex& index) {
  // A share of a replicated buffer: the rest is in the other members' shards.
  for (const ckptd::v1::Tensor& saved : index.tensors()) {
    if (saved.has_replica() && !storage::IsWholeShare(saved)) return true;
  }
  for (const ckptd::v1::Tensor& b : reg.buffers) {
    if (b.global_shape_size() == 0) continue;
    for (const ckptd::v1::Tensor& saved : index.tensors()) {
      if (saved.name() != b.name()) continue;
      if (saved.global_shape_size() == 0) return false;  // not a resharding: LoadFrom names the mismatch
      if (!std::equal(saved.global_shape().begin(), saved.global_shape().end(), b.global_shape().begin(),
                      b.global_shape().end())) {
        return false;  // another tensor: LoadFrom names the mismatch
      }
      if (!std::equal(saved.offsets().begin(), saved.offsets().end(), b.offsets().begin(), b.offsets().end()) ||
          !std::equal(saved.shape().begin(), saved.shape().end(), b.shape().begin(), b.shape().end())) {
        return true;
      }
    }
  }
  return false;
}

std::string Gib(uint64_t bytes) { return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1 << 30)); }

// ", steps 40, 60 in memory" (empty when none).
template <typename Kept>
std::string KeptText(const std::vector<Kept>& kept) {
  std::vector<uint64_t> steps;
  for (const Kept& k : kept) steps.push_back(k.step);
  std::sort(steps.begin(), steps.end());
  if (steps.empty()) return "";
  return absl::StrCat(steps.size() == 1 ? ", step " : ", steps ", absl::StrJoin(steps, ", "), " in memory");
}

// LoadFromPeers' id of the copy this agent holds for a partner (a node id
// never holds a '/').
constexpr char kHeldCopySource[] = "/held";

// Kept steps whose slot the trainer took back for a snapshot are forgotten.
template <typename Kept>
void ForgetTakenBack(const staging::StagingSegment& segment, std::vector<Kept>* kept) {
  std::erase_if(*kept, [&](const Kept& k) {
    const staging::SlotState s = segment.state(k.slot);
    return segment.step(k.slot) != k.step || (s != staging::SlotState::kKept && s != staging::SlotState::kRestoring &&
                                              s != staging::SlotState::kRestored);
  });
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

// The kept steps above `step` go: their slots are freed.
template <typename Kept>
void FreeKeptAbove(staging::StagingSegment* segment, std::vector<Kept>* kept, uint64_t step) {
  std::erase_if(*kept, [&](const Kept& k) {
    if (k.step <= step) return false;
    segment->Unkeep(k.slot, k.step);
    return true;
  });
}
}  // namespace

storage::ShardWriteOptions MemoryShardOptions(const storage::ShardWriteOptions& write) {
  storage::ShardWriteOptions o = write;
  o.encode.compress = false;
  o.adaptive.enabled = false;
  // Several encoders hand blocks to the file in the order they finish, and
  // the index records where each landed.
  o.threads = 1;
  return o;
}

ckptd::v1::RestoreSource RestoreSourceProto(RestoreSource source) {
  switch (source) {
    case RestoreSource::kNone: return ckptd::v1::RESTORE_SOURCE_UNSPECIFIED;
    case RestoreSource::kMemory: return ckptd::v1::AGENT_MEMORY;
    case RestoreSource::kPeer: return ckptd::v1::PEER_MEMORY;
    case RestoreSource::kLocal: return ckptd::v1::NODE_LOCAL;
    case RestoreSource::kRoot: return ckptd::v1::STORAGE_ROOT;
  }
  return ckptd::v1::RESTORE_SOURCE_UNSPECIFIED;
}

struct AgentCore::Trainer {
  uint64_t id = 0;
  TrainerRegistration reg;
  std::string key;  // LayoutKey(reg)
  staging::StagingLayout layout;
  std::shared_ptr<staging::StagingSegment> segment;
  std::thread persister;
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
  // Under AgentCore::mu_, while it drains after its exit: a successor
  // registered with the same layout took over its segment (the steps it
  // keeps from now on go to that one).
  bool adopted = false;
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

AgentCore::AgentCore(storage::FileSystem* fs, AgentOptions options)
    : fs_(fs),
      options_(std::move(options)),
      store_(fs, options_.storage_root),
      pool_(options_.io_threads, options_.background_priority, PersistGuard()) {
  {
    // Trainer ids start at a random point (see first_trainer_id).
    std::random_device rd;
    absl::MutexLock l(&mu_);
    next_id_ = options_.first_trainer_id != 0 ? options_.first_trainer_id : (uint64_t{rd()} << 20) + 1;
  }
  write_ = options_.write;
  write_.stop = [this] { return absl::ToUnixNanos(clock_->Now()) >= stop_writes_at_.load(); };
  if (options_.background_priority != base::ThreadPriority::kNormal) {
    own_restore_pool_ = std::make_unique<base::ThreadPool>(options_.io_threads);
    restore_pool_ = own_restore_pool_.get();
    const std::string line = absl::StrCat(
        "persists run at ", pool_.priority().ToString(), ", restores at normal priority",
        options_.starvation_limit > absl::ZeroDuration()
            ? absl::StrCat("; persist work starved of CPU for ", absl::FormatDuration(options_.starvation_limit),
                           " goes to normal-priority threads")
            : "; persist work may starve without bound (--starvation-limit 0s)");
    if (pool_.priority().why_not.ok()) {
      logger_->Info(line);
    } else {
      logger_->Warning(line);
    }
  }
  if (options_.local_cache.empty()) return;
  LocalTierOptions local;
  local.dir = options_.local_cache;
  local.fs = options_.local_fs != nullptr ? options_.local_fs : fs;
  local.keep = options_.local_cache_keep;
  local.write = write_;
  local.pool = &pool_;
  local.read_pool = restore_pool_;
  local.logger = logger_;
  local_ = std::make_unique<LocalTier>(std::move(local), &store_);
}

base::StarvationGuard AgentCore::PersistGuard() {
  base::StarvationGuard guard;
  // Real time, whatever clock_ is: the scheduler counts real CPU time.
  guard.after = options_.starvation_limit;
  guard.on_boost = [this](const std::string& why) {
    const int64_t n = starved_persists_.fetch_add(1, std::memory_order_relaxed) + 1;
    const std::string line =
        absl::StrCat("persist work at ", base::ThreadPriorityName(options_.background_priority), " priority starved (",
                     why, "): normal-priority threads take it until it is done",
                     n == 1 ? "; every CPU is kept busy: see \"The agent's CPU use\" in docs/operations.md" : "", " (",
                     n, n == 1 ? " time)" : " times)");
    if (n == 1) {
      logger_->Warning(line);
    } else {
      logger_->Info(line);
    }
  };
  return guard;
}

AgentCore::~AgentCore() {
  {
    // Trainers that died: their last snapshots are written (as before).
    absl::MutexLock l(&exit_mu_);
    for (ExitThread& e : exit_threads_) e.thread.join();
    exit_threads_.clear();
  }
  std::map<uint64_t, std::shared_ptr<Trainer>> trainers;
  {
    absl::MutexLock l(&mu_);
    trainers.swap(trainers_);
  }
  for (auto& [id, t] : trainers) {
    {
      absl::MutexLock l(&t->mu);
      t->stopping = true;
    }
    t->persister.join();
  }
}

void AgentCore::BeginShutdown(absl::Time deadline) {
  stop_writes_at_.store(absl::ToUnixNanos(deadline));
  shutting_down_.store(true);
  // What is left to persist has a deadline: it runs at normal priority now,
  // not after the pool starved for --starvation-limit.
  pool_.Boost();
  std::vector<std::shared_ptr<Trainer>> trainers;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, t] : trainers_) trainers.push_back(t);
  }
  for (const std::shared_ptr<Trainer>& t : trainers) {
    absl::MutexLock l(&t->mu);
    t->wake = true;
  }
  // Restores waiting for the other ranks (RestoreLocal) see shutting_down_
  // when lone_mu_ is released.
  absl::MutexLock l(&lone_mu_);
}

std::shared_ptr<AgentCore::Trainer> AgentCore::Find(uint64_t trainer_id) {
  absl::MutexLock l(&mu_);
  auto it = trainers_.find(trainer_id);
  return it == trainers_.end() ? nullptr : it->second;
}

absl::StatusOr<TrainerHandle> AgentCore::Register(const TrainerRegistration& reg) {
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
  if (options_.coordinator == nullptr && reg.local_world_size != 0 && reg.local_world_size < reg.world_size) {
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
  auto t = std::make_shared<Trainer>();
  t->reg = reg;
  t->key = LayoutKey(reg);
  // The lengths are the trainer's: unchecked, their sum could wrap to a
  // small slot that the offsets run past.
  absl::StatusOr<staging::StagingLayout> layout = staging::PlanLayoutChecked(lengths);
  if (!layout.ok()) return absl::InvalidArgumentError(absl::StrCat("register: ", layout.status().message()));
  t->layout = *std::move(layout);
  const uint64_t budget =
      options_.staging_budget_bytes != 0 ? options_.staging_budget_bytes : options_.slots * t->layout.slot_bytes;
  CKPTD_ASSIGN_OR_RETURN(uint32_t slots, staging::SlotsWithinBudget(t->layout.slot_bytes, options_.slots, budget));
  const uint64_t need = staging::SegmentBytes(slots, t->layout.slot_bytes);
  std::optional<Parked> reuse;
  std::shared_ptr<Trainer> adopt;
  std::vector<Parked> evicted;
  std::vector<std::shared_ptr<Trainer>> retired;
  absl::Status refused;
  {
    absl::MutexLock l(&mu_);
    CKPTD_RETURN_IF_ERROR(CheckLoneWorldLocked(reg));
    t->id = next_id_++;
    EvictIdleLocked(&evicted);
    // The same process registering the same rank again: it dropped its
    // registration (a call of it timed out, say). That one is retired here,
    // and its segment taken over below, rather than a second one allocated
    // (which the memory budget might refuse) while the first stays.
    retired = RetireSameProcessLocked(reg, 0);
    // At most one parked segment per job and rank: its successor's, or of no use.
    for (auto it = parked_.begin(); it != parked_.end(); ++it) {
      if (it->job != reg.job || it->rank != reg.rank) continue;
      if (it->key == t->key && it->segment->slots() == slots && it->layout.slot_bytes == t->layout.slot_bytes) {
        reuse = std::move(*it);
      } else {
        evicted.push_back(std::move(*it));
      }
      parked_.erase(it);
      break;
    }
    if (!reuse) {
      // A predecessor still writing its last snapshots: its segment is taken
      // over now (the restart must not wait for that write, nor allocate
      // the memory a second time); its persister takes only its own slots.
      for (const std::shared_ptr<Trainer>& e : exiting_) {
        if (e->reg.job == reg.job && e->reg.rank == reg.rank && !e->adopted && e->key == t->key &&
            e->segment->slots() == slots && e->layout.slot_bytes == t->layout.slot_bytes) {
          adopt = e;
          adopt->adopted = true;
          adopt->successor = t;
          break;
        }
      }
    }
    if (!reuse && !adopt) {
      const uint64_t limit = options_.memory_budget_bytes;
      // What evicting a parked segment frees: its bytes, unless another user
      // still holds it (a predecessor writing into it, a copy under way).
      auto freeable = [](const Parked& p) { return p.segment.use_count() == 1 ? p.segment->total_bytes() : 0; };
      uint64_t held = staging_bytes_->load();
      for (const Parked& p : evicted) held -= freeable(p);  // freed below
      uint64_t parked_bytes = 0;
      for (const Parked& p : parked_) parked_bytes += freeable(p);
      if (limit != 0 && held - parked_bytes + need > limit) {
        refused = absl::ResourceExhaustedError(absl::StrCat(
            "job ", reg.job, " rank ", reg.rank, ": staging of ", slots, " slots of ", t->layout.slot_bytes,
            " bytes needs ", need, " bytes (", Gib(need), ") but the agent's memory budget is ", limit, " bytes (",
            Gib(limit), "), ", held - parked_bytes, " of them held by registered trainers: raise "
            "ckptd-agent --memory-budget, or lower --slots or --staging-budget"));
      } else {
        // Least recently parked first, until the new segment fits.
        for (auto it = parked_.begin(); limit != 0 && held + need > limit && it != parked_.end();) {
          const uint64_t frees = freeable(*it);
          if (frees == 0) {
            ++it;
            continue;
          }
          held -= frees;
          evicted.push_back(std::move(*it));
          it = parked_.erase(it);
        }
        staging_bytes_->fetch_add(need);  // reserved
      }
    }
  }
  for (const Parked& p : evicted) {
    logger_->Info(absl::StrCat("memory tier: the staging of job ", p.job, " rank ", p.rank, " (",
                               Gib(p.segment->total_bytes()), KeptText(p.kept),
                               ") left by an exited trainer is released"));
  }
  evicted.clear();
  for (std::shared_ptr<Trainer>& r : retired) {
    logger_->Info(absl::StrCat("job ", reg.job, " rank ", reg.rank, ": its process (pid ", reg.pid,
                               ") registers again; its registration ", r->id, " is retired"));
    FinishExitInBackground(std::move(r), /*died=*/false);
  }
  retired.clear();
  if (!refused.ok()) return refused;
  if (options_.replicas != nullptr && options_.memory_budget_bytes != 0) {
    // Copies held for partners make room: this node's trainers come first.
    const uint64_t staging = Memory().bytes;
    const uint64_t held = options_.replicas->bytes();
    if (staging + held > options_.memory_budget_bytes) {
      const uint64_t freed = options_.replicas->Shed(staging + held - options_.memory_budget_bytes);
      logger_->Info(absl::StrCat("memory tier: ", Gib(freed), " of partners' copies dropped for the staging of job ",
                                 reg.job, " rank ", reg.rank));
    }
  }
  const bool reused = reuse.has_value();
  if (reuse) {
    t->segment = std::move(reuse->segment);
    std::string kept;
    {
      absl::MutexLock l(&t->mu);
      t->kept = std::move(reuse->kept);
      ForgetTakenBack(*t->segment, &t->kept);
      kept = KeptText(t->kept);
      t->predecessor = std::move(reuse->draining);
    }
    logger_->Info(absl::StrCat("job ", reg.job, " rank ", reg.rank, " registered again: its staging (",
                               Gib(t->segment->total_bytes()), ") is taken over",
                               kept));
  } else if (adopt) {
    t->segment = adopt->segment;
    std::vector<KeptStep> kept;
    {
      absl::MutexLock l(&adopt->mu);
      kept = adopt->kept;
    }
    std::string text;
    {
      // Merged: a predecessor that finished meanwhile handed its kept steps
      // to this trainer already.
      absl::MutexLock l(&t->mu);
      MergeKept(*t->segment, std::move(kept), &t->kept);
      text = KeptText(t->kept);
      t->predecessor = adopt;
    }
    logger_->Info(absl::StrCat("job ", reg.job, " rank ", reg.rank, " registered again: its staging (",
                               Gib(t->segment->total_bytes()), ") is taken over", text,
                               ", while the previous trainer's last snapshots are still written"));
  } else {
    const std::string prefix =
        options_.segment_prefix.empty() ? staging::AgentSegmentPrefix() : options_.segment_prefix;
    absl::StatusOr<std::unique_ptr<staging::StagingSegment>> segment =
        staging::StagingSegment::Create(absl::StrCat(prefix, "-", t->id), slots, t->layout.slot_bytes,
                                        options_.trainer_group, clock_, need <= options_.prepare_inline_bytes);
    if (!segment.ok()) {
      staging_bytes_->fetch_sub(need);
      return segment.status();
    }
    // Its bytes are given back when the last user of the segment lets go.
    t->segment = std::shared_ptr<staging::StagingSegment>(
        segment->release(), [bytes = staging_bytes_, need](staging::StagingSegment* s) {
          delete s;
          bytes->fetch_sub(need);
        });
  }
  TrainerHandle handle;
  handle.trainer_id = t->id;
  handle.segment = t->segment->name();
  handle.slots = slots;
  handle.slot_bytes = t->layout.slot_bytes;
  handle.offsets = t->layout.offsets;
  handle.coordinated = options_.coordinator != nullptr;
  Trainer* raw = t.get();
  absl::MutexLock l(&mu_);
  if (options_.coordinator == nullptr) {
    // Checked again (another registration of the job may have come first
    // since the check above).
    if (absl::Status world = CheckLoneWorldLocked(reg); !world.ok()) {
      {
        // What was taken over is left as it was found: a draining
        // predecessor's for the next one to adopt, a parked segment parked.
        if (adopt) {
          adopt->adopted = false;
          adopt->successor.reset();
          absl::MutexLock tl(&t->mu);
          t->predecessor.reset();
        } else if (reused) {
          std::vector<KeptStep> kept;
          std::shared_ptr<Trainer> before;
          {
            absl::MutexLock tl(&t->mu);
            kept = t->kept;
            before = t->predecessor;
          }
          ParkLocked(t, std::move(kept), std::move(before), &evicted);
        }
        return world;
      }
    }
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
  t->preparing.store(t->segment->slots_prepared() < t->segment->slots());
  t->persister = std::thread([this, raw] { PersistLoop(raw); });
  // A registration of the same process that came in meanwhile (its caller
  // gave up on it and asked again) is retired as well.
  for (std::shared_ptr<Trainer>& r : RetireSameProcessLocked(reg, 0)) FinishExitInBackground(std::move(r), false);
  trainers_[handle.trainer_id] = std::move(t);
  return handle;
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

absl::Status AgentCore::SnapshotPublished(uint64_t trainer_id, uint32_t slot, uint64_t step, double stall_seconds) {
  std::shared_ptr<Trainer> t = Find(trainer_id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no trainer ", trainer_id, " is registered"));
  if (slot >= t->segment->slots()) {
    return absl::InvalidArgumentError(absl::StrCat("staging slot ", slot, " does not exist"));
  }
  absl::MutexLock l(&t->mu);
  t->wake = true;
  if (std::isfinite(stall_seconds) && stall_seconds >= 0) t->stall_by_slot[slot] = stall_seconds;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<ckptd::v1::Schedule>> AgentCore::SyncSchedule(
    const ckptd::v1::SyncScheduleRequest& request) {
  std::shared_ptr<Trainer> t = Find(request.trainer_id());
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no trainer ", request.trainer_id(), " is registered"));
  {
    absl::MutexLock l(&t->mu);
    t->step = request.step();
    // A nonsense time from a confused client is ignored, not passed on.
    auto keep = [](double v, double& into) {
      if (std::isfinite(v) && v > 0) into = v;
    };
    keep(request.step_seconds(), t->step_seconds);
    keep(request.step_seconds_idle(), t->step_seconds_idle);
    keep(request.step_seconds_persisting(), t->step_seconds_persisting);
    for (uint64_t m : request.missed_targets()) {
      if (t->missed_targets.size() < 64) t->missed_targets.push_back(m);
    }
  }
  if (options_.coordinator == nullptr) return std::optional<ckptd::v1::Schedule>();
  return options_.coordinator->ScheduleFor(t->reg.job);
}

std::optional<TrainerInfo> AgentCore::FindTrainer(const std::string& job, uint32_t rank) {
  for (TrainerInfo& t : Trainers()) {
    if (t.job == job && t.rank == rank) return std::move(t);
  }
  return std::nullopt;
}

std::vector<TrainerInfo> AgentCore::Trainers() {
  std::map<std::pair<std::string, uint32_t>, std::shared_ptr<Trainer>> newest;
  {
    absl::MutexLock l(&mu_);
    // Ids grow: the last match is the newest registration.
    for (const auto& [id, t] : trainers_) newest[{t->reg.job, t->reg.rank}] = t;
  }
  std::vector<TrainerInfo> out;
  for (const auto& [key, t] : newest) {
    TrainerInfo info;
    info.pid = t->reg.pid;
    info.job = key.first;
    info.rank = key.second;
    absl::MutexLock l(&t->mu);
    info.step = t->step;
    out.push_back(std::move(info));
  }
  return out;
}

absl::StatusOr<std::string> AgentCore::CorruptKeptStep(const std::string& job, uint32_t rank, uint64_t step) {
  const std::string who = absl::StrCat("rank ", rank, " of job ", job);
  std::shared_ptr<Trainer> t;
  {
    absl::MutexLock l(&mu_);
    // Ids grow: the last match is the newest registration.
    for (const auto& [id, tr] : trainers_) {
      if (tr->reg.job == job && tr->reg.rank == rank) t = tr;
    }
  }
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no trainer of ", who, " is registered with this agent"));
  if (!options_.keep_in_memory) {
    return absl::FailedPreconditionError(
        absl::StrCat("this agent runs without the memory tier (--no-memory-tier): ", who, " keeps no step in memory"));
  }
  staging::StagingSegment& seg = *t->segment;
  std::vector<KeptStep> kept;
  {
    absl::MutexLock l(&t->mu);
    kept = t->kept;
  }
  ForgetTakenBack(seg, &kept);
  std::optional<uint32_t> slot;
  for (const KeptStep& k : kept) {
    if (k.step == step && seg.state(k.slot) == staging::SlotState::kKept) slot = k.slot;
  }
  // A newer snapshot on its way to storage, or persisted and kept, may still
  // commit: a restart would restore it, not `step`.
  for (uint32_t i = 0; i < seg.slots(); ++i) {
    const staging::SlotState s = seg.state(i);
    const bool newer =
        (s == staging::SlotState::kReady || s == staging::SlotState::kPersisting || s == staging::SlotState::kKept) &&
        seg.step(i) > step;
    if (newer) {
      return absl::UnavailableError(absl::StrCat(who, " holds step ", seg.step(i), ", newer than step ", step,
                                                 ", in staging slot ", i, " (", staging::SlotStateName(s), ")"));
    }
  }
  // The trainer gives up a kept copy for its next snapshot when no slot is
  // free, before the agent may have heard that the step committed: that
  // snapshot is newer and may commit in its turn.
  for (uint32_t i = 0; !slot && i < seg.slots(); ++i) {
    if (seg.state(i) == staging::SlotState::kFilling) {
      return absl::UnavailableError(absl::StrCat(who, " keeps no copy of step ", step,
                                                 " in memory while it takes a newer snapshot in staging slot ", i,
                                                 " (FILLING)"));
    }
  }
  size_t buffer = 0;
  while (buffer < t->layout.lengths.size() && t->layout.lengths[buffer] == 0) ++buffer;
  if (buffer == t->layout.lengths.size()) {
    return absl::FailedPreconditionError(absl::StrCat(who, " registered no bytes to damage"));
  }
  // Held while it changes: the trainer cannot take the slot for a snapshot.
  if (!slot || !seg.TakeKept(*slot, step)) {
    std::vector<uint64_t> steps;
    for (const KeptStep& k : kept) steps.push_back(k.step);
    std::sort(steps.begin(), steps.end());
    return absl::FailedPreconditionError(absl::StrCat(
        who, " keeps no copy of step ", step, " in memory (",
        steps.empty() ? std::string("it keeps no step")
                      : absl::StrCat("it keeps ", steps.size() == 1 ? "step " : "steps ", absl::StrJoin(steps, ", ")),
        ")"));
  }
  const uint64_t offset = t->layout.lengths[buffer] / 2;
  uint8_t* byte = seg.slot_data(*slot) + t->layout.offsets[buffer] + offset;
  *byte = static_cast<uint8_t>(*byte ^ 0xff);
  // Back to KEPT, holding the same step.
  absl::Status back = seg.Publish(*slot, step, /*keep_on_release=*/true);
  if (back.ok()) back = seg.Release(*slot);
  if (!back.ok()) {
    return absl::InternalError(
        absl::StrCat("staging slot ", *slot, " of ", who, " is not kept again after the damage: ", back.message()));
  }
  return absl::StrCat("flipped the byte at offset ", offset, " of buffer '",
                      absl::CHexEscape(t->reg.buffers[buffer].name()), "' in the kept copy of step ", step, " of ", who,
                      " (staging slot ", *slot, ")");
}

void AgentCore::FillHeartbeat(ckptd::v1::Heartbeat* hb) {
  EvictIdle();
  std::vector<std::shared_ptr<Trainer>> trainers;
  // Each rank once, by its newest registration (the highest id): an older
  // process of the rank whose exit is not known yet is not another process
  // of the rank to the coordinator (which would take it for a restart).
  std::set<std::pair<std::string, uint32_t>> newest;
  {
    absl::MutexLock l(&mu_);
    for (auto it = trainers_.rbegin(); it != trainers_.rend(); ++it) {
      const std::shared_ptr<Trainer>& t = it->second;
      if (newest.insert({t->reg.job, t->reg.rank}).second) trainers.push_back(t);
    }
  }
  // The steps this agent keeps in memory (its live trainers' and those
  // parked for their successors) are reported as copies it holds.
  auto add_kept = [&](const std::string& job, uint32_t rank, const std::vector<KeptStep>& kept) {
    for (const KeptStep& k : kept) {
      ckptd::v1::MemoryCopy* c = hb->add_memory();
      c->set_job(job);
      c->set_rank(rank);
      c->set_step(k.step);
      c->set_owner_node(options_.node_id);
      c->set_file_length(k.file_length);
      c->set_index_xxh3(k.index_xxh3);
    }
  };
  for (const auto& t : trainers) {
    ckptd::v1::RankInfo* r = hb->add_ranks();
    r->set_job(t->reg.job);
    r->set_rank(t->reg.rank);
    r->set_world_size(t->reg.world_size);
    r->set_pid(t->reg.pid);
    r->set_gpu(GpuOf(t->reg));
    ckptd::v1::RankProgress* p = hb->add_progress();
    absl::MutexLock l(&t->mu);
    p->set_job(t->reg.job);
    p->set_rank(t->reg.rank);
    p->set_step(t->step);
    p->set_step_seconds(t->step_seconds);
    p->set_step_seconds_idle(t->step_seconds_idle);
    p->set_step_seconds_persisting(t->step_seconds_persisting);
    p->set_stall_seconds(t->last_stall);
    p->set_persist_seconds(t->last_persist);
    p->set_snapshots_skipped(t->status.skipped);
    for (uint64_t m : t->missed_targets) p->add_missed_targets(m);
    t->missed_targets.clear();
    // Only what is still there: the trainer takes kept slots back for its
    // snapshots without telling (a copy listed but gone would be planned
    // as a restore source, and fail over).
    ForgetTakenBack(*t->segment, &t->kept);
    add_kept(t->reg.job, t->reg.rank, t->kept);
  }
  // Parked segments' kept steps, and what this agent holds for partners.
  {
    absl::MutexLock l(&mu_);
    for (Parked& p : parked_) {
      ForgetTakenBack(*p.segment, &p.kept);
      add_kept(p.job, p.rank, p.kept);
    }
  }
  if (options_.replicas != nullptr) {
    for (ckptd::v1::MemoryCopy& c : options_.replicas->List()) *hb->add_memory() = std::move(c);
  }
  if (options_.replicator != nullptr) hb->set_replicate_seconds(options_.replicator->Stats().last_round_seconds);
}

namespace {

// One source per tensor of `index`, laid out in `base` as `layout` says
// (buffer i of the registration at layout.offsets[i], as the shard's
// tensors are in registration order).
absl::StatusOr<std::vector<storage::TensorSource>> SourcesIn(const ckptd::v1::ShardIndex& index,
                                                             const staging::StagingLayout& layout,
                                                             const uint8_t* base) {
  if (static_cast<size_t>(index.tensors_size()) != layout.offsets.size()) {
    return absl::FailedPreconditionError(absl::StrCat("the copy's index has ", index.tensors_size(),
                                                      " tensors, its memory ", layout.offsets.size(), " buffers"));
  }
  std::vector<storage::TensorSource> sources(layout.offsets.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    const ckptd::v1::Tensor& t = index.tensors(static_cast<int>(i));
    // Checked before any of it is used (a peer's copy's index only parsed).
    if (absl::Status v = storage::ValidateTensorMeta(t, "the copy's index"); !v.ok()) {
      return absl::DataLossError(v.message());
    }
    if (t.has_replica() && t.replica().block_bytes() == 0) {
      return absl::DataLossError(absl::StrCat("tensor '", absl::CHexEscape(t.name()),
                                              "' of the copy's index is a share without checksums"));
    }
    if (format::TensorByteLength(t).value_or(~uint64_t{0}) != t.raw_length()) {
      return absl::DataLossError(absl::StrCat("tensor '", absl::CHexEscape(t.name()),
                                              "' of the copy's index does not match its shape"));
    }
    // A share of a replicated buffer: its rows of the whole buffer in memory.
    const uint64_t whole = storage::WholeByteLength(t);
    if (whole != layout.lengths[i]) {
      return absl::FailedPreconditionError(absl::StrCat("tensor '", absl::CHexEscape(t.name()),
                                                        "' of the copy's index is ", whole, " bytes, its buffer ",
                                                        layout.lengths[i]));
    }
    sources[i].meta = t;
    sources[i].data = base + layout.offsets[i] + (t.has_replica() ? storage::ShareByteOffset(t) : 0);
    sources[i].length = t.raw_length();
  }
  return sources;
}

}  // namespace

absl::StatusOr<AgentCore::HeldCopy> AgentCore::FindHeldCopy(const ckptd::v1::PersistOrder& order) {
  auto same = [&](const KeptStep& k) {
    return k.step == order.step() && k.file_length == order.file_length() && k.index_xxh3 == order.index_xxh3() &&
           k.index != nullptr;
  };
  // From a segment keeping the step in `slot`.
  auto from_segment = [&](std::shared_ptr<staging::StagingSegment> segment, const staging::StagingLayout& layout,
                          const KeptStep& kept, std::string from) -> absl::StatusOr<HeldCopy> {
    HeldCopy c;
    c.from = std::move(from);
    CKPTD_ASSIGN_OR_RETURN(c.sources, SourcesIn(*kept.index, layout, segment->slot_data(kept.slot)));
    c.created_unix_nanos = kept.index->created_unix_nanos();
    c.still_held = [segment, slot = kept.slot, step = kept.step] {
      return segment->state(slot) == staging::SlotState::kKept && segment->step(slot) == step;
    };
    c.keep_alive = std::move(segment);
    return c;
  };
  std::vector<std::shared_ptr<Trainer>> trainers;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, t] : trainers_) {
      if (t->reg.job == order.job() && t->reg.rank == order.rank()) trainers.push_back(t);
    }
    for (const std::shared_ptr<Trainer>& t : exiting_) {
      if (t->reg.job == order.job() && t->reg.rank == order.rank()) trainers.push_back(t);
    }
    for (const Parked& p : parked_) {
      if (p.job != order.job() || p.rank != order.rank()) continue;
      for (const KeptStep& k : p.kept) {
        if (same(k)) return from_segment(p.segment, p.layout, k, "the memory its exited trainer left");
      }
    }
  }
  for (const std::shared_ptr<Trainer>& t : trainers) {
    std::optional<KeptStep> kept;
    {
      absl::MutexLock l(&t->mu);
      for (const KeptStep& k : t->kept) {
        if (same(k)) kept = k;
      }
    }
    if (kept) return from_segment(t->segment, t->layout, *kept, "its trainer's staging memory");
  }
  if (options_.replicas != nullptr) {
    ckptd::v1::ReplicaKey key;
    key.set_job(order.job());
    key.set_rank(order.rank());
    key.set_step(order.step());
    std::shared_ptr<const Replica> held = options_.replicas->Find(key);
    if (held != nullptr && held->header().file_length() == order.file_length() &&
        held->header().index_xxh3() == order.index_xxh3()) {
      auto index = std::make_shared<ckptd::v1::ShardIndex>();
      if (!index->ParseFromString(held->header().index())) {
        return absl::DataLossError("the copy held for node " + held->header().from_node() +
                                   " has a shard index that does not parse");
      }
      std::vector<uint64_t> lengths;
      for (const ckptd::v1::Tensor& t : index->tensors()) lengths.push_back(storage::WholeByteLength(t));
      // The lengths are the partner's: unchecked, their sum could wrap to
      // the copy's size while the offsets run past it.
      absl::StatusOr<staging::StagingLayout> layout = staging::PlanLayoutChecked(lengths);
      if (!layout.ok()) {
        return absl::DataLossError(absl::StrCat("the copy held for node ", held->header().from_node(),
                                                " has a shard index that lays out no staging slot: ",
                                                layout.status().message()));
      }
      if (layout->slot_bytes != held->size()) {
        return absl::DataLossError(absl::StrCat("the copy held for node ", held->header().from_node(), " holds ",
                                                held->size(), " bytes; its index lays out ", layout->slot_bytes));
      }
      HeldCopy c;
      c.from = absl::StrCat("the copy node ", held->header().from_node(), " sent");
      CKPTD_ASSIGN_OR_RETURN(c.sources, SourcesIn(*index, *layout, held->data()));
      c.created_unix_nanos = index->created_unix_nanos();
      c.still_held = [] { return true; };  // a held copy's bytes never change
      c.keep_alive = std::move(held);
      return c;
    }
  }
  return absl::NotFoundError("this node holds no copy of it in memory");
}

absl::StatusOr<ckptd::v1::ShardReport> AgentCore::EmergencyPersist(const ckptd::v1::PersistOrder& order) {
  const std::string what =
      absl::StrCat("emergency persist of job ", order.job(), " step ", order.step(), " rank ", order.rank());
  auto failed = [&](const absl::Status& s) { return absl::Status(s.code(), absl::StrCat(what, ": ", s.message())); };
  if (absl::Status s = storage::ValidateJobName(order.job()); !s.ok()) return failed(s);
  if (order.world_size() == 0 || order.rank() >= order.world_size()) {
    return failed(absl::InvalidArgumentError(
        absl::StrCat("rank ", order.rank(), " is not inside world size ", order.world_size())));
  }
  absl::StatusOr<HeldCopy> copy = FindHeldCopy(order);
  if (!copy.ok()) return failed(copy.status());
  // write_: stopped, like every persist, at the end of a shutdown's grace period.
  storage::ShardWriteOptions write = MemoryShardOptions(write_);
  write.created_unix_nanos = copy->created_unix_nanos;
  BeginWriting(order.job(), order.step());
  const absl::Time start = clock_->Now();
  absl::StatusOr<storage::ShardWriteResult> written = absl::UnknownError("not written");
  if (absl::Status prepared = store_.PrepareStep(order.job(), order.step()); !prepared.ok()) {
    written = prepared;
  } else {
    // One encoder, as MemoryShardOptions asks, at normal priority: the job
    // loses work if this step is not made durable.
    base::ThreadPool encoder(1);
    written =
        store_.WriteShard(order.job(), order.step(), order.rank(), order.world_size(), copy->sources, write, &encoder);
  }
  const double seconds = absl::ToDoubleSeconds(clock_->Now() - start);
  EndWriting(order.job(), order.step());
  // What a failed write leaves: its step directory, when nothing else is in
  // it and no persist of this agent writes it.
  auto clean_up = [&] {
    absl::MutexLock l(&writing_mu_);
    if (!writing_.contains({order.job(), order.step()})) (void)store_.RemoveEmptyStep(order.job(), order.step());
  };
  if (!written.ok()) {
    clean_up();
    return failed(written.status());
  }
  if (!copy->still_held() || written->file_length != order.file_length() || written->index_xxh3 != order.index_xxh3()) {
    // Not the shard that was reported: it must not be committed.
    (void)fs_->RemoveFile(written->path);
    clean_up();
    return failed(absl::DataLossError(
        absl::StrCat("the shard written from ", copy->from, " (", written->file_length, " bytes, index xxh3 ",
                     absl::Hex(written->index_xxh3, absl::kZeroPad16), ") is not the one reported (",
                     order.file_length(), " bytes, index xxh3 ", absl::Hex(order.index_xxh3(), absl::kZeroPad16),
                     "): the copy changed while it was written or is damaged; removed")));
  }
  ckptd::v1::ShardReport report;
  report.set_job(order.job());
  report.set_step(order.step());
  report.set_world_size(order.world_size());
  report.set_incarnation(order.incarnation());
  report.set_emergency(true);
  *report.mutable_shard() = ShardRefOf(order.rank(), *written);
  report.mutable_shard()->set_persist_seconds(seconds);
  if (options_.coordinator != nullptr) options_.coordinator->ShardDurable(report);
  logger_->Info(absl::StrCat(what, ": written from ", copy->from, absl::StrFormat(" in %.3f s (", seconds),
                             Gib(written->raw_bytes), ")"));
  return report;
}

void AgentCore::OnPersistOrders(const google::protobuf::RepeatedPtrField<ckptd::v1::PersistOrder>& orders) {
  if (options_.coordinator == nullptr) return;
  const absl::Time now = clock_->Now();
  for (const ckptd::v1::PersistOrder& order : orders) {
    const OrderKey key(order.job(), order.step(), order.rank(), order.incarnation());
    {
      absl::MutexLock l(&orders_mu_);
      auto [it, fresh] = orders_.try_emplace(key);
      if (!fresh && (!it->second || now < *it->second)) continue;  // done, under way, or failed just now
      it->second.reset();
      // Bounded (a job's oldest steps go first).
      while (orders_.size() > kMaxOrdersRemembered) orders_.erase(orders_.begin());
    }
    emergency_pool_.Schedule([this, order, key] {
      if (shutting_down_.load() && write_.stop()) {
        logger_->Warning(absl::StrCat("shutting down: emergency persist of job ", order.job(), " step ", order.step(),
                                      " rank ", order.rank(), " not started: the grace period ended"));
        return;
      }
      absl::StatusOr<ckptd::v1::ShardReport> done = EmergencyPersist(order);
      if (done.ok()) return;
      logger_->Warning(absl::StrCat(done.status().message(), "; tried again if still ordered in ",
                                    absl::FormatDuration(kEmergencyRetry)));
      absl::MutexLock l(&orders_mu_);
      if (auto it = orders_.find(key); it != orders_.end()) it->second = clock_->Now() + kEmergencyRetry;
    });
  }
}

absl::Status AgentCore::SnapshotSkipped(uint64_t trainer_id, uint64_t step, absl::string_view reason) {
  std::shared_ptr<Trainer> t = Find(trainer_id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no trainer ", trainer_id, " is registered"));
  absl::MutexLock l(&t->mu);
  ++t->status.skipped;
  t->status.last_skipped_step = step;
  // Cut on a UTF-8 character boundary: the reason travels in proto strings.
  size_t n = std::min(reason.size(), kMaxSkipReasonBytes);
  while (n < reason.size() && n > 0 && (static_cast<uint8_t>(reason[n]) & 0xC0) == 0x80) --n;
  t->status.last_skip_reason = std::string(reason.substr(0, n));
  return absl::OkStatus();
}

void AgentCore::PrepareSlots(Trainer* t) {
  staging::StagingSegment& seg = *t->segment;
  if (seg.slots_prepared() == seg.slots()) return;
  const TrainerRegistration& reg = t->reg;
  const absl::Time start = clock_->Now();
  for (uint32_t i = 0; i < seg.slots(); ++i) {
    {
      absl::MutexLock l(&t->mu);
      if (t->stopping) return;
    }
    if (options_.before_preparing_slot) options_.before_preparing_slot(i);
    absl::Status s = seg.PrepareSlot(i);
    // The trainer before prepared it meanwhile (it died while it did).
    if (!s.ok() && seg.state(i) != staging::SlotState::kPreparing) continue;
    if (!s.ok()) {
      logger_->Warning(absl::StrCat("job ", reg.job, " rank ", reg.rank, ": staging slot ", i, " of ", seg.slots(),
                                    " could not be allocated (", s.message(), "); snapshots use the ",
                                    seg.slots_prepared(), " slots ready"));
      return;
    }
  }
  const absl::Duration took = clock_->Now() - start;
  // Said because it matters: huge pages allocate, page-lock and restore
  // faster, and whether staging gets them is the machine's setting.
  const staging::MappedPages pages = seg.Mapped();
  std::string paging;
  if (pages.huge_bytes > 0) {
    paging = absl::StrCat(", ", pages.huge_bytes * 100 / pages.bytes, "% of it on huge pages");
  } else if (pages.bytes > 0) {
    paging = ", on 4 KiB pages (/dev/shm mounted with huge=advise gives huge pages: see docs/operations.md)";
  }
  logger_->Info(absl::StrCat("job ", reg.job, " rank ", reg.rank, ": staging ready, ", seg.slots(), " slots of ",
                             Gib(seg.slot_bytes()), " allocated in the background in ",
                             absl::FormatDuration(absl::Trunc(took, absl::Milliseconds(1))), paging));
}

void AgentCore::SetKept(Trainer* t, KeptStep kept) {
  absl::MutexLock l(&t->mu);
  // The slot's previous step is gone; the other kept steps stay (the newest
  // persisted step may never commit: the one before is still the one to
  // restore). The trainer takes the oldest back when it needs a slot.
  std::erase_if(t->kept, [&](const KeptStep& k) { return k.slot == kept.slot; });
  t->kept.push_back(std::move(kept));
}

void AgentCore::Replicate(Trainer* t, const KeptStep& kept) {
  if (options_.replicator == nullptr || !options_.replicator->has_partners()) return;
  ReplicaSource source;
  ckptd::v1::ReplicaHeader& h = source.header;
  h.mutable_key()->set_job(t->reg.job);
  h.mutable_key()->set_rank(t->reg.rank);
  h.mutable_key()->set_step(kept.step);
  h.set_world_size(t->reg.world_size);
  h.set_from_node(options_.node_id);
  h.set_data_bytes(t->layout.slot_bytes);
  h.set_file_length(kept.file_length);
  h.set_index_xxh3(kept.index_xxh3);
  // The index as the shard holds it: a partner's copy is checked against the
  // MANIFEST through it.
  if (!kept.index->SerializeToString(h.mutable_index()) ||
      format::Xxh3(h.index().data(), h.index().size()) != kept.index_xxh3) {
    logger_->Warning(absl::StrCat("job ", t->reg.job, " rank ", t->reg.rank, ": step ", kept.step,
                                  " is not sent to partners: its shard index does not serialize to what was written"));
    return;
  }
  h.set_layout_xxh3(format::Xxh3(t->key.data(), t->key.size()));
  source.segment = t->segment;
  source.slot = kept.slot;
  options_.replicator->Submit(std::move(source));
}

void AgentCore::DropKeptAbove(const std::string& job, uint64_t step) {
  std::vector<std::shared_ptr<Trainer>> trainers;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, t] : trainers_) {
      if (t->reg.job == job) trainers.push_back(t);
    }
    for (Parked& p : parked_) {
      if (p.job == job) FreeKeptAbove(p.segment.get(), &p.kept, step);
    }
  }
  for (const std::shared_ptr<Trainer>& t : trainers) {
    absl::MutexLock l(&t->mu);
    FreeKeptAbove(t->segment.get(), &t->kept, step);
  }
}

void AgentCore::PersistLoop(Trainer* t) {
  base::SetCallingThreadName("ckptd-persist");
  // Slots first (a restore may wait for one), then the trainers before, if
  // they still write into the segment (preparing touches no READY slot).
  PrepareSlots(t);
  t->preparing.store(false);
  WaitForPredecessor(t);
  // The encoder of this trainer's memory checkpoints (their shard indexes),
  // made before this thread lowers itself: its starvation reserve runs at
  // the priority of the thread that makes it, and must be normal.
  base::ThreadPool memory_encoder(1, options_.background_priority, PersistGuard());
  // Only now: a restore may wait for a slot that PrepareSlots allocates.
  // The persister waits for the disk and submits writes; the CPU work of a
  // persist is the pool's, at background_priority and guarded against
  // starvation. The persister itself cannot be raised again once lowered
  // (that needs CAP_SYS_NICE), so it runs at nice 19 at most: a
  // SCHED_IDLE persister would wait without bound to submit the next write
  // on a CPU kept busy, nice 19 gets about 1.5% of a busy core, plenty to
  // wait and submit.
  if (options_.background_priority != base::ThreadPriority::kNormal) {
    (void)base::SetCallingThreadPriority(base::ThreadPriority::kLow);
    (void)base::SetCallingThreadLowestIoPriority();
  }
  while (true) {
    bool stop;
    {
      absl::MutexLock l(&t->mu);
      // Also polls: a trainer may publish and die before it could notify.
      clock_->AwaitWithTimeout(&t->mu,
                               absl::Condition(
                                   +[](Trainer* tr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tr->mu) {
                                     return tr->wake || tr->stopping;
                                   },
                                   t),
                               absl::Milliseconds(100));
      t->wake = false;
      stop = t->stopping;
    }
    while (std::optional<uint32_t> first = NextReady(t)) {
      std::vector<uint32_t> slots{*first};
      if (shutting_down_.load()) {
        // Everything published, newest first: the newest snapshot is worth
        // the time left most; older ones follow while it lasts, so that when
        // another rank cannot finish the newest step, the job still has an
        // older one every rank wrote. (The slots are taken in step order.)
        while (std::optional<uint32_t> more = NextReady(t)) slots.push_back(*more);
        std::reverse(slots.begin(), slots.end());
      }
      for (const uint32_t slot : slots) PersistSlot(t, slot, &memory_encoder);
    }
    if (stop) {
      // Failures not reported yet are, before the trainer is forgotten.
      std::string line;
      {
        absl::MutexLock l(&t->mu);
        if (t->failures_unlogged > 0) {
          line = absl::StrCat("job ", t->reg.job, " rank ", t->reg.rank, ": ", t->failures_unlogged,
                              " more persists failed since the last report, the newest of step ",
                              t->status.last_failed_step.value_or(0), ": ", t->status.last_error.message());
          t->failures_unlogged = 0;
        }
      }
      if (!line.empty()) logger_->Warning(line);
      absl::MutexLock l(&t->mu);
      t->drained = true;
      return;
    }
  }
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

std::optional<uint32_t> AgentCore::NextReady(Trainer* t) {
  absl::MutexLock l(&t->mu);
  if (!t->exit_drain) return t->segment->TakeReady();
  while (!t->exit_drain->empty()) {
    const auto [slot, step] = t->exit_drain->front();
    t->exit_drain->erase(t->exit_drain->begin());
    if (t->segment->TakeReadySlot(slot, step)) return slot;
  }
  return std::nullopt;
}

void AgentCore::PersistSlot(Trainer* t, uint32_t slot, base::ThreadPool* memory_encoder) {
  const bool shutting_down = shutting_down_.load();
  const uint64_t step = t->segment->step(slot);
  const std::string who = absl::StrCat("shutting down: job ", t->reg.job, " rank ", t->reg.rank, ": step ", step);
  if (IsMemoryCheckpoint(t, step)) {
    if (shutting_down) {
      logger_->Info(absl::StrCat(who, " is a memory checkpoint and is not written"));
      (void)t->segment->Release(slot);
      return;
    }
    KeepInMemory(t, slot, memory_encoder);
    return;
  }
  if (shutting_down) {
    // Written newest first: once a newer step committed, an older one is of
    // no use to any restart.
    std::optional<uint64_t> committed;
    {
      absl::MutexLock l(&t->mu);
      committed = t->status.last_committed_step;
    }
    if (committed && *committed > step) {
      logger_->Info(absl::StrCat(who, " is not persisted: step ", *committed, ", newer, is committed"));
      (void)t->segment->Release(slot);
      return;
    }
  }
  if (shutting_down && write_.stop()) {
    logger_->Warning(absl::StrCat(who, " is not persisted: the shutdown's grace period ended before its turn"));
    (void)t->segment->Release(slot);
    absl::MutexLock l(&t->mu);
    ++t->status.failed;
    t->status.last_error = absl::CancelledError("the agent's shutdown grace period ended before it was written");
    t->status.last_failed_step = step;
    return;
  }
  bool released = false;
  bool kept = false;
  // The slot goes back to the trainer: KEPT (the snapshot stays in
  // memory, and the trainer takes it when it has no free slot) or FREE.
  auto release = [&] {
    if (released) return;
    released = true;
    kept = options_.keep_in_memory && t->segment->Keep(slot).ok();
    if (!kept) (void)t->segment->Release(slot);
  };
  storage::ShardWriteResult written;
  absl::Status s = PersistOne(t, slot, release, &written);
  // The slot is the trainer's again whatever happened: training goes on.
  release();
  if (kept && s.ok() && written.index != nullptr) {
    const KeptStep k{slot, step, written.file_length, written.index_xxh3, written.index};
    SetKept(t, k);
    Replicate(t, k);
  } else if (kept) {
    t->segment->Unkeep(slot, step);
  }
  if (shutting_down_.load()) {
    NoteShutdownPersist(t, step, s);
  } else {
    NotePersisted(t, step, s);
  }
}

bool AgentCore::IsMemoryCheckpoint(Trainer* t, uint64_t step) {
  if (options_.coordinator == nullptr || !options_.keep_in_memory) return false;
  const std::optional<ckptd::v1::Schedule> schedule = options_.coordinator->ScheduleFor(t->reg.job);
  return schedule && rpc::ScheduledAt(*schedule, step) && !rpc::DurableAt(*schedule, step);
}

void AgentCore::TakeReportStamps(Trainer* t, uint32_t slot, double* stall, uint64_t* incarnation) {
  *stall = 0;
  absl::MutexLock l(&t->mu);
  if (auto it = t->stall_by_slot.find(slot); it != t->stall_by_slot.end()) {
    *stall = it->second;
    t->stall_by_slot.erase(it);
  }
  *incarnation = t->incarnation;
  t->last_stall = *stall;
}

absl::StatusOr<std::vector<storage::TensorSource>> AgentCore::SlotSources(Trainer* t, uint32_t slot,
                                                                         base::ThreadPool* pool) {
  const TrainerRegistration& reg = t->reg;
  std::vector<storage::TensorSource> sources(reg.buffers.size());
  bool replicated = false;
  for (size_t i = 0; i < reg.buffers.size(); ++i) {
    sources[i].meta = reg.buffers[i];
    sources[i].data = t->segment->slot_data(slot) + t->layout.offsets[i];
    sources[i].length = t->layout.lengths[i];
    replicated |= reg.buffers[i].has_replica();
  }
  if (!replicated) return sources;
  return storage::ShareSources(sources, options_.write.block_bytes, pool);
}

void AgentCore::ReportPersistFailed(Trainer* t, uint64_t step, const absl::Status& s) {
  ckptd::v1::ReportFailureRequest f;
  f.set_job(t->reg.job);
  f.set_rank(t->reg.rank);
  f.set_kind(ckptd::v1::PERSIST_FAILED);
  f.set_step(step);
  f.set_detail(std::string(s.message()).substr(0, 4000));
  options_.coordinator->Failure(f);
}

ckptd::v1::ShardReport AgentCore::ShardReportOf(Trainer* t, uint64_t step, double stall, uint64_t incarnation,
                                                const storage::ShardWriteResult& written, double seconds) {
  ckptd::v1::ShardReport report;
  report.set_job(t->reg.job);
  report.set_step(step);
  report.set_world_size(t->reg.world_size);
  report.set_stall_seconds(stall);
  report.set_incarnation(incarnation);
  *report.mutable_shard() = ShardRefOf(t->reg.rank, written);
  report.mutable_shard()->set_persist_seconds(seconds);
  return report;
}

void AgentCore::KeepInMemory(Trainer* t, uint32_t slot, base::ThreadPool* encoder) {
  const TrainerRegistration& reg = t->reg;
  const uint64_t step = t->segment->step(slot);
  const std::string what = absl::StrCat("job ", reg.job, " rank ", reg.rank, ": memory checkpoint of step ", step);
  double stall = 0;
  uint64_t incarnation = 0;
  TakeReportStamps(t, slot, &stall, &incarnation);
  // The shard a raw write of the snapshot would be, written nowhere. One
  // encoder, as MemoryShardOptions asks, at the persists' priority.
  const absl::Time start = clock_->Now();
  absl::StatusOr<std::vector<storage::TensorSource>> sources = SlotSources(t, slot, encoder);
  absl::StatusOr<storage::ShardWriteResult> result = absl::UnknownError("not written");
  if (!sources.ok()) {
    result = sources.status();
  } else {
    storage::DiscardingFileSystem nowhere;
    result = storage::WriteShard(&nowhere, storage::ShardFileName(reg.rank), {reg.job, step, reg.rank, reg.world_size},
                                 *sources, MemoryShardOptions(options_.write), encoder);
  }
  const double index_seconds = absl::ToDoubleSeconds(clock_->Now() - start);
  if (!result.ok()) {
    (void)t->segment->Release(slot);  // PERSISTING -> FREE: the trainer's again
    const absl::Status failed(result.status().code(),
                              absl::StrCat(what, ": its shard index could not be made: ", result.status().message()));
    // Counted and reported as a failed checkpoint: the coordinator hears of
    // no shard of the step from this rank.
    ReportPersistFailed(t, step, failed);
    NotePersisted(t, step, failed);
    return;
  }
  const staging::StagingSegment& seg = *t->segment;
  if (!t->segment->Keep(slot).ok()) {
    // Not PERSISTING any more: the slot is not the persister's to free, and
    // a Release that fails changes nothing.
    (void)t->segment->Release(slot);
    logger_->Info(absl::StrCat(what, " is not kept: its staging slot ", slot, " is ",
                               staging::SlotStateName(seg.state(slot)), ", not being persisted"));
    return;
  }
  const KeptStep kept{slot, step, result->file_length, result->index_xxh3, result->index};
  SetKept(t, kept);
  Replicate(t, kept);
  // The coordinator counts the step as held in memory: not when the trainer
  // took the slot back for a snapshot already.
  if (seg.state(slot) != staging::SlotState::kKept || seg.step(slot) != step) {
    {
      absl::MutexLock l(&t->mu);
      std::erase_if(t->kept, [&](const KeptStep& k) { return k.slot == slot && k.step == step; });
    }
    logger_->Info(
        absl::StrCat(what, " is not reported: the trainer took its staging slot ", slot, " back for a snapshot first"));
    return;
  }
  ckptd::v1::ShardReport report = ShardReportOf(t, step, stall, incarnation, *result, index_seconds);
  report.set_memory_only(true);
  options_.coordinator->ShardDurable(report);
  absl::MutexLock l(&t->mu);
  ++t->status.memory_checkpoints;
  t->status.last_memory_step = step;
}

void AgentCore::NoteShutdownPersist(Trainer* t, uint64_t step, const absl::Status& s) {
  const std::string who = absl::StrCat("shutting down: job ", t->reg.job, " rank ", t->reg.rank, ": step ", step);
  if (s.ok()) {
    logger_->Info(absl::StrCat(who, " is durable and ",
                               options_.coordinator != nullptr
                                   ? "reported to the coordinator, which commits it once every rank has reported it"
                                   : "handed to this agent's commit (done once every rank of the job has it)"));
  } else if (absl::IsCancelled(s)) {
    logger_->Warning(absl::StrCat(who, " was stopped at the end of the shutdown's grace period (", s.message(),
                                  "): nothing of it is left on disk, and the newest committed step stays the one "
                                  "to restore"));
  } else {
    logger_->Warning(absl::StrCat(who, " failed: ", s.message()));
  }
  absl::MutexLock l(&t->mu);
  if (s.ok()) {
    // Older steps are written after the newest at shutdown.
    t->status.last_persisted_step = std::max(t->status.last_persisted_step.value_or(0), step);
    ++t->status.persisted;
  } else {
    ++t->status.failed;
    t->status.last_error = s;
    t->status.last_failed_step = step;
  }
}

void AgentCore::NotePersisted(Trainer* t, uint64_t step, const absl::Status& s) {
  const TrainerRegistration& reg = t->reg;
  std::string line;
  bool warning = false;
  // Logged before the lock goes: whoever waits for the step (WaitPersisted)
  // finds it reported.
  absl::MutexLock l(&t->mu);
  if (s.ok()) {
    t->status.last_persisted_step = step;
    ++t->status.persisted;
    if (t->failed_in_a_row > 0) {
      line = absl::StrCat("persists of job ", reg.job, " rank ", reg.rank, " succeed again after ", t->failed_in_a_row,
                          t->failed_in_a_row == 1 ? " failure" : " failures", " (step ", step, " persisted)");
    }
    t->failed_in_a_row = 0;
    t->failures_unlogged = 0;
    t->failure_logged_at.reset();
  } else {
    ++t->status.failed;
    t->status.last_error = s;
    t->status.last_failed_step = step;
    ++t->failed_in_a_row;
    const absl::Time now = clock_->Now();
    const absl::Duration every = options_.persist_failure_log_interval;
    if (!t->failure_logged_at || now - *t->failure_logged_at >= every) {
      warning = true;
      line = absl::StrCat("persist of job ", reg.job, " rank ", reg.rank, " step ", step, " failed: ", s.message());
      if (t->failures_unlogged > 0) {
        absl::StrAppend(&line, "; ", t->failures_unlogged, " more failed since the last report (", t->failed_in_a_row,
                        " in a row)");
      } else if (t->failed_in_a_row == 1 && every > absl::ZeroDuration()) {
        absl::StrAppend(&line, "; further failures of this rank are reported at most every ",
                        absl::FormatDuration(every));
      }
      t->failure_logged_at = now;
      t->failures_unlogged = 0;
    } else {
      ++t->failures_unlogged;
    }
  }
  if (line.empty()) return;
  if (warning) {
    logger_->Warning(line);
  } else {
    logger_->Info(line);
  }
}

void AgentCore::BeginWriting(const std::string& job, uint64_t step) {
  absl::MutexLock l(&writing_mu_);
  ++writing_[{job, step}];
}

void AgentCore::EndWriting(const std::string& job, uint64_t step) {
  absl::MutexLock l(&writing_mu_);
  if (auto it = writing_.find({job, step}); it != writing_.end() && --it->second == 0) writing_.erase(it);
}

void AgentCore::CleanUpFailedStep(Trainer* t, uint64_t step) {
  const TrainerRegistration& reg = t->reg;
  // Held throughout: no persist of this agent starts writing the step meanwhile.
  absl::MutexLock l(&writing_mu_);
  if (writing_.contains({reg.job, step})) return;  // another rank's persist writes it
  if (local_) local_->Discard({reg.job, step, reg.rank, reg.world_size});
  // Best effort: the shard writer removes its temp file itself, unless the
  // file system refused that too.
  (void)fs_->RemoveFile(
      absl::StrCat(storage::ShardPath(options_.storage_root, reg.job, step, reg.rank), storage::kTempSuffix));
  // Kept (kFailedPrecondition) when it holds a MANIFEST or another rank's
  // shard, or is a link; anything else is only wasted space, cleaned up after
  // the next commit.
  (void)store_.RemoveEmptyStep(reg.job, step);
}

absl::StatusOr<storage::ShardWriteResult> AgentCore::WriteShard(Trainer* t, uint64_t step,
                                                            absl::Span<const storage::TensorSource> sources,
                                                            const std::function<void()>& release) {
  const TrainerRegistration& reg = t->reg;
  if (local_) return local_->Persist({reg.job, step, reg.rank, reg.world_size}, sources, release, &t->local);
  CKPTD_RETURN_IF_ERROR(store_.PrepareStep(reg.job, step));
  return store_.WriteShard(reg.job, step, reg.rank, reg.world_size, sources, write_, &pool_);
}

void AgentCore::DropLocalStepsAbove(const std::string& job, uint64_t step) {
  if (local_) local_->DropStepsAbove(job, step);
  DropKeptAbove(job, step);
}

absl::Status AgentCore::PersistOne(Trainer* t, uint32_t slot, const std::function<void()>& release,
                                   storage::ShardWriteResult* written) {
  const TrainerRegistration& reg = t->reg;
  const uint64_t step = t->segment->step(slot);
  double stall = 0;
  uint64_t incarnation = 0;
  // Taken now: once the slot is released it may hold the next snapshot.
  TakeReportStamps(t, slot, &stall, &incarnation);
  BeginWriting(reg.job, step);
  const absl::Time start = clock_->Now();
  absl::StatusOr<std::vector<storage::TensorSource>> sources = SlotSources(t, slot, &pool_);
  absl::StatusOr<storage::ShardWriteResult> result =
      sources.ok() ? WriteShard(t, step, *sources, release) : absl::StatusOr<storage::ShardWriteResult>(sources.status());
  const double persist_seconds = absl::ToDoubleSeconds(clock_->Now() - start);
  EndWriting(reg.job, step);
  if (!result.ok()) CleanUpFailedStep(t, step);
  if (result.ok()) {
    *written = *result;
    absl::MutexLock l(&t->mu);
    t->last_persist = persist_seconds;
  }
  if (options_.coordinator != nullptr) {
    if (!result.ok()) {
      // A write stopped because the agent exits is no failure of the storage.
      if (!absl::IsCancelled(result.status())) ReportPersistFailed(t, step, result.status());
      return result.status();
    }
    // The coordinator commits: it hears of every shard, this one included.
    options_.coordinator->ShardDurable(ShardReportOf(t, step, stall, incarnation, *result, persist_seconds));
    return absl::OkStatus();
  }
  CKPTD_RETURN_IF_ERROR(result.status());
  return CommitAlone(t, step, *result);
}

absl::Status AgentCore::CommitAlone(Trainer* t, uint64_t step, const storage::ShardWriteResult& written) {
  const TrainerRegistration& reg = t->reg;
  const ckptd::v1::ShardRef ref = ShardRefOf(reg.rank, written);
  std::vector<ckptd::v1::ShardRef> shards;
  {
    absl::MutexLock l(&lone_mu_);
    LoneJob& job = lone_[reg.job];
    const LoneRegistration writer{t->id, reg.pid};
    // Counts when its writer is still the newest registration of its rank, or
    // the same process registered again (after losing its agent connection).
    auto current = [&job](uint32_t rank, const LoneRegistration& w) {
      auto it = job.newest.find(rank);
      return it != job.newest.end() &&
             (it->second.trainer_id == w.trainer_id || (w.pid != 0 && it->second.pid == w.pid));
    };
    if (job.world_size != reg.world_size || !current(reg.rank, writer)) {
      logger_->Warning(absl::StrCat("job ", reg.job, " rank ", reg.rank, " step ", step,
                                    ": the rank registered again since this shard was taken; not committed"));
      return absl::OkStatus();
    }
    if (job.committed && step <= *job.committed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", reg.job, " step ", step, ": not newer than committed step ", *job.committed, "; not committed"));
    }
    std::map<uint32_t, LoneShard>& pending = job.pending[step];
    pending[reg.rank] = {ref, writer};
    for (const auto& [rank, s] : pending) {
      if (current(rank, s.writer)) shards.push_back(s.ref);
    }
    if (shards.size() < reg.world_size) {
      // Steps some rank never wrote (it skipped them, or it runs on another
      // node) are not kept forever.
      while (job.pending.size() > kMaxPendingSteps) job.pending.erase(job.pending.begin());
      if (job.newest.size() < reg.world_size && !job.warned_unseen_ranks) {
        job.warned_unseen_ranks = true;
        logger_->Warning(absl::StrCat(
            "job ", reg.job, ": ", job.newest.size(), " of its ", reg.world_size,
            " ranks registered with this agent, which runs without a coordinator: a step commits only once every "
            "rank's shard of it is written through this agent; a job with ranks on other nodes needs "
            "ckptd-coordinator (start every agent with --coordinator HOST:PORT)"));
      }
      return absl::OkStatus();
    }
    job.pending.erase(step);
  }
  // Every rank's shard of the step is durable and this agent saw them all:
  // it commits the step, as the coordinator would.
  absl::MutexLock l(&commit_mu_);
  {
    absl::MutexLock ll(&lone_mu_);
    LoneJob& job = lone_[reg.job];
    if (job.committed && step <= *job.committed) return absl::OkStatus();
  }
  CKPTD_RETURN_IF_ERROR(store_.CommitStep(reg.job, step, reg.world_size, &shards).status());
  {
    absl::MutexLock ll(&lone_mu_);
    LoneJob& job = lone_[reg.job];
    job.committed = step;
    // Older steps still pending never will be: their files go below.
    job.pending.erase(job.pending.begin(), job.pending.lower_bound(step));
  }
  MarkCommitted(reg.job, step, t);
  CKPTD_RETURN_IF_ERROR(store_.ApplyRetention(reg.job, options_.keep_last).status());
  // At shutdown the ranks write their snapshots newest first: another rank
  // may be writing an older step now. What is left below `step` goes at
  // the job's next commit.
  if (shutting_down_.load()) return absl::OkStatus();
  return store_.RemoveIncompleteSteps(reg.job, step).status();
}

void AgentCore::OnCommittedSteps(const ckptd::v1::HeartbeatAck& ack) {
  if (!ack.known()) return;  // a coordinator that restarted, or a session that ended: it says nothing of the jobs
  std::set<std::string> listed;
  for (const ckptd::v1::Schedule& s : ack.schedules()) listed.insert(s.job());
  std::map<std::string, uint64_t> newest;
  for (const ckptd::v1::CommittedStep& c : ack.committed()) newest[c.job()] = c.step();
  absl::MutexLock l(&mu_);
  for (const auto& [id, t] : trainers_) {
    auto it = newest.find(t->reg.job);
    if (it != newest.end()) {
      t->segment->PinKept(it->second);
    } else if (listed.contains(t->reg.job)) {
      // The heartbeat listed the job and the coordinator names no step of
      // it: nothing to restore, nothing worth keeping last.
      t->segment->PinKept(std::nullopt);
    }
  }
  for (Parked& p : parked_) {
    if (auto it = newest.find(p.job); it != newest.end()) p.segment->PinKept(it->second);
  }
}

void AgentCore::MarkCommitted(const std::string& job, uint64_t step, Trainer* committer) {
  std::vector<std::shared_ptr<Trainer>> trainers;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, t] : trainers_) {
      if (t->reg.job == job && t.get() != committer) trainers.push_back(t);
    }
  }
  auto mark = [step](Trainer* t) {
    absl::MutexLock l(&t->mu);
    if (!t->status.last_committed_step || *t->status.last_committed_step < step) t->status.last_committed_step = step;
    t->segment->PinKept(*t->status.last_committed_step);  // what a restart restores: kept in memory last
  };
  // The committer may have left trainers_ already (it exited; its persister drains).
  mark(committer);
  for (const std::shared_ptr<Trainer>& t : trainers) mark(t.get());
}

void AgentCore::NoStepToRestore(Trainer* t) {
  absl::MutexLock l(&t->mu);
  t->status.last_committed_step.reset();
  t->segment->PinKept(std::nullopt);
}

absl::StatusOr<RestoreResult> AgentCore::Restore(uint64_t trainer_id, const RestoreOptions& options) {
  std::shared_ptr<Trainer> t = Find(trainer_id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no trainer ", trainer_id, " is registered"));
  LoadCall call;
  call.wait_for_slot = options.wait_for_slot;
  call.client_verifies = options.client_verifies;
  call.timeout = options_.restore_timeout;
  if (const absl::Duration left = options.caller_timeout; left != absl::InfiniteDuration()) {
    // A second before the caller gives up (half the time left when less).
    call.timeout = std::min(call.timeout, std::max(left - absl::Seconds(1), left / 2));
    if (call.timeout <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("restore of job ", t->reg.job, " rank ", t->reg.rank,
                                                      ": the caller's deadline leaves no time; nothing was loaded"));
    }
  }
  if (!options.reread_step) {
    absl::StatusOr<RestoreResult> r =
        options_.coordinator != nullptr ? RestoreCoordinated(t.get(), &call) : RestoreLocal(t.get(), &call);
    if (r.ok() && r->step) {
      // The registration ended meanwhile (its process died, or registered
      // again): nobody copies the slot out, and it is not left RESTORED in
      // a segment another trainer may hold by now.
      bool gone = false;
      {
        absl::MutexLock l(&t->mu);
        gone = t->stopping;
      }
      if (gone) {
        (void)t->segment->Release(r->slot);
        return absl::UnavailableError(absl::StrCat("restore of job ", t->reg.job, " rank ", t->reg.rank,
                                                   ": the registration ended while it ran"));
      }
    }
    if (r.ok()) {
      absl::MutexLock l(&t->mu);
      t->restored = r->step;
      t->restored_expected = r->step ? call.expected : std::nullopt;
      t->restored_peers = r->step ? call.peers : std::vector<ckptd::v1::PeerCopy>();
      t->restored_from = call.handed_from;
      t->rejected_sources.clear();
    }
    return r;
  }
  // The trainer found the memory copy it was handed damaged: the round has
  // decided on this step already, so the same step is read from disk.
  const uint64_t step = *options.reread_step;
  uint64_t incarnation = 0;
  {
    absl::MutexLock l(&t->mu);
    if (t->restored != step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "reread of step ", step, ": this trainer's last restore handed over ",
          t->restored ? absl::StrCat("step ", *t->restored) : std::string("no step")));
    }
    ++t->memory_rejected;
    incarnation = t->incarnation;
    // A memory checkpoint has no copy on disk: read again from a peer's.
    call.expected = t->restored_expected;
    if (call.expected) call.peers = t->restored_peers;
    // The copy the trainer found damaged, and any before it, are not read
    // again: the next peer holding the step is.
    if (!t->restored_from.empty()) t->rejected_sources.insert(t->restored_from);
    call.skip_sources = t->rejected_sources;
    for (const KeptStep& k : t->kept) {
      if (k.step == step) t->segment->Unkeep(k.slot, k.step);
    }
    std::erase_if(t->kept, [step](const KeptStep& k) { return k.step == step; });
  }
  logger_->Warning(
      absl::StrCat("job ", t->reg.job, " rank ", t->reg.rank, ": the copy of step ", step,
                   " in the agent's memory failed the trainer's check (", options.reread_problem.substr(0, 1000), "); ",
                   call.expected ? "a memory checkpoint: reading it from a peer's memory" : "reading it from disk"));
  call.from_memory = false;
  CKPTD_ASSIGN_OR_RETURN(const uint32_t slot, LoadStep(t.get(), step, &call));
  {
    absl::MutexLock l(&t->mu);
    t->restored_from = call.handed_from;
  }
  if (options_.coordinator != nullptr) {
    // The coordinator heard the rank read the step from memory: it learns
    // where it was read in the end (the restore stands either way).
    const TrainerRegistration& reg = t->reg;
    ckptd::v1::RestorePlanRequest req = PlanRequestOf(reg, t->id);
    req.set_has_attempt(true);
    req.set_attempt_step(step);
    req.set_attempt_ok(true);
    req.set_attempt_source(RestoreSourceProto(call.source));
    req.set_attempt_saved_world_size(call.resharded_from);
    req.set_reread(true);
    if (absl::Status told = options_.coordinator->RestorePlan(req, options_.restore_timeout).status(); !told.ok()) {
      logger_->Warning(absl::StrCat("job ", reg.job, " rank ", reg.rank,
                                    ": the coordinator could not be told that step ", step,
                                    " was read from disk after all: ", told.message()));
    }
  }
  return Restored(t.get(), step, slot, &call, incarnation);
}

RestoreResult AgentCore::Restored(Trainer* t, uint64_t step, uint32_t slot, LoadCall* call, uint64_t incarnation) {
  {
    // The job goes on from `step`: a newer step committed before belongs to
    // a timeline that is gone, and `step` is what the next restart restores
    // until another commits.
    absl::MutexLock l(&t->mu);
    t->status.last_committed_step = step;
    t->segment->PinKept(step);
  }
  RestoreResult r;
  r.step = step;
  r.slot = slot;
  r.incarnation = incarnation;
  r.source = call->source;
  r.verify = std::move(call->verify);
  return r;
}

absl::StatusOr<uint32_t> AgentCore::AcquireRestoreSlot(Trainer* t, absl::Duration wait) {
  // A new registration's slots are allocated in the background, a slot of
  // tens of GiB in seconds: a restore (the replacement node's first call)
  // waits for the first one to be ready rather than fail after the trainer's
  // usual wait, as long as the allocation goes on and within the restore's
  // own time.
  const absl::Time give_up = clock_->Now() + options_.restore_timeout;
  while (true) {
    // Read before the try: a slot made ready just after it is found next time.
    const bool preparing = t->preparing.load();
    absl::StatusOr<uint32_t> slot =
        t->segment->AcquireForRestore(preparing ? std::max(wait, absl::Milliseconds(50)) : wait);
    if (slot.ok() || !absl::IsResourceExhausted(slot.status()) || !preparing || clock_->Now() >= give_up) {
      return slot;
    }
  }
}

absl::StatusOr<uint32_t> AgentCore::LoadStep(Trainer* t, uint64_t step, LoadCall* call) {
  const TrainerRegistration& reg = t->reg;
  const absl::Duration wait_for_slot = call->wait_for_slot;
  call->source = RestoreSource::kMemory;
  call->handed_from.clear();
  call->resharded_from = 0;
  call->verify.clear();
  call->manifest.reset();
  auto resharded = [&]() -> absl::StatusOr<uint32_t> {
    bool was = false;
    CKPTD_ASSIGN_OR_RETURN(const uint32_t slot, LoadResharded(t, step, *call->manifest, wait_for_slot, &was));
    if (was) call->resharded_from = call->manifest->world_size();
    return slot;
  };
  if (!call->expected) {
    absl::StatusOr<ckptd::v1::StepManifest> manifest = store_.ReadManifest(reg.job, step);
    if (manifest.ok()) call->manifest = *std::move(manifest);
    // A step saved by another number of ranks is read resharded, from disk:
    // no copy of this rank's slice exists anywhere.
    if (call->manifest && call->manifest->world_size() != reg.world_size) {
      call->source = RestoreSource::kRoot;
      return resharded();
    }
  }
  if (call->from_memory) {
    if (std::optional<uint32_t> slot = LoadFromMemory(t, step, call)) return *slot;
  }
  if (!call->peers.empty() || options_.replicas != nullptr) {
    call->source = RestoreSource::kPeer;
    CKPTD_ASSIGN_OR_RETURN(const std::optional<uint32_t> slot, LoadFromPeers(t, step, call));
    if (slot) return *slot;
  }
  if (call->expected) {
    // Never written: the local tier and the storage root hold no copy of it
    // (a file there could only be another attempt at the step).
    return absl::NotFoundError(absl::StrCat("step ", step, " of job ", reg.job,
                                            " is a memory checkpoint and no intact copy of rank ", reg.rank,
                                            " is left in memory (this agent's or a peer's); it has no copy on disk"));
  }
  call->source = RestoreSource::kRoot;
  bool resliced = false;  // the saved slices of this rank are not the registered ones
  if (local_) {
    uint32_t slot = 0;
    std::optional<absl::Status> local = local_->Read(
        {reg.job, step, reg.rank, reg.world_size},
        [&](storage::ShardReader& reader) -> absl::Status {
          resliced = Resliced(reg, reader.index());
          if (resliced) return absl::OkStatus();
          CKPTD_ASSIGN_OR_RETURN(slot, LoadFrom(t, step, reader, wait_for_slot));
          return absl::OkStatus();
        },
        &t->local);
    if (local.has_value() && !resliced) {
      CKPTD_RETURN_IF_ERROR(*local);
      call->source = RestoreSource::kLocal;
      return slot;
    }
  }
  // The shard the step committed, by its MANIFEST: a file of another
  // attempt at the step (an old process's late persist renamed over it) or
  // of another rank passes every block check of its own.
  if (!call->manifest) {
    CKPTD_ASSIGN_OR_RETURN(call->manifest, store_.ReadManifest(reg.job, step));
  }
  if (resliced) return resharded();
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardReader> reader,
                         store_.OpenCommittedShard(reg.job, step, *call->manifest, reg.rank,
                                                   storage::ShardReadOptions(), restore_pool_));
  if (Resliced(reg, reader->index())) {
    reader.reset();
    return resharded();
  }
  return LoadFrom(t, step, *reader, wait_for_slot);
}

absl::StatusOr<std::vector<storage::PlannedRead>> AgentCore::PlanResharded(Trainer* t, uint64_t step,
                                                                          const ckptd::v1::StepManifest& manifest,
                                                                          ReshardReaders* readers, bool* planned,
                                                                          bool ask_coordinator) {
  const TrainerRegistration& reg = t->reg;
  const uint32_t saved_world = manifest.world_size();
  *planned = false;
  // The coordinator reads the step's indexes once for the whole job.
  if (options_.coordinator != nullptr && ask_coordinator) {
    ckptd::v1::ReshardPlanRequest req;
    req.set_job(reg.job);
    req.set_rank(reg.rank);
    req.set_world_size(reg.world_size);
    req.set_step(step);
    for (const ckptd::v1::Tensor& b : reg.buffers) *req.add_buffers() = b;
    // Half the restore's time at most: planning by itself must still fit.
    absl::StatusOr<ckptd::v1::ReshardPlanResponse> plan =
        options_.coordinator->ReshardPlan(req, options_.restore_timeout / 2);
    absl::Status problem = plan.status();
    std::vector<storage::PlannedRead> reads;
    if (plan.ok() && plan->saved_world_size() != saved_world) {
      problem = absl::InvalidArgumentError(absl::StrCat("it plans for a world of ", plan->saved_world_size(),
                                                        " where the MANIFEST lists ", saved_world));
    }
    if (problem.ok()) {
      for (const ckptd::v1::ReshardRead& r : plan->reads()) {
        storage::PlannedRead read;
        read.rank = r.saved_rank();
        read.buffer = r.buffer();
        read.source.offsets.assign(r.offsets().begin(), r.offsets().end());
        read.source.shape.assign(r.shape().begin(), r.shape().end());
        if (read.rank >= saved_world) {
          problem = absl::InvalidArgumentError(absl::StrCat("it reads rank ", read.rank, " of ", saved_world));
          break;
        }
        if (read.buffer < reg.buffers.size()) read.target = storage::SliceBox(reg.buffers[read.buffer]);
        reads.push_back(std::move(read));
      }
    }
    if (problem.ok()) problem = storage::CheckPlan(reg.buffers, reads);
    if (problem.ok()) {
      std::stable_sort(reads.begin(), reads.end(),
                       [](const storage::PlannedRead& a, const storage::PlannedRead& b) { return a.rank < b.rank; });
      *planned = true;
      return reads;
    }
    const std::string line = absl::StrCat("job ", reg.job, " rank ", reg.rank, ": no reshard plan of step ", step,
                                          " from the coordinator (", problem.message().substr(0, 1000),
                                          "); planning from the ", saved_world, " saved shards' indexes");
    if (absl::IsUnimplemented(problem)) {
      logger_->Info(line);  // a coordinator that plans none
    } else {
      logger_->Warning(line);
    }
  }
  // Every saved shard's index, checked against the MANIFEST. A few are kept
  // open for the reads that follow; many would hold a descriptor each.
  storage::SavedLayout layout(saved_world);
  const bool keep_open = saved_world <= kReshardReadersKeptOpen;
  for (uint32_t r = 0; r < saved_world; ++r) {
    CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardReader> reader, OpenSavedShard(t, step, manifest, r));
    layout.Add(r, reader->index());
    if (keep_open) (*readers)[r] = std::move(reader);
  }
  layout.Seal();
  CKPTD_ASSIGN_OR_RETURN(std::vector<storage::PlannedRead> reads,
                         storage::PlanReshard(step, reg.rank, reg.buffers, layout));
  std::set<uint32_t> used;
  for (const storage::PlannedRead& r : reads) used.insert(r.rank);
  // Rank reg.rank's own index is needed again to keep the result in memory
  // (the same world only).
  const bool keep_own = saved_world == reg.world_size;
  std::erase_if(*readers,
                [&](const auto& kv) { return !used.contains(kv.first) && !(keep_own && kv.first == reg.rank); });
  return reads;
}

absl::StatusOr<std::unique_ptr<storage::ShardReader>> AgentCore::OpenSavedShard(
    Trainer* t, uint64_t step, const ckptd::v1::StepManifest& manifest, uint32_t rank) {
  {
    absl::MutexLock l(&t->mu);
    ++t->resharded_shards_opened;
  }
  return store_.OpenCommittedShard(t->reg.job, step, manifest, rank, storage::ShardReadOptions(), restore_pool_);
}

absl::StatusOr<uint32_t> AgentCore::LoadResharded(Trainer* t, uint64_t step, const ckptd::v1::StepManifest& manifest,
                                                  absl::Duration wait_for_slot, bool* resharded,
                                                  bool ask_coordinator) {
  const TrainerRegistration& reg = t->reg;
  *resharded = false;
  const uint32_t saved_world = manifest.world_size();
  if (saved_world == 0 || static_cast<uint32_t>(manifest.shards_size()) != saved_world) {
    return absl::DataLossError(absl::StrCat("the MANIFEST of step ", step, " lists ", manifest.shards_size(),
                                            " shards for a world of ", saved_world));
  }
  ReshardReaders readers;
  bool planned = false;
  CKPTD_ASSIGN_OR_RETURN(const std::vector<storage::PlannedRead> reads,
                         PlanResharded(t, step, manifest, &readers, &planned, ask_coordinator));
  uint64_t bytes = 0;
  for (uint64_t length : t->layout.lengths) bytes += length;
  CKPTD_ASSIGN_OR_RETURN(uint32_t slot, AcquireRestoreSlot(t, wait_for_slot));
  uint8_t* const data = t->segment->slot_data(slot);
  absl::Status read;
  std::set<uint32_t> ranks;
  // A buffer without a global layout is rank `own`'s: its own copy, or put
  // together from the shares of `own`'s group (told by the identity of the
  // whole its members store). The coordinator's plan is held to that.
  const uint32_t own = reg.rank % saved_world;
  std::map<size_t, std::string> whole_of;
  if (planned) {
    const ckptd::v1::ShardIndex* own_saved = nullptr;
    std::unique_ptr<storage::ShardReader> opened;
    for (const storage::PlannedRead& r : reads) {
      if (reg.buffers[r.buffer].global_shape_size() > 0 || whole_of.contains(r.buffer)) continue;
      if (own_saved == nullptr) {
        if (auto it = readers.find(own); it != readers.end()) {
          own_saved = &it->second->index();
        } else {
          CKPTD_ASSIGN_OR_RETURN(opened, OpenSavedShard(t, step, manifest, own));
          own_saved = &opened->index();
        }
      }
      for (const ckptd::v1::Tensor& x : own_saved->tensors()) {
        if (x.name() == reg.buffers[r.buffer].name()) {
          whole_of[r.buffer] = x.has_replica() ? storage::WholeIdentity(x) : std::string();
        }
      }
    }
    if (opened != nullptr) readers[own] = std::move(opened);  // read from as well, most likely
  }
  std::shared_ptr<const ckptd::v1::ShardIndex> own_index;
  bool plan_wrong = false;  // the shards hold other slices than the plan says
  for (size_t at = 0; read.ok() && at < reads.size();) {
    const uint32_t rank = reads[at].rank;
    ranks.insert(rank);
    std::unique_ptr<storage::ShardReader> reader;
    if (auto it = readers.find(rank); it != readers.end()) {
      reader = std::move(it->second);
      readers.erase(it);
    } else {
      absl::StatusOr<std::unique_ptr<storage::ShardReader>> opened = OpenSavedShard(t, step, manifest, rank);
      read = opened.status();
      if (opened.ok()) reader = *std::move(opened);
    }
    const std::string where = absl::StrCat("rank ", rank, "'s shard of step ", step);
    for (; read.ok() && at < reads.size() && reads[at].rank == rank; ++at) {
      const storage::PlannedRead& r = reads[at];
      const ckptd::v1::Tensor& b = reg.buffers[r.buffer];
      const ckptd::v1::Tensor* saved = reader->FindTensor(b.name());
      if (saved == nullptr) {
        read = absl::DataLossError(
            absl::StrCat(where, " holds no tensor '", absl::CHexEscape(b.name()), "', which the plan reads"));
        plan_wrong = true;
        break;
      }
      read = storage::CheckPlannedSource(*saved, rank, b, r.source, where);
      if (read.ok() && b.global_shape_size() == 0) {
        if (!saved->has_replica()) {
          if (rank != own || whole_of[r.buffer] != "") {
            read = absl::DataLossError(absl::StrCat("the plan reads buffer '", absl::CHexEscape(b.name()),
                                                    "' from rank ", rank, "'s shard; without a global layout it is "
                                                    "rank ", own, "'s, whole"));
          }
        } else if (const std::string whole = storage::WholeIdentity(*saved);
                   whole_of.emplace(r.buffer, whole).first->second != whole) {
          read = absl::DataLossError(absl::StrCat(where, ": its share of buffer '", absl::CHexEscape(b.name()),
                                                  "' is of another buffer than rank ", own,
                                                  "'s replica group holds"));
        }
      }
      plan_wrong = !read.ok();
      if (read.ok()) {
        read = storage::ReadIntoSlice(*reader, b.name(), r.source, r.target, format::DTypeSize(b.dtype()),
                                      data + t->layout.offsets[r.buffer]);
      }
    }
    if (read.ok() && rank == reg.rank) own_index = std::make_shared<const ckptd::v1::ShardIndex>(reader->index());
  }
  // Kept in memory when the slot holds what this rank's own shard of the
  // step describes: the same world, the shard's index checking every byte
  // (its shares of replicated buffers carry the checksums of the whole).
  std::optional<KeptStep> own_shard;
  if (read.ok() && saved_world == reg.world_size) {
    if (own_index == nullptr) {
      std::unique_ptr<storage::ShardReader> reader;
      if (auto it = readers.find(reg.rank); it != readers.end()) {
        reader = std::move(it->second);
      } else if (absl::StatusOr<std::unique_ptr<storage::ShardReader>> opened =
                     OpenSavedShard(t, step, manifest, reg.rank);
                 opened.ok()) {
        reader = *std::move(opened);
      }
      if (reader != nullptr) own_index = std::make_shared<const ckptd::v1::ShardIndex>(reader->index());
    }
    for (const ckptd::v1::ShardRef& ref : manifest.shards()) {
      if (ref.rank() != reg.rank || own_index == nullptr) continue;
      KeptStep k{slot, step, ref.file_length(), ref.index_xxh3(), own_index};
      if (!KeptBlocks(t, k).ok()) continue;
      // What the group's shares made must be what this rank saved, every
      // byte: its own index holds the checksums of its whole buffers.
      if (absl::Status v = VerifyKept(t, k); !v.ok()) {
        read = absl::DataLossError(absl::StrCat("step ", step, ": the shares of rank ", reg.rank,
                                                "'s replica groups do not make the buffers it saved: ", v.message()));
        plan_wrong = true;  // another group's shares, if the coordinator chose them
        break;
      }
      own_shard = k;
    }
  }
  const bool keep = own_shard.has_value() && options_.keep_in_memory;
  CKPTD_RETURN_IF_ERROR(t->segment->Publish(slot, step, keep));
  if (!read.ok()) {
    (void)t->segment->Release(slot);  // RESTORED -> FREE; cannot fail here
    if (planned && plan_wrong) {
      // The coordinator's plan does not fit the files: plan from them instead.
      logger_->Warning(absl::StrCat("job ", reg.job, " rank ", reg.rank, ": the coordinator's reshard plan of step ",
                                    step, " does not fit the saved shards (", read.message().substr(0, 1000),
                                    "); planning from the ", saved_world, " saved shards' indexes"));
      return LoadResharded(t, step, manifest, wait_for_slot, resharded, /*ask_coordinator=*/false);
    }
    return read;
  }
  // The same slices as saved, gathered from the group's shares; else resharded.
  if (keep) SetKept(t, *own_shard);
  logger_->Info(absl::StrCat("job ", reg.job, " rank ", reg.rank, " of ", reg.world_size, ": step ", step,
                             " (saved by ", saved_world, saved_world == 1 ? " rank" : " ranks", ") read ",
                             own_shard ? "from its replica group's shares in " : "resharded from ", ranks.size(),
                             ranks.size() == 1 ? " shard, " : " shards, ", Gib(bytes),
                             planned ? ", planned by the coordinator"
                                     : absl::StrCat(", planned from the ", saved_world, " saved indexes")));
  if (!own_shard) {
    *resharded = true;
    absl::MutexLock l(&t->mu);
    ++t->resharded_restores;
  }
  return slot;
}

absl::StatusOr<uint32_t> AgentCore::LoadFrom(Trainer* t, uint64_t step, storage::ShardReader& reader,
                                             absl::Duration wait_for_slot) {
  const TrainerRegistration& reg = t->reg;
  const ckptd::v1::ShardIndex& index = reader.index();
  if (index.world_size() != reg.world_size) {
    return absl::FailedPreconditionError(absl::StrCat("step ", step, " was saved by a world of ", index.world_size(),
                                                      " ranks; this job runs ", reg.world_size));
  }
  std::vector<storage::TensorDest> dests;
  absl::flat_hash_set<std::string> registered;
  for (size_t i = 0; i < reg.buffers.size(); ++i) {
    const ckptd::v1::Tensor& b = reg.buffers[i];
    registered.insert(b.name());
    const ckptd::v1::Tensor* saved = reader.FindTensor(b.name());
    const std::string name = absl::CHexEscape(b.name());
    if (saved == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("buffer '", name, "' is not in the checkpoint of step ", step));
    }
    if (saved->dtype() != b.dtype() || saved->raw_length() != t->layout.lengths[i]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "buffer '", name, "' is registered as ", storage::DTypeName(b.dtype()), " of ", t->layout.lengths[i],
          " bytes but step ", step, " holds ", storage::DTypeName(saved->dtype()), " of ", saved->raw_length(),
          " bytes"));
    }
    // Same bytes in another shape (a transposed layer) is another model.
    if (!std::equal(saved->shape().begin(), saved->shape().end(), b.shape().begin(), b.shape().end())) {
      return absl::FailedPreconditionError(absl::StrCat("buffer '", name, "' is registered with shape [",
                                                        absl::StrJoin(b.shape(), ", "), "] but step ", step,
                                                        " holds shape [", absl::StrJoin(saved->shape(), ", "), "]"));
    }
    // So is a slice of another global tensor (a step saved without global
    // layouts is read as it is).
    if (b.global_shape_size() > 0 && saved->global_shape_size() > 0 &&
        !std::equal(saved->global_shape().begin(), saved->global_shape().end(), b.global_shape().begin(),
                    b.global_shape().end())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "buffer '", name, "' is registered as a slice of global shape [", absl::StrJoin(b.global_shape(), ", "),
          "] but step ", step, " holds one of [", absl::StrJoin(saved->global_shape(), ", "), "]"));
    }
    dests.push_back({b.name(), nullptr, t->layout.lengths[i]});
  }
  for (const ckptd::v1::Tensor& saved : index.tensors()) {
    if (!registered.contains(saved.name())) {
      return absl::FailedPreconditionError(absl::StrCat("step ", step, " holds tensor '",
                                                        absl::CHexEscape(saved.name()), "' that is not registered"));
    }
  }
  CKPTD_ASSIGN_OR_RETURN(uint32_t slot, AcquireRestoreSlot(t, wait_for_slot));
  for (size_t i = 0; i < dests.size(); ++i) dests[i].data = t->segment->slot_data(slot) + t->layout.offsets[i];
  absl::Status read = reader.ReadTensors(dests);
  // Publish either way; on failure hand the slot straight back. Read intact,
  // the step stays in memory once the trainer copied it out.
  const bool keep = read.ok() && options_.keep_in_memory;
  CKPTD_RETURN_IF_ERROR(t->segment->Publish(slot, step, keep));
  if (!read.ok()) {
    (void)t->segment->Release(slot);  // RESTORED -> FREE; cannot fail here
    return read;
  }
  if (keep) {
    SetKept(t, {slot, step, reader.file_length(), reader.index_xxh3(),
                std::make_shared<const ckptd::v1::ShardIndex>(reader.index())});
  }
  return slot;
}

absl::StatusOr<std::vector<BlockDigest>> AgentCore::KeptBlocks(Trainer* t, const KeptStep& kept) {
  const TrainerRegistration& reg = t->reg;
  const ckptd::v1::ShardIndex& index = *kept.index;
  if (index.world_size() != reg.world_size || static_cast<size_t>(index.tensors_size()) != reg.buffers.size()) {
    return absl::FailedPreconditionError("the kept step was taken with other buffers");
  }
  std::vector<BlockDigest> blocks;
  for (size_t i = 0; i < reg.buffers.size(); ++i) {
    const ckptd::v1::Tensor& b = reg.buffers[i];
    const ckptd::v1::Tensor* saved = nullptr;
    for (const ckptd::v1::Tensor& x : index.tensors()) {
      if (x.name() == b.name()) saved = &x;
    }
    auto same = [](const auto& x, const auto& y) { return std::equal(x.begin(), x.end(), y.begin(), y.end()); };
    if (saved != nullptr && saved->has_replica()) {
      // A share: the index holds the checksums of the whole buffer, which
      // memory holds. The same buffer is the same box of the same tensor.
      const storage::Box member = storage::MemberBox(*saved);
      const storage::Box mine = storage::SliceBox(b);
      if (saved->dtype() != b.dtype() || !(member == mine) ||
          !same(saved->global_shape(), b.global_shape_size() > 0 ? b.global_shape() : b.shape())) {
        return absl::FailedPreconditionError(
            absl::StrCat("buffer '", absl::CHexEscape(b.name()), "' does not match the kept step"));
      }
      CKPTD_ASSIGN_OR_RETURN(const std::vector<storage::WholeBlock> whole,
                             storage::WholeBlocks(*saved, t->layout.lengths[i]));
      for (const storage::WholeBlock& w : whole) blocks.push_back({static_cast<uint32_t>(i), w.offset, w.length, w.xxh3});
      continue;
    }
    // Another slice of the same length (a resharded job) is not this buffer.
    if (saved == nullptr || saved->raw_length() != t->layout.lengths[i] || saved->dtype() != b.dtype() ||
        !same(saved->shape(), b.shape()) || !same(saved->global_shape(), b.global_shape()) ||
        !same(saved->offsets(), b.offsets())) {
      return absl::FailedPreconditionError(
          absl::StrCat("buffer '", absl::CHexEscape(b.name()), "' does not match the kept step"));
    }
    uint64_t covered = 0;
    for (const ckptd::v1::Block& block : saved->blocks()) {
      if (block.raw_offset() != covered || block.raw_length() > saved->raw_length() - covered) break;
      covered += block.raw_length();
      blocks.push_back({static_cast<uint32_t>(i), block.raw_offset(), block.raw_length(), block.raw_xxh3()});
    }
    if (covered != saved->raw_length()) {
      return absl::DataLossError(absl::StrCat("buffer '", absl::CHexEscape(b.name()), "': the kept index is damaged"));
    }
  }
  return blocks;
}

absl::Status AgentCore::VerifyKept(Trainer* t, const KeptStep& kept) {
  CKPTD_ASSIGN_OR_RETURN(const std::vector<BlockDigest> blocks, KeptBlocks(t, kept));
  const uint8_t* data = t->segment->slot_data(kept.slot);
  // Every block's checksum, on the agent's threads.
  absl::Mutex mu;
  std::optional<size_t> bad;
  base::WaitGroup done;
  for (size_t r = 0; r < blocks.size(); ++r) {
    done.Add();
    restore_pool_->Schedule([&, r] {
      const BlockDigest& b = blocks[r];
      if (format::Xxh3(data + t->layout.offsets[b.buffer] + b.offset, b.length) != b.xxh3) {
        absl::MutexLock l(&mu);
        if (!bad || r < *bad) bad = r;
      }
      done.Done();
    });
  }
  done.Wait();
  if (bad) {
    const BlockDigest& b = blocks[*bad];
    return absl::DataLossError(absl::StrCat("buffer '", absl::CHexEscape(t->reg.buffers[b.buffer].name()),
                                            "' bytes ", b.offset, "..", b.offset + b.length,
                                            " do not match their checksum"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ckptd::v1::ShardRef> AgentCore::ExpectedRef(Trainer* t, uint64_t step, const LoadCall& call) {
  if (!call.expected) return CommittedRef(t, step, call);
  if (call.expected->rank() != t->reg.rank) {
    return absl::InvalidArgumentError(absl::StrCat("the restore plan of memory checkpoint ", step,
                                                   " names the shard of rank ", call.expected->rank(), " for rank ",
                                                   t->reg.rank));
  }
  return *call.expected;
}

absl::StatusOr<ckptd::v1::ShardRef> AgentCore::CommittedRef(Trainer* t, uint64_t step, const LoadCall& call) {
  std::optional<ckptd::v1::StepManifest> read;
  if (!call.manifest) {
    CKPTD_ASSIGN_OR_RETURN(read, store_.ReadManifest(t->reg.job, step));
  }
  const ckptd::v1::StepManifest& manifest = call.manifest ? *call.manifest : *read;
  for (const ckptd::v1::ShardRef& r : manifest.shards()) {
    if (r.rank() == t->reg.rank) return r;
  }
  return absl::NotFoundError(absl::StrCat("the MANIFEST of step ", step, " has no shard of rank ", t->reg.rank));
}

bool AgentCore::HandOverKept(Trainer* t, const KeptStep& kept, LoadCall* call, absl::string_view from,
                             uint64_t* rejected) {
  const TrainerRegistration& reg = t->reg;
  std::vector<BlockDigest>* const verify = call->client_verifies ? &call->verify : nullptr;
  const uint64_t step = kept.step;
  const absl::Time start = clock_->Now();
  absl::Status verified;
  if (verify != nullptr) {
    // The trainer checks each block as it copies it out.
    absl::StatusOr<std::vector<BlockDigest>> blocks = KeptBlocks(t, kept);
    verified = blocks.status();
    if (blocks.ok()) *verify = *std::move(blocks);
  } else {
    verified = VerifyKept(t, kept);
  }
  if (!verified.ok() || !t->segment->Publish(kept.slot, step, options_.keep_in_memory).ok()) {
    {
      absl::MutexLock l(&t->mu);
      std::erase_if(t->kept, [&](const KeptStep& k) { return k.slot == kept.slot; });
      ++*rejected;
    }
    (void)t->segment->Publish(kept.slot, step);
    (void)t->segment->Release(kept.slot);  // RESTORED -> FREE
    logger_->Warning(absl::StrCat(
        "job ", reg.job, " rank ", reg.rank, ": the copy of step ", step, " in ", from, " is damaged (",
        verified.message(), "); ",
        call->expected ? "a memory checkpoint: looking for another copy in memory" : "reading it from disk"));
    return false;
  }
  logger_->Info(absl::StrCat(
      "job ", reg.job, " rank ", reg.rank, ": step ", step, " read from ", from, " (",
      verify != nullptr ? "checked by the trainer as it copies"
                        : absl::StrCat("verified in ", absl::FormatDuration(absl::Trunc(clock_->Now() - start,
                                                                                       absl::Microseconds(100)))),
      ")"));
  return true;
}

std::optional<uint32_t> AgentCore::LoadFromMemory(Trainer* t, uint64_t step, LoadCall* call) {
  std::optional<KeptStep> kept;
  {
    absl::MutexLock l(&t->mu);
    for (const KeptStep& k : t->kept) {
      if (k.step == step) kept = k;
    }
  }
  if (!kept || kept->index == nullptr) return std::nullopt;
  auto forget = [&] {
    absl::MutexLock l(&t->mu);
    std::erase_if(t->kept, [&](const KeptStep& k) { return k.slot == kept->slot && k.step == step; });
  };
  // The copy must be the shard the step committed (or, for a memory
  // checkpoint, the one reported): another attempt at the step (a run that
  // was rolled back) may have other bytes.
  absl::StatusOr<ckptd::v1::ShardRef> ref = ExpectedRef(t, step, *call);
  if (!ref.ok()) return std::nullopt;
  if (ref->index_xxh3() != kept->index_xxh3 || ref->file_length() != kept->file_length) {
    forget();
    t->segment->Unkeep(kept->slot, step);
    return std::nullopt;
  }
  // Held from now on: the trainer cannot take the slot for a snapshot.
  if (!t->segment->TakeKept(kept->slot, step)) {
    forget();
    return std::nullopt;
  }
  uint64_t rejected = 0;
  const bool ok = HandOverKept(t, *kept, call, "the agent's memory", &rejected);
  absl::MutexLock l(&t->mu);
  t->memory_rejected += rejected;
  if (!ok) return std::nullopt;
  ++t->memory_restores;
  return kept->slot;
}

absl::StatusOr<AgentCore::KeptStep> AgentCore::PullCopy(Trainer* t, uint64_t step, uint32_t slot,
                                                        const ckptd::v1::ShardRef& ref, const CopyFetch& fetch) {
  const TrainerRegistration& reg = t->reg;
  const uint64_t layout = format::Xxh3(t->key.data(), t->key.size());
  KeptStep kept{slot, step, ref.file_length(), ref.index_xxh3(), nullptr};
  auto sink = [&](const ckptd::v1::ReplicaHeader& h) -> absl::StatusOr<absl::Span<uint8_t>> {
    if (h.world_size() != reg.world_size || h.layout_xxh3() != layout) {
      return absl::FailedPreconditionError("the copy was taken with other buffers or another world size");
    }
    if (h.file_length() != ref.file_length() || h.index_xxh3() != ref.index_xxh3() ||
        format::Xxh3(h.index().data(), h.index().size()) != ref.index_xxh3()) {
      return absl::FailedPreconditionError("the copy is not of the shard the step committed");
    }
    if (h.data_bytes() > t->segment->slot_bytes()) {
      return absl::FailedPreconditionError(absl::StrCat("the copy holds ", h.data_bytes(),
                                                        " bytes, more than a staging slot's ",
                                                        t->segment->slot_bytes()));
    }
    auto index = std::make_shared<ckptd::v1::ShardIndex>();
    if (!index->ParseFromString(h.index())) return absl::DataLossError("the copy's shard index does not parse");
    kept.index = std::move(index);
    return absl::Span<uint8_t>(t->segment->slot_data(slot), h.data_bytes());
  };
  CKPTD_RETURN_IF_ERROR(fetch(sink));
  return kept;
}

absl::StatusOr<std::optional<uint32_t>> AgentCore::LoadFromPeers(Trainer* t, uint64_t step, LoadCall* call) {
  const TrainerRegistration& reg = t->reg;
  ckptd::v1::ReplicaKey key;
  key.set_job(reg.job);
  key.set_rank(reg.rank);
  key.set_step(step);
  // Where a copy may be: this agent's own store of partners' copies (the
  // replacement node may be the lost node's partner), then the peers the
  // plan names.
  struct Source {
    std::string id;    // LoadCall::skip_sources
    std::string from;  // for the log
    CopyFetch fetch;
  };
  std::vector<Source> sources;
  std::shared_ptr<const Replica> held =
      options_.replicas != nullptr && !call->skip_sources.contains(kHeldCopySource) ? options_.replicas->Find(key) : nullptr;
  if (held != nullptr) {
    sources.push_back({kHeldCopySource, "the copy this agent holds for its partner", [held](const ReplicaSink& sink) -> absl::Status {
                         CKPTD_ASSIGN_OR_RETURN(absl::Span<uint8_t> out, sink(held->header()));
                         if (out.size() != held->size()) return absl::InternalError("the copy's size changed");
                         std::memcpy(out.data(), held->data(), held->size());
                         return absl::OkStatus();
                       }});
  }
  if (options_.peer_network != nullptr) {
    for (const ckptd::v1::PeerCopy& peer : call->peers) {
      if (call->skip_sources.contains(peer.node_id())) continue;
      sources.push_back({peer.node_id(), absl::StrCat("node ", peer.node_id(), "'s memory (", peer.address(), ")"),
                         [this, peer, key](const ReplicaSink& sink) {
                           return options_.peer_network->Fetch(peer.address(), key, sink).status();
                         }});
    }
  }
  if (sources.empty()) return std::nullopt;
  absl::StatusOr<ckptd::v1::ShardRef> ref = ExpectedRef(t, step, *call);
  if (!ref.ok()) return std::nullopt;
  std::optional<uint32_t> slot;
  for (const Source& source : sources) {
    if (!slot) {
      // No slot to load into is the trainer's to hear, not a missing copy
      // (for a memory checkpoint that would send the whole job to disk).
      CKPTD_ASSIGN_OR_RETURN(slot, AcquireRestoreSlot(t, call->wait_for_slot));
      absl::MutexLock l(&t->mu);  // it may have kept an older step
      std::erase_if(t->kept, [&](const KeptStep& k) { return k.slot == *slot; });
    }
    const absl::Time start = clock_->Now();
    absl::StatusOr<KeptStep> kept = PullCopy(t, step, *slot, *ref, source.fetch);
    if (!kept.ok()) {
      {
        absl::MutexLock l(&t->mu);
        ++t->peer_rejected;
      }
      logger_->Warning(absl::StrCat("job ", reg.job, " rank ", reg.rank, ": no copy of step ", step, " from ",
                                    source.from, ": ", kept.status().message()));
      continue;
    }
    logger_->Info(absl::StrCat("job ", reg.job, " rank ", reg.rank, ": step ", step, " copied from ", source.from,
                               " in ",
                               absl::FormatDuration(absl::Trunc(clock_->Now() - start, absl::Milliseconds(1)))));
    if (options_.keep_in_memory) SetKept(t, *kept);
    uint64_t rejected = 0;
    const bool ok = HandOverKept(t, *kept, call, source.from, &rejected);
    absl::MutexLock l(&t->mu);
    t->peer_rejected += rejected;
    if (!ok) {
      slot.reset();  // free again: the next source takes one anew
      continue;
    }
    ++t->peer_restores;
    call->handed_from = source.id;
    return *slot;
  }
  if (slot) {
    (void)t->segment->Publish(*slot, step);
    (void)t->segment->Release(*slot);  // RESTORED -> FREE
  }
  return std::nullopt;
}

absl::StatusOr<std::shared_ptr<AgentCore::LoneRound>> AgentCore::JoinRound(Trainer* t) {
  const TrainerRegistration& reg = t->reg;
  // A round under way is joined; one that is over (every rank went, or it
  // failed, or it found nothing to restore) is not.
  auto joinable = [&reg](const std::shared_ptr<LoneRound>& r) {
    return r != nullptr && !r->go && r->failed.ok() && r->at < r->steps.size() && r->world_size == reg.world_size;
  };
  {
    absl::MutexLock l(&lone_mu_);
    if (std::shared_ptr<LoneRound>& round = lone_[reg.job].round; joinable(round)) return round;
  }
  auto fresh = std::make_shared<LoneRound>();
  fresh->world_size = reg.world_size;
  absl::StatusOr<std::vector<storage::StepInfo>> steps = store_.ListSteps(reg.job);
  if (!steps.ok() && !absl::IsNotFound(steps.status())) return steps.status();
  if (steps.ok()) {
    std::vector<std::pair<uint64_t, std::string>> damaged;
    size_t committed = 0;
    for (auto it = steps->rbegin(); it != steps->rend(); ++it) {
      if (it->state != StepState::kCommitted) continue;
      ++committed;
      if (it->quarantined) damaged.emplace_back(it->step, *it->quarantined);
      if (!it->quarantined) fresh->steps.push_back(it->step);
    }
    if (fresh->steps.empty() && !damaged.empty()) {
      // Starting from scratch over committed (but damaged) steps throws away
      // training: only with the operator's word (a word that cannot be read
      // allows nothing).
      absl::StatusOr<std::optional<uint64_t>> allowed = store_.FreshStartAllowedOver(reg.job);
      if (!allowed.ok() || !*allowed || **allowed < damaged.front().first) {
        fresh->held_back = store_.FreshStartRefusal(reg.job, committed, damaged);
        logger_->Warning(absl::StrCat("restore of rank ", reg.rank, " held back: ", fresh->held_back));
      }
    }
  }
  absl::MutexLock l(&lone_mu_);
  std::shared_ptr<LoneRound>& round = lone_[reg.job].round;
  if (!joinable(round)) round = std::move(fresh);  // else another rank started one meanwhile
  return round;
}

absl::StatusOr<RestoreResult> AgentCore::RestoreLocal(Trainer* t, LoadCall* call) {
  const TrainerRegistration& reg = t->reg;
  const absl::Time deadline = clock_->Now() + call->timeout;
  CKPTD_ASSIGN_OR_RETURN(std::shared_ptr<LoneRound> round, JoinRound(t));
  LoneRound* const r = round.get();
  // Newest committed step first; a damaged one sends every rank to the one before.
  while (true) {
    uint64_t step = 0;
    uint64_t attempt = 0;
    {
      absl::MutexLock l(&lone_mu_);
      if (!r->failed.ok()) return r->failed;
      if (r->at == r->steps.size()) {
        if (!r->last_damage.ok()) {
          return absl::DataLossError(absl::StrCat("no committed step of job ", reg.job,
                                                  " reads back intact; last problem: ", r->last_damage.message()));
        }
        if (!r->held_back.empty()) return absl::FailedPreconditionError(r->held_back);
        NoStepToRestore(t);
        return RestoreResult();  // nothing committed: every rank starts fresh
      }
      step = r->steps[r->at];
      attempt = r->attempt;
    }
    absl::StatusOr<uint32_t> slot = LoadStep(t, step, call);
    if (absl::IsDataLoss(slot.status()) || absl::IsNotFound(slot.status())) {
      // This agent is the job's committer (no coordinator): it marks the step
      // so that nobody restores it again. Best effort; the restore goes on.
      {
        absl::MutexLock l(&commit_mu_);
        (void)store_.QuarantineStep(reg.job, step, absl::StrCat("rank ", reg.rank, ": ", slot.status().message()));
      }
      absl::MutexLock l(&lone_mu_);
      if (r->attempt == attempt) {
        ++r->at;
        ++r->attempt;
        r->loaded.clear();
        r->last_damage = slot.status();
      }
      continue;
    }
    if (!slot.ok()) {
      // The registration does not fit, or no slot: the trainer must know, and
      // the other ranks cannot go on without this one.
      absl::MutexLock l(&lone_mu_);
      if (!r->go && r->failed.ok()) {
        r->failed = absl::Status(slot.status().code(),
                                 absl::StrCat("restore of job ", reg.job, ": rank ", reg.rank, " could not load step ",
                                              step, ": ", slot.status().message()));
      }
      return slot.status();
    }
    enum { kGo, kAgain, kFailed, kTimedOut } outcome;
    size_t loaded = 0;
    absl::Status failed;
    {
      absl::MutexLock l(&lone_mu_);
      if (r->attempt == attempt && r->failed.ok() && !r->go) {
        r->loaded.insert(reg.rank);
        if (r->loaded.size() == r->world_size) {
          r->go = true;
          // The job goes on from `step`: its shards of later steps that are
          // not committed belong to a timeline that is gone.
          LoneJob& job = lone_[reg.job];
          job.pending.erase(job.pending.upper_bound(step), job.pending.end());
          job.committed = step;
        }
      }
      // BeginShutdown wakes this (it takes lone_mu_): the agent stops
      // serving, and no rank is kept waiting for ranks that cannot come.
      auto settled = [this, r, attempt] {
        return r->go || r->attempt != attempt || !r->failed.ok() || shutting_down_.load();
      };
      clock_->AwaitWithDeadline(&lone_mu_, absl::Condition(&settled), deadline);
      if (r->attempt != attempt) {
        outcome = kAgain;
      } else if (r->go) {
        outcome = kGo;
      } else if (!r->failed.ok()) {
        outcome = kFailed;
        failed = r->failed;
      } else if (shutting_down_.load()) {
        outcome = kFailed;
        failed = absl::UnavailableError(absl::StrCat("restore of job ", reg.job, " rank ", reg.rank,
                                                     ": the agent is shutting down"));
        // The round ends for every rank: none goes on alone.
        r->failed = absl::UnavailableError(absl::StrCat("restore of job ", reg.job, ": the agent is shutting down"));
      } else {
        outcome = kTimedOut;
        loaded = r->loaded.size();
        // The round is over for every rank: a later restore starts another.
        r->failed =
            absl::DeadlineExceededError(absl::StrCat("restore of job ", reg.job, ": not every rank loaded step ", step,
                                                     " within ", absl::FormatDuration(call->timeout)));
      }
    }
    if (outcome == kGo) {
      DropLocalStepsAbove(reg.job, step);
      return Restored(t, step, *slot, call, 0);
    }
    (void)t->segment->Release(*slot);  // RESTORED -> KEPT (the step stays in memory) or FREE
    if (outcome == kFailed) return failed;
    if (outcome == kTimedOut) {
      return absl::DeadlineExceededError(absl::StrCat(
          "restore of job ", reg.job, " rank ", reg.rank, ": ", loaded, " of ", reg.world_size, " ranks loaded step ",
          step, " within ", absl::FormatDuration(call->timeout),
          "; without a coordinator every rank of the job restores through this agent, and the others did not"));
    }
    // kAgain: a rank found the step damaged; load the one before.
  }
}

absl::StatusOr<RestoreResult> AgentCore::RestoreCoordinated(Trainer* t, LoadCall* call) {
  const TrainerRegistration& reg = t->reg;
  const absl::Time deadline = clock_->Now() + call->timeout;
  ckptd::v1::RestorePlanRequest req = PlanRequestOf(reg, t->id);
  bool holding = false;  // a RESTORED slot holds req.attempt_step()
  uint32_t held = 0;

  auto release = [&] {
    if (holding) (void)t->segment->Release(held);
    holding = false;
  };
  while (true) {
    if (shutting_down_.load()) {
      release();
      return absl::UnavailableError(absl::StrCat("restore of job ", reg.job, " rank ", reg.rank,
                                                 ": the agent is shutting down"));
    }
    const absl::Duration left = deadline - clock_->Now();
    if (left <= absl::ZeroDuration()) {
      release();
      return absl::DeadlineExceededError(absl::StrCat("restore of job ", reg.job, " rank ", reg.rank,
                                                      ": the other ranks did not finish loading within ",
                                                      absl::FormatDuration(call->timeout)));
    }
    absl::StatusOr<ckptd::v1::RestorePlanResponse> plan = options_.coordinator->RestorePlan(req, left);
    if (!plan.ok()) {
      release();
      return plan.status();
    }
    switch (plan->verdict()) {
      case ckptd::v1::RestorePlanResponse::FRESH_START: {
        release();
        NoStepToRestore(t);
        DropLocalStepsAbove(reg.job, 0);
        absl::MutexLock l(&t->mu);
        t->incarnation = plan->incarnation();
        RestoreResult fresh;
        fresh.incarnation = plan->incarnation();
        return fresh;
      }
      case ckptd::v1::RestorePlanResponse::GO:
        if (holding && req.attempt_step() == plan->step()) {
          {
            absl::MutexLock l(&t->mu);
            t->incarnation = plan->incarnation();
          }
          DropLocalStepsAbove(reg.job, plan->step());
          return Restored(t, plan->step(), held, call, plan->incarnation());
        }
        // This trainer holds nothing of it (it asked again after the round
        // was decided): it loads the step, and reports, like the others.
        [[fallthrough]];
      case ckptd::v1::RestorePlanResponse::LOAD: {
        release();
        call->peers.assign(plan->peers().begin(), plan->peers().end());
        call->expected.reset();
        if (plan->memory_step()) call->expected = plan->expected();
        absl::StatusOr<uint32_t> slot = LoadStep(t, plan->step(), call);
        req.set_has_attempt(true);
        req.set_attempt_step(plan->step());
        req.set_attempt_saved_world_size(call->resharded_from);  // 0 unless loaded resharded
        req.clear_problem();
        if (slot.ok()) {
          held = *slot;
          holding = true;
          req.set_attempt_ok(true);
          req.set_attempt_source(RestoreSourceProto(call->source));
        } else if (absl::IsDataLoss(slot.status()) || absl::IsNotFound(slot.status())) {
          // Damaged or missing: the coordinator sends every rank elsewhere.
          req.set_attempt_ok(false);
          req.set_problem(std::string(slot.status().message()).substr(0, 4000));
        } else {
          return slot.status();  // the registration does not fit, or no slot: the trainer must know
        }
        break;
      }
      case ckptd::v1::RestorePlanResponse::WAIT:
        clock_->SleepFor(options_.plan_poll);
        break;
      default:
        release();
        return absl::InternalError(absl::StrCat("coordinator sent an unknown restore verdict ", plan->verdict()));
    }
  }
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
  // drained together, and the next death is noticed at once.
  absl::MutexLock l(&exit_mu_);
  std::erase_if(exit_threads_, [](ExitThread& e) {
    if (!e.done->load()) return false;
    e.thread.join();
    return true;
  });
  auto done = std::make_shared<std::atomic<bool>>(false);
  exit_threads_.push_back({std::thread([this, t = std::move(t), done, died]() mutable {
                             base::SetCallingThreadName("ckptd-exit");
                             FinishExit(std::move(t), died);
                             done->store(true);
                           }),
                           done});
}

absl::StatusOr<std::shared_ptr<AgentCore::Trainer>> AgentCore::BeginExit(uint64_t trainer_id) {
  absl::MutexLock l(&mu_);
  return BeginExitLocked(trainer_id);
}

absl::StatusOr<std::shared_ptr<AgentCore::Trainer>> AgentCore::BeginExitLocked(uint64_t trainer_id) {
  auto it = trainers_.find(trainer_id);
  if (it == trainers_.end()) return absl::NotFoundError(absl::StrCat("no trainer ", trainer_id, " is registered"));
  std::shared_ptr<Trainer> t = std::move(it->second);
  trainers_.erase(it);
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
  exiting_.push_back(t);
  return t;
}

void AgentCore::FinishExit(std::shared_ptr<Trainer> t, bool died) {
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
    std::erase(exiting_, t);
    // A segment parked while this trainer still wrote into it waits on the
    // ones before it now, if any.
    for (Parked& p : parked_) {
      if (p.draining == t) p.draining = before;
    }
    if (!t->adopted) {
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
    if (o->segment != t.segment || o->adopted) continue;
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

AgentCore::MemoryUsage AgentCore::Memory() {
  absl::MutexLock l(&mu_);
  MemoryUsage m;
  m.bytes = staging_bytes_->load();
  m.budget = options_.memory_budget_bytes;
  m.parked = parked_.size();
  for (const Parked& p : parked_) m.parked_bytes += p.segment->total_bytes();
  return m;
}

absl::StatusOr<PersistStatus> AgentCore::WaitPersisted(uint64_t trainer_id, uint64_t step, absl::Duration timeout) {
  std::shared_ptr<Trainer> t = Find(trainer_id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no trainer ", trainer_id, " is registered"));
  absl::MutexLock l(&t->mu);
  Trainer* tr = t.get();
  auto done = [tr, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(tr->mu) {
    return (tr->status.last_persisted_step && *tr->status.last_persisted_step >= step) ||
           (tr->status.last_memory_step && *tr->status.last_memory_step >= step) ||
           (tr->status.last_failed_step && *tr->status.last_failed_step >= step);
  };
  if (!clock_->AwaitWithTimeout(&t->mu, absl::Condition(&done), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("step ", step, " of trainer ", trainer_id, " not persisted within ", absl::FormatDuration(timeout)));
  }
  return t->StatusLocked();
}

absl::StatusOr<PersistStatus> AgentCore::Status(uint64_t trainer_id) {
  std::shared_ptr<Trainer> t = Find(trainer_id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no trainer ", trainer_id, " is registered"));
  absl::MutexLock l(&t->mu);
  return t->StatusLocked();
}

}  // namespace ckptd::agent
