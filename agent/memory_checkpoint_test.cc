// Memory checkpoints (Schedule.durable_every) on the agent: which snapshots
// stay in memory instead of going to storage, how they are described to the
// coordinator (the shard a raw write of them would be, none written), the
// trainer's counters, and restores of them from the agent's memory or a
// peer's, which never read the local tier or the storage root.
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent_core.h"
#include "agent/agent_service.h"
#include "agent/testing_agent_harness.h"
#include "base/status_macros.h"
#include "base/testing/capturing_logger.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "format/checksum.h"
#include "format/tensor_size.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replication/peer_service.h"
#include "replication/replica_store.h"
#include "replication/replicator.h"
#include "staging/staging.h"
#include "storage/fault_injection_file_system.h"
#include "storage/layout.h"
#include "storage/mem_file_system.h"
#include "storage/shard_index.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"
#include "storage/store.h"

namespace ckptd::agent {
namespace {

using ::ckptd::replication::PeerNetwork;
using ::ckptd::replication::PieceSource;
using ::ckptd::replication::Replica;
using ::ckptd::replication::ReplicaSink;
using ::ckptd::replication::ReplicaStore;
using ::ckptd::replication::ReplicaStoreOptions;
using ::ckptd::replication::Replicator;
using ::ckptd::replication::ReplicatorOptions;
using ::ckptd::replication::kReplicaPieceBytes;
using ::ckptd::testing::Eventually;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::Each;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::Optional;
using ::testing::SizeIs;
using ::testing::StartsWith;

// Rank 0 of a job of one rank: buffers of several 4096-byte blocks each
// (TestAgentOptions writes 4096-byte blocks), the last one short.
TrainerRegistration OneRank() {
  return {.job = "job",
          .rank = 0,
          .world_size = 1,
          .local_world_size = 1,
          .buffers = {Buffer("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 3000),
                      Buffer("adam", ckptd::v1::OPTIMIZER, ckptd::v1::FLOAT32, 6000),
                      Buffer("cursor", ckptd::v1::DATA_CURSOR, ckptd::v1::BYTES, 24)}};
}

// Rank 1 of a data-parallel job of two ranks, with the bytes of OneRank():
// params and adam the same on both ranks (replicated over "dp", written as
// this rank's half of the rows), the cursor its own.
TrainerRegistration DataParallelRank() {
  TrainerRegistration r = OneRank();
  r.rank = 1;
  r.world_size = 2;
  r.local_world_size = 1;
  const uint64_t rows[] = {120, 240};
  for (int i = 0; i < 2; ++i) {
    r.buffers[i].clear_shape();
    r.buffers[i].add_shape(rows[i]);
    r.buffers[i].add_shape(25);
    r.buffers[i].mutable_replica()->set_group("dp");
    r.buffers[i].mutable_replica()->set_count(2);
    r.buffers[i].mutable_replica()->set_index(1);
  }
  return r;
}

// A snapshot every step from step 0; every `durable_every`-th one durable.
ckptd::v1::Schedule EveryStep(uint64_t durable_every) {
  ckptd::v1::Schedule s;
  s.set_job("job");
  s.set_every_steps(1);
  s.set_durable_every(durable_every);
  return s;
}

// Forwards to a MemFileSystem and records each call as "<op> <path>".
class RecordingFileSystem : public storage::FileSystem {
 public:
  explicit RecordingFileSystem(storage::FileSystem* base) : base_(base) {}

  absl::StatusOr<std::unique_ptr<storage::WritableFile>> NewWritableFile(const std::string& path,
                                                                         const storage::OpenOptions& options) override {
    Note("write", path);
    return base_->NewWritableFile(path, options);
  }
  absl::StatusOr<std::unique_ptr<storage::ReadableFile>> NewReadableFile(const std::string& path,
                                                                         const storage::OpenOptions& options) override {
    Note("read", path);
    return base_->NewReadableFile(path, options);
  }
  absl::Status CreateDir(const std::string& path) override {
    Note("mkdir", path);
    return base_->CreateDir(path);
  }
  absl::Status RemoveFile(const std::string& path) override {
    Note("remove", path);
    return base_->RemoveFile(path);
  }
  absl::Status RemoveDir(const std::string& path) override {
    Note("rmdir", path);
    return base_->RemoveDir(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    Note("rename", from);
    Note("rename", to);
    return base_->Rename(from, to);
  }
  absl::Status SyncDir(const std::string& path) override {
    Note("syncdir", path);
    return base_->SyncDir(path);
  }
  absl::StatusOr<std::vector<storage::FileInfo>> ListDir(const std::string& path) override {
    Note("list", path);
    return base_->ListDir(path);
  }
  absl::StatusOr<storage::FileInfo> Stat(const std::string& path) override {
    Note("stat", path);
    return base_->Stat(path);
  }
  absl::Status RemoveTree(const std::string& path, const storage::RemoveTreeOptions& options) override {
    Note("rmtree", path);
    return base_->RemoveTree(path, options);
  }

  // The calls recorded since the last Clear() on `path` or below it.
  std::vector<std::string> CallsUnder(absl::string_view path) {
    absl::MutexLock l(&mu_);
    std::vector<std::string> out;
    for (const auto& [op, p] : calls_) {
      if (p == path || absl::StartsWith(p, absl::StrCat(path, "/"))) out.push_back(absl::StrCat(op, " ", p));
    }
    return out;
  }
  void Clear() {
    absl::MutexLock l(&mu_);
    calls_.clear();
  }

 private:
  void Note(absl::string_view op, const std::string& path) {
    absl::MutexLock l(&mu_);
    calls_.emplace_back(std::string(op), path);
  }

  storage::FileSystem* const base_;
  absl::Mutex mu_;
  std::vector<std::pair<std::string, std::string>> calls_ ABSL_GUARDED_BY(mu_);
};

// A coordinator whose schedule the test sets: it records shard and failure
// reports and restore-plan requests, and answers plans as the test scripts.
class ScriptedCoordinator : public CoordinatorClient {
 public:
  using Plan = std::function<ckptd::v1::RestorePlanResponse(const ckptd::v1::RestorePlanRequest&)>;
  explicit ScriptedCoordinator(std::optional<ckptd::v1::Schedule> schedule = std::nullopt)
      : schedule_(std::move(schedule)) {}

  void ShardDurable(const ckptd::v1::ShardReport& report) override {
    absl::MutexLock l(&mu_);
    reports_.push_back(report);
  }
  void Failure(const ckptd::v1::ReportFailureRequest& failure) override {
    absl::MutexLock l(&mu_);
    failures_.push_back(failure);
  }
  absl::StatusOr<ckptd::v1::RestorePlanResponse> RestorePlan(const ckptd::v1::RestorePlanRequest& request,
                                                             absl::Duration) override {
    Plan plan;
    {
      absl::MutexLock l(&mu_);
      requests_.push_back(request);
      plan = plan_;
    }
    if (!plan) return absl::UnavailableError("the test scripted no restore plan");
    return plan(request);
  }
  std::optional<ckptd::v1::Schedule> ScheduleFor(const std::string&) override {
    absl::MutexLock l(&mu_);
    return schedule_;
  }

  void SetPlan(Plan plan) {
    absl::MutexLock l(&mu_);
    plan_ = std::move(plan);
  }
  std::vector<ckptd::v1::ShardReport> reports() {
    absl::MutexLock l(&mu_);
    return reports_;
  }
  std::vector<ckptd::v1::RestorePlanRequest> requests() {
    absl::MutexLock l(&mu_);
    return requests_;
  }
  std::vector<ckptd::v1::ReportFailureRequest> failures() {
    absl::MutexLock l(&mu_);
    return failures_;
  }
  // The one report of `step` (a default one, and a test failure, otherwise).
  ckptd::v1::ShardReport ReportOf(uint64_t step) {
    std::vector<ckptd::v1::ShardReport> found;
    for (const ckptd::v1::ShardReport& r : reports()) {
      if (r.step() == step) found.push_back(r);
    }
    EXPECT_THAT(found, SizeIs(1)) << "reports of step " << step;
    return found.empty() ? ckptd::v1::ShardReport() : found.front();
  }

 private:
  absl::Mutex mu_;
  std::optional<ckptd::v1::Schedule> schedule_ ABSL_GUARDED_BY(mu_);
  Plan plan_ ABSL_GUARDED_BY(mu_);
  std::vector<ckptd::v1::ShardReport> reports_ ABSL_GUARDED_BY(mu_);
  std::vector<ckptd::v1::RestorePlanRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<ckptd::v1::ReportFailureRequest> failures_ ABSL_GUARDED_BY(mu_);
};

// The plan of a round over memory checkpoint `step` of shard `expected`
// (peers `peers`): LOAD until the rank reports an attempt, GO once it loaded
// it, FRESH_START when it could not (the coordinator's fall back, here with
// no durable step to fall back to).
ScriptedCoordinator::Plan MemoryRound(uint64_t step, const ckptd::v1::ShardRef& expected,
                                      std::vector<ckptd::v1::PeerCopy> peers = {}) {
  return [=](const ckptd::v1::RestorePlanRequest& req) {
    ckptd::v1::RestorePlanResponse r;
    r.set_incarnation(1);
    if (req.has_attempt() && !req.attempt_ok()) {
      r.set_verdict(ckptd::v1::RestorePlanResponse::FRESH_START);
      return r;
    }
    r.set_verdict(req.has_attempt() ? ckptd::v1::RestorePlanResponse::GO : ckptd::v1::RestorePlanResponse::LOAD);
    r.set_step(step);
    r.set_memory_step(true);
    *r.mutable_expected() = expected;
    for (const ckptd::v1::PeerCopy& p : peers) *r.add_peers() = p;
    return r;
  };
}

// Partners on one wire: a copy put to an address is fetched from it.
class LoopbackNetwork : public PeerNetwork {
 public:
  absl::Status Put(const std::string& address, const ckptd::v1::ReplicaHeader& header,
                   const PieceSource& source) override {
    std::string data(header.data_bytes(), '\0');
    for (uint64_t off = 0; off < data.size(); off += kReplicaPieceBytes) {
      const uint64_t n = std::min<uint64_t>(kReplicaPieceBytes, data.size() - off);
      CKPTD_ASSIGN_OR_RETURN(const absl::Span<const uint8_t> piece, source.piece(off, n));
      if (piece.size() != n) return absl::InternalError("a piece of the wrong size");
      std::memcpy(data.data() + off, piece.data(), n);
      if (source.still_valid) CKPTD_RETURN_IF_ERROR(source.still_valid());
    }
    absl::MutexLock l(&mu_);
    copies_[{address, header.key().job(), header.key().rank(), header.key().step()}] = {header, std::move(data)};
    return absl::OkStatus();
  }
  absl::StatusOr<ckptd::v1::ReplicaHeader> Fetch(const std::string& address, const ckptd::v1::ReplicaKey& key,
                                                 const std::string& ticket, const ReplicaSink& sink) override {
    absl::MutexLock l(&mu_);
    auto it = copies_.find({address, key.job(), key.rank(), key.step()});
    if (it == copies_.end()) return absl::NotFoundError(absl::StrCat(address, " holds no copy of that step"));
    CKPTD_ASSIGN_OR_RETURN(absl::Span<uint8_t> out, sink(it->second.header));
    if (out.size() != it->second.data.size()) return absl::InternalError("the sink wants another size");
    std::memcpy(out.data(), it->second.data.data(), out.size());
    return it->second.header;
  }
  // The copy of `step` of rank 0 of "job" put to `from` is held by `to` too,
  // with the byte at `damage` (if any) flipped.
  void Duplicate(const std::string& from, const std::string& to, uint64_t step,
                 std::optional<uint64_t> damage = std::nullopt) {
    absl::MutexLock l(&mu_);
    Copy c = copies_.at({from, "job", 0, step});
    if (damage) c.data.at(*damage) ^= 0xff;
    copies_[{to, "job", 0, step}] = std::move(c);
  }
  // The header of the copy of `step` of rank 0 of "job" put to `address`.
  std::optional<ckptd::v1::ReplicaHeader> HeaderOf(const std::string& address, uint64_t step) {
    absl::MutexLock l(&mu_);
    auto it = copies_.find({address, "job", 0, step});
    if (it == copies_.end()) return std::nullopt;
    return it->second.header;
  }

 private:
  struct Copy {
    ckptd::v1::ReplicaHeader header;
    std::string data;
  };
  absl::Mutex mu_;
  std::map<std::tuple<std::string, std::string, uint32_t, uint64_t>, Copy> copies_ ABSL_GUARDED_BY(mu_);
};

ckptd::v1::PeerCopy PeerAt(const std::string& node) {
  ckptd::v1::PeerCopy p;
  p.set_node_id(node);
  p.set_address(node);
  return p;
}

uint8_t StepFill(uint64_t step) { return static_cast<uint8_t>(step & 0xff); }

// A registered trainer: its handle and its own mapping of the segment.
struct Trainer {
  TrainerHandle h;
  std::unique_ptr<staging::StagingSegment> seg;
};

void Start(AgentCore& agent, Trainer* out, const TrainerRegistration& reg = OneRank()) {
  CKPTD_ASSERT_OK_AND_ASSIGN(out->h, agent.Register(reg));
  CKPTD_ASSERT_OK_AND_ASSIGN(out->seg, staging::StagingSegment::Open(out->h.segment));
}

// The trainer snapshots `step` (every byte StepFill(step)); waits until the
// agent persisted it or kept it as a memory checkpoint.
void Take(AgentCore& agent, const Trainer& t, uint64_t step) {
  ASSERT_NO_FATAL_FAILURE(Snapshot(agent, *t.seg, t.h, step));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.WaitPersisted(t.h.trainer_id, step, absl::Seconds(30)));
  ASSERT_TRUE(st.last_persisted_step == step || st.last_memory_step == step)
      << "step " << step << ": " << st.last_error;
}

// The slot of the trainer's segment that keeps `step`.
std::optional<uint32_t> KeptSlot(const Trainer& t, uint64_t step) {
  for (uint32_t i = 0; i < t.seg->slots(); ++i) {
    if (t.seg->state(i) == staging::SlotState::kKept && t.seg->step(i) == step) return i;
  }
  return std::nullopt;
}

// A raw write, into a file system of its own, of the snapshot of `step` held
// in `slot`, with the options the agent describes memory checkpoints with.
absl::StatusOr<storage::ShardWriteResult> RawWrite(const Trainer& t, uint32_t slot, uint64_t step,
                                                   const AgentOptions& options) {
  const TrainerRegistration reg = OneRank();
  std::vector<storage::TensorSource> sources(reg.buffers.size());
  for (size_t i = 0; i < reg.buffers.size(); ++i) {
    sources[i].meta = reg.buffers[i];
    sources[i].data = t.seg->slot_data(slot) + t.h.offsets[i];
    CKPTD_ASSIGN_OR_RETURN(sources[i].length, format::TensorByteLength(reg.buffers[i]));
  }
  storage::MemFileSystem fs;
  CKPTD_RETURN_IF_ERROR(fs.CreateDir("/raw"));
  return storage::WriteShard(&fs, storage::JoinPath("/raw", storage::ShardFileName(0)),
                             {reg.job, step, reg.rank, reg.world_size}, sources, MemoryShardOptions(options.write));
}

// Every byte of every registered buffer in `slot` is `fill`.
void ExpectHolds(const Trainer& t, uint32_t slot, uint8_t fill) {
  const TrainerRegistration reg = OneRank();
  for (size_t i = 0; i < reg.buffers.size(); ++i) {
    CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t length, format::TensorByteLength(reg.buffers[i]));
    const uint8_t* data = t.seg->slot_data(slot) + t.h.offsets[i];
    uint64_t wrong = 0;
    for (uint64_t b = 0; b < length; ++b) wrong += data[b] != fill;
    EXPECT_EQ(wrong, 0u) << "buffer " << reg.buffers[i].name() << ": bytes that are not " << int{fill};
  }
}

class MemoryCheckpointTest : public ::testing::Test {
 protected:
  MemoryCheckpointTest() {
    EXPECT_THAT(mem_.CreateDir("/ckpt"), IsOk());
    google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner> partners;
    ckptd::v1::ReplicationPartner* b = partners.Add();
    b->set_node_id("node-b");
    b->set_address("node-b");
    b->set_ticket("t");
    replicator_.SetPartners(partners);
  }

  // Node A's agent: coordinated by coord_, sending kept steps to node B.
  AgentOptions NodeA() {
    AgentOptions o = TestAgentOptions("memckpt-a");
    o.node_id = "node-a";
    o.coordinator = &coord_;
    o.replicator = &replicator_;
    return o;
  }

  // The trainer takes each of `steps`; each is sent to node B before the next.
  void TakeAll(AgentCore& agent, const Trainer& t, std::initializer_list<uint64_t> steps) {
    for (uint64_t step : steps) {
      ASSERT_NO_FATAL_FAILURE(Take(agent, t, step));
      ASSERT_TRUE(replicator_.WaitIdle(absl::Seconds(30))) << "step " << step;
    }
  }

  // Since fs_.Clear(), nothing under the storage root was touched, and
  // nothing of the local tier read (a fresh start clears the local tier's
  // steps; the memory checkpoint `step` has none).
  void ExpectStorageUntouched(uint64_t step) {
    EXPECT_THAT(fs_.CallsUnder("/ckpt"), IsEmpty());
    EXPECT_THAT(fs_.CallsUnder(storage::StepDir("/local", "job", step)), IsEmpty());
    EXPECT_THAT(fs_.CallsUnder("/local"), Each(Not(StartsWith("read "))));
  }

  // What the trainer's agent tells it (GetStatus).
  ckptd::v1::GetStatusResponse ServiceStatus(AgentCore& agent, const Trainer& t) {
    AgentService service(&agent);
    ckptd::v1::GetStatusRequest req;
    req.set_trainer_id(t.h.trainer_id);
    ckptd::v1::GetStatusResponse resp;
    EXPECT_TRUE(service.GetStatus(nullptr, &req, &resp).ok());
    return resp;
  }

  storage::MemFileSystem mem_;
  RecordingFileSystem fs_{&mem_};
  ScriptedCoordinator coord_{EveryStep(3)};
  LoopbackNetwork net_;
  Replicator replicator_{&net_, ReplicatorOptions()};
};

TEST_F(MemoryCheckpointTest, EveryThirdStepIsDurableTheOthersStayInMemoryAsRawShards) {
  const AgentOptions options = NodeA();
  AgentCore agent(&fs_, options);
  Trainer t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, &t));
  std::map<uint64_t, storage::ShardWriteResult> raw;
  for (uint64_t step = 1; step <= 6; ++step) {
    ASSERT_NO_FATAL_FAILURE(TakeAll(agent, t, {step}));
    if (step % 3 == 0) continue;
    // What a raw write of the very bytes kept would be.
    const std::optional<uint32_t> slot = KeptSlot(t, step);
    ASSERT_TRUE(slot.has_value()) << "memory checkpoint " << step << " is not kept";
    CKPTD_ASSERT_OK_AND_ASSIGN(raw[step], RawWrite(t, *slot, step, options));
  }

  ASSERT_THAT(coord_.reports(), SizeIs(6));
  for (uint64_t step = 1; step <= 6; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const ckptd::v1::ShardReport report = coord_.ReportOf(step);
    EXPECT_EQ(report.job(), "job");
    EXPECT_EQ(report.world_size(), 1u);
    EXPECT_EQ(report.shard().rank(), 0u);
    EXPECT_EQ(report.shard().file(), storage::ShardFileName(0));
    if (step % 3 == 0) {
      EXPECT_FALSE(report.memory_only());
      CKPTD_EXPECT_OK(mem_.Stat(storage::ShardPath("/ckpt", "job", step, 0)).status());
      continue;
    }
    EXPECT_TRUE(report.memory_only());
    // Nothing of it reached storage: not even its step directory.
    EXPECT_THAT(mem_.Stat(storage::StepDir("/ckpt", "job", step)).status(),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("step")));
    EXPECT_THAT(fs_.CallsUnder(storage::StepDir("/ckpt", "job", step)), IsEmpty());
    // The shard a raw write would be.
    const storage::ShardWriteResult& written = raw[step];
    EXPECT_EQ(report.shard().file_length(), written.file_length);
    EXPECT_EQ(report.shard().raw_bytes(), written.raw_bytes);
    EXPECT_EQ(report.shard().stored_bytes(), report.shard().raw_bytes()) << "raw blocks";
    // Its index, as sent to the partner, is the raw write's but for the time
    // it was made: made at the same time, it has the same digest.
    const std::optional<ckptd::v1::ReplicaHeader> sent = net_.HeaderOf("node-b", step);
    ASSERT_TRUE(sent.has_value());
    EXPECT_EQ(sent->index_xxh3(), report.shard().index_xxh3());
    EXPECT_EQ(format::Xxh3(sent->index()), report.shard().index_xxh3());
    ckptd::v1::ShardIndex index;
    ASSERT_TRUE(index.ParseFromString(sent->index()));
    index.set_created_unix_nanos(written.index->created_unix_nanos());
    EXPECT_EQ(index.SerializeAsString(), written.index->SerializeAsString());
    EXPECT_EQ(format::Xxh3(index.SerializeAsString()), written.index_xxh3);
  }
  // The newest memory checkpoint and the newest durable step stay in memory,
  // and the coordinator hears of both.
  EXPECT_TRUE(KeptSlot(t, 5).has_value());
  EXPECT_TRUE(KeptSlot(t, 6).has_value());
  ckptd::v1::Heartbeat hb;
  agent.FillHeartbeat(&hb);
  std::vector<uint64_t> in_memory;
  for (const ckptd::v1::MemoryCopy& c : hb.memory()) in_memory.push_back(c.step());
  EXPECT_THAT(in_memory, ::testing::UnorderedElementsAre(5, 6));
  // How long the last checkpoint took to reach the partner (the policy's Q).
  EXPECT_GT(hb.replicate_seconds(), 0);
  // And how its copies fared: every one taken, none failed.
  EXPECT_EQ(hb.replication_sent(), replicator_.Stats().sent);
  EXPECT_GT(hb.replication_sent(), 0u);
  EXPECT_EQ(hb.replication_failed(), 0u);
  EXPECT_EQ(hb.replication_error(), "");
  for (const ckptd::v1::MemoryCopy& c : hb.memory()) {
    if (c.step() != 5) continue;
    EXPECT_EQ(c.index_xxh3(), coord_.ReportOf(5).shard().index_xxh3());
    EXPECT_EQ(c.file_length(), coord_.ReportOf(5).shard().file_length());
  }
  EXPECT_THAT(coord_.failures(), IsEmpty());
  // The trainer takes a kept slot back for a snapshot (none is free): that
  // copy is gone, and no longer listed.
  const std::optional<uint32_t> slot_of_5 = KeptSlot(t, 5);
  const std::optional<uint32_t> slot_of_6 = KeptSlot(t, 6);
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t taken, t.seg->AcquireForFill(absl::ZeroDuration()));
  ASSERT_TRUE(taken == slot_of_5 || taken == slot_of_6);
  hb.Clear();
  agent.FillHeartbeat(&hb);
  in_memory.clear();
  for (const ckptd::v1::MemoryCopy& c : hb.memory()) in_memory.push_back(c.step());
  EXPECT_THAT(in_memory, ::testing::ElementsAre(taken == slot_of_5 ? 6u : 5u));
  CKPTD_ASSERT_OK(t.seg->Abandon(taken));
}

TEST_F(MemoryCheckpointTest, TheTrainersCountersTellMemoryCheckpointsFromPersists) {
  AgentCore agent(&fs_, NodeA());
  Trainer t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, &t));
  ASSERT_NO_FATAL_FAILURE(TakeAll(agent, t, {1, 2, 3, 4, 5, 6}));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(t.h.trainer_id));
  EXPECT_EQ(st.persisted, 2u);
  EXPECT_THAT(st.last_persisted_step, Optional(6u));
  EXPECT_EQ(st.memory_checkpoints, 4u);
  EXPECT_THAT(st.last_memory_step, Optional(5u));
  EXPECT_EQ(st.failed, 0u);
  const ckptd::v1::GetStatusResponse resp = ServiceStatus(agent, t);
  EXPECT_EQ(resp.persisted(), 2u);
  EXPECT_EQ(resp.last_persisted_step(), 6u);
  EXPECT_EQ(resp.memory_checkpoints(), 4u);
  EXPECT_TRUE(resp.has_memory_checkpoint());
  EXPECT_EQ(resp.last_memory_step(), 5u);

  // Before any memory checkpoint: none said.
  Trainer fresh;
  AgentOptions other = NodeA();
  other.segment_prefix += "-fresh";
  AgentCore second(&fs_, other);
  ASSERT_NO_FATAL_FAILURE(Start(second, &fresh));
  const ckptd::v1::GetStatusResponse none = ServiceStatus(second, fresh);
  EXPECT_EQ(none.memory_checkpoints(), 0u);
  EXPECT_FALSE(none.has_memory_checkpoint());
}

// At shutdown the newest snapshot may be a memory checkpoint: it is not
// written, and the durable one published before it is, not dropped.
TEST_F(MemoryCheckpointTest, AtShutdownANewerMemoryCheckpointDoesNotCostTheDurableStepBeforeIt) {
  ckptd::testing::CapturingLogger log;
  AgentOptions options = NodeA();
  options.logger = &log;
  options.slots = 4;
  storage::FaultInjectionFileSystem slow(&fs_);
  slow.SetLatency(absl::Milliseconds(20));  // a persist of a few hundred milliseconds
  auto agent = std::make_unique<AgentCore>(&slow, options);
  Trainer t;
  ASSERT_NO_FATAL_FAILURE(Start(*agent, &t));
  // Step 3 (durable) is being written; 6 (durable) and 7 (memory) wait.
  ASSERT_NO_FATAL_FAILURE(Snapshot(*agent, *t.seg, t.h, 3));
  ASSERT_TRUE(Eventually([&] { return mem_.Stat(absl::StrCat(storage::ShardPath("/ckpt", "job", 3, 0),
                                                             storage::kTempSuffix)).ok(); },
                         absl::Seconds(10)));
  ASSERT_NO_FATAL_FAILURE(Snapshot(*agent, *t.seg, t.h, 6));
  ASSERT_NO_FATAL_FAILURE(Snapshot(*agent, *t.seg, t.h, 7));
  agent->BeginShutdown(absl::Now() + absl::Seconds(60));
  agent.reset();
  CKPTD_EXPECT_OK(mem_.Stat(storage::ShardPath("/ckpt", "job", 6, 0)).status());
  EXPECT_FALSE(mem_.Stat(storage::StepDir("/ckpt", "job", 7)).ok());
  EXPECT_TRUE(log.Contains("shutting down: job job rank 0: step 7 is a memory checkpoint and is not written"));
  EXPECT_TRUE(log.Contains("shutting down: job job rank 0: step 6 is durable"));
}

TEST_F(MemoryCheckpointTest, ASnapshotOffTheScheduleIsDurable) {
  // Every second step, every second one of those durable: steps 2 and 6 are
  // memory checkpoints, 4 is durable, and 3 (a manual checkpoint the
  // coordinator did not ask for) is durable.
  ckptd::v1::Schedule s;
  s.set_job("job");
  s.set_every_steps(2);
  s.set_durable_every(2);
  ScriptedCoordinator coord(s);
  AgentOptions o = NodeA();
  o.coordinator = &coord;
  AgentCore agent(&fs_, o);
  Trainer t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, &t));
  ASSERT_NO_FATAL_FAILURE(TakeAll(agent, t, {2, 3, 4, 6}));
  EXPECT_TRUE(coord.ReportOf(2).memory_only());
  EXPECT_FALSE(coord.ReportOf(3).memory_only());
  EXPECT_FALSE(coord.ReportOf(4).memory_only());
  EXPECT_TRUE(coord.ReportOf(6).memory_only());
  CKPTD_EXPECT_OK(mem_.Stat(storage::ShardPath("/ckpt", "job", 3, 0)).status());
  CKPTD_EXPECT_OK(mem_.Stat(storage::ShardPath("/ckpt", "job", 4, 0)).status());
}

TEST_F(MemoryCheckpointTest, AMemoryStepRestoresFromTheAgentsMemoryWithoutReadingStorage) {
  AgentCore agent(&fs_, NodeA());
  Trainer t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, &t));
  ASSERT_NO_FATAL_FAILURE(TakeAll(agent, t, {1, 2}));
  coord_.SetPlan(MemoryRound(2, coord_.ReportOf(2).shard()));
  fs_.Clear();
  RestoreOptions ro;
  ro.client_verifies = true;
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(t.h.trainer_id, ro));
  EXPECT_THAT(r.step, Optional(2u));
  EXPECT_EQ(r.source, RestoreSource::kMemory);
  EXPECT_EQ(r.incarnation, 1u);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(t, r.slot, StepFill(2)));
  // The trainer checks the blocks as it copies them out.
  ASSERT_THAT(r.verify, Not(IsEmpty()));
  for (const BlockDigest& d : r.verify) {
    EXPECT_EQ(format::Xxh3(t.seg->slot_data(r.slot) + t.h.offsets[d.buffer] + d.offset, d.length), d.xxh3);
  }
  const std::vector<ckptd::v1::RestorePlanRequest> asked = coord_.requests();
  ASSERT_THAT(asked, SizeIs(2));
  EXPECT_TRUE(asked[1].attempt_ok()) << asked[1].problem();
  EXPECT_EQ(asked[1].attempt_step(), 2u);
  EXPECT_EQ(asked[1].attempt_source(), ckptd::v1::AGENT_MEMORY);
  EXPECT_THAT(fs_.CallsUnder("/ckpt"), IsEmpty()) << "no MANIFEST, no shard is read";
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(t.h.trainer_id));
  EXPECT_EQ(st.memory_restores, 1u);
  CKPTD_EXPECT_OK(t.seg->Release(r.slot));
}

// A restore of memory checkpoint 2 whose copy in memory is not the shard the
// plan expects (as `spoil` makes it) fails the attempt, naming the memory
// checkpoint, without reading the local tier or the storage root; the
// coordinator then falls back (here to a fresh start).
class MemoryRestoreFailsTest : public MemoryCheckpointTest {
 protected:
  void ExpectAttemptFails(const std::function<void(AgentCore&, ckptd::v1::ShardRef*)>& spoil) {
    AgentOptions o = NodeA();
    o.local_cache = "/local";
    AgentCore agent(&fs_, o);
    Trainer t;
    ASSERT_NO_FATAL_FAILURE(Start(agent, &t));
    ASSERT_NO_FATAL_FAILURE(TakeAll(agent, t, {1, 2}));
    ckptd::v1::ShardRef expected = coord_.ReportOf(2).shard();
    ASSERT_NO_FATAL_FAILURE(spoil(agent, &expected));
    coord_.SetPlan(MemoryRound(2, expected));
    fs_.Clear();
    CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(t.h.trainer_id, absl::Seconds(5)));
    EXPECT_EQ(r.step, std::nullopt) << "the coordinator sent every rank to a fresh start";
    const std::vector<ckptd::v1::RestorePlanRequest> asked = coord_.requests();
    ASSERT_THAT(asked, SizeIs(2));
    EXPECT_TRUE(asked[1].has_attempt());
    EXPECT_FALSE(asked[1].attempt_ok());
    EXPECT_EQ(asked[1].attempt_step(), 2u);
    EXPECT_THAT(asked[1].problem(), AllOf(HasSubstr("step 2 of job job is a memory checkpoint"),
                                          HasSubstr("no intact copy of rank 0"), HasSubstr("no copy on disk")));
    ExpectStorageUntouched(2);
  }
};

TEST_F(MemoryRestoreFailsTest, ACopyThatIsNotTheReportedShard) {
  ASSERT_NO_FATAL_FAILURE(
      ExpectAttemptFails([](AgentCore&, ckptd::v1::ShardRef* ref) { ref->set_index_xxh3(ref->index_xxh3() ^ 1); }));
}

TEST_F(MemoryRestoreFailsTest, ACopyOfAnotherLength) {
  ASSERT_NO_FATAL_FAILURE(ExpectAttemptFails(
      [](AgentCore&, ckptd::v1::ShardRef* ref) { ref->set_file_length(ref->file_length() + 4096); }));
}

TEST_F(MemoryRestoreFailsTest, ADamagedCopy) {
  ASSERT_NO_FATAL_FAILURE(ExpectAttemptFails([](AgentCore& agent, ckptd::v1::ShardRef*) {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::string what, agent.CorruptKeptStep("job", 0, 2));
    EXPECT_THAT(what, HasSubstr("step 2"));
  }));
}

TEST_F(MemoryRestoreFailsTest, ACopyThatIsGone) {
  AgentOptions o = NodeA();
  o.local_cache = "/local";
  AgentCore agent(&fs_, o);
  Trainer t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, &t));
  // Two slots: step 3 (durable) took the slot of step 1, step 4 that of step 2.
  ASSERT_NO_FATAL_FAILURE(TakeAll(agent, t, {1, 2, 3, 4}));
  ASSERT_FALSE(KeptSlot(t, 1).has_value());
  coord_.SetPlan(MemoryRound(1, coord_.ReportOf(1).shard()));
  fs_.Clear();
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, agent.Restore(t.h.trainer_id, absl::Seconds(5)));
  EXPECT_EQ(r.step, std::nullopt);
  const std::vector<ckptd::v1::RestorePlanRequest> asked = coord_.requests();
  ASSERT_THAT(asked, SizeIs(2));
  EXPECT_FALSE(asked[1].attempt_ok());
  EXPECT_THAT(asked[1].problem(), HasSubstr("step 1 of job job is a memory checkpoint"));
  ExpectStorageUntouched(1);
}

TEST_F(MemoryCheckpointTest, ALostNodesMemoryStepComesBackFromItsPartnersMemory) {
  {
    AgentCore a(&fs_, NodeA());
    Trainer t;
    ASSERT_NO_FATAL_FAILURE(Start(a, &t));
    ASSERT_NO_FATAL_FAILURE(TakeAll(a, t, {1, 2}));
  }
  const ckptd::v1::ShardRef expected = coord_.ReportOf(2).shard();
  // Node C takes the rank over: the plan names node B, which holds A's copy.
  for (bool right : {false, true}) {
    SCOPED_TRACE(right ? "the reported shard" : "another shard expected");
    ckptd::v1::ShardRef want = expected;
    if (!right) want.set_index_xxh3(want.index_xxh3() ^ 1);
    ScriptedCoordinator coord;
    coord.SetPlan(MemoryRound(2, want, {PeerAt("node-gone"), PeerAt("node-b")}));
    AgentOptions o = TestAgentOptions("memckpt-c");
    o.node_id = "node-c";
    o.coordinator = &coord;
    o.peer_network = &net_;
    AgentCore c(&fs_, o);
    Trainer t;
    ASSERT_NO_FATAL_FAILURE(Start(c, &t));
    fs_.Clear();
    CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, c.Restore(t.h.trainer_id, absl::Seconds(5)));
    const std::vector<ckptd::v1::RestorePlanRequest> asked = coord.requests();
    ASSERT_THAT(asked, SizeIs(2));
    EXPECT_EQ(asked[1].attempt_ok(), right) << asked[1].problem();
    CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, c.Status(t.h.trainer_id));
    if (right) {
      EXPECT_THAT(r.step, Optional(2u));
      EXPECT_EQ(r.source, RestoreSource::kPeer);
      EXPECT_EQ(asked[1].attempt_source(), ckptd::v1::PEER_MEMORY);
      ASSERT_NO_FATAL_FAILURE(ExpectHolds(t, r.slot, StepFill(2)));
      EXPECT_EQ(st.peer_restores, 1u);
      EXPECT_EQ(st.peer_rejected, 1u) << "node-gone";
      CKPTD_EXPECT_OK(t.seg->Release(r.slot));
    } else {
      EXPECT_EQ(r.step, std::nullopt);
      EXPECT_THAT(asked[1].problem(), HasSubstr("is a memory checkpoint"));
      EXPECT_EQ(st.peer_rejected, 2u);
    }
    EXPECT_THAT(fs_.CallsUnder("/ckpt"), IsEmpty());
  }
}

// Two peers hold the memory step, the first one's copy damaged: the next
// peer's copy is read, whether the agent finds the damage or the trainer
// does (then its reread skips the peer whose copy failed its check).
TEST_F(MemoryCheckpointTest, APeersDamagedCopyIsFollowedByTheNextPeersCopy) {
  {
    AgentCore a(&fs_, NodeA());
    Trainer t;
    ASSERT_NO_FATAL_FAILURE(Start(a, &t));
    ASSERT_NO_FATAL_FAILURE(TakeAll(a, t, {1, 2}));
  }
  ASSERT_TRUE(net_.HeaderOf("node-b", 2).has_value());
  net_.Duplicate("node-b", "node-d", 2);
  net_.Duplicate("node-b", "node-b", 2, /*damage=*/5000);
  for (bool client_verifies : {false, true}) {
    SCOPED_TRACE(client_verifies ? "the trainer checks" : "the agent checks");
    ScriptedCoordinator coord;
    coord.SetPlan(MemoryRound(2, coord_.ReportOf(2).shard(), {PeerAt("node-b"), PeerAt("node-d")}));
    AgentOptions o = TestAgentOptions("memckpt-c");
    o.node_id = "node-c";
    o.coordinator = &coord;
    o.peer_network = &net_;
    ckptd::testing::CapturingLogger log;
    o.logger = &log;
    AgentCore c(&fs_, o);
    Trainer t;
    ASSERT_NO_FATAL_FAILURE(Start(c, &t));
    RestoreOptions ro;
    ro.wait_for_slot = absl::Seconds(5);
    ro.client_verifies = client_verifies;
    CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, c.Restore(t.h.trainer_id, ro));
    ASSERT_THAT(r.step, Optional(2u));
    EXPECT_EQ(r.source, RestoreSource::kPeer);
    ASSERT_THAT(coord.requests(), SizeIs(2));
    EXPECT_TRUE(coord.requests()[1].attempt_ok()) << coord.requests()[1].problem();
    if (client_verifies) {
      // Handed over unchecked, node B's copy fails the trainer's check.
      EXPECT_EQ(t.seg->slot_data(r.slot)[5000], static_cast<uint8_t>(StepFill(2) ^ 0xff));
      CKPTD_ASSERT_OK(t.seg->Release(r.slot));
      ro.reread_step = 2;
      ro.reread_problem = "a block does not match its checksum";
      CKPTD_ASSERT_OK_AND_ASSIGN(r, c.Restore(t.h.trainer_id, ro));
      ASSERT_THAT(r.step, Optional(2u));
      EXPECT_EQ(r.source, RestoreSource::kPeer);
    }
    ASSERT_NO_FATAL_FAILURE(ExpectHolds(t, r.slot, StepFill(2)));
    CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, c.Status(t.h.trainer_id));
    EXPECT_EQ(st.peer_restores, client_verifies ? 2u : 1u);
    EXPECT_TRUE(log.Contains("step 2 copied from node node-d's memory")) << ::testing::PrintToString(log.lines());
    CKPTD_EXPECT_OK(t.seg->Release(r.slot));
  }
}

TEST_F(MemoryCheckpointTest, AMemoryStepTheTrainerFindsDamagedIsReadAgainFromAPeer) {
  AgentOptions o = NodeA();
  o.peer_network = &net_;
  AgentCore agent(&fs_, o);
  Trainer t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, &t));
  ASSERT_NO_FATAL_FAILURE(TakeAll(agent, t, {1, 2}));
  coord_.SetPlan(MemoryRound(2, coord_.ReportOf(2).shard(), {PeerAt("node-b")}));
  RestoreOptions ro;
  ro.client_verifies = true;
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult first, agent.Restore(t.h.trainer_id, ro));
  ASSERT_THAT(first.step, Optional(2u));
  ASSERT_EQ(first.source, RestoreSource::kMemory);
  CKPTD_ASSERT_OK(t.seg->Release(first.slot));
  // The trainer's check failed as it copied the step out: read once more,
  // from node B's copy (there is none on disk).
  fs_.Clear();
  ro.reread_step = 2;
  ro.reread_problem = "block 3 of buffer 'adam' does not match its checksum";
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult again, agent.Restore(t.h.trainer_id, ro));
  EXPECT_THAT(again.step, Optional(2u));
  EXPECT_EQ(again.source, RestoreSource::kPeer);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(t, again.slot, StepFill(2)));
  CKPTD_EXPECT_OK(t.seg->Release(again.slot));
  const std::vector<ckptd::v1::RestorePlanRequest> asked = coord_.requests();
  ASSERT_THAT(asked, SizeIs(3));
  EXPECT_TRUE(asked[2].reread());
  EXPECT_EQ(asked[2].attempt_source(), ckptd::v1::PEER_MEMORY);
  EXPECT_THAT(fs_.CallsUnder("/ckpt"), IsEmpty());

  // With no peer copy (nor partner) either, the reread fails and says why.
  ScriptedCoordinator coord(EveryStep(3));
  AgentOptions lone = TestAgentOptions("memckpt-nopeer");
  lone.coordinator = &coord;
  AgentCore other(&fs_, lone);
  Trainer u;
  ASSERT_NO_FATAL_FAILURE(Start(other, &u));
  for (uint64_t step : {1, 2}) ASSERT_NO_FATAL_FAILURE(Take(other, u, step));
  coord.SetPlan(MemoryRound(2, coord.ReportOf(2).shard()));
  RestoreOptions plain;
  plain.client_verifies = true;
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult mine, other.Restore(u.h.trainer_id, plain));
  ASSERT_EQ(mine.source, RestoreSource::kMemory);
  CKPTD_ASSERT_OK(u.seg->Release(mine.slot));
  plain.reread_step = 2;
  EXPECT_THAT(other.Restore(u.h.trainer_id, plain),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("step 2 of job job is a memory checkpoint")));
}

// --- Emergency persists (ckptd.v1.PersistOrder).

// The order to write rank 0's copy of memory checkpoint `step`, reported as
// `report`, held by `owner`'s memory.
ckptd::v1::PersistOrder OrderOf(const ckptd::v1::ShardReport& report, const std::string& owner) {
  ckptd::v1::PersistOrder o;
  o.set_job(report.job());
  o.set_step(report.step());
  o.set_rank(report.shard().rank());
  o.set_world_size(report.world_size());
  o.set_owner_node(owner);
  o.set_file_length(report.shard().file_length());
  o.set_index_xxh3(report.shard().index_xxh3());
  o.set_incarnation(report.incarnation());
  return o;
}

// The emergency reports `coord` received.
std::vector<ckptd::v1::ShardReport> EmergencyReports(ScriptedCoordinator& coord) {
  std::vector<ckptd::v1::ShardReport> out;
  for (const ckptd::v1::ShardReport& r : coord.reports()) {
    if (r.emergency()) out.push_back(r);
  }
  return out;
}

// The shard written for rank 0 of `step` reads back, every block verified,
// as bytes that are all `fill`.
void ExpectShardHolds(storage::FileSystem* fs, uint64_t step, uint8_t fill) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<storage::ShardReader> reader,
                             storage::ShardReader::Open(fs, storage::ShardPath("/ckpt", "job", step, 0)));
  const TrainerRegistration reg = OneRank();
  std::vector<std::string> bufs;
  std::vector<storage::TensorDest> dests;
  for (const ckptd::v1::Tensor& b : reg.buffers) {
    CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t length, format::TensorByteLength(b));
    bufs.emplace_back(length, '\0');
  }
  for (size_t i = 0; i < bufs.size(); ++i) dests.push_back({reg.buffers[i].name(), bufs[i].data(), bufs[i].size()});
  CKPTD_ASSERT_OK(reader->ReadTensors(dests));
  for (size_t i = 0; i < bufs.size(); ++i) {
    EXPECT_EQ(bufs[i], std::string(bufs[i].size(), static_cast<char>(fill))) << reg.buffers[i].name();
  }
}

TEST_F(MemoryCheckpointTest, AnOrderedEmergencyPersistWritesTheKeptStepAsTheShardItReported) {
  AgentCore agent(&fs_, NodeA());
  Trainer t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, &t));
  ASSERT_NO_FATAL_FAILURE(TakeAll(agent, t, {1, 2}));
  const ckptd::v1::ShardReport memory = coord_.ReportOf(2);
  ASSERT_TRUE(memory.memory_only());
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ShardReport done, agent.EmergencyPersist(OrderOf(memory, "node-a")));
  EXPECT_TRUE(done.emergency());
  EXPECT_FALSE(done.memory_only());
  EXPECT_EQ(done.incarnation(), memory.incarnation());
  EXPECT_EQ(done.shard().file_length(), memory.shard().file_length());
  EXPECT_EQ(done.shard().index_xxh3(), memory.shard().index_xxh3());
  EXPECT_EQ(done.shard().file(), storage::ShardFileName(0));
  ASSERT_THAT(EmergencyReports(coord_), SizeIs(1));
  EXPECT_EQ(EmergencyReports(coord_)[0].SerializeAsString(), done.SerializeAsString());
  CKPTD_ASSERT_OK_AND_ASSIGN(storage::FileInfo info, mem_.Stat(storage::ShardPath("/ckpt", "job", 2, 0)));
  EXPECT_EQ(info.size, memory.shard().file_length());
  ASSERT_NO_FATAL_FAILURE(ExpectShardHolds(&mem_, 2, StepFill(2)));
  // The copy stays in memory for a restore.
  EXPECT_TRUE(KeptSlot(t, 2).has_value());

  // What the order does not match is not written, and nothing is reported.
  struct Bad {
    std::string why;
    std::function<void(ckptd::v1::PersistOrder*)> change;
    absl::StatusCode code;
    std::string says;
  };
  const std::vector<Bad> bad = {
      {"another digest", [](auto* o) { o->set_index_xxh3(o->index_xxh3() ^ 1); }, absl::StatusCode::kNotFound,
       "holds no copy"},
      {"another length", [](auto* o) { o->set_file_length(o->file_length() + 1); }, absl::StatusCode::kNotFound,
       "holds no copy"},
      {"a step not kept", [](auto* o) { o->set_step(7); }, absl::StatusCode::kNotFound, "step 7 rank 0"},
      {"another rank",
       [](auto* o) {
         o->set_rank(1);
         o->set_world_size(2);
       },
       absl::StatusCode::kNotFound, "holds no copy"},
      {"a rank outside the world", [](auto* o) { o->set_rank(1); }, absl::StatusCode::kInvalidArgument,
       "not inside world size 1"},
      {"a hostile job name", [](auto* o) { o->set_job("../etc"); }, absl::StatusCode::kInvalidArgument, "job"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.why);
    ckptd::v1::PersistOrder o = OrderOf(coord_.ReportOf(1), "node-a");
    b.change(&o);
    EXPECT_THAT(agent.EmergencyPersist(o), StatusIs(b.code, AllOf(HasSubstr("emergency persist"), HasSubstr(b.says))));
  }
  EXPECT_THAT(mem_.Stat(storage::StepDir("/ckpt", "job", 1)).status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_THAT(EmergencyReports(coord_), SizeIs(1));
}

// A rank of a data-parallel job: its memory checkpoint's index describes
// its share of the replicated buffers (what a persist writes) with the
// checksums of the whole; a peer's copy of the whole comes back verified
// through them, and an emergency persist writes the share as reported.
TEST_F(MemoryCheckpointTest, ADataParallelRanksMemoryStepComesBackFromAPeerAndIsWrittenAsItsShare) {
  {
    AgentCore a(&fs_, NodeA());
    Trainer t;
    ASSERT_NO_FATAL_FAILURE(Start(a, &t, DataParallelRank()));
    ASSERT_NO_FATAL_FAILURE(TakeAll(a, t, {1, 2}));
  }
  const ckptd::v1::ShardReport memory = coord_.ReportOf(2);
  ASSERT_TRUE(memory.memory_only());
  ScriptedCoordinator coord;
  coord.SetPlan(MemoryRound(2, memory.shard(), {PeerAt("node-b")}));
  AgentOptions o = TestAgentOptions("memckpt-dp");
  o.node_id = "node-c";
  o.coordinator = &coord;
  o.peer_network = &net_;
  AgentCore c(&fs_, o);
  Trainer t;
  ASSERT_NO_FATAL_FAILURE(Start(c, &t, DataParallelRank()));
  CKPTD_ASSERT_OK_AND_ASSIGN(RestoreResult r, c.Restore(t.h.trainer_id, absl::Seconds(5)));
  EXPECT_THAT(r.step, Optional(2u));
  EXPECT_EQ(r.source, RestoreSource::kPeer);
  ASSERT_NO_FATAL_FAILURE(ExpectHolds(t, r.slot, StepFill(2)));
  CKPTD_EXPECT_OK(t.seg->Release(r.slot));
  // Node C now keeps the step: an emergency persist writes it, the shard
  // node A reported to the byte: half of params and adam, all of the cursor.
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ShardReport done, c.EmergencyPersist(OrderOf(memory, "node-c")));
  EXPECT_EQ(done.shard().file_length(), memory.shard().file_length());
  EXPECT_EQ(done.shard().index_xxh3(), memory.shard().index_xxh3());
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<storage::ShardReader> reader,
                             storage::ShardReader::Open(&mem_, storage::ShardPath("/ckpt", "job", 2, 1)));
  EXPECT_EQ(reader->index().raw_bytes(), (12000u + 24000u) / 2 + 24u);
  std::string half(6000, '\0');
  CKPTD_ASSERT_OK(reader->ReadTensors({{"params", half.data(), half.size()}}));
  EXPECT_EQ(half, std::string(6000, static_cast<char>(StepFill(2))));
  EXPECT_THAT(reader->FindTensor("params")->offsets(), ::testing::ElementsAre(60u, 0u));
}

TEST_F(MemoryCheckpointTest, AnEmergencyPersistOnAFullDiskFailsCleanlyAndCanBeTriedAgain) {
  storage::FaultInjectionFileSystem faulty(&fs_);
  AgentCore agent(&faulty, NodeA());
  Trainer t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, &t));
  ASSERT_NO_FATAL_FAILURE(TakeAll(agent, t, {1, 2}));
  const ckptd::v1::ShardReport memory = coord_.ReportOf(2);
  faulty.FailPath(storage::ShardFileName(0), storage::Fault::kEnospc, storage::FaultScope::kWrites);
  EXPECT_THAT(agent.EmergencyPersist(OrderOf(memory, "node-a")),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("emergency persist of job job step 2 rank 0")));
  EXPECT_THAT(EmergencyReports(coord_), IsEmpty());
  EXPECT_THAT(mem_.Stat(storage::StepDir("/ckpt", "job", 2)).status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  // The copy is still in memory: once the disk has room, the order succeeds.
  faulty.Reset();
  CKPTD_ASSERT_OK(agent.EmergencyPersist(OrderOf(memory, "node-a")).status());
  ASSERT_NO_FATAL_FAILURE(ExpectShardHolds(&mem_, 2, StepFill(2)));
}

TEST_F(MemoryCheckpointTest, AnExitedTrainersParkedStepIsWrittenFromItsMemory) {
  AgentCore agent(&fs_, NodeA());
  Trainer t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, &t));
  ASSERT_NO_FATAL_FAILURE(TakeAll(agent, t, {1, 2}));
  CKPTD_ASSERT_OK(agent.TrainerExited(t.h.trainer_id, /*died=*/true));
  const ckptd::v1::ShardReport memory = coord_.ReportOf(2);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ShardReport done, agent.EmergencyPersist(OrderOf(memory, "node-a")));
  EXPECT_EQ(done.shard().index_xxh3(), memory.shard().index_xxh3());
  ASSERT_NO_FATAL_FAILURE(ExpectShardHolds(&mem_, 2, StepFill(2)));
}

// Node B holds what node A sent it: node A's copies, as peer replication
// leaves them in node B's store.
class EmergencyFromPartnerTest : public MemoryCheckpointTest {
 protected:
  static ckptd::v1::ReplicaKey KeyOf(uint64_t step) {
    ckptd::v1::ReplicaKey key;
    key.set_job("job");
    key.set_rank(0);
    key.set_step(step);
    return key;
  }
  // Node A's trainer takes steps 1 and 2 (memory checkpoints) and node A
  // goes; node B holds what A sent it of step 2.
  void NodeATakesTwoStepsAndGoes() {
    {
      AgentCore a(&fs_, NodeA());
      Trainer t;
      ASSERT_NO_FATAL_FAILURE(Start(a, &t));
      ASSERT_NO_FATAL_FAILURE(TakeAll(a, t, {1, 2}));
    }
    ASSERT_NO_FATAL_FAILURE(HoldCopyOf(2));
  }
  void HoldCopyOf(uint64_t step) {
    const ckptd::v1::ReplicaKey key = KeyOf(step);
    std::unique_ptr<ReplicaStore::Reservation> reserved;
    auto sink = [&](const ckptd::v1::ReplicaHeader& h) -> absl::StatusOr<absl::Span<uint8_t>> {
      CKPTD_ASSIGN_OR_RETURN(reserved, store_.Reserve(h));
      return absl::Span<uint8_t>(reserved->replica().data(), reserved->replica().size());
    };
    CKPTD_ASSERT_OK(net_.Fetch("node-b", key, "", sink).status());
    store_.Keep(std::move(reserved));
  }
  AgentOptions NodeB() {
    AgentOptions o = TestAgentOptions("memckpt-b");
    o.node_id = "node-b";
    o.coordinator = &coord_;
    o.replicas = &store_;
    return o;
  }

  ReplicaStore store_{ReplicaStoreOptions()};
};

TEST_F(EmergencyFromPartnerTest, ALostNodesStepIsWrittenFromTheCopyItsPartnerHolds) {
  ASSERT_NO_FATAL_FAILURE(NodeATakesTwoStepsAndGoes());
  AgentCore b(&fs_, NodeB());
  const ckptd::v1::ShardReport memory = coord_.ReportOf(2);
  CKPTD_ASSERT_OK_AND_ASSIGN(ckptd::v1::ShardReport done, b.EmergencyPersist(OrderOf(memory, "node-a")));
  EXPECT_TRUE(done.emergency());
  EXPECT_EQ(done.shard().file_length(), memory.shard().file_length());
  EXPECT_EQ(done.shard().index_xxh3(), memory.shard().index_xxh3());
  ASSERT_NO_FATAL_FAILURE(ExpectShardHolds(&mem_, 2, StepFill(2)));
}

TEST_F(EmergencyFromPartnerTest, ADamagedCopyIsNotWrittenNorReported) {
  ASSERT_NO_FATAL_FAILURE(NodeATakesTwoStepsAndGoes());
  std::shared_ptr<const Replica> held = store_.Find(KeyOf(2));
  ASSERT_NE(held, nullptr);
  const_cast<uint8_t*>(held->data())[100] ^= 0x40;  // a bit flips in memory
  AgentCore b(&fs_, NodeB());
  const size_t reports = coord_.reports().size();
  EXPECT_THAT(b.EmergencyPersist(OrderOf(coord_.ReportOf(2), "node-a")),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("is not the one reported"), HasSubstr("the copy node node-a sent"))));
  // Nothing of it is left: not even its step directory.
  EXPECT_THAT(mem_.Stat(storage::StepDir("/ckpt", "job", 2)).status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_THAT(coord_.reports(), SizeIs(reports));
}

TEST_F(MemoryCheckpointTest, EachOrderIsCarriedOutOnceHoweverOftenTheHeartbeatsRepeatIt) {
  AgentCore agent(&fs_, NodeA());
  Trainer t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, &t));
  ASSERT_NO_FATAL_FAILURE(TakeAll(agent, t, {1, 2}));
  google::protobuf::RepeatedPtrField<ckptd::v1::PersistOrder> orders;
  *orders.Add() = OrderOf(coord_.ReportOf(2), "node-a");
  for (int i = 0; i < 5; ++i) agent.OnPersistOrders(orders);
  // An order of another step behind them: once it is reported, every order
  // before it was carried out (one at a time, in order).
  google::protobuf::RepeatedPtrField<ckptd::v1::PersistOrder> last;
  *last.Add() = OrderOf(coord_.ReportOf(1), "node-a");
  agent.OnPersistOrders(last);
  ASSERT_TRUE(Eventually([&] { return EmergencyReports(coord_).size() >= 2; }, absl::Seconds(30)));
  const std::vector<ckptd::v1::ShardReport> done = EmergencyReports(coord_);
  ASSERT_THAT(done, SizeIs(2));
  EXPECT_EQ(done[0].step(), 2u);
  EXPECT_EQ(done[1].step(), 1u);
  ASSERT_NO_FATAL_FAILURE(ExpectShardHolds(&mem_, 2, StepFill(2)));
  ASSERT_NO_FATAL_FAILURE(ExpectShardHolds(&mem_, 1, StepFill(1)));
}

TEST_F(MemoryCheckpointTest, WithoutACoordinatorEverySnapshotIsPersisted) {
  AgentOptions o = TestAgentOptions("memckpt-lone");
  AgentCore agent(&fs_, o);
  Trainer t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, &t));
  for (uint64_t step : {1, 2, 3}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *t.seg, t.h, step));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(t.h.trainer_id));
  EXPECT_EQ(st.persisted, 3u);
  EXPECT_EQ(st.memory_checkpoints, 0u);
  EXPECT_EQ(st.last_memory_step, std::nullopt);
  EXPECT_THAT(st.last_committed_step, Optional(3u));
}

TEST_F(MemoryCheckpointTest, WithoutTheMemoryTierEverySnapshotIsPersisted) {
  AgentOptions o = NodeA();
  o.keep_in_memory = false;
  AgentCore agent(&fs_, o);
  Trainer t;
  ASSERT_NO_FATAL_FAILURE(Start(agent, &t));
  for (uint64_t step : {1, 2, 3, 4}) ASSERT_NO_FATAL_FAILURE(SnapshotAndWait(agent, *t.seg, t.h, step));
  for (uint64_t step : {1, 2, 3, 4}) {
    EXPECT_FALSE(coord_.ReportOf(step).memory_only()) << "step " << step;
    CKPTD_EXPECT_OK(mem_.Stat(storage::ShardPath("/ckpt", "job", step, 0)).status()) << "step " << step;
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.Status(t.h.trainer_id));
  EXPECT_EQ(st.persisted, 4u);
  EXPECT_EQ(st.memory_checkpoints, 0u);
}

}  // namespace
}  // namespace ckptd::agent
