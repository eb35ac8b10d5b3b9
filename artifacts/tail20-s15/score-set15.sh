#!/bin/bash
# offline scoring of set 15 (measures nothing); variants frozen as registered (0d4c038)
set -u
cd /work/h20
A=artifacts/tail20-s15
export PYTHONPATH=$PWD/src:$PWD/experiments
.venv/bin/python experiments/tail_variants.py --db $A/prof-set15.db --doc $A/set15/onehop-http-of-mesh.json \
  --doc $A/set15b/bookinfo-http-of-mesh.json --variants s13-ramp-shape,s15-steady-work --calibrate 0.6 --levels > $A/score15.txt 2>&1
.venv/bin/python experiments/tail_passes.py $A/set15/onehop-http-of-mesh.json $A/set15b/bookinfo-http-of-mesh.json --skip 0.6 > $A/passes-set15.txt 2>&1
.venv/bin/python experiments/tail_bias_saturation.py --variants s13-ramp-shape \
  --set artifacts/tail20-s10/prof-set10.db artifacts/tail20-s10/set10 artifacts/tail20-s10/set10b \
  --set artifacts/tail20-s11/prof-set11.db artifacts/tail20-s11/set11 artifacts/tail20-s11/set11b \
  --set artifacts/tail20-s12/prof-set12.db artifacts/tail20-s12/set12 artifacts/tail20-s12/set12b \
  --set artifacts/tail20-s13/prof-set13.db artifacts/tail20-s13/set13 artifacts/tail20-s13/set13b \
  --set artifacts/tail20-s14/prof-set14.db artifacts/tail20-s14/set14 artifacts/tail20-s14/set14b \
  --set $A/prof-set15.db $A/set15 $A/set15b > $A/bias-s10-15.md 2>&1
echo done
