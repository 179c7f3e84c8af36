#!/usr/bin/env python3
"""Checks that a wheel's native files load on any glibc distribution its
manylinux tag admits, as `auditwheel show` would (auditwheel itself is not
needed; when it is importable, its report is printed too).

    scripts/check-wheel.py dist/ckptd-0.1.0-py3-none-manylinux_2_34_x86_64.whl
    scripts/check-wheel.py --base-libraries   # the libraries a wheel may take from the system

For every ELF file in the wheel (found by its magic, read with binutils'
readelf):
  - each DT_NEEDED library is a base-system one (BASE_LIBRARIES: what the
    manylinux policies let a wheel take from the system, which every glibc
    distribution has), or lies in the wheel in a directory of the file's own
    RUNPATH;
  - every RUNPATH (or RPATH) entry is relative to the file ($ORIGIN) and stays
    inside the wheel;
  - its machine is the tag's architecture, an executable asks for the
    architecture's standard loader and is executable in the archive;
  - the GLIBC_ versions it needs are at most the tag's manylinux_X_Y, and none
    is GLIBC_PRIVATE.
The wheel's file name and its WHEEL metadata must give the same tags. The
report names the highest GLIBC_, GLIBCXX_ and CXXABI_ versions needed and the
file that needs each: GLIBCXX_ says how new the target's libstdc++.so.6 must
be. Exit status 1 with each problem on stderr (file and library or version),
2 for bad usage or a missing readelf.
"""

import argparse
import importlib.util
import itertools
import os
import posixpath
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile

# What a wheel may take from the system (the manylinux policies' libraries,
# minus those such as libX11 that a server lacks): glibc and GCC's runtime.
BASE_LIBRARIES = ("libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libresolv.so.2",
                  "libutil.so.1", "libgcc_s.so.1", "libstdc++.so.6")
# Each architecture's machine as readelf names it, and its dynamic loader.
ARCHES = {
    "x86_64": ("Advanced Micro Devices X86-64", "/lib64/ld-linux-x86-64.so.2"),
    "aarch64": ("AArch64", "/lib/ld-linux-aarch64.so.1"),
}
LOADERS = tuple(posixpath.basename(loader) for _, loader in ARCHES.values())
# The manylinux tags that predate PEP 600, as the glibc versions they admit.
LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
# The first GCC whose libstdc++ defines each GLIBCXX_ version (GCC's "ABI
# Policy and Guidelines").
GLIBCXX_GCC = {25: "8.1", 26: "9.1", 27: "9.2", 28: "9.3", 29: "11.1", 30: "12.1", 31: "13.1", 32: "13.2",
               33: "14.1"}


def base_libraries():
    return BASE_LIBRARIES + LOADERS


def version_key(version):
    """"2.34" -> (2, 34); "3.4.30" -> (3, 4, 30)."""
    return tuple(int(x) for x in version.split("."))


class Elf:
    """What readelf tells of one ELF file."""

    def __init__(self, name, path):
        self.name = name  # its path in the wheel
        self.machine = self.interpreter = self.soname = None
        self.needed, self.runpath, self.rpath = [], None, None
        self.versions = []  # (library, version name) of its version needs
        run = subprocess.run(["readelf", "-h", "-l", "-d", "-V", "-W", path], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=dict(os.environ, LC_ALL="C"))
        if run.returncode != 0:
            raise RuntimeError(f"{name}: readelf failed: {run.stderr.decode('utf-8', 'replace').strip()}")
        section, library = None, None
        for line in run.stdout.decode("utf-8", "replace").splitlines():
            if m := re.match(r"\s*Machine:\s+(.*\S)", line):
                self.machine = m.group(1)
            elif m := re.search(r"\[Requesting program interpreter: (.*)\]", line):
                self.interpreter = m.group(1)
            elif m := re.search(r"\((NEEDED|RUNPATH|RPATH|SONAME)\)\s+[^[]*\[(.*)\]", line):
                kind, value = m.groups()
                if kind == "NEEDED":
                    self.needed.append(value)
                elif kind == "SONAME":
                    self.soname = value
                else:
                    setattr(self, kind.lower(), value)
            elif m := re.match(r"Version (symbols|definition|needs) section", line):
                section, library = m.group(1), None
            elif section == "needs" and (m := re.search(r"File: (\S+)", line)):
                library = m.group(1)
            elif section == "needs" and (m := re.search(r"Name: (\S+)", line)):
                self.versions.append((library, m.group(1)))

    def highest(self, prefix):
        """The highest version named prefix + digits.digits... it needs, as
        (key, version name, library), or None."""
        found = [(version_key(v[len(prefix):]), v, lib) for lib, v in self.versions
                 if re.fullmatch(re.escape(prefix) + r"[0-9]+(\.[0-9]+)+", v)]
        return max(found) if found else None


def parse_name(wheel):
    """The tags of a wheel's file name: a set of (python, abi, platform)."""
    m = re.fullmatch(r"[^-]+-[^-]+(-[0-9][^-]*)?-([^-]+)-([^-]+)-([^-]+)\.whl", os.path.basename(wheel))
    if not m:
        raise ValueError(f"{os.path.basename(wheel)} is not a wheel's file name "
                         "(name-version[-build]-python-abi-platform.whl)")
    return set(itertools.product(*(part.split(".") for part in m.groups()[1:])))


def policy(platform):
    """(glibc (major, minor), arch) that a manylinux platform tag admits."""
    if m := re.fullmatch(r"manylinux_([0-9]+)_([0-9]+)_(\w+)", platform):
        return (int(m.group(1)), int(m.group(2))), m.group(3)
    for legacy, glibc in LEGACY.items():
        if platform.startswith(legacy + "_"):
            return glibc, platform[len(legacy) + 1:]
    raise ValueError(f"platform tag {platform} is not a manylinux tag: no glibc version is promised")


def check(wheel):
    """(report lines, problems) for the wheel at path `wheel`."""
    problems, report = [], []
    tags = parse_name(wheel)
    with zipfile.ZipFile(wheel) as z:
        infos = {i.filename: i for i in z.infolist() if not i.is_dir()}
        metadata = [n for n in infos if re.fullmatch(r"[^/]+\.dist-info/WHEEL", n)]
        if len(metadata) != 1:
            return report, [f"{os.path.basename(wheel)}: holds {len(metadata)} */WHEEL metadata files, not 1"]
        text = z.read(metadata[0]).decode("utf-8")
        declared = {tuple(line.split(":", 1)[1].strip().split("-")) for line in text.splitlines()
                    if line.startswith("Tag:")}
        if declared != tags:
            problems.append(f"{metadata[0]}: Tag {sorted('-'.join(t) for t in declared)} but the file name says "
                            f"{sorted('-'.join(t) for t in tags)}")
        if re.search(r"^Root-Is-Purelib:\s*true", text, re.M | re.I):
            problems.append(f"{metadata[0]}: Root-Is-Purelib is true in a wheel of native files")
        tmp = tempfile.mkdtemp(prefix="check-wheel-")
        try:
            elves = []
            for name in sorted(infos):
                if name.startswith("/") or ".." in name.split("/"):
                    problems.append(f"{name}: a path that leaves the wheel")
                    continue
                with z.open(name) as f:
                    if f.read(4) != b"\x7fELF":
                        continue
                path = z.extract(name, tmp)
                elves.append(Elf(name, path))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    platforms = {t[2] for t in tags}
    try:
        policies = [policy(p) for p in sorted(platforms)]
    except ValueError as e:
        return report, problems + [f"{os.path.basename(wheel)}: {e}"]
    glibc = min(p[0] for p in policies)
    arches = {p[1] for p in policies}
    if len(arches) != 1 or next(iter(arches)) not in ARCHES:
        return report, problems + [f"{os.path.basename(wheel)}: platform tags {sorted(platforms)}: one architecture "
                                   f"of {', '.join(ARCHES)} expected"]
    arch = next(iter(arches))
    machine, loader = ARCHES[arch]
    if not elves:
        problems.append(f"{os.path.basename(wheel)}: has a platform tag but no ELF file")
    names = set(infos)
    base = set(base_libraries())
    vendored, system = set(), set()
    for elf in elves:
        if elf.machine != machine:
            problems.append(f"{elf.name}: machine {elf.machine}, not {machine} ({arch})")
        if elf.interpreter is not None:
            if elf.interpreter != loader:
                problems.append(f"{elf.name}: asks for the loader {elf.interpreter}, not {loader}")
            if not (infos[elf.name].external_attr >> 16) & stat.S_IXUSR:
                problems.append(f"{elf.name}: an executable without the executable bit in the archive")
        here = posixpath.dirname(elf.name)
        dirs = []
        for kind, value in (("RUNPATH", elf.runpath), ("RPATH", elf.rpath)):
            for entry in (value.split(":") if value else []):
                m = re.match(r"(\$ORIGIN|\$\{ORIGIN\})(/.*)?$", entry)
                if not m:
                    problems.append(f"{elf.name}: {kind} entry '{entry}' is not relative to the file ($ORIGIN): "
                                    "it reads libraries of the machine that built it")
                    continue
                d = posixpath.normpath(posixpath.join(here, (m.group(2) or "/").lstrip("/")))
                if d == ".." or d.startswith("../"):
                    problems.append(f"{elf.name}: {kind} entry '{entry}' leads out of the wheel")
                    continue
                if kind == "RUNPATH" or not elf.runpath:  # the loader ignores RPATH when RUNPATH is there
                    dirs.append("" if d == "." else d)
        for lib in elf.needed:
            found = [posixpath.join(d, lib) for d in dirs if posixpath.join(d, lib) in names]
            if found:
                vendored.add(found[0])
            elif lib in base:
                system.add(lib)
            else:
                problems.append(f"{elf.name}: needs {lib}, which is neither a base-system library (see "
                                f"--base-libraries) nor in the wheel where its RUNPATH "
                                f"({elf.runpath or elf.rpath or 'none'}) looks")
        for lib, version in elf.versions:
            if version == "GLIBC_PRIVATE":
                problems.append(f"{elf.name}: needs GLIBC_PRIVATE of {lib}, which is glibc's inside, no ABI")
            elif m := re.fullmatch(r"GLIBC_([0-9]+)\.([0-9]+)(\.[0-9]+)?", version):
                if (int(m.group(1)), int(m.group(2))) > glibc:
                    problems.append(f"{elf.name}: needs {version} of {lib}, newer than the glibc "
                                    f"{glibc[0]}.{glibc[1]} of its tag {'.'.join(sorted(platforms))}")

    report.append(f"{os.path.basename(wheel)}: {len(elves)} ELF files, tag {'.'.join(sorted(platforms))} "
                  f"(glibc {glibc[0]}.{glibc[1]} or later, {arch})")
    for prefix, what in (("GLIBC_", "glibc"), ("GLIBCXX_", "libstdc++.so.6"), ("CXXABI_", "libstdc++.so.6"),
                         ("GCC_", "libgcc_s.so.1")):
        best = max((h + (e.name,) for e in elves if (h := e.highest(prefix))), default=None)
        if best is None:
            report.append(f"  highest {prefix} needed: none")
            continue
        key, version, lib, name = best
        line = f"  highest {prefix} needed: {version} (by {name}, of {lib})"
        if prefix == "GLIBCXX_" and len(key) == 3 and key[:2] == (3, 4) and key[2] in GLIBCXX_GCC:
            line += f": the {what} of GCC {GLIBCXX_GCC[key[2]]} or later"
        report.append(line)
    report.append(f"  from the system: {', '.join(sorted(system)) or 'nothing'}")
    report.append(f"  in the wheel: {len(vendored)} libraries needed: " + ", ".join(sorted(vendored)))
    unused = sorted(e.name for e in elves if e.soname and e.name not in vendored and "/.libs/" in f"/{e.name}")
    if unused:
        report.append("  in the wheel but needed by no file: " + ", ".join(unused))
    return report, problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheel", nargs="?", help="the .whl file")
    parser.add_argument("--base-libraries", action="store_true",
                        help="print the libraries a wheel may take from the system, one a line, and exit")
    args = parser.parse_args()
    if args.base_libraries:
        print("\n".join(base_libraries()))
        return 0
    if not args.wheel:
        parser.error("the wheel to check is missing")
    if shutil.which("readelf") is None:
        print("check-wheel: readelf is missing (Debian: binutils)", file=sys.stderr)
        return 2
    if not os.path.isfile(args.wheel):
        print(f"check-wheel: {args.wheel}: no such file", file=sys.stderr)
        return 2
    try:
        report, problems = check(args.wheel)
    except (ValueError, RuntimeError, zipfile.BadZipFile) as e:
        print(f"check-wheel: {args.wheel}: {e}", file=sys.stderr)
        return 1
    if report:
        print("\n".join(report))
    if importlib.util.find_spec("auditwheel") is not None:
        print("auditwheel show:", flush=True)
        shown = subprocess.run([sys.executable, "-m", "auditwheel", "show", args.wheel])
        if shown.returncode != 0:  # its report, not the verdict: the checks above decide
            print(f"(auditwheel show exited with status {shown.returncode})")
    if problems:
        for p in problems:
            print(f"check-wheel: {p}", file=sys.stderr)
        print(f"check-wheel: {os.path.basename(args.wheel)}: {len(problems)} problem{'s' * (len(problems) != 1)}",
              file=sys.stderr)
        return 1
    print(f"{os.path.basename(args.wheel)}: every ELF file loads with the base system of its tag")
    return 0


if __name__ == "__main__":
    sys.exit(main())
