#include "client/client.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/agent_socket.h"
#include "base/status_macros.h"
#include "base/thread_priority.h"
#include "ckptd/v1/agent.grpc.pb.h"
#include "client/host_copy.h"
#include "format/checksum.h"
#include "format/tensor_size.h"
#include "grpcpp/grpcpp.h"
#include "protocol/restore_source.h"
#include "protocol/schedule.h"
#include "rpc/grpc_status.h"
#include "staging/staging.h"

namespace ckptd::client {

using rpc::FromGrpcStatus;

namespace {

// Restore reads a whole checkpoint back: it may take this many times the
// rpc_timeout of a control call.
constexpr int kRestoreTimeoutFactor = 60;

}  // namespace

struct Client::Impl {
  // Prepares `slot` for this process's copies (see slot_mapped). Without
  // `prefault` the copy threads fault the pages in as they go, in parallel.
  // A snapshot's slot is also page-locked when a buffer lives on a device
  // (`lock`): its device-to-host copies then run as DMA. A restore does not
  // lock the slot: locking costs more than the copy it would speed up (the
  // kernel pins every page, at about 1-2 GB/s), and a restarted trainer's
  // first restore would pay it on the critical path. After a restore the
  // locking thread locks the slots (LockLoop); a snapshot into a slot it is
  // locking waits for it.
  absl::Status MapSlot(uint32_t slot, bool prefault = true, bool lock = true) {
    const bool want_lock = lock && any_device;
    SlotMap was;
    {
      absl::MutexLock l(&map_mu);
      if (slot >= slot_mapped.size()) return absl::OkStatus();
      if (want_lock) {
        struct Wait {
          Impl* im;
          uint32_t slot;
        } wait{this, slot};
        map_mu.Await(absl::Condition(
            +[](Wait* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->im->map_mu) {
              return w->im->slot_mapped[w->slot] != SlotMap::kLocking;
            },
            &wait));
      }
      was = slot_mapped[slot];
      // Being locked by the locking thread is mapped enough for a restore.
      if (was == SlotMap::kLocked || (was != SlotMap::kUnmapped && !want_lock)) return absl::OkStatus();
      if (want_lock) slot_mapped[slot] = SlotMap::kLocking;
    }
    if (prefault && was == SlotMap::kUnmapped) segment->Prefault(slot);
    absl::Status locked;
    if (want_lock) locked = copier->RegisterHostMemory(segment->slot_data(slot), segment->slot_bytes());
    absl::MutexLock l(&map_mu);
    if (want_lock) {
      slot_mapped[slot] = locked.ok() ? SlotMap::kLocked : was;
    } else if (slot_mapped[slot] == SlotMap::kUnmapped) {  // the locking thread may have taken it up meanwhile
      slot_mapped[slot] = SlotMap::kMapped;
    }
    return locked;
  }

  // The locking thread: page-locks every slot not locked yet, one after the
  // other, each once the agent has prepared it; stops at the first error
  // (the snapshot into that slot tries again and reports it) or when told.
  void LockLoop() {
    base::SetCallingThreadName("ckptd-lock");
    // Left to the snapshots, which report it, when the device is unusable.
    if (!copier->UseDeviceOnThisThread(first_device).ok()) return;
    bool (*const stop)(Impl*) = +[](Impl* i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(i->map_mu) { return i->lock_stop; };
    for (uint32_t slot = 0;; ++slot) {
      SlotMap was;
      {
        absl::MutexLock l(&map_mu);
        // The agent may still be allocating the slot: looked at again after
        // 10 ms, then less and less often, at most every second (it says
        // nothing when done, and a slot it could not allocate stays so).
        absl::Duration poll = absl::Milliseconds(10);
        while (!lock_stop && slot < slot_mapped.size() && segment->state(slot) == staging::SlotState::kPreparing) {
          map_mu.AwaitWithTimeout(absl::Condition(stop, this), poll);
          poll = std::min(2 * poll, absl::Seconds(1));
        }
        if (lock_stop || slot >= slot_mapped.size()) return;
        was = slot_mapped[slot];
        if (was == SlotMap::kLocked || was == SlotMap::kLocking) continue;
        slot_mapped[slot] = SlotMap::kLocking;
      }
      const absl::Status locked = copier->RegisterHostMemory(segment->slot_data(slot), segment->slot_bytes());
      absl::MutexLock l(&map_mu);
      slot_mapped[slot] = locked.ok() ? SlotMap::kLocked : was;
      if (!locked.ok()) return;
    }
  }
  // Starts the locking thread for the current segment, once a restore ran
  // (lock_after_restore) and while none runs; nothing to do without device
  // buffers.
  void StartLocking() {
    if (!any_device || !lock_after_restore || restoring || segment == nullptr || lock_thread.joinable()) return;
    {
      absl::MutexLock l(&map_mu);
      lock_stop = false;
    }
    lock_thread = std::thread([this] { LockLoop(); });
  }
  // Stops it; a slot it is locking is finished first.
  void StopLocking() {
    if (!lock_thread.joinable()) return;
    {
      absl::MutexLock l(&map_mu);
      lock_stop = true;
    }
    lock_thread.join();
  }
  // Copies the restored slot of `resp` into the buffers. With blocks to
  // verify (a step from the agent's memory), each block is checked as it is
  // copied: a host block right after its copy, while it is still in the
  // cache, by the verifier's threads. Device buffers are copied whole, one
  // copy each, by a thread of their own while the verifier's threads check
  // their blocks in the slot: the check never holds the transfer up. A
  // mismatch fails the restore (the caller reads the step again, from disk,
  // over what was copied). Returns the first mismatch ("" when none); errors
  // are the copier's or a digest list that does not cover the buffers.
  absl::StatusOr<std::string> CopyOut(const ckptd::v1::RestoreResponse& resp) {
    const uint8_t* base = segment->slot_data(resp.slot());
    if (resp.verify_size() == 0) {
      absl::Status copied;
      for (size_t i = 0; i < buffers.size() && copied.ok(); ++i) {
        copied = copier->CopyFromHost(buffers[i].data, base + offsets[i], lengths[i], buffers[i].device);
      }
      CKPTD_RETURN_IF_ERROR(copied);
      return std::string();
    }
    // The blocks must cover every buffer, in order.
    std::vector<uint64_t> covered(buffers.size(), 0);
    for (const ckptd::v1::BlockDigest& b : resp.verify()) {
      if (b.buffer() >= buffers.size() || b.offset() != covered[b.buffer()] ||
          b.length() > lengths[b.buffer()] - b.offset()) {
        return absl::InternalError(absl::StrCat("agent's block list does not cover buffer ", b.buffer()));
      }
      covered[b.buffer()] += b.length();
    }
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (covered[i] != lengths[i]) {
        return absl::InternalError(absl::StrCat("agent's block list does not cover buffer '", buffers[i].name, "'"));
      }
    }
    if (verifier == nullptr) verifier = std::make_unique<ParallelCopier>(options.copy_threads);
    // The device copies: the copier is this thread's alone until it is joined.
    absl::Status device_copied;
    std::thread device_copies;
    if (any_device) {
      device_copies = std::thread([this, base, &device_copied] {
        device_copied = copier->UseDeviceOnThisThread(first_device);
        for (size_t i = 0; i < buffers.size() && device_copied.ok(); ++i) {
          if (buffers[i].device.kind() == ckptd::v1::Device::HOST || lengths[i] == 0) continue;
          device_copied = copier->CopyFromHost(buffers[i].data, base + offsets[i], lengths[i], buffers[i].device);
        }
      });
    }
    absl::Mutex mu;
    std::string problem;
    verifier->ForEach(static_cast<size_t>(resp.verify_size()), [&](size_t k) {
      const ckptd::v1::BlockDigest& b = resp.verify(static_cast<int>(k));
      const BufferSpec& buf = buffers[b.buffer()];
      const uint8_t* src = base + offsets[b.buffer()] + b.offset();
      uint64_t digest;
      if (buf.device.kind() == ckptd::v1::Device::HOST) {
        uint8_t* dst = static_cast<uint8_t*>(buf.data) + b.offset();
        // A restarted trainer's state is often new memory: mapped in one call.
        PrefaultForWrite(dst, b.length());
        digest = format::CopyAndXxh3(dst, src, b.length());
      } else {
        digest = format::Xxh3(src, b.length());
      }
      if (digest != b.xxh3()) {
        absl::MutexLock l(&mu);
        if (problem.empty()) {
          problem = absl::StrCat("buffer '", buf.name, "' bytes ", b.offset(), "..", b.offset() + b.length(),
                                 " do not match their checksum");
        }
      }
    });
    if (device_copies.joinable()) device_copies.join();
    CKPTD_RETURN_IF_ERROR(device_copied);
    return problem;
  }

  // The segment goes: the locking thread stops, and page-locked slots are
  // unlocked first.
  void DropSegment() {
    StopLocking();
    absl::MutexLock l(&map_mu);
    for (uint32_t i = 0; i < slot_mapped.size(); ++i) {
      if (slot_mapped[i] == SlotMap::kLocked) (void)copier->UnregisterHostMemory(segment->slot_data(i));
    }
    slot_mapped.clear();
    segment.reset();
  }

  ClientOptions options;
  base::Clock* clock = nullptr;  // options.clock, or the real clock
  std::vector<BufferSpec> buffers;
  std::vector<uint64_t> lengths;
  bool any_device = false;
  // The device of the first buffer on one: the client's own threads make it
  // theirs before they lock or copy (DeviceCopier::UseDeviceOnThisThread).
  ckptd::v1::Device first_device;
  std::unique_ptr<DeviceCopier> owned_copier;
  DeviceCopier* copier = nullptr;  // owned_copier, or options.copier
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<ckptd::v1::Agent::Stub> stub;

  // The current registration; dropped when the agent forgets us.
  bool registered = false;
  uint64_t trainer_id = 0;
  std::unique_ptr<staging::StagingSegment> segment;
  std::vector<uint64_t> offsets;
  // Per slot: faulted into this process (kMapped), and page-locked too
  // (kLocked; kLocking while it is being locked) while a buffer lives on a
  // device: at a slot's first snapshot, or before it by the locking thread
  // once the trainer restored. Never at registration, so that registering
  // never waits for gigabytes of page faults and pinning (and slots the
  // agent still allocates are not touched). The segment itself is the
  // training thread's; the locking thread uses it while it runs.
  enum class SlotMap { kUnmapped, kMapped, kLocking, kLocked };
  absl::Mutex map_mu;
  std::vector<SlotMap> slot_mapped ABSL_GUARDED_BY(map_mu);
  bool lock_stop ABSL_GUARDED_BY(map_mu) = false;
  std::thread lock_thread;          // training thread only (start, stop)
  bool lock_after_restore = false;  // training thread only: a restore ran
  bool restoring = false;           // training thread only: a restore runs
  // Where the last restore read its step.
  std::atomic<int> restore_source{ckptd::v1::RESTORE_SOURCE_UNSPECIFIED};
  // The step of a scheduled snapshot skipped for want of a slot since the
  // last one taken (0: none), for a job of one rank without a coordinator:
  // ShouldSnapshot says yes at the next step that finds a slot.
  std::atomic<uint64_t> missed_scheduled{0};
  // Copies and checks restored blocks (made at the first restore from memory).
  std::unique_ptr<ParallelCopier> verifier;

  // Two-hop snapshots: per buffer its spare on the same device, nullptr for
  // host buffers (all of them without spare_device_buffer); two_hop when any
  // exists. While a second hop is in flight, the hop thread alone uses the
  // copier, the segment and the spares: every call that needs them (or may
  // register again) waits for the hop first.
  std::vector<void*> spares;
  bool two_hop = false;
  std::thread hop_thread;

  std::atomic<uint64_t> taken{0};
  std::atomic<uint64_t> skipped{0};

  // Schedule sync (a client thread; see ClientOptions::sync_interval). The
  // training thread only stores its step and reads the cached schedule.
  std::atomic<bool> coordinated{false};
  std::atomic<uint64_t> sync_trainer_id{0};  // 0: not registered
  // Counts successful registrations. A call that fails with "agent gone" marks
  // the agent lost only if no registration happened since the call was sent:
  // an answer from before a restart says nothing about the registration made
  // after it (a restarted agent may even hand out the same trainer id).
  std::atomic<uint64_t> registration{0};
  std::atomic<uint64_t> current_step{0};
  // When the sync thread first failed to reach the agent (0: it reaches it).
  std::atomic<int64_t> unreachable_since_ns{0};
  std::atomic<double> step_seconds{0};
  // The same over steps with no snapshot of ours being persisted, and with one.
  std::atomic<double> step_seconds_idle{0};
  std::atomic<double> step_seconds_persisting{0};
  absl::Time last_step_time;           // training thread only
  uint64_t last_step = 0;              // training thread only
  bool persisting_at_last_step = false;  // training thread only
  absl::Duration snapshot_since_last_step;  // training thread only: time spent in Snapshot
  std::thread sync_thread;
  absl::Mutex sched_mu;
  std::optional<ckptd::v1::Schedule> schedule ABSL_GUARDED_BY(sched_mu);
  uint64_t incarnation ABSL_GUARDED_BY(sched_mu) = 0;  // from the last restore
  std::string restore_warning ABSL_GUARDED_BY(sched_mu);  // the last restore's (last_restore_warning)
  std::set<uint64_t> taken_steps ABSL_GUARDED_BY(sched_mu);     // recent snapshots
  std::set<uint64_t> missed_reported ABSL_GUARDED_BY(sched_mu);
  std::vector<uint64_t> missed_to_send ABSL_GUARDED_BY(sched_mu);
  bool sync_stop ABSL_GUARDED_BY(sched_mu) = false;
  // Failed persists as the agent counts them for the registration
  // `failed_registration` (a new registration starts at 0 there), and those
  // of earlier registrations.
  uint64_t failed_registration ABSL_GUARDED_BY(sched_mu) = 0;
  uint64_t failed_now ABSL_GUARDED_BY(sched_mu) = 0;
  uint64_t failed_before ABSL_GUARDED_BY(sched_mu) = 0;
  std::optional<uint64_t> last_failed_step ABSL_GUARDED_BY(sched_mu);
  std::string last_persist_error ABSL_GUARDED_BY(sched_mu);

  void SyncLoop();
  // The agent's count of failed persists for registration `under`, with the
  // newest's step and error.
  void NoteFailures(uint64_t under, uint64_t failed, uint64_t step, absl::string_view error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sched_mu) {
    if (under != failed_registration) {
      if (under < failed_registration) return;  // an answer from before a newer one
      failed_before += failed_now;
      failed_now = 0;
      failed_registration = under;
    }
    if (failed <= failed_now) return;
    failed_now = failed;
    last_failed_step = step;
    last_persist_error = std::string(error);
  }
  // Whether a snapshot of ours is on its way to storage: a second hop, or a
  // slot published or being persisted. Training thread only (it alone
  // replaces the segment).
  bool PersistInFlight() {
    if (segment != nullptr) {
      for (uint32_t s = 0; s < segment->slots(); ++s) {
        const staging::SlotState st = segment->state(s);
        if (st == staging::SlotState::kReady || st == staging::SlotState::kPersisting) return true;
      }
    }
    absl::MutexLock l(&mu);
    return hop_busy || hop_queued.has_value();
  }
  // The sync thread has not reached the agent for at least `d`.
  bool UnreachableFor(absl::Duration d) const {
    const int64_t since = unreachable_since_ns.load();
    return since != 0 && clock->Now() - absl::FromUnixNanos(since) >= d;
  }
  void NoteTaken(uint64_t step) {
    if (step >= missed_scheduled.load(std::memory_order_relaxed)) missed_scheduled.store(0, std::memory_order_relaxed);
    absl::MutexLock l(&sched_mu);
    taken_steps.insert(step);
    while (taken_steps.size() > 256) taken_steps.erase(taken_steps.begin());
  }

  // Notifications in flight (they do not block Snapshot), and whether one
  // found the agent gone.
  absl::Mutex mu;
  int notifications ABSL_GUARDED_BY(mu) = 0;
  bool agent_lost ABSL_GUARDED_BY(mu) = false;

  // The second hop handed to the hop thread, not yet started; whether one is
  // queued or running (and its step); the error of the last one until a call
  // reports it.
  struct Hop {
    uint32_t slot = 0;
    uint64_t step = 0;
    uint64_t trainer_id = 0;
    double stall_seconds = 0;  // of the first hop
  };
  std::optional<Hop> hop_queued ABSL_GUARDED_BY(mu);
  bool hop_busy ABSL_GUARDED_BY(mu) = false;
  uint64_t hop_step ABSL_GUARDED_BY(mu) = 0;
  absl::Status hop_error ABSL_GUARDED_BY(mu);
  bool hop_stop ABSL_GUARDED_BY(mu) = false;

  // REQUIRES: the hop thread has ended (or never started).
  ~Impl() {
    for (size_t i = 0; i < spares.size(); ++i) {
      if (spares[i] != nullptr) copier->FreeOnDevice(spares[i], buffers[i].device);
    }
  }

  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return ctx;
  }

  // Where the agent's socket is, when a user this process trusts serves on
  // it (base::ResolveTrustedAgentSocket); a socket not there (yet) is
  // kUnavailable, as an agent that is not up.
  absl::StatusOr<std::string> TrustedSocket() const {
    absl::StatusOr<std::string> path =
        base::ResolveTrustedAgentSocket(options.socket, ::geteuid(), options.trusted_agent_uids);
    if (absl::IsNotFound(path.status())) {
      return absl::UnavailableError(absl::StrCat("register (agent at ", options.socket,
                                                 "): no socket there: the agent is not up (yet)"));
    }
    return path;
  }

  // An error that means the agent no longer knows this trainer (restarted or
  // gone): register again next time.
  absl::Status Check(const grpc::Status& s, absl::string_view what) {
    if (s.ok()) return absl::OkStatus();
    absl::Status status = FromGrpcStatus(s);
    if (absl::IsUnavailable(status) || absl::IsNotFound(status) || absl::IsDeadlineExceeded(status)) {
      registered = false;
      DropSegment();  // its locked slots unlocked, the locking thread stopped
    }
    return absl::Status(status.code(), absl::StrCat(what, " (agent at ", options.socket, "): ", status.message()));
  }

  // Sends a notification without waiting for it (bounded by rpc_timeout).
  // `send(async, ctx, req, resp, done)` starts the call.
  template <typename Request, typename Response, typename Send>
  void Notify(Request request, Send send) {
    struct Call {
      grpc::ClientContext ctx;
      Request req;
      Response resp;
    };
    auto* call = new Call();
    call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
    call->req = std::move(request);
    {
      absl::MutexLock l(&mu);
      ++notifications;
    }
    const uint64_t sent_under = registration.load();
    send(stub->async(), &call->ctx, &call->req, &call->resp, [call, sent_under, this](grpc::Status s) {
      delete call;
      absl::MutexLock l(&mu);
      --notifications;
      // The agent restarted or is gone: the next call registers again (and
      // reports the agent unavailable if it still is). UNIMPLEMENTED is an
      // older agent that does not know the call, DEADLINE_EXCEEDED a busy
      // one that answered late: neither is a lost one.
      if (!s.ok() && s.error_code() != grpc::StatusCode::UNIMPLEMENTED &&
          s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED && sent_under == registration.load()) {
        agent_lost = true;
      }
    });
  }

  // The agent also polls its slots: a lost notification only delays the
  // persist.
  void NotifyPublished(uint64_t trainer, uint32_t slot, uint64_t step, double stall_seconds) {
    ckptd::v1::SnapshotPublishedRequest req;
    req.set_trainer_id(trainer);
    req.set_slot(slot);
    req.set_step(step);
    req.set_stall_seconds(stall_seconds);
    Notify<ckptd::v1::SnapshotPublishedRequest, ckptd::v1::SnapshotPublishedResponse>(
        std::move(req), [](auto* async, auto* ctx, auto* rq, auto* rs, auto done) {
          async->SnapshotPublished(ctx, rq, rs, std::move(done));
        });
  }

  // Counts a skipped snapshot here and (without waiting) at the agent, and
  // returns the error Snapshot reports for it.
  absl::Status Skip(uint64_t step, absl::StatusCode code, absl::string_view why) {
    skipped.fetch_add(1, std::memory_order_relaxed);
    if (registered) {
      ckptd::v1::SnapshotSkippedRequest req;
      req.set_trainer_id(trainer_id);
      req.set_step(step);
      req.set_reason(std::string(why));
      Notify<ckptd::v1::SnapshotSkippedRequest, ckptd::v1::SnapshotSkippedResponse>(
          std::move(req), [](auto* async, auto* ctx, auto* rq, auto* rs, auto done) {
            async->SnapshotSkipped(ctx, rq, rs, std::move(done));
          });
    }
    return absl::Status(code, absl::StrCat("snapshot of step ", step, " skipped: ", why));
  }

  // Waits up to `deadline` until no second hop is in flight; false (with the
  // step of the one still running) when one is.
  bool AwaitHopIdle(absl::Time deadline, uint64_t* busy_step) {
    absl::MutexLock l(&mu);
    bool (*const no_hop)(Impl*) = +[](Impl* i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(i->mu) { return !i->hop_busy; };
    const bool idle = clock->AwaitWithDeadline(&mu, absl::Condition(no_hop, this), deadline);
    if (!idle) *busy_step = hop_step;
    return idle;
  }

  // The error of the last second hop, once: reporting it clears it.
  absl::Status TakeHopError() {
    absl::MutexLock l(&mu);
    return std::exchange(hop_error, absl::OkStatus());
  }

  // The hop thread: runs second hops one at a time until stopped; a hop
  // queued before the stop still runs.
  void HopLoop() {
    // An error here is the copies' too, and reported with them.
    (void)copier->UseDeviceOnThisThread(first_device);
    while (true) {
      Hop hop;
      {
        absl::MutexLock l(&mu);
        mu.Await(absl::Condition(
            +[](Impl* i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(i->mu) { return i->hop_queued.has_value() || i->hop_stop; },
            this));
        if (!hop_queued) return;
        hop = *hop_queued;
        hop_queued.reset();
      }
      absl::Status s = SecondHop(hop);
      absl::MutexLock l(&mu);
      hop_error = std::move(s);
      hop_busy = false;
    }
  }

  // Spares -> the slot, then publish and notify. On failure the slot is
  // given back (FILLING -> FREE).
  absl::Status SecondHop(const Hop& hop) {
    uint8_t* base = segment->slot_data(hop.slot);
    absl::Status s;
    for (size_t i = 0; i < buffers.size() && s.ok(); ++i) {
      if (spares[i] == nullptr) continue;
      s = copier->CopyToHost(base + offsets[i], spares[i], lengths[i], buffers[i].device);
    }
    // Even after an error: nothing may still write into a slot given back.
    absl::Status synced = copier->Synchronize();
    if (s.ok()) s = synced;
    if (s.ok()) s = segment->Publish(hop.slot, hop.step);
    if (!s.ok()) {
      (void)segment->Abandon(hop.slot);  // FILLING -> FREE; fails only if it is no longer ours
      return absl::Status(s.code(), absl::StrCat("second hop of the snapshot of step ", hop.step,
                                                 " (spare device buffers -> staging): ", s.message()));
    }
    taken.fetch_add(1, std::memory_order_relaxed);
    NotifyPublished(hop.trainer_id, hop.slot, hop.step, hop.stall_seconds);
    return absl::OkStatus();
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options, std::vector<BufferSpec> buffers) {
  if (options.rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("rpc_timeout must be positive, not ",
                                                   absl::FormatDuration(options.rpc_timeout)));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (impl->options.socket.empty()) impl->options.socket = base::DefaultTrainerSocket();
  if (const char* env = std::getenv(base::kTrustedAgentUidsEnv); env != nullptr && *env != '\0') {
    CKPTD_ASSIGN_OR_RETURN(std::vector<uint32_t> more, base::ParseUidList(env, base::kTrustedAgentUidsEnv));
    impl->options.trusted_agent_uids.insert(impl->options.trusted_agent_uids.end(), more.begin(), more.end());
  }
  impl->clock = options.clock != nullptr ? options.clock : base::RealClock::Get();
  if (options.local_world_size == 0) {
    // torchrun's; anything that is not a count the job can have stays unknown.
    const char* env = std::getenv("LOCAL_WORLD_SIZE");
    uint32_t local = 0;
    if (env != nullptr && absl::SimpleAtoi(env, &local) && local >= 1 && local <= options.world_size) {
      impl->options.local_world_size = local;
    }
  }
  for (const BufferSpec& b : buffers) {
    ckptd::v1::Tensor meta;
    meta.set_name(b.name);
    meta.set_component(b.component);
    meta.set_dtype(b.dtype);
    for (uint64_t d : b.shape) meta.add_shape(d);
    CKPTD_ASSIGN_OR_RETURN(uint64_t length, format::TensorByteLength(meta));
    if (length > 0 && b.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("buffer '", absl::CHexEscape(b.name), "' has no memory"));
    }
    impl->lengths.push_back(length);
    if (!impl->any_device && b.device.kind() != ckptd::v1::Device::HOST) impl->first_device = b.device;
    impl->any_device = impl->any_device || b.device.kind() != ckptd::v1::Device::HOST;
  }
  impl->buffers = std::move(buffers);
  if (options.copier != nullptr) {
    impl->copier = options.copier;
  } else if (impl->any_device) {
    CKPTD_ASSIGN_OR_RETURN(impl->owned_copier, NewCudaCopier(options.copy_threads));
  } else {
    impl->owned_copier = NewHostCopier(options.copy_threads);
  }
  if (impl->copier == nullptr) impl->copier = impl->owned_copier.get();
  impl->spares.assign(impl->buffers.size(), nullptr);
  for (size_t i = 0; options.spare_device_buffer && i < impl->buffers.size(); ++i) {
    const BufferSpec& b = impl->buffers[i];
    if (b.device.kind() == ckptd::v1::Device::HOST || impl->lengths[i] == 0) continue;
    absl::StatusOr<void*> spare = impl->copier->AllocateOnDevice(impl->lengths[i], b.device);
    if (!spare.ok()) {  // ~Impl frees the spares allocated so far
      return absl::Status(spare.status().code(), absl::StrCat("spare device buffer for '", absl::CHexEscape(b.name),
                                                              "': ", spare.status().message()));
    }
    impl->spares[i] = *spare;
    impl->two_hop = true;
  }
  // The agent is on this node. When it is not up yet (restarting after a
  // crash), each try gets a new channel: a channel that failed to connect
  // waits out gRPC's reconnect backoff (seconds) before it tries again,
  // which would hold up the restart of the whole job.
  // Only to a socket of a user this process trusts, in a directory where no
  // one else can replace it (base/agent_socket.h): anyone could serve on a
  // name in a directory others may write to.
  auto connect = [](Impl* im) -> absl::Status {
    absl::StatusOr<std::string> path = im->TrustedSocket();
    if (!path.ok()) return path.status();
    grpc::ChannelArguments channel_args;
    channel_args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    channel_args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    im->channel = grpc::CreateCustomChannel(absl::StrCat("unix:", *path), grpc::InsecureChannelCredentials(),
                                            channel_args);
    im->stub = ckptd::v1::Agent::NewStub(im->channel);
    return absl::OkStatus();
  };
  const absl::Status connected = connect(impl.get());
  Impl* raw = impl.get();
  std::unique_ptr<Client> client(new Client(std::move(impl)));
  absl::Status registered = connected.ok() ? client->EnsureRegistered() : connected;
  base::Clock* const clock = raw->clock;
  const absl::Time give_up = clock->Now() + options.connect_wait;
  // A socket this process may not use is a lasting refusal, not an agent that
  // is still starting: say so (gRPC reports it as UNAVAILABLE) instead of
  // retrying until connect_wait runs out.
  const std::string& socket = raw->options.socket;
  auto refused = [&socket](absl::Status s) {
    if (!absl::IsUnavailable(s) || ::faccessat(AT_FDCWD, socket.c_str(), R_OK | W_OK, AT_EACCESS) == 0 ||
        errno != EACCES) {
      return s;
    }
    return absl::PermissionDeniedError(absl::StrCat(
        "the agent's socket ", socket, " is not open to this process (uid ", ::geteuid(),
        "): run the trainer as the agent's user or as a member of the agent's --trainer-group (", s.message(), ")"));
  };
  registered = refused(std::move(registered));
  // Unavailable: no agent (yet). DeadlineExceeded: an agent that did not
  // answer in time, e.g. one just restarted on a node whose CPUs are busy;
  // trying again is safe, a registration of the same rank replaces the last.
  auto again = [](const absl::Status& s) { return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s); };
  while (again(registered) && clock->Now() < give_up) {
    clock->SleepFor(std::min(absl::Milliseconds(200), give_up - clock->Now()));
    const absl::Status reconnected = connect(raw);  // no other thread uses the stub yet
    registered = refused(reconnected.ok() ? client->EnsureRegistered() : reconnected);
  }
  CKPTD_RETURN_IF_ERROR(registered);
  if (raw->two_hop) raw->hop_thread = std::thread([raw] { raw->HopLoop(); });
  raw->sync_thread = std::thread([raw] { raw->SyncLoop(); });
  return client;
}

void Client::Impl::SyncLoop() {
  while (true) {
    ckptd::v1::SyncScheduleRequest req;
    uint64_t sent_under = 0;
    {
      absl::MutexLock l(&sched_mu);
      clock->AwaitWithTimeout(&sched_mu, absl::Condition(&sync_stop), options.sync_interval);
      if (sync_stop) return;
      sent_under = registration.load();
      req.set_trainer_id(sync_trainer_id.load());
      req.set_step(current_step.load());
      req.set_step_seconds(step_seconds.load());
      req.set_step_seconds_idle(step_seconds_idle.load());
      req.set_step_seconds_persisting(step_seconds_persisting.load());
      for (uint64_t m : missed_to_send) req.add_missed_targets(m);
    }
    // Not registered (the training thread registers again at its next call).
    if (req.trainer_id() == 0) continue;
    ckptd::v1::SyncScheduleResponse resp;
    const grpc::Status st = stub->SyncSchedule(Context(options.rpc_timeout).get(), req, &resp);
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE || st.error_code() == grpc::StatusCode::NOT_FOUND) {
      // Gone, or it forgot us: the next Snapshot registers again (unless it
      // already has since this request was sent).
      absl::MutexLock l(&mu);
      if (sent_under == registration.load()) agent_lost = true;
    }
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE) {
      int64_t expected = 0;
      unreachable_since_ns.compare_exchange_strong(expected, absl::ToUnixNanos(clock->Now()));
    } else {
      unreachable_since_ns.store(0);
    }
    absl::MutexLock l(&sched_mu);
    if (!st.ok()) continue;
    NoteFailures(sent_under, resp.persists_failed(), resp.last_failed_step(), resp.last_persist_error());
    missed_to_send.erase(missed_to_send.begin(), missed_to_send.begin() + req.missed_targets_size());
    if (!resp.has_schedule()) continue;
    schedule = resp.schedule();
    // A one-off target this rank has already passed without a snapshot: say
    // so, and the coordinator picks another.
    const uint64_t reached = current_step.load();
    for (uint64_t target : schedule->extra_steps()) {
      if (target <= reached && !taken_steps.contains(target) && missed_reported.insert(target).second) {
        missed_to_send.push_back(target);
      }
    }
  }
}

Client::~Client() {
  if (impl_->sync_thread.joinable()) {
    {
      absl::MutexLock l(&impl_->sched_mu);
      impl_->sync_stop = true;
    }
    impl_->sync_thread.join();
  }
  // A second hop in flight is finished and published first. It waits for no
  // RPC, only for its copy, which always ends.
  if (impl_->hop_thread.joinable()) {
    {
      absl::MutexLock l(&impl_->mu);
      impl_->hop_stop = true;
    }
    impl_->hop_thread.join();
    // Nobody is left to report a failed last hop to; its slot was given back.
  }
  // Wait (bounded) for notifications still in flight; they point into impl_.
  // On real time, as the deadlines of the calls it waits for.
  {
    absl::MutexLock l(&impl_->mu);
    Impl* impl = impl_.get();
    impl_->mu.AwaitWithTimeout(absl::Condition(
                                   +[](Impl* i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(i->mu) { return i->notifications == 0; },
                                   impl),
                               impl_->options.rpc_timeout);
  }
  impl_->StopLocking();
  if (impl_->registered) {
    ckptd::v1::GoodbyeRequest req;
    req.set_trainer_id(impl_->trainer_id);
    ckptd::v1::GoodbyeResponse resp;
    // Best effort: the agent also notices the process exit by itself.
    (void)impl_->stub->Goodbye(impl_->Context(impl_->options.rpc_timeout).get(), req, &resp);
  }
  if (impl_->segment != nullptr) impl_->DropSegment();
}

bool Client::ShouldSnapshot(uint64_t step) const {
  Impl& im = *impl_;
  const absl::Time now = im.clock->Now();
  const bool persisting = im.PersistInFlight();
  if (step > im.last_step && im.last_step_time != absl::Time()) {
    const double sample =
        std::max(0.0, absl::ToDoubleSeconds(now - im.last_step_time - im.snapshot_since_last_step)) /
        static_cast<double>(step - im.last_step);
    auto mean = [sample](std::atomic<double>& m) {
      const double old = m.load(std::memory_order_relaxed);
      m.store(old == 0 ? sample : 0.9 * old + 0.1 * sample, std::memory_order_relaxed);
    };
    mean(im.step_seconds);
    // A step counts as slowed by a persist when one was in flight at either
    // end of it.
    mean(persisting || im.persisting_at_last_step ? im.step_seconds_persisting : im.step_seconds_idle);
  }
  im.last_step = step;
  im.last_step_time = now;
  im.persisting_at_last_step = persisting;
  im.snapshot_since_last_step = absl::ZeroDuration();
  im.current_step.store(step, std::memory_order_relaxed);
  if (step == 0) return false;
  // A scheduled snapshot was skipped (no free slot): the next step that
  // finds one takes it, not the next multiple of every_steps. Only for a
  // job of one rank without a coordinator: the ranks of a job must all take
  // the same steps for one to be committed.
  if (const uint64_t missed = im.missed_scheduled.load(std::memory_order_relaxed);
      missed != 0 && step > missed && !im.coordinated.load(std::memory_order_relaxed) && im.segment != nullptr &&
      im.segment->CanAcquireForFill()) {
    return true;
  }
  if (im.coordinated.load(std::memory_order_relaxed)) {
    absl::MutexLock l(&im.sched_mu);
    return im.schedule && im.schedule->state() == ckptd::v1::JOB_RUNNING &&
           protocol::ScheduledAt(*im.schedule, step);
  }
  const uint64_t every = im.options.every_steps;
  return every != 0 && step % every == 0;
}

bool Client::restart_requested() const {
  Impl& im = *impl_;
  if (!im.coordinated.load(std::memory_order_relaxed)) return false;
  absl::MutexLock l(&im.sched_mu);
  if (im.UnreachableFor(im.options.agent_loss_restart_after)) return true;
  // A RESTARTING schedule of an older restore round is stale news.
  return im.schedule && im.schedule->state() == ckptd::v1::JOB_RESTARTING &&
         im.schedule->incarnation() >= im.incarnation;
}

absl::Status Client::EnsureRegistered() {
  Impl& im = *impl_;
  bool lost;
  {
    absl::MutexLock l(&im.mu);
    lost = std::exchange(im.agent_lost, false);
  }
  if (lost) {
    // Outside `mu`: stopping the locking thread may wait for a slot.
    im.registered = false;
    im.DropSegment();
  }
  if (im.registered) return absl::OkStatus();
  ckptd::v1::RegisterRequest req;
  req.set_job(im.options.job);
  req.set_rank(im.options.rank);
  req.set_world_size(im.options.world_size);
  req.set_local_world_size(im.options.local_world_size);
  req.set_pid(static_cast<int32_t>(::getpid()));
  for (const BufferSpec& b : im.buffers) {
    ckptd::v1::Tensor* t = req.add_buffers();
    t->set_name(b.name);
    t->set_component(b.component);
    t->set_dtype(b.dtype);
    for (uint64_t d : b.shape) t->add_shape(d);
    for (uint64_t d : b.global_shape) t->add_global_shape(d);
    for (uint64_t d : b.offsets) t->add_offsets(d);
    if (b.replica_count > 0) {
      t->mutable_replica()->set_group(b.replica_group);
      t->mutable_replica()->set_count(b.replica_count);
      t->mutable_replica()->set_index(b.replica_index);
    }
    *t->mutable_device() = b.device;
  }
  ckptd::v1::RegisterResponse resp;
  // Again at each registration: the agent may have restarted since the
  // channel was made, and gRPC reconnects by name.
  CKPTD_RETURN_IF_ERROR(im.TrustedSocket().status());
  CKPTD_RETURN_IF_ERROR(im.Check(im.stub->Register(im.Context(im.options.rpc_timeout).get(), req, &resp), "register"));
  if (static_cast<size_t>(resp.offsets_size()) != im.buffers.size()) {
    return absl::InternalError(absl::StrCat("agent laid out ", resp.offsets_size(), " buffers for ",
                                            im.buffers.size(), " registered"));
  }
  // The agent created its socket: the socket's owner is the agent's user,
  // whose segments a trainer of another user in its --trainer-group may open.
  std::optional<uint32_t> agent_uid;
  struct stat socket_st;
  if (::stat(im.options.socket.c_str(), &socket_st) == 0) agent_uid = static_cast<uint32_t>(socket_st.st_uid);
  im.DropSegment();  // one a failed registration left
  CKPTD_ASSIGN_OR_RETURN(im.segment, staging::StagingSegment::Open(resp.segment(), im.clock, agent_uid));
  im.offsets.assign(resp.offsets().begin(), resp.offsets().end());
  for (size_t i = 0; i < im.buffers.size(); ++i) {
    if (im.offsets[i] + im.lengths[i] > im.segment->slot_bytes()) {
      return absl::InternalError(absl::StrCat("agent's staging slot of ", im.segment->slot_bytes(),
                                              " bytes does not hold buffer '", im.buffers[i].name, "'"));
    }
  }
  // Page-locked staging turns device copies into DMA at full speed: each slot
  // is locked at its first snapshot (MapSlot), or before it by the locking
  // thread once the trainer restored (an agent that came back: at once).
  {
    absl::MutexLock l(&im.map_mu);
    im.slot_mapped.assign(im.segment->slots(), Impl::SlotMap::kUnmapped);
  }
  im.StartLocking();
  im.trainer_id = resp.trainer_id();
  im.registered = true;
  im.coordinated.store(resp.coordinated());
  im.sync_trainer_id.store(resp.trainer_id());
  im.registration.fetch_add(1);
  return absl::OkStatus();
}

absl::string_view Client::last_restore_source() const {
  return protocol::RestoreSourceName(static_cast<ckptd::v1::RestoreSource>(impl_->restore_source.load()));
}

std::string Client::last_restore_warning() const {
  absl::MutexLock l(&impl_->sched_mu);
  return impl_->restore_warning;
}

uint64_t Client::snapshots_taken() const { return impl_->taken.load(std::memory_order_relaxed); }
uint64_t Client::snapshots_skipped() const { return impl_->skipped.load(std::memory_order_relaxed); }

ScheduleView Client::schedule() const {
  Impl& im = *impl_;
  ScheduleView v;
  v.coordinated = im.coordinated.load(std::memory_order_relaxed);
  if (!v.coordinated) {
    v.every_steps = im.options.every_steps;
    return v;
  }
  absl::MutexLock l(&im.sched_mu);
  if (!im.schedule) return v;
  v.known = true;
  v.start_step = im.schedule->start_step();
  v.every_steps = im.schedule->every_steps();
  v.durable_every = im.schedule->durable_every();
  v.generation = im.schedule->generation();
  return v;
}

PersistFailures Client::persist_failures() const {
  Impl& im = *impl_;
  absl::MutexLock l(&im.sched_mu);
  PersistFailures f;
  f.failed = im.failed_before + im.failed_now;
  if (f.failed > 0) {
    f.last_failed_step = im.last_failed_step;
    f.last_error = im.last_persist_error;
  }
  return f;
}

absl::StatusOr<SnapshotResult> Client::Snapshot(uint64_t step, SnapshotKind kind) {
  Impl& im = *impl_;
  base::Clock* const clock = im.clock;
  const absl::Time t0 = clock->Now();
  // The stall is a cost of its own: the step times that tell how much a
  // persist slows training leave it out.
  absl::Cleanup count_stall = [&im, clock, t0] { im.snapshot_since_last_step += clock->Now() - t0; };
  absl::Duration slot_wait = im.options.slot_wait;
  if (im.two_hop) {
    // The previous second hop owns the spares and the copier until it ends.
    uint64_t busy_step = 0;
    if (!im.AwaitHopIdle(t0 + slot_wait, &busy_step)) {
      return im.Skip(step, absl::StatusCode::kResourceExhausted,
                     absl::StrCat("the second hop of step ", busy_step, " is still in flight after ",
                                  absl::FormatDuration(slot_wait)));
    }
    CKPTD_RETURN_IF_ERROR(im.TakeHopError());
    slot_wait = std::max(absl::ZeroDuration(), slot_wait - (clock->Now() - t0));
  }
  CKPTD_RETURN_IF_ERROR(EnsureRegistered());
  // Waits in short rounds: slots held by an agent that is gone never free up.
  // An explicit snapshot also waits, up to prepare_wait, while the agent
  // still allocates slots: one of them frees up when it is ready.
  const absl::Time slot_deadline = clock->Now() + slot_wait;
  const absl::Time prepare_deadline = std::max(slot_deadline, t0 + im.options.prepare_wait);
  auto preparing = [&im] { return im.segment->slots_prepared() < im.segment->slots(); };
  auto deadline = [&] {
    return kind == SnapshotKind::kExplicit && preparing() ? prepare_deadline : slot_deadline;
  };
  absl::StatusOr<uint32_t> slot =
      im.segment->AcquireForFill(std::min(deadline() - clock->Now(), absl::Milliseconds(100)));
  while (!slot.ok() && absl::IsResourceExhausted(slot.status()) && clock->Now() < deadline()) {
    if (im.UnreachableFor(absl::ZeroDuration())) {
      return im.Skip(step, absl::StatusCode::kUnavailable,
                     "the agent is unreachable and holds every staging slot");
    }
    slot = im.segment->AcquireForFill(std::min(deadline() - clock->Now(), absl::Milliseconds(100)));
  }
  if (!slot.ok()) {
    std::string why(slot.status().message());
    if (absl::IsResourceExhausted(slot.status())) {
      if (!preparing()) {
        why = absl::StrCat("no free staging slot within ", absl::FormatDuration(slot_wait), ": each of the ",
                           im.segment->slots(),
                           " slots holds a snapshot the agent is still persisting (wait longer with slot_wait, "
                           "snapshot less often, or give the agent more slots with ckptd-agent --slots or a "
                           "faster storage root)");
      } else if (kind == SnapshotKind::kExplicit) {
        why = absl::StrCat("no free staging slot within ", absl::FormatDuration(prepare_deadline - t0),
                           " (prepare_wait): the agent is still allocating staging memory (", im.segment->slots_prepared(),
                           " of ", im.segment->slots(), " slots ready; a slow or full /dev/shm, see the agent's log)");
      } else {
        why = absl::StrCat("no free staging slot within ", absl::FormatDuration(slot_wait),
                           " (the agent is still allocating staging memory: ", im.segment->slots_prepared(), " of ",
                           im.segment->slots(), " slots ready; a snapshot asked for by its step waits for them)");
      }
    }
    if (kind == SnapshotKind::kScheduled && absl::IsResourceExhausted(slot.status()) &&
        im.options.world_size == 1 && im.missed_scheduled.load(std::memory_order_relaxed) == 0) {
      im.missed_scheduled.store(step, std::memory_order_relaxed);
    }
    return im.Skip(step, slot.status().code(), why);
  }
  if (absl::Status mapped = im.MapSlot(*slot); !mapped.ok()) {
    (void)im.segment->Abandon(*slot);
    return im.Skip(step, mapped.code(), absl::StrCat("staging slot ", *slot, ": ", mapped.message()));
  }
  uint8_t* base = im.segment->slot_data(*slot);
  // Device buffers with a spare are queued device to device first; the other
  // buffers go straight into the slot meanwhile.
  bool second_hop = false;
  absl::Status copied;
  for (size_t i = 0; i < im.buffers.size() && copied.ok(); ++i) {
    if (im.spares[i] == nullptr) continue;
    copied = im.copier->CopyOnDevice(im.spares[i], im.buffers[i].data, im.lengths[i], im.buffers[i].device);
    second_hop = true;
  }
  for (size_t i = 0; i < im.buffers.size() && copied.ok(); ++i) {
    if (im.spares[i] != nullptr) continue;
    copied = im.copier->CopyToHost(base + im.offsets[i], im.buffers[i].data, im.lengths[i], im.buffers[i].device);
  }
  // Even after an error: nothing may still write into a slot given back.
  absl::Status synced = im.copier->Synchronize();
  if (copied.ok()) copied = synced;
  if (!copied.ok()) {
    (void)im.segment->Abandon(*slot);  // FILLING -> FREE; it is ours, so this cannot fail
    return copied;
  }
  if (second_hop) {
    const double stall = absl::ToDoubleSeconds(clock->Now() - t0);
    absl::MutexLock l(&im.mu);
    im.hop_queued = Impl::Hop{*slot, step, im.trainer_id, stall};
    im.hop_busy = true;
    im.hop_step = step;
    im.NoteTaken(step);
    return SnapshotResult{step, stall};
  }
  if (absl::Status published = im.segment->Publish(*slot, step); !published.ok()) {
    (void)im.segment->Abandon(*slot);  // give it back if it is still ours
    return published;
  }
  const double stall = absl::ToDoubleSeconds(clock->Now() - t0);
  im.taken.fetch_add(1, std::memory_order_relaxed);
  // Tell the agent without waiting.
  im.NotifyPublished(im.trainer_id, *slot, step, stall);
  im.NoteTaken(step);
  return SnapshotResult{step, stall};
}

absl::StatusOr<std::optional<uint64_t>> Client::Restore() {
  Impl& im = *impl_;
  const absl::Duration restore_timeout = im.options.rpc_timeout * kRestoreTimeoutFactor;
  uint64_t busy_step = 0;
  // The error of a failed second hop stays for the next Snapshot or
  // WaitPersisted: it is not this call's.
  if (im.two_hop && !im.AwaitHopIdle(im.clock->Now() + restore_timeout, &busy_step)) {
    return absl::DeadlineExceededError(absl::StrCat("restore: the second hop of the snapshot of step ", busy_step,
                                                    " is still in flight after ",
                                                    absl::FormatDuration(restore_timeout)));
  }
  // Once the state is back, the slots are page-locked for the snapshots to
  // come, in the background; never while a restore copies out of one.
  im.restoring = true;
  absl::Cleanup lock_slots = [&im] {
    im.restoring = false;
    im.lock_after_restore = true;
    im.StartLocking();
  };
  CKPTD_RETURN_IF_ERROR(EnsureRegistered());
  im.StopLocking();  // a restore again (a rollback): the slot it locks is finished first
  ckptd::v1::RestoreRequest req;
  req.set_trainer_id(im.trainer_id);
  req.set_wait_for_slot_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(im.options.rpc_timeout)));
  req.set_client_verifies(true);
  {
    absl::MutexLock l(&im.sched_mu);
    im.restore_warning.clear();
  }
  // A step handed over from the agent's memory that fails the check while
  // it is copied out is read once more, from disk.
  for (int attempt = 0;; ++attempt) {
    ckptd::v1::RestoreResponse resp;
    // Reading a whole checkpoint back takes longer than a control call.
    CKPTD_RETURN_IF_ERROR(im.Check(im.stub->Restore(im.Context(restore_timeout).get(), req, &resp), "restore"));
    {
      absl::MutexLock l(&im.sched_mu);
      im.incarnation = resp.incarnation();
      if (!resp.warning().empty()) im.restore_warning = resp.warning();
      // What the agent cached from before this restore round is stale.
      if (im.schedule && im.schedule->incarnation() < resp.incarnation()) im.schedule.reset();
    }
    im.restore_source.store(resp.source());
    if (!resp.found()) return std::optional<uint64_t>();
    if (resp.slot() >= im.segment->slots()) {
      return absl::InternalError(absl::StrCat("agent restored into staging slot ", resp.slot(), " of ",
                                              im.segment->slots()));
    }
    const absl::Status mapped = im.MapSlot(resp.slot(), /*prefault=*/resp.verify_size() == 0, /*lock=*/false);
    absl::StatusOr<std::string> problem = mapped.ok() ? im.CopyOut(resp) : absl::StatusOr<std::string>(mapped);
    absl::Status synced = im.copier->Synchronize();
    if (problem.ok() && !synced.ok()) problem = synced;
    // The slot goes back to the agent whether or not the copy worked.
    CKPTD_RETURN_IF_ERROR(im.segment->Release(resp.slot()));
    CKPTD_RETURN_IF_ERROR(problem.status());
    if (problem->empty()) return std::optional<uint64_t>(resp.step());
    if (attempt > 0) {
      return absl::DataLossError(absl::StrCat("restore of step ", resp.step(), ": ", *problem));
    }
    req.set_reread(true);
    req.set_reread_step(resp.step());
    req.set_reread_problem(*problem);
  }
}

absl::Status Client::WaitPersisted(uint64_t step, absl::Duration timeout) {
  Impl& im = *impl_;
  const absl::Time deadline = im.clock->Now() + timeout;
  uint64_t busy_step = 0;
  if (im.two_hop && !im.AwaitHopIdle(deadline, &busy_step)) {
    return absl::DeadlineExceededError(absl::StrCat("step ", step, " not persisted within ",
                                                    absl::FormatDuration(timeout), ": the second hop of step ",
                                                    busy_step, " is still in flight"));
  }
  if (im.two_hop) CKPTD_RETURN_IF_ERROR(im.TakeHopError());
  // A memory checkpoint (two cadences) is done once the agent keeps it in
  // memory: it is never written unless a failure needs it.
  bool memory_checkpoint = false;
  if (im.coordinated.load(std::memory_order_relaxed)) {
    absl::MutexLock l(&im.sched_mu);
    memory_checkpoint = im.schedule && protocol::ScheduledAt(*im.schedule, step) && !protocol::DurableAt(*im.schedule, step);
  }
  int late_polls = 0;
  while (true) {
    CKPTD_RETURN_IF_ERROR(EnsureRegistered());
    ckptd::v1::GetStatusRequest req;
    req.set_trainer_id(im.trainer_id);
    ckptd::v1::GetStatusResponse resp;
    const grpc::Status polled = im.stub->GetStatus(im.Context(im.options.rpc_timeout).get(), req, &resp);
    // An agent too busy to answer a poll within rpc_timeout (its node's CPUs
    // or memory under pressure) is asked again until this wait's own
    // deadline, and the client keeps its registration and its staging, also
    // at the deadline: a busy agent is not a lost one (one that is gone
    // answers UNAVAILABLE, one that forgot this trainer NOT_FOUND).
    if (polled.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      ++late_polls;
      if (im.clock->Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "step ", step, " not known to be persisted within ", absl::FormatDuration(timeout), ": status (agent at ",
            im.options.socket, "): ", late_polls, " polls not answered within ",
            absl::FormatDuration(im.options.rpc_timeout), " (rpc_timeout)"));
      }
      absl::SleepFor(absl::Milliseconds(5));
      continue;
    }
    CKPTD_RETURN_IF_ERROR(im.Check(polled, "status"));
    {
      absl::MutexLock l(&im.sched_mu);
      im.NoteFailures(im.registration.load(), resp.failed(), resp.last_failed_step(), resp.last_error());
    }
    if (resp.has_persisted() && resp.last_persisted_step() >= step) return absl::OkStatus();
    if (memory_checkpoint && resp.has_memory_checkpoint() && resp.last_memory_step() >= step) return absl::OkStatus();
    // A failure of an earlier step is no answer for this one (an agent that
    // does not say which step failed: any failure is).
    const bool failed_this = resp.has_failed() ? resp.last_failed_step() >= step : resp.failed() > 0;
    if (failed_this && !resp.last_error().empty() &&
        (!resp.has_persisted() || resp.last_persisted_step() < step)) {
      return absl::AbortedError(absl::StrCat("persisting step ", step, " failed: ", resp.last_error()));
    }
    if (im.clock->Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("step ", step, " not persisted within ", absl::FormatDuration(timeout)));
    }
    // The agent, another process, says nothing when the step is persisted: it
    // is asked again after 5 ms of real time (as a FakeClock looks again at a
    // wait's condition), while the timeout is measured on the clock.
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace ckptd::client
