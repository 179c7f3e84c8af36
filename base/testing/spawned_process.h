// A binary run by a test: spawned with its output in a file, waited for,
// signalled and reaped (the daemons' main tests: the coordinator's, the
// agent's).
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
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "base/testing/eventually.h"

extern char** environ;

namespace ckptd::testing {

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

// A binary (argv[0] its path) run with stderr (and stdout) in a file, and
// killed (SIGCONT first, should it be stopped) when the object goes.
class SpawnedProcess {
 public:
  SpawnedProcess(const std::vector<std::string>& argv, std::string log) : log_(std::move(log)) {
    std::vector<std::string> args = argv;
    std::vector<char*> cargv;
    for (std::string& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 2, 1);
    if (posix_spawn(&pid_, cargv[0], &fa, nullptr, cargv.data(), environ) != 0) {
      pid_ = -1;
      exit_code_ = 127;  // as a shell says of a command it cannot run
    }
    posix_spawn_file_actions_destroy(&fa);
  }
  ~SpawnedProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGCONT);
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  SpawnedProcess(const SpawnedProcess&) = delete;
  SpawnedProcess& operator=(const SpawnedProcess&) = delete;

  pid_t pid() const { return pid_; }
  std::string Log() const { return ReadAll(log_); }
  // The exit code once it ends within `wait` (128 + signal when killed);
  // -1 when it is still running. After it ended, the same code again.
  int Wait(absl::Duration wait) {
    if (pid_ <= 0) return exit_code_;
    (void)Eventually(
        [&] {
          int status = 0;
          if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
          pid_ = -1;
          exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          return true;
        },
        wait, absl::Milliseconds(10));
    return pid_ > 0 ? -1 : exit_code_;
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  int exit_code_ = -1;
};

}  // namespace ckptd::testing
