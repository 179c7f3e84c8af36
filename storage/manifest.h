// The MANIFEST file of a committed step: a fixed 24-byte header (magic,
// version, payload length, checksum) and a StepManifest protobuf.
#pragma once

#include "absl/strings/string_view.h"
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "ckptd/v1/manifest.pb.h"

namespace ckptd::storage {

inline constexpr absl::string_view kManifestMagic = "CKPTMNFT";
inline constexpr uint32_t kManifestFormatVersion = 1;
inline constexpr size_t kManifestHeaderBytes = 24;
inline constexpr uint64_t kMaxManifestBytes = 64ull << 20;

std::string EncodeManifest(const ckptd::v1::StepManifest& manifest);

// Parses and checks a MANIFEST's bytes: header, checksum, payload, and that
// the manifest lists exactly one shard per rank of its world with a valid
// file name. Errors are kDataLoss (kUnimplemented for a newer version) and
// start with `what`.
absl::StatusOr<ckptd::v1::StepManifest> DecodeManifest(absl::string_view bytes, absl::string_view what);

}  // namespace ckptd::storage
