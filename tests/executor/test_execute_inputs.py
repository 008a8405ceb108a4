"""``tlora-sim execute`` refuses bad input up front with one line (issue 45): non-finite or absurd
--time-scale, --skip-jobs past the trace, a Triton plan on the CPU without the interpreter, a
--option for another policy; and it takes the trace options replay takes (--columns ...)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tlora_sim.sim.cli.main import main

LORA = str(Path(__file__).resolve().parents[2] / "profiler" / "validation" / "lora_validation.json")

pytest.importorskip("torch")


def _execute(tmp_path, *extra, name="o"):
    return main(["execute", "--trace", "synthetic:jobs=20", "--policy", "independent", "--device", "cpu", "--tiny",
                 "--jobs", "2", "--max-steps", "2", "--min-steps", "1", "--no-progress", "--no-plots",
                 "--out", str(tmp_path / name), *extra])


@pytest.mark.parametrize("extra", [["--time-scale", "inf"], ["--time-scale", "1e-300"], ["--time-scale", "nan"],
                                   ["--skip-jobs", "1000000"], ["--option", "mlora.concurrency_num=2"],
                                   ["--artifact", "/dev/zero"]])
def test_refused_with_one_line(tmp_path, capsys, extra):
    assert _execute(tmp_path, *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tlora-sim: error:")
    assert not (tmp_path / "o").exists()
    if "--skip-jobs" in extra:
        assert "--skip-jobs" in err[0] and "fits" not in err[0]


def test_triton_plan_on_cpu_needs_the_interpreter(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert main(["execute", "--trace", "synthetic:jobs=20", "--policy", "tlora", "--device", "cpu", "--tiny",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "TRITON_INTERPRET=1" in err[0]


def test_csv_trace_with_columns(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("id,t_submit,gpus_wanted,minutes\na,0,1,30\nb,1,1,60\nc,2,2,60\n")
    assert main(["execute", "--trace", f"csv:{csv}", "--columns", "submit=t_submit,gpus=gpus_wanted,duration=minutes,"
                 "job_id=id", "--time-unit", "min", "--policy", "independent", "--device", "cpu", "--tiny", "--jobs", "2",
                 "--max-steps", "2", "--min-steps", "1", "--no-progress", "--no-plots", "--out", str(tmp_path / "r"),
                 "--time-scale", "1e6", "--lora-dist", LORA]) == 0
    import pandas as pd

    assert pd.read_csv(tmp_path / "r" / "workload.csv").job_id.astype(str).tolist() == ["a", "b"]
