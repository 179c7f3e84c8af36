// AgentOptions::background_priority: persists run at low CPU priority,
// restores (on a pool of their own) do not, from every tier.
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent_core.h"
#include "agent/testing_agent_harness.h"
#include "base/testing/busy_cpu.h"
#include "base/testing/capturing_logger.h"
#include "base/testing/matchers.h"
#include "base/testing/threads.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "staging/staging.h"
#include "storage/mem_file_system.h"

namespace ckptd::agent {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::ThreadsNamed;
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
  class File : public storage::ForwardingWritableFile {
   public:
    File(RecordingFs* fs, std::unique_ptr<storage::WritableFile> f)
        : ForwardingWritableFile(std::move(f)), fs_(fs) {}
    absl::StatusOr<uint64_t> Write(uint64_t offset, const void* data, size_t n) override {
      {
        absl::MutexLock l(&fs_->mu_);
        fs_->writers_.push_back(CallingThread());
      }
      return ForwardingWritableFile::Write(offset, data, n);
    }

   private:
    RecordingFs* const fs_;
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
  // The persister that submits the writes runs at nice 19, not SCHED_IDLE
  // (its CPU work runs on the idle pool), at the lowest best-effort I/O
  // priority.
  const WriterPriority mine = CallingThread();
  const std::vector<WriterPriority> writers = fs_.writers();
  ASSERT_FALSE(writers.empty());
  for (const WriterPriority& w : writers) {
    EXPECT_EQ(w.policy, mine.policy);
    EXPECT_EQ(w.nice, 19);
    EXPECT_EQ(w.ioprio, kLowestBestEffortIo);
  }
  // By name: the trainer's persister at nice 19; every starvation reserve
  // (the persist pool's, and the one of the trainer's memory-checkpoint
  // encoder, made by its persister) at this thread's priority, never below.
  const std::vector<int> persisters = ThreadsNamed("ckptd-persist");
  ASSERT_EQ(persisters.size(), 1u);
  EXPECT_EQ(::getpriority(PRIO_PROCESS, static_cast<id_t>(persisters[0])), 19);
  const std::vector<int> reserve = ThreadsNamed("ckptd-reserve");
  EXPECT_GE(reserve.size(), 2u);
  for (int tid : reserve) {
    EXPECT_EQ(::sched_getscheduler(tid), mine.policy);
    EXPECT_EQ(::getpriority(PRIO_PROCESS, static_cast<id_t>(tid)), mine.nice);
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
    EXPECT_EQ(w.nice, 19);
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
// may get about 0.3% of it; after starvation_limit, normal-priority threads
// finish the persist, and the agent says so.
TEST_F(BackgroundPriorityTest, APersistOnACpuKeptBusyIsDone) {
  options_.background_priority = base::ThreadPriority::kIdle;
  options_.starvation_limit = absl::Milliseconds(300);
  options_.write.block_bytes = 1 << 20;
  options_.write.encode.compress = true;  // always: the CPU work to starve
  options_.write.adaptive.enabled = false;
  TrainerRegistration reg = Rank0("job");
  reg.buffers = {Buffer("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 8u << 20)};
  int64_t starved = 0;
  // The agent's threads, two busy ones and the test's: all on one CPU.
  ::ckptd::testing::OnABusyCpu(2, [&] {
    AgentCore agent(&fs_, options_);
    absl::StatusOr<TrainerHandle> h = agent.Register(reg);
    ASSERT_THAT(h, IsOk());
    absl::StatusOr<std::unique_ptr<staging::StagingSegment>> seg = staging::StagingSegment::Open(h->segment);
    ASSERT_THAT(seg, IsOk());
    // 32 blocks of 1 MiB that zstd cannot shrink, each a task of the idle
    // pool: about 0.1 s of a CPU at full speed, a minute at SCHED_IDLE's
    // share.
    CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, (*seg)->AcquireForFill(absl::Seconds(10)));
    uint64_t x = 0x9e3779b97f4a7c15;
    auto* words = reinterpret_cast<uint64_t*>((*seg)->slot_data(slot));
    for (uint64_t i = 0; i < h->slot_bytes / 8; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      words[i] = x;
    }
    ASSERT_THAT((*seg)->Publish(slot, 3), IsOk());
    ASSERT_THAT(agent.SnapshotPublished(h->trainer_id, slot, 3, 0), IsOk());
    CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.WaitPersisted(h->trainer_id, 3, absl::Seconds(120)));
    ASSERT_THAT(st.last_persisted_step, Optional(3u)) << st.last_error;
    starved = agent.starved_persists();
    EXPECT_THAT(agent.TrainerExited(h->trainer_id), IsOk());
  });
  // Whether the workers starved depends on the kernel's scheduler (one that
  // credits a thread for the time it slept serves a bursty SCHED_IDLE
  // worker sooner); the pool's own tests check the guard on counts they
  // set. Here: the persist is done, and a boost is said.
  EXPECT_TRUE(log_.Contains("persist work starved of CPU for 300ms goes to normal-priority threads"))
      << ::testing::PrintToString(log_.lines());
  EXPECT_EQ(starved >= 1, log_.Contains("persist work at idle priority starved (the workers got"))
      << starved << " " << ::testing::PrintToString(log_.lines());
}

}  // namespace
}  // namespace ckptd::agent
