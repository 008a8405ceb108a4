#!/usr/bin/env bash
# The validations of the third 2026-12-02 H200 validation (PLAN.md), CPU only, from the repository
# root: bash profiler/data/validation/h200_2026-12-02c/validate.sh
# Machine 1 (this directory: A and B, its calibration of record: validation_calibrated) and beside
# it: shipped artifact, no probes, probes' cost ignored, measured steps. Machine 2 (machine2/: A's
# mlora run only, the device time left): its own calibration of record, machine 1's beside.
set -eu
D=profiler/data/validation/h200_2026-12-02c
V="python -m tlora_sim.sim.cli.main validate-run --force --no-progress"
one() {  # one() CAL DIR RUN...: the validations of the runs
  local cal=$1 d=$2; shift 2; local runs="$*"
  echo "== $d validation_calibrated (of record)"; $V $runs --artifact "$cal" --host-speed probes --out "$d/validation_calibrated"
  echo "== $d validation_shipped"; $V $runs --out "$d/validation_shipped"
  echo "== $d validation_calibrated_no_probe"; $V $runs --artifact "$cal" --host-speed off --out "$d/validation_calibrated_no_probe"
  echo "== $d validation_calibrated_probe_cost_ignored"; $V $runs --artifact "$cal" --host-speed probes --ignore-probe-cost \
    --out "$d/validation_calibrated_probe_cost_ignored"
  echo "== $d validation_measured"; $V $runs --step-times measured --out "$d/validation_measured"
}
for w in A B; do
  one $D/calibrated_h200.json $D/$w $D/$w/independent $D/$w/mlora $D/$w/tlora 2>&1 | tee $D/$w-validation.log
done
{ one $D/machine2/calibrated_h200_m2.json $D/machine2/A $D/machine2/A/mlora
  echo "== $D/machine2/A validation_machine1_calibration"
  $V $D/machine2/A/mlora --artifact $D/calibrated_h200.json --host-speed probes \
    --out $D/machine2/A/validation_machine1_calibration; } 2>&1 | tee $D/machine2/A-validation.log
