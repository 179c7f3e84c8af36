// AgentCore: restores from a copy in memory: the trainer's own kept step,
// the copy held here for a partner, a peer agent's copy; each checked
// against the shard the step must be.
#include "agent/agent_core.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "agent/agent_core_internal.h"
#include "base/status_macros.h"
#include "format/checksum.h"
#include "storage/replica.h"
#include "storage/shard_index.h"

namespace ckptd::agent {

namespace {

// LoadFromPeers' id of the copy this agent holds for a partner (a node id
// never holds a '/').
constexpr char kHeldCopySource[] = "/held";

}  // namespace

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
  std::shared_ptr<const replication::Replica> held =
      options_.replicas != nullptr && !call->skip_sources.contains(kHeldCopySource) ? options_.replicas->Find(key) : nullptr;
  if (held != nullptr) {
    sources.push_back({kHeldCopySource, "the copy this agent holds for its partner", [held](const replication::ReplicaSink& sink) -> absl::Status {
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
                         [this, peer, key](const replication::ReplicaSink& sink) {
                           return options_.peer_network->Fetch(peer.address(), key, peer.ticket(), sink).status();
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

}  // namespace ckptd::agent
