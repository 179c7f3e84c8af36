#include "agent/agent_metrics.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/testing_agent_harness.h"
#include "base/clock.h"
#include "base/testing/env.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "base/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/registry.h"
#include "metrics/testing_exposition.h"
#include "storage/fault_injection_file_system.h"
#include "storage/mem_file_system.h"
#include "storage/store.h"

namespace ckptd::agent {
namespace {

using ::ckptd::metrics::testing::PromtoolCheck;
using ::ckptd::metrics::testing::SampleValue;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Optional;

// FiveComponents' buffers together.
constexpr uint64_t kFiveComponentsBytes = 3000 * 4 + 3000 * 4 + 6000 * 4 + 100 + 24;

std::vector<std::string> Lines(const std::string& text) { return absl::StrSplit(text, '\n', absl::SkipEmpty()); }

class AgentMetricsTest : public ::testing::Test {
 protected:
  AgentMetricsTest() {
    EXPECT_THAT(mem_.CreateDir("/ckpt"), IsOk());
    absl::StatusOr<std::unique_ptr<AgentMetrics>> m = AgentMetrics::Create(&registry_);
    EXPECT_THAT(m, IsOk());
    if (m.ok()) metrics_ = *std::move(m);
    options_.observer = metrics_.get();
  }

  // The agent over `fs`, watched by the metrics.
  void Start(storage::FileSystem* fs) {
    agent_ = std::make_unique<AgentCore>(fs, options_);
    AgentMetrics::Sources sources;
    sources.core = agent_.get();
    collector_ = metrics_->Watch(sources);
  }

  void TearDown() override {
    collector_.Reset();
    agent_.reset();
  }

  storage::MemFileSystem mem_;
  base::FakeClock clock_;  // outlives the agent; used where a test sets options_.clock
  AgentOptions options_ = TestAgentOptions("metrics");
  metrics::Registry registry_;
  std::unique_ptr<AgentMetrics> metrics_;
  std::unique_ptr<AgentCore> agent_;
  metrics::CollectorHandle collector_;
};

TEST_F(AgentMetricsTest, BuildInfoAndGaugesBeforeAnyTrainer) {
  Start(&mem_);
  const std::vector<std::string> lines = Lines(registry_.Render());
  EXPECT_THAT(lines,
              Contains(absl::StrCat("ckptd_build_info{component=\"agent\",version=\"", base::Version(), "\"} 1")));
  EXPECT_THAT(lines, Contains("ckptd_agent_trainers 0"));
  EXPECT_THAT(lines, Contains("ckptd_agent_staging_bytes 0"));
  EXPECT_THAT(lines, Contains("ckptd_agent_memory_tier_bytes 0"));
  EXPECT_THAT(lines, Contains("ckptd_agent_replication_failures_total 0"));
  // Without a coordinator link to read: 0.
  EXPECT_THAT(lines, Contains("ckptd_agent_coordinator_connected 0"));
  // No job yet: no per-job series.
  EXPECT_THAT(lines, Not(Contains(HasSubstr("{job="))));
}

TEST_F(AgentMetricsTest, PersistsRestoresSkipsAndDeathsAreCounted) {
  Start(&mem_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent_->Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  std::string text = registry_.Render();
  EXPECT_EQ(SampleValue(text, "ckptd_agent_trainers"), 1);
  const std::optional<double> staging = SampleValue(text, "ckptd_agent_staging_bytes");
  ASSERT_TRUE(staging.has_value()) << text;
  EXPECT_GE(*staging, static_cast<double>(h.slots * seg->slot_bytes()));
  // Every series of the job from 0.
  EXPECT_EQ(SampleValue(text, "ckptd_agent_snapshots_persisted_total{job=\"job\"}"), 0);
  EXPECT_EQ(SampleValue(text, "ckptd_agent_restores_total{job=\"job\",source=\"storage-root\"}"), 0);
  EXPECT_EQ(SampleValue(text, "ckptd_agent_replication_lag_steps{job=\"job\"}"), 0);  // no replication

  for (const uint64_t step : {10u, 20u}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(*agent_, *seg, h, step));
  storage::CheckpointStore store(&mem_, "/ckpt");
  uint64_t written = 0;
  for (const uint64_t step : {10u, 20u}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::StepManifest m, store.ReadManifest("job", step));
    ASSERT_EQ(m.shards_size(), 1);
    written += m.shards(0).file_length();
  }
  text = registry_.Render();
  EXPECT_EQ(SampleValue(text, "ckptd_agent_snapshots_persisted_total{job=\"job\"}"), 2);
  EXPECT_EQ(SampleValue(text, "ckptd_agent_persisted_bytes_total{job=\"job\"}"), static_cast<double>(written));
  EXPECT_EQ(SampleValue(text, "ckptd_agent_persist_seconds_count{job=\"job\"}"), 2);
  EXPECT_EQ(SampleValue(text, "ckptd_agent_persist_failures_total{job=\"job\"}"), 0);
  // Each persisted step stays in its slot, in memory.
  const std::optional<double> kept = SampleValue(text, "ckptd_agent_memory_tier_bytes");
  ASSERT_TRUE(kept.has_value()) << text;
  EXPECT_GE(*kept, static_cast<double>(seg->slot_bytes()));
  EXPECT_LE(*kept, 2.0 * static_cast<double>(seg->slot_bytes()));

  CKPTD_ASSERT_OK(agent_->SnapshotSkipped(h.trainer_id, 30, "no free staging slot within 0s"));
  EXPECT_EQ(SampleValue(registry_.Render(), "ckptd_agent_snapshots_skipped_total{job=\"job\"}"), 1);

  // A restart's restore reads step 20 from the agent's memory.
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent_->Restore(h.trainer_id, absl::Seconds(10)));
  ASSERT_THAT(r.step, Optional(20u));
  ASSERT_EQ(r.source, RestoreSource::kMemory);
  CKPTD_ASSERT_OK(seg->Release(r.slot));
  text = registry_.Render();
  EXPECT_EQ(SampleValue(text, "ckptd_agent_restores_total{job=\"job\",source=\"memory\"}"), 1);
  EXPECT_EQ(SampleValue(text, "ckptd_agent_restores_total{job=\"job\",source=\"storage-root\"}"), 0);
  EXPECT_EQ(SampleValue(text, "ckptd_agent_restored_bytes_total{job=\"job\"}"),
            static_cast<double>(kFiveComponentsBytes));
  EXPECT_EQ(SampleValue(text, "ckptd_agent_restore_seconds_count{job=\"job\"}"), 1);
  EXPECT_EQ(SampleValue(text, "ckptd_agent_restore_failures_total{job=\"job\"}"), 0);

  // A registration the checkpoint does not fit: its restore fails.
  TrainerRegistration bigger = FiveComponents("job");
  bigger.buffers[2] = Buffer("adam", ckptd::v1::OPTIMIZER, ckptd::v1::FLOAT32, 6001);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h2, agent_->Register(bigger));
  EXPECT_THAT(agent_->Restore(h2.trainer_id, absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("buffer 'adam'")));
  text = registry_.Render();
  EXPECT_EQ(SampleValue(text, "ckptd_agent_restore_failures_total{job=\"job\"}"), 1);
  EXPECT_EQ(SampleValue(text, "ckptd_agent_restores_total{job=\"job\",source=\"memory\"}"), 1);

  // One trainer dies, the other says goodbye: only the death counts.
  CKPTD_ASSERT_OK(agent_->TrainerExited(h2.trainer_id, /*died=*/true));
  CKPTD_ASSERT_OK(agent_->TrainerExited(h.trainer_id));
  text = registry_.Render();
  EXPECT_EQ(SampleValue(text, "ckptd_agent_trainer_failures_total{job=\"job\"}"), 1);
  EXPECT_EQ(SampleValue(text, "ckptd_agent_trainers"), 0);
  // No trainer of the job is left: its lag goes, its counters stay.
  EXPECT_EQ(SampleValue(text, "ckptd_agent_replication_lag_steps{job=\"job\"}"), std::nullopt);
  EXPECT_EQ(SampleValue(text, "ckptd_agent_snapshots_persisted_total{job=\"job\"}"), 2);
}

TEST_F(AgentMetricsTest, FailedPersistsAreCounted) {
  storage::FaultInjectionFileSystem fs(&mem_);
  // A full disk for the shard files.
  fs.FailPath("rank-0.shard", storage::Fault::kEnospc, storage::FaultScope::kWrites);
  Start(&fs);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent_->Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  for (const uint64_t step : {1u, 2u}) {
    ASSERT_NO_FATAL_FAILURE(Snapshot(*agent_, *seg, h, step));
    CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent_->WaitPersisted(h.trainer_id, step, absl::Seconds(30)));
    ASSERT_THAT(st.last_failed_step, Optional(step));
  }
  std::string text = registry_.Render();
  EXPECT_EQ(SampleValue(text, "ckptd_agent_persist_failures_total{job=\"job\"}"), 2);
  EXPECT_EQ(SampleValue(text, "ckptd_agent_snapshots_persisted_total{job=\"job\"}"), 0);
  EXPECT_EQ(SampleValue(text, "ckptd_agent_persist_seconds_count{job=\"job\"}"), std::nullopt);
  // The disk has room again.
  fs.ClearPath("rank-0.shard");
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(*agent_, *seg, h, 3));
  text = registry_.Render();
  EXPECT_EQ(SampleValue(text, "ckptd_agent_persist_failures_total{job=\"job\"}"), 2);
  EXPECT_EQ(SampleValue(text, "ckptd_agent_snapshots_persisted_total{job=\"job\"}"), 1);
  CKPTD_ASSERT_OK(agent_->TrainerExited(h.trainer_id));
}

TEST_F(AgentMetricsTest, PersistTimeRunsFromThePublish) {
  options_.clock = &clock_;
  Start(&mem_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent_->Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  // The agent hears of the publish at t0, and the persister (which polls on
  // the clock) finds the slot ready only 40 s later.
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::Seconds(10)));
  CKPTD_ASSERT_OK(agent_->SnapshotPublished(h.trainer_id, slot, 7));
  clock_.Advance(absl::Seconds(40));
  CKPTD_ASSERT_OK(seg->Publish(slot, 7));
  ASSERT_TRUE(ckptd::testing::Eventually([&] {
    clock_.Advance(absl::Milliseconds(100));  // the persister's poll
    absl::StatusOr<PersistStatus> st = agent_->Status(h.trainer_id);
    return st.ok() && (st->last_persisted_step || st->last_failed_step);
  }));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent_->Status(h.trainer_id));
  ASSERT_THAT(st.last_persisted_step, Optional(7u)) << st.last_error;
  const std::string text = registry_.Render();
  EXPECT_EQ(SampleValue(text, "ckptd_agent_persist_seconds_count{job=\"job\"}"), 1);
  EXPECT_EQ(SampleValue(text, "ckptd_agent_persist_seconds_bucket{job=\"job\",le=\"30\"}"), 0) << text;
  const std::optional<double> sum = SampleValue(text, "ckptd_agent_persist_seconds_sum{job=\"job\"}");
  ASSERT_TRUE(sum.has_value()) << text;
  EXPECT_GE(*sum, 40);
  CKPTD_ASSERT_OK(agent_->TrainerExited(h.trainer_id));
}

TEST_F(AgentMetricsTest, ReadinessSaysWhatIsMissing) {
  EXPECT_EQ(AgentNotReady(false, "", false, absl::OkStatus()), "the trainers' socket is not served");
  EXPECT_EQ(AgentNotReady(true, "", false, absl::OkStatus()), "");
  EXPECT_EQ(AgentNotReady(true, "c:7070", true, absl::OkStatus()), "");
  EXPECT_EQ(AgentNotReady(true, "c:7070", false, absl::OkStatus()),
            "not registered with the coordinator at c:7070 yet");
  EXPECT_EQ(AgentNotReady(true, "c:7070", false, absl::UnavailableError("c:7070: failed to connect")),
            "not registered with the coordinator at c:7070: failed to connect");
  // Replicas: the error names the one it is of.
  EXPECT_EQ(AgentNotReady(true, "a:1,b:2", false, absl::UnavailableError("b:2: a standby")),
            "not registered with the coordinator at a:1,b:2: b:2: a standby");
}

TEST_F(AgentMetricsTest, ExpositionPassesPromtool) {
  const std::string promtool = ckptd::testing::FindOnPath("promtool");
  if (promtool.empty()) GTEST_SKIP() << "promtool is not on PATH; it comes with the Debian package 'prometheus'";
  Start(&mem_);
  CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, agent_->Register(FiveComponents("job")));
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(h.segment));
  ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(*agent_, *seg, h, 10));
  CKPTD_ASSERT_OK(agent_->SnapshotSkipped(h.trainer_id, 20, "no free staging slot"));
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent_->Restore(h.trainer_id, absl::Seconds(10)));
  CKPTD_ASSERT_OK(seg->Release(r.slot));
  const std::string exposition = registry_.Render();
  ASSERT_THAT(exposition, HasSubstr("ckptd_agent_restore_seconds_bucket"));
  const metrics::testing::PromtoolResult checked = PromtoolCheck(promtool, exposition);
  EXPECT_EQ(checked.exit_code, 0) << checked.output << "\non:\n" << exposition;
  EXPECT_EQ(checked.output, "") << exposition;
  CKPTD_ASSERT_OK(agent_->TrainerExited(h.trainer_id));
}

}  // namespace
}  // namespace ckptd::agent
