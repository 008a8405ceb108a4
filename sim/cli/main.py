"""``tlora-sim``: replay cluster traces of LoRA fine-tuning jobs under grouping policies.

Errors in the input print one line naming the file, row and field, and exit with status 2
(no traceback); an impossible simulation state (an invariant violation) exits with status 3 and
prints the events that led to it; SIGINT/SIGTERM/SIGHUP exit with 128 + the signal number and leave
every output file complete or absent (no half-written file, no temp file).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tlora_sim.sim.costmodel.factory import COST_MODELS
from tlora_sim.traces.errors import InputError

def _version() -> str:
    import importlib.metadata as md

    try:
        return md.version("tlora-sim")
    except md.PackageNotFoundError:
        return "unknown (not installed)"


def _lora_names() -> list[str]:
    from tlora_sim.traces.lora import DISTRIBUTIONS

    return sorted(DISTRIBUTIONS)


def _trace_help() -> str:
    from tlora_sim.traces.registry import format_descriptions

    return "trace spec FORMAT:PATH; formats: " + "; ".join(f"{k} ({d})" for k, d in format_descriptions().items())


TRACE_HELP = _trace_help()


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, metavar="SPEC", help=TRACE_HELP)
    p.add_argument("--cluster", default="16x8xH100", metavar="NODESxGPUSxTYPE",
                   help="cluster shape, GPU type H100, H200 or A100 (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the LoRA attribute assignment (default: %(default)s)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output directory")
    p.add_argument("--lora-dist", default="tlora", metavar="NAME|JSON",
                   help="LoRA attribute distribution: a registered name (" + ", ".join(_lora_names()) +
                        ") or a JSON file like docs/examples/lora_70b.json (default: %(default)s)")
    p.add_argument("--columns", metavar="MAP", help="csv format only: submit=COL,gpus=COL and duration=COL or "
                                                   "end=COL[,start=COL] [,job_id=COL][,tenant=COL]")
    p.add_argument("--time-zone", metavar="TZ", help="IANA time zone of naive timestamps in csv and slurm traces "
                                                    "(default: UTC), e.g. America/Los_Angeles")
    p.add_argument("--slurm-states", metavar="LIST", help="slurm format: job states kept, comma-separated "
                                                          "(default: COMPLETED,FAILED,TIMEOUT,CANCELLED,"
                                                          "OUT_OF_MEMORY,NODE_FAIL)")
    p.add_argument("--time-unit", default="s", choices=["s", "ms", "min", "h"],
                   help="csv format only: unit of the submit and duration columns (default: %(default)s)")
    p.add_argument("--regroup-pause", type=float, default=30.0, metavar="S",
                   help="pause of a group when members join or are preempted, s (default: %(default)s)")
    p.add_argument("--policy-module", action="append", default=[], metavar="PATH_OR_MODULE",
                   help="import a policy module (a .py file or a dotted module name) before resolving "
                        "policy names, so policies written outside the repo can run (repeatable; "
                        "docs/writing-a-policy.md)")
    p.add_argument("--option", action="append", default=[], metavar="[POLICY.]KEY=VALUE",
                   help="policy config override, e.g. tlora.max_group_size=8 (repeatable)")
    p.add_argument("--cost-model", default="auto", choices=list(COST_MODELS),
                   help="; ".join(f"{k}: {v}" for k, v in COST_MODELS.items()) + " (default: %(default)s)")
    p.add_argument("--sweeps", metavar="FRACTION:K1,K2",
                   help="expand this fraction of jobs into hyper-parameter sweeps of K configurations "
                        "(ALTO workloads), e.g. 0.3:4,8; applies to every policy alike")
    p.add_argument("--early-exit", action="store_true",
                   help="stop weak configurations of sweep families early (ALTO's rule, given to every policy run; "
                        "stopped configurations are reported apart, never as completed jobs)")
    p.add_argument("--strict", action="store_true",
                   help="turn documented skips into errors: jobs larger than the cluster or its GPU memory, "
                        "rows a trace reader drops (zero duration, Philly exact duplicates)")
    p.add_argument("--no-invariants", action="store_true",
                   help="do not check simulation invariants while running (for benchmarks; results are identical)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-plots", action="store_true", help="skip figures (replay only)")
    p.add_argument("--force", action="store_true",
                   help="replace an --out directory that already holds files (without it such a directory is "
                        "refused; the new directory replaces it only once complete)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (sub-commands replay, compare, traces, policies, plot)."""
    ap = argparse.ArgumentParser(prog="tlora-sim", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    ap.add_argument("-q", "--quiet", action="store_true", help="only errors and the final tables (no progress bars, "
                                                               "no per-policy coverage lines)")
    ap.add_argument("-v", "--verbose", action="count", default=0, help="more log lines (-v info, -vv debug)")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from tlora_sim.sim.cli.costmodel import add_parsers as add_costmodel_parsers

    add_costmodel_parsers(sub)
    from tlora_sim.sim.cli.execute import add_parsers as add_execute_parsers

    add_execute_parsers(sub)
    from tlora_sim.sim.experiments.sweep import add_sweep_parser

    add_sweep_parser(sub)
    r = sub.add_parser("replay", help="simulate one trace under one policy; writes a run directory",
                       description="Simulate one trace under one policy. Writes DIR/config.json, jobs.csv, "
                                   "timeline.csv, summary.json, perf.json and figures/.")
    r.add_argument("--policy", required=True, help="policy name (see `tlora-sim policies`)")
    _add_common(r)
    c = sub.add_parser("compare", help="simulate one trace under several policies side by side",
                       description="Simulate one trace under several policies. Writes DIR/summary.csv "
                                   "(one row per policy), DIR/<policy>/ run directories and DIR/figures/.")
    c.add_argument("--policies", required=True, help="comma-separated policy names, e.g. independent,mlora,tlora")
    c.add_argument("--seeds", metavar="LIST", help="run every policy under several seeds, e.g. 0-4 or 0,3,7: "
                                                 "OUT/seed-<s>/ per seed, OUT/summary.csv with each metric's mean "
                                                 "and 95%% confidence half-width (<metric>_ci95)")
    c.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                   help="policies simulated in parallel processes")
    c.add_argument("--decompose", action="store_true",
                   help="run each grouping policy's ladder eager-alone (independent-backfill) -> fused-alone "
                        "(independent-fused) -> + its order (POLICY-nogroup) -> + grouping (POLICY); "
                        "summary.csv and decompose.csv give each step's speed-up")
    _add_common(c)
    t = sub.add_parser("traces", help="inspect traces")
    tsub = t.add_subparsers(dest="traces_command", required=True, metavar="ACTION")
    d = tsub.add_parser("describe", help="jobs, span, GPU and duration percentiles of a trace")
    d.add_argument("spec", metavar="SPEC", help=TRACE_HELP)
    d.add_argument("--columns", metavar="MAP", help="csv format only: submit=COL,gpus=COL and duration=COL or "
                                                   "end=COL[,start=COL] [,job_id=COL][,tenant=COL]")
    d.add_argument("--time-unit", default="s", choices=["s", "ms", "min", "h"])
    po = sub.add_parser("policies", help="list registered policies: name, then a one-line description")
    po.add_argument("--policy-module", action="append", default=[], metavar="PATH_OR_MODULE",
                    help="also list the policies a module registers (repeatable)")
    pl = sub.add_parser("plot", help="redraw every figure of a run or comparison directory from its files")
    pl.add_argument("directory", type=Path, metavar="RUN_OR_COMPARE_DIR")
    pl.add_argument("--format", default="pdf,png", help="comma-separated figure formats")
    return ap


def _options(items: list[str], policies: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {p: {} for p in policies}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise InputError(f"expected [POLICY.]KEY=VALUE, got {item!r}", field="--option")
        pol, dot, name = key.rpartition(".")
        targets = [pol] if dot else policies
        for p in targets:
            if p not in out:
                raise InputError(f"--option names policy {p!r}, which is not being run", field="--option")
            out[p][name] = val
    return out


def _base_config(args, policy: str):
    import math

    from tlora_sim.sim.experiments.replay import ReplayConfig
    from tlora_sim.traces.generic_csv import parse_column_mapping

    if not (math.isfinite(args.regroup_pause) and args.regroup_pause >= 0):
        raise InputError(f"must be a finite number of seconds >= 0, got {args.regroup_pause}", field="--regroup-pause")
    if args.seed < 0:
        raise InputError(f"must be >= 0, got {args.seed}", field="--seed")

    return ReplayConfig(trace=args.trace, policy=policy, cluster=args.cluster, seed=args.seed,
                        lora_dist=args.lora_dist, regroup_pause_s=args.regroup_pause,
                        csv_columns=parse_column_mapping(args.columns) if args.columns else None,
                        time_unit=args.time_unit, strict=args.strict, sweeps=args.sweeps,
                        cost_model=args.cost_model, policy_modules=tuple(_module_specs(args.policy_module)),
                        early_exit=args.early_exit, time_zone=args.time_zone, slurm_states=args.slurm_states)


def _coverage(args, line: str) -> None:
    """The per-policy coverage line: stdout, unless --quiet; its warning also goes to the log."""
    import logging

    if "WARNING" in line:
        logging.getLogger("tlora_sim").warning(line.split(" -- WARNING: ")[0] + " (extrapolation above 5%)")
    if not args.quiet:
        print(line)


def _skipped_of(run_dir: Path) -> dict:
    import json

    from tlora_sim.sim.report.rundir_layout import RunDir

    return json.loads(RunDir(run_dir).summary.read_text()).get("skipped", {})


def _module_specs(specs: list[str]) -> list[str]:
    """``--policy-module`` values with file paths made absolute (worker processes may run elsewhere)."""
    from tlora_sim.policies.registry import policy_module_spec

    return [policy_module_spec(m) for m in specs]


def _run(args) -> int:
    if args.command == "replay":
        from tlora_sim.sim.experiments.replay import replay

        cfg = _base_config(args, args.policy)
        opts = _options(args.option, [args.policy])[args.policy]
        from dataclasses import replace

        s = replay(replace(cfg, policy_options=opts), args.out, progress=not args.no_progress,
                   plots=not args.no_plots, check_invariants=not args.no_invariants, force=args.force)
        from tlora_sim.sim.experiments.replay import coverage_line

        _coverage(args, coverage_line(args.policy, s))
        print(f"{args.policy}: {s['jobs']} jobs, avg JCT {s['avg_jct_s'] / 3600:.2f} h, p90 JCT "
              f"{s['p90_jct_s'] / 3600:.2f} h, throughput {s['throughput_tokens_per_s']:.0f} tokens/s, "
              f"GPU alloc {s['gpu_alloc_util']:.1%}, compute {s['gpu_compute_util']:.1%} -> {args.out}")
    elif args.command == "compare":
        from tlora_sim.sim.experiments.replay import compare

        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        if not policies:
            raise InputError("no policies given", field="--policies")
        kw = dict(workers=args.workers, progress=not args.no_progress, policy_options=_options(args.option, policies),
                  check_invariants=not args.no_invariants, force=args.force)
        if args.decompose:
            from tlora_sim.sim.experiments import decompose
            from tlora_sim.sim.experiments.seeds import parse_seeds

            kw["policy_options"] = _options(args.option, decompose.ladder_runs(policies))
            ladder = decompose.compare_decomposed(_base_config(args, policies[0]), policies, args.out,
                                                  seeds=parse_seeds(args.seeds) if args.seeds else None, **kw)
            print(decompose.format_ladder(ladder))
            print(f"wrote {args.out / 'summary.csv'} and {args.out / decompose.LADDER_FILE}")
            return 0
        if args.seeds:
            from tlora_sim.sim.experiments.seeds import compare_seeds, parse_seeds

            table = compare_seeds(_base_config(args, policies[0]), policies, args.out, parse_seeds(args.seeds), **kw)
            cols = ["policy", "seeds", "jobs", "avg_jct_s", "avg_jct_s_ci95", "p90_jct_s", "p90_jct_s_ci95",
                    "avg_queue_s", "throughput_tokens_per_s"]
            print(table[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
            print(f"wrote {args.out / 'summary.csv'}")
            return 0
        table = compare(_base_config(args, policies[0]), policies, args.out, **kw)
        from tlora_sim.sim.experiments.replay import coverage_line

        for row in table.to_dict("records"):
            row["skipped"] = _skipped_of(args.out / row["policy"])
            _coverage(args, coverage_line(row["policy"], row))
        cols = ["policy", "jobs", "avg_jct_s", "p90_jct_s", "avg_queue_s", "throughput_tokens_per_s",
                "gpu_alloc_util", "gpu_compute_util"]
        print(table[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
        print(f"wrote {args.out / 'summary.csv'}")
    elif args.command == "traces":
        from tlora_sim.traces import read_trace
        from tlora_sim.traces.describe import describe_trace, format_description
        from tlora_sim.traces.generic_csv import parse_column_mapping

        cols = parse_column_mapping(args.columns) if args.columns else None
        print(format_description(describe_trace(read_trace(args.spec, csv_columns=cols, time_unit=args.time_unit))))
    elif args.command == "policies":
        from tlora_sim.policies.registry import available, load_policy_module

        for module in _module_specs(args.policy_module):
            load_policy_module(module)
        for e in available():
            print(f"{e.name}\t{e.description}")
    elif args.command == "sweep":
        from tlora_sim.sim.experiments.sweep import run_sweep_command

        return run_sweep_command(args)
    elif args.command in ("profile", "costmodel"):
        from tlora_sim.sim.cli.costmodel import run as run_costmodel

        return run_costmodel(args)
    elif args.command in ("execute", "validate-run"):
        from tlora_sim.sim.cli.execute import run as run_execute

        return run_execute(args)
    elif args.command == "plot":
        from tlora_sim.sim.report.plots import plot_any

        formats = tuple(f.strip() for f in args.format.split(",") if f.strip())
        for f in plot_any(args.directory, formats=formats):
            print(f)
    return 0


def _interrupted_by(e: BaseException) -> int | None:
    """The signal number if ``e`` was raised while an interruption (``KeyboardInterrupt``, e.g.
    ``rundir.Interrupted``) was unwinding: found in its ``__context__``/``__cause__`` chain."""
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        if isinstance(x, KeyboardInterrupt):
            return getattr(x, "signum", 2)
        x = x.__cause__ or x.__context__
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tlora-sim`` console script; returns the exit status."""
    from tlora_sim.sim.report.rundir import signals_raise_interrupt

    import logging

    args = build_parser().parse_args(argv)
    level = logging.ERROR if args.quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="tlora-sim: %(levelname)s: %(message)s", stream=sys.stderr)
    if hasattr(args, "no_progress") and (args.quiet or not sys.stderr.isatty()):
        args.no_progress = True  # progress bars only on a terminal: no escape codes in logs
    try:
        with signals_raise_interrupt():
            return _run(args)
    except InputError as e:
        print(f"tlora-sim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", 2)  # plain KeyboardInterrupt: SIGINT
        print(f"tlora-sim: interrupted (signal {signum}); finished files are complete, unfinished ones were "
              f"not written", file=sys.stderr)
        return 128 + signum
    except Exception as e:  # an engine invariant or a bug: one line, the class says which
        from tlora_sim.sim.core.engine import InvariantError

        signum = _interrupted_by(e)
        if signum is not None:  # a library failed while unwinding from a signal (e.g. a PDF half-compressed)
            print(f"tlora-sim: interrupted (signal {signum}); finished files are complete, unfinished ones were "
                  f"not written", file=sys.stderr)
            return 128 + signum
        if isinstance(e, InvariantError):
            print(f"tlora-sim: invariant violated: {e}", file=sys.stderr)
            return 3
        raise


if __name__ == "__main__":
    sys.exit(main())
