// A fake coordinator for the tests of ckptctl's online commands: canned
// answers per RPC, a record of what was asked, and a fixture that runs a
// command against it on a fake clock.
#pragma once

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/flags.h"
#include "base/testing/temp_dir.h"
#include "cli/operator_commands.h"
#include "gtest/gtest.h"

namespace ckptd::cli {

using ckptd::v1::StepEntry;

constexpr char kAddress[] = "coord.example:7070";
// 2024-05-01T12:00:00Z.
inline const absl::Time kNow = absl::FromUnixSeconds(1714564800);

inline int64_t NanosBefore(absl::Duration d) { return absl::ToUnixNanos(kNow - d); }

// What the fake coordinator answers, and what it was asked.
struct FakeCoordinator {
  // When set, every RPC fails with it.
  std::optional<absl::Status> error;

  ckptd::v1::GetClusterStatusResponse cluster;
  ckptd::v1::ListEventsResponse events;
  std::map<std::string, absl::StatusOr<ckptd::v1::IntervalStatus>> intervals;
  absl::StatusOr<ckptd::v1::RequestCheckpointResponse> checkpoint = ckptd::v1::RequestCheckpointResponse();
  // ListSteps' answer to its n-th call (0-based); the last one repeats.
  std::vector<absl::StatusOr<ckptd::v1::ListStepsResponse>> steps{ckptd::v1::ListStepsResponse()};
  // The cluster status from the n-th call on (for a moved target).
  std::map<int, ckptd::v1::GetClusterStatusResponse> cluster_from_call;
  absl::StatusOr<ckptd::v1::RestorePreview> preview = ckptd::v1::RestorePreview();
  std::vector<ckptd::v1::VerifyProgress> verify_stream;
  absl::Status verify_end;  // returned after the stream when not OK

  int list_steps_calls = 0;
  int cluster_calls = 0;
  std::vector<std::string> interval_jobs;
  std::optional<ckptd::v1::ListEventsRequest> events_request;
  std::optional<ckptd::v1::VerifyStepRequest> verify_request;
  std::optional<base::Args> args;  // what the factory was given
  int connects = 0;
  // Drills: RunDrill's answer, and GetDrill's answer to its n-th call (the
  // last one repeats).
  absl::StatusOr<ckptd::v1::RunDrillResponse> run_drill = ckptd::v1::RunDrillResponse();
  std::optional<ckptd::v1::RunDrillRequest> drill_request;
  std::vector<ckptd::v1::DrillStatus> drill{ckptd::v1::DrillStatus()};
  // When set, GetDrill's answer instead of `drill` (a drill as of the test's
  // clock).
  std::function<ckptd::v1::DrillStatus()> drill_now;
  int get_drill_calls = 0;
};

class FakeApi final : public CoordinatorApi {
 public:
  explicit FakeApi(FakeCoordinator* f) : f_(f) {}

  absl::StatusOr<ckptd::v1::GetClusterStatusResponse> ClusterStatus() override {
    const int call = f_->cluster_calls++;
    if (f_->error) return *f_->error;
    ckptd::v1::GetClusterStatusResponse r = f_->cluster;
    for (const auto& [from, cs] : f_->cluster_from_call) {
      if (call >= from) r = cs;
    }
    return r;
  }
  absl::StatusOr<ckptd::v1::ListEventsResponse> ListEvents(const ckptd::v1::ListEventsRequest& req) override {
    f_->events_request = req;
    if (f_->error) return *f_->error;
    return f_->events;
  }
  absl::StatusOr<ckptd::v1::IntervalStatus> GetInterval(const ckptd::v1::GetIntervalRequest& req) override {
    f_->interval_jobs.push_back(req.job());
    if (f_->error) return *f_->error;
    auto it = f_->intervals.find(req.job());
    if (it == f_->intervals.end()) return absl::NotFoundError(absl::StrCat("no job ", req.job()));
    return it->second;
  }
  absl::StatusOr<ckptd::v1::RequestCheckpointResponse> RequestCheckpoint(
      const ckptd::v1::RequestCheckpointRequest& req) override {
    if (f_->error) return *f_->error;
    return f_->checkpoint;
  }
  absl::StatusOr<ckptd::v1::ListStepsResponse> ListSteps(const ckptd::v1::ListStepsRequest& req) override {
    const int call = f_->list_steps_calls++;
    if (f_->error) return *f_->error;
    return f_->steps[std::min<size_t>(call, f_->steps.size() - 1)];
  }
  absl::StatusOr<ckptd::v1::RestorePreview> GetRestorePreview(const ckptd::v1::RestorePreviewRequest& req) override {
    if (f_->error) return *f_->error;
    return f_->preview;
  }
  absl::StatusOr<ckptd::v1::VerifyProgress> VerifyStep(
      const ckptd::v1::VerifyStepRequest& req,
      const std::function<void(const ckptd::v1::VerifyProgress&)>& on_progress) override {
    f_->verify_request = req;
    if (f_->error) return *f_->error;
    for (const auto& p : f_->verify_stream) on_progress(p);
    if (!f_->verify_end.ok()) return f_->verify_end;
    if (f_->verify_stream.empty() || !f_->verify_stream.back().done()) {
      return absl::UnknownError("the verification stream ended without a final result");
    }
    return f_->verify_stream.back();
  }
  absl::StatusOr<ckptd::v1::RunDrillResponse> RunDrill(const ckptd::v1::RunDrillRequest& req) override {
    f_->drill_request = req;
    if (f_->error) return *f_->error;
    return f_->run_drill;
  }
  absl::StatusOr<ckptd::v1::DrillStatus> GetDrill(const ckptd::v1::GetDrillRequest&) override {
    const int call = f_->get_drill_calls++;
    if (f_->error) return *f_->error;
    if (f_->drill_now) return f_->drill_now();
    return f_->drill[std::min<size_t>(call, f_->drill.size() - 1)];
  }

 private:
  FakeCoordinator* f_;
};

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

using Runner = std::function<int(const std::vector<std::string>&, const CoordinatorApiFactory&, std::ostream&,
                                 std::ostream&, const OperatorEnv&)>;

class OperatorCommandsTest : public ::testing::Test {
 protected:
  CoordinatorApiFactory Factory() {
    return [this](const base::Args& args) -> absl::StatusOr<std::unique_ptr<CoordinatorApi>> {
      fake_.args = args;
      ++fake_.connects;
      return std::unique_ptr<CoordinatorApi>(new FakeApi(&fake_));
    };
  }
  OperatorEnv Env() {
    OperatorEnv env;
    env.now = [this] { return now_; };
    env.sleep = [this](absl::Duration d) {
      sleeps_.push_back(d);
      now_ += d;
    };
    return env;
  }
  // Runs `run` with --coordinator kAddress added.
  Result Run(const Runner& run, std::vector<std::string> argv) {
    argv.insert(argv.begin(), {"--coordinator", kAddress});
    return RunExactly(run, argv);
  }
  Result RunExactly(const Runner& run, const std::vector<std::string>& argv) {
    std::ostringstream out, err;
    Result r;
    r.code = run(argv, Factory(), out, err, Env());
    r.out = out.str();
    r.err = err.str();
    return r;
  }

  // A job "llm" of world 4 on two nodes, one of them lost, with an interval
  // decided, and two failures.
  void TwoNodes() {
    ckptd::v1::AgentStatus* a = fake_.cluster.add_agents();
    a->set_node_id("node-a");
    a->set_address("host-a");
    a->set_alive(true);
    a->set_last_heartbeat_unix_nanos(NanosBefore(absl::Milliseconds(400)));
    a->add_gpus("cuda:0");
    a->add_gpus("cuda:1");
    for (uint32_t r : {0u, 1u}) {
      ckptd::v1::RankInfo* ri = a->add_ranks();
      ri->set_job("llm");
      ri->set_rank(r);
      ri->set_world_size(4);
      ri->set_pid(100 + static_cast<int>(r));
      ri->set_gpu(static_cast<int>(r));
    }
    ckptd::v1::AgentStatus* b = fake_.cluster.add_agents();
    b->set_node_id("node-b");
    b->set_alive(false);
    b->set_last_heartbeat_unix_nanos(NanosBefore(absl::Seconds(12)));
    for (uint32_t r : {2u, 3u}) {
      ckptd::v1::RankInfo* ri = b->add_ranks();
      ri->set_job("llm");
      ri->set_rank(r);
      ri->set_world_size(4);
    }
    ckptd::v1::JobStatus* j = fake_.cluster.add_jobs();
    j->set_job("llm");
    j->set_world_size(4);
    j->set_state(ckptd::v1::JOB_RESTARTING);
    j->mutable_schedule()->set_every_steps(100);
    j->mutable_schedule()->set_incarnation(3);
    j->set_has_committed(true);
    j->set_newest_committed_step(1200);
    j->set_fastest_step(1240);
    j->set_slowest_step(1236);
    j->set_ranks_alive(2);
    j->set_checkpoints_committed(12);
    j->set_checkpoints_aborted(1);
    j->add_pending_steps(1240);
    j->add_quarantined_steps(1100);
    j->set_step_seconds(2.5);
    ckptd::v1::JobStatus* other = fake_.cluster.add_jobs();
    other->set_job("aaa");
    other->set_world_size(1);
    other->set_state(ckptd::v1::JOB_RUNNING);
    ckptd::v1::IntervalStatus iv;
    iv.set_job("llm");
    iv.set_automatic(true);
    iv.set_decided(true);
    iv.set_interval_seconds(1000);
    iv.set_interval_steps(400);
    iv.set_expected_waste(0.031);
    iv.set_reason("Daly optimum");
    fake_.intervals["llm"] = iv;
    ckptd::v1::IntervalStatus waiting;
    waiting.set_automatic(true);
    waiting.set_waiting_for("a committed checkpoint");
    fake_.intervals["aaa"] = waiting;
    ckptd::v1::FailureEvent* old = fake_.events.add_events();
    old->set_unix_nanos(NanosBefore(absl::Hours(3)));
    old->set_node_id("node-a");
    old->set_job("llm");
    old->set_kind(ckptd::v1::TRAINER_HUNG);
    old->set_has_rank(true);
    old->set_rank(0);
    old->set_detail("no step for 120 s");
    ckptd::v1::FailureEvent* e = fake_.events.add_events();
    e->set_unix_nanos(NanosBefore(absl::Minutes(5)));
    e->set_node_id("node-b");
    e->set_kind(ckptd::v1::NODE_LOST);
    e->set_detail("no heartbeat for 5 s");
  }

  // ListSteps answers: each a list of (step, state, reported of 4, reason).
  struct StepSpec {
    uint64_t step;
    ckptd::v1::StepState state;
    uint32_t reported;
    std::string reason;
  };
  static ckptd::v1::ListStepsResponse Steps(const std::vector<StepSpec>& specs) {
    ckptd::v1::ListStepsResponse r;
    for (const StepSpec& s : specs) {
      StepEntry* e = r.add_steps();
      e->set_step(s.step);
      e->set_state(s.state);
      e->set_world_size(4);
      e->set_ranks_reported(s.reported);
      e->set_reason(s.reason);
      if (s.state == ckptd::v1::STEP_COMMITTED) {
        e->set_raw_bytes(uint64_t{8} << 30);
        e->set_stored_bytes(uint64_t{4} << 30);
      }
    }
    return r;
  }
  // A running job "llm" of world 4 whose fastest rank is at `fastest`, with
  // one-off targets `extras`.
  static ckptd::v1::GetClusterStatusResponse Running(uint64_t fastest, std::vector<uint64_t> extras) {
    ckptd::v1::GetClusterStatusResponse cs;
    ckptd::v1::JobStatus* j = cs.add_jobs();
    j->set_job("llm");
    j->set_world_size(4);
    j->set_state(ckptd::v1::JOB_RUNNING);
    j->set_fastest_step(fastest);
    for (uint64_t e : extras) j->mutable_schedule()->add_extra_steps(e);
    return cs;
  }
  void Requested(uint64_t target) {
    ckptd::v1::RequestCheckpointResponse r;
    r.set_target_step(target);
    fake_.checkpoint = r;
    fake_.cluster = Running(target - 10, {target});
  }

  // A file `name` holding `contents` in the test's own temp dir.
  std::string TokenFile(absl::string_view name, absl::string_view contents) {
    const std::string path = temp_.Sub(std::string(name));
    std::ofstream(path) << contents;
    return path;
  }

  ckptd::testing::TempDir temp_{"cli_test_"};
  FakeCoordinator fake_;
  absl::Time now_ = kNow;
  std::vector<absl::Duration> sleeps_;
};

inline std::vector<std::string> Lines(absl::string_view s) { return absl::StrSplit(s, '\n', absl::SkipEmpty()); }

// The number after "key": in JSON output; NaN when absent or not a number.
inline double JsonNumber(absl::string_view json, absl::string_view key) {
  const std::string needle = absl::StrCat("\"", key, "\":");
  const size_t at = json.find(needle);
  if (at == absl::string_view::npos) return std::nan("");
  absl::string_view rest = json.substr(at + needle.size());
  double v = 0;
  if (!absl::SimpleAtod(rest.substr(0, rest.find_first_of(",}]")), &v)) return std::nan("");
  return v;
}

}  // namespace ckptd::cli
