"""Bytes a data-parallel job writes per checkpoint, with its replicated state
declared (ckptd.torch Checkpointer(replicated=True): written once for the
job, each rank a share) and without (every rank writes all it holds), on
the same model and Adam state: W ranks in W fresh processes against one
ckptd-agent, each holding the same weights and optimizer state.

    PYTHONPATH=python CKPTD_LIBRARY=build/lib/libckptd.so \\
        python3 bench/replicated_bytes.py [--ranks 4] [--params-m 16] [--json]

For each way it reports the bytes of the step's shards on disk, the bytes
each rank wrote (raw, before compression, from the shards' indexes through
`ckptctl inspect --json`), the time from the snapshots to the last rank's
durable shard, and then restores the step in W fresh processes through a
new agent (the disk) and checks every rank's state equals the saved one.
A benchmark, not a test: it fails only when a run fails or a restore
differs.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from torch_compare import ROOT, Agent  # noqa: E402 (this folder is the script's: on sys.path)


def build(params_m, seed=0):
    """The same MLP and Adam state on every rank (fp32), after one step."""
    import torch
    torch.manual_seed(seed)
    width = 1024
    layers = max(1, round(params_m * 1e6 / (width * width + width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt.zero_grad()
    model(torch.ones(2, width)).sum().backward()
    opt.step()
    return model, opt


def digest(model, opt):
    import torch
    h = hashlib.sha256()
    for t in list(model.state_dict().values()):
        h.update(t.detach().contiguous().numpy().tobytes())
    for s in opt.state.values():
        for v in s.values():
            if isinstance(v, torch.Tensor):
                h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def role(a):
    import ckptd.torch as ckt
    model, opt = build(a.params_m)
    if a.role == "restore":  # other values, so that the restore must bring them back
        for p in model.parameters():
            p.data.zero_()
        for s in opt.state.values():
            for v in s.values():
                if hasattr(v, "zero_"):
                    v.zero_()
    c = ckt.Checkpointer(a.job, a.socket, rank=a.rank, world_size=a.ranks, every=0, slot_wait=120,
                         replicated=a.replicated == "once", connect_wait=30, rpc_timeout=60, on_error="raise")
    c.track("model", model)
    c.track("optimizer", opt)
    out = {"rank": a.rank}
    if a.role == "save":
        c.restore()
        t0 = time.monotonic()
        c.snapshot(1)
        c.wait_persisted(1, timeout=600)
        out["durable_s"] = time.monotonic() - t0
    else:
        out["step"] = c.restore()
    out["digest"] = digest(model, opt)
    c.close()
    print(json.dumps(out), flush=True)


def with_agent(a, d, fn):
    """fn(agent) with a ckptd-agent over d/root running."""
    agent = Agent(a.agent, d)
    agent.start()
    try:
        return fn(agent)
    finally:
        agent.kill()


def run_ranks(a, agent, job, which, replicated):
    procs = [subprocess.Popen([sys.executable, __file__, "--role", which, "--job", job, "--socket", agent.socket,
                               "--rank", str(r), "--ranks", str(a.ranks), "--params-m", str(a.params_m),
                               "--replicated", replicated], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(a.ranks)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"rank failed ({p.returncode}): {err[-2000:]}")
        results.append(json.loads([l for l in out.splitlines() if l.startswith("{")][-1]))
    return results


def shard_figures(ckptctl, folder):
    on_disk, raw = 0, []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".shard"):
            continue
        path = os.path.join(folder, name)
        on_disk += os.path.getsize(path)
        p = subprocess.run([ckptctl, "inspect", path, "--json"], stdout=subprocess.PIPE, text=True, check=True)
        raw.append(json.loads(p.stdout)["raw_bytes"])
    return on_disk, raw


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4, help="data-parallel ranks (default 4)")
    ap.add_argument("--params-m", type=float, default=16, help="parameters in millions (default 16)")
    ap.add_argument("--agent", default=os.environ.get("CKPTD_AGENT", os.path.join(ROOT, "build", "bin",
                                                                                    "ckptd-agent")))
    ap.add_argument("--ckptctl", default=os.path.join(ROOT, "build", "bin", "ckptctl"))
    ap.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    ap.add_argument("--role", choices=["save", "restore"], help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--replicated", default="once", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role:
        role(a)
        return 0
    d = tempfile.mkdtemp(prefix="ckptd-replicated-")
    root = os.path.join(d, "root")
    results = {}
    try:
        for way in ("every", "once"):
            job = f"dp-{way}"
            saved = with_agent(a, d, lambda agent: run_ranks(a, agent, job, "save", way))
            on_disk, raw = shard_figures(a.ckptctl, os.path.join(root, job, "step-1"))
            # A new agent: nothing in memory, the disk.
            restored = with_agent(a, d, lambda agent: run_ranks(a, agent, job, "restore", way))
            want = saved[0]["digest"]
            if any(s["digest"] != want for s in saved) or any(
                    r["digest"] != want or r["step"] != 1 for r in restored):
                raise RuntimeError(f"{way}: a rank's state differs from the saved one")
            results[way] = {"shard_bytes_on_disk": on_disk, "raw_bytes_per_rank": raw,
                            "raw_bytes": sum(raw), "durable_s": max(s["durable_s"] for s in saved)}
    finally:
        shutil.rmtree(d, ignore_errors=True)
    every, once = results["every"], results["once"]
    print(f"data-parallel job of {a.ranks} ranks, {a.params_m:g}M fp32 parameters with Adam "
          f"({every['raw_bytes_per_rank'][0] / 1e6:.1f} MB of state per rank), one checkpoint")
    print(f"{'replicated state':<28} {'raw bytes':>12} {'per rank':>12} {'on disk':>12} {'durable':>9}")
    for way, label in (("every", "not declared (every rank)"), ("once", "declared (written once)")):
        r = results[way]
        print(f"{label:<28} {r['raw_bytes'] / 1e6:>10.1f}MB {max(r['raw_bytes_per_rank']) / 1e6:>10.1f}MB "
              f"{r['shard_bytes_on_disk'] / 1e6:>10.1f}MB {r['durable_s']:>8.2f}s")
    print(f"ratio once/every: raw {once['raw_bytes'] / every['raw_bytes']:.3f}, "
          f"on disk {once['shard_bytes_on_disk'] / every['shard_bytes_on_disk']:.3f}; "
          f"every rank restored the saved state from disk, both ways")
    if a.json:
        print(json.dumps({"ranks": a.ranks, "params_m": a.params_m, **results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
