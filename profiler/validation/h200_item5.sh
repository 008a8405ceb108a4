#!/usr/bin/env bash
# Issue 43 item 5 on one H200, in one device call of about 5 minutes (every part capped):
#  (a) LoRAFusion's kernels with ONE adapter (jobs alone, as policies/lorafusion.py starts them),
#      beside the same points under `alone` and `fused` for reference, through the profiler that
#      made profiler/data/profile_h200.csv (python3 -m tlora_sim.profiler.profile, --quick timing):
#      llama3-8b and qwen3-8b, ranks LONE_RANKS x tokens LONE_TOKENS (sequences of min(T, 2048)),
#      mix rows only (--mixes-only: the component grids of the shipped H200 profile stay);
#  (b) bench/base_gemm.py over the linear shapes of those two models (H200 row of
#      profiler/data/base_gemm.json: our persistent GEMM vs cuBLAS per shape).
#
#   bash profiler/validation/h200_item5.sh OUT            # on the H200, from the repository root
#   bash profiler/validation/h200_item5.sh OUT --tiny     # CPU dry run (TRITON_INTERPRET=1), seconds
#
# Needs .ext/lorafusion (profiler/fetch_lorafusion.sh; carry it), torch + triton, pandas/numpy/scipy;
# simpy installs from .device_carry/wheels/ where missing (the profiler itself does not import it). Budget (seconds, env): PROFILE_BUDGET_S
# (170: the profiler stops starting mixes after it), PROFILE_TIMEOUT_S (260), BG_TIMEOUT_S (200),
# BG_TOKENS (2048,8192,16384), BG_CONFIGS (the persistent GEMM the H100 table chose everywhere).
# Writes (7 files, <= 2 folders deep): OUT/item5.log (every command and its output), OUT/device.txt
# (nvidia-smi, CPU, versions, commit), OUT/profile/profile_h200.csv + meta_h200.json (the rows),
# OUT/base_gemm_h200.csv (timings, rewritten per layer), OUT/base_gemm_h200.txt (the chosen table,
# printed), OUT/base_gemm.json (profiler/data/base_gemm.json with the H200 row merged in).
# Folding in (no GPU): profiler/COSTMODEL.md, "Jobs alone under LoRAFusion's kernels (issue 43 item 5)".
set -u
OUT=${1:?usage: h200_item5.sh OUT [--tiny]}
TINY=${2:-}
NS=${NS:-/tmp/ns}   # the tlora_sim namespace (links into this checkout); another NS for a dry run on a shared host
mkdir -p "$OUT/profile" "$NS/tlora_sim"
OUT=$(cd "$OUT" && pwd)
for p in sim policies traces profiler; do ln -sfn "$PWD/$p" "$NS/tlora_sim/$p"; done
export PYTHONPATH=$NS:/tmp/pydeps:$PWD PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
LOG=$OUT/item5.log
: > "$LOG"
say() { echo "[$(date -u +%T)] $*" | tee -a "$LOG"; }
run() { say "+ $*"; "$@" >> "$LOG" 2>&1; local rc=$?; say "rc=$rc"; return $rc; }
T0=$(date +%s)
[ -d .device_carry/wheels ] && ! python3 -c "import simpy" 2>/dev/null && run pip install -q --no-index --no-deps \
  --find-links .device_carry/wheels --target /tmp/pydeps simpy
if [ -z "${TLORA_GIT_COMMIT:-}" ]; then
  TLORA_GIT_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  git diff --quiet 2>/dev/null || TLORA_GIT_COMMIT="$TLORA_GIT_COMMIT+local"
fi
export TLORA_GIT_COMMIT
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || echo "no nvidia-smi"
  python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0], 'cuda', torch.version.cuda)"
  grep -m1 'model name' /proc/cpuinfo; echo "cpus $(nproc)"
  echo "commit $TLORA_GIT_COMMIT"
  echo "lorafusion $(cat .ext/lorafusion/SOURCE_SHA 2>/dev/null || echo ABSENT: carry .ext/lorafusion)"
  date -u +%FT%TZ
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt" >> "$LOG"
[ -f .ext/lorafusion/SOURCE_SHA ] || say "WARNING: .ext/lorafusion absent: no lorafusion rows (alone/fused and base_gemm still run)"

if [ "$TINY" = --tiny ]; then   # CPU dry run: tiny shapes through the same code paths
  export TRITON_INTERPRET=1
  PROF=(--device cpu --tiny --lone-ranks 16,32 --lone-tokens 16,32 --lone-seq 16)
else
  PROF=(--gpu-name auto --models llama3-8b,qwen3-8b --quick --budget-s "${PROFILE_BUDGET_S:-170}"
        --lone-ranks "${LONE_RANKS:-16,64,128}" --lone-tokens "${LONE_TOKENS:-512,1024,2048,4096,8192,16384}")
fi
# (a) jobs alone: alone, fused, lorafusion at every (model, rank, tokens); mix rows only
run timeout -k 10 "${PROFILE_TIMEOUT_S:-260}" python3 -m tlora_sim.profiler.profile "${PROF[@]}" --mixes-only \
  --plans alone,fused,lorafusion --out "$OUT/profile"
say "profile: $(( $(date +%s) - T0 )) s so far; rows by plan:"
python3 - "$OUT/profile" >> "$LOG" 2>&1 <<'EOF'
import csv, glob, sys, collections
for f in sorted(glob.glob(sys.argv[1] + "/profile_*.csv")):
    rows = list(csv.DictReader(open(f)))
    ok = collections.Counter((r["model"], r["plan"]) for r in rows if not r["error"])
    bad = collections.Counter((r["plan"], r["error"][:60]) for r in rows if r["error"])
    print(f, len(rows), "rows;", dict(ok), "errors:", dict(bad))
EOF

# (b) our GEMM vs cuBLAS on the H200, per shape of llama3-8b and qwen3-8b
cp profiler/data/base_gemm.json "$OUT/base_gemm.json"
BG_CONFIGS=${BG_CONFIGS:-'[{"bm":128,"bn":256,"bk":64,"warps":8,"stages":3,"persistent":true,"split":2,"lora_first":true}]'}
BG=(--layers 4096x4096,4096x1024,4096x14336,14336x4096,4096x12288,12288x4096 --tokens "${BG_TOKENS:-2048,8192,16384}"
    --configs "$BG_CONFIGS" --csv "$OUT/base_gemm_h200.csv" --table "$OUT/base_gemm.json")
if [ "$TINY" = --tiny ]; then   # the GPU half cannot run on the CPU: its arguments and imports are checked
  run python3 bench/base_gemm.py "${BG[@]}" --dry-run
else
  run timeout -k 10 "${BG_TIMEOUT_S:-200}" python3 bench/base_gemm.py "${BG[@]}"
fi
grep -E '^(fwd|bwd)\||M=|^[0-9]+x[0-9]+ ' "$LOG" > "$OUT/base_gemm_h200.txt" 2>/dev/null || true
say "done in $(( $(date +%s) - T0 )) s"
ls -la "$OUT" "$OUT/profile" >> "$LOG" 2>&1
