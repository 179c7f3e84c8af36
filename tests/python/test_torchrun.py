"""torchrun as the launcher: a data-parallel job of two CPU ranks (gloo,
DDP) run by `torchrun --standalone --nproc-per-node 2 --max-restarts 2`
against one ckptd-agent. ckptd.torch takes each rank's number from
torchrun's environment. Rank 1 SIGKILLs itself at a random step of the first
attempt; torchrun's elastic agent stops rank 0 and starts both again; both
restore the same committed step and end bit-identical to an uninterrupted
run. A job sharded with FSDP2 (DTensors) saved by 4 ranks is restored by
3, then 2, then 4: each time the job's full state is bit-identical to what
was saved and the data position goes on with no sample repeated or skipped;
ckptd.export writes its last step's parameters whole, as they were trained.

Debian's torch 1.13 ships a torchrun that crashes on Debian's Python 3.11
before it starts a worker, so this test runs torch 2.x from PyPI in a virtual
environment it makes once and keeps ($CKPTD_TORCH2_VENV, default
~/.cache/ckptd-test/torch2-venv; about 3 GB with torch's CUDA libraries).
Without PyPI (and no such environment) the test is skipped, except under
CI=true, where it fails."""

import json
import os
import hashlib
import random
import subprocess
import sys
import tempfile
import unittest

from support import ROOT, Agent
from test_export import read_safetensors

import ckptd

VENV = os.environ.get("CKPTD_TORCH2_VENV") or os.path.join(os.path.expanduser("~"), ".cache", "ckptd-test",
                                                           "torch2-venv")
TRAINER = os.path.join(ROOT, "examples", "pytorch_torchrun.py")
STEPS, EVERY = 60, 5


def _has_torch2(python):
    if not os.path.exists(python):
        return False
    check = "import sys, torch, numpy; sys.exit(int(torch.__version__.split('.')[0]) < 2)"
    return subprocess.run([python, "-c", check], capture_output=True, timeout=120).returncode == 0


def torch2_python():
    """The virtual environment's python with torch 2.x, made when missing;
    None (and why) when it cannot be."""
    python = os.path.join(VENV, "bin", "python")
    if _has_torch2(python):
        return python, ""
    try:
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True, capture_output=True, timeout=300)
        pip = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                              "torch>=2.3", "numpy"], capture_output=True, timeout=1500)
    except (subprocess.SubprocessError, OSError) as e:
        return None, f"cannot make {VENV}: {e}"
    if pip.returncode != 0 or not _has_torch2(python):
        return None, f"cannot install torch 2.x into {VENV}: {pip.stderr.decode(errors='replace')[-500:]}"
    return python, ""


class TorchrunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.python, why = torch2_python()
        if cls.python is None:
            if os.environ.get("CI") == "true":
                raise RuntimeError(why)
            raise unittest.SkipTest(f"no torch 2.x virtual environment: {why}")

    def setUp(self):
        self.agent = Agent().start()
        self.addCleanup(self.agent.cleanup)
        self.out = tempfile.mkdtemp(prefix="ckptd-torchrun-")

    def torchrun(self, job, max_restarts, *extra, ranks=2, steps=STEPS):
        # torch 2.x's elastic agent keeps one TCPStore for every attempt
        # and its workers' process groups write their keys there with no
        # attempt prefix: a restarted gloo group can read the addresses of
        # the attempt before and fail to connect. The opt-out gives each
        # attempt a store of its own.
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1",
                   CUDA_VISIBLE_DEVICES="", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
        cmd = [os.path.join(VENV, "bin", "torchrun"), "--standalone", "--nnodes", "1", "--nproc-per-node", str(ranks),
               "--max-restarts", str(max_restarts), "--monitor-interval", "0.5", TRAINER,
               "--socket", self.agent.socket, "--job", job, "--steps", str(steps), "--every", str(EVERY),
               "--out", os.path.join(self.out, job + "-{rank}.json")] + list(extra)
        run = subprocess.run(cmd, env=env, capture_output=True, timeout=300)
        output = run.stdout.decode(errors="replace")[-3000:] + run.stderr.decode(errors="replace")[-3000:]
        self.assertEqual(run.returncode, 0, f"torchrun failed: {output}\nagent: {self.agent.read_log()[-3000:]}")
        logs = []
        for rank in range(ranks):
            with open(os.path.join(self.out, f"{job}-{rank}.json")) as f:
                logs.append(json.load(f))
        return logs, output

    def test_a_killed_rank_restarts_every_rank_from_the_same_step_bit_exact(self):
        reference, _ = self.torchrun("reference", 0)
        for r in range(2):
            self.assertEqual((reference[r]["rank"], reference[r]["world"], reference[r]["start"]), (r, 2, 0))
        kill_at = random.Random().randint(EVERY + 2, STEPS - 2 * EVERY)
        why = f"(rank 1 killed from step {kill_at} on)"
        resumed, output = self.torchrun("killed", 2, "--kill-rank", "1", "--kill-at", str(kill_at))
        with open(os.path.join(self.out, "killed-1.json.killed")) as f:
            killed = json.load(f)
        start = resumed[0]["start"]
        sys.stderr.write(f"\nrank 1 killed after step {killed['killed_at']}; both ranks restored step {start}\n")
        for r in range(2):
            what = f"rank {r} {why}, restored step {start}"
            self.assertEqual(resumed[r]["attempt"], 1, f"{what}: not torchrun's second attempt\n{output}")
            self.assertEqual(resumed[r]["start"], start, f"the ranks restored different steps {why}")
            self.assertGreater(start, 0, what)
            self.assertLessEqual(start, killed["killed_at"], what)
            self.assertEqual(start % EVERY, 0, what)
            self.assertEqual(sorted(int(s) for s in resumed[r]["steps"]), list(range(start + 1, STEPS + 1)), what)
            for step, loss in resumed[r]["steps"].items():
                self.assertEqual(loss, reference[r]["steps"][step], f"loss of step {step}, {what}")
            for key in ("model", "optimizer", "loader"):
                self.assertEqual(resumed[r][key], reference[r][key], f"{key} differs at the end, {what}")
        # Steps before the kill were the reference's too.
        for step, loss in killed["steps"].items():
            self.assertEqual(loss, reference[1]["steps"][step], f"loss of step {step} before the kill {why}")

    def elastic_runs(self, job, runs):
        """Runs the FSDP2 trainer under torchrun once per (ranks, steps,
        extra arguments) of `runs`, each restoring the step the run before
        ended with, and checks that each restored the job's full state bit for
        bit, trained on, and that the job read each epoch's samples in order,
        none repeated or skipped. Returns the last run's logs."""
        saved, consumed, orders = None, [], {}  # the full state's digest at the end; (step, epoch, ids) read
        for ranks, steps, extra in runs:
            logs, output = self.torchrun(job, 0, "--fsdp", *extra, ranks=ranks, steps=steps)
            what = f"{ranks} ranks {list(extra)} restoring the step {len(consumed) and consumed[-1][0]} of the run before"
            for log in logs:
                self.assertEqual(log["world"], ranks, what)
                self.assertEqual(log["full"], logs[0]["full"], f"{what}: the ranks gathered different states")
                if saved is None:
                    self.assertEqual((log["start"], log["restored_world_size"]), (0, None), what)
                else:
                    self.assertEqual(log["start"], consumed[-1][0], f"{what}: not the newest step\n{output}")
                    self.assertEqual(log["restored_world_size"], previous, what)
                    self.assertEqual(log["restored"], saved, f"{what}: the restored state is not the saved one")
                self.assertEqual(sorted(int(s) for s in log["steps"]), list(range(log["start"] + 1, steps + 1)),
                                 f"{what}: did not train on")
            # The samples the job read at each step, rank by rank.
            for step in range(logs[0]["start"] + 1, steps + 1):
                epoch = logs[0]["samples"][str(step)][0]
                ids = []
                for log in logs:
                    self.assertEqual(log["samples"][str(step)][0], epoch, f"{what}: ranks in different epochs")
                    ids += log["samples"][str(step)][1]
                consumed.append((step, epoch, ids))
            orders.update((int(e), o) for e, o in logs[0]["orders"].items())
            saved, previous = logs[0]["full"], ranks
        # Each epoch's order read in order: no sample repeated or skipped
        # across the changes of world size, except that drop_last leaves out
        # an epoch's tail shorter than the job's step (ranks × batch).
        by_epoch, last_stride = {}, {}
        for _, epoch, ids in consumed:
            by_epoch.setdefault(epoch, []).extend(ids)
            last_stride[epoch] = len(ids)
        self.assertGreaterEqual(len(by_epoch), 2)
        for epoch, ids in by_epoch.items():
            order = orders.get(epoch) or self.fail(f"no order logged for epoch {epoch}")
            self.assertEqual(ids, order[:len(ids)], f"epoch {epoch}: the samples read are not its order's")
            if epoch != max(by_epoch):
                self.assertLess(len(order) - len(ids), last_stride[epoch], f"epoch {epoch} not read to its end")
        return logs

    def test_an_fsdp2_job_restores_onto_three_then_two_then_four_ranks(self):
        """FSDP2 splits every parameter and Adam moment along dimension 0 over
        the ranks (torch.chunk's split: with 3 ranks the [4, 64] weight is 2, 2
        and 0 rows)."""
        logs = self.elastic_runs("fsdp", ((4, 20, ()), (3, 30, ()), (2, 40, ()), (4, 50, ())))
        # The last step exported for inference: each parameter whole, bit for
        # bit the one the 4 ranks gathered.
        out = os.path.join(self.out, "export")
        self.assertEqual(ckptd.export(self.agent.root, "fsdp", out), 50)
        tensors, _ = read_safetensors(os.path.join(out, "model.safetensors"))
        exported = {name.split("/", 1)[1]: [list(shape), hashlib.sha256(data).hexdigest()]
                    for name, (dtype, shape, data) in tensors.items() if name.startswith("model/")}
        self.assertEqual(exported, logs[0]["tensors"])

    def test_an_hsdp_job_restores_onto_other_meshes(self):
        """HSDP: FSDP2 over a 2-D mesh, each parameter sharded over 2 ranks and
        replicated twice (placements Replicate(), Shard(0)), which ckptd writes
        once per replica group. Restored as plain FSDP2 on 3 ranks, as HSDP
        again on 4, then on 2 ranks as 2 replicas of the whole."""
        self.elastic_runs("hsdp", ((4, 20, ("--replicas", "2")), (3, 30, ()), (4, 40, ("--replicas", "2")),
                                   (2, 50, ("--replicas", "2"))))


if __name__ == "__main__":
    unittest.main()
