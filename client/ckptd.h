/* libckptd's stable C ABI: what the Python binding (and any other language)
 * calls. Every function returns 0 on success or a canonical status code
 * (absl/gRPC numbering: 3 invalid argument, 5 not found, 8 resource
 * exhausted, 9 failed precondition, 14 unavailable, ...); the message of the
 * last failure on the calling thread is ckptd_last_error(). Checkpointing is a
 * weak dependency: every call is bounded in time and never aborts the caller. */
#ifndef CKPTD_CKPTD_H_
#define CKPTD_CKPTD_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Versions only grow, each a superset of the one before but 7: 2 added
 * ckptd_options_ext and ckptd_connect_ext; 3 added ckptd_persist_failures; 4 added
 * ckptd_restore_source; 5 added ckptd_export_safetensors; 6 added
 * ckptd_options_ext.replicas; 7 removed ckptd_export_safetensors again, so
 * that libckptd holds no storage engine (no liburing, zstd or xxhash):
 * `ckptctl export` writes safetensors files, and Python's ckptd.export runs it;
 * 8 added ckptd_options_ext.trusted_agent_uids, and a NULL socket (the
 * default one); 9 added ckptd_schedule; 10 added ckptd_restore_warning; 11
 * added ckptd_options_ext.prepare_wait_ms and ckptd_snapshot_scheduled. */
#define CKPTD_ABI_VERSION 11

/* State components and dtypes: the values of ckptd.v1.Component / DType. */
enum { CKPTD_PARAMS = 1, CKPTD_GRADS = 2, CKPTD_OPTIMIZER = 3, CKPTD_RNG = 4, CKPTD_DATA_CURSOR = 5 };
enum {
  CKPTD_BYTES = 1, CKPTD_FLOAT32 = 2, CKPTD_BFLOAT16 = 3, CKPTD_FLOAT16 = 4, CKPTD_FLOAT64 = 5,
  CKPTD_INT8 = 6, CKPTD_UINT8 = 7, CKPTD_INT16 = 8, CKPTD_INT32 = 9, CKPTD_INT64 = 10, CKPTD_BOOL = 11
};
enum { CKPTD_DEVICE_HOST = 0, CKPTD_DEVICE_CUDA = 1 };

typedef struct ckptd_buffer {
  const char* name;
  int component;
  int dtype;
  size_t ndim;
  const uint64_t* shape;         /* ndim entries */
  const uint64_t* global_shape;  /* ndim entries, or NULL when not sharded */
  const uint64_t* offsets;       /* ndim entries, or NULL when not sharded */
  int device_kind;
  int device_index;
  void* data;                    /* stays valid while the client lives */
} ckptd_buffer;

typedef struct ckptd_options {
  /* The agent's Unix socket. NULL or "" (ABI 8): $CKPTD_SOCKET, else
   * $XDG_RUNTIME_DIR/ckptd/agent.sock when it exists, else
   * /run/ckptd/agent.sock. The socket must belong to this process's user,
   * root or a trusted agent user (ckptd_options_ext.trusted_agent_uids,
   * $CKPTD_TRUSTED_AGENT_UIDS), in a directory no one else can replace it
   * in: else 7 (permission denied), naming its owner. */
  const char* socket;
  const char* job;
  uint32_t rank;
  uint32_t world_size;      /* 0 means 1; at most 1048576 and more than rank (else 3, INVALID_ARGUMENT) */
  uint64_t every_steps;     /* 0: snapshot only when asked */
  int64_t slot_wait_ms;     /* wait for a free staging slot; 0: skip at once */
  int64_t rpc_timeout_ms;   /* bound on each call to the agent; 0: 5000 */
} ckptd_options;

/* A buffer every rank of a group holds the same (the weights and optimizer
 * state of data parallelism): the group writes it once, each member a share
 * of its rows (dimension 0), and every member restores all of it
 * (docs/elastic.md). `count` 0: not replicated. */
typedef struct ckptd_replica {
  const char* group; /* the group's name, e.g. "dp" (1..256 bytes of UTF-8) */
  uint32_t count;    /* ranks in the group, at most the world size */
  uint32_t index;    /* this rank's place in it, < count */
} ckptd_replica;

/* Options added after ABI version 1, for ckptd_connect_ext. Set `size` to
 * sizeof(ckptd_options_ext) and zero what you do not set: the library reads
 * only the fields inside `size`, and new fields only ever replace `reserved`
 * or are appended, so a caller built against an older header keeps working.
 * Bytes past the fields this library knows (`reserved` included) must be zero
 * (else 3, invalid argument): a newer caller's option is never ignored. */
typedef struct ckptd_options_ext {
  size_t size;
  /* 1: snapshot device buffers in two hops through a spare device buffer of
   * the same size (allocated once at connect): the stall is a device-to-device
   * copy, the copy into staging runs in the background. 0: one hop. */
  int32_t spare_device_buffer;
  int32_t reserved; /* 0 */
  /* ABI 6: NULL, or one entry per buffer passed to ckptd_connect_ext, in the
   * same order: which buffers are replicated over a group of ranks. */
  const struct ckptd_replica* replicas;
  /* ABI 8: uids of users whose agent this process may use besides its own
   * user and root (those of $CKPTD_TRUSTED_AGENT_UIDS are added): count
   * entries, NULL when count is 0. */
  const uint32_t* trusted_agent_uids;
  size_t trusted_agent_uid_count;
  /* ABI 11: how long ckptd_snapshot waits for a staging slot the agent is
   * still allocating (a large state's slots are allocated in the background
   * after it registers), counted from the call and never less than
   * slot_wait_ms. 0: the default, 60000 (60 s); negative: no more than
   * slot_wait_ms. ckptd_snapshot_scheduled waits slot_wait_ms only. */
  int64_t prepare_wait_ms;
} ckptd_options_ext;

typedef struct ckptd_client ckptd_client;

int ckptd_abi_version(void);
const char* ckptd_last_error(void);

int ckptd_connect(const ckptd_options* options, const ckptd_buffer* buffers, size_t count, ckptd_client** out);
/* ckptd_connect with the options of ckptd_options_ext (`ext` may be NULL). */
int ckptd_connect_ext(const ckptd_options* options, const ckptd_options_ext* ext, const ckptd_buffer* buffers,
                      size_t count, ckptd_client** out);
/* 1 when the schedule says to snapshot `step`, else 0. No RPC. After a
   ckptd_snapshot_scheduled skipped for want of a slot, a job of one rank
   without a coordinator gets 1 at the next step that finds a slot. */
int ckptd_should_snapshot(const ckptd_client* client, uint64_t step);
/* 1 when the coordinator asks every rank of the job to restart (a failure was
   detected): exit, and let the launcher start the trainer again. No RPC. */
int ckptd_restart_requested(const ckptd_client* client);
/* Copies every buffer into a free staging slot and hands it to the agent; a
   step asked for by the caller: it waits slot_wait_ms for a slot held by a
   snapshot being persisted, and up to prepare_wait_ms for one the agent is
   still allocating. 8 (resource exhausted) when it was skipped, the message
   saying why and what to change. */
int ckptd_snapshot(ckptd_client* client, uint64_t step, double* stall_seconds);
/* ABI 11: ckptd_snapshot for a step the schedule asked for
   (ckptd_should_snapshot): it waits slot_wait_ms only, also while the agent
   still allocates slots; training goes on and a later step tries again. */
int ckptd_snapshot_scheduled(ckptd_client* client, uint64_t step, double* stall_seconds);
/* *found = 0 when nothing is committed; else *step is the restored step. */
int ckptd_restore(ckptd_client* client, int* found, uint64_t* step);
/* Waits until the agent persisted `step` (a memory checkpoint of the
   coordinator's two cadences: until it keeps it in memory). */
int ckptd_wait_persisted(ckptd_client* client, uint64_t step, int64_t timeout_ms);
/* Persists of this client's snapshots that failed at the agent (e.g. a full
 * disk; the steps are not checkpointed), as the agent last reported them (no
 * RPC; refreshed a few times a second): *failed counts them since connect;
 * when it is > 0, *last_failed_step is the newest one's step and `error`
 * (when not NULL) receives its message, cut to error_size - 1 bytes on a
 * UTF-8 boundary and NUL-terminated. Every output pointer may be NULL. */
int ckptd_persist_failures(const ckptd_client* client, uint64_t* failed, uint64_t* last_failed_step, char* error,
                           size_t error_size);
/* Where the last ckptd_restore read its step: "memory" (the agent's own
   memory), "peer" (another node's agent), "node-local" (the node-local tier),
   "storage-root"; "" before any restore or when nothing was restored (and for
   a NULL client). A static string. No RPC. */
const char* ckptd_restore_source(const ckptd_client* client);
/* ABI 10: what the coordinator said the trainer should hear about the last
   ckptd_restore (today: that the job's name was used by a run that
   finished, so this run resumes that run's newest committed step; give a new
   run a name of its own), into `warning`, cut to warning_size - 1 bytes on a
   UTF-8 boundary and NUL-terminated; "" for nothing, before any restore and
   without a coordinator. No RPC. */
int ckptd_restore_warning(const ckptd_client* client, char* warning, size_t warning_size);
/* ABI 9: the schedule ckptd_should_snapshot follows now (no RPC).
 * *coordinated = 1 when the agent reports to a coordinator: its schedule
 * applies instead of ckptd_options.every_steps, and *known = 1 once it was
 * heard of (nothing is scheduled before). *every_steps is the coordinator's
 * interval (coordinated) or the option's; *start_step the step it counts
 * from; every *durable_every-th checkpoint is durable (0 or 1: all; the
 * others are kept in the agents' memory); *generation grows with every
 * change of the coordinator's schedule. Every output pointer may be NULL. */
int ckptd_schedule(const ckptd_client* client, int* coordinated, int* known, uint64_t* start_step,
                   uint64_t* every_steps, uint64_t* durable_every, uint64_t* generation);
void ckptd_close(ckptd_client* client);

#ifdef __cplusplus
}
#endif

#endif /* CKPTD_CKPTD_H_ */
