"""ckptd.Client: the C ABI from Python, on memory from a bytearray and a
NumPy array, against a real ckptd-agent."""

import array
import os
import unittest

import ckptd
from support import AgentTestCase

try:
    import numpy as np
except ImportError:
    np = None


class _Index:
    """An integer that is not an int (as NumPy's and torch's): operator.index."""

    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


class ClientTest(AgentTestCase):
    def test_the_first_snapshot_of_a_large_state_waits_for_its_staging(self):
        # Above the agent's 64 MiB allocated at registration: its slots are
        # allocated in the background, and a snapshot asked for by its step
        # right after connecting waits for one instead of being skipped.
        data = bytearray(b"\x05" * (96 << 20))
        with ckptd.Client(self.agent.socket, "py-large", [ckptd.Buffer("w", data)], slot_wait=0.0) as client:
            self.assertGreaterEqual(client.snapshot(1), 0.0)
            client.wait_persisted(1, timeout=60)
            # The schedule's snapshot: skipped or taken, never an error
            # other than ResourceExhaustedError.
            try:
                client.snapshot(2, scheduled=True)
            except ckptd.ResourceExhaustedError as e:
                self.assertIn("snapshot of step 2 skipped", str(e))
        self.assertIn(1, self.agent.committed_steps("py-large"))
        with self.assertRaises(ckptd.InvalidArgumentError):
            ckptd.Client(self.agent.socket, "py-large", [ckptd.Buffer("w", data)], prepare_wait=-1.0)

    def test_snapshot_and_restore_a_bytearray(self):
        data = bytearray(b"step one state" * 10)
        cursor = array.array("q", [7, 0])
        buffers = [ckptd.Buffer("blob", data), ckptd.Buffer("cursor", cursor, component=ckptd.DATA_CURSOR)]
        self.assertEqual(buffers[0].dtype, ckptd.BYTES)
        self.assertEqual(buffers[1].dtype, ckptd.INT64)
        with ckptd.Client(self.agent.socket, "py-bytes", buffers, every_steps=2) as client:
            self.assertEqual(client.restore_source(), "")
            self.assertIsNone(client.restore())  # nothing committed yet
            self.assertFalse(client.should_snapshot(1))
            self.assertTrue(client.should_snapshot(2))
            self.assertGreaterEqual(client.snapshot(2), 0.0)
            client.wait_persisted(2, timeout=30)
            self.assertFalse(client.restart_requested())
            saved = bytes(data)
            data[:] = b"x" * len(data)
            cursor[0] = 99
            self.assertEqual(client.restore(), 2)
            self.assertEqual(bytes(data), saved)
            self.assertEqual(cursor[0], 7)
            # The agent kept the step it persisted in memory.
            self.assertEqual(client.restore_source(), "memory")
            # No coordinator: nothing to be told of the restore.
            self.assertEqual(client.restore_warning(), "")
        self.assertEqual(self.agent.committed_steps("py-bytes"), [2])
        # A restarted trainer (a new client, the same buffers) gets it from there too.
        data[:] = b"y" * len(data)
        with ckptd.Client(self.agent.socket, "py-bytes", buffers, every_steps=2) as client:
            self.assertEqual(client.restore(), 2)
            self.assertEqual(bytes(data), saved)
            self.assertEqual(client.restore_source(), "memory")
        # The buffer's memory stays exported while the Buffer lives.
        with self.assertRaises(BufferError):
            data.append(0)

    @unittest.skipIf(np is None, "numpy is not installed")
    def test_snapshot_and_restore_numpy_arrays(self):
        weights = np.arange(24, dtype=np.float32).reshape(4, 6)
        steps = np.zeros(3, dtype=np.int32)
        buffers = [ckptd.Buffer("weights", weights), ckptd.Buffer("steps", steps, component="optimizer")]
        self.assertEqual((buffers[0].dtype, buffers[0].shape), (ckptd.FLOAT32, (4, 6)))
        self.assertEqual(buffers[1].component, ckptd.OPTIMIZER)
        with ckptd.Client(self.agent.socket, "py-numpy", buffers) as client:
            client.snapshot(5)
            client.wait_persisted(5, timeout=30)
            expected = weights.copy()
            weights += 1
            steps[:] = 4
            self.assertEqual(client.restore(), 5)
            np.testing.assert_array_equal(weights, expected)
            np.testing.assert_array_equal(steps, 0)
        # A layout that differs is refused, naming the buffer.
        other = [ckptd.Buffer("weights", np.zeros((4, 5), dtype=np.float32)), ckptd.Buffer("steps", steps)]
        with ckptd.Client(self.agent.socket, "py-numpy", other) as client:
            with self.assertRaises(ckptd.FailedPreconditionError) as e:
                client.restore()
            self.assertIn("buffer 'weights'", str(e.exception))
            self.assertEqual(e.exception.code, 9)

    def test_persist_failures_reach_the_client(self):
        job = "py-persist-failures"
        blocker = os.path.join(self.agent.root, job)
        with open(blocker, "w"):  # a file where the job's folder goes: every persist fails
            pass
        data = bytearray(64)
        with ckptd.Client(self.agent.socket, job, [ckptd.Buffer("blob", data)]) as client:
            self.assertEqual(client.persist_failures(), ckptd.PersistFailures(0, None, ""))
            client.snapshot(3)
            with self.assertRaises(ckptd.AbortedError) as e:
                client.wait_persisted(3, timeout=30)
            self.assertIn("persisting step 3 failed", str(e.exception))
            f = client.persist_failures()  # WaitPersisted refreshed it
            self.assertEqual((f.failed, f.last_failed_step), (1, 3))
            self.assertIn(job, f.last_error)
            os.unlink(blocker)
            client.snapshot(4)
            client.wait_persisted(4, timeout=30)
            self.assertEqual(client.persist_failures().failed, 1)
        self.assertEqual(self.agent.committed_steps(job), [4])

    def test_errors_carry_the_c_message(self):
        data = bytearray(8)
        with self.assertRaises(ckptd.UnavailableError) as e:
            ckptd.Client(self.agent.dir + "/nothing.sock", "job", [ckptd.Buffer("x", data)], rpc_timeout=0.5)
        self.assertIn("nothing.sock", str(e.exception))
        self.assertIsInstance(e.exception, ConnectionError)
        with self.assertRaises(ckptd.InvalidArgumentError) as e:
            ckptd.Client(self.agent.socket, "-bad job", [ckptd.Buffer("x", data)])
        self.assertIn("job name", str(e.exception))
        self.assertEqual(e.exception.code, 3)
        with self.assertRaises(ckptd.InvalidArgumentError):
            ckptd.Buffer("ro", b"read-only bytes")
        with self.assertRaises(ckptd.InvalidArgumentError):
            ckptd.Buffer("x", bytearray(10), dtype=ckptd.FLOAT32, shape=(3,))
        client = ckptd.Client(self.agent.socket, "py-closed", [ckptd.Buffer("x", data)])
        client.close()
        client.close()
        with self.assertRaises(ckptd.InvalidArgumentError):
            client.snapshot(1)

    def test_a_socket_of_another_user_is_refused_unless_trusted(self):
        # Socket squatting: the socket's name taken by another user, who
        # would receive this trainer's state. Refused, naming the owner.
        other = 61999
        if os.geteuid() != 0:
            self.skipTest("not root: cannot give the socket to another user")
        data = bytearray(8)
        os.chown(self.agent.socket, other, -1)
        try:
            with self.assertRaises(ckptd.PermissionDeniedError) as e:
                ckptd.Client(self.agent.socket, "py-trust", [ckptd.Buffer("x", data)], connect_wait=3600)
            self.assertIn(f"belongs to uid {other}", str(e.exception))
            self.assertIn(f"CKPTD_TRUSTED_AGENT_UIDS={other}", str(e.exception))
            self.assertIsInstance(e.exception, PermissionError)
            with ckptd.Client(self.agent.socket, "py-trust", [ckptd.Buffer("x", data)],
                              trusted_agent_uids=[other]) as client:
                client.snapshot(1)
        finally:
            os.chown(self.agent.socket, 0, -1)
        with self.assertRaises(ckptd.InvalidArgumentError):
            ckptd.Client(self.agent.socket, "py-trust", [ckptd.Buffer("x", data)],
                         trusted_agent_uids=["no-such-user-ckptd"])
        with self.assertRaises(ckptd.InvalidArgumentError):
            ckptd.Client(self.agent.socket, "py-trust", [ckptd.Buffer("x", data)], trusted_agent_uids=[-1])

    def test_no_socket_means_ckptd_socket_from_the_environment(self):
        data = bytearray(8)
        old = os.environ.get("CKPTD_SOCKET")
        os.environ["CKPTD_SOCKET"] = self.agent.socket
        try:
            with ckptd.Client(None, "py-env-socket", [ckptd.Buffer("x", data)]) as client:
                client.snapshot(1)
        finally:
            if old is None:
                del os.environ["CKPTD_SOCKET"]
            else:
                os.environ["CKPTD_SOCKET"] = old

    def test_integers_out_of_range_raise_instead_of_wrapping(self):
        # ctypes truncates: without the checks, rank 2**32 registered as rank 0,
        # world_size 2**32 + 1 as 1, every_steps 2**64 + 2 as 2 and step -1 as
        # 2**64 - 1, all without an error.
        data = bytearray(8)

        def client(**kw):
            return ckptd.Client(self.agent.socket, "py-range", [ckptd.Buffer("x", data)], **kw)

        for kw, name, allowed in [
                (dict(rank=2**32, world_size=1), "rank", "from 0 to 4294967295 (uint32_t); got 4294967296"),
                (dict(rank=-1), "rank", "from 0 to 4294967295 (uint32_t); got -1"),
                (dict(world_size=2**32 + 1), "world_size", "from 1 to 4294967295 (uint32_t)"),
                (dict(world_size=0), "world_size", "from 1 to 4294967295"),
                (dict(rank=3, world_size=3), "rank", "from 0 to world_size - 1 = 2; got 3"),
                (dict(every_steps=2**64 + 2), "every_steps", "from 0 to 18446744073709551615 (uint64_t)"),
                (dict(every_steps=-2), "every_steps", "(uint64_t); got -2"),
                (dict(slot_wait=-0.5), "slot_wait", "0 or more; got -0.5"),
                (dict(rpc_timeout=0), "rpc_timeout", "greater than 0"),
                (dict(rpc_timeout=float("nan")), "rpc_timeout", "finite"),
                (dict(rpc_timeout=1e17), "rpc_timeout", "(int64_t milliseconds)"),
                (dict(connect_wait=-1), "connect_wait", "0 or more")]:
            with self.subTest(**kw):
                with self.assertRaises(ValueError) as e:
                    client(**kw)
                self.assertIsInstance(e.exception, ckptd.InvalidArgumentError)
                self.assertIn(f"{name} must be", str(e.exception))
                self.assertIn(allowed, str(e.exception))
        with self.assertRaisesRegex(TypeError, "rank must be an integer, not float"):
            client(rank=1.0)
        self.assertEqual(self.agent.committed_steps("py-range"), [])

        # numpy-style integers are integers.
        with client(rank=_Index(0), every_steps=_Index(2)) as c:
            for step in (-1, 2**64, 2**64 + 2):
                with self.subTest(step=step):
                    with self.assertRaisesRegex(ckptd.InvalidArgumentError,
                                                r"step must be from 0 to 18446744073709551615 \(uint64_t\); "
                                                f"got {step}$"):
                        c.should_snapshot(step)
                    with self.assertRaises(ValueError):
                        c.snapshot(step)
                    with self.assertRaises(ValueError):
                        c.wait_persisted(step, timeout=1)
            with self.assertRaisesRegex(ValueError, "timeout must be a finite number of seconds 0 or more; got -1"):
                c.wait_persisted(0, timeout=-1)
            self.assertTrue(c.should_snapshot(2))
            self.assertFalse(c.should_snapshot(3))
            c.snapshot(4)
            c.wait_persisted(4, timeout=30)
        self.assertEqual(self.agent.committed_steps("py-range"), [4])  # no step 2**64 - 1

    def test_buffer_numbers_are_checked_before_they_reach_c(self):
        data = bytearray(16)
        with self.assertRaisesRegex(ckptd.InvalidArgumentError, r"buffer 'x': shape\[0\] must be from 0 to "
                                    r"18446744073709551615 \(uint64_t\); got -1"):
            ckptd.Buffer.at("x", 1 << 20, ckptd.FLOAT32, (-1, -2))  # 4 * -1 * -2 = 8 bytes, once
        with self.assertRaisesRegex(ckptd.InvalidArgumentError, r"offsets\[0\] must be from 0 .*; got -1"):
            ckptd.Buffer("x", data, global_shape=(32,), offsets=(-1,))
        # libckptd reads ndim entries of global_shape and offsets.
        with self.assertRaisesRegex(ckptd.InvalidArgumentError, "global_shape has 2 entries, the shape 1"):
            ckptd.Buffer("x", data, global_shape=(16, 2), offsets=(0, 0))
        with self.assertRaisesRegex(ckptd.InvalidArgumentError, "offsets has 0 entries, the shape 1"):
            ckptd.Buffer("x", data, global_shape=(32,), offsets=())
        with self.assertRaisesRegex(ckptd.InvalidArgumentError, "address must be from 0"):
            ckptd.Buffer.at("x", -8, ckptd.UINT8, (4,))
        with self.assertRaisesRegex(ckptd.InvalidArgumentError, r"device_index must be from 0 to 2147483647 \(int\)"):
            ckptd.Buffer.at("x", 8, ckptd.UINT8, (4,), device_kind=ckptd.DEVICE_CUDA, device_index=2**32)
        with self.assertRaisesRegex(ckptd.InvalidArgumentError, "device_kind must be"):
            ckptd.Buffer.at("x", 8, ckptd.UINT8, (4,), device_kind=2**32 + 1)
        with self.assertRaisesRegex(ckptd.InvalidArgumentError, "component 4294967297 is none of"):
            ckptd.Buffer("x", data, component=2**32 + 1)
        with self.assertRaisesRegex(ckptd.InvalidArgumentError, "unknown dtype 4294967298"):
            ckptd.Buffer("x", data, dtype=2**32 + 2)
        sharded = ckptd.Buffer("x", data, global_shape=(32,), offsets=(16,))
        self.assertEqual((sharded.shape, sharded.global_shape, sharded.offsets), ((16,), (32,), (16,)))

    def test_library_is_the_built_one(self):
        self.assertTrue(ckptd.library_path().endswith("libckptd.so"), ckptd.library_path())


if __name__ == "__main__":
    unittest.main()
