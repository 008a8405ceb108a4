#!/usr/bin/env bash
# Session 21's device call for KernelConfig.overlap, which exists only at commit c675a2f (measured,
# not kept): run from a snapshot of that commit (git archive c675a2f | tar -x -C .snap/ov):
# GPU tests of the overlapped path, then per-launch profiles and graph-timed steps of the
# default path against overlap with 0 / 16 / 32 SMs held back from cuBLAS (CONFIGS).
# Env: CASES (layer:mix list), CONFIGS (JSON list, default below), TMOT, TMO (seconds).
set -uo pipefail
W=${OUT:?}/ov; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $W/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, hasattr(torch._C, '_set_sm_carveout_experimental'))" | tee -a $W/device.txt
mkdir -p /tmp/nso/tlora_sim; for p in sim policies traces profiler; do ln -sfn "$PWD/$p" /tmp/nso/tlora_sim/$p; done
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/nso:$PWD
timeout ${TMOT:-200} python3 -m pytest -q -rfEs -x -p no:cacheprovider --noconftest \
  tests/test_kernel_overlap.py > $W/tests.txt 2>&1; echo "tests rc $?" >> $W/tests.txt
tail -4 $W/tests.txt
[ -n "${CONFIGS:-}" ] || CONFIGS='[{}, {"overlap": 0}, {"overlap": 16}, {"overlap": 32}]'
timeout ${TMO:-420} python3 bench/kernel_profile.py --precompile 14 --steps 3 \
  --cases "$CASES" --configs "$CONFIGS" --dropout 0.1 --out $W/profile.json > $W/profile.txt 2>&1
echo "profile rc $?"
sed -n '/step GPU time \/ base/,$p' $W/profile.txt | head -60
