#!/usr/bin/env bash
# helper 29's device call (run from the new snapshot's root, .snap/h29; the old one at ../h29old):
# sanity (hang/exactness) -> bf16 check + A/B old vs new (bench/kernel_ab.sh) -> GPU tests
set -uo pipefail
W=/tmp/w29; mkdir -p $W
D=profiler/data/kernel_small4_h100_2026-11-27
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $W/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $W/device.txt
mkdir -p /tmp/nsl/tlora_sim; for p in sim policies traces profiler; do ln -sfn "$PWD/$p" /tmp/nsl/tlora_sim/$p; done
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/nsl:$PWD timeout ${TMOS:-150} python3 $D/gpu29_sanity.py 2>&1 | tee $W/sanity.txt
if ! grep -q "SANITY OK" $W/sanity.txt; then tar czf $OUT/w29.tgz -C $W .; exit 3; fi
[ -n "${CONFIGS:-}" ] || CONFIGS='[{}]'   # (not ${CONFIGS:-[{}]}: its first } ends the expansion)
CHECK=1 ROUNDS=${ROUNDS:-2} TMO=${TMO:-120} bash bench/kernel_ab.sh $W "$CASES" ../h29old \
  "$CONFIGS" 2>&1 | tee $W/ab_log.txt
tar czf $OUT/w29.tgz -C $W .
if [ -n "${XCONFIGS:-}" ]; then   # extra configurations of the new package only, own process
  PYTHONPATH=/tmp/nsl:$PWD timeout ${TMOX:-120} python3 bench/kernel_profile.py --precompile 14 --steps 3 \
    --cases "${XCASES:-$CASES}" --configs "$XCONFIGS" --dropout 0.1 --out $W/extra.json > $W/extra.txt 2>&1
  tail -12 $W/extra.txt
  tar czf $OUT/w29.tgz -C $W .
fi
if [ "${TESTS:-1}" = 1 ]; then
  PYTHONPATH=/tmp/nsl:$PWD timeout ${TMOT:-150} python3 -m pytest -q -rfEs -x -p no:cacheprovider --noconftest \
    tests/test_kernel_tiny.py > $W/tests.txt 2>&1; echo "tests rc $?" >> $W/tests.txt
  tail -5 $W/tests.txt
  tar czf $OUT/w29.tgz -C $W .
fi
