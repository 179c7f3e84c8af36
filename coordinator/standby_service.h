// What a replicated coordinator that does not lead serves: every call of
// every method is answered UNAVAILABLE, saying who leads, with the leader's
// address in the trailing metadata "ckptd-leader" (when one is known), so
// that agents and ckptctl given several coordinators go to the leader.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_service.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "rpc/coordinator_targets.h"
#include "rpc/server_limits.h"

namespace ckptd::coordinator {

using rpc::kLeaderMetadataKey;

struct StandbyAnswer {
  std::string message;  // why this replica does not serve, and who leads
  std::string leader;   // the leader's address; empty when none is known
};

class StandbyService final : public grpc::CallbackGenericService {
 public:
  // `answer` is called for each call (from gRPC's threads).
  explicit StandbyService(std::function<StandbyAnswer()> answer) : answer_(std::move(answer)) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

 private:
  const std::function<StandbyAnswer()> answer_;
};

// Serves `service` as StartCoordinatorServer serves the coordinator's.
absl::StatusOr<CoordinatorServer> StartStandbyServer(const std::string& listen, StandbyService* service,
                                                     std::shared_ptr<grpc::ServerCredentials> credentials,
                                                     absl::Duration handshake_timeout = rpc::kHandshakeTimeout);

}  // namespace ckptd::coordinator
