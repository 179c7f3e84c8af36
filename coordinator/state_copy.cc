#include "coordinator/state_copy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace ckptd::coordinator {

absl::StatusOr<StateSnapshot> ReadState(StateStore& from, size_t max_events) {
  StateSnapshot s;
  CKPTD_ASSIGN_OR_RETURN(s.jobs, from.ListJobs());
  CKPTD_ASSIGN_OR_RETURN(s.quarantined, from.ListQuarantined(""));
  CKPTD_ASSIGN_OR_RETURN(s.events, from.ListEvents("", max_events));
  std::reverse(s.events.begin(), s.events.end());  // ListEvents gives the newest first
  return s;
}

absl::StatusOr<bool> StateIsEmpty(StateStore& store) {
  CKPTD_ASSIGN_OR_RETURN(std::vector<ckptd::v1::JobRecord> jobs, store.ListJobs());
  if (!jobs.empty()) return false;
  CKPTD_ASSIGN_OR_RETURN(std::vector<ckptd::v1::QuarantinedStep> quarantined, store.ListQuarantined(""));
  if (!quarantined.empty()) return false;
  CKPTD_ASSIGN_OR_RETURN(std::vector<ckptd::v1::FailureEvent> events, store.ListEvents("", 1));
  return events.empty();
}

absl::Status WriteState(const StateSnapshot& state, StateStore& to) {
  for (size_t i = 0; i < state.events.size(); ++i) {
    if (absl::Status s = to.AppendEvent(state.events[i]); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("failure event ", i + 1, " of ", state.events.size(), " (node \"",
                                                 state.events[i].node_id(), "\"): ", s.message()));
    }
  }
  for (const ckptd::v1::QuarantinedStep& q : state.quarantined) {
    if (absl::Status s = to.PutQuarantine(q); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("quarantined step ", q.step(), " of job \"", q.job(), "\": ", s.message()));
    }
  }
  for (const ckptd::v1::JobRecord& job : state.jobs) {
    if (absl::Status s = to.PutJob(job); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("the record of job \"", job.job(), "\": ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::string DescribeState(const StateSnapshot& state) {
  return absl::StrCat(state.jobs.size(), state.jobs.size() == 1 ? " job, " : " jobs, ", state.quarantined.size(),
                      state.quarantined.size() == 1 ? " quarantined step, " : " quarantined steps, ",
                      state.events.size(), state.events.size() == 1 ? " failure event" : " failure events");
}

}  // namespace ckptd::coordinator
