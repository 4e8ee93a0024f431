#!/usr/bin/env bash
# `npm run test:unit`: the fast tests alone, no VM and no template needed, for the edit-test loop:
# hostd's unit tests (core against the fake hypervisor, the HTTP layer through fastify's inject(),
# pure vm logic), the guest agent's unit tests (the agent run locally, no VM), lint and the check
# that docs/openapi.json is generated from the current wire schemas. The slow
# suites (test/integration against real VMs, the SDKs against a real hostd, the templates built
# and booted) run in `npm test`: they are slow because every one boots or restores QEMU VMs under
# emulation. Needs `npm ci` done once (npm start or npm test does it).
set -uo pipefail
cd "$(dirname "$0")/.."
say() { printf 'hostd test:unit: %s\n' "$*" >&2; }
# shellcheck source=lib/compile.sh
. scripts/lib/compile.sh
compile_typescript
status=0
node --test --test-concurrency=1 dist/test/unit/ || status=1
python3 -m unittest discover -s guest/agent/tests -q || status=1
npx --no-install eslint . || status=1
node dist/scripts/gen-openapi.js --check || status=1
exit "$status"
