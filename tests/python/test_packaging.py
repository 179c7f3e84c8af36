"""python/ as a package: `pip install ./python` into a fresh virtual
environment, offline (--no-build-isolation --no-index: the setuptools and
wheel of the system build it), and the installed ckptd, imported from outside
the source tree, is the venv's and loads the libckptd.so $CKPTD_LIBRARY names.
A libckptd.so copied into ckptd/ before the build is bundled into a platform
wheel and found next to the installed package.

Skipped when this python3 cannot make such a venv (Debian: python3-venv or
python3-pip) or build a wheel offline (python3-setuptools, python3-wheel)."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

from support import ROOT

SOURCE = os.path.join(ROOT, "python")
# CMake passes the library it built; by hand, the default build tree.
LIBRARY = os.environ.get("CKPTD_LIBRARY") or os.path.join(ROOT, "build", "lib", "libckptd.so")

# The project's version (CMakeLists.txt), which the package's must be.
with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
    VERSION = re.search(r"project\(ckptd VERSION ([0-9.]+)", f.read()).group(1)

# What the venv's python prints about the ckptd it imports.
PROBE = ("import ckptd, importlib.metadata as m, json; print(json.dumps({'file': ckptd.__file__, "
         "'library': ckptd.library_path(), 'version': m.version('ckptd')}))")

# How every skip of this module begins (CMakeLists.txt: ctest reports it as
# skipped).
SKIP = "cannot install offline into a venv: "

# Builds a wheel offline: setuptools >= 61 (pyproject.toml's [project]), and
# before 70.1 the wheel package for bdist_wheel.
CAN_BUILD = """
import re, setuptools
v = tuple(int(x) for x in re.match(r"(\\d+)\\.(\\d+)", setuptools.__version__).groups())
assert v >= (61, 0), "setuptools " + setuptools.__version__
if v < (70, 1):
    import wheel.bdist_wheel
"""


def _env(**extra):
    """The environment without what would find the source tree's ckptd
    (PYTHONPATH) or steer pip (PIP_*, its configuration files)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "CKPTD_LIBRARY") and not k.startswith("PIP_")}
    env.update(PYTHONNOUSERSITE="1", PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    env.update(extra)
    return env


def _run(cmd, cwd, **env):
    return subprocess.run(cmd, cwd=cwd, env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=120)


class PackagingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(LIBRARY):
            raise unittest.SkipTest(f"libckptd.so is not built ({LIBRARY})")
        cls.dir = tempfile.mkdtemp(prefix="ckptd-pkg-")
        try:
            cls._make_venv()
        except BaseException:
            shutil.rmtree(cls.dir, ignore_errors=True)
            raise

    @classmethod
    def _make_venv(cls):
        cls.venv = os.path.join(cls.dir, "venv")
        cls.python = os.path.join(cls.venv, "bin", "python")
        # The system's pip serves the venv (--system-site-packages) when there
        # is one; otherwise the venv gets its own from ensurepip.
        for options in (["--without-pip"], []):
            shutil.rmtree(cls.venv, ignore_errors=True)
            made = _run([sys.executable, "-m", "venv", "--system-site-packages", *options, cls.venv], cls.dir)
            if made.returncode == 0 and _run([cls.python, "-m", "pip", "--version"], cls.dir).returncode == 0:
                break
        else:
            if made.returncode != 0:
                raise unittest.SkipTest(SKIP + "python3 -m venv fails (python3-venv)")
            raise unittest.SkipTest(SKIP + "no pip in a venv (python3-pip or python3-venv)")
        build = _run([cls.python, "-c", CAN_BUILD], cls.dir)
        if build.returncode != 0:
            why = build.stdout.decode("utf-8", "replace").strip().splitlines()[-1:]
            raise unittest.SkipTest(SKIP + "no setuptools >= 61 and wheel to build a wheel (python3-setuptools, "
                                    "python3-wheel): " + "".join(why).replace("'", ""))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def copy_source(self, name):
        """python/ without what earlier builds left there: pip builds in the
        tree it is given, and the source tree stays untouched."""
        dst = os.path.join(self.dir, name)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(SOURCE, dst, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__",
                                                                   "libckptd.so*"))
        return dst

    def pip(self, *args):
        p = _run([self.python, "-m", "pip", *args, "--no-build-isolation", "--no-deps", "--no-index",
                  "--no-cache-dir"], self.dir)
        self.assertEqual(p.returncode, 0, p.stdout.decode("utf-8", "replace"))

    def probe(self, **env):
        """Imports ckptd with the venv's python in a directory outside the
        source tree: (returncode, its JSON or its output)."""
        cwd = tempfile.mkdtemp(dir=self.dir)
        p = _run([self.python, "-c", PROBE], cwd, **env)
        out = p.stdout.decode("utf-8", "replace")
        return p.returncode, (json.loads(out.strip().splitlines()[-1]) if p.returncode == 0 else out)

    def assertInVenv(self, path):
        real = os.path.realpath(path)
        self.assertTrue(real.startswith(os.path.realpath(self.venv) + os.sep), real)
        self.assertFalse(real.startswith(os.path.realpath(SOURCE) + os.sep), real)

    def test_installed_package_is_the_venvs_and_honours_ckptd_library(self):
        self.pip("install", "--force-reinstall", self.copy_source("plain"))
        rc, got = self.probe(CKPTD_LIBRARY=LIBRARY)
        self.assertEqual(rc, 0, got)
        self.assertInVenv(got["file"])
        self.assertEqual(os.path.basename(os.path.dirname(got["file"])), "ckptd")
        self.assertEqual(got["library"], LIBRARY)
        self.assertEqual(got["version"], VERSION)
        # $CKPTD_LIBRARY is the only place looked at when it is set.
        missing = os.path.join(self.dir, "nowhere", "libckptd.so")
        rc, out = self.probe(CKPTD_LIBRARY=missing)
        self.assertNotEqual(rc, 0, out)
        self.assertIn(f"tried {missing} (no such file). ", out)

    def test_library_in_the_package_is_bundled_in_a_platform_wheel(self):
        src = self.copy_source("bundled")
        shutil.copy(LIBRARY, os.path.join(src, "ckptd", "libckptd.so"))
        wheels = os.path.join(self.dir, "wheels")
        shutil.rmtree(wheels, ignore_errors=True)
        self.pip("wheel", "-w", wheels, src)
        [wheel] = os.listdir(wheels)
        self.assertTrue(wheel.startswith(f"ckptd-{VERSION}-py3-none-") and not wheel.endswith("-any.whl"), wheel)
        with zipfile.ZipFile(os.path.join(wheels, wheel)) as z:
            self.assertIn("ckptd/libckptd.so", z.namelist())
        self.pip("install", "--force-reinstall", os.path.join(wheels, wheel))
        rc, got = self.probe()
        self.assertEqual(rc, 0, got)
        self.assertInVenv(got["file"])
        self.assertEqual(got["library"], os.path.join(os.path.dirname(got["file"]), "libckptd.so"))
        # $CKPTD_LIBRARY still comes first.
        rc, got = self.probe(CKPTD_LIBRARY=LIBRARY)
        self.assertEqual(rc, 0, got)
        self.assertEqual(got["library"], LIBRARY)


if __name__ == "__main__":
    unittest.main()
