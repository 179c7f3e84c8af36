// The ckptd-coordinator binary run by a test: spawned with its output in a
// file, waited for, signalled and reaped. CKPTD_COORDINATOR_BINARY names it.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

// The whole answer (status line, headers, body) to an HTTP GET of `path`
// on 127.0.0.1:`port`; empty when nothing answered.
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return response;
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
    (void)::ckptd::testing::Eventually(
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
