#include "base/testing/users.h"

#include <grp.h>
#include <dirent.h>
#include <pwd.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <type_traits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ckptd::testing {

static_assert(std::is_same_v<gid_t, uint32_t>, "TestUser::groups is passed to setgroups as it is");

std::vector<uint32_t> UnusedIds(size_t n) {
  std::vector<uint32_t> ids;
  for (uint32_t id = 61000; id < 62000 && ids.size() < n; ++id) {
    if (::getpwuid(id) == nullptr && ::getgrgid(id) == nullptr) ids.push_back(id);
  }
  return ids;
}

std::string BecomeUser(const TestUser& user) {
  if (user.groups.empty() || ::setgroups(user.groups.size(), user.groups.data()) != 0 ||
      ::setgid(user.groups[0]) != 0 || ::setuid(user.uid) != 0) {
    return absl::StrCat("cannot become uid ", user.uid, ": ", std::strerror(errno));
  }
  return "";
}

std::string RunInChild(const std::function<std::string()>& fn) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return "pipe failed";
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    return "fork failed";
  }
  if (child == 0) {
    ::close(pipe_fds[0]);
    const std::string out = fn();
    (void)!::write(pipe_fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status)) {
    return absl::StrCat(out, " (child died", WIFSIGNALED(status) ? absl::StrCat(" of signal ", WTERMSIG(status)) : "",
                        ")");
  }
  return out;
}

std::string RunAs(const TestUser& user, const std::function<std::string()>& fn) {
  return RunInChild([&] {
    const std::string became = BecomeUser(user);
    return became.empty() ? fn() : became;
  });
}

size_t TasksOfUser(uint32_t uid) {
  size_t tasks = 0;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return 0;
  while (dirent* e = ::readdir(proc)) {
    uint32_t pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    // "Uid:\t<real>\t<effective>..." comes before "Threads:\t<n>".
    std::ifstream status(absl::StrCat("/proc/", e->d_name, "/status"));
    std::string line;
    bool ours = false;
    while (std::getline(status, line)) {
      const std::vector<std::string> fields = absl::StrSplit(line, '\t', absl::SkipEmpty());
      if (fields.size() < 2) continue;
      uint32_t n = 0;
      if (fields[0] == "Uid:") ours = absl::SimpleAtoi(fields[1], &n) && n == uid;
      if (fields[0] == "Threads:" && ours && absl::SimpleAtoi(fields[1], &n)) tasks += n;
    }
  }
  ::closedir(proc);
  return tasks;
}

std::string LimitNewThreads(size_t more) {
  if (::geteuid() == 0) return "root is exempt from RLIMIT_NPROC";
  const size_t now = TasksOfUser(::getuid());
  if (now == 0) return "the tasks of this user cannot be counted in /proc";
  const rlimit limit{now + more, now + more};
  if (::setrlimit(RLIMIT_NPROC, &limit) != 0) return absl::StrCat("setrlimit RLIMIT_NPROC: ", std::strerror(errno));
  return "";
}

}  // namespace ckptd::testing
