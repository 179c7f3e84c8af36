"""ckptd for PyTorch training loops.

    ckpt = ckptd.torch.Checkpointer("my-job", "/run/ckptd/agent.sock")   # every=500 steps by default
    ckpt.track("model", model)
    ckpt.track("optimizer", optimizer)
    ckpt.track("scheduler", scheduler)
    ckpt.track("data", loader)            # a ckptd.torch.ResumableLoader
    start = ckpt.restore()                # 0 when nothing is committed
    for step in range(start + 1, total + 1):
        ...train one step...
        ckpt.maybe_snapshot(step)

Every tensor of every tracked state_dict() is registered with the agent by
its memory (CPU or CUDA) and copied by libckptd at a snapshot; the rest of a
state_dict (numbers, strings, lists, dicts, ...) is stored as JSON in one small
buffer per tracked object. Nothing is pickled. The RNG streams of Python,
NumPy and torch (CPU and every CUDA device) are saved and restored too.
docs/python.md describes the design and its limits.
"""

import base64
import collections
import hashlib
import json
import logging
import os
import random
import struct
import sys
import time
import warnings

import torch

import ckptd as _ckptd

try:
    import numpy as _np
except ImportError:  # NumPy is optional: its RNG is saved when it is there
    _np = None

__all__ = ["Checkpointer", "ResumableLoader", "DEFAULT_EVERY", "derived_seed"]

# Steps between snapshots when Checkpointer(every=) is not given and no
# coordinator schedules them (a coordinator's schedule always wins). The same
# on every rank, so that the ranks of a job snapshot the same steps.
DEFAULT_EVERY = 500
# Snapshots skipped for want of a free staging slot are told once at the first
# and then summed up at most this often (seconds), and at close().
SKIP_SUMMARY_INTERVAL = 60.0

_log = logging.getLogger(__name__)
# What to change when snapshots are skipped for want of a staging slot.
_SKIP_KNOBS = ("To skip fewer: pass slot_wait=SECONDS to wait for a slot, snapshot less often (every=), or give "
               "the agent more staging slots (ckptd-agent --slots, at the cost of host memory) or a faster "
               "storage root")

_DTYPES = {torch.float32: _ckptd.FLOAT32, torch.bfloat16: _ckptd.BFLOAT16, torch.float16: _ckptd.FLOAT16,
           torch.float64: _ckptd.FLOAT64, torch.int8: _ckptd.INT8, torch.uint8: _ckptd.UINT8,
           torch.int16: _ckptd.INT16, torch.int32: _ckptd.INT32, torch.int64: _ckptd.INT64,
           torch.bool: _ckptd.BOOL}

# A tracked object's non-tensor state: this header, its length (u64, little
# endian), then UTF-8 JSON; the rest of the buffer is zero.
_META_MAGIC = b"CKPTDPY1"
_META_HEADER = len(_META_MAGIC) + 8
_META_MIN_BYTES = 4096
# Numbers count this wide when the size of the JSON buffer is chosen, so that
# the size depends only on the structure of the state, not on its values: a
# fresh process that restores registers the same size as the one that saved.
_NUMBER_WIDTH = 32

# Optimizers whose lazily created state starts as zeros: after the trial step
# (see _materialize) zeroing it is the same as creating it lazily.
_ZERO_INIT_OPTIMIZERS = tuple(getattr(torch.optim, n) for n in
                              ("Adam", "AdamW", "Adamax", "RAdam", "RMSprop", "Adadelta") if hasattr(torch.optim, n))

_CURSOR_WORDS = ("sampler", "loader", "cursor", "data")

# The components whose plain tensors Checkpointer(replicated=...) declares
# replicated: RNG streams and data cursors are each rank's own.
_REPLICATED_COMPONENTS = (_ckptd.PARAMS, _ckptd.GRADS, _ckptd.OPTIMIZER)


def _escape(key):
    return str(key).replace("%", "%25").replace("/", "%2F").replace("#", "%23")


# --- sharded tensors -----------------------------------------------------------

def _is_dtensor(t):
    """A torch.distributed DTensor (FSDP2, tensor parallelism): duck-typed,
    so that torch versions without DTensor import this module too."""
    return callable(getattr(t, "to_local", None)) and hasattr(t, "placements") and hasattr(t, "device_mesh")


def _dtensor_slice(t, where):
    """(local tensor, global shape, offsets) of DTensor `t` on this rank: its
    placements over its device mesh say where its local shard lies. Shard(d)
    splits dimension d as torch.chunk does (pieces of ceil(n/k), the last
    ones shorter or empty), nested in mesh-dimension order; Replicate keeps
    it whole. Partial sums cannot be checkpointed (reduce them first)."""
    local = t.to_local()
    global_shape = [int(n) for n in t.shape]
    offsets = [0] * len(global_shape)
    extent = list(global_shape)
    coordinate = t.device_mesh.get_coordinate()
    if coordinate is None:
        raise ValueError(f"ckptd: tensor at '{where}' is a DTensor on a device mesh this rank is not part of")
    for mesh_dim, p in enumerate(t.placements):
        if getattr(p, "is_replicate", lambda: False)():
            continue
        if not getattr(p, "is_shard", lambda: False)():
            raise TypeError(f"ckptd: tensor at '{where}' has placement {p} on mesh dimension {mesh_dim}; only "
                            "Shard(dim) and Replicate() can be checkpointed (reduce partial values first)")
        d = p.dim % len(global_shape)
        parts, k = t.device_mesh.size(mesh_dim), coordinate[mesh_dim]
        chunk = -(-extent[d] // parts)
        start = min(extent[d], chunk * k)
        end = min(extent[d], start + chunk)
        offsets[d] += start
        extent[d] = end - start
    if list(local.shape) != extent:
        raise ValueError(f"ckptd: tensor at '{where}' is a DTensor whose local shard is {list(local.shape)}, not the "
                         f"{extent} its placements {list(t.placements)} give (an uneven sharding ckptd does not know)")
    return local, global_shape, offsets


def _dtensor_replica(t):
    """The ckptd.Replica group of DTensor `t`'s local shard: the ranks whose
    coordinates differ only on the mesh dimensions where it is Replicate()
    hold the same shard (HSDP's data-parallel dimension). None when no mesh
    dimension of more than one rank replicates it."""
    coordinate = t.device_mesh.get_coordinate()
    names = getattr(t.device_mesh, "mesh_dim_names", None)
    dims, count, index = [], 1, 0
    for mesh_dim, p in enumerate(t.placements):
        size = t.device_mesh.size(mesh_dim)
        if not getattr(p, "is_replicate", lambda: False)() or size == 1:
            continue
        dims.append(str(names[mesh_dim]) if names else str(mesh_dim))
        index = index * size + coordinate[mesh_dim]
        count *= size
    if count == 1:
        return None
    return _ckptd.Replica("mesh:" + ",".join(dims), count, index)


# --- non-tensor state as JSON -------------------------------------------------

def _encode(value, path, on_tensor):
    """The JSON form of `value`; tensors become {"$T": buffer name, ...}."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value  # floats keep every bit: json writes repr()
    if isinstance(value, torch.Tensor) or _is_dtensor(value):
        return {"$T": on_tensor(path, value), "shape": list(value.shape), "dtype": str(value.dtype)[6:]}
    if isinstance(value, dict):
        return {"$d": [[_encode(k, path + ("<key>",), on_tensor), _encode(v, path + (k,), on_tensor)]
                       for k, v in value.items()]}
    if isinstance(value, list):
        return [_encode(v, path + (i,), on_tensor) for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {"$t": [_encode(v, path + (i,), on_tensor) for i, v in enumerate(value)]}
    if isinstance(value, (bytes, bytearray)):
        return {"$b": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, torch.dtype):
        return {"$dtype": str(value)[6:]}
    if isinstance(value, torch.device):
        return {"$device": str(value)}
    if _np is not None and isinstance(value, _np.ndarray):
        a = _np.ascontiguousarray(value)
        return {"$nd": [a.dtype.str, list(a.shape), base64.b64encode(a.tobytes()).decode("ascii")]}
    if _np is not None and isinstance(value, _np.generic):
        return {"$ns": [value.dtype.str, value.item()]}
    where = "/".join(_escape(k) for k in path)
    raise TypeError(f"ckptd: the state at '{where}' is a {type(value).__name__}, which the Checkpointer cannot "
                    "store (it stores tensors, numbers, strings, bytes, None, lists, tuples, dicts and NumPy "
                    "arrays)")


def _decode(node, tensor_for):
    if isinstance(node, list):
        return [_decode(v, tensor_for) for v in node]
    if not isinstance(node, dict):
        return node
    if "$d" in node:
        return {_decode(k, tensor_for): _decode(v, tensor_for) for k, v in node["$d"]}
    if "$t" in node:
        return tuple(_decode(v, tensor_for) for v in node["$t"])
    if "$T" in node:
        return tensor_for(node)
    if "$b" in node:
        return base64.b64decode(node["$b"])
    if "$dtype" in node:
        return getattr(torch, node["$dtype"])
    if "$device" in node:
        return torch.device(node["$device"])
    if "$nd" in node:
        dtype, shape, data = node["$nd"]
        return _np.frombuffer(base64.b64decode(data), dtype=_np.dtype(dtype)).reshape(shape).copy()
    if "$ns" in node:
        dtype, value = node["$ns"]
        return _np.dtype(dtype).type(value)
    raise ValueError(f"ckptd: unknown node in stored state: {sorted(node)}")


def _size_bound(node):
    """JSON bytes of `node` with every number at _NUMBER_WIDTH: a function of
    the structure of the state."""
    if node is None or isinstance(node, bool):
        return 5
    if isinstance(node, (int, float)):
        return max(_NUMBER_WIDTH, len(repr(node)))
    if isinstance(node, str):
        return len(json.dumps(node))
    if isinstance(node, list):
        return 2 + sum(_size_bound(v) + 1 for v in node)
    return 2 + sum(len(json.dumps(k)) + 2 + _size_bound(v) for k, v in node.items())


def _meta_capacity(tree):
    n = _META_MIN_BYTES
    while n < 2 * _size_bound(tree) + _META_HEADER:
        n *= 2
    return n


# --- RNG streams ---------------------------------------------------------------

class _Rng:
    """One RNG stream: a fixed-size byte buffer it is saved in and loaded from."""

    def __init__(self, name, size, get, set_):
        self.name, self.size, self.get, self.set = name, size, get, set_


def _python_rng():
    fmt = "<I625I?d"

    def get():
        version, words, gauss = random.getstate()
        return struct.pack(fmt, version, *words, gauss is not None, gauss or 0.0)

    def set_(data):
        v = struct.unpack(fmt, data)
        random.setstate((v[0], tuple(v[1:626]), v[627] if v[626] else None))

    return _Rng("#rng/python", struct.calcsize(fmt), get, set_)


def _numpy_rng():
    def get():
        kind, keys, pos, has_gauss, cached = _np.random.get_state()
        if kind != "MT19937" or len(keys) != 624:
            raise ValueError(f"ckptd: NumPy's global RNG is {kind}; only MT19937 is saved")
        return keys.astype("<u4").tobytes() + struct.pack("<iid", pos, has_gauss, cached)

    def set_(data):
        pos, has_gauss, cached = struct.unpack("<iid", data[2496:])
        _np.random.set_state(("MT19937", _np.frombuffer(data[:2496], dtype="<u4").astype(_np.uint32), pos,
                              has_gauss, cached))

    return _Rng("#rng/numpy", 2496 + 16, get, set_)


def _torch_rngs():
    rngs = [_Rng("#rng/torch", torch.get_rng_state().numel(), lambda: torch.get_rng_state().numpy().tobytes(),
                 lambda data: torch.set_rng_state(torch.frombuffer(bytearray(data), dtype=torch.uint8)))]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            rngs.append(_Rng(f"#rng/cuda:{i}", torch.cuda.get_rng_state(i).numel(),
                             lambda i=i: torch.cuda.get_rng_state(i).numpy().tobytes(),
                             lambda data, i=i: torch.cuda.set_rng_state(
                                 torch.frombuffer(bytearray(data), dtype=torch.uint8), i)))
    return rngs


def _rng_streams():
    return [_python_rng()] + ([_numpy_rng()] if _np is not None else []) + _torch_rngs()


def derived_seed(seed, step, rank):
    """The seed of the RNG streams of a rank that the restored checkpoint's
    world did not have (an elastic restore onto more ranks): a 63-bit number
    from the job's seed, the restored step and the rank, the same in every
    run (docs/elastic.md)."""
    digest = hashlib.sha256(f"ckptd-rng/{int(seed)}/{int(step)}/{int(rank)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _seed_rngs(seed):
    random.seed(seed)
    if _np is not None:
        _np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)  # every CUDA device's too


# --- what is tracked, what is registered ---------------------------------------

class _Tracked:
    def __init__(self, name, obj, component, meta_bytes):
        self.name, self.obj, self.component, self.meta_bytes = name, obj, component, meta_bytes


class _Leaf:
    """A tensor in a tracked object's state_dict() now. For a DTensor,
    `tensor` is its local shard, `sharded` the DTensor and `layout` the
    shard's (global shape, offsets). `replica`: the ckptd.Replica group it
    is the same on (None: this rank's own)."""

    def __init__(self, name, tensor, path, tracked, sharded=None, layout=None, replica=None):
        self.name, self.tensor, self.path, self.tracked = name, tensor, path, tracked
        self.sharded, self.layout, self.replica = sharded, layout, replica


class _Plan:
    """The tracked state now: the tensors by buffer name and, per tracked
    object, its state_dict() as JSON (tensors by buffer name)."""

    def __init__(self):
        self.leaves = collections.OrderedDict()
        self.trees = collections.OrderedDict()


class _Reg:
    """A registered tensor buffer. `tensor` is the registered memory, which
    the Checkpointer keeps alive for as long as the registration."""

    def __init__(self, name, tensor, sharded=None, layout=None):
        self.name, self.tensor = name, tensor
        self.shape, self.dtype, self.device = tuple(tensor.shape), tensor.dtype, tensor.device
        self.sharded, self.layout = sharded, layout


class _Layout:
    def __init__(self):
        self.regs = collections.OrderedDict()
        self.metas = collections.OrderedDict()  # tracked name -> ctypes byte array
        self.meta_used = {}
        self.rngs = []  # (_Rng, ctypes byte array)
        self.cuda_devices = set()
        self.client = None


def _caller_level():
    """The stacklevel of warnings.warn called here that names the first frame
    outside this module: the training loop's line."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame, level = frame.f_back, level + 1
    return level


def _memory_key(t):
    return (t.device, t.data_ptr(), t.dtype, tuple(t.shape))


# The exit status of a rank the coordinator asks to restart (as
# ckptd-demo-trainer's): its launcher starts the job again.
EXIT_RESTART = 75


def _env_uint32(name):
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return _ckptd._uint32(name, int(value, 10))
    except ValueError as e:
        raise ValueError(f"ckptd: the environment's {name}={value!r} is not a rank number: {e}") from None


def launcher_world(rank=None, world_size=None):
    """(rank, world_size): as given, else what the launcher put in the
    environment (torchrun's RANK and WORLD_SIZE; also set by
    torch.distributed's env:// launchers), else rank 0 of 1."""
    if rank is None:
        rank = _env_uint32("RANK")
    if world_size is None:
        world_size = _env_uint32("WORLD_SIZE")
    return (0 if rank is None else rank), (1 if world_size is None else world_size)


class Checkpointer:
    """Checkpoints the objects a training loop tracks through the node's
    ckptd-agent, and resumes them bit-identically.

    job, socket, trusted_agent_uids: as for ckptd.Client (socket None: the
    default one). rank, world_size: as for ckptd.Client;
    not given, from the launcher's environment (torchrun's RANK and
    WORLD_SIZE), else rank 0 of 1. on_restart: what maybe_snapshot does when
    the coordinator asks every rank to restart (a failure elsewhere): "exit"
    closes the Checkpointer and raises SystemExit(EXIT_RESTART), so that the
    launcher (torchrun's elastic agent, with --max-restarts) starts the ranks
    again (with --max-restarts 0, torchrun ends the run instead); "flag" only
    sets restart_requested() for the loop to look at. Default: "exit" under
    torchrun's elastic agent (TORCHELASTIC_RUN_ID set), else "flag".
    every: maybe_snapshot
    snapshots every this many steps; not given (None), every DEFAULT_EVERY
    (500) steps; 0: only the steps a coordinator schedules (without one,
    never: only snapshot() does). When the node's agent reports to a
    coordinator, the coordinator's schedule applies instead, whatever `every`
    says. on_error: what a failed snapshot does, "warn" (a
    ckptd.CheckpointWarning, the default), "raise" (the ckptd.Error) or
    "ignore"; training goes on after a warning. Times are in seconds.

    Snapshots the agent then fails to persist (a full or failing disk) are
    not checkpointed: at the next maybe_snapshot() or snapshot() after the
    agent reports them, a ckptd.PersistFailedWarning names how many failed,
    the newest one's step and error (once per new batch of failures; none
    with on_error="ignore"; never raised). persist_failures counts them and
    last_persist_failure is the newest one's (step, error).
    Out-of-range values (a rank or world_size beyond uint32_t, a negative
    step or time, ...) raise ValueError naming the parameter, here rather
    than at the first snapshot.

    Elastic restore (docs/elastic.md): a DTensor in a tracked state_dict()
    (FSDP2's Shard(0), tensor parallelism's Shard(d), Replicate()) is
    registered as its local shard with its global shape and offsets, so a
    job restarted on another number of ranks gets each rank's new shard. A
    rank that the restored step's world did not have gets RNG streams
    derived from `seed` (default: from the job's name), the step and its
    rank (derived_seed); rng_derived says so and restored_world_size is the
    saved world's size.

    Replicated state written once: a DTensor's shard that Replicate()
    placements repeat on other ranks (HSDP) is declared replicated over
    them. `replicated` does the same for the plain tensors of the params,
    grads and optimizer objects: True when every rank of the job holds the
    same ones (plain data parallelism, DDP), or a ckptd.Replica(group,
    count, index) for a group of the job. The group then writes each such
    tensor once, every member a share of its rows, and every member
    restores all of it. Only state that is the same on every member may be
    declared so (DDP keeps parameters, buffers and optimizer state so).
    """

    def __init__(self, job, socket=None, rank=None, world_size=None, *, every=None, slot_wait=0.0, rpc_timeout=5.0,
                 connect_wait=0.0, spare_device_buffer=False, rng=True, on_error="warn", retry_interval=10.0,
                 seed=None, replicated=None, on_restart=None, trusted_agent_uids=(), prepare_wait=None):
        if on_error not in ("warn", "raise", "ignore"):
            raise ValueError(f"on_error must be 'warn', 'raise' or 'ignore', not {on_error!r}")
        if on_restart is None:  # torchrun's elastic agent restarts the workers that exit
            on_restart = "exit" if os.environ.get("TORCHELASTIC_RUN_ID") else "flag"
        if on_restart not in ("exit", "flag"):
            raise ValueError(f"on_restart must be 'exit' or 'flag', not {on_restart!r}")
        self._on_restart = on_restart
        # Checked now: at the first maybe_snapshot a bad value would only be a
        # CheckpointWarning, again at every retry.
        rank, world_size = _ckptd._world(*launcher_world(rank, world_size))
        self._every_default = every is None
        every = DEFAULT_EVERY if every is None else _ckptd._uint64("every", every)
        _ckptd._millis("slot_wait", slot_wait)
        if prepare_wait is not None:
            _ckptd._millis("prepare_wait", prepare_wait)
        _ckptd._millis("rpc_timeout", rpc_timeout, positive=True)
        _ckptd._seconds("connect_wait", connect_wait, finite=False)
        retry_interval = _ckptd._seconds("retry_interval", retry_interval, finite=False)
        self._client_args = dict(socket=socket, job=job, rank=rank, world_size=world_size, every_steps=every,
                                 slot_wait=slot_wait, rpc_timeout=rpc_timeout,
                                 spare_device_buffer=spare_device_buffer, connect_wait=connect_wait,
                                 trusted_agent_uids=_ckptd._trusted_uids(trusted_agent_uids))
        if prepare_wait is not None:  # libckptd's default (60 s) otherwise, and no ABI 11 needed
            self._client_args["prepare_wait"] = prepare_wait
        self._rng = rng
        if seed is None:  # from the job's name: the same on every rank and in every run
            seed = int.from_bytes(hashlib.sha256(str(job).encode()).digest()[:8], "little") >> 1
        self._seed = _ckptd._integer("seed", seed, 0, _ckptd.INT64_MAX)
        if replicated is True:  # plain data parallelism: every rank holds the same weights and optimizer state
            replicated = _ckptd.Replica("dp", world_size, rank)
        elif replicated is False:
            replicated = None
        self._replicated = _ckptd._replica("replicated", replicated) if replicated is not None else None
        if self._replicated is not None and self._replicated.count > world_size:
            raise ValueError(f"ckptd: a replica group of {self._replicated.count} ranks is larger than the world "
                             f"of {world_size}")
        self.restored_world_size = None  # the world size that saved the restored step, when it says
        self.rng_derived = False  # this rank's RNG streams were derived (docs/elastic.md), not restored
        self._on_error = on_error
        self._retry_interval = retry_interval
        self._retry_at = 0.0
        self._tracked = collections.OrderedDict()
        self._layout = None
        self.last_error = None  # the last failure, also when it was only a warning
        self.last_stall = None  # seconds the last snapshot stalled training
        self.snapshots_taken = 0
        self.registrations = 0  # times the tracked state was registered with the agent
        self.persist_failures = 0  # snapshots the agent could not persist, as reported so far
        self.snapshots_skipped = 0  # snapshots skipped: no free staging slot
        self.last_snapshot_step = None  # the step of the last snapshot handed to the agent
        self._skips_untold = 0  # skips since the last warning about them
        self._skips_newest = None  # the newest skipped step
        self._skips_told_at = 0.0  # time.monotonic() of that warning
        self._schedule_told = False  # a coordinator's schedule was said to apply
        self.last_persist_failure = None  # (step, error) of the newest one
        self._failures_seen = 0  # of the current client

    @property
    def every(self):
        """The steps between snapshots when no coordinator schedules them (0:
        none); DEFAULT_EVERY unless given."""
        return self._client_args["every_steps"]

    # --- the training loop's calls ---

    def track(self, name, obj, component=None, meta_bytes=None):
        """Checkpoints `obj` (anything with state_dict() and load_state_dict():
        modules, optimizers, LR schedulers, loaders, your own objects) as
        `name`. component: "params", "grads", "optimizer", "rng" or
        "data_cursor"; by default from the object's type (a ResumableLoader,
        sampler or loader is the data cursor). meta_bytes: the size of the
        buffer of its non-tensor state (default: twice what its structure
        needs, at least 4 KiB); an object whose non-tensor state grows must
        give it, the same in every run. Track everything before restore()."""
        if not name or "/" in name or "#" in name:
            raise ValueError(f"ckptd: track name {name!r} must be non-empty, without '/' or '#'")
        if meta_bytes is not None:
            meta_bytes = _ckptd._integer("meta_bytes", meta_bytes, _META_HEADER + 2, _ckptd.INT64_MAX)
        if name in self._tracked:
            raise ValueError(f"ckptd: '{name}' is already tracked")
        if not callable(getattr(obj, "state_dict", None)) or not callable(getattr(obj, "load_state_dict", None)):
            if isinstance(obj, (torch.utils.data.DataLoader, torch.utils.data.Sampler)):
                # A plain loader keeps no position: a resumed job would read its
                # epoch again from the start.
                raise TypeError(
                    f"ckptd: '{name}' is a plain torch {type(obj).__name__}, which keeps no position to resume "
                    "from: use ckptd.torch.ResumableLoader(dataset, batch_size=..., shuffle=..., rank=..., "
                    "world_size=...) in its place and track that, so that a restored job goes on at the next "
                    "sample")
            raise TypeError(f"ckptd: '{name}' ({type(obj).__name__}) has no state_dict() and load_state_dict()")
        if component is None:
            component = self._component_of(name, obj)
        if component not in _ckptd.COMPONENTS:
            raise ValueError(f"ckptd: component {component!r} is none of {', '.join(_ckptd.COMPONENTS)}")
        tracked = _Tracked(name, obj, _ckptd.COMPONENTS[component], meta_bytes)
        # Anything it cannot store fails here, not at the first snapshot.
        _encode(obj.state_dict(), (name,), lambda path, t: "")
        self._tracked[name] = tracked
        return obj

    def restore(self):
        """Loads every tracked object (and the RNG streams) from the newest
        committed checkpoint of the job and returns its step, the number of
        steps done; 0 when nothing is committed (start from scratch). An
        agent that cannot be reached (after `connect_wait`) is a warning as
        for snapshots when the job has one rank (training starts from
        scratch, without checkpoints for now), and raises UnavailableError
        when it has several: one rank starting from scratch while the others
        restore would train a different model on each rank. Any other
        failure raises ckptd.Error, e.g. FailedPreconditionError naming the
        tensor when the model does not match the checkpoint."""
        self._require_tracked("restore()")
        # Optimizer state made for the restore to overwrite, not zeroed yet
        # (zeroing a large state only to overwrite it costs a pass over its
        # memory on the restart path); zeroed unless a step is restored.
        unzeroed = []
        restored = False
        try:
            if self._layout is None:
                try:
                    self._open(unzeroed)
                except _ckptd.UnavailableError as e:
                    rank, world_size = self._client_args["rank"], self._client_args["world_size"]
                    if world_size > 1:
                        raise _ckptd.UnavailableError(
                            f"{e} (rank {rank} of {world_size} cannot restore; the other ranks may: "
                            "exit and let the launcher start the job again, or pass connect_wait= to wait for the "
                            "node's agent)", code=e.code) from e
                    self._retry_at = time.monotonic() + self._retry_interval
                    self._fail("restore (training starts from scratch)", e)
                    return 0
            step = self._layout.client.restore()
            if step is None:
                rank, world_size = self._client_args["rank"], self._client_args["world_size"]
                _log.info("ckptd: job '%s' has no committed checkpoint (rank %d of %d): training starts from scratch",
                          self._client_args["job"], rank, world_size)
                return 0
            self._load(step)
            restored = True
        finally:
            if not restored:
                with torch.no_grad():
                    for t in unzeroed:
                        t.zero_()
        _log.info("ckptd: job '%s' restored step %d (rank %d of %d)", self._client_args["job"], step,
                  self._client_args["rank"], self._client_args["world_size"])
        return step

    def maybe_snapshot(self, step):
        """Snapshots `step` when the schedule says so and returns True once
        it is handed to the agent; returns False at once otherwise. Call it
        every step, after the optimizer step. A failure does not stop
        training (see on_error); a step that is not a uint64_t, or nothing
        tracked, raises."""
        step = _ckptd._uint64("step", step)
        self._require_tracked("maybe_snapshot()")
        if self._layout is None:
            if time.monotonic() < self._retry_at:
                return False
            try:
                self._open()
            except Exception as e:
                self._retry_at = time.monotonic() + self._retry_interval
                return self._fail("connect", e)
        self._check_persist_failures()
        if self._on_restart == "exit" and self._layout.client.restart_requested():
            # Say goodbye first: the agent persists what was handed to it and
            # ends the session now, not when it notices the process gone.
            try:
                self._close_client()
            except Exception as e:  # exiting anyway; the agent cleans up after a dead process too
                warnings.warn(f"ckptd: closing before the restart: {e}", _ckptd.CheckpointWarning,
                              stacklevel=_caller_level())
            raise SystemExit(EXIT_RESTART)
        if not self._schedule_told:
            self._tell_schedule()
        if not self._layout.client.should_snapshot(step):
            return False
        return self._snapshot(step, scheduled=True)

    def snapshot(self, step):
        """Snapshots `step` now, whatever the schedule; as maybe_snapshot, but
        it also waits (up to prepare_wait) for staging the agent is still
        allocating, as after a large state first registered."""
        return self._snapshot(_ckptd._uint64("step", step), scheduled=False)

    def _snapshot(self, step, scheduled):
        step = _ckptd._uint64("step", step)
        self._require_tracked("snapshot()")
        self._check_persist_failures()
        try:
            if self._layout is None:
                self._open()
            plan = self._collect()
            stale = self._reconcile(plan)
            if stale:
                warnings.warn(f"ckptd: {stale}; registering the tracked state again", _ckptd.CheckpointWarning,
                              stacklevel=_caller_level())
                self._close_client()
                self._open()
                plan = self._collect()
                stale = self._reconcile(plan)
                if stale:
                    raise _ckptd.InternalError(f"ckptd: the tracked state changed while registering: {stale}")
            self._fill(plan)
            try:
                self.last_stall = self._layout.client.snapshot(step, scheduled=scheduled)
            except _ckptd.ResourceExhaustedError as e:  # no free staging slot
                skipped = e
            else:
                self.snapshots_taken += 1
                self.last_snapshot_step = step
                return True
        except Exception as e:
            return self._fail(f"snapshot of step {step}", e)
        return self._skipped(step, skipped)

    def wait_persisted(self, step, timeout=60.0):
        """Waits until the agent has persisted `step`; raises ckptd.Error."""
        if self._layout is None:
            raise _ckptd.FailedPreconditionError("ckptd: not connected to the agent")
        self._layout.client.wait_persisted(step, timeout)

    def restart_requested(self):
        """The coordinator asks every rank to restart (a failure elsewhere):
        exit, and let the launcher start the job again (no RPC)."""
        return self._layout is not None and self._layout.client.restart_requested()

    def close(self, final_step=None, timeout=60.0):
        """Says goodbye to the agent (which persists what was handed to it).

        final_step: first checkpoint that step (the end of training, whatever
        the schedule): snapshot it, unless it is the last step snapshotted,
        and wait up to `timeout` seconds until the agent has persisted it.
        A job's ranks all pass the same final_step (under a coordinator the
        step commits once every rank has persisted it). A failure there is
        handled as on_error says for any snapshot, and the goodbye is said
        anyway. Returns True when final_step was checkpointed, else False
        (always False without final_step)."""
        done = False
        try:
            if final_step is not None:
                final_step = _ckptd._uint64("final_step", final_step)
                _ckptd._seconds("timeout", timeout)
                if self.last_snapshot_step == final_step or self.snapshot(final_step):
                    try:
                        self.wait_persisted(final_step, timeout)
                        done = True
                    except Exception as e:
                        self._fail(f"final checkpoint of step {final_step}", e)
                    else:
                        _log.info("ckptd: job '%s' rank %d: final checkpoint of step %d persisted",
                                  self._client_args["job"], self._client_args["rank"], final_step)
            self._check_persist_failures()
            self._tell_skips()
        finally:
            self._close_client()
        return done

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- internals ---

    @staticmethod
    def _component_of(name, obj):
        if isinstance(obj, torch.nn.Module):
            return "params"
        if isinstance(obj, (torch.optim.Optimizer, torch.optim.lr_scheduler.ReduceLROnPlateau)) or \
                hasattr(obj, "optimizer") or type(obj).__name__ == "GradScaler":
            return "optimizer"
        if isinstance(obj, (ResumableLoader, torch.utils.data.Sampler, torch.utils.data.DataLoader)) or any(
                w in name.lower() or w in type(obj).__name__.lower() for w in _CURSOR_WORDS):
            return "data_cursor"
        return "params"

    def _require_tracked(self, what):
        # Registering nothing but the RNG streams would make checkpoints that
        # restore no model, silently.
        if not self._tracked:
            raise ValueError(f"ckptd: nothing is tracked; track() the model, optimizer, ... before {what}")

    def _log_schedule(self):
        args = self._client_args
        who = f"ckptd: job '{args['job']}' rank {args['rank']} of {args['world_size']}"
        if args["every_steps"] == 0:
            _log.info("%s: every=0: maybe_snapshot() snapshots only the steps a coordinator schedules; without "
                      "a coordinator, only snapshot() does", who)
        else:
            _log.info("%s: snapshots every %d steps%s, unless the agent's coordinator schedules them", who,
                      args["every_steps"], " (the default; pass every=N to choose)" if self._every_default else "")

    def _tell_schedule(self):
        """Says once, when a coordinator's schedule is first known, that it
        applies instead of `every`, what it is and why (a warning when it
        overrides an `every` the caller gave, else at INFO). No RPC."""
        try:
            s = self._layout.client.schedule()
        except Exception:  # a closed client: nothing to tell
            return
        if s is None:  # a libckptd older than ABI 9 cannot say
            self._schedule_told = True
            return
        if not (s.coordinated and s.known):
            return
        self._schedule_told = True
        args = self._client_args
        job, every = args["job"], args["every_steps"]
        given = f"every={every}" if not self._every_default else f"the default of every {every} steps"
        if s.every_steps:
            cadence = f"a checkpoint every {s.every_steps} steps from step {s.start_step}"
        else:
            cadence = "only the steps it asks for"
        if s.durable_every > 1:
            cadence += (f", every {s.durable_every}th of them durable (the others kept in the agents' memory and "
                        "their partners')")
        overrides = not self._every_default and s.every_steps != every
        _log.log(logging.WARNING if overrides else logging.INFO,
                 "ckptd: job '%s' rank %d: the coordinator's schedule applies, not %s: %s. The coordinator picks "
                 "the interval from the failure rate it observes and the measured checkpoint costs (Young/Daly) "
                 "and changes it as they change; `ckptctl interval --job %s` explains its choice", job,
                 args["rank"], given, cadence, job)

    def _fail(self, what, error):
        self.last_error = error
        if self._on_error == "raise":
            raise error
        if self._on_error != "ignore":
            warnings.warn(f"ckptd: {what} failed: {error}", _ckptd.CheckpointWarning, stacklevel=_caller_level())
        return False

    def _skipped(self, step, error):
        """A snapshot skipped for want of a free staging slot: told at the
        first skip with what to change, then summed up at most every
        SKIP_SUMMARY_INTERVAL seconds (and at close())."""
        self.last_error = error
        self.snapshots_skipped += 1
        self._skips_untold += 1
        self._skips_newest = step
        if self._on_error == "raise":
            raise error
        if self._on_error == "ignore":
            return False
        now = time.monotonic()
        if self.snapshots_skipped == 1:
            self._skips_untold = 0
            self._skips_told_at = now
            self._warn(f"ckptd: job '{self._client_args['job']}' rank {self._client_args['rank']}: {error} (the "
                       f"agent is still persisting earlier snapshots; training goes on). {_SKIP_KNOBS}. Further "
                       f"skips are summed up every {SKIP_SUMMARY_INTERVAL:.0f} s")
        elif now - self._skips_told_at >= SKIP_SUMMARY_INTERVAL:
            self._tell_skips(now)
        return False

    def _tell_skips(self, now=None):
        """The summary of the skips not told yet, if any."""
        if self._skips_untold == 0 or self._on_error == "ignore":
            return
        now = time.monotonic() if now is None else now
        n, self._skips_untold = self._skips_untold, 0
        what = "1 more snapshot" if n == 1 else f"{n} more snapshots"
        self._warn(f"ckptd: {what} of job '{self._client_args['job']}' rank {self._client_args['rank']} skipped "
                   f"in the last {now - self._skips_told_at:.0f} s, no staging slot being free (newest: step "
                   f"{self._skips_newest}; {self.snapshots_skipped} in all, {self.snapshots_taken} taken). "
                   f"{_SKIP_KNOBS}")
        self._skips_told_at = now

    @staticmethod
    def _warn(message, category=_ckptd.CheckpointWarning):
        """A warning at the training loop's line that never stops training."""
        try:
            warnings.warn(message, category, stacklevel=_caller_level())
        except _ckptd.CheckpointWarning:
            pass  # turned into an error by a warnings filter

    def _check_persist_failures(self):
        """Warns once per new batch of failed persists the agent reported
        (no RPC: libckptd caches its last report). Never raises."""
        layout = self._layout
        if layout is None or layout.client is None:
            return
        try:
            f = layout.client.persist_failures()
        except Exception:  # a closed client: nothing to tell
            return
        if f is None or f.failed <= self._failures_seen:
            return
        new = f.failed - self._failures_seen
        self._failures_seen = f.failed
        self.persist_failures += new
        self.last_persist_failure = (f.last_failed_step, f.last_error)
        if self._on_error == "ignore":
            return
        args = self._client_args
        what = "1 snapshot" if new == 1 else f"{new} snapshots"
        self._warn(f"ckptd: the agent could not persist {what} of job '{args['job']}' rank {args['rank']} "
                   f"(newest: step {f.last_failed_step}: {f.last_error}); those steps are not checkpointed, "
                   "training goes on", _ckptd.PersistFailedWarning)

    def _close_client(self):
        layout, self._layout = self._layout, None
        if layout is not None and layout.client is not None:
            layout.client.close()

    def _collect(self):
        plan = _Plan()
        seen = {}

        for tracked in self._tracked.values():
            def on_tensor(path, t, tracked=tracked):
                sharded, layout, replica = None, None, None
                if _is_dtensor(t):
                    sharded = t
                    t, global_shape, offsets = _dtensor_slice(t, "/".join(map(_escape, path)))
                    layout = (tuple(global_shape), tuple(offsets))
                    replica = _dtensor_replica(sharded)
                elif self._replicated is not None and tracked.component in _REPLICATED_COMPONENTS:
                    replica = self._replicated
                if t.layout != torch.strided or t.device.type not in ("cpu", "cuda"):
                    raise TypeError(f"ckptd: tensor at '{'/'.join(map(_escape, path))}' is {t.layout} on "
                                    f"{t.device}; only dense CPU and CUDA tensors can be checkpointed")
                if t.is_contiguous() and t.numel() > 0:
                    key = _memory_key(t)
                    if key in seen:
                        return seen[key]  # the same memory twice (tied weights): one buffer
                name = "/".join(_escape(k) for k in path)
                if name in plan.leaves:
                    raise ValueError(f"ckptd: two tensors are named '{name}'")
                plan.leaves[name] = _Leaf(name, t.detach(), path[1:], tracked, sharded, layout, replica)
                if t.is_contiguous() and t.numel() > 0:
                    seen[_memory_key(t)] = name
                return name

            sd = tracked.obj.state_dict()
            tree = {"state": _encode(sd, (tracked.name,), on_tensor)}
            metadata = getattr(sd, "_metadata", None)
            if metadata is not None:
                tree["metadata"] = _encode(dict(metadata), (tracked.name, "<metadata>"), on_tensor)
            plan.trees[tracked.name] = tree
        return plan

    def _open(self, unzeroed=None):
        """Registers the tracked state with the agent. With a list `unzeroed`,
        optimizer state that starts as zeros is made without zeroing it and
        listed there: the caller zeroes it unless a restore overwrote it."""
        rng_state = self._capture_rngs()
        undo = self._materialize(unzeroed)
        try:
            plan = self._collect()
            layout = _Layout()
            buffers = []
            for leaf in plan.leaves.values():
                t = leaf.tensor if leaf.tensor.is_contiguous() else leaf.tensor.contiguous()
                reg = _Reg(leaf.name, t, leaf.sharded, leaf.layout)
                layout.regs[leaf.name] = reg
                if t.device.type == "cuda":
                    layout.cuda_devices.add(t.device.index)
                buffers.append(self._buffer(leaf.name, t, leaf.tracked.component, leaf.layout, leaf.replica))
            for name, tree in plan.trees.items():
                tracked = self._tracked[name]
                size = tracked.meta_bytes or _meta_capacity(tree)
                array = (_ckptd.ctypes.c_ubyte * size)()
                layout.metas[name] = array
                layout.meta_used[name] = size
                buffers.append(_ckptd.Buffer(f"{name}#meta", array, component=tracked.component,
                                             dtype=_ckptd.BYTES, shape=(size,)))
            if self._rng:
                for rng in _rng_streams():
                    array = (_ckptd.ctypes.c_ubyte * rng.size)()
                    layout.rngs.append((rng, array))
                    buffers.append(_ckptd.Buffer(rng.name, array, component=_ckptd.RNG, dtype=_ckptd.BYTES,
                                                 shape=(rng.size,)))
            layout.client = _ckptd.Client(buffers=buffers, **self._client_args)
            self._layout = layout
            self._failures_seen = 0  # a new client counts from 0
            self.registrations += 1
            if self.registrations == 1:
                self._log_schedule()
        finally:
            self._settle(undo)
            self._apply_rngs(rng_state)

    @staticmethod
    def _buffer(name, t, component, layout=None, replica=None):
        dtype = _DTYPES.get(t.dtype)
        shape = tuple(t.shape)
        global_shape, offsets = layout if layout is not None else (None, None)
        if dtype is None:  # complex and other dtypes: their bytes
            if layout is not None:
                raise TypeError(f"ckptd: tensor '{name}' is a sharded {t.dtype} tensor; only the dtypes of ckptd "
                                "can be sharded (their bytes would not split by elements)")
            dtype, shape = _ckptd.BYTES, (t.numel() * t.element_size(),)
        kind = _ckptd.DEVICE_CUDA if t.device.type == "cuda" else _ckptd.DEVICE_HOST
        return _ckptd.Buffer.at(name, t.data_ptr(), dtype, shape, component=component, device_kind=kind,
                                device_index=t.device.index or 0, global_shape=global_shape, offsets=offsets,
                                owner=t, replica=replica)

    def _materialize(self, unzeroed=None):
        """Optimizers create their state at their first step. A trial step with
        zero gradients creates it now, so that it is registered (and restored)
        from the start; parameters, gradients and RNG are put back. Returns the
        optimizers it stepped. The state of an optimizer whose initial state is
        zeros is made without stepping it (see _zero_state)."""
        stepped = []
        for tracked in self._tracked.values():
            opt = tracked.obj
            if not isinstance(opt, torch.optim.Optimizer) or len(opt.state) > 0:
                continue
            params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
            if not params or self._zero_state(opt, unzeroed):
                continue
            saved = [(p, p.detach().to("cpu", copy=True), p.grad) for p in params]
            count = opt.__dict__.get("_step_count")
            try:
                for p in params:
                    p.grad = torch.zeros_like(p)
                opt.step()
                stepped.append(opt)
            except Exception:  # e.g. a closure is required (LBFGS): its state is created lazily
                opt.state.clear()
            finally:
                with torch.no_grad():
                    for p, data, grad in saved:
                        p.copy_(data)
                        p.grad = grad
                if count is not None:
                    opt._step_count = count
        return stepped

    @staticmethod
    def _zero_state(opt, unzeroed=None):
        """For an optimizer whose first step creates zeros (_ZERO_INIT_OPTIMIZERS),
        makes that state without the step, which would read and write every
        element several times (seconds for a large model): a twin of it over
        one-element parameters steps once, and each state entry of it becomes
        zeros shaped like its parameter (per-element state), a zero scalar
        tensor, or a zero number, on the twin's device and dtype. Returns
        whether it did; False leaves `opt` untouched (the trial step does it).
        With a list `unzeroed`, the per-element tensors are left unwritten
        (torch.empty) and appended to it, for the caller to zero or fill."""
        if type(opt) not in _ZERO_INIT_OPTIMIZERS:
            return False
        real, groups = [], []
        for g in opt.param_groups:
            params = [p for p in g["params"] if p.requires_grad]
            twins = [torch.zeros(1, dtype=p.dtype, device=p.device, requires_grad=True) for p in params]
            real += list(zip(params, twins))
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": twins})
        try:
            twin = type(opt)(groups)
            for _, t in real:
                t.grad = torch.zeros_like(t)
            twin.step()
            state = {}
            for p, t in real:
                entries = {}
                for k, v in twin.state.get(t, {}).items():
                    if isinstance(v, torch.Tensor) and v.dim() == 1 and v.shape == t.shape:
                        if _is_dtensor(p):
                            # Sharded like its parameter (FSDP2): a DTensor
                            # over the same mesh and placements, holding
                            # only this rank's shard.
                            make = torch.zeros_like if unzeroed is None else torch.empty_like
                            entries[k] = make(p, dtype=v.dtype)
                        elif unzeroed is None:
                            entries[k] = torch.zeros(p.shape, dtype=v.dtype, device=v.device)
                        else:
                            entries[k] = torch.empty(p.shape, dtype=v.dtype, device=v.device)
                        if unzeroed is not None:
                            unzeroed.append(entries[k])
                    elif isinstance(v, torch.Tensor) and v.dim() == 0:
                        entries[k] = torch.zeros((), dtype=v.dtype, device=v.device)
                    elif isinstance(v, (int, float)) and not isinstance(v, bool):
                        entries[k] = type(v)(0)
                    else:
                        return False  # a state this rule does not know: the trial step
                state[p] = entries
        except Exception:  # the twin could not be made or stepped: the trial step
            return False
        for p, entries in state.items():
            opt.state[p] = entries
        return True

    @staticmethod
    def _settle(stepped):
        """After registering: the trial step's state becomes the initial state.
        Where that is zeros it is zeroed in place; other optimizers forget it
        and create theirs at their first step, which the next snapshot copies
        into the registered memory."""
        for opt in stepped:
            if type(opt) in _ZERO_INIT_OPTIMIZERS:
                for state in opt.state.values():
                    for k, v in state.items():
                        if isinstance(v, torch.Tensor):
                            v.zero_()
                        elif isinstance(v, (int, float)) and not isinstance(v, bool):
                            state[k] = type(v)(0)
            else:
                opt.state.clear()

    def _reconcile(self, plan):
        """Makes the registered memory hold, or receive at _fill, every tensor of
        `plan`; returns why it cannot (a new or reshaped tensor), else None.
        An optimizer that replaced a state tensor (its first step, its
        load_state_dict) is pointed back at the registered one."""
        regs = self._layout.regs
        for leaf in plan.leaves.values():
            reg = regs.get(leaf.name)
            t = leaf.tensor
            if reg is None:
                return f"tensor '{leaf.name}' is new"
            if tuple(t.shape) != reg.shape or t.dtype != reg.dtype or t.device != reg.device:
                return (f"tensor '{leaf.name}' is now {str(t.dtype)[6:]}{list(t.shape)} on {t.device}, registered "
                        f"as {str(reg.dtype)[6:]}{list(reg.shape)} on {reg.device}")
            if t.data_ptr() == reg.tensor.data_ptr() and t.is_contiguous():
                continue
            self._rebind(leaf, reg)
        return None

    @staticmethod
    def _rebind(leaf, reg):
        """Points an optimizer's state entry at the registered tensor, with the
        entry's values. Other objects' tensors are copied in by _fill."""
        opt, path = leaf.tracked.obj, leaf.path
        if not isinstance(opt, torch.optim.Optimizer) or len(path) != 3 or path[0] != "state":
            return
        params = [p for g in opt.param_groups for p in g["params"]]
        if not isinstance(path[1], int) or not 0 <= path[1] < len(params):
            return
        state = opt.state.get(params[path[1]])
        live = state.get(path[2]) if state is not None else None
        if not isinstance(live, torch.Tensor) or live.data_ptr() != leaf.tensor.data_ptr() or \
                live.stride() != reg.tensor.stride():
            return
        with torch.no_grad():
            reg.tensor.copy_(live)
        state[path[2]] = reg.tensor
        leaf.tensor = reg.tensor

    def _fill(self, plan):
        layout = self._layout
        for leaf in plan.leaves.values():
            reg = layout.regs[leaf.name]
            if leaf.tensor.data_ptr() != reg.tensor.data_ptr() or not leaf.tensor.is_contiguous():
                with torch.no_grad():
                    reg.tensor.copy_(leaf.tensor)
        saved_by = [self._client_args["rank"], self._client_args["world_size"]]
        for name, tree in plan.trees.items():
            # Which rank of which world saved it (not counted in the buffer's
            # size, which the structure of the state alone sets: the slack
            # holds it).
            data = json.dumps({**tree, "saved_by": saved_by}, separators=(",", ":")).encode("utf-8")
            array = layout.metas[name]
            size = len(array)
            if _META_HEADER + len(data) > size:
                raise _ckptd.ResourceExhaustedError(
                    f"ckptd: the non-tensor state of '{name}' is {len(data)} bytes, over the {size - _META_HEADER} "
                    f"registered; track('{name}', ..., meta_bytes=N) with a larger N (the same in every run)")
            blob = _META_MAGIC + struct.pack("<Q", len(data)) + data
            used = layout.meta_used[name]
            _ckptd.ctypes.memmove(array, blob, len(blob))
            if used > len(blob):
                _ckptd.ctypes.memset(_ckptd.ctypes.addressof(array) + len(blob), 0, used - len(blob))
            layout.meta_used[name] = len(blob)
        for rng, array in layout.rngs:
            data = rng.get()
            _ckptd.ctypes.memmove(array, data, len(data))
        for device in layout.cuda_devices:
            torch.cuda.synchronize(device)  # libckptd copies on its own stream

    def _load(self, step):
        """Loads every tracked object from the registered buffers that the
        restore of `step` filled."""
        layout = self._layout
        states = []
        saved_by = None
        for name, tracked in self._tracked.items():
            raw = bytes(layout.metas[name])
            n = struct.unpack("<Q", raw[len(_META_MAGIC):_META_HEADER])[0]
            if raw[:len(_META_MAGIC)] != _META_MAGIC or _META_HEADER + n > len(raw):
                raise _ckptd.DataLossError(f"ckptd: step {step} holds no state of '{name}' that ckptd.torch wrote")
            tree = json.loads(raw[_META_HEADER:_META_HEADER + n].decode("utf-8"))
            saved_by = tree.get("saved_by", saved_by)  # absent in checkpoints of earlier versions

            def tensor_for(node, step=step):
                reg = layout.regs.get(node["$T"])
                if reg is None:
                    raise _ckptd.FailedPreconditionError(
                        f"ckptd: step {step} refers to tensor '{node['$T']}', which is not registered")
                # A DTensor is recorded with its global shape; its local
                # shard (the registered memory) is what the restore filled.
                shape = list(reg.layout[0]) if reg.layout is not None else list(reg.shape)
                if shape != node["shape"] or str(reg.dtype)[6:] != node["dtype"]:
                    raise _ckptd.FailedPreconditionError(
                        f"ckptd: tensor '{reg.name}' is {str(reg.dtype)[6:]}{shape} here but "
                        f"{node['dtype']}{node['shape']} in the checkpoint of step {step}")
                return reg.sharded if reg.sharded is not None else reg.tensor

            state = _decode(tree["state"], tensor_for)
            if "metadata" in tree:
                state = collections.OrderedDict(state)
                state._metadata = _decode(tree["metadata"], tensor_for)
            states.append((tracked, state))
        # Every object's state is checked before any is loaded.
        for tracked, state in states:
            tracked.obj.load_state_dict(state)
        rank = self._client_args["rank"]
        self.restored_world_size = saved_by[1] if saved_by else None
        self.rng_derived = False
        if layout.rngs and saved_by is not None and saved_by[0] != rank:
            # The saved world had no rank `rank` (its streams are another
            # rank's): streams of its own, the same in every run.
            _seed_rngs(derived_seed(self._seed, step, rank))
            self.rng_derived = True
            _log.info("ckptd: job '%s' rank %d: step %d was saved by %d ranks; this rank's RNG streams are derived "
                      "from the job's seed, the step and the rank", self._client_args["job"], rank, step, saved_by[1])
        elif layout.rngs:
            self._apply_rngs([(rng, bytes(array)) for rng, array in layout.rngs])
        # load_state_dict may have replaced tensors (optimizers do). A state
        # that no longer fits is registered again at the next snapshot.
        self._reconcile(self._collect())

    def _capture_rngs(self):
        return [(rng, rng.get()) for rng in _rng_streams()]

    @staticmethod
    def _apply_rngs(states):
        for rng, data in states:
            rng.set(data)


class ResumableLoader:
    """A DataLoader over `dataset` that resumes mid-epoch, also on another
    number of ranks. Each epoch reads the samples in an order drawn from
    (seed, epoch) (or in index order with shuffle=False), the same on every
    rank. The job consumes that order in steps of world_size × batch_size
    samples: at each step rank r receives the r-th batch_size of them, so
    the ranks together read every sample of the epoch once.

    Its state_dict() is the data cursor: the epoch, the position (samples of
    the epoch's order the whole job has consumed: world_size × batch_size
    per step), the seed and the world size it was saved with. The position
    does not depend on the world size: a job restored onto M ranks from a
    checkpoint of N continues at exactly the same sample, with none
    repeated or skipped. Steps are counted as the loop receives them, so
    worker processes reading ahead do not move it.

    The epoch's last step may hold fewer than world_size × batch_size
    samples: with drop_last=False each rank takes its batch_size of what is
    left in rank order (the last of them fewer; ranks past the end none),
    with drop_last=True that step is left out on every rank. A job whose
    ranks must take the same steps (collectives in every step) should use
    drop_last=True, or a dataset whose length is a multiple of
    world_size × batch_size.

    Other keyword arguments go to torch.utils.data.DataLoader (num_workers,
    collate_fn, pin_memory, ...), except sampler, batch_sampler, shuffle and
    generator, which it sets. Each epoch starts a new DataLoader.
    """

    def __init__(self, dataset, batch_size=1, shuffle=True, seed=0, drop_last=False, *, rank=0, world_size=1,
                 **loader_kwargs):
        for k in ("sampler", "batch_sampler", "shuffle", "generator"):
            if k in loader_kwargs:
                raise TypeError(f"ResumableLoader sets {k} itself")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"ResumableLoader: batch_size must be a positive integer, got {batch_size!r}")
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"ResumableLoader: world_size must be a positive integer, got {world_size!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"ResumableLoader: rank must be in [0, {world_size}), got {rank!r}")
        self.dataset, self.batch_size, self.shuffle, self.seed = dataset, batch_size, shuffle, seed
        self.drop_last = drop_last
        self.rank, self.world_size = rank, world_size
        self.loader_kwargs = loader_kwargs
        self.epoch = 0
        self.position = 0

    @property
    def offset(self):
        """The position (the name of the single-rank cursor of earlier versions)."""
        return self.position

    def _stride(self):
        return self.world_size * self.batch_size

    def _batches(self, start, n):
        """This rank's batches of an epoch of n samples from job position
        `start` on: (begin, end) of each in the epoch's order, and where the
        job's position is once the rank has it. The steps start at `start`,
        whatever world size made it."""
        stride = self._stride()
        while start < n and (not self.drop_last or start + stride <= n):
            begin = min(n, start + self.rank * self.batch_size)
            end = min(n, begin + self.batch_size)
            if end > begin:
                yield begin, end, min(n, start + stride)
            start += stride

    def __len__(self):
        """Batches this rank receives in a whole epoch."""
        return sum(1 for _ in self._batches(0, len(self.dataset)))

    def _generator(self, epoch):
        g = torch.Generator()
        g.manual_seed((self.seed * 1_000_003 + epoch) % (1 << 63))
        return g

    def order(self, epoch):
        """The order of the samples in `epoch` (the same on every rank)."""
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        return torch.randperm(n, generator=self._generator(epoch)).tolist()

    def __iter__(self):
        n = len(self.dataset)
        order = self.order(self.epoch)
        mine, ends = [], []
        for begin, end, after in self._batches(self.position, n):
            mine.extend(order[begin:end])
            ends.append(after)
        # Its own generator: worker seeds come from it, not from torch's
        # global RNG, which a resumed run must find where it was saved.
        loader = torch.utils.data.DataLoader(self.dataset, batch_size=self.batch_size, sampler=mine,
                                             drop_last=False, generator=self._generator(self.epoch),
                                             **self.loader_kwargs)
        for batch, end in zip(loader, ends):
            self.position = end
            yield batch
        self.epoch += 1
        self.position = 0

    def state_dict(self):
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "world_size": self.world_size}

    def load_state_dict(self, state):
        """Takes a cursor saved with any world size (and the single-rank
        cursor of earlier versions: epoch, offset, seed)."""
        position = state["position"] if "position" in state else state["offset"]
        self.epoch, self.position, self.seed = int(state["epoch"]), int(position), int(state["seed"])
