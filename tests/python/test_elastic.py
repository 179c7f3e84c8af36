"""Elastic restore through a lone agent (every rank on its node): a job of N
ranks saves slices of sharded tensors, then restarts with M ranks whose
buffers declare their new slices; each rank gets exactly the global tensor's
elements of its slice, read resharded from the N saved shards. 4 -> 3 -> 2
-> 4 ranks in a row (each step saved by the world before), a change of the
sharded dimension with the same number of ranks, and registrations that do
not fit the saved tensors."""

import array
import os
import random
import subprocess
import unittest

from support import ROOT, AgentTestCase, run_all, save_all

import ckptd

W_SHAPE = (10, 6)  # split along dim 0 (uneven for 3 and 4 ranks)
V_SHAPE = (3, 8)  # split along dim 1
BIAS_LEN = 6


def _split(n, parts):
    """[(start, length)] of `parts` near-equal pieces of n, larger first."""
    base, extra = divmod(n, parts)
    out, at = [], 0
    for p in range(parts):
        size = base + (1 if p < extra else 0)
        out.append((at, size))
        at += size
    return out


def _global(shape, base):
    return [base + i * 0.5 for i in range(shape[0] * shape[1])]


def _box(values, shape, rows, cols):
    """The dense bytes of rows x cols ((start, length) each) of a 2-D tensor."""
    return [values[i * shape[1] + j] for i in range(rows[0], rows[0] + rows[1])
            for j in range(cols[0], cols[0] + cols[1])]


class _Rank:
    """One rank's buffers for world `world`: its slice of W (rows) and of V
    (columns, or rows with by_rows_v), a replicated bias, RNG bytes, a cursor."""

    def __init__(self, rank, world, state, by_rows_v=False):
        self.rank, self.world = rank, world
        self.w_rows = _split(W_SHAPE[0], world)[rank]
        self.w_cols = (0, W_SHAPE[1])
        if by_rows_v:
            self.v_rows, self.v_cols = _split(V_SHAPE[0], world)[rank], (0, V_SHAPE[1])
        else:
            self.v_rows, self.v_cols = (0, V_SHAPE[0]), _split(V_SHAPE[1], world)[rank]
        if state is None:  # empty buffers, to restore into
            self.w = array.array("f", [0.0] * (self.w_rows[1] * self.w_cols[1]))
            self.v = array.array("f", [0.0] * (self.v_rows[1] * self.v_cols[1]))
            self.bias = array.array("f", [0.0] * BIAS_LEN)
            self.rng = bytearray(16)
            self.cursor = array.array("q", [0, 0])
        else:
            w, v, bias, step = state
            self.w = array.array("f", _box(w, W_SHAPE, self.w_rows, self.w_cols))
            self.v = array.array("f", _box(v, V_SHAPE, self.v_rows, self.v_cols))
            self.bias = array.array("f", bias)
            self.rng = bytearray(f"rng r{rank:02d} s{step:05d}".encode().ljust(16, b"."))
            self.cursor = array.array("q", [step, rank])

    def buffers(self):
        return [
            ckptd.Buffer("w", self.w, shape=(self.w_rows[1], self.w_cols[1]), global_shape=W_SHAPE,
                         offsets=(self.w_rows[0], self.w_cols[0])),
            ckptd.Buffer("v", self.v, shape=(self.v_rows[1], self.v_cols[1]), global_shape=V_SHAPE,
                         offsets=(self.v_rows[0], self.v_cols[0])),
            ckptd.Buffer("bias", self.bias),
            ckptd.Buffer("rng", self.rng, component=ckptd.RNG),
            ckptd.Buffer("cursor", self.cursor, component=ckptd.DATA_CURSOR),
        ]


class ElasticRestoreTest(AgentTestCase):
    def _state(self, step):
        return _global(W_SHAPE, step), _global(V_SHAPE, -step), [step + b for b in range(BIAS_LEN)], step

    def _save(self, job, world, step, by_rows_v=False):
        ranks = [_Rank(r, world, self._state(step), by_rows_v) for r in range(world)]
        clients = [ckptd.Client(self.agent.socket, job, r.buffers(), rank=r.rank, world_size=world) for r in ranks]
        save_all(clients, step)

    def _restore(self, job, world, by_rows_v=False):
        """Restores `world` ranks at once: their _Rank objects and clients (open)."""
        ranks = [_Rank(r, world, None, by_rows_v) for r in range(world)]
        clients = [ckptd.Client(self.agent.socket, job, r.buffers(), rank=r.rank, world_size=world) for r in ranks]
        self.addCleanup(lambda: [c.close() for c in clients])
        steps = run_all(lambda c: c.restore(), clients)
        return ranks, clients, steps

    def _check(self, ranks, step, saved_world):
        w, v, bias, _ = self._state(step)
        for r in ranks:
            with self.subTest(rank=r.rank, world=r.world):
                self.assertEqual(list(r.w), _box(w, W_SHAPE, r.w_rows, r.w_cols))
                self.assertEqual(list(r.v), _box(v, V_SHAPE, r.v_rows, r.v_cols))
                self.assertEqual(list(r.bias), bias)
                # Each rank's own: rank r's, or for a rank the saved world
                # did not have, rank r mod that world's.
                src = r.rank % saved_world
                self.assertEqual(bytes(r.rng), f"rng r{src:02d} s{step:05d}".encode().ljust(16, b"."))
                self.assertEqual(list(r.cursor), [step, src])

    def test_four_to_three_to_two_to_four(self):
        job = "elastic-chain"
        self._save(job, 4, 10)
        ranks, clients, steps = self._restore(job, 3)
        self.assertEqual(steps, [10] * 3)
        self._check(ranks, 10, 4)
        self.assertEqual({c.restore_source() for c in clients}, {"storage-root"})
        for c in clients:
            c.close()
        # The three ranks go on and save; two ranks restore that.
        self._save(job, 3, 20)
        ranks, clients, steps = self._restore(job, 2)
        self.assertEqual(steps, [20] * 2)
        self._check(ranks, 20, 3)
        for c in clients:
            c.close()
        self._save(job, 2, 30)
        ranks, clients, steps = self._restore(job, 4)
        self.assertEqual(steps, [30] * 4)
        self._check(ranks, 30, 2)

    def test_the_sharded_dimension_changes_with_the_same_world(self):
        job = "elastic-resplit"
        self._save(job, 3, 7)  # V by columns
        ranks, clients, steps = self._restore(job, 3, by_rows_v=True)  # V by rows
        self.assertEqual(steps, [7] * 3)
        self._check(ranks, 7, 3)
        self.assertEqual({c.restore_source() for c in clients}, {"storage-root"})

    def test_a_registration_that_does_not_fit_fails_naming_the_buffer(self):
        job = "elastic-misfit"
        self._save(job, 2, 5)
        ranks = [_Rank(r, 3, None) for r in range(3)]
        clients = []
        for r in ranks:
            buffers = r.buffers()
            # W of another global shape (one more row) on every rank.
            rows = _split(W_SHAPE[0] + 1, 3)[r.rank]
            r.w = array.array("f", [0.0] * (rows[1] * W_SHAPE[1]))
            buffers[0] = ckptd.Buffer("w", r.w, shape=(rows[1], W_SHAPE[1]), global_shape=(W_SHAPE[0] + 1, W_SHAPE[1]),
                                      offsets=(rows[0], 0))
            clients.append(ckptd.Client(self.agent.socket, job, buffers, rank=r.rank, world_size=3))
        self.addCleanup(lambda: [c.close() for c in clients])
        with self.assertRaises(ckptd.FailedPreconditionError) as e:
            run_all(lambda c: c.restore(), clients)
        self.assertIn("'w'", str(e.exception))
        self.assertIn("global shape [11, 6]", str(e.exception))
        # Nothing was quarantined: the step stays for a registration that fits.
        self.assertEqual(self.agent.committed_steps(job), [5])
        for c in clients:
            c.close()
        ranks, clients, steps = self._restore(job, 3)
        self.assertEqual(steps, [5] * 3)
        self._check(ranks, 5, 2)


class ReplicatedStateTest(AgentTestCase):
    """Replicated state written once: the ranks of a data-parallel job hold
    the same weights, declare them replicated over their group, and the group
    writes them once (each rank a share of the rows); every rank restores all
    of them, on the same world or another."""

    ROWS, COLS = 64, 1024  # 256 KiB of float32 weights, incompressible

    def _weights(self, step):
        return random.Random(step).randbytes(self.ROWS * self.COLS * 4)

    def _buffers(self, rank, world, weights, rng, replicated=True):
        group = ckptd.Replica("dp", world, rank) if replicated else None
        return [ckptd.Buffer("w", weights, dtype=ckptd.FLOAT32, shape=(self.ROWS, self.COLS), replica=group),
                ckptd.Buffer("rng", rng, component=ckptd.RNG)]

    def _save(self, job, world, step, replicated=True):
        weights = self._weights(step)
        state = [(bytearray(weights), bytearray(f"rng {r} {step}".encode().ljust(16, b"."))) for r in range(world)]
        clients = [ckptd.Client(self.agent.socket, job, self._buffers(r, world, *state[r], replicated), rank=r,
                                world_size=world) for r in range(world)]
        save_all(clients, step)
        folder = os.path.join(self.agent.root, job, f"step-{step}")
        return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".shard"))

    def _restore_and_check(self, job, world, step, saved_world, replicated=True):
        state = [(bytearray(self.ROWS * self.COLS * 4), bytearray(16)) for _ in range(world)]
        clients = [ckptd.Client(self.agent.socket, job, self._buffers(r, world, *state[r], replicated), rank=r,
                                world_size=world) for r in range(world)]
        self.addCleanup(lambda: [c.close() for c in clients])
        self.assertEqual(run_all(lambda c: c.restore(), clients), [step] * world)
        weights = self._weights(step)
        for r in range(world):
            with self.subTest(rank=r, world=world):
                self.assertEqual(bytes(state[r][0]), weights)
                self.assertEqual(bytes(state[r][1]), f"rng {r % saved_world} {step}".encode().ljust(16, b"."))
        sources = {c.restore_source() for c in clients}
        for c in clients:
            c.close()
        return sources

    def test_four_ranks_write_a_quarter_and_restore_on_four_two_and_three(self):
        everyone = self._save("dp-every-copy", 4, 10, replicated=False)
        once = self._save("dp-once", 4, 10)
        # Each of the four wrote a quarter of the weights instead of all of them.
        self.assertLess(once, 0.3 * everyone, (once, everyone))
        # Back on four ranks (the agent's memory or the disk: all of it either way).
        self._restore_and_check("dp-once", 4, 10, 4)
        # On two ranks, a group of two.
        self.assertEqual(self._restore_and_check("dp-once", 2, 10, 4), {"storage-root"})
        # On three ranks that do not declare the weights replicated: they get
        # them whole all the same.
        self._restore_and_check("dp-once", 3, 10, 4, replicated=False)
        self.assertIn("read resharded", self.agent.read_log())

    def test_a_group_is_checked(self):
        w, rng = bytearray(self.ROWS * self.COLS * 4), bytearray(16)
        with self.assertRaises(ckptd.InvalidArgumentError):
            ckptd.Buffer("w", w, dtype=ckptd.FLOAT32, shape=(self.ROWS, self.COLS), replica=ckptd.Replica("dp", 2, 2))
        with self.assertRaises(ckptd.InvalidArgumentError):
            ckptd.Buffer("w", w, dtype=ckptd.FLOAT32, shape=(self.ROWS, self.COLS), replica=ckptd.Replica("", 2, 0))
        with self.assertRaises(TypeError):
            ckptd.Buffer("w", w, dtype=ckptd.FLOAT32, shape=(self.ROWS, self.COLS), replica="dp")
        # A group larger than the job: the agent refuses the registration.
        with self.assertRaises(ckptd.InvalidArgumentError) as e:
            ckptd.Client(self.agent.socket, "dp-misfit", self._buffers(0, 1, w, rng)[:1] + [
                ckptd.Buffer("v", bytearray(8), replica=ckptd.Replica("dp", 2, 0))], rank=0, world_size=1)
        self.assertIn("larger than the job's world of 1", str(e.exception))


TRAINER = os.environ.get("CKPTD_DEMO_TRAINER") or os.path.join(ROOT, "build", "bin", "ckptd-demo-trainer")


class DemoTrainerElasticTest(AgentTestCase):
    """ckptd-demo-trainer --sharded: one model split over the ranks; a job
    checkpointed by four ranks finishes on three (a node lost with no
    spare), then on five, and ends where an uninterrupted run of four ends:
    the sum of the ranks' digests."""

    STATE_MB = 1  # 65536 elements of each array, all ranks together

    def _run(self, job, world, steps, every):
        procs = [subprocess.Popen([TRAINER, "--socket", self.agent.socket, "--job", job, "--steps", str(steps),
                                   "--state-mb", str(self.STATE_MB), "--rank", str(r), "--world-size", str(world),
                                   "--every", str(every), "--accum", "7", "--sharded"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
        total, errs = 0, []
        for p in procs:
            out, err = p.communicate(timeout=120)
            errs.append(err)
            self.assertEqual(p.returncode, 0, err)
            last = out.strip().splitlines()[-1]
            self.assertTrue(last.startswith(f"final_step={steps} digest="), last)
            total = (total + int(last.split()[1].split("=")[1], 16)) % (1 << 64)
        return total, errs

    def test_the_job_finishes_on_fewer_and_then_more_ranks(self):
        reference, _ = self._run("demo-reference", 4, 90, every=0)
        # The same job with two restarts on other numbers of ranks; 7
        # micro-batches per optimizer step, so the restores land mid-accumulation.
        _, errs = self._run("demo-elastic", 4, 30, every=10)
        self.assertEqual(self.agent.committed_steps("demo-elastic"), [10, 20, 30])
        total, errs = self._run("demo-elastic", 3, 60, every=10)
        self.assertTrue(all("restored step 30" in e for e in errs), errs)
        total, errs = self._run("demo-elastic", 5, 90, every=10)
        self.assertTrue(all("restored step 60" in e for e in errs), errs)
        self.assertEqual(total, reference)
        self.assertIn("(saved by 3 ranks) read resharded", self.agent.read_log())

    def test_the_digest_depends_on_every_element(self):
        # A different number of steps changes the job's digest: the sums compare state, not nothing.
        a, _ = self._run("demo-digest-a", 2, 20, every=0)
        b, _ = self._run("demo-digest-b", 3, 21, every=0)
        c, _ = self._run("demo-digest-c", 3, 20, every=0)
        self.assertNotEqual(a, b)
        self.assertEqual(a, c)


if __name__ == "__main__":
    unittest.main()
