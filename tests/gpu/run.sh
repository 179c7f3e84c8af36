#!/usr/bin/env bash
# The checks that need a GPU: the CUDA device-copy tests (device -> pageable
# and page-locked staging, and back, bit-exact; throughput printed), then the
# snapshot benchmark with a 1 GiB buffer on cuda:0 (stall of Snapshot through
# a live agent beside one cudaMemcpy into page-locked memory), once copying
# straight into staging and once in two hops through a spare device buffer
# (--spare: the stall is the device-to-device copy), then the restore
# benchmark with 1 GiB from the agent's memory onto cuda:0 (a new trainer's
# restore and a rollback beside one cudaMemcpy from page-locked memory, and
# from pageable memory) and on the host, then the Python binding
# on CUDA (python_cuda_check.py: device memory from libcudart through ctypes,
# and ckptd.torch on cuda:0 when the machine has CUDA torch, else that half
# is skipped). Prints its results and exits non-zero when a check fails or is
# skipped (the torch half excepted). Every check runs, whatever came before.
#   tests/gpu/run.sh                    build here (needs ckptd's dependencies), then run
#                                       (BUILD=<dir>: the build tree, default build)
#   tests/gpu/run.sh --bundle <folder>  run binaries packed by tests/gpu/bundle.sh
# CKPTD_PYTHON: the interpreter for the Python check (default python3).
set -uo pipefail
PY="${CKPTD_PYTHON:-python3}"
if [ "${1:-}" = "--bundle" ]; then
  B=$(cd "$2" && pwd)
  # The binaries run on the bundle's loader and glibc (lib/) with the other
  # libraries in pylib/; python on the machine's glibc with pylib/ only.
  PREFIX=("$B/lib/ld-linux-x86-64.so.2" --library-path "$B/lib:$B/pylib")
  TEST="$B/bin/client_device_copy_test"
  BENCH="$B/bin/ckptd-bench"
  AGENT="$B/bin/ckptd-agent"
  PYCHECK="$B/python_cuda_check.py"
  PYENV=(CKPTD_LIBRARY="$B/pylib/libckptd.so" LD_LIBRARY_PATH="$B/pylib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
else
  cd "$(dirname "$0")/../.." || exit 1
  BUILD="${BUILD:-build}"
  case "$BUILD" in /*) ;; *) BUILD="$PWD/$BUILD" ;; esac
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTD_CUDA=ON >/dev/null &&
    cmake --build "$BUILD" --target client_device_copy_test ckptd-bench ckptd-agent ckptd_shared || exit 1
  PREFIX=()
  TEST="$BUILD/tests/client_device_copy_test"
  BENCH="$BUILD/bin/ckptd-bench"
  AGENT="$BUILD/bin/ckptd-agent"
  PYCHECK=tests/gpu/python_cuda_check.py
  PYENV=(CKPTD_LIBRARY="$BUILD/lib/libckptd.so")
fi
run() { ${PREFIX[@]+"${PREFIX[@]}"} "$@"; }
failed=()
nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not found"
out=$(run "$TEST" 2>&1); rc=$?
echo "$out" | grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|cuda copy|cuda spare|Failure|Skipped"
if [ $rc -ne 0 ]; then failed+=("device copy tests, rc=$rc")
elif echo "$out" | grep -q "SKIPPED \]"; then failed+=("device copy tests skipped"); fi
echo "snapshot benchmark (1 GiB on cuda:0, then two hops through a spare on cuda:0, then on the host):"
run "$BENCH" snapshot --bytes 1G --cuda 0 --repeat 5 --json || failed+=("snapshot benchmark")
run "$BENCH" snapshot --bytes 1G --cuda 0 --spare --repeat 5 --json || failed+=("two-hop snapshot benchmark")
run "$BENCH" snapshot --bytes 1G --repeat 5 --json || failed+=("host snapshot benchmark")
echo "restore benchmark (1 GiB from the agent's memory onto cuda:0: a restart and a rollback, then on the host):"
run "$BENCH" restore --bytes 1G --cuda 0 --repeat 5 --json || failed+=("restore benchmark")
run "$BENCH" restore --bytes 1G --repeat 5 --json || failed+=("host restore benchmark")
echo "python binding on CUDA ($PY):"
# The agent through the same loader as the binaries: shell words for the script.
env "${PYENV[@]}" CKPTD_AGENT_CMD="$(printf '%q ' ${PREFIX[@]+"${PREFIX[@]}"} "$AGENT")" \
  timeout 300 "$PY" "$PYCHECK" --require-cuda ||
  failed+=("python check, rc=$?")
if [ ${#failed[@]} -eq 0 ]; then
  echo "gpu checks: PASS"
else
  printf -v why '%s; ' "${failed[@]}"
  echo "gpu checks: FAIL (${why%; })"
  exit 1
fi
