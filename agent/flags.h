// ckptd-agent's command line: its usage text, and the parsing and validation
// that turn the flags into the agent's options (AgentOptions, the coordinator
// link's options, the testing and drill switches). Nothing here creates a
// directory or starts a thread; main() does that with what this returns.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/agent_core.h"
#include "agent/coordinator_link.h"

namespace ckptd::agent {

// What --help prints, and what follows a usage error.
extern const char kAgentUsage[];

// What ckptd-agent's command line asks for.
struct AgentFlags {
  // --help: print kAgentUsage and exit; nothing else below is set.
  bool help = false;
  // --socket: the Unix socket to serve on.
  std::string socket;
  // --storage-root, --staging-budget, --slots, --keep, --threads,
  // --trainer-group (as a gid), --local-cache, --local-cache-keep, and
  // --node-id when there is a coordinator. main() sets `coordinator` and
  // `local_fs`.
  AgentOptions options;
  // With --coordinator: its address, --node-id (default: the host name), the
  // host name, the agent token from --agent-token-file and TLS credentials
  // from --tls-ca/--tls-cert/--tls-key (both read here), and --allow-drills.
  // main() sets `on_ack`.
  std::optional<CoordinatorLinkOptions> link;
  // --inject-write-latency; zero when not given.
  absl::Duration inject_write_latency = absl::ZeroDuration();
  // --allow-drills.
  bool allow_drills = false;
};

// Parses `args` (the command line without the program name) and validates
// it. Every error is a usage error whose message names the bad flag (main()
// prints it before the usage text and exits base::kExitUsage): unknown flags,
// missing or malformed values, numbers outside the ranges kAgentUsage states
// (each parsed as 64 bits and checked before it is narrowed: nothing is
// truncated), a --coordinator port outside 1..65535, flags that need another, a --trainer-group
// that names no group, a --local-cache that overlaps the storage root (both
// kInvalidArgument), an --agent-token-file that cannot be read or holds no
// valid token (kInvalidArgument naming the flag), and TLS files that cannot be
// read (the code of rpc::ChannelCredentialsFromFiles).
absl::StatusOr<AgentFlags> ParseAgentFlags(const std::vector<std::string>& args);

}  // namespace ckptd::agent
