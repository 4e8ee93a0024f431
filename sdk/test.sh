#!/usr/bin/env bash
# Builds and tests both SDKs and the CLI, then runs the examples:
#
#   bash sdk/test.sh                                          # unit tests only
#   SERVICE_HOSTD_URL=http://127.0.0.1:7070 SERVICE_API_KEY=... bash sdk/test.sh   # and integration
#
# Integration tests, README examples and examples/ need a running hostd named by
# SERVICE_HOSTD_URL (scripts/test.sh starts one); without it they are skipped, loudly.
# Exits non-zero on any failure. The last line is always `sdk: N passed, M failed`.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
TS="$ROOT/sdk/typescript"

passed=0
failed=0
skipped=0
failures=()
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step() { printf '\n=== sdk: %s ===\n' "$*"; }
fail_step() { failed=$((failed + 1)); failures+=("$1"); }

# Adds the counts of a node:test TAP report (skipped suites are not in node's own counts).
count_tap() {
  local tap=$1 p f c s
  p=$(grep -E '^# pass [0-9]+' "$tap" | tail -1 | awk '{print $3}')
  f=$(grep -E '^# fail [0-9]+' "$tap" | tail -1 | awk '{print $3}')
  c=$(grep -E '^# cancelled [0-9]+' "$tap" | tail -1 | awk '{print $3}')
  s=$(grep -cE '^ *ok [0-9]+ - .*# SKIP' "$tap")
  passed=$((passed + ${p:-0}))
  failed=$((failed + ${f:-0} + ${c:-0}))
  skipped=$((skipped + ${s:-0}))
}

# Adds the counts of a `python -m unittest -v` log.
count_unittest() {
  local log=$1 ran f e s x
  ran=$(grep -oE '^Ran [0-9]+ test' "$log" | tail -1 | awk '{print $2}')
  f=$(grep -oE 'failures=[0-9]+' "$log" | tail -1 | cut -d= -f2)
  e=$(grep -oE 'errors=[0-9]+' "$log" | tail -1 | cut -d= -f2)
  s=$(grep -oE 'skipped=[0-9]+' "$log" | tail -1 | cut -d= -f2)
  x=$(grep -oE 'unexpected successes=[0-9]+' "$log" | tail -1 | cut -d= -f2)
  ran=${ran:-0} f=${f:-0} e=${e:-0} s=${s:-0} x=${x:-0}
  passed=$((passed + ran - f - e - s - x))
  failed=$((failed + f + e + x))
  skipped=$((skipped + s))
}

if [ -z "${SERVICE_HOSTD_URL:-}" ]; then
  echo "sdk: SERVICE_HOSTD_URL is not set: integration tests, README examples and examples/ are SKIPPED (unit tests only)"
fi

step "build the TypeScript SDK"
# The package builds with typescript and @types/node, and its MCP module with the MCP SDK and
# zod. Use its own install when there is one, else the root's (hostd serves the same MCP tools,
# so the root's `npm ci` installs them all), else install into sdk/typescript.
tsc=""
if [ -x "$TS/node_modules/.bin/tsc" ]; then
  tsc="$TS/node_modules/.bin/tsc"
elif [ -x "$ROOT/node_modules/.bin/tsc" ] && [ -d "$ROOT/node_modules/@types/node" ] &&
  [ -d "$ROOT/node_modules/@modelcontextprotocol/sdk" ] && [ -d "$ROOT/node_modules/zod" ]; then
  tsc="$ROOT/node_modules/.bin/tsc"
else
  echo "installing sdk/typescript's devDependencies"
  (cd "$TS" && npm ci --no-audit --no-fund --loglevel=error) && tsc="$TS/node_modules/.bin/tsc"
fi
built=0
if [ -n "$tsc" ] && rm -rf "$TS/dist" && "$tsc" -p "$TS/tsconfig.json"; then
  chmod +x "$TS/dist/src/cli.js"
  built=1
  echo "built sdk/typescript/dist with $tsc"
else
  fail_step "TypeScript build"
fi

run_node_tests() { # NAME FILE...
  local name=$1
  shift
  local tap="$work/$name.tap"
  timeout 1800 node --test --test-concurrency=1 \
    --test-reporter=spec --test-reporter-destination=stdout \
    --test-reporter=tap --test-reporter-destination="$tap" "$@"
  local rc=$?
  count_tap "$tap"
  if [ "$rc" != 0 ]; then failures+=("$name"); fi
  if [ "$rc" != 0 ] && ! grep -qE '^# fail [1-9]' "$tap"; then failed=$((failed + 1)); fi
}

if [ "$built" = 1 ]; then
  step "TypeScript SDK tests"
  mapfile -t ts_tests < <(find "$TS/dist/test" -maxdepth 1 -name '*.test.js' ! -name 'cli*.test.js' | sort)
  run_node_tests "TypeScript tests" "${ts_tests[@]}"

  step "CLI tests"
  mapfile -t cli_tests < <(find "$TS/dist/test" -maxdepth 1 -name 'cli*.test.js' | sort)
  run_node_tests "CLI tests" "${cli_tests[@]}"
fi

step "Python SDK tests"
pylog="$work/python.log"
PYTHONPATH="$ROOT/sdk/python${PYTHONPATH:+:$PYTHONPATH}" timeout 1800 \
  python3 -m unittest discover -s sdk/python/tests -v 2>&1 | tee "$pylog"
pyrc=${PIPESTATUS[0]}
count_unittest "$pylog"
if [ "$pyrc" != 0 ]; then
  failures+=("Python tests")
  if ! grep -qE '(failures|errors)=[1-9]' "$pylog"; then failed=$((failed + 1)); fi
fi

step "examples"
if [ -z "${SERVICE_HOSTD_URL:-}" ]; then
  echo "skipped: SERVICE_HOSTD_URL is not set"
  skipped=$((skipped + 8))
elif [ "$built" != 1 ]; then
  echo "skipped: the TypeScript SDK did not build"
  fail_step "examples (no build)"
else
  # quickstart.sh runs `sbx` from PATH: make that this checkout's CLI.
  mkdir -p "$work/bin"
  printf '#!/bin/sh\nexec node "%s" "$@"\n' "$TS/dist/src/cli.js" >"$work/bin/sbx"
  chmod +x "$work/bin/sbx"
  # readme.mjs imports '@hostd/sdk' as the root README shows it: run it from inside the
  # package, where that name resolves to this checkout by self-reference.
  cp examples/readme.mjs "$TS/dist/readme-root.mjs"
  for example in quickstart.mjs quickstart.py quickstart.sh readme.mjs readme.py readme.sh data-in-out.py; do
    case $example in
      readme.mjs) cmd=(node "$TS/dist/readme-root.mjs") ;;
      readme.py) cmd=(env "PYTHONPATH=$ROOT/sdk/python" python3 "examples/$example") ;;
      *.mjs) cmd=(node "examples/$example") ;;
      *.py) cmd=(python3 "examples/$example") ;;
      *.sh) cmd=(bash "examples/$example") ;;
    esac
    echo "--- examples/$example"
    if PATH="$work/bin:$PATH" timeout 300 "${cmd[@]}"; then
      passed=$((passed + 1))
    else
      fail_step "examples/$example"
    fi
  done
  # Examples of features the server may not have yet (its routes land in parallel with the
  # SDKs): run when the server has them, else skipped with the reason.
  lacking=$(node --input-type=module -e "
    import { lacks } from '$TS/dist/test/helpers/features.js';
    console.log((await lacks('files')) ?? (await lacks('snapshots')) ?? '');")
  for example in files-and-snapshots.mjs files-and-snapshots.py; do
    echo "--- examples/$example"
    if [ -n "$lacking" ]; then
      echo "skipped: $lacking"
      skipped=$((skipped + 1))
      continue
    fi
    case $example in
      *.mjs) cmd=(node "examples/$example") ;;
      *.py) cmd=(python3 "examples/$example") ;;
    esac
    if timeout 300 "${cmd[@]}"; then
      passed=$((passed + 1))
    else
      fail_step "examples/$example"
    fi
  done
fi

echo
if [ "${#failures[@]}" -gt 0 ]; then echo "sdk: FAILED: ${failures[*]}"; fi
if [ "$skipped" -gt 0 ]; then echo "sdk: $skipped skipped"; fi
echo "sdk: $passed passed, $failed failed"
[ "$failed" = 0 ] && [ "${#failures[@]}" = 0 ]
