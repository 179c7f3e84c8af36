// Reads a shard file: the footer and index are checked before anything is
// trusted; blocks are read with several reads in flight and decoded and
// verified in parallel, straight into the caller's buffers.
#pragma once

#include "absl/strings/string_view.h"
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ckptd/v1/shard.pb.h"
#include "storage/file_system.h"

namespace ckptd::base {
class ThreadPool;
}  // namespace ckptd::base

namespace ckptd::storage {

struct ShardReadOptions {
  int threads = 0;  // decoder threads when no pool is passed; <= 0: one per hardware thread
  int reads_in_flight = 8;
  bool direct_io = true;
  // Open a symbolic link at the shard's path as what it points to
  // (OpenOptions::follow_symlinks): only for a path an operator names.
  bool follow_symlinks = false;
  // Upper bound on read and scratch buffers (at least one block's worth is
  // always allocated).
  uint64_t max_buffer_bytes = 1ull << 30;
};

// Where to put one tensor: exactly its raw_length bytes.
struct TensorDest {
  std::string name;
  void* data = nullptr;
  size_t length = 0;
};

// Where to put part of one tensor: `length` bytes from byte `offset` of its
// raw bytes.
struct RangeDest {
  std::string name;
  uint64_t offset = 0;
  uint64_t length = 0;
  void* data = nullptr;
};

// One failure found by Verify.
struct VerifyProblem {
  std::string file;    // the shard or manifest at fault
  std::string tensor;  // empty when the file as a whole is at fault
  int block = -1;
  int chunk = -1;
  std::string message;
};

class ShardReader {
 public:
  // Opens `path`, checks header, footer and index. kDataLoss names what is
  // wrong (a FIFO or link in place of the shard included); kNotFound when the
  // file does not exist.
  static absl::StatusOr<std::unique_ptr<ShardReader>> Open(FileSystem* fs, const std::string& path,
                                                           const ShardReadOptions& options = {},
                                                           base::ThreadPool* pool = nullptr);
  ~ShardReader();

  const std::string& path() const { return path_; }
  const ckptd::v1::ShardIndex& index() const { return index_; }
  uint64_t index_xxh3() const { return index_xxh3_; }
  uint64_t file_length() const { return file_length_; }
  // nullptr when absent.
  const ckptd::v1::Tensor* FindTensor(absl::string_view name) const;

  // Reads the named tensors into their buffers, verifying every chunk; on an
  // error the buffers hold unspecified bytes. A name
  // not in the shard is kNotFound, a length that differs kInvalidArgument;
  // both name the tensor. Corruption is kDataLoss naming tensor, block, chunk.
  absl::Status ReadTensors(absl::Span<const TensorDest> dests);

  // Reads parts of tensors: only the blocks that hold them are read, each
  // once however many ranges it serves, decoded and verified whole (a
  // block's checksums cover all of it), and the ranges copied out. Errors
  // as ReadTensors; a range past the tensor's end is kInvalidArgument.
  absl::Status ReadRanges(absl::Span<const RangeDest> ranges);

  // Reads and verifies every block of every tensor. Returns the problems
  // found (empty when the shard is intact); an I/O error that stops the scan
  // is returned as a status.
  absl::StatusOr<std::vector<VerifyProblem>> Verify();

 private:
  ShardReader() = default;
  struct Job;
  absl::Status RunBlocks(Job& job);

  FileSystem* fs_ = nullptr;
  std::string path_;
  ShardReadOptions options_;
  base::ThreadPool* pool_ = nullptr;
  std::unique_ptr<base::ThreadPool> own_pool_;
  std::unique_ptr<ReadableFile> file_;
  ckptd::v1::ShardIndex index_;
  uint64_t index_xxh3_ = 0;
  uint64_t file_length_ = 0;
};

}  // namespace ckptd::storage
