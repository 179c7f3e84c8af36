#include "coordinator/coordinator_metrics.h"

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/testing/env.h"
#include "base/testing/matchers.h"
#include "base/version.h"
#include "coordinator/testing_core_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/testing_exposition.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::testing::IsOk;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

using ::ckptd::metrics::testing::PromtoolCheck;
using ::ckptd::metrics::testing::SampleValue;
using ::ckptd::testing::FindOnPath;

std::vector<std::string> Lines(const std::string& text) { return absl::StrSplit(text, '\n', absl::SkipEmpty()); }

double UnixSeconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

// The core's fixture with metrics: a 2-rank job of kJob on node-a and node-b.
class CoordinatorMetricsTest : public CoordinatorCoreTest {
 protected:
  void SetUp() override { Start(); }

  // A fresh core and registry over the same storage and state store.
  void Start() {
    collector_.Reset();
    core_.reset();
    metrics_.reset();
    registry_ = std::make_unique<metrics::Registry>();
    CKPTD_ASSERT_OK_AND_ASSIGN(metrics_, CoordinatorMetrics::Create(registry_.get()));
    options_.every_steps = 10;
    observer_ = metrics_.get();
    Reset();
    collector_ = metrics_->Watch(core_.get());
  }

  void TearDown() override {
    collector_.Reset();
    core_.reset();
  }

  // Writes a real shard of (step, rank) and reports it from `node` with these times.
  absl::StatusOr<ckptd::v1::ReportShardResponse> TimedShard(const std::string& node, uint64_t step, uint32_t rank,
                                                            double stall, double persist) {
    absl::StatusOr<ckptd::v1::ShardReport> r = Write(step, rank, 2);
    if (!r.ok()) return r.status();
    r->set_stall_seconds(stall);
    r->mutable_shard()->set_persist_seconds(persist);
    return core_->ReportShard(ShardRequest(node, *r));
  }

  // A committed step 10 and, on node-b, a trainer that died.
  void CommitAndFail() {
    Register("node-a", {0}, 2);
    Register("node-b", {1}, 2);
    ASSERT_THAT(TimedShard("node-a", 10, 0, 0.00390625, 0.7).status(), IsOk());
    clock_.Advance(absl::Milliseconds(30));
    CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ReportShardResponse last, TimedShard("node-b", 10, 1, 0.015625, 3));
    ASSERT_TRUE(last.committed());
    // Half of step 20, whose persist then fails on rank 1.
    ASSERT_THAT(TimedShard("node-a", 20, 0, 0.00390625, 0.7).status(), IsOk());
    CKPTD_ASSERT_OK(ReportFailure("node-b", 1, ckptd::v1::PERSIST_FAILED, 20, "ENOSPC"));
    CKPTD_ASSERT_OK(ReportFailure("node-b", 1, ckptd::v1::TRAINER_DIED, 20, "exit status 137"));
  }

  // The bytes of `step`'s shard files, as its MANIFEST lists them.
  uint64_t StepBytes(uint64_t step) {
    absl::StatusOr<ckptd::v1::StepManifest> m = store_.ReadManifest(kJob, step);
    EXPECT_THAT(m.status(), IsOk());
    uint64_t bytes = 0;
    if (m.ok()) {
      for (const auto& shard : m->shards()) bytes += shard.file_length();
    }
    return bytes;
  }

  std::unique_ptr<metrics::Registry> registry_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  metrics::CollectorHandle collector_;
};

TEST_F(CoordinatorMetricsTest, RenderAfterACommitAndAFailure) {
  CommitAndFail();
  const std::vector<std::string> lines = Lines(registry_->Render());
  EXPECT_THAT(lines, Contains("ckptd_agents 2"));
  EXPECT_THAT(lines, Contains("ckptd_agents_alive 2"));
  EXPECT_THAT(lines, Contains("ckptd_checkpoints_committed_total{job=\"llm-7b\"} 1"));
  EXPECT_THAT(lines, Contains("ckptd_checkpoints_aborted_total{job=\"llm-7b\"} 1"));
  EXPECT_THAT(lines, Contains("ckptd_job_newest_committed_step{job=\"llm-7b\"} 10"));
  // The persist failure counts per job, and the job's status says so too.
  EXPECT_THAT(lines, Contains("ckptd_persist_failures_total{job=\"llm-7b\"} 1"));
  EXPECT_THAT(lines, Contains("ckptd_job_restore_blocked{job=\"llm-7b\"} 0"));
  EXPECT_EQ(JobIn(core_->ClusterStatus()).persist_failures(), 1u);
  EXPECT_THAT(JobIn(core_->ClusterStatus()).last_persist_failure(), ::testing::HasSubstr("ENOSPC"));
  EXPECT_THAT(lines, Contains("ckptd_job_checkpoint_interval_steps{job=\"llm-7b\"} 10"));
  EXPECT_THAT(lines, Contains("ckptd_job_world_size{job=\"llm-7b\"} 2"));
  EXPECT_THAT(lines, Contains("ckptd_job_ranks_alive{job=\"llm-7b\"} 1"));
  // The dead trainer sends the job into a restart.
  EXPECT_THAT(lines, Contains("ckptd_job_state{job=\"llm-7b\",state=\"restarting\"} 1"));
  EXPECT_THAT(lines, Contains("ckptd_job_state{job=\"llm-7b\",state=\"running\"} 0"));
  EXPECT_THAT(lines, Contains("ckptd_failures_total{kind=\"trainer_died\"} 1"));
  EXPECT_THAT(lines, Contains("ckptd_failures_total{kind=\"persist_failed\"} 1"));
  EXPECT_THAT(lines, Contains("ckptd_failures_total{kind=\"node_lost\"} 0"));
  // Three shards reported: stalls 2^-8, 2^-6, 2^-8; persists 0.7, 3, 0.7.
  EXPECT_THAT(lines, Contains("ckptd_snapshot_stall_seconds_count{job=\"llm-7b\"} 3"));
  EXPECT_THAT(lines, Contains("ckptd_snapshot_stall_seconds_bucket{job=\"llm-7b\",le=\"0.005\"} 2"));
  EXPECT_THAT(lines, Contains("ckptd_snapshot_stall_seconds_sum{job=\"llm-7b\"} 0.0234375"));
  EXPECT_THAT(lines, Contains("ckptd_shard_persist_seconds_count{job=\"llm-7b\"} 3"));
  EXPECT_THAT(lines, Contains("ckptd_shard_persist_seconds_bucket{job=\"llm-7b\",le=\"1\"} 2"));
  EXPECT_THAT(lines, Contains("ckptd_shard_persist_seconds_bucket{job=\"llm-7b\",le=\"5\"} 3"));
  // The fake clock does not move during the commit: latency 0.
  EXPECT_THAT(lines, Contains("ckptd_commit_latency_seconds_count{job=\"llm-7b\"} 1"));
  EXPECT_THAT(lines, Contains("ckptd_commit_latency_seconds_bucket{job=\"llm-7b\",le=\"0.001\"} 1"));
  EXPECT_THAT(lines, Contains("# TYPE ckptd_commit_latency_seconds histogram"));
  EXPECT_THAT(lines, Contains("# TYPE ckptd_checkpoints_committed_total counter"));
  EXPECT_THAT(lines, Contains("# TYPE ckptd_job_state gauge"));
  // A second scrape adds nothing that did not happen.
  const std::vector<std::string> again = Lines(registry_->Render());
  EXPECT_THAT(again, Contains(absl::StrCat("ckptd_checkpoint_bytes_committed_total{job=\"llm-7b\"} ", StepBytes(10))));
  EXPECT_THAT(again, Contains("ckptd_checkpoints_committed_total{job=\"llm-7b\"} 1"));
  EXPECT_THAT(again, Contains("ckptd_checkpoints_aborted_total{job=\"llm-7b\"} 1"));
}

TEST_F(CoordinatorMetricsTest, BuildInfoCommitTimeAndCommittedBytes) {
  std::string text = registry_->Render();
  EXPECT_THAT(Lines(text), Contains(absl::StrCat("ckptd_build_info{component=\"coordinator\",version=\"",
                                                 base::Version(), "\"} 1")));
  // Nothing committed yet: no commit time.
  EXPECT_THAT(text, Not(HasSubstr("ckptd_job_last_commit_timestamp_seconds{")));
  Register("node-a", {0}, 2);
  Register("node-b", {1}, 2);
  text = registry_->Render();
  EXPECT_EQ(SampleValue(text, "ckptd_checkpoint_bytes_committed_total{job=\"llm-7b\"}"), 0);  // from 0
  EXPECT_THAT(text, Not(HasSubstr("ckptd_job_last_commit_timestamp_seconds{")));

  uint64_t committed = 0;
  for (const uint64_t step : {10u, 20u}) {
    clock_.Advance(absl::Seconds(90));
    ASSERT_THAT(TimedShard("node-a", step, 0, 0.01, 1).status(), IsOk());
    CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ReportShardResponse last, TimedShard("node-b", step, 1, 0.01, 1));
    ASSERT_TRUE(last.committed()) << step;
    committed += StepBytes(step);
    text = registry_->Render();
    EXPECT_EQ(SampleValue(text, "ckptd_job_last_commit_timestamp_seconds{job=\"llm-7b\"}"), UnixSeconds(clock_.Now()))
        << step;
    EXPECT_EQ(SampleValue(text, "ckptd_checkpoint_bytes_committed_total{job=\"llm-7b\"}"),
              static_cast<double>(committed))
        << step;
  }
  ASSERT_GT(committed, 0u);
  // Half of step 30 adds nothing.
  clock_.Advance(absl::Seconds(90));
  ASSERT_THAT(TimedShard("node-a", 30, 0, 0.01, 1).status(), IsOk());
  const absl::Time twenty = clock_.Now() - absl::Seconds(90);
  text = registry_->Render();
  EXPECT_EQ(SampleValue(text, "ckptd_job_last_commit_timestamp_seconds{job=\"llm-7b\"}"), UnixSeconds(twenty));
  EXPECT_EQ(SampleValue(text, "ckptd_checkpoint_bytes_committed_total{job=\"llm-7b\"}"),
            static_cast<double>(committed));

  // A coordinator started again finds the newest commit in its MANIFEST; the
  // bytes are this process's own.
  Start();
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::StepManifest m, store_.ReadManifest(kJob, 20));
  text = registry_->Render();
  EXPECT_EQ(SampleValue(text, "ckptd_job_last_commit_timestamp_seconds{job=\"llm-7b\"}"),
            UnixSeconds(absl::FromUnixNanos(m.committed_unix_nanos())));
  EXPECT_EQ(SampleValue(text, "ckptd_checkpoint_bytes_committed_total{job=\"llm-7b\"}"), 0);
}

TEST_F(CoordinatorMetricsTest, RestoredRanksBySource) {
  CommitAndFail();
  // No restore has ended yet: no series.
  EXPECT_THAT(Lines(registry_->Render()), Not(Contains(HasSubstr("ckptd_restored_ranks{"))));
  for (uint32_t r = 0; r < 2; ++r) CKPTD_ASSERT_OK(core_->GetRestorePlan(PlanRequest(r, std::nullopt, true, 2)).status());
  for (uint32_t r = 0; r < 2; ++r) {
    ckptd::v1::RestorePlanRequest req = PlanRequest(r, 10, true, 2);
    req.set_attempt_source(r == 0 ? ckptd::v1::AGENT_MEMORY : ckptd::v1::STORAGE_ROOT);
    CKPTD_ASSERT_OK(core_->GetRestorePlan(req).status());
  }
  std::vector<std::string> lines = Lines(registry_->Render());
  EXPECT_THAT(lines, Contains("ckptd_restored_ranks{job=\"llm-7b\",source=\"memory\"} 1"));
  EXPECT_THAT(lines, Contains("ckptd_restored_ranks{job=\"llm-7b\",source=\"storage-root\"} 1"));
  EXPECT_THAT(lines, Contains("ckptd_restored_ranks{job=\"llm-7b\",source=\"peer\"} 0"));
  EXPECT_THAT(lines, Contains("ckptd_restored_ranks{job=\"llm-7b\",source=\"node-local\"} 0"));
  EXPECT_THAT(lines, Contains("ckptd_restored_ranks_resharded{job=\"llm-7b\"} 0"));
  EXPECT_THAT(lines, Contains("ckptd_restored_saved_world_size{job=\"llm-7b\"} 0"));

  // The next restart reads the step resharded (saved by 2 ranks, other slices).
  for (uint32_t r = 0; r < 2; ++r) {
    CKPTD_ASSERT_OK(core_->GetRestorePlan(PlanRequest(r, std::nullopt, true, 2, /*trainer=*/2)).status());
  }
  for (uint32_t r = 0; r < 2; ++r) {
    ckptd::v1::RestorePlanRequest req = PlanRequest(r, 10, true, 2, /*trainer=*/2);
    req.set_attempt_source(ckptd::v1::STORAGE_ROOT);
    req.set_attempt_saved_world_size(2);
    CKPTD_ASSERT_OK(core_->GetRestorePlan(req).status());
  }
  lines = Lines(registry_->Render());
  EXPECT_THAT(lines, Contains("ckptd_restored_ranks{job=\"llm-7b\",source=\"storage-root\"} 2"));
  EXPECT_THAT(lines, Contains("ckptd_restored_ranks_resharded{job=\"llm-7b\"} 2"));
  EXPECT_THAT(lines, Contains("ckptd_restored_saved_world_size{job=\"llm-7b\"} 2"));
}

TEST_F(CoordinatorMetricsTest, TotalsSurviveACoordinatorRestart) {
  CommitAndFail();
  Start();  // same storage and state store, fresh core and registry
  const std::vector<std::string> lines = Lines(registry_->Render());
  EXPECT_THAT(lines, Contains("ckptd_checkpoints_committed_total{job=\"llm-7b\"} 1"));
  EXPECT_THAT(lines, Contains("ckptd_job_newest_committed_step{job=\"llm-7b\"} 10"));
  EXPECT_THAT(lines, Contains("ckptd_agents 0"));
  // Observations are this process's own.
  EXPECT_THAT(lines, Not(Contains(HasSubstr("ckptd_commit_latency_seconds_count"))));
}

TEST_F(CoordinatorMetricsTest, JobWithoutCommitHasNoNewestStep) {
  Register("node-a", {0}, 2);
  const std::string text = registry_->Render();
  EXPECT_THAT(text, HasSubstr("ckptd_job_world_size{job=\"llm-7b\"} 2"));
  EXPECT_THAT(text, Not(HasSubstr("ckptd_job_newest_committed_step{")));
}

TEST_F(CoordinatorMetricsTest, TheIntervalPolicysDecisionAndItsInputsAreExported) {
  Register("node-a", {0}, 2);
  Register("node-b", {1}, 2);
  std::string text = registry_->Render();
  // Before any measurement: the rate and MTBF from the prior, no decision yet.
  EXPECT_THAT(text, HasSubstr("ckptd_failure_rate_per_gpu_hour{bound=\"mean\"} 3e-06"));
  EXPECT_THAT(text, HasSubstr("ckptd_job_mtbf_seconds{job=\"llm-7b\"} 600000000"));  // 1/(2 GPUs x 3e-6/h)
  EXPECT_THAT(text, Not(HasSubstr("ckptd_job_checkpoint_interval_seconds{")));
  for (const auto& [node, rank] : {std::pair<std::string, uint32_t>{"node-a", 0}, {"node-b", 1}}) {
    ckptd::v1::Heartbeat hb = HeartbeatOf(node, {{rank, 9}}, 0.5);
    hb.mutable_progress(0)->set_step_seconds_idle(0.5);
    hb.mutable_progress(0)->set_step_seconds_persisting(0.5);
    CKPTD_ASSERT_OK(core_->OnHeartbeat(hb).status());
  }
  ASSERT_THAT(TimedShard("node-a", 10, 0, 0.25, 2).status(), IsOk());
  ASSERT_THAT(TimedShard("node-b", 10, 1, 0.5, 4).status(), IsOk());
  text = registry_->Render();
  ckptd::v1::GetIntervalRequest req;
  req.set_job(kJob);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::IntervalStatus st, core_->GetInterval(req));
  ASSERT_TRUE(st.decided()) << st.waiting_for();
  EXPECT_DOUBLE_EQ(st.cost_seconds(), 0.5);  // the slower rank's stall, no slowdown
  EXPECT_THAT(text, HasSubstr("ckptd_job_checkpoint_cost_seconds{job=\"llm-7b\"} 0.5\n"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("ckptd_job_checkpoint_interval_seconds{job=\"llm-7b\"} ",
                                           metrics::FormatValue(st.interval_seconds()), "\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("ckptd_job_expected_waste_ratio{job=\"llm-7b\",interval=\"chosen\"} ",
                                           metrics::FormatValue(st.expected_waste()), "\n")));
  EXPECT_THAT(text, HasSubstr("ckptd_job_expected_waste_ratio{job=\"llm-7b\",interval=\"alternative\"} "));
}

TEST_F(CoordinatorMetricsTest, ReplicationPartnersAndPeerCopies) {
  for (const auto& [node, rank, rack] : {std::tuple<std::string, uint32_t, std::string>{"node-a", 0, "rack-1"},
                                         {"node-b", 1, "rack-2"}}) {
    ckptd::v1::RegisterAgentRequest req = Registration(node, {rank}, 2);
    req.set_peer_address(node + ":7300");
    req.set_failure_domain(rack);
    req.set_replicas(2);  // one other rack: one partner each
    Register(req);
  }
  ASSERT_THAT(TimedShard("node-a", 10, 0, 0.01, 1).status(), IsOk());
  ASSERT_THAT(TimedShard("node-b", 10, 1, 0.01, 1).status(), IsOk());
  // node-b holds node-a's rank 0 of step 10.
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::StepManifest m, store_.ReadManifest(kJob, 10));
  ckptd::v1::Heartbeat hb = HeartbeatOf("node-b");
  for (const auto& shard : m.shards()) {
    if (shard.rank() != 0) continue;
    ckptd::v1::MemoryCopy* c = hb.add_memory();
    c->set_job(kJob);
    c->set_rank(0);
    c->set_step(10);
    c->set_owner_node("node-a");
    c->set_file_length(shard.file_length());
    c->set_index_xxh3(shard.index_xxh3());
  }
  ASSERT_EQ(hb.memory_size(), 1);
  clock_.Advance(absl::Seconds(1));  // past the recomputation's pace
  CKPTD_ASSERT_OK(core_->OnHeartbeat(hb).status());
  std::vector<std::string> lines = Lines(registry_->Render());
  EXPECT_THAT(lines, Contains("ckptd_replication_partners{node=\"node-a\"} 1"));
  EXPECT_THAT(lines, Contains("ckptd_replication_partners{node=\"node-b\"} 1"));
  EXPECT_THAT(lines, Contains("ckptd_peer_copies{job=\"llm-7b\"} 1"));
  // node-b is lost: its series goes, node-a has no partner, no peer copy is left.
  clock_.Advance(options_.node_lost_after + absl::Seconds(1));
  CKPTD_ASSERT_OK(Beat("node-a").status());
  core_->Tick();
  lines = Lines(registry_->Render());
  EXPECT_THAT(lines, Not(Contains(HasSubstr("ckptd_replication_partners{node=\"node-b\"}"))));
  EXPECT_THAT(lines, Contains("ckptd_replication_partners{node=\"node-a\"} 0"));
  EXPECT_THAT(lines, Contains("ckptd_peer_copies{job=\"llm-7b\"} 0"));
}

TEST_F(CoordinatorMetricsTest, TheAuditTrailsCounts) {
  // Present from the start, at zero.
  std::vector<std::string> lines = Lines(registry_->Render());
  EXPECT_THAT(lines, Contains("ckptd_audit_records_total{outcome=\"granted\"} 0"));
  EXPECT_THAT(lines, Contains("ckptd_audit_records_total{outcome=\"refused\"} 0"));
  EXPECT_THAT(lines, Contains("ckptd_audit_records_suppressed_total 0"));
  EXPECT_THAT(lines, Contains("ckptd_audit_write_errors_total 0"));
  AuditObserver* audit = metrics_.get();
  audit->OnAuditRecord(true);
  audit->OnAuditRecord(true);
  audit->OnAuditRecord(false);
  audit->OnAuditSuppressed();
  audit->OnAuditWriteError();
  lines = Lines(registry_->Render());
  EXPECT_THAT(lines, Contains("ckptd_audit_records_total{outcome=\"granted\"} 2"));
  EXPECT_THAT(lines, Contains("ckptd_audit_records_total{outcome=\"refused\"} 1"));
  EXPECT_THAT(lines, Contains("ckptd_audit_records_suppressed_total 1"));
  EXPECT_THAT(lines, Contains("ckptd_audit_write_errors_total 1"));
}

TEST_F(CoordinatorMetricsTest, ExpositionPassesPromtool) {
  const std::string promtool = FindOnPath("promtool");
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool is not on PATH; it comes with the Debian package 'prometheus'";
  }
  CommitAndFail();
  const metrics::testing::PromtoolResult checked = PromtoolCheck(promtool, registry_->Render());
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
}

}  // namespace
}  // namespace ckptd::coordinator
