#include "agent/agent_core.h"

#include <unistd.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "storage/layout.h"
#include "storage/shard_index.h"
#include "storage/shard_reader.h"
#include "storage/status_macros.h"

namespace ckptd::agent {

using storage::StepState;

struct AgentCore::Trainer {
  uint64_t id = 0;
  TrainerRegistration reg;
  StagingLayout layout;
  std::unique_ptr<StagingSegment> segment;
  std::thread persister;

  absl::Mutex mu;
  bool wake ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  PersistStatus status ABSL_GUARDED_BY(mu);
  std::optional<uint64_t> last_failed_step ABSL_GUARDED_BY(mu);
};

AgentCore::AgentCore(storage::FileSystem* fs, AgentOptions options)
    : fs_(fs),
      options_(std::move(options)),
      store_(fs, options_.storage_root),
      pool_(options_.io_threads) {}

AgentCore::~AgentCore() {
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

std::shared_ptr<AgentCore::Trainer> AgentCore::Find(uint64_t trainer_id) {
  absl::MutexLock l(&mu_);
  auto it = trainers_.find(trainer_id);
  return it == trainers_.end() ? nullptr : it->second;
}

absl::StatusOr<TrainerHandle> AgentCore::Register(const TrainerRegistration& reg) {
  CKPTD_RETURN_IF_ERROR(storage::ValidateJobName(reg.job));
  if (reg.world_size == 0 || reg.rank >= reg.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", reg.rank, " is not inside world size ", reg.world_size));
  }
  if (reg.buffers.empty()) return absl::InvalidArgumentError("no buffers registered");
  std::vector<uint64_t> lengths;
  absl::flat_hash_set<std::string> names;
  for (const ckptd::v1::Tensor& b : reg.buffers) {
    CKPTD_RETURN_IF_ERROR(storage::ValidateTensorMeta(b, "register"));
    if (!names.insert(b.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("buffer '", absl::CHexEscape(b.name()), "' is registered twice"));
    }
    CKPTD_ASSIGN_OR_RETURN(uint64_t length, storage::TensorByteLength(b));
    lengths.push_back(length);
  }
  auto t = std::make_shared<Trainer>();
  t->reg = reg;
  t->layout = PlanLayout(lengths);
  const uint64_t budget =
      options_.staging_budget_bytes != 0 ? options_.staging_budget_bytes : options_.slots * t->layout.slot_bytes;
  CKPTD_ASSIGN_OR_RETURN(uint32_t slots, SlotsWithinBudget(t->layout.slot_bytes, options_.slots, budget));
  {
    absl::MutexLock l(&mu_);
    t->id = next_id_++;
  }
  const std::string prefix =
      options_.segment_prefix.empty() ? absl::StrCat("/ckptd-", ::getpid()) : options_.segment_prefix;
  CKPTD_ASSIGN_OR_RETURN(t->segment,
                         StagingSegment::Create(absl::StrCat(prefix, "-", t->id), slots, t->layout.slot_bytes));
  TrainerHandle handle;
  handle.trainer_id = t->id;
  handle.segment = t->segment->name();
  handle.slots = slots;
  handle.slot_bytes = t->layout.slot_bytes;
  handle.offsets = t->layout.offsets;
  Trainer* raw = t.get();
  t->persister = std::thread([this, raw] { PersistLoop(raw); });
  absl::MutexLock l(&mu_);
  trainers_[handle.trainer_id] = std::move(t);
  return handle;
}

absl::Status AgentCore::SnapshotPublished(uint64_t trainer_id, uint32_t slot, uint64_t step) {
  std::shared_ptr<Trainer> t = Find(trainer_id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no trainer ", trainer_id, " is registered"));
  if (slot >= t->segment->slots()) {
    return absl::InvalidArgumentError(absl::StrCat("staging slot ", slot, " does not exist"));
  }
  absl::MutexLock l(&t->mu);
  t->wake = true;
  return absl::OkStatus();
}

void AgentCore::PersistLoop(Trainer* t) {
  while (true) {
    bool stop;
    {
      absl::MutexLock l(&t->mu);
      // Also polls: a trainer may publish and die before it could notify.
      t->mu.AwaitWithTimeout(absl::Condition(
                                 +[](Trainer* tr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tr->mu) {
                                   return tr->wake || tr->stopping;
                                 },
                                 t),
                             absl::Milliseconds(100));
      t->wake = false;
      stop = t->stopping;
    }
    while (std::optional<uint32_t> slot = t->segment->TakeReady()) {
      const uint64_t step = t->segment->step(*slot);
      absl::Status s = PersistOne(t, *slot);
      // The slot is free again whatever happened: training goes on.
      (void)t->segment->Release(*slot);
      absl::MutexLock l(&t->mu);
      if (s.ok()) {
        t->status.last_persisted_step = step;
        ++t->status.persisted;
        if (t->reg.world_size == 1) t->status.last_committed_step = step;
      } else {
        ++t->status.failed;
        t->status.last_error = s;
        t->last_failed_step = step;
      }
    }
    if (stop) return;
  }
}

absl::Status AgentCore::PersistOne(Trainer* t, uint32_t slot) {
  const TrainerRegistration& reg = t->reg;
  const uint64_t step = t->segment->step(slot);
  std::vector<storage::TensorSource> sources(reg.buffers.size());
  for (size_t i = 0; i < reg.buffers.size(); ++i) {
    sources[i].meta = reg.buffers[i];
    sources[i].data = t->segment->slot_data(slot) + t->layout.offsets[i];
    sources[i].length = t->layout.lengths[i];
  }
  CKPTD_RETURN_IF_ERROR(store_.PrepareStep(reg.job, step));
  CKPTD_ASSIGN_OR_RETURN(storage::ShardWriteResult written,
                         store_.WriteShard(reg.job, step, reg.rank, reg.world_size, sources, options_.write, &pool_));
  if (reg.world_size != 1) return absl::OkStatus();  // the coordinator commits multi-rank steps
  // No coordinator needed: this agent sees every shard of the step.
  absl::MutexLock l(&commit_mu_);
  ckptd::v1::ShardRef ref;
  ref.set_rank(reg.rank);
  ref.set_file(storage::ShardFileName(reg.rank));
  ref.set_file_length(written.file_length);
  ref.set_index_xxh3(written.index_xxh3);
  std::vector<ckptd::v1::ShardRef> reported{ref};
  CKPTD_RETURN_IF_ERROR(store_.CommitStep(reg.job, step, 1, &reported).status());
  CKPTD_RETURN_IF_ERROR(store_.ApplyRetention(reg.job, options_.keep_last).status());
  return store_.RemoveIncompleteSteps(reg.job, step).status();
}

absl::StatusOr<RestoreResult> AgentCore::Restore(uint64_t trainer_id, absl::Duration wait_for_slot) {
  std::shared_ptr<Trainer> t = Find(trainer_id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no trainer ", trainer_id, " is registered"));
  const TrainerRegistration& reg = t->reg;
  absl::StatusOr<std::vector<storage::StepInfo>> steps = store_.ListSteps(reg.job);
  RestoreResult result;
  if (absl::IsNotFound(steps.status())) return result;
  CKPTD_RETURN_IF_ERROR(steps.status());
  absl::Status last_damage;
  // Newest committed step first; a damaged one falls back to the one before.
  for (auto it = steps->rbegin(); it != steps->rend(); ++it) {
    if (it->state != StepState::kCommitted) continue;
    const uint64_t step = it->step;
    const std::string path = storage::ShardPath(options_.storage_root, reg.job, step, reg.rank);
    absl::StatusOr<std::unique_ptr<storage::ShardReader>> reader =
        storage::ShardReader::Open(fs_, path, storage::ShardReadOptions(), &pool_);
    if (absl::IsDataLoss(reader.status())) {
      last_damage = reader.status();
      continue;
    }
    CKPTD_RETURN_IF_ERROR(reader.status());
    const ckptd::v1::ShardIndex& index = (*reader)->index();
    if (index.world_size() != reg.world_size) {
      return absl::FailedPreconditionError(absl::StrCat("step ", step, " was saved by a world of ", index.world_size(),
                                                        " ranks; this job runs ", reg.world_size));
    }
    std::vector<storage::TensorDest> dests;
    absl::flat_hash_set<std::string> registered;
    for (size_t i = 0; i < reg.buffers.size(); ++i) {
      const ckptd::v1::Tensor& b = reg.buffers[i];
      registered.insert(b.name());
      const ckptd::v1::Tensor* saved = (*reader)->FindTensor(b.name());
      const std::string name = absl::CHexEscape(b.name());
      if (saved == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("buffer '", name, "' is not in the checkpoint of step ", step));
      }
      if (saved->dtype() != b.dtype() || saved->raw_length() != t->layout.lengths[i]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "buffer '", name, "' is registered as ", storage::DTypeName(b.dtype()), " of ", t->layout.lengths[i],
            " bytes but step ", step, " holds ", storage::DTypeName(saved->dtype()), " of ", saved->raw_length(),
            " bytes"));
      }
      dests.push_back({b.name(), nullptr, t->layout.lengths[i]});
    }
    for (const ckptd::v1::Tensor& saved : index.tensors()) {
      if (!registered.contains(saved.name())) {
        return absl::FailedPreconditionError(absl::StrCat("step ", step, " holds tensor '",
                                                          absl::CHexEscape(saved.name()),
                                                          "' that is not registered"));
      }
    }
    CKPTD_ASSIGN_OR_RETURN(uint32_t slot, t->segment->AcquireForRestore(wait_for_slot));
    for (size_t i = 0; i < dests.size(); ++i) dests[i].data = t->segment->slot_data(slot) + t->layout.offsets[i];
    absl::Status read = (*reader)->ReadTensors(dests);
    // Publish either way; on failure hand the slot straight back.
    CKPTD_RETURN_IF_ERROR(t->segment->Publish(slot, step));
    if (!read.ok()) {
      (void)t->segment->Release(slot);  // RESTORED -> FREE; cannot fail here
      if (absl::IsDataLoss(read)) {
        last_damage = read;
        continue;
      }
      return read;
    }
    result.step = step;
    result.slot = slot;
    return result;
  }
  if (!last_damage.ok()) {
    return absl::DataLossError(absl::StrCat("no committed step of job ", reg.job,
                                            " reads back intact; last problem: ", last_damage.message()));
  }
  return result;
}

absl::Status AgentCore::TrainerExited(uint64_t trainer_id) {
  std::shared_ptr<Trainer> t;
  {
    absl::MutexLock l(&mu_);
    auto it = trainers_.find(trainer_id);
    if (it == trainers_.end()) return absl::NotFoundError(absl::StrCat("no trainer ", trainer_id, " is registered"));
    t = std::move(it->second);
    trainers_.erase(it);
  }
  t->segment->ReclaimAfterTrainerExit();
  {
    absl::MutexLock l(&t->mu);
    t->stopping = true;  // the persister drains READY slots first
  }
  t->persister.join();
  return absl::OkStatus();
}

absl::StatusOr<PersistStatus> AgentCore::WaitPersisted(uint64_t trainer_id, uint64_t step, absl::Duration timeout) {
  std::shared_ptr<Trainer> t = Find(trainer_id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no trainer ", trainer_id, " is registered"));
  absl::MutexLock l(&t->mu);
  Trainer* tr = t.get();
  auto done = [tr, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(tr->mu) {
    return (tr->status.last_persisted_step && *tr->status.last_persisted_step >= step) ||
           (tr->last_failed_step && *tr->last_failed_step >= step);
  };
  if (!t->mu.AwaitWithTimeout(absl::Condition(&done), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("step ", step, " of trainer ", trainer_id, " not persisted within ", absl::FormatDuration(timeout)));
  }
  return t->status;
}

absl::StatusOr<PersistStatus> AgentCore::Status(uint64_t trainer_id) {
  std::shared_ptr<Trainer> t = Find(trainer_id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no trainer ", trainer_id, " is registered"));
  absl::MutexLock l(&t->mu);
  return t->status;
}

}  // namespace ckptd::agent
