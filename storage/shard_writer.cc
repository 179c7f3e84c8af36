#include "storage/shard_writer.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/aligned_buffer.h"
#include "base/clock.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "format/checksum.h"
#include "format/tensor_size.h"
#include "storage/layout.h"
#include "storage/shard_format.h"
#include "storage/shard_index.h"

namespace ckptd::storage {
namespace {

using ckptd::v1::ShardIndex;

struct BlockRef {
  int tensor = 0;
  uint64_t raw_offset = 0;
  uint64_t raw_length = 0;
};

// A buffer an encoder fills and the file writes from.
struct Slot {
  base::AlignedBuffer buffer;
  size_t block = 0;
  absl::StatusOr<EncodedBlock> encoded;
  // The bytes to write: `buffer`, or the caller's memory for a raw block that
  // is already aligned (no copy).
  const uint8_t* write_from = nullptr;
  uint64_t ticket = 0;
  // Encode with compression (EncodeOptions::compress and no decision for
  // raw yet), or store raw.
  bool compress = false;
};

// Encoders are costly to create (zstd contexts, scratch); keep one per worker.
class EncoderPool {
 public:
  explicit EncoderPool(const EncodeOptions& options) : options_(options) {}
  std::unique_ptr<BlockEncoder> Take() {
    absl::MutexLock l(&mu_);
    if (free_.empty()) return std::make_unique<BlockEncoder>(options_);
    std::unique_ptr<BlockEncoder> e = std::move(free_.back());
    free_.pop_back();
    return e;
  }
  void Give(std::unique_ptr<BlockEncoder> e) {
    absl::MutexLock l(&mu_);
    free_.push_back(std::move(e));
  }

 private:
  const EncodeOptions options_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<BlockEncoder>> free_ ABSL_GUARDED_BY(mu_);
};

class ShardWriteJob {
 public:
  ShardWriteJob(FileSystem* fs, std::string path, const ShardIdentity& identity,
                absl::Span<const TensorSource> tensors, const ShardWriteOptions& options, base::ThreadPool* pool)
      : fs_(fs),
        path_(std::move(path)),
        temp_path_(absl::StrCat(path_, kTempSuffix)),
        identity_(identity),
        tensors_(tensors),
        options_(options),
        pool_(pool),
        encoders_(options.encode),
        raw_encoders_(RawOptions(options.encode)),
        clock_(options.adaptive.clock != nullptr ? options.adaptive.clock : base::RealClock::Get()),
        compress_(options.encode.compress) {}

  absl::StatusOr<ShardWriteResult> Run() {
    absl::Status status = WriteAll();
    if (!status.ok()) {
      if (file_ != nullptr) {
        // The write already failed; a close error adds nothing.
        (void)file_->Close();
        file_.reset();
      }
      // Best effort: the temp file may not exist yet, or the disk may be failing.
      (void)fs_->RemoveFile(temp_path_);
      return absl::Status(status.code(), absl::StrCat("writing shard ", path_, ": ", status.message()));
    }
    return result_;
  }

 private:
  absl::Status WriteAll() {
    CKPTD_RETURN_IF_ERROR(ValidateJobName(identity_.job));
    if (identity_.world_size == 0 || identity_.rank >= identity_.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", identity_.rank, " is not inside world size ",
                                                     identity_.world_size));
    }
    CKPTD_RETURN_IF_ERROR(ValidateTensorSources(tensors_));
    size_t block_bytes = std::max<size_t>(options_.block_bytes, kShardAlignment);
    block_bytes -= block_bytes % 8;  // a whole number of elements of every dtype
    if (block_bytes > kMaxBlockBytes) block_bytes = kMaxBlockBytes;
    block_bytes_ = block_bytes;

    // Version 2 only when a share needs it: a version-1 reader reads the rest.
    version_ = std::any_of(tensors_.begin(), tensors_.end(),
                           [](const TensorSource& t) { return t.meta.has_replica(); })
                   ? kShardFormatVersionReplicas
                   : kOldestShardFormatVersion;
    index_.set_format_version(version_);
    index_.set_job(identity_.job);
    index_.set_step(identity_.step);
    index_.set_rank(identity_.rank);
    index_.set_world_size(identity_.world_size);
    index_.set_created_unix_nanos(options_.created_unix_nanos != 0 ? options_.created_unix_nanos
                                                                   : absl::ToUnixNanos(absl::Now()));
    index_.set_alignment(kShardAlignment);
    for (size_t t = 0; t < tensors_.size(); ++t) {
      ckptd::v1::Tensor* meta = index_.add_tensors();
      *meta = tensors_[t].meta;
      meta->clear_blocks();
      meta->set_raw_length(tensors_[t].length);
      for (uint64_t off = 0; off < tensors_[t].length; off += block_bytes) {
        blocks_.push_back({static_cast<int>(t), off, std::min<uint64_t>(block_bytes, tensors_[t].length - off)});
        meta->add_blocks();
      }
    }

    OpenOptions open;
    open.direct_io = options_.direct_io;
    CKPTD_ASSIGN_OR_RETURN(file_, fs_->NewWritableFile(temp_path_, open));
    // Reserve the chunk area (exact for raw data, an upper bound for most
    // compressed data): writes inside the file's length are not serialised as
    // extending O_DIRECT writes are, and a full disk shows before any write.
    allocated_ = kShardHeaderBlock;
    for (const BlockRef& b : blocks_) allocated_ += base::AlignUp(b.raw_length, kShardAlignment);
    if (absl::Status s = file_->Allocate(allocated_); !s.ok()) {
      if (!absl::IsUnimplemented(s)) return s;
      allocated_ = 0;  // not supported here: the writes extend the file instead
    }

    std::unique_ptr<base::ThreadPool> own_pool;
    if (pool_ == nullptr) {
      own_pool = std::make_unique<base::ThreadPool>(options_.threads);
      pool_ = own_pool.get();
    }
    absl::Status status = Pipeline();
    // Encode tasks point into slots_: none may be running when this returns.
    // Those not started yet have nothing left to do.
    if (!status.ok()) abandoned_.store(true, std::memory_order_relaxed);
    pending_.Wait();
    CKPTD_RETURN_IF_ERROR(status);
    if (Stopped()) {
      return absl::CancelledError(absl::StrCat("stopped with all ", blocks_.size(),
                                               " blocks written, before the index; nothing of the shard is kept"));
    }
    return Finish();
  }

  bool Stopped() const { return options_.stop && options_.stop(); }

  // Encodes blocks on the pool and writes each as soon as it is ready.
  absl::Status Pipeline() {
    const int writes = std::max(1, options_.writes_in_flight);
    const size_t nslots = std::min<size_t>(blocks_.size(), static_cast<size_t>(pool_->size() + writes));
    const size_t capacity = BlockEncoder::MaxEncodedLength(block_bytes_, kShardAlignment);
    slots_.resize(nslots);
    std::vector<Slot*> free_slots;
    for (Slot& s : slots_) {
      s.buffer = base::AlignedBuffer(capacity, kShardAlignment);
      free_slots.push_back(&s);
    }
    std::deque<Slot*> in_flight;  // writes submitted, oldest first
    // Blocks are written back to back from kShardHeaderBlock, and retired in
    // the order submitted.
    WritebackPacer writeback(file_.get(), kShardHeaderBlock, options_.writeback_bytes);
    uint64_t retired_end = kShardHeaderBlock;
    size_t next_block = 0;
    size_t written = 0;
    started_ = clock_->Now();
    while (written < blocks_.size()) {
      while (!free_slots.empty() && next_block < blocks_.size()) {
        Slot* slot = free_slots.back();
        free_slots.pop_back();
        slot->block = next_block++;
        StartEncode(slot);
      }
      Slot* ready = nullptr;
      {
        absl::MutexLock l(&mu_);
        // With no write to retire, the only way forward is an encode finishing.
        if (in_flight.empty()) {
          mu_.Await(absl::Condition(
              +[](std::deque<Slot*>* q) { return !q->empty(); }, &ready_));
        }
        if (!ready_.empty() && static_cast<int>(in_flight.size()) < writes) {
          ready = ready_.front();
          ready_.pop_front();
        }
      }
      if (ready != nullptr) {
        CKPTD_RETURN_IF_ERROR(ready->encoded.status());
        if (Stopped()) {
          return absl::CancelledError(absl::StrCat("stopped with ", written, " of ", blocks_.size(),
                                                   " blocks written; nothing of the shard is kept"));
        }
        CKPTD_RETURN_IF_ERROR(SubmitWrite(ready));
        if (in_flight.empty()) busy_since_ = clock_->Now();
        in_flight.push_back(ready);
        continue;
      }
      // The write queue is full or nothing is encoded yet: retire the oldest write.
      if (!in_flight.empty()) {
        Slot* done = in_flight.front();
        in_flight.pop_front();
        CKPTD_RETURN_IF_ERROR(file_->WaitFor(done->ticket));
        retired_end += done->encoded->encoded_length;
        CKPTD_RETURN_IF_ERROR(writeback.Completed(retired_end));
        ++written;
        free_slots.push_back(done);
        Retired(*done, in_flight.empty());
      }
    }
    return absl::OkStatus();
  }

  static EncodeOptions RawOptions(EncodeOptions options) {
    options.compress = false;
    return options;
  }

  void StartEncode(Slot* slot) {
    slot->compress = compress_;
    if (!compress_ && options_.encode.compress) ++result_.blocks_raw_by_decision;
    pending_.Add();
    pool_->Schedule([this, slot] {
      if (abandoned_.load(std::memory_order_relaxed)) {
        pending_.Done();
        return;
      }
      const BlockRef& ref = blocks_[slot->block];
      const TensorSource& src = tensors_[ref.tensor];
      const uint8_t* raw = static_cast<const uint8_t*>(src.data) + ref.raw_offset;
      if (!slot->compress && base::IsAligned(reinterpret_cast<uintptr_t>(raw), kShardAlignment) &&
          base::IsAligned(ref.raw_length, kShardAlignment)) {
        slot->encoded = RawInPlace(raw, ref.raw_length);
        slot->write_from = raw;
      } else {
        EncoderPool& encoders = slot->compress ? encoders_ : raw_encoders_;
        std::unique_ptr<BlockEncoder> encoder = encoders.Take();
        slot->encoded = encoder->Encode(src.meta.dtype(), raw, ref.raw_length, slot->buffer.data(),
                                        slot->buffer.capacity(), kShardAlignment);
        encoders.Give(std::move(encoder));
        slot->write_from = slot->buffer.data();
      }
      {
        absl::MutexLock l(&mu_);
        ready_.push_back(slot);
      }
      pending_.Done();
    });
  }

  // An uncompressed block written straight from the caller's aligned memory:
  // one RAW chunk whose stored bytes are the raw bytes.
  static EncodedBlock RawInPlace(const uint8_t* raw, size_t length) {
    EncodedBlock block;
    block.raw_xxh3 = format::Xxh3(raw, length);
    block.chunks.push_back({0, length, length, ckptd::v1::RAW, block.raw_xxh3});
    block.encoded_length = length;
    return block;
  }

  absl::Status SubmitWrite(Slot* slot) {
    const EncodedBlock& enc = *slot->encoded;
    const BlockRef& ref = blocks_[slot->block];
    const uint64_t file_offset = next_offset_;
    next_offset_ += enc.encoded_length;

    ckptd::v1::Tensor* meta = index_.mutable_tensors(ref.tensor);
    ckptd::v1::Block* block = meta->mutable_blocks(static_cast<int>(ref.raw_offset / block_bytes_));
    block->set_raw_offset(ref.raw_offset);
    block->set_raw_length(ref.raw_length);
    block->set_filter(enc.filter);
    block->set_element_size(enc.element_size);
    block->set_raw_xxh3(enc.raw_xxh3);
    for (const EncodedChunk& c : enc.chunks) {
      ckptd::v1::Chunk* chunk = block->add_chunks();
      chunk->set_file_offset(file_offset + c.buffer_offset);
      chunk->set_stored_length(c.stored_length);
      chunk->set_raw_length(c.raw_length);
      chunk->set_codec(c.codec);
      chunk->set_stored_xxh3(c.stored_xxh3);
      stored_bytes_ += c.stored_length;
    }
    CKPTD_ASSIGN_OR_RETURN(slot->ticket, file_->Write(file_offset, slot->write_from, enc.encoded_length));
    if (slot->compress) {
      compressed_raw_ += ref.raw_length;
      compressed_written_ += enc.encoded_length;
    }
    submitted_raw_ += ref.raw_length;
    last_submit_ = clock_->Now();
    return absl::OkStatus();
  }

  // Adaptive compression's bookkeeping once the write of `done` completed
  // (`idle`: it was the last in flight); decides every
  // decide_every_blocks while blocks are still compressed.
  void Retired(const Slot& done, bool idle) {
    const absl::Time now = clock_->Now();
    written_bytes_ += done.encoded->encoded_length;
    ++retired_;
    // The disk has been busy since busy_since_ (this write was in flight).
    const absl::Duration busy = busy_ + (now - busy_since_);
    if (idle) busy_ = busy;  // the stretch ends; the next submit starts another
    const AdaptiveCompression& adaptive = options_.adaptive;
    if (!adaptive.enabled || !compress_ || retired_ < next_decision_) return;
    next_decision_ = retired_ + static_cast<uint64_t>(std::max(1, adaptive.decide_every_blocks));
    CompressionRates rates;
    const double encode_s = absl::ToDoubleSeconds(last_submit_ - started_);
    const double busy_s = absl::ToDoubleSeconds(busy);
    if (encode_s > 0) rates.encode_bytes_per_second = static_cast<double>(submitted_raw_) / encode_s;
    if (busy_s > 0) rates.write_bytes_per_second = static_cast<double>(written_bytes_) / busy_s;
    if (compressed_written_ > 0) {
      rates.ratio = static_cast<double>(compressed_raw_) / static_cast<double>(compressed_written_);
    }
    ++result_.compression_decisions;
    result_.compression_rates = rates;
    compress_ = adaptive.decide ? adaptive.decide(rates) : CompressionPays(rates, adaptive.margin);
  }

  absl::Status Finish() {
    uint64_t raw = 0;
    for (const TensorSource& t : tensors_) raw += t.length;
    index_.set_raw_bytes(raw);
    index_.set_stored_bytes(stored_bytes_);
    std::string serialized;
    if (!index_.SerializeToString(&serialized)) return absl::InternalError("cannot serialize the shard index");
    if (serialized.size() > kMaxIndexBytes) {
      return absl::InvalidArgumentError(absl::StrCat("shard index of ", serialized.size(),
                                                     " bytes exceeds the limit ", kMaxIndexBytes));
    }
    ShardFooter footer;
    footer.format_version = version_;
    footer.index_offset = next_offset_;
    footer.index_length = serialized.size();
    footer.index_xxh3 = format::Xxh3(serialized);
    const uint64_t tail = base::AlignUp(serialized.size() + kShardFooterBytes, kShardAlignment);
    footer.file_length = next_offset_ + tail;
    base::AlignedBuffer tail_buf(tail, kShardAlignment);
    std::memcpy(tail_buf.data(), serialized.data(), serialized.size());
    EncodeShardFooter(footer, tail_buf.data() + tail - kShardFooterBytes);

    base::AlignedBuffer header(kShardHeaderBlock, kShardAlignment);
    EncodeShardHeader(header.data(), version_);
    CKPTD_ASSIGN_OR_RETURN(uint64_t t1, file_->Write(0, header.data(), kShardHeaderBlock));
    CKPTD_ASSIGN_OR_RETURN(uint64_t t2, file_->Write(next_offset_, tail_buf.data(), tail));
    CKPTD_RETURN_IF_ERROR(file_->WaitFor(t1));
    CKPTD_RETURN_IF_ERROR(file_->WaitFor(t2));
    if (allocated_ > footer.file_length) CKPTD_RETURN_IF_ERROR(file_->Truncate(footer.file_length));
    if (Stopped()) {
      return absl::CancelledError(absl::StrCat("stopped with all ", blocks_.size(),
                                               " blocks and the index written, before the fsync; nothing of the "
                                               "shard is kept"));
    }
    CKPTD_RETURN_IF_ERROR(file_->Sync());
    CKPTD_RETURN_IF_ERROR(file_->Close());
    file_.reset();
    CKPTD_RETURN_IF_ERROR(fs_->Rename(temp_path_, path_));
    if (absl::Status s = fs_->SyncDir(DirName(path_)); !s.ok()) {
      // The rename may not be durable: take the shard back so that a failed
      // write leaves nothing behind. Best effort; the sync error is what counts.
      (void)fs_->RemoveFile(path_);
      return s;
    }

    result_.path = path_;
    result_.file_length = footer.file_length;
    result_.raw_bytes = raw;
    result_.stored_bytes = stored_bytes_;
    result_.index_xxh3 = footer.index_xxh3;
    result_.index = std::make_shared<const ShardIndex>(std::move(index_));
    return absl::OkStatus();
  }

  FileSystem* const fs_;
  const std::string path_;
  const std::string temp_path_;
  const ShardIdentity identity_;
  const absl::Span<const TensorSource> tensors_;
  const ShardWriteOptions options_;
  base::ThreadPool* pool_;
  EncoderPool encoders_;
  EncoderPool raw_encoders_;  // for blocks stored raw by a decision
  base::Clock* const clock_;

  // Adaptive compression, on the writer's thread only: whether the next
  // block is compressed, and the measurements of the rates.
  bool compress_;
  uint64_t next_decision_ = static_cast<uint64_t>(std::max(1, options_.adaptive.decide_every_blocks));
  absl::Time started_;               // the first encode scheduled
  absl::Time last_submit_;           // the newest write submitted
  uint64_t submitted_raw_ = 0;       // raw bytes of the blocks submitted
  uint64_t compressed_raw_ = 0;      // ... of those encoded with compression
  uint64_t compressed_written_ = 0;  // ... and the bytes written for them
  uint64_t written_bytes_ = 0;       // bytes of the writes completed
  uint64_t retired_ = 0;             // writes completed
  absl::Duration busy_;              // time with a write in flight, stretches that ended
  absl::Time busy_since_;            // the start of the current stretch

  std::vector<BlockRef> blocks_;
  uint64_t block_bytes_ = 0;
  uint32_t version_ = kOldestShardFormatVersion;
  std::vector<Slot> slots_;
  std::unique_ptr<WritableFile> file_;
  ShardIndex index_;
  uint64_t next_offset_ = kShardHeaderBlock;
  uint64_t allocated_ = 0;  // bytes reserved with Allocate
  uint64_t stored_bytes_ = 0;
  ShardWriteResult result_;
  base::WaitGroup pending_;
  // The write failed or stopped: encode tasks not started yet do nothing.
  std::atomic<bool> abandoned_{false};

  absl::Mutex mu_;
  std::deque<Slot*> ready_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

bool CompressionPays(const CompressionRates& rates, double margin) {
  const double write = rates.write_bytes_per_second;
  const double encode = rates.encode_bytes_per_second;
  if (!(write > 0) || !(encode > 0) || !(rates.ratio > 0)) return true;
  return std::min(encode, rates.ratio * write) >= margin * write;
}

absl::Status ValidateTensorSources(absl::Span<const TensorSource> tensors) {
  absl::flat_hash_set<absl::string_view> names;
  for (const TensorSource& t : tensors) {
    CKPTD_RETURN_IF_ERROR(ValidateTensorMeta(t.meta, "shard"));
    const std::string where = absl::StrCat("tensor '", absl::CHexEscape(t.meta.name()), "'");
    if (!names.insert(t.meta.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, " is registered twice"));
    }
    CKPTD_ASSIGN_OR_RETURN(uint64_t expected, format::TensorByteLength(t.meta));
    if (expected != t.length) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has ", t.length,
                                                     " bytes but its shape and dtype make ", expected));
    }
    if (t.meta.has_replica() && t.meta.replica().block_bytes() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is replicated: its share is written (storage::ShareSources), not the buffer"));
    }
    if (t.length > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has no data"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardWriteResult> WriteShard(FileSystem* fs, const std::string& path,
                                            const ShardIdentity& identity,
                                            absl::Span<const TensorSource> tensors,
                                            const ShardWriteOptions& options, base::ThreadPool* pool) {
  ShardWriteJob job(fs, path, identity, tensors, options, pool);
  return job.Run();
}

}  // namespace ckptd::storage
