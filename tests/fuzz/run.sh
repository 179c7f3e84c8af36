#!/usr/bin/env bash
# Builds the libFuzzer targets, writes their seed corpora, and runs each target
# for FUZZ_SECONDS (default 30). Exits non-zero when a target finds a crash,
# a sanitizer error, a leak, a timeout or an out-of-memory input.
#
#   tests/fuzz/run.sh                    # from the repository root (or anywhere)
#   FUZZ_SECONDS=600 tests/fuzz/run.sh   # longer runs
#   FUZZ_TARGETS=fuzz_manifest tests/fuzz/run.sh
#
# Environment: FUZZ_SECONDS, FUZZ_TARGETS (default: both), BUILD_DIR (default
# build-fuzz), FUZZ_ARGS (extra libFuzzer flags, e.g. "-jobs=4 -workers=4").
# Findings are kept under $BUILD_DIR/fuzz/artifacts/<target>/ and the inputs
# the fuzzers found interesting under $BUILD_DIR/fuzz/corpus/<target>/ (kept
# between runs). Reproduce a finding with: $BUILD_DIR/bin/<target> <file>
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
FUZZ_TARGETS=${FUZZ_TARGETS:-"fuzz_shard_reader fuzz_manifest"}
FUZZ_ARGS=${FUZZ_ARGS:-}
WORK="$ROOT/$BUILD_DIR/fuzz"

echo "== configure and build ($BUILD_DIR)"
mkdir -p "$BUILD_DIR"
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCKPTD_FUZZ=ON -DCKPTD_BUILD_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$BUILD_DIR/configure.log" 2>&1 ||
  { cat "$BUILD_DIR/configure.log"; echo "FAIL: cmake configure"; exit 1; }
cmake --build "$BUILD_DIR" --target fuzz_make_corpus $FUZZ_TARGETS

echo "== seed corpora"
rm -rf "$WORK/seeds"
# Seeds are valid files; leaks or sanitizer reports while writing them are errors too.
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  "$BUILD_DIR/bin/fuzz_make_corpus" "$WORK/seeds"

# UBSan recovers by default in this build (no -fno-sanitize-recover): make
# every report fatal so that libFuzzer records it as a crash.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}

status=0
results=()
for target in $FUZZ_TARGETS; do
  case "$target" in
    fuzz_shard_reader) seeds="$WORK/seeds/shard" dict="tests/fuzz/shard.dict" ;;
    fuzz_manifest) seeds="$WORK/seeds/manifest" dict="tests/fuzz/manifest.dict" ;;
    *) echo "unknown target $target"; exit 2 ;;
  esac
  corpus="$WORK/corpus/$target"
  artifacts="$WORK/artifacts/$target"
  log="$WORK/$target.log"
  mkdir -p "$corpus" "$artifacts"
  before=$(find "$artifacts" -type f | wc -l)
  echo "== $target for ${FUZZ_SECONDS}s (log: $log)"
  start=$(date +%s)
  rc=0
  # shellcheck disable=SC2086
  "$BUILD_DIR/bin/$target" "$corpus" "$seeds" -dict="$dict" -max_len=65536 -timeout=25 -rss_limit_mb=4096 \
    -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -artifact_prefix="$artifacts/" $FUZZ_ARGS \
    >"$log" 2>&1 || rc=$?
  elapsed=$(( $(date +%s) - start ))
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
  if [ "$rc" -eq 0 ]; then
    results+=("PASS $target: ${runs:-?} runs in ${elapsed}s, coverage ${cov:-?} edges, corpus $(ls "$corpus" | wc -l) files, no crash")
  else
    status=1
    after=$(find "$artifacts" -type f | wc -l)
    newest=$(ls -t "$artifacts" 2>/dev/null | head -1)
    reason=$(grep -m1 -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|contract violated|deadly signal|out-of-memory|timeout' "$log" | cut -c1-160 || true)
    results+=("FAIL $target: exit $rc after ${elapsed}s: ${reason:-see log}; input: ${newest:+$artifacts/$newest} ($((after - before)) new artifacts); log: $log")
  fi
done

echo "== results"
for r in "${results[@]}"; do echo "$r"; done
exit $status
