#include "base/cpu_set.h"

#include <dirent.h>
#include <sched.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/posix_error.h"

namespace ckptd::base {
namespace {

// A cpu_set_t sized for CPUs 0..kMaxCpu (the fixed cpu_set_t stops at 1023).
class DynamicCpuSet {
 public:
  DynamicCpuSet() : set_(CPU_ALLOC(kMaxCpu + 1)), bytes_(CPU_ALLOC_SIZE(kMaxCpu + 1)) { CPU_ZERO_S(bytes_, set_); }
  ~DynamicCpuSet() { CPU_FREE(set_); }
  DynamicCpuSet(const DynamicCpuSet&) = delete;
  DynamicCpuSet& operator=(const DynamicCpuSet&) = delete;

  cpu_set_t* get() { return set_; }
  size_t bytes() const { return bytes_; }

 private:
  cpu_set_t* set_;
  size_t bytes_;
};

absl::StatusOr<int> ParseCpu(absl::string_view text, absl::string_view part) {
  int cpu = 0;
  if (text.empty() || !std::all_of(text.begin(), text.end(), [](char c) { return absl::ascii_isdigit(c); }) ||
      !absl::SimpleAtoi(text, &cpu) || cpu > kMaxCpu) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", part, "\" is not a CPU number 0..", kMaxCpu, " nor a range of them like 0-3"));
  }
  return cpu;
}

}  // namespace

absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view list) {
  if (absl::StripAsciiWhitespace(list).empty()) {
    return absl::InvalidArgumentError("an empty CPU list (expected e.g. 0-3,8)");
  }
  std::vector<int> cpus;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    const size_t dash = part.find('-');
    if (dash == absl::string_view::npos) {
      absl::StatusOr<int> cpu = ParseCpu(part, part);
      if (!cpu.ok()) return cpu.status();
      cpus.push_back(*cpu);
      continue;
    }
    absl::StatusOr<int> first = ParseCpu(part.substr(0, dash), part);
    if (!first.ok()) return first.status();
    absl::StatusOr<int> last = ParseCpu(part.substr(dash + 1), part);
    if (!last.ok()) return last.status();
    if (*last < *first) {
      return absl::InvalidArgumentError(absl::StrCat("the range \"", part, "\" goes down"));
    }
    for (int c = *first; c <= *last; ++c) cpus.push_back(c);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

absl::StatusOr<std::vector<int>> AllowedCpus() {
  DynamicCpuSet set;
  if (::sched_getaffinity(0, set.bytes(), set.get()) != 0) return PosixError("sched_getaffinity", errno);
  std::vector<int> cpus;
  for (int c = 0; c <= kMaxCpu; ++c) {
    if (CPU_ISSET_S(c, set.bytes(), set.get())) cpus.push_back(c);
  }
  return cpus;
}

absl::Status CheckCpusAllowed(const std::vector<int>& cpus, const std::vector<int>& allowed) {
  std::vector<int> outside;
  for (int c : cpus) {
    if (!std::binary_search(allowed.begin(), allowed.end(), c)) outside.push_back(c);
  }
  if (outside.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(outside.size() == 1 ? "CPU " : "CPUs ", FormatCpuList(outside),
                                                 outside.size() == 1 ? " is not one" : " are not ones",
                                                 " this process may use (it may use ", FormatCpuList(allowed), ")"));
}

namespace {

// `cpus` as a set; kInvalidArgument when empty or out of range.
absl::Status ToSet(const std::vector<int>& cpus, DynamicCpuSet* set) {
  if (cpus.empty()) return absl::InvalidArgumentError("no CPU to run on");
  for (int c : cpus) {
    if (c < 0 || c > kMaxCpu) return absl::InvalidArgumentError(absl::StrCat("CPU ", c, " is out of range"));
    CPU_SET_S(c, set->bytes(), set->get());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PinCallingThreadToCpus(const std::vector<int>& cpus) {
  DynamicCpuSet set;
  if (absl::Status s = ToSet(cpus, &set); !s.ok()) return s;
  if (::sched_setaffinity(0, set.bytes(), set.get()) != 0) {
    return PosixError(absl::StrCat("sched_setaffinity to CPUs ", FormatCpuList(cpus)), errno);
  }
  return absl::OkStatus();
}

absl::Status PinProcessToCpus(const std::vector<int>& cpus) {
  DynamicCpuSet set;
  if (absl::Status s = ToSet(cpus, &set); !s.ok()) return s;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir("/proc/self/task"), &::closedir);
  if (dir == nullptr) return PosixError("opendir /proc/self/task", errno);
  while (const dirent* e = ::readdir(dir.get())) {
    pid_t tid = 0;
    if (!absl::SimpleAtoi(e->d_name, &tid) || tid <= 0) continue;  // "." and ".."
    if (::sched_setaffinity(tid, set.bytes(), set.get()) != 0) {
      if (errno == ESRCH) continue;  // the thread ended meanwhile
      return PosixError(absl::StrCat("sched_setaffinity of thread ", tid, " to CPUs ", FormatCpuList(cpus)), errno);
    }
  }
  return absl::OkStatus();
}

}  // namespace ckptd::base
