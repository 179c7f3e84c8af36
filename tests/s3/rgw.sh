#!/usr/bin/env bash
# tests/s3/rgw.sh - a throw-away single-node Ceph cluster with a RADOS Gateway
# (S3 API) on 127.0.0.1, for ckptd's S3 tests and benchmarks.
#
#   tests/s3/rgw.sh start DIR        build and start mon + OSD + radosgw, create
#                                    an S3 user, write DIR/env
#   tests/s3/rgw.sh stop DIR         kill the cluster's daemons, delete DIR's data
#   tests/s3/rgw.sh status DIR       say which daemons are alive
#   tests/s3/rgw.sh restart-rgw DIR  SIGKILL radosgw and start it again on the
#                                    same port (fault tests)
#
# After `start`, `. DIR/env` gives AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
# AWS_REGION (us-east-1), AWS_ENDPOINT_URL (http://127.0.0.1:PORT, path-style
# addressing), CKPTD_RGW_DIR, and two AWS_*_CHECKSUM_* settings that keep
# recent AWS SDKs/CLIs to requests this (Ceph 16) RGW really supports.
# Clients signing with curl's --aws-sigv4 (curl 7.88) must send an
# x-amz-content-sha256 header themselves, or RGW answers 403.
#
# Everything (config, mon store, OSD data, logs, admin sockets, pid files)
# lives under DIR; /etc/ceph and /var/lib/ceph are never read or written
# (every command gets -c DIR/ceph.conf). Each cluster gets its own fsid and
# free ports, so several can run at once in different DIRs. The cluster has
# one monitor, no mgr, one BlueStore OSD on a sparse file and size-1 pools;
# auth is "none" between the daemons (S3 requests are still signed and checked
# against a radosgw-admin user). Works as root and as an unprivileged user.
#
# Environment knobs: CKPTD_RGW_TIMEOUT (seconds per wait, default 90),
# CKPTD_RGW_BLOCK_GB (sparse OSD file size, default 8),
# CKPTD_RGW_KEEP_LOGS=1 (stop keeps DIR/log).
set -euo pipefail

readonly PROG=${0##*/}
readonly TIMEOUT=${CKPTD_RGW_TIMEOUT:-90}
readonly BLOCK_GB=${CKPTD_RGW_BLOCK_GB:-8}
readonly S3_UID=ckptd-test
readonly EMPTY_SHA256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
readonly REGION=us-east-1  # the default zonegroup accepts SigV4 with any region;
                           # us-east-1 makes SDKs send no LocationConstraint

usage() {
  echo "usage: $PROG {start|stop|status|restart-rgw} DIR" >&2
  exit 2
}

say() { echo "$PROG: $*" >&2; }

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ceph CLI against this cluster only.
cephc() { ceph -c "$CONF" --connect-timeout 20 "$@"; }

# Pick N distinct free TCP ports on 127.0.0.1 by bind-testing random ports in
# 20000-29999: below Linux's ephemeral range (32768+) and away from the
# 6800-7300 range that OSDs bind, so other clusters' daemons don't take them.
free_ports() {
  python3 - "$1" <<'EOF'
import random, socket, sys
n, ports = int(sys.argv[1]), []
while len(ports) < n:
    p = random.randint(20000, 29999)
    if p in ports:
        continue
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", p))
        ports.append(p)
    except OSError:
        pass
    finally:
        s.close()
print(*ports)
EOF
}

# Random alphanumeric string of length $1 (S3 access key: 20, secret: 40).
rand_str() {
  local s
  s=$(head -c 256 /dev/urandom | LC_ALL=C tr -dc 'A-Z0-9' | head -c "$1")
  [[ ${#s} -eq $1 ]] || s=$(rand_str "$1")
  echo "$s"
}

# Is PID alive and one of this cluster's processes (its argv has DIR/ceph.conf)?
# Guards against pid reuse and against touching other clusters.
ours() {
  local pid=$1 arg
  [[ -r /proc/$pid/cmdline ]] || return 1
  while IFS= read -r -d '' arg; do
    [[ $arg == "$CONF" ]] && return 0
  done <"/proc/$pid/cmdline"
  return 1
}

# Pid from a pid file, if it names a live process of this cluster.
daemon_pid() {
  local f=$RUN/$1.pid pid
  [[ -s $f ]] || return 1
  pid=$(<"$f")
  ours "$pid" && echo "$pid"
}

# All live processes of this cluster (pid files may be missing, e.g. after a
# crash, and radosgw-admin/ceph CLIs write none).
all_pids() {
  local p
  for p in /proc/[0-9]*; do
    ours "${p#/proc/}" && echo "${p#/proc/}"
  done
  return 0
}

# SIGTERM the given pids, SIGKILL whatever is left after ~5 s.
terminate() {
  local pids=("$@") i p alive
  [[ ${#pids[@]} -gt 0 ]] || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    alive=0
    for p in "${pids[@]}"; do
      if ours "$p"; then alive=1; fi  # (a zombie has no argv: gone)
    done
    [[ $alive -eq 1 ]] || return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
  sleep 0.2
}

# Kill radosgw, then the OSD, then the mon (so nothing hangs on a dead peer),
# then any straggler of this cluster.
kill_all() {
  local name pid rest
  for name in client.rgw osd.0 mon.a; do
    if pid=$(daemon_pid "$name"); then terminate "$pid"; fi
  done
  mapfile -t rest < <(all_pids)
  terminate "${rest[@]}"
}

# HTTP status of an anonymous GET / (000 when nothing answers).
anon_code() {
  curl -s -o /dev/null -m 5 -w '%{http_code}' "http://127.0.0.1:$RGW_PORT/" || true
}

# HTTP status of a SigV4-signed ListBuckets with the test user's keys. RGW
# wants x-amz-content-sha256 (here: SHA-256 of the empty body) in the signed
# headers; curl 7.88 does not add it by itself.
signed_code() {
  curl -s -o /dev/null -m 5 -w '%{http_code}' \
    --aws-sigv4 "aws:amz:$REGION:s3" --user "$ACCESS_KEY:$SECRET_KEY" \
    -H "x-amz-content-sha256: $EMPTY_SHA256" \
    "http://127.0.0.1:$RGW_PORT/" || true
}

# Start radosgw in the background (in the foreground mode, so that we poll it
# instead of blocking until its init succeeds or times out) in its own session
# (no signals from the caller's terminal), and wait until the anonymous GET
# answers 200, i.e. the beast frontend is serving.
start_rgw() {
  setsid radosgw -c "$CONF" -n client.rgw -f </dev/null >>"$LOG/client.rgw.out" 2>&1 &
  echo $! >"$RUN/client.rgw.pid"  # -f writes no pid file
  disown
  sleep 0.2
  local deadline=$((SECONDS + TIMEOUT))
  until [[ $(anon_code) == 200 ]]; do
    daemon_pid client.rgw >/dev/null || fail "radosgw exited"
    ((SECONDS < deadline)) || fail "radosgw did not answer on port $RGW_PORT within ${TIMEOUT}s"
    sleep 0.2
  done
}

# Wait until a signed request with the test user's keys is accepted.
wait_signed() {
  local deadline=$((SECONDS + TIMEOUT)) code
  while :; do
    code=$(signed_code)
    [[ $code == 200 ]] && return 0
    ((SECONDS < deadline)) || fail "signed ListBuckets as $S3_UID still answers HTTP $code after ${TIMEOUT}s"
    sleep 0.2
  done
}

# Logs to show when PHASE failed.
logs_for() {
  case $1 in
    mon) echo "$LOG/mon.a.out $LOG/mon.a.log" ;;
    osd) echo "$LOG/osd.0.out $LOG/osd.0.log $LOG/mon.a.log" ;;
    rgw) echo "$LOG/client.rgw.out $LOG/client.rgw.log $LOG/osd.0.log" ;;
    user) echo "$LOG/client.admin.log $LOG/client.rgw.log" ;;
    *) echo "$LOG/client.admin.log" ;;
  esac
}

# Error exit during start/restart-rgw: name the phase, show the log tails,
# leave no process behind and drop the big data (logs and config stay).
fail() {
  trap - EXIT INT TERM
  say "FAILED ($PHASE): $*"
  local f
  for f in $(logs_for "$PHASE"); do
    [[ -s $f ]] || continue
    echo "----- tail of $f -----" >&2
    tail -n 30 "$f" >&2
  done
  kill_all
  rm -rf "$DIR/osd" "$DIR/osd-block.img" "$DIR/mon"
  say "processes killed, data removed; logs kept in $LOG (run '$PROG stop $DIR' to remove)"
  exit 1
}

on_exit() {
  local rc=$?
  [[ $rc -eq 130 ]] && fail "interrupted"
  [[ $rc -ne 0 ]] && fail "command failed (exit $rc), see above"
}

cmd_start() {
  local t0 fsid osd_uuid osd_id
  t0=$(now)
  local bin missing=()
  for bin in ceph ceph-mon ceph-osd monmaptool radosgw radosgw-admin uuidgen python3; do
    command -v "$bin" >/dev/null || missing+=("$bin")
  done
  if ((${#missing[@]})); then
    say "missing ${missing[*]} (scripts/install-deps.sh installs Ceph's packages)"
    # A developer without Ceph skips the S3 tests; CI must run them.
    [[ -n ${CI:-} ]] && exit 1
    exit 77
  fi
  if [[ -e $CONF ]]; then
    say "$DIR already holds a cluster (run '$PROG stop $DIR' first)"
    exit 1
  fi
  mkdir -p "$DIR" "$RUN" "$LOG" "$DIR/mon" "$DIR/osd" "$DIR/rgw" "$DIR/crash"
  : >"$DIR/.ckptd-rgw"  # marks DIR as ours for stop
  trap on_exit EXIT
  trap 'exit 130' INT TERM  # so that an interrupted start cleans up too
  PHASE=config
  read -r MON_PORT RGW_PORT < <(free_ports 2)
  fsid=$(uuidgen)

  # Config. Notes:
  # - msgr v2 only, bound to 127.0.0.1; auth none (S3 auth is RGW's own).
  #   radosgw defaults ms_mon_client_mode to "secure", which auth none cannot
  #   give: it would retry its mon connection forever, so allow crc.
  # - The mon commits map changes every 1 s by default, and RGW's first start
  #   makes ~10 of them (pools): propose after 50 ms instead.
  # - size-1 pools with 8 PGs, no autoscaler (no mgr), CRUSH picks OSDs, not
  #   hosts.
  # - BlueStore on a sparse file created by mkfs; small caches and RocksDB
  #   memtables/WAL keep memory and disk small; no fsck at mkfs/mount.
  # - RGW: beast on 127.0.0.1:PORT with TCP_NODELAY (without it each small
  #   response waits ~40 ms for a delayed ACK), no usage/ops logs, no sync/quota/reshard
  #   threads, short GC delay so deleted data is freed during test runs (in
  #   BlueStore: the sparse file keeps its high-water mark, it never shrinks).
  cat >"$CONF" <<EOF
[global]
fsid = $fsid
mon_host = [v2:127.0.0.1:$MON_PORT]
mon_initial_members = a
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_msgr1 = false
ms_bind_ipv6 = false
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
ms_mon_client_mode = crc
keyring = $DIR/keyring
run_dir = $RUN
admin_socket =
log_file = $LOG/\$name.log
mon_cluster_log_file = $LOG/cluster.log
crash_dir = $DIR/crash
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
mon_allow_pool_size_one = true

[mon]
mon_data = $DIR/mon
admin_socket = $RUN/\$name.asok
pid_file = $RUN/\$name.pid
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
mon_max_pg_per_osd = 1000
mon_data_avail_warn = 2
mon_data_avail_crit = 1
paxos_propose_interval = 0.05
paxos_min_wait = 0.01

[osd]
osd_data = $DIR/osd
admin_socket = $RUN/\$name.asok
pid_file = $RUN/\$name.pid
osd_objectstore = bluestore
bluestore_block_path = $DIR/osd-block.img
bluestore_block_create = true
bluestore_block_size = $((BLOCK_GB << 30))
bluestore_block_db_create = false
bluestore_block_wal_create = false
bluestore_fsck_on_mkfs = false
bluestore_fsck_on_mount = false
bluestore_cache_autotune = false
bluestore_cache_size = $((64 << 20))
osd_memory_target = $((512 << 20))
bluestore_rocksdb_options = compression=kNoCompression,max_write_buffer_number=2,min_write_buffer_number_to_merge=1,recycle_log_file_num=2,write_buffer_size=33554432,writable_file_max_buffer_size=0,compaction_readahead_size=2097152,max_background_compactions=1,max_total_wal_size=134217728
osd_op_num_shards = 2
debug_osd = 0/5
osd_op_num_threads_per_shard = 2

[client.rgw]
admin_socket = $RUN/\$name.asok
pid_file = $RUN/\$name.pid
rgw_frontends = beast tcp_nodelay=1 endpoint=127.0.0.1:$RGW_PORT
rgw_data = $DIR/rgw
rgw_thread_pool_size = 64
rgw_enable_usage_log = false
rgw_enable_ops_log = false
rgw_run_sync_thread = false
rgw_enable_quota_threads = false
rgw_dynamic_resharding = false
rgw_gc_obj_min_wait = 60
rgw_gc_processor_period = 60
rgw_init_timeout = $TIMEOUT
EOF
  : >"$DIR/keyring"

  # Monitor: a one-mon monmap, mkfs, start (ceph-mon daemonizes once up).
  PHASE=mon
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$MON_PORT]" \
    "$DIR/monmap" >>"$LOG/mon.a.out" 2>&1 || fail "monmaptool failed"
  ceph-mon -c "$CONF" -i a --mkfs --monmap "$DIR/monmap" >>"$LOG/mon.a.out" 2>&1 ||
    fail "ceph-mon --mkfs failed"
  ceph-mon -c "$CONF" -i a 2>>"$LOG/mon.a.out" ||
    fail "ceph-mon did not start (port $MON_PORT taken?)"
  cephc mon stat >/dev/null || fail "monitor does not answer on port $MON_PORT"

  # OSD: register it, mkfs BlueStore on the sparse file, start it, wait for
  # "up", then switch off scrubbing (pointless load in tests and benchmarks).
  PHASE=osd
  osd_uuid=$(uuidgen)
  osd_id=$(cephc osd new "$osd_uuid") || fail "ceph osd new failed"
  [[ $osd_id == 0 ]] || fail "osd new gave id '$osd_id', expected 0"
  ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$osd_uuid" >>"$LOG/osd.0.out" 2>&1 ||
    fail "ceph-osd --mkfs (BlueStore on $DIR/osd-block.img) failed"
  # (2>>: its chatter before it daemonizes)
  ceph-osd -c "$CONF" -i 0 2>>"$LOG/osd.0.out" || fail "ceph-osd did not start"
  local deadline=$((SECONDS + TIMEOUT))
  until cephc osd dump 2>/dev/null | grep -q '^osd\.0 up '; do
    daemon_pid osd.0 >/dev/null || fail "ceph-osd exited"
    ((SECONDS < deadline)) || fail "osd.0 not up after ${TIMEOUT}s"
    sleep 0.3
  done
  cephc osd set noscrub >/dev/null 2>&1
  cephc osd set nodeep-scrub >/dev/null 2>&1

  # RADOS Gateway. Its pools are created here in one ceph call: radosgw
  # would create them one by one, the bucket ones only at the first
  # CreateBucket (seconds of delay in the first test). On its first start it
  # creates the default realm/zonegroup/zone; it answers anonymous requests
  # once that is done.
  PHASE=rgw
  local pool
  for pool in .rgw.root default.rgw.{log,control,meta,buckets.index,buckets.data,buckets.non-ec}; do
    echo "osd pool create $pool 8"
    echo "osd pool application enable $pool rgw"
  done | cephc >/dev/null 2>&1
  start_rgw

  # S3 user with generated keys, then wait for signed requests to pass.
  PHASE=user
  ACCESS_KEY=$(rand_str 20)
  SECRET_KEY=$(rand_str 40)
  radosgw-admin -c "$CONF" user create --uid "$S3_UID" \
    --display-name "ckptd test user" \
    --access-key "$ACCESS_KEY" --secret-key "$SECRET_KEY" >/dev/null ||
    fail "radosgw-admin user create failed"
  wait_signed

  # AWS_REQUEST/RESPONSE_CHECKSUM_*=when_required: botocore >= 1.36 (boto3,
  # aws-cli) otherwise adds CRC32 checksums to every upload, which RGW 16
  # neither checks nor, once sent as aws-chunked trailers (SDKs do that over
  # https), understands. Over http it works either way; this keeps the tools
  # on the plain requests this RGW really supports.
  umask 077
  cat >"$DIR/env" <<EOF
export AWS_ACCESS_KEY_ID=$ACCESS_KEY
export AWS_SECRET_ACCESS_KEY=$SECRET_KEY
export AWS_REGION=$REGION
export AWS_DEFAULT_REGION=$REGION
export AWS_ENDPOINT_URL=http://127.0.0.1:$RGW_PORT
export AWS_REQUEST_CHECKSUM_CALCULATION=when_required
export AWS_RESPONSE_CHECKSUM_VALIDATION=when_required
export CKPTD_RGW_DIR=$DIR
EOF
  trap - EXIT INT TERM
  say "ready in $(elapsed "$t0") s: S3 at http://127.0.0.1:$RGW_PORT (mon port $MON_PORT); '. $DIR/env' for credentials"
}

cmd_stop() {
  if [[ ! -e $DIR/.ckptd-rgw && ! -e $CONF ]]; then
    say "$DIR holds no cluster started by $PROG; nothing to do"
    return 0
  fi
  kill_all
  # Remove only what start created; then DIR itself if that left it empty.
  rm -rf "$DIR/mon" "$DIR/osd" "$DIR/osd-block.img" "$DIR/rgw" "$DIR/crash" "$RUN" \
    "$DIR/monmap" "$DIR/keyring" "$DIR/env"
  if [[ ${CKPTD_RGW_KEEP_LOGS:-0} != 1 ]]; then
    rm -rf "$LOG" "$CONF" "$DIR/.ckptd-rgw"
    rmdir "$DIR" 2>/dev/null || true
  fi
  say "stopped"
}

cmd_status() {
  local name pid rc=0
  [[ -e $CONF ]] || { say "no cluster in $DIR"; return 1; }
  for name in mon.a osd.0 client.rgw; do
    if pid=$(daemon_pid "$name"); then
      echo "$name: running (pid $pid)"
    else
      echo "$name: not running"
      rc=1
    fi
  done
  RGW_PORT=$(sed -n 's/^rgw_frontends = .*:\([0-9]*\)$/\1/p' "$CONF")
  echo "s3 endpoint http://127.0.0.1:$RGW_PORT: anonymous GET / -> HTTP $(anon_code)"
  return $rc
}

cmd_restart_rgw() {
  local t0 pid i
  t0=$(now)
  [[ -s $DIR/env ]] || { say "no started cluster in $DIR"; exit 1; }
  RGW_PORT=$(sed -n 's/^rgw_frontends = .*:\([0-9]*\)$/\1/p' "$CONF")
  ACCESS_KEY=$(sed -n 's/^export AWS_ACCESS_KEY_ID=//p' "$DIR/env")
  SECRET_KEY=$(sed -n 's/^export AWS_SECRET_ACCESS_KEY=//p' "$DIR/env")
  PHASE=rgw
  # SIGKILL: no clean shutdown, like a crash mid-request.
  if pid=$(daemon_pid client.rgw); then
    kill -KILL "$pid"
    for ((i = 0; i < 100; i++)); do
      ours "$pid" || break
      sleep 0.05
    done
  fi
  rm -f "$RUN/client.rgw.pid" "$RUN/client.rgw.asok"
  # On failure keep the mon and OSD (they are fine), kill the new radosgw
  # and report.
  fail() {
    say "FAILED (rgw restart): $*"
    tail -n 30 "$LOG/client.rgw.out" "$LOG/client.rgw.log" >&2 || true
    if pid=$(daemon_pid client.rgw); then terminate "$pid"; fi
    exit 1
  }
  start_rgw
  wait_signed
  say "radosgw restarted in $(elapsed "$t0") s on port $RGW_PORT"
}

[[ $# -eq 2 ]] || usage
DIR=$(realpath -m "$2")  # absolute: the daemons chdir to /
CONF=$DIR/ceph.conf
RUN=$DIR/run
LOG=$DIR/log
PHASE=
MON_PORT='' RGW_PORT='' ACCESS_KEY='' SECRET_KEY=''
case $1 in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  restart-rgw) cmd_restart_rgw ;;
  *) usage ;;
esac
