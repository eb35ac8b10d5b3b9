#!/usr/bin/env bash
# Build meshapp into .tools/bin (idempotent; Go modules come from the Go module proxy).
# Usage: bash app/build.sh [OUTPUT]   (default: <repo>/.tools/bin/meshapp)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/../.tools/bin/meshapp}"
if ! command -v go >/dev/null 2>&1; then
  for d in /usr/local/go/bin /usr/lib/go/bin; do [ -x "$d/go" ] && PATH="$d:$PATH"; done
fi
command -v go >/dev/null 2>&1 || { echo "app/build.sh: go not found (install Go >= 1.24)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
cd "$here"
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$out" ./cmd/meshapp
echo "app/build.sh: built $out"
