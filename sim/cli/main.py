"""``tlora-sim``: replay cluster traces of LoRA fine-tuning jobs under grouping policies.

Errors in the input print one line naming the file, row and field, and exit with status 2
(no traceback); an impossible simulation state (an invariant violation) exits with status 3 and
prints the events that led to it; SIGINT/SIGTERM/SIGHUP exit with 128 + the signal number and leave
every output file complete or absent (no half-written file, no temp file).
"""

from __future__ import annotations

import os
import signal
import sys


def _exit_on_signal(signum: int, _frame=None) -> None:
    """Until ``main`` installs ``runtime.signals.signals_raise_interrupt``: nothing is written yet, so a
    SIGINT/SIGTERM/SIGHUP during start-up ends the process at once with 128 + the signal number
    (not killed by the signal: status -15 from the default handler)."""
    os._exit(128 + signum)


if __name__ == "__main__" or os.path.basename(sys.argv[0] or "") == "tlora-sim":  # the command, not an import
    for _sig in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")):
        if _sig is not None:
            signal.signal(_sig, _exit_on_signal)

import argparse  # noqa: E402 - after the start-up signal handlers
from pathlib import Path  # noqa: E402

from tlora_sim.traces.errors import InputError  # noqa: E402

def _version() -> str:
    import importlib.metadata as md

    try:
        return md.version("tlora-sim")
    except md.PackageNotFoundError:
        return "unknown (not installed)"


def _trace_help() -> str:
    from tlora_sim.sim.experiments.spec import trace_help

    return trace_help()


TRACE_HELP = _trace_help()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (sub-commands replay, compare, traces, policies, plot)."""
    ap = argparse.ArgumentParser(prog="tlora-sim", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    _add_verbosity(ap, top=True)
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
    from tlora_sim.sim.experiments.spec import add_flags

    add_flags(r, "replay")  # every flag from the experiment spec's fields (sim/experiments/spec.py)
    c = sub.add_parser("compare", help="simulate one trace under several policies side by side",
                       description="Simulate one trace under several policies. Writes DIR/summary.csv "
                                   "(one row per policy), DIR/<policy>/ run directories and DIR/figures/.")
    add_flags(c, "compare")
    t = sub.add_parser("traces", help="inspect traces")
    tsub = t.add_subparsers(dest="traces_command", required=True, metavar="ACTION")
    d = tsub.add_parser("describe", help="jobs, span, GPU and duration percentiles of a trace")
    d.add_argument("spec", metavar="SPEC", help=TRACE_HELP)
    add_flags(d, "describe")
    po = sub.add_parser("policies", help="list registered policies, one per line: name, a one-line description "
                                         "and its options (--option POLICY.KEY=VALUE) with their defaults, "
                                         "tab-separated")
    po.add_argument("--policy-module", action="append", default=[], metavar="PATH_OR_MODULE",
                    help="also list the policies a module registers (repeatable)")
    pl = sub.add_parser("plot", help="redraw every figure of a run or comparison directory from its files")
    pl.add_argument("directory", type=Path, metavar="RUN_OR_COMPARE_DIR")
    pl.add_argument("--format", default="pdf,png", help="comma-separated figure formats")
    pl.add_argument("--policies", metavar="LIST", help="comparison directories: only these policies, comma-separated "
                                                       "(default: all)")
    pl.add_argument("--metrics", metavar="LIST", help="bar figures: only these summary columns, comma-separated, "
                                                      "e.g. avg_jct_s,throughput_tokens_per_s (default: all)")
    pl.add_argument("--size", metavar="WxH", help="figure size in inches, e.g. 7x3 (default: each figure's own, "
                                                  "one-column width)")
    _add_verbosity_everywhere(ap)
    return ap


def _add_verbosity(p: argparse.ArgumentParser, top: bool = False) -> None:
    """``-q``/``-v`` on ``p``; on a sub-command (``top`` False) they default to nothing, so the values
    given before the sub-command stand unless repeated after it."""
    extra = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars and no info lines; the tables, "
                   "the kept/skipped line of each run and fidelity warnings are still printed",
                   **({"default": False} if top else extra))
    p.add_argument("-v", "--verbose", action="count", help="more log lines (-v info, -vv debug)",
                   **({"default": 0} if top else extra))


def _add_verbosity_everywhere(p: argparse.ArgumentParser) -> None:
    """Accept ``-q``/``-v`` after every sub-command too (``tlora-sim replay ... -q``)."""
    for action in p._actions:  # argparse keeps sub-parsers only there
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                if not any("-q" in a.option_strings for a in sub._actions):
                    _add_verbosity(sub)
                _add_verbosity_everywhere(sub)


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


def _inputs_outside_out(args) -> None:
    """Refuse an input file inside ``--out`` (the trace, a LoRA distribution or policy module
    file): replacing ``--out`` with ``--force`` would delete it with the old run.

    Raises:
        InputError: naming the input file and ``--out``.
    """
    out = Path(args.out).resolve()
    trace = str(getattr(args, "trace", "") or "")
    candidates = [("--trace", trace.partition(":")[2] if ":" in trace else trace),
                  ("--lora-dist", str(getattr(args, "lora_dist", "") or ""))]
    candidates += [("--policy-module", m) for m in getattr(args, "policy_modules", []) or []]
    for flag, name in candidates:
        if not name or not os.path.exists(name):
            continue
        path = Path(name).resolve()
        if path == out or out in path.parents:
            raise InputError(f"is inside --out {args.out}; writing the run there would replace it (choose "
                             f"another --out)", file=name, field=flag)


def _base_config(args, policy: str, options: dict | None = None):
    """The experiment spec of the command line for ``policy`` (``spec.spec_from_args``: every flag
    through its field's check), after refusing inputs inside ``--out``."""
    from tlora_sim.sim.experiments.spec import spec_from_args

    spec = spec_from_args(args, args.command, policy, options)
    _inputs_outside_out(args)
    return spec


def _coverage(args, line: str) -> None:
    """The per-policy kept/skipped line: stdout, also under ``--quiet`` (it is part of the answer)."""
    print(line)


def _fidelity_warning(summaries: dict[str, dict], cluster: str, cost_model: str) -> None:
    """The fidelity warning and the host-bound note, once each, on stderr (also under ``--quiet``),
    from the runs' summaries."""
    from tlora_sim.sim.core.cluster import parse_cluster
    from tlora_sim.sim.experiments.fidelity import host_bound_text, warning_text

    spec = parse_cluster(cluster)
    shares = {p: s.get("extrapolated_gpu_time_share", {}) or {} for p, s in summaries.items()}
    totals = {p: float(s.get("extrapolated_gpu_time_share_total", 0.0) or 0.0) for p, s in summaries.items()}
    name = next((s.get("cost_model") for s in summaries.values() if s.get("cost_model")), cost_model)
    text = warning_text(shares, totals, spec.gpu.name, spec.gpus_per_node, str(name))
    if text:
        print(f"tlora-sim: warning: {text}", file=sys.stderr)
    note = host_bound_text({p: s.get("host_bound_gpu_time_share") for p, s in summaries.items()}, str(name),
                           spec.gpu.name)
    if note:
        print(f"tlora-sim: note: {note}", file=sys.stderr)


def _header(args, policies: list[str], added: bool) -> None:
    """What the comparison is against: the reference and the discipline (the first line printed, once the
    numbers are in: a run refused for bad input prints nothing on stdout)."""
    from tlora_sim.sim.experiments.replay import REFERENCE

    ref = args.reference or REFERENCE
    words = {"default": "each policy's own priority order, the reference's EASY backfilling",
             "shared": "the reference's FIFO order and EASY backfilling for every policy",
             "native": "each system's published discipline"}[args.discipline]
    print(f"compare: {', '.join(policies)} on {args.cluster}; reference {ref}"
          f"{' (added)' if added else ''}; discipline {args.discipline} ({words}); speed-ups are against {ref}")


def _print_replay(args, s: dict) -> None:
    """A replay's lines: kept/skipped, the fidelity warning (stderr), then the numbers."""
    from tlora_sim.sim.experiments.replay import coverage_line
    from tlora_sim.sim.report.tables import fmt_number

    _coverage(args, coverage_line(args.policy, s))
    _fidelity_warning({args.policy: s}, args.cluster, args.cost_model)
    print(f"{args.policy}: {s['jobs']} jobs, avg JCT {fmt_number(s['avg_jct_s'] / 3600)} h, p90 JCT "
          f"{fmt_number(s['p90_jct_s'] / 3600)} h, throughput {fmt_number(s['throughput_tokens_per_s'])} tokens/s, "
          f"GPU alloc {s['gpu_alloc_util']:.1%}, compute {s['gpu_compute_util']:.1%} -> {args.out}")


def _module_specs(specs: list[str]) -> list[str]:
    """``--policy-module`` values with file paths made absolute (worker processes may run elsewhere)."""
    from tlora_sim.policies.registry import policy_module_spec

    return [policy_module_spec(m) for m in specs]


def _run(args) -> int:
    if args.command == "replay":
        from tlora_sim.sim.experiments.replay import replay

        cfg = _base_config(args, args.policy, _options(args.policy_options, [args.policy])[args.policy])
        replay(cfg, args.out, progress=not args.no_progress,
                   plots=not args.no_plots, check_invariants=not args.no_invariants, force=args.force,
                   on_summary=lambda s: _print_replay(args, s))
    elif args.command == "compare":
        from tlora_sim.sim.experiments.replay import REFERENCE, compare, with_reference

        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        if not policies:
            raise InputError("no policies given", field="--policies")
        dup = sorted({p for p in policies if policies.count(p) > 1})
        if dup:  # two runs would share one run directory OUT/<policy>
            raise InputError(f"policy {dup[0]!r} given twice", field="--policies")
        if args.workers < 1:
            raise InputError(f"must be >= 1, got {args.workers}", field="--workers")
        ref = args.reference or REFERENCE
        run_policies, added = with_reference(policies, ref)
        kw = dict(workers=args.workers, progress=not args.no_progress,
                  policy_options=_options(args.policy_options, run_policies), check_invariants=not args.no_invariants,
                  force=args.force, reference=ref, discipline=args.discipline, plots=not args.no_plots)
        from tlora_sim.sim.experiments.replay import coverage_line
        from tlora_sim.sim.report.tables import format_table

        if args.decompose:
            from tlora_sim.sim.experiments import decompose
            from tlora_sim.sim.experiments.seeds import parse_seeds

            kw["policy_options"] = _options(args.policy_options, decompose.ladder_runs(policies))
            ladder = decompose.compare_decomposed(
                _base_config(args, policies[0]), policies, args.out,
                seeds=parse_seeds(args.seeds) if args.seeds is not None else None, **kw)
            print(decompose.format_ladder(ladder))
            print(f"wrote {args.out / 'summary.csv'} and {args.out / decompose.LADDER_FILE}")
            return 0
        def printed(table, summaries):
            _header(args, run_policies, added)
            for pol, s in summaries.items():
                _coverage(args, coverage_line(pol, s))
            _fidelity_warning(summaries, args.cluster, args.cost_model)
            print(format_table(table))
            over = f" (mean and 95% CI over {int(table['seeds'].max())} seeds)" if args.seeds is not None else ""
            print(f"wrote {args.out / 'summary.csv'}{over}")

        if args.seeds is not None:  # --seeds='' is an error, not an unseeded run
            from tlora_sim.sim.experiments.seeds import compare_seeds, parse_seeds

            seeds = parse_seeds(args.seeds)  # range and emptiness, before any run
            compare_seeds(_base_config(args, policies[0]), policies, args.out, seeds, on_table=printed, **kw)
            return 0
        compare(_base_config(args, policies[0]), policies, args.out, on_table=printed, **kw)
    elif args.command == "traces":
        from tlora_sim.traces import read_trace
        from tlora_sim.traces.describe import describe_trace, format_description
        from tlora_sim.traces.generic_csv import parse_column_mapping

        cols = parse_column_mapping(args.csv_columns) if args.csv_columns else None
        print(format_description(describe_trace(read_trace(
            args.spec, csv_columns=cols, time_unit=args.time_unit, time_zone=args.time_zone,
            slurm_states=args.slurm_states, keep_states=args.keep_states, window=args.window,
            first_jobs=args.first_jobs, arrival_scale=args.arrival_scale))))
    elif args.command == "policies":
        from tlora_sim.policies.registry import available, broken_entry_points, load_policy_module

        for module in _module_specs(args.policy_module):
            load_policy_module(module)
        import dataclasses

        for e in available():  # name, description, then the --option POLICY.KEY=VALUE keys and their defaults
            opts = [f"{f.name}={getattr(e.config_cls(), f.name)!r}" for f in dataclasses.fields(e.config_cls)]
            print(f"{e.name}\t{e.description}" + (f"\toptions: {', '.join(opts)}" if opts else ""))
        for line in broken_entry_points():  # listed, not fatal: the other policies work
            print(f"tlora-sim: warning: {line}", file=sys.stderr)
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

        from tlora_sim.sim.report.plots import parse_size

        formats = tuple(f.strip() for f in args.format.split(",") if f.strip())
        def split(v):
            return [x.strip() for x in v.split(",") if x.strip()] or None

        for f in plot_any(args.directory, formats=formats, policies=split(args.policies) if args.policies else None,
                          metrics=split(args.metrics) if args.metrics else None, size=parse_size(args.size)):
            print(f)
    return 0


def _interrupted_by(e: BaseException) -> int | None:
    """The signal number if ``e`` was raised while an interruption (``KeyboardInterrupt``, e.g.
    ``runtime.signals.Interrupted``) was unwinding: found in its ``__context__``/``__cause__`` chain."""
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
    from tlora_sim.sim.runtime.signals import signals_raise_interrupt

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
        from tlora_sim.sim.core.invariants import InvariantError

        signum = _interrupted_by(e)
        if signum is not None:  # a library failed while unwinding from a signal (e.g. a PDF half-compressed)
            print(f"tlora-sim: interrupted (signal {signum}); finished files are complete, unfinished ones were "
                  f"not written", file=sys.stderr)
            return 128 + signum
        from tlora_sim.sim.core.policy_call import PolicyError
        from tlora_sim.sim.runtime.write_errors import is_write_error, write_error

        if isinstance(e, PolicyError):  # a crashing policy: one line, the traceback in a file or behind -v
            where = (f" (traceback in {e.traceback_file})" if e.traceback_file else
                     " (run with -v for the traceback)" if e.traceback_text and not args.verbose else "")
            print(f"tlora-sim: policy error: {e.violation}{where}", file=sys.stderr)
            if args.verbose and e.traceback_text:
                print(e.traceback_text.rstrip(), file=sys.stderr)
            return 3
        if isinstance(e, InvariantError):
            print(f"tlora-sim: invariant violated: {e}", file=sys.stderr)
            return 3
        if is_write_error(e):  # a write outside a staged directory (disk full, read-only, permissions)
            print(f"tlora-sim: error: {write_error(e)}", file=sys.stderr)
            return 2
        raise
    finally:
        from tlora_sim.sim.runtime.outlock import release_all_out_locks

        release_all_out_locks()  # a run that failed between its --out check and its swap


if __name__ == "__main__":
    sys.exit(main())
