#!/bin/sh
# Issue #19: does a gRPC count depend on how busy the CPU is? Under the machine's measurement
# lock (one hold), a subset of gRPC variants counted twice pinned (Envoy alone on CPU 1, client
# and echo app on CPU 0; the profile's default) and twice unpinned, each time first with the
# CPUs free, then inside a CPU quota of 25 % of one CPU (as when another session's quiet
# measurement capped this one). As root, from the repository; OUT defaults to artifacts/i19/s3.
set -eu
OUT=${1:-artifacts/i19/s3}
QM=${QM:-scripts/quiet-measure.sh}
V=${VARIANTS:-ip_tagging_1,rate_limit}
mkdir -p "$OUT"
"$QM" sh -c "
  env PYTHONPATH=$PWD/src .venv/bin/python experiments/microarch_agreement.py --mode grpc \
    --variants $V --runs 2 --cap 25 --cap-runs 2 --out $OUT/grpc-pinned.json \
    > $OUT/grpc-pinned.log 2>&1
  env PYTHONPATH=$PWD/src .venv/bin/python experiments/microarch_agreement.py --mode grpc \
    --variants $V --runs 2 --cap 25 --cap-runs 2 --no-pin --out $OUT/grpc-unpinned.json \
    > $OUT/grpc-unpinned.log 2>&1
"
.venv/bin/python benchmarks/microarch_table.py "$OUT/grpc-pinned.json"
.venv/bin/python benchmarks/microarch_table.py "$OUT/grpc-unpinned.json"
