"""The executor's multi-process path on the CPU: one gloo worker process per device
(``--device cpu --gpus 2 --processes``), the code path that ``--device cuda --gpus 2`` runs on two
GPUs with NCCL.

A short synthetic trace with a 2-GPU job among 1-GPU jobs (``synthetic:max_gpus=2,seed=4``: job
2 asks for 2 GPUs) runs under mLoRA on two worker processes: every job trains its steps once, the
2-GPU job's group is data-parallel over both workers (``n_gpus=2``, devices ``0;1``), groups on
the two devices train at the same time on the wall clock, the two adapter copies of a 2-GPU group
stay identical (checksums each worker reports at every save), and ``validate-run`` replays the run.
The worker pool is also driven directly: a member's saved state moves from one worker to another
exactly, and the all-reduce is what keeps the copies equal (without it they differ)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

LORA = str(Path(__file__).resolve().parents[2] / "profiler" / "validation" / "lora_validation.json")
TRACE = "synthetic:max_gpus=2,jobs=40,seed=4"
JOBS = 8


def _need_torch():
    pytest.importorskip("triton")
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed not available")
    return torch


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    _need_torch()
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the workers' threads (two processes, small tensors)
    from tlora_sim.sim.executor.execute import ExecuteConfig, execute

    out = tmp_path_factory.mktemp("multi") / "mlora"
    cfg = ExecuteConfig(trace=TRACE, policy="mlora", gpus=2, device="cpu", tiny=True, jobs=JOBS, min_steps=2,
                        max_steps=8, time_scale=3000, lora_dist=LORA, processes=True)
    execute(cfg, out, progress=False, plots=False)
    return out


def _ids(cell) -> list[int]:
    return [int(i) for i in str(cell).split(";")]


def test_every_job_finishes_once_and_the_two_gpu_group_spans_both_workers(run):
    jobs = pd.read_csv(run / "jobs.csv").set_index("index")
    work = pd.read_csv(run / "workload.csv").set_index("index")
    steps = pd.read_csv(run / "steps.csv")
    assert len(jobs) == JOBS and jobs.finish_time_s.notna().all() and jobs.index.is_unique
    assert (jobs.steps_trained == work.total_steps).all()
    s = steps[steps.event == "step"]
    per_job = pd.Series([i for j in s.jobs for i in _ids(j)]).value_counts().sort_index()
    assert per_job.tolist() == work.total_steps.tolist()  # every real step counted once per member
    for i, row in jobs.iterrows():  # the last step of a job ends it
        mine = s[[i in _ids(j) for j in s.jobs]]
        assert mine.end_s.max() == pytest.approx(row.finish_time_s, abs=1e-9)
    two = work.index[work.num_gpus == 2].tolist()
    assert two  # the trace has a 2-GPU job
    rows = steps[[any(i in _ids(j) for i in two) for j in steps.jobs]]
    assert len(rows) and (rows.n_gpus == 2).all() and set(rows.devices.astype(str)) == {"0;1"}
    assert {"start", "step"} <= set(rows.event)
    ones = steps[steps.n_gpus == 1]
    assert set(ones.devices.astype(str)) == {"0", "1"}  # 1-GPU groups on both workers
    cfg = json.loads((run / "config.json").read_text())
    ex = cfg["executor"]
    assert ex["clock"] == "wall" and ex["processes"] == 2 and ex["backend"] == "gloo" and ex["devices"] == 2
    assert ex["no_multicast"] == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                  "NVSHMEM_DISABLE_NVLS": "1"}
    assert cfg["inputs"]["processes"] is True


def test_groups_on_different_workers_train_at_the_same_time(run):
    s = pd.read_csv(run / "steps.csv")
    s = s[(s.event == "step") & (s.n_gpus == 1)]
    d0, d1 = (s[s.devices.astype(str) == k] for k in ("0", "1"))
    assert len(d0) and len(d1)
    overlap = max(min(a.end_s, b.end_s) - max(a.start_s, b.start_s) for a in d0.itertuples() for b in d1.itertuples())
    assert overlap > 0  # two processes, one step each at once (the wall clock, not interleaved)
    for _dev, rows in s.groupby(s.devices.astype(str)):  # one step at a time per worker
        rows = rows.sort_values("start_s")
        assert (rows.start_s.to_numpy()[1:] >= rows.end_s.to_numpy()[:-1] - 1e-9).all()


def test_adapter_copies_of_a_two_gpu_group_stay_identical(run):
    rep = pd.read_csv(run / "replicas.csv")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["replicas_identical"] and summary["replica_checks"] == len(rep) and summary["processes"] == 2
    both = rep[rep.devices.astype(str) == "0;1"]
    assert len(both)
    for cell in both.checksums:
        a, b = str(cell).split(";")
        assert a == b
    assert rep.identical.all()


def test_validate_run_accepts_the_run(run, tmp_path):
    from tlora_sim.sim.cli.main import main

    assert main(["validate-run", str(run), "--out", str(tmp_path / "v"), "--no-progress"]) == 0
    table = pd.read_csv(tmp_path / "v" / "validation.csv")
    assert table.policy.tolist() == ["mlora"] and table.jobs.tolist() == [JOBS] and table.devices.tolist() == [2]
    assert table.step_times.tolist() == ["measured"] and (table.table_hit_share > 0).all()


def test_worker_pool_moves_state_exactly_and_all_reduce_keeps_copies_equal():
    torch = _need_torch()
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from tlora_sim.sim.executor.workers import WorkerPool, pack_state, shares, unpack_state

    assert shares(3, 2) == [2, 1] and shares(1, 2) == [1, 0] and shares(4, 2) == [2, 2]
    pool = WorkerPool("cpu", 2, tiny=True, threads=1)
    try:
        pool.base("llama3-8b")

        def call(devs, op, *args):
            seq = pool.next_seq()
            for k, d in enumerate(devs):
                pool.send(d, (op, seq, *[a(k) if callable(a) else a for a in args]))
            got = []
            while len(got) < len(devs):
                m = pool.get(120, need=True)
                assert m[1] == seq
                got.append(m)
            return {m[3]: m for m in got}

        # job 5 (rank 8, 3 sequences) data-parallel on both workers: shares 2 and 1, different data
        call((0, 1), "build", 1, (0, 1), "llama3-8b", "loop", lambda k: [(5, 8, shares(3, 2)[k], 512)], {5: None})
        for _ in range(2):
            call((0, 1), "step", 1, 1, 1)
        saved = call((0, 1), "save", 1, lambda k: k == 0)
        assert saved[0][7][0] == saved[1][7][0]  # identical copies after two all-reduced steps
        state = saved[0][7][1][5]
        assert unpack_state(state).steps == 2 and not saved[1][7][1]
        # the same job restored on worker 1 alone: exactly the saved weights and moments
        call((1,), "build", 2, (1,), "llama3-8b", "loop", [(5, 8, 3, 512)], {5: state})
        again = call((1,), "save", 2, True)[1][7]
        assert again[0] == saved[0][7][0]
        back = unpack_state(again[1][5])
        ref = unpack_state(state)
        for f in ("A", "B", "mA", "vA", "mB", "vB"):
            assert getattr(back, f).keys() == getattr(ref, f).keys() and getattr(ref, f)
            for key, v in getattr(ref, f).items():
                assert torch.equal(getattr(back, f)[key], v), (f, key)
        assert unpack_state(pack_state(ref)).A.keys() == ref.A.keys()
        # control: the same start on each worker alone, no all-reduce: the copies drift apart
        for d in (0, 1):
            call((d,), "build", 10 + d, (d,), "llama3-8b", "loop", [(5, 8, shares(3, 2)[d], 512)], {5: state})
            call((d,), "step", 10 + d, 1, 1)
        sums = [call((d,), "save", 10 + d, False)[d][7][0] for d in (0, 1)]
        assert sums[0] != sums[1]
    finally:
        pool.close()
    assert not pool.procs  # both workers stopped
