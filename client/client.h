// libckptd's C++ API: what a training process calls. Registers its buffers
// with the node's agent once, decides at each step boundary without any RPC
// whether to snapshot, copies every buffer into shared staging (the only
// blocking part), and restores all five state components.
//
// Checkpointing is a weak dependency: every call is bounded in time, and when
// the agent is down or failing the call returns an error and training goes
// on; the client registers again when the agent is back.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "ckptd/v1/shard.pb.h"
#include "client/device_copy.h"

namespace ckptd::client {

// One buffer of the trainer's state. `data` stays valid and keeps its size
// for the life of the client.
struct BufferSpec {
  std::string name;
  ckptd::v1::Component component = ckptd::v1::PARAMS;
  ckptd::v1::DType dtype = ckptd::v1::FLOAT32;
  std::vector<uint64_t> shape;
  std::vector<uint64_t> global_shape;  // empty: not sharded
  std::vector<uint64_t> offsets;
  // Replicated over a group of ranks (data parallelism: every member holds
  // the same bytes): the group's name, its size and this rank's place in it.
  // The group writes the buffer once, each member a share of its rows
  // (docs/elastic.md). replica_count 0: not replicated.
  std::string replica_group;
  uint32_t replica_count = 0;
  uint32_t replica_index = 0;
  ckptd::v1::Device device;            // host by default
  void* data = nullptr;
};

struct ClientOptions {
  // The agent's Unix socket; empty: $CKPTD_SOCKET, else
  // $XDG_RUNTIME_DIR/ckptd/agent.sock when it exists, else
  // /run/ckptd/agent.sock (base::DefaultTrainerSocket).
  std::string socket;
  // Users whose agents this trainer connects to besides its own user and
  // root (with those of $CKPTD_TRUSTED_AGENT_UIDS): the socket must belong to
  // one of them, in a directory where no one else can replace it; else
  // Connect fails with kPermissionDenied naming the socket's owner.
  std::vector<uint32_t> trusted_agent_uids;
  std::string job;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // How many of the job's ranks run on this node (0: unknown; then taken from
  // $LOCAL_WORLD_SIZE, which torchrun sets). An agent without a coordinator
  // refuses a job with ranks on other nodes, which it could never commit.
  uint32_t local_world_size = 0;
  // Snapshot every this many steps (0: only when asked). Step 0 is never
  // scheduled: it is the state before training. When the agent reports to a
  // coordinator, the coordinator's schedule applies instead (the same on
  // every rank), and nothing is scheduled until it is known.
  uint64_t every_steps = 0;
  // How often a client thread tells the agent the step reached and fetches
  // the coordinator's schedule (never on the training thread).
  absl::Duration sync_interval = absl::Milliseconds(200);
  // Under a coordinator, an agent unreachable this long counts as a restart
  // request: the coordinator declares the node lost (and restarts the job)
  // when its heartbeats stop, and this rank could not hear of it.
  absl::Duration agent_loss_restart_after = absl::Seconds(5);
  // How long Snapshot waits for a free staging slot (zero: skip at once).
  absl::Duration slot_wait = absl::ZeroDuration();
  // How long a snapshot asked for explicitly (SnapshotKind::kExplicit) waits
  // for a slot the agent is still allocating (a trainer's first snapshots
  // after it registered a large state: its slots are allocated in the
  // background), counted from the call and never less than slot_wait. A
  // scheduled snapshot waits slot_wait only.
  absl::Duration prepare_wait = absl::Seconds(60);
  // Bound on every call to the agent.
  absl::Duration rpc_timeout = absl::Seconds(5);
  // How long Connect keeps trying an agent that is not up (yet), or that did
  // not answer its registration within rpc_timeout: a trainer
  // restarted together with its agent must not start without it, or it
  // would train from scratch while its peers wait in the restore barrier.
  absl::Duration connect_wait = absl::ZeroDuration();
  int copy_threads = 0;
  // Two-hop snapshots of device buffers: Connect allocates once, per device
  // buffer, a spare buffer of the same size on the same device; Snapshot
  // copies device to device into the spares and returns (the stall), and a
  // client thread then copies the spares into staging and publishes. Costs
  // the device memory of every device buffer once more. No effect on host
  // buffers, which are always copied straight into staging.
  bool spare_device_buffer = false;
  // For tests: every copy goes through this copier instead of the one Connect
  // picks (CUDA when a buffer is on a device, else host). Outlives the client.
  DeviceCopier* copier = nullptr;
  // Measures and waits on time: the step times and the stall, slot_wait and
  // the waits for a second hop, connect_wait, sync_interval, WaitPersisted's
  // timeout, and how long the agent has been unreachable (default:
  // base::RealClock::Get()); must outlive the client. The deadlines of its
  // RPCs stay on real time.
  base::Clock* clock = nullptr;
};

// Persists of this trainer's snapshots that failed at the agent (a full or
// failing disk): the snapshot was taken, but its step is not checkpointed.
struct PersistFailures {
  uint64_t failed = 0;  // since the client connected (over every registration)
  // The newest failure (when failed > 0): its step and the agent's error.
  std::optional<uint64_t> last_failed_step;
  std::string last_error;
};

// The schedule maybe_snapshot follows now (ShouldSnapshot).
struct ScheduleView {
  // True when the agent reports to a coordinator: the coordinator's schedule
  // applies, not ClientOptions::every_steps (and until it is heard of,
  // nothing is scheduled: known is false).
  bool coordinated = false;
  bool known = false;  // coordinated: a schedule was heard of
  uint64_t start_step = 0;
  uint64_t every_steps = 0;    // coordinated: the coordinator's; else ClientOptions::every_steps
  uint64_t durable_every = 0;  // every this many-th checkpoint is durable (0, 1: all)
  uint64_t generation = 0;     // grows with every change of the coordinator's schedule
};

// Why a snapshot is taken (Client::Snapshot): asked for by its step, or
// because the schedule says so.
enum class SnapshotKind { kExplicit, kScheduled };

struct SnapshotResult {
  uint64_t step = 0;
  double stall_seconds = 0;  // the copy into staging, what training waited for
};

class Client {
 public:
  // Connects and registers, retrying for up to connect_wait. An unreachable
  // agent is kUnavailable.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options,
                                                         std::vector<BufferSpec> buffers);
  // Finishes a second hop in flight (its copy; no RPC), then says goodbye to
  // the agent (bounded).
  ~Client();

  // Cheap, no RPC: whether the schedule says to snapshot `step`. Call it
  // once per step: it also records the step reached and the pace. After a
  // scheduled snapshot was skipped for want of a slot, a job of one rank
  // without a coordinator is told yes at the next step that finds a slot.
  bool ShouldSnapshot(uint64_t step) const;

  // Cheap, no RPC: the coordinator declared a failure of this job (a rank
  // died or hung, a node was lost) and every rank must restart and restore,
  // or (under a coordinator) the agent has been unreachable for
  // agent_loss_restart_after. The trainer should exit (or re-exec) for its
  // launcher to start it again.
  bool restart_requested() const;

  // Copies every buffer into a free staging slot and hands it to the agent
  // (the notification does not block). kResourceExhausted when no slot frees
  // up within slot_wait (the snapshot is skipped, counted, and reported to
  // the agent without blocking); kUnavailable when the agent cannot be
  // reached. A snapshot published just as the agent dies is lost with it; the
  // next call reports the agent unavailable.
  //
  // With spare_device_buffer, it returns once device buffers are copied into
  // their spares (and host buffers into the slot); the second hop into the
  // slot runs in the background. It first waits, within slot_wait, for the
  // previous second hop: still running then, this snapshot is skipped. When
  // the previous second hop failed, its error is returned instead (prefixed
  // "second hop"; its slot was given back) and `step` is not taken.
  //
  // kExplicit (the default: a snapshot the caller asked for by its step)
  // also waits, up to prepare_wait, for a slot the agent is still
  // allocating; only slots busy with snapshots being persisted make it skip.
  // kScheduled (the schedule's, e.g. ShouldSnapshot said so) waits slot_wait
  // only: training goes on and the next scheduled step tries again.
  absl::StatusOr<SnapshotResult> Snapshot(uint64_t step, SnapshotKind kind = SnapshotKind::kExplicit);

  // Loads every buffer from the newest committed step that reads back intact
  // and returns that step; nullopt when there is none (start from scratch).
  // A second hop in flight is finished first (bounded like the restore).
  absl::StatusOr<std::optional<uint64_t>> Restore();

  // Where the last Restore read its step: "memory" (the agent's own memory),
  // "peer" (another node's agent), "node-local" (the node-local tier),
  // "storage-root"; empty before any restore or when nothing was restored.
  absl::string_view last_restore_source() const;  // a static string

  // What the coordinator said the trainer should hear about the last
  // Restore (e.g. that the job's name was used by a run that finished, so
  // this run resumes that run's newest step); empty for nothing, before any
  // restore, and without a coordinator.
  std::string last_restore_warning() const;

  // Waits until `step` is persisted (or failed) by the agent, up to `timeout`
  // of the client's clock. A second hop in flight is waited for within
  // `timeout`, and its error is returned. A memory checkpoint (the
  // coordinator's schedule makes `step` one: Schedule.durable_every) is done
  // once the agent keeps it in memory. The agent is asked every 5 ms; a
  // question it does not answer within rpc_timeout is asked again, until
  // `timeout` (kDeadlineExceeded then; the registration and the staging are
  // kept: a busy agent is not a lost one). The wait may run past `timeout`
  // by one rpc_timeout.
  absl::Status WaitPersisted(uint64_t step, absl::Duration timeout);

  // Snapshots published to the agent (with two hops: once the second ended),
  // and snapshots skipped.
  uint64_t snapshots_taken() const;
  uint64_t snapshots_skipped() const;

  // Cheap, no RPC: the failed persists as the agent reported them at the
  // last schedule sync (every sync_interval) or WaitPersisted.
  PersistFailures persist_failures() const;

  // Cheap, no RPC: the schedule ShouldSnapshot follows now.
  ScheduleView schedule() const;

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  absl::Status EnsureRegistered();

  std::unique_ptr<Impl> impl_;
};

}  // namespace ckptd::client
