// ckptd-bench overhead: the demo trainer's training time with checkpoints
// every k steps, beside the same run without checkpoints.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace ckptd::bench {

int RunOverheadBench(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

extern const char kOverheadHelp[];

}  // namespace ckptd::bench
