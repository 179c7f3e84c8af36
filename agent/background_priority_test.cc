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

// The priority of a thread that wrote checkpoint data.
struct WriterPriority {
  int policy = -1;
  int nice = 0;
  bool operator==(const WriterPriority& o) const { return policy == o.policy && nice == o.nice; }
};

WriterPriority CallingThread() {
  return {::sched_getscheduler(0), ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)))};
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
  const std::vector<WriterPriority> writers = fs_.writers();
  ASSERT_FALSE(writers.empty());
  for (const WriterPriority& w : writers) {
    if (idle) {
      EXPECT_EQ(w.policy, SCHED_IDLE);
    } else {
      EXPECT_EQ(w.nice, 19);
    }
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
  for (const WriterPriority& w : fs_.writers()) EXPECT_EQ(w.nice, 19);
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

}  // namespace
}  // namespace ckptd::agent
