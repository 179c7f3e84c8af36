#include "storage/shard_reader.h"

#include "absl/strings/string_view.h"
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "base/aligned_buffer.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "format/checksum.h"
#include "storage/codec.h"
#include "storage/shard_format.h"
#include "storage/shard_index.h"

namespace ckptd::storage {

using ckptd::v1::Block;
using ckptd::v1::Tensor;

namespace {

// "chunk 3: ..." -> 3, as BlockDecoder prefixes chunk errors.
int ChunkOfMessage(absl::string_view message) {
  int chunk = -1;
  if (absl::ConsumePrefix(&message, "chunk ")) {
    size_t colon = message.find(':');
    if (colon != absl::string_view::npos && !absl::SimpleAtoi(message.substr(0, colon), &chunk)) chunk = -1;
  }
  return chunk;
}

}  // namespace

struct ShardReader::Job {
  // Part of a decoded block copied out: `length` bytes at `offset` in it.
  struct Copy {
    uint64_t offset = 0;
    uint64_t length = 0;
    uint8_t* to = nullptr;
  };
  struct Item {
    int tensor = 0;
    int block = 0;
    uint8_t* dest = nullptr;  // null: decode into the slot's scratch (verification, copies)
    std::vector<Copy> copies;  // from the scratch, once decoded and verified
  };
  std::vector<Item> items;
  bool verify = false;  // collect every problem instead of stopping at the first
  bool scratch = false;  // some item decodes into scratch (verify, or copies)
  std::vector<VerifyProblem> problems;
};

namespace {

struct ReadSlot {
  base::AlignedBuffer buffer;
  base::AlignedBuffer scratch;
  size_t item = 0;
  uint64_t ticket = 0;
  bool in_place = false;  // read straight into the destination (raw, aligned)
};

// A block stored as one raw chunk can be read straight into an aligned
// destination and checked there, without a copy.
bool CanReadInPlace(const Block& block, const uint8_t* dest) {
  return dest != nullptr && block.filter() == ckptd::v1::FILTER_NONE && block.chunks_size() == 1 &&
         block.chunks(0).codec() == ckptd::v1::RAW &&
         base::IsAligned(reinterpret_cast<uintptr_t>(dest), kShardAlignment) &&
         base::IsAligned(block.raw_length(), kShardAlignment);
}

}  // namespace

ShardReader::~ShardReader() = default;

absl::StatusOr<std::unique_ptr<ShardReader>> ShardReader::Open(FileSystem* fs, const std::string& path,
                                                               const ShardReadOptions& options,
                                                               base::ThreadPool* pool) {
  std::unique_ptr<ShardReader> r(new ShardReader());
  r->fs_ = fs;
  r->path_ = path;
  r->options_ = options;
  r->pool_ = pool;
  OpenOptions open;
  open.direct_io = options.direct_io;
  open.follow_symlinks = options.follow_symlinks;
  CKPTD_ASSIGN_OR_RETURN(r->file_, fs->NewReadableFile(path, open));
  const uint64_t size = r->file_->size();
  r->file_length_ = size;
  base::AlignedBuffer block(kShardAlignment, kShardAlignment);
  if (size < kShardHeaderBlock) {
    return absl::DataLossError(absl::StrCat(path, ": file of ", size,
                                            " bytes is too short to be a shard (truncated?)"));
  }
  // Magic and version first, so that a newer format is named as such.
  CKPTD_RETURN_IF_ERROR(r->file_->ReadAt(0, block.data(), kShardAlignment));
  CKPTD_ASSIGN_OR_RETURN(const uint32_t version, DecodeShardHeader(block.data(), path));
  if (size < kShardHeaderBlock + kShardAlignment) {
    return absl::DataLossError(absl::StrCat(path, ": file of ", size,
                                            " bytes is too short to be a shard (truncated?)"));
  }
  if (!base::IsAligned(size, kShardAlignment)) {
    return absl::DataLossError(absl::StrCat(path, ": file length ", size, " is not a multiple of ",
                                            kShardAlignment, " (truncated or extended?)"));
  }
  CKPTD_RETURN_IF_ERROR(r->file_->ReadAt(size - kShardAlignment, block.data(), kShardAlignment));
  CKPTD_ASSIGN_OR_RETURN(ShardFooter footer,
                         DecodeShardFooter(block.data() + kShardAlignment - kShardFooterBytes, size, path));

  if (footer.format_version != version) {
    return absl::DataLossError(absl::StrCat(path, ": footer version ", footer.format_version,
                                            " does not match the header's ", version));
  }
  base::AlignedBuffer index_buf(std::max<uint64_t>(footer.index_length, 1), kShardAlignment);
  CKPTD_RETURN_IF_ERROR(r->file_->ReadAt(footer.index_offset, index_buf.data(), index_buf.capacity()));
  if (format::Xxh3(index_buf.data(), footer.index_length) != footer.index_xxh3) {
    return absl::DataLossError(absl::StrCat(path, ": index checksum mismatch"));
  }
  if (!r->index_.ParseFromArray(index_buf.data(), static_cast<int>(footer.index_length))) {
    return absl::DataLossError(absl::StrCat(path, ": index does not parse"));
  }
  CKPTD_RETURN_IF_ERROR(ValidateShardIndex(r->index_, footer.index_offset, version, path));
  r->index_xxh3_ = footer.index_xxh3;
  return r;
}

const Tensor* ShardReader::FindTensor(absl::string_view name) const {
  for (const Tensor& t : index_.tensors()) {
    if (t.name() == name) return &t;
  }
  return nullptr;
}

absl::Status ShardReader::ReadTensors(absl::Span<const TensorDest> dests) {
  absl::flat_hash_map<absl::string_view, int> by_name;
  for (int i = 0; i < index_.tensors_size(); ++i) by_name[index_.tensors(i).name()] = i;
  Job job;
  for (const TensorDest& d : dests) {
    auto it = by_name.find(d.name);
    if (it == by_name.end()) {
      return absl::NotFoundError(
          absl::StrCat("tensor '", absl::CHexEscape(d.name), "' is not in shard ", path_));
    }
    const Tensor& t = index_.tensors(it->second);
    if (d.length != t.raw_length()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", absl::CHexEscape(d.name), "' is ",
                                                     t.raw_length(), " bytes in shard ", path_, " but its buffer is ",
                                                     d.length, " bytes"));
    }
    if (d.length > 0 && d.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", absl::CHexEscape(d.name), "' has no buffer"));
    }
    for (int b = 0; b < t.blocks_size(); ++b) {
      job.items.push_back({it->second, b, static_cast<uint8_t*>(d.data) + t.blocks(b).raw_offset(), {}});
    }
  }
  return RunBlocks(job);
}

absl::Status ShardReader::ReadRanges(absl::Span<const RangeDest> ranges) {
  absl::flat_hash_map<absl::string_view, int> by_name;
  for (int i = 0; i < index_.tensors_size(); ++i) by_name[index_.tensors(i).name()] = i;
  // Each block's copies, whichever ranges they come from.
  std::map<std::pair<int, int>, std::vector<Job::Copy>> copies;
  for (const RangeDest& r : ranges) {
    auto it = by_name.find(r.name);
    if (it == by_name.end()) {
      return absl::NotFoundError(absl::StrCat("tensor '", absl::CHexEscape(r.name), "' is not in shard ", path_));
    }
    const Tensor& t = index_.tensors(it->second);
    if (r.offset > t.raw_length() || r.length > t.raw_length() - r.offset) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", absl::CHexEscape(r.name), "' is ", t.raw_length(),
                                                     " bytes in shard ", path_, ": bytes [", r.offset, ", +",
                                                     r.length, ") are past its end"));
    }
    if (r.length == 0) continue;
    if (r.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", absl::CHexEscape(r.name), "' has no buffer"));
    }
    // Blocks cover the tensor in order: the first that ends past the range's start.
    const auto& blocks = t.blocks();
    auto b = std::upper_bound(blocks.begin(), blocks.end(), r.offset, [](uint64_t off, const Block& block) {
      return off < block.raw_offset() + block.raw_length();
    });
    const uint64_t end = r.offset + r.length;
    for (; b != blocks.end() && b->raw_offset() < end; ++b) {
      const uint64_t from = std::max(r.offset, b->raw_offset());
      const uint64_t to = std::min(end, b->raw_offset() + b->raw_length());
      copies[{it->second, static_cast<int>(b - blocks.begin())}].push_back(
          {from - b->raw_offset(), to - from, static_cast<uint8_t*>(r.data) + (from - r.offset)});
    }
  }
  Job job;
  for (auto& [where, list] : copies) {
    const Block& block = index_.tensors(where.first).blocks(where.second);
    if (list.size() == 1 && list[0].offset == 0 && list[0].length == block.raw_length()) {
      job.items.push_back({where.first, where.second, list[0].to, {}});  // the whole block: decoded in place
    } else {
      job.scratch = true;
      job.items.push_back({where.first, where.second, nullptr, std::move(list)});
    }
  }
  return RunBlocks(job);
}

absl::StatusOr<std::vector<VerifyProblem>> ShardReader::Verify() {
  Job job;
  job.verify = true;
  job.scratch = true;
  for (int t = 0; t < index_.tensors_size(); ++t) {
    for (int b = 0; b < index_.tensors(t).blocks_size(); ++b) job.items.push_back({t, b, nullptr, {}});
  }
  CKPTD_RETURN_IF_ERROR(RunBlocks(job));
  return std::move(job.problems);
}

absl::Status ShardReader::RunBlocks(Job& job) {
  if (job.items.empty()) return absl::OkStatus();
  if (pool_ == nullptr) {
    own_pool_ = std::make_unique<base::ThreadPool>(options_.threads);
    pool_ = own_pool_.get();
  }
  uint64_t max_range = 0;
  uint64_t max_raw = 0;
  for (const Job::Item& item : job.items) {
    const Block& block = index_.tensors(item.tensor).blocks(item.block);
    max_range = std::max(max_range, BlockFileRange(block).length);
    max_raw = std::max(max_raw, block.raw_length());
  }
  const int reads = std::max(1, options_.reads_in_flight);
  // Slots are bounded by count and by memory: an index may declare large
  // blocks that compress to almost nothing.
  const uint64_t slot_bytes = max_range + (job.scratch ? max_raw : 0);
  const uint64_t by_memory = std::max<uint64_t>(1, options_.max_buffer_bytes / std::max<uint64_t>(slot_bytes, 1));
  const size_t nslots = std::min<size_t>({job.items.size(), static_cast<size_t>(pool_->size() + reads),
                                          static_cast<size_t>(by_memory)});
  std::vector<ReadSlot> slots(nslots);
  std::vector<ReadSlot*> free_slots;
  for (ReadSlot& s : slots) {
    s.buffer = base::AlignedBuffer(max_range, kShardAlignment);
    if (job.scratch) s.scratch = base::AlignedBuffer(max_raw, kShardAlignment);
    free_slots.push_back(&s);
  }

  absl::Mutex mu;
  std::vector<ReadSlot*> returned;  // guarded by mu: slots whose decode finished
  absl::Status first_error;         // guarded by mu
  base::WaitGroup pending;

  auto where = [&](const Job::Item& item) {
    return absl::StrCat(path_, ": tensor '", absl::CHexEscape(index_.tensors(item.tensor).name()), "' block ",
                        item.block);
  };
  // REQUIRES: mu held.
  auto record = [&](const Job::Item& item, const absl::Status& s) {
    if (job.verify) {
      job.problems.push_back({path_, index_.tensors(item.tensor).name(), item.block, ChunkOfMessage(s.message()),
                              absl::StrCat(where(item), ": ", s.message())});
    } else if (first_error.ok()) {
      first_error = absl::Status(s.code(), absl::StrCat(where(item), ": ", s.message()));
    }
  };

  std::deque<ReadSlot*> in_flight;
  size_t next = 0;
  absl::Status io_status;
  while (true) {
    {
      absl::MutexLock l(&mu);
      if (!first_error.ok()) break;
      if (in_flight.empty() && free_slots.empty() && next < job.items.size()) {
        mu.Await(absl::Condition(
            +[](std::vector<ReadSlot*>* r) { return !r->empty(); }, &returned));
      }
      free_slots.insert(free_slots.end(), returned.begin(), returned.end());
      returned.clear();
    }
    while (!free_slots.empty() && next < job.items.size() && static_cast<int>(in_flight.size()) < reads) {
      ReadSlot* slot = free_slots.back();
      free_slots.pop_back();
      slot->item = next++;
      const Job::Item& item = job.items[slot->item];
      const Block& block = index_.tensors(item.tensor).blocks(item.block);
      const ByteRange range = BlockFileRange(block);
      slot->in_place = CanReadInPlace(block, item.dest);
      absl::StatusOr<uint64_t> ticket =
          file_->Read(range.offset, slot->in_place ? item.dest : slot->buffer.data(), range.length);
      if (!ticket.ok()) {
        io_status = ticket.status();
        break;
      }
      slot->ticket = *ticket;
      in_flight.push_back(slot);
    }
    if (!io_status.ok() || in_flight.empty()) break;

    ReadSlot* slot = in_flight.front();
    in_flight.pop_front();
    const Job::Item& item = job.items[slot->item];
    if (absl::Status s = file_->WaitFor(slot->ticket); !s.ok()) {
      // A file whose transfer failed fails every later call: stop here.
      absl::MutexLock l(&mu);
      record(item, s);
      io_status = job.verify ? absl::OkStatus() : s;
      break;
    }
    pending.Add();
    pool_->Schedule([&, slot] {
      const Job::Item& it = job.items[slot->item];
      const Block& block = index_.tensors(it.tensor).blocks(it.block);
      absl::Status s;
      if (slot->in_place) {
        const uint64_t sum = format::Xxh3(it.dest, block.raw_length());
        if (sum != block.chunks(0).stored_xxh3() || sum != block.raw_xxh3()) {
          s = absl::DataLossError(absl::StrCat("chunk 0: checksum mismatch (stored xxh3 ", format::ChecksumHex(sum),
                                               ", expected ", format::ChecksumHex(block.chunks(0).stored_xxh3()), ")"));
        }
      } else {
        const uint64_t base = block.chunks(0).file_offset();
        std::vector<const uint8_t*> chunk_data;
        chunk_data.reserve(block.chunks_size());
        for (const auto& c : block.chunks()) chunk_data.push_back(slot->buffer.data() + (c.file_offset() - base));
        thread_local BlockDecoder decoder;
        s = decoder.Decode(block, chunk_data.data(), it.dest != nullptr ? it.dest : slot->scratch.data());
      }
      if (s.ok()) {
        for (const Job::Copy& c : it.copies) std::memcpy(c.to, slot->scratch.data() + c.offset, c.length);
      }
      {
        absl::MutexLock l(&mu);
        if (!s.ok()) record(it, s);
        returned.push_back(slot);
      }
      pending.Done();
    });
  }
  // Transfers still queued point into `slots`; decodes too.
  absl::Status drain = file_->WaitAll();
  (void)drain;  // a failed drain was already reported through the transfer that failed
  pending.Wait();
  if (!io_status.ok()) return io_status;
  absl::MutexLock l(&mu);
  return first_error;
}

}  // namespace ckptd::storage
