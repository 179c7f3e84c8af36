"""The console scripts `ckptd-agent` and `ckptctl` (pyproject.toml's
[project.scripts]): each replaces this process with the binary the package
bundles in ckptd/bin/ (a wheel of scripts/build-wheel.sh), with the same
arguments, so that signals, exit status and stdio are the binary's own.

A package without that binary (`pip install ./python`) prints what is missing
and exits with status 2. Like every module of the package, this one comes
after `import ckptd`, which needs its libckptd.so."""

import os
import sys

BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def bundled(name):
    """The path of the bundled binary `name`, or None when the package has none."""
    path = os.path.join(BIN, name)
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def _exec(name):
    path = bundled(name)
    if path is None:
        where = os.path.join(BIN, name)
        why = "not executable" if os.path.exists(where) else "no such file"
        sys.stderr.write(f"{name}: this ckptd package bundles no {name} ({where}: {why}); it comes with the wheel "
                         f"that scripts/build-wheel.sh makes, or run the {name} of a ckptd build (build/bin/{name})\n")
        return 2
    try:
        os.execv(path, [path] + sys.argv[1:])  # returns only by raising
    except OSError as e:
        sys.stderr.write(f"{name}: cannot run {path}: {e.strerror}\n")
    return 126  # found but not runnable, as a shell says


def agent():
    return _exec("ckptd-agent")


def ckptctl():
    return _exec("ckptctl")
