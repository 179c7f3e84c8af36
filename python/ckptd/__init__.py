"""ckptd for Python: the C ABI of libckptd (client/ckptd.h) through ctypes.

    client = ckptd.Client(socket, job, [ckptd.Buffer("weights", array)], every_steps=100)
    start = client.restore() or 0
    ...
    if client.should_snapshot(step):
        client.snapshot(step)

Every call goes to libckptd.so: nothing of the client is reimplemented here,
and nothing is compiled at import time. A call that fails raises a subclass
of ckptd.Error whose message is libckptd's (ckptd_last_error). For PyTorch
training loops, see ckptd.torch.Checkpointer.

libckptd.so is looked up in this order: $CKPTD_LIBRARY; next to this package;
the build tree of the checkout the package lies in (build/lib/); the system
loader (e.g. after `cmake --install`). ckptd.export runs `ckptctl export`
(libckptd.so, what a trainer loads, holds no storage engine): see ckptctl().
"""

import collections
import ctypes
import json
import math
import operator
import os
import shutil
import subprocess
import time
import warnings

__all__ = [
    "Buffer", "Client", "Error", "InvalidArgumentError", "DeadlineExceededError", "NotFoundError",
    "ResourceExhaustedError", "FailedPreconditionError", "AbortedError", "InternalError", "UnavailableError",
    "DataLossError", "CheckpointWarning", "PersistFailedWarning", "JobNameReusedWarning", "PersistFailures", "Schedule", "library_path", "PARAMS",
    "GRADS", "OPTIMIZER", "RNG", "DATA_CURSOR", "export", "ckptctl", "Replica",
]

# The ABI version this binding needs (ckptd_options_ext came with 2).
_ABI_REQUIRED = 2

# State components, dtypes and device kinds: the values of ckptd.h.
PARAMS, GRADS, OPTIMIZER, RNG, DATA_CURSOR = 1, 2, 3, 4, 5
COMPONENTS = {"params": PARAMS, "grads": GRADS, "optimizer": OPTIMIZER, "rng": RNG, "data_cursor": DATA_CURSOR}
(BYTES, FLOAT32, BFLOAT16, FLOAT16, FLOAT64, INT8, UINT8, INT16, INT32, INT64, BOOL) = range(1, 12)
DTYPE_SIZES = {BYTES: 1, FLOAT32: 4, BFLOAT16: 2, FLOAT16: 2, FLOAT64: 8, INT8: 1, UINT8: 1, INT16: 2, INT32: 4,
               INT64: 8, BOOL: 1}
DEVICE_HOST, DEVICE_CUDA = 0, 1


class Error(Exception):
    """A failure reported by libckptd: `code` is its canonical status code
    (absl/gRPC numbering), str(error) its message."""

    code = 2  # UNKNOWN

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code


class InvalidArgumentError(Error, ValueError):
    code = 3


class DeadlineExceededError(Error, TimeoutError):
    code = 4


class NotFoundError(Error):
    code = 5


class PermissionDeniedError(Error, PermissionError):
    """E.g. the agent's socket belongs to a user this process does not trust."""
    code = 7


class ResourceExhaustedError(Error):
    """No free staging slot: the snapshot was skipped."""
    code = 8


class FailedPreconditionError(Error):
    """Do not retry: e.g. the checkpoint does not fit the registered buffers."""
    code = 9


class AbortedError(Error):
    code = 10


class InternalError(Error):
    code = 13


class UnavailableError(Error, ConnectionError):
    """The agent cannot be reached."""
    code = 14


class DataLossError(Error):
    code = 15


_ERRORS = {c.code: c for c in (InvalidArgumentError, DeadlineExceededError, NotFoundError, PermissionDeniedError,
                               ResourceExhaustedError, FailedPreconditionError, AbortedError, InternalError,
                               UnavailableError, DataLossError)}


class CheckpointWarning(UserWarning):
    """A checkpoint that failed without stopping training (checkpointing is a
    weak dependency): the category ckptd.torch warns with."""


class PersistFailedWarning(CheckpointWarning, RuntimeWarning):
    """The agent could not persist snapshots this trainer took (a full or
    failing disk): those steps are not checkpointed, and training goes on.
    ckptd.torch's Checkpointer warns with it once per new batch of failures."""


class JobNameReusedWarning(CheckpointWarning):
    """The job's name was used by a run that finished (every rank said
    goodbye): restore() resumed that run's newest committed step, so this run
    trains only past it. Give a new run a job name of its own. Client.restore
    warns with it, with the coordinator's words."""


# Persists of a client's snapshots that failed at the agent: how many since
# the client connected, and the newest one's step and error (None and "" when
# there is none).
PersistFailures = collections.namedtuple("PersistFailures", ["failed", "last_failed_step", "last_error"])
# The schedule should_snapshot follows (Client.schedule()).
Schedule = collections.namedtuple("Schedule", ["coordinated", "known", "start_step", "every_steps", "durable_every",
                                               "generation"])

# A buffer every rank of a group holds the same (the weights and optimizer
# state of data parallelism): the group's name, its size and this rank's
# place in it. The group writes the buffer once, each member a share of its
# rows, and every member restores all of it (docs/elastic.md).
Replica = collections.namedtuple("Replica", ["group", "count", "index"])


def error_for(code, message):
    """The exception for a status code and message of libckptd."""
    return _ERRORS.get(code, Error)(message, code)


# --- values that cross into C --------------------------------------------------
#
# ctypes converts a Python int to a C integer by truncating it, silently:
# rank 4294967296 would reach libckptd as rank 0, step -1 as 2**64 - 1. Every
# integer this package hands to libckptd is checked against its C type first.

UINT32_MAX = (1 << 32) - 1
UINT64_MAX = (1 << 64) - 1
INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
_C_TYPES = {(0, UINT32_MAX): "uint32_t", (0, UINT64_MAX): "uint64_t", (0, INT32_MAX): "int",
            (0, INT64_MAX): "int64_t"}


def _integer(name, value, lo, hi):
    """`value` as an int inside [lo, hi]: InvalidArgumentError (a ValueError)
    naming `name` and the range otherwise, TypeError for a non-integer."""
    if isinstance(value, bool):
        raise TypeError(f"ckptd: {name} must be an integer, not a bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"ckptd: {name} must be an integer, not {type(value).__name__} {value!r}") from None
    if not lo <= v <= hi:
        ctype = _C_TYPES.get((0, hi))
        raise InvalidArgumentError(f"ckptd: {name} must be from {lo} to {hi}" + (f" ({ctype})" if ctype else "") +
                                   f"; got {v}")
    return v


def _uint32(name, value, lo=0):
    return _integer(name, value, lo, UINT32_MAX)


def _uint64(name, value, lo=0):
    return _integer(name, value, lo, UINT64_MAX)


def _seconds(name, value, positive=False, finite=True):
    """A duration in seconds: a real number >= 0 (> 0 with `positive`), not NaN
    (nor infinite with `finite`)."""
    if isinstance(value, bool):
        raise TypeError(f"ckptd: {name} must be a number of seconds, not a bool")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"ckptd: {name} must be a number of seconds, not {type(value).__name__} {value!r}") from None
    if math.isnan(v) or (finite and math.isinf(v)) or v < 0 or (positive and v == 0):
        raise InvalidArgumentError(f"ckptd: {name} must be a {'finite ' if finite else ''}number of seconds "
                                   f"{'greater than 0' if positive else '0 or more'}; got {value!r}")
    return v


def _millis(name, value, positive=False):
    """Seconds as the int64_t milliseconds of the C ABI: never 0 for a positive
    duration (libckptd reads an rpc_timeout of 0 as its default of 5 s)."""
    v = _seconds(name, value, positive=positive)
    ms = 0 if v == 0 else max(1, round(v * 1000))
    if ms > INT64_MAX:
        raise InvalidArgumentError(f"ckptd: {name} must be at most {INT64_MAX // 1000} seconds (int64_t "
                                   f"milliseconds); got {value!r}")
    return ms


def _world(rank, world_size):
    """rank and world_size as the uint32_t of ckptd_options: 1 <= world_size,
    rank < world_size."""
    world_size = _uint32("world_size", world_size, lo=1)
    rank = _uint32("rank", rank)
    if rank >= world_size:
        raise InvalidArgumentError(f"ckptd: rank must be from 0 to world_size - 1 = {world_size - 1}; got {rank}")
    return rank, world_size


# --- loading libckptd.so -----------------------------------------------------

_HERE = os.path.dirname(os.path.abspath(__file__))
_CHECKOUT = os.path.dirname(os.path.dirname(_HERE))  # python/ckptd -> the repository root


def _candidates():
    env = os.environ.get("CKPTD_LIBRARY")
    if env:
        return [env]  # asked for explicitly: nothing else
    return [os.path.join(_HERE, "libckptd.so"), os.path.join(_CHECKOUT, "build", "lib", "libckptd.so"), "libckptd.so"]


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} (no such file)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise ImportError("ckptd: cannot load libckptd.so; tried " + "; ".join(tried) +
                      ". Build it (cmake --build build, target ckptd_shared) or point CKPTD_LIBRARY at it.")


class _BufferC(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("component", ctypes.c_int), ("dtype", ctypes.c_int),
                ("ndim", ctypes.c_size_t), ("shape", ctypes.POINTER(ctypes.c_uint64)),
                ("global_shape", ctypes.POINTER(ctypes.c_uint64)), ("offsets", ctypes.POINTER(ctypes.c_uint64)),
                ("device_kind", ctypes.c_int), ("device_index", ctypes.c_int), ("data", ctypes.c_void_p)]


class _OptionsC(ctypes.Structure):
    _fields_ = [("socket", ctypes.c_char_p), ("job", ctypes.c_char_p), ("rank", ctypes.c_uint32),
                ("world_size", ctypes.c_uint32), ("every_steps", ctypes.c_uint64), ("slot_wait_ms", ctypes.c_int64),
                ("rpc_timeout_ms", ctypes.c_int64)]


class _ReplicaC(ctypes.Structure):
    _fields_ = [("group", ctypes.c_char_p), ("count", ctypes.c_uint32), ("index", ctypes.c_uint32)]


class _OptionsExtC(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("spare_device_buffer", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("replicas", ctypes.POINTER(_ReplicaC)), ("trusted_agent_uids", ctypes.POINTER(ctypes.c_uint32)),
                ("trusted_agent_uid_count", ctypes.c_size_t), ("prepare_wait_ms", ctypes.c_int64)]


_lib, _lib_path = _load()
_P = ctypes.POINTER
for _name, _res, _args in [
        ("ckptd_abi_version", ctypes.c_int, []),
        ("ckptd_last_error", ctypes.c_char_p, []),
        ("ckptd_connect_ext", ctypes.c_int, [_P(_OptionsC), _P(_OptionsExtC), _P(_BufferC), ctypes.c_size_t,
                                             _P(ctypes.c_void_p)]),
        ("ckptd_should_snapshot", ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64]),
        ("ckptd_restart_requested", ctypes.c_int, [ctypes.c_void_p]),
        ("ckptd_snapshot", ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64, _P(ctypes.c_double)]),
        ("ckptd_restore", ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int), _P(ctypes.c_uint64)]),
        ("ckptd_wait_persisted", ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64]),
        ("ckptd_close", None, [ctypes.c_void_p]),
        # ABI version 3 and later.
        ("ckptd_persist_failures", ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_uint64), _P(ctypes.c_uint64),
                                                  ctypes.c_char_p, ctypes.c_size_t]),
        # ABI version 4 and later.
        ("ckptd_restore_source", ctypes.c_char_p, [ctypes.c_void_p]),
        # ABI version 9 and later.
        ("ckptd_schedule", ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int), _P(ctypes.c_int), _P(ctypes.c_uint64),
                                          _P(ctypes.c_uint64), _P(ctypes.c_uint64), _P(ctypes.c_uint64)]),
        # ABI version 10 and later.
        ("ckptd_restore_warning", ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
        # ABI version 11 and later.
        ("ckptd_snapshot_scheduled", ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64, _P(ctypes.c_double)])]:
    _fn = getattr(_lib, _name, None)
    if _fn is None:
        continue  # an older libckptd: what needs it says so
    _fn.restype, _fn.argtypes = _res, _args
if _lib.ckptd_abi_version() < _ABI_REQUIRED:
    raise ImportError(f"ckptd: {_lib_path} has ABI version {_lib.ckptd_abi_version()}; this package needs "
                      f"{_ABI_REQUIRED} or later")


def library_path():
    """The libckptd.so this package loaded."""
    return _lib_path


def _check(rc):
    # ctypes calls the library on this thread: its last error is ours.
    if rc != 0:
        raise error_for(rc, (_lib.ckptd_last_error() or b"").decode("utf-8", "replace"))


# --- buffers -----------------------------------------------------------------

# memoryview formats (struct module codes) -> ckptd dtypes, by item size for
# the integer codes whose size is platform dependent.
_SIGNED = {1: INT8, 2: INT16, 4: INT32, 8: INT64}
_FORMATS = {"f": FLOAT32, "d": FLOAT64, "e": FLOAT16, "?": BOOL, "B": UINT8, "c": BYTES}


def _dtype_of(view):
    fmt = view.format.lstrip("@=<")
    if fmt in _FORMATS:
        return _FORMATS[fmt]
    if fmt in ("b", "h", "i", "l", "q", "n"):
        return _SIGNED.get(view.itemsize)
    return None  # unsigned wider than a byte, structs, ...: registered as bytes


class Buffer:
    """One buffer of the trainer's state, registered with the agent by its
    memory: libckptd copies from it at each snapshot and into it at restore.

    Buffer(name, obj): `obj` exposes writable, C-contiguous memory through
    the buffer protocol (bytearray, NumPy array, array.array, ctypes array,
    memoryview). The dtype and shape come from it (bytes for a bytearray)
    unless given. The memory stays exported (a bytearray cannot be resized)
    while the Buffer lives.

    Buffer.at(name, address, dtype, shape, ...): raw memory, e.g. a tensor's
    data_ptr(); `owner` is kept referenced so the memory stays valid.
    """

    def __init__(self, name, obj, component=PARAMS, dtype=None, shape=None, global_shape=None, offsets=None,
                 replica=None):
        view = memoryview(obj)
        if view.readonly:
            raise InvalidArgumentError(f"buffer '{name}': the memory of {type(obj).__name__} is read-only")
        if not view.c_contiguous:
            raise InvalidArgumentError(f"buffer '{name}': the memory is not C-contiguous")
        nbytes = view.nbytes
        if dtype is not None and (isinstance(dtype, bool) or dtype not in DTYPE_SIZES):
            raise InvalidArgumentError(f"buffer '{name}': unknown dtype {dtype}")
        inferred = BYTES if isinstance(obj, bytearray) else _dtype_of(view)
        if dtype is None:
            dtype = inferred if inferred is not None else BYTES
        if shape is None:
            shape = view.shape if dtype == inferred and view.ndim > 0 else (nbytes // DTYPE_SIZES[dtype],)
        flat = view.cast("B") if nbytes > 0 else None
        array = (ctypes.c_ubyte * nbytes).from_buffer(flat) if nbytes > 0 else None
        self._init(name, ctypes.addressof(array) if array is not None else 0, nbytes, component, dtype, shape,
                   global_shape, offsets, DEVICE_HOST, 0, (obj, view, flat, array), replica)

    @classmethod
    def at(cls, name, address, dtype, shape, component=PARAMS, device_kind=DEVICE_HOST, device_index=0,
           global_shape=None, offsets=None, owner=None, replica=None):
        b = cls.__new__(cls)
        shape = _shape(name, "shape", shape)
        n = DTYPE_SIZES.get(dtype, 0)
        for d in shape:
            n *= d
        address = _integer(f"buffer '{name}': address", address, 0, UINT64_MAX)
        b._init(name, address, n, component, dtype, shape, global_shape, offsets, device_kind, device_index,
                owner, replica)
        return b

    def _init(self, name, address, nbytes, component, dtype, shape, global_shape, offsets, device_kind,
              device_index, owner, replica=None):
        if isinstance(component, str):
            if component not in COMPONENTS:
                raise InvalidArgumentError(f"buffer '{name}': component '{component}' is none of "
                                           f"{', '.join(COMPONENTS)}")
            component = COMPONENTS[component]
        if isinstance(component, bool) or component not in COMPONENTS.values():
            raise InvalidArgumentError(f"buffer '{name}': component {component!r} is none of "
                                       f"{', '.join(f'{k} ({v})' for k, v in COMPONENTS.items())}")
        if isinstance(dtype, bool) or dtype not in DTYPE_SIZES:
            raise InvalidArgumentError(f"buffer '{name}': unknown dtype {dtype}")
        if isinstance(device_kind, bool) or device_kind not in (DEVICE_HOST, DEVICE_CUDA):
            raise InvalidArgumentError(f"buffer '{name}': device_kind must be DEVICE_HOST ({DEVICE_HOST}) or "
                                       f"DEVICE_CUDA ({DEVICE_CUDA}); got {device_kind!r}")
        device_index = _integer(f"buffer '{name}': device_index", device_index, 0, INT32_MAX)
        shape = _shape(name, "shape", shape)
        # libckptd reads ndim entries of each: a shorter list would be read past its end.
        global_shape = _shape(name, "global_shape", global_shape, len(shape))
        offsets = _shape(name, "offsets", offsets, len(shape))
        expected = DTYPE_SIZES[dtype]
        for d in shape:
            expected *= d
        if expected != nbytes:
            raise InvalidArgumentError(f"buffer '{name}': shape {list(shape)} of dtype {dtype} is {expected} bytes, "
                                       f"the memory {nbytes}")
        if nbytes > 0 and address == 0:
            raise InvalidArgumentError(f"buffer '{name}' has no memory")
        self.name, self.component, self.dtype, self.shape = name, int(component), int(dtype), shape
        self.global_shape, self.offsets = global_shape, offsets
        self.replica = _replica(name, replica)
        self.address, self.nbytes = address, nbytes
        self.device_kind, self.device_index = device_kind, device_index
        self._owner = owner

    def __repr__(self):
        device = "host" if self.device_kind == DEVICE_HOST else f"cuda:{self.device_index}"
        return f"ckptd.Buffer({self.name!r}, dtype={self.dtype}, shape={list(self.shape)}, {device})"


def _shape(name, what, values, ndim=None):
    """A buffer's shape, global_shape or offsets: uint64_t entries (ndim of
    them when given); None stays None."""
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"ckptd: buffer '{name}': {what} must be a sequence of integers, not "
                        f"{type(values).__name__}")
    dims = tuple(_uint64(f"buffer '{name}': {what}[{i}]", d) for i, d in enumerate(values))
    if ndim is not None and len(dims) != ndim:
        raise InvalidArgumentError(f"ckptd: buffer '{name}': {what} has {len(dims)} entries, the shape {ndim}")
    return dims


def _replica(name, replica):
    """A buffer's replica group as a Replica (None: not replicated)."""
    if replica is None:
        return None
    if isinstance(replica, (str, bytes)) or not hasattr(replica, "__iter__") or len(tuple(replica)) != 3:
        raise TypeError(f"ckptd: buffer '{name}': replica must be ckptd.Replica(group, count, index)")
    group, count, index = tuple(replica)
    if not isinstance(group, str) or not group or len(group.encode("utf-8")) > 256:
        raise InvalidArgumentError(f"ckptd: buffer '{name}': the replica group's name must be 1..256 bytes of "
                                   f"UTF-8, not {group!r}")
    count = _integer(f"buffer '{name}': replica count", count, 1, 2**32 - 1)
    index = _integer(f"buffer '{name}': replica index", index, 0, count - 1)
    return Replica(group, count, index)


def _trusted_uids(users):
    """trusted_agent_uids as uids: ints, or names of this machine's users."""
    if isinstance(users, (str, bytes, int)):
        users = [users]
    uids = []
    for u in users:
        if isinstance(u, str) and not u.isdigit():
            import pwd
            try:
                u = pwd.getpwnam(u).pw_uid
            except KeyError:
                raise InvalidArgumentError(f"ckptd: trusted_agent_uids: {u!r} is not a user of this machine") from None
        uids.append(_integer("trusted_agent_uids", int(u), 0, 2**32 - 2))
    if len(uids) > 1024:
        raise InvalidArgumentError(f"ckptd: trusted_agent_uids: {len(uids)} users; at most 1024")
    return uids


def _dims(values):
    return (ctypes.c_uint64 * len(values))(*values) if values is not None else None


class Client:
    """A trainer rank's connection to its node's agent (libckptd's client).

    Registers `buffers` (ckptd.Buffer) at once; raises UnavailableError when
    the agent cannot be reached within `connect_wait` seconds (and
    DeadlineExceededError when it did not answer a registration in time
    until then). Times are in
    seconds. Close it (or use `with`) to say goodbye to the agent, which
    still persists what was published.

    socket: the agent's Unix socket; None: $CKPTD_SOCKET, else
    $XDG_RUNTIME_DIR/ckptd/agent.sock when it exists, else
    /run/ckptd/agent.sock. The socket must belong to this process's user,
    root or a user in trusted_agent_uids (uids or user names; those of
    $CKPTD_TRUSTED_AGENT_UIDS are added), in a directory where no one else
    can replace it: else PermissionDeniedError naming its owner (another
    user may have taken the name to receive this trainer's state).

    every_steps: should_snapshot() says yes every this many steps; 0 (the
    default, as in the C ABI): never by itself, only snapshot() when called.
    Under a coordinator its schedule applies instead. (ckptd.torch's
    Checkpointer defaults to an interval.)

    Integers are checked against their C types (rank and world_size uint32,
    steps uint64, ...): out of range is InvalidArgumentError (a ValueError)
    naming the parameter, never a value truncated by ctypes.
    """

    def __init__(self, socket, job, buffers, rank=0, world_size=1, every_steps=0, slot_wait=0.0, rpc_timeout=5.0,
                 spare_device_buffer=False, connect_wait=0.0, trusted_agent_uids=(), prepare_wait=None):
        self._handle = None
        abi = _lib.ckptd_abi_version()
        if prepare_wait is not None:
            # 0 s: no wait beyond slot_wait (libckptd reads 0 as its default).
            prepare_wait_ms = _millis("prepare_wait", prepare_wait) or -1
            if abi < 11:
                raise Error(f"ckptd: {_lib_path} is older than ABI version 11 and has no prepare_wait")
        else:
            prepare_wait_ms = 0
        trusted = _trusted_uids(trusted_agent_uids)
        if (trusted or socket is None) and abi < 8:
            raise Error(f"ckptd: {_lib_path} is older than ABI version 8: give socket, and no trusted_agent_uids")
        rank, world_size = _world(rank, world_size)
        every_steps = _uint64("every_steps", every_steps)
        slot_wait_ms = _millis("slot_wait", slot_wait)
        rpc_timeout_ms = _millis("rpc_timeout", rpc_timeout, positive=True)
        connect_wait = _seconds("connect_wait", connect_wait, finite=False)
        buffers = list(buffers)
        for b in buffers:
            if not isinstance(b, Buffer):
                raise TypeError(f"ckptd: buffers must be ckptd.Buffer objects, not {type(b).__name__}")
        self._buffers = buffers  # keeps their memory alive
        self._names = [b.name.encode("utf-8") for b in buffers]
        self._dims = []
        array = (_BufferC * max(len(buffers), 1))()
        for i, b in enumerate(buffers):
            dims = [_dims(b.shape), _dims(b.global_shape), _dims(b.offsets)]
            self._dims.append(dims)
            array[i] = _BufferC(self._names[i], b.component, b.dtype, len(b.shape),
                                ctypes.cast(dims[0], _P(ctypes.c_uint64)),
                                ctypes.cast(dims[1], _P(ctypes.c_uint64)) if dims[1] is not None else None,
                                ctypes.cast(dims[2], _P(ctypes.c_uint64)) if dims[2] is not None else None,
                                b.device_kind, b.device_index, b.address or None)
        self._socket = socket.encode("utf-8") if socket is not None else None
        self._job = job.encode("utf-8")
        options = _OptionsC(self._socket, self._job, rank, world_size, every_steps, slot_wait_ms, rpc_timeout_ms)
        self._replicas = None
        if any(b.replica is not None for b in buffers):
            if _lib.ckptd_abi_version() < 6:
                raise Error(f"ckptd: {_lib_path} is older than ABI version 6 and cannot write replicated buffers once")
            self._groups = [b.replica.group.encode("utf-8") if b.replica else None for b in buffers]
            self._replicas = (_ReplicaC * len(buffers))(
                *[_ReplicaC(g, b.replica.count, b.replica.index) if b.replica else _ReplicaC(None, 0, 0)
                  for g, b in zip(self._groups, buffers)])
        self._trusted = (ctypes.c_uint32 * max(len(trusted), 1))(*trusted)
        # An older libckptd is given the struct it knows.
        ext_size = (ctypes.sizeof(_OptionsExtC) if abi >= 11 else _OptionsExtC.prepare_wait_ms.offset if abi >= 8 else
                    _OptionsExtC.trusted_agent_uids.offset if abi >= 6 else _OptionsExtC.replicas.offset)
        ext = _OptionsExtC(ext_size, 1 if spare_device_buffer else 0, 0,
                           ctypes.cast(self._replicas, _P(_ReplicaC)) if self._replicas is not None else None,
                           ctypes.cast(self._trusted, _P(ctypes.c_uint32)) if trusted else None, len(trusted),
                           prepare_wait_ms)
        deadline = time.monotonic() + connect_wait
        while True:
            handle = ctypes.c_void_p()
            try:
                _check(_lib.ckptd_connect_ext(ctypes.byref(options), ctypes.byref(ext), array, len(buffers),
                                              ctypes.byref(handle)))
                break
            except (UnavailableError, DeadlineExceededError):
                # No agent yet, or one too busy to answer in time (restarted
                # on a node whose CPUs are busy): a new registration of the
                # same rank replaces the last.
                if time.monotonic() >= deadline:
                    raise
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        self._handle = handle

    def _live(self):
        if self._handle is None:
            raise InvalidArgumentError("ckptd.Client is closed")
        return self._handle

    @property
    def buffers(self):
        return list(self._buffers)

    def should_snapshot(self, step):
        """Whether the schedule says to snapshot `step` (no RPC). Call it once
        per step: it also tells the agent the pace of training."""
        return _lib.ckptd_should_snapshot(self._live(), _uint64("step", step)) == 1

    def restart_requested(self):
        """The coordinator asks every rank of the job to restart (no RPC)."""
        return _lib.ckptd_restart_requested(self._live()) == 1

    def snapshot(self, step, scheduled=False):
        """Copies every buffer into staging and hands it to the agent; returns
        the seconds training waited (the stall).

        A snapshot asked for by its step (the default) waits slot_wait for a
        slot busy with a snapshot being persisted, and up to prepare_wait
        (60 s unless given) for one the agent is still allocating (a large
        state's first snapshots). scheduled=True (the schedule asked for it,
        should_snapshot) waits slot_wait only (libckptd ABI 11). A skipped
        snapshot raises ResourceExhaustedError saying why."""
        step = _uint64("step", step)
        stall = ctypes.c_double(0.0)
        handle = self._live()
        if scheduled and hasattr(_lib, "ckptd_snapshot_scheduled"):
            _check(_lib.ckptd_snapshot_scheduled(handle, step, ctypes.byref(stall)))
        else:
            _check(_lib.ckptd_snapshot(handle, step, ctypes.byref(stall)))
        return stall.value

    def restore(self):
        """Loads every buffer from the newest committed step and returns that
        step; None when nothing is committed (start from scratch)."""
        found, step = ctypes.c_int(0), ctypes.c_uint64(0)
        _check(_lib.ckptd_restore(self._live(), ctypes.byref(found), ctypes.byref(step)))
        said = self.restore_warning()
        if said:
            warnings.warn(f"ckptd: {said}", JobNameReusedWarning, stacklevel=2)
        return step.value if found.value else None

    def restore_warning(self):
        """What the coordinator said this trainer should hear about the last
        restore() (that the job's name was used by a run that finished, which
        restore() also warns of with a JobNameReusedWarning); "" for nothing,
        before any restore and without a coordinator. None when libckptd is
        older than ABI version 10. No RPC."""
        handle = self._live()
        if not hasattr(_lib, "ckptd_restore_warning"):
            return None
        text = ctypes.create_string_buffer(4096)
        _check(_lib.ckptd_restore_warning(handle, text, len(text)))
        return text.value.decode("utf-8", "replace")

    def wait_persisted(self, step, timeout=60.0):
        """Waits until the agent has persisted `step` (or a later one); a memory
        checkpoint (the coordinator's two cadences) once the agent keeps it in memory."""
        step, timeout_ms = _uint64("step", step), _millis("timeout", timeout)
        _check(_lib.ckptd_wait_persisted(self._live(), step, timeout_ms))

    def persist_failures(self):
        """The persists of this client's snapshots that failed at the agent,
        as a ckptd.PersistFailures(failed, last_failed_step, last_error), as
        the agent last reported them (no RPC; refreshed a few times a second).
        None when libckptd is older than ABI version 3 and cannot tell."""
        handle = self._live()
        if not hasattr(_lib, "ckptd_persist_failures"):
            return None
        failed, step = ctypes.c_uint64(0), ctypes.c_uint64(0)
        error = ctypes.create_string_buffer(1024)
        _check(_lib.ckptd_persist_failures(handle, ctypes.byref(failed), ctypes.byref(step), error, len(error)))
        if failed.value == 0:
            return PersistFailures(0, None, "")
        return PersistFailures(failed.value, step.value, error.value.decode("utf-8", "replace"))

    def restore_source(self):
        """Where the last restore() read its step: "memory" (the agent's own
        memory), "peer" (another node's agent), "node-local" (the node-local
        tier) or "storage-root"; "" before any restore or when nothing was
        restored. None when libckptd is older than ABI version 4. No RPC."""
        handle = self._live()
        if not hasattr(_lib, "ckptd_restore_source"):
            return None
        return _lib.ckptd_restore_source(handle).decode("ascii")

    def schedule(self):
        """The schedule should_snapshot follows now, as a
        ckptd.Schedule(coordinated, known, start_step, every_steps,
        durable_every, generation): coordinated when the agent reports to a
        coordinator, whose schedule then applies instead of every_steps
        (known once it was heard of; nothing is scheduled before); every
        durable_every-th checkpoint is durable (0 or 1: all). None when
        libckptd is older than ABI version 9. No RPC."""
        handle = self._live()
        if not hasattr(_lib, "ckptd_schedule"):
            return None
        coordinated, known = ctypes.c_int(0), ctypes.c_int(0)
        start, every, durable, generation = (ctypes.c_uint64(0) for _ in range(4))
        _check(_lib.ckptd_schedule(handle, ctypes.byref(coordinated), ctypes.byref(known), ctypes.byref(start),
                                   ctypes.byref(every), ctypes.byref(durable), ctypes.byref(generation)))
        return Schedule(bool(coordinated.value), bool(known.value), start.value, every.value, durable.value,
                        generation.value)

    def close(self):
        handle, self._handle = self._handle, None
        if handle is not None and _lib is not None:
            _lib.ckptd_close(handle)

    @property
    def closed(self):
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to tell the agent
            pass


def ckptctl():
    """The ckptctl that ckptd.export runs, looked up like libckptd.so:
    $CKPTD_CTL; next to this package, or in its bin/ (where a wheel of
    scripts/build-wheel.sh bundles it); bin/ beside the lib/ that libckptd.so
    was loaded from (its build tree or installation); the build tree of the
    checkout the package lies in (build/bin/); the PATH. Error when none is
    there."""
    env = os.environ.get("CKPTD_CTL")
    if env:
        candidates = [env]  # asked for explicitly: nothing else
    else:
        candidates = [os.path.join(_HERE, "ckptctl"), os.path.join(_HERE, "bin", "ckptctl")]
        if os.sep in _lib_path:
            prefix = os.path.dirname(os.path.dirname(os.path.abspath(_lib_path)))
            candidates.append(os.path.join(prefix, "bin", "ckptctl"))
        candidates.append(os.path.join(_CHECKOUT, "build", "bin", "ckptctl"))
        on_path = shutil.which("ckptctl")
        if on_path:
            candidates.append(on_path)
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise Error("ckptd: cannot find ckptctl; tried " + ", ".join(candidates) + ("" if env else " and the PATH") +
                ". Build it (cmake --build build, target ckptctl) or point CKPTD_CTL at it.")


def export(root, job, out, *, step=None, components=("params",), max_file_bytes=None, threads=0):
    """Writes the full (unsharded) tensors of a committed step of `job` under
    the storage root `root` (a directory, or an object store as
    "s3://bucket/prefix" with endpoint and credentials from the AWS_*
    environment, as for the agent) as safetensors files in directory `out`: runs
    `ckptctl export` (found as ckptctl() says), which puts each tensor
    sharded over ranks together from every rank's slice, writes a replicated
    one once, and checks every byte against the checkpoint's checksums.
    `step`: default the newest intact committed step. `components`: names
    among "params", "grads", "optimizer", "rng", "data_cursor", or "all".
    Tensors past `max_file_bytes` (default 5e9) go into several files with
    model.safetensors.index.json; otherwise one file, model.safetensors.
    `threads` > 0: decoder threads (default one per hardware thread).
    Returns the step exported. Needs no agent: it reads the storage root."""
    if isinstance(components, str):
        components = (components,)
    if not components or not all(isinstance(c, str) for c in components):
        raise InvalidArgumentError(f"ckptd.export: components must name state components, got {components!r}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 1 << 63):
        raise InvalidArgumentError(f"ckptd.export: step must be a non-negative integer, got {step!r}")
    if max_file_bytes is not None and (isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int)
                                       or not 0 < max_file_bytes < 1 << 64):
        raise InvalidArgumentError(f"ckptd.export: max_file_bytes must be a positive integer, got {max_file_bytes!r}")
    root, out, threads = os.fsencode(root), os.fsencode(out), int(threads)
    if not root or not out:
        raise InvalidArgumentError("ckptd.export: root and out are required")
    # --flag=value: a value that begins with "-" stays a value.
    argv = [ckptctl(), "export", b"--root=" + root, "--job=" + job, b"--out=" + out, "--json"]
    if step is not None:
        argv.append(f"--step={step}")
    if ",".join(components):
        argv.append("--components=" + ",".join(components))
    if max_file_bytes is not None:
        argv.append(f"--max-file-bytes={max_file_bytes}")
    if threads > 0:
        argv.append(f"--threads={threads}")
    run = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # With --json, ckptctl export prints one object, also when it fails:
    # {"error": {"code", "status", "message"}}.
    lines = run.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else {}
    except ValueError:
        report = {}
    if "error" in report:
        raise error_for(report["error"]["code"], report["error"]["message"])
    if run.returncode != 0 or "step" not in report:
        raise Error(f"ckptd.export: {argv[0]} export exited with status {run.returncode}: "
                    + run.stderr.decode("utf-8", "replace").strip())
    return report["step"]


def __getattr__(name):
    # `ckptd.torch` without importing torch with ckptd.
    if name == "torch":
        import importlib
        return importlib.import_module("ckptd.torch")
    raise AttributeError(f"module 'ckptd' has no attribute '{name}'")
