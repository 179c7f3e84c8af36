"""ckptd.torch across a change of world size: DTensor-sharded state (here
duck-typed stand-ins for torch.distributed's DTensor, Shard and Replicate,
which Debian's torch 1.13 lacks; ckptd.torch recognizes DTensors by their
interface) saved by N Checkpointers and restored by M, each rank receiving
its new shard; replicated state and the data position carried over; RNG
streams of ranks the saved world did not have derived from the job's seed,
the step and the rank (docs/elastic.md)."""

import os
import unittest

from support import AgentTestCase, run_all

try:
    import torch
    import ckptd
    import ckptd.torch as ckt
except ImportError:
    torch = None

ROWS, COLS = 10, 4


class Shard:
    def __init__(self, dim):
        self.dim = dim

    def is_shard(self):
        return True

    def is_replicate(self):
        return False

    def __repr__(self):
        return f"Shard({self.dim})"


class Replicate:
    def is_shard(self):
        return False

    def is_replicate(self):
        return True


class Partial:
    def is_shard(self):
        return False

    def is_replicate(self):
        return False

    def __repr__(self):
        return "Partial()"


class Mesh:
    def __init__(self, sizes, coordinate):
        self.sizes, self.coordinate = sizes, coordinate

    def size(self, dim):
        return self.sizes[dim]

    def get_coordinate(self):
        return self.coordinate


class FakeDTensor:
    """What ckptd.torch uses of a DTensor: the global shape and dtype, the
    mesh, the placements and the local shard."""

    def __init__(self, local, global_shape, mesh, placements):
        self.local, self.shape, self.dtype = local, torch.Size(global_shape), local.dtype
        self.device_mesh, self.placements = mesh, placements

    def to_local(self):
        return self.local


def _chunk(n, parts, k):
    """torch.chunk's piece k of n in `parts`: (start, length)."""
    size = -(-n // parts)
    start = min(n, size * k)
    return start, min(n, start + size) - start


def _global(step):
    return torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS) + 1000.0 * step


class ShardedModel:
    """A row-sharded weight over a 1-D mesh of `world` ranks (FSDP2's
    Shard(0)) and a bias every rank holds whole."""

    def __init__(self, rank, world, step=None):
        start, length = _chunk(ROWS, world, rank)
        self.rows = (start, length)
        local = _global(step)[start:start + length].clone() if step is not None else torch.zeros(length, COLS)
        self.weight = FakeDTensor(local, (ROWS, COLS), Mesh([world], [rank]), [Shard(0)])
        self.bias = torch.full((COLS,), float(step if step is not None else 0))
        self.loaded = None

    def state_dict(self):
        return {"weight": self.weight, "bias": self.bias}

    def load_state_dict(self, sd):
        self.loaded = sd
        self.bias.copy_(sd["bias"])


@unittest.skipIf(torch is None, "torch is not installed")
class DTensorSliceTest(unittest.TestCase):
    def test_nested_and_two_dimensional_meshes(self):
        # A 2 x 2 mesh sharding rows then columns: coordinate (1, 0).
        t = FakeDTensor(torch.zeros(5, 3), (10, 6), Mesh([2, 2], [1, 0]), [Shard(0), Shard(1)])
        local, shape, offsets = ckt._dtensor_slice(t, "w")
        self.assertEqual((shape, offsets), ([10, 6], [5, 0]))
        # Both mesh dimensions split rows (nested): coordinate (1, 1) of 2 x 2:
        # rows 5..9, then its second half 8..9 (chunks of ceil(5/2) = 3).
        t = FakeDTensor(torch.zeros(2, 6), (10, 6), Mesh([2, 2], [1, 1]), [Shard(0), Shard(0)])
        self.assertEqual(ckt._dtensor_slice(t, "w")[1:], ([10, 6], [8, 0]))
        # Replicated over the first mesh dimension, sharded over the second.
        t = FakeDTensor(torch.zeros(10, 2), (10, 6), Mesh([2, 3], [1, 2]), [Replicate(), Shard(-1)])
        self.assertEqual(ckt._dtensor_slice(t, "w")[1:], ([10, 6], [0, 4]))

    def test_the_replica_group_of_a_shard(self):
        # Replicated over the first mesh dimension (HSDP's data-parallel one),
        # sharded over the second: the two ranks of coordinates (*, 2) hold
        # the same shard; this one is the second of them.
        t = FakeDTensor(torch.zeros(10, 2), (10, 6), Mesh([2, 3], [1, 2]), [Replicate(), Shard(-1)])
        self.assertEqual(ckt._dtensor_replica(t), ckptd.Replica("mesh:0", 2, 1))
        t.device_mesh.mesh_dim_names = ("dp", "tp")
        self.assertEqual(ckt._dtensor_replica(t).group, "mesh:dp")
        # Replicated over a 2 x 2 mesh: a group of four, places in row-major order.
        t = FakeDTensor(torch.zeros(10, 6), (10, 6), Mesh([2, 2], [1, 0]), [Replicate(), Replicate()])
        self.assertEqual(ckt._dtensor_replica(t), ckptd.Replica("mesh:0,1", 4, 2))
        # Sharded only, or replicated over a mesh dimension of one rank: nobody else holds it.
        self.assertIsNone(ckt._dtensor_replica(FakeDTensor(torch.zeros(5, 6), (10, 6), Mesh([2], [0]), [Shard(0)])))
        self.assertIsNone(ckt._dtensor_replica(
            FakeDTensor(torch.zeros(5, 6), (10, 6), Mesh([1, 2], [0, 0]), [Replicate(), Shard(0)])))

    def test_what_cannot_be_checkpointed(self):
        t = FakeDTensor(torch.zeros(10, 6), (10, 6), Mesh([2], [0]), [Partial()])
        with self.assertRaisesRegex(TypeError, "Partial"):
            ckt._dtensor_slice(t, "w")
        t = FakeDTensor(torch.zeros(4, 6), (10, 6), Mesh([2], [0]), [Shard(0)])  # chunk would be 5 rows
        with self.assertRaisesRegex(ValueError, r"local shard is \[4, 6\], not the \[5, 6\]"):
            ckt._dtensor_slice(t, "w")
        t = FakeDTensor(torch.zeros(5, 6), (10, 6), Mesh([2], None), [Shard(0)])
        t.device_mesh.coordinate = None
        with self.assertRaisesRegex(ValueError, "not part of"):
            ckt._dtensor_slice(t, "w")

    def test_derived_seeds_differ_by_rank_and_step_and_repeat(self):
        seeds = {ckt.derived_seed(7, step, rank) for step in (10, 20) for rank in range(4)}
        self.assertEqual(len(seeds), 8)
        self.assertEqual(ckt.derived_seed(7, 10, 3), ckt.derived_seed(7, 10, 3))
        self.assertNotEqual(ckt.derived_seed(7, 10, 3), ckt.derived_seed(8, 10, 3))
        self.assertTrue(all(0 <= s < 1 << 63 for s in seeds))


@unittest.skipIf(torch is None, "torch is not installed")
class ElasticCheckpointerTest(AgentTestCase):
    SEED = 11

    def _ranks(self, job, world, step=None):
        """`world` ranks' models, loaders and Checkpointers (of step's values,
        or zeros to restore into)."""
        models = [ShardedModel(r, world, step) for r in range(world)]
        loaders = [ckt.ResumableLoader(list(range(100)), batch_size=2, seed=3, rank=r, world_size=world)
                   for r in range(world)]
        ckpts = []
        for r in range(world):
            c = ckt.Checkpointer(job, self.agent.socket, rank=r, world_size=world, every=0, seed=self.SEED)
            c.track("model", models[r])
            c.track("data", loaders[r])
            ckpts.append(c)
            self.addCleanup(c.close)
        return models, loaders, ckpts

    def _save(self, job, world, step, consumed):
        models, loaders, ckpts = self._ranks(job, world, step)
        for loader in loaders:
            loader.position = consumed
        for c in ckpts:
            self.assertTrue(c.snapshot(step))
        for c in ckpts:
            c.wait_persisted(step)
        for c in ckpts:
            c.close()

    def _restore(self, job, world, step, saved_world, consumed):
        models, loaders, ckpts = self._ranks(job, world)
        self.assertEqual(run_all(lambda c: c.restore(), ckpts), [step] * world)
        for r, (m, loader, c) in enumerate(zip(models, loaders, ckpts)):
            with self.subTest(rank=r, world=world):
                start, length = m.rows
                self.assertTrue(torch.equal(m.weight.local, _global(step)[start:start + length]))
                self.assertIs(m.loaded["weight"], m.weight)  # the DTensor itself, its shard filled
                self.assertTrue(torch.equal(m.bias, torch.full((COLS,), float(step))))
                self.assertEqual(loader.position, consumed)
                self.assertEqual(c.restored_world_size, saved_world)
                self.assertEqual(c.rng_derived, r >= saved_world)
        for c in ckpts:
            c.close()

    def test_two_to_three_to_two_ranks(self):
        job = "torch-elastic"
        self._save(job, 2, 5, consumed=40)
        self._restore(job, 3, 5, 2, consumed=40)
        self._save(job, 3, 9, consumed=66)
        self._restore(job, 2, 9, 3, consumed=66)

    def test_a_data_parallel_job_writes_its_weights_once(self):
        """Plain tensors that every rank holds the same (DDP), declared with
        replicated=True: four ranks write a quarter each; two restore all."""

        class Model:
            def __init__(self, step):
                g = torch.Generator().manual_seed(step)
                self.weight = torch.randn(256, 256, generator=g) if step else torch.zeros(256, 256)

            def state_dict(self):
                return {"weight": self.weight}

            def load_state_dict(self, sd):
                self.weight.copy_(sd["weight"])

        def save(job, replicated):
            ckpts = []
            for r in range(4):
                c = ckt.Checkpointer(job, self.agent.socket, rank=r, world_size=4, every=0, replicated=replicated)
                c.track("model", Model(7))
                ckpts.append(c)
                self.addCleanup(c.close)
            for c in ckpts:
                self.assertTrue(c.snapshot(7))
            for c in ckpts:
                c.wait_persisted(7)
                c.close()
            folder = os.path.join(self.agent.root, job, "step-7")
            return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".shard"))

        everyone, once = save("torch-dp-every-copy", False), save("torch-dp-once", True)
        self.assertLess(once, 0.35 * everyone, (once, everyone))
        models = [Model(0) for _ in range(2)]
        ckpts = []
        for r in range(2):
            c = ckt.Checkpointer("torch-dp-once", self.agent.socket, rank=r, world_size=2, every=0, replicated=True)
            c.track("model", models[r])
            ckpts.append(c)
            self.addCleanup(c.close)
        self.assertEqual(run_all(lambda c: c.restore(), ckpts), [7, 7])
        for m in models:
            self.assertTrue(torch.equal(m.weight, Model(7).weight))
        with self.assertRaisesRegex(ValueError, "larger than the world of 2"):
            ckt.Checkpointer("x", self.agent.socket, rank=0, world_size=2, replicated=ckptd.Replica("dp", 4, 0))

    def test_a_new_ranks_rng_streams_are_derived_from_the_seed_step_and_rank(self):
        job = "torch-elastic-rng"
        self._save(job, 1, 5, consumed=0)
        seeded = []
        real = ckt._seed_rngs
        ckt._seed_rngs = lambda seed: (seeded.append(seed), real(seed))
        self.addCleanup(setattr, ckt, "_seed_rngs", real)
        _, _, ckpts = self._ranks(job, 3)
        run_all(lambda c: c.restore(), ckpts)
        self.assertEqual([c.rng_derived for c in ckpts], [False, True, True])
        self.assertEqual(sorted(seeded), sorted([ckt.derived_seed(self.SEED, 5, 1), ckt.derived_seed(self.SEED, 5, 2)]))


if __name__ == "__main__":
    unittest.main()
