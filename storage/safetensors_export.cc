#include "storage/safetensors_export.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <thread>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "format/tensor_size.h"
#include "storage/codec.h"
#include "storage/layout.h"
#include "storage/reshard.h"

namespace ckptd::storage {

using ckptd::v1::Tensor;

absl::string_view SafetensorsDType(ckptd::v1::DType dtype) {
  switch (dtype) {
    case ckptd::v1::BYTES: return "U8";
    case ckptd::v1::FLOAT32: return "F32";
    case ckptd::v1::BFLOAT16: return "BF16";
    case ckptd::v1::FLOAT16: return "F16";
    case ckptd::v1::FLOAT64: return "F64";
    case ckptd::v1::INT8: return "I8";
    case ckptd::v1::UINT8: return "U8";
    case ckptd::v1::INT16: return "I16";
    case ckptd::v1::INT32: return "I32";
    case ckptd::v1::INT64: return "I64";
    case ckptd::v1::BOOL: return "BOOL";
    case ckptd::v1::FLOAT8_E4M3: return "F8_E4M3";
    case ckptd::v1::FLOAT8_E5M2: return "F8_E5M2";
    default: return "";
  }
}

absl::StatusOr<std::vector<ckptd::v1::Component>> ParseComponentList(absl::string_view list) {
  static constexpr std::pair<absl::string_view, ckptd::v1::Component> kNames[] = {
      {"params", ckptd::v1::PARAMS}, {"grads", ckptd::v1::GRADS},      {"optimizer", ckptd::v1::OPTIMIZER},
      {"rng", ckptd::v1::RNG},       {"data_cursor", ckptd::v1::DATA_CURSOR}};
  std::vector<ckptd::v1::Component> out;
  if (list == "all") {
    for (const auto& [name, c] : kNames) out.push_back(c);
    return out;
  }
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    const auto* it = std::find_if(std::begin(kNames), std::end(kNames), [&](const auto& n) { return n.first == part; });
    if (it == std::end(kNames)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown state component \"", absl::CHexEscape(part),
                                                     "\" (params, grads, optimizer, rng, data_cursor or all)"));
    }
    if (std::find(out.begin(), out.end(), it->second) == out.end()) out.push_back(it->second);
  }
  return out;
}

namespace {

// One rank's copy or slice of a tensor.
struct Piece {
  uint32_t rank = 0;
  Tensor meta;  // blocks included: their checksums compare replicas
};

// One exported tensor and where its bytes come from.
struct Planned {
  std::string name;
  ckptd::v1::DType dtype = ckptd::v1::DTYPE_UNSPECIFIED;
  std::vector<uint64_t> shape;
  uint64_t bytes = 0;
  bool sharded = false;
  std::vector<Piece> pieces;  // sharded: one per distinct slice; else one
};

std::string Quoted(absl::string_view name) { return absl::StrCat("'", absl::CHexEscape(name), "'"); }

// A JSON string literal of valid UTF-8 `s` (tensor names are checked to be).
std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
  return out;
}

// Product of `dims` times `scale`, or nullopt when it does not fit 64 bits.
std::optional<uint64_t> CheckedVolume(const std::vector<uint64_t>& dims, uint64_t scale) {
  uint64_t v = scale;
  for (uint64_t d : dims) {
    if (d != 0 && v > UINT64_MAX / d) return std::nullopt;
    v *= d;
  }
  return v;
}

std::vector<uint64_t> Dims(const google::protobuf::RepeatedField<uint64_t>& f) { return {f.begin(), f.end()}; }

bool SameBlocks(const Tensor& a, const Tensor& b) {
  if (a.raw_length() != b.raw_length() || a.blocks_size() != b.blocks_size()) return false;
  for (int i = 0; i < a.blocks_size(); ++i) {
    const auto& x = a.blocks(i);
    const auto& y = b.blocks(i);
    if (x.raw_offset() != y.raw_offset() || x.raw_length() != y.raw_length() || x.raw_xxh3() != y.raw_xxh3()) {
      return false;
    }
  }
  return true;
}

// The name of rank `rank`'s own copy of a tensor exported per rank.
std::string PerRankName(uint32_t rank, absl::string_view name) { return absl::StrCat("rank", rank, "/", name); }

// Opaque bytes (dtype BYTES, no global layout) held by several ranks whose
// copies are not all the same.
bool OpaqueAndDifferent(const std::vector<Piece>& pieces) {
  if (pieces.size() < 2) return false;
  for (const Piece& p : pieces) {
    if (p.meta.dtype() != ckptd::v1::BYTES || p.meta.global_shape_size() > 0) return false;
  }
  for (const Piece& p : pieces) {
    if (!SameBlocks(p.meta, pieces.front().meta) || Dims(p.meta.shape()) != Dims(pieces.front().meta.shape())) {
      return true;
    }
  }
  return false;
}

std::string RankList(const std::vector<Piece>& pieces) {
  std::vector<uint32_t> ranks;
  for (const Piece& p : pieces) ranks.push_back(p.rank);
  if (ranks.size() > 8) {
    return absl::StrCat(absl::StrJoin(ranks.begin(), ranks.begin() + 8, ", "), ", ... (", ranks.size(), " ranks)");
  }
  return absl::StrJoin(ranks, ", ");
}

// Decides how the pieces of one name become one tensor.
absl::StatusOr<Planned> PlanTensor(const std::string& name, std::vector<Piece> pieces) {
  Planned out;
  out.name = name;
  const Tensor& first = pieces.front().meta;
  out.dtype = first.dtype();
  out.sharded = first.global_shape_size() > 0;
  for (const Piece& p : pieces) {
    if (p.meta.dtype() != out.dtype) {
      return absl::FailedPreconditionError(absl::StrCat("tensor ", Quoted(name), " has dtype ",
                                                        ckptd::v1::DType_Name(out.dtype), " on rank ",
                                                        pieces.front().rank, " but ",
                                                        ckptd::v1::DType_Name(p.meta.dtype()), " on rank ", p.rank));
    }
    if ((p.meta.global_shape_size() > 0) != out.sharded) {
      const uint32_t with = out.sharded ? pieces.front().rank : p.rank;
      const uint32_t without = out.sharded ? p.rank : pieces.front().rank;
      return absl::FailedPreconditionError(
          absl::StrCat("tensor ", Quoted(name), " has a global layout on rank ", with, " but none on rank ", without));
    }
  }
  const uint64_t element = format::DTypeSize(out.dtype);
  if (!out.sharded) {
    for (const Piece& p : pieces) {
      if (!SameBlocks(p.meta, first) || Dims(p.meta.shape()) != Dims(first.shape())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "tensor ", Quoted(name), " is held by ranks ", RankList(pieces),
            " without a global layout, and their copies differ (ranks ", pieces.front().rank, " and ", p.rank,
            "): declare its global shape and the offsets of each rank's slice to export it"));
      }
    }
    out.shape = Dims(first.shape());
    out.bytes = first.raw_length();
    pieces.resize(1);
    out.pieces = std::move(pieces);
    return out;
  }
  out.shape = Dims(first.global_shape());
  for (const Piece& p : pieces) {
    if (Dims(p.meta.global_shape()) != out.shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor ", Quoted(name), " has global shape [", absl::StrJoin(out.shape, ", "), "] on rank ",
          pieces.front().rank, " but [", absl::StrJoin(p.meta.global_shape(), ", "), "] on rank ", p.rank));
    }
  }
  std::optional<uint64_t> bytes = CheckedVolume(out.shape, element);
  if (!bytes) return absl::FailedPreconditionError(absl::StrCat("tensor ", Quoted(name), " is too large"));
  out.bytes = *bytes;
  std::vector<SavedSlice> saved;
  for (const Piece& p : pieces) saved.push_back({p.rank, SliceBox(p.meta)});
  CKPTD_ASSIGN_OR_RETURN(const std::vector<SavedSlice> read,
                         SlicesFor(absl::StrCat("tensor ", Quoted(name)), WholeBox(out.shape), saved));
  for (const SavedSlice& r : read) {
    auto it = std::find_if(pieces.begin(), pieces.end(), [&](const Piece& p) { return p.rank == r.rank; });
    out.pieces.push_back(std::move(*it));
  }
  return out;
}

// Opens shards lazily and keeps a few open.
class Readers {
 public:
  Readers(CheckpointStore& store, std::string job, uint64_t step, const ckptd::v1::StepManifest& manifest,
          base::ThreadPool* pool)
      : store_(store), job_(std::move(job)), step_(step), manifest_(manifest), pool_(pool) {}

  absl::StatusOr<ShardReader*> Get(uint32_t rank) {
    auto it = open_.find(rank);
    if (it != open_.end()) return it->second.get();
    if (open_.size() >= kMaxOpen) open_.erase(open_.begin());
    CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> reader,
                           store_.OpenCommittedShard(job_, step_, manifest_, rank, {}, pool_));
    return (open_[rank] = std::move(reader)).get();
  }

 private:
  static constexpr size_t kMaxOpen = 32;
  CheckpointStore& store_;
  std::string job_;
  uint64_t step_;
  const ckptd::v1::StepManifest& manifest_;
  base::ThreadPool* pool_;
  std::map<uint32_t, std::unique_ptr<ShardReader>> open_;
};

// `n` bytes, or kResourceExhausted naming what they were for.
absl::StatusOr<std::unique_ptr<char[]>> Allocate(uint64_t n, absl::string_view what) {
  std::unique_ptr<char[]> p(new (std::nothrow) char[std::max<uint64_t>(n, 1)]);
  if (!p) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", n, " bytes for ", what));
  return p;
}

// Reads the bytes of `t` (all of them) into `dst`: each slice's part of
// the whole tensor, block by block.
absl::Status Assemble(Readers& readers, const Planned& t, char* dst) {
  const Box whole = t.sharded ? WholeBox(t.shape) : SliceBox(t.pieces.front().meta);
  for (const Piece& p : t.pieces) {
    CKPTD_ASSIGN_OR_RETURN(ShardReader * reader, readers.Get(p.rank));
    absl::Status s = ReadIntoSlice(*reader, p.meta.name(), SliceBox(p.meta), whole, format::DTypeSize(t.dtype), dst);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("rank ", p.rank, ": ", s.message()));
  }
  return absl::OkStatus();
}

std::string Header(const std::vector<const Planned*>& tensors, absl::string_view job, uint64_t step) {
  std::string json = absl::StrCat("{\"__metadata__\":{\"format\":\"pt\",\"ckptd.job\":", JsonString(job),
                                  ",\"ckptd.step\":\"", step, "\"}");
  uint64_t offset = 0;
  for (const Planned* t : tensors) {
    absl::StrAppend(&json, ",", JsonString(t->name), ":{\"dtype\":\"", SafetensorsDType(t->dtype),
                    "\",\"shape\":[", absl::StrJoin(t->shape, ","), "],\"data_offsets\":[", offset, ",",
                    offset + t->bytes, "]}");
    offset += t->bytes;
  }
  json.push_back('}');
  // The data that follows starts 8-byte aligned.
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string header(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) header[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return header + json;
}

std::string PartialPath(const std::string& dir, const std::string& file) {
  return absl::StrCat(dir, "/.", file, ".partial");
}

// Writes `file` under its temporary name (PartialPath), synced; removes it
// on failure.
absl::Status WriteFile(FileSystem* fs, Readers& readers, const std::string& dir, const std::string& file,
                       const std::vector<const Planned*>& tensors, absl::string_view job, uint64_t step) {
  const std::string temp = PartialPath(dir, file);
  OpenOptions options;
  options.direct_io = false;
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, fs->NewWritableFile(temp, options));
  bool done = false;
  auto cleanup = [&] {
    if (!done) {
      (void)out->Close();
      (void)fs->RemoveFile(temp);
    }
  };
  const std::string header = Header(tensors, job, step);
  absl::Status s = out->Write(0, header.data(), header.size()).status();
  uint64_t offset = header.size();
  for (size_t i = 0; s.ok() && i < tensors.size(); ++i) {
    const Planned& t = *tensors[i];
    absl::StatusOr<std::unique_ptr<char[]>> buffer = Allocate(t.bytes, "the tensor");
    if (buffer.ok()) s = Assemble(readers, t, buffer->get());
    if (!buffer.ok() || !s.ok()) {
      const absl::Status& e = buffer.ok() ? s : buffer.status();
      s = absl::Status(e.code(), absl::StrCat("tensor ", Quoted(t.name), ": ", e.message()));
      break;
    }
    if (t.bytes > 0) s = out->Write(offset, buffer->get(), t.bytes).status();
    if (s.ok()) s = out->WaitAll();  // before the buffer goes
    offset += t.bytes;
  }
  if (s.ok()) s = out->Sync();
  if (s.ok()) s = out->Close();
  if (s.ok()) done = true;
  cleanup();
  return s;
}

// A file name an export writes: model.safetensors, its index, or
// model-NNNNN-of-NNNNN.safetensors.
bool IsExportFileName(absl::string_view name) {
  if (name == "model.safetensors" || name == "model.safetensors.index.json") return true;
  if (!absl::ConsumePrefix(&name, "model-") || !absl::ConsumeSuffix(&name, ".safetensors")) return false;
  // NNNNN-of-NNNNN
  const std::vector<absl::string_view> parts = absl::StrSplit(name, "-of-");
  return parts.size() == 2 && std::all_of(parts.begin(), parts.end(), [](absl::string_view p) {
           return !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
         });
}

}  // namespace

absl::StatusOr<SafetensorsExport> ExportSafetensors(CheckpointStore& store, absl::string_view job,
                                                    std::optional<uint64_t> step, const std::string& out_dir,
                                                    const SafetensorsExportOptions& options) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(job));
  if (options.components.empty()) return absl::InvalidArgumentError("no state component to export");
  if (options.max_file_bytes == 0) return absl::InvalidArgumentError("the file size limit must be positive");
  CKPTD_ASSIGN_OR_RETURN(std::vector<StepInfo> steps, store.ListSteps(job));
  const StepInfo* info = nullptr;
  for (const StepInfo& s : steps) {
    if (step ? s.step == *step : s.state == StepState::kCommitted && !s.quarantined) info = &s;
  }
  if (info == nullptr) {
    return step ? absl::NotFoundError(absl::StrCat("job ", job, " has no step ", *step))
                : absl::NotFoundError(absl::StrCat("job ", job, " has no intact committed step"));
  }
  if (info->state != StepState::kCommitted) {
    return absl::FailedPreconditionError(absl::StrCat("step ", info->step, " of job ", job, " is not committed (",
                                                      StepStateName(info->state),
                                                      info->detail.empty() ? "" : ": ", info->detail, ")"));
  }
  if (info->quarantined) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", info->step, " of job ", job, " is quarantined: ", *info->quarantined));
  }
  SafetensorsExport result;
  result.job = std::string(job);
  result.step = info->step;
  const ckptd::v1::StepManifest& manifest = *info->manifest;

  base::ThreadPool pool(options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency()));
  Readers readers(store, result.job, result.step, manifest, &pool);
  // Every shard's index, for the tensors of the chosen components.
  std::map<std::string, std::vector<Piece>> by_name;
  for (const auto& ref : manifest.shards()) {
    CKPTD_ASSIGN_OR_RETURN(ShardReader * reader, readers.Get(ref.rank()));
    for (const Tensor& t : reader->index().tensors()) {
      if (std::find(options.components.begin(), options.components.end(), t.component()) ==
          options.components.end()) {
        continue;
      }
      // RNG state and data cursors are each rank's own: exported per rank.
      const bool per_rank = (t.component() == ckptd::v1::RNG || t.component() == ckptd::v1::DATA_CURSOR) &&
                            manifest.world_size() > 1;
      by_name[per_rank ? PerRankName(ref.rank(), t.name()) : t.name()].push_back(
          Piece{ref.rank(), t});
    }
  }
  if (by_name.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("step ", result.step, " of job ", job,
                                                      " has no tensor of the components to export"));
  }
  std::vector<Planned> planned;
  for (auto& [name, pieces] : by_name) {
    if (name == "__metadata__") {
      return absl::FailedPreconditionError("tensor '__metadata__': the name is reserved by the safetensors format");
    }
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.rank < b.rank; });
    if (OpaqueAndDifferent(pieces)) {
      // Opaque bytes each rank holds its own version of (a framework's
      // record of the rank that saved it): exported per rank, as RNG state.
      for (Piece& p : pieces) {
        std::string own = PerRankName(p.rank, name);
        if (by_name.count(own) > 0) {
          return absl::FailedPreconditionError(absl::StrCat("tensor ", Quoted(name), " differs by rank, and ",
                                                            Quoted(own), ", the name of rank ", p.rank,
                                                            "'s copy, is taken by another tensor"));
        }
        std::vector<Piece> one;
        one.push_back(std::move(p));
        CKPTD_ASSIGN_OR_RETURN(Planned t, PlanTensor(own, std::move(one)));
        planned.push_back(std::move(t));
      }
      continue;
    }
    CKPTD_ASSIGN_OR_RETURN(Planned t, PlanTensor(name, std::move(pieces)));
    planned.push_back(std::move(t));
  }
  std::sort(planned.begin(), planned.end(), [](const Planned& a, const Planned& b) { return a.name < b.name; });
  // Files of at most max_file_bytes of tensors, in name order.
  std::vector<std::vector<const Planned*>> files(1);
  uint64_t in_file = 0;
  for (const Planned& t : planned) {
    if (!files.back().empty() && in_file + t.bytes > options.max_file_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().push_back(&t);
    in_file += t.bytes;
  }
  FileSystem* fs = store.fs();
  CKPTD_RETURN_IF_ERROR(CreateDirs(fs, out_dir));
  // Every file is written under a temporary name first: an export that
  // fails leaves the directory's earlier export as it was.
  std::vector<std::string> names;
  auto remove_partials = [&] {
    for (const std::string& n : names) (void)fs->RemoveFile(PartialPath(out_dir, n));
  };
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string name = files.size() == 1 ? "model.safetensors"
                                               : absl::StrFormat("model-%05d-of-%05d.safetensors", f + 1,
                                                                 files.size());
    if (absl::Status w = WriteFile(fs, readers, out_dir, name, files[f], job, result.step); !w.ok()) {
      remove_partials();
      return w;
    }
    names.push_back(name);
    for (const Planned* t : files[f]) {
      result.tensors.push_back({t->name, name, std::string(SafetensorsDType(t->dtype)), t->shape, t->bytes,
                                static_cast<int>(t->pieces.size())});
      result.bytes += t->bytes;
    }
  }
  // Then the earlier index goes before any of its files is replaced, so
  // that it never names a mix of two exports; the new index comes last.
  const std::string index_path = absl::StrCat(out_dir, "/model.safetensors.index.json");
  absl::Status moved = fs->RemoveFile(index_path);
  if (absl::IsNotFound(moved)) moved = absl::OkStatus();
  for (size_t i = 0; moved.ok() && i < names.size(); ++i) {
    moved = fs->Rename(PartialPath(out_dir, names[i]), absl::StrCat(out_dir, "/", names[i]));
  }
  if (!moved.ok()) {
    remove_partials();
    return moved;
  }
  result.files = names;
  if (files.size() > 1) {
    std::string index = absl::StrCat("{\n  \"metadata\": {\"total_size\": ", result.bytes, ", \"ckptd.job\": ",
                                     JsonString(job), ", \"ckptd.step\": \"", result.step,
                                     "\"},\n  \"weight_map\": {");
    for (size_t i = 0; i < result.tensors.size(); ++i) {
      absl::StrAppend(&index, i == 0 ? "\n" : ",\n", "    ", JsonString(result.tensors[i].name), ": ",
                      JsonString(result.tensors[i].file));
    }
    index.append("\n  }\n}\n");
    CKPTD_RETURN_IF_ERROR(WriteFileAtomically(fs, index_path, index));
    result.files.push_back("model.safetensors.index.json");
  }
  // Files of an earlier export into the same directory that this one did
  // not write would be read with it (a loader takes model.safetensors
  // before an index): they go, once the new files are in place.
  CKPTD_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs->ListDir(out_dir));
  for (const FileInfo& e : entries) {
    if (e.is_directory || !IsExportFileName(e.name) ||
        std::find(result.files.begin(), result.files.end(), e.name) != result.files.end()) {
      continue;
    }
    CKPTD_RETURN_IF_ERROR(fs->RemoveFile(absl::StrCat(out_dir, "/", e.name)));
  }
  CKPTD_RETURN_IF_ERROR(fs->SyncDir(out_dir));
  return result;
}

}  // namespace ckptd::storage
