#!/usr/bin/env bash
# Builds the GPU checks here and packs them, with every shared library they
# load (and the dynamic loader), into one folder that a GPU machine without
# ckptd's build dependencies can run: tests/gpu/run.sh --bundle <folder>.
#   tests/gpu/bundle.sh [folder]      (default: .gpu)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-.gpu}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTD_CUDA=ON >/dev/null
cmake --build build --target client_device_copy_test ckptd-bench
rm -rf "$OUT" && mkdir -p "$OUT/bin" "$OUT/lib"
for b in build/tests/client_device_copy_test build/bin/ckptd-bench; do strip -o "$OUT/bin/$(basename "$b")" "$b"; done
for b in "$OUT"/bin/*; do ldd "$b" | awk '/=>/ {print $3}'; done | sort -u | xargs -r -I{} cp -L {} "$OUT/lib/"
cp -L /lib64/ld-linux-x86-64.so.2 "$OUT/lib/"
cp tests/gpu/run.sh "$OUT/"
du -sh "$OUT"
