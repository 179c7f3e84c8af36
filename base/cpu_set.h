// Which CPUs a process runs on, written as the lists of taskset(1) and
// cpuset(7): CPU numbers and inclusive ranges separated by commas ("0-3,8").
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckptd::base {

// The highest CPU number a list may name (Linux's own limit, CONFIG_NR_CPUS).
inline constexpr int kMaxCpu = 8191;

// Parses a CPU list into its CPUs, sorted and without duplicates. Each CPU
// is 0..kMaxCpu and each range ascending; kInvalidArgument saying which part
// is wrong otherwise (the caller names its flag or file).
absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view list);
// The list form of sorted, distinct CPUs: {0, 1, 2, 3, 8} -> "0-3,8".
std::string FormatCpuList(const std::vector<int>& cpus);

// The CPUs the calling thread may run on (sched_getaffinity), sorted.
absl::StatusOr<std::vector<int>> AllowedCpus();
// kInvalidArgument naming the CPUs of `cpus` that are not in `allowed`
// ("CPU 9 is not one this process may use (it may use 0-7)").
absl::Status CheckCpusAllowed(const std::vector<int>& cpus, const std::vector<int>& allowed);

// Runs the calling thread (and the threads it starts later) on `cpus` only.
absl::Status PinCallingThreadToCpus(const std::vector<int>& cpus);
// Runs every thread of this process, those running now and those they start
// later, on `cpus` only (sched_setaffinity of each thread in /proc/self/task).
// Meant for start-up, before other threads exist; a thread that starts while
// this runs may keep its old CPUs. Errors as base::PosixError.
absl::Status PinProcessToCpus(const std::vector<int>& cpus);

}  // namespace ckptd::base
