"""``bench/kernel_summary.py`` as a command: it reads a committed kernel benchmark CSV and gives the
targets computed from the rows themselves."""

from __future__ import annotations

import csv
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "profiler" / "data" / "kernel_bench_h100_2026-11-25-b.csv"


def test_the_command_summarises_a_committed_run(tmp_path):
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "kernel_summary.py"), str(CSV), "--json", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    import json

    got = json.loads(out.read_text())
    # fused (the first configuration) over the frozen base layer, per (layer, mix), from the CSV directly
    rows = list(csv.DictReader(CSV.open()))
    ms = {(x["layer"], x["mix"], x["impl"]): float(x["ms"]) for x in rows}
    ratios = [ms[k[0], k[1], "fused#0"] / ms[k] for k in ms if k[2] == "base" and (k[0], k[1], "fused#0") in ms]
    assert len(got["mixes"]) == len(ratios) > 20
    assert abs(got["targets"]["median_fused_ratio"] - statistics.median(ratios)) < 1e-12
    assert "targets:" in r.stdout


def test_a_file_that_is_not_a_benchmark_csv_is_named(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "kernel_summary.py"), str(bad)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode != 0 and "x.csv" in r.stderr and "missing" in r.stderr
