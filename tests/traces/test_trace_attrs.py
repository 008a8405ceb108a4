"""Issue 44 item 1: per-job LoRA attributes from the trace (csv columns, slurm Comment), checked, marked in
jobs.csv; the rest drawn from the LoRA distribution with the same draws as without them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tlora_sim.sim.cli.main import main
from tlora_sim.traces import read_trace
from tlora_sim.traces.errors import InputError
from tlora_sim.traces.lora import DISTRIBUTIONS, assign_lora

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "lora_jobs.csv"
MAPPING = ("submit=created,start=started,end=finished,gpus=gpus,job_id=job,tenant=team,model=base_model,"
           "rank=lora_rank,seq_len=seq,batch_size=global_batch,max_slowdown=slowdown,steps=train_steps")


def _cols(text: str) -> dict:
    return dict(item.split("=") for item in text.split(","))


def test_example_replays_with_the_trace_values_in_jobs_csv(tmp_path):
    out = tmp_path / "run"
    rc = main(["-q", "replay", "--policy", "tlora", "--trace", f"csv:{EXAMPLE}", "--columns", MAPPING,
               "--cluster", "1x8xH100", "--out", str(out), "--no-plots"])
    assert rc == 0
    jobs = pd.read_csv(out / "jobs.csv", keep_default_na=False).set_index("job_id")
    src = pd.read_csv(EXAMPLE, keep_default_na=False).set_index("job")
    assert "ft-007" not in jobs.index and "ft-008" not in jobs.index  # running and pending: skipped
    for jid, row in jobs.iterrows():
        given = src.loc[jid]
        marks = set(filter(None, row["attrs_from_trace"].split(";")))
        for key, col in (("model", "base_model"), ("rank", "lora_rank"), ("seq_len", "seq"),
                         ("max_slowdown", "slowdown"), ("steps", "train_steps")):
            assert (key in marks) == (given[col] != ""), (jid, key)
            if given[col] != "":
                got = row["total_steps" if key == "steps" else key]
                assert str(got) == str(given[col]) or float(got) == float(given[col]), (jid, key)
        if given["global_batch"] != "":
            assert "batch_size" in marks
            assert row["micro_batch_per_gpu"] == -(-int(given["global_batch"]) // int(given["gpus"]))
            assert row["grad_accum"] == 1
    assert jobs.loc["ft-005", "attrs_from_trace"] == "rank"


def test_unmapped_rows_draw_exactly_what_they_would_without_the_columns():
    full = read_trace(f"csv:{EXAMPLE}", csv_columns=_cols(MAPPING))
    bare = read_trace(f"csv:{EXAMPLE}", csv_columns=_cols("submit=created,start=started,end=finished,gpus=gpus,"
                                                          "job_id=job"))
    a = assign_lora(full, DISTRIBUTIONS["tlora"], np.random.default_rng(3))
    b = assign_lora(bare, DISTRIBUTIONS["tlora"], np.random.default_rng(3))
    lost = full["rank"].isna().to_numpy()  # rows whose rank the trace leaves open
    assert lost.any() and (~lost).any()
    assert (a["rank"].to_numpy()[lost] == b["rank"].to_numpy()[lost]).all()
    assert (a["rank"].to_numpy()[~lost] == full["rank"].to_numpy()[~lost]).all()


@pytest.mark.parametrize("col, value, match", [
    ("lora_rank", "abc", "not a number"), ("lora_rank", "0", ">= 1"), ("lora_rank", "2.5", "whole number"),
    ("slowdown", "0.5", ">= 1"), ("slowdown", "inf", "finite"), ("seq", "-3", ">= 1"),
    ("train_steps", "1e12", "too large"),
])
def test_bad_attribute_values_name_file_row_and_column(tmp_path, col, value, match):
    df = pd.read_csv(EXAMPLE, dtype=str, keep_default_na=False)
    df.loc[2, col] = value
    p = tmp_path / "t.csv"
    df.to_csv(p, index=False)
    with pytest.raises(InputError, match=match) as e:
        read_trace(f"csv:{p}", csv_columns=_cols(MAPPING))
    assert (e.value.file, e.value.row, e.value.field) == (str(p), 3, col)


def test_unknown_model_is_one_line_listing_the_known_ones(tmp_path, capsys):
    df = pd.read_csv(EXAMPLE, dtype=str, keep_default_na=False)
    df.loc[3, "base_model"] = "llama9-8b"
    p = tmp_path / "t.csv"
    df.to_csv(p, index=False)
    rc = main(["replay", "--policy", "tlora", "--trace", f"csv:{p}", "--columns", MAPPING, "--cluster", "1x8xH100",
               "--out", str(tmp_path / "r"), "--no-plots", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and not (tmp_path / "r").exists()
    assert f"{p}, row 4, field 'base_model': unknown base model 'llama9-8b'; known: " in err[0]
    assert "llama3-8b" in err[0] and "qwen3-8b" in err[0]


def test_slurm_comment_pattern(tmp_path):
    p = tmp_path / "sacct.txt"
    p.write_text("JobID|JobName|Comment|Submit|Start|End|AllocTRES|State\n"
                 "1|a|model=qwen3-8b;rank=32; seq_len=512 ;other=x|2024-05-01T00:00:00|2024-05-01T00:00:10|"
                 "2024-05-01T01:00:00|gres/gpu=1|COMPLETED\n"
                 "2|b||2024-05-01T00:10:00|2024-05-01T00:10:10|2024-05-01T02:00:00|gres/gpu=2|COMPLETED\n")
    t = read_trace(f"slurm:{p}")
    assert list(t.columns[5:]) == ["model", "rank", "seq_len"]
    assert t["model"].tolist() == ["qwen3-8b", ""] and t["rank"].iloc[0] == 32 and np.isnan(t["rank"].iloc[1])
    assert t.attrs["attr_columns"]["rank"] == "Comment.rank"
    p.write_text(p.read_text().replace("rank=32", "rank=32;rank=4"))
    with pytest.raises(InputError, match="given twice") as e:
        read_trace(f"slurm:{p}")
    assert (e.value.row, e.value.field) == (1, "Comment.rank")


def test_trace_without_attributes_keeps_jobs_csv_unchanged(tmp_path):
    out = tmp_path / "r"
    assert main(["-q", "replay", "--policy", "tlora", "--trace", "synthetic:jobs=20,seed=1", "--cluster", "1x8xH100",
                 "--out", str(out), "--no-plots"]) == 0
    assert "attrs_from_trace" not in pd.read_csv(out / "jobs.csv").columns
