// The project's version, as every program reports it (`--version`) and the
// metrics label it (ckptd_build_info).
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ckptd::base {

// CMakeLists.txt's project(VERSION), e.g. "0.1.0".
absl::string_view Version();

// "<program> <version>", the line `--version` prints.
std::string VersionLine(absl::string_view program);

// True when `--version` is among `args` (argv without the program name),
// before a `--` that ends the flags: each main() then prints VersionLine()
// on stdout and exits 0 before it parses anything else, so `--version` works
// whatever other flags are missing or wrong.
bool AsksForVersion(const std::vector<std::string>& args);

}  // namespace ckptd::base
