#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/host_port.h"
#include "base/random.h"
#include "grpcpp/support/server_callback.h"
#include "metrics/http_server.h"
#include "rpc/grpc_status.h"
#include "rpc/server_limits.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::rpc::ToGrpcStatus;

constexpr absl::string_view kAuthorization = "authorization";
constexpr absl::string_view kBearer = "Bearer ";
// How an agent presents a node credential, for the errors of a call without one.
constexpr absl::string_view kAgentCredentialHint =
    "present the coordinator's agent token (ckptd-agent --agent-token-file) or a client certificate naming the "
    "node, or start the coordinator with --insecure-agents";
// The auth-context properties of a verified client certificate that name its node.
constexpr const char* kCertificateNames[] = {"x509_subject_alternative_name", "x509_common_name"};

// `s` quoted, C-escaped and cut to 128 bytes: names from a certificate or a
// request may hold anything.
std::string Quoted(absl::string_view s) {
  constexpr size_t kMax = 128;
  const bool cut = s.size() > kMax;
  return absl::StrCat("\"", absl::CHexEscape(s.substr(0, kMax)), cut ? "...\"" : "\"");
}

// Finishes a unary call with `result`'s value (moved into `resp`) or error.
template <typename T>
grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* ctx, absl::StatusOr<T> result, T* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (result.ok()) *resp = *std::move(result);
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// One agent's heartbeat stream: read, decide, answer, read the next. Reads
// and writes never overlap, so Finish is never called with one outstanding.
// Each heartbeat must pass `check` (the caller's credential for its node);
// one that does not ends the stream with the check's error.
class HeartbeatReactor final : public grpc::ServerBidiReactor<ckptd::v1::Heartbeat, ckptd::v1::HeartbeatAck> {
 public:
  using Check = std::function<absl::Status(absl::string_view node_id)>;
  HeartbeatReactor(CoordinatorCore* core, Check check) : core_(core), check_(std::move(check)) {
    StartRead(&heartbeat_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client half-closed, cancelled, or the connection broke: the
      // stream is over either way (a cancelled call ignores the status).
      Finish(grpc::Status::OK);
      return;
    }
    if (absl::Status auth = check_(heartbeat_.node_id()); !auth.ok()) {
      Finish(ToGrpcStatus(auth));
      return;
    }
    absl::StatusOr<ckptd::v1::HeartbeatAck> ack = core_->OnHeartbeat(heartbeat_);
    if (!ack.ok()) {
      Finish(ToGrpcStatus(ack.status()));
      return;
    }
    ack_ = *std::move(ack);
    StartWrite(&ack_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      // The client is gone; nobody reads this status.
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "heartbeat stream closed while answering"));
      return;
    }
    heartbeat_.Clear();
    StartRead(&heartbeat_);
  }

  void OnDone() override { delete this; }

 private:
  CoordinatorCore* const core_;
  const Check check_;
  ckptd::v1::Heartbeat heartbeat_;
  ckptd::v1::HeartbeatAck ack_;
};

}  // namespace

CoordinatorService::CoordinatorService(CoordinatorCore* core, CoordinatorServiceOptions options)
    : core_(core), options_(std::move(options)) {
  absl::Duration every = options_.tick_interval;
  if (every <= absl::ZeroDuration()) every = core_->options().heartbeat_interval / 4;
  every = std::max(every, absl::Milliseconds(1));
  ticker_ = std::thread([this, every] { Every(every, [this] { core_->Tick(); }); });
  if (!core_->options().retention_in_tick) {
    retention_ = std::thread([this, every] {
      Every(every, [this] {
        core_->RunRetention([this] {
          absl::MutexLock l(&mu_);
          return stopping_;
        });
      });
    });
  }
}

CoordinatorService::~CoordinatorService() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  ticker_.join();
  if (retention_.joinable()) retention_.join();
  absl::MutexLock l(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return verifying_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

void CoordinatorService::Every(absl::Duration every, const std::function<void()>& work) {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      const absl::Time next = absl::Now() + every;
      while (!stopping_ && absl::Now() < next) mu_.AwaitWithDeadline(absl::Condition(&stopping_), next);
      if (stopping_) return;
    }
    work();
  }
}

absl::Status CoordinatorService::CheckOperator(const grpc::CallbackServerContext& ctx, absl::string_view rpc) const {
  const auto& md = ctx.client_metadata();
  auto it = md.find(grpc::string_ref(kAuthorization.data(), kAuthorization.size()));
  if (it == md.end()) {
    return absl::UnauthenticatedError(
        absl::StrCat(rpc, " needs the operator token as metadata \"authorization: Bearer <token>\""));
  }
  const absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, kBearer)) {
    return absl::UnauthenticatedError(
        absl::StrCat(rpc, ": the authorization metadata must be \"Bearer <operator token>\""));
  }
  if (options_.operator_token.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(rpc, ": this coordinator has no operator token configured"));
  }
  if (!base::ConstantTimeEquals(value.substr(kBearer.size()), options_.operator_token)) {
    return absl::PermissionDeniedError(absl::StrCat(rpc, ": the operator token is wrong"));
  }
  return absl::OkStatus();
}

absl::Status CoordinatorService::CheckAgent(const grpc::CallbackServerContext& ctx, absl::string_view rpc,
                                            absl::string_view node_id) const {
  if (options_.insecure_agents) return absl::OkStatus();
  const auto& md = ctx.client_metadata();
  if (auto it = md.find(grpc::string_ref(kAuthorization.data(), kAuthorization.size())); it != md.end()) {
    // A token was presented: it alone decides, whatever certificate came with it.
    const absl::string_view value(it->second.data(), it->second.size());
    if (!absl::StartsWith(value, kBearer)) {
      return absl::UnauthenticatedError(
          absl::StrCat(rpc, ": the authorization metadata must be \"Bearer <agent token>\"; ", kAgentCredentialHint));
    }
    if (options_.agent_token.empty()) {
      return absl::PermissionDeniedError(
          absl::StrCat(rpc, ": this coordinator takes no agent token; present a client certificate naming the node"));
    }
    if (!base::ConstantTimeEquals(value.substr(kBearer.size()), options_.agent_token)) {
      return absl::PermissionDeniedError(absl::StrCat(
          rpc, ": the agent token is wrong: give ckptd-agent --agent-token-file the coordinator's agent token (the "
               "file of its --agent-token-file, or the <state-dir>/agent-token it generated)"));
    }
    return absl::OkStatus();
  }
  std::vector<std::string> names;
  if (std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
      auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const char* property : kCertificateNames) {
      for (const grpc::string_ref& name : auth->FindPropertyValues(property)) {
        const absl::string_view n(name.data(), name.size());
        if (!node_id.empty() && n == node_id) return absl::OkStatus();
        names.push_back(Quoted(n));
      }
    }
  }
  if (!names.empty()) {
    if (names.size() > 8) names.resize(8);  // enough to say whose it is
    return absl::PermissionDeniedError(absl::StrCat(
        rpc, ": the client certificate names ", absl::StrJoin(names, ", "), ", not node ", Quoted(node_id),
        "; a certificate speaks only for its own node (present the agent token to speak for any)"));
  }
  return absl::UnauthenticatedError(absl::StrCat(rpc, " needs a node credential: ", kAgentCredentialHint));
}

grpc::ServerUnaryReactor* CoordinatorService::RegisterAgent(grpc::CallbackServerContext* ctx,
                                                            const ckptd::v1::RegisterAgentRequest* req,
                                                            ckptd::v1::RegisterAgentResponse* resp) {
  if (absl::Status auth = CheckAgent(*ctx, "RegisterAgent", req->node_id()); !auth.ok()) return FinishWith(ctx, auth);
  return FinishWith(ctx, core_->RegisterAgent(*req), resp);
}

grpc::ServerBidiReactor<ckptd::v1::Heartbeat, ckptd::v1::HeartbeatAck>* CoordinatorService::Heartbeats(
    grpc::CallbackServerContext* ctx) {
  // `ctx` outlives the reactor (it is the call's, until OnDone).
  return new HeartbeatReactor(core_,
                              [this, ctx](absl::string_view node_id) { return CheckAgent(*ctx, "Heartbeats", node_id); });
}

grpc::ServerUnaryReactor* CoordinatorService::ReportShard(grpc::CallbackServerContext* ctx,
                                                          const ckptd::v1::ReportShardRequest* req,
                                                          ckptd::v1::ReportShardResponse* resp) {
  if (absl::Status auth = CheckAgent(*ctx, "ReportShard", req->node_id()); !auth.ok()) return FinishWith(ctx, auth);
  return FinishWith(ctx, core_->ReportShard(*req), resp);
}

grpc::ServerUnaryReactor* CoordinatorService::ReportFailure(grpc::CallbackServerContext* ctx,
                                                            const ckptd::v1::ReportFailureRequest* req,
                                                            ckptd::v1::ReportFailureResponse*) {
  if (absl::Status auth = CheckAgent(*ctx, "ReportFailure", req->node_id()); !auth.ok()) return FinishWith(ctx, auth);
  return FinishWith(ctx, core_->ReportFailure(*req));
}

grpc::ServerUnaryReactor* CoordinatorService::GetRestorePlan(grpc::CallbackServerContext* ctx,
                                                             const ckptd::v1::RestorePlanRequest* req,
                                                             ckptd::v1::RestorePlanResponse* resp) {
  if (absl::Status auth = CheckAgent(*ctx, "GetRestorePlan", req->node_id()); !auth.ok()) return FinishWith(ctx, auth);
  return FinishWith(ctx, core_->GetRestorePlan(*req), resp);
}

grpc::ServerUnaryReactor* CoordinatorService::GetReshardPlan(grpc::CallbackServerContext* ctx,
                                                             const ckptd::v1::ReshardPlanRequest* req,
                                                             ckptd::v1::ReshardPlanResponse* resp) {
  if (absl::Status auth = CheckAgent(*ctx, "GetReshardPlan", req->node_id()); !auth.ok()) return FinishWith(ctx, auth);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  // The request and response live until Finish.
  planners_.Schedule([this, reactor, req, resp] {
    absl::StatusOr<ckptd::v1::ReshardPlanResponse> plan = core_->GetReshardPlan(*req);
    if (plan.ok()) *resp = *std::move(plan);
    reactor->Finish(ToGrpcStatus(plan.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetClusterStatus(grpc::CallbackServerContext* ctx,
                                                               const ckptd::v1::GetClusterStatusRequest* req,
                                                               ckptd::v1::GetClusterStatusResponse* resp) {
  // A page: the whole status of a large cluster would outgrow the message.
  ckptd::v1::GetClusterStatusResponse status = core_->ClusterStatusPage(*req);
  if (options_.replication) options_.replication(status.mutable_replication());
  return FinishWith(ctx, absl::StatusOr<ckptd::v1::GetClusterStatusResponse>(std::move(status)), resp);
}

grpc::ServerUnaryReactor* CoordinatorService::ListEvents(grpc::CallbackServerContext* ctx,
                                                         const ckptd::v1::ListEventsRequest* req,
                                                         ckptd::v1::ListEventsResponse* resp) {
  return FinishWith(ctx, core_->ListEvents(*req), resp);
}

grpc::ServerUnaryReactor* CoordinatorService::GetInterval(grpc::CallbackServerContext* ctx,
                                                          const ckptd::v1::GetIntervalRequest* req,
                                                          ckptd::v1::IntervalStatus* resp) {
  return FinishWith(ctx, core_->GetInterval(*req), resp);
}

grpc::ServerUnaryReactor* CoordinatorService::ListSteps(grpc::CallbackServerContext* ctx,
                                                        const ckptd::v1::ListStepsRequest* req,
                                                        ckptd::v1::ListStepsResponse* resp) {
  return FinishWith(ctx, core_->ListSteps(*req), resp);
}

grpc::ServerUnaryReactor* CoordinatorService::GetRestorePreview(grpc::CallbackServerContext* ctx,
                                                                const ckptd::v1::RestorePreviewRequest* req,
                                                                ckptd::v1::RestorePreview* resp) {
  return FinishWith(ctx, core_->GetRestorePreview(*req), resp);
}

namespace {

// One VerifyStep stream. The verification thread and the reactions share
// `Shared`; every StartWrite and Finish happens under its lock, and nothing
// touches the reactor once it has finished (it deletes itself in OnDone).
class VerifyReactor final : public grpc::ServerWriteReactor<ckptd::v1::VerifyProgress> {
 public:
  struct Shared {
    absl::Mutex mu;
    VerifyReactor* reactor ABSL_GUARDED_BY(mu);
    std::optional<ckptd::v1::VerifyProgress> next ABSL_GUARDED_BY(mu);  // newest not yet written
    std::optional<absl::Status> end ABSL_GUARDED_BY(mu);                 // the verification is over
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool broken ABSL_GUARDED_BY(mu) = false;    // cancelled, or a write failed
    bool finished ABSL_GUARDED_BY(mu) = false;  // Finish called: the reactor may be gone

    // Writes what is due, or finishes.
    void Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (finished || writing) return;
      if (broken) {
        finished = true;
        reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
        return;
      }
      if (next) {
        reactor->current_ = *std::move(next);
        next.reset();
        writing = true;
        reactor->StartWrite(&reactor->current_);
        return;
      }
      if (end) {
        finished = true;
        reactor->Finish(rpc::ToGrpcStatus(*end));
      }
    }
  };

  explicit VerifyReactor(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

  void OnWriteDone(bool ok) override {
    absl::MutexLock l(&shared_->mu);
    shared_->writing = false;
    if (!ok) shared_->broken = true;
    shared_->Pump();
  }
  void OnCancel() override {
    absl::MutexLock l(&shared_->mu);
    shared_->broken = true;
    shared_->Pump();
  }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<Shared> shared_;
  ckptd::v1::VerifyProgress current_;
};

}  // namespace

grpc::ServerWriteReactor<ckptd::v1::VerifyProgress>* CoordinatorService::VerifyStep(
    grpc::CallbackServerContext* ctx, const ckptd::v1::VerifyStepRequest* req) {
  auto shared = std::make_shared<VerifyReactor::Shared>();
  auto* reactor = new VerifyReactor(shared);
  absl::MutexLock hold(&shared->mu);  // no write starts before the reactor is set up
  shared->reactor = reactor;
  if (absl::Status auth = CheckOperator(*ctx, "VerifyStep"); !auth.ok()) {
    shared->end = auth;
    shared->Pump();
    return reactor;
  }
  {
    absl::MutexLock sl(&mu_);
    ++verifying_;
  }
  std::thread([this, shared, request = *req] {
    absl::StatusOr<ckptd::v1::VerifyProgress> done =
        core_->VerifyStep(request, [&shared](const ckptd::v1::VerifyProgress& p) {
          absl::MutexLock l(&shared->mu);
          shared->next = p;
          shared->Pump();
        });
    {
      absl::MutexLock l(&shared->mu);
      if (done.ok()) shared->next = *done;
      shared->end = done.status();
      shared->Pump();
    }
    absl::MutexLock count(&mu_);
    --verifying_;
  }).detach();
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::RunDrill(grpc::CallbackServerContext* ctx,
                                                       const ckptd::v1::RunDrillRequest* req,
                                                       ckptd::v1::RunDrillResponse* resp) {
  if (absl::Status auth = CheckOperator(*ctx, "RunDrill"); !auth.ok()) return FinishWith(ctx, auth);
  return FinishWith(ctx, core_->RunDrill(*req), resp);
}

grpc::ServerUnaryReactor* CoordinatorService::GetDrill(grpc::CallbackServerContext* ctx,
                                                       const ckptd::v1::GetDrillRequest* req,
                                                       ckptd::v1::DrillStatus* resp) {
  return FinishWith(ctx, core_->GetDrill(*req), resp);
}

grpc::ServerUnaryReactor* CoordinatorService::RequestCheckpoint(grpc::CallbackServerContext* ctx,
                                                                const ckptd::v1::RequestCheckpointRequest* req,
                                                                ckptd::v1::RequestCheckpointResponse* resp) {
  if (absl::Status auth = CheckOperator(*ctx, "RequestCheckpoint"); !auth.ok()) return FinishWith(ctx, auth);
  return FinishWith(ctx, core_->RequestCheckpoint(*req), resp);
}

absl::StatusOr<CoordinatorServer> StartCoordinatorServer(const std::string& listen, CoordinatorService* service,
                                                         std::shared_ptr<grpc::ServerCredentials> credentials,
                                                         absl::Duration handshake_timeout) {
  return internal::StartServer(
      listen, [service](grpc::ServerBuilder& b) { b.RegisterService(service); }, std::move(credentials),
      handshake_timeout);
}

absl::StatusOr<CoordinatorServer> internal::StartServer(const std::string& listen,
                                                        const std::function<void(grpc::ServerBuilder&)>& add_service,
                                                        std::shared_ptr<grpc::ServerCredentials> credentials,
                                                        absl::Duration handshake_timeout) {
  absl::StatusOr<std::pair<std::string, uint16_t>> parsed = base::ParseHostPort(listen);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("listen address \"", listen, "\": ", parsed.status().message()));
  }
  const std::string& host = parsed->first;
  std::string address;
  if (host.empty()) {
    address = absl::StrCat("[::]:", parsed->second);
  } else if (absl::StrContains(host, ':')) {
    address = absl::StrCat("[", host, "]:", parsed->second);
  } else {
    address = absl::StrCat(host, ":", parsed->second);
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, std::move(credentials), &port);
  add_service(builder);
  // A second coordinator on the same port must fail, not share the traffic.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Agents keep their heartbeat stream open with keepalive pings; a peer
  // that vanished without closing is closed within a minute, a connection
  // that never finishes its handshake at the handshake timeout, one without
  // calls after 5 minutes.
  rpc::LimitIdleConnections(&builder, handshake_timeout);
  CoordinatorServer out;
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || port == 0) {
    if (out.server != nullptr) out.server->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address,
                     " (port in use, not an address of this host, or TLS files gRPC could not use)"));
  }
  out.port = port;
  return out;
}

void ShutdownCoordinatorServer(grpc::Server* server, absl::Duration grace) {
  if (server == nullptr) return;
  server->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server->Wait();
}

}  // namespace ckptd::coordinator
