#!/usr/bin/env bash
# How many messages a sidecar forwards per request, by size, in each mode (issue #14, item 5):
# bpftrace counts Envoy's and meshapp's reads/writes while `meshtax validate` runs one query of
# experiments/offpath.yaml per mode. Divide by the requests sent (the mesh runs' count plus the
# warm-up: every request crosses the same sidecars). Run as root, under scripts/quiet-measure.sh:
#
#   scripts/quiet-measure.sh experiments/control_frames.sh OUT DB PROFILE [QUERY] [RATE]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?OUT directory} db=${2:?profile DB} profile=${3:?profile name}
query=${4:-small} rate=${5:-40}
mkdir -p "$out"
ulimit -l unlimited 2>/dev/null || true  # bpftrace raises it itself where it may
for mode in tcp grpc http; do
    bpftrace "$here/control_frames.bt" >"$out/count-$mode.txt" 2>&1 &
    bp=$!
    sleep 3  # attached
    "$here/../.venv/bin/meshtax" validate "$here/offpath.yaml" --query "$query" --modes "$mode" \
        --rate "$rate" --duration 3 --db "$db" --profile "$profile" --format json \
        >"$out/val-$mode.json" 2>"$out/val-$mode.err" || true
    kill -INT "$bp"
    wait "$bp" || true
done
