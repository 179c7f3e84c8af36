// The names of ckptd.v1.RestoreSource that trainers, ckptctl, /metrics and
// logs show. Header-only, like schedule.h: the client library links nothing
// of the coordinator.
#pragma once

#include "absl/strings/string_view.h"
#include "ckptd/v1/coordinator.pb.h"

namespace ckptd::protocol {

// "memory", "peer", "node-local", "storage-root"; "" when unspecified or
// unknown.
inline absl::string_view RestoreSourceName(ckptd::v1::RestoreSource source) {
  switch (source) {
    case ckptd::v1::AGENT_MEMORY: return "memory";
    case ckptd::v1::PEER_MEMORY: return "peer";
    case ckptd::v1::NODE_LOCAL: return "node-local";
    case ckptd::v1::STORAGE_ROOT: return "storage-root";
    default: return "";
  }
}

// The ranks of a restore that read its step resharded (docs/elastic.md).
inline int ReshardedRanks(const ckptd::v1::RestoreSummary& r) {
  int n = 0;
  for (const auto& rank : r.ranks()) n += rank.resharded() ? 1 : 0;
  return n;
}

}  // namespace ckptd::protocol
