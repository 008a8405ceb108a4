"""Command-line wiring of ``tlora-sim execute`` and ``tlora-sim validate-run``
(``sim/executor/execute.py`` and ``validate.py`` say what they do)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from tlora_sim.traces.errors import InputError

COMMANDS = ("execute", "validate-run")


def add_parsers(sub) -> None:
    """Add ``execute`` and ``validate-run`` to an ``add_subparsers()`` object."""
    e = sub.add_parser("execute", help="run a scaled-down trace for real under a policy (needs torch)",
                       description="Run the first --jobs jobs of a trace that ask for at most --gpus GPUs as real "
                                   "LoRA training (random weights and tokens, the jobs' model shapes, rank, batch "
                                   "and sequence length), driven by the policy through the same "
                                   "snapshot/actions interface as the simulator: one GPU or the CPU on the wall "
                                   "clock, N GPUs with one worker process each (NCCL; a group on k GPUs runs "
                                   "data-parallel on k workers), or N devices simulated on the CPU (or, with "
                                   "--processes, N gloo worker processes on the CPU). Submit times and durations are "
                                   "divided by --time-scale; each job's total steps are its replay's steps for the "
                                   "scaled duration, clipped to [--min-steps, --max-steps]. Writes a run directory "
                                   "(the replay's files, clock times) plus steps.csv (every measured step and "
                                   "rebuild) and workload.csv (the exact jobs, for validate-run). docs/executor.md "
                                   "says what is real and what is not.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    e.add_argument("--trace", required=True, metavar="SPEC", help="trace spec, as for replay (e.g. itp:PATH)")
    e.add_argument("--policy", required=True, help="policy name (see `tlora-sim policies`)")
    e.add_argument("--columns", metavar="MAP", help="csv format only: submit=COL,gpus=COL and duration=COL or "
                                                   "end=COL[,start=COL] [,job_id=COL][,tenant=COL] (as for replay)")
    e.add_argument("--time-zone", metavar="TZ", help="IANA time zone of naive timestamps in csv and slurm traces "
                                                    "(default: UTC)")
    e.add_argument("--slurm-states", metavar="LIST", help="slurm format: job states kept, comma-separated")
    e.add_argument("--time-unit", default="s", choices=["s", "ms", "min", "h"],
                   help="csv format only: unit of the submit and duration columns")
    e.add_argument("--artifact", type=Path, metavar="FILE",
                   help="cost-model artifact the policies plan with (e.g. from `tlora-sim costmodel calibrate`); "
                        "default: the shipped one of the GPU type")
    e.add_argument("--gpus", type=int, default=1, metavar="N",
                   help="devices; also keeps only jobs asking for at most N GPUs. cuda: 1 in this process, N > 1 "
                        "one worker process per GPU (NCCL, wall clock). cpu: 1 on the wall clock, or N devices "
                        "simulated on the CPU (virtual clock, steps interleaved), or see --processes")
    e.add_argument("--processes", action="store_true",
                   help="one worker process per device on the wall clock (implied by --device cuda --gpus N > 1); with "
                        "--device cpu: N gloo workers, the multi-GPU code path on the CPU (use --tiny)")
    e.add_argument("--out", required=True, type=Path, metavar="DIR", help="run directory to write")
    e.add_argument("--time-scale", type=float, default=1000.0, metavar="X",
                   help="divide submit times (from the first kept job), traced durations and total steps by X")
    e.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where the training runs")
    e.add_argument("--tiny", action="store_true",
                   help="train the tiny model shape on 64x shorter sequences (policies still see the jobs' own); "
                        "with --device cpu a run takes seconds")
    e.add_argument("--jobs", type=int, default=24, metavar="K", help="jobs kept from the trace (the first K)")
    e.add_argument("--skip-jobs", type=int, default=0, metavar="S",
                   help="pass over the first S trace jobs that fit --gpus (a stretch with multi-GPU jobs)")
    e.add_argument("--min-steps", type=int, default=3, help="lower bound of a job's total steps")
    e.add_argument("--max-steps", type=int, default=200, help="upper bound of a job's total steps")
    e.add_argument("--seed", type=int, default=0, help="seed of the LoRA attributes")
    e.add_argument("--lora-dist", default="tlora", metavar="NAME|JSON", help="LoRA attribute distribution")
    e.add_argument("--gpu-type", default=None, help="GPU type of the cost model (default: the device's; H100 on cpu)")
    e.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="policy config override")
    e.add_argument("--memory-fraction", type=float, default=0.85, metavar="F",
                   help="share of the GPU's memory the policies may plan with")
    e.add_argument("--no-warmup", action="store_true", help="do not compile the kernels before the clock starts")
    e.add_argument("--probe-every", type=float, default=2.0, metavar="S",
                   help="time the host-speed probe (a fixed launch-bound eager forward+backward on the training "
                        "device, and a pure-Python loop beside it) every S clock seconds, between steps and while "
                        "idle, into probes.csv: on some hosts the host-bound floor of the eager step drifts during a "
                        "run, and validate-run scales the host terms by it. Costs a few ms per probe on a GPU (the "
                        "share is in perf.json). One device on the wall clock only; 0: no probes")
    e.add_argument("--force", action="store_true", help="replace a non-empty --out")
    e.add_argument("--no-plots", action="store_true", help="skip the run's figures/")
    e.add_argument("--no-progress", action="store_true", help="no progress bar")
    v = sub.add_parser("validate-run", help="replay executed runs in the simulator and compare JCTs job by job",
                       description="For each REAL_DIR written by `tlora-sim execute`, simulate the identical "
                                   "workload (same jobs, steps, arrivals, cluster, policy) with the matching cost "
                                   "model and write DIR/validation.csv (policy, jobs, real_avg_jct_s, sim_avg_jct_s, "
                                   "real_makespan_s, sim_makespan_s, jct_abs_error_p50, jct_abs_error_p90), "
                                   "validation_jobs.csv and validation.png (simulated against real JCT per job, "
                                   "one panel per policy). A cpu run is compared with a table of its own measured "
                                   "step times: that checks the machinery, not a GPU model.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    v.add_argument("real_dirs", nargs="+", type=Path, metavar="REAL_DIR", help="run directories of tlora-sim execute")
    v.add_argument("--out", required=True, type=Path, metavar="DIR", help="validation directory to write")
    v.add_argument("--step-times", choices=("auto", "profiled", "measured"), default="auto",
                   help="the engine's step times: the profiled model of the run's GPU type, or a table of the "
                        "run's own measured steps (auto: profiled for a cuda run, measured for a cpu run)")
    v.add_argument("--artifact", type=Path, metavar="FILE",
                   help="cost-model artifact of the replays' step times (e.g. from `tlora-sim costmodel calibrate` on "
                        "the machine the runs ran on; default: the shipped one); the replayed policies plan with the "
                        "model each run's policy planned with (its config.json's cost_model.artifact), as the runs did")
    v.add_argument("--host-speed", choices=("auto", "probes", "off"), default="auto",
                   help="profiled step times follow the machine's host speed through each run: the host terms x "
                        "probe(t) / the artifact's calibration.probe.ref_ms, from the run's probes.csv (auto: probes "
                        "when every run has probes.csv, the artifact has the reference and step times are "
                        "profiled; measured step times ignore it)")
    v.add_argument("--probe-window", type=float, default=10.0, metavar="S",
                   help="the host factor at a probe is the median probe time within +-S seconds of it, over the "
                        "reference, quantised to 0.5%%")
    v.add_argument("--ignore-probe-cost", action="store_true",
                   help="do not add back what the run's own host-speed probes paused its steps (by default the "
                        "engine's step times are stretched by that share, ~1%% of a busy run probed every 2 s; "
                        "validation.csv's probe_stretch)")
    v.add_argument("--reference", default=None, metavar="POLICY",
                   help="the policy whose avg JCT the others' are divided by (ratio columns; default: independent if "
                        "given, else the first run)")
    v.add_argument("--force", action="store_true", help="replace a non-empty --out")
    v.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    """Run ``execute`` or ``validate-run``; returns the exit status."""
    if args.command == "validate-run":
        from tlora_sim.sim.executor.validate import validate_runs

        table = validate_runs(args.real_dirs, args.out, force=args.force, step_times=args.step_times,
                              progress=not args.no_progress, artifact=args.artifact, reference=args.reference,
                              host_speed=args.host_speed, probe_window_s=args.probe_window,
                              probe_cost=not args.ignore_probe_cost)
        print(table[["policy", "jobs", "real_avg_jct_s", "sim_avg_jct_s", "avg_jct_error", "jct_abs_error_p50",
                     "jct_abs_error_p90", "real_ratio", "sim_ratio", "ratio_error", "step_times"]].to_string(
            index=False, float_format=lambda x: f"{x:.4g}"))
        if (table.host_speed == "probes").all():
            print(f"host speed: probes (window +-{args.probe_window:g} s); host factor p10 / median / p90 per run: "
                  + "; ".join(f"{r.policy} {r.host_factor_p10:.3f} / {r.host_factor_median:.3f} / "
                              f"{r.host_factor_p90:.3f}" for r in table.itertuples()))
        else:
            print("host speed: off (the artifact's host terms throughout)")
        lost = table[~table.planning_as_run.astype(bool)]
        if len(lost):
            print(f"planning model: {len(lost)} run(s) planned with an artifact not found here "
                  f"({', '.join(sorted(set(lost.policy)))}); their replays plan with "
                  f"{lost.planning_cost_model.iloc[0]} instead, so their decisions may differ from the runs'")
        if (table.probe_stretch != 1.0).any():
            print("probe cost: step times x " + ", ".join(f"{r.policy} {r.probe_stretch:.4f} ({r.busy_probes} probes)"
                                                          for r in table.itertuples()))
        print("groups as run (divergence.csv): " + "; ".join(
            f"{r.policy} {round(r.same_groups_share * r.jobs)} of {r.jobs} jobs"
            + (f" (first divergence at {r.first_divergence_s:.1f} s)" if not math.isnan(r.first_divergence_s) else "")
            for r in table.itertuples())
            + ": a replay whose groups differ from the run's adds decision drift to the step model's error")
        print(f"ranking kept: {'yes' if bool(table.ranking_kept.iloc[0]) else 'no'} (real "
              f"{table.real_rank_order.iloc[0]}; simulated {table.sim_rank_order.iloc[0]})")
        print(f"wrote {args.out / 'validation.csv'}")
        return 0
    if not math.isfinite(args.time_scale) or not 1e-6 <= args.time_scale <= 1e9:
        raise InputError(f"--time-scale must be a finite number in [1e-6, 1e9], got {args.time_scale}",
                         field="--time-scale")
    if not math.isfinite(args.memory_fraction):
        raise InputError(f"--memory-fraction must be finite, got {args.memory_fraction}", field="--memory-fraction")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise InputError("`tlora-sim execute` needs torch: pip install 'tlora-sim[profiler]'") from None
    from tlora_sim.sim.executor.execute import ExecuteConfig, check_kernels, execute

    topts = {"time_unit": args.time_unit}
    if args.columns:
        from tlora_sim.traces.generic_csv import parse_column_mapping

        topts["csv_columns"] = parse_column_mapping(args.columns)
    if args.time_zone:
        topts["time_zone"] = args.time_zone
    if args.slurm_states:
        topts["slurm_states"] = args.slurm_states
    if args.artifact is not None:
        from tlora_sim.sim.costmodel.profiled.artifact import load_artifact

        load_artifact(args.artifact)  # checked before any model is built
    opts = {}
    for item in args.option:
        if "=" not in item:
            raise InputError(f"expected KEY=VALUE, got {item!r}", field="--option")
        k, val = item.split("=", 1)
        if "." in k:
            pol, k = k.split(".", 1)
            if pol != args.policy:
                raise InputError(f"option {item!r} names policy {pol!r}, but the policy run is {args.policy!r}",
                                 field="--option")
        opts[k] = val
    cfg = ExecuteConfig(trace=args.trace, policy=args.policy, gpus=args.gpus, time_scale=args.time_scale,
                        device=args.device, tiny=args.tiny, jobs=args.jobs, min_steps=args.min_steps,
                        max_steps=args.max_steps, seed=args.seed, lora_dist=args.lora_dist, gpu_type=args.gpu_type,
                        policy_options=opts, warmup=not args.no_warmup,
                        memory_fraction=args.memory_fraction, processes=args.processes, skip_jobs=args.skip_jobs,
                        artifact=str(args.artifact) if args.artifact else None, trace_options=topts,
                        probe_every_s=args.probe_every)
    check_kernels(cfg)
    s = execute(cfg, args.out, force=args.force, progress=not args.no_progress, plots=not args.no_plots)
    import json

    from tlora_sim.sim.report.rundir_layout import RunDir

    perf = json.loads(RunDir(args.out).perf.read_text())
    probes = (f", {perf['probes']} probes ({perf['probe_share']:.1%} of the wall time)"
              if perf.get("probes") else "")
    print(f"{args.policy}: {s['jobs']} jobs, avg JCT {s['avg_jct_s']:.1f} s, makespan {s['makespan_s']:.1f} s, "
          f"{s['steps_measured']} steps, {s['regroups']} regroups (median pause {s['regroup_pause_median_s']:.3f} s)"
          f"{probes} -> {args.out}")
    return 0
