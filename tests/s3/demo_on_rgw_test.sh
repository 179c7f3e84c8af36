#!/usr/bin/env bash
# The whole job with its shared storage root in an object store: the local
# demo (deploy/local/demo.sh: a coordinator, three agents, six ranks, the
# failure drills and the elastic restart on fewer ranks) with
# CKPTD_DEMO_ROOT=s3://<bucket>/demo on the tests' Ceph RGW, which is also
# killed and restarted while the drill run trains. Then ckptctl's offline
# commands read that bucket: verify, inspect, export and start-fresh.
#   demo_on_rgw_test.sh BIN_DIR WORK_DIR
# Needs $CKPTD_TEST_RGW_ENV (the ctest fixture `rgw` writes it); exits 77
# (skipped) without it.
set -uo pipefail
BIN="$1"
WORK="$2"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
if [ -z "${CKPTD_TEST_RGW_ENV:-}" ] || [ ! -s "$CKPTD_TEST_RGW_ENV" ]; then
  echo "skipped: no test RGW (\$CKPTD_TEST_RGW_ENV names none; tests/s3/rgw.sh starts one)"
  exit 77
fi
# shellcheck disable=SC1090
. "$CKPTD_TEST_RGW_ENV"
rm -rf "$WORK" && mkdir -p "$WORK"
failures=0
check() {  # check WHAT CONDITION...
  local what="$1"
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}

BUCKET="ckptd-demo-$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')"
python3 - "$BUCKET" <<'EOF' || { echo "could not create bucket $BUCKET"; exit 1; }
import sys, boto3
boto3.client("s3").create_bucket(Bucket=sys.argv[1])
EOF
ROOT="s3://$BUCKET/demo"

# Object keys under a prefix of the bucket, one per line.
keys() {
  python3 - "$BUCKET" "$1" <<'EOF'
import sys, boto3
s3 = boto3.client("s3")
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=sys.argv[1], Prefix=sys.argv[2]):
    for o in page.get("Contents", []):
        print(o["Key"])
EOF
}

# 1. The demo, with the object store gone for a few seconds midway: radosgw
# is SIGKILLed and started again once the drill run has begun.
export CKPTD_DEMO_NO_BUILD=1 CKPTD_BIN="$BIN" CKPTD_DEMO_STEPS=300 CKPTD_DEMO_STEP_MS=20 CKPTD_DEMO_STATE_MB=4
CKPTD_DEMO_ROOT="$ROOT" CKPTD_DEMO_DIR="$WORK/demo" "$REPO/deploy/local/demo.sh" >"$WORK/demo.log" 2>&1 &
demo=$!
restarted=0
for _ in $(seq 1200); do
  if grep -q "drill 1:" "$WORK/demo.log" 2>/dev/null; then
    sleep 1
    "$REPO/tests/s3/rgw.sh" restart-rgw "$CKPTD_RGW_DIR" >"$WORK/restart.log" 2>&1 && restarted=1
    break
  fi
  kill -0 "$demo" 2>/dev/null || break
  sleep 0.1
done
wait "$demo"
code=$?
cat "$WORK/demo.log"
cat "$WORK/restart.log"
check "radosgw was killed and restarted during the drill run" [ "$restarted" -eq 1 ]
check "the demo on an s3:// root exits 0" [ "$code" -eq 0 ]
check "its last line is demo: PASS" [ "$(tail -n 1 "$WORK/demo.log")" = "demo: PASS" ]
check "it names the object-store root" grep -q "the shared storage root in an object store: $ROOT/<run>" "$WORK/demo.log"
check "every digest matches" grep -q "digests          6 of 6 ranks equal" "$WORK/demo.log"
check "the corrupted step was quarantined in the bucket" grep -q "found by verification, quarantined" "$WORK/demo.log"
check "the elastic restart read the bucket resharded" grep -q "lost node: the job finished on 4 ranks" "$WORK/demo.log"
check "the agents wrote to the object store" grep -q "storage root s3://$BUCKET/demo/run (endpoint" "$WORK"/demo/run/logs/agent-node-a.1.log
check "no log or report holds the secret key" bash -c "! grep -rqF -- \"\$AWS_SECRET_ACCESS_KEY\" '$WORK/demo'"

# 2. What the bucket holds: committed steps with their MANIFEST objects and
# shards, and no temp object (a temp file is a multipart upload, never an
# object).
mapfile -t all < <(keys demo/)
check "the bucket holds the runs' steps" [ "$(printf '%s\n' "${all[@]}" | grep -c '/MANIFEST$')" -ge 3 ]
check "no temp object in the bucket" [ -z "$(printf '%s\n' "${all[@]}" | grep '\.tmp$')" ]

# 3. ckptctl's offline commands on the bucket.
"$BIN/ckptctl" verify --root "$ROOT/reference" >"$WORK/verify-reference.out" 2>&1
check "verify: every committed step of the reference run is intact" [ $? -eq 0 ]
cat "$WORK/verify-reference.out"
"$BIN/ckptctl" verify --root "$ROOT/run" >"$WORK/verify-run.out" 2>&1
vcode=$?
cat "$WORK/verify-run.out"
check "verify: the drill run's corrupted shard fails verification (exit 1)" [ "$vcode" -eq 1 ]
check "verify: it names the shard's object and the chunk" grep -q "s3://$BUCKET/demo/run/demo-job/step-[0-9]*/rank-0.shard: tensor .* checksum mismatch" "$WORK/verify-run.out"
check "verify: exactly one step failed, the quarantined one" grep -q "1 failed: FAILED" "$WORK/verify-run.out"
shard=$(printf '%s\n' "${all[@]}" | grep '^demo/reference/demo-job/step-[0-9]*/rank-2.shard$' | tail -n 1)
"$BIN/ckptctl" inspect "s3://$BUCKET/$shard" >"$WORK/inspect.out" 2>&1
check "inspect: a shard object's tensors" grep -q "^model.params  *PARAMS" "$WORK/inspect.out"
"$BIN/ckptctl" export --root "$ROOT/lost-node" --job demo-job --out "$WORK/export" >"$WORK/export.out" 2>&1
check "export: the sharded run's newest step as safetensors" test -s "$WORK/export/model.safetensors"
"$BIN/ckptctl" start-fresh --root "$ROOT/reference" --job demo-job >"$WORK/start-fresh.out" 2>&1
check "start-fresh: refused while the job has intact steps" [ $? -ne 0 ]
check "start-fresh: says why" grep -qi "intact\|not quarantined\|not all" "$WORK/start-fresh.out"
cat "$WORK/start-fresh.out"
"$BIN/ckptctl" verify --root "s3://$BUCKET-missing/demo" >"$WORK/verify-missing.out" 2>&1
check "verify: a bucket that does not exist is an error naming it" grep -q "$BUCKET-missing" "$WORK/verify-missing.out"
AWS_SECRET_ACCESS_KEY=wrong-secret-1234 "$BIN/ckptctl" verify --root "$ROOT/reference" >"$WORK/verify-creds.out" 2>&1
check "verify: wrong credentials are an error" [ $? -ne 0 ]
check "verify: which does not quote the secret" bash -c "! grep -q wrong-secret-1234 '$WORK/verify-creds.out'"
cat "$WORK/verify-creds.out"

if [ "$failures" -eq 0 ]; then
  rm -rf "$WORK"
  echo "demo_on_rgw_test: PASS"
else
  echo "demo_on_rgw_test: $failures check(s) failed; kept $WORK"
  exit 1
fi
