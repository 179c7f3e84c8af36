// The replicas of a replicated coordinator and the health of the etcd
// members they share, for `ckptctl status`. Each replica announces itself
// under <prefix>/replicas/<address>, bound to a lease of its own that it
// renews: a replica that dies drops out of the roster within the lease's
// TTL, one that stops revokes it and drops out at once. Every refresh also
// asks each etcd member for its status (version, raft leader, database
// size), so that an operator sees a member down before quorum is at risk.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcd/etcd_client.h"

namespace ckptd::etcd {

struct RosterOptions {
  std::string prefix;       // the cluster's prefix: keys under <prefix>/replicas/
  std::string self;         // this replica's advertised address
  int64_t ttl_seconds = 10;  // of the announcement's lease
  absl::Duration refresh_every = absl::Seconds(2);
};

struct MemberHealth {
  std::string endpoint;
  bool healthy = false;
  std::string error;  // why not
  std::string version;
  bool raft_leader = false;
  int64_t db_size_bytes = 0;
};

struct RosterView {
  std::vector<std::string> replicas;   // every replica announced, this one included, sorted
  std::vector<MemberHealth> members;   // in the client's endpoint order
  absl::Time checked = absl::InfinitePast();  // when (InfinitePast: not yet)
};

class ReplicaRoster {  // thread-safe
 public:
  // `etcd` must outlive the roster. Nothing happens before Start().
  ReplicaRoster(EtcdClient* etcd, RosterOptions options);
  ~ReplicaRoster();  // Stop()
  ReplicaRoster(const ReplicaRoster&) = delete;
  ReplicaRoster& operator=(const ReplicaRoster&) = delete;

  // Announces this replica and refreshes on a thread of its own.
  // kInvalidArgument for an empty prefix or address, or a TTL below 2 s.
  absl::Status Start();
  // Stops refreshing and withdraws the announcement (revokes its lease).
  void Stop();
  // The last refresh.
  RosterView View() const;
  // Refreshes now, on the calling thread (tests; Start's thread does it).
  // Refreshes never overlap; after Stop() one no longer announces.
  void Refresh() ABSL_LOCKS_EXCLUDED(refresh_mu_, mu_);

 private:
  void Run();
  // Keeps the announcement: renews its lease, or puts it again under a new
  // one when the lease expired (etcd was out of reach past the TTL).
  void Announce() ABSL_EXCLUSIVE_LOCKS_REQUIRED(refresh_mu_);

  EtcdClient* const etcd_;
  const RosterOptions options_;
  const std::string key_;

  // Held through a whole refresh, so that two refreshes (Start's thread
  // and a caller's) never grant two leases for the one key. Taken before mu_.
  absl::Mutex refresh_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  int64_t lease_ ABSL_GUARDED_BY(refresh_mu_) = 0;
  bool withdrawn_ ABSL_GUARDED_BY(refresh_mu_) = false;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  RosterView view_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<std::thread> thread_;
};

}  // namespace ckptd::etcd
