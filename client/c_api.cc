// The C ABI over Client. No exception or abort crosses it: failures become a
// status code and a thread-local message.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/limits.h"
#include "client/c_options.h"
#include "client/ckptd.h"
#include "client/client.h"

struct ckptd_client {
  std::unique_ptr<ckptd::client::Client> client;
};

namespace {

thread_local std::string g_last_error;

// The most buffers one client registers, and dimensions one buffer has.
constexpr size_t kMaxBuffers = size_t{1} << 20;
constexpr size_t kMaxDims = 64;
// The most users a trainer trusts to run its agent besides its own and root.
constexpr size_t kMaxTrustedAgentUids = 1024;

int Fail(const absl::Status& s) {
  g_last_error = std::string(s.message());
  return s.ok() ? 0 : static_cast<int>(s.code());
}

// The agent and the coordinator refuse a world larger than kMaxWorldSize and
// a rank outside the world: ckptd_connect says so, naming the field, before
// any connection is made.
absl::Status CheckRankAndWorld(const ckptd_options& options) {
  const uint32_t world_size = options.world_size == 0 ? 1 : options.world_size;
  if (world_size > ckptd::base::kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("ckptd_connect: world_size ", options.world_size, " is outside 1..",
                                                   ckptd::base::kMaxWorldSize, " (0 means 1)"));
  }
  if (options.rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("ckptd_connect: rank ", options.rank, " is not inside world_size ",
                                                   world_size, " (rank must be 0..", world_size - 1, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace ckptd::client {

absl::StatusOr<ClientOptions> ClientOptionsFromC(const ckptd_options* options, const ckptd_options_ext* ext) {
  if (options == nullptr || options->job == nullptr) {
    return absl::InvalidArgumentError("ckptd_connect: options, job, buffers and out are required");
  }
  ClientOptions o;
  if (options->socket != nullptr) o.socket = options->socket;  // else the default one
  o.job = options->job;
  o.rank = options->rank;
  o.world_size = options->world_size == 0 ? 1 : options->world_size;
  o.every_steps = options->every_steps;
  o.slot_wait = absl::Milliseconds(options->slot_wait_ms < 0 ? 0 : options->slot_wait_ms);
  o.rpc_timeout = absl::Milliseconds(options->rpc_timeout_ms <= 0 ? 5000 : options->rpc_timeout_ms);
  if (ext == nullptr) return o;
  if (ext->size < sizeof(ext->size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ckptd_connect_ext: ext->size is ", ext->size, "; set it to sizeof(ckptd_options_ext)"));
  }
  // A field counts when the caller's struct holds it whole.
  auto has = [ext](size_t offset, size_t bytes) { return ext->size >= offset + bytes; };
  if (has(offsetof(ckptd_options_ext, spare_device_buffer), sizeof(ext->spare_device_buffer))) {
    o.spare_device_buffer = ext->spare_device_buffer != 0;
  }
  const bool has_trusted = has(offsetof(ckptd_options_ext, trusted_agent_uids), sizeof(ext->trusted_agent_uids)) &&
                           has(offsetof(ckptd_options_ext, trusted_agent_uid_count),
                               sizeof(ext->trusted_agent_uid_count));
  const bool has_prepare_wait = has(offsetof(ckptd_options_ext, prepare_wait_ms), sizeof(ext->prepare_wait_ms));
  if (has_prepare_wait && ext->prepare_wait_ms != 0) {
    o.prepare_wait = absl::Milliseconds(std::max<int64_t>(ext->prepare_wait_ms, 0));
  }
  if (has_trusted && ext->trusted_agent_uid_count > 0) {
    if (ext->trusted_agent_uids == nullptr || ext->trusted_agent_uid_count > kMaxTrustedAgentUids) {
      return absl::InvalidArgumentError(absl::StrCat("ckptd_connect_ext: trusted_agent_uid_count ",
                                                     ext->trusted_agent_uid_count, " needs trusted_agent_uids and "
                                                     "is at most ", kMaxTrustedAgentUids));
    }
    o.trusted_agent_uids.assign(ext->trusted_agent_uids, ext->trusted_agent_uids + ext->trusted_agent_uid_count);
  }
  // A newer caller's fields that this library does not know must be unset.
  // The fields after `reserved` are read when the caller's struct holds them
  // whole (the trusted uids only both together); part of one is nothing this
  // library reads.
  auto within = [](size_t i, size_t offset, size_t bytes) { return i >= offset && i < offset + bytes; };
  const auto* bytes = reinterpret_cast<const unsigned char*>(ext);
  for (size_t i = offsetof(ckptd_options_ext, reserved); i < ext->size; ++i) {
    const bool known = (within(i, offsetof(ckptd_options_ext, replicas), sizeof(ext->replicas)) &&
                        has(offsetof(ckptd_options_ext, replicas), sizeof(ext->replicas))) ||
                       (has_trusted && i >= offsetof(ckptd_options_ext, trusted_agent_uids) &&
                        i < offsetof(ckptd_options_ext, trusted_agent_uid_count) +
                                sizeof(ext->trusted_agent_uid_count)) ||
                       (has_prepare_wait && within(i, offsetof(ckptd_options_ext, prepare_wait_ms),
                                                   sizeof(ext->prepare_wait_ms)));
    if (bytes[i] != 0 && !known) {
      return absl::InvalidArgumentError(absl::StrCat("ckptd_connect_ext: option at byte ", i,
                                                     " is unknown to this libckptd (ABI version ", CKPTD_ABI_VERSION,
                                                     ")"));
    }
  }
  return o;
}

}  // namespace ckptd::client

namespace {

// `text` into out[size], cut to size - 1 bytes on a UTF-8 boundary and
// NUL-terminated; nothing for a null `out` or a zero `size`.
void CopyCut(const std::string& text, char* out, size_t size) {
  if (out == nullptr || size == 0) return;
  size_t n = std::min(text.size(), size - 1);
  while (n > 0 && n < text.size() && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

}  // namespace

extern "C" {

int ckptd_abi_version(void) { return CKPTD_ABI_VERSION; }

const char* ckptd_last_error(void) { return g_last_error.c_str(); }

int ckptd_connect(const ckptd_options* options, const ckptd_buffer* buffers, size_t count, ckptd_client** out) {
  return ckptd_connect_ext(options, nullptr, buffers, count, out);
}

int ckptd_connect_ext(const ckptd_options* options, const ckptd_options_ext* ext, const ckptd_buffer* buffers,
                      size_t count, ckptd_client** out) {
  if (options == nullptr || out == nullptr || (count > 0 && buffers == nullptr) || options->job == nullptr) {
    return Fail(absl::InvalidArgumentError("ckptd_connect: options, job, buffers and out are required"));
  }
  *out = nullptr;
  absl::StatusOr<ckptd::client::ClientOptions> o = ckptd::client::ClientOptionsFromC(options, ext);
  if (!o.ok()) return Fail(o.status());
  if (absl::Status s = CheckRankAndWorld(*options); !s.ok()) return Fail(s);
  // Sizes the caller gives are checked before anything is allocated for them:
  // no length_error or bad_alloc reaches the C caller.
  if (count > kMaxBuffers) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("ckptd_connect: count ", count, " is outside 0..", kMaxBuffers, " buffers")));
  }
  const ckptd_replica* replicas = nullptr;
  if (ext != nullptr && ext->size >= offsetof(ckptd_options_ext, replicas) + sizeof(ext->replicas)) {
    replicas = ext->replicas;
  }
  std::vector<ckptd::client::BufferSpec> specs;
  for (size_t i = 0; i < count; ++i) {
    const ckptd_buffer& b = buffers[i];
    if (b.name == nullptr || (b.ndim > 0 && b.shape == nullptr)) {
      return Fail(absl::InvalidArgumentError("ckptd_connect: buffer " + std::to_string(i) +
                                             " needs a name and, with ndim > 0, a shape"));
    }
    if (b.ndim > kMaxDims) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("ckptd_connect: buffer ", i, ": ndim ", b.ndim, " is outside 0..", kMaxDims)));
    }
    ckptd::client::BufferSpec s;
    s.name = b.name;
    s.component = static_cast<ckptd::v1::Component>(b.component);
    s.dtype = static_cast<ckptd::v1::DType>(b.dtype);
    s.shape.assign(b.shape, b.shape + b.ndim);
    if (b.global_shape != nullptr) s.global_shape.assign(b.global_shape, b.global_shape + b.ndim);
    if (b.offsets != nullptr) s.offsets.assign(b.offsets, b.offsets + b.ndim);
    s.device.set_kind(b.device_kind == CKPTD_DEVICE_CUDA ? ckptd::v1::Device::CUDA : ckptd::v1::Device::HOST);
    s.device.set_index(b.device_index);
    s.data = b.data;
    if (replicas != nullptr && replicas[i].count > 0) {
      if (replicas[i].group == nullptr) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat("ckptd_connect: buffer ", i, " is replicated over a group without a name")));
      }
      s.replica_group = replicas[i].group;
      s.replica_count = replicas[i].count;
      s.replica_index = replicas[i].index;
    }
    specs.push_back(std::move(s));
  }
  absl::StatusOr<std::unique_ptr<ckptd::client::Client>> client = ckptd::client::Client::Connect(*o, std::move(specs));
  if (!client.ok()) return Fail(client.status());
  auto* handle = new (std::nothrow) ckptd_client{*std::move(client)};
  if (handle == nullptr) return Fail(absl::ResourceExhaustedError("ckptd_connect: out of memory"));
  *out = handle;
  return 0;
}

int ckptd_should_snapshot(const ckptd_client* client, uint64_t step) {
  return client != nullptr && client->client->ShouldSnapshot(step) ? 1 : 0;
}

int ckptd_restart_requested(const ckptd_client* client) {
  return client != nullptr && client->client->restart_requested() ? 1 : 0;
}

namespace {

int Snapshot(ckptd_client* client, uint64_t step, double* stall_seconds, ckptd::client::SnapshotKind kind,
             const char* name) {
  if (client == nullptr) return Fail(absl::InvalidArgumentError(absl::StrCat(name, ": no client")));
  absl::StatusOr<ckptd::client::SnapshotResult> r = client->client->Snapshot(step, kind);
  if (!r.ok()) return Fail(r.status());
  if (stall_seconds != nullptr) *stall_seconds = r->stall_seconds;
  return 0;
}

}  // namespace

int ckptd_snapshot(ckptd_client* client, uint64_t step, double* stall_seconds) {
  return Snapshot(client, step, stall_seconds, ckptd::client::SnapshotKind::kExplicit, "ckptd_snapshot");
}

int ckptd_snapshot_scheduled(ckptd_client* client, uint64_t step, double* stall_seconds) {
  return Snapshot(client, step, stall_seconds, ckptd::client::SnapshotKind::kScheduled, "ckptd_snapshot_scheduled");
}

int ckptd_restore(ckptd_client* client, int* found, uint64_t* step) {
  if (client == nullptr || found == nullptr || step == nullptr) {
    return Fail(absl::InvalidArgumentError("ckptd_restore: client, found and step are required"));
  }
  absl::StatusOr<std::optional<uint64_t>> r = client->client->Restore();
  if (!r.ok()) return Fail(r.status());
  *found = r->has_value() ? 1 : 0;
  *step = r->value_or(0);
  return 0;
}

int ckptd_wait_persisted(ckptd_client* client, uint64_t step, int64_t timeout_ms) {
  if (client == nullptr) return Fail(absl::InvalidArgumentError("ckptd_wait_persisted: no client"));
  return Fail(client->client->WaitPersisted(step, absl::Milliseconds(timeout_ms)));
}

int ckptd_persist_failures(const ckptd_client* client, uint64_t* failed, uint64_t* last_failed_step, char* error,
                           size_t error_size) {
  if (client == nullptr) return Fail(absl::InvalidArgumentError("ckptd_persist_failures: no client"));
  const ckptd::client::PersistFailures f = client->client->persist_failures();
  if (failed != nullptr) *failed = f.failed;
  if (last_failed_step != nullptr) *last_failed_step = f.last_failed_step.value_or(0);
  CopyCut(f.last_error, error, error_size);
  return 0;
}

int ckptd_restore_warning(const ckptd_client* client, char* warning, size_t warning_size) {
  if (client == nullptr) return Fail(absl::InvalidArgumentError("ckptd_restore_warning: no client"));
  CopyCut(client->client->last_restore_warning(), warning, warning_size);
  return 0;
}

int ckptd_schedule(const ckptd_client* client, int* coordinated, int* known, uint64_t* start_step,
                   uint64_t* every_steps, uint64_t* durable_every, uint64_t* generation) {
  if (client == nullptr) return Fail(absl::InvalidArgumentError("ckptd_schedule: no client"));
  const ckptd::client::ScheduleView v = client->client->schedule();
  if (coordinated != nullptr) *coordinated = v.coordinated ? 1 : 0;
  if (known != nullptr) *known = v.known ? 1 : 0;
  if (start_step != nullptr) *start_step = v.start_step;
  if (every_steps != nullptr) *every_steps = v.every_steps;
  if (durable_every != nullptr) *durable_every = v.durable_every;
  if (generation != nullptr) *generation = v.generation;
  return 0;
}

const char* ckptd_restore_source(const ckptd_client* client) {
  if (client == nullptr) return "";
  // A string literal: NUL-terminated, and static.
  return client->client->last_restore_source().data();
}

void ckptd_close(ckptd_client* client) { delete client; }

}  // extern "C"
