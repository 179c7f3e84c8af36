#include "client/client.h"

#include <unistd.h>

#include <atomic>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agent/grpc_status.h"
#include "agent/staging.h"
#include "ckptd/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "storage/shard_index.h"
#include "storage/status_macros.h"

namespace ckptd::client {

using agent::FromGrpcStatus;

struct Client::Impl {
  ClientOptions options;
  std::vector<BufferSpec> buffers;
  std::vector<uint64_t> lengths;
  bool any_device = false;
  std::unique_ptr<DeviceCopier> copier;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<ckptd::v1::Agent::Stub> stub;

  // The current registration; dropped when the agent forgets us.
  bool registered = false;
  uint64_t trainer_id = 0;
  std::unique_ptr<agent::StagingSegment> segment;
  std::vector<uint64_t> offsets;

  // Publish notifications in flight (they do not block Snapshot), and
  // whether one found the agent gone.
  absl::Mutex mu;
  int notifications ABSL_GUARDED_BY(mu) = 0;
  bool agent_lost ABSL_GUARDED_BY(mu) = false;

  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return ctx;
  }

  // An error that means the agent no longer knows this trainer (restarted or
  // gone): register again next time.
  absl::Status Check(const grpc::Status& s, absl::string_view what) {
    if (s.ok()) return absl::OkStatus();
    absl::Status status = FromGrpcStatus(s);
    if (absl::IsUnavailable(status) || absl::IsNotFound(status) || absl::IsDeadlineExceeded(status)) {
      registered = false;
      segment.reset();
    }
    return absl::Status(status.code(), absl::StrCat(what, " (agent at ", options.socket, "): ", status.message()));
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options, std::vector<BufferSpec> buffers) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  for (const BufferSpec& b : buffers) {
    ckptd::v1::Tensor meta;
    meta.set_name(b.name);
    meta.set_component(b.component);
    meta.set_dtype(b.dtype);
    for (uint64_t d : b.shape) meta.add_shape(d);
    CKPTD_ASSIGN_OR_RETURN(uint64_t length, storage::TensorByteLength(meta));
    if (length > 0 && b.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("buffer '", absl::CHexEscape(b.name), "' has no memory"));
    }
    impl->lengths.push_back(length);
    impl->any_device = impl->any_device || b.device.kind() != ckptd::v1::Device::HOST;
  }
  impl->buffers = std::move(buffers);
  if (impl->any_device) {
    CKPTD_ASSIGN_OR_RETURN(impl->copier, NewCudaCopier(options.copy_threads));
  } else {
    impl->copier = NewHostCopier(options.copy_threads);
  }
  impl->channel = grpc::CreateChannel(absl::StrCat("unix:", options.socket), grpc::InsecureChannelCredentials());
  impl->stub = ckptd::v1::Agent::NewStub(impl->channel);
  std::unique_ptr<Client> client(new Client(std::move(impl)));
  CKPTD_RETURN_IF_ERROR(client->EnsureRegistered());
  return client;
}

Client::~Client() {
  // Wait (bounded) for notifications still in flight; they point into impl_.
  {
    absl::MutexLock l(&impl_->mu);
    Impl* impl = impl_.get();
    impl_->mu.AwaitWithTimeout(absl::Condition(
                                   +[](Impl* i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(i->mu) { return i->notifications == 0; },
                                   impl),
                               impl_->options.rpc_timeout);
  }
  if (impl_->registered) {
    ckptd::v1::GoodbyeRequest req;
    req.set_trainer_id(impl_->trainer_id);
    ckptd::v1::GoodbyeResponse resp;
    // Best effort: the agent also notices the process exit by itself.
    (void)impl_->stub->Goodbye(impl_->Context(impl_->options.rpc_timeout).get(), req, &resp);
  }
}

bool Client::ShouldSnapshot(uint64_t step) const {
  const uint64_t every = impl_->options.every_steps;
  return every != 0 && step != 0 && step % every == 0;
}

absl::Status Client::EnsureRegistered() {
  Impl& im = *impl_;
  {
    absl::MutexLock l(&im.mu);
    if (im.agent_lost) {
      im.agent_lost = false;
      im.registered = false;
      im.segment.reset();
    }
  }
  if (im.registered) return absl::OkStatus();
  ckptd::v1::RegisterRequest req;
  req.set_job(im.options.job);
  req.set_rank(im.options.rank);
  req.set_world_size(im.options.world_size);
  req.set_pid(static_cast<int32_t>(::getpid()));
  for (const BufferSpec& b : im.buffers) {
    ckptd::v1::Tensor* t = req.add_buffers();
    t->set_name(b.name);
    t->set_component(b.component);
    t->set_dtype(b.dtype);
    for (uint64_t d : b.shape) t->add_shape(d);
    for (uint64_t d : b.global_shape) t->add_global_shape(d);
    for (uint64_t d : b.offsets) t->add_offsets(d);
    *t->mutable_device() = b.device;
  }
  ckptd::v1::RegisterResponse resp;
  CKPTD_RETURN_IF_ERROR(im.Check(im.stub->Register(im.Context(im.options.rpc_timeout).get(), req, &resp), "register"));
  if (static_cast<size_t>(resp.offsets_size()) != im.buffers.size()) {
    return absl::InternalError(absl::StrCat("agent laid out ", resp.offsets_size(), " buffers for ",
                                            im.buffers.size(), " registered"));
  }
  CKPTD_ASSIGN_OR_RETURN(im.segment, agent::StagingSegment::Open(resp.segment()));
  im.offsets.assign(resp.offsets().begin(), resp.offsets().end());
  for (size_t i = 0; i < im.buffers.size(); ++i) {
    if (im.offsets[i] + im.lengths[i] > im.segment->slot_bytes()) {
      return absl::InternalError(absl::StrCat("agent's staging slot of ", im.segment->slot_bytes(),
                                              " bytes does not hold buffer '", im.buffers[i].name, "'"));
    }
  }
  if (im.any_device) {
    // Page-locked staging turns device copies into DMA at full speed.
    CKPTD_RETURN_IF_ERROR(im.copier->RegisterHostMemory(im.segment->slot_data(0),
                                                        im.segment->slots() * im.segment->slot_bytes()));
  }
  im.trainer_id = resp.trainer_id();
  im.registered = true;
  return absl::OkStatus();
}

absl::StatusOr<SnapshotResult> Client::Snapshot(uint64_t step) {
  Impl& im = *impl_;
  const absl::Time t0 = absl::Now();
  CKPTD_RETURN_IF_ERROR(EnsureRegistered());
  absl::StatusOr<uint32_t> slot = im.segment->AcquireForFill(im.options.slot_wait);
  if (!slot.ok()) {
    ++skipped_;
    return absl::Status(slot.status().code(), absl::StrCat("snapshot of step ", step, " skipped: ", slot.status().message()));
  }
  uint8_t* base = im.segment->slot_data(*slot);
  absl::Status copied;
  for (size_t i = 0; i < im.buffers.size() && copied.ok(); ++i) {
    copied = im.copier->CopyToHost(base + im.offsets[i], im.buffers[i].data, im.lengths[i], im.buffers[i].device);
  }
  if (copied.ok()) copied = im.copier->Synchronize();
  if (!copied.ok()) {
    (void)im.segment->Abandon(*slot);  // FILLING -> FREE; it is ours, so this cannot fail
    return copied;
  }
  CKPTD_RETURN_IF_ERROR(im.segment->Publish(*slot, step));
  const double stall = absl::ToDoubleSeconds(absl::Now() - t0);
  ++taken_;

  // Tell the agent without waiting: it also polls its slots, so a lost
  // notification only delays the persist.
  struct Call {
    grpc::ClientContext ctx;
    ckptd::v1::SnapshotPublishedRequest req;
    ckptd::v1::SnapshotPublishedResponse resp;
  };
  auto* call = new Call();
  call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + im.options.rpc_timeout));
  call->req.set_trainer_id(im.trainer_id);
  call->req.set_slot(*slot);
  call->req.set_step(step);
  {
    absl::MutexLock l(&im.mu);
    ++im.notifications;
  }
  Impl* impl = &im;
  im.stub->async()->SnapshotPublished(&call->ctx, &call->req, &call->resp, [call, impl](grpc::Status s) {
    delete call;
    absl::MutexLock l(&impl->mu);
    --impl->notifications;
    // The agent restarted or is gone: the next call registers again (and
    // reports the agent unavailable if it still is).
    if (!s.ok()) impl->agent_lost = true;
  });
  return SnapshotResult{step, stall};
}

absl::StatusOr<std::optional<uint64_t>> Client::Restore() {
  Impl& im = *impl_;
  CKPTD_RETURN_IF_ERROR(EnsureRegistered());
  ckptd::v1::RestoreRequest req;
  req.set_trainer_id(im.trainer_id);
  req.set_wait_for_slot_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(im.options.rpc_timeout)));
  ckptd::v1::RestoreResponse resp;
  // Reading a whole checkpoint back takes longer than a control call.
  CKPTD_RETURN_IF_ERROR(im.Check(im.stub->Restore(im.Context(im.options.rpc_timeout * 60).get(), req, &resp), "restore"));
  if (!resp.found()) return std::optional<uint64_t>();
  const uint8_t* base = im.segment->slot_data(resp.slot());
  absl::Status copied;
  for (size_t i = 0; i < im.buffers.size() && copied.ok(); ++i) {
    copied = im.copier->CopyFromHost(im.buffers[i].data, base + im.offsets[i], im.lengths[i], im.buffers[i].device);
  }
  if (copied.ok()) copied = im.copier->Synchronize();
  // The slot goes back to the agent whether or not the copy worked.
  CKPTD_RETURN_IF_ERROR(im.segment->Release(resp.slot()));
  CKPTD_RETURN_IF_ERROR(copied);
  return std::optional<uint64_t>(resp.step());
}

absl::Status Client::WaitPersisted(uint64_t step, absl::Duration timeout) {
  Impl& im = *impl_;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    CKPTD_RETURN_IF_ERROR(EnsureRegistered());
    ckptd::v1::GetStatusRequest req;
    req.set_trainer_id(im.trainer_id);
    ckptd::v1::GetStatusResponse resp;
    CKPTD_RETURN_IF_ERROR(
        im.Check(im.stub->GetStatus(im.Context(im.options.rpc_timeout).get(), req, &resp), "status"));
    if (resp.has_persisted() && resp.last_persisted_step() >= step) return absl::OkStatus();
    if (resp.failed() > 0 && !resp.last_error().empty() && (!resp.has_persisted() || resp.last_persisted_step() < step)) {
      return absl::AbortedError(absl::StrCat("persisting step ", step, " failed: ", resp.last_error()));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("step ", step, " not persisted within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace ckptd::client
