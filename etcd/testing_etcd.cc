#include "etcd/testing_etcd.h"

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/testing/env.h"

extern char** environ;

namespace ckptd::etcd::testing {
namespace {

// A port in 20000-29999 (below Linux's ephemeral range, where outgoing
// connections take theirs) that binds on 127.0.0.1 now.
int FreePort(std::set<int>* taken) {
  static std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> dist(20000, 29999);
  for (;;) {
    const int port = dist(rng);
    if (taken->count(port) > 0) continue;
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) continue;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (ok) {
      taken->insert(port);
      return port;
    }
  }
}

bool Accepts(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

std::string Tail(const std::string& path, size_t bytes) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > bytes ? s.substr(s.size() - bytes) : s;
}

}  // namespace

bool EtcdRequired() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(int members, absl::Duration timeout) {
  std::string binary = ckptd::testing::FindOnPath("etcd");
  if (binary.empty() && ::access("/usr/bin/etcd", X_OK) == 0) binary = "/usr/bin/etcd";
  if (binary.empty()) {
    return absl::NotFoundError("no etcd on $PATH (Debian: apt-get install etcd-server etcd-client)");
  }
  std::unique_ptr<EtcdCluster> c(new EtcdCluster());
  c->binary_ = binary;
  c->dir_ = std::make_unique<ckptd::testing::TempDir>("ckptd_etcd_");
  std::set<int> taken;
  std::vector<std::string> peers;
  for (int i = 0; i < members; ++i) {
    Member m;
    m.name = absl::StrCat("m", i);
    m.client_port = FreePort(&taken);
    m.peer_port = FreePort(&taken);
    peers.push_back(absl::StrCat(m.name, "=http://127.0.0.1:", m.peer_port));
    c->members_.push_back(m);
  }
  c->initial_cluster_ = absl::StrJoin(peers, ",");
  for (int i = 0; i < members; ++i) {
    if (absl::Status s = c->Spawn(i, /*fresh=*/true); !s.ok()) return s;
  }
  for (int i = 0; i < members; ++i) {
    if (absl::Status s = c->WaitHealthy(i, timeout); !s.ok()) return s;
  }
  return c;
}

EtcdCluster::~EtcdCluster() {
  for (Member& m : members_) {
    if (m.pid > 0) {
      ::kill(m.pid, SIGCONT);
      ::kill(m.pid, SIGKILL);
      ::waitpid(m.pid, nullptr, 0);
      m.pid = -1;
    }
  }
}

std::string EtcdCluster::endpoint(int i) const { return absl::StrCat("127.0.0.1:", members_[i].client_port); }

std::string EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (int i = 0; i < size(); ++i) out.push_back(endpoint(i));
  return absl::StrJoin(out, ",");
}

std::string EtcdCluster::log(int i) const { return dir_->Sub(absl::StrCat(members_[i].name, ".log")); }

absl::Status EtcdCluster::Spawn(int i, bool fresh) {
  Member& m = members_[i];
  const std::string client = absl::StrCat("http://127.0.0.1:", m.client_port);
  const std::string peer = absl::StrCat("http://127.0.0.1:", m.peer_port);
  std::vector<std::string> args = {binary_,
                                   "--name", m.name,
                                   "--data-dir", dir_->Sub(m.name),
                                   "--listen-client-urls", client,
                                   "--advertise-client-urls", client,
                                   "--listen-peer-urls", peer,
                                   "--initial-advertise-peer-urls", peer,
                                   "--initial-cluster", initial_cluster_,
                                   "--initial-cluster-state", fresh ? "new" : "existing",
                                   "--initial-cluster-token", dir_->path(),
                                   "--logger", "zap",
                                   "--log-outputs", "stderr"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log_path = log(i);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 2, 1);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, binary_.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return absl::InternalError(absl::StrCat("cannot start ", binary_, ": errno ", rc));
  m.pid = pid;
  return absl::OkStatus();
}

absl::Status EtcdCluster::WaitHealthy(int i, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (members_[i].pid > 0 && ::waitpid(members_[i].pid, &status, WNOHANG) == members_[i].pid) {
      return absl::InternalError(absl::StrCat("etcd member ", members_[i].name, " exited; its log ends:\n",
                                              Tail(log(i), 2000)));
    }
    if (Accepts(members_[i].client_port)) {
      const std::string cmd = absl::StrCat("ETCDCTL_API=3 etcdctl --command-timeout=2s --endpoints=", endpoint(i),
                                           " endpoint health >/dev/null 2>&1");
      if (std::system(cmd.c_str()) == 0) return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("etcd member ", members_[i].name, " not healthy after ",
                                                  absl::FormatDuration(timeout), "; its log ends:\n",
                                                  Tail(log(i), 2000)));
}

absl::Status EtcdCluster::Kill(int i) {
  Member& m = members_[i];
  if (m.pid <= 0) return absl::FailedPreconditionError(absl::StrCat("member ", m.name, " is not running"));
  ::kill(m.pid, SIGCONT);
  ::kill(m.pid, SIGKILL);
  ::waitpid(m.pid, nullptr, 0);
  m.pid = -1;
  return absl::OkStatus();
}

absl::Status EtcdCluster::Restart(int i, bool wait_healthy) {
  if (members_[i].pid > 0) {
    if (absl::Status s = Kill(i); !s.ok()) return s;
  }
  if (absl::Status s = Spawn(i, /*fresh=*/false); !s.ok()) return s;
  if (wait_healthy) return WaitHealthy(i, absl::Seconds(30));
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    if (Accepts(members_[i].client_port)) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("etcd member ", members_[i].name, " does not listen"));
}

absl::Status EtcdCluster::Pause(int i) {
  if (members_[i].pid <= 0 || ::kill(members_[i].pid, SIGSTOP) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot pause member ", members_[i].name));
  }
  return absl::OkStatus();
}

absl::Status EtcdCluster::Resume(int i) {
  if (members_[i].pid <= 0 || ::kill(members_[i].pid, SIGCONT) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot resume member ", members_[i].name));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> EtcdCluster::Ctl(const std::string& args) const {
  const std::string cmd =
      absl::StrCat("ETCDCTL_API=3 etcdctl --command-timeout=5s --endpoints=", endpoints(), " ", args, " 2>&1");
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return absl::InternalError("cannot run etcdctl");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  if (rc != 0) return absl::UnknownError(absl::StrCat("etcdctl ", args, ": ", out));
  return out;
}

}  // namespace ckptd::etcd::testing
