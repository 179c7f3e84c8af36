// Writes one rank's shard file: blocks are encoded on a thread pool while
// earlier blocks are written (several writes in flight), then the index and
// footer; the file is fsynced under a temp name, renamed into place, and its
// directory fsynced. Nothing is left behind on failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ckptd/v1/shard.pb.h"
#include "storage/codec.h"
#include "storage/file_system.h"

namespace ckptd::base {
class Clock;
class ThreadPool;
}  // namespace ckptd::base

namespace ckptd::storage {

// One buffer to store. `meta` carries name, component, dtype, shape, sharding
// and device; the writer fills raw_length and blocks.
struct TensorSource {
  ckptd::v1::Tensor meta;
  const void* data = nullptr;
  size_t length = 0;
};

struct ShardIdentity {
  std::string job;
  uint64_t step = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
};

// What a shard write has measured so far, for adaptive compression.
struct CompressionRates {
  // Raw bytes per second (wall time, from the first encode) that the
  // encoders handed to the writer: what they do when the disk waits for
  // them, a lower bound of what they could do when it does not.
  double encode_bytes_per_second = 0;
  // Bytes per second the target took while at least one write was in flight.
  double write_bytes_per_second = 0;
  // Raw bytes over bytes written, of the blocks encoded with compression.
  double ratio = 1;
};

// Whether compressing the next blocks gets them to the disk at least
// `margin` times as fast as writing them raw would. Compressed, raw bytes
// reach the disk at min(encode, ratio x write) bytes/s; raw, at about the
// write rate (a raw block costs a checksum, no copy): compression pays when
// min(encode, ratio x write) >= margin x write. Rates that are not positive
// (nothing measured) say it pays.
bool CompressionPays(const CompressionRates& rates, double margin);

// Compression that stops when it would make the shard durable later than
// raw writes: with a disk faster than the encoders get CPU for (a fast NVMe,
// encoders at idle priority beside a busy trainer), or data that does not
// compress. Needs EncodeOptions::compress. Blocks carry their own filter and
// codecs (docs/format.md), so a shard may mix compressed and raw blocks.
// AdaptiveCompression::margin beside trainers whose CPU time counts more
// than the shard's durable time (an agent whose background work runs at idle
// or low priority): compression must get the data to disk 1.5 times as fast
// to be kept. Float state (about 1.2x smaller compressed) is then written
// raw; state that compresses well (sparse, low-entropy) still is not.
inline constexpr double kCompressionMarginBesideTraining = 1.5;

struct AdaptiveCompression {
  bool enabled = false;
  // How much faster compression must be to keep it (>= 1: raw writes also
  // spare the CPU the trainers use).
  double margin = 1.1;
  // Blocks whose writes complete before the first decision, and between
  // later ones. Once a decision says raw, the rest of the shard is raw (each
  // shard starts compressed and measures again).
  int decide_every_blocks = 8;
  // Replaces CompressionPays(rates, margin) (tests, experiments).
  std::function<bool(const CompressionRates&)> decide;
  // Measures the rates (null: base::RealClock::Get()).
  base::Clock* clock = nullptr;
};

struct ShardWriteOptions {
  EncodeOptions encode;
  AdaptiveCompression adaptive;
  // Raw bytes per block, the unit of compression and of one write.
  size_t block_bytes = 4u << 20;
  // Encoder threads when no pool is passed; <= 0: one per hardware thread.
  int threads = 0;
  // Writes kept in flight.
  int writes_in_flight = 8;
  bool direct_io = true;
  // Asked before each block's write is submitted, once more before the
  // index is written and once more before the fsync: true stops the write
  // there (kCancelled, saying how far it got), and the temp file is removed:
  // nothing of the shard is left. Null: never stops. An agent shutting down
  // stops its persists at the end of its grace period.
  std::function<bool()> stop;
  // Buffered writes (direct_io off, or a file system that cannot write
  // direct) start writeback every this many bytes of completed block writes
  // (WritebackPacer), so that the fsync at the end has little left to
  // flush; 0: only the fsync writes back.
  uint64_t writeback_bytes = kWritebackBytes;
  // The index's creation time (0: now). A shard written again from the same
  // bytes with the same options and this time is the same file, to the byte
  // (an emergency persist of a memory checkpoint, whose index was computed
  // earlier).
  int64_t created_unix_nanos = 0;
};

struct ShardWriteResult {
  std::string path;
  uint64_t file_length = 0;
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;
  uint64_t index_xxh3 = 0;
  // Adaptive compression: the rates of the last decision (none: zero), and
  // the blocks written raw after a decision said so.
  int compression_decisions = 0;
  CompressionRates compression_rates;
  uint64_t blocks_raw_by_decision = 0;
  // The index as written (each block's raw_xxh3 checks a copy of the
  // tensors kept in memory).
  std::shared_ptr<const ckptd::v1::ShardIndex> index;
};

// Validates the tensors (names unique and non-empty, dtype known, length a
// whole number of elements matching the shape) before touching the disk.
absl::Status ValidateTensorSources(absl::Span<const TensorSource> tensors);

// Writes `tensors` to `path` (through `path` + ".tmp"). `pool` may be null.
absl::StatusOr<ShardWriteResult> WriteShard(FileSystem* fs, const std::string& path,
                                            const ShardIdentity& identity,
                                            absl::Span<const TensorSource> tensors,
                                            const ShardWriteOptions& options, base::ThreadPool* pool = nullptr);

}  // namespace ckptd::storage
