#!/usr/bin/env bash
# The validations of the second 2026-12-02 H200 validation (PLAN.md), CPU only, from the repository
# root: bash profiler/data/validation/h200_2026-12-02b/validate.sh
# Machine 1 (this directory: A and B) and machine 2 (machine2/: B), each with its own calibration
# (of record: validation_calibrated), and beside: shipped artifact, no probes, probes' cost ignored,
# measured steps, the "split host" refit (split_host.py), and for machine 2 machine 1's calibration.
set -eu
D=profiler/data/validation/h200_2026-12-02b
V="python -m tlora_sim.sim.cli.main validate-run --force --no-progress"
one() {  # one() DIR CAL: the validations of DIR's runs, then the "split host" refit's
  local d=$1 cal=$2 runs="$1/independent $1/mlora $1/tlora"
  bash profiler/validation/validations.sh "$cal" "$d" $runs
  echo "== $d validation_split_host"; $V $runs --artifact "${cal%.json}_split.json" --host-speed probes --out "$d/validation_split_host"
}
one $D/A $D/calibrated_h200.json 2>&1 | tee $D/A-validation.log
one $D/B $D/calibrated_h200.json 2>&1 | tee $D/B-validation.log
{ one $D/machine2/B $D/machine2/calibrated_h200_m2.json
  echo "== $D/machine2/B validation_machine1_calibration"
  $V $D/machine2/B/independent $D/machine2/B/mlora $D/machine2/B/tlora --artifact $D/calibrated_h200.json --host-speed probes \
    --out $D/machine2/B/validation_machine1_calibration; } 2>&1 | tee $D/machine2/B-validation.log
