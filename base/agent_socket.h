// Where the agent's Unix socket lives, and who may be trusted to serve on it.
//
// A socket name in a directory other users may write to can be taken by any
// of them first: a trainer connecting there would hand its state to them and
// restore what they serve. So the agent serves only from a directory that no
// other user can write to, and a trainer connects only to a socket that
// belongs to its own user, to root, or to a user it was told to trust, in a
// directory whose entries no one else can replace.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckptd::base {

// The environment variable a trainer (the client library) reads for the
// agent's socket when it is given none.
inline constexpr char kSocketEnv[] = "CKPTD_SOCKET";
// Comma-separated uids or user names of agents a trainer trusts besides its
// own user and root.
inline constexpr char kTrustedAgentUidsEnv[] = "CKPTD_TRUSTED_AGENT_UIDS";

// The agent's socket when --socket is not given: /run/ckptd/agent.sock for
// root, $XDG_RUNTIME_DIR/ckptd/agent.sock for another user (a private
// directory the session manager made for that user). Without
// XDG_RUNTIME_DIR, a user other than root has no private runtime directory:
// an error saying to pass --socket.
absl::StatusOr<std::string> DefaultAgentSocket();

// The socket a trainer connects to when it is given none: $CKPTD_SOCKET;
// else $XDG_RUNTIME_DIR/ckptd/agent.sock when that exists (an agent of the
// trainer's own user); else /run/ckptd/agent.sock (the node's agent).
std::string DefaultTrainerSocket();

// "uid 1001 (alice)", or "uid 1001" when no user has the number.
std::string DescribeUid(uid_t uid);

// Parses a list of uids or user names ("1001,ckptd"): what `source` (the
// variable or option named in errors) holds.
absl::StatusOr<std::vector<uint32_t>> ParseUidList(const std::string& text, const std::string& source);

// For the agent, before it binds `socket_path` as user `self`: the socket's
// directory is created (mode 0700, or 0710 with `group` so that the
// trainers' group may reach the socket) when it does not exist but its own
// directory does. The directory must belong to `self` or root, and may be
// writable by others (group or world) only when it is sticky and belongs to
// `self`. Otherwise kFailedPrecondition naming the directory, its owner and
// mode and what to do instead.
absl::Status PrepareAgentSocketDir(const std::string& socket_path, uid_t self, const gid_t* group);

// For a trainer, before it connects to `socket_path`: where the socket is
// once symbolic links are followed. Refuses (kPermissionDenied, naming the
// owner) a socket, or a symbolic link on the way to it, that belongs to
// neither `self`, root nor a uid in `trusted`, and a socket in a directory
// whose entries someone untrusted could replace (a directory of another
// user, or one that others may write to and that is not sticky). A path that
// does not exist yet is kNotFound (an agent not started yet: try again);
// something that is not a socket is kFailedPrecondition.
absl::StatusOr<std::string> ResolveTrustedAgentSocket(const std::string& socket_path, uid_t self,
                                                      const std::vector<uint32_t>& trusted);

}  // namespace ckptd::base
