#!/usr/bin/env bash
# Issue 19's GPU measurements, in the order they depend on each other (one GPU, repository root).
#   bash bench/kernels_gpu.sh gemm  OUT   # 1. bf16 check of the epilogue GEMM path, then the
#                                         #    cuBLAS-or-ours table (profiler/data/base_gemm.json)
#   bash bench/kernels_gpu.sh bench OUT   # 2. the kernel benchmark, auto choice vs cuBLAS only
#   bash bench/kernels_gpu.sh all OUT     # 1 then 2 (a shorter benchmark budget), one call
set -euo pipefail
what=${1:?gemm or bench}; out=${2:?output folder}
mkdir -p "$out" /tmp/ns/tlora_sim
# no install there: the package goes on PYTHONPATH under the tlora_sim namespace
for p in sim policies traces profiler; do ln -sfn "$PWD/$p" /tmp/ns/tlora_sim/$p; done
export PYTHONPATH=/tmp/ns:$PWD
export PYTHONUNBUFFERED=1 TLORA_GIT_COMMIT=${TLORA_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
case "$what" in
  gemm)
    TLORA_KCFG='{"base_gemm":"triton"}' python3 bench/kernels.py --check --impls base,fused \
      --layers 4096x4096 --mixes 8-64 --replays 5 --precompile 0 --out "$out/check_triton.csv"
    python3 bench/base_gemm.py --tokens 2048,8192,16384 --csv "$out/base_gemm.csv" \
      --table profiler/data/base_gemm.json
    cp profiler/data/base_gemm.json "$out/" ;;
  all)
    bash "$0" gemm "$out"
    python3 bench/kernels.py --check --replays 20 --budget-s 330 \
      --configs '[{}, {"base_gemm": "cublas"}]' \
      --out "$out/kernel_bench.csv" --summary "$out/summary.json" ;;
  bench)
    python3 bench/kernels.py --check --replays 20 --budget-s 490 \
      --configs '[{}, {"base_gemm": "cublas"}]' \
      --out "$out/kernel_bench.csv" --summary "$out/summary.json" ;;
  *) echo "unknown step $what" >&2; exit 2 ;;
esac
