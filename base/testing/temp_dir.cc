#include "base/testing/temp_dir.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "gtest/gtest.h"

namespace ckptd::testing {

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = ::testing::TempDir();
  if (!tmpl.empty() && tmpl.back() != '/') tmpl += '/';
  tmpl += prefix + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << tmpl << ": " << std::strerror(errno);
    return;
  }
  path_ = tmpl;
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  std::error_code ec;
  // Tests may leave read-only folders behind: make each writable, then remove.
  for (auto it = std::filesystem::recursive_directory_iterator(path_, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec) && !it->is_symlink(ec)) {
      std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all,
                                   std::filesystem::perm_options::add, ec);
    }
  }
  std::filesystem::permissions(path_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
  // Best effort: a leftover temp dir does not fail a test.
  std::filesystem::remove_all(path_, ec);
}

}  // namespace ckptd::testing
