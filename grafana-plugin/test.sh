#!/usr/bin/env bash
# Builds and tests the Grafana plugin: npm ci from the lockfile, type
# check, lint, the editors' unit tests, the frontend build and the backend
# executables for linux amd64 and arm64. The backend's Go tests (against a
# real server and database) run with the repository's `go test ./...`.
set -euo pipefail
cd "$(dirname "$0")"

log() { printf '\n==> plugin: %s\n' "$*"; }

# ../test.sh sets DEEPSEED_PLUGIN_NPM_CI_DONE when it has just run npm ci
# from the same lockfile for the dashboards' test.
if [ -n "${DEEPSEED_PLUGIN_NPM_CI_DONE:-}" ] && [ -d node_modules ]; then
  log "npm ci: done by ../test.sh this run"
else
  log "npm ci"
  npm ci --no-audit --no-fund --loglevel=error
fi
log "typecheck"
npm run --silent typecheck
log "lint"
npm run --silent lint
log "unit tests"
npm run --silent test
log "build (dist/)"
npm run --silent build
for f in module.js plugin.json README.md img/logo.svg gpx_deepseed_linux_amd64 gpx_deepseed_linux_arm64; do
  test -s "dist/$f" || { echo "dist/$f is missing"; exit 1; }
done
head -c 7 dist/module.js | grep -q '^define(' || { echo "dist/module.js is not an AMD module"; exit 1; }
log "ok: dist/ holds $(ls dist | tr '\n' ' ')"
