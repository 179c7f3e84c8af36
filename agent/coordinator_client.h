// What AgentCore needs of the coordinator, free of gRPC: shard and failure
// reports, restore and reshard plans, the schedules heard. CoordinatorLink
// (coordinator_link.h) implements it over gRPC; tests use a fake or an
// in-process coordinator core.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckptd/v1/coordinator.pb.h"

namespace ckptd::agent {

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;
  // A shard of this node is durable. Queued and sent in the background;
  // kept (and sent again on the next registration) until the coordinator
  // has answered for it. Never blocks.
  virtual void ShardDurable(const ckptd::v1::ShardReport& report) = 0;
  // A failure on this node (trainer died or hung, persist failed). Queued.
  virtual void Failure(const ckptd::v1::ReportFailureRequest& failure) = 0;
  // Asks for a restore plan, bounded by `timeout`; kUnavailable when the
  // coordinator cannot be reached.
  virtual absl::StatusOr<ckptd::v1::RestorePlanResponse> RestorePlan(const ckptd::v1::RestorePlanRequest& request,
                                                                     absl::Duration timeout) = 0;
  // The newest schedule heard for `job`, if any.
  virtual std::optional<ckptd::v1::Schedule> ScheduleFor(const std::string& job) = 0;
  // Asks which slices of which saved shards fill a rank's buffers (a step
  // read resharded), bounded by `timeout`. kUnimplemented where the
  // coordinator plans none: the agent then plans by itself.
  virtual absl::StatusOr<ckptd::v1::ReshardPlanResponse> ReshardPlan(const ckptd::v1::ReshardPlanRequest& request,
                                                                     absl::Duration timeout) {
    return absl::UnimplementedError("this coordinator makes no reshard plans");
  }
};

}  // namespace ckptd::agent
