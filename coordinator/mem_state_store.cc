// StateStore in memory: the same contract as the SQLite store, nothing durable.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "coordinator/state_store.h"
#include "coordinator/state_store_internal.h"

namespace ckptd::coordinator {
namespace {

using ckptd::v1::CommitIntent;
using ckptd::v1::DrillRecord;
using ckptd::v1::FailureEvent;
using ckptd::v1::FailureKind;
using ckptd::v1::JobRecord;
using ckptd::v1::QuarantinedStep;

class MemStateStore final : public StateStore {
 public:
  explicit MemStateStore(const StateStoreOptions& options)
      : max_events_(std::max<size_t>(options.max_events, 1)) {}

  absl::Status AppendEvent(const FailureEvent& event) override {
    CKPTD_RETURN_IF_ERROR(internal::SerializeForStore(event).status());
    absl::MutexLock lock(&mu_);
    events_.push_back({next_seq_++, event});
    while (events_.size() > max_events_) events_.pop_front();
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<FailureEvent>> ListEvents(absl::string_view job, size_t limit) override {
    absl::MutexLock lock(&mu_);
    std::vector<const Stored*> matching;
    for (const Stored& s : events_) {
      if (job.empty() || s.event.job() == job) matching.push_back(&s);
    }
    // Newest first by time; ties: last appended first.
    std::sort(matching.begin(), matching.end(), [](const Stored* a, const Stored* b) {
      if (a->event.unix_nanos() != b->event.unix_nanos()) {
        return a->event.unix_nanos() > b->event.unix_nanos();
      }
      return a->seq > b->seq;
    });
    if (matching.size() > limit) matching.resize(limit);
    std::vector<FailureEvent> out;
    out.reserve(matching.size());
    for (const Stored* s : matching) out.push_back(s->event);
    return out;
  }

  absl::StatusOr<absl::flat_hash_map<FailureKind, uint64_t>> CountEventsByKind(absl::string_view job,
                                                                              absl::Time since) override {
    const int64_t since_nanos = absl::ToUnixNanos(since);
    absl::MutexLock lock(&mu_);
    absl::flat_hash_map<FailureKind, uint64_t> counts;
    for (const Stored& s : events_) {
      if ((job.empty() || s.event.job() == job) && s.event.unix_nanos() >= since_nanos) {
        ++counts[s.event.kind()];
      }
    }
    return counts;
  }

  absl::Status PutJob(const JobRecord& record) override {
    if (record.job().empty()) return absl::InvalidArgumentError("PutJob: the record names no job");
    CKPTD_RETURN_IF_ERROR(internal::SerializeForStore(record).status());
    absl::MutexLock lock(&mu_);
    jobs_[record.job()] = record;
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<JobRecord>> ListJobs() override {
    absl::MutexLock lock(&mu_);
    std::vector<JobRecord> out;
    out.reserve(jobs_.size());
    for (const auto& [name, record] : jobs_) out.push_back(record);
    return out;
  }

  absl::Status DeleteJob(absl::string_view job) override {
    absl::MutexLock lock(&mu_);
    jobs_.erase(std::string(job));
    intents_.erase(std::string(job));
    for (auto it = quarantine_.begin(); it != quarantine_.end();) {
      it = it->first.first == job ? quarantine_.erase(it) : std::next(it);
    }
    return absl::OkStatus();
  }

  absl::Status PutQuarantine(const QuarantinedStep& q) override {
    if (q.job().empty()) return absl::InvalidArgumentError("PutQuarantine: the step names no job");
    CKPTD_RETURN_IF_ERROR(internal::SerializeForStore(q).status());
    absl::MutexLock lock(&mu_);
    quarantine_.try_emplace({q.job(), q.step()}, q);  // the first record of a step is kept
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<QuarantinedStep>> ListQuarantined(absl::string_view job) override {
    absl::MutexLock lock(&mu_);
    std::vector<QuarantinedStep> out;
    for (const auto& [key, q] : quarantine_) {
      if (job.empty() || key.first == job) out.push_back(q);
    }
    return out;
  }

  absl::Status PutDrill(const DrillRecord& d) override {
    if (d.id() == 0) return absl::InvalidArgumentError("PutDrill: the drill has no id");
    CKPTD_RETURN_IF_ERROR(internal::SerializeForStore(d).status());
    absl::MutexLock lock(&mu_);
    drills_[d.id()] = d;
    while (drills_.size() > kMaxStoredDrills) drills_.erase(drills_.begin());
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<DrillRecord>> ListDrills() override {
    absl::MutexLock lock(&mu_);
    std::vector<DrillRecord> out;
    out.reserve(drills_.size());
    for (const auto& [id, d] : drills_) out.push_back(d);
    return out;
  }

  absl::Status PutCommitIntent(const CommitIntent& c) override {
    if (c.job().empty()) return absl::InvalidArgumentError("PutCommitIntent: the intent names no job");
    CKPTD_RETURN_IF_ERROR(internal::SerializeForStore(c).status());
    absl::MutexLock lock(&mu_);
    intents_[c.job()] = c;
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<CommitIntent>> ListCommitIntents() override {
    absl::MutexLock lock(&mu_);
    std::vector<CommitIntent> out;
    out.reserve(intents_.size());
    for (const auto& [job, c] : intents_) out.push_back(c);
    return out;
  }

 private:
  struct Stored {
    uint64_t seq;  // append order
    FailureEvent event;
  };

  const size_t max_events_;
  absl::Mutex mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Stored> events_ ABSL_GUARDED_BY(mu_);  // in append order
  // std::string orders bytewise (as unsigned char), like SQLite's BLOB keys.
  std::map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, uint64_t>, QuarantinedStep> quarantine_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, DrillRecord> drills_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, CommitIntent> intents_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<StateStore> NewMemStateStore(const StateStoreOptions& options) {
  return std::make_unique<MemStateStore>(options);
}

}  // namespace ckptd::coordinator
