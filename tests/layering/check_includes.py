#!/usr/bin/env python3
"""Checks every #include of ckptd's C++ files against the layering table.

usage: check_includes.py [ROOT] [--table allowed.txt]
Prints each include that its file's rule does not allow, as
"file:line: includes X (component C), which RULE does not allow", and exits 1
when there is one; exits 0 and prints a count otherwise.
"""
import fnmatch
import os
import re
import sys

FOLDERS = ["base/testing", "base", "policy", "metrics", "format", "storage", "staging", "protocol", "rpc", "etcd", "client",
           "replication", "agent", "coordinator", "cli", "bench", "examples", "tests", "proto"]
FORMAT_PROTOS = {"shard", "manifest"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def component_of_header(header):
    """The component a quoted include belongs to, or None for a third-party one."""
    if header.startswith("grpcpp/") or header.endswith(".grpc.pb.h"):
        return "grpc"
    m = re.match(r"ckptd/v1/(\w+)\.pb\.h$", header)
    if m:
        return "format_proto" if m.group(1) in FORMAT_PROTOS else "proto"
    if header.startswith(("gtest/", "gmock/")):
        return "gtest"
    for folder in FOLDERS:
        if header.startswith(folder + "/"):
            return folder
    return None


def component_of_file(path):
    for folder in FOLDERS:
        if path.startswith(folder + "/"):
            return folder
    return None


def load_table(path):
    rules = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            glob, *allowed = line.split()
            rules.append((glob, set(allowed), n))
    return rules


def source_files(root):
    for folder in FOLDERS:
        top = os.path.join(root, folder)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(("build", "."))]
            for name in filenames:
                if name.endswith((".h", ".cc", ".c")):
                    yield os.path.relpath(os.path.join(dirpath, name), root)


def main(argv):
    root = "."
    table = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allowed.txt")
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--table":
            table = args.pop(0)
        else:
            root = a
    rules = load_table(table)
    problems = 0
    checked = 0
    for path in sorted(source_files(root)):
        rule = next((r for r in rules if fnmatch.fnmatch(path, r[0])), None)
        own = component_of_file(path)
        with open(os.path.join(root, path), errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                comp = component_of_header(m.group(1))
                if comp is None or comp == own:
                    continue
                checked += 1
                if rule is None:
                    print(f"{path}:{n}: includes {m.group(1)}, and no rule of the table covers {path}")
                    problems += 1
                elif comp not in rule[1]:
                    print(f"{path}:{n}: includes {m.group(1)} (component {comp}), "
                          f"which rule '{rule[0]}' (line {rule[2]}) does not allow")
                    problems += 1
    if problems:
        print(f"{problems} include(s) break the layering ({table})")
        return 1
    print(f"layering: {checked} includes across components, all allowed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
