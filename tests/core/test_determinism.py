"""Determinism: the same inputs and seed give byte-identical ``jobs.csv``, ``summary.json`` and
``timeline.csv`` - across repeated runs, fresh interpreters with different hash seeds, serial and
parallel ``compare`` - and a different seed changes the LoRA attributes (and only those)."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT
from tlora_sim.sim.experiments.replay import ReplayConfig, compare, replay

DETERMINISTIC = ("jobs.csv", "summary.json", "timeline.csv")
LORA_COLUMNS = ["model", "rank", "batch_size", "seq_len"]
TRACE_COLUMNS = ["job_id", "submit_time_s", "num_gpus", "trace_duration_s"]


def same_bytes(a: Path, b: Path, reliability) -> None:
    for name in DETERMINISTIC:
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{name} differs between {a} and {b}"
        reliability("determinism_cases")


@pytest.mark.parametrize("trace, cluster", [("synthetic:jobs=80,seed=5", "4x8xH100"),
                                            ("synthetic:jobs=50,seed=11,load=2.0", "2x8xA100")])
@pytest.mark.parametrize("policy", ["independent", "mlora", "tlora", "lorafusion", "lookahead", "tlora-nogroup"])
def test_repeated_replays_are_byte_identical(policy, trace, cluster, tmp_path, reliability):
    cfg = ReplayConfig(trace=trace, policy=policy, cluster=cluster, seed=3)
    replay(cfg, tmp_path / "a", progress=False, plots=False)
    replay(cfg, tmp_path / "b", progress=False, plots=False, check_invariants=False)
    same_bytes(tmp_path / "a", tmp_path / "b", reliability)


def test_replay_in_fresh_interpreters_with_different_hash_seeds(tmp_path, reliability):
    """String hashing (set and dict order of names) must not leak into results."""
    outs = []
    for hash_seed in ("1", "2", "random"):
        out = tmp_path / f"h{hash_seed}"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        r = subprocess.run([sys.executable, "-m", "tlora_sim.sim.cli.main", "replay", "--trace", "synthetic:jobs=60,seed=2",
                            "--cluster", "2x8xH100", "--policy", "tlora", "--seed", "7", "--out", str(out),
                            "--no-progress", "--no-plots"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        outs.append(out)
    same_bytes(outs[0], outs[1], reliability)
    same_bytes(outs[0], outs[2], reliability)


def test_compare_parallel_equals_serial_equals_single_replays(tmp_path, reliability):
    base = ReplayConfig(trace="synthetic:jobs=40,seed=4", policy="independent", cluster="2x8xH100", seed=1)
    policies = ["mlora", "tlora"]
    compare(base, policies, tmp_path / "par", workers=2, progress=False)
    compare(base, policies, tmp_path / "ser", workers=1, progress=False)
    import json

    from tlora_sim.sim.report.tables import SPEEDUP_COLUMNS

    for p in policies:  # a comparison's run is the single replay plus its speed-ups against the reference
        replay(ReplayConfig(**{**base.__dict__, "policy": p, "reference": "independent-backfill"}),
               tmp_path / "one" / p, progress=False, plots=False)
        same_bytes(tmp_path / "par" / p, tmp_path / "ser" / p, reliability)
        for name in DETERMINISTIC:
            a, b = tmp_path / "par" / p / name, tmp_path / "one" / p / name
            if name == "summary.json":
                drop = {*SPEEDUP_COLUMNS, "reference"}
                assert {k: v for k, v in json.loads(a.read_text()).items() if k not in drop} == json.loads(b.read_text())
            else:
                assert a.read_bytes() == b.read_bytes(), name
    assert filecmp.cmp(tmp_path / "par" / "summary.csv", tmp_path / "ser" / "summary.csv", shallow=False)
    reliability("determinism_cases")


@pytest.mark.parametrize("policy", ["independent", "tlora"])
def test_a_different_seed_changes_the_lora_attributes_only(policy, tmp_path):
    runs = {}
    for seed in (0, 1):
        out = tmp_path / str(seed)
        replay(ReplayConfig(trace="synthetic:jobs=60,seed=9", policy=policy, cluster="2x8xH100", seed=seed), out,
               progress=False, plots=False)
        runs[seed] = pd.read_csv(out / "jobs.csv").sort_values("job_id").reset_index(drop=True)
    a, b = runs[0], runs[1]
    pd.testing.assert_frame_equal(a[TRACE_COLUMNS], b[TRACE_COLUMNS])  # the trace stays real
    assert not a[LORA_COLUMNS].equals(b[LORA_COLUMNS])
    changed = (a[LORA_COLUMNS] != b[LORA_COLUMNS]).any(axis=1).mean()
    assert changed > 0.5  # most jobs draw different attributes


def test_seed_is_recorded_with_the_distribution(tmp_path):
    import json

    replay(ReplayConfig(trace="synthetic:jobs=10", policy="independent", seed=42), tmp_path, progress=False,
           plots=False)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["seed"] == 42 and config["inputs"]["seed"] == 42
    assert config["lora_distribution"]["name"] == "tlora"


@pytest.mark.slow
def test_ray_backend_gives_byte_identical_outputs_to_local(tmp_path, reliability):
    """Local and Ray sweep backends write the same bytes (skips where sim.sweep or ray is missing)."""
    sweep_mod = pytest.importorskip("tlora_sim.sim.experiments.sweep", reason="tlora_sim.sim.experiments.sweep (the sweep runner) is not in this checkout")
    pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")
    from tlora_sim.sim.experiments.sweep_file import parse_sweep

    sweep = parse_sweep({"traces": ["synthetic:jobs=30,seed=1"], "clusters": ["2x8xH100"],
                                   "policies": ["independent", "tlora"], "seeds": [0, 1]},
                                  file="inline", base_dir=tmp_path)
    results = {}
    for backend in ("local", "ray"):
        res = sweep_mod.run_sweep(sweep, tmp_path / backend, backend=backend, workers=2, progress=False)
        assert not res.failed, res.failed
        results[backend] = sorted(p.relative_to(tmp_path / backend) for p in (tmp_path / backend).rglob("*")
                                  if p.name in DETERMINISTIC)
    # 6 cells: the reference baseline (independent-backfill) is added to every sweep, x 2 seeds
    assert len(results["local"]) == len(sweep.cells) * len(DETERMINISTIC) == 6 * len(DETERMINISTIC)
    assert results["local"] == results["ray"]
    for rel in results["local"]:
        assert (tmp_path / "local" / rel).read_bytes() == (tmp_path / "ray" / rel).read_bytes(), str(rel)
        reliability("determinism_cases")
    assert (tmp_path / "local" / "sweep.csv").read_bytes() == (tmp_path / "ray" / "sweep.csv").read_bytes()
    reliability("determinism_cases")
