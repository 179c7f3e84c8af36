#!/usr/bin/env bash
# Installs the Debian 12 packages ckptd needs to build and test. Idempotent:
# it asks apt only for packages that are not installed yet.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev liburing-dev libzstd-dev zstd libxxhash-dev libsqlite3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # s3:// storage roots: libcurl signs (AWS SigV4) and sends, pugixml reads
  # S3's XML, libssl-dev's libcrypto makes DeleteObjects' Content-MD5.
  libcurl4-openssl-dev libpugixml-dev libssl-dev
  # tests/s3: a single-node Ceph RADOS Gateway (tests/s3/rgw.sh) that the
  # object-store tests run against, and the S3 clients the benchmark
  # measures ckptd beside (boto3, awscli).
  radosgw ceph-mon ceph-osd ceph-common uuid-runtime python3-boto3 awscli
  # tests/etcd: coordinator high availability runs against a real etcd
  # (tests/etcd/etcd.sh starts one member or a 3-member cluster on loopback);
  # golang-etcd-server-dev ships the etcd v3 .proto files the coordinator's
  # etcd client is generated from.
  etcd-server etcd-client golang-etcd-server-dev
  clang libclang-rt-14-dev
  fio python3
  openssl  # generates the test CA for the coordinator's mutual-TLS tests
  # tests/deploy/deploy_files_test.sh: lints the Kubernetes manifests
  # (yamllint), loads them (python3-yaml) and checks the shell scripts
  # (shellcheck); systemd-analyze comes with systemd.
  yamllint python3-yaml shellcheck systemd
  # deploy/slurm/test-single-node.sh (ctest DeployTest.SlurmSingleNodeRequeueResumes)
  # runs the sbatch example on a one-node Slurm it starts itself: about 10 s
  # to install, about 35 s to run.
  slurmctld slurmd slurm-client munge
  # tests/python: the Python binding's tests (ctest python.*) train small
  # PyTorch models through libckptd.so, CPU only; without these they are
  # reported as skipped.
  python3-torch python3-numpy
  # tests/python/test_packaging.py: `pip install ./python` into a venv, offline.
  python3-venv python3-pip python3-setuptools python3-wheel
  # scripts/build-wheel.sh (tests/python/test_wheel.py): the manylinux wheel
  # with the daemons and their shared libraries; patchelf sets their RUNPATH.
  patchelf binutils
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# promtool checks the metrics exposition and the alert rules of
# deploy/prometheus (tests/deploy/deploy_files_test.sh) in the tests. It
# ships inside Debian's prometheus package, whose installation would also
# set up a prometheus server; only the one binary is unpacked, into .tools/.
TOOLS="$(cd "$(dirname "$0")/.." && pwd)/.tools"
if ! command -v promtool >/dev/null 2>&1 && [ ! -x "$TOOLS/promtool" ]; then
  tmp="$(mktemp -d)"
  if (cd "$tmp" && apt-get download -qq prometheus >/dev/null 2>&1) &&
     dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/unpacked"; then
    mkdir -p "$TOOLS"
    cp "$tmp/unpacked/usr/bin/promtool" "$TOOLS/promtool"
    echo "install-deps: promtool unpacked into .tools/"
  else
    echo "install-deps: could not fetch promtool; the metrics format checks will be skipped (and under CI the deploy files test fails)"
  fi
  rm -rf "$tmp"
fi

# tests/python/test_export.py reads an exported step back with the
# safetensors package from PyPI (with Debian's numpy), which Debian does not
# ship: it goes into .tools/python. Best effort: without it (no network to
# PyPI) that one test is reported as skipped.
if [ ! -d "$TOOLS/python/safetensors" ] && [ -x /usr/bin/python3 ]; then
  if timeout 300 /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
       --target "$TOOLS/python" safetensors >/dev/null 2>&1; then
    echo "install-deps: safetensors installed into .tools/python"
  else
    echo "install-deps: could not install safetensors from PyPI; its export test will be skipped"
  fi
fi

# tests/deploy/deploy_files_test.sh checks every Kubernetes manifest against
# Kubernetes' own schemas with kubernetes-validate from PyPI (Debian does not
# ship it), installed into .tools/k8s-validate. Best effort here: without it
# (no network to PyPI) that check fails under CI=true and is skipped otherwise.
if [ ! -d "$TOOLS/k8s-validate/kubernetes_validate" ] && [ -x /usr/bin/python3 ]; then
  if timeout 300 /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
       --target "$TOOLS/k8s-validate" kubernetes-validate >/dev/null 2>&1; then
    echo "install-deps: kubernetes-validate installed into .tools/k8s-validate"
  else
    echo "install-deps: could not install kubernetes-validate from PyPI; the manifests' schema check needs it"
  fi
fi
