// ckptd-bench snapshot: the blocking part of Client::Snapshot through a live
// agent, beside a plain memcpy of the same bytes in the same run.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace ckptd::bench {

int RunSnapshotBench(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

extern const char kSnapshotHelp[];

}  // namespace ckptd::bench
