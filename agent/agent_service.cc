#include "agent/agent_service.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "storage/posix_error.h"
#include "storage/status_macros.h"

namespace ckptd::agent {

AgentService::AgentService(AgentCore* core) : core_(core) {}

grpc::Status AgentService::Register(grpc::ServerContext*, const ckptd::v1::RegisterRequest* req,
                                    ckptd::v1::RegisterResponse* resp) {
  TrainerRegistration reg;
  reg.job = req->job();
  reg.rank = req->rank();
  reg.world_size = req->world_size();
  reg.pid = req->pid();
  reg.buffers.assign(req->buffers().begin(), req->buffers().end());
  absl::StatusOr<TrainerHandle> h = core_->Register(reg);
  if (!h.ok()) return ToGrpcStatus(h.status());
  resp->set_trainer_id(h->trainer_id);
  resp->set_segment(h->segment);
  resp->set_slots(h->slots);
  resp->set_slot_bytes(h->slot_bytes);
  for (uint64_t o : h->offsets) resp->add_offsets(o);
  resp->set_coordinated(h->coordinated);
  if (req->pid() > 0) {
    const uint64_t id = h->trainer_id;
    absl::Status watched = watcher_.Watch(req->pid(), [this, id] {
      // NotFound: the trainer already said goodbye.
      (void)core_->TrainerExited(id, /*died=*/true);
    });
    if (!watched.ok()) {
      (void)core_->TrainerExited(id);  // undo the registration; the watch error is what counts
      return ToGrpcStatus(watched);
    }
  }
  return grpc::Status::OK;
}

grpc::Status AgentService::SnapshotPublished(grpc::ServerContext*, const ckptd::v1::SnapshotPublishedRequest* req,
                                             ckptd::v1::SnapshotPublishedResponse*) {
  return ToGrpcStatus(core_->SnapshotPublished(req->trainer_id(), req->slot(), req->step(), req->stall_seconds()));
}

grpc::Status AgentService::Restore(grpc::ServerContext*, const ckptd::v1::RestoreRequest* req,
                                   ckptd::v1::RestoreResponse* resp) {
  absl::StatusOr<RestoreResult> r = core_->Restore(req->trainer_id(), absl::Milliseconds(req->wait_for_slot_ms()));
  if (!r.ok()) return ToGrpcStatus(r.status());
  resp->set_found(r->step.has_value());
  resp->set_incarnation(r->incarnation);
  if (r->step) {
    resp->set_step(*r->step);
    resp->set_slot(r->slot);
  }
  return grpc::Status::OK;
}

grpc::Status AgentService::GetStatus(grpc::ServerContext*, const ckptd::v1::GetStatusRequest* req,
                                     ckptd::v1::GetStatusResponse* resp) {
  absl::StatusOr<PersistStatus> s = core_->Status(req->trainer_id());
  if (!s.ok()) return ToGrpcStatus(s.status());
  resp->set_has_persisted(s->last_persisted_step.has_value());
  resp->set_last_persisted_step(s->last_persisted_step.value_or(0));
  resp->set_has_committed(s->last_committed_step.has_value());
  resp->set_last_committed_step(s->last_committed_step.value_or(0));
  resp->set_persisted(s->persisted);
  resp->set_failed(s->failed);
  resp->set_last_error(std::string(s->last_error.message()));
  resp->set_skipped(s->skipped);
  resp->set_has_skipped(s->last_skipped_step.has_value());
  resp->set_last_skipped_step(s->last_skipped_step.value_or(0));
  resp->set_last_skip_reason(s->last_skip_reason);
  resp->set_local_writes(s->local_writes);
  resp->set_local_fallbacks(s->local_fallbacks);
  resp->set_last_local_error(std::string(s->last_local_error.message()));
  resp->set_local_restores(s->local_restores);
  return grpc::Status::OK;
}

grpc::Status AgentService::SnapshotSkipped(grpc::ServerContext*, const ckptd::v1::SnapshotSkippedRequest* req,
                                           ckptd::v1::SnapshotSkippedResponse*) {
  return ToGrpcStatus(core_->SnapshotSkipped(req->trainer_id(), req->step(), req->reason()));
}

grpc::Status AgentService::SyncSchedule(grpc::ServerContext*, const ckptd::v1::SyncScheduleRequest* req,
                                        ckptd::v1::SyncScheduleResponse* resp) {
  absl::StatusOr<std::optional<ckptd::v1::Schedule>> s = core_->SyncSchedule(*req);
  if (!s.ok()) return ToGrpcStatus(s.status());
  if (*s) *resp->mutable_schedule() = **s;
  return grpc::Status::OK;
}

grpc::Status AgentService::Goodbye(grpc::ServerContext*, const ckptd::v1::GoodbyeRequest* req,
                                   ckptd::v1::GoodbyeResponse*) {
  return ToGrpcStatus(core_->TrainerExited(req->trainer_id()));
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartUnixServer(const std::string& path, grpc::Service* service) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path \"", path, "\" must be 1..", sizeof(addr.sun_path) - 1, " bytes"));
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a socket; not replacing it"));
    }
    // A socket nobody answers on was left by an agent that died.
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    const bool live = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    if (fd >= 0) ::close(fd);
    if (live) return absl::FailedPreconditionError(absl::StrCat("another agent is serving on ", path));
    if (::unlink(path.c_str()) != 0) return storage::PosixError(absl::StrCat("unlink stale socket ", path), errno);
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", path), grpc::InsecureServerCredentials());
  builder.RegisterService(service);
  // The socket is created owner-only: no window where others could connect.
  const mode_t old = ::umask(077);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ::umask(old);
  if (server == nullptr) return absl::UnavailableError(absl::StrCat("cannot serve on unix:", path));
  if (::chmod(path.c_str(), 0600) != 0) {
    const int err = errno;
    server->Shutdown();
    return storage::PosixError(absl::StrCat("chmod ", path), err);
  }
  return server;
}

}  // namespace ckptd::agent
