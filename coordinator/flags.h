// ckptd-coordinator's command line: its usage text, and the parsing and
// validation that turn the flags into CoordinatorOptions and the addresses,
// directories and files the binary serves and reads. Nothing here opens a
// file or a socket; main() does that with what this returns.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/coordinator_core.h"
#include "rpc/tls.h"

namespace ckptd::coordinator {

// What --help prints, and what follows a usage error.
extern const char kCoordinatorUsage[];

// What ckptd-coordinator's command line asks for.
struct CoordinatorFlags {
  // --help: print kCoordinatorUsage and exit; nothing else below is set.
  bool help = false;
  std::string listen;                              // --listen
  std::string storage_root;                        // --storage-root
  std::string state_dir;                           // --state-dir
  std::optional<std::string> metrics_listen;       // --metrics-listen
  std::optional<std::string> operator_token_file;  // --operator-token-file
  std::optional<std::string> agent_token_file;     // --agent-token-file
  bool insecure_agents = false;                    // --insecure-agents (excludes --agent-token-file)
  // --audit-log: the file audit records are appended to (JSON lines); main()
  // opens it. Without it the records are log lines only.
  std::optional<std::string> audit_log;
  // --tls-cert, --tls-key and --tls-ca (all three or none); main() reads them.
  std::optional<rpc::TlsFiles> tls;
  // Replicated coordinators (--etcd-endpoints): state in etcd, a leader
  // elected through it; the others stand by.
  struct Etcd {
    std::vector<std::string> endpoints;  // --etcd-endpoints
    std::string prefix = "/ckptd/default";  // --etcd-prefix
    rpc::TlsFiles tls;                   // --etcd-ca, --etcd-cert, --etcd-key
    std::string user;                    // --etcd-user
    std::string password_file;           // --etcd-password-file
    std::string import_state;            // --import-state: a --state-dir to move into etcd
    int64_t lease_ttl_seconds = 3;       // --etcd-lease-ttl
    std::string advertise;               // --advertise (default from --listen and the host name)
  };
  std::optional<Etcd> etcd;
  // The durations, intervals, policy settings and --keep; retention_in_tick
  // is false (the service removes old steps on a thread of its own).
  CoordinatorOptions options;
};

// Parses `args` (the command line without the program name) and validates
// it. kInvalidArgument with a message naming the bad flag (main() prints it
// before the usage text and exits base::kExitUsage): unknown flags, missing
// required flags, stray arguments, malformed or out-of-range values (each
// number and duration checked against the range kCoordinatorUsage states
// before it is narrowed; --listen and --metrics-listen with ports 0..65535),
// and flags that exclude or need each other.
absl::StatusOr<CoordinatorFlags> ParseCoordinatorFlags(const std::vector<std::string>& args);

}  // namespace ckptd::coordinator
