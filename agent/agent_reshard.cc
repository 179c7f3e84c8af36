// AgentCore: restores of a step saved by another number of ranks, or with
// other slices (elastic restore; docs/elastic.md).
#include "agent/agent_core.h"

#include <map>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "agent/agent_core_internal.h"
#include "base/format.h"
#include "base/status_macros.h"
#include "format/tensor_size.h"
#include "storage/replica.h"
#include "storage/reshard.h"
#include "storage/reshard_plan.h"
#include "storage/shard_index.h"

namespace ckptd::agent {

using base::ByteUnits;
using base::FormatBytes;

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
  ReshardRead rr;
  rr.step = step;
  rr.manifest = &manifest;
  // A buffer without a global layout is rank `own`'s: its own copy, or put
  // together from the shares of `own`'s group (told by the identity of the
  // whole its members store). The coordinator's plan is held to that.
  rr.own = reg.rank % saved_world;
  bool planned = false;
  CKPTD_ASSIGN_OR_RETURN(const std::vector<storage::PlannedRead> reads,
                         PlanResharded(t, step, manifest, &rr.readers, &planned, ask_coordinator));
  uint64_t bytes = 0;
  for (uint64_t length : t->layout.lengths) bytes += length;
  // Before the slot is taken: an error here (the own shard does not open)
  // has nothing to give back.
  if (planned) CKPTD_RETURN_IF_ERROR(NoteGroupWholes(t, reads, &rr));
  CKPTD_ASSIGN_OR_RETURN(uint32_t slot, AcquireRestoreSlot(t, wait_for_slot));
  absl::Status read = ReadPlanned(t, reads, t->segment->slot_data(slot), &rr);
  // Kept in memory when the slot holds what this rank's own shard of the
  // step describes: the same world, the shard's index checking every byte
  // (its shares of replicated buffers carry the checksums of the whole).
  std::optional<KeptStep> own_shard;
  if (read.ok() && saved_world == reg.world_size) own_shard = OwnShardIn(t, slot, &rr, &read);
  const bool keep = own_shard.has_value() && options_.keep_in_memory;
  CKPTD_RETURN_IF_ERROR(t->segment->Publish(slot, step, keep));
  if (!read.ok()) {
    (void)t->segment->Release(slot);  // RESTORED -> FREE; cannot fail here
    if (planned && rr.plan_wrong) {
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
                             own_shard ? "from its replica group's shares in " : "resharded from ", rr.ranks.size(),
                             rr.ranks.size() == 1 ? " shard, " : " shards, ", FormatBytes(bytes, ByteUnits::kGiB),
                             planned ? ", planned by the coordinator"
                                     : absl::StrCat(", planned from the ", saved_world, " saved indexes")));
  if (!own_shard) {
    *resharded = true;
    absl::MutexLock l(&t->mu);
    ++t->resharded_restores;
  }
  return slot;
}

absl::Status AgentCore::NoteGroupWholes(Trainer* t, const std::vector<storage::PlannedRead>& reads, ReshardRead* rr) {
  const TrainerRegistration& reg = t->reg;
  const ckptd::v1::ShardIndex* own_saved = nullptr;
  std::unique_ptr<storage::ShardReader> opened;
  for (const storage::PlannedRead& r : reads) {
    if (reg.buffers[r.buffer].global_shape_size() > 0 || rr->whole_of.contains(r.buffer)) continue;
    if (own_saved == nullptr) {
      if (auto it = rr->readers.find(rr->own); it != rr->readers.end()) {
        own_saved = &it->second->index();
      } else {
        CKPTD_ASSIGN_OR_RETURN(opened, OpenSavedShard(t, rr->step, *rr->manifest, rr->own));
        own_saved = &opened->index();
      }
    }
    for (const ckptd::v1::Tensor& x : own_saved->tensors()) {
      if (x.name() == reg.buffers[r.buffer].name()) {
        rr->whole_of[r.buffer] = x.has_replica() ? storage::WholeIdentity(x) : std::string();
      }
    }
  }
  if (opened != nullptr) rr->readers[rr->own] = std::move(opened);  // read from as well, most likely
  return absl::OkStatus();
}

absl::Status AgentCore::ReadPlanned(Trainer* t, const std::vector<storage::PlannedRead>& reads, uint8_t* data,
                                    ReshardRead* rr) {
  const TrainerRegistration& reg = t->reg;
  absl::Status read;
  for (size_t at = 0; read.ok() && at < reads.size();) {
    const uint32_t rank = reads[at].rank;
    rr->ranks.insert(rank);
    std::unique_ptr<storage::ShardReader> reader;
    if (auto it = rr->readers.find(rank); it != rr->readers.end()) {
      reader = std::move(it->second);
      rr->readers.erase(it);
    } else {
      absl::StatusOr<std::unique_ptr<storage::ShardReader>> opened = OpenSavedShard(t, rr->step, *rr->manifest, rank);
      read = opened.status();
      if (opened.ok()) reader = *std::move(opened);
    }
    for (; read.ok() && at < reads.size() && reads[at].rank == rank; ++at) {
      const storage::PlannedRead& r = reads[at];
      read = CheckPlannedRead(t, *reader, r, rr);
      rr->plan_wrong = !read.ok();
      if (read.ok()) {
        const ckptd::v1::Tensor& b = reg.buffers[r.buffer];
        read = storage::ReadIntoSlice(*reader, b.name(), r.source, r.target, format::DTypeSize(b.dtype()),
                                      data + t->layout.offsets[r.buffer]);
      }
    }
    if (read.ok() && rank == reg.rank) {
      rr->own_index = std::make_shared<const ckptd::v1::ShardIndex>(reader->index());
    }
  }
  return read;
}

absl::Status AgentCore::CheckPlannedRead(Trainer* t, storage::ShardReader& reader, const storage::PlannedRead& r,
                                         ReshardRead* rr) {
  const uint32_t rank = r.rank;
  const uint32_t own = rr->own;
  const ckptd::v1::Tensor& b = t->reg.buffers[r.buffer];
  const std::string where = absl::StrCat("rank ", rank, "'s shard of step ", rr->step);
  const ckptd::v1::Tensor* saved = reader.FindTensor(b.name());
  if (saved == nullptr) {
    return absl::DataLossError(
        absl::StrCat(where, " holds no tensor '", absl::CHexEscape(b.name()), "', which the plan reads"));
  }
  CKPTD_RETURN_IF_ERROR(storage::CheckPlannedSource(*saved, rank, b, r.source, where));
  if (b.global_shape_size() > 0) return absl::OkStatus();
  if (!saved->has_replica()) {
    if (rank != own || rr->whole_of[r.buffer] != "") {
      return absl::DataLossError(absl::StrCat("the plan reads buffer '", absl::CHexEscape(b.name()), "' from rank ",
                                              rank, "'s shard; without a global layout it is rank ", own,
                                              "'s, whole"));
    }
  } else if (const std::string whole = storage::WholeIdentity(*saved);
             rr->whole_of.emplace(r.buffer, whole).first->second != whole) {
    return absl::DataLossError(absl::StrCat(where, ": its share of buffer '", absl::CHexEscape(b.name()),
                                            "' is of another buffer than rank ", own, "'s replica group holds"));
  }
  return absl::OkStatus();
}

std::optional<AgentCore::KeptStep> AgentCore::OwnShardIn(Trainer* t, uint32_t slot, ReshardRead* rr,
                                                         absl::Status* read) {
  const TrainerRegistration& reg = t->reg;
  if (rr->own_index == nullptr) {
    std::unique_ptr<storage::ShardReader> reader;
    if (auto it = rr->readers.find(reg.rank); it != rr->readers.end()) {
      reader = std::move(it->second);
    } else if (absl::StatusOr<std::unique_ptr<storage::ShardReader>> opened =
                   OpenSavedShard(t, rr->step, *rr->manifest, reg.rank);
               opened.ok()) {
      reader = *std::move(opened);
    }
    if (reader != nullptr) rr->own_index = std::make_shared<const ckptd::v1::ShardIndex>(reader->index());
  }
  std::optional<KeptStep> own_shard;
  for (const ckptd::v1::ShardRef& ref : rr->manifest->shards()) {
    if (ref.rank() != reg.rank || rr->own_index == nullptr) continue;
    KeptStep k{slot, rr->step, ref.file_length(), ref.index_xxh3(), rr->own_index};
    if (!KeptBlocks(t, k).ok()) continue;
    // What the group's shares made must be what this rank saved, every
    // byte: its own index holds the checksums of its whole buffers.
    if (absl::Status v = VerifyKept(t, k); !v.ok()) {
      *read = absl::DataLossError(absl::StrCat("step ", rr->step, ": the shares of rank ", reg.rank,
                                               "'s replica groups do not make the buffers it saved: ", v.message()));
      rr->plan_wrong = true;  // another group's shares, if the coordinator chose them
      break;
    }
    own_shard = k;
  }
  return own_shard;
}

}  // namespace ckptd::agent
