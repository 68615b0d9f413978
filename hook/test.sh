#!/usr/bin/env bash
# Runs the hook's core tests with the standard library only (no torch).
set -euo pipefail
cd "$(dirname "$0")"
exec python3 -m unittest discover -s tests -t . -v "$@"
