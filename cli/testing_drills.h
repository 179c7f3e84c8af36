// What the tests of the drill commands and of their reports share: one
// kill-trainer drill as the coordinator tells of it, its steps and the
// verification of the restored one.
#pragma once

#include <cstdint>

#include "ckptd/v1/coordinator.pb.h"

namespace ckptd::cli {

// When the drill was ordered: 2030-03-17T17:46:40Z.
inline constexpr int64_t kT0 = 1'900'000'000'000'000'000;

// Step `step` in `state`, reported by `ranks` of 4 ranks, committed at `committed_unix_nanos`.
inline ckptd::v1::StepEntry StepAt(uint64_t step, ckptd::v1::StepState state, int64_t committed_unix_nanos,
                                   uint32_t ranks = 4) {
  ckptd::v1::StepEntry e;
  e.set_step(step);
  e.set_state(state);
  e.set_world_size(4);
  e.set_ranks_reported(ranks);
  e.set_committed_unix_nanos(committed_unix_nanos);
  return e;
}

// The end of the verification of `step`'s 4 shards (4 MiB): intact when `ok`.
inline ckptd::v1::VerifyProgress Verified(uint64_t step, bool ok) {
  ckptd::v1::VerifyProgress v;
  v.set_step(step);
  v.set_done(true);
  v.set_ok(ok);
  v.set_shards_total(4);
  v.set_shards_done(4);
  v.set_bytes_done(4 << 20);
  if (!ok) v.add_problems("rank-0001.shard: tensor w block 0 chunk 2: checksum mismatch");
  return v;
}

// Drill 7 on node-b, ordered at kT0, of a job whose steps take 0.015 s.
inline ckptd::v1::DrillStatus OrderedDrill() {
  ckptd::v1::DrillStatus st;
  st.set_drill_id(7);
  st.set_node_id("node-b");
  st.set_ordered_unix_nanos(kT0);
  st.set_step_seconds(0.015);
  return st;
}

// OrderedDrill() as a kill-trainer drill on rank 2 of job llm: injected 50 ms
// after the order, detected 12 ms later, and the job resumed from step 40 two
// seconds after the failure at step 47.
inline ckptd::v1::DrillStatus ResumedDrill() {
  ckptd::v1::DrillStatus st = OrderedDrill();
  st.mutable_request()->set_scenario(ckptd::v1::KILL_TRAINER);
  st.mutable_request()->set_rank(2);
  st.mutable_report()->set_injected(true);
  st.mutable_report()->set_injected_unix_nanos(kT0 + 50'000'000);
  st.mutable_report()->set_detail("SIGKILL to pid 4242 (rank 2 of job llm)");
  ckptd::v1::FailureEvent* e = st.add_events();
  e->set_kind(ckptd::v1::TRAINER_DIED);
  e->set_node_id("node-b");
  e->set_has_rank(true);
  e->set_rank(2);
  e->set_unix_nanos(kT0 + 62'000'000);
  e->set_detail("exited on signal 9");
  st.set_first_detection_unix_nanos(kT0 + 62'000'000);
  st.set_resumed(true);
  st.set_restored_step(40);
  st.set_step_at_failure(47);
  st.set_failed_unix_nanos(kT0 + 62'000'000);
  st.set_resumed_unix_nanos(kT0 + 2'062'000'000);
  return st;
}

}  // namespace ckptd::cli
