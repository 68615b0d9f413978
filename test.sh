#!/usr/bin/env bash
# Runs every test of the repository from a fresh clone, installing what is
# missing: PostgreSQL (apt-get) when no server binaries are found, the
# plugin's npm packages from its lockfile.
set -euo pipefail
cd "$(dirname "$0")"

log() { printf '\n==> %s\n' "$*"; }

need_pg() {
  command -v initdb >/dev/null 2>&1 && return 1
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && return 1
  [ -n "${DEEPSEED_TEST_DATABASE_URL:-}" ] && return 1
  return 0
}

if need_pg; then
  log "installing PostgreSQL (no server binaries found)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q postgresql
fi

log "go vet"
test -z "$(gofmt -l $(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $(git ls-files '*.go'); exit 1; }
go vet ./...

log "go test"
go test -count=1 -timeout 30m ./...
