#include "bench/reshard_bench.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/flags.h"
#include "base/format.h"
#include "base/json.h"
#include "bench/bench_util.h"
#include "coordinator/reshard_layouts.h"
#include "format/tensor_size.h"
#include "storage/layout.h"
#include "storage/posix_file_system.h"
#include "storage/reshard_plan.h"
#include "storage/store.h"

namespace ckptd::bench {

const char kReshardHelp[] =
    "usage: ckptd-bench reshard [--saved-ranks N] [--ranks M] [--tensors T] [--rows-per-rank K] [--cols C]\n"
    "                           [--dir <dir>] [--json]\n"
    "\n"
    "A step saved by N ranks (default 64) restored onto M ranks (default 48). Each\n"
    "rank's state is T tensors (default 64), each a float [K x N, C] matrix (K\n"
    "default 8, C default 256) split by rows over the ranks, and an RNG of its own\n"
    "(64 bytes). The step is written and committed under --dir (default a new\n"
    "folder under /tmp, removed afterwards); then each of the M new ranks, one\n"
    "after another, restores its slices two ways:\n"
    "  self-planned  the rank reads every saved shard's index and plans by itself\n"
    "                (what an agent does without the coordinator's plan): the\n"
    "                yardstick\n"
    "  coordinated   the step's layout is read once, as the coordinator reads it\n"
    "                (8 indexes at a time), each rank's plan is made from it, and\n"
    "                the rank opens only the shards its plan reads\n"
    "Both read only the blocks that hold the rank's rows, each verified, and the\n"
    "bytes are checked against what was saved; the step's files are dropped from\n"
    "the page cache before each way. Reported: the shards opened (an\n"
    "index read each), the seconds of all M restores and the median rank's, the\n"
    "coordinator's layout read and plans, and coordinated / self-planned.\n"
    "--json keys: saved_ranks, ranks, tensors, bytes, self_shards_opened, self_s,\n"
    "self_rank_s, coordinated_layout_shards, coordinated_shards_opened,\n"
    "coordinated_layout_s, coordinated_plan_s, coordinated_s, coordinated_rank_s,\n"
    "time_ratio, opened_ratio, verified.\n"
    "Ranges: --saved-ranks 1..4096, --ranks 1..4096, --tensors 1..4096,\n"
    "--rows-per-rank 1..4096, --cols 1..65536.\n";

namespace {

constexpr char kJob[] = "reshard-bench";
constexpr uint64_t kStep = 100;
constexpr uint64_t kRngBytes = 64;

struct Shape {
  uint32_t saved = 64;
  uint32_t ranks = 48;
  uint32_t tensors = 64;
  uint64_t rows_per_rank = 8;
  uint64_t cols = 256;
  uint64_t rows() const { return rows_per_rank * saved; }
};

// Rows [first, end) of `rows` that rank `rank` of `world` holds.
std::pair<uint64_t, uint64_t> RowsOf(uint64_t rows, uint32_t rank, uint32_t world) {
  return {rows * rank / world, rows * (rank + 1) / world};
}

// The bits of element (row, col) of tensor t.
uint32_t Element(uint32_t t, uint64_t row, uint64_t col, uint64_t cols) {
  return static_cast<uint32_t>((t + 1) * 2654435761u) ^ static_cast<uint32_t>(row * cols + col);
}

ckptd::v1::Tensor TensorMeta(const Shape& s, uint32_t t, uint32_t rank, uint32_t world) {
  const auto [first, end] = RowsOf(s.rows(), rank, world);
  ckptd::v1::Tensor m;
  m.set_name(absl::StrCat("layer.", t));
  m.set_component(ckptd::v1::PARAMS);
  m.set_dtype(ckptd::v1::FLOAT32);
  m.add_global_shape(s.rows());
  m.add_global_shape(s.cols);
  m.add_offsets(first);
  m.add_offsets(0);
  m.add_shape(end - first);
  m.add_shape(s.cols);
  return m;
}

ckptd::v1::Tensor RngMeta() {
  ckptd::v1::Tensor m;
  m.set_name("rng");
  m.set_component(ckptd::v1::RNG);
  m.set_dtype(ckptd::v1::BYTES);
  m.add_shape(kRngBytes);
  return m;
}

// The buffers of rank `rank` of `world`, as a registration declares them.
std::vector<ckptd::v1::Tensor> Buffers(const Shape& s, uint32_t rank, uint32_t world) {
  std::vector<ckptd::v1::Tensor> b;
  for (uint32_t t = 0; t < s.tensors; ++t) b.push_back(TensorMeta(s, t, rank, world));
  b.push_back(RngMeta());
  return b;
}

absl::Status WriteStep(storage::CheckpointStore& store, const Shape& s, uint64_t* bytes) {
  absl::Status prep = store.PrepareStep(kJob, kStep);
  if (!prep.ok()) return prep;
  std::vector<ckptd::v1::ShardRef> refs;
  for (uint32_t r = 0; r < s.saved; ++r) {
    const auto [first, end] = RowsOf(s.rows(), r, s.saved);
    std::vector<std::vector<uint32_t>> data(s.tensors);
    std::vector<storage::TensorSource> src;
    for (uint32_t t = 0; t < s.tensors; ++t) {
      for (uint64_t row = first; row < end; ++row) {
        for (uint64_t col = 0; col < s.cols; ++col) data[t].push_back(Element(t, row, col, s.cols));
      }
      src.push_back({TensorMeta(s, t, r, s.saved), data[t].data(), data[t].size() * sizeof(uint32_t)});
      *bytes += data[t].size() * sizeof(uint32_t);
    }
    std::vector<uint8_t> rng(kRngBytes, static_cast<uint8_t>(r));
    src.push_back({RngMeta(), rng.data(), rng.size()});
    absl::StatusOr<storage::ShardWriteResult> w = store.WriteShard(kJob, kStep, r, s.saved, src);
    if (!w.ok()) return w.status();
    ckptd::v1::ShardRef ref;
    ref.set_rank(r);
    ref.set_file(storage::ShardFileName(r));
    ref.set_file_length(w->file_length);
    ref.set_index_xxh3(w->index_xxh3);
    refs.push_back(ref);
  }
  return store.CommitStep(kJob, kStep, s.saved, &refs, storage::CheckpointStore::CommitCheck::kCheckedByCaller)
      .status();
}

using Readers = std::map<uint32_t, std::unique_ptr<storage::ShardReader>>;

// Drops the files under `dir` from the page cache (they were written and
// synced), so that neither way reads what the other left in memory.
void EvictPageCache(const std::string& dir) {
  std::error_code ec;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (!f.is_regular_file(ec)) continue;
    const int fd = ::open(f.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// Reads `reads` into `dst` (one vector per buffer), opening the shards the
// reads need that `readers` does not hold; counts what it opens. Checks the
// bytes against what rank `rank` of `world` must hold.
absl::Status Execute(storage::CheckpointStore& store, const ckptd::v1::StepManifest& manifest, const Shape& s,
                     uint32_t rank, const std::vector<ckptd::v1::Tensor>& buffers,
                     const std::vector<storage::PlannedRead>& reads, Readers& readers, uint64_t* opened,
                     bool* verified) {
  std::vector<std::vector<uint8_t>> dst(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    uint64_t n = format::DTypeSize(buffers[i].dtype());
    for (uint64_t d : buffers[i].shape()) n *= d;
    dst[i].resize(n);
  }
  for (const storage::PlannedRead& r : reads) {
    auto it = readers.find(r.rank);
    if (it == readers.end()) {
      absl::StatusOr<std::unique_ptr<storage::ShardReader>> reader =
          store.OpenCommittedShard(kJob, kStep, manifest, r.rank);
      if (!reader.ok()) return reader.status();
      ++*opened;
      it = readers.emplace(r.rank, *std::move(reader)).first;
    }
    const ckptd::v1::Tensor& b = buffers[r.buffer];
    absl::Status read = storage::ReadIntoSlice(*it->second, b.name(), r.source, r.target,
                                               format::DTypeSize(b.dtype()), dst[r.buffer].data());
    if (!read.ok()) return read;
  }
  const auto [first, end] = RowsOf(s.rows(), rank, s.ranks);
  for (uint32_t t = 0; t < s.tensors; ++t) {
    const uint32_t* got = reinterpret_cast<const uint32_t*>(dst[t].data());
    for (uint64_t row = first; row < end; ++row) {
      for (uint64_t col = 0; col < s.cols; ++col) {
        if (got[(row - first) * s.cols + col] != Element(t, row, col, s.cols)) *verified = false;
      }
    }
  }
  for (uint8_t byte : dst.back()) *verified = *verified && byte == static_cast<uint8_t>(rank % s.saved);
  return absl::OkStatus();
}

}  // namespace

int RunReshardBench(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  absl::StatusOr<base::Args> args =
      base::Args::Parse(argv, {"saved-ranks", "ranks", "tensors", "rows-per-rank", "cols", "dir"}, {"json", "help"});
  if (args.ok() && args->Has("help")) {
    out << kReshardHelp;
    return base::kExitOk;
  }
  auto usage = [&](absl::string_view why) {
    err << "ckptd-bench reshard: " << why << "\n" << kReshardHelp;
    return base::kExitUsage;
  };
  if (!args.ok()) return usage(args.status().message());
  Shape s;
  for (const absl::Status& st :
       {args->ReadUint("saved-ranks", 1, 4096, &s.saved), args->ReadUint("ranks", 1, 4096, &s.ranks),
        args->ReadUint("tensors", 1, 4096, &s.tensors), args->ReadUint("rows-per-rank", 1, 4096, &s.rows_per_rank),
        args->ReadUint("cols", 1, 65536, &s.cols)}) {
    if (!st.ok()) return usage(st.message());
  }
  auto fail = [&](absl::string_view why) {
    err << "ckptd-bench reshard: " << why << "\n";
    return base::kExitFailed;
  };
  ScratchDir dir;
  if (absl::Status made = dir.Init(args->Get("dir"), "ckptd-reshardbench"); !made.ok()) return fail(made.message());
  std::unique_ptr<storage::PosixFileSystem> fs = storage::NewPosixFileSystem();
  const std::string root = storage::JoinPath(dir.path(), "root");
  if (absl::Status made = fs->CreateDir(root); !made.ok()) return fail(made.message());
  storage::CheckpointStore store(fs.get(), root);
  uint64_t bytes = 0;
  if (absl::Status w = WriteStep(store, s, &bytes); !w.ok()) return fail(absl::StrCat("writing the step: ", w.message()));
  absl::StatusOr<ckptd::v1::StepManifest> manifest = store.ReadManifest(kJob, kStep);
  if (!manifest.ok()) return fail(manifest.status().message());

  bool verified = true;
  EvictPageCache(root);
  // Self-planned: every rank reads every saved index (those of a saved world
  // of at most 64 ranks kept open for the reads, as the agent does).
  uint64_t self_opened = 0;
  std::vector<double> self_rank;
  const absl::Time self_start = absl::Now();
  for (uint32_t rank = 0; rank < s.ranks; ++rank) {
    const absl::Time start = absl::Now();
    const std::vector<ckptd::v1::Tensor> buffers = Buffers(s, rank, s.ranks);
    storage::SavedLayout layout(s.saved);
    Readers readers;
    for (uint32_t r = 0; r < s.saved; ++r) {
      absl::StatusOr<std::unique_ptr<storage::ShardReader>> reader = store.OpenCommittedShard(kJob, kStep, *manifest, r);
      if (!reader.ok()) return fail(reader.status().message());
      ++self_opened;
      layout.Add(r, (*reader)->index());
      if (s.saved <= 64) readers.emplace(r, *std::move(reader));
    }
    layout.Seal();
    absl::StatusOr<std::vector<storage::PlannedRead>> reads = storage::PlanReshard(kStep, rank, buffers, layout);
    if (!reads.ok()) return fail(reads.status().message());
    if (absl::Status e = Execute(store, *manifest, s, rank, buffers, *reads, readers, &self_opened, &verified);
        !e.ok()) {
      return fail(e.message());
    }
    self_rank.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  const double self_s = absl::ToDoubleSeconds(absl::Now() - self_start);

  // Coordinated: the layout read once, a plan per rank, only the planned shards opened.
  EvictPageCache(root);
  uint64_t coordinated_opened = 0;
  std::vector<double> coordinated_rank;
  double plan_s = 0;
  const absl::Time coordinated_start = absl::Now();
  coordinator::internal::ReshardLayouts layouts(&store, /*keep=*/2, /*readers=*/8);
  absl::StatusOr<std::shared_ptr<const storage::SavedLayout>> layout = layouts.Get(kJob, kStep);
  if (!layout.ok()) return fail(layout.status().message());
  const double layout_s = absl::ToDoubleSeconds(absl::Now() - coordinated_start);
  for (uint32_t rank = 0; rank < s.ranks; ++rank) {
    const absl::Time start = absl::Now();
    const std::vector<ckptd::v1::Tensor> buffers = Buffers(s, rank, s.ranks);
    absl::StatusOr<std::vector<storage::PlannedRead>> reads = storage::PlanReshard(kStep, rank, buffers, **layout);
    if (!reads.ok()) return fail(reads.status().message());
    plan_s += absl::ToDoubleSeconds(absl::Now() - start);
    if (absl::Status c = storage::CheckPlan(buffers, *reads); !c.ok()) return fail(c.message());
    Readers readers;
    if (absl::Status e = Execute(store, *manifest, s, rank, buffers, *reads, readers, &coordinated_opened, &verified);
        !e.ok()) {
      return fail(e.message());
    }
    coordinated_rank.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  const double coordinated_s = absl::ToDoubleSeconds(absl::Now() - coordinated_start);
  const double time_ratio = self_s > 0 ? coordinated_s / self_s : 0;
  const double opened_ratio =
      self_opened > 0 ? static_cast<double>(s.saved + coordinated_opened) / static_cast<double>(self_opened) : 0;
  if (args->Has("json")) {
    base::JsonWriter w;
    w.BeginObject();
    w.Field("saved_ranks", s.saved);
    w.Field("ranks", s.ranks);
    w.Field("tensors", s.tensors);
    w.Field("bytes", bytes);
    w.Field("self_shards_opened", self_opened);
    w.Field("self_s", self_s);
    w.Field("self_rank_s", Median(self_rank));
    w.Field("coordinated_layout_shards", s.saved);
    w.Field("coordinated_shards_opened", coordinated_opened);
    w.Field("coordinated_layout_s", layout_s);
    w.Field("coordinated_plan_s", plan_s);
    w.Field("coordinated_s", coordinated_s);
    w.Field("coordinated_rank_s", Median(coordinated_rank));
    w.Field("time_ratio", time_ratio);
    w.Field("opened_ratio", opened_ratio);
    w.Field("verified", verified);
    w.EndObject();
    out << w.str() << "\n";
  } else {
    out << absl::StrFormat(
        "reshard: a step of %u ranks restored onto %u (%u tensors split by rows + an RNG each, %s)%s\n"
        "  self-planned  %llu shards opened, %.3f s in all, %.4f s per rank (median)\n"
        "  coordinated   %u + %llu shards opened, %.3f s in all (layout read once %.3f s, %u plans %.3f s),"
        " %.4f s per rank (median)\n"
        "  coordinated / self-planned: %.3f of the time, %.3f of the shards opened\n",
        s.saved, s.ranks, s.tensors, base::HumanBytes(bytes), verified ? "" : ": BYTES NOT AS SAVED",
        static_cast<unsigned long long>(self_opened), self_s, Median(self_rank), s.saved,
        static_cast<unsigned long long>(coordinated_opened), coordinated_s, layout_s, s.ranks, plan_s,
        Median(coordinated_rank), time_ratio, opened_ratio);
  }
  return verified ? base::kExitOk : base::kExitFailed;
}

}  // namespace ckptd::bench
