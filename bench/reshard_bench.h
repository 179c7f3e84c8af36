// ckptd-bench reshard: a step saved by N ranks restored onto M, each new
// rank planning by itself from every saved index (the yardstick) against the
// coordinator's plan from one read of the step's layout.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace ckptd::bench {

int RunReshardBench(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

extern const char kReshardHelp[];

}  // namespace ckptd::bench
