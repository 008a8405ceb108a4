"""bench/base_gemm.py's choice rule: our GEMM from the smallest measured token count at which it
is faster at that count and every larger one, else cuBLAS (synthetic timings, no GPU)."""
from __future__ import annotations

import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("base_gemm", os.path.join(ROOT, "bench", "base_gemm.py"))
base_gemm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base_gemm)


def _rows(pas, ratios, cfg=None):
    cfg = json.dumps(cfg or {"bm": 128, "bn": 128, "bk": 64})
    out = []
    for M, r in ratios.items():
        out.append(dict(kind="step", pass_=pas, K=64, N=32, M=M, impl="triton", config=cfg,
                        ms=r, ref_ms=1.0))
        out.append(dict(kind="base", pass_=pas, K=64, N=32, M=M, impl="cublas", config="", ms=1.0))
        out.append(dict(kind="base", pass_=pas, K=64, N=32, M=M, impl="triton", config=cfg, ms=1.1))
    return out


def test_wins_from_the_smallest_count_after_which_it_always_wins():
    rows = _rows("fwd", {2048: 0.95, 4096: 1.02, 8192: 0.97, 16384: 0.9})
    e = base_gemm.choose(rows, 0.01)["fwd|64|32"]
    assert e["impl"] == "triton" and e["min_tokens"] == 8192
    assert e["base_gemm_vs_cublas"] == 1.1 and e["step_ratio_by_tokens"]["4096"] == 1.02


def test_cublas_keeps_a_shape_it_wins_at_the_largest_count():
    rows = _rows("bwd", {2048: 0.8, 8192: 0.9, 16384: 0.995})
    e = base_gemm.choose(rows, 0.01)["bwd|64|32"]
    assert e["impl"] == "cublas" and "cuBLAS" in e["why"]
    assert base_gemm.choose(rows, 0.0)["bwd|64|32"]["min_tokens"] == 2048
