// ckptd-bench register and restore: what a trainer that starts (again) waits
// for, through a live agent: its registration, fresh and after a restart, and
// the restore of its state from the agent's memory, the node-local tier or
// the storage root, beside memcpy and read() of the same bytes.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "client/device_copy.h"

namespace ckptd::bench {

int RunRegisterBench(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);
// `device_copier`, for tests: the copier of --cuda (instead of CUDA's), for
// the benchmark's copies and the trainers'.
int RunRestoreBench(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err,
                    client::DeviceCopier* device_copier = nullptr);

extern const char kRegisterHelp[];
extern const char kRestoreHelp[];

}  // namespace ckptd::bench
