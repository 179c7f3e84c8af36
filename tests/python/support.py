"""What the Python tests share: a real ckptd-agent on a temporary socket and
storage root (no coordinator: the agent commits single-rank steps itself)."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# CMake passes the binaries it built; by hand, the default build tree.
AGENT = os.environ.get("CKPTD_AGENT") or os.path.join(ROOT, "build", "bin", "ckptd-agent")


class Agent:
    """ckptd-agent in a temporary directory: start(), kill() (SIGKILL),
    start() again on the same socket and storage, cleanup()."""

    def __init__(self, extra_args=()):
        self.extra_args = list(extra_args)
        self.dir = tempfile.mkdtemp(prefix="ckptd-py-")
        self.socket = os.path.join(self.dir, "agent.sock")
        self.root = os.path.join(self.dir, "root")
        os.mkdir(self.root)
        self.proc = None
        self.log = os.path.join(self.dir, "agent.log")

    def start(self, timeout=20.0):
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([AGENT, "--storage-root", self.root, "--socket", self.socket, "--slots", "2",
                                          "--keep", "3", "--threads", "2"] + self.extra_args, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ckptd-agent exited with {self.proc.returncode}: {self.read_log()}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(self.socket)
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"ckptd-agent did not serve within {timeout}s: {self.read_log()}")

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def read_log(self):
        with open(self.log, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def committed_steps(self, job):
        d = os.path.join(self.root, job)
        if not os.path.isdir(d):
            return []
        return sorted(int(n[5:]) for n in os.listdir(d)
                      if n.startswith("step-") and os.path.exists(os.path.join(d, n, "MANIFEST")))

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class AgentTestCase(unittest.TestCase):
    """Tests that share one agent, started for the class."""

    @classmethod
    def setUpClass(cls):
        cls.agent = Agent().start()

    @classmethod
    def tearDownClass(cls):
        cls.agent.cleanup()


def run_all(fn, items, timeout=120):
    """fn(item) on a thread per item (the ranks of a restore wait for each
    other); the results in order, or the first exception raised."""
    results, errors = [None] * len(items), []

    def run(i):
        try:
            results[i] = fn(items[i])
        except Exception as e:  # noqa: BLE001 - handed to the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
    return results


def save_all(clients, step, timeout=60):
    """Every client snapshots `step`, then waits until it is persisted; all
    are closed, whatever happens."""
    try:
        for c in clients:
            c.snapshot(step)
        for c in clients:
            c.wait_persisted(step, timeout=timeout)
    finally:
        for c in clients:
            c.close()
