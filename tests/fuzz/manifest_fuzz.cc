// libFuzzer target for DecodeManifest: the input is one MANIFEST file.
//
// Each input is decoded as it is, and again with the header's payload length
// and checksum recomputed so that mutations reach the payload checks. Beyond
// the sanitizers, the target checks DecodeManifest's contract:
//   - it fails only with kDataLoss or kUnimplemented;
//   - a decoded manifest lists exactly one shard per rank of a non-empty world,
//     each named rank-<rank>.shard;
//   - EncodeManifest of a decoded manifest decodes to the same manifest
//     (compared by deterministic serialization, so NaN timings compare equal).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ckptd/v1/manifest.pb.h"
#include "format/checksum.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/stubs/logging.h"
#include "storage/layout.h"
#include "storage/manifest.h"
#include "storage/shard_format.h"

namespace {

using ckptd::storage::kManifestHeaderBytes;

[[noreturn]] void Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "fuzz_manifest: contract violated: %s: %s\n", what, status.ToString().c_str());
  std::fflush(stderr);
  std::abort();
}
#define FUZZ_CHECK(cond, what, status) \
  do {                                 \
    if (!(cond)) Fail(what, status);   \
  } while (0)

std::string Deterministic(const ckptd::v1::StepManifest& m) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    m.SerializeToCodedStream(&coded);
  }
  return out;
}

void Exercise(absl::string_view bytes) {
  absl::StatusOr<ckptd::v1::StepManifest> m = ckptd::storage::DecodeManifest(bytes, "fuzz");
  if (!m.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(m.status()) || absl::IsUnimplemented(m.status()),
               "DecodeManifest failed with an unexpected code", m.status());
    return;
  }
  FUZZ_CHECK(m->world_size() > 0 && static_cast<uint64_t>(m->shards_size()) == m->world_size(),
             "shard count does not match the world", absl::OkStatus());
  std::vector<bool> seen(m->world_size(), false);
  for (const ckptd::v1::ShardRef& s : m->shards()) {
    FUZZ_CHECK(s.rank() < m->world_size() && !seen[s.rank()], "rank outside the world or twice",
               absl::OkStatus());
    seen[s.rank()] = true;
    FUZZ_CHECK(s.file() == ckptd::storage::ShardFileName(s.rank()), "shard file name", absl::OkStatus());
  }

  const std::string again = ckptd::storage::EncodeManifest(*m);
  absl::StatusOr<ckptd::v1::StepManifest> m2 = ckptd::storage::DecodeManifest(again, "fuzz (re-encoded)");
  FUZZ_CHECK(m2.ok(), "a decoded manifest does not decode after EncodeManifest", m2.status());
  FUZZ_CHECK(Deterministic(*m) == Deterministic(*m2), "re-encoded manifest differs", absl::OkStatus());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Invalid UTF-8 in string fields is logged by protobuf on every such input.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  Exercise(bytes);
  if (size >= kManifestHeaderBytes) {
    std::string fixed(bytes);
    uint8_t* h = reinterpret_cast<uint8_t*>(fixed.data());
    const absl::string_view payload = bytes.substr(kManifestHeaderBytes);
    ckptd::storage::PutFixed32(h + 12, static_cast<uint32_t>(payload.size()));
    ckptd::storage::PutFixed64(h + 16, ckptd::format::Xxh3(payload));
    if (fixed != bytes) Exercise(fixed);
  }
  return 0;
}
