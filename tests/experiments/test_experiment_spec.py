"""Issue 42 item 3: one experiment spec (``sim/experiments/spec.py``) is the source of the CLI flags of
replay/compare, the SWEEP.toml keys and config.json's ``inputs`` and ``axes``; the report reads the
load from the axes; each run's policy is built once."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tlora_sim.sim.cli.main import build_parser, main
from tlora_sim.sim.experiments import spec as sp
from tlora_sim.sim.experiments import sweep as sw
from tlora_sim.sim.experiments import sweep_file as sf
from tlora_sim.sim.experiments.replay import ReplayConfig
from tlora_sim.sim.report import load_sweep, rundata
from tlora_sim.traces.errors import InputError

ROOT = Path(__file__).resolve().parents[2]

# The flags users' scripts pass today (each must stay, with its default).
REPLAY_FLAGS = {"--policy": None, "--trace": None, "--cluster": "16x8xH100", "--seed": 0, "--out": None,
                "--lora-dist": "tlora", "--columns": None, "--time-zone": None, "--slurm-states": None,
                "--time-unit": "s", "--keep-states": None, "--window": None, "--first-jobs": None,
                "--arrival-scale": None, "--regroup-pause": 30.0, "--policy-module": [], "--option": [],
                "--cost-model": "auto", "--artifact": None, "--sweeps": None, "--early-exit": False,
                "--strict": False, "--no-invariants": False, "--no-progress": False, "--no-plots": False,
                "--force": False}
COMPARE_ONLY = {"--policies": None, "--seeds": None, "--baseline": None, "--discipline": "default",
                "--decompose": False}


def _sub(command: str):
    ap = build_parser()
    sub = next(a for a in ap._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices[command]


@pytest.mark.parametrize("command, flags", [("replay", REPLAY_FLAGS),
                                            ("compare", {**REPLAY_FLAGS, **COMPARE_ONLY})])
def test_every_flag_stays_with_its_default_and_a_help_text(command, flags):
    parser = _sub(command)
    actions = {s: a for a in parser._actions for s in a.option_strings}
    for flag, default in flags.items():
        if command == "compare" and flag == "--policy":
            continue
        assert flag in actions, flag
        a = actions[flag]
        assert a.help and len(a.help) > 10, flag
        if not a.required:
            assert a.default == default, (flag, a.default)
    text = parser.format_help()
    assert "NODESxGPUSxTYPE" in text and "synthetic" in text and "auto" in text  # registries listed


def test_each_command_gets_exactly_the_flags_its_fields_name():
    for command, order in sp.FLAG_ORDER.items():
        named = {f.name for cls in sp.OPTION_CLASSES for f in dataclasses.fields(cls)
                 if (k := sp.knob_of(f)) and k.flag and command in k.commands}
        assert sorted(order) == sorted(named), command


def test_flags_round_trip_to_the_spec():
    argv = ["replay", "--policy", "tlora", "--trace", "synthetic:jobs=5", "--cluster", "2x8xH200", "--seed", "7",
            "--out", "o", "--lora-dist", "mixed-ranks", "--columns", "submit=a,duration=b,gpus=c",
            "--time-zone", "Europe/Berlin", "--slurm-states", "COMPLETED", "--time-unit", "ms",
            "--keep-states", "Succeeded", "--window", "0,100", "--first-jobs", "3", "--arrival-scale", "1.5",
            "--regroup-pause", "12", "--policy-module", "tlora_sim.policies.tlora", "--option", "max_group_size=4",
            "--cost-model", "roofline", "--artifact", "a.json", "--sweeps", "0.3:4,8", "--early-exit", "--strict"]
    args = build_parser().parse_args(argv)
    spec = sp.spec_from_args(args, "replay", args.policy, {"max_group_size": "4"})
    assert spec == ReplayConfig(
        trace="synthetic:jobs=5", policy="tlora", cluster="2x8xH200", seed=7, lora_dist="mixed-ranks",
        policy_options={"max_group_size": "4"}, regroup_pause_s=12.0,
        csv_columns={"submit": "a", "duration": "b", "gpus": "c"}, time_unit="ms", strict=True, sweeps="0.3:4,8",
        cost_model="roofline", policy_modules=("tlora_sim.policies.tlora",), early_exit=True,
        time_zone="Europe/Berlin", slurm_states="COMPLETED", keep_states="Succeeded", window="0,100",
        first_jobs=3, arrival_scale=1.5, artifact="a.json")
    # every field the command line sets has a flag; the defaults are the dataclass's
    plain = sp.spec_from_args(build_parser().parse_args(["replay", "--policy", "p", "--trace", "t", "--out", "o"]),
                              "replay", "p")
    assert plain == ReplayConfig(trace="t", policy="p")
    assert sp.flag_of("regroup_pause_s") == "--regroup-pause"


@pytest.mark.parametrize("argv, field", [
    (["--seed", "-3"], "--seed"), (["--regroup-pause", "-1"], "--regroup-pause"),
    (["--first-jobs", "0"], "--first-jobs"), (["--arrival-scale", "0"], "--arrival-scale"),
    (["--window", "1,2,3"], "--window"), (["--cluster", "16xH100"], "--cluster"),
])
def test_a_flag_its_check_refuses_is_named(argv, field, tmp_path, capsys):
    rc = main(["replay", "--policy", "tlora", "--trace", "synthetic:jobs=5", "--out", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and f"field '{field}'" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_sweep_keys_are_the_spec_fields():
    knobs = sp.sweep_knobs()
    assert set(sf.LIST_KEYS) == {k for k, (_, kn) in knobs.items() if kn.axis}
    assert set(sf.LIST_KEYS) | set(sf.SCALAR_KEYS) | set(sf.TABLE_KEYS) == set(knobs)
    for key, (name, _) in knobs.items():  # each key is one field of the spec
        assert name in {f.name for f in dataclasses.fields(ReplayConfig)}, key


# One bad element per axis key (an inline table where a value belongs): named as key[i], with the file.
AXIS_KEYS = [k for k in sp.sweep_knobs() if sp.sweep_knobs()[k][1].axis]


@pytest.mark.parametrize("key", AXIS_KEYS)
def test_a_bad_element_of_any_axis_names_the_file_and_key(key, tmp_path):
    base = {"traces": '["synthetic:jobs=5"]', "policies": '["tlora"]'}
    base[key] = '["synthetic:jobs=5", {x = 1}]' if key == "traces" else (
        '["tlora", {x = 1}]' if key == "policies" else "[{x = 1}]")
    p = tmp_path / "s.toml"
    p.write_text("".join(f"{k} = {v}\n" for k, v in base.items()))
    with pytest.raises(InputError) as e:
        sw.load_sweep(p)
    i = 1 if key in ("traces", "policies") else 0
    assert e.value.file == str(p) and e.value.field == f"{key}[{i}]", (e.value.field, e.value.message)
    assert "expected" in e.value.message or "unknown" in e.value.message


def test_unknown_key_lists_the_spec_keys(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('traces = ["synthetic:jobs=5"]\npolicies = ["tlora"]\ncluster = ["1x8xH100"]\n')
    with pytest.raises(InputError) as e:
        sw.load_sweep(p)
    assert e.value.field == "cluster" and "clusters" in e.value.message and "arrival_scales" in e.value.message


def test_a_sweep_cell_runs_the_spec_a_replay_command_runs(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('traces = ["synthetic:jobs=30,seed=2"]\npolicies = ["tlora"]\nclusters = ["1x8xH100"]\n'
                 'seeds = [3]\nregroup_pause_s = [12.0]\narrival_scales = [1.5]\nreference = "tlora"\n'
                 '[policy_options.tlora]\nmax_group_size = 4\n')
    res = sw.run_sweep(sw.load_sweep(p), tmp_path / "sw", workers=1, progress=False)
    assert not res.failed
    (cell,) = (tmp_path / "sw" / "cells").iterdir()
    assert main(["replay", "--policy", "tlora", "--trace", "synthetic:jobs=30,seed=2", "--cluster", "1x8xH100",
                 "--seed", "3", "--regroup-pause", "12", "--arrival-scale", "1.5", "--option", "max_group_size=4",
                 "--out", str(tmp_path / "rep"), "--no-plots", "-q"]) == 0
    for f in ("jobs.csv", "timeline.csv"):
        assert (cell / f).read_bytes() == (tmp_path / "rep" / f).read_bytes(), f
    a, b = (json.loads((d / "config.json").read_text()) for d in (cell, tmp_path / "rep"))
    # the same inputs but where the command line keeps --option's text ("4", converted by the policy's config)
    assert {k: v for k, v in a["inputs"].items() if k not in ("reference", "policy_options")} == \
        {k: v for k, v in b["inputs"].items() if k not in ("reference", "policy_options")}
    assert a["policy_config"] == b["policy_config"] and a["policy_config"]["max_group_size"] == 4
    drop = ("policy_options",)
    assert {k: v for k, v in a["axes"].items() if k not in drop} == {k: v for k, v in b["axes"].items() if k not in drop}
    assert a["axes"]["arrival_scale"] == 1.5 and a["axes"]["load"] == pytest.approx(0.7 * 32 / 8 * 1.5)


def test_axes_record_the_offered_load():
    spec = ReplayConfig(trace="synthetic:jobs=5,load=0.9,gpus=16", policy="tlora", cluster="4x8xH100")
    ax = sp.axes(spec, 32)
    assert (ax["trace_load"], ax["trace_gpus"], ax["cluster_gpus"]) == (0.9, 16, 32)
    assert ax["load"] == pytest.approx(0.45) and "load=" not in ax["trace_family"]
    assert sp.axes(dataclasses.replace(spec, arrival_scale=2.0), 32)["load"] == pytest.approx(0.9)
    assert set(sp.AXES) == set(sf.LIST_KEYS)
    real = sp.axes(ReplayConfig(trace="itp:x.csv.gz", policy="tlora"), 128)
    assert real["load"] is None and real["trace_load"] is None and real["trace_family"] == "itp:x.csv.gz"
    assert sp.trace_load("synthetic:default") == (0.7, 32)  # the generator's defaults


def _compare(out: Path, load: float, cluster: str = "2x8xH100") -> Path:
    assert main(["compare", "--trace", f"synthetic:jobs=40,seed=5,load={load},gpus=16", "--cluster", cluster,
                 "--policies", "tlora", "--out", str(out), "--no-plots", "-q", "--workers", "1"]) == 0
    return out


def test_the_report_reads_the_load_axis_from_the_run_directories(tmp_path, capsys):
    root = tmp_path / "sens"
    for i, load in enumerate((0.5, 0.9, 1.1)):
        _compare(root / f"p{i}", load)
    _compare(root / "q", 0.5, cluster="4x8xH100")  # another cluster: alone, left out
    capsys.readouterr()
    with pytest.warns(rundata.PlotWarning, match="q: no other comparison"):
        points = load_sweep.load_sweep_points(load_sweep.find_compare_dirs(root))
    assert points["load"].tolist() == [0.5, 0.5, 0.9, 0.9, 1.1, 1.1]
    assert points["policy"].tolist() == ["independent-backfill", "tlora"] * 3
    assert set(points["series"]) == {1} and set(points["cluster_gpus"]) == {16.0}
    for _, row in points.iterrows():  # the queueing delays are the runs' own
        jobs = pd.read_csv(Path(row["compare_dir"]) / row["policy"] / "jobs.csv")
        summary = pd.read_csv(Path(row["compare_dir"]) / "summary.csv").set_index("policy")
        assert row["avg_queue_s"] == pytest.approx(summary.loc[row["policy"], "avg_queue_s"])
        assert row["jobs"] == len(jobs)
    ctx = json.loads(points["context"].iloc[0])
    assert ctx["cluster"] == "2x8xH100" and "load=" not in ctx["trace"] and "policy" not in ctx

    # an older run directory (no axes in config.json): left out, named, unless loads= gives its load
    old = tmp_path / "old"
    shutil.copytree(root / "p0", old / "p0")
    shutil.copytree(root / "p1", old / "p1")
    for f in (old / "p0").glob("*/config.json"):
        cfg = json.loads(f.read_text())
        del cfg["axes"]
        f.write_text(json.dumps(cfg))
    with pytest.warns(rundata.PlotWarning) as record:
        with pytest.raises(InputError, match="no load sweep"):
            load_sweep.load_sweep_points(load_sweep.find_compare_dirs(old))
    assert any("p0: its runs' config.json records no axes" in str(w.message) for w in record)
    pts = load_sweep.load_sweep_points(load_sweep.find_compare_dirs(old), loads={"p0": 0.5, "p1": 0.9})
    assert sorted(set(pts["load"])) == [0.5, 0.9]


def test_each_run_builds_its_policy_once(tmp_path, monkeypatch):
    from tlora_sim.policies import registry

    built: list[tuple[str, dict]] = []
    real = registry.make_policy

    def counting(name, options=None):
        built.append((name, dict(options or {})))
        return real(name, options)

    monkeypatch.setattr(registry, "make_policy", counting)
    assert main(["compare", "--trace", "synthetic:jobs=30,seed=1", "--cluster", "1x8xH100", "--policies",
                 "tlora,mlora", "--discipline", "shared", "--regroup-pause", "10", "--out", str(tmp_path / "c"),
                 "--no-plots", "-q", "--workers", "1"]) == 0
    assert sorted(n for n, _ in built) == ["independent-backfill", "mlora", "tlora"]
    tlora_opts = next(o for n, o in built if n == "tlora")
    assert tlora_opts["regroup_pause_s"] == 10.0  # the engine's pause, priced by the join test
    cfg = json.loads((tmp_path / "c" / "tlora" / "config.json").read_text())
    assert cfg["policy_config"]["regroup_pause_s"] == 10.0 and "regroup_pause_s" not in cfg["inputs"]["policy_options"]
    built.clear()
    assert main(["replay", "--trace", "synthetic:jobs=30,seed=1", "--cluster", "1x8xH100", "--policy", "tlora",
                 "--out", str(tmp_path / "r"), "--no-plots", "-q"]) == 0
    assert [n for n, _ in built] == ["tlora"]


def test_docs_list_every_flag_and_sweep_key():
    doc = (ROOT / "docs" / "experiments.md").read_text().split("## The fields", 1)[1].split("\n## ", 1)[0]
    for group in ("ExperimentSpec", "RunOptions", "SweepOptions"):
        text = doc.split(f"### `{group}`", 1)[1].split("\n### ", 1)[0]
        rows = {r["field"]: r for r in sp.fields_table() if r["group"] == group}
        documented = re.findall(r"^\| `(\w+)` \|", text, flags=re.M)
        assert sorted(documented) == sorted(rows), f"docs/experiments.md rows of {group} are not its fields"
        for name, row in rows.items():
            line = next(ln for ln in text.splitlines() if ln.startswith(f"| `{name}` "))
            for cell in (row["flag"], row["sweep_key"]):
                if cell:
                    assert f"`{cell}`" in line, (group, name, cell)
