// AgentCore: the steps kept in memory: kept and replicated, dropped,
// damaged by a drill, and written to storage on the coordinator's order
// (emergency persists).
#include "agent/agent_core.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "agent/agent_core_internal.h"
#include "base/format.h"
#include "base/status_macros.h"
#include "format/checksum.h"
#include "format/tensor_size.h"
#include "storage/layout.h"
#include "storage/replica.h"
#include "storage/shard_index.h"

namespace ckptd::agent {

using base::ByteUnits;
using base::FormatBytes;
using internal::ForgetTakenBack;
using internal::ShardRefOf;

namespace {

// The kept steps above `step` go: their slots are freed.
template <typename Kept>
void FreeKeptAbove(staging::StagingSegment* segment, std::vector<Kept>* kept, uint64_t step) {
  std::erase_if(*kept, [&](const Kept& k) {
    if (k.step <= step) return false;
    segment->Unkeep(k.slot, k.step);
    return true;
  });
}

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
  replication::ReplicaSource source;
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
    CKPTD_ASSIGN_OR_RETURN(std::optional<HeldCopy> held, PartnersCopy(order));
    if (held) return *std::move(held);
  }
  return absl::NotFoundError("this node holds no copy of it in memory");
}

absl::StatusOr<std::optional<AgentCore::HeldCopy>> AgentCore::PartnersCopy(const ckptd::v1::PersistOrder& order) {
  ckptd::v1::ReplicaKey key;
  key.set_job(order.job());
  key.set_rank(order.rank());
  key.set_step(order.step());
  std::shared_ptr<const replication::Replica> held = options_.replicas->Find(key);
  if (held == nullptr || held->header().file_length() != order.file_length() ||
      held->header().index_xxh3() != order.index_xxh3()) {
    return std::nullopt;
  }
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
                             FormatBytes(written->raw_bytes, ByteUnits::kGiB), ")"));
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

}  // namespace ckptd::agent
