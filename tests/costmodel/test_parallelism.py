"""Parallelism plans, collective curves and the planner (sim/costmodel/parallelism.py,
profiled/multigpu.py), the job model that uses them (sim/core/workload.py), ``costmodel predict``
and the two-GPU fit (profiler/fit_multigpu.py). Engine-free."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tlora_sim.sim.core.cluster import parse_cluster
from tlora_sim.sim.core.workload import build_jobs
from tlora_sim.sim.costmodel.factory import default_cost_model, make_cost_model
from tlora_sim.sim.costmodel.hardware import GPUS
from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.sim.costmodel.models import get_model
from tlora_sim.sim.costmodel.parallelism import Collectives, Parallelism, candidates, load_multigpu, \
    parse_parallelism, per_gpu_mixes
from tlora_sim.sim.costmodel.profiled.multigpu import plan_step
from tlora_sim.traces.errors import InputError


def test_plan_names_parse_back():
    for p in (Parallelism("dp", 8), Parallelism("fsdp", 16), Parallelism("tp", 8, tp=2), Parallelism("tp", 4, tp=4),
              Parallelism("pp", 8, pp=2), Parallelism("local", 4)):
        assert parse_parallelism(p.name, p.n_gpus) == p
    assert Parallelism("tp", 8, tp=2).name == "tp2-dp4" and Parallelism("tp", 8, tp=2).dp == 4
    assert parse_parallelism("tp", 16) == Parallelism("tp", 16, tp=8)  # inside a node
    assert parse_parallelism("fsdp", 4).name == "fsdp4"
    for bad, n in (("zero", 2), ("tp3", 8), ("dp4", 8), ("tp2-dp2", 8), ("dp-x", 2)):
        with pytest.raises(InputError):
            parse_parallelism(bad, n)


def test_candidates_follow_the_model_shape():
    m = get_model("qwen2.5-32b")  # 40 heads, 8 KV heads: tp 2, 4, 8 all divide
    names = [p.name for p in candidates(m, 8, 1)]
    assert names == ["dp8", "fsdp8", "tp2-dp4", "tp4-dp2", "tp8"]
    assert "local8" in [p.name for p in candidates(m, 8, 3)]  # groups only
    assert all(p.kind != "pp" for p in candidates(m, 8, 3))
    assert [p.name for p in candidates(m, 8, 1, pipeline=True) if p.kind == "pp"] == ["pp2-dp4", "pp4-dp2", "pp8"]
    assert [p.name for p in candidates(m, 1, 5)] == ["dp1"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([2, 8, 64]), st.integers(1, 20), st.sampled_from([256, 1024])),
                min_size=1, max_size=12), st.sampled_from([2, 4, 8]))
def test_mixes_keep_sequences_whole(members, n):
    dp = per_gpu_mixes(members, Parallelism("dp", n))
    assert len(dp) == 1 and all(b == math.ceil(b0 / n) for (_, b, _), (_, b0, _) in zip(dp[0], members))
    local = per_gpu_mixes(members, Parallelism("local", n))
    placed = sorted(x for mix in local for x in mix)
    assert placed == sorted(members) and len(local) <= n  # every adapter on exactly one GPU, whole
    loads = [sum(b * s for _, b, s in mix) for mix in local]
    biggest = max(b * s for _, b, s in members)
    # longest-processing-time first: no GPU exceeds the average by more than the largest adapter
    assert max(loads) <= sum(loads) / n + biggest + 1e-9


def test_collectives_reproduce_the_measured_curve_and_flag_beyond_it():
    terms, own = load_multigpu("H200")
    assert own and terms["heldout"]["rows"] >= 50
    c = Collectives(terms)
    for b, t in terms["curves"]["all_reduce"]:
        got, ext = c.time_ms("all_reduce", b, 2)
        assert got == pytest.approx(t) and not ext
    t2 = c.time_ms("all_reduce", 1 << 26, 2)[0]
    t8, ext8 = c.time_ms("all_reduce", 1 << 26, 8)
    t16, _ = c.time_ms("all_reduce", 1 << 26, 16, GPUS["H200"].net_bw_bytes_s / 1e3)
    assert ext8 and t2 < t8 < t16  # more ring steps, then the network
    assert load_multigpu("A100") == (terms, False)  # a GPU type without its own profile: the H200's, flagged
    h100, own100 = load_multigpu("H100")  # the H100's own two-GPU profile (2026-11-26)
    assert own100 and h100["gpu"] == "H100" and h100["curves"] != terms["curves"] and h100["heldout"]["rows"] >= 50


def test_planner_picks_the_fastest_plan_that_fits():
    cm = default_cost_model("H100")
    cap = GPUS["H100"].memory_bytes
    mem = tuple(Member(r, 8, 1024) for r in (8, 16, 16, 64))
    best = cm.predict("qwen2.5-32b", "H100", mem, 8, "fused")
    brute = []
    for par in candidates(get_model("qwen2.5-32b"), 8, len(mem)):
        s, _, m = plan_step(cm.artifact, cm.key, "qwen2.5-32b", "H100", tuple(sorted(mem)), par, "fused", 1, 1, True)
        if m <= cap:
            brute.append((s, par.name))
    assert brute and best.step_time_s == pytest.approx(min(brute)[0]) and best.parallelism == min(brute)[1]
    assert best.memory_bytes <= cap and "multigpu:gpus>2" in best.reasons
    # a forced plan is evaluated as asked
    tp = cm.predict("qwen2.5-32b", "H100", mem, 8, "fused", parallelism="tp4")
    assert tp.parallelism == "tp4-dp2" and tp.step_time_s >= best.step_time_s
    # 70B: no replica fits an H100, a sharded plan does
    big = cm.predict("llama3-70b", "H100", (Member(16, 8, 1024),), 8, "alone")
    assert big.parallelism.split("-")[0] in ("fsdp8", "tp2", "tp4", "tp8") and big.memory_bytes <= cap
    assert cm.memory_bytes("llama3-70b", "H100", (Member(16, 1, 1024),), 1, "alone") > cap


def test_the_step_is_the_slowest_gpus():
    cm = default_cost_model("H200")
    mem = (Member(16, 4, 2048), Member(2, 1, 256))  # very unbalanced: local waits for the big adapter
    par = Parallelism("local", 2)
    s, _, _ = plan_step(cm.artifact, cm.key, "llama3-8b", "H200", mem, par, "fused", 1, 1, True)
    alone = [plan_step(cm.artifact, cm.key, "llama3-8b", "H200", (x,), par, "fused", 1, 1, True)[0] for x in mem]
    assert s == pytest.approx(max(alone), rel=1e-9)


def _frame(rows):
    cols = ["job_id", "submit_time_s", "duration_s", "num_gpus", "model", "rank", "micro_batch_per_gpu", "grad_accum",
            "seq_len", "max_slowdown", "tenant"]
    return pd.DataFrame([dict(zip(cols, r)) for r in rows])


def test_jobs_get_whole_sequences_per_gpu_and_a_plan():
    cm = default_cost_model("H100")
    rows = [("a", 0, 3600, 1, "llama3-8b", 8, 2, 1, 1024, 1.5, ""),
            ("b", 1, 3600, 8, "llama3-8b", 16, 1, 2, 2048, 1.5, ""),
            ("c", 2, 3600, 16, "qwen2.5-32b", 64, 4, 1, 1024, 1.5, ""),
            ("d", 3, 3600, 8, "llama3-70b", 16, 1, 1, 2048, 1.5, ""),
            ("e", 4, 3600, 1, "llama3-70b", 16, 1, 1, 2048, 1.5, "")]
    jobs, skipped = build_jobs(_frame(rows), parse_cluster("4x8xH100"), cm)
    assert skipped == {"memory": 1} and [j.job_id for j in jobs] == ["a", "b", "c", "d"]
    for j in jobs:
        par = parse_parallelism(j.parallelism, j.num_gpus)
        assert j.micro_batch_per_gpu >= 1 and j.batch_size % (j.micro_batch_per_gpu * j.grad_accum) == 0
        assert j.batch_size // (j.micro_batch_per_gpu * j.grad_accum) in (par.dp, 1, j.num_gpus, j.num_gpus // 2,
                                                                         j.num_gpus // 4, j.num_gpus // 8)
        # alone, the engine asks the same question: the isolated step is the planner's answer
        assert j.isolated_step_time_s == cm.step_time_s(j.model, "H100", (j.member,), j.num_gpus, "alone")
        assert j.parallelism == cm.parallelism(j.model, "H100", (j.member,), j.num_gpus, "alone")
    a, b = jobs[0], jobs[1]
    assert (a.parallelism, a.batch_size) == ("dp1", 2)
    assert b.grad_accum == 2 and b.batch_size >= 2
    assert jobs[3].parallelism != "dp8"  # 70B has no replica on an H100


def test_legacy_batch_size_column_is_sequences_per_gpu():
    f = _frame([("a", 0, 600, 2, "llama3-8b", 8, 4, 1, 512, 1.5, "")]).drop(columns=["grad_accum"])
    f = f.rename(columns={"micro_batch_per_gpu": "batch_size"})
    jobs, _ = build_jobs(f, parse_cluster("1x8xH100"), default_cost_model("H100"))
    assert jobs[0].micro_batch_per_gpu == 4 and jobs[0].grad_accum == 1
    with pytest.raises(InputError, match="micro_batch_per_gpu"):
        build_jobs(_frame([("a", 0, 600, 1, "llama3-8b", 8, 0, 1, 512, 1.5, "")]), parse_cluster("1x8xH100"),
                   default_cost_model("H100"))


def _predict(*args):
    return subprocess.run([sys.executable, "-m", "tlora_sim.sim.cli.main", "costmodel", "predict", *args],
                          capture_output=True, text=True, timeout=120)


def test_costmodel_predict_ends_with_one_parsable_line():
    r = _predict("--gpu", "H200", "--model", "llama3-8b", "--members", "16:4:1024,8:4:512", "--gpus", "2",
                 "--parallelism", "dp")
    assert r.returncode == 0, r.stderr
    last = dict(kv.split("=") for kv in r.stdout.strip().splitlines()[-1].split())
    assert set(last) == {"step_time_s", "memory_bytes", "parallelism", "measured"}
    assert last["parallelism"] == "dp2" and last["measured"] == "yes"
    cm = make_cost_model("auto", "H200")
    want = cm.predict("llama3-8b", "H200", (Member(16, 4, 1024), Member(8, 4, 512)), 2, "fused", parallelism="dp")
    assert float(last["step_time_s"]) == pytest.approx(want.step_time_s, rel=1e-5)
    r = _predict("--gpu", "H100", "--model", "llama3-8b", "--members", "16:8:1024", "--gpus", "8")
    assert r.returncode == 0 and r.stdout.strip().endswith("measured=no")  # 8 GPUs: extrapolated collectives
    r = _predict("--gpu", "H100", "--model", "llama3-8b", "--members", "16:x:1024")
    assert r.returncode == 2 and "--members" in r.stderr and "Traceback" not in r.stderr


def test_costmodel_predict_artifact_predicts_with_that_file(tmp_path):
    """``--artifact FILE`` (a calibrated artifact) is the model asked: a derived artifact whose
    fused host terms are doubled predicts a slower host-bound fused step than the shipped one, and
    exactly what ``ProfiledCostModel`` of that file predicts; one of another GPU type is refused."""
    from tlora_sim.profiler.calibrate import derive, write_artifact
    from tlora_sim.sim.costmodel.profiled.artifact import artifact_path, load_artifact
    from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel

    art = derive(load_artifact(artifact_path("H200")), {"host_fused": 2.0})
    art["id"] = "h200-test-slow-host"
    path = tmp_path / "slow_host.json"
    write_artifact(art, path)
    args = ("--gpu", "H200", "--model", "llama3-8b", "--members", "16:1:512,8:1:512", "--plan", "fused")
    shipped, slow = _predict(*args), _predict(*args, "--artifact", str(path))
    assert shipped.returncode == 0 and slow.returncode == 0, slow.stderr
    step = {k: float(r.stdout.strip().splitlines()[-1].split()[0].split("=")[1]) for k, r in
            (("shipped", shipped), ("slow", slow))}
    assert "h200-test-slow-host" in slow.stdout
    want = ProfiledCostModel(load_artifact(path)).step_time_s("llama3-8b", "H200", (Member(16, 1, 512), Member(8, 1, 512)),
                                                              1, "fused")
    assert step["slow"] == pytest.approx(want, rel=1e-5) and step["slow"] > 1.3 * step["shipped"]
    other = _predict("--gpu", "H100", "--model", "llama3-8b", "--members", "16:1:512", "--artifact", str(path))
    assert other.returncode == 2 and "H200" in other.stderr and "Traceback" not in other.stderr


@pytest.mark.slow
def test_the_shipped_fit_reproduces_from_its_rows():
    from tlora_sim.profiler.fit_multigpu import validate
    from tlora_sim.sim.costmodel.profiled.artifact import data_dir

    terms, _ = load_multigpu("H200")
    table, s = validate([str(data_dir() / "multigpu")], "H200")
    assert s["rows"] == terms["heldout"]["rows"] == len(table)
    assert s["median_ape"] == pytest.approx(terms["heldout"]["median_ape"], rel=1e-9)
    assert s["host_scale"] == terms["host_scale"] and s["repeat_configs"] > 0
    assert np.isfinite(table.ape).all() and (table.heldout_pred_ms > 0).all()
    json.dumps(s)  # the summary is JSON-ready
