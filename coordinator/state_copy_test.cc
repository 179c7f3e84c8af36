#include "coordinator/state_copy.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"  // base/testing/matchers.h uses its CONCAT macro
#include "base/testing/matchers.h"
#include "base/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace ckptd::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

v1::FailureEvent Event(const std::string& job, int64_t unix_nanos, const std::string& node) {
  v1::FailureEvent e;
  e.set_job(job);
  e.set_unix_nanos(unix_nanos);
  e.set_kind(v1::NODE_LOST);
  e.set_node_id(node);
  e.set_detail("heartbeats stopped");
  return e;
}

v1::JobRecord Job(const std::string& name, uint64_t committed) {
  v1::JobRecord r;
  r.set_job(name);
  r.set_checkpoints_committed(committed);
  return r;
}

v1::QuarantinedStep Quarantine(const std::string& job, uint64_t step) {
  v1::QuarantinedStep q;
  q.set_job(job);
  q.set_step(step);
  q.set_reason("shard 3 failed its checksum");
  return q;
}

bool Same(const google::protobuf::Message& a, const google::protobuf::Message& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

// A single coordinator's SQLite state, read whole and written into an empty
// store, reads back the same: records, quarantines, and the events in their
// order (the newest still first), with equal times kept in append order.
TEST(StateCopy, ASqliteStateMovesWholeIntoAnEmptyStore) {
  ckptd::testing::TempDir dir;
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> sqlite, OpenSqliteStateStore(dir.path()));
    CKPTD_ASSERT_OK(sqlite->PutJob(Job("llama-70b", 41)));
    CKPTD_ASSERT_OK(sqlite->PutJob(Job("job with \"quotes\" and spaces", 2)));
    CKPTD_ASSERT_OK(sqlite->PutQuarantine(Quarantine("llama-70b", 4000)));
    CKPTD_ASSERT_OK(sqlite->AppendEvent(Event("llama-70b", 100, "node-a")));
    CKPTD_ASSERT_OK(sqlite->AppendEvent(Event("llama-70b", 300, "node-b")));
    CKPTD_ASSERT_OK(sqlite->AppendEvent(Event("other", 300, "node-c")));  // same time, appended later
    CKPTD_ASSERT_OK(sqlite->AppendEvent(Event("", 200, "node-d")));
  }
  CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StateStore> sqlite, OpenSqliteStateStore(dir.path()));
  CKPTD_ASSERT_OK_AND_ASSIGN(StateSnapshot state, ReadState(*sqlite, 10'000));
  EXPECT_EQ(DescribeState(state), "2 jobs, 1 quarantined step, 4 failure events");

  std::unique_ptr<StateStore> to = NewMemStateStore();
  CKPTD_ASSERT_OK_AND_ASSIGN(bool empty, StateIsEmpty(*to));
  EXPECT_TRUE(empty);
  CKPTD_ASSERT_OK(WriteState(state, *to));
  CKPTD_ASSERT_OK_AND_ASSIGN(empty, StateIsEmpty(*to));
  EXPECT_FALSE(empty);

  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<v1::JobRecord> want_jobs, sqlite->ListJobs());
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<v1::JobRecord> got_jobs, to->ListJobs());
  ASSERT_THAT(got_jobs, SizeIs(want_jobs.size()));
  for (size_t i = 0; i < want_jobs.size(); ++i) EXPECT_TRUE(Same(got_jobs[i], want_jobs[i])) << i;
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<v1::QuarantinedStep> got_q, to->ListQuarantined(""));
  ASSERT_THAT(got_q, SizeIs(1));
  EXPECT_TRUE(Same(got_q[0], Quarantine("llama-70b", 4000)));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<v1::FailureEvent> want_events, sqlite->ListEvents("", 100));
  CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<v1::FailureEvent> got_events, to->ListEvents("", 100));
  ASSERT_THAT(got_events, SizeIs(4));
  for (size_t i = 0; i < want_events.size(); ++i) EXPECT_TRUE(Same(got_events[i], want_events[i])) << i;
  EXPECT_EQ(got_events[0].node_id(), "node-c");  // the later of the two at 300
  // The failure history the interval policy counts is the same.
  CKPTD_ASSERT_OK_AND_ASSIGN(uint64_t counted, to->CountEvents("llama-70b", absl::FromUnixNanos(0)));
  EXPECT_EQ(counted, 2u);
}

// Only the newest events are read when the source holds more than the
// destination keeps.
TEST(StateCopy, ReadStateKeepsTheNewestEvents) {
  std::unique_ptr<StateStore> from = NewMemStateStore();
  for (int i = 0; i < 10; ++i) CKPTD_ASSERT_OK(from->AppendEvent(Event("j", 100 + i, absl::StrCat("node-", i))));
  CKPTD_ASSERT_OK_AND_ASSIGN(StateSnapshot state, ReadState(*from, 3));
  ASSERT_THAT(state.events, SizeIs(3));
  EXPECT_EQ(state.events[0].node_id(), "node-7");  // oldest first
  EXPECT_EQ(state.events[2].node_id(), "node-9");
}

// A store holding anything at all is not empty: a job, a quarantine alone,
// or an event alone.
TEST(StateCopy, AnyRecordMakesAStoreNonEmpty) {
  for (int which = 0; which < 3; ++which) {
    std::unique_ptr<StateStore> store = NewMemStateStore();
    const absl::Status put = which == 0   ? store->PutJob(Job("j", 1))
                             : which == 1 ? store->PutQuarantine(Quarantine("j", 7))
                                          : store->AppendEvent(Event("", 1, "n"));
    CKPTD_ASSERT_OK(put);
    CKPTD_ASSERT_OK_AND_ASSIGN(bool empty, StateIsEmpty(*store));
    EXPECT_FALSE(empty) << which;
  }
}

// A write the destination refuses stops the copy and names what it was.
TEST(StateCopy, ARefusedWriteNamesTheRecord) {
  StateSnapshot state;
  state.jobs.push_back(Job("fine", 1));
  state.jobs.push_back(Job("", 1));  // every store refuses a record without a job
  std::unique_ptr<StateStore> to = NewMemStateStore();
  absl::Status s = WriteState(state, *to);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("the record of job \"\""));
  state.jobs.clear();
  state.quarantined.push_back(Quarantine("", 9));
  s = WriteState(state, *to);
  EXPECT_THAT(s.message(), HasSubstr("quarantined step 9 of job \"\""));
}

}  // namespace
}  // namespace ckptd::coordinator
