#include "agent/agent_service.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "base/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/mem_file_system.h"
#include "storage/store.h"

namespace ckptd::agent {
namespace {

using ::ckptd::testing::Eventually;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;

ckptd::v1::Tensor Buffer(const std::string& name, ckptd::v1::Component c, uint64_t n) {
  ckptd::v1::Tensor t;
  t.set_name(name);
  t.set_component(c);
  t.set_dtype(ckptd::v1::BYTES);
  t.add_shape(n);
  return t;
}

class AgentServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    socket_ = dir_.Sub("agent.sock");
    ASSERT_THAT(mem_.CreateDir("/ckpt"), IsOk());
    AgentOptions o;
    o.storage_root = "/ckpt";
    o.io_threads = 1;
    o.segment_prefix = absl::StrCat("/ckptd-test-svc-", ::getpid(), "-", counter_++);
    core_ = std::make_unique<AgentCore>(&mem_, o);
    service_ = std::make_unique<AgentService>(core_.get());
    CKPTD_ASSERT_OK_AND_ASSIGN(server_, StartUnixServer(socket_, service_.get(), service_->peers()));
    stub_ = ckptd::v1::Agent::NewStub(grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    server_.reset();
    service_.reset();
    core_.reset();
  }

  ckptd::v1::RegisterRequest Request(int32_t pid) {
    ckptd::v1::RegisterRequest req;
    req.set_job("svc-job");
    req.set_world_size(1);
    req.set_pid(pid);
    *req.add_buffers() = Buffer("params", ckptd::v1::PARAMS, 10000);
    *req.add_buffers() = Buffer("rng", ckptd::v1::RNG, 64);
    return req;
  }

  static inline int counter_ = 0;
  ckptd::testing::TempDir dir_{"ckptd-agent-"};
  std::string socket_;
  storage::MemFileSystem mem_;
  std::unique_ptr<AgentCore> core_;
  std::unique_ptr<AgentService> service_;
  std::unique_ptr<UnixServer> server_;
  std::unique_ptr<ckptd::v1::Agent::Stub> stub_;
};

TEST_F(AgentServiceTest, SocketIsOwnerOnly) {
  struct stat st;
  ASSERT_EQ(::stat(socket_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(AgentServiceTest, RegisterSnapshotRestoreOverTheSocket) {
  grpc::ClientContext c1;
  ckptd::v1::RegisterResponse reg;
  ASSERT_TRUE(stub_->Register(&c1, Request(::getpid()), &reg).ok());
  ASSERT_EQ(reg.offsets_size(), 2);
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(reg.segment()));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::Seconds(5)));
  std::memset(seg->slot_data(slot), 0x5a, reg.slot_bytes());
  CKPTD_ASSERT_OK(seg->Publish(slot, 7));
  grpc::ClientContext c2;
  ckptd::v1::SnapshotPublishedRequest pub;
  pub.set_trainer_id(reg.trainer_id());
  pub.set_slot(slot);
  pub.set_step(7);
  ckptd::v1::SnapshotPublishedResponse pub_resp;
  ASSERT_TRUE(stub_->SnapshotPublished(&c2, pub, &pub_resp).ok());

  // The agent's persister commits the step.
  ckptd::v1::GetStatusResponse status;
  EXPECT_TRUE(Eventually([&] {
    grpc::ClientContext c;
    ckptd::v1::GetStatusRequest req;
    req.set_trainer_id(reg.trainer_id());
    return stub_->GetStatus(&c, req, &status).ok() && status.has_committed();
  }));
  EXPECT_EQ(status.last_committed_step(), 7u);

  grpc::ClientContext c3;
  ckptd::v1::RestoreRequest rr;
  rr.set_trainer_id(reg.trainer_id());
  rr.set_wait_for_slot_ms(1000);
  ckptd::v1::RestoreResponse restored;
  ASSERT_TRUE(stub_->Restore(&c3, rr, &restored).ok());
  EXPECT_TRUE(restored.found());
  EXPECT_EQ(restored.step(), 7u);
  EXPECT_EQ(seg->slot_data(restored.slot())[reg.offsets(1)], 0x5a);
  CKPTD_ASSERT_OK(seg->Release(restored.slot()));

  grpc::ClientContext c4;
  ckptd::v1::GoodbyeRequest bye;
  bye.set_trainer_id(reg.trainer_id());
  ckptd::v1::GoodbyeResponse bye_resp;
  EXPECT_TRUE(stub_->Goodbye(&c4, bye, &bye_resp).ok());
  grpc::ClientContext c5;
  grpc::Status again = stub_->Goodbye(&c5, bye, &bye_resp);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(AgentServiceTest, SnapshotSkippedIsCountedAndReportedByGetStatus) {
  grpc::ClientContext c1;
  ckptd::v1::RegisterResponse reg;
  ASSERT_TRUE(stub_->Register(&c1, Request(::getpid()), &reg).ok());
  for (uint64_t step : {4u, 8u}) {
    grpc::ClientContext c;
    ckptd::v1::SnapshotSkippedRequest req;
    req.set_trainer_id(reg.trainer_id());
    req.set_step(step);
    req.set_reason(absl::StrCat("no free staging slot at step ", step));
    ckptd::v1::SnapshotSkippedResponse resp;
    ASSERT_TRUE(stub_->SnapshotSkipped(&c, req, &resp).ok());
  }
  grpc::ClientContext c2;
  ckptd::v1::GetStatusRequest sreq;
  sreq.set_trainer_id(reg.trainer_id());
  ckptd::v1::GetStatusResponse status;
  ASSERT_TRUE(stub_->GetStatus(&c2, sreq, &status).ok());
  EXPECT_EQ(status.skipped(), 2u);
  EXPECT_TRUE(status.has_skipped());
  EXPECT_EQ(status.last_skipped_step(), 8u);
  EXPECT_EQ(status.last_skip_reason(), "no free staging slot at step 8");
  EXPECT_EQ(status.failed(), 0u);
  // The core the heartbeats will read holds the same count.
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, core_->Status(reg.trainer_id()));
  EXPECT_EQ(st.skipped, 2u);

  grpc::ClientContext c3;
  ckptd::v1::SnapshotSkippedRequest unknown;
  unknown.set_trainer_id(reg.trainer_id() + 100);
  ckptd::v1::SnapshotSkippedResponse resp;
  grpc::Status s = stub_->SnapshotSkipped(&c3, unknown, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("no trainer"));
}

TEST_F(AgentServiceTest, BadRegistrationIsInvalidArgument) {
  ckptd::v1::RegisterRequest req = Request(::getpid());
  req.set_job("../../etc");
  grpc::ClientContext c;
  ckptd::v1::RegisterResponse resp;
  grpc::Status s = stub_->Register(&c, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("job name"));
}

TEST_F(AgentServiceTest, TrainerDeathIsNoticedAndItsPublishedSnapshotPersisted) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();  // the "trainer": killed below
    ::_exit(0);
  }
  grpc::ClientContext c1;
  ckptd::v1::RegisterResponse reg;
  ASSERT_TRUE(stub_->Register(&c1, Request(child), &reg).ok());
  CKPTD_ASSERT_OK_AND_ASSIGN(auto seg, staging::StagingSegment::Open(reg.segment()));
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::Seconds(5)));
  CKPTD_ASSERT_OK(seg->Publish(slot, 3));  // published; the trainer dies before notifying
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  // The agent's process watcher notices the death, and its persister commits.
  storage::CheckpointStore store(&mem_, "/ckpt");
  EXPECT_TRUE(Eventually([&] {
    absl::StatusOr<std::optional<uint64_t>> l = store.LatestCommittedStep("svc-job");
    return l.ok() && *l == std::optional<uint64_t>(3);
  }));
  // The agent forgot the trainer once it had persisted what it published.
  EXPECT_TRUE(Eventually([&] { return !core_->Status(reg.trainer_id()).ok(); }));
  EXPECT_THAT(core_->Status(reg.trainer_id()), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no trainer")));
}

TEST(TrainerPidTest, ThePeersPidWhenTheReportedOneIsFromAnotherNamespace) {
  auto same = [](int32_t) { return true; };
  auto other = [](int32_t) { return false; };
  const PeerCredentials peer{4242, 1000, 1000};
  // No credentials: the reported pid; a peer the agent cannot see: none.
  EXPECT_EQ(TrainerPid(7, std::nullopt, other), 7);
  EXPECT_EQ(TrainerPid(7, PeerCredentials{0, 1000, 1000}, other), 0);  // not watched
  // The trainer's own pid, in the agent's namespace.
  EXPECT_EQ(TrainerPid(4242, peer, other), 4242);
  // Another process of the agent's own namespace (a wrapper registering its child).
  EXPECT_EQ(TrainerPid(7, peer, same), 7);
  // pid 1 of a pod's namespace means the peer, 4242 here.
  EXPECT_EQ(TrainerPid(1, peer, other), 4242);
  EXPECT_TRUE(InOwnPidNamespace(::getpid()));
  EXPECT_FALSE(InOwnPidNamespace(-5));
}

TEST_F(AgentServiceTest, ConnectionsAreRecordedWithTheirPeersCredentials) {
  grpc::ClientContext c1;
  ckptd::v1::RegisterResponse reg;
  ASSERT_TRUE(stub_->Register(&c1, Request(::getpid()), &reg).ok());
  // The connection the stub used was recorded as this process.
  bool found = false;
  for (int fd = 0; fd < 1024 && !found; ++fd) {
    std::optional<PeerCredentials> p = service_->peers()->Find(absl::StrCat("fd:", fd));
    found = p && p->pid == ::getpid() && p->uid == ::getuid() && p->gid == ::getgid();
  }
  EXPECT_TRUE(found);
}

TEST(StartUnixServerTest, TrainerGroupGetsTheSocketAndTheStaging) {
  ckptd::testing::TempDir tmp("ckptd-sock-");
  ASSERT_FALSE(tmp.path().empty());
  const std::string& dir = tmp.path();
  const std::string sock = dir + "/a.sock";
  // This process's own group: one it may always give files to.
  const uint32_t gid = static_cast<uint32_t>(::getegid());
  ckptd::v1::Agent::Service dummy;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<UnixServer> server, StartUnixServer(sock, &dummy, nullptr, gid));
  struct stat st;
  ASSERT_EQ(::stat(sock.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, gid);
  server->Shutdown();
  const std::string name = absl::StrCat("/ckptd-test-group-", ::getpid());
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<staging::StagingSegment> seg, staging::StagingSegment::Create(name, 1, 4096, gid));
  ASSERT_EQ(::stat(absl::StrCat("/dev/shm", name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, gid);
  seg.reset();
  if (::geteuid() != 0) {
    // A group this process is not in (and, not being root, cannot use).
    EXPECT_THAT(StartUnixServer(dir + "/b.sock", &dummy, nullptr, 65534 == gid ? 65533u : 65534u),
                StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("the trainers' group")));
  }
}

// The attack: in a directory every user may write to (/tmp), another user
// takes the socket's name before the agent starts, and either serves the
// trainers there or keeps the agent from starting. The agent serves only
// from a directory no other user can write to.
TEST(StartUnixServerTest, RefusesADirectoryOtherUsersMayWriteTo) {
  ckptd::testing::TempDir tmp("ckptd-sock-");
  ASSERT_FALSE(tmp.path().empty());
  ASSERT_EQ(::chmod(tmp.path().c_str(), 0777), 0);
  ckptd::v1::Agent::Service dummy;
  EXPECT_THAT(StartUnixServer(tmp.Sub("agent.sock"), &dummy),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(absl::StrCat("the socket's directory ", tmp.path()))));
  struct stat st;
  EXPECT_NE(::lstat(tmp.Sub("agent.sock").c_str(), &st), 0);  // nothing was bound
  // A private directory below it is made and served from.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<UnixServer> server,
                             StartUnixServer(tmp.Sub("ckptd/agent.sock"), &dummy));
  ASSERT_EQ(::stat(tmp.Sub("ckptd").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  server->Shutdown();
}

TEST(StartUnixServerTest, RefusesToReplaceAFileOrALiveAgent) {
  ckptd::testing::TempDir tmp("ckptd-sock-");
  ASSERT_FALSE(tmp.path().empty());
  const std::string& dir = tmp.path();
  const std::string file = dir + "/not-a-socket";
  std::ofstream(file) << "precious";
  ckptd::v1::Agent::Service dummy;
  EXPECT_THAT(StartUnixServer(file, &dummy), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a socket")));
  const std::string sock = dir + "/a.sock";
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<UnixServer> live, StartUnixServer(sock, &dummy));
  ckptd::v1::Agent::Service other;
  EXPECT_THAT(StartUnixServer(sock, &other), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("another agent")));
  live->Shutdown();
  live.reset();
  // The socket file left behind is stale now: a new agent takes it over.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<UnixServer> again, StartUnixServer(sock, &other));
  again->Shutdown();
  EXPECT_THAT(StartUnixServer(std::string(200, 'x'), &other), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("socket path")));
}

}  // namespace
}  // namespace ckptd::agent

// The trainer-group test below makes up users of its own (root only).
#include <sys/socket.h>
#include <sys/un.h>

#include "base/testing/users.h"

namespace ckptd::agent {
namespace {

using ::ckptd::testing::RunAs;
using ::ckptd::testing::TestUser;
using ::ckptd::testing::UnusedIds;

// With --trainer-group G, a trainer of another user in G reaches the agent's
// socket and maps its staging, trusting it as the agent's (the owner of the
// socket); a user outside G gets neither. The agent is this process (root).
TEST(TrainerGroupTest, AgentServesTrainersOfAnotherUserInItsGroupOnly) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to act as users of its own making (setuid)";
  // Numbers that name no user and no group here: no account is touched.
  const std::vector<uint32_t> ids = UnusedIds(3);
  if (ids.size() < 3) GTEST_SKIP() << "no 3 unused uids and gids in 61000..61999";
  const uint32_t group = ids[0];
  const TestUser in_group{ids[1], {ids[1], group}};
  const TestUser outsider{ids[2], {ids[2]}};
  const std::string probe = RunAs(in_group, [] { return std::string("ok"); });
  if (probe != "ok") GTEST_SKIP() << "root here cannot act as another user: " << probe;

  ckptd::testing::TempDir dir("ckptd-group-");
  ASSERT_FALSE(dir.path().empty());
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);  // as /run/ckptd
  const std::string socket = dir.Sub("agent.sock");
  storage::MemFileSystem mem;
  ASSERT_THAT(mem.CreateDir("/ckpt"), IsOk());
  AgentOptions o;
  o.storage_root = "/ckpt";
  o.io_threads = 1;
  o.segment_prefix = absl::StrCat("/ckptd-test-svc-group-", ::getpid());
  o.trainer_group = group;
  AgentCore core(&mem, o);
  AgentService service(&core);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<UnixServer> server,
                             StartUnixServer(socket, &service, service.peers(), group));
  auto stub = ckptd::v1::Agent::NewStub(grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  ckptd::v1::RegisterRequest req;
  req.set_job("group-job");
  req.set_world_size(1);
  req.set_pid(::getpid());
  *req.add_buffers() = Buffer("params", ckptd::v1::PARAMS, 10000);
  grpc::ClientContext c1;
  ckptd::v1::RegisterResponse reg;
  ASSERT_TRUE(stub->Register(&c1, req, &reg).ok());

  // What a trainer does: connect, take the agent's uid from its socket, map the staging.
  auto trainer = [&](bool publish) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, socket.data(), socket.size());
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool connected = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    const std::string connect_error = connected ? "" : std::strerror(errno);
    ::close(fd);
    struct stat st;
    if (::stat(socket.c_str(), &st) != 0) return absl::StrCat("stat ", socket, ": ", std::strerror(errno));
    absl::StatusOr<std::unique_ptr<staging::StagingSegment>> seg =
        staging::StagingSegment::Open(reg.segment(), nullptr, st.st_uid);
    std::string out = absl::StrCat("connect: ", connected ? "ok" : connect_error,
                                   "; open: ", seg.ok() ? "ok" : seg.status().ToString());
    if (seg.ok() && publish) {
      absl::StatusOr<uint32_t> slot = (*seg)->AcquireForFill(absl::ZeroDuration());
      if (!slot.ok()) return slot.status().ToString();
      std::memset((*seg)->slot_data(*slot), 0x3c, (*seg)->slot_bytes());
      absl::Status published = (*seg)->Publish(*slot, 9);
      absl::StrAppend(&out, "; slot ", *slot, " published: ", published.ok() ? "ok" : published.ToString());
    }
    return out;
  };
  EXPECT_EQ(RunAs(in_group, [&] { return trainer(true); }),
            "connect: ok; open: ok; slot 0 published: ok");
  // The agent persists what that trainer staged.
  grpc::ClientContext c2;
  ckptd::v1::SnapshotPublishedRequest pub;
  pub.set_trainer_id(reg.trainer_id());
  pub.set_slot(0);
  pub.set_step(9);
  ckptd::v1::SnapshotPublishedResponse pub_resp;
  ASSERT_TRUE(stub->SnapshotPublished(&c2, pub, &pub_resp).ok());
  storage::CheckpointStore store(&mem, "/ckpt");
  EXPECT_TRUE(Eventually([&] {
    absl::StatusOr<std::optional<uint64_t>> l = store.LatestCommittedStep("group-job");
    return l.ok() && *l == std::optional<uint64_t>(9);
  }));

  const std::string refused = RunAs(outsider, [&] { return trainer(false); });
  EXPECT_THAT(refused, HasSubstr("connect: Permission denied; open: PERMISSION_DENIED: staging segment /dev/shm" +
                                 reg.segment()));
  EXPECT_THAT(refused, HasSubstr(absl::StrCat("(owner uid 0, group ", group, ", mode 0660)")));
  EXPECT_THAT(refused, HasSubstr(absl::StrCat("shared with group ", group, ", which this process is not in")));
  server->Shutdown();
}

// Issue 16, finding 9: a registration whose numbers the agent cannot honour
// (a world it would never commit, a rank outside it) is refused naming the
// field, over the real socket.
TEST_F(AgentServiceTest, RegistrationOutsideTheWorldSizesCkptdHandlesIsInvalidArgumentNamingTheField) {
  struct Case {
    uint32_t rank;
    uint32_t world_size;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {0, 4294967295u, "world_size 4294967295 is outside 1..1048576"},
           {4294967295u, 4294967295u, "world_size 4294967295 is outside 1..1048576"},
           {0, (1u << 20) + 1, "world_size 1048577 is outside 1..1048576"},
           {0, 0, "world_size 0 is outside 1..1048576"},
           {4, 4, "rank 4 is not inside world size 4"},
           {4294967295u, 8, "rank 4294967295 is not inside world size 8"},
       }) {
    ckptd::v1::RegisterRequest req = Request(::getpid());
    req.set_rank(c.rank);
    req.set_world_size(c.world_size);
    grpc::ClientContext ctx;
    ckptd::v1::RegisterResponse resp;
    grpc::Status s = stub_->Register(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message;
    EXPECT_THAT(s.error_message(), HasSubstr(c.message));
  }
  // The largest world the coordinator takes is one the agent takes too.
  ckptd::v1::RegisterRequest req = Request(::getpid());
  req.set_rank((1u << 20) - 1);
  req.set_world_size(1u << 20);
  grpc::ClientContext ctx;
  ckptd::v1::RegisterResponse resp;
  grpc::Status s = stub_->Register(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

}  // namespace
}  // namespace ckptd::agent
