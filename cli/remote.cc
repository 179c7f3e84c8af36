#include "cli/remote.h"

#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/host_port.h"
#include "grpcpp/grpcpp.h"
#include "rpc/grpc_status.h"
#include "rpc/tls.h"

namespace ckptd::cli {

namespace {

// Long enough for a busy coordinator, short enough that a script notices.
constexpr auto kCallTimeout = std::chrono::seconds(10);

absl::Status Annotated(const std::string& address, const grpc::Status& status) {
  const absl::Status s = rpc::FromGrpcStatus(status);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("coordinator ", address, ": ", s.message()));
}

class RemoteCoordinatorApi final : public CoordinatorApi {
 public:
  RemoteCoordinatorApi(std::string address, std::unique_ptr<ckptd::v1::Coordinator::Stub> stub,
                       std::optional<std::string> token, std::optional<absl::Duration> stream_timeout)
      : address_(std::move(address)),
        stub_(std::move(stub)),
        token_(std::move(token)),
        stream_timeout_(stream_timeout) {}

  absl::StatusOr<ckptd::v1::GetClusterStatusResponse> ClusterStatus() override {
    return Unary<ckptd::v1::GetClusterStatusResponse>(
        kPlain, [&](grpc::ClientContext* ctx, ckptd::v1::GetClusterStatusResponse* resp) {
          return stub_->GetClusterStatus(ctx, ckptd::v1::GetClusterStatusRequest(), resp);
        });
  }
  absl::StatusOr<ckptd::v1::ListEventsResponse> ListEvents(const ckptd::v1::ListEventsRequest& req) override {
    return Unary<ckptd::v1::ListEventsResponse>(
        kPlain, [&](grpc::ClientContext* ctx, auto* resp) { return stub_->ListEvents(ctx, req, resp); });
  }
  absl::StatusOr<ckptd::v1::IntervalStatus> GetInterval(const ckptd::v1::GetIntervalRequest& req) override {
    return Unary<ckptd::v1::IntervalStatus>(
        kPlain, [&](grpc::ClientContext* ctx, auto* resp) { return stub_->GetInterval(ctx, req, resp); });
  }
  absl::StatusOr<ckptd::v1::RequestCheckpointResponse> RequestCheckpoint(
      const ckptd::v1::RequestCheckpointRequest& req) override {
    return Unary<ckptd::v1::RequestCheckpointResponse>(
        kOperator, [&](grpc::ClientContext* ctx, auto* resp) { return stub_->RequestCheckpoint(ctx, req, resp); });
  }
  absl::StatusOr<ckptd::v1::ListStepsResponse> ListSteps(const ckptd::v1::ListStepsRequest& req) override {
    return Unary<ckptd::v1::ListStepsResponse>(
        kPlain, [&](grpc::ClientContext* ctx, auto* resp) { return stub_->ListSteps(ctx, req, resp); });
  }
  absl::StatusOr<ckptd::v1::RunDrillResponse> RunDrill(const ckptd::v1::RunDrillRequest& req) override {
    return Unary<ckptd::v1::RunDrillResponse>(
        kOperator, [&](grpc::ClientContext* ctx, auto* resp) { return stub_->RunDrill(ctx, req, resp); });
  }
  absl::StatusOr<ckptd::v1::DrillStatus> GetDrill(const ckptd::v1::GetDrillRequest& req) override {
    return Unary<ckptd::v1::DrillStatus>(
        kPlain, [&](grpc::ClientContext* ctx, auto* resp) { return stub_->GetDrill(ctx, req, resp); });
  }
  absl::StatusOr<ckptd::v1::RestorePreview> GetRestorePreview(const ckptd::v1::RestorePreviewRequest& req) override {
    return Unary<ckptd::v1::RestorePreview>(
        kPlain, [&](grpc::ClientContext* ctx, auto* resp) { return stub_->GetRestorePreview(ctx, req, resp); });
  }
  absl::StatusOr<ckptd::v1::VerifyProgress> VerifyStep(
      const ckptd::v1::VerifyStepRequest& req,
      const std::function<void(const ckptd::v1::VerifyProgress&)>& on_progress) override {
    grpc::ClientContext ctx;
    Prepare(kOperator, &ctx);
    if (stream_timeout_) ctx.set_deadline(absl::ToChronoTime(absl::Now() + *stream_timeout_));
    std::unique_ptr<grpc::ClientReader<ckptd::v1::VerifyProgress>> reader = stub_->VerifyStep(&ctx, req);
    std::optional<ckptd::v1::VerifyProgress> last;
    ckptd::v1::VerifyProgress p;
    while (reader->Read(&p)) {
      if (on_progress) on_progress(p);
      last = p;
    }
    if (absl::Status s = Annotated(address_, reader->Finish()); !s.ok()) return s;
    if (!last || !last->done()) {
      return absl::UnknownError(
          absl::StrCat("coordinator ", address_, ": the verification stream ended without a final result"));
    }
    return *std::move(last);
  }

 private:
  enum Auth { kPlain, kOperator };

  void Prepare(Auth auth, grpc::ClientContext* ctx) const {
    // Only the RPCs that need it carry the token.
    if (auth == kOperator && token_) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", *token_));
  }

  template <typename Resp, typename Call>
  absl::StatusOr<Resp> Unary(Auth auth, const Call& call) const {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
    Prepare(auth, &ctx);
    Resp resp;
    if (absl::Status s = Annotated(address_, call(&ctx, &resp)); !s.ok()) return s;
    return resp;
  }

  const std::string address_;
  const std::unique_ptr<ckptd::v1::Coordinator::Stub> stub_;
  const std::optional<std::string> token_;
  const std::optional<absl::Duration> stream_timeout_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorApi>> NewRemoteCoordinatorApi(const base::Args& args) {
  absl::StatusOr<std::unique_ptr<ckptd::v1::Coordinator::Stub>> stub = ConnectCoordinator(args);
  if (!stub.ok()) return stub.status();
  std::optional<std::string> token;
  if (std::optional<std::string> file = args.Get("token-file")) {
    absl::StatusOr<std::string> t = ReadTokenFile(*file);
    if (!t.ok()) return t.status();
    token = *std::move(t);
  }
  absl::StatusOr<std::optional<absl::Duration>> timeout = TimeoutFlag(args);
  if (!timeout.ok()) return timeout.status();
  return std::unique_ptr<CoordinatorApi>(
      new RemoteCoordinatorApi(*args.Get("coordinator"), *std::move(stub), std::move(token), *timeout));
}

absl::StatusOr<std::unique_ptr<ckptd::v1::Coordinator::Stub>> ConnectCoordinator(const base::Args& args) {
  std::optional<std::string> address = args.Get("coordinator");
  if (!address || address->empty()) return absl::InvalidArgumentError("--coordinator HOST:PORT is required");
  if (absl::Status s = base::ParseHostPort(*address, base::PortUse::kConnect).status(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--coordinator: ", s.message()));
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  const int tls = args.Has("tls-ca") + args.Has("tls-cert") + args.Has("tls-key");
  if (tls != 0 && tls != 3) {
    return absl::InvalidArgumentError("mutual TLS needs all of --tls-ca, --tls-cert and --tls-key");
  }
  if (tls == 3) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> c =
        rpc::ChannelCredentialsFromFiles({*args.Get("tls-cert"), *args.Get("tls-key"), *args.Get("tls-ca")});
    if (!c.ok()) return absl::InvalidArgumentError(c.status().message());
    credentials = *c;
  }
  return ckptd::v1::Coordinator::NewStub(grpc::CreateChannel(*address, credentials));
}

absl::StatusOr<ckptd::v1::IntervalStatus> FetchInterval(const base::Args& args, const std::string& job) {
  absl::StatusOr<std::unique_ptr<ckptd::v1::Coordinator::Stub>> stub = ConnectCoordinator(args);
  if (!stub.ok()) return stub.status();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  ckptd::v1::GetIntervalRequest req;
  req.set_job(job);
  ckptd::v1::IntervalStatus resp;
  const absl::Status s = rpc::FromGrpcStatus((*stub)->GetInterval(&ctx, req, &resp));
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("coordinator ", *args.Get("coordinator"), ": ", s.message()));
  }
  return resp;
}

int ExitCodeFor(const absl::Status& status) {
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) return base::kExitUnavailable;
  if (absl::IsInvalidArgument(status)) return base::kExitUsage;
  return base::kExitFailed;
}

}  // namespace ckptd::cli
