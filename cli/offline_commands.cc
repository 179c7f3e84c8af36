#include "cli/offline_commands.h"

#include <unistd.h>

#include <cstdlib>
#include <map>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/flags.h"
#include "base/format.h"
#include "base/json.h"
#include "base/limits.h"
#include "format/checksum.h"
#include "storage/layout.h"
#include "storage/shard_index.h"
#include "storage/safetensors_export.h"
#include "storage/shard_reader.h"
#include "storage/store.h"

namespace ckptd::cli {

using base::JsonWriter;
using ckptd::v1::Tensor;

const char kInspectHelp[] =
    "usage: ckptctl inspect <shard file> [--json] [--chunks]\n"
    "\n"
    "Shows what a shard file holds: its job, step and rank, and for every tensor\n"
    "the component, dtype, shape, sharding, raw and stored size, compression\n"
    "ratio, and the codecs of its chunks. Only the header, footer and index are\n"
    "read and checked; use `ckptctl verify` to check the data.\n"
    "\n"
    "  --json     one JSON object instead of tables\n"
    "  --chunks   also list every chunk (offset, lengths, codec, checksum)\n";

const char kVerifyHelp[] =
    "usage: ckptctl verify --root <dir|s3://bucket/prefix> [--job J] [--step S] [--json] [--threads N]\n"
    "\n"
    "Reads committed steps back from a storage root and checks every shard\n"
    "against its MANIFEST and every chunk against its checksum. Without --job,\n"
    "every job under the root; without --step, every committed step.\n"
    "Failures name the file, tensor, block and chunk. --threads N: decoder\n"
    "threads, 1..1024 (default: one per hardware thread).\n"
    "\n"
    "exit status: 0 all verified, 1 a step failed (or the job/step named is not\n"
    "committed), 2 usage error\n";

const char kExportHelp[] =
    "usage: ckptctl export --root <dir|s3://bucket/prefix> --job J [--step S] --out DIR [--format safetensors]\n"
    "                      [--components LIST] [--max-file-bytes N] [--threads N] [--json]\n"
    "\n"
    "Writes the full (unsharded) tensors of a committed step as safetensors files,\n"
    "the format inference and evaluation tools read. A tensor sharded over ranks\n"
    "(a global shape and each rank's offsets) is put together from every rank's\n"
    "slice; a tensor replicated over ranks is written once. Every byte is checked\n"
    "against the shards' checksums on the way out. Files are written under a\n"
    "temporary name and renamed into DIR (created if missing); files of the same\n"
    "names there are replaced.\n"
    "\n"
    "  --step S            default: the newest intact committed step\n"
    "  --format F          safetensors (the only format, and the default)\n"
    "  --components LIST   comma-separated: params (default), grads, optimizer, rng,\n"
    "                      data_cursor, or all; rng and data_cursor are bytes (U8),\n"
    "                      each rank's named rank<r>/<name>\n"
    "  --max-file-bytes N  tensors beyond N bytes (K/M/G/T suffixes: powers of 1024)\n"
    "                      go into several files, model-00001-of-0000N.safetensors,\n"
    "                      with model.safetensors.index.json naming each tensor's\n"
    "                      file (default 5000000000; one file: model.safetensors)\n"
    "  --threads N         decoder threads, 1..1024 (default: one per hardware thread)\n"
    "  --json              one JSON object: the files and every tensor; on failure\n"
    "                      {\"error\": {\"code\", \"status\", \"message\"}} (the canonical\n"
    "                      status code and name)\n"
    "\n"
    "exit status: 0 exported, 1 the step cannot be exported (not committed,\n"
    "quarantined, damaged, tensors whose slices do not fit together), 2 usage error\n";

const char kStartFreshHelp[] =
    "usage: ckptctl start-fresh --root <dir|s3://bucket/prefix> --job J [--note TEXT]\n"
    "\n"
    "Lets job J start from scratch although it has committed steps, when every\n"
    "one of them is quarantined (damaged). A restart of such a job is held back\n"
    "rather than silently throwing the training away: the trainers are told,\n"
    "and `ckptctl status` shows it. This records the choice in the job's\n"
    "directory, for the committed steps up to the newest now (a step committed\n"
    "later is not covered), with --note (default: who and when). The next\n"
    "restart starts fresh, with a coordinator or a lone agent. Refused when the\n"
    "job has an intact committed step: a restart loads that.\n"
    "\n"
    "exit status: 0 recorded, 1 refused or storage error, 2 usage error\n";

namespace {

// {"error": {"code", "status", "message"}}: a failure for --json readers.
void PrintJsonError(const absl::Status& s, std::ostream& out) {
  JsonWriter w;
  w.BeginObject();
  w.Key("error");
  w.BeginObject();
  w.Field("code", static_cast<int>(s.code()));
  w.Field("status", absl::StatusCodeToString(s.code()));
  w.Field("message", s.message());
  w.EndObject();
  w.EndObject();
  out << w.str() << "\n";
}

std::string ShapeString(const google::protobuf::RepeatedField<uint64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

double Ratio(uint64_t raw, uint64_t stored) { return stored == 0 ? 1.0 : static_cast<double>(raw) / stored; }

struct TensorStats {
  uint64_t stored = 0;
  int chunks = 0;
  int zstd_chunks = 0;
};

TensorStats StatsOf(const Tensor& t) {
  TensorStats s;
  for (const auto& b : t.blocks()) {
    for (const auto& c : b.chunks()) {
      s.stored += c.stored_length();
      ++s.chunks;
      if (c.codec() == ckptd::v1::ZSTD) ++s.zstd_chunks;
    }
  }
  return s;
}

std::string CodecName(ckptd::v1::Codec c) { return c == ckptd::v1::ZSTD ? "zstd" : c == ckptd::v1::RAW ? "raw" : "?"; }
std::string FilterName(ckptd::v1::Filter f) { return f == ckptd::v1::BYTE_PLANES ? "byte-planes" : "none"; }

void PrintInspectJson(const storage::ShardReader& r, bool chunks, std::ostream& out) {
  const ckptd::v1::ShardIndex& idx = r.index();
  JsonWriter w;
  w.BeginObject();
  w.Field("file", r.path());
  w.Field("format_version", idx.format_version());
  w.Field("job", idx.job());
  w.Field("step", idx.step());
  w.Field("rank", idx.rank());
  w.Field("world_size", idx.world_size());
  w.Field("created", absl::FormatTime(absl::RFC3339_sec, absl::FromUnixNanos(idx.created_unix_nanos()),
                                      absl::UTCTimeZone()));
  w.Field("file_length", r.file_length());
  w.Field("index_xxh3", format::ChecksumHex(r.index_xxh3()));
  w.Field("raw_bytes", idx.raw_bytes());
  w.Field("stored_bytes", idx.stored_bytes());
  w.Field("ratio", Ratio(idx.raw_bytes(), idx.stored_bytes()));
  w.Key("tensors");
  w.BeginArray();
  for (const Tensor& t : idx.tensors()) {
    const TensorStats s = StatsOf(t);
    w.BeginObject();
    w.Field("name", t.name());
    w.Field("component", storage::ComponentName(t.component()));
    w.Field("dtype", storage::DTypeName(t.dtype()));
    w.Key("shape");
    w.BeginArray();
    for (uint64_t d : t.shape()) w.Uint(d);
    w.EndArray();
    w.Key("global_shape");
    w.BeginArray();
    for (uint64_t d : t.global_shape()) w.Uint(d);
    w.EndArray();
    w.Key("offsets");
    w.BeginArray();
    for (uint64_t d : t.offsets()) w.Uint(d);
    w.EndArray();
    if (t.has_replica()) {
      // A share of a tensor the group's ranks hold the same (docs/format.md).
      w.Key("replica");
      w.BeginObject();
      w.Field("group", t.replica().group());
      w.Field("count", t.replica().count());
      w.Field("index", t.replica().index());
      w.Key("shape");
      w.BeginArray();
      for (uint64_t d : t.replica().shape()) w.Uint(d);
      w.EndArray();
      w.EndObject();
    }
    w.Field("device", t.device().kind() == ckptd::v1::Device::CUDA ? absl::StrCat("cuda:", t.device().index())
                                                                    : std::string("host"));
    w.Field("raw_bytes", t.raw_length());
    w.Field("stored_bytes", s.stored);
    w.Field("ratio", Ratio(t.raw_length(), s.stored));
    w.Field("blocks", t.blocks_size());
    w.Field("chunks", s.chunks);
    w.Field("zstd_chunks", s.zstd_chunks);
    w.Field("raw_chunks", s.chunks - s.zstd_chunks);
    if (chunks) {
      w.Key("block_list");
      w.BeginArray();
      for (const auto& b : t.blocks()) {
        w.BeginObject();
        w.Field("raw_offset", b.raw_offset());
        w.Field("raw_length", b.raw_length());
        w.Field("filter", FilterName(b.filter()));
        w.Field("raw_xxh3", format::ChecksumHex(b.raw_xxh3()));
        w.Key("chunks");
        w.BeginArray();
        for (const auto& c : b.chunks()) {
          w.BeginObject();
          w.Field("file_offset", c.file_offset());
          w.Field("stored_length", c.stored_length());
          w.Field("raw_length", c.raw_length());
          w.Field("codec", CodecName(c.codec()));
          w.Field("stored_xxh3", format::ChecksumHex(c.stored_xxh3()));
          w.EndObject();
        }
        w.EndArray();
        w.EndObject();
      }
      w.EndArray();
    }
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  out << w.str() << "\n";
}

void PrintInspectText(const storage::ShardReader& r, bool chunks, std::ostream& out) {
  const ckptd::v1::ShardIndex& idx = r.index();
  out << "shard   " << base::TerminalSafe(r.path()) << "\n";
  out << absl::StrFormat("job     %s  step %d  rank %d of %d  format v%d\n", base::TerminalSafe(idx.job()), idx.step(),
                         idx.rank(), idx.world_size(), idx.format_version());
  out << "created "
      << absl::FormatTime(absl::RFC3339_sec, absl::FromUnixNanos(idx.created_unix_nanos()), absl::UTCTimeZone())
      << "\n";
  out << absl::StrFormat("size    %s raw, %s stored, ratio %.3f, file %s, index xxh3 %s\n",
                         base::HumanBytes(idx.raw_bytes()), base::HumanBytes(idx.stored_bytes()),
                         Ratio(idx.raw_bytes(), idx.stored_bytes()), base::HumanBytes(r.file_length()),
                         format::ChecksumHex(r.index_xxh3()));
  out << absl::StrFormat("\n%-32s %-11s %-9s %-18s %-22s %10s %10s %6s %7s %s\n", "TENSOR", "COMPONENT", "DTYPE",
                         "SHAPE", "SLICE OF", "RAW", "STORED", "RATIO", "CHUNKS", "CODECS");
  for (const Tensor& t : idx.tensors()) {
    const TensorStats s = StatsOf(t);
    std::string slice = "-";
    if (t.global_shape_size() > 0) {
      slice = absl::StrCat(ShapeString(t.global_shape()), "@", ShapeString(t.offsets()));
    }
    out << absl::StrFormat("%-32s %-11s %-9s %-18s %-22s %10s %10s %6.3f %7d zstd %d, raw %d\n",
                           absl::CHexEscape(t.name()), storage::ComponentName(t.component()),
                           storage::DTypeName(t.dtype()), ShapeString(t.shape()), slice,
                           base::HumanBytes(t.raw_length()), base::HumanBytes(s.stored), Ratio(t.raw_length(), s.stored),
                           s.chunks, s.zstd_chunks, s.chunks - s.zstd_chunks);
    if (t.has_replica()) {
      out << absl::StrFormat("    share %d of %d of replica group '%s' (the whole: %s)\n", t.replica().index() + 1,
                             t.replica().count(), base::TerminalSafe(t.replica().group()),
                             ShapeString(t.replica().shape()));
    }
    if (!chunks) continue;
    for (int b = 0; b < t.blocks_size(); ++b) {
      const auto& block = t.blocks(b);
      for (int c = 0; c < block.chunks_size(); ++c) {
        const auto& ch = block.chunks(c);
        out << absl::StrFormat("    block %d chunk %d  offset %d  stored %d  raw %d  %s%s  xxh3 %s\n", b, c,
                               ch.file_offset(), ch.stored_length(), ch.raw_length(), CodecName(ch.codec()),
                               block.filter() == ckptd::v1::BYTE_PLANES ? absl::StrCat(" plane ", c) : "",
                               format::ChecksumHex(ch.stored_xxh3()));
      }
    }
  }
}

}  // namespace

int RunInspect(storage::FileSystem* fs, const std::vector<std::string>& argv, std::ostream& out,
               std::ostream& err) {
  absl::StatusOr<base::Args> args = base::Args::Parse(argv, {}, {"json", "chunks", "help"});
  if (!args.ok() || args->Has("help") || args->positional().size() != 1) {
    if (!args.ok()) err << "ckptctl inspect: " << args.status().message() << "\n";
    (args.ok() && args->Has("help") ? out : err) << kInspectHelp;
    return args.ok() && args->Has("help") ? base::kExitOk : base::kExitUsage;
  }
  storage::ShardReadOptions options;
  options.threads = 1;
  options.follow_symlinks = true;  // a path the operator names, not one under a storage root
  absl::StatusOr<std::unique_ptr<storage::ShardReader>> reader =
      storage::ShardReader::Open(fs, args->positional()[0], options);
  if (!reader.ok()) {
    err << "ckptctl inspect: " << base::TerminalSafe(reader.status().message()) << "\n";
    return base::kExitFailed;
  }
  if (args->Has("json")) {
    PrintInspectJson(**reader, args->Has("chunks"), out);
  } else {
    PrintInspectText(**reader, args->Has("chunks"), out);
  }
  return base::kExitOk;
}

int RunVerify(storage::FileSystem* fs, const std::vector<std::string>& argv, std::ostream& out,
              std::ostream& err) {
  absl::StatusOr<base::Args> args = base::Args::Parse(argv, {"root", "job", "step", "threads"}, {"json", "help"});
  if (args.ok() && args->Has("help")) {
    out << kVerifyHelp;
    return base::kExitOk;
  }
  absl::StatusOr<std::optional<uint64_t>> step_flag =
      args.ok() ? args->GetUint("step") : absl::StatusOr<std::optional<uint64_t>>(args.status());
  // Threads are created per shard read: a count the machine cannot start is
  // refused here rather than failing (or throwing) there.
  absl::StatusOr<std::optional<uint64_t>> threads_flag =
      args.ok() ? args->GetUintInRange("threads", 1, base::kMaxThreads)
                : absl::StatusOr<std::optional<uint64_t>>(args.status());
  if (!args.ok() || !step_flag.ok() || !threads_flag.ok() || !args->Get("root") ||
      !args->positional().empty() || (*step_flag && !args->Get("job"))) {
    std::string why = !args.ok()                ? std::string(args.status().message())
                      : !step_flag.ok()         ? std::string(step_flag.status().message())
                      : !threads_flag.ok()      ? std::string(threads_flag.status().message())
                      : !args->Get("root")      ? "--root is required"
                      : !args->positional().empty() ? absl::StrCat("unexpected argument ", args->positional()[0])
                                                    : "--step needs --job";
    err << "ckptctl verify: " << why << "\n" << kVerifyHelp;
    return base::kExitUsage;
  }
  const bool json = args->Has("json");
  storage::CheckpointStore store(fs, *args->Get("root"));
  storage::ShardReadOptions options;
  if (*threads_flag) options.threads = static_cast<int>(**threads_flag);

  std::vector<std::string> jobs;
  if (std::optional<std::string> job = args->Get("job")) {
    if (absl::Status s = storage::ValidateJobName(*job); !s.ok()) {
      err << "ckptctl verify: " << s.message() << "\n";
      return base::kExitUsage;
    }
    jobs.push_back(*job);
  } else {
    absl::StatusOr<std::vector<std::string>> all = store.ListJobs();
    if (!all.ok()) {
      err << "ckptctl verify: " << base::TerminalSafe(all.status().message()) << "\n";
      return base::kExitFailed;
    }
    jobs = *all;
  }

  JsonWriter w;
  w.BeginObject();
  w.Field("root", store.root());
  w.Key("steps");
  w.BeginArray();
  int checked = 0;
  int failed = 0;
  std::vector<std::string> notes;  // failures that are not a step's own problems
  for (const std::string& job : jobs) {
    const std::string shown = base::TerminalSafe(job);  // a directory's name
    absl::StatusOr<std::vector<storage::StepInfo>> steps = store.ListSteps(job);
    if (!steps.ok()) {
      notes.push_back(absl::StrCat("job ", job, ": ", steps.status().message()));
      continue;
    }
    bool found_step = false;
    for (const storage::StepInfo& info : *steps) {
      if (*step_flag && info.step != **step_flag) continue;
      found_step = true;
      if (info.state == storage::StepState::kIncomplete) {
        if (*step_flag) notes.push_back(absl::StrCat("job ", job, " step ", info.step, " is not committed"));
        if (!json) {
          out << absl::StrFormat("%-24s step %-10d INCOMPLETE (no MANIFEST; not a checkpoint)\n", shown, info.step);
        }
        continue;
      }
      ++checked;
      w.BeginObject();
      w.Field("job", job);
      w.Field("step", info.step);
      if (info.state == storage::StepState::kCorrupt) {
        ++failed;
        w.Field("ok", false);
        w.Key("problems");
        w.BeginArray();
        w.BeginObject();
        w.Field("file", storage::ManifestPath(store.root(), job, info.step));
        w.Field("message", info.detail);
        w.EndObject();
        w.EndArray();
        w.EndObject();
        if (!json) {
          out << absl::StrFormat("%-24s step %-10d FAIL\n    %s\n", shown, info.step, base::TerminalSafe(info.detail));
        }
        continue;
      }
      absl::StatusOr<storage::StepVerifyReport> report = store.VerifyStep(job, info.step, options);
      if (!report.ok()) {
        ++failed;
        w.Field("ok", false);
        w.Key("problems");
        w.BeginArray();
        w.BeginObject();
        w.Field("message", report.status().message());
        w.EndObject();
        w.EndArray();
        w.EndObject();
        if (!json) {
          out << absl::StrFormat("%-24s step %-10d FAIL\n    %s\n", shown, info.step,
                                 base::TerminalSafe(report.status().message()));
        }
        continue;
      }
      if (!report->ok()) ++failed;
      w.Field("ok", report->ok());
      if (info.quarantined) w.Field("quarantined", *info.quarantined);
      w.Field("shards", report->shards);
      w.Field("raw_bytes", report->raw_bytes);
      w.Field("stored_bytes", report->stored_bytes);
      w.Key("problems");
      w.BeginArray();
      for (const storage::VerifyProblem& p : report->problems) {
        w.BeginObject();
        w.Field("file", p.file);
        if (!p.tensor.empty()) w.Field("tensor", p.tensor);
        if (p.block >= 0) w.Field("block", p.block);
        if (p.chunk >= 0) w.Field("chunk", p.chunk);
        w.Field("message", p.message);
        w.EndObject();
      }
      w.EndArray();
      w.EndObject();
      if (!json) {
        out << absl::StrFormat("%-24s step %-10d %s  %d shards, %s raw, %s stored\n", shown, info.step,
                               report->ok() ? "OK  " : "FAIL", report->shards, base::HumanBytes(report->raw_bytes),
                               base::HumanBytes(report->stored_bytes));
        for (const storage::VerifyProblem& p : report->problems) out << "    " << base::TerminalSafe(p.message) << "\n";
        if (info.quarantined) {
          out << "    quarantined (never restored): " << base::TerminalSafe(*info.quarantined) << "\n";
        }
      }
    }
    if (*step_flag && !found_step) {
      notes.push_back(absl::StrCat("job ", job, " has no step ", **step_flag));
    }
  }
  w.EndArray();
  w.Field("checked", checked);
  w.Field("failed", failed);
  w.Key("errors");
  w.BeginArray();
  for (const std::string& n : notes) w.String(n);
  w.EndArray();
  const bool ok = failed == 0 && notes.empty();
  w.Field("ok", ok);
  w.EndObject();
  if (json) {
    out << w.str() << "\n";
  } else {
    for (const std::string& n : notes) out << "error: " << base::TerminalSafe(n) << "\n";
    out << absl::StrFormat("%d step(s) checked, %d failed: %s\n", checked, failed, ok ? "OK" : "FAILED");
  }
  return ok ? base::kExitOk : base::kExitFailed;
}

int RunExport(storage::FileSystem* fs, const std::vector<std::string>& argv, std::ostream& out,
              std::ostream& err) {
  absl::StatusOr<base::Args> args = base::Args::Parse(
      argv, {"root", "job", "step", "out", "format", "components", "max-file-bytes", "threads"}, {"json", "help"});
  if (args.ok() && args->Has("help")) {
    out << kExportHelp;
    return base::kExitOk;
  }
  auto usage = [&](absl::string_view why) {
    err << "ckptctl export: " << why << "\n(`ckptctl export --help` describes the flags)\n";
    if (args.ok() && args->Has("json")) PrintJsonError(absl::InvalidArgumentError(why), out);
    return base::kExitUsage;
  };
  if (!args.ok()) return usage(args.status().message());
  for (const char* flag : {"root", "job", "out"}) {
    if (!args->Get(flag)) return usage(absl::StrCat("--", flag, " is required"));
  }
  if (!args->positional().empty()) return usage(absl::StrCat("unexpected argument \"", args->positional()[0], "\""));
  if (absl::Status s = storage::ValidateJobName(*args->Get("job")); !s.ok()) return usage(s.message());
  if (std::optional<std::string> format = args->Get("format"); format && *format != "safetensors") {
    return usage(absl::StrCat("--format: \"", absl::CHexEscape(*format), "\" is not a format (safetensors)"));
  }
  storage::SafetensorsExportOptions options;
  absl::StatusOr<std::optional<uint64_t>> step = args->GetUint("step");
  if (!step.ok()) return usage(step.status().message());
  for (absl::Status s : {args->ReadUint("max-file-bytes", 1, UINT64_MAX, &options.max_file_bytes, true),
                         args->ReadUint("threads", 1, base::kMaxThreads, &options.threads)}) {
    if (!s.ok()) return usage(s.message());
  }
  if (std::optional<std::string> list = args->Get("components")) {
    absl::StatusOr<std::vector<ckptd::v1::Component>> components = storage::ParseComponentList(*list);
    if (!components.ok()) return usage(absl::StrCat("--components: ", components.status().message()));
    options.components = *std::move(components);
  }
  storage::CheckpointStore store(fs, *args->Get("root"));
  const std::string dir = *args->Get("out");
  absl::StatusOr<storage::SafetensorsExport> done =
      storage::ExportSafetensors(store, *args->Get("job"), *step, dir, options);
  if (!done.ok()) {
    err << "ckptctl export: " << base::TerminalSafe(done.status().message()) << "\n";
    if (args->Has("json")) PrintJsonError(done.status(), out);
    return base::kExitFailed;
  }
  if (args->Has("json")) {
    JsonWriter w;
    w.BeginObject();
    w.Field("job", done->job);
    w.Field("step", done->step);
    w.Field("out", dir);
    w.Field("bytes", done->bytes);
    w.Key("files");
    w.BeginArray();
    for (const std::string& f : done->files) w.String(f);
    w.EndArray();
    w.Key("tensors");
    w.BeginArray();
    for (const storage::ExportedTensor& t : done->tensors) {
      w.BeginObject();
      w.Field("name", t.name);
      w.Field("file", t.file);
      w.Field("dtype", t.dtype);
      w.Key("shape");
      w.BeginArray();
      for (uint64_t d : t.shape) w.Uint(d);
      w.EndArray();
      w.Field("bytes", t.bytes);
      w.Field("slices", t.slices);
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
    out << w.str() << "\n";
    return base::kExitOk;
  }
  int assembled = 0;
  for (const storage::ExportedTensor& t : done->tensors) assembled += t.slices > 1 ? 1 : 0;
  out << absl::StrFormat("exported step %d of job %s: %d tensors (%d put together from several ranks), %s, to %s\n",
                         done->step, done->job, done->tensors.size(), assembled, base::HumanBytes(done->bytes),
                         base::TerminalSafe(dir));
  for (const std::string& f : done->files) out << "  " << f << "\n";
  return base::kExitOk;
}

int RunStartFresh(storage::FileSystem* fs, const std::vector<std::string>& argv, std::ostream& out,
                  std::ostream& err) {
  absl::StatusOr<base::Args> args = base::Args::Parse(argv, {"root", "job", "note"}, {"help"});
  if (args.ok() && args->Has("help")) {
    out << kStartFreshHelp;
    return base::kExitOk;
  }
  if (!args.ok() || !args->Get("root") || !args->Get("job") || !args->positional().empty()) {
    const std::string why = !args.ok()              ? std::string(args.status().message())
                            : !args->Get("root")    ? "--root is required"
                            : !args->Get("job")     ? "--job is required"
                                                    : absl::StrCat("unexpected argument ", args->positional()[0]);
    err << "ckptctl start-fresh: " << base::TerminalSafe(why) << "\n" << kStartFreshHelp;
    return base::kExitUsage;
  }
  const std::string job = *args->Get("job");
  if (absl::Status s = storage::ValidateJobName(job); !s.ok()) {
    err << "ckptctl start-fresh: " << base::TerminalSafe(s.message()) << "\n";
    return base::kExitUsage;
  }
  std::string note = args->Get("note").value_or("");
  if (note.empty()) {
    const char* user = std::getenv("USER");
    note = absl::StrCat("ckptctl start-fresh by ", user != nullptr ? user : absl::StrCat("uid ", ::getuid()), " at ",
                        absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone()));
  }
  storage::CheckpointStore store(fs, *args->Get("root"));
  absl::StatusOr<uint64_t> over = store.AllowFreshStart(job, note);
  if (!over.ok()) {
    err << "ckptctl start-fresh: " << base::TerminalSafe(over.status().message()) << "\n";
    return base::kExitFailed;
  }
  out << "job " << job << " may start fresh over its committed steps up to " << *over
      << " (all quarantined); its next restart starts from scratch\n";
  return base::kExitOk;
}

}  // namespace ckptd::cli
