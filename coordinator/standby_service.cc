#include "coordinator/standby_service.h"

#include <utility>

namespace ckptd::coordinator {
namespace {

class Refusal final : public grpc::ServerGenericBidiReactor {
 public:
  Refusal(grpc::GenericCallbackServerContext* ctx, const StandbyAnswer& answer) {
    if (!answer.leader.empty()) ctx->AddTrailingMetadata(kLeaderMetadataKey, answer.leader);
    Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, answer.message));
  }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerGenericBidiReactor* StandbyService::CreateReactor(grpc::GenericCallbackServerContext* ctx) {
  return new Refusal(ctx, answer_());
}

absl::StatusOr<CoordinatorServer> StartStandbyServer(const std::string& listen, StandbyService* service,
                                                     std::shared_ptr<grpc::ServerCredentials> credentials,
                                                     absl::Duration handshake_timeout) {
  return internal::StartServer(
      listen, [service](grpc::ServerBuilder& b) { b.RegisterCallbackGenericService(service); },
      std::move(credentials), handshake_timeout);
}

}  // namespace ckptd::coordinator
