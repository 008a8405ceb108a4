#!/usr/bin/env bash
# Issue 43's GPU session on one H200, in a few device calls: calibrate the step model on this
# machine, then execute the two validation workloads with the calibrated artifact, one or more
# policies per call. Everything lands in WORK (default /tmp/v) and, after every step, in one
# tarball OUT/session.tgz (the device tool returns at most 8 files), plus OUT/session.log.
#
#   bash profiler/validation/h200_session.sh OUT STEP [STEP ...]
#
# STEP: calibrate            costmodel calibrate --gpu-name auto (BUDGET_S, default 150 s) -> CAL_NAME.json
#                            (default calibrated_h200; CAL_NAME=calibrated_h200_end for a second one later)
#       A:POLICY[,POLICY]    workload A: ITP cluster02, the first 24 one-GPU jobs,
#                            profiler/validation/lora_validation.json, --time-scale 300, 5-50 steps
#       validate:W           validate-run W's runs with the shipped artifact, the calibrated one (CAL_NAME)
#                            with the host speed of the runs' probes (validation_calibrated), without
#                            (validation_calibrated_no_probe) and without charging the probes' own time
#                            (validation_calibrated_probe_cost_ignored), and with their measured steps
#                            (profiler/validation/validations.sh)
#                            (CPU only: run it here or on any machine, WORK=the unpacked session)
#       B:POLICY[,POLICY]    workload B: ITP cluster03 (B_TRACE), the first B_JOBS (12) one-GPU jobs,
#                            --lora-dist tlora (llama3-8b and qwen3-8b, ranks 2-16, 1-8 sequences of
#                            512-2048 tokens), --time-scale B_SCALE (300), 5-B_MAX (30) steps
# The executions plan with ARTIFACT (default "shipped": the shipped H200 artifact, so that every
# policy of a workload runs the same jobs and steps whatever a calibration gave; a file otherwise). Validation (validate-run, CPU only) runs afterwards on any machine: see
# profiler/data/validation/README.md.
# Traces: ../shared/traces/msr-itp-elasticflow/ if present, else .device_carry/ (carry it); simpy
# (the one dependency the device image lacks) installs from .device_carry/wheels/.
set -u
OUT=${1:?usage: h200_session.sh OUT STEP...}; shift
WORK=${WORK:-/tmp/v}
mkdir -p "$OUT" "$WORK" /tmp/ns/tlora_sim
for p in sim policies traces profiler; do ln -sfn "$PWD/$p" /tmp/ns/tlora_sim/$p; done
export PYTHONPATH=/tmp/ns:/tmp/pydeps:$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export TRITON_CACHE_DIR=$PWD/.triton_cache  # ignored: kept between calls on a warm machine (no recompiles)
python3 -c "import pandas, simpy, tqdm, scipy" 2>/dev/null || pip install -q --no-index --no-deps \
  --find-links .device_carry/wheels --target /tmp/pydeps simpy >>"$WORK/pip.log" 2>&1
CLI="python3 -m tlora_sim.sim.cli.main"
DEV=(--device "${DEVICE:-cuda}"); [ -n "${TINY:-}" ] && DEV+=(--tiny)  # DEVICE=cpu TINY=1: a dry run of this script
trace() { local f=../shared/traces/msr-itp-elasticflow/$1; [ -f "$f" ] || f=.device_carry/$1; echo "itp:$f"; }
LOG=$OUT/session.log
save() { tar czf "$OUT/session.tgz.tmp" -C "$WORK" --exclude='*.tmp' . && mv "$OUT/session.tgz.tmp" "$OUT/session.tgz"; }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,uuid --format=csv; hostname
  python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])"
  grep -m1 'model name' /proc/cpuinfo; nproc
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ local changes)')"
  date -u +%FT%TZ
} >> "$WORK/device.txt" 2>&1
cat "$WORK/device.txt" >> "$LOG"
run() { echo "$*" >> "$WORK/commands.txt"; "$@"; }
for step in "$@"; do
  t0=$(date +%s)
  case $step in
    calibrate)
      cal=${CAL_NAME:-calibrated_h200}
      run $CLI costmodel calibrate --gpu-name "${GPU_NAME:-auto}" "${DEV[@]}" --out "$WORK/$cal.json" --force \
        --budget-s "${BUDGET_S:-150}" --points-out "$WORK/${cal}_points.csv" > "$WORK/$cal.log" 2>&1
      echo "calibrate rc=$? $(( $(date +%s) - t0 )) s" >> "$LOG"; tail -6 "$WORK/$cal.log" >> "$LOG" ;;
    A:*|B:*)
      w=${step%%:*}; pols=${step#*:}
      art=${ARTIFACT:-shipped}
      aopt=(); [ "$art" != shipped ] && aopt=(--artifact "$art")
      if [ "$w" = A ]; then
        wopt=(--trace "$(trace cluster02.csv.gz)" --lora-dist profiler/validation/lora_validation.json
              --time-scale 300 --jobs 24 --min-steps 5 --max-steps 50 --seed 0)
      else
        wopt=(--trace "$(trace "${B_TRACE:-cluster03.csv.gz}")" --lora-dist tlora --time-scale "${B_SCALE:-300}"
              --jobs "${B_JOBS:-12}" --min-steps 5 --max-steps "${B_MAX:-30}" --seed 0)
      fi
      for pol in ${pols//,/ }; do
        t1=$(date +%s)
        run $CLI execute "${wopt[@]}" "${aopt[@]}" --policy "$pol" --gpus 1 "${DEV[@]}" \
          --out "$WORK/$w/$pol" --force --no-progress --no-plots > "$WORK/$w-$pol.log" 2>&1
        echo "$w $pol rc=$? $(( $(date +%s) - t1 )) s" >> "$LOG"; tail -2 "$WORK/$w-$pol.log" >> "$LOG"
        save
      done ;;
    validate:*)  # on any machine: validate-run with the shipped and the calibrated artifact, and measured steps
      w=${step#*:}; dirs=$(for pol in independent mlora tlora; do [ -f "$WORK/$w/$pol/summary.json" ] && echo "$WORK/$w/$pol"; done)
      CLI="$CLI" run bash profiler/validation/validations.sh "$WORK/${CAL_NAME:-calibrated_h200}.json" "$WORK/$w" $dirs \
        > "$WORK/$w-validation.log" 2>&1
      echo "$w validation rc=$?" >> "$LOG"; grep -E "^ *(independent|mlora|tlora) |ranking" "$WORK/$w-validation.log" >> "$LOG" ;;
    *) echo "unknown step $step" >> "$LOG" ;;
  esac
  save
done
cat "$LOG"
