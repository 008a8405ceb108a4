#!/usr/bin/env bash
# Same-machine A/B of the fused kernels: an older commit's profiler package against the working
# tree's, each through bench/kernel_profile.py (per-launch GPU time), after a bf16 check of the
# working tree (two layers, ranks 1-256). Cross-machine comparisons of this benchmark move by up
# to 15% (profiler/KERNELS.md), so a change is judged on one machine.
#
# Here (the old package travels in an ignored folder named in `run`'s carry):
#   echo /.snap/ >> .git/info/exclude; mkdir -p .snap/old
#   git archive <commit> profiler | tar -x -C .snap/old
# There (repository root; carry .snap):
#   bash bench/kernel_ab.sh $OUT 4096x4096:128x2,4096x4096:64x8 [.snap/old] ['[{}, {"waves": 3}]']
# (the 4th argument: KernelConfig overrides timed for the working tree only, as --configs)
# ROUNDS=n repeats old then new n times (files old.json/new.json, then old_2.json, new_2.json,
# ...): on the wide layers the graph-timed step moved by 5% between the halves of one call
# (clocks), so alternating rounds show that spread; CHECK=0 skips the bf16 checks; TMO=s limits
# each profile run (default 240 s); DROPOUT=p the adapters' dropout (default 0.1).
set -uo pipefail
out=${1:?output folder}; cases=${2:?comma list of layer:mix}; old=${3:-.snap/old}
configs=${4:-'[{}]'}
mkdir -p "$out" /tmp/ns/tlora_sim /tmp/nso/tlora_sim
for p in sim policies traces profiler; do ln -sfn "$PWD/$p" /tmp/ns/tlora_sim/$p; done
for p in sim policies traces; do ln -sfn "$PWD/$p" /tmp/nso/tlora_sim/$p; done
ln -sfn "$PWD/$old/profiler" /tmp/nso/tlora_sim/profiler
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
# the check's mix has 886 tokens, so the default ("auto") runs cuBLAS there: it is repeated with
# our GEMM (the table's persistent configuration, session 16) for both passes, which the default
# takes from 2,048 tokens
P='{"bm": 128, "bn": 256, "bk": 64, "stages": 3, "warps": 8, "persistent": true, "split": 2, "lora_first": true}'
GEMMS="{\"base_gemm\": \"triton\", \"gemm_fwd\": $P, \"gemm_bwd\": $P}"
for kc in '{}' "$GEMMS"; do
  [ "${CHECK:-1}" = 0 ] || TLORA_KCFG=$kc PYTHONPATH=/tmp/ns:$PWD python3 bench/kernels.py --check \
    --impls base,fused --layers 4096x4096,4096x14336 --mixes small4 --replays 5 --precompile 0 \
    --out "$out/check.csv" 2>&1 | grep -E "^check|FAIL|Error" | head
done
for r in $(seq "${ROUNDS:-1}"); do
  sfx=; [ "$r" = 1 ] || sfx=_$r
  for v in old new; do
    root=/tmp/ns; cf=$configs; [ $v = old ] && root=/tmp/nso && cf='[{}]'
    PYTHONPATH=$root:$PWD timeout "${TMO:-240}" python3 bench/kernel_profile.py --precompile 14 --steps 3 \
      --cases "$cases" --configs "$cf" --dropout "${DROPOUT:-0.1}" --out "$out/$v$sfx.json" \
      > "$out/$v$sfx.txt" 2>&1
    tail -14 "$out/$v$sfx.txt"
  done
done
