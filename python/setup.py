"""Everything is declared in pyproject.toml; this only makes a wheel that
bundles built files (a libckptd.so* or ckptctl copied into ckptd/, or what
scripts/build-wheel.sh stages: ckptd/bin/ and the shared libraries they need
in ckptd/.libs/) a platform wheel (py3-none-linux_x86_64, not py3-none-any),
and keeps what an earlier build bundled out of one that bundles none.

CKPTD_WHEEL_PLATFORM, when set, is the platform tag of such a wheel instead
of this machine's (scripts/build-wheel.sh sets the manylinux_X_Y_<arch> tag it
computed from the GLIBC_ versions the bundled files need)."""

import glob
import os
import re

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

# What pyproject.toml's package-data bundles, relative to ckptd/.
NATIVE_PATTERNS = ("libckptd.so*", "ckptctl", "bin/*", ".libs/*")


def native_files(top):
    """What top/ckptd/ holds of the built files a wheel may bundle."""
    return [f for pattern in NATIVE_PATTERNS for f in glob.glob(os.path.join(top, "ckptd", pattern))]


def platform_tag():
    """$CKPTD_WHEEL_PLATFORM checked, or None when it is not set."""
    tag = os.environ.get("CKPTD_WHEEL_PLATFORM")
    if not tag:
        return None
    if not re.fullmatch(r"(manylinux_[0-9]+_[0-9]+|linux)_[a-z0-9_]+", tag):
        raise SystemExit(f"setup.py: CKPTD_WHEEL_PLATFORM={tag!r} is not a platform tag such as "
                         "manylinux_2_34_x86_64 or linux_x86_64")
    if not BUNDLED:
        raise SystemExit(f"setup.py: CKPTD_WHEEL_PLATFORM={tag} is set, but ckptd/ bundles no built file "
                         f"({', '.join(NATIVE_PATTERNS)}): the wheel would be pure Python")
    return tag


BUNDLED = native_files(os.path.dirname(os.path.abspath(__file__)))
PLATFORM = platform_tag()


class Dist(Distribution):
    def has_ext_modules(self):
        return bool(BUNDLED) or super().has_ext_modules()


class BuildPy(build_py):
    def run(self):
        # pip builds in the source tree: build/lib/ckptd/ may hold what an
        # earlier build bundled; only what ckptd/ holds now goes in.
        for stale in native_files(self.build_lib):
            if not os.path.isdir(stale):
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
            # Python 3, this platform only. bdist_wheel names the file and
            # writes WHEEL's Tag from this one answer.
            return ("py3", "none", PLATFORM or super().get_tag()[2])

    cmdclass["bdist_wheel"] = BdistWheel

setup(distclass=Dist, cmdclass=cmdclass)
