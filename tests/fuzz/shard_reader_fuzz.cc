// libFuzzer target for ShardReader: the input is one shard file.
//
// Each input is read twice: as it is (the path a damaged file takes), and
// "repaired": the header, footer and index checksums, the chunk checksums in
// the index and the index totals recomputed, so that mutations get past the
// checksums into index validation and block decoding. Beyond the sanitizers,
// the target checks the reader's contracts:
//   - Open fails only with kDataLoss or kUnimplemented;
//   - an opened shard passes ValidateShardIndex, and its tensors are found by name;
//   - Verify returns ok (no I/O errors in memory) and ReadTensors succeeds
//     exactly when Verify finds no problem, failing only with kDataLoss;
//   - after a successful ReadTensors every block's bytes match its raw_xxh3.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "base/thread_pool.h"
#include "ckptd/v1/shard.pb.h"
#include "format/checksum.h"
#include "google/protobuf/stubs/logging.h"
#include "storage/mem_file_system.h"
#include "storage/shard_format.h"
#include "storage/shard_index.h"
#include "storage/shard_reader.h"

namespace {

using ckptd::storage::GetFixed64;
using ckptd::storage::kShardAlignment;
using ckptd::storage::kShardFooterBytes;
using ckptd::storage::kShardHeaderBlock;
using ckptd::storage::kShardHeaderBytes;
using ckptd::storage::PutFixed64;
using ckptd::format::Xxh3;

// Inputs whose index claims more raw bytes than this are opened only.
constexpr uint64_t kMaxRawBytes = 64ull << 20;
constexpr char kDir[] = "/fuzz";
constexpr char kPath[] = "/fuzz/rank-0.shard";

[[noreturn]] void Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "fuzz_shard_reader: contract violated: %s: %s\n", what, status.ToString().c_str());
  std::fflush(stderr);
  std::abort();
}
#define FUZZ_CHECK(cond, what, status) \
  do {                                 \
    if (!(cond)) Fail(what, status);   \
  } while (0)

struct Env {
  ckptd::storage::MemFileSystem fs;
  ckptd::base::ThreadPool pool{1};
};

Env& GetEnv() {
  // Leaked on purpose: the pool's thread outlives any static destruction order.
  static Env* env = [] {
    Env* e = new Env;
    absl::Status s = e->fs.CreateDir(kDir);
    if (!s.ok()) Fail("CreateDir", s);
    return e;
  }();
  return *env;
}

void Exercise(const std::string& bytes) {
  Env& env = GetEnv();
  if (absl::Status s = env.fs.SetFileContents(kPath, bytes); !s.ok()) Fail("SetFileContents", s);

  ckptd::storage::ShardReadOptions options;
  options.threads = 1;
  options.reads_in_flight = 2;
  options.direct_io = false;
  absl::StatusOr<std::unique_ptr<ckptd::storage::ShardReader>> opened =
      ckptd::storage::ShardReader::Open(&env.fs, kPath, options, &env.pool);
  if (!opened.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(opened.status()) || absl::IsUnimplemented(opened.status()),
               "Open failed with an unexpected code", opened.status());
    return;
  }
  ckptd::storage::ShardReader& reader = **opened;
  const ckptd::v1::ShardIndex& index = reader.index();
  FUZZ_CHECK(reader.file_length() == bytes.size(), "file_length", absl::OkStatus());
  {
    absl::Status again = ckptd::storage::ValidateShardIndex(index, GetFixed64(reinterpret_cast<const uint8_t*>(
                                                                        bytes.data() + bytes.size() - 48)),
                                                            index.format_version(), "fuzz");
    FUZZ_CHECK(again.ok(), "an opened index does not validate", again);
  }
  for (const ckptd::v1::Tensor& t : index.tensors()) {
    FUZZ_CHECK(reader.FindTensor(t.name()) == &t, "FindTensor", absl::OkStatus());
  }
  if (index.raw_bytes() > kMaxRawBytes) return;

  absl::StatusOr<std::vector<ckptd::storage::VerifyProblem>> problems = reader.Verify();
  FUZZ_CHECK(problems.ok(), "Verify returned an error status from memory", problems.status());

  // One buffer per tensor, exactly raw_length bytes.
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
  std::vector<ckptd::storage::TensorDest> dests;
  buffers.reserve(index.tensors_size());
  dests.reserve(index.tensors_size());
  for (const ckptd::v1::Tensor& t : index.tensors()) {
    buffers.emplace_back(new uint8_t[t.raw_length()]);
    dests.push_back({t.name(), buffers.back().get(), static_cast<size_t>(t.raw_length())});
  }
  absl::Status read = reader.ReadTensors(dests);
  FUZZ_CHECK(read.ok() || absl::IsDataLoss(read), "ReadTensors failed with an unexpected code", read);
  if (problems->empty() != read.ok()) {
    std::fprintf(stderr, "fuzz_shard_reader: Verify found %zu problems but ReadTensors says %s\n",
                 problems->size(), read.ToString().c_str());
    for (const auto& p : *problems) std::fprintf(stderr, "  problem: %s\n", p.message.c_str());
    Fail("Verify and ReadTensors disagree", read);
  }
  if (read.ok()) {
    for (int t = 0; t < index.tensors_size(); ++t) {
      for (const ckptd::v1::Block& b : index.tensors(t).blocks()) {
        FUZZ_CHECK(Xxh3(buffers[t].get() + b.raw_offset(), b.raw_length()) == b.raw_xxh3(),
                   "a block read back does not match its raw_xxh3", absl::OkStatus());
      }
    }
  }

  // Argument errors: a wrong length and an unknown name.
  if (!dests.empty()) {
    ckptd::storage::TensorDest wrong = dests[0];
    wrong.length += 1;
    absl::Status s = reader.ReadTensors({&wrong, 1});
    FUZZ_CHECK(absl::IsInvalidArgument(s), "ReadTensors with a wrong length", s);
  }
  ckptd::storage::TensorDest missing{"\xff no such tensor \xff", nullptr, 0};
  absl::Status s = reader.ReadTensors({&missing, 1});
  FUZZ_CHECK(absl::IsNotFound(s) || reader.FindTensor(missing.name) != nullptr, "ReadTensors of an unknown name", s);
}

// Rewrites what a mutation is unlikely to get right by chance: the length is
// rounded down to the alignment, the footer's file_length set, the index's
// chunk checksums and totals recomputed, and the header, index and footer
// checksums recomputed. nullopt when nothing would change or the input is too
// short to be a shard.
std::optional<std::string> Repair(const std::string& in) {
  const size_t size = in.size() / kShardAlignment * kShardAlignment;
  if (size < kShardHeaderBlock + kShardAlignment) return std::nullopt;
  std::string f = in.substr(0, size);
  uint8_t* p = reinterpret_cast<uint8_t*>(f.data());
  PutFixed64(p + 56, Xxh3(p, 56));
  static_assert(kShardHeaderBytes == 64);

  uint8_t* footer = p + size - kShardFooterBytes;
  const uint64_t index_limit = size - kShardFooterBytes;
  const uint64_t index_offset = GetFixed64(footer + 16);
  uint64_t index_length = GetFixed64(footer + 24);
  if (index_offset >= kShardHeaderBlock && index_offset % kShardAlignment == 0 && index_offset <= index_limit &&
      index_length <= index_limit - index_offset) {
    ckptd::v1::ShardIndex index;
    if (index.ParseFromArray(p + index_offset, static_cast<int>(index_length))) {
      uint64_t raw = 0;
      uint64_t stored = 0;
      for (ckptd::v1::Tensor& t : *index.mutable_tensors()) {
        raw += t.raw_length();
        for (ckptd::v1::Block& b : *t.mutable_blocks()) {
          for (ckptd::v1::Chunk& c : *b.mutable_chunks()) {
            stored += c.stored_length();
            if (c.file_offset() <= size && c.stored_length() <= size - c.file_offset()) {
              c.set_stored_xxh3(Xxh3(p + c.file_offset(), c.stored_length()));
            }
          }
        }
      }
      index.set_raw_bytes(raw);
      index.set_stored_bytes(stored);
      std::string serialized;
      if (index.SerializeToString(&serialized) && serialized.size() <= index_limit - index_offset) {
        std::memcpy(p + index_offset, serialized.data(), serialized.size());
        std::memset(p + index_offset + serialized.size(), 0, index_limit - index_offset - serialized.size());
        index_length = serialized.size();
        PutFixed64(footer + 24, index_length);
      }
    }
    PutFixed64(footer + 32, Xxh3(p + index_offset, index_length));
  }
  PutFixed64(footer + 40, size);
  PutFixed64(footer + 56, Xxh3(footer, 56));
  if (f == in) return std::nullopt;
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Invalid UTF-8 in string fields is logged by protobuf on every such input.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  Exercise(bytes);
  if (std::optional<std::string> repaired = Repair(bytes)) Exercise(*repaired);
  return 0;
}
