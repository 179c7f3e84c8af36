// A fresh directory under the test's temp dir, removed with everything in it
// when the object goes.
#pragma once

#include <string>

namespace ckptd::testing {

class TempDir {
 public:
  // `prefix` names the folder ("<prefix>XXXXXX"); the test fails when it
  // cannot be made.
  explicit TempDir(const std::string& prefix = "ckptd_test_");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace ckptd::testing
