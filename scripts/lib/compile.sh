# Sourced by the setup scripts (run from the repository's root), with a say() function defined.
#
#   compile_typescript   compiles src, test, bench, testkit, scripts (gen-openapi.ts, gen-sdk-types.ts) and the
#                        E2B example (examples/e2b/src) into dist/ unless dist/ is current (with
#                        the TypeScript SDK's MCP tools, which hostd's /mcp serves)

# TypeScript is compiled only when a source changed since the last build: a restart with nothing
# changed then serves in about 2 s instead of waiting for tsc (40 s on a loaded 2-core host).
# dist/.sources lists what the last build compiled; a file added, removed or renamed since means a
# clean build, so that no stale output (a deleted test) stays in dist/. tsc itself is incremental
# (tsconfig.json's tsBuildInfoFile), so an edit to one file recompiles little.
compile_typescript() {
  local sources inputs=(src test bench testkit scripts examples/e2b/src sdk/typescript/src tsconfig.json package-lock.json)
  sources=$(find "${inputs[@]}" -name '*.ts' -type f | LC_ALL=C sort)
  # Only what tsc reads counts as a change: the bench's results (bench/results/, written by every
  # `npm run bench`) and any other file written under these directories at run time do not.
  if [ -f dist/.sources ] && [ "$(cat dist/.sources)" = "$sources" ] &&
    [ -z "$(find "${inputs[@]}" -type f \( -name '*.ts' -o -name tsconfig.json -o -name package-lock.json \) \
      -newer dist/.sources -print -quit)" ]; then
    return 0
  fi
  if [ ! -f dist/.sources ] || [ "$(cat dist/.sources)" != "$sources" ]; then rm -rf dist; fi
  say "compiling TypeScript"
  # Stamped before compiling: a file edited while tsc runs is newer than the stamp next time.
  mkdir -p dist
  printf '%s' "$sources" >dist/.sources.next
  if ! npx --no-install tsc -p tsconfig.json; then
    rm -f dist/.sources.next
    exit 1
  fi
  mv dist/.sources.next dist/.sources
}
