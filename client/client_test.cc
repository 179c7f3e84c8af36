#include "client/client.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agent/agent_core.h"
#include "agent/agent_service.h"
#include "base/testing/matchers.h"
#include "base/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "staging/staging.h"
#include "storage/mem_file_system.h"

namespace ckptd::client {
namespace {

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

// A DeviceCopier whose "device" memory is ordinary host memory, so that the
// two-hop pipeline runs without a GPU. It logs every copy ("d2d <bytes>",
// "d2h", "h2d", "host" for host buffers, "sync"), can hold device-to-host
// copies at a gate, fail the next one, and fail an allocation.
class FakeDeviceCopier final : public DeviceCopier {
 public:
  absl::Status CopyToHost(void* dst, const void* src, size_t n, const ckptd::v1::Device& device) override {
    if (device.kind() == ckptd::v1::Device::HOST) return Copy("host", dst, src, n);
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(&open_));
    if (!fail_next_d2h_.ok()) return std::exchange(fail_next_d2h_, absl::OkStatus());
    std::memcpy(dst, src, n);
    log_.push_back(absl::StrCat("d2h ", n));
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(void* dst, const void* src, size_t n, const ckptd::v1::Device& device) override {
    return Copy(device.kind() == ckptd::v1::Device::HOST ? "host" : "h2d", dst, src, n);
  }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t n, const ckptd::v1::Device& device) override {
    return Copy(device.kind() == ckptd::v1::Device::HOST ? "host" : "d2d", dst, src, n);
  }
  absl::Status Synchronize() override {
    absl::MutexLock l(&mu_);
    log_.push_back("sync");
    return absl::OkStatus();
  }
  absl::Status RegisterHostMemory(void*, size_t) override { return absl::OkStatus(); }
  absl::Status UnregisterHostMemory(void*) override { return absl::OkStatus(); }
  absl::StatusOr<void*> AllocateOnDevice(size_t n, const ckptd::v1::Device&) override {
    absl::MutexLock l(&mu_);
    if (allocations_left_ == 0) return absl::ResourceExhaustedError("fake device is full");
    --allocations_left_;
    ++allocated_;
    ++live_;
    return static_cast<void*>(new uint8_t[n]);
  }
  void FreeOnDevice(void* p, const ckptd::v1::Device&) override {
    absl::MutexLock l(&mu_);
    --live_;
    delete[] static_cast<uint8_t*>(p);
  }

  void CloseGate() {
    absl::MutexLock l(&mu_);
    open_ = false;
  }
  void OpenGate() {
    absl::MutexLock l(&mu_);
    open_ = true;
  }
  void FailNextDeviceToHost(absl::Status s) {
    absl::MutexLock l(&mu_);
    fail_next_d2h_ = std::move(s);
  }
  void LimitAllocations(int n) {
    absl::MutexLock l(&mu_);
    allocations_left_ = n;
  }
  std::vector<std::string> TakeLog() {
    absl::MutexLock l(&mu_);
    return std::exchange(log_, {});
  }
  int allocated() {
    absl::MutexLock l(&mu_);
    return allocated_;
  }
  int live() {
    absl::MutexLock l(&mu_);
    return live_;
  }

 private:
  absl::Status Copy(const char* what, void* dst, const void* src, size_t n) {
    if (n > 0) std::memcpy(dst, src, n);
    absl::MutexLock l(&mu_);
    log_.push_back(absl::StrCat(what, " ", n));
    return absl::OkStatus();
  }

  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  absl::Status fail_next_d2h_ ABSL_GUARDED_BY(mu_);
  int allocations_left_ ABSL_GUARDED_BY(mu_) = 1000;
  int allocated_ ABSL_GUARDED_BY(mu_) = 0;
  int live_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
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
    return r;
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
  ClientOptions TwoHopOptions() {
    ClientOptions o = Options();
    o.spare_device_buffer = true;
    o.copier = &fake_;
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
    for (int i = 0; i < 2000; ++i) {
      absl::StatusOr<agent::PersistStatus> st = core_->Status(trainer_id);
      if (st.ok()) last = *st;
      if (st.ok() && done(last)) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return last;
  }

  static inline int counter_ = 0;
  FakeDeviceCopier fake_;  // outlives every client of a test
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

TEST_F(ClientTest, AgentRestartIsReportedThenRecoveredFrom) {
  State state;
  ClientOptions o = Options();
  o.rpc_timeout = absl::Milliseconds(500);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.Specs()));
  CKPTD_ASSERT_OK(client->Snapshot(5).status());
  CKPTD_ASSERT_OK(client->WaitPersisted(5, absl::Seconds(30)));
  StopAgent();
  // The agent is gone: within a few attempts a snapshot says so.
  absl::Status seen;
  for (int i = 0; i < 20 && seen.ok(); ++i) {
    seen = client->Snapshot(10 + i).status();
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_THAT(seen, AnyOf(StatusIs(absl::StatusCode::kUnavailable, HasSubstr("agent")),
                          StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("agent"))));
  StartAgent();
  absl::Status back;
  for (int i = 0; i < 40; ++i) {
    back = client->Snapshot(100).status();
    if (back.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
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
  absl::SleepFor(absl::Milliseconds(200));
  CKPTD_ASSERT_OK_AND_ASSIGN(agent::PersistStatus st, core_->Status(kFirstTrainer));
  EXPECT_EQ(st.last_persisted_step, std::nullopt);  // not published before the second hop
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
}

TEST_F(ClientTest, StepTimesWithAndWithoutAPersistInFlightReachTheAgentApart) {
  State state;
  ClientOptions o = TwoHopOptions();
  o.sync_interval = absl::Milliseconds(10);
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.DeviceSpecs()));
  // Quick steps with nothing in flight.
  for (uint64_t step = 1; step <= 4; ++step) {
    (void)client->ShouldSnapshot(step);
    absl::SleepFor(absl::Milliseconds(2));
  }
  // A snapshot whose second hop is held: the next steps are slow ones.
  fake_.CloseGate();
  CKPTD_ASSERT_OK(client->Snapshot(4).status());
  for (uint64_t step = 5; step <= 20; ++step) {
    (void)client->ShouldSnapshot(step);
    absl::SleepFor(absl::Milliseconds(40));
  }
  fake_.OpenGate();
  CKPTD_ASSERT_OK(client->WaitPersisted(4, absl::Seconds(30)));
  (void)client->ShouldSnapshot(21);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ckptd::v1::RankProgress p;
  while (absl::Now() < deadline) {
    ckptd::v1::Heartbeat hb;
    core_->FillHeartbeat(&hb);
    ASSERT_EQ(hb.progress_size(), 1);
    p = hb.progress(0);
    if (p.step() == 21) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
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
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.DeviceSpecs()));
  fake_.CloseGate();
  CKPTD_ASSERT_OK(client->Snapshot(5).status());
  EXPECT_THAT(client->Snapshot(10),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("step 10 skipped: the second hop of step 5 is still in flight")));
  EXPECT_EQ(client->snapshots_skipped(), 1u);
  agent::PersistStatus st = AgentStatusOnce(kFirstTrainer, [](const agent::PersistStatus& s) { return s.skipped > 0; });
  EXPECT_EQ(st.skipped, 1u);
  EXPECT_THAT(st.last_skipped_step, Optional(10u));
  EXPECT_THAT(st.last_skip_reason, HasSubstr("second hop of step 5"));

  fake_.TakeLog();
  std::thread opener([this] { fake_.OpenGate(); });
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
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(TwoHopOptions(), state.DeviceSpecs()));
    fake_.CloseGate();
    CKPTD_ASSERT_OK(client->Snapshot(5).status());
    state.Step(6);
    std::thread opener([&] {
      absl::SleepFor(absl::Milliseconds(300));
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
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!client->ShouldSnapshot(8) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(client->ShouldSnapshot(8));
  EXPECT_FALSE(client->ShouldSnapshot(7));
  EXPECT_FALSE(client->restart_requested());
  coordinator.SetState(ckptd::v1::JOB_RESTARTING);
  while (!client->restart_requested() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(client->restart_requested());
  EXPECT_FALSE(client->ShouldSnapshot(12));  // no snapshots while the job restarts
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
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(o, state.Specs()));
  CKPTD_ASSERT_OK(client->Restore().status());
  std::unique_ptr<staging::StagingSegment> seg = OpenSegment(kFirstTrainer);
  ASSERT_NE(seg, nullptr);
  for (uint32_t i = 0; i < seg->slots(); ++i) CKPTD_ASSERT_OK(seg->AcquireForFill(absl::ZeroDuration()).status());
  absl::StatusOr<SnapshotResult> result = absl::UnknownError("not run");
  const absl::Time start = absl::Now();
  std::thread snapshot([&] { result = client->Snapshot(5); });
  absl::SleepFor(absl::Milliseconds(200));
  StopAgent();  // the agent dies holding every slot
  snapshot.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // not the 60 s slot wait
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("unreachable")));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!client->restart_requested() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(client->restart_requested());
  client.reset();
  coordinator_ = nullptr;
}

TEST_F(ClientTest, ConnectWaitsForAnAgentThatComesUpLate) {
  StopAgent();
  State state;
  ClientOptions o = Options();
  EXPECT_THAT(Client::Connect(o, state.Specs()).status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("")));
  std::thread late([this] {
    absl::SleepFor(absl::Milliseconds(300));
    StartAgent();
  });
  o.connect_wait = absl::Seconds(20);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(o, state.Specs());
  late.join();
  ASSERT_THAT(client.status(), IsOk());
  CKPTD_ASSERT_OK((*client)->Restore().status());
}

}  // namespace
}  // namespace ckptd::client
