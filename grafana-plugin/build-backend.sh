#!/bin/sh
# Builds the backend executables Grafana expects beside module.js:
# gpx_deepseed_<os>_<arch>. The backend lives in the repository's Go module.
set -eu
cd "$(dirname "$0")/.."
for arch in amd64 arm64; do
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -ldflags "-s -w" \
    -o "grafana-plugin/dist/gpx_deepseed_linux_$arch" ./grafana-plugin/pkg
done
