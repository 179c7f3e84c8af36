#!/usr/bin/env bash
# Installs ckptd's binaries and its systemd units on this machine (or into
# another root, for packaging and tests). Run as root, from a built tree:
#
#   deploy/systemd/install.sh [--bin DIR] [--root DIR]
#     --bin DIR   where the built binaries are (default: build/bin of this repository)
#     --root DIR  install under DIR instead of / (nothing is started or reloaded)
#
# What it installs:
#   /usr/local/bin/{ckptd-coordinator,ckptd-agent,ckptctl,ckptd-demo-trainer}
#   /etc/systemd/system/{ckptd-coordinator,ckptd-agent}.service
#   /etc/ckptd/{coordinator,agent}.env        only when absent: your settings stay
#   /etc/ckptd/operator-token                 only when absent: a new random token (root, 0600)
#   /etc/ckptd/agent-token                    only when absent: a new random token (root, 0600);
#                                             copy the coordinator node's to every agent node
#   /usr/lib/sysusers.d/ckptd.conf            and runs systemd-sysusers: the ckptd user
#   /usr/local/share/doc/ckptd/operations.md
# It enables and starts nothing: edit /etc/ckptd/*.env, mount the storage
# root, then `systemctl enable --now ckptd-coordinator` (one node) and
# `systemctl enable --now ckptd-agent` (every training node). See
# docs/operations.md.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$REPO/build/bin"
ROOT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN="${2:?--bin needs a folder}"; shift 2 ;;
    --root) ROOT="${2:?--root needs a folder}"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
BINARIES=(ckptd-coordinator ckptd-agent ckptctl ckptd-demo-trainer)
for b in "${BINARIES[@]}"; do
  [ -x "$BIN/$b" ] || { echo "install.sh: $BIN/$b is missing: build first (cmake --build build)" >&2; exit 1; }
done
if [ -z "$ROOT" ] && [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run it as root (or with --root DIR)" >&2
  exit 1
fi
HERE="$REPO/deploy/systemd"

install -d -m 0755 "$ROOT/usr/local/bin" "$ROOT/etc/systemd/system" "$ROOT/usr/lib/sysusers.d" \
  "$ROOT/usr/local/share/doc/ckptd"
install -d -m 0755 "$ROOT/etc/ckptd"
for b in "${BINARIES[@]}"; do
  install -m 0755 "$BIN/$b" "$ROOT/usr/local/bin/$b"
done
install -m 0644 "$HERE/ckptd-coordinator.service" "$HERE/ckptd-agent.service" "$ROOT/etc/systemd/system/"
install -m 0644 "$HERE/ckptd.sysusers.conf" "$ROOT/usr/lib/sysusers.d/ckptd.conf"
install -m 0644 "$REPO/docs/operations.md" "$ROOT/usr/local/share/doc/ckptd/operations.md"
for f in coordinator.env agent.env; do
  if [ -e "$ROOT/etc/ckptd/$f" ]; then
    echo "install.sh: keeping /etc/ckptd/$f (the new default is $HERE/$f)"
  else
    install -m 0644 "$HERE/$f" "$ROOT/etc/ckptd/$f"
  fi
done
if [ ! -e "$ROOT/etc/ckptd/operator-token" ]; then
  (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$ROOT/etc/ckptd/operator-token")
  echo "install.sh: wrote a new operator token to /etc/ckptd/operator-token (ckptctl --token-file)"
fi
chmod 0600 "$ROOT/etc/ckptd/operator-token"
# The agents' credential: the coordinator's and every agent's units read the
# same file, so the one made on the coordinator's node goes to every node.
if [ ! -e "$ROOT/etc/ckptd/agent-token" ]; then
  (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$ROOT/etc/ckptd/agent-token")
  echo "install.sh: wrote a new agent token to /etc/ckptd/agent-token: every node needs the coordinator" \
    "node's (copy it there, root, 0600)"
fi
chmod 0600 "$ROOT/etc/ckptd/agent-token"

if [ -z "$ROOT" ]; then
  systemd-sysusers /usr/lib/sysusers.d/ckptd.conf
  if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
else
  systemd-sysusers --root="$ROOT" "$ROOT/usr/lib/sysusers.d/ckptd.conf" >/dev/null 2>&1 ||
    echo "install.sh: systemd-sysusers --root $ROOT failed; run systemd-sysusers on the target"
fi
echo "install.sh: installed into ${ROOT:-/}. Next: edit /etc/ckptd/*.env, mount the storage root" \
  "(/srv/ckptd/checkpoints, writable by the ckptd user), then systemctl enable --now ckptd-coordinator" \
  "(one node) or ckptd-agent (each training node)."
