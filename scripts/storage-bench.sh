#!/usr/bin/env bash
# The storage benchmark in one command: builds ckptd and runs the
# storage benchmark (write a 1 GiB synthetic checkpoint for fp32 and bf16,
# compressed and raw, read each back verified; three rounds each, medians),
# beside fio and the zstd CLI, in a scratch folder that it removes at the end.
#   BENCH_BYTES=N   bytes per run (default 1G; K/M/G suffixes)
#   BENCH_DIR=DIR   where to write (default: a new folder under ./build/demo)
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target ckptd-bench ckptctl

BYTES="${BENCH_BYTES:-1G}"
mkdir -p build/demo
DIR="${BENCH_DIR:-$(mktemp -d "$PWD/build/demo/run.XXXXXX")}"
trap 'rm -rf "$DIR"' EXIT

for dtype in fp32 bf16; do
  for codec in zstd none; do
    ./build/bin/ckptd-bench persist --dir "$DIR" --bytes "$BYTES" --codec "$codec" --dtype "$dtype" --compare --repeat 3
  done
done

echo
echo "A kept checkpoint, inspected and verified with ckptctl:"
./build/bin/ckptd-bench persist --dir "$DIR" --bytes 64M --codec zstd --dtype bf16 --keep --step 7 >/dev/null
./build/bin/ckptctl inspect "$DIR/bench/step-7/rank-0.shard"
./build/bin/ckptctl verify --root "$DIR"
