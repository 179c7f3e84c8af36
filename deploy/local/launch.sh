#!/usr/bin/env bash
# A small elastic launcher, the part torchrun, Slurm or Kubernetes plays on a
# real cluster: starts N ranks of a command, and when one of them exits
# non-zero (a crash, or 75: ckptd asked for a restart) gives the others a
# grace period to exit by themselves, stops those still running, and starts
# all N again; they restore the newest committed checkpoint. Done when every
# rank of one attempt exits 0.
#
#   launch.sh --ranks N [--ranks-file F] [--max-restarts 5] [--grace 10] [--log-dir DIR] -- CMD [ARGS...]
#
# --ranks-file F: before each attempt, when F holds a whole number from 1 up,
# that many ranks start instead of N (the job goes on with fewer ranks after
# a node is lost for good, or with more; they restore the newest checkpoint
# resharded, docs/elastic.md).
#
# Each rank runs CMD with RANK and WORLD_SIZE set (and ATTEMPT, from 0); a
# command that needs them in its arguments can be `sh -c '... $RANK ...'`.
# Its stdout and stderr go to DIR/attempt-A.rank-R.{out,err}. The pid of every
# rank started is written to DIR/pids (one per line) so that a caller can
# clean up after a launcher that was itself killed. Exit status: 0 when an
# attempt succeeded, 1 when the restarts ran out, 2 usage error.
set -uo pipefail

usage() {
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

RANKS=""
RANKS_FILE=""
MAX_RESTARTS=5
GRACE=10
LOG_DIR="."
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) RANKS="${2:-}"; shift 2 ;;
    --ranks-file) RANKS_FILE="${2:-}"; shift 2 ;;
    --max-restarts) MAX_RESTARTS="${2:-}"; shift 2 ;;
    --grace) GRACE="${2:-}"; shift 2 ;;
    --log-dir) LOG_DIR="${2:-}"; shift 2 ;;
    --help|-h) usage ;;
    --) shift; break ;;
    *) echo "launch: unknown argument $1" >&2; usage ;;
  esac
done
for v in "$RANKS" "$MAX_RESTARTS" "$GRACE"; do
  case "$v" in ''|*[!0-9]*) echo "launch: --ranks, --max-restarts and --grace take whole numbers" >&2; exit 2 ;; esac
done
if [ "$RANKS" -lt 1 ] || [ $# -eq 0 ]; then
  echo "launch: --ranks N (at least 1) and a command after -- are required" >&2
  exit 2
fi
mkdir -p "$LOG_DIR" || exit 2

declare -a PIDS=()
STOPPING=0
stop_all() {
  local sig="$1"
  for pid in "${PIDS[@]}"; do
    [ -n "$pid" ] && kill "-$sig" "$pid" 2>/dev/null
  done
}
on_signal() {
  STOPPING=1
  stop_all TERM
  sleep 1
  stop_all KILL
  wait 2>/dev/null
  echo "launch: stopped" >&2
  exit 1
}
trap on_signal INT TERM

describe() {  # an exit status in words
  local code="$1"
  if [ "$code" -eq 75 ]; then echo "75 (restart requested)";
  elif [ "$code" -gt 128 ]; then echo "$code (signal $((code - 128)))";
  else echo "$code"; fi
}

for ((attempt = 0; attempt <= MAX_RESTARTS; attempt++)); do
  if [ -n "$RANKS_FILE" ] && [ -f "$RANKS_FILE" ]; then
    wanted=$(tr -d '[:space:]' <"$RANKS_FILE")
    case "$wanted" in
      '' | *[!0-9]* | 0) echo "launch: $RANKS_FILE holds no whole number from 1 up; $RANKS ranks" >&2 ;;
      *)
        if [ "$wanted" -ne "$RANKS" ]; then
          echo "launch: attempt $attempt: $wanted ranks instead of $RANKS (from $RANKS_FILE)" >&2
          RANKS=$wanted
        fi
        ;;
    esac
  fi
  PIDS=()
  for ((r = 0; r < RANKS; r++)); do
    RANK=$r WORLD_SIZE=$RANKS ATTEMPT=$attempt "$@" \
      >"$LOG_DIR/attempt-$attempt.rank-$r.out" 2>"$LOG_DIR/attempt-$attempt.rank-$r.err" &
    PIDS[$r]=$!
    echo "$!" >>"$LOG_DIR/pids"
  done
  echo "launch: attempt $attempt: started $RANKS ranks" >&2
  declare -a CODES=()
  left=$RANKS
  first_failure=""
  killed_after_grace=0
  while [ "$left" -gt 0 ]; do
    for ((r = 0; r < RANKS; r++)); do
      [ -n "${CODES[$r]:-}" ] && continue
      if ! kill -0 "${PIDS[$r]}" 2>/dev/null; then
        wait "${PIDS[$r]}"
        CODES[$r]=$?
        left=$((left - 1))
        if [ "${CODES[$r]}" -ne 0 ] && [ -z "$first_failure" ]; then
          first_failure=$SECONDS
          echo "launch: attempt $attempt: rank $r exited $(describe "${CODES[$r]}"); the others get ${GRACE}s to stop" >&2
        fi
      fi
    done
    if [ -n "$first_failure" ] && [ "$left" -gt 0 ] && [ $((SECONDS - first_failure)) -ge "$GRACE" ] &&
       [ "$killed_after_grace" -eq 0 ]; then
      echo "launch: attempt $attempt: $left rank(s) still running after ${GRACE}s: killing them" >&2
      stop_all KILL
      killed_after_grace=1
    fi
    [ "$left" -gt 0 ] && sleep 0.1
  done
  summary=""
  ok=1
  for ((r = 0; r < RANKS; r++)); do
    summary="$summary $(describe "${CODES[$r]}" | cut -d' ' -f1)"
    [ "${CODES[$r]}" -ne 0 ] && ok=0
  done
  echo "launch: attempt $attempt: exit statuses:$summary" >&2
  if [ "$ok" -eq 1 ]; then
    echo "launch: done after $((attempt + 1)) attempt(s)" >&2
    exit 0
  fi
  [ "$STOPPING" -eq 1 ] && exit 1
done
echo "launch: giving up after $((MAX_RESTARTS + 1)) attempts" >&2
exit 1
