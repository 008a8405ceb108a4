"""From trace rows to jobs: total steps keep the traced duration; documented skips or --strict errors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import CM, cluster
from tlora_sim.traces.errors import InputError
from tlora_sim.sim.experiments.replay import ReplayConfig, load_workload
from tlora_sim.sim.core.workload import REQUIRED, build_jobs


def frame(rows, path="t.csv"):
    """A trace frame with LoRA columns from (submit, duration, gpus, model, rank, batch, seq) tuples."""
    df = pd.DataFrame([{"job_id": f"j{i}", "submit_time_s": float(s), "duration_s": float(d), "num_gpus": g,
                        "model": m, "rank": r, "batch_size": b, "seq_len": q, "max_slowdown": 1.5, "tenant": ""}
                       for i, (s, d, g, m, r, b, q) in enumerate(rows)])
    df.attrs["path"] = path
    return df


@given(rows=st.lists(st.tuples(st.floats(0, 1e6), st.floats(1.0, 5e5), st.sampled_from([1, 2, 4, 8, 16]),
                               st.sampled_from(["llama3-8b", "qwen3-8b"]), st.sampled_from([2, 4, 8, 16]),
                               st.sampled_from([1, 2, 4, 8]), st.sampled_from([512, 1024, 2048])),
                     min_size=1, max_size=20))
def test_total_steps_keep_the_isolated_runtime_within_half_a_step_of_the_trace(rows):
    rows = sorted(rows)
    jobs, skipped = build_jobs(frame(rows), cluster("4x8xH100"), CM)
    assert skipped == {} and len(jobs) == len(rows)
    for i, (j, row) in enumerate(zip(jobs, rows)):
        assert j.index == i and j.job_id == f"j{i}"
        assert j.submit_time_s == row[0] and j.num_gpus == row[2]
        assert j.isolated_step_time_s == CM.step_time_s(j.model, "H100", [j.member], j.num_gpus, "alone")
        assert j.total_steps >= 1
        if j.total_steps > 1:
            assert abs(j.isolated_runtime_s - row[1]) <= 0.5 * j.isolated_step_time_s * (1 + 1e-9)
        else:  # a job shorter than one and a half steps runs one step
            assert row[1] < 1.5 * j.isolated_step_time_s
        assert j.trace_duration_s == row[1]


def test_oversized_jobs_are_skipped_and_counted_or_rejected_with_strict():
    rows = [(0, 3600, 1, "llama3-8b", 8, 2, 1024), (10, 3600, 64, "llama3-8b", 8, 2, 1024),
            (20, 3600, 8, "llama3-8b", 8, 2, 1024)]
    jobs, skipped = build_jobs(frame(rows), cluster("2x8xH100"), CM)
    assert [j.job_id for j in jobs] == ["j0", "j2"] and [j.index for j in jobs] == [0, 1]
    assert skipped == {"oversized": 1}
    with pytest.raises(InputError) as info:
        build_jobs(frame(rows), cluster("2x8xH100"), CM, strict=True)
    assert (info.value.file, info.value.row, info.value.field) == ("t.csv", 2, "num_gpus")
    assert "64 GPUs" in str(info.value)


def test_jobs_that_do_not_fit_in_memory_are_skipped_or_rejected_with_strict():
    rows = [(0, 3600, 1, "llama3-70b", 8, 1, 1024), (5, 3600, 8, "llama3-70b", 8, 1, 1024)]
    jobs, skipped = build_jobs(frame(rows), cluster("1x8xH100"), CM)
    assert [j.job_id for j in jobs] == ["j1"] and skipped == {"memory": 1}
    with pytest.raises(InputError) as info:
        build_jobs(frame(rows), cluster("1x8xH100"), CM, strict=True)
    assert (info.value.row, info.value.field) == (1, "num_gpus")


def test_missing_columns_and_unknown_models_raise():
    df = frame([(0, 100, 1, "llama3-8b", 8, 1, 512)]).drop(columns=["rank"])
    with pytest.raises(InputError, match="rank"):
        build_jobs(df, cluster(), CM)
    with pytest.raises(InputError, match="unknown base model"):
        build_jobs(frame([(0, 100, 1, "gpt-5", 8, 1, 512)]), cluster(), CM)
    assert "max_slowdown" in REQUIRED


def test_load_workload_records_reader_skips_and_strict_turns_them_into_errors(tmp_path):
    p = tmp_path / "z.csv"
    p.write_text("t,d,g\n0,100,1\n5,0,1\n9,50,2\n")
    cfg = ReplayConfig(trace=f"csv:{p}", policy="independent", cluster="1x8xH100",
                       csv_columns={"submit": "t", "duration": "d", "gpus": "g"})
    jobs, *_, skipped = load_workload(cfg)
    assert len(jobs) == 2 and skipped["zero_duration"] == 1
    from dataclasses import replace

    with pytest.raises(InputError, match="zero_duration") as info:
        load_workload(replace(cfg, strict=True))
    assert info.value.file == str(p)


def test_seed_changes_lora_attributes_but_not_the_trace():
    a, *_ = load_workload(ReplayConfig(trace="synthetic:jobs=80", policy="independent", seed=1))
    b, *_ = load_workload(ReplayConfig(trace="synthetic:jobs=80", policy="independent", seed=2))
    a2, *_ = load_workload(ReplayConfig(trace="synthetic:jobs=80", policy="independent", seed=1))
    assert a == a2
    assert [(j.submit_time_s, j.num_gpus, j.trace_duration_s) for j in a] == \
           [(j.submit_time_s, j.num_gpus, j.trace_duration_s) for j in b]
    assert [(j.model, j.rank, j.batch_size, j.seq_len) for j in a] != [(j.model, j.rank, j.batch_size, j.seq_len)
                                                                       for j in b]


def test_custom_lora_distribution_json(tmp_path):
    p = tmp_path / "dist.json"
    p.write_text(json.dumps({"models": {"qwen3-8b": 1.0}, "ranks": {"64": 1.0}}))
    jobs, *_ = load_workload(ReplayConfig(trace="synthetic:jobs=20", policy="independent", lora_dist=str(p)))
    assert {j.model for j in jobs} == {"qwen3-8b"} and {j.rank for j in jobs} == {64}
    assert np.all([j.total_steps >= 1 for j in jobs])


def test_strict_errors_name_the_file_row_not_the_submit_order_position(tmp_path):
    """Readers sort by submit time; an error about a job names the row it has in its file (and, for
    a merged ITP directory, the file it came from), including after sweep expansion."""
    from dataclasses import replace

    header = "job_id,submission_time,duration,num_gpu\n"
    one = tmp_path / "one.csv"
    one.write_text(header + "late,500,3600,4096\nearly,0,3600,1\n")  # oversized job: file row 1, sorted row 2
    cfg = ReplayConfig(trace=f"itp:{one}", policy="independent", cluster="2x8xH100", strict=True)
    with pytest.raises(InputError) as info:
        load_workload(cfg)
    assert (info.value.file, info.value.row, info.value.field) == (str(one), 1, "num_gpus")
    with pytest.raises(InputError) as info:  # every job a sweep of 4 configurations: rows repeat
        load_workload(replace(cfg, sweeps="1:4"))
    assert (info.value.file, info.value.row) == (str(one), 1)

    merged = tmp_path / "itp"
    merged.mkdir()
    (merged / "cluster01.csv").write_text(header + "a,0,3600,1\nb,10,3600,1\nc,20,3600,2\n")
    (merged / "cluster02.csv").write_text(header + "d,5,3600,1\ne,7,3600,4096\n")  # file row 2, merged row 3
    with pytest.raises(InputError) as info:
        load_workload(replace(cfg, trace=f"itp:{merged}"))
    assert (info.value.file, info.value.row, info.value.field) == (str(merged / "cluster02.csv"), 2, "num_gpus")
    assert "'e'" in str(info.value)
