// This process's threads by name, for tests of what ckptd's threads run at
// (each names itself: base::SetCallingThreadName).
#pragma once

#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace ckptd::testing {

// The ids of this process's threads called `name` (/proc/self/task/*/comm);
// none where /proc cannot be read.
inline std::vector<int> ThreadsNamed(const std::string& name) {
  std::vector<int> tids;
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return tids;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string comm;
    if (std::getline(f, comm) && comm == name) tids.push_back(std::atoi(e->d_name));
  }
  ::closedir(dir);
  return tids;
}

}  // namespace ckptd::testing
