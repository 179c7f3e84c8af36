// A client of etcd's v3 gRPC API (KV, transactions, leases, maintenance),
// generated from etcd's own .proto files, for the coordinator's replicated
// state and leader election. It speaks to a list of members: a call that
// finds its member unreachable, without a quorum, or too slow moves on to
// the next one, once round the list, inside the call's deadline; the member
// that answered is used first for the calls that follow.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb.h"
#include "rpc/tls.h"

namespace ckptd::etcd {

namespace pb = ::etcdserverpb;

struct EtcdOptions {
  // Members as host:port (an http:// or https:// in front is accepted and
  // dropped; https:// asks for TLS like `tls.ca` does).
  std::vector<std::string> endpoints;
  // Each attempt of a call on one member; a call tries each member once.
  absl::Duration attempt_timeout = absl::Seconds(1);
  // TLS to the members: `tls.ca` verifies them; `tls.cert` and `tls.key`
  // (together) are this client's certificate for members that require one
  // (--client-cert-auth). All empty: plaintext.
  rpc::TlsFiles tls;
  // etcd's own authentication (--auth): a user and its password, exchanged
  // for a token that is renewed when etcd says it expired.
  std::string user;
  std::string password;
  // Largest answer accepted from etcd.
  int max_receive_bytes = 64 << 20;
  // Told of every call when it ends (its name, "Txn", "Range", "LeaseKeepAlive",
  // ...; the time it took, failover to other members included; its result),
  // from the calling thread. Must not call the client. Null: nothing told.
  std::function<void(absl::string_view call, absl::Duration took, const absl::Status& result)> on_call = nullptr;
};

// Parses a comma-separated member list ("h1:2379,h2:2379" or with
// http(s):// in front). kInvalidArgument naming the entry that is not a
// host:port, or an empty list.
absl::StatusOr<std::vector<std::string>> ParseEndpoints(absl::string_view list);

// etcd's largest request with its default --max-request-bytes (1.5 MiB); a
// write the client would send above it is refused before it is sent.
inline constexpr size_t kMaxRequestBytes = 1536 * 1024;
// etcd's default --max-txn-ops: operations in one transaction, at most.
inline constexpr int kMaxTxnOps = 128;

class EtcdClient {  // thread-safe
 public:
  // Builds the channels (connections open on first use). kInvalidArgument for
  // an empty or malformed endpoint list, or TLS files that do not read.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(const EtcdOptions& options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // The KV service. Errors name the member and the call ("etcd
  // 127.0.0.1:2379: Txn: etcdserver: request timed out"), with gRPC's code
  // (kUnavailable for no member reachable or no quorum, kDeadlineExceeded,
  // kPermissionDenied / kUnauthenticated for etcd's auth). Every call is
  // retried on the next member when one fails unavailable or late, so a
  // write may apply twice: callers write idempotent operations.
  absl::StatusOr<pb::RangeResponse> Range(const pb::RangeRequest& request);
  absl::StatusOr<pb::PutResponse> Put(const pb::PutRequest& request);
  absl::StatusOr<pb::DeleteRangeResponse> DeleteRange(const pb::DeleteRangeRequest& request);
  absl::StatusOr<pb::TxnResponse> Txn(const pb::TxnRequest& request);
  // Compacts the history below `revision` (kOk when it already is).
  absl::Status Compact(int64_t revision);

  // Leases.
  absl::StatusOr<pb::LeaseGrantResponse> LeaseGrant(int64_t ttl_seconds);
  // One keep-alive round: the lease's TTL from now, in seconds; kNotFound
  // when the lease expired or was revoked.
  absl::StatusOr<int64_t> LeaseKeepAliveOnce(int64_t lease);
  absl::Status LeaseRevoke(int64_t lease);

  // The Maintenance status of member `index` of the endpoint list (its
  // raft leader, revision, database size), without moving on to another.
  absl::StatusOr<pb::StatusResponse> MemberStatus(size_t index);

  const std::vector<std::string>& endpoints() const { return endpoints_; }

 private:
  struct Stubs;
  struct Member;
  explicit EtcdClient(const EtcdOptions& options, std::vector<std::string> endpoints);

  // Runs `call` on the preferred member, then on each other once while the
  // answer is unavailable or late; (re)authenticates when etcd's auth is on.
  template <typename Response, typename Call>
  absl::StatusOr<Response> Call(absl::string_view what, Call call);
  // The same without telling `on_call`.
  template <typename Response, typename Call>
  absl::StatusOr<Response> CallMembers(absl::string_view what, Call call);
  // A token for `member` from etcd's Authenticate (with user and password).
  absl::StatusOr<std::string> Token(Member& member, bool renew);

  std::shared_ptr<const Stubs> Dial(const std::string& endpoint) const;
  // Replaces `member`'s connection by a fresh one unless another call did.
  void Redial(Member& member, const std::shared_ptr<const Stubs>& failed);

  const EtcdOptions options_;
  std::shared_ptr<grpc::ChannelCredentials> creds_;
  const std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<Member>> members_;
  std::atomic<size_t> preferred_{0};
};

// Helpers that build requests.
// The end of the range of every key starting with `prefix`.
std::string PrefixEnd(absl::string_view prefix);
// A comparison of `key`'s create_revision with `revision` (equal).
pb::Compare CreateRevisionIs(absl::string_view key, int64_t revision);
pb::RequestOp PutOp(absl::string_view key, absl::string_view value, int64_t lease = 0);
pb::RequestOp DeleteOp(absl::string_view key, absl::string_view range_end = {});
pb::RequestOp RangeOp(absl::string_view key, absl::string_view range_end = {});

}  // namespace ckptd::etcd
