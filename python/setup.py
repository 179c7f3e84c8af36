"""Everything is declared in pyproject.toml; this only makes a wheel that
bundles libckptd.so or ckptctl (a libckptd.so* or ckptctl copied into ckptd/
before the build) a platform wheel (py3-none-linux_x86_64, not
py3-none-any), and keeps what an earlier build bundled out of one that
bundles none."""

import glob
import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution


def native_files(top):
    """What top/ckptd/ holds of the built files a wheel may bundle."""
    return [f for pattern in ("libckptd.so*", "ckptctl") for f in glob.glob(os.path.join(top, "ckptd", pattern))]


BUNDLED = native_files(os.path.dirname(os.path.abspath(__file__)))


class Dist(Distribution):
    def has_ext_modules(self):
        return bool(BUNDLED) or super().has_ext_modules()


class BuildPy(build_py):
    def run(self):
        # pip builds in the source tree: build/lib/ckptd/ may hold what an
        # earlier build bundled; only what ckptd/ holds now goes in.
        for stale in native_files(self.build_lib):
            os.remove(stale)
        super().run()


cmdclass = {"build_py": BuildPy}
if BUNDLED:
    try:
        from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1
    except ImportError:
        from wheel.bdist_wheel import bdist_wheel

    class BdistWheel(bdist_wheel):
        def get_tag(self):
            # ctypes loads the library, ckptd.export runs ckptctl: any
            # Python 3, this platform only.
            return ("py3", "none", super().get_tag()[2])

    cmdclass["bdist_wheel"] = BdistWheel

setup(distclass=Dist, cmdclass=cmdclass)
