"""ckptd.torch beside PyTorch's own checkpointing, on the same model and Adam
state, each method in fresh processes: the stall (how long training waits),
when the checkpoint is durable, and the restart (from constructing the model
in a new process to a restored model and optimizer), with the part of it the
model's constructor took (the same for every method) and the rest.

    scripts/torch-compare.sh [--params-m 128] [--dir DIR]

runs it in a virtual environment with torch 2.x from PyPI (DCP's async_save
needs it; Debian's torch 1.13 has none). Methods:

  torch.save + fsync / torch.load
  DCP async_save (thread) / dcp.load
  DCP async_save (process) / dcp.load      when this torch has it
  ckptd.torch, trainer SIGKILLed after the save; restarted on the same node
      (the agent's memory), then after a node loss (a new agent: the disks)

The page cache is dropped before every restore when running as root
(/proc/sys/vm/drop_caches); otherwise the files are evicted with
posix_fadvise, which leaves the directory metadata cached. It is a benchmark,
not a test: it prints a table (and --json a JSON line), and fails only when a
method fails.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def build(params_m, seed=0):
    """The model (an MLP of square layers, fp32) and Adam with its state."""
    import torch
    torch.manual_seed(seed)
    width = 4096
    layers = max(1, round(params_m * 1e6 / (width * width + width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt


def warm_up():
    """torch imports much lazily, at the first optimizer, the first step, the
    first distributed checkpoint: paid here, before any timing, by every
    method alike (a trainer has paid it before its first checkpoint)."""
    import torch
    model, opt = torch.nn.Linear(4, 4), torch.optim.Adam([torch.nn.Parameter(torch.zeros(4))])
    train_step(torch.nn.Sequential(model), torch.optim.Adam(model.parameters()))
    del opt


def train_step(model, opt):
    import torch
    opt.zero_grad()
    model(torch.ones(2, model[0].in_features)).sum().backward()
    opt.step()


def state_bytes(model, opt):
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    for s in opt.state.values():
        n += sum(v.numel() * v.element_size() for v in s.values() if hasattr(v, "numel"))
    return n


def fsync_tree(path):
    for d, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        fd = os.open(d, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def drop_caches(path):
    """Whether the whole page cache was dropped (root), else the files under
    `path` are evicted one by one."""
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        for d, _, files in os.walk(path):
            for name in files:
                fd = os.open(os.path.join(d, name), os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
        return False


def init_process_group():
    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


# --- one role per process ----------------------------------------------------

def role_save_torch(a):
    import torch
    model, opt = build(a.params_m)
    train_step(model, opt)
    path = os.path.join(a.dir, "torch.pt")
    t0 = time.perf_counter()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    fsync_tree(a.dir)
    t = time.perf_counter() - t0
    return {"stall_s": t, "durable_s": t, "bytes": state_bytes(model, opt)}


def role_load_torch(a):
    import torch
    t0 = time.perf_counter()
    model, opt = build(a.params_m, seed=1)
    built = time.perf_counter() - t0
    state = torch.load(os.path.join(a.dir, "torch.pt"))
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    return {"restart_s": time.perf_counter() - t0, "constructor_s": built}


def dcp_state(model, opt):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optimizer": osd}


def role_save_dcp(a):
    import torch.distributed.checkpoint as dcp
    init_process_group()
    model, opt = build(a.params_m)
    train_step(model, opt)
    state = dcp_state(model, opt)
    kwargs = {}
    if a.mode == "process":
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
        kwargs["async_checkpointer_type"] = AsyncCheckpointerType.PROCESS
    path = os.path.join(a.dir, f"dcp-{a.mode}")
    t0 = time.perf_counter()
    future = dcp.async_save(state, checkpoint_id=path, **kwargs)
    stall = time.perf_counter() - t0
    future.result()
    fsync_tree(path)
    return {"stall_s": stall, "durable_s": time.perf_counter() - t0, "bytes": state_bytes(model, opt)}


def role_load_dcp(a):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    init_process_group()
    t0 = time.perf_counter()
    model, opt = build(a.params_m, seed=1)
    built = time.perf_counter() - t0
    state = dcp_state(model, opt)
    dcp.load(state, checkpoint_id=os.path.join(a.dir, f"dcp-{a.mode}"))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return {"restart_s": time.perf_counter() - t0, "constructor_s": built}


def checkpointer(a, model, opt):
    import ckptd.torch
    # A slot wait: the first snapshot right after registering waits for the
    # agent to allocate the staging of a large state (in the background).
    ckpt = ckptd.torch.Checkpointer("compare", a.socket, every=0, rng=False, rpc_timeout=60.0, slot_wait=120.0,
                                    on_error="raise")
    ckpt.track("model", model)
    ckpt.track("optimizer", opt)
    return ckpt


def role_save_ckptd(a):
    model, opt = build(a.params_m)
    train_step(model, opt)
    ckpt = checkpointer(a, model, opt)
    ckpt.restore()  # registers (nothing committed yet: a fresh start)
    # The first snapshot waits for the staging to be allocated; the second
    # is measured, as training would see every later one.
    ckpt.snapshot(1)
    ckpt.wait_persisted(1, timeout=600)
    t0 = time.perf_counter()
    ckpt.snapshot(2)
    stall = time.perf_counter() - t0
    ckpt.wait_persisted(2, timeout=600)
    durable = time.perf_counter() - t0
    print(json.dumps({"stall_s": stall, "durable_s": durable, "bytes": state_bytes(model, opt)}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the trainer crashes: no goodbye


def role_load_ckptd(a):
    t0 = time.perf_counter()
    model, opt = build(a.params_m, seed=1)
    built = time.perf_counter() - t0
    ckpt = checkpointer(a, model, opt)
    step = ckpt.restore()
    t = time.perf_counter() - t0
    if step != 2:
        raise SystemExit(f"ckptd restored step {step}, not 2")
    return {"restart_s": t, "constructor_s": built, "source": ckpt._layout.client.restore_source()}


ROLES = {"save-torch": role_save_torch, "load-torch": role_load_torch, "save-dcp": role_save_dcp,
         "load-dcp": role_load_dcp, "save-ckptd": role_save_ckptd, "load-ckptd": role_load_ckptd}


# --- the driver --------------------------------------------------------------

def run_role(a, role, **extra):
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--dir", a.dir, "--params-m", str(a.params_m)]
    for k, v in extra.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=3600)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise RuntimeError(f"{role} failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(lines[-1])


class Agent:
    def __init__(self, binary, d):
        self.binary, self.dir = binary, d
        self.socket = os.path.join(d, "agent.sock")
        self.root = os.path.join(d, "root")
        os.makedirs(self.root, exist_ok=True)
        self.proc = None

    def start(self):
        log = open(os.path.join(self.dir, "agent.log"), "ab")
        self.proc = subprocess.Popen([self.binary, "--storage-root", self.root, "--socket", self.socket], stdout=log,
                                     stderr=log)
        for _ in range(400):
            if os.path.exists(self.socket):
                return
            time.sleep(0.05)
        raise RuntimeError("ckptd-agent did not start")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if os.path.exists(self.socket):
            os.unlink(self.socket)


def has_process_mode():
    try:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType  # noqa: F401
        return hasattr(AsyncCheckpointerType, "PROCESS")
    except ImportError:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params-m", type=float, default=128, help="model parameters in millions (default 128)")
    ap.add_argument("--dir", help="where to write (default: a new folder under /tmp, removed afterwards)")
    ap.add_argument("--agent", default=os.environ.get("CKPTD_AGENT", os.path.join(ROOT, "build", "bin",
                                                                                    "ckptd-agent")))
    ap.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    ap.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="thread", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role:
        warm_up()
        if "ckptd" in a.role:
            import ckptd.torch  # noqa: F401
        if "dcp" in a.role:
            import torch.distributed.checkpoint  # noqa: F401
            import torch.distributed.checkpoint.state_dict  # noqa: F401
        out = ROLES[a.role](a)
        print(json.dumps(out), flush=True)
        return 0

    import torch
    own = a.dir is None
    a.dir = a.dir or tempfile.mkdtemp(prefix="ckptd-compare-")
    rows, results = [], {}
    try:
        def method(name, save_role, load_role, **extra):
            d = os.path.join(a.dir, name.split()[0].lower())
            os.makedirs(d, exist_ok=True)
            a2 = argparse.Namespace(**{**vars(a), "dir": d})
            saved = run_role(a2, save_role, **extra)
            cached = drop_caches(d)
            loaded = run_role(a2, load_role, **extra)
            results[name] = {**saved, **loaded, "page_cache_dropped": cached}
            rows.append((name, saved["stall_s"], saved["durable_s"], loaded["restart_s"], loaded["constructor_s"],
                         loaded.get("source", "")))
            shutil.rmtree(d, ignore_errors=True)

        method("torch.save + fsync / torch.load", "save-torch", "load-torch")
        method("DCP async_save (thread) / dcp.load", "save-dcp", "load-dcp", mode="thread")
        if has_process_mode():
            method("DCP async_save (process) / dcp.load", "save-dcp", "load-dcp", mode="process")
        # ckptd: the trainer is SIGKILLed after its checkpoint is durable; a
        # new trainer restores on the same node (memory), then after the
        # node's agent is lost too (a new agent: the storage root).
        d = os.path.join(a.dir, "ckptd")
        os.makedirs(d, exist_ok=True)
        agent = Agent(a.agent, d)
        agent.start()
        try:
            a2 = argparse.Namespace(**{**vars(a), "dir": d})
            saved = run_role(a2, "save-ckptd", socket=agent.socket)
            drop_caches(d)
            same_node = run_role(a2, "load-ckptd", socket=agent.socket)
            agent.kill()
            agent.start()
            cached = drop_caches(d)
            node_lost = run_role(a2, "load-ckptd", socket=agent.socket)
        finally:
            agent.kill()
        results["ckptd.torch"] = {**saved, "restart_s": same_node["restart_s"], "source": same_node["source"],
                                  "constructor_s": same_node["constructor_s"],
                                  "restart_after_node_loss_s": node_lost["restart_s"],
                                  "constructor_after_node_loss_s": node_lost["constructor_s"],
                                  "source_after_node_loss": node_lost["source"], "page_cache_dropped": cached}
        rows.append(("ckptd.torch (trainer SIGKILLed, same node)", saved["stall_s"], saved["durable_s"],
                     same_node["restart_s"], same_node["constructor_s"], same_node["source"]))
        rows.append(("ckptd.torch (after a node loss: new agent)", saved["stall_s"], saved["durable_s"],
                     node_lost["restart_s"], node_lost["constructor_s"], node_lost["source"]))
    finally:
        if own:
            shutil.rmtree(a.dir, ignore_errors=True)

    gb = results["torch.save + fsync / torch.load"]["bytes"] / 1e9
    print(f"torch {torch.__version__}, {a.params_m:g}M parameters fp32 with Adam: {gb:.2f} GB of state; "
          f"page cache dropped before restores: {'yes' if results['ckptd.torch']['page_cache_dropped'] else 'files evicted'}")
    # The restart includes the model's constructor (the same code for every
    # method); the last column is the restart without it.
    print(f"{'method':<46} {'stall s':>8} {'durable s':>10} {'restart s':>10} {'of it ctor':>10} {'load s':>7}  source")
    for name, stall, durable, restart, ctor, source in rows:
        print(f"{name:<46} {stall:>8.3f} {durable:>10.3f} {restart:>10.3f} {ctor:>10.3f} {restart - ctor:>7.3f}  {source}")
    torch_load = results["torch.save + fsync / torch.load"]
    base = torch_load["restart_s"]
    ck = results["ckptd.torch"]
    print(f"ckptd restart on the same node: {ck['restart_s'] / base:.2f}x torch.load's (target <= 0.5x); without "
          f"the constructor {(ck['restart_s'] - ck['constructor_s']) / (base - torch_load['constructor_s']):.2f}x")
    dcp = results["DCP async_save (thread) / dcp.load"]
    print(f"ckptd restart after a node loss: {ck['restart_after_node_loss_s'] / dcp['restart_s']:.2f}x dcp.load's "
          f"(target <= 1x); without the constructor "
          f"{(ck['restart_after_node_loss_s'] - ck['constructor_after_node_loss_s']) / (dcp['restart_s'] - dcp['constructor_s']):.2f}x")
    if a.json:
        print(json.dumps({"torch": torch.__version__, "params_m": a.params_m, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
