#include "agent/coordinator_link.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "rpc/grpc_status.h"
#include "base/thread_priority.h"

namespace ckptd::agent {

namespace {

constexpr size_t kMaxQueuedFailures = 1024;
constexpr size_t kMaxBatch = 256;
// A heartbeat stream is renewed now and then, so that a silently dead
// connection cannot hold it forever.
constexpr absl::Duration kStreamLifetime = absl::Minutes(10);

std::unique_ptr<rpc::CoordinatorTargets> MakeTargets(const CoordinatorLinkOptions& o) {
  grpc::ChannelArguments args;
  // Notice a dead TCP connection within seconds, also while idle.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(absl::ToInt64Milliseconds(o.max_backoff)));
  // The flags checked the list; a single address is taken as given.
  absl::StatusOr<std::vector<std::string>> addresses = rpc::ParseCoordinatorAddresses(o.address);
  return std::make_unique<rpc::CoordinatorTargets>(
      addresses.ok() ? *addresses : std::vector<std::string>{o.address},
      o.credentials ? o.credentials : grpc::InsecureChannelCredentials(), args);
}

// Whether an error may go away by itself (so the report is kept and sent again).
bool Transient(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsResourceExhausted(s) ||
         absl::IsInternal(s) || absl::IsUnknown(s) || absl::IsCancelled(s);
}

}  // namespace

namespace {

uint64_t NewInstance() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t{rd()} << 32) ^ rd();
  return v;
}

}  // namespace

CoordinatorLink::CoordinatorLink(CoordinatorLinkOptions options, HeartbeatFiller fill)
    : options_(std::move(options)), fill_(std::move(fill)), instance_(NewInstance()), interval_(options_.heartbeat_interval) {
  targets_ = MakeTargets(options_);
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  sender_thread_ = std::thread([this] { SenderLoop(); });
}

CoordinatorLink::~CoordinatorLink() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    if (stream_context_ != nullptr) stream_context_->TryCancel();
  }
  heartbeat_thread_.join();
  sender_thread_.join();
}

std::pair<std::string, std::unique_ptr<ckptd::v1::Coordinator::Stub>> CoordinatorLink::Stub() const {
  rpc::CoordinatorTargets::Target t = targets_->Current();
  return {t.address, ckptd::v1::Coordinator::NewStub(t.channel)};
}

void CoordinatorLink::Follow(const std::string& used, const grpc::ClientContext& ctx, const grpc::Status& status) {
  if (!targets_->Observe(used, ctx, status)) return;
  const std::string now = targets_->Current().address;
  absl::MutexLock l(&mu_);
  if (now == used) return;
  moved_ = true;
  if (session_) {
    logger_->Info(absl::StrCat("coordinator ", used, " is not the leader (", status.error_message(),
                               "); following ", now));
  }
  session_.reset();
}

void CoordinatorLink::Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!options_.agent_token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.agent_token);
}

bool CoordinatorLink::SleepUnlessStopping(absl::Duration d) {
  absl::MutexLock l(&mu_);
  clock_->AwaitWithTimeout(&mu_, absl::Condition(&stopping_), d);
  return !stopping_;
}

void CoordinatorLink::ShardDurable(const ckptd::v1::ShardReport& report) {
  absl::MutexLock l(&mu_);
  shards_[ShardKey(report.job(), report.step(), report.shard().rank())] = report;
  send_wake_ = true;
}

void CoordinatorLink::Failure(const ckptd::v1::ReportFailureRequest& failure) {
  absl::MutexLock l(&mu_);
  if (failures_.size() >= kMaxQueuedFailures) failures_.erase(failures_.begin());
  failures_.push_back(failure);
  send_wake_ = true;
}

std::optional<ckptd::v1::Schedule> CoordinatorLink::ScheduleFor(const std::string& job) {
  absl::MutexLock l(&mu_);
  auto it = schedules_.find(job);
  if (it == schedules_.end()) return std::nullopt;
  return it->second;
}

bool CoordinatorLink::Flush(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  send_wake_ = true;
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shards_.empty() && failures_.empty() && !sending_failures_;
  };
  return clock_->AwaitWithTimeout(&mu_, absl::Condition(&drained), timeout);
}

void CoordinatorLink::CutOff(absl::Duration duration) {
  absl::MutexLock l(&mu_);
  if (duration <= absl::ZeroDuration()) {
    cut_until_ = absl::InfinitePast();
    return;
  }
  cut_until_ = clock_->Now() + duration;
  // Ends the heartbeat stream now rather than at its next beat.
  if (stream_context_ != nullptr) stream_context_->TryCancel();
}

bool CoordinatorLink::cut_off() {
  absl::MutexLock l(&mu_);
  return CutOffLocked();
}

bool CoordinatorLink::connected() {
  absl::MutexLock l(&mu_);
  return session_.has_value();
}

bool CoordinatorLink::registered() {
  absl::MutexLock l(&mu_);
  return session_.has_value() && last_error_.ok() && !CutOffLocked();
}

absl::Status CoordinatorLink::last_error() {
  absl::MutexLock l(&mu_);
  return last_error_;
}

size_t CoordinatorLink::unanswered_shards() {
  absl::MutexLock l(&mu_);
  return shards_.size();
}

uint64_t CoordinatorLink::coordinator_epoch() {
  absl::MutexLock l(&mu_);
  return epoch_;
}

bool CoordinatorLink::AcceptEpoch(uint64_t epoch, const std::string& address) {
  if (epoch >= epoch_) {
    epoch_ = epoch;
    return true;
  }
  logger_->Warning(absl::StrCat("coordinator ", address, " answers for leadership epoch ", epoch,
                                ", older than epoch ", epoch_, " already heard: a deposed leader; its answer is "
                                "refused"));
  return false;
}

size_t CoordinatorLink::answered_shards() {
  absl::MutexLock l(&mu_);
  return answered_.size();
}

absl::StatusOr<std::string> CoordinatorLink::SessionFor(absl::string_view what, absl::Duration timeout) {
  // Asked in the node's session: right after the agent starts, wait (within
  // `timeout`) for its registration.
  absl::MutexLock l(&mu_);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || session_.has_value() || CutOffLocked();
  };
  clock_->AwaitWithTimeout(&mu_, absl::Condition(&settled), std::min(timeout, options_.rpc_timeout));
  if (CutOffLocked()) {
    return absl::UnavailableError(
        absl::StrCat(what, " from coordinator ", targets_->Describe(), ": cut off for a drill"));
  }
  if (!session_) {
    return absl::UnavailableError(absl::StrCat(what, " from coordinator ", targets_->Describe(),
                                               ": this agent is not registered with it (yet)"));
  }
  return *session_;
}

template <typename Request, typename Response>
absl::StatusOr<Response> CoordinatorLink::AskInSession(
    absl::string_view what, const Request& request, absl::Duration timeout,
    grpc::Status (ckptd::v1::Coordinator::Stub::*method)(grpc::ClientContext*, const Request&, Response*)) {
  Request asked = request;
  asked.set_node_id(options_.node_id);
  CKPTD_ASSIGN_OR_RETURN(*asked.mutable_session(), SessionFor(what, timeout));
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  Response response;
  auto [address, stub] = Stub();
  grpc::Status s = (stub.get()->*method)(&ctx, asked, &response);
  if (!s.ok()) {
    Follow(address, ctx, s);
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat(what, " from coordinator ", address, ": ", s.error_message()));
  }
  return response;
}

absl::StatusOr<ckptd::v1::RestorePlanResponse> CoordinatorLink::RestorePlan(
    const ckptd::v1::RestorePlanRequest& request, absl::Duration timeout) {
  return AskInSession("restore plan", request, std::min(timeout, options_.rpc_timeout),
                      &ckptd::v1::Coordinator::Stub::GetRestorePlan);
}

// The coordinator's first plan of a step reads the step's indexes: bounded
// by the restore's timeout, not one RPC's.
absl::StatusOr<ckptd::v1::ReshardPlanResponse> CoordinatorLink::ReshardPlan(
    const ckptd::v1::ReshardPlanRequest& request, absl::Duration timeout) {
  return AskInSession("reshard plan", request, timeout, &ckptd::v1::Coordinator::Stub::GetReshardPlan);
}

absl::Status CoordinatorLink::Register() {
  ckptd::v1::Heartbeat now;
  fill_(&now);
  ckptd::v1::RegisterAgentRequest req;
  req.set_node_id(options_.node_id);
  req.set_address(options_.host_name);
  for (const auto& g : options_.gpus) req.add_gpus(g);
  *req.mutable_ranks() = now.ranks();
  req.set_drills_allowed(options_.drills_allowed);
  req.set_instance(instance_);
  req.set_peer_address(options_.peer_address);
  req.set_failure_domain(options_.failure_domain);
  req.set_replicas(options_.replicas);
  req.set_memory_tier(options_.memory_tier);
  std::vector<ShardKey> sent;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [key, report] : shards_) {
      *req.add_durable_shards() = report;
      sent.push_back(key);
    }
    for (const auto& [key, report] : answered_) {
      if (!shards_.contains(ShardKey(report.job(), report.step(), report.shard().rank()))) {
        *req.add_durable_shards() = report;
      }
    }
  }
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout);
  ckptd::v1::RegisterAgentResponse resp;
  auto [address, stub] = Stub();
  const grpc::Status answer = stub->RegisterAgent(&ctx, req, &resp);
  if (!answer.ok()) {
    Follow(address, ctx, answer);
    return absl::Status(static_cast<absl::StatusCode>(answer.error_code()),
                        absl::StrCat(address, ": ", answer.error_message()));
  }
  {
    absl::MutexLock l(&mu_);
    if (!AcceptEpoch(resp.coordinator_epoch(), address)) {
      // Another replica leads now: go there (the shards stay queued).
      session_.reset();
      moved_ |= targets_->Observe(address, grpc::Status(grpc::StatusCode::UNAVAILABLE, "a deposed leader"));
      return absl::UnavailableError(absl::StrCat(address, ": a deposed leader (epoch ", resp.coordinator_epoch(), ")"));
    }
  }
  // Before the session is used: partners may fetch only with tickets of
  // this registration's key from then on.
  if (options_.on_registered) options_.on_registered(resp);
  absl::MutexLock l(&mu_);
  // The coordinator took every shard of the registration (or refused it for good).
  for (const ShardKey& key : sent) shards_.erase(key);
  session_ = resp.session();
  if (resp.heartbeat_interval_ms() > 0) interval_ = absl::Milliseconds(resp.heartbeat_interval_ms());
  send_wake_ = true;
  return absl::OkStatus();
}

absl::Status CoordinatorLink::StreamHeartbeats(const std::string& session) {
  grpc::ClientContext ctx;
  Prepare(&ctx, kStreamLifetime);
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return absl::CancelledError("stopping");
    if (CutOffLocked()) return absl::UnavailableError("cut off for a drill");
    stream_context_ = &ctx;
  }
  auto [address, stub] = Stub();
  std::unique_ptr<grpc::ClientReaderWriter<ckptd::v1::Heartbeat, ckptd::v1::HeartbeatAck>> stream =
      stub->Heartbeats(&ctx);
  absl::Status why = absl::OkStatus();
  while (true) {
    ckptd::v1::Heartbeat hb;
    fill_(&hb);
    hb.set_node_id(options_.node_id);
    hb.set_session(session);
    ckptd::v1::HeartbeatAck ack;
    {
      // A cut-off that began while the heartbeat was filled: send nothing.
      absl::MutexLock l(&mu_);
      if (CutOffLocked()) {
        why = absl::UnavailableError("cut off for a drill");
        break;
      }
    }
    if (!stream->Write(hb) || !stream->Read(&ack)) break;
    {
      // A deposed leader's answer (its orders included) is not acted on.
      absl::MutexLock l(&mu_);
      if (!AcceptEpoch(ack.coordinator_epoch(), address)) {
        session_.reset();
        moved_ |= targets_->Observe(address, grpc::Status(grpc::StatusCode::UNAVAILABLE, "a deposed leader"));
        why = absl::UnavailableError(absl::StrCat("a deposed leader (epoch ", ack.coordinator_epoch(), ")"));
        break;
      }
    }
    if (options_.on_ack) options_.on_ack(ack);
    absl::Duration interval;
    {
      absl::MutexLock l(&mu_);
      if (!ack.known()) {
        session_.reset();
        why = absl::NotFoundError("the coordinator does not know this session");
        break;
      }
      last_error_ = absl::OkStatus();  // answered
      for (const auto& s : ack.schedules()) schedules_[s.job()] = s;
      interval = interval_;
    }
    {
      // Sleeps until the next beat, or until stopping or cut off (a cut-off
      // that began since `now` ends later than it).
      absl::MutexLock l(&mu_);
      const absl::Time now = clock_->Now();
      auto wake = [this, now]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || cut_until_ > now; };
      clock_->AwaitWithDeadline(&mu_, absl::Condition(&wake), now + interval);
      if (stopping_) break;
      if (CutOffLocked()) {
        why = absl::UnavailableError("cut off for a drill");
        break;
      }
    }
  }
  {
    // A cut-off that cancelled the stream under a Write or Read.
    absl::MutexLock l(&mu_);
    if (why.ok() && !stopping_ && CutOffLocked()) why = absl::UnavailableError("cut off for a drill");
  }
  if (absl::IsUnavailable(why)) {
    // Cut off: the stream is dropped, not closed politely.
    ctx.TryCancel();
  } else {
    stream->WritesDone();
  }
  const grpc::Status finished = stream->Finish();
  {
    absl::MutexLock l(&mu_);
    stream_context_ = nullptr;
  }
  if (why.ok() && !finished.ok()) Follow(address, ctx, finished);
  if (!why.ok()) return why;
  return finished.ok() ? absl::UnavailableError("heartbeat stream ended") : rpc::FromGrpcStatus(finished);
}

void CoordinatorLink::HeartbeatLoop() {
  base::SetCallingThreadName("ckptd-heartbeat");
  absl::Duration backoff = absl::Milliseconds(100);
  absl::Status last = absl::OkStatus();
  while (true) {
    std::optional<std::string> session;
    {
      absl::MutexLock l(&mu_);
      // A drill: silent until the cut-off ends (or is lifted or changed).
      while (!stopping_ && CutOffLocked()) {
        const absl::Time until = cut_until_;
        auto wake = [this, until]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || cut_until_ != until; };
        clock_->AwaitWithDeadline(&mu_, absl::Condition(&wake), until);
        backoff = absl::Milliseconds(100);
      }
      if (stopping_) return;
      session = session_;
    }
    absl::Status s = session ? StreamHeartbeats(*session) : Register();
    {
      absl::MutexLock l(&mu_);
      if (!s.ok() && !stopping_) {
        last_error_ = s;
      } else if (!session && s.ok()) {
        last_error_ = absl::OkStatus();
      }
    }
    if (!session && s.ok()) {
      logger_->Info(absl::StrCat("registered with coordinator ", targets_->Current().address, " as node ",
                                 options_.node_id));
      backoff = absl::Milliseconds(100);
      continue;
    }
    if (!s.ok() && s.code() != last.code()) {
      logger_->Warning(absl::StrCat("coordinator ", targets_->Describe(), ": ", s.message()));
    }
    last = s;
    if (absl::IsNotFound(s)) continue;  // register again at once
    {
      // Moved to the leader a standby named (or the next replica): at once.
      absl::MutexLock l(&mu_);
      if (std::exchange(moved_, false)) {
        backoff = absl::Milliseconds(100);
        continue;
      }
    }
    if (!SleepUnlessStopping(backoff)) return;
    backoff = std::min(2 * backoff, options_.max_backoff);
  }
}

void CoordinatorLink::SenderLoop() {
  base::SetCallingThreadName("ckptd-report");
  while (true) {
    std::vector<ckptd::v1::ShardReport> shards;
    std::vector<ckptd::v1::ReportFailureRequest> failures;
    std::string session;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || send_wake_; };
      clock_->AwaitWithTimeout(&mu_, absl::Condition(&ready), absl::Milliseconds(500));
      send_wake_ = false;
      if (stopping_) return;
      if (!session_ || CutOffLocked()) continue;
      session = *session_;
      for (const auto& [key, report] : shards_) shards.push_back(report);
      failures.swap(failures_);
      sending_failures_ = !failures.empty();
    }
    std::vector<ckptd::v1::ReportFailureRequest> keep;
    for (ckptd::v1::ReportFailureRequest& f : failures) {
      f.set_node_id(options_.node_id);
      f.set_session(session);
      grpc::ClientContext ctx;
      Prepare(&ctx, options_.rpc_timeout);
      ckptd::v1::ReportFailureResponse resp;
      auto [address, stub] = Stub();
      const grpc::Status answer = stub->ReportFailure(&ctx, f, &resp);
      Follow(address, ctx, answer);
      const absl::Status s = rpc::FromGrpcStatus(answer);
      if (Transient(s) || absl::IsNotFound(s)) keep.push_back(f);
      if (!s.ok() && !Transient(s) && !absl::IsNotFound(s)) {
        logger_->Warning(absl::StrCat("coordinator refused a failure report: ", s.message()));
      }
    }
    // The node's ranks usually finish a step together: one call carries them.
    for (size_t begin = 0; begin < shards.size(); begin += kMaxBatch) {
      const size_t end = std::min(shards.size(), begin + kMaxBatch);
      ckptd::v1::ReportShardRequest req;
      req.set_node_id(options_.node_id);
      req.set_session(session);
      for (size_t i = begin; i < end; ++i) *req.add_batch() = shards[i];
      grpc::ClientContext ctx;
      Prepare(&ctx, options_.rpc_timeout);
      ckptd::v1::ReportShardResponse resp;
      auto [address, stub] = Stub();
      const grpc::Status answer = stub->ReportShard(&ctx, req, &resp);
      if (!answer.ok()) Follow(address, ctx, answer);
      const absl::Status s = rpc::FromGrpcStatus(answer);
      // The coordinator is away (or forgot us): keep the rest for later.
      if (Transient(s) || absl::IsNotFound(s)) break;
      absl::MutexLock l(&mu_);
      for (size_t i = begin; i < end; ++i) {
        const ckptd::v1::ShardReport& report = shards[i];
        const size_t k = i - begin;
        absl::Status result = s;
        if (s.ok() && k < static_cast<size_t>(resp.batch_results_size())) {
          result = absl::Status(static_cast<absl::StatusCode>(resp.batch_results(k).code()),
                                resp.batch_results(k).message());
        }
        if (Transient(result)) continue;  // sent again later
        if (!result.ok()) {
          logger_->Warning(absl::StrCat("shard ", report.shard().rank(), " of ", report.job(), " step ", report.step(), " not committed: ", result.message()));
        } else if (!report.emergency()) {
          auto& kept = answered_[{report.job(), report.shard().rank()}];
          if (kept.job().empty() || kept.step() <= report.step()) kept = report;
        }
        shards_.erase(ShardKey(report.job(), report.step(), report.shard().rank()));
      }
    }
    absl::MutexLock l(&mu_);
    failures_.insert(failures_.begin(), keep.begin(), keep.end());
    sending_failures_ = false;
  }
}

}  // namespace ckptd::agent
