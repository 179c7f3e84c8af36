"""A data-parallel PyTorch job for torchrun (CPU ranks, the gloo backend,
DistributedDataParallel), checkpointed through ckptd.torch with nothing but
torchrun's environment: the Checkpointer takes the rank and world size from
RANK and WORLD_SIZE, and a restart the coordinator asks for ends the worker
with status 75 for torchrun's elastic agent to start every rank again.

--kill-rank R --kill-at K: in torchrun's first attempt only
(TORCHELASTIC_RESTART_COUNT 0), rank R SIGKILLs itself after step K once
its newest snapshot is persisted, having written what it did to --out +
".killed". Each rank writes --out (a JSON file, "{rank}" in the path
replaced): the step it started from, each step's loss (as a hex float), and
digests of the model, the optimizer and the data cursor at the end.
"""

import argparse
import hashlib
import json
import os
import signal

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-at", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    g = torch.Generator().manual_seed(2)
    data = torch.utils.data.TensorDataset(torch.randn(512, 16, generator=g), torch.randint(0, 4, (512,), generator=g))
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-2)
    loader = ckptd.torch.ResumableLoader(data, batch_size=8, seed=3, rank=rank, world_size=world)

    # Rank and world size from torchrun's environment; replicated: DDP keeps
    # the weights and Adam's state the same on every rank.
    ckpt = ckptd.torch.Checkpointer(args.job, args.socket, every=args.every, slot_wait=10.0, on_error="raise",
                                    replicated=True, rng=False)
    ckpt.track("model", model)
    ckpt.track("optimizer", opt)
    ckpt.track("data", loader)
    start = ckpt.restore()
    log = {"rank": rank, "world": world, "start": start, "steps": {},
           "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}

    step, last_snapshot = start, 0
    while step < args.steps:
        for x, y in loader:
            step += 1
            loss = F.cross_entropy(ddp(x), y)
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

    ckpt.close()
    log.update(model=digest(model.state_dict()), optimizer=digest(opt.state_dict()),
               loader=digest(loader.state_dict()))
    with open(args.out.format(rank=rank), "w") as f:
        json.dump(log, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
