#!/usr/bin/env bash
# The whole test suite; called by scripts/run.sh after setup (so dist/ and the guest image
# exist and SERVICE_IMAGE_DIR is set). Prints node's test-runner summary last.
set -uo pipefail
cd "$(dirname "$0")/.."
failures=()

step() { printf '\n=== %s ===\n' "$*"; }

step "guest agent (python unittest)"
python3 -m unittest discover -s guest/agent/tests || failures+=("guest agent")

step "lint and format"
npx --no-install eslint . || failures+=("eslint")
npx --no-install prettier --check . >/dev/null || { npx --no-install prettier --check . ; failures+=("prettier"); }

if [ -f sdk/test.sh ]; then
  step "SDKs and CLI against a real hostd"
  sdk_state=$(mktemp -d /dev/shm/hostd-sdk-XXXXXX)
  sdk_log=$(mktemp)
  sdk_key="sdk-test-$RANDOM$RANDOM"
  SERVICE_HOSTD_ADDR=127.0.0.1:0 SERVICE_STATE_DIR="$sdk_state" SERVICE_API_KEYS="$sdk_key" \
    node dist/src/main.js >"$sdk_log" 2>&1 &
  sdk_pid=$!
  url=""
  for _ in $(seq 1 1800); do
    url=$(grep -o 'hostd listening on http://[0-9.:]*' "$sdk_log" | head -1 | sed 's/hostd listening on //')
    [ -n "$url" ] && break
    kill -0 "$sdk_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -n "$url" ]; then
    SERVICE_HOSTD_URL="$url" SERVICE_API_KEY="$sdk_key" bash sdk/test.sh || failures+=("sdk")
  else
    echo "hostd for the SDK tests did not start:"; tail -20 "$sdk_log"; failures+=("sdk hostd")
  fi
  kill -TERM "$sdk_pid" 2>/dev/null; wait "$sdk_pid" 2>/dev/null
  if [ -d "$sdk_state" ]; then echo "SDK hostd left $sdk_state behind"; failures+=("sdk cleanup"); rm -rf "$sdk_state"; fi
  rm -f "$sdk_log"
fi

step "hostd unit and integration tests (node:test)"
node --test --test-concurrency=1 --test-timeout=600000 dist/test/unit/ dist/test/integration/ || failures+=("node tests")

leaked=$(pgrep -fc 'qemu-system.*/dev/shm/hostd-(test|sdk)-' || true)
if [ "${leaked:-0}" != 0 ]; then echo "LEAK: $leaked QEMU processes of the test run are still alive"; failures+=("leaked qemu"); fi

if [ "${#failures[@]}" -gt 0 ]; then
  printf '\nFAILED: %s\n' "${failures[*]}"
  exit 1
fi
echo "all suites passed"
