// What tests of a process's /metrics share: one sample's value out of an
// exposition, and promtool's check of it.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace ckptd::metrics::testing {

// The value of the sample `series` (its name and labels as rendered, e.g.
// `ckptd_agent_trainers` or `ckptd_x_total{job="a"}`) in `exposition`;
// nullopt when it has no such line.
inline std::optional<double> SampleValue(const std::string& exposition, absl::string_view series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n', absl::SkipEmpty())) {
    if (line.size() > series.size() && absl::StartsWith(line, series) && line[series.size()] == ' ') {
      double v = 0;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
    }
  }
  return std::nullopt;
}

struct PromtoolResult {
  int exit_code = -1;
  std::string output;
};

// Runs `promtool check metrics` (the binary `promtool`) on `exposition`.
inline PromtoolResult PromtoolCheck(const std::string& promtool, const std::string& exposition) {
  static int n = 0;
  const std::string file = absl::StrCat(::testing::TempDir(), "/ckptd_metrics_", ::getpid(), "_", n++, ".prom");
  std::ofstream(file, std::ios::binary) << exposition;
  PromtoolResult result;
  FILE* pipe = ::popen(absl::StrCat("'", promtool, "' check metrics < '", file, "' 2>&1").c_str(), "r");
  if (pipe != nullptr) {
    char buf[4096];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof(buf), pipe)) > 0) result.output.append(buf, got);
    const int status = ::pclose(pipe);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::remove(file.c_str());
  return result;
}

}  // namespace ckptd::metrics::testing
