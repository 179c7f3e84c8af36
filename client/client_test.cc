#include "client/client.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "agent/agent_core.h"
#include "agent/agent_service.h"
#include "base/clock.h"
#include "base/testing/eventually.h"
#include "base/testing/matchers.h"
#include "base/testing/temp_dir.h"
#include "base/testing/users.h"
#include "client/fake_device_copier.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "staging/staging.h"
#include "storage/file_system.h"
#include "storage/mem_file_system.h"

namespace ckptd::client {
namespace {

using ::ckptd::testing::Eventually;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;

// The trainer state: all five components.
struct State {
  std::vector<float> params = std::vector<float>(1000);
  std::vector<float> grads = std::vector<float>(1000);
  std::vector<float> adam = std::vector<float>(2000);
  std::vector<uint8_t> rng = std::vector<uint8_t>(64);
  std::vector<uint8_t> cursor = std::vector<uint8_t>(16);

  void Step(uint64_t step) {
    for (size_t i = 0; i < params.size(); ++i) params[i] += 0.001f * static_cast<float>((i + step) % 7);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(step) * 0.5f - static_cast<float>(i % 3);
    for (size_t i = 0; i < adam.size(); ++i) adam[i] = adam[i] * 0.9f + static_cast<float>(step % 5);
    for (size_t i = 0; i < rng.size(); ++i) rng[i] = static_cast<uint8_t>(rng[i] * 31 + step);
    std::memcpy(cursor.data(), &step, sizeof(step));
  }
  bool operator==(const State& o) const {
    return params == o.params && grads == o.grads && adam == o.adam && rng == o.rng && cursor == o.cursor;
  }

  std::vector<BufferSpec> Specs() {
    auto spec = [](std::string name, ckptd::v1::Component c, ckptd::v1::DType d, uint64_t n, void* p) {
      BufferSpec b;
      b.name = std::move(name);
      b.component = c;
      b.dtype = d;
      b.shape = {n};
      b.data = p;
      return b;
    };
    return {spec("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, params.size(), params.data()),
            spec("grads", ckptd::v1::GRADS, ckptd::v1::FLOAT32, grads.size(), grads.data()),
            spec("adam", ckptd::v1::OPTIMIZER, ckptd::v1::FLOAT32, adam.size(), adam.data()),
            spec("rng", ckptd::v1::RNG, ckptd::v1::BYTES, rng.size(), rng.data()),
            spec("cursor", ckptd::v1::DATA_CURSOR, ckptd::v1::BYTES, cursor.size(), cursor.data())};
  }
  // params and adam on "cuda:0" (for FakeDeviceCopier, whose device memory
  // is host memory); the rest on the host.
  std::vector<BufferSpec> DeviceSpecs() {
    std::vector<BufferSpec> specs = Specs();
    for (int i : {0, 2}) {
      specs[i].device.set_kind(ckptd::v1::Device::CUDA);
      specs[i].device.set_index(0);
    }
    return specs;
  }
};

// A coordinator as the agent sees it: a fixed schedule, fresh starts.
class FixedScheduleCoordinator final : public agent::CoordinatorClient {
 public:
  explicit FixedScheduleCoordinator(uint64_t every) {
    schedule_.set_job("train");
    schedule_.set_generation(1);
    schedule_.set_every_steps(every);
    schedule_.set_state(ckptd::v1::JOB_RUNNING);
    schedule_.set_incarnation(1);
  }
  void ShardDurable(const ckptd::v1::ShardReport&) override {}
  void Failure(const ckptd::v1::ReportFailureRequest&) override {}
  absl::StatusOr<ckptd::v1::RestorePlanResponse> RestorePlan(const ckptd::v1::RestorePlanRequest&,
                                                             absl::Duration) override {
    ckptd::v1::RestorePlanResponse r;
    r.set_verdict(ckptd::v1::RestorePlanResponse::FRESH_START);
    r.set_incarnation(1);
    absl::MutexLock l(&mu_);
    r.set_warning(warning_);
    return r;
  }
  // What every restore plan from now on tells the trainer.
  void SetWarning(const std::string& warning) {
    absl::MutexLock l(&mu_);
    warning_ = warning;
  }
  std::optional<ckptd::v1::Schedule> ScheduleFor(const std::string&) override {
    absl::MutexLock l(&mu_);
    return schedule_;
  }
  void SetState(ckptd::v1::JobState state) {
    absl::MutexLock l(&mu_);
    schedule_.set_state(state);
  }

 private:
  absl::Mutex mu_;
  ckptd::v1::Schedule schedule_ ABSL_GUARDED_BY(mu_);
  std::string warning_ ABSL_GUARDED_BY(mu_);
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path();
    socket_ = dir_ + "/agent.sock";
    ASSERT_THAT(mem_.CreateDir("/ckpt"), IsOk());
    StartAgent();
  }
  void TearDown() override {
    StopAgent();
  }
  void StartAgent() {
    agent::AgentOptions o;
    o.storage_root = "/ckpt";
    o.io_threads = 1;
    o.prepare_inline_bytes = prepare_inline_bytes_;
    o.before_preparing_slot = before_preparing_slot_;
    o.first_trainer_id = 1;  // OpenSegment finds the n-th registration's
    o.segment_prefix = absl::StrCat("/ckptd-test-client-", ::getpid(), "-", counter_++);
    o.coordinator = coordinator_;
    segment_prefix_ = o.segment_prefix;
    core_ = std::make_unique<agent::AgentCore>(&mem_, o);
    service_ = std::make_unique<agent::AgentService>(core_.get());
    auto server = agent::StartUnixServer(socket_, service_.get());
    ASSERT_THAT(server.status(), IsOk());
    server_ = *std::move(server);
  }
  agent::CoordinatorClient* coordinator_ = nullptr;
  void StopAgent() {
    if (server_) server_->Shutdown();
    server_.reset();
    service_.reset();
    core_.reset();
  }
  ClientOptions Options() {
    ClientOptions o;
    o.socket = socket_;
    o.job = "train";
    o.every_steps = 5;
    o.slot_wait = absl::Seconds(5);
    o.rpc_timeout = absl::Seconds(2);
    return o;
  }
  // Device buffers through fake_.
  ClientOptions DeviceOptions() {
    ClientOptions o = Options();
    o.copier = &fake_;
    return o;
  }
  // Opens fake_'s lock gate after 100 ms, from a thread the caller joins.
  std::thread OpenLockGateSoon() {
    return std::thread([this] {
      absl::SleepFor(absl::Milliseconds(100));
      fake_.OpenLockGate();
    });
  }
  ClientOptions TwoHopOptions() {
    ClientOptions o = DeviceOptions();
    o.spare_device_buffer = true;
    return o;
  }
  // The staging segment of the agent's `trainer_id`-th registration, mapped
  // as a second trainer-side view.
  std::unique_ptr<staging::StagingSegment> OpenSegment(uint64_t trainer_id) {
    absl::StatusOr<std::unique_ptr<staging::StagingSegment>> seg =
        staging::StagingSegment::Open(absl::StrCat(segment_prefix_, "-", trainer_id));
    EXPECT_THAT(seg.status(), IsOk());
    return seg.ok() ? *std::move(seg) : nullptr;
  }
  // The agent's status of `trainer_id` once `done` holds, or after 20 s.
  agent::PersistStatus AgentStatusOnce(uint64_t trainer_id,
                                       const std::function<bool(const agent::PersistStatus&)>& done) {
    agent::PersistStatus last;
    (void)Eventually(
        [&] {
          absl::StatusOr<agent::PersistStatus> st = core_->Status(trainer_id);
          if (st.ok()) last = *st;
          return st.ok() && done(last);
        },
        absl::Seconds(20));
    return last;
  }

  uint64_t prepare_inline_bytes_ = uint64_t{64} << 20;  // the agent's default
  std::function<void(uint32_t slot)> before_preparing_slot_;  // the agent's hook
  static inline int counter_ = 0;
  FakeDeviceCopier fake_;  // outlives every client of a test
  base::FakeClock clock_;  // for ClientOptions::clock; outlives every client of a test
  std::string segment_prefix_;
  ckptd::testing::TempDir tmp_{"ckptd-client-"};
  std::string dir_, socket_;
  storage::MemFileSystem mem_;
  std::unique_ptr<agent::AgentCore> core_;
  std::unique_ptr<agent::AgentService> service_;
  std::unique_ptr<agent::UnixServer> server_;
};

TEST_F(ClientTest, SnapshotsOnScheduleAndRestoresAllFiveComponentsExactly) {
  State state;
  std::unique_ptr<Client> client;
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(client, Client::Connect(Options(), state.Specs()));
  }
  EXPECT_THAT(client->Restore(), ::ckptd::testing::IsOkAndHolds(std::nullopt));
  EXPECT_FALSE(client->ShouldSnapshot(0));
  EXPECT_FALSE(client->ShouldSnapshot(7));
  State at10;
  for (uint64_t step = 1; step <= 12; ++step) {
    state.Step(step);
    if (client->ShouldSnapshot(step)) {
      CKPTD_ASSERT_OK_AND_ASSIGN(SnapshotResult r, client->Snapshot(step));
      EXPECT_EQ(r.step, step);
      EXPECT_GE(r.stall_seconds, 0);
    }
    if (step == 10) at10 = state;
  }
  EXPECT_EQ(client->snapshots_taken(), 2u);
  CKPTD_ASSERT_OK(client->WaitPersisted(10, absl::Seconds(30)));
  ASSERT_FALSE(state == at10);
  EXPECT_THAT(client->Restore(), ::ckptd::testing::IsOkAndHolds(Optional(10u)));
  EXPECT_TRUE(state == at10);
}

// Issue 17: a restarted trainer gets the step from its agent's memory, and
// checks every block as it copies it out: a damaged copy is read again from
// disk, and the trainer ends with the step's exact bytes either way.
TEST_F(ClientTest, ARestartedTrainerRestoresFromMemoryAndADamagedCopyIsReadAgainFromDisk) {
  State state;
  State at5;
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(Options(), state.Specs()));
    for (uint64_t step = 1; step <= 5; ++step) state.Step(step);
    at5 = state;
    CKPTD_ASSERT_OK(client->Snapshot(5).status());
    CKPTD_ASSERT_OK(client->WaitPersisted(5, absl::Seconds(30)));
    // The trainer goes away (its staging stays with the agent).
  }
  for (int damaged : {0, 1}) {
    SCOPED_TRACE(damaged ? "damaged" : "intact");
    State fresh;
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(Options(), fresh.Specs()));
    const uint64_t id = 2 + static_cast<uint64_t>(damaged);
    std::unique_ptr<staging::StagingSegment> seg = OpenSegment(1);  // the first trainer's, taken over
    ASSERT_NE(seg, nullptr);
    if (damaged) {
      // A stray write into the kept copy of step 5 (its "adam" buffer).
      for (uint32_t slot = 0; slot < seg->slots(); ++slot) {
        if (seg->state(slot) == staging::SlotState::kKept && seg->step(slot) == 5) {
          seg->slot_data(slot)[3 * 4096 + 100] ^= 0x10;
        }
      }
    }
    EXPECT_THAT(client->Restore(), ::ckptd::testing::IsOkAndHolds(Optional(5u)));
    EXPECT_TRUE(fresh == at5);
    EXPECT_EQ(client->last_restore_source(), damaged ? "storage-root" : "memory");
    CKPTD_ASSERT_OK_AND_ASSIGN(agent::PersistStatus st, core_->Status(id));
    EXPECT_EQ(st.memory_rejected, damaged ? 1u : 0u);
  }
}

TEST_F(ClientTest, NoAgentIsABoundedError) {
  ClientOptions o = Options();
  o.socket = dir_ + "/nobody.sock";
  o.rpc_timeout = absl::Milliseconds(300);
  State state;
  const absl::Time t0 = absl::Now();
  EXPECT_THAT(Client::Connect(o, state.Specs()),
              AnyOf(StatusIs(absl::StatusCode::kUnavailable, HasSubstr("register")),
                    StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("register"))));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(30));  // generous: only "it returns"
}

// The attack of a shared node: another user serves on the name of the
// agent's socket, to receive this trainer's state and serve it restores. The
// trainer refuses it at once (not retried for connect_wait), naming the
// owner, and takes it when told that this user runs the node's agent.
TEST_F(ClientTest, ASocketOfAnotherUserIsRefusedNamingItsOwnerUnlessTrusted) {
  const std::vector<uint32_t> ids = ckptd::testing::UnusedIds(1);
  if (ids.empty() || ::chown(socket_.c_str(), ids[0], static_cast<gid_t>(-1)) != 0) {
    GTEST_SKIP() << "not root: cannot give the socket to another user";
  }
  State state;
  ClientOptions o = Options();
  o.connect_wait = absl::Hours(1);  // a refusal must not wait for it
  EXPECT_THAT(Client::Connect(o, state.Specs()),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr(absl::StrCat("the agent's socket ", socket_, " belongs to uid ", ids[0])),
                             HasSubstr(absl::StrCat("CKPTD_TRUSTED_AGENT_UIDS=", ids[0])))));
  EXPECT_THAT(core_->Trainers(), ::testing::IsEmpty());  // it never reached the agent
  o.connect_wait = absl::ZeroDuration();
  o.trusted_agent_uids = {ids[0]};
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> c, Client::Connect(o, state.Specs()));
  }
  // The same through the environment, as a launcher would set it.
  o.trusted_agent_uids.clear();
  ::setenv("CKPTD_TRUSTED_AGENT_UIDS", absl::StrCat("0,", ids[0]).c_str(), 1);
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(o, state.Specs());
  ::setenv("CKPTD_TRUSTED_AGENT_UIDS", "no-such-user-ckptd", 1);
  absl::StatusOr<std::unique_ptr<Client>> bad = Client::Connect(o, state.Specs());
  ::unsetenv("CKPTD_TRUSTED_AGENT_UIDS");
  EXPECT_THAT(c.status(), IsOk());
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("CKPTD_TRUSTED_AGENT_UIDS")));
}

TEST_F(ClientTest, AgentRestartIsReportedThenRecoveredFrom) {
  State state;
  ClientOptions o = Options();
  o.rpc_timeout = absl::Milliseconds(500);
  // Time stands still, and so does the sync thread: a sync that fails for the
  // old registration while the client registers with the new agent would have
  // it register once more, and WaitPersisted ask about a registration that
  // never snapshotted (a race of the client's own, not this test's subject).
  o.clock = &clock_;
  // Slots still held by the gone agent skip a snapshot instead of waiting.
  o.slot_wait = absl::ZeroDuration();
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.Specs()));
  CKPTD_ASSERT_OK(client->Snapshot(5).status());
  CKPTD_ASSERT_OK(client->WaitPersisted(5, absl::Seconds(30)));
  StopAgent();
  // The agent is gone: within a few attempts (once a notification has found it
  // gone) a snapshot says so.
  absl::Status seen;
  uint64_t step = 10;
  EXPECT_TRUE(Eventually(
      [&] {
        seen = client->Snapshot(step++).status();
        return !seen.ok() && !absl::IsResourceExhausted(seen);
      },
      absl::Seconds(10), absl::Milliseconds(50)));
  EXPECT_THAT(seen, AnyOf(StatusIs(absl::StatusCode::kUnavailable, HasSubstr("agent")),
                          StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("agent"))));
  StartAgent();
  // Registered again once its channel reaches the new agent.
  absl::Status back;
  EXPECT_TRUE(Eventually(
      [&] {
        back = client->Snapshot(100).status();
        return back.ok();
      },
      absl::Seconds(10), absl::Milliseconds(100)));
  CKPTD_ASSERT_OK(back);
  CKPTD_ASSERT_OK(client->WaitPersisted(100, absl::Seconds(30)));
}

TEST_F(ClientTest, RestoreWithAnotherLayoutNamesTheBuffer) {
  State state;
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(Options(), state.Specs()));
    CKPTD_ASSERT_OK(client->Snapshot(5).status());
    CKPTD_ASSERT_OK(client->WaitPersisted(5, absl::Seconds(30)));
  }
  State other;
  other.adam.resize(2001);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(Options(), other.Specs()));
  EXPECT_THAT(client->Restore(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("buffer 'adam'")));
}

// The first registration with a fresh agent gets trainer id 1.
constexpr uint64_t kFirstTrainer = 1;

TEST_F(ClientTest, SkippedSnapshotIsCountedAndReportedToTheAgent) {
  State state;
  ClientOptions o = Options();
  o.slot_wait = absl::ZeroDuration();
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.Specs()));
  // Another view of the staging holds every slot, as slow persists would.
  std::unique_ptr<staging::StagingSegment> seg = OpenSegment(kFirstTrainer);
  ASSERT_NE(seg, nullptr);
  std::vector<uint32_t> held;
  for (uint32_t i = 0; i < seg->slots(); ++i) {
    CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::ZeroDuration()));
    held.push_back(slot);
  }
  EXPECT_THAT(client->Snapshot(5), StatusIs(absl::StatusCode::kResourceExhausted,
                                            AllOf(HasSubstr("step 5 skipped"), HasSubstr("no free staging slot"))));
  EXPECT_EQ(client->snapshots_skipped(), 1u);
  EXPECT_EQ(client->snapshots_taken(), 0u);
  agent::PersistStatus st = AgentStatusOnce(kFirstTrainer, [](const agent::PersistStatus& s) { return s.skipped > 0; });
  EXPECT_EQ(st.skipped, 1u);
  EXPECT_THAT(st.last_skipped_step, Optional(5u));
  EXPECT_THAT(st.last_skip_reason, HasSubstr("no free staging slot"));

  for (uint32_t slot : held) CKPTD_ASSERT_OK(seg->Abandon(slot));
  CKPTD_ASSERT_OK(client->Snapshot(10).status());
  CKPTD_ASSERT_OK(client->WaitPersisted(10, absl::Seconds(30)));
  CKPTD_ASSERT_OK_AND_ASSIGN(st, core_->Status(kFirstTrainer));
  EXPECT_EQ(st.skipped, 1u);  // a snapshot taken is not a skip
  EXPECT_EQ(client->snapshots_skipped(), 1u);
}

TEST_F(ClientTest, TwoHopSnapshotReturnsAfterTheDeviceCopyAndRestoresExactly) {
  State state;
  std::unique_ptr<Client> client;
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(client, Client::Connect(TwoHopOptions(), state.DeviceSpecs()));
  }
  EXPECT_EQ(fake_.allocated(), 2);  // one spare per device buffer, at Connect
  fake_.TakeLog();
  state.Step(5);
  const State at5 = state;
  fake_.CloseGate();
  CKPTD_ASSERT_OK_AND_ASSIGN(SnapshotResult r, client->Snapshot(5));
  EXPECT_EQ(r.step, 5u);
  // Returned after the device-to-device copies (params, adam) and the host
  // buffers straight into the slot; the second hop is held at the gate.
  EXPECT_THAT(fake_.TakeLog(), ElementsAre("d2d 4000", "d2d 8000", "host 4000", "host 64", "host 16", "sync"));
  EXPECT_EQ(client->snapshots_taken(), 0u);
  // Training goes on and changes its device buffers: the spares hold step 5.
  state.Step(6);
  // Not published before the second hop: its slot is still being filled, so
  // the agent has nothing to persist.
  std::unique_ptr<staging::StagingSegment> seg = OpenSegment(kFirstTrainer);
  ASSERT_NE(seg, nullptr);
  uint32_t filling = 0;
  for (uint32_t i = 0; i < seg->slots(); ++i) {
    const staging::SlotState slot = seg->state(i);
    EXPECT_TRUE(slot == staging::SlotState::kFree || slot == staging::SlotState::kFilling) << i;
    if (slot == staging::SlotState::kFilling) ++filling;
  }
  EXPECT_EQ(filling, 1u);
  CKPTD_ASSERT_OK_AND_ASSIGN(agent::PersistStatus st, core_->Status(kFirstTrainer));
  EXPECT_EQ(st.last_persisted_step, std::nullopt);
  fake_.OpenGate();
  CKPTD_ASSERT_OK(client->WaitPersisted(5, absl::Seconds(30)));
  EXPECT_THAT(fake_.TakeLog(), ElementsAre("d2h 4000", "d2h 8000", "sync"));
  EXPECT_EQ(client->snapshots_taken(), 1u);
  ASSERT_FALSE(state == at5);
  EXPECT_THAT(client->Restore(), ::ckptd::testing::IsOkAndHolds(Optional(5u)));
  EXPECT_TRUE(state == at5);
  EXPECT_EQ(fake_.allocated(), 2);
  client.reset();
  EXPECT_EQ(fake_.live(), 0);  // the spares are freed with the client
  EXPECT_EQ(fake_.calls_on_no_device(), 0);  // the client's own threads chose their device
}

// Issue 16 (5): the trainer learns of failed persists without asking, and
// keeps counting across a restart of its agent.
TEST_F(ClientTest, FailedPersistsReachTheTrainerWithoutACall) {
  // A file where the job's folder goes: every persist of job "train" fails.
  CKPTD_ASSERT_OK(storage::WriteFileAtomically(&mem_, "/ckpt/train", "in the way"));
  State state;
  ClientOptions o = Options();
  o.sync_interval = absl::Milliseconds(10);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.Specs()));
  EXPECT_EQ(client->persist_failures().failed, 0u);
  EXPECT_EQ(client->persist_failures().last_failed_step, std::nullopt);
  CKPTD_ASSERT_OK(client->Snapshot(5).status());
  CKPTD_ASSERT_OK(client->Snapshot(10).status());
  ASSERT_TRUE(Eventually([&] { return client->persist_failures().failed == 2; }));
  PersistFailures f = client->persist_failures();
  EXPECT_THAT(f.last_failed_step, Optional(10u));
  EXPECT_THAT(f.last_error, HasSubstr("/ckpt/train"));
  EXPECT_THAT(client->WaitPersisted(10, absl::Seconds(10)),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("persisting step 10 failed")));
  // A restarted agent counts from 0 again; the client goes on from 2.
  StopAgent();
  StartAgent();
  uint64_t step = 15;
  ASSERT_TRUE(Eventually(
      [&] {
        (void)client->Snapshot(step++);
        return client->persist_failures().failed >= 3;
      },
      absl::Seconds(20), absl::Milliseconds(50)));
  f = client->persist_failures();
  EXPECT_GE(f.last_failed_step.value_or(0), 15u);
  // Room again: persists succeed (a failure of an earlier step does not fail
  // WaitPersisted of a later one), and the count stays.
  CKPTD_ASSERT_OK(mem_.RemoveFile("/ckpt/train"));
  const uint64_t failed = client->persist_failures().failed;
  CKPTD_ASSERT_OK(client->Snapshot(++step).status());
  CKPTD_ASSERT_OK(client->WaitPersisted(step, absl::Seconds(10)));
  EXPECT_GE(client->persist_failures().failed, failed);
  EXPECT_LE(client->persist_failures().failed, failed + 2);  // snapshots in flight when the file went
}

TEST_F(ClientTest, StepTimesWithAndWithoutAPersistInFlightReachTheAgentApart) {
  State state;
  ClientOptions o = TwoHopOptions();
  o.sync_interval = absl::Milliseconds(10);
  o.clock = &clock_;  // each step takes exactly as long as the test moves it
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.DeviceSpecs()));
  // Quick steps with nothing in flight.
  for (uint64_t step = 1; step <= 4; ++step) {
    (void)client->ShouldSnapshot(step);
    clock_.Advance(absl::Milliseconds(2));
  }
  // A snapshot whose second hop is held: the next steps are slow ones.
  fake_.CloseGate();
  CKPTD_ASSERT_OK(client->Snapshot(4).status());
  for (uint64_t step = 5; step <= 20; ++step) {
    (void)client->ShouldSnapshot(step);
    clock_.Advance(absl::Milliseconds(40));
  }
  fake_.OpenGate();
  CKPTD_ASSERT_OK(client->WaitPersisted(4, absl::Seconds(30)));
  (void)client->ShouldSnapshot(21);
  // The sync thread reports step 21 at one of its next intervals.
  int progress_size = 0;
  ckptd::v1::RankProgress p;
  EXPECT_TRUE(Eventually([&] {
    clock_.Advance(o.sync_interval);
    ckptd::v1::Heartbeat hb;
    core_->FillHeartbeat(&hb);
    progress_size = hb.progress_size();
    if (progress_size != 1) return true;
    p = hb.progress(0);
    return p.step() == 21;
  }));
  ASSERT_EQ(progress_size, 1);
  // The means move by a tenth of each sample: the slow ones started near the
  // quick ones and have come most of the way to 40 ms.
  ASSERT_EQ(p.step(), 21u);
  EXPECT_GT(p.step_seconds_idle(), 0.0015);
  EXPECT_LT(p.step_seconds_idle(), 0.02);
  EXPECT_GT(p.step_seconds_persisting(), 0.025);
  EXPECT_GT(p.step_seconds(), p.step_seconds_idle());  // over all steps
}

TEST_F(ClientTest, NextSnapshotWaitsForTheSecondHopOrSkipsWhenItOutlastsSlotWait) {
  State state;
  ClientOptions o = TwoHopOptions();
  o.slot_wait = absl::Seconds(2);
  o.clock = &clock_;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.DeviceSpecs()));
  fake_.CloseGate();
  CKPTD_ASSERT_OK(client->Snapshot(5).status());
  // Step 10 waits for step 5's second hop (as the sync thread waits for its
  // next interval) until slot_wait has passed.
  absl::StatusOr<SnapshotResult> skipped = absl::UnknownError("not run");
  std::thread waiting([&] { skipped = client->Snapshot(10); });
  EXPECT_TRUE(Eventually([&] { return clock_.waiters() == 2; }));
  clock_.Advance(o.slot_wait);
  waiting.join();
  EXPECT_THAT(skipped, StatusIs(absl::StatusCode::kResourceExhausted,
                                HasSubstr("step 10 skipped: the second hop of step 5 is still in flight")));
  EXPECT_EQ(client->snapshots_skipped(), 1u);
  agent::PersistStatus st = AgentStatusOnce(kFirstTrainer, [](const agent::PersistStatus& s) { return s.skipped > 0; });
  EXPECT_EQ(st.skipped, 1u);
  EXPECT_THAT(st.last_skipped_step, Optional(10u));
  EXPECT_THAT(st.last_skip_reason, HasSubstr("second hop of step 5"));

  fake_.TakeLog();
  std::thread opener([this] {
    // Once step 15 waits for step 5's second hop (time stands still).
    EXPECT_TRUE(Eventually([this] { return clock_.waiters() == 2; }));
    fake_.OpenGate();
  });
  CKPTD_ASSERT_OK(client->Snapshot(15).status());  // waits for step 5's second hop
  opener.join();
  CKPTD_ASSERT_OK(client->WaitPersisted(15, absl::Seconds(30)));
  // Step 5's second hop ended before step 15 touched the spares.
  EXPECT_THAT(fake_.TakeLog(), ElementsAre("d2h 4000", "d2h 8000", "sync",  // step 5, second hop
                                           "d2d 4000", "d2d 8000", "host 4000", "host 64", "host 16", "sync",
                                           "d2h 4000", "d2h 8000", "sync"));  // step 15
  EXPECT_EQ(client->snapshots_taken(), 2u);
  EXPECT_EQ(client->snapshots_skipped(), 1u);
}

TEST_F(ClientTest, FailedSecondHopIsReportedOnceByTheNextCallAndItsSlotGivenBack) {
  State state;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(TwoHopOptions(), state.DeviceSpecs()));
  std::unique_ptr<staging::StagingSegment> seg = OpenSegment(kFirstTrainer);
  ASSERT_NE(seg, nullptr);

  fake_.FailNextDeviceToHost(absl::InternalError("injected copy failure"));
  CKPTD_ASSERT_OK(client->Snapshot(5).status());
  EXPECT_THAT(client->WaitPersisted(5, absl::Seconds(30)),
              StatusIs(absl::StatusCode::kInternal,
                       AllOf(HasSubstr("second hop of the snapshot of step 5"), HasSubstr("injected copy failure"))));
  for (uint32_t i = 0; i < seg->slots(); ++i) EXPECT_EQ(seg->state(i), staging::SlotState::kFree) << i;
  EXPECT_EQ(client->snapshots_taken(), 0u);

  // Reported by the next Snapshot, which then takes nothing; only once.
  fake_.FailNextDeviceToHost(absl::InternalError("injected copy failure"));
  CKPTD_ASSERT_OK(client->Snapshot(10).status());
  EXPECT_THAT(client->Snapshot(15), StatusIs(absl::StatusCode::kInternal, HasSubstr("snapshot of step 10")));
  for (uint32_t i = 0; i < seg->slots(); ++i) EXPECT_EQ(seg->state(i), staging::SlotState::kFree) << i;
  // Every slot is usable again: more snapshots than slots, back to back.
  for (uint64_t step = 20; step < 20 + 2 * seg->slots() + 1; ++step) {
    state.Step(step);
    CKPTD_ASSERT_OK(client->Snapshot(step).status());
    CKPTD_ASSERT_OK(client->WaitPersisted(step, absl::Seconds(30)));
  }
  EXPECT_EQ(client->snapshots_taken(), 2 * seg->slots() + 1);
  EXPECT_EQ(client->snapshots_skipped(), 0u);
}

TEST_F(ClientTest, DestructorFinishesAndPublishesASecondHopInFlight) {
  State state;
  state.Step(5);
  const State at5 = state;
  std::atomic<bool> opened{false};
  {
    ClientOptions o = TwoHopOptions();
    o.clock = &clock_;  // its waiters show when the destructor has begun
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.DeviceSpecs()));
    fake_.CloseGate();
    CKPTD_ASSERT_OK(client->Snapshot(5).status());
    state.Step(6);
    // The sync thread alone waits on the clock (time stands still), until the
    // destructor stops it.
    EXPECT_TRUE(Eventually([&] { return clock_.waiters() == 1; }));
    std::thread opener([&] {
      // The destructor has begun, with the second hop held at the gate.
      EXPECT_TRUE(Eventually([&] { return clock_.waiters() == 0; }));
      opened = true;
      fake_.OpenGate();
    });
    client.reset();  // waits for the second hop, publishes it, says goodbye
    EXPECT_TRUE(opened);
    opener.join();
  }
  EXPECT_EQ(fake_.live(), 0);
  // The agent persisted the published step after the goodbye.
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> again, Client::Connect(TwoHopOptions(), state.DeviceSpecs()));
  EXPECT_THAT(again->Restore(), ::ckptd::testing::IsOkAndHolds(Optional(5u)));
  EXPECT_TRUE(state == at5);
}

TEST_F(ClientTest, SpareAllocationFailureFailsConnectWithoutLeaking) {
  State state;
  fake_.LimitAllocations(1);
  EXPECT_THAT(Client::Connect(TwoHopOptions(), state.DeviceSpecs()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("spare device buffer for 'adam'"), HasSubstr("fake device is full"))));
  EXPECT_EQ(fake_.allocated(), 1);
  EXPECT_EQ(fake_.live(), 0);

  // Spares allocated, then no agent to register with: freed all the same.
  fake_.LimitAllocations(1000);
  ClientOptions o = TwoHopOptions();
  o.socket = dir_ + "/nobody.sock";
  o.rpc_timeout = absl::Milliseconds(300);
  EXPECT_THAT(Client::Connect(o, state.DeviceSpecs()),
              AnyOf(StatusIs(absl::StatusCode::kUnavailable, HasSubstr("register")),
                    StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("register"))));
  EXPECT_EQ(fake_.allocated(), 3);
  EXPECT_EQ(fake_.live(), 0);
}

// A restarted trainer's device buffers come back from the agent's memory
// without page-locking the staging slot (locking costs more than the copy
// it speeds up): one copy per device buffer, beside the check of its blocks.
// A damaged block is found and the step read again from disk. Once the
// state is back, the slots are locked in the background, so that the first
// snapshot into each does not wait for it.
TEST_F(ClientTest, DeviceBuffersAreRestoredFromMemoryWithoutLockingTheSlot) {
  ClientOptions o = DeviceOptions();
  State state;
  state.Step(5);
  const State at5 = state;
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.DeviceSpecs()));
    CKPTD_ASSERT_OK(client->Snapshot(5).status());
    CKPTD_ASSERT_OK(client->WaitPersisted(5, absl::Seconds(30)));
    EXPECT_EQ(fake_.locks(), 1);  // the snapshot's slot, at the snapshot (no restore ran)
  }  // the trainer goes away (its staging stays with the agent)
  EXPECT_EQ(fake_.locked(), 0);
  for (int damaged : {0, 1}) {
    SCOPED_TRACE(damaged ? "damaged" : "intact");
    State fresh;
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, fresh.DeviceSpecs()));
    std::unique_ptr<staging::StagingSegment> seg = OpenSegment(kFirstTrainer);  // the first trainer's, taken over
    ASSERT_NE(seg, nullptr);
    if (damaged) {
      // A stray write into the kept copy of step 5, in "adam" (on the device).
      for (uint32_t slot = 0; slot < seg->slots(); ++slot) {
        if (seg->state(slot) == staging::SlotState::kKept && seg->step(slot) == 5) {
          seg->slot_data(slot)[3 * 4096 + 100] ^= 0x10;
        }
      }
    }
    const int locks = fake_.locks();
    fake_.TakeLog();
    fake_.CloseLockGate();  // locking waits; the restore must not
    EXPECT_THAT(client->Restore(), ::ckptd::testing::IsOkAndHolds(Optional(5u)));
    EXPECT_TRUE(fresh == at5);
    EXPECT_EQ(client->last_restore_source(), damaged ? "storage-root" : "memory");
    EXPECT_EQ(fake_.locks(), locks);
    if (!damaged) {
      // One copy per device buffer (params, adam); the host buffers are
      // copied by the checking threads.
      EXPECT_THAT(fake_.TakeLog(), ElementsAre("h2d 4000", "h2d 8000", "sync"));
    }
    // Then the locking thread locks every slot.
    EXPECT_TRUE(Eventually([&] { return fake_.lock_waiting() == 1; }));
    fake_.OpenLockGate();
    EXPECT_TRUE(Eventually([&] { return fake_.locked() == static_cast<int>(seg->slots()); }));
    EXPECT_EQ(fake_.locks(), locks + static_cast<int>(seg->slots()));
    if (damaged) {  // the last round: a snapshot finds its slot locked
      fresh.Step(6);
      CKPTD_ASSERT_OK(client->Snapshot(6).status());
      EXPECT_EQ(fake_.locks(), locks + static_cast<int>(seg->slots()));
      CKPTD_ASSERT_OK(client->WaitPersisted(6, absl::Seconds(30)));
    }
  }
  EXPECT_EQ(fake_.locked(), 0);  // unlocked when the trainers went
  EXPECT_EQ(fake_.calls_on_no_device(), 0);  // the client's own threads chose their device
}

// The locking thread never holds a trainer up for more than one slot: a
// client that goes away while it locks a slot waits for that one slot, and
// unlocks everything; a snapshot into a slot being locked waits for it
// instead of locking it twice; after a restart of the agent the slots of
// the new staging are locked in turn.
TEST_F(ClientTest, TheLockingThreadStopsWithTheClientAndFollowsANewAgent) {
  ClientOptions o = DeviceOptions();
  o.rpc_timeout = absl::Milliseconds(500);
  o.slot_wait = absl::ZeroDuration();
  State state;
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.DeviceSpecs()));
    fake_.CloseLockGate();
    CKPTD_ASSERT_OK(client->Restore().status());  // a fresh start: nothing to restore, the slots are locked after it
    ASSERT_TRUE(Eventually([&] { return fake_.lock_waiting() == 1; }));
    std::thread opener = OpenLockGateSoon();
    client.reset();  // waits for the slot being locked, not for the others
    opener.join();
    EXPECT_EQ(fake_.locked(), 0);
    EXPECT_EQ(fake_.locks(), 1);
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.DeviceSpecs()));
  fake_.CloseLockGate();
  CKPTD_ASSERT_OK(client->Restore().status());
  ASSERT_TRUE(Eventually([&] { return fake_.lock_waiting() == 1; }));
  // A snapshot now: into the slot being locked it waits for it; into the
  // other it locks that one itself, and the locking thread leaves it be.
  std::thread opener = OpenLockGateSoon();
  CKPTD_ASSERT_OK(client->Snapshot(1).status());
  opener.join();
  EXPECT_TRUE(Eventually([&] { return fake_.locked() == 2; }));
  EXPECT_EQ(fake_.locks(), 1 + 2);  // each slot once
  CKPTD_ASSERT_OK(client->WaitPersisted(1, absl::Seconds(30)));
  // The agent restarts: the client registers again (once, or again when a
  // call sent to the old agent fails late), unlocks the old staging and
  // locks the new one's slots in the background.
  StopAgent();
  StartAgent();
  uint64_t step = 10;
  EXPECT_TRUE(Eventually(
      [&] {
        (void)client->Snapshot(step++);
        return fake_.locks() >= 1 + 2 + 2 && fake_.locked() == 2;
      },
      absl::Seconds(10), absl::Milliseconds(50)))
      << fake_.locks() << " locks, " << fake_.locked() << " locked";
  client.reset();
  EXPECT_EQ(fake_.locked(), 0);
  EXPECT_EQ(fake_.calls_on_no_device(), 0);  // the client's own threads chose their device
}

// Staging the agent allocates in the background: the locking thread waits
// for each slot to be ready before it locks it.
TEST_F(ClientTest, SlotsStillBeingAllocatedAreLockedOnceReady) {
  StopAgent();
  prepare_inline_bytes_ = 0;  // every segment in the background
  StartAgent();
  State state;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(DeviceOptions(), state.DeviceSpecs()));
  CKPTD_ASSERT_OK(client->Restore().status());  // a fresh start
  EXPECT_TRUE(Eventually([&] { return fake_.locked() == 2; }));
  EXPECT_EQ(fake_.locks(), 2);
  client.reset();
  EXPECT_EQ(fake_.locked(), 0);
}

// Issue 41: a snapshot asked for by its step waits for the slots the agent
// still allocates (a large state's, in the background after it registered),
// up to prepare_wait; one the schedule asked for skips at once and says why.
TEST_F(ClientTest, AnExplicitSnapshotWaitsForSlotsBeingAllocatedAScheduledOneDoesNot) {
  absl::Notification allocate;
  StopAgent();
  prepare_inline_bytes_ = 0;  // every segment in the background
  before_preparing_slot_ = [&allocate](uint32_t) { allocate.WaitForNotification(); };
  StartAgent();
  State state;
  ClientOptions o = Options();
  o.slot_wait = absl::ZeroDuration();
  o.prepare_wait = absl::Milliseconds(300);
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.Specs()));
    EXPECT_THAT(client->Snapshot(5, SnapshotKind::kScheduled),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         AllOf(HasSubstr("snapshot of step 5 skipped"), HasSubstr("still allocating staging memory"),
                               HasSubstr("0 of 2 slots ready"), HasSubstr("asked for by its step waits"))));
    // prepare_wait bounds an explicit one.
    const absl::Time start = absl::Now();
    EXPECT_THAT(client->Snapshot(6), StatusIs(absl::StatusCode::kResourceExhausted,
                                              AllOf(HasSubstr("within 300ms (prepare_wait)"),
                                                    HasSubstr("still allocating staging memory"))));
    EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
    EXPECT_EQ(client->snapshots_skipped(), 2u);
  }
  o.prepare_wait = absl::Seconds(60);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.Specs()));
  absl::StatusOr<SnapshotResult> taken = absl::UnknownError("not run");
  absl::Notification done;
  std::thread snapshot([&] {
    taken = client->Snapshot(7);
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(300))) << taken.status();
  allocate.Notify();  // the first slot is ready: the snapshot goes in
  snapshot.join();
  CKPTD_ASSERT_OK(taken.status());
  CKPTD_ASSERT_OK(client->WaitPersisted(7, absl::Seconds(30)));
  client.reset();
  StopAgent();
  before_preparing_slot_ = nullptr;
}

// Issue 41: a scheduled snapshot skipped for want of a slot is taken at the
// next step that finds one (a job of one rank without a coordinator), not
// an interval later.
TEST_F(ClientTest, AScheduledSnapshotSkippedIsTakenAtTheNextStepThatFindsASlot) {
  State state;
  ClientOptions o = Options();  // every 5 steps
  o.slot_wait = absl::ZeroDuration();
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.Specs()));
  CKPTD_ASSERT_OK(client->Restore().status());
  std::unique_ptr<staging::StagingSegment> seg = OpenSegment(kFirstTrainer);
  ASSERT_NE(seg, nullptr);
  std::vector<uint32_t> held;
  for (uint32_t i = 0; i < seg->slots(); ++i) {
    CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg->AcquireForFill(absl::ZeroDuration()));
    held.push_back(slot);
  }
  EXPECT_FALSE(client->ShouldSnapshot(4));
  ASSERT_TRUE(client->ShouldSnapshot(5));
  EXPECT_THAT(client->Snapshot(5, SnapshotKind::kScheduled),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("still persisting")));
  EXPECT_FALSE(client->ShouldSnapshot(6));  // still no slot: no attempt
  CKPTD_ASSERT_OK(seg->Abandon(held.back()));
  held.pop_back();
  ASSERT_TRUE(client->ShouldSnapshot(7));  // a slot: the missed snapshot now
  CKPTD_ASSERT_OK(client->Snapshot(7, SnapshotKind::kScheduled).status());
  EXPECT_FALSE(client->ShouldSnapshot(8));  // caught up: the schedule again
  EXPECT_FALSE(client->ShouldSnapshot(9));
  EXPECT_TRUE(client->ShouldSnapshot(10));
  CKPTD_ASSERT_OK(client->WaitPersisted(7, absl::Seconds(30)));
  for (uint32_t slot : held) CKPTD_ASSERT_OK(seg->Abandon(slot));
}

// A rollback (a restore again in the same trainer) while the locking thread
// locks a slot waits for that slot first: a restore never copies out of
// staging while it is being locked.
TEST_F(ClientTest, ARollbackWaitsForTheSlotBeingLocked) {
  ClientOptions o = DeviceOptions();
  State state;
  state.Step(1);
  const State at1 = state;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.DeviceSpecs()));
  CKPTD_ASSERT_OK(client->Snapshot(1).status());
  CKPTD_ASSERT_OK(client->WaitPersisted(1, absl::Seconds(30)));
  fake_.CloseLockGate();
  state.Step(2);
  EXPECT_THAT(client->Restore(), ::ckptd::testing::IsOkAndHolds(Optional(1u)));
  EXPECT_TRUE(state == at1);
  // The locking thread now holds the other slot at the gate.
  ASSERT_TRUE(Eventually([&] { return fake_.lock_waiting() == 1; }));
  state.Step(3);
  std::thread opener = OpenLockGateSoon();
  EXPECT_THAT(client->Restore(), ::ckptd::testing::IsOkAndHolds(Optional(1u)));
  opener.join();
  EXPECT_TRUE(state == at1);
  EXPECT_EQ(fake_.copies_while_locking(), 0);
  EXPECT_TRUE(Eventually([&] { return fake_.locked() == 2; }));
  EXPECT_EQ(fake_.locks(), 2);  // each slot once
  EXPECT_EQ(fake_.calls_on_no_device(), 0);
}

// An agent that goes away takes its staging with it: the client unlocks the
// slots it had page-locked before letting the segment go (memory unmapped
// while still registered with the device runtime is an error there).
TEST_F(ClientTest, AnAgentThatGoesAwayHasItsSlotsUnlocked) {
  ClientOptions o = DeviceOptions();
  o.rpc_timeout = absl::Milliseconds(500);
  State state;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.DeviceSpecs()));
  CKPTD_ASSERT_OK(client->Snapshot(1).status());
  CKPTD_ASSERT_OK(client->WaitPersisted(1, absl::Seconds(30)));
  EXPECT_EQ(fake_.locked(), 1);
  StopAgent();
  EXPECT_THAT(client->WaitPersisted(2, absl::Seconds(5)),
              AnyOf(StatusIs(absl::StatusCode::kUnavailable, HasSubstr("agent")),
                    StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("agent"))));
  EXPECT_EQ(fake_.locked(), 0);
}

TEST_F(ClientTest, SpareOptionWithOnlyHostBuffersIsOneHop) {
  State state;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(TwoHopOptions(), state.Specs()));
  EXPECT_EQ(fake_.allocated(), 0);
  fake_.CloseGate();  // would hold a second hop; there is none
  CKPTD_ASSERT_OK(client->Snapshot(5).status());
  EXPECT_EQ(client->snapshots_taken(), 1u);  // published before Snapshot returned
  EXPECT_THAT(fake_.TakeLog(), ElementsAre("host 4000", "host 4000", "host 8000", "host 64", "host 16", "sync"));
  CKPTD_ASSERT_OK(client->WaitPersisted(5, absl::Seconds(30)));
}

TEST_F(ClientTest, CoordinatorScheduleReplacesEveryAndRestartIsRequestedThroughTheAgent) {
  FixedScheduleCoordinator coordinator(4);
  StopAgent();
  coordinator_ = &coordinator;
  StartAgent();
  State state;
  ClientOptions o = Options();
  o.every_steps = 7;  // ignored: the coordinator's schedule applies
  o.sync_interval = absl::Milliseconds(10);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.Specs()));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::optional<uint64_t> restored, client->Restore());
  EXPECT_EQ(restored, std::nullopt);
  // Once the sync thread has fetched the coordinator's schedule.
  EXPECT_TRUE(Eventually([&] { return client->ShouldSnapshot(8); }));
  EXPECT_FALSE(client->ShouldSnapshot(7));
  EXPECT_FALSE(client->restart_requested());
  coordinator.SetState(ckptd::v1::JOB_RESTARTING);
  EXPECT_TRUE(Eventually([&] { return client->restart_requested(); }));
  EXPECT_FALSE(client->ShouldSnapshot(12));  // no snapshots while the job restarts
  client.reset();
  StopAgent();
  coordinator_ = nullptr;
}

// What the coordinator's restore plan says the trainer should hear reaches
// the client through the agent, for the restore it came with only.
TEST_F(ClientTest, TheRestorePlansWarningReachesTheTrainerForThatRestoreOnly) {
  FixedScheduleCoordinator coordinator(4);
  StopAgent();
  coordinator_ = &coordinator;
  StartAgent();
  State state;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(Options(), state.Specs()));
  EXPECT_EQ(client->last_restore_warning(), "");  // before any restore
  const std::string said = "job train was used by a run that finished (every rank said goodbye); ...";
  coordinator.SetWarning(said);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::optional<uint64_t> restored, client->Restore());
  EXPECT_EQ(restored, std::nullopt);  // a fresh start is told too
  EXPECT_EQ(client->last_restore_warning(), said);
  coordinator.SetWarning("");
  CKPTD_ASSERT_OK(client->Restore().status());
  EXPECT_EQ(client->last_restore_warning(), "");
  client.reset();
  StopAgent();
  coordinator_ = nullptr;
}

TEST_F(ClientTest, AgentDyingWhileEverySlotIsHeldEndsTheSlotWaitAndAsksForARestart) {
  FixedScheduleCoordinator coordinator(5);
  StopAgent();
  coordinator_ = &coordinator;
  StartAgent();
  State state;
  ClientOptions o = Options();
  o.slot_wait = absl::Seconds(60);
  o.sync_interval = absl::Milliseconds(10);
  o.agent_loss_restart_after = absl::Milliseconds(300);
  o.clock = &clock_;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.Specs()));
  CKPTD_ASSERT_OK(client->Restore().status());
  std::unique_ptr<staging::StagingSegment> seg = OpenSegment(kFirstTrainer);
  ASSERT_NE(seg, nullptr);
  for (uint32_t i = 0; i < seg->slots(); ++i) CKPTD_ASSERT_OK(seg->AcquireForFill(absl::ZeroDuration()).status());
  absl::StatusOr<SnapshotResult> result = absl::UnknownError("not run");
  std::atomic<bool> done{false};
  const absl::Time start = clock_.Now();
  std::thread snapshot([&] {
    result = client->Snapshot(5);
    done = true;
  });
  // Time stands still: the snapshot waits for a slot, the sync thread for its
  // next interval.
  EXPECT_TRUE(Eventually([&] { return clock_.waiters() == 2; }));
  StopAgent();  // the agent dies holding every slot
  // The sync thread finds it unreachable, and the slot wait ends at its next round.
  EXPECT_TRUE(Eventually([&] {
    clock_.Advance(o.sync_interval);
    return done.load();
  }));
  snapshot.join();
  EXPECT_LT(clock_.Now() - start, o.slot_wait);  // not the 60 s slot wait
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("unreachable")));
  clock_.Advance(o.agent_loss_restart_after);
  EXPECT_TRUE(client->restart_requested());
  client.reset();
  coordinator_ = nullptr;
}

TEST_F(ClientTest, ConnectWaitsForAnAgentThatComesUpLate) {
  StopAgent();
  State state;
  ClientOptions o = Options();
  EXPECT_THAT(Client::Connect(o, state.Specs()).status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("")));
  o.connect_wait = absl::Seconds(20);
  o.clock = &clock_;
  absl::StatusOr<std::unique_ptr<Client>> client = absl::UnknownError("not run");
  std::atomic<bool> connected{false};
  std::thread connect([&] {
    client = Client::Connect(o, state.Specs());
    connected = true;
  });
  // Its first try found no agent: it waits on the clock before the next one.
  EXPECT_TRUE(Eventually([&] { return clock_.waiters() == 1; }));
  StartAgent();
  EXPECT_TRUE(Eventually([&] {
    clock_.Advance(absl::Milliseconds(200));
    return connected.load();
  }));
  connect.join();
  ASSERT_THAT(client.status(), IsOk());
  CKPTD_ASSERT_OK((*client)->Restore().status());
}

// An agent that answers a registration later than rpc_timeout (just
// restarted, its node's CPUs busy): Connect tries again within connect_wait.
class SlowFirstRegister : public agent::AgentService {
 public:
  using agent::AgentService::AgentService;
  grpc::Status Register(grpc::ServerContext* context, const ckptd::v1::RegisterRequest* req,
                        ckptd::v1::RegisterResponse* resp) override {
    if (calls.fetch_add(1) == 0) absl::SleepFor(absl::Milliseconds(900));
    return agent::AgentService::Register(context, req, resp);
  }
  std::atomic<int> calls{0};
};

TEST_F(ClientTest, ConnectTriesAgainWhenTheAgentAnswersItsRegistrationTooLate) {
  StopAgent();
  agent::AgentOptions ao;
  ao.storage_root = "/ckpt";
  ao.io_threads = 1;
  ao.segment_prefix = absl::StrCat("/ckptd-test-client-slow-", ::getpid());
  core_ = std::make_unique<agent::AgentCore>(&mem_, ao);
  auto slow = std::make_unique<SlowFirstRegister>(core_.get());
  SlowFirstRegister* service = slow.get();
  service_ = std::move(slow);  // the fixture stops the server before it goes
  CKPTD_ASSERT_OK_AND_ASSIGN(server_, agent::StartUnixServer(socket_, service));
  State state;
  ClientOptions o = Options();
  o.rpc_timeout = absl::Milliseconds(300);
  o.connect_wait = absl::Seconds(60);  // real time: the deadline of each try is
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.Specs()));
  EXPECT_GE(service->calls.load(), 2);
  CKPTD_EXPECT_OK(client->Restore().status());
  client.reset();
  server_->Shutdown();
  server_.reset();
  // Without connect_wait the late answer is the error.
  service->calls = 0;
  CKPTD_ASSERT_OK_AND_ASSIGN(server_, agent::StartUnixServer(socket_, service));
  o.connect_wait = absl::ZeroDuration();
  EXPECT_THAT(Client::Connect(o, state.Specs()).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("register")));
}

// An agent that answers status polls later than rpc_timeout while `late` is
// above zero (each late answer counts it down; below zero: always late), and
// counts registrations.
class LateStatus : public agent::AgentService {
 public:
  using agent::AgentService::AgentService;
  grpc::Status Register(grpc::ServerContext* context, const ckptd::v1::RegisterRequest* req,
                        ckptd::v1::RegisterResponse* resp) override {
    ++registrations;
    return agent::AgentService::Register(context, req, resp);
  }
  grpc::Status GetStatus(grpc::ServerContext* context, const ckptd::v1::GetStatusRequest* req,
                         ckptd::v1::GetStatusResponse* resp) override {
    if (late.load() != 0) {
      if (late.load() > 0) --late;
      absl::SleepFor(absl::Milliseconds(700));
    }
    return agent::AgentService::GetStatus(context, req, resp);
  }
  grpc::Status SnapshotPublished(grpc::ServerContext* context, const ckptd::v1::SnapshotPublishedRequest* req,
                                 ckptd::v1::SnapshotPublishedResponse* resp) override {
    if (late_published.load()) absl::SleepFor(absl::Milliseconds(700));
    ++published;
    return agent::AgentService::SnapshotPublished(context, req, resp);
  }
  std::atomic<int> late{0};
  std::atomic<bool> late_published{false};
  std::atomic<int> published{0};
  std::atomic<int> registrations{0};
};

class LateStatusTest : public ClientTest {
 protected:
  void SetUp() override {
    ClientTest::SetUp();
    StopAgent();
    agent::AgentOptions ao;
    ao.storage_root = "/ckpt";
    ao.io_threads = 1;
    ao.segment_prefix = absl::StrCat("/ckptd-test-client-late-", ::getpid());
    core_ = std::make_unique<agent::AgentCore>(&mem_, ao);
    auto late = std::make_unique<LateStatus>(core_.get());
    service = late.get();
    service_ = std::move(late);  // the fixture stops the server before it goes
    CKPTD_ASSERT_OK_AND_ASSIGN(server_, agent::StartUnixServer(socket_, service));
  }
  // A client with a 500 ms rpc_timeout; `registered` is the agent's count of
  // registrations once it connected.
  std::unique_ptr<Client> Connected() {
    ClientOptions o = Options();
    o.rpc_timeout = absl::Milliseconds(500);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(o, state.Specs());
    EXPECT_THAT(client.status(), IsOk());
    registered = service->registrations.load();
    return client.ok() ? *std::move(client) : nullptr;
  }
  // Step `step` is snapshotted and persisted, and the client is still the
  // registration it was.
  void ExpectPersistedUnderTheSameRegistration(Client& client, uint64_t step) {
    CKPTD_ASSERT_OK(client.Snapshot(step).status());
    CKPTD_EXPECT_OK(client.WaitPersisted(step, absl::Minutes(1)));
    EXPECT_EQ(service->registrations.load(), registered);
  }
  LateStatus* service = nullptr;
  State state;
  int registered = 0;
};

TEST_F(LateStatusTest, APollAnsweredTooLateIsAskedAgainAndTheClientStaysRegistered) {
  std::unique_ptr<Client> client = Connected();
  ASSERT_NE(client, nullptr);
  CKPTD_ASSERT_OK(client->Snapshot(5).status());
  service->late = 2;
  CKPTD_EXPECT_OK(client->WaitPersisted(5, absl::Minutes(1)));
  EXPECT_EQ(service->late.load(), 0);
  // Neither the registration nor the staging was given up for it.
  EXPECT_EQ(service->registrations.load(), registered);
  ExpectPersistedUnderTheSameRegistration(*client, 10);
}

TEST_F(LateStatusTest, AnAgentThatNeverAnswersInTimeFailsTheWaitAtItsDeadlineAndIsNotTakenForLost) {
  std::unique_ptr<Client> client = Connected();
  ASSERT_NE(client, nullptr);
  CKPTD_ASSERT_OK(client->Snapshot(5).status());
  service->late = -1;
  const absl::Time start = absl::Now();
  EXPECT_THAT(client->WaitPersisted(5, absl::Seconds(1)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("step 5 not known to be persisted within 1s"), HasSubstr("status (agent at"),
                             HasSubstr("polls not answered within 500ms (rpc_timeout)"))));
  // The deadline, and at most one poll more (and some slack).
  EXPECT_GE(absl::Now() - start, absl::Seconds(1));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1) + absl::Milliseconds(500) + absl::Seconds(2));
  // The agent answers again: the client goes on, under the same registration.
  service->late = 0;
  ExpectPersistedUnderTheSameRegistration(*client, 10);
}

TEST_F(LateStatusTest, ANotificationAnsweredTooLateLosesNothing) {
  std::unique_ptr<Client> client = Connected();
  ASSERT_NE(client, nullptr);
  service->late_published = true;
  CKPTD_ASSERT_OK(client->Snapshot(5).status());
  // The notification ran past its deadline (the agent finds the slot anyway).
  ASSERT_TRUE(Eventually([&] { return service->published.load() == 1; }));
  CKPTD_EXPECT_OK(client->WaitPersisted(5, absl::Minutes(1)));
  service->late_published = false;
  ExpectPersistedUnderTheSameRegistration(*client, 10);
}

TEST(ClientOptionsTest, ANonPositiveRpcTimeoutIsRefused) {
  ClientOptions o;
  o.socket = "/nonexistent/agent.sock";
  o.job = "train";
  for (absl::Duration bad : {absl::ZeroDuration(), absl::Milliseconds(-1)}) {
    o.rpc_timeout = bad;
    EXPECT_THAT(Client::Connect(o, {}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rpc_timeout")));
  }
}

}  // namespace
// A job with ranks on other nodes and no coordinator could never commit: the
// lone agent refuses it at registration, told by the option or by torchrun's
// $LOCAL_WORLD_SIZE.
TEST_F(ClientTest, AJobWithRanksOnOtherNodesIsRefusedWithoutACoordinator) {
  State state;
  ClientOptions o = Options();
  o.world_size = 4;
  o.rank = 1;
  o.local_world_size = 2;
  EXPECT_THAT(Client::Connect(o, state.Specs()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--coordinator")));

  o.local_world_size = 0;
  ASSERT_EQ(::setenv("LOCAL_WORLD_SIZE", "2", 1), 0);
  absl::Cleanup unset = [] { ::unsetenv("LOCAL_WORLD_SIZE"); };
  EXPECT_THAT(Client::Connect(o, state.Specs()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--coordinator")));
  // All four on this node: accepted.
  ASSERT_EQ(::setenv("LOCAL_WORLD_SIZE", "4", 1), 0);
  EXPECT_THAT(Client::Connect(o, state.Specs()).status(), IsOk());
}

}  // namespace ckptd::client
