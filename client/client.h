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
#include "absl/time/time.h"
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
  ckptd::v1::Device device;            // host by default
  void* data = nullptr;
};

struct ClientOptions {
  std::string socket;  // the agent's Unix socket
  std::string job;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // Snapshot every this many steps (0: only when asked). Step 0 is never
  // scheduled: it is the state before training.
  uint64_t every_steps = 0;
  // How long Snapshot waits for a free staging slot (zero: skip at once).
  absl::Duration slot_wait = absl::ZeroDuration();
  // Bound on every call to the agent.
  absl::Duration rpc_timeout = absl::Seconds(5);
  int copy_threads = 0;
};

struct SnapshotResult {
  uint64_t step = 0;
  double stall_seconds = 0;  // the copy into staging, what training waited for
};

class Client {
 public:
  // Connects and registers. An unreachable agent is kUnavailable.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options,
                                                         std::vector<BufferSpec> buffers);
  ~Client();  // says goodbye to the agent (bounded)

  // Cheap, no RPC: whether the schedule says to snapshot `step`.
  bool ShouldSnapshot(uint64_t step) const;

  // Copies every buffer into a free staging slot and hands it to the agent
  // (the notification does not block). kResourceExhausted when no slot frees
  // up within slot_wait (the snapshot is skipped and counted); kUnavailable
  // when the agent cannot be reached. A snapshot published just as the agent
  // dies is lost with it; the next call reports the agent unavailable.
  absl::StatusOr<SnapshotResult> Snapshot(uint64_t step);

  // Loads every buffer from the newest committed step that reads back intact
  // and returns that step; nullopt when there is none (start from scratch).
  absl::StatusOr<std::optional<uint64_t>> Restore();

  // Waits until `step` is persisted (or failed) by the agent.
  absl::Status WaitPersisted(uint64_t step, absl::Duration timeout);

  uint64_t snapshots_taken() const { return taken_; }
  uint64_t snapshots_skipped() const { return skipped_; }

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  absl::Status EnsureRegistered();

  std::unique_ptr<Impl> impl_;
  uint64_t taken_ = 0;
  uint64_t skipped_ = 0;
};

}  // namespace ckptd::client
