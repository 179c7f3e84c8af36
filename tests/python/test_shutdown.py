"""ckptd-agent stopped with SIGTERM at random moments of a persist (as
Kubernetes stops a sidecar when its pod ends): it finishes the persist if
that fits --shutdown-grace, else stops it; either way the step is committed
whole or nothing of it is left, the log says which, the agent exits in
time, and a new agent restores the newest committed step bit-exact."""

import os
import random
import signal
import threading
import time
import unittest

import ckptd
from support import Agent

GRACE_S = 0.3
# Every write (and read) of checkpoint data sleeps this long: a persist of
# the 32 MiB state below (8 writes of 4 MiB) takes about half a second.
LATENCY = "60ms"
STATE_BYTES = 32 << 20


def leftovers(root, job, step):
    """What of `step` is on disk: its files, temp files included."""
    d = os.path.join(root, job, f"step-{step}")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


class ShutdownTest(unittest.TestCase):
    def one_round(self, delay):
        agent = Agent(["--shutdown-grace", f"{int(GRACE_S * 1000)}ms", "--inject-write-latency", LATENCY]).start()
        try:
            state = bytearray(STATE_BYTES)
            client = ckptd.Client(agent.socket, "shutdown", [ckptd.Buffer("state", state)], every_steps=1,
                                  slot_wait=10.0)  # the staging is allocated in the background
            state[:] = b"\x01" * STATE_BYTES
            client.snapshot(1)
            client.wait_persisted(1, timeout=60)
            state[:] = b"\x02" * STATE_BYTES
            client.snapshot(2)
            if delay is None:  # SIGTERM once step 2 is durable
                client.wait_persisted(2, timeout=60)
            else:
                time.sleep(delay)
            start = time.monotonic()
            agent.proc.send_signal(signal.SIGTERM)
            code = agent.proc.wait(timeout=30)
            took = time.monotonic() - start
            client.close()
            log = agent.read_log()
            self.assertEqual(code, 0, log)
            # The grace period, and the time a block write already under way
            # needs to end, plus the exit.
            self.assertLess(took, GRACE_S + 2.5, log)
            committed = agent.committed_steps("shutdown")
            self.assertIn(1, committed, log)
            if 2 in committed:
                if "shutting down" in log:
                    self.assertIn("step 2 is durable", log)
                outcome = "finished"
            else:
                self.assertIn("step 2 was stopped at the end of the shutdown's grace period", log)
                self.assertIn("nothing of it is left on disk", log)
                self.assertEqual(leftovers(agent.root, "shutdown", 2), [], log)
                outcome = "stopped"
            for name in os.listdir(os.path.join(agent.root, "shutdown")):
                self.assertFalse(name.endswith(".tmp"), name)
            # A new agent on the same storage restores what is committed.
            agent.extra_args = []
            agent.start()
            state[:] = b"\x00" * STATE_BYTES
            with ckptd.Client(agent.socket, "shutdown", [ckptd.Buffer("state", state)], every_steps=1) as again:
                restored = again.restore()
            self.assertEqual(restored, 2 if outcome == "finished" else 1)
            self.assertEqual(state.count(bytes([restored])), STATE_BYTES)
            return outcome
        finally:
            agent.cleanup()

    def test_sigterm_at_random_moments_of_a_persist(self):
        rng = random.Random(int(os.environ.get("CKPTD_SHUTDOWN_SEED", "0")) or None)
        outcomes = []
        # Early (the persist cannot fit the grace period), late (it is done:
        # on a busy machine no fixed delay is sure to be late enough), and
        # random moments between.
        for delay in [0.0, None] + [rng.uniform(0.0, 1.0) for _ in range(4)]:
            with self.subTest(delay=delay if delay is None else round(delay, 3)):
                outcomes.append(self.one_round(delay))
        self.assertIn("stopped", outcomes)
        self.assertIn("finished", outcomes)

    def test_a_restore_that_outlasts_the_grace_period_does_not_keep_the_agent_alive(self):
        """A restore reading from a disk that answers each read after 30 s:
        SIGTERM with no grace, and the agent still exits 5 s after the grace
        period (before a supervisor's SIGKILL), saying why."""
        agent = Agent()
        try:
            agent.start()
            state = bytearray(b"\x07" * (1 << 20))
            with ckptd.Client(agent.socket, "held", [ckptd.Buffer("state", state)], every_steps=1,
                              slot_wait=10.0) as client:
                client.snapshot(1)
                client.wait_persisted(1, timeout=60)
            agent.stop()
            self.assertIn(1, agent.committed_steps("held"), agent.read_log())
            agent.extra_args = ["--shutdown-grace", "0s", "--inject-write-latency", "30s"]
            agent.start()
            errors = []

            def restore():
                try:
                    with ckptd.Client(agent.socket, "held", [ckptd.Buffer("state", state)], slot_wait=10.0,
                                      rpc_timeout=120.0) as again:
                        again.restore()
                except ckptd.Error as e:  # the agent went away under it
                    errors.append(e)

            thread = threading.Thread(target=restore, daemon=True)
            thread.start()
            # The restore is reading (each read waits 30 s) once the shard is opened.
            deadline = time.monotonic() + 20
            while "staging ready" not in agent.read_log() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)
            start = time.monotonic()
            agent.proc.send_signal(signal.SIGTERM)
            code = agent.proc.wait(timeout=60)
            took = time.monotonic() - start
            log = agent.read_log()
            self.assertEqual(code, 1, log)
            self.assertGreaterEqual(took, 4.5, log)
            self.assertLess(took, 15, log)
            self.assertIn("still stopping 5s after --shutdown-grace ended", log)
            self.assertIn("exiting now", log)
            thread.join(timeout=150)
            self.assertFalse(thread.is_alive())
            # What was committed is untouched.
            self.assertIn(1, agent.committed_steps("held"), log)
        finally:
            agent.cleanup()


if __name__ == "__main__":
    unittest.main()
