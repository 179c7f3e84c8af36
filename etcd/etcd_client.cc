#include "etcd/etcd_client.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/host_port.h"
#include "grpcpp/grpcpp.h"
#include "rpc/grpc_status.h"

namespace ckptd::etcd {

// One connection to a member and the stubs over it.
struct EtcdClient::Stubs {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Maintenance::Stub> maintenance;
  std::unique_ptr<pb::Auth::Stub> auth;
};

struct EtcdClient::Member {
  std::string endpoint;
  absl::Mutex mu;
  std::shared_ptr<const Stubs> stubs ABSL_GUARDED_BY(mu);
  // etcd's simple tokens are known only to the member that issued them.
  std::string token ABSL_GUARDED_BY(mu);

  std::shared_ptr<const Stubs> Get() {
    absl::MutexLock l(&mu);
    return stubs;
  }
};

absl::StatusOr<std::vector<std::string>> ParseEndpoints(absl::string_view list) {
  std::vector<std::string> out;
  for (absl::string_view entry : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    absl::string_view host_port = entry;
    if (!absl::ConsumePrefix(&host_port, "http://")) absl::ConsumePrefix(&host_port, "https://");
    absl::ConsumeSuffix(&host_port, "/");
    absl::StatusOr<std::pair<std::string, uint16_t>> parsed = base::ParseHostPort(host_port, base::PortUse::kConnect);
    if (!parsed.ok() || parsed->first.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint \"", entry, "\" is not host:port (e.g. etcd-0.example:2379)"));
    }
    out.emplace_back(host_port);
  }
  if (out.empty()) return absl::InvalidArgumentError("no etcd endpoint given (a list like h1:2379,h2:2379)");
  return out;
}

EtcdClient::EtcdClient(const EtcdOptions& options, std::vector<std::string> endpoints)
    : options_(options), endpoints_(std::move(endpoints)) {}

EtcdClient::~EtcdClient() = default;

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(const EtcdOptions& options) {
  std::vector<std::string> endpoints;
  bool https = false;
  for (const std::string& e : options.endpoints) {
    https = https || absl::StartsWith(e, "https://");
    absl::StatusOr<std::vector<std::string>> one = ParseEndpoints(e);
    if (!one.ok()) return one.status();
    endpoints.insert(endpoints.end(), one->begin(), one->end());
  }
  if (endpoints.empty()) return absl::InvalidArgumentError("no etcd endpoint given (a list like h1:2379,h2:2379)");
  if (options.user.empty() != options.password.empty()) {
    return absl::InvalidArgumentError("etcd authentication needs both a user and a password");
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.tls.ca.empty() || !options.tls.cert.empty() || !options.tls.key.empty() || https) {
    if (options.tls.ca.empty()) {
      return absl::InvalidArgumentError("etcd over TLS needs the CA that signs the members' certificates");
    }
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> tls = rpc::ChannelCredentialsFromFiles(options.tls);
    if (!tls.ok()) return tls.status();
    creds = *tls;
  }
  std::unique_ptr<EtcdClient> client(new EtcdClient(options, endpoints));
  client->creds_ = creds;
  for (const std::string& endpoint : client->endpoints_) {
    auto m = std::make_unique<Member>();
    m->endpoint = endpoint;
    {
      absl::MutexLock l(&m->mu);
      m->stubs = client->Dial(endpoint);
    }
    client->members_.push_back(std::move(m));
  }
  return client;
}

std::shared_ptr<const EtcdClient::Stubs> EtcdClient::Dial(const std::string& endpoint) const {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(options_.max_receive_bytes);
  // Each member its own connection, even to one address.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stubs = std::make_shared<Stubs>();
  stubs->channel = grpc::CreateCustomChannel(endpoint, creds_, args);
  stubs->kv = pb::KV::NewStub(stubs->channel);
  stubs->lease = pb::Lease::NewStub(stubs->channel);
  stubs->maintenance = pb::Maintenance::NewStub(stubs->channel);
  stubs->auth = pb::Auth::NewStub(stubs->channel);
  return stubs;
}

void EtcdClient::Redial(Member& member, const std::shared_ptr<const Stubs>& failed) {
  std::shared_ptr<const Stubs> fresh = Dial(member.endpoint);
  absl::MutexLock l(&member.mu);
  if (member.stubs == failed) member.stubs = std::move(fresh);
}

namespace {

// An answer after which the next member may do better.
bool TryAnother(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// A failure of the connection itself (or no answer at all), not an answer
// of etcd's.
bool ConnectionFailed(const grpc::Status& s) {
  return (s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) &&
         !absl::StartsWith(s.error_message(), "etcdserver:");
}

bool TokenRefused(const grpc::Status& s) {
  return absl::StrContains(s.error_message(), "invalid auth token") ||
         (s.error_code() == grpc::StatusCode::UNAUTHENTICATED && !absl::StrContains(s.error_message(), "password"));
}

}  // namespace

absl::StatusOr<std::string> EtcdClient::Token(Member& member, bool renew) {
  if (options_.user.empty()) return std::string();
  std::shared_ptr<const Stubs> stubs = member.Get();
  absl::MutexLock l(&member.mu);
  if (!member.token.empty() && !renew) return member.token;
  pb::AuthenticateRequest request;
  request.set_name(options_.user);
  request.set_password(options_.password);
  pb::AuthenticateResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.attempt_timeout));
  grpc::Status s = stubs->auth->Authenticate(&ctx, request, &response);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("etcd ", member.endpoint, ": authenticating as ", options_.user, ": ",
                                     s.error_message()));
  }
  member.token = response.token();
  return member.token;
}

template <typename Response, typename CallFn>
absl::StatusOr<Response> EtcdClient::Call(absl::string_view what, CallFn call) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Response> result = CallMembers<Response>(what, std::move(call));
  if (options_.on_call) options_.on_call(what, absl::Now() - start, result.status());
  return result;
}

template <typename Response, typename CallFn>
absl::StatusOr<Response> EtcdClient::CallMembers(absl::string_view what, CallFn call) {
  const size_t n = members_.size();
  const size_t first = preferred_.load(std::memory_order_relaxed) % n;
  std::vector<std::string> errors;
  grpc::Status last;
  for (size_t i = 0; i < n; ++i) {
    Member& m = *members_[(first + i) % n];
    for (int auth_try = 0; auth_try < 2; ++auth_try) {
      absl::StatusOr<std::string> token = Token(m, /*renew=*/auth_try > 0);
      if (!token.ok()) {
        if (!absl::IsUnavailable(token.status()) && !absl::IsDeadlineExceeded(token.status())) return token.status();
        last = grpc::Status(static_cast<grpc::StatusCode>(token.status().code()),
                            std::string(token.status().message()));
        break;
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.attempt_timeout));
      if (!token->empty()) ctx.AddMetadata("token", *token);
      Response response;
      std::shared_ptr<const Stubs> stubs = m.Get();
      last = call(*stubs, &ctx, &response);
      // A connection that failed is not reused: a fresh one finds a member
      // that came back at once (gRPC's own reconnection, after attempts
      // that met a member still starting, can stay failed for long).
      if (ConnectionFailed(last)) Redial(m, stubs);
      if (last.ok()) {
        preferred_.store((first + i) % n, std::memory_order_relaxed);
        return response;
      }
      if (!token->empty() && TokenRefused(last) && auth_try == 0) continue;
      break;
    }
    errors.push_back(absl::StrCat("etcd ", m.endpoint, ": ", what, ": ", last.error_message()));
    if (!TryAnother(last)) break;
  }
  return absl::Status(static_cast<absl::StatusCode>(last.error_code()), absl::StrJoin(errors, "; "));
}

absl::StatusOr<pb::RangeResponse> EtcdClient::Range(const pb::RangeRequest& request) {
  return Call<pb::RangeResponse>("Range", [&](const Stubs& m, grpc::ClientContext* ctx, pb::RangeResponse* r) {
    return m.kv->Range(ctx, request, r);
  });
}

namespace {
template <typename Request>
absl::Status CheckSize(const Request& request, absl::string_view what) {
  if (request.ByteSizeLong() > kMaxRequestBytes) {
    return absl::InvalidArgumentError(absl::StrCat("etcd ", what, " of ", request.ByteSizeLong(),
                                                   " bytes is over etcd's request limit of ", kMaxRequestBytes));
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<pb::PutResponse> EtcdClient::Put(const pb::PutRequest& request) {
  if (absl::Status s = CheckSize(request, "Put"); !s.ok()) return s;
  return Call<pb::PutResponse>(
      "Put", [&](const Stubs& m, grpc::ClientContext* ctx, pb::PutResponse* r) { return m.kv->Put(ctx, request, r); });
}

absl::StatusOr<pb::DeleteRangeResponse> EtcdClient::DeleteRange(const pb::DeleteRangeRequest& request) {
  return Call<pb::DeleteRangeResponse>("DeleteRange",
                                       [&](const Stubs& m, grpc::ClientContext* ctx, pb::DeleteRangeResponse* r) {
                                         return m.kv->DeleteRange(ctx, request, r);
                                       });
}

absl::StatusOr<pb::TxnResponse> EtcdClient::Txn(const pb::TxnRequest& request) {
  if (absl::Status s = CheckSize(request, "Txn"); !s.ok()) return s;
  return Call<pb::TxnResponse>(
      "Txn", [&](const Stubs& m, grpc::ClientContext* ctx, pb::TxnResponse* r) { return m.kv->Txn(ctx, request, r); });
}

absl::Status EtcdClient::Compact(int64_t revision) {
  pb::CompactionRequest request;
  request.set_revision(revision);
  absl::StatusOr<pb::CompactionResponse> r = Call<pb::CompactionResponse>(
      "Compact",
      [&](const Stubs& m, grpc::ClientContext* ctx, pb::CompactionResponse* out) { return m.kv->Compact(ctx, request, out); });
  if (!r.ok() && absl::StrContains(r.status().message(), "required revision has been compacted")) {
    return absl::OkStatus();
  }
  return r.status();
}

absl::StatusOr<pb::LeaseGrantResponse> EtcdClient::LeaseGrant(int64_t ttl_seconds) {
  pb::LeaseGrantRequest request;
  request.set_ttl(ttl_seconds);
  absl::StatusOr<pb::LeaseGrantResponse> r = Call<pb::LeaseGrantResponse>(
      "LeaseGrant", [&](const Stubs& m, grpc::ClientContext* ctx, pb::LeaseGrantResponse* out) {
        return m.lease->LeaseGrant(ctx, request, out);
      });
  if (r.ok() && !r->error().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd LeaseGrant: ", r->error()));
  }
  return r;
}

absl::StatusOr<int64_t> EtcdClient::LeaseKeepAliveOnce(int64_t lease) {
  pb::LeaseKeepAliveRequest request;
  request.set_id(lease);
  absl::StatusOr<pb::LeaseKeepAliveResponse> r = Call<pb::LeaseKeepAliveResponse>(
      "LeaseKeepAlive", [&](const Stubs& m, grpc::ClientContext* ctx, pb::LeaseKeepAliveResponse* out) {
        std::unique_ptr<grpc::ClientReaderWriter<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>> stream =
            m.lease->LeaseKeepAlive(ctx);
        if (!stream->Write(request) || !stream->Read(out)) {
          stream->WritesDone();
          grpc::Status s = stream->Finish();
          return s.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the keep-alive stream closed") : s;
        }
        stream->WritesDone();
        ctx->TryCancel();
        (void)stream->Finish();
        return grpc::Status::OK;
      });
  if (!r.ok()) return r.status();
  if (r->ttl() <= 0) return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " has expired or was revoked"));
  return r->ttl();
}

absl::Status EtcdClient::LeaseRevoke(int64_t lease) {
  pb::LeaseRevokeRequest request;
  request.set_id(lease);
  absl::StatusOr<pb::LeaseRevokeResponse> r = Call<pb::LeaseRevokeResponse>(
      "LeaseRevoke", [&](const Stubs& m, grpc::ClientContext* ctx, pb::LeaseRevokeResponse* out) {
        return m.lease->LeaseRevoke(ctx, request, out);
      });
  if (!r.ok() && absl::IsNotFound(r.status())) return absl::OkStatus();
  return r.status();
}

absl::StatusOr<pb::StatusResponse> EtcdClient::MemberStatus(size_t index) {
  if (index >= members_.size()) return absl::OutOfRangeError(absl::StrCat("no etcd member ", index));
  Member& m = *members_[index];
  absl::StatusOr<std::string> token = Token(m, false);
  std::shared_ptr<const Stubs> stubs = m.Get();
  if (!token.ok()) return token.status();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.attempt_timeout));
  if (!token->empty()) ctx.AddMetadata("token", *token);
  pb::StatusResponse response;
  grpc::Status s = stubs->maintenance->Status(&ctx, pb::StatusRequest(), &response);
  if (ConnectionFailed(s)) Redial(m, stubs);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("etcd ", m.endpoint, ": Status: ", s.error_message()));
  }
  return response;
}

std::string PrefixEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

pb::Compare CreateRevisionIs(absl::string_view key, int64_t revision) {
  pb::Compare c;
  c.set_key(std::string(key));
  c.set_target(pb::Compare::CREATE);
  c.set_result(pb::Compare::EQUAL);
  c.set_create_revision(revision);
  return c;
}

pb::RequestOp PutOp(absl::string_view key, absl::string_view value, int64_t lease) {
  pb::RequestOp op;
  pb::PutRequest* put = op.mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  put->set_lease(lease);
  return op;
}

pb::RequestOp DeleteOp(absl::string_view key, absl::string_view range_end) {
  pb::RequestOp op;
  pb::DeleteRangeRequest* del = op.mutable_request_delete_range();
  del->set_key(std::string(key));
  del->set_range_end(std::string(range_end));
  return op;
}

pb::RequestOp RangeOp(absl::string_view key, absl::string_view range_end) {
  pb::RequestOp op;
  pb::RangeRequest* range = op.mutable_request_range();
  range->set_key(std::string(key));
  range->set_range_end(std::string(range_end));
  return op;
}

}  // namespace ckptd::etcd
