// ckptctl's connection to a live coordinator: the flags every online command
// takes (--coordinator host:port and mutual TLS), the channel, and the calls.
// Kept apart from the offline commands so that those link no gRPC.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/flags.h"
#include "ckptd/v1/coordinator.grpc.pb.h"
#include "cli/operator_commands.h"
#include "rpc/coordinator_targets.h"

namespace ckptd::cli {

// The coordinator(s) named by --coordinator (host:port, or replicas as
// host:port,host:port,...: calls follow their leader), over mutual TLS when
// --tls-ca, --tls-cert and --tls-key are all given. kInvalidArgument naming
// the flag when one is missing or malformed, or a file cannot be read.
absl::StatusOr<std::unique_ptr<rpc::CoordinatorTargets>> ConnectCoordinators(const base::Args& args);

// GetInterval for `job`. kUnavailable (or kDeadlineExceeded) when the
// coordinator cannot be reached, with its address in the message.
absl::StatusOr<ckptd::v1::IntervalStatus> FetchInterval(const base::Args& args, const std::string& job);

// CoordinatorApi over gRPC to the coordinator named by --coordinator (TLS as
// ConnectCoordinator). Unary calls have a 10 s deadline; VerifyStep has none
// unless --timeout is given. RequestCheckpoint and VerifyStep carry the token
// of --token-file as "authorization: Bearer <token>" (the others carry none).
// Errors name the coordinator's address. kInvalidArgument naming the flag
// when a TLS or token file cannot be read or --timeout is malformed.
absl::StatusOr<std::unique_ptr<CoordinatorApi>> NewRemoteCoordinatorApi(const base::Args& args);

// The exit status for a failed call: base::kExitUnavailable when the coordinator
// could not be reached, base::kExitUsage for a request it refused as malformed,
// base::kExitFailed otherwise.
int ExitCodeFor(const absl::Status& status);

}  // namespace ckptd::cli
