// Peer replication over the network (proto/ckptd/v1/peer.proto): the Peer
// service an agent serves on TCP for its partners (copies in, copies out of
// its ReplicaStore), and the client side every agent uses to send its ranks'
// snapshots and to pull a copy back for a restore. Without TLS the bytes of a
// copy go over a data lane, a plain TCP connection the gRPC call opens, sent
// straight from the staging slot and received straight into the copy's
// memory; with TLS they stay on the gRPC streams.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/clock.h"
#include "base/logger.h"
#include "ckptd/v1/coordinator.pb.h"
#include "ckptd/v1/peer.grpc.pb.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "replication/peer_gate.h"
#include "replication/peer_network.h"
#include "replication/replica_store.h"
#include "rpc/tls.h"

namespace ckptd::replication {

struct PeerServiceOptions {
  std::string node_id;
  // The agent token every call must carry ("authorization: Bearer
  // <token>"); empty: none is asked (with `tls` the transport checks that
  // each peer presents a certificate of the cluster's CA; without either the
  // service is open, as the coordinator is with --insecure-agents).
  std::string agent_token;
  // With TLS the copies' bytes stay on the encrypted gRPC streams: no data
  // lane is served. And the caller's certificate must be a node's: its
  // subject names this organizational unit (rpc::kNodeCertificateUnit;
  // empty: any certificate of the CA).
  bool tls = false;
  std::string tls_node_unit = rpc::kNodeCertificateUnit;
  base::Logger* logger = nullptr;
  // Reads the time for the data lane's nonces and handshakes, and its
  // listener's pause after a failed accept.
  base::Clock* clock = nullptr;
  // Times the fetches served (fetch_stall and the time a copy's size
  // allows); nullptr: the real clock.
  base::Clock* fetch_clock = nullptr;
  // The data lane (proto/ckptd/v1/peer.proto): how long a nonce is good,
  // how long a connection may take to present it, how many connections may
  // be presenting one at a time (the longest waiting is closed for a new
  // one), how many lanes may be open or in use together (OpenPut and
  // OpenFetch answer kUnavailable beyond), and how long a lane connection may
  // move no byte before it is closed.
  absl::Duration lane_ttl = absl::Seconds(30);
  absl::Duration handshake_timeout = absl::Seconds(5);
  size_t max_handshakes = 64;
  size_t max_lanes = 64;
  absl::Duration lane_io_timeout = absl::Seconds(30);
  // The gate on the Peer port (with agent_token and without TLS,
  // peer_gate.h): how long a connection may take to present the token, and
  // how many may be presenting it at a time (the longest waiting is closed
  // for a new one).
  absl::Duration preamble_timeout = absl::Seconds(10);
  size_t max_preambles = 64;
  // Fetches served (FetchReplica, and the data lanes OpenFetch opens): one
  // is cut when the fetching node takes no piece for fetch_stall, or has not
  // taken the copy within fetch_stall plus its size at
  // fetch_min_bytes_per_second (half the rate below which a fetching
  // GrpcPeerNetwork gives up by default: no fetch its fetcher still waits
  // for is cut). At most max_fetches (at least 1) are served or open at a
  // time; more are refused with kResourceExhausted. A fetch holds its copy
  // in memory, counted in the budget even once the store dropped it. (A
  // replacement node pulls all the lost node's ranks at once, often from one
  // partner: room for the largest nodes.)
  absl::Duration fetch_stall = absl::Seconds(10);
  double fetch_min_bytes_per_second = 25e6;
  size_t max_fetches = 64;
};

// What the data lane did, since the service started.
struct PeerLaneStats {
  uint64_t opened = 0;       // lanes handed out (OpenPut, OpenFetch)
  uint64_t kept = 0;         // copies received whole and kept
  uint64_t dropped = 0;      // copies that did not arrive whole, or that the sender said were not valid
  uint64_t sent = 0;         // copies sent to a fetching node
  uint64_t refused = 0;      // connections closed for a wrong, used or expired nonce
  uint64_t idle_closed = 0;  // connections closed before presenting a nonce (timeout, or crowded out)
  uint64_t expired = 0;      // lanes never used in time
};

// The fetches served, over the gRPC stream and the data lane.
struct PeerFetchStats {
  uint64_t in_flight = 0;  // being served, or a lane open for one (at most max_fetches)
  uint64_t refused = 0;    // refused for max_fetches, since the service started
  uint64_t cut = 0;        // cut for a fetching node that stalled or was too slow, since then
};

class PeerService final : public ckptd::v1::Peer::Service {
 public:
  PeerService(ReplicaStore* store, PeerServiceOptions options);
  // Stops the data lane: connections in use are cut, open lanes dropped.
  // REQUIRES: the gRPC server serving this is shut down.
  ~PeerService() override;

  // The nodes that send copies here and their tickets (the coordinator's
  // HeartbeatAck.receive_from): a copy is taken only from one of them, with
  // its ticket. Replaces the previous set.
  void SetSenders(const google::protobuf::RepeatedPtrField<ckptd::v1::ReplicationPartner>& senders);
  // The key of this node's registration with the coordinator
  // (RegisterAgentResponse.fetch_key): from then on a fetch is served only
  // with the ticket it makes for the fetching node and the copy
  // (rpc/fetch_ticket.h). Before a key is set (no coordinator: tests and
  // benchmarks; an agent not yet registered holds no copy) none is asked.
  void SetFetchKey(std::string key);

  // Serves the data lane on `host` (an address of this machine, as in
  // --peer-listen; empty: every interface) and `port` (0: any free one), and
  // returns the port bound. Until then OpenPut and OpenFetch answer
  // kUnimplemented (partners then use PutReplica and FetchReplica).
  // kFailedPrecondition with TLS or when already serving; kUnavailable
  // naming the address when it cannot be bound.
  absl::StatusOr<int> StartDataLane(const std::string& host, int port);
  PeerLaneStats lane_stats() const;
  PeerFetchStats fetch_stats() const;
  const PeerServiceOptions& options() const { return options_; }

  grpc::Status PutReplica(grpc::ServerContext* ctx, grpc::ServerReader<ckptd::v1::ReplicaPiece>* reader,
                          ckptd::v1::PutReplicaResponse* response) override;
  grpc::Status FetchReplica(grpc::ServerContext* ctx, const ckptd::v1::FetchReplicaRequest* request,
                            grpc::ServerWriter<ckptd::v1::ReplicaPiece>* writer) override;
  grpc::Status OpenPut(grpc::ServerContext* ctx, const ckptd::v1::ReplicaHeader* header,
                       ckptd::v1::DataLane* lane) override;
  grpc::Status OpenFetch(grpc::ServerContext* ctx, const ckptd::v1::FetchReplicaRequest* request,
                         ckptd::v1::DataLane* lane) override;

 private:
  class Lanes;      // the data lane (peer_service.cc)
  class FetchSlot;  // one of max_fetches, while held (peer_service.cc)

  // The call's credential (see PeerServiceOptions::agent_token).
  absl::Status CheckCaller(const grpc::ServerContext& ctx, absl::string_view rpc) const;
  // Whether `request` may fetch: the node it names is the caller's (with
  // TLS, a name of its certificate) and its ticket is this node's for it.
  // CheckFetcher logs a refusal.
  absl::Status CheckFetcher(const grpc::ServerContext& ctx, const ckptd::v1::FetchReplicaRequest& request,
                            absl::string_view rpc) const;
  absl::Status FetcherAllowed(const grpc::ServerContext& ctx, const ckptd::v1::FetchReplicaRequest& request,
                              absl::string_view rpc) const;
  // Whether `header` comes from a partner sending here, with its ticket.
  absl::Status CheckSender(const ckptd::v1::ReplicaHeader& header, absl::string_view rpc);
  absl::Status Receive(grpc::ServerReader<ckptd::v1::ReplicaPiece>* reader, ckptd::v1::PutReplicaResponse* response);
  // One of options_.max_fetches for the fetch `fetcher` asks of `rpc`, or
  // kResourceExhausted naming the limit.
  absl::StatusOr<std::unique_ptr<FetchSlot>> TakeFetchSlot(absl::string_view rpc, absl::string_view fetcher);

  ReplicaStore* const store_;
  const PeerServiceOptions options_;
  base::Logger* const logger_;
  base::Clock* const fetch_clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> tickets_ ABSL_GUARDED_BY(mu_);  // by sending node
  std::string fetch_key_ ABSL_GUARDED_BY(mu_);                       // SetFetchKey
  std::unique_ptr<Lanes> lanes_ ABSL_GUARDED_BY(mu_);                // null until StartDataLane
  // A leaf: taken under the lanes' lock when a lane goes.
  mutable absl::Mutex fetch_mu_;
  PeerFetchStats fetch_stats_ ABSL_GUARDED_BY(fetch_mu_);
};

// The Peer service's server: gRPC, and with an agent token but no TLS the
// gate in front of it (peer_gate.h), so that no caller without the token
// gets a byte read past the gate's preamble.
class PeerServer {
 public:
  PeerServer(std::unique_ptr<grpc::Server> server, std::unique_ptr<PeerGate> gate);
  ~PeerServer();  // Shutdown()
  PeerServer(const PeerServer&) = delete;
  PeerServer& operator=(const PeerServer&) = delete;

  // Takes no more connections, then shuts gRPC down (waiting for the calls
  // under way, as grpc::Server::Shutdown does).
  void Shutdown();
  bool gated() const { return gate_ != nullptr; }
  PeerGateStats gate_stats() const;  // zeros without a gate

 private:
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<PeerGate> gate_;
};

// Serves `service` on `listen` (host:port; port 0 picks one) with
// `credentials` (insecure when null; then, when the service has an agent
// token, behind a PeerGate with its preamble_timeout and max_preambles).
// kUnavailable naming the address when it cannot be bound. `*port` receives
// the port bound.
absl::StatusOr<std::unique_ptr<PeerServer>> StartPeerServer(const std::string& listen, PeerService* service,
                                                           std::shared_ptr<grpc::ServerCredentials> credentials,
                                                           int* port);

struct GrpcPeerNetworkOptions {
  std::string node_id;
  // TLS credentials, or null: insecure, and the copies' bytes go over the
  // partner's data lane (plain TCP) when it serves one.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Sent with every call, and without TLS first on every connection, to the
  // partner's PeerGate. Empty: none sent.
  std::string agent_token;
  // Each call's deadline: `base` plus the time its bytes take at `min_rate`.
  // A fetch over the gRPC stream learns its size from the first piece: it
  // has `base` for that piece, then the deadline for the size from there.
  // A stream that moves no piece for `base` is cut (kUnavailable) sooner;
  // on the data lane that is lane_io_timeout.
  absl::Duration base_deadline = absl::Seconds(10);
  double min_bytes_per_second = 50e6;
  // The data lane: connecting, and the longest a send or receive may wait.
  absl::Duration lane_connect_timeout = absl::Seconds(10);
  absl::Duration lane_io_timeout = absl::Seconds(30);
  // Times the copies sent and fetched: the cut of a partner that stalls,
  // and the data lane's deadlines (connecting included); the gRPC calls'
  // own deadlines stay on real time. nullptr: the real clock.
  base::Clock* clock = nullptr;
};

// How the copies went (each call once, by the path its bytes took).
struct PeerNetworkStats {
  uint64_t lane_puts = 0, stream_puts = 0;
  uint64_t lane_fetches = 0, stream_fetches = 0;
};

class GrpcPeerNetwork final : public PeerNetwork {
 public:
  explicit GrpcPeerNetwork(GrpcPeerNetworkOptions options);
  absl::Status Put(const std::string& address, const ckptd::v1::ReplicaHeader& header,
                   const PieceSource& source) override;
  absl::StatusOr<ckptd::v1::ReplicaHeader> Fetch(const std::string& address, const ckptd::v1::ReplicaKey& key,
                                                 const std::string& ticket, const ReplicaSink& sink) override;
  PeerNetworkStats stats() const;

 private:
  ckptd::v1::Peer::Stub* StubFor(const std::string& address);
  // Partners are reached through their PeerGate: an agent token, no TLS.
  bool ThroughGate() const { return options_.credentials == nullptr && !options_.agent_token.empty(); }
  // A finished call's status; a refusal by the partner's gate said as such.
  absl::Status FromCall(const grpc::Status& status, const std::string& address) const;
  // The time a call moving `bytes` may take (GrpcPeerNetworkOptions).
  absl::Duration AllowedFor(uint64_t bytes) const;
  // A deadline of AllowedFor(bytes) from now, and Authorize.
  void Prepare(grpc::ClientContext* ctx, uint64_t bytes) const;
  // The agent token, when there is one.
  void Authorize(grpc::ClientContext* ctx) const;
  // The bytes over the data lane; `*no_lane` set when the partner serves
  // none or `address` is not host:port (nothing was sent then).
  absl::Status PutOverLane(const std::string& address, const ckptd::v1::ReplicaHeader& header,
                           const PieceSource& source, bool* no_lane);
  absl::Status PutOverStream(const std::string& address, const ckptd::v1::ReplicaHeader& header,
                             const PieceSource& source);
  absl::StatusOr<ckptd::v1::ReplicaHeader> FetchOverLane(const std::string& address, const ckptd::v1::ReplicaKey& key,
                                                         const std::string& ticket, const ReplicaSink& sink,
                                                         bool* no_lane);
  absl::StatusOr<ckptd::v1::ReplicaHeader> FetchOverStream(const std::string& address, const ckptd::v1::ReplicaKey& key,
                                                           const std::string& ticket, const ReplicaSink& sink);

  const GrpcPeerNetworkOptions options_;
  base::Clock* const clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<ckptd::v1::Peer::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  PeerNetworkStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd::replication
