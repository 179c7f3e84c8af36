// CoordinatorCore: peer replication. Partners and tickets in heartbeat
// answers, the copies agents hold in memory, and what restore plans,
// previews, the status and drills make of them.
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "base/status_macros.h"
#include "base/testing/capturing_logger.h"
#include "base/testing/matchers.h"
#include "coordinator/coordinator_core.h"
#include "coordinator/testing_core_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/fetch_ticket.h"

namespace ckptd::coordinator {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAre;

class ReplicationTest : public ::testing::Test, public CoreHarness {
 protected:
  ReplicationTest() {
    options_.partners_recompute_every = absl::ZeroDuration();
    options_.logger = &log_;
    Reset();
  }
  void Fail(const std::string& what) override { ADD_FAILURE() << what; }

  // Node `node` hosting `ranks`, with a Peer service at "<node>:7300", in
  // failure domain `domain`, asking for `replicas` partners.
  std::string RegisterPeer(const std::string& node, std::vector<uint32_t> ranks, const std::string& domain,
                           uint32_t replicas, bool drills = false, uint64_t instance = 1) {
    ckptd::v1::RegisterAgentRequest req = Registration(node, std::move(ranks), 4, drills);
    req.set_peer_address(node + ":7300");
    req.set_failure_domain(domain);
    req.set_replicas(replicas);
    req.set_instance(instance);
    return Register(req);
  }

  ckptd::v1::HeartbeatAck MustBeat(const std::string& node) {
    absl::StatusOr<ckptd::v1::HeartbeatAck> ack = Beat(node);
    EXPECT_TRUE(ack.ok()) << ack.status();
    EXPECT_TRUE(ack.ok() && ack->known()) << node;
    return ack.ok() ? *ack : ckptd::v1::HeartbeatAck();
  }

  static std::vector<std::string> Nodes(const google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner>& ps) {
    std::vector<std::string> out;
    for (const auto& p : ps) out.push_back(p.node_id());
    return out;
  }

  // The committed step's shard of `rank` as its MANIFEST names it.
  ckptd::v1::ShardRef ShardOf(uint64_t step, uint32_t rank) {
    absl::StatusOr<ckptd::v1::StepManifest> m = store_.ReadManifest(kJob, step);
    EXPECT_TRUE(m.ok()) << m.status();
    if (m.ok()) {
      for (const auto& s : m->shards()) {
        if (s.rank() == rank) return s;
      }
    }
    ADD_FAILURE() << "no shard of rank " << rank << " in step " << step;
    return {};
  }

  // A copy in memory of (rank, step) owned by `owner`, matching the
  // committed shard unless `digest_off` changes its digest.
  ckptd::v1::MemoryCopy Copy(uint32_t rank, uint64_t step, const std::string& owner, uint64_t digest_off = 0) {
    ckptd::v1::ShardRef s = ShardOf(step, rank);
    ckptd::v1::MemoryCopy c;
    c.set_job(kJob);
    c.set_rank(rank);
    c.set_step(step);
    c.set_owner_node(owner);
    c.set_file_length(s.file_length());
    c.set_index_xxh3(s.index_xxh3() + digest_off);
    return c;
  }

  // `node`'s heartbeat listing `copies` in its memory.
  absl::StatusOr<ckptd::v1::HeartbeatAck> BeatWithMemory(const std::string& node,
                                                         const std::vector<ckptd::v1::MemoryCopy>& copies) {
    ckptd::v1::Heartbeat hb = HeartbeatOf(node);
    for (const auto& c : copies) *hb.add_memory() = c;
    return core_->OnHeartbeat(hb);
  }

  ckptd::v1::RestorePreview Preview() {
    ckptd::v1::RestorePreviewRequest req;
    req.set_job(kJob);
    absl::StatusOr<ckptd::v1::RestorePreview> p = core_->GetRestorePreview(req);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : ckptd::v1::RestorePreview();
  }

  static std::vector<std::string> PeerNodes(const ckptd::v1::RestorePlanResponse& plan) {
    std::vector<std::string> out;
    for (const auto& p : plan.peers()) out.push_back(p.node_id());
    return out;
  }

  const ckptd::v1::AgentStatus* AgentIn(const ckptd::v1::GetClusterStatusResponse& cs, const std::string& node) {
    for (const auto& a : cs.agents()) {
      if (a.node_id() == node) return &a;
    }
    ADD_FAILURE() << "no agent " << node;
    return nullptr;
  }

  // Three nodes in three racks: node-a hosts ranks 0-1, node-b 2-3, node-c none.
  void ThreeRacks(uint32_t replicas, bool drills = false) {
    RegisterPeer("node-a", {0, 1}, "rack-1", replicas, drills);
    RegisterPeer("node-b", {2, 3}, "rack-2", replicas, drills);
    RegisterPeer("node-c", {}, "rack-3", replicas, drills);
  }

  ckptd::testing::CapturingLogger log_;
};

bool IsTicket(const std::string& t) {
  return t.size() == 32 && t.find_first_not_of("0123456789abcdef") == std::string::npos;
}

TEST_F(ReplicationTest, HeartbeatAnswersCarryPartnersWithOneTicketPerPairOnBothSides) {
  ThreeRacks(2);
  std::map<std::string, ckptd::v1::HeartbeatAck> acks;
  for (const char* node : {"node-a", "node-b", "node-c"}) acks[node] = MustBeat(node);
  std::map<std::pair<std::string, std::string>, std::string> sent, received;
  for (const auto& [node, ack] : acks) {
    // Two racks besides its own, two partners: one in each.
    EXPECT_THAT(Nodes(ack.send_to()), SizeIs(2)) << node;
    for (const auto& p : ack.send_to()) {
      EXPECT_NE(p.node_id(), node);
      EXPECT_EQ(p.address(), p.node_id() + ":7300");
      EXPECT_TRUE(IsTicket(p.ticket())) << p.ticket();
      sent[{node, p.node_id()}] = p.ticket();
    }
    for (const auto& p : ack.receive_from()) received[{p.node_id(), node}] = p.ticket();
  }
  // The receiver is given the very ticket the sender presents.
  EXPECT_EQ(sent, received);
  std::set<std::string> distinct;
  for (const auto& [pair, t] : sent) distinct.insert(t);
  EXPECT_EQ(distinct.size(), sent.size()) << "a ticket shared by two pairs";
  // Kept while the pair exists.
  EXPECT_EQ(MustBeat("node-a").send_to(0).ticket(), acks["node-a"].send_to(0).ticket());
  // Each partner comes with its failure domain.
  const std::map<std::string, std::string> domain = {{"node-a", "rack-1"}, {"node-b", "rack-2"}, {"node-c", "rack-3"}};
  for (const auto& [node, ack] : acks) {
    for (const auto& p : ack.send_to()) EXPECT_EQ(p.failure_domain(), domain.at(p.node_id()));
    for (const auto& p : ack.receive_from()) EXPECT_EQ(p.failure_domain(), domain.at(p.node_id()));
  }
}

TEST_F(ReplicationTest, TicketsAreNeverInTheStatusNorTheLog) {
  ThreeRacks(2);
  std::vector<std::string> tickets;
  for (const char* node : {"node-a", "node-b", "node-c"}) {
    const ckptd::v1::HeartbeatAck ack = MustBeat(node);
    for (const auto& p : ack.send_to()) tickets.push_back(p.ticket());
  }
  ASSERT_THAT(tickets, SizeIs(6));
  const ckptd::v1::GetClusterStatusResponse cs = core_->ClusterStatus();
  const ckptd::v1::AgentStatus* a = AgentIn(cs, "node-a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->peer_address(), "node-a:7300");
  EXPECT_EQ(a->failure_domain(), "rack-1");
  EXPECT_EQ(a->replicas(), 2u);
  EXPECT_THAT(std::vector<std::string>(a->send_to().begin(), a->send_to().end()),
              UnorderedElementsAre("node-b", "node-c"));
  const std::string dump = cs.SerializeAsString() + cs.DebugString();
  for (const std::string& t : tickets) {
    EXPECT_FALSE(absl::StrContains(dump, t)) << "a ticket in the cluster status";
    EXPECT_FALSE(log_.Contains(t)) << "a ticket in the log";
  }
}

TEST_F(ReplicationTest, OneFailureDomainGivesNoPartnersAndSaysSo) {
  RegisterPeer("node-a", {0, 1}, "rack-1", 1);
  RegisterPeer("node-b", {2, 3}, "rack-1", 1);
  EXPECT_THAT(MustBeat("node-a").send_to(), IsEmpty());
  EXPECT_THAT(MustBeat("node-b").receive_from(), IsEmpty());
  EXPECT_TRUE(log_.Contains("node node-a asks for 1 replication partners; it has 0"));
  // Said once per change, not at every recomputation.
  const size_t lines = log_.lines().size();
  RegisterPeer("node-b", {2, 3}, "rack-1", 1);
  MustBeat("node-a");
  EXPECT_EQ(log_.lines().size(), lines);
  // A node in another rack: now each has its partner.
  RegisterPeer("node-c", {}, "rack-2", 1);
  EXPECT_THAT(Nodes(MustBeat("node-a").send_to()), ElementsAre("node-c"));
  EXPECT_THAT(Nodes(MustBeat("node-c").receive_from()), UnorderedElementsAre("node-a", "node-b"));
}

TEST_F(ReplicationTest, AnAgentWithoutAPeerAddressTakesNoPart) {
  RegisterPeer("node-a", {0, 1}, "rack-1", 1);
  Register("node-b", {2, 3});  // no peer address
  EXPECT_THAT(MustBeat("node-a").send_to(), IsEmpty());
  EXPECT_THAT(MustBeat("node-b").send_to(), IsEmpty());
  EXPECT_THAT(MustBeat("node-b").receive_from(), IsEmpty());
}

TEST_F(ReplicationTest, ALostNodesPartnershipsEndAndComeBackWithNewTickets) {
  ThreeRacks(2);
  ckptd::v1::HeartbeatAck a = MustBeat("node-a");
  std::string old_ticket;
  for (const auto& p : a.send_to()) {
    if (p.node_id() == "node-b") old_ticket = p.ticket();
  }
  ASSERT_FALSE(old_ticket.empty());
  // node-b goes quiet.
  clock_.Advance(options_.node_lost_after + absl::Seconds(1));
  MustBeat("node-a");
  MustBeat("node-c");
  core_->Tick();
  a = MustBeat("node-a");
  EXPECT_THAT(Nodes(a.send_to()), ElementsAre("node-c"));
  EXPECT_THAT(Nodes(a.receive_from()), ElementsAre("node-c"));
  // It comes back (a new agent process): a new ticket for the same pair.
  RegisterPeer("node-b", {2, 3}, "rack-2", 2, false, /*instance=*/2);
  a = MustBeat("node-a");
  std::string new_ticket;
  for (const auto& p : a.send_to()) {
    if (p.node_id() == "node-b") new_ticket = p.ticket();
  }
  EXPECT_TRUE(IsTicket(new_ticket));
  EXPECT_NE(new_ticket, old_ticket);
  // An agent that restarts before it is missed loses its pairs as well.
  std::string before = new_ticket;
  RegisterPeer("node-b", {2, 3}, "rack-2", 2, false, /*instance=*/3);
  a = MustBeat("node-a");
  ASSERT_THAT(Nodes(a.send_to()), ::testing::Contains("node-b"));
  for (const auto& p : a.send_to()) {
    if (p.node_id() == "node-b") {
      EXPECT_NE(p.ticket(), before);
    }
  }
}

TEST_F(ReplicationTest, AChangedFailureDomainMovesPartners) {
  ThreeRacks(1);
  RegisterPeer("node-b", {2, 3}, "rack-1", 1);  // now beside node-a
  EXPECT_THAT(Nodes(MustBeat("node-a").send_to()), ElementsAre("node-c"));
  EXPECT_THAT(Nodes(MustBeat("node-b").send_to()), ElementsAre("node-c"));
}

TEST_F(ReplicationTest, RegistrationsWithBadReplicationFieldsAreRefused) {
  ckptd::v1::RegisterAgentRequest req = Registration("node-x", {0});
  req.set_peer_address("node-x:7300");
  req.set_failure_domain(std::string(1 << 20, 'r'));  // a megabyte
  EXPECT_THAT(core_->RegisterAgent(req),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("failure domain is 1048576 characters")));
  req.set_failure_domain("rack\n1");
  EXPECT_THAT(core_->RegisterAgent(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("failure domain")));
  req.set_failure_domain("rack-1");
  req.set_peer_address(std::string(300, 'h') + ":1");
  EXPECT_THAT(core_->RegisterAgent(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("peer address")));
  for (const char* bad : {"node-x", "node-x:0", ":7300", "node x:7300", "node-x:99999"}) {
    req.set_peer_address(bad);
    EXPECT_THAT(core_->RegisterAgent(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("peer address")))
        << bad;
  }
  req.set_peer_address("[::1]:7300");
  req.set_replicas(17);
  EXPECT_THAT(core_->RegisterAgent(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 16")));
  // Nothing was registered.
  EXPECT_THAT(core_->ClusterStatus().agents(), IsEmpty());
  req.set_replicas(2);
  CKPTD_EXPECT_OK(core_->RegisterAgent(req).status());
}

// --- Copies in memory.

TEST_F(ReplicationTest, PlansNamePeersHoldingTheStepOtherDomainsFirst) {
  RegisterPeer("node-a", {0, 1}, "rack-1", 2);
  RegisterPeer("node-b", {2, 3}, "rack-2", 2);
  RegisterPeer("node-c", {}, "rack-3", 2);
  RegisterPeer("node-d", {}, "rack-1", 2);  // in node-a's rack
  RegisterPeer("node-e", {}, "rack-4", 2);
  CommitStep(10);
  // Rank 0's step 10: node-a's own copy; node-c, node-d and node-e hold
  // partner copies, node-e's with another digest; node-b one of step 9.
  CKPTD_ASSERT_OK(BeatWithMemory("node-a", {Copy(0, 10, "node-a"), Copy(1, 10, "node-a")}).status());
  CKPTD_ASSERT_OK(BeatWithMemory("node-c", {Copy(0, 10, "node-a")}).status());
  CKPTD_ASSERT_OK(BeatWithMemory("node-d", {Copy(0, 10, "node-a")}).status());
  CKPTD_ASSERT_OK(BeatWithMemory("node-e", {Copy(0, 10, "node-a", /*digest_off=*/1)}).status());
  ckptd::v1::MemoryCopy old = Copy(0, 10, "node-a");
  old.set_step(9);
  CKPTD_ASSERT_OK(BeatWithMemory("node-b", {old}).status());

  // node-a's trainers die; rank 0 asks as a new trainer on node-a.
  CKPTD_ASSERT_OK(ReportFailure("node-a", 0, ckptd::v1::TRAINER_DIED));
  CKPTD_ASSERT_OK_AND_ASSIGN(PlanResponse plan, Plan(0));
  ASSERT_EQ(plan.verdict(), PlanResponse::LOAD);
  ASSERT_EQ(plan.step(), 10u);
  // Not the asker, not a mismatched digest, not another step; node-d is in
  // the asker's rack: last.
  EXPECT_THAT(PeerNodes(plan), ElementsAre("node-c", "node-d"));
  EXPECT_EQ(plan.peers(0).address(), "node-c:7300");
  // Each with the ticket its holder's Peer service asks of node-a for that
  // copy, under the holder's key: of no use to another node, another copy,
  // or at another holder.
  for (const auto& p : plan.peers()) {
    const std::string& key = fetch_keys_[p.node_id()];
    EXPECT_EQ(key.size(), 32u);
    EXPECT_TRUE(rpc::FetchTicketValid(p.ticket(), key, "node-a", kJob, 0, 10)) << p.node_id();
    EXPECT_FALSE(rpc::FetchTicketValid(p.ticket(), key, "node-b", kJob, 0, 10)) << p.node_id();
    EXPECT_FALSE(rpc::FetchTicketValid(p.ticket(), key, "node-a", kJob, 1, 10)) << p.node_id();
  }
  EXPECT_NE(fetch_keys_["node-c"], fetch_keys_["node-d"]);
  EXPECT_FALSE(rpc::FetchTicketValid(plan.peers(0).ticket(), fetch_keys_["node-d"], "node-a", kJob, 0, 10));
  // Rank 2 of node-b: nobody holds it.
  CKPTD_ASSERT_OK_AND_ASSIGN(plan, Plan(2));
  EXPECT_THAT(plan.peers(), IsEmpty());

  // node-c is lost: no plan names it, and its copies are forgotten.
  clock_.Advance(options_.node_lost_after + absl::Seconds(1));
  for (const char* n : {"node-a", "node-b", "node-d", "node-e"}) CKPTD_ASSERT_OK(Beat(n).status());
  CKPTD_ASSERT_OK(BeatWithMemory("node-d", {Copy(0, 10, "node-a")}).status());
  core_->Tick();
  CKPTD_ASSERT_OK_AND_ASSIGN(plan, Plan(0));
  EXPECT_THAT(PeerNodes(plan), ElementsAre("node-d"));
  // Back with the same agent process: what it holds counts again only once
  // its heartbeat says so.
  RegisterPeer("node-c", {}, "rack-3", 2);
  CKPTD_ASSERT_OK_AND_ASSIGN(plan, Plan(0));
  EXPECT_THAT(PeerNodes(plan), ElementsAre("node-d"));
}

TEST_F(ReplicationTest, EachHeartbeatReplacesWhatTheNodeHolds) {
  ThreeRacks(1);
  CommitStep(10);
  CKPTD_ASSERT_OK(BeatWithMemory("node-c", {Copy(2, 10, "node-b")}).status());
  ckptd::v1::RestorePreview p = Preview();
  ASSERT_THAT(p.ranks(), SizeIs(4));
  EXPECT_THAT(p.ranks(2).peer_nodes(), ElementsAre("node-c"));
  CKPTD_ASSERT_OK(BeatWithMemory("node-c", {}).status());
  EXPECT_THAT(Preview().ranks(2).peer_nodes(), IsEmpty());
}

TEST_F(ReplicationTest, PreviewSaysWhereEachRankWouldRead) {
  ThreeRacks(1);
  CommitStep(10);
  // node-a keeps rank 0's step (not rank 1's); node-c holds a copy of rank
  // 1's and of rank 2's; node-b keeps nothing.
  CKPTD_ASSERT_OK(BeatWithMemory("node-a", {Copy(0, 10, "node-a")}).status());
  CKPTD_ASSERT_OK(BeatWithMemory("node-c", {Copy(1, 10, "node-a"), Copy(2, 10, "node-b")}).status());
  ckptd::v1::RestorePreview p = Preview();
  EXPECT_EQ(p.step(), 10u);
  ASSERT_THAT(p.ranks(), SizeIs(4));
  for (uint32_t r = 0; r < 4; ++r) EXPECT_EQ(p.ranks(r).rank(), r);
  EXPECT_EQ(p.ranks(0).node_id(), "node-a");
  EXPECT_TRUE(p.ranks(0).own_memory());
  EXPECT_EQ(p.ranks(0).planned(), ckptd::v1::AGENT_MEMORY);
  EXPECT_FALSE(p.ranks(1).own_memory());
  EXPECT_THAT(p.ranks(1).peer_nodes(), ElementsAre("node-c"));
  EXPECT_EQ(p.ranks(1).planned(), ckptd::v1::PEER_MEMORY);
  EXPECT_EQ(p.ranks(2).node_id(), "node-b");
  EXPECT_EQ(p.ranks(2).planned(), ckptd::v1::PEER_MEMORY);
  EXPECT_THAT(p.ranks(3).peer_nodes(), IsEmpty());
  EXPECT_EQ(p.ranks(3).planned(), ckptd::v1::STORAGE_ROOT);
  // The status counts the ranks a peer holds: 1 and 2.
  EXPECT_EQ(JobIn(core_->ClusterStatus()).peer_copies(), 2u);

  // node-a is lost: its ranks have no node now, and its own copy is gone.
  clock_.Advance(options_.node_lost_after + absl::Seconds(1));
  CKPTD_ASSERT_OK(Beat("node-b").status());
  CKPTD_ASSERT_OK(BeatWithMemory("node-c", {Copy(1, 10, "node-a"), Copy(2, 10, "node-b")}).status());
  core_->Tick();
  p = Preview();
  EXPECT_EQ(p.ranks(0).node_id(), "");
  EXPECT_FALSE(p.ranks(0).own_memory());
  EXPECT_EQ(p.ranks(0).planned(), ckptd::v1::STORAGE_ROOT);
  EXPECT_THAT(p.ranks(1).peer_nodes(), ElementsAre("node-c"));
}

TEST_F(ReplicationTest, ACopyCountsOnlyForTheCommittedShard) {
  ThreeRacks(1);
  CommitStep(10);
  ckptd::v1::MemoryCopy longer = Copy(2, 10, "node-b");
  longer.set_file_length(longer.file_length() + 1);
  ckptd::v1::MemoryCopy uncommitted = Copy(3, 10, "node-b");
  uncommitted.set_step(11);
  CKPTD_ASSERT_OK(
      BeatWithMemory("node-c", {Copy(2, 10, "node-b", /*digest_off=*/7), longer, uncommitted}).status());
  CKPTD_ASSERT_OK(BeatWithMemory("node-b", {Copy(2, 10, "node-b", /*digest_off=*/7)}).status());
  ckptd::v1::RestorePreview p = Preview();
  EXPECT_THAT(p.ranks(2).peer_nodes(), IsEmpty());
  EXPECT_FALSE(p.ranks(2).own_memory());
  EXPECT_THAT(p.ranks(3).peer_nodes(), IsEmpty());
  EXPECT_EQ(JobIn(core_->ClusterStatus()).peer_copies(), 0u);
}

TEST_F(ReplicationTest, ACommittedStepsShardsAreKnownAfterACoordinatorRestart) {
  ThreeRacks(1);
  CommitStep(10);
  Reset();  // a new coordinator: it reads the MANIFEST back
  ThreeRacks(1);
  CKPTD_ASSERT_OK(BeatWithMemory("node-c", {Copy(2, 10, "node-b")}).status());
  CKPTD_ASSERT_OK(BeatWithMemory("node-b", {Copy(2, 10, "node-b", 1)}).status());
  ckptd::v1::RestorePreview p = Preview();
  EXPECT_THAT(p.ranks(2).peer_nodes(), ElementsAre("node-c"));
  EXPECT_FALSE(p.ranks(2).own_memory());
}

// --- Attacks.

TEST_F(ReplicationTest, AMillionCopiesInOneHeartbeatAreCutAtTheLimit) {
  ThreeRacks(1);
  CommitStep(10);
  ckptd::v1::Heartbeat hb = HeartbeatOf("node-c");
  const ckptd::v1::MemoryCopy real = Copy(2, 10, "node-b");
  // Valid-looking junk first (steps nobody committed), then a real copy.
  ckptd::v1::MemoryCopy junk = real;
  for (int i = 0; i < 1'000'000; ++i) {
    junk.set_step(1000 + static_cast<uint64_t>(i));
    *hb.add_memory() = junk;
  }
  *hb.add_memory() = real;
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::HeartbeatAck ack, core_->OnHeartbeat(hb));
  EXPECT_TRUE(ack.known());
  EXPECT_THAT(Preview().ranks(2).peer_nodes(), IsEmpty()) << "a copy past the limit was kept";
  EXPECT_TRUE(log_.Contains("lists 1000001 copies in memory; only the first 4096 are kept"));
  // Said once.
  CKPTD_ASSERT_OK(core_->OnHeartbeat(hb).status());
  int said = 0;
  for (const std::string& line : log_.lines()) said += absl::StrContains(line, "copies in memory; only the first");
  EXPECT_EQ(said, 1);
  // Within the limit, it counts.
  CKPTD_ASSERT_OK(BeatWithMemory("node-c", {real}).status());
  EXPECT_THAT(Preview().ranks(2).peer_nodes(), ElementsAre("node-c"));
}

TEST_F(ReplicationTest, CopiesOfUnknownJobsAndImpossibleRanksAreIgnored) {
  ThreeRacks(1);
  CommitStep(10);
  ckptd::v1::MemoryCopy other_job = Copy(2, 10, "node-b");
  other_job.set_job("not-a-job");
  ckptd::v1::MemoryCopy bad_name = Copy(2, 10, "node-b");
  bad_name.set_job(std::string(100000, 'j'));
  ckptd::v1::MemoryCopy out_of_world = Copy(2, 10, "node-b");
  out_of_world.set_rank(4);
  CKPTD_ASSERT_OK(BeatWithMemory("node-c", {other_job, bad_name, out_of_world}).status());
  ckptd::v1::RestorePreview p = Preview();
  for (const auto& r : p.ranks()) EXPECT_THAT(r.peer_nodes(), IsEmpty()) << r.rank();
  EXPECT_TRUE(log_.Contains("node node-c's heartbeat lists 3 copies in memory of unknown jobs"));
  EXPECT_FALSE(log_.Contains(std::string(200, 'j'))) << "an agent's text in the log";
}

TEST_F(ReplicationTest, ANodeClaimingAnotherNodesCopiesHoldsThemItself) {
  ThreeRacks(1);
  CommitStep(10);
  // node-c says it is node-a's own copy of rank 0: it is node-c's copy, and
  // node-a's memory is what node-a's heartbeat says (nothing).
  CKPTD_ASSERT_OK(BeatWithMemory("node-c", {Copy(0, 10, "node-a")}).status());
  // And node-b claims a copy as its own of a rank it does not host.
  CKPTD_ASSERT_OK(BeatWithMemory("node-b", {Copy(1, 10, "node-b")}).status());
  ckptd::v1::RestorePreview p = Preview();
  EXPECT_FALSE(p.ranks(0).own_memory());
  EXPECT_THAT(p.ranks(0).peer_nodes(), ElementsAre("node-c"));
  EXPECT_FALSE(p.ranks(1).own_memory());
  EXPECT_THAT(p.ranks(1).peer_nodes(), ElementsAre("node-b"));
  EXPECT_EQ(p.ranks(1).planned(), ckptd::v1::PEER_MEMORY);
  // node-a's plan for rank 0 names node-c as a peer, never node-a itself.
  CKPTD_ASSERT_OK(ReportFailure("node-a", 0, ckptd::v1::TRAINER_DIED));
  CKPTD_ASSERT_OK_AND_ASSIGN(PlanResponse plan, Plan(0));
  EXPECT_THAT(PeerNodes(plan), ElementsAre("node-c"));
}

// --- Drills.

TEST_F(ReplicationTest, KillNodeWithPartnersKillsTheNodesPartnersToo) {
  ThreeRacks(2, /*drills=*/true);
  CommitStep(10);
  const ckptd::v1::HeartbeatAck a = MustBeat("node-a");
  const std::vector<std::string> partners = Nodes(a.send_to());
  ASSERT_THAT(partners, UnorderedElementsAre("node-b", "node-c"));

  ckptd::v1::RunDrillRequest req;
  req.set_job(kJob);
  req.set_scenario(ckptd::v1::KILL_NODE);
  req.set_target_node("node-a");
  req.set_with_partners(true);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RunDrillResponse r, core_->RunDrill(req));
  EXPECT_EQ(r.node_id(), "node-a");
  EXPECT_THAT(std::vector<std::string>(r.partner_nodes().begin(), r.partner_nodes().end()),
              ElementsAreArray(partners));
  // Each partner gets a KILL_NODE order of its own, and carries it out
  // before node-a does (node-b first, at +1 ms and +2 ms of the order).
  const int64_t ordered = absl::ToUnixNanos(clock_.Now());
  int64_t offset_ms = 0;
  for (const std::string& p : partners) {
    const ckptd::v1::HeartbeatAck ack = MustBeat(p);
    ASSERT_THAT(ack.drills(), SizeIs(1)) << p;
    EXPECT_EQ(ack.drills(0).scenario(), ckptd::v1::KILL_NODE);
    EXPECT_NE(ack.drills(0).drill_id(), r.drill_id());
    ckptd::v1::Heartbeat hb = HeartbeatOf(p);
    ckptd::v1::DrillReport* report = hb.add_drill_reports();
    report->set_drill_id(ack.drills(0).drill_id());
    report->set_injected(true);
    report->set_injected_unix_nanos(ordered + (++offset_ms) * 1'000'000);
    CKPTD_ASSERT_OK(core_->OnHeartbeat(hb).status());
  }
  ASSERT_THAT(MustBeat("node-a").drills(), SizeIs(1));
  {
    ckptd::v1::Heartbeat hb = HeartbeatOf("node-a");
    ckptd::v1::DrillReport* report = hb.add_drill_reports();
    report->set_drill_id(r.drill_id());
    report->set_injected(true);
    report->set_injected_unix_nanos(ordered + 50'000'000);
    CKPTD_ASSERT_OK(core_->OnHeartbeat(hb).status());
  }
  ckptd::v1::GetDrillRequest get;
  get.set_drill_id(r.drill_id());
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::DrillStatus st, core_->GetDrill(get));
  EXPECT_THAT(std::vector<std::string>(st.partner_nodes().begin(), st.partner_nodes().end()),
              ElementsAreArray(partners));
  EXPECT_TRUE(st.request().with_partners());
  // The drill's injection is the first kill, whichever node it struck:
  // failures it caused are measured from it.
  EXPECT_EQ(st.report().injected_unix_nanos(), ordered + 1'000'000);
  // node-c hosts no rank of the job: its loss is in the drill's events too.
  clock_.Advance(options_.node_lost_after + absl::Seconds(1));
  core_->Tick();
  CKPTD_ASSERT_OK_AND_ASSIGN(st, core_->GetDrill(get));
  std::set<std::string> lost;
  for (const auto& e : st.events()) {
    if (e.kind() == ckptd::v1::NODE_LOST) lost.insert(e.node_id());
  }
  EXPECT_THAT(lost, UnorderedElementsAre("node-a", "node-b", "node-c"));
}

TEST_F(ReplicationTest, WithPartnersIsRefusedWhereItCannotBeCarriedOut) {
  ckptd::v1::RunDrillRequest req;
  req.set_job(kJob);
  req.set_scenario(ckptd::v1::KILL_TRAINER);
  req.set_rank(0);
  req.set_with_partners(true);
  RegisterPeer("node-a", {0, 1}, "rack-1", 1, /*drills=*/true);
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("with_partners (ckptctl drill run --with-partners) applies "
                                                       "to KILL_NODE only, not to KILL_TRAINER")));
  req.set_scenario(ckptd::v1::KILL_NODE);
  req.set_target_node("node-a");
  EXPECT_THAT(core_->RunDrill(req), StatusIs(absl::StatusCode::kFailedPrecondition,
                                             HasSubstr("node node-a has no replication partners")));
  // A partner that does not carry drills out: nothing is ordered at all.
  RegisterPeer("node-b", {2, 3}, "rack-2", 1, /*drills=*/false);
  EXPECT_THAT(core_->RunDrill(req),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("partner node node-b of node node-a: its agent was not started with --allow-drills")));
  EXPECT_THAT(MustBeat("node-a").drills(), IsEmpty());
  // Without with_partners, the same drill is fine.
  req.set_with_partners(false);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::RunDrillResponse r, core_->RunDrill(req));
  EXPECT_THAT(r.partner_nodes(), IsEmpty());
  EXPECT_THAT(MustBeat("node-b").drills(), IsEmpty());
}

// A memory checkpoint's digest of `rank`, as its agent reports it and its
// copies carry it.
constexpr uint64_t kMemLength = 8192;
ckptd::v1::ShardReport MemoryReport(uint64_t step, uint32_t rank) {
  ckptd::v1::ShardReport rep;
  rep.set_job(CoreHarness::kJob);
  rep.set_step(step);
  rep.set_world_size(4);
  rep.set_memory_only(true);
  rep.set_stall_seconds(0.01);
  rep.mutable_shard()->set_rank(rank);
  rep.mutable_shard()->set_file_length(kMemLength + rank);
  rep.mutable_shard()->set_index_xxh3(1000 + step * 10 + rank);
  return rep;
}

ckptd::v1::MemoryCopy MemoryCopyOf(uint64_t step, uint32_t rank, const std::string& owner) {
  const ckptd::v1::ShardReport rep = MemoryReport(step, rank);
  ckptd::v1::MemoryCopy c;
  c.set_job(CoreHarness::kJob);
  c.set_rank(rank);
  c.set_step(step);
  c.set_owner_node(owner);
  c.set_file_length(rep.shard().file_length());
  c.set_index_xxh3(rep.shard().index_xxh3());
  return c;
}

// A node whose peer copies fail (a partner refuses its certificate, say)
// shows so in the status, with the error, until its heartbeats say otherwise.
TEST_F(ReplicationTest, FailingPeerCopiesReachTheStatus) {
  ThreeRacks(1);
  ckptd::v1::Heartbeat hb = HeartbeatOf("node-a");
  hb.set_replication_sent(4);
  hb.set_replication_failed(3);
  hb.set_replication_error(std::string(5000, 'e'));
  ASSERT_THAT(core_->OnHeartbeat(hb).status(), IsOk());
  const ckptd::v1::GetClusterStatusResponse cs = core_->ClusterStatus();
  const ckptd::v1::AgentStatus* a = AgentIn(cs, "node-a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->replication_sent(), 4u);
  EXPECT_EQ(a->replication_failed(), 3u);
  EXPECT_EQ(a->replication_error(), std::string(1024, 'e'));  // bounded
  const ckptd::v1::AgentStatus* b = AgentIn(cs, "node-b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->replication_failed(), 0u);
}

TEST_F(ReplicationTest, TheSlowestNodesReplicationTimeIsTheTwoLevelPolicysQ) {
  RegisterPeer("node-a", {0, 1}, "rack-1", 1);
  RegisterPeer("node-b", {2, 3}, "rack-2", 1);
  auto beat = [&](const std::string& node, double q) {
    ckptd::v1::Heartbeat hb = HeartbeatOf(node);
    hb.set_replicate_seconds(q);
    return core_->OnHeartbeat(hb).status();
  };
  auto q = [&] {
    ckptd::v1::GetIntervalRequest req;
    req.set_job(kJob);
    absl::StatusOr<ckptd::v1::IntervalStatus> st = core_->GetInterval(req);
    EXPECT_TRUE(st.ok()) << st.status();
    EXPECT_TRUE(st.ok() && st->two_level().peer_copies());
    return st.ok() ? st->two_level().replicate_seconds() : -1;
  };
  EXPECT_EQ(q(), 0) << "nothing measured yet";
  CKPTD_ASSERT_OK(beat("node-a", 3.5));
  CKPTD_ASSERT_OK(beat("node-b", 7.25));
  EXPECT_EQ(q(), 7.25);
  // What no replication can take is not a measurement: node-b's goes.
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity(), 1e9}) {
    CKPTD_ASSERT_OK(beat("node-b", bad));
    EXPECT_EQ(q(), 3.5) << bad;
  }
}

TEST_F(ReplicationTest, ANodeCannotReportAMemoryCheckpointOfAnotherNodesRank) {
  RegisterPeer("node-a", {0, 1}, "rack-1", 1);
  RegisterPeer("node-b", {2, 3}, "rack-2", 1);
  CommitStep(10);
  // node-b speaks for rank 0 (node-a's): refused, and nothing of step 20 is
  // counted for rank 0.
  EXPECT_THAT(core_->ReportShard(ShardRequest("node-b", MemoryReport(20, 0))).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("runs on node node-a")));
  for (uint32_t r = 1; r < 4; ++r) {
    CKPTD_ASSERT_OK(core_->ReportShard(ShardRequest(NodeOf(r), MemoryReport(20, r))).status());
  }
  EXPECT_FALSE(JobState().has_memory_checkpoint()) << "a memory checkpoint without rank 0's own report";
  // Nor can it pass a memory checkpoint's shard off as written by an
  // emergency persist nobody ordered.
  ckptd::v1::ShardReport emergency = MemoryReport(20, 0);
  emergency.set_memory_only(false);
  emergency.set_emergency(true);
  EXPECT_THAT(core_->ReportShard(ShardRequest("node-b", emergency)).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("not ordered")));
  EXPECT_THAT(JobState().pending_steps(), IsEmpty());
}

// The step each heartbeat answer names for the staging to keep last is the
// one a restart restores: the newest complete memory checkpoint newer than
// the newest durable step, else that step.
TEST_F(ReplicationTest, HeartbeatAnswersNameTheStepARestartRestores) {
  RegisterPeer("node-a", {0, 1}, "rack-1", 1);
  RegisterPeer("node-b", {2, 3}, "rack-2", 1);
  auto named = [&](const std::string& node) -> std::optional<uint64_t> {
    const ckptd::v1::HeartbeatAck ack = MustBeat(node);
    for (const ckptd::v1::CommittedStep& c : ack.committed()) {
      if (c.job() == CoreHarness::kJob) return c.step();
    }
    return std::nullopt;
  };
  EXPECT_EQ(named("node-a"), std::nullopt);  // nothing to restore yet
  CommitStep(10);
  EXPECT_EQ(named("node-a"), std::optional<uint64_t>(10));
  // Step 20 in memory, not yet from every rank: still 10.
  for (uint32_t r = 0; r < 3; ++r) {
    CKPTD_ASSERT_OK(core_->ReportShard(ShardRequest(NodeOf(r), MemoryReport(20, r))).status());
  }
  EXPECT_EQ(named("node-a"), std::optional<uint64_t>(10));
  CKPTD_ASSERT_OK(core_->ReportShard(ShardRequest(NodeOf(3), MemoryReport(20, 3))).status());
  EXPECT_EQ(named("node-a"), std::optional<uint64_t>(20));
  EXPECT_EQ(named("node-b"), std::optional<uint64_t>(20));
  // A newer durable step wins over the older memory checkpoint.
  CommitStep(30);
  EXPECT_EQ(named("node-a"), std::optional<uint64_t>(30));
}

TEST_F(ReplicationTest, AMemoryCheckpointIsRestoredWhenEveryRankHasACopyInMemory) {
  RegisterPeer("node-a", {0, 1}, "rack-1", 1);
  RegisterPeer("node-b", {2, 3}, "rack-2", 1);
  MustBeat("node-a");
  MustBeat("node-b");
  CommitStep(10);
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK(core_->ReportShard(ShardRequest(NodeOf(r), MemoryReport(20, r))).status());
  }
  // Each node keeps its own ranks' copies and its partner's.
  std::vector<ckptd::v1::MemoryCopy> all;
  for (uint32_t r = 0; r < 4; ++r) all.push_back(MemoryCopyOf(20, r, NodeOf(r)));
  CKPTD_ASSERT_OK(BeatWithMemory("node-a", all).status());
  CKPTD_ASSERT_OK(BeatWithMemory("node-b", all).status());
  const ckptd::v1::JobStatus status = JobState();
  EXPECT_TRUE(status.has_memory_checkpoint());
  EXPECT_EQ(status.newest_memory_checkpoint(), 20u);
  EXPECT_TRUE(status.memory_checkpoint_restorable());
  EXPECT_EQ(status.memory_checkpoint_peer_copies(), 4u);  // each rank's partner holds it too
  ckptd::v1::RestorePreview preview = Preview();
  EXPECT_EQ(preview.step(), 20u);
  EXPECT_TRUE(preview.memory_step());
  EXPECT_TRUE(preview.has_durable_step());
  EXPECT_EQ(preview.durable_step(), 10u);
  EXPECT_THAT(preview.reason(), HasSubstr("memory checkpoint"));

  // A trainer dies: every rank loads step 20 from memory, each checked
  // against its own rank's reported digest.
  CKPTD_ASSERT_OK(ReportFailure("node-a", 1, ckptd::v1::TRAINER_DIED));
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(PlanResponse plan, Plan(r));
    ASSERT_EQ(plan.verdict(), PlanResponse::LOAD) << r;
    EXPECT_EQ(plan.step(), 20u);
    EXPECT_TRUE(plan.memory_step());
    EXPECT_EQ(plan.expected().rank(), r);
    EXPECT_EQ(plan.expected().file_length(), kMemLength + r);
    EXPECT_EQ(plan.expected().index_xxh3(), 1000 + 200 + r);
  }
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(PlanResponse plan, Plan(r, 20));
    EXPECT_EQ(plan.verdict(), r == 3 ? PlanResponse::GO : PlanResponse::WAIT);
    EXPECT_TRUE(plan.memory_step());
  }
  EXPECT_EQ(JobState().schedule().state(), ckptd::v1::JOB_RUNNING);

  // Later node-b is lost: node-a holds its ranks' copies, so step 20 is
  // still the one every rank loads (node-b's ranks on a replacement node,
  // from node-a's memory).
  for (const char* n : {"node-a", "node-b"}) MustBeat(n);
  CKPTD_ASSERT_OK(BeatWithMemory("node-a", all).status());
  clock_.Advance(options_.node_lost_after + absl::Seconds(1));
  CKPTD_ASSERT_OK(BeatWithMemory("node-a", all).status());
  core_->Tick();
  RegisterPeer("node-c", {2, 3}, "rack-3", 1);
  auto from_c = [&](std::optional<uint64_t> attempt, bool ok) {
    ckptd::v1::RestorePlanRequest req = PlanRequest(2, attempt, ok);
    req.set_node_id("node-c");
    req.set_session(sessions_["node-c"]);
    return core_->GetRestorePlan(req);
  };
  CKPTD_ASSERT_OK_AND_ASSIGN(PlanResponse moved, from_c(std::nullopt, true));
  ASSERT_EQ(moved.verdict(), PlanResponse::LOAD);
  EXPECT_EQ(moved.step(), 20u);
  EXPECT_TRUE(moved.memory_step());
  EXPECT_THAT(PeerNodes(moved), ElementsAre("node-a"));
  // Rank 2 finds no intact copy after all: no disk has a memory checkpoint,
  // so every rank falls back to durable step 10, and nothing is quarantined.
  CKPTD_ASSERT_OK_AND_ASSIGN(PlanResponse back, from_c(20, /*ok=*/false));
  EXPECT_EQ(back.verdict(), PlanResponse::LOAD);
  EXPECT_EQ(back.step(), 10u);
  EXPECT_FALSE(back.memory_step());
  EXPECT_FALSE(back.has_expected());
  CKPTD_ASSERT_OK_AND_ASSIGN(PlanResponse other, Plan(0));
  EXPECT_EQ(other.step(), 10u);
  EXPECT_FALSE(other.memory_step());
  EXPECT_TRUE(JobState().quarantined_steps().empty());
}

TEST_F(ReplicationTest, AMemoryCheckpointWithARankNoLiveAgentHoldsIsNotRestored) {
  RegisterPeer("node-a", {0, 1}, "rack-1", 1);
  RegisterPeer("node-b", {2, 3}, "rack-2", 1);
  CommitStep(10);
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK(core_->ReportShard(ShardRequest(NodeOf(r), MemoryReport(20, r))).status());
  }
  // Rank 3's copy is nowhere (its slot was taken back); one copy has
  // another digest (a stale copy of another attempt).
  CKPTD_ASSERT_OK(BeatWithMemory("node-a", {MemoryCopyOf(20, 0, "node-a"), MemoryCopyOf(20, 1, "node-a")}).status());
  ckptd::v1::MemoryCopy stale = MemoryCopyOf(20, 3, "node-b");
  stale.set_index_xxh3(stale.index_xxh3() + 1);
  CKPTD_ASSERT_OK(BeatWithMemory("node-b", {MemoryCopyOf(20, 2, "node-b"), stale}).status());
  EXPECT_EQ(Preview().step(), 10u);
  EXPECT_FALSE(Preview().memory_step());
  EXPECT_EQ(JobState().newest_memory_checkpoint(), 20u);
  EXPECT_FALSE(JobState().memory_checkpoint_restorable());
  EXPECT_EQ(JobState().memory_checkpoint_peer_copies(), 0u);  // only own nodes' copies
  CKPTD_ASSERT_OK(ReportFailure("node-a", 0, ckptd::v1::TRAINER_DIED));
  CKPTD_ASSERT_OK_AND_ASSIGN(PlanResponse plan, Plan(0));
  EXPECT_EQ(plan.step(), 10u);
  EXPECT_FALSE(plan.memory_step());
}

TEST_F(ReplicationTest, AFailureOrdersTheNewestMemoryCheckpointWrittenFromTheCopiesThatSurvived) {
  RegisterPeer("node-a", {0, 1}, "rack-1", 1);
  RegisterPeer("node-b", {2, 3}, "rack-2", 1);
  MustBeat("node-a");
  MustBeat("node-b");
  CommitStep(10);
  // Memory checkpoint 20, whose shards a raw write would make: written here
  // (as an emergency persist would write them), reported as kept in memory.
  std::vector<ckptd::v1::ShardReport> written;
  std::vector<ckptd::v1::MemoryCopy> all;
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ShardReport w, Write(20, r, 4, 0));
    ckptd::v1::ShardReport kept = w;
    kept.set_memory_only(true);
    CKPTD_ASSERT_OK(core_->ReportShard(ShardRequest(NodeOf(r), kept)).status());
    written.push_back(w);
    ckptd::v1::MemoryCopy c;
    c.set_job(kJob);
    c.set_rank(r);
    c.set_step(20);
    c.set_owner_node(NodeOf(r));
    c.set_file_length(w.shard().file_length());
    c.set_index_xxh3(w.shard().index_xxh3());
    all.push_back(c);
  }
  CKPTD_ASSERT_OK(BeatWithMemory("node-a", all).status());
  CKPTD_ASSERT_OK(BeatWithMemory("node-b", all).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::HeartbeatAck quiet, BeatWithMemory("node-a", all));
  EXPECT_EQ(quiet.persist_size(), 0) << "no failure, no order";

  // node-b is lost: node-a holds every copy, and is told to write all four.
  clock_.Advance(options_.node_lost_after + absl::Seconds(1));
  CKPTD_ASSERT_OK(BeatWithMemory("node-a", all).status());
  core_->Tick();
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::HeartbeatAck ack, BeatWithMemory("node-a", all));
  ASSERT_EQ(ack.persist_size(), 4);
  for (uint32_t r = 0; r < 4; ++r) {
    const ckptd::v1::PersistOrder& o = ack.persist(static_cast<int>(r));
    EXPECT_EQ(o.job(), kJob);
    EXPECT_EQ(o.step(), 20u);
    EXPECT_EQ(o.rank(), r);
    EXPECT_EQ(o.world_size(), 4u);
    EXPECT_EQ(o.owner_node(), NodeOf(r));
    EXPECT_EQ(o.file_length(), written[r].shard().file_length());
    EXPECT_EQ(o.index_xxh3(), written[r].shard().index_xxh3());
  }

  auto emergency = [&](const std::string& node, ckptd::v1::ShardReport rep) {
    rep.set_emergency(true);
    return core_->ReportShard(ShardRequest(node, rep));
  };
  // Another node than the one ordered, another digest, another incarnation:
  // refused, naming why.
  RegisterPeer("node-c", {}, "rack-3", 1);
  EXPECT_THAT(emergency("node-c", written[0]).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("node node-a writes the rank's copy")));
  ckptd::v1::ShardReport other = written[1];
  other.mutable_shard()->set_index_xxh3(other.shard().index_xxh3() + 1);
  EXPECT_THAT(emergency("node-a", other).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is not the one the memory checkpoint reported")));
  ckptd::v1::ShardReport later = written[1];
  later.set_incarnation(later.incarnation() + 7);
  EXPECT_THAT(emergency("node-a", later).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("of incarnation")));
  ckptd::v1::ShardReport wrong_step = written[1];
  wrong_step.set_step(30);
  EXPECT_THAT(emergency("node-a", wrong_step).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("is of step 20")));

  // The ordered reports commit step 20 durable; the orders end.
  for (uint32_t r = 0; r < 4; ++r) {
    CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ReportShardResponse resp, emergency("node-a", written[r]));
    EXPECT_EQ(resp.committed(), r == 3) << r;
  }
  EXPECT_EQ(JobState().newest_committed_step(), 20u);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::HeartbeatAck after, BeatWithMemory("node-a", all));
  EXPECT_EQ(after.persist_size(), 0);
  CKPTD_EXPECT_OK(emergency("node-c", written[0]).status()) << "a repeated report of a committed step";
}

}  // namespace
}  // namespace ckptd::coordinator
