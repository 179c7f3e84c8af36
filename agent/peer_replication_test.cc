// Peer replication: the copies an agent holds for partners (ReplicaStore),
// the Peer service over a real TCP socket and its client (credentials,
// tickets, hostile streams; each over the data lane and over the gRPC
// streams of a partner serving none), the sender (Replicator: partners, the
// slot taken back mid-copy, the bandwidth cap), and a restore that pulls a
// lost node's rank from a partner's memory and falls back to disk when the
// copy is bad. The data lane's own defences are in peer_lane_test.cc.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "agent/agent_core.h"
#include "agent/testing_agent_harness.h"
#include "base/clock.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "ckptd/v1/peer.grpc.pb.h"
#include "format/checksum.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "replication/peer_service.h"
#include "replication/replica_store.h"
#include "replication/replicator.h"
#include "replication/testing_peer_harness.h"
#include "staging/staging.h"
#include "storage/mem_file_system.h"
#include "storage/store.h"

namespace ckptd::agent {
namespace {

using ::ckptd::replication::FilledSource;
using ::ckptd::replication::GrpcPeerNetwork;
using ::ckptd::replication::GrpcPeerNetworkOptions;
using ::ckptd::replication::PeerGateStats;
using ::ckptd::replication::PeerLaneStats;
using ::ckptd::replication::PeerNetwork;
using ::ckptd::replication::PeerNetworkStats;
using ::ckptd::replication::PeerService;
using ::ckptd::replication::PeerServiceOptions;
using ::ckptd::replication::PieceSource;
using ::ckptd::replication::Replica;
using ::ckptd::replication::ReplicaSink;
using ::ckptd::replication::ReplicaSource;
using ::ckptd::replication::ReplicaStore;
using ::ckptd::replication::ReplicaStoreOptions;
using ::ckptd::replication::ReplicationStats;
using ::ckptd::replication::Replicator;
using ::ckptd::replication::ReplicatorOptions;
using ::ckptd::replication::PeerServer;
using ::ckptd::replication::StartPeerServer;
using ::ckptd::replication::kMaxReplicaIndexBytes;
using ::ckptd::replication::kReplicaPieceBytes;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr uint64_t kMiB = uint64_t{1} << 20;

ckptd::v1::ReplicaHeader Header(const std::string& job, uint32_t rank, uint64_t step, uint64_t bytes,
                                const std::string& from = "node-a") {
  ckptd::v1::ReplicaHeader h;
  h.mutable_key()->set_job(job);
  h.mutable_key()->set_rank(rank);
  h.mutable_key()->set_step(step);
  h.set_world_size(rank + 1);
  h.set_from_node(from);
  h.set_data_bytes(bytes);
  return h;
}

ckptd::v1::ReplicaKey Key(const std::string& job, uint32_t rank, uint64_t step) {
  ckptd::v1::ReplicaKey k;
  k.set_job(job);
  k.set_rank(rank);
  k.set_step(step);
  return k;
}

// Reserves and keeps a copy filled with `fill`.
void Hold(ReplicaStore& store, const ckptd::v1::ReplicaHeader& h, uint8_t fill = 1) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReplicaStore::Reservation> r, store.Reserve(h));
  std::memset(r->replica().data(), fill, r->replica().size());
  store.Keep(std::move(r));
}

// ---- ReplicaStore ----

TEST(ReplicaStoreTest, KeepsTheTwoNewestStepsOfEachRank) {
  ReplicaStore store({});
  for (uint64_t step : {10, 20, 30}) ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 0, step, 100)));
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 1, 10, 50)));
  EXPECT_EQ(store.Find(Key("j", 0, 10)), nullptr) << "the oldest step of rank 0 stays";
  EXPECT_NE(store.Find(Key("j", 0, 20)), nullptr);
  EXPECT_NE(store.Find(Key("j", 0, 30)), nullptr);
  EXPECT_NE(store.Find(Key("j", 1, 10)), nullptr);
  // Rank 0's step 10 is gone, its memory kept for the next copy of its size.
  EXPECT_EQ(store.bytes(), 350u);
  EXPECT_THAT(store.List(), SizeIs(3));
  for (const ckptd::v1::MemoryCopy& c : store.List()) EXPECT_EQ(c.owner_node(), "node-a");
}

TEST(ReplicaStoreTest, ADroppedCopysMemoryServesTheNextCopyOfItsSize) {
  ReplicaStore store({});
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 0, 1, 4096)));
  const uint8_t* first = store.Find(Key("j", 0, 1))->data();
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 0, 2, 4096)));
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 0, 3, 4096)));  // step 1 goes
  EXPECT_EQ(store.bytes(), 3 * 4096u);
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReplicaStore::Reservation> r, store.Reserve(Header("j", 0, 4, 4096)));
    EXPECT_EQ(r->replica().data(), first);
    EXPECT_EQ(store.bytes(), 3 * 4096u) << "spare memory taken is not counted twice";
    std::memset(r->replica().data(), 4, 4096);
    store.Keep(std::move(r));
  }
  EXPECT_EQ(store.bytes(), 3 * 4096u);  // step 2's memory is spare now
  // A copy still being read (a fetch under way) is not reused under its reader.
  std::shared_ptr<const Replica> reading = store.Find(Key("j", 0, 3));
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 0, 5, 4096)));  // takes step 2's memory
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 0, 6, 4096)));  // step 3 goes, still read
  EXPECT_EQ(reading->data()[0], 1);
  EXPECT_EQ(store.bytes(), 2 * 4096u + 4096u + 4096u) << "step 4's memory spare, step 3's with its reader";
  EXPECT_EQ(store.pinned_bytes(), 4096u);
  reading.reset();
  EXPECT_EQ(store.bytes(), 2 * 4096u + 4096u) << "step 3's memory went with its reader";
  EXPECT_EQ(store.pinned_bytes(), 0u);
  EXPECT_EQ(store.Shed(1), 4096u) << "spare memory goes first";
  EXPECT_NE(store.Find(Key("j", 0, 5)), nullptr);
}

TEST(ReplicaStoreTest, TheBudgetCountsOwnStagingAndOlderStepsGoFirst) {
  uint64_t staging = 600;
  ReplicaStoreOptions o;
  o.budget_bytes = 1000;
  o.staging_bytes = [&] { return staging; };
  ReplicaStore store(o);
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 0, 10, 100)));
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 1, 10, 100)));
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 0, 20, 100)));
  // 300 held + 600 staging: a 200-byte copy needs 100 more; rank 0's step 10
  // (superseded by step 20) goes, although rank 1's copy is older.
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 2, 10, 200)));
  EXPECT_EQ(store.Find(Key("j", 0, 10)), nullptr);
  EXPECT_NE(store.Find(Key("j", 1, 10)), nullptr);
  EXPECT_NE(store.Find(Key("j", 0, 20)), nullptr);
  EXPECT_EQ(store.bytes(), 400u);
  // More than the budget leaves over after staging: refused at once.
  staging = 950;
  EXPECT_THAT(store.Reserve(Header("j", 3, 10, 100)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("own trainers' staging")));
}

TEST(ReplicaStoreTest, AnOlderCopyNeverPushesOutTheNewest) {
  ReplicaStoreOptions o;
  o.budget_bytes = 1000;
  ReplicaStore store(o);
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 0, 30, 900)));
  EXPECT_THAT(store.Reserve(Header("j", 0, 20, 900)).status(), StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
  EXPECT_NE(store.Find(Key("j", 0, 30)), nullptr);
  // A newer one may replace it.
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 0, 40, 900)));
  EXPECT_EQ(store.Find(Key("j", 0, 30)), nullptr);
  EXPECT_EQ(store.bytes(), 900u);
}

TEST(ReplicaStoreTest, ACopyIsReplacedOnlyByTheNodeThatSentIt) {
  ReplicaStore store({});
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 0, 4, 100, "node-a"), 1));
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 0, 5, 100, "node-a"), 1));
  // Another partner of this node puts the key of a rank node A sends.
  EXPECT_THAT(store.Reserve(Header("j", 0, 5, 100, "node-d")).status(),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("the copy of job j rank 0 step 5 is held here for node node-a: node node-d may not "
                                 "replace it")));
  // Nor do its newer steps of the rank push node A's two out.
  for (uint64_t step : {6, 7, 8}) ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 0, step, 100, "node-d"), 9));
  for (uint64_t step : {4, 5}) {
    std::shared_ptr<const Replica> held = store.Find(Key("j", 0, step));
    ASSERT_NE(held, nullptr) << step;
    EXPECT_EQ(held->header().from_node(), "node-a");
    EXPECT_EQ(held->data()[0], 1);
  }
  EXPECT_EQ(store.Find(Key("j", 0, 6)), nullptr) << "node D's own older step goes";
  EXPECT_NE(store.Find(Key("j", 0, 8)), nullptr);
  EXPECT_THAT(store.Reserve(Header("j", 0, 8, 100, "node-a")).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("held here for node node-d: node node-a")));
  // Node A replaces its own.
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 0, 5, 100, "node-a"), 2));
  EXPECT_EQ(store.Find(Key("j", 0, 5))->data()[0], 2);
  // A copy still being received is its sender's too.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReplicaStore::Reservation> coming,
                             store.Reserve(Header("j", 1, 1, 100, "node-a")));
  EXPECT_THAT(store.Reserve(Header("j", 1, 1, 100, "node-d")).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("being received here for node node-a")));
  coming.reset();  // never came whole: the key is free
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 1, 1, 100, "node-d")));
  EXPECT_EQ(store.bytes(), 5 * 100u) << "node A's two, node D's three";
}

TEST(ReplicaStoreTest, ASenderFloodingTheStoreCannotPushOutAnotherSendersCopies) {
  base::FakeClock clock;  // each copy received a second after the one before
  ReplicaStoreOptions o;
  o.budget_bytes = 1000;
  o.clock = &clock;
  ReplicaStore store(o);
  auto hold = [&](const ckptd::v1::ReplicaHeader& h) {
    clock.Advance(absl::Seconds(1));
    Hold(store, h);
  };
  auto held_for = [&](const std::string& node) {
    uint64_t bytes = 0;
    for (const ckptd::v1::MemoryCopy& c : store.List()) {
      if (c.owner_node() == node) bytes += store.Find(Key(c.job(), c.rank(), c.step()))->size();
    }
    return bytes;
  };
  // Node D fills the budget with copies of jobs nobody runs.
  for (int i = 0; i < 5; ++i) ASSERT_NO_FATAL_FAILURE(hold(Header(absl::StrCat("junk", i), 0, 1, 200, "node-d")));
  // Node A, holding less, takes the room its copy needs from node D.
  ASSERT_NO_FATAL_FAILURE(hold(Header("j", 0, 1, 300, "node-a")));
  EXPECT_EQ(held_for("node-d"), 600u);
  // Node D's next copies push out only its own, older ones.
  for (int i = 5; i < 25; ++i) ASSERT_NO_FATAL_FAILURE(hold(Header(absl::StrCat("junk", i), 0, 1, 200, "node-d")));
  EXPECT_NE(store.Find(Key("j", 0, 1)), nullptr);
  EXPECT_EQ(held_for("node-d"), 600u);
  EXPECT_EQ(store.Find(Key("junk21", 0, 1)), nullptr);
  EXPECT_NE(store.Find(Key("junk22", 0, 1)), nullptr);
  // Node A still gets room from node D while node D holds more.
  ASSERT_NO_FATAL_FAILURE(hold(Header("j", 1, 1, 200, "node-a")));
  EXPECT_EQ(held_for("node-a"), 500u);
  EXPECT_EQ(held_for("node-d"), 400u);
  EXPECT_EQ(store.bytes(), 900u);
  // A copy that fits only if node A's are pushed out is refused, naming the
  // rule.
  EXPECT_THAT(store.Reserve(Header("big", 0, 1, 1000, "node-d")).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("may push out only its own copies")));
  EXPECT_EQ(held_for("node-a"), 500u);
}

TEST(ReplicaStoreTest, ACopyBeingFetchedStaysCountedUntilTheFetchLetsGo) {
  ReplicaStoreOptions o;
  o.budget_bytes = 1000;
  ReplicaStore store(o);
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 0, 1, 600)));
  std::shared_ptr<const Replica> fetching = store.Find(Key("j", 0, 1));
  // A put does not push it out: that would free nothing.
  EXPECT_THAT(store.Reserve(Header("j", 1, 1, 600)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
  EXPECT_NE(store.Find(Key("j", 0, 1)), nullptr);
  // The agent's own trainers take it; its memory counts until the fetch ends.
  EXPECT_EQ(store.Shed(600), 600u);
  EXPECT_EQ(store.Find(Key("j", 0, 1)), nullptr);
  EXPECT_EQ(store.bytes(), 600u);
  EXPECT_EQ(store.pinned_bytes(), 600u);
  EXPECT_THAT(store.Reserve(Header("j", 1, 1, 600)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("still being sent to fetching nodes")));
  fetching.reset();
  EXPECT_EQ(store.bytes(), 0u);
  EXPECT_EQ(store.pinned_bytes(), 0u);
  ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", 1, 1, 600)));
}

TEST(ReplicaStoreTest, AReservationDroppedUnkeptFreesItsMemory) {
  ReplicaStore store({});
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReplicaStore::Reservation> r, store.Reserve(Header("j", 0, 1, 4096)));
    EXPECT_EQ(store.bytes(), 4096u);
    EXPECT_EQ(store.Find(Key("j", 0, 1)), nullptr) << "visible before every byte arrived";
  }
  EXPECT_EQ(store.bytes(), 0u);
  EXPECT_THAT(store.List(), IsEmpty());
}

TEST(ReplicaStoreTest, ShedMakesRoomForTheAgentsOwnTrainers) {
  ReplicaStore store({});
  for (uint32_t rank = 0; rank < 4; ++rank) ASSERT_NO_FATAL_FAILURE(Hold(store, Header("j", rank, 1, 100)));
  EXPECT_EQ(store.Shed(150), 200u);
  EXPECT_EQ(store.bytes(), 200u);
  EXPECT_EQ(store.Shed(10'000), 200u);
  EXPECT_THAT(store.List(), IsEmpty());
}

TEST(ReplicaStoreTest, ACopyNoMachineCouldHoldIsRefusedNotACrash) {
  ReplicaStore store({});  // no budget
  EXPECT_THAT(store.Reserve(Header("j", 0, 1, uint64_t{1} << 62)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("cannot allocate")));
  EXPECT_EQ(store.bytes(), 0u);
}

TEST(ReplicaStoreTest, RefusesHeadersThatNameNothingValid) {
  ReplicaStore store({});
  EXPECT_THAT(store.Reserve(Header("../etc", 0, 1, 10)).status(), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(store.Reserve(Header("j", 0, 1, 10, "")).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("from_node")));
  ckptd::v1::ReplicaHeader h = Header("j", 3, 1, 10);
  h.set_world_size(2);
  EXPECT_THAT(store.Reserve(h).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world size")));
  h = Header("j", 0, 1, 10);
  h.mutable_index()->resize(kMaxReplicaIndexBytes + 1);
  EXPECT_THAT(store.Reserve(h).status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("index")));
  EXPECT_EQ(store.bytes(), 0u);
}

// ---- The Peer service over TCP ----

constexpr char kToken[] = "agent-token-0123456789";
constexpr char kTicket[] = "0123456789abcdef0123456789abcdef";

ckptd::v1::ReplicationPartner Partner(const std::string& node, const std::string& address, const std::string& ticket) {
  ckptd::v1::ReplicationPartner p;
  p.set_node_id(node);
  p.set_address(address);
  p.set_ticket(ticket);
  return p;
}

// A partner node: its copies, its Peer service on 127.0.0.1 (with a data
// lane when `lane`), taking copies from node-a with kTicket.
struct PartnerNode {
  explicit PartnerNode(uint64_t budget = 0, std::string token = kToken, bool lane = true) {
    ReplicaStoreOptions so;
    so.budget_bytes = budget;
    store = std::make_unique<ReplicaStore>(so);
    PeerServiceOptions po;
    po.node_id = "node-b";
    po.agent_token = std::move(token);
    service = std::make_unique<PeerService>(store.get(), po);
    google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner> senders;
    *senders.Add() = Partner("node-a", "", kTicket);
    service->SetSenders(senders);
    int port = 0;
    absl::StatusOr<std::unique_ptr<PeerServer>> s = StartPeerServer("127.0.0.1:0", service.get(), nullptr, &port);
    EXPECT_THAT(s.status(), IsOk());
    if (s.ok()) server = *std::move(s);
    address = absl::StrCat("127.0.0.1:", port);
    if (lane) {
      EXPECT_THAT(service->StartDataLane("127.0.0.1", 0).status(), IsOk());
    }
  }
  ~PartnerNode() {
    if (server != nullptr) server->Shutdown();
  }
  std::unique_ptr<ReplicaStore> store;
  std::unique_ptr<PeerService> service;
  std::unique_ptr<PeerServer> server;
  std::string address;
};

GrpcPeerNetworkOptions NetworkOptions(std::string token = kToken) {
  GrpcPeerNetworkOptions o;
  o.node_id = "node-a";
  o.agent_token = std::move(token);
  return o;
}

// Byte i of a test copy.
uint8_t Pattern(uint64_t i) { return static_cast<uint8_t>((i * 131) >> 3); }

// A copy of `bytes` bytes of Pattern.
PieceSource PatternSource(uint64_t bytes) {
  auto data = std::make_shared<std::vector<uint8_t>>(bytes);
  for (uint64_t i = 0; i < bytes; ++i) (*data)[i] = Pattern(i);
  PieceSource s;
  s.piece = [data](uint64_t offset, uint64_t length) {
    return absl::StatusOr<absl::Span<const uint8_t>>(absl::Span<const uint8_t>(data->data() + offset, length));
  };
  return s;
}

// Each test runs against a partner serving the data lane, and against one
// serving none, whose copies go over the gRPC streams.
class PeerServiceTest : public ::testing::TestWithParam<bool> {
 protected:
  bool lane() const { return GetParam(); }
  // The calls of `net` went over the path the partner serves.
  void ExpectPath(const GrpcPeerNetwork& net) {
    const PeerNetworkStats st = net.stats();
    EXPECT_EQ(st.lane_puts + st.lane_fetches == 0, !lane());
    EXPECT_EQ(st.stream_puts + st.stream_fetches == 0, lane());
  }
};
std::string PathName(const ::testing::TestParamInfo<bool>& param) {
  return param.param ? "DataLane" : "GrpcStream";
}
INSTANTIATE_TEST_SUITE_P(Paths, PeerServiceTest, ::testing::Bool(), PathName);

TEST_P(PeerServiceTest, ACopySentIsFetchedBackByteForByte) {
  PartnerNode b(0, kToken, lane());
  GrpcPeerNetwork net(NetworkOptions());
  const uint64_t bytes = 10 * kMiB + 123;  // three pieces
  ckptd::v1::ReplicaHeader h = Header("job", 0, 7, bytes);
  h.set_ticket(kTicket);
  h.set_index("index bytes");
  ASSERT_THAT(net.Put(b.address, h, PatternSource(bytes)), IsOk());
  std::shared_ptr<const Replica> held = b.store->Find(Key("job", 0, 7));
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->header().ticket(), "") << "the ticket is not kept";
  std::vector<uint8_t> back(bytes);
  absl::StatusOr<ckptd::v1::ReplicaHeader> got =
      net.Fetch(b.address, Key("job", 0, 7), "", [&](const ckptd::v1::ReplicaHeader& header) {
        return absl::StatusOr<absl::Span<uint8_t>>(absl::Span<uint8_t>(back.data(), header.data_bytes()));
      });
  ASSERT_THAT(got.status(), IsOk());
  EXPECT_EQ(got->index(), "index bytes");
  EXPECT_EQ(got->from_node(), "node-a");
  uint64_t wrong = 0;
  for (uint64_t i = 0; i < bytes; ++i) wrong += back[i] != Pattern(i);
  EXPECT_EQ(wrong, 0u);
  EXPECT_THAT(net.Fetch(b.address, Key("job", 0, 8), "", [&](const ckptd::v1::ReplicaHeader&) {
    return absl::StatusOr<absl::Span<uint8_t>>(absl::Span<uint8_t>());
  }).status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("holds no copy")));
  ExpectPath(net);
  if (lane()) {
    EXPECT_TRUE(::ckptd::testing::Eventually([&] {
      const PeerLaneStats st = b.service->lane_stats();
      return st.kept == 1 && st.sent == 1;
    }));
  }
}

TEST_P(PeerServiceTest, OnlyAPartnerWithItsTicketPlacesACopy) {
  PartnerNode b(0, kToken, lane());
  GrpcPeerNetwork net(NetworkOptions());
  ckptd::v1::ReplicaHeader h = Header("job", 0, 7, 1000);
  h.set_ticket("ffffffffffffffffffffffffffffffff");
  EXPECT_THAT(net.Put(b.address, h, PatternSource(1000)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("ticket")));
  h.set_ticket(kTicket);
  h.set_from_node("node-z");  // speaks for another node with node-a's ticket
  EXPECT_THAT(net.Put(b.address, h, PatternSource(1000)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("not a partner")));
  EXPECT_THAT(b.store->List(), IsEmpty());
  EXPECT_EQ(b.store->bytes(), 0u);
  EXPECT_EQ(b.service->lane_stats().opened, 0u);
}

TEST_P(PeerServiceTest, APartnerCannotReplaceAnotherPartnersCopy) {
  PartnerNode b(0, kToken, lane());
  constexpr char kTicketD[] = "ddddddddddddddddddddddddddddddd0";
  google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner> senders;
  *senders.Add() = Partner("node-a", "", kTicket);
  *senders.Add() = Partner("node-d", "", kTicketD);
  b.service->SetSenders(senders);
  GrpcPeerNetwork a(NetworkOptions());
  ckptd::v1::ReplicaHeader h = Header("job", 0, 7, 1000);
  h.set_ticket(kTicket);
  ASSERT_THAT(a.Put(b.address, h, PatternSource(1000)), IsOk());
  // Node D, a partner of node B with a ticket of its own, puts the key of a
  // rank node A hosts.
  GrpcPeerNetworkOptions od = NetworkOptions();
  od.node_id = "node-d";
  GrpcPeerNetwork d(od);
  ckptd::v1::ReplicaHeader hd = Header("job", 0, 7, 1000, "node-d");
  hd.set_ticket(kTicketD);
  EXPECT_THAT(d.Put(b.address, hd, FilledSource(0xee)),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("held here for node node-a: node node-d may not replace it")));
  // Nor do its newer steps of the rank push node A's copy out.
  for (uint64_t step : {8, 9, 10}) {
    hd.mutable_key()->set_step(step);
    ASSERT_THAT(d.Put(b.address, hd, FilledSource(0xee)), IsOk());
  }
  std::shared_ptr<const Replica> held = b.store->Find(Key("job", 0, 7));
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->header().from_node(), "node-a");
  EXPECT_EQ(held->data()[999], Pattern(999));
  ExpectPath(d);
}

TEST_P(PeerServiceTest, EveryCallNeedsTheAgentToken) {
  PartnerNode b(0, kToken, lane());
  ckptd::v1::ReplicaHeader h = Header("job", 0, 7, 1000);
  h.set_ticket(kTicket);
  // Without TLS the token is proven before gRPC reads a byte (peer_gate.h):
  // an agent without one speaks gRPC at once and is closed, one with
  // another token is answered 403.
  GrpcPeerNetwork none(NetworkOptions(""));
  EXPECT_THAT(none.Put(b.address, h, PatternSource(1000)), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  GrpcPeerNetwork wrong(NetworkOptions("not-the-token"));
  EXPECT_THAT(wrong.Put(b.address, h, PatternSource(1000)),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::HasSubstr("refused this agent's token")));
  GrpcPeerNetwork right(NetworkOptions());
  ASSERT_THAT(right.Put(b.address, h, PatternSource(1000)), IsOk());
  auto sink = [](const ckptd::v1::ReplicaHeader&) {
    return absl::StatusOr<absl::Span<uint8_t>>(absl::InternalError("must not be reached"));
  };
  EXPECT_THAT(none.Fetch(b.address, Key("job", 0, 7), "", sink).status(),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_THAT(wrong.Fetch(b.address, Key("job", 0, 7), "", sink).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::HasSubstr("refused this agent's token")));
  EXPECT_EQ(b.service->lane_stats().opened, lane() ? 1u : 0u) << "only the call with the token";
  const PeerGateStats gate = b.server->gate_stats();
  EXPECT_EQ(gate.admitted, 1u) << "one connection, for every call of `right`";
  EXPECT_GE(gate.refused, 1u) << "`wrong`'s connection";
  EXPECT_GE(gate.malformed, 1u) << "`none`'s connection";
}

TEST_P(PeerServiceTest, ACopyCutShortIsNotKept) {
  PartnerNode b(0, kToken, lane());
  GrpcPeerNetwork net(NetworkOptions());
  ckptd::v1::ReplicaHeader h = Header("job", 0, 7, 9 * kMiB);
  h.set_ticket(kTicket);
  // The first piece goes out; after it, the source says its bytes changed.
  PieceSource fails_late = FilledSource(1);
  int checks = 0;
  fails_late.still_valid = [&] {
    return ++checks < 2 ? absl::OkStatus() : absl::AbortedError("the trainer took the slot back");
  };
  EXPECT_THAT(net.Put(b.address, h, fails_late), StatusIs(absl::StatusCode::kAborted, ::testing::_));
  EXPECT_EQ(checks, 2);
  // The partner notices the cancelled stream; nothing stays reserved.
  for (int i = 0; i < 500 && b.store->bytes() != 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(b.store->bytes(), 0u);
  EXPECT_EQ(b.store->Find(Key("job", 0, 7)), nullptr);
  ExpectPath(net);
}

// Raw streams a well-behaved sender never sends.
class HostileStreamTest : public ::testing::Test {
 protected:
  grpc::Status Send(const std::vector<ckptd::v1::ReplicaPiece>& pieces) {
    grpc::ChannelArguments args;
    ::ckptd::replication::PeerGateChannelArguments(b_.address, kToken, &args);
    auto stub =
        ckptd::v1::Peer::NewStub(grpc::CreateCustomChannel(b_.address, grpc::InsecureChannelCredentials(), args));
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    ckptd::v1::PutReplicaResponse response;
    auto writer = stub->PutReplica(&ctx, &response);
    for (const ckptd::v1::ReplicaPiece& p : pieces) {
      if (!writer->Write(p)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }
  static ckptd::v1::ReplicaPiece Piece(uint64_t offset, size_t n, bool header = false, uint64_t total = 100) {
    ckptd::v1::ReplicaPiece p;
    if (header) {
      *p.mutable_header() = Header("job", 0, 1, total);
      p.mutable_header()->set_ticket(kTicket);
    }
    p.set_offset(offset);
    p.mutable_data()->assign(n, 'x');
    return p;
  }
  void ExpectRefused(const std::vector<ckptd::v1::ReplicaPiece>& pieces, absl::string_view why) {
    grpc::Status s = Send(pieces);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(why));
    EXPECT_THAT(b_.store->List(), IsEmpty());
    EXPECT_EQ(b_.store->bytes(), 0u);
  }
  PartnerNode b_;
};

TEST_F(HostileStreamTest, NoHeaderFirst) { ExpectRefused({Piece(0, 100)}, "no header"); }
TEST_F(HostileStreamTest, PiecesOutOfOrder) { ExpectRefused({Piece(0, 40, true), Piece(50, 50)}, "expected"); }
TEST_F(HostileStreamTest, PiecesPastTheEnd) { ExpectRefused({Piece(0, 60, true), Piece(60, 60)}, "runs past"); }
TEST_F(HostileStreamTest, ASecondHeader) { ExpectRefused({Piece(0, 50, true), Piece(50, 50, true)}, "second header"); }
TEST_F(HostileStreamTest, TooFewBytes) { ExpectRefused({Piece(0, 60, true)}, "ended after 60"); }
TEST_F(HostileStreamTest, NothingAtAll) { ExpectRefused({}, "before the header"); }

TEST_P(PeerServiceTest, ACopyAboveTheBudgetIsRefusedAtOnce) {
  PartnerNode b(/*budget=*/64 * kMiB, kToken, lane());
  GrpcPeerNetwork net(NetworkOptions());
  ckptd::v1::ReplicaHeader h = Header("job", 0, 7, uint64_t{1} << 40);
  h.set_ticket(kTicket);
  int pieces = 0;
  PieceSource count = FilledSource(0);
  count.still_valid = [&] {
    ++pieces;
    return absl::OkStatus();
  };
  const absl::Time start = absl::Now();
  EXPECT_THAT(net.Put(b.address, h, count), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("budget")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(60)) << "the sender is stopped, not drained";
  EXPECT_EQ(b.store->bytes(), 0u);
  if (lane()) {
    EXPECT_EQ(pieces, 0) << "refused before a byte is sent";
  }
}

// ---- The sender ----

// A network that records what was sent (reading every piece, then asking
// whether it was still valid, as the data lane does after each send).
class RecordingNetwork : public PeerNetwork {
 public:
  absl::Status Put(const std::string& address, const ckptd::v1::ReplicaHeader& header,
                   const PieceSource& source) override {
    if (refuse && refuse(address)) return absl::UnavailableError(absl::StrCat(address, " is down"));
    std::string data(header.data_bytes(), '\0');
    for (uint64_t off = 0; off < data.size(); off += kReplicaPieceBytes) {
      if (before_piece) before_piece(off);
      const uint64_t n = std::min<uint64_t>(kReplicaPieceBytes, data.size() - off);
      CKPTD_ASSIGN_OR_RETURN(const absl::Span<const uint8_t> piece, source.piece(off, n));
      if (piece.size() != n) return absl::InternalError("a piece of the wrong size");
      std::memcpy(data.data() + off, piece.data(), n);
      if (source.still_valid) CKPTD_RETURN_IF_ERROR(source.still_valid());
    }
    absl::MutexLock l(&mu);
    sent.push_back({address, header, std::move(data)});
    return absl::OkStatus();
  }
  absl::StatusOr<ckptd::v1::ReplicaHeader> Fetch(const std::string&, const ckptd::v1::ReplicaKey&, const std::string&,
                                                 const ReplicaSink&) override {
    return absl::UnimplementedError("not here");
  }
  struct Sent {
    std::string address;
    ckptd::v1::ReplicaHeader header;
    std::string data;
  };
  std::function<void(uint64_t)> before_piece;
  // Partners (by address) that cannot be reached; set before the sending starts.
  std::function<bool(const std::string& address)> refuse;
  absl::Mutex mu;
  std::vector<Sent> sent;
};

// A clock that jumps to every deadline slept until, and records them.
class JumpClock : public base::Clock {
 public:
  absl::Time Now() override {
    absl::MutexLock l(&mu_);
    return now_;
  }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time) override {
    return mu->AwaitWithTimeout(cond, absl::Seconds(30));
  }
  void SleepUntil(absl::Time deadline) override {
    absl::MutexLock l(&mu_);
    sleeps_.push_back(deadline - start_);
    now_ = std::max(now_, deadline);
  }
  std::vector<absl::Duration> sleeps() {
    absl::MutexLock l(&mu_);
    return sleeps_;
  }

 private:
  absl::Mutex mu_;
  const absl::Time start_ = absl::FromUnixSeconds(1'800'000'000);
  absl::Time now_ = start_;
  std::vector<absl::Duration> sleeps_;
};

// A segment of 2 slots, slot 0 KEPT with `step` (filled with `fill`).
std::shared_ptr<staging::StagingSegment> KeptSegment(uint64_t slot_bytes, uint64_t step, uint8_t fill) {
  static int n = 0;
  absl::StatusOr<std::unique_ptr<staging::StagingSegment>> seg = staging::StagingSegment::Create(
      absl::StrCat("/ckptd-test-repl-", ::getpid(), "-", n++), 2, slot_bytes);
  EXPECT_THAT(seg.status(), IsOk());
  if (!seg.ok()) return nullptr;
  std::shared_ptr<staging::StagingSegment> s = *std::move(seg);
  absl::StatusOr<uint32_t> slot = s->AcquireForFill(absl::ZeroDuration());
  EXPECT_THAT(slot.status(), IsOk());
  std::memset(s->slot_data(*slot), fill, slot_bytes);
  EXPECT_THAT(s->Publish(*slot, step), IsOk());
  EXPECT_EQ(s->TakeReady(), std::optional<uint32_t>(*slot));
  EXPECT_THAT(s->Keep(*slot), IsOk());
  return s;
}

ReplicaSource Source(std::shared_ptr<staging::StagingSegment> seg, uint32_t rank, uint64_t step) {
  ReplicaSource s;
  s.header = Header("job", rank, step, seg->slot_bytes());
  s.segment = std::move(seg);
  s.slot = 0;
  return s;
}

google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner> Partners(int n) {
  google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner> out;
  for (int i = 0; i < n; ++i) *out.Add() = Partner(absl::StrCat("node-", i), absl::StrCat("host", i, ":1"), "t");
  return out;
}

TEST(ReplicatorTest, EachKeptStepGoesToEveryPartnerWithItsTicket) {
  RecordingNetwork net;
  Replicator r(&net, {});
  EXPECT_FALSE(r.has_partners());
  r.SetPartners(Partners(2));
  ASSERT_TRUE(r.has_partners());
  std::shared_ptr<staging::StagingSegment> seg = KeptSegment(5 * kMiB, 40, 0x5a);
  r.Submit(Source(seg, 3, 40));
  ASSERT_TRUE(r.WaitIdle(absl::Seconds(30)));
  absl::MutexLock l(&net.mu);
  ASSERT_THAT(net.sent, SizeIs(2));
  EXPECT_EQ(net.sent[0].address, "host0:1");
  EXPECT_EQ(net.sent[1].address, "host1:1");
  for (const auto& s : net.sent) {
    EXPECT_EQ(s.header.ticket(), "t");
    EXPECT_EQ(s.header.key().rank(), 3u);
    EXPECT_EQ(s.data, std::string(5 * kMiB, '\x5a'));
  }
  EXPECT_EQ(r.Stats().sent, 2u);
  EXPECT_EQ(r.Stats().bytes, 10 * kMiB);
}

TEST(ReplicatorTest, ACopyIsAbandonedWhenTheTrainerTakesTheSlotBack) {
  RecordingNetwork net;
  std::shared_ptr<staging::StagingSegment> seg = KeptSegment(9 * kMiB, 40, 1);
  // Between the first and second piece the trainer snapshots twice: the
  // free slot, then (none free) the KEPT one.
  net.before_piece = [&](uint64_t offset) {
    if (offset != kReplicaPieceBytes) return;
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<uint32_t> slot = seg->AcquireForFill(absl::ZeroDuration());
      ASSERT_THAT(slot.status(), IsOk());
    }
    EXPECT_NE(seg->state(0), staging::SlotState::kKept);
  };
  Replicator r(&net, {});
  r.SetPartners(Partners(2));
  r.Submit(Source(seg, 0, 40));
  ASSERT_TRUE(r.WaitIdle(absl::Seconds(30)));
  EXPECT_THAT(net.sent, IsEmpty());
  const ReplicationStats st = r.Stats();
  EXPECT_EQ(st.abandoned, 1u);
  EXPECT_EQ(st.failed, 0u);
  EXPECT_EQ(st.sent, 0u) << "no partner gets a copy the slot no longer holds";
}

TEST(ReplicatorTest, TheLagIsTheStepsEveryPartnerHasNotTaken) {
  RecordingNetwork net;
  std::atomic<bool> host1_down{false};
  net.refuse = [&](const std::string& address) { return host1_down.load() && address == "host1:1"; };
  Replicator r(&net, {});
  r.SetPartners(Partners(2));
  EXPECT_THAT(r.LagSteps(), IsEmpty());  // nothing sent yet
  r.Submit(Source(KeptSegment(kMiB, 10, 1), 0, 10));
  ASSERT_TRUE(r.WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(r.LagSteps(), (std::map<std::string, uint64_t>{{"job", 0}}));
  // One partner is down: step 20 of rank 0 reaches only the other, and rank
  // 1's first step no partner has in full.
  host1_down = true;
  r.Submit(Source(KeptSegment(kMiB, 20, 2), 0, 20));
  ASSERT_TRUE(r.WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(r.LagSteps(), (std::map<std::string, uint64_t>{{"job", 10}}));
  r.Submit(Source(KeptSegment(kMiB, 20, 2), 1, 20));
  ASSERT_TRUE(r.WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(r.LagSteps(), (std::map<std::string, uint64_t>{{"job", 20}}));
  EXPECT_EQ(r.Stats().failed, 2u);
  // Back: both ranks' next steps reach every partner.
  host1_down = false;
  r.Submit(Source(KeptSegment(kMiB, 30, 3), 0, 30));
  r.Submit(Source(KeptSegment(kMiB, 30, 3), 1, 30));
  ASSERT_TRUE(r.WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(r.LagSteps(), (std::map<std::string, uint64_t>{{"job", 0}}));
}

TEST(ReplicatorTest, ANewerStepOfTheRankReplacesOneStillQueued) {
  RecordingNetwork net;
  absl::Notification release;
  std::shared_ptr<staging::StagingSegment> busy = KeptSegment(kMiB, 1, 1);
  net.before_piece = [&](uint64_t) { release.WaitForNotification(); };
  Replicator r(&net, {});
  r.SetPartners(Partners(1));
  r.Submit(Source(busy, 9, 1));  // being sent, held at its first piece
  absl::SleepFor(absl::Milliseconds(50));
  r.Submit(Source(KeptSegment(kMiB, 10, 2), 0, 10));
  r.Submit(Source(KeptSegment(kMiB, 20, 3), 0, 20));
  release.Notify();
  ASSERT_TRUE(r.WaitIdle(absl::Seconds(30)));
  absl::MutexLock l(&net.mu);
  ASSERT_THAT(net.sent, SizeIs(2));
  EXPECT_EQ(net.sent[1].header.key().step(), 20u);
  EXPECT_EQ(r.Stats().superseded, 1u);
}

TEST(ReplicatorTest, ARoundIsTimedFromItsFirstCopyQueuedToItsLastSent) {
  RecordingNetwork net;
  JumpClock clock;
  absl::Notification release;
  net.before_piece = [&](uint64_t) { release.WaitForNotification(); };
  ReplicatorOptions o;
  o.max_bytes_per_second = 1e6;
  o.clock = &clock;
  Replicator r(&net, o);
  r.SetPartners(Partners(1));
  EXPECT_EQ(r.Stats().last_round_seconds, 0);
  // Two ranks' copies of one checkpoint, 10 MiB each: the cap holds each
  // one's last piece (at 8 MiB) back 8.39 s, one after the other.
  r.Submit(Source(KeptSegment(10 * kMiB, 1, 1), 0, 1));
  r.Submit(Source(KeptSegment(10 * kMiB, 1, 2), 1, 1));
  release.Notify();
  ASSERT_TRUE(r.WaitIdle(absl::Seconds(30)));
  const double one = 8.0 * kMiB / 1e6;
  ReplicationStats st = r.Stats();
  ASSERT_EQ(st.sent, 2u);
  EXPECT_NEAR(st.last_seconds, one, 1e-6);
  EXPECT_NEAR(st.last_round_seconds, 2 * one, 1e-6);
  // The next checkpoint is a round of its own.
  r.Submit(Source(KeptSegment(10 * kMiB, 2, 3), 0, 2));
  ASSERT_TRUE(r.WaitIdle(absl::Seconds(30)));
  st = r.Stats();
  ASSERT_EQ(st.sent, 3u);
  EXPECT_NEAR(st.last_round_seconds, one, 1e-6);
}

TEST(ReplicatorTest, SendingKeepsToTheBandwidthCap) {
  RecordingNetwork net;
  JumpClock clock;
  ReplicatorOptions o;
  o.max_bytes_per_second = 1e6;
  o.clock = &clock;
  Replicator r(&net, o);
  r.SetPartners(Partners(1));
  r.Submit(Source(KeptSegment(10 * kMiB, 1, 1), 0, 1));
  ASSERT_TRUE(r.WaitIdle(absl::Seconds(30)));
  ASSERT_EQ(r.Stats().sent, 1u);
  // Pieces at 0, 4 MiB and 8 MiB wait until their bytes fit under 1 MB/s.
  const std::vector<absl::Duration> sleeps = clock.sleeps();
  ASSERT_THAT(sleeps, SizeIs(3));
  EXPECT_EQ(sleeps[1], absl::Seconds(4 * kMiB / 1e6));
  EXPECT_EQ(sleeps[2], absl::Seconds(8 * kMiB / 1e6));
}

// ---- Restore from a partner's memory ----

// A coordinator for one rank of a one-rank job: it records shard reports and
// answers a restore with LOAD `step` naming `peers`, then GO.
class PlanningCoordinator : public CoordinatorClient {
 public:
  void ShardDurable(const ckptd::v1::ShardReport& report) override {
    absl::MutexLock l(&mu_);
    reports_.push_back(report.shard());
  }
  void Failure(const ckptd::v1::ReportFailureRequest&) override {}
  absl::StatusOr<ckptd::v1::RestorePlanResponse> RestorePlan(const ckptd::v1::RestorePlanRequest& request,
                                                             absl::Duration) override {
    ckptd::v1::RestorePlanResponse r;
    r.set_step(step);
    absl::MutexLock l(&mu_);
    if (request.has_attempt() && request.attempt_ok()) {
      sources_.push_back(request.attempt_source());
      r.set_verdict(ckptd::v1::RestorePlanResponse::GO);
    } else {
      r.set_verdict(ckptd::v1::RestorePlanResponse::LOAD);
      for (const ckptd::v1::PeerCopy& p : peers) *r.add_peers() = p;
    }
    return r;
  }
  std::optional<ckptd::v1::Schedule> ScheduleFor(const std::string&) override { return std::nullopt; }
  std::vector<ckptd::v1::ShardRef> reports() {
    absl::MutexLock l(&mu_);
    return reports_;
  }
  std::vector<ckptd::v1::RestoreSource> sources() {
    absl::MutexLock l(&mu_);
    return sources_;
  }
  uint64_t step = 0;
  std::vector<ckptd::v1::PeerCopy> peers;

 private:
  absl::Mutex mu_;
  std::vector<ckptd::v1::ShardRef> reports_;
  std::vector<ckptd::v1::RestoreSource> sources_;
};

TrainerRegistration OneRank() {
  TrainerRegistration r;
  r.job = "job";
  r.world_size = 1;
  r.buffers = {Buffer("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 5000),
               Buffer("adam", ckptd::v1::OPTIMIZER, ckptd::v1::FLOAT32, 9000),
               Buffer("cursor", ckptd::v1::DATA_CURSOR, ckptd::v1::BYTES, 24)};
  return r;
}

// Node A persists step 5 of rank 0 and replicates it to partner node B; the
// coordinator commits it. Node A is then lost: node C restores the rank.
class PeerRestoreTest : public ::testing::Test {
 protected:
  PeerRestoreTest() {
    EXPECT_THAT(mem_.CreateDir("/ckpt"), IsOk());
    net_ = std::make_unique<GrpcPeerNetwork>(NetworkOptions());
    replicator_ = std::make_unique<Replicator>(net_.get(), ReplicatorOptions());
    google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner> to_b;
    *to_b.Add() = Partner("node-b", b_.address, kTicket);
    replicator_->SetPartners(to_b);
  }

  void PersistOnA() {
    AgentOptions o = TestAgentOptions("peer-a");
    o.node_id = "node-a";
    o.coordinator = &coord_a_;
    o.replicator = replicator_.get();
    AgentCore a(&mem_, o);
    CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, a.Register(OneRank()));
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<staging::StagingSegment> seg, staging::StagingSegment::Open(h.segment));
    ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(a, *seg, h, 5, kFill));
    ASSERT_TRUE(replicator_->WaitIdle(absl::Seconds(30)));
    ASSERT_EQ(replicator_->Stats().sent, 1u) << replicator_->Stats().last_error;
    const std::vector<ckptd::v1::ShardRef> reports = coord_a_.reports();
    ASSERT_THAT(reports, SizeIs(1));
    std::vector<ckptd::v1::ShardRef> refs = reports;
    storage::CheckpointStore store(&mem_, "/ckpt");
    CKPTD_ASSERT_OK(store.CommitStep("job", 5, 1, &refs, storage::CheckpointStore::CommitCheck::kCheckedByCaller)
                        .status());
    ckptd::v1::Heartbeat hb;
    a.FillHeartbeat(&hb);
    ASSERT_THAT(hb.memory(), SizeIs(1));
    EXPECT_EQ(hb.memory(0).owner_node(), "node-a");
    EXPECT_EQ(hb.memory(0).step(), 5u);
  }

  // Node C's agent restores rank 0 with the plan naming node B; returns the
  // source and checks the bytes.
  void RestoreOnC(RestoreSource expect, bool client_verifies = false) {
    PlanningCoordinator coord;
    coord.step = 5;
    ckptd::v1::PeerCopy b;
    b.set_node_id("node-b");
    b.set_address(b_.address);
    coord.peers = {bogus_, b};
    AgentOptions o = TestAgentOptions("peer-c");
    o.node_id = "node-c";
    o.coordinator = &coord;
    o.peer_network = net_.get();
    AgentCore c(&mem_, o);
    CKPTD_ASSERT_OK_AND_ASSIGN(TrainerHandle h, c.Register(OneRank()));
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<staging::StagingSegment> seg, staging::StagingSegment::Open(h.segment));
    RestoreOptions ro;
    ro.client_verifies = client_verifies;
    CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, c.Restore(h.trainer_id, ro));
    ASSERT_EQ(r.step, std::optional<uint64_t>(5));
    EXPECT_EQ(r.source, expect);
    EXPECT_EQ(client_verifies && expect == RestoreSource::kPeer, !r.verify.empty());
    for (const BlockDigest& d : r.verify) {
      EXPECT_EQ(format::Xxh3(seg->slot_data(r.slot) + h.offsets[d.buffer] + d.offset, d.length), d.xxh3);
    }
    for (size_t i = 0; i < h.offsets.size(); ++i) {
      EXPECT_EQ(seg->slot_data(r.slot)[h.offsets[i]], kFill) << "buffer " << i;
    }
    EXPECT_THAT(coord.sources(), ::testing::ElementsAre(RestoreSourceProto(expect)));
    CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, c.Status(h.trainer_id));
    EXPECT_EQ(st.peer_restores, expect == RestoreSource::kPeer ? 1u : 0u);
    // The unreachable peer listed first, and node B when it failed.
    EXPECT_EQ(st.peer_rejected, expect == RestoreSource::kPeer ? 1u : 2u);
  }

  static constexpr uint8_t kFill = 0x3c;
  storage::MemFileSystem mem_;
  PartnerNode b_;
  std::unique_ptr<GrpcPeerNetwork> net_;
  std::unique_ptr<Replicator> replicator_;
  PlanningCoordinator coord_a_;
  ckptd::v1::PeerCopy bogus_ = [] {
    ckptd::v1::PeerCopy p;
    p.set_node_id("node-gone");
    p.set_address("127.0.0.1:1");
    return p;
  }();
};

TEST_F(PeerRestoreTest, ALostNodesRankComesBackFromItsPartnersMemory) {
  ASSERT_NO_FATAL_FAILURE(PersistOnA());
  ASSERT_NE(b_.store->Find(Key("job", 0, 5)), nullptr);
  ASSERT_NO_FATAL_FAILURE(RestoreOnC(RestoreSource::kPeer));
}

TEST_F(PeerRestoreTest, TheTrainerChecksAPeerCopyAsItCopiesIt) {
  ASSERT_NO_FATAL_FAILURE(PersistOnA());
  ASSERT_NO_FATAL_FAILURE(RestoreOnC(RestoreSource::kPeer, /*client_verifies=*/true));
}

TEST_F(PeerRestoreTest, ADamagedPeerCopyFallsBackToDisk) {
  ASSERT_NO_FATAL_FAILURE(PersistOnA());
  std::shared_ptr<const Replica> held = b_.store->Find(Key("job", 0, 5));
  ASSERT_NE(held, nullptr);
  const_cast<uint8_t*>(held->data())[100] ^= 0xff;  // a stray write in node B's memory
  ASSERT_NO_FATAL_FAILURE(RestoreOnC(RestoreSource::kRoot));
}

TEST_F(PeerRestoreTest, ACopyOfAnotherAttemptAtTheStepIsNotUsed) {
  ASSERT_NO_FATAL_FAILURE(PersistOnA());
  // The step committed with another shard than the one node B holds (the
  // job was rolled back and step 5 written again).
  std::shared_ptr<const Replica> held = b_.store->Find(Key("job", 0, 5));
  ckptd::v1::ReplicaHeader h = held->header();
  h.set_index_xxh3(h.index_xxh3() ^ 1);
  h.set_ticket(kTicket);
  PieceSource same_bytes;
  same_bytes.piece = [&](uint64_t offset, uint64_t length) {
    return absl::StatusOr<absl::Span<const uint8_t>>(absl::Span<const uint8_t>(held->data() + offset, length));
  };
  ASSERT_THAT(net_->Put(b_.address, h, same_bytes), IsOk());
  ASSERT_NO_FATAL_FAILURE(RestoreOnC(RestoreSource::kRoot));
}

}  // namespace
}  // namespace ckptd::agent
