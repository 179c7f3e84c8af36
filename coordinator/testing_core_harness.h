// What the CoordinatorCore tests (coordinator_*_test.cc) share: a core over
// MemFileSystem, the in-memory state store and a FakeClock, the calls its
// agents and ranks make, and their fixture. A helper whose call goes wrong
// reports it through Fail(), which the fixture turns into a test failure.
// coordinator_service_test sends the same requests over gRPC.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "ckptd/v1/coordinator.pb.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/state_store.h"
#include "gtest/gtest.h"
#include "storage/mem_file_system.h"
#include "storage/store.h"
#include "storage/testing_data.h"

namespace ckptd::coordinator {

// The core and its storage, and the requests its agents and ranks send it,
// built but not sent: for tests that send them their own way
// (coordinator_service_test over gRPC).
class CoreRequests {
 public:
  static constexpr char kJob[] = "llm-7b";
  static constexpr char kRoot[] = "/ckpt";

  virtual ~CoreRequests() = default;

 protected:
  using PlanResponse = ckptd::v1::RestorePlanResponse;

  // A helper's call went wrong: `what` says which and how.
  virtual void Fail(const std::string& what) = 0;

  void Check(const absl::Status& s, absl::string_view what) {
    if (!s.ok()) Fail(absl::StrCat(what, ": ", s.ToString()));
  }

  // A new core over the same storage and state store, recovered.
  void Reset() {
    core_ = std::make_unique<CoordinatorCore>(&store_, state_.get(), &clock_, options_, observer_);
    Check(core_->Recover(), "Recover");
  }

  // Node `node` hosting `ranks` of kJob (world `world`).
  static ckptd::v1::RegisterAgentRequest Registration(const std::string& node, std::vector<uint32_t> ranks,
                                                      uint32_t world = 4, bool drills_allowed = false) {
    ckptd::v1::RegisterAgentRequest req;
    req.set_node_id(node);
    req.set_drills_allowed(drills_allowed);
    req.set_memory_tier(true);  // as a ckptd-agent's default
    for (uint32_t r : ranks) {
      ckptd::v1::RankInfo* info = req.add_ranks();
      info->set_job(kJob);
      info->set_rank(r);
      info->set_world_size(world);
      info->set_pid(1000 + static_cast<int>(r));
    }
    return req;
  }

  // The heartbeat of registered `node`: its ranks, and `progress` as (rank, step).
  ckptd::v1::Heartbeat HeartbeatOf(const std::string& node,
                                   const std::vector<std::pair<uint32_t, uint64_t>>& progress = {},
                                   double step_seconds = 0.1) {
    ckptd::v1::Heartbeat hb;
    hb.set_node_id(node);
    hb.set_session(sessions_[node]);
    for (const auto& r : ranks_[node].ranks()) *hb.add_ranks() = r;
    for (const auto& [rank, step] : progress) {
      ckptd::v1::RankProgress* p = hb.add_progress();
      p->set_job(kJob);
      p->set_rank(rank);
      p->set_step(step);
      p->set_step_seconds(step_seconds);
    }
    return hb;
  }

  // The report of a shard of (step, rank) that is `length` bytes with index digest `digest`.
  static ckptd::v1::ShardReport ReportOf(uint64_t step, uint32_t rank, uint64_t length, uint64_t digest,
                                         uint32_t world = 4, uint64_t incarnation = 0) {
    ckptd::v1::ShardReport r;
    r.set_job(kJob);
    r.set_step(step);
    r.set_world_size(world);
    r.set_incarnation(incarnation);
    r.mutable_shard()->set_rank(rank);
    r.mutable_shard()->set_file_length(length);
    r.mutable_shard()->set_index_xxh3(digest);
    r.mutable_shard()->set_persist_seconds(0.25);
    r.set_stall_seconds(0.01);
    return r;
  }

  // Writes a real shard of (step, rank): the report its agent would send.
  absl::StatusOr<ckptd::v1::ShardReport> Write(uint64_t step, uint32_t rank, uint32_t world = 4,
                                               uint64_t incarnation = 0) {
    absl::Status prep = store_.PrepareStep(kJob, step);
    if (!prep.ok()) return prep;
    ckptd::testing::RankData data = ckptd::testing::MakeRankData(step, rank, 256, 16);
    std::vector<storage::TensorSource> src = ckptd::testing::RankSources(data, "w", "rng");
    absl::StatusOr<storage::ShardWriteResult> w = store_.WriteShard(kJob, step, rank, world, src);
    if (!w.ok()) return w.status();
    ckptd::v1::ShardReport r = ReportOf(step, rank, w->file_length, w->index_xxh3, world, incarnation);
    r.mutable_shard()->set_raw_bytes(w->raw_bytes);
    r.mutable_shard()->set_stored_bytes(w->stored_bytes);
    return r;
  }

  // `report` sent by registered `node`.
  ckptd::v1::ReportShardRequest ShardRequest(const std::string& node, const ckptd::v1::ShardReport& report) {
    ckptd::v1::ReportShardRequest req;
    req.set_node_id(node);
    req.set_session(sessions_[node]);
    *req.mutable_report() = report;
    return req;
  }

  // The registered node hosting `rank` of kJob ("" when none does).
  std::string NodeOf(uint32_t rank) const {
    for (const auto& [node, reg] : ranks_) {
      for (const auto& r : reg.ranks()) {
        if (r.job() == kJob && r.rank() == rank) return node;
      }
    }
    return "";
  }

  // Rank `rank` asks for a plan, having loaded `attempt` (intact when `ok`),
  // through the agent of the node that registered it, as the trainer that
  // registered it (pid 1000 + rank, agent's trainer id `trainer`).
  ckptd::v1::RestorePlanRequest PlanRequest(uint32_t rank, std::optional<uint64_t> attempt = std::nullopt,
                                            bool ok = true, uint32_t world = 4, uint64_t trainer = 1) {
    ckptd::v1::RestorePlanRequest req;
    req.set_node_id(NodeOf(rank));
    req.set_session(sessions_[req.node_id()]);
    req.set_pid(1000 + static_cast<int>(rank));
    req.set_trainer_id(trainer);
    req.set_job(kJob);
    req.set_rank(rank);
    req.set_world_size(world);
    if (attempt) {
      req.set_has_attempt(true);
      req.set_attempt_step(*attempt);
      req.set_attempt_ok(ok);
      if (!ok) req.set_problem("chunk 3 checksum mismatch");
    }
    return req;
  }

  // Registered `node` reports a failure of `rank` of kJob.
  ckptd::v1::ReportFailureRequest FailureRequest(const std::string& node, uint32_t rank, ckptd::v1::FailureKind kind,
                                                 uint64_t step = 0, const std::string& detail = "") {
    ckptd::v1::ReportFailureRequest req;
    req.set_node_id(node);
    req.set_session(sessions_[node]);
    req.set_job(kJob);
    req.set_rank(rank);
    req.set_kind(kind);
    req.set_step(step);
    req.set_detail(detail);
    return req;
  }

  // kJob's entry in `status`.
  ckptd::v1::JobStatus JobIn(const ckptd::v1::GetClusterStatusResponse& status) {
    for (const auto& j : status.jobs()) {
      if (j.job() == kJob) return j;
    }
    Fail(absl::StrCat("no job ", kJob));
    return {};
  }

  storage::MemFileSystem fs_;
  storage::CheckpointStore store_{&fs_, kRoot};
  std::unique_ptr<StateStore> state_ = NewMemStateStore();
  base::FakeClock clock_;
  CoordinatorOptions options_;
  CoordinatorObserver* observer_ = nullptr;  // what Reset() gives the core
  std::unique_ptr<CoordinatorCore> core_;
  // Per registered node: its session and its registration.
  std::map<std::string, std::string> sessions_;
  std::map<std::string, std::string> fetch_keys_;  // by node: its latest registration's
  std::map<std::string, ckptd::v1::RegisterAgentRequest> ranks_;
};

// The requests sent to the core directly, and what the core's tests do with them.
class CoreHarness : public CoreRequests {
 protected:
  // Registers `req`'s node; returns its session.
  std::string Register(const ckptd::v1::RegisterAgentRequest& req) {
    absl::StatusOr<ckptd::v1::RegisterAgentResponse> resp = core_->RegisterAgent(req);
    Check(resp.status(), absl::StrCat("registering ", req.node_id()));
    sessions_[req.node_id()] = resp.ok() ? resp->session() : "";
    fetch_keys_[req.node_id()] = resp.ok() ? resp->fetch_key() : "";
    ranks_[req.node_id()] = req;
    return sessions_[req.node_id()];
  }

  // Registers node `node` hosting `ranks` of kJob (world `world`).
  std::string Register(const std::string& node, std::vector<uint32_t> ranks, uint32_t world = 4,
                    bool drills_allowed = false) {
    return Register(Registration(node, std::move(ranks), world, drills_allowed));
  }

  absl::StatusOr<ckptd::v1::HeartbeatAck> Beat(const std::string& node,
                                               std::vector<std::pair<uint32_t, uint64_t>> progress = {},
                                               double step_seconds = 0.1) {
    return core_->OnHeartbeat(HeartbeatOf(node, progress, step_seconds));
  }

  // Writes a real shard of (step, rank) and reports it from `node`.
  absl::StatusOr<ckptd::v1::ReportShardResponse> Shard(const std::string& node, uint64_t step, uint32_t rank,
                                                       uint32_t world = 4, uint64_t incarnation = 0) {
    absl::StatusOr<ckptd::v1::ShardReport> r = Write(step, rank, world, incarnation);
    if (!r.ok()) return r.status();
    return core_->ReportShard(ShardRequest(node, *r));
  }

  // Reports a shard of (step, rank) from `node` without writing it.
  absl::StatusOr<ckptd::v1::ReportShardResponse> ReportOnly(const std::string& node, uint64_t step, uint32_t rank,
                                                            uint64_t length, uint64_t digest, uint32_t world = 4,
                                                            uint64_t incarnation = 0) {
    return core_->ReportShard(ShardRequest(node, ReportOf(step, rank, length, digest, world, incarnation)));
  }

  // Rank `rank` asks for a plan as the agent's trainer `trainer` (a trainer
  // started again has a new id).
  absl::StatusOr<PlanResponse> Plan(uint32_t rank, std::optional<uint64_t> attempt = std::nullopt, bool ok = true,
                                    uint32_t world = 4, uint64_t trainer = 1) {
    return core_->GetRestorePlan(PlanRequest(rank, attempt, ok, world, trainer));
  }

  // Registered `node` reports a failure of `rank` of kJob.
  absl::Status ReportFailure(const std::string& node, uint32_t rank, ckptd::v1::FailureKind kind, uint64_t step = 0,
                             const std::string& detail = "") {
    return core_->ReportFailure(FailureRequest(node, rank, kind, step, detail));
  }

  // Every rank loads `step` intact; returns the incarnation of the round.
  uint64_t RestoreAll(uint64_t step, uint32_t world = 4) {
    auto expect = [&](uint32_t r, const absl::StatusOr<PlanResponse>& p, PlanResponse::Verdict verdict) {
      if (!p.ok()) {
        Fail(absl::StrCat("plan for rank ", r, ": ", p.status().ToString()));
      } else if (p->verdict() != verdict || (verdict == PlanResponse::LOAD && p->step() != step)) {
        Fail(absl::StrCat("plan for rank ", r, ": ", PlanResponse::Verdict_Name(p->verdict()), " step ", p->step(),
                          ", expected ", PlanResponse::Verdict_Name(verdict), " step ", step));
      }
    };
    for (uint32_t r = 0; r < world; ++r) expect(r, Plan(r, std::nullopt, true, world), PlanResponse::LOAD);
    uint64_t incarnation = 0;
    for (uint32_t r = 0; r < world; ++r) {
      absl::StatusOr<PlanResponse> p = Plan(r, step, true, world);
      expect(r, p, r + 1 == world ? PlanResponse::GO : PlanResponse::WAIT);
      if (p.ok()) incarnation = p->incarnation();
    }
    return incarnation;
  }

  // Every rank reports its shard of `step`; the last report commits it.
  void CommitStep(uint64_t step, uint64_t incarnation = 0) {
    for (uint32_t r = 0; r < 4; ++r) {
      absl::StatusOr<ckptd::v1::ReportShardResponse> resp = Shard(r < 2 ? "node-a" : "node-b", step, r, 4, incarnation);
      if (!resp.ok()) return Fail(absl::StrCat("shard of step ", step, " rank ", r, ": ", resp.status().ToString()));
      if (resp->committed() != (r == 3)) {
        Fail(absl::StrCat("step ", step, " rank ", r, ": committed is ", resp->committed()));
      }
    }
  }

  bool Exists(const std::string& path) { return fs_.Stat(path).ok(); }

  ckptd::v1::JobStatus JobState() { return JobIn(core_->ClusterStatus()); }

  std::vector<ckptd::v1::FailureKind> EventKinds() {
    ckptd::v1::ListEventsRequest req;
    absl::StatusOr<ckptd::v1::ListEventsResponse> r = core_->ListEvents(req);
    Check(r.status(), "ListEvents");
    std::vector<ckptd::v1::FailureKind> kinds;
    if (!r.ok()) return kinds;
    for (const auto& e : r->events()) kinds.push_back(e.kind());
    return kinds;
  }

  void TwoNodes() {
    Register("node-a", {0, 1});
    Register("node-b", {2, 3});
  }
};

// The fixture of the core's tests: a fresh core per test.
class CoordinatorCoreTest : public ::testing::Test, public CoreHarness {
 protected:
  CoordinatorCoreTest() { Reset(); }
  void Fail(const std::string& what) override { ADD_FAILURE() << what; }
};

}  // namespace ckptd::coordinator
