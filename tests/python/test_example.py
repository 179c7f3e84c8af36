"""examples/pytorch_train.py works as its docstring says: run to step 20, run
again to step 40 (it resumes after step 20), and it ends with the digest of a
run straight to step 40."""

import os
import re
import subprocess
import sys
import unittest

from support import Agent, ROOT

try:
    import torch  # noqa: F401
except ImportError:
    torch = None

EXAMPLE = os.path.join(ROOT, "examples", "pytorch_train.py")


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


if __name__ == "__main__":
    unittest.main()
