"""ckptd.torch under a coordinator, as multi-node jobs run: a ckptd-coordinator
on loopback, two agents as two nodes (node-a, node-b) sharing its storage
root, and a job of two ranks (rank 0 on node-a, rank 1 on node-b), each a
trainer.py process with its own model, data and RNG streams. The test is the
launcher: rank 1 SIGKILLs itself at a random step after a checkpoint committed;
rank 0 must hear of the failure from the coordinator and exit 75 by itself;
then both ranks start again, must restore the same step (the newest
committed at the failure or later, never newer than the kill) and must end
bit-identical to an uninterrupted run of the same ranks."""

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import warnings

from support import AGENT, HERE, ROOT

try:
    import torch
    from test_torch_resume import _same
except ImportError:
    torch = None

COORDINATOR = os.environ.get("CKPTD_COORDINATOR") or os.path.join(ROOT, "build", "bin", "ckptd-coordinator")
CKPTCTL = os.environ.get("CKPTD_CTL") or os.path.join(ROOT, "build", "bin", "ckptctl")

WORLD = 2
NODES = ("node-a", "node-b")  # rank r runs on NODES[r]
EXIT_RESTART = 75


@unittest.skipIf(torch is None, "torch is not installed")
class CoordinatedKillAndResumeTest(unittest.TestCase):
    # The ranks do not talk to each other, so a rank that is not told of the
    # failure in time would finish: STEPS leaves rank 0 seconds of training
    # after the latest kill (its detection takes a heartbeat or two).
    STEPS, EVERY, STEP_SLEEP = 150, 5, 0.03
    KILL_RANGE = (EVERY + 1, 45)
    RESTART_GRACE = 20.0  # seconds the surviving rank gets to exit 75 by itself
    RUN_TIMEOUT = 60.0  # seconds a run of the ranks may take (about 8 s here)
    BUDGET = 150.0  # seconds for the whole test, inside ctest's TIMEOUT, so that cleanup runs

    def setUp(self):
        self.deadline = time.monotonic() + self.BUDGET
        self.dir = tempfile.mkdtemp(prefix="ckptd-py-coord-")
        self.root = os.path.join(self.dir, "root")
        self.logs = os.path.join(self.dir, "logs")
        for d in (self.root, self.logs, os.path.join(self.dir, "state")):
            os.mkdir(d)
        self.procs = {"trainer": [], "agent": [], "coordinator": []}  # every process started, for cleanup
        self.addCleanup(self._cleanup)
        self.coordinator = self._start_coordinator()
        self.sockets = [self._start_agent(node) for node in NODES]

    # --- the cluster ---

    def _spawn(self, role, cmd, log_name):
        with open(os.path.join(self.logs, log_name), "ab") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs[role].append(p)
        return p

    def bound(self, seconds):
        """`seconds`, or less: what is left of the test's budget."""
        return max(0.0, min(seconds, self.deadline - time.monotonic()))

    def _log(self, name):
        try:
            with open(os.path.join(self.logs, name), "rb") as f:
                return f.read().decode("utf-8", "replace")[-6000:]
        except FileNotFoundError:
            return ""

    def _start_coordinator(self):
        p = self._spawn("coordinator",
                        [COORDINATOR, "--listen", "127.0.0.1:0", "--storage-root", self.root,
                         "--state-dir", os.path.join(self.dir, "state"), "--heartbeat-interval", "200ms",
                         "--node-lost-after", "1500ms", "--every", str(self.EVERY), "--keep", "3"],
                        "coordinator.log")
        deadline = time.monotonic() + self.bound(30)
        while time.monotonic() < deadline:
            m = re.search(r" INFO ckptd-coordinator: listening on 127\.0\.0\.1:(\d+)$", self._log("coordinator.log"),
                          re.MULTILINE)
            if m:
                self.address = f"127.0.0.1:{m.group(1)}"
                return p
            if p.poll() is not None:
                self.fail(f"ckptd-coordinator exited with {p.returncode}: {self._log('coordinator.log')}")
            time.sleep(0.05)
        self.fail(f"ckptd-coordinator did not listen in time: {self._log('coordinator.log')}")

    def _start_agent(self, node):
        path = os.path.join(self.dir, f"{node}.sock")
        log = f"agent-{node}.log"
        p = self._spawn("agent",
                        [AGENT, "--storage-root", self.root, "--socket", path, "--coordinator", self.address,
                         "--node-id", node, "--agent-token-file", os.path.join(self.dir, "state", "agent-token"),
                         "--slots", "2", "--keep", "3", "--threads", "2"], log)
        deadline = time.monotonic() + self.bound(30)
        while time.monotonic() < deadline:
            if p.poll() is not None:
                self.fail(f"the agent of {node} exited with {p.returncode}: {self._log(log)}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(path)
                return path
            except OSError:
                time.sleep(0.05)
        self.fail(f"the agent of {node} did not serve in time: {self._log(log)}")

    def _cleanup(self):
        """Trainers killed, then agents and the coordinator stopped (SIGTERM;
        SIGKILL after 20 s), whatever state the test left them in."""
        for role, sig in (("trainer", signal.SIGKILL), ("agent", signal.SIGTERM), ("coordinator", signal.SIGTERM)):
            for p in self.procs[role]:
                if p.poll() is None:
                    p.send_signal(sig)
            for p in self.procs[role]:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shm = "/dev/shm"
        for p in self.procs["agent"]:  # the staging of an agent that could not free it
            for name in os.listdir(shm) if os.path.isdir(shm) else []:
                if name.startswith(f"ckptd-{p.pid}-"):
                    try:
                        os.unlink(os.path.join(shm, name))
                    except OSError:
                        pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def ckptctl_status(self, job):
        p = subprocess.run([CKPTCTL, "status", "--coordinator", self.address, "--job", job, "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=self.bound(30) or 1)
        self.assertEqual(p.returncode, 0, p.stderr.decode("utf-8", "replace"))
        return json.loads(p.stdout)

    # --- the job ---

    def start_rank(self, job, rank, attempt, kill_at=0):
        out = os.path.join(self.dir, f"{job}.attempt-{attempt}.rank-{rank}.pt")
        cmd = [sys.executable, os.path.join(HERE, "trainer.py"), "--socket", self.sockets[rank], "--job", job,
               "--rank", str(rank), "--world-size", str(WORLD), "--steps", str(self.STEPS),
               "--every", str(self.EVERY), "--step-sleep", str(self.STEP_SLEEP), "--threads", "1", "--out", out]
        if kill_at:
            cmd += ["--kill-at", str(kill_at), "--commit-dir", os.path.join(self.root, job)]
        log = f"{job}.attempt-{attempt}.rank-{rank}.log"
        return {"proc": self._spawn("trainer", cmd, log), "out": out, "log": log, "rank": rank}

    def wait_exit(self, rank, timeout, expected):
        p = rank["proc"]
        timeout = self.bound(timeout)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"rank {rank['rank']} did not exit within {timeout:.0f}s: {self._log(rank['log'])}")
        self.assertEqual(p.returncode, expected, f"rank {rank['rank']}: {self._log(rank['log'])}")
        return torch.load(rank["out"], weights_only=False)  # its own output: NumPy arrays too

    def committed(self, job):
        d = os.path.join(self.root, job)
        if not os.path.isdir(d):
            return []
        return sorted(int(n[5:]) for n in os.listdir(d)
                      if n.startswith("step-") and os.path.exists(os.path.join(d, n, "MANIFEST")))

    def run_whole(self, job, attempt=0):
        ranks = [self.start_rank(job, r, attempt) for r in range(WORLD)]
        end = time.monotonic() + self.RUN_TIMEOUT
        return [self.wait_exit(r, end - time.monotonic(), 0) for r in ranks]

    def test_the_coordinators_schedule_is_said_once_to_override_every(self):
        import ckptd.torch as ckt
        job = "told-schedule"
        model = torch.nn.Linear(4, 2)
        ckpt = ckt.Checkpointer(job, self.sockets[0], rank=0, world_size=1, every=7, slot_wait=5.0)
        ckpt.track("model", model)
        with self.assertLogs("ckptd.torch", level="INFO") as logs:
            self.assertEqual(ckpt.restore(), 0)
            schedule, step = None, 0
            deadline = time.monotonic() + self.bound(20)
            while time.monotonic() < deadline and step < 400:
                step += 1
                ckpt.maybe_snapshot(step)
                schedule = ckpt._layout.client.schedule()
                if schedule.known and step % 50 == 0:
                    break
                time.sleep(0.02)
        ckpt.close()
        self.assertTrue(schedule.coordinated and schedule.known, schedule)
        self.assertEqual(schedule.every_steps, self.EVERY)
        told = [r.getMessage() for r in logs.records if "coordinator's schedule applies" in r.getMessage()]
        self.assertEqual(len(told), 1, logs.output)
        self.assertIn("not every=7", told[0])
        self.assertIn(f"a checkpoint every {self.EVERY} steps", told[0])
        self.assertIn(f"ckptctl interval --job {job}", told[0])
        # It overrides what the caller gave: a warning, not a note.
        self.assertEqual([r.levelname for r in logs.records if r.getMessage() == told[0]], ["WARNING"])

    def test_a_job_name_reused_after_its_run_finished_is_a_warning_to_the_new_run(self):
        import ckptd
        import ckptd.torch as ckt
        job = "reused-name"
        model = torch.nn.Linear(4, 2)

        def checkpointer():
            c = ckt.Checkpointer(job, self.sockets[0], rank=0, world_size=1, slot_wait=5.0)
            c.track("model", model)
            return c

        first = checkpointer()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            self.assertEqual(first.restore(), 0)
        self.assertFalse([w for w in seen if issubclass(w.category, ckptd.JobNameReusedWarning)], seen)
        self.assertTrue(first.close(final_step=30, timeout=self.bound(30)))
        # The coordinator commits step 30 and, at the agent's next
        # heartbeats, the run is finished.
        deadline = time.monotonic() + self.bound(20)
        while True:
            (j,) = [j for j in self.ckptctl_status(job)["jobs"] if j["job"] == job]
            if (j["state"] == "finished" and j.get("newest_committed_step") == 30) or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        self.assertEqual((j["state"], j.get("newest_committed_step")), ("finished", 30), j)

        # A new run under the same name is told, in its own output, what it
        # resumes and what to do.
        second = checkpointer()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            self.assertEqual(second.restore(), 30)
        told = [str(w.message) for w in seen if issubclass(w.category, ckptd.JobNameReusedWarning)]
        self.assertEqual(len(told), 1, [str(w.message) for w in seen] + [self._log("coordinator.log")])
        self.assertIn(f"job {job} was used by a run that finished", told[0])
        self.assertIn("restores that run's newest committed step 30", told[0])
        self.assertIn("give a new run a job name of its own", told[0])
        self.assertIn("was used by a run that finished", second._layout.client.restore_warning())
        second.close()
        self.assertIn("registered again", self._log("coordinator.log"))

    def test_rank_killed_and_job_restarted_is_bit_identical(self):
        kill_at = random.Random().randint(*self.KILL_RANGE)
        why = f"(rank 1 to be killed from step {kill_at} on)"
        reference = self.run_whole("reference")
        for r in range(WORLD):
            self.assertEqual(reference[r]["start"], 0, f"rank {r} of the reference run")
        # The ranks really are different runs.
        self.assertFalse(_same(reference[0]["after"]["model"], reference[1]["after"]["model"]))

        # Attempt 0: rank 1 dies; rank 0 must be told to restart and exit 75.
        job = "restarted"
        ranks = [self.start_rank(job, 0, 0), self.start_rank(job, 1, 0, kill_at=kill_at)]
        deadline = time.monotonic() + self.bound(self.RUN_TIMEOUT)
        while ranks[1]["proc"].poll() is None:
            code = ranks[0]["proc"].poll()
            if code is not None:
                self.fail(f"rank 0 exited with {code} before rank 1 was killed {why}: {self._log(ranks[0]['log'])}"
                          f"\nrank 1: {self._log(ranks[1]['log'])}")
            if time.monotonic() > deadline:
                self.fail(f"rank 1 was not killed in time {why}: {self._log(ranks[1]['log'])}")
            time.sleep(0.02)
        committed_at_failure = self.committed(job)
        killed = self.wait_exit(ranks[1], 10, -signal.SIGKILL)
        step_killed = killed["killed_at"]
        why = f"(rank 1 killed after step {step_killed})"
        self.assertGreaterEqual(step_killed, kill_at, why)
        self.assertTrue(committed_at_failure, f"nothing committed when rank 1 died {why}")
        survivor = self.wait_exit(ranks[0], self.RESTART_GRACE, EXIT_RESTART)
        self.assertGreater(survivor["restart_at"], 0, why)

        # The coordinator recorded the failure and asks for a restart.
        status = self.ckptctl_status(job)
        died = [f for f in status["failures"] if f["job"] == job and f["kind"] == "trainer_died"]
        self.assertTrue(died, f"no trainer_died failure recorded {why}: {status}")
        self.assertIn((NODES[1], 1), [(f["node_id"], f["rank"]) for f in died], f"{why}: {status}")
        self.assertEqual([j["state"] for j in status["jobs"] if j["job"] == job], ["restarting"], f"{why}: {status}")
        incarnation_before = status["jobs"][0]["incarnation"]

        # Attempt 1: both ranks again, as a launcher does; they restore one step.
        resumed = self.run_whole(job, attempt=1)
        start = resumed[0]["start"]
        self.assertEqual([r["start"] for r in resumed], [start] * WORLD, f"the ranks restored different steps {why}")
        self.assertGreaterEqual(start, max(committed_at_failure), f"an older step than committed was restored {why}")
        self.assertGreaterEqual(start, killed["committed_at_kill"], why)
        self.assertLessEqual(start, step_killed, f"a step newer than the kill was restored {why}")
        self.assertEqual(start % self.EVERY, 0, why)
        # Rank 0 said goodbye before it exited: no second failure counted
        # against the job's failure rate.
        status = self.ckptctl_status(job)
        died = [(f["node_id"], f["rank"]) for f in status["failures"] if f["job"] == job and f["kind"] == "trainer_died"]
        self.assertNotIn((NODES[0], 0), died, f"rank 0's exit 75 was counted as a failure {why}: {status}")
        sys.stderr.write(f"\nrank 1 killed after step {step_killed} (committed then: {committed_at_failure}); rank 0 "
                         f"told to restart at step {survivor['restart_at']}; both ranks restored step {start}\n")

        for r, (before, after) in enumerate(((survivor, resumed[0]), (killed, resumed[1]))):
            what = f"rank {r} {why}, restored step {start}"
            self.assertEqual(before["start"], 0, what)
            last = before["killed_at"] if r == 1 else before["restart_at"]
            self.assertEqual(sorted(before["steps"]), list(range(1, last + 1)), what)
            self.assertEqual(sorted(after["steps"]), list(range(start + 1, self.STEPS + 1)), what)
            for step, entry in list(before["steps"].items()) + list(after["steps"].items()):
                self.assertEqual(entry, reference[r]["steps"][step], f"loss or batch of step {step}, {what}")
            for key in ("model", "optimizer", "scheduler", "loader", "python_rng", "numpy_rng", "torch_rng"):
                self.assertTrue(_same(after["after"][key], reference[r]["after"][key]), f"{key} differs, {what}")
            for key in ("batches", "masks", "randoms"):
                self.assertTrue(_same(after[key], reference[r][key]), f"{key} differ, {what}")
            self.assertEqual(float(after["after"]["optimizer"]["state"][0]["step"]), self.STEPS, what)

        # Every rank said goodbye at its end: the run is finished (once the
        # agents' next heartbeats say so), not running with no rank.
        deadline = time.monotonic() + self.bound(10)
        while True:
            status = self.ckptctl_status(job)
            (j,) = [j for j in status["jobs"] if j["job"] == job]
            if j["state"] == "finished" or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        self.assertEqual(j["state"], "finished", f"{why}: {status}")
        self.assertEqual(j["ranks_alive"], 0, f"{why}: {status}")
        self.assertGreater(j["incarnation"], incarnation_before, f"{why}: {status}")
        self.assertGreaterEqual(j["newest_committed_step"], start, f"{why}: {status}")


if __name__ == "__main__":
    unittest.main()
