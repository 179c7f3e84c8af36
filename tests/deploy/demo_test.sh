#!/usr/bin/env bash
# The README's main command end to end, small: deploy/local/demo.sh must
# pass (every rank's digest equal to the run without failure) and leave no
# process behind; interrupted midway, it must say so, fail, and still leave
# no process behind. With CKPTD_DEMO_REPLICAS=N set, the demo's replicated
# mode (N coordinator replicas on etcd, the leader SIGKILLed between drills):
# the whole run must pass the same way, and say how the failover went; the
# interrupted run is left to the default mode.
#   demo_test.sh BIN_DIR WORK_DIR
set -uo pipefail
BIN="$1"
WORK="$2"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
rm -rf "$WORK" && mkdir -p "$WORK"
failures=0
check() {  # check WHAT CONDITION...
  local what="$1"
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}
# Processes whose command line names $1 (the demo's folder), other than this test.
leftovers() { pgrep -f -- "$1" | grep -v "^$$\$" || true; }

export CKPTD_DEMO_NO_BUILD=1 CKPTD_BIN="$BIN" CKPTD_DEMO_STEPS=300 CKPTD_DEMO_STEP_MS=20 CKPTD_DEMO_STATE_MB=4

# 1. A whole run.
CKPTD_DEMO_DIR="$WORK/full" "$REPO/deploy/local/demo.sh" >"$WORK/full.log" 2>&1
code=$?
cat "$WORK/full.log"
check "the demo exits 0" [ "$code" -eq 0 ]
check "its last line is demo: PASS" [ "$(tail -n 1 "$WORK/full.log")" = "demo: PASS" ]
check "it shows progress" grep -q "step [0-9]*/300, newest checkpoint" "$WORK/full.log"
check "every digest matches" grep -q "digests          6 of 6 ranks equal" "$WORK/full.log"
check "the node crash was detected" grep -q "node crash       detected in" "$WORK/full.log"
check "the corrupted step was quarantined" grep -q "found by verification, quarantined" "$WORK/full.log"
check "the trainer crash was restored from the agents' memory" \
  grep -qE "^    read from      [1-6] from their agent's memory" "$WORK/full.log"
# The summary's "read from" line of a drill (the lines after its title) matches $2.
read_from() { grep -A4 "^  $1" "$WORK/full.log" | grep -m1 "^    read from" | grep -qE "$2"; }
check "after the node crash, node-c's ranks read their partner's memory" \
  read_from "node crash " "[1-6] from a peer agent's memory"
check "the crash of a node and its partner was detected" grep -q "node + partner   detected in" "$WORK/full.log"
check "after a node and its partner crashed, their ranks read the disk tiers" \
  read_from "node + partner " "[1-6] from (their node's disk|the shared root)"
check "the drill reports were written" test -s "$WORK/full/drill-kill-node.html" -a -s "$WORK/full/drill-kill-partners.html"
if [ -n "${CKPTD_DEMO_REPLICAS:-}" ]; then
  check "the replicas started on etcd" grep -q "$CKPTD_DEMO_REPLICAS coordinator replicas on etcd" "$WORK/full.log"
  check "the leader was killed and a standby led" grep -qE "^  leader killed    127.0.0.1:[0-9]+: 127.0.0.1:[0-9]+ led after [0-9.]+ s" "$WORK/full.log"
  check "the job committed a step after the failover" grep -qE "the job's next commit came [0-9.]+ s after the kill" "$WORK/full.log"
  check "the kill-coordinator drill report was written" test -s "$WORK/full/drill-kill-coordinator.html"
fi
sleep 0.5
check "no process left behind" [ -z "$(leftovers "$WORK/full")" ]

# 2. Interrupted (Ctrl-C) during the run with failures (the default mode
# only). With job control on, the demo runs in a process group of its own
# that does not ignore SIGINT, as from a terminal.
if [ -z "${CKPTD_DEMO_REPLICAS:-}" ]; then
set -m
CKPTD_DEMO_DIR="$WORK/interrupted" "$REPO/deploy/local/demo.sh" >"$WORK/interrupted.log" 2>&1 &
demo=$!
set +m
for _ in $(seq 600); do
  grep -q "drill 1:" "$WORK/interrupted.log" 2>/dev/null && break
  sleep 0.1
done
kill -INT "$demo"
wait "$demo"
code=$?
cat "$WORK/interrupted.log"
check "interrupted, it fails" [ "$code" -ne 0 ]
check "interrupted, it says so last" [ "$(tail -n 1 "$WORK/interrupted.log")" = "demo: FAIL interrupted" ]
sleep 0.5
check "interrupted, no process left behind" [ -z "$(leftovers "$WORK/interrupted")" ]
if [ -n "$(leftovers "$WORK/interrupted")" ]; then ps -f -p "$(leftovers "$WORK/interrupted" | tr '\n' ',' | sed 's/,$//')"; fi
fi

if [ "$failures" -eq 0 ]; then
  rm -rf "$WORK"
  echo "demo_test: PASS"
else
  echo "demo_test: $failures check(s) failed; kept $WORK"
  exit 1
fi
