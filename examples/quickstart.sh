#!/usr/bin/env bash
# Quick start with the sbx CLI: creates a sandbox, keeps Python state across execs, forks two
# children, merges one back, deletes everything. Reads SERVICE_HOSTD_URL and SERVICE_API_KEY;
# exits non-zero on failure. Uses `sbx` from PATH, else the built CLI of this checkout
# (`npm run build` in sdk/typescript).
#
#   bash examples/quickstart.sh
set -euo pipefail

if command -v sbx >/dev/null 2>&1; then
  sbx() { command sbx "$@"; }
else
  cli="$(cd "$(dirname "$0")/.." && pwd)/sdk/typescript/dist/src/cli.js"
  sbx() { node "$cli" "$@"; }
fi

check() { # check ACTUAL EXPECTED WHAT
  if [ "$1" != "$2" ]; then
    echo "check failed: $3: got '$1', expected '$2'" >&2
    exit 1
  fi
}

id=$(sbx create)
children=""
trap 'sbx rm $id $children >/dev/null 2>&1 || true' EXIT
echo "created $id"

sbx exec "$id" $'import math\nvalues = [math.pi]'
out=$(sbx exec "$id" $'values.append(2 * values[0])\nprint(len(values), round(values[-1], 4))')
echo "state persists: $out"
check "$out" "2 6.2832" "persistent state"

children=$(sbx fork "$id" -n 2 | tr '\n' ' ')
echo "forked $children"
i=0
for child in $children; do
  out=$(echo "values.append($i); print(values[-1])" | sbx exec "$child" -)
  echo "  child $i says $out"
  check "$out" "$i" "child $i"
  i=$((i + 1))
done

winner=$(echo "$children" | awk '{print $2}')
sbx merge "$id" "$winner" >/dev/null
out=$(sbx exec "$id" 'print(values[-1], len(values))')
echo "after merging child 1 the parent has: $out"
check "$out" "1 3" "merged state"

status=0
sbx exec "$id" --bash 'exit 7' || status=$?
check "$status" 7 "exit status of exec"

sbx rm "$id" $(echo "$children" | awk '{print $1}')
trap - EXIT
if sbx rm "$id" 2>/dev/null; then
  echo "check failed: a deleted sandbox could be deleted again" >&2
  exit 1
fi
echo "deleted; quickstart ok"
