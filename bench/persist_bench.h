// ckptd-bench persist: writes a synthetic rank checkpoint as a committed step,
// reads it back verified, and reports throughput and compression ratio,
// optionally beside fio and the zstd CLI measured on the same directory.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace ckptd::bench {

int RunPersistBench(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

extern const char kPersistHelp[];

}  // namespace ckptd::bench
