"""examples/pytorch_train.py works as its docstring says: run to step 20, run
again to step 40 (it resumes after step 20), and it ends with the digest of a
run straight to step 40. The README's PyTorch quick start runs as written,
and stopped midway and run again ends with the parameters of a run that
never stopped."""

import os
import re
import subprocess
import sys
import time
import unittest

from support import Agent, ROOT

try:
    import torch  # noqa: F401
except ImportError:
    torch = None

EXAMPLE = os.path.join(ROOT, "examples", "pytorch_train.py")
README = os.path.join(ROOT, "README.md")


def quick_start():
    """The README's first python block, under its "PyTorch quick start"."""
    text = open(README, encoding="utf-8").read()
    section = text.split("## PyTorch quick start", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@unittest.skipIf(torch is None, "torch is not installed")
class ExampleTest(unittest.TestCase):
    def setUp(self):
        self.agent = Agent().start()

    def tearDown(self):
        self.agent.cleanup()

    def run_example(self, job, steps):
        p = subprocess.run([sys.executable, EXAMPLE, "--socket", self.agent.socket, "--job", job, "--steps",
                            str(steps), "--every", "10", "--device", "cpu"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        out = p.stdout.decode("utf-8", "replace")
        self.assertEqual(p.returncode, 0, out)
        self.assertNotIn("Warning", out)
        return out

    def test_resumes_where_it_stopped(self):
        first = self.run_example("stopped", 20)
        self.assertIn("starting from scratch", first)
        self.assertIn("final_step=20", first)
        resumed = self.run_example("stopped", 40)
        self.assertIn("resuming after step 20", resumed)
        straight = self.run_example("straight", 40)
        digests = [re.search(r"final_step=40 digest=(\w+)", out).group(1) for out in (resumed, straight)]
        self.assertEqual(digests[0], digests[1])
        self.assertEqual(self.agent.committed_steps("straight")[-1], 40)


@unittest.skipIf(torch is None, "torch is not installed")
class QuickStartTest(unittest.TestCase):
    def setUp(self):
        self.agent = Agent().start()
        self.code = quick_start()

    def tearDown(self):
        self.agent.cleanup()

    def run_code(self, code):
        """Runs `code` as a script, with the agent's socket as the default
        one; returns the digest of the model's parameters at its end and
        what it printed (ckptd.torch's log at INFO included)."""
        code = "import logging\nlogging.basicConfig(level=logging.INFO)\n" + code + ("\nimport hashlib\nprint('digest=' + hashlib.sha256(b''.join(p.detach().numpy().tobytes() "
                 "for p in model.parameters())).hexdigest())\n")
        env = dict(os.environ, CKPTD_SOCKET=self.agent.socket)
        p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                           cwd=self.agent.dir, timeout=120)
        out = p.stdout.decode("utf-8", "replace")
        self.assertEqual(p.returncode, 0, out)
        self.assertNotIn("Warning", out)
        return re.search(r"digest=(\w+)", out).group(1), out

    def test_stopped_midway_and_run_again_it_ends_as_a_run_that_never_stopped(self):
        self.assertIn("range(ckpt.restore() + 1, 1001)", self.code)
        self.assertIn('Checkpointer("quickstart", every=500)', self.code)
        _, out = self.run_code(self.code.replace("1001", "501"))  # stopped after step 500
        self.assertIn("job 'quickstart' has no committed checkpoint", out)
        self.assertEqual(self.newest_committed("quickstart", 500), 500)
        resumed, out = self.run_code(self.code)
        self.assertIn("job 'quickstart' restored step 500", out)
        straight, _ = self.run_code(self.code.replace('"quickstart"', '"straight"'))
        self.assertEqual(resumed, straight)
        self.assertEqual(self.newest_committed("straight", 1000), 1000)

    def newest_committed(self, job, step, timeout=20.0):
        """The newest committed step of `job`, once it is `step` or after
        `timeout` (the agent commits after the trainer has said goodbye)."""
        deadline = time.monotonic() + timeout
        while True:
            steps = self.agent.committed_steps(job)
            if (steps and steps[-1] == step) or time.monotonic() > deadline:
                return steps[-1] if steps else None
            time.sleep(0.1)


if __name__ == "__main__":
    unittest.main()
