// Where checkpoints live under a storage root:
//   <root>/<job>/step-<step>/rank-<rank>.shard
//   <root>/<job>/step-<step>/MANIFEST            (written last; the step exists only with it)
// Files being written carry a ".tmp" suffix until they are renamed into place.
#pragma once

#include "absl/strings/string_view.h"
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ckptd::storage {

inline constexpr absl::string_view kManifestName = "MANIFEST";
inline constexpr absl::string_view kTempSuffix = ".tmp";
// Marks a committed step whose data failed verification: kept for a look,
// never restored.
inline constexpr absl::string_view kQuarantineName = "QUARANTINED";
// In a job's directory: the operator chose to start the job from scratch
// although it has committed steps, none of them intact (ckptctl start-fresh).
inline constexpr absl::string_view kFreshStartName = "FRESH_START";

// A job name is 1..128 characters of [A-Za-z0-9._-], not starting with '.'
// or '-'. kInvalidArgument naming the offending character otherwise.
absl::Status ValidateJobName(absl::string_view job);

std::string JobDir(absl::string_view root, absl::string_view job);
std::string StepDirName(uint64_t step);
std::string StepDir(absl::string_view root, absl::string_view job, uint64_t step);
std::string ShardFileName(uint32_t rank);
std::string ShardPath(absl::string_view root, absl::string_view job, uint64_t step, uint32_t rank);
std::string ManifestPath(absl::string_view root, absl::string_view job, uint64_t step);
std::string QuarantinePath(absl::string_view root, absl::string_view job, uint64_t step);
std::string FreshStartPath(absl::string_view root, absl::string_view job);

// "step-42" -> 42; nullopt for anything else (including leading zeros, signs
// and values past uint64).
std::optional<uint64_t> ParseStepDirName(absl::string_view name);
// "rank-3.shard" -> 3; nullopt otherwise.
std::optional<uint32_t> ParseShardFileName(absl::string_view name);

}  // namespace ckptd::storage
