#!/usr/bin/env bash
# The validations of one workload's executed runs (issue 43), CPU only, from the repository root:
#
#   bash profiler/validation/validations.sh CAL DIR RUN [RUN ...]
#
# writes DIR/validation_<name>/ for each, with a "== DIR validation_<name>" line before its output:
#   calibrated (of record)         --artifact CAL --host-speed probes (the probes' cost charged)
#   shipped                        the shipped artifact of the runs' GPU type
#   calibrated_no_probe            --artifact CAL --host-speed off
#   calibrated_probe_cost_ignored  --artifact CAL --host-speed probes --ignore-probe-cost
#   measured                       --step-times measured (the runs' own steps)
# Where CAL is not a file, the three calibrated ones are left out. Used by h200_session.sh's
# validate:W step and by each validation directory's validate.sh (profiler/data/validation/).
set -eu
cal=${1:?usage: validations.sh CAL DIR RUN...} d=${2:?usage: validations.sh CAL DIR RUN...}; shift 2
V="${CLI:-python -m tlora_sim.sim.cli.main} validate-run --force --no-progress"
if [ -f "$cal" ]; then
  echo "== $d validation_calibrated (of record)"; $V "$@" --artifact "$cal" --host-speed probes --out "$d/validation_calibrated"
fi
echo "== $d validation_shipped"; $V "$@" --out "$d/validation_shipped"
if [ -f "$cal" ]; then
  echo "== $d validation_calibrated_no_probe"; $V "$@" --artifact "$cal" --host-speed off --out "$d/validation_calibrated_no_probe"
  echo "== $d validation_calibrated_probe_cost_ignored"; $V "$@" --artifact "$cal" --host-speed probes --ignore-probe-cost \
    --out "$d/validation_calibrated_probe_cost_ignored"
fi
echo "== $d validation_measured"; $V "$@" --step-times measured --out "$d/validation_measured"
