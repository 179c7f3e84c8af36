#!/usr/bin/env bash
# The checks that need a GPU: the CUDA device-copy tests (device -> pageable
# and page-locked staging, and back, bit-exact; throughput printed), then the
# snapshot benchmark with a 1 GiB buffer on cuda:0 (stall of Snapshot through
# a live agent beside one cudaMemcpy into page-locked memory), once copying
# straight into staging and once in two hops through a spare device buffer
# (--spare: the stall is the device-to-device copy). Prints its results and
# exits non-zero when a check fails or is skipped.
#   tests/gpu/run.sh                    build here (needs ckptd's dependencies), then run
#   tests/gpu/run.sh --bundle <folder>  run binaries packed by tests/gpu/bundle.sh
set -uo pipefail
if [ "${1:-}" = "--bundle" ]; then
  B=$(cd "$2" && pwd)
  run() { "$B/lib/ld-linux-x86-64.so.2" --library-path "$B/lib" "$@"; }
  TEST="$B/bin/client_device_copy_test"
  BENCH="$B/bin/ckptd-bench"
else
  cd "$(dirname "$0")/../.."
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTD_CUDA=ON >/dev/null &&
    cmake --build build --target client_device_copy_test ckptd-bench || exit 1
  run() { "$@"; }
  TEST=build/tests/client_device_copy_test
  BENCH=build/bin/ckptd-bench
fi
nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not found"
out=$(run "$TEST" 2>&1); rc=$?
echo "$out" | grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|cuda copy|cuda spare|Failure|Skipped" 
if [ $rc -ne 0 ] || echo "$out" | grep -q "SKIPPED \]"; then
  echo "gpu checks: FAIL (rc=$rc)"
  exit 1
fi
echo "snapshot benchmark (1 GiB on cuda:0, then two hops through a spare on cuda:0, then on the host):"
run "$BENCH" snapshot --bytes 1G --cuda 0 --repeat 5 --json || { echo "gpu checks: FAIL (snapshot benchmark)"; exit 1; }
run "$BENCH" snapshot --bytes 1G --cuda 0 --spare --repeat 5 --json ||
  { echo "gpu checks: FAIL (two-hop snapshot benchmark)"; exit 1; }
run "$BENCH" snapshot --bytes 1G --repeat 5 --json || { echo "gpu checks: FAIL (host snapshot benchmark)"; exit 1; }
echo "gpu checks: PASS"
