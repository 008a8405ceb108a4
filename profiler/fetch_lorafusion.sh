#!/usr/bin/env bash
# Copy LoRAFusion's multi-LoRA Triton kernels (github.com/CentML/lorafusion, Apache-2.0) out of a
# git mirror into .ext/lorafusion/ (never committed: /.ext/ is in .git/info/exclude), for the
# `lorafusion` plan of the profiler and of bench/kernels.py (profiler/kernels/lorafusion_ext.py).
#
# Usage: profiler/fetch_lorafusion.sh GIT_DIR [COMMIT] [DEST]
#   GIT_DIR  a clone or bare mirror of CentML/lorafusion (e.g. /work/.mirror/CentML+lorafusion/repo)
#   COMMIT   default HEAD of that mirror
#   DEST     default <repo root>/.ext/lorafusion
# The files keep their package layout (DEST/lorafusion/...), so DEST goes on sys.path; the commit
# sha is written to DEST/SOURCE_SHA and ends up in every profile row's implementation string.
# Only the kernels and the modules they need are copied (README.md for the licence note;
# lorafusion/utils/benchmark.py and testing.py, which only the kernels' __main__ demos use and
# which pull in tabulate/tqdm/mypy_extensions, are stubbed by the adapter instead); lorafusion/ops/multi_lora.py (their
# Python wrapper, which imports Megatron) is copied for reference only and is not imported.
set -euo pipefail
GIT_DIR=${1:?usage: fetch_lorafusion.sh GIT_DIR [COMMIT] [DEST]}
COMMIT=${2:-HEAD}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${3:-$ROOT/.ext/lorafusion}
SHA=$(git --git-dir="$GIT_DIR" rev-parse "$COMMIT^{commit}")
FILES=(
  README.md
  lorafusion/__init__.py
  lorafusion/ops/__init__.py
  lorafusion/ops/multi_lora.py
  lorafusion/ops/triton_ops/__init__.py
  lorafusion/ops/triton_ops/config.py
  lorafusion/ops/triton_ops/utils.py
  lorafusion/ops/triton_ops/dropout.py
  lorafusion/ops/triton_ops/blocked_dropout.py
  lorafusion/ops/triton_ops/fused_multi_lora_xw_sb.py
  lorafusion/ops/triton_ops/fused_multi_lora_dys_dyb.py
  lorafusion/ops/triton_ops/fused_multi_lora_dyw_dsa.py
  lorafusion/utils/__init__.py
  lorafusion/utils/common.py
)
rm -rf "$DEST"
mkdir -p "$DEST"
for f in "${FILES[@]}"; do
  if git --git-dir="$GIT_DIR" cat-file -e "$SHA:$f" 2>/dev/null; then
    mkdir -p "$DEST/$(dirname "$f")"
    git --git-dir="$GIT_DIR" show "$SHA:$f" > "$DEST/$f"
  else
    echo "fetch_lorafusion: $f not in $SHA (skipped)" >&2
  fi
done
echo "$SHA" > "$DEST/SOURCE_SHA"
EXCL="$(git -C "$ROOT" rev-parse --git-common-dir 2>/dev/null || true)"
if [ -n "$EXCL" ]; then
  case "$EXCL" in /*) ;; *) EXCL="$ROOT/$EXCL" ;; esac
  mkdir -p "$EXCL/info"
  grep -qxF '/.ext/' "$EXCL/info/exclude" 2>/dev/null || echo '/.ext/' >> "$EXCL/info/exclude"
fi
echo "LoRAFusion ${SHA:0:12} -> $DEST"
