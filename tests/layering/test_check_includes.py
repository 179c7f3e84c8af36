#!/usr/bin/env python3
"""The layering check fails on an upward include and passes a clean tree."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "check_includes.py")


def run(root):
    return subprocess.run([sys.executable, CHECK, root], capture_output=True, text=True)


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
        f.write(text)


class CheckIncludesTest(unittest.TestCase):
    def test_clean_tree_passes(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, "base/a.h", '#include "absl/status/status.h"\n')
            write(root, "storage/b.cc", '#include "storage/b.h"\n#include "base/a.h"\n#include "ckptd/v1/shard.pb.h"\n')
            write(root, "agent/agent_service.cc", '#include "storage/b.h"\n#include "grpcpp/grpcpp.h"\n')
            r = run(root)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_upward_include_fails_naming_file_line_and_rule(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, "storage/b.cc", '#include "base/a.h"\n\n#include "agent/agent_core.h"\n')
            r = run(root)
            self.assertEqual(r.returncode, 1)
            self.assertIn("storage/b.cc:3: includes agent/agent_core.h (component agent)", r.stdout)
            self.assertIn("'storage/*'", r.stdout)

    def test_grpc_in_the_storage_library_fails(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, "storage/b.cc", '#include "ckptd/v1/coordinator.grpc.pb.h"\n')
            self.assertEqual(run(root).returncode, 1)

    def test_service_messages_in_storage_fail_but_format_messages_pass(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, "storage/b.cc", '#include "ckptd/v1/manifest.pb.h"\n')
            self.assertEqual(run(root).returncode, 0)
            write(root, "storage/b.cc", '#include "ckptd/v1/coordinator.pb.h"\n')
            self.assertEqual(run(root).returncode, 1)

    def test_the_agent_core_may_not_speak_grpc(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, "agent/agent_restore.cc", '#include "ckptd/v1/coordinator.grpc.pb.h"\n')
            self.assertEqual(run(root).returncode, 1)
            write(root, "agent/agent_restore.cc", '#include "ckptd/v1/coordinator.pb.h"\n')
            self.assertEqual(run(root).returncode, 0)
            write(root, "agent/coordinator_link.cc", '#include "grpcpp/grpcpp.h"\n')
            self.assertEqual(run(root).returncode, 0)

    def test_the_coordinator_core_may_not_speak_grpc(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, "coordinator/coordinator_core.cc", '#include "grpcpp/grpcpp.h"\n')
            self.assertEqual(run(root).returncode, 1)
            write(root, "coordinator/coordinator_core.cc", "")
            write(root, "coordinator/coordinator_service.cc", '#include "grpcpp/grpcpp.h"\n')
            self.assertEqual(run(root).returncode, 0)

    def test_format_is_below_storage_and_needs_no_storage(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, "format/checksum.cc", '#include "ckptd/v1/shard.pb.h"\n')
            write(root, "storage/b.cc", '#include "format/checksum.h"\n')
            self.assertEqual(run(root).returncode, 0)
            write(root, "format/checksum.cc", '#include "storage/b.h"\n')
            r = run(root)
            self.assertEqual(r.returncode, 1)
            self.assertIn("format/checksum.cc:1: includes storage/b.h (component storage)", r.stdout)

    def test_the_trainer_library_may_not_use_the_storage_engine(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, "client/c_api.cc", '#include "format/checksum.h"\n#include "staging/staging.h"\n')
            self.assertEqual(run(root).returncode, 0)
            write(root, "client/c_api.cc", '#include "storage/store.h"\n')
            self.assertEqual(run(root).returncode, 1)
            write(root, "client/c_api.cc", "")
            write(root, "client/c_api_test.cc", '#include "storage/store.h"\n')  # an agent in-process
            self.assertEqual(run(root).returncode, 0)

    def test_a_file_no_rule_covers_fails(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, "staging/testing/x.h", '#include "base/a.h"\n')  # covered by staging/*
            self.assertEqual(run(root).returncode, 0)
            write(root, "proto/x.h", '#include "base/a.h"\n')
            r = run(root)
            self.assertEqual(r.returncode, 1)
            self.assertIn("no rule", r.stdout)

    def test_library_code_may_not_use_test_helpers(self):
        with tempfile.TemporaryDirectory() as root:
            write(root, "agent/x.cc", '#include "base/testing/matchers.h"\n')
            self.assertEqual(run(root).returncode, 1)
            write(root, "agent/x_test.cc", '#include "base/testing/matchers.h"\n')
            os.remove(os.path.join(root, "agent/x.cc"))
            self.assertEqual(run(root).returncode, 0)


if __name__ == "__main__":
    unittest.main()
