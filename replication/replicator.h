// The sending side of peer replication: after a rank's step is persisted and
// kept in its staging slot, one background thread sends it to the partners
// the coordinator chose for this node, at the lowest CPU priority and within
// a bandwidth cap, so that training's cores and network come first. Only the
// newest step of each rank waits to be sent: a newer one replaces it in the
// queue. A copy is sent straight from the staging slot (no copy in this
// process on the data lane); when the trainer takes the slot back for a new
// snapshot while it is being sent, the copy is abandoned (the partner never
// keeps a partial one).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/logger.h"
#include "ckptd/v1/coordinator.pb.h"
#include "ckptd/v1/peer.pb.h"
#include "replication/peer_network.h"
#include "staging/staging.h"

namespace ckptd::replication {

// A kept step to send: its header (key, world size, this node, sizes, the
// shard's digest and index, the layout's digest; no ticket) and the staging
// slot holding it (KEPT, with header.key().step()).
struct ReplicaSource {
  ckptd::v1::ReplicaHeader header;
  std::shared_ptr<const staging::StagingSegment> segment;
  uint32_t slot = 0;
};

struct ReplicatorOptions {
  // Bytes per second over all partners together; 0: no cap.
  double max_bytes_per_second = 0;
  // The sending thread runs at nice 19 (below training).
  bool low_priority = true;
  base::Logger* logger = nullptr;
  base::Clock* clock = nullptr;
};

struct ReplicationStats {
  uint64_t sent = 0;         // copies a partner took
  uint64_t bytes = 0;        // their bytes
  uint64_t failed = 0;       // copies a partner refused or could not be reached for
  uint64_t abandoned = 0;    // the trainer took the slot back first
  uint64_t superseded = 0;   // a newer step of the rank came before it was sent
  double last_seconds = 0;   // the last copy sent, start to finish
  // A checkpoint's copies (of every rank of the node) together: from the
  // first queued while the replicator was idle to the last sent, when it was
  // idle again (0: no such round sent anything yet).
  double last_round_seconds = 0;
  uint64_t last_bytes = 0;
  absl::Status last_error;
  uint32_t partners = 0;
};

class Replicator {
 public:
  // `network` must outlive the replicator.
  Replicator(PeerNetwork* network, ReplicatorOptions options);
  // Stops after the copy under way; queued ones are dropped.
  ~Replicator();
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  // The partners to send to (the coordinator's HeartbeatAck.send_to).
  void SetPartners(const google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner>& partners);
  bool has_partners() const;
  // Queues `source` for every partner.
  void Submit(ReplicaSource source);
  ReplicationStats Stats() const;
  // Per job: how many steps the partners are behind, the most of any of its
  // ranks: the newest step of the rank submitted here minus the newest one
  // every partner took (a rank no copy of which was taken yet counts its
  // newest step in full). Only jobs with a step submitted since the start.
  std::map<std::string, uint64_t> LagSteps() const;
  // Waits until nothing is queued or being sent; false on timeout.
  bool WaitIdle(absl::Duration timeout);

 private:
  void Loop();
  // Sends `source` to `partner`, paced by the cap.
  absl::Status SendOne(const ReplicaSource& source, const ckptd::v1::ReplicationPartner& partner);

  PeerNetwork* const network_;
  const ReplicatorOptions options_;
  base::Logger* const logger_;
  base::Clock* const clock_;
  mutable absl::Mutex mu_;
  std::vector<ckptd::v1::ReplicationPartner> partners_ ABSL_GUARDED_BY(mu_);
  std::deque<ReplicaSource> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  ReplicationStats stats_ ABSL_GUARDED_BY(mu_);
  // For LagSteps, per (job, rank): the newest step submitted, and the newest
  // one every partner took (0: none yet).
  struct RankProgress {
    uint64_t submitted = 0;
    uint64_t confirmed = 0;
  };
  std::map<std::pair<std::string, uint32_t>, RankProgress> progress_ ABSL_GUARDED_BY(mu_);
  // The round under way: since when, and whether a copy of it was sent.
  absl::Time round_start_ ABSL_GUARDED_BY(mu_);
  bool round_sent_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ckptd::replication
