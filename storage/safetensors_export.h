// Export of a committed step as safetensors files: the full (unsharded)
// tensors that inference and evaluation tools read, assembled from the
// slices every rank's shard holds and verified against the shards'
// checksums on the way out.
//
// The safetensors format: an 8-byte little-endian header length, a JSON
// header ({"__metadata__": {...}, name: {"dtype", "shape", "data_offsets"}}
// padded with spaces to a multiple of 8 bytes), then the tensors' bytes,
// back to back in the order of the offsets.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckptd/v1/shard.pb.h"
#include "storage/store.h"

namespace ckptd::storage {

struct SafetensorsExportOptions {
  // The state components exported (default: the weights). RNG and data
  // cursor state is opaque bytes (dtype U8), each rank's under
  // "rank<r>/<name>" when the job has several ranks.
  std::vector<ckptd::v1::Component> components = {ckptd::v1::PARAMS};
  // Tensors go into one file, model.safetensors, or when they exceed this
  // many bytes into several (model-00001-of-0000N.safetensors, a tensor never
  // split) with the index model.safetensors.index.json that names each
  // tensor's file, as Hugging Face's tools write and read them.
  uint64_t max_file_bytes = 5'000'000'000;
  int threads = 0;  // decoder threads; <= 0: one per hardware thread
};

struct ExportedTensor {
  std::string name;
  std::string file;  // in the output directory
  std::string dtype;  // the safetensors dtype: F32, BF16, ...
  std::vector<uint64_t> shape;
  uint64_t bytes = 0;
  int slices = 0;  // shards it was assembled from
};

struct SafetensorsExport {
  std::string job;
  uint64_t step = 0;
  std::vector<std::string> files;  // written, in the output directory
  std::vector<ExportedTensor> tensors;
  uint64_t bytes = 0;  // tensor bytes written
};

// How a tensor of a step becomes one exported tensor:
//  - with a global layout (global_shape and offsets), the slices of every
//    rank holding it are put together; slices at the same place (a sharded
//    tensor replicated over data-parallel ranks) are read once; slices that
//    overlap otherwise or leave part of the tensor uncovered are an error;
//  - without one, a tensor held by one rank is exported as it is; one held by
//    several ranks is exported once when every copy has the same shape and
//    the same block checksums (data-parallel replicas); opaque bytes (dtype
//    BYTES) whose copies differ are exported per rank, as "rank<r>/<name>";
//    other tensors whose copies differ are an error naming the tensor: its
//    global layout must be declared.
// Every byte is read through ShardReader, which verifies each chunk; each
// shard's index must match the step's MANIFEST. Every file is written under
// a temporary name and synced before any is renamed into `out_dir` (created
// with its parents if missing), so a failed export leaves an earlier export
// there as it was. Then the earlier index is removed (it never names a mix
// of two exports), the files renamed in, the new index written, and the
// files of the earlier export that this one did not write
// (model.safetensors, its index, model-NNNNN-of-NNNNN.safetensors) removed.
//
// `step` nullopt: the newest committed step that is not quarantined. Errors:
// kNotFound (no such job or step), kFailedPrecondition (a step not committed
// or quarantined, tensors that cannot be assembled, nothing to export),
// kDataLoss (a shard that fails verification), the file system's errors.
absl::StatusOr<SafetensorsExport> ExportSafetensors(CheckpointStore& store, absl::string_view job,
                                                    std::optional<uint64_t> step, const std::string& out_dir,
                                                    const SafetensorsExportOptions& options = {});

// "params,optimizer" or "all": the components of a comma-separated list of
// params, grads, optimizer, rng, data_cursor (duplicates ignored).
// kInvalidArgument naming an unknown one.
absl::StatusOr<std::vector<ckptd::v1::Component>> ParseComponentList(absl::string_view list);

// The safetensors dtype of a ckptd dtype ("F32", "BF16", ...; BYTES is "U8").
absl::string_view SafetensorsDType(ckptd::v1::DType dtype);

}  // namespace ckptd::storage
