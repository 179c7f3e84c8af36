// Failure-injection drills (ckptctl drill): the agent's side. The coordinator
// sends DrillOrders in heartbeat answers, resending each until it hears a
// report; the executor carries each out once, on its own thread, and keeps
// its newest DrillReport until a heartbeat that carried it was answered.
// Only an agent started with --allow-drills injects anything.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent_core.h"
#include "base/clock.h"
#include "ckptd/v1/coordinator.pb.h"
#include "storage/fault_injection_file_system.h"
#include "storage/file_system.h"

namespace ckptd::agent {

struct DrillOptions {
  bool allowed = false;
  // The checkpoint storage root (storage scenarios fail or slow every path
  // under it; CORRUPT_SHARD finds shards there).
  std::string storage_root;
  // How often an order with at_step polls the rank's progress, and for how
  // long at most before it reports an error.
  absl::Duration step_poll = absl::Milliseconds(10);
  absl::Duration max_wait_for_step = absl::Hours(24);
  // KILL_AGENT and KILL_NODE wait this long at most for their report to be
  // delivered.
  absl::Duration kill_agent_grace = absl::Seconds(2);
  // Longest duration_seconds (and slow_seconds) accepted.
  absl::Duration max_duration = absl::Hours(1);
  // CORRUPT_MEMORY waits this long at most (looking every step_poll) while
  // the rank holds a snapshot newer than the newest committed step that may
  // still commit: a restart would restore that one, not the damaged step.
  absl::Duration max_wait_for_commit = absl::Seconds(30);
  // Measures and waits on time: the drills' durations, the waits for a step
  // and for delivery, and the reports' timestamps (default:
  // base::RealClock::Get()); must outlive the executor.
  base::Clock* clock = nullptr;
};

// What the executor acts through; every hook can be replaced in tests.
struct DrillHooks {
  // The trainer of (job, rank) on this node: pid and current step.
  std::function<std::optional<TrainerInfo>(const std::string& job, uint32_t rank)> find_trainer;
  // Every trainer on this node (KILL_NODE); null: KILL_NODE reports an error.
  std::function<std::vector<TrainerInfo>()> list_trainers;
  // Sends `sig` to `pid`. Default: kill(2).
  std::function<absl::Status(int32_t pid, int sig)> signal;
  // Ends this agent at once. Default: raise(SIGKILL).
  std::function<void()> kill_self;
  // Cuts the agent off from the coordinator for the duration (zero: lifts a
  // cut-off in progress). Null: CUT_OFF_AGENT reports an error.
  std::function<void(absl::Duration)> cut_off;
  // The file system checkpoint I/O goes through (storage scenarios); null:
  // those report an error. Must outlive the executor.
  storage::FaultInjectionFileSystem* fault_fs = nullptr;
  // The real file system below it (CORRUPT_SHARD, and CORRUPT_MEMORY to
  // find the newest committed step); null: CORRUPT_SHARD reports an error.
  storage::FileSystem* real_fs = nullptr;
  // Flips a byte of the copy of `step` that the trainer of (job, rank) keeps
  // in memory (CORRUPT_MEMORY; AgentCore::CorruptKeptStep, whose errors it
  // shares); null: CORRUPT_MEMORY reports an error.
  std::function<absl::StatusOr<std::string>(const std::string& job, uint32_t rank, uint64_t step)> corrupt_kept;
};

class DrillExecutor {
 public:
  DrillExecutor(DrillOptions options, DrillHooks hooks);
  // Ends every drill promptly: lifts storage faults and cut-offs, resumes a
  // stopped trainer, and joins every drill thread.
  ~DrillExecutor();
  DrillExecutor(const DrillExecutor&) = delete;
  DrillExecutor& operator=(const DrillExecutor&) = delete;

  // Starts `order` unless a drill with its id was seen before (orders are
  // resent until reported). Never blocks on the drill.
  void Submit(const ckptd::v1::DrillOrder& order);

  // A heartbeat answer: marks the reports sent in the heartbeat it answers
  // as delivered (unless the coordinator did not know the session), then
  // submits its orders.
  void OnAck(const ckptd::v1::HeartbeatAck& ack);

  // Adds the newest state of every report not yet delivered to `heartbeat`,
  // and remembers what went out for Delivered().
  void FillReports(ckptd::v1::Heartbeat* heartbeat);
  // The heartbeat last filled by FillReports was answered: its reports are
  // delivered (one whose state changed since goes out again).
  void Delivered();

  // The newest report of a drill, if it has one (for tests and status).
  std::optional<ckptd::v1::DrillReport> Report(uint64_t drill_id);

 private:
  struct Drill {
    ckptd::v1::DrillOrder order;
    ckptd::v1::DrillReport report;
    uint64_t version = 0;    // grows with every change of `report`; 0: nothing to report yet
    uint64_t delivered = 0;  // the newest version that reached the coordinator
    bool done = false;
    std::thread thread;
  };

  void Run(Drill* d);
  // Runs the scenario; returns an error to report (the report's other
  // fields are set through Update as the drill goes).
  absl::Status Execute(Drill* d);
  absl::Status WaitForStep(const ckptd::v1::DrillOrder& order);
  absl::Status KillTrainer(Drill* d);
  absl::Status HangTrainer(Drill* d, absl::Duration duration);
  absl::Status KillAgent(Drill* d);
  absl::Status KillNode(Drill* d);
  // Waits (a while) for `d`'s report to be delivered, then kills the agent.
  void ReportThenDie(Drill* d);
  absl::Status CutOffAgent(Drill* d, absl::Duration duration);
  absl::Status CorruptShard(Drill* d);
  // Damages the rank's copy in memory of the step a restart would restore,
  // then kills its trainer.
  absl::Status CorruptMemory(Drill* d);
  absl::Status StorageFault(Drill* d, absl::Duration duration);
  absl::StatusOr<TrainerInfo> Trainer(const ckptd::v1::DrillOrder& order);

  // Changes the drill's report (and its version). `at`: when the fault was
  // injected (default: now); a kill is stamped before the signal goes, so
  // that its detection never comes before it.
  void Injected(Drill* d, const std::string& detail, std::optional<absl::Time> at = std::nullopt);
  void Ended(Drill* d, const std::string& detail_suffix = "");
  // Sleeps `d` unless stopping; false when the executor is stopping.
  bool Sleep(absl::Duration d);
  bool stopping();

  const DrillOptions options_;
  base::Clock* const clock_ = options_.clock != nullptr ? options_.clock : base::RealClock::Get();
  DrillHooks hooks_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, std::unique_ptr<Drill>> drills_ ABSL_GUARDED_BY(mu_);
  // drill id -> version sent in the heartbeat last filled.
  std::map<uint64_t, uint64_t> in_flight_ ABSL_GUARDED_BY(mu_);
  // The storage drill whose fault is in place, if any (one at a time).
  std::optional<uint64_t> storage_drill_ ABSL_GUARDED_BY(mu_);
};

// The report of an order refused because drills are not allowed.
inline constexpr char kDrillsNotAllowed[] =
    "drills are not allowed on this agent; start it with --allow-drills";

}  // namespace ckptd::agent
