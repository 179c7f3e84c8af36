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
#include "grpcpp/security/server_credentials.h"

namespace ckptd::agent {

// What --help prints, and what follows a usage error.
extern const char kAgentUsage[];

// Peer replication: --peer-listen and what goes with it.
struct PeerFlags {
  std::string listen;      // --peer-listen host:port (port 0: any)
  std::string listen_host;  // its host (brackets removed; empty: every interface)
  // Without TLS, the data lane's port on that host (--peer-data-port;
  // default --peer-listen's port + 1; 0: any free one, when that port is 0).
  // Unused with TLS.
  uint16_t data_port = 0;
  std::string advertise;   // --peer-address; empty: the host name and the port bound
  uint32_t replicas = 1;   // --replicas
  std::string failure_domain;  // --failure-domain
  double max_bytes_per_second = 0;  // --replication-gbps / 8 * 1e9; 0: no cap
  // With --tls-*: the Peer service asks partners for a certificate of the
  // same CA (all three files needed); null: insecure.
  std::shared_ptr<grpc::ServerCredentials> server_credentials;
};

// What ckptd-agent's command line asks for.
struct AgentFlags {
  // --help: print kAgentUsage and exit; nothing else below is set.
  bool help = false;
  // --socket: the Unix socket to serve on.
  std::string socket;
  // --storage-root, --staging-budget, --slots, --keep, --threads,
  // --trainer-group (as a gid), --local-cache, --local-cache-keep,
  // --background-priority, --compression, and --node-id when there is a
  // coordinator. main() sets `coordinator` and `local_fs`.
  AgentOptions options;
  // --cpu-set: the CPUs the agent's threads run on, sorted, each one this
  // process may use; empty: every one it may use (main() pins nothing).
  std::vector<int> cpu_set;
  // With --coordinator: its address, --node-id (default: the host name), the
  // host name, the agent token from --agent-token-file and TLS credentials
  // from --tls-ca/--tls-cert/--tls-key (both read here), and --allow-drills.
  // main() sets `on_ack`.
  std::optional<CoordinatorLinkOptions> link;
  // --inject-write-latency; zero when not given.
  absl::Duration inject_write_latency = absl::ZeroDuration();
  // --allow-drills.
  bool allow_drills = false;
  // --shutdown-grace: how long the persists under way at SIGTERM may take
  // (AgentCore::BeginShutdown).
  absl::Duration shutdown_grace = absl::Seconds(25);
  // With --peer-listen (which needs --coordinator).
  std::optional<PeerFlags> peer;
  // --metrics-listen: serve /metrics, /healthz and /readyz on this
  // host:port (port 0: any free one); nullopt: no metrics endpoint.
  std::optional<std::string> metrics_listen;
};

// Parses `args` (the command line without the program name) and validates
// it. Every error is a usage error whose message names the bad flag (main()
// prints it before the usage text and exits base::kExitUsage): unknown flags,
// missing or malformed values, numbers outside the ranges kAgentUsage states
// (each parsed as 64 bits and checked before it is narrowed: nothing is
// truncated), a --coordinator port outside 1..65535, a --metrics-listen that is no host:port
// with a port 0..65535, flags that need another, a --trainer-group
// that names no group, a --local-cache that overlaps the storage root, a
// --cpu-set that names a CPU this process may not use (all
// kInvalidArgument), an --agent-token-file that cannot be read or holds no
// valid token (kInvalidArgument naming the flag), and TLS files that cannot be
// read (the code of rpc::ChannelCredentialsFromFiles).
absl::StatusOr<AgentFlags> ParseAgentFlags(const std::vector<std::string>& args);

}  // namespace ckptd::agent
