#!/usr/bin/env bash
# End-to-end validation on one GPU (or GPUS=2 on two GPUs of one host): execute a scaled-down ITP
# cluster02 workload for real under each policy (tlora-sim execute), then replay it in the simulator
# (tlora-sim validate-run), everything under OUT. Usage:
#
#   bash profiler/validation/run.sh OUT [POLICY ...]          # default: independent mlora tlora
#   GPUS=2 bash profiler/validation/run.sh OUT tlora mlora independent   # two GPUs, one worker each
#
# Environment (defaults are the committed runs' of record, profiler/data/validation/h100/):
#   TRACE=itp:PATH     the trace (default ../shared/traces/msr-itp-elasticflow/cluster02.csv.gz, else
#                      .device_carry/cluster02.csv.gz)
#   TIME_SCALE=300 JOBS=24 MIN_STEPS=5 MAX_STEPS=50 SEED=0   the workload (docs/executor.md)
#   GPUS=2             two GPUs: one worker process per GPU (NCCL, NVLink multicast off), jobs that ask
#                      for at most 2 GPUs; SKIP_JOBS (default 2226 with GPUS=2, else 0) passes over that
#                      many of them, so cluster02's first 24 then are 12 one-GPU and 12 two-GPU jobs
#   DEVICE=cpu EXTRA="--tiny"   a smoke test of this script on a CPU (seconds with JOBS=6 MAX_STEPS=3;
#                      with GPUS=2 add --processes to EXTRA for the gloo worker processes)
#   SKIP_VALIDATE=1    execute only (run the policies in separate calls, then once more with no
#                      policy left to run: an existing OUT/<policy>/summary.json is kept)
#
# Each policy takes 2-3 minutes of clock plus model set-up and warm-up on an H100 (24 jobs, a queue
# and regroups); a device call has a 10-minute limit, so run one or two policies per call.
# Torch 2.11 / triton 3.6, no network: the package goes on PYTHONPATH under the tlora_sim
# namespace; missing pure-data dependencies (pandas, simpy, tqdm) install from
# .device_carry/wheels/ when present. Figures need matplotlib: the runs skip theirs (tlora-sim plot
# DIR draws them later), and validate-run, which draws one, can be re-run on any machine. Writes OUT/device.txt (GPU, driver, versions, commit),
# OUT/commands.txt (every command, exactly), OUT/<policy>/ (the run directory) and OUT/<policy>.log,
# OUT/validation/ (profiled step times: the validation) and OUT/validation_measured/ (the runs' own
# step times: how much of the error is the step model's).
set -u
OUT=${1:?usage: run.sh OUT [POLICY ...]}; shift
POLICIES=${*:-independent mlora tlora}
TRACE=${TRACE:-itp:../shared/traces/msr-itp-elasticflow/cluster02.csv.gz}
[ -f "${TRACE#itp:}" ] || TRACE=itp:.device_carry/cluster02.csv.gz
TIME_SCALE=${TIME_SCALE:-300} JOBS=${JOBS:-24} MIN_STEPS=${MIN_STEPS:-5} MAX_STEPS=${MAX_STEPS:-50} SEED=${SEED:-0}
DEVICE=${DEVICE:-cuda} EXTRA=${EXTRA:-} GPUS=${GPUS:-1}
if [ "$GPUS" -gt 1 ]; then SKIP_JOBS=${SKIP_JOBS:-2226}; else SKIP_JOBS=${SKIP_JOBS:-0}; fi
# never NVLink multicast (docs/executor.md); the executor sets these in its workers too
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

mkdir -p "$OUT" /tmp/ns/tlora_sim
for p in sim policies traces profiler; do ln -sfn "$PWD/$p" /tmp/ns/tlora_sim/$p; done
export PYTHONPATH=/tmp/ns:/tmp/pydeps:$PWD
python3 -c "import pandas, simpy, tqdm" 2>/dev/null || pip install -q --no-index \
  --find-links .device_carry/wheels --target /tmp/pydeps pandas simpy tqdm >"$OUT/pip.log" 2>&1
CLI="python3 -m tlora_sim.sim.cli.main"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ local changes)')"
  date -u +%FT%TZ
} > "$OUT/device.txt" 2>&1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

run() { echo "$*" >> "$OUT/commands.txt"; "$@"; }
for pol in $POLICIES; do
  if [ -f "$OUT/$pol/summary.json" ]; then echo "$pol: kept $OUT/$pol"; continue; fi
  run $CLI execute --trace "$TRACE" --policy "$pol" --gpus "$GPUS" --device "$DEVICE" $EXTRA --out "$OUT/$pol" --force --no-progress --no-plots \
    --lora-dist profiler/validation/lora_validation.json --time-scale "$TIME_SCALE" --jobs "$JOBS" --skip-jobs "$SKIP_JOBS" \
    --min-steps "$MIN_STEPS" --max-steps "$MAX_STEPS" --seed "$SEED" > "$OUT/$pol.log" 2>&1
  echo "$pol rc=$?"; tail -2 "$OUT/$pol.log"
done
[ "${SKIP_VALIDATE:-0}" = 1 ] && exit 0
DIRS=$(for pol in $POLICIES; do [ -f "$OUT/$pol/summary.json" ] && echo "$OUT/$pol"; done)
[ -n "$DIRS" ] || { echo "no finished run to validate"; exit 1; }
run $CLI validate-run $DIRS --out "$OUT/validation" --force --no-progress > "$OUT/validation.log" 2>&1 &&
run $CLI validate-run $DIRS --out "$OUT/validation_measured" --step-times measured --force --no-progress \
  > "$OUT/validation_measured.log" 2>&1 ||
  echo "validate-run failed here (see the logs; without matplotlib, run the two commands of commands.txt elsewhere)"
tail -6 "$OUT/validation.log" "$OUT/validation_measured.log" 2>/dev/null
