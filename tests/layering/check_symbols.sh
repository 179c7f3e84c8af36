#!/usr/bin/env bash
# Checks that a binary holds no code of the components it must not link:
#   check_symbols.sh BINARY NAMESPACE...    e.g. ckptd-agent ckptd::cli:: ckptd::coordinator::
# Prints each namespace found with a few of its symbols; exits 1 when one is.
set -euo pipefail
binary="$1"
shift
symbols=$(nm -C "$binary")
bad=0
for ns in "$@"; do
  found=$(grep -F -- "$ns" <<<"$symbols" | head -n 3 || true)
  if [ -n "$found" ]; then
    echo "$(basename "$binary") holds code of $ns, e.g.:"
    echo "$found"
    bad=1
  fi
done
[ "$bad" -eq 0 ] && echo "$(basename "$binary"): none of $* linked in"
exit "$bad"
