// Fetch tickets: what lets one node fetch a rank's copy from another node's
// Peer service. The coordinator gives each agent a key of its own when it
// registers (RegisterAgentResponse.fetch_key), and a node it plans a
// restore for a ticket for each holder it names (PeerCopy.ticket): the
// HMAC-SHA256, under the holder's key, of the fetching node's id and the
// copy's job, rank and step. The holder serves a fetch only with the ticket
// its own key makes for that node and copy: only the nodes the coordinator
// knows as registered, and only the copies it planned for them.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace ckptd::rpc {

inline constexpr size_t kFetchTicketBytes = 32;

// The ticket (kFetchTicketBytes) that lets node `fetcher` fetch the copy of
// `job` rank `rank` step `step` from the node whose key is `key`.
std::string FetchTicket(absl::string_view key, absl::string_view fetcher, absl::string_view job, uint32_t rank,
                        uint64_t step);

// Whether `ticket` is FetchTicket(key, ...) (compared in constant time;
// false for an empty key).
bool FetchTicketValid(absl::string_view ticket, absl::string_view key, absl::string_view fetcher,
                      absl::string_view job, uint32_t rank, uint64_t step);

}  // namespace ckptd::rpc
