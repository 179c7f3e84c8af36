#!/usr/bin/env bash
# Builds the GPU checks here and packs them, with every shared library they
# load (and the dynamic loader), into one folder that a GPU machine without
# ckptd's build dependencies can run: tests/gpu/run.sh --bundle <folder>.
#   tests/gpu/bundle.sh [folder]      (default: .gpu; BUILD=<dir>: build tree, default build)
#
# The folder:
#   bin/      client_device_copy_test, ckptd-bench, ckptd-agent (stripped); run as
#             lib/ld-linux-x86-64.so.2 --library-path lib:pylib bin/<binary>
#   lib/      the loader, glibc and the GCC runtime (libstdc++, libgcc_s) of this
#             machine: only the binaries, through that loader, use them
#   pylib/    libckptd.so and every other library it or bin/ loads (gRPC,
#             protobuf, absl, OpenSSL, zstd, ...): the binaries find them through
#             the loader, the machine's own python3 through LD_LIBRARY_PATH=pylib
#   cudart/   libcudart.so of the toolkit built with, for python_cuda_check.py when
#             the GPU machine has none (it prefers the machine's)
#   python/ckptd, python_cuda_check.py, run.sh
#
# Why glibc and the GCC runtime stay out of pylib/: python3 on the GPU machine
# runs on that machine's glibc, and a process has one glibc, so this
# machine's libc/libm/libpthread/... cannot join it. libstdc++ and libgcc_s
# are left to the machine too: this machine's need its glibc (libstdc++.so.6
# asks for GLIBC_2.36, libgcc_s for 2.35), and torch, loaded in the same
# process, needs the machine's libstdc++, of which there can also be only one.
# So python_cuda_check.py needs a glibc of at least 2.34 and a libstdc++ with
# GLIBCXX_3.4.29 (GCC 11; Ubuntu 22.04, Debian 12, RHEL 9) for what pylib/
# asks for; with an older one it runs python3 itself through the bundled
# loader and lib/ (best effort: the reason lib/ also holds glibc's small
# companion libraries that the binaries do not load).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-.gpu}"
BUILD="${BUILD:-build}"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTD_CUDA=ON >/dev/null
cmake --build "$BUILD" --target client_device_copy_test ckptd-bench ckptd-agent ckptd_shared
rm -rf "$OUT" && mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/pylib" "$OUT/cudart" "$OUT/python"
for b in "$BUILD/tests/client_device_copy_test" "$BUILD/bin/ckptd-bench" "$BUILD/bin/ckptd-agent"; do
  strip -o "$OUT/bin/$(basename "$b")" "$b"
done
strip -o "$OUT/pylib/libckptd.so" "$BUILD/lib/libckptd.so"

# glibc's libraries and the GCC runtime: lib/; every other one: pylib/.
runtime() {
  case "$(basename "$1")" in
    ld-linux*|libc.so.*|libm.so.*|libmvec.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|\
    libutil.so.*|libanl.so.*|libnsl.so.*|libBrokenLocale.so.*|libthread_db.so.*|libnss_*|\
    libstdc++.so.*|libgcc_s.so.*) return 0 ;;
  esac
  return 1
}
for f in "$OUT"/bin/* "$OUT/pylib/libckptd.so"; do ldd "$f" | awk '/=>/ {print $3}'; done | sort -u |
  while read -r l; do
    if runtime "$l"; then cp -L "$l" "$OUT/lib/"; else cp -L "$l" "$OUT/pylib/"; fi
  done
cp -L /lib64/ld-linux-x86-64.so.2 "$OUT/lib/"
libc_dir=$(dirname "$(ldd "$OUT/bin/ckptd-agent" | awk '$1 == "libc.so.6" {print $3}')")
for l in libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libutil.so.1 libresolv.so.2 libanl.so.1; do
  if [ -e "$libc_dir/$l" ] && [ ! -e "$OUT/lib/$l" ]; then cp -L "$libc_dir/$l" "$OUT/lib/"; fi
done

cuda_bin=$(sed -n 's/^CUDAToolkit_BIN_DIR:PATH=//p' "$BUILD/CMakeCache.txt")
cudart=
for f in "${cuda_bin:-/usr/local/cuda/bin}"/../lib64/libcudart.so.* \
    "${cuda_bin:-/usr/local/cuda/bin}"/../targets/x86_64-linux/lib/libcudart.so.*; do
  if [[ -z "$cudart" && "$f" =~ libcudart\.so\.[0-9]+$ ]]; then cudart=$f; fi
done
if [ -n "$cudart" ]; then cp -L "$cudart" "$OUT/cudart/"; else echo "bundle: no libcudart.so.N beside $cuda_bin" >&2; fi

mkdir -p "$OUT/python/ckptd"
cp python/ckptd/*.py "$OUT/python/ckptd/"
cp tests/gpu/python_cuda_check.py tests/gpu/run.sh "$OUT/"
du -sh "$OUT"
