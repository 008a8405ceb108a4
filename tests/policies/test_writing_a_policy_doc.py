"""Issue 44 item 6: docs/writing-a-policy.md alone is enough: its complete example runs as it is, the
names it documents exist with those fields, and check_policy reports where a policy raised."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path


from tlora_sim.policies import api
from tlora_sim.sim.cli.main import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "writing-a-policy.md"


def _example() -> str:
    text = DOC.read_text()
    m = re.search(r"<!-- complete-example -->\n```python\n(.*?)```", text, re.S)
    assert m, "docs/writing-a-policy.md must hold one complete example after <!-- complete-example -->"
    return m.group(1)


def test_the_complete_example_runs_from_the_page_alone(tmp_path, monkeypatch):
    f = tmp_path / "slowdown_pack.py"
    f.write_text(_example())
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs" / "pack"
    assert main(["-q", "replay", "--policy-module", str(f), "--policy", "slowdown-pack", "--trace",
                 "synthetic:jobs=200,seed=1", "--cluster", "2x8xH100", "--out", str(out), "--no-plots"]) == 0
    import json

    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed_jobs"] == summary["kept_jobs"] > 0
    jobs = __import__("pandas").read_csv(out / "jobs.csv")
    assert jobs["max_group_size"].max() > 1  # it does co-locate
    assert api.check_policy(api.make_policy("slowdown-pack")) == []


def test_the_tables_name_real_fields():
    text = DOC.read_text()
    for cls in (api.Snapshot, api.GroupView, api.Job, api.StartGroup, api.AddMembers, api.RemoveMembers,
                api.StopMembers, api.SetExecution, api.PlannedGroup):
        for f in dataclasses.fields(cls):
            if f.name.startswith("_") or f.name in ("version",) and cls is api.PlannedGroup:
                continue
            if cls is api.PlannedGroup and f.name in ("added", "nano_batches", "removed"):
                continue  # planner internals
            assert f"`{f.name}`" in text, f"{cls.__name__}.{f.name} is not documented"
    for name in ("adapters", "tokens_per_step", "isolated_runtime_s", "candidates", "slowdown_bound_s",
                 "step_time_s", "fits_memory", "memory_bytes", "((node, gpus), ...)"):
        assert name in text, name


def test_check_policy_reports_the_file_and_line_where_decide_raised():
    class Broken:
        plan = "fused"
        timer_s = None

        def decide(self, snap):
            return sorted(snap.queue)  # the mistake the page warns about

    found = [v for v in api.check_policy(Broken()) if v.rule == "raises"]
    assert found, "a raising decide must be reported"
    v = found[0]
    assert "TypeError" in v.detail and f"{Path(__file__).name}:" in v.detail and "in decide" in v.detail
    assert "Traceback (most recent call last)" in v.traceback and "sorted(snap.queue)" in v.traceback
