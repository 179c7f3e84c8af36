"""ckptd.export and `ckptctl export`: a step of four ranks, each holding a
slice of sharded tensors and a copy of a replicated one, written back as
whole tensors in safetensors files and compared with the global tensors the
ranks were cut from: with this file's own reader of the format, and with the
`safetensors` package from PyPI when it is installed (scripts/install-deps.sh
puts it in .tools/python; the test is skipped without it)."""

import array
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

from support import ROOT, AgentTestCase

import ckptd

CKPTCTL = os.environ.get("CKPTD_CTL") or os.path.join(ROOT, "build", "bin", "ckptctl")
_TOOLS = os.path.join(ROOT, ".tools", "python")
if os.path.isdir(_TOOLS):
    sys.path.append(_TOOLS)
try:
    import numpy as np
    from safetensors.numpy import load_file
except ImportError:
    load_file = None

WORLD = 4
JOB = "py-export"
STEP = 6
# Global tensors (row-major floats) and how they are cut.
W_SHAPE = (8, 6)  # split along dim 0: rank r holds rows 2r, 2r+1
V_SHAPE = (3, 8)  # split along dim 1: rank r holds columns 2r, 2r+1
BIAS = [0.5, -1.25, 3.0, 7.75, 1e-3, -2.0]  # replicated: every rank the same


def _global(shape, base):
    n = shape[0] * shape[1]
    return [base + i * 0.25 for i in range(n)]


def _rows(values, shape, r0, r1):
    return values[r0 * shape[1]:r1 * shape[1]]


def _cols(values, shape, c0, c1):
    return [values[i * shape[1] + j] for i in range(shape[0]) for j in range(c0, c1)]


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} and the metadata of a safetensors file,
    checking that the tensors' bytes lie back to back."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert n % 8 == 0, n
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors, end = {}, 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        assert b == end, (name, b, end)
        tensors[name] = (t["dtype"], tuple(t["shape"]), data[b:e])
        end = e
    assert end == len(data), (end, len(data))
    return tensors, meta


class ExportTest(AgentTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.w = _global(W_SHAPE, 1.0)
        cls.v = _global(V_SHAPE, -100.0)
        clients, keep = [], []
        try:
            for r in range(WORLD):
                w = array.array("f", _rows(cls.w, W_SHAPE, 2 * r, 2 * r + 2))
                v = array.array("f", _cols(cls.v, V_SHAPE, 2 * r, 2 * r + 2))
                bias = array.array("f", BIAS)
                rng = bytearray(f"rank {r} generator state".encode())
                keep += [w, v, bias, rng]
                buffers = [
                    ckptd.Buffer("layer.w", w, shape=(2, W_SHAPE[1]), global_shape=W_SHAPE, offsets=(2 * r, 0)),
                    ckptd.Buffer("layer.v", v, shape=(V_SHAPE[0], 2), global_shape=V_SHAPE, offsets=(0, 2 * r)),
                    ckptd.Buffer("layer.bias", bias),
                    ckptd.Buffer("rng", rng, component=ckptd.RNG),
                ]
                clients.append(ckptd.Client(cls.agent.socket, JOB, buffers, rank=r, world_size=WORLD))
            for c in clients:
                c.snapshot(STEP)
            for c in clients:
                c.wait_persisted(STEP, timeout=60)
        finally:
            for c in clients:
                c.close()
        cls.keep = keep

    def setUp(self):
        self.out = tempfile.mkdtemp(prefix="ckptd-export-")
        self.addCleanup(shutil.rmtree, self.out, ignore_errors=True)

    def _check_floats(self, tensors, name, shape, values):
        dtype, got_shape, data = tensors[name]
        self.assertEqual(dtype, "F32")
        self.assertEqual(got_shape, shape)
        self.assertEqual(data, array.array("f", values).tobytes(), name)

    def test_export_puts_the_slices_together(self):
        self.assertEqual(self.agent.committed_steps(JOB), [STEP])
        self.assertEqual(ckptd.export(self.agent.root, JOB, self.out), STEP)
        self.assertEqual(os.listdir(self.out), ["model.safetensors"])
        tensors, meta = read_safetensors(os.path.join(self.out, "model.safetensors"))
        self.assertEqual(meta, {"format": "pt", "ckptd.job": JOB, "ckptd.step": str(STEP)})
        self.assertEqual(sorted(tensors), ["layer.bias", "layer.v", "layer.w"])  # params only
        self._check_floats(tensors, "layer.w", W_SHAPE, self.w)
        self._check_floats(tensors, "layer.v", V_SHAPE, self.v)
        self._check_floats(tensors, "layer.bias", (len(BIAS),), BIAS)

    def test_rng_is_exported_per_rank(self):
        ckptd.export(self.agent.root, JOB, self.out, step=STEP, components=["rng"])
        tensors, _ = read_safetensors(os.path.join(self.out, "model.safetensors"))
        self.assertEqual(sorted(tensors), [f"rank{r}/rng" for r in range(WORLD)])
        for r in range(WORLD):
            self.assertEqual(tensors[f"rank{r}/rng"][0], "U8")
            self.assertEqual(tensors[f"rank{r}/rng"][2], f"rank {r} generator state".encode())

    def test_split_into_files_with_an_index(self):
        # An earlier export into the same directory leaves nothing behind
        # that a loader would take for this one, in either direction.
        ckptd.export(self.agent.root, JOB, self.out)
        ckptd.export(self.agent.root, JOB, self.out, max_file_bytes=100)
        with open(os.path.join(self.out, "model.safetensors.index.json")) as f:
            index = json.load(f)
        files = sorted(set(index["weight_map"].values()))
        self.assertEqual(sorted(os.listdir(self.out)), sorted(files + ["model.safetensors.index.json"]))
        self.assertGreater(len(files), 1)
        self.assertEqual(index["metadata"]["total_size"], 4 * (len(self.w) + len(self.v) + len(BIAS)))
        for name, file in index["weight_map"].items():
            tensors, _ = read_safetensors(os.path.join(self.out, file))
            self.assertIn(name, tensors)
        ckptd.export(self.agent.root, JOB, self.out)
        self.assertEqual(os.listdir(self.out), ["model.safetensors"])

    @unittest.skipIf(load_file is None, "the safetensors package (and numpy) is not installed")
    def test_the_safetensors_package_reads_the_export(self):
        ckptd.export(self.agent.root, JOB, self.out)
        loaded = load_file(os.path.join(self.out, "model.safetensors"))
        self.assertEqual(sorted(loaded), ["layer.bias", "layer.v", "layer.w"])
        np.testing.assert_array_equal(loaded["layer.w"], np.array(self.w, dtype=np.float32).reshape(W_SHAPE))
        np.testing.assert_array_equal(loaded["layer.v"], np.array(self.v, dtype=np.float32).reshape(V_SHAPE))
        np.testing.assert_array_equal(loaded["layer.bias"], np.array(BIAS, dtype=np.float32))

    def test_ckptctl_export(self):
        run = subprocess.run([CKPTCTL, "export", "--root", self.agent.root, "--job", JOB, "--out", self.out,
                              "--json"], capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr)
        report = json.loads(run.stdout)
        self.assertEqual(report["step"], STEP)
        self.assertEqual(report["files"], ["model.safetensors"])
        slices = {t["name"]: t["slices"] for t in report["tensors"]}
        self.assertEqual(slices, {"layer.bias": 1, "layer.v": WORLD, "layer.w": WORLD})
        shapes = {t["name"]: t["shape"] for t in report["tensors"]}
        self.assertEqual(shapes["layer.w"], list(W_SHAPE))
        # A step that does not exist, a format that does not.
        run = subprocess.run([CKPTCTL, "export", "--root", self.agent.root, "--job", JOB, "--step", "99", "--out",
                              self.out], capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 1)
        self.assertIn("has no step 99", run.stderr)
        run = subprocess.run([CKPTCTL, "export", "--root", self.agent.root, "--job", JOB, "--out", self.out,
                              "--format", "pickle"], capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 2)
        self.assertIn("--format", run.stderr)

    def test_errors(self):
        with self.assertRaises(ckptd.NotFoundError) as e:
            ckptd.export(self.agent.root, "no-such-job", self.out)
        self.assertIn("no-such-job", str(e.exception))
        with self.assertRaises(ckptd.InvalidArgumentError) as e:
            ckptd.export(self.agent.root, JOB, self.out, components=["weights"])
        self.assertIn("weights", str(e.exception))
        for bad in (dict(components=()), dict(step=-1), dict(step=True), dict(max_file_bytes=0)):
            with self.assertRaises(ckptd.InvalidArgumentError, msg=str(bad)):
                ckptd.export(self.agent.root, JOB, self.out, **bad)
        self.assertEqual(os.listdir(self.out), [])


class CkptctlLookupTest(unittest.TestCase):
    """ckptd.export runs the ckptctl found like libckptd.so: $CKPTD_CTL alone
    when set, else beside the library's build tree or installation first."""

    def setUp(self):
        environ = mock.patch.dict(os.environ)  # restored after each test
        environ.start()
        self.addCleanup(environ.stop)

    def test_ckptd_ctl_alone_when_set(self):
        missing = os.path.join(tempfile.gettempdir(), "nowhere", "ckptctl")
        os.environ["CKPTD_CTL"] = missing
        with self.assertRaises(ckptd.Error) as e:
            ckptd.export("/nonexistent", JOB, "/nonexistent-out")
        self.assertIn(f"tried {missing}. ", str(e.exception))

    def test_the_bin_beside_the_library_comes_first(self):
        os.environ.pop("CKPTD_CTL", None)
        beside = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(ckptd.library_path()))), "bin",
                              "ckptctl")
        if not os.path.exists(beside) or os.path.exists(os.path.join(os.path.dirname(ckptd.__file__), "ckptctl")):
            self.skipTest(f"no {beside}, or a ckptctl bundled with the package")
        self.assertEqual(ckptd.ckptctl(), beside)


if __name__ == "__main__":
    unittest.main()
