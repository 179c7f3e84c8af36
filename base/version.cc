#include "base/version.h"

#include "absl/strings/str_cat.h"

#ifndef CKPTD_VERSION
#error "CKPTD_VERSION is set by base/CMakeLists.txt"
#endif

namespace ckptd::base {

absl::string_view Version() { return CKPTD_VERSION; }

std::string VersionLine(absl::string_view program) { return absl::StrCat(program, " ", Version()); }

bool AsksForVersion(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--") return false;
    if (a == "--version") return true;
  }
  return false;
}

}  // namespace ckptd::base
