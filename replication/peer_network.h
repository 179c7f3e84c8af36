// What a peer transfer needs of the network, free of gRPC: the sender's
// source of a copy's bytes, the fetcher's sink, and the PeerNetwork client
// interface. GrpcPeerNetwork (peer_service.h) implements it over gRPC and
// the data lane; tests stand in for it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ckptd/v1/coordinator.pb.h"
#include "ckptd/v1/peer.pb.h"

namespace ckptd::replication {

// Bytes of snapshot data per message (and per send on the data lane).
inline constexpr uint64_t kReplicaPieceBytes = uint64_t{4} << 20;

// What a sender sends: the copy's bytes, read in place piece by piece.
struct PieceSource {
  // The `length` bytes (at most kReplicaPieceBytes) of the copy at
  // `offset`, or an error that ends the copy. Pieces are asked for in order;
  // the view is read (handed to the kernel, or copied into a message)
  // before `still_valid` and the next call.
  std::function<absl::StatusOr<absl::Span<const uint8_t>>(uint64_t offset, uint64_t length)> piece;
  // Called once the bytes of each piece were read: an error (kAborted when
  // they may have changed while they were read) ends the copy, and the
  // partner does not keep it. Null: the bytes never change.
  std::function<absl::Status()> still_valid;
};
// What a fetcher makes of the header of a copy: where its data_bytes go
// (exactly that long), or an error that ends the fetch.
using ReplicaSink = std::function<absl::StatusOr<absl::Span<uint8_t>>(const ckptd::v1::ReplicaHeader& header)>;

// The client side (an interface, so that tests can stand in for the network).
class PeerNetwork {
 public:
  virtual ~PeerNetwork() = default;
  // Sends the copy `header` describes (ticket set) to the agent at `address`.
  virtual absl::Status Put(const std::string& address, const ckptd::v1::ReplicaHeader& header,
                           const PieceSource& source) = 0;
  // Pulls the copy of `key` from the agent at `address` into what `sink`
  // says, presenting `ticket` (the restore plan's PeerCopy.ticket); returns
  // its header. kNotFound when the agent holds no such copy.
  virtual absl::StatusOr<ckptd::v1::ReplicaHeader> Fetch(const std::string& address, const ckptd::v1::ReplicaKey& key,
                                                         const std::string& ticket, const ReplicaSink& sink) = 0;
};

}  // namespace ckptd::replication
