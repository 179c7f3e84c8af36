#include "storage/safetensors_export.h"
#include "storage/replica.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"  // CKPTD_STATUS_CONCAT_, used by matchers.h
#include "base/testing/matchers.h"
#include "base/thread_pool.h"
#include "format/tensor_size.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/codec.h"
#include "storage/layout.h"
#include "storage/mem_file_system.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"
#include "storage/store.h"
#include "storage/testing_data.h"

namespace ckptd::storage {
namespace {

using ::ckptd::format::DTypeSize;
using ::ckptd::testing::IsOk;
using ::ckptd::testing::IsOkAndHolds;
using ::ckptd::testing::OneThread;
using ::ckptd::testing::SmallBlocks;
using ::ckptd::testing::StatusIs;
using ::ckptd::v1::Tensor;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kJob[] = "job-a";
constexpr char kOut[] = "/out";
constexpr char kModel[] = "/out/model.safetensors";

// A dense tensor whose element i is `base + i` (fp32, or the same bits
// shifted for bf16), so that an element put in the wrong place shows.
struct Global {
  std::string name;
  std::vector<uint64_t> shape;
  ckptd::v1::DType dtype = ckptd::v1::FLOAT32;
  std::string bytes;

  size_t Elements() const { return bytes.size() / DTypeSize(dtype); }
};

Global MakeGlobal(std::string name, std::vector<uint64_t> shape, float base) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  std::vector<float> values;
  for (uint64_t i = 0; i < n; ++i) values.push_back(base + static_cast<float>(i));
  return {std::move(name), std::move(shape), ckptd::v1::FLOAT32,
          std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float))};
}

Global MakeBf16(std::string name, std::vector<uint64_t> shape, uint16_t base) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  std::vector<uint16_t> values;
  for (uint64_t i = 0; i < n; ++i) values.push_back(static_cast<uint16_t>(base + i));
  return {std::move(name), std::move(shape), ckptd::v1::BFLOAT16,
          std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(uint16_t))};
}

// What one rank writes of one tensor.
struct Slice {
  Tensor meta;
  std::string bytes;
};

// The box of `g` at `offsets` of extent `shape`, gathered element by element.
std::string Box(const Global& g, const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& shape) {
  const size_t element = DTypeSize(g.dtype);
  uint64_t count = 1;
  for (uint64_t d : shape) count *= d;
  std::string out;
  std::vector<uint64_t> index(shape.size(), 0);
  for (uint64_t n = 0; n < count; ++n) {
    uint64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) flat = flat * g.shape[d] + offsets[d] + index[d];
    out.append(g.bytes.substr(flat * element, element));
    for (size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

// A rank's slice of `g` with its global layout.
Slice Sharded(const Global& g, const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& shape) {
  Slice s;
  s.meta.set_name(g.name);
  s.meta.set_component(ckptd::v1::PARAMS);
  s.meta.set_dtype(g.dtype);
  for (uint64_t d : shape) s.meta.add_shape(d);
  for (uint64_t d : g.shape) s.meta.add_global_shape(d);
  for (uint64_t d : offsets) s.meta.add_offsets(d);
  s.bytes = Box(g, offsets, shape);
  s.meta.set_raw_length(s.bytes.size());
  return s;
}

// All of `g` without a global layout (a data-parallel replica).
Slice Whole(const Global& g) {
  Slice s;
  s.meta.set_name(g.name);
  s.meta.set_component(ckptd::v1::PARAMS);
  s.meta.set_dtype(g.dtype);
  for (uint64_t d : g.shape) s.meta.add_shape(d);
  s.bytes = g.bytes;
  s.meta.set_raw_length(s.bytes.size());
  return s;
}

// Opaque per-rank bytes (RNG state).
Slice Opaque(const std::string& name, ckptd::v1::Component component, std::string bytes) {
  Slice s;
  s.meta.set_name(name);
  s.meta.set_component(component);
  s.meta.set_dtype(ckptd::v1::BYTES);
  s.meta.add_shape(bytes.size());
  s.bytes = std::move(bytes);
  s.meta.set_raw_length(s.bytes.size());
  return s;
}

constexpr char kRng[] = "rng.state";
std::string RngBytes(uint64_t step, uint32_t rank) {
  std::string s = absl::StrCat("rng/", step, "/", rank, "/");
  while (s.size() < 16) s.push_back(static_cast<char>('a' + s.size()));
  return s.substr(0, 16);
}

// The tensors of a 4-rank job, whole, and how each rank holds them.
struct Model {
  explicit Model(uint64_t step = 7, float base = 0)
      : step(step),
        a(MakeGlobal("a.weight", {8, 5}, base + 0)),
        b(MakeGlobal("b.weight", {3, 8}, base + 1000)),
        c(MakeGlobal("c.weight", {4, 6, 2}, base + 2000)),
        bias(MakeGlobal("bias", {5}, base + 3000)),
        e(MakeGlobal("e.weight", {4, 3}, base + 4000)) {}

  std::vector<Slice> Rank(uint32_t r) const {
    return {
        Sharded(a, {2 * r, 0}, {2, 5}),                        // rows split over dim 0
        Opaque(kRng, ckptd::v1::RNG, RngBytes(step, r)),       // each rank's own
        Sharded(b, {0, 2 * r}, {3, 2}),                        // columns split over dim 1
        Sharded(c, {2 * (r / 2), 3 * (r % 2), 0}, {2, 3, 2}),  // a 2x2 grid over dims 0 and 1
        Whole(bias),                                           // replicated, no layout
        Sharded(e, {2 * (r % 2), 0}, {2, 3}),                  // HSDP: ranks 0, 2 and 1, 3 hold the same rows
    };
  }
  std::vector<std::vector<Slice>> Ranks() const {
    std::vector<std::vector<Slice>> out;
    for (uint32_t r = 0; r < 4; ++r) out.push_back(Rank(r));
    return out;
  }
  uint64_t Bytes() const {
    return a.bytes.size() + b.bytes.size() + c.bytes.size() + bias.bytes.size() + e.bytes.size();
  }

  uint64_t step;
  Global a, b, c, bias, e;
};

// One tensor a safetensors file should hold.
struct Expected {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::string bytes;
};

Expected F32(const Global& g) { return {g.name, "F32", g.shape, g.bytes}; }
Expected Bf16(const Global& g) { return {g.name, "BF16", g.shape, g.bytes}; }

std::vector<float> AsFloats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

size_t Count(absl::string_view haystack, absl::string_view needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != absl::string_view::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

// Checks that `contents` is a safetensors file of job kJob's `step` holding
// exactly `tensors`, in name order, back to back, each with its bytes.
void ExpectSafetensors(const std::string& contents, uint64_t step, std::vector<Expected> tensors) {
  ASSERT_GE(contents.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(contents[i]);
  EXPECT_EQ(n % 8, 0u) << "header length " << n << " leaves the data unaligned";
  ASSERT_LE(n, contents.size() - 8);
  const std::string header = contents.substr(8, n);
  const std::string data = contents.substr(8 + n);
  // The JSON, then fewer than 8 spaces of padding.
  const size_t last = header.find_last_not_of(' ');
  ASSERT_NE(last, std::string::npos);
  EXPECT_EQ(header[last], '}') << header;
  EXPECT_LT(header.size() - last - 1, 8u) << header;
  EXPECT_TRUE(absl::StartsWith(header, absl::StrCat("{\"__metadata__\":{\"format\":\"pt\",\"ckptd.job\":\"", kJob,
                                                    "\",\"ckptd.step\":\"", step, "\"}")))
      << header;
  EXPECT_EQ(Count(header, "\"data_offsets\":"), tensors.size()) << "other tensors in " << header;

  std::sort(tensors.begin(), tensors.end(), [](const Expected& x, const Expected& y) { return x.name < y.name; });
  uint64_t next = 0;
  size_t previous = 0;
  for (const Expected& t : tensors) {
    SCOPED_TRACE(t.name);
    const std::string entry = absl::StrCat("\"", t.name, "\":{\"dtype\":\"", t.dtype, "\",\"shape\":[",
                                           absl::StrJoin(t.shape, ","), "],\"data_offsets\":[");
    const size_t at = header.find(entry);
    ASSERT_NE(at, std::string::npos) << "no " << entry << " in " << header;
    EXPECT_GT(at, previous) << "not in name order: " << header;
    previous = at;
    const size_t begin = at + entry.size();
    const size_t close = header.find("]}", begin);
    ASSERT_NE(close, std::string::npos) << header;
    const std::vector<std::string> offsets = absl::StrSplit(header.substr(begin, close - begin), ',');
    ASSERT_EQ(offsets.size(), 2u) << header;
    uint64_t b = 0, e = 0;
    ASSERT_TRUE(absl::SimpleAtoi(offsets[0], &b)) << header;
    ASSERT_TRUE(absl::SimpleAtoi(offsets[1], &e)) << header;
    EXPECT_EQ(b, next) << "does not start where the tensor before it ends";
    ASSERT_LE(b, e);
    ASSERT_LE(e, data.size());
    ASSERT_EQ(e - b, t.bytes.size());
    const std::string got = data.substr(b, e - b);
    if (t.dtype == "F32") {
      EXPECT_THAT(AsFloats(got), ElementsAreArray(AsFloats(t.bytes)));
    }
    EXPECT_TRUE(got == t.bytes) << "the bytes differ";
    next = e;
  }
  EXPECT_EQ(next, data.size()) << "bytes after the last tensor";
}

std::vector<std::string> Names(const std::vector<FileInfo>& files) {
  std::vector<std::string> out;
  for (const FileInfo& f : files) out.push_back(f.name);
  return out;
}

auto IsExported(const std::string& name, const std::string& file, const std::string& dtype,
                const std::vector<uint64_t>& shape, uint64_t bytes, int slices) {
  return AllOf(Field(&ExportedTensor::name, name), Field(&ExportedTensor::file, file),
               Field(&ExportedTensor::dtype, dtype), Field(&ExportedTensor::shape, shape),
               Field(&ExportedTensor::bytes, bytes), Field(&ExportedTensor::slices, slices));
}

SafetensorsExportOptions TwoThreads() {
  SafetensorsExportOptions o;
  o.threads = 2;
  return o;
}

class SafetensorsExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CKPTD_ASSERT_OK(mem_.CreateDir("/root"));
    CKPTD_ASSERT_OK(mem_.SyncDir("/"));
  }

  // Writes the shard of every rank of `step` (ranks[r]: what rank r holds)
  // and commits the step when `commit`.
  absl::Status WriteStep(uint64_t step, const std::vector<std::vector<Slice>>& ranks, bool commit = true) {
    CKPTD_RETURN_IF_ERROR(store_.PrepareStep(kJob, step));
    const uint32_t world = static_cast<uint32_t>(ranks.size());
    for (uint32_t r = 0; r < world; ++r) {
      std::vector<TensorSource> sources;
      for (const Slice& s : ranks[r]) sources.push_back(TensorSource{s.meta, s.bytes.data(), s.bytes.size()});
      CKPTD_RETURN_IF_ERROR(store_.WriteShard(kJob, step, r, world, sources, SmallBlocks(), &pool_).status());
    }
    if (commit) CKPTD_RETURN_IF_ERROR(store_.CommitStep(kJob, step, world).status());
    return absl::OkStatus();
  }

  std::string ReadFile(const std::string& path) {
    absl::StatusOr<std::string> s = ReadFileToString(&mem_, path);
    EXPECT_THAT(s.status(), IsOk()) << path;
    return s.ok() ? *s : std::string();
  }

  // Flips one byte of `path` (durably, as corruption on disk would be).
  void FlipByte(const std::string& path, uint64_t offset) {
    std::string bytes = ReadFile(path);
    ASSERT_LT(offset, bytes.size());
    bytes[offset] = static_cast<char>(bytes[offset] ^ 0x5a);
    CKPTD_ASSERT_OK(mem_.SetFileContents(path, bytes));
  }

  bool Exists(const std::string& path) { return mem_.Stat(path).ok(); }

  std::vector<std::string> ListOut() {
    absl::StatusOr<std::vector<FileInfo>> files = mem_.ListDir(kOut);
    EXPECT_THAT(files.status(), IsOk());
    return files.ok() ? Names(*files) : std::vector<std::string>();
  }

  MemFileSystem mem_;
  base::ThreadPool pool_{1};
  CheckpointStore store_{&mem_, "/root"};
};

TEST_F(SafetensorsExportTest, AssemblesEveryTensorFromTheSlicesOfEveryRank) {
  const Model m;
  CKPTD_ASSERT_OK(WriteStep(7, m.Ranks()));
  CKPTD_ASSERT_OK_AND_ASSIGN(SafetensorsExport out, ExportSafetensors(store_, kJob, 7, kOut, TwoThreads()));
  EXPECT_EQ(out.job, kJob);
  EXPECT_EQ(out.step, 7u);
  EXPECT_THAT(out.files, ElementsAre("model.safetensors"));
  // Name order; the RNG state is not a weight and stays out.
  const std::string f = "model.safetensors";
  EXPECT_THAT(out.tensors, ElementsAre(IsExported("a.weight", f, "F32", {8, 5}, 160, 4),
                                       IsExported("b.weight", f, "F32", {3, 8}, 96, 4),
                                       IsExported("bias", f, "F32", {5}, 20, 1),
                                       IsExported("c.weight", f, "F32", {4, 6, 2}, 192, 4),
                                       IsExported("e.weight", f, "F32", {4, 3}, 48, 2)));
  EXPECT_EQ(out.bytes, m.Bytes());
  EXPECT_EQ(out.bytes, 516u);
  ExpectSafetensors(ReadFile(kModel), 7, {F32(m.a), F32(m.b), F32(m.c), F32(m.bias), F32(m.e)});
  EXPECT_FALSE(absl::StrContains(ReadFile(kModel), kRng));
  // No temporary file is left beside it.
  EXPECT_THAT(ListOut(), ElementsAre("model.safetensors"));
}

TEST_F(SafetensorsExportTest, ScattersSlicesCutAlongAnyDimension) {
  // f: split over its last dimension; g: a 2x2 grid over its last two; h: uneven rows;
  // big: columns of several 4096-byte blocks each; replica: a copy of 3 blocks on every rank;
  // half: bf16 columns.
  const Global f = MakeGlobal("f", {2, 3, 4}, 100);
  const Global g = MakeGlobal("g", {3, 4, 2}, 200);
  const Global h = MakeGlobal("h", {10}, 300);
  const Global big = MakeGlobal("big", {64, 96}, 10000);
  const Global replica = MakeGlobal("replica", {3000}, 20000);
  const Global half = MakeBf16("half", {6, 8}, 0x3f00);
  std::vector<std::vector<Slice>> ranks(4);
  const uint64_t h_rows[] = {3, 3, 3, 1};
  for (uint32_t r = 0; r < 4; ++r) {
    ranks[r].push_back(Sharded(f, {0, 0, r}, {2, 3, 1}));
    ranks[r].push_back(Sharded(g, {0, 2 * (r / 2), r % 2}, {3, 2, 1}));
    ranks[r].push_back(Sharded(h, {3 * r}, {h_rows[r]}));
    ranks[r].push_back(Sharded(big, {0, 24 * r}, {64, 24}));
    ranks[r].push_back(Whole(replica));
    ranks[r].push_back(Sharded(half, {0, 2 * r}, {6, 2}));
  }
  CKPTD_ASSERT_OK(WriteStep(1, ranks));
  CKPTD_ASSERT_OK_AND_ASSIGN(SafetensorsExport out, ExportSafetensors(store_, kJob, 1, kOut, TwoThreads()));
  const std::string file = "model.safetensors";
  EXPECT_THAT(out.tensors, ElementsAre(IsExported("big", file, "F32", {64, 96}, 64 * 96 * 4, 4),
                                       IsExported("f", file, "F32", {2, 3, 4}, 96, 4),
                                       IsExported("g", file, "F32", {3, 4, 2}, 96, 4),
                                       IsExported("h", file, "F32", {10}, 40, 4),
                                       IsExported("half", file, "BF16", {6, 8}, 96, 4),
                                       IsExported("replica", file, "F32", {3000}, 12000, 1)));
  ExpectSafetensors(ReadFile(kModel), 1, {F32(big), F32(f), F32(g), F32(h), Bf16(half), F32(replica)});
}

TEST_F(SafetensorsExportTest, AnEmptySliceOverlapsNothing) {
  // Rank 2 holds no row of w (an uneven split); its slice is declared at row 1.
  const Global w = MakeGlobal("w", {4, 5}, 0);
  CKPTD_ASSERT_OK(WriteStep(1, {{Sharded(w, {0, 0}, {2, 5})}, {Sharded(w, {2, 0}, {2, 5})},
                                {Sharded(w, {1, 0}, {0, 5})}}));
  CKPTD_ASSERT_OK_AND_ASSIGN(SafetensorsExport out, ExportSafetensors(store_, kJob, 1, kOut, TwoThreads()));
  ExpectSafetensors(ReadFile(kModel), 1, {F32(w)});
}

// A data-parallel group of four wrote w once (rows 0, 1, 2 and none) and
// the scalar step whole on every rank: the export puts the shares together.
TEST_F(SafetensorsExportTest, SharesOfReplicatedTensorsArePutTogether) {
  const Global w = MakeGlobal("w", {3, 5}, 0);
  const Global step = MakeGlobal("step", {}, 42);
  CKPTD_ASSERT_OK(store_.PrepareStep(kJob, 1));
  for (uint32_t r = 0; r < 4; ++r) {
    std::vector<TensorSource> whole;
    for (const Global* g : {&w, &step}) {
      Slice s = Whole(*g);
      s.meta.clear_raw_length();
      s.meta.mutable_replica()->set_group("dp");
      s.meta.mutable_replica()->set_count(4);
      s.meta.mutable_replica()->set_index(r);
      whole.push_back({s.meta, g->bytes.data(), g->bytes.size()});
    }
    CKPTD_ASSERT_OK_AND_ASSIGN(std::vector<TensorSource> shares, ShareSources(whole, 4096, &pool_));
    CKPTD_ASSERT_OK(store_.WriteShard(kJob, 1, r, 4, shares, SmallBlocks(), &pool_).status());
  }
  CKPTD_ASSERT_OK(store_.CommitStep(kJob, 1, 4).status());
  CKPTD_ASSERT_OK_AND_ASSIGN(SafetensorsExport out, ExportSafetensors(store_, kJob, 1, kOut, TwoThreads()));
  EXPECT_THAT(out.tensors, ElementsAre(IsExported("step", "model.safetensors", "F32", {}, 4, 1),
                                       IsExported("w", "model.safetensors", "F32", {3, 5}, 60, 3)));
  ExpectSafetensors(ReadFile(kModel), 1, {F32(step), F32(w)});
}

TEST_F(SafetensorsExportTest, NamesAreJsonStrings) {
  const Global quoted = MakeGlobal("say \"hi\"\\now", {2}, 0);
  const Global newline = MakeGlobal("line\nbreak", {2}, 10);
  const Global unicode = MakeGlobal("w\xc3\xa9ight", {2}, 20);
  CKPTD_ASSERT_OK(WriteStep(1, {{Whole(quoted), Whole(newline), Whole(unicode)}}));
  CKPTD_ASSERT_OK(ExportSafetensors(store_, kJob, 1, kOut, TwoThreads()).status());
  ExpectSafetensors(ReadFile(kModel), 1,
                    {{"line\\u000abreak", "F32", {2}, newline.bytes},
                     {"say \\\"hi\\\"\\\\now", "F32", {2}, quoted.bytes},
                     {"w\xc3\xa9ight", "F32", {2}, unicode.bytes}});
}

TEST_F(SafetensorsExportTest, ReadsShardsOfManyRanks) {
  // More ranks than the export keeps shards open at once: each holds one row.
  constexpr uint32_t kRanks = 40;
  const Global w = MakeGlobal("w", {kRanks, 3}, 0);
  const Global bias = MakeGlobal("bias", {3}, 500);
  std::vector<std::vector<Slice>> ranks(kRanks);
  for (uint32_t r = 0; r < kRanks; ++r) ranks[r] = {Sharded(w, {r, 0}, {1, 3}), Whole(bias)};
  CKPTD_ASSERT_OK(WriteStep(2, ranks));
  CKPTD_ASSERT_OK_AND_ASSIGN(SafetensorsExport out, ExportSafetensors(store_, kJob, 2, kOut, TwoThreads()));
  EXPECT_THAT(out.tensors, ElementsAre(IsExported("bias", "model.safetensors", "F32", {3}, 12, 1),
                                       IsExported("w", "model.safetensors", "F32", {kRanks, 3}, kRanks * 12,
                                                  static_cast<int>(kRanks))));
  ExpectSafetensors(ReadFile(kModel), 2, {F32(w), F32(bias)});
}

TEST_F(SafetensorsExportTest, ExportsEachRanksRngStateUnderItsRank) {
  const Model m;
  CKPTD_ASSERT_OK(WriteStep(7, m.Ranks()));
  SafetensorsExportOptions options = TwoThreads();
  options.components = {ckptd::v1::RNG};
  CKPTD_ASSERT_OK_AND_ASSIGN(SafetensorsExport out, ExportSafetensors(store_, kJob, 7, kOut, options));
  const std::string f = "model.safetensors";
  EXPECT_THAT(out.tensors, ElementsAre(IsExported("rank0/rng.state", f, "U8", {16}, 16, 1),
                                       IsExported("rank1/rng.state", f, "U8", {16}, 16, 1),
                                       IsExported("rank2/rng.state", f, "U8", {16}, 16, 1),
                                       IsExported("rank3/rng.state", f, "U8", {16}, 16, 1)));
  EXPECT_EQ(out.bytes, 64u);
  std::vector<Expected> want;
  for (uint32_t r = 0; r < 4; ++r) want.push_back({absl::StrCat("rank", r, "/", kRng), "U8", {16}, RngBytes(7, r)});
  ExpectSafetensors(ReadFile(kModel), 7, want);

  // Both components: the weights and the RNG states side by side.
  options.components = {ckptd::v1::PARAMS, ckptd::v1::RNG};
  CKPTD_ASSERT_OK_AND_ASSIGN(out, ExportSafetensors(store_, kJob, 7, "/both", options));
  EXPECT_EQ(out.tensors.size(), 9u);
  EXPECT_EQ(out.bytes, m.Bytes() + 64);
  for (const Global* g : {&m.a, &m.b, &m.c, &m.bias, &m.e}) want.push_back(F32(*g));
  ExpectSafetensors(ReadFile("/both/model.safetensors"), 7, want);

  // A job of one rank: its state under its own name.
  CKPTD_ASSERT_OK(WriteStep(8, {{Opaque(kRng, ckptd::v1::RNG, RngBytes(8, 0)), Whole(m.bias)}}));
  options.components = {ckptd::v1::RNG};
  CKPTD_ASSERT_OK_AND_ASSIGN(out, ExportSafetensors(store_, kJob, 8, "/one", options));
  EXPECT_THAT(out.tensors, ElementsAre(IsExported(kRng, f, "U8", {16}, 16, 1)));
  ExpectSafetensors(ReadFile("/one/model.safetensors"), 8, {{kRng, "U8", {16}, RngBytes(8, 0)}});
}

TEST_F(SafetensorsExportTest, SplitsIntoSeveralFilesWithAnIndex) {
  const Model m;
  CKPTD_ASSERT_OK(WriteStep(7, m.Ranks()));
  SafetensorsExportOptions options = TwoThreads();
  // 160, 96 + 20, 192 and 48 bytes: a tensor larger than the limit has a file of its own.
  options.max_file_bytes = 200;
  CKPTD_ASSERT_OK_AND_ASSIGN(SafetensorsExport out, ExportSafetensors(store_, kJob, 7, kOut, options));
  const std::string f1 = "model-00001-of-00004.safetensors", f2 = "model-00002-of-00004.safetensors",
                    f3 = "model-00003-of-00004.safetensors", f4 = "model-00004-of-00004.safetensors";
  EXPECT_THAT(out.files, ElementsAre(f1, f2, f3, f4, "model.safetensors.index.json"));
  EXPECT_THAT(out.tensors, ElementsAre(IsExported("a.weight", f1, "F32", {8, 5}, 160, 4),
                                       IsExported("b.weight", f2, "F32", {3, 8}, 96, 4),
                                       IsExported("bias", f2, "F32", {5}, 20, 1),
                                       IsExported("c.weight", f3, "F32", {4, 6, 2}, 192, 4),
                                       IsExported("e.weight", f4, "F32", {4, 3}, 48, 2)));
  EXPECT_EQ(out.bytes, m.Bytes());
  EXPECT_THAT(ListOut(), ElementsAre(f1, f2, f3, f4, "model.safetensors.index.json"));
  EXPECT_FALSE(Exists(kModel));
  ExpectSafetensors(ReadFile(absl::StrCat(kOut, "/", f1)), 7, {F32(m.a)});
  ExpectSafetensors(ReadFile(absl::StrCat(kOut, "/", f2)), 7, {F32(m.b), F32(m.bias)});
  ExpectSafetensors(ReadFile(absl::StrCat(kOut, "/", f3)), 7, {F32(m.c)});
  ExpectSafetensors(ReadFile(absl::StrCat(kOut, "/", f4)), 7, {F32(m.e)});

  const std::string index = ReadFile("/out/model.safetensors.index.json");
  EXPECT_THAT(index, AllOf(HasSubstr("\"total_size\": 516"), HasSubstr("\"weight_map\": {"),
                           HasSubstr(absl::StrCat("\"a.weight\": \"", f1, "\"")),
                           HasSubstr(absl::StrCat("\"b.weight\": \"", f2, "\"")),
                           HasSubstr(absl::StrCat("\"bias\": \"", f2, "\"")),
                           HasSubstr(absl::StrCat("\"c.weight\": \"", f3, "\"")),
                           HasSubstr(absl::StrCat("\"e.weight\": \"", f4, "\""))));
  EXPECT_EQ(Count(index, ".safetensors\""), 5u) << index;
}

TEST_F(SafetensorsExportTest, ALimitBelowEveryTensorGivesEachItsOwnFile) {
  const Model m;
  CKPTD_ASSERT_OK(WriteStep(7, m.Ranks()));
  SafetensorsExportOptions options = TwoThreads();
  options.max_file_bytes = 1;
  CKPTD_ASSERT_OK_AND_ASSIGN(SafetensorsExport out, ExportSafetensors(store_, kJob, 7, kOut, options));
  ASSERT_EQ(out.files.size(), 6u);
  const Global* order[] = {&m.a, &m.b, &m.bias, &m.c, &m.e};
  for (int i = 0; i < 5; ++i) {
    const std::string file = absl::StrCat("model-0000", i + 1, "-of-00005.safetensors");
    EXPECT_EQ(out.files[i], file);
    ExpectSafetensors(ReadFile(absl::StrCat(kOut, "/", file)), 7, {F32(*order[i])});
  }
  EXPECT_EQ(out.files[5], "model.safetensors.index.json");
}

TEST_F(SafetensorsExportTest, ReplacesAnExistingExport) {
  const Model m;
  CKPTD_ASSERT_OK(WriteStep(7, m.Ranks()));
  CKPTD_ASSERT_OK(mem_.CreateDir(kOut));
  CKPTD_ASSERT_OK(mem_.SetFileContents(kModel, std::string(4096, 'x')));
  CKPTD_ASSERT_OK(ExportSafetensors(store_, kJob, 7, kOut, TwoThreads()).status());
  ExpectSafetensors(ReadFile(kModel), 7, {F32(m.a), F32(m.b), F32(m.c), F32(m.bias), F32(m.e)});
  EXPECT_THAT(ListOut(), ElementsAre("model.safetensors"));
}

TEST_F(SafetensorsExportTest, RemovesTheFilesOfAnEarlierExportThatThisOneDidNotWrite) {
  const Model m;
  CKPTD_ASSERT_OK(WriteStep(7, m.Ranks()));
  CKPTD_ASSERT_OK(mem_.CreateDir(kOut));
  // Not an export's files: they stay.
  CKPTD_ASSERT_OK(mem_.SetFileContents("/out/README.md", "notes"));
  CKPTD_ASSERT_OK(mem_.SetFileContents("/out/model-extra.safetensors", "kept"));
  CKPTD_ASSERT_OK(mem_.CreateDir("/out/model-00009-of-00009.safetensors"));
  // An earlier export's shard of another count: it goes.
  CKPTD_ASSERT_OK(mem_.SetFileContents("/out/model-00002-of-00009.safetensors", "stale"));

  SafetensorsExportOptions split = TwoThreads();
  split.max_file_bytes = 200;
  CKPTD_ASSERT_OK(ExportSafetensors(store_, kJob, 7, kOut, split).status());
  EXPECT_THAT(ListOut(), ElementsAre("README.md", "model-00001-of-00004.safetensors",
                                     "model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors",
                                     "model-00004-of-00004.safetensors", "model-00009-of-00009.safetensors",
                                     "model-extra.safetensors", "model.safetensors.index.json"));

  // One file now: the split files and their index go (a loader would read them).
  CKPTD_ASSERT_OK(ExportSafetensors(store_, kJob, 7, kOut, TwoThreads()).status());
  EXPECT_THAT(ListOut(), ElementsAre("README.md", "model-00009-of-00009.safetensors", "model-extra.safetensors",
                                     "model.safetensors"));
  ExpectSafetensors(ReadFile(kModel), 7, {F32(m.a), F32(m.b), F32(m.c), F32(m.bias), F32(m.e)});
  EXPECT_EQ(ReadFile("/out/README.md"), "notes");

  // Split again: model.safetensors goes (a loader takes it before an index).
  CKPTD_ASSERT_OK(ExportSafetensors(store_, kJob, 7, kOut, split).status());
  EXPECT_FALSE(Exists(kModel));
  EXPECT_TRUE(Exists("/out/model.safetensors.index.json"));
}

TEST(ParseComponentListTest, NamesAllAndDuplicates) {
  EXPECT_THAT(ParseComponentList("params"), IsOkAndHolds(ElementsAre(ckptd::v1::PARAMS)));
  EXPECT_THAT(ParseComponentList("optimizer,params,optimizer"),
              IsOkAndHolds(ElementsAre(ckptd::v1::OPTIMIZER, ckptd::v1::PARAMS)));
  EXPECT_THAT(ParseComponentList("all"),
              IsOkAndHolds(ElementsAre(ckptd::v1::PARAMS, ckptd::v1::GRADS, ckptd::v1::OPTIMIZER,
                                                         ckptd::v1::RNG, ckptd::v1::DATA_CURSOR)));
  EXPECT_THAT(ParseComponentList("rng,data_cursor,grads"),
              IsOkAndHolds(ElementsAre(ckptd::v1::RNG, ckptd::v1::DATA_CURSOR, ckptd::v1::GRADS)));
  EXPECT_THAT(ParseComponentList("params,weights"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"weights\"")));
  EXPECT_THAT(ParseComponentList(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown")));
  EXPECT_THAT(ParseComponentList("params,"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown")));
  EXPECT_THAT(ParseComponentList("all,rng"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"all\"")));
}

TEST_F(SafetensorsExportTest, CreatesAMissingOutputDirectoryWithItsParents) {
  const Model m;
  CKPTD_ASSERT_OK(WriteStep(7, m.Ranks()));
  CKPTD_ASSERT_OK(ExportSafetensors(store_, kJob, 7, "/exports/job-a/step-7", TwoThreads()).status());
  ExpectSafetensors(ReadFile("/exports/job-a/step-7/model.safetensors"), 7,
                    {F32(m.a), F32(m.b), F32(m.c), F32(m.bias), F32(m.e)});
}

// Opaque bytes of the weights' component that each rank saved its own
// version of (ckptd.torch's record of a tracked object's non-tensor state
// names the rank that saved it) are exported per rank; the same bytes on
// every rank once; the weights around them whole.
TEST_F(SafetensorsExportTest, OpaqueBytesThatDifferByRankAreExportedPerRank) {
  const Global bias = MakeGlobal("bias", {5}, 0);
  std::vector<std::vector<Slice>> ranks;
  for (uint32_t r = 0; r < 3; ++r) {
    ranks.push_back({Opaque("model#meta", ckptd::v1::PARAMS, RngBytes(3, r)),
                     Opaque("shared#meta", ckptd::v1::PARAMS, RngBytes(3, 9)), Whole(bias)});
  }
  CKPTD_ASSERT_OK(WriteStep(3, ranks));
  CKPTD_ASSERT_OK_AND_ASSIGN(SafetensorsExport out, ExportSafetensors(store_, kJob, 3, kOut, TwoThreads()));
  const std::string f = "model.safetensors";
  EXPECT_THAT(out.tensors, ElementsAre(IsExported("bias", f, "F32", {5}, 20, 1),
                                       IsExported("rank0/model#meta", f, "U8", {16}, 16, 1),
                                       IsExported("rank1/model#meta", f, "U8", {16}, 16, 1),
                                       IsExported("rank2/model#meta", f, "U8", {16}, 16, 1),
                                       IsExported("shared#meta", f, "U8", {16}, 16, 1)));
  std::vector<Expected> want = {F32(bias), {"shared#meta", "U8", {16}, RngBytes(3, 9)}};
  for (uint32_t r = 0; r < 3; ++r) want.push_back({absl::StrCat("rank", r, "/model#meta"), "U8", {16}, RngBytes(3, r)});
  ExpectSafetensors(ReadFile(kModel), 3, want);

  // A tensor already named like a rank's copy is not overwritten by it.
  ranks[1].push_back(Opaque("rank1/model#meta", ckptd::v1::PARAMS, RngBytes(4, 4)));
  CKPTD_ASSERT_OK(WriteStep(4, ranks));
  EXPECT_THAT(ExportSafetensors(store_, kJob, 4, "/taken", TwoThreads()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("'model#meta' differs by rank"), HasSubstr("'rank1/model#meta'"))));
}

TEST_F(SafetensorsExportTest, CopiesWithoutALayoutThatDifferAreRejected) {
  const Global bias = MakeGlobal("bias", {5}, 0);
  const Global other = MakeGlobal("bias", {5}, 1);
  CKPTD_ASSERT_OK(WriteStep(1, {{Whole(bias)}, {Whole(other)}}));
  EXPECT_THAT(ExportSafetensors(store_, kJob, 1, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("'bias'"), HasSubstr("differ"), HasSubstr("global shape"))));
  EXPECT_FALSE(Exists(kModel));

  // The same bytes in another shape are not the same tensor either.
  const Global flat = MakeGlobal("w", {6}, 0);
  const Global square = MakeGlobal("w", {2, 3}, 0);
  CKPTD_ASSERT_OK(WriteStep(2, {{Whole(flat)}, {Whole(square)}}));
  EXPECT_THAT(ExportSafetensors(store_, kJob, 2, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kFailedPrecondition, AllOf(HasSubstr("'w'"), HasSubstr("differ"))));
}

TEST_F(SafetensorsExportTest, ASliceMissingLeavesAGap) {
  const Model m;
  std::vector<std::vector<Slice>> ranks = m.Ranks();
  ranks[3].erase(ranks[3].begin());  // rank 3 does not hold rows 6..7 of a.weight
  ASSERT_EQ(ranks[3].front().meta.name(), kRng);
  CKPTD_ASSERT_OK(WriteStep(7, ranks));
  EXPECT_THAT(ExportSafetensors(store_, kJob, 7, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("'a.weight'"), HasSubstr("cover 30 of the 40 elements of [0:8, 0:5]"))));
  EXPECT_FALSE(Exists(kModel));
}

TEST_F(SafetensorsExportTest, SlicesThatOverlapAreRejected) {
  const Global w = MakeGlobal("w", {4, 5}, 0);
  // Rows [0, 3) and [2, 4): row 2 twice.
  CKPTD_ASSERT_OK(WriteStep(1, {{Sharded(w, {0, 0}, {3, 5})}, {Sharded(w, {2, 0}, {2, 5})}}));
  EXPECT_THAT(ExportSafetensors(store_, kJob, 1, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("'w'"), HasSubstr("ranks 0 and 1"), HasSubstr("overlap"))));

  // Overlapping in both dimensions of a grid, with as many elements as the tensor.
  const Global g = MakeGlobal("g", {4, 4}, 0);
  CKPTD_ASSERT_OK(WriteStep(2, {{Sharded(g, {0, 0}, {2, 2})},
                                {Sharded(g, {1, 1}, {2, 2})},
                                {Sharded(g, {0, 2}, {2, 2})},
                                {Sharded(g, {2, 0}, {2, 4})}}));
  EXPECT_THAT(ExportSafetensors(store_, kJob, 2, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kFailedPrecondition, AllOf(HasSubstr("'g'"), HasSubstr("overlap"))));
  EXPECT_FALSE(Exists(kModel));
}

TEST_F(SafetensorsExportTest, DTypesThatDifferAreRejected) {
  const Global w = MakeGlobal("w", {4, 5}, 0);
  Slice half = Sharded(w, {2, 0}, {2, 5});
  half.meta.set_dtype(ckptd::v1::FLOAT16);
  half.bytes.resize(half.bytes.size() / 2);
  half.meta.set_raw_length(half.bytes.size());
  CKPTD_ASSERT_OK(WriteStep(1, {{Sharded(w, {0, 0}, {2, 5})}, {half}}));
  EXPECT_THAT(ExportSafetensors(store_, kJob, 1, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("'w'"), HasSubstr("FLOAT32 on rank 0"), HasSubstr("FLOAT16 on rank 1"))));
  EXPECT_FALSE(Exists(kModel));
}

TEST_F(SafetensorsExportTest, GlobalShapesThatDifferAreRejected) {
  const Global w = MakeGlobal("w", {4, 5}, 0);
  const Global longer = MakeGlobal("w", {6, 5}, 0);
  CKPTD_ASSERT_OK(WriteStep(1, {{Sharded(w, {0, 0}, {2, 5})}, {Sharded(longer, {2, 0}, {2, 5})}}));
  EXPECT_THAT(ExportSafetensors(store_, kJob, 1, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("'w'"), HasSubstr("global shape [4, 5] on rank 0"),
                             HasSubstr("[6, 5] on rank 1"))));

  // A layout on one rank and none on the other.
  const Global half = MakeGlobal("w", {2, 5}, 0);
  CKPTD_ASSERT_OK(WriteStep(2, {{Sharded(w, {0, 0}, {2, 5})}, {Whole(half)}}));
  EXPECT_THAT(ExportSafetensors(store_, kJob, 2, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("'w'"), HasSubstr("global layout on rank 0"), HasSubstr("none on rank 1"))));
  EXPECT_FALSE(Exists(kModel));
}

TEST_F(SafetensorsExportTest, AStepNotCommittedIsRefused) {
  const Model m;
  CKPTD_ASSERT_OK(WriteStep(7, m.Ranks(), /*commit=*/false));
  EXPECT_THAT(ExportSafetensors(store_, kJob, 7, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("step 7"), HasSubstr("not committed"))));
  EXPECT_FALSE(Exists(kModel));
}

TEST_F(SafetensorsExportTest, AQuarantinedStepIsRefused) {
  const Model m;
  CKPTD_ASSERT_OK(WriteStep(7, m.Ranks()));
  CKPTD_ASSERT_OK(store_.QuarantineStep(kJob, 7, "rank 2: chunk 0 checksum mismatch"));
  EXPECT_THAT(ExportSafetensors(store_, kJob, 7, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("step 7"), HasSubstr("quarantined"),
                             HasSubstr("chunk 0 checksum mismatch"))));
  EXPECT_FALSE(Exists(kModel));
}

TEST_F(SafetensorsExportTest, UnknownJobOrStepIsNotFound) {
  const Model m;
  CKPTD_ASSERT_OK(WriteStep(7, m.Ranks()));
  EXPECT_THAT(ExportSafetensors(store_, "job-b", 7, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-b")));
  EXPECT_THAT(ExportSafetensors(store_, "job-b", std::nullopt, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-b")));
  EXPECT_THAT(ExportSafetensors(store_, kJob, 8, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kNotFound, AllOf(HasSubstr(kJob), HasSubstr("step 8"))));
  EXPECT_FALSE(Exists(kModel));
}

TEST_F(SafetensorsExportTest, NoStepPicksTheNewestIntactCommittedStep) {
  CKPTD_ASSERT_OK(WriteStep(3, Model(3, 10).Ranks()));
  const Model five(5, 50);
  CKPTD_ASSERT_OK(WriteStep(5, five.Ranks()));
  CKPTD_ASSERT_OK(WriteStep(6, Model(6, 60).Ranks()));
  CKPTD_ASSERT_OK(store_.QuarantineStep(kJob, 6, "shard missing"));
  CKPTD_ASSERT_OK(WriteStep(9, Model(9, 90).Ranks(), /*commit=*/false));
  CKPTD_ASSERT_OK_AND_ASSIGN(SafetensorsExport out,
                             ExportSafetensors(store_, kJob, std::nullopt, kOut, TwoThreads()));
  EXPECT_EQ(out.step, 5u);
  ExpectSafetensors(ReadFile(kModel), 5,
                    {F32(five.a), F32(five.b), F32(five.c), F32(five.bias), F32(five.e)});
}

TEST_F(SafetensorsExportTest, NoIntactCommittedStepIsNotFound) {
  CKPTD_ASSERT_OK(WriteStep(3, Model(3).Ranks()));
  CKPTD_ASSERT_OK(store_.QuarantineStep(kJob, 3, "shard missing"));
  CKPTD_ASSERT_OK(WriteStep(4, Model(4).Ranks(), /*commit=*/false));
  EXPECT_THAT(ExportSafetensors(store_, kJob, std::nullopt, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(kJob)));
}

TEST_F(SafetensorsExportTest, AFlippedByteFailsTheExportAndLeavesNoFile) {
  const Model m;
  CKPTD_ASSERT_OK(WriteStep(7, m.Ranks()));
  // c.weight on rank 2: a.weight, b.weight and bias are written before it is read.
  const std::string rank2 = ShardPath("/root", kJob, 7, 2);
  uint64_t offset = 0;
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, ShardReader::Open(&mem_, rank2, OneThread()));
    const Tensor* t = reader->FindTensor("c.weight");
    ASSERT_NE(t, nullptr);
    ASSERT_GE(t->blocks_size(), 1);
    ASSERT_GE(t->blocks(0).chunks_size(), 1);
    const ckptd::v1::Chunk& c = t->blocks(0).chunks(0);
    ASSERT_GT(c.stored_length(), 0u);
    offset = c.file_offset() + c.stored_length() / 2;
  }
  FlipByte(rank2, offset);
  EXPECT_THAT(ExportSafetensors(store_, kJob, 7, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("'c.weight'"), HasSubstr("rank 2"))));
  EXPECT_FALSE(Exists(kModel));
  EXPECT_THAT(ListOut(), IsEmpty());  // no .model.safetensors.partial either
}

TEST_F(SafetensorsExportTest, AFailedExportLeavesTheFormerOneInPlace) {
  const Model m;
  CKPTD_ASSERT_OK(WriteStep(7, m.Ranks()));
  CKPTD_ASSERT_OK(ExportSafetensors(store_, kJob, 7, kOut, TwoThreads()).status());
  const std::string before = ReadFile(kModel);
  CKPTD_ASSERT_OK(WriteStep(8, Model(8, 80).Ranks()));
  const std::string rank0 = ShardPath("/root", kJob, 8, 0);
  uint64_t offset = 0;
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, ShardReader::Open(&mem_, rank0, OneThread()));
    const Tensor* t = reader->FindTensor("e.weight");
    ASSERT_NE(t, nullptr);
    offset = t->blocks(0).chunks(0).file_offset();
  }
  FlipByte(rank0, offset);
  EXPECT_THAT(ExportSafetensors(store_, kJob, 8, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("'e.weight'")));
  EXPECT_EQ(ReadFile(kModel), before);
  EXPECT_THAT(ListOut(), ElementsAre("model.safetensors"));
}

// Of an export in several files, the failing one writes none into place:
// the earlier files and index stay as they were, and never mix.
TEST_F(SafetensorsExportTest, AFailedSplitExportLeavesTheFormerFilesAndIndexInPlace) {
  const Model m;
  CKPTD_ASSERT_OK(WriteStep(7, m.Ranks()));
  SafetensorsExportOptions split = TwoThreads();
  split.max_file_bytes = 200;
  CKPTD_ASSERT_OK(ExportSafetensors(store_, kJob, 7, kOut, split).status());
  const std::vector<std::string> files = ListOut();
  ASSERT_EQ(files.size(), 5u);
  std::vector<std::string> before;
  for (const std::string& f : files) before.push_back(ReadFile(absl::StrCat(kOut, "/", f)));
  CKPTD_ASSERT_OK(WriteStep(8, Model(8, 80).Ranks()));
  // Damage a tensor of the last file (e.weight; rank 1's slice is read,
  // rank 3's replica of it is not).
  const std::string rank1 = ShardPath("/root", kJob, 8, 1);
  uint64_t offset = 0;
  {
    CKPTD_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardReader> reader, ShardReader::Open(&mem_, rank1, OneThread()));
    const Tensor* t = reader->FindTensor("e.weight");
    ASSERT_NE(t, nullptr);
    offset = t->blocks(0).chunks(0).file_offset();
  }
  FlipByte(rank1, offset);
  EXPECT_THAT(ExportSafetensors(store_, kJob, 8, kOut, split),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("'e.weight'")));
  EXPECT_EQ(ListOut(), files);
  for (size_t i = 0; i < files.size(); ++i) {
    EXPECT_EQ(ReadFile(absl::StrCat(kOut, "/", files[i])), before[i]) << files[i];
  }
}

TEST_F(SafetensorsExportTest, AShardOfAnotherStepIsDataLoss) {
  CKPTD_ASSERT_OK(WriteStep(7, Model(7).Ranks()));
  CKPTD_ASSERT_OK(WriteStep(8, Model(8).Ranks()));
  // Step 8's shard of rank 1 in place of step 7's.
  CKPTD_ASSERT_OK(mem_.SetFileContents(ShardPath("/root", kJob, 7, 1), ReadFile(ShardPath("/root", kJob, 8, 1))));
  EXPECT_THAT(ExportSafetensors(store_, kJob, 7, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("MANIFEST")));
  EXPECT_FALSE(Exists(kModel));
}

TEST_F(SafetensorsExportTest, TheReservedMetadataNameIsRejected) {
  const Global w = MakeGlobal("__metadata__", {3}, 0);
  CKPTD_ASSERT_OK(WriteStep(1, {{Whole(w)}}));
  EXPECT_THAT(ExportSafetensors(store_, kJob, 1, kOut, TwoThreads()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("'__metadata__'"), HasSubstr("reserved"))));
  EXPECT_FALSE(Exists(kModel));
}

TEST_F(SafetensorsExportTest, NothingToExportIsAnError) {
  const Global w = MakeGlobal("w", {3}, 0);
  CKPTD_ASSERT_OK(WriteStep(1, {{Whole(w)}}));
  SafetensorsExportOptions options = TwoThreads();
  options.components = {ckptd::v1::OPTIMIZER};
  EXPECT_THAT(ExportSafetensors(store_, kJob, 1, kOut, options),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("step 1")));
  options.components = {};
  EXPECT_THAT(ExportSafetensors(store_, kJob, 1, kOut, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("component")));
}

}  // namespace
}  // namespace ckptd::storage
