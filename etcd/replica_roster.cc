#include "etcd/replica_roster.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckptd::etcd {

ReplicaRoster::ReplicaRoster(EtcdClient* etcd, RosterOptions options)
    : etcd_(etcd), options_(std::move(options)), key_(absl::StrCat(options_.prefix, "/replicas/", options_.self)) {}

ReplicaRoster::~ReplicaRoster() { Stop(); }

absl::Status ReplicaRoster::Start() {
  if (options_.prefix.empty() || options_.self.empty()) {
    return absl::InvalidArgumentError("a replica roster needs a prefix and this replica's address");
  }
  if (options_.ttl_seconds < 2) return absl::InvalidArgumentError("a replica roster's lease TTL must be 2 s or more");
  if (thread_ != nullptr) return absl::OkStatus();
  thread_ = std::make_unique<std::thread>([this] { Run(); });
  return absl::OkStatus();
}

void ReplicaRoster::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
  }
  if (thread_ != nullptr) thread_->join();
  absl::MutexLock lock(&refresh_mu_);
  withdrawn_ = true;
  if (lease_ != 0) (void)etcd_->LeaseRevoke(lease_);  // the key goes with it
  lease_ = 0;
}

RosterView ReplicaRoster::View() const {
  absl::MutexLock lock(&mu_);
  return view_;
}

void ReplicaRoster::Run() {
  while (true) {
    Refresh();
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.refresh_every)) return;
  }
}

void ReplicaRoster::Announce() {
  if (lease_ != 0) {
    absl::StatusOr<int64_t> renewed = etcd_->LeaseKeepAliveOnce(lease_);
    if (renewed.ok()) return;
    if (!absl::IsNotFound(renewed.status())) return;  // etcd out of reach: try again next round
    lease_ = 0;  // expired: announce again
  }
  absl::StatusOr<pb::LeaseGrantResponse> granted = etcd_->LeaseGrant(options_.ttl_seconds);
  if (!granted.ok()) return;
  pb::PutRequest put;
  put.set_key(key_);
  put.set_value(options_.self);
  put.set_lease(granted->id());
  if (etcd_->Put(put).ok()) {
    lease_ = granted->id();
  } else {
    (void)etcd_->LeaseRevoke(granted->id());
  }
}

void ReplicaRoster::Refresh() {
  absl::MutexLock refreshing(&refresh_mu_);
  if (!withdrawn_) Announce();
  RosterView view;
  pb::RangeRequest range;
  const std::string prefix = absl::StrCat(options_.prefix, "/replicas/");
  range.set_key(prefix);
  range.set_range_end(PrefixEnd(prefix));
  if (absl::StatusOr<pb::RangeResponse> r = etcd_->Range(range); r.ok()) {
    for (const auto& kv : r->kvs()) view.replicas.push_back(kv.value());
  } else {
    // etcd out of reach (or electing a raft leader): the last list read, and
    // this one at least.
    absl::MutexLock lock(&mu_);
    view.replicas = view_.replicas;
    view.replicas.push_back(options_.self);
  }
  std::sort(view.replicas.begin(), view.replicas.end());
  view.replicas.erase(std::unique(view.replicas.begin(), view.replicas.end()), view.replicas.end());
  for (size_t i = 0; i < etcd_->endpoints().size(); ++i) {
    MemberHealth h;
    h.endpoint = etcd_->endpoints()[i];
    absl::StatusOr<pb::StatusResponse> s = etcd_->MemberStatus(i);
    if (s.ok()) {
      h.healthy = true;
      h.version = s->version();
      h.raft_leader = s->leader() != 0 && s->leader() == s->header().member_id();
      h.db_size_bytes = s->dbsize();
      if (!s->errors().empty()) {
        h.healthy = false;
        h.error = s->errors(0);
      }
    } else {
      h.error = std::string(s.status().message());
    }
    view.members.push_back(std::move(h));
  }
  view.checked = absl::Now();
  absl::MutexLock lock(&mu_);
  view_ = std::move(view);
}

}  // namespace ckptd::etcd
