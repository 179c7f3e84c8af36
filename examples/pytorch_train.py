#!/usr/bin/env python3
"""A PyTorch training loop checkpointed through ckptd, to copy into your own.

Kill it at any point (Ctrl-C, SIGKILL, a lost node) and start it again: it
resumes from the newest checkpoint, and ends exactly as a run that never
stopped would (the last line prints a digest of the model to compare).

    build/bin/ckptd-agent --storage-root ./ckpt &
    PYTHONPATH=python python3 examples/pytorch_train.py --job demo --steps 300

What makes the resume exact: every object whose state matters is tracked
(model, optimizer, LR scheduler, the data loader's position); the RNG streams
(Python, NumPy, torch CPU and CUDA) are saved with them; the data comes from
a ckptd.torch.ResumableLoader, which can start mid-epoch; and the loop counts
steps, not epochs.
"""

import argparse
import hashlib
import sys

import torch
import torch.nn.functional as F

import ckptd.torch

EXIT_RESTART = 75  # the coordinator asked every rank to restart: the launcher runs us again


class Model(torch.nn.Module):
    def __init__(self, features=20, hidden=64, classes=5):
        super().__init__()
        self.fc1 = torch.nn.Linear(features, hidden)
        self.drop = torch.nn.Dropout(0.1)
        self.fc2 = torch.nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(self.drop(F.gelu(self.fc1(x))))


def synthetic_data(n=2000, features=20, classes=5):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=g)
    y = (x[:, :classes] * torch.arange(1.0, classes + 1)).argmax(dim=1)
    return torch.utils.data.TensorDataset(x, y)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", help="the node's ckptd-agent socket (default: $CKPTD_SOCKET, else the agent's "
                    "default, $XDG_RUNTIME_DIR/ckptd/agent.sock or /run/ckptd/agent.sock)")
    ap.add_argument("--job", required=True, help="job name: where the checkpoints go")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=50, help="snapshot every N steps (a coordinator may decide instead)")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    torch.manual_seed(0)
    model = Model().to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
    loader = ckptd.torch.ResumableLoader(synthetic_data(), batch_size=32, shuffle=True, seed=0,
                                         num_workers=args.workers)

    # A failed snapshot is a warning (ckptd.CheckpointWarning) and training
    # goes on: checkpointing is a weak dependency. When the agent is still
    # persisting earlier snapshots, wait up to slot_wait seconds for a free
    # staging slot (the default, 0, skips the snapshot instead).
    ckpt = ckptd.torch.Checkpointer(args.job, args.socket, rank=args.rank, world_size=args.world_size,
                                    every=args.every, slot_wait=10.0)
    ckpt.track("model", model)
    ckpt.track("optimizer", optimizer)
    ckpt.track("scheduler", scheduler)
    ckpt.track("data", loader)
    step = ckpt.restore()  # the steps already done: 0 on a fresh start
    print(f"resuming after step {step}" if step else "starting from scratch", flush=True)

    model.train()
    while step < args.steps:
        for x, y in loader:
            x, y = x.to(args.device), y.to(args.device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            ckpt.maybe_snapshot(step)  # returns at once unless this step is scheduled
            if ckpt.restart_requested():
                print(f"restart requested at step {step}", flush=True)
                ckpt.close()
                sys.exit(EXIT_RESTART)
            if step % 50 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step == args.steps:
                break
    ckpt.close()  # the agent still persists the last snapshot

    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(f"final_step={step} digest={digest[:16]}")


if __name__ == "__main__":
    main()
