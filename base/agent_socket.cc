#include "base/agent_socket.h"

#include <limits.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/posix_error.h"

namespace ckptd::base {
namespace {

constexpr char kSubdir[] = "ckptd";
constexpr char kName[] = "agent.sock";
constexpr char kRootSocket[] = "/run/ckptd/agent.sock";

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string Mode(mode_t mode) { return absl::StrFormat("%04o", mode & 07777); }

// Whether others than the owner may add, remove or rename its entries.
bool OthersMayWrite(const struct stat& st) { return (st.st_mode & (S_IWGRP | S_IWOTH)) != 0; }
bool Sticky(const struct stat& st) { return (st.st_mode & S_ISVTX) != 0; }

}  // namespace

std::string DescribeUid(uid_t uid) {
  struct passwd pw;
  struct passwd* found = nullptr;
  char buf[1024];
  if (::getpwuid_r(uid, &pw, buf, sizeof(buf), &found) == 0 && found != nullptr && found->pw_name != nullptr) {
    return absl::StrCat("uid ", uid, " (", found->pw_name, ")");
  }
  return absl::StrCat("uid ", uid);
}

absl::StatusOr<std::string> DefaultAgentSocket() {
  if (::geteuid() == 0) return std::string(kRootSocket);
  const std::string xdg = Env("XDG_RUNTIME_DIR");
  if (!xdg.empty() && xdg.front() == '/') return absl::StrCat(xdg, "/", kSubdir, "/", kName);
  return absl::InvalidArgumentError(absl::StrCat(
      "no --socket given and no private runtime directory for ", DescribeUid(::geteuid()),
      ": XDG_RUNTIME_DIR is not set (only root's default, ", kRootSocket,
      ", needs none); pass --socket with a path in a directory that only this user (and root) may write"));
}

std::string DefaultTrainerSocket() {
  if (std::string s = Env(kSocketEnv); !s.empty()) return s;
  if (const std::string xdg = Env("XDG_RUNTIME_DIR"); !xdg.empty() && xdg.front() == '/') {
    std::string own = absl::StrCat(xdg, "/", kSubdir, "/", kName);
    struct stat st;
    if (::lstat(own.c_str(), &st) == 0) return own;
  }
  return kRootSocket;
}

absl::StatusOr<std::vector<uint32_t>> ParseUidList(const std::string& text, const std::string& source) {
  std::vector<uint32_t> uids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::string item(absl::StripAsciiWhitespace(part));
    uint32_t uid = 0;
    if (absl::SimpleAtoi(item, &uid)) {
      if (uid == static_cast<uint32_t>(-1)) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": ", item, " is not a uid"));
      }
      uids.push_back(uid);
      continue;
    }
    struct passwd pw;
    struct passwd* found = nullptr;
    char buf[1024];
    if (::getpwnam_r(item.c_str(), &pw, buf, sizeof(buf), &found) != 0 || found == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": \"", absl::CHexEscape(item), "\" is neither a uid nor a user of this machine"));
    }
    uids.push_back(found->pw_uid);
  }
  return uids;
}

absl::Status PrepareAgentSocketDir(const std::string& socket_path, uid_t self, const gid_t* group) {
  const std::string dir = DirOf(socket_path);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return PosixError(absl::StrCat("the socket's directory ", dir), errno);
    // Only the last component is made: a missing parent is more likely a
    // typing error than a wish for a tree of directories.
    const mode_t mode = group != nullptr ? 0710 : 0700;
    if (::mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) {
      return PosixError(absl::StrCat("creating the socket's directory ", dir), errno);
    }
    if (::lstat(dir.c_str(), &st) != 0) return PosixError(absl::StrCat("the socket's directory ", dir), errno);
    if (S_ISDIR(st.st_mode) && st.st_uid == self) {
      if (group != nullptr && ::chown(dir.c_str(), static_cast<uid_t>(-1), *group) != 0) {
        return PosixError(absl::StrCat("giving group ", *group, " (the trainers' group) the directory ", dir), errno);
      }
      if (::chmod(dir.c_str(), mode) != 0) return PosixError(absl::StrCat("chmod ", dir), errno);
      if (::lstat(dir.c_str(), &st) != 0) return PosixError(absl::StrCat("the socket's directory ", dir), errno);
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("the socket's directory ", dir, " is not a directory"));
  }
  const std::string what = absl::StrCat("the socket's directory ", dir, " (owner ", DescribeUid(st.st_uid), ", mode ",
                                        Mode(st.st_mode), ")");
  const std::string instead =
      "give --socket a path in a directory that only the agent's user (and root) may write, e.g. the default "
      "($XDG_RUNTIME_DIR/ckptd, or /run/ckptd for root); a sticky directory of the agent's user also does";
  if (st.st_uid != self && st.st_uid != 0) {
    return absl::FailedPreconditionError(absl::StrCat(what, " belongs to another user, who could replace the socket: ",
                                                      instead));
  }
  if (OthersMayWrite(st) && !(Sticky(st) && st.st_uid == self)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " may be written by other users, who could take the socket's name first (trainers would then send "
              "their state to them) or keep the agent from starting: ",
        instead));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveTrustedAgentSocket(const std::string& socket_path, uid_t self,
                                                      const std::vector<uint32_t>& trusted) {
  auto is_trusted = [&](uid_t uid) {
    return uid == self || uid == 0 || std::find(trusted.begin(), trusted.end(), uid) != trusted.end();
  };
  auto untrusted = [&](const std::string& what, uid_t owner) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, " belongs to ", DescribeUid(owner), ", not to this process's user (", DescribeUid(self),
        "), root or an agent user it trusts: another user may be serving there to receive this trainer's "
        "checkpoints and serve it restores. Start the agent with its socket in a private directory (the default: "
        "$XDG_RUNTIME_DIR/ckptd, or /run/ckptd for root), or, when ",
        DescribeUid(owner), " runs this node's agent, trust it: ", kTrustedAgentUidsEnv, "=", owner,
        " (trusted_agent_uids in the client's options)"));
  };
  // A directory whose entries no untrusted user can replace: its owner is
  // trusted, and others may not write to it unless it is sticky (then only
  // an entry's owner, the directory's owner and root may replace an entry).
  auto check_dir = [&](const std::string& path) -> absl::Status {
    const std::string dir = DirOf(path);
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return PosixError(absl::StrCat("the agent's socket directory ", dir), errno);
    if (!is_trusted(st.st_uid)) return untrusted(absl::StrCat("the directory of the agent's socket, ", dir, ","), st.st_uid);
    if (OthersMayWrite(st) && !Sticky(st)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "the agent's socket ", path, " is in ", dir, " (mode ", Mode(st.st_mode),
          "), which other users may write and which is not sticky: any of them could replace the socket. Start "
          "the agent with its socket in a private directory (the default: $XDG_RUNTIME_DIR/ckptd, or /run/ckptd "
          "for root)"));
    }
    return absl::OkStatus();
  };
  struct stat st;
  if (::lstat(socket_path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no agent's socket at ", socket_path));
    return PosixError(absl::StrCat("the agent's socket ", socket_path), errno);
  }
  std::string resolved = socket_path;
  if (S_ISLNK(st.st_mode)) {
    if (!is_trusted(st.st_uid)) {
      return untrusted(absl::StrCat("the symbolic link ", socket_path, " (to the agent's socket)"), st.st_uid);
    }
    if (absl::Status s = check_dir(socket_path); !s.ok()) return s;
    char real[PATH_MAX];
    if (::realpath(socket_path.c_str(), real) == nullptr) {
      if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no agent's socket at ", socket_path));
      return PosixError(absl::StrCat("resolving the agent's socket ", socket_path), errno);
    }
    resolved = real;
    if (::lstat(resolved.c_str(), &st) != 0) {
      if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no agent's socket at ", resolved));
      return PosixError(absl::StrCat("the agent's socket ", resolved), errno);
    }
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(resolved, " is not a socket (an agent's socket was expected)"));
  }
  if (!is_trusted(st.st_uid)) return untrusted(absl::StrCat("the agent's socket ", resolved), st.st_uid);
  if (absl::Status s = check_dir(resolved); !s.ok()) return s;
  // Connect by the resolved name when it fits a socket address, so that a
  // link replaced later does not redirect the connection.
  if (resolved.size() >= sizeof(sockaddr_un::sun_path)) return socket_path;
  return resolved;
}

}  // namespace ckptd::base
