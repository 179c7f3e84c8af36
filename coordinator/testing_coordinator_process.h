// The ckptd-coordinator binary run by a test: spawned with its output in a
// file, waited for, signalled and reaped. CKPTD_COORDINATOR_BINARY names it.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "base/testing/eventually.h"

extern char** environ;

namespace ckptd::coordinator::testing {

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The number after `prefix` in `text`, if any.
inline std::optional<int> NumberAfter(const std::string& text, const std::string& prefix) {
  const size_t at = text.find(prefix);
  if (at == std::string::npos) return std::nullopt;
  size_t end = at + prefix.size();
  while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
  int n = 0;
  if (!absl::SimpleAtoi(text.substr(at + prefix.size(), end - at - prefix.size()), &n)) return std::nullopt;
  return n;
}

// One run of the binary with stderr (and stdout) in a file.
class CoordinatorProcess {
 public:
  // Any binary (argv[0] its path), run the same way: an agent or ckptctl
  // beside the coordinators.
  class Spawned {
   public:
    Spawned(const std::vector<std::string>& argv, std::string log) : log_(std::move(log)) {
      std::vector<std::string> args = argv;
      std::vector<char*> cargv;
      for (std::string& a : args) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      posix_spawn_file_actions_t fa;
      posix_spawn_file_actions_init(&fa);
      posix_spawn_file_actions_addopen(&fa, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_adddup2(&fa, 2, 1);
      if (posix_spawn(&pid_, cargv[0], &fa, nullptr, cargv.data(), environ) != 0) pid_ = -1;
      posix_spawn_file_actions_destroy(&fa);
    }
    ~Spawned() {
      if (pid_ > 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
      }
    }
    std::string Log() const { return ReadAll(log_); }
    // The exit code once it ends within `wait` (128 + signal when killed);
    // -1 when it is still running.
    int Wait(absl::Duration wait) {
      int code = -1;
      (void)::ckptd::testing::Eventually(
          [&] {
            int status = 0;
            if (pid_ <= 0 || ::waitpid(pid_, &status, WNOHANG) != pid_) return false;
            pid_ = -1;
            code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            return true;
          },
          wait, absl::Milliseconds(20));
      return code;
    }

   private:
    std::string log_;
    pid_t pid_ = -1;
  };

  CoordinatorProcess(std::vector<std::string> args, std::string log) : log_(std::move(log)) {
    std::vector<std::string> argv = {CKPTD_COORDINATOR_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 2, 1);
    if (posix_spawn(&pid_, CKPTD_COORDINATOR_BINARY, &fa, nullptr, cargv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~CoordinatorProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGCONT);
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }
  // Sends `sig` (SIGKILL, SIGSTOP, SIGCONT, ...) to the process.
  void Signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  std::string Log() const { return ReadAll(log_); }

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
  bool Exited(absl::Duration wait) {
    if (pid_ <= 0) return true;
    return ::ckptd::testing::Eventually(
        [this] {
          int status = 0;
          if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
          pid_ = -1;
          exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          return true;
        },
        wait, absl::Milliseconds(10));
  }
  int exit_code() const { return exit_code_; }

  // SIGTERM, then the exit code (-1 if it did not stop within 30 s).
  int Stop() {
    if (pid_ > 0) ::kill(pid_, SIGTERM);
    return Exited(absl::Seconds(30)) ? exit_code_ : -1;
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  int exit_code_ = -1;
  int metrics_port_ = 0;
};


}  // namespace ckptd::coordinator::testing
