#!/bin/bash
# Set 15 of issue #20 (h20, fourteenth sitting): run under scripts/quiet-measure.sh in the slot
# 18:21-18:45 UTC; every step ends by 18:44:00 (timeout), Bookinfo skipped with < 9 min left.
# The same shape as set 14 (artifacts/tail20-s14/run-set14.sh), paths and times moved to this slot.
set -u
cd /work/h20
A=artifacts/tail20-s15
END=$(date -u -d "2026-11-27 18:44:00" +%s)
left() { echo $(( END - $(date -u +%s) )); }
echo "start $(date -u +%T) commit $(git rev-parse --short HEAD) dirty-code=$(git status --porcelain src benchmarks | wc -l) load $(cut -d' ' -f1-3 /proc/loadavg)"
now=$(date -u +%H%M)
if [ "$now" -lt 1821 ]; then echo "before the slot: nothing measured"; exit 2; fi
P1=8; P2=6; PASSES=2
if [ "$now" -ge 1822 ]; then P1=6; P2=5; fi
if [ "$now" -ge 1824 ]; then P1=5; P2=4; fi
if [ "$now" -ge 1827 ]; then P1=7; P2=6; PASSES=1; fi
if [ "$now" -ge 1830 ]; then echo "too late for set 15: nothing measured"; exit 3; fi
echo "one hop: $PASSES passes x $P1 pairs; Bookinfo: $PASSES x $P2"
export PYTHONPATH=$PWD/src
timeout -s INT -k 30 $(( $(left) - 40 )) .venv/bin/python benchmarks/bench_tail.py \
  --db $A/prof-set15.db --out $A/set15 --modes http --profile-modes http --topologies onehop \
  --relative mesh --levels 25,50,75,90 --pairs $P1 --passes $PASSES --settle 1 --duration 3 --speed
echo "one hop rc=$? at $(date -u +%T), $(left) s left"
PROF=$(.venv/bin/python -c "import json;print(json.load(open('$A/set15/summary.json'))['profile'])" 2>/dev/null)
if [ -z "$PROF" ]; then echo "no profile: Bookinfo skipped"; exit 4; fi
if [ "$(left)" -lt 540 ]; then echo "Bookinfo skipped: $(left) s left"; exit 5; fi
timeout -s INT -k 30 $(( $(left) - 40 )) .venv/bin/python benchmarks/bench_tail.py \
  --db $A/prof-set15.db --profile "$PROF" --out $A/set15b --modes http --topologies bookinfo \
  --relative mesh --levels 25,50,60,75,90 --pairs $P2 --passes $PASSES --settle 1 --duration 3 --speed
echo "bookinfo rc=$? at $(date -u +%T); load $(cut -d' ' -f1-3 /proc/loadavg); netns left: $(ip netns list | wc -l)"
