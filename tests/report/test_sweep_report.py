"""``tlora-sim sweep report DIR`` and ``plot DIR`` on a sweep: means and 95% intervals over seeds;
the example sweep and LoRA distribution files in docs/examples parse."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

from tlora_sim.sim.experiments.sweep_file import load_sweep
from tlora_sim.traces.lora import load_distribution

ROOT = Path(__file__).resolve().parents[2]
EXE = [sys.executable, "-m", "tlora_sim.sim.cli.main"]


def test_examples_parse():
    sweep = load_sweep(ROOT / "docs" / "examples" / "sweep.toml")
    assert len(sweep.cells) == 9
    dist = load_distribution(str(ROOT / "docs" / "examples" / "lora_70b.json"))
    assert "llama3-70b" in dist.models


def test_sweep_report_aggregates_seeds(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('traces = ["synthetic:jobs=30"]\nclusters = ["1x8xH100"]\n'
                 'policies = ["independent", "independent-backfill"]\nseeds = [0, 1, 2]\n')
    out = tmp_path / "sw"
    r = subprocess.run([*EXE, "sweep", str(f), "--out", str(out), "--workers", "1", "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*EXE, "sweep", "report", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rep = pd.read_csv(out / "report.csv")
    cells = pd.read_csv(out / "sweep.csv")
    assert list(rep.policy) == list(dict.fromkeys(cells.sort_values("cell_id").policy)) or set(rep.policy) == {
        "independent", "independent-backfill"}
    assert (rep.seeds == 3).all() and "avg_jct_s_ci95" in rep.columns
    ind = cells[cells.policy == "independent"].avg_jct_s
    assert rep[rep.policy == "independent"].avg_jct_s.iloc[0] == ind.mean()
    assert ind.nunique() == 3  # a seed redraws the synthetic trace too
    assert (out / "figures" / "report_avg_jct.png").is_file()
    r = subprocess.run([*EXE, "plot", str(out), "--format", "png"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "report_avg_jct.png" in r.stdout


def test_sweep_report_of_a_non_sweep_is_one_line(tmp_path):
    r = subprocess.run([*EXE, "sweep", "report", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "sweep.csv" in r.stderr and len(r.stderr.strip().splitlines()) == 1
