// StateStore on etcd (etcd_state_store.h): guarded transactions for writes,
// linearizable ranges for reads, an index of the kept events in memory.
#include "coordinator/etcd_state_store.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <deque>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/random.h"
#include "base/status_macros.h"
#include "coordinator/state_store_internal.h"

namespace ckptd::coordinator {

using ckptd::v1::CommitIntent;
using ckptd::v1::DrillRecord;
using ckptd::v1::FailureEvent;
using ckptd::v1::FailureKind;
using ckptd::v1::JobRecord;
using ckptd::v1::QuarantinedStep;
namespace pb = ::etcdserverpb;

std::string EtcdKeyName(absl::string_view job) {
  std::string out;
  out.reserve(job.size());
  for (unsigned char c : job) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
        c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

namespace {

// 20 digits that sort as the numbers do.
std::string Digits(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%020" PRIu64, v);
  return buf;
}
// Times (signed) as 20 digits that sort as the times do.
std::string TimeDigits(int64_t unix_nanos) { return Digits(static_cast<uint64_t>(unix_nanos) ^ (uint64_t{1} << 63)); }

class EtcdStateStore final : public StateStore {
 public:
  EtcdStateStore(etcd::EtcdClient* etcd, etcd::LeaderElection* election, const EtcdStateStoreOptions& options)
      : etcd_(etcd),
        election_(election),
        options_(options),
        root_(absl::StrCat(options.prefix, "/state/")),
        max_events_(std::max<size_t>(options.max_events, 1)) {}

  // Loads the index of kept events, oldest appended first.
  absl::Status Load() {
    pb::RangeRequest r;
    r.set_key(EventsPrefix(""));
    r.set_range_end(etcd::PrefixEnd(r.key()));
    r.set_keys_only(true);
    r.set_sort_target(pb::RangeRequest::MOD);
    r.set_sort_order(pb::RangeRequest::ASCEND);
    CKPTD_ASSIGN_OR_RETURN(pb::RangeResponse got, Read(r));
    absl::MutexLock l(&events_mu_);
    for (const auto& kv : got.kvs()) events_.push_back(kv.key());
    return absl::OkStatus();
  }

  absl::Status AppendEvent(const FailureEvent& event) override {
    CKPTD_ASSIGN_OR_RETURN(std::string value, internal::SerializeForStore(event));
    absl::StatusOr<std::string> suffix = base::RandomHex(8);
    if (!suffix.ok()) return suffix.status();
    const std::string key =
        absl::StrCat(EventsPrefix(event.job()), TimeDigits(event.unix_nanos()), "/", *suffix);
    // One append at a time, so that the index keeps etcd's order.
    absl::MutexLock l(&events_mu_);
    pb::TxnRequest txn;
    *txn.add_success() = etcd::PutOp(key, value);
    // The oldest beyond the cap go in the same transaction (within etcd's
    // operations per transaction; a larger excess goes over the next appends).
    size_t drop = 0;
    while (events_.size() + 1 - drop > max_events_ && drop < events_.size() &&
           txn.success_size() < etcd::kMaxTxnOps) {
      *txn.add_success() = etcd::DeleteOp(events_[drop]);
      ++drop;
    }
    CKPTD_RETURN_IF_ERROR(Write(txn, "AppendEvent").status());
    events_.erase(events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(drop));
    events_.push_back(key);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<FailureEvent>> ListEvents(absl::string_view job, size_t limit) override {
    if (limit == 0) return std::vector<FailureEvent>();
    pb::RangeRequest r;
    r.set_key(EventsPrefix(job));
    r.set_range_end(etcd::PrefixEnd(r.key()));
    std::vector<Event> events;
    if (!job.empty()) {
      // Newest first by key (the time), then the rest of the last time's
      // events, which the limit may have cut (ties order by append).
      r.set_sort_target(pb::RangeRequest::KEY);
      r.set_sort_order(pb::RangeRequest::DESCEND);
      r.set_limit(static_cast<int64_t>(std::min<size_t>(limit, INT64_MAX)));
      CKPTD_ASSIGN_OR_RETURN(pb::RangeResponse got, Read(r));
      CKPTD_RETURN_IF_ERROR(Collect(got, {}, &events));
      if (static_cast<size_t>(got.kvs_size()) == limit) {
        const std::string& last = got.kvs(got.kvs_size() - 1).key();
        pb::RangeRequest tie;
        tie.set_key(last.substr(0, last.rfind('/') + 1));
        tie.set_range_end(etcd::PrefixEnd(tie.key()));
        CKPTD_ASSIGN_OR_RETURN(pb::RangeResponse more, Read(tie));
        CKPTD_RETURN_IF_ERROR(Collect(more, got, &events));
      }
    } else {
      CKPTD_ASSIGN_OR_RETURN(pb::RangeResponse got, Read(r));
      CKPTD_RETURN_IF_ERROR(Collect(got, {}, &events));
    }
    std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
      if (a.event.unix_nanos() != b.event.unix_nanos()) return a.event.unix_nanos() > b.event.unix_nanos();
      return a.revision > b.revision;
    });
    if (events.size() > limit) events.resize(limit);
    std::vector<FailureEvent> out;
    out.reserve(events.size());
    for (Event& e : events) out.push_back(std::move(e.event));
    return out;
  }

  absl::StatusOr<absl::flat_hash_map<FailureKind, uint64_t>> CountEventsByKind(absl::string_view job,
                                                                              absl::Time since) override {
    const int64_t since_nanos = absl::ToUnixNanos(since);
    pb::RangeRequest r;
    const std::string prefix = EventsPrefix(job);
    r.set_key(job.empty() ? prefix : absl::StrCat(prefix, TimeDigits(since_nanos)));
    r.set_range_end(etcd::PrefixEnd(prefix));
    CKPTD_ASSIGN_OR_RETURN(pb::RangeResponse got, Read(r));
    absl::flat_hash_map<FailureKind, uint64_t> counts;
    for (const auto& kv : got.kvs()) {
      FailureEvent e;
      if (!e.ParseFromString(kv.value())) return Unreadable(kv.key());
      if (e.unix_nanos() >= since_nanos) ++counts[e.kind()];
    }
    return counts;
  }

  absl::Status PutJob(const JobRecord& record) override {
    if (record.job().empty()) return absl::InvalidArgumentError("PutJob: the record names no job");
    CKPTD_ASSIGN_OR_RETURN(std::string value, internal::SerializeForStore(record));
    pb::TxnRequest txn;
    *txn.add_success() = etcd::PutOp(JobKey(record.job()), value);
    return Write(txn, "PutJob").status();
  }

  absl::StatusOr<std::vector<JobRecord>> ListJobs() override {
    pb::RangeRequest r;
    r.set_key(absl::StrCat(root_, "jobs/"));
    r.set_range_end(etcd::PrefixEnd(r.key()));
    CKPTD_ASSIGN_OR_RETURN(pb::RangeResponse got, Read(r));
    std::vector<JobRecord> out;
    for (const auto& kv : got.kvs()) {
      JobRecord record;
      if (!record.ParseFromString(kv.value())) return Unreadable(kv.key());
      out.push_back(std::move(record));
    }
    std::sort(out.begin(), out.end(), [](const JobRecord& a, const JobRecord& b) { return a.job() < b.job(); });
    return out;
  }

  absl::Status DeleteJob(absl::string_view job) override {
    pb::TxnRequest txn;
    *txn.add_success() = etcd::DeleteOp(JobKey(job));
    *txn.add_success() = etcd::DeleteOp(IntentKey(job));
    const std::string q = QuarantinePrefix(job);
    *txn.add_success() = etcd::DeleteOp(q, etcd::PrefixEnd(q));
    return Write(txn, "DeleteJob").status();
  }

  absl::Status PutQuarantine(const QuarantinedStep& q) override {
    if (q.job().empty()) return absl::InvalidArgumentError("PutQuarantine: the step names no job");
    CKPTD_ASSIGN_OR_RETURN(std::string value, internal::SerializeForStore(q));
    const std::string key = absl::StrCat(QuarantinePrefix(q.job()), Digits(q.step()));
    // The first record of a step stays: put only when the key is absent.
    pb::TxnRequest txn;
    pb::TxnRequest* inner = txn.add_success()->mutable_request_txn();
    *inner->add_compare() = etcd::CreateRevisionIs(key, 0);
    *inner->add_success() = etcd::PutOp(key, value);
    return Write(txn, "PutQuarantine").status();
  }

  absl::StatusOr<std::vector<QuarantinedStep>> ListQuarantined(absl::string_view job) override {
    pb::RangeRequest r;
    r.set_key(job.empty() ? absl::StrCat(root_, "quarantine/") : QuarantinePrefix(job));
    r.set_range_end(etcd::PrefixEnd(r.key()));
    CKPTD_ASSIGN_OR_RETURN(pb::RangeResponse got, Read(r));
    std::vector<QuarantinedStep> out;
    for (const auto& kv : got.kvs()) {
      QuarantinedStep q;
      if (!q.ParseFromString(kv.value())) return Unreadable(kv.key());
      out.push_back(std::move(q));
    }
    std::sort(out.begin(), out.end(), [](const QuarantinedStep& a, const QuarantinedStep& b) {
      return a.job() != b.job() ? a.job() < b.job() : a.step() < b.step();
    });
    return out;
  }

  absl::Status PutDrill(const DrillRecord& d) override {
    if (d.id() == 0) return absl::InvalidArgumentError("PutDrill: the drill has no id");
    CKPTD_ASSIGN_OR_RETURN(std::string value, internal::SerializeForStore(d));
    // One put at a time, so that the count of kept drills stays true.
    absl::MutexLock l(&drills_mu_);
    pb::RangeRequest r;
    r.set_key(DrillsPrefix());
    r.set_range_end(etcd::PrefixEnd(r.key()));
    r.set_keys_only(true);
    r.set_sort_target(pb::RangeRequest::KEY);
    r.set_sort_order(pb::RangeRequest::ASCEND);
    CKPTD_ASSIGN_OR_RETURN(pb::RangeResponse kept, Read(r));
    const std::string key = absl::StrCat(DrillsPrefix(), Digits(d.id()));
    pb::TxnRequest txn;
    *txn.add_success() = etcd::PutOp(key, value);
    // The lowest ids beyond the cap go in the same transaction.
    std::vector<std::string> keys;
    for (const auto& kv : kept.kvs()) {
      if (kv.key() != key) keys.push_back(kv.key());
    }
    keys.push_back(key);
    std::sort(keys.begin(), keys.end());
    for (size_t i = 0; i + kMaxStoredDrills < keys.size() && txn.success_size() < etcd::kMaxTxnOps; ++i) {
      if (keys[i] == key) return absl::OkStatus();  // older than every drill kept: not kept either
      *txn.add_success() = etcd::DeleteOp(keys[i]);
    }
    return Write(txn, "PutDrill").status();
  }

  absl::StatusOr<std::vector<DrillRecord>> ListDrills() override {
    pb::RangeRequest r;
    r.set_key(DrillsPrefix());
    r.set_range_end(etcd::PrefixEnd(r.key()));
    r.set_sort_target(pb::RangeRequest::KEY);
    r.set_sort_order(pb::RangeRequest::ASCEND);
    CKPTD_ASSIGN_OR_RETURN(pb::RangeResponse got, Read(r));
    std::vector<DrillRecord> out;
    for (const auto& kv : got.kvs()) {
      DrillRecord d;
      if (!d.ParseFromString(kv.value())) return Unreadable(kv.key());
      out.push_back(std::move(d));
    }
    return out;
  }

  absl::Status PutCommitIntent(const CommitIntent& c) override {
    if (c.job().empty()) return absl::InvalidArgumentError("PutCommitIntent: the intent names no job");
    CKPTD_ASSIGN_OR_RETURN(std::string value, internal::SerializeForStore(c));
    pb::TxnRequest txn;
    *txn.add_success() = etcd::PutOp(IntentKey(c.job()), value);
    return Write(txn, "PutCommitIntent").status();
  }

  absl::StatusOr<std::vector<CommitIntent>> ListCommitIntents() override {
    pb::RangeRequest r;
    r.set_key(absl::StrCat(root_, "committing/"));
    r.set_range_end(etcd::PrefixEnd(r.key()));
    CKPTD_ASSIGN_OR_RETURN(pb::RangeResponse got, Read(r));
    std::vector<CommitIntent> out;
    for (const auto& kv : got.kvs()) {
      CommitIntent c;
      if (!c.ParseFromString(kv.value())) return Unreadable(kv.key());
      out.push_back(std::move(c));
    }
    std::sort(out.begin(), out.end(), [](const CommitIntent& a, const CommitIntent& b) { return a.job() < b.job(); });
    return out;
  }

 private:
  struct Event {
    FailureEvent event;
    int64_t revision;  // mod_revision: the order of appends
  };

  std::string JobKey(absl::string_view job) const { return absl::StrCat(root_, "jobs/", EtcdKeyName(job)); }
  std::string QuarantinePrefix(absl::string_view job) const {
    return absl::StrCat(root_, "quarantine/", EtcdKeyName(job), "/");
  }
  std::string IntentKey(absl::string_view job) const { return absl::StrCat(root_, "committing/", EtcdKeyName(job)); }
  std::string DrillsPrefix() const { return absl::StrCat(root_, "drills/"); }
  // Every event's prefix for "", else the job's.
  std::string EventsPrefix(absl::string_view job) const {
    return job.empty() ? absl::StrCat(root_, "events/") : absl::StrCat(root_, "events/", EtcdKeyName(job), "/");
  }

  static absl::Status Unreadable(absl::string_view key) {
    return absl::DataLossError(absl::StrCat("etcd key ", key, " holds a value that does not parse"));
  }

  // Parses `got`'s events into `out`, leaving out the keys `seen` holds.
  static absl::Status Collect(const pb::RangeResponse& got, const pb::RangeResponse& seen, std::vector<Event>* out) {
    absl::flat_hash_set<absl::string_view> seen_keys;
    for (const auto& kv : seen.kvs()) seen_keys.insert(kv.key());
    for (const auto& kv : got.kvs()) {
      if (seen_keys.contains(kv.key())) continue;
      Event e;
      if (!e.event.ParseFromString(kv.value())) return Unreadable(kv.key());
      e.revision = kv.mod_revision();
      out->push_back(std::move(e));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<pb::RangeResponse> Read(const pb::RangeRequest& r) {
    absl::StatusOr<pb::RangeResponse> got = etcd_->Range(r);
    if (!got.ok()) {
      return absl::Status(got.status().code(),
                          absl::StrCat("reading the coordinator state from etcd: ", got.status().message()));
    }
    return got;
  }

  // Runs `txn` guarded by this replica's leadership. kFailedPrecondition
  // when it does not lead, or etcd refused the guard (the election steps down).
  absl::StatusOr<pb::TxnResponse> Write(pb::TxnRequest& txn, absl::string_view what) {
    absl::StatusOr<int64_t> epoch = election_->Leading();
    if (!epoch.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": not written to etcd: ", epoch.status().message()));
    }
    *txn.add_compare() = election_->Guard(*epoch);
    absl::StatusOr<pb::TxnResponse> r = etcd_->Txn(txn);
    if (!r.ok()) {
      return absl::Status(r.status().code(),
                          absl::StrCat(what, ": writing the coordinator state to etcd: ", r.status().message()));
    }
    if (!r->succeeded()) {
      election_->Fenced(*epoch, what);
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": refused by etcd: this coordinator's leadership (epoch ", *epoch,
          ") has ended and another coordinator leads; nothing was written"));
    }
    MaybeCompact(r->header().revision());
    return r;
  }

  void MaybeCompact(int64_t revision) {
    if (options_.compact_every_writes == 0) return;
    int64_t compact_to = 0;
    {
      absl::MutexLock l(&compact_mu_);
      if (++writes_ < options_.compact_every_writes) return;
      writes_ = 0;
      compact_to = std::exchange(compact_point_, revision);
    }
    // Keeps the last compact_every_writes writes' history for watchers.
    if (compact_to > 0) (void)etcd_->Compact(compact_to);
  }

  etcd::EtcdClient* const etcd_;
  etcd::LeaderElection* const election_;
  const EtcdStateStoreOptions options_;
  const std::string root_;
  const size_t max_events_;

  absl::Mutex events_mu_;
  std::deque<std::string> events_ ABSL_GUARDED_BY(events_mu_);  // kept events' keys, oldest appended first
  absl::Mutex drills_mu_;
  absl::Mutex compact_mu_;
  uint64_t writes_ ABSL_GUARDED_BY(compact_mu_) = 0;
  int64_t compact_point_ ABSL_GUARDED_BY(compact_mu_) = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> OpenEtcdStateStore(etcd::EtcdClient* etcd,
                                                               etcd::LeaderElection* election,
                                                               const EtcdStateStoreOptions& options) {
  if (options.prefix.empty() || options.prefix.front() != '/' || options.prefix.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd prefix \"", options.prefix, "\" must start with / and not end with one (e.g. /ckptd/prod)"));
  }
  auto store = std::make_unique<EtcdStateStore>(etcd, election, options);
  CKPTD_RETURN_IF_ERROR(store->Load());
  return store;
}

}  // namespace ckptd::coordinator
