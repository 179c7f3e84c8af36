// What tests need to know about the machine they run on.
#pragma once

#include <string>

namespace ckptd::testing {

// The path of executable `name` in a directory of $PATH, or "" when there is
// none (tests that need an outside tool skip then, saying which).
std::string FindOnPath(const std::string& name);

}  // namespace ckptd::testing
