// The ckptd-coordinator binary run by a test: spawned with its output in a
// file, waited for, signalled and reaped. CKPTD_COORDINATOR_BINARY names it.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "base/testing/eventually.h"
#include "base/testing/http_get.h"
#include "base/testing/spawned_process.h"

namespace ckptd::coordinator::testing {

using ::ckptd::testing::HttpGet;
using ::ckptd::testing::NumberAfter;
using ::ckptd::testing::ReadAll;
using ::ckptd::testing::SpawnedProcess;

// One run of ckptd-coordinator (CKPTD_COORDINATOR_BINARY).
class CoordinatorProcess {
 public:
  // Any binary, run the same way: an agent or ckptctl beside the coordinators.
  using Spawned = SpawnedProcess;

  CoordinatorProcess(std::vector<std::string> args, std::string log) : process_(WithBinary(std::move(args)), log) {}

  pid_t pid() const { return process_.pid(); }
  // Sends `sig` (SIGKILL, SIGSTOP, SIGCONT, ...) to the process.
  void Signal(int sig) {
    if (pid() > 0) ::kill(pid(), sig);
  }
  std::string Log() const { return process_.Log(); }

  // Waits for "listening on 127.0.0.1:<port>"; 0 when the process ended or
  // it took too long.
  int WaitForPort() {
    int port = 0;
    (void)::ckptd::testing::Eventually(
        [&] {
          const std::string log = Log();
          if (std::optional<int> p = NumberAfter(log, "ckptd-coordinator: listening on 127.0.0.1:");
              p && log.find('\n', log.find("listening on")) != std::string::npos) {
            metrics_port_ = NumberAfter(log, "metrics on http://127.0.0.1:").value_or(0);
            port = *p;
            return true;
          }
          return Exited(absl::ZeroDuration());
        },
        absl::Seconds(60), absl::Milliseconds(20));
    return port;
  }
  int metrics_port() const { return metrics_port_; }

  // Whether the process ended within `wait`; its exit code then in exit_code().
  bool Exited(absl::Duration wait) { return process_.Wait(wait) >= 0; }
  int exit_code() { return process_.Wait(absl::ZeroDuration()); }

  // SIGTERM, then the exit code (-1 if it did not stop within 30 s).
  int Stop() {
    Signal(SIGTERM);
    return process_.Wait(absl::Seconds(30));
  }

 private:
  static std::vector<std::string> WithBinary(std::vector<std::string> args) {
    args.insert(args.begin(), CKPTD_COORDINATOR_BINARY);
    return args;
  }

  SpawnedProcess process_;
  int metrics_port_ = 0;
};

}  // namespace ckptd::coordinator::testing
