#!/usr/bin/env bash
# The validations of the third 2026-12-02 H200 validation (PLAN.md), CPU only, from the repository
# root: bash profiler/data/validation/h200_2026-12-02c/validate.sh
# Machine 1 (this directory: A and B, its calibration of record: validation_calibrated) and beside
# it: shipped artifact, no probes, probes' cost ignored, measured steps. Machine 2 (machine2/: A's
# mlora run only, the device time left): its own calibration of record, machine 1's beside.
set -eu
D=profiler/data/validation/h200_2026-12-02c
V="python -m tlora_sim.sim.cli.main validate-run --force --no-progress"
one() { bash profiler/validation/validations.sh "$@"; }  # one() CAL DIR RUN...: the validations of the runs
for w in A B; do
  one $D/calibrated_h200.json $D/$w $D/$w/independent $D/$w/mlora $D/$w/tlora 2>&1 | tee $D/$w-validation.log
done
{ one $D/machine2/calibrated_h200_m2.json $D/machine2/A $D/machine2/A/mlora
  echo "== $D/machine2/A validation_machine1_calibration"
  $V $D/machine2/A/mlora --artifact $D/calibrated_h200.json --host-speed probes \
    --out $D/machine2/A/validation_machine1_calibration; } 2>&1 | tee $D/machine2/A-validation.log
