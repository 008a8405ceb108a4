"""Bad values stopped at the door (issue 22): synthetic specs and LoRA distribution files.

Each case must raise one ``InputError`` naming the field (and the file, for files), before any
workload is generated.
"""

from __future__ import annotations

import json

import pytest

from tlora_sim.traces.errors import InputError
from tlora_sim.traces.lora import MAX_JSON_BYTES, load_distribution
from tlora_sim.traces.synthetic import MAX_JOBS, parse_options, read_synthetic


@pytest.mark.parametrize("spec,field", [
    ("load=inf", "load"), ("load=nan", "load"), ("dur_scale=inf", "dur_scale"), ("max_dur_h=nan", "max_dur_h"),
    ("load=-1", "load"), ("jobs=0", "jobs"), ("seed=-3", "seed"), ("diurnal=2", "diurnal"),
    ("jobs=10,jobs=20", "jobs"), ("load=0.5,seed=1,load=0.7", "load"), ("jobs=abc", "jobs"),
    ("bogus=1", "bogus"), (f"jobs={MAX_JOBS + 1}", "jobs"),
])
def test_synthetic_spec_rejects(spec, field):
    with pytest.raises(InputError) as e:
        parse_options(spec)
    assert e.value.field == field
    assert "\n" not in str(e.value)


def test_synthetic_job_limit_is_checked_before_allocating():
    with pytest.raises(InputError, match="exhaust memory"):
        read_synthetic("jobs=100000000000")


@pytest.mark.parametrize("spec,field", [("dur_scale=1e-320", "dur_scale"), ("dur_scale=1e308", "dur_scale"),
                                        ("max_dur_h=1e-9", "max_dur_h")])
def test_duration_errors_blame_the_right_key(spec, field):
    with pytest.raises(InputError) as e:
        read_synthetic(spec + ",jobs=5")
    assert e.value.field == field


def test_synthetic_accepts_its_limit_and_defaults():
    assert parse_options(f"jobs={MAX_JOBS}")["jobs"] == MAX_JOBS
    assert len(read_synthetic("jobs=7,seed=2")) == 7


def _write(tmp_path, text, name="d.json"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_lora_json_repeated_key(tmp_path):
    p = _write(tmp_path, '{"ranks": {"8": 0.5, "8": 0.5}}')
    with pytest.raises(InputError) as e:
        load_distribution(str(p))
    assert e.value.file == str(p) and e.value.field == "8"


def test_lora_json_nested_too_deep(tmp_path):
    p = _write(tmp_path, "[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match="nested too deeply|cannot read") as e:
        load_distribution(str(p))
    assert e.value.file == str(p)


def test_lora_json_too_large(tmp_path):
    p = _write(tmp_path, " " * (MAX_JSON_BYTES + 1) + "{}")
    with pytest.raises(InputError, match="limit") as e:
        load_distribution(str(p))
    assert e.value.file == str(p)


@pytest.mark.parametrize("table,field", [({"max_slowdown": {"Infinity": 1.0}}, "max_slowdown"),
                                         ({"ranks": {"8": float("nan")}}, "ranks"),
                                         ({"ranks": {"8": 0.5, "16": float("inf")}}, "ranks")])
def test_lora_json_non_finite(tmp_path, table, field):
    p = _write(tmp_path, json.dumps(table))
    with pytest.raises(InputError) as e:
        load_distribution(str(p))
    assert e.value.file == str(p) and e.value.field == field


def test_csv_header_with_a_repeated_name(tmp_path):
    from tlora_sim.traces.tableio import read_csv_strings as read_table

    f = tmp_path / "t.csv"
    f.write_text("submit,submit,gpus\n1,2,1\n")
    with pytest.raises(InputError, match="twice") as e:
        read_table(str(f))
    assert e.value.field == "submit" and e.value.file == str(f)


def test_artifact_of_the_wrong_shape_names_the_field(tmp_path):
    from tlora_sim.sim.costmodel.profiled.artifact import SCHEMA, load_artifact

    f = tmp_path / "a.json"
    f.write_text(json.dumps({"schema": SCHEMA, "id": "x", "gpu": "H100", "optimizer": {"coef": {}},
                             "models": {"m": {"l0": {}, "head": {}, "attn": {}, "plans": {"fused": {"coef": [1]}}}}}))
    with pytest.raises(InputError) as e:
        load_artifact(f)
    assert e.value.field == "models.m.plans.fused.coef" and e.value.file == str(f)
    f.write_text("[1, 2]")
    with pytest.raises(InputError, match="schema"):
        load_artifact(f)


def test_unknown_model_in_a_lora_json_names_the_file(tmp_path):
    from tlora_sim.sim.experiments.replay import ReplayConfig, load_workload

    f = tmp_path / "d.json"
    f.write_text('{"models": {"llama9-1t": 1.0}}')
    with pytest.raises(InputError) as e:
        load_workload(ReplayConfig(trace="synthetic:jobs=5", policy="independent", cluster="1x8xH100",
                                   lora_dist=str(f)))
    assert e.value.file == str(f) and e.value.field == "models.llama9-1t"
