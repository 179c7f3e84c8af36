"""ckptd.torch.Checkpointer in one process against a real ckptd-agent: resume
with several optimizers (their state created lazily), a model that does not
match the checkpoint, failed snapshots as warnings, and state it cannot store."""

import collections
import itertools
import os
import time
import unittest
import warnings

import ckptd
from support import Agent, AgentTestCase

try:
    import torch
    import ckptd.torch as ckt
except ImportError:
    torch = None

_jobs = itertools.count()


def _net(hidden=16, names=("fc1", "fc2"), out=3):
    torch.manual_seed(0)
    return torch.nn.Sequential(collections.OrderedDict([
        (names[0], torch.nn.Linear(6, hidden)), ("drop", torch.nn.Dropout(0.25)),
        (names[1], torch.nn.Linear(hidden, out))]))


def _step(model, opt, i):
    g = torch.Generator().manual_seed(100 + i)
    x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def _train(ckpt, model, opt, steps):
    for i in steps:
        _step(model, opt, i)
        ckpt.maybe_snapshot(i)


def _bits(state):
    """A state_dict's tensors as bytes, the rest as is."""
    if isinstance(state, torch.Tensor):
        return (str(state.dtype), tuple(state.shape), state.numpy().tobytes())
    if isinstance(state, dict):
        return {k: _bits(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [_bits(v) for v in state]
    return state


OPTIMIZERS = {
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adamw_amsgrad": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, amsgrad=True),
    "sgd_momentum_dampening": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1),
    "rmsprop_centered": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True),
}


@unittest.skipIf(torch is None, "torch is not installed")
class CheckpointerTest(AgentTestCase):
    def job(self):
        return f"py-ckpt-{next(_jobs)}"

    def checkpointer(self, job, model=None, opt=None, **kw):
        """A Checkpointer of `job` on the class's agent, tracking `model` and `opt`."""
        kw.setdefault("slot_wait", 10.0)
        ckpt = ckt.Checkpointer(job, kw.pop("socket", self.agent.socket), **kw)
        if model is not None:
            ckpt.track("model", model)
        if opt is not None:
            ckpt.track("optimizer", opt)
        return ckpt

    def test_resume_is_exact_for_lazily_created_optimizer_state(self):
        for name, make in OPTIMIZERS.items():
            with self.subTest(optimizer=name):
                # Without ckptd.
                model = _net()
                opt = make(model.parameters())
                for i in range(1, 7):
                    _step(model, opt, i)
                plain = (_bits(model.state_dict()), _bits(opt.state_dict()))

                # With ckptd: registering (and its trial step) changes nothing.
                job = self.job()
                model = _net()
                opt = make(model.parameters())
                with self.checkpointer(job, model, opt, every=3) as ckpt:
                    self.assertEqual(ckpt.restore(), 0)
                    _train(ckpt, model, opt, range(1, 4))
                    self.assertEqual(ckpt.snapshots_taken, 1)
                    # State created at the first step went into the memory registered before it.
                    self.assertEqual(ckpt.registrations, 1)
                    ckpt.wait_persisted(3, timeout=30)
                    for i in range(4, 7):
                        _step(model, opt, i)
                    self.assertEqual((_bits(model.state_dict()), _bits(opt.state_dict())), plain)

                # A new process's objects resume from step 3.
                model = _net()
                opt = make(model.parameters())
                with self.checkpointer(job, model, opt, every=3) as ckpt:
                    self.assertEqual(ckpt.restore(), 3)
                    _train(ckpt, model, opt, range(4, 7))
                    self.assertEqual((_bits(model.state_dict()), _bits(opt.state_dict())), plain)
                    # The restored optimizer works on the registered memory: no new registration.
                    self.assertEqual((ckpt.snapshots_taken, ckpt.registrations), (1, 1))
                    registered = {r.tensor.data_ptr() for r in ckpt._layout.regs.values()}
                    for state in opt.state.values():
                        for v in state.values():
                            if isinstance(v, torch.Tensor):
                                self.assertIn(v.data_ptr(), registered)
                    ckpt.wait_persisted(6, timeout=30)

    def save_one(self, job, model):
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        with self.checkpointer(job, model, opt) as ckpt:
            ckpt.restore()
            _step(model, opt, 1)
            self.assertTrue(ckpt.snapshot(1))
            ckpt.wait_persisted(1, timeout=30)

    def restore_error(self, job, model):
        with self.checkpointer(job, model, torch.optim.Adam(model.parameters(), lr=0.01)) as ckpt:
            with self.assertRaises(ckptd.FailedPreconditionError) as e:
                ckpt.restore()
            return str(e.exception)

    def test_zero_initial_state_is_made_without_a_step_and_matches_a_first_step(self):
        # What the first step creates, zeroed, is what _zero_state makes without
        # running it: same entries, shapes, dtypes, devices, all zeros.
        makers = [lambda ps: torch.optim.Adam(ps, lr=1e-3), lambda ps: torch.optim.AdamW(ps, amsgrad=True),
                  lambda ps: torch.optim.RMSprop(ps, momentum=0.9, centered=True),
                  lambda ps: torch.optim.Adam([{"params": ps[:2], "lr": 0.1}, {"params": ps[2:]}])]
        for make in makers:
            net = _net()
            opt = make(list(net.parameters()))
            before = [p.detach().clone() for p in net.parameters()]
            self.assertTrue(ckt.Checkpointer._zero_state(opt), type(opt).__name__)
            # Nothing was stepped: the parameters did not move, no gradient appeared.
            for p, b in zip(net.parameters(), before):
                self.assertTrue(torch.equal(p, b))
                self.assertIsNone(p.grad)
            ref_net = _net()
            ref = make(list(ref_net.parameters()))
            for p in ref_net.parameters():
                p.grad = torch.zeros_like(p)
            ref.step()
            for p, q in zip(net.parameters(), ref_net.parameters()):
                got, want = opt.state[p], ref.state[q]
                self.assertEqual(sorted(got), sorted(want), type(opt).__name__)
                for k, v in want.items():
                    if isinstance(v, torch.Tensor):
                        self.assertEqual((got[k].shape, got[k].dtype, got[k].device), (v.shape, v.dtype, v.device))
                        self.assertFalse(got[k].any(), k)
                    else:
                        self.assertEqual(got[k], type(v)(0), k)
        # An optimizer whose first state is not zeros keeps the trial step.
        self.assertFalse(ckt.Checkpointer._zero_state(torch.optim.SGD(_net().parameters(), lr=0.1, momentum=0.9)))

    def test_optimizer_state_is_zeros_after_a_restore_that_finds_nothing_or_no_agent(self):
        # restore() makes Adam's state without zeroing it (the restore of a
        # step overwrites it); when no step is restored it must be zeros.
        def zeros(opt):
            tensors = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
            return len(tensors) > 0 and not any(bool(t.any()) for t in tensors)

        model = _net()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        with self.checkpointer(self.job(), model, opt) as ckpt:
            self.assertEqual(ckpt.restore(), 0)
            self.assertTrue(zeros(opt))
        model = _net()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        gone = self.checkpointer("down", model, opt, socket=self.agent.dir + "/none.sock", rpc_timeout=0.5)
        with self.assertWarns(ckptd.CheckpointWarning):
            self.assertEqual(gone.restore(), 0)
        self.assertTrue(zeros(opt))
        # A step restored: its state, not zeros.
        job = self.job()
        self.save_one(job, _net())
        model = _net()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        with self.checkpointer(job, model, opt) as ckpt:
            self.assertEqual(ckpt.restore(), 1)
            self.assertFalse(zeros(opt))

    def test_a_model_that_does_not_match_is_refused_naming_the_tensor(self):
        job = self.job()
        self.save_one(job, _net())
        renamed = self.restore_error(job, _net(names=("fc1", "head")))
        self.assertIn("'model/head.weight' is not in the checkpoint", renamed)
        self.assertRegex(self.restore_error(job, _net(hidden=12)), r"'model/fc1\.weight' is registered as .* bytes but")
        # Same bytes, another shape: refused by the agent before any data is loaded.
        model = _net()
        model.fc2.weight = torch.nn.Parameter(torch.zeros(16, 3))  # [3, 16] when saved
        before = model.fc2.weight.detach().clone()
        self.assertIn("'model/fc2.weight' is registered with shape [16, 3] but step 1 holds shape [3, 16]",
                      self.restore_error(job, model))
        self.assertTrue(torch.equal(model.fc2.weight.detach(), before))

    def test_a_failed_snapshot_is_a_warning_and_snapshots_resume_with_the_agent(self):
        agent = Agent().start()
        try:
            model = _net()
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            ckpt = self.checkpointer("warned", model, opt, socket=agent.socket, every=1, rpc_timeout=1.0,
                                     slot_wait=0.0)
            self.assertEqual(ckpt.restore(), 0)
            _step(model, opt, 1)
            self.assertTrue(ckpt.maybe_snapshot(1))
            ckpt.wait_persisted(1, timeout=30)
            agent.kill()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                results = []
                for i in range(2, 7):
                    _step(model, opt, i)
                    results.append(ckpt.maybe_snapshot(i))
                    time.sleep(0.25)
            failures = [w for w in caught if issubclass(w.category, ckptd.CheckpointWarning)]
            self.assertTrue(failures, [str(w.message) for w in caught])
            self.assertFalse(results[-1])
            self.assertIn("snapshot of step", str(failures[-1].message))
            self.assertEqual(os.path.basename(failures[-1].filename), "test_torch_checkpointer.py")  # the loop's line
            self.assertIsInstance(ckpt.last_error, ckptd.Error)
            # The agent is back: the client registers again by itself.
            agent.start()
            deadline = time.monotonic() + 15
            step, ok = 6, False
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ckptd.CheckpointWarning)
                while not ok and time.monotonic() < deadline:
                    step += 1
                    _step(model, opt, step)
                    ok = ckpt.maybe_snapshot(step)
                    time.sleep(0.1)
            self.assertTrue(ok)
            ckpt.wait_persisted(step, timeout=30)
            ckpt.close()
        finally:
            agent.cleanup()

    def _wait_failures(self, ckpt, n, timeout=15.0):
        """Waits until the agent has reported `n` failed persists to the client."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            f = ckpt._layout.client.persist_failures()
            if f.failed >= n:
                return f
            time.sleep(0.05)
        self.fail(f"the agent reported {f.failed} failed persists, not {n}, within {timeout}s")

    def test_failed_persists_are_a_warning_once_per_new_batch(self):
        # Issue 16 (5): a full disk failed 59 persists and the trainer never knew.
        job = self.job()
        model = _net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ckpt = self.checkpointer(job, model, opt, every=1)
        try:
            self.assertEqual(ckpt.restore(), 0)
            blocker = os.path.join(self.agent.root, job)
            with open(blocker, "w"):  # a file where the job's folder goes: every persist fails
                pass

            def steps(first, last):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    for i in range(first, last + 1):
                        _step(model, opt, i)
                        self.assertTrue(ckpt.maybe_snapshot(i))
                return [w for w in caught if issubclass(w.category, ckptd.PersistFailedWarning)]

            self.assertEqual(steps(1, 1), [])  # handed over: the agent fails it later
            ckpt._layout.client.snapshot(2)  # a second one before the client looks again
            self._wait_failures(ckpt, 2)
            warned = steps(3, 3)
            self.assertEqual(len(warned), 1, [str(w.message) for w in warned])
            message = str(warned[0].message)
            self.assertIn(f"could not persist 2 snapshots of job '{job}' rank 0 (newest: step 2: ", message)
            self.assertIn(job, message.split("step 2: ", 1)[1])  # the error names the path
            self.assertTrue(issubclass(warned[0].category, RuntimeWarning))
            self.assertEqual(os.path.basename(warned[0].filename), "test_torch_checkpointer.py")
            self.assertEqual(ckpt.persist_failures, 2)
            self.assertEqual(ckpt.last_persist_failure[0], 2)
            # Step 3 failed too; then there is room again: step 3's failure is
            # the last batch, warned of once.
            self._wait_failures(ckpt, 3)
            os.unlink(blocker)
            warned = steps(4, 4)
            self.assertEqual(len(warned), 1, [str(w.message) for w in warned])
            self.assertIn("could not persist 1 snapshot of ", str(warned[0].message))
            self.assertIn("(newest: step 3: ", str(warned[0].message))
            ckpt.wait_persisted(4, timeout=30)
            self.assertEqual(steps(5, 7), [])
            ckpt.wait_persisted(7, timeout=30)
            self.assertEqual(steps(8, 8), [])
            ckpt.wait_persisted(8, timeout=30)
            self.assertEqual(ckpt.persist_failures, 3)
            self.assertEqual(ckpt.last_persist_failure[0], 3)
            # No empty step folders of the failed persists are left behind.
            self.assertEqual(sorted(os.listdir(os.path.join(self.agent.root, job))),
                             ["step-6", "step-7", "step-8"])
        finally:
            ckpt.close()

    def test_on_error_raise_and_an_agent_that_is_down(self):
        model = _net()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        gone = self.agent.dir + "/gone.sock"
        ckpt = self.checkpointer("down", model, opt, socket=gone, every=1, rpc_timeout=0.5, retry_interval=0.0)
        with self.assertWarns(ckptd.CheckpointWarning):
            self.assertEqual(ckpt.restore(), 0)  # trains from scratch
        _step(model, opt, 1)
        with self.assertWarns(ckptd.CheckpointWarning):
            self.assertFalse(ckpt.maybe_snapshot(1))
        strict = self.checkpointer("down", model, socket=gone, every=1, rpc_timeout=0.5, on_error="raise")
        with self.assertRaises(ckptd.UnavailableError) as e:
            strict.snapshot(1)
        self.assertIn("gone.sock", str(e.exception))
        # With several ranks, a rank that cannot restore must not train on from
        # scratch while the others restore: it raises.
        ranked = self.checkpointer("down", model, opt, socket=gone, rank=1, world_size=2, rpc_timeout=0.5)
        with self.assertRaises(ckptd.UnavailableError) as e:
            ranked.restore()
        self.assertIn("rank 1 of 2 cannot restore", str(e.exception))

    def test_without_every_it_snapshots_every_default_every_steps(self):
        # A Checkpointer made the obvious way, with no coordinator: it used to
        # never snapshot (every=0), silently.
        job = self.job()
        model = _net()
        ckpt = ckt.Checkpointer(job, self.agent.socket, slot_wait=10.0)
        self.assertEqual(ckt.DEFAULT_EVERY, 500)  # as docs/python.md says
        self.assertEqual(ckpt.every, ckt.DEFAULT_EVERY)
        ckpt.track("model", model)
        with self.assertLogs("ckptd.torch", "INFO") as logs:
            self.assertEqual(ckpt.restore(), 0)
        self.assertTrue(any(f"snapshots every {ckt.DEFAULT_EVERY} steps (the default; pass every=N" in line
                            for line in logs.output), logs.output)
        self.assertTrue(any(f"job '{job}' has no committed checkpoint" in line for line in logs.output), logs.output)
        taken = [step for step in range(1, 2 * ckt.DEFAULT_EVERY + 1) if ckpt.maybe_snapshot(step)]
        self.assertEqual(taken, [ckt.DEFAULT_EVERY, 2 * ckt.DEFAULT_EVERY])
        ckpt.wait_persisted(2 * ckt.DEFAULT_EVERY, timeout=30)
        ckpt.close()
        self.assertEqual(self.agent.committed_steps(job), [ckt.DEFAULT_EVERY, 2 * ckt.DEFAULT_EVERY])
        # Resumed the same way, it restores, and says so.
        ckpt = ckt.Checkpointer(job, self.agent.socket)
        ckpt.track("model", _net())
        with self.assertLogs("ckptd.torch", "INFO") as logs:
            self.assertEqual(ckpt.restore(), 2 * ckt.DEFAULT_EVERY)
        self.assertTrue(any(f"restored step {2 * ckt.DEFAULT_EVERY}" in line for line in logs.output), logs.output)
        ckpt.close()

        # every=0 asked for explicitly: only snapshot() (or a coordinator), and the log says so.
        job = self.job()
        ckpt = ckt.Checkpointer(job, self.agent.socket, every=0, slot_wait=10.0)
        ckpt.track("model", _net())
        with self.assertLogs("ckptd.torch", "INFO") as logs:
            ckpt.restore()
        self.assertTrue(any("every=0" in line and "only snapshot() does" in line for line in logs.output),
                        logs.output)
        self.assertFalse(any(ckpt.maybe_snapshot(step) for step in range(1, ckt.DEFAULT_EVERY + 1)))
        self.assertTrue(ckpt.snapshot(ckt.DEFAULT_EVERY + 1))
        ckpt.wait_persisted(ckt.DEFAULT_EVERY + 1, timeout=30)
        ckpt.close()
        self.assertEqual(self.agent.committed_steps(job), [ckt.DEFAULT_EVERY + 1])

    def test_numbers_out_of_range_raise_at_construction_and_nothing_tracked_raises(self):
        for kw, message in [
                (dict(rank=2**32), r"rank must be from 0 to 4294967295 \(uint32_t\); got 4294967296"),
                (dict(rank=1, world_size=2**32 + 1), r"world_size must be from 1 to 4294967295 \(uint32_t\)"),
                (dict(rank=2, world_size=2), r"rank must be from 0 to world_size - 1 = 1; got 2"),
                (dict(every=-1), r"every must be from 0 to 18446744073709551615 \(uint64_t\); got -1"),
                (dict(every=2**64 + 3), r"every must be from 0 to 18446744073709551615"),
                (dict(slot_wait=-1.0), r"slot_wait must be a finite number of seconds 0 or more"),
                (dict(rpc_timeout=0.0), r"rpc_timeout must be a finite number of seconds greater than 0"),
                (dict(retry_interval=float("nan")), r"retry_interval must be a number of seconds 0 or more")]:
            with self.subTest(**kw):
                # At construction, not as a CheckpointWarning at the first snapshot.
                with self.assertRaisesRegex(ValueError, message):
                    ckt.Checkpointer(self.job(), self.agent.socket, **kw)
        with self.assertRaisesRegex(TypeError, "every must be an integer, not float"):
            ckt.Checkpointer(self.job(), self.agent.socket, every=10.0)
        with self.assertRaisesRegex(ValueError, r"meta_bytes must be from 18 to"):
            ckt.Checkpointer(self.job(), self.agent.socket).track("model", _net(), meta_bytes=-4096)

        job = self.job()
        ckpt = self.checkpointer(job, every=1)
        # Nothing tracked: a snapshot would hold the RNG streams and no model.
        with self.assertRaisesRegex(ValueError, r"nothing is tracked.*before maybe_snapshot\(\)"):
            ckpt.maybe_snapshot(1)
        with self.assertRaisesRegex(ValueError, r"nothing is tracked.*before snapshot\(\)"):
            ckpt.snapshot(1)
        ckpt.track("model", _net())
        ckpt.restore()
        # A bad step raises even with on_error="warn": it is the caller's bug,
        # not a checkpoint that failed (step -1 used to become 2**64 - 1).
        with warnings.catch_warnings():
            warnings.simplefilter("error", ckptd.CheckpointWarning)
            for step in (-1, 2**64):
                with self.assertRaisesRegex(ValueError, rf"step must be from 0 to 18446744073709551615 "
                                                        rf"\(uint64_t\); got {step}$"):
                    ckpt.snapshot(step)
                with self.assertRaisesRegex(ValueError, "step must be from 0"):
                    ckpt.maybe_snapshot(step)
        self.assertEqual(ckpt.snapshots_taken, 0)
        self.assertTrue(ckpt.maybe_snapshot(1))
        ckpt.wait_persisted(1, timeout=30)
        ckpt.close()
        self.assertEqual(self.agent.committed_steps(job), [1])

    def test_everything_a_state_dict_holds_round_trips(self):
        class Counter:
            def __init__(self):
                self.state = {"epoch": 0, "seen": [], "name": "", "best": float("inf"), "pair": (0, 0.0),
                              "flags": {1: False}, "blob": b"", "none": None,
                              "tensor": torch.zeros(3, dtype=torch.int64)}

            def state_dict(self):
                return self.state

            def load_state_dict(self, s):
                self.state = dict(s)

        job = self.job()
        c = Counter()
        with self.checkpointer(job) as ckpt:
            ckpt.track("counter", c)
            ckpt.restore()
            c.state.update(epoch=3, seen=[1, 2, 3], name="é", best=0.1 + 0.2, pair=(7, -0.0),
                           flags={1: True, 2: None}, blob=b"\x00\xff", none=None)
            c.state["tensor"] += torch.tensor([1, 2, 3])
            saved = dict(c.state, tensor=c.state["tensor"].clone())
            self.assertTrue(ckpt.snapshot(2))
            ckpt.wait_persisted(2, timeout=30)
        fresh = Counter()
        with self.checkpointer(job) as ckpt:
            ckpt.track("counter", fresh)
            self.assertEqual(ckpt.restore(), 2)
        got = fresh.state
        self.assertTrue(torch.equal(got.pop("tensor"), saved.pop("tensor")))
        self.assertEqual(got, saved)
        self.assertEqual(got["best"].hex(), (0.1 + 0.2).hex())
        self.assertEqual(str(got["pair"][1]), "-0.0")

    def test_state_it_cannot_store_and_state_that_outgrows_its_buffer(self):
        class Odd:
            def __init__(self, value):
                self.value = value

            def state_dict(self):
                return {"value": self.value}

            def load_state_dict(self, s):
                self.value = s["value"]

        ckpt = self.checkpointer(self.job(), on_error="raise")
        with self.assertRaisesRegex(TypeError, "'odd/value' is a set"):
            ckpt.track("odd", Odd({1}))
        grows = Odd("")
        ckpt.track("grows", grows)
        ckpt.restore()
        grows.value = "x" * 10000
        with self.assertRaisesRegex(ckptd.ResourceExhaustedError, "meta_bytes"):
            ckpt.snapshot(1)
        ckpt.close()

    def test_skipped_snapshots_are_told_once_with_the_knob_then_summed_up(self):
        # Slow persists (each write sleeps) keep both staging slots busy, so
        # snapshots that do not wait for a slot are skipped.
        agent = Agent(["--no-memory-tier", "--inject-write-latency", "1s"]).start()
        try:
            model = _net()
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            ckpt = self.checkpointer(self.job(), model, opt, socket=agent.socket, every=1, slot_wait=0.0)
            self.assertEqual(ckpt.restore(), 0)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _train(ckpt, model, opt, range(1, 9))
            told = [str(w.message) for w in caught if issubclass(w.category, ckptd.CheckpointWarning)]
            self.assertGreaterEqual(ckpt.snapshots_skipped, 2, told)
            self.assertEqual(ckpt.snapshots_taken + ckpt.snapshots_skipped, 8)
            # One warning for all of them, naming what to change.
            self.assertEqual(len(told), 1, told)
            self.assertIn("no free staging slot", told[0])
            self.assertIn("slot_wait=", told[0])
            self.assertIn("--slots", told[0])
            self.assertIsInstance(ckpt.last_error, ckptd.ResourceExhaustedError)
            # Past the summary interval the next skip sums up those not told.
            untold = ckpt.snapshots_skipped - 1
            saved, ckt.SKIP_SUMMARY_INTERVAL = ckt.SKIP_SUMMARY_INTERVAL, 0.0
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    self.assertFalse(ckpt.snapshot(9))
            finally:
                ckt.SKIP_SUMMARY_INTERVAL = saved
            told = [str(w.message) for w in caught if issubclass(w.category, ckptd.CheckpointWarning)]
            self.assertEqual(len(told), 1, told)
            self.assertIn(f"{untold + 1} more snapshots", told[0])
            self.assertIn("newest: step 9", told[0])
            # Skips not told yet are summed up at close().
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.assertFalse(ckpt.snapshot(10))
                ckpt.close()
            told = [str(w.message) for w in caught if issubclass(w.category, ckptd.CheckpointWarning)]
            self.assertEqual(len(told), 1, told)
            self.assertIn("1 more snapshot ", told[0])
            self.assertIn("newest: step 10", told[0])
        finally:
            agent.cleanup()

    def test_close_can_take_a_final_checkpoint(self):
        job = self.job()
        model = _net()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        ckpt = self.checkpointer(job, model, opt, every=100)
        self.assertEqual(ckpt.restore(), 0)
        _train(ckpt, model, opt, range(1, 8))  # nothing scheduled before 100
        self.assertEqual(ckpt.snapshots_taken, 0)
        self.assertTrue(ckpt.close(final_step=7, timeout=30))
        want = _bits(model.state_dict())
        # A new run resumes at the final step, with its weights.
        model2 = _net(hidden=16)
        with torch.no_grad():
            for p in model2.parameters():
                p.add_(1.0)
        opt2 = torch.optim.Adam(model2.parameters(), lr=0.01)
        with self.checkpointer(job, model2, opt2, every=100) as again:
            self.assertEqual(again.restore(), 7)
            self.assertEqual(_bits(model2.state_dict()), want)
            # The last step snapshotted is not snapshotted twice.
            _step(model2, opt2, 8)
            self.assertTrue(again.snapshot(8))
            self.assertTrue(again.close(final_step=8, timeout=30))
            self.assertEqual(again.snapshots_taken, 1)
        # Without final_step: no checkpoint, False; a bad final_step raises.
        ckpt3 = self.checkpointer(job, _net(), None)
        self.assertFalse(ckpt3.close())
        with self.assertRaisesRegex(ValueError, "final_step"):
            self.checkpointer(job, _net(), None).close(final_step=-1)

    def test_a_plain_data_loader_points_to_the_resumable_loader(self):
        ckpt = self.checkpointer(self.job())
        data = torch.utils.data.TensorDataset(torch.arange(10.0))
        for plain in (torch.utils.data.DataLoader(data, batch_size=2),
                      torch.utils.data.RandomSampler(data)):
            with self.assertRaisesRegex(TypeError, "keeps no position.*ResumableLoader"):
                ckpt.track("loader", plain)
        ckpt.track("loader", ckt.ResumableLoader(data, batch_size=2))

    def test_tied_weights_and_a_loader_cursor(self):
        job = self.job()
        data = torch.utils.data.TensorDataset(torch.arange(10.0))
        emb = torch.nn.Embedding(4, 3)
        head = torch.nn.Linear(3, 4, bias=False)
        head.weight = emb.weight
        model = torch.nn.ModuleDict({"emb": emb, "head": head})
        loader = ckt.ResumableLoader(data, batch_size=3, seed=7)
        with self.checkpointer(job) as ckpt:
            ckpt.track("model", model)
            ckpt.track("loader", loader)
            ckpt.restore()
            self.assertEqual(len(ckpt._layout.regs), 1)  # one buffer for the tied weight
            it = iter(loader)
            first = [next(it)[0].tolist() for _ in range(2)]
            ckpt.snapshot(2)
            ckpt.wait_persisted(2, timeout=30)
            rest = [b[0].tolist() for b in it]
            with torch.no_grad():
                emb.weight.add_(1)
            expected = emb.weight.clone()
            with torch.no_grad():
                emb.weight.add_(1)
        self.assertEqual(sorted(sum(first + rest, [])), [float(i) for i in range(10)])
        loader2 = ckt.ResumableLoader(data, batch_size=3, seed=7)
        emb2 = torch.nn.Embedding(4, 3)
        head2 = torch.nn.Linear(3, 4, bias=False)
        head2.weight = emb2.weight
        with self.checkpointer(job) as ckpt:
            ckpt.track("model", torch.nn.ModuleDict({"emb": emb2, "head": head2}))
            ckpt.track("loader", loader2)
            self.assertEqual(ckpt.restore(), 2)
        self.assertEqual([b[0].tolist() for b in loader2], rest)
        self.assertEqual(loader2.state_dict(), {"epoch": 1, "position": 0, "seed": 7, "world_size": 1})
        self.assertFalse(torch.equal(emb2.weight, expected))  # the weight of step 2, not later


if __name__ == "__main__":
    unittest.main()


@unittest.skipIf(torch is None, "torch is not installed")
class LauncherEnvironmentTest(unittest.TestCase):
    """Under torchrun: the rank and world size from its environment, and a
    coordinator's restart request ends the worker for its elastic agent."""

    def env(self, **values):
        saved = {k: os.environ.get(k) for k in values}

        def restore():
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

        self.addCleanup(restore)
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def test_rank_and_world_size_come_from_torchruns_environment(self):
        self.env(RANK="3", WORLD_SIZE="4", TORCHELASTIC_RUN_ID=None)
        self.assertEqual(ckt.launcher_world(), (3, 4))
        ckpt = ckt.Checkpointer("job", "/nonexistent.sock")
        self.assertEqual((ckpt._client_args["rank"], ckpt._client_args["world_size"]), (3, 4))
        # Given explicitly, they win.
        self.assertEqual(ckt.launcher_world(1, 2), (1, 2))
        ckpt = ckt.Checkpointer("job", "/nonexistent.sock", rank=0, world_size=1)
        self.assertEqual((ckpt._client_args["rank"], ckpt._client_args["world_size"]), (0, 1))
        # Neither given nor set: rank 0 of 1.
        self.env(RANK=None, WORLD_SIZE=None)
        self.assertEqual(ckt.launcher_world(), (0, 1))

    def test_a_bad_environment_is_refused_by_name(self):
        self.env(RANK="x", WORLD_SIZE="2")
        with self.assertRaisesRegex(ValueError, "RANK='x' is not a rank number"):
            ckt.Checkpointer("job", "/nonexistent.sock")
        self.env(RANK="2", WORLD_SIZE="2")
        with self.assertRaisesRegex(ValueError, "rank must be from 0 to world_size - 1 = 1; got 2"):
            ckt.Checkpointer("job", "/nonexistent.sock")
        self.env(RANK="-1", WORLD_SIZE="2")
        with self.assertRaisesRegex(ValueError, "RANK='-1'"):
            ckt.Checkpointer("job", "/nonexistent.sock")

    def test_under_torchrun_a_restart_request_exits_by_default(self):
        self.env(RANK="0", WORLD_SIZE="1", TORCHELASTIC_RUN_ID="job-1")
        self.assertEqual(ckt.Checkpointer("job", "/nonexistent.sock")._on_restart, "exit")
        self.assertEqual(ckt.Checkpointer("job", "/nonexistent.sock", on_restart="flag")._on_restart, "flag")
        self.env(TORCHELASTIC_RUN_ID=None)
        self.assertEqual(ckt.Checkpointer("job", "/nonexistent.sock")._on_restart, "flag")
        with self.assertRaisesRegex(ValueError, "on_restart must be 'exit' or 'flag'"):
            ckt.Checkpointer("job", "/nonexistent.sock", on_restart="die")
        self.assertEqual(ckt.EXIT_RESTART, 75)


@unittest.skipIf(torch is None, "torch is not installed")
class ResumableLoaderTest(unittest.TestCase):
    """The data cursor across ranks and world sizes: no sample of an epoch
    repeated or skipped, whatever the world size after a restore."""

    @staticmethod
    def ranks(n_samples, world_size, batch_size, drop_last=False, seed=3):
        data = torch.utils.data.TensorDataset(torch.arange(n_samples))
        return [ckt.ResumableLoader(data, batch_size=batch_size, seed=seed, drop_last=drop_last, rank=r,
                                    world_size=world_size) for r in range(world_size)]

    @staticmethod
    def take(loaders, steps):
        """`steps` steps of the job (each rank one batch, as in lockstep);
        returns the samples in the order the job consumed them."""
        its = [iter(l) for l in loaders]
        seen = []
        for _ in range(steps):
            for it in its:
                batch = next(it, None)
                if batch is not None:
                    seen += batch[0].tolist()
        return seen

    @staticmethod
    def rest(loaders):
        seen = []
        its = [iter(l) for l in loaders]
        while True:
            got = False
            for it in its:
                batch = next(it, None)
                if batch is not None:
                    got = True
                    seen += batch[0].tolist()
            if not got:
                return seen

    def test_the_ranks_split_each_step_and_read_the_epoch_once(self):
        loaders = self.ranks(50, 4, 2)
        order = loaders[0].order(0)
        seen = self.rest(loaders)
        self.assertEqual(seen, order)  # in the order, rank by rank within a step
        # Ranks past the end of the last step (2 samples left) get none.
        self.assertEqual([len(l) for l in loaders], [7, 6, 6, 6])
        self.assertEqual([l.state_dict()["epoch"] for l in loaders], [1, 1, 1, 1])

    def test_restore_onto_fewer_and_more_ranks_repeats_and_skips_nothing(self):
        for old, new, steps in [(4, 3, 3), (4, 2, 1), (2, 4, 5), (3, 5, 2), (1, 4, 7), (4, 1, 2)]:
            with self.subTest(old=old, new=new):
                before = self.ranks(53, old, 2)
                order = before[0].order(0)
                first = self.take(before, steps)
                states = [l.state_dict() for l in before]
                self.assertEqual(len({tuple(sorted(st.items())) for st in states}), 1)  # the same on every rank
                self.assertEqual(states[0]["position"], len(first))
                after = self.ranks(53, new, 2)
                for l in after:
                    l.load_state_dict(states[0])
                self.assertEqual(first + self.rest(after), order)
                self.assertEqual({l.state_dict()["epoch"] for l in after}, {1})

    def test_drop_last_leaves_out_the_last_partial_step_on_every_rank(self):
        loaders = self.ranks(50, 4, 4, drop_last=True)
        order = loaders[0].order(0)
        self.assertEqual([len(l) for l in loaders], [3, 3, 3, 3])
        seen = self.take(loaders, 1)
        after = self.ranks(50, 3, 4, drop_last=True)
        for l in after:
            l.load_state_dict(loaders[0].state_dict())
        seen += self.rest(after)
        # 16 consumed at world size 4, then two steps of 12; the 10 left are dropped.
        self.assertEqual(seen, order[:40])

    def test_a_single_rank_cursor_of_earlier_versions_is_read(self):
        (loader,) = self.ranks(20, 1, 3)
        order = loader.order(0)
        loader.load_state_dict({"epoch": 0, "offset": 6, "seed": 3})
        self.assertEqual(loader.offset, 6)
        self.assertEqual(self.rest([loader]), order[6:])

    def test_bad_ranks_world_sizes_and_batch_sizes_are_refused_by_name(self):
        data = torch.utils.data.TensorDataset(torch.arange(4))
        for kw, what in [({"rank": 2, "world_size": 2}, "rank"), ({"rank": -1, "world_size": 2}, "rank"),
                         ({"world_size": 0}, "world_size"), ({"world_size": True}, "world_size"),
                         ({"batch_size": 0}, "batch_size")]:
            with self.subTest(kw=kw):
                with self.assertRaisesRegex(ValueError, what):
                    ckt.ResumableLoader(data, **kw)
