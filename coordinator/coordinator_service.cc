#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
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
#include "rpc/tls.h"
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

// Adds to `who` what the connection of `ctx` tells of the caller: its peer
// address and the names of its verified TLS client certificate (the
// credential is the check of the call's metadata). Only for calls audited:
// not on every heartbeat.
void AddCaller(const grpc::CallbackServerContext& ctx, AuditIdentity* who) {
  who->peer = ctx.peer();
  who->tls_names.clear();
  if (std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
      auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const char* property : {"x509_common_name", "x509_subject_alternative_name"}) {
      for (const grpc::string_ref& name : auth->FindPropertyValues(property)) {
        std::string n(name.data(), name.size());
        if (who->tls_names.size() >= 8) return;  // enough to say whose it is
        if (std::find(who->tls_names.begin(), who->tls_names.end(), n) == who->tls_names.end()) {
          who->tls_names.push_back(std::move(n));
        }
      }
    }
  }
}

// The audit record of `action` by `who` about `node`.
AuditRecord RecordOf(absl::string_view action, const AuditIdentity& who, absl::string_view node = {}) {
  AuditRecord r;
  r.action = std::string(action);
  r.identity = who;
  r.node = std::string(node);
  return r;
}

// The audit trail of a service given none: log lines only.
std::unique_ptr<AuditLog> LogOnlyAuditLog() {
  absl::StatusOr<std::unique_ptr<AuditLog>> log = AuditLog::Open(AuditLogOptions());
  return log.ok() ? *std::move(log) : nullptr;  // without a path it cannot fail
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
    : core_(core),
      options_(std::move(options)),
      own_audit_log_(options_.audit_log == nullptr ? LogOnlyAuditLog() : nullptr),
      audit_log_(options_.audit_log != nullptr ? options_.audit_log : own_audit_log_.get()) {
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

absl::Status CoordinatorService::CheckOperator(const grpc::CallbackServerContext& ctx, absl::string_view rpc,
                                               AuditIdentity* who) const {
  who->credential = kCredentialNone;
  const auto& md = ctx.client_metadata();
  auto it = md.find(grpc::string_ref(kAuthorization.data(), kAuthorization.size()));
  if (it == md.end()) {
    return absl::UnauthenticatedError(
        absl::StrCat(rpc, " needs the operator token as metadata \"authorization: Bearer <token>\""));
  }
  const absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, kBearer)) {
    who->credential = kCredentialMalformed;
    return absl::UnauthenticatedError(
        absl::StrCat(rpc, ": the authorization metadata must be \"Bearer <operator token>\""));
  }
  const absl::string_view token = value.substr(kBearer.size());
  // Which token it was, for the audit trail: an agent's token used on an
  // operator call is worth knowing.
  const bool agent = !options_.agent_token.empty() && base::ConstantTimeEquals(token, options_.agent_token);
  who->credential = agent ? kCredentialAgentToken : kCredentialWrongToken;
  if (options_.operator_token.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(rpc, ": this coordinator has no operator token configured"));
  }
  if (!base::ConstantTimeEquals(token, options_.operator_token)) {
    return absl::PermissionDeniedError(absl::StrCat(rpc, ": the operator token is wrong"));
  }
  who->credential = kCredentialOperatorToken;
  return absl::OkStatus();
}

absl::Status CoordinatorService::CheckAgent(const grpc::CallbackServerContext& ctx, absl::string_view rpc,
                                            absl::string_view node_id, AuditIdentity* who) const {
  who->credential = kCredentialNone;
  if (options_.insecure_agents) {
    who->credential = kCredentialInsecure;
    return absl::OkStatus();
  }
  const auto& md = ctx.client_metadata();
  if (auto it = md.find(grpc::string_ref(kAuthorization.data(), kAuthorization.size())); it != md.end()) {
    // A token was presented: it alone decides, whatever certificate came with it.
    const absl::string_view value(it->second.data(), it->second.size());
    if (!absl::StartsWith(value, kBearer)) {
      who->credential = kCredentialMalformed;
      return absl::UnauthenticatedError(
          absl::StrCat(rpc, ": the authorization metadata must be \"Bearer <agent token>\"; ", kAgentCredentialHint));
    }
    const absl::string_view token = value.substr(kBearer.size());
    // Which token it was, for the audit trail: the operator's used on an
    // agent call is worth knowing.
    const bool operator_token =
        !options_.operator_token.empty() && base::ConstantTimeEquals(token, options_.operator_token);
    who->credential = operator_token ? kCredentialOperatorToken : kCredentialWrongToken;
    if (options_.agent_token.empty()) {
      return absl::PermissionDeniedError(
          absl::StrCat(rpc, ": this coordinator takes no agent token; present a client certificate naming the node"));
    }
    if (!base::ConstantTimeEquals(token, options_.agent_token)) {
      return absl::PermissionDeniedError(absl::StrCat(
          rpc, ": the agent token is wrong: give ckptd-agent --agent-token-file the coordinator's agent token (the "
               "file of its --agent-token-file, or the <state-dir>/agent-token it generated)"));
    }
    who->credential = kCredentialAgentToken;
    return absl::OkStatus();
  }
  std::vector<std::string> names;
  if (std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
      auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const char* property : kCertificateNames) {
      for (const grpc::string_ref& name : auth->FindPropertyValues(property)) {
        const absl::string_view n(name.data(), name.size());
        if (!node_id.empty() && n == node_id) {
          who->credential = kCredentialCertificate;
          // A node's certificate, not an operator's of the same CA that
          // happens to carry the name.
          const std::string subject = rpc::CertificateSubject(auth.get());
          if (!options_.tls_node_unit.empty() && !rpc::SubjectNamesUnit(subject, options_.tls_node_unit)) {
            return absl::PermissionDeniedError(absl::StrCat(
                rpc, ": the client certificate names node ", Quoted(node_id), " but is no node's: its subject ",
                Quoted(subject), " has no OU=", options_.tls_node_unit,
                " (an operator's certificate cannot act as a node; issue node certificates with OU=",
                options_.tls_node_unit, ", docs/operations.md, TLS)"));
          }
          return absl::OkStatus();
        }
        names.push_back(Quoted(n));
      }
    }
  }
  if (!names.empty()) {
    who->credential = kCredentialCertificate;
    if (names.size() > 8) names.resize(8);  // enough to say whose it is
    return absl::PermissionDeniedError(absl::StrCat(
        rpc, ": the client certificate names ", absl::StrJoin(names, ", "), ", not node ", Quoted(node_id),
        "; a certificate speaks only for its own node (present the agent token to speak for any)"));
  }
  return absl::UnauthenticatedError(absl::StrCat(rpc, " needs a node credential: ", kAgentCredentialHint));
}

absl::Status CoordinatorService::AuthorizeAgent(const grpc::CallbackServerContext& ctx, absl::string_view rpc,
                                                absl::string_view node_id, AuditIdentity* who) {
  absl::Status auth = CheckAgent(ctx, rpc, node_id, who);
  if (!auth.ok()) {
    AddCaller(ctx, who);
    AuditRecord refused = RecordOf(rpc, *who, node_id);
    refused.authenticated = false;
    Audit(std::move(refused), auth);
  }
  return auth;
}

absl::Status CoordinatorService::AuthorizeOperator(const grpc::CallbackServerContext& ctx, AuditRecord refused,
                                                   AuditIdentity* who) {
  absl::Status auth = CheckOperator(ctx, refused.action, who);
  AddCaller(ctx, who);
  if (!auth.ok()) {
    refused.identity = *who;
    refused.authenticated = false;
    Audit(std::move(refused), auth);
  }
  return auth;
}

void CoordinatorService::Audit(AuditRecord record, const absl::Status& outcome) {
  record.outcome = outcome;
  if (audit_log_ != nullptr) audit_log_->Record(record);
}

grpc::ServerUnaryReactor* CoordinatorService::RegisterAgent(grpc::CallbackServerContext* ctx,
                                                            const ckptd::v1::RegisterAgentRequest* req,
                                                            ckptd::v1::RegisterAgentResponse* resp) {
  AuditIdentity who;
  if (absl::Status auth = AuthorizeAgent(*ctx, "RegisterAgent", req->node_id(), &who); !auth.ok()) {
    return FinishWith(ctx, auth);
  }
  AddCaller(*ctx, &who);
  PreviousRegistration previous;
  absl::StatusOr<ckptd::v1::RegisterAgentResponse> registered = core_->RegisterAgent(*req, who.peer, &previous);
  AuditRecord record = RecordOf("RegisterAgent", who, req->node_id());
  record.details.emplace_back("address", req->address());
  record.details.emplace_back("instance", req->instance());
  record.details.emplace_back("ranks", static_cast<uint64_t>(req->ranks_size()));
  // A registration of a node that is live replaces the agent there: the
  // attack this record is for, when it is not the agent itself.
  const bool live = registered.ok() && previous.known && previous.alive;
  record.details.emplace_back("reregistration", live);
  if (live) {
    record.notable = true;
    record.details.emplace_back("previous_peer", previous.from);
    record.details.emplace_back("previous_registered",
                                absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", previous.at, absl::UTCTimeZone()));
    record.details.emplace_back("agent_restarted", previous.agent_restarted);
  }
  Audit(std::move(record), registered.status());
  return FinishWith(ctx, std::move(registered), resp);
}

grpc::ServerBidiReactor<ckptd::v1::Heartbeat, ckptd::v1::HeartbeatAck>* CoordinatorService::Heartbeats(
    grpc::CallbackServerContext* ctx) {
  // `ctx` outlives the reactor (it is the call's, until OnDone).
  return new HeartbeatReactor(core_, [this, ctx](absl::string_view node_id) {
    AuditIdentity who;
    return AuthorizeAgent(*ctx, "Heartbeats", node_id, &who);
  });
}

grpc::ServerUnaryReactor* CoordinatorService::ReportShard(grpc::CallbackServerContext* ctx,
                                                          const ckptd::v1::ReportShardRequest* req,
                                                          ckptd::v1::ReportShardResponse* resp) {
  AuditIdentity who;
  if (absl::Status auth = AuthorizeAgent(*ctx, "ReportShard", req->node_id(), &who); !auth.ok()) {
    return FinishWith(ctx, auth);
  }
  return FinishWith(ctx, core_->ReportShard(*req), resp);
}

grpc::ServerUnaryReactor* CoordinatorService::ReportFailure(grpc::CallbackServerContext* ctx,
                                                            const ckptd::v1::ReportFailureRequest* req,
                                                            ckptd::v1::ReportFailureResponse*) {
  AuditIdentity who;
  if (absl::Status auth = AuthorizeAgent(*ctx, "ReportFailure", req->node_id(), &who); !auth.ok()) {
    return FinishWith(ctx, auth);
  }
  AddCaller(*ctx, &who);
  const absl::Status reported = core_->ReportFailure(*req);
  AuditRecord record = RecordOf("ReportFailure", who, req->node_id());
  record.job = req->job();
  record.rank = req->rank();
  record.step = req->step();
  record.details.emplace_back("kind", ckptd::v1::FailureKind_IsValid(req->kind())
                                          ? absl::AsciiStrToLower(ckptd::v1::FailureKind_Name(req->kind()))
                                          : absl::StrCat(static_cast<int>(req->kind())));
  record.details.emplace_back("detail", req->detail());
  Audit(std::move(record), reported);
  return FinishWith(ctx, reported);
}

grpc::ServerUnaryReactor* CoordinatorService::GetRestorePlan(grpc::CallbackServerContext* ctx,
                                                             const ckptd::v1::RestorePlanRequest* req,
                                                             ckptd::v1::RestorePlanResponse* resp) {
  AuditIdentity who;
  if (absl::Status auth = AuthorizeAgent(*ctx, "GetRestorePlan", req->node_id(), &who); !auth.ok()) {
    return FinishWith(ctx, auth);
  }
  return FinishWith(ctx, core_->GetRestorePlan(*req), resp);
}

grpc::ServerUnaryReactor* CoordinatorService::GetReshardPlan(grpc::CallbackServerContext* ctx,
                                                             const ckptd::v1::ReshardPlanRequest* req,
                                                             ckptd::v1::ReshardPlanResponse* resp) {
  AuditIdentity who;
  if (absl::Status auth = AuthorizeAgent(*ctx, "GetReshardPlan", req->node_id(), &who); !auth.ok()) {
    return FinishWith(ctx, auth);
  }
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
  AuditRecord record = RecordOf("VerifyStep", AuditIdentity());
  record.job = req->job();
  if (req->has_step()) record.step = req->step();
  AuditIdentity who;
  if (absl::Status auth = AuthorizeOperator(*ctx, record, &who); !auth.ok()) {
    shared->end = auth;
    shared->Pump();
    return reactor;
  }
  record.identity = who;
  Audit(record, absl::OkStatus());
  {
    absl::MutexLock sl(&mu_);
    ++verifying_;
  }
  // The verification's end is recorded too: a damaged step is quarantined.
  std::thread([this, shared, request = *req, record = std::move(record)]() mutable {
    absl::StatusOr<ckptd::v1::VerifyProgress> done =
        core_->VerifyStep(request, [&shared](const ckptd::v1::VerifyProgress& p) {
          absl::MutexLock l(&shared->mu);
          shared->next = p;
          shared->Pump();
        });
    record.action = "VerifyStepDone";
    if (done.ok()) {
      record.step = done->step();
      record.details.emplace_back("intact", done->ok());
      record.details.emplace_back("quarantined", !done->ok());
    }
    Audit(std::move(record), done.status());
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
  AuditRecord record = RecordOf("RunDrill", AuditIdentity(), req->target_node());
  record.job = req->job();
  record.rank = req->rank();
  if (req->at_step() != 0) record.step = req->at_step();
  record.details.emplace_back("scenario", ckptd::v1::DrillScenario_IsValid(req->scenario())
                                              ? absl::AsciiStrToLower(ckptd::v1::DrillScenario_Name(req->scenario()))
                                              : absl::StrCat(static_cast<int>(req->scenario())));
  AuditIdentity who;
  if (absl::Status auth = AuthorizeOperator(*ctx, record, &who); !auth.ok()) return FinishWith(ctx, auth);
  record.identity = who;
  absl::StatusOr<ckptd::v1::RunDrillResponse> ordered = core_->RunDrill(*req);
  if (ordered.ok()) {
    record.details.emplace_back("drill_id", ordered->drill_id());
    record.details.emplace_back("carried_out_by", ordered->node_id());
    if (req->with_partners()) {
      record.details.emplace_back("partner_nodes", absl::StrJoin(ordered->partner_nodes(), ","));
    }
  }
  Audit(std::move(record), ordered.status());
  return FinishWith(ctx, std::move(ordered), resp);
}

grpc::ServerUnaryReactor* CoordinatorService::GetDrill(grpc::CallbackServerContext* ctx,
                                                       const ckptd::v1::GetDrillRequest* req,
                                                       ckptd::v1::DrillStatus* resp) {
  return FinishWith(ctx, core_->GetDrill(*req), resp);
}

grpc::ServerUnaryReactor* CoordinatorService::RequestCheckpoint(grpc::CallbackServerContext* ctx,
                                                                const ckptd::v1::RequestCheckpointRequest* req,
                                                                ckptd::v1::RequestCheckpointResponse* resp) {
  AuditRecord record = RecordOf("RequestCheckpoint", AuditIdentity());
  record.job = req->job();
  AuditIdentity who;
  if (absl::Status auth = AuthorizeOperator(*ctx, record, &who); !auth.ok()) return FinishWith(ctx, auth);
  record.identity = who;
  absl::StatusOr<ckptd::v1::RequestCheckpointResponse> requested = core_->RequestCheckpoint(*req);
  if (requested.ok()) record.step = requested->target_step();
  Audit(std::move(record), requested.status());
  return FinishWith(ctx, std::move(requested), resp);
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
