#!/usr/bin/env python3
"""The Python binding's CUDA path, against a real ckptd-agent (temporary
socket and storage root, no coordinator):

  ctypes: device memory from libcudart (through ctypes, no torch), filled
          with a known pattern and registered with ckptd.Buffer.at(...,
          device_kind=ckptd.DEVICE_CUDA) beside a host buffer; a step is
          snapshotted and persisted, the memory overwritten, and a new client
          restores into fresh device memory, which must equal the pattern bit
          for bit. Done straight into staging and through a spare device
          buffer (two hops).
  torch:  a small model with dropout and Adam on cuda:0 through
          ckptd.torch.Checkpointer: a few steps, a snapshot, copies of the
          parameters, optimizer state and RNG states, more steps; then a
          fresh Checkpointer, model and optimizer restore, must equal the
          copies bit for bit, and train on exactly like the first run did.
          Skipped when torch or CUDA torch is missing. Runs in a process of
          its own (this script again, --torch-child).

Prints one line per part: "python cuda (ctypes): PASS|FAIL|skipped (...)",
"python cuda (torch): ...". Exits 1 when a part fails, and when the ctypes
part is skipped (no libcudart, no device) under --require-cuda; 0 otherwise.

  --host-only     the same round trip on host memory, and the torch part on
                  the CPU (for machines without a GPU: "python host (...)")
  --require-cuda  a skipped ctypes part is a failure (tests/gpu/run.sh)
  --agent CMD     the agent's command line (shell words), e.g. a loader
                  prefix and the binary; else $CKPTD_AGENT_CMD (shell words),
                  $CKPTD_AGENT (a path), the bundle's bin/ckptd-agent through
                  its loader, or <checkout>/${BUILD:-build}/bin/ckptd-agent
  --bytes N       size of the device buffer (default 16 MiB + 12 bytes)

libcudart.so: $CKPTD_CUDART, else the system loader's, the toolkit's
(/usr/local/cuda*/lib64, $CUDA_HOME), a pip wheel's
(nvidia/cuda_runtime), then the bundle's cudart/. libckptd.so: as for
`import ckptd` ($CKPTD_LIBRARY, ...); in a bundle, its pylib/ (put on
LD_LIBRARY_PATH here, re-running the script when it is missing there).
When this python's glibc or libstdc++ is too old for pylib/, the script runs
python again through the bundle's loader and lib/ (CKPTD_CHECK_LOADER=1
forces that).
"""

import argparse
import ctypes
import ctypes.util
import glob
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
# A bundle made by tests/gpu/bundle.sh holds this script at its top, beside
# python/ckptd, pylib/ (libckptd.so and the libraries it needs), bin/ and
# lib/ (the loader, glibc and the GCC runtime for bin/).
BUNDLE = os.path.isdir(os.path.join(HERE, "python", "ckptd")) and os.path.isdir(os.path.join(HERE, "pylib"))
if BUNDLE:
    PYTHON_DIR = os.path.join(HERE, "python")
    PYLIB = os.path.join(HERE, "pylib")
    LOADER = os.path.join(HERE, "lib", "ld-linux-x86-64.so.2")
else:
    ROOT = os.path.dirname(os.path.dirname(HERE))
    PYTHON_DIR = os.path.join(ROOT, "python")
    BUILD = os.path.join(ROOT, os.environ.get("BUILD") or "build")

MIB = 1 << 20


def log(line):
    print(line, flush=True)


# --- the agent -----------------------------------------------------------------

def agent_command(arg):
    if arg:
        return shlex.split(arg)
    if os.environ.get("CKPTD_AGENT_CMD"):
        return shlex.split(os.environ["CKPTD_AGENT_CMD"])
    if os.environ.get("CKPTD_AGENT"):
        return [os.environ["CKPTD_AGENT"]]
    if BUNDLE:
        lib = os.path.join(HERE, "lib")
        return [LOADER, "--library-path", lib + ":" + PYLIB, os.path.join(HERE, "bin", "ckptd-agent")]
    return [os.path.join(BUILD, "bin", "ckptd-agent")]


class Agent:
    """ckptd-agent on a temporary socket and storage root."""

    def __init__(self, command):
        self.command = command
        self.dir = tempfile.mkdtemp(prefix="ckptd-gpu-py-")
        self.socket = os.path.join(self.dir, "agent.sock")
        self.root = os.path.join(self.dir, "root")
        os.mkdir(self.root)
        self.log = os.path.join(self.dir, "agent.log")
        self.proc = None

    def start(self, timeout=30.0):
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.command + ["--storage-root", self.root, "--socket", self.socket,
                                                         "--slots", "2", "--keep", "3", "--threads", "2"],
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ckptd-agent exited with {self.proc.returncode}: {self.tail()}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(self.socket)
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"ckptd-agent did not serve {self.socket} within {timeout:.0f}s: {self.tail()}")

    def tail(self, lines=15):
        try:
            with open(self.log, "rb") as f:
                text = f.read().decode("utf-8", "replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) if text else "(empty log)"

    def committed_steps(self, job):
        d = os.path.join(self.root, job)
        if not os.path.isdir(d):
            return []
        return sorted(int(n[5:]) for n in os.listdir(d)
                      if n.startswith("step-") and os.path.exists(os.path.join(d, n, "MANIFEST")))

    def cleanup(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# --- memory: CUDA through libcudart, or the host ---------------------------------

class Skip(Exception):
    """The part cannot run here (no libcudart, no device, no torch)."""


class Failure(Exception):
    """The part ran and found something wrong."""


def cudart_candidates():
    env = os.environ.get("CKPTD_CUDART")
    if env:
        return [env]  # asked for explicitly: nothing else
    found = []
    name = ctypes.util.find_library("cudart")
    if name:
        found.append(name)
    tops = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    tops += sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for top in filter(None, tops):
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
            found += sorted(glob.glob(os.path.join(top, sub, "libcudart.so*")), reverse=True)
    found += sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libcudart.so*"), reverse=True)
    for entry in sys.path:  # pip's nvidia-cuda-runtime wheels (torch's dependency)
        if entry and os.path.isdir(entry):
            found += sorted(glob.glob(os.path.join(entry, "nvidia", "cuda_runtime", "lib", "libcudart.so*")),
                            reverse=True)
    found += sorted(glob.glob(os.path.join(HERE, "cudart", "libcudart.so*")), reverse=True)  # the bundle's
    unique = []
    for path in found:
        if path not in unique:
            unique.append(path)
    return unique


class Cudart:
    H2D, D2H = 1, 2

    def __init__(self):
        tried = []
        self.lib = self.path = None
        for path in cudart_candidates():
            try:
                lib = ctypes.CDLL(path)
                lib.cudaGetDeviceCount  # noqa: B018 (raises AttributeError when it is not libcudart)
            except (OSError, AttributeError) as e:
                tried.append(f"{path}: {e}")
                continue
            self.lib, self.path = lib, path
            break
        if self.lib is None:
            raise Skip("libcudart not found: " + ("; ".join(tried) if tried else "no candidate") +
                       " (set CKPTD_CUDART to its path)")
        L, P = self.lib, ctypes.POINTER
        for fn, args in [("cudaGetDeviceCount", [P(ctypes.c_int)]), ("cudaSetDevice", [ctypes.c_int]),
                         ("cudaMalloc", [P(ctypes.c_void_p), ctypes.c_size_t]), ("cudaFree", [ctypes.c_void_p]),
                         ("cudaMemcpy", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]),
                         ("cudaMemset", [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]),
                         ("cudaDeviceSynchronize", []), ("cudaRuntimeGetVersion", [P(ctypes.c_int)]),
                         ("cudaDriverGetVersion", [P(ctypes.c_int)])]:
            getattr(L, fn).restype, getattr(L, fn).argtypes = ctypes.c_int, args
        L.cudaGetErrorString.restype, L.cudaGetErrorString.argtypes = ctypes.c_char_p, [ctypes.c_int]
        runtime, driver = ctypes.c_int(0), ctypes.c_int(0)
        L.cudaRuntimeGetVersion(ctypes.byref(runtime))
        L.cudaDriverGetVersion(ctypes.byref(driver))
        self.versions = f"runtime {runtime.value}, driver {driver.value}"
        count = ctypes.c_int(0)
        rc = L.cudaGetDeviceCount(ctypes.byref(count))
        if rc != 0 or count.value == 0:
            why = f"cudaGetDeviceCount: {self.error(rc)}" if rc != 0 else "cudaGetDeviceCount: 0 devices"
            if driver.value == 0:
                why = "no CUDA driver; " + why
            raise Skip(f"no CUDA device ({why}; {self.path}, {self.versions})")
        self.devices = count.value
        self.check(L.cudaSetDevice(0), "cudaSetDevice(0)")

    def error(self, rc):
        s = self.lib.cudaGetErrorString(rc)
        return f"{s.decode() if s else 'error'} ({rc})"

    def check(self, rc, what):
        if rc != 0:
            raise Failure(f"{what}: {self.error(rc)}")


class DeviceMemory:
    device_kind = 1  # ckptd.DEVICE_CUDA
    where = "cuda:0"

    def __init__(self, cudart, nbytes):
        self.cudart, self.nbytes, self.ptr = cudart, nbytes, ctypes.c_void_p()
        cudart.check(cudart.lib.cudaMalloc(ctypes.byref(self.ptr), nbytes), f"cudaMalloc({nbytes})")
        self.address = self.ptr.value

    def write(self, data):
        host = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
        self.cudart.check(self.cudart.lib.cudaMemcpy(self.address, host, len(data), Cudart.H2D),
                          "cudaMemcpy host->device")
        self.cudart.check(self.cudart.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def fill(self, byte):
        self.cudart.check(self.cudart.lib.cudaMemset(self.address, byte, self.nbytes), "cudaMemset")
        self.cudart.check(self.cudart.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def read(self):
        host = (ctypes.c_ubyte * self.nbytes)()
        self.cudart.check(self.cudart.lib.cudaMemcpy(host, self.address, self.nbytes, Cudart.D2H),
                          "cudaMemcpy device->host")
        return bytes(host)

    def free(self):
        if self.address:
            self.cudart.lib.cudaFree(self.address)
            self.address = None


class HostMemory:
    device_kind = 0  # ckptd.DEVICE_HOST
    where = "host"

    def __init__(self, _cudart, nbytes):
        self.nbytes = nbytes
        self.array = (ctypes.c_ubyte * nbytes)()
        self.address = ctypes.addressof(self.array)

    def write(self, data):
        ctypes.memmove(self.array, data, len(data))

    def fill(self, byte):
        ctypes.memset(self.array, byte, self.nbytes)

    def read(self):
        return bytes(self.array)

    def free(self):
        pass


def pattern(nbytes, seed):
    rng = random.Random(seed)
    if hasattr(rng, "randbytes"):
        return rng.randbytes(nbytes)
    return bytes(rng.getrandbits(8) for _ in range(nbytes))


def first_difference(got, want):
    n = sum(1 for a, b in zip(got, want) if a != b) if len(got) == len(want) else None
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return f"{n} bytes differ, the first at offset {i}: {a:#04x}, expected {b:#04x}"
    return f"length {len(got)}, expected {len(want)}"


# --- part 1: ckptd.Client on raw memory --------------------------------------------

def round_trip(ckptd, agent, memory, cudart, nbytes, job, spare):
    """Snapshot a device (or host) buffer and a host buffer, persist, clobber,
    restore in a new client into fresh memory; compare bit for bit."""
    assert nbytes % 4 == 0
    shape = (nbytes // 4,)
    want = pattern(nbytes, 20240601)
    cursor_want = pattern(4096 + 5, 7)
    first = memory(cudart, nbytes)
    second = memory(cudart, nbytes)
    try:
        first.write(want)
        if first.read() != want:
            raise Failure(f"the pattern did not arrive in {first.where} memory")
        cursor = bytearray(cursor_want)
        buffers = [ckptd.Buffer.at("weights", first.address, ckptd.FLOAT32, shape, device_kind=memory.device_kind,
                                   device_index=0, owner=first),
                   ckptd.Buffer("cursor", cursor, component=ckptd.DATA_CURSOR)]
        with ckptd.Client(agent.socket, job, buffers, spare_device_buffer=spare, rpc_timeout=10.0) as client:
            found = client.restore()
            if found is not None:
                raise Failure(f"a fresh job restored step {found}")
            client.snapshot(7)
            client.wait_persisted(7, timeout=60)
        if agent.committed_steps(job) != [7]:
            raise Failure(f"committed steps {agent.committed_steps(job)}, expected [7]")
        first.fill(0xA5)  # the memory the snapshot came from, clobbered
        cursor[:] = bytes(len(cursor))
        second.fill(0x5A)
        cursor2 = bytearray(len(cursor_want))
        buffers = [ckptd.Buffer.at("weights", second.address, ckptd.FLOAT32, shape,
                                   device_kind=memory.device_kind, device_index=0, owner=second),
                   ckptd.Buffer("cursor", cursor2, component=ckptd.DATA_CURSOR)]
        with ckptd.Client(agent.socket, job, buffers, spare_device_buffer=spare, rpc_timeout=10.0) as client:
            step = client.restore()
        if step != 7:
            raise Failure(f"restore returned {step}, expected 7")
        got = second.read()
        if got != want:
            raise Failure(f"{memory.where} buffer after restore: {first_difference(got, want)}")
        if bytes(cursor2) != cursor_want:
            raise Failure(f"host buffer after restore: {first_difference(bytes(cursor2), cursor_want)}")
    finally:
        first.free()
        second.free()


def ctypes_part(ckptd, agent, host_only, nbytes):
    if host_only:
        memory, cudart, where = HostMemory, None, "host memory"
    else:
        cudart = Cudart()  # raises Skip
        memory, where = DeviceMemory, "cuda:0"
    modes = [("straight", False), ("two hops via a spare", True)]  # (a spare is for device buffers only)
    for label, spare in modes:
        try:
            round_trip(ckptd, agent, memory, cudart, nbytes, f"py-ctypes-{'spare' if spare else 'direct'}", spare)
        except ckptd.Error as e:
            raise Failure(f"{label}: {type(e).__name__}: {e}") from e
        except Failure as e:
            raise Failure(f"{label}: {e}") from e
    detail = f"{nbytes / MIB:.2f} MiB on {where} + 4 KiB host buffer, bit-exact after restore in a new client"
    detail += ", " + " and ".join(m for m, _ in modes)
    if cudart is not None:
        detail += f"; {cudart.path}, {cudart.versions}, {cudart.devices} device(s)"
    return detail


# --- part 2: ckptd.torch.Checkpointer ------------------------------------------------

def torch_part(agent, host_only):
    # Deterministic cuBLAS, so that the steps after a restore can be compared
    # with the first run's bit for bit (must be set before CUDA starts).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        import torch
    except Exception as e:  # not installed, or it cannot load here
        raise Skip(f"torch cannot be imported: {type(e).__name__}: {e}")
    if host_only:
        dev = torch.device("cpu")
    else:
        if getattr(torch.version, "cuda", None) is None:
            raise Skip(f"torch {torch.__version__} is built without CUDA")
        if not torch.cuda.is_available():
            raise Skip(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device")
        dev = torch.device("cuda", 0)
    import ckptd
    import ckptd.torch

    def bits(t):
        t = t.detach().cpu().contiguous().reshape(-1)
        try:
            return t.view(torch.uint8)
        except (RuntimeError, TypeError):
            return t

    def same(a, b):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))

    def differences(a, b, path="", out=None):
        out = [] if out is None else out
        if isinstance(a, torch.Tensor):
            if not (isinstance(b, torch.Tensor) and same(a, b)):
                out.append(path or "/")
        elif isinstance(a, dict):
            if not isinstance(b, dict) or set(a) != set(b):
                out.append(f"{path}: keys")
            else:
                for k in a:
                    differences(a[k], b[k], f"{path}/{k}", out)
        elif isinstance(a, (list, tuple)):
            if not isinstance(b, (list, tuple)) or len(a) != len(b):
                out.append(f"{path}: length")
            else:
                for i, (x, y) in enumerate(zip(a, b)):
                    differences(x, y, f"{path}/{i}", out)
        elif a != b:
            out.append(path)
        return out

    def clone(tree):
        if isinstance(tree, torch.Tensor):
            return tree.detach().clone()
        if isinstance(tree, dict):
            return {k: clone(v) for k, v in tree.items()}
        if isinstance(tree, (list, tuple)):
            return type(tree)(clone(v) for v in tree)
        return tree

    def rng_states():
        states = {"cpu": torch.get_rng_state()}
        if dev.type == "cuda":
            states["cuda"] = torch.cuda.get_rng_state(dev.index)
        return states

    def make(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                    torch.nn.Linear(64, 8)).to(dev)
        return model, torch.optim.Adam(model.parameters(), lr=1e-2)

    def train(model, opt, steps):
        losses = []
        for _ in range(steps):
            x = torch.randn(16, 32, device=dev)  # draws on the device's generator, like dropout
            y = torch.randn(16, 8, device=dev)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item().hex())
        return losses

    def state(model, opt):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return {"model": clone(model.state_dict()), "optimizer": clone(opt.state_dict()), "rng": clone(rng_states())}

    job = f"py-torch-{dev.type}"
    model, opt = make(0)
    with ckptd.torch.Checkpointer(job, agent.socket, every=0, on_error="raise", rpc_timeout=10.0) as ckpt:
        ckpt.track("model", model)
        ckpt.track("optimizer", opt)
        if ckpt.restore() != 0:
            raise Failure("a fresh job restored a step")
        train(model, opt, 5)
        ckpt.snapshot(5)
        ckpt.wait_persisted(5, timeout=60)
        layout = getattr(ckpt, "_layout", None)
        client = getattr(layout, "client", None)
        on_device = sum(1 for b in (client.buffers if client else []) if b.device_kind == ckptd.DEVICE_CUDA)
        saved = state(model, opt)
        reference_losses = train(model, opt, 3)  # changes parameters, moments, step and RNG
        reference_end = state(model, opt)
    if not differences(saved["model"], reference_end["model"]) or \
            not differences(saved["rng"], reference_end["rng"]):
        raise Failure("training on after the snapshot changed nothing: the check would prove nothing")
    if dev.type == "cuda" and on_device == 0:
        raise Failure("no buffer was registered as CUDA memory")

    model2, opt2 = make(1)  # other initial values, and the RNGs elsewhere
    with ckptd.torch.Checkpointer(job, agent.socket, every=0, on_error="raise", rpc_timeout=10.0) as ckpt:
        ckpt.track("model", model2)
        ckpt.track("optimizer", opt2)
        step = ckpt.restore()
        if step != 5:
            raise Failure(f"restore returned {step}, expected 5")
        bad = differences(saved, state(model2, opt2))
        if bad:
            raise Failure(f"after restore, {len(bad)} entries differ from the copy: {', '.join(bad[:8])}")
        losses = train(model2, opt2, 3)
        if losses != reference_losses:
            raise Failure(f"the 3 steps after restore lost {losses}, the first run {reference_losses}")
        bad = differences(reference_end, state(model2, opt2))
        if bad:
            raise Failure(f"3 steps after restore, {len(bad)} entries differ from the first run: {', '.join(bad[:8])}")
    n = len(saved["model"]) + sum(len(s) for s in saved["optimizer"]["state"].values())
    where = f"{on_device} buffers on {dev}" if dev.type == "cuda" else "on the CPU"
    return (f"torch {torch.__version__}, Adam + dropout, {n} tensors ({where}) and the "
            f"{'CPU and CUDA' if dev.type == 'cuda' else 'CPU'} RNG bit-exact after restore; 3 more steps equal")


# --- main ----------------------------------------------------------------------------

def rerun_for_bundle():
    """In a bundle, libckptd.so's libraries are in pylib/: the dynamic loader
    reads LD_LIBRARY_PATH when the process starts, so set it and start again."""
    if not BUNDLE:
        return
    paths = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    if PYLIB in paths or os.environ.get("CKPTD_CHECK_RERUN"):
        return
    env = dict(os.environ, LD_LIBRARY_PATH=":".join([PYLIB] + paths), CKPTD_CHECK_RERUN="1")
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def rerun_through_loader(reason):
    """This python's glibc (or libstdc++) is older than the bundle's libraries
    need: run python itself through the bundle's loader, glibc and GCC runtime
    (lib/), best effort. CKPTD_CHECK_LOADER=1 forces it."""
    if not BUNDLE or os.environ.get("CKPTD_CHECK_IN_LOADER") or not os.path.exists(LOADER):
        return
    log(f"python: {reason}; running {sys.executable} through the bundle's loader")
    env = dict(os.environ, CKPTD_CHECK_IN_LOADER="1")
    os.execve(LOADER, [LOADER, "--library-path", PYLIB + ":" + os.path.join(HERE, "lib"), sys.executable] + sys.argv,
              env)


def report(label, run, agent):
    """Runs one part and prints its line; returns "pass", "skip" or "fail"."""
    try:
        log(f"{label}: PASS ({run()})")
        return "pass"
    except Skip as e:
        log(f"{label}: skipped ({e})")
        return "skip"
    except Failure as e:
        log(f"{label}: FAIL ({e}); agent log: {agent.tail(5)}")
    except Exception as e:  # an unexpected error: its traceback helps
        log(f"{label}: FAIL ({type(e).__name__}: {e}); agent log: {agent.tail(5)}")
        for line in traceback.format_exc().rstrip().splitlines():
            log(f"  {line}")
    return "fail"


def torch_in_child(agent, host_only, label):
    """The torch part in a process of its own: torch loads its own libcudart
    (which a libcudart of another version loaded here first could stand in
    for: same soname), and a crash in it cannot take the ctypes result along."""
    command = [sys.executable, os.path.abspath(__file__), "--torch-child", agent.socket, agent.log]
    if host_only:
        command.append("--host-only")
    if os.environ.get("CKPTD_CHECK_IN_LOADER") and BUNDLE:
        command = [LOADER, "--library-path", PYLIB + ":" + os.path.join(HERE, "lib")] + command
    try:
        p = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           timeout=300)
    except subprocess.TimeoutExpired:
        log(f"{label}: FAIL (timed out after 300s); agent log: {agent.tail(5)}")
        return "fail"
    out = p.stdout.decode("utf-8", "replace").rstrip()
    if out:
        print(out, flush=True)
    verdicts = [line for line in out.splitlines() if line.startswith(label + ": ")]
    if not verdicts:
        tail = " | ".join(out.splitlines()[-5:])
        log(f"{label}: FAIL (its process exited with {p.returncode} before a verdict: {tail or 'no output'})")
        return "fail"
    verdict = verdicts[-1][len(label) + 2:]
    if verdict.startswith("PASS") and p.returncode == 0:
        return "pass"
    return "skip" if verdict.startswith("skipped") and p.returncode == 0 else "fail"


class _Socket:
    """The agent as the torch part's process sees it: its socket and log."""

    def __init__(self, socket_path, log_path):
        self.socket, self.log = socket_path, log_path

    tail = Agent.tail


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host-only", action="store_true")
    parser.add_argument("--require-cuda", action="store_true")
    parser.add_argument("--agent")
    parser.add_argument("--bytes", type=int, default=16 * MIB + 12)
    parser.add_argument("--torch-child", nargs=2, metavar=("SOCKET", "LOG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bytes <= 0 or args.bytes % 4:
        parser.error("--bytes must be a positive multiple of 4")
    # timeout(1) and the like: stop the agent on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    rerun_for_bundle()
    if os.environ.get("CKPTD_CHECK_LOADER") == "1":
        rerun_through_loader("CKPTD_CHECK_LOADER=1")
    kind = "host" if args.host_only else "cuda"
    if BUNDLE and not os.environ.get("CKPTD_LIBRARY"):
        os.environ["CKPTD_LIBRARY"] = os.path.join(PYLIB, "libckptd.so")
    elif not BUNDLE and not os.environ.get("CKPTD_LIBRARY") and os.path.exists(os.path.join(BUILD, "lib")):
        os.environ["CKPTD_LIBRARY"] = os.path.join(BUILD, "lib", "libckptd.so")
    sys.path.insert(0, PYTHON_DIR)
    try:
        import ckptd
    except ImportError as e:
        if "GLIBC" in str(e) or "CXXABI" in str(e):
            rerun_through_loader(f"import ckptd: {e}")
        log(f"python {kind}{' (torch)' if args.torch_child else ''}: FAIL (import ckptd from {PYTHON_DIR}: {e})")
        return 1
    if args.torch_child:
        agent = _Socket(*args.torch_child)
        return 0 if report(f"python {kind} (torch)", lambda: torch_part(agent, args.host_only), agent) != "fail" \
            else 1
    command = agent_command(args.agent)
    log(f"python: {sys.executable} {sys.version.split()[0]}; libckptd {ckptd.library_path()}; "
        f"agent {' '.join(shlex.quote(c) for c in command)}")
    agent = Agent(command)
    try:
        try:
            agent.start()
        except (OSError, RuntimeError) as e:
            log(f"python {kind}: FAIL (agent: {e})")
            return 1
        ctypes_result = report(f"python {kind} (ctypes)",
                               lambda: ctypes_part(ckptd, agent, args.host_only, args.bytes), agent)
        torch_result = torch_in_child(agent, args.host_only, f"python {kind} (torch)")
    finally:
        agent.cleanup()
    if ctypes_result == "skip" and args.require_cuda:
        log(f"python {kind}: FAIL (--require-cuda, and the ctypes part was skipped)")
        return 1
    return 1 if "fail" in (ctypes_result, torch_result) else 0


if __name__ == "__main__":
    sys.exit(main())
