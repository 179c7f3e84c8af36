// ckptctl's online operator commands: status, checkpoint, list, restore-plan
// and online verify. They reach the coordinator through CoordinatorApi, so
// tests drive them with a fake; cli/remote.h has the gRPC implementation.
// docs/ckptctl.md describes the output and exit statuses. `status` is
// implemented in cli/status_command.cc.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/flags.h"
#include "ckptd/v1/coordinator.pb.h"
#include "storage/file_system.h"

namespace ckptd::cli {

// The coordinator's operator RPCs. Errors carry the code the coordinator
// answered with (kUnavailable / kDeadlineExceeded when it cannot be reached)
// and, in the real implementation, its address.
class CoordinatorApi {
 public:
  virtual ~CoordinatorApi() = default;

  virtual absl::StatusOr<ckptd::v1::GetClusterStatusResponse> ClusterStatus() = 0;
  virtual absl::StatusOr<ckptd::v1::ListEventsResponse> ListEvents(const ckptd::v1::ListEventsRequest& request) = 0;
  virtual absl::StatusOr<ckptd::v1::IntervalStatus> GetInterval(const ckptd::v1::GetIntervalRequest& request) = 0;
  // Needs the operator token.
  virtual absl::StatusOr<ckptd::v1::RequestCheckpointResponse> RequestCheckpoint(
      const ckptd::v1::RequestCheckpointRequest& request) = 0;
  virtual absl::StatusOr<ckptd::v1::ListStepsResponse> ListSteps(const ckptd::v1::ListStepsRequest& request) = 0;
  virtual absl::StatusOr<ckptd::v1::RestorePreview> GetRestorePreview(
      const ckptd::v1::RestorePreviewRequest& request) = 0;
  // Needs the operator token. Calls `on_progress` for every message of the
  // stream, the last included, and returns the last one (done() set); an
  // error when the stream fails or ends without a final message.
  virtual absl::StatusOr<ckptd::v1::VerifyProgress> VerifyStep(
      const ckptd::v1::VerifyStepRequest& request,
      const std::function<void(const ckptd::v1::VerifyProgress&)>& on_progress) = 0;
  // Needs the operator token.
  virtual absl::StatusOr<ckptd::v1::RunDrillResponse> RunDrill(const ckptd::v1::RunDrillRequest& request) = 0;
  virtual absl::StatusOr<ckptd::v1::DrillStatus> GetDrill(const ckptd::v1::GetDrillRequest& request) = 0;
};

// Makes the API for a command's flags (--coordinator, TLS, --token-file,
// --timeout); cli/remote.h: NewRemoteCoordinatorApi. kInvalidArgument for a
// bad flag.
using CoordinatorApiFactory = std::function<absl::StatusOr<std::unique_ptr<CoordinatorApi>>(const base::Args&)>;

// What the commands take from their surroundings, so that tests run the
// checkpoint poll on a fake clock.
struct OperatorEnv {
  std::function<absl::Time()> now = [] { return absl::Now(); };
  std::function<void(absl::Duration)> sleep = [](absl::Duration d) { absl::SleepFor(d); };
  // How often `checkpoint` asks for the steps while it waits.
  absl::Duration poll_interval = absl::Milliseconds(250);
};

// The operator token in `path`: the file's content without surrounding
// whitespace. kInvalidArgument naming the file when it cannot be read, is
// empty, longer than 4096 bytes, or holds anything but printable ASCII
// without spaces (what gRPC metadata carries).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// --timeout as a duration: "90s", "10m", "1h30m", or plain seconds ("600").
// Absent: std::nullopt. kInvalidArgument naming the flag unless positive.
absl::StatusOr<std::optional<absl::Duration>> TimeoutFlag(const base::Args& args);

// Every command returns a base::ExitCode (base/flags.h): 0 success, 1 the operation
// failed (no such job, a checkpoint aborted, a problem found, the token
// refused, a coordinator too old for the command), 2 usage error (naming the
// flag), 3 the coordinator cannot be reached (naming its address).

// ckptctl status --coordinator HOST:PORT [--job J] [--json]; see kStatusHelp.
int RunStatus(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
              std::ostream& err, const OperatorEnv& env = OperatorEnv());

// ckptctl checkpoint --job J --coordinator HOST:PORT --token-file F
// [--no-wait] [--timeout D] [--json]; see kCheckpointHelp. Exit 0 when the
// requested step (or a newer one that superseded it) committed.
int RunCheckpoint(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
                  std::ostream& err, const OperatorEnv& env = OperatorEnv());

// ckptctl list --job J --coordinator HOST:PORT [--json]; see kListHelp.
int RunList(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
            std::ostream& err, const OperatorEnv& env = OperatorEnv());

// ckptctl restore-plan --job J --coordinator HOST:PORT [--json]; see kRestorePlanHelp.
int RunRestorePlan(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
                   std::ostream& err, const OperatorEnv& env = OperatorEnv());

// ckptctl verify --job J [--step S] --coordinator HOST:PORT --token-file F
// [--timeout D] [--json]; see kOnlineVerifyHelp. Exit 0 when the step
// verified, 1 when a problem was found.
int RunOnlineVerify(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
                    std::ostream& err, const OperatorEnv& env = OperatorEnv());

// Whether `argv` (after "verify") names a coordinator (--coordinator), which
// makes it the online verify rather than the offline one over --root.
bool IsOnlineVerify(const std::vector<std::string>& argv);

// ckptctl verify: RunOnlineVerify when IsOnlineVerify(argv), otherwise the
// offline RunVerify (cli/offline_commands.h) on `fs`, unchanged. --root and
// --coordinator together are a usage error; a bare --help shows both.
int RunVerifyCommand(storage::FileSystem* fs, const std::vector<std::string>& argv, const CoordinatorApiFactory& api,
                     std::ostream& out, std::ostream& err);

extern const char kStatusHelp[];
extern const char kCheckpointHelp[];
extern const char kListHelp[];
extern const char kRestorePlanHelp[];
extern const char kOnlineVerifyHelp[];

}  // namespace ckptd::cli
