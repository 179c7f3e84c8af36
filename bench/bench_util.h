// Helpers shared by the benchmarks of ckptd-bench.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckptd::bench {

// The median of `v` (0 when empty).
double Median(std::vector<double> v);

// A benchmark's folder: --dir when given (kept), else a new folder under
// /tmp (removed with this object).
class ScratchDir {
 public:
  ScratchDir() = default;
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  // `dir`, or a new folder named after `tag` ("/tmp/<tag>-XXXXXX").
  absl::Status Init(const std::optional<std::string>& dir, const std::string& tag);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool own_ = false;
};

// Runs `command` through the shell; its stdout, or nullopt when it failed.
std::optional<std::string> Capture(const std::string& command);

// `s` quoted for the shell.
std::string ShellQuote(const std::string& s);

// The folder of this program (ckptd-bench), where the binaries and the
// scripts it runs are; "." when /proc/self/exe cannot be read.
std::string SelfDir();

// The S3 yardstick (bench/s3_transfer.py: boto3's transfer manager at its
// defaults), beside this program: `op` ("upload" or "download") of the
// object at `url` to or from the local `file`. Its GB/s, or an error saying
// why it did not run (no python3 or boto3, a store that refused).
absl::StatusOr<double> RunS3Yardstick(const std::string& op, const std::string& url, const std::string& file);

// The first number after `"key" :` inside the first `"section" : {` object
// of fio-style JSON.
std::optional<double> JsonNumberAfter(const std::string& json, const std::string& section, const std::string& key);

// The largest CUDA device index of --cuda.
constexpr uint64_t kMaxCudaDevice = 1023;

}  // namespace ckptd::bench
