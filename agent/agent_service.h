// The agent's gRPC service: translates requests to AgentCore and watches each
// registered trainer process, so that its death is handled at once.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/agent_core.h"
#include "agent/grpc_status.h"
#include "agent/process_watcher.h"
#include "ckptd/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace ckptd::agent {

class AgentService final : public ckptd::v1::Agent::Service {
 public:
  // `core` must outlive the service.
  explicit AgentService(AgentCore* core);

  grpc::Status Register(grpc::ServerContext*, const ckptd::v1::RegisterRequest* req,
                        ckptd::v1::RegisterResponse* resp) override;
  grpc::Status SnapshotPublished(grpc::ServerContext*, const ckptd::v1::SnapshotPublishedRequest* req,
                                 ckptd::v1::SnapshotPublishedResponse* resp) override;
  grpc::Status Restore(grpc::ServerContext*, const ckptd::v1::RestoreRequest* req,
                       ckptd::v1::RestoreResponse* resp) override;
  grpc::Status GetStatus(grpc::ServerContext*, const ckptd::v1::GetStatusRequest* req,
                         ckptd::v1::GetStatusResponse* resp) override;
  grpc::Status SnapshotSkipped(grpc::ServerContext*, const ckptd::v1::SnapshotSkippedRequest* req,
                               ckptd::v1::SnapshotSkippedResponse* resp) override;
  grpc::Status SyncSchedule(grpc::ServerContext*, const ckptd::v1::SyncScheduleRequest* req,
                            ckptd::v1::SyncScheduleResponse* resp) override;
  grpc::Status Goodbye(grpc::ServerContext*, const ckptd::v1::GoodbyeRequest* req,
                       ckptd::v1::GoodbyeResponse* resp) override;

 private:
  AgentCore* const core_;
  ProcessWatcher watcher_;
};

// Serves `service` on a Unix socket at `path` with owner-only permissions.
// A stale socket file left by an agent that died is replaced.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartUnixServer(const std::string& path, grpc::Service* service);

}  // namespace ckptd::agent
