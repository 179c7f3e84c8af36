#include "storage/layout.h"

#include "absl/strings/string_view.h"
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/escaping.h"
#include "absl/strings/strip.h"
#include "storage/file_system.h"

namespace ckptd::storage {
namespace {

// Digits only, no leading zero unless "0", fits uint64.
std::optional<uint64_t> ParseCanonicalUint(absl::string_view s) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  if (s.size() > 1 && s[0] == '0') return std::nullopt;
  uint64_t v = 0;
  if (!absl::SimpleAtoi(s, &v)) return std::nullopt;
  return v;
}

}  // namespace

absl::Status ValidateJobName(absl::string_view job) {
  if (job.empty()) return absl::InvalidArgumentError("job name is empty");
  if (job.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat("job name is ", job.size(), " characters; at most 128 allowed"));
  }
  if (job[0] == '.' || job[0] == '-') {
    return absl::InvalidArgumentError(absl::StrCat("job name \"", absl::CHexEscape(job),
                                                   "\" must not start with '.' or '-'"));
  }
  for (size_t i = 0; i < job.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(job[i]);
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrFormat("job name \"%s\" has a character not allowed at position %d (0x%02x); "
                          "allowed are A-Z a-z 0-9 . _ -",
                          absl::CHexEscape(job), i, c));
    }
  }
  return absl::OkStatus();
}

std::string JobDir(absl::string_view root, absl::string_view job) { return JoinPath(root, job); }

std::string StepDirName(uint64_t step) { return absl::StrCat("step-", step); }

std::string StepDir(absl::string_view root, absl::string_view job, uint64_t step) {
  return JoinPath(JobDir(root, job), StepDirName(step));
}

std::string ShardFileName(uint32_t rank) { return absl::StrCat("rank-", rank, ".shard"); }

std::string ShardPath(absl::string_view root, absl::string_view job, uint64_t step, uint32_t rank) {
  return JoinPath(StepDir(root, job, step), ShardFileName(rank));
}

std::string ManifestPath(absl::string_view root, absl::string_view job, uint64_t step) {
  return JoinPath(StepDir(root, job, step), kManifestName);
}

std::string QuarantinePath(absl::string_view root, absl::string_view job, uint64_t step) {
  return JoinPath(StepDir(root, job, step), kQuarantineName);
}

std::string FreshStartPath(absl::string_view root, absl::string_view job) {
  return JoinPath(JobDir(root, job), kFreshStartName);
}

std::optional<uint64_t> ParseStepDirName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "step-")) return std::nullopt;
  return ParseCanonicalUint(name);
}

std::optional<uint32_t> ParseShardFileName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "rank-") || !absl::ConsumeSuffix(&name, ".shard")) return std::nullopt;
  std::optional<uint64_t> v = ParseCanonicalUint(name);
  if (!v || *v > std::numeric_limits<uint32_t>::max()) return std::nullopt;
  return static_cast<uint32_t>(*v);
}

}  // namespace ckptd::storage
