#!/usr/bin/env bash
# Builds the ckptd wheel that carries what a training node needs: the Python
# package with libckptd.so, ckptd-agent and ckptctl from a build tree, and
# every shared library they need beyond the base system, tagged
# manylinux_X_Y_<arch> after the newest GLIBC_ version any of them needs.
#
#   scripts/build-wheel.sh [--build-dir DIR] [--out DIR] [--python PY]
#
#   --build-dir DIR  the CMake build tree holding lib/libckptd.so,
#                    bin/ckptd-agent and bin/ckptctl (default: build/ of this
#                    checkout)
#   --out DIR        where the wheel is written, replacing any other
#                    ckptd-*.whl there (default: dist/ of this checkout)
#   --python PY      the python3 that builds it, offline: setuptools >= 61,
#                    and wheel before setuptools 70.1 (default: the first of
#                    python3 and /usr/bin/python3 that can; Debian:
#                    python3-setuptools, python3-wheel)
#
# The wheel holds ckptd/libckptd.so, ckptd/bin/ckptd-agent, ckptd/bin/ckptctl
# (debug info stripped) and ckptd/.libs/: the libraries ldd resolves for them
# that are not base-system ones (scripts/check-wheel.py --base-libraries),
# renamed lib<name>-<hash>.so.<version> as auditwheel does, so that a process
# that loaded another copy of one (libssl, libprotobuf, ...) keeps it apart.
# Each file's RUNPATH leads to ckptd/.libs/. pip install puts ckptd-agent and
# ckptctl on the PATH of the environment (python/ckptd/_native.py).
#
# Needs patchelf, binutils (readelf, strip) and ldd. Builds from a copy of
# python/ in a temporary directory: the source tree is left as it was. Ends
# by checking the wheel with scripts/check-wheel.py, and prints its path last.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="$ROOT/build"
out_dir="$ROOT/dist"
python=""

usage() {
  sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}
die() {
  echo "build-wheel: $*" >&2
  exit 1
}

while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir | --out | --python)
      [ $# -ge 2 ] || { echo "build-wheel: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --build-dir) build_dir="$2" ;;
        --out) out_dir="$2" ;;
        --python) python="$2" ;;
      esac
      shift 2
      ;;
    --build-dir=*) build_dir="${1#*=}"; shift ;;
    --out=*) out_dir="${1#*=}"; shift ;;
    --python=*) python="${1#*=}"; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "build-wheel: unknown argument '$1' (--help says what it takes)" >&2; exit 2 ;;
  esac
done

for tool in patchelf:patchelf readelf:binutils strip:binutils ldd:libc-bin sha256sum:coreutils; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || die "${tool%%:*} is missing (Debian: apt-get install ${tool#*:})"
done
# can_build PY: whether PY can build python/ offline (pyproject.toml's
# [project] and bdist_wheel, with pip); prints why not.
can_build() {
  command -v "$1" >/dev/null 2>&1 || { echo "no such command"; return 1; }
  local why
  why="$("$1" -c '
import re, setuptools
v = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", setuptools.__version__).groups())
assert v >= (61, 0), "setuptools " + setuptools.__version__ + " is older than 61"
if v < (70, 1):
    import wheel.bdist_wheel
import pip
' 2>&1)" || { tail -n1 <<<"$why"; return 1; }
}
if [ -n "$python" ]; then
  why="$(can_build "$python")" ||
    die "$python cannot build the wheel offline: $why (Debian: python3-setuptools python3-wheel python3-pip)"
else
  whys=()
  for candidate in python3 /usr/bin/python3; do
    if why="$(can_build "$candidate")"; then
      python="$candidate"
      break
    fi
    whys+=("$candidate: $why;")
  done
  [ -n "$python" ] || die "no python3 here can build the wheel offline (${whys[*]} Debian: python3-setuptools" \
    "python3-wheel python3-pip), or name one with --python PY"
fi

lib="$build_dir/lib/libckptd.so"
agent="$build_dir/bin/ckptd-agent"
ctl="$build_dir/bin/ckptctl"
for f in "$lib" "$agent" "$ctl"; do
  [ -f "$f" ] || die "$f is missing: build it first (cmake --build $build_dir)"
done

work="$(mktemp -d "${TMPDIR:-/tmp}/ckptd-wheel.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# A copy of python/ without what in-tree builds or earlier bundles left there.
src="$work/python"
cp -a "$ROOT/python" "$src"
rm -rf "$src/build" "$src/dist" "$src"/*.egg-info "$src/ckptd/bin" "$src/ckptd/.libs" "$src/ckptd/ckptctl" \
  "$src"/ckptd/libckptd.so*
find "$src" -name __pycache__ -prune -exec rm -rf {} +
pkg="$src/ckptd"
libs="$pkg/.libs"
mkdir -p "$pkg/bin" "$libs"

cp -L "$lib" "$pkg/libckptd.so"
cp -L "$agent" "$ctl" "$pkg/bin/"
chmod 0644 "$pkg/libckptd.so"
chmod 0755 "$pkg/bin/ckptd-agent" "$pkg/bin/ckptctl"
own=("$pkg/libckptd.so" "$pkg/bin/ckptd-agent" "$pkg/bin/ckptctl")

declare -A base=()
while read -r name; do base[$name]=1; done < <("$python" "$ROOT/scripts/check-wheel.py" --base-libraries)
[ ${#base[@]} -gt 0 ] || die "scripts/check-wheel.py --base-libraries printed nothing"

# Every library the three need, directly or through another (ldd resolves
# the whole tree as the loader would), but the base system: name -> file.
declare -A from=()
for elf in "${own[@]}"; do
  out="$(LC_ALL=C ldd "$elf" 2>&1)" || die "ldd ${elf#"$pkg/"}: $out"
  while read -r line; do
    case "$line" in
      *" => not found"*) die "${elf#"$pkg/"} needs ${line%% *}, which the loader of this machine does not find" ;;
      *" => "*) ;;
      *) continue ;;  # linux-vdso.so.1 and the loader, by its path
    esac
    name="${line%% => *}"
    path="${line#* => }"
    path="${path% (0x*}"
    [ -z "${base[$name]:-}" ] || continue
    if [ -n "${from[$name]:-}" ] && [ "$(realpath "${from[$name]}")" != "$(realpath "$path")" ]; then
      die "$name resolves to ${from[$name]} for one file and to $path for another"
    fi
    from[$name]="$path"
  done <<<"$out"
done

# The vendored copies, each named after its SONAME and a hash of its bytes.
declare -A renamed=()
for name in "${!from[@]}"; do
  stem="${name%%.so*}"
  [ "$stem" != "$name" ] || die "cannot vendor $name: no .so in its name"
  hash="$(sha256sum "${from[$name]}" | cut -c1-8)"
  renamed[$name]="$stem-$hash${name#"$stem"}"
  cp -L "${from[$name]}" "$libs/${renamed[$name]}"
  chmod 0644 "$libs/${renamed[$name]}"
done

needed() {
  LC_ALL=C readelf -d -W "$1" | sed -n 's/.*(NEEDED).*Shared library: \[\(.*\)\]$/\1/p'
}

# patch_elf FILE RUNPATH: strips its debug info, points its DT_NEEDED entries at
# the vendored names and sets its RUNPATH.
patch_elf() {
  local file="$1" runpath="$2" dep
  local args=()
  strip --strip-debug "$file"
  while read -r dep; do
    if [ -n "${renamed[$dep]:-}" ]; then
      args+=(--replace-needed "$dep" "${renamed[$dep]}")
    elif [ -z "${base[$dep]:-}" ]; then
      die "${file#"$pkg/"} needs $dep, which is neither vendored nor a base-system library"
    fi
  done < <(needed "$file")
  if [ ${#args[@]} -gt 0 ]; then
    patchelf "${args[@]}" "$file"
  fi
  patchelf --set-rpath "$runpath" "$file"
}

all=("${own[@]}")
for name in "${!renamed[@]}"; do
  patchelf --set-soname "${renamed[$name]}" "$libs/${renamed[$name]}"
  patch_elf "$libs/${renamed[$name]}" "\$ORIGIN"
  all+=("$libs/${renamed[$name]}")
done
patch_elf "$pkg/libckptd.so" "\$ORIGIN/.libs"
patch_elf "$pkg/bin/ckptd-agent" "\$ORIGIN/../.libs"
patch_elf "$pkg/bin/ckptctl" "\$ORIGIN/../.libs"

# The tag: the newest GLIBC_ version any file needs, the machine of libckptd.so.
glibc="$(for f in "${all[@]}"; do LC_ALL=C readelf -V -W "$f"; done |
  { grep -oE 'Name: GLIBC_[0-9]+\.[0-9]+(\.[0-9]+)?' || true; } | sed 's/^Name: GLIBC_//' | sort -V | tail -n1)"
[ -n "$glibc" ] || die "found no GLIBC_ version needed by the files: cannot tag the wheel"
IFS=. read -r glibc_major glibc_minor _ <<<"$glibc"
machine="$(LC_ALL=C readelf -h -W "$pkg/libckptd.so" | sed -n 's/^ *Machine: *//p')"
case "$machine" in
  "Advanced Micro Devices X86-64") arch=x86_64 ;;
  AArch64) arch=aarch64 ;;
  *) die "libckptd.so is built for '$machine': no manylinux architecture this script knows" ;;
esac
tag="manylinux_${glibc_major}_${glibc_minor}_${arch}"

echo "build-wheel: ${#renamed[@]} libraries vendored; the newest glibc symbol needed is GLIBC_$glibc: $tag"
(cd "$work" && CKPTD_WHEEL_PLATFORM="$tag" "$python" -m pip wheel --quiet --no-build-isolation --no-deps \
  --no-index --no-cache-dir --disable-pip-version-check --wheel-dir "$work/wheels" "$src") ||
  die "pip could not build the wheel (above)"
wheels=("$work"/wheels/*.whl)
wheel="${wheels[0]}"
if [ ${#wheels[@]} -ne 1 ] || [ ! -f "$wheel" ]; then
  die "pip did not leave exactly one wheel in $work/wheels"
fi
case "$(basename "$wheel")" in
  *"-$tag.whl") ;;
  *) die "pip named the wheel $(basename "$wheel"), without the tag $tag" ;;
esac

"$python" "$ROOT/scripts/check-wheel.py" "$wheel" || die "$(basename "$wheel") fails its check (above)"
mkdir -p "$out_dir"
# One ckptd wheel in DIR, so that `pip install DIR/ckptd-*.whl` installs this one.
for stale in "$out_dir"/ckptd-*.whl; do
  if [ -f "$stale" ] && [ "$(basename "$stale")" != "$(basename "$wheel")" ]; then
    echo "build-wheel: removing the older $stale"
    rm -f "$stale"
  fi
done
cp "$wheel" "$out_dir/"
echo "$out_dir/$(basename "$wheel")"
