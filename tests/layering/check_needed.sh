#!/usr/bin/env bash
# Checks that a binary or shared library does not need the given libraries at
# run time (its NEEDED entries, which the loader must find):
#   check_needed.sh FILE LIBRARY...    e.g. libckptd.so liburing libzstd libxxhash
# Prints each entry that is one of them (LIBRARY.so*); exits 1 when one is.
set -euo pipefail
file="$1"
shift
needed=$(readelf -d --wide "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p')
if [ -z "$needed" ]; then
  echo "$(basename "$file"): no NEEDED entries (not a dynamically linked ELF file?)"
  exit 1
fi
bad=0
for lib in "$@"; do
  while read -r entry; do
    if [[ "$entry" == "$lib".so* ]]; then
      echo "$(basename "$file") needs $entry"
      bad=1
    fi
  done <<<"$needed"
done
[ "$bad" -eq 0 ] && echo "$(basename "$file") needs none of $* (it needs ${needed//$'\n'/ })"
exit "$bad"
