#!/bin/sh
# Issue #19: two back-to-back `meshtax profile --microarch` runs (the default filter set, quick
# windows, the bundled reference as base) for each mode, each mode's pair one command under the
# machine's measurement lock (scripts/quiet-measure.sh: the lock, every other process capped);
# then BENCHMARKS.md's tables. As root, from the repository; OUT (default artifacts/i19/s3) holds
# one profile database and one JSON per mode. MODES (default "http grpc tcp") picks modes and their order.
set -eu
OUT=${1:-artifacts/i19/s3}
QM=${QM:-scripts/quiet-measure.sh}
mkdir -p "$OUT"
for mode in ${MODES:-http grpc tcp}; do
  date -u +"%FT%TZ $mode: start"
  "$QM" env PYTHONPATH="$PWD/src" .venv/bin/python benchmarks/bench_microarch.py \
    --db "$OUT/$mode.db" --base reference --modes "$mode" --quick --out "$OUT/$mode.json" \
    > "$OUT/$mode.log" 2>&1
  date -u +"%FT%TZ $mode: done"
done
jsons=""
for mode in ${MODES:-http grpc tcp}; do jsons="$jsons $OUT/$mode.json"; done
# shellcheck disable=SC2086
.venv/bin/python benchmarks/microarch_table.py $jsons
