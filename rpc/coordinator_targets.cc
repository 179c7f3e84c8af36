#include "rpc/coordinator_targets.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/host_port.h"

namespace ckptd::rpc {

constexpr size_t kMaxCoordinators = 16;

absl::StatusOr<std::vector<std::string>> ParseCoordinatorAddresses(absl::string_view list) {
  std::vector<std::string> out;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    absl::StatusOr<std::pair<std::string, uint16_t>> hp = base::ParseHostPort(entry, base::PortUse::kConnect);
    // Its message quotes the entry.
    if (!hp.ok()) return absl::InvalidArgumentError(hp.status().message());
    if (std::find(out.begin(), out.end(), entry) == out.end()) out.emplace_back(entry);
  }
  if (out.size() > kMaxCoordinators) {
    return absl::InvalidArgumentError(
        absl::StrCat(out.size(), " coordinator addresses: at most ", kMaxCoordinators));
  }
  return out;
}

CoordinatorTargets::CoordinatorTargets(std::vector<std::string> addresses,
                                       const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                       const grpc::ChannelArguments& args) {
  for (std::string& a : addresses) {
    grpc::ChannelArguments own = args;
    // Replicas' connections are their own, never shared with another target.
    own.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    targets_.push_back(Target{a, grpc::CreateCustomChannel(a, credentials, own)});
  }
}

CoordinatorTargets::Target CoordinatorTargets::Current() const {
  absl::MutexLock l(&mu_);
  return targets_[current_];
}

std::string CoordinatorTargets::Describe() const {
  std::vector<std::string> all;
  for (const Target& t : targets_) all.push_back(t.address);
  return absl::StrJoin(all, ",");
}

bool CoordinatorTargets::Observe(const std::string& used, const grpc::ClientContext& ctx, const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
      status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    return false;
  }
  std::string named;
  const auto& trailers = ctx.GetServerTrailingMetadata();
  if (auto it = trailers.find(kLeaderMetadataKey); it != trailers.end()) {
    named.assign(it->second.data(), it->second.size());
  }
  return MoveFrom(used, named);
}

bool CoordinatorTargets::Observe(const std::string& used, const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
      status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    return false;
  }
  return MoveFrom(used, "");
}

bool CoordinatorTargets::MoveFrom(const std::string& used, const std::string& named) {
  if (targets_.size() < 2) return false;
  absl::MutexLock l(&mu_);
  // Another call moved on already.
  if (targets_[current_].address != used) return true;
  for (size_t i = 0; i < targets_.size(); ++i) {
    if (!named.empty() && targets_[i].address == named && i != current_) {
      current_ = i;
      return true;
    }
  }
  current_ = (current_ + 1) % targets_.size();
  return true;
}

}  // namespace ckptd::rpc
