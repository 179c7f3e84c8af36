#include "base/agent_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/matchers.h"
#include "base/testing/temp_dir.h"
#include "base/testing/users.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::base {
namespace {

using ::ckptd::testing::IsOk;
using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Sets an environment variable for one scope, then puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value == nullptr) {
      ::unsetenv(name);
    } else {
      ::setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// A listening Unix socket at `path` (what an agent, or whoever took the
// name, leaves in the file system).
int Listen(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 1) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A uid that is neither this process's nor root's, when this process may
// give files to it (root); else nullopt.
std::optional<uid_t> OtherUid(const std::string& probe_dir) {
  const std::vector<uint32_t> ids = ckptd::testing::UnusedIds(1);
  if (ids.empty()) return std::nullopt;
  const std::string probe = probe_dir + "/chown-probe";
  std::ofstream(probe) << "x";
  const bool ok = ::chown(probe.c_str(), ids[0], static_cast<gid_t>(-1)) == 0;
  ::unlink(probe.c_str());
  if (!ok) return std::nullopt;
  return ids[0];
}

TEST(DefaultAgentSocketTest, RootUsesRunCkptdOthersTheirRuntimeDirectory) {
  if (::geteuid() == 0) {
    ScopedEnv xdg("XDG_RUNTIME_DIR", "/run/user/4242");
    EXPECT_THAT(DefaultAgentSocket(), IsOkAndHolds(std::string("/run/ckptd/agent.sock")));
    return;
  }
  {
    ScopedEnv xdg("XDG_RUNTIME_DIR", "/run/user/4242");
    EXPECT_THAT(DefaultAgentSocket(), IsOkAndHolds(std::string("/run/user/4242/ckptd/agent.sock")));
  }
  ScopedEnv xdg("XDG_RUNTIME_DIR", nullptr);
  EXPECT_THAT(DefaultAgentSocket(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pass --socket")));
}

TEST(DefaultTrainerSocketTest, TheEnvironmentThenTheUsersOwnAgentThenTheNodes) {
  ckptd::testing::TempDir dir("ckptd-xdg-");
  ScopedEnv xdg("XDG_RUNTIME_DIR", dir.path().c_str());
  {
    ScopedEnv env(kSocketEnv, "/somewhere/agent.sock");
    EXPECT_EQ(DefaultTrainerSocket(), "/somewhere/agent.sock");
  }
  ScopedEnv env(kSocketEnv, nullptr);
  EXPECT_EQ(DefaultTrainerSocket(), "/run/ckptd/agent.sock");  // the user runs no agent of their own
  ASSERT_EQ(::mkdir(dir.Sub("ckptd").c_str(), 0700), 0);
  const int fd = Listen(dir.Sub("ckptd/agent.sock"));
  ASSERT_GE(fd, 0);
  EXPECT_EQ(DefaultTrainerSocket(), dir.Sub("ckptd/agent.sock"));
  ::close(fd);
}

TEST(ParseUidListTest, NumbersAndNames) {
  EXPECT_THAT(ParseUidList("0, 1001,root", "X"), IsOkAndHolds(ElementsAre(0u, 1001u, 0u)));
  EXPECT_THAT(ParseUidList("", "X"), IsOkAndHolds(ElementsAre()));
  EXPECT_THAT(ParseUidList("no-such-user-ckptd", kTrustedAgentUidsEnv),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("CKPTD_TRUSTED_AGENT_UIDS: \"no-such-user-ckptd\" is neither a uid nor a user")));
  EXPECT_THAT(ParseUidList("4294967295", "X"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a uid")));
  EXPECT_THAT(ParseUidList("4294967296", "X"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4294967296")));
}

TEST(PrepareAgentSocketDirTest, APrivateDirectoryIsTakenAMissingOneMade) {
  ckptd::testing::TempDir tmp("ckptd-sockdir-");
  ASSERT_EQ(::chmod(tmp.path().c_str(), 0755), 0);
  EXPECT_THAT(PrepareAgentSocketDir(tmp.Sub("agent.sock"), ::geteuid(), nullptr), IsOk());
  // The last component is made, owner-only; with a trainers' group, they
  // may pass through it to the socket.
  EXPECT_THAT(PrepareAgentSocketDir(tmp.Sub("own/agent.sock"), ::geteuid(), nullptr), IsOk());
  struct stat st;
  ASSERT_EQ(::stat(tmp.Sub("own").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  const gid_t gid = ::getegid();
  EXPECT_THAT(PrepareAgentSocketDir(tmp.Sub("group/agent.sock"), ::geteuid(), &gid), IsOk());
  ASSERT_EQ(::stat(tmp.Sub("group").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0710u);
  EXPECT_EQ(st.st_gid, gid);
  // A missing parent is not made.
  EXPECT_THAT(PrepareAgentSocketDir(tmp.Sub("a/b/agent.sock"), ::geteuid(), nullptr),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(tmp.Sub("a/b"))));
  std::ofstream(tmp.Sub("file")) << "x";
  EXPECT_THAT(PrepareAgentSocketDir(tmp.Sub("file/agent.sock"), ::geteuid(), nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a directory")));
}

// The attack: in a directory every user may write to (as /tmp), another user
// takes the socket's name before the agent starts.
TEST(PrepareAgentSocketDirTest, ADirectoryOthersMayWriteIsRefused) {
  ckptd::testing::TempDir tmp("ckptd-sockdir-");
  const std::string sock = tmp.Sub("agent.sock");
  for (mode_t mode : {0777, 0775, 0757}) {
    ASSERT_EQ(::chmod(tmp.path().c_str(), mode), 0);
    EXPECT_THAT(PrepareAgentSocketDir(sock, ::geteuid(), nullptr),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr(absl::StrCat("the socket's directory ", tmp.path(), " (owner uid ", ::geteuid()))))
        << std::oct << mode;
    EXPECT_THAT(PrepareAgentSocketDir(sock, ::geteuid(), nullptr),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("may be written by other users")));
  }
  // Sticky and the agent's own: only the agent (and root) may remove or
  // replace what it made there.
  ASSERT_EQ(::chmod(tmp.path().c_str(), 01777), 0);
  EXPECT_THAT(PrepareAgentSocketDir(sock, ::geteuid(), nullptr), IsOk());

  const std::optional<uid_t> other = OtherUid(tmp.path());
  if (!other) GTEST_SKIP() << "not root: cannot give a directory to another user";
  // Sticky but another user's (as /tmp is root's to an agent of a user):
  // that user could take the name first.
  ASSERT_EQ(::chown(tmp.path().c_str(), *other, static_cast<gid_t>(-1)), 0);
  EXPECT_THAT(PrepareAgentSocketDir(sock, ::geteuid() == 0 ? 4242 : ::geteuid(), nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("belongs to another user")));
  ASSERT_EQ(::chmod(tmp.path().c_str(), 0755), 0);
  EXPECT_THAT(PrepareAgentSocketDir(sock, ::geteuid() == 0 ? 4242 : ::geteuid(), nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(absl::StrCat("(owner uid ", *other, ", mode 0755) belongs to another user"))));
  ASSERT_EQ(::chown(tmp.path().c_str(), 0, static_cast<gid_t>(-1)), 0);
}

TEST(ResolveTrustedAgentSocketTest, TheUsersOwnSocketIsTaken) {
  ckptd::testing::TempDir tmp("ckptd-sock-");
  const std::string sock = tmp.Sub("agent.sock");
  EXPECT_THAT(ResolveTrustedAgentSocket(sock, ::geteuid(), {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no agent's socket at " + sock)));
  std::ofstream(tmp.Sub("file")) << "x";
  EXPECT_THAT(ResolveTrustedAgentSocket(tmp.Sub("file"), ::geteuid(), {}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is not a socket")));
  const int fd = Listen(sock);
  ASSERT_GE(fd, 0);
  EXPECT_THAT(ResolveTrustedAgentSocket(sock, ::geteuid(), {}), IsOkAndHolds(sock));
  // Through a link of the user's own: the socket's real name.
  ASSERT_EQ(::symlink(sock.c_str(), tmp.Sub("link").c_str()), 0);
  EXPECT_THAT(ResolveTrustedAgentSocket(tmp.Sub("link"), ::geteuid(), {}), IsOkAndHolds(sock));
  // In a directory anyone may write to and that is not sticky, anyone
  // could replace it between the check and the connection.
  ASSERT_EQ(::chmod(tmp.path().c_str(), 0777), 0);
  EXPECT_THAT(ResolveTrustedAgentSocket(sock, ::geteuid(), {}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("which other users may write and which is not "
                                                                      "sticky")));
  ASSERT_EQ(::chmod(tmp.path().c_str(), 01777), 0);
  EXPECT_THAT(ResolveTrustedAgentSocket(sock, ::geteuid(), {}), IsOkAndHolds(sock));
  ::close(fd);
}

// The attack: another user serves on the socket's name. The trainer refuses
// it, naming the owner, unless told that this user runs the node's agent.
TEST(ResolveTrustedAgentSocketTest, AnotherUsersSocketIsRefusedUnlessTrusted) {
  ckptd::testing::TempDir tmp("ckptd-sock-");
  ASSERT_EQ(::chmod(tmp.path().c_str(), 01777), 0);  // as /tmp
  const std::optional<uid_t> other = OtherUid(tmp.path());
  if (!other) GTEST_SKIP() << "not root: cannot give a socket to another user";
  const std::string sock = tmp.Sub("agent.sock");
  const int fd = Listen(sock);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::chown(sock.c_str(), *other, static_cast<gid_t>(-1)), 0);
  // The trainer's own user: not root here, or root would be trusted anyway.
  const uid_t trainer = 4242;
  ASSERT_NE(trainer, *other);
  EXPECT_THAT(ResolveTrustedAgentSocket(sock, trainer, {}),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr(absl::StrCat("the agent's socket ", sock, " belongs to uid ", *other,
                                              ", not to this process's user (uid 4242"))));
  EXPECT_THAT(ResolveTrustedAgentSocket(sock, trainer, {}),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr(absl::StrCat("CKPTD_TRUSTED_AGENT_UIDS=", *other))));
  EXPECT_THAT(ResolveTrustedAgentSocket(sock, trainer, {*other}), IsOkAndHolds(sock));
  // A link of another user to a socket of the trainer's own: refused too
  // (its owner could point it anywhere).
  ASSERT_EQ(::chown(sock.c_str(), trainer, static_cast<gid_t>(-1)), 0);
  ASSERT_EQ(::symlink(sock.c_str(), tmp.Sub("link").c_str()), 0);
  ASSERT_EQ(::lchown(tmp.Sub("link").c_str(), *other, static_cast<gid_t>(-1)), 0);
  EXPECT_THAT(ResolveTrustedAgentSocket(tmp.Sub("link"), trainer, {}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("the symbolic link " + tmp.Sub("link"))));
  // A directory of another user: its owner could replace the socket.
  ASSERT_EQ(::chown(tmp.path().c_str(), *other, static_cast<gid_t>(-1)), 0);
  ASSERT_EQ(::chmod(tmp.path().c_str(), 0755), 0);
  EXPECT_THAT(ResolveTrustedAgentSocket(sock, trainer, {}),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr(absl::StrCat("the directory of the agent's socket, ", tmp.path(), ", belongs to uid ",
                                              *other))));
  ::close(fd);
  ASSERT_EQ(::chown(tmp.path().c_str(), 0, static_cast<gid_t>(-1)), 0);
}

}  // namespace
}  // namespace ckptd::base
