#include "cli/remote.h"

#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/host_port.h"
#include "grpcpp/grpcpp.h"
#include "rpc/coordinator_targets.h"
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
  RemoteCoordinatorApi(std::unique_ptr<rpc::CoordinatorTargets> targets, std::optional<std::string> token,
                       std::optional<absl::Duration> stream_timeout)
      : targets_(std::move(targets)), token_(std::move(token)), stream_timeout_(stream_timeout) {}

  // Every page of the status, as one answer.
  absl::StatusOr<ckptd::v1::GetClusterStatusResponse> ClusterStatus() override {
    ckptd::v1::GetClusterStatusResponse all;
    ckptd::v1::GetClusterStatusRequest req;
    while (true) {
      absl::StatusOr<ckptd::v1::GetClusterStatusResponse> page = Unary<ckptd::v1::GetClusterStatusResponse>(
          kPlain, [&](Stub& stub, grpc::ClientContext* ctx, ckptd::v1::GetClusterStatusResponse* resp) {
            return stub.GetClusterStatus(ctx, req, resp);
          });
      if (!page.ok()) return page.status();
      const std::string next = page->next_agents_after();
      if (req.agents_after().empty()) {
        all = *std::move(page);
      } else {
        for (ckptd::v1::AgentStatus& a : *page->mutable_agents()) *all.add_agents() = std::move(a);
      }
      // Node ids only grow from page to page; one that does not is no
      // coordinator of this version, and would never end.
      if (next.empty()) break;
      if (next <= req.agents_after()) {
        return absl::InternalError(absl::StrCat("GetClusterStatus: the page after node ", req.agents_after(),
                                                " ends at node ", next, ", not after it"));
      }
      req.set_agents_after(next);
    }
    all.clear_next_agents_after();
    return all;
  }
  absl::StatusOr<ckptd::v1::ListEventsResponse> ListEvents(const ckptd::v1::ListEventsRequest& req) override {
    return Unary<ckptd::v1::ListEventsResponse>(
        kPlain, [&](Stub& stub, grpc::ClientContext* ctx, auto* resp) { return stub.ListEvents(ctx, req, resp); });
  }
  absl::StatusOr<ckptd::v1::IntervalStatus> GetInterval(const ckptd::v1::GetIntervalRequest& req) override {
    return Unary<ckptd::v1::IntervalStatus>(
        kPlain, [&](Stub& stub, grpc::ClientContext* ctx, auto* resp) { return stub.GetInterval(ctx, req, resp); });
  }
  absl::StatusOr<ckptd::v1::RequestCheckpointResponse> RequestCheckpoint(
      const ckptd::v1::RequestCheckpointRequest& req) override {
    return Unary<ckptd::v1::RequestCheckpointResponse>(
        kOperator, [&](Stub& stub, grpc::ClientContext* ctx, auto* resp) { return stub.RequestCheckpoint(ctx, req, resp); });
  }
  absl::StatusOr<ckptd::v1::ListStepsResponse> ListSteps(const ckptd::v1::ListStepsRequest& req) override {
    return Unary<ckptd::v1::ListStepsResponse>(
        kPlain, [&](Stub& stub, grpc::ClientContext* ctx, auto* resp) { return stub.ListSteps(ctx, req, resp); });
  }
  absl::StatusOr<ckptd::v1::RunDrillResponse> RunDrill(const ckptd::v1::RunDrillRequest& req) override {
    return Unary<ckptd::v1::RunDrillResponse>(
        kOperator, [&](Stub& stub, grpc::ClientContext* ctx, auto* resp) { return stub.RunDrill(ctx, req, resp); });
  }
  absl::StatusOr<ckptd::v1::DrillStatus> GetDrill(const ckptd::v1::GetDrillRequest& req) override {
    return Unary<ckptd::v1::DrillStatus>(
        kPlain, [&](Stub& stub, grpc::ClientContext* ctx, auto* resp) { return stub.GetDrill(ctx, req, resp); });
  }
  absl::StatusOr<ckptd::v1::RestorePreview> GetRestorePreview(const ckptd::v1::RestorePreviewRequest& req) override {
    return Unary<ckptd::v1::RestorePreview>(
        kPlain, [&](Stub& stub, grpc::ClientContext* ctx, auto* resp) { return stub.GetRestorePreview(ctx, req, resp); });
  }
  absl::StatusOr<ckptd::v1::VerifyProgress> VerifyStep(
      const ckptd::v1::VerifyStepRequest& req,
      const std::function<void(const ckptd::v1::VerifyProgress&)>& on_progress) override {
    for (size_t attempt = 0;; ++attempt) {
      grpc::ClientContext ctx;
      Prepare(kOperator, &ctx);
      if (stream_timeout_) ctx.set_deadline(absl::ToChronoTime(absl::Now() + *stream_timeout_));
      const rpc::CoordinatorTargets::Target target = targets_->Current();
      std::unique_ptr<Stub> stub = ckptd::v1::Coordinator::NewStub(target.channel);
      std::unique_ptr<grpc::ClientReader<ckptd::v1::VerifyProgress>> reader = stub->VerifyStep(&ctx, req);
      std::optional<ckptd::v1::VerifyProgress> last;
      ckptd::v1::VerifyProgress p;
      while (reader->Read(&p)) {
        if (on_progress) on_progress(p);
        last = p;
      }
      const grpc::Status finished = reader->Finish();
      if (!last && FollowLeader(target.address, ctx, finished, attempt)) continue;
      if (absl::Status s = Annotated(target.address, finished); !s.ok()) return s;
      if (!last || !last->done()) {
        return absl::UnknownError(absl::StrCat("coordinator ", target.address,
                                               ": the verification stream ended without a final result"));
      }
      return *std::move(last);
    }
  }

 private:
  enum Auth { kPlain, kOperator };

  void Prepare(Auth auth, grpc::ClientContext* ctx) const {
    // Only the RPCs that need it carry the token.
    if (auth == kOperator && token_) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", *token_));
  }

  using Stub = ckptd::v1::Coordinator::Stub;

  // Replicated coordinators: a standby's refusal (UNAVAILABLE, naming the
  // leader) or a replica that does not answer sends the call to the leader
  // or the next replica, each at most once.
  bool FollowLeader(const std::string& used, const grpc::ClientContext& ctx, const grpc::Status& status,
                    size_t attempt) const {
    return status.error_code() == grpc::StatusCode::UNAVAILABLE && attempt + 1 < targets_->size() &&
           targets_->Observe(used, ctx, status);
  }

  template <typename Resp, typename Call>
  absl::StatusOr<Resp> Unary(Auth auth, const Call& call) const {
    for (size_t attempt = 0;; ++attempt) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
      Prepare(auth, &ctx);
      const rpc::CoordinatorTargets::Target target = targets_->Current();
      std::unique_ptr<Stub> stub = ckptd::v1::Coordinator::NewStub(target.channel);
      Resp resp;
      const grpc::Status status = call(*stub, &ctx, &resp);
      if (status.ok()) return resp;
      if (FollowLeader(target.address, ctx, status, attempt)) continue;
      return Annotated(target.address, status);
    }
  }

  const std::unique_ptr<rpc::CoordinatorTargets> targets_;
  const std::optional<std::string> token_;
  const std::optional<absl::Duration> stream_timeout_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorApi>> NewRemoteCoordinatorApi(const base::Args& args) {
  absl::StatusOr<std::unique_ptr<rpc::CoordinatorTargets>> targets = ConnectCoordinators(args);
  if (!targets.ok()) return targets.status();
  std::optional<std::string> token;
  if (std::optional<std::string> file = args.Get("token-file")) {
    absl::StatusOr<std::string> t = ReadTokenFile(*file);
    if (!t.ok()) return t.status();
    token = *std::move(t);
  }
  absl::StatusOr<std::optional<absl::Duration>> timeout = TimeoutFlag(args);
  if (!timeout.ok()) return timeout.status();
  return std::unique_ptr<CoordinatorApi>(
      new RemoteCoordinatorApi(*std::move(targets), std::move(token), *timeout));
}

absl::StatusOr<std::unique_ptr<rpc::CoordinatorTargets>> ConnectCoordinators(const base::Args& args) {
  std::optional<std::string> address = args.Get("coordinator");
  if (!address || address->empty()) return absl::InvalidArgumentError("--coordinator HOST:PORT is required");
  absl::StatusOr<std::vector<std::string>> addresses = rpc::ParseCoordinatorAddresses(*address);
  if (!addresses.ok()) return absl::InvalidArgumentError(absl::StrCat("--coordinator: ", addresses.status().message()));
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
  return std::make_unique<rpc::CoordinatorTargets>(*addresses, credentials, grpc::ChannelArguments());
}

absl::StatusOr<ckptd::v1::IntervalStatus> FetchInterval(const base::Args& args, const std::string& job) {
  absl::StatusOr<std::unique_ptr<CoordinatorApi>> api = NewRemoteCoordinatorApi(args);
  if (!api.ok()) return api.status();
  ckptd::v1::GetIntervalRequest req;
  req.set_job(job);
  return (*api)->GetInterval(req);
}

int ExitCodeFor(const absl::Status& status) {
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) return base::kExitUnavailable;
  if (absl::IsInvalidArgument(status)) return base::kExitUsage;
  return base::kExitFailed;
}

}  // namespace ckptd::cli
