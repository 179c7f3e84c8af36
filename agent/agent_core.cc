// AgentCore: construction and shutdown, the trainers' progress and status,
// and what the coordinator hears of them (heartbeats, committed steps).
// Each other concern has a file of its own: agent_lifecycle.cc,
// agent_persist.cc, agent_lone.cc, agent_memory_tier.cc, agent_restore.cc,
// agent_restore_memory.cc, agent_reshard.cc.
#include "agent/agent_core.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "agent/agent_core_internal.h"
#include "storage/layout.h"

namespace ckptd::agent {

using internal::ForgetTakenBack;
using internal::GpuOf;

namespace internal {

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

}  // namespace internal

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
  // Trainers that died: their last snapshots are written (as before; here,
  // those whose exit thread could not be started). Joined outside exit_mu_:
  // each takes it for the next exit queued.
  std::vector<ExitThread> exits;
  {
    absl::MutexLock l(&exit_mu_);
    exits.swap(exit_threads_);
  }
  for (ExitThread& e : exits) e.thread.join();
  FinishPendingExits();
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
  // The persisters too (nice 19 otherwise): on CPUs a trainer keeps busy
  // they would take seconds to notice the deadline and clean up.
  absl::Status raised = pool_.workers_raised();
  if (options_.background_priority != base::ThreadPriority::kNormal) {
    const int nice = base::CallingThreadNice();
    for (const std::shared_ptr<Trainer>& t : trainers) {
      if (const int tid = t->persister_tid.load(); tid != 0) {
        if (absl::Status s = base::RaiseThreadPriority(tid, nice); !s.ok() && raised.ok()) raised = s;
      }
    }
  }
  if (!raised.ok()) {
    logger_->Warning(absl::StrCat("the persists left for the shutdown stay at ",
                                  base::ThreadPriorityName(options_.background_priority),
                                  " priority (", raised.message(),
                                  "): on busy CPUs they may not end within --shutdown-grace; give the agent "
                                  "CAP_SYS_NICE, or run it with --background-priority normal"));
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

absl::Status AgentCore::SnapshotPublished(uint64_t trainer_id, uint32_t slot, uint64_t step, double stall_seconds) {
  std::shared_ptr<Trainer> t = Find(trainer_id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no trainer ", trainer_id, " is registered"));
  if (slot >= t->segment->slots()) {
    return absl::InvalidArgumentError(absl::StrCat("staging slot ", slot, " does not exist"));
  }
  const absl::Time now = clock_->Now();
  absl::MutexLock l(&t->mu);
  t->wake = true;
  if (std::isfinite(stall_seconds) && stall_seconds >= 0) t->stall_by_slot[slot] = stall_seconds;
  t->published_by_slot[slot] = {step, now};
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
  if (options_.replicator != nullptr) {
    const replication::ReplicationStats st = options_.replicator->Stats();
    hb->set_replicate_seconds(st.last_round_seconds);
    hb->set_replication_sent(st.sent);
    hb->set_replication_failed(st.failed);
    if (!st.last_error.ok()) hb->set_replication_error(std::string(st.last_error.message().substr(0, 1024)));
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
  if (options_.observer != nullptr) options_.observer->OnSnapshotSkipped(t->reg.job);
  return absl::OkStatus();
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

AgentCore::MemoryUsage AgentCore::Memory() {
  absl::MutexLock l(&mu_);
  MemoryUsage m;
  m.bytes = staging_bytes_->load();
  m.budget = options_.memory_budget_bytes;
  m.parked = parked_.size();
  auto add_kept = [&m](const staging::StagingSegment& segment, const std::vector<KeptStep>& kept) {
    for (const KeptStep& k : kept) {
      if (!internal::TakenBack(segment, k)) m.kept_bytes += segment.slot_bytes();
    }
  };
  for (const Parked& p : parked_) {
    m.parked_bytes += p.segment->total_bytes();
    add_kept(*p.segment, p.kept);
  }
  for (const auto& [id, t] : trainers_) {
    absl::MutexLock tl(&t->mu);
    add_kept(*t->segment, t->kept);
  }
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
