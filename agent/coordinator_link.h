// The agent's side of the coordinator: registration of the node and the
// ranks it hosts, the heartbeat stream (progress and timings out, schedules
// in), shard reports that survive a disconnect, failure reports, and restore
// plans. AgentCore talks to the CoordinatorClient interface
// (coordinator_client.h); CoordinatorLink implements it over gRPC.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/coordinator_client.h"
#include "base/clock.h"
#include "base/logger.h"
#include "ckptd/v1/coordinator.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "rpc/coordinator_targets.h"

namespace ckptd::agent {

struct CoordinatorLinkOptions {
  // host:port, or the replicas of a replicated coordinator as
  // host:port,host:port,...: the link follows their leader.
  std::string address;
  std::string node_id;
  std::string host_name;  // informational
  std::vector<std::string> gpus;
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // insecure when null
  // The node credential every call carries as "authorization: Bearer
  // <token>" (the coordinator's agent token); empty: none, for a coordinator
  // that knows agents by their TLS certificate or runs --insecure-agents.
  std::string agent_token;
  absl::Duration rpc_timeout = absl::Seconds(5);
  // Used until the coordinator says otherwise at registration.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration max_backoff = absl::Seconds(2);
  // Started with --allow-drills (told to the coordinator at registration).
  bool drills_allowed = false;
  // Peer replication, told at registration: where partners reach this
  // agent (empty: it takes part in none), its failure domain, and how many
  // partners it sends to.
  std::string peer_address;
  std::string failure_domain;
  uint32_t replicas = 0;
  // The agent keeps its trainers' snapshots in memory (no --no-memory-tier):
  // it takes memory checkpoints. Told at registration.
  bool memory_tier = true;
  // Called with every heartbeat answer, on the heartbeat thread (drill
  // orders, and the delivery of the drill reports the heartbeat carried).
  std::function<void(const ckptd::v1::HeartbeatAck&)> on_ack;
  // Called with every registration's answer, before its first heartbeat,
  // on the heartbeat thread (the Peer service's fetch key).
  std::function<void(const ckptd::v1::RegisterAgentResponse&)> on_registered;
  // Where the component reports what an operator should read (default:
  // base::DefaultLogger()); must outlive it.
  base::Logger* logger = nullptr;
  // Measures and waits on time: heartbeat intervals, back-off, the sender's
  // poll, Flush, and cut-offs (default: base::RealClock::Get()); must outlive
  // the link. The deadlines of its RPCs stay on real time.
  base::Clock* clock = nullptr;
};

// What the agent reports in each heartbeat: the ranks it hosts and their progress.
using HeartbeatFiller = std::function<void(ckptd::v1::Heartbeat*)>;

class CoordinatorLink : public CoordinatorClient {
 public:
  // Starts the background threads at once; the coordinator need not be up.
  CoordinatorLink(CoordinatorLinkOptions options, HeartbeatFiller fill);
  ~CoordinatorLink() override;
  CoordinatorLink(const CoordinatorLink&) = delete;
  CoordinatorLink& operator=(const CoordinatorLink&) = delete;

  void ShardDurable(const ckptd::v1::ShardReport& report) override;
  void Failure(const ckptd::v1::ReportFailureRequest& failure) override;
  absl::StatusOr<ckptd::v1::RestorePlanResponse> RestorePlan(const ckptd::v1::RestorePlanRequest& request,
                                                             absl::Duration timeout) override;
  absl::StatusOr<ckptd::v1::ReshardPlanResponse> ReshardPlan(const ckptd::v1::ReshardPlanRequest& request,
                                                             absl::Duration timeout) override;
  std::optional<ckptd::v1::Schedule> ScheduleFor(const std::string& job) override;

  // Waits up to `timeout` until every queued report was answered (for a
  // clean shutdown); false when some are still waiting.
  bool Flush(absl::Duration timeout);

  // A drill: for `duration` the link sends nothing to the coordinator (the
  // heartbeat stream is dropped, reports stay queued, restore plans fail with
  // kUnavailable); then it reconnects by itself, registering again if the
  // coordinator forgot it. Zero (or less) lifts a cut-off in progress.
  void CutOff(absl::Duration duration);

  // For tests and status: whether a registration is current, and how many
  // shard reports wait for an answer.
  bool connected();
  // Whether the coordinator has this agent now: a registration is current,
  // no heartbeat stream failed since its last answer, and no drill cut the
  // link off (readiness, the agent's metrics).
  bool registered();
  // Why it has not: the error of the last registration or heartbeat stream
  // that failed since the coordinator last answered (OK: none).
  absl::Status last_error();
  // The coordinator(s) as given (CoordinatorLinkOptions::address).
  const std::string& address() const { return options_.address; }
  size_t unanswered_shards();
  // How many answered reports the next registration sends again.
  size_t answered_shards();
  // The newest coordinator epoch this link has heard.
  uint64_t coordinator_epoch();
  bool cut_off();

 private:
  // The node's session, waited for within `timeout` right after start;
  // kUnavailable (starting with `what`) without one.
  absl::StatusOr<std::string> SessionFor(absl::string_view what, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Sends `request` (its node_id and session filled in) through `method`,
  // bounded by `timeout`; errors start with `what`.
  template <typename Request, typename Response>
  absl::StatusOr<Response> AskInSession(
      absl::string_view what, const Request& request, absl::Duration timeout,
      grpc::Status (ckptd::v1::Coordinator::Stub::*method)(grpc::ClientContext*, const Request&, Response*));
  using ShardKey = std::tuple<std::string, uint64_t, uint32_t>;
  void HeartbeatLoop();
  void SenderLoop();
  absl::Status Register();
  // Runs one heartbeat stream until it ends; returns why.
  absl::Status StreamHeartbeats(const std::string& session);
  bool SleepUnlessStopping(absl::Duration d);
  // A call's deadline (`timeout` from now, on real time) and credential.
  void Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const;
  // REQUIRES: mu_ held.
  bool CutOffLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return clock_->Now() < cut_until_; }

  const CoordinatorLinkOptions options_;
  base::Logger* const logger_ = options_.logger != nullptr ? options_.logger : &base::DefaultLogger();
  base::Clock* const clock_ = options_.clock != nullptr ? options_.clock : base::RealClock::Get();
  const HeartbeatFiller fill_;
  // Random per agent process, sent with every registration: it tells the
  // coordinator a restarted agent from the same one registering again.
  const uint64_t instance_;
  // The coordinator(s), and the one calls go to.
  std::unique_ptr<rpc::CoordinatorTargets> targets_;
  // The stub of the current target.
  std::pair<std::string, std::unique_ptr<ckptd::v1::Coordinator::Stub>> Stub() const;
  // After a call to `used` failed: follows a standby's pointer to the
  // leader (or the next replica); the session belongs to the coordinator
  // left, so it is dropped and the heartbeat loop registers at once.
  void Follow(const std::string& used, const grpc::ClientContext& ctx, const grpc::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<std::string> session_ ABSL_GUARDED_BY(mu_);
  absl::Duration interval_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ckptd::v1::Schedule> schedules_ ABSL_GUARDED_BY(mu_);
  std::map<ShardKey, ckptd::v1::ShardReport> shards_ ABSL_GUARDED_BY(mu_);  // not yet answered
  // The newest answered report of each (job, rank): sent again with every
  // registration, since a coordinator that took it and then died (or a
  // replicated coordinator's new leader) may not have committed its step;
  // one that did answers it as a repeat.
  std::map<std::pair<std::string, uint32_t>, ckptd::v1::ShardReport> answered_ ABSL_GUARDED_BY(mu_);
  std::vector<ckptd::v1::ReportFailureRequest> failures_ ABSL_GUARDED_BY(mu_);
  bool send_wake_ ABSL_GUARDED_BY(mu_) = false;
  bool moved_ ABSL_GUARDED_BY(mu_) = false;  // Follow() changed the target: register now
  // The newest coordinator epoch heard (replicated coordinators); answers
  // of an older one, a deposed leader's, are refused.
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether `epoch` is not older than the newest heard (and records it);
  // logs a refusal naming `address` otherwise.
  bool AcceptEpoch(uint64_t epoch, const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool sending_failures_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* stream_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Time cut_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  std::thread heartbeat_thread_;
  std::thread sender_thread_;
};

}  // namespace ckptd::agent
