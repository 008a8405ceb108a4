"""Issue 43 item 5, the H200 row of profiler/data/base_gemm.json: the device run's CSV (the shape
``profiler/validation/h200_item5.sh`` writes through bench/base_gemm.py, synthetic timings here)
re-chosen with ``--from-csv`` into a copy of the shipped table keeps the H100 entries byte for byte
and takes the device run's provenance with ``--provenance-from``."""
from __future__ import annotations

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("base_gemm", os.path.join(ROOT, "bench", "base_gemm.py"))
base_gemm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base_gemm)
TABLE = os.path.join(ROOT, "profiler", "data", "base_gemm.json")
H100 = "NVIDIA H100 80GB HBM3"
H200_LAYERS = ("4096x4096", "4096x1024", "4096x14336", "14336x4096", "4096x12288", "12288x4096")
CFG = {"bm": 128, "bn": 256, "bk": 64, "warps": 8, "stages": 3, "persistent": True, "split": 2, "lora_first": True}


def _csv(path):
    """Rows as the device run writes them: ours 3% faster from 8192 tokens on the 4096-wide output
    shapes' forward, slower everywhere else."""
    rows = []
    for lay in H200_LAYERS:
        K, N = base_gemm.LAYERS[lay]
        for M in (2048, 8192, 16384):
            for pas in ("fwd", "bwd"):
                rows.append(dict(kind="base", pass_=pas, K=K, N=N, M=M, impl="cublas", config="", ms=1.0, ref_ms=""))
                rows.append(dict(kind="base", pass_=pas, K=K, N=N, M=M, impl="triton", config=json.dumps(CFG),
                                 ms=1.02, ref_ms=""))
                fast = pas == "fwd" and N == 4096 and M >= 8192
                rows.append(dict(kind="step", pass_=pas, K=K, N=N, M=M, impl="triton", config=json.dumps(CFG),
                                 ms=0.97 if fast else 1.01, ref_ms=1.0))
    base_gemm.write_csv(str(path), rows)


def test_h200_row_from_the_device_csv_keeps_the_h100_bytes(tmp_path, capsys):
    if not os.path.exists(TABLE):
        pytest.skip("no shipped base_gemm.json")
    original = open(TABLE).read()
    table, dev = tmp_path / "base_gemm.json", tmp_path / "device_table.json"
    table.write_text(original)
    dev.write_text(json.dumps({"gpus": {}, "provenance": {"NVIDIA H200": {"date": "2026-12-01", "torch": "2.11.0"}}}))
    csvp = tmp_path / "base_gemm_h200.csv"
    _csv(csvp)
    base_gemm.main(["--from-csv", str(csvp), "--margin", "0", "--gpu", "NVIDIA H200", "--provenance-from", str(dev),
                    "--table", str(table)])
    t = json.loads(table.read_text())
    h200 = t["gpus"]["NVIDIA H200"]
    assert len(h200) == 2 * len(H200_LAYERS)
    chosen = sorted(k for k, e in h200.items() if e["impl"] == "triton")
    assert chosen == ["fwd|12288|4096", "fwd|14336|4096", "fwd|4096|4096"]
    assert all(h200[k]["min_tokens"] == 8192 for k in chosen)
    assert t["provenance"]["NVIDIA H200"]["torch"] == "2.11.0" and "--margin 0.0" in t["provenance"]["NVIDIA H200"]["rechosen"]
    del t["gpus"]["NVIDIA H200"], t["provenance"]["NVIDIA H200"]
    before = json.loads(original)  # the shipped table holds the device run's H200 row (2026-12-01): set aside
    before["gpus"].pop("NVIDIA H200", None), before.get("provenance", {}).pop("NVIDIA H200", None)
    assert json.dumps(t, indent=1, sort_keys=True) == json.dumps(before, indent=1, sort_keys=True)  # H100 untouched
    assert json.loads(original)["gpus"][H100] == t["gpus"][H100]


def test_dry_run_checks_layers_and_configs(capsys):
    pytest.importorskip("triton", reason="the dry run imports what the GPU run imports (triton)")
    base_gemm.main(["--layers", ",".join(H200_LAYERS), "--configs", json.dumps([CFG]), "--tokens", "2048,16384",
                    "--dry-run"])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(H200_LAYERS) and out[1].startswith("4096x1024 (4096, 1024): M [2048, 16384], 1 configs")
    with pytest.raises(SystemExit):
        base_gemm.main(["--layers", "4096x999", "--dry-run"])
    with pytest.raises(TypeError):
        base_gemm.main(["--configs", json.dumps([{"bm": 128, "nope": 1}]), "--dry-run"])


def test_failed_step_timings_leave_the_shape_to_cublas(tmp_path):
    """A configuration that fails on a shape is timed NaN (``_step_or_nan``); ``choose`` keeps the
    measured token counts, and a shape with no step timing left is not in the table (cuBLAS)."""
    path = tmp_path / "rows.csv"
    _csv(path)
    rows = base_gemm.read_rows(str(path))
    for r in rows:
        if r["kind"] == "step" and (r["K"], r["N"]) == (4096, 1024):
            r["ms"] = float("nan")
        if r["kind"] == "step" and (r["pass_"], r["K"], r["N"], r["M"]) == ("fwd", 4096, 4096, 2048):
            r["ref_ms"] = float("nan")
    base_gemm.write_csv(str(path), rows)
    e = base_gemm.choose(base_gemm.read_rows(str(path)), 0.0)
    assert "fwd|4096|1024" not in e and "bwd|4096|1024" not in e and len(e) == 2 * len(H200_LAYERS) - 2
    assert e["fwd|4096|4096"]["impl"] == "triton" and set(e["fwd|4096|4096"]["step_ratio_by_tokens"]) == {"8192", "16384"}
