// What the CoordinatorService tests (coordinator_service_test.cc,
// agent_auth_test.cc) share: the core's requests (testing_core_harness.h)
// sent over gRPC to a service on loopback, with the agent credential the
// agent RPCs carry and the operator token the operator RPCs may carry.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ckptd/v1/coordinator.grpc.pb.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/testing_core_harness.h"
#include "grpcpp/grpcpp.h"
#include "rpc/grpc_status.h"

namespace ckptd::coordinator {

// A service over a recovered core; a 2-rank job whose rank 0 is on node-a
// and rank 1 on node-b.
class ServiceHarness : public CoreRequests {
 protected:
  using Stream = grpc::ClientReaderWriter<ckptd::v1::Heartbeat, ckptd::v1::HeartbeatAck>;
  using Stub = ckptd::v1::Coordinator::Stub;

  static constexpr char kOperatorToken[] = "0123456789abcdef-operator";
  static constexpr char kAgentToken[] = "fedcba9876543210-agent";

  // The service's options in the tests: both tokens.
  static CoordinatorServiceOptions DefaultServiceOptions() {
    CoordinatorServiceOptions so;
    so.operator_token = kOperatorToken;
    so.agent_token = kAgentToken;
    return so;
  }

  // A recovered core and its service with `so` on a free port, and a plaintext
  // channel to it; agent helpers carry "Bearer <so.agent_token>" (none when
  // it is empty).
  void Start(CoordinatorServiceOptions so) {
    Reset();
    agent_authorization_ = so.agent_token.empty() ? "" : absl::StrCat("Bearer ", so.agent_token);
    service_ = std::make_unique<CoordinatorService>(core_.get(), std::move(so));
    absl::StatusOr<CoordinatorServer> server =
        StartCoordinatorServer("127.0.0.1:0", service_.get(), grpc::InsecureServerCredentials());
    if (!server.ok()) return Fail(absl::StrCat("StartCoordinatorServer: ", server.status().ToString()));
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_.port), grpc::InsecureChannelCredentials());
    stub_ = ckptd::v1::Coordinator::NewStub(channel_);
  }

  void Stop() {
    ShutdownCoordinatorServer(server_.server.get());
    server_.server.reset();
    service_.reset();
    core_.reset();
  }

  static void Deadline(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  }

  // A heartbeat stream on `ctx`, with a deadline and `authorization` (the
  // agent credential when not given; "" for none).
  std::unique_ptr<Stream> OpenHeartbeats(grpc::ClientContext* ctx,
                                         std::optional<std::string> authorization = std::nullopt) {
    Deadline(ctx);
    const std::string auth = authorization.value_or(agent_authorization_);
    if (!auth.empty()) ctx->AddMetadata("authorization", auth);
    return stub_->Heartbeats(ctx);
  }

  // Registers `node` (at address "host-<node>") hosting `ranks` of kJob; returns the session.
  std::string Register(const std::string& node, std::vector<uint32_t> ranks, uint32_t world = 2) {
    ckptd::v1::RegisterAgentRequest req = Registration(node, std::move(ranks), world);
    req.set_address("host-" + node);
    ranks_[node] = req;
    absl::StatusOr<ckptd::v1::RegisterAgentResponse> resp = AgentCall(&Stub::RegisterAgent, req);
    if (!resp.ok()) Fail(absl::StrCat("registering ", node, ": ", resp.status().ToString()));
    sessions_[node] = resp.ok() ? resp->session() : "";
    return sessions_[node];
  }

  // The heartbeat of `node` with each of its ranks at `step`.
  ckptd::v1::Heartbeat BeatAt(const std::string& node, uint64_t step) {
    std::vector<std::pair<uint32_t, uint64_t>> progress;
    for (const auto& r : ranks_[node].ranks()) progress.emplace_back(r.rank(), step);
    return HeartbeatOf(node, progress, 0.5);
  }

  // Writes a real shard of (step, rank) into the store and reports it from `node`.
  absl::StatusOr<ckptd::v1::ReportShardResponse> Shard(const std::string& node, uint64_t step, uint32_t rank) {
    absl::StatusOr<ckptd::v1::ShardReport> r = Write(step, rank, 2);
    if (!r.ok()) return r.status();
    return AgentCall(&Stub::ReportShard, ShardRequest(node, *r));
  }

  // Rank `rank`'s plan, asked by the agent of its node (rank 0: node-a, 1: node-b).
  absl::StatusOr<ckptd::v1::RestorePlanResponse> RestorePlan(uint32_t rank,
                                                             std::optional<uint64_t> attempt = std::nullopt) {
    ckptd::v1::RestorePlanRequest req = PlanRequest(rank, attempt, true, 2);
    const std::string node = rank == 0 ? "node-a" : "node-b";
    req.set_node_id(node);
    req.set_session(sessions_[node]);
    return AgentCall(&Stub::GetRestorePlan, req);
  }

  // A unary call with a deadline and optional authorization metadata.
  template <typename Req, typename Resp>
  absl::StatusOr<Resp> Call(grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*), const Req& req,
                            const std::string& authorization = "") {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    Resp resp;
    absl::Status s = rpc::FromGrpcStatus((stub_.get()->*method)(&ctx, req, &resp));
    if (!s.ok()) return s;
    return resp;
  }

  // An agent RPC with the agent credential.
  template <typename Req, typename Resp>
  absl::StatusOr<Resp> AgentCall(grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
                                 const Req& req) {
    return Call(method, req, agent_authorization_);
  }

  ckptd::v1::GetClusterStatusResponse Status() {
    absl::StatusOr<ckptd::v1::GetClusterStatusResponse> s =
        Call(&Stub::GetClusterStatus, ckptd::v1::GetClusterStatusRequest());
    if (!s.ok()) Fail(absl::StrCat("GetClusterStatus: ", s.status().ToString()));
    return s.ok() ? *s : ckptd::v1::GetClusterStatusResponse();
  }

  ckptd::v1::JobStatus Job() { return JobIn(Status()); }

  // Commits `step` of the 2-rank job, reported by node-a (rank 0) and node-b (rank 1).
  void CommitStep(uint64_t step) {
    absl::StatusOr<ckptd::v1::ReportShardResponse> r0 = Shard("node-a", step, 0);
    if (!r0.ok() || r0->committed()) return Fail(absl::StrCat("step ", step, " rank 0: ", r0.status().ToString()));
    absl::StatusOr<ckptd::v1::ReportShardResponse> r1 = Shard("node-b", step, 1);
    if (!r1.ok() || !r1->committed()) {
      return Fail(absl::StrCat("step ", step, " rank 1 did not commit: ", r1.status().ToString()));
    }
  }

  std::unique_ptr<CoordinatorService> service_;
  CoordinatorServer server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stub> stub_;
  // What the agent helpers carry as "authorization" metadata ("": none).
  std::string agent_authorization_;
};

}  // namespace ckptd::coordinator
