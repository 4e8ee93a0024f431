#!/usr/bin/env bash
# The one entry point behind `npm start`, `npm test`, `npm run bench` and `npm run cluster`
# (three nodes on etcd behind HAProxy, on this machine's loopback): install what is
# missing (Debian packages when root, else print the exact command), install npm packages,
# compile, build every template into the cache for tests and the bench (a broken recipe is
# reported and the rest go on; `npm start` leaves that to hostd, which serves meanwhile), then do
# the job.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-start}"

say() { printf 'hostd setup: %s\n' "$*" >&2; }

# scripts/host-packages declares every host command the scripts use and its Debian package;
# the ones only the tests need (chromium) are installed for `npm test` alone, and etcd and
# HAProxy never for `npm start`.
# shellcheck source=lib/host-deps.sh
. scripts/lib/host-deps.sh
mapfile -t needed < <(host_deps_commands "$mode")
missing=$(host_deps_missing "${needed[@]}" | tr '\n' ' ')
if [ -n "${missing// /}" ]; then
  if [ "$(id -u)" = 0 ]; then
    say "installing Debian packages: $missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
  else
    say "missing system packages. Run this, then try again:"
    printf '  sudo apt-get update && sudo apt-get install -y --no-install-recommends %s\n' "$missing" >&2
    exit 1
  fi
fi

# As root, hostd runs QEMU as this unprivileged account, and the guest image must live where
# that account can read it (root's home is private).
if [ "$(id -u)" = 0 ]; then
  vm_user="${SERVICE_VM_USER:-hostd-vm}"
  if ! id "$vm_user" >/dev/null 2>&1; then
    say "creating the system account $vm_user that QEMU runs as"
    useradd --system --no-create-home --shell /usr/sbin/nologin "$vm_user"
  fi
  export SERVICE_CACHE_DIR="${SERVICE_CACHE_DIR:-/var/cache/hostd}"
fi

# npm packages: reinstall when the lock file changed since the last install.
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  say "installing npm packages"
  npm ci --no-audit --no-fund --loglevel=error
fi

# shellcheck source=lib/compile.sh
. scripts/lib/compile.sh
compile_typescript

if [ "$mode" = start ]; then
  # hostd builds what is missing itself, in the background, and serves meanwhile: on a new
  # machine the API answers at once and creates of a template still building get 503
  # template_unavailable with Retry-After (the SDKs wait and retry).
  say "templates missing from the cache are built by hostd in the background (GET /v1/templates shows their state)"
elif [ "$mode" = cluster ]; then
  # The local cluster serves the templates of SERVICE_TEMPLATES (python-slim by default): only
  # those are built before its nodes start, so that the three do not each build them.
  for t in $(printf '%s' "${SERVICE_TEMPLATES:-python-slim}" | tr ',' ' ' | sed 's/:[^ ]*//g'); do
    node dist/src/template-cli.js build "$t" || say "template $t failed to build (see above)"
  done
else
  say "building the templates (cached; the first build of python downloads and installs packages for minutes)"
  # Tests and the bench want every template warm before they start.
  node dist/src/template-cli.js build --all ||
    say "some templates failed to build (see above); hostd serves the others and reports them failed"
fi

case "$mode" in
  start)
    exec node dist/src/main.js
    ;;
  test)
    exec bash scripts/test.sh
    ;;
  bench)
    exec node dist/bench/run.js
    ;;
  cluster)
    exec node dist/testkit/cluster-cli.js
    ;;
  *)
    say "unknown mode $mode (start|test|bench|cluster)"
    exit 2
    ;;
esac
