#!/usr/bin/env python3
"""Does the host-bound step floor drift with time on one machine? (issue 43, one GPU)

``step_env.py`` found the same small step 20-45% slower a few minutes later, in a new process as
much as in the old one. This script watches that directly: for ``--seconds`` it repeats, in one
process, a probe round of

* ``alone 16:1:512`` and ``fused 16:1:512`` (llama3-8b): a fresh group, 2 warm-up steps, then
  ``--reps`` timed steps (``GroupTrainer.step``, what ``execute`` and the calibration time);
* ``python_loop``: a fixed pure-Python loop (no torch), the host CPU's own speed;
* the CPUs' mean clock (``/proc/cpuinfo`` ``cpu MHz``) and the GPU's SM clock (NVML, if present).

Writes ``OUT/step_drift.csv`` (one row per probe round and shape: t_s, median_ms, mean_ms,
python_loop_ms, cpu_mhz, gpu_sm_mhz) and prints each round. Run from the repository root::

    python3 -m tlora_sim.sim.executor.step_drift --out $OUT --seconds 240
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

PROBES = [("alone 16:1:512", "alone", [(16, 1, 512)]), ("fused 16:1:512", "fused", [(16, 1, 512)])]


def cpu_mhz() -> float:
    """Mean ``cpu MHz`` over ``/proc/cpuinfo`` (NaN where absent)."""
    try:
        v = [float(line.split(":")[1]) for line in open("/proc/cpuinfo") if line.startswith("cpu MHz")]
        return float(np.mean(v)) if v else float("nan")
    except OSError:
        return float("nan")


def python_loop_ms(n: int = 300_000) -> float:
    """Wall ms of a fixed pure-Python loop (the host's single-thread speed)."""
    t0 = time.perf_counter()
    s = 0
    for i in range(n):
        s += i * i % 7
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=240.0)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU dry run)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    from tlora_sim.sim.executor.trainer import DeviceTrainer

    nvml = None
    try:
        import pynvml

        pynvml.nvmlInit()
        nvml = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # no NVML: the GPU clock column stays NaN
        nvml = None
    trainer = DeviceTrainer(a.device, tiny=a.tiny)
    trainer.base("llama3-8b")
    rows, job, t0 = [], 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        loop = min(python_loop_ms() for _ in range(3))
        for label, plan, mix in PROBES:
            members = [(-1 - job - i, r, b, s) for i, (r, b, s) in enumerate(mix)]
            job += len(mix)
            g = trainer.group("llama3-8b", plan, members)
            g.step()
            g.step()
            ts = np.asarray([g.step() for _ in range(a.reps)])
            del g
            trainer.states.clear()
            trainer.release()
            sm = float(pynvml.nvmlDeviceGetClockInfo(nvml, pynvml.NVML_CLOCK_SM)) if nvml else float("nan")
            rows.append({"t_s": time.perf_counter() - t0, "shape": label, "median_ms": float(np.median(ts)),
                         "mean_ms": float(ts.mean()), "python_loop_ms": loop, "cpu_mhz": cpu_mhz(),
                         "gpu_sm_mhz": sm})
            r = rows[-1]
            print(f"t {r['t_s']:6.1f} s  {label:16s} median {r['median_ms']:7.1f} ms  python loop {loop:6.1f} ms  "
                  f"cpu {r['cpu_mhz']:7.1f} MHz  gpu {sm:6.0f} MHz", flush=True)
        pd.DataFrame(rows).to_csv(a.out / "step_drift.csv", index=False)
    df = pd.DataFrame(rows)
    for label, grp in df.groupby("shape"):
        c = np.corrcoef(grp.median_ms, grp.python_loop_ms)[0, 1] if len(grp) > 2 else float("nan")
        print(f"{label}: median {grp.median_ms.min():.1f}-{grp.median_ms.max():.1f} ms over {len(grp)} rounds; "
              f"python loop {grp.python_loop_ms.min():.1f}-{grp.python_loop_ms.max():.1f} ms; corr {c:.2f}")


if __name__ == "__main__":
    main()
