#include "bench/persist_bench.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/aligned_buffer.h"
#include "base/flags.h"
#include "base/format.h"
#include "base/json.h"
#include "base/limits.h"
#include "base/thread_pool.h"
#include "bench/bench_util.h"
#include "format/tensor_size.h"
#include "objstore/s3_options.h"
#include "objstore/storage_root.h"
#include "storage/layout.h"
#include "storage/posix_file_system.h"
#include "storage/shard_reader.h"
#include "storage/store.h"

namespace ckptd::bench {

using base::Args;
using base::JsonWriter;

const char kPersistHelp[] =
    "usage: ckptd-bench persist --dir <dir|s3://bucket/prefix> --bytes <n> [--codec none|zstd]\n"
    "                           [--dtype fp32|bf16] [--threads T] [--io-depth D] [--keep] [--json]\n"
    "                           [--compare] [--posix-dir <dir>] [--repeat N] [--step S]\n"
    "\n"
    "Writes a synthetic rank checkpoint (normally distributed weights, mean 0,\n"
    "std 0.02, plus RNG and data-cursor blobs) as a committed step of job `bench`\n"
    "under <dir>, reads it back with every chunk verified, and reports:\n"
    "  write_gbps  raw bytes / seconds until the step is durable and committed\n"
    "  read_gbps   raw bytes / seconds to read, decode and verify into memory\n"
    "  ratio       raw bytes / stored bytes\n"
    "--io-depth D sets the transfers kept in flight (default 8), for ckptd and fio.\n"
    "--compare also measures, on the same directory and bytes: fio sequential\n"
    "O_DIRECT io_uring write and read (fio_write_gbps, fio_read_gbps), and\n"
    "`zstd -1 -T<threads>` (zstd_cli_gbps, zstd_cli_ratio), and reports the\n"
    "ratios of ckptd to each.\n"
    "An object store (s3://bucket/prefix; endpoint and credentials from the\n"
    "AWS_* environment, as for ckptd-agent) is written as the agent writes it:\n"
    "parallel multipart uploads, parallel ranged reads. There --compare runs,\n"
    "instead of fio, boto3's transfer manager at its defaults (s3_transfer.py,\n"
    "beside this program) on the same raw bytes: upload and download\n"
    "(s3_client_upload_gbps, s3_client_download_gbps, write_vs_s3_client,\n"
    "read_vs_s3_client); and --posix-dir D persists the same step to the\n"
    "directory D in each round too (posix_write_gbps, and durable_time_vs_posix:\n"
    "the store's time until durable over D's).\n"
    "--repeat N runs N rounds (ckptd and the yardsticks, in alternating order)\n"
    "and reports medians. --bytes accepts K, M, G and T suffixes (powers of 1024).\n"
    "Ranges: --bytes 1..1T, --threads 1..1024 (default: one per core), --io-depth\n"
    "1..256, --repeat 1..100, --step 0..2^62 (default 1).\n"
    "Without --keep the step is removed afterwards.\n";

namespace {

// The largest --bytes (held in memory twice over) and --step.
constexpr uint64_t kMaxBytes = uint64_t{1} << 40;
constexpr uint64_t kMaxStep = uint64_t{1} << 62;

// Deterministic normal(0, stddev) samples (xorshift + Box-Muller).
void FillNormal(float* out, size_t n, float stddev, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&s] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  for (size_t i = 0; i < n; i += 2) {
    const double u1 = (static_cast<double>(next() >> 11) + 1.0) / 9007199254740993.0;
    const double u2 = static_cast<double>(next() >> 11) / 9007199254740992.0;
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(r * std::cos(2 * M_PI * u2) * stddev);
    if (i + 1 < n) out[i + 1] = static_cast<float>(r * std::sin(2 * M_PI * u2) * stddev);
  }
}

// Fills `bytes` of `dtype` data with normal(0, 0.02) values on `threads` threads.
void FillTensor(uint8_t* data, size_t bytes, bool bf16, int threads, uint64_t seed) {
  const size_t elem = bf16 ? 2 : 4;
  const size_t n = bytes / elem;
  std::vector<std::thread> workers;
  const size_t per = (n + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([=] {
      const size_t begin = std::min(n, per * t);
      const size_t end = std::min(n, begin + per);
      if (begin >= end) return;
      if (!bf16) {
        FillNormal(reinterpret_cast<float*>(data) + begin, end - begin, 0.02f, seed + t);
        return;
      }
      std::vector<float> tmp(1 << 16);
      for (size_t i = begin; i < end; i += tmp.size()) {
        const size_t m = std::min(tmp.size(), end - i);
        FillNormal(tmp.data(), m, 0.02f, seed + t * 1000003 + i);
        for (size_t j = 0; j < m; ++j) {
          uint32_t bits;
          std::memcpy(&bits, &tmp[j], 4);
          const uint16_t top = static_cast<uint16_t>(bits >> 16);
          std::memcpy(data + (i + j) * 2, &top, 2);
        }
      }
    });
  }
  for (std::thread& w : workers) w.join();
}

struct FioResult {
  std::optional<double> write_gbps;
  std::optional<double> read_gbps;
  std::string error;
};

// Sequential write then read of `bytes` with O_DIRECT and io_uring, 4 MiB
// blocks, at the queue depth ckptd uses, fsync at the end of the write: the
// same shape of I/O as a shard.
FioResult RunFio(const std::string& dir, uint64_t bytes, int depth) {
  FioResult r;
  const std::string file = storage::JoinPath(dir, "fio-bench.tmp");
  const std::string common = absl::StrCat("fio --name=ckptd --filename=", ShellQuote(file),
                                          " --bs=4m --direct=1 --ioengine=io_uring --iodepth=", depth, " --size=", bytes,
                                          " --output-format=json 2>/dev/null");
  std::optional<std::string> w = Capture(absl::StrCat(common, " --rw=write --end_fsync=1"));
  std::optional<std::string> rd = w ? Capture(absl::StrCat(common, " --rw=read")) : std::nullopt;
  std::remove(file.c_str());
  if (!w || !rd) {
    r.error = "fio did not run (is it installed?)";
    return r;
  }
  // fio reports bandwidth in bytes per second.
  if (std::optional<double> bw = JsonNumberAfter(*w, "write", "bw_bytes")) r.write_gbps = *bw / 1e9;
  if (std::optional<double> bw = JsonNumberAfter(*rd, "read", "bw_bytes")) r.read_gbps = *bw / 1e9;
  if (!r.write_gbps || !r.read_gbps) r.error = "could not read fio's JSON output";
  return r;
}

// `parts` one after the other into the local file `path` (page cache only).
absl::Status WriteParts(const std::string& path, const std::vector<std::pair<const uint8_t*, size_t>>& parts) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot create ", path));
  bool ok = true;
  for (const auto& [p, n] : parts) ok = ok && std::fwrite(p, 1, n, f) == n;
  ok = (std::fclose(f) == 0) && ok;
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot write ", path));
}

struct ZstdResult {
  std::optional<double> gbps;
  std::optional<double> ratio;
  std::string error;
};

// `zstd -1 -T<threads>` over the same raw bytes, read from the page cache and
// written to the same directory (without fsync, which favours zstd).
ZstdResult RunZstdCli(const std::string& dir, const std::vector<std::pair<const uint8_t*, size_t>>& parts,
                      int threads) {
  ZstdResult r;
  const std::string in = storage::JoinPath(dir, "zstd-bench.raw");
  const std::string out = in + ".zst";
  if (absl::Status s = WriteParts(in, parts); !s.ok()) {
    r.error = std::string(s.message());
  } else {
    uint64_t total = 0;
    for (const auto& part : parts) total += part.second;
    const absl::Time t0 = absl::Now();
    std::optional<std::string> res =
        Capture(absl::StrCat("zstd -q -f -1 -T", threads, " ", ShellQuote(in), " -o ", ShellQuote(out)));
    const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    if (res) {
      r.gbps = static_cast<double>(total) / secs / 1e9;
      struct stat st;
      if (::stat(out.c_str(), &st) == 0 && st.st_size > 0) r.ratio = static_cast<double>(total) / st.st_size;
    } else {
      r.error = "zstd did not run (is it installed?)";
    }
  }
  std::remove(in.c_str());
  std::remove(out.c_str());
  return r;
}

}  // namespace

int RunPersistBench(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  absl::StatusOr<Args> args =
      Args::Parse(argv, {"dir", "bytes", "codec", "dtype", "threads", "step", "repeat", "io-depth", "posix-dir"}, {"keep", "json", "compare", "help"});
  if (args.ok() && args->Has("help")) {
    out << kPersistHelp;
    return base::kExitOk;
  }
  auto usage = [&](const std::string& why) {
    err << "ckptd-bench persist: " << why << "\n" << kPersistHelp;
    return base::kExitUsage;
  };
  if (!args.ok()) return usage(std::string(args.status().message()));
  // Every number is parsed wide and checked against what the bench handles
  // before it is narrowed.
  uint64_t bytes = 0, step = 1;
  int threads = 0, repeat = 1, io_depth = storage::ShardWriteOptions().writes_in_flight;
  for (const absl::Status& s :
       {args->ReadUint("bytes", 1, kMaxBytes, &bytes, /*allow_suffix=*/true),
        args->ReadUint("threads", 1, base::kMaxThreads, &threads), args->ReadUint("step", 0, kMaxStep, &step),
        args->ReadUint("repeat", 1, 100, &repeat), args->ReadUint("io-depth", 1, 256, &io_depth)}) {
    if (!s.ok()) return usage(std::string(s.message()));
  }
  if (!args->Get("dir")) return usage("--dir is required");
  if (bytes == 0) return usage("--bytes is required");
  const std::string codec = args->Get("codec").value_or("zstd");
  const std::string dtype = args->Get("dtype").value_or("fp32");
  if (codec != "none" && codec != "zstd") return usage("--codec must be none or zstd");
  if (dtype != "fp32" && dtype != "bf16") return usage("--dtype must be fp32 or bf16");
  if (threads == 0) threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 1024u));
  const bool bf16 = dtype == "bf16";
  const size_t elem = bf16 ? 2 : 4;

  // A rank's state: parameters and two optimizer moments of equal size, and
  // small RNG and data-cursor blobs.
  const uint64_t total = bytes;
  const uint64_t per_tensor = (total / 3) / elem * elem;
  const uint64_t params_bytes = total - 2 * per_tensor - (total - 2 * per_tensor) % elem;
  struct Buffer {
    std::string name;
    ckptd::v1::Component component;
    ckptd::v1::DType dtype;
    base::AlignedBuffer data;
    size_t length;
  };
  std::vector<Buffer> buffers;
  auto add = [&](std::string name, ckptd::v1::Component c, ckptd::v1::DType d, size_t length) {
    buffers.push_back({std::move(name), c, d, base::AlignedBuffer(std::max<size_t>(length, 1)), length});
  };
  const ckptd::v1::DType float_dtype = bf16 ? ckptd::v1::BFLOAT16 : ckptd::v1::FLOAT32;
  try {
    add("model.params", ckptd::v1::PARAMS, float_dtype, params_bytes);
    add("optimizer.exp_avg", ckptd::v1::OPTIMIZER, float_dtype, per_tensor);
    add("optimizer.exp_avg_sq", ckptd::v1::OPTIMIZER, float_dtype, per_tensor);
    add("rng.state", ckptd::v1::RNG, ckptd::v1::BYTES, 5056);
    add("data.cursor", ckptd::v1::DATA_CURSOR, ckptd::v1::BYTES, 64);
  } catch (const std::bad_alloc&) {  // the one exception a size the user chose may raise
    err << "ckptd-bench persist: cannot allocate " << base::HumanBytes(total) << " (--bytes)\n";
    return base::kExitFailed;
  }
  for (size_t i = 0; i < 3; ++i) FillTensor(buffers[i].data.data(), buffers[i].length, bf16, threads, 17 + i);
  for (size_t i = 3; i < buffers.size(); ++i) {
    for (size_t j = 0; j < buffers[i].length; ++j) buffers[i].data.data()[j] = static_cast<uint8_t>(j * 131 + i);
  }

  std::vector<storage::TensorSource> sources;
  uint64_t raw_bytes = 0;
  for (const Buffer& b : buffers) {
    storage::TensorSource s;
    s.meta.set_name(b.name);
    s.meta.set_component(b.component);
    s.meta.set_dtype(b.dtype);
    s.meta.add_shape(b.length / format::DTypeSize(b.dtype));
    s.data = b.data.data();
    s.length = b.length;
    sources.push_back(std::move(s));
    raw_bytes += b.length;
  }

  std::unique_ptr<storage::PosixFileSystem> posix = storage::NewPosixFileSystem();
  const bool object_store = objstore::IsObjectStoreRoot(*args->Get("dir"));
  if (args->Get("posix-dir") && !object_store) return usage("--posix-dir goes with an s3:// --dir");
  absl::StatusOr<objstore::StorageRoot> root = objstore::OpenStorageRoot(*args->Get("dir"), posix.get());
  if (!root.ok()) {
    err << "ckptd-bench persist: " << root.status().message() << "\n";
    return base::kExitFailed;
  }
  const std::string dir = root->path;
  storage::FileSystem* fs = root->fs;
  const std::string job = "bench";
  // Every root the bench writes: --dir, and --posix-dir beside an object store.
  std::vector<std::pair<storage::FileSystem*, std::string>> roots = {{fs, dir}};
  if (std::optional<std::string> posix_dir = args->Get("posix-dir")) roots.emplace_back(posix.get(), *posix_dir);
  for (const auto& [root_fs, root_dir] : roots) {
    if (absl::Status s = storage::CreateDirs(root_fs, root_dir); !s.ok()) {
      err << "ckptd-bench persist: " << s.message() << "\n";
      return base::kExitFailed;
    }
    storage::CheckpointStore store(root_fs, root_dir);
    if (store.ReadManifest(job, step).ok() || root_fs->Stat(storage::StepDir(root_dir, job, step)).ok()) {
      err << "ckptd-bench persist: " << storage::StepDir(root_dir, job, step)
          << " already exists; remove it or pass another --step\n";
      return base::kExitFailed;
    }
  }
  // The yardsticks' local files: beside the data for a directory, in a
  // scratch folder for an object store.
  ScratchDir scratch;
  if (absl::Status s = scratch.Init(object_store ? std::nullopt : std::optional<std::string>(dir), "ckptd-bench-s3");
      !s.ok()) {
    err << "ckptd-bench persist: " << s.message() << "\n";
    return base::kExitFailed;
  }

  base::ThreadPool pool(threads);
  storage::ShardWriteOptions wopt;
  wopt.encode.compress = codec == "zstd";
  wopt.writes_in_flight = io_depth;
  storage::ShardReadOptions ropt;
  ropt.reads_in_flight = io_depth;
  std::vector<std::pair<const uint8_t*, size_t>> parts;
  for (const Buffer& b : buffers) parts.emplace_back(b.data.data(), b.length);

  // Each round measures ckptd, then the yardsticks, on the same root, so
  // that drifts of a shared disk or store affect both; medians over rounds
  // are reported.
  std::vector<double> write_runs, read_runs, posix_write_runs, posix_read_runs, fio_write_runs, fio_read_runs,
      zstd_runs, s3_up_runs, s3_down_runs;
  storage::ShardWriteResult written;
  FioResult fio;
  ZstdResult zstd;
  std::string s3_error;
  // ckptd's side of one round on one root: write + commit, then read back
  // verified; its throughputs go to `writes` and `reads`.
  auto run_ckptd = [&](storage::FileSystem* root_fs, const std::string& root_dir, bool keep,
                       std::vector<double>* writes, std::vector<double>* reads) -> bool {
    storage::CheckpointStore store(root_fs, root_dir);
    const absl::Time w0 = absl::Now();
    absl::Status status = store.PrepareStep(job, step);
    absl::StatusOr<storage::ShardWriteResult> result =
        status.ok() ? store.WriteShard(job, step, 0, 1, sources, wopt, &pool)
                    : absl::StatusOr<storage::ShardWriteResult>(status);
    absl::StatusOr<ckptd::v1::StepManifest> manifest =
        result.ok() ? store.CommitStep(job, step, 1) : absl::StatusOr<ckptd::v1::StepManifest>(result.status());
    const double write_secs = absl::ToDoubleSeconds(absl::Now() - w0);
    if (!manifest.ok()) {
      err << "ckptd-bench persist: write to " << root_dir << " failed: " << manifest.status().message() << "\n";
      (void)store.AbortStep(job, step);  // best effort; the error above is what matters
      return false;
    }
    written = *result;

    // Read back into fresh (pre-faulted) buffers, verifying every chunk.
    std::vector<base::AlignedBuffer> dest;
    std::vector<storage::TensorDest> dests;
    try {
      for (const Buffer& b : buffers) {
        dest.emplace_back(std::max<size_t>(b.length, 1));
        dests.push_back({b.name, dest.back().data(), b.length});
      }
    } catch (const std::bad_alloc&) {
      err << "ckptd-bench persist: cannot allocate " << base::HumanBytes(raw_bytes) << " to read back (--bytes)\n";
      return false;
    }
    const absl::Time r0 = absl::Now();
    absl::StatusOr<std::unique_ptr<storage::ShardReader>> reader =
        storage::ShardReader::Open(root_fs, storage::ShardPath(root_dir, job, step, 0), ropt, &pool);
    status = reader.ok() ? (*reader)->ReadTensors(dests) : reader.status();
    const double read_secs = absl::ToDoubleSeconds(absl::Now() - r0);
    for (size_t i = 0; status.ok() && i < buffers.size(); ++i) {
      if (std::memcmp(buffers[i].data.data(), dest[i].data(), buffers[i].length) != 0) {
        status = absl::DataLossError(absl::StrCat("tensor ", buffers[i].name, " read back differs"));
      }
    }
    if (!status.ok()) {
      err << "ckptd-bench persist: read from " << root_dir << " failed: " << status.message() << "\n";
      return false;
    }
    writes->push_back(raw_bytes / write_secs / 1e9);
    reads->push_back(raw_bytes / read_secs / 1e9);
    if (!keep) {
      if (absl::Status s = store.RemoveStep(job, step); !s.ok()) {
        err << "ckptd-bench persist: could not remove the benchmark step: " << s.message() << "\n";
        return false;
      }
    }
    return true;
  };
  // The S3 client's side: the same raw bytes as one file, uploaded and
  // downloaded by boto3's transfer manager, then deleted.
  auto run_s3_client = [&] {
    const std::string file = storage::JoinPath(scratch.path(), "s3-yardstick.raw");
    const std::string url = storage::JoinPath(dir, "s3-yardstick.raw");
    std::string why;
    if (absl::Status s = WriteParts(file, parts); !s.ok()) {
      why = std::string(s.message());
    } else if (absl::StatusOr<double> up = RunS3Yardstick("upload", url, file); !up.ok()) {
      why = std::string(up.status().message());
    } else if (absl::StatusOr<double> down = RunS3Yardstick("download", url, file); !down.ok()) {
      why = std::string(down.status().message());
    } else {
      s3_up_runs.push_back(*up);
      s3_down_runs.push_back(*down);
    }
    if (!why.empty()) s3_error = why;
    (void)fs->RemoveFile(url);  // best effort: it may not have been written
    std::remove(file.c_str());
  };
  // The yardsticks' side: fio on the same directory or the S3 client on the
  // same store, and the zstd CLI.
  auto run_yardsticks = [&] {
    if (object_store) {
      run_s3_client();
    } else {
      fio = RunFio(dir, base::AlignUp(raw_bytes, 1 << 20), io_depth);
      if (fio.write_gbps) fio_write_runs.push_back(*fio.write_gbps);
      if (fio.read_gbps) fio_read_runs.push_back(*fio.read_gbps);
    }
    if (codec == "zstd") {
      zstd = RunZstdCli(scratch.path(), parts, threads);
      if (zstd.gbps) zstd_runs.push_back(*zstd.gbps);
    }
  };
  // Everything but ckptd on --dir: ckptd on --posix-dir, the yardsticks.
  auto run_others = [&]() -> bool {
    if (roots.size() > 1 &&
        !run_ckptd(roots[1].first, roots[1].second, /*keep=*/false, &posix_write_runs, &posix_read_runs)) {
      return false;
    }
    if (args->Has("compare")) run_yardsticks();
    return true;
  };
  // Rounds alternate which side goes first, so that neither always follows
  // the other's deletes (which discard blocks on some disks).
  for (int round = 0; round < repeat; ++round) {
    const bool keep = round + 1 == repeat && args->Has("keep");
    if (round % 2 == 1 && !run_others()) return base::kExitFailed;
    if (!run_ckptd(fs, dir, keep, &write_runs, &read_runs)) return base::kExitFailed;
    if (round % 2 == 0 && !run_others()) return base::kExitFailed;
  }
  const double write_gbps = Median(write_runs);
  const double read_gbps = Median(read_runs);
  std::optional<double> posix_write_gbps, posix_read_gbps, s3_up_gbps, s3_down_gbps;
  if (!posix_write_runs.empty()) posix_write_gbps = Median(posix_write_runs);
  if (!posix_read_runs.empty()) posix_read_gbps = Median(posix_read_runs);
  if (!s3_up_runs.empty()) s3_up_gbps = Median(s3_up_runs);
  if (!s3_down_runs.empty()) s3_down_gbps = Median(s3_down_runs);
  const double ratio = static_cast<double>(raw_bytes) / written.stored_bytes;
  if (!fio_write_runs.empty()) fio.write_gbps = Median(fio_write_runs);
  if (!fio_read_runs.empty()) fio.read_gbps = Median(fio_read_runs);
  if (!zstd_runs.empty()) zstd.gbps = Median(zstd_runs);

  JsonWriter w;
  w.BeginObject();
  w.Field("codec", codec);
  w.Field("dtype", dtype);
  w.Field("threads", threads);
  w.Field("io_depth", io_depth);
  w.Field("root", root->description);
  w.Field("object_store", object_store);
  if (!object_store) w.Field("io_uring", posix->uses_io_uring());
  w.Field("raw_bytes", raw_bytes);
  w.Field("stored_bytes", written.stored_bytes);
  w.Field("file_bytes", written.file_length);
  w.Field("ratio", ratio);
  w.Field("rounds", repeat);
  w.Field("write_gbps", write_gbps);
  w.Field("read_gbps", read_gbps);
  if (posix_write_gbps && posix_read_gbps) {
    // Durable time is bytes over speed: the object store's over the directory's.
    w.Field("posix_write_gbps", *posix_write_gbps);
    w.Field("posix_read_gbps", *posix_read_gbps);
    w.Field("durable_time_vs_posix", *posix_write_gbps / write_gbps);
  }
  if (s3_up_gbps && s3_down_gbps) {
    w.Field("s3_client_upload_gbps", *s3_up_gbps);
    w.Field("s3_client_download_gbps", *s3_down_gbps);
    w.Field("write_vs_s3_client", write_gbps / *s3_up_gbps);
    w.Field("read_vs_s3_client", read_gbps / *s3_down_gbps);
  }
  if (!s3_error.empty()) w.Field("s3_client_error", s3_error);
  if (args->Has("compare")) {
    if (fio.write_gbps) {
      w.Field("fio_write_gbps", *fio.write_gbps);
      w.Field("write_vs_fio", write_gbps / *fio.write_gbps);
    }
    if (fio.read_gbps) {
      w.Field("fio_read_gbps", *fio.read_gbps);
      w.Field("read_vs_fio", read_gbps / *fio.read_gbps);
    }
    if (!fio.error.empty()) w.Field("fio_error", fio.error);
    if (zstd.gbps) {
      w.Field("zstd_cli_gbps", *zstd.gbps);
      w.Field("write_vs_zstd_cli", write_gbps / *zstd.gbps);
    }
    if (zstd.ratio) w.Field("zstd_cli_ratio", *zstd.ratio);
    if (!zstd.error.empty()) w.Field("zstd_error", zstd.error);
  }
  w.Field("step_dir", storage::StepDir(dir, job, step));
  w.Field("kept", args->Has("keep"));
  w.EndObject();
  if (args->Has("json")) {
    out << w.str() << "\n";
  } else {
    out << absl::StrFormat("persist %s %s: %s raw -> %s stored (ratio %.3f)\n", codec, dtype,
                           base::HumanBytes(raw_bytes), base::HumanBytes(written.stored_bytes), ratio);
    out << absl::StrFormat("  write %.3f GB/s (until durable), read+verify %.3f GB/s; median of %d round(s)\n",
                           write_gbps, read_gbps, repeat);
    if (posix_write_gbps && posix_read_gbps) {
      out << absl::StrFormat("  ckptd on %s: write %.3f GB/s, read+verify %.3f GB/s (durable time on the store %.2fx)\n",
                             roots[1].second, *posix_write_gbps, *posix_read_gbps, *posix_write_gbps / write_gbps);
    }
    if (s3_up_gbps && s3_down_gbps) {
      out << absl::StrFormat(
          "  boto3 transfer manager: upload %.3f GB/s (ckptd write %.0f%%), download %.3f GB/s (ckptd read %.0f%%)\n",
          *s3_up_gbps, 100 * write_gbps / *s3_up_gbps, *s3_down_gbps, 100 * read_gbps / *s3_down_gbps);
    }
    if (!s3_error.empty()) out << "  boto3: " << s3_error << "\n";
    if (fio.write_gbps && fio.read_gbps) {
      out << absl::StrFormat("  fio   write %.3f GB/s (ckptd %.0f%%), read %.3f GB/s (ckptd %.0f%%)\n",
                             *fio.write_gbps, 100 * write_gbps / *fio.write_gbps, *fio.read_gbps,
                             100 * read_gbps / *fio.read_gbps);
    }
    if (zstd.gbps) {
      out << absl::StrFormat("  zstd -1 -T%d  %.3f GB/s ratio %.3f (ckptd write %.0f%% of its speed)\n", threads,
                             *zstd.gbps, zstd.ratio.value_or(0), 100 * write_gbps / *zstd.gbps);
    }
    if (!fio.error.empty()) out << "  fio: " << fio.error << "\n";
    if (!zstd.error.empty()) out << "  zstd: " << zstd.error << "\n";
  }
  return base::kExitOk;
}

}  // namespace ckptd::bench
