"""Kill and resume through ckptd: a PyTorch run SIGKILLed at a random step and
resumed must match a run that never failed, bit for bit: parameters,
optimizer and scheduler state, RNG streams, the data cursor, every step's
loss and batch, and the batches that come next."""

import os
import random
import subprocess
import sys
import unittest

from support import Agent, HERE

try:
    import numpy as np
    import torch
except ImportError:
    torch = None


def _same(a, b):
    """Bit-identical: tensors by dtype, shape and bytes; containers by item."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and
                a.shape == b.shape and a.numpy().tobytes() == b.numpy().tobytes())
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and
                a.tobytes() == b.tobytes())
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) == type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return isinstance(b, float) and a.hex() == b.hex()
    return a == b


@unittest.skipIf(torch is None, "torch is not installed")
class KillAndResumeTest(unittest.TestCase):
    STEPS, EVERY = 40, 5

    def setUp(self):
        self.agent = Agent().start()

    def tearDown(self):
        self.agent.cleanup()

    def train(self, job, out, kill_at=0, workers=0):
        cmd = [sys.executable, os.path.join(HERE, "trainer.py"), "--socket", self.agent.socket, "--job", job,
               "--steps", str(self.STEPS), "--every", str(self.EVERY), "--out", out, "--workers", str(workers)]
        if kill_at:
            cmd += ["--kill-at", str(kill_at)]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        expected = -9 if kill_at else 0
        self.assertEqual(p.returncode, expected, p.stdout.decode("utf-8", "replace"))
        return torch.load(out, weights_only=False)  # its own output: NumPy arrays too

    def test_killed_and_resumed_run_is_bit_identical(self):
        kill_at = random.Random().randint(self.EVERY + 1, self.STEPS - 1)
        why = f"(killed after step {kill_at})"
        plain = self.train("whole", os.path.join(self.agent.dir, "whole.pt"))
        self.assertEqual(plain["start"], 0)
        # The resumed runs read their data with a worker process: the cursor
        # counts what the loop received, not what the worker read ahead.
        killed = self.train("resumed", os.path.join(self.agent.dir, "killed.pt"), kill_at=kill_at, workers=1)
        resumed = self.train("resumed", os.path.join(self.agent.dir, "resumed.pt"), workers=1)

        start = resumed["start"]
        self.assertEqual(start, kill_at // self.EVERY * self.EVERY, why)  # the last snapshot before the kill
        self.assertEqual(sorted(killed["steps"]), list(range(1, kill_at + 1)), why)
        self.assertEqual(sorted(resumed["steps"]), list(range(start + 1, self.STEPS + 1)), why)
        for step, entry in list(killed["steps"].items()) + list(resumed["steps"].items()):
            self.assertEqual(entry, plain["steps"][step], f"loss or batch of step {step} {why}")
        for key in ("model", "optimizer", "scheduler", "loader", "python_rng", "numpy_rng", "torch_rng"):
            self.assertTrue(_same(resumed["after"][key], plain["after"][key]), f"{key} differs {why}")
        for key in ("batches", "masks", "randoms"):
            self.assertTrue(_same(resumed[key], plain[key]), f"{key} differ {why}")
        # Adam's moments exist and were restored, not recreated.
        self.assertEqual(float(resumed["after"]["optimizer"]["state"][0]["step"]), self.STEPS)


if __name__ == "__main__":
    unittest.main()
