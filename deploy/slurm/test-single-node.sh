#!/usr/bin/env bash
# Runs deploy/slurm/ckptd-job.sbatch on a real, single-node Slurm cluster
# started here, and requeues it midway:
#   1. writes a minimal slurm.conf for this host into a temporary folder and
#      starts munged, slurmctld and slurmd from it (foreground daemons in the
#      background, as root, every file and all state in that folder; nothing
#      of the system's Slurm or munge set-up is used or changed);
#   2. submits the sbatch example with a small job (2 ranks on 1 node);
#   3. once a checkpoint has committed, requeues it (`scontrol requeue`);
#   4. waits for it to finish, and checks that after the requeue every rank
#      restored a committed step, reached the final step, and ended with the
#      same digest as a run that never stopped; that the agents and the
#      coordinator were stopped; that the output was appended to, not replaced;
#   5. stops every daemon it started (also when interrupted or failing).
#
#   deploy/slurm/test-single-node.sh [BIN_DIR] [WORK_DIR]
#     BIN_DIR   the ckptd binaries (default build/bin)
#     WORK_DIR  where to keep everything (default: a new temporary folder,
#               removed on success; kept, and named, on failure)
#
# Needs root and Debian's slurmctld, slurmd, slurm-client and munge packages
# (CKPTD_SLURM_INSTALL=1: install them with apt-get when missing). Prints
# "ok: ..." / "FAILED: ..." per check, then "slurm test: PASS" or
# "slurm test: FAIL" (exit 0 or 1; 2: it could not run at all; 77: skipped,
# not root and not under CI).
set -uo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$(cd "${1:-$REPO/build/bin}" 2>/dev/null && pwd)" || { echo "slurm test: no binaries folder ${1:-}"; exit 2; }
START=$SECONDS

say() { echo "slurm test: $*"; }
die() { say "cannot run: $*"; exit 2; }

if [ "$(id -u)" -ne 0 ]; then
  # CI runs as root; a developer's ctest without root skips (77) instead.
  [ "${CI:-}" = true ] && die "it needs root (slurmd starts jobs as their user)"
  say "SKIPPED: it needs root (slurmd starts jobs as their user)"
  exit 77
fi
for b in ckptd-coordinator ckptd-agent ckptd-demo-trainer; do
  [ -x "$BIN/$b" ] || die "$BIN/$b is missing: build first"
done
need=()
for p in slurmctld slurmd slurm-client munge; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "${CKPTD_SLURM_INSTALL:-0}" = 1 ]; then
    say "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
      die "apt-get install ${need[*]} failed"
  else
    die "Debian packages missing: ${need[*]} (apt-get install ${need[*]}, or CKPTD_SLURM_INSTALL=1)"
  fi
fi

if [ -n "${2:-}" ]; then
  T="$2"
  rm -rf "$T"
  mkdir -p "$T" || die "cannot create $T"
  KEEP=1
else
  T="$(mktemp -d /tmp/ckptd-slurm-test.XXXXXX)" || die "mktemp failed"
  KEEP=0
fi
T="$(cd "$T" && pwd)"
chmod 0755 "$T"

DAEMONS=()
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  if [ -n "${SLURM_CONF:-}" ] && [ -n "${JOBID:-}" ]; then
    scancel "$JOBID" >/dev/null 2>&1
    sleep 1
  fi
  for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do kill -TERM "${DAEMONS[$i]}" 2>/dev/null; done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${DAEMONS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.1
  done
  for pid in "${DAEMONS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
  # Anything the job left running (it should leave nothing: checked above).
  pkill_ours
  if [ "$code" -eq 0 ] && [ "$KEEP" -eq 0 ]; then rm -rf "$T"; else say "files kept in $T"; fi
  exit "$code"
}
# Processes whose command line names this test's folder, other than the daemons.
ours() {
  local p d
  for p in $(pgrep -f -- "$T/"); do
    for d in "${DAEMONS[@]}"; do [ "$p" = "$d" ] && continue 2; done
    [ "$p" = "$$" ] || echo "$p"
  done
}
pkill_ours() {
  local p
  for p in $(ours); do kill -KILL "$p" 2>/dev/null; done
}
trap cleanup EXIT
trap 'say "interrupted"; exit 1' INT TERM

failures=0
check() {  # check WHAT COMMAND...
  local what="$1"
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# ------------------------------------------------------------ the cluster
HOST="$(hostname -s)"
CPUS="$(nproc)"
[ "$CPUS" -ge 2 ] || CPUS=2  # two ranks on one node; slurm lets a node claim what it lacks
mkdir -p "$T/munge" "$T/ctld" "$T/slurmd" "$T/logs" "$T/submit"
chmod 0700 "$T/munge"
mungekey --create --keyfile="$T/munge/munge.key" >/dev/null 2>&1 ||
  { dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 2>/dev/null && chmod 0400 "$T/munge/munge.key"; }
# --force: munged refuses a socket in a world-writable (sticky) folder such
# as /tmp without it.
munged --foreground --force --socket="$T/munge/munge.socket" --key-file="$T/munge/munge.key" \
  --pid-file="$T/munge/munged.pid" --log-file="$T/logs/munged.log" --seed-file="$T/munge/munged.seed" \
  >"$T/logs/munged.out" 2>&1 &
DAEMONS+=($!)
for _ in $(seq 100); do [ -S "$T/munge/munge.socket" ] && break; sleep 0.1; done
[ -S "$T/munge/munge.socket" ] || die "munged did not start: $(tail -n 5 "$T/logs/munged.log" "$T/logs/munged.out" 2>/dev/null)"

CTLD_PORT="$(free_port)"
SLURMD_PORT="$(free_port)"
cat >"$T/slurm.conf" <<EOF
# Written by deploy/slurm/test-single-node.sh: one node, no accounting, no cgroups.
ClusterName=ckptdtest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long Slurm holds a requeued job back (default 120 s).
AuthInfo=socket=$T/munge/munge.socket,cred_expire=5
StateSaveLocation=$T/ctld
SlurmdSpoolDir=$T/slurmd
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/logs/slurmctld.log
SlurmdLogFile=$T/logs/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# A requeued job waits for cred_expire, then for a scheduling pass: make both short.
SchedulerParameters=bf_interval=1,sched_interval=1
MpiDefault=none
ReturnToService=2
KillWait=10
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=test Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$T/slurm.conf"
slurmctld -D -f "$SLURM_CONF" >"$T/logs/slurmctld.out" 2>&1 &
DAEMONS+=($!)
slurmd -D -f "$SLURM_CONF" -N "$HOST" >"$T/logs/slurmd.out" 2>&1 &
DAEMONS+=($!)
state=""
for _ in $(seq 300); do
  state="$(sinfo -h -n "$HOST" -o %T 2>/dev/null | head -n 1)"
  [ "$state" = idle ] && break
  sleep 0.1
done
[ "$state" = idle ] || die "the node is not idle (state '$state'); see $T/logs/slurmctld.log and slurmd.log"
say "Slurm $(sinfo -V | cut -d' ' -f2) up on $HOST after $((SECONDS - START)) s"

# ------------------------------------------------------------------ the job
STEPS=600
STEP_MS=15
STATE_MB=4
WORK="$T/work"
mkdir -p "$T/tmp" "$T/sock"
# The digest of each rank in a run that never stops (no agent: no checkpoints).
declare -a REF
for r in 0 1; do
  REF[r]="$("$BIN/ckptd-demo-trainer" --socket "$T/no-agent.sock" --job ref --rank "$r" --world-size 2 \
    --steps "$STEPS" --state-mb "$STATE_MB" 2>/dev/null | sed -n 's/^final_step=\([0-9]*\) digest=\([0-9a-f]*\).*/\1 \2/p')"
done
{ [ -n "${REF[0]}" ] && [ -n "${REF[1]}" ]; } || die "the reference run of ckptd-demo-trainer failed"

OUT="$T/submit/job.out"
# The agents reach the coordinator by this host's name, unless it does not resolve.
COORD_HOST="$(hostname)"
getent hosts "$COORD_HOST" >/dev/null 2>&1 || COORD_HOST=127.0.0.1
JOBID="$(cd "$T/submit" && TMPDIR="$T/tmp" CKPTD_COORDINATOR_HOST="$COORD_HOST" CKPTD_BIN="$BIN" CKPTD_WORK_DIR="$WORK" DEMO_STEPS="$STEPS" \
  DEMO_STEP_MS="$STEP_MS" DEMO_STATE_MB="$STATE_MB" \
  CKPTD_SOCKET_DIR="$T/sock" CKPTD_COORDINATOR_OPTS="--every 25" \
  sbatch --parsable --nodes=1 --ntasks-per-node=2 --output="$OUT" "$REPO/deploy/slurm/ckptd-job.sbatch")" ||
  die "sbatch failed"
JOBID="${JOBID%%;*}"
say "submitted job $JOBID"

job_state() { scontrol -o show job "$JOBID" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
newest_committed() {
  find "$WORK/checkpoints" -name MANIFEST 2>/dev/null | sed -n 's|.*/step-\([0-9]*\)/MANIFEST$|\1|p' |
    sort -n | tail -n 1
}
ended() { case "$1" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE) return 0 ;; esac; return 1; }

# requeue_when_committed_past STEP HOW: once the job runs again and has
# committed a step newer than STEP, requeues it: HOW=outside is `scontrol
# requeue` (what a node failure or preemption does), HOW=time-limit is the
# SIGUSR1 that --signal=B:USR1@120 sends before the time limit (the script
# stops everything gracefully and requeues itself). Then waits until the job
# is down and sets NEWEST to the newest committed step: the next start must
# restore that one.
requeue_when_committed_past() {
  local past="$1" how="$2" done=0 st n
  for _ in $(seq 1800); do
    st="$(job_state)"
    n="$(newest_committed)"
    if [ "$st" = RUNNING ] && [ -n "$n" ] && [ "$n" -gt "$past" ]; then
      if [ "$how" = outside ]; then
        scontrol requeue "$JOBID" && done=1
      else
        scancel --batch --signal=USR1 "$JOBID" && done=1
      fi
      break
    fi
    ended "$st" && break
    sleep 0.1
  done
  check "the job was requeued ($how) after committing a step past $past" [ "$done" -eq 1 ]
  # Until every process of that start is gone (Slurm holds the next start
  # back for cred_expire after that), so that no commit can follow.
  for _ in $(seq 600); do
    st="$(job_state)"
    [ "$st" != RUNNING ] && [ "$st" != COMPLETING ] && [ -z "$(ours)" ] && break
    sleep 0.1
  done
  NEWEST="$(newest_committed)"
  say "requeued ($how) after $((SECONDS - START)) s; newest committed step then: ${NEWEST:-none}"
}

requeue_when_committed_past 25 outside
NEWEST_1="$NEWEST"
requeue_when_committed_past "${NEWEST_1:-0}" time-limit
NEWEST_2="$NEWEST"

# Slurm holds a requeued job back for a moment (BeginTime); then it runs again.
final=""
for _ in $(seq 1800); do
  final="$(job_state)"
  ended "$final" && break
  sleep 0.1
done
say "job ended $final after $((SECONDS - START)) s"
sleep 1

# --------------------------------------------------------------- the checks
check "the job completed" [ "$final" = COMPLETED ]
restarts="$(scontrol -o show job "$JOBID" 2>/dev/null | sed -n 's/.* Restarts=\([0-9]*\).*/\1/p')"
check "Slurm counts two restarts (Restarts=$restarts)" [ "${restarts:-0}" -eq 2 ]
check "the output holds all three starts (--open-mode=append)" \
  [ "$(grep -c "^ckptd-job: job .*, start " "$OUT")" -eq 3 ]
check "the third start knows it was requeued twice" grep -q "start 3: requeued 2 time" "$OUT"
# What each start printed.
start_2="$(sed -n '/start 2: requeued 1 time/,/start 3: requeued 2 time/p' "$OUT")"
start_3="$(sed -n '/start 3: requeued 2 time/,$p' "$OUT")"
check "the time-limit signal stopped the second start gracefully" \
  grep -q "time limit near: stopping gracefully and requeueing" <<<"$start_2"
check "... the agents persisted what they held and exited (ckptd-agent: stopping)" \
  [ "$(grep -c " INFO ckptd-agent: stopping" "$WORK/logs/agent-$JOBID-$HOST.log")" -ge 2 ]
for r in 0 1; do
  for n in 2 3; do
    if [ "$n" = 2 ]; then text="$start_2" want="$NEWEST_1"; else text="$start_3" want="$NEWEST_2"; fi
    restored="$(sed -n "s/^$r: ckptd-demo-trainer: restored step \([0-9]*\)$/\1/p" <<<"$text" | head -n 1)"
    check "start $n: rank $r restored the newest committed step (restored ${restored:-none}, newest committed ${want:-none})" \
      [ "${restored:-none}" = "${want:-nothing}" ]
  done
  got="$(sed -n "s/^$r: final_step=\([0-9]*\) digest=\([0-9a-f]*\).*/\1 \2/p" <<<"$start_3" | tail -n 1)"
  check "rank $r finished at step $STEPS with the digest of a run that never stopped ($got)" \
    [ "$got" = "${REF[$r]}" ]
done
check "at the end the script stopped the agents" grep -q "ckptd-job: agents stopped" <<<"$start_3"
check "... and the coordinator" grep -q "ckptd-job: coordinator stopped" <<<"$start_3"
check "... and removed the coordinator's state" [ -z "$(ls -A "$T/tmp")" ]
sleep 0.5
left="$(ours)"
check "no ckptd process of the job is left running" [ -z "$left" ]
[ -z "$left" ] || ps -o pid,args -p "$(tr '\n' ',' <<<"$left" | sed 's/,$//')" 2>/dev/null

echo "---- job output ($OUT)"
cat "$OUT"
echo "----"
say "took $((SECONDS - START)) s in all"
if [ "$failures" -eq 0 ]; then
  say "PASS"
  exit 0
fi
say "FAIL ($failures check(s) failed; logs in $T/logs and $WORK/logs)"
KEEP=1
exit 1
