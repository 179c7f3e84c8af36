#include "etcd/leader_election.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckptd::etcd {

LeaderElection::LeaderElection(EtcdClient* etcd, ElectionOptions options)
    : etcd_(etcd),
      options_(std::move(options)),
      logger_(options_.logger != nullptr ? options_.logger : &base::DefaultLogger()) {}

LeaderElection::~LeaderElection() { Stop(); }

absl::Status LeaderElection::Start() {
  if (options_.key.empty()) return absl::InvalidArgumentError("the election key is empty");
  if (options_.candidate.empty()) return absl::InvalidArgumentError("the candidate's address is empty");
  if (options_.lease_ttl_seconds < 1) {
    return absl::InvalidArgumentError(absl::StrCat("lease TTL ", options_.lease_ttl_seconds, " s is below 1 s"));
  }
  absl::MutexLock l(&mu_);
  if (thread_ != nullptr) return absl::FailedPreconditionError("the election runs already");
  thread_ = std::make_unique<std::thread>([this] { Run(); });
  return absl::OkStatus();
}

void LeaderElection::Stop() {
  int64_t epoch = 0;
  int64_t lease = 0;
  int64_t abandoned = 0;
  {
    absl::MutexLock l(&mu_);
    if (stop_ && thread_ == nullptr) return;
    stop_ = true;
    ++changes_;
  }
  if (thread_ != nullptr && thread_->joinable()) thread_->join();
  {
    absl::MutexLock l(&mu_);
    thread_.reset();
    if (leader_.self) epoch = leader_.epoch;
    lease = lease_;
    abandoned = std::exchange(abandoned_lease_, 0);
    leader_ = LeaderInfo();
    lease_ = 0;
    lease_expiry_ = absl::InfinitePast();
    ++changes_;
  }
  if (epoch != 0) {
    pb::TxnRequest txn;
    *txn.add_compare() = Guard(epoch);
    *txn.add_success() = DeleteOp(options_.key);
    if (absl::StatusOr<pb::TxnResponse> r = etcd_->Txn(txn); !r.ok()) {
      logger_->Warning(absl::StrCat("resigning leadership (epoch ", epoch, "): ", r.status().message(),
                                    "; the others take over when the lease expires"));
    } else {
      logger_->Info(absl::StrCat("resigned leadership (epoch ", epoch, ")"));
    }
  }
  if (lease != 0) (void)etcd_->LeaseRevoke(lease);
  if (abandoned != 0) (void)etcd_->LeaseRevoke(abandoned);
}

absl::StatusOr<int64_t> LeaderElection::Leading() const {
  absl::MutexLock l(&mu_);
  if (leader_.self && absl::Now() < lease_expiry_) return leader_.epoch;
  if (leader_.self) {
    return absl::FailedPreconditionError(
        absl::StrCat("this coordinator's leadership (epoch ", leader_.epoch,
                     ") may have expired: its lease was not renewed within the TTL (paused, or cut off from etcd)"));
  }
  if (leader_.candidate.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no coordinator leads at the moment", stepped_down_.empty() ? "" : absl::StrCat("; ", stepped_down_)));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the leader is ", leader_.candidate, " (epoch ", leader_.epoch, "), not this coordinator"));
}

LeaderInfo LeaderElection::Leader() const {
  absl::MutexLock l(&mu_);
  LeaderInfo info = leader_;
  if (info.self && absl::Now() >= lease_expiry_) info = LeaderInfo();
  return info;
}

LeaderInfo LeaderElection::AwaitChange(const LeaderInfo& known, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock l(&mu_);
  auto changed = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stop_ || leader_.self != known.self || leader_.epoch != known.epoch ||
           leader_.candidate != known.candidate;
  };
  while (!changed()) {
    if (mu_.AwaitWithDeadline(absl::Condition(&changed), deadline)) break;
    if (absl::Now() >= deadline) break;
  }
  LeaderInfo info = leader_;
  if (info.self && absl::Now() >= lease_expiry_) info = LeaderInfo();
  return info;
}

void LeaderElection::Fenced(int64_t epoch, absl::string_view why) {
  absl::MutexLock l(&mu_);
  if (!leader_.self || leader_.epoch != epoch) return;
  StepDown(absl::StrCat("a write of epoch ", epoch, " was refused by etcd (", why, ")"));
}

pb::Compare LeaderElection::Guard(int64_t epoch) const {
  pb::Compare c;
  c.set_key(options_.key);
  c.set_target(pb::Compare::MOD);
  c.set_result(pb::Compare::EQUAL);
  c.set_mod_revision(epoch);
  return c;
}

void LeaderElection::PauseKeepAliveForTesting(bool paused) {
  absl::MutexLock l(&mu_);
  paused_ = paused;
  ++changes_;
}

void LeaderElection::StepDown(absl::string_view why) {
  logger_->Warning(absl::StrCat("stepping down as leader (epoch ", leader_.epoch, "): ", why));
  stepped_down_ = absl::StrCat("this coordinator's leadership (epoch ", leader_.epoch, ") ended: ", why);
  leader_ = LeaderInfo();
  // Revoked by the campaign thread (outside the lock) when etcd answers, so
  // that the key goes now rather than at the TTL; the next campaign takes
  // another lease, and a new epoch.
  abandoned_lease_ = lease_;
  lease_ = 0;
  lease_expiry_ = absl::InfinitePast();
  ++changes_;
}

bool LeaderElection::Sleep(absl::Duration d) {
  const absl::Time deadline = absl::Now() + d;
  absl::MutexLock l(&mu_);
  const uint64_t seen = changes_;
  auto woken = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || changes_ != seen; };
  mu_.AwaitWithDeadline(absl::Condition(&woken), deadline);
  return !stop_;
}

namespace {
// How soon a renewal that failed is tried again.
constexpr absl::Duration kRenewRetry = absl::Milliseconds(100);
}  // namespace

void LeaderElection::Run() {
  for (;;) {
    bool leading;
    bool paused;
    int64_t abandoned = 0;
    {
      absl::MutexLock l(&mu_);
      if (stop_) return;
      leading = leader_.self;
      paused = paused_;
      if (!paused) abandoned = std::exchange(abandoned_lease_, 0);
    }
    if (paused) {
      // As a stopped process: no renewal, no campaign, nothing sent.
      if (!Sleep(std::min(options_.keepalive_every, options_.poll_every))) return;
      continue;
    }
    if (abandoned != 0) (void)etcd_->LeaseRevoke(abandoned);
    if (leading) {
      // A renewal that failed (an etcd member lost, etcd electing a new raft
      // leader) is tried again soon, not a whole period later: the lease
      // runs out meanwhile.
      const bool renewed = Renew();
      if (!Sleep(renewed ? options_.keepalive_every : std::min(options_.keepalive_every, kRenewRetry))) return;
    } else {
      Campaign();
      bool now_leading;
      {
        absl::MutexLock l(&mu_);
        now_leading = leader_.self;
      }
      if (!now_leading && !Sleep(options_.poll_every)) return;
    }
  }
}

void LeaderElection::Campaign() {
  pb::RangeRequest read;
  read.set_key(options_.key);
  absl::StatusOr<pb::RangeResponse> current = etcd_->Range(read);
  if (!current.ok()) {
    absl::MutexLock l(&mu_);
    if (!leader_.candidate.empty()) {
      logger_->Warning(absl::StrCat("cannot read the leader key from etcd: ", current.status().message()));
    }
    leader_ = LeaderInfo();
    ++changes_;
    return;
  }
  if (current->kvs_size() > 0) {
    const auto& kv = current->kvs(0);
    absl::MutexLock l(&mu_);
    if (leader_.epoch != kv.create_revision() || leader_.candidate != kv.value()) {
      leader_ = LeaderInfo{kv.value(), kv.create_revision(), false};
      ++changes_;
    }
    return;
  }
  // The key is free: a lease of our own, then the key if it is still free.
  const absl::Time sent = absl::Now();
  absl::StatusOr<pb::LeaseGrantResponse> lease = etcd_->LeaseGrant(options_.lease_ttl_seconds);
  if (!lease.ok()) {
    logger_->Warning(absl::StrCat("cannot campaign for leadership: ", lease.status().message()));
    return;
  }
  pb::TxnRequest txn;
  *txn.add_compare() = CreateRevisionIs(options_.key, 0);
  *txn.add_success() = PutOp(options_.key, options_.candidate, lease->id());
  *txn.add_failure() = RangeOp(options_.key);
  absl::StatusOr<pb::TxnResponse> r = etcd_->Txn(txn);
  if (!r.ok() || !r->succeeded()) {
    (void)etcd_->LeaseRevoke(lease->id());
    if (!r.ok()) {
      logger_->Warning(absl::StrCat("cannot campaign for leadership: ", r.status().message()));
      return;
    }
    absl::MutexLock l(&mu_);
    const auto& kvs = r->responses(0).response_range().kvs();
    leader_ = kvs.empty() ? LeaderInfo() : LeaderInfo{kvs[0].value(), kvs[0].create_revision(), false};
    ++changes_;
    return;
  }
  // (Stopped meanwhile: Stop() resigns what this sets, after the join.)
  absl::MutexLock l(&mu_);
  lease_ = lease->id();
  leader_ = LeaderInfo{options_.candidate, r->header().revision(), true};
  stepped_down_.clear();
  lease_expiry_ = sent + absl::Seconds(lease->ttl());
  ++changes_;
  logger_->Info(absl::StrCat("leading as ", options_.candidate, " (epoch ", leader_.epoch, ", lease TTL ",
                             lease->ttl(), " s)"));
}

bool LeaderElection::Renew() {
  int64_t lease;
  int64_t epoch;
  {
    absl::MutexLock l(&mu_);
    if (!leader_.self) return true;
    if (absl::Now() >= lease_expiry_) {
      StepDown(absl::StrCat("the lease was not renewed in time (last renewal sent ",
                            absl::FormatDuration(absl::Now() - (lease_expiry_ - absl::Seconds(options_.lease_ttl_seconds))),
                            " ago); paused, or cut off from etcd"));
      return true;
    }
    lease = lease_;
    epoch = leader_.epoch;
  }
  const absl::Time sent = absl::Now();
  absl::StatusOr<int64_t> ttl = etcd_->LeaseKeepAliveOnce(lease);
  {
    absl::MutexLock l(&mu_);
    if (!leader_.self || leader_.epoch != epoch) return true;
    if (absl::Now() >= lease_expiry_) {
      // Whatever the answer: the lease may have lapsed while it was awaited,
      // and this replica may have said it no longer leads meanwhile.
      StepDown("the lease's renewal came back after it may have expired; paused, or cut off from etcd");
      return false;
    }
    if (!ttl.ok()) {
      if (absl::IsNotFound(ttl.status())) {
        StepDown(absl::StrCat("the lease expired: ", ttl.status().message()));
      } else {
        logger_->Warning(absl::StrCat("cannot renew the leader's lease (it lapses in ",
                                      absl::FormatDuration(lease_expiry_ - absl::Now()),
                                      "): ", ttl.status().message()));
      }
      return false;
    }
    // The renewal alone extends the lease: the key's check below may take
    // its time (an etcd member just lost) without costing the leadership.
    lease_expiry_ = sent + absl::Seconds(*ttl);
  }
  pb::RangeRequest read;
  read.set_key(options_.key);
  absl::StatusOr<pb::RangeResponse> key = etcd_->Range(read);
  absl::MutexLock l(&mu_);
  if (!leader_.self || leader_.epoch != epoch) return true;
  if (key.ok() && (key->kvs_size() == 0 || key->kvs(0).mod_revision() != epoch)) {
    StepDown(key->kvs_size() == 0 ? "the leader key was deleted"
                                  : absl::StrCat("the leader key was written by another (it now names ",
                                                 key->kvs(0).value(), ")"));
  }
  return true;
}

}  // namespace ckptd::etcd
