#!/bin/bash
# offline, seen data: sets 10-14's Bookinfo predicted again by the current model and set 15's
# candidate (one hop: the same under both, from each set's own scoring of s13-ramp-shape)
set -u
cd /work/h20
export PYTHONPATH=$PWD/src:$PWD/experiments
for s in 10 11 12 13 14; do
  A=artifacts/tail20-s$s
  echo "== set $s"
  .venv/bin/python experiments/tail_variants.py --db $A/prof-set$s.db \
    --doc $A/set${s}b/bookinfo-http-of-mesh.json --variants s13-ramp-shape,s15-steady-work --calibrate 0.6 --levels
done
