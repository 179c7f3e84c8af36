"""A small PyTorch training run checkpointed through ckptd, for the resume
test: a model with dropout, Adam, an LR schedule, a shuffled ResumableLoader,
and draws from Python's and NumPy's RNGs. Restores, trains to --steps,
snapshots every --every steps. With --kill-at K it SIGKILLs itself after
step K (once its last snapshot is persisted, so that the next run has one to
restore). It writes to --out (torch.save: test output, not a checkpoint) the
step it started from, each step's loss and batch, and at the end the model,
optimizer, scheduler and RNG states and the next batches and dropout masks.
"""

import argparse
import hashlib
import os
import random
import signal

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--kill-at", type=int, default=0)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    g = torch.Generator().manual_seed(4)
    data = torch.utils.data.TensorDataset(torch.randn(200, 8, generator=g), torch.randint(0, 4, (200,), generator=g))
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.9)
    loader = ckptd.torch.ResumableLoader(data, batch_size=16, seed=5, num_workers=args.workers)

    ckpt = ckptd.torch.Checkpointer(args.job, args.socket, every=args.every, slot_wait=10.0, on_error="raise")
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
            if ckpt.maybe_snapshot(step):
                last_snapshot = step
            if step == args.kill_at:
                ckpt.wait_persisted(last_snapshot, timeout=30)
                torch.save(log, args.out)
                os.kill(os.getpid(), signal.SIGKILL)
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
