// AgentOptions::background_priority: persists run at low CPU priority,
// restores (on a pool of their own) do not, from every tier.
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent_core.h"
#include "agent/testing_agent_harness.h"
#include "base/testing/capturing_logger.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "staging/staging.h"
#include "storage/mem_file_system.h"

namespace ckptd::agent {
namespace {

using ::ckptd::testing::IsOk;
using ::testing::Optional;

// The priority of a thread that wrote checkpoint data: CPU and I/O.
struct WriterPriority {
  int policy = -1;
  int nice = 0;
  int ioprio = -1;
  bool operator==(const WriterPriority& o) const { return policy == o.policy && nice == o.nice && ioprio == o.ioprio; }
};

// The lowest level of the best-effort I/O class (IOPRIO_PRIO_VALUE(2, 7)).
constexpr int kLowestBestEffortIo = (2 << 13) | 7;

WriterPriority CallingThread() {
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  return {::sched_getscheduler(0), ::getpriority(PRIO_PROCESS, tid),
          static_cast<int>(::syscall(SYS_ioprio_get, /*IOPRIO_WHO_PROCESS=*/1, static_cast<int>(tid)))};
}

// A MemFileSystem that records the priority of every thread that writes.
class RecordingFs : public storage::FileSystem {
 public:
  std::vector<WriterPriority> writers() {
    absl::MutexLock l(&mu_);
    return writers_;
  }

  absl::StatusOr<std::unique_ptr<storage::WritableFile>> NewWritableFile(const std::string& path,
                                                                         const storage::OpenOptions& options) override {
    absl::StatusOr<std::unique_ptr<storage::WritableFile>> f = mem_.NewWritableFile(path, options);
    if (!f.ok()) return f;
    return std::unique_ptr<storage::WritableFile>(std::make_unique<File>(this, *std::move(f)));
  }
  absl::StatusOr<std::unique_ptr<storage::ReadableFile>> NewReadableFile(const std::string& path,
                                                                         const storage::OpenOptions& options) override {
    return mem_.NewReadableFile(path, options);
  }
  absl::Status CreateDir(const std::string& path) override { return mem_.CreateDir(path); }
  absl::Status RemoveFile(const std::string& path) override { return mem_.RemoveFile(path); }
  absl::Status RemoveDir(const std::string& path) override { return mem_.RemoveDir(path); }
  absl::Status Rename(const std::string& from, const std::string& to) override { return mem_.Rename(from, to); }
  absl::Status SyncDir(const std::string& path) override { return mem_.SyncDir(path); }
  absl::StatusOr<std::vector<storage::FileInfo>> ListDir(const std::string& path) override {
    return mem_.ListDir(path);
  }
  absl::StatusOr<storage::FileInfo> Stat(const std::string& path) override { return mem_.Stat(path); }

 private:
  class File : public storage::WritableFile {
   public:
    File(RecordingFs* fs, std::unique_ptr<storage::WritableFile> f) : fs_(fs), f_(std::move(f)) {}
    const std::string& path() const override { return f_->path(); }
    size_t alignment() const override { return f_->alignment(); }
    absl::StatusOr<uint64_t> Write(uint64_t offset, const void* data, size_t n) override {
      {
        absl::MutexLock l(&fs_->mu_);
        fs_->writers_.push_back(CallingThread());
      }
      return f_->Write(offset, data, n);
    }
    absl::Status WaitFor(uint64_t ticket) override { return f_->WaitFor(ticket); }
    absl::Status WaitAll() override { return f_->WaitAll(); }
    absl::Status Allocate(uint64_t length) override { return f_->Allocate(length); }
    absl::Status Truncate(uint64_t length) override { return f_->Truncate(length); }
    absl::Status Sync() override { return f_->Sync(); }
    absl::Status Close() override { return f_->Close(); }

   private:
    RecordingFs* const fs_;
    std::unique_ptr<storage::WritableFile> f_;
  };

  storage::MemFileSystem mem_;
  absl::Mutex mu_;
  std::vector<WriterPriority> writers_ ABSL_GUARDED_BY(mu_);
};

TrainerRegistration Rank0(const std::string& job) {
  TrainerRegistration r;
  r.job = job;
  r.buffers = {Buffer("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 30000),
               Buffer("adam", ckptd::v1::OPTIMIZER, ckptd::v1::FLOAT32, 60000),
               Buffer("rng", ckptd::v1::RNG, ckptd::v1::BYTES, 100)};
  return r;
}

class BackgroundPriorityTest : public ::testing::Test {
 protected:
  BackgroundPriorityTest() {
    EXPECT_THAT(fs_.CreateDir("/ckpt"), IsOk());
    options_.logger = &log_;
  }

  // Restores the trainer of `h` (reading from disk when `reread`, which
  // needs a restore of `step` before) and
  // checks that every byte of the slot is `fill`; returns where it came from.
  RestoreSource RestoreAndCheck(AgentCore& agent, staging::StagingSegment& seg, const TrainerHandle& h, uint64_t step,
                                uint8_t fill, bool reread) {
    RestoreOptions o;
    if (reread) o.reread_step = step;
    absl::StatusOr<RestoreResult> r = agent.Restore(h.trainer_id, o);
    EXPECT_THAT(r, IsOk());
    if (!r.ok()) return RestoreSource::kNone;
    EXPECT_THAT(r->step, Optional(step));
    const uint8_t* data = seg.slot_data(r->slot);
    size_t wrong = 0;
    for (uint64_t i = 0; i < h.slot_bytes; ++i) wrong += data[i] != fill;
    EXPECT_EQ(wrong, 0u);
    EXPECT_THAT(seg.Release(r->slot), IsOk());
    return r->source;
  }

  RecordingFs fs_;
  ::ckptd::testing::CapturingLogger log_;
  AgentOptions options_ = TestAgentOptions("priority");
};

TEST_F(BackgroundPriorityTest, IdlePersistsAndRestoresFromMemoryAndDisk) {
  options_.background_priority = base::ThreadPriority::kIdle;
  AgentCore agent(&fs_, options_);
  const bool idle = log_.Contains("persists run at SCHED_IDLE, restores at normal priority");
  // Where SCHED_IDLE is refused, nice 19 (and the log says why).
  ASSERT_TRUE(idle || log_.Contains("persists run at nice 19")) << ::testing::PrintToString(log_.lines());
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(Rank0("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *seg, h, 1, 0x5a));
  // The persister that submits the writes keeps the CPU priority it had
  // (its CPU work runs on the idle pool) at the lowest best-effort I/O
  // priority.
  const WriterPriority mine = CallingThread();
  const std::vector<WriterPriority> writers = fs_.writers();
  ASSERT_FALSE(writers.empty());
  for (const WriterPriority& w : writers) {
    EXPECT_EQ(w.policy, mine.policy);
    EXPECT_EQ(w.nice, mine.nice);
    EXPECT_EQ(w.ioprio, kLowestBestEffortIo);
  }
  // From memory (the agent checks the kept copy on the restore pool), then
  // from disk (decoded there).
  EXPECT_EQ(RestoreAndCheck(agent, *seg, h, 1, 0x5a, /*reread=*/false), RestoreSource::kMemory);
  EXPECT_EQ(RestoreAndCheck(agent, *seg, h, 1, 0x5a, /*reread=*/true), RestoreSource::kRoot);
  EXPECT_THAT(agent.TrainerExited(h.trainer_id), IsOk());
}

TEST_F(BackgroundPriorityTest, LowPersistsAtNice19AndRestoresFromTheLocalTier) {
  options_.background_priority = base::ThreadPriority::kLow;
  options_.local_cache = "/local";
  ASSERT_THAT(fs_.CreateDir("/local"), IsOk());
  AgentCore agent(&fs_, options_);
  EXPECT_TRUE(log_.Contains("persists run at nice 19, restores at normal priority"))
      << ::testing::PrintToString(log_.lines());
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(Rank0("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *seg, h, 4, 0x21));
  for (const WriterPriority& w : fs_.writers()) {
    EXPECT_EQ(w.nice, CallingThread().nice);
    EXPECT_EQ(w.ioprio, kLowestBestEffortIo);
  }
  EXPECT_EQ(RestoreAndCheck(agent, *seg, h, 4, 0x21, /*reread=*/false), RestoreSource::kMemory);
  EXPECT_EQ(RestoreAndCheck(agent, *seg, h, 4, 0x21, /*reread=*/true), RestoreSource::kLocal);
  EXPECT_THAT(agent.TrainerExited(h.trainer_id), IsOk());
}

TEST_F(BackgroundPriorityTest, NormalLeavesEveryThreadAsItIs) {
  const WriterPriority mine = CallingThread();
  AgentCore agent(&fs_, options_);
  EXPECT_FALSE(log_.Contains("persists run at"));
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent.Register(Rank0("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *seg, h, 2, 0x33));
  for (const WriterPriority& w : fs_.writers()) EXPECT_EQ(w, mine);
  EXPECT_EQ(RestoreAndCheck(agent, *seg, h, 2, 0x33, /*reread=*/false), RestoreSource::kMemory);
  EXPECT_EQ(RestoreAndCheck(agent, *seg, h, 2, 0x33, /*reread=*/true), RestoreSource::kRoot);
  EXPECT_THAT(agent.TrainerExited(h.trainer_id), IsOk());
}

// On a CPU that two busy threads keep saturated, the idle pool's workers
// would get about 0.3% of it; after starvation_limit, normal-priority
// threads finish the persist, and the agent says so.
TEST_F(BackgroundPriorityTest, APersistStarvedOfCpuIsFinishedByNormalPriorityThreads) {
  options_.background_priority = base::ThreadPriority::kIdle;
  options_.starvation_limit = absl::Milliseconds(300);
  options_.write.block_bytes = 1 << 20;
  TrainerRegistration reg = Rank0("job");
  reg.buffers = {Buffer("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 4u << 20)};
  cpu_set_t allowed;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed)) ++cpu;
  ASSERT_LT(cpu, CPU_SETSIZE);
  std::atomic<bool> stop{false};
  int64_t starved = 0;
  std::thread scene([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    // The agent's threads, the busy ones and this one: all on `cpu`.
    ASSERT_EQ(::sched_setaffinity(0, sizeof(one), &one), 0);
    std::vector<std::thread> busy;
    for (int i = 0; i < 2; ++i) {
      busy.emplace_back([&] {
        while (!stop.load(std::memory_order_relaxed)) {
        }
      });
    }
    {
      AgentCore agent(&fs_, options_);
      absl::StatusOr<TrainerHandle> h = agent.Register(reg);
      EXPECT_THAT(h, IsOk());
      if (h.ok()) {
        absl::StatusOr<std::unique_ptr<staging::StagingSegment>> seg = staging::StagingSegment::Open(h->segment);
        EXPECT_THAT(seg, IsOk());
        if (seg.ok()) {
          // 16 blocks of 1 MiB, each a task of the idle pool.
          SnapshotAndWait(agent, **seg, *h, 3, 0x77);
          starved = agent.starved_persists();
        }
        EXPECT_THAT(agent.TrainerExited(h->trainer_id), IsOk());
      }
    }
    stop.store(true);
    for (std::thread& t : busy) t.join();
  });
  scene.join();
  EXPECT_GE(starved, 1);
  EXPECT_TRUE(log_.Contains("persist work at idle priority starved (the workers got"))
      << ::testing::PrintToString(log_.lines());
}

}  // namespace
}  // namespace ckptd::agent
