// The coordinator's gRPC service: translates requests to CoordinatorCore
// (which validates and decides), keeps each agent's heartbeat stream, checks
// the node credential on agent RPCs and the operator token on operator RPCs
// that change anything, records who made each security-relevant call in the
// audit trail (audit_log.h), and runs the core's periodic work on a ticker
// thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ckptd/v1/coordinator.grpc.pb.h"
#include "base/thread_pool.h"
#include "coordinator/audit_log.h"
#include "coordinator/coordinator_core.h"
#include "rpc/tls.h"
#include "grpcpp/grpcpp.h"
#include "rpc/server_limits.h"

namespace ckptd::coordinator {

struct CoordinatorServiceOptions {
  // What operator RPCs that change anything or read a whole step
  // (RequestCheckpoint, VerifyStep) must carry as
  // metadata "authorization: Bearer <token>". Empty: they are all refused.
  std::string operator_token;
  // What agent RPCs (RegisterAgent, Heartbeats, ReportShard, ReportFailure,
  // GetRestorePlan, GetReshardPlan) must carry as "authorization: Bearer <token>" unless the
  // caller's verified TLS client certificate names the request's node (its
  // common name or a subject alternative name equals node_id). The token
  // speaks for any node; a certificate only for its own. Empty: only such
  // certificates are accepted.
  std::string agent_token;
  // Accept agent RPCs without any credential (anyone who can reach the port
  // may then act as any node).
  bool insecure_agents = false;
  // A client certificate speaks for the node it names only when its subject
  // names this organizational unit (rpc::kNodeCertificateUnit): an
  // operator's certificate of the same CA is no node's. Empty: any.
  std::string tls_node_unit = rpc::kNodeCertificateUnit;
  // How often the ticker calls CoordinatorCore::Tick(); zero: a quarter of
  // the core's heartbeat interval.
  absl::Duration tick_interval = absl::ZeroDuration();
  // Replicated coordinators: fills GetClusterStatus's `replication` (the
  // leader, the standbys, etcd's members). Null for a single coordinator.
  std::function<void(ckptd::v1::CoordinatorReplication*)> replication = nullptr;
  // Where the audit records go (registrations, failure reports, operator
  // actions, calls refused at authentication); must outlive the service.
  // Null: a log-only audit trail of the service's own (lines "audit: {...}"
  // through base::DefaultLogger()).
  AuditLog* audit_log = nullptr;
};

class CoordinatorService final : public ckptd::v1::Coordinator::CallbackService {
 public:
  // `core` must outlive the service. Starts the ticker thread.
  CoordinatorService(CoordinatorCore* core, CoordinatorServiceOptions options);
  // Stops the ticker. Shut the server down first.
  ~CoordinatorService() override;
  CoordinatorService(const CoordinatorService&) = delete;
  CoordinatorService& operator=(const CoordinatorService&) = delete;

  grpc::ServerUnaryReactor* RegisterAgent(grpc::CallbackServerContext* ctx,
                                          const ckptd::v1::RegisterAgentRequest* req,
                                          ckptd::v1::RegisterAgentResponse* resp) override;
  // Each Heartbeat read is answered with one HeartbeatAck before the next is
  // read. The stream ends OK when the client half-closes (or cancels), and
  // with the core's error for an invalid heartbeat.
  grpc::ServerBidiReactor<ckptd::v1::Heartbeat, ckptd::v1::HeartbeatAck>* Heartbeats(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* ReportShard(grpc::CallbackServerContext* ctx, const ckptd::v1::ReportShardRequest* req,
                                        ckptd::v1::ReportShardResponse* resp) override;
  grpc::ServerUnaryReactor* ReportFailure(grpc::CallbackServerContext* ctx,
                                          const ckptd::v1::ReportFailureRequest* req,
                                          ckptd::v1::ReportFailureResponse* resp) override;
  grpc::ServerUnaryReactor* GetRestorePlan(grpc::CallbackServerContext* ctx,
                                           const ckptd::v1::RestorePlanRequest* req,
                                           ckptd::v1::RestorePlanResponse* resp) override;
  // Answered on the service's planner threads: the first plan of a step
  // reads its N shard indexes, which must not hold up gRPC's own threads.
  grpc::ServerUnaryReactor* GetReshardPlan(grpc::CallbackServerContext* ctx, const ckptd::v1::ReshardPlanRequest* req,
                                           ckptd::v1::ReshardPlanResponse* resp) override;
  grpc::ServerUnaryReactor* GetClusterStatus(grpc::CallbackServerContext* ctx,
                                             const ckptd::v1::GetClusterStatusRequest* req,
                                             ckptd::v1::GetClusterStatusResponse* resp) override;
  grpc::ServerUnaryReactor* ListEvents(grpc::CallbackServerContext* ctx, const ckptd::v1::ListEventsRequest* req,
                                       ckptd::v1::ListEventsResponse* resp) override;
  grpc::ServerUnaryReactor* GetInterval(grpc::CallbackServerContext* ctx, const ckptd::v1::GetIntervalRequest* req,
                                        ckptd::v1::IntervalStatus* resp) override;
  grpc::ServerUnaryReactor* ListSteps(grpc::CallbackServerContext* ctx, const ckptd::v1::ListStepsRequest* req,
                                      ckptd::v1::ListStepsResponse* resp) override;
  grpc::ServerUnaryReactor* GetRestorePreview(grpc::CallbackServerContext* ctx,
                                              const ckptd::v1::RestorePreviewRequest* req,
                                              ckptd::v1::RestorePreview* resp) override;
  // Needs the operator token. The step is read on a thread of the service's
  // own; progress goes out after each shard (the newest only, when the
  // client reads slower than shards verify).
  grpc::ServerWriteReactor<ckptd::v1::VerifyProgress>* VerifyStep(grpc::CallbackServerContext* ctx,
                                                                  const ckptd::v1::VerifyStepRequest* req) override;
  // Needs the operator token.
  grpc::ServerUnaryReactor* RunDrill(grpc::CallbackServerContext* ctx, const ckptd::v1::RunDrillRequest* req,
                                     ckptd::v1::RunDrillResponse* resp) override;
  grpc::ServerUnaryReactor* GetDrill(grpc::CallbackServerContext* ctx, const ckptd::v1::GetDrillRequest* req,
                                     ckptd::v1::DrillStatus* resp) override;
  // Needs the operator token.
  grpc::ServerUnaryReactor* RequestCheckpoint(grpc::CallbackServerContext* ctx,
                                              const ckptd::v1::RequestCheckpointRequest* req,
                                              ckptd::v1::RequestCheckpointResponse* resp) override;

 private:
  // OK when `ctx` carries the operator token; kUnauthenticated when it carries
  // none (or not as "Bearer <token>"), kPermissionDenied when it is wrong.
  // `who->credential` says what the call presented (whatever the answer).
  absl::Status CheckOperator(const grpc::CallbackServerContext& ctx, absl::string_view rpc, AuditIdentity* who) const;
  // OK when `ctx` may act as node `node_id` in agent RPC `rpc`: with
  // insecure_agents, with the agent token, or, without authorization
  // metadata, with a verified client certificate naming `node_id`.
  // kUnauthenticated when it presents no credential (or malformed metadata),
  // kPermissionDenied for a wrong token or a certificate naming other nodes;
  // each message says how to present the right one. `who->credential` says
  // what the call presented (whatever the answer).
  absl::Status CheckAgent(const grpc::CallbackServerContext& ctx, absl::string_view rpc, absl::string_view node_id,
                          AuditIdentity* who) const;
  // CheckAgent, with a refusal recorded in the audit trail (a call refused
  // at authentication: rate-limited) and `*who` then complete (the peer and
  // TLS names added).
  absl::Status AuthorizeAgent(const grpc::CallbackServerContext& ctx, absl::string_view rpc, absl::string_view node_id,
                              AuditIdentity* who);
  // CheckOperator, likewise, `*who` complete either way; `refused` carries
  // what the request names.
  absl::Status AuthorizeOperator(const grpc::CallbackServerContext& ctx, AuditRecord refused, AuditIdentity* who);
  // Records `record` with `outcome` in the audit trail.
  void Audit(AuditRecord record, const absl::Status& outcome);
  // Calls `work` every `every` until the service stops.
  void Every(absl::Duration every, const std::function<void()>& work) ABSL_LOCKS_EXCLUDED(mu_);

  CoordinatorCore* const core_;
  const CoordinatorServiceOptions options_;
  std::unique_ptr<AuditLog> own_audit_log_;  // without options_.audit_log
  AuditLog* const audit_log_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread ticker_;
  std::thread retention_;  // when the core leaves retention to its caller
  // Verifications under way (each on a detached thread); the destructor
  // waits for them.
  int verifying_ ABSL_GUARDED_BY(mu_) = 0;
  // GetReshardPlan's threads (their queue holds the calls beyond them).
  base::ThreadPool planners_{4};
};

struct CoordinatorServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port (the chosen one for port 0)
};

// Serves `service` on TCP `listen` ("host:port", "[v6]:port", ":port" for
// every interface; port 0 picks a free one) with `credentials`. Errors:
// kInvalidArgument for a malformed address, kUnavailable when it cannot be
// bound. Stop with ShutdownCoordinatorServer (heartbeat streams never end by
// themselves). Idle connections are limited as rpc::LimitIdleConnections
// says, with `handshake_timeout`.
absl::StatusOr<CoordinatorServer> StartCoordinatorServer(
    const std::string& listen, CoordinatorService* service, std::shared_ptr<grpc::ServerCredentials> credentials,
    absl::Duration handshake_timeout = rpc::kHandshakeTimeout);

namespace internal {
// StartCoordinatorServer with the service(s) `add_service` registers.
absl::StatusOr<CoordinatorServer> StartServer(const std::string& listen,
                                              const std::function<void(grpc::ServerBuilder&)>& add_service,
                                              std::shared_ptr<grpc::ServerCredentials> credentials,
                                              absl::Duration handshake_timeout);
}  // namespace internal

// Shuts `server` down, cancelling calls still open after `grace`, and waits
// for them to end.
void ShutdownCoordinatorServer(grpc::Server* server, absl::Duration grace = absl::Seconds(1));

}  // namespace ckptd::coordinator
