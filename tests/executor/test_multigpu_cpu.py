"""The multi-GPU profiler's code paths on the CPU: two processes over gloo, the tiny model.

Runs ``python -m tlora_sim.profiler.multigpu --device cpu --tiny`` (the same code the GPU profile
runs, NCCL swapped for gloo) and checks what it wrote: collective rows for every op and size,
every parallelism's steps with ``n_gpus=2``, and tLoRA's nano-batch rows.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("torch")


def test_tiny_profile_on_two_cpu_processes(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, "-m", "tlora_sim.profiler.multigpu", "--device", "cpu", "--tiny",
                        "--max-adapters", "2", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    df = pd.read_csv(tmp_path / "multigpu_cpu.csv")
    assert (df["n_gpus"] == 2).all()
    coll = df[df.kind == "collective"]
    assert set(coll.op) == {"all_reduce", "all_gather", "reduce_scatter"} and len(coll) == 9
    assert (coll.time_ms > 0).all() and (coll.busbw_gbs > 0).all()
    steps = df[df.kind == "step"]
    assert steps.error.isna().all(), steps.error.dropna().tolist()
    assert set(steps.parallelism) == {"dp", "local", "fsdp", "tp"}
    assert (steps.step_ms > 0).all()
    # dp: every adapter's sequences split over the two GPUs, never a sequence
    dp = steps[(steps.parallelism == "dp") & (steps.n_adapters == 2)]
    assert set(dp.nano_batches) == {1, 2, 4, 8}
    assert (dp.batch_sizes == "2;2").all() and (dp.micro_batch_per_gpu == "1;1").all()
    # rank-local adapters: no gradient all-reduce, each GPU trains its own adapter alone
    loc = steps[(steps.parallelism == "local") & (steps.n_adapters == 2)]
    assert (loc.tokens_per_gpu == 16).all()
