"""Measured over predicted step time of executed runs, by plan, nano-batches and group size.

For each run directory (``tlora-sim execute`` output: ``steps.csv``, ``config.json``), every
steady training step (``event == "step"``; the first step after a build carries its one-off costs
and is left out) is set against the profiled cost model's prediction for the same group
(``sim/executor/steptable.predicted_s``; the executor's planning model). Prints, per run, the
count, median and mean of measured / predicted, by (plan, nano-batches) and by members in the
group; ``--csv`` also writes the per-step rows. This is how the README's "the step model is not"
numbers were made::

    python -m tlora_sim.sim.executor.step_ratio profiler/data/validation/h100_third/{independent,mlora,tlora}
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from tlora_sim.sim.executor.steptable import predicted_s, step_rows
from tlora_sim.sim.executor.validate import load_run
from tlora_sim.sim.executor.workload import executor_cost_model


def predicted_steps(run_dir: Path, artifact: Path | None = None) -> tuple[pd.DataFrame, list, str]:
    """(``steptable.step_rows`` of the executed run ``run_dir`` with ``predicted_s`` (s; from
    ``artifact``, default the shipped one for the run's GPU) and ``ratio`` (``span_s``, the measured
    step, over it), the run's jobs, its GPU type).

    Raises:
        InputError: a file of the run directory is missing or malformed (``validate.load_run``).
    """
    cfg, jobs, steps, _ = load_run(run_dir)
    gpu = cfg["gpu"]["name"] if isinstance(cfg.get("gpu"), dict) and "name" in cfg["gpu"] else "H100"
    st = step_rows(steps)
    st["predicted_s"] = predicted_s(executor_cost_model(gpu, str(artifact) if artifact else None), gpu, jobs, st)
    st["ratio"] = st.span_s / st.predicted_s
    return st, jobs, gpu


def ratios(run_dir: Path, artifact: Path | None = None) -> pd.DataFrame:
    """One row per measured step of the executed run ``run_dir``: run, plan, nano_batches, members,
    measured_s and predicted_s (s; ``predicted_steps``) and their ratio.

    Raises:
        InputError: a file of the run directory is missing or malformed (``validate.load_run``).
    """
    st, _, _ = predicted_steps(run_dir, artifact)
    st["measured_s"] = st.span_s
    st["members"] = st.jobs.astype(str).str.count(";") + 1
    st.insert(0, "run", run_dir.name)
    return st[["run", "plan", "nano_batches", "members", "measured_s", "predicted_s", "ratio"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tlora_sim.sim.executor.step_ratio", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="executed run directories (tlora-sim execute --out)")
    ap.add_argument("--artifact", type=Path, default=None, help="cost-model artifact (default: the shipped one)")
    ap.add_argument("--csv", type=Path, default=None, help="also write every step's row here")
    args = ap.parse_args(argv)
    rows = []
    for d in args.runs:
        if not (d / "steps.csv").is_file():
            ap.error(f"{d}: no steps.csv (not an executed run directory)")
        st = ratios(d, args.artifact)
        rows.append(st)
        print(f"{d}:")
        for by in (["plan", "nano_batches"], ["members"]):
            print(st.groupby(by).ratio.agg(["count", "median", "mean"]).round(3).to_string(), end="\n\n")
    if args.csv:
        pd.concat(rows).to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
