#!/usr/bin/env bash
# helper 27's device call: A/B of the two-launch path (session 19), then wider cases, then tests
set -uo pipefail
W=/tmp/w27; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $W/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $W/device.txt
mkdir -p /tmp/ns/tlora_sim; for p in sim policies traces profiler; do ln -sfn "$PWD/$p" /tmp/ns/tlora_sim/$p; done
PYTHONPATH=/tmp/ns:$PWD timeout 90 python3 gpu27_sanity.py 2>&1 | tee $W/sanity.txt
if ! grep -q "SANITY OK" $W/sanity.txt; then tar czf $OUT/w27.tgz -C $W .; exit 3; fi
CHECK=1 ROUNDS=${ROUNDS:-2} TMO=${TMO:-150} bash bench/kernel_ab.sh $W "$CASES" ../h27old \
  '[{}, {"tiny_tokens": 0}]' 2>&1 | tee $W/ab_log.txt
tar czf $OUT/w27.tgz -C $W .
if [ "${EXTRA:-1}" = 1 ]; then
  PYTHONPATH=/tmp/ns:$PWD timeout ${TMO3:-120} python3 gpu27_extra.py > $W/extra.txt 2>&1
  tail -12 $W/extra.txt
  tar czf $OUT/w27.tgz -C $W .
fi
PYTHONPATH=/tmp/ns:$PWD timeout ${TMOT:-150} python3 -m pytest -q -x -p no:cacheprovider --noconftest \
  tests/test_kernel_tiny.py > $W/tests.txt 2>&1; echo "tests rc $?" >> $W/tests.txt
tail -5 $W/tests.txt
tar czf $OUT/w27.tgz -C $W .
