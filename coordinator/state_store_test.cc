#include "coordinator/state_store.h"

#include <sqlite3.h>
#include <stdlib.h>  // mkdtemp
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"  // testing_matchers.h uses its CONCAT macro
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/file_system.h"
#include "storage/posix_file_system.h"
#ifdef CKPTD_HAVE_ETCD
#include "base/random.h"
#include "base/testing/eventually.h"
#include "coordinator/etcd_state_store.h"
#include "etcd/testing_etcd.h"
#endif

namespace ckptd::coordinator {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::StatusIs;
using ::ckptd::v1::FailureEvent;
using ::ckptd::v1::FailureKind;
using ::ckptd::v1::JobRecord;
using ::ckptd::v1::QuarantinedStep;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAre;

FailureEvent Event(absl::string_view job, int64_t unix_nanos, FailureKind kind = v1::TRAINER_DIED,
                   absl::string_view detail = "") {
  FailureEvent e;
  e.set_job(std::string(job));
  e.set_unix_nanos(unix_nanos);
  e.set_kind(kind);
  e.set_node_id("node-1");
  e.set_has_rank(true);
  e.set_rank(3);
  e.set_detail(std::string(detail));
  return e;
}

JobRecord Job(absl::string_view name, uint64_t committed) {
  JobRecord r;
  r.set_job(std::string(name));
  r.set_world_size(8);
  r.set_step_seconds(1.5);
  r.set_checkpoints_committed(committed);
  r.set_updated_unix_nanos(1000 + static_cast<int64_t>(committed));
  v1::Schedule* s = r.mutable_schedule();
  s->set_job(std::string(name));
  s->set_generation(2);
  s->set_every_steps(100);
  s->add_extra_steps(7);
  s->set_state(v1::JOB_RUNNING);
  return r;
}

QuarantinedStep Quarantine(absl::string_view job, uint64_t step, absl::string_view reason) {
  QuarantinedStep q;
  q.set_job(std::string(job));
  q.set_step(step);
  q.set_reason(std::string(reason));
  q.set_unix_nanos(42);
  return q;
}

// Compares protos by their serialized bytes (the repo has no proto matcher).
MATCHER_P(EqualsProto, expected, "") { return arg.SerializeAsString() == expected.SerializeAsString(); }

std::vector<int64_t> Times(const std::vector<FailureEvent>& events) {
  std::vector<int64_t> out;
  for (const FailureEvent& e : events) out.push_back(e.unix_nanos());
  return out;
}
std::vector<std::string> Details(const std::vector<FailureEvent>& events) {
  std::vector<std::string> out;
  for (const FailureEvent& e : events) out.push_back(e.detail());
  return out;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = storage::JoinPath(::testing::TempDir(), "state_store_test_XXXXXX");
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    if (path_.empty()) return;
    auto fs = storage::NewPosixFileSystem({.use_io_uring = false});
    ::chmod(path_.c_str(), 0700);  // tests may have made it read-only
    // Best effort: a leftover temp dir does not fail a test.
    storage::RemoveTree(fs.get(), path_).IgnoreError();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

enum class Impl { kMem, kSqlite, kEtcd };

std::string ImplName(const ::testing::TestParamInfo<Impl>& info) {
  return info.param == Impl::kMem ? "Mem" : info.param == Impl::kSqlite ? "Sqlite" : "Etcd";
}

#ifdef CKPTD_HAVE_ETCD
// One etcd for every test of this binary (stopped when the tests end); each
// test its own prefix, leading it through an election of its own.
class EtcdForTests {
 public:
  // Null (with `why`) when etcd cannot start.
  static EtcdForTests* Get(std::string* why) {
    std::unique_ptr<EtcdForTests>& self = Instance();
    if (self == nullptr) {
      absl::StatusOr<std::unique_ptr<etcd::testing::EtcdCluster>> cluster = etcd::testing::EtcdCluster::Start(1);
      if (!cluster.ok()) {
        *why = cluster.status().ToString();
        return nullptr;
      }
      self.reset(new EtcdForTests(std::move(*cluster)));
    }
    return self.get();
  }
  // Stops the stores' elections, then etcd.
  static void Reset() { Instance().reset(); }

  // A store under a fresh prefix (or `prefix`), led by an election of its own.
  std::unique_ptr<StateStore> Open(const StateStoreOptions& options, std::string prefix = "") {
    if (prefix.empty()) prefix = absl::StrCat("/ckptd-test/", base::RandomHex(8).value());
    // A store reopened on the prefix: the one before it resigns.
    for (auto& earlier : elections_) {
      if (earlier->options().key == prefix + "/leader") earlier->Stop();
    }
    etcd::ElectionOptions e;
    e.key = prefix + "/leader";
    e.candidate = "test:1";
    e.lease_ttl_seconds = 10;
    auto election = std::make_unique<etcd::LeaderElection>(client_.get(), e);
    EXPECT_THAT(election->Start(), IsOk());
    EXPECT_TRUE(::ckptd::testing::Eventually([&] { return election->Leading().ok(); }));
    absl::StatusOr<std::unique_ptr<StateStore>> store =
        OpenEtcdStateStore(client_.get(), election.get(), EtcdStateStoreOptions{prefix, options.max_events, 1000});
    EXPECT_THAT(store.status(), IsOk());
    elections_.push_back(std::move(election));
    return store.ok() ? std::move(store).value() : nullptr;
  }

 private:
  explicit EtcdForTests(std::unique_ptr<etcd::testing::EtcdCluster> cluster) : cluster_(std::move(cluster)) {
    etcd::EtcdOptions options;
    options.endpoints = {cluster_->endpoints()};
    client_ = std::move(etcd::EtcdClient::Connect(options).value());
  }
  static std::unique_ptr<EtcdForTests>& Instance() {
    static std::unique_ptr<EtcdForTests>* instance = new std::unique_ptr<EtcdForTests>();
    return *instance;
  }
  // Destroyed last to first: the elections, the client, then etcd.
  std::unique_ptr<etcd::testing::EtcdCluster> cluster_;
  std::unique_ptr<etcd::EtcdClient> client_;
  std::vector<std::unique_ptr<etcd::LeaderElection>> elections_;  // kept: stores refer to them
};

class StopEtcdAtTheEnd : public ::testing::Environment {
 public:
  void TearDown() override { EtcdForTests::Reset(); }
};
::testing::Environment* const kStopEtcd = ::testing::AddGlobalTestEnvironment(new StopEtcdAtTheEnd);
#endif

// The contract every StateStore keeps.
class StateStoreConformanceTest : public ::testing::TestWithParam<Impl> {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty()) << "mkdtemp: " << std::strerror(errno);
    store_ = Open({});
    if (store_ == nullptr && GetParam() == Impl::kEtcd && !HasFailure()) {
      GTEST_SKIP() << "no etcd on $PATH (Debian: etcd-server)";
    }
    ASSERT_NE(store_, nullptr);
  }

  std::unique_ptr<StateStore> Open(const StateStoreOptions& options) {
    if (GetParam() == Impl::kMem) return NewMemStateStore(options);
#ifdef CKPTD_HAVE_ETCD
    if (GetParam() == Impl::kEtcd) {
      std::string why;
      EtcdForTests* etcd = EtcdForTests::Get(&why);
      if (etcd == nullptr) {
        if (etcd::testing::EtcdRequired()) ADD_FAILURE() << why;
        return nullptr;
      }
      if (prefix_.empty()) prefix_ = absl::StrCat("/ckptd-test/", base::RandomHex(8).value());
      return etcd->Open(options, prefix_);
    }
#endif
    absl::StatusOr<std::unique_ptr<StateStore>> store =
        OpenSqliteStateStore(storage::JoinPath(dir_.path(), "state"), options);
    EXPECT_THAT(store.status(), IsOk());
    return store.ok() ? std::move(store).value() : nullptr;
  }

  TempDir dir_;
  std::string prefix_;  // etcd: this test's keys
  std::unique_ptr<StateStore> store_;
};

TEST_P(StateStoreConformanceTest, EmptyStoreListsNothing) {
  EXPECT_THAT(store_->ListEvents("", 10), ::ckptd::testing::IsOkAndHolds(IsEmpty()));
  EXPECT_THAT(store_->ListEvents("job", 10), ::ckptd::testing::IsOkAndHolds(IsEmpty()));
  EXPECT_THAT(store_->CountEvents("", absl::InfinitePast()), ::ckptd::testing::IsOkAndHolds(0u));
  EXPECT_THAT(store_->CountEventsByKind("", absl::InfinitePast()), ::ckptd::testing::IsOkAndHolds(IsEmpty()));
  EXPECT_THAT(store_->ListJobs(), ::ckptd::testing::IsOkAndHolds(IsEmpty()));
  EXPECT_THAT(store_->ListQuarantined(""), ::ckptd::testing::IsOkAndHolds(IsEmpty()));
}

TEST_P(StateStoreConformanceTest, EventsRoundTripNewestFirst) {
  const FailureEvent first = Event("a", 100, v1::NODE_LOST, "first");
  CKPTD_ASSERT_OK(store_->AppendEvent(first));
  CKPTD_ASSERT_OK(store_->AppendEvent(Event("a", 300, v1::TRAINER_HUNG, "third")));
  CKPTD_ASSERT_OK(store_->AppendEvent(Event("a", 200, v1::TRAINER_DIED, "second")));  // appended late

  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FailureEvent> events, store_->ListEvents("a", 10));
  EXPECT_THAT(Times(events), ElementsAre(300, 200, 100));
  EXPECT_THAT(events.back(), EqualsProto(first));

  CKPTD_ASSERT_OK_AND_ASSIGN(events, store_->ListEvents("a", 2));
  EXPECT_THAT(Times(events), ElementsAre(300, 200));
  CKPTD_ASSERT_OK_AND_ASSIGN(events, store_->ListEvents("a", 0));
  EXPECT_THAT(events, IsEmpty());
}

TEST_P(StateStoreConformanceTest, EqualTimesListLastAppendedFirst) {
  for (const char* d : {"x", "y", "z"}) CKPTD_ASSERT_OK(store_->AppendEvent(Event("a", 5, v1::NODE_LOST, d)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FailureEvent> events, store_->ListEvents("", 10));
  EXPECT_THAT(Details(events), ElementsAre("z", "y", "x"));
}

TEST_P(StateStoreConformanceTest, ListEventsFiltersByJob) {
  CKPTD_ASSERT_OK(store_->AppendEvent(Event("a", 1)));
  CKPTD_ASSERT_OK(store_->AppendEvent(Event("b", 2)));
  CKPTD_ASSERT_OK(store_->AppendEvent(Event("a", 3)));
  CKPTD_ASSERT_OK(store_->AppendEvent(Event("", 4, v1::NODE_LOST)));  // a node, no job
  CKPTD_ASSERT_OK(store_->AppendEvent(Event("ab", 5)));

  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FailureEvent> events, store_->ListEvents("a", 10));
  EXPECT_THAT(Times(events), ElementsAre(3, 1));
  CKPTD_ASSERT_OK_AND_ASSIGN(events, store_->ListEvents("b", 10));
  EXPECT_THAT(Times(events), ElementsAre(2));
  CKPTD_ASSERT_OK_AND_ASSIGN(events, store_->ListEvents("", 10));
  EXPECT_THAT(Times(events), ElementsAre(5, 4, 3, 2, 1));
  CKPTD_ASSERT_OK_AND_ASSIGN(events, store_->ListEvents("c", 10));
  EXPECT_THAT(events, IsEmpty());
}

TEST_P(StateStoreConformanceTest, CountsEventsSinceATime) {
  const absl::Time t0 = absl::FromUnixSeconds(1'700'000'000);
  auto at = [&](int seconds) { return absl::ToUnixNanos(t0 + absl::Seconds(seconds)); };
  CKPTD_ASSERT_OK(store_->AppendEvent(Event("a", at(0), v1::NODE_LOST)));
  CKPTD_ASSERT_OK(store_->AppendEvent(Event("a", at(10), v1::TRAINER_DIED)));
  CKPTD_ASSERT_OK(store_->AppendEvent(Event("a", at(20), v1::TRAINER_DIED)));
  CKPTD_ASSERT_OK(store_->AppendEvent(Event("b", at(30), v1::PERSIST_FAILED)));
  CKPTD_ASSERT_OK(store_->AppendEvent(Event("", at(40), v1::NODE_LOST)));

  EXPECT_THAT(store_->CountEvents("", absl::InfinitePast()), ::ckptd::testing::IsOkAndHolds(5u));
  EXPECT_THAT(store_->CountEvents("a", absl::InfinitePast()), ::ckptd::testing::IsOkAndHolds(3u));
  // `since` is inclusive.
  EXPECT_THAT(store_->CountEvents("a", t0 + absl::Seconds(10)), ::ckptd::testing::IsOkAndHolds(2u));
  EXPECT_THAT(store_->CountEvents("", t0 + absl::Seconds(25)), ::ckptd::testing::IsOkAndHolds(2u));
  EXPECT_THAT(store_->CountEvents("", absl::InfiniteFuture()), ::ckptd::testing::IsOkAndHolds(0u));
  EXPECT_THAT(store_->CountEvents("zzz", absl::InfinitePast()), ::ckptd::testing::IsOkAndHolds(0u));

  EXPECT_THAT(store_->CountEventsByKind("", t0 + absl::Seconds(5)),
              ::ckptd::testing::IsOkAndHolds(UnorderedElementsAre(
                  Pair(v1::TRAINER_DIED, 2u), Pair(v1::PERSIST_FAILED, 1u), Pair(v1::NODE_LOST, 1u))));
  EXPECT_THAT(store_->CountEventsByKind("a", absl::InfinitePast()),
              ::ckptd::testing::IsOkAndHolds(
                  UnorderedElementsAre(Pair(v1::TRAINER_DIED, 2u), Pair(v1::NODE_LOST, 1u))));
}

TEST_P(StateStoreConformanceTest, EventCapKeepsTheNewestAppended) {
  store_.reset();
  store_ = Open({.max_events = 5});
  ASSERT_NE(store_, nullptr);
  for (int i = 0; i < 12; ++i) CKPTD_ASSERT_OK(store_->AppendEvent(Event(i % 2 ? "odd" : "even", i)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FailureEvent> events, store_->ListEvents("", 100));
  EXPECT_THAT(Times(events), ElementsAre(11, 10, 9, 8, 7));
  EXPECT_THAT(store_->CountEvents("", absl::InfinitePast()), ::ckptd::testing::IsOkAndHolds(5u));
  CKPTD_ASSERT_OK_AND_ASSIGN(events, store_->ListEvents("odd", 100));
  EXPECT_THAT(Times(events), ElementsAre(11, 9, 7));
}

TEST_P(StateStoreConformanceTest, PutJobInsertsOrReplaces) {
  CKPTD_ASSERT_OK(store_->PutJob(Job("beta", 1)));
  CKPTD_ASSERT_OK(store_->PutJob(Job("alpha", 2)));
  CKPTD_ASSERT_OK(store_->PutJob(Job("beta", 3)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<JobRecord> jobs, store_->ListJobs());
  EXPECT_THAT(jobs, ElementsAre(EqualsProto(Job("alpha", 2)), EqualsProto(Job("beta", 3))));
}

TEST_P(StateStoreConformanceTest, RecordsWithoutAJobAreRefused) {
  EXPECT_THAT(store_->PutJob(JobRecord()), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no job")));
  EXPECT_THAT(store_->PutQuarantine(Quarantine("", 5, "bad")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no job")));
}

TEST_P(StateStoreConformanceTest, QuarantineIsIdempotentPerStep) {
  CKPTD_ASSERT_OK(store_->PutQuarantine(Quarantine("b", 10, "first")));
  CKPTD_ASSERT_OK(store_->PutQuarantine(Quarantine("b", 10, "again")));  // the first record stays
  CKPTD_ASSERT_OK(store_->PutQuarantine(Quarantine("b", 2, "older step")));
  CKPTD_ASSERT_OK(store_->PutQuarantine(Quarantine("a", 7, "x")));
  // Steps order as unsigned numbers, beyond int64 too.
  CKPTD_ASSERT_OK(store_->PutQuarantine(Quarantine("b", UINT64_MAX, "huge")));

  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<QuarantinedStep> steps, store_->ListQuarantined("b"));
  EXPECT_THAT(steps, ElementsAre(EqualsProto(Quarantine("b", 2, "older step")),
                                 EqualsProto(Quarantine("b", 10, "first")),
                                 EqualsProto(Quarantine("b", UINT64_MAX, "huge"))));
  CKPTD_ASSERT_OK_AND_ASSIGN(steps, store_->ListQuarantined(""));
  ASSERT_THAT(steps, SizeIs(4));
  EXPECT_EQ(steps[0].job(), "a");
  CKPTD_ASSERT_OK_AND_ASSIGN(steps, store_->ListQuarantined("c"));
  EXPECT_THAT(steps, IsEmpty());
}

TEST_P(StateStoreConformanceTest, DeleteJobForgetsItsRecordAndQuarantineOnly) {
  CKPTD_ASSERT_OK(store_->PutJob(Job("alpha", 2)));
  CKPTD_ASSERT_OK(store_->PutJob(Job("beta", 3)));
  CKPTD_ASSERT_OK(store_->PutQuarantine(Quarantine("alpha", 10, "bad")));
  CKPTD_ASSERT_OK(store_->PutQuarantine(Quarantine("beta", 10, "bad")));
  CKPTD_ASSERT_OK(store_->DeleteJob("alpha"));
  CKPTD_ASSERT_OK(store_->DeleteJob("never-was"));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<JobRecord> jobs, store_->ListJobs());
  EXPECT_THAT(jobs, ElementsAre(EqualsProto(Job("beta", 3))));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<QuarantinedStep> steps, store_->ListQuarantined(""));
  EXPECT_THAT(steps, ElementsAre(EqualsProto(Quarantine("beta", 10, "bad"))));
}

TEST_P(StateStoreConformanceTest, HostileStringsAreStoredAsGiven) {
  const std::string injection = "x'); DROP TABLE events; --";
  const std::string with_nul("a\0b", 3);
  const std::string with_nul2("a\0c", 3);
  const std::string quotes = "\"'`\\%_*?[]";
  const std::string big_detail(1 << 20, 'd');
  for (const std::string& job : {injection, with_nul, with_nul2, quotes, std::string("a")}) {
    CKPTD_ASSERT_OK(store_->AppendEvent(Event(job, 1, v1::SHARD_DAMAGED, job + std::string("\n\0detail", 8))));
    CKPTD_ASSERT_OK(store_->PutJob(Job(job, 1)));
    CKPTD_ASSERT_OK(store_->PutQuarantine(Quarantine(job, 1, job)));
  }
  CKPTD_ASSERT_OK(store_->AppendEvent(Event(with_nul, 2, v1::SHARD_DAMAGED, big_detail)));

  for (const std::string& job : {injection, with_nul2, quotes, std::string("a")}) {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FailureEvent> events, store_->ListEvents(job, 10));
    ASSERT_THAT(events, SizeIs(1)) << absl::CHexEscape(job);
    EXPECT_THAT(events[0], EqualsProto(Event(job, 1, v1::SHARD_DAMAGED, job + std::string("\n\0detail", 8))));
    CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<QuarantinedStep> steps, store_->ListQuarantined(job));
    EXPECT_THAT(steps, ElementsAre(EqualsProto(Quarantine(job, 1, job))));
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FailureEvent> events, store_->ListEvents(with_nul, 10));
  ASSERT_THAT(events, SizeIs(2));
  EXPECT_EQ(events[0].detail(), big_detail);
  // "a" is not a prefix match for "a\0b".
  EXPECT_THAT(store_->CountEvents("a", absl::InfinitePast()), ::ckptd::testing::IsOkAndHolds(1u));
  EXPECT_THAT(store_->ListEvents(std::string("a\0", 2), 10), ::ckptd::testing::IsOkAndHolds(IsEmpty()));

  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<JobRecord> jobs, store_->ListJobs());
  std::vector<std::string> names;
  for (const JobRecord& r : jobs) names.push_back(r.job());
  EXPECT_THAT(names, ElementsAre(quotes, std::string("a"), with_nul, with_nul2, injection));
  EXPECT_THAT(store_->CountEvents("", absl::InfinitePast()), ::ckptd::testing::IsOkAndHolds(6u));
}

TEST_P(StateStoreConformanceTest, InvalidUtf8IsRefused) {
  const std::string bad = "job\xff\xfe";
  EXPECT_THAT(store_->AppendEvent(Event(bad, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("UTF-8")));
  EXPECT_THAT(store_->PutJob(Job(bad, 1)), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("UTF-8")));
  EXPECT_THAT(store_->PutQuarantine(Quarantine("job", 1, bad)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("UTF-8")));
  EXPECT_THAT(store_->ListEvents("", 10), ::ckptd::testing::IsOkAndHolds(IsEmpty()));
}

TEST_P(StateStoreConformanceTest, ConcurrentUseFromSeveralThreads) {
  constexpr int kThreads = 6;
  constexpr int kPerThread = 40;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string job = absl::StrCat("job-", t);
      for (int i = 0; i < kPerThread; ++i) {
        EXPECT_THAT(store_->AppendEvent(Event(job, t * 1000 + i)), IsOk());
        if (i % 8 == 0) {
          EXPECT_THAT(store_->PutJob(Job(job, static_cast<uint64_t>(i))), IsOk());
          EXPECT_THAT(store_->PutQuarantine(Quarantine(job, static_cast<uint64_t>(i), "r")), IsOk());
          EXPECT_THAT(store_->ListEvents("", 5).status(), IsOk());
          EXPECT_THAT(store_->CountEvents(job, absl::InfinitePast()).status(), IsOk());
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();

  EXPECT_THAT(store_->CountEvents("", absl::InfinitePast()),
              ::ckptd::testing::IsOkAndHolds(uint64_t{kThreads * kPerThread}));
  for (int t = 0; t < kThreads; ++t) {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FailureEvent> events,
                               store_->ListEvents(absl::StrCat("job-", t), kPerThread + 1));
    ASSERT_THAT(events, SizeIs(kPerThread));
    for (int i = 0; i < kPerThread; ++i) EXPECT_EQ(events[i].unix_nanos(), t * 1000 + kPerThread - 1 - i);
  }
  EXPECT_THAT(store_->ListJobs(), ::ckptd::testing::IsOkAndHolds(SizeIs(kThreads)));
  EXPECT_THAT(store_->ListQuarantined(""), ::ckptd::testing::IsOkAndHolds(SizeIs(kThreads * 5)));
}

ckptd::v1::DrillRecord Drill(uint64_t id, const std::string& node, bool reported = false) {
  ckptd::v1::DrillRecord d;
  d.set_id(id);
  d.set_node(node);
  d.mutable_request()->set_job("job");
  d.mutable_request()->set_scenario(ckptd::v1::KILL_TRAINER);
  d.mutable_request()->set_rank(3);
  d.set_ordered_unix_nanos(1'700'000'000'000'000'000 + static_cast<int64_t>(id));
  d.set_has_newest_at_order(true);
  d.set_newest_at_order(40);
  if (reported) {
    d.mutable_report()->set_drill_id(id);
    d.mutable_report()->set_injected(true);
    d.mutable_report()->set_detail("SIGKILL to pid 4242");
  }
  d.add_partners("node-x");
  return d;
}

TEST_P(StateStoreConformanceTest, DrillsAreReplacedByIdAndOnlyTheNewestAreKept) {
  EXPECT_THAT(store_->ListDrills(), ::ckptd::testing::IsOkAndHolds(IsEmpty()));
  EXPECT_THAT(store_->PutDrill(Drill(0, "n")), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no id")));
  const uint64_t base = uint64_t{1'765'000'000} << 20;  // as a coordinator numbers them
  CKPTD_ASSERT_OK(store_->PutDrill(Drill(base + 2, "node-b")));
  CKPTD_ASSERT_OK(store_->PutDrill(Drill(base + 1, "node-a")));
  CKPTD_ASSERT_OK(store_->PutDrill(Drill(base + 2, "node-b", /*reported=*/true)));  // its report came
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<ckptd::v1::DrillRecord> drills, store_->ListDrills());
  EXPECT_THAT(drills, ElementsAre(EqualsProto(Drill(base + 1, "node-a")),
                                  EqualsProto(Drill(base + 2, "node-b", true))));
  // Past the cap the lowest ids go, and one lower than every kept drill is
  // not kept either.
  for (uint64_t i = 3; i < 3 + kMaxStoredDrills; ++i) CKPTD_ASSERT_OK(store_->PutDrill(Drill(base + i, "n")));
  CKPTD_ASSERT_OK_AND_ASSIGN(drills, store_->ListDrills());
  ASSERT_THAT(drills, SizeIs(kMaxStoredDrills));
  EXPECT_EQ(drills.front().id(), base + 3);
  EXPECT_EQ(drills.back().id(), base + 2 + kMaxStoredDrills);
  CKPTD_ASSERT_OK(store_->PutDrill(Drill(base + 1, "late")));
  CKPTD_ASSERT_OK_AND_ASSIGN(drills, store_->ListDrills());
  ASSERT_THAT(drills, SizeIs(kMaxStoredDrills));
  EXPECT_EQ(drills.front().id(), base + 3);
}

ckptd::v1::CommitIntent Intent(const std::string& job, uint64_t step) {
  ckptd::v1::CommitIntent c;
  c.set_job(job);
  c.set_step(step);
  c.set_world_size(4096);
  c.set_unix_nanos(1'700'000'000'000'000'000 + static_cast<int64_t>(step));
  return c;
}

TEST_P(StateStoreConformanceTest, CommitIntentsAreOnePerJobAndGoWithTheJob) {
  EXPECT_THAT(store_->ListCommitIntents(), ::ckptd::testing::IsOkAndHolds(IsEmpty()));
  EXPECT_THAT(store_->PutCommitIntent(Intent("", 3)), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no job")));
  CKPTD_ASSERT_OK(store_->PutCommitIntent(Intent("job/b", 20)));
  CKPTD_ASSERT_OK(store_->PutCommitIntent(Intent("job-a", 10)));
  CKPTD_ASSERT_OK(store_->PutCommitIntent(Intent("job/b", 40)));  // the next commit replaces it
  EXPECT_THAT(store_->ListCommitIntents(),
              ::ckptd::testing::IsOkAndHolds(ElementsAre(EqualsProto(Intent("job-a", 10)), EqualsProto(Intent("job/b", 40)))));
  CKPTD_ASSERT_OK(store_->PutJob(Job("job/b", 3)));
  CKPTD_ASSERT_OK(store_->DeleteJob("job/b"));
  EXPECT_THAT(store_->ListCommitIntents(),
              ::ckptd::testing::IsOkAndHolds(ElementsAre(EqualsProto(Intent("job-a", 10)))));
}

INSTANTIATE_TEST_SUITE_P(Impls, StateStoreConformanceTest, ::testing::Values(Impl::kMem, Impl::kSqlite
#ifdef CKPTD_HAVE_ETCD
                                                                               , Impl::kEtcd
#endif
                                                                               ),
                         ImplName);

// --- SQLite only --------------------------------------------------------------

// A raw connection for poking at the file behind the store's back.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK) << path;
  }
  ~RawDb() { sqlite3_close_v2(db_); }
  void Exec(const std::string& sql) {
    char* message = nullptr;
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &message), SQLITE_OK)
        << sql << ": " << (message != nullptr ? message : "");
    sqlite3_free(message);
  }
  std::string QueryText(const std::string& sql) {
    sqlite3_stmt* s = nullptr;
    std::string out;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr), SQLITE_OK) << sql;
    if (s != nullptr && sqlite3_step(s) == SQLITE_ROW) {
      const unsigned char* text = sqlite3_column_text(s, 0);
      if (text != nullptr) out = reinterpret_cast<const char*>(text);
    }
    sqlite3_finalize(s);
    return out;
  }

 private:
  sqlite3* db_ = nullptr;
};

class SqliteStateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()) << "mkdtemp: " << std::strerror(errno); }

  std::string state_dir() const { return storage::JoinPath(dir_.path(), "state"); }
  std::string db_path() const { return storage::JoinPath(state_dir(), kStateDbFileName); }

  void WriteFile(const std::string& path, const std::string& contents) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << contents;
    ASSERT_TRUE(out.good()) << path;
  }

  TempDir dir_;
};

TEST_F(SqliteStateStoreTest, DataSurvivesClosingAndReopening) {
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store, OpenSqliteStateStore(state_dir()));
    CKPTD_ASSERT_OK(store->AppendEvent(Event("a", 1, v1::NODE_LOST, "lost")));
    CKPTD_ASSERT_OK(store->AppendEvent(Event("a", 2, v1::TRAINER_DIED, "died")));
    CKPTD_ASSERT_OK(store->PutJob(Job("a", 9)));
    CKPTD_ASSERT_OK(store->PutQuarantine(Quarantine("a", 400, "digest mismatch")));
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store, OpenSqliteStateStore(state_dir()));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FailureEvent> events, store->ListEvents("a", 10));
  EXPECT_THAT(events, ElementsAre(EqualsProto(Event("a", 2, v1::TRAINER_DIED, "died")),
                                  EqualsProto(Event("a", 1, v1::NODE_LOST, "lost"))));
  EXPECT_THAT(store->ListJobs(), ::ckptd::testing::IsOkAndHolds(ElementsAre(EqualsProto(Job("a", 9)))));
  EXPECT_THAT(store->ListQuarantined("a"), ::ckptd::testing::IsOkAndHolds(
                                               ElementsAre(EqualsProto(Quarantine("a", 400, "digest mismatch")))));
  // Appends continue after the kept ones.
  CKPTD_ASSERT_OK(store->AppendEvent(Event("a", 2, v1::TRAINER_HUNG, "hung")));
  CKPTD_ASSERT_OK_AND_ASSIGN(events, store->ListEvents("a", 1));
  EXPECT_THAT(Details(events), ElementsAre("hung"));
}

// A database made before drills were kept (schema version 1 without the
// table) gets the table when opened, and keeps what it held.
TEST_F(SqliteStateStoreTest, ADatabaseWithoutTheDrillsTableGetsIt) {
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store, OpenSqliteStateStore(state_dir()));
    CKPTD_ASSERT_OK(store->PutJob(Job("a", 9)));
  }
  {
    RawDb raw(db_path());
    raw.Exec("DROP TABLE drills");
    EXPECT_EQ(raw.QueryText("SELECT COUNT(*) FROM sqlite_schema WHERE name = 'drills'"), "0");
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store, OpenSqliteStateStore(state_dir()));
  EXPECT_THAT(store->ListJobs(), ::ckptd::testing::IsOkAndHolds(ElementsAre(EqualsProto(Job("a", 9)))));
  EXPECT_THAT(store->ListDrills(), ::ckptd::testing::IsOkAndHolds(IsEmpty()));
  CKPTD_ASSERT_OK(store->PutDrill(Drill(7, "node-a")));
  EXPECT_THAT(store->ListDrills(), ::ckptd::testing::IsOkAndHolds(ElementsAre(EqualsProto(Drill(7, "node-a")))));
  RawDb raw(db_path());
  EXPECT_EQ(raw.QueryText("PRAGMA user_version"), absl::StrCat(kStateSchemaVersion));
}

// The same for the commit intents' table.
TEST_F(SqliteStateStoreTest, ADatabaseWithoutTheCommitIntentsTableGetsIt) {
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store, OpenSqliteStateStore(state_dir()));
    CKPTD_ASSERT_OK(store->PutDrill(Drill(7, "node-a")));
  }
  {
    RawDb raw(db_path());
    raw.Exec("DROP TABLE commit_intents");
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store, OpenSqliteStateStore(state_dir()));
  EXPECT_THAT(store->ListDrills(), ::ckptd::testing::IsOkAndHolds(ElementsAre(EqualsProto(Drill(7, "node-a")))));
  EXPECT_THAT(store->ListCommitIntents(), ::ckptd::testing::IsOkAndHolds(IsEmpty()));
  CKPTD_ASSERT_OK(store->PutCommitIntent(Intent("a", 5)));
  EXPECT_THAT(store->ListCommitIntents(), ::ckptd::testing::IsOkAndHolds(ElementsAre(EqualsProto(Intent("a", 5)))));
  RawDb raw(db_path());
  EXPECT_EQ(raw.QueryText("PRAGMA user_version"), absl::StrCat(kStateSchemaVersion));
}

TEST_F(SqliteStateStoreTest, CreatesNestedStateDirWithWalSchema) {
  const std::string nested = storage::JoinPath(dir_.path(), "x/y/z");
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store, OpenSqliteStateStore(nested));
  CKPTD_ASSERT_OK(store->AppendEvent(Event("a", 1)));
  RawDb raw(storage::JoinPath(nested, kStateDbFileName));
  EXPECT_EQ(raw.QueryText("PRAGMA journal_mode"), "wal");
  EXPECT_EQ(raw.QueryText("PRAGMA user_version"), absl::StrCat(kStateSchemaVersion));
  EXPECT_EQ(raw.QueryText("SELECT COUNT(*) FROM events WHERE job = CAST('a' AS BLOB)"), "1");
}

TEST_F(SqliteStateStoreTest, GarbageFileIsDataLoss) {
  auto fs = storage::NewPosixFileSystem({.use_io_uring = false});
  CKPTD_ASSERT_OK(storage::CreateDirs(fs.get(), state_dir()));
  WriteFile(db_path(), std::string(8192, 'G') + "this is not a database");
  EXPECT_THAT(OpenSqliteStateStore(state_dir()),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(db_path()), HasSubstr("not a database"), HasSubstr("move it aside"))));
}

TEST_F(SqliteStateStoreTest, DamagedPagesAreDataLossNotACrash) {
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store, OpenSqliteStateStore(state_dir()));
    for (int i = 0; i < 40; ++i) {
      CKPTD_ASSERT_OK(store->AppendEvent(Event("a", i, v1::TRAINER_DIED, std::string(3000, 'd'))));
    }
  }
  struct stat st;
  ASSERT_EQ(::stat(db_path().c_str(), &st), 0);
  ASSERT_GT(st.st_size, 64 * 1024);
  {
    // Overwrite everything after the first page (the header and schema stay).
    std::fstream f(db_path(), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(4096);
    const std::string junk(static_cast<size_t>(st.st_size) - 4096, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
    ASSERT_TRUE(f.good());
  }
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenSqliteStateStore(state_dir());
  absl::Status status = store.status();
  if (store.ok()) status = (*store)->ListEvents("", 10).status();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss, HasSubstr(db_path())));
}

TEST_F(SqliteStateStoreTest, UnparsableRowIsDataLoss) {
  { CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store, OpenSqliteStateStore(state_dir())); }
  {
    RawDb raw(db_path());
    raw.Exec("INSERT INTO events(unix_nanos, job, kind, event) VALUES(1, CAST('a' AS BLOB), 2, X'FFFFFFFF')");
    raw.Exec("INSERT INTO jobs(job, updated_unix_nanos, record) VALUES(CAST('j' AS BLOB), 1, X'0A')");
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store, OpenSqliteStateStore(state_dir()));
  EXPECT_THAT(store->ListEvents("a", 10),
              StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(db_path()), HasSubstr("event row 1"))));
  EXPECT_THAT(store->ListJobs(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("job \"j\"")));
}

TEST_F(SqliteStateStoreTest, NewerSchemaVersionIsRefused) {
  { CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store, OpenSqliteStateStore(state_dir())); }
  {
    RawDb raw(db_path());
    raw.Exec(absl::StrCat("PRAGMA user_version = ", kStateSchemaVersion + 1));
  }
  EXPECT_THAT(OpenSqliteStateStore(state_dir()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(db_path()), HasSubstr("newer than this build supports"))));
}

TEST_F(SqliteStateStoreTest, ForeignDatabaseIsRefused) {
  auto fs = storage::NewPosixFileSystem({.use_io_uring = false});
  CKPTD_ASSERT_OK(storage::CreateDirs(fs.get(), state_dir()));
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(db_path().c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t(x)", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  EXPECT_THAT(OpenSqliteStateStore(state_dir()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a ckptd coordinator state database")));
}

TEST_F(SqliteStateStoreTest, EventCapAppliesOnReopenWithASmallerCap) {
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store,
                               OpenSqliteStateStore(state_dir(), {.max_events = 100}));
    for (int i = 0; i < 150; ++i) CKPTD_ASSERT_OK(store->AppendEvent(Event("a", i)));
    EXPECT_THAT(store->CountEvents("", absl::InfinitePast()), ::ckptd::testing::IsOkAndHolds(100u));
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store,
                             OpenSqliteStateStore(state_dir(), {.max_events = 10}));
  EXPECT_THAT(store->CountEvents("", absl::InfinitePast()), ::ckptd::testing::IsOkAndHolds(10u));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<FailureEvent> events, store->ListEvents("", 100));
  EXPECT_EQ(Times(events).front(), 149);
  EXPECT_EQ(Times(events).back(), 140);
}

TEST_F(SqliteStateStoreTest, StateDirThatIsAFileIsRefused) {
  const std::string file = storage::JoinPath(dir_.path(), "plain");
  WriteFile(file, "x");
  EXPECT_THAT(OpenSqliteStateStore(file),
              StatusIs(absl::StatusCode::kFailedPrecondition, AllOf(HasSubstr(file), HasSubstr("not a directory"))));
  EXPECT_THAT(OpenSqliteStateStore(storage::JoinPath(file, "sub")), ::testing::Not(IsOk()));
  EXPECT_THAT(OpenSqliteStateStore(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not set")));
}

TEST_F(SqliteStateStoreTest, ReadOnlyDirectoryIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  const std::string ro = storage::JoinPath(dir_.path(), "ro");
  ASSERT_EQ(::mkdir(ro.c_str(), 0500), 0);
  EXPECT_THAT(OpenSqliteStateStore(ro),
              StatusIs(absl::StatusCode::kPermissionDenied, AllOf(HasSubstr(ro), HasSubstr("not writable"))));
  EXPECT_THAT(OpenSqliteStateStore(storage::JoinPath(ro, "sub")),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr(ro)));
}

TEST_F(SqliteStateStoreTest, ReadOnlyDatabaseFileIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores file permissions";
  { CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store, OpenSqliteStateStore(state_dir())); }
  ASSERT_EQ(::chmod(db_path().c_str(), 0400), 0);
  EXPECT_THAT(OpenSqliteStateStore(state_dir()),
              StatusIs(absl::StatusCode::kPermissionDenied, AllOf(HasSubstr(db_path()), HasSubstr("read-only"))));
}

TEST_F(SqliteStateStoreTest, LockHeldElsewhereIsUnavailable) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> store,
                             OpenSqliteStateStore(state_dir(), {.busy_timeout = absl::Milliseconds(50)}));
  RawDb other(db_path());
  other.Exec("BEGIN IMMEDIATE");
  EXPECT_THAT(store->AppendEvent(Event("a", 1)),
              StatusIs(absl::StatusCode::kUnavailable, AllOf(HasSubstr(db_path()), HasSubstr("locked"))));
  EXPECT_THAT(store->PutJob(Job("a", 1)), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("locked")));
  EXPECT_THAT(store->ListEvents("", 10), ::ckptd::testing::IsOkAndHolds(IsEmpty()));  // readers go on (WAL)
  other.Exec("COMMIT");
  CKPTD_EXPECT_OK(store->AppendEvent(Event("a", 1)));
  CKPTD_EXPECT_OK(store->PutJob(Job("a", 1)));
}

TEST_F(SqliteStateStoreTest, SecondStoreOnTheSameDirSeesWrites) {
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> a, OpenSqliteStateStore(state_dir()));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> b, OpenSqliteStateStore(state_dir()));
  CKPTD_ASSERT_OK(a->AppendEvent(Event("a", 1)));
  CKPTD_ASSERT_OK(b->AppendEvent(Event("a", 2)));
  EXPECT_THAT(a->CountEvents("a", absl::InfinitePast()), ::ckptd::testing::IsOkAndHolds(2u));
}

}  // namespace
}  // namespace ckptd::coordinator
