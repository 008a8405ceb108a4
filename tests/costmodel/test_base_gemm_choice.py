"""bench/base_gemm.py's choice rule: our GEMM from the smallest measured token count at which it
is faster at that count and every larger one, else cuBLAS (synthetic timings, no GPU)."""
from __future__ import annotations

import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


def test_rechoosing_from_a_csv_rewrites_only_that_gpus_entries(tmp_path):
    """``--from-csv`` (no GPU): the rows an earlier run wrote, chosen again with another margin,
    replace that GPU's entries and keep the table's other GPUs and the run's provenance."""
    rows = _rows("fwd", {2048: 0.995, 16384: 0.993})
    path = tmp_path / "rows.csv"
    with open(path, "w", newline="") as f:
        w = base_gemm.csv.DictWriter(f, fieldnames=["kind", "pass_", "K", "N", "M", "impl",
                                                    "config", "ms", "ref_ms"])
        w.writeheader()
        w.writerows(rows)
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"gpus": {"G": {}, "other": {"x": 1}},
                                 "provenance": {"G": {"commit": "abc"}}}))
    base_gemm.main(["--from-csv", str(path), "--gpu", "G", "--table", str(table)])
    t = json.loads(table.read_text())
    assert t["gpus"]["G"]["fwd|64|32"]["impl"] == "cublas"          # 1% margin: not faster
    base_gemm.main(["--from-csv", str(path), "--gpu", "G", "--table", str(table), "--margin", "0"])
    t = json.loads(table.read_text())
    assert t["gpus"]["G"]["fwd|64|32"]["impl"] == "triton"
    assert t["gpus"]["G"]["fwd|64|32"]["min_tokens"] == 2048
    assert t["gpus"]["other"] == {"x": 1} and t["provenance"]["G"]["commit"] == "abc"
    assert "--margin 0.0" in t["provenance"]["G"]["rechosen"]
