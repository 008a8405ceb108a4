#!/usr/bin/env bash
# Execute a scaled-down ITP cluster02 workload for real under each policy, then replay it in the
# simulator (tlora-sim validate-run). Usage: profiler/validation/run.sh OUT [POLICY ...]
# On the GPU machine the package is put on PYTHONPATH under the tlora_sim namespace; missing
# pure-data dependencies (pandas, simpy) install from .device_carry/wheels/ (carried) when present (no network).
set -u
OUT=${1:?usage: run.sh OUT [POLICY ...]}; shift
POLICIES=${*:-independent mlora tlora}
TRACE=${TRACE:-itp:../shared/traces/msr-itp-elasticflow/cluster02.csv.gz}
[ -f "${TRACE#itp:}" ] || TRACE=itp:.device_carry/cluster02.csv.gz

mkdir -p "$OUT" /tmp/ns/tlora_sim
for p in sim policies traces profiler; do ln -sfn "$PWD/$p" /tmp/ns/tlora_sim/$p; done
export PYTHONPATH=/tmp/ns:/tmp/pydeps:$PWD
python3 -c "import pandas, simpy" 2>/dev/null || pip install -q --no-index --find-links .device_carry/wheels --target /tmp/pydeps pandas simpy tqdm >"$OUT/pip.log" 2>&1
CLI="python3 -m tlora_sim.sim.cli.main"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$OUT/device.txt" 2>&1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
for pol in $POLICIES; do
  $CLI execute --trace "$TRACE" --policy "$pol" --out "$OUT/$pol" --force --no-progress \
    --lora-dist profiler/validation/lora_validation.json --time-scale ${TIME_SCALE:-300} --jobs ${JOBS:-24} \
    --min-steps 5 --max-steps ${MAX_STEPS:-60} > "$OUT/$pol.log" 2>&1
  echo "$pol rc=$?"; tail -2 "$OUT/$pol.log"
done
$CLI validate-run $(for pol in $POLICIES; do [ -f "$OUT/$pol/summary.json" ] && echo "$OUT/$pol"; done) --out "$OUT/validation" --force > "$OUT/validation.log" 2>&1
tail -6 "$OUT/validation.log"
