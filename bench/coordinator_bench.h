// ckptd-bench coordinator: starts ckptd-coordinator and drives it with many
// simulated agents (registration, a heartbeat stream each, shard reports for
// one job), and reports the coordinator's CPU use under that load and the
// latency from a step's last shard report to its committed manifest.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace ckptd::bench {

int RunCoordinatorBench(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

extern const char kCoordinatorHelp[];

}  // namespace ckptd::bench
