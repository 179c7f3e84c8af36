// What the AgentCore tests (agent_core_test.cc, coordinated_agent_test.cc)
// share: the tensors a trainer registers, an agent's options over a storage
// root "/ckpt", snapshots taken as a trainer takes them, and a call that
// waits on a FakeClock made from a thread of its own.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent_core.h"
#include "base/clock.h"
#include "base/testing/matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "staging/staging.h"

namespace ckptd::agent {

// A one-dimensional tensor of `n` elements.
inline ckptd::v1::Tensor Buffer(const std::string& name, ckptd::v1::Component c, ckptd::v1::DType d, uint64_t n) {
  ckptd::v1::Tensor t;
  t.set_name(name);
  t.set_component(c);
  t.set_dtype(d);
  t.add_shape(n);
  return t;
}

// One rank's five components (48124 bytes of buffers).
inline TrainerRegistration FiveComponents(const std::string& job) {
  TrainerRegistration r;
  r.job = job;
  r.buffers = {Buffer("params", ckptd::v1::PARAMS, ckptd::v1::FLOAT32, 3000),
               Buffer("grads", ckptd::v1::GRADS, ckptd::v1::FLOAT32, 3000),
               Buffer("adam", ckptd::v1::OPTIMIZER, ckptd::v1::FLOAT32, 6000),
               Buffer("rng", ckptd::v1::RNG, ckptd::v1::BYTES, 100),
               Buffer("cursor", ckptd::v1::DATA_CURSOR, ckptd::v1::BYTES, 24)};
  return r;
}

// The options of an agent over the storage root "/ckpt" (the test makes it),
// with staging segments of its own: "/ckptd-test-<tag>-<pid>-<n>".
inline AgentOptions TestAgentOptions(absl::string_view tag) {
  static int counter = 0;
  AgentOptions o;
  o.storage_root = "/ckpt";
  o.segment_prefix = absl::StrCat("/ckptd-test-", tag, "-", ::getpid(), "-", counter++);
  o.io_threads = 2;
  o.write.block_bytes = 4096;
  return o;
}

// A snapshot of `step` as the trainer of `h` takes it: a free slot of `seg`
// filled with `fill` (by default the step's low byte), published, and
// `agent` told.
inline void Snapshot(AgentCore& agent, staging::StagingSegment& seg, const TrainerHandle& h, uint64_t step,
                     uint8_t fill, double stall_seconds = 0) {
  CKPTD_ASSERT_OK_AND_ASSIGN(uint32_t slot, seg.AcquireForFill(absl::Seconds(10)));
  std::memset(seg.slot_data(slot), fill, h.slot_bytes);
  CKPTD_ASSERT_OK(seg.Publish(slot, step));
  CKPTD_ASSERT_OK(agent.SnapshotPublished(h.trainer_id, slot, step, stall_seconds));
}
inline void Snapshot(AgentCore& agent, staging::StagingSegment& seg, const TrainerHandle& h, uint64_t step) {
  Snapshot(agent, seg, h, step, static_cast<uint8_t>(step & 0xff));
}

// Snapshot(), then waits until `step` is persisted.
inline void SnapshotAndWait(AgentCore& agent, staging::StagingSegment& seg, const TrainerHandle& h, uint64_t step,
                            uint8_t fill, double stall_seconds = 0) {
  ASSERT_NO_FATAL_FAILURE(Snapshot(agent, seg, h, step, fill, stall_seconds));
  CKPTD_ASSERT_OK_AND_ASSIGN(PersistStatus st, agent.WaitPersisted(h.trainer_id, step, absl::Seconds(30)));
  ASSERT_THAT(st.last_persisted_step, ::testing::Optional(step)) << st.last_error;
}
inline void SnapshotAndWait(AgentCore& agent, staging::StagingSegment& seg, const TrainerHandle& h, uint64_t step) {
  SnapshotAndWait(agent, seg, h, step, static_cast<uint8_t>(step & 0xff));
}

// `call`, which waits on `clock`, made on a thread of its own while the test
// moves the clock. The destructor sets the clock to the end of time if the
// call has not returned yet, and joins the thread.
template <typename T>
class BackgroundCall {
 public:
  BackgroundCall(base::FakeClock* clock, std::function<T()> call)
      : clock_(clock), thread_([this, call = std::move(call)] {
          T r = call();
          absl::MutexLock l(&mu_);
          result_ = std::move(r);
        }) {}
  ~BackgroundCall() {
    if (!done()) clock_->Set(absl::InfiniteFuture());
    thread_.join();
  }
  BackgroundCall(const BackgroundCall&) = delete;
  BackgroundCall& operator=(const BackgroundCall&) = delete;

  bool done() {
    absl::MutexLock l(&mu_);
    return result_.has_value();
  }
  // What the call returned. REQUIRES: done().
  T result() {
    absl::MutexLock l(&mu_);
    return *result_;
  }

 private:
  base::FakeClock* const clock_;
  absl::Mutex mu_;
  std::optional<T> result_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: it starts once the rest is made
};

}  // namespace ckptd::agent
