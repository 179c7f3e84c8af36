"""The wheel of scripts/build-wheel.sh: built from this build's libckptd.so,
ckptd-agent and ckptctl, it passes scripts/check-wheel.py (manylinux tag,
vendored libraries, relative RUNPATHs), installs offline into a fresh venv,
and there, with no CKPTD_* variable, PYTHONPATH or LD_LIBRARY_PATH, its
ckptd-agent and ckptctl are on the PATH and a trainer process snapshots a
buffer that another restores bit-exact; a ckptd.torch Checkpointer job
resumes in a venv that sees Debian's torch; and the bundled binaries run in a
root that holds nothing but glibc, libgcc_s and libstdc++.

Skipped, as test_packaging, when this python3 cannot make a venv and build a
wheel offline, or patchelf or binutils are missing (scripts/install-deps.sh
installs them)."""

import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile

from support import ROOT

SCRIPTS = os.path.join(ROOT, "scripts")
SOURCE = os.path.join(ROOT, "python")
# The build tree that CMake's CKPTD_LIBRARY and CKPTD_AGENT lie in; by hand,
# the default one.
LIBRARY = os.environ.get("CKPTD_LIBRARY") or os.path.join(ROOT, "build", "lib", "libckptd.so")
BUILD = os.path.dirname(os.path.dirname(os.path.abspath(LIBRARY)))
AGENT = os.environ.get("CKPTD_AGENT") or os.path.join(BUILD, "bin", "ckptd-agent")

ARCH = platform.machine()
# How `ldconfig -p` marks the libraries of this architecture.
LDCONFIG_ARCH = {"x86_64": "libc6,x86-64", "aarch64": "libc6,AArch64"}.get(ARCH, "libc6")

with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
    VERSION = re.search(r"project\(ckptd VERSION ([0-9.]+)", f.read()).group(1)

# How a skip of the whole module begins (test_packaging's; CMakeLists.txt
# reports it as skipped). The skips of single tests must not match it.
SKIP = "cannot install offline into a venv: "

CAN_BUILD = """
import re, setuptools
v = tuple(int(x) for x in re.match(r"(\\d+)\\.(\\d+)", setuptools.__version__).groups())
assert v >= (61, 0), "setuptools " + setuptools.__version__
if v < (70, 1):
    import wheel.bdist_wheel
"""

# A trainer's state, the same in every process: 1 MiB of a fixed pattern.
STATE = "bytearray((i * 7 + (i >> 8)) & 0xFF for i in range(1 << 20))"

SAVE = f"""
import json, os, sys, ckptd
data = {STATE}
with ckptd.Client(sys.argv[1], "wheel-job", [ckptd.Buffer("state", data)]) as c:
    assert c.restore() is None, "a new job has nothing committed"
    c.snapshot(7)
    c.wait_persisted(7, timeout=60)
maps = open("/proc/self/maps").read().split()
print(json.dumps({{"file": ckptd.__file__, "library": ckptd.library_path(), "ckptctl": ckptd.ckptctl(),
                  "mapped": sorted({{p for p in maps if p.startswith("/") and ".so" in p}})}}))
"""

RESTORE = f"""
import json, sys, ckptd
data = bytearray(1 << 20)
with ckptd.Client(sys.argv[1], "wheel-job", [ckptd.Buffer("state", data)]) as c:
    step = c.restore()
    source = c.restore_source()
print(json.dumps({{"file": ckptd.__file__, "step": step, "source": source, "exact": data == {STATE}}}))
"""

# A Checkpointer job: steps 1-4 with a snapshot at 4 (SAVE_TORCH), then a
# new process resumes at 4 and runs to 6 (RESUME_TORCH); its state must be
# that of 6 steps run without a stop.
TORCH_JOB = """
import json, sys, torch, ckptd, ckptd.torch

def make():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)

def step(model, opt, i):
    g = torch.Generator().manual_seed(i)
    loss = (model(torch.randn(8, 4, generator=g)) - torch.randn(8, 3, generator=g)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()

def bits(model, opt):
    return [t.detach().numpy().tobytes().hex() for t in list(model.state_dict().values()) +
            [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]]

def checkpointer(model, opt):
    ckpt = ckptd.torch.Checkpointer("wheel-torch", sys.argv[1], rank=0, world_size=1, every=4, slot_wait=10.0)
    ckpt.track("model", model)
    ckpt.track("optimizer", opt)
    return ckpt
"""

SAVE_TORCH = TORCH_JOB + """
model, opt = make()
with checkpointer(model, opt) as ckpt:
    assert ckpt.restore() == 0
    for i in range(1, 5):
        step(model, opt, i)
        ckpt.maybe_snapshot(i)
    ckpt.wait_persisted(4, timeout=60)
    print(json.dumps({"file": ckptd.__file__, "torch": torch.__file__, "snapshots": ckpt.snapshots_taken}))
"""

RESUME_TORCH = TORCH_JOB + """
model, opt = make()
with checkpointer(model, opt) as ckpt:
    resumed = ckpt.restore()
    for i in range(resumed + 1, 7):
        step(model, opt, i)
        ckpt.maybe_snapshot(i)
plain_model, plain_opt = make()
for i in range(1, 7):
    step(plain_model, plain_opt, i)
print(json.dumps({"file": ckptd.__file__, "resumed": resumed,
                  "exact": bits(model, opt) == bits(plain_model, plain_opt)}))
"""


def _env(**extra):
    """The environment of a machine that has only the wheel: no CKPTD_*
    variable, nothing that finds the source tree's package or steers pip,
    LD_LIBRARY_PATH empty, the PATH of the system."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CKPTD_", "PIP_", "PYTHON")) and k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    env.update(PATH="/usr/bin:/bin", LD_LIBRARY_PATH="", PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1",
               PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    env.update(extra)
    return env


def _run(cmd, cwd, env=None, timeout=120):
    p = subprocess.run(cmd, cwd=cwd, env=env or _env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace")


def _tree(top):
    """Every path under top, but bytecode caches."""
    return sorted(os.path.relpath(os.path.join(d, n), top) for d, dirs, files in os.walk(top)
                  for n in dirs + files if "__pycache__" not in os.path.join(d, n))


class WheelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for path in (LIBRARY, AGENT, os.path.join(BUILD, "bin", "ckptctl")):
            if not os.path.exists(path):
                raise unittest.SkipTest(f"not built: {path}")
        if os.path.realpath(os.path.dirname(os.path.dirname(AGENT))) != os.path.realpath(BUILD):
            raise AssertionError(f"CKPTD_AGENT ({AGENT}) is not in the build tree of CKPTD_LIBRARY ({BUILD})")
        for tool, package in (("patchelf", "patchelf"), ("readelf", "binutils"), ("strip", "binutils")):
            if shutil.which(tool) is None:
                raise unittest.SkipTest(f"{SKIP}no {tool} to build the wheel ({package})")
        cls.dir = tempfile.mkdtemp(prefix="ckptd-wheel-")
        try:
            cls._build_and_install()
        except BaseException:
            shutil.rmtree(cls.dir, ignore_errors=True)
            raise

    @classmethod
    def _build_and_install(cls):
        rc, out = _run([sys.executable, "-c", CAN_BUILD], cls.dir)
        if rc != 0:
            raise unittest.SkipTest(SKIP + "no setuptools >= 61 and wheel to build a wheel (python3-setuptools, "
                                    "python3-wheel): " + "".join(out.strip().splitlines()[-1:]).replace("'", ""))
        cls.venv = os.path.join(cls.dir, "venv")
        rc, out = _run([sys.executable, "-m", "venv", cls.venv], cls.dir)
        if rc != 0 or not os.path.exists(os.path.join(cls.venv, "bin", "pip")):
            raise unittest.SkipTest(SKIP + "python3 -m venv makes no venv with pip (python3-venv)")

        cls.source_before = _tree(SOURCE)
        dist = os.path.join(cls.dir, "dist")
        env = _env(PATH=os.environ.get("PATH", "/usr/bin:/bin"))
        rc, cls.build_output = _run([os.path.join(SCRIPTS, "build-wheel.sh"), "--build-dir", BUILD, "--out", dist,
                                     "--python", sys.executable], cls.dir, env=env, timeout=300)
        if rc != 0:
            raise AssertionError(f"scripts/build-wheel.sh failed ({rc}):\n{cls.build_output}")
        [name] = os.listdir(dist)
        cls.wheel = os.path.join(dist, name)
        cls.pip(cls.venv, "install", cls.wheel)
        cls.python = os.path.join(cls.venv, "bin", "python")
        cls.env = _env(PATH=os.path.join(cls.venv, "bin") + ":/usr/bin:/bin")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def pip(cls, venv, *args):
        rc, out = _run([os.path.join(venv, "bin", "python"), "-m", "pip", *args, "--no-index", "--no-deps",
                        "--no-cache-dir"], cls.dir)
        if rc != 0:
            raise AssertionError(f"pip {' '.join(args)} failed ({rc}):\n{out}")

    def installed(self, venv=None):
        """The ckptd package directory in a venv's site-packages."""
        venv = venv or self.venv
        rc, out = _run([os.path.join(venv, "bin", "python"), "-c",
                        "import ckptd, os; print(os.path.dirname(ckptd.__file__))"], tempfile.mkdtemp(dir=self.dir))
        self.assertEqual(rc, 0, out)
        return out.strip().splitlines()[-1]

    def assertInside(self, path, top):
        self.assertTrue(os.path.realpath(path).startswith(os.path.realpath(top) + os.sep), f"{path} not in {top}")

    def run_python(self, venv, script, *args, env=None):
        """Runs `script` with the venv's python from a directory of its own
        (outside the source tree): the JSON of its last line."""
        cwd = tempfile.mkdtemp(dir=self.dir)
        with open(os.path.join(cwd, "job.py"), "w") as f:
            f.write(script)
        rc, out = _run([os.path.join(venv, "bin", "python"), "job.py", *args], cwd, env=env or self.env)
        self.assertEqual(rc, 0, out)
        return json.loads(out.strip().splitlines()[-1])

    def base_libraries(self):
        rc, out = _run([sys.executable, os.path.join(SCRIPTS, "check-wheel.py"), "--base-libraries"], self.dir)
        self.assertEqual(rc, 0, out)
        return out.split()

    def assertCommitted(self, root, job, step, timeout=10.0):
        """The agent writes the step's MANIFEST (commits it) within `timeout`."""
        manifest = os.path.join(root, job, f"step-{step}", "MANIFEST")
        deadline = time.monotonic() + timeout
        while not os.path.exists(manifest):
            self.assertLess(time.monotonic(), deadline, f"no {manifest} within {timeout} s")
            time.sleep(0.05)

    def start_agent(self):
        """The venv's ckptd-agent (found on its PATH) on a socket and storage
        root of its own; stopped when the test ends."""
        d = tempfile.mkdtemp(dir=self.dir, prefix="agent-")
        sock, root = os.path.join(d, "agent.sock"), os.path.join(d, "root")
        os.mkdir(root)
        log = open(os.path.join(d, "agent.log"), "wb")
        self.addCleanup(log.close)
        proc = subprocess.Popen(["ckptd-agent", "--storage-root", root, "--socket", sock, "--slots", "2",
                                 "--keep", "3", "--threads", "2"], cwd=d, env=self.env, stdout=log, stderr=log)

        def stop():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.addCleanup(stop)
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                with open(log.name, "rb") as f:
                    self.fail(f"ckptd-agent exited with {proc.returncode}: {f.read().decode('utf-8', 'replace')}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(sock)
                break
            except OSError:
                self.assertLess(time.monotonic(), deadline, "ckptd-agent did not serve within 30 s")
                time.sleep(0.05)
        return proc, sock, root

    # --- the wheel -------------------------------------------------------------

    def test_wheel_is_manylinux_and_carries_the_library_and_daemons(self):
        name = os.path.basename(self.wheel)
        m = re.fullmatch(rf"ckptd-{re.escape(VERSION)}-py3-none-manylinux_([0-9]+)_([0-9]+)_{ARCH}\.whl", name)
        self.assertIsNotNone(m, name)
        # Not newer than the glibc it was built with.
        host = tuple(int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])
        self.assertLessEqual((int(m.group(1)), int(m.group(2))), host)
        tag = name[len(f"ckptd-{VERSION}-"):-len(".whl")]
        with zipfile.ZipFile(self.wheel) as z:
            names = set(z.namelist())
            for path in ("ckptd/__init__.py", "ckptd/_native.py", "ckptd/libckptd.so", "ckptd/bin/ckptd-agent",
                         "ckptd/bin/ckptctl"):
                self.assertIn(path, names)
            for path in ("ckptd/bin/ckptd-agent", "ckptd/bin/ckptctl"):
                self.assertTrue(z.getinfo(path).external_attr >> 16 & 0o100, f"{path} is not executable")
            vendored = [n for n in names if n.startswith("ckptd/.libs/")]
            self.assertTrue(any(re.search(r"/libgrpc\+\+-[0-9a-f]{8}\.so", n) for n in vendored), sorted(vendored))
            [metadata] = [n for n in names if n.endswith(".dist-info/WHEEL")]
            wheel_file = z.read(metadata).decode()
            [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
            scripts = z.read(entry_points).decode()
        self.assertEqual(re.findall(r"^Tag: (.*)$", wheel_file, re.M), [tag])
        self.assertIn("Root-Is-Purelib: false", wheel_file)
        self.assertIn("ckptd-agent = ckptd._native:agent", scripts)
        self.assertIn("ckptctl = ckptd._native:ckptctl", scripts)
        # The build read python/ and wrote nothing there.
        self.assertEqual(_tree(SOURCE), self.source_before)

    def test_check_wheel_passes_it_and_names_what_the_target_needs(self):
        rc, out = _run([sys.executable, os.path.join(SCRIPTS, "check-wheel.py"), self.wheel], self.dir)
        self.assertEqual(rc, 0, out)
        self.assertIn("every ELF file loads with the base system of its tag", out)
        # docs/python.md says that the libstdc++ of GCC 11 (GLIBCXX_3.4.29) suffices.
        m = re.search(r"highest GLIBCXX_ needed: GLIBCXX_3\.4\.([0-9]+) ", out)
        self.assertIsNotNone(m, out)
        self.assertLessEqual(int(m.group(1)), 29, f"docs/python.md needs a newer GCC now:\n{out}")
        m = re.search(r"highest GLIBC_ needed: GLIBC_([0-9]+)\.([0-9]+)", out)
        self.assertIsNotNone(m, out)
        self.assertIn(f"manylinux_{m.group(1)}_{m.group(2)}_{ARCH}", os.path.basename(self.wheel))

    def rewrite(self, name, keep, tag=None):
        """A copy of the wheel named `name` with only the members `keep` says
        yes to, WHEEL's Tag set to `tag` if given."""
        path = os.path.join(tempfile.mkdtemp(dir=self.dir), name)
        with zipfile.ZipFile(self.wheel) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if not keep(info.filename):
                    continue
                data = src.read(info)
                if tag and info.filename.endswith(".dist-info/WHEEL"):
                    data = re.sub(rb"(?m)^Tag: .*$", b"Tag: " + tag.encode(), data)
                dst.writestr(info, data)
        return path

    def test_check_wheel_names_a_missing_library_and_a_too_old_tag(self):
        name = os.path.basename(self.wheel)
        # libckptd.so without the libraries it needs.
        broken = self.rewrite(name, lambda n: ".dist-info/" in n or n == "ckptd/libckptd.so")
        rc, out = _run([sys.executable, os.path.join(SCRIPTS, "check-wheel.py"), broken], self.dir)
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r"check-wheel: ckptd/libckptd\.so: needs libgrpc\+\+-[0-9a-f]{8}\.so\.[0-9.]+, which "
                              r"is neither a base-system library .* nor in the wheel where its RUNPATH "
                              r"\(\$ORIGIN/\.libs\) looks")
        # The same files under a tag that promises an older glibc.
        old = re.sub(r"manylinux_[0-9]+_[0-9]+_", "manylinux_2_17_", name)
        tag = old[len(f"ckptd-{VERSION}-"):-len(".whl")]
        lowered = self.rewrite(old, lambda n: ".dist-info/" in n or n.startswith("ckptd/bin/ckptctl"), tag=tag)
        rc, out = _run([sys.executable, os.path.join(SCRIPTS, "check-wheel.py"), lowered], self.dir)
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r"check-wheel: ckptd/bin/ckptctl: needs GLIBC_2\.[0-9]+ of libc\.so\.6, newer than "
                              rf"the glibc 2\.17 of its tag manylinux_2_17_{ARCH}")
        # A file name that does not say what WHEEL says.
        renamed = self.rewrite(old, lambda n: ".dist-info/" in n)
        rc, out = _run([sys.executable, os.path.join(SCRIPTS, "check-wheel.py"), renamed], self.dir)
        self.assertEqual(rc, 1, out)
        self.assertIn("WHEEL: Tag ['py3-none-manylinux_", out)

    # --- installed --------------------------------------------------------------

    def test_console_scripts_run_the_bundled_daemons(self):
        bin_dir = os.path.join(self.venv, "bin")
        for program in ("ckptd-agent", "ckptctl"):
            self.assertEqual(shutil.which(program, path=self.env["PATH"]), os.path.join(bin_dir, program))
            rc, out = _run([program, "--version"], self.dir, env=self.env)
            self.assertEqual((rc, out.strip()), (0, f"{program} {VERSION}"))
        # A package without the binary says what is missing.
        rc, out = _run([self.python, "-c", "import sys, ckptd._native as n; n.BIN = '/nonexistent/bin'; "
                        "sys.exit(n.ckptctl())"], self.dir, env=self.env)
        self.assertEqual(rc, 2, out)
        self.assertIn("ckptctl: this ckptd package bundles no ckptctl (/nonexistent/bin/ckptctl: no such file)",
                      out)

    def test_a_trainer_snapshots_and_another_restores_through_the_installed_package(self):
        package = os.path.realpath(self.installed())
        self.assertInside(package, self.venv)
        proc, sock, root = self.start_agent()
        # The console script became the bundled agent, which loaded the vendored libraries.
        self.assertEqual(os.path.realpath(f"/proc/{proc.pid}/exe"),
                         os.path.realpath(os.path.join(package, "bin", "ckptd-agent")))
        with open(f"/proc/{proc.pid}/maps") as f:
            agent_maps = {p for p in f.read().split() if p.startswith("/") and ".so" in p}
        self.assertTrue(any(p.startswith(os.path.join(package, ".libs") + os.sep) for p in agent_maps), agent_maps)
        base = self.base_libraries()
        # A base library maps as its file (libstdc++.so.6.0.30 for libstdc++.so.6).
        from_host = [p for p in agent_maps if not p.startswith(package + os.sep)
                     and not any(os.path.basename(p) == b or os.path.basename(p).startswith(b + ".") for b in base)]
        self.assertEqual(from_host, [], "the agent loaded libraries of the host that are not base-system ones")

        saved = self.run_python(self.venv, SAVE, sock)
        self.assertInside(saved["file"], self.venv)
        self.assertEqual(os.path.dirname(saved["file"]), package)
        self.assertEqual(saved["library"], os.path.join(package, "libckptd.so"))
        self.assertEqual(saved["ckptctl"], os.path.join(package, "bin", "ckptctl"))
        grpc = [p for p in saved["mapped"] if re.search(r"/lib(grpc|protobuf|absl_)", p)]
        self.assertTrue(grpc, saved["mapped"])
        for p in grpc:
            self.assertInside(p, os.path.join(package, ".libs"))
        self.assertCommitted(root, "wheel-job", 7)

        restored = self.run_python(self.venv, RESTORE, sock)
        self.assertEqual(os.path.dirname(restored["file"]), package)
        self.assertEqual((restored["step"], restored["exact"]), (7, True), restored)

    def test_a_torch_checkpointer_job_resumes_in_a_venv_with_debians_torch(self):
        rc, out = _run([sys.executable, "-c", "import torch"], self.dir)
        if rc != 0:
            self.skipTest(f"{sys.executable} has no torch (python3-torch)")
        venv = os.path.join(self.dir, "venv-torch")
        rc, out = _run([sys.executable, "-m", "venv", "--system-site-packages", venv], self.dir)
        self.assertEqual(rc, 0, out)
        self.pip(venv, "install", self.wheel)
        package = self.installed(venv)
        self.assertInside(package, venv)
        _, sock, root = self.start_agent()
        env = _env(PATH=os.path.join(venv, "bin") + ":/usr/bin:/bin")

        saved = self.run_python(venv, SAVE_TORCH, sock, env=env)
        self.assertEqual(os.path.dirname(saved["file"]), package)
        self.assertFalse(saved["torch"].startswith(os.path.realpath(venv)), saved["torch"])
        self.assertEqual(saved["snapshots"], 1)
        self.assertCommitted(root, "wheel-torch", 4)

        resumed = self.run_python(venv, RESUME_TORCH, sock, env=env)
        self.assertEqual(os.path.dirname(resumed["file"]), package)
        self.assertEqual((resumed["resumed"], resumed["exact"]), (4, True), resumed)

    def test_bundled_daemons_run_in_a_root_with_only_glibc_and_gcc_runtime(self):
        if os.geteuid() != 0:
            self.skipTest("a chroot needs root")
        chroot = shutil.which("chroot") or shutil.which("chroot", path="/usr/sbin:/sbin")
        ldconfig = shutil.which("ldconfig") or shutil.which("ldconfig", path="/usr/sbin:/sbin")
        if chroot is None or ldconfig is None:
            self.skipTest("no chroot or ldconfig command")
        package = self.installed()
        top = tempfile.mkdtemp(dir=self.dir, prefix="root-")
        # The host's base-system libraries (scripts/check-wheel.py's list)
        # where its loader finds them, and the loader: nothing else.
        base = set(self.base_libraries())
        rc, out = _run([ldconfig, "-p"], self.dir)
        self.assertEqual(rc, 0, out)
        found = {}
        for m in re.finditer(rf"^\s*(\S+) \({re.escape(LDCONFIG_ARCH)}[,)].* => (\S+)$", out, re.M):
            if m.group(1) in base:
                found.setdefault(m.group(1), m.group(2))
        self.assertIn("libc.so.6", found, out)
        rc, out = _run(["readelf", "-l", "-W", os.path.join(package, "bin", "ckptd-agent")], self.dir)
        self.assertEqual(rc, 0, out)
        found["loader"] = re.search(r"\[Requesting program interpreter: (.*)\]", out).group(1)
        for path in found.values():
            os.makedirs(top + os.path.dirname(path), exist_ok=True)
            shutil.copy2(os.path.realpath(path), top + path)
        shutil.copytree(package, os.path.join(top, "ckptd"), symlinks=True)
        # The loader expands a program's $ORIGIN from /proc/self/exe, which
        # a container has and this bare root does not: LD_ORIGIN_PATH says
        # the same.
        env = dict(self.env, LD_ORIGIN_PATH="/ckptd/bin")

        rc, out = _run([chroot, top, "/ckptd/bin/ckptd-agent", "--version"], self.dir, env=env)
        if rc == 125 and "Operation not permitted" in out:
            self.skipTest(f"chroot is not permitted here: {out.strip()}")
        self.assertEqual((rc, out.strip()), (0, f"ckptd-agent {VERSION}"))
        rc, out = _run([chroot, top, "/ckptd/bin/ckptctl", "--version"], self.dir, env=env)
        self.assertEqual((rc, out.strip()), (0, f"ckptctl {VERSION}"))
        # Without the vendored libraries the root lacks what they are.
        os.rename(os.path.join(top, "ckptd", ".libs"), os.path.join(top, "ckptd", "libs-moved"))
        rc, out = _run([chroot, top, "/ckptd/bin/ckptctl", "--version"], self.dir, env=env)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("error while loading shared libraries", out)

if __name__ == "__main__":
    unittest.main()
