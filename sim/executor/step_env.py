#!/usr/bin/env python3
"""Why do the executor's small steps run slower than the calibration's? (issue 43, one GPU)

The calibration (``sim/executor/calibration.py``) and ``tlora-sim execute`` time the same
``GroupTrainer.step``, yet on the 2026-12-01 H200 leases the executor's 512-2,048-token steps were
9-17% slower than the calibration's points of the same shapes. This script times one set of
host-bound shapes under each condition that differs between the two, in one process and in order,
so the condition that moves the step time shows:

* ``fresh``: a new group of new jobs (what the calibration times): 2 warm-up steps, then ``--reps``;
* ``restored``: the same jobs rebuilt from their saved adapter and AdamW state (what every
  executor group after a regroup is);
* ``gc_off``: ``fresh`` with Python's cyclic collector paused (what the profiler's tables had);
* ``after_exec``: ``fresh`` again after a short in-process ``execute`` run (the executor's
  process state: its imports, its allocator history, its heap);
* ``executor``: the steps of that run itself (``steps.csv``, steady steps), by job shape;
* ``new_process``: ``fresh`` in a new process started at the end (the machine now, without this
  process's history).

Every row carries its time since the start and the share of CPU time stolen by the hypervisor
since the previous row (``/proc/stat``), so a drift of the machine shows apart from the process's.

Writes ``OUT/step_env.csv`` (one row per timed step: condition, shape, k, ms) and
``OUT/step_env_summary.csv`` (median / mean / p10 / p90 per condition and shape), and prints the
summary. Run on the GPU machine from the repository root::

    python3 -m tlora_sim.sim.executor.step_env --out $OUT --trace itp:.device_carry/cluster02.csv.gz
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

import numpy as np
import pandas as pd

#: (label, model, plan, members (rank, sequences, seq_len)): workload A's host-bound shapes
SHAPES = [
    ("alone 16:1:512", "llama3-8b", "alone", [(16, 1, 512)]),
    ("alone 4:2:1024", "llama3-8b", "alone", [(4, 2, 1024)]),
    ("alone 8:1:1024", "llama3-8b", "alone", [(8, 1, 1024)]),
    ("loop 4:2:512,16:1:512", "llama3-8b", "loop", [(4, 2, 512), (16, 1, 512)]),
    ("fused 16:1:512", "llama3-8b", "fused", [(16, 1, 512)]),
]


def cpu_steal() -> tuple[float, float]:
    """(steal, total) jiffies of all CPUs so far (``/proc/stat``; steal: time the hypervisor ran
    another guest while this one wanted the CPU); (0, 0) where unreadable."""
    try:
        f = [float(x) for x in open("/proc/stat").readline().split()[1:]]
        return f[7], sum(f)
    except (OSError, IndexError, ValueError):
        return 0.0, 0.0


def _time_group(trainer, model, plan, members, reps, warm=2):
    g = trainer.group(model, plan, members)
    for _ in range(warm):
        g.step()
    out = [g.step() for _ in range(reps)]
    g.save()
    del g
    trainer.release()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--trace", default="itp:.device_carry/cluster02.csv.gz")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--exec-jobs", type=int, default=6)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU dry run)")
    ap.add_argument("--only-fresh", action="store_true", help="time the fresh condition only (a new process)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    import torch

    from tlora_sim.sim.executor.trainer import DeviceTrainer

    rows = []
    T0 = time.perf_counter()
    last = [cpu_steal()]

    def add(cond, label, ts):
        st, tot = cpu_steal()
        steal = (st - last[0][0]) / max(1e-9, tot - last[0][1])
        last[0] = (st, tot)
        rows.extend({"condition": cond, "shape": label, "k": k, "ms": t, "t_s": time.perf_counter() - T0,
                     "steal_share": steal} for k, t in enumerate(ts))
        t = np.asarray(ts)
        print(f"{cond:11s} {label:24s} median {np.median(t):8.2f} mean {t.mean():8.2f} ms  "
              f"t {time.perf_counter() - T0:6.1f} s steal {100 * steal:5.1f}%", flush=True)

    print("torch threads", torch.get_num_threads(), "gc", gc.get_threshold(), flush=True)
    trainer = DeviceTrainer(a.device, tiny=a.tiny)
    trainer.base("llama3-8b")
    job, ids_of = 0, {}
    conds = ("fresh",) if a.only_fresh else ("fresh", "restored", "gc_off", "fresh2")
    for cond in conds:
        for label, model, plan, mix in SHAPES:
            if cond == "restored":
                ids = ids_of[label]
            else:
                ids = [-1000 - job - i for i in range(len(mix))]
                job += len(mix)
            if cond == "fresh":
                ids_of[label] = ids
            members = [(j, r, b, s) for j, (r, b, s) in zip(ids, mix)]
            if cond == "gc_off":
                gc.collect()
                gc.disable()
            try:
                ts = _time_group(trainer, model, plan, members, a.reps)
            finally:
                gc.enable()
            add(cond, label, ts)
    if a.only_fresh:
        pd.DataFrame(rows).to_csv(a.out / "step_env_fresh_process.csv", index=False)
        return
    # a short in-process execute run (workload A's first jobs, independent), then fresh again
    from tlora_sim.sim.executor.execute import ExecuteConfig, execute

    cfg = ExecuteConfig(trace=a.trace, policy="independent", gpus=1, time_scale=300, device=a.device, tiny=a.tiny,
                        jobs=a.exec_jobs, min_steps=5, max_steps=50, seed=0,
                        lora_dist="profiler/validation/lora_validation.json")
    t0 = time.perf_counter()
    execute(cfg, a.out / "exec_run", force=True, progress=False, plots=False)
    print(f"execute: {time.perf_counter() - t0:.1f} s", flush=True)
    w = pd.read_csv(a.out / "exec_run" / "workload.csv")
    st = pd.read_csv(a.out / "exec_run" / "steps.csv")
    st = st[st.event == "step"].copy()
    st["k"] = st.groupby("jobs").cumcount()
    st = st[st.k > 0]
    for j, grp in st.groupby("jobs"):
        r = w.loc[int(j)]
        add("executor", f"alone {r['rank']}:{r['batch_size']}:{r['seq_len']} j{j}", grp.ms.tolist())
    for label, model, plan, mix in SHAPES:
        members = [(-5000 - job - i, r, b, s) for i, (r, b, s) in enumerate(mix)]
        job += len(mix)
        add("after_exec", label, _time_group(trainer, model, plan, members, a.reps))
    # the same shapes in a new process, now (machine state vs this process's age)
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "tlora_sim.sim.executor.step_env", "--out", str(a.out), "--reps", str(a.reps), "--device", a.device,
                    "--only-fresh"] + (["--tiny"] if a.tiny else []), check=True)
    late = pd.read_csv(a.out / "step_env_fresh_process.csv").assign(condition="new_process")
    df = pd.concat([pd.DataFrame(rows), late], ignore_index=True)
    df.to_csv(a.out / "step_env.csv", index=False)
    s = df.groupby(["condition", "shape"], sort=False).ms.agg(
        median="median", mean="mean", p10=lambda x: x.quantile(0.1), p90=lambda x: x.quantile(0.9), n="count")
    s.to_csv(a.out / "step_env_summary.csv")
    print(s.round(2).to_string())


if __name__ == "__main__":
    main()
