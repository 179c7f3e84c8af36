#include "replication/replicator.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/thread_priority.h"

namespace ckptd::replication {
namespace {

std::string KeyText(const ckptd::v1::ReplicaKey& key) {
  return absl::StrCat("job ", key.job(), " rank ", key.rank(), " step ", key.step());
}

}  // namespace

Replicator::Replicator(PeerNetwork* network, ReplicatorOptions options)
    : network_(network),
      options_(std::move(options)),
      logger_(options_.logger != nullptr ? options_.logger : &base::DefaultLogger()),
      clock_(options_.clock != nullptr ? options_.clock : base::RealClock::Get()) {
  thread_ = std::thread([this] { Loop(); });
}

Replicator::~Replicator() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void Replicator::SetPartners(const google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner>& partners) {
  absl::MutexLock l(&mu_);
  partners_.assign(partners.begin(), partners.end());
  stats_.partners = static_cast<uint32_t>(partners_.size());
}

bool Replicator::has_partners() const {
  absl::MutexLock l(&mu_);
  return !partners_.empty();
}

void Replicator::Submit(ReplicaSource source) {
  absl::MutexLock l(&mu_);
  const ckptd::v1::ReplicaKey& key = source.header.key();
  const size_t before = queue_.size();
  std::erase_if(queue_, [&](const ReplicaSource& q) {
    return q.header.key().job() == key.job() && q.header.key().rank() == key.rank();
  });
  stats_.superseded += before - queue_.size();
  RankProgress& progress = progress_[{key.job(), key.rank()}];
  progress.submitted = std::max(progress.submitted, key.step());
  if (queue_.empty() && !busy_) {
    round_start_ = clock_->Now();
    round_sent_ = false;
  }
  queue_.push_back(std::move(source));
}

ReplicationStats Replicator::Stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

std::map<std::string, uint64_t> Replicator::LagSteps() const {
  absl::MutexLock l(&mu_);
  std::map<std::string, uint64_t> lag;
  for (const auto& [key, p] : progress_) {
    uint64_t& job = lag[key.first];
    job = std::max(job, p.submitted - std::min(p.submitted, p.confirmed));
  }
  return lag;
}

bool Replicator::WaitIdle(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](Replicator* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
                                    return r->queue_.empty() && !r->busy_;
                                  },
                                  this),
                              timeout);
}

void Replicator::Loop() {
  base::SetCallingThreadName("ckptd-replicate");
  // Below training: the copies wait for idle cores.
  if (options_.low_priority) (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  while (true) {
    ReplicaSource source;
    std::vector<ckptd::v1::ReplicationPartner> partners;
    {
      absl::MutexLock l(&mu_);
      busy_ = false;
      mu_.Await(absl::Condition(
          +[](Replicator* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) { return r->stopping_ || !r->queue_.empty(); },
          this));
      if (stopping_) return;
      source = std::move(queue_.front());
      queue_.pop_front();
      partners = partners_;
      busy_ = true;
    }
    size_t taken = 0;  // partners that took the copy
    for (const ckptd::v1::ReplicationPartner& partner : partners) {
      const absl::Time start = clock_->Now();
      absl::Status s = SendOne(source, partner);
      const double seconds = absl::ToDoubleSeconds(clock_->Now() - start);
      absl::MutexLock l(&mu_);
      if (s.ok()) {
        ++stats_.sent;
        stats_.bytes += source.header.data_bytes();
        stats_.last_seconds = seconds;
        stats_.last_bytes = source.header.data_bytes();
        round_sent_ = true;
        ++taken;
        continue;
      }
      if (absl::IsAborted(s)) {
        ++stats_.abandoned;
        break;  // the slot holds another step now: no partner gets this one
      }
      ++stats_.failed;
      stats_.last_error = s;
      logger_->Warning(absl::StrCat("peer copy of ", KeyText(source.header.key()), " to node ", partner.node_id(),
                                    " (", partner.address(), ") failed: ", s.message()));
    }
    absl::MutexLock l(&mu_);
    if (!partners.empty() && taken == partners.size()) {
      const ckptd::v1::ReplicaKey& key = source.header.key();
      RankProgress& progress = progress_[{key.job(), key.rank()}];
      progress.confirmed = std::max(progress.confirmed, key.step());
    }
    if (queue_.empty() && round_sent_) {
      stats_.last_round_seconds = absl::ToDoubleSeconds(clock_->Now() - round_start_);
      round_sent_ = false;
    }
  }
}

absl::Status Replicator::SendOne(const ReplicaSource& source, const ckptd::v1::ReplicationPartner& partner) {
  ckptd::v1::ReplicaHeader header = source.header;
  header.set_ticket(partner.ticket());
  const staging::StagingSegment& segment = *source.segment;
  const uint64_t step = header.key().step();
  const absl::Time start = clock_->Now();
  const double rate = options_.max_bytes_per_second;
  PieceSource source_bytes;
  // Each piece is sent straight from the slot, paced by the cap.
  source_bytes.piece = [&](uint64_t offset, uint64_t length) -> absl::StatusOr<absl::Span<const uint8_t>> {
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return absl::CancelledError("the agent is stopping");
    }
    if (rate > 0) {
      // Paced: the bytes sent so far may not run ahead of the cap.
      clock_->SleepUntil(start + absl::Seconds(static_cast<double>(offset) / rate));
    }
    if (offset > segment.slot_bytes() || length > segment.slot_bytes() - offset) {
      return absl::InternalError(absl::StrCat("a piece at offset ", offset, " of ", length,
                                              " bytes runs past the staging slot's ", segment.slot_bytes()));
    }
    return absl::Span<const uint8_t>(segment.slot_data(source.slot) + offset, length);
  };
  // The bytes count only if the slot still held the step after they were
  // read (handed to the kernel): the trainer marks a slot it takes before
  // writing into it.
  source_bytes.still_valid = [&]() -> absl::Status {
    std::atomic_thread_fence(std::memory_order_acquire);
    if (segment.state(source.slot) != staging::SlotState::kKept || segment.step(source.slot) != step) {
      return absl::AbortedError("the trainer took the staging slot back for a new snapshot");
    }
    return absl::OkStatus();
  };
  return network_->Put(partner.address(), header, source_bytes);
}

}  // namespace ckptd::replication
