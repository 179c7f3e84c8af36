#!/usr/bin/env bash
# ckptd's whole job on one machine. Starts a coordinator and three agents as
# if on three nodes (loopback, node ids node-a, node-b, node-c), and a job of
# six ckptd-demo-trainer ranks spread over them under an elastic launcher
# (deploy/local/launch.sh). First a reference run with no failure; then the
# same job with failure drills: a trainer killed (every rank restores from
# its agent's memory), a committed shard corrupted, node-c crashing (its
# agent and trainers SIGKILLed) mid-run (its ranks restore from the copy its
# replication partner holds in memory), then node-a crashing together with
# its partner (no copy left in memory: their ranks read the disks). Each node
# is its own failure domain (rack-1..3). ckptd detects each crash, the
# launcher restarts the job, every rank restores the newest intact checkpoint
# (never the corrupted one), and the job finishes. The final digest of every
# rank must equal the reference run's. Last, node-c is lost for good with no
# spare: the launcher restarts the job on the two nodes left, four ranks
# instead of six, which restore the newest checkpoint resharded (one model
# split over the ranks, --sharded) and finish where a run of six ranks that
# lost nothing ends (docs/elastic.md).
#
# Prints progress, a summary, and as its last line `demo: PASS` or
# `demo: FAIL <reason>` (exit 0 or 1). Leaves no process behind, also when
# interrupted. Data (storage roots, state, logs, the drill reports as HTML)
# stays under one folder, named at the start.
#
#   CKPTD_DEMO_DIR=DIR     where to keep it all (default build/demo/cluster; emptied first)
#   CKPTD_DEMO_STEPS=N     training steps per run (default 400)
#   CKPTD_DEMO_STEP_MS=MS  time per step (default 25)
#   CKPTD_DEMO_STATE_MB=M  model state per rank in MiB (default 16)
#   CKPTD_DEMO_DURABLE_EVERY=K|auto  the coordinator's --durable-every (default auto):
#                          with K=2, every other checkpoint stays in memory, and a
#                          failure has the newest of them written to disk from the
#                          surviving copies (the summary's "emergency persist")
#   CKPTD_DEMO_ROOT=s3://BUCKET/PREFIX  keep the shared storage root in an object
#                          store (each run under PREFIX/<run>; AWS_ENDPOINT_URL,
#                          AWS_ACCESS_KEY_ID, ... name the store and the
#                          credentials); default: a folder under DIR
#   CKPTD_DEMO_REPLICAS=N  N (2..5) coordinator replicas on etcd (a one-member etcd
#                          from Debian's etcd-server) instead of one coordinator;
#                          the drill run then also has the leading replica kill
#                          itself between drills (ckptctl drill run --scenario
#                          kill-coordinator; a supervisor restarts it, as systemd
#                          would): the job goes on and must end with the same
#                          digests, and the summary gives the failover times
#   CKPTD_DEMO_NO_BUILD=1  use the binaries as they are (no install, no build)
#   CKPTD_BIN=DIR          where the binaries are (default build/bin)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
REPO="$PWD"
BIN="${CKPTD_BIN:-$REPO/build/bin}"
DIR="${CKPTD_DEMO_DIR:-$REPO/build/demo/cluster}"
STEPS="${CKPTD_DEMO_STEPS:-400}"
STEP_MS="${CKPTD_DEMO_STEP_MS:-25}"
STATE_MB="${CKPTD_DEMO_STATE_MB:-16}"
DURABLE_EVERY="${CKPTD_DEMO_DURABLE_EVERY:-auto}"
REPLICAS="${CKPTD_DEMO_REPLICAS:-1}"
JOB="demo-job"
NODES=(node-a node-b node-c)
RANKS_PER_NODE=2
WORLD=$((${#NODES[@]} * RANKS_PER_NODE))
CRASH_NODE="node-c"
CRASH_WITH_PARTNER="node-a"
LOST_NODE="node-c"  # the last of NODES: its ranks are the highest

say() { echo "demo: $*"; }
fail() {
  echo "demo: FAIL $*"
  exit 1
}

# ------------------------------------------------------------------ set-up
if [ "${CKPTD_DEMO_NO_BUILD:-0}" != 1 ]; then
  say "[setup] installing what is missing and building"
  ./scripts/install-deps.sh || fail "could not install the Debian packages (scripts/install-deps.sh)"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || fail "cmake could not configure build/"
  cmake --build build -j "$(nproc)" --target ckptd-coordinator ckptd-agent ckptd-demo-trainer ckptctl >/dev/null ||
    fail "the build failed (run: cmake --build build)"
fi
for b in ckptd-coordinator ckptd-agent ckptd-demo-trainer ckptctl; do
  [ -x "$BIN/$b" ] || fail "$BIN/$b is missing: build first"
done
command -v python3 >/dev/null || fail "python3 is needed to read ckptctl's JSON"
case "$REPLICAS" in [1-5]) ;; *) fail "CKPTD_DEMO_REPLICAS=$REPLICAS: give 1 (one coordinator) to 5 replicas" ;; esac
if [ "$REPLICAS" -gt 1 ]; then
  ETCD_BIN=$(command -v etcd || echo /usr/bin/etcd)
  [ -x "$ETCD_BIN" ] || fail "CKPTD_DEMO_REPLICAS needs etcd (Debian: etcd-server; scripts/install-deps.sh installs it)"
fi
case "$DIR" in /*) ;; *) DIR="$PWD/$DIR" ;; esac
rm -rf "$DIR" && mkdir -p "$DIR" || fail "cannot create $DIR"
say "data, logs and reports under $DIR"
[ -n "${CKPTD_DEMO_ROOT:-}" ] && say "the shared storage root in an object store: ${CKPTD_DEMO_ROOT%/}/<run>"

# -------------------------------------------------------------- processes
# Every process this script starts is recorded; cleanup stops them all.
PIDFILE="$DIR/pids"
: >"$PIDFILE"
STOP="$DIR/stop"
remember() { echo "$1" >>"$PIDFILE"; }
any_alive() {
  local pid
  for pid in "$@"; do kill -0 "$pid" 2>/dev/null && return 0; done
  return 1
}
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  touch "$STOP"
  # Everything started: the processes of this script (coordinators, agent
  # supervisors, launchers, drills), every agent and every trainer rank.
  local pids=()
  mapfile -t pids < <(cat "$PIDFILE" "$DIR"/*/agent-pids "$DIR"/*/launcher/pids 2>/dev/null)
  if [ ${#pids[@]} -gt 0 ]; then
    kill -TERM "${pids[@]}" 2>/dev/null
    # An agent persists what it holds before it exits: a few seconds, then
    # whatever is left is killed.
    for _ in $(seq 50); do
      any_alive "${pids[@]}" || break
      sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null
  fi
  wait 2>/dev/null
  # An agent killed (by a drill, or here) cannot free its shared-memory staging.
  for f in "$DIR"/*/agent-pids; do
    [ -f "$f" ] && while read -r pid; do rm -f /dev/shm/ckptd-"$pid"-* 2>/dev/null; done <"$f"
  done
  exit "$code"
}
trap cleanup EXIT
trap 'echo; echo "demo: FAIL interrupted"; exit 130' INT TERM

# A cluster under $DIR/$1: coordinator, one agent per node (restarted when it
# dies, as systemd would), and the helpers to ask it how the job is doing.
start_cluster() {
  local run="$1"
  CL="$DIR/$run"
  mkdir -p "$CL/state" "$CL/logs" "$CL/launcher"
  if [ -n "${CKPTD_DEMO_ROOT:-}" ]; then
    ROOT="${CKPTD_DEMO_ROOT%/}/$run"
  else
    ROOT="$CL/root"
    mkdir -p "$ROOT"
  fi
  # The interval policy on: the failure rate assumed here (0.5 per GPU-hour)
  # makes its choice seconds, which suits a demo that lasts seconds.
  COORD_FLAGS=(--storage-root "$ROOT" --heartbeat-interval 200ms --node-lost-after 1500ms --initial-every 20
    --failure-rate 0.5 --min-interval 0 --decide-every 1s --keep 3 --durable-every "$DURABLE_EVERY")
  if [ "$REPLICAS" -gt 1 ]; then
    start_replicas "$run"
    return
  fi
  "$BIN/ckptd-coordinator" --listen 127.0.0.1:0 --state-dir "$CL/state" "${COORD_FLAGS[@]}" \
    >"$CL/logs/coordinator.out" 2>"$CL/logs/coordinator.log" &
  remember $!
  local port=""
  for _ in $(seq 300); do
    port=$(sed -n 's/^.* INFO ckptd-coordinator: listening on 127.0.0.1:\([0-9]*\)$/\1/p' "$CL/logs/coordinator.log")
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || fail "the coordinator did not start (see $CL/logs/coordinator.log)"
  ADDR="127.0.0.1:$port"
  TOKEN="$CL/state/operator-token"
  # The agents' credential: the token the coordinator generated (written once
  # both its ports are bound, before it says it listens).
  AGENT_TOKEN="$CL/state/agent-token"
  for _ in $(seq 100); do
    [ -s "$AGENT_TOKEN" ] && break
    sleep 0.1
  done
  [ -s "$AGENT_TOKEN" ] || fail "the coordinator wrote no agent token (see $CL/logs/coordinator.log)"
  start_agents
}

# Free TCP ports on 127.0.0.1, $1 of them (the system's choice, released
# again: fixed ports let a restarted replica keep the address agents know).
free_ports() {
  python3 -c 'import socket,sys
socks=[socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1",0))
print("\n".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

# Replicated coordinators: a one-member etcd, the tokens every replica
# shares, and $REPLICAS replicas (each restarted when it dies); ADDR lists
# them all, and agents and ckptctl follow the leader.
start_replicas() {
  local run="$1" ports=() i
  mapfile -t ports < <(free_ports $((REPLICAS + 2)))
  ETCD="127.0.0.1:${ports[0]}"
  "$ETCD_BIN" --name demo --data-dir "$CL/etcd" --listen-client-urls "http://$ETCD" \
    --advertise-client-urls "http://$ETCD" --listen-peer-urls "http://127.0.0.1:${ports[1]}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${ports[1]}" \
    --initial-cluster "demo=http://127.0.0.1:${ports[1]}" >"$CL/logs/etcd.log" 2>&1 &
  remember $!
  TOKEN="$CL/state/operator-token"
  AGENT_TOKEN="$CL/state/agent-token"
  for f in "$TOKEN" "$AGENT_TOKEN"; do
    (umask 077 && python3 -c 'import secrets; print(secrets.token_hex(32))' >"$f")
  done
  COORD_PORTS=("${ports[@]:2}")
  ADDR=$(printf '127.0.0.1:%s,' "${COORD_PORTS[@]}")
  ADDR="${ADDR%,}"
  for i in "${!COORD_PORTS[@]}"; do
    supervise_coordinator "$i" "$run" 2>>"$CL/logs/supervisor.log" &
    remember $!
  done
  for _ in $(seq 300); do
    "$BIN/ckptctl" status --coordinator "$ADDR" >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$BIN/ckptctl" status --coordinator "$ADDR" >/dev/null 2>&1 ||
    fail "no coordinator replica leads (see $CL/logs/coordinator-*.log and $CL/logs/etcd.log)"
  say "  $REPLICAS coordinator replicas on etcd $ETCD: $ADDR, leader $(replication_field leader)"
  start_agents
}

# Replica $1 of the coordinator, restarted when it dies (as systemd would).
supervise_coordinator() {
  local i="$1" run="$2" n=0 child=""
  trap 'kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; exit 0' TERM
  while [ ! -e "$STOP" ]; do
    n=$((n + 1))
    "$BIN/ckptd-coordinator" --listen "127.0.0.1:${COORD_PORTS[$i]}" --etcd-endpoints "$ETCD" \
      --etcd-prefix "/ckptd/demo-$run" --operator-token-file "$TOKEN" --agent-token-file "$AGENT_TOKEN" \
      "${COORD_FLAGS[@]}" >"$CL/logs/coordinator-$i.$n.out" 2>"$CL/logs/coordinator-$i.$n.log" &
    child=$!
    echo "$child" >>"$CL/agent-pids"
    echo "$child" >"$CL/coordinator-$i.pid"
    wait "$child"
    local code=$?
    [ -e "$STOP" ] && break
    echo "demo:   coordinator replica $i exited ($code); restarting it, as systemd would"
    sleep 0.5
  done
}

# One field of `ckptctl status --json`'s replication (leader, epoch).
replication_field() {
  "$BIN/ckptctl" status --coordinator "$ADDR" --json 2>/dev/null |
    python3 -c 'import json,sys
r=(json.load(sys.stdin).get("replication") or {}).get(sys.argv[1])
print("" if r is None else r)' "$1" 2>/dev/null
}

start_agents() {
  # Node i serves ranks i*RANKS_PER_NODE... on socket node<i>.sock.
  for i in "${!NODES[@]}"; do
    # (Its stderr: bash's own note when an agent is killed.)
    supervise_agent "${NODES[$i]}" "$CL/node$i.sock" "rack-$((i + 1))" 2>>"$CL/logs/supervisor.log" &
    remember $!
  done
  for i in "${!NODES[@]}"; do
    for _ in $(seq 300); do
      [ -S "$CL/node$i.sock" ] && break
      sleep 0.1
    done
    [ -S "$CL/node$i.sock" ] || fail "the agent of ${NODES[$i]} did not start (see $CL/logs/agent-${NODES[$i]}.*.log)"
  done
}

supervise_agent() {
  local node="$1" socket="$2" domain="$3" n=0 child=""
  trap 'kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; exit 0' TERM
  # $CL/down-<node>: the node is gone for good; its agent is not restarted.
  while [ ! -e "$STOP" ] && [ ! -e "$CL/down-$node" ]; do
    n=$((n + 1))
    # The node's own disk ($CL/nvme-<node>, which survives the node's crash)
    # is its node-local tier: shards go there first, then to the shared root.
    # Each persisted step also goes to a partner agent's memory (peer
    # replication over loopback, on a port of the system's choosing).
    "$BIN/ckptd-agent" --storage-root "$ROOT" --socket "$socket" --coordinator "$ADDR" \
      --node-id "$node" --agent-token-file "$AGENT_TOKEN" --threads 2 --allow-drills --local-cache "$CL/nvme-$node" --local-cache-keep 3 \
      --peer-listen 127.0.0.1:0 --failure-domain "$domain" \
      >"$CL/logs/agent-$node.$n.out" 2>"$CL/logs/agent-$node.$n.log" &
    child=$!
    echo "$child" >>"$CL/agent-pids"
    echo "$child" >"$CL/agent-$node.pid"
    wait "$child"
    local code=$?
    [ -e "$STOP" ] || [ -e "$CL/down-$node" ] && break
    echo "demo:   the agent of $node exited ($code); restarting it, as systemd would"
    sleep 0.5
  done
}

# `ckptctl status --job` as JSON, and one field of its job.
job_field() {
  "$BIN/ckptctl" status --coordinator "$ADDR" --job "$JOB" --json 2>/dev/null |
    python3 -c 'import json,sys
d=json.load(sys.stdin); j=[x for x in d.get("jobs",[]) if x.get("job")==sys.argv[1]]
v=j[0].get(sys.argv[2]) if j else None
print("" if v is None else v)' "$JOB" "$1" 2>/dev/null
}

# Runs the job under the launcher in the background; LAUNCHER is its pid.
# $1: more trainer flags (--sharded). The launcher takes the number of ranks
# from $CL/ranks when it exists (a job that goes on with fewer).
start_job() {
  "$REPO/deploy/local/launch.sh" --ranks "$WORLD" --ranks-file "$CL/ranks" --grace 10 --max-restarts 4 \
    --log-dir "$CL/launcher" -- \
    sh -c 'exec "$0" --socket "$1/node$((RANK / $2)).sock" --job "$3" --rank "$RANK" --world-size "$WORLD_SIZE" \
           --steps "$4" --state-mb "$5" --step-ms "$6" --accum 4 --agent-wait-ms 30000 \
           --pace-file "$1/pace" $7' \
    "$BIN/ckptd-demo-trainer" "$CL" "$RANKS_PER_NODE" "$JOB" "$STEPS" "$STATE_MB" "$STEP_MS" "${1:-}" \
    2>"$CL/launcher/launch.log" &
  LAUNCHER=$!
  remember "$LAUNCHER"
}

# Prints progress every second until the launcher ends; its exit status.
follow_job() {
  local last=""
  while kill -0 "$LAUNCHER" 2>/dev/null; do
    local step committed state
    step=$(job_field fastest_step)
    committed=$(job_field newest_committed_step)
    state=$(job_field state)
    local line="step ${step:-?}/$STEPS, newest checkpoint ${committed:--}, ${state:-starting}"
    [ "$line" != "$last" ] && say "  $line"
    last="$line"
    sleep 1
  done
  wait "$LAUNCHER"
}

# "final_step=N digest=HEX" of each rank of the last attempt.
digests() {
  local last
  last=$(ls "$CL/launcher" | sed -n 's/^attempt-\([0-9]*\)\.rank-0\.out$/\1/p' | sort -n | tail -1)
  for ((r = 0; r < WORLD; r++)); do
    tail -n 1 "$CL/launcher/attempt-$last.rank-$r.out" | sed 's/ train_s=.*//'
  done
}

# --sharded: the job's digest, the sum of the last attempt's ranks' parts.
job_digest() {
  local last
  last=$(ls "$CL/launcher" | sed -n 's/^attempt-\([0-9]*\)\.rank-0\.out$/\1/p' | sort -n | tail -1)
  for f in "$CL/launcher/attempt-$last".rank-*.out; do tail -n 1 "$f"; done |
    python3 -c 'import sys
parts = [l.split("digest=")[1].split()[0] for l in sys.stdin if "digest=" in l]
print(f"{len(parts)} ranks, digest {sum(int(p, 16) for p in parts) % (1 << 64):016x}" if parts else "")'
}

stop_cluster() {
  touch "$STOP"
  while read -r pid; do kill -TERM "$pid" 2>/dev/null; done <"$PIDFILE"
  wait 2>/dev/null
  : >"$PIDFILE"
  rm -f "$STOP"
}

# ------------------------------------------------------- 1. reference run
say "[1/4] reference run: ${#NODES[@]} nodes x $RANKS_PER_NODE ranks, job $JOB, $STEPS steps of ${STEP_MS} ms, ${STATE_MB} MiB of state per rank, no failure"
start_cluster reference
start_job
follow_job || fail "the reference run failed (see $CL/launcher/launch.log)"
mapfile -t REFERENCE < <(digests)
REF_COMMITTED=$(job_field checkpoints_committed)
stop_cluster
say "  done: ${REF_COMMITTED:-0} checkpoints committed; rank 0 ${REFERENCE[0]}"

# ---------------------------------------------------------- 2. drill run
say "[2/4] the same job with failures: a trainer killed, a corrupted shard, $CRASH_NODE crashing mid-run, then $CRASH_WITH_PARTNER with its partner"
start_cluster run
start_job
# Wait for a few checkpoints before breaking things.
for _ in $(seq 600); do
  [ "$(job_field checkpoints_committed)" -ge 3 ] 2>/dev/null && break
  kill -0 "$LAUNCHER" 2>/dev/null || break
  sleep 0.1
done
[ "$(job_field checkpoints_committed)" -ge 3 ] 2>/dev/null || fail "no three checkpoints committed in the drill run"
# While the drills run, each step takes 250 ms (the trainers' --pace-file):
# on a slow or busy machine too, they strike a job that is still running.
echo 250 >"$CL/pace"
say "  drill 1: kill rank 1's trainer (SIGKILL); every rank restarts and restores from its agent's memory"
"$BIN/ckptctl" drill run --job "$JOB" --scenario kill-trainer --target 1 --watch 1m \
  --coordinator "$ADDR" --token-file "$TOKEN" --json --html "$DIR/drill-kill-trainer.html" \
  >"$DIR/drill-kill-trainer.json" 2>"$DIR/drill-kill-trainer.err"
TRAINER_CODE=$?
say "  drill 2: corrupt rank 0's shard of the newest committed step"
CORRUPTED=$(job_field newest_committed_step)
"$BIN/ckptctl" drill run --job "$JOB" --scenario corrupt-shard --target 0 --watch 1m \
  --coordinator "$ADDR" --token-file "$TOKEN" --json --html "$DIR/drill-corrupt-shard.html" \
  >"$DIR/drill-corrupt-shard.json" 2>"$DIR/drill-corrupt-shard.err"
CORRUPT_CODE=$?
COORD_CODE=0
if [ "$REPLICAS" -gt 1 ]; then
  say "  drill: the leading coordinator replica SIGKILLs itself; a standby takes over while the job trains"
  "$BIN/ckptctl" drill run --job "$JOB" --scenario kill-coordinator --watch 1m \
    --coordinator "$ADDR" --token-file "$TOKEN" --json --html "$DIR/drill-kill-coordinator.html" \
    >"$DIR/drill-kill-coordinator.json" 2>"$DIR/drill-kill-coordinator.err"
  COORD_CODE=$?
fi
# The node crash comes once a checkpoint (durable or in memory) newer than
# the step just quarantined has every rank's copy on a partner: older steps
# may have left the agents' memory, and their ranks would read the disk.
partner_held() {
  local step copies
  step=$(job_field "$1")
  copies=$(job_field "$2")
  [ "${step:-0}" -gt "${CORRUPTED:-0}" ] 2>/dev/null && [ "${copies:-0}" -eq "$WORLD" ] 2>/dev/null
}
for _ in $(seq 200); do
  partner_held newest_committed_step peer_copies && break
  partner_held newest_memory_checkpoint memory_checkpoint_peer_copies && break
  kill -0 "$LAUNCHER" 2>/dev/null || break
  sleep 0.1
done
say "  drill 3: crash $CRASH_NODE (its agent and trainers SIGKILLed); its ranks restore from its partner's memory"
"$BIN/ckptctl" drill run --job "$JOB" --scenario kill-node --target "$CRASH_NODE" --watch 2m \
  --coordinator "$ADDR" --token-file "$TOKEN" --json --html "$DIR/drill-kill-node.html" \
  >"$DIR/drill-kill-node.json" 2>"$DIR/drill-kill-node.err"
NODE_CODE=$?
say "  drill 4: crash $CRASH_WITH_PARTNER and its replication partner together; their ranks read the disks"
"$BIN/ckptctl" drill run --job "$JOB" --scenario kill-node --target "$CRASH_WITH_PARTNER" --with-partners \
  --watch 2m --coordinator "$ADDR" --token-file "$TOKEN" --json --html "$DIR/drill-kill-partners.html" \
  >"$DIR/drill-kill-partners.json" 2>"$DIR/drill-kill-partners.err" &
DRILL=$!
remember "$DRILL"
# Full speed again once the last drill is over.
(
  while kill -0 "$DRILL" 2>/dev/null; do sleep 0.2; done
  rm -f "$CL/pace"
) &
remember $!
follow_job
JOB_CODE=$?
wait "$DRILL"
PARTNERS_CODE=$?
mapfile -t DIGESTS < <(digests)
RUN_COMMITTED=$(job_field checkpoints_committed)
RUN_ABORTED=$(job_field checkpoints_aborted)
INTERVAL_JSON=$("$BIN/ckptctl" interval --job "$JOB" --coordinator "$ADDR" --json 2>/dev/null)
stop_cluster

# ------------------------------------------------------------ 3. verdict
say "[3/4] comparing"
matching=0
for ((r = 0; r < WORLD; r++)); do
  [ -n "${DIGESTS[$r]:-}" ] && [ "${DIGESTS[$r]}" = "${REFERENCE[$r]}" ] && matching=$((matching + 1))
done
python3 - "$DIR" "$INTERVAL_JSON" "${RUN_COMMITTED:-0}" "${RUN_ABORTED:-0}" "$matching" "$WORLD" <<'EOF'
import json, re, sys
d, interval_json, committed, aborted, matching, world = sys.argv[1:7]
def load(name):
    try:
        with open(f"{d}/{name}") as f:
            return json.load(f)
    except Exception:
        return None
trainer, corrupt = load("drill-kill-trainer.json"), load("drill-corrupt-shard.json")
node, partners = load("drill-kill-node.json"), load("drill-kill-partners.json")
# Where each rank read the restored step: its agent's memory (the nodes that
# kept running), its node's own disk, the shared root.
WORDS = {"memory": "their agent's memory", "peer": "a peer agent's memory", "node-local": "their node's disk",
         "storage-root": "the shared root"}
def sources(drill):
    src = drill.get("restore_sources") or {}
    parts = [f"{n} from {WORDS.get(k, k)}" for k, n in (src.get("sources") or {}).items()]
    return f"{', '.join(parts) if parts else 'not reported'} ({world} ranks)"
try:
    iv = json.loads(interval_json)
except Exception:
    iv = None
print()
print("summary")
print(f"  checkpoints      {committed} committed, {aborted} aborted in the drill run")
if iv and iv.get("interval_seconds") is not None:
    print(f"  interval         every {iv.get('every_steps')} steps ({iv['interval_seconds']:.1f} s): "
          f"{iv.get('reason', '?')} for a job MTBF of {iv['mtbf_seconds'] / 60:.0f} min and a checkpoint cost"
          f" of {iv['cost_seconds'] * 1000:.0f} ms (from {iv.get('checkpoints_measured', 0)} checkpoints),"
          f" expected waste {100 * iv['expected_waste']:.1f} %")
    two = iv.get("two_level") or {}
    if two.get("durable_every", 1) > 1 and two.get("memory_interval_steps"):
        print(f"  two cadences     memory checkpoints every {two['memory_interval_steps']} steps, 1 in"
              f" {two['durable_every']} durable (waste {100 * two['expected_waste']:.1f} % against"
              f" {100 * two['single_waste']:.1f} % with every checkpoint durable); in force: every"
              f" {iv.get('every_steps')} steps, 1 in {iv.get('durable_every', 1)} durable")
if trainer:
    if trainer.get("resumed"):
        print(f"  trainer crash    rank 1 killed at step {trainer['step_at_failure']}: every rank restored step"
              f" {trainer['restored_step']}, restart took {trainer['restart_seconds']:.1f} s")
        print(f"    read from      {sources(trainer)}")
    else:
        print("  trainer crash    the job did not resume")
if corrupt:
    bad = corrupt.get("verified_step")
    ok = [v for v in corrupt.get("verdict", []) if v["expectation"].startswith("the damaged step is quarantined")]
    print(f"  corrupted shard  step {bad}: found by verification, "
          + ("quarantined" if ok and ok[0]["held"] else "NOT quarantined"))
def crash(drill, title):
    det = drill.get("detection_seconds")
    kinds = sorted({f["kind"] for f in drill.get("failures", [])})
    print(f"  {title:<16} detected in {det:.3f} s ({', '.join(kinds)})" if det is not None
          else f"  {title:<16} not detected")
    if drill.get("resumed"):
        rv = drill.get("restored_verified") or {}
        print(f"  restored         step {drill['restored_step']} (the failure at step {drill['step_at_failure']}),"
              f" read back {'intact' if rv.get('ok') else 'NOT verified'}")
        print(f"  work lost        {drill['lost_steps']} steps ({drill['lost_seconds']:.1f} s);"
              f" restart took {drill['restart_seconds']:.1f} s")
        print(f"    read from      {sources(drill)}")
    failed = [v["expectation"] for v in drill.get("verdict", []) if not v["held"]]
    if failed:
        print(f"  drill verdict    FAIL: {'; '.join(failed)}")
if node:
    crash(node, "node crash")
if partners:
    crash(partners, "node + partner")
# Memory checkpoints that a failure had written to disk from the copies that
# survived it (as the coordinator logged them).
import glob
log = ""
for name in sorted(glob.glob(f"{d}/run/logs/coordinator*.log")):
    with open(name, errors="replace") as f:
        log += f.read()
for step in re.findall(r"memory checkpoint (\d+) is durable, written by the emergency persist", log):
    print(f"  emergency persist step {step}, a memory checkpoint: written to disk from the copies that survived"
          f" the failure")
kc = load("drill-kill-coordinator.json")
if kc:
    serve, commit = kc.get("failover_seconds"), kc.get("next_commit_seconds")
    print(f"  leader killed    {kc.get('node')}: " + (f"{kc.get('new_leader')} led after {serve:.2f} s"
          if serve is not None else "no standby took over") + "; " + (f"the job's next commit came {commit:.2f} s"
          " after the kill" if commit is not None else "the job committed nothing after it"))
    failed = [v["expectation"] for v in kc.get("verdict", []) if not v["held"]]
    if failed:
        print(f"  drill verdict    FAIL: {'; '.join(failed)}")
print(f"  digests          {matching} of {world} ranks equal to the reference run")
print(f"  reports          {d}/drill-kill-trainer.html, {d}/drill-corrupt-shard.html, {d}/drill-kill-node.html,"
      f" {d}/drill-kill-partners.html")
EOF
[ "$TRAINER_CODE" -eq 0 ] || fail "the kill-trainer drill did not pass (see $DIR/drill-kill-trainer.json and .err)"
[ "$CORRUPT_CODE" -eq 0 ] || fail "the corrupt-shard drill did not pass (see $DIR/drill-corrupt-shard.json and .err)"
[ "$JOB_CODE" -eq 0 ] || fail "the job did not finish (see $DIR/run/launcher/launch.log)"
[ "$NODE_CODE" -eq 0 ] || fail "the kill-node drill did not pass (see $DIR/drill-kill-node.json and .err)"
[ "$PARTNERS_CODE" -eq 0 ] ||
  fail "the kill-node --with-partners drill did not pass (see $DIR/drill-kill-partners.json and .err)"
[ "$matching" -eq "$WORLD" ] || fail "only $matching of $WORLD ranks ended with the reference digest"
[ "$COORD_CODE" -eq 0 ] ||
  fail "the kill-coordinator drill did not pass (see $DIR/drill-kill-coordinator.json and .err)"

# ------------------------------------------------- 4. a node lost for good
LEFT=$((WORLD - RANKS_PER_NODE))
say "[4/4] $LOST_NODE lost for good, no spare: the job finishes on $LEFT ranks (one model split over the ranks)"
start_cluster sharded-reference
start_job --sharded
follow_job || fail "the sharded reference run failed (see $CL/launcher/launch.log)"
SHARDED_REFERENCE=$(job_digest)
stop_cluster
say "  reference: $WORLD ranks, no failure: ${SHARDED_REFERENCE:-no digest}"
start_cluster lost-node
start_job --sharded
for _ in $(seq 600); do
  [ "$(job_field checkpoints_committed)" -ge 2 ] 2>/dev/null && break
  kill -0 "$LAUNCHER" 2>/dev/null || break
  sleep 0.1
done
[ "$(job_field checkpoints_committed)" -ge 2 ] 2>/dev/null || fail "no two checkpoints committed before the node loss"
LOST_AT=$(job_field fastest_step)
# The node goes, and nothing replaces it: its agent stays down, its ranks'
# trainers die with it, and the launcher starts the ranks that are left.
echo "$LEFT" >"$CL/ranks"
touch "$CL/down-$LOST_NODE"
kill -KILL "$(cat "$CL/agent-$LOST_NODE.pid")" 2>/dev/null
tail -n "$RANKS_PER_NODE" "$CL/launcher/pids" | while read -r pid; do kill -KILL "$pid" 2>/dev/null; done
say "  $LOST_NODE lost at step ${LOST_AT:-?} (its agent and its ranks' trainers SIGKILLed)"
follow_job
LOST_CODE=$?
LOST_DIGEST=$(job_digest)
LOST_RESTORED=$(grep -ho "step [0-9]* (saved by $WORLD ranks) read resharded" "$CL"/logs/agent-*.log | sort -u | head -1)
LOST_PLANNED=$(grep -h "(saved by $WORLD ranks) read resharded" "$CL"/logs/agent-*.log | grep -c "planned by the coordinator")
# What the coordinator heard: its record of the job's last restore.
LOST_SEEN=$("$BIN/ckptctl" status --coordinator "$ADDR" --job "$JOB" 2>/dev/null |
  grep -o "[0-9]* ranks\{0,1\} read resharded (saved by [0-9]* ranks\{0,1\})" | head -1)
stop_cluster
say "  after the loss: ${LOST_DIGEST:-no digest}; ${LOST_RESTORED:-no resharded restore logged}"
say "  ranks whose slices the coordinator planned: ${LOST_PLANNED:-0} of $LEFT (each opened only the saved shards it reads)"
say "  ckptctl status: last restore ${LOST_SEEN:-not reported as resharded}"
grep -q "attempt [0-9]*: $LEFT ranks instead of $WORLD" "$CL/launcher/launch.log" ||
  fail "the launcher did not restart the job on $LEFT ranks (see $CL/launcher/launch.log)"
[ "$LOST_CODE" -eq 0 ] || fail "the job did not finish on $LEFT ranks (see $CL/launcher/launch.log)"
[ -n "$LOST_RESTORED" ] || fail "no rank restored a step of $WORLD ranks resharded (see $CL/logs/agent-*.log)"
[ "$LOST_SEEN" = "$LEFT ranks read resharded (saved by $WORLD ranks)" ] ||
  fail "the coordinator's last restore of the job is not $LEFT ranks read resharded from $WORLD (${LOST_SEEN:-none})"
[ "${LOST_PLANNED:-0}" -ge "$LEFT" ] ||
  fail "only ${LOST_PLANNED:-0} of $LEFT ranks read with the coordinator's reshard plan (see $CL/logs/agent-*.log)"
[ "${LOST_DIGEST#* ranks, }" = "${SHARDED_REFERENCE#* ranks, }" ] && [ "${LOST_DIGEST%% ranks,*}" = "$LEFT" ] ||
  fail "the job on $LEFT ranks did not end where the run of $WORLD ranks ends ($LOST_DIGEST against $SHARDED_REFERENCE)"
say "  lost node: the job finished on $LEFT ranks with the digest of the run of $WORLD"
echo "demo: PASS"
