// The data lane of peer replication (replication/peer_service.h): connections that
// present no nonce, a wrong, used or expired one; senders that stop half-way
// or say their bytes changed; a slot taken back while its bytes are on the
// wire; a crowd of idle connections in front of a real copy; a service
// stopped under a copy; fetching nodes that stop reading, and more fetches
// than the service serves at a time; partners that stop or trickle half-way,
// on the lane and on the gRPC streams; and TLS, where the bytes stay on the
// gRPC streams.
// Copies sent and fetched whole over both paths are in
// peer_replication_test.cc.
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/testing/env.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "base/testing/temp_dir.h"
#include "ckptd/v1/peer.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "replication/peer_gate.h"
#include "replication/peer_service.h"
#include "replication/replica_store.h"
#include "replication/replicator.h"
#include "replication/tcp_socket.h"
#include "replication/testing_peer_harness.h"
#include "rpc/fetch_ticket.h"
#include "rpc/grpc_status.h"
#include "rpc/tls.h"
#include "staging/staging.h"

namespace ckptd::replication {
namespace {

using ::ckptd::testing::Eventually;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr char kToken[] = "agent-token-0123456789";
constexpr char kTicket[] = "0123456789abcdef0123456789abcdef";

ckptd::v1::ReplicaHeader Header(uint64_t step, uint64_t bytes) {
  ckptd::v1::ReplicaHeader h;
  h.mutable_key()->set_job("job");
  h.mutable_key()->set_rank(0);
  h.mutable_key()->set_step(step);
  h.set_world_size(1);
  h.set_from_node("node-a");
  h.set_ticket(kTicket);
  h.set_data_bytes(bytes);
  return h;
}

ckptd::v1::ReplicaKey Key(uint64_t step) {
  ckptd::v1::ReplicaKey k;
  k.set_job("job");
  k.set_rank(0);
  k.set_step(step);
  return k;
}

// A sink into `*into`.
ReplicaSink SinkInto(std::vector<uint8_t>* into) {
  return [into](const ckptd::v1::ReplicaHeader& h) {
    into->assign(h.data_bytes(), 0);
    return absl::StatusOr<absl::Span<uint8_t>>(absl::Span<uint8_t>(into->data(), into->size()));
  };
}

// A raw TCP connection to 127.0.0.1:`port`, blocking, 10 s per call.
class Conn {
 public:
  explicit Conn(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    connected_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    const timeval tv{10, 0};
    (void)::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  ~Conn() {
    if (fd_ >= 0) ::close(fd_);
  }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  bool connected() const { return connected_; }
  int fd() const { return fd_; }
  bool Write(absl::string_view bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  bool Write(uint64_t n, char fill) { return Write(std::string(n, fill)); }
  // Whether the service closed the connection within `limit` (sending
  // nothing before).
  bool ClosedWithin(absl::Duration limit) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(limit))) != 1) return false;
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }
  // The put answer (proto/ckptd/v1/peer.proto).
  absl::Status Answer() {
    uint8_t head[5];
    if (!Read(head, 5)) return absl::UnknownError("no answer");
    const uint32_t length = head[1] | uint32_t{head[2]} << 8 | uint32_t{head[3]} << 16 | uint32_t{head[4]} << 24;
    if (length > 4096) return absl::UnknownError("a garbled answer");
    std::string message(length, '\0');
    if (!Read(message.data(), length)) return absl::UnknownError("a cut answer");
    return absl::Status(static_cast<absl::StatusCode>(head[0]), message);
  }
  // Reads `n` bytes and drops them; false when the connection ended first.
  bool Skip(size_t n) {
    std::string buffer(n, '\0');
    return Read(buffer.data(), n);
  }
  // Writes `n` MiB of `fill`, a MiB at a time, and stops at the first
  // refusal; the bytes written.
  uint64_t WriteMiBs(int n, char fill) {
    const std::string mib(kMiB, fill);
    uint64_t done = 0;
    for (int i = 0; i < n; ++i) {
      const ssize_t w = ::send(fd_, mib.data(), mib.size(), MSG_NOSIGNAL);
      if (w <= 0) break;
      done += static_cast<uint64_t>(w);
    }
    return done;
  }
  // What the service sends until it closes the connection (64 KiB at most).
  std::string Reply() {
    std::string out;
    char buffer[4096];
    while (out.size() < 65536) {
      const ssize_t r = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (r <= 0) break;
      out.append(buffer, static_cast<size_t>(r));
    }
    return out;
  }
  // Reads until the service closes the connection; the bytes read.
  uint64_t Drain() {
    uint64_t total = 0;
    char buffer[1 << 16];
    while (true) {
      const ssize_t r = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (r <= 0) return total;
      total += static_cast<uint64_t>(r);
    }
  }

 private:
  bool Read(void* out, size_t n) {
    size_t done = 0;
    while (done < n) {
      const ssize_t r = ::recv(fd_, static_cast<char*>(out) + done, n - done, 0);
      if (r <= 0) return false;
      done += static_cast<size_t>(r);
    }
    return true;
  }
  int fd_ = -1;
  bool connected_ = false;
};

// A channel to node B's Peer port, through its gate with kToken.
std::shared_ptr<grpc::Channel> GatedChannel(const std::string& address, grpc::ChannelArguments args = {}) {
  PeerGateChannelArguments(address, kToken, &args);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

int ThreadCount() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

// Node B: its copies, its Peer service (agent token, taking node-a's copies
// with kTicket) and its data lane on 127.0.0.1, read by `clock`.
class LaneTest : public ::testing::Test {
 protected:
  void Start(PeerServiceOptions po = PeerServiceOptions(), uint64_t budget = 0) {
    ReplicaStoreOptions so;
    so.budget_bytes = budget;
    store_ = std::make_unique<ReplicaStore>(so);
    po.node_id = "node-b";
    po.agent_token = kToken;
    po.clock = &clock_;
    service_ = std::make_unique<PeerService>(store_.get(), po);
    google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner> senders;
    ckptd::v1::ReplicationPartner* a = senders.Add();
    a->set_node_id("node-a");
    a->set_ticket(kTicket);
    service_->SetSenders(senders);
    int port = 0;
    CKPTD_ASSERT_OK_AND_ASSIGN(server_, StartPeerServer("127.0.0.1:0", service_.get(), nullptr, &port));
    port_ = port;
    address_ = absl::StrCat("127.0.0.1:", port);
    CKPTD_ASSERT_OK_AND_ASSIGN(lane_port_, service_->StartDataLane("127.0.0.1", 0));
    stub_ = ckptd::v1::Peer::NewStub(GatedChannel(address_));
    GrpcPeerNetworkOptions no;
    no.node_id = "node-a";
    no.agent_token = kToken;
    net_ = std::make_unique<GrpcPeerNetwork>(no);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    service_.reset();
  }

  // OpenPut as a partner would call it.
  absl::StatusOr<ckptd::v1::DataLane> OpenPut(const ckptd::v1::ReplicaHeader& h) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    ckptd::v1::DataLane lane;
    CKPTD_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_->OpenPut(&ctx, h, &lane)));
    return lane;
  }

  void ExpectNothingHeld() {
    EXPECT_TRUE(Eventually([&] { return store_->bytes() == 0; })) << store_->bytes() << " bytes still reserved";
    EXPECT_THAT(store_->List(), IsEmpty());
  }

  base::FakeClock clock_;
  std::unique_ptr<ReplicaStore> store_;
  std::unique_ptr<PeerService> service_;
  std::unique_ptr<PeerServer> server_;
  int port_ = 0;  // the Peer port, behind its gate
  std::string address_;
  int lane_port_ = 0;
  std::unique_ptr<ckptd::v1::Peer::Stub> stub_;
  std::unique_ptr<GrpcPeerNetwork> net_;
};

TEST_F(LaneTest, AConnectionWithoutANonceIsClosed) {
  PeerServiceOptions po;
  po.handshake_timeout = absl::ZeroDuration();  // the fake clock stands still: the first look closes it
  ASSERT_NO_FATAL_FAILURE(Start(po));
  CKPTD_ASSERT_OK_AND_ASSIGN(const ckptd::v1::DataLane lane, OpenPut(Header(1, kMiB)));
  Conn silent(lane_port_);
  ASSERT_TRUE(silent.connected());
  EXPECT_TRUE(silent.ClosedWithin(absl::Seconds(10)));
  Conn half(lane_port_);
  ASSERT_TRUE(half.Write(lane.nonce().substr(0, 8)));
  EXPECT_TRUE(half.ClosedWithin(absl::Seconds(10))) << "half a nonce is none";
  EXPECT_TRUE(Eventually([&] { return service_->lane_stats().idle_closed == 2; }));
  EXPECT_EQ(service_->lane_stats().refused, 0u);
  EXPECT_EQ(store_->bytes(), kMiB) << "the lane stays open for its sender";
}

TEST(LaneClockTest, AConnectionSlowToPresentItsNonceIsClosedInRealTime) {
  ReplicaStore store({});
  PeerServiceOptions po;
  po.node_id = "node-b";
  po.handshake_timeout = absl::Milliseconds(200);
  PeerService real(&store, po);  // the real clock
  CKPTD_ASSERT_OK_AND_ASSIGN(const int port, real.StartDataLane("127.0.0.1", 0));
  Conn silent(port);
  ASSERT_TRUE(silent.connected());
  const absl::Time start = absl::Now();
  EXPECT_TRUE(silent.ClosedWithin(absl::Seconds(10)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  EXPECT_EQ(real.lane_stats().idle_closed, 1u);
}

TEST_F(LaneTest, AWrongNonceIsRefusedAndTheLaneStaysForItsSender) {
  ASSERT_NO_FATAL_FAILURE(Start());
  CKPTD_ASSERT_OK_AND_ASSIGN(const ckptd::v1::DataLane lane, OpenPut(Header(1, kMiB)));
  std::string wrong = lane.nonce();
  wrong[15] ^= 1;
  Conn guess(lane_port_);
  (void)guess.Write(wrong + std::string(kMiB, 'x') + "\x01");  // may be cut off by the close
  EXPECT_TRUE(guess.ClosedWithin(absl::Seconds(10)));
  EXPECT_EQ(store_->Find(Key(1)), nullptr);
  // The sender's own connection still works.
  Conn right(lane_port_);
  ASSERT_TRUE(right.Write(lane.nonce() + std::string(kMiB, 'y') + "\x01"));
  EXPECT_THAT(right.Answer(), IsOk());
  std::shared_ptr<const Replica> held = store_->Find(Key(1));
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->data()[kMiB - 1], 'y');
  const PeerLaneStats st = service_->lane_stats();
  EXPECT_EQ(st.refused, 1u);
  EXPECT_EQ(st.kept, 1u);
}

TEST_F(LaneTest, ANonceServesOneConnection) {
  ASSERT_NO_FATAL_FAILURE(Start());
  CKPTD_ASSERT_OK_AND_ASSIGN(const ckptd::v1::DataLane lane, OpenPut(Header(1, 4096)));
  {
    Conn first(lane_port_);
    ASSERT_TRUE(first.Write(lane.nonce() + std::string(4096, 'a') + "\x01"));
    ASSERT_THAT(first.Answer(), IsOk());
  }
  Conn again(lane_port_);
  (void)again.Write(lane.nonce() + std::string(4096, 'b') + "\x01");  // may be cut off by the close
  EXPECT_TRUE(again.ClosedWithin(absl::Seconds(10)));
  EXPECT_EQ(store_->Find(Key(1))->data()[0], 'a');
  EXPECT_EQ(service_->lane_stats().refused, 1u);
  EXPECT_EQ(store_->bytes(), 4096u);
}

TEST_F(LaneTest, ALaneNeverUsedExpiresAndFreesItsMemory) {
  ASSERT_NO_FATAL_FAILURE(Start());
  CKPTD_ASSERT_OK_AND_ASSIGN(const ckptd::v1::DataLane lane, OpenPut(Header(1, 8 * kMiB)));
  EXPECT_EQ(store_->bytes(), 8 * kMiB) << "reserved at OpenPut";
  clock_.Advance(absl::Seconds(31));
  ExpectNothingHeld();
  EXPECT_EQ(service_->lane_stats().expired, 1u);
  Conn late(lane_port_);
  ASSERT_TRUE(late.Write(lane.nonce()));
  EXPECT_TRUE(late.ClosedWithin(absl::Seconds(10)));
  EXPECT_EQ(service_->lane_stats().refused, 1u);
}

TEST_F(LaneTest, AnExpiredNonceIsRefusedEvenBeforeTheSweep) {
  ASSERT_NO_FATAL_FAILURE(Start());
  CKPTD_ASSERT_OK_AND_ASSIGN(const ckptd::v1::DataLane lane, OpenPut(Header(1, 4096)));
  Conn late(lane_port_);
  ASSERT_TRUE(late.connected());
  absl::SleepFor(absl::Milliseconds(50));  // accepted, waiting for the nonce
  clock_.Advance(absl::Seconds(30));
  (void)late.Write(lane.nonce() + std::string(4096, 'x') + "\x01");  // may be cut off by the close
  EXPECT_TRUE(late.ClosedWithin(absl::Seconds(10)));
  EXPECT_EQ(store_->Find(Key(1)), nullptr);
  ExpectNothingHeld();
}

TEST_F(LaneTest, ASenderThatStopsHalfWayKeepsNothing) {
  ASSERT_NO_FATAL_FAILURE(Start());
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(const ckptd::v1::DataLane lane, OpenPut(Header(1, 8 * kMiB)));
    Conn c(lane_port_);
    ASSERT_TRUE(c.Write(lane.nonce()));
    ASSERT_TRUE(c.Write(3 * kMiB, 'x'));
  }  // closed
  ExpectNothingHeld();
  EXPECT_EQ(service_->lane_stats().dropped, 1u);
}

TEST_F(LaneTest, EveryByteWithoutTheSendersWordKeepsNothing) {
  ASSERT_NO_FATAL_FAILURE(Start());
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(const ckptd::v1::DataLane lane, OpenPut(Header(1, kMiB)));
    Conn c(lane_port_);
    ASSERT_TRUE(c.Write(lane.nonce() + std::string(kMiB, 'x')));
  }  // closed before the validity byte
  ExpectNothingHeld();
  CKPTD_ASSERT_OK_AND_ASSIGN(const ckptd::v1::DataLane lane, OpenPut(Header(2, kMiB)));
  Conn c(lane_port_);
  ASSERT_TRUE(c.Write(lane.nonce() + std::string(kMiB, 'x') + std::string(1, '\0')));
  EXPECT_THAT(c.Answer(), StatusIs(absl::StatusCode::kAborted, HasSubstr("changed while they were sent")));
  ExpectNothingHeld();
  EXPECT_EQ(service_->lane_stats().dropped, 2u);
}

TEST_F(LaneTest, TooManyLanesAreRefusedAtOnceAndReserveNothing) {
  PeerServiceOptions po;
  po.max_lanes = 2;
  ASSERT_NO_FATAL_FAILURE(Start(po));
  CKPTD_ASSERT_OK(OpenPut(Header(1, 4096)).status());
  CKPTD_ASSERT_OK(OpenPut(Header(2, 4096)).status());
  EXPECT_THAT(OpenPut(Header(3, 4096)).status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("data lanes")));
  EXPECT_EQ(store_->bytes(), 2 * 4096u);
  clock_.Advance(absl::Minutes(1));
  ExpectNothingHeld();
  CKPTD_EXPECT_OK(OpenPut(Header(3, 4096)).status());
}

TEST_F(LaneTest, IdleConnectionsDoNotHoldUpACopy) {
  PeerServiceOptions po;
  po.max_handshakes = 64;
  ASSERT_NO_FATAL_FAILURE(Start(po));  // the fake clock: idle connections never time out
  const int threads = ThreadCount();
  std::vector<std::unique_ptr<Conn>> idle;
  for (int i = 0; i < 250; ++i) {
    idle.push_back(std::make_unique<Conn>(lane_port_));
    ASSERT_TRUE(idle.back()->connected()) << i;
  }
  const absl::Time start = absl::Now();
  ckptd::v1::ReplicaHeader h = Header(1, 9 * kMiB + 5);
  ASSERT_THAT(net_->Put(address_, h, FilledSource(0x42)), IsOk());
  std::vector<uint8_t> back;
  CKPTD_ASSERT_OK(net_->Fetch(address_, Key(1), "", SinkInto(&back)).status());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(back, std::vector<uint8_t>(9 * kMiB + 5, 0x42));
  EXPECT_EQ(net_->stats().lane_puts, 1u);
  EXPECT_EQ(net_->stats().lane_fetches, 1u);
  EXPECT_LE(ThreadCount(), threads + 8) << "no thread per idle connection";
  EXPECT_GE(service_->lane_stats().idle_closed, 250u - 64u) << "the longest waiting make room";
}

TEST_F(LaneTest, StoppingTheServiceCutsACopyUnderWay) {
  ASSERT_NO_FATAL_FAILURE(Start());
  CKPTD_ASSERT_OK_AND_ASSIGN(const ckptd::v1::DataLane lane, OpenPut(Header(1, 8 * kMiB)));
  Conn c(lane_port_);
  ASSERT_TRUE(c.Write(lane.nonce() + std::string(kMiB, 'x')));  // then nothing more
  absl::SleepFor(absl::Milliseconds(50));
  server_->Shutdown();
  const absl::Time start = absl::Now();
  service_.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(c.ClosedWithin(absl::Seconds(10)));
  EXPECT_EQ(store_->bytes(), 0u);
}

// A network that hands the trainer the slot back before the piece at
// `at` is read, then sends over `real`.
// A holder registered with a coordinator (SetFetchKey) serves a fetch only
// with the ticket the coordinator made for the fetching node and the copy,
// on the data lane and the gRPC stream alike.
TEST_F(LaneTest, AFetchNeedsTheTicketMadeForItsNodeAndCopy) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_THAT(net_->Put(address_, Header(1, kMiB), FilledSource(0x51)), IsOk());
  ASSERT_THAT(net_->Put(address_, Header(2, kMiB), FilledSource(0x52)), IsOk());
  constexpr char kKey[] = "0123456789abcdef0123456789abcdef";
  service_->SetFetchKey(kKey);
  std::vector<uint8_t> got;
  EXPECT_THAT(net_->Fetch(address_, Key(1), "", SinkInto(&got)).status(),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("node \"node-a\" has no ticket of node node-b for job job rank 0 step 1"),
                             HasSubstr("none was presented"))));
  const struct {
    std::string ticket, what;
  } wrong[] = {
      {rpc::FetchTicket(kKey, "node-x", "job", 0, 1), "another node's"},
      {rpc::FetchTicket(kKey, "node-a", "job", 0, 2), "another step's"},
      {rpc::FetchTicket("0123456789abcdef0123456789abcdeX", "node-a", "job", 0, 1), "another holder's"},
      {std::string(rpc::kFetchTicketBytes, 'x'), "made up"},
  };
  for (const auto& w : wrong) {
    EXPECT_THAT(net_->Fetch(address_, Key(1), w.ticket, SinkInto(&got)).status(),
                StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("is not valid")))
        << w.what;
  }
  EXPECT_EQ(service_->lane_stats().opened, 2u) << "the two puts' lanes only";
  // The gRPC stream asks the same.
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
  ckptd::v1::FetchReplicaRequest request;
  *request.mutable_key() = Key(1);
  request.set_node_id("node-a");
  std::unique_ptr<grpc::ClientReader<ckptd::v1::ReplicaPiece>> reader = stub_->FetchReplica(&ctx, request);
  ckptd::v1::ReplicaPiece piece;
  EXPECT_FALSE(reader->Read(&piece));
  EXPECT_THAT(rpc::FromGrpcStatus(reader->Finish()),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("has no ticket")));

  CKPTD_ASSERT_OK(net_->Fetch(address_, Key(1), rpc::FetchTicket(kKey, "node-a", "job", 0, 1), SinkInto(&got)).status());
  EXPECT_EQ(got, std::vector<uint8_t>(kMiB, 0x51));
  // A holder that registered again has a new key: the old plan's tickets go.
  service_->SetFetchKey("fedcba9876543210fedcba9876543210");
  EXPECT_THAT(net_->Fetch(address_, Key(1), rpc::FetchTicket(kKey, "node-a", "job", 0, 1), SinkInto(&got)).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("registered again")));
}

// ---- The gate on the Peer port (peer_gate.h): with an agent token and no
// TLS, gRPC reads nothing a caller sends before it proved the token.

// The review's attack: 32 callers without the token each send a 64 MiB
// message at once. Before the gate, gRPC read every one whole (630 MiB more
// resident); now each is closed after a few bytes.
TEST_F(LaneTest, LargeMessagesWithoutTheTokenAreNeverRead) {
  ASSERT_NO_FATAL_FAILURE(Start());
  constexpr int kCallers = 32;
  std::vector<uint64_t> written(kCallers);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      Conn c(port_);
      // Half speak gRPC at once (its preface, then a message's bytes); half
      // start a preamble and never end it.
      if (i % 2 == 0) {
        c.Write("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
      } else {
        c.Write("CONNECT node-b HTTP/1.1\r\nX-Filler: ");
      }
      written[i] = c.WriteMiBs(64, 'x');
    });
  }
  for (std::thread& t : callers) t.join();
  for (int i = 0; i < kCallers; ++i) EXPECT_LT(written[i], 64 * kMiB) << "caller " << i << " was read whole";
  ASSERT_TRUE(Eventually([&] { return server_->gate_stats().malformed == kCallers; }))
      << "malformed " << server_->gate_stats().malformed;
  const PeerGateStats st = server_->gate_stats();
  EXPECT_LE(st.bytes_read, uint64_t{kCallers} * (kMaxPreambleBytes + 1024));
  EXPECT_EQ(st.admitted, 0u);
  EXPECT_EQ(store_->bytes(), 0u);

  // The same with gRPC's own client: a PutReplica whose first message is
  // 60 MiB, sent without the preamble, never reaches the service.
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  auto stub = ckptd::v1::Peer::NewStub(grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));  // the token alone proves nothing
  ckptd::v1::PutReplicaResponse response;
  auto writer = stub->PutReplica(&ctx, &response);
  ckptd::v1::ReplicaPiece piece;
  *piece.mutable_header() = Header(1, 60 * kMiB);
  piece.set_data(std::string(60 * kMiB, 'y'));
  (void)writer->Write(piece);
  writer->WritesDone();
  EXPECT_THAT(rpc::FromGrpcStatus(writer->Finish()), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_LE(server_->gate_stats().bytes_read, st.bytes_read + kMaxPreambleBytes + 1024);
  EXPECT_EQ(store_->bytes(), 0u);
  // A partner with the token is served all the while.
  EXPECT_THAT(net_->Put(address_, Header(2, kMiB), FilledSource(0x21)), IsOk());
  EXPECT_EQ(server_->gate_stats().admitted, 1u);
}

TEST_F(LaneTest, TheGateAnswersWhatIsWrongWithAPreamble) {
  ASSERT_NO_FATAL_FAILURE(Start());
  struct Case {
    std::string sent, answer;
  };
  const std::vector<Case> cases = {
      {"CONNECT node-b HTTP/1.0\r\nAuthorization: Bearer not-the-token\r\n\r\n", "HTTP/1.0 403"},
      {"CONNECT node-b HTTP/1.0\r\nAuthorization: Basic Zm9vOmJhcg==\r\n\r\n", "HTTP/1.0 403"},
      {"CONNECT node-b HTTP/1.0\r\nHost: node-b\r\n\r\n", "HTTP/1.0 401"},
      {"GET / HTTP/1.0\r\n\r\n", "HTTP/1.0 400"},
      // Bytes after the preamble, before the answer: not what gRPC sends.
      {absl::StrCat("CONNECT node-b HTTP/1.0\r\nAuthorization: Bearer ", kToken, "\r\n\r\nPRI"), "HTTP/1.0 400"},
      {absl::StrCat("CONNECT node-b HTTP/1.0\r\nX: ", std::string(kMaxPreambleBytes, 'a')), "HTTP/1.0 400"},
  };
  for (const Case& c : cases) {
    Conn conn(port_);
    ASSERT_TRUE(conn.connected());
    conn.Write(c.sent);
    EXPECT_THAT(conn.Reply(), ::testing::StartsWith(c.answer)) << c.sent.substr(0, 80);
  }
  const PeerGateStats st = server_->gate_stats();
  EXPECT_EQ(st.refused, 3u);
  EXPECT_EQ(st.malformed, 3u);
  EXPECT_EQ(st.admitted, 0u);
  // Header names are not case-sensitive; the right token is let through.
  Conn ok(port_);
  ok.Write(absl::StrCat("CONNECT node-b HTTP/1.0\r\nAUTHORIZATION:   Bearer ", kToken, "\r\n\r\n"));
  char answer[19] = {};
  ASSERT_EQ(::recv(ok.fd(), answer, sizeof(answer), MSG_WAITALL), 19);
  EXPECT_EQ(absl::string_view(answer, 19), "HTTP/1.0 200 OK\r\n\r\n");
  EXPECT_TRUE(Eventually([&] { return server_->gate_stats().admitted == 1; }));
}

TEST_F(LaneTest, ConnectionsThatNeverFinishAPreambleDoNotKeepAPartnerOut) {
  PeerServiceOptions po;
  po.max_preambles = 4;  // the fake clock stands still: only crowding closes them
  ASSERT_NO_FATAL_FAILURE(Start(po));
  std::vector<std::unique_ptr<Conn>> silent;
  for (int i = 0; i < 10; ++i) {
    silent.push_back(std::make_unique<Conn>(port_));
    ASSERT_TRUE(silent.back()->connected());
    silent.back()->Write("CONN");  // and then nothing
  }
  ASSERT_TRUE(Eventually([&] { return server_->gate_stats().idle_closed >= 6; }));
  EXPECT_TRUE(silent.front()->ClosedWithin(absl::Seconds(10))) << "the longest waiting went first";
  EXPECT_THAT(net_->Put(address_, Header(1, kMiB), FilledSource(0x42)), IsOk());
  EXPECT_EQ(server_->gate_stats().admitted, 1u);
}

TEST(GateClockTest, AConnectionSlowToPresentItsPreambleIsClosedInRealTime) {
  ReplicaStore store({});
  PeerServiceOptions po;
  po.node_id = "node-b";
  po.agent_token = kToken;
  po.preamble_timeout = absl::Milliseconds(200);
  PeerService service(&store, po);  // the real clock
  int port = 0;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<PeerServer> server,
                             StartPeerServer("127.0.0.1:0", &service, nullptr, &port));
  ASSERT_TRUE(server->gated());
  Conn slow(port);
  ASSERT_TRUE(slow.Write("CONNECT node-b HTTP/1.0\r\n"));
  const absl::Time start = absl::Now();
  EXPECT_TRUE(slow.ClosedWithin(absl::Seconds(10)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(server->gate_stats().idle_closed, 1u);
  server->Shutdown();
}

// A partner's channel presents the preamble again on every new connection:
// after the partner restarts on its port, copies go on.
TEST_F(LaneTest, APartnerRestartedOnItsPortIsReachedAgainThroughItsGate) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_THAT(net_->Put(address_, Header(1, kMiB), FilledSource(0x11)), IsOk());
  server_->Shutdown();
  server_.reset();
  PeerServiceOptions po;
  po.node_id = "node-b";
  po.agent_token = kToken;
  PeerService again(store_.get(), po);
  google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner> senders;
  senders.Add()->set_node_id("node-a");
  senders.Mutable(0)->set_ticket(kTicket);
  again.SetSenders(senders);
  int port = 0;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<PeerServer> restarted,
                             StartPeerServer(address_, &again, nullptr, &port));
  ASSERT_EQ(port, port_);
  absl::Status put;
  for (int i = 0; i < 5; ++i) {  // the channel may first see the old connection close
    put = net_->Put(address_, Header(2, kMiB), FilledSource(0x12));
    if (put.ok()) break;
    absl::SleepFor(absl::Milliseconds(500));
  }
  EXPECT_THAT(put, IsOk());
  EXPECT_EQ(restarted->gate_stats().admitted, 1u);
  std::vector<uint8_t> got;
  EXPECT_THAT(net_->Fetch(address_, Key(2), "", SinkInto(&got)).status(), IsOk());
  EXPECT_EQ(got, std::vector<uint8_t>(kMiB, 0x12));
  restarted->Shutdown();
}

class TakingBackNetwork : public PeerNetwork {
 public:
  TakingBackNetwork(PeerNetwork* real, staging::StagingSegment* segment, uint64_t at)
      : real_(real), segment_(segment), at_(at) {}
  absl::Status Put(const std::string& address, const ckptd::v1::ReplicaHeader& header,
                   const PieceSource& source) override {
    PieceSource wrapped = source;
    wrapped.piece = [&](uint64_t offset, uint64_t length) {
      if (offset == at_) {
        // The trainer snapshots twice: into the free slot, then (none free)
        // into the KEPT one.
        for (int i = 0; i < 2; ++i) EXPECT_THAT(segment_->AcquireForFill(absl::ZeroDuration()).status(), IsOk());
      }
      return source.piece(offset, length);
    };
    return real_->Put(address, header, wrapped);
  }
  absl::StatusOr<ckptd::v1::ReplicaHeader> Fetch(const std::string& address, const ckptd::v1::ReplicaKey& key,
                                                 const std::string& ticket, const ReplicaSink& sink) override {
    return real_->Fetch(address, key, ticket, sink);
  }

 private:
  PeerNetwork* const real_;
  staging::StagingSegment* const segment_;
  const uint64_t at_;
};

TEST_F(LaneTest, ASlotTakenBackWhileItsBytesAreOnTheWireIsNotKept) {
  ASSERT_NO_FATAL_FAILURE(Start());
  CKPTD_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<staging::StagingSegment> seg,
      staging::StagingSegment::Create(absl::StrCat("/ckptd-test-lane-", ::getpid()), 2, 9 * kMiB));
  CKPTD_ASSERT_OK_AND_ASSIGN(const uint32_t slot, seg->AcquireForFill(absl::ZeroDuration()));
  std::memset(seg->slot_data(slot), 7, 9 * kMiB);
  CKPTD_ASSERT_OK(seg->Publish(slot, 40));
  ASSERT_EQ(seg->TakeReady(), std::optional<uint32_t>(slot));
  CKPTD_ASSERT_OK(seg->Keep(slot));
  TakingBackNetwork net(net_.get(), seg.get(), kReplicaPieceBytes);
  Replicator r(&net, ReplicatorOptions());
  google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner> partners;
  ckptd::v1::ReplicationPartner* b = partners.Add();
  b->set_node_id("node-b");
  b->set_address(address_);
  b->set_ticket(kTicket);
  r.SetPartners(partners);
  ReplicaSource source;
  source.header = Header(40, 9 * kMiB);
  source.header.clear_ticket();
  source.segment = std::move(seg);
  source.slot = slot;
  r.Submit(source);
  ASSERT_TRUE(r.WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(r.Stats().abandoned, 1u);
  EXPECT_EQ(r.Stats().sent, 0u);
  EXPECT_EQ(net_->stats().lane_puts, 1u) << "it went over the data lane";
  ExpectNothingHeld();
  EXPECT_TRUE(Eventually([&] { return service_->lane_stats().dropped == 1; }));
}

// ---- A fetching node that stops ----

// A copy larger than what the socket buffers and HTTP/2 windows take in.
constexpr uint64_t kFetchedCopyBytes = 64 * kMiB;
constexpr absl::Duration kFetchStall = absl::Milliseconds(300);

class FetcherTest : public LaneTest {
 protected:
  void SetUp() override {
    PeerServiceOptions po;
    po.fetch_stall = kFetchStall;
    po.max_fetches = 2;
    ASSERT_NO_FATAL_FAILURE(Start(po));
    ASSERT_THAT(net_->Put(address_, Header(1, kFetchedCopyBytes), FilledSource(0x33)), IsOk());
  }
  ckptd::v1::FetchReplicaRequest Request() {
    ckptd::v1::FetchReplicaRequest r;
    *r.mutable_key() = Key(1);
    r.set_node_id("node-x");
    return r;
  }
  absl::StatusOr<ckptd::v1::DataLane> OpenFetch() {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    ckptd::v1::DataLane lane;
    CKPTD_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_->OpenFetch(&ctx, Request(), &lane)));
    return lane;
  }
  // How long after `start` the service cut the fetch and let it go (20 s at
  // most).
  absl::Duration CutAfter(absl::Time start) {
    EXPECT_TRUE(Eventually(
        [&] {
          const PeerFetchStats st = service_->fetch_stats();
          return st.cut == 1 && st.in_flight == 0;
        },
        absl::Seconds(20)))
        << "the stalled fetch is still served";
    return absl::Now() - start;
  }
};

TEST_F(FetcherTest, AStreamFetcherThatStopsReadingIsCutOffAfterTheStall) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);  // pieces of 4 MiB and a header
  auto stub = ckptd::v1::Peer::NewStub(GatedChannel(address_, args));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
  std::unique_ptr<grpc::ClientReader<ckptd::v1::ReplicaPiece>> reader = stub->FetchReplica(&ctx, Request());
  ckptd::v1::ReplicaPiece piece;
  ASSERT_TRUE(reader->Read(&piece));  // one piece, then nothing for a while
  const absl::Duration took = CutAfter(absl::Now());
  EXPECT_LT(took, kFetchStall + absl::Seconds(3));
  // Reading on, the fetcher does not get the copy whole.
  uint64_t got = piece.data().size();
  while (reader->Read(&piece)) got += piece.data().size();
  EXPECT_LT(got, kFetchedCopyBytes);
  EXPECT_FALSE(reader->Finish().ok());
}

TEST_F(FetcherTest, ALaneFetcherThatStopsReadingIsCutOffAfterTheStall) {
  CKPTD_ASSERT_OK_AND_ASSIGN(const ckptd::v1::DataLane lane, OpenFetch());
  Conn c(lane_port_);
  ASSERT_TRUE(c.Write(lane.nonce()));
  ASSERT_TRUE(c.Skip(kMiB));  // then nothing for a while
  // Sooner than the socket's own timeout (lane_io_timeout, 30 s).
  const absl::Duration took = CutAfter(absl::Now());
  EXPECT_LT(took, kFetchStall + absl::Seconds(3));
  EXPECT_LT(kMiB + c.Drain(), kFetchedCopyBytes);
  EXPECT_TRUE(Eventually([&] { return service_->lane_stats().dropped == 1; }));
}

TEST_F(FetcherTest, FetchesPastTheLimitAreRefused) {
  // Two lanes opened and not used hold the two fetches served.
  CKPTD_ASSERT_OK(OpenFetch().status());
  CKPTD_ASSERT_OK(OpenFetch().status());
  EXPECT_THAT(OpenFetch().status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("node node-b serves 2 fetches already")));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
  std::unique_ptr<grpc::ClientReader<ckptd::v1::ReplicaPiece>> reader = stub_->FetchReplica(&ctx, Request());
  ckptd::v1::ReplicaPiece piece;
  EXPECT_FALSE(reader->Read(&piece));
  EXPECT_THAT(rpc::FromGrpcStatus(reader->Finish()),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("serves 2 fetches already")));
  PeerFetchStats st = service_->fetch_stats();
  EXPECT_EQ(st.in_flight, 2u);
  EXPECT_EQ(st.refused, 2u);
  // The lanes expire unused; fetches are served again.
  clock_.Advance(absl::Seconds(31));
  EXPECT_TRUE(Eventually([&] { return service_->fetch_stats().in_flight == 0; }));
  std::vector<uint8_t> back;
  CKPTD_ASSERT_OK(net_->Fetch(address_, Key(1), "", SinkInto(&back)).status());
  EXPECT_EQ(back.size(), kFetchedCopyBytes);
  EXPECT_TRUE(Eventually([&] { return service_->fetch_stats().in_flight == 0; })) << "the lane's thread lets go";
  EXPECT_EQ(service_->fetch_stats().cut, 0u);
}

// ---- A partner that stops ----

constexpr uint64_t kStoppedCopyBytes = 8 * kMiB;
constexpr absl::Duration kBase = absl::Milliseconds(500);
// Far more than the calls below take, far less than they waited before (a
// stream fetch: as long as 64 GiB take at the minimum rate).
constexpr absl::Duration kLimit = absl::Seconds(5);

// What a stopping partner does after it answered.
enum class Stops {
  kBeforeTheHeader,  // FetchReplica sends nothing
  kAfterTheHeader,   // FetchReplica sends the header and 1 MiB, then nothing
  kTrickling,        // FetchReplica sends the header, then 1 KiB every 20 ms
  kTakingNothing,    // PutReplica reads nothing
};

// A Peer service that answers as a partner would, then sends or takes
// nothing (or next to nothing) more until `released` or the caller's cancel:
// a partner hung, cut off or SIGSTOPped half-way, as the caller sees it.
// With a lane port, OpenPut and OpenFetch hand out that lane (served by the
// test); without, they say there is none and the caller uses the streams.
class StoppingPartner final : public ckptd::v1::Peer::Service {
 public:
  StoppingPartner(Stops stops, int lane_port, absl::Notification* released)
      : stops_(stops), lane_port_(lane_port), released_(released) {}

  grpc::Status FetchReplica(grpc::ServerContext* ctx, const ckptd::v1::FetchReplicaRequest* request,
                            grpc::ServerWriter<ckptd::v1::ReplicaPiece>* writer) override {
    ckptd::v1::ReplicaPiece piece;
    if (stops_ != Stops::kBeforeTheHeader) {
      *piece.mutable_header() = Header(request->key().step(), kStoppedCopyBytes);
      piece.mutable_data()->assign(stops_ == Stops::kAfterTheHeader ? kMiB : 1024, 'x');
      if (!writer->Write(piece)) return grpc::Status::CANCELLED;
    }
    if (stops_ != Stops::kTrickling) return Hang(ctx);
    piece.clear_header();
    for (uint64_t offset = 1024; offset < kStoppedCopyBytes && !Stopped(ctx, absl::Milliseconds(20)); offset += 1024) {
      piece.set_offset(offset);
      if (!writer->Write(piece)) return grpc::Status::CANCELLED;
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "released by the test");
  }
  grpc::Status PutReplica(grpc::ServerContext* ctx, grpc::ServerReader<ckptd::v1::ReplicaPiece>*,
                          ckptd::v1::PutReplicaResponse*) override {
    return Hang(ctx);
  }
  grpc::Status OpenFetch(grpc::ServerContext*, const ckptd::v1::FetchReplicaRequest* request,
                         ckptd::v1::DataLane* lane) override {
    if (lane_port_ == 0) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no data lane");
    *lane->mutable_header() = Header(request->key().step(), kStoppedCopyBytes);
    lane->set_port(static_cast<uint32_t>(lane_port_));
    lane->set_nonce(std::string(16, 'n'));
    return grpc::Status::OK;
  }
  grpc::Status OpenPut(grpc::ServerContext*, const ckptd::v1::ReplicaHeader*, ckptd::v1::DataLane* lane) override {
    if (lane_port_ == 0) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no data lane");
    lane->set_port(static_cast<uint32_t>(lane_port_));
    lane->set_nonce(std::string(16, 'n'));
    return grpc::Status::OK;
  }

 private:
  // Whether the call is over (released, or cancelled by the caller) after
  // waiting up to `wait` for it.
  bool Stopped(grpc::ServerContext* ctx, absl::Duration wait) {
    return released_->WaitForNotificationWithTimeout(wait) || ctx->IsCancelled();
  }
  grpc::Status Hang(grpc::ServerContext* ctx) {
    while (!Stopped(ctx, absl::Milliseconds(10))) {
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "released by the test");
  }

  const Stops stops_;
  const int lane_port_;
  absl::Notification* const released_;
};

// A client with a base deadline of kBase against a StoppingPartner; with a
// lane, the test's end of it takes one connection and its nonce, then
// sends a byte every 20 ms (`drip`) or reads nothing, until released.
class StoppingPartnerTest : public ::testing::Test {
 protected:
  void Start(Stops stops, bool lane = false, bool drip = false, double min_bytes_per_second = 1e6) {
    int lane_port = 0;
    if (lane) {
      CKPTD_ASSERT_OK_AND_ASSIGN(lane_listener_, tcp::Listen("127.0.0.1", 0, &lane_port));
      lane_thread_ = std::thread([this, drip] { ServeLane(drip); });
    }
    partner_ = std::make_unique<StoppingPartner>(stops, lane_port, &released_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(partner_.get());
    builder.SetMaxReceiveMessageSize(16 << 20);  // the client's pieces of 4 MiB and a header
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port, 0);
    address_ = absl::StrCat("127.0.0.1:", port);
    GrpcPeerNetworkOptions no;
    no.node_id = "node-a";
    no.base_deadline = kBase;
    no.min_bytes_per_second = min_bytes_per_second;
    net_ = std::make_unique<GrpcPeerNetwork>(no);
  }
  void TearDown() override {
    Release();
    if (lane_thread_.joinable()) lane_thread_.join();
    if (server_ != nullptr) server_->Shutdown();
  }
  void Release() {
    if (!released_.HasBeenNotified()) released_.Notify();
  }

  // What `call` returned, run on a thread. When it has not returned within
  // kLimit the test fails and the partner is released, so that a call that
  // nothing bounds ends and the test reports it rather than hangs.
  absl::Status Within(std::function<absl::Status()> call) {
    absl::Status s;
    absl::Notification done;
    std::thread t([&] {
      s = call();
      done.Notify();
    });
    if (!done.WaitForNotificationWithTimeout(kLimit)) {
      ADD_FAILURE() << "still waiting for the stopped partner after " << kLimit;
      Release();
    }
    t.join();
    return s;
  }
  absl::Status Fetch() {
    return Within([&] {
      std::vector<uint8_t> into;
      return net_->Fetch(address_, Key(1), "", SinkInto(&into)).status();
    });
  }
  absl::Status Put(uint64_t bytes) {
    return Within([&] { return net_->Put(address_, Header(1, bytes), FilledSource(0x5a)); });
  }

  absl::Notification released_;
  tcp::Fd lane_listener_;
  std::thread lane_thread_;
  std::unique_ptr<StoppingPartner> partner_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<GrpcPeerNetwork> net_;

 private:
  void ServeLane(bool drip) {
    pollfd p{lane_listener_.get(), POLLIN, 0};
    while (::poll(&p, 1, 10) != 1) {
      if (released_.HasBeenNotified()) return;
    }
    tcp::Fd conn(::accept4(lane_listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    ASSERT_GE(conn.get(), 0);
    char nonce[16];
    for (size_t got = 0; got < sizeof(nonce);) {
      const ssize_t n = ::recv(conn.get(), nonce + got, sizeof(nonce) - got, 0);
      if (n <= 0) return;
      got += static_cast<size_t>(n);
    }
    while (!released_.WaitForNotificationWithTimeout(absl::Milliseconds(20))) {
      if (drip && ::send(conn.get(), "x", 1, MSG_NOSIGNAL) != 1) return;  // the fetcher gave up
    }
  }
};

TEST_F(StoppingPartnerTest, AStreamFetchFromAHolderThatStopsAfterTheHeaderGivesUpAfterTheBaseDeadline) {
  ASSERT_NO_FATAL_FAILURE(Start(Stops::kAfterTheHeader));
  EXPECT_THAT(Fetch(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("the copy of job job rank 0 step 1 from ", address_,
                                              ": no data for 500ms after 1048576 of 8388608 bytes, gave up"))));
  EXPECT_EQ(net_->stats().stream_fetches, 1u);
}

TEST_F(StoppingPartnerTest, AStreamFetchFromAHolderThatSendsNothingGivesUpAfterTheBaseDeadline) {
  ASSERT_NO_FATAL_FAILURE(Start(Stops::kBeforeTheHeader));
  EXPECT_THAT(Fetch(), StatusIs(absl::StatusCode::kUnavailable,
                                HasSubstr(absl::StrCat("the copy of job job rank 0 step 1 from ", address_,
                                                       ": no answer within 500ms, gave up"))));
}

TEST_F(StoppingPartnerTest, AStalledFetchIsCutWhenTheNetworksClockPassesTheBaseDeadline) {
  ASSERT_NO_FATAL_FAILURE(Start(Stops::kBeforeTheHeader));
  base::FakeClock clock;
  GrpcPeerNetworkOptions no;
  no.node_id = "node-a";
  no.base_deadline = absl::Hours(1);  // on the real clock the fetch would wait that long
  no.clock = &clock;
  GrpcPeerNetwork net(no);
  absl::Status fetched;
  std::thread fetch([&] {
    std::vector<uint8_t> into;
    fetched = net.Fetch(address_, Key(1), "", SinkInto(&into)).status();
  });
  if (!Eventually([&] { return clock.waiters() == 1; })) {
    ADD_FAILURE() << "the fetch is not watched on the network's clock";
    Release();
  }
  clock.Advance(absl::Hours(1));
  fetch.join();
  EXPECT_THAT(fetched, StatusIs(absl::StatusCode::kUnavailable, HasSubstr(": no answer within 1h, gave up")));
}

TEST_F(StoppingPartnerTest, AStreamFetchTooSlowForItsSizeGivesUpAtTheDeadlineForThatSize) {
  // 8 MiB at 100 MB/s: 84 ms on top of the base. 1 KiB every 20 ms never
  // stalls, and would take minutes.
  ASSERT_NO_FATAL_FAILURE(Start(Stops::kTrickling, /*lane=*/false, /*drip=*/false, /*min_bytes_per_second=*/1e8));
  const absl::Duration allowed = kBase + absl::Seconds(kStoppedCopyBytes / 1e8);
  EXPECT_THAT(Fetch(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr(absl::StrCat("the copy of job job rank 0 step 1 from ", address_,
                                                    ": did not arrive within ", absl::FormatDuration(allowed), " (")),
                             HasSubstr(" of 8388608 bytes came), gave up"))));
}

TEST_F(StoppingPartnerTest, AStreamPutToAPartnerThatTakesNothingGivesUpAfterTheBaseDeadline) {
  ASSERT_NO_FATAL_FAILURE(Start(Stops::kTakingNothing));
  EXPECT_THAT(Put(uint64_t{1} << 30),  // the call's own deadline: 18 minutes
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr(absl::StrCat("the copy of job job rank 0 step 1 to ", address_,
                                                    ": the partner took no data for 500ms after ")),
                             HasSubstr(" of 1073741824 bytes, gave up"))));
  EXPECT_EQ(net_->stats().stream_puts, 1u);
}

TEST_F(StoppingPartnerTest, ALaneFetchFromAHolderThatDripsGivesUpAtTheDeadline) {
  // A byte every 20 ms never trips lane_io_timeout (30 s). (The stream is
  // not used.)
  ASSERT_NO_FATAL_FAILURE(Start(Stops::kBeforeTheHeader, /*lane=*/true, /*drip=*/true, /*min_bytes_per_second=*/1e8));
  const absl::Duration allowed = kBase + absl::Seconds(kStoppedCopyBytes / 1e8);
  EXPECT_THAT(Fetch(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr(absl::StrCat("the copy of job job rank 0 step 1 from ", address_,
                                                    ": did not arrive within ", absl::FormatDuration(allowed))),
                             HasSubstr("gave up"))));
  EXPECT_EQ(net_->stats().lane_fetches, 1u);
}

TEST_F(StoppingPartnerTest, ALanePutToAPartnerThatTakesNothingGivesUpAtTheDeadline) {
  // At the deadline for 64 MiB, sooner than lane_io_timeout (30 s). (The
  // stream is not used.)
  ASSERT_NO_FATAL_FAILURE(Start(Stops::kTakingNothing, /*lane=*/true, /*drip=*/false, /*min_bytes_per_second=*/1e8));
  const absl::Duration allowed = kBase + absl::Seconds(64 * kMiB / 1e8);
  EXPECT_THAT(Put(64 * kMiB), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                       HasSubstr(absl::StrCat("the copy of job job rank 0 step 1 to ", address_,
                                                              ": the partner did not take it within ",
                                                              absl::FormatDuration(allowed), ", gave up"))));
  EXPECT_EQ(net_->stats().lane_puts, 1u);
}

// ---- TLS ----

// A throw-away CA and a node's certificate (127.0.0.1, for server and
// client use, OU=ckptd-node) signed by it, and an operator's (client use
// only, OU=ckptd-operator), in `dir`. "" or openssl's complaint.
std::string MakeCertificates(const std::string& openssl, const std::string& dir) {
  const std::string o = absl::StrCat("'", openssl, "'");
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string script = absl::StrCat(
      "set -e; cd '", dir, "'\n", o, " req -x509 ", ec,
      " -keyout ca.key -out ca.pem -days 2 -subj /CN=ckptd-lane-test-ca"
      " -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign\n",
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' > node.ext\n", o,
      " req ", ec, " -keyout node.key -out node.csr -subj /CN=node-a/OU=ckptd-node\n", o,
      " x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem -days 2 -extfile node.ext\n",
      // An operator's: a client certificate of the same CA, no node's.
      "printf 'extendedKeyUsage=clientAuth\\n' > operator.ext\n", o, " req ", ec,
      " -keyout operator.key -out operator.csr -subj /CN=node-a/OU=ckptd-operator\n", o,
      " x509 -req -in operator.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out operator.pem -days 2",
      " -extfile operator.ext\n");
  std::ofstream(dir + "/make.sh") << script;
  const int rc = std::system(absl::StrCat("sh '", dir, "/make.sh' > '", dir, "/openssl.log' 2>&1").c_str());
  if (rc == 0) return "";
  std::ifstream log(dir + "/openssl.log");
  return absl::StrCat("openssl failed (", rc, "): ", std::string(std::istreambuf_iterator<char>(log), {}));
}

TEST(LaneTlsTest, WithTlsTheBytesStayOnTheGrpcStreams) {
  const std::string openssl = testing::FindOnPath("openssl");
  if (openssl.empty()) GTEST_SKIP() << "openssl is not on PATH (Debian package openssl)";
  testing::TempDir dir("ckptd-lane-tls-");
  ASSERT_EQ(MakeCertificates(openssl, dir.path()), "");
  const rpc::TlsFiles files{dir.Sub("node.pem"), dir.Sub("node.key"), dir.Sub("ca.pem")};
  CKPTD_ASSERT_OK_AND_ASSIGN(std::shared_ptr<grpc::ServerCredentials> server_creds,
                             rpc::ServerCredentialsFromFiles(files));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::shared_ptr<grpc::ChannelCredentials> channel_creds,
                             rpc::ChannelCredentialsFromFiles(files));

  ReplicaStore store({});
  PeerServiceOptions po;
  po.node_id = "node-b";
  po.tls = true;
  PeerService service(&store, po);
  google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner> senders;
  senders.Add()->set_node_id("node-a");
  senders.Mutable(0)->set_ticket(kTicket);
  service.SetSenders(senders);
  EXPECT_THAT(service.StartDataLane("127.0.0.1", 0).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("TLS")));
  int port = 0;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<PeerServer> server,
                             StartPeerServer("127.0.0.1:0", &service, server_creds, &port));
  const std::string address = absl::StrCat("127.0.0.1:", port);

  GrpcPeerNetworkOptions no;
  no.node_id = "node-a";
  no.credentials = channel_creds;
  GrpcPeerNetwork net(no);
  ASSERT_THAT(net.Put(address, Header(1, 9 * kMiB), FilledSource(0x17)), IsOk());
  std::vector<uint8_t> back;
  CKPTD_ASSERT_OK(net.Fetch(address, Key(1), "", SinkInto(&back)).status());
  EXPECT_EQ(back, std::vector<uint8_t>(9 * kMiB, 0x17));
  const PeerNetworkStats st = net.stats();
  EXPECT_EQ(st.stream_puts, 1u);
  EXPECT_EQ(st.stream_fetches, 1u);
  EXPECT_EQ(st.lane_puts + st.lane_fetches, 0u);
  EXPECT_EQ(service.lane_stats().opened, 0u);

  // A caller asking for a lane anyway is told there is none.
  auto stub = ckptd::v1::Peer::NewStub(grpc::CreateChannel(address, channel_creds));
  grpc::ClientContext ctx;
  ckptd::v1::DataLane lane;
  EXPECT_THAT(rpc::FromGrpcStatus(stub->OpenPut(&ctx, Header(2, 4096), &lane)),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("no data lane")));

  // A certificate of the same CA that is no node's (an operator's) fetches
  // nothing and places nothing.
  CKPTD_ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<grpc::ChannelCredentials> operator_creds,
      rpc::ChannelCredentialsFromFiles({dir.Sub("operator.pem"), dir.Sub("operator.key"), dir.Sub("ca.pem")}));
  GrpcPeerNetworkOptions oo;
  oo.node_id = "node-a";
  oo.credentials = operator_creds;
  GrpcPeerNetwork intruder(oo);
  std::vector<uint8_t> stolen;
  // A node's certificate fetches only as the node it names.
  GrpcPeerNetworkOptions other = no;
  other.node_id = "node-c";
  GrpcPeerNetwork impostor(other);
  EXPECT_THAT(impostor.Fetch(address, Key(1), "", SinkInto(&stolen)).status(),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("names node \"node-c\", which the client certificate does not name")));
  EXPECT_TRUE(stolen.empty());
  EXPECT_THAT(intruder.Fetch(address, Key(1), "", SinkInto(&stolen)).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("no node's: it has no OU=ckptd-node")));
  EXPECT_TRUE(stolen.empty());
  EXPECT_THAT(intruder.Put(address, Header(3, kMiB), FilledSource(0x66)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("no node's")));
  server->Shutdown();
}

}  // namespace
}  // namespace ckptd::replication
