#include "cli/remote.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "agent/grpc_status.h"
#include "coordinator/tls.h"
#include "grpcpp/grpcpp.h"

namespace ckptd::cli {

namespace {

// Long enough for a busy coordinator, short enough that a script notices.
constexpr auto kCallTimeout = std::chrono::seconds(10);

}  // namespace

absl::StatusOr<std::unique_ptr<ckptd::v1::Coordinator::Stub>> ConnectCoordinator(const Args& args) {
  std::optional<std::string> address = args.Get("coordinator");
  if (!address || address->empty()) return absl::InvalidArgumentError("--coordinator HOST:PORT is required");
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  const int tls = args.Has("tls-ca") + args.Has("tls-cert") + args.Has("tls-key");
  if (tls != 0 && tls != 3) {
    return absl::InvalidArgumentError("mutual TLS needs all of --tls-ca, --tls-cert and --tls-key");
  }
  if (tls == 3) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> c =
        coordinator::ChannelCredentialsFromFiles({*args.Get("tls-cert"), *args.Get("tls-key"), *args.Get("tls-ca")});
    if (!c.ok()) return absl::InvalidArgumentError(c.status().message());
    credentials = *c;
  }
  return ckptd::v1::Coordinator::NewStub(grpc::CreateChannel(*address, credentials));
}

absl::StatusOr<ckptd::v1::IntervalStatus> FetchInterval(const Args& args, const std::string& job) {
  absl::StatusOr<std::unique_ptr<ckptd::v1::Coordinator::Stub>> stub = ConnectCoordinator(args);
  if (!stub.ok()) return stub.status();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  ckptd::v1::GetIntervalRequest req;
  req.set_job(job);
  ckptd::v1::IntervalStatus resp;
  const absl::Status s = agent::FromGrpcStatus((*stub)->GetInterval(&ctx, req, &resp));
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("coordinator ", *args.Get("coordinator"), ": ", s.message()));
  }
  return resp;
}

int ExitCodeFor(const absl::Status& status) {
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) return kExitUnavailable;
  if (absl::IsInvalidArgument(status)) return kExitUsage;
  return kExitFailed;
}

}  // namespace ckptd::cli
