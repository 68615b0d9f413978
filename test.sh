#!/usr/bin/env bash
# Runs every test of the repository from a fresh clone, installing what is
# missing: PostgreSQL (apt-get) when no server binaries are found, Slurm
# and MUNGE (apt-get, optional: without them the Slurm executor's tests
# skip), the plugin's npm packages from its lockfile. The Go suite runs on TimescaleDB
# when the machine's PostgreSQL has the extension (or
# DEEPSEED_TEST_DATABASE_URL names a TimescaleDB server), else on plain
# PostgreSQL; DEEPSEED_TEST_TIMESCALE=off forces plain.
#
#   ./test.sh            everything
#   ./test.sh go         only the Go suites (also: chaos, hook, plugin)
#
#   DEEPSEED_TEST_NO_SLURM=1    do not install Slurm and MUNGE (their tests skip)
#   DEEPSEED_TEST_NO_INSTALL=1  install nothing system-wide
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$PWD
only=${1:-all}

# Each step says how long the run has taken so far, so that a slow step
# shows in the log.
log() { printf '\n==> [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

have_pg() {
  [ -n "${DEEPSEED_TEST_DATABASE_URL:-}" ] && return 0
  command -v initdb >/dev/null 2>&1 && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
}

no_install=${DEEPSEED_TEST_NO_INSTALL:-}
if ! have_pg; then
  if [ -n "$no_install" ]; then
    echo "no PostgreSQL server binaries and DEEPSEED_TEST_NO_INSTALL is set: install PostgreSQL, or set DEEPSEED_TEST_DATABASE_URL" >&2
    exit 1
  fi
  log "installing PostgreSQL (no server binaries found)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends postgresql
fi

# The Slurm executor's tests start a single-node Slurm from the machine's
# packages and skip, saying why, where they cannot; installing them is
# worth a try but never a reason to stop.
have_slurm() {
  for b in slurmctld slurmd munged sbatch; do
    command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || return 1
  done
}
if [ "$only" = all ] || [ "$only" = go ]; then
  if [ -n "${DEEPSEED_TEST_NO_SLURM:-}$no_install" ]; then
    have_slurm || echo "DEEPSEED_TEST_NO_SLURM or DEEPSEED_TEST_NO_INSTALL set: not installing Slurm and MUNGE; the Slurm executor's tests will skip"
  elif ! have_slurm; then
    log "installing Slurm and MUNGE for the Slurm executor's tests (optional)"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo -n"
    { $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends slurm-wlm munge; } \
      || echo "could not install slurm-wlm and munge; the Slurm executor's tests will skip"
  fi
fi

if [ "$only" = all ] || [ "$only" = go ]; then
  log "gofmt and go vet"
  unformatted=$(gofmt -l $(git ls-files '*.go'))
  if [ -n "$unformatted" ]; then echo "gofmt needed:"; echo "$unformatted"; exit 1; fi
  go vet ./...

  # The suite runs on TimescaleDB where the database has it: the throwaway
  # cluster preloads it when the machine's PostgreSQL has the extension, or
  # DEEPSEED_TEST_DATABASE_URL names a TimescaleDB server. Say which, once,
  # and hold every package to it.
  mode=$(go test -count=1 -v -run '^TestDatabaseMode$' ./store/storetest/ 2>&1 | sed -n 's/.*storetest_test.go:[0-9]*: database mode: //p' | head -1)
  [ -n "$mode" ] || { go test -count=1 -v -run '^TestDatabaseMode$' ./store/storetest/; exit 1; }
  # The dashboards' test renders every panel query with the plugin's
  # frontend (Node.js), so its npm packages come before the Go suite.
  if [ ! -d grafana-plugin/node_modules ]; then
    log "npm ci (grafana-plugin), for the dashboards' frontend test"
    (cd grafana-plugin && npm ci --no-audit --no-fund --loglevel=error)
    # The plugin's suite below installs from the same lockfile: once is enough.
    export DEEPSEED_PLUGIN_NPM_CI_DONE=1
  fi
  log "go test (database mode: $mode)"
  case "$mode" in TimescaleDB*) export DEEPSEED_TEST_TIMESCALE=${DEEPSEED_TEST_TIMESCALE:-require} ;; esac
  go test -count=1 -timeout 40m ./...
fi

if [ "$only" = all ] || [ "$only" = chaos ]; then
  log "chaos: PostgreSQL, server and collector killed with SIGKILL under load, the database read-only, slow and hostile clients; nothing acknowledged may be lost"
  tmp_chaos=$(mktemp -d)
  go build -o "$tmp_chaos/deepseed" ./cmd/deepseed
  "$tmp_chaos/deepseed" bench chaos --cycles 2
  rm -rf "$tmp_chaos"
fi

if [ "$only" = all ] || [ "$only" = hook ]; then
  log "Python hook: pip install ./hook into a fresh venv with no package index reachable"
  venv=$(mktemp -d)
  python3 -m venv "$venv"
  # No index and a proxy that refuses every connection: the install must
  # come from the tree alone (the hook's own standard-library backend).
  PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 \
    http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 \
    "$venv/bin/pip" install --no-index --quiet ./hook
  (cd "$venv" && "$venv/bin/python" -c 'import deepseed, os, sys; p = deepseed.__file__; assert p.startswith(sys.prefix), p; print("installed", p)')
  rm -rf "$venv"

  log "Python hook, against a real deepseed server"
  tmp=$(mktemp -d)
  # Run as root, the private PostgreSQL runs as another user, which must
  # be able to enter the directory this script made.
  chmod 711 "$tmp"
  go build -o "$tmp/deepseed" ./cmd/deepseed
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  pgport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  DEEPSEED_INGEST_TOKENS=hook-test-token "$tmp/deepseed" serve --listen "127.0.0.1:$port" \
    --data-dir "$tmp/data" --local-pg-port "$pgport" --log-level warn >"$tmp/serve.log" 2>&1 &
  server=$!
  cleanup() { kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$tmp"; }
  trap cleanup EXIT
  ready() { python3 -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "http://127.0.0.1:$port/readyz" 2>/dev/null; }
  for _ in $(seq 1 120); do
    ready && break
    kill -0 "$server" 2>/dev/null || { cat "$tmp/serve.log"; exit 1; }
    sleep 0.5
  done
  ready || { echo "server did not become ready"; cat "$tmp/serve.log"; exit 1; }
  DEEPSEED_TEST_SERVER_URL="http://127.0.0.1:$port" DEEPSEED_TEST_TOKEN=hook-test-token \
    DEEPSEED_TEST_BINARY="$tmp/deepseed" ./hook/test.sh
  cleanup; trap - EXIT
fi

if [ "$only" = all ] || [ "$only" = plugin ]; then
  if [ -x grafana-plugin/test.sh ]; then
    log "Grafana plugin: npm ci, typecheck, lint, unit tests, build"
    ./grafana-plugin/test.sh
  fi
fi

log "all suites passed"
