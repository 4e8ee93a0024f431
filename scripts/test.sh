#!/usr/bin/env bash
# The whole test suite; called by scripts/run.sh after setup (so dist/ and the guest image
# exist and the templates are built). Prints node's test-runner summary last.
set -uo pipefail
cd "$(dirname "$0")/.."
failures=()
passed=0
failed=0
logs=$(mktemp -d)
# Templates frozen by the run's first hostd that serves them, restored by the later ones as a
# restarted hostd would (testkit/template-seed.ts): each cold boot of `python` costs minutes.
HOSTD_TEST_TEMPLATE_SEED=$(mktemp -d /var/tmp/hostd-test-seed-XXXXXX)
export HOSTD_TEST_TEMPLATE_SEED
trap 'rm -rf "$logs" "$HOSTD_TEST_TEMPLATE_SEED"' EXIT

# Each step says when it starts, in seconds since the suite began, so that a slow CI run shows
# which step took the time (node's own report below gives each test file's share).
SECONDS=0
step() { printf '\n=== %s (at %ds) ===\n' "$*" "$SECONDS"; }
# Adds "N passed, M failed" counts found in a suite's log to the totals.
count() {
  local p f
  p=$(grep -aoE "$2" "$1" | tail -1 | grep -oE '[0-9]+' | head -1)
  f=$(grep -aoE "$3" "$1" | tail -1 | grep -oE '[0-9]+' | head -1)
  passed=$((passed + ${p:-0}))
  failed=$((failed + ${f:-0}))
}

step "guest agent (python unittest)"
python3 -m unittest discover -s guest/agent/tests 2>&1 | tee "$logs/agent.log"
if [ "${PIPESTATUS[0]}" != 0 ]; then failures+=("guest agent"); fi
ran=$(grep -aoE '^Ran [0-9]+' "$logs/agent.log" | grep -oE '[0-9]+' || echo 0)
bad=$(grep -aoE '^FAILED \(.*\)' "$logs/agent.log" | grep -oE '[0-9]+' | awk '{s += $1} END {print s + 0}')
passed=$((passed + ran - ${bad:-0}))
failed=$((failed + ${bad:-0}))

step "lint and format"
npx --no-install eslint . || failures+=("eslint")
npx --no-install tsc -p console || failures+=("console type-check")
npx --no-install prettier --check . >/dev/null || { npx --no-install prettier --check . ; failures+=("prettier"); }
# docs/openapi.json's components are generated from src/api/wire, and the SDKs' payload types
# from docs/openapi.json: a stale file names itself.
node dist/scripts/gen-openapi.js --check || failures+=("openapi stale")
node dist/scripts/gen-sdk-types.js --check || failures+=("generated SDK types")

step "templates: the worked example and python, built and booted"
if bash guest/image/template-test.sh 2>&1 | tee "$logs/templates.log"; [ "${PIPESTATUS[0]}" = 0 ]; then
  passed=$((passed + 1))
else
  failures+=("templates")
  failed=$((failed + 1))
fi

if [ -f sdk/test.sh ]; then
  step "SDKs and CLI against a real hostd"
  sdk_state=$(mktemp -d /dev/shm/hostd-sdk-XXXXXX)
  sdk_data=$(mktemp -d /var/tmp/hostd-sdk-data-XXXXXX)
  sdk_log=$(mktemp)
  sdk_key="sdk-test-$RANDOM$RANDOM"
  SERVICE_HOSTD_ADDR=127.0.0.1:0 SERVICE_STATE_DIR="$sdk_state" SERVICE_DATA_DIR="$sdk_data" SERVICE_API_KEYS="$sdk_key" \
    node dist/src/main.js >"$sdk_log" 2>&1 &
  sdk_pid=$!
  url=""
  # hostd writes its address into its state directory once it serves. It boots its templates
  # first, cold (this is the run's first hostd): up to 15 min on a busy host, as testkit's
  # startHostd allows; a hostd that exits ends the wait at once.
  for _ in $(seq 1 9000); do
    url=$(cat "$sdk_state/hostd.url" 2>/dev/null || true)
    [ -n "$url" ] && break
    kill -0 "$sdk_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -n "$url" ]; then
    SERVICE_HOSTD_URL="$url" SERVICE_API_KEY="$sdk_key" bash sdk/test.sh 2>&1 | tee "$logs/sdk.log"
    if [ "${PIPESTATUS[0]}" != 0 ]; then failures+=("sdk"); fi
    count "$logs/sdk.log" 'sdk: [0-9]+ passed' ', [0-9]+ failed'
  else
    echo "hostd for the SDK tests did not start:"; tail -20 "$sdk_log"; failures+=("sdk hostd")
  fi
  kill -TERM "$sdk_pid" 2>/dev/null; wait "$sdk_pid" 2>/dev/null
  # Its frozen templates start the seed, as each testkit hostd's add to it.
  node --input-type=module -e 'const { harvestTemplates } = await import("./dist/testkit/template-seed.js"); await harvestTemplates(process.argv[1]);' "$sdk_data" ||
    echo "the SDK hostd's templates were not added to the seed: later hostds boot them"
  if [ -d "$sdk_state" ]; then echo "SDK hostd left $sdk_state behind"; failures+=("sdk cleanup"); rm -rf "$sdk_state"; fi
  rm -rf "$sdk_log" "$sdk_data"
fi

step "hostd unit, integration and browser tests (node:test)"
# The browser tests (the web console in Debian's chromium) write screenshots to artifacts/console/.
# Beside TAP, test/reporters/file-times.ts writes each file's wall time (its hooks, its hostd's
# start and anything that keeps its process alive after its last test included), printed after.
node --test --test-concurrency=1 --test-timeout=900000 \
  --test-reporter=tap --test-reporter-destination=stdout \
  --test-reporter=./dist/test/reporters/file-times.js --test-reporter-destination="$logs/file-times" \
  dist/test/unit/ dist/test/integration/ dist/test/browser/ 2>&1 | tee "$logs/node.log"
if [ "${PIPESTATUS[0]}" != 0 ]; then failures+=("node tests"); fi
count "$logs/node.log" '^# pass [0-9]+' '^# fail [0-9]+'
step "time per test file"
head -25 "$logs/file-times" 2>/dev/null

leaked=$(pgrep -fc 'qemu-system.*/dev/shm/hostd-(test|sdk)-' || true)
if [ "${leaked:-0}" != 0 ]; then echo "LEAK: $leaked QEMU processes of the test run are still alive"; failures+=("leaked qemu"); fi

if [ "${#failures[@]}" -gt 0 ]; then
  printf '\nFAILED: %s\n' "${failures[*]}"
  [ "$failed" -gt 0 ] || failed=${#failures[@]}
  printf 'tests: %d passed, %d failed\n' "$passed" "$failed"
  exit 1
fi
printf 'tests: %d passed, %d failed\n' "$passed" "$failed"
