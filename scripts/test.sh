#!/usr/bin/env bash
# Builds ckptd and runs every test: the release build's tests (gcc), the same
# tests under AddressSanitizer + UndefinedBehaviorSanitizer in a clang build
# that also checks every thread-safety annotation (-Wthread-safety -Werror),
# and a short libFuzzer run of the shard reader and the manifest parser. Installs missing Debian
# packages first. Exits non-zero when anything fails.
#   JOBS=N          parallel build jobs (default: nproc)
#   FUZZ_SECONDS=N  seconds per fuzz target (default 20; 0 skips fuzzing)
#   SKIP_ASAN=1     skip the sanitizer build
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh
export PATH="$PWD/.tools:$PATH"  # promtool, when install-deps unpacked it there
JOBS="${JOBS:-$(nproc)}"
FUZZ_SECONDS="${FUZZ_SECONDS:-20}"
LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT
passed=0
failed=0
# run_ctest NAME DIR: runs ctest in DIR, adds its counts to the totals.
run_ctest() {
  local status=0
  ctest --test-dir "$2" --output-on-failure -j "$JOBS" 2>&1 | tee "$LOGS/$1.log" || status=$?
  local line
  line=$(grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$LOGS/$1.log" | tail -n 1 || true)
  if [ -n "$line" ]; then
    local f t
    f=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$line")
    t=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\2/' <<<"$line")
    passed=$((passed + t - f))
    failed=$((failed + f))
  fi
  if [ "$status" -ne 0 ]; then
    echo "$passed passed, $failed failed"
    exit "$status"
  fi
}

echo "== release build and tests"
# Line tables only (-g1): stack traces keep file:line, and the build is about a
# quarter faster than with full debug info.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null
cmake --build build -j "$JOBS"
run_ctest release build

if [ "${SKIP_ASAN:-0}" != "1" ]; then
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer build (clang, -Wthread-safety -Werror) and tests"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCKPTD_SANITIZE=ON \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_C_FLAGS_DEBUG=-gline-tables-only -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only >/dev/null
  cmake --build build-asan -j "$JOBS"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_ctest asan build-asan
fi

if [ "$FUZZ_SECONDS" != "0" ]; then
  echo "== libFuzzer: shard reader and manifest parser, ${FUZZ_SECONDS}s each"
  FUZZ_SECONDS="$FUZZ_SECONDS" ./tests/fuzz/run.sh
fi
echo "== all tests passed"
echo "$passed passed, $failed failed"
