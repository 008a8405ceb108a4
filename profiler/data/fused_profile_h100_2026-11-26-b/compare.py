"""Shipped artifact (kernel tlora-triton@1176b682906b) vs refitted candidates on the fused profile of the
session-14 kernel (tlora-triton@29c022f722d9, 2026-11-26 09:50 UTC, commit 89a28ea); no torch, CPU:

    .venv/bin/python profiler/data/fused_profile_h100_2026-11-26-b/compare.py [--write-candidate DIR]

It runs ``../fused_profile_h100_2026-11-26/compare.py`` (the candidates, the held-out split, the
tables; see its docstring) with its H100 configuration changed, nothing else:
  before: commit 89a28ea, whose profile_h100.csv / costmodel_h100.json (h100-2026-11-26-6a14ebb6)
          this refit replaces (their fused mix rows: the 228 of ../fused_profile_h100_2026-11-26 and
          the 12 of ../fused_recheck_h100_e, kernel 1176b682906b, plus 9 older llama3-8b rows of
          21,504-24,576 tokens that 'replace+' keeps);
  new rows: the fused mix rows of this folder's profile_h100.csv only (no same-kernel recheck);
  never fitted by the candidates: ../fused_recheck_h100_d (kernel 61d430451deb) and
          ../fused_recheck_h100_e (kernel 1176b682906b; in the old artifact's fit).
The new mini-model pairs (kind model/stack) are not fitted, as before: the old pairs stay, so
call_overhead is unchanged. Output: compare_output.txt.
"""

import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("compare_2026_11_26", HERE.parent / "fused_profile_h100_2026-11-26" / "compare.py")
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)
base.CONFIG["H100"] = dict(before="89a28ea", add=(),
                           unfitted=(("d", "kernel @61d430451deb, before session 13; never fitted"),
                                     ("e", "kernel @1176b682906b; in the old artifact's fit")),
                           profile=HERE, label="2026-11-26 09:50, commit 89a28ea, kernel 29c022f722d9")

if __name__ == "__main__":
    base.main()
