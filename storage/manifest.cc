#include "storage/manifest.h"

#include "absl/strings/string_view.h"
#include <cstring>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "format/checksum.h"
#include "storage/layout.h"
#include "storage/shard_format.h"

namespace ckptd::storage {

std::string EncodeManifest(const ckptd::v1::StepManifest& manifest) {
  std::string payload;
  manifest.SerializeToString(&payload);
  std::string out(kManifestHeaderBytes, '\0');
  uint8_t* h = reinterpret_cast<uint8_t*>(out.data());
  std::memcpy(h, kManifestMagic.data(), 8);
  PutFixed32(h + 8, kManifestFormatVersion);
  PutFixed32(h + 12, static_cast<uint32_t>(payload.size()));
  PutFixed64(h + 16, format::Xxh3(payload));
  out += payload;
  return out;
}

absl::StatusOr<ckptd::v1::StepManifest> DecodeManifest(absl::string_view bytes, absl::string_view what) {
  if (bytes.size() < kManifestHeaderBytes) {
    return absl::DataLossError(absl::StrCat(what, ": manifest of ", bytes.size(), " bytes is truncated"));
  }
  const uint8_t* h = reinterpret_cast<const uint8_t*>(bytes.data());
  if (std::memcmp(h, kManifestMagic.data(), 8) != 0) {
    return absl::DataLossError(absl::StrCat(what, ": not a ckptd manifest (bad magic)"));
  }
  const uint32_t version = GetFixed32(h + 8);
  if (version != kManifestFormatVersion) {
    return absl::UnimplementedError(absl::StrCat(what, ": manifest version ", version,
                                                 " is not supported (this build reads ",
                                                 kManifestFormatVersion, ")"));
  }
  const uint64_t length = GetFixed32(h + 12);
  if (length > kMaxManifestBytes || length != bytes.size() - kManifestHeaderBytes) {
    return absl::DataLossError(absl::StrCat(what, ": manifest says ", length, " payload bytes but has ",
                                            bytes.size() - kManifestHeaderBytes, " (truncated or extended)"));
  }
  const absl::string_view payload = bytes.substr(kManifestHeaderBytes);
  if (format::Xxh3(payload) != GetFixed64(h + 16)) {
    return absl::DataLossError(absl::StrCat(what, ": manifest checksum mismatch"));
  }
  ckptd::v1::StepManifest m;
  if (!m.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::DataLossError(absl::StrCat(what, ": manifest payload does not parse"));
  }
  if (m.format_version() != kManifestFormatVersion) {
    return absl::DataLossError(absl::StrCat(what, ": manifest payload version ", m.format_version(),
                                            " disagrees with its header"));
  }
  if (m.world_size() == 0 || static_cast<uint64_t>(m.shards_size()) != m.world_size()) {
    return absl::DataLossError(absl::StrCat(what, ": manifest lists ", m.shards_size(),
                                            " shards for a world of ", m.world_size()));
  }
  std::vector<bool> seen(m.world_size(), false);
  for (const ckptd::v1::ShardRef& s : m.shards()) {
    if (s.rank() >= m.world_size() || seen[s.rank()]) {
      return absl::DataLossError(absl::StrCat(what, ": manifest has rank ", s.rank(),
                                              " twice or outside its world of ", m.world_size()));
    }
    seen[s.rank()] = true;
    if (s.file() != ShardFileName(s.rank())) {
      return absl::DataLossError(absl::StrCat(what, ": rank ", s.rank(), " names file \"",
                                              absl::CHexEscape(s.file()), "\", expected ",
                                              ShardFileName(s.rank())));
    }
  }
  return m;
}

}  // namespace ckptd::storage
