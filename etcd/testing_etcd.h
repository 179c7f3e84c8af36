// A real etcd for tests: Debian's etcd-server started by the test itself,
// one member or a cluster on loopback, each in a temporary directory with
// free ports, killed and removed when the object goes. Members can be
// killed, paused (SIGSTOP) and started again on their data.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/testing/temp_dir.h"

namespace ckptd::etcd::testing {

class EtcdCluster {
 public:
  // Starts `members` members and waits until the cluster answers.
  // kNotFound when no etcd binary is on $PATH (the test skips, or fails
  // under CI=true: see CKPTD_START_ETCD_OR_SKIP).
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(int members, absl::Duration timeout = absl::Seconds(30));
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  // "127.0.0.1:PORT" of member i, and of all, comma-separated.
  std::string endpoint(int i) const;
  std::string endpoints() const;

  // SIGKILLs member i and reaps it.
  absl::Status Kill(int i);
  // Starts member i again on its data directory and ports; waits until it
  // answers (with `wait_healthy`, until it is part of a quorum).
  absl::Status Restart(int i, bool wait_healthy = true);
  // SIGSTOP / SIGCONT of member i.
  absl::Status Pause(int i);
  absl::Status Resume(int i);
  // Runs etcdctl against the cluster with `args`; its output.
  absl::StatusOr<std::string> Ctl(const std::string& args) const;
  // Member i's log file.
  std::string log(int i) const;

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
  };
  EtcdCluster() = default;
  absl::Status Spawn(int i, bool fresh);
  absl::Status WaitHealthy(int i, absl::Duration timeout) const;

  std::unique_ptr<ckptd::testing::TempDir> dir_;
  std::string binary_;
  std::vector<Member> members_;
  std::string initial_cluster_;
};

// Whether the tests must fail rather than skip when etcd is missing (CI=true).
bool EtcdRequired();

}  // namespace ckptd::etcd::testing

// In a test body: starts `var` (a std::unique_ptr<EtcdCluster>) with `n`
// members, skipping the test when etcd is not installed (failing under CI).
#define CKPTD_START_ETCD_OR_SKIP(var, n)                                                        \
  std::unique_ptr<::ckptd::etcd::testing::EtcdCluster> var;                                    \
  do {                                                                                         \
    auto started_ = ::ckptd::etcd::testing::EtcdCluster::Start(n);                              \
    if (!started_.ok()) {                                                                      \
      if (absl::IsNotFound(started_.status()) && !::ckptd::etcd::testing::EtcdRequired()) {    \
        GTEST_SKIP() << started_.status();                                                     \
      }                                                                                        \
      FAIL() << started_.status();                                                             \
    }                                                                                          \
    var = std::move(*started_);                                                                \
  } while (0)
