"""ckptd.Client: the C ABI from Python, on memory from a bytearray and a
NumPy array, against a real ckptd-agent."""

import array
import unittest

import ckptd
from support import AgentTestCase

try:
    import numpy as np
except ImportError:
    np = None


class ClientTest(AgentTestCase):
    def test_snapshot_and_restore_a_bytearray(self):
        data = bytearray(b"step one state" * 10)
        cursor = array.array("q", [7, 0])
        buffers = [ckptd.Buffer("blob", data), ckptd.Buffer("cursor", cursor, component=ckptd.DATA_CURSOR)]
        self.assertEqual(buffers[0].dtype, ckptd.BYTES)
        self.assertEqual(buffers[1].dtype, ckptd.INT64)
        with ckptd.Client(self.agent.socket, "py-bytes", buffers, every_steps=2) as client:
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
        self.assertEqual(self.agent.committed_steps("py-bytes"), [2])
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

    def test_library_is_the_built_one(self):
        self.assertTrue(ckptd.library_path().endswith("libckptd.so"), ckptd.library_path())


if __name__ == "__main__":
    unittest.main()
