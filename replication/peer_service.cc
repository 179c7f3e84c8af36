#include "replication/peer_service.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <list>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/host_port.h"
#include "base/posix_error.h"
#include "base/random.h"
#include "base/status_macros.h"
#include "base/thread_priority.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/server_builder.h"
#include "replication/tcp_socket.h"
#include "rpc/fetch_ticket.h"
#include "rpc/grpc_status.h"
#include "rpc/tls.h"
#include "rpc/server_limits.h"

namespace ckptd::replication {
namespace {

using tcp::Fd;
using tcp::PeerName;
using tcp::PushNow;
using tcp::RecvAll;
using tcp::SendAll;
using tcp::SetBlocking;
using tcp::SetIoTimeout;

constexpr absl::string_view kAuthorization = "authorization";
constexpr absl::string_view kBearer = "Bearer ";
// A message holds one piece and, in the first, the header with its index.
constexpr int kMaxMessageBytes = static_cast<int>(kReplicaPieceBytes + kMaxReplicaIndexBytes + (1 << 20));

// The data lane's wire format (proto/ckptd/v1/peer.proto).
constexpr size_t kNonceBytes = 16;
constexpr uint8_t kCopyValid = 0x01;
constexpr uint32_t kMaxAnswerMessage = 4096;
// Connections taken from the listen queue per round of the lane's loop.
constexpr int kMaxAcceptsPerRound = 256;
// The longest the lane's loop sleeps: lanes expire within this of their time.
constexpr absl::Duration kLoopSlice = absl::Milliseconds(100);
// Copies of at least this many bytes are faulted in ahead of the data, in
// chunks of kPrefaultChunk.
constexpr size_t kPrefaultMinBytes = size_t{32} << 20;
constexpr size_t kPrefaultChunk = size_t{4} << 20;
// Refused connections logged at most once in this (with a count since).
constexpr absl::Duration kRefusalLogInterval = absl::Seconds(10);

// The data of `piece` at `offset` goes to `out` (of `total` bytes, `*done`
// of them written so far): pieces come in order and never past the end.
absl::Status TakePiece(const ckptd::v1::ReplicaPiece& piece, absl::Span<uint8_t> out, uint64_t* done) {
  if (piece.offset() != *done) {
    return absl::InvalidArgumentError(
        absl::StrCat("a piece at offset ", piece.offset(), " arrived where ", *done, " was expected"));
  }
  if (piece.data().size() > out.size() - *done) {
    return absl::InvalidArgumentError(absl::StrCat("a piece of ", piece.data().size(), " bytes at offset ",
                                                   piece.offset(), " runs past the copy's ", out.size(), " bytes"));
  }
  std::memcpy(out.data() + *done, piece.data().data(), piece.data().size());
  *done += piece.data().size();
  return absl::OkStatus();
}

std::string KeyText(const ckptd::v1::ReplicaKey& key) {
  return absl::StrCat("job ", key.job(), " rank ", key.rank(), " step ", key.step());
}

// Receives `out` from `fd` as RecvAll does. New memory is faulted in from
// its end backwards on another thread while the data lands from its start,
// until the two meet: the receiving thread does not pay for every page of a
// copy into new memory alone.
absl::StatusOr<size_t> ReceiveCopy(int fd, absl::Span<uint8_t> out, absl::string_view what) {
  static const uintptr_t kPageBytes = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  std::atomic<size_t> received{0};
  std::atomic<bool> done{false};
  std::thread prefault;
  if (out.size() >= kPrefaultMinBytes) {
    try {
      prefault = std::thread([&] {
        const uintptr_t start = reinterpret_cast<uintptr_t>(out.data());
        const uintptr_t first = (start + kPageBytes - 1) & ~(kPageBytes - 1);
        uintptr_t end = (start + out.size()) & ~(kPageBytes - 1);
        while (end > first && !done.load(std::memory_order_relaxed)) {
          const uintptr_t from = end - first > kPrefaultChunk ? end - kPrefaultChunk : first;
          // The receiver is near: it faults the rest itself.
          if (from < start + received.load(std::memory_order_relaxed) + kPrefaultChunk) break;
          // Contents stay as they are. Before Linux 5.14 (EINVAL) or short of
          // memory the receiving thread faults the pages in as it writes.
          if (::madvise(reinterpret_cast<void*>(from), end - from, MADV_POPULATE_WRITE) != 0) break;
          end = from;
        }
      });
    } catch (const std::system_error&) {
      // No thread to spare: the receiving thread faults every page itself.
    }
  }
  absl::StatusOr<size_t> total = size_t{0};
  while (*total < out.size()) {
    const size_t n = std::min<size_t>(kReplicaPieceBytes, out.size() - *total);
    absl::StatusOr<size_t> got = RecvAll(fd, out.subspan(*total, n), what, *total);
    if (!got.ok()) {
      total = got.status();
      break;
    }
    *total += *got;
    received.store(*total, std::memory_order_relaxed);
    if (*got != n) break;  // closed
  }
  done.store(true, std::memory_order_relaxed);
  if (prefault.joinable()) prefault.join();
  return total;
}

// Cuts a transfer whose partner stopped, where a blocking call has no
// timeout of its own (a gRPC stream's Read and Write, a receive that still
// gets a byte now and then): `cut` (cancel the call, shut the socket down)
// runs once, on the watchdog's thread, when the transfer's deadline passes
// or when one wait on the partner lasts `stall`, both read on `clock`. The
// owner then reports what cut() says ran out, and stops the watchdog before
// `cut`'s target goes.
class Watchdog {
 public:
  enum class Cut { kNone, kStall, kDeadline };

  Watchdog(base::Clock* clock, absl::Duration stall, absl::Time deadline, std::function<void()> cut)
      : clock_(clock), stall_(stall), cut_fn_(std::move(cut)), deadline_(deadline) {}
  ~Watchdog() { Stop(); }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // kUnavailable naming `what` when no thread can be had: an unwatched
  // transfer could wait on a stopped partner for as long as it holds on.
  absl::Status Start(absl::string_view what) {
    try {
      thread_ = std::thread([this] { Run(); });
    } catch (const std::system_error& e) {  // the one way std::thread reports it
      return absl::UnavailableError(absl::StrCat(what, ": no thread to watch it for a stopped partner: ", e.what()));
    }
    return absl::OkStatus();
  }
  // After it, `cut` runs no more. Idempotent.
  void Stop() {
    {
      absl::MutexLock l(&mu_);
      stopping_ = true;
      changed_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  // The calling thread waits on the partner from BeginWait to EndWait; the
  // time in between (its own work) is no stall.
  void BeginWait() {
    absl::MutexLock l(&mu_);
    waiting_since_ = clock_->Now();
    changed_ = true;
  }
  void EndWait() {
    absl::MutexLock l(&mu_);
    waiting_since_ = absl::InfiniteFuture();
  }
  void SetDeadline(absl::Time deadline) {
    absl::MutexLock l(&mu_);
    deadline_ = deadline;
    changed_ = true;
  }
  Cut cut() const {
    absl::MutexLock l(&mu_);
    return cut_;
  }

 private:
  void Run() {
    {
      absl::MutexLock l(&mu_);
      while (!stopping_) {
        const absl::Time now = clock_->Now();
        const absl::Time stalls_at =
            waiting_since_ == absl::InfiniteFuture() ? absl::InfiniteFuture() : waiting_since_ + stall_;
        if (now >= deadline_) {
          cut_ = Cut::kDeadline;
          break;
        }
        if (now >= stalls_at) {
          cut_ = Cut::kStall;
          break;
        }
        changed_ = false;
        clock_->AwaitWithDeadline(&mu_, absl::Condition(&changed_), std::min(deadline_, stalls_at));
      }
      if (cut_ == Cut::kNone) return;
    }
    cut_fn_();
  }

  base::Clock* const clock_;
  const absl::Duration stall_;
  const std::function<void()> cut_fn_;
  mutable absl::Mutex mu_;
  absl::Time deadline_ ABSL_GUARDED_BY(mu_);
  absl::Time waiting_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool changed_ ABSL_GUARDED_BY(mu_) = false;  // wakes the thread to look again
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Cut cut_ ABSL_GUARDED_BY(mu_) = Cut::kNone;
  std::thread thread_;
};

// Sends a copy of `data_bytes` from `source` over the lane connected as
// `fd` (with its `nonce`), then reads the partner at `address`'s answer.
absl::Status PutOnLane(int fd, absl::string_view nonce, uint64_t data_bytes, const PieceSource& source,
                       const std::string& what, const std::string& address) {
  CKPTD_RETURN_IF_ERROR(
      SendAll(fd, absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(nonce.data()), nonce.size()), what));
  // Straight from where the bytes are into the kernel; each piece counts
  // only when it was still the copy's once sent. An error closes the
  // connection before the validity byte: the partner drops the copy.
  for (uint64_t offset = 0; offset < data_bytes; offset += kReplicaPieceBytes) {
    const uint64_t n = std::min<uint64_t>(kReplicaPieceBytes, data_bytes - offset);
    CKPTD_ASSIGN_OR_RETURN(const absl::Span<const uint8_t> piece, source.piece(offset, n));
    if (piece.size() != n) {
      return absl::InternalError(
          absl::StrCat(what, ": the piece at offset ", offset, " has ", piece.size(), " bytes, not ", n));
    }
    CKPTD_RETURN_IF_ERROR(SendAll(fd, piece, what, offset));
    if (source.still_valid) CKPTD_RETURN_IF_ERROR(source.still_valid());
  }
  PushNow(fd);
  CKPTD_RETURN_IF_ERROR(SendAll(fd, absl::Span<const uint8_t>(&kCopyValid, 1), what, data_bytes));
  uint8_t head[5];
  CKPTD_ASSIGN_OR_RETURN(const size_t got, RecvAll(fd, absl::Span<uint8_t>(head, sizeof(head)), what));
  if (got != sizeof(head)) {
    return absl::UnavailableError(absl::StrCat(what, ": the partner closed the data lane without an answer"));
  }
  const uint32_t length = head[1] | uint32_t{head[2]} << 8 | uint32_t{head[3]} << 16 | uint32_t{head[4]} << 24;
  if (head[0] > static_cast<uint8_t>(absl::StatusCode::kUnauthenticated) || length > kMaxAnswerMessage) {
    return absl::DataLossError(absl::StrCat(what, ": the partner's answer is garbled"));
  }
  std::string message(length, '\0');
  CKPTD_ASSIGN_OR_RETURN(const size_t read,
                         RecvAll(fd, absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(message.data()), length), what));
  message.resize(read);
  const auto code = static_cast<absl::StatusCode>(head[0]);
  if (code != absl::StatusCode::kOk) {
    return absl::Status(code, absl::StrCat("the partner at ", address, " did not keep the copy: ", message));
  }
  return absl::OkStatus();
}

// The put answer: code, length, message.
std::string EncodeAnswer(const absl::Status& s) {
  const std::string message(s.message().substr(0, kMaxAnswerMessage));
  std::string out(5, '\0');
  out[0] = static_cast<char>(s.code());
  const uint32_t n = static_cast<uint32_t>(message.size());
  for (int i = 0; i < 4; ++i) out[1 + i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + message;
}

// The time a fetch of `bytes` served may take (PeerServiceOptions).
absl::Duration FetchAllowed(const PeerServiceOptions& options, uint64_t bytes) {
  return options.fetch_stall + absl::Seconds(static_cast<double>(bytes) / options.fetch_min_bytes_per_second);
}

// Why a fetch served was cut after `done` of `total` bytes, as `cut` says.
absl::Status FetchCut(Watchdog::Cut cut, const std::string& what, const PeerServiceOptions& options, uint64_t done,
                      uint64_t total) {
  if (cut == Watchdog::Cut::kStall) {
    return absl::UnavailableError(absl::StrCat(what, ": the fetching node took no data for ",
                                               absl::FormatDuration(options.fetch_stall), " after ", done, " of ",
                                               total, " bytes, gave up"));
  }
  return absl::DeadlineExceededError(absl::StrCat(what, ": the fetching node did not take it within ",
                                                  absl::FormatDuration(FetchAllowed(options, total)), " (", done,
                                                  " of ", total, " bytes went), gave up"));
}

}  // namespace

// Held while a fetch is served or its lane is open: one of max_fetches.
class PeerService::FetchSlot {
 public:
  explicit FetchSlot(PeerService* service) : service_(service) {}
  ~FetchSlot() {
    absl::MutexLock l(&service_->fetch_mu_);
    --service_->fetch_stats_.in_flight;
  }
  FetchSlot(const FetchSlot&) = delete;
  FetchSlot& operator=(const FetchSlot&) = delete;
  // The fetch was cut (a stalled or too slow fetching node).
  void Cut() {
    absl::MutexLock l(&service_->fetch_mu_);
    ++service_->fetch_stats_.cut;
  }

 private:
  PeerService* const service_;
};

// ---- The data lane, served ----

// The listener, the connections presenting their nonce (on one thread, with
// poll), the lanes handed out and not used yet, and one thread per lane in
// use (at most options.max_lanes together).
class PeerService::Lanes {
 public:
  Lanes(ReplicaStore* store, const PeerServiceOptions& options, base::Logger* logger, base::Clock* fetch_clock,
        Fd listener, Fd wake, int port)
      : store_(store),
        options_(options),
        logger_(logger),
        clock_(options.clock != nullptr ? options.clock : base::RealClock::Get()),
        fetch_clock_(fetch_clock),
        listener_(std::move(listener)),
        wake_(std::move(wake)),
        port_(port) {
    thread_ = std::thread([this] { Loop(); });
  }

  ~Lanes() {
    {
      absl::MutexLock l(&mu_);
      stopping_ = true;
      // Lanes in use end at their next send or receive.
      for (Worker& w : workers_) {
        if (w.fd >= 0) (void)::shutdown(w.fd, SHUT_RDWR);
      }
    }
    Wake();
    thread_.join();
    std::list<Worker> workers;
    std::list<Pending> pending;
    {
      absl::MutexLock l(&mu_);
      workers.swap(workers_);
      pending.swap(pending_);
    }
    for (Worker& w : workers) w.thread.join();
  }

  int port() const { return port_; }

  // A lane for the copy `reservation` holds (`what` names it, `peer` the
  // caller); returns its nonce. kUnavailable when too many are open.
  absl::StatusOr<std::string> OpenPut(std::unique_ptr<ReplicaStore::Reservation> reservation, std::string what,
                                      std::string peer) {
    Pending p;
    p.put = std::move(reservation);
    p.what = std::move(what);
    p.peer = std::move(peer);
    return Open(std::move(p));
  }
  absl::StatusOr<std::string> OpenFetch(std::shared_ptr<const Replica> replica, std::unique_ptr<FetchSlot> slot,
                                        std::string what, std::string peer) {
    Pending p;
    p.fetch = std::move(replica);
    p.slot = std::move(slot);
    p.what = std::move(what);
    p.peer = std::move(peer);
    return Open(std::move(p));
  }

  PeerLaneStats stats() const {
    absl::MutexLock l(&mu_);
    return stats_;
  }

 private:
  // A lane handed out, waiting for its connection.
  struct Pending {
    std::string nonce;
    absl::Time expires;
    std::unique_ptr<ReplicaStore::Reservation> put;  // a put: the copy's memory, reserved
    std::shared_ptr<const Replica> fetch;            // a fetch: the copy
    std::unique_ptr<FetchSlot> slot;                 // and its place among the fetches served
    std::string what;                                // "the copy of job .. from node .."
    std::string peer;                                // who opened it
  };
  // A connection presenting its nonce (the loop's own).
  struct Handshake {
    Fd fd;
    absl::Time deadline;
    uint8_t nonce[kNonceBytes];
    size_t got = 0;
  };
  // A lane in use.
  struct Worker {
    std::thread thread;
    int fd = -1;  // -1 once closed
    bool done = false;
  };

  absl::StatusOr<std::string> Open(Pending p) {
    CKPTD_ASSIGN_OR_RETURN(const std::string hex, base::RandomHex(kNonceBytes));
    p.nonce = absl::HexStringToBytes(hex);
    p.expires = clock_->Now() + options_.lane_ttl;
    std::string nonce = p.nonce;
    absl::MutexLock l(&mu_);
    if (stopping_) return absl::UnavailableError("the agent is stopping");
    size_t in_use = 0;
    for (const Worker& w : workers_) in_use += w.done ? 0 : 1;
    if (pending_.size() + in_use >= options_.max_lanes) {
      return absl::UnavailableError(absl::StrCat("node ", options_.node_id, " has ", options_.max_lanes,
                                                 " data lanes open or in use already; try again later"));
    }
    pending_.push_back(std::move(p));
    ++stats_.opened;
    return nonce;
  }

  void Wake() {
    const uint64_t one = 1;
    // A full counter wakes the loop just as well.
    (void)!::write(wake_.get(), &one, sizeof(one));
  }

  void Loop() {
    base::SetCallingThreadName("ckptd-peer");
    std::list<Handshake> shakes;
    absl::Time listener_paused_until = absl::InfinitePast();
    std::vector<pollfd> fds;
    while (true) {
      {
        absl::MutexLock l(&mu_);
        if (stopping_) return;
      }
      absl::Time now = clock_->Now();
      absl::Duration wait = kLoopSlice;
      for (const Handshake& h : shakes) wait = std::min(wait, h.deadline - now);
      const bool listening = now >= listener_paused_until;
      fds.clear();
      fds.push_back({wake_.get(), POLLIN, 0});
      fds.push_back({listening ? listener_.get() : -1, POLLIN, 0});
      for (const Handshake& h : shakes) fds.push_back({h.fd.get(), POLLIN, 0});
      const int rc =
          ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(wait))));
      if (rc < 0 && errno != EINTR) {
        logger_->Error(base::PosixError("data lane: poll", errno).ToString());
        absl::SleepFor(kLoopSlice);  // not a busy loop on a lasting error
      }
      if (fds[0].revents != 0) {
        uint64_t count;
        (void)!::read(wake_.get(), &count, sizeof(count));  // only to clear it
      }
      now = clock_->Now();
      size_t i = 2;
      for (auto it = shakes.begin(); it != shakes.end(); ++i) {
        const bool ready = rc > 0 && fds[i].revents != 0;
        if (ready && !ReadNonce(*it)) {
          Count(&PeerLaneStats::idle_closed);  // counted before the close that a test may wait for
          it = shakes.erase(it);               // closed before the nonce
        } else if (it->got == kNonceBytes) {
          Present(std::move(*it));
          it = shakes.erase(it);
        } else if (now >= it->deadline) {
          Count(&PeerLaneStats::idle_closed);
          it = shakes.erase(it);
        } else {
          ++it;
        }
      }
      if (listening && rc > 0 && fds[1].revents != 0) Accept(now, &shakes, &listener_paused_until);
      Sweep(now);
    }
  }

  // Takes waiting connections; the longest waiting is closed for a new one
  // when options_.max_handshakes are waiting.
  void Accept(absl::Time now, std::list<Handshake>* shakes, absl::Time* paused_until) {
    for (int k = 0; k < kMaxAcceptsPerRound; ++k) {
      Fd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (fd.get() < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          // Out of descriptors or memory: the queue waits a moment rather
          // than spin.
          logger_->Warning(base::PosixError("data lane: accept", errno).ToString());
          *paused_until = now + kLoopSlice;
        }
        return;
      }
      while (!shakes->empty() && shakes->size() >= std::max<size_t>(1, options_.max_handshakes)) {
        Count(&PeerLaneStats::idle_closed);
        shakes->pop_front();
      }
      Handshake h;
      h.fd = std::move(fd);
      h.deadline = now + options_.handshake_timeout;
      // The nonce usually came with the connection.
      if (!ReadNonce(h)) {
        Count(&PeerLaneStats::idle_closed);
      } else if (h.got == kNonceBytes) {
        Present(std::move(h));
      } else {
        shakes->push_back(std::move(h));
      }
    }
  }

  // Reads what there is of the nonce (never past it); false once the
  // connection closed or failed.
  static bool ReadNonce(Handshake& h) {
    while (h.got < kNonceBytes) {
      const ssize_t n = ::recv(h.fd.get(), h.nonce + h.got, kNonceBytes - h.got, 0);
      if (n > 0) {
        h.got += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      }
    }
    return true;
  }

  // A connection presented a whole nonce: the lane it opens is served on a
  // thread of its own, or the connection is closed.
  void Present(Handshake h) {
    const absl::string_view nonce(reinterpret_cast<const char*>(h.nonce), kNonceBytes);
    const absl::Time now = clock_->Now();
    std::list<Pending> lane;
    absl::MutexLock l(&mu_);
    // Every open lane is compared in full: the time taken tells nothing of
    // how close a guess came.
    auto match = pending_.end();
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (base::ConstantTimeEquals(nonce, it->nonce)) match = it;
    }
    if (match == pending_.end() || now >= match->expires || stopping_) {
      ++stats_.refused;
      ++refused_unlogged_;
      if (now >= next_refusal_log_) {
        logger_->Warning(absl::StrCat("data lane: closed ", refused_unlogged_, " connection(s) (the last from ",
                                      PeerName(h.fd.get()), ") that presented a wrong, used or expired nonce"));
        refused_unlogged_ = 0;
        next_refusal_log_ = now + kRefusalLogInterval;
      }
      return;  // an expired lane goes with the next sweep
    }
    lane.splice(lane.begin(), pending_, match);
    Worker& w = workers_.emplace_back();
    w.fd = h.fd.get();
    auto self = std::prev(workers_.end());
    const std::string what = lane.front().what;
    try {
      w.thread = std::thread([this, self, fd = std::move(h.fd), p = std::move(lane.front())]() mutable {
        base::SetCallingThreadName("ckptd-peer-recv");
        Serve(std::move(p), fd);
        {
          absl::MutexLock done(&mu_);
          self->fd = -1;  // the destructor no longer shuts it down
          self->done = true;
        }
        fd.Reset();
      });
    } catch (const std::system_error& e) {  // the one way std::thread reports it
      // The connection closes and the lane goes (its memory with it,
      // after the lock is released): the sender sees the copy refused.
      workers_.erase(self);
      ++stats_.dropped;
      logger_->Error(absl::StrCat("data lane: no thread for ", what, ": ", e.what()));
    }
  }

  void Serve(Pending p, const Fd& fd) {
    const bool put = p.put != nullptr;
    absl::Status s = SetBlocking(fd.get(), true, p.what);
    if (s.ok()) s = SetIoTimeout(fd.get(), options_.lane_io_timeout, p.what);
    if (s.ok()) {
      s = put ? ServePut(std::move(p.put), fd.get(), p.what) : ServeFetch(*p.fetch, *p.slot, fd.get(), p.what);
    } else if (put) {
      p.put.reset();
      Count(&PeerLaneStats::dropped);
    }
    if (!put) Count(s.ok() ? &PeerLaneStats::sent : &PeerLaneStats::dropped);
    if (!s.ok()) {
      logger_->Warning(absl::StrCat("data lane of ", p.peer, ": ", s.message()));
    } else if (!put) {
      logger_->Info(absl::StrCat("peer copy of ", KeyText(p.fetch->header().key()), " sent to ", p.peer,
                                 " for a restore (data lane)"));
    }
  }

  // Receives the copy into `reservation` and keeps it when every byte came
  // and the sender said it was valid to the end; answers either way.
  absl::Status ServePut(std::unique_ptr<ReplicaStore::Reservation> reservation, int fd, const std::string& what) {
    Replica& replica = reservation->replica();
    absl::Status s;
    absl::StatusOr<size_t> got = ReceiveCopy(fd, absl::Span<uint8_t>(replica.data(), replica.size()), what);
    uint8_t valid = 0;
    if (!got.ok()) {
      s = got.status();
    } else if (*got != replica.size()) {
      s = absl::InvalidArgumentError(
          absl::StrCat(what, ": the connection closed after ", *got, " of its ", replica.size(), " bytes"));
    } else if (absl::StatusOr<size_t> end = RecvAll(fd, absl::Span<uint8_t>(&valid, 1), what, replica.size());
               !end.ok()) {
      s = end.status();
    } else if (*end != 1) {
      s = absl::InvalidArgumentError(
          absl::StrCat(what, ": the connection closed after the data, before the sender said it was valid"));
    } else if (valid != kCopyValid) {
      s = absl::AbortedError(absl::StrCat(what, ": the sender says its bytes changed while they were sent"));
    }
    Count(s.ok() ? &PeerLaneStats::kept : &PeerLaneStats::dropped);
    if (s.ok()) store_->Keep(std::move(reservation));
    reservation.reset();  // before the answer: a sender that retries finds the memory free
    const std::string answer = EncodeAnswer(s);
    PushNow(fd);
    // The sender may be gone already; what went wrong is `s`.
    (void)SendAll(fd, absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(answer.data()), answer.size()), what);
    return s;
  }

  // Sends the copy; a fetching node that takes no piece for fetch_stall, or
  // not the copy in the time its size allows, is cut off (the socket's own
  // timeout, lane_io_timeout, bounds one wait for a byte only).
  absl::Status ServeFetch(const Replica& replica, FetchSlot& slot, int fd, const std::string& what) {
    Watchdog watch(fetch_clock_, options_.fetch_stall, fetch_clock_->Now() + FetchAllowed(options_, replica.size()),
                   [fd] { (void)::shutdown(fd, SHUT_RDWR); });
    CKPTD_RETURN_IF_ERROR(watch.Start(what));
    absl::Status s;
    uint64_t offset = 0;
    while (s.ok() && offset < replica.size()) {
      const uint64_t n = std::min<uint64_t>(kReplicaPieceBytes, replica.size() - offset);
      watch.BeginWait();
      s = SendAll(fd, absl::Span<const uint8_t>(replica.data() + offset, n), what, offset);
      watch.EndWait();
      if (s.ok()) offset += n;
    }
    watch.Stop();  // before `fd` closes: its number may be reused
    if (!s.ok() && watch.cut() != Watchdog::Cut::kNone) {
      slot.Cut();
      return FetchCut(watch.cut(), what, options_, offset, replica.size());
    }
    return s;
  }

  // Drops lanes past their time (their memory with them), and joins the
  // threads of lanes that ended.
  void Sweep(absl::Time now) {
    std::list<Pending> expired;
    std::list<Worker> ended;
    {
      absl::MutexLock l(&mu_);
      for (auto it = pending_.begin(); it != pending_.end();) {
        auto next = std::next(it);
        if (now >= it->expires) expired.splice(expired.end(), pending_, it);
        it = next;
      }
      for (auto it = workers_.begin(); it != workers_.end();) {
        auto next = std::next(it);
        if (it->done) ended.splice(ended.end(), workers_, it);
        it = next;
      }
      stats_.expired += expired.size();
    }
    for (const Pending& p : expired) {
      logger_->Warning(absl::StrCat("data lane for ", p.what, " opened by ", p.peer, " expired unused"));
    }
    for (Worker& w : ended) w.thread.join();
  }

  void Count(uint64_t PeerLaneStats::*counter) {
    absl::MutexLock l(&mu_);
    ++(stats_.*counter);
  }

  ReplicaStore* const store_;
  const PeerServiceOptions& options_;
  base::Logger* const logger_;
  base::Clock* const clock_;
  base::Clock* const fetch_clock_;
  const Fd listener_;
  const Fd wake_;
  const int port_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::list<Worker> workers_ ABSL_GUARDED_BY(mu_);
  PeerLaneStats stats_ ABSL_GUARDED_BY(mu_);
  uint64_t refused_unlogged_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time next_refusal_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread thread_;
};

// ---- The service ----

PeerService::PeerService(ReplicaStore* store, PeerServiceOptions options)
    : store_(store),
      options_(std::move(options)),
      logger_(options_.logger != nullptr ? options_.logger : &base::DefaultLogger()),
      fetch_clock_(options_.fetch_clock != nullptr ? options_.fetch_clock : base::RealClock::Get()) {}

PeerService::~PeerService() {
  std::unique_ptr<Lanes> lanes;
  {
    absl::MutexLock l(&mu_);
    lanes = std::move(lanes_);
  }
}

void PeerService::SetSenders(const google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner>& senders) {
  std::map<std::string, std::string> tickets;
  for (const ckptd::v1::ReplicationPartner& p : senders) {
    if (!p.ticket().empty()) tickets[p.node_id()] = p.ticket();
  }
  absl::MutexLock l(&mu_);
  tickets_ = std::move(tickets);
}

absl::StatusOr<int> PeerService::StartDataLane(const std::string& host, int port) {
  if (options_.tls) {
    return absl::FailedPreconditionError("no data lane with TLS: the copies stay on the encrypted gRPC streams");
  }
  if (port < 0 || port > 65535) return absl::InvalidArgumentError(absl::StrCat("data lane port ", port));
  absl::MutexLock l(&mu_);
  if (lanes_ != nullptr) return absl::FailedPreconditionError("the data lane is served already");
  int bound = 0;
  CKPTD_ASSIGN_OR_RETURN(Fd listener, tcp::Listen(host, port, &bound));
  Fd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (wake.get() < 0) return base::PosixError("data lane: eventfd", errno);
  lanes_ =
      std::make_unique<Lanes>(store_, options_, logger_, fetch_clock_, std::move(listener), std::move(wake), bound);
  return bound;
}

PeerLaneStats PeerService::lane_stats() const {
  absl::MutexLock l(&mu_);
  return lanes_ != nullptr ? lanes_->stats() : PeerLaneStats();
}

PeerFetchStats PeerService::fetch_stats() const {
  absl::MutexLock l(&fetch_mu_);
  return fetch_stats_;
}

absl::StatusOr<std::unique_ptr<PeerService::FetchSlot>> PeerService::TakeFetchSlot(absl::string_view rpc,
                                                                                  absl::string_view fetcher) {
  const size_t limit = std::max<size_t>(1, options_.max_fetches);
  {
    absl::MutexLock l(&fetch_mu_);
    if (fetch_stats_.in_flight < limit) {
      ++fetch_stats_.in_flight;
      return std::make_unique<FetchSlot>(this);
    }
    ++fetch_stats_.refused;
  }
  const absl::Status s = absl::ResourceExhaustedError(
      absl::StrCat(rpc, ": node ", options_.node_id, " serves ", limit, " fetches already, the most it serves at a",
                   " time; try again later, or another holder"));
  logger_->Warning(absl::StrCat("peer fetch by ", fetcher, " refused: ", s.message()));
  return s;
}

absl::Status PeerService::CheckCaller(const grpc::ServerContext& ctx, absl::string_view rpc) const {
  if (options_.tls && !options_.tls_node_unit.empty()) {
    // The transport checked that the certificate is the CA's; it must also
    // be a node's: an operator's certificate of the same CA fetches nothing.
    const std::string subject = rpc::CertificateSubject(ctx.auth_context().get());
    if (!rpc::SubjectNamesUnit(subject, options_.tls_node_unit)) {
      return absl::PermissionDeniedError(absl::StrCat(
          rpc, ": the client certificate (subject \"", absl::CHexEscape(subject.substr(0, 256)),
          "\") is no node's: it has no OU=", options_.tls_node_unit, "; only agents' certificates may call a Peer service"));
    }
  }
  if (options_.agent_token.empty()) return absl::OkStatus();  // TLS (checked by the transport), or open
  const auto& md = ctx.client_metadata();
  auto it = md.find(grpc::string_ref(kAuthorization.data(), kAuthorization.size()));
  if (it == md.end()) {
    return absl::UnauthenticatedError(
        absl::StrCat(rpc, " needs the agent token as metadata \"authorization: Bearer <token>\""));
  }
  const absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, kBearer) ||
      !base::ConstantTimeEquals(value.substr(kBearer.size()), options_.agent_token)) {
    return absl::PermissionDeniedError(absl::StrCat(rpc, ": the agent token is wrong"));
  }
  return absl::OkStatus();
}

void PeerService::SetFetchKey(std::string key) {
  absl::MutexLock l(&mu_);
  fetch_key_ = std::move(key);
}

absl::Status PeerService::CheckFetcher(const grpc::ServerContext& ctx, const ckptd::v1::FetchReplicaRequest& request,
                                       absl::string_view rpc) const {
  absl::Status s = FetcherAllowed(ctx, request, rpc);
  if (!s.ok()) logger_->Warning(absl::StrCat("peer fetch from ", ctx.peer(), " refused: ", s.message()));
  return s;
}

absl::Status PeerService::FetcherAllowed(const grpc::ServerContext& ctx, const ckptd::v1::FetchReplicaRequest& request,
                                         absl::string_view rpc) const {
  const std::string node = absl::CHexEscape(request.node_id().substr(0, 256));
  if (options_.tls && !rpc::CertificateNames(ctx.auth_context().get(), request.node_id())) {
    return absl::PermissionDeniedError(absl::StrCat(rpc, ": the fetch names node \"", node,
                                                    "\", which the client certificate does not name"));
  }
  std::string key;
  {
    absl::MutexLock l(&mu_);
    key = fetch_key_;
  }
  if (key.empty()) return absl::OkStatus();  // no coordinator has given one (SetFetchKey)
  const ckptd::v1::ReplicaKey& copy = request.key();
  if (!rpc::FetchTicketValid(request.ticket(), key, request.node_id(), copy.job(), copy.rank(), copy.step())) {
    return absl::PermissionDeniedError(absl::StrCat(
        rpc, ": node \"", node, "\" has no ticket of node ", options_.node_id, " for ", KeyText(copy),
        request.ticket().empty() ? " (none was presented)" : " (the one presented is not valid)",
        ": only a node the coordinator planned that restore for may fetch the copy (with the ticket of its plan); "
        "a holder that registered again since the plan has a new key"));
  }
  return absl::OkStatus();
}

absl::Status PeerService::CheckSender(const ckptd::v1::ReplicaHeader& header, absl::string_view rpc) {
  absl::MutexLock l(&mu_);
  auto it = tickets_.find(header.from_node());
  if (it == tickets_.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat(rpc, ": node '", absl::CHexEscape(header.from_node()), "' is not a partner sending to this node"));
  }
  if (!base::ConstantTimeEquals(header.ticket(), it->second)) {
    return absl::PermissionDeniedError(
        absl::StrCat(rpc, ": the ticket of node '", absl::CHexEscape(header.from_node()), "' is wrong"));
  }
  return absl::OkStatus();
}

grpc::Status PeerService::PutReplica(grpc::ServerContext* ctx, grpc::ServerReader<ckptd::v1::ReplicaPiece>* reader,
                                     ckptd::v1::PutReplicaResponse* response) {
  if (absl::Status s = CheckCaller(*ctx, "PutReplica"); !s.ok()) return rpc::ToGrpcStatus(s);
  absl::Status s = Receive(reader, response);
  if (!s.ok()) logger_->Warning(absl::StrCat("peer copy from ", ctx->peer(), " refused: ", s.message()));
  return rpc::ToGrpcStatus(s);
}

absl::Status PeerService::Receive(grpc::ServerReader<ckptd::v1::ReplicaPiece>* reader,
                                  ckptd::v1::PutReplicaResponse* response) {
  ckptd::v1::ReplicaPiece piece;
  if (!reader->Read(&piece)) return absl::InvalidArgumentError("PutReplica: the stream ended before the header");
  if (!piece.has_header()) return absl::InvalidArgumentError("PutReplica: the first piece carries no header");
  const ckptd::v1::ReplicaHeader& header = piece.header();
  CKPTD_RETURN_IF_ERROR(CheckSender(header, "PutReplica"));
  const std::string what = absl::StrCat("the copy of ", KeyText(header.key()), " from node ", header.from_node());
  absl::StatusOr<std::unique_ptr<ReplicaStore::Reservation>> reservation = store_->Reserve(header);
  if (!reservation.ok()) return reservation.status();
  Replica& replica = (*reservation)->replica();
  const absl::Span<uint8_t> out(replica.data(), replica.size());
  uint64_t done = 0;
  ckptd::v1::ReplicaPiece next;
  for (ckptd::v1::ReplicaPiece* p = &piece; p != nullptr; p = reader->Read(&next) ? &next : nullptr) {
    if (p != &piece && p->has_header()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": a second header arrived at offset ", done));
    }
    if (absl::Status s = TakePiece(*p, out, &done); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
    }
  }
  if (done != out.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the stream ended after ", done, " of its ", out.size(), " bytes"));
  }
  store_->Keep(*std::move(reservation));
  response->set_bytes(done);
  return absl::OkStatus();
}

grpc::Status PeerService::FetchReplica(grpc::ServerContext* ctx, const ckptd::v1::FetchReplicaRequest* request,
                                       grpc::ServerWriter<ckptd::v1::ReplicaPiece>* writer) {
  if (absl::Status s = CheckCaller(*ctx, "FetchReplica"); !s.ok()) return rpc::ToGrpcStatus(s);
  if (absl::Status s = CheckFetcher(*ctx, *request, "FetchReplica"); !s.ok()) return rpc::ToGrpcStatus(s);
  const std::string fetcher =
      absl::StrCat("node ", absl::CHexEscape(request->node_id().substr(0, 256)), " (", ctx->peer(), ")");
  absl::StatusOr<std::unique_ptr<FetchSlot>> slot = TakeFetchSlot("FetchReplica", fetcher);
  if (!slot.ok()) return rpc::ToGrpcStatus(slot.status());
  std::shared_ptr<const Replica> replica = store_->Find(request->key());
  if (replica == nullptr) {
    return rpc::ToGrpcStatus(
        absl::NotFoundError(absl::StrCat("node ", options_.node_id, " holds no copy of ", KeyText(request->key()))));
  }
  // A fetching node that takes no piece for fetch_stall, or not the copy in
  // the time its size allows, is cut off: it holds the copy's memory.
  const std::string what = absl::StrCat("the copy of ", KeyText(request->key()), " to ", fetcher);
  Watchdog watch(fetch_clock_, options_.fetch_stall, fetch_clock_->Now() + FetchAllowed(options_, replica->size()),
                 [ctx] { ctx->TryCancel(); });
  if (absl::Status s = watch.Start(what); !s.ok()) return rpc::ToGrpcStatus(s);
  ckptd::v1::ReplicaPiece piece;
  *piece.mutable_header() = replica->header();
  uint64_t offset = 0;
  bool written = true;
  do {
    const uint64_t n = std::min<uint64_t>(kReplicaPieceBytes, replica->size() - offset);
    piece.set_offset(offset);
    piece.mutable_data()->assign(reinterpret_cast<const char*>(replica->data()) + offset, n);
    watch.BeginWait();
    written = writer->Write(piece);
    watch.EndWait();
    if (!written) break;
    piece.clear_header();
    offset += n;
  } while (offset < replica->size());
  watch.Stop();
  if (!written) {
    if (watch.cut() == Watchdog::Cut::kNone) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the fetching node went away");
    }
    (*slot)->Cut();
    const absl::Status cut = FetchCut(watch.cut(), what, options_, offset, replica->size());
    logger_->Warning(std::string(cut.message()));
    return rpc::ToGrpcStatus(cut);
  }
  logger_->Info(absl::StrCat("peer copy of ", KeyText(request->key()), " sent to ", fetcher, " for a restore"));
  return grpc::Status::OK;
}

grpc::Status PeerService::OpenPut(grpc::ServerContext* ctx, const ckptd::v1::ReplicaHeader* header,
                                  ckptd::v1::DataLane* lane) {
  if (absl::Status s = CheckCaller(*ctx, "OpenPut"); !s.ok()) return rpc::ToGrpcStatus(s);
  Lanes* lanes;
  {
    absl::MutexLock l(&mu_);
    lanes = lanes_.get();  // set once, gone only with the service
  }
  if (lanes == nullptr) {
    return rpc::ToGrpcStatus(
        absl::UnimplementedError(absl::StrCat("node ", options_.node_id, " serves no data lane",
                                              options_.tls ? " (TLS)" : "", ": send the copy with PutReplica")));
  }
  absl::Status s = CheckSender(*header, "OpenPut");
  const std::string what = absl::StrCat("the copy of ", KeyText(header->key()), " from node ",
                                        absl::CHexEscape(header->from_node().substr(0, 256)));
  absl::StatusOr<std::string> nonce;
  if (s.ok()) {
    absl::StatusOr<std::unique_ptr<ReplicaStore::Reservation>> reservation = store_->Reserve(*header);
    nonce = reservation.ok() ? lanes->OpenPut(*std::move(reservation), what, ctx->peer()) : reservation.status();
    s = nonce.status();
  }
  if (!s.ok()) {
    logger_->Warning(absl::StrCat("peer copy from ", ctx->peer(), " refused: ", s.message()));
    return rpc::ToGrpcStatus(s);
  }
  lane->set_port(static_cast<uint32_t>(lanes->port()));
  lane->set_nonce(*std::move(nonce));
  return grpc::Status::OK;
}

grpc::Status PeerService::OpenFetch(grpc::ServerContext* ctx, const ckptd::v1::FetchReplicaRequest* request,
                                    ckptd::v1::DataLane* lane) {
  if (absl::Status s = CheckCaller(*ctx, "OpenFetch"); !s.ok()) return rpc::ToGrpcStatus(s);
  if (absl::Status s = CheckFetcher(*ctx, *request, "OpenFetch"); !s.ok()) return rpc::ToGrpcStatus(s);
  Lanes* lanes;
  {
    absl::MutexLock l(&mu_);
    lanes = lanes_.get();
  }
  if (lanes == nullptr) {
    return rpc::ToGrpcStatus(
        absl::UnimplementedError(absl::StrCat("node ", options_.node_id, " serves no data lane",
                                              options_.tls ? " (TLS)" : "", ": fetch the copy with FetchReplica")));
  }
  std::string fetcher =
      absl::StrCat("node ", absl::CHexEscape(request->node_id().substr(0, 256)), " (", ctx->peer(), ")");
  // Held until the lane is used and done, or expires.
  absl::StatusOr<std::unique_ptr<FetchSlot>> slot = TakeFetchSlot("OpenFetch", fetcher);
  if (!slot.ok()) return rpc::ToGrpcStatus(slot.status());
  std::shared_ptr<const Replica> replica = store_->Find(request->key());
  if (replica == nullptr) {
    return rpc::ToGrpcStatus(
        absl::NotFoundError(absl::StrCat("node ", options_.node_id, " holds no copy of ", KeyText(request->key()))));
  }
  *lane->mutable_header() = replica->header();
  absl::StatusOr<std::string> nonce =
      lanes->OpenFetch(std::move(replica), *std::move(slot),
                       absl::StrCat("the copy of ", KeyText(request->key())), std::move(fetcher));
  if (!nonce.ok()) return rpc::ToGrpcStatus(nonce.status());
  lane->set_port(static_cast<uint32_t>(lanes->port()));
  lane->set_nonce(*std::move(nonce));
  return grpc::Status::OK;
}

PeerServer::PeerServer(std::unique_ptr<grpc::Server> server, std::unique_ptr<PeerGate> gate)
    : server_(std::move(server)), gate_(std::move(gate)) {}

PeerServer::~PeerServer() { Shutdown(); }

void PeerServer::Shutdown() {
  if (gate_ != nullptr) gate_->Stop();  // before gRPC: nothing is handed to a server shutting down
  if (server_ != nullptr) server_->Shutdown();
}

PeerGateStats PeerServer::gate_stats() const { return gate_ != nullptr ? gate_->stats() : PeerGateStats(); }

absl::StatusOr<std::unique_ptr<PeerServer>> StartPeerServer(const std::string& listen, PeerService* service,
                                                           std::shared_ptr<grpc::ServerCredentials> credentials,
                                                           int* port) {
  const PeerServiceOptions& options = service->options();
  const bool gated = credentials == nullptr && !options.agent_token.empty();
  grpc::ServerBuilder builder;
  Fd listener;
  if (gated) {
    CKPTD_ASSIGN_OR_RETURN(const auto host_port, base::ParseHostPort(listen, base::PortUse::kListen));
    CKPTD_ASSIGN_OR_RETURN(listener, tcp::Listen(host_port.first, host_port.second, port, "peers"));
  } else {
    builder.AddListeningPort(listen, credentials != nullptr ? credentials : grpc::InsecureServerCredentials(), port);
  }
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  rpc::LimitIdleConnections(&builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve peers on ", listen, " (--peer-listen)"));
  }
  std::unique_ptr<PeerGate> gate;
  if (gated) {
    PeerGateOptions gate_options;
    gate_options.token = options.agent_token;
    gate_options.handshake_timeout = options.preamble_timeout;
    gate_options.max_handshakes = options.max_preambles;
    gate_options.logger = options.logger;
    gate_options.clock = options.clock;
    absl::StatusOr<std::unique_ptr<PeerGate>> started = PeerGate::Start(std::move(listener), server.get(), gate_options);
    if (!started.ok()) {
      server->Shutdown();
      return started.status();
    }
    gate = *std::move(started);
  }
  return std::make_unique<PeerServer>(std::move(server), std::move(gate));
}

// ---- The client side ----

GrpcPeerNetwork::GrpcPeerNetwork(GrpcPeerNetworkOptions options)
    : options_(std::move(options)), clock_(options_.clock != nullptr ? options_.clock : base::RealClock::Get()) {}

PeerNetworkStats GrpcPeerNetwork::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

ckptd::v1::Peer::Stub* GrpcPeerNetwork::StubFor(const std::string& address) {
  absl::MutexLock l(&mu_);
  std::unique_ptr<ckptd::v1::Peer::Stub>& stub = stubs_[address];
  if (stub == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetMaxSendMessageSize(kMaxMessageBytes);
    if (ThroughGate()) PeerGateChannelArguments(address, options_.agent_token, &args);
    stub = ckptd::v1::Peer::NewStub(grpc::CreateCustomChannel(
        address, options_.credentials != nullptr ? options_.credentials : grpc::InsecureChannelCredentials(), args));
  }
  return stub.get();
}

absl::Status GrpcPeerNetwork::FromCall(const grpc::Status& status, const std::string& address) const {
  absl::Status s = rpc::FromGrpcStatus(status);
  if (!absl::IsUnavailable(s) || !ThroughGate()) return s;
  // The partner's gate answered the preamble (peer_gate.h), as gRPC's
  // CONNECT handshaker reports it.
  if (absl::StrContains(s.message(), "response code 403")) {
    return absl::PermissionDeniedError(absl::StrCat("the Peer port at ", address,
                                                    " refused this agent's token: the partner has another one (",
                                                    s.message(), ")"));
  }
  if (absl::StrContains(s.message(), "response code 40")) {
    return absl::UnauthenticatedError(
        absl::StrCat("the Peer port at ", address, " refused this agent's preamble (", s.message(), ")"));
  }
  return s;
}

absl::Duration GrpcPeerNetwork::AllowedFor(uint64_t bytes) const {
  return options_.base_deadline + absl::Seconds(static_cast<double>(bytes) / options_.min_bytes_per_second);
}

void GrpcPeerNetwork::Prepare(grpc::ClientContext* ctx, uint64_t bytes) const {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + AllowedFor(bytes)));
  Authorize(ctx);
}

void GrpcPeerNetwork::Authorize(grpc::ClientContext* ctx) const {
  if (!options_.agent_token.empty()) {
    ctx->AddMetadata(std::string(kAuthorization), absl::StrCat(kBearer, options_.agent_token));
  }
}

absl::Status GrpcPeerNetwork::Put(const std::string& address, const ckptd::v1::ReplicaHeader& header,
                                  const PieceSource& source) {
  if (options_.credentials == nullptr) {
    bool no_lane = false;
    absl::Status s = PutOverLane(address, header, source, &no_lane);
    if (!no_lane) return s;
  }
  return PutOverStream(address, header, source);
}

absl::StatusOr<ckptd::v1::ReplicaHeader> GrpcPeerNetwork::Fetch(const std::string& address,
                                                                const ckptd::v1::ReplicaKey& key,
                                                                const std::string& ticket, const ReplicaSink& sink) {
  if (options_.credentials == nullptr) {
    bool no_lane = false;
    absl::StatusOr<ckptd::v1::ReplicaHeader> got = FetchOverLane(address, key, ticket, sink, &no_lane);
    if (!no_lane) return got;
  }
  return FetchOverStream(address, key, ticket, sink);
}

absl::Status GrpcPeerNetwork::PutOverLane(const std::string& address, const ckptd::v1::ReplicaHeader& header,
                                          const PieceSource& source, bool* no_lane) {
  absl::StatusOr<std::pair<std::string, uint16_t>> host = base::ParseHostPort(address, base::PortUse::kConnect);
  if (!host.ok()) {  // e.g. a gRPC URI
    *no_lane = true;
    return host.status();
  }
  const absl::Duration allowed = AllowedFor(header.data_bytes());
  const absl::Time deadline = clock_->Now() + allowed;
  ckptd::v1::DataLane lane;
  {
    grpc::ClientContext ctx;
    Prepare(&ctx, 0);
    absl::Status s = FromCall(StubFor(address)->OpenPut(&ctx, header, &lane), address);
    *no_lane = absl::IsUnimplemented(s);  // the stream is used then
    CKPTD_RETURN_IF_ERROR(s);
  }
  const std::string what = absl::StrCat("the copy of ", KeyText(header.key()), " to ", address);
  if (lane.port() == 0 || lane.port() > 65535 || lane.nonce().size() != kNonceBytes) {
    return absl::DataLossError(absl::StrCat(what, ": the partner answered a data lane of port ", lane.port(),
                                            " with a nonce of ", lane.nonce().size(), " bytes"));
  }
  {
    absl::MutexLock l(&mu_);
    ++stats_.lane_puts;
  }
  CKPTD_ASSIGN_OR_RETURN(Fd fd, tcp::Connect(host->first, static_cast<int>(lane.port()), options_.lane_connect_timeout,
                                             options_.lane_io_timeout, clock_));
  // lane_io_timeout bounds one wait for a byte; a partner that takes a byte
  // now and then is cut at the deadline.
  Watchdog watch(clock_, absl::InfiniteDuration(), deadline, [sock = fd.get()] { (void)::shutdown(sock, SHUT_RDWR); });
  CKPTD_RETURN_IF_ERROR(watch.Start(what));
  absl::Status s = PutOnLane(fd.get(), lane.nonce(), header.data_bytes(), source, what, address);
  watch.Stop();  // before `fd` closes: its number may be reused
  if (!s.ok() && watch.cut() != Watchdog::Cut::kNone) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": the partner did not take it within ", absl::FormatDuration(allowed), ", gave up"));
  }
  return s;
}

absl::Status GrpcPeerNetwork::PutOverStream(const std::string& address, const ckptd::v1::ReplicaHeader& header,
                                            const PieceSource& source) {
  {
    absl::MutexLock l(&mu_);
    ++stats_.stream_puts;
  }
  const std::string what = absl::StrCat("the copy of ", KeyText(header.key()), " to ", address);
  grpc::ClientContext ctx;
  // The whole call has the deadline for its size; a partner that stops
  // taking pieces is cut after base_deadline, long before that.
  Prepare(&ctx, header.data_bytes());
  Watchdog watch(clock_, options_.base_deadline, absl::InfiniteFuture(), [&ctx] { ctx.TryCancel(); });
  CKPTD_RETURN_IF_ERROR(watch.Start(what));
  ckptd::v1::PutReplicaResponse response;
  watch.BeginWait();
  std::unique_ptr<grpc::ClientWriter<ckptd::v1::ReplicaPiece>> writer = StubFor(address)->PutReplica(&ctx, &response);
  watch.EndWait();
  ckptd::v1::ReplicaPiece piece;
  *piece.mutable_header() = header;
  uint64_t offset = 0;
  absl::Status produced;
  do {
    const uint64_t n = std::min<uint64_t>(kReplicaPieceBytes, header.data_bytes() - offset);
    piece.set_offset(offset);
    absl::StatusOr<absl::Span<const uint8_t>> bytes = source.piece(offset, n);
    if (bytes.ok() && bytes->size() != n) {
      bytes = absl::InternalError(absl::StrCat("the piece at offset ", offset, " has ", bytes->size(), " bytes"));
    }
    produced = bytes.status();
    if (produced.ok()) {
      piece.mutable_data()->assign(reinterpret_cast<const char*>(bytes->data()), bytes->size());
      if (source.still_valid) produced = source.still_valid();
    }
    if (!produced.ok()) break;
    watch.BeginWait();
    const bool written = writer->Write(piece);
    watch.EndWait();
    if (!written) break;
    piece.clear_header();
    offset += n;
  } while (offset < header.data_bytes());
  if (!produced.ok()) {
    ctx.TryCancel();
    (void)writer->Finish();
    return produced;
  }
  watch.BeginWait();
  writer->WritesDone();
  const grpc::Status finished = writer->Finish();
  watch.Stop();
  if (!finished.ok() && watch.cut() == Watchdog::Cut::kStall) {
    const std::string when =
        offset < header.data_bytes()
            ? absl::StrCat("took no data for ", absl::FormatDuration(options_.base_deadline), " after ", offset, " of ",
                           header.data_bytes(), " bytes")
            : absl::StrCat("did not answer for ", absl::FormatDuration(options_.base_deadline), " after the last byte");
    return absl::UnavailableError(absl::StrCat(what, ": the partner ", when, ", gave up"));
  }
  CKPTD_RETURN_IF_ERROR(FromCall(finished, address));
  if (response.bytes() != header.data_bytes()) {
    return absl::DataLossError(
        absl::StrCat("the partner at ", address, " took ", response.bytes(), " of ", header.data_bytes(), " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ckptd::v1::ReplicaHeader> GrpcPeerNetwork::FetchOverLane(const std::string& address,
                                                                        const ckptd::v1::ReplicaKey& key,
                                                                        const std::string& ticket,
                                                                        const ReplicaSink& sink, bool* no_lane) {
  absl::StatusOr<std::pair<std::string, uint16_t>> host = base::ParseHostPort(address, base::PortUse::kConnect);
  if (!host.ok()) {
    *no_lane = true;
    return host.status();
  }
  ckptd::v1::FetchReplicaRequest request;
  *request.mutable_key() = key;
  request.set_node_id(options_.node_id);
  request.set_ticket(ticket);
  ckptd::v1::DataLane lane;
  {
    grpc::ClientContext ctx;
    Prepare(&ctx, 0);
    absl::Status s = FromCall(StubFor(address)->OpenFetch(&ctx, request, &lane), address);
    *no_lane = absl::IsUnimplemented(s);
    CKPTD_RETURN_IF_ERROR(s);
  }
  const std::string what = absl::StrCat("the copy of ", KeyText(key), " from ", address);
  const ckptd::v1::ReplicaHeader& header = lane.header();
  if (header.key().job() != key.job() || header.key().rank() != key.rank() || header.key().step() != key.step()) {
    return absl::DataLossError(
        absl::StrCat("asked ", address, " for the copy of ", KeyText(key), ", got that of ", KeyText(header.key())));
  }
  if (lane.port() == 0 || lane.port() > 65535 || lane.nonce().size() != kNonceBytes) {
    return absl::DataLossError(absl::StrCat(what, ": the holder answered a data lane of port ", lane.port(),
                                            " with a nonce of ", lane.nonce().size(), " bytes"));
  }
  {
    absl::MutexLock l(&mu_);
    ++stats_.lane_fetches;
  }
  // A sink that refuses leaves the lane unused: it expires on the holder.
  CKPTD_ASSIGN_OR_RETURN(const absl::Span<uint8_t> out, sink(header));
  if (out.size() != header.data_bytes()) return absl::InternalError("the sink's buffer does not have the copy's size");
  const absl::Duration allowed = AllowedFor(header.data_bytes());
  const absl::Time deadline = clock_->Now() + allowed;
  CKPTD_ASSIGN_OR_RETURN(Fd fd, tcp::Connect(host->first, static_cast<int>(lane.port()), options_.lane_connect_timeout,
                                             options_.lane_io_timeout, clock_));
  // lane_io_timeout bounds one wait for a byte; a holder that sends a byte
  // now and then is cut at the deadline.
  Watchdog watch(clock_, absl::InfiniteDuration(), deadline, [sock = fd.get()] { (void)::shutdown(sock, SHUT_RDWR); });
  CKPTD_RETURN_IF_ERROR(watch.Start(what));
  absl::StatusOr<size_t> done = size_t{0};
  if (absl::Status sent =
          SendAll(fd.get(),
                  absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(lane.nonce().data()), kNonceBytes), what);
      !sent.ok()) {
    done = sent;
  } else {
    done = ReceiveCopy(fd.get(), out, what);  // straight from the kernel into the sink's memory
  }
  watch.Stop();  // before `fd` closes: its number may be reused
  if ((!done.ok() || *done != header.data_bytes()) && watch.cut() != Watchdog::Cut::kNone) {
    return absl::DeadlineExceededError(absl::StrCat(
        what, ": did not arrive within ", absl::FormatDuration(allowed),
        done.ok() ? absl::StrCat(" (", *done, " of ", header.data_bytes(), " bytes came)") : "", ", gave up"));
  }
  if (!done.ok()) return done.status();
  if (*done != header.data_bytes()) {
    return absl::DataLossError(absl::StrCat(what, " ended after ", *done, " of ", header.data_bytes(), " bytes"));
  }
  return header;
}

absl::StatusOr<ckptd::v1::ReplicaHeader> GrpcPeerNetwork::FetchOverStream(const std::string& address,
                                                                          const ckptd::v1::ReplicaKey& key,
                                                                          const std::string& ticket,
                                                                          const ReplicaSink& sink) {
  {
    absl::MutexLock l(&mu_);
    ++stats_.stream_fetches;
  }
  const std::string what = absl::StrCat("the copy of ", KeyText(key), " from ", address);
  grpc::ClientContext ctx;
  // No deadline on the call: the copy's size, and so the time it may take,
  // comes with its first piece. The holder has base_deadline to send that,
  // then base_deadline plus the bytes' time at min_bytes_per_second, and
  // never base_deadline without a piece.
  Authorize(&ctx);
  absl::Duration allowed = options_.base_deadline;
  Watchdog watch(clock_, options_.base_deadline, clock_->Now() + allowed, [&ctx] { ctx.TryCancel(); });
  CKPTD_RETURN_IF_ERROR(watch.Start(what));
  ckptd::v1::FetchReplicaRequest request;
  *request.mutable_key() = key;
  request.set_node_id(options_.node_id);
  request.set_ticket(ticket);
  watch.BeginWait();
  std::unique_ptr<grpc::ClientReader<ckptd::v1::ReplicaPiece>> reader = StubFor(address)->FetchReplica(&ctx, request);
  ckptd::v1::ReplicaPiece piece;
  ckptd::v1::ReplicaHeader header;
  absl::Status s;
  absl::Span<uint8_t> out;
  uint64_t done = 0;
  bool first = true;
  while (s.ok() && reader->Read(&piece)) {
    watch.EndWait();
    if (first) {
      first = false;
      if (!piece.has_header()) {
        s = absl::DataLossError("the first piece carries no header");
        break;
      }
      header = piece.header();
      allowed = AllowedFor(header.data_bytes());
      watch.SetDeadline(clock_->Now() + allowed);
      if (header.key().job() != key.job() || header.key().rank() != key.rank() || header.key().step() != key.step()) {
        s = absl::DataLossError(
            absl::StrCat("asked for the copy of ", KeyText(key), ", got that of ", KeyText(header.key())));
        break;
      }
      absl::StatusOr<absl::Span<uint8_t>> where = sink(header);
      if (!where.ok()) {
        s = where.status();
        break;
      }
      out = *where;
      if (out.size() != header.data_bytes()) {
        s = absl::InternalError("the sink's buffer does not have the copy's size");
        break;
      }
    }
    s = TakePiece(piece, out, &done);
    watch.BeginWait();
  }
  if (!s.ok()) {
    ctx.TryCancel();
    (void)reader->Finish();
    return s;
  }
  const grpc::Status finished = reader->Finish();
  watch.Stop();
  // A copy that came whole before the cut stands.
  if (const Watchdog::Cut cut = watch.cut(); !finished.ok() && cut != Watchdog::Cut::kNone) {
    if (first) {
      return absl::UnavailableError(
          absl::StrCat(what, ": no answer within ", absl::FormatDuration(options_.base_deadline), ", gave up"));
    }
    if (cut == Watchdog::Cut::kStall) {
      return absl::UnavailableError(absl::StrCat(what, ": no data for ", absl::FormatDuration(options_.base_deadline),
                                                 " after ", done, " of ", header.data_bytes(), " bytes, gave up"));
    }
    return absl::DeadlineExceededError(absl::StrCat(what, ": did not arrive within ", absl::FormatDuration(allowed),
                                                    " (", done, " of ", header.data_bytes(), " bytes came), gave up"));
  }
  CKPTD_RETURN_IF_ERROR(FromCall(finished, address));
  if (first || done != header.data_bytes()) {
    return absl::DataLossError(absl::StrCat(what, " ended after ", done, " of ", header.data_bytes(), " bytes"));
  }
  return header;
}

}  // namespace ckptd::replication
