#!/usr/bin/env bash
# The checks that need a GPU: the CUDA device-copy tests (device -> pageable
# and page-locked staging, and back, bit-exact; throughput printed). Prints
# its results and exits non-zero when a check fails or is skipped.
#   tests/gpu/run.sh                    build here (needs ckptd's dependencies), then run
#   tests/gpu/run.sh --bundle <folder>  run binaries packed by tests/gpu/bundle.sh
set -uo pipefail
if [ "${1:-}" = "--bundle" ]; then
  B=$(cd "$2" && pwd)
  run() { "$B/lib/ld-linux-x86-64.so.2" --library-path "$B/lib" "$@"; }
  TEST="$B/bin/client_device_copy_test"
else
  cd "$(dirname "$0")/../.."
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTD_CUDA=ON >/dev/null &&
    cmake --build build --target client_device_copy_test || exit 1
  run() { "$@"; }
  TEST=build/tests/client_device_copy_test
fi
nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not found"
out=$(run "$TEST" 2>&1); rc=$?
echo "$out" | grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|cuda copy|Failure|Skipped" 
if [ $rc -ne 0 ] || echo "$out" | grep -q "SKIPPED \]"; then
  echo "gpu checks: FAIL (rc=$rc)"
  exit 1
fi
echo "gpu checks: PASS"
