"""A small PyTorch training run checkpointed through ckptd, for the resume
tests: a model with dropout, Adam, an LR schedule, a shuffled ResumableLoader,
and draws from Python's and NumPy's RNGs. Restores, trains to --steps,
snapshots every --every steps (under a coordinator: when its schedule says).
With --kill-at K it SIGKILLs itself after step K (once its last snapshot is
persisted, so that the next run has one to restore; with --commit-dir D, after
the first step from K on at which D, the job's directory in the storage root,
holds a committed step). It writes to --out (torch.save: test output, not a
checkpoint) the step it started from, each step's loss and batch, and at the
end the model, optimizer, scheduler and RNG states and the next batches and
dropout masks.

--rank R --world-size W: one rank of a job (its own model, data and RNG
streams, seeded by R; rank 0 is the single-rank run). When the coordinator
asks for a restart, maybe_snapshot ends the run with SystemExit(75)
(on_restart="exit"), as a launcher expects; it writes --out (with
"restart_at": the step) first.
"""

import argparse
import hashlib
import os
import random
import signal
import time

import numpy as np
import torch
import torch.nn.functional as F

import ckptd.torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 32)
        self.drop = torch.nn.Dropout(0.3)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.fc1(x))))


def committed_steps(job_dir):
    """The steps of the job that have a MANIFEST in the storage root."""
    try:
        names = os.listdir(job_dir)
    except FileNotFoundError:
        return []
    return sorted(int(n[5:]) for n in names
                  if n.startswith("step-") and os.path.exists(os.path.join(job_dir, n, "MANIFEST")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--kill-at", type=int, default=0)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--commit-dir", default="")
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds each step sleeps (pacing)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    seed = 100 * args.rank  # rank 0: the seeds of the single-rank run
    torch.manual_seed(seed + 1)
    random.seed(seed + 2)
    np.random.seed(seed + 3)
    g = torch.Generator().manual_seed(seed + 4)
    data = torch.utils.data.TensorDataset(torch.randn(200, 8, generator=g), torch.randint(0, 4, (200,), generator=g))
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.9)
    loader = ckptd.torch.ResumableLoader(data, batch_size=16, seed=seed + 5, num_workers=args.workers)

    ckpt = ckptd.torch.Checkpointer(args.job, args.socket, rank=args.rank, world_size=args.world_size,
                                    every=args.every, slot_wait=10.0, on_error="raise", on_restart="exit")
    ckpt.track("model", model)
    ckpt.track("optimizer", opt)
    ckpt.track("scheduler", sched)
    ckpt.track("data", loader)
    start = ckpt.restore()
    log = {"start": start, "steps": {}}

    step, last_snapshot = start, 0
    while step < args.steps:
        for x, y in loader:
            step += 1
            noise = random.random() * 1e-2 + float(np.random.rand()) * 1e-2
            loss = F.cross_entropy(model(x + noise), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            log["steps"][step] = (loss.item().hex(), hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes())
                                  .hexdigest())
            try:
                if ckpt.maybe_snapshot(step):
                    last_snapshot = step
            except SystemExit:  # a failure elsewhere: exit 75, the launcher starts every rank again
                log["restart_at"] = step
                torch.save(log, args.out)
                raise
            if args.kill_at and step >= args.kill_at and last_snapshot:
                committed = committed_steps(args.commit_dir) if args.commit_dir else None
                if committed is None or committed:
                    ckpt.wait_persisted(last_snapshot, timeout=30)
                    log["killed_at"] = step
                    if committed is not None:
                        log["committed_at_kill"] = committed_steps(args.commit_dir)[-1]
                    torch.save(log, args.out)
                    os.kill(os.getpid(), signal.SIGKILL)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if step == args.steps:
                break

    ckpt.close()
    after = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
             "loader": loader.state_dict(), "python_rng": random.getstate(), "numpy_rng": np.random.get_state(),
             "torch_rng": torch.get_rng_state()}
    batches = []
    for i, (x, y) in enumerate(loader):  # the next batches the run would have trained on
        batches.append((x, y))
        if i == 2:
            break
    model.train()
    masks = [model.drop(torch.ones(4, 8)) for _ in range(3)]  # the torch RNG stream, drawn on
    log.update(after=after, batches=batches, masks=masks, randoms=(random.random(), np.random.rand()))
    torch.save(log, args.out)


if __name__ == "__main__":
    main()
