// What the peer replication tests share: copies' bytes for a sender.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "replication/peer_service.h"

namespace ckptd::replication {

// Pieces of `fill`, of any copy size (the same memory each time).
inline PieceSource FilledSource(uint8_t fill) {
  auto piece = std::make_shared<std::vector<uint8_t>>(kReplicaPieceBytes, fill);
  PieceSource s;
  s.piece = [piece](uint64_t, uint64_t length) {
    return absl::StatusOr<absl::Span<const uint8_t>>(absl::Span<const uint8_t>(piece->data(), length));
  };
  return s;
}

}  // namespace ckptd::replication
