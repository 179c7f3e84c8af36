#!/usr/bin/env python3
"""A data-parallel PyTorch job for torchrun (CPU ranks, the gloo backend,
DistributedDataParallel), checkpointed through ckptd.torch with nothing but
torchrun's environment: the Checkpointer takes the rank and world size from
RANK and WORLD_SIZE, and a restart the coordinator asks for ends the worker
with status 75 for torchrun's elastic agent to start every rank again.
(examples/pytorch_train.py is the single-process loop; this is the same
under torchrun, with DDP or FSDP2.)

    build/bin/ckptd-agent --storage-root ./ckpt &
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 PYTHONPATH=python torchrun --standalone --nproc-per-node 2 \
        --max-restarts 3 examples/pytorch_torchrun.py --job demo --steps 200 --out ./rank-{rank}.json

It needs torch 2.x (Debian's torch 1.13 ships a torchrun that crashes on its
Python 3.11); docs/python.md says why TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1.
tests/python/test_torchrun.py runs it, killing a rank midway and changing
the number of ranks between runs.

--kill-rank R --kill-at K: in torchrun's first attempt only
(TORCHELASTIC_RESTART_COUNT 0), rank R SIGKILLs itself after step K once
its newest snapshot is persisted, having written what it did to --out +
".killed". Each rank writes --out (a JSON file, "{rank}" in the path
replaced): the step it started from, each step's loss (as a hex float), and
digests of the model, the optimizer and the data cursor at the end.

--fsdp: the model is sharded with FSDP2 (fully_shard: each parameter and
its Adam moments a DTensor split along dimension 0 over the ranks) instead
of replicated by DDP, and any number of ranks may restore the job's newest
step. Each rank also writes the digest of the job's full state (every
DTensor gathered whole) right after the restore and at the end, the world
size that saved the restored step, the samples it read at each step with
the epoch's order, and the shape and SHA-256 of each whole parameter at the
end, so that a test can check what a change of world size kept, what it
read and what an export writes.
"""

import argparse
import hashlib
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ckptd.torch


def digest(obj):
    """SHA-256 of the tensors and numbers in a state_dict, in key order."""
    h = hashlib.sha256()

    def walk(x):
        if isinstance(x, torch.Tensor):
            h.update(x.detach().contiguous().cpu().numpy().tobytes())
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                h.update(str(k).encode())
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        else:
            h.update(repr(x).encode())

    walk(obj)
    return h.hexdigest()


def full(obj):
    """`obj` with every DTensor gathered into the whole tensor (a collective:
    every rank calls it)."""
    if callable(getattr(obj, "full_tensor", None)):
        return obj.full_tensor()
    if isinstance(obj, dict):
        return {k: full(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(full(v) for v in obj)
    return obj


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", help="the node's ckptd-agent socket (default: $CKPTD_SOCKET, else the agent's "
                    "default)")
    ap.add_argument("--job", required=True, help="job name: where the checkpoints go")
    ap.add_argument("--steps", type=int, required=True, help="steps the job trains in all")
    ap.add_argument("--every", type=int, default=5, help="snapshot every N steps (a coordinator may decide instead)")
    ap.add_argument("--kill-rank", type=int, default=-1, help="for tests: this rank SIGKILLs itself ...")
    ap.add_argument("--kill-at", type=int, default=0, help="... after this step, in torchrun's first attempt only")
    ap.add_argument("--out", required=True, help="each rank's JSON record of what it did ({rank}: its rank)")
    ap.add_argument("--fsdp", action="store_true", help="shard the model with FSDP2 instead of replicating it (DDP)")
    ap.add_argument("--replicas", type=int, default=1,
                    help="with --fsdp: HSDP, the model sharded over world/R ranks and replicated R times")
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    g = torch.Generator().manual_seed(2)
    n = 480  # a multiple of 4, 3 and 2 ranks' batches of 4
    data = torch.utils.data.TensorDataset(torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g),
                                          torch.arange(n))
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    if args.fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        if args.replicas > 1:
            mesh = init_device_mesh("cpu", (args.replicas, world // args.replicas),
                                    mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        forward = fully_shard(model, mesh=mesh)
    else:
        forward = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(forward.parameters(), lr=1e-2)
    # drop_last: every rank takes every step (collectives in each).
    loader = ckptd.torch.ResumableLoader(data, batch_size=4 if args.fsdp else 8, seed=3, rank=rank,
                                         world_size=world, drop_last=args.fsdp)

    # Rank and world size from torchrun's environment. DDP keeps the weights
    # and Adam's state the same on every rank: declared replicated. FSDP2's
    # DTensors declare their slices themselves.
    ckpt = ckptd.torch.Checkpointer(args.job, args.socket, every=args.every, slot_wait=10.0, on_error="raise",
                                    replicated=not args.fsdp, rng=False)
    ckpt.track("model", model)
    ckpt.track("optimizer", opt)
    ckpt.track("data", loader)
    start = ckpt.restore()
    log = {"rank": rank, "world": world, "start": start, "steps": {},
           "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
    if args.fsdp:
        log.update(restored=digest(full([model.state_dict(), opt.state_dict()])),
                   restored_world_size=ckpt.restored_world_size, samples={}, orders={})

    step, last_snapshot = start, 0
    while step < args.steps:
        for x, y, ids in loader:
            step += 1
            if args.fsdp:
                log["samples"][step] = [loader.epoch, ids.tolist()]
                log["orders"].setdefault(loader.epoch, loader.order(loader.epoch))
            loss = F.cross_entropy(forward(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            log["steps"][step] = loss.item().hex()
            if ckpt.maybe_snapshot(step):
                last_snapshot = step
            if log["attempt"] == 0 and rank == args.kill_rank and step >= args.kill_at and last_snapshot:
                ckpt.wait_persisted(last_snapshot, timeout=30)
                log["killed_at"] = step
                with open(args.out.format(rank=rank) + ".killed", "w") as f:
                    json.dump(log, f)
                os.kill(os.getpid(), signal.SIGKILL)
            if step == args.steps:
                break

    if args.fsdp and last_snapshot:
        ckpt.wait_persisted(last_snapshot, timeout=60)
    ckpt.close()
    model_state, opt_state = full(model.state_dict()), full(opt.state_dict())
    if args.fsdp:
        log["full"] = digest([model_state, opt_state])
        log["tensors"] = {k: [list(v.shape), hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest()]
                          for k, v in model_state.items()}
    log.update(model=digest(model_state), optimizer=digest(opt_state),
               loader=digest(loader.state_dict()))
    with open(args.out.format(rank=rank), "w") as f:
        json.dump(log, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Not through the interpreter's finalization: there, a gloo thread of
    # torch 2.x still finishing FSDP2's all-gather work can take the GIL
    # while Python tears down and abort the process (std::terminate) after
    # the job has finished.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
