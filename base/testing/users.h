// Users of a test's own making, without touching the machine's accounts:
// numbers that name no user and no group here, taken on by a forked child
// (setgroups, setgid, setuid), which only root can do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ckptd::testing {

struct TestUser {
  uint32_t uid = 0;
  std::vector<uint32_t> groups;  // the first one is the primary group
};

// `n` numbers from 61000 on (below 62000) that are neither a user's nor a
// group's; fewer when there are not that many.
std::vector<uint32_t> UnusedIds(size_t n);

// For a forked child: becomes `user` (its supplementary groups, its primary
// group, then its uid). Returns "" when it did, else why not ("cannot become
// uid <n>: <errno text>").
std::string BecomeUser(const TestUser& user);

// Runs `fn` in a forked child and returns what it returned, with " (child
// died ...)" added when the child did not exit (a signal, e.g. SIGBUS).
std::string RunInChild(const std::function<std::string()>& fn);

// Runs `fn` in a forked child as `user` and returns what it returned, or why
// the child could not become `user` or did not finish.
std::string RunAs(const TestUser& user, const std::function<std::string()>& fn);

// The processes' threads whose real uid is `uid`, as /proc shows them: what
// RLIMIT_NPROC counts.
size_t TasksOfUser(uint32_t uid);

// For a forked child that is not root (root is exempt from RLIMIT_NPROC):
// sets its RLIMIT_NPROC so that its user may start `more` threads or
// processes beyond those it has now (TasksOfUser). Returns "" when it did,
// else why not. Reliable for a uid of the test's own (UnusedIds), which no
// other process starts threads as meanwhile.
std::string LimitNewThreads(size_t more);

}  // namespace ckptd::testing
