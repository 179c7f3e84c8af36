#include "agent/agent_service.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/agent_socket.h"
#include "base/posix_error.h"
#include "base/status_macros.h"
#include "grpcpp/server_posix.h"
#include "base/thread.h"
#include "base/thread_priority.h"

namespace ckptd::agent {

namespace {
// The error a SyncSchedule answer carries, at most (a whole path and errno
// text fit many times over).
constexpr size_t kMaxPersistErrorBytes = 2048;

// `s` cut to at most `n` bytes on a UTF-8 character boundary.
std::string CutUtf8(absl::string_view s, size_t n) {
  if (s.size() <= n) return std::string(s);
  while (n > 0 && (static_cast<uint8_t>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n));
}
}  // namespace

AgentService::AgentService(AgentCore* core) : core_(core) {}

grpc::Status AgentService::Register(grpc::ServerContext* context, const ckptd::v1::RegisterRequest* req,
                                    ckptd::v1::RegisterResponse* resp) {
  TrainerRegistration reg;
  reg.job = req->job();
  reg.rank = req->rank();
  reg.world_size = req->world_size();
  reg.local_world_size = req->local_world_size();
  // The pid to watch: the one the kernel saw connect, when the trainer's own
  // number means nothing here (it runs in another PID namespace, e.g. a pod).
  const std::optional<PeerCredentials> peer = context != nullptr ? peers_.Find(context->peer()) : std::nullopt;
  reg.pid = TrainerPid(req->pid(), peer, InOwnPidNamespace);
  if (reg.pid == 0 && req->pid() > 0) {
    core_->logger()->Warning(absl::StrCat("job ", req->job(), " rank ", req->rank(), " (pid ", req->pid(), " in its namespace) runs where this agent cannot see its process: its death is noticed only " "by the coordinator's hang check, and drills cannot signal it (give the agent the host's PID " "namespace)"));
  } else if (reg.pid != req->pid()) {
    core_->logger()->Warning(absl::StrCat("job ", req->job(), " rank ", req->rank(), " reports pid ", req->pid(), " from another PID namespace; watching its pid here, ", reg.pid));
  }
  reg.buffers.assign(req->buffers().begin(), req->buffers().end());
  const absl::Time start = absl::Now();
  absl::StatusOr<TrainerHandle> h = core_->Register(reg);
  if (const absl::Duration took = absl::Now() - start; took > absl::Seconds(1)) {
    // A trainer gives up after its rpc_timeout (default 5 s), and tries again
    // only within its connect_wait.
    core_->logger()->Warning(absl::StrCat("registering job ", req->job(), " rank ", req->rank(), " took ",
                                          absl::FormatDuration(took), h.ok() ? "" : " and failed"));
  }
  if (!h.ok()) return rpc::ToGrpcStatus(h.status());
  resp->set_trainer_id(h->trainer_id);
  resp->set_segment(h->segment);
  resp->set_slots(h->slots);
  resp->set_slot_bytes(h->slot_bytes);
  for (uint64_t o : h->offsets) resp->add_offsets(o);
  resp->set_coordinated(h->coordinated);
  if (reg.pid > 0) {
    const uint64_t id = h->trainer_id;
    absl::Status watched = watcher_.Watch(reg.pid, [this, id] {
      // Nothing: the trainer already said goodbye.
      core_->TrainerDied(id);
    });
    if (!watched.ok()) {
      (void)core_->TrainerExited(id);  // undo the registration; the watch error is what counts
      return rpc::ToGrpcStatus(watched);
    }
  }
  return grpc::Status::OK;
}

grpc::Status AgentService::SnapshotPublished(grpc::ServerContext*, const ckptd::v1::SnapshotPublishedRequest* req,
                                             ckptd::v1::SnapshotPublishedResponse*) {
  return rpc::ToGrpcStatus(core_->SnapshotPublished(req->trainer_id(), req->slot(), req->step(), req->stall_seconds()));
}

grpc::Status AgentService::Restore(grpc::ServerContext* context, const ckptd::v1::RestoreRequest* req,
                                   ckptd::v1::RestoreResponse* resp) {
  RestoreOptions options;
  if (context != nullptr && context->deadline() != std::chrono::system_clock::time_point::max()) {
    options.caller_timeout = absl::FromChrono(context->deadline()) - absl::Now();
  }
  options.wait_for_slot = absl::Milliseconds(req->wait_for_slot_ms());
  options.client_verifies = req->client_verifies();
  if (req->reread()) {
    options.reread_step = req->reread_step();
    options.reread_problem = req->reread_problem();
  }
  absl::StatusOr<RestoreResult> r = core_->Restore(req->trainer_id(), options);
  if (!r.ok()) return rpc::ToGrpcStatus(r.status());
  resp->set_found(r->step.has_value());
  resp->set_incarnation(r->incarnation);
  resp->set_source(RestoreSourceProto(r->source));
  resp->set_warning(r->warning);
  for (const BlockDigest& b : r->verify) {
    ckptd::v1::BlockDigest* d = resp->add_verify();
    d->set_buffer(b.buffer);
    d->set_offset(b.offset);
    d->set_length(b.length);
    d->set_xxh3(b.xxh3);
  }
  if (r->step) {
    resp->set_step(*r->step);
    resp->set_slot(r->slot);
  }
  return grpc::Status::OK;
}

grpc::Status AgentService::GetStatus(grpc::ServerContext*, const ckptd::v1::GetStatusRequest* req,
                                     ckptd::v1::GetStatusResponse* resp) {
  absl::StatusOr<PersistStatus> s = core_->Status(req->trainer_id());
  if (!s.ok()) return rpc::ToGrpcStatus(s.status());
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
  resp->set_has_failed(s->last_failed_step.has_value());
  resp->set_last_failed_step(s->last_failed_step.value_or(0));
  resp->set_memory_restores(s->memory_restores);
  resp->set_memory_rejected(s->memory_rejected);
  resp->set_slots_ready(s->slots_ready);
  resp->set_slots(s->slots);
  resp->set_memory_checkpoints(s->memory_checkpoints);
  resp->set_has_memory_checkpoint(s->last_memory_step.has_value());
  resp->set_last_memory_step(s->last_memory_step.value_or(0));
  resp->set_resharded_restores(s->resharded_restores);
  resp->set_resharded_shards_opened(s->resharded_shards_opened);
  return grpc::Status::OK;
}

grpc::Status AgentService::SnapshotSkipped(grpc::ServerContext*, const ckptd::v1::SnapshotSkippedRequest* req,
                                           ckptd::v1::SnapshotSkippedResponse*) {
  return rpc::ToGrpcStatus(core_->SnapshotSkipped(req->trainer_id(), req->step(), req->reason()));
}

grpc::Status AgentService::SyncSchedule(grpc::ServerContext*, const ckptd::v1::SyncScheduleRequest* req,
                                        ckptd::v1::SyncScheduleResponse* resp) {
  absl::StatusOr<std::optional<ckptd::v1::Schedule>> s = core_->SyncSchedule(*req);
  if (!s.ok()) return rpc::ToGrpcStatus(s.status());
  if (*s) *resp->mutable_schedule() = **s;
  // The client learns of failed persists without asking (GetStatus).
  if (absl::StatusOr<PersistStatus> st = core_->Status(req->trainer_id()); st.ok()) {
    resp->set_persists_failed(st->failed);
    resp->set_last_failed_step(st->last_failed_step.value_or(0));
    resp->set_last_persist_error(CutUtf8(st->last_error.message(), kMaxPersistErrorBytes));
  }
  return grpc::Status::OK;
}

grpc::Status AgentService::Goodbye(grpc::ServerContext*, const ckptd::v1::GoodbyeRequest* req,
                                   ckptd::v1::GoodbyeResponse*) {
  return rpc::ToGrpcStatus(core_->TrainerExited(req->trainer_id()));
}

void PeerTable::Set(const std::string& peer, const PeerCredentials& credentials) {
  absl::MutexLock l(&mu_);
  peers_[peer] = credentials;
}

void PeerTable::Erase(const std::string& peer) {
  absl::MutexLock l(&mu_);
  peers_.erase(peer);
}

std::optional<PeerCredentials> PeerTable::Find(const std::string& peer) {
  absl::MutexLock l(&mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) return std::nullopt;
  return it->second;
}

int32_t TrainerPid(int32_t reported, const std::optional<PeerCredentials>& peer,
                   const std::function<bool(int32_t)>& same_namespace) {
  if (!peer || reported == peer->pid) return reported;
  // The kernel could not name the peer's process here: the agent cannot see
  // it (no shared PID namespace), and a number from the trainer's namespace
  // would mean another process, or none. Not watched.
  if (peer->pid <= 0) return 0;
  if (same_namespace(peer->pid)) return reported;
  return peer->pid;
}

bool InOwnPidNamespace(int32_t pid) {
  auto link = [](const std::string& path) -> std::optional<std::string> {
    char buf[128];
    const ssize_t n = ::readlink(path.c_str(), buf, sizeof(buf));
    if (n <= 0 || static_cast<size_t>(n) >= sizeof(buf)) return std::nullopt;
    return std::string(buf, static_cast<size_t>(n));
  };
  std::optional<std::string> own = link("/proc/self/ns/pid");
  std::optional<std::string> theirs = link(absl::StrCat("/proc/", pid, "/ns/pid"));
  return own && theirs && *own == *theirs;
}

absl::StatusOr<std::unique_ptr<UnixServer>> StartUnixServer(const std::string& path, grpc::Service* service,
                                                            PeerTable* peers, std::optional<uint32_t> group) {
  return UnixServer::Start(path, service, peers, group);
}

absl::StatusOr<std::unique_ptr<UnixServer>> UnixServer::Start(const std::string& path, grpc::Service* service,
                                                             PeerTable* peers, std::optional<uint32_t> group,
                                                             base::Logger* logger) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path \"", path, "\" must be 1..", sizeof(addr.sun_path) - 1, " bytes"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  // In a directory others may write to, anyone could take the name first.
  const gid_t trainer_gid = group ? static_cast<gid_t>(*group) : 0;
  CKPTD_RETURN_IF_ERROR(base::PrepareAgentSocketDir(path, ::geteuid(), group ? &trainer_gid : nullptr));
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a socket; not replacing it"));
    }
    // A socket nobody answers on was left by an agent that died.
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    if (fd >= 0) ::close(fd);
    if (live) return absl::FailedPreconditionError(absl::StrCat("another agent is serving on ", path));
    if (::unlink(path.c_str()) != 0) return base::PosixError(absl::StrCat("unlink stale socket ", path), errno);
  }
  std::unique_ptr<UnixServer> server(new UnixServer());
  server->peers_ = peers;
  server->logger_ = logger != nullptr ? logger : &base::DefaultLogger();
  server->listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (server->listen_fd_ < 0) return base::PosixError("socket", errno);
  // The socket is created owner-only: no window where others could connect.
  const mode_t old = ::umask(077);
  const int bound = ::bind(server->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  ::umask(old);
  if (bound != 0) return base::PosixError(absl::StrCat("bind ", path), bind_errno);
  if (group && ::chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(*group)) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    return base::PosixError(absl::StrCat("giving group ", *group, " (the trainers' group) the socket ", path), err);
  }
  if (::chmod(path.c_str(), group ? 0660 : 0600) != 0) return base::PosixError(absl::StrCat("chmod ", path), errno);
  if (::listen(server->listen_fd_, 128) != 0) return base::PosixError(absl::StrCat("listen ", path), errno);
  server->wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (server->wake_fd_ < 0) return base::PosixError("eventfd", errno);
  grpc::ServerBuilder builder;
  builder.RegisterService(service);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr) return absl::UnavailableError(absl::StrCat("cannot serve on unix:", path));
  UnixServer* raw = server.get();
  absl::StatusOr<std::thread> acceptor =
      base::StartThread(absl::StrCat("the acceptor of unix:", path), [raw] { raw->AcceptLoop(); });
  if (!acceptor.ok()) return acceptor.status();
  server->acceptor_ = *std::move(acceptor);
  return server;
}

void UnixServer::AcceptLoop() {
  base::SetCallingThreadName("ckptd-accept");
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      logger_->Warning(absl::StrCat("poll on the socket: ", std::strerror(errno), "; trying again"));
      ::usleep(100 * 1000);
      continue;
    }
    if (fds[1].revents != 0) return;
    // Non-blocking: gRPC polls it and must never block reading it.
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // EAGAIN: another wakeup took it; EMFILE and the like: try again soon.
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
        logger_->Warning(absl::StrCat("accept: ", std::strerror(errno)));
        ::usleep(100 * 1000);
      }
      continue;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (peers_ != nullptr) {
      // Recorded before gRPC sees the connection, under the name gRPC gives
      // it; without credentials, none of an earlier connection may linger.
      if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        peers_->Set(absl::StrCat("fd:", fd), {cred.pid, cred.uid, cred.gid});
      } else {
        peers_->Erase(absl::StrCat("fd:", fd));
      }
    }
    grpc::AddInsecureChannelFromFd(server_.get(), fd);  // gRPC owns (and closes) fd now
  }
}

void UnixServer::Shutdown(absl::Time deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  if (server_ == nullptr) return;
  if (deadline == absl::InfiniteFuture()) {
    server_->Shutdown();
  } else {
    server_->Shutdown(absl::ToChronoTime(deadline));
  }
}

UnixServer::~UnixServer() {
  Shutdown();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

}  // namespace ckptd::agent
