// Leader election on etcd, with fencing. Replicas campaign for one key:
// the first to create it (a transaction that requires the key absent, the
// put bound to a lease of the replica's own) leads, and the key's
// create_revision is its epoch: it grows with every new leadership, so it
// orders leaders and guards their writes. Every write of a leader compares
// the key's revision with its epoch (Guard): once the lease expired
// (the leader was paused, cut off, or died) the key is gone or another's,
// and the write is refused by etcd itself, whatever the old leader believes.
// A leader also steps down on its own when its lease may have expired: a
// keep-alive not renewed within the TTL counted from when it was sent.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/logger.h"
#include "etcd/etcd_client.h"

namespace ckptd::etcd {

struct ElectionOptions {
  // The key the replicas campaign for (e.g. /ckptd/<cluster>/leader).
  std::string key;
  // What the key holds while this replica leads: the address clients
  // should use (a standby names it in its answers).
  std::string candidate;
  // The lease's TTL: how long after a leader's last renewal the others may
  // take over. etcd raises TTLs below its minimum (about 1.5 x its election
  // timeout) to it.
  int64_t lease_ttl_seconds = 3;
  // How often a leader renews its lease (at most a third of the TTL is
  // sensible), and how often a standby looks at the key.
  absl::Duration keepalive_every = absl::Seconds(1);
  absl::Duration poll_every = absl::Milliseconds(250);
  base::Logger* logger = nullptr;  // default: base::DefaultLogger()
};

// The leader as this replica knows it.
struct LeaderInfo {
  std::string candidate;  // empty: none known
  int64_t epoch = 0;      // the key's create_revision; 0: none known
  bool self = false;      // this replica leads (its lease not yet expired)
};

class LeaderElection {  // thread-safe
 public:
  // `etcd` must outlive the election. Nothing happens before Start().
  LeaderElection(EtcdClient* etcd, ElectionOptions options);
  // Resigns when leading, then stops.
  ~LeaderElection();
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  // Campaigns on a thread of its own until Stop(). kInvalidArgument for an
  // empty key or candidate, or a TTL below 1 s.
  absl::Status Start();
  // Stops campaigning; when leading, deletes the key (guarded by the epoch)
  // and revokes the lease, so that a standby takes over at once.
  void Stop();

  // This replica's epoch while it leads; kFailedPrecondition naming the
  // leader it knows of (or none) otherwise.
  absl::StatusOr<int64_t> Leading() const;
  LeaderInfo Leader() const;
  // Waits until the leadership differs from `known` (self or epoch), Stop()
  // is called, or `timeout` passes; returns the leadership then.
  LeaderInfo AwaitChange(const LeaderInfo& known, absl::Duration timeout) const;

  // The comparison that holds in etcd only while `epoch` is the current
  // leadership: every write of the leader carries it in its transaction.
  // It compares the key's mod_revision, which equals the epoch from the
  // key's creation until anyone writes the key again (or deletes it).
  pb::Compare Guard(int64_t epoch) const;
  // A write guarded by `epoch` was refused: another leads now. Steps down
  // at once (when `epoch` is still this replica's), saying `why`.
  void Fenced(int64_t epoch, absl::string_view why);

  const ElectionOptions& options() const { return options_; }

  // Tests: while paused, the election sends nothing to etcd (no keep-alive,
  // no campaign), as if the process were stopped, so a leader's lease runs
  // out in etcd.
  void PauseKeepAliveForTesting(bool paused);

 private:
  void Run();
  // One standby round: reads the key; campaigns when it is free.
  void Campaign();
  // One leader round: renews the lease and checks the key is still ours.
  // False when the renewal failed and the lease may still be live (retry
  // soon); true otherwise (renewed, or no longer leading).
  bool Renew();
  void StepDown(absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits `d` unless stopped or the state changes by Fenced(); false when stopped.
  bool Sleep(absl::Duration d);

  EtcdClient* const etcd_;
  const ElectionOptions options_;
  base::Logger* const logger_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  LeaderInfo leader_ ABSL_GUARDED_BY(mu_);
  // Why this replica last stepped down (empty once it leads again), which
  // Leading() gives while no leader is known.
  std::string stepped_down_ ABSL_GUARDED_BY(mu_);
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t abandoned_lease_ ABSL_GUARDED_BY(mu_) = 0;  // to revoke after stepping down
  // When the lease may have expired in etcd: the last renewal's send time
  // plus the TTL it was granted.
  absl::Time lease_expiry_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<std::thread> thread_;
};

}  // namespace ckptd::etcd
