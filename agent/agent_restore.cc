// AgentCore: restores, with and without a coordinator: which copy of a
// step is read (memory, peers, the node-local tier, the storage root), and
// the restore plan's round with the coordinator.
#include "agent/agent_core.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/agent_core_internal.h"
#include "base/status_macros.h"
#include "storage/layout.h"
#include "storage/replica.h"
#include "storage/shard_index.h"
#include "storage/shard_reader.h"

namespace ckptd::agent {

using internal::GpuOf;

namespace {

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

}  // namespace

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
  const absl::Time start = clock_->Now();
  absl::StatusOr<RestoreResult> r =
      options.reread_step ? Reread(t.get(), options, &call) : RestoreRound(t.get(), &call);
  if (options_.observer != nullptr) {
    if (!r.ok()) {
      options_.observer->OnRestoreFailed(t->reg.job);
    } else if (r->step) {  // a fresh start restores nothing
      uint64_t bytes = 0;
      for (const uint64_t length : t->layout.lengths) bytes += length;
      options_.observer->OnRestored(t->reg.job, r->source, bytes, absl::ToDoubleSeconds(clock_->Now() - start));
    }
  }
  return r;
}

absl::StatusOr<RestoreResult> AgentCore::RestoreRound(Trainer* t, LoadCall* call) {
  absl::StatusOr<RestoreResult> r =
      options_.coordinator != nullptr ? RestoreCoordinated(t, call) : RestoreLocal(t, call);
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
    t->restored_expected = r->step ? call->expected : std::nullopt;
    t->restored_peers = r->step ? call->peers : std::vector<ckptd::v1::PeerCopy>();
    t->restored_from = call->handed_from;
    t->rejected_sources.clear();
  }
  return r;
}

absl::StatusOr<RestoreResult> AgentCore::Reread(Trainer* t, const RestoreOptions& options, LoadCall* call) {
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
    call->expected = t->restored_expected;
    if (call->expected) call->peers = t->restored_peers;
    // The copy the trainer found damaged, and any before it, are not read
    // again: the next peer holding the step is.
    if (!t->restored_from.empty()) t->rejected_sources.insert(t->restored_from);
    call->skip_sources = t->rejected_sources;
    for (const KeptStep& k : t->kept) {
      if (k.step == step) t->segment->Unkeep(k.slot, k.step);
    }
    std::erase_if(t->kept, [step](const KeptStep& k) { return k.step == step; });
  }
  logger_->Warning(
      absl::StrCat("job ", t->reg.job, " rank ", t->reg.rank, ": the copy of step ", step,
                   " in the agent's memory failed the trainer's check (", options.reread_problem.substr(0, 1000), "); ",
                   call->expected ? "a memory checkpoint: reading it from a peer's memory" : "reading it from disk"));
  call->from_memory = false;
  CKPTD_ASSIGN_OR_RETURN(const uint32_t slot, LoadStep(t, step, call));
  {
    absl::MutexLock l(&t->mu);
    t->restored_from = call->handed_from;
  }
  if (options_.coordinator != nullptr) {
    // The coordinator heard the rank read the step from memory: it learns
    // where it was read in the end (the restore stands either way).
    const TrainerRegistration& reg = t->reg;
    ckptd::v1::RestorePlanRequest req = PlanRequestOf(reg, t->id);
    req.set_has_attempt(true);
    req.set_attempt_step(step);
    req.set_attempt_ok(true);
    req.set_attempt_source(RestoreSourceProto(call->source));
    req.set_attempt_saved_world_size(call->resharded_from);
    req.set_reread(true);
    if (absl::Status told = options_.coordinator->RestorePlan(req, options_.restore_timeout).status(); !told.ok()) {
      logger_->Warning(absl::StrCat("job ", reg.job, " rank ", reg.rank,
                                    ": the coordinator could not be told that step ", step,
                                    " was read from disk after all: ", told.message()));
    }
  }
  return Restored(t, step, slot, call, incarnation);
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
  // The coordinator out of reach (it restarts, a standby takes over from a
  // leader that died, this agent registers again with the new one): the
  // plan is asked for again, with what was loaded kept, until the deadline.
  absl::Status unreachable;
  absl::Duration pause = options_.plan_poll;
  std::string warning;  // the newest plan's that had one
  while (true) {
    if (shutting_down_.load()) {
      release();
      return absl::UnavailableError(absl::StrCat("restore of job ", reg.job, " rank ", reg.rank,
                                                 ": the agent is shutting down"));
    }
    const absl::Duration left = deadline - clock_->Now();
    if (left <= absl::ZeroDuration()) {
      release();
      if (!unreachable.ok()) {
        return absl::DeadlineExceededError(absl::StrCat("restore of job ", reg.job, " rank ", reg.rank,
                                                        ": no restore plan within ",
                                                        absl::FormatDuration(call->timeout), ": ",
                                                        unreachable.message()));
      }
      return absl::DeadlineExceededError(absl::StrCat("restore of job ", reg.job, " rank ", reg.rank,
                                                      ": the other ranks did not finish loading within ",
                                                      absl::FormatDuration(call->timeout)));
    }
    absl::StatusOr<ckptd::v1::RestorePlanResponse> plan = options_.coordinator->RestorePlan(req, left);
    if (!plan.ok()) {
      // NotFound: the coordinator does not know this agent's session (a new
      // leader, before the agent registered with it).
      const absl::Status& s = plan.status();
      if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsNotFound(s)) {
        if (unreachable.ok()) {
          logger_->Warning(absl::StrCat("restore of job ", reg.job, " rank ", reg.rank, ": ", s.message(),
                                        "; asking again until ", absl::FormatDuration(left), " from now"));
        }
        unreachable = s;
        clock_->SleepFor(std::min(pause, deadline - clock_->Now()));
        pause = std::min(pause * 2, absl::Seconds(1));
        continue;
      }
      release();
      return plan.status();
    }
    if (!unreachable.ok()) {
      logger_->Info(absl::StrCat("restore of job ", reg.job, " rank ", reg.rank, ": the coordinator answers again"));
      unreachable = absl::OkStatus();
      pause = options_.plan_poll;
    }
    if (!plan->warning().empty()) warning = plan->warning();
    switch (plan->verdict()) {
      case ckptd::v1::RestorePlanResponse::FRESH_START: {
        release();
        RestoreResult fresh = StartFresh(t, plan->incarnation());
        fresh.warning = std::move(warning);
        return fresh;
      }
      case ckptd::v1::RestorePlanResponse::GO:
        if (holding && req.attempt_step() == plan->step()) {
          {
            absl::MutexLock l(&t->mu);
            t->incarnation = plan->incarnation();
          }
          DropLocalStepsAbove(reg.job, plan->step());
          RestoreResult restored = Restored(t, plan->step(), held, call, plan->incarnation());
          restored.warning = std::move(warning);
          return restored;
        }
        // This trainer holds nothing of it (it asked again after the round
        // was decided): it loads the step, and reports, like the others.
        [[fallthrough]];
      case ckptd::v1::RestorePlanResponse::LOAD: {
        release();
        CKPTD_ASSIGN_OR_RETURN(const std::optional<uint32_t> slot, LoadPlanned(t, *plan, call, &req));
        holding = slot.has_value();
        held = slot.value_or(0);
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


RestoreResult AgentCore::StartFresh(Trainer* t, uint64_t incarnation) {
  NoStepToRestore(t);
  DropLocalStepsAbove(t->reg.job, 0);
  absl::MutexLock l(&t->mu);
  t->incarnation = incarnation;
  RestoreResult fresh;
  fresh.incarnation = incarnation;
  return fresh;
}

absl::StatusOr<std::optional<uint32_t>> AgentCore::LoadPlanned(Trainer* t, const ckptd::v1::RestorePlanResponse& plan,
                                                               LoadCall* call, ckptd::v1::RestorePlanRequest* req) {
  call->peers.assign(plan.peers().begin(), plan.peers().end());
  call->expected.reset();
  if (plan.memory_step()) call->expected = plan.expected();
  absl::StatusOr<uint32_t> slot = LoadStep(t, plan.step(), call);
  req->set_has_attempt(true);
  req->set_attempt_step(plan.step());
  req->set_attempt_saved_world_size(call->resharded_from);  // 0 unless loaded resharded
  req->clear_problem();
  if (slot.ok()) {
    req->set_attempt_ok(true);
    req->set_attempt_source(RestoreSourceProto(call->source));
    return *slot;
  }
  if (absl::IsDataLoss(slot.status()) || absl::IsNotFound(slot.status())) {
    // Damaged or missing: the coordinator sends every rank elsewhere.
    req->set_attempt_ok(false);
    req->set_problem(std::string(slot.status().message()).substr(0, 4000));
    return std::nullopt;
  }
  return slot.status();  // the registration does not fit, or no slot: the trainer must know
}

}  // namespace ckptd::agent
