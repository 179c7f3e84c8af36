// The coordinators a client may talk to: one address, or the replicas of a
// replicated coordinator (ckptd-coordinator --etcd-endpoints). Calls go to
// the one believed to lead; a standby's UNAVAILABLE answer names the leader
// in the trailing metadata "ckptd-leader", and the client moves there (when
// it is one of the configured addresses: an answer cannot send a client's
// credentials elsewhere), or to the next address when the answer names none
// or the replica did not answer at all.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"

namespace ckptd::rpc {

// The trailing metadata key in which a standby coordinator names the leader.
inline constexpr char kLeaderMetadataKey[] = "ckptd-leader";

// Parses "host:port[,host:port...]" (ports 1..65535, at most 16 addresses,
// duplicates dropped). kInvalidArgument naming the entry that is wrong.
absl::StatusOr<std::vector<std::string>> ParseCoordinatorAddresses(absl::string_view list);

class CoordinatorTargets {  // thread-safe
 public:
  // One channel per address (connections open on first use).
  CoordinatorTargets(std::vector<std::string> addresses, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                     const grpc::ChannelArguments& args);

  struct Target {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
  };
  // The address calls go to now.
  Target Current() const;
  // After a call to `used` ended with `status` (its trailing metadata in
  // `ctx`): on UNAVAILABLE or DEADLINE_EXCEEDED, moves to the leader the
  // answer names, or else to the next address. True when the target
  // changed (the caller retries at once: a new leader knows no session).
  bool Observe(const std::string& used, const grpc::ClientContext& ctx, const grpc::Status& status);
  // The same, from a status alone (no answer's metadata at hand).
  bool Observe(const std::string& used, const grpc::Status& status);

  size_t size() const { return targets_.size(); }
  // Every address, comma-separated.
  std::string Describe() const;

 private:
  bool MoveFrom(const std::string& used, const std::string& named) ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<Target> targets_;
  mutable absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckptd::rpc
