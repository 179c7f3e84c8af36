// The agent's gRPC service: translates requests to AgentCore and watches each
// registered trainer process, so that its death is handled at once.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent_core.h"
#include "agent/process_watcher.h"
#include "base/logger.h"
#include "ckptd/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "rpc/grpc_status.h"

namespace ckptd::agent {

// Who is at the other end of a connection to the agent's socket, as the
// kernel recorded it when the peer connected (SO_PEERCRED). The pid is in the
// agent's PID namespace (0 when the peer's process is not visible there).
struct PeerCredentials {
  int32_t pid = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
};

// The credentials of each live connection, by its gRPC peer name ("fd:N").
class PeerTable {
 public:
  void Set(const std::string& peer, const PeerCredentials& credentials);
  void Erase(const std::string& peer);
  std::optional<PeerCredentials> Find(const std::string& peer);

 private:
  absl::Mutex mu_;
  std::map<std::string, PeerCredentials> peers_ ABSL_GUARDED_BY(mu_);
};

// The pid the agent watches for a trainer that reports `reported` over a
// connection from `peer`: the reported one when the peer shares the agent's
// PID namespace (a process may register another of its own namespace), the
// peer's own pid otherwise (a pid from the trainer's namespace means another
// process, or none, in the agent's). `same_namespace(pid)` tells whether
// `pid` (in the agent's namespace) is in the agent's PID namespace.
int32_t TrainerPid(int32_t reported, const std::optional<PeerCredentials>& peer,
                   const std::function<bool(int32_t)>& same_namespace);
// Whether process `pid` is in this process's PID namespace (false when it
// cannot be told).
bool InOwnPidNamespace(int32_t pid);

class AgentService : public ckptd::v1::Agent::Service {
 public:
  // `core` must outlive the service.
  explicit AgentService(AgentCore* core);

  // The connections' credentials; StartUnixServer fills it.
  PeerTable* peers() { return &peers_; }

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
  PeerTable peers_;
  ProcessWatcher watcher_;
};

// A gRPC server on a Unix socket whose connections it accepts itself, so as
// to record each peer's credentials before gRPC serves the connection.
class UnixServer {
 public:
  // Serves `service` on a Unix socket at `path` with owner-only permissions
  // (0660 and group `group` when given: the trainers' group), recording each
  // connection's credentials in `peers` (when not null). A stale socket file
  // left by an agent that died is replaced. Accept errors go to `logger`
  // (default: base::DefaultLogger()).
  static absl::StatusOr<std::unique_ptr<UnixServer>> Start(const std::string& path, grpc::Service* service,
                                                           PeerTable* peers = nullptr,
                                                           std::optional<uint32_t> group = std::nullopt,
                                                           base::Logger* logger = nullptr);
  ~UnixServer();
  UnixServer(const UnixServer&) = delete;
  UnixServer& operator=(const UnixServer&) = delete;

  // Stops accepting, then shuts the gRPC server down: in-flight calls end by
  // themselves, and those still running at `deadline` are cancelled.
  void Shutdown(absl::Time deadline = absl::InfiniteFuture());

 private:
  UnixServer() = default;
  void AcceptLoop();

  std::unique_ptr<grpc::Server> server_;
  PeerTable* peers_ = nullptr;
  base::Logger* logger_ = nullptr;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd that stops AcceptLoop
  std::thread acceptor_;
  bool shut_down_ = false;
};

absl::StatusOr<std::unique_ptr<UnixServer>> StartUnixServer(const std::string& path, grpc::Service* service,
                                                            PeerTable* peers = nullptr,
                                                            std::optional<uint32_t> group = std::nullopt);

}  // namespace ckptd::agent
